/*
 * The cache tier end to end (libkvdock against the real kvdockd, cpu
 * backend): every rule of the cache tier as a test.  Blocks are named by
 * chained hashes of random token ids (kvd_block_hashes), the way engines
 * name them; every block's bytes derive from its key, so whichever client
 * saved a block, anyone can check what a load brings back.
 *
 * - create, open, list, stats, drop; names, layouts and budgets refused
 * - save, lookup, load round trips, dedup, a chain continued by its parent
 * - a load's layer flags: set per group once it has landed
 * - bad input: each refusal's exact status, and nothing changed by it
 * - two clients saving one chain at once: stored once, both succeed; a
 *   lookup never reports a block whose bytes are not complete
 * - pressure: every chain's present blocks stay a prefix, within budget
 * - leases: never evicted; expiry, release, disconnect and a load end
 *   them; with every block held a save is refused and nothing changes
 * - a client killed during saves, loads and leases leaves nothing behind
 * - users: private caches invisible, restricted ones refuse (as nobody)
 * - the host-memory budget counts the cache, and has it all back
 */
#include "testutil.h"

#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define LAYERS 2
#define TPB 4            /* tokens per block */
#define TOKEN_BYTES 32
#define BLOCK_BYTES (LAYERS * 2 * TPB * TOKEN_BYTES) /* 512 */
#define KEY 32           /* KVD_BLOCK_HASH_BYTES */
#define NOBODY 65534u
#define NOGROUP 65534u

/* ---- chains and block bytes ------------------------------------------------ */

/* A chain of n keys from random tokens; its first share blocks equal those
 * of base (when given). */
typedef struct chain {
    uint32_t n;
    int64_t tokens[256 * TPB];
    uint8_t keys[256][KEY];
} chain_t;

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void chain_make(chain_t *c, uint32_t n, const chain_t *base, uint32_t share, uint64_t *rng)
{
    size_t count = 0;

    ck_assert_uint_le(n, 256);
    c->n = n;
    for (uint32_t i = 0; i < n * TPB; i++)
        c->tokens[i] = base != NULL && i < share * TPB ? base->tokens[i]
                                                       : (int64_t)(rng_next(rng) % 50000);
    ck_assert_int_eq(kvd_block_hashes(c->tokens, (size_t)n * TPB, TPB, "m", 1, &c->keys[0][0],
                                      256, &count),
                     KVD_OK);
    ck_assert_uint_eq(count, n);
}

/* keys [from, from + n) of c */
static kvd_cache_keys_t keys_of(const chain_t *c, uint32_t from, uint32_t n)
{
    kvd_cache_keys_t k;

    memset(&k, 0, sizeof(k));
    k.blob = c->keys[from];
    k.key_size = KEY;
    k.count = n;
    return k;
}

static void page_poison(const kvt_pool_t *p, uint32_t pg)
{
    for (uint32_t l = 0; l < LAYERS; l++)
        for (int v = 0; v < 2; v++)
            memset(kvt_page(p, pg, l, v), 0xA5, TPB * TOKEN_BYTES);
}

/* A host pool of pages of the cache's layout. */
static void pool_make(kvd_client_t *cli, kvt_pool_t *p, uint32_t pages)
{
    kvt_pool_make(cli, p, "cpool", LAYERS, (uint64_t)pages * TPB, TOKEN_BYTES, false, TPB);
}

static uint64_t cache_make(kvd_client_t *cli, const char *name, uint32_t blocks, bool shared,
                           kvd_cache_info_t *out)
{
    kvd_cache_spec_t s = kvt_cache_spec(name, LAYERS, TPB, TOKEN_BYTES, (uint64_t)blocks * BLOCK_BYTES);
    kvd_cache_info_t info;

    s.shared = shared;
    KVT_OK(cli, kvd_cache_create(cli, &s, &info));
    ck_assert_uint_eq(info.block_bytes, BLOCK_BYTES);
    ck_assert_uint_eq(info.capacity, blocks);
    if (out != NULL)
        *out = info;
    return info.id;
}

/* Save keys [from, from + n) of c from pages [page0, page0 + n), each page
 * filled with its key's block first. */
static kvd_status_t save(kvd_client_t *cli, uint64_t cache, const kvt_pool_t *p, const chain_t *c,
                         uint32_t from, uint32_t n, uint32_t page0, kvd_op_result_t *res)
{
    int64_t pages[256];
    kvd_cache_save_t a;

    memset(&a, 0, sizeof(a));
    for (uint32_t i = 0; i < n; i++) {
        pages[i] = page0 + i;
        kvt_page_fill(p, page0 + i, c->keys[from + i]);
    }
    a.cache = cache;
    a.pool = p->info.id;
    a.keys = keys_of(c, from, n);
    a.blocks.values = pages;
    a.blocks.count = n;
    if (from > 0) {
        a.parent = c->keys[from - 1];
        a.parent_len = KEY;
    }
    return kvd_cache_save(cli, &a, NULL, res);
}

static kvd_status_t load(kvd_client_t *cli, uint64_t cache, const kvt_pool_t *p,
                         const chain_t *c, uint32_t from, uint32_t n, uint32_t page0)
{
    int64_t pages[256];
    kvd_cache_load_t a;

    memset(&a, 0, sizeof(a));
    for (uint32_t i = 0; i < n; i++)
        pages[i] = page0 + i;
    a.cache = cache;
    a.pool = p->info.id;
    a.keys = keys_of(c, from, n);
    a.blocks.values = pages;
    a.blocks.count = n;
    return kvd_cache_load(cli, &a, NULL, NULL);
}

static uint32_t hits(kvd_client_t *cli, uint64_t cache, const chain_t *c, uint32_t from,
                     uint32_t n)
{
    kvd_cache_keys_t k = keys_of(c, from, n);
    kvd_cache_lookup_result_t r;

    KVT_OK(cli, kvd_cache_lookup(cli, cache, &k, false, 0, &r));
    ck_assert_uint_eq(r.lease, 0);
    return r.hits;
}

/* Load the first n blocks of c into pages [page0, ...) and check them. */
static void load_check(kvd_client_t *cli, uint64_t cache, const kvt_pool_t *p, const chain_t *c,
                       uint32_t n, uint32_t page0)
{
    for (uint32_t i = 0; i < n; i++)
        page_poison(p, page0 + i);
    KVT_OK(cli, load(cli, cache, p, c, 0, n, page0));
    for (uint32_t i = 0; i < n; i++)
        ck_assert_msg(kvt_page_holds(p, page0 + i, c->keys[i]), "block %u came back wrong", i);
}

static kvd_cache_info_t stats(kvd_client_t *cli, uint64_t cache)
{
    kvd_cache_info_t s;

    KVT_OK(cli, kvd_cache_stats(cli, cache, NULL, &s));
    return s;
}

/* The daemon's host memory of kind ("cache"). */
static uint64_t host_used(kvd_client_t *cli, const char *kind)
{
    kvd_daemon_status_t s;

    KVT_OK(cli, kvd_daemon_status(cli, &s, NULL, 0));
    for (uint32_t i = 0; i < s.num_host_kinds; i++)
        if (strcmp(s.host_kinds[i].kind, kind) == 0)
            return s.host_kinds[i].used;
    ck_abort_msg("no host memory kind %s", kind);
    return 0;
}

/* What the cache tier holds: its blocks and its index. */
static uint64_t cache_used(kvd_client_t *cli)
{
    return host_used(cli, "cache") + host_used(cli, "cache-index");
}

/* Poll the cache's leases until they are n (the daemon handles a closed
 * connection, and the lease sweep, on its own time). */
static void wait_leases(kvd_client_t *cli, uint64_t cache, uint32_t n)
{
    int64_t end = kvt_now_ms() + KVT_MS(5000);

    while (stats(cli, cache).leases != n && kvt_now_ms() < end)
        usleep(10000);
    ck_assert_uint_eq(stats(cli, cache).leases, n);
}

/* ---- create, open, list, drop ------------------------------------------------ */

START_TEST(test_create_and_manage)
{
    kvd_client_t *cli = kvt_connect("cache-manage");
    kvd_cache_spec_t s;
    kvd_cache_info_t info, again, list[8];
    size_t n = 0;
    uint64_t id = cache_make(cli, "manage", 64, false, &info);

    ck_assert_str_eq(info.name, "manage");
    ck_assert_uint_eq(info.layout.num_layers, LAYERS);
    ck_assert(!info.layout.mla);
    ck_assert_uint_eq(info.layout.tokens_per_block, TPB);
    ck_assert_uint_eq(info.layout.token_bytes, TOKEN_BYTES);
    ck_assert_str_eq(info.layout.dtype, "bf16");
    ck_assert_uint_eq(info.budget_bytes, 64 * BLOCK_BYTES);
    ck_assert_uint_eq(info.blocks, 0);
    ck_assert_uint_eq(info.owner_uid, getuid());
    ck_assert(!info.shared);
    memset(&s, 0, sizeof(s));
    s.name = "manage";
    s.layout = info.layout;
    s.budget_bytes = 64 * BLOCK_BYTES;
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_EEXIST);
    s.open_existing = true;
    KVT_OK(cli, kvd_cache_create(cli, &s, &again));
    ck_assert_uint_eq(again.id, id);
    ck_assert(!again.cluster);
    s.cluster = true; /* this daemon is in no cluster: refused, found or new */
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_EINVAL);
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(cli), "--cluster-listen"));
    s.cluster = false;
    s.layout.tokens_per_block = 8;
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_ESHAPE);
    s.layout = info.layout;
    snprintf(s.layout.dtype, sizeof(s.layout.dtype), "fp8_e4m3");
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_ESHAPE);
    /* refused outright */
    s.layout = info.layout;
    s.open_existing = false;
    s.name = "bad name";
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_EINVAL);
    s.name = "";
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_EINVAL);
    s.name = "other";
    s.budget_bytes = 3ull << 30; /* the suite's daemon has a 2 GiB budget */
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(cli), "host-memory"));
    s.budget_bytes = BLOCK_BYTES - 1;
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_ERANGE);
    s.budget_bytes = 0;
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_EINVAL);
    s.budget_bytes = 64 * BLOCK_BYTES;
    s.layout.num_layers = 0;
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_EINVAL);
    s.layout = info.layout;
    s.layout.token_bytes = 0;
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_EINVAL);
    s.layout = info.layout;
    s.allow_uids = (const uint32_t[]){1};
    s.num_allow_uids = 1; /* a private cache allows no one */
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_EINVAL);
    /* list, stats by name, drop by name */
    KVT_OK(cli, kvd_cache_list(cli, list, 8, &n));
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(list[0].id, id);
    KVT_OK(cli, kvd_cache_stats(cli, 0, "manage", &again));
    ck_assert_uint_eq(again.id, id);
    KVT_ERR(cli, kvd_cache_stats(cli, 0, "nope", &again), KVD_ENOENT);
    KVT_ERR(cli, kvd_cache_stats(cli, 0, NULL, &again), KVD_EINVAL);
    KVT_OK(cli, kvd_cache_drop(cli, 0, "manage"));
    KVT_ERR(cli, kvd_cache_stats(cli, id, NULL, &again), KVD_ENOENT);
    KVT_ERR(cli, kvd_cache_drop(cli, id, NULL), KVD_ENOENT);
    KVT_OK(cli, kvd_cache_list(cli, list, 8, &n));
    ck_assert_uint_eq(n, 0);
    kvd_client_destroy(&cli);
}
END_TEST

