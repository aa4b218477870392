/* The cluster's lanes: see lane.h. */
#include "lane.h"

#include <poll.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frames.h"
#include "log.h"
#include "server.h"

#define AM_BLOCK 2
#define ADDRESS_SLACK 64         /* zeros after a peer's address copy */
#define MAX_EAGER (8u << 20)     /* an eager block message kept for the loop */

/* Commands past a send or receive, and events: what their nodes say. */
enum { CMD_RELEASE = 3, CMD_CONNECT, CMD_CLOSE };
enum { EV_ENDED = 1, EV_ARRIVED, EV_EP_FAILED, EV_WIRED };

struct kvd__lane {
    kvd__lanes_t *ls;
    ucp_worker_h rx, tx;     /* blocks land on rx; tx's endpoints send them */
    int rx_efd, tx_efd;
    ucp_address_t *address;  /* rx's, as the Lanes message carries it */
    size_t address_len;
    pthread_t thread;
    int running;
    atomic_int stop;
    kvd__queue_t cmds;        /* from the loop */
    uint32_t outstanding;    /* its thread's: sends and receives UCX holds */
    uint32_t closing;        /* its thread's: endpoint closes UCX has not ended */
    uint32_t wiring;         /* its thread's: endpoint wireups UCX has not ended */
};

/* A command the lanes make and free (a release, a connect, a close). */
typedef struct cmd {
    kvd__lane_node_t node;    /* first */
    kvd__lane_ep_t *lep;
    void *desc;
} cmd_t;

/* A block message that came (the loop's to receive, release or drop). */
typedef struct arrival {
    kvd__lane_node_t node;    /* first */
    kvd__lane_t *lane;
    uint64_t hdr[KVD_LANE_HDR]; /* fetch id, index in the fetch, the fetch's token */
    void *data;              /* rendezvous: its descriptor */
    size_t length;
    int rndv;
    int bad;                 /* no block's header: counted, dropped */
    uint8_t bytes[];         /* eager: its bytes */
} arrival_t;

typedef struct ep_error {
    kvd__lane_node_t node;    /* first */
    kvd__lane_ep_t *lep;
    ucs_status_t status;
} ep_error_t;

static kvd__lane_op_t *op_of_ev(kvd__qnode_t *n)
{
    return (kvd__lane_op_t *)((char *)n - offsetof(kvd__lane_op_t, ev));
}

/* Append n; 1 when the queue was empty. */
static int queue_push(kvd__queue_t *q, kvd__qnode_t *n)
{
    int first;

    n->next = NULL;
    pthread_mutex_lock(&q->lock);
    first = q->head == NULL;
    if (q->tail != NULL)
        q->tail->next = n;
    else
        q->head = n;
    q->tail = n;
    pthread_mutex_unlock(&q->lock);
    return first;
}

/* Everything queued so far, in order. */
static kvd__qnode_t *queue_take(kvd__queue_t *q)
{
    kvd__qnode_t *n;

    pthread_mutex_lock(&q->lock);
    n = q->head;
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->lock);
    return n;
}

static void lane_cmd(kvd__lane_t *ln, kvd__lane_node_t *c);

/* ---- events, for the loop ------------------------------------------------------ */

/* Hand an event to the loop: from a lane's thread, or from the loop itself. */
static void ev_post(kvd__lanes_t *ls, kvd__lane_node_t *ev, int kind)
{
    ev->kind = kind;
    (void)queue_push(&ls->events, &ev->q);
    if (atomic_load(&ls->ev_open))
        uv_async_send(&ls->ev_async);
}

/* The group's sends go to their lanes, in order; later ones go at once. */
static void group_open(kvd__lane_ep_t *g)
{
    kvd__qnode_t *n, *next;

    if (g->open)
        return;
    g->open = 1;
    for (n = g->held, g->held = g->held_tail = NULL; n != NULL; n = next) {
        kvd__lane_op_t *op = (kvd__lane_op_t *)n; /* cmd, and so its node, is first */
        next = n->next;
        lane_cmd(op->lep->lane, &op->cmd);
    }
}

