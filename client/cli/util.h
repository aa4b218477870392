/*
 * Small helpers shared by the kvdock CLI's commands (kvdock.c, bench.c,
 * top.c).
 */
#ifndef KVDOCK_CLI_UTIL_H
#define KVDOCK_CLI_UTIL_H

#include <stddef.h>

/* s as a JSON string, quotes included, on stdout. */
void kvd__cli_json_str(const char *s);
/* b bytes as "512 B", "1.5 KiB", ... "2.0 PiB". */
void kvd__cli_human_bytes(char *buf, size_t cap, double b);
/* CLOCK_MONOTONIC in microseconds. */
double kvd__cli_now_us(void);
/* qsort comparison of doubles, ascending. */
int kvd__cli_cmp_double(const void *a, const void *b);

#endif /* KVDOCK_CLI_UTIL_H */
