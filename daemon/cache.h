/*
 * The cache tier's store: one content-addressed cache of KV blocks in host
 * memory.  No protocol here (ops_cache.c speaks it); loop thread only.
 *
 * A block holds every layer's K and V (or MLA latent) of tokens_per_block
 * tokens, laid out [layer][K, V][token][token_bytes]: contiguous, so that
 * per layer and K/V it is one chunk of tokens_per_block * token_bytes
 * bytes, one copy descriptor.  A block's bytes in host memory live in a
 * slot of a slab (a power of two of slots), reserved from the host-memory
 * budget as the cache grows, up to its own budget.  A block's id names
 * its entry, in a growable array of entries of its own: the entry says
 * which host slot holds its bytes, so that a block need not be in host
 * memory to be in the cache.
 *
 * Keys are opaque byte strings (1 to KVD_CACHE_KEY_MAX bytes), in a hash
 * table keyed with a secret seed (clients choose keys).  Each block keeps
 * its parent, the key before it in the chain that stored it; a block is
 * visible to lookups only once READY (its bytes complete).
 *
 * Eviction takes the least recently used block that nothing holds and no
 * block names as parent.  Touching a chain from its last block to its
 * first keeps every parent more recent than its children, so the least
 * recently used block is a chain's tail: evicting it can never leave a
 * block whose parent is gone.  Blocks that are held (leased, being loaded
 * or saved) or that still have children leave the LRU list when eviction
 * meets them, and come back once free to go: each is met at most once per
 * use, so eviction costs O(1) amortized.
 *
 * With a disk level (kvd__cache_store_open_disk; docs/design/disk-level.md)
 * the same index, lookup and order cover blocks on disk: a committed
 * block is written through, host memory gives up clean copies (a second
 * list, of blocks whose host copy may go), and the rule above takes
 * blocks out of both levels when the disk's budget is full.
 */
#ifndef KVD_DAEMON_CACHE_H
#define KVD_DAEMON_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "disk_io.h"
#include "hostmem.h"
#include "kvdock/status.h"

#define KVD_CACHE_KEY_MAX 64
#define KVD_CACHE_KEY_ALIGN 8 /* key widths grow in steps of this */
#define KVD_CBLOCK_NONE UINT32_MAX

/* DEAD: a save that failed left it while others still held it or chained
 * onto it; out of the index, freed once they let go. */
enum kvd__cblock_state {
    KVD_CBLOCK_FREE = 0,
    KVD_CBLOCK_FILLING = 1,
    KVD_CBLOCK_READY = 2,
    KVD_CBLOCK_DEAD = 3,
};

/* The layout of a cache's blocks (the daemon's; client.h has the public
 * kvd_cache_layout_t, the same fields as the client gives them). */
typedef struct kvd__block_layout {
    uint32_t num_layers;
    int mla;                   /* one latent per layer instead of K and V */
    uint32_t tokens_per_block;
    uint64_t token_bytes;      /* one token's row, one layer, K or V */
    char dtype[16];            /* a label, compared exactly */
} kvd__block_layout_t;

/* Disk-level flags of an entry (dflags). */
enum {
    KVD_CBLOCK_WRITING = 1,  /* its record is being written (the write holds it) */
    KVD_CBLOCK_FETCHING = 2, /* its host slot is being read into (the read holds it) */
    KVD_CBLOCK_NODISK = 8,   /* its record could not be written: host memory only */
};

/* The lists an entry is on (lists); the host list's nodes are host
 * slots, the recency list's entries. */
enum {
    KVD_CLIST_LRU = 1,  /* the recency list: eviction's order */
    KVD_CLIST_HOST = 2, /* the host list (disk level): its host copy may go */
};

/* An entry's place in one of the store's lists: id + 1 of its neighbours
 * towards the most recently used (prev) and the least (next); 0: none. */
typedef struct kvd__clink {
    uint32_t prev, next;
} kvd__clink_t;

/* A list's ends: id + 1 of the most recently used (head) and the least
 * (tail); 0: empty. */