START_TEST(test_limits)
{
    /* max-caches and max-leases */
    const char *extra[] = {"--max-caches", "2", "--max-leases", "3", NULL};
    kvt_daemon_t d;
    kvd_client_t *cli = NULL;
    kvd_cache_spec_t s;
    kvt_pool_t p;
    chain_t c;
    uint64_t rng = 7, id;
    kvd_cache_lookup_result_t r;
    kvd_cache_keys_t k;

    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    KVT_OK(NULL, kvd_client_create(d.socket, "limits", &cli));
    id = cache_make(cli, "one", 16, false, NULL);
    cache_make(cli, "two", 16, false, NULL);
    memset(&s, 0, sizeof(s));
    s.name = "three";
    s.layout = stats(cli, id).layout;
    s.budget_bytes = 16 * BLOCK_BYTES;
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(cli), "max-caches"));
    pool_make(cli, &p, 8);
    chain_make(&c, 4, NULL, 0, &rng);
    KVT_OK(cli, save(cli, id, &p, &c, 0, 4, 0, NULL));
    k = keys_of(&c, 0, 4);
    for (int i = 0; i < 3; i++)
        KVT_OK(cli, kvd_cache_lookup(cli, id, &k, true, 0, &r));
    KVT_ERR(cli, kvd_cache_lookup(cli, id, &k, true, 0, &r), KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(cli), "max-leases"));
    KVT_OK(cli, kvd_cache_lookup(cli, id, &k, false, 0, &r)); /* without a lease: fine */
    ck_assert_uint_eq(r.hits, 4);
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

/*
 * The disk level through the C API (issue 42): a daemon without --cache-dir
 * refuses a disk budget (ENOTSUP, naming --cache-dir) and shows no disk
 * level anywhere (status, cache info, a lookup's disk_hits); one with
 * --cache-dir shows its directory, budget and I/O engine in the status,
 * refuses a disk budget past its --disk-budget (ELIMIT), and a cache made
 * there with a disk level shows it: its budget and directory, the blocks
 * written through to disk, and a lookup of blocks on disk only counts them
 * in disk_hits.
 */
START_TEST(test_disk_level_fields)
{
    char top[64], dir[64];
    kvd_client_t *cli = kvt_connect("cache-disk");
    kvd_daemon_status_t *st = calloc(1, sizeof(*st));
    kvd_cache_info_t info, again;
    kvd_cache_spec_t s;
    kvd_cache_lookup_result_t r;
    kvd_cache_keys_t k;
    kvt_pool_t p;
    chain_t *c = calloc(4, sizeof(*c));
    uint64_t rng = 42, id;
    kvt_daemon_t d;

    ck_assert_ptr_nonnull(st);
    ck_assert_ptr_nonnull(c);
    id = cache_make(cli, "nodisk", 16, false, &info);
    ck_assert(!info.disk.enabled);
    ck_assert_uint_eq(info.disk.budget_bytes, 0);
    ck_assert_str_eq(info.disk.path, "");
    memset(&s, 0, sizeof(s));
    s.name = "withdisk";
    s.layout = info.layout;
    s.budget_bytes = 16 * BLOCK_BYTES;
    s.disk_budget_bytes = 1 << 20;
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_ENOTSUP);
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(cli), "--cache-dir"));
    KVT_OK(cli, kvd_daemon_status(cli, st, NULL, 0));
    ck_assert(!st->disk.enabled);
    ck_assert_str_eq(st->disk.cache_dir, "");
    /* every hit of a cache without a disk level is in host memory */
    pool_make(cli, &p, 8);
    chain_make(c, 4, NULL, 0, &rng);
    KVT_OK(cli, save(cli, id, &p, c, 0, 4, 0, NULL));
    k = keys_of(c, 0, 4);
    KVT_OK(cli, kvd_cache_lookup(cli, id, &k, false, 0, &r));
    ck_assert_uint_eq(r.hits, 4);
    ck_assert_uint_eq(r.local_hits, 4);
    ck_assert_uint_eq(r.disk_hits, 0);
    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, id, NULL));
    kvd_client_destroy(&cli);

    /* on the machine's disk (not a tmpfs /tmp) */
    kvt_disk_daemon_start(&d, top, dir, "64m");
    KVT_OK(NULL, kvd_client_create(d.socket, "cache-disk-dir", &cli));
    KVT_OK(cli, kvd_daemon_status(cli, st, NULL, 0));
    ck_assert(st->disk.enabled);
    ck_assert_str_eq(st->disk.cache_dir, dir);
    ck_assert_uint_eq(st->disk.budget_bytes, 64u << 20);
    ck_assert_uint_eq(st->disk.reserved_bytes, 0);
    ck_assert_uint_eq(st->disk.used_bytes, 0);
    ck_assert_uint_gt(st->disk.fs_free_bytes, 0);
    ck_assert_msg(strcmp(st->disk.io_engine, "io_uring") == 0 ||
                      strncmp(st->disk.io_engine, "threads (", 9) == 0,
                  "io_engine '%s'", st->disk.io_engine);
    s.disk_budget_bytes = (64u << 20) + 1; /* past --disk-budget */
    KVT_ERR(cli, kvd_cache_create(cli, &s, NULL), KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(cli), "--disk-budget"));
    /* a cache with a disk level: its info says so, blocks written there are
     * counted, and a lookup of blocks on disk only says how many */
    s.budget_bytes = 8 * BLOCK_BYTES;
    s.disk_budget_bytes = 1 << 20;
    KVT_OK(cli, kvd_cache_create(cli, &s, &info));
    ck_assert(info.disk.enabled);
    ck_assert_uint_eq(info.disk.budget_bytes, 1 << 20);
    ck_assert_uint_eq(info.disk.blocks, 0);
    ck_assert_ptr_nonnull(strstr(info.disk.path, dir));
    KVT_OK(cli, kvd_daemon_status(cli, st, NULL, 0));
    ck_assert_uint_eq(st->disk.reserved_bytes, 1 << 20);
    pool_make(cli, &p, 8);
    for (uint32_t ch = 0; ch < 4; ch++) { /* 4 chains of 4: twice the host budget */
        chain_make(c + ch, 4, NULL, 0, &rng);
        for (int64_t t0 = kvt_now_ms();;) { /* the disk may be behind: EBUSY */
            kvd_status_t sv = save(cli, info.id, &p, c + ch, 0, 4, 0, NULL);
            if (sv == KVD_OK)
                break;
            ck_assert_msg(sv == KVD_EBUSY && kvt_now_ms() - t0 < 20000, "save: %s: %s",
                          kvd_err_name(sv), kvd_client_last_error(cli));
            usleep(1000);
        }
    }
    for (int64_t t0 = kvt_now_ms();; usleep(2000)) { /* written through, in the background */
        KVT_OK(cli, kvd_cache_stats(cli, info.id, NULL, &again));
        if (again.disk.blocks == 16 || kvt_now_ms() - t0 > 20000)
            break;
    }
    ck_assert(again.disk.enabled);
    ck_assert_uint_eq(again.disk.blocks, 16);
    ck_assert_uint_le(again.blocks, 8);
    ck_assert_uint_eq(again.disk.spills, 16 - again.blocks); /* host copies dropped */
    ck_assert_uint_gt(again.disk.used_bytes, 16 * BLOCK_BYTES - 1);
    ck_assert_uint_gt(again.disk.write_bytes, 0);
    ck_assert_uint_gt(again.disk.writes, 0);
    ck_assert_uint_eq(again.disk.checksum_failures, 0);
    ck_assert_uint_eq(again.disk.io_errors, 0);
    ck_assert_uint_le(again.blocks, 8);
    k = keys_of(c, 0, 4); /* the oldest chain: out of host memory, on disk */
    KVT_OK(cli, kvd_cache_lookup(cli, info.id, &k, false, 0, &r));
    ck_assert_uint_eq(r.hits, 4);
    ck_assert_uint_eq(r.local_hits, 4);
    ck_assert_uint_eq(r.disk_hits, 4);
    KVT_OK(cli, kvd_cache_stats(cli, info.id, NULL, &again));
    ck_assert_uint_ge(again.disk.hits, 4);
    KVT_OK(cli, kvd_daemon_status(cli, st, NULL, 0));
    ck_assert_uint_gt(st->disk.used_bytes, 0);
    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, info.id, NULL));
    kvd_client_destroy(&cli);
    kvt_disk_daemon_stop(&d, top);
    free(c);
    free(st);
}
END_TEST

