/*
 * check_daemon_data: the data operations through the real kvdockd (cpu
 * backend), on host pools the test maps through their exported memfds.
 * Every result is compared byte for byte, over the whole pool, with the
 * same operation run locally by kvd_cpu_* on copies (poisoned first, so
 * unwritten or misplaced rows show).  Then an exact status code for each
 * invalid data request, with the connection usable after each.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "kvdock/kernels.h"

static kvdt_daemon_t D;

static void setup(void)
{
    const char *extra[] = {"--max-inline-bytes", "64K", NULL};
    kvdt_start(&D, extra);
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

static void set_inline(Kvdock__Indices *ix, int64_t *vals, size_t n)
{
    kvdock__indices__init(ix);
    ix->n_values = n;
    ix->values = vals;
}

static void set_data(Kvdock__Data *d, void *p, size_t n)
{
    kvdock__data__init(d);
    d->inline_.data = p;
    d->inline_.len = n;
}

/* A mapped pool. */
typedef struct mpool {
    uint64_t id;
    Kvdock__PoolInfo *info;
    uint8_t *map;
    size_t len;
} mpool_t;

static void mpool_open(int fd, mpool_t *p, const char *name, uint32_t layers, uint64_t slots,
                       uint64_t slot_bytes, int mla)
{
    p->id = kvdt_pool_create(fd, name, layers, slots, slot_bytes, mla);
    ck_assert_uint_gt(p->id, 0);
    p->map = kvdt_pool_map(fd, p->id, &p->info, &p->len);
}

static void mpool_close(mpool_t *p)
{
    munmap(p->map, p->len);
    kvdock__pool_info__free_unpacked(p->info, NULL);
}

static uint8_t *copy_of(const mpool_t *p)
{
    uint8_t *c = malloc(p->info->bytes);

    ck_assert_ptr_nonnull(c);
    memcpy(c, p->map, p->info->bytes);
    return c;
}

/* The kernel-side view of a daemon pool from its PoolInfo, over base. */
static void side_of(const mpool_t *p, uint8_t *base, uint32_t begin, kvd_kv_side_t *s)
{
    memset(s, 0, sizeof(*s));
    s->k = base + begin * p->info->layer_stride;
    s->v = p->info->mla ? NULL : base + begin * p->info->layer_stride + p->info->v_offset;
    s->layer_stride = (int64_t)p->info->layer_stride;
    s->slot_stride = (int64_t)p->info->slot_stride;
    s->num_slots = (int64_t)p->info->num_slots;
}

static Kvdock__OpReply *op_ok(Kvdock__Response *r)
{
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->status == 0, "status %u: %s", r->status, r->message);
    ck_assert_int_eq(r->result_case, KVDOCK__RESPONSE__RESULT_OP);
    return r->op;
}

static void transfer_case(int mla)
{
    int fd = kvdt_client(&D, "transfer");
    mpool_t a, b;
    Kvdock__Request req;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__Indices si, di;
    Kvdock__Response *r;
    Kvdock__OpReply *op;
    int64_t src[] = {0, 5, 31, -1, 7, 9}, dst[] = {3, 30, 0, 12, 31, 8};
    uint8_t *ea, *eb;
    kvd_transfer_args_t x;
    const uint64_t row = 48, per_row = mla ? row : 2 * row;

    mpool_open(fd, &a, "src", 3, 32, row, mla);
    mpool_open(fd, &b, "dst", 3, 32, row, mla);
    fill_random(a.map, a.info->bytes, 1);
    memset(b.map, 0xee, b.info->bytes); /* poison */
    ea = copy_of(&a);
    eb = copy_of(&b);

    /* layers 1 and 2 */
    kvdt_req_init(&req, 10);
    t.src_pool = a.id;
    t.dst_pool = b.id;
    set_inline(&si, src, 6);
    set_inline(&di, dst, 6);
    t.src = &si;
    t.dst = &di;
    t.layer_begin = 1;
    t.layer_count = 2;
    req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    req.transfer = &t;
    r = kvdt_call(fd, &req);
    op = op_ok(r);
    ck_assert_uint_eq(op->rows, 6);
    ck_assert_uint_eq(op->skipped_oob, 0);
    ck_assert_uint_eq(op->bytes, 5 * per_row * 2);
    ck_assert_int_eq(op->enqueued, 0);
    kvdock__response__free_unpacked(r, NULL);

    memset(&x, 0, sizeof(x));
    side_of(&a, ea, 1, &x.src);
    side_of(&b, eb, 1, &x.dst);
    x.num_layers = 2;
    x.src_idx = src;
    x.dst_idx = dst;
    x.idx_dtype = KVD_DTYPE_I64;
    x.count = 6;
    x.row_bytes = (int64_t)row;
    ck_assert_int_eq(kvd_cpu_kv_transfer(&x, NULL), KVD_OK);
    ck_assert_mem_eq(b.map, eb, b.info->bytes);

    /* all layers, the other way round */
    fill_random(b.map, b.info->bytes, 2);
    memcpy(eb, b.map, b.info->bytes);
    t.src_pool = b.id;
    t.dst_pool = a.id;
    t.layer_begin = t.layer_count = 0;
    t.all_layers = 1;
    r = kvdt_call(fd, &req);
    op = op_ok(r);
    ck_assert_uint_eq(op->bytes, 5 * per_row * 3);
    kvdock__response__free_unpacked(r, NULL);
    side_of(&b, eb, 0, &x.src);
    side_of(&a, ea, 0, &x.dst);
    x.num_layers = 3;
    ck_assert_int_eq(kvd_cpu_kv_transfer(&x, NULL), KVD_OK);
    ck_assert_mem_eq(a.map, ea, a.info->bytes);

    /* within one pool (a prefix-cache move) */
    t.src_pool = t.dst_pool = a.id;
    t.all_layers = 0;
    t.layer_begin = 0;
    t.layer_count = 1;
    {
        int64_t s2[] = {1, 2}, d2[] = {20, 21};
        set_inline(&si, s2, 2);
        set_inline(&di, d2, 2);
        r = kvdt_call(fd, &req);
        op_ok(r);
        kvdock__response__free_unpacked(r, NULL);
        side_of(&a, ea, 0, &x.src);
        side_of(&a, ea, 0, &x.dst);
        x.num_layers = 1;
        x.src_idx = s2;
        x.dst_idx = d2;
        x.count = 2;
        ck_assert_int_eq(kvd_cpu_kv_transfer(&x, NULL), KVD_OK);
        ck_assert_mem_eq(a.map, ea, a.info->bytes);
    }
    free(ea);
    free(eb);
    mpool_close(&a);
    mpool_close(&b);
    close(fd);
}

START_TEST(test_transfer_mha)
{
    transfer_case(0);
}
END_TEST

START_TEST(test_transfer_mla)
{
    transfer_case(1);
}
END_TEST

