/*
 * `kvdock bench`, tests/bench/bench_paths and tests/bench/bench_daemon.sh
 * against the real kvdockd (cpu backend), with small counts: the JSON
 * parses, every figure is there and positive, and the benches leave no
 * pool behind.  This is the smoke test of what the GPU round runs at full
 * size.
 */
#include "testutil.h"

#include <stdarg.h>
#include <sys/stat.h>

#ifndef KVDOCK_SOURCE_DIR
#error "KVDOCK_SOURCE_DIR must name the source tree"
#endif

/* Small enough for CI: well under a second of benchmarking. */
#define SMALL_ARGS "--iterations", "300", "--duration", "0.1", "--clients", "2", "--layers", "2"

/*
 * The number at the end of a key path: each key is looked for after the
 * previous one ("all_layer", "daemon", "p50_us").  The bench prints its
 * objects in a fixed order, so the first match after the parent is the
 * child.  False when a key is missing or the value is not a number.
 */
static bool json_num(const char *json, double *out, ...)
{
    const char *at = json, *key;
    va_list ap;
    char pat[96];

    va_start(ap, out);
    while ((key = va_arg(ap, const char *)) != NULL) {
        snprintf(pat, sizeof(pat), "\"%s\":", key);
        at = strstr(at, pat);
        if (at == NULL) {
            va_end(ap);
            return false;
        }
        at += strlen(pat);
    }
    va_end(ap);
    {
        char *end;
        double v = strtod(at, &end);

        if (end == at)
            return false;
        *out = v;
    }
    return true;
}

static const char *const figures[][4] = {
    {"ping", "p50_us", NULL},
    {"ping", "p99_us", NULL},
    {"ping", "mean_us", NULL},
    {"transfer_1slot", "p50_us", NULL},
    {"transfer_1slot", "p99_us", NULL},
    {"transfer_1slot", "mean_us", NULL},
    {"pipelined", "one_client", "req_per_s"},
    {"pipelined", "n_clients", "req_per_s"},
    {"all_layer", "daemon", "p50_us"},
    {"all_layer", "daemon", "mean_us"},
    {"all_layer", "gb_per_s", NULL},
};

static void check_figures(const char *json)
{
    ck_assert_msg(kvt_json_object_valid(json), "not one JSON object:\n%s", json);
    for (size_t i = 0; i < sizeof(figures) / sizeof(figures[0]); i++) {
        double v = -1;
        bool ok = json_num(json, &v, figures[i][0], figures[i][1], figures[i][2], NULL);

        ck_assert_msg(ok, "figure %s.%s%s%s missing:\n%s", figures[i][0], figures[i][1],
                      figures[i][2] ? "." : "", figures[i][2] ? figures[i][2] : "", json);
        ck_assert_msg(v > 0, "figure %s.%s%s%s is %g, not positive", figures[i][0], figures[i][1],
                      figures[i][2] ? "." : "", figures[i][2] ? figures[i][2] : "", v);
    }
    ck_assert_ptr_nonnull(strstr(json, "\"backend\":\"cpu\""));
    ck_assert_ptr_nonnull(strstr(json, "\"pool_kind\":\"host\""));
    ck_assert_ptr_nonnull(strstr(json, "\"target_p50_us\":25.0"));
    /* the latency targets are a GPU daemon's: not judged on cpu */
    ck_assert_ptr_nonnull(strstr(json, "\"targets_met\":null"));
}

START_TEST(test_bench_json)
{
    const char *argv[] = {kvt_cli_path(), "--socket", kvt_d.socket, "bench", "--json", SMALL_ARGS,
                          NULL};
    kvd_client_t *cli;
    kvd_daemon_status_t s;
    size_t n = 99;
    char *out, *err;
    int rc = kvt_run(argv, &out, &err, 60000);

    ck_assert_msg(rc == 0, "kvdock bench exit %d\nstdout:\n%s\nstderr:\n%s", rc, out, err);
    check_figures(out);
    /* --json: stdout is the object alone, and nothing else is printed */
    ck_assert_msg(err[0] == '\0', "stderr:\n%s", err);
    free(out);
    free(err);

    /* nothing left behind */
    cli = kvt_connect("bench-after");
    KVT_OK(cli, kvd_pool_list(cli, NULL, 0, &n));
    ck_assert_uint_eq(n, 0);
    KVT_OK(cli, kvd_daemon_status(cli, &s, NULL, 0));
    ck_assert_uint_eq(s.pools, 0);
    ck_assert_uint_eq(s.buffers, 0);
    kvd_client_destroy(&cli);
}
END_TEST

