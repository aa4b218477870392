/*
 * check_exhaustion: resource attacks by an allowed client, against the
 * real kvdockd (cpu backend).  Each test sends the attack and checks that
 * the daemon refuses it with its own status, keeps nothing it refused, and
 * goes on serving everyone else:
 *
 * - host memory: a pool, a buffer and a sum of pools past the budget, and
 *   a pool past what the machine has (budget larger than the machine); the
 *   daemons run under RLIMIT_FSIZE, so a broken check could not reserve
 *   the memory anyway;
 * - descriptors: 100 clients against a daemon limited to 64 descriptors;
 * - deadlines: half-sent frames and silent connections holding every
 *   client slot; a slow but steady client is not cut off;
 * - buffered bytes: 64 connections each holding a nearly whole frame of
 *   the maximum size.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_proc.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* utime + stime of pid, in clock ticks. */
static uint64_t cpu_ticks(pid_t pid)
{
    char path[64], buf[1024], *p;
    unsigned long long ut = 0, st = 0;
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')'); /* the command name may hold spaces */
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                            &st), 2);
    return ut + st;
}

/* Lines of the daemon's log that hold needle. */
static int log_count(const kvdt_daemon_t *d, const char *needle)
{
    char line[1024];
    int n = 0;
    FILE *f = fopen(d->log, "r");

    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static Kvdock__Response *pool_create(int fd, const char *name, uint32_t layers, uint64_t slots,
                                     uint64_t slot_bytes)
{
    Kvdock__Request req;
    Kvdock__PoolCreate pc = KVDOCK__POOL_CREATE__INIT;

    kvdt_req_init(&req, 7);
    req.op_case = KVDOCK__REQUEST__OP_POOL_CREATE;
    req.pool_create = &pc;
    pc.name = (char *)name;
    pc.kind = KVDOCK__MEM_KIND__MEM_HOST;
    pc.num_layers = layers;
    pc.num_slots = slots;
    pc.slot_bytes = slot_bytes;
    return kvdt_call(fd, &req);
}

/* Create, expect status want (and, if given, a message holding each of
 * words); the pool id when created. */
static uint64_t expect_pool(int fd, const char *name, uint32_t layers, uint64_t slots,
                            uint64_t slot_bytes, int want, const char *w1, const char *w2)
{
    Kvdock__Response *r = pool_create(fd, name, layers, slots, slot_bytes);
    uint64_t id = 0;

    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->status == (uint32_t)want, "pool %s: %s (%s), want %s", name,
                  kvd_err_name((int)r->status), r->message, kvd_err_name(want));
    if (w1)
        ck_assert_msg(strstr(r->message, w1), "pool %s: '%s' lacks '%s'", name, r->message, w1);
    if (w2)
        ck_assert_msg(strstr(r->message, w2), "pool %s: '%s' lacks '%s'", name, r->message, w2);
    if (r->status == KVD_OK)
        id = r->pool->id;
    kvdock__response__free_unpacked(r, NULL);
    return id;
}

static uint64_t host_used(int fd, const char *kind)
{
    Kvdock__StatusReply *s = kvdt_status(fd);
    uint64_t v = 0;
    size_t i;

    ck_assert_ptr_nonnull(s->host_memory);
    if (kind == NULL) {
        v = s->host_memory->used;
    } else {
        for (i = 0; i < s->host_memory->n_kinds; i++)
            if (strcmp(s->host_memory->kinds[i]->kind, kind) == 0)
                v = s->host_memory->kinds[i]->used;
    }
    kvdock__status_reply__free_unpacked(s, NULL);
    return v;
}

static int status_of_buffer(int fd, uint64_t bytes)
{
    Kvdock__Request req;
    Kvdock__BufferRegister br = KVDOCK__BUFFER_REGISTER__INIT;

    kvdt_req_init(&req, 8);
    req.op_case = KVDOCK__REQUEST__OP_BUFFER_REGISTER;
    req.buffer_register = &br;
    br.kind = KVDOCK__MEM_KIND__MEM_HOST;
    br.bytes = bytes;
    return kvdt_status_of(fd, &req);
}

static void drop_pool(int fd, uint64_t id)
{
    Kvdock__Request req;
    Kvdock__PoolDrop pd = KVDOCK__POOL_DROP__INIT;

    kvdt_req_init(&req, 9);
    req.op_case = KVDOCK__REQUEST__OP_POOL_DROP;
    req.pool_drop = &pd;
    pd.pool = id;
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_OK);
}

