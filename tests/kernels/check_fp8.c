/*
 * FP8, FP16 and BF16 conversions at their edges.  Every expected byte is
 * worked out by hand from the formats:
 *   e4m3fn: bias 7, 3 mantissa bits, max 448 (0x7e), min normal 2^-6 (0x08),
 *           subnormal step 2^-9, NaN 0x7f/0xff, no infinities;
 *   e5m2:   bias 15, 2 mantissa bits, max 57344 (0x7b), min normal 2^-14
 *           (0x04), subnormal step 2^-16, inf 0x7c, NaN 0x7d-0x7f.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvdock/kernels.h"

#define E4 KVD_DTYPE_E4M3
#define E5 KVD_DTYPE_E5M2

static float from_bits(uint32_t u)
{
    float f;

    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof(u));
    return u;
}

typedef struct enc_case {
    float x;
    uint8_t want;
} enc_case_t;

static void check_cases(const enc_case_t *c, size_t n, int dtype)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t got = kvd_fp8_from_float(c[i].x, dtype);
        ck_assert_msg(got == c[i].want, "%s(%a = %.9g) = 0x%02x, want 0x%02x",
                      kvd_dtype_name(dtype), (double)c[i].x, (double)c[i].x, got, c[i].want);
    }
}

#define CHECK_CASES(arr, dtype) check_cases((arr), sizeof(arr) / sizeof((arr)[0]), (dtype))

START_TEST(e4m3_edges)
{
    const float step = 0x1p-9f; /* smallest subnormal */
    const enc_case_t c[] = {
        {0.0f, 0x00},
        {-0.0f, 0x80},
        {step, 0x01},
        {-step, 0x81},
        {step / 2, 0x00},                      /* tie with 0: to even */
        {-step / 2, 0x80},                     /* signed zero */
        {nextafterf(step / 2, 1.0f), 0x01},    /* just above half */
        {nextafterf(step / 2, 0.0f), 0x00},    /* just below half */
        {1.5f * step, 0x02},                   /* tie 1|2 -> 2 */
        {2.5f * step, 0x02},                   /* tie 2|3 -> 2 */
        {3.5f * step, 0x04},                   /* tie 3|4 -> 4 */
        {7.0f * step, 0x07},                   /* largest subnormal */
        {7.5f * step, 0x08},                   /* tie with min normal -> 0x08 */
        {0x1p-6f, 0x08},                       /* min normal */
        {1.0f, 0x38},
        {0.5f, 0x30},
        {-2.0f, 0xc0},
        {1.5f, 0x3c},
        {1.0625f, 0x38},                       /* tie 1.0|1.125 -> even 0x38 */
        {1.1875f, 0x3a},                       /* tie 1.125|1.25 -> even 0x3a */
        {nextafterf(1.0625f, 2.0f), 0x39},
        {240.0f, 0x77},                        /* 1.875 * 2^7 */
        {416.0f, 0x7d},
        {432.0f, 0x7e},                        /* tie 416|448 -> even 0x7e */
        {448.0f, 0x7e},                        /* max */
        {-448.0f, 0xfe},
        {449.0f, 0x7e},
        {464.0f, 0x7e},                        /* tie 448|480: even, and max */
        {465.0f, 0x7e},                        /* rounds to 480: saturates */
        {480.0f, 0x7e},
        {1e30f, 0x7e},
        {-1e30f, 0xfe},
        {FLT_MAX, 0x7e},
        {INFINITY, 0x7e},
        {-INFINITY, 0xfe},
        {NAN, 0x7f},
        {-NAN, 0x7f},
        {from_bits(0x7f800001u), 0x7f},        /* signalling NaN */
        {from_bits(0xffc00001u), 0x7f},
        {FLT_TRUE_MIN, 0x00},                  /* float subnormals */
        {-FLT_TRUE_MIN, 0x80},
        {from_bits(0x007fffffu), 0x00},
        {FLT_MIN, 0x00},
    };
    CHECK_CASES(c, E4);
}
END_TEST

