/*
 * Everything a client makes the daemon hold is counted, and nothing it
 * asks for keeps the loop busy for a time that grows with the size of a
 * cache or a pool (tests/RELIABILITY.md, "Memory and the loop"): leases
 * charged to --max-client-memory and the budget, hostile frames refused
 * from the wire while the daemon's peak memory is read, evicts in time of
 * what they evict, host pools made and dropped off the loop while another
 * client's pings are timed.
 *
 * Hostile frames are written here byte by byte (protobuf's wire format by
 * hand), so that no library between the test and the daemon can refuse or
 * reshape them first.
 */
#define _GNU_SOURCE /* prlimit */
#include "testutil.h"
#include "kvt_proc.h"
#include "kvt_skip.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <grp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#define MiB (1024ull * 1024)
/* Most the daemon's peak RSS may grow over the hostile frames: their read
 * buffer (16 MiB) and small change; AddressSanitizer's quarantine keeps
 * freed buffers resident a while longer. */
#ifdef KVD_SANITIZED
#define PEAK_RSS_BOUND (192 * MiB)
#else
#define PEAK_RSS_BOUND (64 * MiB)
#endif
/* The cache's blocks here: one layer, MLA, one 8-byte token. */
#define BLOCK 8u

/* ---- the daemon's memory ------------------------------------------------------------ */

/* The daemon's host memory of kind, and the sum of every kind against its
 * total (they must agree). */
static uint64_t host_kind(kvd_client_t *cli, const char *kind)
{
    kvd_daemon_status_t s;
    uint64_t sum = 0, v = UINT64_MAX;

    KVT_OK(cli, kvd_daemon_status(cli, &s, NULL, 0));
    for (uint32_t i = 0; i < s.num_host_kinds; i++) {
        sum += s.host_kinds[i].used;
        if (strcmp(s.host_kinds[i].kind, kind) == 0)
            v = s.host_kinds[i].used;
    }
    ck_assert_uint_eq(sum, s.host_used);
    ck_assert_msg(v != UINT64_MAX, "no host memory kind %s", kind);
    return v;
}

/* ---- raw frames ----------------------------------------------------------------------- */

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
} wbuf_t;

static void put(wbuf_t *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
    }
    if (n > 0) /* an empty message: d may be NULL */
        memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void put_varint(wbuf_t *b, uint64_t v)
{
    uint8_t t[10];
    size_t n = 0;

    do {
        t[n++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
        v >>= 7;
    } while (v);
    put(b, t, n);
}

static void put_tag(wbuf_t *b, uint32_t field, int wire)
{
    put_varint(b, (uint64_t)field << 3 | (uint64_t)wire);
}

/* field as a length-delimited copy of sub (freed). */
static void put_sub(wbuf_t *b, uint32_t field, wbuf_t *sub)
{
    put_tag(b, field, 2);
    put_varint(b, sub->n);
    put(b, sub->p, sub->n);
    free(sub->p);
    memset(sub, 0, sizeof(*sub));
}

/* A frame of a Request with id and one operation (field op, body). */
static void send_request(int fd, uint64_t id, uint32_t op, wbuf_t *body)
{
    wbuf_t req = {0}, frame = {0};
    uint32_t len;
    size_t off = 0;

    put_tag(&req, 1, 0);
    put_varint(&req, id);
    put_sub(&req, op, body);
    len = (uint32_t)req.n;
    put(&frame, &len, 4);
    put(&frame, req.p, req.n);
    free(req.p);
    while (off < frame.n) {
        ssize_t w = send(fd, frame.p + off, frame.n - off, MSG_NOSIGNAL);
        ck_assert_msg(w > 0, "send: %s", strerror(errno));
        off += (size_t)w;
    }
    free(frame.p);
}

static int read_full(int fd, void *buf, size_t n)
{
    size_t off = 0;

    while (off < n) {
        ssize_t r = recv(fd, (uint8_t *)buf + off, n - off, 0);
        if (r <= 0)
            return -1;
        off += (size_t)r;
    }
    return 0;
}

static uint64_t get_varint(const uint8_t **p, const uint8_t *end)
{
    uint64_t v = 0;

    for (int s = 0; *p < end && s < 64; s += 7) {
        uint8_t c = *(*p)++;
        v |= (uint64_t)(c & 0x7f) << s;
        if (!(c & 0x80))
            break;
    }
    return v;
}

/* The next reply: its id, status and message (the fields of Response this
 * needs, read by hand as well). */
static void recv_reply(int fd, uint64_t *id, uint32_t *status, char *msg, size_t msg_len)
{
    uint32_t len;
    uint8_t *buf;
    const uint8_t *p, *end;

    *id = 0;
    *status = 0;
    msg[0] = '\0';
    ck_assert_int_eq(read_full(fd, &len, 4), 0);
    buf = malloc(len ? len : 1);
    ck_assert_int_eq(read_full(fd, buf, len), 0);
    for (p = buf, end = buf + len; p < end;) {
        uint64_t key = get_varint(&p, end), v;
        switch (key & 7) {
        case 0:
            v = get_varint(&p, end);
            if (key >> 3 == 1)
                *id = v;
            if (key >> 3 == 2)
                *status = (uint32_t)v;
            break;
        case 2:
            v = get_varint(&p, end);
            if (key >> 3 == 3)
                snprintf(msg, msg_len, "%.*s", (int)v, (const char *)p);
            p += v;
            break;
        case 1:
            p += 8;
            break;
        case 5:
            p += 4;
            break;
        }
    }
    free(buf);
}

/* A raw connection that said hello. */
static int raw_client(const char *sock)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    wbuf_t hello = {0};
    char msg[256];
    uint64_t id;
    uint32_t st;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    ck_assert_int_ge(fd, 0);
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    put_tag(&hello, 1, 0);
    put_varint(&hello, 2); /* protocol version */
    put_tag(&hello, 2, 2);
    put_varint(&hello, 3);
    put(&hello, "raw", 3);
    send_request(fd, 1, 10, &hello);
    recv_reply(fd, &id, &st, msg, sizeof(msg));
    ck_assert_msg(st == KVD_OK, "hello: %s", msg);
    return fd;
}

