/* Session operations: hello, ping, status, stats, shutdown. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "caches.h"
#include "cluster.h"
#include "dispatch.h"
#include "log.h"
#include "metrics.h"

kvd_status_t kvd__op_hello(kvd__req_t *r)
{
    const Kvdock__Hello *h = r->req->hello;
    kvd__conn_t *c = r->conn;
    kvd__server_t *srv = r->srv;
    const kvd__options_t *o = &srv->opts;
    Kvdock__HelloReply *rep = kvd__req_alloc(r, sizeof(*rep));
    Kvdock__Limits *lim = kvd__req_alloc(r, sizeof(*lim));
    char name[96];

    if (rep == NULL || lim == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    kvdock__hello_reply__init(rep);
    kvdock__limits__init(lim);
    lim->max_frame_bytes = o->max_frame_bytes;
    lim->max_inflight = (uint32_t)o->max_inflight;
    lim->max_pools = (uint32_t)o->max_pools;
    lim->max_pool_bytes = o->max_pool_bytes;
    lim->max_total_pool_bytes = o->max_total_pool_bytes;
    lim->max_inline_bytes = (uint32_t)o->max_inline_bytes;
    lim->max_total_pools = (uint32_t)o->max_total_pools;
    lim->max_buffers = (uint32_t)o->max_buffers;
    lim->host_memory_budget = srv->hostmem.budget;
    lim->hello_timeout_ms = o->hello_timeout_ms;
    lim->frame_timeout_ms = o->frame_timeout_ms;
    rep->protocol_version = KVD_PROTOCOL_VERSION;
    rep->daemon_version = (char *)KVD_DAEMON_VERSION;
    rep->backend = (Kvdock__Backend)srv->backend->proto_backend;
    rep->device_name = srv->backend->device_name;
    rep->device_ordinal = srv->backend->device_ordinal;
    rep->limits = lim;
    rep->client_id = c->id;
    rep->daemon_pid = (uint32_t)getpid();
    rep->admin = c->admin;
    /* the reply carries the daemon's version even when refusing */
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_HELLO;
    r->resp.hello = rep;

    if (c->hello_done)
        return kvd__req_fail(r, KVD_EPROTO, "hello was already done on this connection");
    if (h->protocol_version != KVD_PROTOCOL_VERSION) {
        r->close_after = 1;
        kvd_log(KVD_LOG_WARN, "event=version_mismatch client=%" PRIu64 " theirs=%u ours=%u",
                c->id, h->protocol_version, KVD_PROTOCOL_VERSION);
        return kvd__req_fail(r, KVD_EVERSION,
                         "protocol version %u is not supported: this daemon speaks version %u",
                         h->protocol_version, KVD_PROTOCOL_VERSION);
    }
    if (strlen(h->client_name) >= sizeof(c->name))
        return kvd__req_fail(r, KVD_EINVAL, "client_name is longer than %zu bytes",
                         sizeof(c->name) - 1);
    if (!kvd__text_valid(h->client_name))
        return kvd__req_fail(r, KVD_EINVAL, "client_name holds a control character");
    snprintf(c->name, sizeof(c->name), "%s", h->client_name);
    c->hello_done = 1;
    kvd__conn_hello_done(c);
    kvd_log(KVD_LOG_INFO, "event=hello client=%" PRIu64 " name=%s", c->id,
            kvd__log_quote(c->name, name, sizeof(name)));
    return KVD_OK;
}

