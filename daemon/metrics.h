/*
 * The Prometheus endpoint: `--metrics [HOST:]PORT` serves GET /metrics
 * (text exposition format 0.0.4) over HTTP/1.0 and 1.1 on the daemon's
 * own libuv loop (uv_tcp, no thread).  Every value is read from the
 * server's counters (stats.h), registry and connection list at scrape
 * time: the stats module stays the one source of truth.
 *
 * The request parser is small on purpose: one request per connection
 * (the reply says Connection: close), a request line and headers of at
 * most KVD_METRICS_MAX_REQUEST bytes, a read deadline, and a cap on
 * connections at once; anything else is answered 400/404/405/431/505 or
 * dropped.
 */
#ifndef KVD_DAEMON_METRICS_H
#define KVD_DAEMON_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "kvdock/status.h"

#define KVD_METRICS_MAX_REQUEST 8192 /* request line + headers */
#define KVD_METRICS_MAX_CONNS 32     /* scrapers at once */
#define KVD_METRICS_TIMEOUT_MS 10000 /* to send the whole request */

typedef struct kvd__server kvd__server_t;
typedef struct kvd__metrics kvd__metrics_t;

/* A parsed --metrics value. */
typedef struct kvd__metrics_addr {
    int family;         /* AF_INET or AF_INET6 */
    char host[64];      /* numeric address */
    uint16_t port;      /* 0: any free port */
    int loopback;       /* 127.0.0.0/8 or ::1 */
} kvd__metrics_addr_t;

/*
 * Parse "PORT", "HOST:PORT" or "[V6]:PORT".  A bare port means
 * 127.0.0.1; HOST is "localhost" or a numeric address (no name lookups).
 * A non-loopback address is refused unless allow_remote is set (the
 * endpoint has no authentication).  KVD_EINVAL with a message in err.
 */
kvd_status_t kvd__metrics_parse_addr(const char *spec, int allow_remote, kvd__metrics_addr_t *out,
                                     char *err, size_t err_len);

/* Start listening on srv->opts.metrics (which must be set). */
kvd_status_t kvd__metrics_create(kvd__server_t *srv, kvd__metrics_t **out, char *why,
                                 size_t why_len);
/* The port bound (useful with port 0). */
uint16_t kvd__metrics_port(const kvd__metrics_t *m);
/* HOST:PORT ([V6]:PORT) bound, the port as picked; "" for NULL. */
const char *kvd__metrics_address(const kvd__metrics_t *m);
/* Stop listening and close every scrape connection (loop callbacks
 * finish the job; run the loop afterwards). */
void kvd__metrics_close(kvd__metrics_t *m);
/* Free, once the loop has run the close callbacks; NULL is fine. */
void kvd__metrics_destroy(kvd__metrics_t **m);

/* GET /metrics answered so far (0 for NULL). */
uint64_t kvd__metrics_scrapes(const kvd__metrics_t *m);

/* The exposition text of srv's counters, malloc'd (*len bytes, NUL
 * terminated); NULL when out of memory (metrics_render.c). */
char *kvd__metrics_render(const kvd__server_t *srv, size_t *len);

#endif
