/*
 * Invalid requests through libkvdock against the real kvdockd (cpu
 * backend): each kind gets its exact status code and a message, nothing
 * is written, and the connection stays usable (a ping and a valid store
 * succeed right after every one).
 */
#define _GNU_SOURCE /* memfd_create */
#include "testutil.h"

#include <sys/mman.h>

/* One connection with two pools and two buffers, checked after each bad
 * request. */
typedef struct fixture {
    kvd_client_t *cli;
    kvt_pool_t mha;   /* 2 layers x 16 slots x 32 bytes */
    kvt_pool_t mla;   /* 2 layers x 16 slots x 32 bytes */
    kvt_pool_t other; /* 2 layers x 16 slots x 48 bytes */
    kvt_pool_t fp8;   /* 1 layer x 8 slots x 4 heads x 8 dims */
    uint64_t buf;     /* 256 bytes */
    kvd_mapping_t *bufmap;
    uint8_t *snap; /* mha's bytes before the bad request */
} fixture_t;

static fixture_t f;

static void fx_setup(void)
{
    f.cli = kvt_connect("errors");
    kvt_pool_make(f.cli, &f.mha, "err-mha", 2, 16, 32, false, 0);
    kvt_pool_make(f.cli, &f.mla, "err-mla", 2, 16, 32, true, 0);
    kvt_pool_make(f.cli, &f.other, "err-other", 2, 16, 48, false, 0);
    kvt_pool_make(f.cli, &f.fp8, "err-fp8", 1, 8, 32, false, 0);
    KVT_OK(f.cli, kvd_buffer_register(f.cli, 256, KVD_MEM_HOST, "err-buf", &f.buf, &f.bufmap));
    kvt_fill(f.mha.map->base, f.mha.map->bytes, 4242);
    f.snap = kvt_snapshot(&f.mha);
}

/* After a bad request: nothing changed, and the connection still works. */
static void fx_teardown(void)
{
    const int64_t loc[2] = {1, 2};
    uint8_t rows[4 * 32];
    kvd_kv_store_t a;

    kvt_expect_bytes(f.mha.map->base, f.snap, f.mha.map->bytes, "pool after a refused request");
    ck_assert(kvd_client_connected(f.cli));
    KVT_OK(f.cli, kvd_ping(f.cli, "still here", 10));
    kvt_fill(rows, sizeof(rows), 1);
    memset(&a, 0, sizeof(a));
    a.pool = f.mha.info.id;
    a.loc.values = loc;
    a.loc.count = 2;
    a.k.data = rows;
    a.k.bytes = 64;
    a.v.data = rows + 64;
    a.v.bytes = 64;
    KVT_OK(f.cli, kvd_kv_store(f.cli, &a, NULL, NULL));
    kvt_expect_bytes((uint8_t *)f.mha.map->base + 2 * f.mha.info.slot_stride, rows + 32, 32,
                     "valid store after the error");
    free(f.snap);
    kvd_mapping_destroy(&f.bufmap);
    kvt_pool_free(f.cli, &f.mha);
    kvt_pool_free(f.cli, &f.mla);
    kvt_pool_free(f.cli, &f.other);
    kvt_pool_free(f.cli, &f.fp8);
    KVT_OK(f.cli, kvd_buffer_drop(f.cli, f.buf));
    kvd_client_destroy(&f.cli);
}

/* A valid MHA store of n rows into f.mha, to be spoiled by each test. */
static const int64_t good_loc[4] = {0, 3, 7, 15};
static uint8_t good_rows[2 * 4 * 48];

static kvd_kv_store_t good_store(void)
{
    kvd_kv_store_t a;

    kvt_fill(good_rows, sizeof(good_rows), 7);
    memset(&a, 0, sizeof(a));
    a.pool = f.mha.info.id;
    a.layer = 1;
    a.loc.values = good_loc;
    a.loc.count = 4;
    a.k.data = good_rows;
    a.k.bytes = 4 * 32;
    a.v.data = good_rows + 4 * 32;
    a.v.bytes = 4 * 32;
    return a;
}

static const int64_t tx_src[3] = {0, 1, 2};
static const int64_t tx_dst[3] = {5, 6, 7};

static kvd_kv_transfer_t good_transfer(void)
{
    kvd_kv_transfer_t t;

    memset(&t, 0, sizeof(t));
    t.src_pool = f.mha.info.id;
    t.dst_pool = f.mha.info.id;
    t.src.values = tx_src;
    t.src.count = 3;
    t.dst.values = tx_dst;
    t.dst.count = 3;
    /* dst pool swapped to the bad one by each test */
    return t;
}

