/*
 * Client lifecycle: connect, hello, the session's accessors, and the
 * session operations (ping, status, stats, shutdown).
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HELLO_TIMEOUT_MS 30000

const char *kvd_backend_name(int backend)
{
    switch (backend) {
    case KVD_BACKEND_CPU: return "cpu";
    case KVD_BACKEND_CUDA: return "cuda";
    default: return "unknown";
    }
}

bool kvd_client_has_cuda(void)
{
#ifdef KVD_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

/* ------------------------------------------------------------------------ */
/* Connect and hello                                                         */

static kvd_status_t hello_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    const Kvdock__HelloReply *h =
        p->resp->result_case == KVDOCK__RESPONSE__RESULT_HELLO ? p->resp->hello : NULL;
    kvd_hello_info_t *i = &cli->info;

    if (h == NULL)
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered hello without a HelloReply");
    if (h->protocol_version != KVD_PROTOCOL_VERSION)
        return kvd__client_fail(cli, KVD_EVERSION,
                                "protocol version mismatch: this client speaks %u, kvdockd %u",
                                KVD_PROTOCOL_VERSION, h->protocol_version);
    i->protocol_version = h->protocol_version;
    kvd__copy_str(i->daemon_version, sizeof(i->daemon_version), h->daemon_version);
    i->backend = (int32_t)h->backend;
    kvd__copy_str(i->device_name, sizeof(i->device_name), h->device_name);
    i->device_ordinal = h->device_ordinal;
    if (h->limits != NULL) {
        i->limits.max_frame_bytes = h->limits->max_frame_bytes;
        i->limits.max_inflight = h->limits->max_inflight;
        i->limits.max_pools = h->limits->max_pools;
        i->limits.max_pool_bytes = h->limits->max_pool_bytes;
        i->limits.max_total_pool_bytes = h->limits->max_total_pool_bytes;
        i->limits.max_inline_bytes = h->limits->max_inline_bytes;
    }
    i->client_id = h->client_id;
    i->daemon_pid = h->daemon_pid;
    i->admin = h->admin != 0;
    return KVD_OK;
}

/* $KVDOCK_SPIN_US if it is a number in range, else the default. */
static uint32_t default_spin_us(void)
{
    const char *e = getenv("KVDOCK_SPIN_US");
    char *end;
    unsigned long v;

    if (e == NULL || *e == '\0')
        return KVD_CLIENT_SPIN_US_DEFAULT;
    errno = 0;
    v = strtoul(e, &end, 10);
    if (errno != 0 || *end != '\0' || v > KVD_CLIENT_SPIN_US_MAX)
        return KVD_CLIENT_SPIN_US_DEFAULT;
    return (uint32_t)v;
}

/*
 * Where a default socket path came from, for the message of a failed
 * connect: the user who set nothing learns the order that was followed.
 */
static const char *default_path_origin(const char *path)
{
    const char *env = getenv("KVDOCK_SOCKET");

    if (env != NULL && env[0] != '\0')
        return "The path is $KVDOCK_SOCKET's.";
    if (strcmp(path, KVD_SYSTEM_SOCKET) == 0)
        return "The path is the system service's, as $KVDOCK_SOCKET is unset.";
    return "With no socket path given, a client tries $KVDOCK_SOCKET (unset), then " KVD_SYSTEM_SOCKET
           " (absent), then this per-user path.";
}

/* KVD_ECONN with what is at path and, for a default path, where it came from. */
static kvd_status_t connect_failed(const char *path, int e, int defaulted)
{
    const char *origin = defaulted ? default_path_origin(path) : "";
    const char *sep = defaulted ? " " : "";
    char what[384]; /* the longest: a directory message with a sun_path */
    struct stat stb;

    if (stat(path, &stb) == 0 && S_ISDIR(stb.st_mode))
        snprintf(what, sizeof(what), "it is a directory, not the daemon's socket (that is a file "
                 "in it, such as %s/kvdockd.sock).", path);
    else if (stat(path, &stb) == 0 && !S_ISSOCK(stb.st_mode))
        snprintf(what, sizeof(what), "it is not a socket.");
    else if (e == ENOENT || e == ECONNREFUSED)
        snprintf(what, sizeof(what), "%s. Is the daemon running?", strerror(e));
    else
        snprintf(what, sizeof(what), "%s.", strerror(e));
    return kvd__client_fail(NULL, KVD_ECONN, "cannot connect to kvdockd at %s: %s%s%s", path, what,
                            sep, origin);
}

