/*
 * The CPU reference against expectations written out by hand: every
 * expected byte below was worked out on paper from the header's semantics,
 * not computed by a second implementation.  Destinations start poisoned
 * (0xAB, XX in the tables), so bytes the op must not write show up.
 *
 * FP8 values used (e4m3 / e5m2):
 *    1.0 0x38/0x3c   0.5 0x30/0x38   0.25 0x28/0x34   0.125 -/0x30
 *    2.0 0x40/0x40   4.0 0x48/0x44   1.5 0x3c/0x3e    3.0 0x44/0x42
 *    0.75 0x34/-     6.0 -/0x46      -x: | 0x80
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvdock/kernels.h"

#define XX 0xAB /* poison */
#define N(a) (sizeof(a) / sizeof((a)[0]))

static void expect_bytes(const char *what, const void *got_, const void *want_, size_t n)
{
    const uint8_t *g = got_, *want = want_;

    for (size_t i = 0; i < n; i++)
        ck_assert_msg(g[i] == want[i], "%s: byte %zu is 0x%02x, want 0x%02x", what, i, g[i],
                      want[i]);
}

#define EXPECT(what, got, want)                                  \
    do {                                                         \
        _Static_assert(sizeof(got) == sizeof(want), "size");     \
        expect_bytes((what), (got), (want), sizeof(want));       \
    } while (0)

#define OK(call) ck_assert_int_eq((call), KVD_OK)

/* ------------------------------------------------------------------------ */
/* store                                                                     */

START_TEST(store_mha_i32)
{
    const uint8_t k_src[] = {0x10, 0x11, 0x12, 0x13, 0x20, 0x21, 0x22, 0x23,
                             0x30, 0x31, 0x32, 0x33};
    const uint8_t v_src[] = {0x40, 0x41, 0x42, 0x43, 0x50, 0x51, 0x52, 0x53,
                             0x60, 0x61, 0x62, 0x63};
    const int32_t loc[] = {2, -1, 0};
    uint8_t k_dst[16], v_dst[16];
    unsigned long long oob = 0;
    memset(k_dst, XX, sizeof(k_dst));
    memset(v_dst, XX, sizeof(v_dst));

    kvd_store_args_t a = {
        .k_src = k_src, .v_src = v_src, .k_src_stride = 4, .v_src_stride = 4,
        .k_dst = k_dst, .v_dst = v_dst, .k_dst_stride = 4, .v_dst_stride = 4,
        .num_slots = 4, .loc = loc, .loc_dtype = KVD_DTYPE_I32, .num_tokens = 3,
        .row_bytes = 4, .oob_count = &oob,
    };
    OK(kvd_cpu_kv_store(&a, NULL));

    const uint8_t k_want[] = {0x30, 0x31, 0x32, 0x33, XX, XX, XX, XX,
                              0x10, 0x11, 0x12, 0x13, XX, XX, XX, XX};
    const uint8_t v_want[] = {0x60, 0x61, 0x62, 0x63, XX, XX, XX, XX,
                              0x40, 0x41, 0x42, 0x43, XX, XX, XX, XX};
    EXPECT("k_dst", k_dst, k_want);
    EXPECT("v_dst", v_dst, v_want);
    ck_assert_uint_eq(oob, 0); /* padding is not out of range */
}
END_TEST

/* MLA (K only), int64 loc, out-of-range slots counted onto an existing
 * count, a destination stride wider than the row. */
START_TEST(store_mla_i64_oob)
{
    const uint8_t k_src[] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int64_t loc[] = {5, 1, 4, -3};
    uint8_t k_dst[12];
    unsigned long long oob = 10;
    memset(k_dst, XX, sizeof(k_dst));

    kvd_store_args_t a = {
        .k_src = k_src, .k_src_stride = 2, .k_dst = k_dst, .k_dst_stride = 3,
        .num_slots = 4, .loc = loc, .loc_dtype = KVD_DTYPE_I64, .num_tokens = 4,
        .row_bytes = 2, .oob_count = &oob,
    };
    kvd_launch_t launch = {NULL, 4, 0}; /* ignored by the CPU reference */
    OK(kvd_cpu_kv_store(&a, &launch));

    const uint8_t want[] = {XX, XX, XX, 3, 4, XX, XX, XX, XX, XX, XX, XX};
    EXPECT("k_dst", k_dst, want);
    ck_assert_uint_eq(oob, 12);
}
END_TEST

/* K and V as views into a fused QKV buffer (stride 3 rows), an odd row
 * width of 6 and unaligned pointers. */
