/* The host-memory budget: see hostmem.h. */
#include "hostmem.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reservations this large or larger are also checked against what the
 * machine has available; smaller ones (socket growth, staging blocks) only
 * against the budget, so that the hot path reads no /proc file. */
#define AVAIL_CHECK_BYTES (1ull << 20)
/* Left to the rest of the machine when checking what is available: taking
 * the very last pages would push the kernel into reclaim for everyone. */
#define AVAIL_MARGIN_MAX (1ull << 30)

static const char *const kind_names[KVD_HM_COUNT] = {
    "pools", "buffers", "staging", "sockets", "cache", "cache-index", "leases", "requests"};

const char *kvd__hostmem_kind_name(int kind)
{
    return kind >= 0 && kind < KVD_HM_COUNT ? kind_names[kind] : "unknown";
}

void kvd__hostmem_init(kvd__hostmem_t *hm, uint64_t budget)
{
    int k;

    memset(hm, 0, sizeof(*hm));
    hm->budget = budget;
    for (k = 0; k < KVD_HM_COUNT; k++)
        hm->cap[k] = budget;
}

const char *kvd__fmt_bytes(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = -1;

    if (bytes < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", bytes);
        return buf;
    }
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

/* A "Key:   N kB" line of /proc/meminfo, in bytes. */
static int meminfo_field(const char *text, const char *key, uint64_t *out)
{
    const char *p = strstr(text, key);
    unsigned long long kb;

    if (p == NULL || sscanf(p + strlen(key), " %llu kB", &kb) != 1)
        return -1;
    *out = (uint64_t)kb * 1024;
    return 0;
}

static int read_small(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    size_t n;

    if (f == NULL)
        return -1;
    n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 0;
}

/* The cgroup v2 limit and use of this process's cgroup; -1 where there is
 * no limit (or no cgroup v2). */
static int cgroup_room(uint64_t *limit, uint64_t *current)
{
    char line[512], path[700], val[64];
    char *rel, *nl;
    unsigned long long v;

    if (read_small("/proc/self/cgroup", line, sizeof(line)) != 0)
        return -1;
    rel = strstr(line, "0::");
    if (rel == NULL)
        return -1;
    rel += 3;
    nl = strchr(rel, '\n');
    if (nl)
        *nl = '\0';
    snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.max", rel);
    if (read_small(path, val, sizeof(val)) != 0 || sscanf(val, "%llu", &v) != 1)
        return -1; /* "max", or no such file */
    *limit = (uint64_t)v;
    snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.current", rel);
    if (read_small(path, val, sizeof(val)) != 0 || sscanf(val, "%llu", &v) != 1)
        return -1;
    *current = (uint64_t)v;
    return 0;
}

int kvd__sysmem(uint64_t *total, uint64_t *available)
{
    char text[4096];
    uint64_t t, a, lim, cur;

    if (read_small("/proc/meminfo", text, sizeof(text)) != 0 ||
        meminfo_field(text, "MemTotal:", &t) != 0 ||
        meminfo_field(text, "MemAvailable:", &a) != 0)
        return -1;
    if (cgroup_room(&lim, &cur) == 0) {
        if (lim < t)
            t = lim;
        if (lim - (cur < lim ? cur : lim) < a)
            a = lim - (cur < lim ? cur : lim);
    }
    *total = t;
    *available = a;
    return 0;
}

uint64_t kvd__hostmem_left(const kvd__hostmem_t *hm)
{
    return hm->total < hm->budget ? hm->budget - hm->total : 0;
}

kvd_status_t kvd__hostmem_reserve(kvd__hostmem_t *hm, int kind, uint64_t bytes, char *why,
                                  size_t why_len)
{
    char a[32], b[32], c[32];
    uint64_t left = kvd__hostmem_left(hm), kind_left;

    if (kind < 0 || kind >= KVD_HM_COUNT)
        return KVD_EINTERNAL;
    kind_left = hm->used[kind] < hm->cap[kind] ? hm->cap[kind] - hm->used[kind] : 0;
    if (bytes > left) {
        hm->refused[kind]++;
        snprintf(why, why_len, "%s requested, %s left of a %s host-memory budget "
                 "(host-memory-budget)", kvd__fmt_bytes(bytes, a, sizeof(a)),
                 kvd__fmt_bytes(left, b, sizeof(b)), kvd__fmt_bytes(hm->budget, c, sizeof(c)));
        return KVD_ELIMIT;
    }
    if (bytes > kind_left) {
        hm->refused[kind]++;
        snprintf(why, why_len, "%s requested, %s left of the %s that %s may hold",
                 kvd__fmt_bytes(bytes, a, sizeof(a)), kvd__fmt_bytes(kind_left, b, sizeof(b)),
                 kvd__fmt_bytes(hm->cap[kind], c, sizeof(c)), kind_names[kind]);
        return KVD_ELIMIT;
    }
    if (bytes >= AVAIL_CHECK_BYTES) {
        uint64_t total, avail, margin;

        if (kvd__sysmem(&total, &avail) == 0) {
            margin = total / 32 < AVAIL_MARGIN_MAX ? total / 32 : AVAIL_MARGIN_MAX;
            avail = avail > margin ? avail - margin : 0;
            if (bytes > avail) {
                hm->refused[kind]++;
                snprintf(why, why_len, "%s requested, but the machine has only %s available "
                         "(MemAvailable less a margin of %s)",
                         kvd__fmt_bytes(bytes, a, sizeof(a)), kvd__fmt_bytes(avail, b, sizeof(b)),
                         kvd__fmt_bytes(margin, c, sizeof(c)));
                return KVD_ENOMEM;
            }
        }
    }
    hm->used[kind] += bytes;
    hm->total += bytes;
    return KVD_OK;
}

void kvd__hostmem_release(kvd__hostmem_t *hm, int kind, uint64_t bytes)
{
    if (kind < 0 || kind >= KVD_HM_COUNT)
        return;
    /* never below zero, whatever a caller gets wrong */
    bytes = bytes < hm->used[kind] ? bytes : hm->used[kind];
    hm->used[kind] -= bytes;
    hm->total -= bytes;
}

void kvd__hostmem_charge(kvd__hostmem_t *hm, int kind, uint64_t bytes)
{
    if (kind < 0 || kind >= KVD_HM_COUNT)
        return;
    hm->used[kind] += bytes;
    hm->total += bytes;
}

int kvd__hostmem_full(const kvd__hostmem_t *hm, int kind)
{
    return hm->total >= hm->budget || hm->used[kind] >= hm->cap[kind];
}