kvd_status_t kvd_client_create(const char *socket_path, const char *client_name, kvd_client_t **out)
{
    kvd_client_t *c = NULL;
    struct sockaddr_un sa;
    char path[sizeof(sa.sun_path)];
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__Hello hello = KVDOCK__HELLO__INIT;
    kvd_status_t st;
    pthread_condattr_t ca;
    char why[KVD__ERR_MAX];
    uint64_t id;
    int sock = -1;

    if (out == NULL)
        return kvd__client_fail(NULL, KVD_ENULL, "out is NULL");
    *out = NULL;
    if (socket_path == NULL || socket_path[0] == '\0') {
        if (kvd__default_socket_path(path, sizeof(path)) != KVD_OK)
            return kvd__client_fail(NULL, KVD_ERANGE, "the default socket path is too long");
    } else {
        if (strlen(socket_path) >= sizeof(path))
            return kvd__client_fail(NULL, KVD_ERANGE,
                                    "socket path too long (at most %zu bytes): %s",
                                    sizeof(path) - 1, socket_path);
        memcpy(path, socket_path, strlen(socket_path) + 1);
    }
    if (client_name == NULL)
        client_name = "kvdock-client";

    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return kvd__client_fail(NULL, KVD_EIO, "socket: %s", strerror(errno));
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    while (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;

        if (e == EINTR)
            continue;
        close(sock);
        return connect_failed(path, e, socket_path == NULL || socket_path[0] == '\0');
    }

    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(sock);
        return kvd__client_fail(NULL, KVD_ENOMEM, "out of memory");
    }
    c->sock = sock;
    memcpy(c->path, path, strlen(path) + 1);
    c->next_id = 1;
    c->info.device_ordinal = -1;
    kvd__spin_init(&c->spin, (uint64_t)default_spin_us() * 1000);
    kvd__key_area_init(c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->send_mu, NULL);
    /* Timed waits for the reader use CLOCK_MONOTONIC deadlines. */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);

    hello.protocol_version = KVD_PROTOCOL_VERSION;
    hello.client_name = (char *)client_name;
    req.op_case = KVDOCK__REQUEST__OP_HELLO;
    req.hello = &hello;
    st = kvd__submit(c, &req, NULL, 0, hello_finish, NULL, &id);
    if (st == KVD_OK)
        st = kvd__wait(c, id, HELLO_TIMEOUT_MS);
    if (st != KVD_OK) {
        kvd__copy_str(why, sizeof(why), kvd_client_last_error(c));
        kvd__client_fail(NULL, st, "hello to kvdockd at %s failed: %s", path, why);
        goto fail;
    }
    *out = c;
    return KVD_OK;

fail:
    kvd_client_destroy(&c);
    return st;
}

void kvd_client_destroy(kvd_client_t **p)
{
    kvd_client_t *c;

    if (p == NULL || *p == NULL)
        return;
    c = *p;
    *p = NULL;
    kvd__conn_teardown(c);
    kvd__key_area_teardown(c);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->send_mu);
    free(c);
}

const kvd_hello_info_t *kvd_client_info(const kvd_client_t *cli)
{
    return cli != NULL ? &cli->info : NULL;
}

const char *kvd_client_socket_path(const kvd_client_t *cli)
{
    return cli != NULL ? cli->path : NULL;
}

int kvd_client_fd(const kvd_client_t *cli)
{
    return cli != NULL ? cli->sock : -1;
}

bool kvd_client_connected(const kvd_client_t *cli)
{
    bool ok;
    kvd_client_t *c = (kvd_client_t *)cli;

    if (c == NULL)
        return false;
    pthread_mutex_lock(&c->mu);
    ok = !c->dead;
    pthread_mutex_unlock(&c->mu);
    return ok;
}

int kvd_client_abi_version(void)
{
    return KVD_CLIENT_ABI_VERSION;
}

void kvd_client_set_spin_us(kvd_client_t *cli, uint32_t spin_us)
{
    if (cli == NULL)
        return;
    pthread_mutex_lock(&cli->mu);
    kvd__spin_init(&cli->spin,
                   (uint64_t)(spin_us > KVD_CLIENT_SPIN_US_MAX ? KVD_CLIENT_SPIN_US_MAX : spin_us) * 1000);
    pthread_mutex_unlock(&cli->mu);
}

void kvd_client_set_timeout(kvd_client_t *cli, int timeout_ms)
{
    if (cli == NULL)
        return;
    pthread_mutex_lock(&cli->mu);
    cli->timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
    pthread_mutex_unlock(&cli->mu);
}

/* ------------------------------------------------------------------------ */
/* Ping                                                                      */