/* On the loop: a send that never reaches UCX ends with status (failed as
 * one on an endpoint that is gone, or that could not be wired up, does),
 * handed back through the events. */
static void send_fail(kvd__lane_op_t *op, ucs_status_t status)
{
    op->status = status;
    op->length = 0;
    ev_post(op->lane->ls, &op->ev, EV_ENDED);
}

/* The sends lep's group holds for lep end failed, in order; the others
 * wait on. */
static void group_fail(kvd__lane_ep_t *lep)
{
    kvd__lane_ep_t *g = lep->group;
    kvd__qnode_t **pp = &g->held, *n;

    g->held_tail = NULL;
    while ((n = *pp) != NULL) {
        kvd__lane_op_t *op = (kvd__lane_op_t *)n; /* cmd, and so its node, is first */
        if (op->lep == lep) {
            *pp = n->next;
            send_fail(op, UCS_ERR_NOT_CONNECTED);
        } else {
            g->held_tail = n;
            pp = &n->next;
        }
    }
}

/* lep's wireup failed (status): its group never opens.  Every send the
 * group holds ends failed with status, in order, and so does every later
 * one (kvd__lane_send): none reaches UCX, not even on the members whose
 * wireup ended well, since the lanes of a peer go together.  Then the
 * endpoint is reported failed, as its error handler would (UCX need not
 * call that for a wireup that failed). */
static void group_wire_failed(kvd__lanes_t *ls, kvd__lane_ep_t *lep, ucs_status_t status)
{
    kvd__lane_ep_t *g = lep->group;
    kvd__qnode_t *n, *next;
    unsigned held = 0;

    if (g->failed != UCS_OK)
        return;
    g->failed = status;
    for (n = g->held, g->held = g->held_tail = NULL; n != NULL; n = next, held++) {
        next = n->next;
        send_fail((kvd__lane_op_t *)n, status); /* cmd, and so its node, is first */
    }
    kvd_log(KVD_LOG_WARN, "event=cluster_lane_wireup_failed status=\"%s\" sends_failed=%u",
            ucs_status_string(status), held);
    ls->up.ep_failed(ls->up.up, lep, status);
}

/* Run the events queued so far, through the callbacks; how many. */
static unsigned ev_drain(kvd__lanes_t *ls)
{
    kvd__qnode_t *n, *next;
    unsigned count = 0;

    for (n = queue_take(&ls->events); n != NULL; n = next, count++) {
        kvd__lane_node_t *e = (kvd__lane_node_t *)n;
        next = n->next;
        if (e->kind == EV_ENDED) {
            ls->up.ended(ls->up.up, op_of_ev(n));
        } else if (e->kind == EV_ARRIVED) {
            arrival_t *a = (arrival_t *)e;
            if (a->bad) /* a stray: UCX keeps nothing of it */
                ls->stray++;
            else
                ls->up.arrived(ls->up.up, a->lane, a->hdr, a->rndv ? NULL : a->bytes,
                               a->rndv ? a->data : NULL, a->length);
            free(a);
        } else if (e->kind == EV_WIRED) {
            kvd__lane_ep_t *lep = (kvd__lane_ep_t *)((char *)e - offsetof(kvd__lane_ep_t, wired));
            kvd__lane_ep_t *g = lep->group;
            /* a closed one's sends ended at its close; the others wait on */
            if (lep->wire_status != UCS_OK && !lep->closed)
                group_wire_failed(ls, lep, lep->wire_status);
            if (g->wiring > 0 && --g->wiring == 0 && g->failed == UCS_OK)
                group_open(g);
        } else {
            ep_error_t *er = (ep_error_t *)e;
            ls->up.ep_failed(ls->up.up, er->lep, er->status);
            free(er);
        }
    }
    return count;
}

static void on_events(uv_async_t *h)
{
    kvd__lanes_t *ls = h->data;

    if (ev_drain(ls) > 0)
        kvd__server_activity(ls->srv); /* more likely follow soon */
}

/* ---- commands, for a lane's thread -------------------------------------------- */

