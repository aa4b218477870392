/*
 * kvdock top: a live terminal view of kvdockd.
 *
 * Every interval it asks the daemon for its status (clients, in flight),
 * its counters (per operation, per stream class), its pools and caches, and shows
 * rates from the difference with the previous sample.  Plain ANSI escape
 * sequences, no curses: the alternate screen, the cursor hidden, each
 * frame drawn from the top-left corner; the terminal in non-canonical
 * mode without echo so that one key ('q') quits.  Everything is undone on
 * the way out, whether by 'q', Ctrl-C (SIGINT), SIGTERM or SIGHUP.
 *
 * --once prints one frame without any terminal control (two samples
 * --interval apart, so the rates are real) for scripts; when stdout is
 * not a terminal, frames are printed one after the other the same way
 * (like `top -b`), until --count frames or a signal.  --json prints each
 * frame as one JSON object on a line of its own (the same rates).
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "kvdock/client.h"

#define MAX_OPS 64
#define MAX_STREAMS 16
#define MAX_CLIENTS 4096
#define MAX_POOLS 4096
#define MAX_CACHES 256
#define MAX_LINES 512
#define LINE_MAX_BYTES 512

/* ---- samples ------------------------------------------------------------- */

typedef struct sample {
    uint64_t t_ns;
    kvd_daemon_status_t status;
    kvd_client_entry_t *clients;
    size_t nclients;
    kvd_daemon_stats_t stats;
    kvd_op_stats_t *ops;
    size_t nops;
    kvd_stream_stats_t streams[MAX_STREAMS];
    size_t nstreams;
    kvd_pool_info_t *pools;
    size_t npools;
    kvd_cache_info_t *caches;
    size_t ncaches;
    int valid;
} sample_t;

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int sample_alloc(sample_t *s)
{
    memset(s, 0, sizeof(*s));
    s->clients = calloc(MAX_CLIENTS, sizeof(*s->clients));
    s->ops = calloc(MAX_OPS, sizeof(*s->ops));
    s->pools = calloc(MAX_POOLS, sizeof(*s->pools));
    s->caches = calloc(MAX_CACHES, sizeof(*s->caches));
    return s->clients && s->ops && s->pools && s->caches ? 0 : -1;
}

static void sample_free(sample_t *s)
{
    free(s->clients);
    free(s->ops);
    free(s->pools);
    free(s->caches);
    memset(s, 0, sizeof(*s));
}

static void sample_swap(sample_t *a, sample_t *b)
{
    sample_t t = *a;

    *a = *b;
    *b = t;
}

/* One sample; KVD_OK or the failing call's status (*what says which). */
static kvd_status_t take_sample(kvd_client_t *cli, sample_t *s, const char **what)
{
    kvd_status_t st;
    size_t n = 0;

    s->valid = 0;
    *what = "status";
    st = kvd_daemon_status(cli, &s->status, s->clients, MAX_CLIENTS);
    if (st != KVD_OK)
        return st;
    s->nclients = s->status.num_clients < MAX_CLIENTS ? s->status.num_clients : MAX_CLIENTS;
    *what = "stats";
    st = kvd_daemon_stats(cli, &s->stats, s->ops, MAX_OPS, s->streams, MAX_STREAMS);
    if (st != KVD_OK)
        return st;
    s->nops = s->stats.num_ops < MAX_OPS ? s->stats.num_ops : MAX_OPS;
    s->nstreams = s->stats.num_streams < MAX_STREAMS ? s->stats.num_streams : MAX_STREAMS;
    *what = "pools";
    /* an operator's view: every client's pools (an admin's), else ours */
    st = kvd_pool_list_all(cli, s->pools, MAX_POOLS, &n);
    if (st == KVD_EPERM)
        st = kvd_pool_list(cli, s->pools, MAX_POOLS, &n);
    if (st != KVD_OK)
        return st;
    s->npools = n < MAX_POOLS ? n : MAX_POOLS;
    *what = "caches";
    st = kvd_cache_list(cli, s->caches, MAX_CACHES, &n);
    if (st != KVD_OK)
        return st;
    s->ncaches = n < MAX_CACHES ? n : MAX_CACHES;
    s->t_ns = now_ns();
    s->valid = 1;
    return KVD_OK;
}

/* ---- the frame: lines of text, some styled ------------------------------ */

enum { STYLE_PLAIN = 0, STYLE_TITLE = 1, STYLE_HEAD = 2, STYLE_WARN = 3 };

typedef struct frame {
    char line[MAX_LINES][LINE_MAX_BYTES];
    int style[MAX_LINES];
    int n;
} frame_t;