START_TEST(store_fused_qkv)
{
    const uint8_t qkv[] = {
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, /* token 0: q */
        0x10, 0x11, 0x12, 0x13, 0x14, 0x15, /*          k */
        0x20, 0x21, 0x22, 0x23, 0x24, 0x25, /*          v */
        0x30, 0x31, 0x32, 0x33, 0x34, 0x35, /* token 1: q */
        0x40, 0x41, 0x42, 0x43, 0x44, 0x45, /*          k */
        0x50, 0x51, 0x52, 0x53, 0x54, 0x55, /*          v */
    };
    const int32_t loc[] = {2, 0};
    uint8_t k_dst[21], v_dst[21];
    memset(k_dst, XX, sizeof(k_dst));
    memset(v_dst, XX, sizeof(v_dst));

    kvd_store_args_t a = {
        .k_src = qkv + 6, .v_src = qkv + 12, .k_src_stride = 18, .v_src_stride = 18,
        .k_dst = k_dst, .v_dst = v_dst, .k_dst_stride = 7, .v_dst_stride = 7,
        .num_slots = 3, .loc = loc, .loc_dtype = KVD_DTYPE_I32, .num_tokens = 2,
        .row_bytes = 6,
    };
    OK(kvd_cpu_kv_store(&a, NULL));

    const uint8_t k_want[] = {0x40, 0x41, 0x42, 0x43, 0x44, 0x45, XX,
                              XX,   XX,   XX,   XX,   XX,   XX,   XX,
                              0x10, 0x11, 0x12, 0x13, 0x14, 0x15, XX};
    const uint8_t v_want[] = {0x50, 0x51, 0x52, 0x53, 0x54, 0x55, XX,
                              XX,   XX,   XX,   XX,   XX,   XX,   XX,
                              0x20, 0x21, 0x22, 0x23, 0x24, 0x25, XX};
    EXPECT("k_dst", k_dst, k_want);
    EXPECT("v_dst", v_dst, v_want);
}
END_TEST

/* A realistic row: 3 heads x 96 dims x 2 bytes = 576.  Token t's byte j is
 * (t * 64 + j) & 0xff for K and that ^ 0xff for V; the expected placement
 * is the table slot_token. */
static uint8_t wide_byte(int t, int j, int v)
{
    uint8_t b = (uint8_t)((t * 64 + j) & 0xff);
    return v ? (uint8_t)(b ^ 0xff) : b;
}

START_TEST(store_wide_rows)
{
    enum { ROW = 3 * 96 * 2, TOKENS = 3, SLOTS = 4 };
    static uint8_t k_src[TOKENS * ROW], v_src[TOKENS * ROW];
    static uint8_t k_dst[SLOTS * ROW], v_dst[SLOTS * ROW];
    const int64_t loc[] = {3, 1, -1};
    const int slot_token[SLOTS] = {-1, 1, -1, 0}; /* -1: untouched */

    for (int t = 0; t < TOKENS; t++)
        for (int j = 0; j < ROW; j++) {
            k_src[t * ROW + j] = wide_byte(t, j, 0);
            v_src[t * ROW + j] = wide_byte(t, j, 1);
        }
    memset(k_dst, XX, sizeof(k_dst));
    memset(v_dst, XX, sizeof(v_dst));

    kvd_store_args_t a = {
        .k_src = k_src, .v_src = v_src, .k_src_stride = ROW, .v_src_stride = ROW,
        .k_dst = k_dst, .v_dst = v_dst, .k_dst_stride = ROW, .v_dst_stride = ROW,
        .num_slots = SLOTS, .loc = loc, .loc_dtype = KVD_DTYPE_I64, .num_tokens = TOKENS,
        .row_bytes = ROW,
    };
    OK(kvd_cpu_kv_store(&a, NULL));

    for (int s = 0; s < SLOTS; s++)
        for (int j = 0; j < ROW; j++) {
            int t = slot_token[s];
            uint8_t kw = t < 0 ? XX : wide_byte(t, j, 0), vw = t < 0 ? XX : wide_byte(t, j, 1);
            ck_assert_msg(k_dst[s * ROW + j] == kw, "k slot %d byte %d", s, j);
            ck_assert_msg(v_dst[s * ROW + j] == vw, "v slot %d byte %d", s, j);
        }
}
END_TEST