/* Queue a command for lane ln's thread (from the loop). */
static void lane_cmd(kvd__lane_t *ln, kvd__lane_node_t *c)
{
    /* wake its thread (safe from any thread); a queue that was not empty
     * is one it has yet to take, and it takes all of it before it sleeps */
    if (queue_push(&ln->cmds, &c->q))
        ucp_worker_signal(ln->tx); /* its thread sleeps on both workers */
}

/* A command the loop makes and forgets (a release, a connect, a close). */
static void lane_cmd_new(kvd__lane_t *ln, int kind, kvd__lane_ep_t *lep, void *desc)
{
    cmd_t *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        kvd_log(KVD_LOG_ERROR, "event=cluster_lane_command_lost op=%d reason=\"no memory\"",
                kind);
        return;
    }
    c->node.kind = kind;
    c->lep = lep;
    c->desc = desc;
    lane_cmd(ln, &c->node);
}

/* A send or receive ended (on the lane's thread): back to the loop. */
static void op_ended(kvd__lane_op_t *op, ucs_status_t status, size_t length)
{
    op->status = status;
    op->length = length;
    ev_post(op->lane->ls, &op->ev, EV_ENDED);
}

static void on_sent(void *request, ucs_status_t status, void *user_data)
{
    kvd__lane_op_t *op = user_data;

    ucp_request_free(request);
    op->lane->outstanding--;
    op_ended(op, status, 0);
}

static void on_received(void *request, ucs_status_t status, size_t length, void *user_data)
{
    kvd__lane_op_t *op = user_data;

    ucp_request_free(request);
    op->lane->outstanding--;
    op_ended(op, status, length);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvd__lane_ep_t *lep = arg;
    ep_error_t *e = calloc(1, sizeof(*e));

    (void)ep;
    if (e == NULL)
        return;
    e->lep = lep;
    e->status = status;
    ev_post(lep->lane->ls, &e->node, EV_EP_FAILED);
}

/* A forcible close ended. */
static void on_closed(void *request, ucs_status_t status, void *user_data)
{
    kvd__lane_t *ln = user_data;

    (void)status;
    ln->closing--;
    ucp_request_free(request);
}

/* An endpoint's wireup ended: its flush, which waits for the peer's
 * reply to UCX's wireup request, completed (or failed). */
static void on_wired(void *request, ucs_status_t status, void *user_data)
{
    kvd__lane_ep_t *lep = user_data;

    lep->wire_status = status; /* the loop reads it after the event */
    lep->lane->wiring--;
    ucp_request_free(request);
    ev_post(lep->lane->ls, &lep->wired, EV_WIRED);
}

/* Wire lep's endpoint up now, not at its first send: UCX sends its wireup
 * request as the endpoint is made (RESOLVE_REMOTE_EP_ID, set with the
 * context), and a flush ends once the peer's reply came. */
static void ep_wire(kvd__lane_t *ln, kvd__lane_ep_t *lep)
{
    ucp_request_param_t rp;
    void *req;

    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = on_wired;
    rp.user_data = lep;
    req = ucp_ep_flush_nbx(lep->ep, &rp);
    if (UCS_PTR_IS_PTR(req)) {
        ln->wiring++; /* on_wired ends it */
    } else {
        lep->wire_status = UCS_PTR_STATUS(req); /* UCS_OK for NULL */
        ev_post(ln->ls, &lep->wired, EV_WIRED);
    }
}

/* Close a lane's endpoint e forcibly, on the lane's thread (or the loop's
 * once that thread is gone): what it carries ends at once, failed. */
static void ep_close_now(kvd__lane_t *ln, ucp_ep_h e)
{
    ucp_request_param_t rp;
    void *req;

    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                      UCP_OP_ATTR_FIELD_USER_DATA;
    rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    rp.cb.send = on_closed;
    rp.user_data = ln;
    req = ucp_ep_close_nbx(e, &rp);
    if (UCS_PTR_IS_PTR(req))
        ln->closing++; /* on_closed ends it */
}

