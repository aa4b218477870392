/*
 * check_daemon_shutdown: SIGTERM and SIGINT with requests in flight (every
 * request answered, done or ESHUTDOWN; the socket removed; exit status 0),
 * the admin shutdown without drain, and a client that dies in the middle of
 * its transfers (its resources go once its work has completed; other
 * clients' data stays).
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

enum { SLOTS = 16384, SLOT_BYTES = 2048, N = 40 };

static kvdt_daemon_t D;
static int64_t idx[SLOTS];

static void setup(void)
{
    int i;

    kvdt_start(&D, NULL);
    for (i = 0; i < SLOTS; i++)
        idx[i] = i;
}

static void teardown(void)
{
    ck_assert_int_eq(kvdt_stop(&D), 0);
}

/* Queue n whole-pool transfers a -> b on fd, ids 100.. */
static void send_transfers(int fd, uint64_t a, uint64_t b, int n)
{
    Kvdock__Request req;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__Indices si = KVDOCK__INDICES__INIT, di = KVDOCK__INDICES__INIT;
    int i;

    si.n_values = di.n_values = SLOTS;
    si.values = di.values = idx;
    t.src_pool = a;
    t.dst_pool = b;
    t.src = &si;
    t.dst = &di;
    for (i = 0; i < n; i++) {
        kvdt_req_init(&req, 100 + (uint64_t)i);
        req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
        req.transfer = &t;
        kvdt_send(fd, &req, NULL, 0);
    }
}

/* Collect n replies: each id once; counts of OK and ESHUTDOWN. */
static void collect(int fd, int n, int *ok, int *shut)
{
    static uint8_t seen[N];
    int i;

    memset(seen, 0, sizeof(seen));
    *ok = *shut = 0;
    for (i = 0; i < n; i++) {
        Kvdock__Response *r = kvdt_recv(fd, NULL, NULL, 30000);
        ck_assert_msg(r != NULL, "reply %d of %d missing", i, n);
        ck_assert_uint_ge(r->id, 100);
        ck_assert_uint_lt(r->id, 100 + (uint64_t)n);
        ck_assert_int_eq(seen[r->id - 100], 0);
        seen[r->id - 100] = 1;
        if (r->status == KVD_OK)
            (*ok)++;
        else if (r->status == KVD_ESHUTDOWN)
            (*shut)++;
        else
            ck_abort_msg("unexpected status %u: %s", r->status, r->message);
        kvdock__response__free_unpacked(r, NULL);
    }
}

static void signal_case(int sig)
{
    int fd = kvdt_client(&D, "busy"), idle = kvdt_client(&D, "idle");
    uint64_t a = kvdt_pool_create(fd, "a", 1, SLOTS, SLOT_BYTES, 0);
    uint64_t b = kvdt_pool_create(fd, "b", 1, SLOTS, SLOT_BYTES, 0);
    struct stat st;
    int ok, shut;

    ck_assert_uint_gt(b, 0);
    send_transfers(fd, a, b, N);
    usleep(20000); /* let the daemon take some */
    kill(D.pid, sig);
    collect(fd, N, &ok, &shut);
    ck_assert_int_eq(ok + shut, N);
    ck_assert_int_gt(ok, 0); /* what was queued was drained */
    ck_assert(kvdt_closed(fd, KVDT_TIMEOUT_MS));
    ck_assert(kvdt_closed(idle, KVDT_TIMEOUT_MS));
    ck_assert_int_eq(kvdt_wait_exit(&D, 30000), 0);
    ck_assert_int_ne(stat(D.sock, &st), 0);
    close(fd);
    close(idle);
}

START_TEST(test_sigterm_drains)
{
    signal_case(SIGTERM);
}
END_TEST

START_TEST(test_sigint_drains)
{
    signal_case(SIGINT);
}
END_TEST

