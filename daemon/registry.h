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

typedef enum kvd_obj_type {
    KVD_OBJ_POOL = 1,
    KVD_OBJ_BUFFER = 2,
    KVD_OBJ_EVENT = 3,
} kvd_obj_type_t;

typedef struct kvd_obj kvd_obj_t;

/* What one connection owns; embedded in the connection. */
typedef struct kvd_owner {
    uint64_t client_id;
    uid_t uid;       /* the connection's user */
    kvd_obj_t *head; /* objects owned, newest first */
    uint32_t pools, buffers, events;
    uint64_t bytes; /* bytes of live pools and buffers */
} kvd_owner_t;

struct kvd_obj {
    uint64_t id;
    kvd_obj_type_t type;
    uint32_t refs;
    uint64_t owner_id;
    uid_t owner_uid;    /* the creator's user */
    kvd_owner_t *owner; /* NULL once dropped */
    int shared;
    int orphaned;       /* creator gone; owner is the registry's own */
    uint64_t bytes;     /* counted against the limits */
    uint64_t host_bytes; /* counted against the host-memory budget, as host_kind */
    int host_kind;       /* enum kvd_hostmem_kind */
    kvd_obj_t *onext, *oprev;
};

typedef struct kvd_pool {
    kvd_obj_t obj;
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
    kvd_mem_t *mem;        /* daemon-owned pools */
    /* imported pools: regions, and per-layer addresses (host copies for
     * the daemon, device-readable tables for the kernels) */
    kvd_mem_t **regions;
    uint32_t n_regions;
    uint64_t *k_addr, *v_addr;   /* host arrays of num_layers */
    void *k_table, *v_table;     /* backend tables */
    struct kvd_pool *next, *prev; /* the registry's list of live pools */
} kvd_pool_t;

typedef struct kvd_buffer {
    kvd_obj_t obj;
    char name[KVD_NAME_MAX];
    int kind;
    uint64_t bytes;
    kvd_mem_t *mem;
} kvd_buffer_t;

typedef struct kvd_event {
    kvd_obj_t obj;
    unsigned char handle[KVD_IPC_HANDLE_BYTES];
    void *ev; /* the backend's */
} kvd_event_t;

typedef struct kvd_registry {
    kvd_backend_t *be;
    kvd_hostmem_t *hostmem; /* where host_bytes are given back */
    kvd_idmap_t objs;
    uint64_t next_id;
    kvd_pool_t *pools; /* live pools, newest first */
    kvd_owner_t orphans; /* shared pools whose creator has gone (client id 0) */
    uint32_t npools, nbuffers, nevents;
    uint64_t live_bytes;  /* bytes of pools and buffers not yet released */
    void (*host_release)(void *ctx, kvd_mem_t *mem, int host_kind, uint64_t host_bytes);
    void *host_release_ctx;
} kvd_registry_t;

void kvd_registry_init(kvd_registry_t *reg, kvd_backend_t *be, kvd_hostmem_t *hostmem);

/* Host memory of a dropped pool or buffer goes to release when it is set
 * (the server's: unmapping and unpinning run off the loop, and the budget
 * gets the bytes back once they are gone); else it is destroyed here. */
void kvd_registry_set_host_release(kvd_registry_t *reg,
                                   void (*fn)(void *ctx, kvd_mem_t *mem, int host_kind,
                                              uint64_t host_bytes),
                                   void *ctx);

/* Release a pool's memory and tables and free it: for a pool the registry
 * drops, or one that failed before it was added. */
void kvd_pool_free(kvd_backend_t *be, kvd_pool_t *p);
/* Drops everything left; memory still referenced is released by the last
 * kvd_obj_unref. */
void kvd_registry_deinit(kvd_registry_t *reg);

/* Add a new object (refs = 1) owned by owner; KVD_ENOMEM on failure (the
 * object is not added and still belongs to the caller). */
kvd_status_t kvd_registry_add(kvd_registry_t *reg, kvd_obj_t *obj, kvd_owner_t *owner);
kvd_obj_t *kvd_registry_get(kvd_registry_t *reg, uint64_t id, kvd_obj_type_t type);
/* The pool client_id means by name: its own of that name, else a shared
 * one; NULL when there is none such. */
kvd_pool_t *kvd_registry_pool_by_name(kvd_registry_t *reg, const char *name, uint64_t client_id);
/* Whether a pool of that name (shared or not) would clash for client_id:
 * one of its own has it, or (shared) a shared one does. */
int kvd_registry_name_taken(kvd_registry_t *reg, const char *name, uint64_t client_id,
                            int shared);

/* Remove obj from the registry and its owner; releases the registry's
 * reference. */
void kvd_registry_drop(kvd_registry_t *reg, kvd_obj_t *obj);
/* The owner is going away: drop everything it owns, except shared pools
 * of daemon-owned memory, which pass to reg->orphans (see above). */
void kvd_registry_drop_owner(kvd_registry_t *reg, kvd_owner_t *owner);
/* Does obj outlive its creator's connection? */
int kvd_obj_outlives_owner(const kvd_obj_t *obj);

void kvd_obj_ref(kvd_obj_t *obj);
void kvd_obj_unref(kvd_registry_t *reg, kvd_obj_t *obj);

/* May this client use obj (read, write, export)?  KVD_OK, or KVD_EPERM. */
kvd_status_t kvd_obj_may_use(const kvd_obj_t *obj, uint64_t client_id);
/* May this client drop obj?  Only its creator (while connected: a
 * creator's id is never reused), or an admin for a shared one. */
kvd_status_t kvd_obj_may_drop(const kvd_obj_t *obj, uint64_t client_id, uid_t uid, int admin);

/* Is name a valid pool, buffer or cache name (1..63 of [A-Za-z0-9._-])? */
int kvd_pool_name_valid(const char *name);
/* Is s free text without control characters (client names)? */
int kvd_text_valid(const char *s);

#endif
