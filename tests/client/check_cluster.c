/*
 * The cluster end to end: three kvdockd daemons (cpu backend) on this
 * machine, one cluster over UCX's TCP transport on the loopback.
 *
 * - chains saved on one node are found by a lookup on another and loaded
 *   there byte for byte, pulled from the nodes that hold them (a chain
 *   split over two nodes comes from both); then they are local; a load
 *   whose pull finds no room under the host-memory budget fetches nothing
 *   and says so
 * - two loads of one chain at once: the second waits for the first's
 *   pull; both get the bytes, the blocks cross once
 * - a pulled load copies landed batches early; its layer flags are set
 *   once all of it is in, its reply and counters cover all of it
 * - a node stopped mid-pull (SIGSTOP) costs only its blocks: the load
 *   answers within the deadline, naming exactly those keys; a node killed
 *   (SIGKILL) during a load: the load ends within the deadline, and what
 *   landed is intact; lookups go on answering
 * - kvdock status and the metrics show each peer and its health
 * - one peers file for all nodes: each skips itself
 * - a node restarted on its address listens again at once and rejoins
 * - a daemon with another secret is refused by both sides and logged, and
 *   gets nothing
 * - bad cluster options stop the daemon with a reason
 * - the front door (rawpeer.c: raw TCP to --cluster-listen), from inside
 *   and outside --cluster-allow-from: the 116-byte frame that killed the
 *   UCX listener, 2,100 bytes of garbage, messages out of turn or
 *   undecodable, half and oversized proofs, a proof replayed from an
 *   earlier session, a slow sender, 1,000 idle connections (the caps on
 *   unproven connections show); after each the daemon is alive and idle,
 *   has logged and counted the refusal, and serves its clients and peers
 * - a peer that proves the secret and then misbehaves (a second Hello,
 *   the proof out of turn, a message past its limit, lanes that are not
 *   UCX worker addresses) loses its connection only; what it asks is
 *   answered and nothing it did not ask for is sent
 * - a pull with either side killed mid-way, in a loop (UCX's wireup once
 *   asserted there)
 * - a fetch whose blocks wait for the fetcher's lanes to be wired up,
 *   when the fetcher goes and when the daemon stops: the blocks let go,
 *   none sent, the daemon serving and then exiting clean
 * - a fetch whose blocks wait for a wireup that then fails on one lane:
 *   none sent on the lanes that wired up, the blocks let go, the link
 *   dropped
 */
#include "testutil.h"
#include "rawpeer.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define LAYERS 2
#define TPB 4
#define KEY 32
#define MAX_STARTUPS 64            /* unproven connections a daemon holds (door.c) ... */
#define MAX_STARTUPS_PER_SOURCE 8  /* ... and from one address */
/* --cluster-deadline-ms of the test daemons, and the factor every time
 * bound here takes: KVD_TEST_TIME_SCALE (valgrind_daemon.sh sets it: the
 * daemons run many times slower there) */
static int scale = 1;
#define DEADLINE_MS (1000 * scale)
#define MS(n) ((int64_t)(n) * scale)

typedef struct node {
    kvt_daemon_t d;
    int port;
    int lanes;               /* --cluster-lanes; 0: the default */
    kvd_client_t *cli;
    uint64_t cache;
} node_t;

static char secret_path[256], other_secret_path[256], dir[128];
#define SECRET "the cluster's secret, 32 bytes..\n"

/* A free TCP port on the loopback, below the ephemeral range: a port the
 * kernel hands out for outgoing connections (the daemons' own, between
 * the check and the daemon's listen) could be taken again meanwhile. */
static int free_port(void)
{
    static unsigned seed;

    if (seed == 0)
        seed = (unsigned)getpid() * 2654435761u;
    for (int tries = 0; tries < 1000; tries++) {
        struct sockaddr_in a;
        int fd = socket(AF_INET, SOCK_STREAM, 0), port, ok, one = 1;

        ck_assert_int_ge(fd, 0);
        seed = seed * 1103515245u + 12345u;
        port = 20000 + (int)((seed >> 8) % 12000);
        memset(&a, 0, sizeof(a));
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons((uint16_t)port);
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        close(fd);
        if (ok)
            return port;
    }
    ck_abort_msg("no free port in 20000-31999");
    return -1;
}

static int lanes_b; /* when set, the second node's --cluster-lanes */

static void write_secret(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");

    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    ck_assert_int_eq(chmod(path, mode), 0);
}

static int time_scale(void)
{
    const char *s = getenv("KVD_TEST_TIME_SCALE");

    return s != NULL && atoi(s) > 1 ? atoi(s) : 1;
}

/* A scaled --cluster-deadline-ms, within what the daemon takes. */
static int deadline_of(int64_t ms)
{
    return ms > 600000 ? 600000 : (int)ms;
}

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kvdock-cluster-%d", (int)getpid());
    mkdir(dir, 0700);
    snprintf(secret_path, sizeof(secret_path), "%s/secret", dir);
    snprintf(other_secret_path, sizeof(other_secret_path), "%s/other", dir);
    write_secret(secret_path, SECRET, 0600);
    write_secret(other_secret_path, "another cluster's secret, bytes.\n", 0600);
    scale = time_scale();
    lanes_b = 0;
    /* the loopback, over TCP (the transport a cluster without RDMA uses) */
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
}

static void teardown(void)
{
    unlink(secret_path);
    unlink(other_secret_path);
    rmdir(dir);
}

static char peer_list[2048];

static char peers_file[300]; /* when set, nodes read their peers from it */
static int deadline_ms;       /* when set, the next nodes' deadline instead of DEADLINE_MS */
static const char *allow_from; /* when set, the next nodes' --cluster-allow-from */

/* Start one node listening on its port, peers: peer_list (or peers_file);
 * metrics: a --metrics address, or NULL. */
static void start_node_with(node_t *node, const char *secret, const char *metrics)
{
    char listen[64], deadline[32], lanes[16];
    const char *level = getenv("KVD_TEST_LOG_LEVEL") ? getenv("KVD_TEST_LOG_LEVEL") : "info";

    snprintf(listen, sizeof(listen), "127.0.0.1:%d", node->port);
    snprintf(deadline, sizeof(deadline), "%d", deadline_ms ? deadline_ms : DEADLINE_MS);
    snprintf(lanes, sizeof(lanes), "%d", node->lanes);
    const char *extra[] = {"--host-memory-budget", "256M", "--cluster-listen", listen,
                           peers_file[0] ? "--cluster-peers-file" : "--cluster-peers",
                           peers_file[0] ? peers_file : peer_list, "--cluster-secret-file",
                           secret, "--cluster-deadline-ms", deadline, "--log-level", level,
                           "--cluster-allow-from", allow_from ? allow_from : "peers",
                           "--cluster-lanes", lanes, metrics ? "--metrics" : NULL, metrics,
                           NULL};
    ck_assert_int_eq(kvt_daemon_start(&node->d, "cpu", extra, (int)MS(10000)), 0);
    ck_assert_int_eq(kvd_client_create(node->d.socket, "cluster-test", &node->cli), KVD_OK);
    kvd_client_set_timeout(node->cli, (int)MS(20000));
}

static void start_node(node_t *node, const char *secret)
{
    start_node_with(node, secret, NULL);
}

/* Ports for n nodes of one cluster, and the peer list naming them all. */
static void plan_nodes(node_t *nodes, int n)
{
    peer_list[0] = '\0';
    for (int i = 0; i < n; i++) {
        /* lanes: 1, 2, 3 (each daemon maps another's lanes onto its own) */
        nodes[i].lanes = i == 1 && lanes_b ? lanes_b : i % 3 + 1;
        nodes[i].port = free_port();
        for (int j = 0; j < i; j++)
            if (nodes[j].port == nodes[i].port) { /* drawn twice: draw again */
                nodes[i].port = free_port();
                j = -1;
            }
        snprintf(peer_list + strlen(peer_list), sizeof(peer_list) - strlen(peer_list),
                 "%s127.0.0.1:%d", i ? "," : "", nodes[i].port);
    }
}

/* Start n nodes in one cluster (secret: whose), each listing all. */
static void start_nodes(node_t *nodes, int n, const char *secret)
{
    plan_nodes(nodes, n);
    for (int i = 0; i < n; i++)
        start_node(&nodes[i], secret);
}

/* Peers of node that are up, per its status. */
static uint32_t peers_up(node_t *node, kvd_daemon_status_t *s)
{
    uint32_t up = 0;

    KVT_OK(node->cli, kvd_daemon_status(node->cli, s, NULL, 0));
    ck_assert(s->cluster.enabled);
    for (uint32_t i = 0; i < s->cluster.num_peers && i < KVD_CLUSTER_PEERS_MAX; i++)
        up += strcmp(s->cluster.peers[i].state, "up") == 0;
    return up;
}

static void wait_all_up(node_t *nodes, int n)
{
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    int64_t t0 = kvt_now_ms();

    for (int i = 0; i < n; i++)
        while (peers_up(&nodes[i], s) < (uint32_t)(n - 1)) {
            if (kvt_now_ms() - t0 >= MS(15000)) {
                uint32_t up = peers_up(&nodes[i], s);
                for (uint32_t k = 0; k < s->cluster.num_peers && k < KVD_CLUSTER_PEERS_MAX; k++)
                    fprintf(stderr, "node %d: peer %s %s for %" PRIu64 " ms (%s), %" PRIu64
                            " failures\n", i, s->cluster.peers[k].address,
                            s->cluster.peers[k].state, s->cluster.peers[k].since_ms,
                            s->cluster.peers[k].error, s->cluster.peers[k].failures);
                ck_abort_msg("node %d sees %u of %d peers up", i, up, n - 1);
            }
            usleep(20000);
        }
    free(s);
}

/* Until node sees the peer on 127.0.0.1:port up. */
static void wait_peer_up(node_t *node, int port)
{
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    char addr[64];
    int64_t t0 = kvt_now_ms();

    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    for (;;) {
        int up = 0;
        KVT_OK(node->cli, kvd_daemon_status(node->cli, s, NULL, 0));
        for (uint32_t i = 0; i < s->cluster.num_peers && i < KVD_CLUSTER_PEERS_MAX; i++)
            up |= strcmp(s->cluster.peers[i].address, addr) == 0 &&
                  strcmp(s->cluster.peers[i].state, "up") == 0;
        if (up)
            break;
        ck_assert_msg(kvt_now_ms() - t0 < MS(15000), "%s is not up on %d", addr, node->port);
        usleep(20000);
    }
    free(s);
}

/* SIGTERM: the daemon must exit 0 (under the sanitizers: nothing leaked
 * or misused), else its log is shown. */
/* Stop d, checking it exits cleanly; its whole log into log (len bytes,
 * when not NULL) before its directory goes. */
static void stop_checked_log(kvt_daemon_t *d, char *log, size_t len)
{
    int st = -1;

    kill(d->pid, SIGTERM);
    for (int i = 0; i < 1000 && waitpid(d->pid, &st, WNOHANG) != d->pid; i++)
        usleep(10000);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
        kvt_daemon_dump_log(d);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvdockd exited with status %d", st);
    if (log != NULL) {
        FILE *f = fopen(d->log, "r");
        size_t n = 0;
        ck_assert_ptr_nonnull(f);
        n = fread(log, 1, len - 1, f);
        log[n] = '\0';
        fclose(f);
    }
    d->pid = -1;
    kvt_daemon_stop(d, 1000); /* removes its directory */
}

static void stop_checked(kvt_daemon_t *d)
{
    stop_checked_log(d, NULL, 0);
}

static void stop_nodes(node_t *nodes, int n)
{
    for (int i = 0; i < n; i++) {
        if (nodes[i].cli != NULL)
            kvd_client_destroy(&nodes[i].cli);
        if (nodes[i].d.pid > 0)
            stop_checked(&nodes[i].d);
    }
}

static uint64_t make_cache(node_t *node, const char *name, uint32_t token_bytes, bool cluster)
{
    kvd_cache_spec_t s = kvt_cache_spec(name, LAYERS, TPB, token_bytes, 96u << 20);
    kvd_cache_info_t info;

    s.cluster = cluster;
    KVT_OK(node->cli, kvd_cache_create(node->cli, &s, &info));
    ck_assert(info.cluster == cluster);
    return info.id;
}

/* keys of a chain of n blocks (random tokens from seed) */
static void chain(uint8_t (*keys)[KEY], uint32_t n, uint64_t seed)
{
    int64_t *tokens = malloc((size_t)n * TPB * sizeof(*tokens));
    size_t count = 0;

    for (uint32_t i = 0; i < n * TPB; i++)
        tokens[i] = (int64_t)((seed * 2654435761u + i * 40503u) % 50000);
    ck_assert_int_eq(kvd_block_hashes(tokens, (size_t)n * TPB, TPB, "c", 1, keys[0], n, &count),
                     KVD_OK);
    ck_assert_uint_eq(count, n);
    free(tokens);
}

static void poison(const kvt_pool_t *p)
{
    memset(p->map->base, 0xA5, p->map->bytes);
}

static kvd_cache_keys_t keys_of(uint8_t (*keys)[KEY], uint32_t from, uint32_t n)
{
    kvd_cache_keys_t k;

    memset(&k, 0, sizeof(k));
    k.blob = keys[from];
    k.key_size = KEY;
    k.count = n;
    return k;
}

/* Save keys[from, from + n) from pages [from, from + n) of p (filled),
 * chained to keys[from - 1] (which must be there) or as a chain's head. */
static void save(node_t *node, const kvt_pool_t *p, uint8_t (*keys)[KEY], uint32_t from,
                 uint32_t n, bool chained)
{
    int64_t *pages = malloc(n * sizeof(*pages));
    kvd_cache_save_t a;
    kvd_op_result_t r;

    memset(&a, 0, sizeof(a));
    for (uint32_t i = 0; i < n; i++) {
        pages[i] = from + i;
        kvt_page_fill(p, from + i, keys[from + i]);
    }
    a.cache = node->cache;
    a.pool = p->info.id;
    a.keys = keys_of(keys, from, n);
    a.blocks.values = pages;
    a.blocks.count = n;
    if (from > 0 && chained) {
        a.parent = keys[from - 1];
        a.parent_len = KEY;
    }
    KVT_OK(node->cli, kvd_cache_save(node->cli, &a, NULL, &r));
    ck_assert_uint_eq(r.stored, n);
    free(pages);
}

/* A load of keys[from, from + n) of node's cache into p's pages[0..n). */
static kvd_cache_load_t load_args(const node_t *node, const kvt_pool_t *p, uint8_t (*keys)[KEY],
                                  uint32_t from, uint32_t n, const int64_t *pages)
{
    kvd_cache_load_t a;

    memset(&a, 0, sizeof(a));
    a.cache = node->cache;
    a.pool = p->info.id;
    a.keys = keys_of(keys, from, n);
    a.blocks.values = pages;
    a.blocks.count = n;
    return a;
}

/* Load keys[0, n) into pages 0..n-1. */
static kvd_status_t load(node_t *node, const kvt_pool_t *p, uint8_t (*keys)[KEY], uint32_t n)
{
    int64_t *pages = malloc(n * sizeof(*pages));
    kvd_cache_load_t a;
    kvd_status_t st;

    for (uint32_t i = 0; i < n; i++)
        pages[i] = i;
    a = load_args(node, p, keys, 0, n, pages);
    st = kvd_cache_load(node->cli, &a, NULL, NULL);
    free(pages);
    return st;
}

static kvd_cache_lookup_result_t lookup(node_t *node, uint8_t (*keys)[KEY], uint32_t n)
{
    kvd_cache_keys_t k = keys_of(keys, 0, n);
    kvd_cache_lookup_result_t r;

    KVT_OK(node->cli, kvd_cache_lookup(node->cli, node->cache, &k, false, 0, &r));
    return r;
}

