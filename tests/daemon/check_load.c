/*
 * check_load: 64 client processes against one real kvdockd (cpu backend),
 * 10,000 mixed operations each, sent asynchronously with a window of
 * requests in flight: ping (payload tagged), inline store, transfer, pool
 * list, status, stats, and invalid requests (a missing pool, no operation,
 * a sync block on a non-data operation, indices past the pool) with their
 * exact status codes.
 *
 * Every request carries a tag in its id (client number, sequence number);
 * its reply must come exactly once, with that id, and with content that
 * only that request could get: the ping's own payload, the row count of
 * that store or transfer, the client's own pools in the list.  At the end
 * each client checks that its pool holds, for every slot, the rows of the
 * last store it sent there (the write stream runs in order): nothing of
 * another client's landed in it.
 *
 * The daemon's resident memory (VmRSS) is read idle (after a warm-up
 * client), at the peak, and after the clients have left and the daemon
 * has settled: it must come back to within a small margin of the idle
 * level.  (Under AddressSanitizer, freed memory sits in the quarantine:
 * the figures are printed, the margin is not checked.)
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#if defined(__SANITIZE_ADDRESS__)
#define KVD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVD_ASAN 1
#endif
#endif

enum {
    CLIENTS = 64,
    OPS = 10000,
    WINDOW = 16,
    SLOTS = 64,
    SLOT_BYTES = 64,
    LAYERS = 2,
    RSS_MARGIN_KB = 4 * 1024,
};

typedef enum kind {
    K_PING,
    K_STORE,
    K_TRANSFER,
    K_LIST,
    K_STATUS,
    K_STATS,
    K_BAD_POOL,
    K_NO_OP,
    K_BAD_SYNC,
    K_BAD_INDEX,
    K_COUNT
} kind_t;

static const char *kind_name[K_COUNT] = {"ping",  "store",    "transfer", "pool_list",
                                         "status", "stats",   "bad_pool", "no_op",
                                         "bad_sync", "bad_index"};

static kvdt_daemon_t D;

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static long vm_rss_kb(pid_t pid)
{
    char path[64], line[256];
    FILE *f;
    long kb = -1;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* The bytes of the row a request stores (K, or V when v). */
static void row_bytes(uint64_t tag, int v, uint8_t *out)
{
    uint64_t x = mix(tag * 2 + (uint64_t)v);
    int i;

    for (i = 0; i < SLOT_BYTES; i++) {
        if (i % 8 == 0)
            x = mix(x + (uint64_t)i);
        out[i] = (uint8_t)(x >> (8 * (i % 8)));
    }
}

/* One request outstanding: what its reply must say. */
typedef struct slot_state {
    uint64_t id;
    kind_t kind;
    int live;
} pending_t;

typedef struct client {
    int n;
    int fd;
    uint64_t a, b; /* own pools */
    pending_t win[WINDOW];
    uint64_t last_store[LAYERS][SLOTS]; /* tag of the last store per slot, 0: none */
    uint64_t counts[K_COUNT];
} client_t;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "load client %d: ", cl->n);                                                \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        _exit(1);                                                                                  \
    } while (0)

