/*
 * libkvdock's connection handling, each test with its own kvdockd (cpu
 * backend): connect errors, the daemon killed under a client (KVD_ECONN
 * with a clear message, replies that had arrived still collectable),
 * reconnecting to a restarted daemon, shutdown, and the library's own
 * argument checks.
 */
#include "testutil.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

static kvt_daemon_t d;

/*
 * connect(2) of this process, with a pause after it when asked: a client
 * slow to write its hello, so that a daemon that refuses it has closed
 * the connection by then (its write fails) -- the order a loaded machine
 * gives at times, here every time.
 */
static volatile int slow_connect_ms;

int connect(int fd, const struct sockaddr *sa, socklen_t len)
{
    static int (*real)(int, const struct sockaddr *, socklen_t);
    int r;

    if (real == NULL)
        real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
    r = real(fd, sa, len);
    if (r == 0 && slow_connect_ms > 0)
        usleep((useconds_t)slow_connect_ms * 1000);
    return r;
}

static void start(void)
{
    signal(SIGPIPE, SIG_IGN);
    ck_assert_msg(kvt_daemon_start(&d, "cpu", NULL, (int)KVT_MS(10000)) == 0, "kvdockd did not start");
}

static void stop(void)
{
    kvt_daemon_stop(&d, 10000);
}

static kvd_client_t *connect_d(const char *name)
{
    kvd_client_t *cli = NULL;
    kvd_status_t st = kvd_client_create(d.socket, name, &cli);

    ck_assert_msg(st == KVD_OK, "connect: %s: %s", kvd_err_name(st), kvd_client_last_error(NULL));
    kvd_client_set_timeout(cli, 20000);
    return cli;
}

START_TEST(test_connect_errors)
{
    kvd_client_t *cli = (kvd_client_t *)0x1;
    char longpath[300];

    KVT_ERR(NULL, kvd_client_create("/nonexistent-dir/kvdockd.sock", "x", &cli), KVD_ECONN);
    ck_assert_ptr_null(cli);
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(NULL), "/nonexistent-dir/kvdockd.sock"));
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(NULL), "Is the daemon running?"));
    /* a path given is the path tried: no word of the default order */
    ck_assert_ptr_null(strstr(kvd_client_last_error(NULL), "KVDOCK_SOCKET"));
    ck_assert_str_eq(kvd_strerror(KVD_ECONN),
                     "no connection to the daemon: cannot connect, or it was lost");
    /* a default path says where it came from */
    setenv("KVDOCK_SOCKET", "/nonexistent-dir/env.sock", 1);
    KVT_ERR(NULL, kvd_client_create(NULL, "x", &cli), KVD_ECONN);
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(NULL),
                                 "at /nonexistent-dir/env.sock: No such file or directory. "
                                 "Is the daemon running? The path is $KVDOCK_SOCKET's."));
    unsetenv("KVDOCK_SOCKET");
    if (access("/run/kvdock/kvdockd.sock", F_OK) != 0) {
        const char *xdg = getenv("XDG_RUNTIME_DIR");
        char *saved = xdg != NULL ? strdup(xdg) : NULL;

        setenv("XDG_RUNTIME_DIR", "/nonexistent-dir", 1);
        KVT_ERR(NULL, kvd_client_create("", "x", &cli), KVD_ECONN);
        ck_assert_ptr_nonnull(strstr(
            kvd_client_last_error(NULL),
            "at /nonexistent-dir/kvdock/kvdockd.sock: No such file or directory. Is the daemon "
            "running? With no socket path given, a client tries $KVDOCK_SOCKET (unset), then "
            "/run/kvdock/kvdockd.sock (absent), then this per-user path."));
        if (saved != NULL)
            setenv("XDG_RUNTIME_DIR", saved, 1);
        else
            unsetenv("XDG_RUNTIME_DIR");
        free(saved);
    }
    memset(longpath, 'a', sizeof(longpath) - 1);
    longpath[0] = '/';
    longpath[sizeof(longpath) - 1] = '\0';
    KVT_ERR(NULL, kvd_client_create(longpath, "x", &cli), KVD_ERANGE);
    KVT_ERR(NULL, kvd_client_create(d.socket, "x", NULL), KVD_ENULL);
    /* a directory, or a file that is no socket: said so, not "is the
     * daemon running?" */
    KVT_ERR(NULL, kvd_client_create("/tmp", "x", &cli), KVD_ECONN);
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(NULL), "/tmp: it is a directory"));
    ck_assert_ptr_null(strstr(kvd_client_last_error(NULL), "running"));
    {
        char file[] = "/tmp/kvdt-notsock-XXXXXX";
        int fd = mkstemp(file);

        ck_assert_int_ge(fd, 0);
        close(fd);
        KVT_ERR(NULL, kvd_client_create(file, "x", &cli), KVD_ECONN);
        ck_assert_ptr_nonnull(strstr(kvd_client_last_error(NULL), "it is not a socket"));
        unlink(file);
    }

    /* Default path from the environment. */
    setenv("KVDOCK_SOCKET", d.socket, 1);
    KVT_OK(NULL, kvd_client_create(NULL, NULL, &cli));
    unsetenv("KVDOCK_SOCKET");
    ck_assert_str_eq(kvd_client_socket_path(cli), d.socket);
    KVT_OK(cli, kvd_ping(cli, NULL, 0));
    kvd_client_destroy(&cli);
}
END_TEST

