/* Requests that wait: see park.h. */
#include "park.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "account.h"
#include "conn.h"
#include "dispatch.h"
#include "hostmem.h"
#include "server.h"

struct kvd__parked {
    kvd__waitq_t *q;
    kvd__origin_t origin;     /* held: this entry's charge */
    uint64_t deadline_ns;
    uint32_t need;
    char why[256];            /* the handler's EBUSY, the reply if it may not wait */
    const kvd__park_ops_t *ops; /* a plan's (no frame): NULL for a frame */
    void *arg;
    kvd__parked_t *prev, *next;           /* the queue's */
    kvd__parked_t *conn_prev, *conn_next; /* the connection's */
    size_t len;
    uint8_t payload[];
};

void kvd__waitq_init(kvd__waitq_t *q, kvd__server_t *srv, void (*ref)(void *, int), void *owner)
{
    memset(q, 0, sizeof(*q));
    q->srv = srv;
    q->ref = ref;
    q->owner = owner;
}

void kvd__waitq_wake_all(kvd__waitq_t *q)
{
    kvd__server_t *srv = q->srv;

    /* on the server's list: its head runs on the loop's next turn (a wake
     * from a completion must not run a handler inside the completion) */
    if (q->woken || q->head == NULL)
        return;
    q->woken = 1;
    if (q->ref != NULL)
        q->ref(q->owner, +1); /* kept until its turn has run */
    q->woken_next = srv->woken;
    srv->woken = q;
    kvd__server_want_idle(srv);
}

void kvd__waitq_freed(kvd__waitq_t *q, uint32_t n, int idle)
{
    if (q->head == NULL)
        return;
    q->freed += n;
    if (idle || q->freed >= q->head->need)
        kvd__waitq_wake_all(q);
}

static void unlink_q(kvd__parked_t *p)
{
    kvd__waitq_t *q = p->q;

    if (p->prev)
        p->prev->next = p->next;
    else
        q->head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    else
        q->tail = p->prev;
    p->prev = p->next = NULL;
    if (q->head == NULL)
        q->freed = 0;
}

static void unlink_conn(kvd__parked_t *p)
{
    kvd__conn_t *c = p->origin.conn;

    if (p->conn_prev)
        p->conn_prev->conn_next = p->conn_next;
    else
        c->parked = p->conn_next;
    if (p->conn_next)
        p->conn_next->conn_prev = p->conn_prev;
    p->conn_prev = p->conn_next = NULL;
}

/* Off both lists, its charge given back. */
static void parked_detach(kvd__parked_t *p)
{
    unlink_q(p);
    unlink_conn(p);
    kvd__account_release(p->origin.conn, KVD_HM_REQUESTS, p->origin.held);
}

/* Detached and done with: its hold on the queue's owner and its operation
 * on the connection end. */
static void parked_end(kvd__parked_t *p)
{
    kvd__waitq_t *q = p->q;
    kvd__conn_t *c = p->origin.conn;

    free(p);
    if (q->ref != NULL)
        q->ref(q->owner, -1);
    kvd__conn_op_end(c);
}

/* How long a request waits at most (--disk-wait-ms). */
static uint64_t wait_ns(const kvd__conn_t *c)
{
    return c->srv->opts.disk_wait_ms * 1000000ull;
}

/* A new entry for the request of o holding len bytes of frame, charged
 * to its connection; NULL with the status in *st when it may not wait. */
static kvd__parked_t *parked_new(const kvd__origin_t *o, size_t len, kvd_status_t *st)
{
    kvd__conn_t *c = o->conn;
    uint64_t held = sizeof(kvd__parked_t) + len;
    kvd__parked_t *p;
    char refused[200];

    *st = KVD_ESHUTDOWN;
    if (c->closing || c->close_after_flush || c->srv->shutting_down)
        return NULL;
    *st = KVD_ELIMIT;
    if (kvd__account_charge(c, KVD_HM_REQUESTS, held, refused, sizeof(refused)) != KVD_OK)
        return NULL;
    *st = KVD_ENOMEM;
    if ((p = malloc(held)) == NULL) {
        kvd__account_release(c, KVD_HM_REQUESTS, held);
        return NULL;
    }
    memset(p, 0, sizeof(*p));
    p->origin = *o;
    p->origin.held = held;
    p->len = len;
    *st = KVD_OK;
    return p;
}

static void parked_link(kvd__waitq_t *q, kvd__parked_t *p, int at_head);

