/*
 * kvdock kernel library: every KV-cache operation, in CUDA and as a plain-C
 * reference with the same signatures.
 *
 * Plain C on purpose: the daemon, the tests and Python's ctypes all call it.
 *
 * Conventions shared by every operation
 * - Sizes, counts and strides are int64_t; every stride is in BYTES.  Rows
 *   (one token's or one slot's K, V or MLA latent) are contiguous: only the
 *   leading dimension has a free stride.
 * - Index arrays are KVD_DTYPE_I32 or KVD_DTYPE_I64.  A negative index is
 *   padding: that row is skipped.  An index at or past the bound it is
 *   checked against (a pool's num_slots, a table's rows) is never
 *   dereferenced: the row is skipped and, if oob_count is set, counted.
 * - oob_count, when not NULL, points to one counter that the call ADDS the
 *   number of out-of-range indices to (never cleared by the call).  For the
 *   CUDA functions it must be device-accessible memory; for the CPU
 *   reference, host memory.
 * - The CUDA functions take pointers to device memory or to pinned host
 *   memory (unified addressing), on either side.  The CPU functions take
 *   host pointers.
 * - Every function checks its arguments first and returns a status; on
 *   error nothing was launched or written.  kvd_last_error_detail() then
 *   says, for the calling thread, what exactly was wrong.
 * - A count of 0 is valid and does nothing (structural mismatches, such as
 *   MHA on one side and MLA on the other, are still refused).
 */
#ifndef KVDOCK_KERNELS_H
#define KVDOCK_KERNELS_H

#include <stdint.h>
#include <stddef.h>

#include "kvdock/status.h"
#include "kvdock/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVD_KERNELS_ABI_VERSION 1


/* Bytes per element; 0 for an unknown dtype. */
size_t kvd_dtype_size(int dtype);
/* "bf16", "e4m3", ...; "unknown" for an unknown dtype. */
const char *kvd_dtype_name(int dtype);

/* ABI version of the loaded library (KVD_KERNELS_ABI_VERSION). */
int kvd_kernels_abi_version(void);

/* What was wrong with the calling thread's last failed call ("" if none). */
const char *kvd_last_error_detail(void);

/* ------------------------------------------------------------------------ */
/* Launch control                                                            */

enum {
    /* Transfers only: move rows with the copy engines (no SM is used).
     * The index arrays, layer tables and oob_count must be host-readable
     * (else KVD_ENOTSUP): the call reads the indices when it is made, not
     * in stream order, and adds to oob_count before returning.  Every row
     * is one copy of a batch (a descriptor a run and layer); runs of
     * consecutive slots are merged; 2D copies only as
     * KVD_LAUNCH_TABLES_ONE_ALLOCATION says. */
    KVD_LAUNCH_COPY_ENGINE = 1u << 0,
    /* With KVD_LAUNCH_COPY_ENGINE: hand each batch whose runs average under
     * 32 KiB to the driver one cudaMemcpyAsync per run instead of one
     * cudaMemcpyBatchAsync (some drivers move small host-to-device runs
     * faster so, others slower: kvdockd's --copy-issue chooses).  The same
     * copies in the same stream order either way; 2D copies are as above. */
    KVD_LAUNCH_COPY_EACH = 1u << 1,
    /* With KVD_LAUNCH_COPY_ENGINE: move each run as one 2D copy over all
     * its layers where the layout allows, instead of a descriptor a
     * layer: between pinned host memory and the device, for a buffer whose
     * layers are evenly spaced on both sides (layer_stride, or a table
     * that steps evenly).  The caller asks for it and vouches that each
     * side's layers lie in one allocation (a stride does; tables may
     * not: layers evenly spaced in the address space may be separate
     * allocations, which a 2D copy may not span).  Fewer calls, not
     * always a faster copy: beside another process's compute, 2D copies
     * of 16-64 KiB runs can move far less than batches (kvdockd does not
     * ask for them: tests/bench/RESULTS.md). */
    KVD_LAUNCH_TABLES_ONE_ALLOCATION = 1u << 2,
};

typedef struct kvd_launch {
    void *stream;        /* cudaStream_t; NULL = the legacy default stream */
    uint32_t max_blocks; /* thread-block budget; 0 = as many as help */
    uint32_t flags;      /* KVD_LAUNCH_* */
} kvd_launch_t;
/* A NULL kvd_launch_t pointer means {NULL, 0, 0}.  The CPU reference
 * ignores the launch settings. */