/* ---- unknown ids -------------------------------------------------------- */

START_TEST(test_unknown_pool_store)
{
    kvd_kv_store_t a = good_store();

    a.pool = 987654321;
    KVT_ERR(f.cli, kvd_kv_store(f.cli, &a, NULL, NULL), KVD_ENOENT);
}
END_TEST

START_TEST(test_unknown_pool_transfer)
{
    kvd_kv_transfer_t t = good_transfer();

    t.dst_pool = 987654321;
    KVT_ERR(f.cli, kvd_kv_transfer(f.cli, &t, NULL, NULL), KVD_ENOENT);
}
END_TEST

START_TEST(test_unknown_pool_by_name)
{
    kvd_mapping_t *m = NULL;

    KVT_ERR(f.cli, kvd_pool_export(f.cli, 0, "no-such-pool", 0, &m), KVD_ENOENT);
    ck_assert_ptr_null(m);
    KVT_ERR(f.cli, kvd_pool_drop(f.cli, 0, "no-such-pool"), KVD_ENOENT);
}
END_TEST

START_TEST(test_unknown_buffer)
{
    kvd_kv_store_t a = good_store();

    a.k.data = NULL;
    a.k.buffer = 987654321;
    KVT_ERR(f.cli, kvd_kv_store(f.cli, &a, NULL, NULL), KVD_ENOENT);
    KVT_ERR(f.cli, kvd_buffer_drop(f.cli, 987654321), KVD_ENOENT);
}
END_TEST

START_TEST(test_unknown_index_buffer)
{
    kvd_kv_transfer_t t = good_transfer();

    t.dst_pool = f.mha.info.id;
    t.src.values = NULL;
    t.src.buffer = 987654321;
    t.src.dtype = KVD_DTYPE_I64;
    KVT_ERR(f.cli, kvd_kv_transfer(f.cli, &t, NULL, NULL), KVD_ENOENT);
}
END_TEST

/* ---- out of range ------------------------------------------------------- */

START_TEST(test_index_past_slots_store)
{
    kvd_kv_store_t a = good_store();
    const int64_t bad[4] = {0, 3, 16, 15}; /* 16 slots */

    a.loc.values = bad;
    KVT_ERR(f.cli, kvd_kv_store(f.cli, &a, NULL, NULL), KVD_ERANGE);
}
END_TEST

START_TEST(test_index_past_slots_transfer)
{
    kvd_kv_transfer_t t = good_transfer();
    const int64_t bad[3] = {5, 6, 1000};

    t.dst.values = bad;
    KVT_ERR(f.cli, kvd_kv_transfer(f.cli, &t, NULL, NULL), KVD_ERANGE);
}
END_TEST

START_TEST(test_layer_past_end)
{
    kvd_kv_store_t a = good_store();
    kvd_kv_transfer_t t = good_transfer();

    a.layer = 2; /* 2 layers */
    KVT_ERR(f.cli, kvd_kv_store(f.cli, &a, NULL, NULL), KVD_ERANGE);
    t.layer_begin = 1;
    t.layer_count = 2;
    KVT_ERR(f.cli, kvd_kv_transfer(f.cli, &t, NULL, NULL), KVD_ERANGE);
}
END_TEST

START_TEST(test_byte_range_past_buffer)
{
    kvd_kv_store_t a = good_store();

    a.k.data = NULL;
    a.k.buffer = f.buf;
    a.k.offset = 200; /* 200 + 128 > 256 */
    a.k.bytes = 128;
    KVT_ERR(f.cli, kvd_kv_store(f.cli, &a, NULL, NULL), KVD_ERANGE);
}
END_TEST

START_TEST(test_index_range_past_buffer)
{
    kvd_kv_transfer_t t = good_transfer();

    t.src.values = NULL;
    t.src.buffer = f.buf;
    t.src.offset = 240; /* 3 x 8 bytes from 240 > 256 */
    t.src.count = 3;
    t.src.dtype = KVD_DTYPE_I64;
    KVT_ERR(f.cli, kvd_kv_transfer(f.cli, &t, NULL, NULL), KVD_ERANGE);
}
END_TEST

