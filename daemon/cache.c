/* The cache tier's store: see cache.h. */
#include "cache.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>

#include "disk_store.h"
#include "log.h"

/* A slab's blocks: a save or load runs one job per slab it touches, in
 * order, so slabs are large (a request of 2 GiB of blocks makes two or
 * three jobs); a cache grows in steps of about SLAB_BYTES. */
#define SLAB_BYTES (1ull << 30)
#define SLAB_BLOCKS_MAX (1u << 16)
#define TABLE_MIN 64
/* Keys a lookup hashes and prefetches at once. */
#define LOOKUP_GROUP 32
/* How many entries ahead a lookup's run prefetches (their entries and
 * keys): far enough to cover a miss to memory at a few ns a key. */
#define RUN_AHEAD 16

/* ---- the disk level's state (see the disk level below) ---------------------- */

/* A read into a block's host slot, and the others waiting for the same. */
typedef struct disk_fetch {
    kvd__cache_store_t *c;
    uint32_t id;
    kvd__cache_fetch_cb cb;
    void *arg;
    struct disk_fetch *waiters; /* later asks for the same block */
    struct disk_fetch *next;    /* in its read's list of waiters */
} disk_fetch_t;

typedef struct disk_write_ctx {
    kvd__cache_store_t *c;
    uint32_t id;
} disk_write_ctx_t;

struct kvd__cache_disk {
    kvd__disk_store_t *store;
    kvd__disk_io_t *io;
    uint64_t budget, rec_bytes;
    uint64_t cap;        /* records the budget holds */
    uint64_t records;    /* entries with a record, and writes in flight */
    uint64_t writing;    /* writes in flight (each holds its block's host slot) */
    void (*written)(void *arg);
    void *written_arg;
    /* reads in flight by block id: open addressing, linear probing, at
     * most half full (a load may have tens of thousands in flight, and
     * each completion and each later ask for the same block finds its
     * read here, never by a walk) */
    disk_fetch_t **reads;
    uint32_t reads_mask, nreads;
    uint64_t hits, spills, promotions, writes, evictions, refused, failed_writes, host_full;
    /* at open only: each entry's parent key (poff[id] into pkeys; 0: none) */
    uint8_t *pkeys;
    uint64_t pkeys_len, pkeys_cap;
    uint64_t *poff;
    uint32_t poff_len;
    kvd__disk_loc_t *older; /* records replaced by newer ones, dropped after open */
    uint64_t nolder, older_cap;
    int opening;
    uint64_t unindexed;  /* at open: records the index had no room for */
    int refusing;        /* the last record was refused: logged once per run */
};

/* ---- memory for the index and the entries ---------------------------------- */

#define HUGE_PAGE (2ull << 20)

/* Zeroed memory for the table and the entries.  From a few MiB on, in
 * huge pages where the kernel gives them: a long chain's lookup in a large
 * cache touches a thousand random table slots, and without them most of
 * those would miss the TLB as well as the cache. */
static void *zalloc(size_t bytes)
{
    void *p;

    if (bytes < HUGE_PAGE)
        return calloc(1, bytes ? bytes : 1);
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint: fine without */
    return p;
}

static void zfree(void *p, size_t bytes)
{
    if (p == NULL)
        return;
    if (bytes < HUGE_PAGE)
        free(p);
    else
        munmap(p, bytes);
}

_Static_assert(sizeof(kvd__cblock_t) == 36, "an entry is 36 bytes (cache.h)");
_Static_assert(sizeof(kvd__cdisk_t) == 8, "a disk part is 8 bytes (cache.h)");
_Static_assert(sizeof(kvd__chost_t) == 12, "a host slot's list part is 12 bytes (cache.h)");

/* ---- the keyed hash ------------------------------------------------------- */

static inline uint64_t mum(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

/* Keys are chosen by clients: a secret seed keeps them from aiming at one
 * bucket.  Two independent products per 16 bytes (as wyhash does) so that
 * a 32-byte key costs about one multiply's latency more than an 8-byte
 * one. */
static inline uint64_t key_hash(uint64_t seed, const uint8_t *k, size_t n)
{
    uint64_t h = seed ^ (n * 0x9E3779B97F4A7C15ull), a, b;
    size_t i;

    for (i = 0; i + 16 <= n; i += 16) {
        memcpy(&a, k + i, 8);
        memcpy(&b, k + i + 8, 8);
        h ^= mum(a ^ 0xA0761D6478BD642Full, b ^ seed ^ 0xE7037ED1A0B428DBull);
    }
    a = b = 0;
    if (n - i > 8) {
        memcpy(&a, k + i, 8);
        memcpy(&b, k + i + 8, n - i - 8);
    } else if (n > i) {
        memcpy(&a, k + i, n - i);
    }
    return mum(h ^ mum(a ^ 0x8EBC6AF09C88C6E3ull, b ^ 0x589965CC75374CC3ull),
               0x1D8E4E27C47D124Full);
}

uint64_t kvd__cache_hash(const kvd__cache_store_t *c, const uint8_t *key, size_t klen)
{
    return key_hash(c->seed, key, klen);
}

/* ---- entries --------------------------------------------------------------- */

#define B(c, id) kvd__cache_block((c), (id))

/* The key of entry id (key_width bytes; its klen of them hold it). */
static inline uint8_t *key_of(const kvd__cache_store_t *c, uint32_t id)
{
    uint32_t pos, k = kvd__cache_chunk_of(id, &pos);

    return c->chunks[k].keys + (size_t)pos * c->key_width;
}

/* The disk part of entry id (the store has a disk level). */
static inline kvd__cdisk_t *D(const kvd__cache_store_t *c, uint32_t id)
{
    uint32_t pos, k = kvd__cache_chunk_of(id, &pos);

    return &c->chunks[k].disk[pos];
}

/* Entry id and its key, from one look at its chunk. */
static inline const kvd__cblock_t *entry_at(const kvd__cache_store_t *c, uint32_t id,
                                            const uint8_t **key)
{
    uint32_t pos, k = kvd__cache_chunk_of(id, &pos);

    *key = c->chunks[k].keys + (size_t)pos * c->key_width;
    return &c->chunks[k].ents[pos];
}

/* Whether entry b, whose key is s, holds key (length first; then words,
 * no libc call). */
static inline int key_equal(const kvd__cblock_t *b, const uint8_t *s, const uint8_t *key,
                            size_t klen)
{
    size_t i;

    if (b->klen != klen)
        return 0;
    for (i = 0; i + 8 <= klen; i += 8) {
        uint64_t x, y;
        memcpy(&x, s + i, 8);
        memcpy(&y, key + i, 8);
        if (x != y)
            return 0;
    }
    return i == klen || memcmp(s + i, key + i, klen - i) == 0;
}

/* The keyed hash of entry id's key. */
static inline uint64_t entry_hash(const kvd__cache_store_t *c, uint32_t id)
{
    return key_hash(c->seed, key_of(c, id), B(c, id)->klen);
}

/* Host slot slot's part of the host list (the store has a disk level). */
static inline kvd__chost_t *HS(const kvd__cache_store_t *c, uint32_t slot)
{
    return &c->slabs[kvd__cache_slab_of(c, slot)].hs[kvd__cache_pos_of(c, slot)];
}

/* Block id takes a free host slot (there is one in free_ids). */
static inline void host_take(kvd__cache_store_t *c, uint32_t id)
{
    kvd__cblock_t *b = B(c, id);

    b->host = c->free_ids[--c->nfree] + 1;
    c->slabs[kvd__cache_slab_of(c, b->host - 1)].used++;
    if (c->disk_parts)
        HS(c, b->host - 1)->owner = id;
}

static inline void *slot_bytes(const kvd__cache_store_t *c, uint32_t slot)
{
    return (char *)c->slabs[kvd__cache_slab_of(c, slot)].ptr +
           (uint64_t)kvd__cache_pos_of(c, slot) * c->block_bytes;
}

void *kvd__cache_block_bytes(const kvd__cache_store_t *c, uint32_t id)
{
    return slot_bytes(c, kvd__cache_host_slot(c, id));
}

static uint32_t chunk_len(uint32_t k)
{
    return k == 0 ? 64 : k <= 10 ? 64u << (k - 1) : 1u << 16;
}

/* Entries in chunks [0, k). */
static uint32_t chunks_len(uint32_t k)
{
    return k == 0 ? 0 : k <= 11 ? 64u << (k - 1) : (k - 10) << 16;
}

/* Frees chunk k's arrays (made at the store's widths now). */
static void chunk_free(kvd__cache_store_t *c, uint32_t k)
{
    kvd__cache_chunk_t *ch = &c->chunks[k];
    size_t n = chunk_len(k);

    zfree(ch->ents, n * sizeof(kvd__cblock_t));
    zfree(ch->keys, n * c->key_width);
    zfree(ch->disk, n * sizeof(kvd__cdisk_t));
    memset(ch, 0, sizeof(*ch));
}

/* A new chunk of entries, keys and disk parts, charged as index memory.
 * KVD_ENOMEM or the budget's status, with why. */
static kvd_status_t chunk_add(kvd__cache_store_t *c, char *why, size_t why_len)
{
    uint32_t k = c->nchunks;
    size_t n = chunk_len(k);
    uint64_t bytes = (uint64_t)n * kvd__cache_entry_bytes(c);
    kvd__cache_chunk_t *m = realloc(c->chunks, (k + 1) * sizeof(*m)), *ch;
    kvd_status_t st;

    if (m == NULL) {
        snprintf(why, why_len, "out of memory for the cache's entries");
        return KVD_ENOMEM;
    }
    c->chunks = m;
    ch = &m[k];
    memset(ch, 0, sizeof(*ch));
    /* Entries outlive host slots (a block on disk only keeps one), so they
     * are charged as they are made, not with the slabs. */
    if ((st = kvd__hostmem_reserve(c->hostmem, KVD_HM_CACHE_INDEX, bytes, why, why_len)) !=
        KVD_OK)
        return st;
    ch->ents = zalloc(n * sizeof(kvd__cblock_t));
    ch->keys = c->key_width ? zalloc(n * c->key_width) : NULL;
    ch->disk = c->disk_parts ? zalloc(n * sizeof(kvd__cdisk_t)) : NULL;
    if (ch->ents == NULL || (c->key_width && ch->keys == NULL) ||
        (c->disk_parts && ch->disk == NULL)) {
        chunk_free(c, k);
        kvd__hostmem_release(c->hostmem, KVD_HM_CACHE_INDEX, bytes);
        snprintf(why, why_len, "out of memory for the cache's entries");
        return KVD_ENOMEM;
    }
    c->held_bytes += bytes;
    c->nchunks++;
    return KVD_OK;
}

/* Keys of klen bytes fit: the key width grows to klen (rounded up to
 * KVD_CACHE_KEY_ALIGN), every chunk's keys moving to arrays of that width.
 * Validate first: on failure (the budget's status, KVD_ENOMEM, with why)
 * nothing changed. */
static kvd_status_t keys_fit(kvd__cache_store_t *c, size_t klen, char *why, size_t why_len)
{
    uint32_t w = (uint32_t)(klen + KVD_CACHE_KEY_ALIGN - 1) & ~(uint32_t)(KVD_CACHE_KEY_ALIGN - 1);
    uint32_t old = c->key_width, k;
    uint64_t extra;
    uint8_t **n;
    kvd_status_t st;

    if (w <= old)
        return KVD_OK;
    extra = (uint64_t)chunks_len(c->nchunks) * (w - old);
    if (extra > 0 && (st = kvd__hostmem_reserve(c->hostmem, KVD_HM_CACHE_INDEX, extra, why,
                                                why_len)) != KVD_OK)
        return st;
    n = calloc(c->nchunks ? c->nchunks : 1, sizeof(*n));
    for (k = 0; n != NULL && k < c->nchunks; k++)
        if ((n[k] = zalloc((size_t)chunk_len(k) * w)) == NULL)
            break;
    if (n == NULL || k < c->nchunks) {
        while (n != NULL && k-- > 0)
            zfree(n[k], (size_t)chunk_len(k) * w);
        free(n);
        if (extra > 0)
            kvd__hostmem_release(c->hostmem, KVD_HM_CACHE_INDEX, extra);
        snprintf(why, why_len, "out of memory for the cache's keys");
        return KVD_ENOMEM;
    }
    for (k = 0; k < c->nchunks; k++) {
        uint8_t *from = c->chunks[k].keys;
        size_t len = chunk_len(k), i;

        for (i = 0; from != NULL && i < len; i++)
            memcpy(n[k] + i * w, from + i * old, old);
        zfree(from, len * old);
        c->chunks[k].keys = n[k];
    }
    free(n);
    c->key_width = w;
    c->held_bytes += extra;
    return KVD_OK;
}

/* A free entry, zeroed: from the free list, else the next one made (a new
 * chunk when the last is full).  KVD_ENOMEM with why. */
static kvd_status_t ent_new(kvd__cache_store_t *c, uint32_t *id, char *why, size_t why_len)
{
    kvd__cblock_t *b;
    kvd_status_t st;

    if (c->ent_free) {
        *id = c->ent_free - 1;
        b = B(c, *id);
        c->ent_free = b->lru.next;
        memset(b, 0, sizeof(*b));
        if (c->disk_parts)
            memset(D(c, *id), 0, sizeof(kvd__cdisk_t));
        return KVD_OK;
    }
    if (c->ents_made >= UINT32_MAX - 1) {
        snprintf(why, why_len, "the cache holds as many entries as it can");
        return KVD_ELIMIT;
    }
    if (c->ents_made == chunks_len(c->nchunks) && (st = chunk_add(c, why, why_len)) != KVD_OK)
        return st;
    *id = c->ents_made++;
    return KVD_OK;
}

/* Entry id goes back to the free list (zeroed: FREE). */
static void ent_free(kvd__cache_store_t *c, uint32_t id)
{
    kvd__cblock_t *b = B(c, id);

    memset(b, 0, sizeof(*b));
    if (c->disk_parts)
        memset(D(c, id), 0, sizeof(kvd__cdisk_t));
    b->lru.next = c->ent_free;
    c->ent_free = id + 1;
}

/* A block's host slot goes back to the slabs' free slots. */
static void host_free(kvd__cache_store_t *c, kvd__cblock_t *b)
{
    uint32_t slot;

    if (!b->host)
        return;
    slot = b->host - 1;
    b->host = 0;
    c->slabs[kvd__cache_slab_of(c, slot)].used--;
    c->free_ids[c->nfree++] = slot;
}

/* ---- the table ------------------------------------------------------------- */

/* The slot of key (hash h) in the table, or the empty one ending its run. */
static inline uint64_t *slot_at(const kvd__cache_store_t *c, uint64_t h, const uint8_t *key,
                                size_t klen)
{
    uint64_t tag = h >> 32, i;

    for (i = h & c->table_mask;; i = (i + 1) & c->table_mask) {
        uint64_t v = c->table[i];
        if (v == 0)
            return &c->table[i];
        if (v >> 32 == tag) {
            const uint8_t *s;
            const kvd__cblock_t *b = entry_at(c, (uint32_t)v - 1, &s);

            if (key_equal(b, s, key, klen))
                return &c->table[i];
        }
    }
}

static uint64_t *slot_of(const kvd__cache_store_t *c, const uint8_t *key, size_t klen)
{
    return slot_at(c, key_hash(c->seed, key, klen), key, klen);
}

uint32_t kvd__cache_find(const kvd__cache_store_t *c, const uint8_t *key, size_t klen)
{
    uint64_t v = *slot_of(c, key, klen);

    return v ? (uint32_t)v - 1 : KVD_CBLOCK_NONE;
}

const uint8_t *kvd__cache_key(const kvd__cache_store_t *c, uint32_t id, size_t *klen)
{
    *klen = B(c, id)->klen;
    return key_of(c, id);
}

static void table_put(uint64_t *table, uint64_t mask, uint64_t h, uint32_t id)
{
    uint64_t i;

    for (i = h & mask; table[i] != 0; i = (i + 1) & mask)
        ;
    table[i] = (h >> 32) << 32 | ((uint64_t)id + 1);
}

/* Room for one more entry at a load of at most a half. */
static kvd_status_t table_room(kvd__cache_store_t *c, char *why, size_t why_len)
{
    uint64_t size = c->table_mask + 1, nsize = size * 2, i;
    uint64_t *n;
    kvd_status_t st;

    if ((uint64_t)(c->indexed + 1) * 2 <= size)
        return KVD_OK;
    st = kvd__hostmem_reserve(c->hostmem, KVD_HM_CACHE_INDEX, size * sizeof(uint64_t), why,
                              why_len);
    if (st != KVD_OK)
        return st;
    n = zalloc(nsize * sizeof(*n));
    if (n == NULL) {
        kvd__hostmem_release(c->hostmem, KVD_HM_CACHE_INDEX, size * sizeof(uint64_t));
        snprintf(why, why_len, "out of memory for the cache's index");
        return KVD_ENOMEM;
    }
    for (i = 0; i < size; i++) {
        uint64_t v = c->table[i];
        if (v != 0)
            table_put(n, nsize - 1, entry_hash(c, (uint32_t)v - 1), (uint32_t)v - 1);
    }
    zfree(c->table, size * sizeof(*c->table));
    c->table = n;
    c->table_mask = nsize - 1;
    c->held_bytes += size * sizeof(uint64_t);
    return KVD_OK;
}

/* Delete the entry at slot i of a linear-probing table: move up the entries
 * after it that would no longer be found. */
static void table_delete(kvd__cache_store_t *c, uint64_t *slot)
{
    uint64_t mask = c->table_mask, i = (uint64_t)(slot - c->table), j = i;

    c->table[i] = 0;
    for (;;) {
        uint64_t v, home;

        j = (j + 1) & mask;
        v = c->table[j];
        if (v == 0)
            return;
        home = entry_hash(c, (uint32_t)v - 1) & mask;
        /* the entry at j stays unless its home lies cyclically in (i, j] */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            c->table[i] = v;
            c->table[j] = 0;
            i = j;
        }
    }
}