static void send_req(client_t *cl, uint64_t seq, kind_t k, uint64_t tag)
{
    Kvdock__Request req;
    Kvdock__Ping ping = KVDOCK__PING__INIT;
    Kvdock__Store st = KVDOCK__STORE__INIT;
    Kvdock__Transfer tr = KVDOCK__TRANSFER__INIT;
    Kvdock__Indices loc = KVDOCK__INDICES__INIT, si = KVDOCK__INDICES__INIT,
                    di = KVDOCK__INDICES__INIT;
    Kvdock__Data kd = KVDOCK__DATA__INIT, vd = KVDOCK__DATA__INIT;
    Kvdock__PoolList pl = KVDOCK__POOL_LIST__INIT;
    Kvdock__StatusRequest sr = KVDOCK__STATUS_REQUEST__INIT;
    Kvdock__StatsRequest sa = KVDOCK__STATS_REQUEST__INIT;
    Kvdock__Sync sync = KVDOCK__SYNC__INIT;
    uint8_t payload[40], krow[SLOT_BYTES], vrow[SLOT_BYTES];
    int64_t slot[1], sv[4], dv[4];
    uint32_t layer = (uint32_t)(mix(tag) % LAYERS);
    int i;

    kvdt_req_init(&req, tag);
    switch (k) {
    case K_PING:
        memcpy(payload, &tag, 8);
        for (i = 8; i < (int)sizeof(payload); i++)
            payload[i] = (uint8_t)(tag >> (i % 8) ^ (uint64_t)i);
        ping.payload.data = payload;
        ping.payload.len = 8 + seq % 32;
        req.op_case = KVDOCK__REQUEST__OP_PING;
        req.ping = &ping;
        break;
    case K_STORE:
        slot[0] = (int64_t)(mix(tag + 1) % SLOTS);
        row_bytes(tag, 0, krow);
        row_bytes(tag, 1, vrow);
        loc.values = slot;
        loc.n_values = 1;
        kd.inline_.data = krow;
        kd.inline_.len = SLOT_BYTES;
        vd.inline_.data = vrow;
        vd.inline_.len = SLOT_BYTES;
        st.pool = cl->a;
        st.layer = layer;
        st.loc = &loc;
        st.k = &kd;
        st.v = &vd;
        req.op_case = KVDOCK__REQUEST__OP_STORE;
        req.store = &st;
        cl->last_store[layer][slot[0]] = tag;
        break;
    case K_TRANSFER:
    case K_BAD_INDEX:
        for (i = 0; i < 4; i++) {
            sv[i] = (int64_t)((tag + (uint64_t)i * 7) % SLOTS);
            dv[i] = (int64_t)((tag * 3 + (uint64_t)i) % SLOTS);
        }
        if (k == K_BAD_INDEX)
            dv[2] = SLOTS + (int64_t)(tag % 5); /* past the pool */
        si.values = sv;
        di.values = dv;
        si.n_values = di.n_values = 1 + seq % 4;
        tr.src_pool = cl->a;
        tr.dst_pool = cl->b;
        tr.src = &si;
        tr.dst = &di;
        tr.all_layers = 1;
        if (k == K_BAD_INDEX)
            si.n_values = di.n_values = 4;
        req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
        req.transfer = &tr;
        break;
    case K_LIST:
        req.op_case = KVDOCK__REQUEST__OP_POOL_LIST;
        req.pool_list = &pl;
        break;
    case K_STATUS:
        req.op_case = KVDOCK__REQUEST__OP_STATUS;
        req.status = &sr;
        break;
    case K_STATS:
        req.op_case = KVDOCK__REQUEST__OP_STATS;
        req.stats = &sa;
        break;
    case K_BAD_POOL:
        tr.src_pool = 1u << 30; /* nobody's */
        tr.dst_pool = cl->b;
        sv[0] = dv[0] = 0;
        si.values = sv;
        di.values = dv;
        si.n_values = di.n_values = 1;
        tr.src = &si;
        tr.dst = &di;
        req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
        req.transfer = &tr;
        break;
    case K_NO_OP:
        break; /* op not set */
    case K_BAD_SYNC:
        sync.stream = KVDOCK__STREAM_CLASS__STREAM_OFFLOAD;
        req.sync = &sync;
        req.op_case = KVDOCK__REQUEST__OP_PING;
        req.ping = &ping;
        break;
    case K_COUNT:
        break;
    }
    kvdt_send(cl->fd, &req, NULL, 0);
}