START_TEST(test_gather_out_past_buffer)
{
    kvd_page_table_gather_t g;
    const int64_t rows[2] = {0, 1}, lens[2] = {4, 4};

    memset(&g, 0, sizeof(g));
    g.req_to_page.buffer = f.buf;
    g.req_to_page.bytes = 64;
    g.table_dtype = KVD_DTYPE_I32;
    g.table_rows = 2;
    g.table_cols = 8;
    g.req_pool_indices.values = rows;
    g.req_pool_indices.count = 2;
    g.seq_lens.values = lens;
    g.seq_lens.count = 2;
    g.out.buffer = f.buf;
    g.out.offset = 250;
    g.out.bytes = 2 * 8 * 4; /* past the end */
    g.max_num_pages = 8;
    g.page_size = 1;
    KVT_ERR(f.cli, kvd_page_table_gather(f.cli, &g, NULL, NULL), KVD_ERANGE);
}
END_TEST

/* ---- shape -------------------------------------------------------------- */

START_TEST(test_store_data_shape)
{
    kvd_kv_store_t a = good_store();

    a.k.bytes = 4 * 32 - 1;
    KVT_ERR(f.cli, kvd_kv_store(f.cli, &a, NULL, NULL), KVD_ESHAPE);
}
END_TEST

START_TEST(test_transfer_slot_bytes_mismatch)
{
    kvd_kv_transfer_t t = good_transfer();

    t.dst_pool = f.other.info.id; /* 48-byte slots vs 32 */
    KVT_ERR(f.cli, kvd_kv_transfer(f.cli, &t, NULL, NULL), KVD_ESHAPE);
}
END_TEST

START_TEST(test_transfer_mha_to_mla)
{
    kvd_kv_transfer_t t = good_transfer();

    t.dst_pool = f.mla.info.id;
    KVT_ERR(f.cli, kvd_kv_transfer(f.cli, &t, NULL, NULL), KVD_ESHAPE);
}
END_TEST

START_TEST(test_transfer_count_mismatch)
{
    kvd_kv_transfer_t t = good_transfer();

    t.dst.count = 2;
    KVT_ERR(f.cli, kvd_kv_transfer(f.cli, &t, NULL, NULL), KVD_ESHAPE);
}
END_TEST

/* A valid fp8 set of one token (4 heads x 8 f32) into the fp8 pool. */
static const int64_t fp8_loc[1] = {0};
static float fp8_src[2 * 4 * 8];

static kvd_kv_fp8_set_t good_fp8(void)
{
    kvd_kv_fp8_set_t a;

    memset(&a, 0, sizeof(a));
    a.pool = f.fp8.info.id;
    a.loc.values = fp8_loc;
    a.loc.count = 1;
    a.k.data = fp8_src;
    a.k.bytes = 4 * 8 * 4;
    a.v.data = fp8_src + 32;
    a.v.bytes = 4 * 8 * 4;
    a.src_dtype = KVD_DTYPE_F32;
    a.cache_dtype = KVD_DTYPE_E4M3;
    a.num_heads = 4;
    a.head_dim = 8;
    return a;
}

START_TEST(test_fp8_heads_mismatch)
{
    kvd_kv_fp8_set_t a = good_fp8();

    /* the unchanged request is accepted: the error below is the head_dim's */
    ck_assert_int_eq(kvd_kv_fp8_set(f.cli, &a, NULL, NULL), KVD_OK);
    a.head_dim = 16; /* 4 x 16 != 32-byte slots */
    KVT_ERR(f.cli, kvd_kv_fp8_set(f.cli, &a, NULL, NULL), KVD_ESHAPE);
}
END_TEST

/* ---- dtype -------------------------------------------------------------- */

START_TEST(test_fp8_cache_dtype)
{
    kvd_kv_fp8_set_t a = good_fp8();

    a.cache_dtype = KVD_DTYPE_F16; /* not an fp8 type */
    KVT_ERR(f.cli, kvd_kv_fp8_set(f.cli, &a, NULL, NULL), KVD_EDTYPE);
    a.cache_dtype = KVD_DTYPE_E4M3;
    a.src_dtype = KVD_DTYPE_I32; /* not a float source */
    KVT_ERR(f.cli, kvd_kv_fp8_set(f.cli, &a, NULL, NULL), KVD_EDTYPE);
}
END_TEST

START_TEST(test_gather_table_dtype)
{
    kvd_page_table_gather_t g;
    const int64_t rows[1] = {0}, lens[1] = {4};

    memset(&g, 0, sizeof(g));
    g.req_to_page.buffer = f.buf;
    g.req_to_page.bytes = 64;
    g.table_dtype = KVD_DTYPE_F32;
    g.table_rows = 2;
    g.table_cols = 8;
    g.req_pool_indices.values = rows;
    g.req_pool_indices.count = 1;
    g.seq_lens.values = lens;
    g.seq_lens.count = 1;
    g.out.buffer = f.buf;
    g.out.offset = 128;
    g.out.bytes = 32;
    g.max_num_pages = 8;
    g.page_size = 1;
    KVT_ERR(f.cli, kvd_page_table_gather(f.cli, &g, NULL, NULL), KVD_EDTYPE);
}
END_TEST

