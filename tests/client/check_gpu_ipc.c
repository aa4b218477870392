/*
 * CUDA IPC between worker processes and kvdockd --backend cuda (the GPU
 * machine).  Exits 77, printing "SKIP: reason", where no GPU is usable.
 *
 * (a) A worker allocates its KV cache with cudaMalloc (at an offset inside
 *     the allocation), imports it (legacy IPC handle + offset), stores K/V
 *     through the daemon, offloads every layer to a daemon-owned host pool,
 *     clears its cache, reloads, and compares bit for bit.  Then again with
 *     an allocation and an import a layer, as a framework's per-layer
 *     tensors come: layers evenly spaced in separate imports.
 * (b) A worker fills a daemon-owned device pool; a second worker maps it
 *     through its exported IPC handle and reads what the first wrote.
 * (c) Ordering without kernels: a worker queues a long memset chain on its
 *     own stream that ends by writing the source rows, records an
 *     interprocess event, and sends a transfer that waits on that event:
 *     the destination holds the final values.  Then the other direction: a
 *     transfer answered at enqueue records an event the worker's stream
 *     waits on before reading.
 * (d) VMM memory: a daemon-owned MEM_DEVICE_VMM pool exported as a
 *     descriptor and mapped by the worker; the worker's own cuMemCreate
 *     allocation imported by descriptor and written through the daemon.
 * (e) A stream that never drains: a transfer waits on an event that the
 *     worker's stream will not reach (a host function holds it); SIGTERM
 *     must still end the daemon, after its shutdown timeout and the grace
 *     for device work, with status 1 and the reason in its log.
 *
 * CUDA is never initialised in the test process itself (a forked child
 * cannot use a parent's CUDA): the probe and every worker run in children.
 */
#include "testutil.h"

#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <time.h>
#include <sys/wait.h>

#ifdef KVD_HAVE_CUDA
#include <cuda.h> /* types only: driver calls go through entry points */
#include <cuda_runtime_api.h>
#endif

#ifdef KVD_HAVE_CUDA

static kvt_daemon_t gd;

/* A child's exit status (128 + signal when killed), or -1. */
static int reap(pid_t pid)
{
    int status;

    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Run fn in a child process; its exit status (0 ok), or -1. */
static int run_worker(int (*fn)(void *), void *arg, pid_t *pid_out)
{
    pid_t pid = fork();

    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        _exit(fn(arg));
    }
    if (pid_out != NULL) {
        *pid_out = pid;
        return 0;
    }
    return reap(pid);
}

#define WFAIL(...)                                                                                 \
    do {                                                                                           \
        fprintf(stderr, "worker %d: ", (int)getpid());                                             \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        return 1;                                                                                  \
    } while (0)

#define WOK(cli, call)                                                                             \
    do {                                                                                           \
        kvd_status_t st_ = (call);                                                                 \
        if (st_ != KVD_OK)                                                                         \
            WFAIL("%s: %s: %s", #call, kvd_err_name(st_), kvd_client_last_error(cli));             \
    } while (0)

#define WCUDA(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            WFAIL("%s: %s", #call, cudaGetErrorString(e_));                                        \
    } while (0)

static kvd_client_t *wconnect(const char *name)
{
    kvd_client_t *cli = NULL;

    if (kvd_client_create(gd.socket, name, &cli) != KVD_OK) {
        fprintf(stderr, "worker %d: connect: %s\n", (int)getpid(), kvd_client_last_error(NULL));
        return NULL;
    }
    kvd_client_set_timeout(cli, 60000);
    return cli;
}

/* Store T rows of B bytes at loc into layer l of pool: K from rows, V
 * from rows + T * B.  0, or 1 having said why. */
static int wstore_layer(kvd_client_t *cli, uint64_t pool, uint32_t l, const int64_t *loc,
                        uint64_t T, uint64_t B, const uint8_t *rows)
{
    kvd_kv_store_t a;

    memset(&a, 0, sizeof(a));
    a.pool = pool;
    a.layer = l;
    a.loc.values = loc;
    a.loc.count = T;
    a.k.data = rows;
    a.k.bytes = T * B;
    a.v.data = rows + T * B;
    a.v.bytes = T * B;
    WOK(cli, kvd_kv_store(cli, &a, NULL, NULL));
    return 0;
}

/* ---- (a) import, store, offload, clear, reload ----------------------------- */

/* The worker's cache: one allocation with every layer in it, or (per_layer)
 * one allocation a layer, as a framework's per-layer tensors are.  Per-layer
 * allocations of one granule each tend to land side by side wherever they
 * are mapped, so the daemon sees layers evenly spaced that it may not copy
 * as one 2D copy: they lie in separate imports. */
typedef struct wcache {
    uint8_t *alloc[4];
    uint8_t *layer[4];
    kvd_import_region_t reg[4];
    uint32_t nregions;
} wcache_t;

static int wcache_clear(const wcache_t *c, uint32_t L, uint64_t layer_bytes)
{
    for (uint32_t l = 0; l < L; l++)
        WCUDA(cudaMemset(c->layer[l], 0, layer_bytes));
    WCUDA(cudaDeviceSynchronize());
    return 0;
}

static int wcache_read(const wcache_t *c, uint32_t L, uint64_t layer_bytes, uint8_t *out)
{
    for (uint32_t l = 0; l < L; l++)
        WCUDA(cudaMemcpy(out + l * layer_bytes, c->layer[l], layer_bytes,
                         cudaMemcpyDeviceToHost));
    return 0;
}

