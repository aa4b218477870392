/*
 * bench_disk_load: the cache tier's disk level through a running kvdockd
 * (started with --cache-dir): blocks spilled to disk and loaded back from
 * it into a worker's pool.
 *
 *   bench_disk_load [--socket PATH] [--json] [--pool host|device]
 *                   [--blocks N] [--iterations N] [--layers N] [--tokens N]
 *                   [--token-bytes N] [--host-budget SIZE] [--disk-budget SIZE]
 *
 * A cache of blocks of --tokens tokens x --layers layers x K and V x
 * --token-bytes (16 x 32 x 2 KiB: 2 MiB a block) with a host budget of two
 * sets (--host-budget; a load reads disk-only blocks into host memory
 * first) and a disk level (--disk-budget, default room for every set
 * saved).  Spill: --iterations + 2 sets of --blocks blocks (1,024) are
 * saved from the pool, a quarter of the host budget a request (a request
 * the disk is behind on waits in the daemon; an EBUSY that still comes is
 * tried again and counted); each set
 * pushes the older ones out of host memory, leaving them on disk; the
 * rate is the disk level's bytes written over the time from the first
 * save until they stop growing.  Load: each of the first --iterations (3) sets, now on disk
 * only (the lookup's disk_hits says how many of its blocks were), is
 * loaded into the pool's pages in one request; the figure is the median.
 * Beside it, in this process, the copy of the same bytes from pinned host
 * memory to the device (a device pool, cuda) or between host buffers
 * (a host pool): what a load from host memory costs.
 *
 * --pool device (the default with a cuda daemon and a CUDA build) imports
 * a device KV cache this process allocates, as a worker does; --pool host
 * makes a host pool (any backend) and writes it whole first, as a worker
 * writes its KV before a save.  The cache and pool are dropped at the
 * end.  One line each, or one JSON object with --json.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_cache_util.h"
#include "bench_util.h"
#include "kvdock/client.h"
#include "util.h"

#ifdef KVD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define KEY KVB_KEY

typedef struct opts {
    const char *socket;
    bool json;
    int device; /* -1: by the daemon's backend */
    uint64_t blocks, iterations, token_bytes, host_budget, disk_budget;
    uint32_t layers, tokens;
} opts_t;

typedef struct result {
    uint64_t block_bytes, blocks, sets;
    double save_s;         /* the saves of every set, back to back */
    double spill_mbps;     /* disk level bytes written / time until they stop */
    uint64_t spilled_bytes;
    uint32_t disk_hits_min; /* the fewest of a loaded set's blocks on disk only */
    double first_load_us;  /* the first set's load (a cold read) */
    double load_gbs;       /* median over the sets */
    double copy_gbs;       /* in-process copy of the same bytes */
    uint64_t busy_retries; /* saves tried again: the disk was behind */
    bool device;
} result_t;

static int fail(kvd_client_t *cli, kvd_status_t st, const char *what)
{
    return kvb_fail("bench_disk_load", cli, st, what);
}

/* Set s's chain of n keys, distinct for every (s, i). */
static void set_keys(uint8_t *keys, uint64_t s, uint64_t n)
{
    kvb_chain_keys(keys, s + 7777, n);
}

/* The worker's pool: n pages of T tokens of every layer's K and V. */
typedef struct pool {
    kvd_pool_info_t info;
    char *dev;  /* device: the allocation this process imported */
    char *host; /* pinned (device) or plain host memory for the copy beside */
    char *host2;
    kvd_mapping_t *map; /* host: the pool, mapped here */
} pool_t;

