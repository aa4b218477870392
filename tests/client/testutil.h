/*
 * Shared helpers of the client suites: assertion macros on kvd_status_t
 * and pools mapped into the test process.
 */
#ifndef KVDOCK_TEST_CLIENT_TESTUTIL_H
#define KVDOCK_TEST_CLIENT_TESTUTIL_H

#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvt_skip.h"
#include "kvt_time.h"
#include "kvdock/client.h"
#include "kvdock/kernels.h"

/* The call must succeed. */
#define KVT_OK(cli, call)                                                                          \
    do {                                                                                           \
        kvd_status_t st_ = (call);                                                                 \
        ck_assert_msg(st_ == KVD_OK, "%s: %s: %s", #call, kvd_err_name(st_),                       \
                      kvd_client_last_error(cli));                                                 \
    } while (0)

/* The call must fail with exactly code, with a message. */
#define KVT_ERR(cli, call, code)                                                                   \
    do {                                                                                           \
        kvd_status_t st_ = (call);                                                                 \
        ck_assert_msg(st_ == (code), "%s: expected %s, got %s: %s", #call, kvd_err_name(code),     \
                      kvd_err_name(st_), kvd_client_last_error(cli));                              \
        ck_assert_msg(kvd_client_last_error(cli)[0] != '\0', "%s: %s without a message", #call,    \
                      kvd_err_name(st_));                                                          \
    } while (0)

/* A kvt_cli_result_t's exit status must be code; says what it printed. */
#define KVT_EXPECT_RC(r, code)                                                                     \
    ck_assert_msg((r).rc == (code), "exit %d, expected %d\nstdout:\n%s\nstderr:\n%s", (r).rc,      \
                  (code), (r).out, (r).err)

/* A daemon-owned pool, exported and mapped here. */
typedef struct kvt_pool {
    kvd_pool_info_t info;
    kvd_mapping_t *map;
} kvt_pool_t;

static inline void kvt_pool_make(kvd_client_t *cli, kvt_pool_t *p, const char *tag, uint32_t layers,
                                 uint64_t slots, uint64_t slot_bytes, bool mla, uint32_t page)
{
    char name[64];
    kvd_pool_spec_t spec;
    static int seq;

    snprintf(name, sizeof(name), "%s-%d-%d", tag, (int)getpid(), seq++);
    memset(&spec, 0, sizeof(spec));
    spec.name = name;
    spec.kind = KVD_MEM_HOST;
    spec.num_layers = layers;
    spec.num_slots = slots;
    spec.slot_bytes = slot_bytes;
    spec.mla = mla;
    spec.page_size = page;
    KVT_OK(cli, kvd_pool_create(cli, &spec, &p->info));
    ck_assert_str_eq(p->info.name, name);
    ck_assert_uint_eq(p->info.num_layers, layers);
    ck_assert_uint_eq(p->info.num_slots, slots);
    ck_assert_uint_eq(p->info.slot_bytes, slot_bytes);
    ck_assert_int_eq(p->info.mla, mla);
    ck_assert_int_eq(p->info.kind, KVD_MEM_HOST);
    ck_assert_uint_ge(p->info.slot_stride, slot_bytes);
    ck_assert_uint_ne(p->info.id, 0);
    KVT_OK(cli, kvd_pool_export(cli, p->info.id, NULL, 0, &p->map));
    ck_assert_ptr_nonnull(p->map);
    ck_assert_ptr_nonnull(p->map->base);
    ck_assert_uint_ge(p->map->bytes, p->info.bytes);
    ck_assert_uint_eq(p->map->pool.id, p->info.id);
    /* Every layer's K (and V) rows lie inside the mapping. */
    for (uint32_t l = 0; l < layers; l++) {
        uint64_t end = l * p->info.layer_stride + (mla ? 0 : p->info.v_offset) +
                       (slots - 1) * p->info.slot_stride + slot_bytes;

        ck_assert_uint_le(end, p->map->bytes);
    }
}

static inline void kvt_pool_free(kvd_client_t *cli, kvt_pool_t *p)
{
    kvd_mapping_destroy(&p->map);
    ck_assert_ptr_null(p->map);
    if (cli != NULL)
        KVT_OK(cli, kvd_pool_drop(cli, p->info.id, NULL));
}

/* Pages of a pool made with pages (page_size): where page pg's rows of
 * layer l (K, or V) start in the mapping. */
static inline uint8_t *kvt_page(const kvt_pool_t *p, uint32_t pg, uint32_t l, bool v)
{
    return (uint8_t *)p->map->base + (uint64_t)l * p->info.layer_stride +
           (v ? p->info.v_offset : 0) + (uint64_t)pg * p->info.page_size * p->info.slot_stride;
}

/* A cache block's bytes derived from its key (its first 8 bytes seed each
 * layer's K and V), so whoever saved it, anyone can check a load: page pg
 * is filled with them, or holds them. */
static inline uint64_t kvt_key_seed(const uint8_t *key)
{
    uint64_t s;

    memcpy(&s, key, 8);
    return s;
}

static inline void kvt_page_fill(const kvt_pool_t *p, uint32_t pg, const uint8_t *key)
{
    for (uint32_t l = 0; l < p->info.num_layers; l++)
        for (int v = 0; v < 2; v++)
            kvt_fill(kvt_page(p, pg, l, v), (size_t)p->info.page_size * p->info.slot_bytes,
                     kvt_key_seed(key) + 2 * l + (uint64_t)v);
}

static inline bool kvt_page_holds(const kvt_pool_t *p, uint32_t pg, const uint8_t *key)
{
    size_t n = (size_t)p->info.page_size * p->info.slot_bytes;
    uint8_t *want = malloc(n);
    bool ok = want != NULL;

    for (uint32_t l = 0; ok && l < p->info.num_layers; l++)
        for (int v = 0; ok && v < 2; v++) {
            kvt_fill(want, n, kvt_key_seed(key) + 2 * l + (uint64_t)v);
            ok = memcmp(kvt_page(p, pg, l, v), want, n) == 0;
        }
    free(want);
    return ok;
}

/* Layer l's K (v false) or V rows, in a copy laid out like the pool. */
static inline uint8_t *kvt_layer(const kvt_pool_t *p, uint8_t *base, uint32_t l, bool v)
{
    return base + (uint64_t)l * p->info.layer_stride + (v ? p->info.v_offset : 0);
}

/* A private copy of the pool's bytes. */
static inline uint8_t *kvt_snapshot(const kvt_pool_t *p)
{
    uint8_t *c = malloc(p->map->bytes);

    ck_assert_ptr_nonnull(c);
    memcpy(c, p->map->base, p->map->bytes);
    return c;
}

/* The mapping must equal expect, byte for byte; says where it differs. */
static inline void kvt_expect_bytes(const void *got, const void *expect, size_t n, const char *what)
{
    const uint8_t *g = got, *e = expect;
    size_t i = 0;

    if (memcmp(got, expect, n) == 0)
        return;
    while (g[i] == e[i])
        i++;
    ck_abort_msg("%s: byte %zu of %zu is 0x%02x, expected 0x%02x", what, i, n, g[i], e[i]);
}

/* Open descriptors of this process (to show none leaked). */
static inline int kvt_count_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;

    ck_assert_ptr_nonnull(d);
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own */
}

#endif /* KVDOCK_TEST_CLIENT_TESTUTIL_H */