START_TEST(test_transfer_buffer_indices)
{
    /* indices in a registered buffer: one past the pool is skipped and counted */
    int fd = kvdt_client(&D, "bufidx");
    mpool_t a, b;
    void *bmap;
    uint64_t buf = kvdt_buffer_map(fd, 256, &bmap);
    int32_t *idx = bmap;
    const int32_t src[] = {1, 2, 3, 4}, dst[] = {5, 99, -1, 7};
    Kvdock__Request req;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__Indices si = KVDOCK__INDICES__INIT, di = KVDOCK__INDICES__INIT;
    Kvdock__BufRef sb = KVDOCK__BUF_REF__INIT, db = KVDOCK__BUF_REF__INIT;
    Kvdock__Response *r;
    Kvdock__OpReply *op;
    uint8_t *ea, *eb;
    kvd_transfer_args_t x;
    unsigned long long oob = 0;

    mpool_open(fd, &a, "a", 1, 8, 16, 0);
    mpool_open(fd, &b, "b", 1, 8, 16, 0);
    fill_random(a.map, a.info->bytes, 3);
    memset(b.map, 0x11, b.info->bytes);
    ea = copy_of(&a);
    eb = copy_of(&b);
    memcpy(idx, src, sizeof(src));
    memcpy(idx + 16, dst, sizeof(dst));
    kvdt_req_init(&req, 11);
    sb.buffer = db.buffer = buf;
    sb.offset = 0;
    db.offset = 64;
    si.buffer = &sb;
    di.buffer = &db;
    si.dtype = di.dtype = KVDOCK__DTYPE__I32;
    si.count = di.count = 4;
    t.src_pool = a.id;
    t.dst_pool = b.id;
    t.src = &si;
    t.dst = &di;
    req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    req.transfer = &t;
    r = kvdt_call(fd, &req);
    op = op_ok(r);
    ck_assert_uint_eq(op->rows, 4);
    ck_assert_uint_eq(op->skipped_oob, 1);
    kvdock__response__free_unpacked(r, NULL);
    memset(&x, 0, sizeof(x));
    side_of(&a, ea, 0, &x.src);
    side_of(&b, eb, 0, &x.dst);
    x.num_layers = 1;
    x.src_idx = src;
    x.dst_idx = dst;
    x.idx_dtype = KVD_DTYPE_I32;
    x.count = 4;
    x.row_bytes = 16;
    x.oob_count = &oob;
    ck_assert_int_eq(kvd_cpu_kv_transfer(&x, NULL), KVD_OK);
    ck_assert_uint_eq(oob, 1);
    ck_assert_mem_eq(b.map, eb, b.info->bytes);
    free(ea);
    free(eb);
    mpool_close(&a);
    mpool_close(&b);
    munmap(bmap, 256);
    close(fd);
}
END_TEST

START_TEST(test_store)
{
    int fd = kvdt_client(&D, "store");
    mpool_t p;
    Kvdock__Request req;
    Kvdock__Store s = KVDOCK__STORE__INIT;
    Kvdock__Indices loc;
    Kvdock__Data kd, vd;
    Kvdock__Response *r;
    Kvdock__OpReply *op;
    int64_t slots[] = {4, -1, 15, 0};
    const uint64_t row = 40, stride = 48;
    uint8_t k[4 * 48], v[4 * 48], *e;
    kvd_store_args_t x;

    mpool_open(fd, &p, "store", 2, 16, row, 0);
    memset(p.map, 0x5c, p.info->bytes);
    e = copy_of(&p);
    fill_random(k, sizeof(k), 4);
    fill_random(v, sizeof(v), 5);
    kvdt_req_init(&req, 20);
    s.pool = p.id;
    s.layer = 1;
    set_inline(&loc, slots, 4);
    set_data(&kd, k, 3 * stride + row);
    set_data(&vd, v, sizeof(v));
    s.loc = &loc;
    s.k = &kd;
    s.v = &vd;
    s.src_stride = stride;
    req.op_case = KVDOCK__REQUEST__OP_STORE;
    req.store = &s;
    r = kvdt_call(fd, &req);
    op = op_ok(r);
    ck_assert_uint_eq(op->rows, 4);
    ck_assert_uint_eq(op->bytes, 3 * 2 * row);
    kvdock__response__free_unpacked(r, NULL);

    memset(&x, 0, sizeof(x));
    x.k_src = k;
    x.v_src = v;
    x.k_src_stride = x.v_src_stride = (int64_t)stride;
    x.k_dst = e + p.info->layer_stride;
    x.v_dst = e + p.info->layer_stride + p.info->v_offset;
    x.k_dst_stride = x.v_dst_stride = (int64_t)row;
    x.num_slots = 16;
    x.loc = slots;
    x.loc_dtype = KVD_DTYPE_I64;
    x.num_tokens = 4;
    x.row_bytes = (int64_t)row;
    ck_assert_int_eq(kvd_cpu_kv_store(&x, NULL), KVD_OK);
    ck_assert_mem_eq(p.map, e, p.info->bytes);
    free(e);
    mpool_close(&p);
    close(fd);
}
END_TEST

START_TEST(test_store_from_buffers)
{
    /* K, V and loc all in a registered buffer; MLA pool, K only */
    int fd = kvdt_client(&D, "store-buf");
    mpool_t p;
    void *bmap;
    uint64_t buf = kvdt_buffer_map(fd, 4096, &bmap);
    uint8_t *b = bmap, *e;
    int64_t slots[] = {2, 7, 99, 5}; /* 99: past the pool, skipped */
    Kvdock__Request req;
    Kvdock__Store s = KVDOCK__STORE__INIT;
    Kvdock__Indices loc = KVDOCK__INDICES__INIT;
    Kvdock__Data kd = KVDOCK__DATA__INIT;
    Kvdock__BufRef lb = KVDOCK__BUF_REF__INIT, kb = KVDOCK__BUF_REF__INIT;
    Kvdock__Response *r;
    Kvdock__OpReply *op;
    kvd_store_args_t x;

    mpool_open(fd, &p, "latent", 1, 8, 64, 1);
    memset(p.map, 0xa5, p.info->bytes);
    e = copy_of(&p);
    memcpy(b + 1024, slots, sizeof(slots));
    fill_random(b + 2048, 4 * 64, 6);
    kvdt_req_init(&req, 21);
    lb.buffer = kb.buffer = buf;
    lb.offset = 1024;
    kb.offset = 2048;
    loc.buffer = &lb;
    loc.dtype = KVDOCK__DTYPE__I64;
    loc.count = 4;
    kd.buffer = &kb;
    s.pool = p.id;
    s.loc = &loc;
    s.k = &kd;
    req.op_case = KVDOCK__REQUEST__OP_STORE;
    req.store = &s;
    r = kvdt_call(fd, &req);
    op = op_ok(r);
    ck_assert_uint_eq(op->skipped_oob, 1);
    kvdock__response__free_unpacked(r, NULL);
    memset(&x, 0, sizeof(x));
    x.k_src = b + 2048;
    x.k_src_stride = 64;
    x.k_dst = e;
    x.k_dst_stride = 64;
    x.num_slots = 8;
    x.loc = slots;
    x.loc_dtype = KVD_DTYPE_I64;
    x.num_tokens = 4;
    x.row_bytes = 64;
    ck_assert_int_eq(kvd_cpu_kv_store(&x, NULL), KVD_OK);
    ck_assert_mem_eq(p.map, e, p.info->bytes);
    free(e);
    mpool_close(&p);
    munmap(bmap, 4096);
    close(fd);
}
END_TEST

