/*
 * libkvdock's asynchronous calls and concurrency against the real kvdockd
 * (cpu backend): several requests in flight collected out of order,
 * replies parked for other ids, several clients at once from threads and
 * from forked processes, and one client shared by threads.
 */
#include "testutil.h"

#include <pthread.h>
#include <sys/wait.h>

/* Store T rows into layer `layer` of p at loc, and apply it to ref. */
static void store_rows(kvd_client_t *cli, const kvt_pool_t *p, uint8_t *ref, uint32_t layer,
                       const int64_t *loc, uint64_t T, uint64_t seed, bool submit, uint64_t *req_id,
                       uint8_t **kv_keep)
{
    uint64_t B = p->info.slot_bytes;
    uint8_t *kv = malloc(2 * T * B);
    kvd_kv_store_t a;
    kvd_store_args_t r;

    kvt_fill(kv, 2 * T * B, seed);
    memset(&a, 0, sizeof(a));
    a.pool = p->info.id;
    a.layer = layer;
    a.loc.values = loc;
    a.loc.count = T;
    a.k.data = kv;
    a.k.bytes = T * B;
    if (!p->info.mla) {
        a.v.data = kv + T * B;
        a.v.bytes = T * B;
    }
    if (submit)
        KVT_OK(cli, kvd_kv_store_submit(cli, &a, NULL, NULL, req_id));
    else
        KVT_OK(cli, kvd_kv_store(cli, &a, NULL, NULL));

    memset(&r, 0, sizeof(r));
    r.k_src = kv;
    r.v_src = p->info.mla ? NULL : kv + T * B;
    r.k_src_stride = (int64_t)B;
    r.v_src_stride = (int64_t)B;
    r.k_dst = kvt_layer(p, ref, layer, false);
    r.v_dst = p->info.mla ? NULL : kvt_layer(p, ref, layer, true);
    r.k_dst_stride = (int64_t)p->info.slot_stride;
    r.v_dst_stride = (int64_t)p->info.slot_stride;
    r.num_slots = (int64_t)p->info.num_slots;
    r.loc = loc;
    r.loc_dtype = KVD_DTYPE_I64;
    r.num_tokens = (int64_t)T;
    r.row_bytes = (int64_t)B;
    ck_assert_int_eq(kvd_cpu_kv_store(&r, NULL), KVD_OK);
    /* The inline data was copied at submit: the caller may reuse it. */
    memset(kv, 0xee, 2 * T * B);
    if (kv_keep != NULL)
        *kv_keep = kv;
    else
        free(kv);
}

