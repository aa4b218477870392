/*
 * kvdock bench: the daemon benchmark, run against a running kvdockd.
 *
 * Cases
 *   ping       ping round trip (empty payload), p50 / p99 / mean
 *   transfer   round trip of a one-slot, one-layer transfer between two
 *              daemon pools (device pools on the cuda backend, host pools
 *              on cpu), p50 / p99 / mean
 *   pipelined  requests per second of one-slot transfers with 1 and with N
 *              clients, each a thread with its own connection and its own
 *              pools, keeping a window of requests in flight
 *   all-layer  one all-layer transfer of S slots (a random permutation on
 *              both sides) through the daemon, with inline indices and
 *              with indices in a registered buffer: p50 and GB/s.  The
 *              same transfer against the kernel called in-process is
 *              tests/bench/bench_paths (the CLI links libkvdock alone)
 *
 * Every pool the bench makes is private to the connection that made it and
 * named bench-<pid>-<nonce>-...: it is dropped at the end, and the daemon
 * drops it anyway when the connection closes, so a bench that dies leaves
 * nothing behind.  Progress bars go to stderr on a terminal; the summary
 * table to stdout (to stderr with --json, where stdout is one JSON object).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "commands.h"
#include "kvdock/client.h"

#define EXIT_DAEMON KVD_CLI_EXIT_DAEMON

/* The targets (`kvdock bench --help` states them too). */
#define TARGET_P50_US 25.0
#define TARGET_P99_US 60.0
#define TARGET_RPS 100000.0
#define TARGET_RPS_CLIENTS 8

#define SMALL_SLOTS 256 /* slots of the pools of the one-slot cases */
#define MAX_CLIENTS 256
#define MAX_WINDOW 1024

typedef struct bench_opts {
    const char *socket;
    bool json;
    uint64_t iterations; /* samples of the round-trip cases */
    double duration;     /* seconds of each pipelined run */
    uint32_t clients;
    uint32_t window;
    uint32_t layers; /* all-layer case */
    uint64_t slots;
    uint64_t slot_bytes;
    uint32_t max_blocks; /* 0: the daemon's default of the stream class */
    int32_t kind;        /* 0: by backend */
} bench_opts_t;

typedef struct tput {
    uint32_t clients;
    uint64_t requests;
    double seconds;
    double rps;
} tput_t;

typedef struct results {
    kvd__bench_lat_t ping;
    kvd__bench_lat_t xfer;
    tput_t one, many;
    /* all-layer */
    uint64_t al_iterations;
    uint64_t al_bytes; /* bytes written per transfer */
    uint32_t al_max_blocks;
    const char *al_stream;
    kvd__bench_lat_t al_daemon;     /* inline indices (the daemon stages them) */
    kvd__bench_lat_t al_daemon_buf; /* indices in a registered buffer (device on cuda, host on cpu) */
    bool have_daemon_buf;
    bool al_failed; /* the all-layer case failed (said on stderr); the rest is shown */
} results_t;

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */

static int fail(kvd_client_t *cli, kvd_status_t st, const char *what)
{
    const char *msg = kvd_client_last_error(cli);

    fprintf(stderr, "\nkvdock: bench: %s: %s: %s\n", what, kvd_err_name(st),
            msg[0] != '\0' ? msg : kvd_strerror(st));
    return EXIT_DAEMON;
}

#define usage(...) kvd__cli_usage(&kvd__cli_cmd_bench, __VA_ARGS__)

/* ------------------------------------------------------------------------ */
/* Pools                                                                     */

/* A one-slot, one-layer transfer from a to b. */
static void one_slot(const kvd__bench_pair_t *pp, uint64_t i, int64_t *s, int64_t *d,
                     kvd_kv_transfer_t *t)
{
    *s = (int64_t)(i % SMALL_SLOTS);
    *d = (int64_t)((i * 7 + 3) % SMALL_SLOTS);
    memset(t, 0, sizeof(*t));
    t->src_pool = pp->a.id;
    t->dst_pool = pp->b.id;
    t->src.values = s;
    t->src.count = 1;
    t->src.dtype = KVD_DTYPE_I64;
    t->dst.values = d;
    t->dst.count = 1;
    t->dst.dtype = KVD_DTYPE_I64;
}

/* ------------------------------------------------------------------------ */
/* Cases a and b: round trips                                                */

/* One round trip, the i-th (warm-up ones included): its time in *us, 0 or
 * the exit status (the error said). */
typedef int (*round_trip_fn)(kvd_client_t *cli, const void *arg, uint64_t i, double *us);

/* n / 20 + 1 round trips to warm up, then o->iterations timed ones, their
 * latencies in out; 0 or the exit status. */