static int worker_offload_reload(void *arg)
{
    const int per_layer = arg != NULL && *(const int *)arg;
    const uint32_t L = 4;
    const uint64_t S = 256, B = 512, T = 64, PAD = 4096, GRANULE = 2 << 20;
    const uint64_t layer_bytes = 2 * S * B, cache_bytes = L * layer_bytes;
    kvd_client_t *cli = wconnect("gpu-worker-a");
    uint8_t *expect, *got, *rows;
    wcache_t wc;
    uint64_t off[4];
    kvd_memref_t kref[4], vref[4];
    kvd_pool_import_t imp;
    kvd_pool_info_t dev;
    kvd_pool_spec_t hs;
    kvd_pool_info_t host;
    kvd_mapping_t *hm = NULL;
    int64_t loc[64], seq[64];
    char dname[64], hname[64];
    kvd_kv_transfer_t t;

    if (cli == NULL)
        return 1;
    memset(&wc, 0, sizeof(wc));
    if (per_layer) {
        for (uint32_t l = 0; l < L; l++) {
            WCUDA(cudaMalloc((void **)&wc.alloc[l], GRANULE));
            wc.layer[l] = wc.alloc[l];
        }
    } else {
        WCUDA(cudaMalloc((void **)&wc.alloc[0], PAD + cache_bytes));
        for (uint32_t l = 0; l < L; l++)
            wc.layer[l] = wc.alloc[0] + PAD + l * layer_bytes;
    }
    if (wcache_clear(&wc, L, layer_bytes) != 0)
        return 1;
    expect = calloc(1, cache_bytes);
    got = malloc(cache_bytes);
    rows = malloc(2 * T * B);

    /* The tensor sits PAD bytes into its allocation: handle of the base,
     * plus the offset.  Per layer: a region a layer. */
    wc.nregions = per_layer ? L : 1;
    for (uint32_t r = 0; r < wc.nregions; r++) {
        WOK(NULL, kvd_import_region_from_device_ptr(wc.layer[r], &wc.reg[r], &off[r]));
        uint64_t want = per_layer ? 0 : PAD, need = per_layer ? layer_bytes : PAD + cache_bytes;
        if (off[r] != want || wc.reg[r].bytes < need)
            WFAIL("region %u: offset %llu (expected %llu), %llu bytes", r,
                  (unsigned long long)off[r], (unsigned long long)want,
                  (unsigned long long)wc.reg[r].bytes);
    }
    for (uint32_t l = 0; l < L; l++) {
        kref[l].region = per_layer ? l : 0;
        kref[l].offset = per_layer ? off[l] : off[0] + l * layer_bytes;
        vref[l].region = kref[l].region;
        vref[l].offset = kref[l].offset + S * B;
    }
    snprintf(dname, sizeof(dname), "gpu-cache-%d", (int)getpid());
    memset(&imp, 0, sizeof(imp));
    imp.name = dname;
    imp.num_layers = L;
    imp.num_slots = S;
    imp.slot_bytes = B;
    imp.regions = wc.reg;
    imp.num_regions = wc.nregions;
    imp.k_layers = kref;
    imp.v_layers = vref;
    WOK(cli, kvd_pool_import(cli, &imp, &dev));

    /* Store T tokens per layer at scattered slots. */
    for (uint64_t i = 0; i < T; i++) {
        loc[i] = (int64_t)((i * 37 + 11) % S);
        seq[i] = (int64_t)i;
    }
    for (uint32_t l = 0; l < L; l++) {
        kvt_fill(rows, 2 * T * B, 1000 + l);
        if (wstore_layer(cli, dev.id, l, loc, T, B, rows) != 0)
            return 1;
        for (uint64_t i = 0; i < T; i++) {
            memcpy(expect + l * layer_bytes + (uint64_t)loc[i] * B, rows + i * B, B);
            memcpy(expect + l * layer_bytes + S * B + (uint64_t)loc[i] * B, rows + (T + i) * B, B);
        }
    }
    if (wcache_read(&wc, L, layer_bytes, got) != 0)
        return 1;
    if (memcmp(got, expect, cache_bytes) != 0)
        WFAIL("device cache after stores differs from what was stored");

    /* Offload every layer to a daemon-owned host pool (by default through
     * the copy engines). */
    snprintf(hname, sizeof(hname), "gpu-host-%d", (int)getpid());
    memset(&hs, 0, sizeof(hs));
    hs.name = hname;
    hs.kind = KVD_MEM_HOST;
    hs.num_layers = L;
    hs.num_slots = T;
    hs.slot_bytes = B;
    WOK(cli, kvd_pool_create(cli, &hs, &host));
    WOK(cli, kvd_pool_export(cli, host.id, NULL, 0, &hm));
    memset(hm->base, 0, hm->bytes);
    memset(&t, 0, sizeof(t));
    t.src_pool = dev.id;
    t.dst_pool = host.id;
    t.src.values = loc;
    t.src.count = T;
    t.dst.values = seq;
    t.dst.count = T;
    t.all_layers = true;
    WOK(cli, kvd_kv_transfer(cli, &t, NULL, NULL));
    for (uint32_t l = 0; l < L; l++) {
        for (uint64_t i = 0; i < T; i++) {
            const uint8_t *hk = kvd_mapping_layer(hm, l, false);
            const uint8_t *hv = kvd_mapping_layer(hm, l, true);

            if (memcmp(hk + i * host.slot_stride, expect + l * layer_bytes + (uint64_t)loc[i] * B,
                       B) != 0 ||
                memcmp(hv + i * host.slot_stride,
                       expect + l * layer_bytes + S * B + (uint64_t)loc[i] * B, B) != 0)
                WFAIL("host pool row %llu of layer %u differs after offload", (unsigned long long)i,
                      l);
        }
    }

    /* Clear the device cache, reload from the host pool, compare all. */
    for (int round = 0; round < 2; round++) {
        kvd_sync_t sync;
        kvd_status_t st;

        if (wcache_clear(&wc, L, layer_bytes) != 0)
            return 1;
        memset(&t, 0, sizeof(t));
        t.src_pool = host.id;
        t.dst_pool = dev.id;
        t.src.values = seq;
        t.src.count = T;
        t.dst.values = loc;
        t.dst.count = T;
        t.all_layers = true;
        memset(&sync, 0, sizeof(sync));
        sync.copy_engine = round == 1; /* second round through the copy engines */
        st = kvd_kv_transfer(cli, &t, &sync, NULL);
        /* the copy-engine round must run: the kernels call
         * cudaMemcpyBatchAsync, which every driver of their toolkit has,
         * and layer tables the copy engines cannot read are the daemon's
         * bug; any refusal (ENOTSUP included) fails */
        if (st != KVD_OK)
            WFAIL("reload (round %d): %s: %s", round, kvd_err_name(st), kvd_client_last_error(cli));
        if (wcache_read(&wc, L, layer_bytes, got) != 0)
            return 1;
        if (memcmp(got, expect, cache_bytes) != 0)
            WFAIL("device cache after reload (round %d) differs bit for bit", round);
    }

    kvd_mapping_destroy(&hm);
    WOK(cli, kvd_pool_drop(cli, host.id, NULL));
    WOK(cli, kvd_pool_drop(cli, dev.id, NULL));
    kvd_client_destroy(&cli);
    for (uint32_t l = 0; l < L; l++)
        cudaFree(wc.alloc[l]);
    free(expect);
    free(got);
    free(rows);
    return 0;
}

