/*
 * check_limits: every limit of the option table, hit through the real
 * kvdockd (cpu backend), each with its own status code, and back-pressure:
 *
 *   max-frame-bytes        ETOOBIG (request id 0), that connection closed
 *   max-pools              ELIMIT  (per client)
 *   max-total-pools        ELIMIT  (all clients)
 *   max-pool-bytes         ELIMIT  (per client; pools and buffers)
 *   max-total-pool-bytes   ELIMIT  (all clients)
 *   max-buffers            ELIMIT
 *   max-inline-bytes       ELIMIT  (inline Data and inline Indices)
 *   max-clients            ELIMIT  (at connect), then closed
 *   max-inflight           no error: the daemon stops reading the client
 *                          until replies drain (a burst of 10x the limit
 *                          is answered in full; in flight never passes it)
 *   max-write-queue-bytes  no error: a client that does not read its
 *                          replies stops being read; the daemon's memory
 *                          stays bounded, then every reply arrives
 *   reqs-per-event         a flooding client does not starve another
 *
 * A limit that was hit is released again when the objects go.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The daemon's resident memory in KiB (VmRSS). */
static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    long kib = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

/* Status of a pool create (id in *id on success). */
static int create_st(int fd, const char *name, uint32_t layers, uint64_t slots,
                     uint64_t slot_bytes, uint64_t *id, char *msg, size_t msg_len)
{
    Kvdock__Request req;
    Kvdock__PoolCreate pc = KVDOCK__POOL_CREATE__INIT;
    Kvdock__Response *r;
    int st;

    kvdt_req_init(&req, 30);
    pc.name = (char *)name;
    pc.kind = KVDOCK__MEM_KIND__MEM_HOST;
    pc.num_layers = layers;
    pc.num_slots = slots;
    pc.slot_bytes = slot_bytes;
    req.op_case = KVDOCK__REQUEST__OP_POOL_CREATE;
    req.pool_create = &pc;
    r = kvdt_call(fd, &req);
    ck_assert_ptr_nonnull(r);
    st = (int)r->status;
    if (st == 0 && id)
        *id = r->pool->id;
    if (msg)
        snprintf(msg, msg_len, "%s", r->message);
    kvdock__response__free_unpacked(r, NULL);
    return st;
}

/* Import a sealed 4 KiB memfd as a 1-layer MLA pool of 4 x 8 bytes: its
 * status, with the message in msg. */