START_TEST(test_daemon_killed_then_reconnect)
{
    kvd_client_t *cli = connect_d("victim");
    kvt_pool_t p;
    uint64_t before, after;
    kvd_status_t st;
    kvd_pool_info_t list[8];
    size_t n;

    kvt_pool_make(cli, &p, "doomed", 1, 8, 16, false, 0);
    /* A reply that arrives before the daemon dies is still collectable. */
    KVT_OK(cli, kvd_ping_submit(cli, "x", 1, &before));
    KVT_OK(cli, kvd_ping(cli, NULL, 0));
    kvt_daemon_kill(&d);

    st = kvd_ping(cli, NULL, 0);
    ck_assert_msg(st == KVD_ECONN, "ping after kill: %s", kvd_err_name(st));
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(cli), "connection"));
    ck_assert(!kvd_client_connected(cli));
    KVT_OK(cli, kvd_client_wait(cli, before));
    KVT_ERR(cli, kvd_pool_list(cli, list, 8, &n), KVD_ECONN);
    KVT_ERR(cli, kvd_ping_submit(cli, NULL, 0, &after), KVD_ECONN);
    /* The host pool's pages stay mapped here after the daemon is gone. */
    memset(p.map->base, 1, p.map->bytes);
    kvt_pool_free(NULL, &p);
    kvd_client_destroy(&cli);

    /* A fresh daemon: a new client works. */
    kvt_daemon_stop(&d, 1000);
    start();
    cli = connect_d("reborn");
    KVT_OK(cli, kvd_ping(cli, "again", 5));
    kvd_client_destroy(&cli);
}
END_TEST

START_TEST(test_pending_requests_fail_on_loss)
{
    kvd_client_t *cli = connect_d("pending");
    uint64_t ids[4];
    kvd_status_t st;

    /* Kill first, then submit: the send or the wait sees the loss. */
    KVT_OK(cli, kvd_ping(cli, NULL, 0));
    kvt_daemon_kill(&d);
    for (int i = 0; i < 4; i++) {
        st = kvd_ping_submit(cli, "y", 1, &ids[i]);
        if (st != KVD_OK) {
            ck_assert_int_eq(st, KVD_ECONN);
            ids[i] = 0;
            continue;
        }
    }
    for (int i = 0; i < 4; i++) {
        if (ids[i] == 0)
            continue;
        st = kvd_client_wait(cli, ids[i]);
        ck_assert_msg(st == KVD_ECONN, "wait after loss: %s", kvd_err_name(st));
    }
    ck_assert_uint_eq(kvd_client_pending(cli), 0);
    kvd_client_destroy(&cli);
}
END_TEST

