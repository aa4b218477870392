/*
 * Argument validation: one table per operation, each row a bad input and
 * the exact status it must get.  Every row runs against the CPU reference
 * and the CUDA entry point, which validate the same way before touching a
 * device: so these rows never launch anything and pass with or without a
 * GPU (or CUDA).  After a refused call the destinations and the oob
 * counter must be as they were.  Valid rows (run on the CPU only) show
 * that the checks do not refuse legitimate layouts.
 */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvdock/kernels.h"

/* Each row is a valid base plus the fields it breaks, which override the
 * base's: that is the point, not a mistake. */
#pragma GCC diagnostic ignored "-Woverride-init"

#define N(a) (sizeof(a) / sizeof((a)[0]))
#define POISON 0xAB
#define OOB_START 77ull
#define OFF(p, n) ((void *)((char *)(p) + (n))) /* misaligned on purpose */

static _Alignas(64) uint8_t src_k[256], src_v[256];
static _Alignas(64) uint8_t dst_k[256], dst_v[256]; /* every op writes only here */
static _Alignas(64) float fsrc_k[64], fsrc_v[64];
static _Alignas(64) int32_t idx32[8] = {0, 1, 2, 3, 4, 5, 6, 7};
static _Alignas(64) int64_t idx64[8] = {0, 1, 2, 3, 4, 5, 6, 7};
static _Alignas(64) int32_t seq32[8] = {16, 32, 0, 5, 1, 2, 3, 4};
static _Alignas(64) int32_t table32[4][8];
static _Alignas(64) float scales[8] = {1, 1, 1, 1, 1, 1, 1, 1};
static _Alignas(64) uint64_t k_tab[2], v_tab[2], k_tab2[2], v_tab2[2];
static unsigned long long oob;

static void poison(void)
{
    memset(dst_k, POISON, sizeof(dst_k));
    memset(dst_v, POISON, sizeof(dst_v));
    oob = OOB_START;
}

static void expect_untouched(const char *backend, const char *row)
{
    for (size_t i = 0; i < sizeof(dst_k); i++) {
        ck_assert_msg(dst_k[i] == POISON, "%s %s: dst_k[%zu] written", backend, row, i);
        ck_assert_msg(dst_v[i] == POISON, "%s %s: dst_v[%zu] written", backend, row, i);
    }
    ck_assert_msg(oob == OOB_START, "%s %s: oob_count changed", backend, row);
}

/* The status, and a detail naming the op when it is a failure. */
static void expect_status(const char *backend, const char *op, const char *row,
                          kvd_status_t got, kvd_status_t want)
{
    const char *detail = kvd_last_error_detail();

    ck_assert_msg(got == want, "%s %s: got %s, want %s (%s)", backend, row, kvd_err_name(got),
                  kvd_err_name(want), detail);
    if (want != KVD_OK) {
        ck_assert_msg(strncmp(detail, op, strlen(op)) == 0,
                      "%s %s: detail \"%s\" does not name %s", backend, row, detail, op);
    } else {
        ck_assert_msg(detail[0] == '\0', "%s %s: detail \"%s\" after success", backend, row,
                      detail);
    }
}

/* Bad rows on both backends; valid rows on the CPU only (CI has no GPU). */
#define RUN_ROWS(rows, cpu_fn, cuda_fn, op)                                          \
    do {                                                                             \
        for (size_t i_ = 0; i_ < N(rows); i_++) {                                    \
            const char *name_ = (rows)[i_].name;                                     \
            kvd_status_t want_ = (rows)[i_].want;                                    \
            poison();                                                                \
            expect_status("cpu", (op), name_, cpu_fn(&(rows)[i_].a, NULL), want_);   \
            if (want_ == KVD_OK)                                                     \
                continue;                                                            \
            expect_untouched("cpu", name_);                                          \
            poison();                                                                \
            expect_status("cuda", (op), name_, cuda_fn(&(rows)[i_].a, NULL), want_); \
            expect_untouched("cuda", name_);                                         \
        }                                                                            \
    } while (0)

/* ------------------------------------------------------------------------ */
/* store                                                                     */

typedef struct store_row {
    const char *name;
    kvd_status_t want;
    kvd_store_args_t a;
} store_row_t;

#define STORE_BASE                                                                          \
    .k_src = src_k, .v_src = src_v, .k_src_stride = 16, .v_src_stride = 16, .k_dst = dst_k, \
    .v_dst = dst_v, .k_dst_stride = 16, .v_dst_stride = 16, .num_slots = 16, .loc = idx32,  \
    .loc_dtype = KVD_DTYPE_I32, .num_tokens = 4, .row_bytes = 16, .oob_count = &oob

