/*
 * bench_cluster: two kvdockd daemons of one cluster (tests/bench/
 * bench_cluster.sh starts them and ucx_perftest beside them).
 *
 *   load     --blocks (1,024) blocks of --block-kib (1,024) KiB saved on
 *            daemon A, loaded through daemon B into a pool there (--pool
 *            host, or device on cuda daemons: a worker's KV cache): B
 *            pulls them from A into its tier, then copies them into the
 *            pool.  GB/s of the whole load, the median of --iterations
 *            (B's tier emptied before each); and the same load once the
 *            blocks are in B's tier (the local copy alone).
 *   lookup   a 1,000-key chain held on A: the lookup's latency on B (it
 *            misses locally and asks A) against the same lookup on A (all
 *            local), p50 / p99 over --lookups, and B's ping round trip to A.
 *
 * Usage: bench_cluster --socket-a PATH --socket-b PATH [--blocks N]
 *        [--block-kib N] [--iterations N] [--lookups N] [--pool host|device]
 *        [--json]
 * Memory: A holds --blocks blocks in its tier and 64 in a pool; B as many
 * in its tier and in a pool (3 GiB in all at the defaults).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kvdock/client.h"
#include "util.h"

#define KEY 32
#define LAYERS 32
#define TPB 16
#define STAGE 64 /* pages of A's pool, saved again and again under new keys */
#define CHAIN 1000

typedef struct opts {
    const char *sock_a, *sock_b;
    uint32_t blocks, block_kib, iterations, lookups;
    kvd_mem_kind_t pool_kind;
    bool json;
} opts_t;

static int fail(kvd_client_t *cli, kvd_status_t st, const char *what)
{
    fprintf(stderr, "bench_cluster: %s: %s: %s\n", what, kvd_err_name(st),
            cli ? kvd_client_last_error(cli) : "");
    return 1;
}

/* n distinct 32-byte keys */
static void make_keys(uint8_t *keys, uint32_t n, uint64_t seed)
{
    for (uint32_t i = 0; i < n; i++) {
        uint64_t z = seed * 0x9E3779B97F4A7C15ull + i;
        for (uint32_t w = 0; w < KEY / 8; w++) {
            z ^= z >> 31;
            z *= 0xBF58476D1CE4E5B9ull;
            memcpy(keys + (size_t)i * KEY + 8 * w, &z, 8);
        }
        memcpy(keys + (size_t)i * KEY, &i, sizeof(i));
    }
}

static kvd_cache_keys_t blob(const uint8_t *keys, uint32_t n)
{
    kvd_cache_keys_t k;

    memset(&k, 0, sizeof(k));
    k.blob = keys;
    k.key_size = KEY;
    k.count = n;
    return k;
}

static kvd_status_t make_cache(kvd_client_t *cli, uint64_t token_bytes, uint64_t budget,
                               uint64_t *id)
{
    kvd_cache_spec_t s;
    kvd_cache_info_t info;
    kvd_status_t st;

    memset(&s, 0, sizeof(s));
    s.name = "bench-cluster";
    s.layout.num_layers = LAYERS;
    s.layout.tokens_per_block = TPB;
    s.layout.token_bytes = token_bytes;
    snprintf(s.layout.dtype, sizeof(s.layout.dtype), "bf16");
    s.budget_bytes = budget;
    s.cluster = true;
    if ((st = kvd_cache_create(cli, &s, &info)) == KVD_OK)
        *id = info.id;
    return st;
}

static kvd_status_t make_pool(kvd_client_t *cli, const char *name, kvd_mem_kind_t kind,
                              uint64_t token_bytes, uint32_t pages, uint64_t *id)
{
    kvd_pool_spec_t spec;
    kvd_pool_info_t info;
    kvd_status_t st;

    memset(&spec, 0, sizeof(spec));
    spec.name = name;
    spec.kind = kind;
    spec.num_layers = LAYERS;
    spec.num_slots = (uint64_t)pages * TPB;
    spec.slot_bytes = token_bytes;
    spec.page_size = TPB;
    if ((st = kvd_pool_create(cli, &spec, &info)) == KVD_OK)
        *id = info.id;
    return st;
}

static kvd_status_t load_all(kvd_client_t *cli, uint64_t cache, uint64_t pool,
                             const uint8_t *keys, uint32_t n, const int64_t *pages)
{
    kvd_cache_load_t a;

    memset(&a, 0, sizeof(a));
    a.cache = cache;
    a.pool = pool;
    a.keys = blob(keys, n);
    a.blocks.values = pages;
    a.blocks.count = n;
    return kvd_cache_load(cli, &a, NULL, NULL);
}