START_TEST(test_shutdown_by_admin)
{
    kvd_client_t *cli = connect_d("admin");
    int status = 0;
    pid_t pid = d.pid;
    int waited = 0;

    ck_assert(kvd_client_info(cli)->admin);
    KVT_OK(cli, kvd_daemon_shutdown(cli, true));
    /* The daemon exits by itself, with status 0, and removes its socket. */
    while (waited < 10000 && waitpid(pid, &status, WNOHANG) == 0) {
        usleep(10000);
        waited += 10;
    }
    ck_assert_msg(waited < 10000, "kvdockd still running 10 s after shutdown");
    d.pid = -1;
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ck_assert_int_ne(access(d.socket, F_OK), 0);
    ck_assert_int_eq(kvd_ping(cli, NULL, 0), KVD_ECONN);
    kvd_client_destroy(&cli);
}
END_TEST

START_TEST(test_local_argument_checks)
{
    kvd_client_t *cli = connect_d("args");
    uint64_t id;
    kvd_kv_store_t a;
    kvd_pool_import_t imp;
    kvd_pool_info_t info;
    kvd_mapping_t *m = NULL;

    KVT_ERR(NULL, kvd_ping(NULL, NULL, 0), KVD_ENULL);
    KVT_ERR(cli, kvd_ping_submit(cli, NULL, 5, &id), KVD_ENULL);
    KVT_ERR(cli, kvd_kv_store(cli, NULL, NULL, NULL), KVD_ENULL);
    memset(&a, 0, sizeof(a));
    a.loc.count = 3; /* neither values nor buffer */
    KVT_ERR(cli, kvd_kv_store(cli, &a, NULL, NULL), KVD_ENULL);
    KVT_ERR(cli, kvd_pool_export(cli, 0, NULL, 0, &m), KVD_EINVAL);
    KVT_ERR(cli, kvd_pool_drop(cli, 0, ""), KVD_EINVAL);
    memset(&imp, 0, sizeof(imp));
    imp.name = "x";
    KVT_ERR(cli, kvd_pool_import(cli, &imp, &info), KVD_ENULL);
    KVT_ERR(NULL, kvd_mapping_create_host(0, &m), KVD_EINVAL);
    kvd_mapping_destroy(&m);
    kvd_mapping_destroy(NULL);
    if (!kvd_client_has_cuda()) {
        kvd_import_region_t r;
        uint64_t off;
        uint64_t bid;
        kvd_mapping_t *bm = NULL;

        KVT_ERR(NULL, kvd_import_region_from_device_ptr(&r, &r, &off), KVD_ENOTSUP);
        KVT_ERR(NULL, kvd_import_region_from_vmm_ptr(&r, &r, &off), KVD_ENOTSUP);
        KVT_ERR(cli, kvd_buffer_register(cli, 64, KVD_MEM_DEVICE, NULL, &bid, &bm), KVD_ENOTSUP);
    }
    ck_assert_str_eq(kvd_mem_kind_name(KVD_MEM_DEVICE_VMM), "device-vmm");
    ck_assert_str_eq(kvd_backend_name(KVD_BACKEND_CPU), "cpu");
    ck_assert_str_eq(kvd_err_name(KVD_ECONN), "ECONN");
    /* Nothing above reached the daemon in a way that hurt the connection. */
    KVT_OK(cli, kvd_ping(cli, NULL, 0));
    ck_assert_uint_eq(kvd_client_pending(cli), 0);
    kvd_client_destroy(&cli);
}
END_TEST

/* Errors are per thread: another thread's failure does not show here. */
static void *fail_in_thread(void *arg)
{
    kvd_client_t *cli = arg;

    kvd_pool_drop(cli, 0, "no-such-pool-in-thread"); /* the daemon's ENOENT */
    return NULL;
}

START_TEST(test_last_error_per_thread)
{
    kvd_client_t *cli = connect_d("errors-per-thread");
    pthread_t th;

    KVT_ERR(cli, kvd_pool_drop(cli, 0, ""), KVD_EINVAL); /* refused here */
    ck_assert_str_eq(kvd_client_last_error(cli), "name a pool by id or by name");
    pthread_create(&th, NULL, fail_in_thread, cli);
    pthread_join(th, NULL);
    ck_assert_str_eq(kvd_client_last_error(cli), "name a pool by id or by name");
    kvd_client_destroy(&cli);
}
END_TEST

/* A frame past the daemon's limit (written raw, behind the library's
 * back): the daemon answers ETOOBIG with id 0 and closes that connection;
 * the library reports it on the pending request, then KVD_ECONN; another
 * client is unaffected. */