static const store_row_t store_rows[] = {
    {"loc_dtype f32", KVD_EDTYPE, {STORE_BASE, .loc_dtype = KVD_DTYPE_F32}},
    {"loc_dtype unknown", KVD_EDTYPE, {STORE_BASE, .loc_dtype = 42}},
    {"num_tokens < 0", KVD_EINVAL, {STORE_BASE, .num_tokens = -1}},
    {"num_slots < 0", KVD_EINVAL, {STORE_BASE, .num_slots = -1}},
    {"row_bytes 0", KVD_EINVAL, {STORE_BASE, .row_bytes = 0}},
    {"row_bytes < 0", KVD_EINVAL, {STORE_BASE, .row_bytes = -16}},
    {"k_src_stride < 0", KVD_EINVAL, {STORE_BASE, .k_src_stride = -16}},
    {"v_src_stride < 0", KVD_EINVAL, {STORE_BASE, .v_src_stride = -1}},
    {"k_dst_stride < 0", KVD_EINVAL, {STORE_BASE, .k_dst_stride = -16}},
    {"v_dst_stride < 0", KVD_EINVAL, {STORE_BASE, .v_dst_stride = -16}},
    {"v_src without v_dst", KVD_EINVAL, {STORE_BASE, .v_dst = NULL}},
    {"v_dst without v_src", KVD_EINVAL, {STORE_BASE, .v_src = NULL}},
    {"v pair mismatch, 0 tokens", KVD_EINVAL, {STORE_BASE, .v_dst = NULL, .num_tokens = 0}},
    {"k_src NULL", KVD_ENULL, {STORE_BASE, .k_src = NULL}},
    {"k_dst NULL", KVD_ENULL, {STORE_BASE, .k_dst = NULL}},
    {"loc NULL", KVD_ENULL, {STORE_BASE, .loc = NULL}},
    {"k slots overlap", KVD_ESHAPE, {STORE_BASE, .k_dst_stride = 8}},
    {"v slots overlap", KVD_ESHAPE, {STORE_BASE, .v_dst_stride = 0}},
    {"dst end overflows", KVD_EOVERFLOW, {STORE_BASE, .num_slots = INT64_MAX / 8}},
    {"k_dst_stride overflows", KVD_EOVERFLOW, {STORE_BASE, .k_dst_stride = INT64_MAX}},
    {"v_dst_stride overflows", KVD_EOVERFLOW, {STORE_BASE, .v_dst_stride = INT64_MAX / 4}},
    {"k_src_stride overflows", KVD_EOVERFLOW, {STORE_BASE, .k_src_stride = INT64_MAX / 2}},
    {"v_src_stride overflows", KVD_EOVERFLOW, {STORE_BASE, .v_src_stride = INT64_MAX / 2}},
    {"row end overflows",
     KVD_EOVERFLOW,
     {STORE_BASE, .num_slots = 1, .k_src_stride = 2, .row_bytes = INT64_MAX - 5}},
    {"loc bytes overflow",
     KVD_EOVERFLOW,
     {STORE_BASE, .loc = idx64, .loc_dtype = KVD_DTYPE_I64, .num_tokens = INT64_MAX / 4,
      .k_src_stride = 0, .v_src_stride = 0}},
    {"loc i32 misaligned", KVD_EALIGN, {STORE_BASE, .loc = OFF(idx32, 2)}},
    {"loc i64 misaligned",
     KVD_EALIGN,
     {STORE_BASE, .loc = OFF(idx64, 4), .loc_dtype = KVD_DTYPE_I64}},
};

static const store_row_t store_valid[] = {
    {"base", KVD_OK, {STORE_BASE}},
    {"0 tokens, NULL pointers", KVD_OK, {.loc_dtype = KVD_DTYPE_I32, .row_bytes = 1}},
    {"MLA", KVD_OK, {STORE_BASE, .v_src = NULL, .v_dst = NULL}},
    {"i64 loc", KVD_OK, {STORE_BASE, .loc = idx64, .loc_dtype = KVD_DTYPE_I64}},
    {"unaligned rows (any alignment)",
     KVD_OK,
     {STORE_BASE, .k_src = src_k + 1, .v_src = src_v + 3, .k_dst = dst_k + 5,
      .v_dst = dst_v + 7, .num_slots = 15, .row_bytes = 13}},
    {"one slot, stride 0",
     KVD_OK,
     {STORE_BASE, .num_slots = 1, .k_dst_stride = 0, .v_dst_stride = 0}},
    {"no slots", KVD_OK, {STORE_BASE, .num_slots = 0}},
    {"broadcast source", KVD_OK, {STORE_BASE, .k_src_stride = 0, .v_src_stride = 0}},
};