START_TEST(test_bench_table)
{
    const char *argv[] = {kvt_cli_path(), "--socket", kvt_d.socket, "bench", SMALL_ARGS,
                          "--clients", "8", NULL};
    char *out, *err;
    int rc = kvt_run(argv, &out, &err, 60000);

    ck_assert_msg(rc == 0, "kvdock bench exit %d\nstdout:\n%s\nstderr:\n%s", rc, out, err);
    ck_assert_ptr_nonnull(strstr(out, "CASE"));
    ck_assert_ptr_nonnull(strstr(out, "ping round trip"));
    ck_assert_ptr_nonnull(strstr(out, "<= 25 us"));
    ck_assert_ptr_nonnull(strstr(out, "<= 60 us"));
    ck_assert_ptr_nonnull(strstr(out, ">= 100000"));
    ck_assert_ptr_nonnull(strstr(out, "8 clients"));
    ck_assert_ptr_nonnull(strstr(out, "GB/s"));
    /* a cpu daemon is not held to a GPU daemon's targets */
    ck_assert_ptr_null(strstr(out, "MISS"));
    ck_assert_ptr_nonnull(strstr(out, "(cuda)"));
    ck_assert_ptr_null(strstr(out, "\033[")); /* no progress bars off a terminal */
    free(out);
    free(err);
}
END_TEST

/* A last case the daemon refuses (its pools past the host budget) still
 * shows the figures the others measured, and the exit status says it failed. */
START_TEST(test_bench_refused_case_keeps_results)
{
    const char *argv[] = {kvt_cli_path(), "--socket", kvt_d.socket, "bench", "--iterations", "300",
                          "--duration", "0.1", "--clients", "2", "--layers", "4096",
                          "--slots", "16", "--slot-bytes", "64K", NULL};
    char *out, *err;
    int rc = kvt_run(argv, &out, &err, 60000);

    ck_assert_msg(rc == 1, "kvdock bench exit %d\nstdout:\n%s\nstderr:\n%s", rc, out, err);
    ck_assert_msg(strstr(out, "ping round trip") != NULL, "stdout:\n%s\nstderr:\n%s", out, err);
    ck_assert_ptr_nonnull(strstr(out, "pipelined one-slot transfers, 2 clients"));
    ck_assert_msg(strstr(out, "all-layer transfer, 16 slots") != NULL &&
                      strstr(out, "failed") != NULL, "stdout:\n%s", out);
    ck_assert_msg(strstr(err, "ELIMIT") != NULL, "stderr:\n%s", err);
    free(out);
    free(err);
}
END_TEST

START_TEST(test_bench_paths)
{
    /* the daemon against the same kernel in-process (the cpu reference here) */
    const char *argv[] = {KVDOCK_BENCH_PATHS, "--socket", kvt_d.socket, "--json", "--layers",
                          "2", "--iterations", "20", NULL};
    double v;
    char *out, *err;
    int rc = kvt_run(argv, &out, &err, 60000);

    ck_assert_msg(rc == 0, "bench_paths exit %d\nstdout:\n%s\nstderr:\n%s", rc, out, err);
    ck_assert_msg(kvt_json_object_valid(out), "not one JSON object:\n%s", out);
    ck_assert(json_num(out, &v, "all_layer", "daemon", "p50_us", NULL) && v > 0);
    ck_assert(json_num(out, &v, "all_layer", "in_process", "p50_us", NULL) && v > 0);
    ck_assert(json_num(out, &v, "all_layer", "ratio_inline", NULL) && v > 0);
    ck_assert(json_num(out, &v, "all_layer", "ratio_buffer", NULL) && v > 0);
    ck_assert_ptr_nonnull(strstr(out, "\"target_ratio\":1.10"));
    free(out);
    free(err);
}
END_TEST

