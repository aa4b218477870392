/* The Prometheus endpoint: see metrics.h. */
#include "metrics.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "conn.h"
#include "dispatch.h"
#include "kvdock/wire.h"
#include "log.h"
#include "server.h"

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

typedef struct mconn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_write_t wr;
    uv_shutdown_t sd;
    kvd_metrics_t *m;
    char req[KVD_METRICS_MAX_REQUEST];
    size_t len;
    char *resp;
    int responded;
    int closing;
    int handles; /* open: tcp, timer */
    struct mconn *next, *prev;
} mconn_t;

struct kvd_metrics {
    kvd_server_t *srv;
    uv_tcp_t listener;
    kvd_metrics_addr_t addr;
    uint16_t port;
    mconn_t *conns;
    int nconns;
    int handles;   /* the listener and every connection's handles */
    int closing;
    int free_when_closed;
    uint64_t scrapes;
};

/* ---- the address ------------------------------------------------------- */

static int parse_port(const char *s, uint16_t *out)
{
    unsigned long v = 0;

    if (*s == '\0' || strlen(s) > 5)
        return -1;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s))
            return -1;
        v = v * 10 + (unsigned long)(*s - '0');
    }
    if (v > 65535)
        return -1;
    *out = (uint16_t)v;
    return 0;
}

kvd_status_t kvd_metrics_parse_addr(const char *spec, int allow_remote, kvd_metrics_addr_t *out,
                                    char *err, size_t err_len)
{
    kvd_metrics_addr_t a;
    char host[sizeof(((kvd_metrics_addr_t *)0)->host)];
    const char *port;
    size_t hlen;

    memset(&a, 0, sizeof(a));
    if (spec == NULL || spec[0] == '\0') {
        kvd__seterr(err, err_len, "metrics: empty address");
        return KVD_EINVAL;
    }
    if (spec[0] == '[') { /* [v6]:port */
        const char *close = strchr(spec, ']');
        if (close == NULL || close[1] != ':') {
            kvd__seterr(err, err_len, "metrics: '%s' is not [IPV6]:PORT", spec);
            return KVD_EINVAL;
        }
        hlen = (size_t)(close - spec - 1);
        if (hlen == 0 || hlen >= sizeof(host)) {
            kvd__seterr(err, err_len, "metrics: bad IPv6 address in '%s'", spec);
            return KVD_EINVAL;
        }
        memcpy(host, spec + 1, hlen);
        host[hlen] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(spec, ':');
        if (colon == NULL) {
            snprintf(host, sizeof(host), "127.0.0.1"); /* a bare port: loopback */
            port = spec;
        } else {
            hlen = (size_t)(colon - spec);
            if (memchr(spec, ':', hlen) != NULL) {
                kvd__seterr(err, err_len, "metrics: write an IPv6 address as [ADDR]:PORT ('%s')",
                       spec);
                return KVD_EINVAL;
            }
            if (hlen == 0 || hlen >= sizeof(host)) {
                kvd__seterr(err, err_len, "metrics: '%s' needs a host before ':' (or just a port)",
                       spec);
                return KVD_EINVAL;
            }
            memcpy(host, spec, hlen);
            host[hlen] = '\0';
            port = colon + 1;
        }
    }
    if (parse_port(port, &a.port) != 0) {
        kvd__seterr(err, err_len, "metrics: '%s' is not a port (0..65535) in '%s'", port, spec);
        return KVD_EINVAL;
    }
    if (strcmp(host, "localhost") == 0)
        snprintf(host, sizeof(host), "127.0.0.1");
    {
        struct in_addr v4;
        struct in6_addr v6;

        if (inet_pton(AF_INET, host, &v4) == 1) {
            a.family = AF_INET;
            a.loopback = (ntohl(v4.s_addr) >> 24) == 127;
        } else if (inet_pton(AF_INET6, host, &v6) == 1) {
            a.family = AF_INET6;
            a.loopback = IN6_IS_ADDR_LOOPBACK(&v6);
        } else {
            kvd__seterr(err, err_len,
                   "metrics: '%s' is not a numeric address (or localhost); names are not "
                   "looked up",
                   host);
            return KVD_EINVAL;
        }
    }
    snprintf(a.host, sizeof(a.host), "%s", host);
    if (!a.loopback && !allow_remote) {
        kvd__seterr(err, err_len,
               "metrics: %s is not a loopback address and the endpoint has no authentication; "
               "set metrics-allow-remote = yes to serve it beyond this host",
               host);
        return KVD_EINVAL;
    }
    *out = a;
    return KVD_OK;
}

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

