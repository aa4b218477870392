/*
 * Argument checks shared by the CUDA and CPU backends, so both accept and
 * refuse exactly the same inputs.  Each check returns the first problem
 * found, in a fixed order: args, dtypes, scalar fields, pointer pairing,
 * then (only when the op will touch memory) missing pointers, overlapping
 * destination rows, 64-bit overflow of the byte offsets the op forms, and
 * alignment.  A count of 0 does nothing, so it needs no pointers.
 */
#include <inttypes.h>
#include <stdbool.h>

#include "internal.h"

#define FAIL(st, ...) return kvd__fail((st), __VA_ARGS__)

/* (n - 1) * stride + last, for n >= 1: the end of the last of n rows.
 * False when it does not fit in int64. */
static bool extent(int64_t n, int64_t stride, int64_t last, int64_t *out)
{
    int64_t off;

    return !__builtin_mul_overflow(n - 1, stride, &off) &&
           !__builtin_add_overflow(off, last, out);
}

static bool aligned(const void *p, size_t align)
{
    return (uintptr_t)p % align == 0;
}

static kvd_status_t check_index_dtype(const char *op, const char *field, int32_t dtype)
{
    if (!kvd__is_index_dtype(dtype))
        FAIL(KVD_EDTYPE, "%s: %s must be i32 or i64 (got %s, %" PRId32 ")", op, field,
             kvd_dtype_name(dtype), dtype);
    return KVD_OK;
}

static kvd_status_t check_nonneg(const char *op, const char *field, int64_t v)
{
    if (v < 0)
        FAIL(KVD_EINVAL, "%s: %s must be >= 0 (got %" PRId64 ")", op, field, v);
    return KVD_OK;
}

static kvd_status_t check_positive(const char *op, const char *field, int64_t v)
{
    if (v <= 0)
        FAIL(KVD_EINVAL, "%s: %s must be > 0 (got %" PRId64 ")", op, field, v);
    return KVD_OK;
}

static kvd_status_t check_ptr(const char *op, const char *field, const void *p)
{
    if (!p)
        FAIL(KVD_ENULL, "%s: %s is NULL", op, field);
    return KVD_OK;
}

/* An index array of n elements: its byte size must fit and it must be
 * aligned to its element size. */
static kvd_status_t check_index_array(const char *op, const char *field, const void *p,
                                      int32_t dtype, int64_t n)
{
    int64_t esize = (int64_t)kvd_dtype_size(dtype), bytes;

    if (__builtin_mul_overflow(n, esize, &bytes))
        FAIL(KVD_EOVERFLOW, "%s: %s of %" PRId64 " elements overflows 64 bits", op, field, n);
    if (!aligned(p, (size_t)esize))
        FAIL(KVD_EALIGN, "%s: %s (%p) is not aligned to its element size %" PRId64, op, field,
             p, esize);
    return KVD_OK;
}

/* Rows [0, n) at stride, row bytes each, for n >= 1: the last byte offset
 * must fit in int64. */
static kvd_status_t check_rows(const char *op, const char *field, int64_t n, int64_t stride,
                               int64_t row)
{
    int64_t end;

    if (n > 0 && !extent(n, stride, row, &end))
        FAIL(KVD_EOVERFLOW,
             "%s: %s: (%" PRId64 " - 1) * stride %" PRId64 " + %" PRId64
             " bytes overflows 64 bits",
             op, field, n, stride, row);
    return KVD_OK;
}

#define TRY(call)                      \
    do {                               \
        kvd_status_t st_ = (call);     \
        if (st_ != KVD_OK)             \
            return st_;                \
    } while (0)

/* ------------------------------------------------------------------------ */

