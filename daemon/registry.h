/*
 * The registry of pools, buffers and events.
 *
 * Every object has a daemon-wide id (never reused), belongs to the
 * connection that made it (its owner), and is reference-counted: the
 * registry holds one reference while the object is live, and every
 * operation that uses it holds one more until the operation has
 * completed.  Dropping an object (by request, or when its owner goes away)
 * removes it from the registry at once; its memory is released when the
 * last reference goes.
 *
 * The exception: a shared pool of daemon-owned memory outlives its
 * creator.  When the creator's connection goes, the pool passes to the
 * registry's own owner (client id 0) and is marked orphaned; it keeps
 * owner_id, its creator's id (never given to another connection), and
 * owner_uid, its creator's user: a shared pool belongs to that user, who
 * (like an admin) may drop it from any connection.  Imported pools
 * (memory that a client owns) and buffers and events always go with
 * their connection.
 *
 * Names: a private pool's name is its owner's (another client may have a
 * private pool of the same name); a shared pool's is unique among shared
 * pools and its owner's.  By name, a client finds its own pool first, then
 * a shared one; other clients' private pools it does not see.
 */
#ifndef KVD_DAEMON_REGISTRY_H
#define KVD_DAEMON_REGISTRY_H

#include <stdint.h>
#include <sys/types.h>

#include "backend.h"
#include "hostmem.h"
#include "idmap.h"

typedef enum kvd__obj_type {
    KVD_OBJ_POOL = 1,
    KVD_OBJ_BUFFER = 2,
    KVD_OBJ_EVENT = 3,
} kvd__obj_type_t;

typedef struct kvd__obj kvd__obj_t;

/* What one connection owns; embedded in the connection. */
typedef struct kvd__owner {
    uint64_t client_id;
    uid_t uid;       /* the connection's user */
    kvd__obj_t *head; /* objects owned, newest first */
    uint32_t pools, buffers, events;
    uint64_t bytes; /* bytes of live pools and buffers */
} kvd__owner_t;

struct kvd__obj {
    uint64_t id;
    kvd__obj_type_t type;
    uint32_t refs;
    uint64_t owner_id;
    uid_t owner_uid;    /* the creator's user */
    kvd__owner_t *owner; /* NULL once dropped */
    int shared;
    int orphaned;       /* creator gone; owner is the registry's own */
    uint64_t bytes;     /* counted against the limits */
    uint64_t host_bytes; /* counted against the host-memory budget, as host_kind */
    int host_kind;       /* enum kvd__hostmem_kind */
    kvd__obj_t *onext, *oprev;
};

typedef struct kvd__pool {
    kvd__obj_t obj;
    char name[KVD_NAME_MAX];
    int kind; /* enum kvd_mem_kind */
    uint32_t num_layers;
    uint64_t num_slots;
    uint64_t slot_bytes;
    uint64_t slot_stride;
    int mla;
    uint32_t page_size;
    int imported;
    int creating;          /* its memory is being made off the loop: counted and
                            * its name taken, but found by no request yet */
    uint64_t bytes;        /* the pool's size (imports: their regions'); obj.bytes
                            * is what counts against the limits */
    uint64_t layer_stride; /* daemon-owned pools */
    uint64_t v_offset;
    kvd__mem_t *mem;        /* daemon-owned pools */
    /* imported pools: regions, and per-layer addresses (host copies for
     * the daemon, device-readable tables for the kernels) */
    kvd__mem_t **regions;
    uint32_t n_regions;
    uint64_t *k_addr, *v_addr;   /* host arrays of num_layers */
    void *k_table, *v_table;     /* backend tables */
    struct kvd__pool *next, *prev; /* the registry's list of live pools */
} kvd__pool_t;

typedef struct kvd__buffer {
    kvd__obj_t obj;
    char name[KVD_NAME_MAX];
    int kind;
    uint64_t bytes;
    kvd__mem_t *mem;
} kvd__buffer_t;

