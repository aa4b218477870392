/*
 * bench_paths: the daemon's data paths set against the same work done
 * in-process, on one machine in one run.
 *
 *   all-layer  one all-layer transfer of S slots (a random permutation on
 *              both sides) through a running kvdockd, against the same
 *              kernel (kvd_cuda_kv_transfer on cuda, kvd_cpu_kv_transfer on
 *              cpu) called here on memory of the same shape, with the
 *              kernel reading its indices from the same kind of memory on
 *              both sides: inline indices (which the daemon stages in
 *              pinned host memory) against an in-process call on pinned
 *              indices, and indices in a registered device buffer against
 *              one on device indices (host memory on cpu).  Target: the
 *              daemon within 1.1 times in-process.
 *
 *   chunks     the copy-engine curve through the daemon: --chunk-total
 *              bytes (default 1 GiB) moved between a device pool and a
 *              host pool as chunks of 2 KiB to 2 MiB, scattered in random
 *              order on the device side and in order on the host side (as
 *              shared/tools/dma_chunks.cu moves them, the yardstick to run
 *              beside it), each direction by one transfer request, on the
 *              copy engines and on kernels; and both directions at once.
 *              Each figure is the best of 3 timed requests after one warm.
 *
 * Usage: bench_paths [--case all-layer|chunks|both] [--socket PATH] [--json]
 *        [--iterations N] [--layers N] [--slots N] [--slot-bytes N]
 *        [--max-blocks N] [--kind host|device] [--chunk-total BYTES]
 * The pools it makes are private to its connection.  Figures go to stdout
 * (a table, or one JSON object with --json).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "kvdock/client.h"
#include "kvdock/kernels.h"
#include "util.h"

#ifdef KVD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define TARGET_RATIO 1.1
#define POOL_ALIGN 256u /* the daemon's layout: K and V blocks start on 256 bytes */

typedef struct opts {
    const char *socket;
    bool json;
    uint64_t iterations; /* timed transfers per figure */
    uint32_t layers;
    uint64_t slots;
    uint64_t slot_bytes;
    uint32_t max_blocks; /* 0: the daemon's budget of the stream class */
    int32_t kind;        /* 0: by backend */
    int cases;           /* CASE_* bits */
    uint64_t chunk_total;
} opts_t;

enum { CASE_ALL_LAYER = 1, CASE_CHUNKS = 2 };

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

static int fail(kvd_client_t *cli, kvd_status_t st, const char *what)
{
    const char *msg = kvd_client_last_error(cli);

    fprintf(stderr, "\nbench_paths: %s: %s: %s\n", what, kvd_err_name(st),
            msg[0] != '\0' ? msg : kvd_strerror(st));
    return 1;
}

/* ------------------------------------------------------------------------ */
/* all-layer: the daemon against the kernel in-process                       */

/* The in-process side: memory of the daemon pools' shape, and the kernel. */
typedef struct inproc {
    bool cuda;
    bool pinned; /* cuda: src and dst in pinned host memory (host pools) */
    void *src, *dst;        /* layers x layer_stride each */
    int64_t *idx_src, *idx_dst; /* where the kernel reads them */
    unsigned long long *oob;
    void *stream;
    uint64_t layer_stride, v_offset;
} inproc_t;

static kvd_status_t inproc_call(const opts_t *o, const inproc_t *ip, uint32_t max_blocks)
{
    kvd_transfer_args_t a;
    kvd_launch_t l;

    memset(&a, 0, sizeof(a));
    a.src.k = ip->src;
    a.src.v = (char *)ip->src + ip->v_offset;
    a.src.layer_stride = (int64_t)ip->layer_stride;
    a.src.slot_stride = (int64_t)o->slot_bytes;
    a.src.num_slots = (int64_t)o->slots;
    a.dst = a.src;
    a.dst.k = ip->dst;
    a.dst.v = (char *)ip->dst + ip->v_offset;
    a.num_layers = o->layers;
    a.src_idx = ip->idx_src;
    a.dst_idx = ip->idx_dst;
    a.idx_dtype = KVD_DTYPE_I64;
    a.count = (int64_t)o->slots;
    a.row_bytes = (int64_t)o->slot_bytes;
    a.oob_count = ip->oob;
    l.stream = ip->stream;
    l.max_blocks = max_blocks;
    l.flags = 0;
#ifdef KVD_HAVE_CUDA
    if (ip->cuda) {
        kvd_status_t st = kvd_cuda_kv_transfer(&a, &l);

        if (st != KVD_OK)
            return st;
        return cudaStreamSynchronize((cudaStream_t)ip->stream) == cudaSuccess ? KVD_OK
                                                                               : KVD_ECUDA;
    }
#endif
    return kvd_cpu_kv_transfer(&a, &l);
}

