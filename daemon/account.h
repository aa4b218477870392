/*
 * What a client makes the daemon hold besides the pools and buffers it
 * creates: its leases, and the memory of its requests (decoding them,
 * handling them, and the bookkeeping of those in flight).  Each byte is
 * charged to the host-memory budget (hostmem.h: the "leases" and
 * "requests" kinds) and to the client's own limit (--max-client-memory)
 * before it is allocated, and given back when it goes.
 *
 * A request is decoded in two steps: its wire bytes are walked first
 * (kvd__wire_measure: no allocation, bounded time), which refuses a
 * repeated field past its limit and yields the most that protobuf-c's
 * unpacking can allocate for it; then it is unpacked into an arena
 * (kvd__arena_t) charged as it grows and capped at that measure, which the
 * handler also allocates from.  All of it goes back to the system once the
 * reply is packed.
 *
 * Loop thread only.
 */
#ifndef KVD_DAEMON_ACCOUNT_H
#define KVD_DAEMON_ACCOUNT_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "kvdock/status.h"

typedef struct kvd__conn kvd__conn_t;
typedef struct kvd__server kvd__server_t;

/* Charge bytes of kind (KVD_HM_LEASES, KVD_HM_REQUESTS) to client c and
 * the budget, or refuse with KVD_ELIMIT (KVD_ENOMEM: the machine) and why
 * naming the limit; nothing is charged on refusal. */
kvd_status_t kvd__account_charge(kvd__conn_t *c, int kind, uint64_t bytes, char *why,
                                 size_t why_len);
void kvd__account_release(kvd__conn_t *c, int kind, uint64_t bytes);

/* ---- measuring a message from the wire --------------------------------------- */

/* Entries of one repeated field of a request that is not a numeric array
 * (a chain's keys: CacheKeys). */
#define KVD_MAX_REPEATED 65536u

typedef struct kvd__wire_limits {
    uint64_t max_repeated;     /* entries of one repeated field of one message */
    uint64_t max_packed_bytes; /* bytes one packed numeric field decodes to */
} kvd__wire_limits_t;

/*
 * Walk the encoded message buf (of type desc) as protobuf-c's unpacking
 * will, allocating nothing: *bytes gets the most that unpacking it can
 * allocate (every allocation rounded to KVD_ARENA_ALIGN, none freed), and
 * *id the value of its field 1 when that is a varint (0 otherwise).
 * KVD_OK; KVD_ELIMIT when a repeated field passes lim; KVD_EINVAL when a
 * singular message field or a oneof is given twice (protobuf-c would merge
 * the copies, allocating anew for each); KVD_EPROTO when the bytes do not
 * parse or nest deeper than the schema; why says which field.
 */
kvd_status_t kvd__wire_measure(const ProtobufCMessageDescriptor *desc, const uint8_t *buf,
                               size_t len, const kvd__wire_limits_t *lim, uint64_t *bytes,
                               uint64_t *id, char *why, size_t why_len);

/* ---- the request arena --------------------------------------------------------- */

#define KVD_ARENA_ALIGN 8u
/* The server keeps one chunk of this size for the request being handled,
 * not charged (as each connection's first read chunk is not): small
 * requests cost no system call. */
#define KVD_ARENA_FIRST (64u << 10)

struct kvd__arena_chunk;

typedef struct kvd__arena {
    kvd__conn_t *conn;          /* charged to */
    struct kvd__arena_chunk *chunks; /* mapped ones, newest first */
    uint8_t *first;            /* the server's chunk, while this arena has it */
    uint8_t *cur;
    size_t left;
    uint64_t used;             /* bytes handed out */
    uint64_t cap;              /* most used may reach; UINT64_MAX: none */
    uint64_t charged;          /* bytes of mapped chunks charged */
    kvd_status_t refusal;      /* why the last allocation failed (KVD_OK: none did) */
    char why[200];
} kvd__arena_t;

/* An arena for a request of c (the server's first chunk when free). */
void kvd__arena_init(kvd__arena_t *a, kvd__conn_t *c);
/* size zeroed bytes, or NULL (refusal and why set). */
void *kvd__arena_alloc(kvd__arena_t *a, size_t size);
/* Give back every chunk and what it charged. */
void kvd__arena_deinit(kvd__arena_t *a);
/* protobuf-c's allocator over a (frees nothing: the arena goes whole). */
void kvd__arena_pb_allocator(kvd__arena_t *a, ProtobufCAllocator *out);

#endif
