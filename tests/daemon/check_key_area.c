/*
 * A connection's key area against the real kvdockd, with raw frames: the
 * area's memfd (its size, its seals), its bounds and charge, and every
 * bad reference to it refused with EINVAL and a reason, the daemon fine
 * after; random references, and a client scribbling over the area while
 * its lookups run, never hurt the daemon.  A small socket allowance or
 * client limit sizes the area down, or refuses it, so that it never
 * starves the receive buffers or the client's requests.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define AREA_DEFAULT (1u << 20)
#define KEY 32

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Ask for an area of bytes on fd: the reply (freed by the caller) and the
 * memfd (-1 when none came). */
static Kvdock__Response *area_ask(int fd, uint64_t bytes, int *memfd)
{
    Kvdock__Request req;
    Kvdock__CacheKeyArea m = KVDOCK__CACHE_KEY_AREA__INIT;
    int fds[4], nfds = 0;
    Kvdock__Response *r;

    kvdt_req_init(&req, 5);
    m.bytes = bytes;
    req.op_case = KVDOCK__REQUEST__OP_CACHE_KEY_AREA;
    req.cache_key_area = &m;
    r = kvdt_call_fds(fd, &req, NULL, 0, fds, &nfds);
    ck_assert_ptr_nonnull(r);
    *memfd = nfds > 0 ? fds[0] : -1;
    for (int i = 1; i < nfds; i++)
        close(fds[i]);
    return r;
}

/* An area of the default size on fd, mapped here. */
static uint8_t *area_map(int fd, uint64_t *bytes)
{
    int memfd;
    Kvdock__Response *r = area_ask(fd, 0, &memfd);
    void *p;

    ck_assert_msg(r->status == 0, "cache_key_area: %s", r->message);
    ck_assert_int_eq(r->result_case, KVDOCK__RESPONSE__RESULT_CACHE_KEY_AREA);
    *bytes = r->cache_key_area->bytes;
    ck_assert_int_ge(memfd, 0);
    p = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    ck_assert_ptr_ne(p, MAP_FAILED);
    close(memfd);
    kvdock__response__free_unpacked(r, NULL);
    return p;
}

static uint64_t cache_create(int fd, const char *name)
{
    Kvdock__Request req;
    Kvdock__CacheCreate m = KVDOCK__CACHE_CREATE__INIT;
    Kvdock__CacheLayout l = KVDOCK__CACHE_LAYOUT__INIT;
    Kvdock__Response *r;
    uint64_t id;

    l.num_layers = 1;
    l.tokens_per_block = 1;
    l.token_bytes = 16;
    l.dtype = "bf16";
    m.name = (char *)name;
    m.layout = &l;
    m.budget_bytes = 1 << 20;
    kvdt_req_init(&req, 6);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_CREATE;
    req.cache_create = &m;
    r = kvdt_call(fd, &req);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->status == 0, "cache_create: %s", r->message);
    id = r->cache->id;
    kvdock__response__free_unpacked(r, NULL);
    return id;
}

/* A lookup of the chain at (offset, count, width) in fd's area, or with a
 * blob too when blob is set: the reply (freed by the caller). */
static Kvdock__Response *area_lookup(int fd, uint64_t cache, uint64_t offset, uint32_t count,
                                     uint32_t width, int blob)
{
    static uint8_t b[KEY];
    Kvdock__Request req;
    Kvdock__CacheLookup lk = KVDOCK__CACHE_LOOKUP__INIT;
    Kvdock__CacheKeys ck = KVDOCK__CACHE_KEYS__INIT;
    Kvdock__KeyAreaRef ref = KVDOCK__KEY_AREA_REF__INIT;
    Kvdock__Response *r;

    ref.offset = offset;
    ref.count = count;
    ck.area = &ref;
    ck.key_size = width;
    if (blob) {
        ck.blob.data = b;
        ck.blob.len = sizeof(b);
    }
    lk.cache = cache;
    lk.keys = &ck;
    kvdt_req_init(&req, 7);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_LOOKUP;
    req.cache_lookup = &lk;
    r = kvdt_call(fd, &req);
    ck_assert_ptr_nonnull(r);
    return r;
}

