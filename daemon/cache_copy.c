/* Copies between a pool's pages and the cache's slabs: see cache_copy.h. */
#include "cache_copy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The pool's pages as a transfer side: page p holds the block's rows of
 * each layer contiguously. */
static void page_side(const kvd__pool_t *p, uint32_t tokens, uint32_t begin, int copy_engine,
                      kvd_kv_side_t *s)
{
    kvd__fill_side(p, begin, copy_engine, s);
    s->slot_stride = (int64_t)(p->slot_stride * tokens);
    s->num_slots = (int64_t)(p->num_slots / tokens);
}

/* Slab s of the cache as a transfer side, from layer begin. */
static void slab_side(const kvd__cache_store_t *c, uint32_t s, uint32_t begin, kvd_kv_side_t *d)
{
    const kvd__cache_slab_t *sl = &c->slabs[s];
    uint64_t per_layer = c->chunk_bytes * (c->layout.mla ? 1 : 2);

    memset(d, 0, sizeof(*d));
    d->k = (char *)sl->ptr + begin * per_layer;
    d->v = c->layout.mla ? NULL : (char *)d->k + c->chunk_bytes;
    d->layer_stride = (int64_t)per_layer;
    d->slot_stride = (int64_t)c->block_bytes;
    d->num_slots = sl->nblocks;
}

void kvd__slab_plan_free(kvd__slab_plan_t *pl)
{
    free(pl->slab); /* one allocation: slab, count, pages, places */
    memset(pl, 0, sizeof(*pl));
}

kvd_status_t kvd__slab_plan(kvd__dataop_t *d, const kvd__cache_store_t *c, const uint32_t *ids,
                            const int64_t *pages, uint32_t n, kvd__slab_plan_t *pl, char *why,
                            size_t why_len)
{
    uint32_t *per, i, s, k, at;
    int64_t *stage;
    char *mem;

    memset(pl, 0, sizeof(*pl));
    if (n == 0)
        return KVD_OK;
    per = calloc(c->nslabs_max + 1, sizeof(*per));
    if (per == NULL) {
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    for (i = 0; i < n; i++)
        per[kvd__cache_slab_of(c, kvd__cache_host_slot(c, ids[i]))]++;
    for (s = 0; s < c->nslabs_max; s++)
        pl->nslabs += per[s] > 0;
    mem = malloc(pl->nslabs * (2 * sizeof(uint32_t) + 2 * sizeof(int64_t *)));
    stage = kvd__dataop_stage(d, NULL, 2 * (size_t)n * sizeof(int64_t), why, why_len);
    if (mem == NULL || stage == NULL) {
        free(per);
        free(mem);
        pl->nslabs = 0;
        if (mem == NULL) {
            snprintf(why, why_len, "out of memory");
            return KVD_ENOMEM;
        }
        return d->stage_status;
    }
    /* 2 * nslabs counts of 4 bytes: the pointers after them are aligned */
    pl->slab = (uint32_t *)mem;
    pl->count = pl->slab + pl->nslabs;
    pl->pages = (int64_t **)(pl->count + pl->nslabs);
    pl->places = pl->pages + pl->nslabs;
    /* per[s] becomes the slab's row in the plan; each slab's runs are
     * filled in chain order */
    for (s = 0, at = 0, k = 0; s < c->nslabs_max; s++) {
        if (per[s] == 0)
            continue;
        pl->slab[k] = s;
        pl->count[k] = 0;
        pl->pages[k] = stage + at;
        pl->places[k] = stage + at + per[s];
        at += 2 * per[s];
        per[s] = k++;
    }
    for (i = 0; i < n; i++) {
        uint32_t slot = kvd__cache_host_slot(c, ids[i]);

        k = per[kvd__cache_slab_of(c, slot)];
        pl->pages[k][pl->count[k]] = pages[i];
        pl->places[k][pl->count[k]] = kvd__cache_pos_of(c, slot);
        pl->count[k]++;
    }
    free(per);
    return KVD_OK;
}

void kvd__slab_jobs(kvd__dataop_t *d, const kvd__pool_t *p, const kvd__cache_store_t *c,
                    const kvd__slab_plan_t *pl, int to_cache, uint32_t begin, uint32_t count,
                    uint32_t *next)
{
    int ce = (d->job.flags & KVD_LAUNCH_COPY_ENGINE) != 0;

    for (uint32_t k = 0; k < pl->nslabs; k++) {
        kvd__job_t *job = kvd__dataop_job(d, (*next)++);
        kvd_transfer_args_t *a = &job->a.transfer;
        kvd_kv_side_t ps, cs;

        job->kind = KVD_JOB_TRANSFER;
        memset(a, 0, sizeof(*a));
        page_side(p, c->layout.tokens_per_block, begin, ce, &ps);
        slab_side(c, pl->slab[k], begin, &cs);
        a->src = to_cache ? ps : cs;
        a->dst = to_cache ? cs : ps;
        a->src_idx = to_cache ? pl->pages[k] : pl->places[k];
        a->dst_idx = to_cache ? pl->places[k] : pl->pages[k];
        a->idx_dtype = KVD_DTYPE_I64;
        a->count = pl->count[k];
        a->num_layers = count;
        a->row_bytes = (int64_t)c->chunk_bytes;
    }
}

void kvd__empty_job(kvd__dataop_t *d, kvd__job_t *job, const kvd__pool_t *p, uint32_t tokens)
{
    kvd_transfer_args_t *a = &job->a.transfer;

    job->kind = KVD_JOB_TRANSFER;
    memset(a, 0, sizeof(*a));
    page_side(p, tokens, 0, (d->job.flags & KVD_LAUNCH_COPY_ENGINE) != 0, &a->src);
    a->dst = a->src;
    a->num_layers = 1;
    a->idx_dtype = KVD_DTYPE_I64;
    a->row_bytes = (int64_t)(p->slot_bytes * tokens);
}
