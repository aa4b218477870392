/*
 * fuzz_cluster_msgs: libFuzzer target for what a peer that knows the
 * secret may send after the proof (a compromised or buggy node), read by
 * a whole kvdockd: the front door's handling of proven links
 * (daemon/cluster/door.c) and what it hands upward, serving
 * (serve.c: Query, Fetch), pulls (pull.c: QueryReply, FetchDone) and the
 * lanes' addresses (Lanes), with ASan and UBSan (tests/fuzz/run.sh).
 *
 * The daemon (cpu backend, --cluster-listen on the loopback, one
 * configured peer: this target) runs on its own thread.  The first byte
 * of an input chooses the link: even, a fresh inbound link (the target
 * connects to the front door and proves the secret, as rawpeer.c does);
 * odd, the daemon's outbound link to its configured peer (the target
 * listens there, answers the daemon's Hello and keeps that link while
 * the daemon keeps it).  The rest is records, each a 2-byte
 * little-endian length and that many bytes, sent as one frame each (the
 * frame header is the target's, so that the bytes reach the message
 * handlers and not just the framing, which fuzz_cluster covers), at most
 * MAX_RECORDS of them.  Then a
 * Ping: the daemon must answer it with its Pong, or close the link,
 * within PONG_MS; anything else (a crash, a hang) is a failure.
 *
 * KVD_FUZZ_WRITE_SEEDS=DIR: write the seed inputs into DIR and exit (the
 * build does it: build/tests/fuzz/seeds-cluster-msgs).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "cluster.pb-c.h"
#include "log.h"
#include "options.h"
#include "rawpeer.h"
#include "server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);
const char *__lsan_default_suppressions(void);

/* UCX keeps memory of its own (endpoints being made, its async thread's)
 * that LeakSanitizer cannot see held while the daemon runs on; the
 * daemon's own allocations stay checked. */
const char *__lsan_default_suppressions(void)
{
    return "leak:ucs_malloc\nleak:ucs_calloc\nleak:ucs_realloc\nleak:ucs_strdup\n"
           "leak:ucs_posix_memalign\nleak:ucs_memalign\n";
}

#define SECRET "fuzz-cluster-secret"
#define PONG_MS 10000
#define SERVE_MS 10000
/* Frames an input sends at most: the daemon answers some of them, and
 * rawpeer.c keeps 64 messages unread (later ones are dropped). */
#define MAX_RECORDS 32

static uv_loop_t loop;
static kvd__server_t *srv;
static int door_port, peer_port;
static rawpeer_t *outlink; /* the daemon's outbound link, while it lasts */
static uint64_t pings;

static void die(const char *what)
{
    fprintf(stderr, "fuzz_cluster_msgs: %s\n", what);
    abort();
}

/* A port nothing listens on now (bound, then closed). */
static int some_port(void)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) != 0)
        die("cannot find a free port");
    port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void *run_loop(void *arg)
{
    (void)arg;
    uv_run(&loop, UV_RUN_DEFAULT);
    return NULL;
}

/* ---- seeds -------------------------------------------------------------------------- */

/* A v1 worker address of UCX 1.13 (tcp over lo), as fuzz_cluster.c has it. */
static const uint8_t ucx_addr[] = {
    0x20, 0x8b, 0x59, 0x63, 0xa0, 0x1f, 0xde, 0x70, 0x5d, 0x20, 0x92, 0x01, 0x02,
    0x40, 0x65, 0x5e, 0xde, 0x30, 0x07, 0xd1, 0xcc, 0xf9, 0xff, 0xff, 0xef, 0x00,
    0x00, 0x00, 0x00, 0xcf, 0x19, 0x17, 0xb7, 0x51, 0x38, 0x53, 0x9e, 0x3e, 0x4b,
    0xd7, 0xe0, 0x37, 0x37, 0x01, 0x13, 0x23, 0x00, 0x82, 0xd4, 0x17};

