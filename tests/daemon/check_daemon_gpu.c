/*
 * check_daemon_gpu: kvdockd on the cuda backend (GPU machine; skips,
 * saying why, elsewhere).  Device pools exported by CUDA IPC handle and
 * read back in this process, VMM pools exported by descriptor, device
 * memory of this process imported by handle plus offset, data moved
 * host -> device -> host and compared with the CPU reference, device
 * indices past the pool skipped and counted, and an interprocess event
 * recorded by the daemon that this process waits on.
 */
#include <check.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvdock/kernels.h"

static kvdt_daemon_t D;

static void setup(void)
{
    setenv("KVDT_BACKEND", "cuda", 1);
    kvdt_start(&D, NULL);
}

static void teardown(void)
{
    ck_assert_int_eq(kvdt_stop(&D), 0);
}

static void fill_random(void *p, size_t n, uint32_t seed)
{
    uint8_t *b = p;
    size_t i;

    for (i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        b[i] = (uint8_t)(seed >> 24);
    }
}

static Kvdock__Response *create_kind(int fd, const char *name, int kind, uint32_t layers,
                                     uint64_t slots, uint64_t slot_bytes)
{
    Kvdock__Request req;
    Kvdock__PoolCreate pc = KVDOCK__POOL_CREATE__INIT;

    kvdt_req_init(&req, 10);
    pc.name = (char *)name;
    pc.kind = kind;
    pc.num_layers = layers;
    pc.num_slots = slots;
    pc.slot_bytes = slot_bytes;
    req.op_case = KVDOCK__REQUEST__OP_POOL_CREATE;
    req.pool_create = &pc;
    return kvdt_call(fd, &req);
}

/* A transfer asking for path (Kvdock__CopyPath); the path that ran must be
 * want. */
static Kvdock__OpReply transfer(int fd, uint64_t src, uint64_t dst, int64_t *si, int64_t *di,
                                size_t n, int all, int path, int want)
{
    Kvdock__Request req;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__Indices a = KVDOCK__INDICES__INIT, b = KVDOCK__INDICES__INIT;
    Kvdock__Sync sync = KVDOCK__SYNC__INIT;
    Kvdock__Response *r;
    Kvdock__OpReply out;

    kvdt_req_init(&req, 11);
    a.n_values = b.n_values = n;
    a.values = si;
    b.values = di;
    t.src_pool = src;
    t.dst_pool = dst;
    t.src = &a;
    t.dst = &b;
    t.all_layers = all;
    sync.path = (Kvdock__CopyPath)path;
    req.sync = &sync;
    req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    req.transfer = &t;
    r = kvdt_call(fd, &req);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->status == 0, "transfer: %s", r->message);
    ck_assert_msg((int)r->op->path == want, "transfer ran on path %d, not %d", (int)r->op->path,
                  want);
    out = *r->op;
    kvdock__response__free_unpacked(r, NULL);
    return out;
}

/* m2 (host pool 2, filled with 0xee first) after pairs s1 -> d1 from host
 * pool 1 (m1) into a device pool that started zeroed, then s2 -> d2 from
 * it into pool 2: the same transfers on host copies by the CPU reference,
 * every byte compared.  Both host pools and the device pool have one
 * shape. */