/* fp8 set in each scale mode and source dtype: _i picks the case */
static const struct {
    int src_dtype;
    int scale_mode;
} fp8_cases[] = {
    {KVDOCK__DTYPE__F32, KVDOCK__SCALE_MODE__SCALE_NONE},
    {KVDOCK__DTYPE__F32, KVDOCK__SCALE_MODE__SCALE_TENSOR},
    {KVDOCK__DTYPE__F32, KVDOCK__SCALE_MODE__SCALE_PER_HEAD},
    {KVDOCK__DTYPE__BF16, KVDOCK__SCALE_MODE__SCALE_TENSOR},
    {KVDOCK__DTYPE__F16, KVDOCK__SCALE_MODE__SCALE_NONE},
};

START_TEST(test_fp8_set)
{
    enum { HEADS = 2, DIM = 16, TOKENS = 3 };
    int fd = kvdt_client(&D, "fp8");
    mpool_t p;
    Kvdock__Request req;
    Kvdock__Fp8Set f = KVDOCK__FP8_SET__INIT;
    Kvdock__Indices loc;
    Kvdock__Data kd, vd;
    Kvdock__Response *r;
    int64_t slots[] = {7, 1, -1};
    float kf[TOKENS * HEADS * DIM], vf[TOKENS * HEADS * DIM];
    float khs[HEADS] = {0.25f, 3.0f}, vhs[HEADS] = {1.5f, 0.125f};
    uint8_t ksrc[sizeof(kf)], vsrc[sizeof(vf)], *e;
    size_t esize, i, n = TOKENS * HEADS * DIM;
    int src_dtype = fp8_cases[_i].src_dtype, mode = fp8_cases[_i].scale_mode;
    kvd_fp8_set_args_t x;

    for (i = 0; i < n; i++) {
        kf[i] = (float)((int)(i * 37 % 101) - 50) * 0.37f;
        vf[i] = (float)((int)(i * 53 % 97) - 48) * 11.5f;
    }
    esize = kvd_dtype_size(src_dtype);
    for (i = 0; i < n; i++) {
        if (src_dtype == KVDOCK__DTYPE__F32) {
            memcpy(ksrc + 4 * i, &kf[i], 4);
            memcpy(vsrc + 4 * i, &vf[i], 4);
        } else {
            /* bf16 / f16 bit patterns: any 16-bit values will do */
            uint16_t kb = (uint16_t)(0x3c00 + i * 7), vb = (uint16_t)(0xbc00 + i * 5);
            memcpy(ksrc + 2 * i, &kb, 2);
            memcpy(vsrc + 2 * i, &vb, 2);
        }
    }
    mpool_open(fd, &p, "fp8", 1, 8, HEADS * DIM, 0);
    memset(p.map, 0xff, p.info->bytes);
    e = copy_of(&p);
    kvdt_req_init(&req, 30);
    f.pool = p.id;
    set_inline(&loc, slots, TOKENS);
    set_data(&kd, ksrc, n * esize);
    set_data(&vd, vsrc, n * esize);
    f.loc = &loc;
    f.k = &kd;
    f.v = &vd;
    f.src_dtype = src_dtype;
    f.cache_dtype = KVDOCK__DTYPE__E4M3;
    f.num_heads = HEADS;
    f.head_dim = DIM;
    f.scale_mode = mode;
    f.k_scale = 0.5f;
    f.v_scale = 4.0f;
    if (mode == KVDOCK__SCALE_MODE__SCALE_PER_HEAD) {
        f.n_k_head_scales = f.n_v_head_scales = HEADS;
        f.k_head_scales = khs;
        f.v_head_scales = vhs;
    }
    req.op_case = KVDOCK__REQUEST__OP_FP8_SET;
    req.fp8_set = &f;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(op_ok(r)->rows, TOKENS);
    kvdock__response__free_unpacked(r, NULL);

    memset(&x, 0, sizeof(x));
    x.k_src = ksrc;
    x.v_src = vsrc;
    x.src_dtype = src_dtype;
    x.k_src_token_stride = x.v_src_token_stride = (int64_t)(HEADS * DIM * esize);
    x.k_src_head_stride = x.v_src_head_stride = (int64_t)(DIM * esize);
    x.k_cache = e;
    x.v_cache = e + p.info->v_offset;
    x.cache_dtype = KVD_DTYPE_E4M3;
    x.page_size = 1;
    x.k_page_stride = x.v_page_stride = HEADS * DIM;
    x.k_slot_stride = x.v_slot_stride = HEADS * DIM;
    x.k_head_stride = x.v_head_stride = DIM;
    x.num_slots = 8;
    x.num_heads = HEADS;
    x.head_dim = DIM;
    x.loc = slots;
    x.loc_dtype = KVD_DTYPE_I64;
    x.num_tokens = TOKENS;
    if (mode == KVDOCK__SCALE_MODE__SCALE_TENSOR) {
        x.scale_mode = KVD_SCALE_HOST;
        x.k_scale = 0.5f;
        x.v_scale = 4.0f;
    } else if (mode == KVDOCK__SCALE_MODE__SCALE_PER_HEAD) {
        x.scale_mode = KVD_SCALE_PER_HEAD;
        x.k_scale_ptr = khs;
        x.v_scale_ptr = vhs;
    }
    ck_assert_int_eq(kvd_cpu_fp8_set(&x, NULL), KVD_OK);
    ck_assert_mem_eq(p.map, e, p.info->bytes);
    free(e);
    mpool_close(&p);
    close(fd);
}
END_TEST

