/*
 * Pulls: what a lookup or a load asks of the peers (kvd__cluster_ask in
 * cluster.h).  The keys go to every live peer at once (one round trip,
 * answered from each peer's own index); for a load, the keys the local
 * tier lacks are then fetched from the peers that hold them, spread over
 * them, straight into FILLING blocks reserved for them in the tier: in
 * place for eager messages, by a rendezvous receive straight into the
 * block for larger ones, a window of them at a time (the rest wait in
 * arrival order), so that blocks land in a steady stream.  A block is
 * committed once its bytes are in, aborted otherwise, and held until UCX
 * is done with it.  Landed blocks go to the asker in batches
 * (kvd__cluster_ask_t.landed: the load's plan copies them while the rest
 * come); at the end the asker hears once what could not come (.done).
 *
 * A peer that sends nothing for a whole deadline during a pull is cut
 * off (its link dropped, which closes its lane endpoints), so a pull
 * ends within a deadline of the last progress, however large.  A pull
 * that finds blocks another pull has reserved ends after that pull (its
 * leader) instead of pulling them again.  Over the links and the lanes;
 * the glue (cluster.c) hands it their news.
 */
#ifndef KVD_DAEMON_CLUSTER_PULL_H
#define KVD_DAEMON_CLUSTER_PULL_H

#include "cluster.h"
#include "link.h"

typedef struct pend pend_t;

typedef struct kvd__pulls {
    kvd__server_t *srv;
    kvd__links_t *links;
    kvd__lanes_t *lanes;
    uint64_t deadline_ns;
    pend_t *pends;
    uint64_t next_id;
    int closing;
    uint64_t blocks_fetched, bytes_fetched;
    uint64_t stray;          /* blocks no fetch of ours asked for */
} kvd__pulls_t;

/* kvd__cluster_ask (cluster.h), for the glue. */
kvd_status_t kvd__pull_ask(kvd__pulls_t *ps, const kvd__cluster_ask_t *a, char *why,
                           size_t why_len);
/* Outbound link l brought an answer to one of our queries or fetches. */
void kvd__pull_query_reply(kvd__pulls_t *ps, kvd__link_t *l, const Kvdock__Cluster__QueryReply *r);
void kvd__pull_fetch_done(kvd__pulls_t *ps, kvd__link_t *l, const Kvdock__Cluster__FetchDone *f);
/* A block message came on lane ln (kvd__lane_up_t.arrived). */
void kvd__pull_arrived(kvd__pulls_t *ps, kvd__lane_t *ln, const uint64_t hdr[KVD_LANE_HDR],
                       const void *bytes, void *rndv, size_t length);
/* A receive ended (a lane's op of kind KVD_LANE_RECV made here). */
void kvd__pull_received(kvd__pulls_t *ps, kvd__lane_op_t *op);
/* Configured peer i is gone: what it owed every ask is lost. */
void kvd__pull_peer_lost(kvd__pulls_t *ps, uint32_t i, const char *why);
/* Deadlines: peers that did not answer, pulls that stopped moving. */
void kvd__pull_tick(kvd__pulls_t *ps, uint64_t now);
/* The daemon finishes: every ask ends with what came. */
void kvd__pull_close(kvd__pulls_t *ps);

#endif