START_TEST(e5m2_edges)
{
    const float step = 0x1p-16f;
    const enc_case_t c[] = {
        {0.0f, 0x00},
        {-0.0f, 0x80},
        {step, 0x01},
        {-step, 0x81},
        {step / 2, 0x00},
        {-step / 2, 0x80},
        {nextafterf(step / 2, 1.0f), 0x01},
        {nextafterf(step / 2, 0.0f), 0x00},
        {1.5f * step, 0x02},
        {2.5f * step, 0x02},
        {3.0f * step, 0x03},                   /* largest subnormal */
        {3.5f * step, 0x04},                   /* tie with min normal */
        {0x1p-14f, 0x04},                      /* min normal */
        {1.0f, 0x3c},
        {0.5f, 0x38},
        {-2.0f, 0xc0},
        {1.5f, 0x3e},
        {1.125f, 0x3c},                        /* tie 1.0|1.25 -> even 0x3c */
        {1.375f, 0x3e},                        /* tie 1.25|1.5 -> even 0x3e */
        {49152.0f, 0x7a},
        {53248.0f, 0x7a},                      /* tie 49152|57344 -> even 0x7a */
        {57344.0f, 0x7b},                      /* max */
        {-57344.0f, 0xfb},
        {60000.0f, 0x7b},
        {61440.0f, 0x7b},                      /* tie with 65536: saturates */
        {65536.0f, 0x7b},
        {1e30f, 0x7b},
        {FLT_MAX, 0x7b},
        {INFINITY, 0x7b},
        {-INFINITY, 0xfb},
        {NAN, 0x7f},
        {-NAN, 0x7f},
        {FLT_TRUE_MIN, 0x00},
        {-FLT_TRUE_MIN, 0x80},
        {FLT_MIN, 0x00},
    };
    CHECK_CASES(c, E5);
}
END_TEST

START_TEST(unknown_dtype)
{
    ck_assert_uint_eq(kvd_fp8_from_float(1.0f, KVD_DTYPE_F32), 0x7f);
    ck_assert_uint_eq(kvd_fp8_from_float(1.0f, 99), 0x7f);
    ck_assert(isnan(kvd_fp8_to_float(0x38, KVD_DTYPE_BF16)));
    ck_assert(isnan(kvd_fp8_to_float(0x38, -1)));
}
END_TEST

START_TEST(decode_edges)
{
    ck_assert(kvd_fp8_to_float(0x38, E4) == 1.0f);
    ck_assert(kvd_fp8_to_float(0xc0, E4) == -2.0f);
    ck_assert(kvd_fp8_to_float(0x7e, E4) == 448.0f);
    ck_assert(kvd_fp8_to_float(0xfe, E4) == -448.0f);
    ck_assert(kvd_fp8_to_float(0x01, E4) == 0x1p-9f);
    ck_assert(kvd_fp8_to_float(0x07, E4) == 7 * 0x1p-9f);
    ck_assert(kvd_fp8_to_float(0x08, E4) == 0x1p-6f);
    ck_assert(isnan(kvd_fp8_to_float(0x7f, E4)));
    ck_assert(isnan(kvd_fp8_to_float(0xff, E4)));
    ck_assert(kvd_fp8_to_float(0x78, E4) == 256.0f); /* e4m3fn: exponent 15 is finite */
    float nz = kvd_fp8_to_float(0x80, E4);
    ck_assert(nz == 0.0f && signbit(nz));

    ck_assert(kvd_fp8_to_float(0x3c, E5) == 1.0f);
    ck_assert(kvd_fp8_to_float(0x7b, E5) == 57344.0f);
    ck_assert(kvd_fp8_to_float(0x01, E5) == 0x1p-16f);
    ck_assert(kvd_fp8_to_float(0x04, E5) == 0x1p-14f);
    ck_assert(kvd_fp8_to_float(0x7c, E5) == INFINITY);
    ck_assert(kvd_fp8_to_float(0xfc, E5) == -INFINITY);
    ck_assert(isnan(kvd_fp8_to_float(0x7d, E5)));
    ck_assert(isnan(kvd_fp8_to_float(0x7f, E5)));
    ck_assert(isnan(kvd_fp8_to_float(0xfe, E5)));
    nz = kvd_fp8_to_float(0x80, E5);
    ck_assert(nz == 0.0f && signbit(nz));
}
END_TEST

static int finite_code(int b, int dtype)
{
    return dtype == E4 ? (b & 0x7f) != 0x7f : (b & 0x7c) != 0x7c;
}

/* Every finite code decodes to a float that encodes back to itself. */
START_TEST(round_trip)
{
    const int dtypes[] = {E4, E5};
    for (int k = 0; k < 2; k++) {
        int dt = dtypes[k], finite = 0;
        for (int b = 0; b < 256; b++) {
            if (!finite_code(b, dt))
                continue;
            finite++;
            float f = kvd_fp8_to_float((uint8_t)b, dt);
            uint8_t back = kvd_fp8_from_float(f, dt);
            ck_assert_msg(back == b, "%s: 0x%02x -> %g -> 0x%02x", kvd_dtype_name(dt), b,
                          (double)f, back);
        }
        ck_assert_int_eq(finite, dt == E4 ? 254 : 248);
    }
}
END_TEST

/* Over a sweep of positive floats the decoded result never decreases, is
 * the nearest of its neighbouring codes, and negatives mirror positives.
 * Plain ifs in the loop: Check's asserts are too slow for millions. */
