/*
 * The key area end to end (libkvdock against the real kvdockd, cpu
 * backend): chains of more than 16 keys go through memory the daemon
 * shares with the connection instead of the socket, and every answer is
 * the one the frame form gives.
 *
 * - random lookups (all hits, first key missing, a miss in the middle, a
 *   tail past the chain, list and blob forms, leases) answered alike by a
 *   client with the area and one without ($KVDOCK_KEY_AREA=0), and as the
 *   chains saved say; the keys do not cross the socket (bytes_in)
 * - saves, loads and evictions through the area
 * - pipelined lookups sharing the area, and chains that do not fit the
 *   room left, go in the frame with the same answers
 * - a daemon of a small socket allowance: the first client's area sized
 *   down to fit, the next one's refused and its chains in the frame,
 *   unchanged
 */
#include "testutil.h"

#define LAYERS 1
#define TPB 1
#define TOKEN_BYTES 16
#define BLOCK_BYTES (LAYERS * 2 * TPB * TOKEN_BYTES)
#define KEY 32
#define CHAINS 6
#define CHAIN 300
#define LONG 1000 /* keys of the longest lookup */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void rand_key(uint8_t *k, uint64_t *rng)
{
    for (int i = 0; i < KEY; i += 8) {
        uint64_t v = rng_next(rng);
        memcpy(k + i, &v, 8);
    }
}

/* The saved chains: CHAINS of CHAIN random keys. */
static uint8_t chains[CHAINS][CHAIN][KEY];

static kvd_client_t *connect_with_area(const char *name, const char *area)
{
    kvd_client_t *cli;

    if (area != NULL)
        setenv("KVDOCK_KEY_AREA", area, 1);
    else
        unsetenv("KVDOCK_KEY_AREA");
    cli = kvt_connect(name);
    unsetenv("KVDOCK_KEY_AREA");
    return cli;
}

static uint64_t cache_make(kvd_client_t *cli, const char *name, uint32_t blocks)
{
    kvd_cache_spec_t s = kvt_cache_spec(name, LAYERS, TPB, TOKEN_BYTES, (uint64_t)blocks * BLOCK_BYTES);
    kvd_cache_info_t info;

    KVT_OK(cli, kvd_cache_create(cli, &s, &info));
    return info.id;
}

static kvd_cache_keys_t blob_keys(const void *keys, uint32_t n)
{
    kvd_cache_keys_t k;

    memset(&k, 0, sizeof(k));
    k.blob = keys;
    k.key_size = KEY;
    k.count = n;
    return k;
}

/* Save chain c (all CHAIN keys) from pages [0, CHAIN) of p. */
static void save_chain(kvd_client_t *cli, uint64_t cache, const kvt_pool_t *p, int c)
{
    static int64_t pages[CHAIN];
    kvd_cache_save_t a;
    kvd_op_result_t res;

    memset(&a, 0, sizeof(a));
    for (uint32_t i = 0; i < CHAIN; i++) {
        pages[i] = i;
        kvt_page_fill(p, i, chains[c][i]);
    }
    a.cache = cache;
    a.pool = p->info.id;
    a.keys = blob_keys(chains[c], CHAIN);
    a.blocks.values = pages;
    a.blocks.count = CHAIN;
    KVT_OK(cli, kvd_cache_save(cli, &a, NULL, &res));
    ck_assert_uint_eq(res.stored + res.skipped, CHAIN);
    ck_assert_uint_eq(res.refused, 0);
}

/* Requests the daemon has answered for op. */
static uint64_t op_requests(kvd_client_t *cli, const char *op)
{
    kvd_daemon_stats_t st;
    kvd_op_stats_t ops[64];

    KVT_OK(cli, kvd_daemon_stats(cli, &st, ops, 64, NULL, 0));
    for (size_t i = 0; i < st.num_ops && i < 64; i++)
        if (strcmp(ops[i].op, op) == 0)
            return ops[i].requests;
    return 0;
}

static uint64_t bytes_in(kvd_client_t *cli)
{
    kvd_daemon_stats_t st;

    KVT_OK(cli, kvd_daemon_stats(cli, &st, NULL, 0, NULL, 0));
    return st.bytes_in;
}

