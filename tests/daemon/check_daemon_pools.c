/*
 * check_daemon_pools: pools, buffers and events through the real kvdockd
 * (cpu backend): create, export by descriptor, import a client's memfd,
 * drop, list, ownership between clients, limits, release when a client
 * goes, and an exact status code for each invalid request (the connection
 * stays usable after each).
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

static kvdt_daemon_t D;

static void setup(void)
{
    const char *extra[] = {"--max-pools", "4", "--max-pool-bytes", "1M", "--max-buffers", "3",
                           NULL};
    kvdt_start(&D, extra);
}

static void teardown(void)
{
    ck_assert_int_eq(kvdt_stop(&D), 0);
}

static void assert_usable(int fd)
{
    Kvdock__Request req;
    Kvdock__Ping p = KVDOCK__PING__INIT;

    kvdt_req_init(&req, 999);
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &p;
    ck_assert_int_eq(kvdt_status_of(fd, &req), 0);
}

static Kvdock__Response *create(int fd, Kvdock__PoolCreate *pc)
{
    Kvdock__Request req;

    kvdt_req_init(&req, 30);
    req.op_case = KVDOCK__REQUEST__OP_POOL_CREATE;
    req.pool_create = pc;
    return kvdt_call(fd, &req);
}

static int create_status(int fd, Kvdock__PoolCreate *pc)
{
    Kvdock__Response *r = create(fd, pc);
    int st = (int)r->status;

    kvdock__response__free_unpacked(r, NULL);
    return st;
}

static int drop_status(int fd, uint64_t pool, const char *name)
{
    Kvdock__Request req;
    Kvdock__PoolDrop pd = KVDOCK__POOL_DROP__INIT;

    kvdt_req_init(&req, 31);
    pd.pool = pool;
    pd.name = (char *)(name ? name : "");
    req.op_case = KVDOCK__REQUEST__OP_POOL_DROP;
    req.pool_drop = &pd;
    return kvdt_status_of(fd, &req);
}

static int export_status(int fd, uint64_t pool)
{
    Kvdock__Request req;
    Kvdock__PoolExport pe = KVDOCK__POOL_EXPORT__INIT;
    Kvdock__Response *r;
    int fds[4], nfds = 0, st, i;

    kvdt_req_init(&req, 32);
    pe.pool = pool;
    req.op_case = KVDOCK__REQUEST__OP_POOL_EXPORT;
    req.pool_export = &pe;
    r = kvdt_call_fds(fd, &req, NULL, 0, fds, &nfds);
    st = (int)r->status;
    if (st != 0)
        ck_assert_int_eq(nfds, 0); /* no descriptor with an error */
    for (i = 0; i < nfds; i++)
        close(fds[i]);
    kvdock__response__free_unpacked(r, NULL);
    return st;
}

START_TEST(test_create_info)
{
    int fd = kvdt_client(&D, "pools");
    Kvdock__PoolCreate pc = KVDOCK__POOL_CREATE__INIT;
    Kvdock__Response *r;

    pc.name = "kv.main-0";
    pc.kind = KVDOCK__MEM_KIND__MEM_HOST;
    pc.num_layers = 2;
    pc.num_slots = 16;
    pc.slot_bytes = 100;
    pc.page_size = 4;
    r = create(fd, &pc);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_int_eq(r->result_case, KVDOCK__RESPONSE__RESULT_POOL);
    ck_assert_uint_gt(r->pool->id, 0);
    ck_assert_str_eq(r->pool->name, "kv.main-0");
    ck_assert_uint_eq(r->pool->num_layers, 2);
    ck_assert_uint_eq(r->pool->num_slots, 16);
    ck_assert_uint_eq(r->pool->slot_bytes, 100);
    ck_assert_uint_eq(r->pool->slot_stride, 100);
    ck_assert_uint_eq(r->pool->page_size, 4);
    ck_assert_int_eq(r->pool->mla, 0);
    ck_assert_int_eq(r->pool->imported, 0);
    /* [layer][K, V][slot], each region aligned to 256 bytes */
    ck_assert_uint_eq(r->pool->v_offset, 1792);
    ck_assert_uint_eq(r->pool->layer_stride, 3584);
    ck_assert_uint_eq(r->pool->bytes, 7168);
    kvdock__response__free_unpacked(r, NULL);

    pc.name = "latent";
    pc.mla = 1;
    r = create(fd, &pc);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_uint_eq(r->pool->v_offset, 0);
    ck_assert_uint_eq(r->pool->layer_stride, 1792);
    ck_assert_uint_eq(r->pool->bytes, 3584);
    kvdock__response__free_unpacked(r, NULL);
    close(fd);
}
END_TEST