START_TEST(test_gather)
{
    enum { ROWS = 4, COLS = 6, BS = 3, PAGES = 5 };
    int fd = kvdt_client(&D, "gather");
    void *tmap, *omap;
    uint64_t tbuf = kvdt_buffer_map(fd, ROWS * COLS * 4, &tmap);
    uint64_t obuf = kvdt_buffer_map(fd, BS * PAGES * 4 + 64, &omap);
    int64_t req_idx[] = {2, -1, 3}, seq[] = {5, 0, 9};
    int32_t expect[BS * PAGES + 16];
    Kvdock__Request req;
    Kvdock__PageTableGather g = KVDOCK__PAGE_TABLE_GATHER__INIT;
    Kvdock__BufRef tb = KVDOCK__BUF_REF__INIT, ob = KVDOCK__BUF_REF__INIT;
    Kvdock__Indices ri, si;
    Kvdock__Response *r;
    kvd_gather_args_t x;
    int i;

    for (i = 0; i < ROWS * COLS; i++)
        ((int32_t *)tmap)[i] = 1000 + i;
    memset(omap, 0x7f, BS * PAGES * 4 + 64);
    memcpy(expect, omap, sizeof(expect));
    kvdt_req_init(&req, 40);
    tb.buffer = tbuf;
    ob.buffer = obuf;
    ob.offset = 16;
    g.req_to_page = &tb;
    g.table_dtype = KVDOCK__DTYPE__I32;
    g.table_rows = ROWS;
    g.table_cols = COLS;
    set_inline(&ri, req_idx, BS);
    set_inline(&si, seq, BS);
    g.req_pool_indices = &ri;
    g.seq_lens = &si;
    g.out = &ob;
    g.max_num_pages = PAGES;
    g.page_size = 2;
    g.dummy_slot = -7;
    req.op_case = KVDOCK__REQUEST__OP_GATHER;
    req.gather = &g;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(op_ok(r)->rows, BS);
    kvdock__response__free_unpacked(r, NULL);

    memset(&x, 0, sizeof(x));
    x.req_to_page = tmap;
    x.table_dtype = KVD_DTYPE_I32;
    x.table_rows = ROWS;
    x.table_cols = COLS;
    x.table_stride = COLS * 4;
    x.req_pool_indices = req_idx;
    x.req_dtype = KVD_DTYPE_I64;
    x.seq_lens = seq;
    x.seq_lens_dtype = KVD_DTYPE_I64;
    x.out = (uint8_t *)expect + 16;
    x.out_stride = PAGES * 4;
    x.bs = BS;
    x.max_num_pages = PAGES;
    x.page_size = 2;
    x.dummy_slot = -7;
    ck_assert_int_eq(kvd_cpu_page_table_gather(&x, NULL), KVD_OK);
    ck_assert_mem_eq(omap, expect, sizeof(expect)); /* nothing written past out either */
    /* row 0: pages 1000..1002 then dummies */
    ck_assert_int_eq(((int32_t *)((uint8_t *)omap + 16))[0], 1000 + 2 * COLS);
    ck_assert_int_eq(((int32_t *)((uint8_t *)omap + 16))[4], -7);
    munmap(tmap, ROWS * COLS * 4);
    munmap(omap, BS * PAGES * 4 + 64);
    close(fd);
}
END_TEST

START_TEST(test_reply_at_enqueue)
{
    int fd = kvdt_client(&D, "enqueue");
    mpool_t p;
    Kvdock__Request req;
    Kvdock__Store s = KVDOCK__STORE__INIT;
    Kvdock__Sync sync = KVDOCK__SYNC__INIT;
    Kvdock__Indices loc;
    Kvdock__Data kd, vd;
    Kvdock__Response *r;
    Kvdock__OpReply *op;
    int64_t slot = 3;
    uint8_t k[8], v[8];
    int i;

    mpool_open(fd, &p, "enq", 1, 4, 8, 0);
    memset(k, 0x21, 8);
    memset(v, 0x43, 8);
    kvdt_req_init(&req, 50);
    s.pool = p.id;
    set_inline(&loc, &slot, 1);
    set_data(&kd, k, 8);
    set_data(&vd, v, 8);
    s.loc = &loc;
    s.k = &kd;
    s.v = &vd;
    sync.reply_at_enqueue = 1;
    sync.stream = KVDOCK__STREAM_CLASS__STREAM_D2D;
    req.sync = &sync;
    req.op_case = KVDOCK__REQUEST__OP_STORE;
    req.store = &s;
    r = kvdt_call(fd, &req);
    op = op_ok(r);
    ck_assert_int_eq(op->enqueued, 1);
    ck_assert_uint_eq(op->rows, 1);
    kvdock__response__free_unpacked(r, NULL);
    for (i = 0; i < 1000 && memcmp(p.map + 3 * 8, k, 8) != 0; i++)
        usleep(1000);
    ck_assert_mem_eq(p.map + 3 * 8, k, 8);
    for (i = 0; i < 1000 && memcmp(p.map + p.info->v_offset + 3 * 8, v, 8) != 0; i++)
        usleep(1000);
    ck_assert_mem_eq(p.map + p.info->v_offset + 3 * 8, v, 8);
    mpool_close(&p);
    close(fd);
}
END_TEST

/* Many requests in flight: every one answered once, by id.  half_close:
 * the client shuts down its sending side once all are sent (as a client
 * piping a batch in does); the daemon still answers every one, then
 * closes. */
static void pipelined_case(int half_close)
{
    enum { N = 300 };
    int fd = kvdt_client(&D, half_close ? "half-close" : "pipeline");
    mpool_t a, b;
    static uint8_t seen[N];
    Kvdock__Request req;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__Ping ping = KVDOCK__PING__INIT;
    Kvdock__Indices si, di;
    int64_t s1 = 1, d1 = 2;
    int i;

    mpool_open(fd, &a, "pa", 2, 64, 32, 0);
    mpool_open(fd, &b, "pb", 2, 64, 32, 0);
    memset(seen, 0, sizeof(seen));
    set_inline(&si, &s1, 1);
    set_inline(&di, &d1, 1);
    t.src_pool = a.id;
    t.dst_pool = b.id;
    t.src = &si;
    t.dst = &di;
    t.all_layers = 1;
    for (i = 0; i < N; i++) {
        kvdt_req_init(&req, 1000 + (uint64_t)i);
        if (i % 3 == 2) {
            req.op_case = KVDOCK__REQUEST__OP_PING;
            req.ping = &ping;
        } else {
            req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
            req.transfer = &t;
        }
        kvdt_send(fd, &req, NULL, 0);
    }
    if (half_close)
        ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
    for (i = 0; i < N; i++) {
        Kvdock__Response *r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
        ck_assert_ptr_nonnull(r);
        ck_assert_uint_eq(r->status, 0);
        ck_assert_uint_ge(r->id, 1000);
        ck_assert_uint_lt(r->id, 1000 + N);
        ck_assert_int_eq(seen[r->id - 1000], 0);
        seen[r->id - 1000] = 1;
        kvdock__response__free_unpacked(r, NULL);
    }
    if (half_close)
        ck_assert_int_eq(kvdt_closed(fd, KVDT_TIMEOUT_MS), 1);
    mpool_close(&a);
    mpool_close(&b);
    close(fd);
}

START_TEST(test_pipelined)
{
    pipelined_case(0);
}
END_TEST

START_TEST(test_half_close_answers_all)
{
    pipelined_case(1);
}
END_TEST

/* ---- invalid data requests ------------------------------------------------- */

