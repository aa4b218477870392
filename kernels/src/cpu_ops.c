/*
 * CPU reference of every operation: the semantics of kvdock/kernels.h in
 * plain loops, used by the cpu backend and as the oracle for the CUDA
 * tests.  Clarity over speed; all byte offsets are 64-bit (validated to
 * fit before anything is touched).
 */
#include <string.h>

#include "internal.h"

static int64_t load_index(const void *p, int32_t dtype, int64_t i)
{
    if (dtype == KVD_DTYPE_I32)
        return ((const int32_t *)p)[i];
    return ((const int64_t *)p)[i];
}

static void add_oob(unsigned long long *oob_count, unsigned long long n)
{
    if (oob_count && n)
        *oob_count += n;
}

/* A transfer within one pool may name the same row on both sides; copying
 * a row onto itself is a no-op, and memcpy must not see it. */
static void copy_row(char *dst, const char *src, int64_t bytes)
{
    if (dst != src)
        memcpy(dst, src, (size_t)bytes);
}

/* ------------------------------------------------------------------------ */

kvd_status_t kvd_cpu_kv_store(const kvd_store_args_t *a, const kvd_launch_t *launch)
{
    kvd_status_t st;
    unsigned long long oob = 0;

    kvd__clear_error();
    if ((st = kvd__check_store(a)) != KVD_OK)
        return st;

    for (int64_t i = 0; i < a->num_tokens; i++) {
        int64_t slot = load_index(a->loc, a->loc_dtype, i);
        if (slot < 0)
            continue; /* padding */
        if (slot >= a->num_slots) {
            oob++;
            continue;
        }
        copy_row((char *)a->k_dst + slot * a->k_dst_stride,
                 (const char *)a->k_src + i * a->k_src_stride, a->row_bytes);
        if (a->v_dst)
            copy_row((char *)a->v_dst + slot * a->v_dst_stride,
                     (const char *)a->v_src + i * a->v_src_stride, a->row_bytes);
    }
    add_oob(a->oob_count, oob);
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */

static float load_src(const char *p, int32_t dtype)
{
    uint16_t h;
    float f;

    switch (dtype) {
    case KVD_DTYPE_F16:
        memcpy(&h, p, sizeof(h));
        return kvd_f16_to_float(h);
    case KVD_DTYPE_BF16:
        memcpy(&h, p, sizeof(h));
        return kvd_bf16_to_float(h);
    default:
        memcpy(&f, p, sizeof(f));
        return f;
    }
}

/* 1 / scale as one float division: volatile keeps the compiler from
 * folding it into x / scale, which rounds differently from the kernels'
 * x * (1 / scale). */
static float reciprocal(float scale)
{
    volatile float r = 1.0f / scale;
    return r;
}

/* One token's K or V: num_heads x head_dim elements to one cache slot. */
static void quantize_row(const kvd_fp8_set_args_t *a, const char *src, int64_t head_stride,
                         char *dst, int64_t cache_head_stride, float host_scale,
                         const float *scale_ptr)
{
    int64_t esize = (int64_t)kvd_dtype_size(a->src_dtype);

    for (int64_t h = 0; h < a->num_heads; h++) {
        float inv = 1.0f;
        switch (a->scale_mode) {
        case KVD_SCALE_HOST:
            inv = reciprocal(host_scale);
            break;
        case KVD_SCALE_DEVICE:
            inv = reciprocal(scale_ptr[0]);
            break;
        case KVD_SCALE_PER_HEAD:
            inv = reciprocal(scale_ptr[h]);
            break;
        }
        const char *s = src + h * head_stride;
        uint8_t *d = (uint8_t *)dst + h * cache_head_stride;
        for (int64_t i = 0; i < a->head_dim; i++) {
            float x = load_src(s + i * esize, a->src_dtype);
            float y = a->scale_mode == KVD_SCALE_NONE ? x : x * inv;
            d[i] = kvd_fp8_from_float(y, a->cache_dtype);
        }
    }
}

kvd_status_t kvd_cpu_fp8_set(const kvd_fp8_set_args_t *a, const kvd_launch_t *launch)
{
    kvd_status_t st;
    unsigned long long oob = 0;

    kvd__clear_error();
    if ((st = kvd__check_fp8_set(a)) != KVD_OK)
        return st;

    for (int64_t i = 0; i < a->num_tokens; i++) {
        int64_t slot = load_index(a->loc, a->loc_dtype, i);
        if (slot < 0)
            continue;
        if (slot >= a->num_slots) {
            oob++;
            continue;
        }
        int64_t page = slot / a->page_size, in_page = slot % a->page_size;
        quantize_row(a, (const char *)a->k_src + i * a->k_src_token_stride,
                     a->k_src_head_stride,
                     (char *)a->k_cache + page * a->k_page_stride + in_page * a->k_slot_stride,
                     a->k_head_stride, a->k_scale, a->k_scale_ptr);
        if (a->v_cache)
            quantize_row(a, (const char *)a->v_src + i * a->v_src_token_stride,
                         a->v_src_head_stride,
                         (char *)a->v_cache + page * a->v_page_stride +
                             in_page * a->v_slot_stride,
                         a->v_head_stride, a->v_scale, a->v_scale_ptr);
    }
    add_oob(a->oob_count, oob);
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */

static void store_entry(void *row, int32_t dtype, int64_t c, int64_t v)
{
    if (dtype == KVD_DTYPE_I32)
        ((int32_t *)row)[c] = (int32_t)v; /* table values and dummy fit */
    else
        ((int64_t *)row)[c] = v;
}

kvd_status_t kvd_cpu_page_table_gather(const kvd_gather_args_t *a, const kvd_launch_t *launch)
{
    kvd_status_t st;
    unsigned long long oob = 0;

    kvd__clear_error();
    if ((st = kvd__check_gather(a)) != KVD_OK)
        return st;
    if (a->bs == 0 || a->max_num_pages == 0)
        return KVD_OK;

    for (int64_t r = 0; r < a->bs; r++) {
        void *out = (char *)a->out + r * a->out_stride;
        int64_t req = load_index(a->req_pool_indices, a->req_dtype, r);
        int64_t n = 0; /* valid columns of this row */
        const void *row = NULL;

        if (req >= a->table_rows)
            oob++;
        if (req >= 0 && req < a->table_rows) {
            int64_t len = load_index(a->seq_lens, a->seq_lens_dtype, r);
            /* ceil(len / page_size) without forming len + page_size - 1 */
            n = len <= 0 ? 0 : len / a->page_size + (len % a->page_size != 0);
            if (n > a->table_cols)
                n = a->table_cols;
            row = (const char *)a->req_to_page + req * a->table_stride;
        }
        for (int64_t c = 0; c < a->max_num_pages; c++)
            store_entry(out, a->table_dtype, c,
                        c < n ? load_index(row, a->table_dtype, c) : a->dummy_slot);
    }
    add_oob(a->oob_count, oob);
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */

static char *layer_base(const kvd_kv_side_t *s, const uint64_t *table, void *base, int64_t l)
{
    if (s->k_layers)
        return (char *)(uintptr_t)table[l];
    return (char *)base + l * s->layer_stride;
}

kvd_status_t kvd_cpu_kv_transfer(const kvd_transfer_args_t *a, const kvd_launch_t *launch)
{
    kvd_status_t st;
    unsigned long long oob = 0;

    kvd__clear_error();
    if ((st = kvd__check_transfer(a)) != KVD_OK)
        return st;
    const kvd_kv_side_t *src = &a->src, *dst = &a->dst;
    /* Validation made both sides agree: MHA when either names a V. */
    int mha = src->k_layers ? src->v_layers != NULL : src->v != NULL;

    for (int64_t i = 0; i < a->count; i++) {
        int64_t s = load_index(a->src_idx, a->idx_dtype, i);
        int64_t d = load_index(a->dst_idx, a->idx_dtype, i);
        if (s < 0 || d < 0)
            continue; /* padding on either side: not counted */
        if (s >= src->num_slots || d >= dst->num_slots) {
            oob++; /* once per pair, however many layers */
            continue;
        }
        for (int64_t l = 0; l < a->num_layers; l++) {
            copy_row(layer_base(dst, dst->k_layers, dst->k, l) + d * dst->slot_stride,
                     layer_base(src, src->k_layers, src->k, l) + s * src->slot_stride,
                     a->row_bytes);
            if (mha)
                copy_row(layer_base(dst, dst->v_layers, dst->v, l) + d * dst->slot_stride,
                         layer_base(src, src->v_layers, src->v, l) + s * src->slot_stride,
                         a->row_bytes);
        }
    }
    add_oob(a->oob_count, oob);
    return KVD_OK;
}