kvd_status_t kvd__op_ping(kvd__req_t *r)
{
    Kvdock__Pong *p = kvd__req_alloc(r, sizeof(*p));

    if (p == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    kvdock__pong__init(p);
    p->payload = r->req->ping->payload; /* lives until the reply is packed */
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_PONG;
    r->resp.pong = p;
    return KVD_OK;
}

/* The host-memory budget and its use by kind; device memory on cuda. */
static kvd_status_t fill_memory(kvd__req_t *r, Kvdock__StatusReply *s)
{
    kvd__server_t *srv = r->srv;
    const kvd__hostmem_t *hm = &srv->hostmem;
    Kvdock__HostMemory *h = kvd__req_alloc(r, sizeof(*h));
    uint64_t total = 0, avail = 0;
    int k;

    if (h == NULL)
        return KVD_ENOMEM;
    kvdock__host_memory__init(h);
    h->budget = hm->budget;
    h->used = hm->total;
    h->cache_budgets = kvd__caches_budgets(srv);
    if (kvd__sysmem(&total, &avail) == 0) {
        h->available = avail;
        h->machine = total;
    }
    h->kinds = kvd__req_alloc(r, sizeof(*h->kinds) * KVD_HM_COUNT);
    if (h->kinds == NULL)
        return KVD_ENOMEM;
    for (k = 0; k < KVD_HM_COUNT; k++) {
        Kvdock__MemoryUse *u = kvd__req_alloc(r, sizeof(*u));
        if (u == NULL)
            return KVD_ENOMEM;
        kvdock__memory_use__init(u);
        u->kind = (char *)kvd__hostmem_kind_name(k);
        u->used = hm->used[k];
        u->limit = hm->cap[k];
        u->refused = hm->refused[k];
        h->kinds[h->n_kinds++] = u;
    }
    s->host_memory = h;
    if (srv->backend->device_memory != NULL &&
        srv->backend->device_memory(srv->backend, &s->device_memory_free,
                                    &s->device_memory_total) == KVD_OK)
        s->device_memory_margin = srv->opts.device_memory_margin;
    return KVD_OK;
}

/* Each stream class's default path. */
static kvd_status_t fill_paths(kvd__req_t *r, Kvdock__StatusReply *s)
{
    int i;

    s->stream_paths = kvd__req_alloc(r, sizeof(*s->stream_paths) * KVD_STREAM_END);
    if (s->stream_paths == NULL)
        return KVD_ENOMEM;
    for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++) {
        Kvdock__StreamPath *p = kvd__req_alloc(r, sizeof(*p));
        if (p == NULL)
            return KVD_ENOMEM;
        kvdock__stream_path__init(p);
        p->stream = (Kvdock__StreamClass)i;
        p->path = (Kvdock__CopyPath)kvd__stream_path(&r->srv->opts, i);
        s->stream_paths[s->n_stream_paths++] = p;
    }
    return KVD_OK;
}