/* ------------------------------------------------------------------------ */
/* store: K/V rows of num_tokens tokens into a pool at slots loc              */
/*   k_dst[loc[i]] = k_src[i]; v_dst[loc[i]] = v_src[i]                     */
/* MLA: v_src and v_dst both NULL, only K (the latent) is stored.           */

typedef struct kvd_store_args {
    const void *k_src;
    const void *v_src;
    int64_t k_src_stride; /* bytes from token i to token i+1 */
    int64_t v_src_stride;
    void *k_dst;
    void *v_dst;
    int64_t k_dst_stride; /* bytes from slot s to slot s+1 */
    int64_t v_dst_stride;
    int64_t num_slots; /* slots in k_dst and v_dst: the bound for loc */
    const void *loc;   /* num_tokens slot indices */
    int32_t loc_dtype; /* KVD_DTYPE_I32 or KVD_DTYPE_I64 */
    int64_t num_tokens;
    int64_t row_bytes; /* bytes per token row, > 0 */
    unsigned long long *oob_count;
} kvd_store_args_t;

/* ------------------------------------------------------------------------ */
/* fp8 set: quantize K/V to FP8 and scatter into a flat or paged cache.      */
/*   For token i, head h, dim d, with slot = loc[i]:                         */
/*   cache[(slot / page_size) * page_stride + (slot % page_size) * slot_stride */
/*         + h * head_stride + d] = fp8(float(src[i, h, d]) * (1 / scale))   */
/* The reciprocal and the product are float32, rounded to nearest even;    */
/* the conversion rounds to nearest even and saturates to the format's     */
/* largest finite value (infinities included); NaN becomes 0x7f.           */
/* K only: v_src and v_cache NULL.  A host scale is not checked: 0 gives    */
/* 1/0 = inf, as float arithmetic says.                                     */
/* A flat cache [slots, H, D] is page_size 1 with page_stride = slot_stride */
/* (or any page_size with page_stride = page_size * slot_stride).         */

enum kvd_scale_mode {
    KVD_SCALE_NONE = 0,     /* no scaling (scale 1) */
    KVD_SCALE_HOST = 1,     /* k_scale, v_scale */
    KVD_SCALE_DEVICE = 2,   /* *k_scale_ptr, *v_scale_ptr: one float each */
    KVD_SCALE_PER_HEAD = 3, /* k_scale_ptr[h], v_scale_ptr[h]: num_heads each */
};

typedef struct kvd_fp8_set_args {
    const void *k_src;
    const void *v_src;
    int32_t src_dtype; /* KVD_DTYPE_F32, F16 or BF16 */
    int64_t k_src_token_stride; /* bytes */
    int64_t k_src_head_stride;
    int64_t v_src_token_stride;
    int64_t v_src_head_stride;
    void *k_cache;
    void *v_cache;
    int32_t cache_dtype; /* KVD_DTYPE_E4M3 or E5M2 */
    int64_t page_size;   /* slots per page, >= 1 */
    int64_t k_page_stride; /* bytes */
    int64_t k_slot_stride;
    int64_t k_head_stride;
    int64_t v_page_stride;
    int64_t v_slot_stride;
    int64_t v_head_stride;
    int64_t num_slots; /* the bound for loc */
    int64_t num_heads;
    int64_t head_dim; /* elements; the last dimension is contiguous */
    const void *loc;
    int32_t loc_dtype;
    int64_t num_tokens;
    int32_t scale_mode; /* enum kvd_scale_mode */
    float k_scale;
    float v_scale;
    const float *k_scale_ptr;
    const float *v_scale_ptr;
    unsigned long long *oob_count;
} kvd_fp8_set_args_t;

/* ------------------------------------------------------------------------ */
/* page-table gather with padding                                            */
/*   For r < bs, c < max_num_pages, with req = req_pool_indices[r] and        */
/*   n = ceil(seq_lens[r] / page_size):                                      */
/*   out[r, c] = (c < n) ? req_to_page[req, c] : dummy_slot                  */
/* A negative req is padding (its row is all dummy_slot); a req at or past  */
/* table_rows is out of range (all dummy_slot, counted).  Columns at or past */
/* table_cols are dummy_slot.  bs == 0 or max_num_pages == 0 does nothing.  */

typedef struct kvd_gather_args {
    const void *req_to_page;
    int32_t table_dtype; /* I32 or I64; out has the same dtype */
    int64_t table_rows;
    int64_t table_cols;
    int64_t table_stride; /* bytes between rows */
    const void *req_pool_indices;
    int32_t req_dtype; /* I32 or I64 */
    const void *seq_lens;
    int32_t seq_lens_dtype; /* I32 or I64 */
    void *out;
    int64_t out_stride; /* bytes between rows */
    int64_t bs;
    int64_t max_num_pages;
    int64_t page_size; /* >= 1 */
    int64_t dummy_slot; /* must fit table_dtype */
    unsigned long long *oob_count;
} kvd_gather_args_t;