START_TEST(store_zero_tokens)
{
    unsigned long long oob = 5;
    kvd_store_args_t a = {.num_slots = 4, .loc_dtype = KVD_DTYPE_I32, .row_bytes = 8,
                          .oob_count = &oob};
    OK(kvd_cpu_kv_store(&a, NULL));
    ck_assert_uint_eq(oob, 5);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* fp8 set                                                                   */

/* Flat cache (page_size 1), no scale, e4m3, f32, MHA; saturation and -0. */
START_TEST(fp8_flat_none_e4m3)
{
    const float k_src[] = {1.0f, 0.5f, -2.0f, 2.0f, /* token 0: head 0, head 1 */
                           0.25f, 4.0f, 1.5f, -1.0f};
    const float v_src[] = {3.0f, 0.75f, 448.0f, 0.0f,
                           -0.5f, -4.0f, 1000.0f, -0.0f};
    const int32_t loc[] = {2, 0};
    uint8_t k_cache[12], v_cache[12];
    memset(k_cache, XX, sizeof(k_cache));
    memset(v_cache, XX, sizeof(v_cache));

    kvd_fp8_set_args_t a = {
        .k_src = k_src, .v_src = v_src, .src_dtype = KVD_DTYPE_F32,
        .k_src_token_stride = 16, .k_src_head_stride = 8,
        .v_src_token_stride = 16, .v_src_head_stride = 8,
        .k_cache = k_cache, .v_cache = v_cache, .cache_dtype = KVD_DTYPE_E4M3,
        .page_size = 1, .k_page_stride = 4, .k_slot_stride = 4, .k_head_stride = 2,
        .v_page_stride = 4, .v_slot_stride = 4, .v_head_stride = 2,
        .num_slots = 3, .num_heads = 2, .head_dim = 2,
        .loc = loc, .loc_dtype = KVD_DTYPE_I32, .num_tokens = 2,
        .scale_mode = KVD_SCALE_NONE, .k_scale = 123.0f, .v_scale = 123.0f, /* ignored */
    };
    OK(kvd_cpu_fp8_set(&a, NULL));

    const uint8_t k_want[] = {0x28, 0x48, 0x3c, 0xb8, XX, XX, XX, XX, 0x38, 0x30, 0xc0, 0x40};
    const uint8_t v_want[] = {0xb0, 0xc8, 0x7e, 0x80, XX, XX, XX, XX, 0x44, 0x34, 0x7e, 0x00};
    EXPECT("k_cache", k_cache, k_want);
    EXPECT("v_cache", v_cache, v_want);
}
END_TEST

/* Paged, page_size 4 with 2 bytes of padding after each page, f16 source,
 * per-tensor host scale 2 (x * 0.5), K only, one slot out of range. */
START_TEST(fp8_paged4_host_scale_f16)
{
    const uint16_t k_src[] = {0x4000, 0xc400,  /* token 0:  2, -4 */
                              0x3c00, 0x4800,  /* token 1:  1,  8 */
                              0x3800, 0xbc00}; /* token 2: .5, -1 */
    const int64_t loc[] = {5, 2, 8};
    uint8_t k_cache[20];
    unsigned long long oob = 0;
    memset(k_cache, XX, sizeof(k_cache));

    kvd_fp8_set_args_t a = {
        .k_src = k_src, .src_dtype = KVD_DTYPE_F16,
        .k_src_token_stride = 4, .k_src_head_stride = 4,
        .k_cache = k_cache, .cache_dtype = KVD_DTYPE_E4M3,
        .page_size = 4, .k_page_stride = 10, .k_slot_stride = 2, .k_head_stride = 2,
        .num_slots = 8, .num_heads = 1, .head_dim = 2,
        .loc = loc, .loc_dtype = KVD_DTYPE_I64, .num_tokens = 3,
        .scale_mode = KVD_SCALE_HOST, .k_scale = 2.0f, .oob_count = &oob,
    };
    OK(kvd_cpu_fp8_set(&a, NULL));

    /* slot 2: page 0, offset 4; slot 5: page 1, offset 10 + 2 */
    const uint8_t want[] = {XX, XX, XX, XX, 0x30, 0x48, XX, XX, XX, XX,
                            XX, XX, 0x38, 0xc0, XX, XX, XX, XX, XX, XX};
    EXPECT("k_cache", k_cache, want);
    ck_assert_uint_eq(oob, 1);
}
END_TEST

/* Paged, page_size 2, HND layout ([page][head][slot][dim]), bf16 source,
 * device scales (host memory for the CPU), e5m2, MHA. */
START_TEST(fp8_paged2_hnd_device_scale_bf16_e5m2)
{
    const uint16_t k_src[] = {0x4080, 0xc100, 0x3f80, 0x4180,  /* t0: 4 -8 | 1 16 */
                              0x4000, 0x3f00, 0xbf80, 0x4140}; /* t1: 2 .5 | -1 12 */
    const uint16_t v_src[] = {0x3f00, 0x3f80, 0xbe80, 0x4000,  /* t0: .5 1 | -.25 2 */
                              0x4040, 0xbf80, 0x3e00, 0x3f40}; /* t1: 3 -1 | .125 .75 */
    const float k_scale = 4.0f, v_scale = 0.5f;                /* x * 0.25, x * 2 */
    const int32_t loc[] = {3, 0};
    uint8_t k_cache[16], v_cache[16];
    memset(k_cache, XX, sizeof(k_cache));
    memset(v_cache, XX, sizeof(v_cache));

    kvd_fp8_set_args_t a = {
        .k_src = k_src, .v_src = v_src, .src_dtype = KVD_DTYPE_BF16,
        .k_src_token_stride = 8, .k_src_head_stride = 4,
        .v_src_token_stride = 8, .v_src_head_stride = 4,
        .k_cache = k_cache, .v_cache = v_cache, .cache_dtype = KVD_DTYPE_E5M2,
        .page_size = 2, .k_page_stride = 8, .k_slot_stride = 2, .k_head_stride = 4,
        .v_page_stride = 8, .v_slot_stride = 2, .v_head_stride = 4,
        .num_slots = 4, .num_heads = 2, .head_dim = 2,
        .loc = loc, .loc_dtype = KVD_DTYPE_I32, .num_tokens = 2,
        .scale_mode = KVD_SCALE_DEVICE, .k_scale_ptr = &k_scale, .v_scale_ptr = &v_scale,
    };
    OK(kvd_cpu_fp8_set(&a, NULL));

    /* slot 0 (token 1): heads at 0 and 4; slot 3 (token 0): heads at 10, 14 */
    const uint8_t k_want[] = {0x38, 0x30, XX, XX, 0xb4, 0x42, XX, XX,
                              XX,   XX,   0x3c, 0xc0, XX, XX, 0x34, 0x44};
    const uint8_t v_want[] = {0x46, 0xc0, XX, XX, 0x34, 0x3e, XX, XX,
                              XX,   XX,   0x3c, 0x40, XX, XX, 0xb8, 0x44};
    EXPECT("k_cache", k_cache, k_want);
    EXPECT("v_cache", v_cache, v_want);
}
END_TEST

/* Per-head scales; strided source heads (a gap float after each head) and
 * a padded cache (1 byte after each head, 1 after each slot); padding loc. */
START_TEST(fp8_per_head_strided)
{
    const float k_src[] = {2.0f, -1.0f, 99.0f, 0.25f, 0.5f, 99.0f,   /* token 0 */
                           7.0f, 7.0f, 7.0f, 7.0f, 7.0f, 7.0f};      /* token 1 */
    const float v_src[] = {3.0f, -0.75f, 99.0f, 8.0f, 32.0f, 99.0f,
                           7.0f, 7.0f, 7.0f, 7.0f, 7.0f, 7.0f};
    const float k_scales[] = {2.0f, 0.25f}; /* x * 0.5, x * 4 */
    const float v_scales[] = {1.0f, 8.0f};  /* x * 1, x * 0.125 */
    const int32_t loc[] = {1, -1};
    uint8_t k_cache[14], v_cache[14];
    unsigned long long oob = 0;
    memset(k_cache, XX, sizeof(k_cache));
    memset(v_cache, XX, sizeof(v_cache));

    kvd_fp8_set_args_t a = {
        .k_src = k_src, .v_src = v_src, .src_dtype = KVD_DTYPE_F32,
        .k_src_token_stride = 24, .k_src_head_stride = 12,
        .v_src_token_stride = 24, .v_src_head_stride = 12,
        .k_cache = k_cache, .v_cache = v_cache, .cache_dtype = KVD_DTYPE_E4M3,
        .page_size = 1, .k_page_stride = 7, .k_slot_stride = 7, .k_head_stride = 3,
        .v_page_stride = 7, .v_slot_stride = 7, .v_head_stride = 3,
        .num_slots = 2, .num_heads = 2, .head_dim = 2,
        .loc = loc, .loc_dtype = KVD_DTYPE_I32, .num_tokens = 2,
        .scale_mode = KVD_SCALE_PER_HEAD, .k_scale_ptr = k_scales, .v_scale_ptr = v_scales,
        .oob_count = &oob,
    };
    OK(kvd_cpu_fp8_set(&a, NULL));

    const uint8_t k_want[] = {XX, XX, XX, XX, XX, XX, XX, 0x38, 0xb0, XX, 0x38, 0x40, XX, XX};
    const uint8_t v_want[] = {XX, XX, XX, XX, XX, XX, XX, 0x44, 0xb4, XX, 0x38, 0x48, XX, XX};
    EXPECT("k_cache", k_cache, k_want);
    EXPECT("v_cache", v_cache, v_want);
    ck_assert_uint_eq(oob, 0);
}
END_TEST

/* x * (1 / scale), not x / scale: 0.1708984375 / 7 is exactly the e4m3 tie
 * 0.0244140625 (between 0x0c = 1.5 * 2^-6 and 0x0d = 1.625 * 2^-6), which
 * rounds to even 0x0c; but float(1/7) = 0x1.24924ap-3 is above 1/7, so
 * the float product is one ulp above the tie and rounds up to 0x0d. */
START_TEST(fp8_reciprocal_then_multiply)
{
    const float k_src[] = {0.1708984375f, -0.1708984375f};
    const int32_t loc[] = {0};
    uint8_t k_cache[3];
    memset(k_cache, XX, sizeof(k_cache));

    kvd_fp8_set_args_t a = {
        .k_src = k_src, .src_dtype = KVD_DTYPE_F32,
        .k_src_token_stride = 8, .k_src_head_stride = 4,
        .k_cache = k_cache, .cache_dtype = KVD_DTYPE_E4M3,
        .page_size = 1, .k_page_stride = 3, .k_slot_stride = 3, .k_head_stride = 1,
        .num_slots = 1, .num_heads = 2, .head_dim = 1,
        .loc = loc, .loc_dtype = KVD_DTYPE_I32, .num_tokens = 1,
        .scale_mode = KVD_SCALE_HOST, .k_scale = 7.0f,
    };
    OK(kvd_cpu_fp8_set(&a, NULL));

    const uint8_t want[] = {0x0d, 0x8d, XX};
    EXPECT("k_cache", k_cache, want);
}
END_TEST

/* e5m2 specials, K only: NaN, -inf, beyond max, far below the subnormals. */
START_TEST(fp8_specials_e5m2)
{
    const float k_src[] = {NAN, -INFINITY, 1e5f, 1e-9f, -1e-9f};
    const int64_t loc[] = {0};
    uint8_t k_cache[6];
    memset(k_cache, XX, sizeof(k_cache));

    kvd_fp8_set_args_t a = {
        .k_src = k_src, .src_dtype = KVD_DTYPE_F32,
        .k_src_token_stride = 20, .k_src_head_stride = 20,
        .k_cache = k_cache, .cache_dtype = KVD_DTYPE_E5M2,
        .page_size = 1, .k_page_stride = 6, .k_slot_stride = 6, .k_head_stride = 5,
        .num_slots = 1, .num_heads = 1, .head_dim = 5,
        .loc = loc, .loc_dtype = KVD_DTYPE_I64, .num_tokens = 1,
        .scale_mode = KVD_SCALE_NONE,
    };
    OK(kvd_cpu_fp8_set(&a, NULL));

    const uint8_t want[] = {0x7f, 0xfb, 0x7b, 0x00, 0x80, XX};
    EXPECT("k_cache", k_cache, want);
}
END_TEST

START_TEST(fp8_zero_tokens)
{
    kvd_fp8_set_args_t a = {
        .src_dtype = KVD_DTYPE_F32, .cache_dtype = KVD_DTYPE_E4M3, .page_size = 16,
        .num_heads = 8, .head_dim = 128, .loc_dtype = KVD_DTYPE_I32,
        .scale_mode = KVD_SCALE_PER_HEAD,
    };
    OK(kvd_cpu_fp8_set(&a, NULL));
}
END_TEST

/* ------------------------------------------------------------------------ */
/* page-table gather                                                         */

static const int32_t table32[3][4] = {
    {10, 11, 12, 13},
    {20, 21, 22, 23},
    {30, 31, 32, 33},
};

/* page_size 16; short, empty and padded requests; out rows padded by two
 * entries that must stay poisoned. */
START_TEST(gather_i32_page16)
{
    const int32_t req[] = {2, 0, 1, -1, 5, 1};
    const int64_t seq_lens[] = {17, 1, 0, 64, 33, -5};
    int32_t out[6][5];
    unsigned long long oob = 0;
    memset(out, XX, sizeof(out));

    kvd_gather_args_t a = {
        .req_to_page = table32, .table_dtype = KVD_DTYPE_I32,
        .table_rows = 3, .table_cols = 4, .table_stride = 16,
        .req_pool_indices = req, .req_dtype = KVD_DTYPE_I32,
        .seq_lens = seq_lens, .seq_lens_dtype = KVD_DTYPE_I64,
        .out = out, .out_stride = 20, .bs = 6, .max_num_pages = 3,
        .page_size = 16, .dummy_slot = 99, .oob_count = &oob,
    };
    OK(kvd_cpu_page_table_gather(&a, NULL));

    const int32_t P = (int32_t)0xABABABAB;
    const int32_t want[6][5] = {
        {30, 31, 99, P, P}, /* 17 tokens: 2 pages */
        {10, 99, 99, P, P}, /* 1 token: 1 page */
        {99, 99, 99, P, P}, /* empty */
        {99, 99, 99, P, P}, /* padding request */
        {99, 99, 99, P, P}, /* request 5 of 3: out of range, counted */
        {99, 99, 99, P, P}, /* negative length: no pages */
    };
    EXPECT("out", out, want);
    ck_assert_uint_eq(oob, 1);
}
END_TEST

/* page_size 1, a table narrower than max_num_pages (columns past
 * table_cols are dummy), a table stride wider than its columns. */
START_TEST(gather_i32_page1_narrow_table)
{
    const int64_t req[] = {1, 2};
    const int32_t seq_lens[] = {3, 1};
    int32_t out[2][4];
    memset(out, XX, sizeof(out));

    kvd_gather_args_t a = {
        .req_to_page = table32, .table_dtype = KVD_DTYPE_I32,
        .table_rows = 3, .table_cols = 2, .table_stride = 16,
        .req_pool_indices = req, .req_dtype = KVD_DTYPE_I64,
        .seq_lens = seq_lens, .seq_lens_dtype = KVD_DTYPE_I32,
        .out = out, .out_stride = 16, .bs = 2, .max_num_pages = 4,
        .page_size = 1, .dummy_slot = -1,
    };
    OK(kvd_cpu_page_table_gather(&a, NULL));

    const int32_t want[2][4] = {{20, 21, -1, -1}, {30, -1, -1, -1}};
    EXPECT("out", out, want);
}
END_TEST

/* int64 table with values past 2^32, a dummy past int32, and a sequence
 * length near INT64_MAX (its page count must not overflow). */
START_TEST(gather_i64)
{
    const int64_t table[2][3] = {
        {0x100000001LL, 0x100000002LL, 0x100000003LL},
        {0x200000001LL, 0x200000002LL, 0x200000003LL},
    };
    const int32_t req[] = {1, 0, 7};
    const int64_t seq_lens[] = {INT64_MAX, 8, 8};
    int64_t out[3][3];
    unsigned long long oob = 0;
    memset(out, XX, sizeof(out));

    kvd_gather_args_t a = {
        .req_to_page = table, .table_dtype = KVD_DTYPE_I64,
        .table_rows = 2, .table_cols = 3, .table_stride = 24,
        .req_pool_indices = req, .req_dtype = KVD_DTYPE_I32,
        .seq_lens = seq_lens, .seq_lens_dtype = KVD_DTYPE_I64,
        .out = out, .out_stride = 24, .bs = 3, .max_num_pages = 3,
        .page_size = 4, .dummy_slot = 0x7000000000LL, .oob_count = &oob,
    };
    OK(kvd_cpu_page_table_gather(&a, NULL));

    const int64_t D = 0x7000000000LL;
    const int64_t want[3][3] = {
        {0x200000001LL, 0x200000002LL, 0x200000003LL},
        {0x100000001LL, 0x100000002LL, D}, /* 8 tokens / 4: 2 pages */
        {D, D, D},
    };
    EXPECT("out", out, want);
    ck_assert_uint_eq(oob, 1);
}
END_TEST

START_TEST(gather_empty)
{
    unsigned long long oob = 0;
    kvd_gather_args_t a = {
        .table_dtype = KVD_DTYPE_I32, .req_dtype = KVD_DTYPE_I32,
        .seq_lens_dtype = KVD_DTYPE_I32, .bs = 0, .max_num_pages = 8, .page_size = 16,
        .oob_count = &oob,
    };
    OK(kvd_cpu_page_table_gather(&a, NULL));
    a.bs = 4;
    a.max_num_pages = 0; /* no columns: nothing read or written */
    OK(kvd_cpu_page_table_gather(&a, NULL));
    ck_assert_uint_eq(oob, 0);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* transfer                                                                  */

/* Slot s of the 4-slot source holds 0xS0 0xS1 0xS2 (K) and 0x80 + that (V),
 * then a pad byte 0xEE that must never be copied (row_bytes 3, stride 4). */
static const uint8_t xfer_src_k[] = {0x00, 0x01, 0x02, 0xEE, 0x10, 0x11, 0x12, 0xEE,
                                     0x20, 0x21, 0x22, 0xEE, 0x30, 0x31, 0x32, 0xEE};
static const uint8_t xfer_src_v[] = {0x80, 0x81, 0x82, 0xEE, 0x90, 0x91, 0x92, 0xEE,
                                     0xA0, 0xA1, 0xA2, 0xEE, 0xB0, 0xB1, 0xB2, 0xEE};

/* Pairs: 0->2 and 3->0 copy; (-1,1), (2,-1) and (-2,9) are padding, not
 * counted; (1,7) and (5,1) are out of range, counted. */
START_TEST(transfer_one_layer_mha)
{
    const int32_t src_idx[] = {0, 3, -1, 2, 1, 5, -2};
    const int32_t dst_idx[] = {2, 0, 1, -1, 7, 1, 9};
    uint8_t dst_k[9], dst_v[9];
    unsigned long long oob = 0;
    memset(dst_k, XX, sizeof(dst_k));
    memset(dst_v, XX, sizeof(dst_v));

    kvd_transfer_args_t a = {
        .src = {.k = (void *)xfer_src_k, .v = (void *)xfer_src_v, .slot_stride = 4,
                .num_slots = 4},
        .dst = {.k = dst_k, .v = dst_v, .slot_stride = 3, .num_slots = 3},
        .num_layers = 1, .src_idx = src_idx, .dst_idx = dst_idx,
        .idx_dtype = KVD_DTYPE_I32, .count = 7, .row_bytes = 3, .oob_count = &oob,
    };
    OK(kvd_cpu_kv_transfer(&a, NULL));

    const uint8_t k_want[] = {0x30, 0x31, 0x32, XX, XX, XX, 0x00, 0x01, 0x02};
    const uint8_t v_want[] = {0xB0, 0xB1, 0xB2, XX, XX, XX, 0x80, 0x81, 0x82};
    EXPECT("dst_k", dst_k, k_want);
    EXPECT("dst_v", dst_v, v_want);
    ck_assert_uint_eq(oob, 2);
}
END_TEST

START_TEST(transfer_one_layer_mla_i64)
{
    const int64_t src_idx[] = {0, 3, -1, 2, 1, 5};
    const int64_t dst_idx[] = {2, 0, 1, -1, 7, 1};
    uint8_t dst_k[9];
    unsigned long long oob = 1;
    memset(dst_k, XX, sizeof(dst_k));

    kvd_transfer_args_t a = {
        .src = {.k = (void *)xfer_src_k, .slot_stride = 4, .num_slots = 4},
        .dst = {.k = dst_k, .slot_stride = 3, .num_slots = 3},
        .num_layers = 1, .src_idx = src_idx, .dst_idx = dst_idx,
        .idx_dtype = KVD_DTYPE_I64, .count = 6, .row_bytes = 3, .oob_count = &oob,
    };
    OK(kvd_cpu_kv_transfer(&a, NULL));

    const uint8_t want[] = {0x30, 0x31, 0x32, XX, XX, XX, 0x00, 0x01, 0x02};
    EXPECT("dst_k", dst_k, want);
    ck_assert_uint_eq(oob, 3);
}
END_TEST

/* Three layers addressed by layer_stride; the destination's layers are
 * padded by one byte.  An out-of-range pair counts once, not per layer. */
START_TEST(transfer_layers_by_stride)
{
    const uint8_t src_k[] = {0x00, 0x01, 0x02, 0x03,  /* layer 0: slot 0, slot 1 */
                             0x10, 0x11, 0x12, 0x13,  /* layer 1 */
                             0x20, 0x21, 0x22, 0x23}; /* layer 2 */
    const uint8_t src_v[] = {0x80, 0x81, 0x82, 0x83, 0x90, 0x91, 0x92, 0x93,
                             0xA0, 0xA1, 0xA2, 0xA3};
    const int32_t src_idx[] = {1, 0, 0};
    const int32_t dst_idx[] = {0, 5, 2};
    uint8_t dst_k[21], dst_v[21];
    unsigned long long oob = 0;
    memset(dst_k, XX, sizeof(dst_k));
    memset(dst_v, XX, sizeof(dst_v));

    kvd_transfer_args_t a = {
        .src = {.k = (void *)src_k, .v = (void *)src_v, .layer_stride = 4, .slot_stride = 2,
                .num_slots = 2},
        .dst = {.k = dst_k, .v = dst_v, .layer_stride = 7, .slot_stride = 2, .num_slots = 3},
        .num_layers = 3, .src_idx = src_idx, .dst_idx = dst_idx,
        .idx_dtype = KVD_DTYPE_I32, .count = 3, .row_bytes = 2, .oob_count = &oob,
    };
    OK(kvd_cpu_kv_transfer(&a, NULL));

    const uint8_t k_want[] = {0x02, 0x03, XX, XX, 0x00, 0x01, XX,
                              0x12, 0x13, XX, XX, 0x10, 0x11, XX,
                              0x22, 0x23, XX, XX, 0x20, 0x21, XX};
    const uint8_t v_want[] = {0x82, 0x83, XX, XX, 0x80, 0x81, XX,
                              0x92, 0x93, XX, XX, 0x90, 0x91, XX,
                              0xA2, 0xA3, XX, XX, 0xA0, 0xA1, XX};
    EXPECT("dst_k", dst_k, k_want);
    EXPECT("dst_v", dst_v, v_want);
    ck_assert_uint_eq(oob, 1);
}
END_TEST

/* MHA: source layers from tables of addresses, destination by stride. */
START_TEST(transfer_tables_to_stride_mha)
{
    static const uint8_t k0[] = {0x01, 0x02, 0x03, 0x04}, k1[] = {0x11, 0x12, 0x13, 0x14};
    static const uint8_t v0[] = {0x21, 0x22, 0x23, 0x24}, v1[] = {0x31, 0x32, 0x33, 0x34};
    const uint64_t k_layers[] = {(uintptr_t)k0, (uintptr_t)k1};
    const uint64_t v_layers[] = {(uintptr_t)v0, (uintptr_t)v1};
    const int32_t src_idx[] = {1, 0};
    const int32_t dst_idx[] = {0, -1};
    uint8_t dst_k[8], dst_v[8];
    memset(dst_k, XX, sizeof(dst_k));
    memset(dst_v, XX, sizeof(dst_v));

    kvd_transfer_args_t a = {
        .src = {.k_layers = k_layers, .v_layers = v_layers, .slot_stride = 2, .num_slots = 2},
        .dst = {.k = dst_k, .v = dst_v, .layer_stride = 4, .slot_stride = 2, .num_slots = 2},
        .num_layers = 2, .src_idx = src_idx, .dst_idx = dst_idx,
        .idx_dtype = KVD_DTYPE_I32, .count = 2, .row_bytes = 2,
    };
    OK(kvd_cpu_kv_transfer(&a, NULL));

    const uint8_t k_want[] = {0x03, 0x04, XX, XX, 0x13, 0x14, XX, XX};
    const uint8_t v_want[] = {0x23, 0x24, XX, XX, 0x33, 0x34, XX, XX};
    EXPECT("dst_k", dst_k, k_want);
    EXPECT("dst_v", dst_v, v_want);
}
END_TEST

/* MLA: source by stride, destination from tables; the destination's k base
 * pointer is set but must be ignored in favour of its tables. */
START_TEST(transfer_stride_to_tables_mla)
{
    const uint8_t src_k[] = {0x41, 0x42, 0x43, 0x44, 0x51, 0x52, 0x53, 0x54};
    uint8_t d0[4], d1[4], decoy[8];
    const uint64_t k_layers[] = {(uintptr_t)d0, (uintptr_t)d1};
    const int64_t src_idx[] = {0, 1};
    const int64_t dst_idx[] = {1, 0};
    memset(d0, XX, sizeof(d0));
    memset(d1, XX, sizeof(d1));
    memset(decoy, XX, sizeof(decoy));

    kvd_transfer_args_t a = {
        .src = {.k = (void *)src_k, .layer_stride = 4, .slot_stride = 2, .num_slots = 2},
        .dst = {.k = decoy, .k_layers = k_layers, .layer_stride = 4, .slot_stride = 2,
                .num_slots = 2},
        .num_layers = 2, .src_idx = src_idx, .dst_idx = dst_idx,
        .idx_dtype = KVD_DTYPE_I64, .count = 2, .row_bytes = 2,
    };
    OK(kvd_cpu_kv_transfer(&a, NULL));

    const uint8_t d0_want[] = {0x43, 0x44, 0x41, 0x42};
    const uint8_t d1_want[] = {0x53, 0x54, 0x51, 0x52};
    const uint8_t decoy_want[] = {XX, XX, XX, XX, XX, XX, XX, XX};
    EXPECT("layer 0", d0, d0_want);
    EXPECT("layer 1", d1, d1_want);
    EXPECT("decoy", decoy, decoy_want);
}
END_TEST

/* Within one pool, a slot onto itself and onto another slot. */
START_TEST(transfer_same_pool)
{
    uint8_t pool[] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06};
    const int32_t src_idx[] = {0, 1};
    const int32_t dst_idx[] = {0, 2};

    kvd_transfer_args_t a = {
        .src = {.k = pool, .slot_stride = 2, .num_slots = 3},
        .dst = {.k = pool, .slot_stride = 2, .num_slots = 3},
        .num_layers = 1, .src_idx = src_idx, .dst_idx = dst_idx,
        .idx_dtype = KVD_DTYPE_I32, .count = 2, .row_bytes = 2,
    };
    OK(kvd_cpu_kv_transfer(&a, NULL));

    const uint8_t want[] = {0x01, 0x02, 0x03, 0x04, 0x03, 0x04};
    EXPECT("pool", pool, want);
}
END_TEST

START_TEST(transfer_zero_pairs)
{
    unsigned long long oob = 0;
    kvd_transfer_args_t a = {
        .src = {.num_slots = 4}, .dst = {.num_slots = 4},
        .num_layers = 32, .idx_dtype = KVD_DTYPE_I64, .row_bytes = 1024, .oob_count = &oob,
    };
    OK(kvd_cpu_kv_transfer(&a, NULL));
    ck_assert_uint_eq(oob, 0);
}
END_TEST

static Suite *ref_suite(void)
{
    Suite *s = suite_create("kernels_ref");
    TCase *tc;

    tc = tcase_create("store");
    tcase_add_test(tc, store_mha_i32);
    tcase_add_test(tc, store_mla_i64_oob);
    tcase_add_test(tc, store_fused_qkv);
    tcase_add_test(tc, store_wide_rows);
    tcase_add_test(tc, store_zero_tokens);
    suite_add_tcase(s, tc);

    tc = tcase_create("fp8_set");
    tcase_add_test(tc, fp8_flat_none_e4m3);
    tcase_add_test(tc, fp8_paged4_host_scale_f16);
    tcase_add_test(tc, fp8_paged2_hnd_device_scale_bf16_e5m2);
    tcase_add_test(tc, fp8_per_head_strided);
    tcase_add_test(tc, fp8_reciprocal_then_multiply);
    tcase_add_test(tc, fp8_specials_e5m2);
    tcase_add_test(tc, fp8_zero_tokens);
    suite_add_tcase(s, tc);

    tc = tcase_create("gather");
    tcase_add_test(tc, gather_i32_page16);
    tcase_add_test(tc, gather_i32_page1_narrow_table);
    tcase_add_test(tc, gather_i64);
    tcase_add_test(tc, gather_empty);
    suite_add_tcase(s, tc);

    tc = tcase_create("transfer");
    tcase_add_test(tc, transfer_one_layer_mha);
    tcase_add_test(tc, transfer_one_layer_mla_i64);
    tcase_add_test(tc, transfer_layers_by_stride);
    tcase_add_test(tc, transfer_tables_to_stride_mha);
    tcase_add_test(tc, transfer_stride_to_tables_mla);
    tcase_add_test(tc, transfer_same_pool);
    tcase_add_test(tc, transfer_zero_pairs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ref_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