/* An eviction of the chain at (offset, count, width) in fd's area (every
 * key read, unlike a lookup whose first key misses): its status. */
static uint32_t area_evict(int fd, uint64_t cache, uint64_t offset, uint32_t count,
                           uint32_t width)
{
    Kvdock__Request req;
    Kvdock__CacheEvict ev = KVDOCK__CACHE_EVICT__INIT;
    Kvdock__CacheKeys ck = KVDOCK__CACHE_KEYS__INIT;
    Kvdock__KeyAreaRef ref = KVDOCK__KEY_AREA_REF__INIT;
    Kvdock__Response *r;
    uint32_t st;

    ref.offset = offset;
    ref.count = count;
    ck.area = &ref;
    ck.key_size = width;
    ev.cache = cache;
    ev.keys = &ck;
    kvdt_req_init(&req, 8);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_EVICT;
    req.cache_evict = &ev;
    r = kvdt_call(fd, &req);
    ck_assert_ptr_nonnull(r);
    st = r->status;
    if (st == 0)
        ck_assert_uint_eq(r->cache_evict->missing, count);
    kvdock__response__free_unpacked(r, NULL);
    return st;
}

/* The lookup's status; with want EINVAL, its message must hold why. */
static void expect(int fd, uint64_t cache, uint64_t offset, uint32_t count, uint32_t width,
                   int blob, uint32_t want, const char *why)
{
    Kvdock__Response *r = area_lookup(fd, cache, offset, count, width, blob);

    ck_assert_msg(r->status == want, "offset %" PRIu64 " count %u width %u: status %u, "
                  "expected %u (%s)", offset, count, width, r->status, want, r->message);
    if (why != NULL)
        ck_assert_msg(r->message != NULL && strstr(r->message, why) != NULL,
                      "message \"%s\" lacks \"%s\"", r->message, why);
    kvdock__response__free_unpacked(r, NULL);
}

/* The "sockets" kind of the host-memory budget: its use, or (refused) its
 * reservations refused. */
static uint64_t sockets_figure(int fd, int refused)
{
    Kvdock__StatusReply *s = kvdt_status(fd);
    uint64_t v = 0;

    ck_assert_ptr_nonnull(s->host_memory);
    for (size_t i = 0; i < s->host_memory->n_kinds; i++)
        if (strcmp(s->host_memory->kinds[i]->kind, "sockets") == 0)
            v = refused ? s->host_memory->kinds[i]->refused : s->host_memory->kinds[i]->used;
    kvdock__status_reply__free_unpacked(s, NULL);
    return v;
}

static uint64_t sockets_used(int fd)
{
    return sockets_figure(fd, 0);
}

/* The figure once it stays put for 5 ms: a reply the daemon has written
 * stays counted until its writer frees it, which with I/O threads may be
 * after the client has read it and another thread has answered fd. */
static uint64_t sockets_settled(int fd)
{
    uint64_t v = sockets_used(fd), prev;
    int i = 0;

    do {
        prev = v;
        usleep(5000);
        v = sockets_used(fd);
    } while (v != prev && ++i < 200);
    return v;
}