/* Save keys [0, n) of c, sent again while the disk is behind (EBUSY),
 * then wait until the disk level holds disk_blocks records. */
static void save_written(kvd_client_t *cli, uint64_t cache, const kvt_pool_t *p, const chain_t *c,
                         uint32_t n, uint32_t disk_blocks)
{
    kvd_cache_info_t s;

    for (int64_t t0 = kvt_now_ms();; usleep(1000)) {
        kvd_status_t sv = save(cli, cache, p, c, 0, n, 0, NULL);
        if (sv == KVD_OK)
            break;
        ck_assert_msg(sv == KVD_EBUSY && kvt_now_ms() - t0 < KVT_MS(20000), "save: %s: %s",
                      kvd_err_name(sv), kvd_client_last_error(cli));
    }
    for (int64_t t0 = kvt_now_ms();; usleep(2000)) { /* written through, in the background */
        KVT_OK(cli, kvd_cache_stats(cli, cache, NULL, &s));
        if (s.disk.blocks == disk_blocks || kvt_now_ms() - t0 > KVT_MS(20000))
            break;
    }
    ck_assert_uint_eq(s.disk.blocks, disk_blocks);
}

/* Of keys [0, n) of c, how many a lookup finds on disk only (all n must
 * be found); with lease, a lease on them taken (*lease). */
static uint32_t disk_hits(kvd_client_t *cli, uint64_t cache, const chain_t *c, uint32_t n,
                          uint64_t *lease)
{
    kvd_cache_keys_t k = keys_of(c, 0, n);
    kvd_cache_lookup_result_t r;

    KVT_OK(cli, kvd_cache_lookup(cli, cache, &k, lease != NULL, 0, &r));
    ck_assert_uint_eq(r.hits, n);
    if (lease != NULL)
        *lease = r.lease;
    return r.disk_hits;
}

/*
 * A chain read back from disk lies in chain order (issue 43), its first
 * block the most recent, as a save or a lookup leaves a chain, whatever
 * order its reads and copies ended in: the load lets its blocks go as
 * each copy ends, and lists them again as one chain when it ends.  Shown
 * through the host list, which gives up host copies from its least
 * recently used end: a save after the load takes the host copies of the
 * chain's last blocks, and its first blocks stay in host memory (a lookup
 * of them counts no disk hit).  By keys, and by a lease.
 */
START_TEST(test_reload_in_chain_order)
{
    char top[64], dir[64];
    kvd_client_t *cli;
    kvd_cache_info_t info;
    kvd_cache_spec_t s;
    kvd_cache_load_t ld;
    kvt_pool_t p;
    chain_t *c = calloc(5, sizeof(*c));
    uint64_t rng = 43, lease = 0;
    int64_t pages[8];
    kvt_daemon_t d;

    ck_assert_ptr_nonnull(c);
    kvt_disk_daemon_start(&d, top, dir, "64m");
    KVT_OK(NULL, kvd_client_create(d.socket, "cache-reload", &cli));
    s = kvt_cache_spec("reload", LAYERS, TPB, TOKEN_BYTES, 8 * BLOCK_BYTES); /* 8 host slots */
    s.disk_budget_bytes = 1 << 20;
    KVT_OK(cli, kvd_cache_create(cli, &s, &info));
    ck_assert_uint_eq(info.capacity, 8);
    pool_make(cli, &p, 16);
    for (uint32_t ch = 0; ch < 5; ch++)
        chain_make(c + ch, ch == 0 ? 8 : ch % 2 ? 8 : 4, NULL, 0, &rng);
    /* a on disk only: b's blocks took its host copies */
    save_written(cli, info.id, &p, &c[0], 8, 8);
    save_written(cli, info.id, &p, &c[1], 8, 16);
    ck_assert_uint_eq(disk_hits(cli, info.id, &c[0], 8, NULL), 8);
    /* read back into b's host slots: host memory holds a alone */
    load_check(cli, info.id, &p, &c[0], 8, 8);
    /* 4 host copies go: a's last 4, not its first */
    save_written(cli, info.id, &p, &c[2], 4, 20);
    ck_assert_uint_eq(disk_hits(cli, info.id, &c[0], 4, NULL), 0);
    ck_assert_uint_eq(disk_hits(cli, info.id, &c[0], 8, NULL), 4);

    /* again by a lease: a on disk only, leased, loaded by the lease */
    save_written(cli, info.id, &p, &c[3], 8, 28);
    ck_assert_uint_eq(disk_hits(cli, info.id, &c[0], 8, &lease), 8);
    ck_assert_uint_ne(lease, 0);
    memset(&ld, 0, sizeof(ld));
    for (uint32_t i = 0; i < 8; i++) {
        pages[i] = 8 + i;
        page_poison(&p, 8 + i);
    }
    ld.cache = info.id;
    ld.pool = p.info.id;
    ld.lease = lease;
    ld.blocks.values = pages;
    ld.blocks.count = 8;
    KVT_OK(cli, kvd_cache_load(cli, &ld, NULL, NULL));
    for (uint32_t i = 0; i < 8; i++)
        ck_assert_msg(kvt_page_holds(&p, 8 + i, c[0].keys[i]), "block %u came back wrong", i);
    ck_assert_uint_eq(stats(cli, info.id).leases, 0);
    save_written(cli, info.id, &p, &c[4], 4, 32);
    ck_assert_uint_eq(disk_hits(cli, info.id, &c[0], 4, NULL), 0);
    ck_assert_uint_eq(disk_hits(cli, info.id, &c[0], 8, NULL), 4);

    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, info.id, NULL));
    kvd_client_destroy(&cli);
    kvt_disk_daemon_stop(&d, top);
    free(c);
}
END_TEST

/* ---- save, lookup, load --------------------------------------------------------- */

START_TEST(test_save_lookup_load)
{
    kvd_client_t *cli = kvt_connect("cache-roundtrip");
    uint64_t rng = 1, id = cache_make(cli, "roundtrip", 64, false, NULL);
    kvd_cache_info_t st;
    kvd_op_result_t res;
    kvt_pool_t p;
    chain_t c, d;

    pool_make(cli, &p, 32);
    chain_make(&c, 12, NULL, 0, &rng);
    ck_assert_uint_eq(hits(cli, id, &c, 0, 12), 0);
    KVT_OK(cli, save(cli, id, &p, &c, 0, 8, 0, &res));
    ck_assert_uint_eq(res.stored, 8);
    ck_assert_uint_eq(res.skipped, 0);
    ck_assert_uint_eq(res.refused, 0);
    ck_assert_uint_eq(res.bytes, 8 * BLOCK_BYTES);
    ck_assert_uint_eq(hits(cli, id, &c, 0, 12), 8);
    ck_assert_uint_eq(hits(cli, id, &c, 1, 3), 3); /* any run of present keys */
    /* the same blocks again: skipped, nothing copied */
    KVT_OK(cli, save(cli, id, &p, &c, 0, 8, 0, &res));
    ck_assert_uint_eq(res.stored, 0);
    ck_assert_uint_eq(res.skipped, 8);
    ck_assert_uint_eq(res.bytes, 0);
    /* the chain goes on from its parent, key 7 */
    KVT_OK(cli, save(cli, id, &p, &c, 8, 4, 8, &res));
    ck_assert_uint_eq(res.stored, 4);
    ck_assert_uint_eq(hits(cli, id, &c, 0, 12), 12);
    load_check(cli, id, &p, &c, 12, 16);
    /* a chain sharing 5 blocks with c: those are skipped, the rest stored */
    chain_make(&d, 9, &c, 5, &rng);
    ck_assert_uint_eq(hits(cli, id, &d, 0, 9), 5);
    KVT_OK(cli, save(cli, id, &p, &d, 0, 9, 0, &res));
    ck_assert_uint_eq(res.stored, 4);
    ck_assert_uint_eq(res.skipped, 5);
    load_check(cli, id, &p, &d, 9, 16);
    st = stats(cli, id);
    ck_assert_uint_eq(st.blocks, 16);
    ck_assert_uint_eq(st.used_bytes, 16 * BLOCK_BYTES);
    ck_assert_uint_eq(st.saves, 4);
    ck_assert_uint_eq(st.stored, 16);
    ck_assert_uint_eq(st.skipped, 13);
    ck_assert_uint_eq(st.loads, 2);
    ck_assert_uint_eq(st.loaded, 21);
    ck_assert_uint_eq(st.bytes_in, 16 * BLOCK_BYTES);
    ck_assert_uint_eq(st.bytes_out, 21 * BLOCK_BYTES);
    ck_assert_uint_eq(st.lookups, 5);
    ck_assert_uint_eq(st.keys_asked, 12 + 3 + 12 + 12 + 9);
    ck_assert_uint_eq(st.keys_hit, 0 + 3 + 8 + 12 + 5);
    ck_assert_uint_ge(st.held_bytes, 16 * BLOCK_BYTES);
    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, id, NULL));
    kvd_client_destroy(&cli);
}
END_TEST

