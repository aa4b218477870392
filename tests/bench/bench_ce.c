/*
 * bench_ce: the copy engines' own rate for chunks of one size between
 * device memory and pinned host memory, with no daemon: the yardstick the
 * daemon's copy-engine path is measured against (bench_interference.py
 * runs it alone and beside a worker's decode step).
 *
 * --total bytes (default 512 MiB) are moved per pass as chunks of --chunk
 * bytes, scattered in random order over a device buffer twice as large and
 * in order on the host side (cudaMallocHost), one descriptor a chunk
 * through cudaMemcpyBatchAsync in batches of up to 16,384 on a stream of
 * its own, passes back to back, two in flight, for --seconds; the rate
 * counts the passes completed after the first.
 *
 *   --threads N  N issuing threads, each a stream and its own share of the
 *                chunks (the rate is their sum): whether more threads
 *                issue more descriptors
 *   --pthread    one issuing thread that is not the main thread
 *   --host-random  the host side scattered too, in another random order
 *   --registered the host side as kvdockd's pools and slabs hold it: memfd
 *                pages mapped shared and registered with cudaHostRegister
 *                (portable, mapped) instead of cudaMallocHost memory
 *   --imported   the device side as a worker's cache reaches kvdockd:
 *                allocated by another process (a child of this one) and
 *                opened here through CUDA IPC
 *   --allocs N   the device side as N allocations of equal size (1-64; a
 *                cache of per-layer allocations), the chunks scattered over
 *                all of them
 *   --each       one cudaMemcpyAsync a chunk instead of batches
 *   --gated      instead: one pass queued behind a host function that
 *                holds the stream until every descriptor is issued, so the
 *                time to issue (CPU) and the time the engines take for the
 *                queued pass (GPU) are measured apart: the larger bounds
 *                the rate
 *
 * Usage: bench_ce --chunk BYTES --dir d2h|h2d [--seconds S] [--total BYTES]
 *                 [--threads N] [--pthread] [--host-random] [--registered]
 *                 [--imported] [--allocs N] [--each] [--gated]
 * Prints one JSON object.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH 16384
#define MAX_THREADS 8
#define MAX_ALLOCS 64

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "bench_ce: %s: %s\n", #x, cudaGetErrorString(e_));             \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct share {
    void **dsts;
    const void **srcs;
    size_t *sizes;
    size_t n;         /* chunks in this share */
    size_t chunk;
    double seconds;
    cudaStream_t stream;
    double issue_s;   /* time spent in the issuing calls, timed passes */
    uint64_t moved;   /* bytes of the passes timed */
    double t0, t1;    /* the timed window */
} share_t;

static int issue_each;

static void issue_pass(share_t *s)
{
    struct cudaMemcpyAttributes attr;
    size_t idx = 0;

    if (issue_each) {
        for (size_t i = 0; i < s->n; i++)
            CK(cudaMemcpyAsync(s->dsts[i], s->srcs[i], s->sizes[i], cudaMemcpyDefault, s->stream));
        return;
    }
    memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    for (size_t off = 0; off < s->n; off += BATCH) {
        size_t n = s->n - off < BATCH ? s->n - off : BATCH;
        CK(cudaMemcpyBatchAsync(&s->dsts[off], &s->srcs[off], &s->sizes[off], n, &attr, &idx, 1,
                                s->stream));
    }
}

static int dev_id;

