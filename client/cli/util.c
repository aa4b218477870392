/*
 * Small helpers shared by the kvdock CLI's commands.
 */
#include "util.h"

#include "parse.h"
#include "wire.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The length of the UTF-8 sequence at s (1..4), 0 when s does not start
 * one. */
static size_t utf8_len(const unsigned char *s)
{
    size_t k;

    if (s[0] < 0x80)
        k = 1;
    else if (s[0] >= 0xc2 && s[0] <= 0xdf)
        k = 2;
    else if (s[0] >= 0xe0 && s[0] <= 0xef)
        k = 3;
    else if (s[0] >= 0xf0 && s[0] <= 0xf4)
        k = 4;
    else
        return 0;
    for (size_t i = 1; i < k; i++)
        if (s[i] == '\0')
            return 0;
    return kvd__utf8_valid(s, k) ? k : 0;
}

void kvd__cli_json_str(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;

    putchar('"');
    while (*p != '\0') {
        unsigned char c = *p;
        size_t k;

        if (c == '"' || c == '\\') {
            printf("\\%c", c);
            p++;
        } else if (c == '\n') {
            fputs("\\n", stdout);
            p++;
        } else if (c == '\t') {
            fputs("\\t", stdout);
            p++;
        } else if (c < 0x20 || c == 0x7f) {
            printf("\\u%04x", c);
            p++;
        } else if ((k = utf8_len(p)) == 0) {
            fputs("\\ufffd", stdout); /* not UTF-8: the replacement character */
            p++;
        } else {
            fwrite(p, 1, k, stdout);
            p += k;
        }
    }
    putchar('"');
}

void kvd__cli_human_bytes(char *buf, size_t cap, double b)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;

    while (b >= 1024.0 && u < 5) {
        b /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%.0f B", b);
    else
        snprintf(buf, cap, "%.1f %s", b, unit[u]);
}

double kvd__cli_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int kvd__cli_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

char *kvd__cli_printable(char *s)
{
    for (char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    return s;
}

void kvd__cli_table_init(kvd__cli_table_t *t, const char *spec)
{
    static char buf[512];
    char *save = NULL, *tok;

    memset(t, 0, sizeof(*t));
    snprintf(buf, sizeof(buf), "%s", spec);
    for (tok = strtok_r(buf, ",", &save); tok != NULL && t->ncols < KVD_CLI_TABLE_MAX_COLS;
         tok = strtok_r(NULL, ",", &save)) {
        t->right[t->ncols] = tok[0] == '>';
        t->head[t->ncols++] = tok[0] == '>' ? tok + 1 : tok;
    }
}

void kvd__cli_table_row(kvd__cli_table_t *t, ...)
{
    va_list ap;

    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        void *n = realloc(t->cells, cap * sizeof(*t->cells));

        if (n == NULL) {
            fprintf(stderr, "kvdock: out of memory\n");
            exit(1);
        }
        t->cells = n;
        t->cap = cap;
    }
    va_start(ap, t);
    for (int c = 0; c < t->ncols; c++) {
        const char *s = va_arg(ap, const char *);

        snprintf(t->cells[t->nrows][c], KVD_CLI_CELL_MAX, "%s", s != NULL ? s : "");
        kvd__cli_printable(t->cells[t->nrows][c]);
    }
    va_end(ap);
    t->nrows++;
}

void kvd__cli_table_print(kvd__cli_table_t *t)
{
    size_t w[KVD_CLI_TABLE_MAX_COLS];

    for (int c = 0; c < t->ncols; c++) {
        w[c] = strlen(t->head[c]);
        for (size_t r = 0; r < t->nrows; r++)
            if (strlen(t->cells[r][c]) > w[c])
                w[c] = strlen(t->cells[r][c]);
    }
    for (int c = 0; c < t->ncols; c++) {
        if (c + 1 == t->ncols && !t->right[c])
            printf("%s%s", c ? "  " : "", t->head[c]);
        else
            printf("%s%*s", c ? "  " : "", t->right[c] ? (int)w[c] : -(int)w[c], t->head[c]);
    }
    putchar('\n');
    for (size_t r = 0; r < t->nrows; r++) {
        for (int c = 0; c < t->ncols; c++) {
            if (c + 1 == t->ncols && !t->right[c])
                printf("%s%s", c ? "  " : "", t->cells[r][c]);
            else
                printf("%s%*s", c ? "  " : "", t->right[c] ? (int)w[c] : -(int)w[c],
                       t->cells[r][c]);
        }
        putchar('\n');
    }
    free(t->cells);
    t->cells = NULL;
}

