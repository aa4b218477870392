/*
 * What the cache tier's benchmarks share (bench_cache, bench_disk_load):
 * their error line, chains of 32-byte keys, a median, and a worker's
 * device KV cache imported as a pool.
 */
#ifndef KVB_BENCH_CACHE_UTIL_H
#define KVB_BENCH_CACHE_UTIL_H

#include <stdint.h>

#include "kvdock/client.h"

#define KVB_KEY 32 /* bytes of a key */

/* "PROG: what: STATUS: the client's last message" on stderr; 1. */
int kvb_fail(const char *prog, kvd_client_t *cli, kvd_status_t st, const char *what);

/* A 64-bit mix of z (splitmix64's finaliser). */
uint64_t kvb_mix(uint64_t z);
/* Chain c's first n keys into keys (n * KVB_KEY bytes), distinct for
 * every (c, i). */
void kvb_chain_keys(uint8_t *keys, uint64_t c, uint64_t n);
/* n keys of KVB_KEY bytes back to back, as a request takes them. */
kvd_cache_keys_t kvb_blob_keys(const uint8_t *keys, uint64_t n);

/* The median of v[0, n). */
double kvb_median(double *v, uint64_t n);

/* dev, device memory this process allocated (per layer, K then V, each
 * pages x tokens rows of token_bytes), imported without a copy as a pool
 * named name, paged by tokens; its info in *out. */
kvd_status_t kvb_import_device_kv(kvd_client_t *cli, const char *name, void *dev,
                                  uint32_t layers, uint64_t pages, uint32_t tokens,
                                  uint64_t token_bytes, kvd_pool_info_t *out);

#endif
