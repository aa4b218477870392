/*
 * The cluster's glue with the daemon's loop (cluster.h says what the
 * cluster does; docs/design/cluster.md has the table of which file does
 * which job).  The layers, bottom up: wire.c and config.c (bytes and
 * settings), lane.c (UCX lanes), link.c and door.c (the TCP links and
 * the front door), serve.c and pull.c (answering peers, asking them).
 * Each reports upward only through the callbacks it was given; this file
 * gives them: lane and link news go to serving and pulls from here, and
 * the tick drives the deadlines of each.
 */
#include "cluster.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include "caches.h"
#include "cluster.pb-c.h"
#include "config.h"
#include "dispatch.h"
#include "door.h"
#include "lane.h"
#include "link.h"
#include "log.h"
#include "pull.h"
#include "serve.h"
#include "server.h"

static const char *const peer_state_name[] = {"down", "connecting", "up", "refused"};

struct kvd__cluster {
    kvd__server_t *srv;
    ucp_context_h ctx;
    kvd__cl_config_t cfg;
    kvd__lanes_t lanes;
    kvd__links_t links;
    kvd__serve_t serve;
    kvd__pulls_t pulls;
    uv_timer_t tick;
    int closing;
};

/* ---- what the layers hand up ------------------------------------------------------ */

static void lane_ended(void *up, kvd__lane_op_t *op)
{
    kvd__cluster_t *cl = up;

    if (op->cmd.kind == KVD_LANE_SEND)
        kvd__serve_sent(&cl->serve, op);
    else
        kvd__pull_received(&cl->pulls, op);
}

static void lane_arrived(void *up, kvd__lane_t *ln, const uint64_t hdr[KVD_LANE_HDR],
                         const void *bytes, void *rndv, size_t length)
{
    kvd__cluster_t *cl = up;

    kvd__pull_arrived(&cl->pulls, ln, hdr, bytes, rndv, length);
}

/* An endpoint to a peer's lane failed: drop the link it belongs to (the
 * peer connects again; its pulls from us end with what they got). */
static void lane_ep_failed(void *up, kvd__lane_ep_t *lep, ucs_status_t status)
{
    kvd__cluster_t *cl = up;
    uint32_t k = 0;
    kvd__link_t *l = kvd__link_of_lane_ep(&cl->links, lep, &k);
    char why[160];

    if (l != NULL) {
        snprintf(why, sizeof(why), "lane %u failed: %s", k, ucs_status_string(status));
        kvd__link_drop(l, why);
    }
}

static void link_msg(void *up, kvd__link_t *l, const Kvdock__Cluster__Msg *m)
{
    kvd__cluster_t *cl = up;

    switch (m->m_case) {
    case KVDOCK__CLUSTER__MSG__M_QUERY:
        kvd__serve_query(&cl->serve, l, m->query);
        return;
    case KVDOCK__CLUSTER__MSG__M_FETCH:
        kvd__serve_fetch(&cl->serve, l, m->fetch);
        return;
    case KVDOCK__CLUSTER__MSG__M_QUERY_REPLY:
        kvd__pull_query_reply(&cl->pulls, l, m->query_reply);
        return;
    case KVDOCK__CLUSTER__MSG__M_FETCH_DONE:
        kvd__pull_fetch_done(&cl->pulls, l, m->fetch_done);
        return;
    default:
        return;
    }
}

static void link_lost(void *up, uint32_t i, const char *why)
{
    kvd__cluster_t *cl = up;

    kvd__pull_peer_lost(&cl->pulls, i, why);
}

static void on_tick(uv_timer_t *t)
{
    kvd__cluster_t *cl = t->data;
    uint64_t now = kvd__now_ns();

    kvd__door_tick(&cl->links, now);
    kvd__pull_tick(&cl->pulls, now);
}

/* ---- set up and tear down ------------------------------------------------------- */

/* --cluster-lanes, or by the CPUs: each lane's thread polls a core while
 * blocks move, on both sides of a pull, and pulls share a node with the
 * engine's own threads. */
