/*
 * Data operations: store, fp8 set, page-table gather, transfer.  Each
 * handler validates every field first (ids and ownership, byte ranges
 * against sizes, inline index values against slot counts, dtypes and
 * shapes, layer ranges, alignment), then submits one job (dataop.h).
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dataop.h"
#include "log.h"

static int data_given(const Kvdock__Data *dd)
{
    return dd != NULL && (dd->inline_.len > 0 || dd->buffer != NULL);
}

/* The pool a store or fp8_set writes one layer of, with that layer in it. */
static kvd_status_t get_pool_layer(kvd__req_t *r, kvd__dataop_t *d, uint64_t pool, uint32_t layer,
                                   kvd__pool_t **p)
{
    kvd_status_t st;

    if ((st = kvd__get_pool(r, d, pool, "pool", p)) != KVD_OK)
        return st;
    if (layer >= (*p)->num_layers)
        return kvd__req_fail(r, KVD_ERANGE, "layer %u: pool %" PRIu64 " has %u layers", layer,
                             (*p)->obj.id, (*p)->num_layers);
    return KVD_OK;
}

/* ---- store ----------------------------------------------------------------- */

static kvd_status_t do_store(kvd__req_t *r, kvd__dataop_t *d)
{
    const Kvdock__Store *s = r->req->store;
    kvd__pool_t *p = NULL;
    kvd__idx_t loc;
    const void *k, *v = NULL;
    uint64_t stride, need, most;
    kvd_status_t st;

    if ((st = get_pool_layer(r, d, s->pool, s->layer, &p)) != KVD_OK)
        return st;
    if ((st = kvd__get_indices(r, d, s->loc, (int64_t)p->num_slots, "loc", &loc)) != KVD_OK)
        return st;
    stride = s->src_stride ? s->src_stride : p->slot_bytes;
    if (stride < p->slot_bytes)
        return kvd__req_fail(r, KVD_EINVAL, "src_stride %" PRIu64 " < slot_bytes %" PRIu64, stride,
                         p->slot_bytes);
    if (kvd__rows_extent((uint64_t)loc.count, stride, p->slot_bytes, &need) != 0)
        return kvd__req_fail(r, KVD_EOVERFLOW, "source size overflows");
    if (__builtin_mul_overflow((uint64_t)loc.count, stride, &most) || most < need)
        most = need;
    if ((st = kvd__get_data(r, d, s->k, need, most, 1, "k", &k)) != KVD_OK)
        return st;
    if (p->mla) {
        if (data_given(s->v))
            return kvd__req_fail(r, KVD_EINVAL, "pool %" PRIu64 " is MLA: it takes no v", p->obj.id);
    } else if ((st = kvd__get_data(r, d, s->v, need, most, 1, "v", &v)) != KVD_OK) {
        return st;
    }
    if ((st = kvd__get_sync(r, d, KVD_STREAM_WRITE, 0)) != KVD_OK)
        return st;

    if (loc.count == 0) {
        /* nothing is read: the kernels only want K and V paired */
        k = kvd__layer_k(p, s->layer);
        v = kvd__layer_v(p, s->layer);
    }
    d->job.kind = KVD_JOB_STORE;
    d->job.a.store = (kvd_store_args_t){
        .k_src = k,
        .v_src = v,
        .k_src_stride = (int64_t)stride,
        .v_src_stride = (int64_t)stride,
        .k_dst = kvd__layer_k(p, s->layer),
        .v_dst = kvd__layer_v(p, s->layer),
        .k_dst_stride = (int64_t)p->slot_stride,
        .v_dst_stride = (int64_t)p->slot_stride,
        .num_slots = (int64_t)p->num_slots,
        .loc = loc.ptr,
        .loc_dtype = loc.dtype,
        .num_tokens = loc.count,
        .row_bytes = (int64_t)p->slot_bytes,
    };
    d->rows = (uint64_t)loc.count;
    d->rows_valid = (uint64_t)loc.valid;
    d->row_bytes = p->slot_bytes * (p->mla ? 1 : 2);
    return kvd__submit(r, d);
}

