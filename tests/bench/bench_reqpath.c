/*
 * bench_reqpath: the request path under many clients, beside a raw Unix
 * socket carrying messages of the same sizes, in the same run.
 *
 *   bench_reqpath --socket PATH [--clients 1,8,64] [--seconds S] [--rounds R]
 *                 [--window W] [--cases LIST]
 *
 * Cases (--cases, comma-separated; default all):
 *   closed     N clients, each a thread with its own connection, one
 *              request at a time: kvdock pings against a raw blocking
 *              echo (a thread per connection, one read and one write per
 *              message), requests per second and p50 / p99 round trip
 *   spinraw    one client against a raw echo whose two sides poll the
 *              socket without sleeping for 100 us before they block: the
 *              best a socket does for one client, beside kvdock's ping
 *   pipelined  N clients keeping W one-slot transfers (host pools) in
 *              flight, as `kvdock bench` does, against a raw echo whose
 *              client writes one message a call and reads one reply a call
 *
 * --only raw or --only kvdock runs one side (to profile it).
 * --daemon-pid PID adds to each row the CPU time kvdockd's loop thread (its
 * main thread) spent per kvdock request over that row's runs (connecting
 * and creating pools included), from /proc/PID/task/PID/schedstat: what
 * bounds one loop thread's requests a second; and the CPU time of all its
 * threads per request ("daemon": the loop, I/O threads, backend workers).
 *
 * The raw server runs in a child process forked before any thread starts.
 * Its messages have the sizes of kvdock's frames (the request and reply
 * of a ping, of a one-slot transfer), measured from the daemon's byte
 * counters before the first round.  Rounds alternate raw and kvdock; each
 * figure is the median over rounds, and "kvdock / raw" divides medians.
 * The daemon's own options (busy polling) are whatever it was started
 * with; the client's spin is libkvdock's default ($KVDOCK_SPIN_US).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "kvdock/client.h"

#define MAX_CLIENTS 256
#define MAX_LIST 8
#define MAX_ROUNDS 31
#define MAX_WINDOW 256
#define MAX_MSG 4096
#define SMALL_SLOTS 256
#define RAW_SPIN_US 100

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* ---- the raw echo ---------------------------------------------------------- */

/* What a raw client asks of its server thread, first on the connection. */
typedef struct raw_hello {
    uint32_t req, rep; /* message sizes */
    uint32_t spin_us;  /* poll without sleeping this long before blocking */
} raw_hello_t;

static int full_io(int fd, void *buf, size_t len, int wr, uint32_t spin_us)
{
    size_t off = 0;

    while (off < len) {
        ssize_t n;

        if (!wr && spin_us > 0) {
            double until = now_us() + spin_us;
            do
                n = recv(fd, (char *)buf + off, len - off, MSG_DONTWAIT);
            while (n < 0 && errno == EAGAIN && now_us() < until);
            if (n < 0 && errno == EAGAIN)
                n = recv(fd, (char *)buf + off, len - off, 0);
        } else {
            n = wr ? send(fd, (const char *)buf + off, len - off, MSG_NOSIGNAL)
                   : recv(fd, (char *)buf + off, len - off, 0);
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        off += (size_t)n;
    }
    return 0;
}

static void *raw_serve(void *arg)
{
    int fd = (int)(intptr_t)arg;
    uint8_t buf[MAX_MSG];
    raw_hello_t h;

    if (full_io(fd, &h, sizeof(h), 0, 0) == 0 && h.req <= MAX_MSG && h.rep <= MAX_MSG) {
        memset(buf, 0x5a, sizeof(buf));
        while (full_io(fd, buf, h.req, 0, h.spin_us) == 0 &&
               full_io(fd, buf, h.rep, 1, 0) == 0)
            ;
    }
    close(fd);
    return NULL;
}

static void raw_server(int lfd)
{
    for (;;) {
        pthread_t th;
        pthread_attr_t a;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno == EINTR)
                continue;
            _exit(0);
        }
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&a, 256 << 10);
        if (pthread_create(&th, &a, raw_serve, (void *)(intptr_t)fd) != 0)
            close(fd);
        pthread_attr_destroy(&a);
    }
}

static char raw_path[108];
static pid_t raw_pid = -1;

