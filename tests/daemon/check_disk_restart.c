/*
 * Caches with a disk level come back when kvdockd starts again on the
 * same --cache-dir, after SIGTERM and after SIGKILL: with their owners,
 * sharing rules, layouts and budgets; a dropped cache does not come back;
 * another layout under a reopened name is ESHAPE.  Another user (nobody,
 * through fork + setuid) owns one cache and uses the shared ones: that
 * needs root, and without it those steps say SKIP.
 *
 * The cache directory lies under the build tree (KVD_TEST_SCRATCH): the
 * machine's disk, not tmpfs.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <inttypes.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "disk_harness.h"
#include "kvt_proc.h"

#define NOBODY 65534u
#define NOGROUP 65534u
#define MB (1ull << 20)

static char base[128], sock[192], scratch[512], cdir[600];

static int is_root(void)
{
    return geteuid() == 0;
}

/* The socket under a directory others may enter; the cache dir (made by
 * the daemon) on the build tree's disk. */
static void world_make(void)
{
    snprintf(base, sizeof(base), "/tmp/kvdt-dr-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(base));
    ck_assert_int_eq(chmod(base, 0755), 0);
    snprintf(sock, sizeof(sock), "%s/run/kvd.sock", base);
    kvdt_scratch_make(scratch, sizeof(scratch), "disk-restart");
    snprintf(cdir, sizeof(cdir), "%s/cd", scratch);
}

static void world_remove(void)
{
    char cmd[200];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
    ck_assert_int_eq(system(cmd), 0);
    kvdt_scratch_remove(scratch);
}

/* One mapping a case made: unmapped at its end. */
typedef struct mapped {
    void *map;
    size_t len;
} mapped_t;

#define FDS(...) ((const int[]){__VA_ARGS__, -1})
#define MAPS(...) ((const mapped_t[]){__VA_ARGS__, {NULL, 0}})
#define MAPPED(v) {(v).map, (v).len}

/* How a case ends: what it mapped unmapped (maps ends with a NULL map;
 * NULL: none), its connections closed in order (fds ends with -1), the
 * daemon stopped clean (exit 0, drained) and the world removed. */
static void case_end(kvdt_daemon_t *d, const int *fds, const mapped_t *maps)
{
    for (; maps != NULL && maps->map != NULL; maps++)
        munmap(maps->map, maps->len);
    for (; *fds >= 0; fds++)
        close(*fds);
    ck_assert_int_eq(kvdt_stop(d), 0);
    world_remove();
}

/* kvdockd on the world's cache dir with disk budget disk and extra (NULL
 * terminated, may be NULL), nobody's group admitted; served (the caches
 * in the cache dir reopened) when this returns.  A save waits for host
 * slots up to the daemon's 10 s (--disk-wait-ms) scaled by
 * KVD_TEST_TIME_SCALE, unless extra names its own wait (a case whose
 * disk never answers: its wait expires whatever the machine's load). */
static void start_with(kvdt_daemon_t *d, const char *disk, const char *const *extra)
{
    char grp[16], wait[24];
    const char *args[12] = {"--host-memory-budget", "256M", "--socket-group", grp};
    int n = 4, own_wait = 0;

    snprintf(grp, sizeof(grp), "%u", NOGROUP);
    for (int i = 0; extra != NULL && extra[i] != NULL; i++) {
        ck_assert_int_lt(n, 9);
        own_wait |= strcmp(extra[i], "--disk-wait-ms") == 0;
        args[n++] = extra[i];
    }
    if (!own_wait) {
        snprintf(wait, sizeof(wait), "%" PRId64, KVT_MS(10000));
        args[n++] = "--disk-wait-ms";
        args[n++] = wait;
    }
    args[n] = NULL;
    close(kvdt_disk_start(d, sock, cdir, disk, args, "ready"));
}

/* As the restart cases run it: nobody may connect too. */
static void start(kvdt_daemon_t *d)
{
    const char *nobody[] = {"--allow-uids", "65534", NULL};

    start_with(d, "256M", nobody);
}

/* A hello'd connection as nobody. */
static int nobody_client(void)
{
    Kvdock__Request req;
    Kvdock__Hello h = KVDOCK__HELLO__INIT;
    Kvdock__Response *r;
    int err = 0, fd = kvdt_connect_as(sock, NOBODY, NOGROUP, 0, NULL, &err);

    ck_assert_msg(fd >= 0, "nobody cannot connect: %s", strerror(err));
    kvdt_req_init(&req, 1);
    h.protocol_version = KVD_PROTOCOL_VERSION;
    h.client_name = "nobody";
    req.op_case = KVDOCK__REQUEST__OP_HELLO;
    req.hello = &h;
    r = kvdt_call(fd, &req);
    ck_assert_msg(r->status == 0, "hello as nobody: %u %s", r->status, r->message);
    kvdock__response__free_unpacked(r, NULL);
    return fd;
}

static Kvdock__Response *create(int fd, const char *name, uint32_t layers, uint64_t disk,
                                int shared, const uint32_t *allow, size_t nallow, int existing)
{
    kvdt_cache_req_t q;

    kvdt_cache_req(&q, 11, name, 1 * MB, disk);
    q.cl.num_layers = layers;
    q.cc.shared = shared;
    q.cc.allow_uids = (uint32_t *)allow;
    q.cc.n_allow_uids = nallow;
    q.cc.open_existing = existing;
    return kvdt_call(fd, &q.req);
}

static void created(int fd, const char *name, uint64_t disk, int shared, const uint32_t *allow,
                    size_t nallow)
{
    Kvdock__Response *r = create(fd, name, 2, disk, shared, allow, nallow, 0);

    ck_assert_msg(r->status == 0, "create %s: %u %s", name, r->status, r->message);
    ck_assert_ptr_nonnull(r->cache->disk);
    kvdock__response__free_unpacked(r, NULL);
}

static Kvdock__Response *list(int fd)
{
    Kvdock__Request req;
    Kvdock__CacheList cl = KVDOCK__CACHE_LIST__INIT;
    Kvdock__Response *r;

    kvdt_req_init(&req, 12);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_LIST;
    req.cache_list = &cl;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(r->status, 0);
    return r;
}

static const Kvdock__CacheInfo *find(const Kvdock__Response *r, const char *name, uint32_t owner)
{
    for (size_t i = 0; i < r->caches->n_caches; i++)
        if (strcmp(r->caches->caches[i]->name, name) == 0 &&
            r->caches->caches[i]->owner_uid == owner)
            return r->caches->caches[i];
    return NULL;
}

static int drop(int fd, const char *name)
{
    Kvdock__Request req;
    Kvdock__CacheDrop cd = KVDOCK__CACHE_DROP__INIT;

    kvdt_req_init(&req, 13);
    cd.name = (char *)name;
    req.op_case = KVDOCK__REQUEST__OP_CACHE_DROP;
    req.cache_drop = &cd;
    return kvdt_status_of(fd, &req);
}

static int stats(int fd, const char *name)
{
    Kvdock__Request req;
    Kvdock__CacheStats cs = KVDOCK__CACHE_STATS__INIT;

    kvdt_req_init(&req, 14);
    cs.name = (char *)name;
    req.op_case = KVDOCK__REQUEST__OP_CACHE_STATS;
    req.cache_stats = &cs;
    return kvdt_status_of(fd, &req);
}

static int dir_exists(const char *name)
{
    char p[700];

    snprintf(p, sizeof(p), "%s/%s", cdir, name);
    return access(p, F_OK) == 0;
}

static const uint32_t TEAM[] = {NOBODY};

/* Stop d with sig: SIGTERM (drained) or SIGKILL (nothing closed). */
static void stop_with(kvdt_daemon_t *d, int sig)
{
    if (sig == SIGTERM) {
        ck_assert_int_eq(kvdt_stop(d), 0);
        return;
    }
    ck_assert_int_eq(kill(d->pid, SIGKILL), 0);
    ck_assert_int_eq(kvdt_wait_exit(d, KVDT_TIMEOUT_MS), 128 + SIGKILL);
    (void)kvdt_stop(d); /* its log directory */
}

static void check_reopened(int fd, int other)
{
    Kvdock__Response *r = list(fd);
    const Kvdock__CacheInfo *ci;
    char path[700];

    ck_assert_uint_eq(r->caches->n_caches, other ? 4 : 3);
    ci = find(r, "priv", geteuid());
    ck_assert_ptr_nonnull(ci);
    ck_assert(!ci->shared);
    ck_assert_uint_eq(ci->n_allow_uids, 0);
    ck_assert_uint_eq(ci->layout->num_layers, 2);
    ck_assert_str_eq(ci->layout->dtype, "bf16");
    ck_assert_uint_eq(ci->budget_bytes, 1 * MB);
    ck_assert_ptr_nonnull(ci->disk);
    ck_assert_uint_eq(ci->disk->budget_bytes, 8 * MB);
    snprintf(path, sizeof(path), "%s/u%u-priv", cdir, (unsigned)geteuid());
    ck_assert_str_eq(ci->disk->path, path);
    ci = find(r, "team", geteuid());
    ck_assert_ptr_nonnull(ci);
    ck_assert(ci->shared);
    ck_assert_uint_eq(ci->n_allow_uids, 1);
    ck_assert_uint_eq(ci->allow_uids[0], NOBODY);
    ck_assert_uint_eq(ci->disk->budget_bytes, 16 * MB);
    ci = find(r, "open", geteuid());
    ck_assert_ptr_nonnull(ci);
    ck_assert(ci->shared);
    ck_assert_uint_eq(ci->n_allow_uids, 0);
    if (other) {
        ci = find(r, "mine", NOBODY);
        ck_assert_ptr_nonnull(ci);
        ck_assert(!ci->shared);
    }
    kvdock__response__free_unpacked(r, NULL);
}

static void restart_case(int sig)
{
    kvdt_daemon_t d;
    Kvdock__Response *r;
    int fd, nb = -1, other = is_root();

    world_make();
    start(&d);
    fd = kvdt_client(&d, "owner");
    r = create(fd, "priv", 2, 8 * MB, 0, NULL, 0, 0);
    ck_assert_msg(r->status == 0, "create priv: %u %s", r->status, r->message);
    kvdock__response__free_unpacked(r, NULL);
    created(fd, "team", 16 * MB, 1, TEAM, 1);
    created(fd, "open", 8 * MB, 1, NULL, 0);
    created(fd, "gone", 8 * MB, 0, NULL, 0);
    if (other) {
        nb = nobody_client();
        created(nb, "mine", 8 * MB, 0, NULL, 0);
        close(nb);
    } else {
        kvt_skip_case("restart_other_owner", "needs root to run a client as uid %u", NOBODY);
    }
    /* a dropped cache's directory goes, and the cache does not come back */
    ck_assert_int_eq(drop(fd, "gone"), 0);
    for (int i = 0; i < KVDT_TIMEOUT_MS / 10; i++) {
        char n[64];
        snprintf(n, sizeof(n), "u%u-gone", (unsigned)geteuid());
        if (!dir_exists(n))
            break;
        usleep(10000);
    }
    close(fd);
    stop_with(&d, sig);

    start(&d);
    ck_assert(kvdt_log_has(&d, other ? "caches=4" : "caches=3"));
    ck_assert(kvdt_log_has(&d, "event=cache_reopened"));
    fd = kvdt_client(&d, "owner-again");
    check_reopened(fd, other);
    /* the rules of the existing cache hold: another layout is ESHAPE */
    r = create(fd, "team", 3, 16 * MB, 1, TEAM, 1, 1);
    ck_assert_uint_eq(r->status, KVD_ESHAPE);
    kvdock__response__free_unpacked(r, NULL);
    r = create(fd, "priv", 2, 8 * MB, 0, NULL, 0, 1);
    ck_assert_msg(r->status == 0, "%u %s", r->status, r->message);
    ck_assert_ptr_nonnull(r->cache->disk);
    kvdock__response__free_unpacked(r, NULL);
    /* made again without open_existing: EEXIST, as before the restart */
    r = create(fd, "open", 2, 8 * MB, 1, NULL, 0, 0);
    ck_assert_uint_eq(r->status, KVD_EEXIST);
    kvdock__response__free_unpacked(r, NULL);
    if (other) {
        Kvdock__Response *l;
        nb = nobody_client();
        l = list(nb); /* nobody sees the shared ones and its own, not priv */
        ck_assert_uint_eq(l->caches->n_caches, 3);
        ck_assert_ptr_null(find(l, "priv", geteuid()));
        ck_assert_ptr_nonnull(find(l, "mine", NOBODY));
        kvdock__response__free_unpacked(l, NULL);
        ck_assert_uint_eq(stats(nb, "team"), 0);
        ck_assert_uint_eq(stats(nb, "priv"), KVD_ENOENT);
        ck_assert_uint_eq(drop(nb, "team"), KVD_EPERM);
        close(nb);
    }
    case_end(&d, FDS(fd), NULL);
}

START_TEST(test_restart_sigterm)
{
    restart_case(SIGTERM);
}
END_TEST

START_TEST(test_restart_sigkill)
{
    restart_case(SIGKILL);
}
END_TEST

/* A reopened cache with the budgets of today's options: a disk budget
 * past the new --disk-budget is skipped and kept for a daemon that has
 * room for it (none of its blocks dropped to fit), the status naming it
 * and why; meanwhile a create of that name is refused, saying why. */
START_TEST(test_restart_smaller_budget)
{
    kvdt_daemon_t d;
    Kvdock__Response *r;
    Kvdock__StatusReply *s;
    char n[64];
    int fd;

    world_make();
    start(&d);
    fd = kvdt_client(&d, "owner");
    r = create(fd, "big", 2, 8 * MB, 0, NULL, 0, 0);
    ck_assert_msg(r->status == 0, "%u %s", r->status, r->message);
    kvdock__response__free_unpacked(r, NULL);
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    start_with(&d, "4M", NULL);
    ck_assert(kvdt_log_has(&d, "does not fit the daemon's"));
    ck_assert(kvdt_log_has(&d, "caches=0"));
    fd = kvdt_client(&d, "owner-again");
    s = kvdt_status(fd);
    snprintf(n, sizeof(n), "u%u-big", (unsigned)geteuid());
    ck_assert_ptr_nonnull(s->disk);
    ck_assert_uint_eq(s->disk->skipped_count, 1);
    ck_assert_uint_eq(s->disk->n_skipped, 1);
    ck_assert_str_eq(s->disk->skipped[0]->dir, n);
    ck_assert_str_eq(s->disk->skipped[0]->name, "big");
    ck_assert_uint_eq(s->disk->skipped[0]->owner_uid, geteuid());
    ck_assert_ptr_nonnull(strstr(s->disk->skipped[0]->reason, "does not fit the daemon's"));
    kvdock__status_reply__free_unpacked(s, NULL);
    r = create(fd, "big", 2, 8 * MB, 0, NULL, 0, 1); /* as made: past --disk-budget */
    ck_assert_msg(r->status == KVD_ELIMIT, "%u %s", r->status, r->message);
    kvdock__response__free_unpacked(r, NULL);
    r = create(fd, "big", 2, 2 * MB, 0, NULL, 0, 1); /* within it: its directory is kept */
    ck_assert_msg(r->status == KVD_EBUSY && strstr(r->message, "exists already") != NULL,
                  "%u %s", r->status, r->message);
    kvdock__response__free_unpacked(r, NULL);
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    snprintf(n, sizeof(n), "u%u-big/manifest", (unsigned)geteuid());
    ck_assert(dir_exists(n));
    start(&d); /* room again: back, and skipped no more */
    ck_assert(kvdt_log_has(&d, "caches=1"));
    fd = kvdt_client(&d, "owner-back");
    s = kvdt_status(fd);
    ck_assert_uint_eq(s->disk->skipped_count, 0);
    ck_assert_uint_eq(s->disk->n_skipped, 0);
    kvdock__status_reply__free_unpacked(s, NULL);
    case_end(&d, FDS(fd), NULL);
}
END_TEST

/* ---- blocks after a restart ----------------------------------------------------- */

/* The chains saved: CHAINS of CHAIN blocks of 2 layers x 16 tokens x 1 KiB
 * (64 KiB: a disk batch of 8 MiB fills with about 128 of them); a host
 * budget of HOST_BLOCKS, a disk budget 20 times it (twice over: records
 * have headers). */
#define CHAINS 32
#define CHAIN 16
#define NBLK (CHAINS * CHAIN)
#define LAYERS 2
#define TPB 16
#define TOKB 1024
#define HOST_BLOCKS 64
#define BLOCK_BYTES (LAYERS * 2 * TPB * TOKB)

static void key_of(int chain, int i, uint8_t key[8])
{
    char t[24];

    snprintf(t, sizeof(t), "c%02dk%03d", chain % 100, i % 1000);
    memcpy(key, t, 7);
    key[7] = (uint8_t)(chain * 7 + i); /* all 8 bytes used */
}

/* Byte j of block (chain, i)'s layer l, K (kv 0) or V. */
static uint8_t pattern(int chain, int i, int l, int kv, size_t j)
{
    return (uint8_t)(chain * 131 + i * 31 + l * 7 + kv * 3 + j * 13 + (j >> 8));
}

typedef struct pool_view {
    uint64_t id;
    uint8_t *map;
    size_t len;
    uint64_t layer_stride, v_offset, slot_bytes;
} pool_view_t;

static void pool_open(int fd, const char *name, uint64_t pages, pool_view_t *p)
{
    Kvdock__PoolInfo *info = NULL;

    p->id = kvdt_pool_create(fd, name, LAYERS, pages * TPB, TOKB, 0);
    ck_assert_uint_ne(p->id, 0);
    p->map = kvdt_pool_map(fd, p->id, &info, &p->len);
    ck_assert_ptr_nonnull(p->map);
    p->layer_stride = info->layer_stride;
    p->v_offset = info->v_offset;
    p->slot_bytes = info->slot_bytes;
    kvdock__pool_info__free_unpacked(info, NULL);
}

/* The bytes of page pg, layer l, K or V. */
static uint8_t *page_part(const pool_view_t *p, uint64_t pg, int l, int kv)
{
    return p->map + l * p->layer_stride + (kv ? p->v_offset : 0) + pg * TPB * p->slot_bytes;
}

static void fill_page(const pool_view_t *p, uint64_t pg, int chain, int i)
{
    for (int l = 0; l < LAYERS; l++)
        for (int kv = 0; kv < 2; kv++) {
            uint8_t *b = page_part(p, pg, l, kv);
            for (size_t j = 0; j < TPB * TOKB; j++)
                b[j] = pattern(chain, i, l, kv, j);
        }
}

/* Page pg holds block (chain, i) byte for byte. */
static int page_is(const pool_view_t *p, uint64_t pg, int chain, int i)
{
    for (int l = 0; l < LAYERS; l++)
        for (int kv = 0; kv < 2; kv++) {
            const uint8_t *b = page_part(p, pg, l, kv);
            for (size_t j = 0; j < TPB * TOKB; j++)
                if (b[j] != pattern(chain, i, l, kv, j))
                    return 0;
        }
    return 1;
}

static void chain_keys(int chain, int n, uint8_t keys[][8], Kvdock__CacheKeys *ck)
{
    for (int i = 0; i < n; i++)
        key_of(chain, i, keys[i]);
    kvdock__cache_keys__init(ck);
    ck->blob.data = &keys[0][0];
    ck->blob.len = (size_t)n * 8;
    ck->key_size = 8;
}

/* Send a save of n blocks, keys[i] (8 bytes each) from page pages[i] of
 * p (no reply read). */
static void save_send_keys(int fd, uint64_t cache, const pool_view_t *p, uint8_t keys[][8],
                           int64_t *pages, int n, uint64_t id)
{
    Kvdock__Request req;
    Kvdock__CacheSave cs = KVDOCK__CACHE_SAVE__INIT;
    Kvdock__CacheKeys ck;
    Kvdock__Indices ix = KVDOCK__INDICES__INIT;

    kvdock__cache_keys__init(&ck);
    ck.blob.data = &keys[0][0];
    ck.blob.len = (size_t)n * 8;
    ck.key_size = 8;
    ix.values = pages;
    ix.n_values = (size_t)n;
    cs.cache = cache;
    cs.pool = p->id;
    cs.keys = &ck;
    cs.blocks = &ix;
    kvdt_req_init(&req, id);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_SAVE;
    req.cache_save = &cs;
    kvdt_send(fd, &req, NULL, 0);
}

/* Send the save of chain c from pages first.. of p (no reply read). */
static void save_send_at(int fd, uint64_t cache, const pool_view_t *p, int c, int64_t first,
                         uint64_t id)
{
    uint8_t keys[CHAIN][8];
    int64_t pages[CHAIN];

    for (int i = 0; i < CHAIN; i++) {
        key_of(c, i, keys[i]);
        pages[i] = first + i;
    }
    save_send_keys(fd, cache, p, keys, pages, CHAIN, id);
}

/* Send the save of chain c from pages c * CHAIN.. of p (no reply read). */
static void save_send(int fd, uint64_t cache, const pool_view_t *p, int c, uint64_t id)
{
    save_send_at(fd, cache, p, c, (int64_t)c * CHAIN, id);
}

/* Save chain c and wait for its reply; again while the cache refuses
 * blocks because every host block is held (EBUSY, or some refused: their
 * writes to disk still running), the blocks stored already skipped.  The
 * last reply: status 0 and none refused when the whole chain is in. */
static Kvdock__Response *save_chain(int fd, uint64_t cache, const pool_view_t *p, int c,
                                    uint64_t id)
{
    for (int tries = 0;; tries++) {
        Kvdock__Response *r;

        save_send(fd, cache, p, c, id);
        r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
        ck_assert_ptr_nonnull(r);
        if (!(r->status == KVD_EBUSY || (r->status == 0 && r->op->refused > 0)) ||
            tries >= KVDT_TIMEOUT_MS / 5)
            return r;
        kvdock__response__free_unpacked(r, NULL);
        usleep(5000);
    }
}

/* The reply of save_chain: the whole chain is in the cache. */
static int saved_whole(const Kvdock__Response *r)
{
    return r->status == 0 && r->op->refused == 0 && r->op->stored + r->op->skipped == CHAIN;
}

/* How many of the n keys (8 bytes each) a lookup reports, and of them on
 * disk only. */
static uint32_t lookup_keys(int fd, uint64_t cache, uint8_t keys[][8], int n,
                            uint32_t *disk_hits)
{
    Kvdock__Request req;
    Kvdock__CacheLookup lk = KVDOCK__CACHE_LOOKUP__INIT;
    Kvdock__CacheKeys ck;
    Kvdock__Response *r;
    uint32_t hits;

    kvdock__cache_keys__init(&ck);
    ck.blob.data = &keys[0][0];
    ck.blob.len = (size_t)n * 8;
    ck.key_size = 8;
    lk.cache = cache;
    lk.keys = &ck;
    kvdt_req_init(&req, 40);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_LOOKUP;
    req.cache_lookup = &lk;
    r = kvdt_call(fd, &req);
    ck_assert_msg(r->status == 0, "lookup: %u %s", r->status, r->message);
    hits = r->cache_lookup->local_hits;
    if (disk_hits)
        *disk_hits = r->cache_lookup->disk_hits;
    kvdock__response__free_unpacked(r, NULL);
    return hits;
}

static uint32_t lookup(int fd, uint64_t cache, int c, uint32_t *disk_hits)
{
    uint8_t keys[CHAIN][8];

    for (int i = 0; i < CHAIN; i++)
        key_of(c, i, keys[i]);
    return lookup_keys(fd, cache, keys, CHAIN, disk_hits);
}

/* Load the first n blocks of chain c into pages 0..n-1 of p, sent again
 * while the answer is EBUSY for host slots that disk writes hold: the
 * answer. */
static Kvdock__Response *load_answer(int fd, uint64_t cache, const pool_view_t *p, int c, int n)
{
    Kvdock__Request req;
    Kvdock__CacheLoad cl = KVDOCK__CACHE_LOAD__INIT;
    Kvdock__CacheKeys ck;
    Kvdock__Indices ix = KVDOCK__INDICES__INIT;
    Kvdock__Response *r;
    uint8_t keys[CHAIN][8];
    int64_t pages[CHAIN];

    chain_keys(c, n, keys, &ck);
    for (int i = 0; i < n; i++)
        pages[i] = i;
    ix.values = pages;
    ix.n_values = (size_t)n;
    cl.cache = cache;
    cl.pool = p->id;
    cl.keys = &ck;
    cl.blocks = &ix;
    kvdt_req_init(&req, 41);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_LOAD;
    req.cache_load = &cl;
    /* EBUSY: blocks on disk found no host slot free of writes; sent again */
    for (int tries = 0;; tries++) {
        r = kvdt_call(fd, &req);
        if (r->status != KVD_EBUSY || tries >= KVDT_TIMEOUT_MS / 5)
            break;
        ck_assert_msg(strstr(r->message, "send the load again") != NULL, "%s", r->message);
        kvdock__response__free_unpacked(r, NULL);
        usleep(5000);
    }
    return r;
}

/* The same, loaded. */
static void load(int fd, uint64_t cache, const pool_view_t *p, int c, int n)
{
    Kvdock__Response *r = load_answer(fd, cache, p, c, n);

    ck_assert_msg(r->status == 0, "load of %d blocks of chain %d: %u %s", n, c, r->status,
                  r->message);
    kvdock__response__free_unpacked(r, NULL);
}

/* Every block a lookup reports of chains [c0, c1) loads with its exact
 * bytes; how many. */
static uint32_t verify_range(int fd, uint64_t cache, int c0, int c1)
{
    pool_view_t b;
    uint32_t total = 0;

    pool_open(fd, "verify", CHAIN, &b);
    for (int c = c0; c < c1; c++) {
        uint32_t h = lookup(fd, cache, c, NULL);
        if (h == 0)
            continue;
        memset(b.map, 0xA5, b.len); /* poisoned */
        load(fd, cache, &b, c, (int)h);
        for (uint32_t i = 0; i < h; i++)
            ck_assert_msg(page_is(&b, i, c, (int)i), "chain %d block %u: other bytes after "
                          "the restart", c, i);
        total += h;
    }
    munmap(b.map, b.len);
    {
        Kvdock__Request req;
        Kvdock__PoolDrop pd = KVDOCK__POOL_DROP__INIT;
        kvdt_req_init(&req, 42);
        pd.pool = b.id;
        req.op_case = KVDOCK__REQUEST__OP_POOL_DROP;
        req.pool_drop = &pd;
        ck_assert_int_eq(kvdt_status_of(fd, &req), 0);
    }
    return total;
}

static uint32_t verify_all(int fd, uint64_t cache)
{
    return verify_range(fd, cache, 0, CHAINS);
}

#define BLOCKS_HOST ((uint64_t)HOST_BLOCKS * BLOCK_BYTES)
#define BLOCKS_DISK (40ull * HOST_BLOCKS * BLOCK_BYTES)

/* Create (or with existing, open) the blocks cache, asking for host and
 * disk budgets host and disk. */
static Kvdock__Response *blocks_create_with(int fd, int existing, uint64_t host, uint64_t disk)
{
    kvdt_cache_req_t q;

    kvdt_cache_req(&q, 2, "blocks", host, disk);
    q.cl.num_layers = LAYERS;
    q.cl.tokens_per_block = TPB;
    q.cl.token_bytes = TOKB;
    q.cc.open_existing = existing;
    return kvdt_call(fd, &q.req);
}

static Kvdock__Response *blocks_create(int fd, int existing)
{
    return blocks_create_with(fd, existing, BLOCKS_HOST, BLOCKS_DISK);
}

/* The blocks cache made (or with existing, opened again), its id. */
static uint64_t cache_id(int fd, int existing)
{
    Kvdock__Response *r = blocks_create(fd, existing);
    uint64_t id;

    ck_assert_msg(r->status == 0, "%u %s", r->status, r->message);
    id = r->cache->id;
    kvdock__response__free_unpacked(r, NULL);
    return id;
}

/* A world of blocks: the daemon started on the cache dir, the blocks cache
 * made by a client "saver" (its id in *cache), and a pool a of pages for
 * chains [0, chains) of CHAIN blocks, each page holding its block's bytes.
 * The saver's connection. */
static int blocks_world(kvdt_daemon_t *d, int chains, uint64_t *cache, pool_view_t *a)
{
    int fd;

    world_make();
    start(d);
    fd = kvdt_client(d, "saver");
    *cache = cache_id(fd, 0);
    pool_open(fd, "src", (uint64_t)chains * CHAIN, a);
    for (int c = 0; c < chains; c++)
        for (int i = 0; i < CHAIN; i++)
            fill_page(a, (uint64_t)c * CHAIN + i, c, i);
    return fd;
}

/* Saves in flight (SIGKILL) or answered (SIGTERM), spills beneath them
 * (the host level holds HOST_BLOCKS of NBLK), then a restart: every block
 * a lookup reports loads with its exact bytes. */
static void blocks_case(int sig, const char *name)
{
    kvdt_daemon_t d;
    Kvdock__Response *r;
    pool_view_t a;
    uint64_t cache;
    uint32_t found;
    int fd;

    fd = blocks_world(&d, CHAINS, &cache, &a);
    if (sig == SIGKILL) {
        /* all sent at once (a save may find every host block held by the
         * saves before it: refused, which is fine here); a few answered,
         * the rest in flight when the daemon dies */
        for (int c = 0; c < CHAINS; c++)
            save_send(fd, cache, &a, c, 200 + (uint64_t)c);
        for (int c = 0; c < 3; c++) {
            r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
            ck_assert_ptr_nonnull(r);
            kvdock__response__free_unpacked(r, NULL);
        }
    } else {
        for (int c = 0; c < CHAINS; c++) { /* one at a time: each stored whole */
            r = save_chain(fd, cache, &a, c, 200 + (uint64_t)c);
            ck_assert_msg(saved_whole(r), "save of chain %d: %u %s", c, r->status, r->message);
            kvdock__response__free_unpacked(r, NULL);
        }
        /* before the restart too: what a lookup reports loads whole */
        ck_assert_uint_gt(verify_all(fd, cache), 0);
    }
    munmap(a.map, a.len);
    stop_with(&d, sig);
    close(fd);

    start(&d);
    ck_assert(kvdt_log_has(&d, "caches=1"));
    fd = kvdt_client(&d, "reader");
    cache = cache_id(fd, 1);
    found = verify_all(fd, cache);
    if (sig == SIGTERM) /* every block that left host memory went to disk */
        ck_assert_msg(found >= NBLK - 2 * HOST_BLOCKS, "%u of %d blocks back", found, NBLK);
    case_end(&d, FDS(fd), NULL);
}

START_TEST(test_blocks_after_sigterm)
{
    blocks_case(SIGTERM, "blocks_after_sigterm");
}
END_TEST

START_TEST(test_blocks_after_sigkill)
{
    blocks_case(SIGKILL, "blocks_after_sigkill");
}
END_TEST

/* Chain c after a restart: the blocks a lookup reports load with their
 * exact bytes; a load that meets a record failing its checks fails, and
 * the lookup then reports fewer (the damaged block and those after it
 * left the cache), which load whole.  The blocks served; *failed counts
 * loads that failed. */
static uint32_t served(int fd, uint64_t cache, const pool_view_t *b, int c, int *failed)
{
    uint32_t h = lookup(fd, cache, c, NULL);
    Kvdock__Request req;
    Kvdock__CacheLoad cl = KVDOCK__CACHE_LOAD__INIT;
    Kvdock__CacheKeys ck;
    Kvdock__Indices ix = KVDOCK__INDICES__INIT;
    Kvdock__Response *r;
    uint8_t keys[CHAIN][8];
    int64_t pages[CHAIN];

    for (int round = 0; round < 2 && h > 0; round++) {
        memset(b->map, 0xA5, b->len);
        chain_keys(c, (int)h, keys, &ck);
        for (uint32_t i = 0; i < h; i++)
            pages[i] = i;
        ix.values = pages;
        ix.n_values = h;
        cl.cache = cache;
        cl.pool = b->id;
        cl.keys = &ck;
        cl.blocks = &ix;
        kvdt_req_init(&req, 43);
        req.op_case = KVDOCK__REQUEST__OP_CACHE_LOAD;
        req.cache_load = &cl;
        r = kvdt_call(fd, &req);
        if (r->status == 0) {
            kvdock__response__free_unpacked(r, NULL);
            for (uint32_t i = 0; i < h; i++)
                ck_assert_msg(page_is(b, i, c, (int)i), "chain %d block %u: other bytes", c, i);
            return h;
        }
        ck_assert_msg(round == 0, "chain %d: a load failed twice: %u %s", c, r->status,
                      r->message);
        kvdock__response__free_unpacked(r, NULL);
        (*failed)++;
        {
            uint32_t h2 = lookup(fd, cache, c, NULL);
            ck_assert_msg(h2 < h, "chain %d: a load of %u blocks failed and a lookup still "
                          "reports %u", c, h, h2);
            h = h2;
        }
    }
    return h;
}

/* ---- damaged segments ----------------------------------------------------------- */

/* A record found in a segment file, read as the store lays records out:
 * after the 4096-byte header, a record's header wherever its magic is
 * (64-byte steps between batches).  Its key names its block. */
typedef struct rec_at {
    uint64_t off;
    int chain, i;
} rec_at_t;

#define SEG_HDR 4096u
#define REC_HDR 192u
#define REC_BYTES ((REC_HDR + BLOCK_BYTES + 63u) / 64u * 64u)

static void seg_file(int no, const char *ext, char *out, size_t len)
{
    snprintf(out, len, "%s/u%u-blocks/seg-%08d.%s", cdir, (unsigned)geteuid(), no, ext);
}

/* The records of segment file path, in file order (at most max); -1 when
 * there is no such file. */
static int seg_records(const char *path, rec_at_t *out, int max)
{
    struct stat st;
    uint8_t *buf;
    uint64_t pos, rec;
    int fd = open(path, O_RDONLY), n = 0;

    if (fd < 0)
        return -1;
    ck_assert_int_eq(fstat(fd, &st), 0);
    ck_assert_int_ge(st.st_size, SEG_HDR);
    buf = malloc((size_t)st.st_size);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
    close(fd);
    memcpy(&rec, buf + 32, 8); /* the segment header's rec_bytes */
    ck_assert_uint_eq(rec, REC_BYTES);
    for (pos = SEG_HDR; pos + REC_HDR <= (uint64_t)st.st_size;) {
        const uint8_t *h = buf + pos, *k = h + 40; /* key: after 40 bytes of fields */
        uint8_t want[8];
        if (memcmp(h, "KVDR", 4) != 0) {
            pos += 64;
            continue;
        }
        ck_assert_int_lt(n, max);
        ck_assert_uint_eq(h[4], 8); /* klen */
        out[n].off = pos;
        out[n].chain = (k[1] - '0') * 10 + (k[2] - '0');
        out[n].i = (k[4] - '0') * 100 + (k[5] - '0') * 10 + (k[6] - '0');
        ck_assert(out[n].chain >= 0 && out[n].chain < CHAINS && out[n].i >= 0 &&
                  out[n].i < CHAIN);
        key_of(out[n].chain, out[n].i, want);
        ck_assert_msg(memcmp(k, want, 8) == 0, "%s: a record at %" PRIu64 " of no block "
                      "saved", path, pos);
        n++;
        pos += rec;
    }
    free(buf);
    return n;
}

/* The cache's stats, until n blocks are on its disk level and writes records
 * written (blocks counts a record from when it is queued, writes once it
 * is on disk). */
static void wait_written(int fd, uint64_t cache, uint32_t n, uint64_t writes)
{
    Kvdock__Request req;
    Kvdock__CacheStats cs = KVDOCK__CACHE_STATS__INIT;

    cs.cache = cache;
    for (int tries = 0;; tries++) {
        Kvdock__Response *r;
        uint32_t on_disk;
        uint64_t written;
        kvdt_req_init(&req, 70);
        req.op_case = KVDOCK__REQUEST__OP_CACHE_STATS;
        req.cache_stats = &cs;
        r = kvdt_call(fd, &req);
        ck_assert_uint_eq(r->status, 0);
        ck_assert_ptr_nonnull(r->cache->disk);
        on_disk = r->cache->disk->blocks;
        written = r->cache->disk->writes;
        kvdock__response__free_unpacked(r, NULL);
        if (on_disk == n && written == writes)
            return;
        ck_assert_msg(tries < KVDT_TIMEOUT_MS / 5, "%u of %u blocks on disk, %" PRIu64
                      " of %" PRIu64 " records written", on_disk, n, written, writes);
        usleep(5000);
    }
}

static void wait_on_disk(int fd, uint64_t cache, uint32_t n)
{
    wait_written(fd, cache, n, n);
}

enum damage { FLIPPED, TRUNCATED };

/* Every block saved, on disk; the daemon stopped with sig (SIGTERM: every
 * segment indexed at close; SIGKILL: the segment being filled has no
 * index, so the restart reads it whole); then one segment damaged while
 * the daemon is down: the last that holds records, one bit of the data of
 * its middle record flipped, or the file cut (at a page) inside that
 * record, which loses it and every record after it.  The restarted daemon
 * on the same --cache-dir serves no damaged block nor any block after one
 * in its chain, serves every other block with its exact bytes (each
 * undamaged chain whole), and logs a line naming the file. */
static void damaged_case(int sig, enum damage how)
{
    kvdt_daemon_t d;
    Kvdock__Response *r;
    pool_view_t a, b;
    uint64_t cache;
    rec_at_t *recs = calloc(NBLK, sizeof(*recs)), *last;
    int count[CHAINS][CHAIN] = {{0}}, expect[CHAINS], got[CHAINS];
    int fd, failed = 0, seg = 0, n = 0, total = 0, m, lazy = sig == SIGTERM && how == FLIPPED;
    char path[800], idx[800], line[900];

    ck_assert_ptr_nonnull(recs);
    fd = blocks_world(&d, CHAINS, &cache, &a);
    for (int c = 0; c < CHAINS; c++) {
        r = save_chain(fd, cache, &a, c, 600 + (uint64_t)c);
        ck_assert_msg(saved_whole(r), "save of chain %d: %u %s", c, r->status, r->message);
        kvdock__response__free_unpacked(r, NULL);
    }
    munmap(a.map, a.len);
    wait_on_disk(fd, cache, NBLK); /* every record written before the stop */
    stop_with(&d, sig);
    close(fd);

    /* every block is in exactly one record; the last segment with records
     * is the one damaged */
    for (int no = 1;; no++) {
        int k;
        seg_file(no, "kvd", path, sizeof(path));
        if ((k = seg_records(path, recs + total, NBLK - total)) < 0)
            break;
        for (int j = total; j < total + k; j++)
            count[recs[j].chain][recs[j].i]++;
        if (k > 0) {
            seg = no;
            n = k;
        }
        total += k;
    }
    ck_assert_int_eq(total, NBLK);
    for (int c = 0; c < CHAINS; c++)
        for (int i = 0; i < CHAIN; i++)
            ck_assert_msg(count[c][i] == 1, "block %d of chain %d in %d records", i, c,
                          count[c][i]);
    ck_assert_int_ge(n, 8);
    last = recs + total - n; /* that segment's records, in file order */
    seg_file(seg, "kvd", path, sizeof(path));
    seg_file(seg, "idx", idx, sizeof(idx));
    /* SIGTERM sealed it with an index; after SIGKILL it has none */
    ck_assert_int_eq(access(idx, F_OK) == 0, sig == SIGTERM);
    m = n / 2;
    for (int c = 0; c < CHAINS; c++)
        expect[c] = CHAIN;
    {
        int sf = open(path, O_RDWR);
        ck_assert_msg(sf >= 0, "%s: %s", path, strerror(errno));
        if (how == FLIPPED) {
            uint8_t byte;
            off_t at = (off_t)(last[m].off + REC_HDR + 1000);
            ck_assert_int_eq(pread(sf, &byte, 1, at), 1);
            byte ^= 0x10;
            ck_assert_int_eq(pwrite(sf, &byte, 1, at), 1);
            expect[last[m].chain] = last[m].i;
        } else {
            /* a page boundary inside record m: it and every later one go */
            off_t cut = (off_t)((last[m].off + REC_BYTES / 2) / 4096 * 4096);
            ck_assert_int_gt(cut, (off_t)last[m].off);
            ck_assert_int_eq(ftruncate(sf, cut), 0);
            for (int j = m; j < n; j++)
                if (last[j].i < expect[last[j].chain])
                    expect[last[j].chain] = last[j].i;
        }
        close(sf);
    }

    start(&d);
    ck_assert(kvdt_log_has(&d, "caches=1"));
    fd = kvdt_client(&d, "reader");
    cache = cache_id(fd, 1);
    pool_open(fd, "verify", CHAIN, &b);
    for (int c = 0; c < CHAINS; c++)
        got[c] = (int)served(fd, cache, &b, c, &failed);
    for (int c = 0; c < CHAINS; c++)
        ck_assert_msg(got[c] == expect[c], "chain %d: %d blocks served, %d expected (%s, %s)",
                      c, got[c], expect[c], how == FLIPPED ? "a flipped byte" : "truncated",
                      sig == SIGTERM ? "SIGTERM" : "SIGKILL");
    /* only a flipped byte under an index is found by the load that reads
     * it (the restart reads indexes, not data): that load fails once;
     * otherwise the restart found the damage and a lookup never reports
     * a damaged block */
    ck_assert_msg(failed == lazy, "%d loads failed, %d expected", failed, lazy);
    if (lazy) {
        Kvdock__Request req;
        Kvdock__CacheStats cs = KVDOCK__CACHE_STATS__INIT;
        cs.cache = cache;
        kvdt_req_init(&req, 51);
        req.op_case = KVDOCK__REQUEST__OP_CACHE_STATS;
        req.cache_stats = &cs;
        r = kvdt_call(fd, &req);
        ck_assert_uint_eq(r->status, 0);
        ck_assert_ptr_nonnull(r->cache->disk);
        ck_assert_uint_eq(r->cache->disk->checksum_failures, 1);
        kvdock__response__free_unpacked(r, NULL);
    }
    /* the log names the file: the record that failed its checks when read,
     * a segment cut short (its index lists records past its end), or
     * records that failed theirs while the segment was read whole */
    snprintf(line, sizeof(line), "event=%s path=%s ",
             sig == SIGKILL ? "disk_records_torn"
             : how == FLIPPED ? "disk_record_bad" : "disk_segment_truncated", path);
    ck_assert_msg(kvdt_log_has(&d, line), "no '%s' in the log", line);
    free(recs);
    case_end(&d, FDS(fd), MAPS(MAPPED(b)));
}

START_TEST(test_flipped_after_sigterm)
{
    damaged_case(SIGTERM, FLIPPED);
}
END_TEST

START_TEST(test_flipped_after_sigkill)
{
    damaged_case(SIGKILL, FLIPPED);
}
END_TEST

START_TEST(test_truncated_after_sigterm)
{
    damaged_case(SIGTERM, TRUNCATED);
}
END_TEST

START_TEST(test_truncated_after_sigkill)
{
    damaged_case(SIGKILL, TRUNCATED);
}
END_TEST

/* The file system refuses more (RLIMIT_FSIZE lowered on the running
 * daemon to FULL_AT: every write past it fails with EFBIG, as on a full
 * disk; the daemon's log, a file too, stays below it): saves go on in
 * host memory, the refusals are counted and logged, and the blocks
 * already whole on disk still load byte for byte.  The first half's
 * records reach past FULL_AT, so the segment being filled is past it, and
 * the second half (16 MiB) fits no segment below it. */
#define FULL_AT (4u << 20)
START_TEST(test_disk_full)
{
    kvdt_daemon_t d;
    Kvdock__Response *r;
    Kvdock__Request req;
    Kvdock__CacheStats cs = KVDOCK__CACHE_STATS__INIT;
    struct rlimit before, one;
    pool_view_t a;
    uint64_t cache;
    uint32_t first;
    int fd;

    fd = blocks_world(&d, CHAINS, &cache, &a);
    for (int c = 0; c < CHAINS; c++) {
        if (c == CHAINS / 2) { /* the disk is full from here on (the soft limit) */
            ck_assert_int_eq(prlimit(d.pid, RLIMIT_FSIZE, NULL, &before), 0);
            one.rlim_cur = FULL_AT;
            one.rlim_max = before.rlim_max;
            ck_assert_int_eq(prlimit(d.pid, RLIMIT_FSIZE, &one, NULL), 0);
        }
        r = save_chain(fd, cache, &a, c, 300 + (uint64_t)c);
        ck_assert_msg(saved_whole(r), "save of chain %d with the disk full: %u %s (stored %u, "
                      "refused %u)", c, r->status, r->message, r->op ? r->op->stored : 0,
                      r->op ? r->op->refused : 0);
        kvdock__response__free_unpacked(r, NULL);
    }
    munmap(a.map, a.len);
    cs.cache = cache;
    kvdt_req_init(&req, 50);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_STATS;
    req.cache_stats = &cs;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_ptr_nonnull(r->cache->disk);
    ck_assert_msg(r->cache->disk->no_space > 0, "no refusal counted (spills %" PRIu64 ")",
                  r->cache->disk->spills);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_log_has(&d, "File too large")); /* the refused write, logged with why */
    /* room again (host pools are memfds, which the limit also holds) */
    ck_assert_int_eq(prlimit(d.pid, RLIMIT_FSIZE, &before, NULL), 0);
    /* what was whole before is served; the second half's last blocks are
     * in host memory; every block reported loads whole */
    first = verify_range(fd, cache, 0, CHAINS / 2);
    ck_assert_msg(first >= NBLK / 2 - 3 * HOST_BLOCKS, "%u blocks of the first half back",
                  first);
    (void)verify_range(fd, cache, CHAINS / 2, CHAINS);
    case_end(&d, FDS(fd), NULL);
}
END_TEST

