/*
 * The cluster: kvdockd daemons on several machines that share the caches
 * made with cluster = true: control on TCP connections each daemon reads
 * itself, block bytes over UCX (proto/cluster.proto says what they say,
 * cluster.c's header how; README "A cluster" why it is built so).
 *
 * No directory and no home node: a lookup that misses locally asks every
 * live peer at once which of the missing keys it holds (one round trip,
 * answered from each peer's own index), and a load pulls the blocks it
 * lacks from the peers that hold them, spread over them, straight into
 * blocks of the local tier, and runs as a local load over them, batch by
 * batch as they land.  Both go through the same step: the request is set aside (its frame kept), the
 * peers are asked, and the request runs again with what they answered
 * (kvd_req_t.cluster).  Loop thread only, like the caches.
 */
#ifndef KVD_DAEMON_CLUSTER_H
#define KVD_DAEMON_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "kvdock/status.h"

typedef struct kvd_server kvd_server_t;
typedef struct kvd_cluster kvd_cluster_t;
typedef struct kvd_req kvd_req_t;
typedef struct kvd_cache kvd_cache_t;
struct Kvdock__Cluster;

/* What the cluster answered, for the request's second run. */
typedef struct kvd_cluster_answer {
    uint32_t first;          /* the keys asked: [first, n) of the request's */
    uint32_t n;
    const uint8_t *present;  /* lookups: bit i set when a live peer holds key first + i */
    const char *why;         /* loads: why blocks could not be pulled ("" if none) */
    /* Loads copy pulled blocks into the pool while the pull goes on: early
     * runs copy the keys of `only` (a bit per key of the request) and
     * answer nobody but done(); the last run copies the keys not in
     * `copied` (NULL: all) and replies for the whole load, or fails with
     * early_status when an early run failed. */
    int early;
    const uint8_t *only;
    const uint8_t *copied;
    kvd_status_t early_status;
    void (*done)(void *arg, kvd_status_t st);
    void *done_arg;
} kvd_cluster_answer_t;

static inline int kvd_cluster_bit(const uint8_t *bits, uint32_t i)
{
    return (bits[i >> 3] >> (i & 7)) & 1;
}

/* Does a live peer hold key i of the request (a lookup's answer)? */
static inline int kvd_cluster_has(const kvd_cluster_answer_t *a, uint32_t i)
{
    return i >= a->first && i < a->n && kvd_cluster_bit(a->present, i - a->first);
}

/* Listen, read the secret and the peers, start connecting (--cluster-*).
 * Nothing is left behind on error (why says what failed). */
kvd_status_t kvd_cluster_create(kvd_server_t *srv, kvd_cluster_t **out, char *why,
                                size_t why_len);
/* The daemon is finishing: requests waiting on peers run again with what
 * came (the drain lets them end first), endpoints close, handles close. */
void kvd_cluster_close(kvd_cluster_t *cl);
/* After the loop has ended. */
void kvd_cluster_destroy(kvd_cluster_t **cl);

/* Peers that are up now. */
uint32_t kvd_cluster_live(const kvd_cluster_t *cl);

/* Set r aside and ask the live peers about keys[first..n) of k: which
 * they hold (a lookup), or, for a load, pull those the local tier lacks.
 * r runs again once every peer answered or the deadline passed.  KVD_OK
 * with r->deferred and r->set_aside set (a data operation's dataop is
 * dropped unsubmitted), or a failure (r's message set). */
kvd_status_t kvd_cluster_defer(kvd_req_t *r, kvd_cache_t *k, const uint8_t *const *keys,
                               const size_t *lens, uint32_t first, uint32_t n, int pull);

/* The status reply's cluster section (allocated with r). */
struct Kvdock__Cluster *kvd_cluster_status(kvd_req_t *r, const kvd_cluster_t *cl);

/* For the metrics: the totals, and peer i (of kvd_cluster_peers). */
typedef struct kvd_cluster_totals {
    uint64_t blocks_fetched, bytes_fetched, blocks_served, bytes_served, refused;
    uint64_t blocks_dropped; /* blocks on a lane that no fetch of ours asked for */
    uint32_t inbound;
    uint32_t unproven;       /* connections in (front door) without proof yet */
} kvd_cluster_totals_t;
void kvd_cluster_get_totals(const kvd_cluster_t *cl, kvd_cluster_totals_t *t);
uint32_t kvd_cluster_peers(const kvd_cluster_t *cl);
const char *kvd_cluster_peer(const kvd_cluster_t *cl, uint32_t i, int *up, uint64_t *rtt_us,
                             uint64_t *failures, uint64_t *bytes_fetched);

#endif