START_TEST(test_index_dtype_local)
{
    /* The library refuses index dtypes other than I32/I64 before sending. */
    kvd_kv_transfer_t t = good_transfer();

    t.src.values = NULL;
    t.src.buffer = f.buf;
    t.src.dtype = KVD_DTYPE_F32;
    KVT_ERR(f.cli, kvd_kv_transfer(f.cli, &t, NULL, NULL), KVD_EDTYPE);
}
END_TEST

START_TEST(test_null_arguments)
{
    /* Refused before anything is sent: each names what is missing, and the
     * connection goes on. */
    kvd_daemon_status_t ds;
    kvd_daemon_stats_t st;
    kvd_op_result_t r;
    kvd_kv_transfer_t t = good_transfer();
    uint64_t id;

    KVT_ERR(NULL, kvd_ping(NULL, NULL, 0), KVD_ENULL);
    KVT_ERR(f.cli, kvd_ping(f.cli, NULL, 4), KVD_ENULL);
    KVT_ERR(f.cli, kvd_ping_submit(f.cli, "x", 1, NULL), KVD_ENULL);
    KVT_ERR(f.cli, kvd_daemon_status(f.cli, NULL, NULL, 0), KVD_ENULL);
    KVT_ERR(f.cli, kvd_daemon_status(f.cli, &ds, NULL, 4), KVD_ENULL);
    KVT_ERR(f.cli, kvd_daemon_status_submit(f.cli, &ds, NULL, 0, NULL), KVD_ENULL);
    KVT_ERR(f.cli, kvd_daemon_stats(f.cli, &st, NULL, 3, NULL, 0), KVD_ENULL);
    KVT_ERR(f.cli, kvd_daemon_stats_submit(f.cli, &st, NULL, 0, NULL, 0, NULL), KVD_ENULL);
    KVT_ERR(NULL, kvd_daemon_shutdown(NULL, true), KVD_ENULL);
    KVT_ERR(f.cli, kvd_daemon_shutdown_submit(f.cli, true, NULL), KVD_ENULL);
    KVT_ERR(f.cli, kvd_kv_transfer(f.cli, NULL, NULL, &r), KVD_ENULL);
    KVT_ERR(f.cli, kvd_kv_transfer_submit(f.cli, &t, NULL, &r, NULL), KVD_ENULL);
    ck_assert_int_eq(kvd_ping(f.cli, "ok", 2), KVD_OK);
    ck_assert_int_eq(kvd_daemon_status_submit(f.cli, &ds, NULL, 0, &id), KVD_OK);
    ck_assert_int_eq(kvd_client_wait(f.cli, id), KVD_OK);
    ck_assert_uint_ge(ds.clients, 1);
}
END_TEST

/* ---- pools -------------------------------------------------------------- */

START_TEST(test_pool_create_invalid)
{
    kvd_pool_spec_t spec;
    kvd_pool_info_t info;

    memset(&spec, 0, sizeof(spec));
    spec.name = "bad-pool";
    spec.kind = KVD_MEM_HOST;
    spec.num_layers = 0; /* must be >= 1 */
    spec.num_slots = 4;
    spec.slot_bytes = 4;
    KVT_ERR(f.cli, kvd_pool_create(f.cli, &spec, &info), KVD_EINVAL);
    spec.num_layers = 1;
    spec.name = "bad name!"; /* characters outside [A-Za-z0-9._-] */
    KVT_ERR(f.cli, kvd_pool_create(f.cli, &spec, &info), KVD_EINVAL);
    spec.name = f.mha.info.name; /* taken */
    KVT_ERR(f.cli, kvd_pool_create(f.cli, &spec, &info), KVD_EEXIST);
    spec.name = "device-on-cpu";
    spec.kind = KVD_MEM_DEVICE; /* the cpu backend has host pools only */
    KVT_ERR(f.cli, kvd_pool_create(f.cli, &spec, &info), KVD_ENOTSUP);
}
END_TEST