START_TEST(store_table)
{
    RUN_ROWS(store_rows, kvd_cpu_kv_store, kvd_cuda_kv_store, "kv_store:");
    RUN_ROWS(store_valid, kvd_cpu_kv_store, kvd_cuda_kv_store, "kv_store:");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* fp8 set                                                                   */

typedef struct fp8_row {
    const char *name;
    kvd_status_t want;
    kvd_fp8_set_args_t a;
} fp8_row_t;

#define FP8_BASE                                                                             \
    .k_src = fsrc_k, .v_src = fsrc_v, .src_dtype = KVD_DTYPE_F32, .k_src_token_stride = 32,  \
    .k_src_head_stride = 16, .v_src_token_stride = 32, .v_src_head_stride = 16,              \
    .k_cache = dst_k, .v_cache = dst_v, .cache_dtype = KVD_DTYPE_E4M3, .page_size = 1,       \
    .k_page_stride = 8, .k_slot_stride = 8, .k_head_stride = 4, .v_page_stride = 8,          \
    .v_slot_stride = 8, .v_head_stride = 4, .num_slots = 16, .num_heads = 2, .head_dim = 4,  \
    .loc = idx32, .loc_dtype = KVD_DTYPE_I32, .num_tokens = 2, .scale_mode = KVD_SCALE_HOST, \
    .k_scale = 1.0f, .v_scale = 1.0f, .k_scale_ptr = scales, .v_scale_ptr = scales,          \
    .oob_count = &oob

static const fp8_row_t fp8_rows[] = {
    {"src_dtype i32", KVD_EDTYPE, {FP8_BASE, .src_dtype = KVD_DTYPE_I32}},
    {"src_dtype e4m3", KVD_EDTYPE, {FP8_BASE, .src_dtype = KVD_DTYPE_E4M3}},
    {"src_dtype unknown", KVD_EDTYPE, {FP8_BASE, .src_dtype = 99}},
    {"cache_dtype f16", KVD_EDTYPE, {FP8_BASE, .cache_dtype = KVD_DTYPE_F16}},
    {"cache_dtype u8", KVD_EDTYPE, {FP8_BASE, .cache_dtype = KVD_DTYPE_U8}},
    {"loc_dtype f32", KVD_EDTYPE, {FP8_BASE, .loc_dtype = KVD_DTYPE_F32}},
    {"scale_mode 4", KVD_EINVAL, {FP8_BASE, .scale_mode = 4}},
    {"scale_mode -1", KVD_EINVAL, {FP8_BASE, .scale_mode = -1}},
    {"num_tokens < 0", KVD_EINVAL, {FP8_BASE, .num_tokens = -1}},
    {"num_slots < 0", KVD_EINVAL, {FP8_BASE, .num_slots = -1}},
    {"page_size 0", KVD_EINVAL, {FP8_BASE, .page_size = 0}},
    {"page_size < 0", KVD_EINVAL, {FP8_BASE, .page_size = -16}},
    {"num_heads 0", KVD_EINVAL, {FP8_BASE, .num_heads = 0}},
    {"head_dim 0", KVD_EINVAL, {FP8_BASE, .head_dim = 0}},
    {"head_dim < 0", KVD_EINVAL, {FP8_BASE, .head_dim = -4}},
    {"k_src_token_stride < 0", KVD_EINVAL, {FP8_BASE, .k_src_token_stride = -32}},
    {"k_src_head_stride < 0", KVD_EINVAL, {FP8_BASE, .k_src_head_stride = -16}},
    {"v_src_token_stride < 0", KVD_EINVAL, {FP8_BASE, .v_src_token_stride = -32}},
    {"v_src_head_stride < 0", KVD_EINVAL, {FP8_BASE, .v_src_head_stride = -16}},
    {"k_page_stride < 0", KVD_EINVAL, {FP8_BASE, .k_page_stride = -8}},
    {"k_slot_stride < 0", KVD_EINVAL, {FP8_BASE, .k_slot_stride = -8}},
    {"k_head_stride < 0", KVD_EINVAL, {FP8_BASE, .k_head_stride = -4}},
    {"v_page_stride < 0", KVD_EINVAL, {FP8_BASE, .v_page_stride = -8}},
    {"v_slot_stride < 0", KVD_EINVAL, {FP8_BASE, .v_slot_stride = -8}},
    {"v_head_stride < 0", KVD_EINVAL, {FP8_BASE, .v_head_stride = -4}},
    {"v_src without v_cache", KVD_EINVAL, {FP8_BASE, .v_cache = NULL}},
    {"v_cache without v_src", KVD_EINVAL, {FP8_BASE, .v_src = NULL}},
    {"k_src NULL", KVD_ENULL, {FP8_BASE, .k_src = NULL}},
    {"k_cache NULL", KVD_ENULL, {FP8_BASE, .k_cache = NULL}},
    {"loc NULL", KVD_ENULL, {FP8_BASE, .loc = NULL}},
    {"device k_scale_ptr NULL",
     KVD_ENULL,
     {FP8_BASE, .scale_mode = KVD_SCALE_DEVICE, .k_scale_ptr = NULL}},
    {"device v_scale_ptr NULL",
     KVD_ENULL,
     {FP8_BASE, .scale_mode = KVD_SCALE_DEVICE, .v_scale_ptr = NULL}},
    {"per-head k_scale_ptr NULL",
     KVD_ENULL,
     {FP8_BASE, .scale_mode = KVD_SCALE_PER_HEAD, .k_scale_ptr = NULL}},
    {"per-head v_scale_ptr NULL",
     KVD_ENULL,
     {FP8_BASE, .scale_mode = KVD_SCALE_PER_HEAD, .v_scale_ptr = NULL}},
    {"k heads overlap", KVD_ESHAPE, {FP8_BASE, .k_head_stride = 3}},
    {"v heads overlap", KVD_ESHAPE, {FP8_BASE, .v_head_stride = 0}},
    {"slots in a page overlap",
     KVD_ESHAPE,
     {FP8_BASE, .page_size = 4, .k_page_stride = 32, .k_slot_stride = 2}},
    {"k pages overlap", KVD_ESHAPE, {FP8_BASE, .k_page_stride = 0}},
    {"v pages overlap", KVD_ESHAPE, {FP8_BASE, .v_page_stride = 3}},
    {"cache end overflows", KVD_EOVERFLOW, {FP8_BASE, .num_slots = INT64_MAX / 4}},
    {"k_head_stride overflows", KVD_EOVERFLOW, {FP8_BASE, .k_head_stride = INT64_MAX}},
    {"k_src_token_stride overflows",
     KVD_EOVERFLOW,
     {FP8_BASE, .k_src_token_stride = INT64_MAX - 8}},
    {"head_dim bytes overflow",
     KVD_EOVERFLOW,
     {FP8_BASE, .num_heads = 1, .head_dim = INT64_MAX / 2, .num_slots = 1}},
    {"v_src_head_stride overflows", KVD_EOVERFLOW, {FP8_BASE, .v_src_head_stride = INT64_MAX}},
    {"per-head scales overflow",
     KVD_EOVERFLOW,
     {FP8_BASE, .scale_mode = KVD_SCALE_PER_HEAD, .num_heads = INT64_MAX / 2, .head_dim = 1,
      .k_head_stride = 1, .v_head_stride = 1, .k_src_head_stride = 0, .v_src_head_stride = 0,
      .num_slots = 1}},
    {"loc misaligned", KVD_EALIGN, {FP8_BASE, .loc = OFF(idx32, 1)}},
    {"k_src misaligned f32", KVD_EALIGN, {FP8_BASE, .k_src = OFF(fsrc_k, 2)}},
    {"v_src misaligned bf16",
     KVD_EALIGN,
     {FP8_BASE, .src_dtype = KVD_DTYPE_BF16, .v_src = OFF(fsrc_v, 1)}},
    {"k_src_token_stride not a multiple", KVD_EALIGN, {FP8_BASE, .k_src_token_stride = 30}},
    {"v_src_head_stride not a multiple",
     KVD_EALIGN,
     {FP8_BASE, .src_dtype = KVD_DTYPE_F16, .v_src_head_stride = 15}},
    {"device k_scale_ptr misaligned",
     KVD_EALIGN,
     {FP8_BASE, .scale_mode = KVD_SCALE_DEVICE, .k_scale_ptr = OFF(scales, 2)}},
    {"per-head v_scale_ptr misaligned",
     KVD_EALIGN,
     {FP8_BASE, .scale_mode = KVD_SCALE_PER_HEAD, .v_scale_ptr = OFF(scales, 1)}},
};

static const fp8_row_t fp8_valid[] = {
    {"base", KVD_OK, {FP8_BASE}},
    {"0 tokens, NULL pointers",
     KVD_OK,
     {.src_dtype = KVD_DTYPE_F32, .cache_dtype = KVD_DTYPE_E4M3, .loc_dtype = KVD_DTYPE_I32,
      .page_size = 1, .num_heads = 1, .head_dim = 1, .scale_mode = KVD_SCALE_DEVICE}},
    {"MLA, device scale without v_scale_ptr",
     KVD_OK,
     {FP8_BASE, .v_src = NULL, .v_cache = NULL, .scale_mode = KVD_SCALE_DEVICE,
      .v_scale_ptr = NULL}},
    {"no scale, no scale pointers",
     KVD_OK,
     {FP8_BASE, .scale_mode = KVD_SCALE_NONE, .k_scale_ptr = NULL, .v_scale_ptr = NULL}},
    {"paged NHD",
     KVD_OK,
     {FP8_BASE, .page_size = 4, .k_page_stride = 32, .k_slot_stride = 8, .k_head_stride = 4,
      .v_page_stride = 32, .v_slot_stride = 8, .v_head_stride = 4}},
    {"paged HND",
     KVD_OK,
     {FP8_BASE, .page_size = 4, .k_page_stride = 32, .k_slot_stride = 4, .k_head_stride = 16,
      .v_page_stride = 32, .v_slot_stride = 4, .v_head_stride = 16}},
    {"per-head, e5m2, f16",
     KVD_OK,
     {FP8_BASE, .scale_mode = KVD_SCALE_PER_HEAD, .cache_dtype = KVD_DTYPE_E5M2,
      .src_dtype = KVD_DTYPE_F16}},
    {"unaligned cache (bytes)", KVD_OK, {FP8_BASE, .k_cache = dst_k + 1, .num_slots = 15}},
};

START_TEST(fp8_table)
{
    RUN_ROWS(fp8_rows, kvd_cpu_fp8_set, kvd_cuda_fp8_set, "fp8_set:");
    RUN_ROWS(fp8_valid, kvd_cpu_fp8_set, kvd_cuda_fp8_set, "fp8_set:");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* page-table gather                                                         */

typedef struct gather_row {
    const char *name;
    kvd_status_t want;
    kvd_gather_args_t a;
} gather_row_t;

#define GATHER_BASE                                                                           \
    .req_to_page = table32, .table_dtype = KVD_DTYPE_I32, .table_rows = 4, .table_cols = 8,   \
    .table_stride = 32, .req_pool_indices = idx32, .req_dtype = KVD_DTYPE_I32,                \
    .seq_lens = seq32, .seq_lens_dtype = KVD_DTYPE_I32, .out = dst_k, .out_stride = 32,       \
    .bs = 2, .max_num_pages = 8, .page_size = 16, .dummy_slot = 0, .oob_count = &oob

static const gather_row_t gather_rows[] = {
    {"table_dtype f32", KVD_EDTYPE, {GATHER_BASE, .table_dtype = KVD_DTYPE_F32}},
    {"req_dtype u8", KVD_EDTYPE, {GATHER_BASE, .req_dtype = KVD_DTYPE_U8}},
    {"seq_lens_dtype unknown", KVD_EDTYPE, {GATHER_BASE, .seq_lens_dtype = 99}},
    {"table_rows < 0", KVD_EINVAL, {GATHER_BASE, .table_rows = -1}},
    {"table_cols < 0", KVD_EINVAL, {GATHER_BASE, .table_cols = -1}},
    {"bs < 0", KVD_EINVAL, {GATHER_BASE, .bs = -1}},
    {"max_num_pages < 0", KVD_EINVAL, {GATHER_BASE, .max_num_pages = -1}},
    {"page_size 0", KVD_EINVAL, {GATHER_BASE, .page_size = 0}},
    {"table_stride < 0", KVD_EINVAL, {GATHER_BASE, .table_stride = -32}},
    {"out_stride < 0", KVD_EINVAL, {GATHER_BASE, .out_stride = -4}},
    {"dummy_slot above i32", KVD_ERANGE, {GATHER_BASE, .dummy_slot = (int64_t)INT32_MAX + 1}},
    {"dummy_slot below i32", KVD_ERANGE, {GATHER_BASE, .dummy_slot = (int64_t)INT32_MIN - 1}},
    {"dummy_slot out of range, bs 0",
     KVD_ERANGE,
     {GATHER_BASE, .bs = 0, .dummy_slot = INT64_MAX}},
    {"req_to_page NULL", KVD_ENULL, {GATHER_BASE, .req_to_page = NULL}},
    {"req_pool_indices NULL", KVD_ENULL, {GATHER_BASE, .req_pool_indices = NULL}},
    {"seq_lens NULL", KVD_ENULL, {GATHER_BASE, .seq_lens = NULL}},
    {"out NULL", KVD_ENULL, {GATHER_BASE, .out = NULL}},
    {"out rows overlap", KVD_ESHAPE, {GATHER_BASE, .out_stride = 28}},
    {"out_stride 0", KVD_ESHAPE, {GATHER_BASE, .out_stride = 0}},
    {"out row bytes overflow", KVD_EOVERFLOW, {GATHER_BASE, .max_num_pages = INT64_MAX / 2}},
    {"out end overflows", KVD_EOVERFLOW, {GATHER_BASE, .out_stride = INT64_MAX - 16}},
    {"table end overflows", KVD_EOVERFLOW, {GATHER_BASE, .table_rows = INT64_MAX / 16}},
    {"table row bytes overflow", KVD_EOVERFLOW, {GATHER_BASE, .table_cols = INT64_MAX / 2}},
    {"table misaligned", KVD_EALIGN, {GATHER_BASE, .req_to_page = OFF(table32, 2)}},
    {"out misaligned", KVD_EALIGN, {GATHER_BASE, .out = OFF(dst_k, 1)}},
    {"table_stride not a multiple", KVD_EALIGN, {GATHER_BASE, .table_stride = 30}},
    {"out_stride not a multiple", KVD_EALIGN, {GATHER_BASE, .out_stride = 34}},
    {"req misaligned", KVD_EALIGN, {GATHER_BASE, .req_pool_indices = OFF(idx32, 1)}},
    {"seq_lens i64 misaligned",
     KVD_EALIGN,
     {GATHER_BASE, .seq_lens = OFF(idx64, 4), .seq_lens_dtype = KVD_DTYPE_I64}},
    {"i64 table misaligned",
     KVD_EALIGN,
     {GATHER_BASE, .table_dtype = KVD_DTYPE_I64, .req_to_page = OFF(table32, 4),
      .table_cols = 4, .out_stride = 64}},
};

static const gather_row_t gather_valid[] = {
    {"base", KVD_OK, {GATHER_BASE}},
    {"bs 0, NULL pointers",
     KVD_OK,
     {.table_dtype = KVD_DTYPE_I32, .req_dtype = KVD_DTYPE_I32,
      .seq_lens_dtype = KVD_DTYPE_I32, .page_size = 1}},
    {"no columns, NULL pointers",
     KVD_OK,
     {.table_dtype = KVD_DTYPE_I32, .req_dtype = KVD_DTYPE_I32,
      .seq_lens_dtype = KVD_DTYPE_I32, .page_size = 1, .bs = 4}},
    {"one row, out_stride 0", KVD_OK, {GATHER_BASE, .bs = 1, .out_stride = 0}},
    {"i64 table, dummy past i32",
     KVD_OK,
     {GATHER_BASE, .table_dtype = KVD_DTYPE_I64, .table_cols = 4, .out_stride = 64,
      .dummy_slot = INT64_MAX}},
    {"i32 dummy at the i32 limits", KVD_OK, {GATHER_BASE, .dummy_slot = INT32_MIN}},
    {"empty table", KVD_OK, {GATHER_BASE, .table_rows = 0}},
};

START_TEST(gather_table)
{
    RUN_ROWS(gather_rows, kvd_cpu_page_table_gather, kvd_cuda_page_table_gather,
             "page_table_gather:");
    RUN_ROWS(gather_valid, kvd_cpu_page_table_gather, kvd_cuda_page_table_gather,
             "page_table_gather:");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* transfer                                                                  */

typedef struct transfer_row {
    const char *name;
    kvd_status_t want;
    kvd_transfer_args_t a;
} transfer_row_t;

/* Member by member, so a row can override one member of a side. */
#define TRANSFER_BASE                                                                       \
    .src.k = src_k, .src.v = src_v, .src.layer_stride = 128, .src.slot_stride = 16,         \
    .src.num_slots = 8, .dst.k = dst_k, .dst.v = dst_v, .dst.layer_stride = 128,            \
    .dst.slot_stride = 16, .dst.num_slots = 8, .num_layers = 2, .src_idx = idx32,           \
    .dst_idx = idx32 + 4, .idx_dtype = KVD_DTYPE_I32, .count = 4, .row_bytes = 16,          \
    .oob_count = &oob

#define ALL_TABLES                                                                          \
    .src.k_layers = k_tab, .src.v_layers = v_tab, .dst.k_layers = k_tab2,                  \
    .dst.v_layers = v_tab2

static const transfer_row_t transfer_rows[] = {
    {"idx_dtype f32", KVD_EDTYPE, {TRANSFER_BASE, .idx_dtype = KVD_DTYPE_F32}},
    {"count < 0", KVD_EINVAL, {TRANSFER_BASE, .count = -1}},
    {"num_layers 0", KVD_EINVAL, {TRANSFER_BASE, .num_layers = 0}},
    {"num_layers < 0", KVD_EINVAL, {TRANSFER_BASE, .num_layers = -2}},
    {"row_bytes 0", KVD_EINVAL, {TRANSFER_BASE, .row_bytes = 0}},
    {"src.num_slots < 0", KVD_EINVAL, {TRANSFER_BASE, .src.num_slots = -1}},
    {"dst.num_slots < 0", KVD_EINVAL, {TRANSFER_BASE, .dst.num_slots = -1}},
    {"src.layer_stride < 0", KVD_EINVAL, {TRANSFER_BASE, .src.layer_stride = -128}},
    {"src.slot_stride < 0", KVD_EINVAL, {TRANSFER_BASE, .src.slot_stride = -16}},
    {"dst.layer_stride < 0", KVD_EINVAL, {TRANSFER_BASE, .dst.layer_stride = -128}},
    {"dst.slot_stride < 0", KVD_EINVAL, {TRANSFER_BASE, .dst.slot_stride = -16}},
    {"v_layers without k_layers", KVD_EINVAL, {TRANSFER_BASE, .src.v_layers = v_tab}},
    {"MHA tables without v_layers", KVD_EINVAL, {TRANSFER_BASE, .dst.k_layers = k_tab2}},
    {"src MLA, dst MHA", KVD_EINVAL, {TRANSFER_BASE, .src.v = NULL}},
    {"src MHA, dst MLA", KVD_EINVAL, {TRANSFER_BASE, .dst.v = NULL}},
    {"src MLA tables, dst MHA",
     KVD_EINVAL,
     {TRANSFER_BASE, .src.k_layers = k_tab, .src.v = NULL}},
    {"MHA/MLA mismatch, 0 pairs", KVD_EINVAL, {TRANSFER_BASE, .dst.v = NULL, .count = 0}},
    {"src_idx NULL", KVD_ENULL, {TRANSFER_BASE, .src_idx = NULL}},
    {"dst_idx NULL", KVD_ENULL, {TRANSFER_BASE, .dst_idx = NULL}},
    {"src.k NULL", KVD_ENULL, {TRANSFER_BASE, .src.k = NULL}},
    {"dst.k NULL", KVD_ENULL, {TRANSFER_BASE, .dst.k = NULL}},
    {"MLA, no buffers",
     KVD_ENULL,
     {TRANSFER_BASE, .src.k = NULL, .src.v = NULL, .dst.v = NULL}},
    {"dst slots overlap", KVD_ESHAPE, {TRANSFER_BASE, .dst.slot_stride = 8}},
    {"dst layers overlap", KVD_ESHAPE, {TRANSFER_BASE, .dst.layer_stride = 0}},
    {"src end overflows", KVD_EOVERFLOW, {TRANSFER_BASE, .src.num_slots = INT64_MAX / 8}},
    {"dst.layer_stride overflows", KVD_EOVERFLOW, {TRANSFER_BASE, .dst.layer_stride = INT64_MAX}},
    {"dst.slot_stride overflows",
     KVD_EOVERFLOW,
     {TRANSFER_BASE, .dst.slot_stride = INT64_MAX / 4}},
    {"index bytes overflow",
     KVD_EOVERFLOW,
     {TRANSFER_BASE, .idx_dtype = KVD_DTYPE_I64, .src_idx = idx64, .dst_idx = idx64,
      .count = INT64_MAX / 4}},
    {"layer tables overflow",
     KVD_EOVERFLOW,
     {TRANSFER_BASE, ALL_TABLES, .num_layers = INT64_MAX / 4}},
    {"rows to copy overflow",
     KVD_EOVERFLOW,
     {TRANSFER_BASE, ALL_TABLES, .num_layers = INT64_MAX / 8, .count = 6, .src.num_slots = 0,
      .dst.num_slots = 0}},
    {"src_idx misaligned", KVD_EALIGN, {TRANSFER_BASE, .src_idx = OFF(idx32, 1)}},
    {"dst_idx i64 misaligned",
     KVD_EALIGN,
     {TRANSFER_BASE, .idx_dtype = KVD_DTYPE_I64, .src_idx = idx64, .dst_idx = OFF(idx64, 4)}},
    {"layer table misaligned",
     KVD_EALIGN,
     {TRANSFER_BASE, ALL_TABLES, .src.k_layers = OFF(k_tab, 4)}},
};

static const transfer_row_t transfer_valid[] = {
    {"base", KVD_OK, {TRANSFER_BASE}},
    {"0 pairs, NULL pointers",
     KVD_OK,
     {.num_layers = 1, .idx_dtype = KVD_DTYPE_I32, .row_bytes = 1}},
    {"MLA", KVD_OK, {TRANSFER_BASE, .src.v = NULL, .dst.v = NULL}},
    {"unaligned rows (any alignment)",
     KVD_OK,
     {TRANSFER_BASE, .src.k = src_k + 1, .src.v = src_v + 3, .dst.k = dst_k + 5,
      .dst.v = dst_v + 7, .row_bytes = 13, .src.slot_stride = 13, .dst.slot_stride = 13,
      .src.layer_stride = 111, .dst.layer_stride = 111}},
    {"one dst slot, stride 0", KVD_OK, {TRANSFER_BASE, .dst.num_slots = 1, .dst.slot_stride = 0}},
    {"layers interleaved in a slot",
     KVD_OK,
     {TRANSFER_BASE, .dst.layer_stride = 16, .dst.slot_stride = 32}},
    {"one layer, layer_stride 0", KVD_OK, {TRANSFER_BASE, .num_layers = 1, .dst.layer_stride = 0}},
    {"tables on both sides", KVD_OK, {TRANSFER_BASE, ALL_TABLES}},
    {"tables ignore base pointers",
     KVD_OK,
     {TRANSFER_BASE, ALL_TABLES, .src.k = NULL, .dst.k = NULL}},
};

static void fill_tables(void)
{
    for (int l = 0; l < 2; l++) {
        k_tab[l] = (uintptr_t)(src_k + 128 * l);
        v_tab[l] = (uintptr_t)(src_v + 128 * l);
        k_tab2[l] = (uintptr_t)(dst_k + 128 * l);
        v_tab2[l] = (uintptr_t)(dst_v + 128 * l);
    }
}

START_TEST(transfer_table)
{
    fill_tables();
    RUN_ROWS(transfer_rows, kvd_cpu_kv_transfer, kvd_cuda_kv_transfer, "kv_transfer:");
    RUN_ROWS(transfer_valid, kvd_cpu_kv_transfer, kvd_cuda_kv_transfer, "kv_transfer:");
}
END_TEST

/* ------------------------------------------------------------------------ */

START_TEST(null_args)
{
    expect_status("cpu", "kv_store:", "NULL", kvd_cpu_kv_store(NULL, NULL), KVD_ENULL);
    expect_status("cuda", "kv_store:", "NULL", kvd_cuda_kv_store(NULL, NULL), KVD_ENULL);
    expect_status("cpu", "fp8_set:", "NULL", kvd_cpu_fp8_set(NULL, NULL), KVD_ENULL);
    expect_status("cuda", "fp8_set:", "NULL", kvd_cuda_fp8_set(NULL, NULL), KVD_ENULL);
    expect_status("cpu", "page_table_gather:", "NULL", kvd_cpu_page_table_gather(NULL, NULL),
                  KVD_ENULL);
    expect_status("cuda", "page_table_gather:", "NULL", kvd_cuda_page_table_gather(NULL, NULL),
                  KVD_ENULL);
    expect_status("cpu", "kv_transfer:", "NULL", kvd_cpu_kv_transfer(NULL, NULL), KVD_ENULL);
    expect_status("cuda", "kv_transfer:", "NULL", kvd_cuda_kv_transfer(NULL, NULL), KVD_ENULL);
}
END_TEST

/* The detail is exact enough to act on. */
START_TEST(detail_text)
{
    kvd_store_args_t a = {STORE_BASE, .row_bytes = 0};

    ck_assert_int_eq(kvd_cpu_kv_store(&a, NULL), KVD_EINVAL);
    ck_assert_str_eq(kvd_last_error_detail(), "kv_store: row_bytes must be > 0 (got 0)");
    a.row_bytes = 16;
    ck_assert_int_eq(kvd_cpu_kv_store(&a, NULL), KVD_OK);
    ck_assert_str_eq(kvd_last_error_detail(), ""); /* cleared by the next call */
}
END_TEST

static void *fail_in_thread(void *arg)
{
    kvd_store_args_t a = {STORE_BASE, .num_tokens = -1};
    const char **detail = arg;

    kvd_cpu_kv_store(&a, NULL);
    *detail = kvd_last_error_detail();
    return NULL;
}

/* Each thread has its own detail. */
START_TEST(detail_per_thread)
{
    kvd_gather_args_t a = {GATHER_BASE, .page_size = 0};
    const char *other = NULL;
    pthread_t t;

    ck_assert_int_eq(kvd_cpu_page_table_gather(&a, NULL), KVD_EINVAL);
    ck_assert_int_eq(pthread_create(&t, NULL, fail_in_thread, &other), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_ptr_nonnull(other);
    ck_assert_ptr_ne(other, kvd_last_error_detail());
    ck_assert_str_eq(kvd_last_error_detail(), "page_table_gather: page_size must be >= 1 (got 0)");
}
END_TEST

START_TEST(status_words)
{
    static const char *const names[] = {
        "OK",       "EINVAL",  "ENULL",     "ERANGE",    "EALIGN",     "EDTYPE",   "ESHAPE",
        "EOVERFLOW", "ENOMEM", "ECUDA",     "ENODEV",    "ENOTSUP",    "EPROTO",   "EVERSION",
        "ETOOBIG",  "ENOENT",  "EEXIST",    "EPERM",     "ELIMIT",     "EBUSY",    "ESHUTDOWN",
        "ECONN",    "EIO",     "ETIMEDOUT", "EUNKNOWNOP", "EINTERNAL",
    };
    for (int i = 0; i < (int)N(names); i++) {
        ck_assert_str_eq(kvd_err_name(i), names[i]);
        ck_assert_str_ne(kvd_strerror(i), "unknown status");
        ck_assert_str_ne(kvd_strerror(i), "");
    }
    ck_assert_str_eq(kvd_strerror(KVD_OK), "success");
    ck_assert_str_eq(kvd_strerror(KVD_EOVERFLOW), "size arithmetic overflows 64 bits");
    ck_assert_str_eq(kvd_strerror(KVD_EINTERNAL), "internal error");
    const int unknown[] = {-1, (int)N(names), 1000};
    for (size_t i = 0; i < N(unknown); i++) {
        ck_assert_str_eq(kvd_strerror(unknown[i]), "unknown status");
        ck_assert_str_eq(kvd_err_name(unknown[i]), "UNKNOWN");
    }
}
END_TEST

START_TEST(dtypes)
{
    static const struct {
        int dtype;
        size_t size;
        const char *name;
    } t[] = {
        {KVD_DTYPE_U8, 1, "u8"},     {KVD_DTYPE_I32, 4, "i32"},  {KVD_DTYPE_I64, 8, "i64"},
        {KVD_DTYPE_F32, 4, "f32"},   {KVD_DTYPE_F16, 2, "f16"},  {KVD_DTYPE_BF16, 2, "bf16"},
        {KVD_DTYPE_E4M3, 1, "e4m3"}, {KVD_DTYPE_E5M2, 1, "e5m2"}, {8, 0, "unknown"},
        {-1, 0, "unknown"},
    };
    for (size_t i = 0; i < N(t); i++) {
        ck_assert_uint_eq(kvd_dtype_size(t[i].dtype), t[i].size);
        ck_assert_str_eq(kvd_dtype_name(t[i].dtype), t[i].name);
    }
    ck_assert_int_eq(kvd_kernels_abi_version(), KVD_KERNELS_ABI_VERSION);
}
END_TEST

START_TEST(cuda_probe)
{
    char why[256] = "";
    kvd_status_t st = kvd_cuda_probe(why, sizeof(why));

    ck_assert_msg(st == KVD_OK || st == KVD_ENODEV || st == KVD_ENOTSUP, "probe: %s",
                  kvd_err_name(st));
    if (st != KVD_OK)
        ck_assert_msg(why[0] != '\0', "probe failed without a reason");
    ck_assert_int_eq(kvd_cuda_probe(NULL, 0), st); /* no buffer: still answers */

    /* loading the kernels works where the probe does, else says why */
    if (st == KVD_OK) {
        ck_assert_int_eq(kvd_cuda_load_kernels(), KVD_OK);
        ck_assert_int_eq(kvd_cuda_load_kernels(), KVD_OK); /* again: already loaded */
    } else {
        kvd_status_t ld = kvd_cuda_load_kernels();

        ck_assert_msg(ld == (st == KVD_ENOTSUP ? KVD_ENOTSUP : KVD_ECUDA), "load_kernels: %s",
                      kvd_err_name(ld));
        ck_assert_msg(kvd_last_error_detail()[0] != '\0', "load_kernels failed without a reason");
    }
}
END_TEST

static Suite *validate_suite(void)
{
    Suite *s = suite_create("kernels_validate");
    TCase *tc;

    tc = tcase_create("ops");
    tcase_add_test(tc, store_table);
    tcase_add_test(tc, fp8_table);
    tcase_add_test(tc, gather_table);
    tcase_add_test(tc, transfer_table);
    tcase_add_test(tc, null_args);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_test(tc, detail_text);
    tcase_add_test(tc, detail_per_thread);
    tcase_add_test(tc, status_words);
    tcase_add_test(tc, dtypes);
    tcase_add_test(tc, cuda_probe);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(validate_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