static int import_st(int fd, const char *name, char *msg, size_t msg_len)
{
    Kvdock__Request req;
    Kvdock__PoolImport pi = KVDOCK__POOL_IMPORT__INIT;
    Kvdock__ImportRegion reg = KVDOCK__IMPORT_REGION__INIT, *regs[1] = {&reg};
    Kvdock__MemRef k = KVDOCK__MEM_REF__INIT, *ks[1] = {&k};
    Kvdock__Response *r;
    int mfd = memfd_create("kvdt-limits", MFD_CLOEXEC | MFD_ALLOW_SEALING), st;

    ck_assert_int_ge(mfd, 0);
    ck_assert_int_eq(ftruncate(mfd, 4096), 0);
    ck_assert_int_eq(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    kvdt_req_init(&req, 31);
    reg.kind = KVDOCK__MEM_KIND__MEM_HOST;
    reg.bytes = 4096;
    pi.name = (char *)name;
    pi.num_layers = 1;
    pi.num_slots = 4;
    pi.slot_bytes = 8;
    pi.mla = 1;
    pi.regions = regs;
    pi.n_regions = 1;
    pi.k_layers = ks;
    pi.n_k_layers = 1;
    req.op_case = KVDOCK__REQUEST__OP_POOL_IMPORT;
    req.pool_import = &pi;
    r = kvdt_call_fds(fd, &req, &mfd, 1, NULL, NULL);
    close(mfd);
    ck_assert_ptr_nonnull(r);
    st = (int)r->status;
    if (msg)
        snprintf(msg, msg_len, "%s", r->message);
    kvdock__response__free_unpacked(r, NULL);
    return st;
}

static int drop_st(int fd, uint64_t pool)
{
    Kvdock__Request req;
    Kvdock__PoolDrop pd = KVDOCK__POOL_DROP__INIT;

    kvdt_req_init(&req, 31);
    pd.pool = pool;
    req.op_case = KVDOCK__REQUEST__OP_POOL_DROP;
    req.pool_drop = &pd;
    return kvdt_status_of(fd, &req);
}

static int buffer_st(int fd, uint64_t bytes, uint64_t *id, char *msg, size_t msg_len)
{
    Kvdock__Request req;
    Kvdock__BufferRegister br = KVDOCK__BUFFER_REGISTER__INIT;
    Kvdock__Response *r;
    int fds[4], nfds = 0, st, i;

    kvdt_req_init(&req, 32);
    br.bytes = bytes;
    br.kind = KVDOCK__MEM_KIND__MEM_HOST;
    req.op_case = KVDOCK__REQUEST__OP_BUFFER_REGISTER;
    req.buffer_register = &br;
    r = kvdt_call_fds(fd, &req, NULL, 0, fds, &nfds);
    ck_assert_ptr_nonnull(r);
    st = (int)r->status;
    if (st == 0 && id)
        *id = r->buffer->id;
    if (msg)
        snprintf(msg, msg_len, "%s", r->message);
    for (i = 0; i < nfds; i++)
        close(fds[i]);
    kvdock__response__free_unpacked(r, NULL);
    return st;
}

static int buffer_drop_st(int fd, uint64_t id)
{
    Kvdock__Request req;
    Kvdock__BufferDrop bd = KVDOCK__BUFFER_DROP__INIT;

    kvdt_req_init(&req, 33);
    bd.buffer = id;
    req.op_case = KVDOCK__REQUEST__OP_BUFFER_DROP;
    req.buffer_drop = &bd;
    return kvdt_status_of(fd, &req);
}

/* Append one packed Request frame to buf (grown as needed). */
static void append_frame(uint8_t **buf, size_t *len, size_t *cap, const Kvdock__Request *req)
{
    uint8_t *frame;
    size_t n;

    ck_assert_int_eq(kvd__frame_pack(&req->base, &frame, &n), KVD_OK);
    if (*len + n > *cap) {
        *cap = (*len + n) * 2;
        *buf = realloc(*buf, *cap);
        ck_assert_ptr_nonnull(*buf);
    }
    memcpy(*buf + *len, frame, n);
    *len += n;
    free(frame);
}

/* Send what the socket takes now, without blocking. */
static size_t send_some(int fd, const uint8_t *buf, size_t len, size_t off)
{
    while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            ck_assert_msg(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR,
                          "send: %s", strerror(errno));
            if (errno != EINTR)
                break;
            continue;
        }
        off += (size_t)n;
    }
    return off;
}

/* ---- limits that answer with a status ---------------------------------- */