/* Passes back to back, two in flight; the first is not timed. */
static void *run_share(void *arg)
{
    share_t *s = arg;
    cudaEvent_t ev[2];
    double t_end;
    int i;

    CK(cudaSetDevice(dev_id));
    CK(cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&ev[1], cudaEventDisableTiming));
    issue_pass(s); /* warm */
    CK(cudaEventRecord(ev[0], s->stream));
    CK(cudaEventSynchronize(ev[0]));
    s->t0 = now_s();
    t_end = s->t0 + s->seconds;
    for (i = 0;; i++) {
        double a = now_s();
        issue_pass(s);
        s->issue_s += now_s() - a;
        CK(cudaEventRecord(ev[i % 2], s->stream));
        if (i > 0) {
            CK(cudaEventSynchronize(ev[(i - 1) % 2]));
            s->moved += (uint64_t)s->n * s->chunk;
            if (now_s() >= t_end)
                break;
        }
    }
    CK(cudaEventSynchronize(ev[i % 2]));
    s->moved += (uint64_t)s->n * s->chunk;
    s->t1 = now_s();
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    return NULL;
}

static int gate_open, gate_timed_out, host_registered;

/* Holds its stream until the gate opens, or 3 s pass (the issuing call
 * blocked on a full queue: never a hang, and the result says so). */
static void CUDART_CB gate(void *arg)
{
    double until = now_s() + 3.0;
    (void)arg;
    while (!__atomic_load_n(&gate_open, __ATOMIC_ACQUIRE))
        if (now_s() >= until) {
            gate_timed_out = 1;
            break;
        }
}

static void gated(share_t *s, const char *dir)
{
    cudaEvent_t a, b;
    float ms;
    double t, issue_s;


    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    issue_pass(s); /* warm */
    CK(cudaStreamSynchronize(s->stream));
    __atomic_store_n(&gate_open, 0, __ATOMIC_RELEASE);
    CK(cudaLaunchHostFunc(s->stream, gate, NULL));
    CK(cudaEventRecord(a, s->stream));
    t = now_s();
    issue_pass(s);
    issue_s = now_s() - t;
    __atomic_store_n(&gate_open, 1, __ATOMIC_RELEASE);
    CK(cudaEventRecord(b, s->stream));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms, a, b));
    {
        /* a is reached once the gate opens, b once the engines are done */
        double bytes = (double)s->n * (double)s->chunk, engine_s = ms * 1e-3;
        printf("{\"chunk\":%zu,\"dir\":\"%s\",\"gated\":true,\"registered\":%d,\"descriptors\":%zu,"
               "\"issue_ms\":%.3f,\"issue_us_per_descriptor\":%.3f,\"queued_engine_ms\":%.3f,"
               "\"issue_gbps\":%.2f,\"queued_engine_gbps\":%.2f,\"gate_held_out\":%s}\n",
               s->chunk, dir, host_registered, s->n, issue_s * 1e3, issue_s * 1e6 / (double)s->n,
               engine_s * 1e3, bytes / issue_s / 1e9, bytes / engine_s / 1e9,
               gate_timed_out ? "false" : "true");
    }
}

/* --imported: a child process allocates the device side and hands its
 * IPC handles over a pipe, then holds the memory until the parent closes
 * the other pipe (at its exit). Forked before this process touches CUDA. */
static int import_device(char **parts, int allocs, size_t part_bytes)
{
    int up[2], down[2];
    pid_t pid;
    cudaIpcMemHandle_t h[MAX_ALLOCS];

    if (pipe(up) != 0 || pipe(down) != 0)
        return -1;
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        char c;
        close(up[0]);
        close(down[1]);
        for (int a = 0; a < allocs; a++) {
            void *p;
            CK(cudaMalloc(&p, part_bytes));
            CK(cudaMemset(p, 0x5a, part_bytes));
            CK(cudaIpcGetMemHandle(&h[a], p));
        }
        CK(cudaDeviceSynchronize());
        if (write(up[1], h, sizeof(h[0]) * (size_t)allocs) != (ssize_t)(sizeof(h[0]) * (size_t)allocs))
            _exit(1);
        while (read(down[0], &c, 1) > 0)
            ;
        _exit(0);
    }
    close(up[1]);
    close(down[0]); /* down[1] stays open until this process exits */
    {
        size_t want = sizeof(h[0]) * (size_t)allocs, got = 0;
        while (got < want) {
            ssize_t r = read(up[0], (char *)h + got, want - got);
            if (r <= 0)
                return -1;
            got += (size_t)r;
        }
    }
    close(up[0]);
    for (int a = 0; a < allocs; a++)
        CK(cudaIpcOpenMemHandle((void **)&parts[a], h[a], cudaIpcMemLazyEnablePeerAccess));
    return 0;
}

