/*
 * check_cache: the cache tier's store (daemon/cache.c) on its own, against
 * a plain model: the index finds exactly what was stored through many
 * inserts and deletions; eviction keeps every chain a prefix and the
 * budget; held blocks and parents stay; failed saves leave nothing;
 * explicit eviction takes a whole subtree or nothing; the next slab is
 * allocated ahead, used when ready, and given back whatever comes first;
 * keys take the width of the longest seen.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache_harness.h"

/* A cache of cap blocks of 64 bytes (1 layer, MLA, 4 tokens of 16 bytes)
 * from mem, in a host-memory budget of hm_budget. */
static void make_with(kvd__cache_store_t *c, kvd__hostmem_t *hm, uint32_t cap, uint64_t hm_budget,
                      const kvd__cache_mem_t *mem)
{
    char why[200];

    kvd__hostmem_init(hm, hm_budget);
    ck_assert_int_eq(kvd__cache_store_init(c, &kvdt_small_layout, (uint64_t)cap * KVDT_BLOCK, hm,
                                           mem, why, sizeof(why)),
                     KVD_OK);
    ck_assert_uint_eq(c->capacity, cap);
}

static void make(kvd__cache_store_t *c, kvd__hostmem_t *hm, uint32_t cap)
{
    make_with(c, hm, cap, 1ull << 30, &kvdt_malloc_mem);
}

static void fill_same(uint8_t *bytes, uint32_t ch, uint32_t i, void *ctx)
{
    (void)ctx;
    memset(bytes, (int)(ch + i), KVDT_BLOCK);
}

/* Save chain ch's keys [0, n): what a save does with the store. */
static uint32_t save_chain(kvd__cache_store_t *c, uint32_t ch, uint32_t n)
{
    return kvdt_save_chain(c, ch, n, fill_same, NULL, 0);
}

/* How many leading keys of chain ch the store reports (ready), by lookup:
 * for the hand-worked cases below; the random ones check against model_t. */
static uint32_t present(kvd__cache_store_t *c, uint32_t ch, uint32_t n)
{
    return kvdt_present(c, ch, n, NULL);
}

/*
 * A plain model of the store, from the rules in cache.h and none of
 * cache.c's structures: the chains of save_chain (block i's parent is
 * block i-1 of the same chain), how many blocks of each are present and
 * when each was last used.  A save holds the chain's blocks it meets,
 * adds the missing ones (evicting when the cache is full) and lets go of
 * them from the last to the first, so each is then used and the first the
 * most recently.  A lookup with touch uses the blocks it found the same
 * way.  Eviction takes the least recently used block that is not held and
 * that no present block names as parent: the last present block of a
 * chain other than the one being saved.
 */
typedef struct model {
    uint32_t chains, maxlen, cap, count;
    uint64_t clock;
    uint32_t *len;  /* chain ch's present blocks are its first len[ch] */
    uint64_t *used; /* [ch * maxlen + i]: when block i of chain ch was last used */
} model_t;

static void model_init(model_t *m, uint32_t chains, uint32_t maxlen, uint32_t cap)
{
    m->chains = chains;
    m->maxlen = maxlen;
    m->cap = cap;
    m->count = 0;
    m->clock = 0;
    m->len = calloc(chains, sizeof(*m->len));
    m->used = calloc((size_t)chains * maxlen, sizeof(*m->used));
    ck_assert(m->len != NULL && m->used != NULL);
}

static void model_free(model_t *m)
{
    free(m->len);
    free(m->used);
}

/* Evict for a save of chain busy: 0 when nothing may go. */
static int model_evict(model_t *m, uint32_t busy)
{
    uint32_t ch, victim = UINT32_MAX;
    uint64_t oldest = UINT64_MAX;

    for (ch = 0; ch < m->chains; ch++) {
        uint64_t t;

        if (ch == busy || m->len[ch] == 0)
            continue;
        t = m->used[(size_t)ch * m->maxlen + m->len[ch] - 1];
        if (t < oldest) {
            oldest = t;
            victim = ch;
        }
    }
    if (victim == UINT32_MAX)
        return 0;
    m->len[victim]--;
    m->count--;
    return 1;
}

/* Use the first n blocks of chain ch, the last first. */
static void model_touch(model_t *m, uint32_t ch, uint32_t n)
{
    while (n-- > 0)
        m->used[(size_t)ch * m->maxlen + n] = ++m->clock;
}

/* A save of chain ch's first n blocks: how many it stored. */
static uint32_t model_save(model_t *m, uint32_t ch, uint32_t n)
{
    uint32_t stored = 0;

    ck_assert_uint_le(n, m->maxlen);
    while (m->len[ch] < n) {
        if (m->count == m->cap && !model_evict(m, ch))
            break;
        m->len[ch]++;
        m->count++;
        stored++;
    }
    model_touch(m, ch, n < m->len[ch] ? n : m->len[ch]);
    return stored;
}

/* A lookup of chain ch's first n keys: the hits. */
static uint32_t model_lookup(model_t *m, uint32_t ch, uint32_t n, int touch)
{
    uint32_t h = n < m->len[ch] ? n : m->len[ch];

    if (touch)
        model_touch(m, ch, h);
    return h;
}

/* Every key of every chain is in the store exactly when the model has it,
 * with its own bytes. */
static void model_check(const model_t *m, kvd__cache_store_t *c)
{
    uint8_t k[12];

    ck_assert_uint_eq(c->ready, m->count);
    for (uint32_t ch = 0; ch < m->chains; ch++)
        for (uint32_t i = 0; i < m->maxlen; i++) {
            uint32_t id;

            kvdt_key_of(k, ch, i);
            id = kvd__cache_find(c, k, 12);
            if (i >= m->len[ch]) {
                ck_assert_msg(id == KVD_CBLOCK_NONE,
                              "chain %u block %u is in the store; the model has %u blocks", ch,
                              i, m->len[ch]);
                continue;
            }
            ck_assert_msg(id != KVD_CBLOCK_NONE,
                          "chain %u block %u is not in the store; the model has %u blocks", ch,
                          i, m->len[ch]);
            ck_assert_int_eq(kvd__cache_block(c, id)->state, KVD_CBLOCK_READY);
            ck_assert_int_eq(((uint8_t *)kvd__cache_block_bytes(c, id))[7], (uint8_t)(ch + i));
        }
}