START_TEST(test_area_made_and_charged)
{
    kvdt_daemon_t d;
    int fd, other, memfd, seals;
    uint64_t bytes, base;
    struct stat st;
    Kvdock__Response *r;

    kvdt_start(&d, NULL);
    fd = kvdt_client(&d, "area");
    other = kvdt_client(&d, "watcher");
    base = sockets_settled(other);

    /* sizes out of bounds */
    r = area_ask(fd, 4095, &memfd);
    ck_assert_uint_eq(r->status, KVD_EINVAL);
    ck_assert_int_eq(memfd, -1);
    kvdock__response__free_unpacked(r, NULL);
    r = area_ask(fd, (4u << 20) + 1, &memfd);
    ck_assert_uint_eq(r->status, KVD_EINVAL);
    kvdock__response__free_unpacked(r, NULL);

    /* the default: 1 MiB, sealed against shrinking and growing */
    r = area_ask(fd, 0, &memfd);
    ck_assert_msg(r->status == 0, "%s", r->message);
    ck_assert_uint_eq(r->cache_key_area->bytes, AREA_DEFAULT);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_int_ge(memfd, 0);
    ck_assert_int_eq(fstat(memfd, &st), 0);
    ck_assert_int_eq(st.st_size, AREA_DEFAULT);
    seals = fcntl(memfd, F_GET_SEALS);
    ck_assert(seals & F_SEAL_SHRINK);
    ck_assert(seals & F_SEAL_GROW);
    ck_assert_int_ne(ftruncate(memfd, 4096), 0);
    close(memfd);
    ck_assert_uint_ge(sockets_used(other), base + AREA_DEFAULT);

    /* one per connection */
    r = area_ask(fd, 0, &memfd);
    ck_assert_uint_eq(r->status, KVD_EEXIST);
    ck_assert_int_eq(memfd, -1);
    kvdock__response__free_unpacked(r, NULL);

    /* a size rounds up to whole pages */
    {
        int fd2 = kvdt_client(&d, "paged");

        r = area_ask(fd2, 5000, &memfd);
        ck_assert_msg(r->status == 0, "%s", r->message);
        ck_assert_uint_eq(r->cache_key_area->bytes % (uint64_t)sysconf(_SC_PAGESIZE), 0);
        ck_assert_uint_ge(r->cache_key_area->bytes, 5000);
        kvdock__response__free_unpacked(r, NULL);
        close(memfd);
        close(fd2);
    }

    /* the charge goes with the connection */
    close(fd);
    for (int i = 0; i < 200 && sockets_used(other) > base; i++)
        usleep(10000);
    ck_assert_uint_eq(sockets_used(other), base);
    ck_assert(kvdt_ping_ok(other));
    close(other);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    (void)bytes;
}
END_TEST

/* The two lowest descriptor numbers pid has free. */
/* An area whose reply cannot carry its descriptor: the daemon's
 * descriptor limit lowered (prlimit) so that the memfd takes the last
 * number it may use and the send path's dup of it fails.  The ask fails
 * saying why, the area is released (the "sockets" figure back where it
 * was), and once the limit is back the same connection's next ask gets an
 * area, not EEXIST. */