/* Each invalid PoolCreate and its status. */
static const struct {
    const char *name;
    int kind;
    uint32_t layers;
    uint64_t slots, slot_bytes;
    uint32_t page_size;
    int want;
} bad_creates[] = {
    {"", KVDOCK__MEM_KIND__MEM_HOST, 1, 1, 1, 0, KVD_EINVAL},
    {"has space", KVDOCK__MEM_KIND__MEM_HOST, 1, 1, 1, 0, KVD_EINVAL},
    {"slash/name", KVDOCK__MEM_KIND__MEM_HOST, 1, 1, 1, 0, KVD_EINVAL},
    {"a123456789012345678901234567890123456789012345678901234567890123", KVDOCK__MEM_KIND__MEM_HOST,
     1, 1, 1, 0, KVD_EINVAL},
    {"p", KVDOCK__MEM_KIND__MEM_UNSPECIFIED, 1, 1, 1, 0, KVD_EINVAL},
    {"p", 42, 1, 1, 1, 0, KVD_EINVAL},
    {"p", KVDOCK__MEM_KIND__MEM_DEVICE, 1, 1, 1, 0, KVD_ENOTSUP},
    {"p", KVDOCK__MEM_KIND__MEM_DEVICE_VMM, 1, 1, 1, 0, KVD_ENOTSUP},
    {"p", KVDOCK__MEM_KIND__MEM_HOST, 0, 1, 1, 0, KVD_EINVAL},
    {"p", KVDOCK__MEM_KIND__MEM_HOST, 1, 0, 1, 0, KVD_EINVAL},
    {"p", KVDOCK__MEM_KIND__MEM_HOST, 1, 1, 0, 0, KVD_EINVAL},
    {"p", KVDOCK__MEM_KIND__MEM_HOST, 1, 16, 1, 3, KVD_ESHAPE},
    {"p", KVDOCK__MEM_KIND__MEM_HOST, 1, 1ull << 40, 1ull << 40, 0, KVD_EOVERFLOW},
    {"p", KVDOCK__MEM_KIND__MEM_HOST, 10000, 1ull << 30, 1ull << 20, 0, KVD_EOVERFLOW},
    {"p", KVDOCK__MEM_KIND__MEM_HOST, 1, 1024, 1024, 0, KVD_ELIMIT}, /* 2 MiB > 1M */
    {"dup", KVDOCK__MEM_KIND__MEM_HOST, 1, 1, 1, 0, KVD_EEXIST},
};

START_TEST(test_create_errors)
{
    int fd = kvdt_client(&D, "bad");
    Kvdock__PoolCreate pc = KVDOCK__POOL_CREATE__INIT;

    ck_assert_uint_gt(kvdt_pool_create(fd, "dup", 1, 1, 1, 0), 0);
    pc.name = (char *)bad_creates[_i].name;
    pc.kind = bad_creates[_i].kind;
    pc.num_layers = bad_creates[_i].layers;
    pc.num_slots = bad_creates[_i].slots;
    pc.slot_bytes = bad_creates[_i].slot_bytes;
    pc.page_size = bad_creates[_i].page_size;
    ck_assert_int_eq(create_status(fd, &pc), bad_creates[_i].want);
    assert_usable(fd);
    close(fd);
}
END_TEST

START_TEST(test_limits)
{
    int fd = kvdt_client(&D, "limits");
    Kvdock__PoolCreate pc = KVDOCK__POOL_CREATE__INIT;
    uint64_t ids[4];
    int i;

    for (i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof(name), "p%d", i);
        ids[i] = kvdt_pool_create(fd, name, 1, 16, 16, 0);
        ck_assert_uint_gt(ids[i], 0);
    }
    pc.name = "p4";
    pc.kind = KVDOCK__MEM_KIND__MEM_HOST;
    pc.num_layers = pc.num_slots = pc.slot_bytes = 1;
    ck_assert_int_eq(create_status(fd, &pc), KVD_ELIMIT); /* max-pools 4 */
    ck_assert_int_eq(drop_status(fd, ids[0], NULL), 0);
    ck_assert_int_eq(create_status(fd, &pc), 0);
    /* bytes: 1M per client */
    ck_assert_int_eq(drop_status(fd, ids[1], NULL), 0);
    pc.name = "big";
    pc.num_slots = 1024;
    pc.slot_bytes = 256; /* 512 KiB with K and V */
    ck_assert_int_eq(create_status(fd, &pc), 0);
    ck_assert_int_eq(drop_status(fd, ids[2], NULL), 0);
    pc.name = "big2";
    ck_assert_int_eq(create_status(fd, &pc), KVD_ELIMIT); /* 1 MiB + a little */
    assert_usable(fd);
    close(fd);
}
END_TEST

