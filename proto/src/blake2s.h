/*
 * BLAKE2s-256 (RFC 7693), unkeyed and keyed, written here so that no part
 * needs a crypto dependency.  libkvdock chains block keys with it (Python's
 * hashlib.blake2s gives the same bytes); kvdockd's cluster proves its
 * secret with the keyed form.  Inputs stay under 4 GiB.
 */
#ifndef KVDOCK_BLAKE2S_H
#define KVDOCK_BLAKE2S_H

#include <stddef.h>
#include <stdint.h>

#define KVD_BLAKE2S_BYTES 32

typedef struct kvd__b2s {
    uint32_t h[8];
    uint32_t t; /* bytes compressed so far */
    uint8_t buf[64];
    size_t n;
} kvd__b2s_t;

/* Internal to each binary: libkvdock does not export them. */
#define KVD_B2S_INTERNAL __attribute__((visibility("hidden")))

/* key_len 0: unkeyed; else 1 to 32 bytes of key. */
KVD_B2S_INTERNAL void kvd__b2s_init(kvd__b2s_t *s, const void *key, size_t key_len);
KVD_B2S_INTERNAL void kvd__b2s_update(kvd__b2s_t *s, const void *p, size_t len);
KVD_B2S_INTERNAL void kvd__b2s_final(kvd__b2s_t *s, uint8_t out[KVD_BLAKE2S_BYTES]);

#endif
