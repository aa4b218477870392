/* Counters and latency histograms: see stats.h. */
#include "stats.h"

#include <stdlib.h>
#include <time.h>

const double kvd__hist_bounds_us[KVD_HIST_BOUNDS] = {
    10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 100000, 1000000, 10000000,
};

uint64_t kvd__now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int kvd__stats_init(kvd__stats_t *s, size_t nops)
{
    size_t i;

    s->ops = calloc(nops, sizeof(*s->ops));
    if (s->ops == NULL)
        return -1;
    s->nops = nops;
    for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++) {
        kvd__stream_counters_t z = {0};
        s->streams[i] = z;
    }
    s->bytes_in = s->bytes_out = s->connections = 0;
    return 0;
}

void kvd__stats_deinit(kvd__stats_t *s)
{
    free(s->ops);
    s->ops = NULL;
    s->nops = 0;
}

void kvd__stats_op(kvd__stats_t *s, size_t op, int status, uint64_t bytes, uint64_t latency_ns)
{
    kvd__op_counters_t *c;
    double us = (double)latency_ns / 1000.0;
    size_t b;

    if (op >= s->nops)
        return;
    c = &s->ops[op];
    c->requests++;
    if (status != 0)
        c->errors++;
    else
        c->bytes += bytes;
    for (b = 0; b < KVD_HIST_BOUNDS && us > kvd__hist_bounds_us[b]; b++)
        ;
    c->counts[b]++;
    c->sum_us += us;
}

void kvd__stats_stream_enter(kvd__stats_t *s, int sclass, uint64_t now_ns)
{
    kvd__stream_counters_t *c = &s->streams[sclass];

    if (c->depth++ == 0)
        c->busy_since = now_ns;
}

void kvd__stats_stream_leave(kvd__stats_t *s, int sclass, uint64_t bytes, int copy_engine,
                             uint64_t now_ns)
{
    kvd__stream_counters_t *c = &s->streams[sclass];

    c->launches++;
    c->copy_engine_launches += copy_engine != 0;
    c->bytes += bytes;
    if (c->depth > 0 && --c->depth == 0)
        c->busy_ns += now_ns - c->busy_since;
}

uint64_t kvd__stats_stream_busy(const kvd__stats_t *s, int sclass, uint64_t now_ns)
{
    const kvd__stream_counters_t *c = &s->streams[sclass];

    return c->busy_ns + (c->depth > 0 ? now_ns - c->busy_since : 0);
}