static int time_round_trips(kvd_client_t *cli, const bench_opts_t *o, bool bars, const char *label,
                            round_trip_fn one, const void *arg, bool mean, kvd__bench_lat_t *out)
{
    uint64_t n = o->iterations, warm = n / 20 + 1;
    double *v = malloc((size_t)n * sizeof(*v));
    kvd__bench_progress_t p;
    char sum[96];

    if (v == NULL) {
        fprintf(stderr, "kvdock: out of memory\n");
        return EXIT_DAEMON;
    }
    kvd__bench_progress_start(&p, bars, label);
    for (uint64_t i = 0; i < warm + n; i++) {
        double us;
        int rc = one(cli, arg, i, &us);

        if (rc != 0) {
            free(v);
            return rc;
        }
        if (i < warm)
            continue;
        v[i - warm] = us;
        if (((i - warm) & 63) == 0)
            kvd__bench_progress_set(&p, (double)(i - warm) / (double)n);
    }
    kvd__bench_lat(out, v, n);
    free(v);
    if (mean)
        snprintf(sum, sizeof(sum), "p50 %.1f us  p99 %.1f us  mean %.1f us", out->p50, out->p99,
                 out->mean);
    else
        snprintf(sum, sizeof(sum), "p50 %.1f us  p99 %.1f us", out->p50, out->p99);
    kvd__bench_progress_end(&p, sum);
    return 0;
}

static int one_ping(kvd_client_t *cli, const void *arg, uint64_t i, double *us)
{
    double t0 = kvd__cli_now_us();
    kvd_status_t st = kvd_ping(cli, NULL, 0);

    (void)arg;
    (void)i;
    *us = kvd__cli_now_us() - t0;
    return st != KVD_OK ? fail(cli, st, "ping") : 0;
}

static int one_xfer(kvd_client_t *cli, const void *arg, uint64_t i, double *us)
{
    kvd_kv_transfer_t t;
    kvd_op_result_t r;
    int64_t s, d;
    kvd_status_t st;
    double t0;

    one_slot(arg, i, &s, &d, &t);
    t0 = kvd__cli_now_us();
    st = kvd_kv_transfer(cli, &t, NULL, &r);
    *us = kvd__cli_now_us() - t0;
    if (st != KVD_OK)
        return fail(cli, st, "one-slot transfer");
    if (r.rows != 1) {
        fprintf(stderr, "\nkvdock: bench: one-slot transfer covered %" PRIu64 " rows\n", r.rows);
        return EXIT_DAEMON;
    }
    return 0;
}

static int run_ping(kvd_client_t *cli, const bench_opts_t *o, bool bars, kvd__bench_lat_t *out)
{
    return time_round_trips(cli, o, bars, "ping round trip", one_ping, NULL, false, out);
}

static int run_xfer(kvd_client_t *cli, const bench_opts_t *o, const kvd__bench_pair_t *pp, bool bars,
                    kvd__bench_lat_t *out)
{
    return time_round_trips(cli, o, bars, "one-slot transfer round trip", one_xfer, pp, true, out);
}

/* ------------------------------------------------------------------------ */
/* Case c: pipelined requests per second                                     */

/* What the clients of one run share with the main thread. */
typedef struct start_line {
    int ready;      /* clients set up (or failed); atomic */
    int go;         /* 0: wait; 1: run; -1: stop (atomic) */
    double t_start; /* written before go is set */
} start_line_t;

typedef struct worker {
    pthread_t th;
    const bench_opts_t *o;
    const char *prefix;
    int32_t kind;
    uint32_t index;
    start_line_t *line;
    /* out */
    uint64_t done;
    double t_end;
    kvd_status_t st;
    char err[256];
    int finished; /* atomic */
} worker_t;

