/*
 * libkvdock against the real kvdockd (cpu backend): every operation end to
 * end, its data checked byte for byte against the CPU reference computed
 * here on a copy of the same bytes.
 */
#include "testutil.h"

#include <math.h>

/* ------------------------------------------------------------------------ */
/* Session                                                                   */

START_TEST(test_hello_info)
{
    kvd_client_t *cli = kvt_connect("hello-test");
    const kvd_hello_info_t *h = kvd_client_info(cli);

    ck_assert_uint_eq(h->protocol_version, 2); /* proto/src/wire.h KVD_PROTOCOL_VERSION */
    ck_assert_int_eq(h->backend, KVD_BACKEND_CPU);
    ck_assert_str_ne(h->daemon_version, "");
    ck_assert_uint_gt(h->limits.max_frame_bytes, 0);
    ck_assert_uint_gt(h->limits.max_inflight, 0);
    ck_assert_uint_gt(h->daemon_pid, 0);
    ck_assert_uint_ne(h->client_id, 0);
    ck_assert(h->admin); /* same user as the daemon */
    ck_assert_str_eq(kvd_client_socket_path(cli), kvt_d.socket);
    ck_assert(kvd_client_connected(cli));
    ck_assert_int_ge(kvd_client_fd(cli), 0);
    kvd_client_destroy(&cli);
    ck_assert_ptr_null(cli);
    kvd_client_destroy(&cli); /* NULL is fine */
    kvd_client_destroy(NULL);
}
END_TEST

START_TEST(test_ping_payloads)
{
    kvd_client_t *cli = kvt_connect("ping-test");
    size_t sizes[] = {0, 1, 100, 4096, 1 << 20};
    uint8_t *buf = malloc(1 << 20);

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        kvt_fill(buf, sizes[i], i);
        KVT_OK(cli, kvd_ping(cli, sizes[i] ? buf : NULL, sizes[i]));
    }
    free(buf);
    kvd_client_destroy(&cli);
}
END_TEST