START_TEST(test_lookup_first_missing)
{
    /* a chain whose first key is missing is answered from that key, yet
     * counted whole; a chain the daemon would refuse is refused still */
    kvd_client_t *cli = kvt_connect("cache-firstmiss");
    uint64_t rng = 3, id = cache_make(cli, "firstmiss", 64, false, NULL);
    kvd_cache_lookup_result_t r;
    kvd_cache_keys_t k;
    kvd_cache_info_t st;
    kvd_op_result_t res;
    kvt_pool_t p;
    chain_t c;
    const void *list[3];
    size_t lens[3];
    uint8_t big[KVD_CACHE_KEY_MAX + 1];

    pool_make(cli, &p, 8);
    chain_make(&c, 200, NULL, 0, &rng);
    ck_assert_uint_eq(hits(cli, id, &c, 0, 200), 0);
    KVT_OK(cli, save(cli, id, &p, &c, 0, 8, 0, &res));
    ck_assert_uint_eq(hits(cli, id, &c, 0, 200), 8);
    ck_assert_uint_eq(hits(cli, id, &c, 100, 100), 0);
    k = keys_of(&c, 100, 100);
    KVT_OK(cli, kvd_cache_lookup(cli, id, &k, true, 0, &r));
    ck_assert_uint_eq(r.hits, 0);
    ck_assert_uint_eq(r.lease, 0);
    /* keys of another size: 9 keys of 33 bytes, none present */
    k = keys_of(&c, 100, 10);
    k.key_size = 33;
    k.count = 9;
    KVT_OK(cli, kvd_cache_lookup(cli, id, &k, false, 0, &r));
    ck_assert_uint_eq(r.hits, 0);
    /* a list whose first key is missing and whose third is too long */
    memset(big, 7, sizeof(big));
    list[0] = c.keys[150];
    list[1] = c.keys[151];
    list[2] = big;
    lens[0] = lens[1] = KEY;
    lens[2] = sizeof(big);
    memset(&k, 0, sizeof(k));
    k.keys = list;
    k.lens = lens;
    k.count = 3;
    KVT_ERR(cli, kvd_cache_lookup(cli, id, &k, false, 0, &r), KVD_EINVAL);
    lens[2] = KEY;
    list[2] = c.keys[0];
    KVT_OK(cli, kvd_cache_lookup(cli, id, &k, false, 0, &r));
    ck_assert_uint_eq(r.hits, 0);
    st = stats(cli, id);
    ck_assert_uint_eq(st.lookups, 6);
    ck_assert_uint_eq(st.keys_asked, 200 + 200 + 100 + 100 + 9 + 3);
    ck_assert_uint_eq(st.keys_hit, 8);
    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, id, NULL));
    kvd_client_destroy(&cli);
}
END_TEST

START_TEST(test_mla_and_key_forms)
{
    /* an MLA cache; keys as a list of varied lengths; a reply at enqueue */
    kvd_client_t *cli = kvt_connect("cache-mla");
    kvd_cache_spec_t s;
    kvd_cache_info_t info;
    kvt_pool_t p;
    const char *keys[3] = {"a", "bb-second-key", "the third key, a little longer"};
    size_t lens[3] = {1, 13, 30};
    int64_t pages[3] = {2, 0, 1}, back[3] = {5, 4, 3};
    kvd_cache_save_t sv;
    kvd_cache_load_t ld;
    kvd_sync_t sync;
    kvd_op_result_t res;

    memset(&s, 0, sizeof(s));
    s.name = "mla";
    s.layout.num_layers = 3;
    s.layout.mla = true;
    s.layout.tokens_per_block = 2;
    s.layout.token_bytes = 48;
    s.budget_bytes = 1 << 20;
    KVT_OK(cli, kvd_cache_create(cli, &s, &info));
    ck_assert_uint_eq(info.block_bytes, 3 * 2 * 48);
    kvt_pool_make(cli, &p, "mlapool", 3, 12, 48, true, 2);
    kvt_fill(p.map->base, p.info.bytes, 99);
    memset(&sv, 0, sizeof(sv));
    sv.cache = info.id;
    sv.pool = p.info.id;
    sv.keys.keys = (const void *const *)keys;
    sv.keys.lens = lens;
    sv.keys.count = 3;
    sv.blocks.values = pages;
    sv.blocks.count = 3;
    memset(&sync, 0, sizeof(sync));
    sync.reply_at_enqueue = true;
    KVT_OK(cli, kvd_cache_save(cli, &sv, &sync, &res));
    ck_assert(res.enqueued);
    /* visible once the bytes are in: a lookup says when */
    for (int64_t end = kvt_now_ms() + KVT_MS(5000); kvt_now_ms() < end;) {
        kvd_cache_lookup_result_t lr;
        KVT_OK(cli, kvd_cache_lookup(cli, info.id, &sv.keys, false, 0, &lr));
        if (lr.hits == 3)
            break;
        usleep(1000);
    }
    memset(&ld, 0, sizeof(ld));
    ld.cache = info.id;
    ld.pool = p.info.id;
    ld.keys = sv.keys;
    ld.blocks.values = back;
    ld.blocks.count = 3;
    KVT_OK(cli, kvd_cache_load(cli, &ld, NULL, &res));
    ck_assert_uint_eq(res.rows, 3);
    for (uint32_t l = 0; l < 3; l++)
        for (int i = 0; i < 3; i++) {
            uint8_t *base = (uint8_t *)p.map->base + l * p.info.layer_stride;
            ck_assert_mem_eq(base + back[i] * 2 * 48, base + pages[i] * 2 * 48, 2 * 48);
        }
    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, info.id, NULL));
    kvd_client_destroy(&cli);
}
END_TEST

START_TEST(test_layer_flags)
{
    /* a load sets each layer group's flag once the group has landed; bad
     * flag arguments are refused before anything moves */
    kvd_client_t *cli = kvt_connect("cache-flags");
    uint64_t rng = 29, id = cache_make(cli, "flags", 32, false, NULL), buf = 0;
    kvd_mapping_t *map = NULL;
    volatile uint32_t *flags;
    int64_t pages[4] = {4, 5, 6, 7};
    kvd_cache_load_t ld;
    kvt_pool_t p;
    chain_t c;

    pool_make(cli, &p, 8);
    chain_make(&c, 4, NULL, 0, &rng);
    KVT_OK(cli, save(cli, id, &p, &c, 0, 4, 0, NULL));
    KVT_OK(cli, kvd_buffer_register(cli, 64, KVD_MEM_HOST, "flags", &buf, &map));
    flags = map->base;
    memset(&ld, 0, sizeof(ld));
    ld.cache = id;
    ld.pool = p.info.id;
    ld.keys = keys_of(&c, 0, 4);
    ld.blocks.values = pages;
    ld.blocks.count = 4;
    ld.layer_flags.buffer = buf;
    ld.layer_flags.offset = 8;
    ld.layer_flags.bytes = LAYERS * 4; /* a group per layer */
    ld.flag_value = 7;
    for (int i = 0; i < 4; i++)
        page_poison(&p, 4 + i);
    KVT_OK(cli, kvd_cache_load(cli, &ld, NULL, NULL));
    for (int i = 0; i < 4; i++)
        ck_assert(kvt_page_holds(&p, 4 + i, c.keys[i]));
    ck_assert_uint_eq(flags[0], 0);
    ck_assert_uint_eq(flags[1], 0);
    ck_assert_uint_eq(flags[2], 7);
    ck_assert_uint_eq(flags[3], 7);
    ck_assert_uint_eq(flags[4], 0);
    ld.layer_flags.bytes = 4; /* one group of every layer */
    ld.flag_value = 9;
    KVT_OK(cli, kvd_cache_load(cli, &ld, NULL, NULL));
    ck_assert_uint_eq(flags[2], 9);
    ck_assert_uint_eq(flags[3], 7);
    /* refused, the flags and the pool as they were */
    ld.layer_flags.bytes = 6;
    KVT_ERR(cli, kvd_cache_load(cli, &ld, NULL, NULL), KVD_EINVAL);
    ld.layer_flags.bytes = (LAYERS + 1) * 4; /* more groups than layers */
    KVT_ERR(cli, kvd_cache_load(cli, &ld, NULL, NULL), KVD_EINVAL);
    ld.layer_flags.bytes = 4;
    ld.flag_value = 0;
    KVT_ERR(cli, kvd_cache_load(cli, &ld, NULL, NULL), KVD_EINVAL);
    ld.flag_value = 5;
    ld.layer_flags.offset = 2;
    KVT_ERR(cli, kvd_cache_load(cli, &ld, NULL, NULL), KVD_EALIGN);
    ld.layer_flags.offset = 64;
    KVT_ERR(cli, kvd_cache_load(cli, &ld, NULL, NULL), KVD_ERANGE);
    ld.layer_flags.offset = 8;
    ld.layer_flags.buffer = 999999;
    KVT_ERR(cli, kvd_cache_load(cli, &ld, NULL, NULL), KVD_ENOENT);
    ck_assert_uint_eq(flags[2], 9);
    ck_assert_uint_eq(stats(cli, id).loads, 2);
    kvd_mapping_destroy(&map);
    KVT_OK(cli, kvd_buffer_drop(cli, buf));
    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, id, NULL));
    kvd_client_destroy(&cli);
}
END_TEST

/* ---- bad input ---------------------------------------------------------------------- */

