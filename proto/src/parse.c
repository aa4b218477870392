/* Numbers and sizes: see parse.h. */
#include "parse.h"

#include <stddef.h>
#include <string.h>
#include <strings.h>

/* The digits at s (at least one) as a value; *end past them.  KVD_ERANGE
 * past UINT64_MAX. */
static kvd_status_t digits(const char *s, const char **end, uint64_t *out)
{
    uint64_t v = 0;
    const char *p = s;

    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');

        if (v > (UINT64_MAX - d) / 10)
            return KVD_ERANGE;
        v = v * 10 + d;
    }
    if (p == s)
        return KVD_EINVAL;
    *end = p;
    *out = v;
    return KVD_OK;
}

kvd_status_t kvd__parse_u64(const char *s, uint64_t *out)
{
    const char *end;
    uint64_t v;
    kvd_status_t st;

    if (s == NULL || out == NULL)
        return KVD_ENULL;
    st = digits(s, &end, &v);
    if (st == KVD_OK && *end != '\0')
        return KVD_EINVAL;
    if (st == KVD_ERANGE) { /* a range error only if the rest is digits too */
        for (end = s; *end >= '0' && *end <= '9'; end++)
            ;
        if (*end != '\0')
            return KVD_EINVAL;
    }
    if (st == KVD_OK)
        *out = v;
    return st;
}

kvd_status_t kvd__parse_i64(const char *s, int64_t *out)
{
    int neg;
    uint64_t v;
    kvd_status_t st;

    if (s == NULL || out == NULL)
        return KVD_ENULL;
    neg = s[0] == '-';
    st = kvd__parse_u64(s + neg, &v);
    if (st != KVD_OK)
        return st;
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg)
        return KVD_ERANGE;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return KVD_OK;
}

typedef struct unit {
    const char *name;
    int shift;   /* times 2^shift */
    int decimal; /* times 1000^decimal */
} unit_t;

static const unit_t units[] = {
    {"", 0, 0},     {"B", 0, 0},    {"K", 10, 0},   {"M", 20, 0},   {"G", 30, 0},
    {"T", 40, 0},   {"P", 50, 0},   {"KiB", 10, 0}, {"MiB", 20, 0}, {"GiB", 30, 0},
    {"TiB", 40, 0}, {"PiB", 50, 0}, {"KB", 0, 1},   {"MB", 0, 2},   {"GB", 0, 3},
    {"TB", 0, 4},   {"PB", 0, 5},
};

/* kvd__parse_size, and *inexact = 1 where s is a size but for a fraction
 * of a byte. */
static kvd_status_t parse_size(const char *s, uint64_t *out, int *inexact)
{
    const char *p, *unit_s;
    uint64_t whole, frac = 0, frac_den = 1;
    unsigned __int128 mul = 1, bytes;
    const unit_t *u = NULL;
    kvd_status_t st;

    if (s == NULL || out == NULL)
        return KVD_ENULL;
    st = digits(s, &p, &whole);
    if (st != KVD_OK)
        return st;
    if (*p == '.') {
        const char *f = ++p;

        for (; *p >= '0' && *p <= '9'; p++) {
            if (p - f >= 18) /* finer than any unit's byte */
                return KVD_EINVAL;
            frac = frac * 10 + (uint64_t)(*p - '0');
            frac_den *= 10;
        }
        if (p == f)
            return KVD_EINVAL;
    }
    unit_s = p[0] == ' ' ? p + 1 : p;
    if (p[0] == ' ' && unit_s[0] == '\0')
        return KVD_EINVAL;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (strcasecmp(unit_s, units[i].name) == 0) {
            u = &units[i];
            break;
        }
    if (u == NULL)
        return KVD_EINVAL;
    mul = (unsigned __int128)1 << u->shift;
    for (int i = 0; i < u->decimal; i++)
        mul *= 1000;
    if (frac_den > 1 && (frac * mul) % frac_den != 0) {
        *inexact = 1;
        return KVD_EINVAL; /* a fraction of a byte (or a fraction of bytes) */
    }
    bytes = (unsigned __int128)whole * mul + frac * mul / frac_den;
    if (bytes > UINT64_MAX)
        return KVD_ERANGE;
    *out = (uint64_t)bytes;
    return KVD_OK;
}

kvd_status_t kvd__parse_size(const char *s, uint64_t *out)
{
    int inexact = 0;

    return parse_size(s, out, &inexact);
}

int kvd__size_inexact(const char *s)
{
    uint64_t v;
    int inexact = 0;

    return s != NULL && parse_size(s, &v, &inexact) == KVD_EINVAL && inexact;
}

size_t kvd__edit_distance(const char *a, size_t n, const char *b)
{
    size_t m = strlen(b), row[40], i, j;

    if (n > 32 || m > 32)
        return 99;
    for (j = 0; j <= m; j++)
        row[j] = j;
    for (i = 1; i <= n; i++) {
        size_t diag = row[0];

        row[0] = i;
        for (j = 1; j <= m; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);

            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[m];
}