static int raw_start(void)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int lfd;

    snprintf(raw_path, sizeof(raw_path), "/tmp/kvdock-reqpath-%d.sock", (int)getpid());
    unlink(raw_path);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", raw_path);
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 512) != 0) {
        perror("bench_reqpath: raw socket");
        return -1;
    }
    raw_pid = fork();
    if (raw_pid < 0) {
        perror("bench_reqpath: fork");
        return -1;
    }
    if (raw_pid == 0)
        raw_server(lfd);
    close(lfd);
    return 0;
}

static void raw_stop(void)
{
    if (raw_pid > 0) {
        kill(raw_pid, SIGTERM);
        waitpid(raw_pid, NULL, 0);
    }
    unlink(raw_path);
}

static int raw_connect(uint32_t req, uint32_t rep, uint32_t spin_us)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    raw_hello_t h = {req, rep, spin_us};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", raw_path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        full_io(fd, &h, sizeof(h), 1, 0) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* ---- one run: N client threads ------------------------------------------- */

enum { K_RAW, K_RAW_SPIN, K_KVDOCK };
enum { C_CLOSED, C_PIPELINED };

typedef struct run {
    int kind, mode;
    uint32_t clients, window;
    double seconds;
    const char *socket;
    const char *prefix;
    uint32_t req, rep;            /* raw message sizes */
    /* start line */
    int ready, go;                /* atomic */
    double t0;
    /* out */
    uint64_t requests;
    double elapsed_s;
    double *lat;                  /* sampled round trips, us */
    uint64_t nlat;
    int failed;                   /* atomic */
} run_t;

typedef struct client {
    pthread_t th;
    run_t *r;
    uint32_t index;
    uint64_t done;
    double t_end;
    double *lat;
    uint64_t cap, nlat;
} client_t;

static void record(client_t *c, double us)
{
    c->lat[c->nlat++ % c->cap] = us;
}

static void wait_go(run_t *r)
{
    __atomic_fetch_add(&r->ready, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(&r->go, __ATOMIC_ACQUIRE) == 0)
        usleep(200);
}

static void fail(run_t *r, const char *what, kvd_client_t *cli)
{
    if (__atomic_exchange_n(&r->failed, 1, __ATOMIC_ACQ_REL) == 0)
        fprintf(stderr, "bench_reqpath: %s: %s\n", what,
                cli != NULL ? kvd_client_last_error(cli) : strerror(errno));
}

static void run_raw(client_t *c)
{
    run_t *r = c->r;
    uint8_t buf[MAX_MSG];
    int fd = raw_connect(r->req, r->rep, r->kind == K_RAW_SPIN ? RAW_SPIN_US : 0);
    uint32_t spin = r->kind == K_RAW_SPIN ? RAW_SPIN_US : 0, inflight = 0;
    double end, t_sent[MAX_WINDOW];
    uint64_t head = 0;

    if (fd < 0)
        fail(r, "raw connect", NULL);
    memset(buf, 0xa5, sizeof(buf));
    wait_go(r);
    if (fd < 0 || r->go != 1)
        goto out;
    end = r->t0 + r->seconds * 1e6;
    for (;;) {
        double t = now_us();

        if (r->mode == C_PIPELINED && t < end && inflight < r->window) {
            if (full_io(fd, buf, r->req, 1, 0) != 0)
                break;
            t_sent[(head + inflight++) % r->window] = t;
            continue;
        }
        if (r->mode == C_CLOSED) {
            if (t >= end)
                break;
            if (full_io(fd, buf, r->req, 1, 0) != 0 || full_io(fd, buf, r->rep, 0, spin) != 0)
                break;
            record(c, now_us() - t);
            c->done++;
            continue;
        }
        if (inflight == 0)
            break;
        if (full_io(fd, buf, r->rep, 0, spin) != 0)
            break;
        record(c, now_us() - t_sent[head % r->window]);
        head++;
        inflight--;
        c->done++;
    }
    c->t_end = now_us();
out:
    if (fd >= 0)
        close(fd);
}

