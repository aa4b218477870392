/*
 * The cluster: kvdockd daemons on several machines that share the caches
 * made with cluster = true: control on TCP connections each daemon reads
 * itself, block bytes over UCX (proto/cluster.proto says what they say,
 * docs/design/cluster.md how, file by file; README "A cluster" why it
 * is built so).
 *
 * No directory and no home node: a lookup that misses locally asks every
 * live peer at once which of the missing keys it holds (one round trip,
 * answered from each peer's own index), and a load pulls the blocks it
 * lacks from the peers that hold them, spread over them, straight into
 * blocks of the local tier, and hands them to the load's plan batch by
 * batch as they land (cache_load.h).  Both go through one step: the
 * peers are asked (kvd__cluster_ask) and the caller hears back through
 * its callbacks.  Loop thread only, like the caches.
 */
#ifndef KVD_DAEMON_CLUSTER_H
#define KVD_DAEMON_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "kvdock/status.h"

typedef struct kvd__server kvd__server_t;
typedef struct kvd__cluster kvd__cluster_t;
typedef struct kvd__req kvd__req_t;
typedef struct kvd__cache kvd__cache_t;
struct Kvdock__Cluster;

/* What a lookup or a load asks of the peers (ops_cache.c): about keys
 * [first, n) of a cluster cache, which they hold (a lookup), or, for a
 * load (pull), to bring those the local tier lacks into it.  The cluster
 * copies the keys; it reports back only through the callbacks, on the
 * loop, never from inside kvd__cluster_ask. */
typedef struct kvd__cluster_ask {
    kvd__cache_t *cache;
    const uint8_t *const *keys;
    const size_t *lens;
    uint32_t first, n;
    int pull;
    /* pulls: the blocks of keys pos[0..count) landed and are READY in the
     * tier (committed) */
    void (*landed)(void *arg, const uint32_t *pos, uint32_t count);
    /* once, at the end: every asked peer answered, or the deadline passed.
     * present: a bit per key of [first, n), set when a live peer holds it
     * (lookups); why: "" or why keys could not be found or brought (a peer
     * that did not answer in time is named); waited_for: the peers asked
     * that did not answer (in time, or at all), HOST:PORT comma-separated,
     * or "" */
    void (*done)(void *arg, const uint8_t *present, const char *why, const char *waited_for);
    void *arg;
} kvd__cluster_ask_t;

static inline int kvd__cluster_bit(const uint8_t *bits, uint32_t i)
{
    return (bits[i >> 3] >> (i & 7)) & 1;
}

/* Listen, read the secret and the peers, start connecting (--cluster-*).
 * Nothing is left behind on error (why says what failed). */
kvd_status_t kvd__cluster_create(kvd__server_t *srv, kvd__cluster_t **out, char *why,
                                 size_t why_len);
/* The daemon is finishing: asks in flight end with what came (the drain
 * lets them end first), endpoints close, handles close. */
void kvd__cluster_close(kvd__cluster_t *cl);
/* After the loop has ended. */
void kvd__cluster_destroy(kvd__cluster_t **cl);

/* Peers that are up now. */
uint32_t kvd__cluster_live(const kvd__cluster_t *cl);

/* Ask the live peers (a): KVD_OK, and a->done comes later; KVD_ENOENT
 * when there is nothing to ask or wait for (why says why: no peer is up),
 * nothing kept; another failure (why says what). */
kvd_status_t kvd__cluster_ask(kvd__cluster_t *cl, const kvd__cluster_ask_t *a, char *why,
                              size_t why_len);

/* The status reply's cluster section (allocated with r). */
struct Kvdock__Cluster *kvd__cluster_status(kvd__req_t *r, const kvd__cluster_t *cl);

/* For the metrics: the totals, and peer i (of kvd__cluster_peers). */
typedef struct kvd__cluster_totals {
    uint64_t blocks_fetched, bytes_fetched, blocks_served, bytes_served, refused;
    uint64_t blocks_dropped; /* blocks on a lane that no fetch of ours asked for */
    uint32_t inbound;
    uint32_t unproven;       /* connections in (front door) without proof yet */
} kvd__cluster_totals_t;
void kvd__cluster_get_totals(const kvd__cluster_t *cl, kvd__cluster_totals_t *t);
uint32_t kvd__cluster_peers(const kvd__cluster_t *cl);
const char *kvd__cluster_peer(const kvd__cluster_t *cl, uint32_t i, int *up, uint64_t *rtt_us,
                              uint64_t *failures, uint64_t *bytes_fetched);

#endif
