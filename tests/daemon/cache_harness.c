/* What the cache store's suites share: see cache_harness.h. */
#include "cache_harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const kvd__block_layout_t kvdt_small_layout = {1, 1, 4, 16, "u8"};

kvd_status_t kvdt_malloc_alloc(void *ctx, uint64_t bytes, void **ptr, void **handle, char *why,
                               size_t why_len)
{
    (void)ctx;
    *ptr = malloc(bytes ? bytes : 1);
    *handle = *ptr;
    if (*ptr == NULL) {
        snprintf(why, why_len, "malloc");
        return KVD_ENOMEM;
    }
    return KVD_OK;
}

void kvdt_malloc_free(void *ctx, void *handle)
{
    (void)ctx;
    free(handle);
}

const kvd__cache_mem_t kvdt_malloc_mem = {NULL, kvdt_malloc_alloc, kvdt_malloc_free, NULL, NULL};

void kvdt_key_of(uint8_t *k, uint32_t ch, uint32_t i)
{
    memset(k, 0, KVDT_KEY);
    memcpy(k, &ch, 4);
    memcpy(k + 4, &i, 4);
    k[8] = 0xc7;
}

uint32_t kvdt_save_chain(kvd__cache_store_t *c, uint32_t ch, uint32_t n, kvdt_fill_cb fill,
                         void *ctx, int ready_only)
{
    uint32_t i, parent = KVD_CBLOCK_NONE, stored = 0, held[512], nheld = 0;
    uint8_t k[KVDT_KEY];
    char why[200];

    ck_assert_uint_le(n, 512);
    for (i = 0; i < n; i++) {
        uint32_t id;

        kvdt_key_of(k, ch, i);
        id = kvd__cache_find(c, k, KVDT_KEY);
        if (id != KVD_CBLOCK_NONE) {
            if (ready_only && kvd__cache_block(c, id)->state != KVD_CBLOCK_READY)
                break;
            kvd__cache_hold(c, id); /* a present block of the chain stays while it saves */
            held[nheld++] = id;
        } else if (kvd__cache_reserve(c, parent, k, KVDT_KEY, &id, why, sizeof(why)) == KVD_OK) {
            fill(kvd__cache_block_bytes(c, id), ch, i, ctx);
            held[nheld++] = id;
            stored++;
        } else {
            break;
        }
        parent = id;
    }
    while (nheld-- > 0) { /* the last first */
        if (kvd__cache_block(c, held[nheld])->state == KVD_CBLOCK_FILLING)
            kvd__cache_commit(c, held[nheld]);
        else
            kvd__cache_unhold(c, held[nheld]);
    }
    return stored;
}

uint32_t kvdt_present(kvd__cache_store_t *c, uint32_t ch, uint32_t n, uint32_t *ids)
{
    uint8_t keys[512][KVDT_KEY];
    const uint8_t *kp[512];
    size_t lens[512];

    ck_assert_uint_le(n, 512);
    for (uint32_t i = 0; i < n; i++) {
        kvdt_key_of(keys[i], ch, i);
        kp[i] = keys[i];
        lens[i] = KVDT_KEY;
    }
    return kvd__cache_lookup(c, kp, lens, n, 0, ids);
}