START_TEST(test_bad_input)
{
    kvd_client_t *cli = kvt_connect("cache-bad");
    uint64_t rng = 3, id = cache_make(cli, "bad", 32, false, NULL);
    kvd_cache_info_t before, after;
    kvt_pool_t p, other, paged8;
    chain_t c;
    int64_t pages[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    uint8_t big[KVD_CACHE_KEY_MAX + 1] = {0}, *snap;
    const void *kp[2];
    size_t kl[2];
    kvd_cache_save_t a;
    kvd_cache_load_t ld;
    kvd_cache_lookup_result_t lr;
    kvd_cache_keys_t k;

    pool_make(cli, &p, 8);
    kvt_pool_make(cli, &other, "other", LAYERS + 1, 8 * TPB, TOKEN_BYTES, false, TPB);
    kvt_pool_make(cli, &paged8, "paged8", LAYERS, 8 * 8, TOKEN_BYTES, false, 8);
    chain_make(&c, 8, NULL, 0, &rng);
    KVT_OK(cli, save(cli, id, &p, &c, 0, 4, 0, NULL));
    before = stats(cli, id);
#define SAVE_ARGS()                                                                                \
    do {                                                                                           \
        memset(&a, 0, sizeof(a));                                                                  \
        a.cache = id;                                                                              \
        a.pool = p.info.id;                                                                        \
        a.keys = keys_of(&c, 4, 4);                                                                \
        a.blocks.values = pages;                                                                   \
        a.blocks.count = 4;                                                                        \
        a.parent = c.keys[3];                                                                      \
        a.parent_len = KEY;                                                                        \
    } while (0)
    SAVE_ARGS();
    a.keys.count = 0;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_EINVAL); /* empty chain */
    SAVE_ARGS();
    kp[0] = big;
    kl[0] = sizeof(big);
    a.keys.keys = kp;
    a.keys.lens = kl;
    a.keys.blob = NULL;
    a.keys.count = 1;
    a.blocks.count = 1;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_EINVAL); /* a 65-byte key */
    kl[0] = 0;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_EINVAL); /* an empty key */
    SAVE_ARGS();
    kp[0] = kp[1] = c.keys[5];
    kl[0] = kl[1] = KEY;
    a.keys.keys = kp;
    a.keys.lens = kl;
    a.keys.blob = NULL;
    a.keys.count = 2;
    a.blocks.count = 2;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_EINVAL); /* a key twice */
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(cli), "repeats"));
    SAVE_ARGS();
    a.blocks.count = 3;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_ESHAPE); /* 3 pages, 4 keys */
    SAVE_ARGS();
    pages[2] = 8;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_ERANGE); /* past the pool */
    pages[2] = -1;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_EINVAL);
    pages[2] = 2;
    SAVE_ARGS();
    a.pool = other.info.id;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_ESHAPE); /* 3 layers */
    a.pool = paged8.info.id;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_ESHAPE); /* pages of 8 */
    a.pool = 999999;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_ENOENT);
    SAVE_ARGS();
    a.cache = 999999;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_ENOENT);
    SAVE_ARGS();
    a.parent = c.keys[6]; /* not in the cache */
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_ENOENT);
    a.parent = big;
    a.parent_len = sizeof(big);
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_EINVAL);
    SAVE_ARGS();
    a.keys.key_size = 0;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_EINVAL);
    a.keys.key_size = KVD_CACHE_KEY_MAX + 1;
    KVT_ERR(cli, kvd_cache_save(cli, &a, NULL, NULL), KVD_EINVAL);
    /* loads: a key not there is refused before anything moves */
    snap = kvt_snapshot(&p);
    memset(&ld, 0, sizeof(ld));
    ld.cache = id;
    ld.pool = p.info.id;
    ld.keys = keys_of(&c, 2, 3); /* keys 2, 3 there; 4 not */
    ld.blocks.values = pages;
    ld.blocks.count = 3;
    KVT_ERR(cli, kvd_cache_load(cli, &ld, NULL, NULL), KVD_ENOENT);
    ck_assert_str_eq(kvd_client_last_error(cli), "keys[2] is not in the cache");
    kvt_expect_bytes(p.map->base, snap, p.map->bytes, "the pool after a refused load");
    free(snap);
    ld.keys = keys_of(&c, 0, 2);
    ld.lease = 12345; /* keys and a lease */
    KVT_ERR(cli, kvd_cache_load(cli, &ld, NULL, NULL), KVD_EINVAL);
    ld.keys.count = 0;
    KVT_ERR(cli, kvd_cache_load(cli, &ld, NULL, NULL), KVD_ENOENT); /* no such lease */
    KVT_ERR(cli, kvd_cache_release(cli, 12345), KVD_ENOENT);
    ld.lease = 0;
    ld.keys = keys_of(&c, 0, 2);
    ld.blocks.count = 2;
    ld.layer_events = (const uint64_t[]){1};
    ld.num_layer_events = 1;
    KVT_ERR(cli, kvd_cache_load(cli, &ld, NULL, NULL), KVD_ENOENT); /* no event 1 */
    k = keys_of(&c, 0, 4);
    k.blob = NULL;
    KVT_ERR(cli, kvd_cache_lookup(cli, id, &k, false, 0, &lr), KVD_ENULL); /* local */
    k = keys_of(&c, 0, 4);
    KVT_ERR(cli, kvd_cache_lookup(cli, 999999, &k, false, 0, &lr), KVD_ENOENT);
    KVT_ERR(cli, kvd_cache_evict(cli, id, NULL, false, NULL), KVD_EINVAL); /* nothing named */
    KVT_ERR(cli, kvd_cache_evict(cli, id, &k, true, NULL), KVD_EINVAL);  /* keys and all */
    /* none of it changed anything */
    after = stats(cli, id);
    ck_assert_uint_eq(after.blocks, before.blocks);
    ck_assert_uint_eq(after.saves, before.saves);
    ck_assert_uint_eq(after.stored, before.stored);
    ck_assert_uint_eq(after.loads, before.loads);
    ck_assert_uint_eq(after.evictions, before.evictions);
    ck_assert_uint_eq(after.leases, 0);
    ck_assert_uint_eq(hits(cli, id, &c, 0, 8), 4);
    load_check(cli, id, &p, &c, 4, 4);
    kvt_pool_free(cli, &paged8);
    kvt_pool_free(cli, &other);
    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, id, NULL));
    kvd_client_destroy(&cli);
#undef SAVE_ARGS
}
END_TEST

/* ---- two clients at once ----------------------------------------------------------- */

typedef struct saver {
    kvd_client_t *cli;
    kvt_pool_t *pool;
    uint64_t cache;
    const chain_t *chain;
    pthread_barrier_t *go;
    kvd_status_t st;
    kvd_op_result_t res;
    /* probe: a lookup of the chain pipelined right behind the save on the
     * same connection; the daemon reads it after the save, so a reply to
     * it while the save's is still to come shows it ran during the save */
    bool probe;
    kvd_status_t probe_st;
    kvd_cache_lookup_result_t probe_res;
    bool save_done_at_probe;
} saver_t;

static void *saver_run(void *arg)
{
    saver_t *s = arg;
    int64_t pages[256];
    kvd_cache_save_t a;

    memset(&a, 0, sizeof(a));
    for (uint32_t i = 0; i < s->chain->n; i++)
        pages[i] = i;
    a.cache = s->cache;
    a.pool = s->pool->info.id;
    a.keys = keys_of(s->chain, 0, s->chain->n);
    a.blocks.values = pages;
    a.blocks.count = s->chain->n;
    pthread_barrier_wait(s->go);
    if (!s->probe) {
        s->st = kvd_cache_save(s->cli, &a, NULL, &s->res);
        return NULL;
    }
    {
        uint64_t save_req, lookup_req;

        s->st = kvd_cache_save_submit(s->cli, &a, NULL, &s->res, &save_req);
        if (s->st != KVD_OK)
            return NULL;
        s->probe_st = kvd_cache_lookup_submit(s->cli, s->cache, &a.keys, false, 0,
                                              &s->probe_res, &lookup_req);
        if (s->probe_st == KVD_OK)
            s->probe_st = kvd_client_wait(s->cli, lookup_req);
        if (s->probe_st == KVD_OK)
            s->probe_st = kvd_client_poll(s->cli, save_req, &s->save_done_at_probe);
        s->st = kvd_client_wait(s->cli, save_req);
    }
    return NULL;
}

START_TEST(test_concurrent_saves_dedup)
{
    /* rounds of two clients saving the same 200-block chain at the same
     * moment: each block stored once, both saves succeed; meanwhile a
     * third client looks the chain up and loads whatever it reports, which
     * must be whole; the first saver's own lookup, pipelined behind its
     * save, loads whole too, and in one round at least it is answered
     * while that save is in flight (so a lookup surely ran during a save:
     * a quick save may finish before the daemon reads the lookup, and a
     * slow daemon, as under valgrind, may run a save's copies before its
     * loop reads the lookup, so rounds go on, up to 20, until one has) */
    kvd_client_t *cli[3] = {kvt_connect("dedup-a"), kvt_connect("dedup-b"),
                            kvt_connect("dedup-c")};
    uint64_t rng = 11, id = cache_make(cli[0], "dedup", 4096, true, NULL);
    kvt_pool_t p[3];
    chain_t *c = malloc(sizeof(*c));
    pthread_barrier_t go;
    int during = 0; /* rounds whose pipelined lookup was answered before the save */

    for (int i = 0; i < 3; i++)
        pool_make(cli[i], &p[i], 256);
    pthread_barrier_init(&go, NULL, 3);
    for (int round = 0; round < 10 || (during == 0 && round < 20); round++) {
        saver_t s[2];
        pthread_t th[2];
        uint32_t seen = 0, h;

        chain_make(c, 200, NULL, 0, &rng);
        for (int i = 0; i < 2; i++) {
            s[i] = (saver_t){cli[i], &p[i], id, c, &go, KVD_OK, {0}, i == 0, KVD_OK, {0}, false};
            for (uint32_t b = 0; b < c->n; b++)
                kvt_page_fill(&p[i], b, c->keys[b]);
            ck_assert_int_eq(pthread_create(&th[i], NULL, saver_run, &s[i]), 0);
        }
        pthread_barrier_wait(&go);
        /* the third client: whatever a lookup reports must load whole */
        for (int tries = 0; tries < 20 && seen < c->n; tries++) {
            h = hits(cli[2], id, c, 0, c->n);
            if (h > 0) {
                load_check(cli[2], id, &p[2], c, h, 0);
                seen = h;
            }
        }
        for (int i = 0; i < 2; i++) {
            pthread_join(th[i], NULL);
            ck_assert_msg(s[i].st == KVD_OK, "save %d: %s: %s", i, kvd_err_name(s[i].st),
                          kvd_client_last_error(cli[i]));
        }
        ck_assert_msg(s[0].probe_st == KVD_OK, "the pipelined lookup: %s: %s",
                      kvd_err_name(s[0].probe_st), kvd_client_last_error(cli[0]));
        during += !s[0].save_done_at_probe;
        ck_assert_uint_le(s[0].probe_res.hits, c->n);
        if (s[0].probe_res.hits > 0)
            load_check(cli[2], id, &p[2], c, s[0].probe_res.hits, 0);
        ck_assert_uint_eq(s[0].res.stored + s[1].res.stored, c->n);
        ck_assert_uint_eq(s[0].res.skipped + s[1].res.skipped, c->n);
        ck_assert_uint_eq(s[0].res.refused + s[1].res.refused, 0);
        ck_assert_uint_eq(hits(cli[2], id, c, 0, c->n), c->n);
        load_check(cli[2], id, &p[2], c, c->n, 0);
        ck_assert_uint_eq(stats(cli[0], id).blocks, (round + 1) * 200);
    }
    ck_assert_msg(during > 0, "in none of 20 rounds was the lookup sent after a save answered "
                  "before it: no lookup is known to have run during a save");
    pthread_barrier_destroy(&go);
    for (int i = 0; i < 3; i++) {
        kvt_pool_free(cli[i], &p[i]);
        kvd_client_destroy(&cli[i]);
    }
    cli[0] = kvt_connect("dedup-end");
    KVT_OK(cli[0], kvd_cache_drop(cli[0], id, NULL));
    kvd_client_destroy(&cli[0]);
    free(c);
}
END_TEST