START_TEST(test_found_and_pulled)
{
    node_t nodes[3];
    kvt_pool_t pa, pb, pc;
    uint8_t(*keys)[KEY] = malloc(64 * KEY), (*keys2)[KEY] = malloc(64 * KEY);
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    kvd_cache_lookup_result_t r;
    kvd_cache_info_t info;
    uint64_t solo;

    memset(nodes, 0, sizeof(nodes));
    start_nodes(nodes, 3, secret_path);
    wait_all_up(nodes, 3);
    for (int i = 0; i < 3; i++)
        nodes[i].cache = make_cache(&nodes[i], "kv", 1024, true);
    {
        /* opening it as a cache outside the cluster is refused */
        kvd_cache_spec_t sp;
        memset(&sp, 0, sizeof(sp));
        sp.name = "kv";
        sp.layout.num_layers = LAYERS;
        sp.layout.tokens_per_block = TPB;
        sp.layout.token_bytes = 1024;
        snprintf(sp.layout.dtype, sizeof(sp.layout.dtype), "bf16");
        sp.budget_bytes = 96u << 20;
        sp.open_existing = true;
        KVT_ERR(nodes[0].cli, kvd_cache_create(nodes[0].cli, &sp, NULL), KVD_EINVAL);
        ck_assert_ptr_nonnull(strstr(kvd_client_last_error(nodes[0].cli), "in the cluster"));
    }
    kvt_pool_make(nodes[0].cli, &pa, "pa", LAYERS, 64 * TPB, 1024, false, TPB);
    kvt_pool_make(nodes[1].cli, &pb, "pb", LAYERS, 64 * TPB, 1024, false, TPB);
    kvt_pool_make(nodes[2].cli, &pc, "pc", LAYERS, 64 * TPB, 1024, false, TPB);

    /* a chain saved on A: found and pulled by B */
    chain(keys, 64, 1);
    save(&nodes[0], &pa, keys, 0, 64, true);
    r = lookup(&nodes[1], keys, 64);
    ck_assert_uint_eq(r.hits, 64);
    ck_assert_uint_eq(r.local_hits, 0);
    /* a hit is a key B can serve: those on A count, as peer hits */
    KVT_OK(nodes[1].cli, kvd_cache_stats(nodes[1].cli, nodes[1].cache, NULL, &info));
    ck_assert_uint_eq(info.keys_asked, 64);
    ck_assert_uint_eq(info.keys_hit, 64);
    ck_assert_uint_eq(info.peer_hits, 64);
    poison(&pb);
    KVT_OK(nodes[1].cli, load(&nodes[1], &pb, keys, 64));
    for (uint32_t i = 0; i < 64; i++)
        ck_assert_msg(kvt_page_holds(&pb, i, keys[i]), "block %u on B differs from A's", i);
    r = lookup(&nodes[1], keys, 64);
    ck_assert_uint_eq(r.local_hits, 64); /* now in B's own tier */
    KVT_OK(nodes[1].cli, kvd_cache_stats(nodes[1].cli, nodes[1].cache, NULL, &info));
    ck_assert_uint_eq(info.keys_hit, 128);
    ck_assert_uint_eq(info.peer_hits, 64);
    {
        /* and `kvdock cache ls` HIT says so: every token asked for was hit */
        const char *ls[] = {KVDOCK_CLI_PATH, "--socket", nodes[1].d.socket, "cache", "ls", NULL,
                            NULL};
        char *out = NULL, *err = NULL;
        int rc = kvt_run(ls, &out, &err, 20000);

        ck_assert_msg(rc == 0 && strstr(out, " 100.0% ") != NULL, "kvdock cache ls:\n%s%s",
                      out, err);
        free(out);
        free(err);
        ls[4] = "stats"; /* and `cache stats` the peers' share */
        ls[5] = "kv";
        rc = kvt_run(ls, &out, &err, 20000);
        ck_assert_msg(rc == 0 && strstr(out, ": 512 of 512 tokens hit (100.0%), 256 of them on "
                                             "peers\n") != NULL,
                      "kvdock cache stats:\n%s%s", out, err);
        free(out);
        free(err);
    }
    {
        /* B's tier cleared gives its slab back: the next load pulls again,
         * once the slab the pulls need is made (pulls cannot wait) */
        kvd_cache_evict_result_t ev;

        KVT_OK(nodes[1].cli, kvd_cache_evict(nodes[1].cli, nodes[1].cache, NULL, true, &ev));
        ck_assert_uint_eq(ev.evicted, 64);
        poison(&pb);
        KVT_OK(nodes[1].cli, load(&nodes[1], &pb, keys, 64));
        for (uint32_t i = 0; i < 64; i++)
            ck_assert_msg(kvt_page_holds(&pb, i, keys[i]), "block %u pulled again differs", i);
    }
    {
        /* no room for a pull: B's tier cleared again and its host-memory
         * budget taken by a pool but for less than the slab (96 MiB), the
         * load that must pull fetches nothing and names the budget; with
         * the pool gone the next load pulls every block */
        kvt_pool_t fill;
        uint64_t room;
        int64_t end = kvt_now_ms() + MS(10000);

        KVT_OK(nodes[1].cli, kvd_cache_evict(nodes[1].cli, nodes[1].cache, NULL, true, NULL));
        do /* the slab is unmapped off the loop, its bytes given back after */
            KVT_OK(nodes[1].cli, kvd_daemon_status(nodes[1].cli, s, NULL, 0));
        while (s->host_used >= (96u << 20) && kvt_now_ms() < end && usleep(10000) == 0);
        room = s->host_budget - s->host_used;
        ck_assert_uint_ge(room, 96u << 20);
        kvt_pool_make(nodes[1].cli, &fill, "fill", 1, (room >> 20) - 16, 1u << 20, true, 1);
        KVT_ERR(nodes[1].cli, load(&nodes[1], &pb, keys, 64), KVD_ENOENT);
        ck_assert_msg(strstr(kvd_client_last_error(nodes[1].cli), "keys[0-63] (64 of 64) could "
                                                                  "not be loaded: the local tier "
                                                                  "has no room") != NULL &&
                          strstr(kvd_client_last_error(nodes[1].cli), "host-memory budget") !=
                              NULL,
                      "%s", kvd_client_last_error(nodes[1].cli));
        r = lookup(&nodes[1], keys, 64);
        ck_assert_uint_eq(r.hits, 64);
        ck_assert_uint_eq(r.local_hits, 0);
        kvt_pool_free(nodes[1].cli, &fill);
        poison(&pb);
        KVT_OK(nodes[1].cli, load(&nodes[1], &pb, keys, 64));
        for (uint32_t i = 0; i < 64; i++)
            ck_assert_msg(kvt_page_holds(&pb, i, keys[i]), "block %u pulled after the pool differs",
                          i);
    }

    /* a chain split over A (first half) and C (second): B pulls from both */
    chain(keys2, 64, 2);
    save(&nodes[0], &pa, keys2, 0, 32, true);
    save(&nodes[2], &pc, keys2, 32, 32, false); /* C: the second half, as a chain of its own */
    r = lookup(&nodes[1], keys2, 64);
    ck_assert_uint_eq(r.hits, 64);
    poison(&pb);
    KVT_OK(nodes[1].cli, load(&nodes[1], &pb, keys2, 64));
    for (uint32_t i = 0; i < 64; i++)
        ck_assert_msg(kvt_page_holds(&pb, i, keys2[i]), "block %u of the split chain differs", i);
    KVT_OK(nodes[1].cli, kvd_daemon_status(nodes[1].cli, s, NULL, 0));
    /* the first chain pulled three times, the split one once */
    ck_assert_uint_eq(s->cluster.blocks_fetched, 256);
    KVT_OK(nodes[0].cli, kvd_daemon_status(nodes[0].cli, s, NULL, 0));
    ck_assert_uint_ge(s->cluster.blocks_served, 64);
    ck_assert_uint_eq(s->cluster.inbound, 2);

    /* a cache outside the cluster sees only its own node */
    solo = make_cache(&nodes[2], "solo", 1024, false);
    {
        uint64_t keep = nodes[2].cache;
        nodes[2].cache = solo;
        r = lookup(&nodes[2], keys, 64);
        ck_assert_uint_eq(r.hits, 0);
        nodes[2].cache = keep;
    }
    /* another layout of the same name is another cache */
    {
        uint64_t other = make_cache(&nodes[1], "kv2", 512, true), keep = nodes[1].cache;
        nodes[1].cache = other;
        r = lookup(&nodes[1], keys2, 64);
        ck_assert_uint_eq(r.hits, 0);
        nodes[1].cache = keep;
    }
    kvt_pool_free(nodes[0].cli, &pa);
    kvt_pool_free(nodes[1].cli, &pb);
    kvt_pool_free(nodes[2].cli, &pc);
    stop_nodes(nodes, 3);
    free(keys);
    free(keys2);
    free(s);
}
END_TEST

/* In-flight requests of the client named name on node, per its status as
 * the client obs sees it; -1 when no such client. */
static int64_t inflight_of(kvd_client_t *obs, const char *name)
{
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    kvd_client_entry_t cl[16];
    int64_t n = -1;

    KVT_OK(obs, kvd_daemon_status(obs, s, cl, 16));
    for (size_t i = 0; i < s->num_clients && i < 16; i++)
        if (strcmp(cl[i].name, name) == 0)
            n = cl[i].inflight;
    free(s);
    return n;
}

/* Two workers on B load the same chain held on A at once: the second
 * waits for the first one's pull instead of failing or pulling again;
 * both get A's bytes.  A is stopped while both loads are in, so that
 * they overlap whatever the machine's speed: both are in flight at B
 * (its status says so) and neither can answer until A runs again. */
START_TEST(test_same_chain_twice)
{
    node_t nodes[2];
    kvt_pool_t pa, pb, pb2;
    uint32_t n = 48;
    uint8_t(*keys)[KEY] = malloc(n * KEY);
    int64_t *pages = malloc(n * sizeof(*pages));
    kvd_client_t *b2 = NULL, *obs = NULL;
    kvd_cache_load_t a1, a2;
    kvd_op_result_t r1, r2;
    uint64_t id1, id2;
    bool done1 = false, done2 = false;
    int64_t t0, in1, in2;
    kvd_status_t st1, st2;

    memset(nodes, 0, sizeof(nodes));
    deadline_ms = deadline_of(MS(10000)); /* A stays stopped for a while: no give-up meanwhile */
    start_nodes(nodes, 2, secret_path);
    deadline_ms = 0;
    wait_all_up(nodes, 2);
    for (int i = 0; i < 2; i++)
        nodes[i].cache = make_cache(&nodes[i], "kv", 16384, true);
    ck_assert_int_eq(kvd_client_create(nodes[1].d.socket, "second-worker", &b2), KVD_OK);
    ck_assert_int_eq(kvd_client_create(nodes[1].d.socket, "observer", &obs), KVD_OK);
    kvd_client_set_timeout(b2, 20000);
    kvt_pool_make(nodes[0].cli, &pa, "pa", LAYERS, n * TPB, 16384, false, TPB);
    kvt_pool_make(nodes[1].cli, &pb, "pb", LAYERS, n * TPB, 16384, false, TPB);
    kvt_pool_make(b2, &pb2, "pb2", LAYERS, n * TPB, 16384, false, TPB);
    chain(keys, n, 6);
    save(&nodes[0], &pa, keys, 0, n, true);
    for (uint32_t i = 0; i < n; i++)
        pages[i] = i;
    a1 = load_args(&nodes[1], &pb, keys, 0, n, pages);
    a2 = load_args(&nodes[1], &pb2, keys, 0, n, pages);
    poison(&pb);
    poison(&pb2);

    /* A stopped: up, but answering nothing.  Every check until it runs
     * again only records, so that a failure does not leave it stopped. */
    kill(nodes[0].d.pid, SIGSTOP);
    KVT_OK(nodes[1].cli, kvd_cache_load_submit(nodes[1].cli, &a1, NULL, &r1, &id1));
    t0 = kvt_now_ms();
    while ((in1 = inflight_of(obs, "cluster-test")) < 1 && kvt_now_ms() - t0 < MS(5000))
        usleep(2000); /* the first is in, asking A */
    KVT_OK(b2, kvd_cache_load_submit(b2, &a2, NULL, &r2, &id2));
    t0 = kvt_now_ms();
    while ((in2 = inflight_of(obs, "second-worker")) < 1 && kvt_now_ms() - t0 < MS(5000))
        usleep(2000);
    /* both in at B, A stopped: nothing can have been pulled, and a second
     * load that did not wait for the blocks would answer now */
    usleep(200 * 1000);
    st1 = kvd_client_poll(nodes[1].cli, id1, &done1);
    st2 = kvd_client_poll(b2, id2, &done2);
    in1 = in1 < 1 ? in1 : inflight_of(obs, "cluster-test");
    in2 = in2 < 1 ? in2 : inflight_of(obs, "second-worker");
    kill(nodes[0].d.pid, SIGCONT);
    ck_assert_int_eq(st1, KVD_OK);
    ck_assert_int_eq(st2, KVD_OK);
    ck_assert_msg(!done1, "the first load answered with A stopped");
    ck_assert_msg(!done2, "the second load answered without waiting for the pull");
    ck_assert_msg(in1 == 1 && in2 == 1, "in flight at B: first %lld, second %lld (not both in)",
                  (long long)in1, (long long)in2);

    KVT_OK(nodes[1].cli, kvd_client_wait(nodes[1].cli, id1));
    KVT_OK(b2, kvd_client_wait(b2, id2));
    ck_assert_uint_eq(r1.rows, r2.rows);
    for (uint32_t i = 0; i < n; i++) {
        ck_assert_msg(kvt_page_holds(&pb, i, keys[i]), "first worker's block %u", i);
        ck_assert_msg(kvt_page_holds(&pb2, i, keys[i]), "second worker's block %u", i);
    }
    {
        kvd_daemon_status_t *s = malloc(sizeof(*s));
        KVT_OK(b2, kvd_daemon_status(b2, s, NULL, 0));
        ck_assert_uint_eq(s->cluster.blocks_fetched, n); /* pulled once, for both */
        free(s);
    }
    kvd_client_destroy(&obs);
    kvt_pool_free(b2, &pb2);
    kvd_client_destroy(&b2);
    kvt_pool_free(nodes[0].cli, &pa);
    kvt_pool_free(nodes[1].cli, &pb);
    stop_nodes(nodes, 2);
    free(keys);
    free(pages);
}
END_TEST

/* A pulled load with layer flags: the batches copied while the pull goes
 * on carry none; every group's flag is set by the last run, once the
 * whole load is in; the reply and the stats count one load of all its
 * blocks. */