bool kvd__cli_parse_u64(const char *s, uint64_t *out, bool size)
{
    return (size ? kvd__parse_size(s, out) : kvd__parse_u64(s, out)) == KVD_OK;
}

int kvd__cli_bad_size(const kvd__cli_cmd_t *cmd, const char *opt, const char *val,
                      const char *examples)
{
    if (kvd__size_inexact(val))
        return kvd__cli_usage(cmd, "%s: '%s' " KVD_SIZE_INEXACT, opt, val);
    if (examples != NULL)
        return kvd__cli_usage(cmd, "%s needs a positive SIZE (%s), not '%s'", opt, examples, val);
    return kvd__cli_usage(cmd, "%s needs a positive SIZE, not '%s'", opt, val);
}

int kvd__cli_usage(const kvd__cli_cmd_t *cmd, const char *fmt, ...)
{
    va_list ap;

    fputs("kvdock: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (cmd != NULL)
        fprintf(stderr, "usage: kvdock %s\n", cmd->usage);
    else
        fputs("run 'kvdock --help' for the commands\n", stderr);
    return KVD_CLI_EXIT_USAGE;
}

int kvd__cli_help(const kvd__cli_cmd_t *cmd)
{
    printf("usage: kvdock %s\n\n%s\n", cmd->usage, cmd->summary);
    if (cmd->options[0] != '\0')
        printf("\n%s", cmd->options);
    printf("\ncommon options: --socket PATH, --json, --help (see kvdock --help)\n");
    return 0;
}

int kvd__cli_daemon_error(kvd_client_t *cli, kvd_status_t st, const char *what)
{
    const char *msg = kvd_client_last_error(cli);

    fprintf(stderr, "kvdock: %s: %s: %s\n", what, kvd_err_name(st),
            msg[0] != '\0' ? msg : kvd_strerror(st));
    return KVD_CLI_EXIT_DAEMON;
}

int kvd__cli_connect(const kvd__cli_ctx_t *ctx, const char *name, kvd_client_t **cli)
{
    kvd_status_t st = kvd_client_create(ctx->socket, name, cli);

    if (st != KVD_OK) {
        fprintf(stderr, "kvdock: %s: %s\n", kvd_err_name(st), kvd_client_last_error(NULL));
        return KVD_CLI_EXIT_DAEMON;
    }
    return 0;
}

/* ---- options ------------------------------------------------------------ */

enum { COMMON_SOCKET = -100, COMMON_JSON, COMMON_HELP };

static const kvd__cli_opt_t common[] = {
    {"socket", 's', true, COMMON_SOCKET},
    {"json", 0, false, COMMON_JSON},
    {"help", 'h', false, COMMON_HELP},
    KVD_CLI_OPT_END,
};

void kvd__cli_args_init(kvd__cli_args_t *a, int argc, char **argv, int first,
                        const kvd__cli_opt_t *opts, kvd__cli_ctx_t *ctx)
{
    memset(a, 0, sizeof(*a));
    a->argc = argc;
    a->argv = argv;
    a->next = first;
    a->opts = opts;
    a->ctx = ctx;
}

static const kvd__cli_opt_t *find_long(const kvd__cli_opt_t *t, const char *name, size_t n)
{
    for (; t != NULL && t->name != NULL; t++)
        if (strlen(t->name) == n && strncmp(t->name, name, n) == 0)
            return t;
    return NULL;
}

static const kvd__cli_opt_t *find_short(const kvd__cli_opt_t *t, char c)
{
    for (; t != NULL && t->name != NULL; t++)
        if (t->short_name == c)
            return t;
    return NULL;
}

/* The known option nearest to name[0..n): one that name begins (an
 * abbreviation, which is refused), else the one fewest edits away, if
 * that is at most a third of its length (one edit below 6 characters). */
static const char *nearest(const kvd__cli_args_t *a, const char *name, size_t n)
{
    const kvd__cli_opt_t *tables[2] = {a->opts, a->ctx != NULL ? common : NULL};
    const char *best = NULL;
    size_t best_d = n < 6 ? 2 : n / 3 + 1;

    for (int k = 0; k < 2; k++)
        for (const kvd__cli_opt_t *t = tables[k]; t != NULL && t->name != NULL; t++) {
            size_t d = n >= 2 && strncmp(t->name, name, n) == 0 ? 0 : kvd__edit_distance(name, n, t->name);

            if (d < best_d) {
                best_d = d;
                best = t->name;
            }
        }
    return best;
}

const char *kvd__cli_nearest_word(const char *given, const char *const *words)
{
    size_t n = strlen(given), best_d = n < 6 ? 2 : n / 3 + 1;
    const char *best = NULL;

    for (; *words != NULL; words++) {
        size_t d = kvd__edit_distance(given, n, *words);

        if (d < best_d) {
            best_d = d;
            best = *words;
        }
    }
    return best;
}

static int take(kvd__cli_args_t *a, const kvd__cli_opt_t *o, const char *inline_val,
                const char *given)
{
    a->name = given;
    a->val = NULL;
    if (o->has_arg) {
        if (inline_val != NULL) {
            a->val = inline_val;
        } else if (a->next < a->argc) {
            a->val = a->argv[a->next++];
        } else {
            snprintf(a->err, sizeof(a->err), "%s needs a value", given);
            return KVD_CLI_BAD;
        }
    } else if (inline_val != NULL) {
        snprintf(a->err, sizeof(a->err), "%s takes no value", given);
        return KVD_CLI_BAD;
    }
    if (o->id > 0)
        return o->id;
    /* a common option */
    if (a->ctx == NULL) {
        snprintf(a->err, sizeof(a->err), "unknown option '%s'", given);
        return KVD_CLI_BAD;
    }
    if (o->id == COMMON_SOCKET)
        a->ctx->socket = a->val;
    else if (o->id == COMMON_JSON)
        a->ctx->json = true;
    else
        a->ctx->help = true;
    return 0; /* taken: go on */
}

int kvd__cli_next(kvd__cli_args_t *a)
{
    static char given[80];

    for (;;) {
        const char *arg, *eq;
        const kvd__cli_opt_t *o;
        int r;

        if (a->next >= a->argc)
            return KVD_CLI_DONE;
        arg = a->argv[a->next++];
        if (a->args_only || arg[0] != '-' || arg[1] == '\0') {
            a->val = arg;
            return KVD_CLI_ARG;
        }
        if (strcmp(arg, "--") == 0) {
            a->args_only = true;
            continue;
        }
        if (arg[1] == '-') { /* --name or --name=value */
            const char *name = arg + 2;
            size_t n;

            eq = strchr(name, '=');
            n = eq != NULL ? (size_t)(eq - name) : strlen(name);
            snprintf(given, sizeof(given), "--%.*s", (int)(n < 64 ? n : 64), name);
            o = find_long(a->opts, name, n);
            if (o == NULL && a->ctx != NULL)
                o = find_long(common, name, n);
            if (o == NULL) {
                const char *near = nearest(a, name, n);

                if (near != NULL)
                    snprintf(a->err, sizeof(a->err), "unknown option '%s' (did you mean --%s?)",
                             given, near);
                else
                    snprintf(a->err, sizeof(a->err), "unknown option '%s'", given);
                return KVD_CLI_BAD;
            }
            r = take(a, o, eq != NULL ? eq + 1 : NULL, given);
        } else { /* -x, -x VALUE or -xVALUE */
            snprintf(given, sizeof(given), "-%c", arg[1]);
            o = find_short(a->opts, arg[1]);
            if (o == NULL && a->ctx != NULL)
                o = find_short(common, arg[1]);
            if (o == NULL) {
                snprintf(a->err, sizeof(a->err), "unknown option '%s'", given);
                return KVD_CLI_BAD;
            }
            if (!o->has_arg && arg[2] != '\0') {
                snprintf(a->err, sizeof(a->err), "%s takes no value ('%s')", given, arg);
                return KVD_CLI_BAD;
            }
            r = take(a, o, arg[2] != '\0' ? arg + 2 : NULL, given);
        }
        if (r != 0)
            return r;
    }
}