/* A host slab the system refuses to a load from disk: after a restart the
 * cache's blocks are on disk only and it has no slab; with the daemon's
 * address space capped under its first slab (RLIMIT_AS), a load that must
 * read blocks into host memory is answered ENOMEM saying the slab could
 * not be made, and loses nothing: the chain is still reported whole, and
 * once the cap is lifted it loads byte for byte. */
START_TEST(test_load_slab_refused)
{
    const uint64_t host = 3072ull * BLOCK_BYTES; /* a first slab of 192 MiB */
    kvdt_daemon_t d;
    Kvdock__Response *r;
    pool_view_t a, b;
    struct rlimit before, capped;
    uint32_t disk_hits = 0;
    uint64_t cache;
    int fd;

    world_make();
    start(&d);
    fd = kvdt_client(&d, "saver");
    r = blocks_create_with(fd, 0, host, BLOCKS_DISK);
    ck_assert_msg(r->status == 0, "%u %s", r->status, r->message);
    cache = r->cache->id;
    kvdock__response__free_unpacked(r, NULL);
    pool_open(fd, "src", 2 * CHAIN, &a);
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < CHAIN; i++)
            fill_page(&a, (uint64_t)c * CHAIN + i, c, i);
        r = save_chain(fd, cache, &a, c, 200 + (uint64_t)c);
        ck_assert_msg(saved_whole(r), "save of chain %d: %u %s", c, r->status, r->message);
        kvdock__response__free_unpacked(r, NULL);
    }
    wait_on_disk(fd, cache, 2 * CHAIN);
    munmap(a.map, a.len);
    close(fd);
    stop_with(&d, SIGTERM);

    start(&d);
    fd = kvdt_client(&d, "reader");
    cache = cache_id(fd, 1);
    ck_assert_uint_eq(lookup(fd, cache, 0, &disk_hits), CHAIN);
    ck_assert_uint_eq(disk_hits, CHAIN); /* on disk only */
    pool_open(fd, "loaded", CHAIN, &b);
    ck_assert_int_eq(prlimit(d.pid, RLIMIT_AS, NULL, &before), 0);
    capped = before;
    capped.rlim_cur = kvt_proc_bytes(d.pid, "VmSize:") + (64u << 20);
    ck_assert_int_eq(prlimit(d.pid, RLIMIT_AS, &capped, NULL), 0);
    r = load_answer(fd, cache, &b, 0, CHAIN);
    ck_assert_msg(r->status == KVD_ENOMEM && strstr(r->message, "could not be made") != NULL,
                  "load under the cap: %u %s", r->status, r->message);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_ping_ok(fd));
    ck_assert_uint_eq(lookup(fd, cache, 0, &disk_hits), CHAIN);
    ck_assert_uint_eq(disk_hits, CHAIN);
    ck_assert_int_eq(prlimit(d.pid, RLIMIT_AS, &before, NULL), 0);
    memset(b.map, 0xA5, b.len); /* poisoned */
    load(fd, cache, &b, 0, CHAIN);
    for (int i = 0; i < CHAIN; i++)
        ck_assert_msg(page_is(&b, (uint64_t)i, 0, i), "block %d: other bytes", i);
    ck_assert_uint_eq(verify_range(fd, cache, 1, 2), CHAIN);
    case_end(&d, FDS(fd), MAPS({b.map, b.len}));
}
END_TEST