START_TEST(test_pulled_load_flags)
{
    node_t nodes[2];
    kvt_pool_t pa, pb;
    uint32_t n = 64;
    uint8_t(*keys)[KEY] = malloc(n * KEY);
    int64_t *pages = malloc(n * sizeof(*pages));
    kvd_mapping_t *map = NULL;
    volatile uint32_t *flags;
    kvd_cache_load_t ld;
    kvd_cache_info_t info;
    kvd_op_result_t res;
    uint64_t buf = 0;

    memset(nodes, 0, sizeof(nodes));
    start_nodes(nodes, 2, secret_path);
    wait_all_up(nodes, 2);
    for (int i = 0; i < 2; i++)
        nodes[i].cache = make_cache(&nodes[i], "kv", 16384, true);
    kvt_pool_make(nodes[0].cli, &pa, "pa", LAYERS, n * TPB, 16384, false, TPB);
    kvt_pool_make(nodes[1].cli, &pb, "pb", LAYERS, n * TPB, 16384, false, TPB);
    KVT_OK(nodes[1].cli, kvd_buffer_register(nodes[1].cli, 64, KVD_MEM_HOST, "flags", &buf, &map));
    flags = map->base;
    for (int round = 0; round < 2; round++) {
        chain(keys, n, 10 + (uint64_t)round);
        save(&nodes[0], &pa, keys, 0, n, true);
        for (uint32_t i = 0; i < n; i++)
            pages[i] = i;
        ld = load_args(&nodes[1], &pb, keys, 0, n, pages);
        ld.layer_flags.buffer = buf;
        ld.layer_flags.offset = 4;
        ld.layer_flags.bytes = LAYERS * 4;
        ld.flag_value = 40 + (uint32_t)round;
        memset((void *)flags, 0, 64);
        poison(&pb);
        KVT_OK(nodes[1].cli, kvd_cache_load(nodes[1].cli, &ld, NULL, &res));
        ck_assert_uint_eq(res.rows, n);
        ck_assert_uint_eq(flags[0], 0);
        for (uint32_t g = 0; g < LAYERS; g++)
            ck_assert_uint_eq(flags[1 + g], 40 + (uint32_t)round);
        ck_assert_uint_eq(flags[1 + LAYERS], 0);
        for (uint32_t i = 0; i < n; i++)
            ck_assert_msg(kvt_page_holds(&pb, i, keys[i]), "round %d block %u", round, i);
    }
    KVT_OK(nodes[1].cli, kvd_cache_stats(nodes[1].cli, nodes[1].cache, NULL, &info));
    ck_assert_uint_eq(info.loads, 2);
    ck_assert_uint_eq(info.loaded, 2 * n);
    ck_assert_uint_eq(info.fetched, 2 * n);
    kvd_mapping_destroy(&map);
    KVT_OK(nodes[1].cli, kvd_buffer_drop(nodes[1].cli, buf));
    kvt_pool_free(nodes[0].cli, &pa);
    kvt_pool_free(nodes[1].cli, &pb);
    stop_nodes(nodes, 2);
    free(keys);
    free(pages);
}
END_TEST

START_TEST(test_node_lost)
{
    node_t nodes[3];
    kvt_pool_t pa, pb, pc;
    uint8_t(*keys)[KEY] = malloc(64 * KEY);
    kvd_cache_lookup_result_t r;
    kvd_status_t st;
    int64_t t0, took;
    const char *msg;

    memset(nodes, 0, sizeof(nodes));
    start_nodes(nodes, 3, secret_path);
    wait_all_up(nodes, 3);
    for (int i = 0; i < 3; i++)
        nodes[i].cache = make_cache(&nodes[i], "kv", 16384, true);
    kvt_pool_make(nodes[0].cli, &pa, "pa", LAYERS, 64 * TPB, 16384, false, TPB);
    kvt_pool_make(nodes[1].cli, &pb, "pb", LAYERS, 64 * TPB, 16384, false, TPB);
    kvt_pool_make(nodes[2].cli, &pc, "pc", LAYERS, 64 * TPB, 16384, false, TPB);
    chain(keys, 64, 3);
    save(&nodes[0], &pa, keys, 0, 32, true);   /* A: the first half */
    save(&nodes[2], &pc, keys, 32, 32, false); /* C: the second */
    r = lookup(&nodes[1], keys, 64);
    ck_assert_uint_eq(r.hits, 64);

    /* C stops answering: the load ends within the deadline, C's blocks named */
    kill(nodes[2].d.pid, SIGSTOP);
    poison(&pb);
    t0 = kvt_now_ms();
    st = load(&nodes[1], &pb, keys, 64);
    took = kvt_now_ms() - t0;
    msg = kvd_client_last_error(nodes[1].cli);
    ck_assert_msg(st == KVD_ENOENT, "the load got %s though C was stopped: %s",
                  kvd_err_name(st), msg);
    ck_assert_msg(strstr(msg, "keys[32-63] (32 of 64)") != NULL,
                  "the message names exactly C's blocks: %s", msg);
    ck_assert_msg(took < 2 * DEADLINE_MS + MS(1500), "the load took %lld ms", (long long)took);
    r = lookup(&nodes[1], keys, 64);
    ck_assert_uint_eq(r.local_hits, 32); /* A's half landed, and is intact */
    for (uint32_t i = 0; i < 32; i++) {
            int64_t pg = i;
            kvd_cache_load_t a = load_args(&nodes[1], &pb, keys, i, 1, &pg);
            KVT_OK(nodes[1].cli, kvd_cache_load(nodes[1].cli, &a, NULL, NULL));
            ck_assert(kvt_page_holds(&pb, i, keys[i]));
        }

    /* C killed: lookups elsewhere answer at once, without it */
    kvt_daemon_kill(&nodes[2].d);
    kvd_client_destroy(&nodes[2].cli);
    t0 = kvt_now_ms();
    r = lookup(&nodes[0], keys, 64);
    ck_assert_uint_le(r.hits, 32);
    ck_assert_msg(kvt_now_ms() - t0 < 2 * DEADLINE_MS + MS(500), "lookup took %lld ms",
                  (long long)(kvt_now_ms() - t0));
    kvt_pool_free(nodes[0].cli, &pa);
    kvt_pool_free(nodes[1].cli, &pb);
    kvd_mapping_destroy(&pc.map); /* its daemon is gone */
    nodes[2].d.pid = 0;
    stop_nodes(nodes, 3);
    free(keys);
}
END_TEST

/* A peer that stops answering costs nothing to lookups and loads of
 * chains the live peers hold: once the peers that answered hold every
 * key asked, the others are not waited for (and the reply names none).
 * A lookup that needs its answer waits the deadline for it, and the
 * reply names the peer it waited for. */
START_TEST(test_stopped_peer)
{
    node_t nodes[3];
    kvt_pool_t pa, pb;
    uint8_t(*keys)[KEY] = malloc(33 * KEY);
    kvd_cache_lookup_result_t r;
    char c_addr[64];
    int64_t t0, took;

    memset(nodes, 0, sizeof(nodes));
    deadline_ms = deadline_of(MS(5000)); /* long: waiting for C would show */
    start_nodes(nodes, 3, secret_path);
    deadline_ms = 0;
    wait_all_up(nodes, 3);
    for (int i = 0; i < 3; i++)
        nodes[i].cache = make_cache(&nodes[i], "kv", 1024, true);
    kvt_pool_make(nodes[0].cli, &pa, "pa", LAYERS, 32 * TPB, 1024, false, TPB);
    kvt_pool_make(nodes[1].cli, &pb, "pb", LAYERS, 32 * TPB, 1024, false, TPB);
    chain(keys, 33, 7); /* the 33rd key: on no node */
    save(&nodes[0], &pa, keys, 0, 32, true);
    snprintf(c_addr, sizeof(c_addr), "127.0.0.1:%d", nodes[2].port);

    kill(nodes[2].d.pid, SIGSTOP); /* C: up, but answers nothing */
    t0 = kvt_now_ms();
    r = lookup(&nodes[1], keys, 32);
    took = kvt_now_ms() - t0;
    ck_assert_uint_eq(r.hits, 32);
    ck_assert_msg(took < MS(1000), "the lookup waited %lld ms for the stopped peer",
                  (long long)took);
    ck_assert_msg(r.waited_for[0] == '\0', "nobody was waited for, the reply names '%s'",
                  r.waited_for);
    /* a key no live peer holds: only C could have it, so C is waited for */
    t0 = kvt_now_ms();
    r = lookup(&nodes[1], keys, 33);
    took = kvt_now_ms() - t0;
    ck_assert_uint_eq(r.hits, 32);
    ck_assert_uint_eq(r.local_hits, 0);
    ck_assert_msg(took >= MS(5000) - 100, "the lookup answered after %lld ms, before the "
                  "deadline it waited for C", (long long)took);
    ck_assert_msg(strcmp(r.waited_for, c_addr) == 0, "the reply names '%s' as waited for, "
                  "not C (%s)", r.waited_for, c_addr);
    poison(&pb);
    t0 = kvt_now_ms();
    KVT_OK(nodes[1].cli, load(&nodes[1], &pb, keys, 32));
    took = kvt_now_ms() - t0;
    ck_assert_msg(took < MS(1000), "the load waited %lld ms for the stopped peer",
                  (long long)took);
    for (uint32_t i = 0; i < 32; i++)
        ck_assert_msg(kvt_page_holds(&pb, i, keys[i]), "block %u differs", i);
    kill(nodes[2].d.pid, SIGCONT);
    kvt_pool_free(nodes[0].cli, &pa);
    kvt_pool_free(nodes[1].cli, &pb);
    stop_nodes(nodes, 3);
    free(keys);
}
END_TEST

/* Two nodes up, caches of 1 MiB blocks, a pool of n blocks on each, and
 * a chain of n blocks (from seed) saved on A. */
static void chain_on_a(node_t *nodes, kvt_pool_t *pa, kvt_pool_t *pb, uint8_t (*keys)[KEY],
                       uint32_t n, uint64_t seed)
{
    memset(nodes, 0, 2 * sizeof(*nodes));
    start_nodes(nodes, 2, secret_path);
    wait_all_up(nodes, 2);
    for (int i = 0; i < 2; i++)
        nodes[i].cache = make_cache(&nodes[i], "kv", 65536, true);
    kvt_pool_make(nodes[0].cli, pa, "pa", LAYERS, n * TPB, 65536, false, TPB);
    kvt_pool_make(nodes[1].cli, pb, "pb", LAYERS, n * TPB, 65536, false, TPB);
    chain(keys, n, seed);
    save(&nodes[0], pa, keys, 0, n, true);
}

/* A call to the fetcher d ended with st: when that is a lost connection
 * because d died (UCX 1.13 aborted a fetcher that still had a wireup reply
 * queued for a sender that died: "got REP message"), fail naming it, with
 * its log.  Its socket closes just before it can be reaped: up to 1 s. */