static int pool_make(kvd_client_t *cli, const opts_t *o, bool device, pool_t *p)
{
    const uint64_t chunk = (uint64_t)o->tokens * o->token_bytes;
    const uint64_t bytes = 2ull * o->layers * o->blocks * chunk;
    char name[64];
    kvd_status_t st;

    memset(p, 0, sizeof(*p));
    kvd__bench_prefix(name, sizeof(name));
    if (!device) {
        kvd_pool_spec_t s;

        memset(&s, 0, sizeof(s));
        s.name = name;
        s.kind = KVD_MEM_HOST;
        s.num_layers = o->layers;
        s.num_slots = o->blocks * o->tokens;
        s.slot_bytes = o->token_bytes;
        s.page_size = o->tokens;
        if ((st = kvd_pool_create(cli, &s, &p->info)) != KVD_OK)
            return fail(cli, st, "pool create");
        /* a worker writes its KV before a save reads it: the pool's pages
         * are there, not faulted in by the daemon's first copy */
        if ((st = kvd_pool_export(cli, p->info.id, NULL, 0, &p->map)) != KVD_OK)
            return fail(cli, st, "pool export");
        memset(p->map->base, 0x3c, p->map->bytes);
        p->host = malloc(bytes);
        p->host2 = malloc(bytes);
        if (p->host == NULL || p->host2 == NULL)
            return fail(cli, KVD_ENOMEM, "memory");
        memset(p->host, 0x5a, bytes);
        memset(p->host2, 0, bytes);
        return 0;
    }
#ifdef KVD_HAVE_CUDA
    if (cudaMalloc((void **)&p->dev, bytes) != cudaSuccess ||
        cudaMemset(p->dev, 0x3c, bytes) != cudaSuccess ||
        cudaHostAlloc((void **)&p->host, bytes, cudaHostAllocPortable) != cudaSuccess) {
        fprintf(stderr, "bench_disk_load: CUDA: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    memset(p->host, 0x5a, bytes);
    st = kvb_import_device_kv(cli, name, p->dev, o->layers, o->blocks, o->tokens, o->token_bytes,
                              &p->info);
    if (st != KVD_OK)
        return fail(cli, st, "pool import");
    return 0;
#else
    fprintf(stderr, "bench_disk_load: --pool device needs a build with CUDA\n");
    return 2;
#endif
}

static void pool_free(kvd_client_t *cli, pool_t *p)
{
    kvd_mapping_destroy(&p->map);
    (void)kvd_pool_drop(cli, p->info.id, NULL);
#ifdef KVD_HAVE_CUDA
    if (p->dev != NULL) {
        cudaFree(p->dev);
        cudaFreeHost(p->host);
        return;
    }
#endif
    free(p->host);
    free(p->host2);
}

/* The copy of bytes beside the load: host to device, or host to host. */
static double copy_us(const pool_t *p, uint64_t bytes)
{
    double t0 = kvd__cli_now_us();

#ifdef KVD_HAVE_CUDA
    if (p->dev != NULL) {
        if (cudaMemcpy(p->dev, p->host, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
            return -1;
        return kvd__cli_now_us() - t0;
    }
#endif
    memcpy(p->host2, p->host, bytes);
    return kvd__cli_now_us() - t0;
}

static int run(kvd_client_t *cli, const opts_t *o, bool device, result_t *r)
{
    const uint64_t n = o->blocks, block = 2ull * o->layers * o->tokens * o->token_bytes;
    const uint64_t sets = o->iterations + 2;
    uint8_t *keys = malloc(n * KEY);
    int64_t *pages = malloc(n * sizeof(*pages));
    double *t = malloc((o->iterations + 1) * sizeof(*t));
    kvd_cache_spec_t cs;
    kvd_cache_info_t info, ci;
    kvd_status_t st;
    pool_t pool;
    char name[64];
    double t0, last_change;
    uint64_t written = 0, step;

    memset(r, 0, sizeof(*r));
    r->block_bytes = block;
    r->blocks = n;
    r->sets = sets;
    r->device = device;
    r->disk_hits_min = UINT32_MAX;
    if (keys == NULL || pages == NULL || t == NULL)
        return fail(cli, KVD_ENOMEM, "memory");
    if (pool_make(cli, o, device, &pool) != 0)
        return 1;
    kvd__bench_prefix(name, sizeof(name));
    memset(&cs, 0, sizeof(cs));
    cs.name = name;
    cs.layout.num_layers = o->layers;
    cs.layout.tokens_per_block = o->tokens;
    cs.layout.token_bytes = o->token_bytes;
    snprintf(cs.layout.dtype, sizeof(cs.layout.dtype), "bf16");
    /* a load reads disk-only blocks into host memory first: room for a set
     * being loaded and the set saved last */
    cs.budget_bytes = o->host_budget != 0 ? o->host_budget : 2 * n * block;
    /* every set, each record with room for its header and alignment */
    cs.disk_budget_bytes = o->disk_budget != 0 ? o->disk_budget : sets * n * (block + 8192);
    if ((st = kvd_cache_create(cli, &cs, &info)) != KVD_OK)
        return fail(cli, st, "cache create (a daemon with --cache-dir and room for "
                             "--disk-budget?)");
    for (uint64_t i = 0; i < n; i++)
        pages[i] = (int64_t)((i * 7919ull) % n); /* scattered pages */

    /* spill: every set saved, a quarter of the host budget a request (the
     * blocks being written to disk are held meanwhile: a save the disk is
     * behind is refused, EBUSY, and tried again); the sets before each leave
     * host memory */
    step = info.capacity / 4 > 0 ? info.capacity / 4 : 1;
    t0 = kvd__cli_now_us();
    for (uint64_t s = 0; s < sets; s++) {
        set_keys(keys, s, n);
        for (uint64_t at = 0; at < n;) {
            uint64_t m = n - at < step ? n - at : step;
            kvd_cache_save_t a;
            kvd_op_result_t res;

            memset(&a, 0, sizeof(a));
            memset(&res, 0, sizeof(res));
            a.cache = info.id;
            a.pool = pool.info.id;
            a.keys = kvb_blob_keys(keys + at * KEY, m);
            a.blocks.values = pages + at;
            a.blocks.count = m;
            if (at > 0) {
                a.parent = keys + (at - 1) * KEY;
                a.parent_len = KEY;
            }
            st = kvd_cache_save(cli, &a, NULL, &res);
            if (st != KVD_OK && st != KVD_EBUSY)
                return fail(cli, st, "save");
            if (st == KVD_EBUSY || res.refused > 0) {
                r->busy_retries++;
                if (kvd__cli_now_us() - t0 > 600e6)
                    return fail(cli, st, "saves refused for 10 minutes");
                usleep(500);
                continue; /* the blocks stored already are skipped */
            }
            at += m;
        }
    }
    r->save_s = (kvd__cli_now_us() - t0) / 1e6;
    /* the spill ends when the disk level's bytes written stop growing for
     * a second */
    last_change = kvd__cli_now_us();
    for (;;) {
        if ((st = kvd_cache_stats(cli, info.id, NULL, &ci)) != KVD_OK)
            return fail(cli, st, "stats");
        if (ci.disk.write_bytes != written) {
            written = ci.disk.write_bytes;
            last_change = kvd__cli_now_us();
        } else if (kvd__cli_now_us() - last_change > 1e6) {
            break;
        }
        if (kvd__cli_now_us() - t0 > 600e6)
            return fail(cli, KVD_ETIMEDOUT, "the spill went on for 10 minutes");
        usleep(2000);
    }
    if (!ci.disk.enabled || written == 0)
        return fail(cli, KVD_EINVAL, "nothing was spilled to disk");
    r->spilled_bytes = written;
    r->spill_mbps = (double)written / (last_change - t0);

    /* loads: the oldest sets, on disk only */
    for (uint64_t s = 0; s < o->iterations; s++) {
        kvd_cache_lookup_result_t lr;
        kvd_cache_load_t a;
        kvd_cache_keys_t k;

        set_keys(keys, s, n);
        k = kvb_blob_keys(keys, n);
        if ((st = kvd_cache_lookup(cli, info.id, &k, false, 0, &lr)) != KVD_OK)
            return fail(cli, st, "lookup");
        if (lr.hits != n) {
            fprintf(stderr, "bench_disk_load: set %" PRIu64 ": %u of %" PRIu64
                            " blocks found (a disk budget too small?)\n",
                    s, lr.hits, n);
            return 1;
        }
        if (lr.disk_hits < r->disk_hits_min)
            r->disk_hits_min = lr.disk_hits;
        memset(&a, 0, sizeof(a));
        a.cache = info.id;
        a.pool = pool.info.id;
        a.keys = k;
        a.blocks.values = pages;
        a.blocks.count = n;
        t0 = kvd__cli_now_us();
        if ((st = kvd_cache_load(cli, &a, NULL, NULL)) != KVD_OK)
            return fail(cli, st, "load");
        t[s] = kvd__cli_now_us() - t0;
    }
    r->first_load_us = t[0];
    r->load_gbs = (double)n * block / (kvb_median(t, o->iterations) * 1e3);
    for (uint64_t i = 0; i <= o->iterations; i++)
        if ((t[i] = copy_us(&pool, n * block)) < 0)
            return fail(cli, KVD_ECUDA, "in-process copy");
    r->copy_gbs = (double)n * block / (kvb_median(t + 1, o->iterations) * 1e3);
    (void)kvd_cache_drop(cli, info.id, NULL);
    pool_free(cli, &pool);
    free(keys);
    free(pages);
    free(t);
    return 0;
}

static int usage(const char *msg)
{
    fprintf(stderr,
            "bench_disk_load: %s\nusage: bench_disk_load [--socket PATH] [--json] "
            "[--pool host|device] [--blocks N] [--iterations N] [--layers N] [--tokens N] "
            "[--token-bytes N] [--host-budget SIZE] [--disk-budget SIZE]\n",
            msg);
    return 2;
}

int main(int argc, char **argv)
{
    opts_t o = {NULL, false, -1, 1024, 3, 2048, 0, 0, 32, 16};
    kvd_client_t *cli = NULL;
    result_t r;
    kvd_status_t st;
    bool device;
    int rc;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t v = 0;

        if (strcmp(a, "--json") == 0) {
            o.json = true;
            continue;
        }
        if (val == NULL)
            return usage("an option lacks its value");
        i++;
        if (strcmp(a, "--socket") == 0)
            o.socket = val;
        else if (strcmp(a, "--pool") == 0 && (strcmp(val, "host") == 0 || strcmp(val, "device") == 0))
            o.device = strcmp(val, "device") == 0;
        else if (!kvd__cli_parse_u64(val, &v, true) || v == 0)
            return usage("a count or size must be a positive number");
        else if (strcmp(a, "--blocks") == 0 && v <= KVD_CACHE_KEYS_MAX)
            o.blocks = v;
        else if (strcmp(a, "--iterations") == 0 && v <= 1000)
            o.iterations = v;
        else if (strcmp(a, "--layers") == 0 && v <= 128)
            o.layers = (uint32_t)v;
        else if (strcmp(a, "--tokens") == 0 && v <= 1024)
            o.tokens = (uint32_t)v;
        else if (strcmp(a, "--token-bytes") == 0)
            o.token_bytes = v;
        else if (strcmp(a, "--host-budget") == 0)
            o.host_budget = v;
        else if (strcmp(a, "--disk-budget") == 0)
            o.disk_budget = v;
        else
            return usage("unknown option, or a value out of range");
    }
    if ((st = kvd_client_create(o.socket, "bench-disk-load", &cli)) != KVD_OK) {
        fprintf(stderr, "bench_disk_load: %s\n", kvd_client_last_error(NULL));
        return 1;
    }
    device = o.device >= 0 ? o.device == 1 : kvd_client_info(cli)->backend == KVD_BACKEND_CUDA;
#ifndef KVD_HAVE_CUDA
    if (o.device < 0)
        device = false;
#endif
    rc = run(cli, &o, device, &r);
    if (rc == 0 && o.json) {
        printf("{\"pool\":\"%s\",\"block_bytes\":%" PRIu64 ",\"blocks\":%" PRIu64
               ",\"sets\":%" PRIu64 ",\"save_s\":%.3f,\"spilled_bytes\":%" PRIu64
               ",\"spill_MBps\":%.0f,\"disk_hits_min\":%u,\"first_load_us\":%.0f,"
               "\"load_GBps\":%.3f,\"copy_GBps\":%.3f,\"copy\":\"%s\",\"busy_retries\":%" PRIu64
               "}\n",
               r.device ? "device" : "host", r.block_bytes, r.blocks, r.sets, r.save_s,
               r.spilled_bytes, r.spill_mbps, r.disk_hits_min, r.first_load_us, r.load_gbs,
               r.copy_gbs, r.device ? "host-to-device" : "host-to-host", r.busy_retries);
    } else if (rc == 0) {
        char b[32];

        kvd__cli_human_bytes(b, sizeof(b), (double)r.block_bytes);
        printf("disk level: %" PRIu64 " sets of %" PRIu64 " blocks of %s into a %s pool\n",
               r.sets, r.blocks, b, r.device ? "device" : "host");
        printf("  spill       %.0f MB/s (%" PRIu64 " bytes written; the saves took %.2f s, %" PRIu64
               " tried again while the disk was behind)\n",
               r.spill_mbps, r.spilled_bytes, r.save_s, r.busy_retries);
        printf("  disk load   %.2f GB/s median, the first %.0f us; %u of %" PRIu64
               " blocks were on disk only at the least\n",
               r.load_gbs, r.first_load_us, r.disk_hits_min, r.blocks);
        printf("  copy beside %.2f GB/s (%s, in this process)\n", r.copy_gbs,
               r.device ? "pinned host to device" : "host to host");
    }
    kvd_client_destroy(&cli);
    return rc;
}