/* The reply must be the one of p, with what only p could get. */
static void check_reply(client_t *cl, const pending_t *p, const Kvdock__Response *r)
{
    uint64_t tag = p->id, seq = tag & 0xffffffffu;
    size_t i;
    int own_a = 0, own_b = 0;

    switch (p->kind) {
    case K_PING:
        if (r->status != 0 || r->result_case != KVDOCK__RESPONSE__RESULT_PONG)
            FAIL("ping %" PRIx64 ": status %u", tag, r->status);
        if (r->pong->payload.len != 8 + seq % 32 || memcmp(r->pong->payload.data, &tag, 8) != 0)
            FAIL("ping %" PRIx64 ": another request's payload", tag);
        break;
    case K_STORE:
        if (r->status != 0 || r->result_case != KVDOCK__RESPONSE__RESULT_OP || r->op->rows != 1)
            FAIL("store %" PRIx64 ": status %u %s", tag, r->status, r->message);
        break;
    case K_TRANSFER:
        if (r->status != 0 || r->result_case != KVDOCK__RESPONSE__RESULT_OP ||
            r->op->rows != 1 + seq % 4)
            FAIL("transfer %" PRIx64 ": status %u %s, rows %" PRIu64 " for %" PRIu64, tag,
                 r->status, r->message,
                 r->result_case == KVDOCK__RESPONSE__RESULT_OP ? r->op->rows : 0, 1 + seq % 4);
        break;
    case K_LIST:
        if (r->status != 0 || r->result_case != KVDOCK__RESPONSE__RESULT_POOLS)
            FAIL("pool_list %" PRIx64 ": status %u", tag, r->status);
        for (i = 0; i < r->pools->n_pools; i++) {
            own_a += r->pools->pools[i]->id == cl->a;
            own_b += r->pools->pools[i]->id == cl->b;
        }
        if (own_a != 1 || own_b != 1)
            FAIL("pool_list %" PRIx64 ": own pools missing", tag);
        break;
    case K_STATUS:
        if (r->status != 0 || r->result_case != KVDOCK__RESPONSE__RESULT_STATUS_REPLY ||
            r->status_reply->clients < 1 || r->status_reply->pools < 2)
            FAIL("status %" PRIx64 ": status %u", tag, r->status);
        break;
    case K_STATS:
        if (r->status != 0 || r->result_case != KVDOCK__RESPONSE__RESULT_STATS ||
            r->stats->n_ops == 0)
            FAIL("stats %" PRIx64 ": status %u", tag, r->status);
        break;
    case K_BAD_POOL:
        if (r->status != KVD_ENOENT || r->message == NULL || r->message[0] == '\0')
            FAIL("transfer from a missing pool %" PRIx64 ": status %u, expected ENOENT", tag,
                 r->status);
        break;
    case K_NO_OP:
        if (r->status != KVD_EUNKNOWNOP)
            FAIL("request without operation %" PRIx64 ": status %u, expected EUNKNOWNOP", tag,
                 r->status);
        break;
    case K_BAD_SYNC:
        if (r->status != KVD_EINVAL)
            FAIL("ping with sync %" PRIx64 ": status %u, expected EINVAL", tag, r->status);
        break;
    case K_BAD_INDEX:
        if (r->status != KVD_ERANGE)
            FAIL("transfer past the pool %" PRIx64 ": status %u (%s), expected ERANGE", tag,
                 r->status, r->message);
        break;
    case K_COUNT:
        break;
    }
}

static kind_t pick(uint64_t x)
{
    static const kind_t table[20] = {K_PING,     K_PING,     K_PING,  K_PING,     K_STORE,
                                     K_STORE,    K_STORE,    K_STORE, K_STORE,    K_TRANSFER,
                                     K_TRANSFER, K_TRANSFER, K_LIST,  K_LIST,     K_STATUS,
                                     K_STATS,    K_BAD_POOL, K_NO_OP, K_BAD_SYNC, K_BAD_INDEX};

    return table[x % 20];
}