/* ---- pressure ------------------------------------------------------------------------ */

START_TEST(test_prefixes_under_pressure)
{
    /* a cache of 64 blocks filled ten times over with chains that share
     * prefixes at random: after every save, each chain's present blocks
     * are a prefix of it (no key present after an absent one), the cache
     * stays within its budget, and what is there loads whole */
    enum { CHAINS = 40, CAP = 64 };
    kvd_client_t *cli = kvt_connect("cache-pressure");
    uint64_t rng = 5, id = cache_make(cli, "pressure", CAP, false, NULL);
    chain_t *c = malloc(CHAINS * sizeof(*c));
    uint32_t saved = 0;
    kvt_pool_t p;

    pool_make(cli, &p, 64);
    for (int i = 0; i < CHAINS; i++) {
        int base = i > 0 && rng_next(&rng) % 3 ? (int)(rng_next(&rng) % i) : -1;
        uint32_t n = 4 + (uint32_t)(rng_next(&rng) % 21);
        uint32_t share = base >= 0 ? (uint32_t)(rng_next(&rng) % (c[base].n + 1)) : 0;
        kvd_op_result_t res;

        if (share > n)
            share = n;
        chain_make(&c[i], n, base >= 0 ? &c[base] : NULL, share, &rng);
        KVT_OK(cli, save(cli, id, &p, &c[i], 0, n, 0, &res));
        ck_assert_uint_eq(res.stored + res.skipped, n);
        ck_assert_uint_eq(res.refused, 0);
        saved += res.stored;
        for (int j = 0; j <= i; j++) {
            uint32_t h = hits(cli, id, &c[j], 0, c[j].n);
            for (uint32_t b = h; b < c[j].n; b++)
                ck_assert_msg(hits(cli, id, &c[j], b, 1) == 0,
                              "chain %d: block %u present after absent block %u", j, b, h);
        }
        kvd_cache_info_t st = stats(cli, id);
        ck_assert_uint_le(st.blocks, CAP);
        ck_assert_uint_le(st.used_bytes, st.budget_bytes);
    }
    ck_assert_uint_gt(saved, 8 * CAP); /* it did fill several times over */
    ck_assert_uint_gt(stats(cli, id).evictions, 7 * CAP);
    /* the last chain saved is whole */
    ck_assert_uint_eq(hits(cli, id, &c[CHAINS - 1], 0, c[CHAINS - 1].n), c[CHAINS - 1].n);
    load_check(cli, id, &p, &c[CHAINS - 1], c[CHAINS - 1].n, 30);
    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, id, NULL));
    kvd_client_destroy(&cli);
    free(c);
}
END_TEST

START_TEST(test_evict)
{
    /* by key: the block and every block after it, in every chain; held
     * blocks stay (busy); all */
    kvd_client_t *cli = kvt_connect("cache-evict");
    uint64_t rng = 9, id = cache_make(cli, "evict", 64, false, NULL);
    kvd_cache_evict_result_t ev;
    kvd_cache_lookup_result_t lr;
    kvd_cache_keys_t k;
    kvt_pool_t p;
    chain_t a, b;

    pool_make(cli, &p, 16);
    chain_make(&a, 8, NULL, 0, &rng);
    chain_make(&b, 8, &a, 3, &rng); /* shares a's first 3 */
    KVT_OK(cli, save(cli, id, &p, &a, 0, 8, 0, NULL));
    KVT_OK(cli, save(cli, id, &p, &b, 0, 8, 0, NULL));
    ck_assert_uint_eq(stats(cli, id).blocks, 13);
    k = keys_of(&a, 2, 1); /* the last shared block: both tails go */
    KVT_OK(cli, kvd_cache_evict(cli, id, &k, false, &ev));
    ck_assert_uint_eq(ev.evicted, 1 + 5 + 5);
    ck_assert_uint_eq(hits(cli, id, &a, 0, 8), 2);
    ck_assert_uint_eq(hits(cli, id, &b, 0, 8), 2);
    KVT_OK(cli, kvd_cache_evict(cli, id, &k, false, &ev));
    ck_assert_uint_eq(ev.missing, 1);
    KVT_OK(cli, save(cli, id, &p, &a, 0, 8, 0, NULL));
    k = keys_of(&a, 0, 8);
    KVT_OK(cli, kvd_cache_lookup(cli, id, &k, true, 0, &lr)); /* leased */
    k = keys_of(&a, 4, 1);
    KVT_OK(cli, kvd_cache_evict(cli, id, &k, false, &ev));
    ck_assert_uint_eq(ev.busy, 1);
    ck_assert_uint_eq(ev.evicted, 0);
    ck_assert_uint_eq(hits(cli, id, &a, 0, 8), 8);
    KVT_OK(cli, kvd_cache_evict(cli, id, NULL, true, &ev)); /* all: what is not held */
    ck_assert_uint_eq(ev.evicted, 0); /* b's two blocks are a's first two: all held */
    KVT_OK(cli, kvd_cache_release(cli, lr.lease));
    KVT_OK(cli, kvd_cache_evict(cli, id, NULL, true, &ev));
    ck_assert_uint_eq(ev.evicted, 8);
    ck_assert_uint_eq(stats(cli, id).blocks, 0);
    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, id, NULL));
    kvd_client_destroy(&cli);
}
END_TEST

/* ---- leases ---------------------------------------------------------------------- */

START_TEST(test_leases)
{
    kvd_client_t *cli = kvt_connect("cache-leases"), *other = kvt_connect("cache-leases-2");
    uint64_t rng = 13, id = cache_make(cli, "leases", 16, true, NULL);
    kvd_cache_lookup_result_t lr, lr2;
    kvd_cache_info_t before;
    kvd_cache_keys_t k;
    kvd_cache_load_t ld;
    kvd_op_result_t res;
    int64_t pages[8] = {8, 9, 10, 11, 12, 13, 14, 15};
    kvt_pool_t p;
    chain_t a, b, c;

    pool_make(cli, &p, 16);
    chain_make(&a, 8, NULL, 0, &rng);
    KVT_OK(cli, save(cli, id, &p, &a, 0, 8, 0, NULL));
    k = keys_of(&a, 0, 8);
    KVT_OK(cli, kvd_cache_lookup(cli, id, &k, true, 0, &lr));
    ck_assert_uint_eq(lr.hits, 8);
    ck_assert_uint_ne(lr.lease, 0);
    ck_assert_uint_eq(lr.lease_expires_ms, 30000);
    ck_assert_uint_eq(stats(cli, id).leases, 1);
    /* other chains, four times the cache: the leased one stays whole */
    for (int i = 0; i < 8; i++) {
        chain_make(&b, 8, NULL, 0, &rng);
        KVT_OK(cli, save(cli, id, &p, &b, 0, 8, 0, &res));
        ck_assert_uint_eq(res.stored, 8);
    }
    ck_assert_uint_eq(hits(cli, id, &a, 0, 8), 8);
    /* every block held: b's by the other client's lease, a's by ours; a
     * save is refused with its own status and changes nothing */
    k = keys_of(&b, 0, 8);
    KVT_OK(other, kvd_cache_lookup(other, id, &k, true, 0, &lr2));
    ck_assert_uint_eq(lr2.hits, 8);
    before = stats(cli, id);
    chain_make(&c, 4, NULL, 0, &rng);
    KVT_ERR(cli, save(cli, id, &p, &c, 0, 4, 0, &res), KVD_EBUSY);
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(cli), "leased"));
    ck_assert_uint_eq(stats(cli, id).blocks, before.blocks);
    ck_assert_uint_eq(stats(cli, id).stored, before.stored);
    ck_assert_uint_eq(hits(cli, id, &a, 0, 8), 8);
    ck_assert_uint_eq(hits(cli, id, &b, 0, 8), 8);
    ck_assert_uint_eq(hits(cli, id, &c, 0, 4), 0);
    /* the other client goes: its lease ends, and the save finds room */
    kvd_client_destroy(&other);
    wait_leases(cli, id, 1);
    KVT_OK(cli, save(cli, id, &p, &c, 0, 4, 0, &res));
    ck_assert_uint_eq(res.stored, 4);
    ck_assert_uint_eq(hits(cli, id, &a, 0, 8), 8);
    /* a load by the lease: the blocks come back, the lease ends */
    memset(&ld, 0, sizeof(ld));
    ld.cache = id;
    ld.pool = p.info.id;
    ld.lease = lr.lease;
    ld.blocks.values = pages;
    ld.blocks.count = 8;
    for (int i = 0; i < 8; i++)
        page_poison(&p, 8 + i);
    KVT_OK(cli, kvd_cache_load(cli, &ld, NULL, &res));
    for (uint32_t i = 0; i < 8; i++)
        ck_assert(kvt_page_holds(&p, 8 + i, a.keys[i]));
    ck_assert_uint_eq(stats(cli, id).leases, 0);
    KVT_ERR(cli, kvd_cache_load(cli, &ld, NULL, &res), KVD_ENOENT); /* used up */
    KVT_ERR(cli, kvd_cache_release(cli, lr.lease), KVD_ENOENT);
    /* a short lease expires by itself */
    k = keys_of(&a, 0, 8);
    KVT_OK(cli, kvd_cache_lookup(cli, id, &k, true, 150, &lr));
    ck_assert_uint_eq(lr.lease_expires_ms, 150);
    ck_assert_uint_eq(stats(cli, id).leases, 1);
    {
        int64_t t0 = kvt_now_ms(), end = t0 + KVT_MS(1000);

        while (stats(cli, id).leases != 0 && kvt_now_ms() < end)
            usleep(10000);
        ck_assert_msg(stats(cli, id).leases == 0, "a 150 ms lease still held after %lld ms",
                      (long long)(kvt_now_ms() - t0));
    }
    KVT_ERR(cli, kvd_cache_release(cli, lr.lease), KVD_ENOENT);
    /* a lease is its client's: another cannot release or load by it */
    KVT_OK(cli, kvd_cache_lookup(cli, id, &k, true, 0, &lr));
    other = kvt_connect("cache-leases-3");
    KVT_ERR(other, kvd_cache_release(other, lr.lease), KVD_ENOENT);
    kvd_client_destroy(&other);
    KVT_OK(cli, kvd_cache_release(cli, lr.lease));
    ck_assert_uint_eq(stats(cli, id).leases, 0);
    /* a dropped cache takes its leases with it */
    KVT_OK(cli, kvd_cache_lookup(cli, id, &k, true, 0, &lr));
    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, id, NULL));
    KVT_ERR(cli, kvd_cache_release(cli, lr.lease), KVD_ENOENT);
    kvd_client_destroy(&cli);
}
END_TEST