static void raw_ping(int fd, uint64_t id)
{
    wbuf_t ping = {0};
    char msg[256];
    uint64_t rid;
    uint32_t st;

    send_request(fd, id, 11, &ping);
    recv_reply(fd, &rid, &st, msg, sizeof(msg));
    ck_assert_uint_eq(rid, id);
    ck_assert_msg(st == KVD_OK, "ping: %s", msg);
}

/* CacheKeys of n keys of klen bytes each, as a list (not a blob). */
static void keys_list(wbuf_t *keys, uint32_t n, uint32_t klen)
{
    uint8_t k[64];

    for (uint32_t i = 0; i < n; i++) {
        memset(k, 0, sizeof(k));
        memcpy(k, &i, klen < 4 ? klen : 4);
        put_tag(keys, 1, 2);
        put_varint(keys, klen);
        put(keys, k, klen);
    }
}

/* ---- set-up through the library -------------------------------------------------------- */

/* A cache of blocks of block bytes (one layer, MLA). */
static uint64_t cache_make_of(kvd_client_t *cli, const char *name, uint32_t blocks,
                              uint32_t block)
{
    kvd_cache_spec_t s;
    kvd_cache_info_t info;

    memset(&s, 0, sizeof(s));
    s.name = name;
    s.layout.num_layers = 1;
    s.layout.mla = true;
    s.layout.tokens_per_block = 1;
    s.layout.token_bytes = block;
    snprintf(s.layout.dtype, sizeof(s.layout.dtype), "u8");
    s.budget_bytes = (uint64_t)blocks * block;
    KVT_OK(cli, kvd_cache_create(cli, &s, &info));
    return info.id;
}

static uint64_t cache_make(kvd_client_t *cli, const char *name, uint32_t blocks)
{
    return cache_make_of(cli, name, blocks, BLOCK);
}

/* Keys base .. base + n - 1 as 8-byte keys, saved as one chain from pages
 * 0 .. n - 1 (after parent, when not 0): the save's status, every block
 * stored where it is KVD_OK. */
static kvd_status_t save_chain_st(kvd_client_t *cli, uint64_t cache, uint64_t pool,
                                  uint64_t base, uint32_t n, uint64_t parent)
{
    kvd_status_t st;
    uint64_t *keys = malloc(n * sizeof(*keys));
    int64_t *pages = malloc(n * sizeof(*pages));
    kvd_cache_save_t a;
    kvd_op_result_t res;

    for (uint32_t i = 0; i < n; i++) {
        keys[i] = base + i;
        pages[i] = i;
    }
    memset(&a, 0, sizeof(a));
    a.cache = cache;
    a.pool = pool;
    a.keys.blob = keys;
    a.keys.key_size = 8;
    a.keys.count = n;
    a.blocks.dtype = KVD_DTYPE_I64;
    a.blocks.values = pages;
    a.blocks.count = n;
    if (parent != 0) {
        a.parent = &parent;
        a.parent_len = 8;
    }
    st = kvd_cache_save(cli, &a, NULL, &res);
    if (st == KVD_OK)
        ck_assert_uint_eq(res.stored, n);
    free(keys);
    free(pages);
    return st;
}

static void save_chain(kvd_client_t *cli, uint64_t cache, uint64_t pool, uint64_t base,
                       uint32_t n, uint64_t parent)
{
    KVT_OK(cli, save_chain_st(cli, cache, pool, base, n, parent));
}

static kvd_status_t lookup(kvd_client_t *cli, uint64_t cache, const uint64_t *keys, uint32_t n,
                           bool lease, kvd_cache_lookup_result_t *out)
{
    kvd_cache_keys_t k;

    memset(&k, 0, sizeof(k));
    k.blob = keys;
    k.key_size = 8;
    k.count = n;
    return kvd_cache_lookup(cli, cache, &k, lease, 60000, out);
}

static uint64_t *key_range(uint64_t base, uint32_t n)
{
    uint64_t *k = malloc(n * sizeof(*k));

    for (uint32_t i = 0; i < n; i++)
        k[i] = base + i;
    return k;
}

/* ---- leases ------------------------------------------------------------------------------ */