/* ---- fp8 set --------------------------------------------------------------- */

static kvd_status_t check_scales(kvd__req_t *r, const float *v, size_t n, const char *what)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (!isfinite(v[i]) || v[i] == 0.0f)
            return kvd__req_fail(r, KVD_EINVAL, "%s[%zu] = %g: scales must be finite and non-zero",
                             what, i, (double)v[i]);
    return KVD_OK;
}

static kvd_status_t do_fp8_set(kvd__req_t *r, kvd__dataop_t *d)
{
    const Kvdock__Fp8Set *f = r->req->fp8_set;
    kvd_fp8_set_args_t *a = &d->job.a.fp8;
    kvd__pool_t *p = NULL;
    kvd__idx_t loc;
    const void *k, *v = NULL;
    uint64_t esize, row, need;
    kvd_status_t st;

    if ((st = get_pool_layer(r, d, f->pool, f->layer, &p)) != KVD_OK)
        return st;
    if (f->src_dtype != KVDOCK__DTYPE__F32 && f->src_dtype != KVDOCK__DTYPE__F16 &&
        f->src_dtype != KVDOCK__DTYPE__BF16)
        return kvd__req_fail(r, KVD_EDTYPE, "src_dtype must be F32, F16 or BF16");
    if (f->cache_dtype != KVDOCK__DTYPE__E4M3 && f->cache_dtype != KVDOCK__DTYPE__E5M2)
        return kvd__req_fail(r, KVD_EDTYPE, "cache_dtype must be E4M3 or E5M2");
    if (f->num_heads < 1 || f->head_dim < 1)
        return kvd__req_fail(r, KVD_EINVAL, "num_heads and head_dim must be >= 1");
    if ((uint64_t)f->num_heads * f->head_dim != p->slot_bytes)
        return kvd__req_fail(r, KVD_ESHAPE,
                         "num_heads x head_dim = %" PRIu64 " fp8 bytes, but the pool's slots "
                         "are %" PRIu64 " bytes",
                         (uint64_t)f->num_heads * f->head_dim, p->slot_bytes);
    if ((st = kvd__get_indices(r, d, f->loc, (int64_t)p->num_slots, "loc", &loc)) != KVD_OK)
        return st;
    esize = kvd_dtype_size((int)f->src_dtype);
    row = (uint64_t)f->num_heads * f->head_dim * esize;
    if (kvd__rows_extent((uint64_t)loc.count, row, row, &need) != 0)
        return kvd__req_fail(r, KVD_EOVERFLOW, "source size overflows");
    if ((st = kvd__get_data(r, d, f->k, need, need, esize, "k", &k)) != KVD_OK)
        return st;
    if (p->mla) {
        if (data_given(f->v))
            return kvd__req_fail(r, KVD_EINVAL, "pool %" PRIu64 " is MLA: it takes no v", p->obj.id);
    } else if ((st = kvd__get_data(r, d, f->v, need, need, esize, "v", &v)) != KVD_OK) {
        return st;
    }

    memset(a, 0, sizeof(*a));
    switch (f->scale_mode) {
    case KVDOCK__SCALE_MODE__SCALE_NONE:
        a->scale_mode = KVD_SCALE_NONE;
        break;
    case KVDOCK__SCALE_MODE__SCALE_TENSOR:
        if ((st = check_scales(r, &f->k_scale, 1, "k_scale")) != KVD_OK ||
            (!p->mla && (st = check_scales(r, &f->v_scale, 1, "v_scale")) != KVD_OK))
            return st;
        a->scale_mode = KVD_SCALE_HOST;
        a->k_scale = f->k_scale;
        a->v_scale = f->v_scale;
        break;
    case KVDOCK__SCALE_MODE__SCALE_PER_HEAD:
        if (f->n_k_head_scales != f->num_heads ||
            (!p->mla && f->n_v_head_scales != f->num_heads))
            return kvd__req_fail(r, KVD_ESHAPE, "per-head scales: %zu k and %zu v for %u heads",
                             f->n_k_head_scales, f->n_v_head_scales, f->num_heads);
        if ((st = check_scales(r, f->k_head_scales, f->n_k_head_scales, "k_head_scales")) !=
                KVD_OK ||
            (!p->mla && (st = check_scales(r, f->v_head_scales, f->n_v_head_scales,
                                           "v_head_scales")) != KVD_OK))
            return st;
        a->scale_mode = KVD_SCALE_PER_HEAD;
        a->k_scale_ptr = kvd__stage(r, d, f->k_head_scales, f->num_heads * sizeof(float));
        if (!p->mla)
            a->v_scale_ptr = kvd__stage(r, d, f->v_head_scales, f->num_heads * sizeof(float));
        if (a->k_scale_ptr == NULL || (!p->mla && a->v_scale_ptr == NULL))
            return d->stage_status;
        break;
    default:
        return kvd__req_fail(r, KVD_EINVAL, "scale_mode %d is unknown", (int)f->scale_mode);
    }
    if ((st = kvd__get_sync(r, d, KVD_STREAM_WRITE, 0)) != KVD_OK)
        return st;

    if (loc.count == 0) {
        k = kvd__layer_k(p, f->layer); /* nothing is read */
        v = kvd__layer_v(p, f->layer);
    }
    d->job.kind = KVD_JOB_FP8_SET;
    a->k_src = k;
    a->v_src = v;
    a->src_dtype = (int32_t)f->src_dtype;
    a->k_src_token_stride = a->v_src_token_stride = (int64_t)row;
    a->k_src_head_stride = a->v_src_head_stride = (int64_t)(f->head_dim * esize);
    a->k_cache = kvd__layer_k(p, f->layer);
    a->v_cache = kvd__layer_v(p, f->layer);
    a->cache_dtype = (int32_t)f->cache_dtype;
    a->page_size = 1; /* the pool's slots are flat: page l holds slot l */
    a->k_page_stride = a->v_page_stride = (int64_t)p->slot_stride;
    a->k_slot_stride = a->v_slot_stride = (int64_t)p->slot_stride;
    a->k_head_stride = a->v_head_stride = (int64_t)f->head_dim;
    a->num_slots = (int64_t)p->num_slots;
    a->num_heads = f->num_heads;
    a->head_dim = f->head_dim;
    a->loc = loc.ptr;
    a->loc_dtype = loc.dtype;
    a->num_tokens = loc.count;
    d->rows = (uint64_t)loc.count;
    d->rows_valid = (uint64_t)loc.valid;
    d->row_bytes = p->slot_bytes * (p->mla ? 1 : 2);
    return kvd__submit(r, d);
}