static double median(double *v, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int usage(const char *msg)
{
    fprintf(stderr, "bench_cluster: %s\nusage: bench_cluster --socket-a PATH --socket-b PATH "
            "[--blocks N] [--block-kib N] [--iterations N] [--lookups N] [--pool host|device] "
            "[--json]\n", msg);
    return 2;
}

int main(int argc, char **argv)
{
    opts_t o = {NULL, NULL, 1024, 1024, 5, 2000, KVD_MEM_HOST, false};
    kvd_client_t *a = NULL, *b = NULL;
    uint64_t token_bytes, block_bytes, cache_a = 0, cache_b = 0, pool_a = 0, pool_b = 0;
    uint8_t *keys;
    int64_t *pages;
    double *t, pull_gbps, local_gbps, *la, *lb;
    kvd__bench_lat_t lat_a, lat_b;
    kvd_daemon_status_t *s;
    kvd_status_t st;
    uint64_t rtt_us = 0;

    for (int i = 1; i < argc; i++) {
        const char *x = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(x, "--json") == 0) {
            o.json = true;
            continue;
        }
        if (v == NULL)
            return usage("an option lacks its value");
        i++;
        if (strcmp(x, "--socket-a") == 0)
            o.sock_a = v;
        else if (strcmp(x, "--socket-b") == 0)
            o.sock_b = v;
        else if (strcmp(x, "--blocks") == 0)
            o.blocks = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(x, "--block-kib") == 0)
            o.block_kib = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(x, "--iterations") == 0)
            o.iterations = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(x, "--lookups") == 0)
            o.lookups = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(x, "--pool") == 0 && (strcmp(v, "host") == 0 || strcmp(v, "device") == 0))
            o.pool_kind = strcmp(v, "device") == 0 ? KVD_MEM_DEVICE : KVD_MEM_HOST;
        else
            return usage("unknown option");
    }
    if (o.sock_a == NULL || o.sock_b == NULL || o.blocks < CHAIN || o.iterations < 1 ||
        o.lookups < 10 || o.block_kib < 1 || (o.block_kib * 1024u) % (LAYERS * 2 * TPB) != 0)
        return usage("give both sockets; --blocks >= 1000; --block-kib a multiple of 1 "
                     "(32 layers x K, V x 16 tokens)");
    block_bytes = (uint64_t)o.block_kib * 1024;
    token_bytes = block_bytes / (LAYERS * 2 * TPB);
    if ((st = kvd_client_create(o.sock_a, "bench-cluster-a", &a)) != KVD_OK)
        return fail(NULL, st, o.sock_a);
    if ((st = kvd_client_create(o.sock_b, "bench-cluster-b", &b)) != KVD_OK)
        return fail(NULL, st, o.sock_b);
    kvd_client_set_timeout(a, 120000);
    kvd_client_set_timeout(b, 120000);
    keys = malloc((size_t)o.blocks * KEY);
    pages = malloc(o.blocks * sizeof(*pages));
    t = malloc(o.iterations * sizeof(*t));
    la = malloc(o.lookups * sizeof(*la));
    lb = malloc(o.lookups * sizeof(*lb));
    s = malloc(sizeof(*s));
    if (!keys || !pages || !t || !la || !lb || !s)
        return fail(NULL, KVD_ENOMEM, "memory");
    make_keys(keys, o.blocks, 1);
    if ((st = make_cache(a, token_bytes, (uint64_t)o.blocks * block_bytes, &cache_a)) != KVD_OK ||
        (st = make_cache(b, token_bytes, (uint64_t)o.blocks * block_bytes, &cache_b)) != KVD_OK)
        return fail(NULL, st, "cache create");
    if ((st = make_pool(a, "bench-cluster-stage", o.pool_kind, token_bytes, STAGE, &pool_a)) != KVD_OK)
        return fail(a, st, "pool on A");
    if ((st = make_pool(b, "bench-cluster-dst", o.pool_kind, token_bytes, o.blocks, &pool_b)) != KVD_OK)
        return fail(b, st, "pool on B");
    /* A's tier: the blocks, one chain, saved STAGE at a time from the same pages */
    for (uint32_t at = 0; at < o.blocks; at += STAGE) {
        uint32_t n = o.blocks - at < STAGE ? o.blocks - at : STAGE;
        kvd_cache_save_t sv;
        kvd_op_result_t r;
        memset(&sv, 0, sizeof(sv));
        for (uint32_t i = 0; i < n; i++)
            pages[i] = i;
        sv.cache = cache_a;
        sv.pool = pool_a;
        sv.keys = blob(keys + (size_t)at * KEY, n);
        sv.blocks.values = pages;
        sv.blocks.count = n;
        if (at > 0) {
            sv.parent = keys + (size_t)(at - 1) * KEY;
            sv.parent_len = KEY;
        }
        if ((st = kvd_cache_save(a, &sv, NULL, &r)) != KVD_OK || r.stored != n)
            return fail(a, st ? st : KVD_EPROTO, "save on A");
    }
    for (uint32_t i = 0; i < o.blocks; i++)
        pages[i] = i;

    /* the load through B: pulled from A, then copied into B's pool */
    for (uint32_t it = 0; it <= o.iterations; it++) { /* the first warms */
        kvd_cache_evict_result_t ev;
        kvd_cache_keys_t head = blob(keys, 1);
        double t0;
        /* the chain goes from B's tier (its head takes the rest along);
         * the slabs stay, as in a tier that has run for a while */
        if (it > 0 && ((st = kvd_cache_evict(b, cache_b, &head, false, &ev)) != KVD_OK ||
                       ev.evicted != o.blocks))
            return fail(b, st ? st : KVD_EPROTO, "evict on B");
        t0 = kvd__cli_now_us();
        if ((st = load_all(b, cache_b, pool_b, keys, o.blocks, pages)) != KVD_OK)
            return fail(b, st, "load through B");
        if (it > 0)
            t[it - 1] = kvd__cli_now_us() - t0;
    }
    pull_gbps = (double)o.blocks * block_bytes / median(t, o.iterations) / 1e3;
    for (uint32_t it = 0; it < o.iterations; it++) { /* now local */
        double t0 = kvd__cli_now_us();
        if ((st = load_all(b, cache_b, pool_b, keys, o.blocks, pages)) != KVD_OK)
            return fail(b, st, "local load on B");
        t[it] = kvd__cli_now_us() - t0;
    }
    local_gbps = (double)o.blocks * block_bytes / median(t, o.iterations) / 1e3;

    /* lookups of a 1,000-key chain: on A (local), on B (asks A) */
    {
        kvd_cache_evict_result_t ev;
        kvd_cache_keys_t k = blob(keys, CHAIN), head = blob(keys, 1);
        if ((st = kvd_cache_evict(b, cache_b, &head, false, &ev)) != KVD_OK)
            return fail(b, st, "evict on B");
        /* one daemon at a time: on a small machine, the other one's
         * polling after each answer would weigh on the figure */
        for (int side = 0; side < 2; side++) {
            kvd_client_t *cli = side ? b : a;
            double *v = side ? lb : la;
            for (uint32_t i = 0; i < o.lookups + o.lookups / 10; i++) {
                kvd_cache_lookup_result_t r;
                double t0 = kvd__cli_now_us();
                if ((st = kvd_cache_lookup(cli, side ? cache_b : cache_a, &k, false, 0, &r)) !=
                        KVD_OK ||
                    r.hits != CHAIN || r.local_hits != (side ? 0u : CHAIN))
                    return fail(cli, st ? st : KVD_EPROTO, side ? "lookup on B" : "lookup on A");
                if (i >= o.lookups / 10)
                    v[i - o.lookups / 10] = kvd__cli_now_us() - t0;
            }
        }
        kvd__bench_lat(&lat_a, la, o.lookups);
        kvd__bench_lat(&lat_b, lb, o.lookups);
    }
    if ((st = kvd_daemon_status(b, s, NULL, 0)) == KVD_OK && s->cluster.num_peers > 0)
        rtt_us = s->cluster.peers[0].rtt_us;
    if (o.json) {
        printf("{\"blocks\":%u,\"block_bytes\":%" PRIu64 ",\"pool\":\"%s\",\"load_gbps\":%.3f,"
               "\"local_load_gbps\":%.3f,\"lookup_local_p50_us\":%.1f,\"lookup_local_p99_us\":"
               "%.1f,\"lookup_remote_p50_us\":%.1f,\"lookup_remote_p99_us\":%.1f,"
               "\"rtt_us\":%" PRIu64 "}\n",
               o.blocks, block_bytes, o.pool_kind == KVD_MEM_DEVICE ? "device" : "host",
               pull_gbps, local_gbps, lat_a.p50, lat_a.p99, lat_b.p50,
               lat_b.p99, rtt_us);
    } else {
        printf("load of %u blocks of %u KiB through B into a %s pool, pulled from A: %.2f "
               "GB/s (median of %u); the same load from B's own tier: %.2f GB/s\n",
               o.blocks, o.block_kib, o.pool_kind == KVD_MEM_DEVICE ? "device" : "host",
               pull_gbps, o.iterations, local_gbps);
        printf("lookup of a %d-key chain: on A (local) p50 %.1f us p99 %.1f; on B (asks A) "
               "p50 %.1f us p99 %.1f; B's ping to A %" PRIu64 " us\n",
               CHAIN, lat_a.p50, lat_a.p99, lat_b.p50, lat_b.p99, rtt_us);
    }
    kvd_cache_drop(a, cache_a, NULL);
    kvd_cache_drop(b, cache_b, NULL);
    kvd_client_destroy(&a);
    kvd_client_destroy(&b);
    free(keys);
    free(pages);
    free(t);
    free(la);
    free(lb);
    free(s);
    return 0;
}
