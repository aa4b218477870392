/* What the cache tier's benchmarks share: see bench_cache_util.h. */
#include "bench_cache_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "util.h"

int kvb_fail(const char *prog, kvd_client_t *cli, kvd_status_t st, const char *what)
{
    const char *msg = kvd_client_last_error(cli);

    fprintf(stderr, "%s: %s: %s: %s\n", prog, what, kvd_err_name(st),
            msg[0] != '\0' ? msg : kvd_strerror(st));
    return 1;
}

uint64_t kvb_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void kvb_chain_keys(uint8_t *keys, uint64_t c, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        for (int w = 0; w < KVB_KEY / 8; w++) {
            uint64_t v = kvb_mix(c * 0x9E3779B97F4A7C15ull + i * 4 + (uint64_t)w + 1);
            memcpy(keys + i * KVB_KEY + 8 * w, &v, 8);
        }
}

kvd_cache_keys_t kvb_blob_keys(const uint8_t *keys, uint64_t n)
{
    kvd_cache_keys_t k;

    memset(&k, 0, sizeof(k));
    k.blob = keys;
    k.key_size = KVB_KEY;
    k.count = (uint32_t)n;
    return k;
}

double kvb_median(double *v, uint64_t n)
{
    kvd__bench_lat_t l;

    kvd__bench_lat(&l, v, n);
    return l.p50;
}

kvd_status_t kvb_import_device_kv(kvd_client_t *cli, const char *name, void *dev,
                                  uint32_t layers, uint64_t pages, uint32_t tokens,
                                  uint64_t token_bytes, kvd_pool_info_t *out)
{
    const uint64_t layer_bytes = pages * tokens * token_bytes; /* K (or V) of one layer */
    kvd_memref_t *kref = calloc(layers, sizeof(*kref)), *vref = calloc(layers, sizeof(*vref));
    kvd_import_region_t region;
    kvd_pool_import_t imp;
    uint64_t off = 0;
    kvd_status_t st;

    if (kref == NULL || vref == NULL) {
        free(kref);
        free(vref);
        return KVD_ENOMEM;
    }
    st = kvd_import_region_from_device_ptr(dev, &region, &off);
    for (uint32_t l = 0; st == KVD_OK && l < layers; l++) {
        kref[l].offset = off + 2 * l * layer_bytes;
        vref[l].offset = off + (2 * l + 1) * layer_bytes;
    }
    if (st == KVD_OK) {
        memset(&imp, 0, sizeof(imp));
        imp.name = name;
        imp.num_layers = layers;
        imp.num_slots = pages * tokens;
        imp.slot_bytes = token_bytes;
        imp.page_size = tokens;
        imp.regions = &region;
        imp.num_regions = 1;
        imp.k_layers = kref;
        imp.v_layers = vref;
        st = kvd_pool_import(cli, &imp, out);
    }
    free(kref);
    free(vref);
    return st;
}