typedef struct env {
    int fd;
    uint64_t p;   /* MHA, 2 layers, 16 slots of 32 bytes */
    uint64_t q;   /* MHA, 2 layers, 16 slots of 64 bytes */
    uint64_t m;   /* MLA, 2 layers, 16 slots of 32 bytes */
    uint64_t p3;  /* MHA, 3 layers, 16 slots of 32 bytes */
    uint64_t buf; /* 256-byte host buffer */
    void *bmap;
} env_t;

static void env_open(env_t *e)
{
    e->fd = kvdt_client(&D, "errors");
    e->p = kvdt_pool_create(e->fd, "p", 2, 16, 32, 0);
    e->q = kvdt_pool_create(e->fd, "q", 2, 16, 64, 0);
    e->m = kvdt_pool_create(e->fd, "m", 2, 16, 32, 1);
    e->p3 = kvdt_pool_create(e->fd, "p3", 3, 16, 32, 0);
    e->buf = kvdt_buffer_map(e->fd, 256, &e->bmap);
}

static void env_close(env_t *e)
{
    munmap(e->bmap, 256);
    close(e->fd);
}

/* Send req, expect want, then check the connection still answers. */
static void expect(env_t *e, Kvdock__Request *req, int want, int line)
{
    Kvdock__Request ping;
    Kvdock__Ping pp = KVDOCK__PING__INIT;
    int st = kvdt_status_of(e->fd, req);

    ck_assert_msg(st == want, "line %d: status %d (%s), wanted %d (%s)", line, st,
                  kvd_err_name(st), want, kvd_err_name(want));
    kvdt_req_init(&ping, 4242);
    ping.op_case = KVDOCK__REQUEST__OP_PING;
    ping.ping = &pp;
    ck_assert_int_eq(kvdt_status_of(e->fd, &ping), 0);
}
#define EXPECT(e, req, want) expect((e), (req), (want), __LINE__)

START_TEST(test_store_errors)
{
    env_t e;
    Kvdock__Request req;
    Kvdock__Store s;
    Kvdock__Indices loc;
    Kvdock__Data kd, vd;
    Kvdock__BufRef br = KVDOCK__BUF_REF__INIT;
    Kvdock__Sync sync = KVDOCK__SYNC__INIT;
    int64_t slots[] = {1, 2};
    uint8_t k[64], v[64];
    static uint8_t big[65 * 1024];

    env_open(&e);
    memset(k, 1, sizeof(k));
    memset(v, 2, sizeof(v));
#define RESET()                                                                                   \
    do {                                                                                          \
        kvdt_req_init(&req, 60);                                                                  \
        kvdock__store__init(&s);                                                                  \
        s.pool = e.p;                                                                             \
        set_inline(&loc, slots, 2);                                                               \
        set_data(&kd, k, 64);                                                                     \
        set_data(&vd, v, 64);                                                                     \
        s.loc = &loc;                                                                             \
        s.k = &kd;                                                                                \
        s.v = &vd;                                                                                \
        req.op_case = KVDOCK__REQUEST__OP_STORE;                                                  \
        req.store = &s;                                                                           \
        kvdock__sync__init(&sync);                                                                \
        kvdock__buf_ref__init(&br);                                                               \
    } while (0)

    RESET();
    EXPECT(&e, &req, KVD_OK);
    RESET(); s.pool = 4242; EXPECT(&e, &req, KVD_ENOENT);
    RESET(); s.pool = e.buf; EXPECT(&e, &req, KVD_ENOENT); /* a buffer is no pool */
    RESET(); s.layer = 2; EXPECT(&e, &req, KVD_ERANGE);
    RESET(); slots[1] = 16; EXPECT(&e, &req, KVD_ERANGE); slots[1] = 2;
    RESET(); slots[0] = INT64_MAX; EXPECT(&e, &req, KVD_ERANGE); slots[0] = 1;
    RESET(); kd.inline_.len = 63; EXPECT(&e, &req, KVD_ESHAPE);
    RESET(); s.v = NULL; EXPECT(&e, &req, KVD_ENULL);
    RESET(); s.k = NULL; EXPECT(&e, &req, KVD_ENULL);
    RESET(); s.pool = e.m; EXPECT(&e, &req, KVD_EINVAL); /* MLA takes no v */
    RESET(); s.pool = e.m; s.v = NULL; EXPECT(&e, &req, KVD_OK);
    RESET(); s.src_stride = 16; EXPECT(&e, &req, KVD_EINVAL);
    RESET(); s.src_stride = 48; EXPECT(&e, &req, KVD_ESHAPE); /* 80 bytes needed */
    RESET(); s.src_stride = (uint64_t)1 << 63; EXPECT(&e, &req, KVD_EOVERFLOW);
    RESET(); br.buffer = e.buf; loc.buffer = &br; loc.dtype = KVDOCK__DTYPE__I64; loc.count = 2;
    EXPECT(&e, &req, KVD_EINVAL); /* inline and buffer */
    RESET(); br.buffer = e.buf; set_inline(&loc, NULL, 0); loc.buffer = &br;
    loc.dtype = KVDOCK__DTYPE__F32; loc.count = 2; EXPECT(&e, &req, KVD_EDTYPE);
    loc.dtype = KVDOCK__DTYPE__I64; loc.count = 33; EXPECT(&e, &req, KVD_ERANGE); /* 264 > 256 */
    loc.count = 2; br.offset = 4; EXPECT(&e, &req, KVD_EALIGN);
    br.offset = 256; EXPECT(&e, &req, KVD_ERANGE);
    br.offset = 0; br.bytes = 8; EXPECT(&e, &req, KVD_ESHAPE); /* 2 x 8 bytes needed */
    br.bytes = 0; br.buffer = 4242; EXPECT(&e, &req, KVD_ENOENT);
    br.buffer = e.p; EXPECT(&e, &req, KVD_ENOENT);           /* a pool is no buffer */
    loc.count = (uint64_t)1 << 62; br.buffer = e.buf; EXPECT(&e, &req, KVD_EOVERFLOW);
    RESET(); kd.buffer = &br; br.buffer = e.buf; EXPECT(&e, &req, KVD_EINVAL); /* both */
    RESET(); set_data(&kd, NULL, 0); kd.buffer = &br; br.buffer = e.buf; br.offset = 200;
    EXPECT(&e, &req, KVD_ERANGE);
    RESET(); set_data(&kd, big, sizeof(big)); EXPECT(&e, &req, KVD_ELIMIT);
    RESET(); req.sync = &sync; sync.wait_event = 77; EXPECT(&e, &req, KVD_ENOENT);
    RESET(); req.sync = &sync; sync.record_event = 78; EXPECT(&e, &req, KVD_ENOENT);
    RESET(); req.sync = &sync; sync.stream = 9; EXPECT(&e, &req, KVD_EINVAL);
    RESET(); req.sync = &sync; sync.copy_engine = 1; EXPECT(&e, &req, KVD_EINVAL);
    RESET(); req.sync = &sync; sync.max_blocks = 4; sync.stream = KVDOCK__STREAM_CLASS__STREAM_RELOAD;
    EXPECT(&e, &req, KVD_OK);
    RESET(); set_inline(&loc, NULL, 0); s.k = NULL; s.v = NULL; EXPECT(&e, &req, KVD_OK); /* 0 rows */
#undef RESET
    env_close(&e);
}
END_TEST