static void fline(frame_t *f, int style, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fline(frame_t *f, int style, const char *fmt, ...)
{
    va_list ap;

    if (f->n >= MAX_LINES)
        return;
    va_start(ap, fmt);
    vsnprintf(f->line[f->n], LINE_MAX_BYTES, fmt, ap);
    va_end(ap);
    f->style[f->n++] = style;
}

static void human_rate(char *buf, size_t cap, double per_s)
{
    char b[32];

    kvd__cli_human_bytes(b, sizeof(b), per_s);
    snprintf(buf, cap, "%s/s", b);
}

static void human_uptime(char *buf, size_t cap, uint64_t ms)
{
    uint64_t s = ms / 1000;

    if (s >= 86400)
        snprintf(buf, cap, "%" PRIu64 "d %02" PRIu64 ":%02" PRIu64 ":%02" PRIu64, s / 86400,
                 s % 86400 / 3600, s % 3600 / 60, s % 60);
    else
        snprintf(buf, cap, "%02" PRIu64 ":%02" PRIu64 ":%02" PRIu64, s / 3600, s % 3600 / 60,
                 s % 60);
}

static double rate(uint64_t cur, uint64_t prev, double dt)
{
    return dt > 0 && cur >= prev ? (double)(cur - prev) / dt : 0;
}

static const kvd_op_stats_t *find_op(const sample_t *s, const char *name)
{
    size_t i;

    for (i = 0; s->valid && i < s->nops; i++)
        if (strcmp(s->ops[i].op, name) == 0)
            return &s->ops[i];
    return NULL;
}

static const kvd_stream_stats_t *find_stream(const sample_t *s, const char *name)
{
    size_t i;

    for (i = 0; s->valid && i < s->nstreams; i++)
        if (strcmp(s->streams[i].name, name) == 0)
            return &s->streams[i];
    return NULL;
}

static const kvd_cache_info_t *find_cache(const sample_t *s, uint64_t id)
{
    for (size_t i = 0; s->valid && i < s->ncaches; i++)
        if (s->caches[i].id == id)
            return &s->caches[i];
    return NULL;
}

/* The cache tier: each cache's contents, and over the last interval its
 * hit rate (tokens found of tokens asked for) and traffic; in room lines
 * at most (the header, the caches, a line for those not shown). */
static void cache_lines(frame_t *f, const sample_t *cur, const sample_t *prev, double dt,
                        int room)
{
    char used[32], budget[32], hit[16], in[48], out[48];

    if (cur->ncaches == 0)
        return;
    fline(f, STYLE_HEAD, "%-20s %9s %21s %7s %9s %11s %11s %8s %6s", "CACHE", "BLOCKS",
          "USED / BUDGET", "HIT", "LOOKUP/S", "SAVE", "LOAD", "EVICT/S", "LEASES");
    for (size_t i = 0; i < cur->ncaches; i++) {
        const kvd_cache_info_t *c = &cur->caches[i], *p = find_cache(prev, c->id);

        if ((int)i + 2 >= room && i + 1 < cur->ncaches) {
            fline(f, STYLE_PLAIN, "  ... %zu more caches (kvdock cache ls)", cur->ncaches - i);
            break;
        }
        uint64_t asked = c->keys_asked - (p ? p->keys_asked : 0);
        uint64_t hits = c->keys_hit - (p ? p->keys_hit : 0);
        char both[80];

        kvd__cli_human_bytes(used, sizeof(used), (double)c->used_bytes); /* as cache ls */
        kvd__cli_human_bytes(budget, sizeof(budget), (double)c->budget_bytes);
        snprintf(both, sizeof(both), "%s / %s", used, budget);
        if (p == NULL || dt <= 0) {
            fline(f, STYLE_PLAIN, "%-20.20s %9u %21s %7s %9s %11s %11s %8s %6u", c->name,
                  c->blocks, both, "-", "-", "-", "-", "-", c->leases);
            continue;
        }
        if (asked > 0)
            snprintf(hit, sizeof(hit), "%.1f%%", 100.0 * (double)hits / (double)asked);
        else
            snprintf(hit, sizeof(hit), "-");
        human_rate(in, sizeof(in), rate(c->bytes_in, p->bytes_in, dt));
        human_rate(out, sizeof(out), rate(c->bytes_out, p->bytes_out, dt));
        fline(f, STYLE_PLAIN, "%-20.20s %9u %21s %7s %9.1f %11s %11s %8.1f %6u", c->name,
              c->blocks, both, hit, rate(c->lookups, p->lookups, dt), in, out,
              rate(c->evictions, p->evictions, dt), c->leases);
    }
    fline(f, STYLE_PLAIN, "%s", "");
}

static const kvd_client_entry_t *find_client(const sample_t *s, uint64_t id)
{
    size_t i;

    for (i = 0; s->valid && i < s->nclients; i++)
        if (s->clients[i].id == id)
            return &s->clients[i];
    return NULL;
}

/* The cluster, when the daemon is in one: its peers' health in a line,
 * and what it pulls and serves. */
static void cluster_line(frame_t *f, const sample_t *cur, const sample_t *prev, double dt)
{
    const kvd_cluster_status_t *c = &cur->status.cluster, *p = &prev->status.cluster;
    uint32_t n = c->num_peers < KVD_CLUSTER_PEERS_MAX ? c->num_peers : KVD_CLUSTER_PEERS_MAX;
    uint32_t up = 0;
    char pulled[48], served[48], others[96] = "";
    size_t at = 0;

    if (!c->enabled)
        return;
    for (uint32_t i = 0; i < n; i++) {
        if (strcmp(c->peers[i].state, "up") == 0) {
            up++;
        } else if (at + 40 < sizeof(others)) {
            int w = snprintf(others + at, sizeof(others) - at, "%s%s %s", at ? ", " : " (",
                             c->peers[i].address, c->peers[i].state);
            at += w > 0 ? (size_t)w : 0;
        }
    }
    if (at > 0)
        snprintf(others + at, sizeof(others) - at, ")");
    human_rate(pulled, sizeof(pulled),
               prev->valid && dt > 0 ? rate(c->bytes_fetched, p->bytes_fetched, dt) : 0);
    human_rate(served, sizeof(served),
               prev->valid && dt > 0 ? rate(c->bytes_served, p->bytes_served, dt) : 0);
    if (n < c->num_peers) /* the client library carries the first KVD_CLUSTER_PEERS_MAX */
        fline(f, STYLE_PLAIN, "cluster: %s, %u of the first %u of %u peers up%s, pulling %s, "
              "serving %s", c->node, up, n, c->num_peers, others, pulled, served);
    else
        fline(f, STYLE_PLAIN, "cluster: %s, %u of %u peers up%s, pulling %s, serving %s", c->node,
              up, c->num_peers, others, pulled, served);
    fline(f, STYLE_PLAIN, "%s", "");
}

/* The disk level, when the daemon has one (--cache-dir): its use, and
 * over the last interval what the caches wrote to it and read back. */
static void disk_line(frame_t *f, const sample_t *cur, const sample_t *prev, double dt)
{
    const kvd_disk_status_t *d = &cur->status.disk;
    uint64_t wr = 0, rd = 0, hits = 0, pwr = 0, prd = 0, phits = 0;
    char used[32], budget[32], w[48], r[48], h[24];

    if (!d->enabled)
        return;
    for (size_t i = 0; i < cur->ncaches; i++) {
        const kvd_cache_info_t *c = &cur->caches[i], *p = find_cache(prev, c->id);
        wr += c->disk.write_bytes;
        rd += c->disk.read_bytes;
        hits += c->disk.hits;
        if (p != NULL) {
            pwr += p->disk.write_bytes;
            prd += p->disk.read_bytes;
            phits += p->disk.hits;
        } else { /* a new cache: no rate yet */
            pwr += c->disk.write_bytes;
            prd += c->disk.read_bytes;
            phits += c->disk.hits;
        }
    }
    kvd__cli_human_bytes(used, sizeof(used), (double)d->used_bytes);
    kvd__cli_human_bytes(budget, sizeof(budget), (double)d->budget_bytes);
    if (prev->valid && dt > 0) {
        human_rate(w, sizeof(w), rate(wr, pwr, dt));
        human_rate(r, sizeof(r), rate(rd, prd, dt));
        snprintf(h, sizeof(h), "%.1f/s", rate(hits, phits, dt));
    } else {
        snprintf(w, sizeof(w), "-");
        snprintf(r, sizeof(r), "-");
        snprintf(h, sizeof(h), "-");
    }
    fline(f, STYLE_PLAIN, "disk: %s of %s, %s%s  write %s  read %s  hits %s", used, budget,
          strncmp(d->io_engine, "io_uring", 8) == 0 ? "io_uring" : "threads",
          d->direct ? "" : " (page cache)", w, r, h);
    fline(f, STYLE_PLAIN, "%s", "");
}

/* Rows of a table of n entries at its least: its header and up to two
 * entries, and a line saying how many more. */
static int least_rows(size_t n)
{
    return 1 + (int)(n < 2 ? n : 2) + (n > 2);
}

/*
 * Build the frame of cur (rates against prev when it is valid).  rows:
 * the terminal's height (0: no limit).  On a short screen every section
 * keeps its header and a few rows, each table cut says how many it does
 * not show: the operations give way first (the busiest stay), then the
 * pools and caches, then the clients.  Tables fit 80 columns.
 */
static void build_frame(frame_t *f, kvd_client_t *cli, const sample_t *cur, const sample_t *prev,
                        int rows, const char *error)
{
    const kvd_hello_info_t *h = kvd_client_info(cli);
    double dt = prev->valid ? (double)(cur->t_ns - prev->t_ns) / 1e9 : 0;
    char a[48], b[48], c[48], d[48], e[112];
    uint64_t kind_bytes[4] = {0}, kind_pools[4] = {0};
    size_t i, ops_shown, ops_listed, ops_busy;
    uint64_t ops_min;
    int left;
    time_t wall = time(NULL);
    struct tm tm;

    f->n = 0;
    localtime_r(&wall, &tm);
    human_uptime(a, sizeof(a), cur->status.uptime_ms);
    fline(f, STYLE_TITLE, "kvdock top - kvdockd %s pid %u, backend %s, device %s, up %s%s  %02d:%02d:%02d",
          cur->status.daemon_version, h ? h->daemon_pid : 0,
          kvd_backend_name(cur->status.backend), cur->status.device_name, a,
          cur->status.shutting_down ? " (SHUTTING DOWN)" : "", tm.tm_hour, tm.tm_min, tm.tm_sec);
    if (error != NULL)
        fline(f, STYLE_WARN, "%s", error);
    kvd__cli_human_bytes(a, sizeof(a), (double)cur->status.pool_bytes);
    human_rate(b, sizeof(b), rate(cur->stats.bytes_in, prev->stats.bytes_in, dt));
    human_rate(c, sizeof(c), rate(cur->stats.bytes_out, prev->stats.bytes_out, dt));
    fline(f, STYLE_PLAIN,
          "clients %u   in flight %u   pools %u (%s)   buffers %u   events %u   socket in %s out %s",
          cur->status.clients, cur->status.inflight, cur->status.pools, a, cur->status.buffers,
          cur->status.events, prev->valid ? b : "-", prev->valid ? c : "-");
    if (!prev->valid)
        fline(f, STYLE_PLAIN, "(rates from the next refresh on)");
    fline(f, STYLE_PLAIN, "%s", "");

    /* streams */
    fline(f, STYLE_HEAD, "%-8s %5s %6s %6s %9s %12s %10s %12s", "STREAM", "PRIO", "QUEUED",
          "BUSY%", "OPS/S", "BYTES/S", "LAUNCHES", "BYTES");
    for (i = 0; i < cur->nstreams; i++) {
        const kvd_stream_stats_t *s = &cur->streams[i], *p = find_stream(prev, s->name);
        double busy = 0, ops = 0, bps = 0;

        if (p != NULL && dt > 0) {
            busy = s->busy_ns >= p->busy_ns ? (double)(s->busy_ns - p->busy_ns) / (dt * 1e9) * 100
                                            : 0;
            if (busy > 100)
                busy = 100;
            ops = rate(s->launches, p->launches, dt);
            bps = rate(s->bytes, p->bytes, dt);
        }
        human_rate(a, sizeof(a), bps);
        kvd__cli_human_bytes(b, sizeof(b), (double)s->bytes);
        if (p != NULL && dt > 0)
            fline(f, STYLE_PLAIN, "%-8s %5d %6u %5.1f%% %9.1f %12s %10" PRIu64 " %12s", s->name,
                  s->priority, s->queue_depth, busy, ops, a, s->launches, b);
        else
            fline(f, STYLE_PLAIN, "%-8s %5d %6u %6s %9s %12s %10" PRIu64 " %12s", s->name,
                  s->priority, s->queue_depth, "-", "-", "-", s->launches, b);
    }
    fline(f, STYLE_PLAIN, "%s", "");

    /* operations with traffic, the busiest first when they do not all fit:
     * what the sections below need at their least stays free for them */
    {
        int below = 1 + (cur->npools > 0 ? least_rows(cur->npools) : 0) + 1 +
                    (cur->ncaches > 0 ? least_rows(cur->ncaches) + 1 : 0) +
                    least_rows(cur->nclients) + (cur->status.cluster.enabled ? 2 : 0) +
                    (cur->status.disk.enabled ? 2 : 0);
        size_t busy = 0;

        for (i = 0; i < cur->nops; i++)
            busy += cur->ops[i].requests > 0;
        left = rows > 0 ? rows - f->n - 2 - below : 1 << 30;
        ops_shown = busy;
        if ((int)busy > left) /* room for the busiest, and a line for the rest */
            ops_shown = left > 1 ? (size_t)(left - 1) : 0;
        ops_min = 0;
        if (ops_shown < busy) { /* the requests of the ops_shown-th busiest */
            uint64_t *req = malloc(cur->nops * sizeof(*req));
            size_t n = 0, j, k;
            for (i = 0; req != NULL && i < cur->nops; i++) {
                const kvd_op_stats_t *p = find_op(prev, cur->ops[i].op);
                if (cur->ops[i].requests > 0)
                    req[n++] = cur->ops[i].requests - (p != NULL ? p->requests : 0);
            }
            for (j = 1; req != NULL && j < n; j++) /* descending */
                for (k = j; k > 0 && req[k] > req[k - 1]; k--) {
                    uint64_t t = req[k];
                    req[k] = req[k - 1];
                    req[k - 1] = t;
                }
            ops_min = req != NULL && ops_shown > 0 ? req[ops_shown - 1] : UINT64_MAX;
            free(req);
        }
        ops_busy = busy;
    }
    fline(f, STYLE_HEAD, "%-15s %8s %7s %11s %9s %11s %8s", "OP", "REQ/S", "ERR/S", "BYTES/S",
          "MEAN_US", "REQUESTS", "ERRORS");
    for (i = 0, ops_listed = 0; i < cur->nops; i++) {
        const kvd_op_stats_t *o = &cur->ops[i], *p = find_op(prev, o->op);
        double mean;

        if (o->requests == 0 || ops_listed >= ops_shown ||
            o->requests - (p != NULL ? p->requests : 0) < ops_min)
            continue;
        ops_listed++;
        if (p != NULL && dt > 0 && o->requests > p->requests)
            mean = (o->sum_us - p->sum_us) / (double)(o->requests - p->requests);
        else
            mean = o->sum_us / (double)o->requests;
        human_rate(a, sizeof(a), p ? rate(o->bytes, p->bytes, dt) : 0);
        if (p != NULL && dt > 0)
            fline(f, STYLE_PLAIN, "%-15s %8.1f %7.1f %11s %9.1f %11" PRIu64 " %8" PRIu64,
                  o->op, rate(o->requests, p->requests, dt), rate(o->errors, p->errors, dt), a,
                  mean, o->requests, o->errors);
        else
            fline(f, STYLE_PLAIN, "%-15s %8s %7s %11s %9.1f %11" PRIu64 " %8" PRIu64, o->op,
                  "-", "-", "-", mean, o->requests, o->errors);
    }
    if (ops_listed < ops_busy)
        fline(f, STYLE_PLAIN, "  ... %zu more operations (kvdock stats)", ops_busy - ops_listed);
    fline(f, STYLE_PLAIN, "%s", "");

    cluster_line(f, cur, prev, dt);
    disk_line(f, cur, prev, dt);

    /* pools: totals by kind, then the biggest first */
    for (i = 0; i < cur->npools; i++) {
        int k = cur->pools[i].kind >= 1 && cur->pools[i].kind <= 3 ? cur->pools[i].kind : 0;
        kind_bytes[k] += cur->pools[i].bytes;
        kind_pools[k]++;
    }
    kvd__cli_human_bytes(a, sizeof(a), (double)kind_bytes[KVD_MEM_HOST]);
    kvd__cli_human_bytes(b, sizeof(b), (double)kind_bytes[KVD_MEM_DEVICE]);
    kvd__cli_human_bytes(c, sizeof(c), (double)kind_bytes[KVD_MEM_DEVICE_VMM]);
    if (h != NULL && h->limits.max_total_pool_bytes > 0) {
        kvd__cli_human_bytes(d, sizeof(d), (double)h->limits.max_total_pool_bytes);
        snprintf(e, sizeof(e), ", %.1f%% of %s", 100.0 * (double)cur->status.pool_bytes /
                                                  (double)h->limits.max_total_pool_bytes, d);
    } else {
        e[0] = '\0';
    }
    fline(f, STYLE_PLAIN, "pools: host %" PRIu64 " (%s)   device %" PRIu64 " (%s)   device-vmm %" PRIu64
          " (%s)%s", kind_pools[KVD_MEM_HOST], a, kind_pools[KVD_MEM_DEVICE], b,
          kind_pools[KVD_MEM_DEVICE_VMM], c, e);
    {
        /* room: what is left once the client table has a few rows */
        size_t shown = cur->npools, order[MAX_POOLS], j, k;
        left = rows > 0 ? rows - f->n - 1 - /* the blank line below */
                              (cur->ncaches > 0 ? least_rows(cur->ncaches) + 1 : 0) -
                              least_rows(cur->nclients)
                        : 1 << 30;
        if (left < least_rows(cur->npools))
            left = least_rows(cur->npools);
        for (j = 0; j < cur->npools; j++)
            order[j] = j;
        for (j = 1; j < cur->npools; j++) /* by bytes, descending (insertion sort) */
            for (k = j; k > 0 && cur->pools[order[k]].bytes > cur->pools[order[k - 1]].bytes; k--) {
                size_t t = order[k];
                order[k] = order[k - 1];
                order[k - 1] = t;
            }
        if (cur->npools > 0) {
            fline(f, STYLE_HEAD, "%3s %-14s %-10s %6s %7s %6s %10s %6s %s", "ID", "NAME", "KIND",
                  "LAYERS", "SLOTS", "SLOT_B", "BYTES", "CLIENT", "FLAGS");
            left--; /* the header */
            if ((int)shown > left)
                shown = (size_t)(left > 1 ? left - 1 : 0);
            for (j = 0; j < shown; j++) {
                const kvd_pool_info_t *p = &cur->pools[order[j]];
                kvd__cli_human_bytes(a, sizeof(a), (double)p->bytes);
                fline(f, STYLE_PLAIN, "%3" PRIu64 " %-14.14s %-10s %6u %7" PRIu64 " %6" PRIu64
                      " %10s %6" PRIu64 " %s%s%s%s", p->id, p->name, kvd_mem_kind_name(p->kind),
                      p->num_layers, p->num_slots, p->slot_bytes, a, p->owner,
                      p->mla ? "mla" : "mha", p->shared ? ",shared" : "",
                      p->imported ? ",imported" : "", p->page_size > 1 ? ",paged" : "");
            }
            if (shown < cur->npools)
                fline(f, STYLE_PLAIN, "  ... %zu more pools", cur->npools - shown);
        }
    }
    fline(f, STYLE_PLAIN, "%s", "");
    left = rows > 0 ? rows - f->n - 1 - least_rows(cur->nclients) : 1 << 30;
    cache_lines(f, cur, prev, dt,
                left > least_rows(cur->ncaches) ? left : least_rows(cur->ncaches));

    /* clients */
    fline(f, STYLE_HEAD, "%4s %-22s %7s %6s %8s %5s %8s %10s", "ID", "CLIENT", "PID", "UID",
          "INFLIGHT", "POOLS", "REQ/S", "REQUESTS");
    left = rows > 0 ? rows - f->n : 1 << 30;
    for (i = 0; i < cur->nclients; i++) {
        const kvd_client_entry_t *cl = &cur->clients[i], *p = find_client(prev, cl->id);
        char name[KVD_NAME_MAX + 16];

        if ((int)i >= left - 1 && i + 1 < cur->nclients) {
            fline(f, STYLE_PLAIN, "  ... %zu more clients", cur->nclients - i);
            break;
        }
        snprintf(name, sizeof(name), "%s%s", cl->name,
                 h != NULL && cl->id == h->client_id ? " (this top)" : "");
        kvd__cli_printable(name);
        if (p != NULL && dt > 0)
            snprintf(a, sizeof(a), "%.1f", rate(cl->requests, p->requests, dt));
        else
            snprintf(a, sizeof(a), "-");
        fline(f, STYLE_PLAIN, "%4" PRIu64 " %-22.22s %7u %6u %8u %5u %8s %10" PRIu64, cl->id,
              name, cl->pid, cl->uid, cl->inflight, cl->pools, a, cl->requests);
    }
}

/* The frame of cur as one JSON object on a line (rates against prev;
 * null before a second sample). */
static void json_frame(const sample_t *cur, const sample_t *prev)
{
    double dt = prev->valid ? (double)(cur->t_ns - prev->t_ns) / 1e9 : 0;
    bool r = prev->valid && dt > 0, first;
    size_t i;

#define RATE(c, p) printf(r ? "%.3f" : "null", r ? rate((c), (p), dt) : 0.0)
    printf("{\"interval_s\":%.3f,\"uptime_ms\":%" PRIu64 ",\"clients\":%u,\"inflight\":%u,"
           "\"pools\":%u,\"pool_bytes\":%" PRIu64 ",\"buffers\":%u,\"events\":%u,"
           "\"shutting_down\":%s,\"bytes_in_per_s\":",
           dt, cur->status.uptime_ms, cur->status.clients, cur->status.inflight,
           cur->status.pools, cur->status.pool_bytes, cur->status.buffers, cur->status.events,
           cur->status.shutting_down ? "true" : "false");
    RATE(cur->stats.bytes_in, prev->stats.bytes_in);
    printf(",\"bytes_out_per_s\":");
    RATE(cur->stats.bytes_out, prev->stats.bytes_out);
    if (cur->status.disk.enabled) {
        const kvd_disk_status_t *d = &cur->status.disk;
        printf(",\"disk\":{\"cache_dir\":");
        kvd__cli_json_str(d->cache_dir);
        printf(",\"io_engine\":");
        kvd__cli_json_str(d->io_engine);
        printf(",\"direct\":%s,\"budget_bytes\":%" PRIu64 ",\"reserved_bytes\":%" PRIu64
               ",\"used_bytes\":%" PRIu64 ",\"fs_free_bytes\":%" PRIu64 "}",
               d->direct ? "true" : "false", d->budget_bytes, d->reserved_bytes, d->used_bytes,
               d->fs_free_bytes);
    } else {
        printf(",\"disk\":null");
    }
    printf(",\"streams\":[");
    for (i = 0; i < cur->nstreams; i++) {
        const kvd_stream_stats_t *s = &cur->streams[i], *p = find_stream(prev, s->name);
        kvd_stream_stats_t none;

        memset(&none, 0, sizeof(none));
        if (p == NULL)
            p = &none;
        printf("%s{\"name\":", i ? "," : "");
        kvd__cli_json_str(s->name);
        printf(",\"queued\":%u,\"launches\":%" PRIu64 ",\"bytes\":%" PRIu64
               ",\"launches_per_s\":",
               s->queue_depth, s->launches, s->bytes);
        RATE(s->launches, p->launches);
        printf(",\"bytes_per_s\":");
        RATE(s->bytes, p->bytes);
        if (r && s->busy_ns >= p->busy_ns)
            printf(",\"busy_pct\":%.1f", (double)(s->busy_ns - p->busy_ns) / (dt * 1e7));
        else
            printf(",\"busy_pct\":null");
        putchar('}');
    }
    printf("],\"ops\":[");
    for (i = 0, first = true; i < cur->nops; i++) {
        const kvd_op_stats_t *o = &cur->ops[i], *p = find_op(prev, o->op);
        kvd_op_stats_t none;

        if (o->requests == 0)
            continue;
        memset(&none, 0, sizeof(none));
        if (p == NULL)
            p = &none;
        printf("%s{\"op\":", first ? "" : ",");
        first = false;
        kvd__cli_json_str(o->op);
        printf(",\"requests\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"requests_per_s\":",
               o->requests, o->errors);
        RATE(o->requests, p->requests);
        printf(",\"errors_per_s\":");
        RATE(o->errors, p->errors);
        printf(",\"bytes_per_s\":");
        RATE(o->bytes, p->bytes);
        putchar('}');
    }
    printf("],\"caches\":[");
    for (i = 0; i < cur->ncaches; i++) {
        const kvd_cache_info_t *c = &cur->caches[i], *p = find_cache(prev, c->id);
        kvd_cache_info_t none;

        memset(&none, 0, sizeof(none));
        if (p == NULL)
            p = &none;
        printf("%s{\"name\":", i ? "," : "");
        kvd__cli_json_str(c->name);
        printf(",\"blocks\":%u,\"used_bytes\":%" PRIu64 ",\"budget_bytes\":%" PRIu64
               ",\"leases\":%u,\"lookups_per_s\":",
               c->blocks, c->used_bytes, c->budget_bytes, c->leases);
        RATE(c->lookups, p->lookups);
        printf(",\"evictions_per_s\":");
        RATE(c->evictions, p->evictions);
        if (c->disk.enabled) {
            printf(",\"disk\":{\"blocks\":%u,\"used_bytes\":%" PRIu64 ",\"budget_bytes\":%" PRIu64
                   ",\"hits_per_s\":",
                   c->disk.blocks, c->disk.used_bytes, c->disk.budget_bytes);
            RATE(c->disk.hits, p->disk.hits);
            printf(",\"write_bytes_per_s\":");
            RATE(c->disk.write_bytes, p->disk.write_bytes);
            printf(",\"read_bytes_per_s\":");
            RATE(c->disk.read_bytes, p->disk.read_bytes);
            printf(",\"checksum_failures\":%" PRIu64 ",\"io_errors\":%" PRIu64
                   ",\"no_space\":%" PRIu64 "}",
                   c->disk.checksum_failures, c->disk.io_errors, c->disk.no_space);
        } else {
            printf(",\"disk\":null");
        }
        putchar('}');
    }
    printf("],\"client_list\":[");
    for (i = 0; i < cur->nclients; i++) {
        const kvd_client_entry_t *cl = &cur->clients[i], *p = find_client(prev, cl->id);
        kvd_client_entry_t none;

        memset(&none, 0, sizeof(none));
        if (p == NULL)
            p = &none;
        printf("%s{\"id\":%" PRIu64 ",\"name\":", i ? "," : "", cl->id);
        kvd__cli_json_str(cl->name);
        printf(",\"pid\":%u,\"uid\":%u,\"inflight\":%u,\"pools\":%u,\"requests\":%" PRIu64
               ",\"requests_per_s\":",
               cl->pid, cl->uid, cl->inflight, cl->pools, cl->requests);
        RATE(cl->requests, p->requests);
        putchar('}');
    }
    printf("]}\n");
#undef RATE
    fflush(stdout);
}

/* ---- the terminal -------------------------------------------------------- */

static volatile sig_atomic_t g_quit, g_winch;
static struct termios g_saved;
static int g_raw, g_screen;

static void on_signal(int sig)
{
    if (sig == SIGWINCH)
        g_winch = 1;
    else
        g_quit = sig;
}

static void term_restore(void)
{
    if (g_screen) {
        /* cursor shown, attributes reset, main screen back */
        static const char seq[] = "\x1b[0m\x1b[?25h\x1b[?1049l";
        ssize_t n = write(STDOUT_FILENO, seq, sizeof(seq) - 1);
        (void)n;
        g_screen = 0;
    }
    if (g_raw) {
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &g_saved);
        g_raw = 0;
    }
}