static const char *kind_name(int kind)
{
    switch (kind) {
    case KVD_MEM_HOST: return "host";
    case KVD_MEM_DEVICE: return "device";
    case KVD_MEM_DEVICE_VMM: return "device-vmm";
    }
    return "unknown";
}

#define NKINDS 4 /* index = enum kvd_mem_kind; 0: unknown */

char *kvd_metrics_render(const kvd_server_t *srv, size_t *len)
{
    const kvd_stats_t *st = &srv->stats;
    sbuf_t b = {0};
    uint64_t now = kvd_now_ns();
    uint64_t pools[NKINDS] = {0}, pool_bytes[NKINDS] = {0};
    uint64_t imp_pools[NKINDS] = {0}, imp_bytes[NKINDS] = {0};
    const kvd_pool_t *p;
    const kvd_conn_t *c;
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
        const kvd_op_counters_t *o = &st->ops[i];
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
    for (k = 0; k < KVD_SC_COUNT; k++)
        sample_u(&b, "kvdock_stream_queue_depth", "stream", kvd_stream_class_name(k),
                 st->streams[k].depth);
    family(&b, "kvdock_stream_busy_seconds_total", "counter",
           "time the stream class had work queued or running");
    for (k = 0; k < KVD_SC_COUNT; k++)
        sample_d(&b, "kvdock_stream_busy_seconds_total", "stream", kvd_stream_class_name(k),
                 (double)kvd_stats_stream_busy(st, k, now) / 1e9);
    family(&b, "kvdock_stream_launches_total", "counter",
           "operations completed on the stream class");
    for (k = 0; k < KVD_SC_COUNT; k++)
        sample_u(&b, "kvdock_stream_launches_total", "stream", kvd_stream_class_name(k),
                 st->streams[k].launches);
    family(&b, "kvdock_stream_bytes_total", "counter", "bytes moved on the stream class");
    for (k = 0; k < KVD_SC_COUNT; k++)
        sample_u(&b, "kvdock_stream_bytes_total", "stream", kvd_stream_class_name(k),
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
        sample_u(&b, "kvdock_pools", "kind", kind_name(k), pools[k]);
    family(&b, "kvdock_pool_bytes", "gauge",
           "bytes of live pools allocated by kvdockd, by memory kind");
    for (k = 1; k < NKINDS; k++)
        sample_u(&b, "kvdock_pool_bytes", "kind", kind_name(k), pool_bytes[k]);
    family(&b, "kvdock_imported_pools", "gauge",
           "live pools over clients' own memory, by memory kind");
    for (k = 1; k < NKINDS; k++)
        sample_u(&b, "kvdock_imported_pools", "kind", kind_name(k), imp_pools[k]);
    family(&b, "kvdock_imported_pool_bytes", "gauge",
           "bytes addressed by pools over clients' own memory, by memory kind");
    for (k = 1; k < NKINDS; k++)
        sample_u(&b, "kvdock_imported_pool_bytes", "kind", kind_name(k), imp_bytes[k]);
    family(&b, "kvdock_memory_bytes", "gauge",
           "bytes of pools and buffers allocated by kvdockd and not yet released");
    sb_printf(&b, "kvdock_memory_bytes %" PRIu64 "\n", srv->reg.live_bytes);
    family(&b, "kvdock_host_memory_budget_bytes", "gauge",
           "host memory kvdockd may reserve for its clients (host-memory-budget)");
    sb_printf(&b, "kvdock_host_memory_budget_bytes %" PRIu64 "\n", srv->hostmem.budget);
    family(&b, "kvdock_host_memory_bytes", "gauge",
           "host memory held against the budget, by kind");
    for (k = 0; k < KVD_HM_COUNT; k++)
        sample_u(&b, "kvdock_host_memory_bytes", "kind", kvd_hostmem_kind_name(k),
                 srv->hostmem.used[k]);
    family(&b, "kvdock_host_memory_limit_bytes", "gauge",
           "the most each kind of host memory may hold");
    for (k = 0; k < KVD_HM_COUNT; k++)
        sample_u(&b, "kvdock_host_memory_limit_bytes", "kind", kvd_hostmem_kind_name(k),
                 srv->hostmem.cap[k]);
    family(&b, "kvdock_host_memory_refused_total", "counter",
           "host-memory reservations refused (budget, kind's limit or the machine's memory)");
    for (k = 0; k < KVD_HM_COUNT; k++)
        sample_u(&b, "kvdock_host_memory_refused_total", "kind", kvd_hostmem_kind_name(k),
                 srv->hostmem.refused[k]);
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
        sb_printf(&b, "kvdock_metrics_scrapes_total %" PRIu64 "\n", srv->metrics->scrapes);
    }

    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}