START_TEST(test_transfer_errors)
{
    env_t e;
    Kvdock__Request req;
    Kvdock__Transfer t;
    Kvdock__Indices si, di;
    Kvdock__BufRef br = KVDOCK__BUF_REF__INIT;
    Kvdock__Sync sync = KVDOCK__SYNC__INIT;
    int64_t src[] = {0, 1, 2}, dst[] = {3, 4, 5};

    env_open(&e);
#define RESET()                                                                                   \
    do {                                                                                          \
        kvdt_req_init(&req, 61);                                                                  \
        kvdock__transfer__init(&t);                                                               \
        t.src_pool = e.p;                                                                         \
        t.dst_pool = e.p3;                                                                        \
        set_inline(&si, src, 3);                                                                  \
        set_inline(&di, dst, 3);                                                                  \
        t.src = &si;                                                                              \
        t.dst = &di;                                                                              \
        req.op_case = KVDOCK__REQUEST__OP_TRANSFER;                                               \
        req.transfer = &t;                                                                        \
        kvdock__sync__init(&sync);                                                                \
    } while (0)

    RESET(); EXPECT(&e, &req, KVD_OK);
    RESET(); t.src_pool = 999; EXPECT(&e, &req, KVD_ENOENT);
    RESET(); t.dst_pool = 999; EXPECT(&e, &req, KVD_ENOENT);
    RESET(); t.dst_pool = e.q; EXPECT(&e, &req, KVD_ESHAPE); /* slot_bytes */
    RESET(); t.dst_pool = e.m; EXPECT(&e, &req, KVD_ESHAPE); /* MHA vs MLA */
    RESET(); di.n_values = 2; EXPECT(&e, &req, KVD_ESHAPE);  /* counts */
    RESET(); t.layer_begin = 2; EXPECT(&e, &req, KVD_ERANGE); /* src has 2 layers */
    RESET(); t.layer_begin = 1; t.layer_count = 2; EXPECT(&e, &req, KVD_ERANGE);
    RESET(); t.layer_begin = 0xffffffffu; t.layer_count = 2; EXPECT(&e, &req, KVD_ERANGE);
    RESET(); t.all_layers = 1; EXPECT(&e, &req, KVD_ESHAPE); /* 2 vs 3 layers */
    RESET(); t.dst_pool = e.p; t.all_layers = 1; t.layer_begin = 1; EXPECT(&e, &req, KVD_EINVAL);
    RESET(); t.dst_pool = e.p; t.all_layers = 1; EXPECT(&e, &req, KVD_OK);
    RESET(); src[2] = 16; EXPECT(&e, &req, KVD_ERANGE); src[2] = 2;
    RESET(); dst[0] = 16; EXPECT(&e, &req, KVD_ERANGE); dst[0] = 3;
    { /* the message names the first index out of range, and the pool's bound */
        Kvdock__Response *r;

        RESET(); src[1] = 40; src[2] = 17;
        r = kvdt_call(e.fd, &req);
        ck_assert_uint_eq(r->status, KVD_ERANGE);
        ck_assert_msg(strstr(r->message, "[1] = 40 is out of range [0, 16)") != NULL, "message: %s",
                      r->message);
        kvdock__response__free_unpacked(r, NULL);
        src[1] = 1; src[2] = 2;
    }
    RESET(); src[0] = -1; dst[1] = -5; EXPECT(&e, &req, KVD_OK); src[0] = 0; dst[1] = 4;
    RESET(); set_inline(&di, NULL, 0); br.buffer = e.buf; di.buffer = &br;
    di.dtype = KVDOCK__DTYPE__I32; di.count = 3; EXPECT(&e, &req, KVD_EDTYPE); /* I64 vs I32 */
    RESET(); req.sync = &sync; sync.copy_engine = 1; EXPECT(&e, &req, KVD_OK); /* ignored on cpu */
    RESET(); req.sync = &sync; sync.stream = KVDOCK__STREAM_CLASS__STREAM_OFFLOAD;
    EXPECT(&e, &req, KVD_OK);
#undef RESET
    env_close(&e);
}
END_TEST

START_TEST(test_fp8_errors)
{
    env_t e;
    Kvdock__Request req;
    Kvdock__Fp8Set f;
    Kvdock__Indices loc;
    Kvdock__Data kd, vd;
    int64_t slots[] = {1};
    float src[32], hs[4] = {1, 1, 1, 1};

    env_open(&e);
    memset(src, 0, sizeof(src));
#define RESET()                                                                                   \
    do {                                                                                          \
        kvdt_req_init(&req, 62);                                                                  \
        kvdock__fp8_set__init(&f);                                                                \
        f.pool = e.p;                                                                             \
        set_inline(&loc, slots, 1);                                                               \
        set_data(&kd, src, sizeof(src));                                                          \
        set_data(&vd, src, sizeof(src));                                                          \
        f.loc = &loc;                                                                             \
        f.k = &kd;                                                                                \
        f.v = &vd;                                                                                \
        f.src_dtype = KVDOCK__DTYPE__F32;                                                         \
        f.cache_dtype = KVDOCK__DTYPE__E4M3;                                                      \
        f.num_heads = 2;                                                                          \
        f.head_dim = 16;                                                                          \
        req.op_case = KVDOCK__REQUEST__OP_FP8_SET;                                                \
        req.fp8_set = &f;                                                                         \
    } while (0)

    RESET(); EXPECT(&e, &req, KVD_OK);
    RESET(); f.pool = 555; EXPECT(&e, &req, KVD_ENOENT);
    RESET(); f.layer = 9; EXPECT(&e, &req, KVD_ERANGE);
    RESET(); f.head_dim = 8; EXPECT(&e, &req, KVD_ESHAPE);
    RESET(); f.num_heads = 0; EXPECT(&e, &req, KVD_EINVAL);
    RESET(); f.src_dtype = KVDOCK__DTYPE__I32; EXPECT(&e, &req, KVD_EDTYPE);
    RESET(); f.cache_dtype = KVDOCK__DTYPE__F16; EXPECT(&e, &req, KVD_EDTYPE);
    RESET(); kd.inline_.len = 64; EXPECT(&e, &req, KVD_ESHAPE);
    RESET(); slots[0] = 16; EXPECT(&e, &req, KVD_ERANGE); slots[0] = 1;
    RESET(); f.scale_mode = KVDOCK__SCALE_MODE__SCALE_TENSOR; f.k_scale = 0; f.v_scale = 1;
    EXPECT(&e, &req, KVD_EINVAL);
    RESET(); f.scale_mode = KVDOCK__SCALE_MODE__SCALE_TENSOR; f.k_scale = 1; f.v_scale = NAN;
    EXPECT(&e, &req, KVD_EINVAL);
    RESET(); f.scale_mode = KVDOCK__SCALE_MODE__SCALE_PER_HEAD; f.n_k_head_scales = 3;
    f.k_head_scales = hs; f.n_v_head_scales = 2; f.v_head_scales = hs; EXPECT(&e, &req, KVD_ESHAPE);
    RESET(); f.scale_mode = KVDOCK__SCALE_MODE__SCALE_PER_HEAD; f.n_k_head_scales = 2;
    f.k_head_scales = hs; f.n_v_head_scales = 2; f.v_head_scales = hs; EXPECT(&e, &req, KVD_OK);
    RESET(); f.scale_mode = 9; EXPECT(&e, &req, KVD_EINVAL);
    RESET(); f.pool = e.m; EXPECT(&e, &req, KVD_EINVAL); /* MLA takes no v */
    RESET(); f.pool = e.m; f.v = NULL; EXPECT(&e, &req, KVD_OK);
    RESET(); f.v = NULL; EXPECT(&e, &req, KVD_ENULL);
#undef RESET
    env_close(&e);
}
END_TEST