static void client_main(int n)
{
    client_t *cl = calloc(1, sizeof(*cl));
    char na[32], nb[32];
    uint64_t seq = 0, done = 0;
    Kvdock__PoolInfo *info;
    size_t map_len;
    uint8_t *m, row[SLOT_BYTES];
    int l, s, w;

    cl->n = n;
    cl->fd = kvdt_client(&D, "load");
    snprintf(na, sizeof(na), "load-%d-a", n);
    snprintf(nb, sizeof(nb), "load-%d-b", n);
    cl->a = kvdt_pool_create(cl->fd, na, LAYERS, SLOTS, SLOT_BYTES, 0);
    cl->b = kvdt_pool_create(cl->fd, nb, LAYERS, SLOTS, SLOT_BYTES, 0);
    if (cl->a == 0 || cl->b == 0)
        FAIL("pool create");

    while (done < OPS) {
        Kvdock__Response *r;
        int hit = -1;

        /* fill the window */
        for (w = 0; w < WINDOW && seq < OPS; w++) {
            if (cl->win[w].live)
                continue;
            cl->win[w].id = ((uint64_t)(n + 1) << 32) | seq;
            cl->win[w].kind = pick(mix(cl->win[w].id));
            cl->win[w].live = 1;
            send_req(cl, seq, cl->win[w].kind, cl->win[w].id);
            seq++;
        }
        r = kvdt_recv(cl->fd, NULL, NULL, 60000);
        if (r == NULL)
            FAIL("reply missing after %" PRIu64 " of %d (connection closed or 60 s)", done, OPS);
        for (w = 0; w < WINDOW; w++)
            if (cl->win[w].live && cl->win[w].id == r->id)
                hit = w;
        if (hit < 0)
            FAIL("reply with id %" PRIx64 " (status %u): not a request of mine in flight "
                 "(duplicate, or another's)", r->id, r->status);
        check_reply(cl, &cl->win[hit], r);
        cl->counts[cl->win[hit].kind]++;
        cl->win[hit].live = 0;
        kvdock__response__free_unpacked(r, NULL);
        done++;
    }

    /* nothing more comes: a last ping's reply is the next frame */
    {
        Kvdock__Request req;
        Kvdock__Ping p = KVDOCK__PING__INIT;
        Kvdock__Response *r;

        kvdt_req_init(&req, 0xfeedull);
        req.op_case = KVDOCK__REQUEST__OP_PING;
        req.ping = &p;
        kvdt_send(cl->fd, &req, NULL, 0);
        r = kvdt_recv(cl->fd, NULL, NULL, 60000);
        if (r == NULL || r->id != 0xfeedull || r->status != 0)
            FAIL("a stray reply after the last one (id %" PRIx64 ")", r ? r->id : 0);
        kvdock__response__free_unpacked(r, NULL);
    }

    /* the pool holds what this client's last stores wrote, slot by slot */
    m = kvdt_pool_map(cl->fd, cl->a, &info, &map_len);
    for (l = 0; l < LAYERS; l++)
        for (s = 0; s < SLOTS; s++) {
            uint8_t *k = m + (uint64_t)l * info->layer_stride + (uint64_t)s * info->slot_stride;
            if (cl->last_store[l][s] == 0)
                continue;
            row_bytes(cl->last_store[l][s], 0, row);
            if (memcmp(k, row, SLOT_BYTES) != 0)
                FAIL("pool a layer %d slot %d K: not the last store's row", l, s);
            row_bytes(cl->last_store[l][s], 1, row);
            if (memcmp(k + info->v_offset, row, SLOT_BYTES) != 0)
                FAIL("pool a layer %d slot %d V: not the last store's row", l, s);
        }
    munmap(m, map_len);
    kvdock__pool_info__free_unpacked(info, NULL);
    if (n == 0) {
        int k;
        printf("load: client 0 mix:");
        for (k = 0; k < K_COUNT; k++)
            printf(" %s=%" PRIu64, kind_name[k], cl->counts[k]);
        printf("\n");
        fflush(stdout);
    }
    close(cl->fd);
    free(cl);
    _exit(0);
}

/* Wait until the daemon has only the given client left, no pools, nothing
 * in flight; then let it settle. */