START_TEST(test_hello_states_limits)
{
    kvdt_daemon_t d;
    const char *extra[] = {"--max-frame-bytes", "1M", "--max-inflight", "7", "--max-pools", "5",
                           "--max-pool-bytes", "2M", "--max-total-pool-bytes", "8M",
                           "--max-inline-bytes", "64K", "--max-total-pools", "9",
                           "--max-buffers", "11", NULL};
    Kvdock__Request req;
    Kvdock__Hello h = KVDOCK__HELLO__INIT;
    Kvdock__Response *r;
    int fd;

    kvdt_start(&d, extra);
    fd = kvdt_connect(d.sock);
    kvdt_req_init(&req, 1);
    h.protocol_version = KVD_PROTOCOL_VERSION;
    h.client_name = "limits";
    req.op_case = KVDOCK__REQUEST__OP_HELLO;
    req.hello = &h;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_uint_eq(r->hello->limits->max_frame_bytes, 1u << 20);
    ck_assert_uint_eq(r->hello->limits->max_inflight, 7);
    ck_assert_uint_eq(r->hello->limits->max_pools, 5);
    ck_assert_uint_eq(r->hello->limits->max_pool_bytes, 2u << 20);
    ck_assert_uint_eq(r->hello->limits->max_total_pool_bytes, 8u << 20);
    ck_assert_uint_eq(r->hello->limits->max_inline_bytes, 64u << 10);
    ck_assert_uint_eq(r->hello->limits->max_total_pools, 9);
    ck_assert_uint_eq(r->hello->limits->max_buffers, 11);
    kvdock__response__free_unpacked(r, NULL);
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

/* A ping whose frame payload is exactly n bytes. */
static void ping_of_size(Kvdock__Request *req, Kvdock__Ping *p, uint8_t *payload, size_t n)
{
    long len = (long)n;
    int i;

    p->payload.data = payload;
    for (i = 0; i < 8; i++) {
        size_t got;
        p->payload.len = (size_t)len;
        got = protobuf_c_message_get_packed_size(&req->base);
        if (got == n)
            return;
        len += (long)n - (long)got;
        ck_assert_int_gt(len, 0);
    }
    ck_abort_msg("no ping of %zu bytes", n);
}

START_TEST(test_max_frame_bytes)
{
    kvdt_daemon_t d;
    const char *extra[] = {"--max-frame-bytes", "4096", "--max-inline-bytes", "1024", NULL};
    static uint8_t payload[8192];
    Kvdock__Request req;
    Kvdock__Ping p = KVDOCK__PING__INIT;
    Kvdock__Response *r;
    int a, b;

    kvdt_start(&d, extra);
    a = kvdt_client(&d, "big");
    b = kvdt_client(&d, "bystander");
    kvdt_req_init(&req, 41);
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &p;
    ping_of_size(&req, &p, payload, 4096); /* exactly the maximum: served */
    r = kvdt_call(a, &req);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->status, 0);
    kvdock__response__free_unpacked(r, NULL);
    ping_of_size(&req, &p, payload, 4097); /* one byte more: refused */
    kvdt_send(a, &req, NULL, 0);
    r = kvdt_recv(a, NULL, NULL, KVDT_TIMEOUT_MS);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->status, KVD_ETOOBIG);
    ck_assert_uint_eq(r->id, 0);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_closed(a, KVDT_TIMEOUT_MS));
    ck_assert(kvdt_ping_ok(b));
    close(a);
    close(b);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

START_TEST(test_pool_counts)
{
    kvdt_daemon_t d;
    const char *extra[] = {"--max-pools", "3", "--max-total-pools", "5", NULL};
    char msg[256];
    uint64_t ids[3];
    int a, b, i;

    kvdt_start(&d, extra);
    a = kvdt_client(&d, "a");
    b = kvdt_client(&d, "b");
    for (i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof(name), "a%d", i);
        ck_assert_int_eq(create_st(a, name, 1, 4, 4, &ids[i], NULL, 0), 0);
    }
    /* per client */
    ck_assert_int_eq(create_st(a, "a3", 1, 4, 4, NULL, msg, sizeof(msg)), KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(msg, "max-pools"));
    ck_assert_int_eq(import_st(a, "a3i", msg, sizeof(msg)), KVD_ELIMIT); /* imports count */
    ck_assert_ptr_nonnull(strstr(msg, "max-pools"));
    ck_assert_int_eq(create_st(b, "b0", 1, 4, 4, NULL, NULL, 0), 0);
    ck_assert_int_eq(create_st(b, "b1", 1, 4, 4, NULL, NULL, 0), 0);
    /* all clients: b has 2 of its 3, but the daemon holds 5 */
    ck_assert_int_eq(create_st(b, "b2", 1, 4, 4, NULL, msg, sizeof(msg)), KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(msg, "max-total-pools"));
    ck_assert_int_eq(import_st(b, "b2i", msg, sizeof(msg)), KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(msg, "max-total-pools"));
    ck_assert(kvdt_ping_ok(b));
    /* released with the pool */
    ck_assert_int_eq(drop_st(a, ids[0]), 0);
    ck_assert_int_eq(create_st(b, "b2", 1, 4, 4, NULL, NULL, 0), 0);
    ck_assert_int_eq(create_st(a, "a3", 1, 4, 4, NULL, NULL, 0), KVD_ELIMIT);
    close(a);
    close(b);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