START_TEST(test_requests_after_sigterm)
{
    /* requests that arrive during the drain get ESHUTDOWN */
    int fd = kvdt_client(&D, "late");
    uint64_t a = kvdt_pool_create(fd, "a", 1, SLOTS, SLOT_BYTES, 0);
    uint64_t b = kvdt_pool_create(fd, "b", 1, SLOTS, SLOT_BYTES, 0);
    Kvdock__Request req;
    Kvdock__Ping p = KVDOCK__PING__INIT;
    int ok, shut, i;

    send_transfers(fd, a, b, N);
    kill(D.pid, SIGTERM);
    /* the drain has begun once the socket is gone (a fixed sleep was too
     * short for a loaded machine or a sanitizer build) */
    {
        struct stat sst;
        for (i = 0; i < 5000 && stat(D.sock, &sst) == 0; i++)
            usleep(1000);
    }
    kvdt_req_init(&req, 100 + N);
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &p;
    kvdt_send(fd, &req, NULL, 0);
    /* N transfers and the ping: the ping gets ESHUTDOWN, unless the daemon
     * was already done and closed */
    {
        static uint8_t seen[N + 1];
        memset(seen, 0, sizeof(seen));
        ok = shut = 0;
        for (i = 0; i < N + 1; i++) {
            Kvdock__Response *r = kvdt_recv(fd, NULL, NULL, 30000);
            if (r == NULL)
                break;
            ck_assert_int_eq(seen[r->id - 100], 0);
            seen[r->id - 100] = 1;
            if (r->id == 100 + N)
                ck_assert_uint_eq(r->status, KVD_ESHUTDOWN);
            ok += r->status == 0;
            shut += r->status == KVD_ESHUTDOWN;
            kvdock__response__free_unpacked(r, NULL);
        }
        for (i = 0; i < N; i++)
            ck_assert_msg(seen[i], "transfer %d unanswered", i);
    }
    ck_assert_int_eq(kvdt_wait_exit(&D, 30000), 0);
    close(fd);
}
END_TEST

START_TEST(test_shutdown_no_drain)
{
    int fd = kvdt_client(&D, "busy"), admin = kvdt_client(&D, "admin");
    uint64_t a = kvdt_pool_create(fd, "a", 1, SLOTS, SLOT_BYTES, 0);
    uint64_t b = kvdt_pool_create(fd, "b", 1, SLOTS, SLOT_BYTES, 0);
    Kvdock__Request req;
    Kvdock__Shutdown sd = KVDOCK__SHUTDOWN__INIT;
    int ok, shut;

    send_transfers(fd, a, b, N);
    usleep(20000);
    kvdt_req_init(&req, 5);
    sd.drain = 0;
    req.op_case = KVDOCK__REQUEST__OP_SHUTDOWN;
    req.shutdown = &sd;
    ck_assert_int_eq(kvdt_status_of(admin, &req), 0);
    collect(fd, N, &ok, &shut);
    ck_assert_int_eq(ok + shut, N);
    /* queued work was cancelled (the cuda backend has launched everything
     * already: there, nothing waits host-side to be cancelled) */
    if (getenv("KVDT_BACKEND") == NULL || strcmp(getenv("KVDT_BACKEND"), "cpu") == 0)
        ck_assert_int_gt(shut, 0);
    ck_assert_int_eq(kvdt_wait_exit(&D, 30000), 0);
    close(fd);
    close(admin);
}
END_TEST

START_TEST(test_client_dies_mid_transfer)
{
    int keeper = kvdt_client(&D, "keeper");
    uint64_t kp = kvdt_pool_create(keeper, "keep", 1, 64, 64, 0);
    Kvdock__PoolInfo *info;
    size_t len;
    uint8_t *m = kvdt_pool_map(keeper, kp, &info, &len), *copy;
    int round, i;

    for (i = 0; i < (int)info->bytes; i++)
        m[i] = (uint8_t)(i * 31 + 7);
    copy = malloc(info->bytes);
    memcpy(copy, m, info->bytes);
    for (round = 0; round < 5; round++) {
        int fd = kvdt_client(&D, "doomed");
        uint64_t a = kvdt_pool_create(fd, "a", 1, SLOTS, SLOT_BYTES, 0);
        uint64_t b = kvdt_pool_create(fd, "b", 1, SLOTS, SLOT_BYTES, 0);
        ck_assert_uint_gt(b, 0);
        send_transfers(fd, a, b, 10);
        close(fd); /* gone with work in flight */
    }
    for (i = 0; i < 1000; i++) {
        Kvdock__StatusReply *s = kvdt_status(keeper);
        int done = s->pools == 1 && s->inflight == 0 && s->clients == 1;
        kvdock__status_reply__free_unpacked(s, NULL);
        if (done)
            break;
        usleep(10000);
    }
    ck_assert_int_lt(i, 1000);
    ck_assert_mem_eq(m, copy, info->bytes); /* the bystander's pool is intact */
    {
        Kvdock__StatusReply *s = kvdt_status(keeper);
        ck_assert_uint_eq(s->pool_bytes, info->bytes);
        kvdock__status_reply__free_unpacked(s, NULL);
    }
    munmap(m, len);
    free(copy);
    kvdock__pool_info__free_unpacked(info, NULL);
    close(keeper);
}
END_TEST

static Suite *shutdown_suite(void)
{
    Suite *s = suite_create("daemon_shutdown");
    TCase *tc = tcase_create("shutdown");

    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_sigterm_drains);
    tcase_add_test(tc, test_sigint_drains);
    tcase_add_test(tc, test_requests_after_sigterm);
    tcase_add_test(tc, test_shutdown_no_drain);
    tcase_add_test(tc, test_client_dies_mid_transfer);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(shutdown_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