/* ---- host memory ---------------------------------------------------------- */

START_TEST(test_budget)
{
    const char *args[] = {"--host-memory-budget", "64M", NULL};
    kvdt_daemon_t d;
    uint64_t used0, shm0, a, b;
    int c, y;

    /* no memfd the daemon makes can pass 256 MiB, whatever it decides */
    kvdt_set_limits(0, 256 * MiB);
    kvdt_start(&d, args);
    c = kvdt_client(&d, "attacker");
    y = kvdt_client(&d, "bystander");
    used0 = host_used(c, NULL);
    shm0 = kvt_proc_bytes(d.pid, "RssShmem:");

    /* the request that once had the OOM killer end 37 processes: 64 GiB */
    expect_pool(c, "huge", 1, 1u << 20, 32768, KVD_ELIMIT, "64.0 GiB requested",
                "of a 64.0 MiB host-memory budget");
    expect_pool(c, "petabyte", 1, 1ull << 35, 16384, KVD_ELIMIT, "1.0 PiB requested", NULL);
    ck_assert_int_eq(status_of_buffer(c, 100 * MiB), KVD_ELIMIT);
    ck_assert_uint_eq(host_used(c, NULL), used0);
    ck_assert_uint_le(kvt_proc_bytes(d.pid, "RssShmem:"), shm0 + MiB);
    ck_assert(kvdt_ping_ok(y));

    /* a sum of pools: 24 MiB each (2 x 1536 slots x 8 KiB), 64 MiB budget */
    a = expect_pool(c, "a", 1, 1536, 8192, KVD_OK, NULL, NULL);
    b = expect_pool(c, "b", 1, 1536, 8192, KVD_OK, NULL, NULL);
    ck_assert_uint_eq(host_used(c, "pools"), 48 * MiB);
    expect_pool(y, "c", 1, 1536, 8192, KVD_ELIMIT, "24.0 MiB requested", "16.0 MiB left");
    ck_assert_int_eq(status_of_buffer(y, 17 * MiB), KVD_ELIMIT);
    ck_assert_uint_eq(host_used(c, "pools"), 48 * MiB);
    ck_assert(kvdt_ping_ok(y));
    drop_pool(c, a);
    ck_assert_uint_ne(expect_pool(y, "c", 1, 1536, 8192, KVD_OK, NULL, NULL), 0);
    ck_assert_int_eq(status_of_buffer(y, 16 * MiB), KVD_OK);
    (void)b;
    close(c);
    close(y);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    kvdt_set_limits(0, 0);
}
END_TEST

/* A buffer whose reply cannot carry its descriptor: the daemon's
 * descriptor limit lowered (prlimit) so that the buffer's memfd takes the
 * last number it may use and the send path's dup of it fails.  The
 * register is ELIMIT, and the buffer, whose id the client never learned,
 * is gone at once: its host memory is back, and under --max-buffers 1 the
 * same client's next register succeeds. */
START_TEST(test_buffer_reply_unsent)
{
    const char *args[] = {"--host-memory-budget", "64M", "--max-buffers", "1", NULL};
    kvdt_daemon_t d;
    struct rlimit before, low;
    int c, y, f0 = -1, f1 = -1, st, i;

    kvdt_set_limits(0, 256 * MiB);
    kvdt_start(&d, args);
    c = kvdt_client(&d, "buffers");
    y = kvdt_client(&d, "watcher");
    ck_assert_uint_eq(host_used(y, "buffers"), 0);

    ck_assert_int_eq(prlimit(d.pid, RLIMIT_NOFILE, NULL, &before), 0);
    kvdt_free_fds(d.pid, &f0, &f1);
    low = before;
    low.rlim_cur = (rlim_t)f1; /* the memfd gets f0; a dup would need f1 */
    ck_assert_msg(prlimit(d.pid, RLIMIT_NOFILE, &low, NULL) == 0, "prlimit: %s", strerror(errno));
    st = status_of_buffer(c, 16 * MiB);
    ck_assert_int_eq(prlimit(d.pid, RLIMIT_NOFILE, &before, NULL), 0);
    ck_assert_msg(st == KVD_ELIMIT, "status %s, expected ELIMIT", kvd_err_name(st));
    for (i = 0; i < 200 && host_used(y, "buffers") != 0; i++)
        usleep(10000);
    ck_assert_uint_eq(host_used(y, "buffers"), 0);

    ck_assert_int_eq(status_of_buffer(c, 16 * MiB), KVD_OK);
    ck_assert_uint_eq(host_used(y, "buffers"), 16 * MiB);
    ck_assert(kvdt_ping_ok(c));
    close(c);
    close(y);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    kvdt_set_limits(0, 0);
}
END_TEST