/* ---- (b) one worker writes a device pool, another maps and reads it ------ */

#define B_LAYERS 3
#define B_SLOTS 128
#define B_BYTES 256
#define B_TOKENS 32

typedef struct pipes {
    int ready[2]; /* writer -> reader */
    int done[2];  /* reader -> writer */
    char name[64];
} pipes_t;

static void b_rows(uint32_t l, uint8_t *rows, int64_t *loc)
{
    kvt_fill(rows, 2 * B_TOKENS * B_BYTES, 777 + l);
    for (int i = 0; i < B_TOKENS; i++)
        loc[i] = (int64_t)((i * 5 + (int)l) % B_SLOTS);
}

static int worker_device_writer(void *arg)
{
    pipes_t *p = arg;
    kvd_client_t *cli = wconnect("gpu-writer");
    kvd_pool_spec_t spec;
    kvd_pool_info_t info;
    uint8_t rows[2 * B_TOKENS * B_BYTES];
    int64_t loc[B_TOKENS];
    char c = 0;

    close(p->done[1]);
    close(p->ready[0]);
    if (cli == NULL)
        return 1;
    memset(&spec, 0, sizeof(spec));
    spec.name = p->name;
    spec.kind = KVD_MEM_DEVICE;
    spec.num_layers = B_LAYERS;
    spec.num_slots = B_SLOTS;
    spec.slot_bytes = B_BYTES;
    spec.shared = true;
    WOK(cli, kvd_pool_create(cli, &spec, &info));
    for (uint32_t l = 0; l < B_LAYERS; l++) {
        b_rows(l, rows, loc);
        if (wstore_layer(cli, info.id, l, loc, B_TOKENS, B_BYTES, rows) != 0)
            return 1;
    }
    if (write(p->ready[1], "r", 1) != 1)
        WFAIL("signal ready");
    if (read(p->done[0], &c, 1) != 1)
        WFAIL("reader did not finish");
    WOK(cli, kvd_pool_drop(cli, info.id, NULL));
    kvd_client_destroy(&cli);
    return c == 'd' ? 0 : 1;
}

static int worker_device_reader(void *arg)
{
    pipes_t *p = arg;
    kvd_client_t *cli;
    kvd_mapping_t *m = NULL;
    uint8_t rows[2 * B_TOKENS * B_BYTES], got[B_BYTES];
    int64_t loc[B_TOKENS];
    char c;
    int rc = 1;

    close(p->ready[1]);
    close(p->done[0]);
    if (read(p->ready[0], &c, 1) != 1)
        WFAIL("writer did not get ready");
    cli = wconnect("gpu-reader");
    if (cli == NULL)
        goto out;
    WOK(cli, kvd_pool_export(cli, 0, p->name, 0, &m));
    if (m->kind != KVD_MEM_DEVICE || m->base == NULL)
        WFAIL("export of a device pool gave kind %d base %p", m->kind, m->base);
    {
        /* A second export in the same process shares the one opening of
         * the handle; dropping it leaves the first mapping usable. */
        kvd_mapping_t *m2 = NULL;

        WOK(cli, kvd_pool_export(cli, m->pool.id, NULL, 0, &m2));
        if (m2->base != m->base)
            WFAIL("second export mapped at %p, first at %p", m2->base, m->base);
        kvd_mapping_destroy(&m2);
    }
    for (uint32_t l = 0; l < B_LAYERS; l++) {
        const uint8_t *k = kvd_mapping_layer(m, l, false), *v = kvd_mapping_layer(m, l, true);

        b_rows(l, rows, loc);
        for (int i = 0; i < B_TOKENS; i++) {
            WCUDA(cudaMemcpy(got, k + (uint64_t)loc[i] * m->pool.slot_stride, B_BYTES,
                             cudaMemcpyDeviceToHost));
            if (memcmp(got, rows + i * B_BYTES, B_BYTES) != 0)
                WFAIL("K row %d of layer %u read through IPC differs", i, l);
            WCUDA(cudaMemcpy(got, v + (uint64_t)loc[i] * m->pool.slot_stride, B_BYTES,
                             cudaMemcpyDeviceToHost));
            if (memcmp(got, rows + (B_TOKENS + i) * B_BYTES, B_BYTES) != 0)
                WFAIL("V row %d of layer %u read through IPC differs", i, l);
        }
    }
    kvd_mapping_destroy(&m);
    kvd_client_destroy(&cli);
    rc = 0;
out:
    if (write(p->done[1], rc == 0 ? "d" : "f", 1) != 1)
        return 1;
    return rc;
}