typedef struct kvd__clist {
    uint32_t head, tail;
} kvd__clist_t;

/*
 * One block's entry: 36 bytes, with its key and (with a disk level) its
 * disk part beside it in arrays of their own, so that a block costs the
 * daemon 36 bytes + the cache's key width (+ 8 with a disk level) + its
 * table slots (8 to 16 bytes at a load of a quarter to a half); a host
 * slot costs its free slot id (4 bytes), and with a disk level its part
 * of the host list (12).  Keys live in per-cache arrays as wide as the longest
 * key seen (rounded up to 8 bytes): chains of one hash size pay for that
 * size, not for the longest key allowed.  Its children (the blocks whose
 * parent it is) form a list through first_child and the siblings' links,
 * so that the subtree under a block is walked in time of its size.  A
 * free entry links to the next free one through lru.next.
 */
typedef struct kvd__cblock {
    uint32_t parent;   /* id + 1 of the block before it in its chain; 0: none */
    kvd__clink_t lru;  /* the recency list */
    uint32_t first_child;  /* id + 1 of one of its children; 0: none */
    uint32_t next_sibling; /* id + 1 of the parent's next child; 0: none */
    uint32_t prev_sibling; /* id + 1 of the parent's previous child; 0: none */
    uint32_t holds;    /* leases, loads reading it, the save writing it */
    uint32_t host;     /* slot + 1 of its bytes in host memory; 0: none */
    uint8_t state;     /* enum kvd__cblock_state */
    uint8_t lists;     /* KVD_CLIST_LRU ... */
    uint8_t klen;
    uint8_t dflags;    /* KVD_CBLOCK_WRITING ... */
} kvd__cblock_t;

/* An entry's disk part (made with the disk level): where its record is. */
typedef struct kvd__cdisk {
    uint32_t dseg, doff; /* its record on disk (kvd__disk_loc_t halves); 0, 0: none */
} kvd__cdisk_t;

/* A host slot's part of the host list (with a disk level): the list
 * orders host copies, so its links live with the slots, which are far
 * fewer than the blocks of a cache with a disk level.  The block whose
 * bytes it holds, and its neighbours' slots + 1 (0: none). */
typedef struct kvd__chost {
    uint32_t owner;
    kvd__clink_t hlru;
} kvd__chost_t;

typedef void (*kvd__cache_mem_done_fn)(void *arg, kvd_status_t st, void *ptr, void *handle);

/* Where slab memory comes from (host memory the copies can reach: pinned
 * on cuda); the cache counts it against the host-memory budget itself. */
typedef struct kvd__cache_mem {
    void *ctx;
    kvd_status_t (*alloc)(void *ctx, uint64_t bytes, void **ptr, void **handle, char *why,
                          size_t why_len);
    void (*free)(void *ctx, void *handle);
    /* Optional: the same allocation off the caller's thread, done called
     * later on the caller's thread (KVD_OK: started).  Where set, the store
     * never allocates on the caller's thread: pinning a GiB takes long
     * enough to stall every client of the thread that waits for it.  It
     * keeps the next slab allocated ahead, and a reserve that needs a slab
     * not there yet answers KVD_EBUSY while one is made
     * (kvd__cache_growing); the grown hook says when it came. */
    kvd_status_t (*alloc_ahead)(void *ctx, uint64_t bytes, kvd__cache_mem_done_fn done,
                                void *arg);
    /* Optional: free off the caller's thread (unmapping a GiB stalls the
     * thread that does it), giving the budget's bytes of hm_kind back once
     * the memory is gone; used instead of free where set. */
    void (*free_later)(void *ctx, void *handle, int hm_kind, uint64_t bytes);
} kvd__cache_mem_t;

struct kvd__cache_ahead;
struct kvd__cache_disk;

typedef struct kvd__cache_slab {
    void *ptr;             /* nblocks slots of block_bytes */
    void *handle;          /* the allocator's */
    uint32_t nblocks;
    uint32_t used;         /* slots holding a block's bytes */
    kvd__chost_t *hs;      /* [nblocks] with a disk level; else NULL */
} kvd__cache_slab_t;

