/* The cluster's links and the peers' state: see link.h. */
#include "link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frames.h"
#include "server.h"

#define MAX_WRITE_QUEUE (64ull << 20) /* unsent bytes to a peer that does not read */
#define BACKOFF_MIN_MS 100u
#define BACKOFF_MAX_MS 5000u

/* A control message on its way: the frame lives until its write ends. */
typedef struct wreq {
    uv_write_t req;
    uint8_t frame[];
} wreq_t;

static void on_written(uv_write_t *req, int status)
{
    (void)status; /* a failed write shows as a read error or EOF on the link */
    free(req);
}

/* Frame m and queue it on l (0), or -1 (l closed, no memory, or l reads
 * nothing of what it is sent: then it is marked stalled and goes at the
 * next tick). */
int kvd__link_send(kvd__link_t *l, const Kvdock__Cluster__Msg *m)
{
    size_t len = kvdock__cluster__msg__get_packed_size(m);
    wreq_t *w;
    uv_buf_t b;

    if (l->closed || len == 0 || len > KVD_LINK_MAX_CTRL)
        return -1;
    if (uv_stream_get_write_queue_size((uv_stream_t *)&l->tcp) > MAX_WRITE_QUEUE) {
        l->stalled = 1;
        return -1;
    }
    if ((w = malloc(sizeof(*w) + KVD_CW_HEADER + len)) == NULL)
        return -1;
    kvd__cw_header(w->frame, (uint32_t)len);
    kvdock__cluster__msg__pack(m, w->frame + KVD_CW_HEADER);
    b = uv_buf_init((char *)w->frame, (unsigned)(KVD_CW_HEADER + len));
    if (uv_write(&w->req, (uv_stream_t *)&l->tcp, &b, 1, on_written) != 0) {
        free(w);
        return -1;
    }
    return 0;
}

void kvd__peer_set(kvd__peer_t *p, int state, const char *why)
{
    if (p->state != state) {
        if (state == KVD_PEER_UP)
            kvd_log(KVD_LOG_INFO, "event=cluster_peer_up peer=%s", p->addr);
        else if (p->state == KVD_PEER_UP)
            kvd_log(KVD_LOG_WARN, "event=cluster_peer_down peer=%s reason=\"%s\"", p->addr,
                    why ? why : "");
        p->since_ns = kvd__now_ns();
    }
    p->state = state;
    if (why != NULL)
        snprintf(p->error, sizeof(p->error), "%s", why);
    else if (state == KVD_PEER_UP)
        p->error[0] = '\0';
}

/* Take l out of the links (nothing it sends is read from now on) and
 * settle its peer's state. */
static void link_forget(kvd__links_t *ls, kvd__link_t *l, const char *why)
{
    kvd__link_t **pp;

    for (pp = &ls->links; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    l->next = NULL;
    if (!l->outbound && ls->ninbound > 0)
        ls->ninbound--;
    if (l->outbound && l->peer != NULL) {
        kvd__peer_t *p = l->peer;
        uint32_t idx = (uint32_t)(p - ls->peers);
        p->link = NULL;
        l->peer = NULL;
        if (p->state == KVD_PEER_UP)
            p->failures++;
        if (p->state != KVD_PEER_REFUSED)
            kvd__peer_set(p, KVD_PEER_DOWN, why);
        p->next_try_ns = kvd__now_ns() + (uint64_t)p->backoff_ms * 1000000ull;
        p->backoff_ms = p->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : p->backoff_ms * 2;
        ls->up.lost(ls->up.up, idx, why);
    }
}

static void on_link_closed(uv_handle_t *h)
{
    kvd__link_t *l = h->data;

    free(l->rx);
    free(l);
}

/* Close a forgotten link: its connection (freed once closed) and its
 * lane endpoints, forcibly (the sends on them end at once, failed: a
 * flushing close would wait on the other side). */
static void link_close(kvd__link_t *l)
{
    for (uint32_t k = 0; k < l->nlanes; k++)
        kvd__lane_ep_close(l->lane_ep[k]);
    l->nlanes = 0;
    if (!l->closed) {
        l->closed = 1;
        uv_close((uv_handle_t *)&l->tcp, on_link_closed);
    }
}

void kvd__link_drop(kvd__link_t *l, const char *why)
{
    link_forget(l->ls, l, why);
    link_close(l);
}

/* A link with its handle made (freed by link_close from now on), at the
 * head of the links. */
kvd__link_t *kvd__link_new(kvd__links_t *ls, int outbound)
{
    kvd__link_t *l = calloc(1, sizeof(*l));

    if (l == NULL)
        return NULL;
    l->ls = ls;
    l->outbound = outbound;
    l->opened_ns = kvd__now_ns();
    uv_tcp_init(ls->srv->loop, &l->tcp);
    l->tcp.data = l;
    l->next = ls->links;
    ls->links = l;
    return l;
}

void kvd__links_init(kvd__links_t *ls, kvd__server_t *srv, const kvd__cl_config_t *cfg,
                     kvd__lanes_t *lanes, const kvd__link_up_t *up)
{
    ls->srv = srv;
    ls->cfg = cfg;
    ls->lanes = lanes;
    ls->up = *up;
    for (uint32_t i = 0; i < cfg->npeers; i++) {
        kvd__peer_t *p = &ls->peers[ls->npeers++];
        snprintf(p->addr, sizeof(p->addr), "%s", cfg->peers[i].text);
        p->sa = cfg->peers[i].sa;
        p->salen = cfg->peers[i].salen;
        p->state = KVD_PEER_DOWN;
        p->backoff_ms = BACKOFF_MIN_MS;
        p->since_ns = kvd__now_ns();
        snprintf(p->error, sizeof(p->error), "not connected yet");
    }
}

kvd__link_t *kvd__link_of_lane_ep(kvd__links_t *ls, const kvd__lane_ep_t *lep, uint32_t *k)
{
    for (kvd__link_t *l = ls->links; l != NULL; l = l->next) {
        for (*k = 0; *k < l->nlanes && l->lane_ep[*k] != lep; (*k)++) {
        }
        if (*k < l->nlanes && !l->closed)
            return l;
    }
    return NULL;
}