/* ---- (c) ordering through interprocess events ---------------------------- */

static int worker_event_order(void *arg)
{
    const uint64_t S = 64, B = 4096, CHAIN_BYTES = 1ull << 30;
    const int CHAIN = 40;
    kvd_client_t *cli = wconnect("gpu-events");
    uint8_t *src = NULL, *chain = NULL, *host = NULL;
    cudaStream_t stream;
    cudaEvent_t ev_ready, ev_done;
    uint8_t h1[KVD_IPC_HANDLE_BYTES], h2[KVD_IPC_HANDLE_BYTES];
    uint64_t e1, e2, req;
    kvd_import_region_t reg;
    uint64_t off;
    kvd_memref_t kref, vref;
    kvd_pool_import_t imp;
    kvd_pool_info_t dev, hp;
    kvd_pool_spec_t hs;
    kvd_mapping_t *hm = NULL;
    int64_t idx[64];
    kvd_kv_transfer_t t;
    kvd_sync_t sync;
    char dname[64], hname[64];
    bool was_busy;

    (void)arg;
    if (cli == NULL)
        return 1;
    WCUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    WCUDA(cudaMalloc((void **)&src, 2 * S * B));
    WCUDA(cudaMalloc((void **)&chain, CHAIN_BYTES));
    WCUDA(cudaMemset(src, 0x11, 2 * S * B));
    WCUDA(cudaDeviceSynchronize());
    WCUDA(cudaEventCreateWithFlags(&ev_ready, cudaEventInterprocess | cudaEventDisableTiming));
    WCUDA(cudaEventCreateWithFlags(&ev_done, cudaEventInterprocess | cudaEventDisableTiming));
    WOK(NULL, kvd_event_ipc_handle(ev_ready, h1));
    WOK(NULL, kvd_event_ipc_handle(ev_done, h2));
    WOK(cli, kvd_event_register(cli, h1, &e1));
    WOK(cli, kvd_event_register(cli, h2, &e2));

    WOK(NULL, kvd_import_region_from_device_ptr(src, &reg, &off));
    kref.region = 0;
    kref.offset = off;
    vref.region = 0;
    vref.offset = off + S * B;
    snprintf(dname, sizeof(dname), "gpu-ev-src-%d", (int)getpid());
    memset(&imp, 0, sizeof(imp));
    imp.name = dname;
    imp.num_layers = 1;
    imp.num_slots = S;
    imp.slot_bytes = B;
    imp.regions = &reg;
    imp.num_regions = 1;
    imp.k_layers = &kref;
    imp.v_layers = &vref;
    WOK(cli, kvd_pool_import(cli, &imp, &dev));
    snprintf(hname, sizeof(hname), "gpu-ev-dst-%d", (int)getpid());
    memset(&hs, 0, sizeof(hs));
    hs.name = hname;
    hs.kind = KVD_MEM_HOST;
    hs.num_layers = 1;
    hs.num_slots = S;
    hs.slot_bytes = B;
    WOK(cli, kvd_pool_create(cli, &hs, &hp));
    WOK(cli, kvd_pool_export(cli, hp.id, NULL, 0, &hm));
    memset(hm->base, 0, hm->bytes);
    for (uint64_t i = 0; i < S; i++)
        idx[i] = (int64_t)i;

    /* The worker's stream: a long memset chain, then the final values of
     * the source rows, then the event.  Nothing is synchronised here.  The
     * ordering is tested only when the stream is still busy once the
     * request has been sent: otherwise again with a chain four times as
     * long, and the test fails when three tries never got there. */
    for (int attempt = 0, chain_n = CHAIN;; attempt++, chain_n *= 4) {
        memset(hm->base, 0, hm->bytes);
        WCUDA(cudaMemsetAsync(src, 0x11, 2 * S * B, stream));
        WCUDA(cudaStreamSynchronize(stream));
        for (int i = 0; i < chain_n; i++)
            WCUDA(cudaMemsetAsync(chain, i, CHAIN_BYTES, stream));
        WCUDA(cudaMemsetAsync(src, 0xab, 2 * S * B, stream));
        WCUDA(cudaEventRecord(ev_ready, stream));

        memset(&t, 0, sizeof(t));
        t.src_pool = dev.id;
        t.dst_pool = hp.id;
        t.src.values = idx;
        t.src.count = S;
        t.dst.values = idx;
        t.dst.count = S;
        memset(&sync, 0, sizeof(sync));
        sync.wait_event = e1;
        WOK(cli, kvd_kv_transfer_submit(cli, &t, &sync, NULL, &req));
        was_busy = cudaEventQuery(ev_ready) == cudaErrorNotReady;
        cudaGetLastError();
        WOK(cli, kvd_client_wait(cli, req));
        for (uint64_t i = 0; i < S; i++) {
            const uint8_t *k =
                (const uint8_t *)kvd_mapping_layer(hm, 0, false) + i * hp.slot_stride;
            const uint8_t *v =
                (const uint8_t *)kvd_mapping_layer(hm, 0, true) + i * hp.slot_stride;

            for (uint64_t b = 0; b < B; b++)
                if (k[b] != 0xab || v[b] != 0xab)
                    WFAIL("slot %llu byte %llu is 0x%02x/0x%02x: the transfer did not wait for "
                          "the worker's event",
                          (unsigned long long)i, (unsigned long long)b, k[b], v[b]);
        }
        if (was_busy)
            break;
        if (attempt == 2)
            WFAIL("the worker's stream was done before the transfer was sent, three times (the "
                  "last after %d memsets of 1 GiB): the ordering was not tested",
                  chain_n);
        fprintf(stderr, "ordering: the worker's stream was done before the transfer was sent; "
                "again with %d memsets\n", chain_n * 4);
    }

    /* Other direction: answered at enqueue, completion by the recorded
     * event that the worker's stream waits on before reading. */
    memset(hm->base, 0xcd, hm->bytes);
    memset(&t, 0, sizeof(t));
    t.src_pool = hp.id;
    t.dst_pool = dev.id;
    t.src.values = idx;
    t.src.count = S;
    t.dst.values = idx;
    t.dst.count = S;
    memset(&sync, 0, sizeof(sync));
    sync.record_event = e2;
    sync.reply_at_enqueue = true;
    {
        kvd_op_result_t res;

        WOK(cli, kvd_kv_transfer(cli, &t, &sync, &res));
        if (!res.enqueued)
            WFAIL("the reply_at_enqueue reply is not marked enqueued");
    }
    host = malloc(2 * S * B);
    WCUDA(cudaStreamWaitEvent(stream, ev_done, 0));
    WCUDA(cudaMemcpyAsync(host, src, 2 * S * B, cudaMemcpyDeviceToHost, stream));
    WCUDA(cudaStreamSynchronize(stream));
    for (uint64_t b = 0; b < 2 * S * B; b++)
        if (host[b] != 0xcd)
            WFAIL("byte %llu of the reloaded rows is 0x%02x: the worker read before the "
                  "daemon's recorded event",
                  (unsigned long long)b, host[b]);

    kvd_mapping_destroy(&hm);
    WOK(cli, kvd_pool_drop(cli, hp.id, NULL));
    WOK(cli, kvd_pool_drop(cli, dev.id, NULL));
    WOK(cli, kvd_event_drop(cli, e1));
    WOK(cli, kvd_event_drop(cli, e2));
    kvd_client_destroy(&cli);
    cudaEventDestroy(ev_ready);
    cudaEventDestroy(ev_done);
    cudaFree(src);
    cudaFree(chain);
    cudaStreamDestroy(stream);
    free(host);
    return 0;
}