/* A chunk of entries: the entries, their keys and their disk parts, in
 * arrays of their own (a key's width changes; a disk part is made only
 * with a disk level). */
typedef struct kvd__cache_chunk {
    kvd__cblock_t *ents;
    uint8_t *keys;      /* key_width bytes each; NULL while key_width is 0 */
    kvd__cdisk_t *disk; /* NULL: no disk level */
} kvd__cache_chunk_t;

typedef struct kvd__cache_counters {
    uint64_t lookups, keys_asked, keys_hit;
    uint64_t saves, stored, skipped, refused;
    uint64_t loads, loaded;
    uint64_t evictions;
    uint64_t bytes_in, bytes_out;
    /* entries linked into the recency or host list, a piece moved at once
     * counting one: the work of keeping recency (the suites read it) */
    uint64_t relinks;
} kvd__cache_counters_t;

typedef struct kvd__cache_store {
    kvd__block_layout_t layout;
    uint64_t block_bytes;  /* every layer, K and V */
    uint64_t chunk_bytes;  /* one layer's K (or V): tokens_per_block * token_bytes */
    uint64_t budget;       /* bytes of blocks */
    uint32_t capacity;     /* blocks the budget holds */
    uint32_t slab_shift;   /* log2 of slots per slab */
    uint32_t nslabs_max, nslabs;
    kvd__cache_slab_t *slabs;
    uint32_t *free_ids;    /* free slots in the slabs so far */
    uint32_t nfree;
    kvd__cache_chunk_t *chunks; /* the entries, in chunks (see kvd__cache_chunk_of) */
    uint32_t nchunks;
    uint32_t key_width;    /* bytes a key takes: the longest seen, rounded up */
    int disk_parts;        /* the chunks have disk parts (a disk level) */
    uint32_t ents_made;    /* entries [0, ents_made) exist */
    uint32_t ent_free;     /* id + 1 of the first free entry; 0: none */
    uint32_t disk_only;    /* ready blocks with no bytes in host memory */
    kvd__clist_t hlru;     /* the host list (disk level) */
    struct kvd__cache_disk *disk;   /* NULL: host memory only */
    uint64_t *table;       /* (tag << 32) | (id + 1); 0: empty */
    uint64_t table_mask;
    uint32_t indexed;      /* entries in the table (filling and ready) */
    uint32_t ready;
    kvd__clist_t lru;      /* the recency list */
    uint64_t seed;
    uint64_t held_bytes;   /* counted in the host-memory budget */
    kvd__hostmem_t *hostmem;
    kvd__cache_mem_t mem;
    struct kvd__cache_ahead *ahead; /* the next slab, allocating or ready; NULL: none */
    kvd_status_t ahead_failed; /* the last slab made ahead failed: said once */
    char ahead_why[160];
    /* Optional: a slab made ahead is ready with nblocks slots (0: it
     * failed), so a reserve that answered KVD_EBUSY for want of it may run
     * again. */
    void (*grown)(void *arg, uint32_t nblocks);
    void *grown_arg;
    kvd__cache_counters_t n;
} kvd__cache_store_t;

/* A store for blocks of layout within budget bytes (KVD_EINVAL /
 * KVD_ERANGE with why: bad layout, a budget below one block). */
kvd_status_t kvd__cache_store_init(kvd__cache_store_t *c, const kvd__block_layout_t *l,
                                   uint64_t budget, kvd__hostmem_t *hm, const kvd__cache_mem_t *mem,
                                   char *why, size_t why_len);
/* Frees every slab and entry (nothing may be in flight). */
void kvd__cache_store_deinit(kvd__cache_store_t *c);