/* ---- a client killed mid-work ----------------------------------------------------- */

/* The child: saves chains from seed as fast as it can (submitted, many in
 * flight), loads them back, takes leases; it is killed at some point. */
static void child_work(const char *sock, const char *cache_name, uint64_t seed)
{
    kvd_client_t *cli = NULL;
    kvd_cache_info_t info;
    kvd_pool_spec_t spec;
    kvd_pool_info_t pool;
    kvd_mapping_t *map = NULL;
    kvt_pool_t p;
    chain_t *c = malloc(sizeof(*c));
    uint64_t rng = seed;

    if (c == NULL || kvd_client_create(sock, "victim", &cli) != KVD_OK ||
        kvd_cache_stats(cli, 0, cache_name, &info) != KVD_OK)
        _exit(2);
    memset(&spec, 0, sizeof(spec));
    spec.name = "victim-pool";
    spec.kind = KVD_MEM_HOST;
    spec.num_layers = LAYERS;
    spec.num_slots = 256 * TPB;
    spec.slot_bytes = TOKEN_BYTES;
    spec.page_size = TPB;
    if (kvd_pool_create(cli, &spec, &pool) != KVD_OK ||
        kvd_pool_export(cli, pool.id, NULL, 0, &map) != KVD_OK)
        _exit(3);
    p.info = pool;
    p.map = map;
    uint64_t rids[4];
    kvd_op_result_t res[4], lres;
    int nrids = 0;
    /* until the parent's SIGKILL; a child whose parent is gone ends by itself */
    for (int64_t end = kvt_now_ms() + KVT_MS(60000); kvt_now_ms() < end;) {
        int64_t pages[256];
        kvd_cache_save_t a;
        kvd_cache_keys_t k;
        kvd_cache_lookup_result_t lr;
        uint64_t rid;

        /* the pages are refilled only once the saves reading them are done */
        while (nrids > 0)
            (void)kvd_client_wait(cli, rids[--nrids]);
        chain_make(c, 64, NULL, 0, &rng);
        memset(&a, 0, sizeof(a));
        for (uint32_t i = 0; i < c->n; i++) {
            pages[i] = i;
            kvt_page_fill(&p, i, c->keys[i]);
        }
        a.cache = info.id;
        a.pool = pool.id;
        a.keys = keys_of(c, 0, c->n);
        a.blocks.values = pages;
        a.blocks.count = c->n;
        for (int j = 0; j < 4; j++) /* several in flight */
            if (kvd_cache_save_submit(cli, &a, NULL, &res[j], &rids[nrids]) == KVD_OK)
                nrids++;
        k = keys_of(c, 0, c->n);
        (void)kvd_cache_lookup(cli, info.id, &k, true, 0, &lr);
        for (uint32_t i = 0; i < c->n; i++)
            pages[i] = 128 + i;
        {
            kvd_cache_load_t ld;
            memset(&ld, 0, sizeof(ld));
            ld.cache = info.id;
            ld.pool = pool.id;
            ld.lease = lr.lease;
            ld.blocks.values = pages;
            ld.blocks.count = lr.hits;
            if (lr.lease != 0)
                (void)kvd_cache_load_submit(cli, &ld, NULL, &lres, &rid);
        }
    }
    _exit(4); /* the parent, which kills it sooner, takes this as the child ending early */
}

START_TEST(test_killed_client_leaves_nothing)
{
    kvd_client_t *cli = kvt_connect("cache-survivor");
    uint64_t rng = 17, id = cache_make(cli, "shared-kill", 2048, false, NULL);
    uint64_t cache_mem0 = 0, lease;
    kvt_pool_t p;
    chain_t mine;

    pool_make(cli, &p, 64);
    chain_make(&mine, 32, NULL, 0, &rng);
    KVT_OK(cli, save(cli, id, &p, &mine, 0, 32, 0, NULL));
    { /* held, so that the children's saves cannot evict it */
        kvd_cache_keys_t k = keys_of(&mine, 0, 32);
        kvd_cache_lookup_result_t lr;
        KVT_OK(cli, kvd_cache_lookup(cli, id, &k, true, 120000, &lr));
        ck_assert_uint_eq(lr.hits, 32);
        lease = lr.lease;
    }
    for (int round = 0; round < 4; round++) {
        pid_t pid = fork();
        int status;

        ck_assert_int_ge(pid, 0);
        if (pid == 0)
            child_work(kvt_d.socket, "shared-kill", 1000 + round);
        usleep((useconds_t)KVT_MS(50 + 60 * round) * 1000);
        kill(pid, SIGKILL);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFSIGNALED(status), "the child ended early (status 0x%x)", status);
        wait_leases(cli, id, 1); /* ours */
        /* every chain of the child that a lookup reports loads whole */
        {
            chain_t *c = malloc(sizeof(*c));
            uint64_t r = 1000 + round;
            for (int j = 0; j < 200; j++) {
                uint32_t h;
                chain_make(c, 64, NULL, 0, &r);
                h = hits(cli, id, c, 0, c->n);
                if (h == 0)
                    break;
                load_check(cli, id, &p, c, h, 0);
            }
            free(c);
        }
        ck_assert_uint_eq(hits(cli, id, &mine, 0, 32), 32);
        load_check(cli, id, &p, &mine, 32, 32);
    }
    ck_assert_uint_gt(stats(cli, id).stored, 32); /* the children did store */
    KVT_OK(cli, kvd_cache_release(cli, lease));
    /* nothing half-visible or held: clearing takes every block, the slabs
     * go back, and dropping the cache returns all its memory */
    {
        kvd_cache_evict_result_t ev;
        uint32_t blocks = stats(cli, id).blocks;
        KVT_OK(cli, kvd_cache_evict(cli, id, NULL, true, &ev));
        ck_assert_uint_eq(ev.evicted, blocks);
        ck_assert_uint_eq(stats(cli, id).blocks, 0);
    }
    ck_assert_uint_gt(cache_used(cli), cache_mem0);
    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, id, NULL));
    ck_assert_uint_eq(cache_used(cli), 0);
    kvd_client_destroy(&cli);
}
END_TEST

/* ---- host memory ------------------------------------------------------------------ */

START_TEST(test_host_memory_counted)
{
    /* the cache grows within the host-memory budget, in slabs, and gives
     * it all back */
    kvd_client_t *cli = kvt_connect("cache-hostmem");
    uint64_t rng = 19, id;
    kvd_cache_info_t st;
    kvt_pool_t p;
    chain_t c;

    ck_assert_uint_eq(cache_used(cli), 0);
    id = cache_make(cli, "hostmem", 1024, false, NULL);
    st = stats(cli, id);
    ck_assert_uint_eq(cache_used(cli), st.held_bytes);
    ck_assert_uint_lt(st.held_bytes, 1024 * BLOCK_BYTES); /* no slab yet */
    pool_make(cli, &p, 64);
    chain_make(&c, 64, NULL, 0, &rng);
    KVT_OK(cli, save(cli, id, &p, &c, 0, 64, 0, NULL));
    st = stats(cli, id);
    ck_assert_uint_ge(st.held_bytes, 64 * BLOCK_BYTES);
    ck_assert_uint_eq(cache_used(cli), st.held_bytes);
    kvt_pool_free(cli, &p);
    KVT_OK(cli, kvd_cache_drop(cli, id, NULL));
    ck_assert_uint_eq(cache_used(cli), 0);
    kvd_client_destroy(&cli);
}
END_TEST