/* ---- page-table gather ----------------------------------------------------- */

static kvd_status_t do_gather(kvd__req_t *r, kvd__dataop_t *d)
{
    const Kvdock__PageTableGather *g = r->req->gather;
    kvd_gather_args_t *a = &d->job.a.gather;
    uint64_t esize, table_row, out_row, table_stride, out_stride, need;
    kvd__idx_t req, seq;
    void *table = NULL, *out = NULL;
    kvd_status_t st;

    if (g->table_dtype != KVDOCK__DTYPE__I32 && g->table_dtype != KVDOCK__DTYPE__I64)
        return kvd__req_fail(r, KVD_EDTYPE, "table_dtype must be I32 or I64");
    esize = g->table_dtype == KVDOCK__DTYPE__I32 ? 4 : 8;
    if (g->page_size < 1)
        return kvd__req_fail(r, KVD_EINVAL, "page_size must be >= 1");
    if (g->table_rows > (uint64_t)INT64_MAX || g->table_cols > (uint64_t)INT64_MAX / 8 ||
        g->max_num_pages > (uint64_t)INT64_MAX / 8)
        return kvd__req_fail(r, KVD_EOVERFLOW, "table or output dimensions are too large");
    if (g->table_dtype == KVDOCK__DTYPE__I32 &&
        (g->dummy_slot < INT32_MIN || g->dummy_slot > INT32_MAX))
        return kvd__req_fail(r, KVD_ERANGE, "dummy_slot %" PRId64 " does not fit an I32 table",
                         g->dummy_slot);
    table_row = g->table_cols * esize;
    out_row = g->max_num_pages * esize;
    table_stride = g->table_stride ? g->table_stride : table_row;
    out_stride = g->out_stride ? g->out_stride : out_row;
    if (table_stride < table_row || out_stride < out_row)
        return kvd__req_fail(r, KVD_EINVAL, "table_stride and out_stride must cover a whole row");
    if (table_stride % esize || out_stride % esize)
        return kvd__req_fail(r, KVD_EALIGN, "strides must be multiples of %" PRIu64, esize);
    if ((st = kvd__get_indices(r, d, g->req_pool_indices, (int64_t)g->table_rows, "req_pool_indices",
                          &req)) != KVD_OK)
        return st;
    if ((st = kvd__get_indices(r, d, g->seq_lens, -1, "seq_lens", &seq)) != KVD_OK)
        return st;
    if (req.count != seq.count)
        return kvd__req_fail(r, KVD_ESHAPE, "%" PRId64 " req_pool_indices but %" PRId64 " seq_lens",
                         req.count, seq.count);
    if (kvd__rows_extent(g->table_rows, table_stride, table_row, &need) != 0)
        return kvd__req_fail(r, KVD_EOVERFLOW, "table size overflows");
    if ((st = kvd__get_bufref(r, d, g->req_to_page, need, esize, "req_to_page", &table, NULL)) !=
        KVD_OK)
        return st;
    if (kvd__rows_extent((uint64_t)req.count, out_stride, out_row, &need) != 0)
        return kvd__req_fail(r, KVD_EOVERFLOW, "output size overflows");
    if ((st = kvd__get_bufref(r, d, g->out, need, esize, "out", &out, NULL)) != KVD_OK)
        return st;
    if ((st = kvd__get_sync(r, d, KVD_STREAM_WRITE, 0)) != KVD_OK)
        return st;

    d->job.kind = KVD_JOB_GATHER;
    memset(a, 0, sizeof(*a));
    a->req_to_page = table;
    a->table_dtype = (int32_t)g->table_dtype;
    a->table_rows = (int64_t)g->table_rows;
    a->table_cols = (int64_t)g->table_cols;
    a->table_stride = (int64_t)table_stride;
    a->req_pool_indices = req.ptr;
    a->req_dtype = req.dtype;
    a->seq_lens = seq.ptr;
    a->seq_lens_dtype = seq.dtype;
    a->out = out;
    a->out_stride = (int64_t)out_stride;
    a->bs = req.count;
    a->max_num_pages = (int64_t)g->max_num_pages;
    a->page_size = g->page_size;
    a->dummy_slot = g->dummy_slot;
    d->rows = (uint64_t)req.count;
    d->rows_valid = (uint64_t)req.count;
    d->row_bytes = out_row;
    return kvd__submit(r, d);
}