static void term_setup(void)
{
    struct termios t;

    if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &g_saved) == 0) {
        t = g_saved;
        /* one key at a time, no echo; Ctrl-C still raises SIGINT */
        t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        t.c_cc[VMIN] = 0;
        t.c_cc[VTIME] = 0;
        if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &t) == 0)
            g_raw = 1;
    }
    fputs("\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J", stdout);
    fflush(stdout);
    g_screen = 1;
    atexit(term_restore);
}

static void term_size(int *rows, int *cols)
{
    struct winsize ws;

    *rows = 24;
    *cols = 80;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
        *rows = ws.ws_row;
        *cols = ws.ws_col;
    }
}

static void draw_screen(const frame_t *f, int rows, int cols)
{
    int i;

    fputs("\x1b[H", stdout);
    for (i = 0; i < f->n && i < rows; i++) {
        const char *on = f->style[i] == STYLE_TITLE  ? "\x1b[1m"
                         : f->style[i] == STYLE_HEAD ? "\x1b[7m"
                         : f->style[i] == STYLE_WARN ? "\x1b[1;31m"
                                                     : "";
        fprintf(stdout, "%s%.*s%s\x1b[K%s", on, cols, f->line[i], on[0] ? "\x1b[0m" : "",
                i + 1 < rows ? "\r\n" : "");
    }
    fputs("\x1b[J", stdout);
    fflush(stdout);
}