static void run_kvdock(client_t *c)
{
    run_t *r = c->r;
    kvd_client_t *cli = NULL;
    kvd__bench_pair_t pp;
    kvd_op_result_t res[MAX_WINDOW];
    uint64_t ids[MAX_WINDOW], head = 0, i = 0;
    double t_sent[MAX_WINDOW], end;
    uint32_t inflight = 0;
    char tag[16];
    kvd_status_t st;

    memset(&pp, 0, sizeof(pp));
    snprintf(tag, sizeof(tag), "c%u", c->index);
    if (kvd_client_create(r->socket, "bench-reqpath", &cli) != KVD_OK)
        fail(r, "connect", NULL);
    else if (r->mode == C_PIPELINED &&
             kvd__bench_pair_create(cli, r->prefix, tag, KVD_MEM_HOST, 1, SMALL_SLOTS, 2048,
                                    &pp) != KVD_OK)
        fail(r, "pool create", cli);
    wait_go(r);
    if (cli == NULL || r->go != 1 || __atomic_load_n(&r->failed, __ATOMIC_ACQUIRE))
        goto out;
    end = r->t0 + r->seconds * 1e6;
    for (;;) {
        double t = now_us();

        if (r->mode == C_CLOSED) {
            if (t >= end)
                break;
            if ((st = kvd_ping(cli, NULL, 0)) != KVD_OK) {
                fail(r, "ping", cli);
                break;
            }
            record(c, now_us() - t);
            c->done++;
            continue;
        }
        if (t < end && inflight < r->window) {
            uint32_t slot = (uint32_t)((head + inflight) % r->window);
            int64_t s = (int64_t)(i % SMALL_SLOTS), d = (int64_t)((i * 7 + 3) % SMALL_SLOTS);
            kvd_kv_transfer_t x;

            i++;
            memset(&x, 0, sizeof(x));
            x.src_pool = pp.a.id;
            x.dst_pool = pp.b.id;
            x.src = (kvd_indices_t){.values = &s, .count = 1, .dtype = KVD_DTYPE_I64};
            x.dst = (kvd_indices_t){.values = &d, .count = 1, .dtype = KVD_DTYPE_I64};
            if (kvd_kv_transfer_submit(cli, &x, NULL, &res[slot], &ids[slot]) != KVD_OK) {
                fail(r, "transfer submit", cli);
                break;
            }
            t_sent[slot] = t;
            inflight++;
            continue;
        }
        if (inflight == 0)
            break;
        if (kvd_client_wait(cli, ids[head % r->window]) != KVD_OK) {
            fail(r, "transfer", cli);
            break;
        }
        record(c, now_us() - t_sent[head % r->window]);
        head++;
        inflight--;
        c->done++;
    }
    c->t_end = now_us();
out:
    while (inflight > 0 && cli != NULL && kvd_client_connected(cli)) {
        (void)kvd_client_wait(cli, ids[head++ % r->window]);
        inflight--;
    }
    if (cli != NULL)
        (void)kvd__bench_pair_drop(cli, &pp);
    kvd_client_destroy(&cli);
}