START_TEST(test_budget_past_machine)
{
    /* a budget larger than the machine: the machine's memory refuses */
    const char *args[] = {"--host-memory-budget", "1T", NULL};
    uint64_t total = kvt_proc_bytes(0, "MemTotal:"), slots, shm0;
    kvdt_daemon_t d;
    int c, y;

    kvdt_set_limits(0, 256 * MiB);
    kvdt_start(&d, args);
    c = kvdt_client(&d, "attacker");
    y = kvdt_client(&d, "bystander");
    shm0 = kvt_proc_bytes(d.pid, "RssShmem:");
    slots = total / 32768 + 1; /* K and V of 32 KiB: twice the machine */
    expect_pool(c, "twice-the-machine", 1, slots, 32768, KVD_ENOMEM, "available", NULL);
    ck_assert_uint_eq(host_used(c, NULL), host_used(c, NULL));
    ck_assert_uint_eq(host_used(c, "pools"), 0);
    ck_assert_uint_le(kvt_proc_bytes(d.pid, "RssShmem:"), shm0 + MiB);
    ck_assert(kvdt_ping_ok(y));
    /* within the machine and the budget it works */
    ck_assert_uint_ne(expect_pool(c, "small", 2, 1024, 4096, KVD_OK, NULL, NULL), 0);
    close(c);
    close(y);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    kvdt_set_limits(0, 0);
}
END_TEST

/* ---- descriptors ------------------------------------------------------------ */

/* Send a hello without waiting; the daemon may have refused and closed the
 * connection already (its refusal is read next). */
static void send_hello(int fd, const char *name)
{
    Kvdock__Request req;
    Kvdock__Hello h = KVDOCK__HELLO__INIT;
    uint8_t *frame;
    size_t len;

    kvdt_req_init(&req, 1);
    req.op_case = KVDOCK__REQUEST__OP_HELLO;
    req.hello = &h;
    h.protocol_version = KVD_PROTOCOL_VERSION;
    h.client_name = (char *)name;
    ck_assert_int_eq(kvd__frame_pack(&req.base, &frame, &len), KVD_OK);
    (void)send(fd, frame, len, MSG_NOSIGNAL);
    free(frame);
}