/* One message of a seed: a Msg of that case with that body. */
#define SEED_MSG(CASE, field, body)                                                        \
    ((Kvdock__Cluster__Msg){PROTOBUF_C_MESSAGE_INIT(&kvdock__cluster__msg__descriptor),     \
                            KVDOCK__CLUSTER__MSG__M_##CASE, .field = (body)})

/* Write the seed file dir/name: its first byte says the link (odd: the
 * daemon's outbound one), then each message as a record (2 bytes of
 * length, little-endian, then the message). */
static void seed_write(const char *dir, const char *name, int outbound,
                       const Kvdock__Cluster__Msg *msgs, size_t n)
{
    uint8_t buf[8192];
    size_t len = 1;
    char path[512];
    FILE *f;

    buf[0] = (uint8_t)(outbound != 0);
    for (size_t i = 0; i < n; i++) {
        size_t sz = kvdock__cluster__msg__get_packed_size(&msgs[i]);

        if (len + 2 + sz > sizeof(buf))
            die("seed too large");
        buf[len++] = (uint8_t)(sz & 0xff);
        buf[len++] = (uint8_t)(sz >> 8);
        kvdock__cluster__msg__pack(&msgs[i], buf + len);
        len += sz;
    }
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if ((f = fopen(path, "wb")) == NULL || fwrite(buf, 1, len, f) != len || fclose(f) != 0)
        die("cannot write a seed");
}

#define SEED(name, outbound, ...)                                                          \
    seed_write(dir, name, outbound, (const Kvdock__Cluster__Msg[]){__VA_ARGS__},           \
               sizeof((const Kvdock__Cluster__Msg[]){__VA_ARGS__}) / sizeof(Kvdock__Cluster__Msg))

static void write_seeds(const char *dir)
{
    static uint8_t key_bytes[4][32];
    ProtobufCBinaryData keys[4];
    Kvdock__Cluster__CacheRef ref = KVDOCK__CLUSTER__CACHE_REF__INIT;
    Kvdock__Cluster__Query q = KVDOCK__CLUSTER__QUERY__INIT;
    Kvdock__Cluster__Fetch f = KVDOCK__CLUSTER__FETCH__INIT;
    Kvdock__Cluster__Lanes ln1 = KVDOCK__CLUSTER__LANES__INIT, ln2;
    Kvdock__Cluster__QueryReply qr = KVDOCK__CLUSTER__QUERY_REPLY__INIT;
    Kvdock__Cluster__FetchDone fd = KVDOCK__CLUSTER__FETCH_DONE__INIT;
    Kvdock__Cluster__Hello h = KVDOCK__CLUSTER__HELLO__INIT;
    Kvdock__Cluster__Ping pi = KVDOCK__CLUSTER__PING__INIT;
    ProtobufCBinaryData addr[2] = {{sizeof(ucx_addr), (uint8_t *)ucx_addr},
                                   {sizeof(ucx_addr), (uint8_t *)ucx_addr}};
    uint8_t present = 0x5, missing = 0x2, nonce[RAWPEER_NONCE] = {1};

    for (int i = 0; i < 4; i++) {
        memset(key_bytes[i], 0x11 * (i + 1), sizeof(key_bytes[i]));
        keys[i].data = key_bytes[i];
        keys[i].len = sizeof(key_bytes[i]);
    }
    ref.name = "c";
    ref.num_layers = 2;
    ref.tokens_per_block = 16;
    ref.token_bytes = 512;
    ref.dtype = "f16";
    q.id = 1;
    q.cache = &ref;
    q.keys = keys;
    q.n_keys = 4;
    f.id = 2;
    f.cache = &ref;
    f.keys = keys;
    f.n_keys = 2;
    f.token = 0x1234567890abcdefull;
    ln1.address = addr;
    ln1.n_address = 1;
    ln2 = ln1;
    ln2.n_address = 2;
    h.version = RAWPEER_VERSION;
    h.node = "again";
    h.nonce.data = nonce;
    h.nonce.len = sizeof(nonce);
    pi.t = 7;
    qr.id = 1;
    qr.present.data = &present;
    qr.present.len = 1;
    fd.id = 2;
    fd.sent = 1;
    fd.missing.data = &missing;
    fd.missing.len = 1;

    /* inbound: a query, a fetch, lanes, a second hello */
    SEED("in-query", 0, SEED_MSG(QUERY, query, &q));
    SEED("in-query-fetch", 0, SEED_MSG(QUERY, query, &q), SEED_MSG(FETCH, fetch, &f));
    SEED("in-lanes", 0, SEED_MSG(LANES, lanes, &ln1));
    SEED("in-lanes-fetch", 0, SEED_MSG(LANES, lanes, &ln2), SEED_MSG(FETCH, fetch, &f));
    SEED("in-hello-again", 0, SEED_MSG(HELLO, hello, &h));
    SEED("in-ping", 0, SEED_MSG(PING, ping, &pi));
    /* outbound: answers to asks never made */
    SEED("out-query-reply", 1, SEED_MSG(QUERY_REPLY, query_reply, &qr));
    SEED("out-reply-done", 1, SEED_MSG(QUERY_REPLY, query_reply, &qr),
         SEED_MSG(FETCH_DONE, fetch_done, &fd));
    SEED("out-query", 1, SEED_MSG(QUERY, query, &q));
}

/* ---- the daemon ----------------------------------------------------------------------- */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static char dir[64], sock[128], secret[128], listen_at[64], peers[64];
    const char *seeds = getenv("KVD_FUZZ_WRITE_SEEDS");
    kvd__options_t o;
    char why[256] = "", err[256];
    pthread_t t;
    FILE *f;

    (void)argc;
    (void)argv;
    if (seeds != NULL) {
        write_seeds(seeds);
        exit(0);
    }
    signal(SIGPIPE, SIG_IGN);
    kvd__log_level = getenv("KVD_FUZZ_LOG") ? KVD_LOG_DEBUG : KVD_LOG_ERROR;
    snprintf(dir, sizeof(dir), "/tmp/kvd-fuzzcm-XXXXXX");
    if (mkdtemp(dir) == NULL)
        die("mkdtemp");
    snprintf(sock, sizeof(sock), "%s/kvdockd.sock", dir);
    snprintf(secret, sizeof(secret), "%s/secret", dir);
    umask(077); /* the daemon refuses a secret others may read */
    if ((f = fopen(secret, "w")) == NULL || fputs(SECRET "\n", f) < 0 || fclose(f) != 0)
        die("cannot write the secret");
    door_port = some_port();
    do
        peer_port = some_port();
    while (peer_port == door_port);
    snprintf(listen_at, sizeof(listen_at), "127.0.0.1:%d", door_port);
    snprintf(peers, sizeof(peers), "127.0.0.1:%d", peer_port);
    /* the configured peer listens before the daemon first tries it */
    outlink = rawpeer_new();
    if (rawpeer_listen(outlink, peer_port) != 0)
        die("cannot listen as the configured peer");
    kvd__options_init(&o);
    if (kvd__options_set(&o, "backend", "cpu", err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "socket", sock, err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "host-memory-budget", "256M", err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "cluster-listen", listen_at, err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "cluster-peers", peers, err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "cluster-secret-file", secret, err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "cluster-allow-from", "127.0.0.1", err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "cluster-lanes", "1", err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "cluster-deadline-ms", "2000", err, sizeof(err)) != KVD_OK)
        die(err);
    if (uv_loop_init(&loop) != 0)
        die("uv_loop_init");
    if (kvd__server_create(&loop, &o, &srv, why, sizeof(why)) != KVD_OK)
        die(why);
    if (pthread_create(&t, NULL, run_loop, NULL) != 0)
        die("pthread_create");
    if (rawpeer_serve(outlink, SECRET, SERVE_MS) != 0)
        die("the daemon did not connect to its configured peer");
    return 0;
}

/* Read what the daemon sent on rp: its Pings answered, the rest (answers
 * to an input's queries, stale Pongs) dropped. */
static void drain(rawpeer_t *rp)
{
    static const Kvdock__Cluster__Msg__MCase other[] = {
        KVDOCK__CLUSTER__MSG__M_QUERY_REPLY, KVDOCK__CLUSTER__MSG__M_FETCH_DONE,
        KVDOCK__CLUSTER__MSG__M_PONG, KVDOCK__CLUSTER__MSG__M_REFUSED,
        KVDOCK__CLUSTER__MSG__M_QUERY, KVDOCK__CLUSTER__MSG__M_FETCH,
        KVDOCK__CLUSTER__MSG__M_LANES};
    Kvdock__Cluster__Msg *m;

    while ((m = rawpeer_wait(rp, KVDOCK__CLUSTER__MSG__M_PING, 0)) != NULL) {
        Kvdock__Cluster__Msg out = KVDOCK__CLUSTER__MSG__INIT;
        Kvdock__Cluster__Pong po = KVDOCK__CLUSTER__PONG__INIT;
        po.t = m->ping->t;
        out.m_case = KVDOCK__CLUSTER__MSG__M_PONG;
        out.pong = &po;
        (void)rawpeer_send_msg(rp, &out);
        kvdock__cluster__msg__free_unpacked(m, NULL);
    }
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++)
        while ((m = rawpeer_wait(rp, other[i], 0)) != NULL)
            kvdock__cluster__msg__free_unpacked(m, NULL);
}