START_TEST(test_export_map)
{
    int fd = kvdt_client(&D, "export");
    uint64_t id = kvdt_pool_create(fd, "mapped", 2, 8, 32, 0);
    Kvdock__PoolInfo *info;
    size_t len, len2;
    uint8_t *m1, *m2;
    size_t i;

    m1 = kvdt_pool_map(fd, id, &info, &len);
    ck_assert_uint_eq(info->id, id);
    ck_assert_uint_ge(len, info->bytes);
    for (i = 0; i < info->bytes; i++)
        m1[i] = (uint8_t)(i * 13 + 1);
    /* a second export is the same memory */
    m2 = kvdt_pool_map(fd, id, NULL, &len2);
    ck_assert_uint_eq(len, len2);
    ck_assert_mem_eq(m1, m2, info->bytes);
    munmap(m1, len);
    munmap(m2, len2);
    kvdock__pool_info__free_unpacked(info, NULL);
    /* by name */
    {
        Kvdock__Request req;
        Kvdock__PoolExport pe = KVDOCK__POOL_EXPORT__INIT;
        Kvdock__Response *r;
        int fds[4], nfds;

        kvdt_req_init(&req, 40);
        pe.name = "mapped";
        req.op_case = KVDOCK__REQUEST__OP_POOL_EXPORT;
        req.pool_export = &pe;
        r = kvdt_call_fds(fd, &req, NULL, 0, fds, &nfds);
        ck_assert_uint_eq(r->status, 0);
        ck_assert_uint_eq(r->pool_export->pool->id, id);
        ck_assert_int_eq(nfds, 1);
        /* the descriptor is sealed: nobody can shrink it under the daemon */
        ck_assert_int_ne(ftruncate(fds[0], 0), 0);
        close(fds[0]);
        kvdock__response__free_unpacked(r, NULL);
        pe.name = "nope";
        ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_ENOENT);
        pe.name = "";
        ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_EINVAL);
    }
    ck_assert_int_eq(export_status(fd, 987654), KVD_ENOENT);
    assert_usable(fd);
    close(fd);
}
END_TEST

START_TEST(test_drop_and_list)
{
    int fd = kvdt_client(&D, "list");
    uint64_t a = kvdt_pool_create(fd, "a", 1, 4, 4, 0);
    uint64_t b = kvdt_pool_create(fd, "b", 1, 4, 4, 1);
    Kvdock__Request req;
    Kvdock__PoolList pl = KVDOCK__POOL_LIST__INIT;
    Kvdock__Response *r;

    kvdt_req_init(&req, 50);
    req.op_case = KVDOCK__REQUEST__OP_POOL_LIST;
    req.pool_list = &pl;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_uint_eq(r->pools->n_pools, 2);
    kvdock__response__free_unpacked(r, NULL);

    ck_assert_int_eq(drop_status(fd, a, NULL), 0);
    ck_assert_int_eq(drop_status(fd, a, NULL), KVD_ENOENT);
    ck_assert_int_eq(export_status(fd, a), KVD_ENOENT);
    ck_assert_int_eq(drop_status(fd, 0, "b"), 0);
    ck_assert_int_eq(drop_status(fd, b, NULL), KVD_ENOENT);
    ck_assert_int_eq(drop_status(fd, 0, NULL), KVD_EINVAL);
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(r->pools->n_pools, 0);
    kvdock__response__free_unpacked(r, NULL);
    /* a dropped name can be used again */
    ck_assert_uint_gt(kvdt_pool_create(fd, "a", 1, 4, 4, 0), a);
    close(fd);
}
END_TEST

