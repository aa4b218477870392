/*
 * Small helpers shared by the kvdock CLI's commands.
 */
#include "util.h"

#include "kvdock/parse.h"
#include "kvdock/wire.h"

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
    return kvd_utf8_valid(s, k) ? k : 0;
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

bool kvd__cli_opt_is(const char *a, const char *name)
{
    size_t n = strlen(name);

    return strncmp(a, name, n) == 0 && (a[n] == '\0' || a[n] == '=');
}

const char *kvd__cli_opt_value(int argc, char **argv, int *i, const char *name)
{
    const char *a = argv[*i];
    size_t n = strlen(name);

    if (strncmp(a, name, n) == 0 && a[n] == '=')
        return a + n + 1;
    if (*i + 1 >= argc)
        return NULL;
    (*i)++;
    return argv[*i];
}