START_TEST(test_oversized_frame_closes_one_connection)
{
    kvd_client_t *cli = connect_d("oversized");
    kvd_client_t *other = connect_d("bystander");
    uint64_t max = kvd_client_info(cli)->limits.max_frame_bytes + 1;
    uint8_t hdr[4] = {(uint8_t)max, (uint8_t)(max >> 8), (uint8_t)(max >> 16),
                      (uint8_t)(max >> 24)};
    uint64_t id;
    kvd_status_t st;

    ck_assert_uint_lt(max, UINT32_MAX);
    ck_assert_int_eq(send(kvd_client_fd(cli), hdr, 4, MSG_NOSIGNAL), 4);
    st = kvd_ping_submit(cli, NULL, 0, &id);
    if (st == KVD_OK)
        st = kvd_client_wait(cli, id);
    /* ETOOBIG on the pending request, or ECONN if the daemon had closed
     * before the ping went out; either way the daemon's reason is told. */
    ck_assert_msg(st == KVD_ETOOBIG || st == KVD_ECONN, "after an oversized frame: %s: %s",
                  kvd_err_name(st), kvd_client_last_error(cli));
    ck_assert_msg(strstr(kvd_client_last_error(cli), "ETOOBIG") != NULL, "message: %s",
                  kvd_client_last_error(cli));
    ck_assert_int_eq(kvd_ping(cli, NULL, 0), KVD_ECONN);
    ck_assert(!kvd_client_connected(cli));
    KVT_OK(other, kvd_ping(other, "fine", 4));
    kvd_client_destroy(&cli);
    kvd_client_destroy(&other);
}
END_TEST

/* A client that --max-clients turns away learns why (ELIMIT, the daemon's
 * words), not that its hello could not be written: the daemon writes
 * its refusal and closes before it reads the hello, so the hello's write
 * often fails; the library reads the refusal first. */
START_TEST(test_refused_client_learns_why)
{
    static const char *const extra[] = {"--max-clients", "2", NULL};
    kvt_daemon_t d1;
    kvd_client_t *held[2] = {NULL, NULL}, *c = NULL;
    int limit = 0, other = 0;

    ck_assert_int_eq(kvt_daemon_start(&d1, "cpu", extra, (int)KVT_MS(10000)), 0);
    /* the daemon full (the harness's own probe may still be leaving) */
    for (int i = 0, n = 0; n < 2 && i < 100; i++) {
        if (kvd_client_create(d1.socket, "holder", &held[n]) == KVD_OK)
            n++;
        else
            usleep(20000);
    }
    ck_assert_ptr_nonnull(held[1]);
    for (int i = 0; i < 100; i++) {
        slow_connect_ms = i % 2 ? 50 : 0; /* half of them write after the close */
        kvd_status_t st = kvd_client_create(d1.socket, "turned-away", &c);

        slow_connect_ms = 0;
        ck_assert_ptr_null(c);
        if (st == KVD_ELIMIT && strstr(kvd_client_last_error(NULL), "max-clients") != NULL)
            limit++;
        else if (other++ == 0)
            fprintf(stderr, "try %d: %s: %s\n", i, kvd_err_name(st), kvd_client_last_error(NULL));
    }
    ck_assert_msg(other == 0, "%d of 100 refused clients did not learn ELIMIT", other);
    ck_assert_int_eq(limit, 100);
    kvd_client_destroy(&held[0]);
    kvd_client_destroy(&held[1]);
    ck_assert_int_eq(kvt_daemon_stop(&d1, 10000), 0);
}
END_TEST

static Suite *conn_suite(void)
{
    Suite *s = suite_create("client_conn");
    TCase *tc = tcase_create("conn");

    tcase_add_checked_fixture(tc, start, stop);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_connect_errors);
    tcase_add_test(tc, test_daemon_killed_then_reconnect);
    tcase_add_test(tc, test_pending_requests_fail_on_loss);
    tcase_add_test(tc, test_shutdown_by_admin);
    tcase_add_test(tc, test_local_argument_checks);
    tcase_add_test(tc, test_last_error_per_thread);
    tcase_add_test(tc, test_oversized_frame_closes_one_connection);
    tcase_add_test(tc, test_refused_client_learns_why);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(conn_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