static void settle(int fd)
{
    int i;

    for (i = 0; i < 3000 * kvt_time_scale(); i++) { /* 30 s, scaled */
        Kvdock__Request req;
        Kvdock__StatusRequest sr = KVDOCK__STATUS_REQUEST__INIT;
        Kvdock__Response *r;
        int quiet;

        kvdt_req_init(&req, 9);
        req.op_case = KVDOCK__REQUEST__OP_STATUS;
        req.status = &sr;
        r = kvdt_call(fd, &req);
        ck_assert_ptr_nonnull(r);
        quiet = r->status_reply->clients == 1 && r->status_reply->pools == 0 &&
                r->status_reply->inflight == 0 && r->status_reply->buffers == 0;
        kvdock__response__free_unpacked(r, NULL);
        if (quiet)
            break;
        usleep(10000);
    }
    ck_assert_msg(i < 3000 * kvt_time_scale(), "the daemon did not go back to idle");
    usleep(500000);
}

START_TEST(test_64_clients_10000_ops)
{
    pid_t pids[CLIENTS];
    int watcher, i, failed = 0;
    long rss_idle, rss_peak = 0, rss_after;
    uint64_t t0, t1;

    signal(SIGPIPE, SIG_IGN);
    kvdt_start(&D, (const char *const[]){"--log-level", "warn", "--max-clients", "256", NULL});
    watcher = kvdt_client(&D, "watcher");
    /* warm-up: one client's session, so that the idle level counts what a
     * first client makes once (stats tables, allocator arenas) */
    pids[0] = fork();
    if (pids[0] == 0)
        client_main(CLIENTS); /* tags of its own */
    ck_assert_int_ge(pids[0], 0);
    ck_assert_int_eq(waitpid(pids[0], &i, 0), pids[0]);
    ck_assert_msg(WIFEXITED(i) && WEXITSTATUS(i) == 0, "warm-up client failed");
    settle(watcher);
    rss_idle = vm_rss_kb(D.pid);
    ck_assert_int_gt(rss_idle, 0);

    t0 = now_ns();
    for (i = 0; i < CLIENTS; i++) {
        pids[i] = fork();
        if (pids[i] == 0)
            client_main(i);
        ck_assert_int_ge(pids[i], 0);
    }
    for (i = 0; i < CLIENTS;) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        long rss;

        if (p == 0) {
            rss = vm_rss_kb(D.pid);
            if (rss > rss_peak)
                rss_peak = rss;
            usleep(20000);
            continue;
        }
        ck_assert_int_gt(p, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed++;
        i++;
    }
    t1 = now_ns();
    ck_assert_msg(failed == 0, "%d of %d load clients failed (their reasons above)", failed,
                  CLIENTS);
    ck_assert_int_eq(kill(D.pid, 0), 0);
    settle(watcher);
    rss_after = vm_rss_kb(D.pid);
    printf("load: %d clients x %d mixed operations (window %d) = %d requests in %.1f s "
           "(%.0f/s); every reply once, to its own request; daemon VmRSS idle %ld kB, peak "
           "%ld kB, after %ld kB (%+ld kB)\n",
           CLIENTS, OPS, WINDOW, CLIENTS * OPS, (t1 - t0) / 1e9,
           CLIENTS * OPS / ((t1 - t0) / 1e9), rss_idle, rss_peak, rss_after,
           rss_after - rss_idle);
#ifdef KVD_ASAN
    printf("load: AddressSanitizer build: freed memory stays in its quarantine; the RSS "
           "margin is not checked here\n");
#else
    ck_assert_msg(rss_after <= rss_idle + RSS_MARGIN_KB,
                  "daemon VmRSS %ld kB after the load, %ld kB idle: more than %d kB above",
                  rss_after, rss_idle, RSS_MARGIN_KB);
#endif
    close(watcher);
    ck_assert_int_eq(kvdt_stop(&D), 0);
}
END_TEST

static Suite *load_suite(void)
{
    Suite *s = suite_create("load");
    TCase *tc = tcase_create("load");

    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_64_clients_10000_ops);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(load_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