START_TEST(test_prefixes_under_pressure)
{
    /* fill a cache of 500 blocks ten times over with random chains: the
     * store holds exactly the model's blocks after every save (so each
     * chain's present blocks form a prefix, the least recently used go
     * first), and the budget holds */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    model_t m;
    enum { CHAINS = 400, MAXLEN = 40 };
    uint32_t len[CHAINS], ch, i, round;
    unsigned seed = 12345;
    uint8_t k[12];

    make(&c, &hm, 500);
    model_init(&m, CHAINS, MAXLEN, 500);
    for (ch = 0; ch < CHAINS; ch++)
        len[ch] = 1 + (uint32_t)(rand_r(&seed) % MAXLEN);
    for (round = 0; round < 1000; round++) {
        ch = (uint32_t)(rand_r(&seed) % CHAINS);
        ck_assert_uint_eq(save_chain(&c, ch, len[ch]), model_save(&m, ch, len[ch]));
        ck_assert_uint_eq(c.ready, m.count);
        for (i = 0; i < MAXLEN; i++) { /* the saved chain, key by key */
            kvdt_key_of(k, ch, i);
            ck_assert_int_eq(kvd__cache_find(&c, k, 12) != KVD_CBLOCK_NONE, i < m.len[ch]);
        }
        /* slabs and free lists of 500 blocks, entries (and their 16-byte
         * key room for keys of 12) in chunks of 64, 64, 128 and 256, the
         * table */
        ck_assert_uint_eq(kvd__cache_entry_bytes(&c), sizeof(kvd__cblock_t) + 16);
        ck_assert_uint_le(c.held_bytes, 500 * (64 + 4) + 512 * kvd__cache_entry_bytes(&c) + 8192);
        if (round % 100 == 99)
            model_check(&m, &c);
    }
    ck_assert_uint_gt(c.n.evictions, 5000);
    model_check(&m, &c);
    model_free(&m);
    kvd__cache_store_deinit(&c);
    ck_assert_uint_eq(hm.used[KVD_HM_CACHE], 0);
}
END_TEST

/* The recency list is whole: linked both ways, every member READY, unheld
 * and marked, and as long as the marks say. */
static void check_lru(const kvd__cache_store_t *c)
{
    uint32_t n = 0, marked = 0, prev = 0, i;

    for (uint32_t at = c->lru.head; at; at = kvd__cache_block(c, at - 1)->lru.next) {
        const kvd__cblock_t *b = kvd__cache_block(c, at - 1);
        ck_assert_uint_eq(b->lru.prev, prev);
        ck_assert(b->lists & KVD_CLIST_LRU);
        ck_assert_int_eq(b->state, KVD_CBLOCK_READY);
        ck_assert_uint_eq(b->holds, 0);
        prev = at;
        ck_assert_uint_le(++n, c->capacity);
    }
    ck_assert_uint_eq(c->lru.tail, prev);
    for (i = 0; i < c->ents_made; i++)
        marked += (kvd__cache_block(c, i)->lists & KVD_CLIST_LRU) != 0;
    ck_assert_uint_eq(marked, n);
}

START_TEST(test_lookups_touch_chains)
{
    /* lookups of whole chains and of prefixes, with touches, mixed with
     * saves under pressure: the recency list stays whole, a chain just
     * looked up is the last to go, and saves and lookups agree with the
     * model (which blocks were evicted follows from when each was used) */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint8_t keys[40][12];
    const uint8_t *kp[40];
    size_t kl[40];
    uint32_t ids[40], step;
    unsigned seed = 5;
    model_t m;

    make(&c, &hm, 120);
    model_init(&m, 12, 40, 120);
    for (step = 0; step < 3000; step++) {
        uint32_t ch = (uint32_t)(rand_r(&seed) % 12), n = 1 + (uint32_t)(rand_r(&seed) % 40), h;

        if (rand_r(&seed) % 3 == 0) {
            ck_assert_uint_eq(save_chain(&c, ch, n), model_save(&m, ch, n));
        } else {
            for (uint32_t i = 0; i < n; i++) {
                kvdt_key_of(keys[i], ch, i);
                kp[i] = keys[i];
                kl[i] = 12;
            }
            h = kvd__cache_lookup(&c, kp, kl, n, 1, ids);
            ck_assert_uint_eq(h, model_lookup(&m, ch, n, 1));
            for (uint32_t i = 0; i < h; i++) /* each hit is that key's block */
                ck_assert_int_eq(((uint8_t *)kvd__cache_block_bytes(&c, ids[i]))[7],
                                 (uint8_t)(ch + i));
            if (h > 0) /* its first block is now the most recent */
                ck_assert_uint_eq(c.lru.head, ids[0] + 1);
        }
        check_lru(&c);
        ck_assert_uint_eq(c.ready, m.count);
    }
    model_check(&m, &c);
    model_free(&m);
    kvd__cache_store_deinit(&c);
}
END_TEST

/* Whether ids[0..n) are consecutive blocks lying in that order in the
 * recency list, none held: what kvd__cache_lookup_blob reports as linked,
 * read from the store's links. */
static int linked_in_store(kvd__cache_store_t *c, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const kvd__cblock_t *b = kvd__cache_block(c, ids[i]);

        if ((i > 0 && ids[i] != ids[i - 1] + 1) || !(b->lists & KVD_CLIST_LRU) || b->holds != 0 ||
            (i + 1 < n && b->lru.next != ids[i + 1] + 1))
            return 0;
    }
    return 1;
}