static void check_two_transfers(const uint8_t *m1, const Kvdock__PoolInfo *i1,
                                const uint8_t *m2, const Kvdock__PoolInfo *i2, int64_t layers,
                                int64_t slots, int64_t row, int64_t *s1, int64_t *d1,
                                int64_t n1, int64_t *s2, int64_t *d2, int64_t n2)
{
    uint8_t *tmp = calloc(1, i1->bytes), *expect = malloc(i2->bytes);
    kvd_transfer_args_t x;

    ck_assert_ptr_nonnull(tmp);
    ck_assert_ptr_nonnull(expect);
    memset(expect, 0xee, i2->bytes);
    memset(&x, 0, sizeof(x));
    x.src.k = (void *)m1;
    x.src.v = (void *)(m1 + i1->v_offset);
    x.src.layer_stride = (int64_t)i1->layer_stride;
    x.src.slot_stride = row;
    x.src.num_slots = slots;
    x.dst = x.src;
    x.dst.k = tmp;
    x.dst.v = tmp + i1->v_offset;
    x.num_layers = layers;
    x.src_idx = s1;
    x.dst_idx = d1;
    x.idx_dtype = KVD_DTYPE_I64;
    x.count = n1;
    x.row_bytes = row;
    ck_assert_int_eq(kvd_cpu_kv_transfer(&x, NULL), KVD_OK);
    x.src.k = tmp;
    x.src.v = tmp + i1->v_offset;
    x.dst.k = expect;
    x.dst.v = expect + i2->v_offset;
    x.src_idx = s2;
    x.dst_idx = d2;
    x.count = n2;
    ck_assert_int_eq(kvd_cpu_kv_transfer(&x, NULL), KVD_OK);
    ck_assert_mem_eq(m2, expect, i2->bytes);
    free(tmp);
    free(expect);
}

/* host -> device -> host through the daemon, against the CPU reference,
 * asking for path; the copy engines by default between host and device */
static void round_trip(int kind, int path)
{
    int fd = kvdt_client(&D, "gpu");
    Kvdock__Response *r = create_kind(fd, "dev", kind, 2, 64, 96);
    uint64_t dev, h1, h2;
    Kvdock__PoolInfo *i1, *i2;
    size_t l1, l2;
    uint8_t *m1, *m2;
    int64_t s1[] = {0, 3, 63, -1, 17}, d1[] = {5, 6, 7, 8, 60};
    int64_t s2[] = {5, 6, 7, 60, 9}, d2[] = {1, 2, 3, 4, 5};

    ck_assert_msg(r->status == 0, "create: %s", r->message);
    dev = r->pool->id;
    kvdock__response__free_unpacked(r, NULL);
    h1 = kvdt_pool_create(fd, "h1", 2, 64, 96, 0);
    h2 = kvdt_pool_create(fd, "h2", 2, 64, 96, 0);
    m1 = kvdt_pool_map(fd, h1, &i1, &l1);
    m2 = kvdt_pool_map(fd, h2, &i2, &l2);
    fill_random(m1, i1->bytes, 7);
    memset(m2, 0xee, i2->bytes);
    transfer(fd, h1, dev, s1, d1, 5, 1, path,
             path == KVD_PATH_DEFAULT ? KVD_PATH_COPY_ENGINE : path);
    transfer(fd, dev, h2, s2, d2, 5, 1, path,
             path == KVD_PATH_DEFAULT ? KVD_PATH_COPY_ENGINE : path);

    /* the device pool starts zeroed */
    check_two_transfers(m1, i1, m2, i2, 2, 64, 96, s1, d1, 5, s2, d2, 5);
    munmap(m1, l1);
    munmap(m2, l2);
    kvdock__pool_info__free_unpacked(i1, NULL);
    kvdock__pool_info__free_unpacked(i2, NULL);
    close(fd);
}

/* A transfer of more copies than a gated slice holds (the copy workers
 * issue at most 4,096 copies behind each gate: daemon/cuda_copy.c): 1,024
 * rows of 32 layers, K and V, host to device in a random order (every row
 * its own run: 65,536 copies over two workers) and back in pages of 8
 * consecutive rows; every byte against the CPU reference. */