static void fetcher_alive(kvt_daemon_t *d, kvd_status_t st)
{
    int ws = 0, r = 0;

    for (int i = 0; i < 100 && st == KVD_ECONN && (r = waitpid(d->pid, &ws, WNOHANG)) == 0; i++)
        usleep(10000);
    if (st != KVD_ECONN || r != d->pid)
        return;
    kvt_daemon_dump_log(d);
    d->pid = -1;
    ck_abort_msg("the fetcher died (%s %d) when its sender was killed",
                 WIFSIGNALED(ws) ? "signal" : "exit status",
                 WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
}

/* The call to the fetcher d (on client cli) must succeed; d must not die. */
#define FETCHER_OK(d, cli, call)                                                                   \
    do {                                                                                           \
        kvd_status_t fst_ = (call);                                                                \
        fetcher_alive(d, fst_);                                                                    \
        KVT_OK(cli, fst_);                                                                         \
    } while (0)

/* Blocks B (daemon d) has fetched from its peers since the count was `before`. */
static uint64_t fetched_since(kvt_daemon_t *d, kvd_client_t *watch, kvd_daemon_status_t *s,
                              uint64_t before)
{
    FETCHER_OK(d, watch, kvd_daemon_status(watch, s, NULL, 0));
    return s->cluster.blocks_fetched - before;
}

/* B, the fetcher of chain_on_a, killed with SIGKILL: its client, its
 * directory and the mapping of its pool pb gone with it. */
static void fetcher_kill(node_t *nodes, kvt_pool_t *pb)
{
    kvt_daemon_kill(&nodes[1].d);
    kvd_client_destroy(&nodes[1].cli);
    kvt_daemon_stop(&nodes[1].d, 0); /* its directory */
    kvd_mapping_destroy(&pb->map);
}

/* B again, on its address, after fetcher_kill: A serves it every block of
 * the chain (keys, n blocks) byte for byte; then both nodes stop. */
static void fetcher_again(node_t *nodes, kvt_pool_t *pa, kvt_pool_t *pb, uint8_t (*keys)[KEY],
                          uint32_t n)
{
    start_node(&nodes[1], secret_path);
    wait_all_up(nodes, 2);
    nodes[1].cache = make_cache(&nodes[1], "kv", 65536, true);
    kvt_pool_make(nodes[1].cli, pb, "pb", LAYERS, n * TPB, 65536, false, TPB);
    poison(pb);
    KVT_OK(nodes[1].cli, load(&nodes[1], pb, keys, n));
    for (uint32_t i = 0; i < n; i++)
        ck_assert_msg(kvt_page_holds(pb, i, keys[i]), "block %u differs", i);
    kvt_pool_free(nodes[0].cli, pa);
    kvt_pool_free(nodes[1].cli, pb);
    stop_nodes(nodes, 2);
}

/* A pull of 96 MiB from A to B, and one side killed during it: killed
 * A (the sender), B's load ends within the deadline naming what did not
 * come, and what landed is whole; killed B (the fetcher), A goes on and
 * serves a new peer.  Either way the survivor's UCX lanes settle the
 * endpoints of the dead, and the survivor lives (UCX 1.13 asserted here,
 * "got REP message", about 1 run in 8 when two workers had connected both
 * ways, and about 1 in 40 under load while lanes were wired up at their
 * first block: a reply still queued for the dead; lane.h).
 *
 * The sender is killed while the load is in flight for certain: once
 * some blocks have landed on B (its status), A is stopped, and only if
 * B then still lacks some and has not answered the load is A killed;
 * the load must then fail, after the kill, naming the blocks that did
 * not come (a pull that outran the watcher is tried again). */
static void killed_mid_load_once(int kill_fetcher, uint64_t seed)
{
    node_t nodes[2];
    kvt_pool_t pa, pb;
    uint32_t n = 96;
    uint8_t(*keys)[KEY] = malloc(n * KEY);
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    kvd_client_t *watch = NULL;
    kvd_cache_load_t a;
    int64_t *pages = malloc(n * sizeof(*pages)), t0;
    kvd_op_result_t res;
    uint64_t id, before = 0, got = 0;
    kvd_status_t st;
    bool done = false;

    chain_on_a(nodes, &pa, &pb, keys, n, seed);
    for (uint32_t i = 0; i < n; i++)
        pages[i] = i;
    if (!kill_fetcher) {
        ck_assert_int_eq(kvd_client_create(nodes[1].d.socket, "watcher", &watch), KVD_OK);
        before = fetched_since(&nodes[1].d, watch, s, 0);
    }
    for (int attempt = 0;; attempt++) {
        a = load_args(&nodes[1], &pb, keys, 0, n, pages);
        poison(&pb);
        t0 = kvt_now_ms();
        KVT_OK(nodes[1].cli, kvd_cache_load_submit(nodes[1].cli, &a, NULL, &res, &id));
        if (kill_fetcher) {
            usleep(5000);
            break;
        }
        /* A stopped once blocks are landing: B then holds part of the pull */
        while ((got = fetched_since(&nodes[1].d, watch, s, before)) == 0)
            ck_assert_msg(kvt_now_ms() - t0 < MS(30000), "no block landed on B in 30 s");
        kill(nodes[0].d.pid, SIGSTOP);
        usleep((useconds_t)MS(200)); /* what was on its way lands, or stays away */
        got = fetched_since(&nodes[1].d, watch, s, before);
        KVT_OK(nodes[1].cli, kvd_client_poll(nodes[1].cli, id, &done));
        if (got < n && !done)
            break;
        /* the pull outran the watcher: again, with B's copies gone */
        kill(nodes[0].d.pid, SIGCONT);
        ck_assert_msg(attempt < 4, "the pull of %u blocks ended before A could be stopped, "
                      "%d times", n, attempt + 1);
        KVT_OK(nodes[1].cli, kvd_client_wait(nodes[1].cli, id));
        KVT_OK(nodes[1].cli, kvd_cache_evict(nodes[1].cli, nodes[1].cache, NULL, true, NULL));
        before = fetched_since(&nodes[1].d, watch, s, 0);
    }
    if (kill_fetcher) {
        fetcher_kill(nodes, &pb); /* during the pull of 96 MiB */
        usleep(200000);
        ck_assert_msg(kill(nodes[0].d.pid, 0) == 0, "A died with its fetcher");
        fetcher_again(nodes, &pa, &pb, keys, n);
        free(keys);
        free(pages);
        free(s);
        return;
    }
    /* in flight: B holds got < n blocks and has not answered; A dies */
    kvt_daemon_kill(&nodes[0].d);
    t0 = kvt_now_ms();
    st = kvd_client_wait_timeout(nodes[1].cli, id, (int)(2 * DEADLINE_MS + MS(1500)));
    fetcher_alive(&nodes[1].d, st);
    ck_assert_msg(st != KVD_ETIMEDOUT, "the load had not ended %lld ms after A was killed "
                  "(%" PRIu64 " of %u blocks in)", (long long)(kvt_now_ms() - t0), got, n);
    ck_assert_msg(st == KVD_ENOENT, "the load in flight when A died got %s (%" PRIu64 " of %u "
                  "blocks had landed): %s", kvd_err_name(st), got, n,
                  kvd_client_last_error(nodes[1].cli));
    {
        /* it names at least the blocks that never came (and those chained
         * after one: they go with it) */
        const char *msg = kvd_client_last_error(nodes[1].cli), *at = strstr(msg, "] (");
        uint64_t now_in = fetched_since(&nodes[1].d, watch, s, before);
        unsigned missing = 0, of = 0;
        ck_assert_msg(at != NULL && sscanf(at, "] (%u of %u)", &missing, &of) == 2,
                      "the failure names no keys: %s", msg);
        ck_assert_uint_eq(of, n);
        ck_assert_msg(missing >= n - now_in && missing > 0, "B fetched %" PRIu64 " of %u "
                      "blocks, the failure names %u missing: %s", now_in, n, missing, msg);
    }
    /* what B kept is whole: every block it now has locally loads right */
    for (uint32_t i = 0; i < n; i++) {
        kvd_cache_keys_t one = keys_of(keys, i, 1);
        kvd_cache_lookup_result_t r;
        FETCHER_OK(&nodes[1].d, nodes[1].cli,
                   kvd_cache_lookup(nodes[1].cli, nodes[1].cache, &one, false, 0, &r));
        if (r.local_hits == 1) {
            int64_t pg = i;
            kvd_cache_load_t b = load_args(&nodes[1], &pb, keys, i, 1, &pg);
            memset(kvt_page(&pb, i, 0, 0), 0, 16);
            FETCHER_OK(&nodes[1].d, nodes[1].cli, kvd_cache_load(nodes[1].cli, &b, NULL, NULL));
            ck_assert_msg(kvt_page_holds(&pb, i, keys[i]), "block %u kept by B is corrupt", i);
        }
    }
    kvd_client_destroy(&watch);
    kvd_client_destroy(&nodes[0].cli);
    kvt_daemon_stop(&nodes[0].d, 0); /* its directory */
    kvt_pool_free(nodes[1].cli, &pb);
    kvd_mapping_destroy(&pa.map);
    stop_nodes(nodes, 2); /* B exits cleanly: its lanes settled */
    free(keys);
    free(pages);
    free(s);
}

START_TEST(test_killed_mid_load)
{
    killed_mid_load_once(0, 4);
}
END_TEST

/* The same, KVD_TEST_KILL_RUNS times (default 4), killing the sender and
 * the fetcher in turn: what tripped UCX showed about 1 run in 8, so run it
 * 20 times or more when lanes or endpoints change. */
START_TEST(test_killed_mid_load_repeated)
{
    const char *e = getenv("KVD_TEST_KILL_RUNS");
    int runs = e != NULL && atoi(e) > 0 ? atoi(e) : 4;

    for (int i = 0; i < runs; i++)
        killed_mid_load_once(i & 1, 100 + (uint64_t)i);
}
END_TEST

/* A fetcher stopped (SIGSTOP) mid-pull, so that the sender's sends fill
 * the sockets and wait to write, then killed: the kernel resets the
 * sender's connections under its waiting sends.  The sender lives and
 * serves a new fetcher on the same address every block. */
START_TEST(test_fetcher_killed_while_sender_waits)
{
    node_t nodes[2];
    kvt_pool_t pa, pb;
    uint32_t n = 96;
    uint8_t(*keys)[KEY] = malloc(n * KEY);
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    kvd_client_t *watch = NULL;
    int64_t *pages = malloc(n * sizeof(*pages)), t0;
    kvd_cache_load_t a;
    kvd_op_result_t res;
    uint64_t id;
    int ws = 0;

    chain_on_a(nodes, &pa, &pb, keys, n, 7);
    for (uint32_t i = 0; i < n; i++)
        pages[i] = i;
    ck_assert_int_eq(kvd_client_create(nodes[1].d.socket, "watcher", &watch), KVD_OK);
    a = load_args(&nodes[1], &pb, keys, 0, n, pages);
    t0 = kvt_now_ms();
    KVT_OK(nodes[1].cli, kvd_cache_load_submit(nodes[1].cli, &a, NULL, &res, &id));
    while (fetched_since(&nodes[1].d, watch, s, 0) == 0)
        ck_assert_msg(kvt_now_ms() - t0 < MS(30000), "no block landed on B in 30 s");
    kill(nodes[1].d.pid, SIGSTOP);
    usleep((useconds_t)MS(300)); /* A's sends fill the sockets and wait */
    kvd_client_destroy(&watch);
    fetcher_kill(nodes, &pb);
    usleep((useconds_t)MS(500));
    ck_assert_msg(waitpid(nodes[0].d.pid, &ws, WNOHANG) == 0, "the sender died (%s %d) when "
                  "its stopped fetcher was killed", WIFSIGNALED(ws) ? "signal" : "exit status",
                  WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
    fetcher_again(nodes, &pa, &pb, keys, n);
    free(keys);
    free(pages);
    free(s);
}
END_TEST

/* The sender killed as the first blocks land on a fetcher of 8 lanes,
 * KVD_TEST_KILL_RUNS times (default 4): each of the fetcher's lanes has
 * finished its UCX wireup before any block of the pull goes, so the
 * fetcher holds no wireup reply for the dead (with UCX 1.13 a queued one
 * aborted it, "got REP message", when its lanes were wired up at their
 * first block). */
START_TEST(test_killed_sender_many_lanes)
{
    const char *e = getenv("KVD_TEST_KILL_RUNS");
    int runs = e != NULL && atoi(e) > 0 ? atoi(e) : 4;

    lanes_b = 8;
    for (int i = 0; i < runs; i++)
        killed_mid_load_once(0, 300 + (uint64_t)i);
    lanes_b = 0;
}
END_TEST

/* A large pull lands in a steady stream, not all at its end: another
 * client watching B's counter while the load runs sees some of the
 * blocks in before the last (UCX shares a link among every receive it is
 * given, so 96 receives given at once would all end together; B gives it
 * a window at a time).  What lands early is what early runs copy while
 * the rest come, and what shows the peer alive within the deadline. */
START_TEST(test_pull_streams)
{
    node_t nodes[2];
    kvt_pool_t pa, pb;
    uint32_t n = 96, partial = 0, samples = 0;
    uint8_t(*keys)[KEY] = malloc(n * KEY);
    int64_t *pages = malloc(n * sizeof(*pages));
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    kvd_client_t *watch = NULL;
    kvd_cache_load_t a;
    kvd_op_result_t res;
    uint64_t id, before;

    chain_on_a(nodes, &pa, &pb, keys, n, 5);
    ck_assert_int_eq(kvd_client_create(nodes[1].d.socket, "watcher", &watch), KVD_OK);
    KVT_OK(watch, kvd_daemon_status(watch, s, NULL, 0));
    before = s->cluster.blocks_fetched;
    for (uint32_t i = 0; i < n; i++)
        pages[i] = i;
    a = load_args(&nodes[1], &pb, keys, 0, n, pages);
    poison(&pb);
    KVT_OK(nodes[1].cli, kvd_cache_load_submit(nodes[1].cli, &a, NULL, &res, &id));
    {
        int64_t t0 = kvt_now_ms();
        for (;;) {
            uint64_t got;
            KVT_OK(watch, kvd_daemon_status(watch, s, NULL, 0));
            got = s->cluster.blocks_fetched - before;
            samples++;
            partial += got > 0 && got < n;
            if (got >= n)
                break;
            ck_assert_msg(kvt_now_ms() - t0 < MS(30000), "B fetched %" PRIu64 " of %u blocks "
                          "in 30 s", got, n);
        }
    }
    KVT_OK(nodes[1].cli, kvd_client_wait(nodes[1].cli, id));
    for (uint32_t i = 0; i < n; i++)
        ck_assert_msg(kvt_page_holds(&pb, i, keys[i]), "block %u on B differs from A's", i);
    ck_assert_msg(partial > 0, "in %u looks at B's counter during a pull of %u blocks, none "
                  "saw some in and some not", samples, n);
    kvd_client_destroy(&watch);
    kvt_pool_free(nodes[0].cli, &pa);
    kvt_pool_free(nodes[1].cli, &pb);
    stop_nodes(nodes, 2);
    free(keys);
    free(pages);
    free(s);
}
END_TEST

/* A node restarted on its address (its old connections in TIME_WAIT)
 * listens again at once, and its peer finds it up again. */
START_TEST(test_restart_rejoins)
{
    node_t nodes[2];
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    int64_t t0;

    memset(nodes, 0, sizeof(nodes));
    start_nodes(nodes, 2, secret_path);
    wait_all_up(nodes, 2);
    kvd_client_destroy(&nodes[0].cli);
    stop_checked(&nodes[0].d);
    start_node(&nodes[0], secret_path); /* the same port, at once */
    t0 = kvt_now_ms();
    wait_all_up(nodes, 2);
    ck_assert_msg(kvt_now_ms() - t0 < MS(8000), "rejoined after %lld ms",
                  (long long)(kvt_now_ms() - t0));
    KVT_OK(nodes[1].cli, kvd_daemon_status(nodes[1].cli, s, NULL, 0));
    ck_assert_uint_ge(s->cluster.peers[0].failures, 1); /* it was seen going down */
    stop_nodes(nodes, 2);
    free(s);
}
END_TEST

/* GET path from 127.0.0.1:port; the whole answer (malloc'd). */
static char *http_get(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    const char *req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    ssize_t n;

    ck_assert_int_ge(fd, 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    while (len + 1 < cap && (n = read(fd, buf + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    buf[len] = '\0';
    close(fd);
    return buf;
}

/* What an operator sees: kvdock status (table and JSON), kvdock top and
 * the metrics name each peer and its health, and follow a peer going
 * down. */
START_TEST(test_status_and_metrics)
{
    node_t nodes[2];
    char mport[16], maddr[32], want[128], *m, *out = NULL, *err = NULL;
    char *log = malloc(1 << 20);
    const char *argv[6];
    int rc;

    /* as an operator runs it: UCX warns (at exit) of UCX_* variables
     * nothing read, and the daemon sets some itself */
    unsetenv("UCX_WARN_UNUSED_ENV_VARS");
    memset(nodes, 0, sizeof(nodes));
    nodes[0].port = free_port();
    do
        nodes[1].port = free_port();
    while (nodes[1].port == nodes[0].port);
    snprintf(peer_list, sizeof(peer_list), "127.0.0.1:%d,127.0.0.1:%d", nodes[0].port,
             nodes[1].port);
    do
        snprintf(mport, sizeof(mport), "%d", free_port());
    while (atoi(mport) == nodes[0].port || atoi(mport) == nodes[1].port);
    snprintf(maddr, sizeof(maddr), "127.0.0.1:%s", mport);
    start_node_with(&nodes[0], secret_path, maddr);
    start_node(&nodes[1], secret_path);
    wait_all_up(nodes, 2);
    nodes[0].cache = make_cache(&nodes[0], "kv", 1024, true);

    argv[0] = KVDOCK_CLI_PATH;
    argv[1] = "--socket";
    argv[2] = nodes[0].d.socket;
    argv[3] = "status";
    argv[4] = NULL;
    rc = kvt_run(argv, &out, &err, 20000);
    ck_assert_msg(rc == 0, "kvdock status: %d %s", rc, err);
    snprintf(want, sizeof(want), "127.0.0.1:%d  up", nodes[1].port);
    ck_assert_msg(strstr(out, "cluster     node 127.0.0.1:") != NULL && strstr(out, want) != NULL,
                  "kvdock status shows the peer up:\n%s", out);
    free(out);
    free(err);
    argv[4] = "--json";
    argv[5] = NULL;
    rc = kvt_run(argv, &out, &err, 20000);
    ck_assert_int_eq(rc, 0);
    ck_assert(kvt_json_object_valid(out));
    ck_assert_ptr_nonnull(strstr(out, "\"cluster\":{\"node\":"));
    ck_assert_ptr_nonnull(strstr(out, "\"state\":\"up\""));
    free(out);
    free(err);
    {
        const char *mk[] = {KVDOCK_CLI_PATH, "--socket", nodes[0].d.socket, "cache", "create",
                            "kv2", "--layers", "2", "--tokens-per-block", "4", "--token-bytes",
                            "64", "--budget", "1m", "--cluster", NULL};
        const char *st[] = {KVDOCK_CLI_PATH, "--socket", nodes[0].d.socket, "cache", "stats",
                            "kv2", "--json", NULL};
        rc = kvt_run(mk, &out, &err, 20000);
        ck_assert_msg(rc == 0, "kvdock cache create --cluster: %d %s", rc, err);
        free(out);
        free(err);
        rc = kvt_run(st, &out, &err, 20000);
        ck_assert_msg(rc == 0 && strstr(out, "\"cluster\":true") != NULL,
                      "kvdock cache stats --json:\n%s", out);
        free(out);
        free(err);
        st[4] = "ls"; /* FLAGS says it is a cluster cache */
        st[5] = NULL;
        rc = kvt_run(st, &out, &err, 20000);
        ck_assert_msg(rc == 0 && strstr(out, " cluster\n") != NULL, "kvdock cache ls:\n%s", out);
        free(out);
        free(err);
    }
    argv[3] = "top";
    argv[4] = "--once";
    rc = kvt_run(argv, &out, &err, 20000);
    snprintf(want, sizeof(want), "cluster: 127.0.0.1:%d, 1 of 1 peers up", nodes[0].port);
    ck_assert_msg(rc == 0 && strstr(out, want) != NULL, "kvdock top --once:\n%s", out);
    free(out);
    free(err);
    argv[3] = "status";

    m = http_get(atoi(mport));
    snprintf(want, sizeof(want), "kvdock_cluster_peer_up{peer=\"127.0.0.1:%d\"} 1",
             nodes[1].port);
    ck_assert_msg(strstr(m, want) != NULL && strstr(m, "kvdock_cluster_inbound 1") != NULL &&
                      strstr(m, "kvdock_cache_fetched_blocks_total{cache=\"kv\"") != NULL,
                  "metrics:\n%s", m);
    free(m);

    /* the peer goes: both say so */
    kvd_client_destroy(&nodes[1].cli);
    stop_checked(&nodes[1].d);
    snprintf(want, sizeof(want), "kvdock_cluster_peer_up{peer=\"127.0.0.1:%d\"} 0",
             nodes[1].port);
    for (int64_t t0 = kvt_now_ms();; usleep(50000)) {
        m = http_get(atoi(mport));
        if (strstr(m, want) != NULL)
            break;
        free(m);
        ck_assert_msg(kvt_now_ms() - t0 < MS(5000), "the peer still shows up in the metrics");
    }
    free(m);
    argv[4] = NULL;
    rc = kvt_run(argv, &out, &err, 20000);
    snprintf(want, sizeof(want), "127.0.0.1:%d  down", nodes[1].port);
    ck_assert_msg(rc == 0 && strstr(out, want) != NULL, "kvdock status:\n%s", out);
    free(out);
    free(err);
    kvd_client_destroy(&nodes[0].cli);
    stop_checked_log(&nodes[0].d, log, 1 << 20);
    ck_assert_msg(strstr(log, "unused env variable") == NULL, "UCX warned:\n%s", log);
    free(log);
}
END_TEST

/* 64 peers (the limit), named in a --cluster-peers of over 255 bytes:
 * the daemon takes them all, and the library, kvdock status and --json
 * show every one. */
START_TEST(test_many_peers)
{
    node_t node;
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    const char *argv[6];
    char *out = NULL, *err = NULL, want[64];
    int rc;

    memset(&node, 0, sizeof(node));
    node.port = free_port();
    snprintf(peer_list, sizeof(peer_list), "127.0.0.1:%d", node.port);
    for (int i = 0; i < 64; i++) /* nothing listens there: they stay down */
        snprintf(peer_list + strlen(peer_list), sizeof(peer_list) - strlen(peer_list),
                 ",127.0.0.1:%d", 1000 + i);
    ck_assert_uint_gt(strlen(peer_list), 255);
    ck_assert_int_ge(KVD_CLUSTER_PEERS_MAX, 64);
    start_node(&node, secret_path);
    KVT_OK(node.cli, kvd_daemon_status(node.cli, s, NULL, 0));
    ck_assert_uint_eq(s->cluster.num_peers, 64);
    for (int i = 0; i < 64; i++) { /* in the configured order, every one */
        snprintf(want, sizeof(want), "127.0.0.1:%d", 1000 + i);
        ck_assert_str_eq(s->cluster.peers[i].address, want);
    }
    argv[0] = KVDOCK_CLI_PATH;
    argv[1] = "--socket";
    argv[2] = node.d.socket;
    argv[3] = "status";
    argv[4] = NULL;
    rc = kvt_run(argv, &out, &err, 20000);
    ck_assert_msg(rc == 0 && strstr(out, "127.0.0.1:1000 ") != NULL &&
                      strstr(out, "127.0.0.1:1063 ") != NULL && strstr(out, "not shown") == NULL,
                  "kvdock status:\n%s", out);
    free(out);
    free(err);
    argv[4] = "--json";
    argv[5] = NULL;
    rc = kvt_run(argv, &out, &err, 20000);
    ck_assert_msg(rc == 0 && kvt_json_object_valid(out) &&
                      strstr(out, "\"peers_total\":64,\"peers_shown\":64") != NULL &&
                      strstr(out, "\"127.0.0.1:1063\"") != NULL,
                  "kvdock status --json:\n%s", out);
    free(out);
    free(err);
    kvd_client_destroy(&node.cli);
    stop_checked(&node.d);
    free(s);
}
END_TEST

/* The same peers file on every node (comments, blank lines, the node's own
 * address among the others): each skips itself and finds the rest. */
START_TEST(test_peers_file)
{
    node_t nodes[3];
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    FILE *f;

    memset(nodes, 0, sizeof(nodes));
    snprintf(peers_file, sizeof(peers_file), "%s/peers", dir);
    for (int i = 0; i < 3; i++) {
        nodes[i].port = free_port();
        for (int j = 0; j < i; j++)
            if (nodes[j].port == nodes[i].port) {
                nodes[i].port = free_port();
                j = -1;
            }
    }
    f = fopen(peers_file, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "# the cluster\n\n127.0.0.1:%d\n  127.0.0.1:%d  # the second\n127.0.0.1:%d,"
            "127.0.0.1:%d\n", nodes[0].port, nodes[1].port, nodes[2].port, nodes[0].port);
    fclose(f);
    for (int i = 0; i < 3; i++)
        start_node(&nodes[i], secret_path);
    wait_all_up(nodes, 3);
    KVT_OK(nodes[0].cli, kvd_daemon_status(nodes[0].cli, s, NULL, 0));
    ck_assert_uint_eq(s->cluster.num_peers, 2); /* itself and the repeat skipped */
    stop_nodes(nodes, 3);
    unlink(peers_file);
    peers_file[0] = '\0';
    free(s);
}
END_TEST

START_TEST(test_wrong_secret)
{
    node_t nodes[1], intruder;
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    char peers[64], listen[64], buf[1 << 16];
    uint8_t(*keys)[KEY] = malloc(8 * KEY);
    kvt_pool_t pa;
    int64_t t0;
    FILE *f;
    size_t n;

    memset(nodes, 0, sizeof(nodes));
    memset(&intruder, 0, sizeof(intruder));
    allow_from = "127.0.0.1"; /* the intruder's address: let in, it must prove the secret */
    start_nodes(nodes, 1, secret_path);
    allow_from = NULL;
    nodes[0].cache = make_cache(&nodes[0], "kv", 1024, true);
    kvt_pool_make(nodes[0].cli, &pa, "pa", LAYERS, 8 * TPB, 1024, false, TPB);
    chain(keys, 8, 5);
    save(&nodes[0], &pa, keys, 0, 8, true);
    intruder.port = free_port();
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", intruder.port);
    snprintf(peers, sizeof(peers), "127.0.0.1:%d", nodes[0].port);
    {
        char deadline[32];
        snprintf(deadline, sizeof(deadline), "%d", DEADLINE_MS);
        const char *extra[] = {"--host-memory-budget", "256M", "--cluster-listen", listen,
                               "--cluster-peers", peers, "--cluster-secret-file",
                               other_secret_path, "--cluster-deadline-ms", deadline, NULL};
        ck_assert_int_eq(kvt_daemon_start(&intruder.d, "cpu", extra, (int)MS(10000)), 0);
    }
    ck_assert_int_eq(kvd_client_create(intruder.d.socket, "intruder", &intruder.cli), KVD_OK);
    intruder.cache = make_cache(&intruder, "kv", 1024, true);
    t0 = kvt_now_ms();
    for (;;) { /* the intruder finds its peer refusing */
        KVT_OK(intruder.cli, kvd_daemon_status(intruder.cli, s, NULL, 0));
        if (strcmp(s->cluster.peers[0].state, "refused") == 0)
            break;
        ck_assert_msg(kvt_now_ms() - t0 < MS(10000), "peer state %s", s->cluster.peers[0].state);
        usleep(20000);
    }
    ck_assert_uint_eq(lookup(&intruder, keys, 8).hits, 0);
    KVT_OK(nodes[0].cli, kvd_daemon_status(nodes[0].cli, s, NULL, 0));
    ck_assert_uint_ge(s->cluster.refused, 1);
    ck_assert_uint_eq(s->cluster.inbound, 0);
    ck_assert_uint_eq(s->cluster.blocks_served, 0);
    f = fopen(nodes[0].d.log, "r");
    ck_assert_ptr_nonnull(f);
    n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    ck_assert_msg(strstr(buf, "event=cluster_refused") != NULL &&
                      strstr(buf, "no proof of the secret") != NULL,
                  "the refusal is logged:\n%s", buf);
    kvd_client_destroy(&intruder.cli);
    stop_checked(&intruder.d);
    kvt_pool_free(nodes[0].cli, &pa);
    stop_nodes(nodes, 1);
    free(s);
    free(keys);
}
END_TEST

/* ---- hostile peers ------------------------------------------------------------ */

static rawpeer_t *peer_from(const node_t *node, const char *from)
{
    rawpeer_t *rp = rawpeer_new();

    ck_assert_ptr_nonnull(rp);
    ck_assert_msg(rawpeer_connect_from(rp, from, node->port) == 0, "cannot connect to %d from %s",
                  node->port, from ? from : "127.0.0.1");
    return rp;
}

static rawpeer_t *peer_to(const node_t *node)
{
    return peer_from(node, NULL);
}

/* A raw peer to node that said Hello and got its Challenge. */
static rawpeer_t *challenged(const node_t *node)
{
    rawpeer_t *rp = peer_to(node);
    Kvdock__Cluster__Msg *r;

    ck_assert_int_eq(rawpeer_hello(rp, RAWPEER_VERSION), 0);
    r = rawpeer_wait(rp, KVDOCK__CLUSTER__MSG__M_CHALLENGE, (int)MS(5000));
    ck_assert_msg(r != NULL, "no Challenge to a Hello");
    kvdock__cluster__msg__free_unpacked(r, NULL);
    return rp;
}

/* The daemon closes rp's connection, saying why (says, in its Refused;
 * NULL: closed, whatever it said). */
static void expect_refused(rawpeer_t *rp, const char *says)
{
    char why[256];

    ck_assert_msg(rawpeer_wait_closed(rp, (int)MS(5000), why, sizeof(why)),
                  "the connection stays open (expected: %s)", says ? says : "closed");
    ck_assert_msg(says == NULL || strstr(why, says) != NULL, "refused for \"%s\", expected \"%s\"",
                  why, says);
    rawpeer_free(rp);
}

/* Send m, and the daemon's answer of case want must come. */
static Kvdock__Cluster__Msg *exchange(rawpeer_t *rp, const Kvdock__Cluster__Msg *m,
                                      Kvdock__Cluster__Msg__MCase want)
{
    Kvdock__Cluster__Msg *r;

    ck_assert_int_eq(rawpeer_send_msg(rp, m), 0);
    r = rawpeer_wait(rp, want, (int)MS(5000));
    ck_assert_msg(r != NULL, "no answer of case %d: the connection was closed or nothing came",
                  (int)want);
    return r;
}

/* The daemon still answers rp: a Ping gets its Pong. */
static void expect_answers(rawpeer_t *rp)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT, *r;
    Kvdock__Cluster__Ping pi = KVDOCK__CLUSTER__PING__INIT;

    pi.t = 42;
    m.m_case = KVDOCK__CLUSTER__MSG__M_PING;
    m.ping = &pi;
    r = exchange(rp, &m, KVDOCK__CLUSTER__MSG__M_PONG);
    ck_assert_uint_eq(r->pong->t, 42);
    kvdock__cluster__msg__free_unpacked(r, NULL);
}

static Kvdock__Cluster__CacheRef kv_ref(const char *name)
{
    Kvdock__Cluster__CacheRef ref = KVDOCK__CLUSTER__CACHE_REF__INIT;

    ref.name = (char *)name;
    ref.num_layers = LAYERS;
    ref.tokens_per_block = TPB;
    ref.token_bytes = 1024;
    ref.dtype = "bf16";
    return ref;
}

/* B pulls a chain saved on A and gets A's bytes: the cluster still works. */
static void expect_cluster_works(node_t *a, node_t *b, uint64_t seed)
{
    uint8_t(*keys)[KEY] = malloc(16 * KEY);
    kvt_pool_t pa, pb;

    kvt_pool_make(a->cli, &pa, "pa", LAYERS, 16 * TPB, 1024, false, TPB);
    kvt_pool_make(b->cli, &pb, "pb", LAYERS, 16 * TPB, 1024, false, TPB);
    chain(keys, 16, seed);
    save(a, &pa, keys, 0, 16, true);
    poison(&pb);
    if (load(b, &pb, keys, 16) != KVD_OK) {
        kvt_daemon_dump_log(&a->d);
        kvt_daemon_dump_log(&b->d);
        ck_abort_msg("the load on %d of a chain saved on %d: %s", b->port, a->port,
                     kvd_client_last_error(b->cli));
    }
    for (uint32_t i = 0; i < 16; i++)
        ck_assert_msg(kvt_page_holds(&pb, i, keys[i]), "block %u pulled from A differs", i);
    kvt_pool_free(a->cli, &pa);
    kvt_pool_free(b->cli, &pb);
    free(keys);
}

static uint64_t refused_count(node_t *node)
{
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    uint64_t n;

    KVT_OK(node->cli, kvd_daemon_status(node->cli, s, NULL, 0));
    n = s->cluster.refused;
    free(s);
    return n;
}

/* CPU time (user + system, all threads) of pid, in clock ticks. */
static uint64_t cpu_ticks(pid_t pid)
{
    char path[64], buf[4096], *p;
    unsigned long long ut = 0, st = 0;
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')'); /* the name may hold blanks */
    ck_assert_ptr_nonnull(p);
    /* after ") ": state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt
     * cmajflt utime(14) stime(15) */
    ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                            &ut, &st), 2);
    return ut + st;
}

/* The daemon is alive, idle (its threads used under 5% of a core over
 * 2 s), and answers its local clients. */
static void expect_idle(node_t *node, const char *after)
{
    uint64_t t0, t1;
    long hz = sysconf(_SC_CLK_TCK);
    kvd_daemon_status_t *s = malloc(sizeof(*s));

    ck_assert_msg(kill(node->d.pid, 0) == 0, "the daemon died after %s", after);
    t0 = cpu_ticks(node->d.pid);
    usleep(2000000);
    t1 = cpu_ticks(node->d.pid);
    ck_assert_msg((double)(t1 - t0) / (double)hz < 0.05 * 2 * scale,
                  "after %s the daemon used %.0f%% of a core for 2 s", after,
                  100.0 * (double)(t1 - t0) / (double)hz / 2);
    KVT_OK(node->cli, kvd_daemon_status(node->cli, s, NULL, 0));
    free(s);
}

/* The daemon's log holds needle. */
static int log_has(const node_t *node, const char *needle)
{
    size_t cap = 4 << 20, n;
    char *buf = malloc(cap);
    FILE *f = fopen(node->d.log, "r");
    int found;

    ck_assert_ptr_nonnull(f);
    n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    found = strstr(buf, needle) != NULL;
    free(buf);
    return found;
}

/* What a stranger may send to the front door before any proof: each
 * case (raw bytes, or messages in and out of turn) from inside the
 * allow list (127.0.0.1) and from outside (127.0.0.2).  Inside, each is
 * closed for its reason; outside, each is closed at accept; both logged
 * and counted.  Through all of it the daemon stays alive and idle and
 * serves its clients and its peer. */
START_TEST(test_hostile_before_proof)
{
    node_t nodes[2];
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT, *r;
    Kvdock__Cluster__Auth au = KVDOCK__CLUSTER__AUTH__INIT;
    Kvdock__Cluster__Query q = KVDOCK__CLUSTER__QUERY__INIT;
    Kvdock__Cluster__CacheRef ref = kv_ref("kv");
    uint8_t zero[600] = {0}, key[KEY] = {1}, frame116[116], garbage[2100], replay[128],
            nonce[RAWPEER_NONCE] = {9, 8, 7};
    ProtobufCBinaryData kb = {KEY, key};
    uint64_t refused0;
    rawpeer_t *rp;
    size_t nreplay;
    int cases = 0;

    memset(nodes, 0, sizeof(nodes));
    allow_from = "127.0.0.1";
    start_nodes(nodes, 2, secret_path);
    allow_from = NULL;
    wait_all_up(nodes, 2);
    for (int i = 0; i < 2; i++)
        nodes[i].cache = make_cache(&nodes[i], "kv", 1024, true);
    refused0 = refused_count(&nodes[0]);
    /* struct.pack("<QQ", 10, 0) + b"A" * 100: killed the UCX listener */
    memset(frame116, 0, 16);
    frame116[0] = 10;
    memset(frame116 + 16, 'A', 100);
    memset(garbage, 'A', sizeof(garbage));

    /* from outside the allow list: closed at accept, whatever is sent */
    for (int c = 0; c < 3; c++) {
        rp = peer_from(&nodes[0], "127.0.0.2");
        if (c == 0)
            (void)rawpeer_send_raw(rp, frame116, sizeof(frame116));
        else if (c == 1)
            (void)rawpeer_send_raw(rp, garbage, sizeof(garbage));
        else
            (void)rawpeer_hello(rp, RAWPEER_VERSION);
        expect_refused(rp, NULL);
        cases++;
    }
    ck_assert_msg(log_has(&nodes[0],
                          "from=127.0.0.2 node=\"\" reason=\"not in cluster-allow-from\""),
                  "the refusal at accept is not logged");

    /* the 116-byte frame: a 10-byte message that does not decode */
    rp = peer_to(&nodes[0]);
    ck_assert_int_eq(rawpeer_send_raw(rp, frame116, sizeof(frame116)), 0);
    expect_refused(rp, "does not decode");
    cases++;
    /* 2,100 bytes of garbage: a header announcing 1 GiB */
    rp = peer_to(&nodes[0]);
    (void)rawpeer_send_raw(rp, garbage, sizeof(garbage));
    expect_refused(rp, NULL);
    cases++;
    expect_idle(&nodes[0], "the 116-byte frame and 2,100 bytes of garbage");

    /* a query before anything */
    q.id = 1;
    q.cache = &ref;
    q.n_keys = 1;
    q.keys = &kb;
    m.m_case = KVDOCK__CLUSTER__MSG__M_QUERY;
    m.query = &q;
    rp = peer_to(&nodes[0]);
    ck_assert_int_eq(rawpeer_send_msg(rp, &m), 0);
    expect_refused(rp, "a request before the proof");
    cases++;

    /* the proof out of turn: an Auth before the Hello */
    au.proof.data = zero;
    au.proof.len = 32;
    m.m_case = KVDOCK__CLUSTER__MSG__M_AUTH;
    m.auth = &au;
    rp = peer_to(&nodes[0]);
    ck_assert_int_eq(rawpeer_send_msg(rp, &m), 0);
    expect_refused(rp, "auth out of turn");
    cases++;

    /* a second Hello */
    rp = challenged(&nodes[0]);
    ck_assert_int_eq(rawpeer_hello(rp, RAWPEER_VERSION), 0);
    expect_refused(rp, "bad hello");
    cases++;

    /* another protocol version */
    rp = peer_to(&nodes[0]);
    ck_assert_int_eq(rawpeer_hello(rp, RAWPEER_VERSION + 1), 0);
    expect_refused(rp, "protocol version");
    cases++;

    /* a Hello, then an Auth whose proof is wrong */
    rp = challenged(&nodes[0]);
    m.m_case = KVDOCK__CLUSTER__MSG__M_AUTH;
    m.auth = &au;
    ck_assert_int_eq(rawpeer_send_msg(rp, &m), 0);
    expect_refused(rp, "does not know the cluster secret");
    cases++;

    /* an oversized proof: 600 bytes (a frame over 512 before the proof),
     * and 64 bytes (a frame that fits, a proof that is not 32 bytes) */
    rp = challenged(&nodes[0]);
    au.proof.len = 600;
    ck_assert_int_eq(rawpeer_send_msg(rp, &m), 0);
    expect_refused(rp, "over 512 bytes before the proof");
    cases++;
    rp = challenged(&nodes[0]);
    au.proof.len = 64;
    ck_assert_int_eq(rawpeer_send_msg(rp, &m), 0);
    expect_refused(rp, "auth out of turn");
    cases++;

    /* a proof replayed from an earlier session, with that session's
     * nonce: the daemon's nonce is new, so the proof is wrong */
    rp = peer_to(&nodes[0]);
    rawpeer_set_nonce(rp, nonce);
    ck_assert_msg(rawpeer_auth(rp, SECRET) == 0, "the secret's proof was not welcomed");
    nreplay = rawpeer_last_auth(rp, replay, sizeof(replay));
    ck_assert_uint_gt(nreplay, 0);
    rawpeer_free(rp);
    rp = peer_to(&nodes[0]);
    rawpeer_set_nonce(rp, nonce);
    ck_assert_int_eq(rawpeer_hello(rp, RAWPEER_VERSION), 0);
    r = rawpeer_wait(rp, KVDOCK__CLUSTER__MSG__M_CHALLENGE, (int)MS(5000));
    ck_assert_ptr_nonnull(r);
    kvdock__cluster__msg__free_unpacked(r, NULL);
    ck_assert_int_eq(rawpeer_send_raw(rp, replay, nreplay), 0);
    expect_refused(rp, "does not know the cluster secret");
    cases++;

    /* half a proof: a Hello, then nothing; and a connection that says
     * nothing: closed at the deadline */
    rp = challenged(&nodes[0]);
    expect_refused(rp, "no proof of the secret within the deadline");
    cases++;
    rp = peer_to(&nodes[0]);
    expect_refused(rp, "no proof of the secret within the deadline");
    cases++;

    /* a slow sender: a Hello a byte every 100 ms, closed at the deadline
     * before it is whole */
    {
        Kvdock__Cluster__Hello h = KVDOCK__CLUSTER__HELLO__INIT;
        uint8_t hello[128];
        size_t len;
        int64_t t0 = kvt_now_ms();
        h.version = RAWPEER_VERSION;
        h.node = "a slow sender";
        h.nonce.data = nonce;
        h.nonce.len = RAWPEER_NONCE;
        m.m_case = KVDOCK__CLUSTER__MSG__M_HELLO;
        m.hello = &h;
        len = kvdock__cluster__msg__get_packed_size(&m);
        hello[0] = (uint8_t)len;
        hello[1] = hello[2] = hello[3] = 0;
        kvdock__cluster__msg__pack(&m, hello + 4);
        rp = peer_to(&nodes[0]);
        for (size_t i = 0; i < len + 4 && rawpeer_send_raw(rp, hello + i, 1) == 0; i++) {
            rawpeer_progress(rp, 100);
            if (rawpeer_wait_closed(rp, 0, NULL, 0))
                break;
        }
        ck_assert_msg(kvt_now_ms() - t0 < DEADLINE_MS + MS(1500), "the slow sender kept on for "
                      "%lld ms", (long long)(kvt_now_ms() - t0));
        expect_refused(rp, "no proof of the secret within the deadline");
        cases++;
    }

    ck_assert_uint_ge(refused_count(&nodes[0]), refused0 + (uint64_t)cases);
    ck_assert(log_has(&nodes[0], "event=cluster_refused from=127.0.0.1"));
    expect_idle(&nodes[0], "every case");
    expect_cluster_works(&nodes[0], &nodes[1], 11);
    expect_cluster_works(&nodes[1], &nodes[0], 12);
    stop_nodes(nodes, 2);
}
END_TEST

/* A peer that proves the secret and then misbehaves: what it may ask is
 * answered, what it sends out of place is dropped, what it may not send
 * closes its connection only, logged and counted. */
START_TEST(test_hostile_after_proof)
{
    node_t nodes[2];
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT, *r;
    Kvdock__Cluster__Query q = KVDOCK__CLUSTER__QUERY__INIT;
    Kvdock__Cluster__Fetch f = KVDOCK__CLUSTER__FETCH__INIT;
    Kvdock__Cluster__QueryReply qr = KVDOCK__CLUSTER__QUERY_REPLY__INIT;
    Kvdock__Cluster__FetchDone fd = KVDOCK__CLUSTER__FETCH_DONE__INIT;
    Kvdock__Cluster__Auth au = KVDOCK__CLUSTER__AUTH__INIT;
    Kvdock__Cluster__CacheRef ref = kv_ref("kv"), nope = kv_ref("nope");
    uint8_t(*keys)[KEY] = malloc(8 * KEY), long_key[65] = {0}, proof[32] = {0};
    ProtobufCBinaryData kb[10];
    uint64_t served0, refused0;
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    kvt_pool_t pa;
    rawpeer_t *rp, *good;

    memset(nodes, 0, sizeof(nodes));
    start_nodes(nodes, 2, secret_path);
    wait_all_up(nodes, 2);
    for (int i = 0; i < 2; i++)
        nodes[i].cache = make_cache(&nodes[i], "kv", 1024, true);
    kvt_pool_make(nodes[0].cli, &pa, "pa", LAYERS, 8 * TPB, 1024, false, TPB);
    chain(keys, 8, 21);
    save(&nodes[0], &pa, keys, 0, 8, true);
    KVT_OK(nodes[0].cli, kvd_daemon_status(nodes[0].cli, s, NULL, 0));
    served0 = s->cluster.blocks_served;
    refused0 = s->cluster.refused;

    /* a well-behaved raw peer beside the others: it must go on being
     * answered through all of it */
    good = peer_to(&nodes[0]);
    ck_assert_msg(rawpeer_auth(good, SECRET) == 0, "the secret's proof was not welcomed");
    rp = peer_to(&nodes[0]);
    ck_assert_msg(rawpeer_auth(rp, SECRET) == 0, "the secret's proof was not welcomed");
    expect_answers(rp);

    /* a query: the 8 saved keys, an empty key and one of 65 bytes */
    for (int i = 0; i < 8; i++)
        kb[i] = (ProtobufCBinaryData){KEY, keys[i]};
    kb[8] = (ProtobufCBinaryData){0, long_key};
    kb[9] = (ProtobufCBinaryData){sizeof(long_key), long_key};
    q.id = 7;
    q.cache = &ref;
    q.n_keys = 10;
    q.keys = kb;
    m.m_case = KVDOCK__CLUSTER__MSG__M_QUERY;
    m.query = &q;
    r = exchange(rp, &m, KVDOCK__CLUSTER__MSG__M_QUERY_REPLY);
    ck_assert_uint_eq(r->query_reply->id, 7);
    ck_assert_uint_eq(r->query_reply->present.len, 2);
    ck_assert_uint_eq(r->query_reply->present.data[0], 0xff);
    ck_assert_uint_eq(r->query_reply->present.data[1], 0);
    kvdock__cluster__msg__free_unpacked(r, NULL);

    /* a query of a cache without a CacheRef, a fetch of a cache it does
     * not have: nothing present, nothing sent */
    q.cache = NULL;
    r = exchange(rp, &m, KVDOCK__CLUSTER__MSG__M_QUERY_REPLY);
    ck_assert_uint_eq(r->query_reply->present.data[0], 0);
    kvdock__cluster__msg__free_unpacked(r, NULL);
    f.id = 8;
    f.cache = &nope;
    f.n_keys = 8;
    f.keys = kb;
    m.m_case = KVDOCK__CLUSTER__MSG__M_FETCH;
    m.fetch = &f;
    r = exchange(rp, &m, KVDOCK__CLUSTER__MSG__M_FETCH_DONE);
    ck_assert_uint_eq(r->fetch_done->sent, 0);
    ck_assert_uint_eq(r->fetch_done->missing.data[0], 0xff);
    kvdock__cluster__msg__free_unpacked(r, NULL);
    /* a fetch of keys it has, before this peer said where its lanes are:
     * nothing sent, all named missing */
    f.cache = &ref;
    r = exchange(rp, &m, KVDOCK__CLUSTER__MSG__M_FETCH_DONE);
    ck_assert_uint_eq(r->fetch_done->sent, 0);
    kvdock__cluster__msg__free_unpacked(r, NULL);

    /* answers to questions never asked: dropped */
    qr.id = 12345;
    m.m_case = KVDOCK__CLUSTER__MSG__M_QUERY_REPLY;
    m.query_reply = &qr;
    ck_assert_int_eq(rawpeer_send_msg(rp, &m), 0);
    fd.id = 12345;
    fd.sent = 1000;
    m.m_case = KVDOCK__CLUSTER__MSG__M_FETCH_DONE;
    m.fetch_done = &fd;
    ck_assert_int_eq(rawpeer_send_msg(rp, &m), 0);
    expect_answers(rp);
    KVT_OK(nodes[0].cli, kvd_daemon_status(nodes[0].cli, s, NULL, 0));
    ck_assert_uint_eq(s->cluster.blocks_served, served0); /* nothing unasked was sent */

    /* a second Hello once trusted: closed */
    ck_assert_int_eq(rawpeer_hello(rp, RAWPEER_VERSION), 0);
    expect_refused(rp, "bad hello");

    /* the proof out of turn, once trusted: closed */
    rp = peer_to(&nodes[0]);
    ck_assert_msg(rawpeer_auth(rp, SECRET) == 0, "the secret's proof was not welcomed");
    au.proof.data = proof;
    au.proof.len = sizeof(proof);
    m.m_case = KVDOCK__CLUSTER__MSG__M_AUTH;
    m.auth = &au;
    ck_assert_int_eq(rawpeer_send_msg(rp, &m), 0);
    expect_refused(rp, "auth out of turn");

    /* lanes that are none, too many, an address that is not one (bytes,
     * a real address cut short, one with its transport renamed), or too
     * long: closed */
    {
        Kvdock__Cluster__Lanes ln = KVDOCK__CLUSTER__LANES__INIT;
        ProtobufCBinaryData addr[9];
        static const char not_one[] = "127.0.0.1:1234";
        static uint8_t too_long[4097];
        for (int i = 0; i < 9; i++)
            addr[i] = (ProtobufCBinaryData){sizeof(not_one) - 1, (uint8_t *)not_one};
        for (int bad = 0; bad < 4; bad++) {
            rp = peer_to(&nodes[0]);
            ck_assert_msg(rawpeer_auth(rp, SECRET) == 0, "the secret's proof was not welcomed");
            ln.n_address = bad == 0 ? 0 : bad == 1 ? 9 : 1;
            ln.address = addr;
            if (bad == 3)
                addr[0] = (ProtobufCBinaryData){sizeof(too_long), too_long};
            m.m_case = KVDOCK__CLUSTER__MSG__M_LANES;
            m.lanes = &ln;
            ck_assert_int_eq(rawpeer_send_msg(rp, &m), 0);
            expect_refused(rp, "bad lanes");
        }
    }

    /* a message over 8 MiB from a trusted peer: closed at its header */
    rp = peer_to(&nodes[0]);
    ck_assert_msg(rawpeer_auth(rp, SECRET) == 0, "the secret's proof was not welcomed");
    {
        uint8_t hdr[4] = {0x01, 0x00, 0x80, 0x00}; /* 8 MiB + 1 */
        ck_assert_int_eq(rawpeer_send_raw(rp, hdr, sizeof(hdr)), 0);
    }
    expect_refused(rp, "over 8 MiB");

    KVT_OK(nodes[0].cli, kvd_daemon_status(nodes[0].cli, s, NULL, 0));
    ck_assert_uint_ge(s->cluster.refused, refused0 + 7);
    ck_assert(log_has(&nodes[0], "reason=\"bad lanes"));
    expect_answers(good); /* the other links go on */
    rawpeer_free(good);
    expect_cluster_works(&nodes[0], &nodes[1], 22);
    kvt_pool_free(nodes[0].cli, &pa);
    stop_nodes(nodes, 2);
    free(keys);
    free(s);
}
END_TEST

/* The value of a metric (a line "name value") in text m; -1 if absent. */
static int64_t metric(const char *m, const char *name)
{
    char want[128];
    const char *p;

    snprintf(want, sizeof(want), "\n%s ", name);
    p = strstr(m, want);
    return p != NULL ? strtoll(p + strlen(want), NULL, 10) : -1;
}

/* Nodes A and B up with a cache "kv" each, A with lanes lanes and a pool
 * pa of 1,024 pages: the start of the tests of a raw peer's fetches. */
static void start_fetch_pair(node_t nodes[2], int lanes, kvt_pool_t *pa)
{
    memset(nodes, 0, 2 * sizeof(*nodes));
    plan_nodes(nodes, 2);
    nodes[0].lanes = lanes;
    for (int i = 0; i < 2; i++)
        start_node(&nodes[i], secret_path);
    wait_all_up(nodes, 2);
    for (int i = 0; i < 2; i++)
        nodes[i].cache = make_cache(&nodes[i], "kv", 1024, true);
    kvt_pool_make(nodes[0].cli, pa, "pa", LAYERS, 8 * TPB, 1024, false, TPB);
}

/* m: a fetch f of cache ref's n keys (kb[i] naming keys[i]), id left to
 * the caller. */
static void fetch_msg(Kvdock__Cluster__Msg *m, Kvdock__Cluster__Fetch *f,
                      Kvdock__Cluster__CacheRef *ref, ProtobufCBinaryData *kb,
                      uint8_t (*keys)[KEY], size_t n)
{
    for (size_t i = 0; i < n; i++)
        kb[i] = (ProtobufCBinaryData){KEY, keys[i]};
    f->cache = ref;
    f->n_keys = n;
    f->keys = kb;
    f->token = 0x5eed;
    m->m_case = KVDOCK__CLUSTER__MSG__M_FETCH;
    m->fetch = f;
}

/* A fetch from a peer whose lanes never finish their wireup: its blocks
 * wait on A (held: no block goes on a lane before all the peer's lanes
 * are wired up), and hold their cache blocks meanwhile.  The peer goes
 * away (its connection closed), and later a second such peer's blocks
 * are still waiting when A is stopped.  Each time the waiting sends must
 * end, failed, without reaching UCX: their cache blocks let go (an
 * eviction of all then finds none busy), none counted served, A alive
 * and serving its real peer, and A's exit clean (the sanitizer tree: no
 * leak) and prompt. */
START_TEST(test_held_sends_on_close)
{
    node_t nodes[2];
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT, *r;
    Kvdock__Cluster__Fetch f = KVDOCK__CLUSTER__FETCH__INIT;
    Kvdock__Cluster__CacheRef ref = kv_ref("kv");
    uint8_t(*keys)[KEY] = malloc(8 * KEY);
    ProtobufCBinaryData kb[8];
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    kvd_cache_evict_result_t ev;
    kvd_cache_keys_t all = keys_of(keys, 0, 8);
    uint64_t served0;
    int64_t t0;
    kvt_pool_t pa;
    rawpeer_t *rp;
    int st = -1;

    start_fetch_pair(nodes, 3, &pa); /* the peer's 4 lanes on 3 of A's: two share one */
    chain(keys, 8, 61);
    fetch_msg(&m, &f, &ref, kb, keys, 8);

    for (int round = 0; round < 2; round++) {
        save(&nodes[0], &pa, keys, 0, 8, true);
        KVT_OK(nodes[0].cli, kvd_daemon_status(nodes[0].cli, s, NULL, 0));
        served0 = s->cluster.blocks_served;
        rp = peer_to(&nodes[0]);
        ck_assert_msg(rawpeer_auth(rp, SECRET) == 0, "the secret's proof was not welcomed");
        ck_assert_int_eq(rawpeer_offer_mute_lanes(rp, 4), 0);
        expect_answers(rp); /* its lanes taken */
        f.id = 100 + (uint64_t)round;
        r = exchange(rp, &m, KVDOCK__CLUSTER__MSG__M_FETCH_DONE);
        ck_assert_uint_eq(r->fetch_done->sent, 8);
        kvdock__cluster__msg__free_unpacked(r, NULL);
        /* the 8 wait for the wireup, holding their blocks */
        usleep((useconds_t)MS(300) * 1000);
        KVT_OK(nodes[0].cli, kvd_cache_evict(nodes[0].cli, nodes[0].cache, &all, false, &ev));
        ck_assert_msg(ev.busy == 8, "%u blocks busy while the sends wait, %u evicted", ev.busy,
                      ev.evicted);
        if (round == 1)
            break; /* A stops with them waiting */
        rawpeer_hangup(rp);
        for (t0 = kvt_now_ms();; usleep(20000)) {
            KVT_OK(nodes[0].cli, kvd_cache_evict(nodes[0].cli, nodes[0].cache, &all, false, &ev));
            if (ev.busy == 0)
                break;
            ck_assert_msg(kvt_now_ms() - t0 < MS(5000), "%u blocks still held 5 s after the "
                          "peer went", ev.busy);
        }
        ck_assert_msg(kill(nodes[0].d.pid, 0) == 0, "A died as the waiting sends ended");
        KVT_OK(nodes[0].cli, kvd_daemon_status(nodes[0].cli, s, NULL, 0));
        ck_assert_uint_eq(s->cluster.blocks_served, served0); /* none went */
        rawpeer_free(rp);
        expect_cluster_works(&nodes[0], &nodes[1], 62);
    }

    /* A stopped with a peer's sends waiting: they end, failed, and A exits
     * clean, without waiting out the lanes' 2 s settle */
    kvt_pool_free(nodes[0].cli, &pa);
    kvd_client_destroy(&nodes[0].cli);
    kill(nodes[0].d.pid, SIGTERM);
    for (t0 = kvt_now_ms(); kvt_now_ms() - t0 < MS(10000); usleep(10000))
        if (waitpid(nodes[0].d.pid, &st, WNOHANG) == nodes[0].d.pid)
            break;
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
        kvt_daemon_dump_log(&nodes[0].d);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "A exited with status %d", st);
    ck_assert_msg(kvt_now_ms() - t0 < MS(1500), "A took %lld ms to stop with 8 sends waiting "
                  "(its lanes wait up to 2 s for what UCX holds)",
                  (long long)(kvt_now_ms() - t0));
    nodes[0].d.pid = -1;
    kvt_daemon_stop(&nodes[0].d, 1000);
    rawpeer_free(rp);
    stop_nodes(nodes, 2);
    free(keys);
    free(s);
}
END_TEST

/* A fetch from a peer one of whose lanes vanishes while the fetch's
 * blocks wait for the wireup: the peer's even lanes are a UCX worker it
 * runs (their wireup ends), its odd ones a worker it then destroys (their
 * wireup fails).  The group never opens: every waiting send ends failed,
 * none reaching UCX, not even those for the lanes that did wire up, so
 * none is served or lands; their cache blocks are let go, A drops the
 * link, and A lives and serves its real peer. */
START_TEST(test_held_sends_on_failed_wireup)
{
    node_t nodes[2];
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT, *r;
    Kvdock__Cluster__Fetch f = KVDOCK__CLUSTER__FETCH__INIT;
    Kvdock__Cluster__CacheRef ref = kv_ref("kv");
    uint8_t(*keys)[KEY] = malloc(8 * KEY);
    ProtobufCBinaryData kb[8];
    kvd_daemon_status_t *s = malloc(sizeof(*s));
    kvd_cache_evict_result_t ev;
    kvd_cache_keys_t all = keys_of(keys, 0, 8);
    uint64_t served0;
    int64_t t0;
    kvt_pool_t pa;
    rawpeer_t *rp;

    start_fetch_pair(nodes, 2, &pa);
    chain(keys, 8, 63);
    fetch_msg(&m, &f, &ref, kb, keys, 8);
    save(&nodes[0], &pa, keys, 0, 8, true);
    KVT_OK(nodes[0].cli, kvd_daemon_status(nodes[0].cli, s, NULL, 0));
    served0 = s->cluster.blocks_served;

    rp = peer_to(&nodes[0]);
    ck_assert_msg(rawpeer_auth(rp, SECRET) == 0, "the secret's proof was not welcomed");
    ck_assert_int_eq(rawpeer_offer_split_lanes(rp, 2), 0);
    expect_answers(rp); /* its lanes taken */
    f.id = 300;
    r = exchange(rp, &m, KVDOCK__CLUSTER__MSG__M_FETCH_DONE);
    ck_assert_uint_eq(r->fetch_done->sent, 8);
    kvdock__cluster__msg__free_unpacked(r, NULL);
    /* lane 0 wires up; lane 1 cannot: the 8 wait, holding their blocks */
    rawpeer_lanes_progress(rp, (int)MS(300));
    KVT_OK(nodes[0].cli, kvd_cache_evict(nodes[0].cli, nodes[0].cache, &all, false, &ev));
    ck_assert_msg(ev.busy == 8, "%u blocks busy while the sends wait, %u evicted", ev.busy,
                  ev.evicted);
    rawpeer_lanes_vanish(rp);
    for (t0 = kvt_now_ms();;) {
        rawpeer_lanes_progress(rp, 20); /* what comes to lane 0 would land */
        KVT_OK(nodes[0].cli, kvd_cache_evict(nodes[0].cli, nodes[0].cache, &all, false, &ev));
        if (ev.busy == 0)
            break;
        ck_assert_msg(kvt_now_ms() - t0 < MS(5000), "%u blocks still held 5 s after a lane's "
                      "wireup failed", ev.busy);
    }
    /* A drops the peer whose lane failed (it may connect again) */
    ck_assert_msg(rawpeer_wait_closed(rp, (int)MS(5000), NULL, 0) == 1,
                  "A kept the link whose lane's wireup failed");
    rawpeer_lanes_progress(rp, (int)MS(200));
    ck_assert_msg(kill(nodes[0].d.pid, 0) == 0, "A died as the wireup failed");
    KVT_OK(nodes[0].cli, kvd_daemon_status(nodes[0].cli, s, NULL, 0));
    if (s->cluster.blocks_served != served0 || rawpeer_lanes_landed(rp) != 0)
        kvt_daemon_dump_log(&nodes[0].d);
    ck_assert_msg(s->cluster.blocks_served == served0, "%llu blocks served after the group's "
                  "wireup failed", (unsigned long long)(s->cluster.blocks_served - served0));
    ck_assert_int_eq(rawpeer_lanes_landed(rp), 0);
    rawpeer_free(rp);
    expect_cluster_works(&nodes[0], &nodes[1], 64);
    kvt_pool_free(nodes[0].cli, &pa);
    stop_nodes(nodes, 2);
    free(keys);
    free(s);
}
END_TEST

/* Block messages on a daemon's lanes that no fetch of it asked for: one
 * for a fetch never sent (eager and by rendezvous), one without a
 * block's header.  Sent by a peer that proved the secret and got the
 * daemon's lanes as a configured peer does; each is dropped and counted
 * (a lane does not know which link a block came by, so no link closes),
 * nothing lands, and the daemon goes on serving. */
START_TEST(test_stray_blocks)
{
    node_t nodes[2];
    rawpeer_t *rp = rawpeer_new();
    uint64_t hdr[3] = {999, 0, 0x1234};
    uint8_t *blk = calloc(1, 1u << 20);
    char maddr[32], *m = NULL;
    int rport, mport;
    int64_t t0, dropped = -1;

    ck_assert_ptr_nonnull(rp);
    memset(nodes, 0, sizeof(nodes));
    plan_nodes(nodes, 2);
    do
        rport = free_port();
    while (rport == nodes[0].port || rport == nodes[1].port);
    do
        mport = free_port();
    while (mport == nodes[0].port || mport == nodes[1].port || mport == rport);
    snprintf(peer_list + strlen(peer_list), sizeof(peer_list) - strlen(peer_list),
             ",127.0.0.1:%d", rport);
    snprintf(maddr, sizeof(maddr), "127.0.0.1:%d", mport);
    ck_assert_int_eq(rawpeer_listen(rp, rport), 0);
    start_node_with(&nodes[0], secret_path, maddr);
    ck_assert_msg(rawpeer_serve(rp, SECRET, (int)MS(10000)) == 0,
                  "the daemon did not connect, prove itself and send its lanes");
    ck_assert_int_ge(rawpeer_lanes(rp), 1);
    ck_assert_int_eq(rawpeer_send_block(rp, 0, hdr, sizeof(hdr), blk, 4096, (int)MS(5000)), 0);
    ck_assert_int_eq(rawpeer_send_block(rp, 0, hdr, 3, blk, 4096, (int)MS(5000)), 0);
    (void)rawpeer_send_block(rp, rawpeer_lanes(rp) - 1, hdr, sizeof(hdr), blk, 1u << 20,
                             (int)MS(5000));
    for (t0 = kvt_now_ms(); kvt_now_ms() - t0 < MS(5000); usleep(50000)) {
        free(m);
        m = http_get(mport);
        if ((dropped = metric(m, "kvdock_cluster_dropped_blocks_total")) >= 3)
            break;
    }
    ck_assert_msg(dropped >= 3, "dropped blocks: %lld\n%s", (long long)dropped, m);
    free(m);
    ck_assert_msg(kill(nodes[0].d.pid, 0) == 0, "the daemon died of stray blocks");
    start_node(&nodes[1], secret_path);
    wait_peer_up(&nodes[0], nodes[1].port); /* A's count of peers up holds the raw one */
    wait_peer_up(&nodes[1], nodes[0].port);
    for (int i = 0; i < 2; i++)
        nodes[i].cache = make_cache(&nodes[i], "kv", 1024, true);
    expect_cluster_works(&nodes[0], &nodes[1], 55);
    expect_cluster_works(&nodes[1], &nodes[0], 56);
    rawpeer_free(rp);
    stop_nodes(nodes, 2);
    free(blk);
}
END_TEST

/* 1,000 idle connections to the front door: from one address inside the
 * allow list all but MAX_STARTUPS_PER_SOURCE are closed at once, from
 * many the total cap shows, from outside the list all are; the daemon
 * stays idle and a peer starting meanwhile comes up. */
START_TEST(test_inbound_flood)
{
    node_t nodes[2];
    rawpeer_t *flood;
    uint64_t refused0;
    int64_t t0;
    int opened, closed;
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    ck_assert_msg(getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur >= 1100,
                  "the test needs 1,100 descriptors (ulimit -n %llu)",
                  (unsigned long long)rl.rlim_cur);
    memset(nodes, 0, sizeof(nodes));
    /* A keeps unproven connections for a minute, from anywhere on the
     * loopback but 127.0.0.2; its peer B is not started yet */
    plan_nodes(nodes, 2);
    deadline_ms = deadline_of(MS(60000));
    allow_from = "127.0.0.1/32,127.0.0.3/32,127.0.0.4/30,127.0.0.8/29,127.0.0.16/28";
    start_node(&nodes[0], secret_path);
    deadline_ms = 0;
    refused0 = refused_count(&nodes[0]);

    /* one address, inside */
    flood = rawpeer_new();
    opened = rawpeer_open_silent(flood, "127.0.0.3", nodes[0].port, 1000);
    ck_assert_int_eq(opened, 1000);
    closed = rawpeer_silent_closed(flood, (int)MS(5000));
    ck_assert_msg(closed >= 1000 - MAX_STARTUPS_PER_SOURCE,
                  "of 1,000 idle connections from one address %d were closed", closed);
    ck_assert_uint_ge(refused_count(&nodes[0]), refused0 + 1000 - MAX_STARTUPS_PER_SOURCE);
    ck_assert(log_has(&nodes[0], "from this address"));
    expect_idle(&nodes[0], "1,000 idle connections from one address");

    /* many addresses (127.0.0.4 to .31), inside: MAX_STARTUPS held in all */
    {
        rawpeer_t *many = rawpeer_new();
        opened = 0;
        for (int a = 4; a < 32; a++) {
            char from[32];
            snprintf(from, sizeof(from), "127.0.0.%d", a);
            opened += rawpeer_open_silent(many, from, nodes[0].port, MAX_STARTUPS_PER_SOURCE);
        }
        closed = rawpeer_silent_closed(many, (int)MS(3000));
        ck_assert_msg(opened - closed <= MAX_STARTUPS - MAX_STARTUPS_PER_SOURCE + 1 &&
                          closed > 0,
                      "of %d unproven connections from 28 addresses %d stay open", opened,
                      opened - closed);
        ck_assert(log_has(&nodes[0], "too many connections without proof of the secret\""));
        rawpeer_free(many);
    }

    /* outside: every one closed at accept */
    {
        rawpeer_t *out = rawpeer_new();
        opened = rawpeer_open_silent(out, "127.0.0.2", nodes[0].port, 1000);
        ck_assert_int_eq(opened, 1000);
        closed = rawpeer_silent_closed(out, (int)MS(5000));
        ck_assert_int_eq(closed, 1000);
        rawpeer_free(out);
    }
    expect_idle(&nodes[0], "1,000 idle connections from outside the allow list");

    /* B starts while the 8 from 127.0.0.3 are still held: it comes up */
    start_node(&nodes[1], secret_path);
    t0 = kvt_now_ms();
    wait_all_up(nodes, 2);
    ck_assert_msg(kvt_now_ms() - t0 < MS(10000), "B came up after %lld ms",
                  (long long)(kvt_now_ms() - t0));
    for (int i = 0; i < 2; i++)
        nodes[i].cache = make_cache(&nodes[i], "kv", 1024, true);
    expect_cluster_works(&nodes[0], &nodes[1], 33);
    expect_cluster_works(&nodes[1], &nodes[0], 34);
    rawpeer_free(flood);
    allow_from = NULL;
    stop_nodes(nodes, 2);
}
END_TEST

/* The TCP ports pid listens on (IPv4 and IPv6), at most max; how many. */
static int listening_ports(pid_t pid, int *ports, int max)
{
    char path[300], link[128];
    unsigned long inodes[512];
    int ninodes = 0, n = 0;
    DIR *d;
    struct dirent *e;
    static const char *const tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};

    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    d = opendir(path);
    ck_assert_ptr_nonnull(d);
    while ((e = readdir(d)) != NULL && ninodes < 512) {
        char fdpath[600];
        ssize_t len;
        unsigned long ino;
        snprintf(fdpath, sizeof(fdpath), "%s/%s", path, e->d_name);
        if ((len = readlink(fdpath, link, sizeof(link) - 1)) <= 0)
            continue;
        link[len] = '\0';
        if (sscanf(link, "socket:[%lu]", &ino) == 1)
            inodes[ninodes++] = ino;
    }
    closedir(d);
    for (size_t t = 0; t < 2; t++) {
        FILE *f = fopen(tables[t], "r");
        char line[512];
        if (f == NULL)
            continue;
        while (fgets(line, sizeof(line), f) != NULL && n < max) {
            unsigned port, state;
            unsigned long ino;
            char local[64];
            if (sscanf(line, " %*d: %63[0-9A-Fa-f]:%x %*s %x %*s %*s %*s %*s %*s %lu", local,
                       &port, &state, &ino) != 4 ||
                state != 0x0A) /* LISTEN */
                continue;
            for (int i = 0; i < ninodes; i++)
                if (inodes[i] == ino) {
                    ports[n++] = (int)port;
                    break;
                }
        }
        fclose(f);
    }
    return n;
}

