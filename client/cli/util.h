/*
 * Small helpers shared by the kvdock CLI's commands (kvdock.c, bench.c,
 * top.c).
 */
#ifndef KVDOCK_CLI_UTIL_H
#define KVDOCK_CLI_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* s as a JSON string, quotes included, on stdout; bytes that are not
 * UTF-8 become U+FFFD. */
void kvd__cli_json_str(const char *s);
/* b bytes as "512 B", "1.5 KiB", ... "2.0 PiB". */
void kvd__cli_human_bytes(char *buf, size_t cap, double b);
/* CLOCK_MONOTONIC in microseconds. */
double kvd__cli_now_us(void);
/* qsort comparison of doubles, ascending. */
int kvd__cli_cmp_double(const void *a, const void *b);

/* s with its control characters made '?' (in place): names from the
 * daemon go into tables and terminals as one line each. */
char *kvd__cli_printable(char *s);

/* A table of strings, printed with aligned columns.  Cells pass through
 * kvd__cli_printable. */
#define KVD_CLI_TABLE_MAX_COLS 16
#define KVD_CLI_CELL_MAX 96
typedef struct kvd__cli_table {
    int ncols;
    const char *head[KVD_CLI_TABLE_MAX_COLS];
    bool right[KVD_CLI_TABLE_MAX_COLS];
    char (*cells)[KVD_CLI_TABLE_MAX_COLS][KVD_CLI_CELL_MAX];
    size_t nrows;
    size_t cap;
} kvd__cli_table_t;
/* spec: "NAME,>COUNT,..."; '>' marks a right-aligned column. */
void kvd__cli_table_init(kvd__cli_table_t *t, const char *spec);
/* One row: as many strings as columns. */
void kvd__cli_table_row(kvd__cli_table_t *t, ...);
/* Print (on stdout) and free the rows. */
void kvd__cli_table_print(kvd__cli_table_t *t);

/* A decimal count, or with size true a SIZE (kvdock/parse.h: 1.5G, 16MiB,
 * 2KB). */
bool kvd__cli_parse_u64(const char *s, uint64_t *out, bool size);
/* Whether argument a is option name ("--x" or "--x=V"). */
bool kvd__cli_opt_is(const char *a, const char *name);
/* The value of option argv[*i] ("--x V", which moves *i on, or "--x=V");
 * NULL if missing. */
const char *kvd__cli_opt_value(int argc, char **argv, int *i, const char *name);

#endif /* KVDOCK_CLI_UTIL_H */
