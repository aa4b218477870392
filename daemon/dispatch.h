/*
 * Dispatch: ONE table, a row per operation (name, handler, flags).  The
 * checks every operation shares (a known operation, hello first,
 * permission, Sync only on data operations, not shutting down) happen here
 * before any handler runs; the unpacked request is freed right after the
 * handler returns.
 */
#ifndef KVD_DAEMON_DISPATCH_H
#define KVD_DAEMON_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "wire.h"
#include "op_list.h"

enum kvd__op_flags {
    KVD_OPF_HELLO = 1u << 0, /* needs a hello first */
    KVD_OPF_ADMIN = 1u << 1, /* admin peers only */
    KVD_OPF_DATA = 1u << 2,  /* a data operation: Sync applies, work goes to the backend */
};

typedef struct kvd__req kvd__req_t;
typedef kvd_status_t (*kvd__op_handler_t)(kvd__req_t *r);

typedef struct kvd__op_def {
    int op_case; /* Kvdock__Request__OpCase; its name: kvd__op_name() */
    kvd__op_handler_t handler;
    unsigned flags;
} kvd__op_def_t;

/* One request being handled (on the stack of the dispatcher). */
struct kvd__req {
    kvd__server_t *srv;
    kvd__conn_t *conn;
    const Kvdock__Request *req;
    size_t op_index; /* row of the dispatch table */
    uint64_t t_start_ns;
    int *fds;        /* descriptors that came with the frame; a handler that */
    int nfds;        /* keeps one sets its slot to -1 */
    Kvdock__Response resp; /* the handler sets result_case and the result */
    char msg[256];         /* the error message, when the handler fails */
    int deferred;          /* the handler replies later (kvd__reply_deferred) */
    /* A handler that returns KVD_EBUSY for want of something that frees
     * itself may set park: the request waits there (park.h) for park_need
     * units instead of the reply.  replayed: this run is a waiting
     * request's, which may go ahead of the others waiting on its queue. */
    struct kvd__waitq *park;
    uint32_t park_need;
    int replayed;
    int reply_fds[2];      /* descriptors to send with the reply (not owned) */
    int n_reply_fds;
    /* undoes what a successful handler made for its reply (an area, a
     * buffer) when that reply cannot be sent: an error reply goes instead,
     * and the client never learns of it.  Called with the request and its
     * reply still whole. */
    void (*unsent)(struct kvd__req *r);
    int close_after;       /* close the connection once the reply is out */
    struct kvd__arena *arena; /* the request's memory (account.h), gone once the
                              * reply is packed */
};

/* Where a deferred reply goes: request req_id of conn (on srv), counted
 * in row op_index of the stats from t_start_ns.  What answers a request
 * later (work off the loop, a plan, a wait) keeps one, taken from the
 * request with kvd__origin_of, and replies through it.  held: the bytes
 * that work charged to conn's client as request bookkeeping
 * (KVD_HM_REQUESTS), released by whoever set it; 0 where none. */
typedef struct kvd__origin {
    kvd__server_t *srv;
    kvd__conn_t *conn;
    uint64_t req_id;
    size_t op_index;
    uint64_t t_start_ns;
    uint64_t held;
} kvd__origin_t;

/* The origin of request r (held 0). */
kvd__origin_t kvd__origin_of(const kvd__req_t *r);

/* The table. */
extern const kvd__op_def_t kvd__op_table[];
extern const size_t kvd__op_count; /* stats row kvd__op_count is "unknown" */
/* The name of table row i (kvd__op_name), "unknown" past the table. */
const char *kvd__op_row_name(size_t i);

/* Decode and handle one frame's payload.  fds: descriptors that came with
 * it (closed unless a handler keeps them).  Returns -1 when the frame does
 * not decode (the connection must close). */
int kvd__dispatch_frame(kvd__conn_t *c, const uint8_t *payload, size_t len, int *fds, int nfds);

/* Handle a waiting request's frame again (park.h): as if it came now,
 * timed from t_start_ns; if it must wait again it keeps deadline_ns and
 * its place at the head of its queue. */
void kvd__dispatch_replay(kvd__conn_t *c, const uint8_t *payload, size_t len, uint64_t t_start_ns,
                          uint64_t deadline_ns);

/* Answer a frame that cannot be handled (ETOOBIG, EPROTO): request id 0. */
void kvd__reply_error(kvd__conn_t *c, uint64_t id, kvd_status_t st, const char *msg);

/* Reply to the deferred request of o: st (msg, or the status's words),
 * or op's result; bytes counted as moved. */
void kvd__reply_deferred(const kvd__origin_t *o, kvd_status_t st, const char *msg,
                         Kvdock__OpReply *op, uint64_t bytes);

/* Reply to the deferred request of o with a whole response (its status
 * and result set by the caller; its id set here). */
void kvd__reply_deferred_response(const kvd__origin_t *o, Kvdock__Response *resp);

/* Set the error message of r; returns st (for `return kvd__req_fail(r, ...)`). */
kvd_status_t kvd__req_fail(kvd__req_t *r, kvd_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Drop the registry object id of type for r's client: ENOENT when there
 * is none of that type, EPERM when it is another client's (what names
 * the type in the messages: "buffer", "event"). */
kvd_status_t kvd__req_drop_obj(kvd__req_t *r, uint64_t id, kvd__obj_type_t type, const char *what);

/* Zeroed memory freed with the request (after the reply is packed),
 * charged to the client (account.h); NULL past its limits. */
void *kvd__req_alloc(kvd__req_t *r, size_t bytes);

/* Would bytes more of pools or buffers pass this client's or the daemon's
 * limit?  KVD_OK or KVD_ELIMIT (with the message set). */
kvd_status_t kvd__check_mem_limits(kvd__req_t *r, uint64_t bytes);

/* The path (kvd_copy_path_t) a transfer between memory of src_kind and
 * dst_kind takes when the request does not say and its indices can be
 * read when it arrives: the copy engines between host and device memory
 * (--host-copy-path), kernels otherwise. */
int kvd__default_path(const kvd__options_t *o, int src_kind, int dst_kind);
/* The path stream class sclass takes by default: its host-device
 * direction's (reload, offload), kernels otherwise. */
int kvd__stream_path(const kvd__options_t *o, int sclass);

/* Reserve bytes (rounded up to whole pages) of host memory of kind (enum
 * kvd__hostmem_kind) for obj, which records them: the registry gives them
 * back when obj is freed.  KVD_OK, or the budget's refusal (message set,
 * prefixed with what). */
kvd_status_t kvd__reserve_host(kvd__req_t *r, kvd__obj_t *obj, int kind, uint64_t bytes,
                               const char *what);
/* Give back what kvd__reserve_host counted for an object that was never added. */
void kvd__unreserve_host(kvd__req_t *r, kvd__obj_t *obj);

/* Handlers, one file per group: kvd__op_<name> for each row of KVD_OPS. */
#define KVD_OP_DECLARE_(name, OP, flags) kvd_status_t kvd__op_##name(kvd__req_t *r);
KVD_OPS(KVD_OP_DECLARE_)
#undef KVD_OP_DECLARE_

#endif