/* On lane ln's thread (or the loop's once that thread is gone): do n. */
static void lane_do(kvd__lane_t *ln, kvd__lane_node_t *n)
{
    kvd__lane_op_t *op = (kvd__lane_op_t *)n; /* a send's or receive's: cmd is first */
    cmd_t *c = (cmd_t *)n;
    /* read first: a send or receive that ends at once is the loop's (and
     * may be freed there) before this returns */
    int kind = n->kind;
    ucp_request_param_t rp;
    void *req;

    memset(&rp, 0, sizeof(rp));
    switch (kind) {
    case KVD_LANE_SEND:
        if (op->lep->ep == NULL) {
            op_ended(op, UCS_ERR_NOT_CONNECTED, 0);
            break;
        }
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        rp.cb.send = on_sent;
        rp.user_data = op;
        req = ucp_am_send_nbx(op->lep->ep, AM_BLOCK, op->hdr, KVD_LANE_HDR * sizeof(uint64_t),
                              op->buf, op->len, &rp);
        if (req == NULL || UCS_PTR_IS_ERR(req))
            op_ended(op, req == NULL ? UCS_OK : UCS_PTR_STATUS(req), 0);
        else
            ln->outstanding++;
        break;
    case KVD_LANE_RECV:
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        rp.cb.recv_am = on_received;
        rp.user_data = op;
        req = ucp_am_recv_data_nbx(ln->rx, op->desc, op->buf, op->len, &rp);
        if (req == NULL || UCS_PTR_IS_ERR(req))
            op_ended(op, req == NULL ? UCS_OK : UCS_PTR_STATUS(req), req == NULL ? op->len : 0);
        else
            ln->outstanding++;
        break;
    case CMD_RELEASE:
        ucp_am_data_release(ln->rx, c->desc);
        break;
    case CMD_CONNECT: {
        /* from the tx worker only: the peer's rx worker never makes an
         * endpoint back, so these two workers are connected one way */
        ucp_ep_params_t pr;
        ucs_status_t st;
        memset(&pr, 0, sizeof(pr));
        pr.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        pr.address = (const ucp_address_t *)c->lep->addr;
        pr.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        pr.err_handler.cb = on_ep_error;
        pr.err_handler.arg = c->lep;
        if ((st = ucp_ep_create(ln->tx, &pr, &c->lep->ep)) != UCS_OK) {
            c->lep->ep = NULL;
            on_ep_error(c->lep, NULL, st);
            c->lep->wire_status = st;
            ev_post(ln->ls, &c->lep->wired, EV_WIRED); /* its sends fail, not wait */
        } else {
            ep_wire(ln, c->lep);
        }
        break;
    }
    case CMD_CLOSE:
        if (c->lep->ep != NULL) {
            ep_close_now(ln, c->lep->ep); /* the sends on it end at once, failed */
            c->lep->ep = NULL;
        }
        break;
    }
    if (kind >= CMD_RELEASE)
        free(c);
}

static unsigned lane_run_cmds(kvd__lane_t *ln)
{
    kvd__qnode_t *n, *next;
    unsigned count = 0;

    for (n = queue_take(&ln->cmds); n != NULL; n = next, count++) {
        next = n->next; /* before: a send or receive may be queued again, as an event */
        lane_do(ln, (kvd__lane_node_t *)n);
    }
    return count;
}

/* Progress both of ln's workers once; what moved. */
static unsigned lane_progress(kvd__lane_t *ln)
{
    return ucp_worker_progress(ln->rx) + ucp_worker_progress(ln->tx);
}

/* A lane's thread: its commands, then progress, polling while transfers
 * run, else sleeping on its workers' descriptors (a command signals tx). */