static void print_plain(const frame_t *f)
{
    int i;

    for (i = 0; i < f->n; i++) {
        /* trailing blanks of the fixed-width columns are of no use here */
        size_t n = strlen(f->line[i]);
        while (n > 0 && f->line[i][n - 1] == ' ')
            n--;
        printf("%.*s\n", (int)n, f->line[i]);
    }
    fflush(stdout);
}

/* ---- main ---------------------------------------------------------------- */

static int usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage(const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return kvd__cli_usage(&kvd__cli_cmd_top, "%s", msg);
}

/* Wait up to ms for a key (on a terminal) or a signal; 1 when the user
 * asked to quit, 0 otherwise. */
static int wait_key(int ms)
{
    uint64_t end = now_ns() + (uint64_t)ms * 1000000ull;

    while (!g_quit && !g_winch) {
        uint64_t t = now_ns();
        struct pollfd p = {STDIN_FILENO, POLLIN, 0};
        int left = t >= end ? 0 : (int)((end - t) / 1000000ull);
        int r;

        if (t >= end)
            return 0;
        r = poll(&p, g_raw ? 1 : 0, left);
        if (r < 0 && errno != EINTR)
            return 0;
        if (r > 0 && (p.revents & POLLIN)) {
            char key[16];
            ssize_t n = read(STDIN_FILENO, key, sizeof(key));
            ssize_t i;
            for (i = 0; i < n; i++)
                if (key[i] == 'q' || key[i] == 'Q' || key[i] == 3 /* Ctrl-C */)
                    return 1;
            if (n > 0)
                return 0; /* any other key: refresh now */
            if (n == 0)
                g_raw = 0; /* end of input: no more keys */
        }
    }
    return g_quit != 0;
}