/* ---- HTTP -------------------------------------------------------------- */

static void timeout_cb(uv_timer_t *t);

static void maybe_free(kvd_metrics_t *m)
{
    if (m->handles == 0 && m->free_when_closed)
        free(m);
}

static void listener_closed_cb(uv_handle_t *h)
{
    kvd_metrics_t *m = h->data;

    m->handles--;
    maybe_free(m);
}

static void conn_handle_closed_cb(uv_handle_t *h)
{
    mconn_t *c = h->data;
    kvd_metrics_t *m = c->m;

    m->handles--;
    if (--c->handles > 0)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        m->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    m->nconns--;
    free(c->resp);
    free(c);
    maybe_free(m);
}

static void conn_close(mconn_t *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    uv_close((uv_handle_t *)&c->tcp, conn_handle_closed_cb);
    uv_close((uv_handle_t *)&c->timer, conn_handle_closed_cb);
}

static void shutdown_cb(uv_shutdown_t *req, int status)
{
    conn_close(req->data);
}

static void write_cb(uv_write_t *req, int status)
{
    mconn_t *c = req->data;

    if (c->closing)
        return;
    c->sd.data = c;
    if (status < 0 || uv_shutdown(&c->sd, (uv_stream_t *)&c->tcp, shutdown_cb) != 0)
        conn_close(c);
}

static const char *reason(int code)
{
    switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    }
    return "Error";
}

/* Send one response and close; body is taken (malloc'd) or copied (text). */
static void respond(mconn_t *c, int code, const char *ctype, char *body, size_t body_len,
                    int head_only, const char *extra_header)
{
    char hdr[512];
    int n;
    uv_buf_t buf;

    c->responded = 1;
    uv_read_stop((uv_stream_t *)&c->tcp);
    /* the reply, too, must be taken within the deadline */
    uv_timer_start(&c->timer, timeout_cb, KVD_METRICS_TIMEOUT_MS, 0);
    n = snprintf(hdr, sizeof(hdr),
                 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                 "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
                 code, reason(code), ctype, body_len, extra_header ? extra_header : "");
    c->resp = malloc((size_t)n + (head_only ? 0 : body_len));
    if (c->resp == NULL) {
        free(body);
        conn_close(c);
        return;
    }
    memcpy(c->resp, hdr, (size_t)n);
    if (!head_only && body_len)
        memcpy(c->resp + n, body, body_len);
    free(body);
    buf = uv_buf_init(c->resp, (unsigned)((size_t)n + (head_only ? 0 : body_len)));
    c->wr.data = c;
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &buf, 1, write_cb) != 0)
        conn_close(c);
}

static void respond_text(mconn_t *c, int code, const char *text, int head_only,
                         const char *extra_header)
{
    char *body = strdup(text);

    if (body == NULL) {
        conn_close(c);
        return;
    }
    respond(c, code, "text/plain; charset=utf-8", body, strlen(text), head_only, extra_header);
}