typedef struct kvd__event {
    kvd__obj_t obj;
    unsigned char handle[KVD_IPC_HANDLE_BYTES];
    void *ev; /* the backend's */
} kvd__event_t;

typedef struct kvd__registry {
    kvd__backend_t *be;
    kvd__hostmem_t *hostmem; /* where host_bytes are given back */
    kvd__idmap_t objs;
    uint64_t next_id;
    kvd__pool_t *pools; /* live pools, newest first */
    kvd__owner_t orphans; /* shared pools whose creator has gone (client id 0) */
    uint32_t npools, nbuffers, nevents;
    uint64_t live_bytes;  /* bytes of pools and buffers not yet released */
    void (*host_release)(void *ctx, kvd__mem_t *mem, int host_kind, uint64_t host_bytes);
    void *host_release_ctx;
} kvd__registry_t;

void kvd__registry_init(kvd__registry_t *reg, kvd__backend_t *be, kvd__hostmem_t *hostmem);

/* Host memory of a dropped pool or buffer goes to release when it is set
 * (the server's: unmapping and unpinning run off the loop, and the budget
 * gets the bytes back once they are gone); else it is destroyed here. */
void kvd__registry_set_host_release(kvd__registry_t *reg,
                                    void (*fn)(void *ctx, kvd__mem_t *mem, int host_kind,
                                               uint64_t host_bytes),
                                   void *ctx);

/* Release a pool's memory and tables and free it: for a pool the registry
 * drops, or one that failed before it was added. */
void kvd__pool_free(kvd__backend_t *be, kvd__pool_t *p);
/* Drops everything left; memory still referenced is released by the last
 * kvd__obj_unref. */
void kvd__registry_deinit(kvd__registry_t *reg);

/* Add a new object (refs = 1) owned by owner; KVD_ENOMEM on failure (the
 * object is not added and still belongs to the caller). */
kvd_status_t kvd__registry_add(kvd__registry_t *reg, kvd__obj_t *obj, kvd__owner_t *owner);
kvd__obj_t *kvd__registry_get(kvd__registry_t *reg, uint64_t id, kvd__obj_type_t type);
/* The pool client_id means by name: its own of that name, else a shared
 * one; NULL when there is none such. */
kvd__pool_t *kvd__registry_pool_by_name(kvd__registry_t *reg, const char *name, uint64_t client_id);
/* Whether a pool of that name (shared or not) would clash for client_id:
 * one of its own has it, or (shared) a shared one does. */
int kvd__registry_name_taken(kvd__registry_t *reg, const char *name, uint64_t client_id,
                             int shared);

/* Remove obj from the registry and its owner; releases the registry's
 * reference. */
void kvd__registry_drop(kvd__registry_t *reg, kvd__obj_t *obj);
/* The owner is going away: drop everything it owns, except shared pools
 * of daemon-owned memory, which pass to reg->orphans (see above). */
void kvd__registry_drop_owner(kvd__registry_t *reg, kvd__owner_t *owner);
/* Does obj outlive its creator's connection? */
int kvd__obj_outlives_owner(const kvd__obj_t *obj);

void kvd__obj_ref(kvd__obj_t *obj);
void kvd__obj_unref(kvd__registry_t *reg, kvd__obj_t *obj);

/* May this client use obj (read, write, export)?  KVD_OK, or KVD_EPERM. */
kvd_status_t kvd__obj_may_use(const kvd__obj_t *obj, uint64_t client_id);
/* May this client drop obj?  Only its creator (while connected: a
 * creator's id is never reused), or an admin for a shared one. */
kvd_status_t kvd__obj_may_drop(const kvd__obj_t *obj, uint64_t client_id, uid_t uid, int admin);

/* Is name a valid pool, buffer or cache name (1..63 of [A-Za-z0-9._-])? */
int kvd__pool_name_valid(const char *name);
/* Is s free text without control characters (client names)? */
int kvd__text_valid(const char *s);

#endif