/* A random lookup chain in keys (at most LONG) and the hits it must give. */
static uint32_t random_chain(uint8_t (*keys)[KEY], uint32_t *n, uint64_t *rng)
{
    int c = (int)(rng_next(rng) % CHAINS);
    uint32_t len = 1 + (uint32_t)(rng_next(rng) % CHAIN), at, i;

    switch (rng_next(rng) % 5) {
    case 0: /* all hits */
        memcpy(keys, chains[c], (size_t)len * KEY);
        *n = len;
        return len;
    case 1: /* the first key misses */
        memcpy(keys, chains[c], (size_t)len * KEY);
        rand_key(keys[0], rng);
        *n = len;
        return 0;
    case 2: /* a miss in the middle */
        memcpy(keys, chains[c], (size_t)len * KEY);
        at = (uint32_t)(rng_next(rng) % len);
        rand_key(keys[at], rng);
        *n = len;
        return at;
    case 3: /* the chain, then keys past it */
        memcpy(keys, chains[c], (size_t)CHAIN * KEY);
        *n = CHAIN + 1 + (uint32_t)(rng_next(rng) % (LONG - CHAIN));
        for (i = CHAIN; i < *n; i++)
            rand_key(keys[i], rng);
        return CHAIN;
    default: /* short: the frame either way */
        len = 1 + (uint32_t)(rng_next(rng) % 16);
        memcpy(keys, chains[c], (size_t)len * KEY);
        *n = len;
        return len;
    }
}

static uint32_t lookup(kvd_client_t *cli, uint64_t cache, const uint8_t (*keys)[KEY], uint32_t n,
                       bool list)
{
    static const void *ptrs[LONG];
    static size_t lens[LONG];
    kvd_cache_keys_t k = blob_keys(keys, n);
    kvd_cache_lookup_result_t r;

    if (list) {
        for (uint32_t i = 0; i < n; i++) {
            ptrs[i] = keys[i];
            lens[i] = KEY;
        }
        memset(&k, 0, sizeof(k));
        k.keys = ptrs;
        k.lens = lens;
        k.count = n;
    }
    KVT_OK(cli, kvd_cache_lookup(cli, cache, &k, false, 0, &r));
    ck_assert_uint_eq(r.hits, r.local_hits);
    return r.hits;
}

static kvd_client_t *area_cli, *frame_cli;
static kvt_pool_t pool;
static uint64_t cache;

static void world_make(void)
{
    uint64_t rng = 42;

    kvt_suite_setup();
    for (int c = 0; c < CHAINS; c++)
        for (int i = 0; i < CHAIN; i++)
            rand_key(chains[c][i], &rng);
}

START_TEST(test_same_answers)
{
    static uint8_t keys[LONG][KEY];
    uint64_t rng = 7, before, area_asks;
    uint32_t n, want;

    area_cli = connect_with_area("area", NULL);
    frame_cli = connect_with_area("frame", "0");
    kvt_pool_make(area_cli, &pool, "kpool", LAYERS, CHAIN * TPB, TOKEN_BYTES, false, TPB);
    cache = cache_make(area_cli, "keyarea", CHAINS * CHAIN);
    area_asks = op_requests(area_cli, "cache_key_area");
    for (int c = 0; c < CHAINS; c++)
        save_chain(area_cli, cache, &pool, c); /* through the area */
    ck_assert_uint_eq(op_requests(area_cli, "cache_key_area"), area_asks + 1);
    for (int round = 0; round < 400; round++) {
        want = random_chain(keys, &n, &rng);
        ck_assert_uint_eq(lookup(area_cli, cache, (const uint8_t (*)[KEY])keys, n, round & 1),
                          want);
        ck_assert_uint_eq(lookup(frame_cli, cache, (const uint8_t (*)[KEY])keys, n, round & 1),
                          want);
    }
    /* the client without an area never asked for one */
    ck_assert_uint_eq(op_requests(area_cli, "cache_key_area"), area_asks + 1);

    /* the keys stay off the socket: 300 keys are 9,600 bytes */
    memcpy(keys, chains[0], sizeof(chains[0]));
    before = bytes_in(area_cli);
    ck_assert_uint_eq(lookup(area_cli, cache, (const uint8_t (*)[KEY])keys, CHAIN, false), CHAIN);
    ck_assert_uint_lt(bytes_in(area_cli) - before, 1024);
    before = bytes_in(frame_cli);
    ck_assert_uint_eq(lookup(frame_cli, cache, (const uint8_t (*)[KEY])keys, CHAIN, false),
                      CHAIN);
    ck_assert_uint_gt(bytes_in(frame_cli) - before, CHAIN * KEY);

    /* a lease on a chain named in the area holds its blocks */
    {
        kvd_cache_keys_t k = blob_keys(chains[1], CHAIN);
        kvd_cache_lookup_result_t r;

        KVT_OK(area_cli, kvd_cache_lookup(area_cli, cache, &k, true, 0, &r));
        ck_assert_uint_eq(r.hits, CHAIN);
        ck_assert_uint_ne(r.lease, 0);
        KVT_OK(area_cli, kvd_cache_release(area_cli, r.lease));
    }
}
END_TEST

