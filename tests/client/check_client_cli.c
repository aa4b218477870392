/*
 * The built `kvdock` CLI against the real kvdockd (cpu backend): each
 * command in table and JSON form, usage errors (exit 2) and daemon errors
 * (exit 1 with the status name and message on stderr).
 */
#include "testutil.h"

#include <stdarg.h>

#ifndef KVDOCK_CLI_PATH
#error "KVDOCK_CLI_PATH must name the kvdock binary"
#endif

/* The kvdock binary: $KVDOCK_CLI, else the one built with the tests. */
static const char *cli_path(void)
{
    const char *p = getenv("KVDOCK_CLI");

    return p != NULL && p[0] != '\0' ? p : KVDOCK_CLI_PATH;
}

typedef struct result {
    int rc;
    char *out;
    char *err;
} result_t;

/* Run kvdock --socket <suite daemon> args... (NULL-terminated). */
static result_t cli(const char *first, ...)
{
    const char *argv[32];
    int n = 0;
    va_list ap;
    const char *a;
    result_t r;

    argv[n++] = cli_path();
    argv[n++] = "--socket";
    argv[n++] = kvt_d.socket;
    va_start(ap, first);
    for (a = first; a != NULL && n < 31; a = va_arg(ap, const char *))
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    r.rc = kvt_run(argv, &r.out, &r.err, 20000);
    return r;
}

static void result_free(result_t *r)
{
    free(r->out);
    free(r->err);
}

#define EXPECT_RC(r, code)                                                                         \
    ck_assert_msg((r).rc == (code), "exit %d, expected %d\nstdout:\n%s\nstderr:\n%s", (r).rc,      \
                  (code), (r).out, (r).err)

START_TEST(test_cli_help)
{
    const char *argv[] = {cli_path(), "--help", NULL};
    const char *argv2[] = {cli_path(), "pool", "--help", NULL};
    result_t r;

    r.rc = kvt_run(argv, &r.out, &r.err, 10000);
    EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "usage: kvdock"));
    ck_assert_ptr_nonnull(strstr(r.out, "status"));
    ck_assert_ptr_nonnull(strstr(r.out, "--socket"));
    result_free(&r);
    r.rc = kvt_run(argv2, &r.out, &r.err, 10000);
    EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "--slot-bytes"));
    result_free(&r);
}
END_TEST

START_TEST(test_cli_status)
{
    result_t r = cli("status", NULL);

    EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "backend cpu"));
    ck_assert_ptr_nonnull(strstr(r.out, kvt_d.socket));
    result_free(&r);

    r = cli("status", "--json", NULL);
    EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"backend\":\"cpu\""));
    ck_assert_ptr_nonnull(strstr(r.out, "\"client_list\":["));
    ck_assert_ptr_nonnull(strstr(r.out, "\"kvdock-cli\""));
    result_free(&r);
}
END_TEST

/*
 * A pool belongs to the connection that made it, and kvdockd frees a
 * connection's pools when it closes; a one-shot `kvdock pool create`
 * therefore says what it made, and the listing and dropping are checked on
 * a shared pool that this test's own connection holds.
 */
START_TEST(test_cli_pool_create)
{
    char name[64];
    result_t r;

    snprintf(name, sizeof(name), "cli-pool-%d", (int)getpid());
    r = cli("pool", "create", name, "--kind", "host", "--layers", "4", "--slots", "1k",
            "--slot-bytes", "128", "--mla", "--page-size", "16", "--shared", NULL);
    EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, name));
    ck_assert_ptr_nonnull(strstr(r.out, "4 layers x 1024 slots x 128 bytes"));
    ck_assert_ptr_nonnull(strstr(r.out, "mla"));
    result_free(&r);

    snprintf(name, sizeof(name), "cli-json-%d", (int)getpid());
    r = cli("--json", "pool", "create", name, "--layers", "2", "--slots", "8", "--slot-bytes", "64",
            NULL);
    EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"pool\":{"));
    ck_assert_ptr_nonnull(strstr(r.out, "\"mla\":false"));
    ck_assert_ptr_nonnull(strstr(r.out, "\"num_slots\":8"));
    ck_assert_ptr_nonnull(strstr(r.err, "note:")); /* private: dropped at exit */
    result_free(&r);
}
END_TEST

START_TEST(test_cli_pools_and_drop)
{
    kvd_client_t *holder = kvt_connect("pool-holder");
    kvd_pool_spec_t spec;
    kvd_pool_info_t info, list[64];
    size_t n = 0;
    char name[64];
    result_t r;

    snprintf(name, sizeof(name), "cli-held-%d", (int)getpid());
    memset(&spec, 0, sizeof(spec));
    spec.name = name;
    spec.kind = KVD_MEM_HOST;
    spec.num_layers = 4;
    spec.num_slots = 1024;
    spec.slot_bytes = 128;
    spec.mla = true;
    spec.page_size = 16;
    spec.shared = true;
    KVT_OK(holder, kvd_pool_create(holder, &spec, &info));

    r = cli("pools", "--json", NULL);
    EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    {
        char *at = strstr(r.out, name);

        ck_assert_msg(at != NULL, "pool %s not listed:\n%s", name, r.out);
        ck_assert_ptr_nonnull(strstr(at, "\"num_layers\":4"));
        ck_assert_ptr_nonnull(strstr(at, "\"num_slots\":1024"));
        ck_assert_ptr_nonnull(strstr(at, "\"slot_bytes\":128"));
        ck_assert_ptr_nonnull(strstr(at, "\"mla\":true"));
        ck_assert_ptr_nonnull(strstr(at, "\"page_size\":16"));
        ck_assert_ptr_nonnull(strstr(at, "\"kind\":\"host\""));
        ck_assert_ptr_nonnull(strstr(at, "\"shared\":true"));
    }
    result_free(&r);

    r = cli("pools", NULL);
    EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "NAME"));
    ck_assert_ptr_nonnull(strstr(r.out, "SLOT_BYTES"));
    ck_assert_ptr_nonnull(strstr(r.out, name));
    result_free(&r);

    /* The same name again: the daemon's EEXIST, with its message. */
    r = cli("pool", "create", name, "--layers", "1", "--slots", "1", "--slot-bytes", "1", NULL);
    EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "EEXIST"));
    ck_assert_str_eq(r.out, "");
    result_free(&r);

    /* An admin may drop another client's shared pool. */
    r = cli("pool", "drop", name, "--json", NULL);
    EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    result_free(&r);
    KVT_OK(holder, kvd_pool_list(holder, list, 64, &n));
    for (size_t i = 0; i < n && i < 64; i++)
        ck_assert_uint_ne(list[i].id, info.id);
    r = cli("pools", "--json", NULL);
    EXPECT_RC(r, 0);
    ck_assert_ptr_null(strstr(r.out, name));
    result_free(&r);

    r = cli("pool", "drop", name, NULL);
    EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "ENOENT"));
    result_free(&r);
    kvd_client_destroy(&holder);
}
END_TEST