static void *lane_run(void *arg)
{
    kvd__lane_t *ln = arg;

    while (!atomic_load(&ln->stop)) {
        struct pollfd pf[2];
        unsigned n = lane_run_cmds(ln);
        n += lane_progress(ln);
        if (n > 0)
            continue;
        if (ln->outstanding > 0) {
            sched_yield(); /* the loop, which feeds it, may want this core */
            continue;
        }
        if (ucp_worker_arm(ln->rx) == UCS_ERR_BUSY || ucp_worker_arm(ln->tx) == UCS_ERR_BUSY)
            continue; /* events came meanwhile, or a command's signal */
        pf[0].fd = ln->rx_efd;
        pf[1].fd = ln->tx_efd;
        pf[0].events = pf[1].events = POLLIN;
        pf[0].revents = pf[1].revents = 0;
        (void)poll(pf, 2, 100);
    }
    return NULL;
}

/* A lane's thread: a block message came.  Eager bytes are copied (UCX
 * owns them only during the call), a rendezvous is kept for the loop to
 * receive or release. */
static ucs_status_t lane_on_block(void *arg, const void *header, size_t header_length,
                                  void *data, size_t length, const ucp_am_recv_param_t *param)
{
    kvd__lane_t *ln = arg;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    int bad = header_length != KVD_LANE_HDR * sizeof(uint64_t) || (!rndv && length > MAX_EAGER);
    arrival_t *a = malloc(sizeof(*a) + (rndv || bad ? 0 : length));

    if (a == NULL)
        return UCS_OK;
    a->lane = ln;
    a->bad = bad;
    memset(a->hdr, 0, sizeof(a->hdr));
    if (!bad)
        memcpy(a->hdr, header, sizeof(a->hdr));
    a->length = length;
    a->rndv = rndv && !bad;
    a->data = data;
    if (!rndv && !bad)
        memcpy(a->bytes, data, length);
    ev_post(ln->ls, &a->node, EV_ARRIVED);
    return a->rndv ? UCS_INPROGRESS : UCS_OK; /* a bad one: UCX keeps nothing of it */
}

/* ---- the loop's calls ----------------------------------------------------------- */

void kvd__lane_send(kvd__lane_ep_t *lep, kvd__lane_op_t *op, const uint64_t *hdr,
                    const void *data, size_t len)
{
    op->cmd.kind = KVD_LANE_SEND;
    op->lane = lep->lane;
    op->lep = lep;
    op->hdr = hdr;
    op->buf = (void *)data;
    op->len = len;
    if (lep->closed) {
        send_fail(op, UCS_ERR_NOT_CONNECTED);
    } else if (lep->group->failed != UCS_OK) {
        send_fail(op, lep->group->failed);
    } else if (lep->group->open) {
        lane_cmd(lep->lane, &op->cmd);
    } else { /* until the group is wired up */
        op->cmd.q.next = NULL;
        if (lep->group->held_tail != NULL)
            lep->group->held_tail->next = &op->cmd.q;
        else
            lep->group->held = &op->cmd.q;
        lep->group->held_tail = &op->cmd.q;
    }
}

void kvd__lane_recv(kvd__lane_t *ln, kvd__lane_op_t *op, void *rndv, void *buf, size_t len)
{
    op->cmd.kind = KVD_LANE_RECV;
    op->lane = ln;
    op->desc = rndv;
    op->buf = buf;
    op->len = len;
    lane_cmd(ln, &op->cmd);
}

void kvd__lane_release(kvd__lane_t *ln, void *rndv)
{
    lane_cmd_new(ln, CMD_RELEASE, NULL, rndv);
}

int kvd__lanes_address_ok(const kvd__lanes_t *ls, const uint8_t *addr, size_t len)
{
    const kvd__lane_t *own = ls->lane[0];

    return len > 0 && len <= KVD_LANE_ADDRESS_MAX &&
           kvd__cw_ucx_address_ok(addr, len, (const uint8_t *)own->address, own->address_len);
}

kvd__lane_ep_t *kvd__lane_connect(kvd__lanes_t *ls, uint32_t k, const uint8_t *addr, size_t len,
                                  kvd__lane_ep_t *group)
{
    kvd__lane_ep_t *lep = calloc(1, sizeof(*lep));

    if (lep == NULL || (lep->addr = calloc(1, len + ADDRESS_SLACK)) == NULL) {
        free(lep);
        return NULL;
    }
    memcpy(lep->addr, addr, len);
    lep->lane = ls->lane[k % ls->n];
    lep->all = ls->eps;
    ls->eps = lep;
    lep->group = group != NULL ? group : lep;
    lep->group->wiring++;
    lane_cmd_new(lep->lane, CMD_CONNECT, lep, NULL);
    return lep;
}