/* Every host slot held by leases: a load of blocks on disk only cannot
 * read them back now and is EBUSY saying so, the blocks still there; with
 * the leases gone the same load loads them. */
START_TEST(test_load_busy)
{
    kvdt_daemon_t d;
    Kvdock__Response *r;
    Kvdock__Request req;
    Kvdock__CacheLookup lk = KVDOCK__CACHE_LOOKUP__INIT;
    Kvdock__CacheLoad cl = KVDOCK__CACHE_LOAD__INIT;
    Kvdock__CacheKeys ck;
    Kvdock__Indices ix = KVDOCK__INDICES__INIT;
    uint8_t keys[CHAIN][8];
    int64_t pages[CHAIN];
    pool_view_t a;
    uint64_t cache;
    uint32_t disk_hits;
    int fd, holder, c;

    fd = blocks_world(&d, 8, &cache, &a);
    for (c = 0; c < 8; c++) { /* twice the host level: chains 0-3 end on disk only */
        r = save_chain(fd, cache, &a, c, 500 + (uint64_t)c);
        ck_assert_msg(saved_whole(r), "save of chain %d: %u %s", c, r->status, r->message);
        kvdock__response__free_unpacked(r, NULL);
    }
    wait_on_disk(fd, cache, 8 * CHAIN); /* every record written */
    /* chains 4-7 fill the host level: leased, every slot is held */
    holder = kvdt_client(&d, "holder");
    for (c = 4; c < 8; c++) {
        chain_keys(c, CHAIN, keys, &ck);
        lk.cache = cache;
        lk.keys = &ck;
        lk.lease = 1;
        kvdt_req_init(&req, 61);
        req.op_case = KVDOCK__REQUEST__OP_CACHE_LOOKUP;
        req.cache_lookup = &lk;
        r = kvdt_call(holder, &req);
        ck_assert_msg(r->status == 0, "lookup: %u %s", r->status, r->message);
        ck_assert_uint_eq(r->cache_lookup->local_hits, CHAIN);
        ck_assert_uint_eq(r->cache_lookup->disk_hits, 0);
        ck_assert_uint_ne(r->cache_lookup->lease, 0);
        kvdock__response__free_unpacked(r, NULL);
    }
    ck_assert_uint_eq(lookup(fd, cache, 0, &disk_hits), CHAIN);
    ck_assert_uint_eq(disk_hits, CHAIN); /* chain 0: on disk only */
    chain_keys(0, CHAIN, keys, &ck);
    for (int i = 0; i < CHAIN; i++)
        pages[i] = i;
    ix.values = pages;
    ix.n_values = CHAIN;
    cl.cache = cache;
    cl.pool = a.id;
    cl.keys = &ck;
    cl.blocks = &ix;
    kvdt_req_init(&req, 62);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_LOAD;
    req.cache_load = &cl;
    r = kvdt_call(fd, &req);
    ck_assert_msg(r->status == KVD_EBUSY, "load with every slot leased: %u %s", r->status,
                  r->message);
    ck_assert_msg(strstr(r->message, "send the load again") != NULL, "%s", r->message);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(lookup(fd, cache, 0, NULL), CHAIN); /* nothing lost */
    close(holder); /* the leases go with it */
    memset(a.map, 0xA5, a.len);
    load(fd, cache, &a, 0, CHAIN);
    for (int i = 0; i < CHAIN; i++)
        ck_assert_msg(page_is(&a, (uint64_t)i, 0, i), "chain 0 block %d: other bytes", i);
    case_end(&d, FDS(fd), MAPS(MAPPED(a)));
}
END_TEST