enum { O_ONCE = 1, O_INTERVAL, O_COUNT };

static int run(kvd__cli_ctx_t *ctx, int argc, char **argv)
{
    static const kvd__cli_opt_t opts[] = {
        {"once", 0, false, O_ONCE},
        {"interval", 0, true, O_INTERVAL},
        {"count", 0, true, O_COUNT},
        KVD_CLI_OPT_END,
    };
    kvd__cli_args_t a;
    const char *socket;
    bool once = false, screen, json;
    double interval = 1.0;
    long count = 0, frames = 0;
    int id, rc = 0;
    kvd_client_t *cli = NULL;
    sample_t cur, prev;
    frame_t *f;
    kvd_status_t st;
    const char *what = "";
    char err[600] = "";
    struct sigaction sa;

    kvd__cli_args_init(&a, argc, argv, 1, opts, ctx);
    while ((id = kvd__cli_next(&a)) != KVD_CLI_DONE) {
        const char *v = a.val;
        char *end;
        uint64_t n;

        if (id == KVD_CLI_BAD)
            return usage("%s", a.err);
        if (id == KVD_CLI_ARG)
            return usage("unexpected argument '%s'", v);
        if (id == O_ONCE) {
            once = true;
        } else if (id == O_INTERVAL) {
            errno = 0;
            interval = strtod(v, &end);
            if (errno || end == v || *end != '\0' || !(interval >= 0.1 && interval <= 3600) ||
                strpbrk(v, "xXpPnN") != NULL)
                return usage("--interval '%s': decimal seconds from 0.1 to 3600", v);
        } else {
            if (!kvd__cli_parse_u64(v, &n, false) || n < 1 || n > 1000000000)
                return usage("--count '%s': a number of frames, >= 1", v);
            count = (long)n;
        }
    }
    if (ctx->help)
        return kvd__cli_help(&kvd__cli_cmd_top);
    socket = ctx->socket;
    json = ctx->json;
    if (once)
        count = 1;
    screen = !once && !json && isatty(STDOUT_FILENO);

    f = malloc(sizeof(*f));
    if (f == NULL || sample_alloc(&cur) != 0 || sample_alloc(&prev) != 0) {
        fprintf(stderr, "kvdock: out of memory\n");
        free(f);
        sample_free(&cur);
        sample_free(&prev);
        return 1;
    }
    st = kvd_client_create(socket, "kvdock-top", &cli);
    if (st != KVD_OK) {
        fprintf(stderr, "kvdock: %s: %s\n", kvd_err_name(st), kvd_client_last_error(NULL));
        rc = 1;
        goto out;
    }
    kvd_client_set_timeout(cli, 10000);

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal; /* no SA_RESTART: poll returns at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGWINCH, &sa, NULL);
    if (screen)
        term_setup();

    /* the first sample gives the rates of the first frame */
    st = take_sample(cli, &prev, &what);
    if (st != KVD_OK) {
        term_restore();
        fprintf(stderr, "kvdock: %s: %s: %s\n", what, kvd_err_name(st),
                kvd_client_last_error(cli));
        rc = 1;
        goto out;
    }
    if (screen) { /* something on the screen at once */
        int rows, cols;
        term_size(&rows, &cols);
        {
            sample_t none;
            memset(&none, 0, sizeof(none));
            build_frame(f, cli, &prev, &none, rows, NULL);
        }
        draw_screen(f, rows, cols);
    }
    while (!g_quit) {
        int rows = 0, cols = 0;

        if (wait_key((int)(interval * 1000)) != 0)
            break;
        if (g_winch) {
            g_winch = 0;
            if (!prev.valid)
                continue;
        }
        if (cli == NULL || !kvd_client_connected(cli)) {
            kvd_client_destroy(&cli);
            st = kvd_client_create(socket, "kvdock-top", &cli);
            if (st != KVD_OK) {
                snprintf(err, sizeof(err), "kvdockd unreachable (%s: %s); retrying every %.1f s",
                         kvd_err_name(st), kvd_client_last_error(NULL), interval);
                cli = NULL;
                if (!screen) {
                    fprintf(stderr, "kvdock: %s\n", err);
                    rc = 1;
                    break;
                }
                fputs("\x1b[H\x1b[1;31m", stdout);
                fputs(err, stdout);
                fputs("\x1b[0m\x1b[K", stdout);
                fflush(stdout);
                continue;
            }
            kvd_client_set_timeout(cli, 10000);
            prev.valid = 0;
        }
        st = take_sample(cli, &cur, &what);
        if (st != KVD_OK) {
            snprintf(err, sizeof(err), "%s: %s: %s", what, kvd_err_name(st),
                     kvd_client_last_error(cli));
            if (!screen) {
                fprintf(stderr, "kvdock: %s\n", err);
                rc = 1;
                break;
            }
            continue;
        }
        err[0] = '\0';
        if (screen)
            term_size(&rows, &cols);
        build_frame(f, cli, &cur, &prev, rows, NULL);
        if (json) {
            json_frame(&cur, &prev);
        } else if (screen) {
            draw_screen(f, rows, cols);
        } else {
            if (frames > 0)
                putchar('\n');
            print_plain(f);
        }
        sample_swap(&cur, &prev);
        if (count > 0 && ++frames >= count)
            break;
    }
    term_restore();
out:
    kvd_client_destroy(&cli);
    sample_free(&cur);
    sample_free(&prev);
    free(f);
    return rc;
}