/* Time iters in-process calls after warm ones. */
static int inproc_time(const opts_t *o, const inproc_t *ip, uint32_t max_blocks,
                       uint64_t warm, uint64_t iters, kvd__bench_progress_t *p, double p0, double p1,
                       kvd__bench_lat_t *out)
{
    double *v = malloc((size_t)iters * sizeof(*v));
    kvd_status_t st;

    if (v == NULL) {
        fprintf(stderr, "bench_paths: out of memory\n");
        return 1;
    }
    for (uint64_t i = 0; i < warm + iters; i++) {
        double t0 = kvd__cli_now_us();

        st = inproc_call(o, ip, max_blocks);
        if (i >= warm)
            v[i - warm] = kvd__cli_now_us() - t0;
        if (st != KVD_OK) {
            fprintf(stderr, "\nbench_paths: in-process transfer: %s: %s\n", kvd_err_name(st),
                    kvd_last_error_detail());
            free(v);
            return 1;
        }
        kvd__bench_progress_set(p, p0 + (p1 - p0) * (double)(i + 1) / (double)(warm + iters));
    }
    kvd__bench_lat(out, v, iters);
    free(v);
    return 0;
}

static void inproc_free(inproc_t *ip)
{
#ifdef KVD_HAVE_CUDA
    if (ip->cuda) {
        if (ip->pinned) {
            cudaFreeHost(ip->src);
            cudaFreeHost(ip->dst);
        } else {
            cudaFree(ip->src);
            cudaFree(ip->dst);
        }
        cudaFree(ip->idx_src);
        cudaFree(ip->idx_dst);
        cudaFreeHost(ip->oob);
        if (ip->stream)
            cudaStreamDestroy((cudaStream_t)ip->stream);
        (void)cudaGetLastError();
        memset(ip, 0, sizeof(*ip));
        return;
    }
#endif
    free(ip->src);
    free(ip->dst);
    free(ip->idx_src);
    free(ip->idx_dst);
    free(ip->oob);
    memset(ip, 0, sizeof(*ip));
}