START_TEST(test_slab_ahead)
{
    /* the next slab is allocated off the loop while the last one fills:
     * reserved in the budget from the start, used once the cache reaches
     * it, given back with the cache, and a daemon stopped while one is
     * being made exits cleanly */
    const uint64_t slab = 65536ull * BLOCK_BYTES; /* 32 MiB: 65,536 blocks of 512 */
    const char *extra[] = {"--host-memory-budget", "256M", NULL};
    kvt_daemon_t d;
    kvd_client_t *cli = NULL;
    uint64_t rng = 23, id;
    kvt_pool_t p;
    chain_t c, first;
    int64_t end;

    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    KVT_OK(NULL, kvd_client_create(d.socket, "slab-ahead", &cli));
    id = cache_make(cli, "ahead", 3 * 65536, false, NULL);
    pool_make(cli, &p, 256);
    chain_make(&first, 256, NULL, 0, &rng);
    KVT_OK(cli, save(cli, id, &p, &first, 0, 256, 0, NULL));
    ck_assert_uint_ge(stats(cli, id).held_bytes, 2 * slab); /* the first and the next */
    ck_assert_uint_eq(cache_used(cli), stats(cli, id).held_bytes);
    for (uint32_t i = 1; i <= 256; i++) { /* 256 more chains of 256: into the second slab */
        chain_make(&c, 256, NULL, 0, &rng);
        KVT_OK(cli, save(cli, id, &p, &c, 0, 256, 0, NULL));
    }
    ck_assert_uint_ge(stats(cli, id).held_bytes, 3 * slab); /* and the third ahead */
    load_check(cli, id, &p, &c, 256, 0);     /* in the slab made ahead */
    load_check(cli, id, &p, &first, 256, 0); /* in the first */
    KVT_OK(cli, kvd_cache_drop(cli, id, NULL));
    end = kvt_now_ms() + KVT_MS(5000); /* one still on its way goes when it comes */
    while (cache_used(cli) != 0 && kvt_now_ms() < end)
        usleep(10000);
    ck_assert_uint_eq(cache_used(cli), 0);
    id = cache_make(cli, "stopped", 3 * 65536, false, NULL);
    KVT_OK(cli, save(cli, id, &p, &first, 0, 256, 0, NULL)); /* a slab ahead starts */
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

/* ---- users --------------------------------------------------------------------------- */

/* As nobody, in a child: the steps the parent's caches must allow or
 * refuse; the exit status is the first step that went otherwise. */
static int as_nobody(const char *sock, uint64_t priv, uint64_t open_shared, uint64_t restricted,
                     const chain_t *c)
{
    kvd_client_t *cli = NULL;
    kvd_cache_info_t list[8], info;
    kvd_cache_lookup_result_t lr;
    kvd_cache_keys_t k = keys_of(c, 0, c->n);
    kvd_cache_spec_t s;
    size_t n = 0;

    if (setgroups(0, NULL) != 0 || setgid(NOGROUP) != 0 || setuid(NOBODY) != 0)
        return 90;
    if (kvd_client_create(sock, "nobody", &cli) != KVD_OK)
        return 91;
    if (kvd_client_info(cli)->admin)
        return 92;
    if (kvd_cache_list(cli, list, 8, &n) != KVD_OK)
        return 1;
    for (size_t i = 0; i < n && i < 8; i++)
        if (list[i].id == priv)
            return 2; /* a private cache of another user shows */
    if (n != 2)
        return 3; /* the two shared ones */
    if (kvd_cache_stats(cli, priv, NULL, &info) != KVD_ENOENT)
        return 4;
    if (kvd_cache_lookup(cli, priv, &k, false, 0, &lr) != KVD_ENOENT)
        return 5;
    if (kvd_cache_lookup(cli, open_shared, &k, true, 0, &lr) != KVD_OK || lr.hits != c->n)
        return 6;
    if (kvd_cache_release(cli, lr.lease) != KVD_OK)
        return 7;
    if (kvd_cache_lookup(cli, restricted, &k, false, 0, &lr) != KVD_EPERM)
        return 8;
    if (kvd_cache_evict(cli, open_shared, NULL, true, NULL) != KVD_EPERM)
        return 9; /* usable, not its to manage */
    if (kvd_cache_drop(cli, open_shared, NULL) != KVD_EPERM)
        return 10;
    if (kvd_cache_drop(cli, priv, NULL) != KVD_ENOENT)
        return 11;
    /* its own private cache of a name root uses too: allowed, its own */
    memset(&s, 0, sizeof(s));
    s.name = "private";
    s.layout = (kvd_cache_layout_t){LAYERS, false, TPB, TOKEN_BYTES, "bf16"};
    s.budget_bytes = 16 * BLOCK_BYTES;
    if (kvd_cache_create(cli, &s, &info) != KVD_OK || info.owner_uid != NOBODY)
        return 12;
    if (kvd_cache_stats(cli, 0, "private", &info) != KVD_OK || info.owner_uid != NOBODY)
        return 13;
    kvd_client_destroy(&cli);
    return 0;
}

START_TEST(test_users_and_sharing)
{
    char grp[16], uids[16];
    const char *extra[5];
    kvt_daemon_t d;
    kvd_client_t *cli = NULL;
    kvd_cache_spec_t s;
    kvd_cache_info_t info, list[8];
    uint64_t rng = 23, priv, open_shared, restricted;
    kvt_pool_t p;
    chain_t c;
    size_t n;
    pid_t pid;
    int status;

    if (geteuid() != 0) {
        kvt_skip_case("test_users_and_sharing", "needs root to run a client as uid %u",
                      NOBODY);
        return;
    }
    snprintf(grp, sizeof(grp), "%u", NOGROUP);
    snprintf(uids, sizeof(uids), "%u", NOBODY);
    extra[0] = "--socket-group";
    extra[1] = grp;
    extra[2] = "--allow-uids";
    extra[3] = uids;
    extra[4] = NULL;
    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    ck_assert_int_eq(chmod(d.dir, 0711), 0); /* nobody may reach the socket */
    KVT_OK(NULL, kvd_client_create(d.socket, "owner", &cli));
    priv = cache_make(cli, "private", 64, false, NULL);
    open_shared = cache_make(cli, "open", 64, true, NULL);
    memset(&s, 0, sizeof(s));
    s.name = "restricted";
    s.layout = (kvd_cache_layout_t){LAYERS, false, TPB, TOKEN_BYTES, "bf16"};
    s.budget_bytes = 64 * BLOCK_BYTES;
    s.shared = true;
    s.allow_uids = (const uint32_t[]){4242};
    s.num_allow_uids = 1;
    KVT_OK(cli, kvd_cache_create(cli, &s, &info));
    restricted = info.id;
    ck_assert_uint_eq(info.num_allow_uids, 1);
    ck_assert_uint_eq(info.allow_uids[0], 4242);
    pool_make(cli, &p, 16);
    chain_make(&c, 8, NULL, 0, &rng);
    KVT_OK(cli, save(cli, priv, &p, &c, 0, 8, 0, NULL));
    KVT_OK(cli, save(cli, open_shared, &p, &c, 0, 8, 0, NULL));
    KVT_OK(cli, save(cli, restricted, &p, &c, 0, 8, 0, NULL));
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(as_nobody(d.socket, priv, open_shared, restricted, &c));
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "as nobody, step %d went otherwise (see as_nobody)", WEXITSTATUS(status));
    /* the admin sees nobody's cache too, and the others are unchanged */
    KVT_OK(cli, kvd_cache_list(cli, list, 8, &n));
    ck_assert_uint_eq(n, 4);
    ck_assert_uint_eq(hits(cli, priv, &c, 0, 8), 8);
    ck_assert_uint_eq(stats(cli, open_shared).blocks, 8);
    KVT_OK(cli, kvd_cache_drop(cli, 0, "private")); /* its own first */
    KVT_OK(cli, kvd_cache_list(cli, list, 8, &n));
    ck_assert_uint_eq(n, 3);
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

START_TEST(test_block_hashes)
{
    /* equal prefixes give equal keys; the salt and every token matter */
    int64_t t[64], u[64];
    uint8_t a[16][KEY], b[16][KEY];
    size_t n = 0;

    for (int i = 0; i < 64; i++)
        t[i] = u[i] = i * 7;
    u[40] = -1;
    KVT_OK(NULL, kvd_block_hashes(t, 64, 4, "s", 1, a[0], 16, &n));
    ck_assert_uint_eq(n, 16);
    KVT_OK(NULL, kvd_block_hashes(u, 63, 4, "s", 1, b[0], 16, &n));
    ck_assert_uint_eq(n, 15); /* whole blocks only */
    ck_assert_mem_eq(a[0], b[0], 10 * KEY);
    for (int i = 10; i < 15; i++) /* block 10 differs, and so every key after it */
        ck_assert(memcmp(a[i], b[i], KEY) != 0);
    KVT_OK(NULL, kvd_block_hashes(t, 64, 4, "S", 1, b[0], 16, &n));
    ck_assert(memcmp(a[0], b[0], KEY) != 0);
    KVT_ERR(NULL, kvd_block_hashes(t, 64, 4, "s", 1, b[0], 15, &n), KVD_ERANGE);
    KVT_ERR(NULL, kvd_block_hashes(t, 64, 0, "s", 1, b[0], 16, &n), KVD_EINVAL);
}
END_TEST

static Suite *cache_suite(void)
{
    Suite *s = suite_create("cache_ops");
    TCase *tc = tcase_create("cache");

    tcase_add_unchecked_fixture(tc, kvt_suite_setup, kvt_suite_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_block_hashes);
    tcase_add_test(tc, test_create_and_manage);
    tcase_add_test(tc, test_limits);
    tcase_add_test(tc, test_disk_level_fields);
    tcase_add_test(tc, test_reload_in_chain_order);
    tcase_add_test(tc, test_save_lookup_load);
    tcase_add_test(tc, test_lookup_first_missing);
    tcase_add_test(tc, test_mla_and_key_forms);
    tcase_add_test(tc, test_layer_flags);
    tcase_add_test(tc, test_bad_input);
    tcase_add_test(tc, test_concurrent_saves_dedup);
    tcase_add_test(tc, test_prefixes_under_pressure);
    tcase_add_test(tc, test_evict);
    tcase_add_test(tc, test_leases);
    tcase_add_test(tc, test_killed_client_leaves_nothing);
    tcase_add_test(tc, test_host_memory_counted);
    tcase_add_test(tc, test_slab_ahead);
    tcase_add_test(tc, test_users_and_sharing);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(cache_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