const kvd__cli_cmd_t kvd__cli_cmd_top = {
    "top",
    "top [--once] [--interval SECONDS] [--count N] [--json]",
    "Live view of the daemon, refreshed every second: throughput per stream and per\n"
    "operation, pool occupancy, clients and in-flight requests.  q or Ctrl-C quits.",
    "top options:\n"
    "  --once        print one frame and exit: two samples --interval apart (so rates\n"
    "                are real), plain text without terminal control\n"
    "  --interval S  seconds between refreshes (default 1; 0.1 to 3600)\n"
    "  --count N     exit after N frames\n"
    "  --json        each frame as one JSON object on a line (no terminal control)\n"
    "\n"
    "On a terminal: a full-screen view refreshed every interval; q (or Ctrl-C) quits and\n"
    "restores the terminal, any other key refreshes at once.\n"
    "When stdout is not a terminal, frames are printed one after another as with --once\n"
    "(like `top -b`) until --count frames or a signal.  If the daemon goes away, the view\n"
    "says so and reconnects every interval.\n"
    "\n"
    "Columns: STREAM per stream class (QUEUED operations queued or running now, BUSY% of\n"
    "the interval with work queued, OPS/S and BYTES/S completed); OP per operation that\n"
    "has had requests (MEAN_US: mean latency over the interval); pools by memory kind and\n"
    "the largest pools (CLIENT: the client connection that made it); clients with their\n"
    "requests in flight.\n",
    run,
};