START_TEST(test_gather_errors)
{
    env_t e;
    Kvdock__Request req;
    Kvdock__PageTableGather g;
    Kvdock__BufRef tb, ob;
    Kvdock__Indices ri, si;
    int64_t reqs[] = {0, 1}, seqs[] = {4, 2};

    env_open(&e);
#define RESET()                                                                                   \
    do {                                                                                          \
        kvdt_req_init(&req, 63);                                                                  \
        kvdock__page_table_gather__init(&g);                                                      \
        kvdock__buf_ref__init(&tb);                                                               \
        kvdock__buf_ref__init(&ob);                                                               \
        tb.buffer = ob.buffer = e.buf;                                                            \
        ob.offset = 128;                                                                          \
        g.req_to_page = &tb;                                                                      \
        g.out = &ob;                                                                              \
        g.table_dtype = KVDOCK__DTYPE__I32;                                                       \
        g.table_rows = 4;                                                                         \
        g.table_cols = 4;                                                                         \
        set_inline(&ri, reqs, 2);                                                                 \
        set_inline(&si, seqs, 2);                                                                 \
        g.req_pool_indices = &ri;                                                                 \
        g.seq_lens = &si;                                                                         \
        g.max_num_pages = 4;                                                                      \
        g.page_size = 1;                                                                          \
        req.op_case = KVDOCK__REQUEST__OP_GATHER;                                                 \
        req.gather = &g;                                                                          \
    } while (0)

    RESET(); EXPECT(&e, &req, KVD_OK);
    RESET(); g.table_dtype = KVDOCK__DTYPE__F32; EXPECT(&e, &req, KVD_EDTYPE);
    RESET(); g.page_size = 0; EXPECT(&e, &req, KVD_EINVAL);
    RESET(); si.n_values = 1; EXPECT(&e, &req, KVD_ESHAPE);
    RESET(); reqs[1] = 4; EXPECT(&e, &req, KVD_ERANGE); reqs[1] = 1;
    RESET(); seqs[0] = -1; EXPECT(&e, &req, KVD_EINVAL); seqs[0] = 4;
    RESET(); ob.offset = 240; EXPECT(&e, &req, KVD_ERANGE);
    RESET(); ob.offset = 130; EXPECT(&e, &req, KVD_EALIGN);
    RESET(); g.table_rows = 100; EXPECT(&e, &req, KVD_ERANGE); /* table past the buffer */
    RESET(); g.dummy_slot = (int64_t)1 << 40; EXPECT(&e, &req, KVD_ERANGE);
    RESET(); g.out = NULL; EXPECT(&e, &req, KVD_ENULL);
    RESET(); g.req_to_page = NULL; EXPECT(&e, &req, KVD_ENULL);
    RESET(); g.table_stride = 8; EXPECT(&e, &req, KVD_EINVAL); /* < a row */
    RESET(); g.table_stride = 18; EXPECT(&e, &req, KVD_EALIGN);
    RESET(); g.out_stride = 4; EXPECT(&e, &req, KVD_EINVAL);
    RESET(); tb.buffer = 31337; EXPECT(&e, &req, KVD_ENOENT);
    RESET(); g.max_num_pages = (uint64_t)1 << 62; EXPECT(&e, &req, KVD_EOVERFLOW);
#undef RESET
    env_close(&e);
}
END_TEST

START_TEST(test_data_counters)
{
    int fd = kvdt_client(&D, "counters");
    mpool_t a;
    Kvdock__Request req;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__StatsRequest sr = KVDOCK__STATS_REQUEST__INIT;
    Kvdock__Indices si, di;
    Kvdock__Response *r;
    int64_t s1 = 1, d1 = 2;
    size_t i;
    int found = 0;

    mpool_open(fd, &a, "ctr", 1, 4, 100, 0);
    kvdt_req_init(&req, 70);
    set_inline(&si, &s1, 1);
    set_inline(&di, &d1, 1);
    t.src_pool = t.dst_pool = a.id;
    t.src = &si;
    t.dst = &di;
    req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    req.transfer = &t;
    ck_assert_int_eq(kvdt_status_of(fd, &req), 0);
    ck_assert_int_eq(kvdt_status_of(fd, &req), 0);
    t.src_pool = 4242;
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_ENOENT);
    kvdt_req_init(&req, 71);
    req.op_case = KVDOCK__REQUEST__OP_STATS;
    req.stats = &sr;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(r->status, 0);
    for (i = 0; i < r->stats->n_ops; i++) {
        if (strcmp(r->stats->ops[i]->op, "transfer") == 0) {
            ck_assert_uint_eq(r->stats->ops[i]->requests, 3);
            ck_assert_uint_eq(r->stats->ops[i]->errors, 1);
            ck_assert_uint_eq(r->stats->ops[i]->bytes, 2 * 200);
            found = 1;
        }
    }
    ck_assert(found);
    /* host to host: the d2d stream */
    ck_assert_str_eq(r->stats->streams[3]->name, "d2d");
    ck_assert_uint_eq(r->stats->streams[3]->launches, 2);
    ck_assert_uint_eq(r->stats->streams[3]->bytes, 400);
    ck_assert_uint_eq(r->stats->streams[3]->queue_depth, 0);
    kvdock__response__free_unpacked(r, NULL);
    mpool_close(&a);
    close(fd);
}
END_TEST

/* One transfer of slot 1 to slot 2 with sync; the response. */
static Kvdock__Response *transfer_with(int fd, uint64_t pool, Kvdock__Sync *sync)
{
    Kvdock__Request req;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__Indices si, di;
    static int64_t s1 = 1, d1 = 2;

    kvdt_req_init(&req, 80);
    set_inline(&si, &s1, 1);
    set_inline(&di, &d1, 1);
    t.src_pool = t.dst_pool = pool;
    t.src = &si;
    t.dst = &di;
    t.all_layers = 1;
    req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    req.transfer = &t;
    req.sync = sync;
    return kvdt_call(fd, &req);
}

