/* A map from 64-bit ids (never 0) to pointers: open addressing, linear
 * probing, tombstones; grows by doubling. */
#ifndef KVD_DAEMON_IDMAP_H
#define KVD_DAEMON_IDMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvd_idmap {
    uint64_t *keys; /* 0: empty, UINT64_MAX: tombstone */
    void **vals;
    size_t cap;     /* a power of two, or 0 */
    size_t used;    /* live + tombstones */
    size_t live;
} kvd_idmap_t;

void kvd_idmap_init(kvd_idmap_t *m);
void kvd_idmap_deinit(kvd_idmap_t *m);
/* 0, or -1 when out of memory (the map is unchanged). id must be new. */
int kvd_idmap_put(kvd_idmap_t *m, uint64_t id, void *val);
void *kvd_idmap_get(const kvd_idmap_t *m, uint64_t id);
void *kvd_idmap_del(kvd_idmap_t *m, uint64_t id);

#endif