/* ---- (d) VMM memory: a daemon pool exported as a descriptor, and the
 *      worker's own cuMemCreate allocation imported by descriptor --------- */

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *h, size_t size,
                              const CUmemAllocationProp *prop, unsigned long long flags);
typedef CUresult (*granularity_fn)(size_t *g, const CUmemAllocationProp *prop,
                                   CUmemAllocationGranularity_flags option);
typedef CUresult (*reserve_fn)(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                               unsigned long long flags);
typedef CUresult (*map_fn)(CUdeviceptr p, size_t size, size_t offset,
                           CUmemGenericAllocationHandle h, unsigned long long flags);
typedef CUresult (*access_fn)(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc,
                              size_t count);
typedef CUresult (*unmap_fn)(CUdeviceptr p, size_t size);
typedef CUresult (*free_fn)(CUdeviceptr p, size_t size);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle h);

static void *driver_entry(const char *name)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;

#if CUDART_VERSION >= 12050
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess)
#else
    if (cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q) != cudaSuccess)
#endif
        return NULL;
    return q == cudaDriverEntryPointSuccess ? fn : NULL;
}

static int worker_vmm(void *arg)
{
    const uint32_t L = 2;
    const uint64_t S = 64, B = 1024, T = 16;
    kvd_client_t *cli = wconnect("gpu-vmm");
    kvd_pool_spec_t spec;
    kvd_pool_info_t vp, imported;
    kvd_mapping_t *m = NULL;
    uint8_t rows[2 * 16 * 1024], got[1024];
    int64_t loc[16];
    char name[64], iname[64];
    kvd_status_t st;
    CUmemAllocationProp prop;
    CUmemGenericAllocationHandle ah;
    CUdeviceptr va;
    CUmemAccessDesc acc;
    size_t gran, size;
    kvd_import_region_t reg;
    uint64_t off;
    kvd_memref_t kref[2], vref[2];
    kvd_pool_import_t imp;
    uint8_t *expect;

    (void)arg;
    if (cli == NULL)
        return 1;
    WCUDA(cudaFree(0));
    for (uint64_t i = 0; i < T; i++)
        loc[i] = (int64_t)((i * 11 + 3) % S);

    /* A daemon-owned VMM pool, exported as a descriptor and mapped here. */
    snprintf(name, sizeof(name), "gpu-vmm-%d", (int)getpid());
    memset(&spec, 0, sizeof(spec));
    spec.name = name;
    spec.kind = KVD_MEM_DEVICE_VMM;
    spec.num_layers = L;
    spec.num_slots = S;
    spec.slot_bytes = B;
    st = kvd_pool_create(cli, &spec, &vp);
    if (st == KVD_ENOTSUP) {
        /* only a driver without the VMM API may refuse; this worker uses it below */
        if (driver_entry("cuMemCreate") != NULL)
            WFAIL("VMM pool refused with a driver that has cuMemCreate: %s",
                  kvd_client_last_error(cli));
        fprintf(stderr, "note: the daemon has no VMM pools: %s\n", kvd_client_last_error(cli));
    } else {
        if (st != KVD_OK)
            WFAIL("create VMM pool: %s: %s", kvd_err_name(st), kvd_client_last_error(cli));
        for (uint32_t l = 0; l < L; l++) {
            kvt_fill(rows, sizeof(rows), 31 + l);
            if (wstore_layer(cli, vp.id, l, loc, T, B, rows) != 0)
                return 1;
        }
        WOK(cli, kvd_pool_export(cli, vp.id, NULL, 0, &m));
        if (m->kind != KVD_MEM_DEVICE_VMM || m->base == NULL || m->fd < 0)
            WFAIL("VMM export: kind %d base %p fd %d", m->kind, m->base, m->fd);
        for (uint32_t l = 0; l < L; l++) {
            kvt_fill(rows, sizeof(rows), 31 + l);
            for (uint64_t i = 0; i < T; i++) {
                WCUDA(cudaMemcpy(got,
                                 (uint8_t *)kvd_mapping_layer(m, l, true) +
                                     (uint64_t)loc[i] * m->pool.slot_stride,
                                 B, cudaMemcpyDeviceToHost));
                if (memcmp(got, rows + (T + i) * B, B) != 0)
                    WFAIL("VMM pool V row %llu of layer %u differs", (unsigned long long)i, l);
            }
        }
        kvd_mapping_destroy(&m);
        WOK(cli, kvd_pool_drop(cli, vp.id, NULL));
    }

    /* The worker's own VMM allocation (as PyTorch's expandable segments
     * make), imported by descriptor. */
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    WCUDA(cudaGetDevice(&prop.location.id));
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    {
        granularity_fn gfn = (granularity_fn)driver_entry("cuMemGetAllocationGranularity");
        create_fn cfn = (create_fn)driver_entry("cuMemCreate");
        reserve_fn rfn = (reserve_fn)driver_entry("cuMemAddressReserve");
        map_fn mfn = (map_fn)driver_entry("cuMemMap");
        access_fn afn = (access_fn)driver_entry("cuMemSetAccess");

        if (!gfn || !cfn || !rfn || !mfn || !afn)
            WFAIL("driver entry points for the VMM API not found");
        if (gfn(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS)
            WFAIL("cuMemGetAllocationGranularity");
        size = (2 * L * S * B + 4096 + gran - 1) / gran * gran;
        if (cfn(&ah, size, &prop, 0) != CUDA_SUCCESS)
            WFAIL("cuMemCreate of %zu bytes", size);
        if (rfn(&va, size, 0, 0, 0) != CUDA_SUCCESS || mfn(va, size, 0, ah, 0) != CUDA_SUCCESS)
            WFAIL("cuMemAddressReserve / cuMemMap");
        memset(&acc, 0, sizeof(acc));
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        if (afn(va, size, &acc, 1) != CUDA_SUCCESS)
            WFAIL("cuMemSetAccess");
    }
    WCUDA(cudaMemset((void *)va, 0, size));
    WCUDA(cudaDeviceSynchronize());
    WOK(NULL, kvd_import_region_from_vmm_ptr((void *)(va + 4096), &reg, &off));
    if (off != 4096 || reg.fd < 0 || reg.bytes < size)
        WFAIL("VMM region: offset %llu fd %d bytes %llu", (unsigned long long)off, reg.fd,
              (unsigned long long)reg.bytes);
    for (uint32_t l = 0; l < L; l++) {
        kref[l].region = 0;
        kref[l].offset = off + 2 * l * S * B;
        vref[l].region = 0;
        vref[l].offset = off + (2 * l + 1) * S * B;
    }
    snprintf(iname, sizeof(iname), "gpu-vmm-import-%d", (int)getpid());
    memset(&imp, 0, sizeof(imp));
    imp.name = iname;
    imp.num_layers = L;
    imp.num_slots = S;
    imp.slot_bytes = B;
    imp.regions = &reg;
    imp.num_regions = 1;
    imp.k_layers = kref;
    imp.v_layers = vref;
    WOK(cli, kvd_pool_import(cli, &imp, &imported));
    close(reg.fd); /* the daemon has its own */
    expect = calloc(1, 2 * L * S * B);
    for (uint32_t l = 0; l < L; l++) {
        kvt_fill(rows, sizeof(rows), 63 + l);
        if (wstore_layer(cli, imported.id, l, loc, T, B, rows) != 0)
            return 1;
        for (uint64_t i = 0; i < T; i++) {
            memcpy(expect + 2 * l * S * B + (uint64_t)loc[i] * B, rows + i * B, B);
            memcpy(expect + (2 * l + 1) * S * B + (uint64_t)loc[i] * B, rows + (T + i) * B, B);
        }
    }
    {
        uint8_t *all = malloc(2 * L * S * B);

        WCUDA(cudaMemcpy(all, (void *)(va + 4096), 2 * L * S * B, cudaMemcpyDeviceToHost));
        if (memcmp(all, expect, 2 * L * S * B) != 0)
            WFAIL("the worker's VMM memory after stores through the daemon differs");
        free(all);
    }
    WOK(cli, kvd_pool_drop(cli, imported.id, NULL));
    kvd_client_destroy(&cli);
    {
        unmap_fn ufn = (unmap_fn)driver_entry("cuMemUnmap");
        free_fn ffn = (free_fn)driver_entry("cuMemAddressFree");
        release_fn relfn = (release_fn)driver_entry("cuMemRelease");

        if (ufn && ffn && relfn) {
            ufn(va, size);
            ffn(va, size);
            relfn(ah);
        }
    }
    free(expect);
    return 0;
}

#endif /* KVD_HAVE_CUDA */

/* ---- the suite ---------------------------------------------------------- */

#ifdef KVD_HAVE_CUDA
static void gpu_setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    ck_assert_msg(kvt_daemon_start(&gd, "cuda", NULL, 60000) == 0,
                  "kvdockd --backend cuda did not start");
}