static kvd_status_t ping_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    const Kvdock__Pong *pong =
        p->resp->result_case == KVDOCK__RESPONSE__RESULT_PONG ? p->resp->pong : NULL;
    size_t n = pong != NULL ? pong->payload.len : 0;

    if (pong == NULL && p->out.ping.len > 0)
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered ping without a Pong");
    if (n != p->out.ping.len || (n > 0 && memcmp(pong->payload.data, p->out.ping.payload, n) != 0))
        return kvd__client_fail(cli, KVD_EPROTO,
                                "ping payload of %zu bytes came back as %zu different bytes",
                                p->out.ping.len, n);
    return KVD_OK;
}

/* req_id NULL: blocking. */
static kvd_status_t ping_go(kvd_client_t *cli, const void *payload, size_t len, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__Ping ping = KVDOCK__PING__INIT;
    kvd__out_t out;
    uint64_t id;
    kvd_status_t st;

    if (cli == NULL || (payload == NULL && len > 0))
        return kvd__client_fail(cli, KVD_ENULL, "client or payload is NULL");
    memset(&out, 0, sizeof(out));
    if (len > 0) {
        out.ping.payload = malloc(len);
        if (out.ping.payload == NULL)
            return kvd__client_fail(cli, KVD_ENOMEM, "out of memory");
        memcpy(out.ping.payload, payload, len);
    }
    out.ping.len = len;
    ping.payload.data = (uint8_t *)payload;
    ping.payload.len = len;
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &ping;
    /* submitted, the request owns the payload copy (freed when finished
     * or abandoned): so not kvd__call, which would hide which step failed */
    st = kvd__submit(cli, &req, NULL, 0, ping_finish, &out, req_id ? req_id : &id);
    if (st != KVD_OK) {
        free(out.ping.payload);
        return st;
    }
    return req_id ? KVD_OK : kvd__wait_blocking(cli, id);
}

kvd_status_t kvd_ping_submit(kvd_client_t *cli, const void *payload, size_t len, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return ping_go(cli, payload, len, req_id);
}

kvd_status_t kvd_ping(kvd_client_t *cli, const void *payload, size_t len)
{
    return ping_go(cli, payload, len, NULL);
}

/* ------------------------------------------------------------------------ */
/* Status                                                                    */