void kvd__lane_ep_close(kvd__lane_ep_t *lep)
{
    if (lep->closed)
        return;
    lep->closed = 1;
    /* what waits for the group's wireup never goes to UCX: lep may be
     * wiring up still, and its close would be all that ends such a send */
    group_fail(lep);
    lane_cmd_new(lep->lane, CMD_CLOSE, lep, NULL);
}

const uint8_t *kvd__lane_address(const kvd__lanes_t *ls, uint32_t k, size_t *len)
{
    *len = ls->lane[k]->address_len;
    return (const uint8_t *)ls->lane[k]->address;
}

uint32_t kvd__lane_index(const kvd__lanes_t *ls, const kvd__lane_t *ln)
{
    uint32_t k;

    for (k = 0; k < ls->n && ls->lane[k] != ln; k++)
        ;
    return k;
}

kvd__lane_t *kvd__lane_at(kvd__lanes_t *ls, uint32_t k)
{
    return ls->lane[k];
}

/* ---- start and stop --------------------------------------------------------------- */

/* Stop the lanes' threads (their workers stay, for the loop to finish). */
static void lanes_stop(kvd__lanes_t *ls)
{
    for (uint32_t k = 0; k < ls->n; k++) {
        kvd__lane_t *ln = ls->lane[k];
        if (ln == NULL || !ln->running)
            continue;
        atomic_store(&ln->stop, 1);
        ucp_worker_signal(ln->tx);
        pthread_join(ln->thread, NULL);
        ln->running = 0;
    }
}

/* With the threads stopped: do the lanes' last commands and progress
 * their workers from here until nothing moves, running what that hands
 * the loop. */
static void lanes_settle(kvd__lanes_t *ls)
{
    /* until every transfer and close has ended and handed back what it
     * held (the caches it names go right after), or 2 s have passed */
    for (uint64_t end = kvd__now_ns() + 2000000000ull; kvd__now_ns() < end;) {
        unsigned n = 0, held = 0;
        for (uint32_t k = 0; k < ls->n; k++) {
            kvd__lane_t *ln = ls->lane[k];
            if (ln == NULL || ln->rx == NULL || ln->tx == NULL)
                continue; /* one that failed to start: nothing on it */
            n += lane_run_cmds(ln);
            n += lane_progress(ln);
            held += ln->outstanding + ln->closing + ln->wiring;
        }
        n += ev_drain(ls);
        if (n == 0 && held == 0)
            break;
    }
}

void kvd__lanes_close(kvd__lanes_t *ls)
{
    lanes_stop(ls);
    lanes_settle(ls);
    if (atomic_load(&ls->ev_open)) {
        atomic_store(&ls->ev_open, 0); /* no thread left to post: lanes_stop joined them */
        uv_close((uv_handle_t *)&ls->ev_async, NULL);
    }
}

void kvd__lanes_free(kvd__lanes_t *ls)
{
    lanes_stop(ls);
    lanes_settle(ls);
    for (uint32_t k = 0; k < ls->n; k++) {
        kvd__lane_t *ln = ls->lane[k];
        if (ln == NULL)
            continue;
        for (kvd__qnode_t *n = queue_take(&ln->cmds), *next; n != NULL; n = next) {
            next = n->next; /* none left after lanes_settle; none run here */
            if (((kvd__lane_node_t *)n)->kind >= CMD_RELEASE)
                free(n);
        }
        if (ln->address != NULL)
            ucp_worker_release_address(ln->rx, ln->address);
        if (ln->tx != NULL)
            ucp_worker_destroy(ln->tx);
        if (ln->rx != NULL)
            ucp_worker_destroy(ln->rx);
        pthread_mutex_destroy(&ln->cmds.lock);
        free(ln);
        ls->lane[k] = NULL;
    }
    ls->n = 0;
    while (ls->eps != NULL) {
        kvd__lane_ep_t *lep = ls->eps;
        ls->eps = lep->all;
        free(lep->addr);
        free(lep);
    }
    if (ls->events_made) {
        ev_drain(ls);
        pthread_mutex_destroy(&ls->events.lock);
        ls->events_made = 0;
    }
}