START_TEST(test_submit_many_collect_reversed)
{
    kvd_client_t *cli = kvt_connect("async-reverse");
    enum { NREQ = 12 };
    kvt_pool_t p;
    uint8_t *ref;
    uint64_t ids[NREQ];
    int64_t loc[NREQ][4];
    kvd_pool_info_t list[16];
    size_t nlist = 0;
    kvd_daemon_status_t st;
    kvd_op_result_t pr;

    kvt_pool_make(cli, &p, "async", NREQ, 16, 40, false, 0);
    memset(p.map->base, 0, p.map->bytes);
    ref = kvt_snapshot(&p);
    /* One store per layer, plus other kinds of request among them. */
    for (int i = 0; i < NREQ; i++) {
        for (int j = 0; j < 4; j++)
            loc[i][j] = (i * 5 + j * 3) % 16;
        if (i == 3)
            KVT_OK(cli, kvd_ping_submit(cli, "abc", 3, &ids[i]));
        else if (i == 6)
            KVT_OK(cli, kvd_pool_list_submit(cli, list, 16, &nlist, &ids[i]));
        else if (i == 9)
            KVT_OK(cli, kvd_daemon_status_submit(cli, &st, NULL, 0, &ids[i]));
        else
            store_rows(cli, &p, ref, (uint32_t)i, loc[i], 4, 900 + (uint64_t)i, true, &ids[i],
                       NULL);
    }
    for (int i = 0; i < NREQ; i++)
        for (int j = i + 1; j < NREQ; j++)
            ck_assert_uint_ne(ids[i], ids[j]);
    ck_assert_uint_eq(kvd_client_pending(cli), NREQ);
    for (int i = NREQ - 1; i >= 0; i--)
        KVT_OK(cli, kvd_client_wait(cli, ids[i]));
    ck_assert_uint_eq(kvd_client_pending(cli), 0);
    ck_assert_uint_ge(nlist, 1);
    ck_assert_uint_ge(st.clients, 1);
    kvt_expect_bytes(p.map->base, ref, p.map->bytes, "pool after 9 async stores");

    /* A collected id is gone; an id never issued is unknown. */
    KVT_ERR(cli, kvd_client_wait(cli, ids[0]), KVD_ENOENT);
    KVT_ERR(cli, kvd_client_wait(cli, 999999), KVD_ENOENT);

    /* Blocking calls work while other replies are parked. */
    {
        uint64_t a, b;
        bool done = false;

        KVT_OK(cli, kvd_ping_submit(cli, "1", 1, &a));
        KVT_OK(cli, kvd_ping_submit(cli, "2", 1, &b));
        KVT_OK(cli, kvd_ping(cli, "3", 1)); /* parks a and b on the way */
        for (int spin = 0; spin < 1000 && !done; spin++)
            KVT_OK(cli, kvd_client_poll(cli, b, &done));
        ck_assert(done);
        KVT_OK(cli, kvd_client_wait_timeout(cli, b, 5000));
        KVT_OK(cli, kvd_client_wait_timeout(cli, a, 0));
    }
    /* An abandoned request's reply is dropped; its outputs stay untouched. */
    {
        uint64_t id;

        memset(&pr, 0x42, sizeof(pr));
        {
            const int64_t l1[1] = {1};
            kvd_kv_store_t a;
            uint8_t row[80];

            kvt_fill(row, sizeof(row), 3);
            memset(&a, 0, sizeof(a));
            a.pool = p.info.id;
            a.loc.values = l1;
            a.loc.count = 1;
            a.k.data = row;
            a.k.bytes = 40;
            a.v.data = row + 40;
            a.v.bytes = 40;
            KVT_OK(cli, kvd_kv_store_submit(cli, &a, NULL, &pr, &id));
        }
        KVT_OK(cli, kvd_client_abandon(cli, id));
        KVT_ERR(cli, kvd_client_wait(cli, id), KVD_ENOENT);
        KVT_OK(cli, kvd_ping(cli, NULL, 0)); /* its reply came and went */
        ck_assert_int_eq(((uint8_t *)&pr)[0], 0x42);
        ck_assert_uint_eq(kvd_client_pending(cli), 0);
    }
    free(ref);
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
}
END_TEST

/* Replies with descriptors (exports, host buffers) pipelined among replies
 * without: each descriptor reaches its own request. */