kvd_status_t kvd__park(kvd__waitq_t *q, const kvd__origin_t *o, const uint8_t *payload,
                       size_t len, uint64_t deadline_ns, uint32_t need, const char *why)
{
    int at_head = deadline_ns != 0;
    kvd__parked_t *p;
    kvd_status_t st;

    if ((p = parked_new(o, len, &st)) == NULL)
        return st;
    p->deadline_ns = at_head ? deadline_ns : kvd__now_ns() + wait_ns(o->conn);
    p->need = need ? need : 1;
    snprintf(p->why, sizeof(p->why), "%s", why);
    memcpy(p->payload, payload, len);
    parked_link(q, p, at_head);
    return KVD_OK;
}

kvd_status_t kvd__park_plan(kvd__waitq_t *q, const kvd__origin_t *o, const kvd__park_ops_t *ops,
                            void *arg, uint64_t *deadline_ns, uint32_t need, const char *why)
{
    kvd__parked_t *p;
    kvd_status_t st;

    if ((p = parked_new(o, 0, &st)) == NULL)
        return st;
    if (*deadline_ns == 0)
        *deadline_ns = kvd__now_ns() + wait_ns(o->conn);
    p->deadline_ns = *deadline_ns;
    p->need = need ? need : 1;
    p->ops = ops;
    p->arg = arg;
    snprintf(p->why, sizeof(p->why), "%s", why);
    parked_link(q, p, 2);
    return KVD_OK;
}

/* p waits on q from now: at the head (at_head 1: a woken head that waits
 * again), at the tail (0), or (2: a plan) behind every request that came
 * before it, ahead of the later ones. */
static void parked_link(kvd__waitq_t *q, kvd__parked_t *p, int at_head)
{
    kvd__conn_t *c = p->origin.conn;
    kvd__parked_t *after = q->tail;

    p->q = q;
    if (at_head == 2) {
        while (after != NULL && after->origin.t_start_ns > p->origin.t_start_ns)
            after = after->prev;
        if (after != NULL && after != q->tail) { /* in the middle: after `after` */
            p->prev = after;
            p->next = after->next;
            after->next->prev = p;
            after->next = p;
        }
        at_head = after == NULL;
    }
    if (p->prev != NULL) {
        /* linked above */
    } else if (at_head) { /* it was the head: it keeps its place */
        p->next = q->head;
        if (q->head)
            q->head->prev = p;
        else
            q->tail = p;
        q->head = p;
    } else {
        p->prev = q->tail;
        if (q->tail)
            q->tail->next = p;
        else
            q->head = p;
        q->tail = p;
    }
    if (q->head == p)
        q->freed = 0; /* counted for the head from now */
    q->waited_again |= q->head == p;
    p->conn_next = c->parked;
    if (c->parked)
        c->parked->conn_prev = p;
    c->parked = p;
    if (q->ref != NULL)
        q->ref(q->owner, +1);
    kvd__conn_op_begin(c);
    kvd__server_sweep_arm(c->srv);
}

/* The head runs again: its frame is handled as if it had just come, with
 * its first start time and deadline; it may wait again, at the head. */
static void run_head(kvd__waitq_t *q)
{
    kvd__parked_t *p = q->head;

    parked_detach(p);
    if (p->ops != NULL)
        p->ops->resume(p->arg);
    else
        kvd__dispatch_replay(p->origin.conn, p->payload, p->len, p->origin.t_start_ns,
                             p->deadline_ns);
    parked_end(p);
}

void kvd__park_run_woken(kvd__server_t *srv)
{
    kvd__waitq_t *list = srv->woken;

    srv->woken = NULL;
    while (list) {
        kvd__waitq_t *q = list;

        list = q->woken_next;
        q->woken_next = NULL;
        q->woken = 0;
        /* heads run while each gets on; one that waits again is the head
         * again, and the rest wait with it */
        while (q->head != NULL) {
            q->waited_again = 0;
            run_head(q);
            if (q->waited_again)
                break;
        }
        if (q->ref != NULL)
            q->ref(q->owner, -1); /* the wake's: q may be gone now */
    }
}

void kvd__park_drop_conn(kvd__conn_t *c)
{
    while (c->parked) {
        kvd__parked_t *p = c->parked;
        parked_detach(p);
        if (p->ops != NULL)
            p->ops->drop(p->arg);
        parked_end(p);
    }
}

void kvd__park_expire(kvd__conn_t *c, uint64_t now_ns)
{
    kvd__parked_t *p = c->parked;

    while (p) {
        kvd__parked_t *next = p->conn_next;

        if (now_ns >= p->deadline_ns) {
            char msg[320];
            snprintf(msg, sizeof(msg), "%s (waited %" PRIu64 " ms, --disk-wait-ms, for it to "
                     "free)", p->why, c->srv->opts.disk_wait_ms);
            parked_detach(p);
            if (p->ops != NULL)
                p->ops->expire(p->arg, msg);
            else
                kvd__reply_deferred(&p->origin, KVD_EBUSY, msg, NULL, 0);
            parked_end(p);
        }
        p = next;
    }
}