static void timeout_cb(uv_timer_t *t)
{
    conn_close(t->data);
}

static int token_char(int ch)
{
    return ch > 0x20 && ch < 0x7f;
}

/* A whole request head is in c->req[0..end): answer it. */
static void handle_request(mconn_t *c, size_t line_end)
{
    char line[KVD_METRICS_MAX_REQUEST];
    char *method, *target, *version, *sp1, *sp2, *q;
    size_t n = line_end;
    int head;

    if (n > 0 && c->req[n - 1] == '\r')
        n--;
    memcpy(line, c->req, n);
    line[n] = '\0';
    sp1 = strchr(line, ' ');
    sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (sp1 == NULL || sp2 == NULL || strchr(sp2 + 1, ' ') != NULL) {
        respond_text(c, 400, "bad request line\n", 0, NULL);
        return;
    }
    *sp1 = *sp2 = '\0';
    method = line;
    target = sp1 + 1;
    version = sp2 + 1;
    for (q = line; *q; q++) {
        if (!token_char((unsigned char)*q)) {
            respond_text(c, 400, "bad request line\n", 0, NULL);
            return;
        }
    }
    for (q = target; *q; q++) {
        if (!token_char((unsigned char)*q)) {
            respond_text(c, 400, "bad request target\n", 0, NULL);
            return;
        }
    }
    for (q = version; *q; q++) {
        if (!token_char((unsigned char)*q)) {
            respond_text(c, 400, "bad HTTP version\n", 0, NULL);
            return;
        }
    }
    if (strncmp(version, "HTTP/", 5) != 0 || method[0] == '\0' || target[0] == '\0') {
        respond_text(c, 400, "not an HTTP request\n", 0, NULL);
        return;
    }
    if (strcmp(version, "HTTP/1.0") != 0 && strcmp(version, "HTTP/1.1") != 0) {
        respond_text(c, 505, "HTTP/1.0 and HTTP/1.1 only\n", 0, NULL);
        return;
    }
    head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET") != 0) {
        respond_text(c, 405, "GET or HEAD only\n", 0, "Allow: GET, HEAD\r\n");
        return;
    }
    q = strchr(target, '?');
    if (q)
        *q = '\0';
    if (strcmp(target, "/metrics") != 0) {
        respond_text(c, 404, "not found: kvdockd serves /metrics only\n", head, NULL);
        return;
    }
    {
        size_t len = 0;
        char *text;

        c->m->scrapes++;
        text = kvd_metrics_render(c->m->srv, &len);
        if (text == NULL) {
            respond_text(c, 500, "out of memory\n", head, NULL);
            return;
        }
        respond(c, 200, CONTENT_TYPE, text, len, head, NULL);
    }
}

/* The end of the request head (after the blank line), or 0. */
static size_t head_end(const char *s, size_t len)
{
    size_t i;

    for (i = 0; i + 1 < len; i++) {
        if (s[i] != '\n')
            continue;
        if (s[i + 1] == '\n')
            return i + 2;
        if (s[i + 1] == '\r' && i + 2 < len && s[i + 2] == '\n')
            return i + 3;
    }
    return 0;
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    mconn_t *c = h->data;

    *buf = uv_buf_init(c->req + c->len, (unsigned)(sizeof(c->req) - c->len));
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    mconn_t *c = s->data;
    char *nl;

    if (c->responded || c->closing)
        return;
    if (nread < 0) {
        conn_close(c); /* gone before a whole request */
        return;
    }
    c->len += (size_t)nread;
    nl = memchr(c->req, '\n', c->len);
    if (nl != NULL && head_end(c->req, c->len) != 0) {
        uv_timer_stop(&c->timer);
        handle_request(c, (size_t)(nl - c->req));
        return;
    }
    if (c->len == sizeof(c->req))
        respond_text(c, 431, "request head too large\n", 0, NULL);
}