START_TEST(test_async_descriptors_interleaved)
{
    enum { N = 30 };
    int fds_before = kvt_count_fds();
    kvd_client_t *cli = kvt_connect("async-fds");
    kvt_pool_t p[3];
    kvd_mapping_t *maps[N];
    uint64_t bufids[N];
    uint64_t ids[N];
    size_t nlist;
    kvd_pool_info_t list[8];

    for (int i = 0; i < 3; i++) {
        kvt_pool_make(cli, &p[i], "fdpool", 1, 8 + (uint64_t)i, 16, false, 0);
        memset(p[i].map->base, 0x30 + i, p[i].map->bytes);
    }
    memset(maps, 0, sizeof(maps));
    memset(bufids, 0, sizeof(bufids));
    for (int i = 0; i < N; i++) {
        switch (i % 5) {
        case 0:
        case 3:
            KVT_OK(cli, kvd_pool_export_submit(cli, p[i % 3].info.id, NULL, 0, &maps[i], &ids[i]));
            break;
        case 1: KVT_OK(cli, kvd_ping_submit(cli, "z", 1, &ids[i])); break;
        case 2:
            KVT_OK(cli, kvd_buffer_register_submit(cli, 4096 + (uint64_t)i, KVD_MEM_HOST, NULL,
                                                   &bufids[i], &maps[i], &ids[i]));
            break;
        default: KVT_OK(cli, kvd_pool_list_submit(cli, list, 8, &nlist, &ids[i])); break;
        }
    }
    for (int k = 0; k < N; k++) {
        int i = (k * 7) % N; /* 7 and 30 coprime: every request once */

        KVT_OK(cli, kvd_client_wait(cli, ids[i]));
    }
    for (int i = 0; i < N; i++) {
        if (i % 5 == 0 || i % 5 == 3) {
            const kvt_pool_t *pp = &p[i % 3];

            ck_assert_ptr_nonnull(maps[i]);
            ck_assert_uint_eq(maps[i]->pool.id, pp->info.id);
            ck_assert_uint_ge(maps[i]->bytes, pp->info.bytes);
            ck_assert_int_eq(((uint8_t *)maps[i]->base)[0], 0x30 + i % 3);
            /* Same pages as the first mapping. */
            ((uint8_t *)maps[i]->base)[1] = (uint8_t)i;
            ck_assert_int_eq(((uint8_t *)pp->map->base)[1], (uint8_t)i);
        } else if (i % 5 == 2) {
            ck_assert_ptr_nonnull(maps[i]);
            ck_assert_uint_eq(maps[i]->buffer, bufids[i]);
            ck_assert_uint_ge(maps[i]->bytes, 4096 + (uint64_t)i);
            memset(maps[i]->base, 1, maps[i]->bytes);
            KVT_OK(cli, kvd_buffer_drop(cli, bufids[i]));
        } else {
            ck_assert_ptr_null(maps[i]);
        }
        kvd_mapping_destroy(&maps[i]);
    }
    for (int i = 0; i < 3; i++)
        kvt_pool_free(cli, &p[i]);
    kvd_client_destroy(&cli);
    ck_assert_int_eq(kvt_count_fds(), fds_before); /* no descriptor leaked */
}
END_TEST

/* Errors come back to the right request among successes. */
START_TEST(test_async_errors_matched)
{
    kvd_client_t *cli = kvt_connect("async-errors");
    uint64_t ok1, bad, ok2, bad2;
    kvd_pool_info_t info;

    KVT_OK(cli, kvd_ping_submit(cli, "a", 1, &ok1));
    KVT_OK(cli, kvd_pool_drop_submit(cli, 0, "no-such-pool", &bad));
    KVT_OK(cli, kvd_ping_submit(cli, "b", 1, &ok2));
    {
        kvd_pool_spec_t spec = {
            .name = "", .kind = KVD_MEM_HOST, .num_layers = 1, .num_slots = 1, .slot_bytes = 1};

        KVT_OK(cli, kvd_pool_create_submit(cli, &spec, &info, &bad2));
    }
    KVT_ERR(cli, kvd_client_wait(cli, bad), KVD_ENOENT);
    KVT_OK(cli, kvd_client_wait(cli, ok2));
    KVT_ERR(cli, kvd_client_wait(cli, bad2), KVD_EINVAL);
    KVT_OK(cli, kvd_client_wait(cli, ok1));
    kvd_client_destroy(&cli);
}
END_TEST

/* More in flight than the daemon's per-client limit: the library holds
 * back and keeps reading, nothing deadlocks. */