static void *client_main(void *arg)
{
    client_t *c = arg;

    if (c->r->kind == K_KVDOCK)
        run_kvdock(c);
    else
        run_raw(c);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static double pct(const double *v, uint64_t n, double p)
{
    uint64_t i = (uint64_t)(p * (double)(n - 1) + 0.5);

    return n == 0 ? 0 : v[i < n ? i : n - 1];
}

typedef struct fig {
    double rps, p50, p99;
} fig_t;

static int run_once(run_t *r, fig_t *out)
{
    client_t *cs = calloc(r->clients, sizeof(*cs));
    uint64_t cap = 400000 / r->clients + 1024, total = 0;
    double t_end = 0, *all;
    uint32_t started = 0;

    if (cs == NULL)
        return -1;
    r->ready = r->go = r->failed = 0;
    r->requests = 0;
    for (uint32_t i = 0; i < r->clients; i++) {
        cs[i].r = r;
        cs[i].index = i;
        cs[i].cap = cap;
        cs[i].lat = malloc(cap * sizeof(double));
        if (cs[i].lat == NULL || pthread_create(&cs[i].th, NULL, client_main, &cs[i]) != 0) {
            free(cs[i].lat);
            fail(r, "client thread", NULL);
            break;
        }
        started++;
    }
    while ((uint32_t)__atomic_load_n(&r->ready, __ATOMIC_ACQUIRE) < started)
        usleep(1000);
    r->t0 = now_us();
    __atomic_store_n(&r->go, r->failed || started < r->clients ? -1 : 1, __ATOMIC_RELEASE);
    for (uint32_t i = 0; i < started; i++) {
        pthread_join(cs[i].th, NULL);
        r->requests += cs[i].done;
        total += cs[i].nlat < cs[i].cap ? cs[i].nlat : cs[i].cap;
        if (cs[i].t_end > t_end)
            t_end = cs[i].t_end;
    }
    all = malloc((total ? total : 1) * sizeof(double));
    total = 0;
    for (uint32_t i = 0; i < started; i++) {
        uint64_t n = cs[i].nlat < cs[i].cap ? cs[i].nlat : cs[i].cap;
        if (all != NULL)
            memcpy(all + total, cs[i].lat, n * sizeof(double));
        total += n;
        free(cs[i].lat);
    }
    free(cs);
    if (r->failed || all == NULL) {
        free(all);
        return -1;
    }
    qsort(all, total, sizeof(double), cmp_double);
    out->rps = (double)r->requests / ((t_end - r->t0) / 1e6);
    out->p50 = pct(all, total, 0.50);
    out->p99 = pct(all, total, 0.99);
    free(all);
    return 0;
}

/* ---- frame sizes ------------------------------------------------------------- */

/* Bytes per request and per reply of n calls of one kind, from the daemon's
 * counters (the counting calls' own bytes spread over n: under a byte). */
static int frame_sizes(const char *socket, const char *prefix, int transfer, uint32_t *req,
                       uint32_t *rep)
{
    kvd_client_t *cli = NULL;
    kvd_daemon_stats_t a, b;
    kvd__bench_pair_t pp;
    const uint64_t n = 20000;
    kvd_status_t st = KVD_OK;

    memset(&pp, 0, sizeof(pp));
    if (kvd_client_create(socket, "bench-reqpath", &cli) != KVD_OK) {
        fprintf(stderr, "bench_reqpath: connect %s: %s\n", socket, kvd_client_last_error(NULL));
        return -1;
    }
    if (transfer)
        st = kvd__bench_pair_create(cli, prefix, "sz", KVD_MEM_HOST, 1, SMALL_SLOTS, 2048, &pp);
    if (st == KVD_OK)
        st = kvd_daemon_stats(cli, &a, NULL, 0, NULL, 0);
    for (uint64_t i = 0; i < n && st == KVD_OK; i++) {
        if (transfer) {
            int64_t s = (int64_t)(i % SMALL_SLOTS), d = (int64_t)((i * 7 + 3) % SMALL_SLOTS);
            kvd_kv_transfer_t x;
            kvd_op_result_t res;

            memset(&x, 0, sizeof(x));
            x.src_pool = pp.a.id;
            x.dst_pool = pp.b.id;
            x.src = (kvd_indices_t){.values = &s, .count = 1, .dtype = KVD_DTYPE_I64};
            x.dst = (kvd_indices_t){.values = &d, .count = 1, .dtype = KVD_DTYPE_I64};
            st = kvd_kv_transfer(cli, &x, NULL, &res);
        } else {
            st = kvd_ping(cli, NULL, 0);
        }
    }
    if (st == KVD_OK)
        st = kvd_daemon_stats(cli, &b, NULL, 0, NULL, 0);
    if (st != KVD_OK) {
        fprintf(stderr, "bench_reqpath: measuring frame sizes: %s\n", kvd_client_last_error(cli));
        kvd_client_destroy(&cli);
        return -1;
    }
    *req = (uint32_t)((b.bytes_in - a.bytes_in) / n);
    *rep = (uint32_t)((b.bytes_out - a.bytes_out) / n);
    (void)kvd__bench_pair_drop(cli, &pp);
    kvd_client_destroy(&cli);
    return 0;
}

/* ---- main ------------------------------------------------------------------- */

static int median_fig(fig_t *v, int n, fig_t *out)
{
    double a[MAX_ROUNDS], b[MAX_ROUNDS], c[MAX_ROUNDS];

    for (int i = 0; i < n; i++) {
        a[i] = v[i].rps;
        b[i] = v[i].p50;
        c[i] = v[i].p99;
    }
    qsort(a, (size_t)n, sizeof(double), cmp_double);
    qsort(b, (size_t)n, sizeof(double), cmp_double);
    qsort(c, (size_t)n, sizeof(double), cmp_double);
    out->rps = n % 2 ? a[n / 2] : (a[n / 2 - 1] + a[n / 2]) / 2;
    out->p50 = n % 2 ? b[n / 2] : (b[n / 2 - 1] + b[n / 2]) / 2;
    out->p99 = n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_reqpath --socket PATH [--clients 1,8,64] [--seconds S] [--rounds R]\n"
            "                     [--window W] [--cases closed,spinraw,pipelined] [--only raw|kvdock]\n"
            "                     [--daemon-pid PID]\n");
    exit(2);
}