START_TEST(test_status_and_stats)
{
    kvd_client_t *cli = kvt_connect("status-test");
    kvd_client_t *other = kvt_connect("status-other");
    kvd_daemon_status_t s;
    kvd_client_entry_t entries[64];
    kvd_daemon_stats_t ds;
    kvd_op_stats_t ops[64];
    kvd_stream_stats_t streams[16];
    bool seen_me = false, seen_other = false, seen_ping = false;

    KVT_OK(cli, kvd_ping(cli, "x", 1));
    KVT_OK(cli, kvd_daemon_status(cli, &s, entries, 64));
    ck_assert_int_eq(s.backend, KVD_BACKEND_CPU);
    ck_assert_str_ne(s.daemon_version, "");
    ck_assert_uint_ge(s.clients, 2);
    ck_assert_uint_ge(s.num_clients, 2);
    ck_assert(!s.shutting_down);
    for (size_t i = 0; i < s.num_clients && i < 64; i++) {
        if (entries[i].id == kvd_client_info(cli)->client_id) {
            ck_assert_str_eq(entries[i].name, "status-test");
            ck_assert_uint_eq(entries[i].pid, (unsigned)getpid());
            ck_assert_uint_eq(entries[i].uid, (unsigned)getuid());
            seen_me = true;
        }
        if (entries[i].id == kvd_client_info(other)->client_id) {
            ck_assert_str_eq(entries[i].name, "status-other");
            seen_other = true;
        }
    }
    ck_assert(seen_me && seen_other);
    /* No room for entries: the count still comes back. */
    KVT_OK(cli, kvd_daemon_status(cli, &s, NULL, 0));
    ck_assert_uint_ge(s.num_clients, 2);

    KVT_OK(cli, kvd_daemon_stats(cli, &ds, ops, 64, streams, 16));
    ck_assert_uint_ge(ds.connections, 2);
    ck_assert_uint_gt(ds.bytes_in, 0);
    ck_assert_uint_gt(ds.num_ops, 0);
    for (size_t i = 0; i < ds.num_ops && i < 64; i++) {
        uint64_t total = 0;

        ck_assert_uint_le(ops[i].num_bounds, KVD_HIST_MAX);
        for (uint32_t b = 0; b <= ops[i].num_bounds; b++)
            total += ops[i].counts[b];
        if (strcmp(ops[i].op, "ping") == 0) {
            seen_ping = true;
            ck_assert_uint_ge(ops[i].requests, 1);
            ck_assert_uint_ge(total, 1);
        }
    }
    ck_assert_msg(seen_ping, "stats has no ping entry");
    kvd_client_destroy(&other);
    kvd_client_destroy(&cli);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Pools                                                                     */

START_TEST(test_pool_create_list_export_drop)
{
    kvd_client_t *cli = kvt_connect("pool-test");
    kvt_pool_t a, b;
    kvd_pool_info_t list[64];
    size_t n = 0;
    bool seen_a = false, seen_b = false;
    kvd_mapping_t *again = NULL, *bare = NULL;

    kvt_pool_make(cli, &a, "pa", 4, 100, 40, false, 0);
    kvt_pool_make(cli, &b, "pb", 2, 32, 17, true, 16);
    ck_assert_uint_ne(a.info.id, b.info.id);
    ck_assert_uint_ge(a.info.v_offset, 100 * 40);
    ck_assert_uint_eq(a.info.owner, kvd_client_info(cli)->client_id);
    ck_assert_uint_eq(b.info.page_size, 16);

    KVT_OK(cli, kvd_pool_list(cli, list, 64, &n));
    ck_assert_uint_ge(n, 2);
    for (size_t i = 0; i < n && i < 64; i++) {
        if (list[i].id == a.info.id) {
            ck_assert_str_eq(list[i].name, a.info.name);
            ck_assert_uint_eq(list[i].bytes, a.info.bytes);
            ck_assert(!list[i].mla);
            seen_a = true;
        }
        if (list[i].id == b.info.id) {
            ck_assert(list[i].mla);
            seen_b = true;
        }
    }
    ck_assert(seen_a && seen_b);
    KVT_OK(cli, kvd_pool_list(cli, NULL, 0, &n));
    ck_assert_uint_ge(n, 2);

    /* A second export by name maps the same pages. */
    KVT_OK(cli, kvd_pool_export(cli, 0, a.info.name, 0, &again));
    ck_assert_ptr_ne(again->base, a.map->base);
    memset(a.map->base, 0x3c, 64);
    ck_assert_int_eq(((uint8_t *)again->base)[63], 0x3c);
    ((uint8_t *)again->base)[5] = 0x77;
    ck_assert_int_eq(((uint8_t *)a.map->base)[5], 0x77);
    ck_assert_ptr_eq(kvd_mapping_layer(again, 0, false), again->base);
    ck_assert_ptr_eq(kvd_mapping_layer(again, 1, true),
                     (uint8_t *)again->base + a.info.layer_stride + a.info.v_offset);
    ck_assert_ptr_null(kvd_mapping_layer(again, 4, false));
    kvd_mapping_destroy(&again);

    /* Export without mapping: the descriptor only. */
    KVT_OK(cli, kvd_pool_export(cli, b.info.id, NULL, KVD_EXPORT_NO_MAP, &bare));
    ck_assert_ptr_null(bare->base);
    ck_assert_int_ge(bare->fd, 0);
    ck_assert_ptr_null(kvd_mapping_layer(b.map, 0, true)); /* MLA has no V */
    kvd_mapping_destroy(&bare);

    /* Drop by id and by name; then they are gone. */
    kvd_mapping_destroy(&a.map);
    KVT_OK(cli, kvd_pool_drop(cli, a.info.id, NULL));
    kvd_mapping_destroy(&b.map);
    KVT_OK(cli, kvd_pool_drop(cli, 0, b.info.name));
    KVT_ERR(cli, kvd_pool_export(cli, a.info.id, NULL, 0, &again), KVD_ENOENT);
    KVT_ERR(cli, kvd_pool_drop(cli, 0, b.info.name), KVD_ENOENT);
    KVT_OK(cli, kvd_pool_list(cli, list, 64, &n));
    for (size_t i = 0; i < n && i < 64; i++)
        ck_assert(list[i].id != a.info.id && list[i].id != b.info.id);
    kvd_client_destroy(&cli);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Store                                                                     */

static void store_case(bool mla, bool via_buffers, uint64_t seed)
{
    kvd_client_t *cli = kvt_connect("store-test");
    const uint32_t L = 3;
    const uint64_t S = 64, B = 48, T = 10, stride = via_buffers ? 64 : 48;
    const int64_t loc[10] = {5, 63, 0, -1, 17, 33, 2, 9, 60, 1};
    kvt_pool_t p;
    uint8_t *k = malloc(T * stride), *v = malloc(T * stride), *ref;
    kvd_kv_store_t a;
    kvd_op_result_t res;
    kvd_store_args_t r;
    kvd_mapping_t *kb = NULL, *vb = NULL, *lb = NULL;
    uint64_t kbuf = 0, vbuf = 0, lbuf = 0;

    kvt_pool_make(cli, &p, mla ? "st-mla" : "st-mha", L, S, B, mla, 0);
    memset(p.map->base, 0xa5, p.map->bytes);
    kvt_fill(k, T * stride, seed);
    kvt_fill(v, T * stride, seed + 1);

    memset(&a, 0, sizeof(a));
    a.pool = p.info.id;
    a.layer = 1;
    a.src_stride = stride;
    if (via_buffers) {
        /* K, V and the slots in registered buffers, written through their
         * mappings; loc as int32 at an offset. */
        int32_t *l32;

        KVT_OK(cli, kvd_buffer_register(cli, T * stride, KVD_MEM_HOST, "k", &kbuf, &kb));
        KVT_OK(cli, kvd_buffer_register(cli, T * stride + 100, KVD_MEM_HOST, "v", &vbuf, &vb));
        KVT_OK(cli, kvd_buffer_register(cli, 8 + T * 4, KVD_MEM_HOST, "loc", &lbuf, &lb));
        ck_assert_uint_ne(kbuf, 0);
        ck_assert_uint_eq(kb->buffer, kbuf);
        ck_assert_uint_ge(kb->bytes, T * stride);
        memcpy(kb->base, k, T * stride);
        memcpy((uint8_t *)vb->base + 100, v, T * stride);
        l32 = (int32_t *)((uint8_t *)lb->base + 8);
        for (uint64_t i = 0; i < T; i++)
            l32[i] = (int32_t)loc[i];
        a.loc.buffer = lbuf;
        a.loc.offset = 8;
        a.loc.count = T;
        a.loc.dtype = KVD_DTYPE_I32;
        a.k.buffer = kbuf;
        a.k.bytes = T * stride;
        if (!mla) {
            a.v.buffer = vbuf;
            a.v.offset = 100;
            a.v.bytes = T * stride;
        }
    } else {
        a.loc.values = loc;
        a.loc.count = T;
        a.k.data = k;
        a.k.bytes = T * stride;
        if (!mla) {
            a.v.data = v;
            a.v.bytes = T * stride;
        }
    }
    ref = kvt_snapshot(&p);
    KVT_OK(cli, kvd_kv_store(cli, &a, NULL, &res));
    ck_assert(!res.enqueued);
    ck_assert_uint_eq(res.skipped_oob, 0);

    memset(&r, 0, sizeof(r));
    r.k_src = k;
    r.v_src = mla ? NULL : v;
    r.k_src_stride = (int64_t)stride;
    r.v_src_stride = (int64_t)stride;
    r.k_dst = kvt_layer(&p, ref, 1, false);
    r.v_dst = mla ? NULL : kvt_layer(&p, ref, 1, true);
    r.k_dst_stride = (int64_t)p.info.slot_stride;
    r.v_dst_stride = (int64_t)p.info.slot_stride;
    r.num_slots = (int64_t)S;
    r.loc = loc;
    r.loc_dtype = KVD_DTYPE_I64;
    r.num_tokens = (int64_t)T;
    r.row_bytes = (int64_t)B;
    ck_assert_int_eq(kvd_cpu_kv_store(&r, NULL), KVD_OK);
    kvt_expect_bytes(p.map->base, ref, p.map->bytes, "pool after store");

    if (via_buffers) {
        kvd_mapping_destroy(&kb);
        kvd_mapping_destroy(&vb);
        kvd_mapping_destroy(&lb);
        KVT_OK(cli, kvd_buffer_drop(cli, kbuf));
        KVT_OK(cli, kvd_buffer_drop(cli, vbuf));
        KVT_OK(cli, kvd_buffer_drop(cli, lbuf));
        KVT_ERR(cli, kvd_buffer_drop(cli, lbuf), KVD_ENOENT);
    }
    free(ref);
    free(k);
    free(v);
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
}

START_TEST(test_store_mha_inline)
{
    store_case(false, false, 11);
}
END_TEST
START_TEST(test_store_mla_inline)
{
    store_case(true, false, 12);
}
END_TEST
START_TEST(test_store_mha_buffers)
{
    store_case(false, true, 13);
}
END_TEST
START_TEST(test_store_mla_buffers)
{
    store_case(true, true, 14);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* FP8 set                                                                   */

static uint16_t to_bf16(float f)
{
    uint32_t u;

    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static uint16_t to_f16(float f)
{
    /* Values here are small integers and halves: exact in f16. */
    uint32_t u;
    uint32_t sign, exp, mant;

    memcpy(&u, &f, 4);
    sign = (u >> 16) & 0x8000;
    if ((u & 0x7fffffff) == 0)
        return (uint16_t)sign;
    exp = ((u >> 23) & 0xff) - 127 + 15;
    mant = (u >> 13) & 0x3ff;
    return (uint16_t)(sign | (exp << 10) | mant);
}

static void fp8_case(int src_dtype, int cache_dtype, int scale_mode, uint32_t page)
{
    kvd_client_t *cli = kvt_connect("fp8-test");
    const uint32_t H = 4, D = 24, L = 2;
    const uint64_t S = 40, T = 7;
    const int64_t loc[7] = {3, 39, -1, 0, 21, 8, 30};
    size_t es = kvd_dtype_size(src_dtype);
    size_t n = (size_t)(T * H * D);
    uint8_t *k = malloc(n * es), *v = malloc(n * es), *ref;
    float hk[4] = {0.5f, 1.0f, 2.0f, 4.0f}, hv[4] = {3.0f, 0.25f, 1.0f, 8.0f};
    kvt_pool_t p;
    kvd_kv_fp8_set_t a;
    kvd_fp8_set_args_t r;
    uint8_t rnd[4096];

    kvt_fill(rnd, sizeof(rnd),
             (uint64_t)src_dtype * 100 + (uint64_t)cache_dtype * 10 + (uint64_t)scale_mode);
    for (size_t i = 0; i < n; i++) {
        /* Halves in [-600, 600): some saturate e4m3. */
        float fk = ((float)((rnd[i % 4096] << 4) | (rnd[(i * 7) % 4096] & 15)) - 2048.0f) * 0.5f *
                   (600.0f / 1024.0f);
        float fv = ((float)rnd[(i * 13 + 5) % 4096] - 128.0f) * 0.5f;

        fk = roundf(fk * 2.0f) / 2.0f;
        if (src_dtype == KVD_DTYPE_F32) {
            memcpy(k + i * 4, &fk, 4);
            memcpy(v + i * 4, &fv, 4);
        } else if (src_dtype == KVD_DTYPE_BF16) {
            uint16_t bk = to_bf16(fk), bv = to_bf16(fv);

            memcpy(k + i * 2, &bk, 2);
            memcpy(v + i * 2, &bv, 2);
        } else {
            uint16_t hk16 = to_f16(fk), hv16 = to_f16(fv);

            memcpy(k + i * 2, &hk16, 2);
            memcpy(v + i * 2, &hv16, 2);
        }
    }
    kvt_pool_make(cli, &p, "fp8", L, S, (uint64_t)H * D, false, page);
    memset(p.map->base, 0x5a, p.map->bytes);
    ref = kvt_snapshot(&p);

    memset(&a, 0, sizeof(a));
    a.pool = p.info.id;
    a.layer = 1;
    a.loc.values = loc;
    a.loc.count = T;
    a.k.data = k;
    a.k.bytes = n * es;
    a.v.data = v;
    a.v.bytes = n * es;
    a.src_dtype = src_dtype;
    a.cache_dtype = cache_dtype;
    a.num_heads = H;
    a.head_dim = D;
    a.scale_mode = scale_mode;
    a.k_scale = 2.0f;
    a.v_scale = 0.5f;
    a.k_head_scales = hk;
    a.v_head_scales = hv;
    KVT_OK(cli, kvd_kv_fp8_set(cli, &a, NULL, NULL));

    memset(&r, 0, sizeof(r));
    r.k_src = k;
    r.v_src = v;
    r.src_dtype = src_dtype;
    r.k_src_token_stride = (int64_t)(H * D * es);
    r.k_src_head_stride = (int64_t)(D * es);
    r.v_src_token_stride = r.k_src_token_stride;
    r.v_src_head_stride = r.k_src_head_stride;
    r.k_cache = kvt_layer(&p, ref, 1, false);
    r.v_cache = kvt_layer(&p, ref, 1, true);
    r.cache_dtype = cache_dtype;
    r.page_size = 1;
    r.k_slot_stride = (int64_t)p.info.slot_stride;
    r.k_page_stride = r.k_slot_stride;
    r.k_head_stride = D;
    r.v_slot_stride = r.k_slot_stride;
    r.v_page_stride = r.k_slot_stride;
    r.v_head_stride = D;
    r.num_slots = (int64_t)S;
    r.num_heads = H;
    r.head_dim = D;
    r.loc = loc;
    r.loc_dtype = KVD_DTYPE_I64;
    r.num_tokens = (int64_t)T;
    if (scale_mode == KVD_FP8_SCALE_TENSOR) {
        r.scale_mode = KVD_SCALE_HOST;
        r.k_scale = 2.0f;
        r.v_scale = 0.5f;
    } else if (scale_mode == KVD_FP8_SCALE_PER_HEAD) {
        r.scale_mode = KVD_SCALE_PER_HEAD;
        r.k_scale_ptr = hk;
        r.v_scale_ptr = hv;
    } else {
        r.scale_mode = KVD_SCALE_NONE;
    }
    ck_assert_int_eq(kvd_cpu_fp8_set(&r, NULL), KVD_OK);
    kvt_expect_bytes(p.map->base, ref, p.map->bytes, "pool after fp8 set");

    free(ref);
    free(k);
    free(v);
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
}

START_TEST(test_fp8_f32_e4m3_none)
{
    fp8_case(KVD_DTYPE_F32, KVD_DTYPE_E4M3, KVD_FP8_SCALE_NONE, 0);
}
END_TEST
START_TEST(test_fp8_bf16_e4m3_tensor)
{
    fp8_case(KVD_DTYPE_BF16, KVD_DTYPE_E4M3, KVD_FP8_SCALE_TENSOR, 8);
}
END_TEST
START_TEST(test_fp8_f16_e5m2_per_head)
{
    fp8_case(KVD_DTYPE_F16, KVD_DTYPE_E5M2, KVD_FP8_SCALE_PER_HEAD, 0);
}
END_TEST
START_TEST(test_fp8_f32_e5m2_tensor)
{
    fp8_case(KVD_DTYPE_F32, KVD_DTYPE_E5M2, KVD_FP8_SCALE_TENSOR, 4);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Page-table gather                                                         */

static void gather_case(int dtype, bool idx_in_buffer)
{
    kvd_client_t *cli = kvt_connect("gather-test");
    const uint64_t R = 6, C = 8, BS = 4, MAXP = 10;
    const uint32_t page = 4;
    const int64_t rows[4] = {3, 0, -1, 5};
    const int64_t lens[4] = {17, 1, 5, 64};
    size_t es = kvd_dtype_size(dtype);
    uint64_t tbuf, obuf, ibuf = 0;
    kvd_mapping_t *tm = NULL, *om = NULL, *im = NULL;
    uint8_t *expect;
    kvd_page_table_gather_t a;
    kvd_gather_args_t r;
    kvd_op_result_t res;

    KVT_OK(cli, kvd_buffer_register(cli, R * C * es, KVD_MEM_HOST, "table", &tbuf, &tm));
    KVT_OK(cli, kvd_buffer_register(cli, 16 + BS * MAXP * es, KVD_MEM_HOST, "out", &obuf, &om));
    kvt_fill(tm->base, R * C * es, (uint64_t)dtype);
    memset(om->base, 0x6b, om->bytes);
    expect = malloc(om->bytes);
    memcpy(expect, om->base, om->bytes);

    memset(&a, 0, sizeof(a));
    a.req_to_page.buffer = tbuf;
    a.req_to_page.bytes = R * C * es;
    a.table_dtype = dtype;
    a.table_rows = R;
    a.table_cols = C;
    a.out.buffer = obuf;
    a.out.offset = 16;
    a.out.bytes = BS * MAXP * es;
    a.max_num_pages = MAXP;
    a.page_size = page;
    a.dummy_slot = -7;
    if (idx_in_buffer) {
        int32_t *p32;

        KVT_OK(cli, kvd_buffer_register(cli, 2 * BS * 4, KVD_MEM_HOST, "idx", &ibuf, &im));
        p32 = im->base;
        for (uint64_t i = 0; i < BS; i++) {
            p32[i] = (int32_t)rows[i];
            p32[BS + i] = (int32_t)lens[i];
        }
        a.req_pool_indices.buffer = ibuf;
        a.req_pool_indices.count = BS;
        a.req_pool_indices.dtype = KVD_DTYPE_I32;
        a.seq_lens.buffer = ibuf;
        a.seq_lens.offset = BS * 4;
        a.seq_lens.count = BS;
        a.seq_lens.dtype = KVD_DTYPE_I32;
    } else {
        a.req_pool_indices.values = rows;
        a.req_pool_indices.count = BS;
        a.seq_lens.values = lens;
        a.seq_lens.count = BS;
    }
    KVT_OK(cli, kvd_page_table_gather(cli, &a, NULL, &res));

    memset(&r, 0, sizeof(r));
    r.req_to_page = tm->base;
    r.table_dtype = dtype;
    r.table_rows = (int64_t)R;
    r.table_cols = (int64_t)C;
    r.table_stride = (int64_t)(C * es);
    r.req_pool_indices = rows;
    r.req_dtype = KVD_DTYPE_I64;
    r.seq_lens = lens;
    r.seq_lens_dtype = KVD_DTYPE_I64;
    r.out = expect + 16;
    r.out_stride = (int64_t)(MAXP * es);
    r.bs = (int64_t)BS;
    r.max_num_pages = (int64_t)MAXP;
    r.page_size = page;
    r.dummy_slot = -7;
    ck_assert_int_eq(kvd_cpu_page_table_gather(&r, NULL), KVD_OK);
    kvt_expect_bytes(om->base, expect, om->bytes, "gather output buffer");

    free(expect);
    kvd_mapping_destroy(&tm);
    kvd_mapping_destroy(&om);
    kvd_mapping_destroy(&im);
    KVT_OK(cli, kvd_buffer_drop(cli, tbuf));
    KVT_OK(cli, kvd_buffer_drop(cli, obuf));
    if (ibuf)
        KVT_OK(cli, kvd_buffer_drop(cli, ibuf));
    kvd_client_destroy(&cli);
}

START_TEST(test_gather_i32_inline)
{
    gather_case(KVD_DTYPE_I32, false);
}
END_TEST
START_TEST(test_gather_i64_inline)
{
    gather_case(KVD_DTYPE_I64, false);
}
END_TEST
START_TEST(test_gather_i32_buffers)
{
    gather_case(KVD_DTYPE_I32, true);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Transfers between daemon-owned host pools                                 */

typedef enum { ONE_LAYER, LAYER_RANGE, ALL_LAYERS } span_t;

static void side_of(const kvt_pool_t *p, uint8_t *base, uint32_t first, kvd_kv_side_t *s)
{
    memset(s, 0, sizeof(*s));
    s->k = kvt_layer(p, base, first, false);
    s->v = p->info.mla ? NULL : kvt_layer(p, base, first, true);
    s->layer_stride = (int64_t)p->info.layer_stride;
    s->slot_stride = (int64_t)p->info.slot_stride;
    s->num_slots = (int64_t)p->info.num_slots;
}

/* idx: inline I64, inline I32 src with I64 dst or I64 src with I32 dst
 * (the daemon widens the I32 side), or both in a registered buffer */
typedef enum { IDX_INLINE, IDX_INLINE_MIXED, IDX_INLINE_MIXED_DST, IDX_BUFFER } idx_form_t;

static void transfer_case(bool mla, span_t span, idx_form_t idx)
{
    kvd_client_t *cli = kvt_connect("transfer-test");
    const uint32_t L = 4;
    const uint64_t S = 50, B = 36, N = 9;
    const int64_t src[9] = {0, 5, 49, -1, 7, 8, 9, 30, 31};
    const int64_t dst[9] = {10, 11, 12, 13, -1, 0, 49, 20, 19};
    int32_t src32[9], dst32[9];
    kvt_pool_t ps, pd;
    uint8_t *ref_src, *ref_dst;
    kvd_kv_transfer_t a;
    kvd_transfer_args_t r;
    kvd_op_result_t res;
    kvd_mapping_t *im = NULL;
    uint64_t ibuf = 0;
    uint32_t first = 0, count = L;

    kvt_pool_make(cli, &ps, mla ? "tx-src-mla" : "tx-src", L, S, B, mla, 0);
    kvt_pool_make(cli, &pd, mla ? "tx-dst-mla" : "tx-dst", L, S + 7, B, mla, 0);
    kvt_fill(ps.map->base, ps.map->bytes, 77 + (uint64_t)span);
    memset(pd.map->base, 0xc3, pd.map->bytes);
    ref_src = kvt_snapshot(&ps);
    ref_dst = kvt_snapshot(&pd);

    memset(&a, 0, sizeof(a));
    a.src_pool = ps.info.id;
    a.dst_pool = pd.info.id;
    if (span == ONE_LAYER) {
        first = 2;
        count = 1;
        a.layer_begin = 2;
    } else if (span == LAYER_RANGE) {
        first = 1;
        count = 2;
        a.layer_begin = 1;
        a.layer_count = 2;
    } else {
        a.all_layers = true;
    }
    if (idx == IDX_BUFFER) {
        int64_t *p64;

        KVT_OK(cli, kvd_buffer_register(cli, 2 * N * 8, KVD_MEM_HOST, "tx-idx", &ibuf, &im));
        p64 = im->base;
        memcpy(p64, src, sizeof(src));
        memcpy(p64 + N, dst, sizeof(dst));
        a.src.buffer = ibuf;
        a.src.count = N;
        a.src.dtype = KVD_DTYPE_I64;
        a.dst.buffer = ibuf;
        a.dst.offset = N * 8;
        a.dst.count = N;
        a.dst.dtype = KVD_DTYPE_I64;
    } else {
        a.src.values = src;
        a.src.count = N;
        a.dst.values = dst;
        a.dst.count = N;
        if (idx == IDX_INLINE_MIXED) {
            for (uint64_t i = 0; i < N; i++)
                src32[i] = (int32_t)src[i];
            a.src.values = src32;
            a.src.dtype = KVD_DTYPE_I32;
            a.dst.dtype = KVD_DTYPE_I64;
        } else if (idx == IDX_INLINE_MIXED_DST) {
            for (uint64_t i = 0; i < N; i++)
                dst32[i] = (int32_t)dst[i];
            a.dst.values = dst32;
            a.dst.dtype = KVD_DTYPE_I32;
        }
    }
    KVT_OK(cli, kvd_kv_transfer(cli, &a, NULL, &res));
    ck_assert_uint_eq(res.skipped_oob, 0);

    memset(&r, 0, sizeof(r));
    side_of(&ps, ref_src, first, &r.src);
    side_of(&pd, ref_dst, first, &r.dst);
    r.num_layers = count;
    r.src_idx = src;
    r.dst_idx = dst;
    r.idx_dtype = KVD_DTYPE_I64;
    r.count = (int64_t)N;
    r.row_bytes = (int64_t)B;
    ck_assert_int_eq(kvd_cpu_kv_transfer(&r, NULL), KVD_OK);
    kvt_expect_bytes(pd.map->base, ref_dst, pd.map->bytes, "destination pool");
    kvt_expect_bytes(ps.map->base, ref_src, ps.map->bytes, "source pool (unchanged)");

    if (ibuf) {
        kvd_mapping_destroy(&im);
        KVT_OK(cli, kvd_buffer_drop(cli, ibuf));
    }
    free(ref_src);
    free(ref_dst);
    kvt_pool_free(cli, &ps);
    kvt_pool_free(cli, &pd);
    kvd_client_destroy(&cli);
}

START_TEST(test_transfer_mha_one_layer)
{
    transfer_case(false, ONE_LAYER, IDX_INLINE);
}
END_TEST
START_TEST(test_transfer_mha_range)
{
    transfer_case(false, LAYER_RANGE, IDX_INLINE);
}
END_TEST
START_TEST(test_transfer_mha_all)
{
    transfer_case(false, ALL_LAYERS, IDX_INLINE);
}
END_TEST
START_TEST(test_transfer_mha_range_i32_src)
{
    transfer_case(false, LAYER_RANGE, IDX_INLINE_MIXED);
}
END_TEST
START_TEST(test_transfer_mla_all_i32_dst)
{
    transfer_case(true, ALL_LAYERS, IDX_INLINE_MIXED_DST);
}
END_TEST
START_TEST(test_transfer_mla_one_layer)
{
    transfer_case(true, ONE_LAYER, IDX_INLINE);
}
END_TEST
START_TEST(test_transfer_mla_all)
{
    transfer_case(true, ALL_LAYERS, IDX_INLINE);
}
END_TEST
START_TEST(test_transfer_mha_all_idx_buffer)
{
    transfer_case(false, ALL_LAYERS, IDX_BUFFER);
}
END_TEST
START_TEST(test_transfer_mla_range_idx_buffer)
{
    transfer_case(true, LAYER_RANGE, IDX_BUFFER);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Imported host memory: descriptors from the client to the daemon           */

/*
 * The client's own memfd, laid out its own way (slot stride with padding,
 * K and V of each layer in two regions, layers in reverse order), imported
 * as a pool; the daemon moves data between it and a daemon-owned pool in
 * both directions.
 */
static void import_case(bool mla)
{
    kvd_client_t *cli = kvt_connect("import-test");
    const uint32_t L = 3;
    const uint64_t S = 40, B = 24, SS = 32; /* slot stride > slot bytes */
    const uint64_t layer_bytes = S * SS;
    kvd_mapping_t *km = NULL, *vm = NULL;
    kvd_import_region_t regions[2];
    kvd_memref_t kref[3], vref[3];
    kvd_pool_import_t imp;
    kvd_pool_info_t info;
    kvt_pool_t dp;
    uint8_t *expect_k, *expect_v;
    const int64_t src[6] = {0, 1, 2, 39, 20, -1};
    const int64_t dst[6] = {39, 0, 5, 6, 7, 8};
    kvd_kv_transfer_t a;
    char name[64];

    KVT_OK(NULL, kvd_mapping_create_host(L * layer_bytes, &km));
    KVT_OK(NULL, kvd_mapping_create_host(L * layer_bytes + 4096, &vm));
    ck_assert_int_ge(km->fd, 0);
    memset(km->base, 0x11, km->bytes);
    memset(vm->base, 0x22, vm->bytes);
    KVT_OK(NULL, kvd_import_region_from_mapping(km, &regions[0]));
    KVT_OK(NULL, kvd_import_region_from_mapping(vm, &regions[1]));
    for (uint32_t l = 0; l < L; l++) {
        kref[l].region = 0;
        kref[l].offset = (L - 1 - l) * layer_bytes;
        vref[l].region = 1;
        vref[l].offset = 4096 + l * layer_bytes;
    }
    snprintf(name, sizeof(name), "imported-%d-%d", (int)getpid(), (int)mla);
    memset(&imp, 0, sizeof(imp));
    imp.name = name;
    imp.num_layers = L;
    imp.num_slots = S;
    imp.slot_bytes = B;
    imp.slot_stride = SS;
    imp.mla = mla;
    imp.regions = regions;
    imp.num_regions = mla ? 1 : 2;
    imp.k_layers = kref;
    imp.v_layers = mla ? NULL : vref;
    KVT_OK(cli, kvd_pool_import(cli, &imp, &info));
    ck_assert(info.imported);
    ck_assert_uint_eq(info.num_slots, S);
    ck_assert_uint_eq(info.slot_bytes, B);
    /* an import's size is its regions' */
    ck_assert_uint_eq(info.bytes, regions[0].bytes + (mla ? 0 : regions[1].bytes));

    /* Client writes the daemon's pool through its mapping; the daemon
     * moves the rows into the client's memory (offload) ... */
    kvt_pool_make(cli, &dp, mla ? "imp-peer-mla" : "imp-peer", L, S, B, mla, 0);
    kvt_fill(dp.map->base, dp.map->bytes, 5150 + (uint64_t)mla);
    memset(&a, 0, sizeof(a));
    a.src_pool = dp.info.id;
    a.dst_pool = info.id;
    a.src.values = src;
    a.src.count = 6;
    a.dst.values = dst;
    a.dst.count = 6;
    a.all_layers = true;
    KVT_OK(cli, kvd_kv_transfer(cli, &a, NULL, NULL));

    expect_k = malloc(km->bytes);
    expect_v = malloc(vm->bytes);
    memset(expect_k, 0x11, km->bytes);
    memset(expect_v, 0x22, vm->bytes);
    for (uint32_t l = 0; l < L; l++) {
        for (int i = 0; i < 6; i++) {
            if (src[i] < 0 || dst[i] < 0)
                continue;
            memcpy(expect_k + kref[l].offset + (uint64_t)dst[i] * SS,
                   kvt_layer(&dp, dp.map->base, l, false) + (uint64_t)src[i] * dp.info.slot_stride,
                   B);
            if (!mla)
                memcpy(expect_v + vref[l].offset + (uint64_t)dst[i] * SS,
                       kvt_layer(&dp, dp.map->base, l, true) +
                           (uint64_t)src[i] * dp.info.slot_stride,
                       B);
        }
    }
    kvt_expect_bytes(km->base, expect_k, km->bytes, "imported K region after offload");
    kvt_expect_bytes(vm->base, expect_v, vm->bytes, "imported V region after offload");

    /* ... and back (reload) into fresh slots of the daemon's pool. */
    {
        uint8_t *ref = kvt_snapshot(&dp);
        const int64_t back_src[3] = {39, 0, 5};
        const int64_t back_dst[3] = {45 % S, 33, 34};

        memset(&a, 0, sizeof(a));
        a.src_pool = info.id;
        a.dst_pool = dp.info.id;
        a.src.values = back_src;
        a.src.count = 3;
        a.dst.values = back_dst;
        a.dst.count = 3;
        a.all_layers = true;
        KVT_OK(cli, kvd_kv_transfer(cli, &a, NULL, NULL));
        for (uint32_t l = 0; l < L; l++) {
            for (int i = 0; i < 3; i++) {
                memcpy(kvt_layer(&dp, ref, l, false) + (uint64_t)back_dst[i] * dp.info.slot_stride,
                       (uint8_t *)km->base + kref[l].offset + (uint64_t)back_src[i] * SS, B);
                if (!mla)
                    memcpy(kvt_layer(&dp, ref, l, true) +
                               (uint64_t)back_dst[i] * dp.info.slot_stride,
                           (uint8_t *)vm->base + vref[l].offset + (uint64_t)back_src[i] * SS, B);
            }
        }
        kvt_expect_bytes(dp.map->base, ref, dp.map->bytes, "daemon pool after reload");
        free(ref);
    }

    /* The daemon keeps its own reference: unmapping here changes nothing
     * for it, and dropping the pool works. */
    KVT_OK(cli, kvd_pool_drop(cli, info.id, NULL));
    free(expect_k);
    free(expect_v);
    kvd_mapping_destroy(&km);
    kvd_mapping_destroy(&vm);
    kvt_pool_free(cli, &dp);
    kvd_client_destroy(&cli);
}

START_TEST(test_import_host_mha)
{
    import_case(false);
}
END_TEST
START_TEST(test_import_host_mla)
{
    import_case(true);
}
END_TEST

/* Store straight into an imported pool, checked in the client's memory. */
START_TEST(test_store_into_imported)
{
    kvd_client_t *cli = kvt_connect("import-store");
    kvd_mapping_t *m = NULL;
    kvd_import_region_t reg;
    kvd_memref_t k[1] = {{0, 128}}, v[1] = {{0, 128 + 16 * 20}};
    kvd_pool_import_t imp;
    kvd_pool_info_t info;
    const int64_t loc[3] = {15, 0, 7};
    uint8_t kd[3 * 20], vd[3 * 20], *expect;
    kvd_kv_store_t a;

    KVT_OK(NULL, kvd_mapping_create_host(4096, &m));
    memset(m->base, 0, m->bytes);
    KVT_OK(NULL, kvd_import_region_from_mapping(m, &reg));
    memset(&imp, 0, sizeof(imp));
    imp.name = "imported-store";
    imp.num_layers = 1;
    imp.num_slots = 16;
    imp.slot_bytes = 20;
    imp.regions = &reg;
    imp.num_regions = 1;
    imp.k_layers = k;
    imp.v_layers = v;
    KVT_OK(cli, kvd_pool_import(cli, &imp, &info));
    kvt_fill(kd, sizeof(kd), 1);
    kvt_fill(vd, sizeof(vd), 2);
    memset(&a, 0, sizeof(a));
    a.pool = info.id;
    a.loc.values = loc;
    a.loc.count = 3;
    a.k.data = kd;
    a.k.bytes = sizeof(kd);
    a.v.data = vd;
    a.v.bytes = sizeof(vd);
    KVT_OK(cli, kvd_kv_store(cli, &a, NULL, NULL));
    expect = calloc(1, m->bytes);
    for (int i = 0; i < 3; i++) {
        memcpy(expect + 128 + loc[i] * 20, kd + i * 20, 20);
        memcpy(expect + 128 + 16 * 20 + loc[i] * 20, vd + i * 20, 20);
    }
    kvt_expect_bytes(m->base, expect, m->bytes, "imported memory after store");
    free(expect);
    KVT_OK(cli, kvd_pool_drop(cli, 0, "imported-store"));
    kvd_mapping_destroy(&m);
    kvd_client_destroy(&cli);
}
END_TEST

/* Per-head scales: an MLA pool takes k_head_scales alone; an MHA pool
 * without v_head_scales is the daemon's ESHAPE, not the client's ENULL. */
START_TEST(test_fp8_per_head_v_scales_optional)
{
    kvd_client_t *cli = kvt_connect("fp8-scales-test");
    kvt_pool_t mla, mha;
    int64_t loc[2] = {0, 3};
    float src[2 * 2 * 4] = {1.0f, 2.0f, -1.0f, 0.5f};
    float hs[2] = {2.0f, 0.5f};
    kvd_kv_fp8_set_t a;

    kvt_pool_make(cli, &mla, "fp8-hs-mla", 1, 8, 2 * 4, true, 0);
    kvt_pool_make(cli, &mha, "fp8-hs-mha", 1, 8, 2 * 4, false, 0);
    memset(&a, 0, sizeof(a));
    a.pool = mla.info.id;
    a.loc.values = loc;
    a.loc.count = 2;
    a.k.data = src;
    a.k.bytes = sizeof(src);
    a.src_dtype = KVD_DTYPE_F32;
    a.cache_dtype = KVD_DTYPE_E4M3;
    a.num_heads = 2;
    a.head_dim = 4;
    a.scale_mode = KVD_FP8_SCALE_PER_HEAD;
    a.k_head_scales = hs;
    KVT_OK(cli, kvd_kv_fp8_set(cli, &a, NULL, NULL));
    a.pool = mha.info.id;
    a.v.data = src;
    a.v.bytes = sizeof(src);
    KVT_ERR(cli, kvd_kv_fp8_set(cli, &a, NULL, NULL), KVD_ESHAPE);
    a.v_head_scales = hs;
    KVT_OK(cli, kvd_kv_fp8_set(cli, &a, NULL, NULL));
    a.k_head_scales = NULL;
    KVT_ERR(cli, kvd_kv_fp8_set(cli, &a, NULL, NULL), KVD_ENULL);
    kvt_pool_free(cli, &mla);
    kvt_pool_free(cli, &mha);
    kvd_client_destroy(&cli);
}
END_TEST

/* Events need CUDA: the cpu backend refuses them; the library has no
 * handle to take either when built without CUDA. */
START_TEST(test_events_on_cpu_backend)
{
    kvd_client_t *cli = kvt_connect("event-test");
    uint8_t handle[KVD_IPC_HANDLE_BYTES] = {0};
    uint64_t id = 0;
    kvd_status_t st = kvd_event_register(cli, handle, &id);

    ck_assert_msg(st == KVD_ENOTSUP, "event_register on cpu: %s: %s", kvd_err_name(st),
                  kvd_client_last_error(cli));
    KVT_ERR(cli, kvd_event_drop(cli, 12345), KVD_ENOENT);
    if (!kvd_client_has_cuda())
        KVT_ERR(NULL, kvd_event_ipc_handle((void *)handle, handle), KVD_ENOTSUP);
    KVT_OK(cli, kvd_ping(cli, NULL, 0));
    kvd_client_destroy(&cli);
}
END_TEST

static Suite *ops_suite(void)
{
    Suite *s = suite_create("client_ops");
    TCase *tc = tcase_create("ops");

    tcase_add_unchecked_fixture(tc, kvt_suite_setup, kvt_suite_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_hello_info);
    tcase_add_test(tc, test_ping_payloads);
    tcase_add_test(tc, test_status_and_stats);
    tcase_add_test(tc, test_pool_create_list_export_drop);
    tcase_add_test(tc, test_store_mha_inline);
    tcase_add_test(tc, test_store_mla_inline);
    tcase_add_test(tc, test_store_mha_buffers);
    tcase_add_test(tc, test_store_mla_buffers);
    tcase_add_test(tc, test_fp8_f32_e4m3_none);
    tcase_add_test(tc, test_fp8_bf16_e4m3_tensor);
    tcase_add_test(tc, test_fp8_f16_e5m2_per_head);
    tcase_add_test(tc, test_fp8_f32_e5m2_tensor);
    tcase_add_test(tc, test_fp8_per_head_v_scales_optional);
    tcase_add_test(tc, test_gather_i32_inline);
    tcase_add_test(tc, test_gather_i64_inline);
    tcase_add_test(tc, test_gather_i32_buffers);
    tcase_add_test(tc, test_transfer_mha_one_layer);
    tcase_add_test(tc, test_transfer_mha_range);
    tcase_add_test(tc, test_transfer_mha_range_i32_src);
    tcase_add_test(tc, test_transfer_mla_all_i32_dst);
    tcase_add_test(tc, test_transfer_mha_all);
    tcase_add_test(tc, test_transfer_mla_one_layer);
    tcase_add_test(tc, test_transfer_mla_all);
    tcase_add_test(tc, test_transfer_mha_all_idx_buffer);
    tcase_add_test(tc, test_transfer_mla_range_idx_buffer);
    tcase_add_test(tc, test_import_host_mha);
    tcase_add_test(tc, test_import_host_mla);
    tcase_add_test(tc, test_store_into_imported);
    tcase_add_test(tc, test_events_on_cpu_backend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ops_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