static kvd_status_t status_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    const Kvdock__StatusReply *s = p->resp->result_case == KVDOCK__RESPONSE__RESULT_STATUS_REPLY
                                       ? p->resp->status_reply
                                       : NULL;
    kvd_daemon_status_t *o = p->out.status.out;

    if (s == NULL)
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered status without a StatusReply");
    memset(o, 0, sizeof(*o));
    kvd__copy_str(o->daemon_version, sizeof(o->daemon_version), s->daemon_version);
    o->backend = (int32_t)s->backend;
    kvd__copy_str(o->device_name, sizeof(o->device_name), s->device_name);
    o->uptime_ms = s->uptime_ms;
    o->clients = s->clients;
    o->pools = s->pools;
    o->pool_bytes = s->pool_bytes;
    o->buffers = s->buffers;
    o->events = s->events;
    o->inflight = s->inflight;
    kvd__copy_str(o->socket_path, sizeof(o->socket_path), s->socket_path);
    kvd__copy_str(o->metrics_address, sizeof(o->metrics_address), s->metrics_address);
    o->shutting_down = s->shutting_down != 0;
    o->num_clients = s->n_client_list;
    if (s->host_memory != NULL) {
        const Kvdock__HostMemory *h = s->host_memory;

        o->host_budget = h->budget;
        o->host_used = h->used;
        o->host_available = h->available;
        o->host_machine = h->machine;
        o->cache_budgets = h->cache_budgets;
        for (size_t i = 0; i < h->n_kinds && i < KVD_MEMORY_KINDS_MAX; i++) {
            kvd_memory_use_t *u = &o->host_kinds[o->num_host_kinds++];
            kvd__copy_str(u->kind, sizeof(u->kind), h->kinds[i]->kind);
            u->used = h->kinds[i]->used;
            u->limit = h->kinds[i]->limit;
            u->refused = h->kinds[i]->refused;
        }
    }
    o->device_free = s->device_memory_free;
    o->device_total = s->device_memory_total;
    o->device_margin = s->device_memory_margin;
    for (size_t i = 0; i < s->n_stream_paths; i++)
        if ((int)s->stream_paths[i]->stream >= 0 && (int)s->stream_paths[i]->stream < KVD_STREAM_END)
            o->stream_paths[s->stream_paths[i]->stream] = (int32_t)s->stream_paths[i]->path;
    if (s->cluster != NULL) {
        const Kvdock__Cluster *c = s->cluster;
        kvd_cluster_status_t *oc = &o->cluster;

        oc->enabled = true;
        kvd__copy_str(oc->node, sizeof(oc->node), c->node);
        oc->deadline_ms = c->deadline_ms;
        oc->inbound = c->inbound;
        oc->blocks_fetched = c->blocks_fetched;
        oc->bytes_fetched = c->bytes_fetched;
        oc->blocks_served = c->blocks_served;
        oc->bytes_served = c->bytes_served;
        oc->refused = c->refused;
        oc->num_peers = (uint32_t)c->n_peers;
        for (size_t i = 0; i < c->n_peers && i < KVD_CLUSTER_PEERS_MAX; i++) {
            const Kvdock__ClusterPeer *cp = c->peers[i];
            kvd_cluster_peer_t *e = &oc->peers[i];
            kvd__copy_str(e->address, sizeof(e->address), cp->address);
            kvd__copy_str(e->state, sizeof(e->state), cp->state);
            kvd__copy_str(e->error, sizeof(e->error), cp->error);
            e->rtt_us = cp->rtt_us;
            e->since_ms = cp->since_ms;
            e->queries = cp->queries;
            e->blocks_fetched = cp->blocks_fetched;
            e->bytes_fetched = cp->bytes_fetched;
            e->failures = cp->failures;
        }
    }
    if (s->disk != NULL) {
        const Kvdock__DiskStatus *d = s->disk;

        o->disk.enabled = true;
        o->disk.direct = d->direct != 0;
        kvd__copy_str(o->disk.cache_dir, sizeof(o->disk.cache_dir), d->cache_dir);
        kvd__copy_str(o->disk.io_engine, sizeof(o->disk.io_engine), d->io_engine);
        o->disk.budget_bytes = d->budget_bytes;
        o->disk.reserved_bytes = d->reserved_bytes;
        o->disk.used_bytes = d->used_bytes;
        o->disk.fs_free_bytes = d->fs_free_bytes;
        o->disk.num_skipped = d->skipped_count > d->n_skipped ? d->skipped_count
                                                                : (uint32_t)d->n_skipped;
        for (size_t i = 0; i < d->n_skipped && i < KVD_DISK_SKIPPED_MAX; i++) {
            const Kvdock__SkippedCache *sc = d->skipped[i];
            kvd_skipped_cache_t *e = &o->disk.skipped[i];
            kvd__copy_str(e->dir, sizeof(e->dir), sc->dir);
            kvd__copy_str(e->name, sizeof(e->name), sc->name);
            e->owner_uid = sc->owner_uid;
            kvd__copy_str(e->reason, sizeof(e->reason), sc->reason);
        }
    }
    for (size_t i = 0; i < s->n_client_list && i < p->out.status.cap; i++) {
        const Kvdock__ClientInfo *ci = s->client_list[i];
        kvd_client_entry_t *e = &p->out.status.clients[i];

        memset(e, 0, sizeof(*e));
        e->id = ci->id;
        kvd__copy_str(e->name, sizeof(e->name), ci->name);
        e->pid = ci->pid;
        e->uid = ci->uid;
        e->inflight = ci->inflight;
        e->pools = ci->pools;
        e->requests = ci->requests;
    }
    return KVD_OK;
}

static kvd_status_t status_go(kvd_client_t *cli, kvd_daemon_status_t *out,
                              kvd_client_entry_t *clients, size_t cap, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__StatusRequest sr = KVDOCK__STATUS_REQUEST__INIT;
    kvd__out_t o;

    if (cli == NULL || out == NULL || (clients == NULL && cap > 0))
        return kvd__client_fail(cli, KVD_ENULL, "client, out or clients is NULL");
    memset(&o, 0, sizeof(o));
    o.status.out = out;
    o.status.clients = clients;
    o.status.cap = cap;
    req.op_case = KVDOCK__REQUEST__OP_STATUS;
    req.status = &sr;
    return kvd__call(cli, &req, NULL, 0, status_finish, &o, req_id);
}

kvd_status_t kvd_daemon_status_submit(kvd_client_t *cli, kvd_daemon_status_t *out,
                                      kvd_client_entry_t *clients, size_t cap, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return status_go(cli, out, clients, cap, req_id);
}

kvd_status_t kvd_daemon_status(kvd_client_t *cli, kvd_daemon_status_t *out,
                               kvd_client_entry_t *clients, size_t cap)
{
    return status_go(cli, out, clients, cap, NULL);
}

/* ------------------------------------------------------------------------ */
/* Stats                                                                     */

