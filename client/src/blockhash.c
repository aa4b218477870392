/*
 * Chained block keys (kvd_block_hashes): BLAKE2s-256 (proto/src/blake2s.h);
 * Python's hashlib has the same function, so kvdock.block_hashes agrees
 * byte for byte.
 *
 * Key i = BLAKE2s-256(key i-1 || tokens of block i as little-endian
 * int64), with key -1 = BLAKE2s-256(salt): every input starts with 32
 * bytes, so a salt can never pass for a block of tokens.
 */
#include "internal.h"

#include <string.h>

#include "blake2s.h"

kvd_status_t kvd_block_hashes(const int64_t *tokens, size_t num_tokens, uint32_t tokens_per_block,
                              const void *salt, size_t salt_len, uint8_t *out, size_t cap_keys,
                              size_t *count)
{
    uint8_t prev[KVD_BLOCK_HASH_BYTES];
    size_t n, i;
    kvd__b2s_t s;

    if (count == NULL || (num_tokens > 0 && tokens == NULL) || (salt_len > 0 && salt == NULL))
        return kvd__client_fail(NULL, KVD_ENULL, "kvd_block_hashes: count, tokens or salt is "
                                "NULL");
    if (tokens_per_block == 0)
        return kvd__client_fail(NULL, KVD_EINVAL, "kvd_block_hashes: tokens_per_block is 0");
    n = num_tokens / tokens_per_block;
    *count = n;
    if (n > cap_keys || (n > 0 && out == NULL))
        return kvd__client_fail(NULL, KVD_ERANGE, "kvd_block_hashes: %zu keys, room for %zu", n,
                                out == NULL ? 0 : cap_keys);
    kvd__b2s_init(&s, NULL, 0);
    kvd__b2s_update(&s, salt, salt_len);
    kvd__b2s_final(&s, prev);
    for (i = 0; i < n; i++) {
        kvd__b2s_init(&s, NULL, 0);
        kvd__b2s_update(&s, prev, sizeof(prev));
        /* little-endian int64 on every host this library builds for */
        kvd__b2s_update(&s, (const uint8_t *)(tokens + i * tokens_per_block),
                   (size_t)tokens_per_block * sizeof(int64_t));
        kvd__b2s_final(&s, out + i * KVD_BLOCK_HASH_BYTES);
        memcpy(prev, out + i * KVD_BLOCK_HASH_BYTES, sizeof(prev));
    }
    return KVD_OK;
}