static void gpu_teardown(void)
{
    kvt_daemon_stop(&gd, 30000);
}

START_TEST(test_import_offload_reload)
{
    int per_layer = _i; /* 1: an allocation (and an import) a layer */
    int rc = run_worker(worker_offload_reload, &per_layer, NULL);

    if (rc != 0)
        kvt_daemon_dump_log(&gd);
    ck_assert_msg(rc == 0, "worker failed (%d)", rc);
}
END_TEST

START_TEST(test_device_pool_between_workers)
{
    pipes_t p;
    pid_t w, r;
    int rw, rr;

    ck_assert_int_eq(pipe(p.ready), 0);
    ck_assert_int_eq(pipe(p.done), 0);
    snprintf(p.name, sizeof(p.name), "gpu-shared-%d", (int)getpid());
    ck_assert_int_eq(run_worker(worker_device_writer, &p, &w), 0);
    ck_assert_int_eq(run_worker(worker_device_reader, &p, &r), 0);
    close(p.ready[0]);
    close(p.ready[1]);
    close(p.done[0]);
    close(p.done[1]);
    rr = reap(r);
    rw = reap(w);
    if (rr != 0 || rw != 0)
        kvt_daemon_dump_log(&gd);
    ck_assert_msg(rr == 0, "reader failed (%d)", rr);
    ck_assert_msg(rw == 0, "writer failed (%d)", rw);
}
END_TEST