START_TEST(test_many_in_flight)
{
    kvd_client_t *cli = kvt_connect("async-many");
    uint32_t n = kvd_client_info(cli)->limits.max_inflight * 2 + 10;
    uint64_t *ids;
    uint8_t payload[256];

    if (n > 5000)
        n = 5000;
    ids = malloc(n * sizeof(*ids));
    kvt_fill(payload, sizeof(payload), 8);
    for (uint32_t i = 0; i < n; i++)
        KVT_OK(cli, kvd_ping_submit(cli, payload, 1 + i % 256, &ids[i]));
    for (uint32_t i = 0; i < n; i++)
        KVT_OK(cli, kvd_client_wait(cli, ids[(i * 7919u) % n])); /* scrambled order */
    ck_assert_uint_eq(kvd_client_pending(cli), 0);
    free(ids);
    kvd_client_destroy(&cli);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Several clients at once                                                   */

typedef struct worker {
    int index;
    int iterations;
    char error[512];
} worker_t;

#define WCHECK(w, cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf((w)->error, sizeof((w)->error), __VA_ARGS__);                                 \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* One client's session: own pools, stores, transfers, verification. */
static void *client_worker(void *arg)
{
    worker_t *w = arg;
    kvd_client_t *cli = NULL;
    kvd_pool_spec_t spec;
    kvd_pool_info_t src, dst;
    kvd_mapping_t *sm = NULL, *dm = NULL;
    char ns[64], nd[64], cname[32];
    const uint64_t S = 32, B = 24;
    uint8_t rows[2 * 4 * 24];
    kvd_status_t st;
    bool have_src = false, have_dst = false;

    snprintf(cname, sizeof(cname), "worker-%d", w->index);
    st = kvd_client_create(kvt_d.socket, cname, &cli);
    WCHECK(w, st == KVD_OK, "connect: %s", kvd_client_last_error(NULL));
    kvd_client_set_timeout(cli, 20000);
    snprintf(ns, sizeof(ns), "w-src-%d-%d", (int)getpid(), w->index);
    snprintf(nd, sizeof(nd), "w-dst-%d-%d", (int)getpid(), w->index);
    memset(&spec, 0, sizeof(spec));
    spec.kind = KVD_MEM_HOST;
    spec.num_layers = 2;
    spec.num_slots = S;
    spec.slot_bytes = B;
    spec.name = ns;
    st = kvd_pool_create(cli, &spec, &src);
    WCHECK(w, st == KVD_OK, "create src: %s", kvd_client_last_error(cli));
    have_src = true;
    spec.name = nd;
    st = kvd_pool_create(cli, &spec, &dst);
    WCHECK(w, st == KVD_OK, "create dst: %s", kvd_client_last_error(cli));
    have_dst = true;
    st = kvd_pool_export(cli, src.id, NULL, 0, &sm);
    WCHECK(w, st == KVD_OK, "export src: %s", kvd_client_last_error(cli));
    st = kvd_pool_export(cli, dst.id, NULL, 0, &dm);
    WCHECK(w, st == KVD_OK, "export dst: %s", kvd_client_last_error(cli));

    for (int it = 0; it < w->iterations; it++) {
        int64_t loc[4], to[4];
        kvd_kv_store_t a;
        kvd_kv_transfer_t t;
        uint64_t id_store, id_ping;

        for (int j = 0; j < 4; j++) {
            loc[j] = (it * 4 + j) % (int64_t)S;
            to[j] = (int64_t)S - 1 - loc[j];
        }
        kvt_fill(rows, sizeof(rows), (uint64_t)(w->index * 100000 + it));
        memset(&a, 0, sizeof(a));
        a.pool = src.id;
        a.layer = (uint32_t)(it & 1);
        a.loc.values = loc;
        a.loc.count = 4;
        a.k.data = rows;
        a.k.bytes = 4 * B;
        a.v.data = rows + 4 * B;
        a.v.bytes = 4 * B;
        st = kvd_kv_store_submit(cli, &a, NULL, NULL, &id_store);
        WCHECK(w, st == KVD_OK, "store submit: %s", kvd_client_last_error(cli));
        st = kvd_ping_submit(cli, &it, sizeof(it), &id_ping);
        WCHECK(w, st == KVD_OK, "ping submit: %s", kvd_client_last_error(cli));
        st = kvd_client_wait(cli, id_ping);
        WCHECK(w, st == KVD_OK, "ping: %s", kvd_client_last_error(cli));
        st = kvd_client_wait(cli, id_store);
        WCHECK(w, st == KVD_OK, "store: %s", kvd_client_last_error(cli));

        memset(&t, 0, sizeof(t));
        t.src_pool = src.id;
        t.dst_pool = dst.id;
        t.src.values = loc;
        t.src.count = 4;
        t.dst.values = to;
        t.dst.count = 4;
        t.layer_begin = a.layer;
        st = kvd_kv_transfer(cli, &t, NULL, NULL);
        WCHECK(w, st == KVD_OK, "transfer: %s", kvd_client_last_error(cli));
        for (int j = 0; j < 4; j++) {
            const uint8_t *gk = (uint8_t *)dm->base + a.layer * dst.layer_stride +
                                (uint64_t)to[j] * dst.slot_stride;
            const uint8_t *gv = gk + dst.v_offset;

            WCHECK(w, memcmp(gk, rows + j * B, B) == 0, "iteration %d row %d: K differs", it, j);
            WCHECK(w, memcmp(gv, rows + 4 * B + j * B, B) == 0, "iteration %d row %d: V differs",
                   it, j);
        }
    }
out:
    kvd_mapping_destroy(&sm);
    kvd_mapping_destroy(&dm);
    if (cli != NULL && have_src)
        kvd_pool_drop(cli, src.id, NULL);
    if (cli != NULL && have_dst)
        kvd_pool_drop(cli, dst.id, NULL);
    kvd_client_destroy(&cli);
    return NULL;
}

START_TEST(test_clients_in_threads)
{
    enum { N = 8 };
    pthread_t th[N];
    worker_t w[N];

    for (int i = 0; i < N; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].index = i;
        w[i].iterations = 60;
        ck_assert_int_eq(pthread_create(&th[i], NULL, client_worker, &w[i]), 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++)
        ck_assert_msg(w[i].error[0] == '\0', "worker %d: %s", i, w[i].error);
}
END_TEST

START_TEST(test_clients_in_processes)
{
    enum { N = 6 };
    pid_t pid[N];

    for (int i = 0; i < N; i++) {
        pid[i] = fork();
        if (pid[i] == 0) { /* reports by its exit code, no Check assertion */
            worker_t w;

            memset(&w, 0, sizeof(w));
            w.index = 100 + i;
            w.iterations = 40;
            client_worker(&w);
            if (w.error[0] != '\0') {
                fprintf(stderr, "process worker %d: %s\n", i, w.error);
                _exit(1);
            }
            _exit(0);
        }
        ck_assert_int_ge(pid[i], 0);
    }
    for (int i = 0; i < N; i++) {
        int status = 0;

        ck_assert_int_eq(waitpid(pid[i], &status, 0), pid[i]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "worker process %d failed (status 0x%x)", i, status);
    }
}
END_TEST

/* One client shared by threads: each thread its own layer of one pool. */
typedef struct shared_arg {
    kvd_client_t *cli;
    const kvt_pool_t *pool;
    uint32_t layer;
    char error[512];
} shared_arg_t;

static void *shared_worker(void *arg)
{
    shared_arg_t *s = arg;
    const kvt_pool_t *p = s->pool;
    uint64_t B = p->info.slot_bytes;

    for (int it = 0; it < 200; it++) {
        int64_t loc[2] = {it % 16, 16 + it % 16};
        uint8_t rows[2 * 2 * 32];
        kvd_kv_store_t a;
        kvd_status_t st;
        uint64_t id;

        kvt_fill(rows, sizeof(rows), s->layer * 1000u + (unsigned)it);
        memset(&a, 0, sizeof(a));
        a.pool = p->info.id;
        a.layer = s->layer;
        a.loc.values = loc;
        a.loc.count = 2;
        a.k.data = rows;
        a.k.bytes = 2 * B;
        a.v.data = rows + 2 * B;
        a.v.bytes = 2 * B;
        if (it % 2)
            st = kvd_kv_store(s->cli, &a, NULL, NULL);
        else if ((st = kvd_kv_store_submit(s->cli, &a, NULL, NULL, &id)) == KVD_OK)
            st = kvd_client_wait(s->cli, id);
        if (st != KVD_OK) {
            snprintf(s->error, sizeof(s->error), "store: %s: %s", kvd_err_name(st),
                     kvd_client_last_error(s->cli));
            return NULL;
        }
        for (int j = 0; j < 2; j++) {
            const uint8_t *k = (uint8_t *)p->map->base + s->layer * p->info.layer_stride +
                               (uint64_t)loc[j] * p->info.slot_stride;

            if (memcmp(k, rows + j * B, B) != 0 ||
                memcmp(k + p->info.v_offset, rows + 2 * B + j * B, B) != 0) {
                snprintf(s->error, sizeof(s->error), "layer %u iteration %d row %d differs",
                         s->layer, it, j);
                return NULL;
            }
        }
    }
    return NULL;
}

START_TEST(test_one_client_many_threads)
{
    enum { N = 6 };
    kvd_client_t *cli = kvt_connect("shared-client");
    kvt_pool_t p;
    pthread_t th[N];
    shared_arg_t a[N];

    kvt_pool_make(cli, &p, "shared-threads", N, 32, 32, false, 0);
    for (int i = 0; i < N; i++) {
        memset(&a[i], 0, sizeof(a[i]));
        a[i].cli = cli;
        a[i].pool = &p;
        a[i].layer = (uint32_t)i;
        ck_assert_int_eq(pthread_create(&th[i], NULL, shared_worker, &a[i]), 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++)
        ck_assert_msg(a[i].error[0] == '\0', "thread %d: %s", i, a[i].error);
    ck_assert_uint_eq(kvd_client_pending(cli), 0);
    kvt_pool_free(cli, &p);
    kvd_client_destroy(&cli);
}
END_TEST

/* A shared pool made by one client is visible to and usable by another;
 * only its owner drops it. */
START_TEST(test_shared_pool_between_clients)
{
    kvd_client_t *a = kvt_connect("sharer");
    kvd_client_t *b = kvt_connect("user");
    kvd_pool_spec_t spec;
    kvd_pool_info_t info, list[64];
    kvd_mapping_t *mb = NULL;
    size_t n = 0;
    bool seen = false;
    char name[64];
    const int64_t loc[1] = {3};
    uint8_t row[2 * 16];
    kvd_kv_store_t st;

    snprintf(name, sizeof(name), "shared-%d", (int)getpid());
    spec = (kvd_pool_spec_t){.name = name, .kind = KVD_MEM_HOST, .num_layers = 1,
                             .num_slots = 8, .slot_bytes = 16, .shared = true};
    KVT_OK(a, kvd_pool_create(a, &spec, &info));
    ck_assert(info.shared);
    ck_assert(!info.orphaned);
    KVT_OK(b, kvd_pool_list(b, list, 64, &n));
    for (size_t i = 0; i < n && i < 64; i++) {
        if (list[i].id != info.id)
            continue;
        seen = true;
        ck_assert(!list[i].orphaned); /* its creator is still here */
    }
    ck_assert(seen);
    KVT_OK(b, kvd_pool_export(b, 0, name, 0, &mb));
    kvt_fill(row, sizeof(row), 99);
    memset(&st, 0, sizeof(st));
    st.pool = info.id;
    st.loc.values = loc;
    st.loc.count = 1;
    st.k.data = row;
    st.k.bytes = 16;
    st.v.data = row + 16;
    st.v.bytes = 16;
    KVT_OK(b, kvd_kv_store(b, &st, NULL, NULL));
    kvt_expect_bytes((uint8_t *)mb->base + 3 * info.slot_stride, row, 16, "shared K row");
    kvd_mapping_destroy(&mb);
    /* Only the owner (or an admin) may drop it. */
    if (!kvd_client_info(b)->admin)
        KVT_ERR(b, kvd_pool_drop(b, info.id, NULL), KVD_EPERM);
    KVT_OK(a, kvd_pool_drop(a, info.id, NULL));
    kvd_client_destroy(&b);
    kvd_client_destroy(&a);
}
END_TEST

/* A shared pool outlives its creator and is listed as orphaned, with the
 * creator's id as owner; an admin drops it. */
START_TEST(test_shared_pool_orphaned)
{
    kvd_client_t *a = kvt_connect("leaver");
    kvd_client_t *b = kvt_connect("stayer");
    kvd_pool_spec_t spec;
    kvd_pool_info_t info, list[64];
    uint64_t creator = kvd_client_info(a)->client_id;
    size_t n = 0;
    bool seen = false;
    char name[64];

    snprintf(name, sizeof(name), "orphan-%d", (int)getpid());
    spec = (kvd_pool_spec_t){.name = name, .kind = KVD_MEM_HOST, .num_layers = 1,
                             .num_slots = 4, .slot_bytes = 16, .shared = true};
    KVT_OK(a, kvd_pool_create(a, &spec, &info));
    kvd_client_destroy(&a);
    /* the daemon handles the hang-up between b's requests: poll for it */
    for (int tries = 0; tries < 200 && !seen; tries++) {
        KVT_OK(b, kvd_pool_list(b, list, 64, &n));
        for (size_t i = 0; i < n && i < 64; i++)
            if (list[i].id == info.id && list[i].orphaned) {
                seen = true;
                ck_assert_uint_eq(list[i].owner, creator);
                ck_assert(list[i].shared);
            }
        if (!seen)
            usleep(10000);
    }
    ck_assert_msg(seen, "pool %s never listed as orphaned", name);
    if (kvd_client_info(b)->admin)
        KVT_OK(b, kvd_pool_drop(b, info.id, NULL));
    else
        KVT_ERR(b, kvd_pool_drop(b, info.id, NULL), KVD_EPERM);
    kvd_client_destroy(&b);
}
END_TEST

/* Abandoned requests give their in-flight room back when their replies
 * come: more abandons than max-inflight, then a blocking call still goes. */
START_TEST(test_abandon_frees_room)
{
    kvd_client_t *cli = kvt_connect("abandoner");
    uint32_t n = kvd_client_info(cli)->limits.max_inflight + 8;

    kvd_client_set_timeout(cli, 5000); /* a leak would block the submit */
    for (uint32_t i = 0; i < n; i++) {
        uint64_t id;

        KVT_OK(cli, kvd_ping_submit(cli, NULL, 0, &id));
        KVT_OK(cli, kvd_client_abandon(cli, id));
    }
    KVT_OK(cli, kvd_ping(cli, "after", 5));
    ck_assert_uint_eq(kvd_client_pending(cli), 0);
    kvd_client_destroy(&cli);
}
END_TEST

/* A private pool is invisible to another client. */
START_TEST(test_private_pool_hidden)
{
    kvd_client_t *a = kvt_connect("owner");
    kvd_client_t *b = kvt_connect("stranger");
    kvt_pool_t p;
    kvd_mapping_t *m = NULL;
    const int64_t loc[1] = {0};
    uint8_t row[64] = {1};
    kvd_kv_store_t st;
    kvd_status_t s;

    kvt_pool_make(a, &p, "private", 1, 4, 32, false, 0);
    s = kvd_pool_export(b, p.info.id, NULL, 0, &m);
    ck_assert_msg(s == KVD_ENOENT || s == KVD_EPERM, "export of another's pool: %s",
                  kvd_err_name(s));
    memset(&st, 0, sizeof(st));
    st.pool = p.info.id;
    st.loc.values = loc;
    st.loc.count = 1;
    st.k.data = row;
    st.k.bytes = 32;
    st.v.data = row + 32;
    st.v.bytes = 32;
    s = kvd_kv_store(b, &st, NULL, NULL);
    ck_assert_msg(s == KVD_ENOENT || s == KVD_EPERM, "store into another's pool: %s",
                  kvd_err_name(s));
    s = kvd_pool_drop(b, p.info.id, NULL);
    ck_assert_msg(s == KVD_ENOENT || s == KVD_EPERM, "drop of another's pool: %s", kvd_err_name(s));
    kvt_pool_free(a, &p);
    kvd_client_destroy(&b);
    kvd_client_destroy(&a);
}
END_TEST

static Suite *async_suite(void)
{
    Suite *s = suite_create("client_async");
    TCase *tc = tcase_create("async");

    tcase_add_unchecked_fixture(tc, kvt_suite_setup, kvt_suite_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_submit_many_collect_reversed);
    tcase_add_test(tc, test_async_errors_matched);
    tcase_add_test(tc, test_async_descriptors_interleaved);
    tcase_add_test(tc, test_many_in_flight);
    tcase_add_test(tc, test_clients_in_threads);
    tcase_add_test(tc, test_clients_in_processes);
    tcase_add_test(tc, test_one_client_many_threads);
    tcase_add_test(tc, test_shared_pool_between_clients);
    tcase_add_test(tc, test_shared_pool_orphaned);
    tcase_add_test(tc, test_abandon_frees_room);
    tcase_add_test(tc, test_private_pool_hidden);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(async_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