static void on_connection(uv_stream_t *server, int status)
{
    kvd_metrics_t *m = server->data;
    mconn_t *c;

    if (status < 0) {
        kvd_log(KVD_LOG_WARN, "event=metrics_accept_error error=\"%s\"", uv_strerror(status));
        return;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return;
    c->m = m;
    uv_tcp_init(server->loop, &c->tcp);
    uv_timer_init(server->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->handles = 2;
    m->handles += 2;
    c->next = m->conns;
    if (m->conns)
        m->conns->prev = c;
    m->conns = c;
    m->nconns++;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    if (m->closing || m->nconns > KVD_METRICS_MAX_CONNS) {
        kvd_log(KVD_LOG_WARN, "event=metrics_busy conns=%d", m->nconns - 1);
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_timer_start(&c->timer, timeout_cb, KVD_METRICS_TIMEOUT_MS, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) != 0)
        conn_close(c);
}

kvd_status_t kvd_metrics_create(kvd_server_t *srv, kvd_metrics_t **out, char *why,
                                size_t why_len)
{
    kvd_metrics_t *m;
    struct sockaddr_storage ss;
    int len = sizeof(ss), rc;
    kvd_status_t st;

    m = calloc(1, sizeof(*m));
    if (m == NULL)
        return KVD_ENOMEM;
    m->srv = srv;
    st = kvd_metrics_parse_addr(srv->opts.metrics, srv->opts.metrics_allow_remote, &m->addr, why,
                                why_len);
    if (st != KVD_OK) {
        free(m);
        return st;
    }
    memset(&ss, 0, sizeof(ss));
    if (m->addr.family == AF_INET)
        rc = uv_ip4_addr(m->addr.host, m->addr.port, (struct sockaddr_in *)&ss);
    else
        rc = uv_ip6_addr(m->addr.host, m->addr.port, (struct sockaddr_in6 *)&ss);
    if (rc != 0) {
        kvd__seterr(why, why_len, "metrics: bad address %s: %s", m->addr.host, uv_strerror(rc));
        free(m);
        return KVD_EINVAL;
    }
    uv_tcp_init(srv->loop, &m->listener);
    m->listener.data = m;
    m->handles = 1;
    rc = uv_tcp_bind(&m->listener, (const struct sockaddr *)&ss,
                     m->addr.family == AF_INET6 ? UV_TCP_IPV6ONLY : 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&m->listener, 64, on_connection);
    if (rc == 0)
        rc = uv_tcp_getsockname(&m->listener, (struct sockaddr *)&ss, &len);
    if (rc != 0) {
        kvd__seterr(why, why_len, "metrics: cannot listen on %s port %u: %s", m->addr.host,
               (unsigned)m->addr.port, uv_strerror(rc));
        m->free_when_closed = 1;
        m->closing = 1;
        uv_close((uv_handle_t *)&m->listener, listener_closed_cb);
        return rc == UV_EADDRINUSE ? KVD_EBUSY : KVD_EIO;
    }
    m->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                            : ((struct sockaddr_in6 *)&ss)->sin6_port);
    kvd_log(KVD_LOG_INFO, "event=metrics_listening addr=%s port=%u url=http://%s%s%s:%u/metrics",
            m->addr.host, (unsigned)m->port, m->addr.family == AF_INET6 ? "[" : "",
            m->addr.host, m->addr.family == AF_INET6 ? "]" : "", (unsigned)m->port);
    *out = m;
    return KVD_OK;
}

uint16_t kvd_metrics_port(const kvd_metrics_t *m)
{
    return m ? m->port : 0;
}

void kvd_metrics_close(kvd_metrics_t *m)
{
    mconn_t *c, *next;

    if (m == NULL || m->closing)
        return;
    m->closing = 1;
    uv_close((uv_handle_t *)&m->listener, listener_closed_cb);
    for (c = m->conns; c; c = next) {
        next = c->next;
        conn_close(c);
    }
}

void kvd_metrics_destroy(kvd_metrics_t **mp)
{
    kvd_metrics_t *m = mp ? *mp : NULL;

    if (m == NULL)
        return;
    *mp = NULL;
    kvd_metrics_close(m);
    m->free_when_closed = 1; /* freed here, or by the last close callback */
    maybe_free(m);
}