/* ---- recency ----------------------------------------------------------------- */

/* The store's two lists, one implementation: the recency list (which ==
 * KVD_CLIST_LRU), linked through the entries, and the host list
 * (KVD_CLIST_HOST, with a disk level: the blocks whose host copy may go,
 * the least recently used first; see host_evict_one), linked through the
 * host slots' parts (kvd__chost_t).  An entry's lists say which it is on. */
static inline kvd__clist_t *list_of(kvd__cache_store_t *c, int which)
{
    return which == KVD_CLIST_LRU ? &c->lru : &c->hlru;
}

/* A list's node for entry id: the entry (the recency list), or its host
 * slot (the host list: a block on it keeps its slot until it leaves). */
static inline uint32_t node_of(const kvd__cache_store_t *c, int which, uint32_t id)
{
    return which == KVD_CLIST_LRU ? id : B(c, id)->host - 1;
}

static inline kvd__clink_t *link_at(const kvd__cache_store_t *c, int which, uint32_t node)
{
    return which == KVD_CLIST_LRU ? &B(c, node)->lru : &HS(c, node)->hlru;
}

static void list_remove(kvd__cache_store_t *c, int which, uint32_t id)
{
    kvd__cblock_t *b = B(c, id);
    kvd__clist_t *l;
    kvd__clink_t *e;

    if (!(b->lists & which))
        return;
    l = list_of(c, which);
    e = link_at(c, which, node_of(c, which, id));
    if (e->prev)
        link_at(c, which, e->prev - 1)->next = e->next;
    else
        l->head = e->next;
    if (e->next)
        link_at(c, which, e->next - 1)->prev = e->prev;
    else
        l->tail = e->prev;
    e->prev = e->next = 0;
    b->lists &= (uint8_t)~which;
}

/* Entry id, off list which, goes right behind node after - 1 there (the
 * less recently used of the two), or at its head where after is 0. */
static void list_link(kvd__cache_store_t *c, int which, uint32_t id, uint32_t after)
{
    kvd__clist_t *l = list_of(c, which);
    uint32_t node = node_of(c, which, id);
    kvd__clink_t *e = link_at(c, which, node);

    e->prev = after;
    e->next = after ? link_at(c, which, after - 1)->next : l->head;
    if (e->next)
        link_at(c, which, e->next - 1)->prev = node + 1;
    else
        l->tail = node + 1;
    if (after)
        link_at(c, which, after - 1)->next = node + 1;
    else
        l->head = node + 1;
    B(c, id)->lists |= (uint8_t)which;
    c->n.relinks++;
}

/* As the most recently used (mru), or as the least. */
static void list_insert(kvd__cache_store_t *c, int which, uint32_t id, int mru)
{
    list_remove(c, which, id);
    list_link(c, which, id, mru ? 0 : list_of(c, which)->tail);
}

static void lru_remove(kvd__cache_store_t *c, uint32_t id)
{
    list_remove(c, KVD_CLIST_LRU, id);
}

static void hlru_remove(kvd__cache_store_t *c, uint32_t id)
{
    list_remove(c, KVD_CLIST_HOST, id);
}

/* Whether a block has a record on disk. */
static inline int on_disk(const kvd__cache_store_t *c, uint32_t id)
{
    const kvd__cdisk_t *d = D(c, id);

    return d->dseg != 0 || d->doff != 0;
}

/* Whether block id belongs on the host list: ready, nothing holds it,
 * its host copy whole and on disk (or its record could not be written). */
static inline int host_listable(const kvd__cache_store_t *c, uint32_t id)
{
    const kvd__cblock_t *b = B(c, id);

    return b->state == KVD_CBLOCK_READY && b->holds == 0 && b->host != 0 &&
           !(b->dflags & (KVD_CBLOCK_FETCHING | KVD_CBLOCK_WRITING)) &&
           (on_disk(c, id) || (b->dflags & KVD_CBLOCK_NODISK));
}

/* A block that belongs on the host list joins it as the most recently
 * used; another leaves it. */
static void hlru_touch(kvd__cache_store_t *c, uint32_t id)
{
    if (c->disk == NULL)
        return;
    hlru_remove(c, id);
    if (host_listable(c, id))
        list_link(c, KVD_CLIST_HOST, id, 0);
}

/* How far hlru_place looks along the recency list for a neighbour on the
 * host list: a chain's records land in bursts, a few blocks at a time. */
#define PLACE_STEPS 32