/* Every port the daemon listens on besides its front door is UCX's TCP
 * transport's (each lane worker's): what a stranger sends there, the
 * 116-byte frame, 2,100 bytes of garbage, a flood of idle connections,
 * must neither stop nor spin the daemon.  (Nothing of kvdockd reads
 * there: the README says to firewall those ports to the peers' hosts.) */
START_TEST(test_ucx_ports)
{
    node_t nodes[2];
    int ports[64], n, others = 0;
    uint8_t frame116[116], garbage[2100];

    memset(nodes, 0, sizeof(nodes));
    start_nodes(nodes, 2, secret_path);
    wait_all_up(nodes, 2);
    for (int i = 0; i < 2; i++)
        nodes[i].cache = make_cache(&nodes[i], "kv", 1024, true);
    memset(frame116, 0, 16);
    frame116[0] = 10;
    memset(frame116 + 16, 'A', 100);
    memset(garbage, 'A', sizeof(garbage));
    n = listening_ports(nodes[0].d.pid, ports, 64);
    for (int i = 0; i < n; i++) {
        rawpeer_t *rp;
        if (ports[i] == nodes[0].port)
            continue;
        others++;
        for (int c = 0; c < 3; c++) {
            rp = rawpeer_new();
            ck_assert_ptr_nonnull(rp);
            if (rawpeer_connect(rp, ports[i]) != 0) { /* listening on another address */
                rawpeer_free(rp);
                break;
            }
            if (c == 0)
                (void)rawpeer_send_raw(rp, frame116, sizeof(frame116));
            else if (c == 1)
                (void)rawpeer_send_raw(rp, garbage, sizeof(garbage));
            else
                (void)rawpeer_open_silent(rp, NULL, ports[i], 200);
            rawpeer_progress(rp, 300);
            rawpeer_free(rp);
            ck_assert_msg(kill(nodes[0].d.pid, 0) == 0, "the daemon died of case %d on UCX's "
                          "port %d", c, ports[i]);
        }
    }
    ck_assert_msg(others > 0, "no UCX port found beside the front door (%d ports)", n);
    expect_idle(&nodes[0], "bytes on UCX's ports");
    expect_cluster_works(&nodes[0], &nodes[1], 44);
    expect_cluster_works(&nodes[1], &nodes[0], 45);
    stop_nodes(nodes, 2);
}
END_TEST

