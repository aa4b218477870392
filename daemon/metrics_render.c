/* The Prometheus endpoint's exposition text, from the server's counters,
 * registry and connections at scrape time (see metrics.h). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_disk.h"
#include "caches.h"
#include "cluster.h"
#include "conn.h"
#include "dispatch.h"
#include "wire.h"
#include "log.h"
#include "metrics.h"
#include "server.h"

/* ---- the exposition text ----------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 16384;
        char *np;
        while (cap < b->len + n + 1)
            cap *= 2;
        np = realloc(b->p, cap);
        if (np == NULL) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)n < sizeof(small)) {
        sb_put(b, small, (size_t)n);
        return;
    }
    {
        char *big = malloc((size_t)n + 1);
        if (big == NULL) {
            b->oom = 1;
            return;
        }
        va_start(ap, fmt);
        vsnprintf(big, (size_t)n + 1, fmt, ap);
        va_end(ap);
        sb_put(b, big, (size_t)n);
        free(big);
    }
}

/* A label value: backslash, double quote and newline escaped. */
static void sb_label(sbuf_t *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            sb_put(b, "\\\\", 2);
        else if (*s == '"')
            sb_put(b, "\\\"", 2);
        else if (*s == '\n')
            sb_put(b, "\\n", 2);
        else
            sb_put(b, s, 1);
    }
}

