/*
 * What the kvdock CLI's commands share: output helpers, the command
 * type, and the getopt_long-style option parser.
 */
#ifndef KVDOCK_CLI_UTIL_H
#define KVDOCK_CLI_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdock/client.h"

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

/* A decimal count, or with size true a SIZE (proto/src/parse.h: 1.5G, 16MiB,
 * 2KB). */
bool kvd__cli_parse_u64(const char *s, uint64_t *out, bool size);

/* ---- commands ------------------------------------------------------------ */

#define KVD_CLI_EXIT_DAEMON 1
#define KVD_CLI_EXIT_USAGE 2

/* What every command takes: --socket PATH, --json, --help (before or
 * after the command's name). */
typedef struct kvd__cli_ctx {
    const char *socket; /* NULL: kvd__default_socket_path() */
    bool json;
    bool help;
} kvd__cli_ctx_t;

/* A command: one file each under client/cli/ (commands.h lists them). */
typedef struct kvd__cli_cmd {
    const char *name;
    const char *usage;   /* after "usage: kvdock ", lines of at most 100 columns */
    const char *summary; /* its line in `kvdock --help` */
    const char *options; /* what `kvdock NAME --help` adds after the usage */
    /* argv[0] is the command's name; 0, KVD_CLI_EXIT_DAEMON or _USAGE */
    int (*run)(kvd__cli_ctx_t *ctx, int argc, char **argv);
} kvd__cli_cmd_t;

/* The word of words (NULL-terminated) nearest to given, by the rule that
 * suggests options: at most a third of its length in edits (one below 6
 * characters); NULL if none is that near. */
const char *kvd__cli_nearest_word(const char *given, const char *const *words);

/* "kvdock: " the message, then the command's usage, on stderr;
 * KVD_CLI_EXIT_USAGE. */
int kvd__cli_usage(const kvd__cli_cmd_t *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The usage error for option opt's value val, not a positive SIZE: a
 * fraction of a byte said as such, else "needs a positive SIZE" and
 * examples (may be NULL); KVD_CLI_EXIT_USAGE. */
int kvd__cli_bad_size(const kvd__cli_cmd_t *cmd, const char *opt, const char *val,
                      const char *examples);
/* The command's --help on stdout; 0. */
int kvd__cli_help(const kvd__cli_cmd_t *cmd);
/* "kvdock: what: ENAME: the daemon's message" on stderr;
 * KVD_CLI_EXIT_DAEMON. */
int kvd__cli_daemon_error(kvd_client_t *cli, kvd_status_t st, const char *what);
/* Connect as name to ctx->socket: 0, or KVD_CLI_EXIT_DAEMON having said
 * why. */
int kvd__cli_connect(const kvd__cli_ctx_t *ctx, const char *name, kvd_client_t **cli);

/* ---- options, getopt_long style ----------------------------------------- */

/*
 * "--name VALUE", "--name=VALUE", "-x VALUE", "-xVALUE", flags "--name"
 * and "-x"; whole names only (no abbreviations); "--" ends the options;
 * options and arguments in any order.  The common options (--socket, -s,
 * --json, --help, -h) are taken into ctx wherever they come.  An unknown
 * option is refused with the nearest known one as a suggestion.
 */
typedef struct kvd__cli_opt {
    const char *name; /* without "--" */
    char short_name;  /* 0: none */
    bool has_arg;
    int id; /* > 0 */
} kvd__cli_opt_t;

#define KVD_CLI_OPT_END {NULL, 0, false, 0}
#define KVD_CLI_ARG (-2) /* an argument (not an option): in val */
#define KVD_CLI_BAD (-1) /* a usage error: err says which */
#define KVD_CLI_DONE 0

typedef struct kvd__cli_args {
    int argc;
    char **argv;
    int next;
    bool args_only; /* past "--" */
    const kvd__cli_opt_t *opts;
    kvd__cli_ctx_t *ctx;
    const char *val;  /* the option's value, or the argument */
    const char *name; /* the option as given ("--layers") */
    char err[256];
} kvd__cli_args_t;

/* Parse argv[first..argc). */
void kvd__cli_args_init(kvd__cli_args_t *a, int argc, char **argv, int first,
                        const kvd__cli_opt_t *opts, kvd__cli_ctx_t *ctx);
/* The next option's id, KVD_CLI_ARG, KVD_CLI_DONE or KVD_CLI_BAD. */
int kvd__cli_next(kvd__cli_args_t *a);

#endif /* KVDOCK_CLI_UTIL_H */
