/*
 * What the cache store's own suites share (check_cache, check_cache_disk):
 * slabs from malloc, a small block layout, chained keys, and a save and a
 * lookup of a chain done with the store's calls as the daemon does them.
 */
#ifndef KVDT_CACHE_HARNESS_H
#define KVDT_CACHE_HARNESS_H

#include <stdint.h>

#include "cache.h"

/* The suites' layout: 1 layer, MLA, 4 tokens of 16 bytes. */
#define KVDT_BLOCK 64u
extern const kvd__block_layout_t kvdt_small_layout;

/* Slabs from malloc, none allocated ahead; the calls, for a kvd__cache_mem_t
 * of a suite's own. */
extern const kvd__cache_mem_t kvdt_malloc_mem;
kvd_status_t kvdt_malloc_alloc(void *ctx, uint64_t bytes, void **ptr, void **handle, char *why,
                               size_t why_len);
void kvdt_malloc_free(void *ctx, void *handle);

/* Key i of chain ch: 12 bytes. */
#define KVDT_KEY 12
void kvdt_key_of(uint8_t *k, uint32_t ch, uint32_t i);

/* Fills the KVDT_BLOCK bytes of block i of chain ch. */
typedef void (*kvdt_fill_cb)(uint8_t *bytes, uint32_t ch, uint32_t i, void *ctx);

/* Save chain ch's keys [0, n) as a save does: each present block held, each
 * missing one reserved and filled, until a reservation fails (or, with
 * ready_only, a present block is not ready yet); then, the last first,
 * the new ones committed and the others let go.  The blocks stored. */
uint32_t kvdt_save_chain(kvd__cache_store_t *c, uint32_t ch, uint32_t n, kvdt_fill_cb fill,
                         void *ctx, int ready_only);

/* How many leading keys of chain ch [0, n) the store reports; their ids
 * in ids when not NULL. */
uint32_t kvdt_present(kvd__cache_store_t *c, uint32_t ch, uint32_t n, uint32_t *ids);

#endif