START_TEST(monotonic_nearest)
{
    const int dtypes[] = {E4, E5};
    for (int k = 0; k < 2; k++) {
        int dt = dtypes[k];
        const char *name = kvd_dtype_name(dt);
        float maxv = dt == E4 ? 448.0f : 57344.0f;
        float prev = 0.0f;
        /* 0x30000000 is 2^-31, below every subnormal; 0x48000000 is 131072. */
        for (uint32_t u = 0x30000000u; u < 0x48000000u; u += 251) {
            float x = from_bits(u);
            uint8_t c = kvd_fp8_from_float(x, dt);
            float y = kvd_fp8_to_float(c, dt);
            if (y < prev)
                ck_abort_msg("%s not monotonic at %a", name, (double)x);
            prev = y;
            if (kvd_fp8_from_float(-x, dt) != (c | 0x80))
                ck_abort_msg("%s: -%a is not the mirror of 0x%02x", name, (double)x, c);
            if (x > maxv) {
                if (y != maxv)
                    ck_abort_msg("%s: %a did not saturate", name, (double)x);
                continue;
            }
            double err = fabs((double)x - y);
            if (c > 0 && err > (double)x - kvd_fp8_to_float(c - 1, dt))
                ck_abort_msg("%s: %a is nearer 0x%02x", name, (double)x, c - 1);
            if (finite_code(c + 1, dt) && c + 1 < 0x80 &&
                err > kvd_fp8_to_float(c + 1, dt) - (double)x)
                ck_abort_msg("%s: %a is nearer 0x%02x", name, (double)x, c + 1);
        }
    }
}
END_TEST

START_TEST(bf16)
{
    ck_assert(kvd_bf16_to_float(0x3f80) == 1.0f);
    ck_assert(kvd_bf16_to_float(0xc000) == -2.0f);
    ck_assert(kvd_bf16_to_float(0x4049) == 3.140625f);
    ck_assert(kvd_bf16_to_float(0x3f40) == 0.75f);
    ck_assert(kvd_bf16_to_float(0x7f7f) == 0x1.fep127f); /* largest finite */
    ck_assert(kvd_bf16_to_float(0x0080) == 0x1p-126f);   /* smallest normal */
    ck_assert(kvd_bf16_to_float(0x0001) == 0x1p-133f);   /* subnormal */
    ck_assert(kvd_bf16_to_float(0x7f80) == INFINITY);
    ck_assert(kvd_bf16_to_float(0xff80) == -INFINITY);
    ck_assert(isnan(kvd_bf16_to_float(0x7fc0)));
    ck_assert(isnan(kvd_bf16_to_float(0xff81)));
    float nz = kvd_bf16_to_float(0x8000);
    ck_assert(nz == 0.0f && signbit(nz));
    ck_assert_uint_eq(to_bits(kvd_bf16_to_float(0x1234)), 0x12340000u);
}
END_TEST

START_TEST(f16)
{
    ck_assert(kvd_f16_to_float(0x3c00) == 1.0f);
    ck_assert(kvd_f16_to_float(0xc000) == -2.0f);
    ck_assert(kvd_f16_to_float(0x3555) == 0.333251953125f);
    ck_assert(kvd_f16_to_float(0x7bff) == 65504.0f);     /* largest finite */
    ck_assert(kvd_f16_to_float(0x0400) == 0x1p-14f);     /* smallest normal */
    ck_assert(kvd_f16_to_float(0x03ff) == 1023 * 0x1p-24f);
    ck_assert(kvd_f16_to_float(0x0001) == 0x1p-24f);     /* smallest subnormal */
    ck_assert(kvd_f16_to_float(0x8001) == -0x1p-24f);
    ck_assert(kvd_f16_to_float(0x0200) == 0x1p-15f);
    ck_assert(kvd_f16_to_float(0x7c00) == INFINITY);
    ck_assert(kvd_f16_to_float(0xfc00) == -INFINITY);
    ck_assert(isnan(kvd_f16_to_float(0x7e00)));
    ck_assert(isnan(kvd_f16_to_float(0xfc01)));
    float z = kvd_f16_to_float(0x0000), nz = kvd_f16_to_float(0x8000);
    ck_assert(z == 0.0f && !signbit(z));
    ck_assert(nz == 0.0f && signbit(nz));
}
END_TEST

static Suite *fp8_suite(void)
{
    Suite *s = suite_create("kernels_fp8");
    TCase *tc = tcase_create("conversions");

    tcase_add_test(tc, e4m3_edges);
    tcase_add_test(tc, e5m2_edges);
    tcase_add_test(tc, unknown_dtype);
    tcase_add_test(tc, decode_edges);
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, monotonic_nearest);
    tcase_add_test(tc, bf16);
    tcase_add_test(tc, f16);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(fp8_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