/* The slab of a host slot, and its place there. */
static inline uint32_t kvd__cache_slab_of(const kvd__cache_store_t *c, uint32_t slot)
{
    return slot >> c->slab_shift;
}
static inline uint32_t kvd__cache_pos_of(const kvd__cache_store_t *c, uint32_t slot)
{
    return slot & ((1u << c->slab_shift) - 1);
}
/* The chunk of entry id, and its place there.  Chunk 0 holds entries
 * [0, 64), chunk k in 1..10 [64 << (k - 1), 64 << k), and from 65536 on
 * each chunk 65536 of them: a small cache's entries take little memory, a
 * large one's grow without moving. */
static inline uint32_t kvd__cache_chunk_of(uint32_t id, uint32_t *pos)
{
    uint32_t k;

    if (id >= (1u << 16)) {
        *pos = id & 0xffff;
        return 10 + (id >> 16);
    }
    if (id < 64) {
        *pos = id;
        return 0;
    }
    k = 32 - (uint32_t)__builtin_clz(id >> 6);
    *pos = id - (64u << (k - 1));
    return k;
}
/* The block's entry (on every path of a lookup: inline). */
static inline kvd__cblock_t *kvd__cache_block(const kvd__cache_store_t *c, uint32_t id)
{
    uint32_t pos, k = kvd__cache_chunk_of(id, &pos);

    return &c->chunks[k].ents[pos];
}
/* Host memory a block's entry takes: the entry, its key and its disk part. */
static inline uint64_t kvd__cache_entry_bytes(const kvd__cache_store_t *c)
{
    return sizeof(kvd__cblock_t) + c->key_width + (c->disk_parts ? sizeof(kvd__cdisk_t) : 0);
}
/* Whether a block's bytes are in host memory now (ready, not being read). */
static inline int kvd__cache_in_host(const kvd__cache_store_t *c, uint32_t id)
{
    const kvd__cblock_t *b = kvd__cache_block(c, id);

    return b->state == KVD_CBLOCK_READY && b->host != 0 && !(b->dflags & KVD_CBLOCK_FETCHING);
}
/* The host slot of a block that has one. */
static inline uint32_t kvd__cache_host_slot(const kvd__cache_store_t *c, uint32_t id)
{
    return kvd__cache_block(c, id)->host - 1;
}
/* The bytes of a block in host memory (it must have a host slot). */
void *kvd__cache_block_bytes(const kvd__cache_store_t *c, uint32_t id);

/* The keyed hash of the index (its seed is secret: clients choose keys). */
uint64_t kvd__cache_hash(const kvd__cache_store_t *c, const uint8_t *key, size_t klen);
/* The block of key (filling or ready), or KVD_CBLOCK_NONE. */
uint32_t kvd__cache_find(const kvd__cache_store_t *c, const uint8_t *key, size_t klen);
/* Block id's key, its length in *klen. */
const uint8_t *kvd__cache_key(const kvd__cache_store_t *c, uint32_t id, size_t *klen);
/* How many of the n keys, from the first, are ready; ids[i] their blocks
 * (ids may be NULL).  Touches them when touch is set. */
uint32_t kvd__cache_lookup(kvd__cache_store_t *c, const uint8_t *const *keys, const size_t *lens,
                           uint32_t n, int touch, uint32_t *ids);
/* The same for n keys of width bytes each, back to back in blob, without
 * touching: ids[i] the blocks found (ids may be NULL), and *linked (may
 * be NULL) set when they are consecutive ids that lie in that order in
 * the recency list, none held: a chain saved and used as a whole, which
 * kvd__cache_touch_run touches as one piece (and in which no block is
 * named twice). */
uint32_t kvd__cache_lookup_blob(const kvd__cache_store_t *c, const uint8_t *blob, size_t width,
                                uint32_t n, uint32_t *ids, int *linked);

/* A new block for key after parent (KVD_CBLOCK_NONE: a chain's first),
 * FILLING and held by the save: a free block, a new slab, or an evicted
 * one.  KVD_EBUSY when the next slab is being made (kvd__cache_growing)
 * or nothing can be evicted (every block held or named as a parent), or
 * the status of the slab refused when the cache holds none yet (the
 * host-memory budget's ELIMIT, ENOMEM), with why. */