START_TEST(test_ownership)
{
    int a = kvdt_client(&D, "owner"), b = kvdt_client(&D, "other");
    Kvdock__PoolCreate pc = KVDOCK__POOL_CREATE__INIT;
    Kvdock__Response *r;
    uint64_t priv, shared;
    uint8_t *m;
    size_t len;

    priv = kvdt_pool_create(a, "private", 1, 4, 8, 0);
    pc.name = "shared";
    pc.kind = KVDOCK__MEM_KIND__MEM_HOST;
    pc.num_layers = 1;
    pc.num_slots = 4;
    pc.slot_bytes = 8;
    pc.shared = 1;
    r = create(a, &pc);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_int_eq(r->pool->shared, 1);
    shared = r->pool->id;
    kvdock__response__free_unpacked(r, NULL);

    m = kvdt_pool_map(a, priv, NULL, &len);
    memset(m, 0x77, 64);
    /* another client may not export or drop a private pool */
    ck_assert_int_eq(export_status(b, priv), KVD_EPERM);
    ck_assert_int_eq(drop_status(b, priv, NULL), KVD_EPERM);
    /* nor move data into or out of it */
    {
        Kvdock__Request req;
        Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
        Kvdock__Indices s = KVDOCK__INDICES__INIT, d = KVDOCK__INDICES__INIT;
        int64_t zero = 0;

        kvdt_req_init(&req, 60);
        t.src_pool = shared;
        t.dst_pool = priv;
        s.n_values = d.n_values = 1;
        s.values = d.values = &zero;
        t.src = &s;
        t.dst = &d;
        req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
        req.transfer = &t;
        ck_assert_int_eq(kvdt_status_of(b, &req), KVD_EPERM);
        t.src_pool = priv;
        t.dst_pool = shared;
        ck_assert_int_eq(kvdt_status_of(b, &req), KVD_EPERM);
        /* the shared one it may use */
        t.src_pool = shared;
        t.dst_pool = shared;
        ck_assert_int_eq(kvdt_status_of(b, &req), KVD_OK);
    }
    ck_assert_int_eq(export_status(b, shared), KVD_OK);
    {
        uint8_t want[64];
        memset(want, 0x77, sizeof(want));
        ck_assert_mem_eq(m, want, sizeof(want)); /* untouched */
    }
    munmap(m, len);
    /* an admin (same uid here) may drop a shared pool */
    ck_assert_int_eq(drop_status(b, shared, NULL), KVD_OK);
    ck_assert_int_eq(drop_status(a, priv, NULL), KVD_OK);
    close(a);
    close(b);
}
END_TEST

START_TEST(test_client_gone_releases)
{
    int a = kvdt_client(&D, "leaver"), b = kvdt_client(&D, "watcher");
    Kvdock__StatusReply *s;
    uint8_t *m;
    size_t len;
    int i;

    ck_assert_uint_gt(kvdt_pool_create(a, "left-behind", 1, 64, 64, 0), 0);
    m = kvdt_pool_map(a, 1, NULL, &len); /* the first id of a fresh daemon */
    munmap(m, len);
    s = kvdt_status(b);
    ck_assert_uint_eq(s->pools, 1);
    kvdock__status_reply__free_unpacked(s, NULL);
    close(a);
    for (i = 0; i < 500; i++) {
        uint32_t pools;
        s = kvdt_status(b);
        pools = s->pools;
        kvdock__status_reply__free_unpacked(s, NULL);
        if (pools == 0)
            break;
        usleep(10000);
    }
    ck_assert_int_lt(i, 500);
    s = kvdt_status(b);
    ck_assert_uint_eq(s->clients, 1);
    ck_assert_uint_eq(s->pool_bytes, 0);
    kvdock__status_reply__free_unpacked(s, NULL);
    /* the name is free again */
    ck_assert_uint_gt(kvdt_pool_create(b, "left-behind", 1, 4, 4, 0), 0);
    close(b);
}
END_TEST

/* ---- import ---------------------------------------------------------------- */

static int sealed_memfd(size_t bytes, int seal)
{
    int fd = memfd_create("kvdt-import", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)bytes), 0);
    if (seal)
        ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    return fd;
}

typedef struct import_req {
    Kvdock__Request req;
    Kvdock__PoolImport pi;
    Kvdock__ImportRegion region;
    Kvdock__ImportRegion *regions[1];
    Kvdock__MemRef k[2], v[2];
    Kvdock__MemRef *kp[2], *vp[2];
} import_req_t;