static uint32_t lanes_wanted(const kvd__options_t *o)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);

    if (o->cluster_lanes > 0)
        return (uint32_t)o->cluster_lanes;
    return cpus >= 16 ? 4 : cpus >= 8 ? 2 : 1;
}

kvd_status_t kvd__cluster_create(kvd__server_t *srv, kvd__cluster_t **out, char *why,
                                 size_t why_len)
{
    const kvd__options_t *o = &srv->opts;
    kvd__cluster_t *cl = calloc(1, sizeof(*cl));
    kvd__lane_up_t lup = {.ended = lane_ended, .arrived = lane_arrived,
                         .ep_failed = lane_ep_failed};
    kvd__link_up_t kup = {.msg = link_msg, .lost = link_lost};
    ucp_params_t up;
    ucp_config_t *cfg = NULL;
    ucs_status_t us;
    kvd_status_t st;
    int fd;

    if (cl == NULL)
        return KVD_ENOMEM;
    cl->srv = srv;
    if ((st = kvd__clc_read(&cl->cfg, o, why, why_len)) != KVD_OK) {
        free(cl);
        return st;
    }
    lup.up = kup.up = cl;
    kvd__links_init(&cl->links, srv, &cl->cfg, &cl->lanes, &kup);
    if ((fd = kvd__door_socket(&cl->links)) < 0) {
        snprintf(why, why_len, "cluster-listen %s: cannot listen there: %s", cl->cfg.node,
                 strerror(-fd));
        free(cl);
        return KVD_EIO;
    }
    memset(&up, 0, sizeof(up));
    up.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    up.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    up.mt_workers_shared = 1; /* the lanes' workers run on threads of their own */
    /* an endpoint's wireup as it is made, not at its first send: the lanes
     * wait for it before a pull (lane.h says why) */
    if ((us = ucp_config_read(NULL, NULL, &cfg)) != UCS_OK ||
        (us = ucp_config_modify(cfg, "RESOLVE_REMOTE_EP_ID", "y")) != UCS_OK ||
        (us = ucp_init(&up, cfg, &cl->ctx)) != UCS_OK) {
        if (cfg)
            ucp_config_release(cfg);
        snprintf(why, why_len, "UCX: %s", ucs_status_string(us));
        st = KVD_EIO;
        goto fail;
    }
    ucp_config_release(cfg);
    if ((st = kvd__lanes_start(&cl->lanes, srv, cl->ctx, lanes_wanted(o), &lup, why,
                               why_len)) != KVD_OK) {
        ucp_cleanup(cl->ctx);
        goto fail;
    }
    kvd__door_open(&cl->links, fd);
    cl->serve.srv = srv;
    cl->pulls.srv = srv;
    cl->pulls.links = &cl->links;
    cl->pulls.lanes = &cl->lanes;
    cl->pulls.deadline_ns = cl->cfg.deadline_ns;
    cl->pulls.next_id = 1;
    uv_timer_init(srv->loop, &cl->tick);
    cl->tick.data = cl;
    {
        uint64_t ms = o->cluster_deadline_ms / 4;
        ms = ms < 5 ? 5 : ms > 100 ? 100 : ms;
        uv_timer_start(&cl->tick, on_tick, 0, ms);
    }
    kvd_log(KVD_LOG_INFO, "event=cluster_listen node=%s peers=%u lanes=%u deadline_ms=%" PRIu64,
            cl->cfg.node, cl->links.npeers, cl->lanes.n, o->cluster_deadline_ms);
    *out = cl;
    return KVD_OK;

fail:
    close(fd);
    free(cl);
    return st;
}

void kvd__cluster_close(kvd__cluster_t *cl)
{
    if (cl == NULL || cl->closing)
        return;
    cl->closing = 1;
    kvd__pull_close(&cl->pulls);   /* asks end with what came */
    kvd__door_close(&cl->links);   /* links, their lane endpoints, the listener */
    kvd__lanes_close(&cl->lanes);  /* what the workers still hold ends here */
    uv_close((uv_handle_t *)&cl->tick, NULL);
}