START_TEST(test_mla_store_with_v)
{
    kvd_kv_store_t a = good_store();
    kvd_status_t st;

    a.pool = f.mla.info.id;
    st = kvd_kv_store(f.cli, &a, NULL, NULL);
    ck_assert_msg(st == KVD_EINVAL || st == KVD_ESHAPE, "MLA store with V: %s: %s",
                  kvd_err_name(st), kvd_client_last_error(f.cli));
}
END_TEST

START_TEST(test_oversized_inline_local)
{
    /* Past the daemon's frame limit: refused here, never sent, so the
     * connection survives. */
    uint64_t big = kvd_client_info(f.cli)->limits.max_frame_bytes + 1024;
    uint8_t *p = calloc(1, big);

    KVT_ERR(f.cli, kvd_ping(f.cli, p, big), KVD_ETOOBIG);
    free(p);
}
END_TEST

START_TEST(test_import_unsealed_memfd)
{
    /* A memfd the client could shrink under the daemon is refused. */
    int fd = memfd_create("unsealed", MFD_CLOEXEC);
    kvd_import_region_t reg;
    kvd_memref_t k = {0, 0}, v = {0, 1024};
    kvd_pool_import_t imp;
    kvd_pool_info_t info;

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, 4096), 0);
    memset(&reg, 0, sizeof(reg));
    reg.kind = KVD_MEM_HOST;
    reg.fd = fd;
    reg.bytes = 4096;
    memset(&imp, 0, sizeof(imp));
    imp.name = "unsealed";
    imp.num_layers = 1;
    imp.num_slots = 16;
    imp.slot_bytes = 64;
    imp.regions = &reg;
    imp.num_regions = 1;
    imp.k_layers = &k;
    imp.v_layers = &v;
    KVT_ERR(f.cli, kvd_pool_import(f.cli, &imp, &info), KVD_EPERM);
    close(fd);
}
END_TEST

START_TEST(test_import_region_too_small)
{
    /* V of the last slot would end past the region. */
    kvd_mapping_t *m = NULL;
    kvd_import_region_t reg;
    kvd_memref_t k = {0, 0}, v = {0, 1024};
    kvd_pool_import_t imp;
    kvd_pool_info_t info;

    KVT_OK(NULL, kvd_mapping_create_host(2048, &m));
    KVT_OK(NULL, kvd_import_region_from_mapping(m, &reg));
    memset(&imp, 0, sizeof(imp));
    imp.name = "too-small";
    imp.num_layers = 1;
    imp.num_slots = 17; /* 17 x 64 > 1024 */
    imp.slot_bytes = 64;
    imp.regions = &reg;
    imp.num_regions = 1;
    imp.k_layers = &k;
    imp.v_layers = &v;
    KVT_ERR(f.cli, kvd_pool_import(f.cli, &imp, &info), KVD_ERANGE);
    kvd_mapping_destroy(&m);
}
END_TEST

static Suite *errors_suite(void)
{
    Suite *s = suite_create("client_errors");
    TCase *tc = tcase_create("errors");

    tcase_add_unchecked_fixture(tc, kvt_suite_setup, kvt_suite_teardown);
    tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_unknown_pool_store);
    tcase_add_test(tc, test_unknown_pool_transfer);
    tcase_add_test(tc, test_unknown_pool_by_name);
    tcase_add_test(tc, test_unknown_buffer);
    tcase_add_test(tc, test_unknown_index_buffer);
    tcase_add_test(tc, test_index_past_slots_store);
    tcase_add_test(tc, test_index_past_slots_transfer);
    tcase_add_test(tc, test_layer_past_end);
    tcase_add_test(tc, test_byte_range_past_buffer);
    tcase_add_test(tc, test_index_range_past_buffer);
    tcase_add_test(tc, test_gather_out_past_buffer);
    tcase_add_test(tc, test_store_data_shape);
    tcase_add_test(tc, test_transfer_slot_bytes_mismatch);
    tcase_add_test(tc, test_transfer_mha_to_mla);
    tcase_add_test(tc, test_transfer_count_mismatch);
    tcase_add_test(tc, test_fp8_heads_mismatch);
    tcase_add_test(tc, test_fp8_cache_dtype);
    tcase_add_test(tc, test_gather_table_dtype);
    tcase_add_test(tc, test_index_dtype_local);
    tcase_add_test(tc, test_null_arguments);
    tcase_add_test(tc, test_pool_create_invalid);
    tcase_add_test(tc, test_mla_store_with_v);
    tcase_add_test(tc, test_oversized_inline_local);
    tcase_add_test(tc, test_import_unsealed_memfd);
    tcase_add_test(tc, test_import_region_too_small);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(errors_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