/* The daemon's peak resident memory (VmHWM), bytes. */
static uint64_t peak_rss(pid_t pid)
{
    char path[64], line[256];
    uint64_t kb = 0;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmHWM: %" SCNu64 " kB", &kb) == 1)
            break;
    fclose(f);
    return kb << 10;
}

/* Connections from addresses outside --cluster-allow-from (by default
 * the peers' hosts) are closed at accept, before a byte of them is read:
 * a stranger's 256 MiB costs the daemon nothing.  From inside, the
 * proof. */
START_TEST(test_allow_from)
{
    static const char *const let_in[] = {"127.0.0.0/8", "any", "10.1.2.3, 127.0.0.1",
                                         "::1,127.0.0.1/32"};
    node_t node;
    size_t huge = 256u << 20;
    uint8_t *h = calloc(1, huge);
    uint64_t before;
    rawpeer_t *rp;

    memset(&node, 0, sizeof(node));
    node.port = free_port();
    /* its only peer is on 127.0.0.3, so by default 127.0.0.1 is a stranger */
    snprintf(peer_list, sizeof(peer_list), "127.0.0.1:%d,127.0.0.3:9", node.port);
    start_node(&node, secret_path);
    before = peak_rss(node.d.pid);
    rp = peer_to(&node);
    (void)rawpeer_send_raw(rp, h, huge);
    ck_assert_msg(rawpeer_wait_closed(rp, (int)MS(5000), NULL, 0), "a stranger was let in");
    rawpeer_free(rp);
    ck_assert_msg(peak_rss(node.d.pid) < before + (32u << 20),
                  "the stranger's message cost the daemon %llu MiB",
                  (unsigned long long)((peak_rss(node.d.pid) - before) >> 20));
    ck_assert_uint_ge(refused_count(&node), 1);
    ck_assert_msg(log_has(&node, "reason=\"not in cluster-allow-from\""), "the refusal is logged");
    kvd_client_destroy(&node.cli);
    stop_checked(&node.d);

    for (size_t i = 0; i < sizeof(let_in) / sizeof(let_in[0]); i++) {
        allow_from = let_in[i];
        start_node(&node, secret_path);
        allow_from = NULL;
        rawpeer_free(challenged(&node)); /* let in: its Hello is answered */
        kvd_client_destroy(&node.cli);
        stop_checked(&node.d);
    }

    /* prefixes that end inside a byte: 127.0.0.1 is in 127.0.0.0/9,
     * 126.0.0.0/7, 0.0.0.0/1 and 127.0.0.0/31, not in 127.128.0.0/9,
     * 128.0.0.0/1, 127.0.0.2/31 or an IPv6 network */
    {
        static const struct {
            const char *allow;
            int in;
        } nets[] = {{"127.0.0.0/9", 1},   {"126.0.0.0/7", 1}, {"0.0.0.0/1", 1},
                    {"127.0.0.0/31", 1},  {"127.128.0.0/9", 0}, {"128.0.0.0/1", 0},
                    {"127.0.0.2/31", 0},  {"::/0", 0}};
        for (size_t i = 0; i < sizeof(nets) / sizeof(nets[0]); i++) {
            allow_from = nets[i].allow;
            start_node(&node, secret_path);
            allow_from = NULL;
            if (nets[i].in) {
                rawpeer_free(challenged(&node));
            } else {
                rp = peer_to(&node);
                (void)rawpeer_hello(rp, RAWPEER_VERSION);
                ck_assert_msg(rawpeer_wait_closed(rp, (int)MS(5000), NULL, 0),
                              "--cluster-allow-from %s let 127.0.0.1 in", nets[i].allow);
                rawpeer_free(rp);
            }
            kvd_client_destroy(&node.cli);
            stop_checked(&node.d);
        }
    }
    free(h);
}
END_TEST

