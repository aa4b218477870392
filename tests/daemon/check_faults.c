/*
 * check_faults: the real kvdockd (cpu backend) under the faults an
 * operator sees, beyond what check_daemon_shutdown and check_client_conn
 * cover:
 *
 * - 100 clients in a row SIGKILLed at a random point of their session
 *   (before hello, while making pools, with transfers in flight): the
 *   daemon stays up, each dead client's pools go once its work has
 *   completed (status: the pool count back to the baseline, no client
 *   left, nothing in flight), and a long-lived client's pools keep their
 *   checksums and its transfers keep working throughout;
 * - SIGTERM with requests of several clients in flight and a shared pool
 *   whose creator has gone: every request answered (done or ESHUTDOWN),
 *   socket removed, exit status 0 (a shared pool used to be released after
 *   the backend had been destroyed: a use after free that the sanitizer
 *   and valgrind runs show);
 * - the daemon SIGKILLed under a libkvdock client with transfers in
 *   flight: every pending request ends with KVD_ECONN and a clear message,
 *   none hangs; a new daemon on the same socket path (the stale socket
 *   replaced) takes the client's reconnect.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvdock/client.h"
#include "kvdock/kernels.h"

enum { KILLS = 100, SLOTS = 1024, SLOT_BYTES = 256, LAYERS = 2, TRANSFERS = 48 };

static kvdt_daemon_t D;
static int64_t idx[SLOTS];

static void setup(void)
{
    int i;

    signal(SIGPIPE, SIG_IGN);
    kvdt_start(&D, NULL);
    for (i = 0; i < SLOTS; i++)
        idx[i] = i;
}

static void teardown(void)
{
    ck_assert_int_eq(kvdt_stop(&D), 0);
}

/* Queue n all-layer transfers a -> b of every slot, ids from first. */
static void send_transfers(int fd, uint64_t a, uint64_t b, int n, uint64_t first)
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
    t.all_layers = 1;
    for (i = 0; i < n; i++) {
        kvdt_req_init(&req, first + (uint64_t)i);
        req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
        req.transfer = &t;
        kvdt_send(fd, &req, NULL, 0);
    }
}

