/* The Prometheus endpoint's serving: the address, the listener and the
 * HTTP exchange (see metrics.h); the text it serves is metrics_render.c's. */
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
#include "wire.h"
#include "log.h"
#include "server.h"

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

typedef struct mconn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_write_t wr;
    uv_shutdown_t sd;
    kvd__metrics_t *m;
    char req[KVD_METRICS_MAX_REQUEST];
    size_t len;
    char *resp;
    int responded;
    int closing;
    int handles; /* open: tcp, timer */
    struct mconn *next, *prev;
} mconn_t;

struct kvd__metrics {
    kvd__server_t *srv;
    uv_tcp_t listener;
    kvd__metrics_addr_t addr;
    uint16_t port;
    char address[80];  /* HOST:PORT ([V6]:PORT) bound */
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

kvd_status_t kvd__metrics_parse_addr(const char *spec, int allow_remote, kvd__metrics_addr_t *out,
                                     char *err, size_t err_len)
{
    kvd__metrics_addr_t a;
    char host[sizeof(((kvd__metrics_addr_t *)0)->host)];
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

uint64_t kvd__metrics_scrapes(const kvd__metrics_t *m)
{
    return m != NULL ? m->scrapes : 0;
}

/* ---- HTTP -------------------------------------------------------------- */

static void timeout_cb(uv_timer_t *t);

static void maybe_free(kvd__metrics_t *m)
{
    if (m->handles == 0 && m->free_when_closed)
        free(m);
}

static void listener_closed_cb(uv_handle_t *h)
{
    kvd__metrics_t *m = h->data;

    m->handles--;
    maybe_free(m);
}

static void conn_handle_closed_cb(uv_handle_t *h)
{
    mconn_t *c = h->data;
    kvd__metrics_t *m = c->m;

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
        text = kvd__metrics_render(c->m->srv, &len);
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
    kvd__metrics_t *m = server->data;
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

kvd_status_t kvd__metrics_create(kvd__server_t *srv, kvd__metrics_t **out, char *why,
                                 size_t why_len)
{
    kvd__metrics_t *m;
    struct sockaddr_storage ss;
    int len = sizeof(ss), rc;
    kvd_status_t st;

    m = calloc(1, sizeof(*m));
    if (m == NULL)
        return KVD_ENOMEM;
    m->srv = srv;
    st = kvd__metrics_parse_addr(srv->opts.metrics, srv->opts.metrics_allow_remote, &m->addr, why,
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
    snprintf(m->address, sizeof(m->address), "%s%s%s:%u", m->addr.family == AF_INET6 ? "[" : "",
             m->addr.host, m->addr.family == AF_INET6 ? "]" : "", (unsigned)m->port);
    kvd_log(KVD_LOG_INFO, "event=metrics_listening addr=%s port=%u url=http://%s%s%s:%u/metrics",
            m->addr.host, (unsigned)m->port, m->addr.family == AF_INET6 ? "[" : "",
            m->addr.host, m->addr.family == AF_INET6 ? "]" : "", (unsigned)m->port);
    *out = m;
    return KVD_OK;
}

uint16_t kvd__metrics_port(const kvd__metrics_t *m)
{
    return m ? m->port : 0;
}

const char *kvd__metrics_address(const kvd__metrics_t *m)
{
    return m ? m->address : "";
}

void kvd__metrics_close(kvd__metrics_t *m)
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

void kvd__metrics_destroy(kvd__metrics_t **mp)
{
    kvd__metrics_t *m = mp ? *mp : NULL;

    if (m == NULL)
        return;
    *mp = NULL;
    kvd__metrics_close(m);
    m->free_when_closed = 1; /* freed here, or by the last close callback */
    maybe_free(m);
}
