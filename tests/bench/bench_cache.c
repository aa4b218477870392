/*
 * bench_cache: the cache tier through a running kvdockd.
 *
 *   lookup    two caches of tiny blocks (one 16-byte row each) filled with
 *             chains of 1,000 keys, one to 10,000 blocks, one to
 *             --resident (1,000,000): the latency of looking up a whole
 *             1,000-key chain (every key present; a random chain each
 *             time) in each, the two alternating, and the daemon's
 *             resident memory per block of the large one beyond its
 *             slabs' bytes (from /proc: run it on the daemon's machine).
 *             Targets: p50 <= 30 us, the 1M figure <= 1.2 times the 10K
 *             one, at most 100 bytes a block.  Then a ping, a lookup of a chain
 *             whose first key is missing and of that key alone, in turn:
 *             the missing chain at most 1.5 times the ping.  Any backend.
 *
 *   transfer  (cuda) blocks of --tokens tokens x --layers layers x K and V
 *             x --token-bytes rows (16 x 32 x 2 KiB: 2 MiB a block, 32 KiB
 *             contiguous per layer and K/V), --blocks at a time (1,024),
 *             between a device KV cache this process owns and imports as a
 *             pool, and the tier: save GB/s, load GB/s, a save and a load
 *             at once (combined GB/s), the same copies issued in-process
 *             (the kernel library's copy-engine path on one stream, which
 *             is what the daemon runs), and a load with one event per layer:
 *             when the reply at enqueue comes and the first layer's event
 *             fires, against the whole load; and with one flag per layer in
 *             a host buffer, polled here: when the first layer's is set.
 *             Each figure: the median of --iterations after one warm.
 *
 * Usage: bench_cache [--case lookup|transfer|all] [--socket PATH] [--json]
 *        [--lookups N] [--resident N] [--blocks N] [--iterations N]
 *        [--layers N] [--tokens N] [--token-bytes N]
 * Caches it makes are dropped at the end (and the pools go with its
 * connection).
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
#include "kvdock/kernels.h"
#include "util.h"

#ifdef KVD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define CHAIN 1000
#define KEY KVB_KEY

typedef struct opts {
    const char *socket;
    bool json;
    int cases;
    uint64_t lookups;
    uint64_t resident;
    uint64_t blocks;
    uint64_t iterations;
    uint32_t layers, tokens;
    uint64_t token_bytes;
} opts_t;

enum { CASE_LOOKUP = 1, CASE_TRANSFER = 2 };

static int fail(kvd_client_t *cli, kvd_status_t st, const char *what)
{
    return kvb_fail("bench_cache", cli, st, what);
}

/* kB of a /proc/PID/status field. */
static long proc_kb(uint32_t pid, const char *field)
{
    char path[64], line[256];
    size_t n = strlen(field);
    long kb = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%u/status", pid);
    if ((f = fopen(path, "r")) == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            kb = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

/* ------------------------------------------------------------------------ */
/* lookup                                                                    */

typedef struct lookup_res {
    kvd__bench_lat_t small, large;
    uint64_t small_blocks, large_blocks;
    double ratio;
    double bytes_per_block; /* < 0: not measured */
    kvd__bench_lat_t ping, miss, miss1; /* a ping; a chain missing at its first key; one key */
    double miss_ratio;                  /* miss p50 over ping p50 */
} lookup_res_t;

/* Save chains [from, to) of CHAIN keys from the pool's pages 0..CHAIN-1. */
static kvd_status_t fill(kvd_client_t *cli, uint64_t cache, uint64_t pool, uint64_t from,
                         uint64_t to, uint8_t *keys, const int64_t *pages)
{
    for (uint64_t c = from; c < to; c++) {
        kvd_cache_save_t a;
        kvd_op_result_t res;
        kvd_status_t st;

        kvb_chain_keys(keys, c, CHAIN);
        memset(&a, 0, sizeof(a));
        a.cache = cache;
        a.pool = pool;
        a.keys = kvb_blob_keys(keys, CHAIN);
        a.blocks.values = pages;
        a.blocks.count = CHAIN;
        if ((st = kvd_cache_save(cli, &a, NULL, &res)) != KVD_OK)
            return st;
        if (res.stored != CHAIN)
            return KVD_EBUSY;
    }
    return KVD_OK;
}

/* n lookups in each of two caches, alternating (so that whatever else the
 * machine does weighs on both alike), of random chains among [0, chains[k])
 * of cache k, every key a hit. */
static kvd_status_t time_lookups(kvd_client_t *cli, const uint64_t cache[2],
                                 const uint64_t chains[2], uint64_t n, kvd__bench_lat_t out[2])
{
    uint8_t *keys = malloc((size_t)CHAIN * KEY);
    double *v[2] = {malloc((size_t)n * sizeof(double)), malloc((size_t)n * sizeof(double))};
    uint64_t warm = n / 10;
    kvd_status_t st = KVD_OK;

    if (keys == NULL || v[0] == NULL || v[1] == NULL) {
        free(keys);
        free(v[0]);
        free(v[1]);
        return KVD_ENOMEM;
    }
    for (uint64_t i = 0; i < 2 * (n + warm) && st == KVD_OK; i++) {
        kvd_cache_keys_t k = kvb_blob_keys(keys, CHAIN);
        kvd_cache_lookup_result_t r;
        int which = (int)(i & 1);
        double t0;

        kvb_chain_keys(keys, (which ? 1000000000ull : 0) + kvb_mix(i + 77) % chains[which], CHAIN);
        t0 = kvd__cli_now_us();
        st = kvd_cache_lookup(cli, cache[which], &k, false, 0, &r);
        if (i / 2 >= warm)
            v[which][i / 2 - warm] = kvd__cli_now_us() - t0;
        if (st == KVD_OK && r.hits != CHAIN)
            st = KVD_EPROTO;
    }
    if (st == KVD_OK) {
        kvd__bench_lat(&out[0], v[0], n);
        kvd__bench_lat(&out[1], v[1], n);
    }
    free(keys);
    free(v[0]);
    free(v[1]);
    return st;
}

/* n rounds of a ping, a lookup of a CHAIN-key chain whose first key is
 * missing from cache and a lookup of that one key, in turn (so that the
 * machine weighs on the three alike). */
static kvd_status_t time_misses(kvd_client_t *cli, uint64_t cache, uint64_t n,
                                kvd__bench_lat_t out[3])
{
    uint8_t *keys = malloc((size_t)CHAIN * KEY);
    double *v[3] = {malloc((size_t)n * sizeof(double)), malloc((size_t)n * sizeof(double)),
                    malloc((size_t)n * sizeof(double))};
    uint64_t warm = n / 10;
    kvd_status_t st = KVD_OK;

    if (keys == NULL || v[0] == NULL || v[1] == NULL || v[2] == NULL) {
        free(keys);
        for (int j = 0; j < 3; j++)
            free(v[j]);
        return KVD_ENOMEM;
    }
    for (uint64_t i = 0; i < n + warm && st == KVD_OK; i++) {
        kvd_cache_lookup_result_t r;
        double t[4];

        kvb_chain_keys(keys, 5000000000ull + i, CHAIN);
        kvd_cache_keys_t k = kvb_blob_keys(keys, CHAIN), k1 = kvb_blob_keys(keys, 1);
        t[0] = kvd__cli_now_us();
        st = kvd_ping(cli, NULL, 0);
        t[1] = kvd__cli_now_us();
        if (st == KVD_OK)
            st = kvd_cache_lookup(cli, cache, &k, false, 0, &r);
        t[2] = kvd__cli_now_us();
        if (st == KVD_OK && r.hits != 0)
            st = KVD_EPROTO;
        if (st == KVD_OK)
            st = kvd_cache_lookup(cli, cache, &k1, false, 0, &r);
        t[3] = kvd__cli_now_us();
        if (st == KVD_OK && r.hits != 0)
            st = KVD_EPROTO;
        if (i >= warm)
            for (int j = 0; j < 3; j++)
                v[j][i - warm] = t[j + 1] - t[j];
    }
    if (st == KVD_OK)
        for (int j = 0; j < 3; j++)
            kvd__bench_lat(&out[j], v[j], n);
    free(keys);
    for (int j = 0; j < 3; j++)
        free(v[j]);
    return st;
}

/* A cache of 16-byte blocks for chains of CHAIN keys. */
static kvd_status_t lookup_cache(kvd_client_t *cli, const char *prefix, const char *tag,
                                 uint64_t blocks, uint64_t *id)
{
    kvd_cache_spec_t cs;
    kvd_cache_info_t info;
    char name[96];
    kvd_status_t st;

    snprintf(name, sizeof(name), "%s-%s", prefix, tag);
    memset(&cs, 0, sizeof(cs));
    cs.name = name;
    cs.layout.num_layers = 1;
    cs.layout.mla = true;
    cs.layout.tokens_per_block = 1;
    cs.layout.token_bytes = 16;
    cs.budget_bytes = blocks * 16;
    st = kvd_cache_create(cli, &cs, &info);
    *id = info.id;
    return st;
}

static int run_lookup(kvd_client_t *cli, const opts_t *o, lookup_res_t *r)
{
    const uint32_t pid = kvd_client_info(cli)->daemon_pid;
    uint64_t chains[2] = {10000 / CHAIN, o->resident / CHAIN}, cache[2];
    uint8_t *keys = malloc((size_t)CHAIN * KEY);
    int64_t pages[CHAIN];
    kvd_pool_spec_t ps;
    kvd_pool_info_t pool;
    kvd__bench_lat_t lat[2];
    kvd_status_t st;
    char name[64];
    long rss0, shm0, rss1, shm1;

    memset(r, 0, sizeof(*r));
    if (keys == NULL)
        return fail(cli, KVD_ENOMEM, "keys");
    for (int i = 0; i < CHAIN; i++)
        pages[i] = i;
    kvd__bench_prefix(name, sizeof(name));
    memset(&ps, 0, sizeof(ps));
    ps.name = name;
    ps.kind = KVD_MEM_HOST;
    ps.num_layers = 1;
    ps.num_slots = CHAIN;
    ps.slot_bytes = 16;
    ps.mla = true;
    if ((st = kvd_pool_create(cli, &ps, &pool)) != KVD_OK)
        return fail(cli, st, "pool create");
    if ((st = lookup_cache(cli, name, "small", chains[0] * CHAIN, &cache[0])) != KVD_OK ||
        (st = fill(cli, cache[0], pool.id, 0, chains[0], keys, pages)) != KVD_OK)
        return fail(cli, st, "the 10K cache");
    rss0 = proc_kb(pid, "VmRSS");
    shm0 = proc_kb(pid, "RssShmem");
    if ((st = lookup_cache(cli, name, "large", chains[1] * CHAIN, &cache[1])) != KVD_OK ||
        (st = fill(cli, cache[1], pool.id, 1000000000ull, 1000000000ull + chains[1], keys,
                   pages)) != KVD_OK)
        return fail(cli, st, "the 1M cache");
    rss1 = proc_kb(pid, "VmRSS");
    shm1 = proc_kb(pid, "RssShmem");
    r->small_blocks = chains[0] * CHAIN;
    r->large_blocks = chains[1] * CHAIN;
    if ((st = time_lookups(cli, cache, chains, o->lookups, lat)) != KVD_OK)
        return fail(cli, st, "lookups");
    r->small = lat[0];
    r->large = lat[1];
    r->ratio = r->large.p50 / r->small.p50;
    {
        kvd__bench_lat_t m[3];

        if ((st = time_misses(cli, cache[1], o->lookups, m)) != KVD_OK)
            return fail(cli, st, "missing lookups");
        r->ping = m[0];
        r->miss = m[1];
        r->miss1 = m[2];
        r->miss_ratio = r->miss.p50 / r->ping.p50;
    }
    /* resident growth with the large cache, less its slabs' touched bytes
     * (memfd on cpu: RssShmem; pinned on cuda: anonymous, so the bytes) */
    r->bytes_per_block = -1;
    if (rss0 >= 0 && rss1 >= 0) {
        double grown = (double)(rss1 - rss0) * 1024.0;
        double slabs = shm0 >= 0 && shm1 > shm0 ? (double)(shm1 - shm0) * 1024.0
                                                : (double)r->large_blocks * 16.0;
        r->bytes_per_block = (grown - slabs) / (double)r->large_blocks;
    }
    for (int i = 0; i < 2; i++)
        if ((st = kvd_cache_drop(cli, cache[i], NULL)) != KVD_OK)
            return fail(cli, st, "cache drop");
    (void)kvd_pool_drop(cli, pool.id, NULL);
    free(keys);
    return 0;
}

static void print_lookup(const lookup_res_t *r)
{
    printf("lookup of a %d-key chain (all hits), p50 / p99 us:\n", CHAIN);
    printf("  %8" PRIu64 " blocks resident  %7.1f / %7.1f\n", r->small_blocks, r->small.p50,
           r->small.p99);
    printf("  %8" PRIu64 " blocks resident  %7.1f / %7.1f\n", r->large_blocks, r->large.p50,
           r->large.p99);
    printf("  ratio %.2f (target <= 1.2), p50 %s 30 us\n", r->ratio,
           r->large.p50 <= 30 && r->small.p50 <= 30 ? "<=" : ">");
    if (r->bytes_per_block >= 0)
        printf("  daemon memory beyond the slabs: %.0f bytes a block (target <= 100)\n",
               r->bytes_per_block);
    printf("a chain missing at its first key, beside a ping, p50 / p99 us:\n");
    printf("  ping                       %7.1f / %7.1f\n", r->ping.p50, r->ping.p99);
    printf("  %4d keys, the first missing %7.1f / %7.1f\n", CHAIN, r->miss.p50, r->miss.p99);
    printf("  1 key, missing             %7.1f / %7.1f\n", r->miss1.p50, r->miss1.p99);
    printf("  ratio to a ping %.2f (target <= 1.5)\n", r->miss_ratio);
}

static void json_lookup(const lookup_res_t *r)
{
    printf("\"lookup\":{\"chain\":%d,\"small_blocks\":%" PRIu64 ",\"small_p50_us\":%.2f,"
           "\"small_p99_us\":%.2f,\"large_blocks\":%" PRIu64 ",\"large_p50_us\":%.2f,"
           "\"large_p99_us\":%.2f,\"ratio\":%.3f,\"bytes_per_block\":%.1f,"
           "\"ping_p50_us\":%.2f,\"miss_first_p50_us\":%.2f,\"miss_one_p50_us\":%.2f,"
           "\"miss_ratio\":%.3f}",
           CHAIN, r->small_blocks, r->small.p50, r->small.p99, r->large_blocks, r->large.p50,
           r->large.p99, r->ratio, r->bytes_per_block, r->ping.p50, r->miss.p50, r->miss1.p50,
           r->miss_ratio);
}

/* ------------------------------------------------------------------------ */
/* transfer (cuda)                                                           */

typedef struct transfer_res {
    uint64_t block_bytes, blocks;
    double save_gbs, load_gbs, combined_gbs;
    double inproc_save_gbs, inproc_load_gbs;
    double ratio_save, ratio_load; /* daemon time over in-process time */
    double enqueued_us, first_layer_us, whole_load_us, first_layer_bound_us;
    double flag_first_us, flag_whole_us, flag_bound_us;
    bool have_inproc;
} transfer_res_t;

#ifdef KVD_HAVE_CUDA
/* keys of blocks [from, from + n) of a transfer chain set */
static void block_keys(uint8_t *keys, uint64_t set, uint32_t n)
{
    kvb_chain_keys(keys, 1000000 + set, n);
}

static int run_transfer(kvd_client_t *cli, const opts_t *o, transfer_res_t *r)
{
    const uint32_t L = o->layers, T = o->tokens, n = (uint32_t)o->blocks;
    const uint64_t chunk = (uint64_t)T * o->token_bytes, block = 2 * L * chunk;
    const uint64_t layer_bytes = (uint64_t)n * chunk; /* K (or V) of one layer */
    uint64_t iters = o->iterations, set = 0;
    char *dev = NULL, *host = NULL;
    uint8_t *keys = malloc((size_t)n * KEY), *keys2 = malloc((size_t)n * KEY);
    int64_t *pages = malloc((size_t)n * sizeof(int64_t));
    int64_t *places = malloc((size_t)n * sizeof(int64_t));
    double *t = malloc((size_t)(iters + 1) * sizeof(double));
    kvd_pool_info_t pool;
    kvd_cache_spec_t cs;
    kvd_cache_info_t info;
    kvd_status_t st;
    char name[64];
    cudaStream_t s = NULL;
    cudaEvent_t *levs = calloc(L, sizeof(*levs));
    uint64_t flag_buf = 0;
    kvd_mapping_t *flag_map = NULL;
    uint64_t *lev_ids = calloc(L, sizeof(*lev_ids));

    memset(r, 0, sizeof(*r));
    r->block_bytes = block;
    r->blocks = n;
    if (!keys || !keys2 || !pages || !places || !t || !levs || !lev_ids)
        return fail(cli, KVD_ENOMEM, "memory");
    /* the worker's KV cache: per layer K then V, n pages of T tokens */
    if (cudaMalloc((void **)&dev, 2 * L * layer_bytes) != cudaSuccess ||
        cudaMemset(dev, 0x3c, 2 * L * layer_bytes) != cudaSuccess ||
        cudaHostAlloc((void **)&host, (size_t)n * block, cudaHostAllocPortable) !=
            cudaSuccess ||
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "bench_cache: CUDA: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    memset(host, 0, (size_t)n * block);
    kvd__bench_prefix(name, sizeof(name));
    if ((st = kvb_import_device_kv(cli, name, dev, L, n, T, o->token_bytes, &pool)) != KVD_OK)
        return fail(cli, st, "pool import");
    memset(&cs, 0, sizeof(cs));
    cs.name = name;
    cs.layout.num_layers = L;
    cs.layout.tokens_per_block = T;
    cs.layout.token_bytes = o->token_bytes;
    snprintf(cs.layout.dtype, sizeof(cs.layout.dtype), "bf16");
    /* the set loaded, the set being saved, and room for the one before:
     * which of those two ends up more recent depends on which request ends
     * first */
    cs.budget_bytes = 3ull * n * block;
    if ((st = kvd_cache_create(cli, &cs, &info)) != KVD_OK)
        return fail(cli, st, "cache create");
    for (uint32_t i = 0; i < n; i++)
        pages[i] = (int64_t)((i * 7919ull) % n); /* scattered pages */

    /* saves: a fresh set of keys each time; loads: of the set saved last */
    for (uint64_t i = 0; i <= iters; i++) {
        kvd_cache_save_t a;
        kvd_op_result_t res;
        double t0;

        block_keys(keys, set++, n);
        memset(&a, 0, sizeof(a));
        a.cache = info.id;
        a.pool = pool.id;
        a.keys = kvb_blob_keys(keys, n);
        a.blocks.values = pages;
        a.blocks.count = n;
        t0 = kvd__cli_now_us();
        if ((st = kvd_cache_save(cli, &a, NULL, &res)) != KVD_OK)
            return fail(cli, st, "save");
        t[i] = kvd__cli_now_us() - t0;
        if (res.stored != n)
            return fail(cli, KVD_EBUSY, "save stored fewer blocks");
    }
    r->save_gbs = (double)n * block / (kvb_median(t + 1, iters) * 1e3);
    for (uint64_t i = 0; i <= iters; i++) {
        kvd_cache_load_t a;
        double t0;

        memset(&a, 0, sizeof(a));
        a.cache = info.id;
        a.pool = pool.id;
        a.keys = kvb_blob_keys(keys, n);
        a.blocks.values = pages;
        a.blocks.count = n;
        t0 = kvd__cli_now_us();
        if ((st = kvd_cache_load(cli, &a, NULL, NULL)) != KVD_OK)
            return fail(cli, st, "load");
        t[i] = kvd__cli_now_us() - t0;
    }
    r->load_gbs = (double)n * block / (kvb_median(t + 1, iters) * 1e3);

    /* a save of a new set and a load of the last at once */
    for (uint64_t i = 0; i <= iters; i++) {
        kvd_cache_save_t sa;
        kvd_cache_load_t la;
        kvd_op_result_t sres, lres;
        uint64_t rs, rl;
        double t0;

        block_keys(keys2, set++, n);
        memset(&sa, 0, sizeof(sa));
        sa.cache = info.id;
        sa.pool = pool.id;
        sa.keys = kvb_blob_keys(keys2, n);
        sa.blocks.values = pages;
        sa.blocks.count = n;
        memset(&la, 0, sizeof(la));
        la.cache = info.id;
        la.pool = pool.id;
        la.keys = kvb_blob_keys(keys, n);
        la.blocks.values = pages;
        la.blocks.count = n;
        t0 = kvd__cli_now_us();
        if ((st = kvd_cache_save_submit(cli, &sa, NULL, &sres, &rs)) != KVD_OK ||
            (st = kvd_cache_load_submit(cli, &la, NULL, &lres, &rl)) != KVD_OK ||
            (st = kvd_client_wait(cli, rs)) != KVD_OK || (st = kvd_client_wait(cli, rl)) != KVD_OK)
            return fail(cli, st, "save and load at once");
        t[i] = kvd__cli_now_us() - t0;
        memcpy(keys, keys2, (size_t)n * KEY); /* the next round loads this set */
    }
    r->combined_gbs = 2.0 * n * block / (kvb_median(t + 1, iters) * 1e3);

    /* layer-wise, two ways.  One event per layer with the reply at enqueue
     * (a client may wait on an interprocess event only once its record is
     * queued): when the reply comes and the first layer's event fires.
     * One flag per layer in a host buffer, polled from here: when the
     * first layer's flag is set (a stream may wait on a flag at any time). */
    for (uint32_t l = 0; l < L; l++) {
        uint8_t h[KVD_IPC_HANDLE_BYTES];
        if (cudaEventCreateWithFlags(&levs[l], cudaEventDisableTiming | cudaEventInterprocess) !=
                cudaSuccess ||
            (st = kvd_event_ipc_handle(levs[l], h)) != KVD_OK ||
            (st = kvd_event_register(cli, h, &lev_ids[l])) != KVD_OK)
            return fail(cli, st ? st : KVD_ECUDA, "layer events");
    }
    if ((st = kvd_buffer_register(cli, 4ull * L, KVD_MEM_HOST, "bench-flags", &flag_buf,
                                  &flag_map)) != KVD_OK)
        return fail(cli, st, "flag buffer");
    {
        double first[64], whole[64], enq[64], ffirst[64], fwhole[64];
        volatile uint32_t *flags = flag_map->base;
        uint64_t m = iters < 64 ? iters : 64;
        for (uint64_t i = 0; i <= m; i++) {
            kvd_cache_load_t a;
            kvd_sync_t sync;
            kvd_op_result_t res;
            uint64_t rid;
            double t0, te, t1;

            memset(&a, 0, sizeof(a));
            a.cache = info.id;
            a.pool = pool.id;
            a.keys = kvb_blob_keys(keys, n);
            a.blocks.values = pages;
            a.blocks.count = n;
            a.layer_events = lev_ids;
            a.num_layer_events = L;
            memset(&sync, 0, sizeof(sync));
            sync.reply_at_enqueue = true;
            t0 = kvd__cli_now_us();
            if ((st = kvd_cache_load(cli, &a, &sync, NULL)) != KVD_OK)
                return fail(cli, st, "layer-wise load");
            te = kvd__cli_now_us();
            while (cudaEventQuery(levs[0]) == cudaErrorNotReady)
                ;
            t1 = kvd__cli_now_us();
            if (cudaEventSynchronize(levs[L - 1]) != cudaSuccess)
                return fail(cli, KVD_ECUDA, "layer event");
            if (i > 0) {
                enq[i - 1] = te - t0;
                first[i - 1] = t1 - t0;
                whole[i - 1] = kvd__cli_now_us() - t0;
            }
            /* flags: the value of this round, polled */
            memset(&a, 0, sizeof(a));
            a.cache = info.id;
            a.pool = pool.id;
            a.keys = kvb_blob_keys(keys, n);
            a.blocks.values = pages;
            a.blocks.count = n;
            a.layer_flags.buffer = flag_buf;
            a.layer_flags.bytes = 4ull * L;
            a.flag_value = (uint32_t)i + 1;
            t0 = kvd__cli_now_us();
            if ((st = kvd_cache_load_submit(cli, &a, NULL, &res, &rid)) != KVD_OK)
                return fail(cli, st, "flagged load");
            while (flags[0] != (uint32_t)i + 1 && kvd__cli_now_us() - t0 < 10e6)
                ;
            t1 = kvd__cli_now_us();
            if ((st = kvd_client_wait(cli, rid)) != KVD_OK)
                return fail(cli, st, "flagged load");
            if (flags[0] != (uint32_t)i + 1 || flags[L - 1] != (uint32_t)i + 1)
                return fail(cli, KVD_EPROTO, "a layer flag was not set");
            if (i > 0) {
                ffirst[i - 1] = t1 - t0;
                fwhole[i - 1] = kvd__cli_now_us() - t0;
            }
        }
        r->enqueued_us = kvb_median(enq, m);
        r->first_layer_us = kvb_median(first, m);
        r->whole_load_us = kvb_median(whole, m);
        r->first_layer_bound_us = 1.5 / L * r->whole_load_us + 20.0;
        r->flag_first_us = kvb_median(ffirst, m);
        r->flag_whole_us = kvb_median(fwhole, m);
        r->flag_bound_us = 1.5 / L * r->flag_whole_us + 20.0;
    }

    /* in-process: the same copies on the copy engines, on one stream */
    {
        kvd_transfer_args_t a;
        kvd_launch_t launch = {s, 0, KVD_LAUNCH_COPY_ENGINE};
        unsigned long long oob = 0;
        double ts[2];

        for (uint32_t i = 0; i < n; i++)
            places[i] = i;
        for (int dir = 0; dir < 2; dir++) {
            memset(&a, 0, sizeof(a));
            a.src.k = dev;
            a.src.v = dev + layer_bytes;
            a.src.layer_stride = (int64_t)(2 * layer_bytes);
            a.src.slot_stride = (int64_t)chunk;
            a.src.num_slots = n;
            a.dst.k = host;
            a.dst.v = host + chunk;
            a.dst.layer_stride = (int64_t)(2 * chunk);
            a.dst.slot_stride = (int64_t)block;
            a.dst.num_slots = n;
            a.src_idx = pages;
            a.dst_idx = places;
            if (dir == 1) { /* load: host to device */
                kvd_kv_side_t x = a.src;
                a.src = a.dst;
                a.dst = x;
                a.src_idx = places;
                a.dst_idx = pages;
            }
            a.idx_dtype = KVD_DTYPE_I64;
            a.count = n;
            a.num_layers = L;
            a.row_bytes = (int64_t)chunk;
            a.oob_count = &oob;
            for (uint64_t i = 0; i <= iters; i++) {
                double t0 = kvd__cli_now_us();
                if (kvd_cuda_kv_transfer(&a, &launch) != KVD_OK ||
                    cudaStreamSynchronize(s) != cudaSuccess) {
                    fprintf(stderr, "bench_cache: in-process copies: %s\n",
                            kvd_last_error_detail());
                    return 1;
                }
                t[i] = kvd__cli_now_us() - t0;
            }
            ts[dir] = kvb_median(t + 1, iters);
        }
        r->inproc_save_gbs = (double)n * block / (ts[0] * 1e3);
        r->inproc_load_gbs = (double)n * block / (ts[1] * 1e3);
        r->ratio_save = r->inproc_save_gbs / r->save_gbs;
        r->ratio_load = r->inproc_load_gbs / r->load_gbs;
        r->have_inproc = true;
    }
    for (uint32_t l = 0; l < L; l++) {
        (void)kvd_event_drop(cli, lev_ids[l]);
        cudaEventDestroy(levs[l]);
    }
    kvd_mapping_destroy(&flag_map);
    (void)kvd_buffer_drop(cli, flag_buf);
    (void)kvd_cache_drop(cli, info.id, NULL);
    (void)kvd_pool_drop(cli, pool.id, NULL);
    cudaFree(dev);
    cudaFreeHost(host);
    cudaStreamDestroy(s);
    free(keys);
    free(keys2);
    free(pages);
    free(places);
    free(t);
    free(levs);
    free(lev_ids);
    return 0;
}
#endif

static void print_transfer(const opts_t *o, const transfer_res_t *r)
{
    char b[32];

    kvd__cli_human_bytes(b, sizeof(b), (double)r->block_bytes);
    printf("transfer: %" PRIu64 " blocks of %s (%u layers x %u tokens x %" PRIu64
           " B, K and V) per request, median of %" PRIu64 "\n",
           r->blocks, b, o->layers, o->tokens, o->token_bytes, o->iterations);
    printf("  save (device -> tier)    %6.1f GB/s   in-process %6.1f GB/s   ratio %.2f\n",
           r->save_gbs, r->inproc_save_gbs, r->ratio_save);
    printf("  load (tier -> device)    %6.1f GB/s   in-process %6.1f GB/s   ratio %.2f\n",
           r->load_gbs, r->inproc_load_gbs, r->ratio_load);
    printf("  save and load at once    %6.1f GB/s combined\n", r->combined_gbs);
    printf("  layer-wise load, events: enqueued %.0f us, first layer's event %.0f us, whole load "
           "%.0f us (bound %.0f us)\n",
           r->enqueued_us, r->first_layer_us, r->whole_load_us, r->first_layer_bound_us);
    printf("  layer-wise load, flags: first layer's flag %.0f us, whole load %.0f us (bound %.0f "
           "us)\n",
           r->flag_first_us, r->flag_whole_us, r->flag_bound_us);
}

static void json_transfer(const transfer_res_t *r)
{
    printf("\"transfer\":{\"block_bytes\":%" PRIu64 ",\"blocks\":%" PRIu64 ",\"save_gbs\":%.2f,"
           "\"load_gbs\":%.2f,\"combined_gbs\":%.2f,\"inproc_save_gbs\":%.2f,"
           "\"inproc_load_gbs\":%.2f,\"ratio_save\":%.3f,\"ratio_load\":%.3f,"
           "\"enqueued_us\":%.1f,\"first_layer_us\":%.1f,\"whole_load_us\":%.1f,"
           "\"first_layer_bound_us\":%.1f,\"flag_first_us\":%.1f,\"flag_whole_us\":%.1f,"
           "\"flag_bound_us\":%.1f}",
           r->block_bytes, r->blocks, r->save_gbs, r->load_gbs, r->combined_gbs,
           r->inproc_save_gbs, r->inproc_load_gbs, r->ratio_save, r->ratio_load, r->enqueued_us,
           r->first_layer_us, r->whole_load_us, r->first_layer_bound_us, r->flag_first_us,
           r->flag_whole_us, r->flag_bound_us);
}

static int usage(const char *msg)
{
    fprintf(stderr,
            "bench_cache: %s\nusage: bench_cache [--case lookup|transfer|all] [--socket PATH] "
            "[--json] [--lookups N] [--resident N] [--blocks N] [--iterations N] "
            "[--layers N] [--tokens N] [--token-bytes N]\n",
            msg);
    return 2;
}

int main(int argc, char **argv)
{
    opts_t o = {NULL, false, CASE_LOOKUP | CASE_TRANSFER, 2000, 1000000, 1024, 5, 32, 16, 2048};
    kvd_client_t *cli = NULL;
    lookup_res_t lr;
    transfer_res_t tr;
    bool cuda, did_transfer = false;
    kvd_status_t st;
    int rc = 0;

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
        else if (strcmp(a, "--case") == 0)
            o.cases = strcmp(val, "lookup") == 0     ? CASE_LOOKUP
                      : strcmp(val, "transfer") == 0 ? CASE_TRANSFER
                      : strcmp(val, "all") == 0      ? CASE_LOOKUP | CASE_TRANSFER
                                                     : 0;
        else if (!kvd__cli_parse_u64(val, &v, true) || v == 0)
            return usage("a count must be a positive number");
        else if (strcmp(a, "--lookups") == 0)
            o.lookups = v;
        else if (strcmp(a, "--resident") == 0)
            o.resident = v < 2 * 10000 ? 2 * 10000 : v;
        else if (strcmp(a, "--blocks") == 0)
            o.blocks = v;
        else if (strcmp(a, "--iterations") == 0)
            o.iterations = v;
        else if (strcmp(a, "--layers") == 0 && v <= 128)
            o.layers = (uint32_t)v;
        else if (strcmp(a, "--tokens") == 0 && v <= 1024)
            o.tokens = (uint32_t)v;
        else if (strcmp(a, "--token-bytes") == 0)
            o.token_bytes = v;
        else
            return usage("unknown option");
        if (o.cases == 0)
            return usage("--case takes lookup, transfer or all");
    }
    if ((st = kvd_client_create(o.socket, "bench-cache", &cli)) != KVD_OK) {
        fprintf(stderr, "bench_cache: %s\n", kvd_client_last_error(NULL));
        return 1;
    }
    cuda = kvd_client_info(cli)->backend == KVD_BACKEND_CUDA;
    if (o.cases & CASE_LOOKUP)
        rc = run_lookup(cli, &o, &lr);
    if (rc == 0 && (o.cases & CASE_TRANSFER)) {
#ifdef KVD_HAVE_CUDA
        if (cuda) {
            rc = run_transfer(cli, &o, &tr);
            did_transfer = rc == 0;
        }
#endif
        if (!cuda && !o.json)
            printf("transfer: skipped (the daemon runs the cpu backend)\n");
    }
    if (rc == 0) {
        if (o.json) {
            printf("{");
            if (o.cases & CASE_LOOKUP)
                json_lookup(&lr);
            if (did_transfer) {
                printf("%s", (o.cases & CASE_LOOKUP) ? "," : "");
                json_transfer(&tr);
            }
            printf("}\n");
        } else {
            if (o.cases & CASE_LOOKUP)
                print_lookup(&lr);
            if (did_transfer)
                print_transfer(&o, &tr);
        }
    }
    kvd_client_destroy(&cli);
    return rc;
}