kvd_status_t kvd__check_store(const kvd_store_args_t *a)
{
    static const char op[] = "kv_store";

    if (!a)
        FAIL(KVD_ENULL, "%s: args is NULL", op);
    TRY(check_index_dtype(op, "loc_dtype", a->loc_dtype));
    TRY(check_nonneg(op, "num_tokens", a->num_tokens));
    TRY(check_nonneg(op, "num_slots", a->num_slots));
    TRY(check_positive(op, "row_bytes", a->row_bytes));
    TRY(check_nonneg(op, "k_src_stride", a->k_src_stride));
    TRY(check_nonneg(op, "v_src_stride", a->v_src_stride));
    TRY(check_nonneg(op, "k_dst_stride", a->k_dst_stride));
    TRY(check_nonneg(op, "v_dst_stride", a->v_dst_stride));
    if (!a->v_src != !a->v_dst)
        FAIL(KVD_EINVAL, "%s: v_src and v_dst must be both set (MHA) or both NULL (MLA)", op);
    if (a->num_tokens == 0)
        return KVD_OK;

    bool mha = a->v_src != NULL;
    TRY(check_ptr(op, "k_src", a->k_src));
    TRY(check_ptr(op, "k_dst", a->k_dst));
    TRY(check_ptr(op, "loc", a->loc));

    if (a->num_slots > 1 && a->k_dst_stride < a->row_bytes)
        FAIL(KVD_ESHAPE,
             "%s: k_dst_stride (%" PRId64 ") < row_bytes (%" PRId64 "): slots would overlap", op,
             a->k_dst_stride, a->row_bytes);
    if (mha && a->num_slots > 1 && a->v_dst_stride < a->row_bytes)
        FAIL(KVD_ESHAPE,
             "%s: v_dst_stride (%" PRId64 ") < row_bytes (%" PRId64 "): slots would overlap", op,
             a->v_dst_stride, a->row_bytes);

    TRY(check_rows(op, "k_src", a->num_tokens, a->k_src_stride, a->row_bytes));
    TRY(check_rows(op, "k_dst", a->num_slots, a->k_dst_stride, a->row_bytes));
    if (mha) {
        TRY(check_rows(op, "v_src", a->num_tokens, a->v_src_stride, a->row_bytes));
        TRY(check_rows(op, "v_dst", a->num_slots, a->v_dst_stride, a->row_bytes));
    }
    /* Rows are bytes: any alignment works, the kernels pick the width. */
    TRY(check_index_array(op, "loc", a->loc, a->loc_dtype, a->num_tokens));
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */

static bool is_src_float(int32_t dt)
{
    return dt == KVD_DTYPE_F32 || dt == KVD_DTYPE_F16 || dt == KVD_DTYPE_BF16;
}

/* One cache (K or V) of an fp8 set: no two (slot, head) rows may overlap,
 * as far as clearly necessary conditions go (NHD and HND paged layouts
 * both pass).  Two heads of one slot, two slots of one page, two pages:
 * each pair holds contiguous head_dim-byte rows that must not share a byte. */
static kvd_status_t check_fp8_cache_shape(const kvd_fp8_set_args_t *a, const char *name,
                                          int64_t page_stride, int64_t slot_stride,
                                          int64_t head_stride)
{
    static const char op[] = "fp8_set";
    int64_t dim = a->head_dim;

    if (a->num_heads > 1 && head_stride < dim)
        FAIL(KVD_ESHAPE, "%s: %s_head_stride (%" PRId64 ") < head_dim (%" PRId64 ")", op, name,
             head_stride, dim);
    if (a->page_size > 1 && a->num_slots > 1 && slot_stride < dim)
        FAIL(KVD_ESHAPE, "%s: %s_slot_stride (%" PRId64 ") < head_dim (%" PRId64 ")", op, name,
             slot_stride, dim);
    if (a->num_slots > a->page_size && page_stride < dim)
        FAIL(KVD_ESHAPE, "%s: %s_page_stride (%" PRId64 ") < head_dim (%" PRId64 ")", op, name,
             page_stride, dim);
    return KVD_OK;
}

/* The largest offset into one cache must fit in int64. */
static kvd_status_t check_fp8_cache_size(const kvd_fp8_set_args_t *a, const char *name,
                                         int64_t page_stride, int64_t slot_stride,
                                         int64_t head_stride)
{
    static const char op[] = "fp8_set";

    if (a->num_slots == 0)
        return KVD_OK; /* every loc is out of range: nothing written */
    int64_t pages = a->num_slots / a->page_size + (a->num_slots % a->page_size != 0);
    int64_t slots = a->num_slots < a->page_size ? a->num_slots : a->page_size;
    int64_t end;
    if (!extent(a->num_heads, head_stride, a->head_dim, &end) ||
        !extent(slots, slot_stride, end, &end) || !extent(pages, page_stride, end, &end))
        FAIL(KVD_EOVERFLOW, "%s: %s cache offsets overflow 64 bits", op, name);
    return KVD_OK;
}

static kvd_status_t check_fp8_src_size(const kvd_fp8_set_args_t *a, const char *name,
                                       int64_t token_stride, int64_t head_stride)
{
    static const char op[] = "fp8_set";
    int64_t esize = (int64_t)kvd_dtype_size(a->src_dtype), row, end;

    if (__builtin_mul_overflow(a->head_dim, esize, &row) ||
        !extent(a->num_heads, head_stride, row, &end) ||
        !extent(a->num_tokens, token_stride, end, &end))
        FAIL(KVD_EOVERFLOW, "%s: %s offsets overflow 64 bits", op, name);
    return KVD_OK;
}

/* Sources are read as whole elements. */
static kvd_status_t check_fp8_src_align(const kvd_fp8_set_args_t *a, const char *name,
                                        const void *src, int64_t token_stride,
                                        int64_t head_stride)
{
    static const char op[] = "fp8_set";
    int64_t esize = (int64_t)kvd_dtype_size(a->src_dtype);

    if (!aligned(src, (size_t)esize))
        FAIL(KVD_EALIGN, "%s: %s (%p) is not aligned to %s (%" PRId64 " bytes)", op, name, src,
             kvd_dtype_name(a->src_dtype), esize);
    if (token_stride % esize)
        FAIL(KVD_EALIGN, "%s: %s_token_stride (%" PRId64 ") is not a multiple of %" PRId64, op,
             name, token_stride, esize);
    if (head_stride % esize)
        FAIL(KVD_EALIGN, "%s: %s_head_stride (%" PRId64 ") is not a multiple of %" PRId64, op,
             name, head_stride, esize);
    return KVD_OK;
}

kvd_status_t kvd__check_fp8_set(const kvd_fp8_set_args_t *a)
{
    static const char op[] = "fp8_set";

    if (!a)
        FAIL(KVD_ENULL, "%s: args is NULL", op);
    if (!is_src_float(a->src_dtype))
        FAIL(KVD_EDTYPE, "%s: src_dtype must be f32, f16 or bf16 (got %s, %" PRId32 ")", op,
             kvd_dtype_name(a->src_dtype), a->src_dtype);
    if (a->cache_dtype != KVD_DTYPE_E4M3 && a->cache_dtype != KVD_DTYPE_E5M2)
        FAIL(KVD_EDTYPE, "%s: cache_dtype must be e4m3 or e5m2 (got %s, %" PRId32 ")", op,
             kvd_dtype_name(a->cache_dtype), a->cache_dtype);
    TRY(check_index_dtype(op, "loc_dtype", a->loc_dtype));
    if (a->scale_mode < KVD_SCALE_NONE || a->scale_mode > KVD_SCALE_PER_HEAD)
        FAIL(KVD_EINVAL, "%s: unknown scale_mode %" PRId32, op, a->scale_mode);
    TRY(check_nonneg(op, "num_tokens", a->num_tokens));
    TRY(check_nonneg(op, "num_slots", a->num_slots));
    if (a->page_size < 1)
        FAIL(KVD_EINVAL, "%s: page_size must be >= 1 (got %" PRId64 ")", op, a->page_size);
    TRY(check_positive(op, "num_heads", a->num_heads));
    TRY(check_positive(op, "head_dim", a->head_dim));
    TRY(check_nonneg(op, "k_src_token_stride", a->k_src_token_stride));
    TRY(check_nonneg(op, "k_src_head_stride", a->k_src_head_stride));
    TRY(check_nonneg(op, "v_src_token_stride", a->v_src_token_stride));
    TRY(check_nonneg(op, "v_src_head_stride", a->v_src_head_stride));
    TRY(check_nonneg(op, "k_page_stride", a->k_page_stride));
    TRY(check_nonneg(op, "k_slot_stride", a->k_slot_stride));
    TRY(check_nonneg(op, "k_head_stride", a->k_head_stride));
    TRY(check_nonneg(op, "v_page_stride", a->v_page_stride));
    TRY(check_nonneg(op, "v_slot_stride", a->v_slot_stride));
    TRY(check_nonneg(op, "v_head_stride", a->v_head_stride));
    if (!a->v_src != !a->v_cache)
        FAIL(KVD_EINVAL, "%s: v_src and v_cache must be both set or both NULL", op);
    if (a->num_tokens == 0)
        return KVD_OK;

    bool has_v = a->v_src != NULL;
    bool scale_ptr = a->scale_mode == KVD_SCALE_DEVICE || a->scale_mode == KVD_SCALE_PER_HEAD;
    TRY(check_ptr(op, "k_src", a->k_src));
    TRY(check_ptr(op, "k_cache", a->k_cache));
    TRY(check_ptr(op, "loc", a->loc));
    if (scale_ptr) {
        TRY(check_ptr(op, "k_scale_ptr", a->k_scale_ptr));
        if (has_v)
            TRY(check_ptr(op, "v_scale_ptr", a->v_scale_ptr));
    }

    TRY(check_fp8_cache_shape(a, "k", a->k_page_stride, a->k_slot_stride, a->k_head_stride));
    if (has_v)
        TRY(check_fp8_cache_shape(a, "v", a->v_page_stride, a->v_slot_stride,
                                  a->v_head_stride));

    TRY(check_fp8_cache_size(a, "k", a->k_page_stride, a->k_slot_stride, a->k_head_stride));
    TRY(check_fp8_src_size(a, "k_src", a->k_src_token_stride, a->k_src_head_stride));
    if (has_v) {
        TRY(check_fp8_cache_size(a, "v", a->v_page_stride, a->v_slot_stride, a->v_head_stride));
        TRY(check_fp8_src_size(a, "v_src", a->v_src_token_stride, a->v_src_head_stride));
    }
    int64_t scale_bytes;
    if (a->scale_mode == KVD_SCALE_PER_HEAD &&
        __builtin_mul_overflow(a->num_heads, (int64_t)sizeof(float), &scale_bytes))
        FAIL(KVD_EOVERFLOW, "%s: %" PRId64 " per-head scales overflow 64 bits", op,
             a->num_heads);

    TRY(check_index_array(op, "loc", a->loc, a->loc_dtype, a->num_tokens));
    TRY(check_fp8_src_align(a, "k_src", a->k_src, a->k_src_token_stride, a->k_src_head_stride));
    if (has_v)
        TRY(check_fp8_src_align(a, "v_src", a->v_src, a->v_src_token_stride,
                                a->v_src_head_stride));
    /* The cache is bytes; scales are float loads. */
    if (scale_ptr && !aligned(a->k_scale_ptr, sizeof(float)))
        FAIL(KVD_EALIGN, "%s: k_scale_ptr (%p) is not 4-byte aligned", op,
             (const void *)a->k_scale_ptr);
    if (scale_ptr && has_v && !aligned(a->v_scale_ptr, sizeof(float)))
        FAIL(KVD_EALIGN, "%s: v_scale_ptr (%p) is not 4-byte aligned", op,
             (const void *)a->v_scale_ptr);
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */

kvd_status_t kvd__check_gather(const kvd_gather_args_t *a)
{
    static const char op[] = "page_table_gather";

    if (!a)
        FAIL(KVD_ENULL, "%s: args is NULL", op);
    TRY(check_index_dtype(op, "table_dtype", a->table_dtype));
    TRY(check_index_dtype(op, "req_dtype", a->req_dtype));
    TRY(check_index_dtype(op, "seq_lens_dtype", a->seq_lens_dtype));
    TRY(check_nonneg(op, "table_rows", a->table_rows));
    TRY(check_nonneg(op, "table_cols", a->table_cols));
    TRY(check_nonneg(op, "bs", a->bs));
    TRY(check_nonneg(op, "max_num_pages", a->max_num_pages));
    if (a->page_size < 1)
        FAIL(KVD_EINVAL, "%s: page_size must be >= 1 (got %" PRId64 ")", op, a->page_size);
    TRY(check_nonneg(op, "table_stride", a->table_stride));
    TRY(check_nonneg(op, "out_stride", a->out_stride));
    if (a->table_dtype == KVD_DTYPE_I32 &&
        (a->dummy_slot < INT32_MIN || a->dummy_slot > INT32_MAX))
        FAIL(KVD_ERANGE, "%s: dummy_slot %" PRId64 " does not fit an i32 table", op,
             a->dummy_slot);
    /* Nothing is read or written without both a row and a column. */
    if (a->bs == 0 || a->max_num_pages == 0)
        return KVD_OK;

    TRY(check_ptr(op, "req_to_page", a->req_to_page));
    TRY(check_ptr(op, "req_pool_indices", a->req_pool_indices));
    TRY(check_ptr(op, "seq_lens", a->seq_lens));
    TRY(check_ptr(op, "out", a->out));

    int64_t esize = (int64_t)kvd_dtype_size(a->table_dtype), out_row, table_row;
    if (__builtin_mul_overflow(a->max_num_pages, esize, &out_row))
        FAIL(KVD_EOVERFLOW, "%s: max_num_pages (%" PRId64 ") * %" PRId64 " overflows 64 bits", op,
             a->max_num_pages, esize);
    if (a->bs > 1 && a->out_stride < out_row)
        FAIL(KVD_ESHAPE,
             "%s: out_stride (%" PRId64 ") < max_num_pages * %" PRId64 " (%" PRId64
             "): rows would overlap",
             op, a->out_stride, esize, out_row);
    TRY(check_rows(op, "out", a->bs, a->out_stride, out_row));
    if (__builtin_mul_overflow(a->table_cols, esize, &table_row))
        FAIL(KVD_EOVERFLOW, "%s: table_cols (%" PRId64 ") * %" PRId64 " overflows 64 bits", op,
             a->table_cols, esize);
    if (a->table_cols > 0)
        TRY(check_rows(op, "req_to_page", a->table_rows, a->table_stride, table_row));

    TRY(check_index_array(op, "req_pool_indices", a->req_pool_indices, a->req_dtype, a->bs));
    TRY(check_index_array(op, "seq_lens", a->seq_lens, a->seq_lens_dtype, a->bs));
    /* Table and out are read and written as whole elements. */
    if (!aligned(a->req_to_page, (size_t)esize))
        FAIL(KVD_EALIGN, "%s: req_to_page (%p) is not aligned to %" PRId64, op, a->req_to_page,
             esize);
    if (!aligned(a->out, (size_t)esize))
        FAIL(KVD_EALIGN, "%s: out (%p) is not aligned to %" PRId64, op, a->out, esize);
    if (a->table_stride % esize)
        FAIL(KVD_EALIGN, "%s: table_stride (%" PRId64 ") is not a multiple of %" PRId64, op,
             a->table_stride, esize);
    if (a->out_stride % esize)
        FAIL(KVD_EALIGN, "%s: out_stride (%" PRId64 ") is not a multiple of %" PRId64, op,
             a->out_stride, esize);
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */

/* How one side of a transfer names its layers; EINVAL when the fields
 * disagree.  *tables: per-layer address tables; *mha: K and V. */
static kvd_status_t side_mode(const char *name, const kvd_kv_side_t *s, bool *tables, bool *mha)
{
    static const char op[] = "kv_transfer";

    *tables = s->k_layers || s->v_layers;
    if (*tables) {
        if (!s->k_layers)
            FAIL(KVD_EINVAL, "%s: %s.v_layers is set but %s.k_layers is NULL", op, name, name);
        if (s->v && !s->v_layers)
            FAIL(KVD_EINVAL, "%s: %s.v is set but %s.v_layers is NULL: MHA tables need both", op,
                 name, name);
        *mha = s->v_layers != NULL;
    } else {
        *mha = s->v != NULL;
    }
    return KVD_OK;
}

static kvd_status_t check_side(const kvd_transfer_args_t *a, const char *name,
                               const kvd_kv_side_t *s, bool tables)
{
    static const char op[] = "kv_transfer";
    int64_t end;

    if (!tables && !s->k)
        FAIL(KVD_ENULL, "%s: %s.k and %s.k_layers are NULL", op, name, name);
    if (tables && __builtin_mul_overflow(a->num_layers, (int64_t)sizeof(uint64_t), &end))
        FAIL(KVD_EOVERFLOW, "%s: %s tables of %" PRId64 " layers overflow 64 bits", op, name,
             a->num_layers);
    if (s->num_slots == 0)
        return KVD_OK; /* every index is out of range: nothing touched */
    if (!extent(s->num_slots, s->slot_stride, a->row_bytes, &end) ||
        (!tables && !extent(a->num_layers, s->layer_stride, end, &end)))
        FAIL(KVD_EOVERFLOW, "%s: %s offsets overflow 64 bits", op, name);
    return KVD_OK;
}

kvd_status_t kvd__check_transfer(const kvd_transfer_args_t *a)
{
    static const char op[] = "kv_transfer";
    bool src_tables = false, src_mha = false, dst_tables = false, dst_mha = false;

    if (!a)
        FAIL(KVD_ENULL, "%s: args is NULL", op);
    TRY(check_index_dtype(op, "idx_dtype", a->idx_dtype));
    TRY(check_nonneg(op, "count", a->count));
    if (a->num_layers < 1)
        FAIL(KVD_EINVAL, "%s: num_layers must be >= 1 (got %" PRId64 ")", op, a->num_layers);
    TRY(check_positive(op, "row_bytes", a->row_bytes));
    TRY(check_nonneg(op, "src.num_slots", a->src.num_slots));
    TRY(check_nonneg(op, "dst.num_slots", a->dst.num_slots));
    TRY(check_nonneg(op, "src.layer_stride", a->src.layer_stride));
    TRY(check_nonneg(op, "src.slot_stride", a->src.slot_stride));
    TRY(check_nonneg(op, "dst.layer_stride", a->dst.layer_stride));
    TRY(check_nonneg(op, "dst.slot_stride", a->dst.slot_stride));
    TRY(side_mode("src", &a->src, &src_tables, &src_mha));
    TRY(side_mode("dst", &a->dst, &dst_tables, &dst_mha));
    if (src_mha != dst_mha)
        FAIL(KVD_EINVAL, "%s: src is %s but dst is %s", op, src_mha ? "MHA (K and V)" : "MLA",
             dst_mha ? "MHA (K and V)" : "MLA");
    if (a->count == 0)
        return KVD_OK;

    TRY(check_ptr(op, "src_idx", a->src_idx));
    TRY(check_ptr(op, "dst_idx", a->dst_idx));
    if (a->dst.num_slots > 1 && a->dst.slot_stride < a->row_bytes)
        FAIL(KVD_ESHAPE,
             "%s: dst.slot_stride (%" PRId64 ") < row_bytes (%" PRId64 "): slots would overlap",
             op, a->dst.slot_stride, a->row_bytes);
    /* One slot in two layers; layouts that interleave layers within a slot
     * (layer_stride = row_bytes) still pass. */
    if (!dst_tables && a->num_layers > 1 && a->dst.num_slots > 0 &&
        a->dst.layer_stride < a->row_bytes)
        FAIL(KVD_ESHAPE,
             "%s: dst.layer_stride (%" PRId64 ") < row_bytes (%" PRId64 "): layers would overlap",
             op, a->dst.layer_stride, a->row_bytes);
    TRY(check_side(a, "src", &a->src, src_tables));
    TRY(check_side(a, "dst", &a->dst, dst_tables));
    TRY(check_index_array(op, "src_idx", a->src_idx, a->idx_dtype, a->count));
    TRY(check_index_array(op, "dst_idx", a->dst_idx, a->idx_dtype, a->count));
    /* The kernels number every row they copy: count * 2 * num_layers. */
    int64_t rows;
    if (__builtin_mul_overflow(a->count, (int64_t)(src_mha ? 2 : 1), &rows) ||
        __builtin_mul_overflow(rows, a->num_layers, &rows))
        FAIL(KVD_EOVERFLOW, "%s: %" PRId64 " pairs x %" PRId64 " layers overflows 64 bits", op,
             a->count, a->num_layers);
    /* Rows are bytes (any alignment); the tables are read as uint64. */
    const kvd_kv_side_t *sides[2] = {&a->src, &a->dst};
    for (int i = 0; i < 2; i++) {
        if (!aligned(sides[i]->k_layers, 8))
            FAIL(KVD_EALIGN, "%s: %s.k_layers (%p) is not 8-byte aligned", op,
                 i ? "dst" : "src", (const void *)sides[i]->k_layers);
        if (!aligned(sides[i]->v_layers, 8))
            FAIL(KVD_EALIGN, "%s: %s.v_layers (%p) is not 8-byte aligned", op,
                 i ? "dst" : "src", (const void *)sides[i]->v_layers);
    }
    return KVD_OK;
}
