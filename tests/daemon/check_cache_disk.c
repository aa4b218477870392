/*
 * check_cache_disk: the cache store over two levels (daemon/cache.c with
 * its disk level, daemon/disk/ underneath), in a real directory of the
 * build tree (not tmpfs), with a real I/O engine driven by
 * kvd__disk_io_poll: blocks leave host memory for disk and come back byte
 * for byte; chains stay prefixes over both levels after filling far past
 * both budgets (against a plain model); held blocks stay; dedup, evict
 * and clear cover both levels; a restart finds every whole block, drops
 * orphans and older copies, and a million blocks serve lookups within 3 s;
 * a record that fails its checks is missing with every block after it; a
 * touch moves each block once on each list.
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache_harness.h"
#include "disk_store.h"
#include "kvt_time.h"

#ifndef KVD_TEST_SCRATCH
#define KVD_TEST_SCRATCH "/tmp"
#endif

#define BLOCK KVDT_BLOCK /* kvdt_small_layout's */

static char dir[512];
static kvd__disk_io_t *io;

static void setup(void)
{
    int threads = getenv("KVD_TEST_DISK_THREADS") != NULL; /* valgrind: the pool */
    kvd__disk_io_config_t c = {.queue_depth = 16, .threads = 2, .force_threads = threads};
    char why[200];

    snprintf(dir, sizeof(dir), "%s/cache-disk-XXXXXX", KVD_TEST_SCRATCH);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(chmod(dir, 0700), 0);
    ck_assert_int_eq(kvd__disk_io_create(&io, &c, why, sizeof(why)), KVD_OK);
}

