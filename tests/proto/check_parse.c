/*
 * check_parse: the number and size parser that the daemon's options and
 * the CLI share (proto/src/parse.c): decimal only, whatever the leading
 * zeros; sizes with binary (K, KiB) and decimal (KB) units and fractions
 * that come to whole bytes; the limits of uint64_t and int64_t.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "parse.h"

START_TEST(test_numbers_are_decimal)
{
    uint64_t u = 0;
    int64_t i = 0;

    ck_assert_int_eq(kvd__parse_u64("010", &u), KVD_OK);
    ck_assert_uint_eq(u, 10);
    ck_assert_int_eq(kvd__parse_u64("08", &u), KVD_OK);
    ck_assert_uint_eq(u, 8);
    ck_assert_int_eq(kvd__parse_u64("0", &u), KVD_OK);
    ck_assert_uint_eq(u, 0);
    ck_assert_int_eq(kvd__parse_u64("18446744073709551615", &u), KVD_OK);
    ck_assert_uint_eq(u, UINT64_MAX);
    ck_assert_int_eq(kvd__parse_u64("18446744073709551616", &u), KVD_ERANGE);
    static const char *const bad[] = {"", "0x10", "1e3", " 1", "1 ", "+1", "-1", "1k", "1.0",
                                      "abc", "99999999999999999999x"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++)
        ck_assert_msg(kvd__parse_u64(bad[k], &u) == KVD_EINVAL, "'%s' accepted", bad[k]);

    ck_assert_int_eq(kvd__parse_i64("-010", &i), KVD_OK);
    ck_assert_int_eq(i, -10);
    ck_assert_int_eq(kvd__parse_i64("9223372036854775807", &i), KVD_OK);
    ck_assert_int_eq(i, INT64_MAX);
    ck_assert_int_eq(kvd__parse_i64("-9223372036854775808", &i), KVD_OK);
    ck_assert_int_eq(i, INT64_MIN);
    ck_assert_int_eq(kvd__parse_i64("9223372036854775808", &i), KVD_ERANGE);
    ck_assert_int_eq(kvd__parse_i64("-9223372036854775809", &i), KVD_ERANGE);
    ck_assert_int_eq(kvd__parse_i64("--1", &i), KVD_EINVAL);
    ck_assert_int_eq(kvd__parse_i64("-0x1", &i), KVD_EINVAL);
    ck_assert_int_eq(kvd__parse_u64(NULL, &u), KVD_ENULL);
}
END_TEST

START_TEST(test_sizes)
{
    static const struct {
        const char *s;
        uint64_t v;
    } good[] = {
        {"0", 0},
        {"512", 512},
        {"512B", 512},
        {"512 b", 512},
        {"010", 10},
        {"2K", 2048},
        {"2k", 2048},
        {"2KiB", 2048},
        {"2kib", 2048},
        {"2KB", 2000},
        {"2kb", 2000},
        {"16MiB", 16ull << 20},
        {"16M", 16ull << 20},
        {"16MB", 16000000},
        {"2G", 2ull << 30},
        {"2GiB", 2ull << 30},
        {"2 GiB", 2ull << 30},
        {"2GB", 2000000000},
        {"1.5G", 3ull << 29},
        {"1.5g", 3ull << 29},
        {"1.5GB", 1500000000},
        {"2.0 GiB", 2ull << 30},
        {"1.5K", 1536},
        {"0.5KiB", 512},
        {"1T", 1ull << 40},
        {"1TB", 1000000000000ull},
        {"1P", 1ull << 50},
    };
    static const char *const bad[] = {"",    "G",    "1.5",   "1.5B", "0.1K", "1.K", ".5G",
                                      "1 ",  " 1G",  "1  G",  "1GiBs", "0x10", "-1G", "+1G",
                                      "1e3", "1.2.3G", "1Gi", "15E"};
    uint64_t v;

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        ck_assert_msg(kvd__parse_size(good[i].s, &v) == KVD_OK, "'%s' refused", good[i].s);
        ck_assert_msg(v == good[i].v, "'%s' is %llu, not %llu", good[i].s,
                      (unsigned long long)v, (unsigned long long)good[i].v);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(kvd__parse_size(bad[i], &v) == KVD_EINVAL, "'%s' accepted", bad[i]);
    /* a fraction of a byte is refused as such; the other refusals are not */
    ck_assert(kvd__size_inexact("0.1G"));
    ck_assert(kvd__size_inexact("0.1K"));
    ck_assert(kvd__size_inexact("1.5"));
    ck_assert(!kvd__size_inexact("1.5G"));
    ck_assert(!kvd__size_inexact("lots"));
    ck_assert(!kvd__size_inexact(".5G"));
    ck_assert(!kvd__size_inexact("0.1Q"));
    ck_assert(!kvd__size_inexact(NULL));
    ck_assert_int_eq(kvd__parse_size("16383P", &v), KVD_OK);
    ck_assert_int_eq(kvd__parse_size("16384P", &v), KVD_ERANGE);
    ck_assert_int_eq(kvd__parse_size("18446744073709551615", &v), KVD_OK);
    ck_assert_uint_eq(v, UINT64_MAX);
    ck_assert_int_eq(kvd__parse_size("18446744073709551616", &v), KVD_ERANGE);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("parse");
    TCase *tc = tcase_create("parse");
    SRunner *sr;
    int failed;

    tcase_add_test(tc, test_numbers_are_decimal);
    tcase_add_test(tc, test_sizes);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
