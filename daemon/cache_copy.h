/*
 * Copies between a pool's pages and the cache tier's slabs: the jobs a
 * save (pages into blocks) and a load (blocks into pages) submit.  A
 * block's bytes lie in one slab; a copy moves its blocks slab by slab,
 * the pool's pages and the blocks' places in their slab listed in
 * staging memory the kernels read.  No protocol: ops_cache.c and
 * cache_load.c build on it.
 */
#ifndef KVD_DAEMON_CACHE_COPY_H
#define KVD_DAEMON_CACHE_COPY_H

#include "cache.h"
#include "dataop.h"

/* The blocks a copy moves, by slab; every layer group's jobs use them. */
typedef struct kvd__slab_plan {
    uint32_t nslabs;   /* slabs with blocks */
    uint32_t *slab;    /* [nslabs] which */
    uint32_t *count;   /* [nslabs] blocks in it */
    int64_t **pages;   /* [nslabs] the pool's pages (staging memory of d) */
    int64_t **places;  /* [nslabs] the blocks' places in the slab (likewise) */
} kvd__slab_plan_t;

/* Plan the copy of blocks ids[0..n), each with a host slot, to or from
 * pages[0..n) (in chain order: each slab's run keeps it).  The index
 * arrays are staged in d; the plan's own arrays go with
 * kvd__slab_plan_free.  KVD_OK (nslabs 0
 * when n is 0), or a failure with why set. */
kvd_status_t kvd__slab_plan(kvd__dataop_t *d, const kvd__cache_store_t *c, const uint32_t *ids,
                            const int64_t *pages, uint32_t n, kvd__slab_plan_t *pl, char *why,
                            size_t why_len);
void kvd__slab_plan_free(kvd__slab_plan_t *pl);

/* Jobs *next on of d: one per slab of the plan, for layers [begin,
 * begin + count), from the pool into the cache (to_cache) or back. */
void kvd__slab_jobs(kvd__dataop_t *d, const kvd__pool_t *p, const kvd__cache_store_t *c,
                    const kvd__slab_plan_t *pl, int to_cache, uint32_t begin, uint32_t count,
                    uint32_t *next);

/* An empty transfer (nothing to copy), so that an operation's events are
 * still waited on and recorded in stream order. */
void kvd__empty_job(kvd__dataop_t *d, kvd__job_t *job, const kvd__pool_t *p, uint32_t tokens);

#endif