START_TEST(test_leases_counted)
{
    const char *extra[] = {"--max-client-memory", "4M", "--max-leases", "4096", NULL};
    enum { N = 16384, MAXL = 200 };
    kvt_daemon_t d;
    kvd_client_t *cli, *other;
    kvt_pool_t p;
    kvd_cache_lookup_result_t res;
    uint64_t cache, *keys = key_range(1000, N), leases[MAXL], before;
    kvd_status_t st = KVD_OK;
    int n = 0;

    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    KVT_OK(NULL, kvd_client_create(d.socket, "leaser", &cli));
    KVT_OK(NULL, kvd_client_create(d.socket, "other", &other));
    cache = cache_make(cli, "leased", N);
    kvt_pool_make(cli, &p, "lp", 1, N, BLOCK, true, 1);
    save_chain(cli, cache, p.info.id, 1000, N, 0);
    before = host_kind(cli, "leases");
    ck_assert_uint_eq(before, 0);

    /* a lease of 16,384 blocks holds 64 KiB: 4 MiB is spent in about 60 */
    while (n < MAXL && (st = lookup(cli, cache, keys, N, true, &res)) == KVD_OK) {
        ck_assert_uint_eq(res.hits, N);
        leases[n++] = res.lease;
    }
    ck_assert_msg(st == KVD_ELIMIT, "after %d leases: %s", n, kvd_err_name(st));
    ck_assert_msg(strstr(kvd_client_last_error(cli), "max-client-memory") != NULL, "%s",
                  kvd_client_last_error(cli));
    ck_assert_int_ge(n, 30);
    ck_assert_int_le(n, 64);
    ck_assert_uint_ge(host_kind(cli, "leases"), (uint64_t)n * N * 4);
    ck_assert_uint_le(host_kind(cli, "leases"), (uint64_t)n * (N * 4 + 256));
    /* another client has its own limit */
    KVT_OK(other, lookup(other, cache, keys, N, true, &res));
    ck_assert_uint_ne(res.lease, 0);
    KVT_OK(other, kvd_cache_release(other, res.lease));
    for (int i = 0; i < n; i++)
        KVT_OK(cli, kvd_cache_release(cli, leases[i]));
    ck_assert_uint_eq(host_kind(cli, "leases"), 0);
    ck_assert_uint_eq(host_kind(cli, "requests"), 0);
    /* and the limit has room again */
    KVT_OK(cli, lookup(cli, cache, keys, N, true, &res));
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli); /* its lease ends with it */
    ck_assert_uint_eq(host_kind(other, "leases"), 0);
    kvd_client_destroy(&other);
    free(keys);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

/* ---- decoding ------------------------------------------------------------------------------ */

/* The daemon's peak RSS (VmHWM) is within PEAK_RSS_BOUND of hwm0. */
static void peak_rss_bounded(pid_t pid, uint64_t hwm0)
{
    uint64_t hwm = kvt_proc_bytes(pid, "VmHWM:");

    ck_assert_msg(hwm < hwm0 + PEAK_RSS_BOUND, "peak RSS grew by %" PRIu64 " MiB",
                  (uint64_t)((hwm - hwm0) / MiB));
}

/* Send a lookup whose CacheKeys is keys (consumed) as request id; the
 * reply must be want, its message holding word. */
static void lookup_raw(int fd, uint64_t id, uint64_t cache, wbuf_t *keys, uint32_t want,
                       const char *word)
{
    wbuf_t body = {0};
    char msg[300];
    uint64_t rid;
    uint32_t st;

    put_tag(&body, 1, 0);
    put_varint(&body, cache);
    put_sub(&body, 2, keys);
    send_request(fd, id, 64, &body);
    recv_reply(fd, &rid, &st, msg, sizeof(msg));
    ck_assert_uint_eq(rid, id);
    ck_assert_msg(st == want, "request %" PRIu64 ": %s (%s), want %s", id,
                  kvd_err_name((int)st), msg, kvd_err_name((int)want));
    if (word != NULL)
        ck_assert_msg(strstr(msg, word) != NULL, "'%s' lacks '%s'", msg, word);
}