static void teardown(void)
{
    char cmd[600];

    kvd__disk_io_destroy(&io);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* The directory's files go (the directory stays). */
static void empty_dir(void)
{
    char cmd[600];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'/*", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Until every request submitted so far is done. */
static void drain(void)
{
    while (kvd__disk_io_pending(io) > 0)
        kvd__disk_io_wait(io, 1000);
}

/* A store of host_blocks blocks in host memory over a disk level of
 * disk_bytes in dir. */
static void open_with(kvd__cache_store_t *c, kvd__hostmem_t *hm, uint32_t host_blocks,
                      uint64_t disk_bytes, kvd_status_t want)
{
    kvd__cache_disk_config_t cfg = {.dir = dir, .budget = disk_bytes, .io = io};
    char why[200];

    kvd__hostmem_init(hm, 1ull << 30);
    ck_assert_int_eq(kvd__cache_store_init(c, &kvdt_small_layout, (uint64_t)host_blocks * BLOCK,
                                           hm, &kvdt_malloc_mem, why, sizeof(why)),
                     KVD_OK);
    ck_assert_int_eq(kvd__cache_store_open_disk(c, &cfg, why, sizeof(why)), want);
}

static uint8_t byte_of(uint32_t ch, uint32_t i, uint32_t gen, uint32_t j)
{
    return (uint8_t)(ch * 31 + i * 7 + gen * 101 + j);
}

static void fill_gen(uint8_t *bytes, uint32_t ch, uint32_t i, void *ctx)
{
    uint32_t gen = *(const uint32_t *)ctx;

    for (uint32_t j = 0; j < BLOCK; j++)
        bytes[j] = byte_of(ch, i, gen, j);
}

/* Save chain ch's keys [0, n) (bytes of generation gen), as a save does,
 * up to a block not ready yet, then let the writes finish.  The blocks
 * stored. */
static uint32_t save_chain(kvd__cache_store_t *c, uint32_t ch, uint32_t n, uint32_t gen)
{
    uint32_t stored = kvdt_save_chain(c, ch, n, fill_gen, &gen, 1);

    kvd__cache_disk_flush(c);
    drain();
    return stored;
}

static uint32_t present(kvd__cache_store_t *c, uint32_t ch, uint32_t n, uint32_t *ids)
{
    return kvdt_present(c, ch, n, ids);
}

static int fetch_seen;
static kvd_status_t fetch_st;

static void on_fetch(void *arg, kvd_status_t st)
{
    (void)arg;
    fetch_seen++;
    fetch_st = st;
}

/* Block id's bytes, read from disk where it is on disk only: KVD_OK with
 * out filled, or the read's failure. */
static kvd_status_t bytes_of(kvd__cache_store_t *c, uint32_t id, uint8_t *out)
{
    char why[200];
    kvd_status_t st;

    if (!kvd__cache_in_host(c, id)) {
        fetch_seen = 0;
        st = kvd__cache_fetch(c, id, on_fetch, NULL, why, sizeof(why));
        if (st != KVD_OK)
            return st;
        ck_assert_int_eq(fetch_seen, 0); /* never from inside the call */
        drain();
        ck_assert_int_eq(fetch_seen, 1);
        if (fetch_st != KVD_OK)
            return fetch_st;
        ck_assert(kvd__cache_in_host(c, id));
    }
    memcpy(out, kvd__cache_block_bytes(c, id), BLOCK);
    return KVD_OK;
}

static void check_chain_bytes(kvd__cache_store_t *c, uint32_t ch, uint32_t n, uint32_t gen)
{
    uint32_t ids[512], i;
    uint8_t b[BLOCK];

    ck_assert_uint_eq(present(c, ch, n, ids), n);
    for (i = 0; i < n; i++) {
        ck_assert_int_eq(bytes_of(c, ids[i], b), KVD_OK);
        for (uint32_t j = 0; j < BLOCK; j++)
            ck_assert_uint_eq(b[j], byte_of(ch, i, gen, j));
    }
}

START_TEST(test_spill_and_reload)
{
    /* a host level 20 times smaller than the disk's: blocks spill to disk
     * instead of going, and come back byte for byte */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    kvd__cache_disk_stats_t ds;
    uint32_t ch, ids[16];

    open_with(&c, &hm, 16, 320ull * 256, KVD_OK); /* 320 records of 256 bytes */
    for (ch = 0; ch < 30; ch++)
        ck_assert_uint_eq(save_chain(&c, ch, 10, 0), 10);
    kvd__cache_store_disk_stats(&c, &ds);
    ck_assert_uint_eq(ds.blocks, 300);
    ck_assert_uint_eq(ds.writes, 300);
    ck_assert_uint_ge(ds.spills, 300 - 16);
    ck_assert_uint_le(kvd__cache_host_blocks(&c), 16);
    ck_assert_uint_eq(c.ready, 300);
    /* the entries of blocks on disk only are host memory too: charged */
    ck_assert_uint_ge(hm.used[KVD_HM_CACHE_INDEX], 300 * kvd__cache_entry_bytes(&c));
    /* every chain whole over both levels; the lookup counts disk hits */
    ck_assert_uint_eq(present(&c, 3, 10, ids), 10);
    ck_assert_uint_eq(kvd__cache_disk_hits(&c, ids, 10), 10);
    for (ch = 0; ch < 30; ch++)
        check_chain_bytes(&c, ch, 10, 0);
    kvd__cache_store_disk_stats(&c, &ds);
    ck_assert_uint_ge(ds.promotions, 280);
    ck_assert_uint_eq(ds.hits, 10);
    ck_assert_uint_eq(ds.checksum_failures, 0);
    ck_assert_uint_le(kvd__cache_host_blocks(&c), 16);
    /* promoted blocks stay in host memory (the last read the most
     * recently used), their records kept */
    ck_assert_uint_eq(present(&c, 29, 10, ids), 10);
    ck_assert(kvd__cache_in_host(&c, ids[9]));
    ck_assert_uint_eq(ds.blocks, 300);
    kvd__cache_store_deinit(&c);
}
END_TEST

/* The blocks on list which (KVD_CLIST_LRU or KVD_CLIST_HOST), the most
 * recently used first; how many. */
static uint32_t list_ids(const kvd__cache_store_t *c, int which, uint32_t *out, uint32_t max)
{
    uint32_t n = 0, at = which == KVD_CLIST_LRU ? c->lru.head : c->hlru.head;

    while (at != 0) {
        ck_assert_uint_lt(n, max);
        if (which == KVD_CLIST_LRU) {
            out[n++] = at - 1;
            at = kvd__cache_block(c, at - 1)->lru.next;
        } else {
            const kvd__chost_t *h =
                &c->slabs[kvd__cache_slab_of(c, at - 1)].hs[kvd__cache_pos_of(c, at - 1)];
            out[n++] = h->owner;
            at = h->hlru.next;
        }
    }
    return n;
}

/* List which begins with the n blocks of ids, in that order. */
static void check_list_starts(const kvd__cache_store_t *c, int which, const uint32_t *ids,
                              uint32_t n)
{
    uint32_t got[256], m = list_ids(c, which, got, 256);

    ck_assert_uint_ge(m, n);
    for (uint32_t i = 0; i < n; i++)
        ck_assert_msg(got[i] == ids[i], "list %d: place %u holds block %u, not %u", which, i,
                      got[i], ids[i]);
}

/* Every block on the recency list lies behind its parent, where its
 * parent is on it: parents at least as recent as their children. */
static void check_parents_first(const kvd__cache_store_t *c)
{
    uint32_t ids[256], n = list_ids(c, KVD_CLIST_LRU, ids, 256);

    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = kvd__cache_block(c, ids[i])->parent;
        for (uint32_t j = i + 1; p != 0 && j < n; j++)
            ck_assert_msg(ids[j] != p - 1, "block %u is more recent than its parent %u", ids[i],
                          p - 1);
    }
}

/* Chain ch's keys [0, n) saved as a save larger than the host level
 * streams them (ops_cache.c): every block reserved and filled, and the
 * records of [0, early) written before the save commits, of which those
 * of [0, landed) land while the blocks still fill (their host slots let
 * go); then the commits, the last first, the records of the others
 * written, and every write in flight lands.  Their ids in ids. */
static void save_streamed(kvd__cache_store_t *c, uint32_t ch, uint32_t n, uint32_t landed,
                          uint32_t early, uint32_t *ids)
{
    uint32_t i, gen = 0, parent = KVD_CBLOCK_NONE;
    uint8_t k[KVDT_KEY];
    char why[200];

    for (i = 0; i < n; i++) {
        kvdt_key_of(k, ch, i);
        ck_assert_int_eq(kvd__cache_reserve(c, parent, k, KVDT_KEY, &ids[i], why, sizeof(why)),
                         KVD_OK);
        fill_gen(kvd__cache_block_bytes(c, ids[i]), ch, i, &gen);
        parent = ids[i];
    }
    for (i = 0; i < landed; i++)
        ck_assert_int_eq(kvd__cache_write_early(c, ids[i]), 1);
    kvd__cache_disk_flush(c);
    drain();
    for (i = landed; i < early; i++)
        ck_assert_int_eq(kvd__cache_write_early(c, ids[i]), 1);
    kvd__cache_disk_flush(c);
    for (i = n; i-- > 0;)
        ck_assert(kvd__cache_commit(c, ids[i]));
    kvd__cache_disk_flush(c);
    drain();
    for (i = 0; i < n; i++)
        ck_assert_int_eq(kvd__cache_in_host(c, ids[i]), i >= landed);
}

START_TEST(test_streamed_chain_in_order)
{
    /* a chain saved through the host level, its records landing after
     * its save committed it (the writes held its blocks then), lies in
     * chain order on both lists, as a save leaves a chain: parents before
     * their children, its hits one run that a lookup's touch moves in one
     * step.  Records landing before the commit, after it, and both. */
    static const uint32_t cases[][2] = {{0, 5}, {3, 6}, {0, 8}, {2, 2}};

    for (uint32_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        kvd__cache_store_t c;
        kvd__hostmem_t hm;
        uint32_t ids[8], got[8], landed = cases[t][0], early = cases[t][1];
        uint8_t blob[8 * KVDT_KEY];
        uint64_t before;
        int linked = 0;

        open_with(&c, &hm, 64, 640ull * 256, KVD_OK);
        ck_assert_uint_eq(save_chain(&c, 1, 4, 0), 4);
        save_streamed(&c, 2, 8, landed, early, ids);
        check_list_starts(&c, KVD_CLIST_LRU, ids, 8);
        check_list_starts(&c, KVD_CLIST_HOST, ids + landed, 8 - landed);
        check_parents_first(&c);
        ck_assert_uint_eq(save_chain(&c, 3, 4, 0), 4); /* the chain is not the most recent */
        for (uint32_t i = 0; i < 8; i++)
            kvdt_key_of(blob + i * KVDT_KEY, 2, i);
        ck_assert_uint_eq(kvd__cache_lookup_blob(&c, blob, KVDT_KEY, 8, got, &linked), 8);
        ck_assert_mem_eq(got, ids, sizeof(ids));
        ck_assert_msg(linked, "case %u: the hits are not one run of the recency list", t);
        /* a touch: one step on the recency list, each host copy once */
        before = c.n.relinks;
        kvd__cache_touch_chain(&c, ids, 8);
        ck_assert_uint_eq(c.n.relinks - before, 1 + (8 - landed));
        check_list_starts(&c, KVD_CLIST_LRU, ids, 8);
        check_list_starts(&c, KVD_CLIST_HOST, ids + landed, 8 - landed);
        check_chain_bytes(&c, 2, 8, 0);
        kvd__cache_store_deinit(&c);
        empty_dir(); /* the next case starts without these records */
    }
}
END_TEST

START_TEST(test_extended_chain_in_order)
{
    /* a save that extends a chain present (a conversation's next turn)
     * leaves it in chain order over its old blocks and its new ones,
     * whose records land after the save let the old ones go: a lookup's
     * touch moves it in one step */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint32_t ids[12];
    uint64_t before;

    open_with(&c, &hm, 64, 640ull * 256, KVD_OK);
    ck_assert_uint_eq(save_chain(&c, 1, 5, 0), 5);
    ck_assert_uint_eq(save_chain(&c, 2, 4, 0), 4);
    ck_assert_uint_eq(save_chain(&c, 1, 12, 0), 7);
    ck_assert_uint_eq(present(&c, 1, 12, ids), 12);
    check_list_starts(&c, KVD_CLIST_LRU, ids, 12);
    check_list_starts(&c, KVD_CLIST_HOST, ids, 12);
    check_parents_first(&c);
    ck_assert_uint_eq(save_chain(&c, 3, 4, 0), 4);
    before = c.n.relinks;
    kvd__cache_touch_chain(&c, ids, 12);
    ck_assert_uint_eq(c.n.relinks - before, 1 + 12);
    check_list_starts(&c, KVD_CLIST_LRU, ids, 12);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_touch_moves_once)
{
    /* a chain's touch that cannot move it as one piece moves each block
     * once on each list (the recency list and the host list) */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint32_t ids[8];
    uint64_t before;

    open_with(&c, &hm, 64, 640ull * 256, KVD_OK);
    ck_assert_uint_eq(save_chain(&c, 1, 8, 0), 8);
    ck_assert_uint_eq(save_chain(&c, 2, 4, 0), 4);
    ck_assert_uint_eq(present(&c, 1, 8, ids), 8);
    kvd__cache_touch(&c, ids[5]); /* the chain is not one piece now */
    before = c.n.relinks;
    kvd__cache_touch_chain(&c, ids, 8);
    ck_assert_uint_eq(c.n.relinks - before, 8 + 8);
    check_list_starts(&c, KVD_CLIST_LRU, ids, 8);
    check_list_starts(&c, KVD_CLIST_HOST, ids, 8);
    check_parents_first(&c);
    /* one piece again: one step on the recency list */
    ck_assert_uint_eq(save_chain(&c, 3, 4, 0), 4);
    before = c.n.relinks;
    kvd__cache_touch_chain(&c, ids, 8);
    ck_assert_uint_eq(c.n.relinks - before, 1 + 8);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_touch_while_writing)
{
    /* a chain used while its records are still being written: the use
     * counts (the write is no use of it), so once they land the chain is
     * the most recent, in chain order */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint32_t ids[6], gen = 0;

    open_with(&c, &hm, 64, 640ull * 256, KVD_OK);
    ck_assert_uint_eq(kvdt_save_chain(&c, 1, 6, fill_gen, &gen, 1), 6);
    kvd__cache_disk_flush(&c);
    ck_assert_uint_eq(kvdt_save_chain(&c, 2, 4, fill_gen, &gen, 1), 4);
    kvd__cache_disk_flush(&c);
    ck_assert_uint_gt(kvd__cache_disk_writing(&c), 0);
    ck_assert_uint_eq(present(&c, 1, 6, ids), 6);
    kvd__cache_touch_chain(&c, ids, 6);
    check_list_starts(&c, KVD_CLIST_LRU, ids, 6);
    drain();
    ck_assert_uint_eq(kvd__cache_disk_writing(&c), 0);
    check_list_starts(&c, KVD_CLIST_LRU, ids, 6);
    check_list_starts(&c, KVD_CLIST_HOST, ids, 6);
    check_parents_first(&c);
    kvd__cache_store_deinit(&c);
}
END_TEST

static int fetch_failed;

static void on_fetch_count(void *arg, kvd_status_t st)
{
    (void)arg;
    fetch_seen++;
    fetch_failed += st != KVD_OK;
}

START_TEST(test_many_reads_in_flight)
{
    /* a thousand reads in flight at once, each asked for twice (the
     * second waits on the first's read): every ask is answered once, the
     * bytes come back, and nothing stays held */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    kvd__cache_disk_stats_t ds;
    uint32_t ids[30][100], ch, i, n = 0;
    uint8_t b[BLOCK];
    char why[200];

    open_with(&c, &hm, 1100, 6000ull * 256, KVD_OK);
    for (ch = 0; ch < 30; ch++)
        ck_assert_uint_eq(save_chain(&c, ch, 100, 0), 100);
    for (ch = 0; ch < 30; ch++)
        ck_assert_uint_eq(present(&c, ch, 100, ids[ch]), 100);
    fetch_seen = fetch_failed = 0;
    for (int round = 0; round < 2; round++)
        for (ch = 0, n = 0; ch < 30 && n < 1000; ch++) {
            for (i = 0; i < 100 && n < 1000; i++) {
                if (round == 0 && kvd__cache_in_host(&c, ids[ch][i]))
                    continue;
                if (round == 1 && !(kvd__cache_block(&c, ids[ch][i])->dflags & KVD_CBLOCK_FETCHING))
                    continue;
                ck_assert_int_eq(kvd__cache_fetch(&c, ids[ch][i], on_fetch_count, NULL, why,
                                                  sizeof(why)),
                                 KVD_OK);
                n++;
            }
        }
    ck_assert_uint_eq(n, 1000);
    ck_assert_int_eq(fetch_seen, 0);
    drain();
    ck_assert_int_eq(fetch_seen, 2000);
    ck_assert_int_eq(fetch_failed, 0);
    kvd__cache_store_disk_stats(&c, &ds);
    ck_assert_uint_eq(ds.promotions, 1000);
    for (ch = 0; ch < 30; ch++)
        for (i = 0; i < 100; i++) {
            ck_assert_uint_eq(kvd__cache_block(&c, ids[ch][i])->holds, 0);
            ck_assert_int_eq(bytes_of(&c, ids[ch][i], b), KVD_OK);
            for (uint32_t j = 0; j < BLOCK; j++)
                ck_assert_uint_eq(b[j], byte_of(ch, i, 0, j));
        }
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_dedup_evict_clear)
{
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    kvd__cache_disk_stats_t ds;
    uint32_t ids[8], n;
    uint8_t k[12];

    open_with(&c, &hm, 8, 100ull * 256, KVD_OK);
    ck_assert_uint_eq(save_chain(&c, 1, 8, 0), 8);
    ck_assert_uint_eq(save_chain(&c, 2, 8, 0), 8);
    /* chain 1 is on disk only now: saving it again stores nothing */
    ck_assert_uint_eq(present(&c, 1, 8, ids), 8);
    ck_assert(!kvd__cache_in_host(&c, ids[0]));
    ck_assert_uint_eq(save_chain(&c, 1, 8, 1), 0);
    check_chain_bytes(&c, 1, 8, 0);
    /* evict by key: both levels */
    kvdt_key_of(k, 2, 3);
    ck_assert_int_eq(kvd__cache_evict_key(&c, k, 12, &n), KVD_OK);
    ck_assert_uint_eq(n, 5);
    ck_assert_uint_eq(present(&c, 2, 8, NULL), 3);
    drain();
    kvd__cache_store_disk_stats(&c, &ds);
    ck_assert_uint_eq(ds.blocks, 11);
    /* clear: both levels */
    ck_assert_uint_eq(kvd__cache_clear(&c), 11);
    kvd__cache_store_disk_stats(&c, &ds);
    ck_assert_uint_eq(ds.blocks, 0);
    ck_assert_uint_eq(c.ready, 0);
    kvd__cache_store_deinit(&c);
    /* and after a restart nothing comes back */
    open_with(&c, &hm, 8, 100ull * 256, KVD_OK);
    ck_assert_uint_eq(c.ready, 0);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_held_disk_blocks_stay)
{
    /* a held block on disk only (a lease) stays through fills past both
     * budgets; once let go it may leave */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint32_t ids[4], ch;

    open_with(&c, &hm, 4, 40ull * 256, KVD_OK);
    ck_assert_uint_eq(save_chain(&c, 0, 4, 0), 4);
    ck_assert_uint_eq(save_chain(&c, 1, 4, 0), 4);
    ck_assert_uint_eq(present(&c, 0, 4, ids), 4);
    ck_assert(!kvd__cache_in_host(&c, ids[3]));
    for (uint32_t i = 0; i < 4; i++)
        kvd__cache_hold(&c, ids[i]);
    for (ch = 2; ch < 60; ch++)
        save_chain(&c, ch, 4, 0);
    check_chain_bytes(&c, 0, 4, 0);
    for (uint32_t i = 4; i-- > 0;)
        kvd__cache_unhold(&c, ids[i]);
    for (ch = 60; ch < 120; ch++)
        save_chain(&c, ch, 4, 0);
    ck_assert_uint_eq(present(&c, 0, 4, NULL), 0);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_disk_full_saves_go_on)
{
    /* a disk level full of held blocks: later blocks stay in host memory
     * only (counted), and saves go on, evicting them chain tails first */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    kvd__cache_disk_stats_t ds;
    uint32_t ids[4], ch;

    open_with(&c, &hm, 8, 4ull * 256, KVD_OK); /* 4 records */
    ck_assert_uint_eq(save_chain(&c, 0, 4, 0), 4);
    ck_assert_uint_eq(present(&c, 0, 4, ids), 4);
    for (uint32_t i = 0; i < 4; i++)
        kvd__cache_hold(&c, ids[i]);
    for (ch = 1; ch < 40; ch++)
        ck_assert_uint_eq(save_chain(&c, ch, 4, 0), 4);
    kvd__cache_store_disk_stats(&c, &ds);
    ck_assert_uint_eq(ds.blocks, 4);
    ck_assert_uint_ge(ds.no_space, 39 * 4);
    check_chain_bytes(&c, 39, 4, 0); /* the last chain whole, in host memory */
    check_chain_bytes(&c, 0, 4, 0);
    for (uint32_t i = 4; i-- > 0;)
        kvd__cache_unhold(&c, ids[i]);
    kvd__cache_store_deinit(&c);
}
END_TEST

/*
 * The plain model of the random test: for each chain, which of its keys
 * were last saved with which bytes (a generation) and nothing of the
 * store's structures.  After every step: each chain's present keys form a
 * prefix, each present block's bytes are the model's last saved ones, and
 * the levels keep their budgets.
 */
#define RCHAINS 40
#define RLEN 12

START_TEST(test_prefix_rule_random)
{
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    kvd__cache_disk_stats_t ds;
    uint32_t gen[RCHAINS][RLEN];
    uint32_t step, seed = 12345, disk_cap;

    memset(gen, 0, sizeof(gen));
    open_with(&c, &hm, 8, 90ull * 256, KVD_OK); /* 8 in host, 90 on disk */
    disk_cap = 90;
    for (step = 0; step < 1500; step++) {
        uint32_t ch, n, op, i, hits, ids[RLEN];
        uint8_t k[12];

        seed = seed * 1103515245u + 12345u;
        ch = (seed >> 8) % RCHAINS;
        n = 1 + (seed >> 16) % RLEN;
        op = (seed >> 4) % 10;
        if (op < 6) {
            uint32_t before = present(&c, ch, n, NULL);
            uint32_t stored = save_chain(&c, ch, n, step);
            for (i = before; i < before + stored; i++)
                gen[ch][i] = step;
        } else if (op < 8) {
            hits = present(&c, ch, n, ids);
            kvd__cache_touch_chain(&c, ids, hits);
            if (hits > 0) { /* read the last one back */
                uint8_t b[BLOCK];
                ck_assert_int_eq(bytes_of(&c, ids[hits - 1], b), KVD_OK);
                for (uint32_t j = 0; j < BLOCK; j++)
                    ck_assert_uint_eq(b[j], byte_of(ch, hits - 1, gen[ch][hits - 1], j));
            }
        } else if (op < 9) {
            uint32_t ev;
            kvdt_key_of(k, ch, n - 1);
            (void)kvd__cache_evict_key(&c, k, 12, &ev);
        } else {
            hits = present(&c, ch, n, ids);
            for (i = 0; i < hits; i++)
                kvd__cache_hold(&c, ids[i]);
            uint32_t x = (ch + 1) % RCHAINS, before = present(&c, x, RLEN, NULL);
            uint32_t stored = save_chain(&c, x, RLEN, step); /* a save while held */
            for (i = before; i < before + stored; i++)
                gen[x][i] = step;
            for (i = hits; i-- > 0;)
                kvd__cache_unhold(&c, ids[i]);
        }
        drain();
        /* the rules, from lookups and finds only */
        for (uint32_t x = 0; x < RCHAINS; x++) {
            uint32_t p = present(&c, x, RLEN, NULL);
            for (i = p; i < RLEN; i++) {
                uint32_t id;
                kvdt_key_of(k, x, i);
                id = kvd__cache_find(&c, k, 12);
                ck_assert_msg(id == KVD_CBLOCK_NONE ||
                                  kvd__cache_block(&c, id)->state != KVD_CBLOCK_READY,
                              "step %u: chain %u key %u present after a gap at %u", step, x, i,
                              p);
            }
        }
        kvd__cache_store_disk_stats(&c, &ds);
        ck_assert_uint_le(ds.blocks, disk_cap);
        ck_assert_uint_le(kvd__cache_host_blocks(&c), 8);
    }
    /* every present block, whatever its level, has its last saved bytes */
    for (uint32_t x = 0; x < RCHAINS; x++) {
        uint32_t ids[RLEN], p = present(&c, x, RLEN, ids);
        for (uint32_t i = 0; i < p; i++) {
            uint8_t b[BLOCK];
            ck_assert_int_eq(bytes_of(&c, ids[i], b), KVD_OK);
            for (uint32_t j = 0; j < BLOCK; j++)
                ck_assert_uint_eq(b[j], byte_of(x, i, gen[x][i], j));
        }
    }
    kvd__cache_store_disk_stats(&c, &ds);
    ck_assert_uint_gt(ds.evictions, 0);
    ck_assert_uint_gt(ds.spills, 0);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_restart_finds_blocks)
{
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    kvd__cache_disk_stats_t ds;
    uint32_t ch, ids[10];

    open_with(&c, &hm, 10, 200ull * 256, KVD_OK);
    for (ch = 0; ch < 12; ch++)
        ck_assert_uint_eq(save_chain(&c, ch, 10, 0), 10);
    kvd__cache_store_deinit(&c); /* flushes the writes queued */
    open_with(&c, &hm, 8, 200ull * 256, KVD_OK);
    ck_assert_uint_eq(c.ready, 120);
    ck_assert_uint_eq(kvd__cache_host_blocks(&c), 0);
    kvd__cache_store_disk_stats(&c, &ds);
    ck_assert_uint_eq(ds.blocks, 120);
    ck_assert_uint_eq(ds.budget, 200ull * 256);
    ck_assert_uint_eq(ds.used_bytes, 120ull * 256);
    for (ch = 0; ch < 12; ch++)
        check_chain_bytes(&c, ch, 10, 0);
    /* parents were linked: evicting a chain's first takes the whole chain */
    uint8_t k[12];
    uint32_t n;
    kvdt_key_of(k, 5, 0);
    ck_assert_int_eq(kvd__cache_evict_key(&c, k, 12, &n), KVD_OK);
    ck_assert_uint_eq(n, 10);
    ck_assert_uint_eq(present(&c, 5, 10, ids), 0);
    kvd__cache_store_deinit(&c);
    /* a smaller budget the next time: the least recently used go */
    open_with(&c, &hm, 8, 50ull * 256, KVD_OK);
    kvd__cache_store_disk_stats(&c, &ds);
    ck_assert_uint_le(ds.blocks, 50);
    for (ch = 0; ch < 12; ch++) {
        uint32_t p = present(&c, ch, 10, NULL);
        (void)p; /* a prefix by construction of lookups; bytes checked */
        if (p > 0) {
            uint32_t pids[10];
            uint8_t b[BLOCK];
            present(&c, ch, 10, pids);
            ck_assert_int_eq(bytes_of(&c, pids[p - 1], b), KVD_OK);
            ck_assert_uint_eq(b[0], byte_of(ch, p - 1, 0, 0));
        }
    }
    kvd__cache_store_deinit(&c);
}
END_TEST

static void on_append(void *arg, kvd_status_t st, kvd__disk_loc_t loc)
{
    (void)loc;
    *(kvd_status_t *)arg = st;
}

/* Key (ch, i) at klen bytes (KVDT_KEY or more: the rest a fixed pad). */
static void key_at(uint8_t *k, uint32_t ch, uint32_t i, size_t klen)
{
    memset(k, 0x5a, klen);
    kvdt_key_of(k, ch, i);
}

/* Records written with the disk store alone: keys (ch, i) of klen bytes
 * of chain ch with parent (ch, i - 1), except where orphan names a
 * missing parent. */
static void write_records_keys(uint32_t chains, uint32_t len, int orphan_at, uint32_t block,
                               size_t klen)
{
    kvd__block_layout_t l = kvdt_small_layout;
    char text[KVD_DISK_LAYOUT_TEXT], why[200];
    kvd__disk_store_config_t sc;
    kvd__disk_store_t *s;
    kvd_status_t *st = malloc(sizeof(*st) * chains * len);
    uint8_t *data = calloc((size_t)chains * len, block); /* kept until written */

    if (block != BLOCK) { /* tiny blocks: 1 token of block bytes */
        l.tokens_per_block = 1;
        l.token_bytes = block;
    }
    kvd__cache_layout_text(&l, text, sizeof(text));
    memset(&sc, 0, sizeof(sc));
    sc.dir = dir;
    sc.layout_id = kvd__cache_layout_id(&l);
    sc.layout_text = text;
    sc.block_bytes = block;
    sc.segment_bytes = 64u << 20;
    ck_assert_int_eq(kvd__disk_store_open(&s, &sc, io, NULL, NULL, why, sizeof(why)), KVD_OK);
    for (uint32_t ch = 0; ch < chains; ch++)
        for (uint32_t i = 0; i < len; i++) {
            uint8_t k[KVD_CACHE_KEY_MAX], p[KVD_CACHE_KEY_MAX];
            key_at(k, ch, i, klen);
            key_at(p, ch, i ? i - 1 : 0, klen);
            if (orphan_at >= 0 && ch == 0 && i == (uint32_t)orphan_at)
                key_at(p, 999999, 0, klen); /* a parent never written */
            uint8_t *d = data + ((size_t)ch * len + i) * block;
            for (uint32_t j = 0; j < block; j++)
                d[j] = byte_of(ch, i, 0, j);
            ck_assert_int_eq(kvd__disk_append(s, k, klen, i ? p : NULL, i ? klen : 0, d,
                                              on_append, &st[ch * len + i]),
                             KVD_OK);
            if ((ch * len + i) % 65536 == 65535)
                kvd__disk_io_poll(io);
        }
    kvd__disk_store_flush(s);
    drain();
    for (uint32_t i = 0; i < chains * len; i++)
        ck_assert_int_eq(st[i], KVD_OK);
    kvd__disk_store_close(&s);
    free(st);
    free(data);
}

static void write_records(uint32_t chains, uint32_t len, int orphan_at, uint32_t block)
{
    write_records_keys(chains, len, orphan_at, block, KVDT_KEY);
}

START_TEST(test_restart_orphans_dropped)
{
    /* chain 0's block 3 names a parent never written: it and the blocks
     * after it go; the rest is served */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    kvd__cache_disk_stats_t ds;

    write_records(4, 8, 3, BLOCK);
    open_with(&c, &hm, 8, 100ull * 256, KVD_OK);
    ck_assert_uint_eq(present(&c, 0, 8, NULL), 3);
    ck_assert_uint_eq(c.ready, 3 + 3 * 8);
    kvd__cache_store_disk_stats(&c, &ds);
    ck_assert_uint_eq(ds.blocks, 27);
    for (uint32_t ch = 1; ch < 4; ch++)
        check_chain_bytes(&c, ch, 8, 0);
    kvd__cache_store_deinit(&c);
    /* the dropped records stay dropped */
    open_with(&c, &hm, 8, 100ull * 256, KVD_OK);
    ck_assert_uint_eq(c.ready, 27);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_other_layout_skipped)
{
    /* records of another layout are not this cache's */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;

    write_records(2, 4, -1, 32);
    open_with(&c, &hm, 8, 100ull * 256, KVD_OK);
    ck_assert_uint_eq(c.ready, 0);
    kvd__cache_store_deinit(&c);
}
END_TEST

/* Flip one byte of the data of key (ch, i)'s record, found by its bytes. */
static void damage(uint32_t ch, uint32_t i)
{
    char cmd[700], path[600];
    uint8_t want[BLOCK];
    FILE *ls;

    for (uint32_t j = 0; j < BLOCK; j++)
        want[j] = byte_of(ch, i, 0, j);
    snprintf(cmd, sizeof(cmd), "ls '%s'/*.kvd", dir);
    ls = popen(cmd, "r");
    ck_assert_ptr_nonnull(ls);
    while (fgets(path, sizeof(path), ls) != NULL) {
        struct stat sb;
        uint8_t *m;
        int fd;

        path[strcspn(path, "\n")] = '\0';
        fd = open(path, O_RDWR);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(fstat(fd, &sb), 0);
        m = malloc(sb.st_size);
        ck_assert_int_eq(pread(fd, m, sb.st_size, 0), sb.st_size);
        for (off_t o = 0; o + BLOCK <= sb.st_size; o++)
            if (memcmp(m + o, want, BLOCK) == 0) {
                uint8_t x = m[o + 10] ^ 0x40;
                ck_assert_int_eq(pwrite(fd, &x, 1, o + 10), 1);
                free(m);
                close(fd);
                pclose(ls);
                return;
            }
        free(m);
        close(fd);
    }
    pclose(ls);
    ck_abort_msg("record not found");
}

START_TEST(test_damaged_record_missing)
{
    /* a record that fails its checks is missing, with every block after
     * it; counted; the others are served */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    kvd__cache_disk_stats_t ds;
    uint32_t ids[8];
    uint8_t b[BLOCK];

    write_records(3, 8, -1, BLOCK);
    damage(1, 4);
    open_with(&c, &hm, 8, 100ull * 256, KVD_OK);
    ck_assert_uint_eq(present(&c, 1, 8, ids), 8);
    ck_assert_int_eq(bytes_of(&c, ids[3], b), KVD_OK);
    ck_assert_int_eq(bytes_of(&c, ids[4], b), KVD_EIO);
    ck_assert_uint_eq(present(&c, 1, 8, NULL), 4);
    kvd__cache_store_disk_stats(&c, &ds);
    ck_assert_uint_eq(ds.checksum_failures, 1);
    ck_assert_uint_eq(ds.blocks, 20);
    check_chain_bytes(&c, 0, 8, 0);
    check_chain_bytes(&c, 2, 8, 0);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_abort_after_subtree_dropped)
{
    /* a filling block under a parent whose read then fails leaves the
     * index with the parent's subtree; its save's abort, which may come
     * while another hold (its early write) keeps it, leaves the index as
     * it is: the same key, saved again since, stays found */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint32_t ids[8], child, again, indexed;
    uint8_t k[16], b[BLOCK];
    char why[200];

    write_records(3, 8, -1, BLOCK);
    damage(1, 4);
    open_with(&c, &hm, 8, 100ull * 256, KVD_OK);
    ck_assert_uint_eq(present(&c, 1, 8, ids), 8);
    memset(k, 0x77, sizeof(k));
    ck_assert_int_eq(kvd__cache_reserve(&c, ids[4], k, sizeof(k), &child, why, sizeof(why)),
                     KVD_OK);
    memset(kvd__cache_block_bytes(&c, child), 0x77, BLOCK);
    kvd__cache_hold(&c, child); /* as its early write holds it */
    ck_assert_int_eq(bytes_of(&c, ids[4], b), KVD_EIO);
    ck_assert_uint_eq(kvd__cache_find(&c, k, sizeof(k)), KVD_CBLOCK_NONE);
    ck_assert_int_eq(kvd__cache_reserve(&c, ids[3], k, sizeof(k), &again, why, sizeof(why)),
                     KVD_OK);
    memset(kvd__cache_block_bytes(&c, again), 0x78, BLOCK);
    ck_assert_int_eq(kvd__cache_commit(&c, again), 1);
    indexed = c.indexed;
    kvd__cache_abort(&c, child); /* the first save ends */
    ck_assert_uint_eq(c.indexed, indexed);
    ck_assert_uint_eq(kvd__cache_find(&c, k, sizeof(k)), again);
    kvd__cache_unhold(&c, child); /* the write ends: the dead block goes */
    ck_assert_uint_eq(c.indexed, indexed);
    ck_assert_int_eq(bytes_of(&c, again, b), KVD_OK);
    ck_assert_uint_eq(b[0], 0x78);
    kvd__cache_disk_flush(&c);
    drain();
    kvd__cache_store_deinit(&c);
    ck_assert_uint_eq(hm.used[KVD_HM_CACHE] + hm.used[KVD_HM_CACHE_INDEX], 0);
}
END_TEST

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

START_TEST(test_restart_million_blocks)
{
    /* 1,000,000 blocks on disk (chains of 100) of 32-byte keys, as engines
     * name blocks: lookups within 3 s, and the index at most 100 bytes a
     * block (entries, keys, disk parts, table; with a host level of 1,024
     * slots made, whose host list parts add 0.01) */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    kvd__cache_disk_config_t cfg;
    kvd__block_layout_t l = kvdt_small_layout;
    char why[200];
    double t, per_block;
    uint8_t keys[100][32];
    const uint8_t *kp[100];
    size_t lens[100];
    uint32_t id;

    write_records_keys(10000, 100, -1, 1, 32);
    l.tokens_per_block = 1;
    l.token_bytes = 1;
    kvd__hostmem_init(&hm, 1ull << 30);
    cfg.dir = dir;
    cfg.budget = 1ull << 30;
    cfg.io = io;
    t = now_s();
    ck_assert_int_eq(kvd__cache_store_init(&c, &l, 1024, &hm, &kvdt_malloc_mem, why, sizeof(why)),
                     KVD_OK);
    ck_assert_int_eq(kvd__cache_store_open_disk(&c, &cfg, why, sizeof(why)), KVD_OK);
    for (uint32_t i = 0; i < 100; i++) {
        key_at(keys[i], 7777, i, 32);
        kp[i] = keys[i];
        lens[i] = 32;
    }
    ck_assert_uint_eq(kvd__cache_lookup(&c, kp, lens, 100, 1, NULL), 100);
    t = now_s() - t;
    ck_assert_uint_eq(c.ready, 1000000);
    ck_assert_msg(t < 3.0 * kvt_time_scale(),
                  "serving lookups took %.2f s after a restart (bound %d x 3 s)", t,
                  kvt_time_scale());
    /* the host level made whole: 1,024 blocks read into host memory */
    for (uint32_t i = 0; i < 1024; i++) {
        key_at(keys[0], i, 0, 32);
        ck_assert_uint_ne(id = kvd__cache_find(&c, keys[0], 32), KVD_CBLOCK_NONE);
        ck_assert_int_eq(kvd__cache_fetch(&c, id, on_fetch, NULL, why, sizeof(why)), KVD_OK);
        drain();
        kvd__disk_io_poll(io);
    }
    ck_assert_uint_eq(kvd__cache_host_blocks(&c), 1024);
    per_block = (double)hm.used[KVD_HM_CACHE_INDEX] / c.ready;
    ck_assert_msg(per_block <= 100.0, "%.1f bytes a block beyond its data", per_block);
    fprintf(stderr, "restart of 1000000 blocks: %.2f s; %.1f bytes a block beyond its data\n",
            t, per_block);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_bad_config)
{
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    kvd__cache_disk_config_t cfg = {.dir = dir, .budget = 1, .io = io};
    char why[200];

    open_with(&c, &hm, 8, 100ull * 256, KVD_OK);
    /* once only */
    ck_assert_int_eq(kvd__cache_store_open_disk(&c, &cfg, why, sizeof(why)), KVD_EINVAL);
    kvd__cache_store_deinit(&c);
    /* a budget below one record */
    open_with(&c, &hm, 8, 100, KVD_ERANGE);
    kvd__cache_store_disk_stats(&c, &(kvd__cache_disk_stats_t){0});
    ck_assert_ptr_null(c.disk);
    kvd__cache_store_deinit(&c);
    /* a directory others may write */
    ck_assert_int_eq(chmod(dir, 0777), 0);
    open_with(&c, &hm, 8, 100ull * 256, KVD_EPERM);
    ck_assert_int_eq(chmod(dir, 0700), 0);
    kvd__cache_store_deinit(&c);
}
END_TEST

/* Blocks of keys of width from 12 to 64 bytes across a restart: the
 * keys found widen the store as they come, and every chain is whole. */
START_TEST(test_restart_key_widths)
{
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint8_t k[64];
    uint32_t ch, id, parent = KVD_CBLOCK_NONE, n;
    static const uint32_t lens[] = {40, 64, 12};
    char why[200];

    open_with(&c, &hm, 40, 200ull * 256, KVD_OK);
    for (ch = 0; ch < 3; ch++)
        ck_assert_uint_eq(save_chain(&c, ch, 10, 0), 10);
    ck_assert_uint_eq(c.key_width, 16);
    for (uint32_t j = 0; j < 3; j++) {
        memset(k, 0x50 + (int)j, sizeof(k));
        ck_assert_int_eq(kvd__cache_reserve(&c, parent, k, lens[j], &id, why, sizeof(why)),
                         KVD_OK);
        memset(kvd__cache_block_bytes(&c, id), 0x50 + (int)j, BLOCK);
        ck_assert_int_eq(kvd__cache_commit(&c, id), 1);
        parent = id;
    }
    ck_assert_uint_eq(c.key_width, 64);
    kvd__cache_disk_flush(&c);
    drain();
    kvd__cache_store_deinit(&c);

    open_with(&c, &hm, 40, 200ull * 256, KVD_OK);
    ck_assert_uint_eq(c.ready, 33);
    ck_assert_uint_eq(c.key_width, 64);
    for (ch = 0; ch < 3; ch++)
        check_chain_bytes(&c, ch, 10, 0);
    for (uint32_t j = 0; j < 3; j++) {
        uint8_t b[BLOCK];

        memset(k, 0x50 + (int)j, sizeof(k));
        id = kvd__cache_find(&c, k, lens[j]);
        ck_assert_uint_ne(id, KVD_CBLOCK_NONE);
        ck_assert_int_eq(bytes_of(&c, id, b), KVD_OK);
        ck_assert_uint_eq(b[BLOCK - 1], 0x50 + j);
    }
    memset(k, 0x50, sizeof(k)); /* the long chain's parents were linked */
    ck_assert_int_eq(kvd__cache_evict_key(&c, k, 40, &n), KVD_OK);
    ck_assert_uint_eq(n, 3);
    kvd__cache_store_deinit(&c);
    ck_assert_uint_eq(hm.used[KVD_HM_CACHE] + hm.used[KVD_HM_CACHE_INDEX], 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cache_disk");
    TCase *t = tcase_create("two_levels");

    tcase_add_checked_fixture(t, setup, teardown);
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_spill_and_reload);
    tcase_add_test(t, test_streamed_chain_in_order);
    tcase_add_test(t, test_extended_chain_in_order);
    tcase_add_test(t, test_touch_moves_once);
    tcase_add_test(t, test_touch_while_writing);
    tcase_add_test(t, test_many_reads_in_flight);
    tcase_add_test(t, test_dedup_evict_clear);
    tcase_add_test(t, test_held_disk_blocks_stay);
    tcase_add_test(t, test_disk_full_saves_go_on);
    tcase_add_test(t, test_prefix_rule_random);
    tcase_add_test(t, test_restart_finds_blocks);
    tcase_add_test(t, test_restart_orphans_dropped);
    tcase_add_test(t, test_other_layout_skipped);
    tcase_add_test(t, test_damaged_record_missing);
    tcase_add_test(t, test_abort_after_subtree_dropped);
    tcase_add_test(t, test_restart_key_widths);
    tcase_add_test(t, test_restart_million_blocks);
    tcase_add_test(t, test_bad_config);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    int failed;

    srunner_run_all(r, CK_NORMAL);
    failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