/* kvdockd refuses bad cluster options at start, saying why. */
START_TEST(test_bad_options)
{
    static const struct {
        const char *args[8];
        const char *says;
    } cases[] = {
        {{"--cluster-listen", "127.0.0.1:1", NULL}, "cluster-secret-file"},
        {{"--cluster-peers", "127.0.0.1:2", NULL}, "need cluster-listen"},
        {{"--cluster-listen", "127.0.0.1:1", "--cluster-secret-file", "/nonexistent", NULL},
         "No such file"},
        {{"--cluster-listen", "nocolon", "--cluster-secret-file", "SECRET", NULL},
         "HOST:PORT"},
        {{"--cluster-listen", "127.0.0.1:1", "--cluster-secret-file", "OPEN", NULL},
         "readable by others"},
        {{"--cluster-listen", "127.0.0.1:1", "--cluster-secret-file", "SHORT", NULL},
         "16 to 4,096 bytes"},
        {{"--cluster-listen", "127.0.0.1:1", "--cluster-secret-file", "SECRET",
          "--cluster-peers-file", "/nonexistent/peers", NULL},
         "cluster-peers-file /nonexistent/peers"},
        {{"--cluster-listen", "127.0.0.1:1", "--cluster-secret-file", "SECRET",
          "--cluster-peers", "127.0.0.1:2,nocolon", NULL},
         "'nocolon' is not HOST:PORT"},
        {{"--cluster-listen", "[::1]:1", "--cluster-secret-file", "SECRET", NULL},
         "'[::1]:1' is an IPv6 address"},
        {{"--cluster-listen", "127.0.0.1:1", "--cluster-secret-file", "SECRET",
          "--cluster-peers", "127.0.0.1:2,[::1]:3", NULL},
         "'[::1]:3' is an IPv6 address"},
        {{"--cluster-listen", "127.0.0.1:1", "--cluster-secret-file", "SECRET",
          "--cluster-allow-from", "10.0.0.0/33", NULL},
         "'10.0.0.0/33' is not ADDRESS or ADDRESS/BITS"},
        {{"--cluster-listen", "127.0.0.1:1", "--cluster-secret-file", "SECRET",
          "--cluster-allow-from", "peers,somehost", NULL},
         "'somehost' is not ADDRESS or ADDRESS/BITS"},
        {{"--cluster-listen", "127.0.0.1:1", "--cluster-secret-file", "SECRET",
          "--cluster-allow-from", "10.0.0.1/", NULL},
         "'10.0.0.1/' is not ADDRESS or ADDRESS/BITS"},
        {{"--cluster-listen", "127.0.0.1:1", "--cluster-secret-file", "SECRET",
          "--cluster-peers-file", "MANY", NULL},
         "more than 64 cluster peers"},
        {{"--cluster-listen", "127.0.0.1:1", "--cluster-secret-file", "SECRET",
          "--cluster-peers-file", "LONGNAME", NULL},
         "a cluster peer address is too long"},
        {{"--cluster-listen", "127.0.0.1:1", "--cluster-secret-file", "SECRET",
          "--cluster-peers-file", "LONGLINE", NULL},
         "line 2 is over 510 bytes"},
    };
    char open_path[300], short_path[300], many_path[300], longname_path[300],
        longline_path[300];
    FILE *f;

    snprintf(open_path, sizeof(open_path), "%s/open", dir);
    snprintf(short_path, sizeof(short_path), "%s/short", dir);
    write_secret(open_path, "a secret of more than sixteen bytes\n", 0644);
    write_secret(short_path, "short\n", 0600);
    /* 65 peers; a name of 300 bytes; a line of 600 bytes of peers */
    snprintf(many_path, sizeof(many_path), "%s/many", dir);
    f = fopen(many_path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 65; i++)
        fprintf(f, "127.0.0.1:%d\n", 2000 + i);
    fclose(f);
    snprintf(longname_path, sizeof(longname_path), "%s/longname", dir);
    f = fopen(longname_path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%0300d:1\n", 7);
    fclose(f);
    snprintf(longline_path, sizeof(longline_path), "%s/longline", dir);
    f = fopen(longline_path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "# the peers\n");
    for (int i = 0; i < 40; i++)
        fprintf(f, "%s127.0.0.1:%d", i ? "," : "", 3000 + i);
    fprintf(f, "\n");
    fclose(f);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *argv[16];
        char sock[300];
        char *out = NULL, *err = NULL;
        int k = 0, rc;

        snprintf(sock, sizeof(sock), "%s/bad.sock", dir);
        argv[k++] = kvt_daemon_path();
        argv[k++] = "--backend";
        argv[k++] = "cpu";
        argv[k++] = "--socket";
        argv[k++] = sock;
        for (int j = 0; cases[i].args[j] != NULL; j++) {
            const char *a = cases[i].args[j];
            argv[k++] = strcmp(a, "SECRET") == 0     ? secret_path
                        : strcmp(a, "OPEN") == 0     ? open_path
                        : strcmp(a, "SHORT") == 0    ? short_path
                        : strcmp(a, "MANY") == 0     ? many_path
                        : strcmp(a, "LONGNAME") == 0 ? longname_path
                        : strcmp(a, "LONGLINE") == 0 ? longline_path
                                                     : a;
        }
        argv[k] = NULL;
        rc = kvt_run(argv, &out, &err, 10000);
        ck_assert_msg(rc != 0 && rc != -1, "case %zu: exit %d", i, rc);
        ck_assert_msg(strstr(err, cases[i].says) != NULL, "case %zu: stderr lacks '%s':\n%s", i,
                      cases[i].says, err);
        free(out);
        free(err);
    }
    unlink(open_path);
    unlink(short_path);
    unlink(many_path);
    unlink(longname_path);
    unlink(longline_path);
}
END_TEST