/* Loads of more blocks on disk only than the host level holds: chains
 * [0, BIG_CHAINS) saved, then pushed out of host memory by the rest. */
#define BIG_CHAINS 16 /* 256 blocks: 4 times HOST_BLOCKS */
#define BIG (BIG_CHAINS * CHAIN)

/* Send one load of every block of chains[0..n) (by key, or with lease:
 * the lease's) into pages 0.. of p, in that order; with buf, a layer
 * flag per layer in that buffer (no reply read). */
static void chains_load_send(int fd, uint64_t cache, const pool_view_t *p, const int *chains,
                             int n, uint64_t lease, uint64_t buf, uint32_t flag_value, uint64_t id)
{
    static uint8_t keys[BIG][8];
    static int64_t pages[BIG];
    Kvdock__Request req;
    Kvdock__CacheLoad cl = KVDOCK__CACHE_LOAD__INIT;
    Kvdock__CacheKeys ck;
    Kvdock__Indices ix = KVDOCK__INDICES__INIT;
    Kvdock__BufRef flags = KVDOCK__BUF_REF__INIT;

    ck_assert_int_le(n * CHAIN, BIG);
    for (int i = 0; i < n * CHAIN; i++) {
        key_of(chains[i / CHAIN], i % CHAIN, keys[i]);
        pages[i] = i;
    }
    kvdock__cache_keys__init(&ck);
    ck.blob.data = &keys[0][0];
    ck.blob.len = (size_t)n * CHAIN * sizeof(keys[0]);
    ck.key_size = 8;
    ix.values = pages;
    ix.n_values = (size_t)n * CHAIN;
    flags.buffer = buf;
    flags.bytes = LAYERS * sizeof(uint32_t);
    cl.cache = cache;
    cl.pool = p->id;
    if (lease != 0)
        cl.lease = lease;
    else
        cl.keys = &ck;
    cl.blocks = &ix;
    if (buf != 0) {
        cl.layer_flags = &flags;
        cl.flag_value = flag_value;
    }
    kvdt_req_init(&req, id);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_LOAD;
    req.cache_load = &cl;
    kvdt_send(fd, &req, NULL, 0);
}

