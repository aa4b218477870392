/*
 * The daemon's named caches (the cache tier) and the leases clients hold
 * on their blocks.  A cache belongs to a user, not to a connection, and
 * lives until dropped; a lease belongs to the connection that took it and
 * ends with it.  The store itself is cache.h; the operations ops_cache.c.
 * Loop thread only.
 */
#ifndef KVD_DAEMON_CACHES_H
#define KVD_DAEMON_CACHES_H

#include <stdint.h>
#include <sys/types.h>

#include "cache.h"
#include "kvdock/types.h"
#include "park.h"

typedef struct kvd__server kvd__server_t;
typedef struct kvd__conn kvd__conn_t;

typedef struct kvd__cache {
    uint64_t id;
    char name[KVD_NAME_MAX];
    uid_t owner_uid;
    int shared;
    int cluster;      /* lookups and loads reach the peers' caches of its name */
    uint32_t allow_uids[16], allow_gids[16];
    uint32_t n_allow_uids, n_allow_gids;
    kvd__cache_store_t store;
    uint32_t refs;    /* the server's list, and every operation in flight */
    int dropped;      /* out of the list; freed with its last reference */
    uint32_t leases;  /* leases on it now */
    uint64_t fetched, served; /* blocks pulled from peers, and by them */
    uint64_t peer_hits;       /* keys of lookups found on peers only (store.n.keys_hit
                               * counts them too: a hit is a key the daemon can serve) */
    /* the disk level (cache_disk.h): its budget (0: none) and directory */
    uint64_t disk_budget;
    char *disk_dir;           /* --cache-dir/DIRNAME, malloc'd; NULL: none */
    kvd__server_t *srv;
    int remove_dir;           /* dropped by a client: its directory goes when it is freed */
    /* saves and loads waiting for host slots that its disk writes in
     * flight hold (park.h); each waiting request holds a reference */
    kvd__waitq_t waiters;
    uint32_t saving;          /* saves in flight (their new blocks hold host slots) */
    uint32_t loading;         /* loads reading from disk (cache_load.h): their blocks
                               * hold host slots, let go as they are copied */
    struct kvd__cache *next, *prev;
} kvd__cache_t;

typedef struct kvd__lease {
    uint64_t id;
    kvd__cache_t *cache;
    uint32_t *ids;    /* its blocks, in chain order (held) */
    uint32_t n;
    uint64_t expires_ns;
    kvd__conn_t *conn; /* charged with lease bytes: the one that took it */
    struct kvd__lease *next; /* the connection's */
} kvd__lease_t;

/* Take lease id off c's list (the caller owns it then); NULL: c has none
 * such. */
kvd__lease_t *kvd__lease_take(kvd__conn_t *c, uint64_t id);
/* A lease taken off its list ends: its blocks are unheld. */
void kvd__lease_end(kvd__cache_t *k, kvd__lease_t *l);
/* Drop a reference (the last one frees the cache). */
void kvd__cache_unref(kvd__cache_t *k);
/* The connection goes: its leases end. */
void kvd__leases_drop(kvd__conn_t *c);
/* Leases of c past their time end (the server's sweep). */
void kvd__leases_expire(kvd__conn_t *c, uint64_t now_ns);
/* Whether k will have host slots it lacks now without anyone asking: its
 * next slab is being made, or (a disk level) a save in flight commits and
 * its blocks are written, a write ends, a load reading from disk copies
 * its blocks.  (A lease is let go when its client decides: nothing to
 * wait for.)  self: the saves asking, which count themselves. */
int kvd__cache_slots_will_free(const kvd__cache_t *k, uint32_t self);
/* n host slots of k were let go (a write, a save or a load from disk
 * ended): the saves and loads waiting on k hear it. */
void kvd__cache_slots_freed(kvd__cache_t *k, uint32_t n);
/* The requests waiting on every cache run again now (the daemon shuts
 * down: they hear so). */
void kvd__caches_wake_waiting(kvd__server_t *srv);
/* Every cache goes (the daemon is done: nothing in flight). */
void kvd__caches_destroy(kvd__server_t *srv);
/* The caches' budgets added up.  Each is at most the host-memory budget,
 * but together they may pass it: then they cannot all fill, and the
 * daemon says so (a warning at create, `kvdock status`). */
uint64_t kvd__caches_budgets(const kvd__server_t *srv);
/* The caches' disk budgets added up (within the daemon's --disk-budget). */
uint64_t kvd__caches_disk_budgets(const kvd__server_t *srv);
/* A directory of --cache-dir left as it was at start, and why: kept for
 * the status (and counted in the metrics) until the daemon exits, as the
 * directory stays until a start that can reopen it. */
#define KVD_SKIPPED_KEPT 64
typedef struct kvd__skipped_cache {
    char dir[256];           /* its name in --cache-dir */
    char name[KVD_NAME_MAX]; /* the cache's, from its manifest ("" unread) */
    uint32_t owner_uid;      /* from its manifest (0 unread) */
    char reason[400];
} kvd__skipped_cache_t;

/* At start, with --cache-dir: every cache whose directory holds a manifest
 * that can be trusted is made again and its disk level recovered; the
 * others are logged, listed in srv->skipped and left as they are, never
 * deleted.  Directories of caches dropped before a crash are removed (off
 * the loop). */
void kvd__caches_reopen(kvd__server_t *srv);
/* StatusReply.disk, in r's arena; NULL without --cache-dir (or out of
 * memory). */
struct kvd__req;
struct Kvdock__DiskStatus *kvd__disk_status(struct kvd__req *r);
/* Remove a directory of --cache-dir on the disk I/O threads (here and now
 * without them). */
void kvd__cache_dir_discard(kvd__server_t *srv, const char *path);

#endif