/* KVD_TEST_ONLY=name runs that test alone (finding a failure). */
#define ADD(tc, t)                                                                               \
    do {                                                                                         \
        const char *only_ = getenv("KVD_TEST_ONLY");                                             \
        if (only_ == NULL || strcmp(only_, #t) == 0)                                             \
            tcase_add_test(tc, t);                                                               \
    } while (0)

int main(void)
{
    Suite *s = suite_create("cluster");
    TCase *tc = tcase_create("cluster");
    SRunner *sr;
    int failed;

    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120.0 * time_scale());
    ADD(tc, test_found_and_pulled);
    ADD(tc, test_same_chain_twice);
    ADD(tc, test_pulled_load_flags);
    ADD(tc, test_node_lost);
    ADD(tc, test_stopped_peer);
    ADD(tc, test_killed_mid_load);
    ADD(tc, test_killed_mid_load_repeated);
    ADD(tc, test_fetcher_killed_while_sender_waits);
    ADD(tc, test_killed_sender_many_lanes);
    ADD(tc, test_pull_streams);
    ADD(tc, test_restart_rejoins);
    ADD(tc, test_status_and_metrics);
    ADD(tc, test_peers_file);
    ADD(tc, test_many_peers);
    ADD(tc, test_wrong_secret);
    ADD(tc, test_bad_options);
    suite_add_tcase(s, tc);
    tc = tcase_create("hostile peers");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120.0 * time_scale());
    ADD(tc, test_hostile_before_proof);
    ADD(tc, test_hostile_after_proof);
    ADD(tc, test_inbound_flood);
    ADD(tc, test_allow_from);
    ADD(tc, test_ucx_ports);
    ADD(tc, test_stray_blocks);
    ADD(tc, test_held_sends_on_close);
    ADD(tc, test_held_sends_on_failed_wireup);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
