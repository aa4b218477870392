/* What the daemon benchmarks share: see bench_util.h. */
#define _GNU_SOURCE
#include "bench_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

/* Nearest-rank quantile of sorted values. */
static double quantile(const double *s, uint64_t n, double q)
{
    uint64_t k = (uint64_t)ceil(q * (double)n);

    if (n == 0)
        return 0;
    if (k < 1)
        k = 1;
    if (k > n)
        k = n;
    return s[k - 1];
}

void kvd__bench_lat(kvd__bench_lat_t *l, double *v, uint64_t n)
{
    double sum = 0;

    memset(l, 0, sizeof(*l));
    if (n == 0)
        return;
    qsort(v, (size_t)n, sizeof(*v), kvd__cli_cmp_double);
    for (uint64_t i = 0; i < n; i++)
        sum += v[i];
    l->count = n;
    l->p50 = quantile(v, n, 0.50);
    l->p99 = quantile(v, n, 0.99);
    l->mean = sum / (double)n;
    l->min = v[0];
    l->max = v[n - 1];
}

static uint64_t rng_next(uint64_t *x)
{
    /* xorshift64* */
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545F4914F6CDD1Dull;
}

void kvd__bench_permutation(int64_t *p, uint64_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;

    for (uint64_t i = 0; i < n; i++)
        p[i] = (int64_t)i;
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = rng_next(&x) % i;
        int64_t t = p[i - 1];

        p[i - 1] = p[j];
        p[j] = t;
    }
}

#define BAR_WIDTH 30

void kvd__bench_progress_start(kvd__bench_progress_t *p, bool on, const char *label)
{
    p->on = on;
    p->label = label;
    p->last = -1;
}

void kvd__bench_progress_set(kvd__bench_progress_t *p, double frac)
{
    static const char hashes[] = "##############################";
    static const char dots[] = "..............................";
    int pct, fill;

    if (!p->on)
        return;
    if (frac < 0)
        frac = 0;
    if (frac > 1)
        frac = 1;
    pct = (int)(frac * 100.0);
    if (pct == p->last)
        return;
    p->last = pct;
    fill = (int)(frac * BAR_WIDTH);
    fprintf(stderr, "\r%-34s [%.*s%.*s] %3d%%", p->label, fill, hashes, BAR_WIDTH - fill, dots,
            pct);
    fflush(stderr);
}

void kvd__bench_progress_end(kvd__bench_progress_t *p, const char *summary)
{
    if (!p->on)
        return;
    fprintf(stderr, "\r\033[K%-34s %s\n", p->label, summary);
    fflush(stderr);
}

kvd_status_t kvd__bench_pair_create(kvd_client_t *cli, const char *prefix, const char *tag,
                                    int32_t kind, uint32_t layers, uint64_t slots,
                                    uint64_t slot_bytes, kvd__bench_pair_t *pp)
{
    kvd_pool_spec_t spec;
    char name[KVD_NAME_MAX];
    kvd_status_t st;

    memset(pp, 0, sizeof(*pp));
    memset(&spec, 0, sizeof(spec));
    spec.name = name;
    spec.kind = kind;
    spec.num_layers = layers;
    spec.num_slots = slots;
    spec.slot_bytes = slot_bytes;
    spec.shared = false; /* private: gone with this connection, whatever happens */
    snprintf(name, sizeof(name), "%s-%s-src", prefix, tag);
    st = kvd_pool_create(cli, &spec, &pp->a);
    if (st != KVD_OK)
        return st;
    pp->have_a = true;
    snprintf(name, sizeof(name), "%s-%s-dst", prefix, tag);
    st = kvd_pool_create(cli, &spec, &pp->b);
    if (st != KVD_OK)
        return st;
    pp->have_b = true;
    return KVD_OK;
}

kvd_status_t kvd__bench_pair_drop(kvd_client_t *cli, kvd__bench_pair_t *pp)
{
    kvd_status_t st = KVD_OK, s2;

    if (pp->have_a) {
        st = kvd_pool_drop(cli, pp->a.id, NULL);
        pp->have_a = false;
    }
    if (pp->have_b) {
        s2 = kvd_pool_drop(cli, pp->b.id, NULL);
        if (st == KVD_OK)
            st = s2;
        pp->have_b = false;
    }
    return st;
}

void kvd__bench_prefix(char *buf, size_t len)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(buf, len, "bench-%d-%06lx", (int)getpid(),
             (unsigned long)((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20)) & 0xffffffUL);
}

kvd_status_t kvd__bench_all_layer(kvd_client_t *cli, const kvd__bench_pair_t *pp, uint64_t slots,
                                  const kvd_sync_t *sync, const int64_t *ps, const int64_t *pd,
                                  uint64_t ibuf, uint64_t warm, uint64_t iters,
                                  kvd__bench_progress_t *p, double p0, double p1, double *v,
                                  kvd__bench_lat_t *out)
{
    for (uint64_t i = 0; i < warm + iters; i++) {
        kvd_kv_transfer_t t;
        kvd_op_result_t r;
        kvd_status_t st;
        double t0;

        memset(&t, 0, sizeof(t));
        t.src_pool = pp->a.id;
        t.dst_pool = pp->b.id;
        t.src.count = slots;
        t.src.dtype = KVD_DTYPE_I64;
        t.dst.count = slots;
        t.dst.dtype = KVD_DTYPE_I64;
        if (ibuf != 0) {
            t.src.buffer = ibuf;
            t.dst.buffer = ibuf;
            t.dst.offset = slots * sizeof(int64_t);
        } else {
            t.src.values = ps;
            t.dst.values = pd;
        }
        t.all_layers = true;
        t0 = kvd__cli_now_us();
        st = kvd_kv_transfer(cli, &t, sync, &r);
        if (i >= warm)
            v[i - warm] = kvd__cli_now_us() - t0;
        if (st != KVD_OK)
            return st;
        if (r.rows != slots)
            return KVD_EPROTO;
        kvd__bench_progress_set(p, p0 + (p1 - p0) * (double)(i + 1) / (double)(warm + iters));
    }
    kvd__bench_lat(out, v, iters);
    return KVD_OK;
}