/* The same, of chains [0, BIG_CHAINS) into pages 0..BIG-1, with layer
 * flags. */
static void big_load_send(int fd, uint64_t cache, const pool_view_t *p, uint64_t lease,
                          uint64_t buf, uint32_t flag_value, uint64_t id)
{
    int chains[BIG_CHAINS];

    for (int c = 0; c < BIG_CHAINS; c++)
        chains[c] = c;
    chains_load_send(fd, cache, p, chains, BIG_CHAINS, lease, buf, flag_value, id);
}

/* The reply of big_load_send: every block loaded, each page its block's
 * bytes, each layer's flag written. */
static void big_load_check(const Kvdock__Response *r, const pool_view_t *p,
                           const uint32_t *flags, uint32_t flag_value)
{
    ck_assert_msg(r->status == 0, "load of %d blocks through a host level of %d: %u %s", BIG,
                  HOST_BLOCKS, r->status, r->message);
    ck_assert_uint_eq(r->op->rows, BIG);
    for (int i = 0; i < BIG; i++)
        ck_assert_msg(page_is(p, (uint64_t)i, i / CHAIN, i % CHAIN), "page %d: other bytes", i);
    for (int g = 0; g < LAYERS; g++)
        ck_assert_uint_eq(flags[g], flag_value);
}