START_TEST(test_bench_usage_errors)
{
    const char *const cases[][3] = {
        {"--iterations", "0", NULL}, {"--duration", "-1", NULL}, {"--clients", "100000", NULL},
        {"--window", "x", NULL},     {"--kind", "gpu", NULL},    {"--frobnicate", NULL, NULL},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *argv[] = {kvt_cli_path(), "--socket", kvt_d.socket, "bench",
                              cases[i][0], cases[i][1], NULL};
        char *out, *err;
        int rc = kvt_run(argv, &out, &err, 10000);

        ck_assert_msg(rc == 2, "case %zu (%s): exit %d, expected 2\nstderr:\n%s", i, cases[i][0],
                      rc, err);
        ck_assert_ptr_nonnull(strstr(err, "usage: kvdock bench"));
        free(out);
        free(err);
    }
    {
        const char *argv[] = {kvt_cli_path(), "bench", "--help", NULL};
        char *out, *err;
        int rc = kvt_run(argv, &out, &err, 10000);

        ck_assert_int_eq(rc, 0);
        ck_assert_ptr_nonnull(strstr(out, "--iterations"));
        ck_assert_ptr_nonnull(strstr(out, "targets"));
        free(out);
        free(err);
    }
}
END_TEST

static char *slurp_file(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf;
    long n;

    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = calloc(1, (size_t)n + 1);
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* What the GPU round runs, on the cpu backend: its own daemon, JSON out. */
START_TEST(test_bench_daemon_script)
{
    char dir[] = "/tmp/kvdock-bench-test-XXXXXX", script[512], path[600], cmd[700];
    const char *argv[] = {"/bin/bash", script, "--kvdockd", kvt_daemon_path(), "--kvdock",
                          kvt_cli_path(), "--bench-paths", KVDOCK_BENCH_PATHS, "--backend", "cpu",
                          "--out", dir, "--", SMALL_ARGS, NULL};
    char *out, *err, *json;
    int rc;

    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(script, sizeof(script), "%s/tests/bench/bench_daemon.sh", KVDOCK_SOURCE_DIR);
    /* bench_paths at test_bench_paths' size: its full size outlasts the
     * test's minute in the sanitizer build */
    setenv("BENCH_PATHS_ARGS", "--layers 2 --iterations 20", 1);
    rc = kvt_run(argv, &out, &err, 60000);
    ck_assert_msg(rc == 0, "bench_daemon.sh exit %d\nstdout:\n%s\nstderr:\n%s", rc, out, err);
    snprintf(path, sizeof(path), "%s/bench_daemon.json", dir);
    json = slurp_file(path);
    ck_assert_msg(json != NULL, "no %s", path);
    check_figures(json);
    free(json);
    snprintf(path, sizeof(path), "%s/bench_paths.json", dir);
    json = slurp_file(path);
    ck_assert_msg(json != NULL && strstr(json, "\"in_process\"") != NULL, "no %s", path);
    free(json);
    snprintf(path, sizeof(path), "%s/kvdockd.log", dir);
    ck_assert_int_eq(access(path, R_OK), 0);
    free(out);
    free(err);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *bench_suite(void)
{
    Suite *s = suite_create("client_bench");
    TCase *tc = tcase_create("bench");

    tcase_add_unchecked_fixture(tc, kvt_suite_setup, kvt_suite_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_bench_json);
    tcase_add_test(tc, test_bench_table);
    tcase_add_test(tc, test_bench_refused_case_keeps_results);
    tcase_add_test(tc, test_bench_paths);
    tcase_add_test(tc, test_bench_usage_errors);
    tcase_add_test(tc, test_bench_daemon_script);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(bench_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