START_TEST(test_cli_unknown_pool)
{
    result_t r = cli("pool", "drop", "no-such-pool-anywhere", NULL);

    EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "ENOENT"));
    ck_assert_ptr_nonnull(strstr(r.err, "pool drop"));
    ck_assert_str_eq(r.out, "");
    result_free(&r);
}
END_TEST

START_TEST(test_cli_ping)
{
    result_t r = cli("ping", "--count", "5", NULL);
    int lines = 0;

    EXPECT_RC(r, 0);
    for (const char *p = r.out; (p = strstr(p, "time=")) != NULL; p++)
        lines++;
    ck_assert_int_eq(lines, 5);
    ck_assert_ptr_nonnull(strstr(r.out, "min/avg/p50/p99/max"));
    result_free(&r);

    r = cli("ping", "--count", "20", "--size", "4k", "--json", NULL);
    EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"count\":20"));
    ck_assert_ptr_nonnull(strstr(r.out, "\"p99_us\":"));
    result_free(&r);
}
END_TEST

START_TEST(test_cli_stats)
{
    result_t r = cli("stats", NULL);

    EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "OP"));
    ck_assert_ptr_nonnull(strstr(r.out, "REQUESTS"));
    result_free(&r);
    r = cli("stats", "--json", NULL);
    EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"ops\":["));
    ck_assert_ptr_nonnull(strstr(r.out, "\"streams\":["));
    result_free(&r);
}
END_TEST

START_TEST(test_cli_usage_errors)
{
    const char *const cases[][10] = {
        {"frobnicate", NULL},
        {"pool", NULL},
        {"pool", "resize", "x", NULL},
        {"pool", "create", NULL},
        {"pool", "create", "x", "--layers", "2", NULL},
        {"pool", "create", "x", "--kind", "gpu", "--layers", "1", "--slots", "1"},
        {"pool", "create", "x", "--layers", "zero", "--slots", "1", "--slot-bytes"},
        {"ping", "--count", "-3", NULL},
        {"status", "extra", NULL},
        {"pools", "--bogus", NULL},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        result_t r = cli(cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4],
                         cases[i][5], cases[i][6], cases[i][7], cases[i][8], NULL);

        ck_assert_msg(r.rc == 2, "case %zu (%s %s): exit %d, expected 2\nstderr:\n%s", i,
                      cases[i][0], cases[i][1] ? cases[i][1] : "", r.rc, r.err);
        ck_assert_msg(strstr(r.err, "kvdock: ") != NULL, "case %zu: no message", i);
        result_free(&r);
    }
    {
        const char *argv[] = {cli_path(), NULL};
        result_t r;

        r.rc = kvt_run(argv, &r.out, &r.err, 10000);
        EXPECT_RC(r, 2);
        result_free(&r);
    }
}
END_TEST

START_TEST(test_cli_no_daemon)
{
    const char *argv[] = {cli_path(), "--socket", "/nonexistent/kvdockd.sock", "status", NULL};
    result_t r;

    r.rc = kvt_run(argv, &r.out, &r.err, 10000);
    EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "ECONN"));
    ck_assert_ptr_nonnull(strstr(r.err, "/nonexistent/kvdockd.sock"));
    result_free(&r);
}
END_TEST

START_TEST(test_cli_default_socket_from_env)
{
    const char *argv[] = {cli_path(), "ping", NULL};
    result_t r;

    setenv("KVDOCK_SOCKET", kvt_d.socket, 1);
    r.rc = kvt_run(argv, &r.out, &r.err, 10000);
    unsetenv("KVDOCK_SOCKET");
    EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, kvt_d.socket));
    result_free(&r);
}
END_TEST

static Suite *cli_suite(void)
{
    Suite *s = suite_create("client_cli");
    TCase *tc = tcase_create("cli");

    tcase_add_unchecked_fixture(tc, kvt_suite_setup, kvt_suite_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_cli_help);
    tcase_add_test(tc, test_cli_status);
    tcase_add_test(tc, test_cli_pool_create);
    tcase_add_test(tc, test_cli_pools_and_drop);
    tcase_add_test(tc, test_cli_unknown_pool);
    tcase_add_test(tc, test_cli_ping);
    tcase_add_test(tc, test_cli_stats);
    tcase_add_test(tc, test_cli_usage_errors);
    tcase_add_test(tc, test_cli_no_daemon);
    tcase_add_test(tc, test_cli_default_socket_from_env);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(cli_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