/* Saves chains [0, n) from pages c * CHAIN of a fresh pool, whole, and
 * waits until every record is on disk; the pool stays open in *a. */
static void save_chains(int fd, uint64_t cache, int n, pool_view_t *a)
{
    Kvdock__Response *r;

    pool_open(fd, "src", (uint64_t)CHAINS * CHAIN, a);
    for (int c = 0; c < CHAINS; c++)
        for (int i = 0; i < CHAIN; i++)
            fill_page(a, (uint64_t)c * CHAIN + i, c, i);
    for (int c = 0; c < n; c++) {
        r = save_chain(fd, cache, a, c, 800 + (uint64_t)c);
        ck_assert_msg(saved_whole(r), "save of chain %d: %u %s", c, r->status, r->message);
        kvdock__response__free_unpacked(r, NULL);
    }
    wait_on_disk(fd, cache, (uint32_t)n * CHAIN);
}

/* A load of 4 times the host level's blocks, every one on disk only,
 * loads byte for byte in one request, its layer flags written: the reads
 * go through host memory a part at a time.  The blocks stay on disk, and
 * the same load again loads them again (the host level full of the
 * plan's own blocks), and so does a load by a lease of them all. */
START_TEST(test_load_streams)
{
    kvdt_daemon_t d;
    Kvdock__Response *r;
    pool_view_t a, b;
    uint64_t cache, buf;
    uint32_t *flags, disk_hits;
    void *map;
    int fd;

    world_make();
    start(&d);
    fd = kvdt_client(&d, "loader");
    cache = cache_id(fd, 0);
    save_chains(fd, cache, BIG_CHAINS + HOST_BLOCKS / CHAIN + 1, &a);
    for (int c = 0; c < BIG_CHAINS; c++) {
        ck_assert_uint_eq(lookup(fd, cache, c, &disk_hits), CHAIN);
        ck_assert_msg(disk_hits == CHAIN, "chain %d: %u of %d on disk only", c, disk_hits,
                      CHAIN);
    }
    pool_open(fd, "dst", BIG, &b);
    buf = kvdt_buffer_map(fd, 4096, &map);
    flags = map;
    for (int round = 0; round < 3; round++) {
        uint64_t lease = 0;
        if (round == 2) { /* by a lease of them all, taken while most are on disk only */
            static uint8_t keys[BIG][8];
            Kvdock__Request req;
            Kvdock__CacheLookup lk = KVDOCK__CACHE_LOOKUP__INIT;
            Kvdock__CacheKeys ck;
            for (int i = 0; i < BIG; i++)
                key_of(i / CHAIN, i % CHAIN, keys[i]);
            kvdock__cache_keys__init(&ck);
            ck.blob.data = &keys[0][0];
            ck.blob.len = sizeof(keys);
            ck.key_size = 8;
            lk.cache = cache;
            lk.keys = &ck;
            lk.lease = 1;
            kvdt_req_init(&req, 910);
            req.op_case = KVDOCK__REQUEST__OP_CACHE_LOOKUP;
            req.cache_lookup = &lk;
            r = kvdt_call(fd, &req);
            ck_assert_msg(r->status == 0, "lookup: %u %s", r->status, r->message);
            ck_assert_uint_eq(r->cache_lookup->local_hits, BIG);
            ck_assert_uint_ge(r->cache_lookup->disk_hits, BIG - HOST_BLOCKS);
            lease = r->cache_lookup->lease;
            ck_assert_uint_ne(lease, 0);
            kvdock__response__free_unpacked(r, NULL);
        }
        memset(b.map, 0xA5, b.len); /* poisoned */
        memset(flags, 0, LAYERS * sizeof(uint32_t));
        big_load_send(fd, cache, &b, lease, buf, 7 + (uint32_t)round, 900 + (uint64_t)round);
        r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
        ck_assert_ptr_nonnull(r);
        big_load_check(r, &b, flags, 7 + (uint32_t)round);
        kvdock__response__free_unpacked(r, NULL);
        if (lease != 0) { /* the load ended it */
            Kvdock__Request req;
            Kvdock__CacheRelease rl = KVDOCK__CACHE_RELEASE__INIT;
            rl.lease = lease;
            kvdt_req_init(&req, 911);
            req.op_case = KVDOCK__REQUEST__OP_CACHE_RELEASE;
            req.cache_release = &rl;
            ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_ENOENT);
        }
    }
    /* still every block in the cache, most on disk only again */
    for (int c = 0; c < BIG_CHAINS; c++)
        ck_assert_uint_eq(lookup(fd, cache, c, NULL), CHAIN);
    case_end(&d, FDS(fd), MAPS({map, 4096}, MAPPED(a), MAPPED(b)));
}
END_TEST

/* The same load while another client's saves of new chains are in
 * flight, sent all at once (their writes hold host slots): the load and
 * every save end whole; meanwhile a third client's lookups report only
 * blocks that load with their exact bytes. */
START_TEST(test_load_streams_beside_saves)
{
    kvdt_daemon_t d;
    Kvdock__Response *r;
    pool_view_t a, b, s;
    uint64_t cache, buf;
    uint32_t *flags;
    const int saved = BIG_CHAINS + HOST_BLOCKS / CHAIN;
    uint8_t answered[CHAINS] = {0};
    int fd, saver, looker;
    void *map;

    world_make();
    start(&d);
    fd = kvdt_client(&d, "loader");
    cache = cache_id(fd, 0);
    save_chains(fd, cache, saved, &a);
    pool_open(fd, "dst", BIG, &b);
    memset(b.map, 0xA5, b.len);
    buf = kvdt_buffer_map(fd, 4096, &map);
    flags = map;
    memset(flags, 0, LAYERS * sizeof(uint32_t));
    saver = kvdt_client(&d, "saver");
    pool_open(saver, "new", (uint64_t)(CHAINS - saved) * CHAIN, &s);
    for (int c = saved; c < CHAINS; c++)
        for (int i = 0; i < CHAIN; i++)
            fill_page(&s, (uint64_t)(c - saved) * CHAIN + i, c, i);
    /* half the new chains' saves, the load, the other half */
    for (int c = saved; c < CHAINS; c++) {
        if (c == saved + (CHAINS - saved) / 2)
            big_load_send(fd, cache, &b, 0, buf, 11, 950);
        save_send_at(saver, cache, &s, c, (int64_t)(c - saved) * CHAIN, 300 + (uint64_t)c);
    }
    looker = kvdt_client(&d, "looker");
    (void)verify_range(looker, cache, 0, CHAINS); /* what it reports loads whole */
    r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->id, 950);
    big_load_check(r, &b, flags, 11);
    kvdock__response__free_unpacked(r, NULL);
    for (int n = saved; n < CHAINS; n++) {
        uint64_t id;
        r = kvdt_recv(saver, NULL, NULL, KVDT_TIMEOUT_MS);
        ck_assert_ptr_nonnull(r);
        id = r->id;
        ck_assert_msg(id >= 300 + (uint64_t)saved && id < 300 + CHAINS && !answered[id - 300],
                      "reply %" PRIu64, id);
        answered[id - 300] = 1;
        ck_assert_msg(r->status == 0 && r->op->refused == 0 && r->op->stored == CHAIN,
                      "save of chain %d beside the load: %u %s", (int)(id - 300), r->status,
                      r->message);
        kvdock__response__free_unpacked(r, NULL);
    }
    ck_assert_uint_eq(verify_all(looker, cache), NBLK); /* every block, its exact bytes */
    case_end(&d, FDS(looker, saver, fd), MAPS({map, 4096}, MAPPED(a), MAPPED(b), MAPPED(s)));
}
END_TEST