static uint64_t checksum(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    size_t i;

    for (i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* A host pool of the test's shape, named name. */
static kvd_pool_spec_t host_spec(const char *name)
{
    kvd_pool_spec_t spec;

    memset(&spec, 0, sizeof(spec));
    spec.kind = KVD_MEM_HOST;
    spec.num_layers = LAYERS;
    spec.num_slots = SLOTS;
    spec.slot_bytes = SLOT_BYTES;
    spec.name = name;
    return spec;
}

/* Every slot of every layer, pool a to pool b, through libkvdock. */
static kvd_kv_transfer_t all_slots(uint64_t a, uint64_t b)
{
    kvd_kv_transfer_t t;

    memset(&t, 0, sizeof(t));
    t.src_pool = a;
    t.dst_pool = b;
    t.src.values = idx;
    t.src.count = SLOTS;
    t.src.dtype = KVD_DTYPE_I64;
    t.dst = t.src;
    t.all_layers = true;
    return t;
}

/* The doomed client: a libkvdock session that is killed somewhere along
 * the way.  It holds nothing of the test's but ready (kvdt_child_close_fds:
 * not Check's message file either) and makes no Check assertion, directly
 * or through the harness; a failure exits with a code instead.  ready:
 * written once its transfers are all sent. */
static void doomed_child(int ready, unsigned seed)
{
    kvd_client_t *cli = NULL;
    kvd_pool_spec_t spec;
    kvd_pool_info_t a, b;
    kvd_mapping_t *m = NULL;
    kvd_kv_transfer_t t;
    uint64_t ids[TRANSFERS];
    char na[32], nb[32];
    int i;

    if (kvd_client_create(D.sock, "doomed", &cli) != KVD_OK)
        _exit(3);
    snprintf(na, sizeof(na), "doomed-a-%d", (int)getpid());
    snprintf(nb, sizeof(nb), "doomed-b-%d", (int)getpid());
    spec = host_spec(na);
    if (kvd_pool_create(cli, &spec, &a) != KVD_OK)
        _exit(3);
    spec = host_spec(nb);
    if (kvd_pool_create(cli, &spec, &b) != KVD_OK)
        _exit(3);
    /* the dead client holds a mapping of the daemon's memory too */
    if (kvd_pool_export(cli, a.id, NULL, 0, &m) != KVD_OK)
        _exit(4);
    memset(m->base, (int)(seed & 0xff), m->bytes);
    t = all_slots(a.id, b.id);
    for (i = 0; i < TRANSFERS; i++)
        if (kvd_kv_transfer_submit(cli, &t, NULL, NULL, &ids[i]) != KVD_OK)
            _exit(5);
    if (write(ready, "r", 1) != 1)
        _exit(4);
    /* keep the daemon busy until the kill: another transfer as each ends */
    for (i = 0;; i = (i + 1) % TRANSFERS)
        if (kvd_client_wait(cli, ids[i]) != KVD_OK ||
            kvd_kv_transfer_submit(cli, &t, NULL, NULL, &ids[i]) != KVD_OK)
            _exit(5);
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

START_TEST(test_sigkill_clients_mid_transfer)
{
    int keeper = kvdt_client(&D, "keeper");
    uint64_t k1 = kvdt_pool_create(keeper, "keep-1", LAYERS, 64, 128, 0);
    uint64_t k2 = kvdt_pool_create(keeper, "keep-2", LAYERS, 64, 128, 0);
    Kvdock__PoolInfo *i1, *i2;
    size_t l1, l2;
    uint8_t *m1 = kvdt_pool_map(keeper, k1, &i1, &l1), *m2 = kvdt_pool_map(keeper, k2, &i2, &l2);
    uint64_t sum1, base_pools, wait_ns_max = 0, t0 = now_ns();
    unsigned seed = 12345;
    int round, i, with_inflight = 0, before_ready = 0;
    Kvdock__StatusReply *s;

    for (i = 0; i < (int)i1->bytes; i++)
        m1[i] = (uint8_t)(i * 31 + 7);
    memset(m2, 0, i2->bytes);
    sum1 = checksum(m1, i1->bytes);
    s = kvdt_status(keeper);
    base_pools = s->pools;
    ck_assert_uint_eq(base_pools, 2);
    kvdock__status_reply__free_unpacked(s, NULL);

    for (round = 0; round < KILLS; round++) {
        int pfd[2], st;
        pid_t pid;
        char c;
        uint64_t t;

        seed = seed * 1103515245u + 12345u;
        ck_assert_int_eq(pipe(pfd), 0);
        pid = fork();
        if (pid == 0) {
            kvdt_child_close_fds(pfd[1]);
            doomed_child(pfd[1], seed);
            _exit(0);
        }
        ck_assert_int_ge(pid, 0);
        close(pfd[1]);
        if (round % 4 == 0) {
            /* anywhere: before hello, mid pool creation, mid export */
            usleep((seed >> 8) % 3000);
            before_ready++;
        } else {
            /* with its transfers queued, at a random point of their run */
            ck_assert_int_eq(read(pfd[0], &c, 1), 1);
            usleep((seed >> 8) % 4000);
            s = kvdt_status(keeper);
            for (i = 0; i < (int)s->n_client_list; i++)
                if (s->client_list[i]->pid == (uint32_t)pid && s->client_list[i]->inflight > 0) {
                    with_inflight++;
                    break;
                }
            kvdock__status_reply__free_unpacked(s, NULL);
        }
        kill(pid, SIGKILL);
        ck_assert_int_eq(waitpid(pid, &st, 0), pid);
        ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
        close(pfd[0]);

        /* the keeper's transfer works, and its source is intact */
        {
            Kvdock__Request req;
            Kvdock__Transfer tr = KVDOCK__TRANSFER__INIT;
            Kvdock__Indices si = KVDOCK__INDICES__INIT, di = KVDOCK__INDICES__INIT;
            int64_t sv[1] = {round % 64}, dv[1] = {round % 64};
            Kvdock__Response *r;

            si.n_values = di.n_values = 1;
            si.values = sv;
            di.values = dv;
            tr.src_pool = k1;
            tr.dst_pool = k2;
            tr.src = &si;
            tr.dst = &di;
            tr.all_layers = 1;
            kvdt_req_init(&req, 7000 + (uint64_t)round);
            req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
            req.transfer = &tr;
            r = kvdt_call(keeper, &req);
            ck_assert_ptr_nonnull(r);
            ck_assert_msg(r->status == 0, "keeper transfer in round %d: %s", round, r->message);
            kvdock__response__free_unpacked(r, NULL);
        }
        ck_assert_msg(checksum(m1, i1->bytes) == sum1, "keeper's pool changed in round %d", round);

        /* the dead client's pools go once its work has completed */
        t = now_ns();
        for (i = 0; i < 2000 * kvt_time_scale(); i++) { /* 4 s, scaled */
            int done;
            s = kvdt_status(keeper);
            done = s->pools == base_pools && s->clients == 1 && s->inflight == 0;
            kvdock__status_reply__free_unpacked(s, NULL);
            if (done)
                break;
            usleep(2000);
        }
        ck_assert_msg(i < 2000 * kvt_time_scale(), "round %d: the dead client's pools are still there", round);
        if (now_ns() - t > wait_ns_max)
            wait_ns_max = now_ns() - t;
    }

    /* the keeper's copies: every layer's K and V of the rows it moved */
    for (i = 0; i < LAYERS * 2 * 64; i++) {
        uint64_t l = (uint64_t)i / 128, v = ((uint64_t)i / 64) % 2, slot = (uint64_t)i % 64;
        uint64_t off = l * i1->layer_stride + v * i1->v_offset + slot * i1->slot_stride;
        ck_assert_msg(memcmp(m2 + off, m1 + off, i1->slot_bytes) == 0,
                      "keeper's copy: layer %d %s slot %d differs", (int)l, v ? "V" : "K",
                      (int)slot);
    }
    s = kvdt_status(keeper);
    ck_assert_uint_eq(s->pools, base_pools);
    ck_assert_uint_eq(s->pool_bytes, i1->bytes + i2->bytes);
    ck_assert_uint_eq(s->clients, 1);
    kvdock__status_reply__free_unpacked(s, NULL);
    ck_assert_int_eq(kill(D.pid, 0), 0); /* still up */
    printf("faults: %d clients SIGKILLed (%d before their transfers were queued, %d seen with "
           "requests in flight); daemon up, keeper's checksums intact, pools back to %u within "
           "%.1f ms of each kill (worst); %.1f s\n",
           KILLS, before_ready, with_inflight, (unsigned)base_pools, wait_ns_max / 1e6,
           (now_ns() - t0) / 1e9);
    ck_assert_int_gt(with_inflight, KILLS / 10); /* killed mid-transfer, not between */
    munmap(m1, l1);
    munmap(m2, l2);
    kvdock__pool_info__free_unpacked(i1, NULL);
    kvdock__pool_info__free_unpacked(i2, NULL);
    close(keeper);
}
END_TEST

START_TEST(test_sigterm_with_shared_pool_and_inflight)
{
    enum { CLIENTS = 4, N = 24 };
    int fds[CLIENTS], creator = kvdt_client(&D, "creator"), c, i;
    Kvdock__Request req;
    Kvdock__PoolCreate pc = KVDOCK__POOL_CREATE__INIT;
    Kvdock__Response *r;
    struct stat st;

    /* a shared pool whose creator leaves: it stays, owned by the daemon */
    kvdt_req_init(&req, 2);
    pc.name = "shared-left-behind";
    pc.kind = KVDOCK__MEM_KIND__MEM_HOST;
    pc.num_layers = 2;
    pc.num_slots = 64;
    pc.slot_bytes = 64;
    pc.shared = 1;
    req.op_case = KVDOCK__REQUEST__OP_POOL_CREATE;
    req.pool_create = &pc;
    r = kvdt_call(creator, &req);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->status, 0);
    kvdock__response__free_unpacked(r, NULL);
    close(creator);

    for (c = 0; c < CLIENTS; c++) {
        char na[16], nb[16];
        uint64_t a, b;

        fds[c] = kvdt_client(&D, "busy");
        snprintf(na, sizeof(na), "a%d", c);
        snprintf(nb, sizeof(nb), "b%d", c);
        a = kvdt_pool_create(fds[c], na, LAYERS, SLOTS, SLOT_BYTES, 0);
        b = kvdt_pool_create(fds[c], nb, LAYERS, SLOTS, SLOT_BYTES, 0);
        ck_assert_uint_gt(b, 0);
        send_transfers(fds[c], a, b, N, 100);
    }
    usleep(10000);
    kill(D.pid, SIGTERM);
    for (c = 0; c < CLIENTS; c++) {
        uint8_t seen[N];
        int ok = 0, shut = 0;

        memset(seen, 0, sizeof(seen));
        for (i = 0; i < N; i++) {
            r = kvdt_recv(fds[c], NULL, NULL, 30000);
            ck_assert_msg(r != NULL, "client %d: reply %d of %d missing", c, i, N);
            ck_assert_uint_ge(r->id, 100);
            ck_assert_uint_lt(r->id, 100 + N);
            ck_assert_int_eq(seen[r->id - 100], 0);
            seen[r->id - 100] = 1;
            ck_assert_msg(r->status == 0 || r->status == KVD_ESHUTDOWN, "status %u: %s",
                          r->status, r->message);
            ok += r->status == 0;
            shut += r->status == KVD_ESHUTDOWN;
            kvdock__response__free_unpacked(r, NULL);
        }
        ck_assert_int_eq(ok + shut, N);
        ck_assert(kvdt_closed(fds[c], KVDT_TIMEOUT_MS));
        close(fds[c]);
    }
    i = kvdt_wait_exit(&D, 30000);
    if (i != 0)
        kvdt_dump_log(&D);
    ck_assert_msg(i == 0, "kvdockd exit status %d after SIGTERM", i);
    ck_assert_int_ne(stat(D.sock, &st), 0);
}
END_TEST

START_TEST(test_daemon_sigkill_inflight_then_restart)
{
    kvd_client_t *cli = NULL;
    kvd_pool_spec_t spec;
    kvd_pool_info_t a, b;
    kvd_kv_transfer_t t;
    uint64_t ids[64];
    char sock[128], old_dir[64], cmd[128];
    int i, econn = 0, ok = 0;
    kvd_status_t st;
    struct stat sst;

    ck_assert_int_eq(kvd_client_create(D.sock, "survivor", &cli), KVD_OK);
    kvd_client_set_timeout(cli, 20000);
    spec = host_spec("src");
    ck_assert_int_eq(kvd_pool_create(cli, &spec, &a), KVD_OK);
    spec = host_spec("dst");
    ck_assert_int_eq(kvd_pool_create(cli, &spec, &b), KVD_OK);
    t = all_slots(a.id, b.id);
    for (i = 0; i < 64; i++)
        ck_assert_int_eq(kvd_kv_transfer_submit(cli, &t, NULL, NULL, &ids[i]), KVD_OK);

    /* the daemon dies with them in flight */
    kill(D.pid, SIGKILL);
    ck_assert_int_eq(kvdt_wait_exit(&D, 10000), 128 + SIGKILL);
    for (i = 0; i < 64; i++) {
        st = kvd_client_wait_timeout(cli, ids[i], 10000);
        ck_assert_msg(st == KVD_OK || st == KVD_ECONN, "request %d: %s: %s", i, kvd_err_name(st),
                      kvd_client_last_error(cli));
        if (st == KVD_ECONN) {
            econn++;
            ck_assert_msg(strstr(kvd_client_last_error(cli), "connection") != NULL,
                          "unclear message: %s", kvd_client_last_error(cli));
        } else {
            ok++;
        }
    }
    ck_assert_int_gt(econn, 0);
    ck_assert(!kvd_client_connected(cli));
    ck_assert_uint_eq(kvd_client_pending(cli), 0);
    st = kvd_ping(cli, NULL, 0);
    ck_assert_int_eq(st, KVD_ECONN);
    ck_assert_msg(strstr(kvd_client_last_error(cli), "kvdockd") != NULL, "message: %s",
                  kvd_client_last_error(cli));
    /* the dead daemon's socket file is still there: a stale one */
    ck_assert_int_eq(stat(D.sock, &sst), 0);
    kvd_client_destroy(&cli);

    /* a new daemon on the same path replaces the stale socket; the client
     * reconnects and works */
    snprintf(sock, sizeof(sock), "%s", D.sock);
    snprintf(old_dir, sizeof(old_dir), "%s", D.dir);
    ck_assert_int_eq(kvdt_connect(sock), -1); /* nobody answers there */
    kvdt_start_sock(&D, sock, NULL); /* D now: the new daemon, its log elsewhere */
    ck_assert_int_eq(kvd_client_create(sock, "survivor", &cli), KVD_OK);
    kvd_client_set_timeout(cli, 20000);
    ck_assert_int_eq(kvd_ping(cli, "back", 4), KVD_OK);
    spec.name = "src";
    ck_assert_int_eq(kvd_pool_create(cli, &spec, &a), KVD_OK);
    kvd_client_destroy(&cli);
    ck_assert_int_eq(kvdt_stop(&D), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", old_dir);
    ck_assert_int_eq(system(cmd), 0);
    printf("faults: daemon SIGKILLed with 64 transfers in flight: %d answered before the kill, "
           "%d ended with KVD_ECONN; reconnect to the restarted daemon: ok\n",
           ok, econn);
}
END_TEST

static Suite *faults_suite(void)
{
    Suite *s = suite_create("faults");
    TCase *tc = tcase_create("faults");

    tcase_set_timeout(tc, 240);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_sigkill_clients_mid_transfer);
    tcase_add_test(tc, test_sigterm_with_shared_pool_and_inflight);
    tcase_add_test(tc, test_daemon_sigkill_inflight_then_restart);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(faults_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