START_TEST(test_device_many_slices)
{
    enum { L = 32, SLOTS = 1024, ROW = 64 };
    int fd = kvdt_client(&D, "gpu");
    Kvdock__Response *r = create_kind(fd, "dev", KVDOCK__MEM_KIND__MEM_DEVICE, L, SLOTS, ROW);
    uint64_t dev, h1, h2;
    Kvdock__PoolInfo *i1, *i2;
    size_t l1, l2;
    uint8_t *m1, *m2;
    int64_t *s1 = malloc(SLOTS * sizeof(int64_t)), *d1 = malloc(SLOTS * sizeof(int64_t));
    int64_t *s2 = malloc(SLOTS * sizeof(int64_t)), *d2 = malloc(SLOTS * sizeof(int64_t));
    uint32_t seed = 99;

    ck_assert_msg(r->status == 0, "create: %s", r->message);
    dev = r->pool->id;
    kvdock__response__free_unpacked(r, NULL);
    for (int64_t i = 0; i < SLOTS; i++) {
        s1[i] = i;
        d1[i] = i;
    }
    for (int64_t i = SLOTS - 1; i > 0; i--) { /* both orders shuffled */
        int64_t j, t;
        seed = seed * 1664525u + 1013904223u;
        j = (int64_t)(seed >> 8) % (i + 1);
        t = s1[i], s1[i] = s1[j], s1[j] = t;
        seed = seed * 1664525u + 1013904223u;
        j = (int64_t)(seed >> 8) % (i + 1);
        t = d1[i], d1[i] = d1[j], d1[j] = t;
    }
    for (int64_t i = 0; i < SLOTS; i++) { /* pages of 8, the pages reversed */
        s2[i] = (SLOTS / 8 - 1 - i / 8) * 8 + i % 8;
        d2[i] = i;
    }
    h1 = kvdt_pool_create(fd, "h1", L, SLOTS, ROW, 0);
    h2 = kvdt_pool_create(fd, "h2", L, SLOTS, ROW, 0);
    m1 = kvdt_pool_map(fd, h1, &i1, &l1);
    m2 = kvdt_pool_map(fd, h2, &i2, &l2);
    fill_random(m1, i1->bytes, 11);
    memset(m2, 0xee, i2->bytes);
    transfer(fd, h1, dev, s1, d1, SLOTS, 1, KVD_PATH_DEFAULT, KVD_PATH_COPY_ENGINE);
    transfer(fd, dev, h2, s2, d2, SLOTS, 1, KVD_PATH_DEFAULT, KVD_PATH_COPY_ENGINE);

    check_two_transfers(m1, i1, m2, i2, L, SLOTS, ROW, s1, d1, SLOTS, s2, d2, SLOTS);
    free(s1);
    free(d1);
    free(s2);
    free(d2);
    munmap(m1, l1);
    munmap(m2, l2);
    kvdock__pool_info__free_unpacked(i1, NULL);
    kvdock__pool_info__free_unpacked(i2, NULL);
    close(fd);
}
END_TEST

START_TEST(test_device_round_trip)
{
    round_trip(KVDOCK__MEM_KIND__MEM_DEVICE, KVD_PATH_DEFAULT);
}
END_TEST

START_TEST(test_device_round_trip_copy_engine)
{
    round_trip(KVDOCK__MEM_KIND__MEM_DEVICE, KVD_PATH_COPY_ENGINE);
}
END_TEST

START_TEST(test_device_round_trip_kernel)
{
    round_trip(KVDOCK__MEM_KIND__MEM_DEVICE, KVD_PATH_KERNEL);
}
END_TEST

START_TEST(test_vmm_round_trip)
{
    round_trip(KVDOCK__MEM_KIND__MEM_DEVICE_VMM, KVD_PATH_DEFAULT);
}
END_TEST

