/*
 * The cluster's lanes: the layer that moves block bytes over UCX.  Each
 * lane is a thread with two UCX workers of its own: rx, where blocks of
 * this daemon's fetches land, and tx, whose endpoints send blocks to
 * peers that fetch.  A lane's workers are its thread's alone: the loop
 * queues commands for it (send, receive, release, connect, close), and
 * every UCX callback there only queues an event for the loop (a worker
 * shared by two threads, UCX_THREAD_MODE_MULTI, has the loop wait on a
 * lock the progressing thread spins on).
 *
 * The lanes know nothing of links, pulls or serving: they report upward
 * only through the callbacks they were given (kvd__lane_up_t), on the loop.
 */
#ifndef KVD_DAEMON_CLUSTER_LANE_H
#define KVD_DAEMON_CLUSTER_LANE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>
#include <uv.h>

#include "kvdock/status.h"

#define KVD_LANES_MAX 8
#define KVD_LANE_ADDRESS_MAX 4096 /* a UCX worker address is tens to hundreds of bytes */
#define KVD_LANE_HDR 3            /* a block's header: 3 words */

typedef struct kvd__server kvd__server_t;
typedef struct kvd__lane kvd__lane_t;

/* A queue one thread fills and another takes whole, under a lock. */
typedef struct kvd__qnode {
    struct kvd__qnode *next;
} kvd__qnode_t;

typedef struct kvd__queue {
    pthread_mutex_t lock;
    kvd__qnode_t *head, *tail;
} kvd__queue_t;

/* What a queue holds: a command for a lane, or an event for the loop. */
typedef struct kvd__lane_node {
    kvd__qnode_t q;           /* first */
    int kind;
} kvd__lane_node_t;

/* An endpoint of a lane's tx worker to a peer's rx worker: made, used and
 * closed by the lane's thread; freed with the lanes (UCX may name it in
 * an error until then).
 *
 * The endpoints made for one peer's lanes form a group, and no block is
 * sent on any of them until each has finished its wireup (UCX's request
 * and the peer's reply): UCX 1.13 aborts a peer whose wireup reply is
 * still queued when we die ("got REP message"), so a pull only starts
 * once no reply to us is left waiting on the other side. */
typedef struct kvd__lane_ep {
    ucp_ep_h ep;             /* NULL: not made, or failed to be */
    kvd__lane_t *lane;
    uint8_t *addr;           /* the peer lane's worker address (checked), then
                              * zeros */
    struct kvd__lane_ep *all; /* every lane endpoint, for the lanes to free */
    kvd__lane_node_t wired;   /* its wireup ended (or failed): an event */
    /* the loop's */
    struct kvd__lane_ep *group; /* the group's first (itself, for the first) */
    uint32_t wiring;         /* on the first: members whose wireup has not ended */
    int open;                /* on the first: sends go to the lanes at once */
    kvd__qnode_t *held, *held_tail; /* on the first: sends waiting, in order */
    int closed;              /* kvd__lane_ep_close was called: sends fail at once */
    ucs_status_t wire_status; /* how its wireup ended (set before its wired event) */
    ucs_status_t failed;     /* on the first: a member's wireup failed so (UCS_OK:
                              * none): its sends fail at once, with this */
} kvd__lane_ep_t;

/* A send or a receive: the caller's record of it holds this, and lives
 * until the lanes hand it back (kvd__lane_up_t.ended). */
typedef struct kvd__lane_op {
    kvd__lane_node_t cmd;     /* on its lane's queue (kind: KVD_LANE_SEND, _RECV) */
    kvd__lane_node_t ev;      /* on the loop's, once it ended */
    kvd__lane_t *lane;
    kvd__lane_ep_t *lep;      /* a send's endpoint */
    void *desc;              /* a receive's rendezvous */
    const uint64_t *hdr;     /* a send's header (read until it ends) */
    void *buf;               /* from, into */
    size_t len;
    ucs_status_t status;     /* how it ended */
    size_t length;           /* bytes received */
} kvd__lane_op_t;

enum { KVD_LANE_SEND = 1, KVD_LANE_RECV = 2 };