/* Where block b goes on the host list to keep the recency list's order
 * (list_link's after): right behind the nearest more recent block there,
 * else right before the nearest less recent one, each looked for a few
 * steps away; else at the head. */
static uint32_t host_place(const kvd__cache_store_t *c, const kvd__cblock_t *b)
{
    uint32_t k, e;

    for (k = 0, e = b->lru.prev; e && k < PLACE_STEPS; k++, e = B(c, e - 1)->lru.prev)
        if (B(c, e - 1)->lists & KVD_CLIST_HOST)
            return B(c, e - 1)->host; /* its slot + 1: its node + 1 */
    for (k = 0, e = b->lru.next; e && k < PLACE_STEPS; k++, e = B(c, e - 1)->lru.next)
        if (B(c, e - 1)->lists & KVD_CLIST_HOST)
            return HS(c, B(c, e - 1)->host - 1)->hlru.prev;
    return 0;
}

/* A block on the recency list that belongs on the host list joins it in
 * the recency list's order (host_place). */
static void hlru_place(kvd__cache_store_t *c, uint32_t id)
{
    hlru_remove(c, id);
    if (host_listable(c, id))
        list_link(c, KVD_CLIST_HOST, id, host_place(c, B(c, id)));
}

/* Nothing holds b but its record's write, which is no use of it: it may
 * move on the recency list (kvd__cache_unhold listed it). */
static inline int unheld(const kvd__cblock_t *b)
{
    return b->holds == ((b->dflags & KVD_CBLOCK_WRITING) != 0);
}

void kvd__cache_touch(kvd__cache_store_t *c, uint32_t id)
{
    kvd__cblock_t *b = B(c, id);

    if (b->state == KVD_CBLOCK_READY && unheld(b)) {
        list_insert(c, KVD_CLIST_LRU, id, 1);
        hlru_touch(c, id);
    }
}

/* ---- slabs ------------------------------------------------------------------ */

/* The next slab, allocated ahead off the loop.  Its budget is reserved
 * (and in held_bytes) from the start; once the store lets go of it
 * (c == NULL) the allocation's end frees it and returns the budget. */
struct kvd__cache_ahead {
    kvd__cache_store_t *c;
    kvd__hostmem_t *hm;
    kvd__cache_mem_t mem;
    uint64_t held; /* bytes and entries of nblocks */
    uint64_t data; /* of held, the blocks' bytes (the rest: their entries) */
    uint32_t nblocks;
    int ready;
    int needed; /* a request waits for it: a failure is said to the next */
    void *ptr, *handle;
};

/* The first unused slab index and its blocks; 0 blocks when none is left. */
static uint32_t next_slab(const kvd__cache_store_t *c, uint32_t *s_out)
{
    uint32_t s, per = 1u << c->slab_shift;

    for (s = 0; s < c->nslabs_max; s++)
        if (c->slabs[s].ptr == NULL)
            break;
    *s_out = s;
    if (s == c->nslabs_max)
        return 0;
    return (uint64_t)s * per + per <= c->capacity ? per : c->capacity - s * per;
}

static uint64_t slab_held(const kvd__cache_store_t *c, uint32_t n)
{
    return (uint64_t)n * (c->block_bytes + sizeof(uint32_t)); /* entries: ent_new */
}

/* A slab's part of the budget: its blocks' bytes as "cache", their
 * free-list room (held - data) as "cache-index"; both or neither. */
static kvd_status_t slab_reserve(kvd__hostmem_t *hm, uint64_t held, uint64_t data, char *why,
                                 size_t why_len)
{
    kvd_status_t st = kvd__hostmem_reserve(hm, KVD_HM_CACHE, data, why, why_len);

    if (st != KVD_OK)
        return st;
    st = kvd__hostmem_reserve(hm, KVD_HM_CACHE_INDEX, held - data, why, why_len);
    if (st != KVD_OK)
        kvd__hostmem_release(hm, KVD_HM_CACHE, data);
    return st;
}

static void slab_unreserve(kvd__hostmem_t *hm, uint64_t held, uint64_t data)
{
    kvd__hostmem_release(hm, KVD_HM_CACHE, data);
    kvd__hostmem_release(hm, KVD_HM_CACHE_INDEX, held - data);
}

/* Free a slab's memory and give back its part of the budget: the blocks'
 * bytes once they are gone, where the memory is freed later. */
static void slab_give_back(const kvd__cache_mem_t *mem, kvd__hostmem_t *hm, void *handle,
                           uint64_t held, uint64_t data)
{
    if (mem->free_later != NULL) {
        mem->free_later(mem->ctx, handle, KVD_HM_CACHE, data);
        kvd__hostmem_release(hm, KVD_HM_CACHE_INDEX, held - data);
        return;
    }
    mem->free(mem->ctx, handle);
    slab_unreserve(hm, held, data);
}

/* Let go of the slab allocated ahead: freed now if ready, else when its
 * allocation ends. */
static void ahead_drop(kvd__cache_store_t *c)
{
    struct kvd__cache_ahead *a = c->ahead;

    if (a == NULL)
        return;
    c->ahead = NULL;
    c->held_bytes -= a->held;
    if (!a->ready) {
        a->c = NULL;
        return;
    }
    slab_give_back(&a->mem, a->hm, a->handle, a->held, a->data);
    free(a);
}

static void ahead_done(void *arg, kvd_status_t st, void *ptr, void *handle)
{
    struct kvd__cache_ahead *a = arg;
    kvd__cache_store_t *c = a->c;
    uint32_t n = st == KVD_OK ? a->nblocks : 0;

    if (c == NULL || st != KVD_OK) {
        if (st == KVD_OK) /* let go of meanwhile: freed as a slab is */
            slab_give_back(&a->mem, a->hm, handle, a->held, a->data);
        else
            slab_unreserve(a->hm, a->held, a->data);
        if (c != NULL) {
            c->held_bytes -= a->held;
            c->ahead = NULL;
            if (a->needed) { /* the request that waits for it hears why */
                c->ahead_failed = st;
                snprintf(c->ahead_why, sizeof(c->ahead_why), "the cache's next slab of %llu "
                         "bytes could not be made (%s)", (unsigned long long)a->data,
                         kvd_strerror(st));
            }
        }
        free(a);
    } else {
        a->ready = 1;
        a->ptr = ptr;
        a->handle = handle;
        if (c->nslabs == c->nslabs_max) /* the cache grew to its budget meanwhile */
            ahead_drop(c);
    }
    if (c != NULL && c->grown != NULL)
        c->grown(c->grown_arg, n);
}

/* Start allocating the slab after the ones there: KVD_OK where one is on
 * its way (or there already), else why not (the budget has no room for
 * it now, or it could not be started). */