START_TEST(test_event_ordering)
{
    int rc = run_worker(worker_event_order, NULL, NULL);

    if (rc != 0)
        kvt_daemon_dump_log(&gd);
    ck_assert_msg(rc == 0, "worker failed (%d)", rc);
}
END_TEST

START_TEST(test_vmm_export_and_import)
{
    int rc = run_worker(worker_vmm, NULL, NULL);

    if (rc != 0)
        kvt_daemon_dump_log(&gd);
    ck_assert_msg(rc == 0, "worker failed (%d)", rc);
}
END_TEST
#endif

#ifdef KVD_HAVE_CUDA
/* ---- (e) shutdown with a stream that never drains ---------------------------- */

typedef struct stuck_args {
    const char *socket;
    int gate_rd;  /* the parent writes a byte here to let the stream go */
    int ready_wr; /* the worker writes a byte once its transfer is queued */
} stuck_args_t;

/* Runs on a CUDA thread: holds the worker's stream until the gate opens. */
static void CUDART_CB hold_stream(void *arg)
{
    char c;

    while (read(*(int *)arg, &c, 1) < 0 && errno == EINTR)
        ;
}

static int worker_stuck(void *arg)
{
    stuck_args_t *a = arg;
    kvd_client_t *cli = NULL;
    cudaStream_t stream;
    cudaEvent_t ev;
    uint8_t h[KVD_IPC_HANDLE_BYTES];
    uint64_t e, req;
    kvd_pool_spec_t ps;
    kvd_pool_info_t p1, p2;
    int64_t idx[1] = {0};
    kvd_kv_transfer_t t;
    kvd_sync_t sync;
    kvd_status_t st;
    char name[64];

    if (kvd_client_create(a->socket, "gpu-stuck", &cli) != KVD_OK)
        WFAIL("connect: %s", kvd_client_last_error(NULL));
    kvd_client_set_timeout(cli, 60000);
    WCUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    WCUDA(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
    WCUDA(cudaLaunchHostFunc(stream, hold_stream, &a->gate_rd));
    WCUDA(cudaEventRecord(ev, stream)); /* completes only once the gate opens */
    WOK(NULL, kvd_event_ipc_handle(ev, h));
    WOK(cli, kvd_event_register(cli, h, &e));
    memset(&ps, 0, sizeof(ps));
    ps.kind = KVD_MEM_DEVICE;
    ps.num_layers = 1;
    ps.num_slots = 4;
    ps.slot_bytes = 256;
    snprintf(name, sizeof(name), "stuck-a-%d", (int)getpid());
    ps.name = name;
    WOK(cli, kvd_pool_create(cli, &ps, &p1));
    snprintf(name, sizeof(name), "stuck-b-%d", (int)getpid());
    WOK(cli, kvd_pool_create(cli, &ps, &p2));
    memset(&t, 0, sizeof(t));
    t.src_pool = p1.id;
    t.dst_pool = p2.id;
    t.src.values = idx;
    t.src.count = 1;
    t.dst.values = idx;
    t.dst.count = 1;
    memset(&sync, 0, sizeof(sync));
    sync.wait_event = e;
    WOK(cli, kvd_kv_transfer_submit(cli, &t, &sync, NULL, &req));
    /* frames are handled in order: once the ping is answered, the transfer
     * is on the daemon's stream, not a frame SIGTERM could refuse */
    WOK(cli, kvd_ping(cli, NULL, 0));
    if (write(a->ready_wr, "r", 1) != 1)
        WFAIL("ready pipe: %s", strerror(errno));
    /* the daemon gives up on the stream and exits: the connection ends */
    st = kvd_client_wait(cli, req);
    if (st != KVD_ECONN)
        WFAIL("transfer ended with %s (%s), expected ECONN", kvd_err_name(st),
              kvd_client_last_error(cli));
    kvd_client_destroy(&cli);
    WCUDA(cudaStreamSynchronize(stream)); /* the parent opens the gate */
    return 0;
}

START_TEST(test_shutdown_with_stuck_stream)
{
    const char *extra[] = {"--shutdown-timeout-ms", "200", NULL};
    kvt_daemon_t d;
    int gate[2], ready[2], status = 0, exited = 0;
    stuck_args_t a;
    pid_t pid;
    char c;
    double t0, waited;
    FILE *log;
    char line[512];
    bool logged = false;

    ck_assert_int_eq(pipe(gate), 0);
    ck_assert_int_eq(pipe(ready), 0);
    ck_assert_msg(kvt_daemon_start(&d, "cuda", extra, 60000) == 0, "kvdockd did not start");
    a.socket = d.socket;
    a.gate_rd = gate[0];
    a.ready_wr = ready[1];
    ck_assert_int_eq(run_worker(worker_stuck, &a, &pid), 0);
    close(ready[1]);
    if (read(ready[0], &c, 1) != 1) {
        kvt_daemon_dump_log(&d);
        ck_abort_msg("the worker did not queue its transfer (exit %d)", reap(pid));
    }
    t0 = (double)kvt_now_ms();
    kill(d.pid, SIGTERM);
    while ((double)kvt_now_ms() - t0 < 30000) {
        if (waitpid(d.pid, &status, WNOHANG) == d.pid) {
            exited = 1;
            break;
        }
        usleep(10000);
    }
    waited = (double)kvt_now_ms() - t0;
    if (write(gate[1], "g", 1) != 1) /* let the worker's stream go */
        ck_abort_msg("gate pipe: %s", strerror(errno));
    if (!exited) {
        kill(d.pid, SIGKILL);
        waitpid(d.pid, &status, 0);
    }
    log = fopen(d.log, "r");
    while (log != NULL && fgets(line, sizeof(line), log) != NULL)
        logged = logged || strstr(line, "event=drain_abandoned") != NULL;
    if (log != NULL)
        fclose(log);
    if (!exited || !logged || !WIFEXITED(status) || WEXITSTATUS(status) != 1)
        kvt_daemon_dump_log(&d);
    ck_assert_msg(exited, "kvdockd still running 30 s after SIGTERM");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 1,
                  "kvdockd ended with status 0x%x, expected exit 1", status);
    ck_assert_msg(logged, "no event=drain_abandoned in the daemon's log");
    /* 0.2 s of drain timeout, then 5 s of grace for the device work */
    ck_assert_msg(waited >= 5000 && waited < 15000, "exited %.0f ms after SIGTERM", waited);
    ck_assert_int_eq(reap(pid), 0);
    d.pid = -1;
    kvt_daemon_stop(&d, 1000); /* removes its directory */
    close(gate[0]);
    close(gate[1]);
    close(ready[0]);
}
END_TEST
#endif