START_TEST(test_descriptors)
{
    const char *args[] = {"--max-clients", "1000", NULL};
    enum { N = 100, LATE = 30, PINGS = 50 };
    int fds[N], served[N], late[LATE], nserved = 0, nrefused = 0, nlate_refused = 0, i, j;
    uint64_t t0, t1, ticks0, ticks1, start_ms;
    long hz = sysconf(_SC_CLK_TCK);
    kvdt_daemon_t d;

    kvdt_set_limits(64, 0);
    kvdt_start(&d, args);
    start_ms = now_ms();
    /* 100 clients at once: connect all, then hello all */
    for (i = 0; i < N; i++) {
        fds[i] = kvdt_connect(d.sock);
        ck_assert_int_ge(fds[i], 0);
    }
    for (i = 0; i < N; i++)
        send_hello(fds[i], "crowd");
    for (i = 0; i < N; i++) {
        Kvdock__Response *r = kvdt_recv(fds[i], NULL, NULL, (int)KVT_MS(5000));

        ck_assert_msg(r != NULL, "client %d: neither served nor refused within %d s", i,
                      (int)KVT_MS(5));
        served[i] = r->status == KVD_OK;
        if (served[i]) {
            nserved++;
        } else {
            ck_assert_msg(r->status == KVD_ELIMIT && strstr(r->message, "file descriptor"),
                          "client %d: %s (%s)", i, kvd_err_name((int)r->status), r->message);
            ck_assert_uint_eq(r->id, 0);
            ck_assert(kvdt_closed(fds[i], (int)KVT_MS(2000)));
            nrefused++;
        }
        kvdock__response__free_unpacked(r, NULL);
    }
    fprintf(stderr, "descriptors: %d of %d clients served, %d refused (RLIMIT_NOFILE 64)\n",
            nserved, N, nrefused);
    ck_assert_int_eq(nserved + nrefused, N);
    ck_assert_int_ge(nserved, 30);
    ck_assert_int_ge(nrefused, 1);
    /* nothing is lost among those accepted: pipelined pings, all answered */
    for (i = 0; i < N; i++) {
        Kvdock__Request req;
        Kvdock__Ping p = KVDOCK__PING__INIT;

        if (!served[i])
            continue;
        for (j = 0; j < PINGS; j++) {
            kvdt_req_init(&req, 100 + (uint64_t)j);
            req.op_case = KVDOCK__REQUEST__OP_PING;
            req.ping = &p;
            kvdt_send(fds[i], &req, NULL, 0);
        }
        for (j = 0; j < PINGS; j++) {
            Kvdock__Response *r = kvdt_recv(fds[i], NULL, NULL, (int)KVT_MS(5000));
            ck_assert_msg(r != NULL && r->status == KVD_OK && r->id == 100 + (uint64_t)j,
                          "client %d: ping %d", i, j);
            kvdock__response__free_unpacked(r, NULL);
        }
    }
    /* at its limit, with clients still coming, the daemon waits idle:
     * each newcomer is refused once, no spinning */
    ticks0 = cpu_ticks(d.pid);
    t0 = now_ms();
    for (i = 0; i < LATE; i++) {
        Kvdock__Response *r;

        late[i] = kvdt_connect(d.sock);
        ck_assert_int_ge(late[i], 0);
        send_hello(late[i], "late");
        r = kvdt_recv(late[i], NULL, NULL, (int)KVT_MS(5000));
        /* served while a descriptor is free, refused once none is */
        ck_assert_msg(r != NULL && (r->status == KVD_ELIMIT || r->status == KVD_OK),
                      "late client %d: %s (%s)", i, r ? kvd_err_name((int)r->status) : "no reply",
                      r ? r->message : "");
        nlate_refused += r->status == KVD_ELIMIT;
        kvdock__response__free_unpacked(r, NULL);
        usleep(30000);
    }
    t1 = now_ms();
    ticks1 = cpu_ticks(d.pid);
    fprintf(stderr, "descriptors: daemon CPU %.1f%% of a core over %.2f s with %d of %d newcomers "
            "refused\n", 100.0 * (double)(ticks1 - ticks0) / (double)hz / ((double)(t1 - t0) / 1e3),
            (double)(t1 - t0) / 1e3, nlate_refused, LATE);
    ck_assert_int_ge(nlate_refused, LATE - 5);
    /* 10% of a core, scaled (at most half a core: a spinning loop takes all of it) */
    ck_assert_msg((double)(ticks1 - ticks0) / (double)hz <
                      (kvt_time_scale() < 5 ? 0.1 * kvt_time_scale() : 0.5) *
                          (double)(t1 - t0) / 1e3,
                  "the daemon used %" PRIu64 " ticks in %" PRIu64 " ms", ticks1 - ticks0, t1 - t0);
    /* the warnings are rate-limited: at most one line a second, plus one */
    i = log_count(&d, "event=accept_no_descriptors");
    fprintf(stderr, "descriptors: %d log lines in %.1f s\n", i, (double)(now_ms() - start_ms) / 1e3);
    ck_assert_int_ge(i, 1);
    ck_assert_int_le(i, (int)((now_ms() - start_ms) / 1000) + 2);
    /* once descriptors free up, newcomers are served */
    for (i = 0; i < N; i++)
        if (served[i])
            close(fds[i]);
    for (i = 0; i < LATE; i++)
        close(late[i]);
    usleep(100000);
    j = kvdt_client(&d, "after");
    ck_assert(kvdt_ping_ok(j));
    close(j);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    kvdt_set_limits(0, 0);
}
END_TEST

/* ---- deadlines -------------------------------------------------------------- */

