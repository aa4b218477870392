/* A map from 64-bit ids (never 0) to pointers: open addressing, linear
 * probing, tombstones; grows by doubling. */
#ifndef KVD_DAEMON_IDMAP_H
#define KVD_DAEMON_IDMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvd__idmap {
    uint64_t *keys; /* 0: empty, UINT64_MAX: tombstone */
    void **vals;
    size_t cap;     /* a power of two, or 0 */
    size_t used;    /* live + tombstones */
    size_t live;
} kvd__idmap_t;

void kvd__idmap_init(kvd__idmap_t *m);
void kvd__idmap_deinit(kvd__idmap_t *m);
/* 0, or -1 when out of memory (the map is unchanged). id must be new. */
int kvd__idmap_put(kvd__idmap_t *m, uint64_t id, void *val);
void *kvd__idmap_get(const kvd__idmap_t *m, uint64_t id);
void *kvd__idmap_del(kvd__idmap_t *m, uint64_t id);

#endif