/* kvd_cuda_probe in a child, so this process never initialises CUDA. */
static int probe(char *why, size_t len)
{
    int fd[2];
    pid_t pid;
    ssize_t n;
    int status;

    if (pipe(fd) != 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        char w[256] = "";
        kvd_status_t st = kvd_cuda_probe(w, sizeof(w));

        close(fd[0]);
        if (write(fd[1], w, strlen(w)) < 0)
            _exit(2);
        _exit(st == KVD_OK ? 0 : 1);
    }
    close(fd[1]);
    n = read(fd[0], why, len - 1);
    why[n > 0 ? n : 0] = '\0';
    close(fd[0]);
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int main(void)
{
    char why[256];
    int p = probe(why, sizeof(why));

    if (p != 0) {
        printf("SKIP: no usable GPU: %s\n", why[0] ? why : "kvd_cuda_probe failed");
        return 77;
    }
#ifndef KVD_HAVE_CUDA
    printf("SKIP: this test was built without CUDA\n");
    return 77;
#else
    Suite *s = suite_create("gpu_ipc");
    TCase *tc = tcase_create("ipc");
    SRunner *sr;
    int failed;

    tcase_add_checked_fixture(tc, gpu_setup, gpu_teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_import_offload_reload, 0, 2);
    tcase_add_test(tc, test_device_pool_between_workers);
    tcase_add_test(tc, test_event_ordering);
    tcase_add_test(tc, test_shutdown_with_stuck_stream);
    tcase_add_test(tc, test_vmm_export_and_import);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
#endif
}