static kvd_status_t stats_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    const Kvdock__StatsReply *s =
        p->resp->result_case == KVDOCK__RESPONSE__RESULT_STATS ? p->resp->stats : NULL;
    kvd_daemon_stats_t *o = p->out.stats.out;

    if (s == NULL)
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered stats without a StatsReply");
    memset(o, 0, sizeof(*o));
    o->bytes_in = s->bytes_in;
    o->bytes_out = s->bytes_out;
    o->connections = s->connections;
    o->num_ops = s->n_ops;
    o->num_streams = s->n_streams;
    for (size_t i = 0; i < s->n_ops && i < p->out.stats.ops_cap; i++) {
        const Kvdock__OpStats *so = s->ops[i];
        kvd_op_stats_t *d = &p->out.stats.ops[i];
        size_t nb = so->n_bounds_us < KVD_HIST_MAX ? so->n_bounds_us : KVD_HIST_MAX;

        memset(d, 0, sizeof(*d));
        kvd__copy_str(d->op, sizeof(d->op), so->op);
        d->requests = so->requests;
        d->errors = so->errors;
        d->bytes = so->bytes;
        d->num_bounds = (uint32_t)nb;
        for (size_t b = 0; b < nb; b++)
            d->bounds_us[b] = so->bounds_us[b];
        /* counts[i] for bounds kept; anything past them folds into the last
         * (unbounded) count. */
        for (size_t b = 0; b < so->n_counts; b++)
            d->counts[b < nb ? b : nb] += so->counts[b];
        d->sum_us = so->sum_us;
    }
    for (size_t i = 0; i < s->n_streams && i < p->out.stats.streams_cap; i++) {
        const Kvdock__StreamStats *ss = s->streams[i];
        kvd_stream_stats_t *d = &p->out.stats.streams[i];

        memset(d, 0, sizeof(*d));
        kvd__copy_str(d->name, sizeof(d->name), ss->name);
        d->priority = ss->priority;
        d->max_blocks = ss->max_blocks;
        d->launches = ss->launches;
        d->bytes = ss->bytes;
        d->busy_ns = ss->busy_ns;
        d->queue_depth = ss->queue_depth;
        d->path = (int32_t)ss->path;
        d->copy_engine_launches = ss->copy_engine_launches;
    }
    return KVD_OK;
}

static kvd_status_t stats_go(kvd_client_t *cli, kvd_daemon_stats_t *out, kvd_op_stats_t *ops,
                             size_t ops_cap, kvd_stream_stats_t *streams, size_t streams_cap,
                             uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__StatsRequest sr = KVDOCK__STATS_REQUEST__INIT;
    kvd__out_t o;

    if (cli == NULL || out == NULL || (ops == NULL && ops_cap > 0) ||
        (streams == NULL && streams_cap > 0))
        return kvd__client_fail(cli, KVD_ENULL, "client, out, ops or streams is NULL");
    memset(&o, 0, sizeof(o));
    o.stats.out = out;
    o.stats.ops = ops;
    o.stats.ops_cap = ops_cap;
    o.stats.streams = streams;
    o.stats.streams_cap = streams_cap;
    req.op_case = KVDOCK__REQUEST__OP_STATS;
    req.stats = &sr;
    return kvd__call(cli, &req, NULL, 0, stats_finish, &o, req_id);
}

kvd_status_t kvd_daemon_stats_submit(kvd_client_t *cli, kvd_daemon_stats_t *out,
                                     kvd_op_stats_t *ops, size_t ops_cap,
                                     kvd_stream_stats_t *streams, size_t streams_cap,
                                     uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return stats_go(cli, out, ops, ops_cap, streams, streams_cap, req_id);
}

kvd_status_t kvd_daemon_stats(kvd_client_t *cli, kvd_daemon_stats_t *out, kvd_op_stats_t *ops,
                              size_t ops_cap, kvd_stream_stats_t *streams, size_t streams_cap)
{
    return stats_go(cli, out, ops, ops_cap, streams, streams_cap, NULL);
}

/* ------------------------------------------------------------------------ */
/* Shutdown                                                                  */

static kvd_status_t shutdown_go(kvd_client_t *cli, bool drain, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__Shutdown sd = KVDOCK__SHUTDOWN__INIT;

    if (cli == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client is NULL");
    sd.drain = drain;
    req.op_case = KVDOCK__REQUEST__OP_SHUTDOWN;
    req.shutdown = &sd;
    return kvd__call(cli, &req, NULL, 0, NULL, NULL, req_id);
}

kvd_status_t kvd_daemon_shutdown_submit(kvd_client_t *cli, bool drain, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return shutdown_go(cli, drain, req_id);
}

kvd_status_t kvd_daemon_shutdown(kvd_client_t *cli, bool drain)
{
    return shutdown_go(cli, drain, NULL);
}