START_TEST(test_decode_bounded)
{
    kvt_daemon_t d;
    kvd_client_t *cli;
    kvt_pool_t p;
    wbuf_t keys = {0}, body = {0}, idx = {0};
    uint64_t cache, hwm0, rid;
    uint32_t st, i;
    char msg[300];
    int fd;

    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", NULL, (int)KVT_MS(10000)), 0);
    KVT_OK(NULL, kvd_client_create(d.socket, "setup", &cli));
    cache = cache_make(cli, "decoded", 1024);
    kvt_pool_make(cli, &p, "dp", 1, 1024, BLOCK, true, 1);
    fd = raw_client(d.socket);
    raw_ping(fd, 2);
    hwm0 = kvt_proc_bytes(d.pid, "VmHWM:");

    /* 16 MiB of one-byte keys (5.5 million): refused from the wire */
    keys_list(&keys, 5500000, 1);
    lookup_raw(fd, 3, cache, &keys, KVD_ELIMIT, "at most 65536");
    peak_rss_bounded(d.pid, hwm0);
    raw_ping(fd, 4); /* the connection goes on */
    /* a million 8-byte keys */
    keys_list(&keys, 1000000, 8);
    lookup_raw(fd, 5, cache, &keys, KVD_ELIMIT, "at most 65536");
    /* a save naming 16 million pages, packed: past max-inline-bytes */
    put_tag(&body, 1, 0);
    put_varint(&body, cache);
    put_tag(&body, 2, 0);
    put_varint(&body, p.info.id);
    keys_list(&keys, 1, 8);
    put_sub(&body, 3, &keys);
    {
        wbuf_t vals = {0};
        for (i = 0; i < 16000000; i++)
            put_varint(&vals, i & 0x7f);
        put_sub(&idx, 1, &vals);
    }
    put_sub(&body, 4, &idx);
    send_request(fd, 6, 65, &body);
    recv_reply(fd, &rid, &st, msg, sizeof(msg));
    ck_assert_uint_eq(rid, 6);
    ck_assert_msg(st == KVD_ELIMIT && strstr(msg, "max-inline-bytes"), "%s: %s",
                  kvd_err_name((int)st), msg);
    /* the most a lookup may name: 65,536 one-byte keys, decoded and run */
    keys_list(&keys, 65536, 1);
    lookup_raw(fd, 7, cache, &keys, KVD_OK, NULL);
    raw_ping(fd, 8);
    /* a frame of the maximum size costs a small multiple of itself: its
     * read buffer, and no decoding past the measure */
    peak_rss_bounded(d.pid, hwm0);
    printf("decoding: peak RSS +%.1f MiB over frames of up to 16 MiB\n",
           (double)(kvt_proc_bytes(d.pid, "VmHWM:") - hwm0) / MiB);
    ck_assert_uint_eq(host_kind(cli, "requests"), 0);
    close(fd);
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

/* A message field given twice, and a oneof given twice, are refused whole
 * (protobuf-c would merge the copies, allocating anew for each). */
START_TEST(test_decode_duplicates_refused)
{
    kvt_daemon_t d;
    wbuf_t body = {0}, keys = {0};
    char msg[300];
    uint64_t rid;
    uint32_t st;
    int fd;

    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", NULL, (int)KVT_MS(10000)), 0);
    fd = raw_client(d.socket);
    put_tag(&body, 1, 0);
    put_varint(&body, 1);
    keys_list(&keys, 4, 8);
    put_sub(&body, 2, &keys);
    keys_list(&keys, 4, 8);
    put_sub(&body, 2, &keys);
    send_request(fd, 9, 64, &body);
    recv_reply(fd, &rid, &st, msg, sizeof(msg));
    ck_assert_uint_eq(rid, 9);
    ck_assert_msg(st == KVD_EINVAL && strstr(msg, "twice"), "%s: %s", kvd_err_name((int)st),
                  msg);
    raw_ping(fd, 10);
    close(fd);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

/* ---- the loop ------------------------------------------------------------------------------ */

/* 2,000 chains of 100 blocks (200,000 blocks), then 100 keys evicted, each
 * a chain's last block: the evict is timed by its own round trip, which
 * must not grow with the blocks the cache holds. */
START_TEST(test_evict_cost)
{
    enum { CHAINS = 2000, LEN = 100 };
    kvt_daemon_t d;
    kvd_client_t *cli;
    kvt_pool_t p;
    kvd_cache_evict_result_t ev;
    kvd_cache_keys_t k;
    uint64_t cache, tails[100];
    int64_t t0, dt;

    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", NULL, (int)KVT_MS(10000)), 0);
    KVT_OK(NULL, kvd_client_create(d.socket, "evictor", &cli));
    cache = cache_make(cli, "big", CHAINS * LEN);
    kvt_pool_make(cli, &p, "ep", 1, LEN, BLOCK, true, 1);
    for (uint32_t c = 0; c < CHAINS; c++)
        save_chain(cli, cache, p.info.id, (uint64_t)c << 20, LEN, 0);
    for (int i = 0; i < 100; i++)
        tails[i] = ((uint64_t)(i * 7) << 20) + LEN - 1;
    memset(&k, 0, sizeof(k));
    k.blob = tails;
    k.key_size = 8;
    k.count = 100;
    t0 = kvt_now_ms();
    KVT_OK(cli, kvd_cache_evict(cli, cache, &k, false, &ev));
    dt = kvt_now_ms() - t0;
    ck_assert_uint_eq(ev.evicted, 100);
    printf("evict: 100 keys of 200,000 blocks in %" PRId64 " ms (round trip)\n", dt);
    ck_assert_msg(dt <= KVT_MS(20), "evicting 100 blocks of 200,000 took %" PRId64 " ms", dt);
    /* a chain's first key takes the whole chain, and only it */
    tails[0] = (uint64_t)1 << 20;
    k.count = 1;
    KVT_OK(cli, kvd_cache_evict(cli, cache, &k, false, &ev));
    ck_assert_uint_eq(ev.evicted, LEN);
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

typedef struct pinger {
    const char *sock;
    volatile int stop;
    int64_t worst_us;
    uint32_t n;
    int64_t lat[100000];
} pinger_t;

static void *ping_loop(void *arg)
{
    pinger_t *pg = arg;
    kvd_client_t *cli = NULL;

    if (kvd_client_create(pg->sock, "pinger", &cli) != KVD_OK)
        return NULL;
    while (!pg->stop && pg->n < 100000) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (kvd_ping(cli, NULL, 0) != KVD_OK)
            break;
        clock_gettime(CLOCK_MONOTONIC, &b);
        pg->lat[pg->n++] = (b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000;
        usleep(200);
    }
    kvd_client_destroy(&cli);
    return NULL;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return x < y ? -1 : x > y;
}

/* Stop pg's thread t and check its pings: none waited half as long as
 * quickest (us), the quickest of the operations timed beside them
 * (what: which they were, for the report). */
static void pinger_check(pinger_t *pg, pthread_t t, int64_t quickest, const char *what)
{
    int64_t p99;

    pg->stop = 1;
    pthread_join(t, NULL);
    ck_assert_uint_ge(pg->n, 20);
    qsort(pg->lat, pg->n, sizeof(pg->lat[0]), cmp_i64);
    p99 = pg->lat[pg->n * 99 / 100];
    printf("%s: ping p50 %" PRId64 " us, p99 %" PRId64 " us, max %" PRId64 " us over %u "
           "pings (the quickest of them: %" PRId64 " us)\n", what, pg->lat[pg->n / 2], p99,
           pg->lat[pg->n - 1], pg->n, quickest);
    ck_assert_msg(pg->lat[pg->n - 1] < quickest / 2, "%s: a ping waited %" PRId64 " us, the "
                  "quickest of them took %" PRId64 " us (p50 %" PRId64 " us, p99 %" PRId64
                  " us over %u pings)", what, pg->lat[pg->n - 1], quickest, pg->lat[pg->n / 2],
                  p99, pg->n);
}

/* Another client makes and drops host pools of 1 GiB while a pinger pings
 * every 200 us: a pool's pages are made and unmapped off the loop, so no
 * ping waits for one.  Were they made on the loop, the ping sent as a
 * make or drop began would wait about as long as it takes; the bound is
 * half the quickest of them, which a loaded machine stretches alike. */
START_TEST(test_pools_off_loop)
{
    const char *extra[] = {"--host-memory-budget", "1536M", NULL};
    kvt_daemon_t d;
    kvd_client_t *cli;
    pinger_t *pg = calloc(1, sizeof(*pg));
    pthread_t t;
    int64_t quickest = INT64_MAX; /* us */

    ck_assert_ptr_nonnull(pg);
    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    KVT_OK(NULL, kvd_client_create(d.socket, "maker", &cli));
    pg->sock = d.socket;
    ck_assert_int_eq(pthread_create(&t, NULL, ping_loop, pg), 0);
    for (int i = 0; i < 3; i++) {
        kvd_pool_spec_t s;
        kvd_pool_info_t info;
        char name[32];

        memset(&s, 0, sizeof(s));
        snprintf(name, sizeof(name), "big-%d", i);
        s.name = name;
        s.kind = KVD_MEM_HOST;
        s.num_layers = 1;
        s.num_slots = 64 * 1024;
        s.slot_bytes = 8192; /* K and V: 1 GiB */
        int64_t t0 = kvt_now_ms(), made, dropped;
        KVT_OK(cli, kvd_pool_create(cli, &s, &info));
        made = (kvt_now_ms() - t0) * 1000;
        ck_assert_uint_ge(host_kind(cli, "pools"), 1024 * MiB);
        t0 = kvt_now_ms();
        KVT_OK(cli, kvd_pool_drop(cli, info.id, NULL));
        dropped = (kvt_now_ms() - t0) * 1000;
        /* the drop answers once the memory is gone: the budget is free */
        ck_assert_uint_eq(host_kind(cli, "pools"), 0);
        quickest = made < quickest ? made : quickest;
        quickest = dropped < quickest ? dropped : quickest;
    }
    pinger_check(pg, t, quickest, "3 host pools of 1 GiB made and dropped");
    kvd_client_destroy(&cli);
    free(pg);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

/* The same for a cache's first slab (1 GiB): the first save into each new
 * cache waits while it is made, and the pinger's pings do not; the bound
 * is half the quickest such save or drop of the cache. */
START_TEST(test_cache_slab_off_loop)
{
    const char *extra[] = {"--host-memory-budget", "1536M", NULL};
    const uint32_t block = 16384, blocks = 65536; /* one slab of 1 GiB */
    kvt_daemon_t d;
    kvd_client_t *cli;
    kvt_pool_t p;
    pinger_t *pg = calloc(1, sizeof(*pg));
    pthread_t t;
    int64_t quickest = INT64_MAX; /* us */

    ck_assert_ptr_nonnull(pg);
    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    KVT_OK(NULL, kvd_client_create(d.socket, "saver", &cli));
    kvt_pool_make(cli, &p, "sp", 1, 2, block, true, 1);
    pg->sock = d.socket;
    ck_assert_int_eq(pthread_create(&t, NULL, ping_loop, pg), 0);
    for (int i = 0; i < 3; i++) {
        char name[32];
        uint64_t id;
        int64_t t0, saved, dropped;

        snprintf(name, sizeof(name), "fresh-%d", i);
        id = cache_make_of(cli, name, blocks, block);
        ck_assert_uint_eq(host_kind(cli, "cache"), 0); /* nothing until it is used */
        t0 = kvt_now_ms();
        save_chain(cli, id, p.info.id, 1, 2, 0);
        saved = (kvt_now_ms() - t0) * 1000;
        ck_assert_uint_ge(host_kind(cli, "cache"), (uint64_t)blocks * block);
        t0 = kvt_now_ms();
        KVT_OK(cli, kvd_cache_drop(cli, id, NULL));
        dropped = (kvt_now_ms() - t0) * 1000;
        ck_assert_uint_eq(host_kind(cli, "cache"), 0); /* gone when the drop answers */
        quickest = saved < quickest ? saved : quickest;
        quickest = dropped < quickest ? dropped : quickest;
    }
    pinger_check(pg, t, quickest, "3 caches' first saves (a slab of 1 GiB each) and drops");
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
    free(pg);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

/* A slab the operating system refuses (the daemon's address space capped
 * under it with RLIMIT_AS): the save that waited for it is answered
 * ENOMEM with the reason, once; the daemon stays up and its budget gets
 * the slab's bytes back; once the cap is lifted the next save makes the
 * slab and stores every block. */
START_TEST(test_cache_slab_refused)
{
    const char *extra[] = {"--host-memory-budget", "1G", NULL};
    const uint32_t block = 8192, blocks = 65536; /* a first slab of 512 MiB */
    struct rlimit before, capped;
    kvt_daemon_t d;
    kvd_client_t *cli;
    kvt_pool_t p;
    uint64_t small, big, cache_before;
    kvd_status_t st;

    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    KVT_OK(NULL, kvd_client_create(d.socket, "refused", &cli));
    kvt_pool_make(cli, &p, "rp", 1, 2, block, true, 1);
    /* a first slab made on the thread pool: its threads are there before
     * the cap (a thread the cap refused would end the daemon) */
    small = cache_make_of(cli, "small", 16, block);
    save_chain(cli, small, p.info.id, 1, 2, 0);
    cache_before = host_kind(cli, "cache");
    big = cache_make_of(cli, "big", blocks, block);
    ck_assert_int_eq(prlimit(d.pid, RLIMIT_AS, NULL, &before), 0);
    capped = before;
    capped.rlim_cur = kvt_proc_bytes(d.pid, "VmSize:") + (128u << 20);
    ck_assert_int_eq(prlimit(d.pid, RLIMIT_AS, &capped, NULL), 0);
    st = save_chain_st(cli, big, p.info.id, 100, 2, 0);
    ck_assert_msg(st == KVD_ENOMEM, "save under the cap: %s: %s", kvd_err_name(st),
                  kvd_client_last_error(cli));
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(cli), "could not be made"));
    ck_assert_uint_eq(host_kind(cli, "cache"), cache_before);
    KVT_OK(cli, kvd_ping(cli, NULL, 0));
    /* the small cache still serves */
    save_chain(cli, small, p.info.id, 3, 2, 2);
    ck_assert_int_eq(prlimit(d.pid, RLIMIT_AS, &before, NULL), 0);
    save_chain(cli, big, p.info.id, 100, 2, 0);
    ck_assert_uint_ge(host_kind(cli, "cache"), cache_before + (uint64_t)blocks * block);
    KVT_OK(cli, kvd_cache_drop(cli, big, NULL));
    KVT_OK(cli, kvd_cache_drop(cli, small, NULL));
    ck_assert_uint_eq(host_kind(cli, "cache"), 0);
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

/* Saves that each reach past the slabs made so far (8-byte blocks: slabs
 * of 65,536) wait for the next slab and store every block, the first save
 * into the new cache included. */
START_TEST(test_save_across_slabs)
{
    const char *extra[] = {"--host-memory-budget", "256M", NULL};
    const uint32_t big = 65536;
    kvt_daemon_t d;
    kvd_client_t *cli;
    kvt_pool_t p;
    kvd_cache_lookup_result_t res;
    uint64_t cache, *keys;

    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    KVT_OK(NULL, kvd_client_create(d.socket, "across", &cli));
    cache = cache_make(cli, "across", 3 * big);
    kvt_pool_make(cli, &p, "ap", 1, big, BLOCK, true, 1);
    save_chain(cli, cache, p.info.id, 1, 1000, 0); /* stored: every one */
    save_chain(cli, cache, p.info.id, 1001, big, 1000);
    save_chain(cli, cache, p.info.id, 1001 + big, big, 1000 + big);
    for (uint32_t part = 0; part < 2; part++) {
        keys = key_range(1001 + (uint64_t)part * big, big);
        KVT_OK(cli, lookup(cli, cache, keys, big, false, &res));
        ck_assert_uint_eq(res.hits, big);
        free(keys);
    }
    ck_assert_uint_ge(host_kind(cli, "cache"), 3ull * big * BLOCK);
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

/* A lookup that finds a block twice in its chain is refused. */
START_TEST(test_lookup_repeated_key)
{
    kvt_daemon_t d;
    kvd_client_t *cli;
    kvt_pool_t p;
    kvd_cache_lookup_result_t res;
    uint64_t cache, keys[3] = {500, 501, 500};

    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", NULL, (int)KVT_MS(10000)), 0);
    KVT_OK(NULL, kvd_client_create(d.socket, "twice", &cli));
    cache = cache_make(cli, "twice", 16);
    kvt_pool_make(cli, &p, "tp", 1, 16, BLOCK, true, 1);
    save_chain(cli, cache, p.info.id, 500, 2, 0);
    KVT_OK(cli, lookup(cli, cache, keys, 2, false, &res));
    ck_assert_uint_eq(res.hits, 2);
    KVT_ERR(cli, lookup(cli, cache, keys, 3, true, &res), KVD_EINVAL);
    ck_assert_uint_eq(host_kind(cli, "leases"), 0);
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

/* A cache shared with a group admits a member by supplementary group (the
 * groups the client had when it connected), not by its primary one only. */
static int groups_child(const char *sock, uint64_t ok_cache, uint64_t other_cache)
{
    const gid_t g = 4242;
    const uint64_t keys[2] = {900, 901};
    kvd_client_t *cli = NULL;
    kvd_cache_lookup_result_t res;

    if (setgroups(1, &g) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
        return 10;
    if (kvd_client_create(sock, "member", &cli) != KVD_OK)
        return 11;
    if (lookup(cli, ok_cache, keys, 2, false, &res) != KVD_OK || res.hits != 2)
        return 12;
    if (lookup(cli, other_cache, keys, 2, false, &res) != KVD_EPERM)
        return 13;
    kvd_client_destroy(&cli);
    return 0;
}

START_TEST(test_cache_supplementary_groups)
{
    const char *extra[] = {"--socket-group", "65534", "--allow-uids", "65534", NULL};
    kvt_daemon_t d;
    kvd_client_t *cli;
    kvt_pool_t p;
    kvd_cache_spec_t s;
    kvd_cache_info_t info;
    uint64_t member, other;
    pid_t pid;
    int status;

    if (geteuid() != 0) {
        kvt_skip_case("test_cache_supplementary_groups", "needs root to run a client as "
                      "nobody with a supplementary group");
        return;
    }
    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    ck_assert_int_eq(chmod(d.dir, 0711), 0); /* nobody may reach the socket */
    KVT_OK(NULL, kvd_client_create(d.socket, "owner", &cli));
    memset(&s, 0, sizeof(s));
    s.layout.num_layers = 1;
    s.layout.mla = true;
    s.layout.tokens_per_block = 1;
    s.layout.token_bytes = BLOCK;
    snprintf(s.layout.dtype, sizeof(s.layout.dtype), "u8");
    s.budget_bytes = 16 * BLOCK;
    s.shared = true;
    s.num_allow_gids = 1;
    s.name = "members";
    s.allow_gids = (const uint32_t[]){4242};
    KVT_OK(cli, kvd_cache_create(cli, &s, &info));
    member = info.id;
    s.name = "others";
    s.allow_gids = (const uint32_t[]){4243};
    KVT_OK(cli, kvd_cache_create(cli, &s, &info));
    other = info.id;
    kvt_pool_make(cli, &p, "gp", 1, 16, BLOCK, true, 1);
    save_chain(cli, member, p.info.id, 900, 2, 0);
    save_chain(cli, other, p.info.id, 900, 2, 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(groups_child(d.socket, member, other));
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "as nobody in group 4242, step %d went otherwise", WEXITSTATUS(status));
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

/* ---- under load ----------------------------------------------------------------------- */

#define LOAD_CLIENTS 64
#define LOAD_TOKEN 64u /* bytes of a block here */
#define LOAD_PAGES 32

typedef struct worker {
    kvd_client_t *cli;
    kvt_pool_t pool;
    uint64_t cache;
    int64_t deadline_ms;
    uint64_t rng;
    uint64_t ops, loaded, checked;
    char error[256];
} worker_t;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Key j of chain family f; a block's bytes follow from its key. */
static uint64_t load_key(uint64_t f, uint32_t j)
{
    return f << 16 | j;
}

static uint8_t *load_page(const worker_t *w, uint32_t pg)
{
    return kvt_page(&w->pool, pg, 0, false);
}

static int load_check(worker_t *w, const uint64_t *keys, uint32_t n)
{
    uint8_t want[LOAD_TOKEN];

    for (uint32_t i = 0; i < n; i++) {
        kvt_fill(want, LOAD_TOKEN, keys[i]);
        if (memcmp(load_page(w, i), want, LOAD_TOKEN) != 0) {
            snprintf(w->error, sizeof(w->error), "block of key %" PRIx64 " loaded wrong",
                     keys[i]);
            return -1;
        }
        w->checked++;
    }
    w->loaded += n;
    return 0;
}

#define WORKER_FAIL(w, what, st)                                                                  \
    do {                                                                                          \
        snprintf((w)->error, sizeof((w)->error), "%s: %s: %s", what, kvd_err_name(st),            \
                 kvd_client_last_error((w)->cli));                                                \
        return NULL;                                                                              \
    } while (0)

static void *load_worker(void *arg)
{
    worker_t *w = arg;
    uint64_t keys[LOAD_PAGES];
    int64_t pages[LOAD_PAGES];

    for (uint32_t i = 0; i < LOAD_PAGES; i++)
        pages[i] = i;
    while (kvt_now_ms() < w->deadline_ms) {
        uint64_t f = rnd(&w->rng) % 256, r = rnd(&w->rng) % 100;
        uint32_t n = 1 + (uint32_t)(rnd(&w->rng) % LOAD_PAGES);
        kvd_cache_keys_t k = {.blob = keys, .key_size = 8, .count = n};
        kvd_status_t st;

        for (uint32_t i = 0; i < n; i++)
            keys[i] = load_key(f, i);
        w->ops++;
        if (r < 35) { /* save the chain's first n blocks */
            kvd_cache_save_t a = {.cache = w->cache, .pool = w->pool.info.id, .keys = k,
                                  .blocks = {.values = pages, .count = n,
                                             .dtype = KVD_DTYPE_I64}};
            kvd_op_result_t res;
            for (uint32_t i = 0; i < n; i++)
                kvt_fill(load_page(w, i), LOAD_TOKEN, keys[i]);
            st = kvd_cache_save(w->cli, &a, NULL, &res);
            if (st != KVD_OK && st != KVD_EBUSY)
                WORKER_FAIL(w, "save", st);
        } else if (r < 60) { /* leased lookup, then a load by the lease */
            kvd_cache_lookup_result_t lr;
            st = kvd_cache_lookup(w->cli, w->cache, &k, true, 10000, &lr);
            if (st != KVD_OK)
                WORKER_FAIL(w, "lookup", st);
            if (lr.lease != 0) {
                kvd_cache_load_t a = {.cache = w->cache, .pool = w->pool.info.id,
                                      .lease = lr.lease,
                                      .blocks = {.values = pages, .count = lr.local_hits,
                                                 .dtype = KVD_DTYPE_I64}};
                kvd_op_result_t res;
                memset(load_page(w, 0), 0, (size_t)LOAD_PAGES * w->pool.info.slot_stride);
                if (r < 55) {
                    st = kvd_cache_load(w->cli, &a, NULL, &res);
                    if (st != KVD_OK)
                        WORKER_FAIL(w, "load by lease", st);
                    if (load_check(w, keys, lr.local_hits) != 0)
                        return NULL;
                } else if ((st = kvd_cache_release(w->cli, lr.lease)) != KVD_OK) {
                    WORKER_FAIL(w, "release", st);
                }
            }
        } else if (r < 80) { /* load by keys: whole, or ENOENT when evicted meanwhile */
            kvd_cache_load_t a = {.cache = w->cache, .pool = w->pool.info.id, .keys = k,
                                  .blocks = {.values = pages, .count = n,
                                             .dtype = KVD_DTYPE_I64}};
            kvd_op_result_t res;
            st = kvd_cache_load(w->cli, &a, NULL, &res);
            if (st == KVD_OK && load_check(w, keys, n) != 0)
                return NULL;
            if (st != KVD_OK && st != KVD_ENOENT)
                WORKER_FAIL(w, "load", st);
        } else if (r < 92) { /* evict one key (and what follows it) */
            kvd_cache_evict_result_t ev;
            k.blob = &keys[rnd(&w->rng) % n];
            k.count = 1;
            if ((st = kvd_cache_evict(w->cli, w->cache, &k, false, &ev)) != KVD_OK)
                WORKER_FAIL(w, "evict", st);
        } else { /* a small host pool made and dropped */
            kvd_pool_spec_t sp = {.name = "churn", .kind = KVD_MEM_HOST, .num_layers = 1,
                                  .num_slots = 256, .slot_bytes = 2048};
            kvd_pool_info_t pi;
            if ((st = kvd_pool_create(w->cli, &sp, &pi)) != KVD_OK)
                WORKER_FAIL(w, "pool create", st);
            if ((st = kvd_pool_drop(w->cli, pi.id, NULL)) != KVD_OK)
                WORKER_FAIL(w, "pool drop", st);
        }
    }
    return NULL;
}

/* 64 clients mix saves, leased lookups, loads, evicts and pool churn on one
 * shared cache for KVD_LOAD_SECONDS (default 60); every loaded byte is
 * checked, the budget's kinds add up to its total throughout, and once
 * the clients and the cache are gone the budget is back where it began. */
START_TEST(test_accounting_under_load)
{
    const char *extra[] = {"--host-memory-budget", "1G", NULL};
    const char *env = getenv("KVD_LOAD_SECONDS");
    int secs = env != NULL && atoi(env) > 0 ? atoi(env) : 60;
    kvt_daemon_t d;
    kvd_client_t *owner;
    kvd_cache_spec_t s;
    kvd_cache_info_t info;
    worker_t *w = calloc(LOAD_CLIENTS, sizeof(*w));
    pthread_t t[LOAD_CLIENTS];
    uint64_t used0, ops = 0, checked = 0;
    kvd_daemon_status_t ds;
    int64_t end;

    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    KVT_OK(NULL, kvd_client_create(d.socket, "owner", &owner));
    KVT_OK(owner, kvd_daemon_status(owner, &ds, NULL, 0));
    used0 = ds.host_used;
    memset(&s, 0, sizeof(s));
    s.name = "load";
    s.layout.num_layers = 1;
    s.layout.mla = true;
    s.layout.tokens_per_block = 1;
    s.layout.token_bytes = LOAD_TOKEN;
    snprintf(s.layout.dtype, sizeof(s.layout.dtype), "u8");
    s.budget_bytes = 3000 * LOAD_TOKEN; /* under the 8,192 blocks asked for: evictions */
    s.shared = true;
    KVT_OK(owner, kvd_cache_create(owner, &s, &info));
    for (int i = 0; i < LOAD_CLIENTS; i++) {
        char name[32];
        snprintf(name, sizeof(name), "load-%d", i);
        KVT_OK(NULL, kvd_client_create(d.socket, name, &w[i].cli));
        kvt_pool_make(w[i].cli, &w[i].pool, "load", 1, LOAD_PAGES, LOAD_TOKEN, true, 1);
        w[i].cache = info.id;
        w[i].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        w[i].deadline_ms = kvt_now_ms() + secs * 1000;
    }
    for (int i = 0; i < LOAD_CLIENTS; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, load_worker, &w[i]), 0);
    while (kvt_now_ms() < w[0].deadline_ms) {
        /* the kinds add up to the total at every moment (host_kind checks) */
        (void)host_kind(owner, "requests");
        usleep(500 * 1000);
    }
    for (int i = 0; i < LOAD_CLIENTS; i++) {
        pthread_join(t[i], NULL);
        ck_assert_msg(w[i].error[0] == '\0', "client %d: %s", i, w[i].error);
        ops += w[i].ops;
        checked += w[i].checked;
    }
    ck_assert_uint_gt(ops, 64 * 10);
    ck_assert_uint_gt(checked, 0);
    printf("accounting under load: %d clients, %" PRIu64 " operations, %" PRIu64
           " loaded blocks checked in %d s\n", LOAD_CLIENTS, ops, checked, secs);
    for (int i = 0; i < LOAD_CLIENTS; i++) {
        kvd_mapping_destroy(&w[i].pool.map);
        kvd_client_destroy(&w[i].cli); /* its pools and leases go with it */
    }
    KVT_OK(owner, kvd_cache_drop(owner, info.id, NULL));
    /* pools of clients gone are released off the loop: soon, not at once */
    end = kvt_now_ms() + KVT_MS(10000);
    do {
        KVT_OK(owner, kvd_daemon_status(owner, &ds, NULL, 0));
    } while (ds.host_used != used0 && kvt_now_ms() < end && usleep(20000) == 0);
    ck_assert_uint_eq(ds.host_used, used0);
    ck_assert_uint_eq(host_kind(owner, "leases"), 0);
    ck_assert_uint_eq(host_kind(owner, "requests"), 0);
    kvd_client_destroy(&owner);
    free(w);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

static Suite *budget_suite(void)
{
    Suite *s = suite_create("budget");
    TCase *tc = tcase_create("budget");

    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_leases_counted);
    tcase_add_test(tc, test_decode_bounded);
    tcase_add_test(tc, test_decode_duplicates_refused);
    tcase_add_test(tc, test_evict_cost);
    tcase_add_test(tc, test_pools_off_loop);
    tcase_add_test(tc, test_cache_slab_off_loop);
    tcase_add_test(tc, test_save_across_slabs);
    tcase_add_test(tc, test_cache_slab_refused);
    tcase_add_test(tc, test_lookup_repeated_key);
    tcase_add_test(tc, test_cache_supplementary_groups);
    tcase_add_test(tc, test_accounting_under_load);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(budget_suite());
    int failed;

    signal(SIGPIPE, SIG_IGN);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