static kvd_status_t slab_ahead(kvd__cache_store_t *c, char *why, size_t why_len)
{
    struct kvd__cache_ahead *a;
    uint32_t s, n;
    kvd_status_t st;

    if (c->ahead != NULL)
        return KVD_OK;
    if ((n = next_slab(c, &s)) == 0) {
        snprintf(why, why_len, "the cache holds its budget's %u blocks", c->capacity);
        return KVD_ELIMIT;
    }
    if ((a = calloc(1, sizeof(*a))) == NULL) {
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    a->c = c;
    a->hm = c->hostmem;
    a->mem = c->mem;
    a->nblocks = n;
    a->held = slab_held(c, n);
    a->data = (uint64_t)n * c->block_bytes;
    if ((st = slab_reserve(c->hostmem, a->held, a->data, why, why_len)) != KVD_OK) {
        free(a);
        return st;
    }
    c->ahead = a;
    c->held_bytes += a->held;
    if ((st = c->mem.alloc_ahead(c->mem.ctx, a->data, ahead_done, a)) != KVD_OK) {
        c->ahead = NULL;
        c->held_bytes -= a->held;
        slab_unreserve(c->hostmem, a->held, a->data);
        free(a);
        snprintf(why, why_len, "the cache's next slab could not be started (%s)",
                 kvd_strerror(st));
        return st;
    }
    return KVD_OK;
}

/* A slab's part of the host list (n slots), charged as index memory;
 * NULL with why (the budget's refusal, or out of memory). */
static kvd__chost_t *hs_new(kvd__cache_store_t *c, uint32_t n, char *why, size_t why_len)
{
    uint64_t bytes = (uint64_t)n * sizeof(kvd__chost_t);
    kvd__chost_t *hs;

    if (kvd__hostmem_reserve(c->hostmem, KVD_HM_CACHE_INDEX, bytes, why, why_len) != KVD_OK)
        return NULL;
    if ((hs = calloc(n, sizeof(*hs))) == NULL) {
        kvd__hostmem_release(c->hostmem, KVD_HM_CACHE_INDEX, bytes);
        snprintf(why, why_len, "out of memory for a slab's host list");
        return NULL;
    }
    c->held_bytes += bytes;
    return hs;
}

static void hs_free(kvd__cache_store_t *c, kvd__chost_t *hs, uint32_t n)
{
    uint64_t bytes = (uint64_t)n * sizeof(kvd__chost_t);

    if (hs == NULL)
        return;
    free(hs);
    c->held_bytes -= bytes;
    kvd__hostmem_release(c->hostmem, KVD_HM_CACHE_INDEX, bytes);
}

static kvd_status_t slab_add(kvd__cache_store_t *c, char *why, size_t why_len)
{
    uint32_t s, n, i;
    uint64_t bytes, held;
    size_t total;
    kvd__cache_slab_t *sl = NULL;
    struct kvd__cache_ahead *a;
    uint32_t *f;
    kvd__chost_t *hs = NULL;
    kvd_status_t st;

    if ((n = next_slab(c, &s)) == 0) {
        snprintf(why, why_len, "the cache holds its budget's %u blocks", c->capacity);
        return KVD_ELIMIT;
    }
    if (c->ahead != NULL && c->ahead->ready && c->ahead->nblocks != n)
        ahead_drop(c); /* made for a slab of another size */
    a = c->ahead != NULL && c->ahead->ready ? c->ahead : NULL;
    if (a == NULL && c->mem.alloc_ahead != NULL) {
        /* made off this thread; the caller waits for it (grown) */
        if ((st = c->ahead_failed) != KVD_OK) { /* said once, then tried again */
            c->ahead_failed = KVD_OK;
            snprintf(why, why_len, "%s", c->ahead_why);
            return st;
        }
        if ((st = slab_ahead(c, why, why_len)) != KVD_OK)
            return st;
        c->ahead->needed = 1;
        snprintf(why, why_len, "the cache's next slab of host memory is being made");
        return KVD_EBUSY;
    }
    sl = &c->slabs[s];
    bytes = (uint64_t)n * c->block_bytes;
    held = slab_held(c, n);
    /* its budget is reserved already when it was allocated ahead */
    if (a == NULL && (st = slab_reserve(c->hostmem, held, bytes, why, why_len)) != KVD_OK)
        return st;
    /* room for every block of every slab: clearing or evicting a subtree
     * frees many at once */
    for (i = 0, total = n; i < c->nslabs_max; i++)
        total += c->slabs[i].nblocks;
    f = realloc(c->free_ids, total * sizeof(*f));
    if (f != NULL)
        c->free_ids = f;
    if (f == NULL || (c->disk_parts && (hs = hs_new(c, n, why, why_len)) == NULL)) {
        if (a == NULL)
            slab_unreserve(c->hostmem, held, bytes);
        if (f == NULL)
            snprintf(why, why_len, "out of memory for a slab's entries");
        return f == NULL ? KVD_ENOMEM : KVD_ELIMIT;
    }
    if (a != NULL) {
        sl->ptr = a->ptr;
        sl->handle = a->handle;
        c->ahead = NULL;
        free(a);
    } else if ((st = c->mem.alloc(c->mem.ctx, bytes, &sl->ptr, &sl->handle, why, why_len)) !=
               KVD_OK) {
        sl->ptr = NULL;
        slab_unreserve(c->hostmem, held, bytes);
        hs_free(c, hs, n);
        return st;
    } else {
        c->held_bytes += held;
    }
    sl->nblocks = n;
    sl->hs = hs;
    for (i = n; i-- > 0;) /* the lowest first */
        c->free_ids[c->nfree++] = (s << c->slab_shift) | i;
    c->nslabs++;
    if (c->nslabs == c->nslabs_max)
        ahead_drop(c); /* one still allocating is of no use now */
    else if (c->mem.alloc_ahead != NULL)
        (void)slab_ahead(c, why, why_len); /* none where the budget has no room now */
    return KVD_OK;
}

static void slab_free(kvd__cache_store_t *c, uint32_t s)
{
    kvd__cache_slab_t *sl = &c->slabs[s];
    uint32_t n = sl->nblocks;
    uint64_t held = slab_held(c, n);

    slab_give_back(&c->mem, c->hostmem, sl->handle, held, (uint64_t)n * c->block_bytes);
    hs_free(c, sl->hs, n);
    memset(sl, 0, sizeof(*sl));
    c->nslabs--;
    c->held_bytes -= held;
}

/* ---- lifecycle ---------------------------------------------------------------- */

kvd_status_t kvd__cache_store_init(kvd__cache_store_t *c, const kvd__block_layout_t *l,
                                   uint64_t budget, kvd__hostmem_t *hm, const kvd__cache_mem_t *mem,
                                   char *why, size_t why_len)
{
    uint64_t chunk, block, cap, per;
    uint32_t shift = 0;
    kvd_status_t st;

    memset(c, 0, sizeof(*c));
    if (l->num_layers < 1 || l->tokens_per_block < 1 || l->token_bytes < 1) {
        snprintf(why, why_len, "layers, tokens per block and token bytes must be >= 1");
        return KVD_EINVAL;
    }
    if (__builtin_mul_overflow((uint64_t)l->tokens_per_block, l->token_bytes, &chunk) ||
        __builtin_mul_overflow(chunk, (uint64_t)l->num_layers * (l->mla ? 1 : 2), &block) ||
        block > (1ull << 40)) {
        snprintf(why, why_len, "a block of that layout is too large");
        return KVD_EOVERFLOW;
    }
    cap = budget / block;
    if (cap < 1) {
        snprintf(why, why_len, "a budget of %llu bytes holds no block of %llu bytes",
                 (unsigned long long)budget, (unsigned long long)block);
        return KVD_ERANGE;
    }
    if (cap > UINT32_MAX - 1)
        cap = UINT32_MAX - 1;
    per = SLAB_BYTES / block;
    while ((1ull << (shift + 1)) <= per && (1u << (shift + 1)) <= SLAB_BLOCKS_MAX &&
           (1ull << shift) < cap)
        shift++;
    c->layout = *l;
    c->chunk_bytes = chunk;
    c->block_bytes = block;
    c->budget = budget;
    c->capacity = (uint32_t)cap;
    c->slab_shift = shift;
    c->nslabs_max = (uint32_t)((cap + (1ull << shift) - 1) >> shift);
    c->hostmem = hm;
    c->mem = *mem;
    if (getrandom(&c->seed, sizeof(c->seed), 0) != sizeof(c->seed))
        c->seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)c;
    c->slabs = calloc(c->nslabs_max, sizeof(*c->slabs));
    c->table = zalloc(TABLE_MIN * sizeof(*c->table));
    if (c->slabs == NULL || c->table == NULL) {
        free(c->slabs);
        free(c->table);
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    c->table_mask = TABLE_MIN - 1;
    st = kvd__hostmem_reserve(hm, KVD_HM_CACHE_INDEX, TABLE_MIN * sizeof(uint64_t), why, why_len);
    if (st != KVD_OK) {
        free(c->slabs);
        free(c->table);
        return st;
    }
    c->held_bytes = TABLE_MIN * sizeof(uint64_t);
    return KVD_OK;
}

static void disk_close(kvd__cache_store_t *c);

void kvd__cache_store_deinit(kvd__cache_store_t *c)
{
    uint32_t s;

    disk_close(c);
    ahead_drop(c);
    for (s = 0; s < c->nslabs_max; s++)
        if (c->slabs[s].ptr != NULL)
            slab_free(c, s);
    kvd__hostmem_release(c->hostmem, KVD_HM_CACHE_INDEX, c->held_bytes); /* table, entries */
    free(c->slabs);
    zfree(c->table, (c->table_mask + 1) * sizeof(*c->table));
    free(c->free_ids);
    for (s = 0; s < c->nchunks; s++)
        chunk_free(c, s);
    free(c->chunks);
    memset(c, 0, sizeof(*c));
}

/* ---- the disk level ---------------------------------------------------------- */

/* ---- lookups ------------------------------------------------------------------- */

/* Move the chain first..last, linked in that order in the recency list
 * (first's next is the block after it, and so on), to its head. */
static void lru_move_piece(kvd__cache_store_t *c, uint32_t first, uint32_t last)
{
    kvd__cblock_t *f, *l;

    if (c->lru.head == first + 1)
        return;
    f = B(c, first);
    l = B(c, last);
    /* unlink [first, last]: first has a predecessor, since it is not the head */
    B(c, f->lru.prev - 1)->lru.next = l->lru.next;
    if (l->lru.next)
        B(c, l->lru.next - 1)->lru.prev = f->lru.prev;
    else
        c->lru.tail = f->lru.prev;
    /* and put it at the head */
    l->lru.next = c->lru.head;
    B(c, c->lru.head - 1)->lru.prev = last + 1;
    f->lru.prev = 0;
    c->lru.head = first + 1;
    c->n.relinks++;
}

/* The host list's part of touching a chain: the last first. */
static void hlru_touch_chain(kvd__cache_store_t *c, const uint32_t *ids, uint32_t first,
                             uint32_t n)
{
    uint32_t i, id;

    for (i = n; i-- > 0;) {
        id = ids != NULL ? ids[i] : first + i;
        if (B(c, id)->lists & KVD_CLIST_HOST)
            hlru_touch(c, id);
    }
}

/* Touch the blocks of a chain, ids[0] its first: the first becomes the
 * most recently used, then the others in order.  A chain used before as a
 * whole already lies in that order in the list: then it moves as one
 * piece, whatever its length.  Each block moves once on each list. */
void kvd__cache_touch_chain(kvd__cache_store_t *c, const uint32_t *ids, uint32_t n)
{
    uint32_t i;

    if (n == 0)
        return;
    for (i = 0; i < n; i++) {
        const kvd__cblock_t *b = B(c, ids[i]);
        if (!(b->lists & KVD_CLIST_LRU) || !unheld(b) ||
            (i + 1 < n && b->lru.next != ids[i + 1] + 1))
            break;
    }
    if (i < n) { /* one at a time, the last first: both lists */
        for (i = n; i-- > 0;)
            kvd__cache_touch(c, ids[i]);
        return;
    }
    if (c->disk != NULL)
        hlru_touch_chain(c, ids, 0, n);
    lru_move_piece(c, ids[0], ids[n - 1]);
}

void kvd__cache_touch_run(kvd__cache_store_t *c, uint32_t first, uint32_t n)
{
    if (n == 0)
        return;
    if (c->disk != NULL)
        hlru_touch_chain(c, NULL, first, n);
    lru_move_piece(c, first, first + n - 1);
}

/* Key i of a lookup's chain: blob's ith of width bytes, or keys[i]. */
#define KEY_AT(i) (blob != NULL ? blob + (size_t)(i) * width : keys[i])
#define LEN_AT(i) (blob != NULL ? width : lens[i])

/* Whether entry b (not held, on the recency list) may move with a piece. */
static inline int movable(const kvd__cblock_t *b)
{
    return (b->lists & KVD_CLIST_LRU) && unheld(b);
}

/*
 * A lookup's walk, for keys as a blob of one width or as a list: a
 * chain saved in one go lies in consecutive entries (a save takes ids in
 * order while free ones come in order), so after a hit the next key is
 * first compared with the next entry, and a run of such hits walks the
 * entries and their keys in memory order, a chunk at a time, prefetching
 * ahead: one line of entries and of keys per few keys, no table.  A key
 * that breaks the run goes through the table, a group of keys at a time
 * hashed together and their slots and entries prefetched, so that their
 * misses overlap.  *linked: the hits are consecutive ids lying in that
 * order in the recency list, none held (kvd__cache_touch_run moves them).
 */
static inline __attribute__((always_inline)) uint32_t
lookup_walk(const kvd__cache_store_t *c, const uint8_t *blob, size_t width,
            const uint8_t *const *keys, const size_t *lens, uint32_t n, uint32_t *ids,
            int *linked)
{
    uint32_t i = 0, j, g = 0, m = 0, prev = KVD_CBLOCK_NONE, kw = c->key_width;
    uint64_t h[LOOKUP_GROUP];
    int lk = 1, next_ok = 1;

    while (i < n) {
        uint32_t id;
        uint64_t v;
        const kvd__cblock_t *b;

        /* the run after prev, a chunk at a time */
        for (id = prev + 1; prev != KVD_CBLOCK_NONE && i < n && id < c->ents_made;) {
            uint32_t pos, k = kvd__cache_chunk_of(id, &pos), lim = chunk_len(k) - pos;
            const uint8_t *s = c->chunks[k].keys + (size_t)pos * kw;

            b = &c->chunks[k].ents[pos];
            if (lim > c->ents_made - id)
                lim = c->ents_made - id;
            if (lim > n - i)
                lim = n - i;
            for (j = 0; j < lim; j++, b++, s += kw) {
                __builtin_prefetch(b + RUN_AHEAD);
                __builtin_prefetch(s + RUN_AHEAD * (size_t)kw);
                if (b->parent != id + j || b->state != KVD_CBLOCK_READY ||
                    !key_equal(b, s, KEY_AT(i), LEN_AT(i)))
                    break;
                lk &= next_ok & movable(b);
                next_ok = b->lru.next == id + j + 2;
                if (ids != NULL)
                    ids[i] = id + j;
                i++;
            }
            prev = id + j - 1;
            if (j < lim)
                break;
            id += lim;
        }
        if (i >= n)
            break;
        /* through the table, a group of keys at a time: their slots'
         * misses, then their entries', overlap */
        if (i >= g + m) {
            g = i;
            m = n - i < LOOKUP_GROUP ? n - i : LOOKUP_GROUP;
            for (j = 0; j < m; j++) {
                h[j] = key_hash(c->seed, KEY_AT(g + j), LEN_AT(g + j));
                __builtin_prefetch(&c->table[h[j] & c->table_mask]);
            }
            for (j = 0; j < m; j++) {
                v = c->table[h[j] & c->table_mask];
                if (v != 0 && v >> 32 == h[j] >> 32) {
                    const uint8_t *s;

                    __builtin_prefetch(entry_at(c, (uint32_t)v - 1, &s));
                    __builtin_prefetch(s);
                }
            }
        }
        v = *slot_at(c, h[i - g], KEY_AT(i), LEN_AT(i));
        if (v == 0)
            break;
        id = (uint32_t)v - 1;
        b = B(c, id);
        if (b->state != KVD_CBLOCK_READY)
            break;
        /* a hit off the run: linked only as the chain's first; the run
         * that may follow starts its lines coming now */
        if (id + 1 < c->ents_made) {
            uint32_t pos, k = kvd__cache_chunk_of(id + 1, &pos);
            const uint8_t *e = (const uint8_t *)&c->chunks[k].ents[pos];
            const uint8_t *s = c->chunks[k].keys + (size_t)pos * kw;

            for (j = 0; j < RUN_AHEAD * sizeof(*b); j += 64)
                __builtin_prefetch(e + j);
            for (j = 0; j < RUN_AHEAD * kw; j += 64)
                __builtin_prefetch(s + j);
        }
        lk &= (i == 0) & movable(b);
        next_ok = b->lru.next == id + 2;
        if (ids != NULL)
            ids[i] = id;
        prev = id;
        i++;
    }
    if (linked != NULL)
        *linked = lk;
    return i;
}

uint32_t kvd__cache_lookup(kvd__cache_store_t *c, const uint8_t *const *keys, const size_t *lens,
                           uint32_t n, int touch, uint32_t *ids)
{
    const uint8_t *blob = NULL;
    size_t width = 0;
    uint32_t i, hit = lookup_walk(c, blob, width, keys, lens, n, ids, NULL);

    if (touch && ids != NULL)
        kvd__cache_touch_chain(c, ids, hit);
    else if (touch) /* the last first: parents stay more recent than children */
        for (i = hit; i-- > 0;)
            kvd__cache_touch(c, kvd__cache_find(c, keys[i], lens[i]));
    return hit;
}

uint32_t kvd__cache_lookup_blob(const kvd__cache_store_t *c, const uint8_t *blob, size_t width,
                                uint32_t n, uint32_t *ids, int *linked)
{
    return lookup_walk(c, blob, width, NULL, NULL, n, ids, linked);
}

#undef KEY_AT
#undef LEN_AT

/* ---- eviction ------------------------------------------------------------------ */

static void disk_forget(kvd__cache_store_t *c, uint32_t id);
static kvd_status_t host_evict_one(kvd__cache_store_t *c);
static void disk_write(kvd__cache_store_t *c, uint32_t id);

static int evictable(const kvd__cblock_t *b)
{
    return b->state == KVD_CBLOCK_READY && b->holds == 0 && b->first_child == 0;
}

/* Link id into its parent's list of children / take it out. */
static void child_link(kvd__cache_store_t *c, uint32_t parent, uint32_t id)
{
    kvd__cblock_t *p = B(c, parent), *b = B(c, id);

    b->prev_sibling = 0;
    b->next_sibling = p->first_child;
    if (p->first_child)
        B(c, p->first_child - 1)->prev_sibling = id + 1;
    p->first_child = id + 1;
}

static void child_unlink(kvd__cache_store_t *c, uint32_t parent, uint32_t id)
{
    kvd__cblock_t *b = B(c, id);

    if (b->prev_sibling)
        B(c, b->prev_sibling - 1)->next_sibling = b->next_sibling;
    else
        B(c, parent)->first_child = b->next_sibling;
    if (b->next_sibling)
        B(c, b->next_sibling - 1)->prev_sibling = b->prev_sibling;
    b->prev_sibling = b->next_sibling = 0;
}

/* Take block id out of the index and give it back to the free list; then
 * its parent loses a child (iteratively: dead parents may chain up). */
static void release_block(kvd__cache_store_t *c, uint32_t id)
{
    for (;;) {
        kvd__cblock_t *b = B(c, id), *p;
        uint32_t parent = b->parent;

        lru_remove(c, id);
        hlru_remove(c, id);
        if (b->state != KVD_CBLOCK_DEAD) {
            table_delete(c, slot_of(c, key_of(c, id), b->klen));
            c->indexed--;
        }
        if (b->state == KVD_CBLOCK_READY) {
            c->ready--;
            if (b->host == 0)
                c->disk_only--;
        }
        if (parent)
            child_unlink(c, parent - 1, id);
        host_free(c, b);
        disk_forget(c, id);
        ent_free(c, id);
        if (!parent)
            return;
        p = B(c, parent - 1);
        if (p->first_child)
            return;
        if (p->state != KVD_CBLOCK_DEAD || p->holds > 0) {
            if (evictable(p) && !(p->lists & KVD_CLIST_LRU))
                list_insert(c, KVD_CLIST_LRU, parent - 1, 0);
            if (evictable(p) && p->host && (p->dflags & KVD_CBLOCK_NODISK) &&
                !(p->lists & KVD_CLIST_HOST)) /* host memory only: free to go now */
                list_insert(c, KVD_CLIST_HOST, parent - 1, 0);
            return;
        }
        id = parent - 1;
    }
}

/* Evict the least recently used evictable block: KVD_OK, or KVD_EBUSY
 * when there is none. */
static kvd_status_t evict_one(kvd__cache_store_t *c)
{
    while (c->lru.tail) {
        uint32_t id = c->lru.tail - 1;

        if (!evictable(B(c, id))) {
            lru_remove(c, id); /* back once free to go */
            continue;
        }
        release_block(c, id);
        c->n.evictions++;
        return KVD_OK;
    }
    return KVD_EBUSY;
}

/* A free host slot in free_ids: one there, a new slab, or one evicted
 * (host memory only: the least recently used block that can go; with a
 * disk level: the host copy of the least recently used block already on
 * disk, the block staying there). */
static kvd_status_t take_slot(kvd__cache_store_t *c, char *why, size_t why_len)
{
    kvd_status_t st;

    if (c->nfree > 0 || (st = slab_add(c, why, why_len)) == KVD_OK)
        return KVD_OK;
    /* under its budget it grows rather than lose a block; a host copy
     * already on disk loses nothing (kvd__cache_prepare waits instead) */
    if (kvd__cache_growing(c))
        return c->disk != NULL && host_evict_one(c) == KVD_OK ? KVD_OK : KVD_EBUSY;
    if ((c->disk != NULL ? host_evict_one(c) : evict_one(c)) == KVD_OK)
        return KVD_OK;
    if (c->nslabs == 0) /* no room for a first slab: the host-memory budget's why */
        return st;
    if (c->disk != NULL) {
        kvd__disk_store_flush(c->disk->store); /* the writes that free blocks go now */
        c->disk->host_full++;
    }
    if (c->disk != NULL)
        snprintf(why, why_len, "every block in the cache's host memory is leased, being loaded, "
                 "saved or written to disk (the disk is behind), or the parent of one");
    else
        snprintf(why, why_len, "every block of the cache is leased, being loaded or saved, or "
                 "the parent of one");
    return KVD_EBUSY;
}

kvd_status_t kvd__cache_reserve(kvd__cache_store_t *c, uint32_t parent, const uint8_t *key,
                                size_t klen, uint32_t *out, char *why, size_t why_len)
{
    kvd__cblock_t *b;
    kvd_status_t st;
    uint32_t id;

    if (klen < 1 || klen > KVD_CACHE_KEY_MAX)
        return KVD_EINVAL;
    if ((st = keys_fit(c, klen, why, why_len)) != KVD_OK)
        return st;
    if ((st = table_room(c, why, why_len)) != KVD_OK)
        return st;
    if ((st = take_slot(c, why, why_len)) != KVD_OK)
        return st;
    if ((st = ent_new(c, &id, why, why_len)) != KVD_OK)
        return st;
    b = B(c, id);
    host_take(c, id);
    memcpy(key_of(c, id), key, klen);
    b->klen = (uint8_t)klen;
    b->state = KVD_CBLOCK_FILLING;
    b->holds = 1;
    if (parent != KVD_CBLOCK_NONE) {
        b->parent = parent + 1;
        child_link(c, parent, id);
    }
    *slot_of(c, key, klen) = (key_hash(c->seed, key, klen) >> 32) << 32 | ((uint64_t)id + 1);
    c->indexed++;
    *out = id;
    return KVD_OK;
}

int kvd__cache_commit(kvd__cache_store_t *c, uint32_t id)
{
    kvd__cblock_t *b = B(c, id);

    if (b->parent && B(c, b->parent - 1)->state == KVD_CBLOCK_DEAD) {
        kvd__cache_abort(c, id);
        return 0;
    }
    b->state = KVD_CBLOCK_READY;
    c->ready++;
    if (b->host == 0) /* written early, its host copy gone (kvd__cache_write_early) */
        c->disk_only++;
    if (c->disk != NULL && !on_disk(c, id) &&
        !(b->dflags & (KVD_CBLOCK_WRITING | KVD_CBLOCK_NODISK)))
        disk_write(c, id); /* holds it while its record is written */
    kvd__cache_unhold(c, id);
    return 1;
}

void kvd__cache_abort(kvd__cache_store_t *c, uint32_t id)
{
    kvd__cblock_t *b = B(c, id);

    if (b->holds > 0)
        b->holds--;
    if (b->holds == 0 && b->first_child == 0) {
        release_block(c, id);
        return;
    }
    /* a dead block left the index already (drop_subtree): its key's slot
     * may hold a block saved since */
    if (b->state != KVD_CBLOCK_DEAD) {
        table_delete(c, slot_of(c, key_of(c, id), b->klen));
        c->indexed--;
        b->state = KVD_CBLOCK_DEAD;
    }
}

void kvd__cache_hold(kvd__cache_store_t *c, uint32_t id)
{
    kvd__cblock_t *b = B(c, id);

    b->holds++;
    lru_remove(c, id);
    hlru_remove(c, id);
}

void kvd__cache_unhold(kvd__cache_store_t *c, uint32_t id)
{
    kvd__cblock_t *b = B(c, id);

    if (b->holds > 0)
        b->holds--;
    /* held by its record's write alone, a block is used and listed now
     * (a save's commit): the write is no use of it, and its end leaves it
     * where it is on the recency list (disk_written) */
    if (b->holds > ((b->dflags & KVD_CBLOCK_WRITING) != 0))
        return;
    if (b->state == KVD_CBLOCK_READY) {
        list_insert(c, KVD_CLIST_LRU, id, 1); /* just used */
        hlru_touch(c, id);
    } else if (b->state == KVD_CBLOCK_DEAD && b->holds == 0 && b->first_child == 0)
        release_block(c, id);
}

/* ---- explicit eviction ------------------------------------------------------------ */

/* The next block of root's subtree after id in preorder, or
 * KVD_CBLOCK_NONE: down to a child, else across to a sibling, else up
 * until an ancestor (below root) has one.  No memory beyond the links. */
static uint32_t subtree_next(const kvd__cache_store_t *c, uint32_t root, uint32_t id)
{
    const kvd__cblock_t *b = B(c, id);

    if (b->first_child)
        return b->first_child - 1;
    while (id != root) {
        b = B(c, id);
        if (b->next_sibling)
            return b->next_sibling - 1;
        id = b->parent - 1;
    }
    return KVD_CBLOCK_NONE;
}

/* The subtree under root goes whole, or nothing when a part of it is held
 * or filling: one walk to check, one to release leaves first. */
kvd_status_t kvd__cache_evict_key(kvd__cache_store_t *c, const uint8_t *key, size_t klen,
                                  uint32_t *evicted)
{
    uint32_t root = kvd__cache_find(c, key, klen), id, n = 0;

    *evicted = 0;
    if (root == KVD_CBLOCK_NONE)
        return KVD_ENOENT;
    for (id = root; id != KVD_CBLOCK_NONE; id = subtree_next(c, root, id)) {
        const kvd__cblock_t *b = B(c, id);
        if (b->holds > 0 || b->state != KVD_CBLOCK_READY)
            return KVD_EBUSY;
    }
    for (id = root;;) {
        uint32_t parent;

        while (B(c, id)->first_child) /* down to a leaf */
            id = B(c, id)->first_child - 1;
        parent = B(c, id)->parent;
        n++;
        if (id == root) {
            release_block(c, id); /* may release a dead parent above too */
            break;
        }
        release_block(c, id);
        id = parent - 1; /* on from there: each block is met twice at most */
    }
    c->n.evictions += n;
    *evicted = n;
    return KVD_OK;
}

uint32_t kvd__cache_clear(kvd__cache_store_t *c)
{
    uint32_t n = 0, s, i, k;

    while (evict_one(c) == KVD_OK)
        n++;
    /* give back the slabs left empty, and their free ids */
    for (s = 0; s < c->nslabs_max; s++)
        if (c->slabs[s].ptr != NULL && c->slabs[s].used == 0)
            slab_free(c, s);
    for (i = 0, k = 0; i < c->nfree; i++)
        if (c->slabs[kvd__cache_slab_of(c, c->free_ids[i])].ptr != NULL)
            c->free_ids[k++] = c->free_ids[i];
    c->nfree = k;
    /* the cache gives its memory back, but for a slab on its way: a
     * request may wait for it */
    if (c->ahead != NULL && c->ahead->ready)
        ahead_drop(c);
    return n;
}

/* ---- the disk level ---------------------------------------------------------- */

static inline kvd__disk_loc_t loc_of(const kvd__cache_store_t *c, uint32_t id)
{
    const kvd__cdisk_t *d = D(c, id);

    return KVD_DISK_LOC(d->dseg, d->doff);
}

uint64_t kvd__cache_layout_id(const kvd__block_layout_t *l)
{
    char text[KVD_DISK_LAYOUT_TEXT];
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a: the same on every run */

    kvd__cache_layout_text(l, text, sizeof(text));
    for (const char *p = text; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    return h;
}

void kvd__cache_layout_text(const kvd__block_layout_t *l, char *out, size_t len)
{
    snprintf(out, len, "layers=%u %s tokens_per_block=%u token_bytes=%" PRIu64 " dtype=%.16s",
             l->num_layers, l->mla ? "mla" : "kv", l->tokens_per_block, l->token_bytes,
             l->dtype);
}

/* The entry lets go of its record (its entry is going: nothing reads or
 * writes it, it holds nothing). */
static void disk_forget(kvd__cache_store_t *c, uint32_t id)
{
    kvd__cdisk_t *d;

    if (c->disk == NULL || !on_disk(c, id))
        return;
    d = D(c, id);
    kvd__disk_drop(c->disk->store, loc_of(c, id));
    c->disk->records--;
    d->dseg = d->doff = 0;
}

/* Blocks in host memory only that a search for a record to drop passes
 * over before it gives up (there are at most as many as host slots). */
#define DISK_EVICT_SKIP 64

/* The least recently used block that can go and has a record leaves the
 * cache (both levels).  Blocks that cannot go leave the list, as in
 * evict_one; blocks in host memory only are passed over, a few at most. */
static kvd_status_t disk_evict_one(kvd__cache_store_t *c)
{
    uint32_t at = c->lru.tail, skipped = 0;

    while (at && skipped < DISK_EVICT_SKIP) {
        uint32_t id = at - 1;
        kvd__cblock_t *b = B(c, id);

        at = b->lru.prev;
        if (!evictable(b)) {
            lru_remove(c, id); /* back once free to go */
            continue;
        }
        if (!on_disk(c, id)) {
            skipped++;
            continue;
        }
        release_block(c, id);
        c->n.evictions++;
        return KVD_OK;
    }
    return KVD_EBUSY;
}

/* Room for one more record: the least recently used blocks with records
 * that can go leave the cache (both levels) until there is.  0: none
 * could. */
static int disk_room(kvd__cache_store_t *c)
{
    struct kvd__cache_disk *d = c->disk;

    while (d->records >= d->cap) {
        if (disk_evict_one(c) != KVD_OK)
            return 0;
        d->evictions++;
    }
    return 1;
}

static void disk_written(void *arg, kvd_status_t st, kvd__disk_loc_t loc)
{
    disk_write_ctx_t *w = arg;
    kvd__cache_store_t *c = w->c;
    kvd__cblock_t *b = B(c, w->id);

    b->dflags &= (uint8_t)~KVD_CBLOCK_WRITING;
    if (st == KVD_OK) {
        D(c, w->id)->dseg = KVD_DISK_LOC_SEG(loc);
        D(c, w->id)->doff = KVD_DISK_LOC_OFF(loc);
        c->disk->writes++;
        if (b->state == KVD_CBLOCK_FILLING) /* written early: its slot takes the next block */
            host_free(c, b);
    } else {
        c->disk->records--;
        c->disk->failed_writes++;
        b->dflags |= KVD_CBLOCK_NODISK;
    }
    if (b->state == KVD_CBLOCK_READY && b->holds == 1 && (b->lists & KVD_CLIST_LRU)) {
        /* on the recency list where its last use put it (its commit, as a
         * save leaves a chain: in chain order, whatever order its records
         * land in); the host list takes it in that order */
        b->holds = 0;
        hlru_place(c, w->id);
    } else {
        kvd__cache_unhold(c, w->id); /* eviction met it meanwhile: back as just used */
    }
    free(w);
    c->disk->writing--;
    if (c->disk->written != NULL) /* its host slot may go now */
        c->disk->written(c->disk->written_arg);
}

/* A block's record is not written: it stays in host memory only.  The
 * first refusal of a run is logged. */
static void disk_refused(kvd__cache_store_t *c, kvd__cblock_t *b, const char *why)
{
    struct kvd__cache_disk *d = c->disk;

    d->refused++;
    b->dflags |= KVD_CBLOCK_NODISK;
    if (!d->refusing)
        kvd_log(KVD_LOG_WARN, "event=cache_disk_write_refused reason=\"%s\" effect=\"blocks "
                "stay in host memory only\"", why);
    d->refusing = 1;
}

/* Write through: a block just committed goes to disk from its host bytes,
 * which the write holds until it is done.  Where the budget has no room
 * and nothing can go, or the store refuses, the block stays in host
 * memory only (counted). */
static void disk_write(kvd__cache_store_t *c, uint32_t id)
{
    struct kvd__cache_disk *d = c->disk;
    kvd__cblock_t *b = B(c, id);
    uint32_t p = b->parent ? b->parent - 1 : KVD_CBLOCK_NONE;
    disk_write_ctx_t *w;

    if (!disk_room(c) || (w = malloc(sizeof(*w))) == NULL) {
        disk_refused(c, b, "the disk budget is full of blocks that are held or named as "
                     "parents");
        return;
    }
    w->c = c;
    w->id = id;
    if (kvd__disk_append(d->store, key_of(c, id), b->klen,
                         p != KVD_CBLOCK_NONE ? key_of(c, p) : NULL,
                         p != KVD_CBLOCK_NONE ? B(c, p)->klen : 0,
                         kvd__cache_block_bytes(c, id), disk_written, w) != KVD_OK) {
        free(w);
        disk_refused(c, b, "the disk store refused the record (it failed before)");
        return;
    }
    d->records++;
    d->writing++;
    d->refusing = 0;
    b->dflags |= KVD_CBLOCK_WRITING;
    b->holds++;
    lru_remove(c, id);
    hlru_remove(c, id);
}

int kvd__cache_write_early(kvd__cache_store_t *c, uint32_t id)
{
    kvd__cblock_t *b = B(c, id);

    if (c->disk == NULL || b->state != KVD_CBLOCK_FILLING || b->host == 0 ||
        (b->dflags & (KVD_CBLOCK_WRITING | KVD_CBLOCK_NODISK)) || on_disk(c, id))
        return 0;
    disk_write(c, id);
    return (b->dflags & KVD_CBLOCK_WRITING) != 0;
}

/* A host slot is needed: the least recently used block whose host copy
 * may go loses it (it stays on disk, or leaves the cache where its record
 * could not be written and nothing comes after it).  KVD_EBUSY: none. */
static kvd_status_t host_evict_one(kvd__cache_store_t *c)
{
    while (c->hlru.tail) {
        uint32_t id = HS(c, c->hlru.tail - 1)->owner;
        kvd__cblock_t *b = B(c, id);

        hlru_remove(c, id); /* back when used again */
        if (b->holds != 0 || b->host == 0 || b->state != KVD_CBLOCK_READY)
            continue;
        if (on_disk(c, id)) {
            host_free(c, b);
            c->disk_only++;
            c->disk->spills++;
            return KVD_OK;
        }
        if (evictable(b)) { /* host memory only, its write refused */
            release_block(c, id);
            c->n.evictions++;
            return KVD_OK;
        }
    }
    return KVD_EBUSY;
}

/* Every block of root's subtree leaves the index (its record failed): the
 * ones nothing holds go now, the others once let go. */
static void drop_subtree(kvd__cache_store_t *c, uint32_t root)
{
    uint32_t *all = NULL, n = 0, cap = 0, id;

    for (id = root; id != KVD_CBLOCK_NONE; id = subtree_next(c, root, id)) {
        kvd__cblock_t *b = B(c, id);

        if (n == cap) {
            uint32_t *m = realloc(all, (cap = cap ? cap * 2 : 16) * sizeof(*all));
            if (m == NULL) { /* the rest stays: at worst a chain misses later */
                kvd_log(KVD_LOG_ERROR, "event=cache_disk_drop_failed reason=\"out of memory\"");
                break;
            }
            all = m;
        }
        all[n++] = id;
        if (b->state == KVD_CBLOCK_DEAD)
            continue;
        lru_remove(c, id);
        hlru_remove(c, id);
        table_delete(c, slot_of(c, key_of(c, id), b->klen));
        c->indexed--;
        if (b->state == KVD_CBLOCK_READY) {
            c->ready--;
            if (b->host == 0)
                c->disk_only--;
        }
        b->state = KVD_CBLOCK_DEAD;
    }
    /* children before parents: a dead block goes once nothing holds it and
     * its children are gone */
    while (n-- > 0) {
        kvd__cblock_t *b = B(c, all[n]);
        if (b->state == KVD_CBLOCK_DEAD && b->holds == 0 && b->first_child == 0)
            release_block(c, all[n]);
    }
    free(all);
}

static inline uint32_t read_slot(const struct kvd__cache_disk *d, uint32_t id)
{
    return (uint32_t)(((uint64_t)id * 0x9e3779b97f4a7c15ull) >> 32) & d->reads_mask;
}

/* The read in flight of block id, or NULL. */
static disk_fetch_t *read_find(const struct kvd__cache_disk *d, uint32_t id)
{
    uint32_t i;

    if (d->reads == NULL)
        return NULL;
    for (i = read_slot(d, id); d->reads[i] != NULL; i = (i + 1) & d->reads_mask)
        if (d->reads[i]->id == id)
            return d->reads[i];
    return NULL;
}

static void read_put_slot(struct kvd__cache_disk *d, disk_fetch_t *f)
{
    uint32_t i = read_slot(d, f->id);

    while (d->reads[i] != NULL)
        i = (i + 1) & d->reads_mask;
    d->reads[i] = f;
}

/* Lists f (its block has no read in flight); -1 when out of memory. */
static int read_add(struct kvd__cache_disk *d, disk_fetch_t *f)
{
    if (d->reads == NULL || 2 * (d->nreads + 1) > d->reads_mask + 1) {
        uint32_t cap = d->reads == NULL ? 64 : 2 * (d->reads_mask + 1);
        uint32_t old_len = d->reads == NULL ? 0 : d->reads_mask + 1, i;
        disk_fetch_t **old = d->reads, **t = calloc(cap, sizeof(*t));

        if (t == NULL)
            return -1;
        d->reads = t;
        d->reads_mask = cap - 1;
        for (i = 0; i < old_len; i++)
            if (old[i] != NULL)
                read_put_slot(d, old[i]);
        free(old);
    }
    read_put_slot(d, f);
    d->nreads++;
    return 0;
}

/* Unlists f: the entries after it in its probe run move back over the
 * gap, so that every lookup still finds its read. */
static void read_del(struct kvd__cache_disk *d, const disk_fetch_t *f)
{
    uint32_t i = read_slot(d, f->id), j, home;

    while (d->reads[i] != f)
        i = (i + 1) & d->reads_mask;
    for (j = (i + 1) & d->reads_mask; d->reads[j] != NULL; j = (j + 1) & d->reads_mask) {
        home = read_slot(d, d->reads[j]->id);
        /* j's entry may fill the gap at i unless its home lies in (i, j] */
        if (((j - home) & d->reads_mask) >= ((j - i) & d->reads_mask)) {
            d->reads[i] = d->reads[j];
            i = j;
        }
    }
    d->reads[i] = NULL;
    d->nreads--;
}

static void fetch_done(void *arg, kvd_status_t st)
{
    disk_fetch_t *f = arg, *w;
    kvd__cache_store_t *c = f->c;
    struct kvd__cache_disk *d = c->disk;
    kvd__cblock_t *b = B(c, f->id);

    read_del(d, f);
    b->dflags &= (uint8_t)~KVD_CBLOCK_FETCHING;
    if (st == KVD_OK && b->state == KVD_CBLOCK_READY) {
        d->promotions++;
    } else {
        st = KVD_EIO;
        if (b->state != KVD_CBLOCK_DEAD)
            drop_subtree(c, f->id);
    }
    /* the callbacks first: a load holds the block before the read lets go */
    f->cb(f->arg, st);
    for (w = f->waiters; w != NULL;) {
        disk_fetch_t *nx = w->next;
        w->cb(w->arg, st);
        kvd__cache_unhold(c, w->id);
        free(w);
        w = nx;
    }
    kvd__cache_unhold(c, f->id); /* a promoted block: the most recently used */
    free(f);
}

kvd_status_t kvd__cache_fetch(kvd__cache_store_t *c, uint32_t id, kvd__cache_fetch_cb cb, void *arg,
                              char *why, size_t why_len)
{
    struct kvd__cache_disk *d = c->disk;
    kvd__cblock_t *b = B(c, id);
    disk_fetch_t *f, *g;
    kvd_status_t st;

    if (d == NULL || b->state != KVD_CBLOCK_READY ||
        (b->host != 0 && !(b->dflags & KVD_CBLOCK_FETCHING))) {
        snprintf(why, why_len, "the block is not on disk only");
        return KVD_EINVAL;
    }
    if ((f = calloc(1, sizeof(*f))) == NULL) {
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    f->c = c;
    f->id = id;
    f->cb = cb;
    f->arg = arg;
    if (b->dflags & KVD_CBLOCK_FETCHING) { /* wait for the read under way */
        /* a fetching block has its read listed: never NULL */
        if ((g = read_find(d, id)) == NULL) {
            free(f);
            snprintf(why, why_len, "the block's read was lost");
            return KVD_EIO;
        }
        f->next = g->waiters;
        g->waiters = f;
        kvd__cache_hold(c, id);
        return KVD_OK;
    }
    kvd__cache_hold(c, id); /* the spill below must not take this block */
    if ((st = take_slot(c, why, why_len)) != KVD_OK) {
        kvd__cache_unhold(c, id);
        free(f);
        return st;
    }
    if (read_add(d, f) != 0) {
        kvd__cache_unhold(c, id);
        free(f);
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    host_take(c, id);
    c->disk_only--;
    b->dflags |= KVD_CBLOCK_FETCHING;
    if (kvd__disk_read(d->store, loc_of(c, id), key_of(c, id), b->klen,
                       kvd__cache_block_bytes(c, id),
                       fetch_done, f) != KVD_OK) {
        b->dflags &= (uint8_t)~KVD_CBLOCK_FETCHING;
        read_del(d, f);
        host_free(c, b);
        c->disk_only++;
        kvd__cache_unhold(c, id);
        free(f);
        snprintf(why, why_len, "the disk store refused the read");
        return KVD_EIO;
    }
    return KVD_OK;
}

void kvd__cache_grow(kvd__cache_store_t *c)
{
    char why[160];

    if (c->mem.alloc_ahead != NULL && c->nfree == 0)
        (void)slab_ahead(c, why, sizeof(why));
}

kvd_status_t kvd__cache_prepare(kvd__cache_store_t *c, uint32_t need, char *why, size_t why_len)
{
    if (c->mem.alloc_ahead == NULL)
        return KVD_OK; /* slabs are made when a reserve needs them */
    if (need > c->capacity)
        need = c->capacity;
    while (c->nfree < need) {
        kvd_status_t st = c->ahead_failed;

        if (st != KVD_OK) { /* the slab it waited for failed */
            c->ahead_failed = KVD_OK;
            snprintf(why, why_len, "%s", c->ahead_why);
            return st;
        }
        if ((st = slab_add(c, why, why_len)) == KVD_EBUSY)
            return st; /* one on its way */
        if (st != KVD_OK)
            return KVD_OK; /* at its budget, or the daemon's is full: reserves evict */
    }
    return KVD_OK;
}

int kvd__cache_growing(const kvd__cache_store_t *c)
{
    return c->ahead != NULL && !c->ahead->ready;
}

uint64_t kvd__cache_disk_writing(const kvd__cache_store_t *c)
{
    return c->disk != NULL ? c->disk->writing : 0;
}

void kvd__cache_disk_flush(kvd__cache_store_t *c)
{
    if (c->disk != NULL)
        kvd__disk_store_flush(c->disk->store);
}

uint32_t kvd__cache_disk_hits(kvd__cache_store_t *c, const uint32_t *ids, uint32_t n)
{
    uint32_t m = 0;

    if (c->disk == NULL)
        return 0;
    for (uint32_t i = 0; i < n; i++)
        m += !kvd__cache_in_host(c, ids[i]);
    c->disk->hits += m;
    return m;
}

/* ---- opening: every record found becomes a block on disk only ------------ */

static int found_record(void *arg, const kvd__disk_found_t *f)
{
    kvd__cache_store_t *c = arg;
    struct kvd__cache_disk *d = c->disk;
    uint32_t id = kvd__cache_find(c, f->key, f->klen);
    kvd__cblock_t *b;
    char why[160];

    if (f->klen < 1 || f->klen > KVD_CACHE_KEY_MAX || f->plen > KVD_CACHE_KEY_MAX)
        return 0;
    if (id != KVD_CBLOCK_NONE) { /* a newer record of the key: the older goes */
        b = B(c, id);
        if (d->nolder == d->older_cap) {
            uint64_t nc = d->older_cap ? d->older_cap * 2 : 64;
            kvd__disk_loc_t *m = realloc(d->older, nc * sizeof(*m));
            if (m == NULL)
                return 0; /* keep the older, lose the newer */
            d->older = m;
            d->older_cap = nc;
        }
        d->older[d->nolder++] = loc_of(c, id);
    } else {
        if (keys_fit(c, f->klen, why, sizeof(why)) != KVD_OK ||
            table_room(c, why, sizeof(why)) != KVD_OK ||
            ent_new(c, &id, why, sizeof(why)) != KVD_OK) {
            if (d->unindexed++ == 0) /* once: a short budget would refuse them all */
                kvd_log(KVD_LOG_WARN, "event=cache_disk_record_skipped reason=\"%s\"", why);
            return 0;
        }
        b = B(c, id);
        memcpy(key_of(c, id), f->key, f->klen);
        b->klen = f->klen;
        b->state = KVD_CBLOCK_READY;
        *slot_of(c, f->key, f->klen) =
            (key_hash(c->seed, f->key, f->klen) >> 32) << 32 | ((uint64_t)id + 1);
        c->indexed++;
        c->ready++;
        c->disk_only++;
        d->records++;
    }
    D(c, id)->dseg = KVD_DISK_LOC_SEG(f->loc);
    D(c, id)->doff = KVD_DISK_LOC_OFF(f->loc);
    /* its parent's key, resolved once every record is in */
    if (id >= d->poff_len) {
        uint32_t nl = d->poff_len ? d->poff_len : 1024;
        uint64_t *m;
        while (nl <= id)
            nl *= 2;
        if ((m = realloc(d->poff, nl * sizeof(*m))) == NULL)
            goto oom;
        memset(m + d->poff_len, 0, (nl - d->poff_len) * sizeof(*m));
        d->poff = m;
        d->poff_len = nl;
    }
    d->poff[id] = 0;
    if (f->parent != NULL && f->plen > 0) {
        if (d->pkeys_len + 1 + f->plen > d->pkeys_cap) {
            uint64_t nc = d->pkeys_cap ? d->pkeys_cap * 2 : 65536;
            uint8_t *m = realloc(d->pkeys, nc);
            if (m == NULL)
                goto oom;
            d->pkeys = m;
            d->pkeys_cap = nc;
        }
        if (d->pkeys_len == 0)
            d->pkeys[d->pkeys_len++] = 0; /* offset 0 means none */
        d->poff[id] = d->pkeys_len;
        d->pkeys[d->pkeys_len++] = f->plen;
        memcpy(d->pkeys + d->pkeys_len, f->parent, f->plen);
        d->pkeys_len += f->plen;
    }
    return 1;
oom:
    /* kept without a parent would break the prefix rule: mark it an orphan */
    if (id < d->poff_len)
        d->poff[id] = UINT64_MAX;
    return 1;
}

/* Every chunk made so far gets its disk parts (charged as index memory):
 * KVD_OK, or the budget's status or KVD_ENOMEM with why, nothing made. */
static void disk_parts_drop(kvd__cache_store_t *c);

static kvd_status_t disk_parts_make(kvd__cache_store_t *c, char *why, size_t why_len)
{
    uint64_t bytes = (uint64_t)chunks_len(c->nchunks) * sizeof(kvd__cdisk_t);
    uint32_t k;
    kvd_status_t st;

    if (bytes > 0 &&
        (st = kvd__hostmem_reserve(c->hostmem, KVD_HM_CACHE_INDEX, bytes, why, why_len)) != KVD_OK)
        return st;
    for (k = 0; k < c->nchunks; k++)
        if ((c->chunks[k].disk = zalloc((size_t)chunk_len(k) * sizeof(kvd__cdisk_t))) == NULL)
            break;
    if (k < c->nchunks) {
        while (k-- > 0) {
            zfree(c->chunks[k].disk, (size_t)chunk_len(k) * sizeof(kvd__cdisk_t));
            c->chunks[k].disk = NULL;
        }
        kvd__hostmem_release(c->hostmem, KVD_HM_CACHE_INDEX, bytes);
        snprintf(why, why_len, "out of memory for the cache's disk entries");
        return KVD_ENOMEM;
    }
    c->held_bytes += bytes;
    for (k = 0; k < c->nslabs_max; k++) /* slabs made before: their host list parts */
        if (c->slabs[k].ptr != NULL &&
            (c->slabs[k].hs = hs_new(c, c->slabs[k].nblocks, why, why_len)) == NULL) {
            while (k-- > 0) {
                hs_free(c, c->slabs[k].hs, c->slabs[k].nblocks);
                c->slabs[k].hs = NULL;
            }
            c->disk_parts = 1;
            disk_parts_drop(c);
            return KVD_ELIMIT;
        }
    c->disk_parts = 1;
    return KVD_OK;
}

/* The disk parts go again (a disk level that did not open). */
static void disk_parts_drop(kvd__cache_store_t *c)
{
    uint64_t bytes = (uint64_t)chunks_len(c->nchunks) * sizeof(kvd__cdisk_t);
    uint32_t k;

    if (!c->disk_parts)
        return;
    for (k = 0; k < c->nchunks; k++) {
        zfree(c->chunks[k].disk, (size_t)chunk_len(k) * sizeof(kvd__cdisk_t));
        c->chunks[k].disk = NULL;
    }
    for (k = 0; k < c->nslabs_max; k++) {
        hs_free(c, c->slabs[k].hs, c->slabs[k].nblocks);
        c->slabs[k].hs = NULL;
    }
    c->disk_parts = 0;
    c->held_bytes -= bytes;
    kvd__hostmem_release(c->hostmem, KVD_HM_CACHE_INDEX, bytes);
}

/* Link every block found to its parent; those whose parent never came (or
 * that chain round in a loop) go, with every block after them. */
static void link_found(kvd__cache_store_t *c)
{
    struct kvd__cache_disk *d = c->disk;
    uint32_t n = c->ents_made, id, *path = NULL, np, bad = 0;
    uint8_t *mark = calloc(n ? n : 1, 1); /* 0 unknown, 1 on the path, 2 good, 3 bad */

    path = malloc((n ? n : 1) * sizeof(*path));
    if (mark == NULL || path == NULL) {
        free(mark);
        free(path);
        kvd_log(KVD_LOG_ERROR, "event=cache_disk_open reason=\"out of memory linking blocks\"");
        return;
    }
    for (id = 0; id < n; id++) {
        kvd__cblock_t *b = B(c, id);
        uint64_t off = id < d->poff_len ? d->poff[id] : 0;
        uint32_t p;

        if (b->state != KVD_CBLOCK_READY)
            continue;
        if (off == 0)
            continue;
        p = off == UINT64_MAX ? KVD_CBLOCK_NONE
                              : kvd__cache_find(c, d->pkeys + off + 1, d->pkeys[off]);
        if (p == KVD_CBLOCK_NONE || p == id) {
            mark[id] = 3;
            continue;
        }
        b->parent = p + 1;
    }
    /* walk up from each block: good where it reaches a chain's first */
    for (id = 0; id < n; id++) {
        uint32_t at = id, verdict;

        if (mark[id] >= 2 || B(c, id)->state != KVD_CBLOCK_READY)
            continue;
        np = 0;
        for (;;) {
            kvd__cblock_t *b = B(c, at);
            if (mark[at] >= 2) {
                verdict = mark[at];
                break;
            }
            if (mark[at] == 1) { /* a loop */
                verdict = 3;
                break;
            }
            mark[at] = 1;
            path[np++] = at;
            if (b->parent == 0) {
                verdict = 2;
                break;
            }
            at = b->parent - 1;
        }
        while (np-- > 0)
            mark[path[np]] = (uint8_t)verdict;
    }
    /* the bad go (no good block names one as parent); the good are linked */
    for (id = 0; id < n; id++) {
        kvd__cblock_t *b = B(c, id);
        if (b->state != KVD_CBLOCK_READY)
            continue;
        if (mark[id] == 3) {
            table_delete(c, slot_of(c, key_of(c, id), b->klen));
            c->indexed--;
            c->ready--;
            c->disk_only--;
            disk_forget(c, id);
            ent_free(c, id);
            bad++;
        }
    }
    for (id = 0; id < n; id++) {
        kvd__cblock_t *b = B(c, id);
        if (b->state == KVD_CBLOCK_READY && b->parent)
            child_link(c, b->parent - 1, id);
    }
    /* recency: the order found (the oldest the least recently used) */
    for (id = 0; id < n; id++)
        if (B(c, id)->state == KVD_CBLOCK_READY)
            list_insert(c, KVD_CLIST_LRU, id, 1);
    if (bad > 0)
        kvd_log(KVD_LOG_WARN, "event=cache_disk_orphans blocks=%u reason=\"their parent's "
                "record was not found: dropped with the blocks after them\"", bad);
    free(mark);
    free(path);
}

kvd_status_t kvd__cache_store_open_disk(kvd__cache_store_t *c, const kvd__cache_disk_config_t *cfg,
                                        char *why, size_t why_len)
{
    struct kvd__cache_disk *d;
    kvd__disk_store_config_t sc;
    char text[KVD_DISK_LAYOUT_TEXT];
    kvd_status_t st;

    if (cfg == NULL || cfg->dir == NULL || cfg->io == NULL) {
        snprintf(why, why_len, "a disk level needs a directory and an I/O engine");
        return KVD_EINVAL;
    }
    if (c->disk != NULL || c->indexed != 0) {
        snprintf(why, why_len, "the cache's disk level is opened once, before its first save");
        return KVD_EINVAL;
    }
    if ((d = calloc(1, sizeof(*d))) == NULL) {
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    if ((st = disk_parts_make(c, why, why_len)) != KVD_OK) {
        free(d);
        return st;
    }
    kvd__cache_layout_text(&c->layout, text, sizeof(text));
    memset(&sc, 0, sizeof(sc));
    sc.dir = cfg->dir;
    sc.layout_id = kvd__cache_layout_id(&c->layout);
    sc.layout_text = text;
    sc.block_bytes = c->block_bytes;
    /* segments of an eighth of the budget (1 MiB to 256 MiB), batches of a
     * quarter segment (64 KiB to 8 MiB): a small level does not hold far
     * more disk than its budget, a large one writes in long runs */
    sc.segment_bytes = cfg->budget / 8;
    if (sc.segment_bytes < (1u << 20))
        sc.segment_bytes = 1u << 20;
    if (sc.segment_bytes > (256u << 20))
        sc.segment_bytes = 256u << 20;
    sc.write_bytes = (uint32_t)(sc.segment_bytes / 4 > (8u << 20) ? 8u << 20
                                                                   : sc.segment_bytes / 4);
    if (sc.write_bytes < (64u << 10))
        sc.write_bytes = 64u << 10;
    d->io = cfg->io;
    d->budget = cfg->budget;
    d->written = cfg->written;
    d->written_arg = cfg->written_arg;
    d->opening = 1;
    c->disk = d;
    st = kvd__disk_store_open(&d->store, &sc, cfg->io, found_record, c, why, why_len);
    if (st == KVD_OK) {
        d->rec_bytes = kvd__disk_store_rec_bytes(d->store);
        d->cap = d->budget / d->rec_bytes;
        if (d->cap == 0) {
            snprintf(why, why_len, "a disk budget of %" PRIu64 " bytes holds no record of %"
                     PRIu64 " bytes", d->budget, d->rec_bytes);
            st = KVD_ERANGE;
        }
    }
    if (st != KVD_OK) {
        uint32_t id;
        /* nothing of it stays: the entries found go without touching the disk */
        for (id = 0; id < c->ents_made; id++) {
            kvd__cblock_t *b = B(c, id);
            if (b->state == KVD_CBLOCK_READY) {
                table_delete(c, slot_of(c, key_of(c, id), b->klen));
                ent_free(c, id);
            }
        }
        c->indexed = c->ready = c->disk_only = 0;
        kvd__disk_store_close(&d->store);
        free(d->poff);
        free(d->pkeys);
        free(d->older);
        free(d);
        c->disk = NULL;
        disk_parts_drop(c);
        return st;
    }
    for (uint64_t i = 0; i < d->nolder; i++)
        kvd__disk_drop(d->store, d->older[i]);
    link_found(c);
    free(d->older);
    free(d->poff);
    free(d->pkeys);
    d->older = NULL;
    d->poff = NULL;
    d->pkeys = NULL;
    d->nolder = d->poff_len = 0;
    d->opening = 0;
    /* a budget smaller than last time's: the least recently used go */
    while (d->records > d->cap) {
        uint64_t before = d->records;
        if (evict_one(c) != KVD_OK)
            break;
        d->evictions += before - d->records;
    }
    kvd_log(KVD_LOG_INFO, "event=cache_disk_open dir=\"%s\" blocks=%" PRIu64 " budget=%" PRIu64
            " unindexed=%" PRIu64 " engine=%s", cfg->dir, d->records, d->budget, d->unindexed,
            kvd__disk_io_engine(cfg->io));
    return KVD_OK;
}

static void disk_close(kvd__cache_store_t *c)
{
    struct kvd__cache_disk *d = c->disk;

    if (d == NULL)
        return;
    /* queued writes go out; their completions still find the store whole */
    kvd__disk_store_flush(d->store);
    kvd__disk_store_close(&d->store);
    c->disk = NULL;
    free(d->reads);
    free(d);
}

void kvd__cache_store_disk_stats(const kvd__cache_store_t *c, kvd__cache_disk_stats_t *out)
{
    const struct kvd__cache_disk *d = c->disk;
    kvd__disk_store_stats_t s;

    memset(out, 0, sizeof(*out));
    if (d == NULL)
        return;
    kvd__disk_store_stats(d->store, &s);
    out->budget = d->budget;
    out->used_bytes = d->records * d->rec_bytes;
    out->blocks = (uint32_t)d->records;
    out->hits = d->hits;
    out->spills = d->spills;
    out->promotions = d->promotions;
    out->reads = s.reads;
    out->read_bytes = s.read_bytes;
    out->writes = d->writes;
    out->write_bytes = d->writes * c->block_bytes;
    out->evictions = d->evictions;
    out->checksum_failures = s.checksum_failures;
    out->io_errors = s.io_errors;
    out->no_space = s.no_space + d->refused;
    out->direct = s.direct;
}