/* 2 layers, 8 slots of 16 bytes, K at 0 and 512, V at 256 and 768 of a
 * 1 KiB memfd. */
static void import_init(import_req_t *x, const char *name)
{
    int l;

    kvdt_req_init(&x->req, 70);
    kvdock__pool_import__init(&x->pi);
    kvdock__import_region__init(&x->region);
    x->pi.name = (char *)name;
    x->pi.num_layers = 2;
    x->pi.num_slots = 8;
    x->pi.slot_bytes = 16;
    x->region.kind = KVDOCK__MEM_KIND__MEM_HOST;
    x->region.fd_index = 0;
    x->region.bytes = 1024;
    x->regions[0] = &x->region;
    x->pi.n_regions = 1;
    x->pi.regions = x->regions;
    for (l = 0; l < 2; l++) {
        kvdock__mem_ref__init(&x->k[l]);
        kvdock__mem_ref__init(&x->v[l]);
        x->k[l].offset = (uint64_t)l * 512;
        x->v[l].offset = (uint64_t)l * 512 + 256;
        x->kp[l] = &x->k[l];
        x->vp[l] = &x->v[l];
    }
    x->pi.n_k_layers = x->pi.n_v_layers = 2;
    x->pi.k_layers = x->kp;
    x->pi.v_layers = x->vp;
    x->req.op_case = KVDOCK__REQUEST__OP_POOL_IMPORT;
    x->req.pool_import = &x->pi;
}

static int import_status(int fd, import_req_t *x, int memfd)
{
    Kvdock__Response *r = kvdt_call_fds(fd, &x->req, &memfd, memfd >= 0 ? 1 : 0, NULL, NULL);
    int st = (int)r->status;

    kvdock__response__free_unpacked(r, NULL);
    return st;
}