kvd_status_t kvd__cache_reserve(kvd__cache_store_t *c, uint32_t parent, const uint8_t *key,
                                size_t klen, uint32_t *id, char *why, size_t why_len);
/* The save's bytes are complete: the block becomes READY and visible
 * (and 1), unless its parent's save failed meanwhile: then it goes as if
 * aborted (and 0). */
int kvd__cache_commit(kvd__cache_store_t *c, uint32_t id);
/* The save failed: the block goes as if never made.  Another save that
 * found it filling may hold it or have chained blocks onto it: then it
 * leaves the index now and its entry is freed when they are done, and
 * their blocks after it go too when they commit. */
void kvd__cache_abort(kvd__cache_store_t *c, uint32_t id);

/* Held blocks are never evicted (leases, loads).  Unhold a chain from its
 * last block to its first, so that parents stay more recent. */
void kvd__cache_hold(kvd__cache_store_t *c, uint32_t id);
void kvd__cache_unhold(kvd__cache_store_t *c, uint32_t id);
/* Touch the ready blocks ids[0..n) of a chain, ids[0] its first, as a
 * lookup that found them does. */
void kvd__cache_touch_chain(kvd__cache_store_t *c, const uint32_t *ids, uint32_t n);
/* The same for the chain of blocks first .. first + n - 1, which a lookup
 * found linked (kvd__cache_lookup_blob): in time independent of n without
 * a disk level. */
void kvd__cache_touch_run(kvd__cache_store_t *c, uint32_t first, uint32_t n);
/* Refresh a ready block's recency (a skipped save, a lookup). */
void kvd__cache_touch(kvd__cache_store_t *c, uint32_t id);

/* Evict the blocks of key and every block after it in any chain;
 * *evicted counts them.  KVD_EBUSY (nothing changed) when one of them is
 * held or filling; KVD_ENOENT when key is not there.  Time and memory:
 * the size of that subtree, whatever the cache holds. */
kvd_status_t kvd__cache_evict_key(kvd__cache_store_t *c, const uint8_t *key, size_t klen,
                                  uint32_t *evicted);
/* Evict every block nothing holds (children before parents) and give back
 * the slabs left empty; the number evicted. */
uint32_t kvd__cache_clear(kvd__cache_store_t *c);

/* ---- the disk level ---------------------------------------------------------- */

/* A cache's disk level: its own directory in the daemon's --cache-dir. */
typedef struct kvd__cache_disk_config {
    const char *dir;     /* made (0700) and checked by the caller */
    uint64_t budget;     /* bytes of block records on disk at most */
    kvd__disk_io_t *io;   /* the daemon's disk I/O engine */
    /* Optional: a record's write ended, so the host slot its block held
     * may be taken now (kvd__cache_disk_writing: those still in flight). */
    void (*written)(void *arg);
    void *written_arg;
} kvd__cache_disk_config_t;

/* The disk level now, and its counters since it was opened. */
typedef struct kvd__cache_disk_stats {
    uint64_t budget, used_bytes;
    uint32_t blocks;
    uint64_t hits, spills, promotions, reads, read_bytes, writes, write_bytes;
    uint64_t evictions, checksum_failures, io_errors, no_space;
    int direct;          /* O_DIRECT in use */
} kvd__cache_disk_stats_t;

/* Give the store a disk level (once, before the first save): opens dir
 * and takes every whole block found there into the index, on disk only
 * (a newer record of a key replaces an older one, which is dropped; a
 * record whose parent is not found is dropped, with every block after
 * it).  From then on a committed block is written through to disk, a
 * block's host copy goes only once it is on disk, and a block leaves the
 * cache (both levels) by the least recently used rule when the disk's
 * budget is full.
 * Waits for the disk: at start-up, or for an empty directory.  With why:
 * KVD_EINVAL (a bad config), KVD_EPERM (a directory that cannot be
 * trusted), KVD_EIO. */