static uint64_t next_rand(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

int main(int argc, char **argv)
{
    size_t chunk = 0, total = (size_t)512 << 20, n, i;
    double seconds = 1.5;
    int d2h = -1, threads = 1, gate_mode = 0, use_pthread = 0, host_random = 0, registered = 0, t;
    int imported = 0, allocs = 1;
    char *parts[MAX_ALLOCS], *host;
    size_t part_chunks;
    size_t *perm, *hperm;
    void **dsts;
    const void **srcs;
    size_t *sizes;
    share_t sh[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    uint64_t rng = 42, moved = 0;
    double issue = 0, t0 = 1e300, t1 = 0;

    const struct {
        const char *name;
        int *on;
    } flags[] = {{"--gated", &gate_mode},         {"--pthread", &use_pthread},
                 {"--host-random", &host_random}, {"--registered", &registered},
                 {"--imported", &imported},       {"--each", &issue_each}};

    for (i = 1; i < (size_t)argc; i++) {
        const char *a = argv[i], *v = i + 1 < (size_t)argc ? argv[i + 1] : NULL;
        size_t f;

        for (f = 0; f < sizeof(flags) / sizeof(flags[0]) && strcmp(a, flags[f].name) != 0; f++)
            ;
        if (f < sizeof(flags) / sizeof(flags[0])) {
            *flags[f].on = 1;
            continue;
        }
        if (v == NULL)
            goto usage;
        i++;
        if (strcmp(a, "--chunk") == 0)
            chunk = strtoull(v, NULL, 0);
        else if (strcmp(a, "--total") == 0)
            total = strtoull(v, NULL, 0);
        else if (strcmp(a, "--seconds") == 0)
            seconds = strtod(v, NULL);
        else if (strcmp(a, "--threads") == 0)
            threads = atoi(v);
        else if (strcmp(a, "--allocs") == 0)
            allocs = atoi(v);
        else if (strcmp(a, "--dir") == 0 && (strcmp(v, "d2h") == 0 || strcmp(v, "h2d") == 0))
            d2h = strcmp(v, "d2h") == 0;
        else
            goto usage;
    }
    if (chunk == 0 || d2h < 0 || threads < 1 || threads > MAX_THREADS || seconds <= 0 ||
        total < chunk * (size_t)threads || chunk % 256 != 0 || allocs < 1 || allocs > MAX_ALLOCS ||
        (gate_mode && issue_each))
        goto usage;
    n = total / chunk;
    /* the device side: 2n chunks' room, in allocs equal parts */
    part_chunks = (2 * n + (size_t)allocs - 1) / (size_t)allocs;
    total = n * chunk;
    if (imported) {
        if (import_device(parts, allocs, part_chunks * chunk) != 0) {
            perror("bench_ce: exporting process");
            return 1;
        }
    }
    CK(cudaGetDevice(&dev_id));
    for (t = 0; t < allocs && !imported; t++) {
        CK(cudaMalloc((void **)&parts[t], part_chunks * chunk));
        CK(cudaMemset(parts[t], 0x5a, part_chunks * chunk));
    }
    host_registered = registered;
    if (registered) {
        int fd = memfd_create("bench_ce", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)total) != 0 ||
            (host = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
            perror("bench_ce: memfd");
            return 1;
        }
        close(fd);
        CK(cudaHostRegister(host, total, cudaHostRegisterPortable | cudaHostRegisterMapped));
    } else {
        CK(cudaMallocHost((void **)&host, total));
    }
    memset(host, 0xa5, total);
    perm = malloc(2 * n * sizeof(*perm));
    hperm = malloc(n * sizeof(*hperm));
    dsts = malloc(n * sizeof(*dsts));
    srcs = malloc(n * sizeof(*srcs));
    sizes = malloc(n * sizeof(*sizes));
    if (!perm || !hperm || !dsts || !srcs || !sizes) {
        fprintf(stderr, "bench_ce: out of memory\n");
        return 1;
    }
    for (i = 0; i < 2 * n; i++)
        perm[i] = i;
    for (i = 2 * n - 1; i > 0; i--) { /* Fisher-Yates */
        size_t j = (size_t)(next_rand(&rng) % (i + 1)), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    for (i = 0; i < n; i++)
        hperm[i] = i;
    for (i = n - 1; host_random && i > 0; i--) {
        size_t j = (size_t)(next_rand(&rng) % (i + 1)), x = hperm[i];
        hperm[i] = hperm[j];
        hperm[j] = x;
    }
    for (i = 0; i < n; i++) {
        char *d = parts[perm[i] / part_chunks] + (perm[i] % part_chunks) * chunk;
        char *h = host + hperm[i] * chunk;
        dsts[i] = d2h ? (void *)h : (void *)d;
        srcs[i] = d2h ? (const void *)d : (const void *)h;
        sizes[i] = chunk;
    }
    for (t = 0; t < threads; t++) {
        size_t lo = n * (size_t)t / (size_t)threads, hi = n * (size_t)(t + 1) / (size_t)threads;
        memset(&sh[t], 0, sizeof(sh[t]));
        sh[t].dsts = dsts + lo;
        sh[t].srcs = srcs + lo;
        sh[t].sizes = sizes + lo;
        sh[t].n = hi - lo;
        sh[t].chunk = chunk;
        sh[t].seconds = seconds;
        CK(cudaStreamCreateWithFlags(&sh[t].stream, cudaStreamNonBlocking));
    }
    if (gate_mode) {
        sh[0].dsts = dsts;
        sh[0].srcs = srcs;
        sh[0].sizes = sizes;
        sh[0].n = n;
        gated(&sh[0], d2h ? "d2h" : "h2d");
        return 0;
    }
    if (threads == 1 && !use_pthread) /* the main thread issues, as a one-thread program's */
        run_share(&sh[0]);
    else
        use_pthread = 1;
    for (t = 0; t < threads && use_pthread; t++)
        if (pthread_create(&th[t], NULL, run_share, &sh[t]) != 0) {
            fprintf(stderr, "bench_ce: cannot start a thread\n");
            return 1;
        }
    for (t = 0; t < threads; t++) {
        if (use_pthread)
            pthread_join(th[t], NULL);
        moved += sh[t].moved;
        issue += sh[t].issue_s;
        t0 = sh[t].t0 < t0 ? sh[t].t0 : t0;
        t1 = sh[t].t1 > t1 ? sh[t].t1 : t1;
    }
    printf("{\"chunk\":%zu,\"dir\":\"%s\",\"threads\":%d,\"pthread\":%d,\"host_random\":%d,\"registered\":%d,"
           "\"imported\":%d,\"allocs\":%d,\"each\":%d,\"gbps\":%.2f,\"seconds\":%.3f,"
           "\"issue_frac\":%.3f,\"t0\":%.6f,\"t1\":%.6f}\n",
           chunk, d2h ? "d2h" : "h2d", threads, use_pthread, host_random, registered, imported, allocs,
           issue_each, (double)moved / (t1 - t0) / 1e9, t1 - t0,
           issue / (t1 - t0) / threads, t0, t1);
    return 0;
usage:
    fprintf(stderr, "usage: bench_ce --chunk BYTES (a multiple of 256) --dir d2h|h2d "
                    "[--seconds S] [--total BYTES] [--threads N (1-%d)] [--pthread] [--host-random] "
                    "[--registered] [--imported] [--allocs N (1-%d)] [--each] [--gated]\n",
            MAX_THREADS, MAX_ALLOCS);
    return 2;
}