START_TEST(test_device_export_ipc)
{
    /* the daemon stores into a device pool; we open its IPC handle and read */
    int fd = kvdt_client(&D, "ipc");
    Kvdock__Response *r = create_kind(fd, "dev", KVDOCK__MEM_KIND__MEM_DEVICE, 1, 16, 64);
    Kvdock__Request req;
    Kvdock__PoolExport pe = KVDOCK__POOL_EXPORT__INIT;
    Kvdock__Store s = KVDOCK__STORE__INIT;
    Kvdock__Indices loc = KVDOCK__INDICES__INIT;
    Kvdock__Data kd = KVDOCK__DATA__INIT, vd = KVDOCK__DATA__INIT;
    cudaIpcMemHandle_t h;
    uint64_t id, v_off, bytes;
    int64_t slot = 9;
    uint8_t k[64], v[64], *host;
    void *p = NULL;

    ck_assert_uint_eq(r->status, 0);
    id = r->pool->id;
    v_off = r->pool->v_offset;
    bytes = r->pool->bytes;
    kvdock__response__free_unpacked(r, NULL);
    fill_random(k, 64, 1);
    fill_random(v, 64, 2);
    kvdt_req_init(&req, 20);
    s.pool = id;
    loc.n_values = 1;
    loc.values = &slot;
    kd.inline_.data = k;
    kd.inline_.len = 64;
    vd.inline_.data = v;
    vd.inline_.len = 64;
    s.loc = &loc;
    s.k = &kd;
    s.v = &vd;
    req.op_case = KVDOCK__REQUEST__OP_STORE;
    req.store = &s;
    ck_assert_int_eq(kvdt_status_of(fd, &req), 0);

    kvdt_req_init(&req, 21);
    pe.pool = id;
    req.op_case = KVDOCK__REQUEST__OP_POOL_EXPORT;
    req.pool_export = &pe;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_uint_eq(r->pool_export->cuda_ipc_handle.len, sizeof(h));
    ck_assert_int_eq(r->pool_export->fd_index, -1);
    memcpy(&h, r->pool_export->cuda_ipc_handle.data, sizeof(h));
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_int_eq(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
    host = malloc(bytes);
    ck_assert_int_eq(cudaMemcpy(host, p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_mem_eq(host + 9 * 64, k, 64);
    ck_assert_mem_eq(host + v_off + 9 * 64, v, 64);
    free(host);
    cudaIpcCloseMemHandle(p);
    close(fd);
}
END_TEST

START_TEST(test_vmm_export_fd)
{
    int fd = kvdt_client(&D, "vmm");
    Kvdock__Response *r = create_kind(fd, "vmm", KVDOCK__MEM_KIND__MEM_DEVICE_VMM, 1, 16, 64);
    Kvdock__Request req;
    Kvdock__PoolExport pe = KVDOCK__POOL_EXPORT__INIT;
    int fds[4], nfds = 0;

    ck_assert_msg(r->status == 0, "%s", r->message);
    kvdt_req_init(&req, 30);
    pe.pool = r->pool->id;
    kvdock__response__free_unpacked(r, NULL);
    req.op_case = KVDOCK__REQUEST__OP_POOL_EXPORT;
    req.pool_export = &pe;
    r = kvdt_call_fds(fd, &req, NULL, 0, fds, &nfds);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_int_eq(r->pool_export->fd_index, 0);
    ck_assert_int_eq(nfds, 1);
    ck_assert_uint_ge(r->pool_export->map_bytes, r->pool_export->pool->bytes);
    close(fds[0]);
    kvdock__response__free_unpacked(r, NULL);
    close(fd);
}
END_TEST

START_TEST(test_import_legacy_handle)
{
    /* our cudaMalloc'd cache, imported by handle and offset, written by the daemon */
    int fd = kvdt_client(&D, "importer");
    const size_t total = 1 << 20, off = 4096, layer = 16 * 64;
    void *mine = NULL;
    cudaIpcMemHandle_t h;
    Kvdock__Request req;
    Kvdock__PoolImport pi = KVDOCK__POOL_IMPORT__INIT;
    Kvdock__ImportRegion reg = KVDOCK__IMPORT_REGION__INIT, *regs[1] = {&reg};
    Kvdock__MemRef k = KVDOCK__MEM_REF__INIT, v = KVDOCK__MEM_REF__INIT;
    Kvdock__MemRef *kp[1] = {&k}, *vp[1] = {&v};
    Kvdock__Response *r;
    uint64_t id, hp;
    Kvdock__PoolInfo *hi;
    size_t hl;
    uint8_t *hm, *back;
    int64_t si[] = {0, 1, 2}, di[] = {15, 0, 7};
    Kvdock__OpReply op;

    ck_assert_int_eq(cudaMalloc(&mine, total), cudaSuccess);
    ck_assert_int_eq(cudaMemset(mine, 0, total), cudaSuccess);
    ck_assert_int_eq(cudaIpcGetMemHandle(&h, mine), cudaSuccess);
    kvdt_req_init(&req, 40);
    pi.name = "worker-cache";
    pi.num_layers = 1;
    pi.num_slots = 16;
    pi.slot_bytes = 64;
    reg.kind = KVDOCK__MEM_KIND__MEM_DEVICE;
    reg.cuda_ipc_handle.data = (uint8_t *)&h;
    reg.cuda_ipc_handle.len = sizeof(h);
    reg.bytes = total;
    pi.n_regions = 1;
    pi.regions = regs;
    k.offset = off;
    v.offset = off + layer;
    pi.n_k_layers = pi.n_v_layers = 1;
    pi.k_layers = kp;
    pi.v_layers = vp;
    req.op_case = KVDOCK__REQUEST__OP_POOL_IMPORT;
    req.pool_import = &pi;
    r = kvdt_call(fd, &req);
    ck_assert_msg(r->status == 0, "import: %s", r->message);
    id = r->pool->id;
    kvdock__response__free_unpacked(r, NULL);
    /* a second import of the same handle opens it once more in name only */
    pi.name = "worker-cache-2";
    ck_assert_int_eq(kvdt_status_of(fd, &req), 0);
    /* more bytes than the allocation holds */
    pi.name = "too-big";
    reg.bytes = total * 2;
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_ERANGE);

    hp = kvdt_pool_create(fd, "stage", 1, 16, 64, 0);
    hm = kvdt_pool_map(fd, hp, &hi, &hl);
    fill_random(hm, hi->bytes, 9);
    op = transfer(fd, hp, id, si, di, 3, 0, KVD_PATH_DEFAULT, KVD_PATH_COPY_ENGINE);
    ck_assert_uint_eq(op.bytes, 3 * 2 * 64);
    back = malloc(total);
    ck_assert_int_eq(cudaMemcpy(back, mine, total, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_mem_eq(back + off + 15 * 64, hm + 0 * 64, 64);
    ck_assert_mem_eq(back + off + 0 * 64, hm + 1 * 64, 64);
    ck_assert_mem_eq(back + off + layer + 7 * 64, hm + hi->v_offset + 2 * 64, 64);
    free(back);
    munmap(hm, hl);
    kvdock__pool_info__free_unpacked(hi, NULL);
    close(fd); /* the daemon closes our handle once its work is done */
    usleep(100000);
    cudaFree(mine);
}
END_TEST

START_TEST(test_device_indices_oob)
{
    int fd = kvdt_client(&D, "oob");
    Kvdock__Request req;
    Kvdock__BufferRegister br = KVDOCK__BUFFER_REGISTER__INIT;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__Indices si = KVDOCK__INDICES__INIT, di = KVDOCK__INDICES__INIT;
    Kvdock__BufRef sb = KVDOCK__BUF_REF__INIT, db = KVDOCK__BUF_REF__INIT;
    Kvdock__Response *r;
    cudaIpcMemHandle_t h;
    void *p = NULL;
    uint64_t buf, a, b;
    const int64_t idx[8] = {0, 1, 2, 3, 4, 1000000, 6, 7};

    kvdt_req_init(&req, 50);
    br.bytes = sizeof(idx);
    br.kind = KVDOCK__MEM_KIND__MEM_DEVICE;
    req.op_case = KVDOCK__REQUEST__OP_BUFFER_REGISTER;
    req.buffer_register = &br;
    r = kvdt_call(fd, &req);
    ck_assert_msg(r->status == 0, "%s", r->message);
    buf = r->buffer->id;
    ck_assert_uint_eq(r->buffer->cuda_ipc_handle.len, sizeof(h));
    memcpy(&h, r->buffer->cuda_ipc_handle.data, sizeof(h));
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_int_eq(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(p, idx, sizeof(idx), cudaMemcpyHostToDevice), cudaSuccess);

    r = create_kind(fd, "a", KVDOCK__MEM_KIND__MEM_DEVICE, 1, 8, 32);
    a = r->pool->id;
    kvdock__response__free_unpacked(r, NULL);
    r = create_kind(fd, "b", KVDOCK__MEM_KIND__MEM_DEVICE, 1, 8, 32);
    b = r->pool->id;
    kvdock__response__free_unpacked(r, NULL);
    kvdt_req_init(&req, 51);
    sb.buffer = db.buffer = buf;
    si.buffer = &sb;
    di.buffer = &db;
    si.dtype = di.dtype = KVDOCK__DTYPE__I64;
    si.count = di.count = 8;
    t.src_pool = a;
    t.dst_pool = b;
    t.src = &si;
    t.dst = &di;
    req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    req.transfer = &t;
    r = kvdt_call(fd, &req);
    ck_assert_msg(r->status == 0, "%s", r->message);
    ck_assert_uint_eq(r->op->skipped_oob, 1);
    kvdock__response__free_unpacked(r, NULL);

    /* device to host with device-resident indices: the copy engines cannot
     * read them when the request arrives, so a kernel moves the rows by
     * default, and asking for the copy engines is refused */
    {
        Kvdock__Sync sync = KVDOCK__SYNC__INIT;
        uint64_t host = kvdt_pool_create(fd, "h", 1, 8, 32, 0);

        t.dst_pool = host;
        r = kvdt_call(fd, &req);
        ck_assert_msg(r->status == 0, "%s", r->message);
        ck_assert_int_eq(r->op->path, KVDOCK__COPY_PATH__PATH_KERNEL);
        kvdock__response__free_unpacked(r, NULL);
        sync.path = KVDOCK__COPY_PATH__PATH_COPY_ENGINE;
        req.sync = &sync;
        r = kvdt_call(fd, &req);
        ck_assert_uint_eq(r->status, KVD_EINVAL);
        ck_assert_ptr_nonnull(strstr(r->message, "host-readable"));
        kvdock__response__free_unpacked(r, NULL);
        req.sync = NULL;
    }
    cudaIpcCloseMemHandle(p);
    close(fd);
}
END_TEST

START_TEST(test_device_room)
{
    /* a device pool past the device's free memory less the margin: ENOMEM,
     * nothing allocated (free memory read before and after) */
    int fd = kvdt_client(&D, "room");
    size_t free0 = 0, free1 = 0, total = 0;
    Kvdock__Response *r;

    ck_assert_int_eq(cudaMemGetInfo(&free0, &total), cudaSuccess);
    r = create_kind(fd, "too-big", KVDOCK__MEM_KIND__MEM_DEVICE, 1, (free0 >> 20) + 1, 1 << 20);
    ck_assert_uint_eq(r->status, KVD_ENOMEM);
    ck_assert_ptr_nonnull(strstr(r->message, "device-memory-margin"));
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_int_eq(cudaMemGetInfo(&free1, &total), cudaSuccess);
    ck_assert_uint_ge(free1 + (64u << 20), free0);
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
}
END_TEST

START_TEST(test_event_record)
{
    /* the daemon records our interprocess event after a transfer; we wait on it */
    int fd = kvdt_client(&D, "events");
    cudaEvent_t ev;
    cudaIpcEventHandle_t h;
    Kvdock__Request req;
    Kvdock__EventRegister er = KVDOCK__EVENT_REGISTER__INIT;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__Indices si = KVDOCK__INDICES__INIT, di = KVDOCK__INDICES__INIT;
    Kvdock__Sync sync = KVDOCK__SYNC__INIT;
    Kvdock__Response *r;
    uint64_t eid, hp, dp, hp2;
    Kvdock__PoolInfo *i1, *i2;
    size_t l1, l2;
    uint8_t *m1, *m2;
    int64_t s[] = {0, 1, 2, 3}, d[] = {3, 2, 1, 0};

    ck_assert_int_eq(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming),
                     cudaSuccess);
    ck_assert_int_eq(cudaIpcGetEventHandle(&h, ev), cudaSuccess);
    kvdt_req_init(&req, 60);
    er.cuda_ipc_event_handle.data = (uint8_t *)&h;
    er.cuda_ipc_event_handle.len = sizeof(h);
    req.op_case = KVDOCK__REQUEST__OP_EVENT_REGISTER;
    req.event_register = &er;
    r = kvdt_call(fd, &req);
    ck_assert_msg(r->status == 0, "%s", r->message);
    eid = r->event->id;
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_EEXIST); /* registered once */

    hp = kvdt_pool_create(fd, "h", 1, 4, 4096, 0);
    hp2 = kvdt_pool_create(fd, "h2", 1, 4, 4096, 0);
    r = create_kind(fd, "d", KVDOCK__MEM_KIND__MEM_DEVICE, 1, 4, 4096);
    dp = r->pool->id;
    kvdock__response__free_unpacked(r, NULL);
    m1 = kvdt_pool_map(fd, hp, &i1, &l1);
    m2 = kvdt_pool_map(fd, hp2, &i2, &l2);
    fill_random(m1, i1->bytes, 3);
    transfer(fd, hp, dp, s, d, 4, 1, KVD_PATH_DEFAULT, KVD_PATH_COPY_ENGINE);

    /* device -> host, answered at enqueue; completion through our event */
    kvdt_req_init(&req, 61);
    si.n_values = di.n_values = 4;
    si.values = s;
    di.values = d;
    t.src_pool = dp;
    t.dst_pool = hp2;
    t.src = &si;
    t.dst = &di;
    t.all_layers = 1;
    sync.record_event = eid;
    sync.wait_event = eid; /* waits on nothing recorded yet: no-op */
    sync.reply_at_enqueue = 1;
    req.sync = &sync;
    req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    req.transfer = &t;
    r = kvdt_call(fd, &req);
    ck_assert_msg(r->status == 0, "%s", r->message);
    ck_assert_int_eq(r->op->enqueued, 1);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_int_eq(cudaEventSynchronize(ev), cudaSuccess);
    /* back where it started: d is its own inverse */
    ck_assert_mem_eq(m2, m1, i1->bytes);
    munmap(m1, l1);
    munmap(m2, l2);
    kvdock__pool_info__free_unpacked(i1, NULL);
    kvdock__pool_info__free_unpacked(i2, NULL);
    close(fd);
    cudaEventDestroy(ev);
}
END_TEST

static Suite *gpu_suite(void)
{
    Suite *s = suite_create("daemon_gpu");
    TCase *tc = tcase_create("gpu");

    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_device_round_trip);
    tcase_add_test(tc, test_device_round_trip_copy_engine);
    tcase_add_test(tc, test_device_many_slices);
    tcase_add_test(tc, test_device_round_trip_kernel);
    tcase_add_test(tc, test_vmm_round_trip);
    tcase_add_test(tc, test_device_export_ipc);
    tcase_add_test(tc, test_vmm_export_fd);
    tcase_add_test(tc, test_import_legacy_handle);
    tcase_add_test(tc, test_device_indices_oob);
    tcase_add_test(tc, test_device_room);
    tcase_add_test(tc, test_event_record);
    suite_add_tcase(s, tc);
    return s;
}

/* Probe in a child: CUDA must not be initialised before Check forks. */
static int gpu_usable(char *why, size_t len)
{
    int pipefd[2], status = 0;
    ssize_t n;
    pid_t pid;

    if (pipe(pipefd) != 0)
        return 0;
    pid = fork();
    if (pid == 0) {
        char msg[256] = "";
        int ok = kvd_cuda_probe(msg, sizeof(msg)) == KVD_OK;
        n = write(pipefd[1], msg, strlen(msg));
        (void)n;
        _exit(ok ? 0 : 1);
    }
    close(pipefd[1]);
    n = read(pipefd[0], why, len - 1);
    why[n > 0 ? n : 0] = '\0';
    close(pipefd[0]);
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void)
{
    SRunner *sr;
    int failed;
    char why[256];

    if (!gpu_usable(why, sizeof(why))) {
        printf("SKIP: no usable GPU (%s)\n", why);
        return 77;
    }
    sr = srunner_create(gpu_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
