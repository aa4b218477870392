/*
 * Serving: this daemon's answers to its peers' queries (which keys of a
 * cache it holds) and fetches (the blocks themselves, sent on the
 * fetcher's lanes, block i to lane i % n, each held until its send
 * ends).  Over the links (link.h) and the lanes (lane.h); the glue
 * (cluster.c) hands it what concerns it.
 */
#ifndef KVD_DAEMON_CLUSTER_SERVE_H
#define KVD_DAEMON_CLUSTER_SERVE_H

#include "link.h"

typedef struct kvd__serve {
    kvd__server_t *srv;
    uint64_t blocks_served, bytes_served;
} kvd__serve_t;

/* Answer inbound link l's query q, or its fetch f. */
void kvd__serve_query(kvd__serve_t *sv, kvd__link_t *l, const Kvdock__Cluster__Query *q);
void kvd__serve_fetch(kvd__serve_t *sv, kvd__link_t *l, const Kvdock__Cluster__Fetch *f);
/* A block's send ended (a lane's op of kind KVD_LANE_SEND made here). */
void kvd__serve_sent(kvd__serve_t *sv, kvd__lane_op_t *op);

#endif