static void worker_fail(worker_t *w, kvd_client_t *cli, kvd_status_t st, const char *what)
{
    if (w->st != KVD_OK)
        return;
    w->st = st;
    snprintf(w->err, sizeof(w->err), "client %u: %s: %s: %s", w->index, what, kvd_err_name(st),
             cli != NULL ? kvd_client_last_error(cli) : kvd_client_last_error(NULL));
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    kvd_client_t *cli = NULL;
    kvd__bench_pair_t pp;
    char name[32], tag[32];
    uint64_t ids[MAX_WINDOW];
    kvd_op_result_t res[MAX_WINDOW];
    uint32_t head = 0, n = 0, win = w->o->window;
    uint64_t i = 0;
    double end;
    kvd_status_t st;
    int go;

    memset(&pp, 0, sizeof(pp));
    snprintf(name, sizeof(name), "kvdock-bench-%u", w->index);
    snprintf(tag, sizeof(tag), "c%u", w->index);
    st = kvd_client_create(w->o->socket, name, &cli);
    if (st != KVD_OK)
        worker_fail(w, NULL, st, "connect");
    else if ((st = kvd__bench_pair_create(cli, w->prefix, tag, w->kind, 1, SMALL_SLOTS, w->o->slot_bytes,
                               &pp)) != KVD_OK)
        worker_fail(w, cli, st, "pool create");
    __atomic_fetch_add(&w->line->ready, 1, __ATOMIC_ACQ_REL);
    while ((go = __atomic_load_n(&w->line->go, __ATOMIC_ACQUIRE)) == 0)
        usleep(100);
    if (go != 1 || w->st != KVD_OK)
        goto out;
    end = w->line->t_start + w->o->duration * 1e6;
    for (;;) {
        bool stop = kvd__cli_now_us() >= end;

        if (!stop && n < win) {
            uint32_t slot = (head + n) % win;
            kvd_kv_transfer_t t;
            int64_t s, d;

            one_slot(&pp, i++, &s, &d, &t);
            st = kvd_kv_transfer_submit(cli, &t, NULL, &res[slot], &ids[slot]);
            if (st != KVD_OK) {
                worker_fail(w, cli, st, "transfer submit");
                break;
            }
            n++;
            continue;
        }
        if (n == 0)
            break;
        st = kvd_client_wait(cli, ids[head]);
        if (st != KVD_OK) {
            worker_fail(w, cli, st, "transfer");
            break;
        }
        w->done++;
        head = (head + 1) % win;
        n--;
    }
    w->t_end = kvd__cli_now_us();
out:
    if (cli != NULL) {
        /* collect what is still in flight after an error, then drop */
        while (n > 0 && kvd_client_connected(cli)) {
            (void)kvd_client_wait(cli, ids[head]);
            head = (head + 1) % win;
            n--;
        }
        st = kvd__bench_pair_drop(cli, &pp);
        if (st != KVD_OK && kvd_client_connected(cli))
            worker_fail(w, cli, st, "pool drop");
    }
    kvd_client_destroy(&cli);
    __atomic_store_n(&w->finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int run_tput(const bench_opts_t *o, const char *prefix, int32_t kind, uint32_t nclients,
                    bool bars, tput_t *out)
{
    worker_t *w = calloc(nclients, sizeof(*w));
    start_line_t line = {0, 0, 0};
    double t_end = 0;
    uint32_t started = 0;
    int go = 1;
    char label[64], sum[96];
    kvd__bench_progress_t p;
    int rc = 0;

    if (w == NULL) {
        fprintf(stderr, "kvdock: out of memory\n");
        return EXIT_DAEMON;
    }
    snprintf(label, sizeof(label), "pipelined transfers, %u client%s", nclients,
             nclients == 1 ? "" : "s");
    kvd__bench_progress_start(&p, bars, label);
    kvd__bench_progress_set(&p, 0);
    for (uint32_t c = 0; c < nclients; c++) {
        w[c].o = o;
        w[c].prefix = prefix;
        w[c].kind = kind;
        w[c].index = c;
        w[c].line = &line;
        if (pthread_create(&w[c].th, NULL, worker_main, &w[c]) != 0) {
            fprintf(stderr, "\nkvdock: bench: cannot start client thread %u of %u\n", c + 1,
                    nclients);
            rc = EXIT_DAEMON;
            break;
        }
        started++;
    }
    /* every client set up (or failed), then all start at once */
    while ((uint32_t)__atomic_load_n(&line.ready, __ATOMIC_ACQUIRE) < started)
        usleep(1000);
    for (uint32_t c = 0; c < started; c++)
        if (w[c].st != KVD_OK || rc != 0)
            go = -1;
    line.t_start = kvd__cli_now_us();
    __atomic_store_n(&line.go, go, __ATOMIC_RELEASE);
    for (;;) {
        uint32_t fin = 0;

        for (uint32_t c = 0; c < started; c++)
            fin += __atomic_load_n(&w[c].finished, __ATOMIC_ACQUIRE) ? 1u : 0u;
        if (fin == started)
            break;
        kvd__bench_progress_set(&p, (kvd__cli_now_us() - line.t_start) / (o->duration * 1e6));
        usleep(20000);
    }
    memset(out, 0, sizeof(*out));
    out->clients = nclients;
    for (uint32_t c = 0; c < started; c++) {
        pthread_join(w[c].th, NULL);
        if (w[c].st != KVD_OK && rc == 0) {
            fprintf(stderr, "\nkvdock: bench: %s\n", w[c].err);
            rc = EXIT_DAEMON;
        }
        out->requests += w[c].done;
        if (w[c].t_end > t_end)
            t_end = w[c].t_end;
    }
    free(w);
    if (rc != 0)
        return rc;
    out->seconds = (t_end - line.t_start) / 1e6;
    out->rps = out->seconds > 0 ? (double)out->requests / out->seconds : 0;
    snprintf(sum, sizeof(sum), "%.0f req/s (%" PRIu64 " in %.2f s)", out->rps, out->requests,
             out->seconds);
    kvd__bench_progress_end(&p, sum);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Case d: all-layer transfer through the daemon                             */

/* A registered buffer holding ps then pd (device memory on cuda, host on
 * cpu): the kernels read the indices where they lie. */
static kvd_status_t buffer_indices(kvd_client_t *cli, uint64_t slots, bool cuda,
                                   const int64_t *ps, const int64_t *pd, uint64_t *id,
                                   kvd_mapping_t **map)
{
    size_t half = (size_t)slots * sizeof(int64_t);
    kvd_status_t st;

    st = kvd_buffer_register(cli, 2 * half, cuda ? KVD_MEM_DEVICE : KVD_MEM_HOST, "bench-indices",
                             id, map);
    if (st != KVD_OK)
        return st;
    return kvd_mapping_write(*map, 0, ps, half) == KVD_OK &&
                   kvd_mapping_write(*map, half, pd, half) == KVD_OK
               ? KVD_OK
               : KVD_ENOTSUP;
}

/* The budget of thread blocks the daemon gives the stream class that runs
 * a transfer between two pools of one kind (0: no limit). */
static kvd_status_t class_budget(kvd_client_t *cli, const char **name, uint32_t *blocks)
{
    kvd_daemon_stats_t s;
    kvd_stream_stats_t streams[16];
    kvd_status_t st;

    /* host to host and device to device both run on d2d */
    *name = "d2d";
    *blocks = 0;
    st = kvd_daemon_stats(cli, &s, NULL, 0, streams, 16);
    if (st != KVD_OK)
        return st;
    for (size_t i = 0; i < s.num_streams && i < 16; i++)
        if (strcmp(streams[i].name, *name) == 0)
            *blocks = streams[i].max_blocks;
    return KVD_OK;
}

static int run_all_layer(kvd_client_t *cli, const bench_opts_t *o, const char *prefix,
                         int32_t kind, bool cuda, bool bars, results_t *res)
{
    uint64_t iters = o->iterations / 100, warm = 2, ibuf = 0;
    int64_t *ps = NULL, *pd = NULL;
    double *v = NULL;
    kvd__bench_pair_t pp;
    kvd_sync_t sync;
    kvd__bench_progress_t p;
    kvd_mapping_t *imap = NULL;
    char label[96], sum[160];
    kvd_status_t st;
    int rc = 0;

    if (iters < 5)
        iters = 5;
    memset(&pp, 0, sizeof(pp));
    snprintf(label, sizeof(label), "all-layer transfer, %" PRIu64 " slots", o->slots);
    kvd__bench_progress_start(&p, bars, label);
    kvd__bench_progress_set(&p, 0);
    res->al_iterations = iters;
    res->al_bytes = o->slots * o->slot_bytes * 2 * o->layers;
    if ((st = class_budget(cli, &res->al_stream, &res->al_max_blocks)) != KVD_OK)
        return fail(cli, st, "stats");
    if (o->max_blocks != 0)
        res->al_max_blocks = o->max_blocks;
    ps = malloc((size_t)o->slots * sizeof(*ps));
    pd = malloc((size_t)o->slots * sizeof(*pd));
    v = malloc((size_t)iters * sizeof(*v));
    if (ps == NULL || pd == NULL || v == NULL) {
        fprintf(stderr, "kvdock: out of memory\n");
        rc = EXIT_DAEMON;
        goto out;
    }
    kvd__bench_permutation(ps, o->slots, 1);
    kvd__bench_permutation(pd, o->slots, 2);
    st = kvd__bench_pair_create(cli, prefix, "all", kind, o->layers, o->slots, o->slot_bytes, &pp);
    if (st != KVD_OK) {
        rc = fail(cli, st, "all-layer pool create");
        goto out;
    }
    memset(&sync, 0, sizeof(sync));
    sync.max_blocks = res->al_max_blocks;
    st = kvd__bench_all_layer(cli, &pp, o->slots, &sync, ps, pd, 0, warm, iters, &p, 0.0, 0.5, v,
                              &res->al_daemon);
    if (st != KVD_OK) {
        rc = fail(cli, st, "all-layer transfer");
        goto out;
    }
    st = buffer_indices(cli, o->slots, cuda, ps, pd, &ibuf, &imap);
    if (st == KVD_OK) {
        st = kvd__bench_all_layer(cli, &pp, o->slots, &sync, ps, pd, ibuf, warm, iters, &p, 0.5,
                                  1.0, v, &res->al_daemon_buf);
        if (st != KVD_OK) {
            rc = fail(cli, st, "all-layer transfer, buffer indices");
            goto out;
        }
        res->have_daemon_buf = true;
    } else if (ibuf == 0) {
        rc = fail(cli, st, "index buffer register");
        goto out;
    }
    snprintf(sum, sizeof(sum), "inline %.1f us  buffer %.1f us", res->al_daemon.p50,
             res->al_daemon_buf.p50);
    kvd__bench_progress_end(&p, sum);
out:
    kvd_mapping_destroy(&imap);
    if (ibuf != 0 && (st = kvd_buffer_drop(cli, ibuf)) != KVD_OK && rc == 0)
        rc = fail(cli, st, "index buffer drop");
    st = kvd__bench_pair_drop(cli, &pp);
    if (st != KVD_OK && rc == 0)
        rc = fail(cli, st, "all-layer pool drop");
    free(ps);
    free(pd);
    free(v);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */

/* A target is judged only where it was set: the latency and rate targets
 * are for a GPU daemon, so on the cpu backend they say "(cuda)". */
static const char *verdict(bool applies, bool pass)
{
    return !applies ? "(cuda)" : pass ? "PASS" : "MISS";
}

static void row(FILE *f, const char *c, const char *fig, const char *val, const char *target,
                const char *res)
{
    fprintf(f, "%-44s %-13s %14s  %-12s %s\n", c, fig, val, target, res);
}

static double gbps(uint64_t bytes, double us)
{
    return us > 0 ? (double)bytes / us / 1e3 : 0;
}

static void print_table(FILE *f, const bench_opts_t *o, const kvd_hello_info_t *h, int32_t kind,
                        const results_t *r)
{
    char v[64], c[96], t[32], blocks[32];
    bool have_many = r->many.clients > 0, gpu = h->backend == KVD_BACKEND_CUDA;

    if (!gpu)
        snprintf(blocks, sizeof(blocks), "n/a (cpu)");
    else if (r->al_max_blocks)
        snprintf(blocks, sizeof(blocks), "%u", r->al_max_blocks);
    else
        snprintf(blocks, sizeof(blocks), "unlimited");

    fprintf(f, "\nkvdock bench: kvdockd %s (pid %u), backend %s, device %s, %s pools\n",
            h->daemon_version, h->daemon_pid, kvd_backend_name(h->backend), h->device_name,
            kvd_mem_kind_name(kind));
    fprintf(f, "  %" PRIu64 " round trips per latency case; %.2f s per pipelined run, window %u; "
               "all-layer: %u layers x %" PRIu64 " slots x %" PRIu64 " bytes (MHA), %" PRIu64
               " runs, thread blocks %s\n\n",
            o->iterations, o->duration, o->window, o->layers, o->slots, o->slot_bytes,
            r->al_iterations, blocks);
    row(f, "CASE", "FIGURE", "VALUE", "TARGET", "RESULT");
    snprintf(v, sizeof(v), "%.1f us", r->ping.p50);
    row(f, "ping round trip", "p50", v, "-", "-");
    snprintf(v, sizeof(v), "%.1f us", r->ping.p99);
    row(f, "ping round trip", "p99", v, "-", "-");
    snprintf(v, sizeof(v), "%.1f us", r->xfer.p50);
    snprintf(t, sizeof(t), "<= %.0f us", TARGET_P50_US);
    row(f, "one-slot transfer round trip", "p50", v, t, verdict(gpu, r->xfer.p50 <= TARGET_P50_US));
    snprintf(v, sizeof(v), "%.1f us", r->xfer.p99);
    snprintf(t, sizeof(t), "<= %.0f us", TARGET_P99_US);
    row(f, "one-slot transfer round trip", "p99", v, t, verdict(gpu, r->xfer.p99 <= TARGET_P99_US));
    snprintf(v, sizeof(v), "%.1f us", r->xfer.mean);
    row(f, "one-slot transfer round trip", "mean", v, "-", "-");
    snprintf(v, sizeof(v), "%.0f", r->one.rps);
    row(f, "pipelined one-slot transfers, 1 client", "req/s", v, "-", "-");
    if (have_many) {
        snprintf(c, sizeof(c), "pipelined one-slot transfers, %u clients", r->many.clients);
        snprintf(v, sizeof(v), "%.0f", r->many.rps);
        snprintf(t, sizeof(t), ">= %.0f", TARGET_RPS);
        row(f, c, "req/s", v, t,
            r->many.clients == TARGET_RPS_CLIENTS ? verdict(gpu, r->many.rps >= TARGET_RPS)
                                                 : "(8 clients)");
    }
    snprintf(c, sizeof(c), "all-layer transfer, %" PRIu64 " slots", o->slots);
    if (r->al_failed) {
        row(f, c, "p50", "failed", "-", "-");
        return;
    }
    snprintf(v, sizeof(v), "%.1f us", r->al_daemon.p50);
    row(f, c, "p50", v, "-", "-");
    snprintf(v, sizeof(v), "%.1f GB/s", gbps(r->al_bytes, r->al_daemon.p50));
    row(f, c, "rate", v, "-", "-");
    if (r->have_daemon_buf) {
        snprintf(v, sizeof(v), "%.1f us", r->al_daemon_buf.p50);
        row(f, "  (indices in a registered buffer)", "p50", v, "-", "-");
    }
}

static void json_lat(const char *key, const kvd__bench_lat_t *l)
{
    printf("\"%s\":{\"count\":%" PRIu64 ",\"p50_us\":%.3f,\"p99_us\":%.3f,\"mean_us\":%.3f,"
           "\"min_us\":%.3f,\"max_us\":%.3f}",
           key, l->count, l->p50, l->p99, l->mean, l->min, l->max);
}

static void print_json_all_layer(const bench_opts_t *o, const results_t *r);

static void print_json(const bench_opts_t *o, const kvd_hello_info_t *h, int32_t kind,
                       const results_t *r)
{
    bool gpu = h->backend == KVD_BACKEND_CUDA;
    bool p50 = r->xfer.p50 <= TARGET_P50_US, p99 = r->xfer.p99 <= TARGET_P99_US;
    bool rps = r->many.clients == TARGET_RPS_CLIENTS && r->many.rps >= TARGET_RPS;

    printf("{\"bench\":\"kvdock\",\"version\":2,\"daemon_version\":");
    kvd__cli_json_str(h->daemon_version);
    printf(",\"backend\":");
    kvd__cli_json_str(kvd_backend_name(h->backend));
    printf(",\"device\":");
    kvd__cli_json_str(h->device_name);
    printf(",\"device_ordinal\":%d,\"pool_kind\":", h->device_ordinal);
    kvd__cli_json_str(kvd_mem_kind_name(kind));
    printf(",\"iterations\":%" PRIu64 ",\"duration_s\":%.3f,\"clients\":%u,\"window\":%u,",
           o->iterations, o->duration, o->clients, o->window);
    json_lat("ping", &r->ping);
    printf(",\"transfer_1slot\":{\"count\":%" PRIu64 ",\"p50_us\":%.3f,\"p99_us\":%.3f,"
           "\"mean_us\":%.3f,\"min_us\":%.3f,\"max_us\":%.3f,\"slot_bytes\":%" PRIu64
           ",\"target_p50_us\":%.1f,\"target_p99_us\":%.1f,\"p50_pass\":%s,\"p99_pass\":%s}",
           r->xfer.count, r->xfer.p50, r->xfer.p99, r->xfer.mean, r->xfer.min, r->xfer.max,
           o->slot_bytes, TARGET_P50_US, TARGET_P99_US, !gpu ? "null" : p50 ? "true" : "false",
           !gpu ? "null" : p99 ? "true" : "false");
    printf(",\"pipelined\":{\"window\":%u,\"one_client\":{\"clients\":%u,\"requests\":%" PRIu64
           ",\"seconds\":%.6f,\"req_per_s\":%.1f},\"n_clients\":{\"clients\":%u,\"requests\":%" PRIu64
           ",\"seconds\":%.6f,\"req_per_s\":%.1f},\"target_req_per_s\":%.0f,\"target_clients\":%d,"
           "\"pass\":%s}",
           o->window, r->one.clients, r->one.requests, r->one.seconds, r->one.rps, r->many.clients,
           r->many.requests, r->many.seconds, r->many.rps, TARGET_RPS, TARGET_RPS_CLIENTS,
           !gpu ? "null" : rps ? "true" : "false");
    if (r->al_failed)
        printf(",\"all_layer\":null");
    else
        print_json_all_layer(o, r);
    printf(",\"targets_met\":%s}\n", !gpu ? "null" : p50 && p99 && rps ? "true" : "false");
}

static void print_json_all_layer(const bench_opts_t *o, const results_t *r)
{
    printf(",\"all_layer\":{\"layers\":%u,\"slots\":%" PRIu64 ",\"slot_bytes\":%" PRIu64
           ",\"mla\":false,\"bytes\":%" PRIu64 ",\"iterations\":%" PRIu64
           ",\"max_blocks\":%u,\"gb_per_s\":%.3f,\"stream\":",
           o->layers, o->slots, o->slot_bytes, r->al_bytes, r->al_iterations, r->al_max_blocks,
           gbps(r->al_bytes, r->al_daemon.p50));
    kvd__cli_json_str(r->al_stream != NULL ? r->al_stream : "");
    printf(",");
    json_lat("daemon", &r->al_daemon);
    if (r->have_daemon_buf) {
        printf(",");
        json_lat("daemon_buffer_indices", &r->al_daemon_buf);
    }
    printf("}");
}

/* ------------------------------------------------------------------------ */
/* Options and main                                                          */

/* A decimal count (or a SIZE with size) in [lo, hi]. */
static bool parse_count(const char *s, uint64_t *out, uint64_t lo, uint64_t hi)
{
    return kvd__cli_parse_u64(s, out, false) && *out >= lo && *out <= hi;
}

static bool parse_size(const char *s, uint64_t *out, uint64_t lo, uint64_t hi)
{
    return kvd__cli_parse_u64(s, out, true) && *out >= lo && *out <= hi;
}

enum { O_ITERATIONS = 1, O_DURATION, O_CLIENTS, O_WINDOW, O_LAYERS, O_SLOTS, O_SLOT_BYTES,
       O_MAX_BLOCKS, O_KIND };

static int run(kvd__cli_ctx_t *ctx, int argc, char **argv)
{
    static const kvd__cli_opt_t opts[] = {
        {"iterations", 0, true, O_ITERATIONS}, {"duration", 0, true, O_DURATION},
        {"clients", 0, true, O_CLIENTS},       {"window", 0, true, O_WINDOW},
        {"layers", 0, true, O_LAYERS},         {"slots", 0, true, O_SLOTS},
        {"slot-bytes", 0, true, O_SLOT_BYTES}, {"max-blocks", 0, true, O_MAX_BLOCKS},
        {"kind", 0, true, O_KIND},             KVD_CLI_OPT_END,
    };
    kvd__cli_args_t a;
    int id;
    bench_opts_t o;
    results_t res;
    kvd_client_t *cli = NULL;
    const kvd_hello_info_t *h;
    kvd__bench_pair_t small;
    char prefix[48];
    int32_t kind;
    bool bars = isatty(STDERR_FILENO) != 0, cuda;
    kvd_status_t st;
    uint64_t v;
    int rc = 0;

    memset(&o, 0, sizeof(o));
    memset(&res, 0, sizeof(res));
    memset(&small, 0, sizeof(small));
    o.iterations = 10000;
    o.duration = 2.0;
    o.clients = TARGET_RPS_CLIENTS;
    o.window = 32;
    o.layers = 32;
    o.slots = 1024;
    o.slot_bytes = 2048;
    kvd__cli_args_init(&a, argc, argv, 1, opts, ctx);
    while ((id = kvd__cli_next(&a)) != KVD_CLI_DONE) {
        const char *val = a.val;

        switch (id) {
        case KVD_CLI_BAD:
            return usage("%s", a.err);
        case KVD_CLI_ARG:
            return usage("unexpected argument '%s'", val);
        case O_ITERATIONS:
            if (!parse_count(val, &v, 1, 100000000))
                return usage("--iterations needs a count from 1 to 100000000");
            o.iterations = v;
            break;
        case O_DURATION: {
            char *end;
            double d;

            errno = 0;
            d = strtod(val, &end);
            if (errno != 0 || end == val || *end != '\0' || !(d >= 0.01 && d <= 3600) ||
                strpbrk(val, "xXpPnN") != NULL)
                return usage("--duration needs decimal seconds from 0.01 to 3600");
            o.duration = d;
            break;
        }
        case O_CLIENTS:
            if (!parse_count(val, &v, 1, MAX_CLIENTS))
                return usage("--clients needs a count from 1 to %d", MAX_CLIENTS);
            o.clients = (uint32_t)v;
            break;
        case O_WINDOW:
            if (!parse_count(val, &v, 1, MAX_WINDOW))
                return usage("--window needs a count from 1 to %d", MAX_WINDOW);
            o.window = (uint32_t)v;
            break;
        case O_LAYERS:
            if (!parse_count(val, &v, 1, 4096))
                return usage("--layers needs a count from 1 to 4096");
            o.layers = (uint32_t)v;
            break;
        case O_SLOTS:
            if (!parse_count(val, &v, 1, 1u << 20))
                return usage("--slots needs a count from 1 to 1048576");
            o.slots = v;
            break;
        case O_SLOT_BYTES:
            if (!parse_size(val, &v, 1, 1u << 20))
                return usage("--slot-bytes needs a SIZE from 1 to 1 MiB");
            o.slot_bytes = v;
            break;
        case O_MAX_BLOCKS:
            if (!parse_count(val, &v, 1, 1u << 20))
                return usage("--max-blocks needs a count from 1 to 1048576");
            o.max_blocks = (uint32_t)v;
            break;
        case O_KIND:
            if (strcmp(val, "host") == 0)
                o.kind = KVD_MEM_HOST;
            else if (strcmp(val, "device") == 0)
                o.kind = KVD_MEM_DEVICE;
            else
                return usage("--kind must be host or device");
            break;
        }
    }
    if (ctx->help)
        return kvd__cli_help(&kvd__cli_cmd_bench);
    o.socket = ctx->socket;
    o.json = ctx->json;
    st = kvd_client_create(o.socket, "kvdock-bench", &cli);
    if (st != KVD_OK) {
        fprintf(stderr, "kvdock: %s: %s\n", kvd_err_name(st), kvd_client_last_error(NULL));
        return EXIT_DAEMON;
    }
    h = kvd_client_info(cli);
    if (h->limits.max_inline_bytes != 0 &&
        o.slots * sizeof(int64_t) > h->limits.max_inline_bytes) {
        kvd_client_destroy(&cli);
        return usage("--slots: the all-layer case sends its indices inline, and this daemon "
                     "takes at most %u bytes of them (max-inline-bytes)",
                     h->limits.max_inline_bytes);
    }
    cuda = h->backend == KVD_BACKEND_CUDA;
    kind = o.kind != 0 ? o.kind : cuda ? KVD_MEM_DEVICE : KVD_MEM_HOST;
    kvd__bench_prefix(prefix, sizeof(prefix));

    st = kvd__bench_pair_create(cli, prefix, "rt", kind, 1, SMALL_SLOTS, o.slot_bytes, &small);
    if (st != KVD_OK) {
        rc = fail(cli, st, "pool create");
        goto out;
    }
    if ((rc = run_ping(cli, &o, bars, &res.ping)) != 0 ||
        (rc = run_xfer(cli, &o, &small, bars, &res.xfer)) != 0)
        goto out;
    st = kvd__bench_pair_drop(cli, &small);
    if (st != KVD_OK) {
        rc = fail(cli, st, "pool drop");
        goto out;
    }
    if ((rc = run_tput(&o, prefix, kind, 1, bars, &res.one)) != 0 ||
        (rc = run_tput(&o, prefix, kind, o.clients, bars, &res.many)) != 0)
        goto out;
    /* a failed last case does not hide the figures of the cases before it */
    rc = run_all_layer(cli, &o, prefix, kind, cuda, bars, &res);
    res.al_failed = rc != 0;
    if (o.json)
        print_json(&o, h, kind, &res);
    else
        print_table(stdout, &o, h, kind, &res);
out:
    if (rc != 0 && kvd_client_connected(cli))
        (void)kvd__bench_pair_drop(cli, &small);
    kvd_client_destroy(&cli);
    return rc;
}

const kvd__cli_cmd_t kvd__cli_cmd_bench = {
    "bench",
    "bench [--iterations N] [--duration S] [--clients N] [--window N] [--layers N]\n"
    "                    [--slots N] [--slot-bytes SIZE] [--max-blocks N] [--kind host|device]\n"
    "                    [--json]",
    "Benchmark the daemon: ping and one-slot transfer round trips, pipelined requests per\n"
    "second with 1 and N clients, and an all-layer transfer; each figure beside its target.",
    "bench options:\n"
    "  --iterations N     round trips per latency case (default 10000; the all-layer\n"
    "                     case runs N/100 transfers, at least 5)\n"
    "  --duration S       seconds of each pipelined run (default 2)\n"
    "  --clients N        clients of the second pipelined run (default 8)\n"
    "  --window N         requests each client keeps in flight (default 32)\n"
    "  --layers N         all-layer case: layers (default 32)\n"
    "  --slots N          all-layer case: slots moved (default 1024)\n"
    "  --slot-bytes SIZE  bytes per slot row, every case (default 2048)\n"
    "  --max-blocks N     all-layer thread-block budget (default: the daemon's budget of\n"
    "                     the d2d stream)\n"
    "  --kind K           pool kind: host or device (default: device on the cuda backend,\n"
    "                     host on cpu)\n"
    "\ntargets, for a cuda daemon: one-slot transfer p50 <= 25 us and p99 <= 60 us;\n"
    ">= 100000 req/s with 8 clients.\n"
    "Every pool the bench makes is private to its connection and dropped at the end.\n",
    run,
};