/* Memory for the in-process side; *why says why when there is none. */
static kvd_status_t inproc_alloc(const opts_t *o, bool cuda, bool host, int device,
                                 const int64_t *ps, const int64_t *pd, uint64_t bytes, inproc_t *ip,
                                 char *why, size_t why_len)
{
    size_t ib = (size_t)o->slots * sizeof(int64_t);

    memset(ip, 0, sizeof(*ip));
    ip->cuda = cuda;
    ip->pinned = cuda && host;
    ip->v_offset = align_up(o->slots * o->slot_bytes, POOL_ALIGN);
    ip->layer_stride = 2 * ip->v_offset;
    if (cuda) {
#ifdef KVD_HAVE_CUDA
        cudaStream_t s = NULL;
        unsigned hf = cudaHostAllocPortable | cudaHostAllocMapped;

        if (cudaSetDevice(device) != cudaSuccess ||
            (host ? cudaHostAlloc(&ip->src, (size_t)bytes, hf)
                  : cudaMalloc(&ip->src, (size_t)bytes)) != cudaSuccess ||
            (host ? cudaHostAlloc(&ip->dst, (size_t)bytes, hf)
                  : cudaMalloc(&ip->dst, (size_t)bytes)) != cudaSuccess ||
            cudaMalloc((void **)&ip->idx_src, ib) != cudaSuccess ||
            cudaMalloc((void **)&ip->idx_dst, ib) != cudaSuccess ||
            cudaHostAlloc((void **)&ip->oob, sizeof(*ip->oob), cudaHostAllocMapped) !=
                cudaSuccess ||
            cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
            cudaMemcpy(ip->idx_src, ps, ib, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(ip->idx_dst, pd, ib, cudaMemcpyHostToDevice) != cudaSuccess ||
            (host ? (memset(ip->src, 0x5a, (size_t)bytes), cudaSuccess)
                  : cudaMemset(ip->src, 0x5a, (size_t)bytes)) != cudaSuccess ||
            (host ? (memset(ip->dst, 0, (size_t)bytes), cudaSuccess)
                  : cudaMemset(ip->dst, 0, (size_t)bytes)) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess) {
            snprintf(why, why_len, "CUDA: %s", cudaGetErrorString(cudaGetLastError()));
            ip->stream = s;
            inproc_free(ip);
            return KVD_ECUDA;
        }
        ip->stream = s;
        *ip->oob = 0;
        return KVD_OK;
#else
        (void)device;
        (void)host;
        snprintf(why, why_len, "built without CUDA: no in-process kernel");
        return KVD_ENOTSUP;
#endif
    }
    ip->src = malloc((size_t)bytes);
    ip->dst = malloc((size_t)bytes);
    ip->idx_src = malloc(ib);
    ip->idx_dst = malloc(ib);
    ip->oob = calloc(1, sizeof(*ip->oob));
    if (ip->src == NULL || ip->dst == NULL || ip->idx_src == NULL || ip->idx_dst == NULL ||
        ip->oob == NULL) {
        snprintf(why, why_len, "out of memory for %" PRIu64 " bytes", 2 * bytes);
        inproc_free(ip);
        return KVD_ENOMEM;
    }
    memset(ip->src, 0x5a, (size_t)bytes); /* touch every page before timing */
    memset(ip->dst, 0, (size_t)bytes);
    memcpy(ip->idx_src, ps, ib);
    memcpy(ip->idx_dst, pd, ib);
    return KVD_OK;
}

#ifdef KVD_HAVE_CUDA
/* The same call with the indices in pinned host memory, which is where the
 * daemon stages inline indices: the difference to the device-index call is
 * what reading them over the bus costs the kernel. */
static int inproc_pinned(const opts_t *o, inproc_t *ip, uint32_t max_blocks, uint64_t warm,
                         uint64_t iters, const int64_t *ps, const int64_t *pd, kvd__bench_progress_t *p,
                         kvd__bench_lat_t *out)
{
    size_t ib = (size_t)o->slots * sizeof(int64_t);
    int64_t *hs = NULL, *hd = NULL, *ds = ip->idx_src, *dd = ip->idx_dst;
    int rc;

    if (cudaHostAlloc((void **)&hs, ib, cudaHostAllocMapped) != cudaSuccess ||
        cudaHostAlloc((void **)&hd, ib, cudaHostAllocMapped) != cudaSuccess) {
        cudaFreeHost(hs);
        (void)cudaGetLastError();
        return -1; /* not a failure of the bench: that figure is left out */
    }
    memcpy(hs, ps, ib);
    memcpy(hd, pd, ib);
    ip->idx_src = hs;
    ip->idx_dst = hd;
    rc = inproc_time(o, ip, max_blocks, warm, iters, p, 0.9, 1.0, out);
    ip->idx_src = ds;
    ip->idx_dst = dd;
    cudaFreeHost(hs);
    cudaFreeHost(hd);
    return rc;
}
#endif

typedef struct all_layer {
    uint64_t bytes; /* written per transfer */
    uint32_t max_blocks;
    kvd__bench_lat_t daemon, daemon_buf, inproc, inproc_pinned;
    bool have_daemon_buf, have_inproc, have_inproc_pinned;
    char inproc_why[160];
    /* daemon over in-process with the kernel reading its indices from the
     * same kind of memory: inline against pinned (cpu: host), buffer
     * against device; cross: inline against device, for reference */
    double ratio_inline, ratio_buffer, ratio_cross;
    bool have_ratio_inline, have_ratio_buffer;
} all_layer_t;

/* The d2d stream's thread-block budget (host to host and device to device
 * both run there). */
static uint32_t d2d_budget(kvd_client_t *cli)
{
    kvd_daemon_stats_t s;
    kvd_stream_stats_t streams[16];

    if (kvd_daemon_stats(cli, &s, NULL, 0, streams, 16) != KVD_OK)
        return 0;
    for (size_t i = 0; i < s.num_streams && i < 16; i++)
        if (strcmp(streams[i].name, "d2d") == 0)
            return streams[i].max_blocks;
    return 0;
}

static int run_all_layer(kvd_client_t *cli, const opts_t *o, int32_t kind, bool cuda, int device,
                         all_layer_t *res)
{
    uint64_t iters = o->iterations, warm = 2, ibuf = 0, bytes;
    size_t half = (size_t)o->slots * sizeof(int64_t);
    int64_t *ps = malloc(half), *pd = malloc(half);
    double *v = malloc((size_t)iters * sizeof(double));
    kvd__bench_progress_t p;
    kvd__bench_pair_t pp;
    kvd_sync_t sync;
    kvd_mapping_t *imap = NULL;
    inproc_t ip;
    bool have_ip = false;
    char prefix[48];
    kvd_status_t st;
    int rc = 0;

    memset(&pp, 0, sizeof(pp));
    memset(&ip, 0, sizeof(ip));
    kvd__bench_progress_start(&p, isatty(STDERR_FILENO) != 0, "all-layer transfer");
    if (ps == NULL || pd == NULL || v == NULL) {
        rc = fail(NULL, KVD_ENOMEM, "memory");
        goto out;
    }
    kvd__bench_permutation(ps, o->slots, 1);
    kvd__bench_permutation(pd, o->slots, 2);
    res->bytes = o->slots * o->slot_bytes * 2 * o->layers;
    res->max_blocks = o->max_blocks ? o->max_blocks : d2d_budget(cli);
    kvd__bench_prefix(prefix, sizeof(prefix));
    st = kvd__bench_pair_create(cli, prefix, "all", kind, o->layers, o->slots, o->slot_bytes, &pp);
    if (st != KVD_OK) {
        rc = fail(cli, st, "pool create");
        goto out;
    }
    bytes = (uint64_t)o->layers * pp.a.layer_stride;
    if (pp.a.layer_stride != 2 * align_up(o->slots * o->slot_bytes, POOL_ALIGN) ||
        pp.a.v_offset != align_up(o->slots * o->slot_bytes, POOL_ALIGN)) {
        fprintf(stderr, "bench_paths: the daemon's pool layout differs from the in-process one "
                        "(layer_stride %" PRIu64 ", v_offset %" PRIu64 ")\n",
                pp.a.layer_stride, pp.a.v_offset);
        rc = 1;
        goto out;
    }
    /* through the daemon: inline indices, then indices in a registered buffer */
    memset(&sync, 0, sizeof(sync));
    sync.max_blocks = res->max_blocks;
    st = kvd__bench_all_layer(cli, &pp, o->slots, &sync, ps, pd, 0, warm, iters, &p, 0.0, 0.3, v,
                              &res->daemon);
    if (st != KVD_OK) {
        rc = fail(cli, st, "all-layer transfer");
        goto out;
    }
    st = kvd_buffer_register(cli, 2 * half, cuda ? KVD_MEM_DEVICE : KVD_MEM_HOST, "bench-indices",
                             &ibuf, &imap);
    if (st != KVD_OK || kvd_mapping_write(imap, 0, ps, half) != KVD_OK ||
        kvd_mapping_write(imap, half, pd, half) != KVD_OK) {
        rc = fail(cli, st != KVD_OK ? st : KVD_ECUDA, "index buffer");
        goto out;
    }
    st = kvd__bench_all_layer(cli, &pp, o->slots, &sync, ps, pd, ibuf, warm, iters, &p, 0.3, 0.45,
                              v, &res->daemon_buf);
    if (st != KVD_OK) {
        rc = fail(cli, st, "all-layer transfer, buffer indices");
        goto out;
    }
    res->have_daemon_buf = true;

    /* the same kernel here */
    st = inproc_alloc(o, cuda, kind == KVD_MEM_HOST, device, ps, pd, bytes, &ip, res->inproc_why,
                      sizeof(res->inproc_why));
    if (st == KVD_OK) {
        have_ip = true;
        rc = inproc_time(o, &ip, res->max_blocks, warm, iters, &p, 0.45, cuda ? 0.9 : 1.0,
                         &res->inproc);
        if (rc != 0)
            goto out;
        res->have_inproc = true;
#ifdef KVD_HAVE_CUDA
        if (cuda) {
            rc = inproc_pinned(o, &ip, res->max_blocks, warm, iters, ps, pd, &p,
                               &res->inproc_pinned);
            if (rc > 0)
                goto out;
            res->have_inproc_pinned = rc == 0;
            rc = 0;
        }
#endif
        if (res->inproc.p50 > 0) {
            res->ratio_cross = res->daemon.p50 / res->inproc.p50;
            /* cpu: in-process indices are host memory, as the daemon's */
            res->have_ratio_inline = !cuda;
            res->ratio_inline = res->ratio_cross;
            res->have_ratio_buffer = true;
            res->ratio_buffer = res->daemon_buf.p50 / res->inproc.p50;
        }
        if (res->have_inproc_pinned && res->inproc_pinned.p50 > 0) {
            res->have_ratio_inline = true;
            res->ratio_inline = res->daemon.p50 / res->inproc_pinned.p50;
        }
    }
    kvd__bench_progress_end(&p, "done");
out:
    if (have_ip)
        inproc_free(&ip);
    kvd_mapping_destroy(&imap);
    if (ibuf != 0 && (st = kvd_buffer_drop(cli, ibuf)) != KVD_OK && rc == 0)
        rc = fail(cli, st, "index buffer drop");
    st = kvd__bench_pair_drop(cli, &pp);
    if (st != KVD_OK && rc == 0)
        rc = fail(cli, st, "pool drop");
    free(ps);
    free(pd);
    free(v);
    return rc;
}

static const char *verdict(bool have, bool pass)
{
    return !have ? "n/a" : pass ? "PASS" : "MISS";
}

static void print_all_layer(const opts_t *o, const all_layer_t *r)
{
    printf("all-layer transfer: %u layers x %" PRIu64 " slots x %" PRIu64 " bytes (MHA), %" PRIu64
           " runs, thread blocks %u\n\n",
           o->layers, o->slots, o->slot_bytes, o->iterations, r->max_blocks);
    printf("%-46s %12s %10s\n", "PATH", "p50", "GB/s");
    printf("%-46s %9.1f us %10.1f\n", "daemon, inline indices", r->daemon.p50,
           (double)r->bytes / r->daemon.p50 / 1e3);
    printf("%-46s %9.1f us %10.1f\n", "daemon, indices in a registered buffer", r->daemon_buf.p50,
           (double)r->bytes / r->daemon_buf.p50 / 1e3);
    if (r->have_inproc)
        printf("%-46s %9.1f us %10.1f\n", "in-process, device (cpu: host) indices", r->inproc.p50,
               (double)r->bytes / r->inproc.p50 / 1e3);
    else
        printf("(no in-process figure: %s)\n", r->inproc_why);
    if (r->have_inproc_pinned)
        printf("%-46s %9.1f us %10.1f\n", "in-process, indices in pinned host memory",
               r->inproc_pinned.p50, (double)r->bytes / r->inproc_pinned.p50 / 1e3);
    printf("\n%-46s %8s %8s %s\n", "RATIO (daemon / in-process)", "VALUE", "TARGET", "RESULT");
    printf("%-46s %8.3f %8s %s\n", "inline indices / pinned indices", r->ratio_inline, "<= 1.1",
           verdict(r->have_ratio_inline, r->ratio_inline <= TARGET_RATIO));
    printf("%-46s %8.3f %8s %s\n", "buffer indices / device indices", r->ratio_buffer, "<= 1.1",
           verdict(r->have_ratio_buffer, r->ratio_buffer <= TARGET_RATIO));
    printf("%-46s %8.3f %8s %s\n", "inline indices / device indices", r->ratio_cross, "-", "-");
}

static void json_lat(const char *key, const kvd__bench_lat_t *l)
{
    printf("\"%s\":{\"count\":%" PRIu64 ",\"p50_us\":%.3f,\"p99_us\":%.3f,\"mean_us\":%.3f}",
           key, l->count, l->p50, l->p99, l->mean);
}

static void json_all_layer(const opts_t *o, const all_layer_t *r)
{
    printf("\"all_layer\":{\"layers\":%u,\"slots\":%" PRIu64 ",\"slot_bytes\":%" PRIu64
           ",\"bytes\":%" PRIu64 ",\"max_blocks\":%u,",
           o->layers, o->slots, o->slot_bytes, r->bytes, r->max_blocks);
    json_lat("daemon", &r->daemon);
    printf(",");
    json_lat("daemon_buffer_indices", &r->daemon_buf);
    if (r->have_inproc) {
        printf(",");
        json_lat("in_process", &r->inproc);
    }
    if (r->have_inproc_pinned) {
        printf(",");
        json_lat("in_process_pinned_indices", &r->inproc_pinned);
    }
    printf(",\"ratio_inline\":");
    r->have_ratio_inline ? printf("%.4f", r->ratio_inline) : printf("null");
    printf(",\"ratio_buffer\":");
    r->have_ratio_buffer ? printf("%.4f", r->ratio_buffer) : printf("null");
    printf(",\"target_ratio\":%.2f,\"pass\":%s}", TARGET_RATIO,
           r->have_ratio_inline && r->ratio_inline <= TARGET_RATIO &&
                   (!r->have_ratio_buffer || r->ratio_buffer <= TARGET_RATIO)
               ? "true"
               : "false");
}

/* ------------------------------------------------------------------------ */
/* chunks: the copy-engine curve                                             */

#define NCHUNK 10
static const uint64_t chunk_sizes[NCHUNK] = {2048,  4096,   8192,    16384,   32768,
                                             65536, 131072, 262144, 1 << 20, 2 << 20};

typedef struct chunk_row {
    uint64_t bytes;
    double ce_d2h, ce_h2d, k_d2h, k_h2d, both; /* GB/s; both: d2h + h2d at once */
} chunk_row_t;

/* Best of 3 timed requests (after a warm one) of transfer t with sync s,
 * as GB/s of bytes; n requests at once when n is 2 (t[0] and t[1]). */
static kvd_status_t time_requests(kvd_client_t *cli, const kvd_kv_transfer_t *t, int n,
                                  const kvd_sync_t *s, uint64_t bytes, double *gbps)
{
    double best = 0;

    for (int rep = 0; rep < 4; rep++) {
        uint64_t id[2];
        kvd_op_result_t r[2];
        double t0 = kvd__cli_now_us(), us;
        kvd_status_t st;

        for (int i = 0; i < n; i++)
            if ((st = kvd_kv_transfer_submit(cli, &t[i], s, &r[i], &id[i])) != KVD_OK)
                return st;
        for (int i = 0; i < n; i++)
            if ((st = kvd_client_wait(cli, id[i])) != KVD_OK)
                return st;
        us = kvd__cli_now_us() - t0;
        if (r[0].path != s->path)
            return KVD_EINTERNAL;
        if (rep > 0 && (double)bytes / us / 1e3 > best)
            best = (double)bytes / us / 1e3;
    }
    *gbps = best;
    return KVD_OK;
}

static int run_chunks(kvd_client_t *cli, const opts_t *o, chunk_row_t *rows)
{
    const uint64_t total = o->chunk_total;
    uint64_t nmax = total / chunk_sizes[0], ib = 0, dev_id = 0, host_id = 0;
    kvd_mapping_t *imap = NULL;
    int64_t *perm = malloc(2 * nmax * sizeof(int64_t)), *seq = malloc(nmax * sizeof(int64_t));
    kvd__bench_progress_t p;
    char prefix[48];
    kvd_status_t st = KVD_OK;
    int rc = 0;

    kvd__bench_progress_start(&p, isatty(STDERR_FILENO) != 0, "copy-engine curve");
    if (perm == NULL || seq == NULL) {
        rc = fail(NULL, KVD_ENOMEM, "memory");
        goto out;
    }
    kvd__bench_prefix(prefix, sizeof(prefix));
    /* indices in a host buffer: the device side's random picks, the host's in order */
    st = kvd_buffer_register(cli, 2 * nmax * sizeof(int64_t), KVD_MEM_HOST, "bench-chunks", &ib,
                             &imap);
    if (st != KVD_OK) {
        rc = fail(cli, st, "index buffer");
        goto out;
    }
    for (int c = 0; c < NCHUNK; c++) {
        uint64_t S = chunk_sizes[c], n = total / S;
        kvd_pool_spec_t spec;
        kvd_pool_info_t dev, host;
        kvd_kv_transfer_t t[2];
        kvd_sync_t sync;
        char name[KVD_NAME_MAX];

        /* n random chunks of a device pool twice as large, n host chunks in order */
        kvd__bench_permutation(perm, 2 * n, 40 + (uint64_t)c);
        for (uint64_t i = 0; i < n; i++)
            seq[i] = (int64_t)i;
        if ((st = kvd_mapping_write(imap, 0, perm, n * sizeof(int64_t))) != KVD_OK ||
            (st = kvd_mapping_write(imap, nmax * sizeof(int64_t), seq, n * sizeof(int64_t))) !=
                KVD_OK) {
            rc = fail(NULL, st, "indices");
            goto out;
        }
        memset(&spec, 0, sizeof(spec));
        spec.name = name;
        spec.num_layers = 1;
        spec.slot_bytes = S;
        spec.mla = true; /* one buffer: a chunk is a row */
        snprintf(name, sizeof(name), "%s-dev", prefix);
        spec.kind = KVD_MEM_DEVICE;
        spec.num_slots = 2 * n;
        if ((st = kvd_pool_create(cli, &spec, &dev)) != KVD_OK) {
            rc = fail(cli, st, "device pool");
            goto out;
        }
        dev_id = dev.id;
        snprintf(name, sizeof(name), "%s-host", prefix);
        spec.kind = KVD_MEM_HOST;
        spec.num_slots = n;
        if ((st = kvd_pool_create(cli, &spec, &host)) != KVD_OK) {
            rc = fail(cli, st, "host pool");
            goto out;
        }
        host_id = host.id;
        memset(t, 0, sizeof(t));
        /* t[0]: device -> host; t[1]: host -> device */
        t[0].src_pool = dev.id;
        t[0].dst_pool = host.id;
        t[0].src = (kvd_indices_t){NULL, n, KVD_DTYPE_I64, ib, 0};
        t[0].dst = (kvd_indices_t){NULL, n, KVD_DTYPE_I64, ib, nmax * sizeof(int64_t)};
        t[0].all_layers = true;
        t[1] = t[0];
        t[1].src_pool = host.id;
        t[1].dst_pool = dev.id;
        t[1].src = t[0].dst;
        t[1].dst = t[0].src;
        memset(&sync, 0, sizeof(sync));
        rows[c].bytes = S;
        sync.path = KVD_PATH_COPY_ENGINE;
        if ((st = time_requests(cli, &t[0], 1, &sync, total, &rows[c].ce_d2h)) != KVD_OK ||
            (st = time_requests(cli, &t[1], 1, &sync, total, &rows[c].ce_h2d)) != KVD_OK)
            goto xfer_fail;
        /* both at once: half each way, d2h from the first half of the picks */
        t[0].src.count = t[0].dst.count = t[1].src.count = t[1].dst.count = n / 2;
        t[1].src.offset += n / 2 * sizeof(int64_t);
        t[1].dst.offset += n / 2 * sizeof(int64_t);
        if ((st = time_requests(cli, t, 2, &sync, n / 2 * 2 * S, &rows[c].both)) != KVD_OK)
            goto xfer_fail;
        t[0].src.count = t[0].dst.count = t[1].src.count = t[1].dst.count = n;
        t[1].src.offset = t[0].dst.offset;
        t[1].dst.offset = 0;
        sync.path = KVD_PATH_KERNEL;
        sync.max_blocks = o->max_blocks;
        if ((st = time_requests(cli, &t[0], 1, &sync, total, &rows[c].k_d2h)) != KVD_OK ||
            (st = time_requests(cli, &t[1], 1, &sync, total, &rows[c].k_h2d)) != KVD_OK)
            goto xfer_fail;
        if ((st = kvd_pool_drop(cli, dev_id, NULL)) != KVD_OK ||
            (st = kvd_pool_drop(cli, host_id, NULL)) != KVD_OK) {
            rc = fail(cli, st, "pool drop");
            goto out;
        }
        dev_id = host_id = 0;
        kvd__bench_progress_set(&p, (double)(c + 1) / NCHUNK);
        continue;
xfer_fail:
        rc = fail(cli, st, "chunk transfer");
        goto out;
    }
    kvd__bench_progress_end(&p, "done");
out:
    if (dev_id)
        (void)kvd_pool_drop(cli, dev_id, NULL);
    if (host_id)
        (void)kvd_pool_drop(cli, host_id, NULL);
    kvd_mapping_destroy(&imap);
    if (ib)
        (void)kvd_buffer_drop(cli, ib);
    free(perm);
    free(seq);
    return rc;
}

static void print_chunks(const opts_t *o, const chunk_row_t *rows)
{
    printf("\ncopy-engine curve through the daemon: %.0f MiB as scattered chunks, one request "
           "each way (best of 3, GB/s); kernels at %s blocks\n\n",
           (double)o->chunk_total / (1 << 20),
           o->max_blocks ? "the requested" : "the stream class's");
    printf("%10s %10s %10s %10s %10s %12s\n", "chunk", "ce d2h", "ce h2d", "both", "kernel d2h",
           "kernel h2d");
    for (int c = 0; c < NCHUNK; c++)
        printf("%10" PRIu64 " %10.1f %10.1f %10.1f %10.1f %12.1f\n", rows[c].bytes,
               rows[c].ce_d2h, rows[c].ce_h2d, rows[c].both, rows[c].k_d2h, rows[c].k_h2d);
}

static void json_chunks(const opts_t *o, const chunk_row_t *rows)
{
    printf("\"chunks\":{\"total_bytes\":%" PRIu64 ",\"rows\":[", o->chunk_total);
    for (int c = 0; c < NCHUNK; c++)
        printf("%s{\"chunk_bytes\":%" PRIu64 ",\"ce_d2h_gbps\":%.2f,\"ce_h2d_gbps\":%.2f,"
               "\"ce_both_gbps\":%.2f,\"kernel_d2h_gbps\":%.2f,\"kernel_h2d_gbps\":%.2f}",
               c ? "," : "", rows[c].bytes, rows[c].ce_d2h, rows[c].ce_h2d, rows[c].both,
               rows[c].k_d2h, rows[c].k_h2d);
    printf("]}");
}

/* ------------------------------------------------------------------------ */

static int usage(const char *msg)
{
    fprintf(stderr, "bench_paths: %s\nusage: bench_paths [--socket PATH] [--json] "
                    "[--iterations N] [--layers N] [--slots N] [--slot-bytes N] "
                    "[--max-blocks N] [--kind host|device] [--case all-layer|chunks|both] "
                    "[--chunk-total BYTES]\n", msg);
    return 2;
}

static bool num(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    unsigned long long v;

    if (s == NULL || *s == '\0' || *s == '-')
        return false;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

int main(int argc, char **argv)
{
    opts_t o = {NULL, false, 100, 32, 1024, 2048, 0, 0, CASE_ALL_LAYER, 1ull << 30};
    kvd_client_t *cli = NULL;
    const kvd_hello_info_t *h;
    all_layer_t res;
    chunk_row_t rows[NCHUNK];
    uint64_t v;
    int32_t kind;
    bool cuda;
    int rc = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;

        if (strcmp(a, "--json") == 0) {
            o.json = true;
            continue;
        }
        if (val == NULL)
            return usage("an option without its value");
        i++;
        if (strcmp(a, "--socket") == 0)
            o.socket = val;
        else if (strcmp(a, "--iterations") == 0 && num(val, 5, 1000000, &v))
            o.iterations = v;
        else if (strcmp(a, "--layers") == 0 && num(val, 1, 4096, &v))
            o.layers = (uint32_t)v;
        else if (strcmp(a, "--slots") == 0 && num(val, 1, 1u << 20, &v))
            o.slots = v;
        else if (strcmp(a, "--slot-bytes") == 0 && num(val, 1, 1u << 20, &v))
            o.slot_bytes = v;
        else if (strcmp(a, "--max-blocks") == 0 && num(val, 1, 1u << 20, &v))
            o.max_blocks = (uint32_t)v;
        else if (strcmp(a, "--chunk-total") == 0 && num(val, 4 << 20, 1ull << 34, &v))
            o.chunk_total = v;
        else if (strcmp(a, "--kind") == 0 && strcmp(val, "host") == 0)
            o.kind = KVD_MEM_HOST;
        else if (strcmp(a, "--kind") == 0 && strcmp(val, "device") == 0)
            o.kind = KVD_MEM_DEVICE;
        else if (strcmp(a, "--case") == 0 && strcmp(val, "all-layer") == 0)
            o.cases = CASE_ALL_LAYER;
        else if (strcmp(a, "--case") == 0 && strcmp(val, "chunks") == 0)
            o.cases = CASE_CHUNKS;
        else if (strcmp(a, "--case") == 0 && strcmp(val, "both") == 0)
            o.cases = CASE_ALL_LAYER | CASE_CHUNKS;
        else
            return usage("a bad option or value");
    }
    if (kvd_client_create(o.socket, "bench-paths", &cli) != KVD_OK)
        return fail(NULL, KVD_ECONN, "connect");
    h = kvd_client_info(cli);
    cuda = h->backend == KVD_BACKEND_CUDA;
    kind = o.kind ? o.kind : cuda ? KVD_MEM_DEVICE : KVD_MEM_HOST;
    if ((o.cases & CASE_CHUNKS) && !cuda) {
        kvd_client_destroy(&cli);
        return usage("the chunks case needs a cuda daemon (device and host pools)");
    }
    memset(&res, 0, sizeof(res));
    memset(rows, 0, sizeof(rows));
    if (o.cases & CASE_ALL_LAYER)
        rc = run_all_layer(cli, &o, kind, cuda, h->device_ordinal, &res);
    if (rc == 0 && (o.cases & CASE_CHUNKS))
        rc = run_chunks(cli, &o, rows);
    if (rc == 0 && o.json) {
        printf("{\"bench\":\"bench_paths\",\"backend\":");
        kvd__cli_json_str(kvd_backend_name(h->backend));
        printf(",\"device\":");
        kvd__cli_json_str(h->device_name);
        printf(",\"pool_kind\":");
        kvd__cli_json_str(kvd_mem_kind_name(kind));
        if (o.cases & CASE_ALL_LAYER) {
            printf(",");
            json_all_layer(&o, &res);
        }
        if (o.cases & CASE_CHUNKS) {
            printf(",");
            json_chunks(&o, rows);
        }
        printf("}\n");
    } else if (rc == 0) {
        printf("bench_paths: kvdockd %s, backend %s, device %s, %s pools\n", h->daemon_version,
               kvd_backend_name(h->backend), h->device_name, kvd_mem_kind_name(kind));
        if (o.cases & CASE_ALL_LAYER)
            print_all_layer(&o, &res);
        if (o.cases & CASE_CHUNKS)
            print_chunks(&o, rows);
    }
    kvd_client_destroy(&cli);
    return rc;
}