static void family(sbuf_t *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{key="value"} v, for one label. */
static void sample_u(sbuf_t *b, const char *name, const char *key, const char *value, uint64_t v)
{
    sb_printf(b, "%s{%s=\"", name, key);
    sb_label(b, value);
    sb_printf(b, "\"} %" PRIu64 "\n", v);
}

static void sample_d(sbuf_t *b, const char *name, const char *key, const char *value, double v)
{
    sb_printf(b, "%s{%s=\"", name, key);
    sb_label(b, value);
    sb_printf(b, "\"} %.9g\n", v);
}

#define NKINDS 4 /* index = enum kvd_mem_kind; 0: unknown */

/* The cache tier: one sample per cache of each family, labelled with the
 * cache's name and its owner (names are unique per owner). */
#define CACHE_FAMILIES(X)                                                                          \
    X(blocks, "gauge", "blocks resident", kvd__cache_host_blocks(s))                             \
    X(capacity_blocks, "gauge", "blocks the cache's budget holds", s->capacity)                 \
    X(used_bytes, "gauge", "bytes of resident blocks", kvd__cache_used(s))                       \
    X(budget_bytes, "gauge", "the cache's budget", s->budget)                                   \
    X(held_bytes, "gauge", "host memory the cache holds: slabs, entries, index", s->held_bytes) \
    X(leases, "gauge", "leases held on the cache's blocks", k->leases)                          \
    X(lookups_total, "counter", "lookups", s->n.lookups)                                        \
    X(requested_tokens_total, "counter", "tokens of the keys lookups asked for",                 \
      s->n.keys_asked * s->layout.tokens_per_block)                                             \
    X(hit_tokens_total, "counter", "tokens of the keys lookups found, here or on peers",         \
      s->n.keys_hit * s->layout.tokens_per_block)                                               \
    X(peer_hit_tokens_total, "counter", "of those, tokens of keys found on peers only",          \
      k->peer_hits * s->layout.tokens_per_block)                                                \
    X(saves_total, "counter", "saves", s->n.saves)                                              \
    X(stored_blocks_total, "counter", "blocks saves stored", s->n.stored)                       \
    X(dedup_blocks_total, "counter", "blocks saves found there already", s->n.skipped)          \
    X(refused_blocks_total, "counter", "blocks saves could not store (all held)", s->n.refused) \
    X(loads_total, "counter", "loads", s->n.loads)                                              \
    X(loaded_blocks_total, "counter", "blocks loaded", s->n.loaded)                             \
    X(evictions_total, "counter", "blocks evicted", s->n.evictions)                             \
    X(bytes_in_total, "counter", "bytes saved into the cache", s->n.bytes_in)                   \
    X(bytes_out_total, "counter", "bytes loaded from the cache", s->n.bytes_out)                 \
    X(fetched_blocks_total, "counter", "blocks loads pulled from the cluster's peers", k->fetched) \
    X(served_blocks_total, "counter", "blocks the cluster's peers pulled from it", k->served)

static void render_caches(sbuf_t *b, const kvd__server_t *srv)
{
    const kvd__cache_t *k;

#define CACHE_FAMILY_(fam, type, help, expr)                                                       \
    family(b, "kvdock_cache_" #fam, type, "the cache tier: " help);                               \
    for (k = srv->caches; k; k = k->next) {                                                      \
        const kvd__cache_store_t *s = &k->store;                                                  \
        (void)s;                                                                                 \
        sb_printf(b, "kvdock_cache_" #fam "{cache=\"");                                           \
        sb_label(b, k->name);                                                                    \
        sb_printf(b, "\",owner=\"%u\"} %" PRIu64 "\n", (unsigned)k->owner_uid, (uint64_t)(expr));  \
    }
    CACHE_FAMILIES(CACHE_FAMILY_)
#undef CACHE_FAMILY_
}

/* The caches' disk levels (--cache-dir): one sample per cache that has
 * one, labelled as the host level's are. */
#define DISK_FAMILIES(X)                                                                           \
    X(blocks, "gauge", "complete blocks on disk", d.blocks)                                     \
    X(budget_bytes, "gauge", "the cache's disk budget", k->disk_budget)                          \
    X(used_bytes, "gauge", "bytes the cache's records take on disk", d.used_bytes)              \
    X(hits_total, "counter", "keys of lookups found on disk only", d.hits)                      \
    X(spills_total, "counter", "blocks written to disk", d.spills)                              \
    X(promotions_total, "counter", "blocks read back into host memory", d.promotions)           \
    X(reads_total, "counter", "records read", d.reads)                                          \
    X(read_bytes_total, "counter", "bytes read", d.read_bytes)                                  \
    X(writes_total, "counter", "batches written", d.writes)                                     \
    X(write_bytes_total, "counter", "bytes written", d.write_bytes)                             \
    X(evictions_total, "counter", "blocks dropped from disk", d.evictions)                      \
    X(checksum_failures_total, "counter", "records that failed their checks (never served)",     \
      d.checksum_failures)                                                                      \
    X(io_errors_total, "counter", "reads and writes the disk failed", d.io_errors)              \
    X(no_space_total, "counter", "spills refused: the file system or the disk budget was full", \
      d.no_space)

static void render_disk(sbuf_t *b, const kvd__server_t *srv)
{
    const kvd__cache_t *k;
    uint64_t used = 0, avail = 0, total = 0;
    char why[200];

    if (srv->disk_io == NULL)
        return;
#define DISK_FAMILY_(fam, type, help, expr)                                                        \
    family(b, "kvdock_cache_disk_" #fam, type, "the cache tier's disk level: " help);             \
    for (k = srv->caches; k; k = k->next) {                                                      \
        kvd__cache_disk_stats_t d;                                                                \
        if (k->disk_dir == NULL)                                                                 \
            continue;                                                                            \
        kvd__cache_store_disk_stats(&k->store, &d);                                               \
        sb_printf(b, "kvdock_cache_disk_" #fam "{cache=\"");                                     \
        sb_label(b, k->name);                                                                    \
        sb_printf(b, "\",owner=\"%u\"} %" PRIu64 "\n", (unsigned)k->owner_uid, (uint64_t)(expr)); \
    }
    DISK_FAMILIES(DISK_FAMILY_)
#undef DISK_FAMILY_
    for (k = srv->caches; k; k = k->next) {
        kvd__cache_disk_stats_t d;
        if (k->disk_dir == NULL)
            continue;
        kvd__cache_store_disk_stats(&k->store, &d);
        used += d.used_bytes;
    }
    family(b, "kvdock_disk_budget_bytes", "gauge",
           "bytes of disk kvdockd may use for its caches' disk levels (disk-budget)");
    sb_printf(b, "kvdock_disk_budget_bytes %" PRIu64 "\n", srv->disk_budget);
    family(b, "kvdock_disk_reserved_bytes", "gauge", "the caches' disk budgets together");
    sb_printf(b, "kvdock_disk_reserved_bytes %" PRIu64 "\n", kvd__caches_disk_budgets(srv));
    family(b, "kvdock_disk_skipped_caches", "gauge",
           "directories of cache-dir not reopened at start (kvdock status says why)");
    sb_printf(b, "kvdock_disk_skipped_caches %" PRIu32 "\n", srv->n_skipped);
    family(b, "kvdock_disk_used_bytes", "gauge", "bytes the caches' records take on disk");
    sb_printf(b, "kvdock_disk_used_bytes %" PRIu64 "\n", used);
    if (kvd__cache_dir_space(srv->opts.cache_dir, &avail, &total, why, sizeof(why)) == 0) {
        family(b, "kvdock_disk_free_bytes", "gauge", "free space of cache-dir's file system");
        sb_printf(b, "kvdock_disk_free_bytes %" PRIu64 "\n", avail);
    }
}

/* The cluster (cluster.h), when the daemon is in one. */
static void render_cluster(sbuf_t *b, const kvd__server_t *srv)
{
    const kvd__cluster_t *cl = srv->cluster;
    kvd__cluster_totals_t t;
    uint32_t i, n = kvd__cluster_peers(cl);
    int up;
    uint64_t rtt, failures, bytes;

    if (cl == NULL)
        return;
    kvd__cluster_get_totals(cl, &t);
#define PEER_FAMILY_(fam, type, help, expr)                                                        \
    family(b, "kvdock_cluster_peer_" #fam, type, help);                                           \
    for (i = 0; i < n; i++) {                                                                    \
        const char *addr = kvd__cluster_peer(cl, i, &up, &rtt, &failures, &bytes);                \
        sb_printf(b, "kvdock_cluster_peer_" #fam "{peer=\"");                                     \
        sb_label(b, addr);                                                                       \
        sb_printf(b, "\"} %" PRIu64 "\n", (uint64_t)(expr));                                      \
    }
    PEER_FAMILY_(up, "gauge", "1 while the peer is connected and has proven the secret", up)
    PEER_FAMILY_(rtt_microseconds, "gauge", "the last ping's round trip to the peer", rtt)
    PEER_FAMILY_(failures_total, "counter", "times the peer went down or missed a deadline",
                 failures)
    PEER_FAMILY_(fetched_bytes_total, "counter", "bytes pulled from the peer", bytes)
#undef PEER_FAMILY_
    family(b, "kvdock_cluster_inbound", "gauge", "peers connected to this daemon and proven");
    sb_printf(b, "kvdock_cluster_inbound %u\n", t.inbound);
    family(b, "kvdock_cluster_served_bytes_total", "counter", "bytes peers pulled from here");
    sb_printf(b, "kvdock_cluster_served_bytes_total %" PRIu64 "\n", t.bytes_served);
    family(b, "kvdock_cluster_refused_total", "counter",
           "cluster connections refused (outside the allow list, too many, no proof, bad input)");
    sb_printf(b, "kvdock_cluster_refused_total %" PRIu64 "\n", t.refused);
    family(b, "kvdock_cluster_unproven", "gauge",
           "connections to the cluster's port that have not proven the secret yet");
    sb_printf(b, "kvdock_cluster_unproven %u\n", t.unproven);
    family(b, "kvdock_cluster_dropped_blocks_total", "counter",
           "block messages on this daemon's lanes that no fetch of it asked for");
    sb_printf(b, "kvdock_cluster_dropped_blocks_total %" PRIu64 "\n", t.blocks_dropped);
}

char *kvd__metrics_render(const kvd__server_t *srv, size_t *len)
{
    const kvd__stats_t *st = &srv->stats;
    sbuf_t b = {0};
    uint64_t now = kvd__now_ns();
    uint64_t pools[NKINDS] = {0}, pool_bytes[NKINDS] = {0};
    uint64_t imp_pools[NKINDS] = {0}, imp_bytes[NKINDS] = {0};
    const kvd__pool_t *p;
    const kvd__conn_t *c;
    uint32_t clients = 0;
    size_t i;
    int k;

    /* build */
    family(&b, "kvdock_build_info", "gauge",
           "kvdockd build: version, protocol, backend in use, device, CUDA support (always 1)");
    sb_printf(&b, "kvdock_build_info{version=\"%s\",protocol=\"%u\",backend=\"", KVD_DAEMON_VERSION,
              KVD_PROTOCOL_VERSION);
    sb_label(&b, srv->backend ? srv->backend->name : "none");
    sb_put(&b, "\",device=\"", 10);
    sb_label(&b, srv->backend ? srv->backend->device_name : "");
#ifdef KVD_HAVE_CUDA
    sb_printf(&b, "\",cuda=\"yes\"} 1\n");
#else
    sb_printf(&b, "\",cuda=\"no\"} 1\n");
#endif
    family(&b, "kvdock_uptime_seconds", "gauge", "seconds since kvdockd started");
    sb_printf(&b, "kvdock_uptime_seconds %.3f\n", (double)(now - srv->start_ns) / 1e9);
    family(&b, "kvdock_shutting_down", "gauge", "1 while kvdockd drains before exiting");
    sb_printf(&b, "kvdock_shutting_down %d\n", srv->shutting_down ? 1 : 0);

    /* per operation */
    family(&b, "kvdock_requests_total", "counter", "requests answered, by operation");
    for (i = 0; i < st->nops; i++)
        sample_u(&b, "kvdock_requests_total", "op", kvd__op_row_name(i), st->ops[i].requests);
    family(&b, "kvdock_request_errors_total", "counter",
           "requests answered with an error status, by operation");
    for (i = 0; i < st->nops; i++)
        sample_u(&b, "kvdock_request_errors_total", "op", kvd__op_row_name(i), st->ops[i].errors);
    family(&b, "kvdock_request_bytes_total", "counter",
           "bytes moved by successful requests, by operation");
    for (i = 0; i < st->nops; i++)
        sample_u(&b, "kvdock_request_bytes_total", "op", kvd__op_row_name(i), st->ops[i].bytes);
    family(&b, "kvdock_request_duration_seconds", "histogram",
           "time from a request's arrival to its reply, by operation");
    for (i = 0; i < st->nops; i++) {
        const kvd__op_counters_t *o = &st->ops[i];
        uint64_t cum = 0;
        int j;

        for (j = 0; j <= KVD_HIST_BOUNDS; j++) {
            cum += o->counts[j];
            sb_printf(&b, "kvdock_request_duration_seconds_bucket{op=\"");
            sb_label(&b, kvd__op_row_name(i));
            if (j < KVD_HIST_BOUNDS)
                sb_printf(&b, "\",le=\"%g\"} %" PRIu64 "\n", kvd__hist_bounds_us[j] / 1e6, cum);
            else
                sb_printf(&b, "\",le=\"+Inf\"} %" PRIu64 "\n", cum);
        }
        sample_d(&b, "kvdock_request_duration_seconds_sum", "op", kvd__op_row_name(i), o->sum_us / 1e6);
        sample_u(&b, "kvdock_request_duration_seconds_count", "op", kvd__op_row_name(i), cum);
    }

    /* per stream class */
    family(&b, "kvdock_stream_queue_depth", "gauge",
           "operations queued or running on the stream class");
    for (k = KVD_STREAM_FIRST; k < KVD_STREAM_END; k++)
        sample_u(&b, "kvdock_stream_queue_depth", "stream", kvd__stream_class_name(k),
                 st->streams[k].depth);
    family(&b, "kvdock_stream_busy_seconds_total", "counter",
           "time the stream class had work queued or running");
    for (k = KVD_STREAM_FIRST; k < KVD_STREAM_END; k++)
        sample_d(&b, "kvdock_stream_busy_seconds_total", "stream", kvd__stream_class_name(k),
                 (double)kvd__stats_stream_busy(st, k, now) / 1e9);
    family(&b, "kvdock_stream_launches_total", "counter",
           "operations completed on the stream class");
    for (k = KVD_STREAM_FIRST; k < KVD_STREAM_END; k++)
        sample_u(&b, "kvdock_stream_launches_total", "stream", kvd__stream_class_name(k),
                 st->streams[k].launches);
    family(&b, "kvdock_stream_copy_engine_launches_total", "counter",
           "operations of the stream class that ran on the copy engines");
    for (k = KVD_STREAM_FIRST; k < KVD_STREAM_END; k++)
        sample_u(&b, "kvdock_stream_copy_engine_launches_total", "stream",
                 kvd__stream_class_name(k), st->streams[k].copy_engine_launches);
    family(&b, "kvdock_stream_default_path", "gauge",
           "how the stream class moves transfers when a request does not say (1 for its path)");
    for (k = KVD_STREAM_FIRST; k < KVD_STREAM_END; k++) {
        int path = kvd__stream_path(&srv->opts, k);
        sb_printf(&b, "kvdock_stream_default_path{stream=\"%s\",path=\"copy_engine\"} %d\n",
                  kvd__stream_class_name(k), path == KVD_PATH_COPY_ENGINE);
        sb_printf(&b, "kvdock_stream_default_path{stream=\"%s\",path=\"kernel\"} %d\n",
                  kvd__stream_class_name(k), path == KVD_PATH_KERNEL);
    }
    family(&b, "kvdock_stream_bytes_total", "counter", "bytes moved on the stream class");
    for (k = KVD_STREAM_FIRST; k < KVD_STREAM_END; k++)
        sample_u(&b, "kvdock_stream_bytes_total", "stream", kvd__stream_class_name(k),
                 st->streams[k].bytes);

    /* memory */
    for (p = srv->reg.pools; p; p = p->next) {
        int kind = p->kind > 0 && p->kind < NKINDS ? p->kind : 0;
        if (p->imported) {
            imp_pools[kind]++;
            imp_bytes[kind] += (uint64_t)p->num_layers * p->num_slots *
                               (p->slot_stride ? p->slot_stride : p->slot_bytes) *
                               (p->mla ? 1u : 2u);
        } else {
            pools[kind]++;
            pool_bytes[kind] += p->obj.bytes;
        }
    }
    family(&b, "kvdock_pools", "gauge", "live pools owned by kvdockd, by memory kind");
    for (k = 1; k < NKINDS; k++)
        sample_u(&b, "kvdock_pools", "kind", kvd_mem_kind_name(k), pools[k]);
    family(&b, "kvdock_pool_bytes", "gauge",
           "bytes of live pools allocated by kvdockd, by memory kind");
    for (k = 1; k < NKINDS; k++)
        sample_u(&b, "kvdock_pool_bytes", "kind", kvd_mem_kind_name(k), pool_bytes[k]);
    family(&b, "kvdock_imported_pools", "gauge",
           "live pools over clients' own memory, by memory kind");
    for (k = 1; k < NKINDS; k++)
        sample_u(&b, "kvdock_imported_pools", "kind", kvd_mem_kind_name(k), imp_pools[k]);
    family(&b, "kvdock_imported_pool_bytes", "gauge",
           "bytes addressed by pools over clients' own memory, by memory kind");
    for (k = 1; k < NKINDS; k++)
        sample_u(&b, "kvdock_imported_pool_bytes", "kind", kvd_mem_kind_name(k), imp_bytes[k]);
    family(&b, "kvdock_memory_bytes", "gauge",
           "bytes of pools and buffers allocated by kvdockd and not yet released");
    sb_printf(&b, "kvdock_memory_bytes %" PRIu64 "\n", srv->reg.live_bytes);
    family(&b, "kvdock_host_memory_budget_bytes", "gauge",
           "host memory kvdockd may reserve for its clients (host-memory-budget)");
    sb_printf(&b, "kvdock_host_memory_budget_bytes %" PRIu64 "\n", srv->hostmem.budget);
    family(&b, "kvdock_host_memory_bytes", "gauge",
           "host memory held against the budget, by kind");
    for (k = 0; k < KVD_HM_COUNT; k++)
        sample_u(&b, "kvdock_host_memory_bytes", "kind", kvd__hostmem_kind_name(k),
                 srv->hostmem.used[k]);
    family(&b, "kvdock_host_memory_limit_bytes", "gauge",
           "the most each kind of host memory may hold");
    for (k = 0; k < KVD_HM_COUNT; k++)
        sample_u(&b, "kvdock_host_memory_limit_bytes", "kind", kvd__hostmem_kind_name(k),
                 srv->hostmem.cap[k]);
    family(&b, "kvdock_host_memory_refused_total", "counter",
           "host-memory reservations refused (budget, kind's limit or the machine's memory)");
    for (k = 0; k < KVD_HM_COUNT; k++)
        sample_u(&b, "kvdock_host_memory_refused_total", "kind", kvd__hostmem_kind_name(k),
                 srv->hostmem.refused[k]);
    render_caches(&b, srv);
    render_disk(&b, srv);
    render_cluster(&b, srv);
    family(&b, "kvdock_buffers", "gauge", "live registered buffers");
    sb_printf(&b, "kvdock_buffers %u\n", srv->reg.nbuffers);
    family(&b, "kvdock_events", "gauge", "live registered interprocess events");
    sb_printf(&b, "kvdock_events %u\n", srv->reg.nevents);

    /* clients */
    for (c = srv->conns; c; c = c->next)
        if (!c->closing)
            clients++;
    family(&b, "kvdock_clients", "gauge", "clients connected");
    sb_printf(&b, "kvdock_clients %u\n", clients);
    family(&b, "kvdock_connections_total", "counter", "client connections accepted");
    sb_printf(&b, "kvdock_connections_total %" PRIu64 "\n", st->connections);
    family(&b, "kvdock_connections_dropped_total", "counter",
           "connections closed or refused to protect the daemon, by reason");
    sample_u(&b, "kvdock_connections_dropped_total", "reason", "hello_timeout",
             st->timeouts_hello);
    sample_u(&b, "kvdock_connections_dropped_total", "reason", "frame_timeout",
             st->timeouts_frame);
    sample_u(&b, "kvdock_connections_dropped_total", "reason", "socket_memory",
             st->refused_socket_mem);
    sample_u(&b, "kvdock_connections_dropped_total", "reason", "no_descriptors",
             st->refused_no_fd);
    family(&b, "kvdock_inflight_requests", "gauge",
           "requests handed to the backend and not yet completed");
    sb_printf(&b, "kvdock_inflight_requests %u\n", srv->inflight);
    family(&b, "kvdock_socket_received_bytes_total", "counter",
           "bytes read from client sockets");
    sb_printf(&b, "kvdock_socket_received_bytes_total %" PRIu64 "\n", st->bytes_in);
    family(&b, "kvdock_socket_sent_bytes_total", "counter", "bytes written to client sockets");
    sb_printf(&b, "kvdock_socket_sent_bytes_total %" PRIu64 "\n", st->bytes_out);
    if (srv->metrics != NULL) {
        family(&b, "kvdock_metrics_scrapes_total", "counter", "GET /metrics answered");
        sb_printf(&b, "kvdock_metrics_scrapes_total %" PRIu64 "\n",
                  kvd__metrics_scrapes(srv->metrics));
    }

    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}

