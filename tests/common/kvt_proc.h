/*
 * What /proc says of a process (the daemon under test): how much memory
 * it maps or holds, which tests bound or cap (prlimit RLIMIT_AS).
 */
#ifndef KVDOCK_TEST_COMMON_KVT_PROC_H
#define KVDOCK_TEST_COMMON_KVT_PROC_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

/* A "Key: N kB" field of /proc/PID/status (or of /proc/meminfo with pid
 * 0), in bytes; 0 where the file has no such field. */
static inline uint64_t kvt_proc_bytes(pid_t pid, const char *key)
{
    char path[64], line[256];
    unsigned long long kb = 0;
    FILE *f;

    if (pid)
        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    else
        snprintf(path, sizeof(path), "/proc/meminfo");
    f = fopen(path, "re");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, key, strlen(key)) == 0)
            sscanf(line + strlen(key), " %llu", &kb);
    fclose(f);
    return (uint64_t)kb * 1024;
}

#endif /* KVDOCK_TEST_COMMON_KVT_PROC_H */
