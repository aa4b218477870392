/* Id -> pointer map: see idmap.h. */
#include "idmap.h"

#include <stdlib.h>

#define TOMB UINT64_MAX

static size_t slot_of(uint64_t id, size_t cap)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdull;
    id ^= id >> 33;
    return (size_t)id & (cap - 1);
}

void kvd__idmap_init(kvd__idmap_t *m)
{
    m->keys = NULL;
    m->vals = NULL;
    m->cap = m->used = m->live = 0;
}

void kvd__idmap_deinit(kvd__idmap_t *m)
{
    free(m->keys);
    free(m->vals);
    kvd__idmap_init(m);
}

static int rehash(kvd__idmap_t *m, size_t cap)
{
    uint64_t *keys = calloc(cap, sizeof(*keys));
    void **vals = calloc(cap, sizeof(*vals));
    size_t i;

    if (keys == NULL || vals == NULL) {
        free(keys);
        free(vals);
        return -1;
    }
    for (i = 0; i < m->cap; i++) {
        size_t j;
        if (m->keys[i] == 0 || m->keys[i] == TOMB)
            continue;
        for (j = slot_of(m->keys[i], cap); keys[j] != 0; j = (j + 1) & (cap - 1))
            ;
        keys[j] = m->keys[i];
        vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    m->used = m->live;
    return 0;
}

int kvd__idmap_put(kvd__idmap_t *m, uint64_t id, void *val)
{
    size_t j;

    if (id == 0 || id == TOMB)
        return -1;
    if ((m->used + 1) * 4 >= m->cap * 3) {
        size_t cap = m->cap ? m->cap : 16;
        while ((m->live + 1) * 2 >= cap)
            cap *= 2;
        if (rehash(m, cap) != 0)
            return -1;
    }
    for (j = slot_of(id, m->cap);; j = (j + 1) & (m->cap - 1)) {
        if (m->keys[j] == 0 || m->keys[j] == TOMB) {
            if (m->keys[j] == 0)
                m->used++;
            m->keys[j] = id;
            m->vals[j] = val;
            m->live++;
            return 0;
        }
    }
}

static size_t find(const kvd__idmap_t *m, uint64_t id)
{
    size_t j;

    if (m->cap == 0 || id == 0 || id == TOMB)
        return SIZE_MAX;
    for (j = slot_of(id, m->cap); m->keys[j] != 0; j = (j + 1) & (m->cap - 1))
        if (m->keys[j] == id)
            return j;
    return SIZE_MAX;
}

void *kvd__idmap_get(const kvd__idmap_t *m, uint64_t id)
{
    size_t j = find(m, id);

    return j == SIZE_MAX ? NULL : m->vals[j];
}

void *kvd__idmap_del(kvd__idmap_t *m, uint64_t id)
{
    size_t j = find(m, id);
    void *v;

    if (j == SIZE_MAX)
        return NULL;
    v = m->vals[j];
    m->keys[j] = TOMB;
    m->vals[j] = NULL;
    m->live--;
    return v;
}