START_TEST(test_import_memfd)
{
    int fd = kvdt_client(&D, "importer");
    int mfd = sealed_memfd(1024, 1);
    import_req_t x;
    Kvdock__Response *r;
    uint8_t *m, k[16], v[16], zero[16] = {0};
    uint64_t id;

    import_init(&x, "imported");
    r = kvdt_call_fds(fd, &x.req, &mfd, 1, NULL, NULL);
    ck_assert_msg(r->status == 0, "%s", r->message);
    ck_assert_int_eq(r->pool->imported, 1);
    ck_assert_uint_eq(r->pool->slot_stride, 16);
    id = r->pool->id;
    kvdock__response__free_unpacked(r, NULL);
    /* imported memory cannot be exported again */
    ck_assert_int_eq(export_status(fd, id), KVD_ENOTSUP);

    /* the daemon writes through its mapping of our memfd */
    m = mmap(NULL, 1024, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    ck_assert_ptr_ne(m, MAP_FAILED);
    memset(k, 0xab, sizeof(k));
    memset(v, 0xcd, sizeof(v));
    {
        Kvdock__Request req;
        Kvdock__Store s = KVDOCK__STORE__INIT;
        Kvdock__Indices loc = KVDOCK__INDICES__INIT;
        Kvdock__Data kd = KVDOCK__DATA__INIT, vd = KVDOCK__DATA__INIT;
        int64_t slot = 3;

        kvdt_req_init(&req, 71);
        s.pool = id;
        s.layer = 1;
        loc.n_values = 1;
        loc.values = &slot;
        s.loc = &loc;
        kd.inline_.data = k;
        kd.inline_.len = 16;
        vd.inline_.data = v;
        vd.inline_.len = 16;
        s.k = &kd;
        s.v = &vd;
        req.op_case = KVDOCK__REQUEST__OP_STORE;
        req.store = &s;
        ck_assert_int_eq(kvdt_status_of(fd, &req), 0);
    }
    ck_assert_mem_eq(m + 512 + 3 * 16, k, 16);
    ck_assert_mem_eq(m + 768 + 3 * 16, v, 16);
    ck_assert_mem_eq(m + 3 * 16, zero, 16); /* layer 0 untouched */
    munmap(m, 1024);
    close(mfd);
    ck_assert_int_eq(drop_status(fd, id, NULL), 0);
    close(fd);
}
END_TEST

START_TEST(test_import_errors)
{
    int fd = kvdt_client(&D, "bad-import");
    int sealed = sealed_memfd(1024, 1), unsealed = sealed_memfd(1024, 0);
    import_req_t x;
    uint8_t handle[64] = {0};

    import_init(&x, "imp");
    ck_assert_int_eq(import_status(fd, &x, unsealed), KVD_EPERM);
    ck_assert_int_eq(import_status(fd, &x, -1), KVD_ENULL); /* no descriptor */
    x.region.fd_index = 1;
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_ENULL);
    x.region.fd_index = -1;
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_ENULL);
    import_init(&x, "imp");
    x.region.bytes = 4096; /* more than the memfd holds */
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_ERANGE);
    import_init(&x, "imp");
    x.region.bytes = 0;
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_EINVAL);
    import_init(&x, "imp");
    x.pi.n_k_layers = 1;
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_ESHAPE);
    import_init(&x, "imp");
    x.pi.mla = 1; /* MLA takes no v_layers */
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_ESHAPE);
    import_init(&x, "imp");
    x.v[1].offset = 1024 - 16 * 8 + 1; /* the last slot passes the end */
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_ERANGE);
    import_init(&x, "imp");
    x.k[0].region = 1;
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_ERANGE);
    import_init(&x, "imp");
    x.pi.slot_stride = 8; /* < slot_bytes */
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_EINVAL);
    import_init(&x, "imp");
    x.pi.num_slots = 0;
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_EINVAL);
    import_init(&x, "imp");
    x.pi.n_regions = 0;
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_EINVAL);
    import_init(&x, "bad name");
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_EINVAL);
    import_init(&x, "imp");
    x.region.kind = KVDOCK__MEM_KIND__MEM_DEVICE;
    x.region.cuda_ipc_handle.data = handle;
    x.region.cuda_ipc_handle.len = 64;
    ck_assert_int_eq(import_status(fd, &x, -1), KVD_ENOTSUP); /* cpu backend */
    x.region.cuda_ipc_handle.len = 10;
    ck_assert_int_eq(import_status(fd, &x, -1), KVD_EINVAL);
    import_init(&x, "imp");
    x.region.kind = KVDOCK__MEM_KIND__MEM_UNSPECIFIED;
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_EINVAL);
    import_init(&x, "imp");
    x.region.kind = KVDOCK__MEM_KIND__MEM_DEVICE_VMM;
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_ENOTSUP);
    /* a name in use */
    ck_assert_uint_gt(kvdt_pool_create(fd, "taken", 1, 1, 1, 0), 0);
    import_init(&x, "taken");
    ck_assert_int_eq(import_status(fd, &x, sealed), KVD_EEXIST);
    /* nothing was left behind */
    {
        Kvdock__StatusReply *s = kvdt_status(fd);
        ck_assert_uint_eq(s->pools, 1);
        kvdock__status_reply__free_unpacked(s, NULL);
    }
    assert_usable(fd);
    close(sealed);
    close(unsealed);
    close(fd);
}
END_TEST

/* ---- buffers and events -------------------------------------------------- */

static int buffer_status(int fd, uint64_t bytes, int kind, const char *name)
{
    Kvdock__Request req;
    Kvdock__BufferRegister br = KVDOCK__BUFFER_REGISTER__INIT;

    kvdt_req_init(&req, 80);
    br.bytes = bytes;
    br.kind = kind;
    br.name = (char *)name;
    req.op_case = KVDOCK__REQUEST__OP_BUFFER_REGISTER;
    req.buffer_register = &br;
    return kvdt_status_of(fd, &req);
}