void kvd__cluster_destroy(kvd__cluster_t **clp)
{
    kvd__cluster_t *cl = clp ? *clp : NULL;

    if (cl == NULL)
        return;
    if (!cl->closing)
        kvd__cluster_close(cl);
    kvd__lanes_free(&cl->lanes);
    ucp_cleanup(cl->ctx);
    free(cl);
    *clp = NULL;
}

kvd_status_t kvd__cluster_ask(kvd__cluster_t *cl, const kvd__cluster_ask_t *a, char *why,
                              size_t why_len)
{
    return kvd__pull_ask(&cl->pulls, a, why, why_len);
}

uint32_t kvd__cluster_live(const kvd__cluster_t *cl)
{
    uint32_t n = 0;

    for (uint32_t i = 0; cl != NULL && i < cl->links.npeers; i++)
        n += cl->links.peers[i].state == KVD_PEER_UP;
    return n;
}

Kvdock__Cluster *kvd__cluster_status(kvd__req_t *r, const kvd__cluster_t *cl)
{
    Kvdock__Cluster *c = kvd__req_alloc(r, sizeof(*c));
    kvd__cluster_totals_t t;
    uint64_t now = kvd__now_ns();

    if (c == NULL)
        return NULL;
    kvd__cluster_get_totals(cl, &t);
    kvdock__cluster__init(c);
    c->node = (char *)cl->cfg.node;
    c->deadline_ms = (uint32_t)(cl->cfg.deadline_ns / 1000000);
    c->inbound = t.inbound;
    c->blocks_fetched = t.blocks_fetched;
    c->bytes_fetched = t.bytes_fetched;
    c->blocks_served = t.blocks_served;
    c->bytes_served = t.bytes_served;
    c->refused = t.refused;
    c->peers = kvd__req_alloc(r, sizeof(*c->peers) * (cl->links.npeers ? cl->links.npeers : 1));
    if (c->peers == NULL)
        return NULL;
    for (uint32_t i = 0; i < cl->links.npeers; i++) {
        const kvd__peer_t *p = &cl->links.peers[i];
        Kvdock__ClusterPeer *cp = kvd__req_alloc(r, sizeof(*cp));
        if (cp == NULL)
            return NULL;
        kvdock__cluster_peer__init(cp);
        cp->address = (char *)p->addr;
        cp->state = (char *)peer_state_name[p->state];
        cp->error = (char *)p->error;
        cp->rtt_us = p->rtt_ns / 1000;
        cp->since_ms = kvd__cl_since(now, p->since_ns) / 1000000;
        cp->queries = p->queries;
        cp->blocks_fetched = p->blocks_fetched;
        cp->bytes_fetched = p->bytes_fetched;
        cp->failures = p->failures;
        c->peers[c->n_peers++] = cp;
    }
    return c;
}

void kvd__cluster_get_totals(const kvd__cluster_t *cl, kvd__cluster_totals_t *t)
{
    memset(t, 0, sizeof(*t));
    t->blocks_fetched = cl->pulls.blocks_fetched;
    t->bytes_fetched = cl->pulls.bytes_fetched;
    t->blocks_served = cl->serve.blocks_served;
    t->bytes_served = cl->serve.bytes_served;
    t->refused = cl->links.refused;
    t->blocks_dropped = cl->pulls.stray + cl->lanes.stray;
    for (const kvd__link_t *l = cl->links.links; l; l = l->next) {
        t->inbound += !l->outbound && l->authed;
        t->unproven += !l->outbound && !l->authed;
    }
}

uint32_t kvd__cluster_peers(const kvd__cluster_t *cl)
{
    return cl ? cl->links.npeers : 0;
}

const char *kvd__cluster_peer(const kvd__cluster_t *cl, uint32_t i, int *up, uint64_t *rtt_us,
                              uint64_t *failures, uint64_t *bytes_fetched)
{
    const kvd__peer_t *p = &cl->links.peers[i];

    *up = p->state == KVD_PEER_UP;
    *rtt_us = p->rtt_ns / 1000;
    *failures = p->failures;
    *bytes_fetched = p->bytes_fetched;
    return p->addr;
}