/* Send one save of BIG blocks, one chain whose key i is that of block i %
 * CHAIN of chain chain0 + i / CHAIN, from pages 0..BIG-1 of p (no reply
 * read). */
static void big_save_send(int fd, uint64_t cache, const pool_view_t *p, int chain0, uint64_t id)
{
    static uint8_t keys[BIG][8];
    static int64_t pages[BIG];

    for (int i = 0; i < BIG; i++) {
        key_of(chain0 + i / CHAIN, i % CHAIN, keys[i]);
        pages[i] = i;
    }
    save_send_keys(fd, cache, p, keys, pages, BIG, id);
}

/* How many of the BIG keys of big_save_send(chain0) a lookup reports, and
 * of them on disk only. */
static uint32_t big_lookup(int fd, uint64_t cache, int chain0, uint32_t *disk_hits)
{
    static uint8_t keys[BIG][8];

    for (int i = 0; i < BIG; i++)
        key_of(chain0 + i / CHAIN, i % CHAIN, keys[i]);
    return lookup_keys(fd, cache, keys, BIG, disk_hits);
}

/* Blocks the cache's disk level holds now (records queued or written). */
static uint32_t disk_blocks(int fd, uint64_t cache)
{
    Kvdock__Request req;
    Kvdock__CacheStats cs = KVDOCK__CACHE_STATS__INIT;
    Kvdock__Response *r;
    uint32_t n;

    cs.cache = cache;
    kvdt_req_init(&req, 71);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_STATS;
    req.cache_stats = &cs;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_ptr_nonnull(r->cache->disk);
    n = r->cache->disk->blocks;
    kvdock__response__free_unpacked(r, NULL);
    return n;
}

/* One save of 4 times the host level's blocks streams through it: stored
 * whole in one request, most of it on disk only, and loaded back byte for
 * byte.  While it streams, another client's lookups see all of it or
 * none; a client that leaves in the middle of such a save leaves none of
 * its blocks, on either level; into a disk level of twice the host
 * level, it stores what fits and counts the rest refused. */
START_TEST(test_save_streams)
{
    kvdt_daemon_t d;
    Kvdock__Response *r;
    pool_view_t a, b, q;
    uint64_t cache, buf;
    uint32_t *flags, disk_hits, seen;
    void *map;
    int fd, looker, quitter;

    world_make();
    start(&d);
    fd = kvdt_client(&d, "saver");
    cache = cache_id(fd, 0);
    pool_open(fd, "src", BIG, &a);
    for (int i = 0; i < BIG; i++)
        fill_page(&a, (uint64_t)i, i / CHAIN, i % CHAIN);
    looker = kvdt_client(&d, "looker");
    big_save_send(fd, cache, &a, 0, 930);
    for (;;) { /* all or nothing, whenever a lookup comes */
        seen = big_lookup(looker, cache, 0, NULL);
        ck_assert_msg(seen == 0 || seen == BIG, "a lookup saw %u of the %d blocks of a save "
                      "in flight", seen, BIG);
        if (poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, 1) == 1) {
            r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
            ck_assert_ptr_nonnull(r);
            break;
        }
    }
    ck_assert_msg(r->status == 0, "save of %d blocks through a host level of %d: %u %s", BIG,
                  HOST_BLOCKS, r->status, r->message);
    ck_assert_msg(r->op->stored == BIG && r->op->refused == 0 && r->op->skipped == 0,
                  "stored %u, refused %u, skipped %u", r->op->stored, r->op->refused,
                  r->op->skipped);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(big_lookup(looker, cache, 0, &disk_hits), BIG);
    ck_assert_msg(disk_hits >= BIG - HOST_BLOCKS, "%u of %d on disk only", disk_hits, BIG);
    pool_open(fd, "dst", BIG, &b);
    memset(b.map, 0xA5, b.len); /* poisoned */
    buf = kvdt_buffer_map(fd, 4096, &map);
    flags = map;
    memset(flags, 0, LAYERS * sizeof(uint32_t));
    big_load_send(fd, cache, &b, 0, buf, 5, 931);
    r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
    ck_assert_ptr_nonnull(r);
    big_load_check(r, &b, flags, 5);
    kvdock__response__free_unpacked(r, NULL);

    /* a client leaves while its save streams: once it is gone, none of
     * its blocks is there, and the disk level holds the first save's */
    quitter = kvdt_client(&d, "quitter");
    pool_open(quitter, "quit", BIG, &q);
    big_save_send(quitter, cache, &q, 200, 932);
    for (int tries = 0; disk_blocks(fd, cache) < BIG + HOST_BLOCKS; tries++) {
        ck_assert_msg(tries < KVDT_TIMEOUT_MS, "the second save wrote nothing");
        usleep(1000);
    }
    munmap(q.map, q.len);
    close(quitter);
    for (int tries = 0;; tries++) {
        uint32_t on_disk = disk_blocks(fd, cache);
        seen = big_lookup(looker, cache, 200, NULL);
        ck_assert_msg(seen == 0 || seen == BIG, "%u blocks of a save half there", seen);
        if (on_disk == BIG && seen == 0)
            break;
        ck_assert_msg(tries < KVDT_TIMEOUT_MS / 5, "the save of a client gone left %u blocks "
                      "(%u on disk)", seen, on_disk);
        usleep(5000);
    }
    /* the first save's blocks, all still there */
    ck_assert_uint_eq(big_lookup(looker, cache, 0, NULL), BIG);

    /* a cache whose disk level holds about twice its host level: the
     * save stores what the two levels can take (the disk's records, and
     * host slots whose blocks the disk refused), says how many it
     * refused, and what it stored loads byte for byte */
    {
        kvdt_cache_req_t t;
        uint64_t tight;
        uint32_t stored, total = 0;

        kvdt_cache_req(&t, 933, "tight", BLOCKS_HOST, 2 * BLOCKS_HOST);
        t.cl.num_layers = LAYERS;
        t.cl.tokens_per_block = TPB;
        t.cl.token_bytes = TOKB;
        r = kvdt_call(fd, &t.req);
        ck_assert_msg(r->status == 0, "%u %s", r->status, r->message);
        tight = r->cache->id;
        kvdock__response__free_unpacked(r, NULL);
        big_save_send(fd, tight, &a, 0, 934);
        r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(r->status == 0, "save past the disk budget: %u %s", r->status,
                      r->message);
        stored = r->op->stored;
        ck_assert_msg(stored > HOST_BLOCKS && stored < BIG && r->op->refused == BIG - stored,
                      "stored %u, refused %u", stored, r->op->refused);
        kvdock__response__free_unpacked(r, NULL);
        ck_assert_uint_eq(big_lookup(looker, tight, 0, NULL), stored);
        /* the last chains first: their blocks the disk refused are in
         * host memory only, and reading the first chains back from disk
         * evicts them (chain tails first) */
        for (int c = BIG_CHAINS; c-- > 0;)
            total += verify_range(fd, tight, c, c + 1);
        ck_assert_uint_eq(total, stored);
    }
    case_end(&d, FDS(looker, fd), MAPS({map, 4096}, MAPPED(a), MAPPED(b)));
}
END_TEST

/* The disk threads of daemon pid (named kvd-disk) stop where they are,
 * as on a disk that has stopped answering: ptrace-interrupted, their
 * ids in tids (how many).  disk_resume lets them go on. */
static int disk_stop(pid_t pid, pid_t *tids, int max)
{
    char path[64], comm[32];
    struct dirent *e;
    DIR *dir;
    int n = 0;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    ck_assert_ptr_nonnull(dir = opendir(path));
    while ((e = readdir(dir)) != NULL) {
        FILE *f;
        pid_t tid = (pid_t)atoi(e->d_name);
        int st;

        if (tid <= 0)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%d/comm", (int)pid, (int)tid);
        if ((f = fopen(path, "r")) == NULL)
            continue;
        comm[0] = '\0';
        if (fgets(comm, sizeof(comm), f) == NULL)
            comm[0] = '\0';
        fclose(f);
        if (strncmp(comm, "kvd-disk", 8) != 0)
            continue;
        ck_assert_int_lt(n, max);
        ck_assert_msg(ptrace(PTRACE_SEIZE, tid, NULL, NULL) == 0, "ptrace of the disk thread "
                      "%d: %s", (int)tid, strerror(errno));
        ck_assert_int_eq(ptrace(PTRACE_INTERRUPT, tid, NULL, NULL), 0);
        ck_assert_int_eq(waitpid(tid, &st, __WALL), tid);
        tids[n++] = tid;
    }
    closedir(dir);
    ck_assert_msg(n > 0, "no kvd-disk thread in daemon %d", (int)pid);
    return n;
}

static void disk_resume(const pid_t *tids, int n)
{
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(ptrace(PTRACE_DETACH, tids[i], NULL, NULL), 0);
}

/* The disk stops answering (its threads stopped) under saves that fill
 * the host level, with --disk-wait-ms 300: a save that streams past the
 * host level and one that finds no slot at all each wait 300 ms and are
 * answered EBUSY saying why and how long they waited, nothing of either
 * stored (a lookup finds none of their blocks, then or later).  With the
 * disk back, the saves before them are whole on disk and load byte for
 * byte, and the daemon stops clean. */
START_TEST(test_wait_expires)
{
    const char *extra[] = {"--disk-wait-ms", "300", NULL};
    kvdt_daemon_t d;
    Kvdock__Response *r;
    pool_view_t a;
    uint64_t cache;
    pid_t tids[64];
    int fd, nt;

    world_make();
    start_with(&d, "256M", extra);
    fd = kvdt_client(&d, "saver");
    cache = cache_id(fd, 0);
    pool_open(fd, "src", BIG, &a);
    for (int i = 0; i < BIG; i++)
        fill_page(&a, (uint64_t)i, i / CHAIN, i % CHAIN);
    nt = disk_stop(d.pid, tids, 64);
    /* three chains: 48 of the 64 host slots, their writes never end */
    for (int c = 0; c < 3; c++) {
        save_send(fd, cache, &a, c, 960 + (uint64_t)c);
        r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(saved_whole(r), "save of chain %d: %u %s", c, r->status, r->message);
        kvdock__response__free_unpacked(r, NULL);
    }
    /* a save of 256 blocks takes the 16 slots left, then waits */
    big_save_send(fd, cache, &a, 100, 970);
    r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->status == KVD_EBUSY && strstr(r->message, "waited 300 ms") != NULL &&
                  strstr(r->message, "16 of 256 blocks stored, the rest waiting") != NULL,
                  "a streaming save past its wait: %u %s", r->status, r->message);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(big_lookup(fd, cache, 100, NULL), 0);
    /* a save that finds no slot at all */
    save_send(fd, cache, &a, 3, 971);
    r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->status == KVD_EBUSY && strstr(r->message, "waited 300 ms") != NULL &&
                  strstr(r->message, "written to disk") != NULL,
                  "a waiting save past its wait: %u %s", r->status, r->message);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_uint_eq(lookup(fd, cache, 3, NULL), 0);
    disk_resume(tids, nt);
    /* the three chains on disk; the streamed save's 16 records, written
     * once the disk came back, dropped */
    wait_written(fd, cache, 3 * CHAIN, 4 * CHAIN);
    ck_assert_uint_eq(big_lookup(fd, cache, 100, NULL), 0);
    ck_assert_uint_eq(lookup(fd, cache, 3, NULL), 0);
    ck_assert_uint_eq(verify_range(fd, cache, 0, 3), 3 * CHAIN);
    case_end(&d, FDS(fd), MAPS(MAPPED(a)));
}
END_TEST