START_TEST(test_load_and_evict)
{
    static int64_t pages[CHAIN];
    kvd_cache_load_t a;
    kvd_cache_keys_t k;
    kvd_cache_evict_result_t ev;

    /* load chain 2 through the area into poisoned pages */
    for (uint32_t i = 0; i < CHAIN; i++) {
        pages[i] = i;
        memset(kvt_page(&pool, i, 0, false), 0xA5, TOKEN_BYTES);
        memset(kvt_page(&pool, i, 0, true), 0xA5, TOKEN_BYTES);
    }
    memset(&a, 0, sizeof(a));
    a.cache = cache;
    a.pool = pool.info.id;
    a.keys = blob_keys(chains[2], CHAIN);
    a.blocks.values = pages;
    a.blocks.count = CHAIN;
    KVT_OK(area_cli, kvd_cache_load(area_cli, &a, NULL, NULL));
    for (uint32_t i = 0; i < CHAIN; i++)
        ck_assert_msg(kvt_page_holds(&pool, i, chains[2][i]), "page %u", i);

    /* a load naming a key not there is refused, naming nothing loaded */
    {
        static uint8_t keys[CHAIN][KEY];
        uint64_t rng = 99;

        memcpy(keys, chains[2], sizeof(keys));
        rand_key(keys[CHAIN / 2], &rng);
        a.keys = blob_keys(keys, CHAIN);
        KVT_ERR(area_cli, kvd_cache_load(area_cli, &a, NULL, NULL), KVD_ENOENT);
    }

    /* evict chain 3 from key 100 on: 100 keys stay */
    k = blob_keys(chains[3][100], CHAIN - 100);
    KVT_OK(area_cli, kvd_cache_evict(area_cli, cache, &k, false, &ev));
    ck_assert_uint_eq(ev.evicted, CHAIN - 100);
    ck_assert_uint_eq(lookup(frame_cli, cache, (const uint8_t (*)[KEY])chains[3], CHAIN, false),
                      100);
    ck_assert_uint_eq(lookup(area_cli, cache, (const uint8_t (*)[KEY])chains[3], CHAIN, false),
                      100);
    save_chain(area_cli, cache, &pool, 3); /* whole again, for the tests after */
    ck_assert_uint_eq(lookup(frame_cli, cache, (const uint8_t (*)[KEY])chains[3], CHAIN, false),
                      CHAIN);
}
END_TEST

/* Lookups submitted together share the area; those that find no room go
 * in the frame; every answer is right. */
static void pipelined(kvd_client_t *cli, int count)
{
    static uint8_t keys[8][LONG][KEY];
    kvd_cache_keys_t k[8];
    kvd_cache_lookup_result_t r[8];
    uint64_t id[8], rng = 1234 + (uint64_t)count;
    uint32_t want[8], n;

    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < count; i++) {
            want[i] = random_chain(keys[i], &n, &rng);
            k[i] = blob_keys(keys[i], n);
            KVT_OK(cli, kvd_cache_lookup_submit(cli, cache, &k[i], false, 0, &r[i], &id[i]));
            /* the area's copy is taken at submit: the caller may reuse its keys */
            memset(keys[i], 0, (size_t)n * KEY);
        }
        for (int i = 0; i < count; i++) {
            KVT_OK(cli, kvd_client_wait(cli, id[i]));
            ck_assert_uint_eq(r[i].hits, want[i]);
        }
    }
}