/* ------------------------------------------------------------------------ */
/* transfer: indexed copy of slots between two pools, one layer or many.     */
/*   For each pair i and layer l:                                            */
/*   dst.K[l][dst_idx[i]] = src.K[l][src_idx[i]]  (and V likewise)           */
/* MHA: K and V.  MLA: v and v_layers NULL on both sides, one latent buffer. */
/* A pair with a negative index on either side is padding: skipped, not     */
/* counted, even if its other index is out of range.  Layer tables must be  */
/* 8-byte aligned.                                                          */

typedef struct kvd_kv_side {
    /* Where layer l lives, one of two ways:
     * - k_layers / v_layers: device-accessible arrays (host-readable for
     *   KVD_LAUNCH_COPY_ENGINE) of num_layers addresses, as uint64;
     * - or, when those are NULL: k + l * layer_stride (and v likewise). */
    void *k;
    void *v;
    const uint64_t *k_layers;
    const uint64_t *v_layers;
    int64_t layer_stride; /* bytes; unused with tables or one layer */
    int64_t slot_stride;  /* bytes from slot s to slot s+1, K and V */
    int64_t num_slots;    /* the bound for this side's indices */
} kvd_kv_side_t;

typedef struct kvd_transfer_args {
    kvd_kv_side_t src;
    kvd_kv_side_t dst;
    int64_t num_layers; /* >= 1 */
    const void *src_idx;
    const void *dst_idx;
    int32_t idx_dtype; /* I32 or I64, both arrays */
    int64_t count;     /* pairs */
    int64_t row_bytes; /* bytes per slot row, > 0 */
    unsigned long long *oob_count; /* counts each bad pair once */
} kvd_transfer_args_t;

/* ------------------------------------------------------------------------ */
/* CUDA implementation                                                       */

/* KVD_OK when a device is usable; otherwise KVD_ENODEV (or KVD_ENOTSUP when
 * the library was built without CUDA) and a reason in why. */
kvd_status_t kvd_cuda_probe(char *why, size_t why_len);

/*
 * Load every kernel of the library on the current device now.  CUDA loads
 * kernels lazily, at their first launch, and that load can wait for work
 * already queued on the device: a launch into a stream that waits on
 * another process's event could then block until that event fires.  A
 * process that queues such waits (kvdockd) calls this once per device at
 * start; every entry point also does it on its first call.  KVD_ECUDA when
 * the device cannot be asked, KVD_ENOTSUP without CUDA.
 */
kvd_status_t kvd_cuda_load_kernels(void);

kvd_status_t kvd_cuda_kv_store(const kvd_store_args_t *a, const kvd_launch_t *launch);
kvd_status_t kvd_cuda_fp8_set(const kvd_fp8_set_args_t *a, const kvd_launch_t *launch);
kvd_status_t kvd_cuda_page_table_gather(const kvd_gather_args_t *a, const kvd_launch_t *launch);
kvd_status_t kvd_cuda_kv_transfer(const kvd_transfer_args_t *a, const kvd_launch_t *launch);

/* ------------------------------------------------------------------------ */
/* CPU reference: same semantics, host memory, run synchronously.            */

kvd_status_t kvd_cpu_kv_store(const kvd_store_args_t *a, const kvd_launch_t *launch);
kvd_status_t kvd_cpu_fp8_set(const kvd_fp8_set_args_t *a, const kvd_launch_t *launch);
kvd_status_t kvd_cpu_page_table_gather(const kvd_gather_args_t *a, const kvd_launch_t *launch);
kvd_status_t kvd_cpu_kv_transfer(const kvd_transfer_args_t *a, const kvd_launch_t *launch);

/* ------------------------------------------------------------------------ */
/* FP8 conversions, bit-exact with the kernels.                             */

/* float -> e4m3/e5m2: round to nearest even, saturate finite, NaN 0x7f. */
uint8_t kvd_fp8_from_float(float x, int fp8_dtype);
float kvd_fp8_to_float(uint8_t bits, int fp8_dtype);
float kvd_bf16_to_float(uint16_t bits);
float kvd_f16_to_float(uint16_t bits);

#ifdef __cplusplus
}
#endif

#endif /* KVDOCK_KERNELS_H */