START_TEST(test_pool_bytes)
{
    /* 1 MHA layer of 64 x 256 bytes is 32 KiB with K and V */
    kvdt_daemon_t d;
    const char *extra[] = {"--max-pool-bytes", "64K", "--max-total-pool-bytes", "96K", NULL};
    Kvdock__StatusReply *s;
    char msg[256];
    uint64_t p1, p2, bf;
    int a, b, w, i;

    kvdt_start(&d, extra);
    a = kvdt_client(&d, "a");
    b = kvdt_client(&d, "b");
    w = kvdt_client(&d, "watch");
    ck_assert_int_eq(create_st(a, "a48", 1, 96, 256, &p1, NULL, 0), 0); /* 48 KiB */
    /* per client: 48 + 32 > 64 */
    ck_assert_int_eq(create_st(a, "a32", 1, 64, 256, NULL, msg, sizeof(msg)), KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(msg, "max-pool-bytes"));
    /* buffers count too */
    ck_assert_int_eq(buffer_st(a, 32 << 10, NULL, msg, sizeof(msg)), KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(msg, "max-pool-bytes"));
    ck_assert_int_eq(buffer_st(a, 16 << 10, &bf, NULL, 0), 0); /* 64 exactly */
    /* one pool larger than the whole limit */
    ck_assert_int_eq(create_st(b, "huge", 1, 1024, 1024, NULL, NULL, 0), KVD_ELIMIT);
    /* all clients: 64 + 32 = 96 fits, 32 more does not */
    ck_assert_int_eq(create_st(b, "b32", 1, 64, 256, &p2, NULL, 0), 0);
    ck_assert_int_eq(create_st(b, "b32x", 1, 64, 256, NULL, msg, sizeof(msg)), KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(msg, "max-total-pool-bytes"));
    ck_assert(kvdt_ping_ok(b));
    s = kvdt_status(w);
    ck_assert_uint_eq(s->pool_bytes, 96u << 10);
    kvdock__status_reply__free_unpacked(s, NULL);
    /* a client that goes releases its bytes */
    close(a);
    for (i = 0; i < 500; i++) {
        s = kvdt_status(w);
        if (s->pool_bytes == 32u << 10) {
            kvdock__status_reply__free_unpacked(s, NULL);
            break;
        }
        kvdock__status_reply__free_unpacked(s, NULL);
        usleep(10000);
    }
    ck_assert_int_lt(i, 500);
    ck_assert_int_eq(create_st(b, "b32x", 1, 64, 256, NULL, NULL, 0), 0);
    ck_assert_int_eq(drop_st(b, p2), 0);
    close(b);
    close(w);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

START_TEST(test_max_buffers)
{
    kvdt_daemon_t d;
    const char *extra[] = {"--max-buffers", "2", NULL};
    char msg[256];
    uint64_t b1, b2;
    int a, b;

    kvdt_start(&d, extra);
    a = kvdt_client(&d, "a");
    b = kvdt_client(&d, "b");
    ck_assert_int_eq(buffer_st(a, 4096, &b1, NULL, 0), 0);
    ck_assert_int_eq(buffer_st(a, 4096, &b2, NULL, 0), 0);
    ck_assert_int_eq(buffer_st(a, 4096, NULL, msg, sizeof(msg)), KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(msg, "max-buffers"));
    ck_assert_int_eq(buffer_st(b, 4096, NULL, NULL, 0), 0); /* per client */
    ck_assert_int_eq(buffer_drop_st(a, b1), 0);
    ck_assert_int_eq(buffer_st(a, 4096, NULL, NULL, 0), 0);
    close(a);
    close(b);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

START_TEST(test_max_inline_bytes)
{
    kvdt_daemon_t d;
    const char *extra[] = {"--max-inline-bytes", "4096", NULL};
    static int64_t loc[8193];
    static uint8_t data[2 * 4096 + 8];
    Kvdock__Request req;
    Kvdock__Store st = KVDOCK__STORE__INIT;
    Kvdock__Indices ix = KVDOCK__INDICES__INIT;
    Kvdock__Data k = KVDOCK__DATA__INIT;
    Kvdock__Response *r;
    uint64_t pool;
    int a, i;

    kvdt_start(&d, extra);
    a = kvdt_client(&d, "a");
    ck_assert_int_eq(create_st(a, "mla", 1, 1024, 8, &pool, NULL, 0), 0);
    kvdt_req_init(&req, 50);
    req.op_case = KVDOCK__REQUEST__OP_STORE;
    req.store = &st;
    st.pool = pool;
    st.loc = &ix;
    st.k = &k;
    st.v = &k;
    for (i = 0; i < 8193; i++)
        loc[i] = i;
    ix.values = loc;
    k.inline_.data = data;
    /* 512 indices (4096 bytes) and 4096 data bytes: at the limit, served */
    ix.n_values = 512;
    k.inline_.len = 4096;
    ck_assert_int_eq(kvdt_status_of(a, &req), 0);
    /* 513 indices: 4104 bytes */
    ix.n_values = 513;
    k.inline_.len = 513 * 8;
    r = kvdt_call(a, &req);
    ck_assert_uint_eq(r->status, KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(r->message, "max-inline-bytes"));
    kvdock__response__free_unpacked(r, NULL);
    /* 512 indices but 4097 data bytes */
    ix.n_values = 512;
    k.inline_.len = 4097;
    r = kvdt_call(a, &req);
    ck_assert_uint_eq(r->status, KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(r->message, "max-inline-bytes"));
    kvdock__response__free_unpacked(r, NULL);
    /* past what any request may decode to (64 KiB of one array): refused
     * as the frame is measured, the field named by its path */
    ix.n_values = 8193;
    k.inline_.len = 0;
    r = kvdt_call(a, &req);
    ck_assert_uint_eq(r->status, KVD_ELIMIT);
    ck_assert_msg(strncmp(r->message, "store.loc.values: 8193 values decode past", 41) == 0,
                  "%s", r->message);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_ping_ok(a));
    close(a);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

static int hello_status(int fd)
{
    Kvdock__Request req;
    Kvdock__Hello h = KVDOCK__HELLO__INIT;
    Kvdock__Response *r;
    uint8_t *frame;
    size_t len;
    int st;

    kvdt_req_init(&req, 5);
    h.protocol_version = KVD_PROTOCOL_VERSION;
    h.client_name = "c";
    req.op_case = KVDOCK__REQUEST__OP_HELLO;
    req.hello = &h;
    ck_assert_int_eq(kvd__frame_pack(&req.base, &frame, &len), KVD_OK);
    (void)kvd__sock_send_all(fd, frame, len, NULL, 0); /* a refused peer may be gone */
    free(frame);
    r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
    if (r == NULL)
        return -1;
    st = (int)r->status;
    kvdock__response__free_unpacked(r, NULL);
    return st;
}

START_TEST(test_max_clients)
{
    kvdt_daemon_t d;
    const char *extra[] = {"--max-clients", "2", NULL};
    int c[3], i, st;

    kvdt_start(&d, extra);
    /* the harness's start-up probe may still hold a place: retry */
    for (i = 0; i < 2; i++) {
        int tries = 0;
        for (;;) {
            c[i] = kvdt_connect(d.sock);
            ck_assert_int_ge(c[i], 0);
            st = hello_status(c[i]);
            if (st == 0)
                break;
            ck_assert_int_eq(st, KVD_ELIMIT);
            close(c[i]);
            ck_assert_int_lt(++tries, 200);
            usleep(10000);
        }
    }
    c[2] = kvdt_connect(d.sock);
    ck_assert_int_ge(c[2], 0);
    ck_assert_int_eq(hello_status(c[2]), KVD_ELIMIT);
    ck_assert(kvdt_closed(c[2], KVDT_TIMEOUT_MS));
    close(c[2]);
    ck_assert(kvdt_ping_ok(c[0]));
    /* a place that frees up is taken again */
    close(c[1]);
    for (i = 0;; i++) {
        c[2] = kvdt_connect(d.sock);
        st = hello_status(c[2]);
        if (st == 0)
            break;
        close(c[2]);
        ck_assert_int_lt(i, 200);
        usleep(10000);
    }
    ck_assert(kvdt_ping_ok(c[2]));
    close(c[0]);
    close(c[2]);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

/* ---- back-pressure ------------------------------------------------------ */

START_TEST(test_inflight_burst)
{
    /* 10x max-inflight in one burst of heavy transfers: every request is
     * answered once, with OK; the client never has more than the limit in
     * flight (the daemon stopped reading it); the daemon's memory stays
     * where it was */
    enum { LIMIT = 16, N = 10 * LIMIT, IDX = 512 };
    kvdt_daemon_t d;
    const char *extra[] = {"--max-inflight", "16", NULL};
    static int64_t src[IDX], dst[IDX];
    static uint8_t seen[N + 1];
    Kvdock__Request req;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__Indices si = KVDOCK__INDICES__INIT, di = KVDOCK__INDICES__INIT;
    uint8_t *burst = NULL;
    size_t len = 0, cap = 0, off = 0;
    uint64_t pool, deadline;
    long rss0, rss_max = 0;
    uint32_t max_seen = 0;
    int fd, mon, got = 0, i;

    kvdt_start(&d, extra);
    fd = kvdt_client(&d, "burst");
    mon = kvdt_client(&d, "monitor");
    ck_assert_int_eq(create_st(fd, "heavy", 4, 2 * IDX, 1024, &pool, NULL, 0), 0);
    for (i = 0; i < IDX; i++) {
        src[i] = i;
        dst[i] = IDX + i;
    }
    si.n_values = di.n_values = IDX;
    si.values = src;
    di.values = dst;
    t.src_pool = t.dst_pool = pool;
    t.src = &si;
    t.dst = &di;
    t.all_layers = 1;
    kvdt_req_init(&req, 100000);
    req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    req.transfer = &t;
    ck_assert_int_eq(kvdt_status_of(fd, &req), 0); /* warm: pages touched */
    rss0 = rss_kib(d.pid);
    ck_assert_int_gt(rss0, 0);
    for (i = 1; i <= N; i++) {
        req.id = (uint64_t)i;
        append_frame(&burst, &len, &cap, &req);
    }
    deadline = now_ms() + 60000;
    while (got < N) {
        struct pollfd p = {.fd = fd, .events = POLLIN | (off < len ? POLLOUT : 0)};
        Kvdock__StatusReply *s;
        size_t k;
        long rss;

        ck_assert_msg(now_ms() < deadline, "only %d of %d replies", got, N);
        ck_assert_int_ge(poll(&p, 1, 100), 0);
        if (p.revents & POLLOUT)
            off = send_some(fd, burst, len, off);
        if (p.revents & POLLIN) {
            Kvdock__Response *r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
            ck_assert_ptr_nonnull(r);
            ck_assert_msg(r->status == 0, "id %" PRIu64 ": %s", r->id, r->message);
            ck_assert_uint_ge(r->id, 1);
            ck_assert_uint_le(r->id, N);
            ck_assert_int_eq(seen[r->id], 0);
            seen[r->id] = 1;
            got++;
            kvdock__response__free_unpacked(r, NULL);
        }
        /* the monitor: this client's requests in flight */
        s = kvdt_status(mon);
        for (k = 0; k < s->n_client_list; k++)
            if (strcmp(s->client_list[k]->name, "burst") == 0 &&
                s->client_list[k]->inflight > max_seen)
                max_seen = s->client_list[k]->inflight;
        ck_assert_uint_le(s->inflight, LIMIT);
        kvdock__status_reply__free_unpacked(s, NULL);
        rss = rss_kib(d.pid);
        if (rss > rss_max)
            rss_max = rss;
    }
    fprintf(stderr, "inflight burst: %d requests (%zu bytes) answered, max in flight seen %u "
            "(limit %d), daemon RSS %ld -> max %ld KiB\n", N, len, max_seen, LIMIT, rss0,
            rss_max);
    ck_assert_uint_le(max_seen, LIMIT);
    ck_assert_uint_ge(max_seen, 1);
    ck_assert_int_lt(rss_max - rss0, 32 * 1024);
    free(burst);
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
    close(mon);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

START_TEST(test_unread_replies_bounded)
{
    /* A client that sends 48 MiB of echo requests and reads nothing: the
     * daemon stops reading it once 4 KiB of replies are queued, so little
     * of it is ever taken in and the daemon's memory stays put; another
     * client is served meanwhile; once the client reads, every reply
     * arrives, in full. */
    enum { PAYLOAD = 64 << 10, N = 768 };
    kvdt_daemon_t d;
    const char *extra[] = {"--max-write-queue-bytes", "4096", NULL};
    static uint8_t payload[PAYLOAD];
    static uint8_t seen[N + 1];
    Kvdock__Request req;
    Kvdock__Ping p = KVDOCK__PING__INIT;
    uint8_t *burst = NULL;
    size_t len = 0, cap = 0, off = 0, stalled_at;
    uint64_t last_progress, deadline;
    long rss0, rss1;
    int fd, by, got = 0, i;

    kvdt_start(&d, extra);
    fd = kvdt_client(&d, "deaf");
    by = kvdt_client(&d, "bystander");
    for (i = 0; i < PAYLOAD; i++)
        payload[i] = (uint8_t)(i * 7);
    p.payload.data = payload;
    p.payload.len = PAYLOAD;
    kvdt_req_init(&req, 0);
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &p;
    for (i = 1; i <= N; i++) {
        req.id = (uint64_t)i;
        append_frame(&burst, &len, &cap, &req);
    }
    ck_assert(kvdt_ping_ok(fd));
    rss0 = rss_kib(d.pid);
    /* send without reading until nothing more is taken for 300 ms */
    last_progress = now_ms();
    while (off < len && now_ms() - last_progress < (uint64_t)KVT_MS(300)) {
        size_t n = send_some(fd, burst, len, off);
        if (n != off)
            last_progress = now_ms();
        off = n;
        usleep(1000);
    }
    stalled_at = off;
    rss1 = rss_kib(d.pid);
    fprintf(stderr, "unread replies: the daemon took %zu of %zu bytes before it stopped reading; "
            "RSS %ld -> %ld KiB\n", stalled_at, len, rss0, rss1);
    ck_assert_uint_lt(stalled_at, 8u << 20); /* of 48 MiB offered */
    ck_assert_int_lt(rss1 - rss0, 16 * 1024);
    ck_assert(kvdt_ping_ok(by)); /* the daemon is not stuck on it */
    /* now read: everything arrives */
    deadline = now_ms() + 60000;
    while (got < N) {
        struct pollfd pf = {.fd = fd, .events = POLLIN | (off < len ? POLLOUT : 0)};

        ck_assert_msg(now_ms() < deadline, "only %d of %d replies", got, N);
        ck_assert_int_ge(poll(&pf, 1, 100), 0);
        if (pf.revents & POLLOUT)
            off = send_some(fd, burst, len, off);
        if (pf.revents & POLLIN) {
            Kvdock__Response *r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
            ck_assert_ptr_nonnull(r);
            ck_assert_uint_eq(r->status, 0);
            ck_assert_uint_ge(r->id, 1);
            ck_assert_uint_le(r->id, N);
            ck_assert_int_eq(seen[r->id], 0);
            seen[r->id] = 1;
            ck_assert_uint_eq(r->pong->payload.len, PAYLOAD);
            ck_assert_mem_eq(r->pong->payload.data, payload, PAYLOAD);
            got++;
            kvdock__response__free_unpacked(r, NULL);
        }
    }
    free(burst);
    close(fd);
    close(by);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

START_TEST(test_flood_does_not_starve)
{
    /* one client pipelines 20,000 pings; another's pings still come back
     * promptly (reqs-per-event caps what one client gets per turn) */
    enum { N = 20000 };
    kvdt_daemon_t d;
    const char *extra[] = {"--reqs-per-event", "8", NULL};
    Kvdock__Request req;
    Kvdock__Ping p = KVDOCK__PING__INIT;
    uint8_t *burst = NULL;
    size_t len = 0, cap = 0, off = 0;
    uint64_t worst = 0, deadline;
    int fd, by, got = 0, probes = 0, next_probe = 500, i;

    kvdt_start(&d, extra);
    fd = kvdt_client(&d, "flood");
    by = kvdt_client(&d, "bystander");
    kvdt_req_init(&req, 0);
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &p;
    for (i = 1; i <= N; i++) {
        req.id = (uint64_t)i;
        append_frame(&burst, &len, &cap, &req);
    }
    deadline = now_ms() + 60000;
    while (got < N) {
        struct pollfd pf = {.fd = fd, .events = POLLIN | (off < len ? POLLOUT : 0)};

        ck_assert_msg(now_ms() < deadline, "only %d of %d replies", got, N);
        ck_assert_int_ge(poll(&pf, 1, 100), 0);
        if (pf.revents & POLLOUT)
            off = send_some(fd, burst, len, off);
        if (pf.revents & POLLIN) {
            Kvdock__Response *r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
            ck_assert_ptr_nonnull(r);
            ck_assert_uint_eq(r->status, 0);
            got++;
            kvdock__response__free_unpacked(r, NULL);
        }
        if (got >= next_probe && got < N - 100) {
            next_probe += 1000;
            uint64_t t0 = now_ms();
            ck_assert(kvdt_ping_ok(by));
            if (now_ms() - t0 > worst)
                worst = now_ms() - t0;
            probes++;
        }
    }
    fprintf(stderr, "flood: %d pipelined pings; bystander's worst round trip %" PRIu64
            " ms over %d probes\n", N, worst, probes);
    ck_assert_int_ge(probes, 10);
    ck_assert_uint_lt(worst, (uint64_t)KVT_MS(2000));
    free(burst);
    close(fd);
    close(by);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

static Suite *limits_suite(void)
{
    Suite *s = suite_create("limits");
    TCase *tc = tcase_create("status");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_hello_states_limits);
    tcase_add_test(tc, test_max_frame_bytes);
    tcase_add_test(tc, test_pool_counts);
    tcase_add_test(tc, test_pool_bytes);
    tcase_add_test(tc, test_max_buffers);
    tcase_add_test(tc, test_max_inline_bytes);
    tcase_add_test(tc, test_max_clients);
    suite_add_tcase(s, tc);

    tc = tcase_create("backpressure");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, test_inflight_burst);
    tcase_add_test(tc, test_unread_replies_bounded);
    tcase_add_test(tc, test_flood_does_not_starve);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(limits_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