START_TEST(test_pipelined_and_no_room)
{
    kvd_client_t *small = connect_with_area("small", "4K"); /* 128 keys of 32 bytes */

    pipelined(area_cli, 8);
    pipelined(small, 8);
    pipelined(small, 1);
    kvd_client_destroy(&small);
}
END_TEST

/* A daemon of the smallest socket allowance (--max-socket-buffer-bytes
 * 1M): the first client's area is sized down to the quarter of it that
 * areas may take, and its chains go through it; the second client's area
 * is refused (asked once, not again) and its chains go in the frame; the
 * answers do not change. */
START_TEST(test_area_sized_and_refused)
{
    const char *const extra[] = {"--max-socket-buffer-bytes", "1M", NULL};
    kvt_daemon_t d;
    kvd_client_t *cli = NULL, *other = NULL;
    kvt_pool_t p;
    kvd_cache_spec_t s;
    kvd_cache_info_t info;
    uint64_t in;

    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    unsetenv("KVDOCK_KEY_AREA"); /* the default: 1 MiB asked for */
    ck_assert_int_eq(kvd_client_create(d.socket, "sized", &cli), KVD_OK);
    ck_assert_int_eq(kvd_client_create(d.socket, "refused", &other), KVD_OK);
    kvd_client_set_timeout(cli, (int)KVT_MS(20000));
    kvd_client_set_timeout(other, (int)KVT_MS(20000));
    kvt_pool_make(cli, &p, "rpool", LAYERS, CHAIN * TPB, TOKEN_BYTES, false, TPB);
    memset(&s, 0, sizeof(s));
    s.name = "refused";
    s.layout.num_layers = LAYERS;
    s.layout.tokens_per_block = TPB;
    s.layout.token_bytes = TOKEN_BYTES;
    snprintf(s.layout.dtype, sizeof(s.layout.dtype), "bf16");
    s.budget_bytes = (uint64_t)CHAIN * BLOCK_BYTES;
    s.shared = true;
    KVT_OK(cli, kvd_cache_create(cli, &s, &info));
    save_chain(cli, info.id, &p, 4);
    ck_assert_uint_eq(op_requests(cli, "cache_key_area"), 1);

    /* the first client's chain does not cross the socket */
    in = bytes_in(cli);
    ck_assert_uint_eq(lookup(cli, info.id, (const uint8_t (*)[KEY])chains[4], CHAIN, false),
                      CHAIN);
    ck_assert_uint_lt(bytes_in(cli) - in, (uint64_t)CHAIN * KEY);

    /* the second's does: its area was refused */
    in = bytes_in(other);
    ck_assert_uint_eq(lookup(other, info.id, (const uint8_t (*)[KEY])chains[4], CHAIN, false),
                      CHAIN);
    ck_assert_uint_ge(bytes_in(other) - in, (uint64_t)CHAIN * KEY);
    ck_assert_uint_eq(op_requests(other, "cache_key_area"), 2); /* one each */
    ck_assert_uint_eq(lookup(other, info.id, (const uint8_t (*)[KEY])chains[5], CHAIN, true), 0);
    ck_assert_uint_eq(op_requests(other, "cache_key_area"), 2); /* not asked again */
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&other);
    kvd_client_destroy(&cli);
    ck_assert_int_eq(kvt_daemon_stop(&d, (int)KVT_MS(10000)), 0);
}
END_TEST

static void world_end(void)
{
    kvd_client_destroy(&area_cli);
    kvd_client_destroy(&frame_cli);
    kvt_suite_teardown();
}

static Suite *key_area_suite(void)
{
    Suite *s = suite_create("cache_key_area");
    TCase *tc = tcase_create("key_area");

    tcase_add_unchecked_fixture(tc, world_make, world_end);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_same_answers);
    tcase_add_test(tc, test_load_and_evict);
    tcase_add_test(tc, test_pipelined_and_no_room);
    tcase_add_test(tc, test_area_sized_and_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(key_area_suite());
    int failed;

    /* one process: the tests share the suite's clients, cache and pool */
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