kvd_status_t kvd__cache_store_open_disk(kvd__cache_store_t *c, const kvd__cache_disk_config_t *cfg,
                                        char *why, size_t why_len);
/* Zeros where the store has no disk level. */
void kvd__cache_store_disk_stats(const kvd__cache_store_t *c, kvd__cache_disk_stats_t *out);

/* The disk writes queued by the commits so far go now rather than once a
 * batch is full: after a save's commits. */
void kvd__cache_disk_flush(kvd__cache_store_t *c);

/* A save larger than the host level: filling block id, its bytes
 * complete but not committed, is written to disk now, and its host slot
 * is let go once its record is there (the written hook says so); it stays
 * invisible until kvd__cache_commit (READY, on disk only) or goes with
 * kvd__cache_abort (its record dropped).  1: its write is queued; 0: not
 * (no disk level, the budget full of blocks that cannot go, the store
 * refused): its bytes stay in host memory. */
int kvd__cache_write_early(kvd__cache_store_t *c, uint32_t id);

/* Records being written now: each holds its block's host slot until it
 * is on disk. */
uint64_t kvd__cache_disk_writing(const kvd__cache_store_t *c);

/* Start making the next slab off the caller's thread now (where the store
 * has alloc_ahead, none is on its way, and the budget has room), rather
 * than when a reserve first needs it: a cluster cache's blocks come from
 * its peers, whose pulls do not wait. */
void kvd__cache_grow(kvd__cache_store_t *c);

/* Room for need new blocks without evicting (at most the capacity):
 * where the free slots fall short and the cache is under its budget, the
 * slab made ahead is added and the next one started.  KVD_EBUSY (why)
 * while a slab it needs is on its way: the caller waits for the grown
 * hook, then asks again; the failure of the slab it waited for, once
 * (why); else KVD_OK, the reserves evicting for what is still short.
 * For requests that reserve many blocks at once, and pulls that cannot
 * wait in the middle. */
kvd_status_t kvd__cache_prepare(kvd__cache_store_t *c, uint32_t need, char *why, size_t why_len);

/* A slab is being made off the caller's thread (kvd__cache_mem_t's
 * alloc_ahead): a reserve refused with KVD_EBUSY now finds room once the
 * grown hook has run. */
int kvd__cache_growing(const kvd__cache_store_t *c);

/* Of the ready blocks ids[0..n), how many are on disk only; counted as
 * the disk level's hits. */
uint32_t kvd__cache_disk_hits(kvd__cache_store_t *c, const uint32_t *ids, uint32_t n);

typedef void (*kvd__cache_fetch_cb)(void *arg, kvd_status_t st);
/* Bring ready block id, on disk only, into host memory: a host slot is
 * taken for it (as a save's would be) and its record read there; cb runs
 * later from kvd__disk_io_poll (never from inside this call) with KVD_OK,
 * the block then in host memory as the most recently used, its record
 * kept; or KVD_EIO when the record failed its checks or the read failed:
 * the block and every block after it in any chain have left the index.
 * A block already being read gets the same read's outcome.  Otherwise
 * (KVD_EBUSY: no host slot free to take; KVD_EINVAL: not on disk only)
 * cb will not run. */
kvd_status_t kvd__cache_fetch(kvd__cache_store_t *c, uint32_t id, kvd__cache_fetch_cb cb, void *arg,
                              char *why, size_t why_len);

/* The identity of a layout on disk (its records carry it), and the layout
 * in words. */
uint64_t kvd__cache_layout_id(const kvd__block_layout_t *l);
void kvd__cache_layout_text(const kvd__block_layout_t *l, char *out, size_t len);

/* Ready blocks with their bytes in host memory. */
static inline uint32_t kvd__cache_host_blocks(const kvd__cache_store_t *c)
{
    return c->ready - c->disk_only;
}

/* Bytes of blocks resident in host memory now (ready). */
static inline uint64_t kvd__cache_used(const kvd__cache_store_t *c)
{
    return (uint64_t)kvd__cache_host_blocks(c) * c->block_bytes;
}

#endif