static int parse_list(const char *s, uint32_t *v, int max)
{
    int n = 0;
    char *end;

    while (*s != '\0' && n < max) {
        unsigned long x = strtoul(s, &end, 10);

        if (end == s || x < 1 || x > MAX_CLIENTS)
            return -1;
        v[n++] = (uint32_t)x;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0')
            return -1;
    }
    return n;
}

/* us of the loop thread's and of all the daemon's threads' CPU per
 * request; < 0: its CPU time could not be read */
static void line(const char *name, const char *fig, const fig_t *raw, const fig_t *kv,
                 double loop_us, double all_us)
{
    printf("%-34s %-7s raw %10.0f req/s p50 %7.1f p99 %8.1f | kvdock %10.0f req/s p50 %7.1f "
           "p99 %8.1f | kvdock/raw %.2f",
           name, fig, raw->rps, raw->p50, raw->p99, kv->rps, kv->p50, kv->p99,
           raw->rps > 0 ? kv->rps / raw->rps : 0);
    if (loop_us >= 0)
        printf(" | loop %.2f us/req", loop_us);
    if (all_us >= 0)
        printf(" | daemon %.2f us/req", all_us);
    printf("\n");
    fflush(stdout);
}

/* ns the thread pid of process pid has run (the first field of
 * /proc/PID/task/PID/schedstat), or -1 when it cannot be read. */
static double thread_cpu_ns(long pid)
{
    char path[64];
    unsigned long long ns = 0;
    FILE *f;
    int ok;

    snprintf(path, sizeof(path), "/proc/%ld/task/%ld/schedstat", pid, pid);
    if ((f = fopen(path, "r")) == NULL)
        return -1;
    ok = fscanf(f, "%llu", &ns) == 1;
    fclose(f);
    return ok ? (double)ns : -1;
}

/* ns all threads of process pid have run (threads that ended are not
 * counted), or -1 when it cannot be read. */
static double process_cpu_ns(long pid)
{
    char path[64];
    double sum = 0;
    struct dirent *e;
    DIR *d;

    snprintf(path, sizeof(path), "/proc/%ld/task", pid);
    if ((d = opendir(path)) == NULL)
        return -1;
    while ((e = readdir(d)) != NULL) {
        unsigned long long ns = 0;
        char p2[96];
        FILE *f;

        if (e->d_name[0] == '.')
            continue;
        snprintf(p2, sizeof(p2), "/proc/%ld/task/%.20s/schedstat", pid, e->d_name);
        if ((f = fopen(p2, "r")) == NULL)
            continue;
        if (fscanf(f, "%llu", &ns) == 1)
            sum += (double)ns;
        fclose(f);
    }
    closedir(d);
    return sum;
}