START_TEST(test_copy_path)
{
    /* the path asked for runs and is reported; bad choices are refused */
    int fd = kvdt_client(&D, "paths");
    Kvdock__Sync sync = KVDOCK__SYNC__INIT;
    Kvdock__Response *r;
    Kvdock__Request req;
    Kvdock__StatsRequest sr = KVDOCK__STATS_REQUEST__INIT;
    Kvdock__StatusRequest st = KVDOCK__STATUS_REQUEST__INIT;
    mpool_t a;
    size_t i;

    mpool_open(fd, &a, "paths", 2, 4, 64, 0);
    fill_random(a.map, a.info->bytes, 7);
    /* host to host: kernels by default */
    r = transfer_with(fd, a.id, NULL);
    ck_assert_int_eq(op_ok(r)->path, KVDOCK__COPY_PATH__PATH_KERNEL);
    ck_assert_uint_eq(r->op->bytes, 2 * 2 * 64);
    kvdock__response__free_unpacked(r, NULL);
    /* asked for: the copy engines, then kernels; the bytes land either way */
    memset(a.map + a.info->v_offset + 2 * 64, 0, 64);
    sync.path = KVDOCK__COPY_PATH__PATH_COPY_ENGINE;
    r = transfer_with(fd, a.id, &sync);
    ck_assert_int_eq(op_ok(r)->path, KVDOCK__COPY_PATH__PATH_COPY_ENGINE);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert_mem_eq(a.map + a.info->v_offset + 2 * 64, a.map + a.info->v_offset + 64, 64);
    sync.path = KVDOCK__COPY_PATH__PATH_KERNEL;
    r = transfer_with(fd, a.id, &sync);
    ck_assert_int_eq(op_ok(r)->path, KVDOCK__COPY_PATH__PATH_KERNEL);
    kvdock__response__free_unpacked(r, NULL);
    /* the old flag still means the copy engines */
    sync.path = KVDOCK__COPY_PATH__PATH_DEFAULT;
    sync.copy_engine = 1;
    r = transfer_with(fd, a.id, &sync);
    ck_assert_int_eq(op_ok(r)->path, KVDOCK__COPY_PATH__PATH_COPY_ENGINE);
    kvdock__response__free_unpacked(r, NULL);
    /* errors: the flag against PATH_KERNEL, an unknown path */
    sync.path = KVDOCK__COPY_PATH__PATH_KERNEL;
    r = transfer_with(fd, a.id, &sync);
    ck_assert_uint_eq(r->status, KVD_EINVAL);
    ck_assert_ptr_nonnull(strstr(r->message, "disagree"));
    kvdock__response__free_unpacked(r, NULL);
    sync.copy_engine = 0;
    sync.path = (Kvdock__CopyPath)7;
    r = transfer_with(fd, a.id, &sync);
    ck_assert_uint_eq(r->status, KVD_EINVAL);
    ck_assert_ptr_nonnull(strstr(r->message, "not a copy path"));
    kvdock__response__free_unpacked(r, NULL);
    /* the stats count what ran on the copy engines (the d2d class here) and
     * say each class's default path */
    kvdt_req_init(&req, 81);
    req.op_case = KVDOCK__REQUEST__OP_STATS;
    req.stats = &sr;
    r = kvdt_call(fd, &req);
    for (i = 0; i < r->stats->n_streams; i++) {
        const Kvdock__StreamStats *t = r->stats->streams[i];
        int hostdev = strcmp(t->name, "reload") == 0 || strcmp(t->name, "offload") == 0;
        ck_assert_int_eq(t->path, hostdev ? KVDOCK__COPY_PATH__PATH_COPY_ENGINE
                                          : KVDOCK__COPY_PATH__PATH_KERNEL);
        if (strcmp(t->name, "d2d") == 0) {
            ck_assert_uint_eq(t->launches, 4);
            ck_assert_uint_eq(t->copy_engine_launches, 2);
        }
    }
    kvdock__response__free_unpacked(r, NULL);
    kvdt_req_init(&req, 82);
    req.op_case = KVDOCK__REQUEST__OP_STATUS;
    req.status = &st;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(r->status_reply->n_stream_paths, 4);
    for (i = 0; i < 4; i++) {
        const Kvdock__StreamPath *p = r->status_reply->stream_paths[i];
        int hostdev = p->stream == KVDOCK__STREAM_CLASS__STREAM_RELOAD ||
                      p->stream == KVDOCK__STREAM_CLASS__STREAM_OFFLOAD;
        ck_assert_int_eq(p->path, hostdev ? KVDOCK__COPY_PATH__PATH_COPY_ENGINE
                                          : KVDOCK__COPY_PATH__PATH_KERNEL);
    }
    kvdock__response__free_unpacked(r, NULL);
    mpool_close(&a);
    close(fd);
}
END_TEST

START_TEST(test_copy_path_option)
{
    /* --host-copy-path kernel: every class moves with kernels by default */
    const char *extra[] = {"--host-copy-path", "kernel", NULL};
    kvdt_daemon_t d;
    Kvdock__Request req;
    Kvdock__StatusRequest st = KVDOCK__STATUS_REQUEST__INIT;
    Kvdock__Response *r;
    int fd;
    size_t i;

    kvdt_start(&d, extra);
    fd = kvdt_client(&d, "paths");
    kvdt_req_init(&req, 83);
    req.op_case = KVDOCK__REQUEST__OP_STATUS;
    req.status = &st;
    r = kvdt_call(fd, &req);
    for (i = 0; i < r->status_reply->n_stream_paths; i++)
        ck_assert_int_eq(r->status_reply->stream_paths[i]->path, KVDOCK__COPY_PATH__PATH_KERNEL);
    kvdock__response__free_unpacked(r, NULL);
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

static Suite *data_suite(void)
{
    Suite *s = suite_create("daemon_data");
    TCase *tc = tcase_create("data");

    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_transfer_mha);
    tcase_add_test(tc, test_transfer_mla);
    tcase_add_test(tc, test_transfer_buffer_indices);
    tcase_add_test(tc, test_store);
    tcase_add_test(tc, test_store_from_buffers);
    tcase_add_loop_test(tc, test_fp8_set, 0, sizeof(fp8_cases) / sizeof(fp8_cases[0]));
    tcase_add_test(tc, test_gather);
    tcase_add_test(tc, test_reply_at_enqueue);
    tcase_add_test(tc, test_pipelined);
    tcase_add_test(tc, test_half_close_answers_all);
    tcase_add_test(tc, test_data_counters);
    tcase_add_test(tc, test_copy_path);
    tcase_add_test(tc, test_copy_path_option);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_store_errors);
    tcase_add_test(tc, test_transfer_errors);
    tcase_add_test(tc, test_fp8_errors);
    tcase_add_test(tc, test_gather_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(data_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