START_TEST(test_half_sent_frames)
{
    const char *args[] = {"--max-clients", "20", "--frame-timeout-ms", "1000",
                          "--hello-timeout-ms", "1000", NULL};
    static const uint8_t two[2] = {0x40, 0x00};
    int held[20], i, c = -1;
    uint64_t t0, t;
    kvdt_daemon_t d;

    kvdt_start(&d, args);
    /* every slot taken: ten say hello and send two bytes of a length, ten
     * send two bytes and never say hello */
    for (i = 0; i < 20; i++) {
        held[i] = i < 10 ? kvdt_client(&d, "slowloris") : kvdt_connect(d.sock);
        ck_assert_int_ge(held[i], 0);
        kvdt_send_raw(held[i], two, sizeof(two));
    }
    t0 = now_ms();
    /* a newcomer: refused while the slots are held, served once they time out */
    for (;;) {
        Kvdock__Response *r;
        int f = kvdt_connect(d.sock);

        ck_assert_int_ge(f, 0);
        send_hello(f, "newcomer");
        r = kvdt_recv(f, NULL, NULL, (int)KVT_MS(3000));
        ck_assert_ptr_nonnull(r);
        if (r->status == KVD_OK) {
            kvdock__response__free_unpacked(r, NULL);
            c = f;
            break;
        }
        ck_assert_int_eq(r->status, KVD_ELIMIT);
        kvdock__response__free_unpacked(r, NULL);
        close(f);
        ck_assert_msg(now_ms() - t0 < (uint64_t)(1000 + KVT_MS(1000)),
                      "still refused after %" PRIu64 " ms", now_ms() - t0);
        usleep(50000);
    }
    t = now_ms() - t0;
    fprintf(stderr, "deadlines: a newcomer served %" PRIu64 " ms after 20 half-sent frames took "
            "every slot (frame and hello deadlines 1000 ms)\n", t);
    ck_assert_uint_le(t, (uint64_t)(1000 + KVT_MS(1000))); /* the deadline and a second */
    ck_assert(kvdt_ping_ok(c));
    /* each holder was told why, then closed */
    for (i = 0; i < 20; i++) {
        Kvdock__Response *r = kvdt_recv(held[i], NULL, NULL, (int)KVT_MS(3000));

        ck_assert_msg(r != NULL && r->status == KVD_ETIMEDOUT && r->id == 0, "holder %d", i);
        ck_assert_ptr_nonnull(strstr(r->message, i < 10 ? "frame-timeout-ms" : "hello-timeout-ms"));
        kvdock__response__free_unpacked(r, NULL);
        ck_assert(kvdt_closed(held[i], (int)KVT_MS(3000)));
        close(held[i]);
    }
    i = log_count(&d, "reason=\"frame timeout\"");
    ck_assert_int_eq(i, 10);
    ck_assert_int_eq(log_count(&d, "reason=\"hello timeout\""), 10);
    close(c);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

START_TEST(test_steady_client_survives)
{
    /* a client whose bytes come slowly but steadily, a frame at a time,
     * for three frame deadlines: every frame is whole in time */
    const char *args[] = {"--frame-timeout-ms", "1000", NULL};
    enum { N = 300 };
    uint8_t *stream = NULL, *frame;
    size_t len = 0, flen, off;
    uint64_t t0;
    kvdt_daemon_t d;
    int c, i;

    kvdt_start(&d, args);
    c = kvdt_client(&d, "steady");
    for (i = 0; i < N; i++) {
        Kvdock__Request req;
        Kvdock__Ping p = KVDOCK__PING__INIT;

        kvdt_req_init(&req, 1000 + (uint64_t)i);
        req.op_case = KVDOCK__REQUEST__OP_PING;
        req.ping = &p;
        ck_assert_int_eq(kvd__frame_pack(&req.base, &frame, &flen), KVD_OK);
        stream = realloc(stream, len + flen);
        memcpy(stream + len, frame, flen);
        len += flen;
        free(frame);
    }
    t0 = now_ms();
    for (off = 0; off < len; off += 7) {
        kvdt_send_raw(c, stream + off, len - off < 7 ? len - off : 7);
        usleep(8000);
    }
    for (i = 0; i < N; i++) {
        Kvdock__Response *r = kvdt_recv(c, NULL, NULL, (int)KVT_MS(5000));
        ck_assert_msg(r != NULL && r->status == KVD_OK && r->id == 1000 + (uint64_t)i,
                      "ping %d", i);
        kvdock__response__free_unpacked(r, NULL);
    }
    fprintf(stderr, "deadlines: %d frames over %.1f s in 7-byte pieces, none cut off\n", N,
            (double)(now_ms() - t0) / 1e3);
    ck_assert_uint_gt(now_ms() - t0, 2000);
    ck_assert(kvdt_ping_ok(c));
    free(stream);
    close(c);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

/* ---- buffered bytes ----------------------------------------------------------- */

/* Write len bytes, waiting at most timeout_ms: the bytes written; fewer when
 * the daemon closed the connection or stopped reading. */
static size_t write_some(int fd, const uint8_t *buf, size_t len, int timeout_ms)
{
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    size_t done = 0;

    while (done < len && now_ms() < end) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        ssize_t n;

        if (poll(&p, 1, 50) <= 0 || (p.revents & (POLLERR | POLLHUP)))
            continue;
        n = send(fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (n <= 0)
            break;
        done += (size_t)n;
    }
    return done;
}

/* How long a hoarder waits for a refusal before it counts as held: scaled
 * (KVT_MS) where the daemon runs slowly (the sanitizers, a loaded machine). */
#define REPLY_WAIT_MS 1000

START_TEST(test_buffered_bytes)
{
    /* frames held for the whole test: a timeout that freed the first ones
     * before the last arrived would keep the budget from filling on a slow
     * machine (the sanitizers) */
    const char *args[] = {"--host-memory-budget", "256M", "--max-socket-buffer-bytes", "128M",
                          "--max-frame-bytes", "16M", "--frame-timeout-ms", "120000", NULL};
    enum { N = 64 };
    const size_t payload = (16u << 20), body = payload - 1;
    int conns[N], held = 0, refused = 0, i, y;
    uint64_t rss0, rss_peak = 0, sockets_peak = 0, v;
    uint8_t *junk = malloc(body), hdr[4];
    kvdt_daemon_t d;

    ck_assert_ptr_nonnull(junk);
    memset(junk, 0x08, body);
    hdr[0] = (uint8_t)payload;
    hdr[1] = (uint8_t)(payload >> 8);
    hdr[2] = (uint8_t)(payload >> 16);
    hdr[3] = (uint8_t)(payload >> 24);
    kvdt_start(&d, args);
    y = kvdt_client(&d, "bystander");
    rss0 = kvt_proc_bytes(d.pid, "VmRSS:");
    for (i = 0; i < N; i++) {
        Kvdock__Response *r;

        conns[i] = kvdt_client(&d, "hoarder");
        kvdt_send_raw(conns[i], hdr, sizeof(hdr));
        (void)write_some(conns[i], junk, body, 3000);
        /* held, or refused: the kernel may take bytes the daemon never reads,
         * so the daemon's reply tells (late where the daemon runs slowly:
         * the sanitizers, a loaded machine) */
        r = kvdt_recv(conns[i], NULL, NULL, (int)KVT_MS(REPLY_WAIT_MS));
        if (r == NULL) {
            held++;
        } else {
            ck_assert_msg(r->status == KVD_ELIMIT && r->id == 0, "hoarder %d: %s (%s)", i,
                          kvd_err_name((int)r->status), r->message);
            ck_assert_ptr_nonnull(strstr(r->message, "max-socket-buffer-bytes"));
            kvdock__response__free_unpacked(r, NULL);
            ck_assert(kvdt_closed(conns[i], (int)KVT_MS(3000)));
            refused++;
        }
        ck_assert(kvdt_ping_ok(y));
        v = host_used(y, "sockets");
        sockets_peak = v > sockets_peak ? v : sockets_peak;
        v = kvt_proc_bytes(d.pid, "VmRSS:");
        rss_peak = v > rss_peak ? v : rss_peak;
    }
    fprintf(stderr, "buffered bytes: %d connections held a nearly whole 16 MiB frame, %d refused; "
            "socket memory peak %.1f MiB of 128 MiB; RSS %.1f -> %.1f MiB\n",
            held, refused, (double)sockets_peak / MiB, (double)rss0 / MiB, (double)rss_peak / MiB);
    ck_assert_int_ge(held, 4);
    ck_assert_int_ge(refused, N / 2);
    ck_assert_uint_le(sockets_peak, 128 * MiB);
#ifndef KVD_SANITIZED
    /* (ASan keeps freed memory in its quarantine: RSS says nothing there) */
    ck_assert_uint_le(rss_peak, rss0 + 128 * MiB + 32 * MiB);
#endif
    /* closed, the held frames' memory goes */
    for (i = 0; i < N; i++)
        close(conns[i]);
    for (i = 0; i < 100 && host_used(y, "sockets") > MiB; i++)
        usleep(50000);
    ck_assert_uint_le(host_used(y, "sockets"), MiB);
    ck_assert(kvdt_ping_ok(y));
    close(y);
    free(junk);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

static Suite *exhaustion_suite(void)
{
    Suite *s = suite_create("exhaustion");
    TCase *tc = tcase_create("attacks");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_budget);
    tcase_add_test(tc, test_budget_past_machine);
    tcase_add_test(tc, test_buffer_reply_unsent);
    tcase_add_test(tc, test_descriptors);
    tcase_add_test(tc, test_half_sent_frames);
    tcase_add_test(tc, test_steady_client_survives);
    tcase_add_test(tc, test_buffered_bytes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(exhaustion_suite());
    int failed;

    signal(SIGPIPE, SIG_IGN);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
