/*
 * What the daemon benchmarks share: latency statistics, progress bars,
 * private pool pairs and the timed all-layer transfer through the daemon.
 * `kvdock bench` (bench.c) and the benchmarks under tests/bench/ that set
 * the daemon against other paths use them.
 */
#ifndef KVDOCK_CLI_BENCH_UTIL_H
#define KVDOCK_CLI_BENCH_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "kvdock/client.h"

/* Latency figures of one case, microseconds. */
typedef struct kvd__bench_lat {
    uint64_t count;
    double p50, p99, mean, min, max;
} kvd__bench_lat_t;

/* Figures of v[0..n) (sorted in place). */
void kvd__bench_lat(kvd__bench_lat_t *l, double *v, uint64_t n);

/* A random permutation of 0..n-1 drawn from seed. */
void kvd__bench_permutation(int64_t *p, uint64_t n, uint64_t seed);

/* A progress bar on stderr (only when on: a terminal). */
typedef struct kvd__bench_progress {
    bool on;
    const char *label;
    int last;
} kvd__bench_progress_t;

void kvd__bench_progress_start(kvd__bench_progress_t *p, bool on, const char *label);
void kvd__bench_progress_set(kvd__bench_progress_t *p, double frac);
void kvd__bench_progress_end(kvd__bench_progress_t *p, const char *summary);

/* Two pools of one shape, private to the connection that made them
 * (dropped with it, whatever happens), named PREFIX-TAG-src and -dst. */
typedef struct kvd__bench_pair {
    kvd_pool_info_t a, b;
    bool have_a, have_b;
} kvd__bench_pair_t;

kvd_status_t kvd__bench_pair_create(kvd_client_t *cli, const char *prefix, const char *tag,
                                    int32_t kind, uint32_t layers, uint64_t slots,
                                    uint64_t slot_bytes, kvd__bench_pair_t *pp);
/* Drop what pair_create made; the first error is returned. */
kvd_status_t kvd__bench_pair_drop(kvd_client_t *cli, kvd__bench_pair_t *pp);

/* A name prefix no other bench run uses ("bench-PID-NONCE"). */
void kvd__bench_prefix(char *buf, size_t len);

/*
 * iters timed all-layer transfers of slots rows from pp->a to pp->b after
 * warm ones: indices ps and pd inline (ibuf 0), or in buffer ibuf (src at
 * 0, dst after).  v holds iters doubles.  KVD_OK with *out set; else the
 * failed call's status (kvd_client_last_error says why), or KVD_EPROTO
 * when a reply covered another row count.
 */
kvd_status_t kvd__bench_all_layer(kvd_client_t *cli, const kvd__bench_pair_t *pp, uint64_t slots,
                                  const kvd_sync_t *sync, const int64_t *ps, const int64_t *pd,
                                  uint64_t ibuf, uint64_t warm, uint64_t iters,
                                  kvd__bench_progress_t *p, double p0, double p1, double *v,
                                  kvd__bench_lat_t *out);

#endif /* KVDOCK_CLI_BENCH_UTIL_H */