/* A worker for one thread and its event descriptor. */
static ucs_status_t worker_make(ucp_context_h ctx, ucp_worker_h *w, int *efd)
{
    ucp_worker_params_t wp;
    ucs_status_t us;

    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if ((us = ucp_worker_create(ctx, &wp, w)) != UCS_OK) {
        *w = NULL;
        return us;
    }
    return ucp_worker_get_efd(*w, efd);
}

/* Lane ln's workers, the handler of blocks on rx, and rx's address,
 * which must be one this daemon can check when a peer sends its own. */
static kvd_status_t lane_make(ucp_context_h ctx, kvd__lane_t *ln, char *why, size_t why_len)
{
    ucp_am_handler_param_t hp;
    ucs_status_t us;

    if ((us = worker_make(ctx, &ln->rx, &ln->rx_efd)) != UCS_OK ||
        (us = worker_make(ctx, &ln->tx, &ln->tx_efd)) != UCS_OK)
        goto fail;
    memset(&hp, 0, sizeof(hp));
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = AM_BLOCK;
    hp.cb = lane_on_block;
    hp.arg = ln;
    if ((us = ucp_worker_set_am_recv_handler(ln->rx, &hp)) != UCS_OK ||
        (us = ucp_worker_get_address(ln->rx, &ln->address, &ln->address_len)) != UCS_OK) {
        ln->address = NULL;
        goto fail;
    }
    if (ln->address_len > KVD_LANE_ADDRESS_MAX ||
        !kvd__cw_ucx_address_ok((const uint8_t *)ln->address, ln->address_len,
                                (const uint8_t *)ln->address, ln->address_len)) {
        snprintf(why, why_len, "UCX packs its worker addresses in a form kvdockd cannot check "
                 "(UCX_UNIFIED_MODE=y, or a UCX other than 1.13's address format)");
        return KVD_EINVAL;
    }
    return KVD_OK;
fail:
    snprintf(why, why_len, "UCX lane worker: %s", ucs_status_string(us));
    return KVD_EIO;
}

kvd_status_t kvd__lanes_start(kvd__lanes_t *ls, kvd__server_t *srv, ucp_context_h ctx, uint32_t n,
                              const kvd__lane_up_t *up, char *why, size_t why_len)
{
    kvd_status_t st;

    memset(ls, 0, sizeof(*ls));
    ls->srv = srv;
    ls->up = *up;
    pthread_mutex_init(&ls->events.lock, NULL);
    ls->events_made = 1;
    if (n > KVD_LANES_MAX)
        n = KVD_LANES_MAX;
    for (ls->n = 0; ls->n < n; ls->n++) {
        kvd__lane_t *ln = calloc(1, sizeof(*ln));
        if (ln == NULL) {
            snprintf(why, why_len, "out of memory");
            kvd__lanes_free(ls);
            return KVD_ENOMEM;
        }
        ls->lane[ls->n] = ln;
        ln->ls = ls;
        pthread_mutex_init(&ln->cmds.lock, NULL);
        if ((st = lane_make(ctx, ln, why, why_len)) != KVD_OK) {
            ls->n++; /* freed below */
            kvd__lanes_free(ls);
            return st;
        }
        if (pthread_create(&ln->thread, NULL, lane_run, ln) != 0) {
            ls->n++;
            snprintf(why, why_len, "cannot start a lane's thread");
            kvd__lanes_free(ls);
            return KVD_ENOMEM;
        }
        ln->running = 1;
    }
    uv_async_init(srv->loop, &ls->ev_async, on_events);
    ls->ev_async.data = ls;
    atomic_store(&ls->ev_open, 1);
    uv_async_send(&ls->ev_async); /* anything queued before it opened */
    return KVD_OK;
}
