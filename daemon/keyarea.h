/*
 * A connection's key area: memory the daemon makes and shares with one
 * client (a memfd sealed against shrinking and growing, so no client can
 * make a read of it fault), into which the client writes a chain of keys
 * and names it in CacheKeys.area instead of sending it in the frame.
 *
 * The area is the client's to change at any time: the daemon reads a
 * chain only while it handles the request that names it, checks the
 * reference against the area's size before touching it, and copies the
 * keys into the request's own memory before using them (or, for a
 * lookup, hands them to code that only hashes and compares each key's
 * bytes, whose answer is then all a change can alter), so a client that
 * writes concurrently changes only its own answer.  Loop thread only.
 */
#ifndef KVD_DAEMON_KEYAREA_H
#define KVD_DAEMON_KEYAREA_H

#include <stddef.h>
#include <stdint.h>

#include "dispatch.h"

/* An area's bounds (bytes; rounded up to whole pages) and what 0 asks for. */
#define KVD_KEY_AREA_MIN (4u << 10)
#define KVD_KEY_AREA_MAX (4u << 20)
#define KVD_KEY_AREA_DEFAULT (1u << 20)
/* Key areas of all connections together take at most 1/SHARE of the
 * socket memory (--max-socket-buffer-bytes), and one area at most half of
 * what its client may still hold (--max-client-memory): an area is sized
 * down to fit both, and refused (ELIMIT) when not KVD_KEY_AREA_MIN fits,
 * so areas never starve the receive buffers and write queues, nor the
 * client's own requests. */
#define KVD_KEY_AREA_SHARE 4

/* The chain ck names in r's connection's area, checked and copied into r's
 * memory: *blob (count keys of ck->key_size bytes, back to back) and
 * *count.  KVD_EINVAL naming what is wrong (no area, a width outside 1 to
 * 64, a count of 0, a range past the area's end; r's message set). */
kvd_status_t kvd__key_area_read(kvd__req_t *r, const Kvdock__CacheKeys *ck,
                                const uint8_t **blob, size_t *count);

/* The chain ck names in r's connection's area, checked as by
 * kvd__key_area_read but not copied: *keys points into the area, which
 * the client may change while it is read, so it is for readers whose
 * every outcome is safe with any bytes (kvd__cache_lookup_blob's). */
kvd_status_t kvd__key_area_view(kvd__req_t *r, const Kvdock__CacheKeys *ck,
                                const uint8_t **keys, size_t *count);

/* The first key of the chain ck names in c's area, copied into key (64
 * bytes), and the chain's count: 1 when the reference is good (what
 * kvd__key_area_read would take), else 0 (and nothing read). */
int kvd__key_area_first(const kvd__conn_t *c, const Kvdock__CacheKeys *ck, uint8_t *key,
                        size_t *count);

/* Unmap c's area, close its memfd and give back its charge. */
void kvd__key_area_drop(kvd__conn_t *c);

#endif