/* What the lanes hand the loop: each on the loop thread. */
typedef struct kvd__lane_up {
    void *up;
    /* a send or a receive ended (op->status; a receive's op->length) */
    void (*ended)(void *up, kvd__lane_op_t *op);
    /* a block message came on lane ln: its header, and either its bytes
     * (eager) or a rendezvous that must be received (kvd__lane_recv) or
     * released (kvd__lane_release) */
    void (*arrived)(void *up, kvd__lane_t *ln, const uint64_t hdr[KVD_LANE_HDR],
                    const void *bytes, void *rndv, size_t length);
    /* an endpoint to a peer's lane failed */
    void (*ep_failed)(void *up, kvd__lane_ep_t *lep, ucs_status_t status);
} kvd__lane_up_t;

typedef struct kvd__lanes {
    kvd__server_t *srv;
    struct kvd__lane *lane[KVD_LANES_MAX];
    uint32_t n;
    kvd__lane_ep_t *eps;      /* every one made, freed with the lanes */
    kvd__queue_t events;      /* for the loop */
    uv_async_t ev_async;
    atomic_int ev_open;      /* ev_async is open: lanes may wake the loop with it */
    int events_made;
    kvd__lane_up_t up;
    uint64_t stray;          /* block messages without a block's header */
} kvd__lanes_t;

/* n lanes of ctx: their workers and threads, the loop's wake-up.  Nothing
 * is left behind on error (why says what failed). */
kvd_status_t kvd__lanes_start(kvd__lanes_t *ls, kvd__server_t *srv, ucp_context_h ctx, uint32_t n,
                              const kvd__lane_up_t *up, char *why, size_t why_len);
/* The threads go; what their workers still hold ends here (the callbacks
 * hear of it); the loop's wake-up closes. */
void kvd__lanes_close(kvd__lanes_t *ls);
/* After the loop: the workers and endpoints go. */
void kvd__lanes_free(kvd__lanes_t *ls);

/* Send len bytes of data with header hdr to the peer's lane lep (once
 * lep is closed, or once a wireup of its group failed, it ends failed,
 * handed back through the events). */
void kvd__lane_send(kvd__lane_ep_t *lep, kvd__lane_op_t *op, const uint64_t *hdr,
                    const void *data, size_t len);
/* Receive the rendezvous rndv that came on ln into buf[0..len). */
void kvd__lane_recv(kvd__lane_t *ln, kvd__lane_op_t *op, void *rndv, void *buf, size_t len);
/* Drop the rendezvous rndv that came on ln. */
void kvd__lane_release(kvd__lane_t *ln, void *rndv);

/* Is addr[0..len) a worker address these lanes' UCX may unpack (frames.h)? */
int kvd__lanes_address_ok(const kvd__lanes_t *ls, const uint8_t *addr, size_t len);
/* An endpoint from lane k % n to the worker at addr (checked), made on
 * that lane's thread, in group (the first's endpoint; NULL: it starts a
 * group); NULL out of memory.  Make a group's members in one go, before
 * the loop runs again: its sends wait until all of them are wired up.
 * If one's wireup fails, the group never opens: the sends it holds end
 * failed with that wireup's status, as do later ones, and the endpoint is
 * reported failed (kvd__lane_up_t.ep_failed). */
kvd__lane_ep_t *kvd__lane_connect(kvd__lanes_t *ls, uint32_t k, const uint8_t *addr, size_t len,
                                  kvd__lane_ep_t *group);
/* Close lep forcibly: what it carries ends at once, failed, and so do the
 * sends its group held for it (they never reach UCX: lep may not be wired
 * up), and any sent on it later. */
void kvd__lane_ep_close(kvd__lane_ep_t *lep);

/* Lane k's rx address, where peers send what we fetch; lane ln's index. */
const uint8_t *kvd__lane_address(const kvd__lanes_t *ls, uint32_t k, size_t *len);
uint32_t kvd__lane_index(const kvd__lanes_t *ls, const kvd__lane_t *ln);
kvd__lane_t *kvd__lane_at(kvd__lanes_t *ls, uint32_t k);

#endif