/* A load that runs out of host slots halfway waits for the writes that
 * hold them: chains 0-3 on disk only, then chains 16-19 saved with the
 * disk stopped, their writes holding every host slot.  A load of chains
 * 16-19 and 0-3 copies the first 64 blocks from host memory, then finds
 * no slot to read the rest into: it waits (no reply while the disk is
 * stopped) rather than answer EBUSY.  With the disk back every block
 * loads byte for byte; with expire (--disk-wait-ms 300) the disk stays
 * stopped, and the load is answered EBUSY for the 64 it could not read,
 * saying how long it waited. */
static void load_behind_stopped_writes(int expire)
{
    const char *wait_300[] = {"--disk-wait-ms", "300", NULL};
    const int chains[8] = {16, 17, 18, 19, 0, 1, 2, 3};
    kvdt_daemon_t d;
    Kvdock__Response *r;
    pool_view_t a, b;
    uint64_t cache;
    uint32_t disk_hits;
    pid_t tids[64];
    int fd, nt;

    world_make();
    if (expire)
        start_with(&d, "256M", wait_300);
    else
        start(&d);
    fd = kvdt_client(&d, "loader");
    cache = cache_id(fd, 0);
    save_chains(fd, cache, 8, &a); /* all on disk; chains 4-7 in host memory too */
    nt = disk_stop(d.pid, tids, 64);
    for (int c = 16; c < 20; c++) { /* they take every host slot, written never */
        r = save_chain(fd, cache, &a, c, 980 + (uint64_t)c);
        ck_assert_msg(saved_whole(r), "save of chain %d: %u %s", c, r->status, r->message);
        kvdock__response__free_unpacked(r, NULL);
    }
    for (int c = 0; c < 4; c++) {
        ck_assert_uint_eq(lookup(fd, cache, c, &disk_hits), CHAIN);
        ck_assert_uint_eq(disk_hits, CHAIN);
    }
    pool_open(fd, "dst", 8 * CHAIN, &b);
    memset(b.map, 0xA5, b.len); /* poisoned */
    chains_load_send(fd, cache, &b, chains, 8, 0, 0, 0, 990);
    if (expire) {
        r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
        disk_resume(tids, nt);
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(r->status == KVD_EBUSY &&
                          strstr(r->message, "keys[64-127] (64 of 128) could not be brought") &&
                          strstr(r->message, "waited 300 ms (--disk-wait-ms)"),
                      "a load past its wait: %u %s", r->status, r->message);
        kvdock__response__free_unpacked(r, NULL);
        ck_assert_uint_eq(verify_range(fd, cache, 0, 4), 4 * CHAIN); /* nothing lost */
    } else {
        if (poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, (int)KVT_MS(500)) != 0) {
            r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
            disk_resume(tids, nt);
            ck_abort_msg("a load answered while the writes it waits for were stopped: %u %s",
                         r ? r->status : 0, r ? r->message : "(nothing)");
        }
        disk_resume(tids, nt);
        r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(r->status == 0, "the load, once the disk came back: %u %s", r->status,
                      r->message);
        ck_assert_uint_eq(r->op->rows, 8 * CHAIN);
        kvdock__response__free_unpacked(r, NULL);
        for (int i = 0; i < 8 * CHAIN; i++)
            ck_assert_msg(page_is(&b, (uint64_t)i, chains[i / CHAIN], i % CHAIN),
                          "page %d (chain %d block %d): other bytes", i, chains[i / CHAIN],
                          i % CHAIN);
    }
    case_end(&d, FDS(fd), MAPS(MAPPED(a), MAPPED(b)));
}

START_TEST(test_load_waits_for_writes)
{
    load_behind_stopped_writes(0);
}
END_TEST

START_TEST(test_load_wait_expires)
{
    load_behind_stopped_writes(1);
}
END_TEST

/* Saves sent all at once outrun the disk writer (the host level holds 4
 * of the 32 chains, and every block it holds is being written): each
 * waits until the writes before it have freed its host slots, and every
 * one stores its whole chain, none refused.  A client that leaves while
 * its saves wait leaves nothing half there, and the daemon ends clean. */
START_TEST(test_saves_wait_for_writer)
{
    kvdt_daemon_t d;
    Kvdock__Response *r;
    pool_view_t a, q;
    uint64_t cache;
    uint8_t answered[CHAINS] = {0};
    int fd, quitter;

    fd = blocks_world(&d, CHAINS, &cache, &a);
    quitter = kvdt_client(&d, "quitter");
    pool_open(quitter, "quit", CHAIN, &q);
    for (int i = 0; i < CHAIN; i++)
        fill_page(&q, (uint64_t)i, 40, i);
    for (int c = 0; c < CHAINS; c++)
        save_send(fd, cache, &a, c, 300 + (uint64_t)c);
    for (int c = 40; c < 48; c++) /* behind them, each from the same pages */
        save_send_at(quitter, cache, &q, c, 0, 400 + (uint64_t)c);
    munmap(q.map, q.len);
    close(quitter); /* while its saves wait */
    for (int n = 0; n < CHAINS; n++) {
        uint64_t id;
        r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
        ck_assert_ptr_nonnull(r);
        id = r->id;
        ck_assert_msg(id >= 300 && id < 300 + CHAINS && !answered[id - 300], "reply %" PRIu64,
                      id);
        answered[id - 300] = 1;
        ck_assert_msg(r->status == 0, "save of chain %d: %u %s", (int)(id - 300), r->status,
                      r->message);
        ck_assert_msg(r->op->refused == 0 && r->op->stored == CHAIN, "save of chain %d: %u "
                      "stored, %u refused", (int)(id - 300), r->op->stored, r->op->refused);
        kvdock__response__free_unpacked(r, NULL);
    }
    ck_assert_uint_eq(verify_all(fd, cache), NBLK); /* every block, its exact bytes */
    /* the quitter's chains: whatever a lookup reports loads whole (the
     * pattern of chain 40 under each key: a partial check is enough) */
    for (int c = 40; c < 48; c++) {
        uint32_t h = lookup(fd, cache, c, NULL);
        ck_assert_msg(h == 0 || h == CHAIN, "chain %d: %u blocks half there", c, h);
    }
    case_end(&d, FDS(fd), MAPS(MAPPED(a)));
}
END_TEST

/* A reopened cache asked for with other budgets (open_existing): it opens
 * as it is, with the budgets it was made with, which the reply gives; a
 * smaller disk budget asked for drops none of its blocks, a larger one
 * takes no more of the daemon's, and none is written to its manifest:
 * the next restart brings back the same. */
START_TEST(test_reopen_other_budgets)
{
    kvdt_daemon_t d;
    Kvdock__Response *r;
    pool_view_t a;
    uint64_t cache;
    const uint64_t asked[][2] = {
        {BLOCKS_HOST, 2 * MB},           /* a smaller disk budget */
        {BLOCKS_HOST / 2, 4 * BLOCKS_DISK}, /* a larger one (past --disk-budget too) */
        {BLOCKS_HOST, 0},                /* no disk level */
    };
    int fd;

    fd = blocks_world(&d, 8, &cache, &a);
    for (int c = 0; c < 8; c++) { /* twice the host level: half on disk only */
        r = save_chain(fd, cache, &a, c, 700 + (uint64_t)c);
        ck_assert_msg(saved_whole(r), "save of chain %d: %u %s", c, r->status, r->message);
        kvdock__response__free_unpacked(r, NULL);
    }
    munmap(a.map, a.len);
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);

    for (int round = 0;; round++) { /* two restarts */
        start(&d);
        ck_assert(kvdt_log_has(&d, "caches=1"));
        fd = kvdt_client(&d, "reader");
        for (size_t k = 0; k < sizeof(asked) / sizeof(asked[0]); k++) {
            r = blocks_create_with(fd, 1, asked[k][0], asked[k][1]);
            ck_assert_msg(r->status == 0, "open_existing asking %" PRIu64 " / %" PRIu64
                          ": %u %s", asked[k][0], asked[k][1], r->status, r->message);
            ck_assert_uint_eq(r->cache->budget_bytes, BLOCKS_HOST);
            ck_assert_ptr_nonnull(r->cache->disk);
            ck_assert_uint_eq(r->cache->disk->budget_bytes, BLOCKS_DISK);
            cache = r->cache->id;
            kvdock__response__free_unpacked(r, NULL);
        }
        /* nothing dropped: all 128 blocks back, each whole */
        ck_assert_uint_eq(verify_range(fd, cache, 0, 8), 8 * CHAIN);
        if (round == 1)
            break;
        close(fd);
        ck_assert_int_eq(kvdt_stop(&d), 0);
    }
    case_end(&d, FDS(fd), NULL);
}
END_TEST

static Suite *restart_suite(void)
{
    Suite *s = suite_create("disk_restart");
    /* cases by what they need (CK_RUN_CASE runs one: valgrind_daemon.sh
     * splits the suite so) */
    const struct {
        const char *name;
        const TTest *tests[10];
    } cases[] = {
        {"restart", {test_restart_sigterm, test_restart_sigkill, test_restart_smaller_budget,
                     test_blocks_after_sigterm, test_blocks_after_sigkill, test_disk_full}},
        {"damaged", {test_flipped_after_sigterm, test_flipped_after_sigkill,
                     test_truncated_after_sigterm, test_truncated_after_sigkill}},
        {"busy", {test_load_busy, test_saves_wait_for_writer, test_reopen_other_budgets,
                  test_load_slab_refused}},
        {"streams", {test_load_streams, test_load_streams_beside_saves, test_save_streams}},
        {"wait", {test_wait_expires, test_load_waits_for_writes, test_load_wait_expires}},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        TCase *tc = tcase_create(cases[i].name);

        tcase_set_timeout(tc, KVT_MS(120000) / 1000.0);
        for (size_t k = 0; k < 10 && cases[i].tests[k] != NULL; k++)
            tcase_add_test(tc, cases[i].tests[k]);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(restart_suite());
    int failed;

    signal(SIGPIPE, SIG_IGN);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
