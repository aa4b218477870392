/*
 * Test harness of the client suites: start the real kvdockd on a
 * temporary socket, stop it, and small helpers for data and processes.
 */
#ifndef KVDOCK_TEST_CLIENT_HARNESS_H
#define KVDOCK_TEST_CLIENT_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvdock/client.h"

typedef struct kvt_daemon {
    pid_t pid;
    char dir[256];    /* temporary directory, removed at stop */
    char socket[300]; /* dir/run/kvdockd.sock */
    char log[300];    /* the daemon's stderr */
} kvt_daemon_t;

/* The kvdockd binary: $KVDOCKD_PATH, else the one built with the tests. */
const char *kvt_daemon_path(void);

/* CLOCK_MONOTONIC in milliseconds. */
int64_t kvt_now_ms(void);

/*
 * Start kvdockd (kvt_daemon_path()) with --socket in a new temporary directory,
 * --backend backend and any extra arguments (NULL-terminated), and wait
 * until it accepts connections (at most timeout_ms).  0 on success; on
 * failure, prints why with the daemon's log and returns -1.
 */
int kvt_daemon_start(kvt_daemon_t *d, const char *backend, const char *const *extra,
                     int timeout_ms);
/* SIGTERM, wait (SIGKILL after timeout_ms), remove the directory.  Returns
 * the daemon's exit status as waitpid gives it, or -1. */
int kvt_daemon_stop(kvt_daemon_t *d, int timeout_ms);
/* SIGKILL and reap (the directory stays). */
void kvt_daemon_kill(kvt_daemon_t *d);
/* Print the daemon's log to stderr (for failures). */
void kvt_daemon_dump_log(const kvt_daemon_t *d);

/* The suite's daemon, started by kvt_suite_setup (an unchecked fixture). */
extern kvt_daemon_t kvt_d;
void kvt_suite_setup(void);
void kvt_suite_teardown(void);

/* Connect to kvt_d with a 20 s timeout on blocking calls; fails the test
 * on error. */
kvd_client_t *kvt_connect(const char *name);

/* Deterministic pseudo-random bytes. */
void kvt_fill(void *buf, size_t n, uint64_t seed);

/*
 * Run a program with arguments (NULL-terminated), capturing its stdout and
 * stderr into malloc'd strings (*out, *err; free them).  Returns the exit
 * status (0..255), or -1 if it did not exit normally within timeout_ms.
 */
int kvt_run(const char *const *argv, char **out, char **err, int timeout_ms);

/* True when s is exactly one JSON object (with surrounding whitespace). */
bool kvt_json_object_valid(const char *s);

/* The kvdock CLI: $KVDOCK_CLI, else the one built with the tests. */
const char *kvt_cli_path(void);

/* A run of the kvdock CLI: its exit status (kvt_run's) and what it printed
 * (free with kvt_cli_free). */
typedef struct kvt_cli_result {
    int rc;
    char *out;
    char *err;
} kvt_cli_result_t;

/* kvdock --socket socket (NULL: the suite daemon's) and the arguments from
 * first on (NULL-terminated, at most 28), within 20 s. */
kvt_cli_result_t kvt_cli_at(const char *socket, const char *first, ...);
/* The same on the suite daemon. */
#define kvt_cli(...) kvt_cli_at(NULL, __VA_ARGS__)
void kvt_cli_free(kvt_cli_result_t *r);

/* A daemon with a disk level: kvt_daemon_start (cpu) with --cache-dir
 * dir and --disk-budget disk_budget, dir a folder in a fresh directory
 * top of /var/tmp (the machine's disk, not a tmpfs /tmp).  top and dir
 * are filled in (at least 64 bytes each). */
void kvt_disk_daemon_start(kvt_daemon_t *d, char *top, char *dir, const char *disk_budget);
/* Stop it (exit 0 asserted) and remove top. */
void kvt_disk_daemon_stop(kvt_daemon_t *d, const char *top);

/* A cache spec named name: layers x tokens_per_block tokens of token_bytes
 * (bf16), budget_bytes; the rest zero (unshared, no cluster, no disk). */
kvd_cache_spec_t kvt_cache_spec(const char *name, uint32_t layers, uint32_t tokens_per_block,
                                uint32_t token_bytes, uint64_t budget_bytes);

#endif /* KVDOCK_TEST_CLIENT_HARNESS_H */