/* The link this input speaks on: a fresh proven inbound one, or the
 * daemon's outbound one (made again when the last input ended it). */
static rawpeer_t *link_for(int outbound)
{
    rawpeer_t *rp;

    if (outbound) {
        if (outlink != NULL && !rawpeer_wait_closed(outlink, 0, NULL, 0))
            return outlink;
        if (outlink != NULL) { /* the daemon closed it (a ping unanswered, say) */
            rawpeer_free(outlink);
            outlink = NULL;
        }
        /* the daemon tries again after its backoff (at most 5 s) and drops
         * a try that is not proven within its deadline (2 s) */
        for (int tries = 0; tries < 3 && outlink == NULL; tries++) {
            rp = rawpeer_new();
            if (rawpeer_listen(rp, peer_port) == 0 && rawpeer_serve(rp, SECRET, SERVE_MS) == 0)
                outlink = rp;
            else
                rawpeer_free(rp);
        }
        if (outlink == NULL)
            die("the daemon did not connect to its configured peer again");
        return outlink;
    }
    rp = rawpeer_new();
    if (rawpeer_connect(rp, door_port) != 0 || rawpeer_auth(rp, SECRET) != 0) /* Hello first */
        die("the daemon did not take a proven inbound link");
    return rp;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int outbound;
    size_t at = 1;
    rawpeer_t *rp;
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT, *pong;
    Kvdock__Cluster__Ping pi = KVDOCK__CLUSTER__PING__INIT;
    int alive = 1, records = 0;

    if (size < 1)
        return 0;
    outbound = data[0] & 1;
    if (outlink != NULL) /* its Pings answered, whichever link this input takes */
        drain(outlink);
    rp = link_for(outbound);
    drain(rp);
    while (alive && at + 2 <= size && records++ < MAX_RECORDS) {
        size_t n = (size_t)data[at] | (size_t)data[at + 1] << 8;
        uint8_t *frame;
        at += 2;
        if (n > size - at)
            n = size - at;
        if ((frame = malloc(4 + n)) == NULL)
            die("out of memory");
        frame[0] = (uint8_t)n;
        frame[1] = (uint8_t)(n >> 8);
        frame[2] = frame[3] = 0;
        memcpy(frame + 4, data + at, n);
        alive = rawpeer_send_raw(rp, frame, 4 + n) == 0;
        free(frame);
        at += n;
    }
    /* the daemon answers a Ping after what came before it, or has closed
     * the link; a daemon that does neither is stuck */
    pi.t = ++pings;
    m.m_case = KVDOCK__CLUSTER__MSG__M_PING;
    m.ping = &pi;
    if (alive && rawpeer_send_msg(rp, &m) == 0) {
        for (;;) {
            pong = rawpeer_wait(rp, KVDOCK__CLUSTER__MSG__M_PONG, PONG_MS);
            if (pong == NULL) {
                /* a Pong dropped with a full queue would look like a hang:
                 * the queue is drained before each input and holds more
                 * than MAX_RECORDS answers */
                if (!rawpeer_wait_closed(rp, 0, NULL, 0))
                    die("the daemon neither answered a Ping nor closed the link");
                alive = 0;
                break;
            }
            if (pong->pong->t == pi.t) {
                kvdock__cluster__msg__free_unpacked(pong, NULL);
                break;
            }
            kvdock__cluster__msg__free_unpacked(pong, NULL); /* an earlier input's */
        }
        drain(rp);
    } else {
        alive = 0;
    }
    if (!outbound || !alive) {
        if (outbound)
            outlink = NULL;
        rawpeer_free(rp);
    }
    return 0;
}