/* ---- transfer -------------------------------------------------------------- */

static kvd_status_t do_transfer(kvd__req_t *r, kvd__dataop_t *d)
{
    const Kvdock__Transfer *t = r->req->transfer;
    kvd_transfer_args_t *a = &d->job.a.transfer;
    kvd__pool_t *src = NULL, *dst = NULL;
    uint32_t begin, count;
    kvd__idx_t si, di;
    int sclass;
    kvd_status_t st;

    if ((st = kvd__get_pool(r, d, t->src_pool, "src_pool", &src)) != KVD_OK ||
        (st = kvd__get_pool(r, d, t->dst_pool, "dst_pool", &dst)) != KVD_OK)
        return st;
    if (src->slot_bytes != dst->slot_bytes)
        return kvd__req_fail(r, KVD_ESHAPE, "slot_bytes differ: %" PRIu64 " (src) vs %" PRIu64
                         " (dst)", src->slot_bytes, dst->slot_bytes);
    if (src->mla != dst->mla)
        return kvd__req_fail(r, KVD_ESHAPE, "src is %s but dst is %s", src->mla ? "MLA" : "MHA",
                         dst->mla ? "MLA" : "MHA");
    if (t->all_layers) {
        if (t->layer_begin != 0 || t->layer_count != 0)
            return kvd__req_fail(r, KVD_EINVAL, "all_layers takes no layer_begin or layer_count");
        if (src->num_layers != dst->num_layers)
            return kvd__req_fail(r, KVD_ESHAPE, "all_layers: %u layers (src) vs %u (dst)",
                             src->num_layers, dst->num_layers);
        begin = 0;
        count = src->num_layers;
    } else {
        begin = t->layer_begin;
        count = t->layer_count ? t->layer_count : 1;
        if ((uint64_t)begin + count > src->num_layers ||
            (uint64_t)begin + count > dst->num_layers)
            return kvd__req_fail(r, KVD_ERANGE, "layers [%u, %" PRIu64 ") pass the end of a pool "
                             "(%u src, %u dst layers)", begin, (uint64_t)begin + count,
                             src->num_layers, dst->num_layers);
    }
    if ((st = kvd__get_indices(r, d, t->src, (int64_t)src->num_slots, "src", &si)) != KVD_OK ||
        (st = kvd__get_indices(r, d, t->dst, (int64_t)dst->num_slots, "dst", &di)) != KVD_OK)
        return st;
    if (si.count != di.count)
        return kvd__req_fail(r, KVD_ESHAPE, "%" PRId64 " src indices but %" PRId64 " dst", si.count,
                         di.count);
    if (si.count > 0 && si.dtype != di.dtype) {
        /* the kernels take one index type: widen an inline I32 side */
        kvd__idx_t *narrow = si.dtype == KVD_DTYPE_I32 ? &si : &di;

        if (!narrow->staged)
            return kvd__req_fail(r, KVD_EDTYPE, "src and dst indices must have one dtype (an "
                                 "I32 buffer cannot be paired with I64 indices)");
        if ((st = kvd__widen(r, d, narrow)) != KVD_OK)
            return st;
    }
    if (dst->kind != KVD_MEM_HOST && src->kind == KVD_MEM_HOST)
        sclass = KVD_STREAM_RELOAD;
    else if (src->kind != KVD_MEM_HOST && dst->kind == KVD_MEM_HOST)
        sclass = KVD_STREAM_OFFLOAD;
    else
        sclass = KVD_STREAM_D2D;
    if ((st = kvd__get_sync(r, d, sclass, 1)) != KVD_OK ||
        (st = kvd__choose_path(r, d, src->kind, dst->kind, si.on_device || di.on_device,
                          (t->src && t->src->buffer) || (t->dst && t->dst->buffer))) != KVD_OK)
        return st;

    d->job.kind = KVD_JOB_TRANSFER;
    memset(a, 0, sizeof(*a));
    kvd__fill_side(src, begin, (d->job.flags & KVD_LAUNCH_COPY_ENGINE) != 0, &a->src);
    kvd__fill_side(dst, begin, (d->job.flags & KVD_LAUNCH_COPY_ENGINE) != 0, &a->dst);
    a->num_layers = count;
    a->src_idx = si.ptr;
    a->dst_idx = di.ptr;
    a->idx_dtype = si.dtype;
    a->count = si.count;
    a->row_bytes = (int64_t)src->slot_bytes;
    d->rows = (uint64_t)si.count;
    d->rows_valid = (uint64_t)(si.valid < di.valid ? si.valid : di.valid);
    d->row_bytes = src->slot_bytes * (src->mla ? 1 : 2) * count;
    return kvd__submit(r, d);
}


/* ---- transfer -------------------------------------------------------------- */

/* ---- entry points ---------------------------------------------------------- */

kvd_status_t kvd__op_store(kvd__req_t *r)
{
    return kvd__dataop_run(r, do_store);
}

kvd_status_t kvd__op_fp8_set(kvd__req_t *r)
{
    return kvd__dataop_run(r, do_fp8_set);
}

kvd_status_t kvd__op_gather(kvd__req_t *r)
{
    return kvd__dataop_run(r, do_gather);
}

kvd_status_t kvd__op_transfer(kvd__req_t *r)
{
    return kvd__dataop_run(r, do_transfer);
}