START_TEST(test_lookup_blob)
{
    /* a lookup of keys back to back finds what one of a list finds, says
     * linked exactly when the hits lie as one piece in the recency list,
     * and touching them as a run does what touching the chain does; over
     * chains saved whole, in prefixes and after evictions (runs broken
     * and across the entries' chunks), with the model's saves and touches */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    enum { CHAINS = 16, LEN = 100, CAP = 700 };
    static uint8_t blob[LEN * 12];
    uint8_t keys[LEN][12];
    const uint8_t *kp[LEN];
    size_t kl[LEN];
    uint32_t ids[LEN], ids2[LEN], step, nlinked = 0, nbroken = 0;
    unsigned seed = 17;
    model_t m;

    make(&c, &hm, CAP);
    model_init(&m, CHAINS, LEN, CAP);
    for (step = 0; step < 1500; step++) {
        uint32_t ch = (uint32_t)(rand_r(&seed) % CHAINS), n = 1 + (uint32_t)(rand_r(&seed) % LEN);
        uint32_t h, h2;
        int linked = -1;

        if (rand_r(&seed) % 3 == 0) {
            ck_assert_uint_eq(save_chain(&c, ch, n), model_save(&m, ch, n));
            continue;
        }
        for (uint32_t i = 0; i < n; i++) {
            kvdt_key_of(keys[i], ch, i);
            memcpy(blob + i * 12, keys[i], 12);
            kp[i] = keys[i];
            kl[i] = 12;
        }
        h = kvd__cache_lookup(&c, kp, kl, n, 0, ids);
        h2 = kvd__cache_lookup_blob(&c, blob, 12, n, ids2, &linked);
        ck_assert_uint_eq(h2, h);
        ck_assert_uint_eq(kvd__cache_lookup_blob(&c, blob, 12, n, NULL, NULL), h);
        ck_assert(memcmp(ids2, ids, h * sizeof(*ids)) == 0);
        ck_assert_int_eq(linked, linked_in_store(&c, ids, h));
        ck_assert_uint_eq(h, model_lookup(&m, ch, n, 1));
        if (linked) {
            nlinked += h > 1;
            kvd__cache_touch_run(&c, ids[0], h);
        } else {
            nbroken++;
            kvd__cache_touch_chain(&c, ids, h);
        }
        if (h > 0) {
            ck_assert_uint_eq(c.lru.head, ids[0] + 1);
            /* a chain just touched as a whole is linked */
            ck_assert_uint_eq(kvd__cache_lookup_blob(&c, blob, 12, n, ids2, &linked), h);
            ck_assert_int_eq(linked, linked_in_store(&c, ids, h));
        }
        if (step % 16 == 0) /* it asserts per entry: not at every step */
            check_lru(&c);
    }
    check_lru(&c);
    ck_assert_uint_gt(nlinked, 30); /* both ways were taken */
    ck_assert_uint_gt(nbroken, 30);
    model_check(&m, &c);
    model_free(&m);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_lookup_blob_held)
{
    /* a held block in a chain's hits makes it not linked (touching moves
     * no held block); a key of another width, or one that differs, ends
     * the hits */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint8_t blob[10 * 12];
    uint32_t ids[10];
    int linked = -1;

    make(&c, &hm, 64);
    ck_assert_uint_eq(save_chain(&c, 3, 10), 10);
    for (uint32_t i = 0; i < 10; i++)
        kvdt_key_of(blob + i * 12, 3, i);
    ck_assert_uint_eq(kvd__cache_lookup_blob(&c, blob, 12, 10, ids, &linked), 10);
    kvd__cache_touch_chain(&c, ids, 10);
    ck_assert_uint_eq(kvd__cache_lookup_blob(&c, blob, 12, 10, ids, &linked), 10);
    ck_assert_int_eq(linked, 1);
    kvd__cache_hold(&c, ids[6]);
    ck_assert_uint_eq(kvd__cache_lookup_blob(&c, blob, 12, 10, ids, &linked), 10);
    ck_assert_int_eq(linked, 0);
    ck_assert_uint_eq(kvd__cache_lookup_blob(&c, blob, 12, 6, ids, &linked), 6);
    ck_assert_int_eq(linked, 1);
    kvd__cache_unhold(&c, ids[6]);
    blob[7 * 12 + 11] ^= 1;
    ck_assert_uint_eq(kvd__cache_lookup_blob(&c, blob, 12, 10, ids, &linked), 7);
    ck_assert_uint_eq(kvd__cache_lookup_blob(&c, blob, 6, 20, ids, &linked), 0);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_lookup_blob_changing)
{
    /* keys in memory another process changes while they are read (a
     * client's key area): every answer is one some keys could give (a
     * prefix of hits, each a ready block), and the store stays whole
     * through the touches that follow */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    enum { N = 200 };
    uint8_t *blob = mmap(NULL, N * 12, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    uint32_t ids[N], full = 0, part = 0, bad = 0;
    pid_t child;
    int linked;

    ck_assert_ptr_ne(blob, MAP_FAILED);
    make(&c, &hm, 256);
    ck_assert_uint_eq(save_chain(&c, 4, N), N);
    for (uint32_t i = 0; i < N; i++)
        kvdt_key_of(blob + i * 12, 4, i);
    child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) { /* flips bytes of keys, each back again soon */
        volatile uint8_t *v = blob;
        unsigned seed = 3;

        for (;;) {
            uint32_t at = (uint32_t)(rand_r(&seed) % (N * 12));
            v[at] ^= 0x40;
            for (volatile int spin = 0; spin < 2000; spin++)
                ;
            v[at] ^= 0x40;
            for (volatile int spin = 0; spin < 2000; spin++)
                ;
        }
    }
    /* until both kinds of answer have come, the child running alongside */
    for (int round = 0; round < 5000 || ((full == 0 || part == 0) && round < 2000000); round++) {
        uint32_t h = kvd__cache_lookup_blob(&c, blob, 12, N, ids, &linked);

        bad += h > N;
        for (uint32_t i = 0; i < h && i < N; i++) /* a flip may name another key */
            bad += ids[i] >= c.ents_made ||
                   kvd__cache_block(&c, ids[i])->state != KVD_CBLOCK_READY;
        if (linked)
            kvd__cache_touch_run(&c, h ? ids[0] : 0, h);
        else
            kvd__cache_touch_chain(&c, ids, h);
        full += h == N;
        part += h < N;
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    ck_assert_uint_eq(bad, 0);
    check_lru(&c);
    ck_assert_uint_gt(full, 0);
    ck_assert_uint_gt(part, 0);
    munmap(blob, N * 12);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_index_model)
{
    /* many inserts and deletions: the table finds exactly the model's keys */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    enum { N = 3000 };
    static uint8_t in[N];
    uint32_t ids[N], i, step;
    unsigned seed = 99;
    char why[200];
    uint8_t k[12];

    make(&c, &hm, N);
    memset(in, 0, sizeof(in));
    for (step = 0; step < 40000; step++) {
        i = (uint32_t)(rand_r(&seed) % N);
        kvdt_key_of(k, 7, i);
        if (!in[i]) {
            ck_assert_int_eq(kvd__cache_reserve(&c, KVD_CBLOCK_NONE, k, 12, &ids[i], why,
                                                sizeof(why)), KVD_OK);
            kvd__cache_commit(&c, ids[i]);
            in[i] = 1;
        } else {
            uint32_t ev = 0;
            ck_assert_int_eq(kvd__cache_evict_key(&c, k, 12, &ev), KVD_OK);
            ck_assert_uint_eq(ev, 1);
            in[i] = 0;
        }
    }
    for (i = 0; i < N; i++) {
        kvdt_key_of(k, 7, i);
        if (in[i])
            ck_assert_uint_eq(kvd__cache_find(&c, k, 12), ids[i]);
        else
            ck_assert_uint_eq(kvd__cache_find(&c, k, 12), KVD_CBLOCK_NONE);
    }
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_holds_and_full)
{
    /* held blocks are never evicted; with every block held, reserve says
     * EBUSY and changes nothing */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint32_t ids[8], id, i;
    uint8_t k[12];
    char why[200];

    make(&c, &hm, 8);
    ck_assert_uint_eq(save_chain(&c, 1, 8), 8);
    for (i = 0; i < 8; i++) {
        kvdt_key_of(k, 1, i);
        ids[i] = kvd__cache_find(&c, k, 12);
        kvd__cache_hold(&c, ids[i]);
    }
    kvdt_key_of(k, 2, 0);
    ck_assert_int_eq(kvd__cache_reserve(&c, KVD_CBLOCK_NONE, k, 12, &id, why, sizeof(why)),
                     KVD_EBUSY);
    ck_assert_uint_eq(present(&c, 1, 8), 8);
    ck_assert_uint_eq(c.indexed, 8);
    /* released from the last: the chain's tail goes first */
    for (i = 8; i-- > 0;)
        kvd__cache_unhold(&c, ids[i]);
    ck_assert_int_eq(kvd__cache_reserve(&c, KVD_CBLOCK_NONE, k, 12, &id, why, sizeof(why)),
                     KVD_OK);
    ck_assert_uint_eq(present(&c, 1, 8), 7);
    /* not visible while filling; gone without a trace when its save fails */
    ck_assert_uint_eq(present(&c, 2, 1), 0);
    ck_assert_uint_ne(kvd__cache_find(&c, k, 12), KVD_CBLOCK_NONE);
    kvd__cache_abort(&c, id);
    ck_assert_uint_eq(kvd__cache_find(&c, k, 12), KVD_CBLOCK_NONE);
    ck_assert_uint_eq(c.nfree, 1);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_evict_subtree_and_clear)
{
    /* two chains sharing a prefix: evicting the shared block takes both
     * tails; a held block in the subtree stops it all */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint32_t ev = 0, a, b, id, i;
    uint8_t k[12], k2[12];
    char why[200];

    make(&c, &hm, 64);
    ck_assert_uint_eq(save_chain(&c, 1, 6), 6);
    /* chain 1's first 3 blocks, then a branch of 3 more under them */
    kvdt_key_of(k, 1, 2);
    a = kvd__cache_find(&c, k, 12);
    for (i = 0, b = a; i < 3; i++) {
        kvdt_key_of(k2, 9, i);
        ck_assert_int_eq(kvd__cache_reserve(&c, b, k2, 12, &id, why, sizeof(why)), KVD_OK);
        kvd__cache_commit(&c, id);
        b = id;
    }
    ck_assert_uint_eq(c.ready, 9);
    kvd__cache_hold(&c, b);
    ck_assert_int_eq(kvd__cache_evict_key(&c, k, 12, &ev), KVD_EBUSY);
    ck_assert_uint_eq(c.ready, 9);
    kvd__cache_unhold(&c, b);
    ck_assert_int_eq(kvd__cache_evict_key(&c, k, 12, &ev), KVD_OK);
    ck_assert_uint_eq(ev, 7); /* block 2, chain 1's 3..5, the branch's 3 */
    ck_assert_uint_eq(present(&c, 1, 6), 2);
    ck_assert_int_eq(kvd__cache_evict_key(&c, k, 12, &ev), KVD_ENOENT);
    ck_assert_uint_eq(kvd__cache_clear(&c), 2);
    ck_assert_uint_eq(c.ready, 0);
    ck_assert_uint_eq(c.nslabs, 0);
    ck_assert_uint_eq(c.nchunks, 1); /* entries stay made (and charged) for reuse */
    ck_assert_uint_eq(c.held_bytes, 64 * sizeof(uint64_t) + 64 * kvd__cache_entry_bytes(&c));
    ck_assert_uint_eq(save_chain(&c, 3, 5), 5); /* and it grows again */
    kvd__cache_store_deinit(&c);
    ck_assert_uint_eq(hm.used[KVD_HM_CACHE], 0);
}
END_TEST

START_TEST(test_failed_save_under_another)
{
    /* save A reserves a chain; save B finds it filling, holds it and
     * chains a block onto it; A fails: its blocks leave the index at once
     * (a third save may store the keys again), B's block goes when B
     * commits, and every entry is free once B lets go */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint32_t a[3], b3, id, i;
    uint8_t k[12];
    char why[200];

    make(&c, &hm, 16);
    for (i = 0; i < 3; i++) {
        kvdt_key_of(k, 1, i);
        ck_assert_int_eq(kvd__cache_reserve(&c, i ? a[i - 1] : KVD_CBLOCK_NONE, k, 12, &a[i],
                                            why, sizeof(why)),
                         KVD_OK);
    }
    for (i = 0; i < 3; i++) { /* B: present, filling */
        kvdt_key_of(k, 1, i);
        ck_assert_uint_eq(kvd__cache_find(&c, k, 12), a[i]);
        kvd__cache_hold(&c, a[i]);
    }
    kvdt_key_of(k, 1, 3);
    ck_assert_int_eq(kvd__cache_reserve(&c, a[2], k, 12, &b3, why, sizeof(why)), KVD_OK);
    for (i = 3; i-- > 0;) /* A fails */
        kvd__cache_abort(&c, a[i]);
    for (i = 0; i < 3; i++) {
        kvdt_key_of(k, 1, i);
        ck_assert_uint_eq(kvd__cache_find(&c, k, 12), KVD_CBLOCK_NONE);
        ck_assert_int_eq(kvd__cache_block(&c, a[i])->state, KVD_CBLOCK_DEAD);
    }
    kvdt_key_of(k, 1, 0); /* a third save stores the first key anew */
    ck_assert_int_eq(kvd__cache_reserve(&c, KVD_CBLOCK_NONE, k, 12, &id, why, sizeof(why)),
                     KVD_OK);
    ck_assert_int_eq(kvd__cache_commit(&c, id), 1);
    ck_assert_int_eq(kvd__cache_commit(&c, b3), 0); /* its parent failed */
    kvdt_key_of(k, 1, 3);
    ck_assert_uint_eq(kvd__cache_find(&c, k, 12), KVD_CBLOCK_NONE);
    for (i = 3; i-- > 0;)
        kvd__cache_unhold(&c, a[i]);
    for (i = 0; i < 3; i++)
        ck_assert_int_eq(kvd__cache_block(&c, a[i])->state, KVD_CBLOCK_FREE);
    ck_assert_uint_eq(c.indexed, 1);
    ck_assert_uint_eq(c.ready, 1);
    ck_assert_uint_eq(present(&c, 1, 4), 1);
    kvd__cache_store_deinit(&c);
}
END_TEST

START_TEST(test_budget_refused)
{
    /* the host-memory budget refuses a slab: eviction makes room instead,
     * and a cache with nothing to evict says so */
    kvd__cache_store_t c;
    kvd__block_layout_t l = {2, 0, 16, 1024, "bf16"}; /* 64 KiB blocks */
    kvd__hostmem_t hm;
    char why[200];
    uint32_t id;
    uint8_t k[12];

    kvd__hostmem_init(&hm, 1ull << 20);
    ck_assert_int_eq(kvd__cache_store_init(&c, &l, 64ull << 20, &hm, &kvdt_malloc_mem, why,
                                           sizeof(why)),
                     KVD_OK);
    ck_assert_uint_eq(c.block_bytes, 64 << 10);
    ck_assert_uint_eq(c.chunk_bytes, 16 << 10);
    kvdt_key_of(k, 1, 0);
    ck_assert_int_eq(kvd__cache_reserve(&c, KVD_CBLOCK_NONE, k, 12, &id, why, sizeof(why)),
                     KVD_ELIMIT); /* a slab would pass the 1 MiB budget */
    ck_assert_ptr_nonnull(strstr(why, "budget"));
    kvd__cache_store_deinit(&c);
    ck_assert_int_eq(kvd__cache_store_init(&c, &l, 1000, &hm, &kvdt_malloc_mem, why, sizeof(why)),
                     KVD_ERANGE);
}
END_TEST

/* Slabs allocated ahead: requests are kept, and the test ends them as the
 * daemon's loop would once the thread pool is done. */
static struct {
    int n;
    kvd_status_t refuse; /* what starting one returns, when not KVD_OK */
    uint64_t bytes[8];
    kvd__cache_mem_done_fn done[8];
    void *arg[8];
} ahead;
static int sync_allocs;

static kvd_status_t counting_alloc(void *ctx, uint64_t bytes, void **ptr, void **handle,
                                   char *why, size_t why_len)
{
    sync_allocs++;
    return kvdt_malloc_alloc(ctx, bytes, ptr, handle, why, why_len);
}

static kvd_status_t test_alloc_ahead(void *ctx, uint64_t bytes, kvd__cache_mem_done_fn done,
                                     void *arg)
{
    (void)ctx;
    if (ahead.refuse != KVD_OK)
        return ahead.refuse;
    ck_assert_int_lt(ahead.n, 8);
    ahead.bytes[ahead.n] = bytes;
    ahead.done[ahead.n] = done;
    ahead.arg[ahead.n] = arg;
    ahead.n++;
    return KVD_OK;
}

static void end_ahead(int i, kvd_status_t st)
{
    void *p = st == KVD_OK ? malloc(ahead.bytes[i]) : NULL;

    ahead.done[i](ahead.arg[i], st, p, p);
}

static const kvd__cache_mem_t MEM_AHEAD = {NULL, counting_alloc, kvdt_malloc_free,
                                          test_alloc_ahead, NULL};

/* Reserve and commit blocks (keys of chain ch from *next) until the
 * store has used n blocks in all. */
static void fill_to(kvd__cache_store_t *c, uint32_t ch, uint32_t *next, uint32_t n)
{
    uint8_t k[12];
    uint32_t id;
    char why[200];

    while (*next < n) {
        kvdt_key_of(k, ch, (*next)++);
        ck_assert_int_eq(kvd__cache_reserve(c, KVD_CBLOCK_NONE, k, 12, &id, why, sizeof(why)),
                         KVD_OK);
        ck_assert_int_eq(kvd__cache_commit(c, id), 1);
    }
}

/* The store's grown hook: how often, and the slots of the last. */
static int grown_calls;
static uint32_t grown_n;

static void count_grown(void *arg, uint32_t n)
{
    (void)arg;
    grown_calls++;
    grown_n = n;
}

static kvd_status_t reserve_one(kvd__cache_store_t *c, uint32_t ch, uint32_t i, char *why,
                                size_t why_len)
{
    uint8_t k[12];
    uint32_t id;

    kvdt_key_of(k, ch, i);
    return kvd__cache_reserve(c, KVD_CBLOCK_NONE, k, 12, &id, why, why_len);
}

static void make_ahead(kvd__cache_store_t *c, kvd__hostmem_t *hm, uint32_t cap, uint64_t hm_budget)
{
    memset(&ahead, 0, sizeof(ahead));
    sync_allocs = grown_calls = 0;
    make_with(c, hm, cap, hm_budget, &MEM_AHEAD);
    c->grown = count_grown;
}

START_TEST(test_slab_ahead)
{
    /* 64-byte blocks: slabs of 65,536 (4 MiB), three whole and one of 1,000 */
    const uint32_t per = 65536, cap = 3 * per + 1000;
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint32_t next = 0;
    uint64_t before;
    char why[200];

    make_ahead(&c, &hm, cap, 1ull << 30);
    ck_assert_uint_eq(c.nslabs_max, 4);
    ck_assert_int_eq(ahead.n, 0); /* nothing until the first save */
    /* the first slab is made off the caller's thread: the reserve waits */
    ck_assert_int_eq(reserve_one(&c, 0, 0, why, sizeof(why)), KVD_EBUSY);
    ck_assert_ptr_nonnull(strstr(why, "being made"));
    ck_assert(kvd__cache_growing(&c));
    ck_assert_int_eq(reserve_one(&c, 0, 0, why, sizeof(why)), KVD_EBUSY);
    ck_assert_int_eq(ahead.n, 1); /* one on its way: not asked twice */
    ck_assert_uint_eq(ahead.bytes[0], (uint64_t)per * 64);
    before = kvd__hostmem_left(&hm);
    end_ahead(0, KVD_OK);
    ck_assert_int_eq(grown_calls, 1);
    ck_assert_uint_eq(grown_n, per);
    ck_assert(!kvd__cache_growing(&c));
    ck_assert_uint_eq(kvd__hostmem_left(&hm), before); /* reserved before it came */
    fill_to(&c, 0, &next, 1);
    ck_assert_uint_eq(c.nslabs, 1);
    ck_assert_int_eq(ahead.n, 2); /* the second: ahead at once */
    fill_to(&c, 0, &next, per);
    /* the cache fills faster than the next slab comes: it waits for it
     * rather than evict under its budget */
    ck_assert_int_eq(reserve_one(&c, 0, next, why, sizeof(why)), KVD_EBUSY);
    ck_assert_uint_eq(c.n.evictions, 0);
    end_ahead(1, KVD_OK);
    fill_to(&c, 0, &next, per + 1);
    ck_assert_uint_eq(c.nslabs, 2);
    ck_assert_int_eq(ahead.n, 3);
    end_ahead(2, KVD_OK);
    fill_to(&c, 0, &next, 2 * per + 1);
    ck_assert_int_eq(ahead.n, 4); /* the last, of 1,000 blocks */
    ck_assert_uint_eq(ahead.bytes[3], 1000ull * 64);
    end_ahead(3, KVD_OK);
    fill_to(&c, 0, &next, cap);
    ck_assert_uint_eq(c.nslabs, 4);
    ck_assert_int_eq(ahead.n, 4); /* none past the budget */
    ck_assert_ptr_null(c.ahead);
    /* full: the least recently used block goes, nothing waits */
    fill_to(&c, 1, &(uint32_t){0}, 1);
    ck_assert_uint_eq(c.n.evictions, 1);
    ck_assert_int_eq(sync_allocs, 0); /* never on the caller's thread */
    kvd__cache_store_deinit(&c);
    ck_assert_uint_eq(kvd__hostmem_left(&hm), 1ull << 30); /* every byte back */
}
END_TEST

START_TEST(test_slab_ahead_outlived)
{
    /* the store goes (or clears) while the slab ahead is on its way, or
     * that allocation fails: its memory and budget come back all the same */
    const uint32_t cap = 4 * 65536;
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint32_t next = 0;
    uint64_t before;
    char why[200];

    make_ahead(&c, &hm, cap, 1ull << 30);
    ck_assert_int_eq(reserve_one(&c, 0, 0, why, sizeof(why)), KVD_EBUSY);
    kvd__cache_store_deinit(&c);
    ck_assert_uint_lt(kvd__hostmem_left(&hm), 1ull << 30); /* still reserved: it may come */
    end_ahead(0, KVD_OK); /* freed as it comes (ASan and valgrind see a leak) */
    ck_assert_uint_eq(kvd__hostmem_left(&hm), 1ull << 30);
    ck_assert_int_eq(grown_calls, 0); /* nobody left to tell */

    /* a failed allocation ahead: the next reserve hears why, once; the one
     * after it starts another */
    make_ahead(&c, &hm, cap, 1ull << 30);
    before = c.held_bytes;
    ck_assert_int_eq(reserve_one(&c, 0, 0, why, sizeof(why)), KVD_EBUSY);
    ck_assert_uint_gt(c.held_bytes, before);
    end_ahead(0, KVD_ENOMEM);
    ck_assert_int_eq(grown_calls, 1);
    ck_assert_uint_eq(grown_n, 0);
    ck_assert_ptr_null(c.ahead);
    ck_assert_uint_eq(c.held_bytes, before);
    ck_assert_int_eq(reserve_one(&c, 0, 0, why, sizeof(why)), KVD_ENOMEM);
    ck_assert_ptr_nonnull(strstr(why, "could not be made"));
    ck_assert_int_eq(reserve_one(&c, 0, 0, why, sizeof(why)), KVD_EBUSY);
    ck_assert_int_eq(ahead.n, 2);
    end_ahead(1, KVD_OK);
    fill_to(&c, 0, &next, 1);
    ck_assert_int_eq(ahead.n, 3); /* and the one after it ahead again */
    end_ahead(2, KVD_OK);
    ck_assert_ptr_nonnull(c.ahead);
    /* clearing gives the memory back, the slab ahead too */
    ck_assert_uint_eq(kvd__cache_clear(&c), 1);
    ck_assert_uint_eq(c.nslabs, 0);
    ck_assert_ptr_null(c.ahead);
    kvd__cache_store_deinit(&c);
    ck_assert_uint_eq(kvd__hostmem_left(&hm), 1ull << 30);

    /* a budget with room for one slab only: none is started ahead */
    make_ahead(&c, &hm, cap, 65536ull * (64 + 4) + (2u << 20));
    next = 0;
    ck_assert_int_eq(reserve_one(&c, 0, 0, why, sizeof(why)), KVD_EBUSY);
    end_ahead(0, KVD_OK);
    fill_to(&c, 0, &next, 1);
    ck_assert_int_eq(ahead.n, 1);
    ck_assert_ptr_null(c.ahead);
    kvd__cache_store_deinit(&c);

    /* growing asked for ahead of need (a cluster cache), then a slab ready
     * for the first reserve */
    make_ahead(&c, &hm, cap, 1ull << 30);
    kvd__cache_grow(&c);
    ck_assert(kvd__cache_growing(&c));
    end_ahead(0, KVD_OK);
    next = 0;
    fill_to(&c, 0, &next, 1);
    kvd__cache_grow(&c); /* free slots there: nothing more */
    ck_assert_int_eq(ahead.n, 2); /* the first, and the second after it */
    kvd__cache_store_deinit(&c);
    end_ahead(1, KVD_OK);
    ck_assert_uint_eq(kvd__hostmem_left(&hm), 1ull << 30);

    /* one refused at its start (a daemon shutting down): nothing held, and
     * the reserve says why */
    make_ahead(&c, &hm, cap, 1ull << 30);
    ahead.refuse = KVD_ESHUTDOWN;
    ck_assert_int_eq(reserve_one(&c, 0, 0, why, sizeof(why)), KVD_ESHUTDOWN);
    ck_assert_ptr_nonnull(strstr(why, "could not be started"));
    ck_assert_ptr_null(c.ahead);
    ck_assert_uint_eq(c.nslabs, 0);
    kvd__cache_store_deinit(&c);
    ck_assert_uint_eq(kvd__hostmem_left(&hm), 1ull << 30);
    ahead.refuse = KVD_OK;
}
END_TEST

START_TEST(test_slab_prepare)
{
    /* room made for a request's blocks before it takes one: slabs added
     * as they come, the next started, up to the budget */
    const uint32_t per = 65536, cap = 3 * per + 1000;
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint32_t next = 0;
    char why[200];

    make_ahead(&c, &hm, cap, 1ull << 30);
    ck_assert_int_eq(kvd__cache_prepare(&c, 70000, why, sizeof(why)), KVD_EBUSY);
    ck_assert_ptr_nonnull(strstr(why, "being made"));
    end_ahead(0, KVD_OK);
    ck_assert_int_eq(kvd__cache_prepare(&c, 70000, why, sizeof(why)), KVD_EBUSY);
    ck_assert_uint_eq(c.nslabs, 1); /* the first added, the second on its way */
    ck_assert_int_eq(ahead.n, 2);
    end_ahead(1, KVD_OK);
    ck_assert_int_eq(kvd__cache_prepare(&c, 70000, why, sizeof(why)), KVD_OK);
    ck_assert_uint_eq(c.nslabs, 2);
    ck_assert_uint_ge(c.nfree, 70000);
    fill_to(&c, 0, &next, 70000); /* no reserve waits */
    /* more than the budget holds: what it can, then OK (reserves evict) */
    ck_assert_int_eq(kvd__cache_prepare(&c, 2 * cap, why, sizeof(why)), KVD_EBUSY);
    end_ahead(2, KVD_OK);
    ck_assert_int_eq(kvd__cache_prepare(&c, 2 * cap, why, sizeof(why)), KVD_EBUSY);
    end_ahead(3, KVD_OK);
    ck_assert_int_eq(kvd__cache_prepare(&c, 2 * cap, why, sizeof(why)), KVD_OK);
    ck_assert_uint_eq(c.nslabs, 4);
    ck_assert_int_eq(ahead.n, 4);
    ck_assert_int_eq(sync_allocs, 0);
    kvd__cache_store_deinit(&c);
    ck_assert_uint_eq(kvd__hostmem_left(&hm), 1ull << 30);

    /* the slab it waited for failed: said once, then tried again */
    make_ahead(&c, &hm, cap, 1ull << 30);
    ck_assert_int_eq(kvd__cache_prepare(&c, 10, why, sizeof(why)), KVD_EBUSY);
    end_ahead(0, KVD_ENOMEM);
    ck_assert_int_eq(kvd__cache_prepare(&c, 10, why, sizeof(why)), KVD_ENOMEM);
    ck_assert_ptr_nonnull(strstr(why, "could not be made"));
    ck_assert_int_eq(kvd__cache_prepare(&c, 10, why, sizeof(why)), KVD_EBUSY);
    end_ahead(1, KVD_OK);
    ck_assert_int_eq(kvd__cache_prepare(&c, 10, why, sizeof(why)), KVD_OK);
    /* one started ahead of need that fails is said to nobody */
    ck_assert_int_eq(ahead.n, 3);
    end_ahead(2, KVD_ENOMEM);
    ck_assert_int_eq(c.ahead_failed, KVD_OK);
    kvd__cache_store_deinit(&c);

    /* a clear keeps the slab on its way (a request waits for it) and
     * gives back the rest */
    make_ahead(&c, &hm, cap, 1ull << 30);
    next = 0;
    ck_assert_int_eq(kvd__cache_prepare(&c, 1, why, sizeof(why)), KVD_EBUSY);
    end_ahead(0, KVD_OK);
    fill_to(&c, 0, &next, 1);
    ck_assert(kvd__cache_growing(&c)); /* the second */
    ck_assert_uint_eq(kvd__cache_clear(&c), 1);
    ck_assert_uint_eq(c.nslabs, 0);
    ck_assert(kvd__cache_growing(&c));
    end_ahead(1, KVD_OK);
    next = 0;
    fill_to(&c, 0, &next, 1); /* into it */
    ck_assert_uint_eq(c.nslabs, 1);
    ck_assert_int_eq(sync_allocs, 0);
    kvd__cache_store_deinit(&c);
    end_ahead(2, KVD_OK);
    ck_assert_uint_eq(kvd__hostmem_left(&hm), 1ull << 30);
}
END_TEST

START_TEST(test_clear_many_slabs)
{
    /* clearing frees every block of every slab at once: the free list has
     * room for them all (it once had room for the last slab's only) */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint32_t next = 0;

    make(&c, &hm, 3 * 65536);
    fill_to(&c, 0, &next, 2 * 65536 + 1);
    ck_assert_uint_eq(c.nslabs, 3);
    ck_assert_uint_eq(kvd__cache_clear(&c), 2 * 65536 + 1);
    ck_assert_uint_eq(c.nslabs, 0);
    next = 0;
    fill_to(&c, 1, &next, 65537); /* and it grows again */
    ck_assert_uint_eq(c.nslabs, 2);
    kvd__cache_store_deinit(&c);
    ck_assert_uint_eq(kvd__hostmem_left(&hm), 1ull << 30);
}
END_TEST

START_TEST(test_key_width_grows)
{
    /* keys take the width of the longest seen: longer keys widen every
     * chunk's keys (all still found), shorter ones change nothing, and a
     * widening the budget refuses leaves the store as it was */
    kvd__cache_store_t c;
    kvd__hostmem_t hm;
    uint8_t k[64], parent_key[64];
    uint32_t ch, id, parent = KVD_CBLOCK_NONE, ev;
    static const uint32_t lens[] = {40, 64, 1, 33};
    static const uint32_t widths[] = {40, 64, 64, 64};
    char why[200];

    make(&c, &hm, 1000);
    for (ch = 0; ch < 30; ch++) /* 300 entries: chunks of 64, 64, 128 and 256 */
        ck_assert_uint_eq(save_chain(&c, ch, 10), 10);
    ck_assert_uint_eq(c.key_width, 16);
    for (uint32_t j = 0; j < 4; j++) {
        memset(k, 0xa0 + (int)j, sizeof(k));
        ck_assert_int_eq(kvd__cache_reserve(&c, parent, k, lens[j], &id, why, sizeof(why)),
                         KVD_OK);
        ck_assert_int_eq(kvd__cache_commit(&c, id), 1);
        ck_assert_uint_eq(c.key_width, widths[j]);
        ck_assert_uint_eq(c.held_bytes, hm.used[KVD_HM_CACHE] + hm.used[KVD_HM_CACHE_INDEX]);
        for (ch = 0; ch < 30; ch++)
            ck_assert_uint_eq(present(&c, ch, 10), 10);
        parent = id;
    }
    /* the chain of four widths, whole, from any of its keys on */
    for (uint32_t j = 0; j < 4; j++) {
        const uint8_t *kp[4];
        size_t kl[4];
        uint8_t keys[4][64];

        for (uint32_t i = 0; i < 4; i++) {
            memset(keys[i], 0xa0 + (int)i, 64);
            kp[i] = keys[i];
            kl[i] = lens[i];
        }
        ck_assert_uint_eq(kvd__cache_lookup(&c, kp + j, kl + j, 4 - j, 0, NULL), 4 - j);
    }
    memset(parent_key, 0xa0, sizeof(parent_key));
    ck_assert_int_eq(kvd__cache_evict_key(&c, parent_key, 40, &ev), KVD_OK);
    ck_assert_uint_eq(ev, 4);
    ck_assert_uint_eq(kvd__cache_clear(&c), 300);
    kvd__cache_store_deinit(&c);
    ck_assert_uint_eq(kvd__hostmem_left(&hm), 1ull << 30);

    /* 64 blocks of 64 bytes and their room: a budget without room for
     * 64 entries' keys to widen from 16 to 64 bytes */
    make_with(&c, &hm, 64, 64 * (64 + 4) + 64 * 8 + 64 * (sizeof(kvd__cblock_t) + 16) + 1024,
              &kvdt_malloc_mem);
    ck_assert_uint_eq(save_chain(&c, 1, 10), 10);
    memset(k, 0xee, sizeof(k));
    ck_assert_int_eq(kvd__cache_reserve(&c, KVD_CBLOCK_NONE, k, 64, &id, why, sizeof(why)),
                     KVD_ELIMIT);
    ck_assert_uint_eq(c.key_width, 16);
    ck_assert_uint_eq(c.indexed, 10);
    ck_assert_uint_eq(present(&c, 1, 10), 10);
    ck_assert_uint_eq(c.held_bytes, hm.used[KVD_HM_CACHE] + hm.used[KVD_HM_CACHE_INDEX]);
    ck_assert_int_eq(kvd__cache_reserve(&c, KVD_CBLOCK_NONE, k, 16, &id, why, sizeof(why)),
                     KVD_OK); /* a key of the width there is still fits */
    kvd__cache_abort(&c, id);
    kvd__cache_store_deinit(&c);
    ck_assert_uint_eq(hm.used[KVD_HM_CACHE] + hm.used[KVD_HM_CACHE_INDEX], 0);
}
END_TEST

static Suite *cache_suite(void)
{
    Suite *s = suite_create("cache");
    TCase *tc = tcase_create("store");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_prefixes_under_pressure);
    tcase_add_test(tc, test_index_model);
    tcase_add_test(tc, test_lookups_touch_chains);
    tcase_add_test(tc, test_lookup_blob);
    tcase_add_test(tc, test_lookup_blob_held);
    tcase_add_test(tc, test_lookup_blob_changing);
    tcase_add_test(tc, test_holds_and_full);
    tcase_add_test(tc, test_evict_subtree_and_clear);
    tcase_add_test(tc, test_failed_save_under_another);
    tcase_add_test(tc, test_budget_refused);
    tcase_add_test(tc, test_clear_many_slabs);
    tcase_add_test(tc, test_key_width_grows);
    tcase_add_test(tc, test_slab_ahead);
    tcase_add_test(tc, test_slab_ahead_outlived);
    tcase_add_test(tc, test_slab_prepare);
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
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