kvd_status_t kvd__op_status(kvd__req_t *r)
{
    kvd__server_t *srv = r->srv;
    Kvdock__StatusReply *s = kvd__req_alloc(r, sizeof(*s));
    kvd__conn_t *c;
    size_t n = 0;

    if (s == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    kvdock__status_reply__init(s);
    s->daemon_version = (char *)KVD_DAEMON_VERSION;
    s->backend = (Kvdock__Backend)srv->backend->proto_backend;
    s->device_name = srv->backend->device_name;
    s->uptime_ms = (kvd__now_ns() - srv->start_ns) / 1000000ull;
    s->pools = srv->reg.npools;
    s->pool_bytes = srv->reg.live_bytes;
    s->buffers = srv->reg.nbuffers;
    s->events = srv->reg.nevents;
    s->inflight = srv->inflight;
    s->socket_path = srv->socket_path;
    s->metrics_address = (char *)kvd__metrics_address(srv->metrics);
    s->shutting_down = srv->shutting_down != 0;
    if (fill_memory(r, s) != KVD_OK || fill_paths(r, s) != KVD_OK ||
        (srv->cluster != NULL && (s->cluster = kvd__cluster_status(r, srv->cluster)) == NULL) ||
        (srv->disk_io != NULL && (s->disk = kvd__disk_status(r)) == NULL))
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    for (c = srv->conns; c; c = c->next)
        if (!c->closing)
            n++;
    s->clients = (uint32_t)n;
    /* admins see every client; others see themselves */
    s->client_list = kvd__req_alloc(r, sizeof(*s->client_list) * (n ? n : 1));
    if (s->client_list == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    for (c = srv->conns; c; c = c->next) {
        Kvdock__ClientInfo *ci;
        if (c->closing || (!r->conn->admin && c != r->conn))
            continue;
        ci = kvd__req_alloc(r, sizeof(*ci));
        if (ci == NULL)
            return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
        kvdock__client_info__init(ci);
        ci->id = c->id;
        ci->name = c->name;
        ci->pid = (uint32_t)c->pid;
        ci->uid = (uint32_t)c->uid;
        ci->inflight = c->inflight;
        ci->pools = c->owner.pools;
        ci->requests = c->requests;
        s->client_list[s->n_client_list++] = ci;
    }
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_STATUS_REPLY;
    r->resp.status_reply = s;
    return KVD_OK;
}

kvd_status_t kvd__op_stats(kvd__req_t *r)
{
    kvd__server_t *srv = r->srv;
    Kvdock__StatsReply *s = kvd__req_alloc(r, sizeof(*s));
    uint64_t now = kvd__now_ns();
    size_t i, nops = srv->stats.nops;

    if (s == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    kvdock__stats_reply__init(s);
    s->ops = kvd__req_alloc(r, sizeof(*s->ops) * nops);
    s->streams = kvd__req_alloc(r, sizeof(*s->streams) * KVD_STREAM_END);
    if (s->ops == NULL || s->streams == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    for (i = 0; i < nops; i++) {
        const kvd__op_counters_t *k = &srv->stats.ops[i];
        Kvdock__OpStats *o = kvd__req_alloc(r, sizeof(*o));
        if (o == NULL)
            return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
        kvdock__op_stats__init(o);
        o->op = (char *)kvd__op_row_name(i);
        o->requests = k->requests;
        o->errors = k->errors;
        o->bytes = k->bytes;
        o->n_bounds_us = KVD_HIST_BOUNDS;
        o->bounds_us = (double *)kvd__hist_bounds_us;
        o->n_counts = KVD_HIST_BOUNDS + 1;
        o->counts = (uint64_t *)k->counts;
        o->sum_us = k->sum_us;
        s->ops[s->n_ops++] = o;
    }
    for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++) {
        const kvd__stream_counters_t *k = &srv->stats.streams[i];
        Kvdock__StreamStats *t = kvd__req_alloc(r, sizeof(*t));
        if (t == NULL)
            return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
        kvdock__stream_stats__init(t);
        t->name = (char *)kvd__stream_class_name((int)i);
        t->priority = srv->backend->priority[i];
        t->max_blocks = srv->backend->blocks[i];
        t->launches = k->launches;
        t->bytes = k->bytes;
        t->busy_ns = kvd__stats_stream_busy(&srv->stats, (int)i, now);
        t->queue_depth = k->depth;
        t->path = (Kvdock__CopyPath)kvd__stream_path(&srv->opts, (int)i);
        t->copy_engine_launches = k->copy_engine_launches;
        s->streams[s->n_streams++] = t;
    }
    s->bytes_in = srv->stats.bytes_in;
    s->bytes_out = srv->stats.bytes_out;
    s->connections = srv->stats.connections;
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_STATS;
    r->resp.stats = s;
    return KVD_OK;
}

kvd_status_t kvd__op_shutdown(kvd__req_t *r)
{
    /* the reply goes out first: the drain answers everything else */
    kvd__conn_t *c = r->conn;
    kvd__origin_t origin = kvd__origin_of(r);

    kvd__reply_deferred(&origin, KVD_OK, NULL, NULL, 0);
    r->deferred = 1; /* answered above */
    kvd_log(KVD_LOG_INFO, "event=shutdown_request client=%" PRIu64 " drain=%d", c->id,
            r->req->shutdown->drain);
    kvd__server_begin_shutdown(r->srv, r->req->shutdown->drain, "shutdown request");
    return KVD_OK;
}
