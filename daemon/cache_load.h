/*
 * A cache load as a plan.  The handler (ops_cache.c) validates the
 * request once: the cache, the pool, its pages, the layer events and
 * flags, Sync, and the keys or the lease; kvd__load_create keeps what it
 * decided in a plan of its own (charged to the client as request
 * bookkeeping), holding the objects it names and the blocks already in
 * the tier.  Blocks land in the tier, and kvd__load_land copies landed
 * blocks of the plan into their pages (letting each go once it is in
 * its page); the plan ends once (kvd__load_run or kvd__load_end): the
 * blocks left are copied with the layer events, the flags and the reply,
 * so that every group's event and flag come after every block's layers.
 *
 * Where blocks come from is not the plan's business: a load of blocks all
 * in the tier runs at once (kvd__load_run); a load that waits for blocks
 * (the cluster pulling them from peers) calls kvd__load_wait, and whoever
 * brings them calls kvd__load_land as batches land and kvd__load_end
 * when nothing more will.  Loop thread only.
 */
#ifndef KVD_DAEMON_CACHE_LOAD_H
#define KVD_DAEMON_CACHE_LOAD_H

#include "caches.h"
#include "dataop.h"

typedef struct kvd__load kvd__load_t;

/* What the handler validated. */
typedef struct kvd__load_spec {
    kvd__cache_t *cache;
    kvd__pool_t *pool;
    uint32_t n;                 /* blocks */
    const int64_t *pages;       /* [n] the pool's page for each */
    const uint8_t *const *keys; /* [n] their keys, or NULL: the lease's blocks */
    const size_t *lens;
    kvd__lease_t *lease;         /* still the client's: the load takes it when it runs */
    void *const *levs;          /* [nevents] layer events, one per group */
    uint32_t nevents;
    uint32_t *flags;            /* [nflags] layer flags, one per group, or NULL */
    uint32_t nflags;
    uint32_t flag_value;
} kvd__load_spec_t;

/* Plan the load s of request r, from the operands d holds (the plan
 * holds them too; d's Sync settings become each copy's).  KVD_OK, or a
 * failure with r's message set and nothing kept. */
kvd_status_t kvd__load_create(kvd__req_t *r, kvd__dataop_t *d, const kvd__load_spec_t *s,
                              kvd__load_t **out);
/* A plan that never ran goes (its holds end). */
void kvd__load_destroy(kvd__load_t **l);

/* Blocks of the plan not READY in the tier now. */
uint32_t kvd__load_missing(const kvd__load_t *l);

/* Blocks of the plan on disk only now (each needs a host slot to be read
 * into, for a while), and whether kvd__load_fetch found no host slot for
 * some. */
uint32_t kvd__load_disk_only(const kvd__load_t *l);
int kvd__load_busy(const kvd__load_t *l);

/* The plan's blocks on disk only (the cache's disk level) are read into
 * host memory: the plan waits for them as for a pull (kvd__load_wait),
 * each landing as its read ends.  They stream through the host level:
 * as many are read at once as find a host slot, each is copied into its
 * page as it lands and then let go (its slot takes the next read; it
 * stays on disk), so a load may hold more blocks than the host level.
 * Where no read can start, the plan's blocks already in host memory are
 * copied and let go first.  The plan ends once every block is read, or
 * when blocks are left that found no slot and nothing of the plan in
 * flight could free one (EBUSY, naming them: slots held by leases); a
 * block whose record failed its checks is missing, as one no peer holds
 * is.  A plan by lease takes the lease when it waits: the load ends it,
 * whatever the outcome.  When the plan ends its chain lies in chain order
 * on the cache's lists, whatever order its blocks were let go in.  The
 * reads and copies started; 0: none to wait for (why kept where some
 * could not start: kvd__load_run names them). */
uint32_t kvd__load_fetch(kvd__load_t *l);

/* End the plan now, in r's handler: every block must be in the tier
 * (why: NULL, or why blocks could not be brought: a missing one is then
 * named with it).  KVD_OK: r is deferred, the reply comes when the copy
 * ends; a failure: r's message set, the plan gone. */
kvd_status_t kvd__load_run(kvd__req_t *r, kvd__load_t *l, const char *why);

/* The plan waits for blocks to land: its request is deferred (an
 * operation in flight on its client) until kvd__load_end. */
void kvd__load_wait(kvd__load_t *l);
/* The blocks of keys pos[0..n) are READY in the tier: the plan holds them
 * and copies them into their pages now, or once the copies before end. */
void kvd__load_land(kvd__load_t *l, const uint32_t *pos, uint32_t n);
/* Nothing more will land (why: "" or why blocks could not be brought):
 * once the copies in flight end, the rest is copied and the reply goes
 * (or the failure).  The plan is gone once it ends. */
void kvd__load_end(kvd__load_t *l, const char *why);

#endif