START_TEST(test_area_reply_unsent)
{
    kvdt_daemon_t d;
    int fd, other, memfd, f0 = -1, f1 = -1, i;
    uint64_t base;
    struct rlimit before, low;
    Kvdock__Response *r;

    kvdt_start(&d, NULL);
    fd = kvdt_client(&d, "area");
    other = kvdt_client(&d, "watcher");
    ck_assert(kvdt_ping_ok(fd));
    base = sockets_settled(other);

    ck_assert_int_eq(prlimit(d.pid, RLIMIT_NOFILE, NULL, &before), 0);
    kvdt_free_fds(d.pid, &f0, &f1);
    low = before;
    low.rlim_cur = (rlim_t)f1; /* the memfd gets f0; a dup would need f1 */
    ck_assert_msg(prlimit(d.pid, RLIMIT_NOFILE, &low, NULL) == 0, "prlimit: %s",
                  strerror(errno));
    r = area_ask(fd, 0, &memfd);
    ck_assert_int_eq(prlimit(d.pid, RLIMIT_NOFILE, &before, NULL), 0);
    ck_assert_msg(r->status == KVD_ELIMIT, "status %u (%s), expected ELIMIT", r->status,
                  r->message);
    ck_assert_msg(strstr(r->message, "descriptor") != NULL, "%s", r->message);
    ck_assert_int_eq(memfd, -1);
    ck_assert_int_ne(r->result_case, KVDOCK__RESPONSE__RESULT_CACHE_KEY_AREA);
    kvdock__response__free_unpacked(r, NULL);
    for (i = 0; i < 200 && sockets_used(other) != base; i++)
        usleep(10000);
    ck_assert_uint_eq(sockets_used(other), base);

    /* the limit back: the same connection gets its area */
    r = area_ask(fd, 0, &memfd);
    ck_assert_msg(r->status == 0, "second ask: status %u (%s)", r->status, r->message);
    ck_assert_uint_eq(r->cache_key_area->bytes, AREA_DEFAULT);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_int_ge(memfd, 0);
    close(memfd);
    ck_assert_uint_ge(sockets_used(other), base + AREA_DEFAULT);
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
    close(other);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

START_TEST(test_bad_references)
{
    kvdt_daemon_t d;
    int fd, plain;
    uint64_t cache, bytes;
    uint8_t *area;

    kvdt_start(&d, NULL);
    fd = kvdt_client(&d, "area");
    plain = kvdt_client(&d, "plain");
    cache = cache_create(fd, "bad-refs");

    /* no area on this connection */
    expect(plain, cache, 0, 10, KEY, 0, KVD_EINVAL, "no key area");
    ck_assert(kvdt_ping_ok(plain));

    area = area_map(fd, &bytes);
    memset(area, 0x5a, bytes);
    for (uint64_t i = 0; i < bytes / KEY; i++)
        memcpy(area + i * KEY, &i, sizeof(i)); /* distinct keys */

    /* good ones: the last key, and the whole area */
    expect(fd, cache, bytes - KEY, 1, KEY, 0, 0, NULL);
    expect(fd, cache, 0, (uint32_t)(bytes / KEY), KEY, 0, 0, NULL);
    /* past the end: offset, one byte over, count overflow */
    expect(fd, cache, bytes, 1, KEY, 0, KVD_EINVAL, "pass the area's end");
    expect(fd, cache, bytes - KEY + 1, 1, KEY, 0, KVD_EINVAL, "pass the area's end");
    expect(fd, cache, 0, (uint32_t)(bytes / KEY) + 1, KEY, 0, KVD_EINVAL, "pass the area's end");
    expect(fd, cache, 64, UINT32_MAX, 64, 0, KVD_EINVAL, "pass the area's end");
    expect(fd, cache, UINT64_MAX, 1, 1, 0, KVD_EINVAL, "pass the area's end");
    expect(fd, cache, UINT64_MAX - 63, 2, 64, 0, KVD_EINVAL, "pass the area's end");
    /* widths and counts */
    expect(fd, cache, 0, 10, 0, 0, KVD_EINVAL, "key_size 0");
    expect(fd, cache, 0, 10, 65, 0, KVD_EINVAL, "key_size 65");
    expect(fd, cache, 0, 0, KEY, 0, KVD_EINVAL, "count is 0");
    /* a reference with a blob too */
    expect(fd, cache, 0, 10, KEY, 1, KVD_EINVAL, "excludes");
    /* more keys than a request takes, inside the area */
    expect(fd, cache, 0, 65537, 1, 0, KVD_ELIMIT, "at most");
    /* keys of one byte, all alike: the first misses, so 0 hits */
    expect(fd, cache, bytes - 64, 64, 1, 0, 0, NULL);

    ck_assert(kvdt_ping_ok(fd));
    ck_assert(kvdt_ping_ok(plain));
    close(plain);
    close(fd);
    munmap(area, bytes);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

/* Random references: each answered with the status the rules give. */
START_TEST(test_random_references)
{
    kvdt_daemon_t d;
    int fd;
    uint64_t cache, bytes, rng = 0xC0FFEE;
    uint8_t *area;

    kvdt_start(&d, NULL);
    fd = kvdt_client(&d, "fuzz");
    cache = cache_create(fd, "fuzz");
    area = area_map(fd, &bytes);
    for (int round = 0; round < 3000; round++) {
        uint64_t v = rng_next(&rng), offset;
        uint32_t width = (uint32_t)(rng_next(&rng) % 70), count, want;

        switch (v % 4) {
        case 0:
            offset = rng_next(&rng) % (2 * bytes);
            break;
        case 1:
            offset = UINT64_MAX - rng_next(&rng) % 4096;
            break;
        default:
            offset = rng_next(&rng) % bytes;
            break;
        }
        switch ((v >> 8) % 4) {
        case 0:
            count = (uint32_t)rng_next(&rng);
            break;
        case 1:
            count = (uint32_t)(rng_next(&rng) % 70000);
            break;
        default:
            count = (uint32_t)(rng_next(&rng) % 2000);
            break;
        }
        for (int i = 0; i < 64; i++)
            area[rng_next(&rng) % bytes] = (uint8_t)v;
        if (width < 1 || width > 64 || count == 0 || offset > bytes ||
            (uint64_t)count * width > bytes - offset)
            want = KVD_EINVAL;
        else if (count > 65536)
            want = KVD_ELIMIT;
        else
            want = 0; /* an empty cache: the first key misses */
        if (round % 4 == 0 && want != KVD_ELIMIT) {
            uint32_t got = area_evict(fd, cache, offset, count, width);

            /* keys named twice are refused too: random bytes may repeat */
            ck_assert_msg(got == want || (want == 0 && got == KVD_EINVAL),
                          "evict at %" PRIu64 " count %u width %u: %u, expected %u", offset,
                          count, width, got, want);
        } else {
            expect(fd, cache, offset, count, width, 0, want, NULL);
        }
    }
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
    munmap(area, bytes);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

typedef struct scribbler {
    uint8_t *area;
    uint64_t bytes;
    atomic_int stop;
} scribbler_t;

static void *scribble(void *arg)
{
    scribbler_t *s = arg;
    uint64_t rng = 99;

    while (!atomic_load(&s->stop))
        for (int i = 0; i < 4096; i++)
            s->area[rng_next(&rng) % s->bytes] = (uint8_t)rng;
    return NULL;
}

/* The client changes the area while the daemon reads chains from it: the
 * answers may be anything a chain could give, the daemon stays well. */
START_TEST(test_area_changed_while_read)
{
    kvdt_daemon_t d;
    int fd;
    uint64_t cache;
    scribbler_t s;
    pthread_t t;

    kvdt_start(&d, NULL);
    fd = kvdt_client(&d, "scribbler");
    cache = cache_create(fd, "scribbled");
    s.area = area_map(fd, &s.bytes);
    atomic_init(&s.stop, 0);
    ck_assert_int_eq(pthread_create(&t, NULL, scribble, &s), 0);
    for (int round = 0; round < 1000; round++) {
        uint64_t offset = (uint64_t)(round % 64) * KEY;
        uint32_t count = (uint32_t)(s.bytes / KEY) - 64, st;

        if (round % 2 == 0) {
            Kvdock__Response *r = area_lookup(fd, cache, offset, count, KEY, 0);

            st = r->status;
            kvdock__response__free_unpacked(r, NULL);
        } else {
            st = area_evict(fd, cache, offset, count, KEY);
        }
        /* EINVAL: the scribbles made two keys alike */
        ck_assert_msg(st == 0 || st == KVD_EINVAL, "status %u", st);
    }
    atomic_store(&s.stop, 1);
    pthread_join(t, NULL);
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
    munmap(s.area, s.bytes);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

/* A ping of bytes bytes of payload on fd: its status (the echo checked). */
static uint32_t big_ping(int fd, size_t bytes)
{
    Kvdock__Request req;
    Kvdock__Ping pg = KVDOCK__PING__INIT;
    Kvdock__Response *r;
    uint8_t *payload = malloc(bytes);
    uint32_t st;

    ck_assert_ptr_nonnull(payload);
    memset(payload, 0x5a, bytes);
    kvdt_req_init(&req, 9);
    pg.payload.data = payload;
    pg.payload.len = bytes;
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &pg;
    r = kvdt_call(fd, &req);
    free(payload);
    if (r == NULL)
        return UINT32_MAX; /* the daemon closed the connection */
    st = r->status;
    if (st == 0)
        ck_assert_uint_eq(r->pong->payload.len, bytes);
    kvdock__response__free_unpacked(r, NULL);
    return st;
}

/* At the smallest socket allowance (--max-socket-buffer-bytes 1M) the
 * default area is sized to a quarter of it, the next client's area is
 * refused (ELIMIT, naming the option) until the first one's connection
 * closes, and a frame of half the allowance still finds a receive buffer
 * (an area of the whole allowance would leave it none). */
START_TEST(test_area_fits_socket_allowance)
{
    const char *const extra[] = {"--max-socket-buffer-bytes", "1M", NULL};
    kvdt_daemon_t d;
    int a, b, memfd, i;
    uint64_t refused;
    struct stat st;
    Kvdock__Response *r;

    kvdt_start(&d, extra);
    a = kvdt_client(&d, "a");
    b = kvdt_client(&d, "b");
    r = area_ask(a, 0, &memfd);
    ck_assert_msg(r->status == 0, "%s", r->message);
    ck_assert_uint_eq(r->cache_key_area->bytes, 256u << 10);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_int_ge(memfd, 0);
    ck_assert_int_eq(fstat(memfd, &st), 0);
    ck_assert_int_eq(st.st_size, 256 << 10);
    close(memfd);

    refused = sockets_figure(b, 1);
    r = area_ask(b, 4096, &memfd);
    ck_assert_uint_eq(r->status, KVD_ELIMIT);
    ck_assert_int_eq(memfd, -1);
    ck_assert_msg(strstr(r->message, "max-socket-buffer-bytes") != NULL, "%s", r->message);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(sockets_figure(b, 1), refused + 1); /* kvdock status shows it */

    ck_assert_uint_eq(big_ping(a, 512u << 10), 0);
    ck_assert_uint_eq(big_ping(b, 512u << 10), 0);

    /* the share comes back with the connection */
    close(a);
    for (i = 0; i < 200; i++) {
        r = area_ask(b, 0, &memfd);
        if (r->status == 0)
            break;
        ck_assert_uint_eq(r->status, KVD_ELIMIT);
        kvdock__response__free_unpacked(r, NULL);
        usleep(10000);
    }
    ck_assert_int_lt(i, 200);
    ck_assert_uint_eq(r->cache_key_area->bytes, 256u << 10);
    kvdock__response__free_unpacked(r, NULL);
    close(memfd);
    close(b);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

/* A client limit of 1 MiB (--max-client-memory): an area asked for at
 * 4 MiB takes at most half of what the client may hold, and the client's
 * requests keep the rest. */
START_TEST(test_area_fits_client_limit)
{
    const char *const extra[] = {"--max-client-memory", "1M", NULL};
    kvdt_daemon_t d;
    int fd, memfd;
    uint64_t bytes;
    struct stat st;
    Kvdock__Response *r;

    kvdt_start(&d, extra);
    fd = kvdt_client(&d, "limited");
    r = area_ask(fd, 4u << 20, &memfd);
    ck_assert_msg(r->status == 0, "%s", r->message);
    bytes = r->cache_key_area->bytes;
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_uint_le(bytes, 512u << 10);
    ck_assert_uint_ge(bytes, 256u << 10);
    ck_assert_uint_eq(bytes % (uint64_t)sysconf(_SC_PAGESIZE), 0);
    ck_assert_int_eq(fstat(memfd, &st), 0);
    ck_assert_uint_eq((uint64_t)st.st_size, bytes);
    close(memfd);
    ck_assert_uint_eq(big_ping(fd, 256u << 10), 0);
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

static Suite *key_area_suite(void)
{
    Suite *s = suite_create("key_area");
    TCase *tc = tcase_create("key_area");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_area_made_and_charged);
    tcase_add_test(tc, test_area_reply_unsent);
    tcase_add_test(tc, test_bad_references);
    tcase_add_test(tc, test_random_references);
    tcase_add_test(tc, test_area_changed_while_read);
    tcase_add_test(tc, test_area_fits_socket_allowance);
    tcase_add_test(tc, test_area_fits_client_limit);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(key_area_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