int main(int argc, char **argv)
{
    const char *socket = NULL, *cases = "closed,spinraw,pipelined", *only = "";
    uint32_t clients[MAX_LIST] = {1, 8, 64};
    int nclients = 3, rounds = 3;
    double seconds = 1.0;
    uint32_t window = 32, ping_req, ping_rep, xfer_req, xfer_rep;
    char prefix[48];
    long daemon_pid = 0;
    int rc = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (v == NULL)
            usage();
        if (strcmp(a, "--socket") == 0)
            socket = v;
        else if (strcmp(a, "--clients") == 0 && (nclients = parse_list(v, clients, MAX_LIST)) > 0)
            ;
        else if (strcmp(a, "--seconds") == 0 && (seconds = atof(v)) > 0 && seconds <= 600)
            ;
        else if (strcmp(a, "--rounds") == 0 && (rounds = atoi(v)) >= 1 && rounds <= MAX_ROUNDS)
            ;
        else if (strcmp(a, "--window") == 0 && (window = (uint32_t)atoi(v)) >= 1 &&
                 window <= MAX_WINDOW)
            ;
        else if (strcmp(a, "--cases") == 0)
            cases = v;
        else if (strcmp(a, "--daemon-pid") == 0 && (daemon_pid = atol(v)) > 0)
            ;
        else if (strcmp(a, "--only") == 0 && (strcmp(v, "raw") == 0 || strcmp(v, "kvdock") == 0))
            only = v;
        else
            usage();
        i++;
    }
    if (socket == NULL)
        usage();
    /* the raw server forks before any thread exists */
    if (raw_start() != 0)
        return 1;
    kvd__bench_prefix(prefix, sizeof(prefix));
    if (frame_sizes(socket, prefix, 0, &ping_req, &ping_rep) != 0 ||
        frame_sizes(socket, prefix, 1, &xfer_req, &xfer_rep) != 0) {
        raw_stop();
        return 1;
    }
    printf("bench_reqpath: frames: ping %u / %u bytes, one-slot transfer %u / %u bytes; "
           "%.2f s a run, %d rounds, medians\n",
           ping_req, ping_rep, xfer_req, xfer_rep, seconds, rounds);
    for (int ci = 0; ci < 3 && rc == 0; ci++) {
        static const char *names[] = {"closed", "spinraw", "pipelined"};
        int mode = ci == 2 ? C_PIPELINED : C_CLOSED;

        if (strstr(cases, names[ci]) == NULL)
            continue;
        for (int k = 0; k < nclients && rc == 0; k++) {
            fig_t raw[MAX_ROUNDS], kv[MAX_ROUNDS], mr, mk;
            char name[64];
            uint32_t n = clients[k];
            double loop_ns = 0, loop_us = -1, all_ns = 0, all_us = -1;
            uint64_t loop_reqs = 0;

            if (ci == 1 && n != 1)
                continue;
            for (int j = 0; j < rounds && rc == 0; j++) {
                run_t r = {.mode = mode, .clients = n, .window = window, .seconds = seconds,
                           .socket = socket, .prefix = prefix};

                r.kind = ci == 1 ? K_RAW_SPIN : K_RAW;
                r.req = mode == C_PIPELINED ? xfer_req : ping_req;
                r.rep = mode == C_PIPELINED ? xfer_rep : ping_rep;
                memset(&raw[j], 0, sizeof(raw[j]));
                memset(&kv[j], 0, sizeof(kv[j]));
                if (strcmp(only, "kvdock") != 0 && run_once(&r, &raw[j]) != 0)
                    rc = 1;
                r.kind = K_KVDOCK;
                if (rc == 0 && strcmp(only, "raw") != 0) {
                    double c0 = daemon_pid > 0 ? thread_cpu_ns(daemon_pid) : -1, c1;
                    double a0 = daemon_pid > 0 ? process_cpu_ns(daemon_pid) : -1, a1;

                    if (run_once(&r, &kv[j]) != 0)
                        rc = 1;
                    c1 = c0 >= 0 ? thread_cpu_ns(daemon_pid) : -1;
                    a1 = a0 >= 0 ? process_cpu_ns(daemon_pid) : -1;
                    if (c0 >= 0 && c1 >= c0 && a0 >= 0 && a1 >= a0) {
                        loop_ns += c1 - c0;
                        all_ns += a1 - a0;
                        loop_reqs += r.requests;
                    }
                }
            }
            if (loop_reqs > 0) {
                loop_us = loop_ns / 1e3 / (double)loop_reqs;
                all_us = all_ns / 1e3 / (double)loop_reqs;
            }
            if (rc != 0)
                break;
            median_fig(raw, rounds, &mr);
            median_fig(kv, rounds, &mk);
            snprintf(name, sizeof(name), "%s, %u client%s%s", names[ci], n, n == 1 ? "" : "s",
                     mode == C_PIPELINED ? ", window" : "");
            if (mode == C_PIPELINED)
                snprintf(name + strlen(name), sizeof(name) - strlen(name), " %u", window);
            line(name, ci == 2 ? "xfer" : "ping", &mr, &mk, loop_us, all_us);
        }
    }
    raw_stop();
    return rc;
}
