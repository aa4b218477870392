/*
 * Requests that wait.  A handler that cannot go on for want of something
 * that frees itself soon (host slots held by the disk writes in flight)
 * may ask to wait instead of answering EBUSY: it returns KVD_EBUSY with
 * its message, naming a queue and how much it needs (kvd__req_t.park,
 * .park_need).  Dispatch then keeps a copy of the request's frame (charged
 * to the client as request bookkeeping, an operation in flight on its
 * connection) and runs it again, whole and revalidated, when the queue
 * has seen that much freed or nothing is left in flight that could free
 * more.  The handler's EBUSY is the reply where the request may not wait:
 * no room for the copy, a run that is already a wait's last chance, or
 * --disk-wait-ms gone by.
 *
 * A request that has begun its work (a save streaming through the host
 * level, ops_cache.c) waits as a plan instead: no frame is kept, its
 * plan is resumed, and it answers for itself when its time is up or its
 * connection goes.
 *
 * A queue is first come, first served: the head runs again first, and a
 * handler that finds others waiting on its queue waits behind them (it
 * would take what they wait for).  A woken head that must wait again
 * keeps its place.  Loop thread only.
 */
#ifndef KVD_DAEMON_PARK_H
#define KVD_DAEMON_PARK_H

#include <stddef.h>
#include <stdint.h>

#include "kvdock/status.h"

typedef struct kvd__server kvd__server_t;
typedef struct kvd__conn kvd__conn_t;
typedef struct kvd__parked kvd__parked_t;
typedef struct kvd__origin kvd__origin_t; /* dispatch.h */

typedef struct kvd__waitq {
    kvd__parked_t *head, *tail;
    uint64_t freed;       /* units freed since the head began to wait */
    /* the owner (a cache) is kept while requests wait on its queue */
    void (*ref)(void *owner, int delta);
    void *owner;
    kvd__server_t *srv;
    int woken;            /* on the server's list of queues to run */
    int waited_again;     /* the head that ran waits again */
    struct kvd__waitq *woken_next;
} kvd__waitq_t;

/* A zeroed queue of owner's (ref: keeps it while requests wait). */
void kvd__waitq_init(kvd__waitq_t *q, kvd__server_t *srv, void (*ref)(void *, int), void *owner);

/* n units were freed; idle: nothing is left in flight that could free
 * more.  The head runs again (on the loop's next turn) once the units
 * freed reach what it needs, or at once when idle. */
void kvd__waitq_freed(kvd__waitq_t *q, uint32_t n, int idle);
/* Every request waiting runs again now: what they wait for is gone (the
 * owner is dropped, the daemon shuts down). */
void kvd__waitq_wake_all(kvd__waitq_t *q);

/* Dispatch's side.  Keep the frame payload[0..len) of the request of o
 * (why: the handler's EBUSY message) on q, needing need units.
 * deadline_ns: 0 for a first wait, at the tail; a woken head's own, which
 * waits again at the head.  KVD_OK: it waits (no reply now); else it may
 * not wait (the caller answers EBUSY). */
kvd_status_t kvd__park(kvd__waitq_t *q, const kvd__origin_t *o, const uint8_t *payload,
                       size_t len, uint64_t deadline_ns, uint32_t need, const char *why);
/* What a plan that waits does when its turn comes (each called once,
 * the wait over): resume goes on (and may wait again, at the head);
 * expire answers KVD_EBUSY with msg (the plan's why, and how long it
 * waited) and goes; drop goes without a reply (its connection went). */
typedef struct kvd__park_ops {
    void (*resume)(void *arg);
    void (*expire)(void *arg, const char *msg);
    void (*drop)(void *arg);
} kvd__park_ops_t;

/* Plan arg, which answers the request of o (come at o->t_start_ns), waits
 * on q for need units, behind the requests that came before it and ahead
 * of the later ones (it has begun: it does not go behind them);
 * *deadline_ns: 0 for a new wait, set to its end here; a woken plan that
 * got nothing passes its own back.  why: what it waits for, for the
 * EBUSY.  KVD_OK: it waits (an operation in flight on o->conn); else it
 * may not (the plan ends as it can). */
kvd_status_t kvd__park_plan(kvd__waitq_t *q, const kvd__origin_t *o, const kvd__park_ops_t *ops,
                            void *arg, uint64_t *deadline_ns, uint32_t need, const char *why);
/* Run the woken queues' heads again (the server's idle turn). */
void kvd__park_run_woken(kvd__server_t *srv);
/* The connection goes: its waiting requests go without a reply. */
void kvd__park_drop_conn(kvd__conn_t *c);
/* Requests of c waiting past their time are answered EBUSY. */
void kvd__park_expire(kvd__conn_t *c, uint64_t now_ns);

#endif