START_TEST(test_buffers)
{
    int fd = kvdt_client(&D, "buffers");
    void *map;
    uint64_t id = kvdt_buffer_map(fd, 4096, &map);
    Kvdock__Request req;
    Kvdock__BufferDrop bd = KVDOCK__BUFFER_DROP__INIT;

    memset(map, 1, 4096);
    munmap(map, 4096);
    ck_assert_int_eq(buffer_status(fd, 0, KVDOCK__MEM_KIND__MEM_HOST, ""), KVD_EINVAL);
    ck_assert_int_eq(buffer_status(fd, 16, KVDOCK__MEM_KIND__MEM_UNSPECIFIED, ""), KVD_EINVAL);
    ck_assert_int_eq(buffer_status(fd, 16, KVDOCK__MEM_KIND__MEM_DEVICE_VMM, ""), KVD_EINVAL);
    ck_assert_int_eq(buffer_status(fd, 16, KVDOCK__MEM_KIND__MEM_DEVICE, ""), KVD_ENOTSUP);
    ck_assert_int_eq(buffer_status(fd, 2u << 20, KVDOCK__MEM_KIND__MEM_HOST, ""), KVD_ELIMIT);
    ck_assert_int_eq(buffer_status(fd, 1ull << 62, KVDOCK__MEM_KIND__MEM_HOST, ""),
                     KVD_EOVERFLOW);
    ck_assert_int_eq(buffer_status(fd, 16, KVDOCK__MEM_KIND__MEM_HOST,
                                   "0123456789012345678901234567890123456789012345678901234567891234"),
                     KVD_EINVAL);
    ck_assert_int_eq(buffer_status(fd, 16, KVDOCK__MEM_KIND__MEM_HOST, "b2"), 0);
    ck_assert_int_eq(buffer_status(fd, 16, KVDOCK__MEM_KIND__MEM_HOST, "b3"), 0);
    ck_assert_int_eq(buffer_status(fd, 16, KVDOCK__MEM_KIND__MEM_HOST, "b4"), KVD_ELIMIT);

    kvdt_req_init(&req, 81);
    bd.buffer = id;
    req.op_case = KVDOCK__REQUEST__OP_BUFFER_DROP;
    req.buffer_drop = &bd;
    ck_assert_int_eq(kvdt_status_of(fd, &req), 0);
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_ENOENT);
    /* a pool id is not a buffer id */
    bd.buffer = kvdt_pool_create(fd, "notabuffer", 1, 1, 1, 0);
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_ENOENT);
    assert_usable(fd);
    close(fd);
}
END_TEST

START_TEST(test_buffer_ownership)
{
    int a = kvdt_client(&D, "a"), b = kvdt_client(&D, "b");
    void *map;
    uint64_t id = kvdt_buffer_map(a, 64, &map);
    Kvdock__Request req;
    Kvdock__BufferDrop bd = KVDOCK__BUFFER_DROP__INIT;

    munmap(map, 64);
    kvdt_req_init(&req, 82);
    bd.buffer = id;
    req.op_case = KVDOCK__REQUEST__OP_BUFFER_DROP;
    req.buffer_drop = &bd;
    ck_assert_int_eq(kvdt_status_of(b, &req), KVD_EPERM);
    ck_assert_int_eq(kvdt_status_of(a, &req), KVD_OK);
    close(a);
    close(b);
}
END_TEST

START_TEST(test_events_cpu)
{
    int fd = kvdt_client(&D, "events");
    Kvdock__Request req;
    Kvdock__EventRegister er = KVDOCK__EVENT_REGISTER__INIT;
    Kvdock__EventDrop ed = KVDOCK__EVENT_DROP__INIT;
    uint8_t handle[64] = {1};

    kvdt_req_init(&req, 90);
    er.cuda_ipc_event_handle.data = handle;
    er.cuda_ipc_event_handle.len = 64;
    req.op_case = KVDOCK__REQUEST__OP_EVENT_REGISTER;
    req.event_register = &er;
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_ENOTSUP);
    er.cuda_ipc_event_handle.len = 63;
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_EINVAL);
    kvdt_req_init(&req, 91);
    ed.event = 12345;
    req.op_case = KVDOCK__REQUEST__OP_EVENT_DROP;
    req.event_drop = &ed;
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_ENOENT);
    assert_usable(fd);
    close(fd);
}
END_TEST

static Suite *pools_suite(void)
{
    Suite *s = suite_create("daemon_pools");
    TCase *tc = tcase_create("pools");

    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_create_info);
    tcase_add_loop_test(tc, test_create_errors, 0, sizeof(bad_creates) / sizeof(bad_creates[0]));
    tcase_add_test(tc, test_limits);
    tcase_add_test(tc, test_export_map);
    tcase_add_test(tc, test_drop_and_list);
    tcase_add_test(tc, test_ownership);
    tcase_add_test(tc, test_client_gone_releases);
    tcase_add_test(tc, test_import_memfd);
    tcase_add_test(tc, test_import_errors);
    tcase_add_test(tc, test_buffers);
    tcase_add_test(tc, test_buffer_ownership);
    tcase_add_test(tc, test_events_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(pools_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
