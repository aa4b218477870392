/*
 * The built `kvdock` CLI against the real kvdockd (cpu backend): each
 * command in table and JSON form, usage errors (exit 2) and daemon errors
 * (exit 1 with the status name and message on stderr).
 */
#include "testutil.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/stat.h>

/* The number after "key": in a JSON text (NAN when absent). */
static double json_number(const char *json, const char *key)
{
    char pat[64];
    const char *p;

    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(json, pat);
    return p != NULL ? strtod(p + strlen(pat), NULL) : NAN;
}

/* Whether the suite daemon's log holds the printf-formatted text. */
static bool log_has(const char *fmt, ...)
{
    char want[256];
    char line[1024];
    bool found = false;
    va_list ap;
    FILE *f;

    va_start(ap, fmt);
    vsnprintf(want, sizeof(want), fmt, ap);
    va_end(ap);
    f = fopen(kvt_d.log, "r");
    if (f == NULL)
        return false;
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = strstr(line, want) != NULL;
    fclose(f);
    return found;
}

START_TEST(test_cli_help)
{
    const char *argv[] = {kvt_cli_path(), "--help", NULL};
    const char *argv2[] = {kvt_cli_path(), "pool", "--help", NULL};
    kvt_cli_result_t r;

    r.rc = kvt_run(argv, &r.out, &r.err, 10000);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "usage: kvdock"));
    ck_assert_ptr_nonnull(strstr(r.out, "status"));
    ck_assert_ptr_nonnull(strstr(r.out, "--socket"));
    kvt_cli_free(&r);
    r.rc = kvt_run(argv2, &r.out, &r.err, 10000);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "--slot-bytes"));
    kvt_cli_free(&r);
}
END_TEST

START_TEST(test_cli_status)
{
    kvt_cli_result_t r = kvt_cli("status", NULL);

    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "backend cpu"));
    ck_assert_ptr_nonnull(strstr(r.out, kvt_d.socket));
    kvt_cli_free(&r);

    r = kvt_cli("status", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"backend\":\"cpu\""));
    ck_assert_ptr_nonnull(strstr(r.out, "\"client_list\":["));
    ck_assert_ptr_nonnull(strstr(r.out, "\"kvdock-cli\""));
    kvt_cli_free(&r);
}
END_TEST

/*
 * A pool belongs to the connection that made it, and kvdockd frees a
 * connection's private pools when it closes; a one-shot `kvdock pool
 * create` therefore says what it made (a shared one outlives it: see
 * test_cli_shared_pool_outlives_creator), and the listing and dropping are
 * checked on a shared pool that this test's own connection holds.
 */
START_TEST(test_cli_pool_create)
{
    char name[64];
    kvt_cli_result_t r;

    snprintf(name, sizeof(name), "cli-pool-%d", (int)getpid());
    r = kvt_cli("pool", "create", name, "--kind", "host", "--layers", "4", "--slots", "1024",
                "--slot-bytes", "128", "--mla", "--page-size", "16", "--shared", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, name));
    ck_assert_ptr_nonnull(strstr(r.out, "4 layers x 1024 slots x 128 bytes"));
    ck_assert_ptr_nonnull(strstr(r.out, "mla"));
    kvt_cli_free(&r);
    /* the daemon logs the kind by name, as the CLI and metrics spell it */
    ck_assert_msg(log_has("name=%s kind=host ", name), "no kind=host for %s in the log", name);

    snprintf(name, sizeof(name), "cli-json-%d", (int)getpid());
    r = kvt_cli("--json", "pool", "create", name, "--layers", "2", "--slots", "8", "--slot-bytes",
                "64", "--shared", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"pool\":{"));
    ck_assert_ptr_nonnull(strstr(r.out, "\"mla\":false"));
    ck_assert_ptr_nonnull(strstr(r.out, "\"num_slots\":8"));
    kvt_cli_free(&r);
    r = kvt_cli("pool", "drop", name, NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);

    /* a private pool would end with kvdock's connection: refused, nothing
     * claimed, nothing made */
    snprintf(name, sizeof(name), "cli-private-%d", (int)getpid());
    r = kvt_cli("pool", "create", name, "--layers", "2", "--slots", "8", "--slot-bytes", "64",
                NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_str_eq(r.out, "");
    ck_assert_ptr_nonnull(strstr(r.err, "--shared"));
    kvt_cli_free(&r);
    r = kvt_cli("pools", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(strstr(r.out, name) == NULL, "pool %s was made:\n%s", name, r.out);
    kvt_cli_free(&r);

    /* the shared one is still there; drop it (an admin may) */
    snprintf(name, sizeof(name), "cli-pool-%d", (int)getpid());
    r = kvt_cli("pool", "drop", name, NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);
}
END_TEST

/* The ids of the pools named name that c lists (0 when none). */
static uint64_t listed(kvd_client_t *c, const char *name)
{
    kvd_pool_info_t list[64];
    size_t n = 0;

    KVT_OK(c, kvd_pool_list(c, list, 64, &n));
    for (size_t i = 0; i < n && i < 64; i++)
        if (strcmp(list[i].name, name) == 0)
            return list[i].id;
    return 0;
}

/*
 * A shared pool outlives its creator: `kvdock pool create --shared` exits,
 * and the pool is still listed by a new kvdock and usable by another
 * client; a private pool goes when its creator disconnects.
 */
START_TEST(test_cli_shared_pool_outlives_creator)
{
    kvd_client_t *other = kvt_connect("other"), *maker;
    kvd_pool_spec_t spec;
    kvd_pool_info_t info;
    kvd_mapping_t *m = NULL;
    char name[64], priv[64];
    kvt_cli_result_t r;

    snprintf(name, sizeof(name), "cli-outlive-%d", (int)getpid());
    r = kvt_cli("pool", "create", name, "--layers", "2", "--slots", "16", "--slot-bytes", "64",
                "--shared", NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);

    /* a new kvdock process lists it */
    r = kvt_cli("pools", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    {
        char *at = strstr(r.out, name);

        ck_assert_msg(at != NULL, "shared pool %s did not outlive kvdock:\n%s", name, r.out);
        ck_assert_ptr_nonnull(strstr(at, "\"shared\":true"));
    }
    kvt_cli_free(&r);
    r = kvt_cli("pools", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, name));
    kvt_cli_free(&r);

    /* another client may still use it: export and map it */
    ck_assert_uint_ne(listed(other, name), 0);
    KVT_OK(other, kvd_pool_export(other, 0, name, 0, &m));
    ck_assert_str_eq(m->pool.name, name);
    ck_assert(m->pool.shared);
    kvd_mapping_destroy(&m);

    /* a private pool goes with its creator; a shared one stays.  Another
     * client's private pool is its own, name too: not listed, and the
     * name is free for others' private pools */
    maker = kvt_connect("maker");
    snprintf(priv, sizeof(priv), "cli-private-%d", (int)getpid());
    memset(&spec, 0, sizeof(spec));
    spec.name = priv;
    spec.kind = KVD_MEM_HOST;
    spec.num_layers = 1;
    spec.num_slots = 8;
    spec.slot_bytes = 32;
    KVT_OK(maker, kvd_pool_create(maker, &spec, &info));
    ck_assert_uint_eq(listed(maker, priv), info.id);
    ck_assert_uint_eq(listed(other, priv), 0);
    {
        kvd_pool_info_t mine, all[64];
        size_t n = 0, seen = 0;

        KVT_OK(other, kvd_pool_create(other, &spec, &mine)); /* the same name, its own */
        ck_assert_uint_ne(mine.id, info.id);
        ck_assert_uint_eq(listed(other, priv), mine.id);
        KVT_OK(other, kvd_pool_list_all(other, all, 64, &n)); /* an admin's view: both */
        for (size_t i = 0; i < n && i < 64; i++)
            seen += all[i].id == info.id || all[i].id == mine.id;
        ck_assert_uint_eq(seen, 2);
        KVT_OK(other, kvd_pool_drop(other, 0, priv)); /* by name: its own */
        ck_assert_uint_eq(listed(maker, priv), info.id);
    }
    kvd_client_destroy(&maker);
    {
        /* the daemon sees the end of the stream soon: the private pool
         * must be gone from an admin's view of every pool within 5 s */
        int64_t deadline = kvt_now_ms() + KVT_MS(5000);
        size_t left;

        for (;;) {
            kvd_pool_info_t all[64];
            size_t n = 0;

            left = 0;
            KVT_OK(other, kvd_pool_list_all(other, all, 64, &n));
            for (size_t j = 0; j < n && j < 64; j++)
                left += all[j].id == info.id;
            if (left == 0 || kvt_now_ms() > deadline)
                break;
            usleep(10000);
        }
        ck_assert_msg(left == 0, "the private pool %s (id %llu) outlived its creator", priv,
                      (unsigned long long)info.id);
    }
    ck_assert_uint_ne(listed(other, name), 0);

    /* a shared pool's name stays taken while the pool lives */
    r = kvt_cli("pool", "create", name, "--layers", "1", "--slots", "1", "--slot-bytes", "1",
                "--shared", NULL);
    KVT_EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "EEXIST"));
    kvt_cli_free(&r);

    /* its user (here an admin too) drops it; then it is gone */
    r = kvt_cli("pool", "drop", name, NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);
    ck_assert_uint_eq(listed(other, name), 0);
    kvd_client_destroy(&other);
}
END_TEST

/* An imported pool is its importer's memory: it goes with the importer,
 * shared or not. */
START_TEST(test_cli_imported_shared_pool_dies_with_importer)
{
    kvd_client_t *imp_cli = kvt_connect("importer"), *other = kvt_connect("other");
    kvd_mapping_t *m = NULL;
    kvd_import_region_t reg;
    kvd_memref_t k[1] = {{0, 0}}, v[1] = {{0, 1024}};
    kvd_pool_import_t imp;
    kvd_pool_info_t info;
    char name[64];

    snprintf(name, sizeof(name), "cli-imported-%d", (int)getpid());
    KVT_OK(NULL, kvd_mapping_create_host(4096, &m));
    KVT_OK(NULL, kvd_import_region_from_mapping(m, &reg));
    memset(&imp, 0, sizeof(imp));
    imp.name = name;
    imp.num_layers = 1;
    imp.num_slots = 16;
    imp.slot_bytes = 64;
    imp.shared = true;
    imp.regions = &reg;
    imp.num_regions = 1;
    imp.k_layers = k;
    imp.v_layers = v;
    KVT_OK(imp_cli, kvd_pool_import(imp_cli, &imp, &info));
    ck_assert(info.shared && info.imported);
    ck_assert_uint_eq(listed(other, name), info.id);
    kvd_client_destroy(&imp_cli);
    for (int i = 0; i < 200 && listed(other, name) != 0; i++)
        usleep(10000);
    ck_assert_uint_eq(listed(other, name), 0);
    kvd_mapping_destroy(&m);
    kvd_client_destroy(&other);
}
END_TEST

/* Run kvdock as user nobody (65534) with setpriv. */
static kvt_cli_result_t cli_as_nobody(const char *socket, const char *a1, const char *a2,
                                      const char *a3)
{
    const char *argv[] = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          "--", kvt_cli_path(), "--socket", socket, a1, a2, a3, NULL};
    kvt_cli_result_t r;

    r.rc = kvt_run(argv, &r.out, &r.err, 20000);
    return r;
}

/*
 * Who may drop a shared pool: its creator's user (from any connection,
 * after the creator has gone too), or an admin; no one else.  A non-admin
 * peer takes root (to run kvdock as nobody) and a daemon that lets nobody
 * connect (allow-uids, socket-group) without making it an admin;
 * elsewhere the test says why it skips.
 */
START_TEST(test_cli_shared_pool_drop_needs_admin)
{
    static const char *const extra[] = {"--allow-uids", "65534", "--socket-group", "65534", NULL};
    kvt_daemon_t d;
    kvd_client_t *holder;
    kvd_pool_spec_t spec;
    kvd_pool_info_t info;
    char orphan[64], held[64], own[64];
    kvt_cli_result_t r;

    if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0 ||
        access(kvt_cli_path(), R_OK | X_OK) != 0) {
        kvt_skip_case("test_cli_shared_pool_drop_needs_admin",
                      "needs root and /usr/bin/setpriv to run kvdock as a non-admin user "
                      "(every peer of the daemon's own uid is an admin)");
        return;
    }
    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    /* let nobody reach the socket: through the test's directory (mode
     * 0700 from mkdtemp) to run/, which the daemon made for the group */
    ck_assert_int_eq(chmod(d.dir, 0711), 0);

    r = cli_as_nobody(d.socket, "status", NULL, NULL);
    if (r.rc != 0) {
        /* e.g. the build tree is not readable by nobody */
        kvt_skip_case("test_cli_shared_pool_drop_needs_admin",
                      "kvdock cannot run as nobody here (exit %d: %s)", r.rc, r.err);
        kvt_cli_free(&r);
        kvt_daemon_stop(&d, 10000);
        return;
    }
    kvt_cli_free(&r);

    /* an orphaned shared pool: its creator, kvdock, has exited */
    snprintf(orphan, sizeof(orphan), "orphan-%d", (int)getpid());
    r = kvt_cli_at(d.socket, "pool", "create", orphan, "--shared", NULL);
    KVT_EXPECT_RC(r, 2); /* the sizes are required */
    kvt_cli_free(&r);
    r = kvt_cli_at(d.socket, "pool", "create", orphan, "--layers", "1", "--slots", "4",
                   "--slot-bytes", "16", "--shared", NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);
    /* a shared pool whose creator is still connected */
    ck_assert_int_eq(kvd_client_create(d.socket, "holder", &holder), KVD_OK);
    snprintf(held, sizeof(held), "held-%d", (int)getpid());
    spec = (kvd_pool_spec_t){.name = held, .kind = KVD_MEM_HOST, .num_layers = 1,
                             .num_slots = 4, .slot_bytes = 16, .shared = true};
    KVT_OK(holder, kvd_pool_create(holder, &spec, &info));

    /* nobody sees both (shared), and may drop neither */
    r = cli_as_nobody(d.socket, "pools", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, orphan));
    ck_assert_ptr_nonnull(strstr(r.out, held));
    kvt_cli_free(&r);
    r = cli_as_nobody(d.socket, "pool", "drop", orphan);
    KVT_EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "EPERM"));
    ck_assert_ptr_nonnull(strstr(r.err, "only that user or an admin"));
    kvt_cli_free(&r);
    r = cli_as_nobody(d.socket, "pool", "drop", held);
    KVT_EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "EPERM"));
    kvt_cli_free(&r);

    /* a non-admin's own shared pool outlives it too, and its user drops it
     * from a later kvdock */
    snprintf(own, sizeof(own), "nobodys-%d", (int)getpid());
    {
        const char *argv[] = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                              "--clear-groups", "--", kvt_cli_path(), "--socket", d.socket, "pool",
                              "create", own, "--layers", "1", "--slots", "4", "--slot-bytes", "16",
                              "--shared", NULL};

        r.rc = kvt_run(argv, &r.out, &r.err, 20000);
        KVT_EXPECT_RC(r, 0);
        kvt_cli_free(&r);
    }
    r = cli_as_nobody(d.socket, "pool", "drop", own);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);

    /* the creator may drop its own while connected; an admin the other */
    KVT_OK(holder, kvd_pool_drop(holder, info.id, NULL));
    r = kvt_cli_at(d.socket, "pool", "drop", orphan, NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);
    r = kvt_cli_at(d.socket, "pools", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_str_eq(r.out, "{\"pools\":[]}\n");
    kvt_cli_free(&r);
    kvd_client_destroy(&holder);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

START_TEST(test_cli_pools_and_drop)
{
    kvd_client_t *holder = kvt_connect("pool-holder");
    kvd_pool_spec_t spec;
    kvd_pool_info_t info, list[64];
    size_t n = 0;
    char name[64];
    kvt_cli_result_t r;

    snprintf(name, sizeof(name), "cli-held-%d", (int)getpid());
    memset(&spec, 0, sizeof(spec));
    spec.name = name;
    spec.kind = KVD_MEM_HOST;
    spec.num_layers = 4;
    spec.num_slots = 1024;
    spec.slot_bytes = 128;
    spec.mla = true;
    spec.page_size = 16;
    spec.shared = true;
    KVT_OK(holder, kvd_pool_create(holder, &spec, &info));

    r = kvt_cli("pools", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    {
        char *at = strstr(r.out, name);

        ck_assert_msg(at != NULL, "pool %s not listed:\n%s", name, r.out);
        ck_assert_ptr_nonnull(strstr(at, "\"num_layers\":4"));
        ck_assert_ptr_nonnull(strstr(at, "\"num_slots\":1024"));
        ck_assert_ptr_nonnull(strstr(at, "\"slot_bytes\":128"));
        ck_assert_ptr_nonnull(strstr(at, "\"mla\":true"));
        ck_assert_ptr_nonnull(strstr(at, "\"page_size\":16"));
        ck_assert_ptr_nonnull(strstr(at, "\"kind\":\"host\""));
        ck_assert_ptr_nonnull(strstr(at, "\"shared\":true"));
    }
    kvt_cli_free(&r);

    r = kvt_cli("pools", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "NAME"));
    ck_assert_ptr_nonnull(strstr(r.out, "SLOT_BYTES"));
    ck_assert_ptr_nonnull(strstr(r.out, name));
    kvt_cli_free(&r);

    /* The same name again: the daemon's EEXIST, with its message. */
    r = kvt_cli("pool", "create", name, "--layers", "1", "--slots", "1", "--slot-bytes", "1",
                "--shared", NULL);
    KVT_EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "EEXIST"));
    ck_assert_str_eq(r.out, "");
    kvt_cli_free(&r);

    /* An admin may drop another client's shared pool. */
    r = kvt_cli("pool", "drop", name, "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    kvt_cli_free(&r);
    KVT_OK(holder, kvd_pool_list(holder, list, 64, &n));
    for (size_t i = 0; i < n && i < 64; i++)
        ck_assert_uint_ne(list[i].id, info.id);
    r = kvt_cli("pools", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_null(strstr(r.out, name));
    kvt_cli_free(&r);

    r = kvt_cli("pool", "drop", name, NULL);
    KVT_EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "ENOENT"));
    kvt_cli_free(&r);
    kvd_client_destroy(&holder);
}
END_TEST

START_TEST(test_cli_cache)
{
    /* create, ls, stats, clear, drop; tables and JSON; a cache outlives
     * the kvdock that made it; usage and daemon errors */
    kvd_client_t *c = kvt_connect("cache-cli");
    kvd_cache_info_t info;
    kvt_cli_result_t r;

    r = kvt_cli("cache", "create", "cli-prefix", "--layers", "4", "--tokens-per-block", "16",
                "--token-bytes", "256", "--budget", "4m", "--dtype", "bf16", "--shared", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "created cache cli-prefix"));
    ck_assert_ptr_nonnull(strstr(r.out, "128 blocks of 32.0 KiB"));
    kvt_cli_free(&r);
    KVT_OK(c, kvd_cache_stats(c, 0, "cli-prefix", &info)); /* still there */
    ck_assert_uint_eq(info.layout.num_layers, 4);
    ck_assert_uint_eq(info.block_bytes, 4 * 2 * 16 * 256);
    ck_assert(info.shared);
    r = kvt_cli("cache", "create", "cli-prefix", "--layers", "4", "--tokens-per-block", "16",
                "--token-bytes", "256", "--budget", "4m", "--dtype", "bf16", "--shared", "--open",
                "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    kvt_cli_free(&r);
    /* --open of an existing cache with another budget: its own, said so */
    r = kvt_cli("cache", "create", "cli-prefix", "--layers", "4", "--tokens-per-block", "16",
                "--token-bytes", "256", "--budget", "8m", "--dtype", "bf16", "--shared", "--open",
                NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "open: cache cli-prefix"));
    ck_assert_ptr_nonnull(strstr(r.out, "in 4.0 MiB, shared (its budget, not the 8.0 MiB asked)"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "ls", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "BLOCKS"));
    ck_assert_ptr_nonnull(strstr(r.out, "cli-prefix"));
    ck_assert_ptr_nonnull(strstr(r.out, "4L kv 16x256 B bf16"));
    kvt_cli_free(&r);
    r = kvt_cli("--json", "cache", "ls", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"tokens_per_block\":16"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "stats", "cli-prefix", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "0 of 128"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "stats", "--id", "999999", "--json", NULL);
    KVT_EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "ENOENT"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "clear", "cli-prefix", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "\"evicted\":0"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "create", "big", "--layers", "1", "--tokens-per-block", "1",
                "--token-bytes", "1", "--budget", "3g", NULL); /* past the 2 GiB budget */
                KVT_EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "ELIMIT"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "create", "nolayout", "--budget", "1m", NULL);
    KVT_EXPECT_RC(r, 2);
    kvt_cli_free(&r);
    r = kvt_cli("cache", "frobnicate", NULL);
    KVT_EXPECT_RC(r, 2);
    kvt_cli_free(&r);
    r = kvt_cli("cache", "drop", "cli-prefix", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "dropped cache cli-prefix"));
    kvt_cli_free(&r);
    KVT_ERR(c, kvd_cache_stats(c, 0, "cli-prefix", &info), KVD_ENOENT);
    r = kvt_cli("cache", "ls", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_str_eq(r.out, "no caches\n");
    kvt_cli_free(&r);
    kvd_client_destroy(&c);
}
END_TEST

static char *line_with(const char *text, const char *needle);

/*
 * The disk level from the command line: --disk-budget is read as a SIZE
 * (a bad one is a usage error), a daemon without --cache-dir refuses it
 * (ENOTSUP, naming --cache-dir), and JSON carries "disk": null where there
 * is none; a daemon with --cache-dir shows its disk level in `status`
 * (text and JSON) and refuses a disk budget past its own (ELIMIT).
 */
START_TEST(test_cli_cache_disk_level)
{
    char top[64], dir[64];
    kvt_daemon_t d;
    kvt_cli_result_t r;

    r = kvt_cli("cache", "create", "cli-disk", "--layers", "2", "--tokens-per-block", "4",
                "--token-bytes", "32", "--budget", "1m", "--disk-budget", "lots", NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "--disk-budget needs a positive SIZE"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "create", "cli-disk", "--layers", "2", "--tokens-per-block", "4",
                "--token-bytes", "32", "--budget", "0.1G", NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "--budget: '0.1G' is not a whole number of bytes"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "create", "cli-disk", "--layers", "2", "--tokens-per-block", "4",
                "--token-bytes", "32", "--budget", "1m", "--disk-budget", "0", NULL);
    KVT_EXPECT_RC(r, 2);
    kvt_cli_free(&r);
    r = kvt_cli("cache", "create", "cli-disk", "--layers", "2", "--tokens-per-block", "4",
                "--token-bytes", "32", "--budget", "1m", "--disk-budget", "1.5m", NULL);
    KVT_EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "ENOTSUP"));
    ck_assert_ptr_nonnull(strstr(r.err, "--cache-dir"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "create", "cli-disk", "--layers", "2", "--tokens-per-block", "4",
                "--token-bytes", "32", "--budget", "1m", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"disk\":null"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "stats", "cli-disk", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "disk         none (no disk budget)"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "ls", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "DISK_BLOCKS"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "drop", "cli-disk", NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);
    r = kvt_cli("status", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "disk        none (no --cache-dir)"));
    kvt_cli_free(&r);
    r = kvt_cli("status", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "\"disk\":null"));
    kvt_cli_free(&r);

    kvt_disk_daemon_start(&d, top, dir, "64m");
    r = kvt_cli_at(d.socket, "status", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "0 B used of a 64.0 MiB budget (0 B given to caches"));
    ck_assert_ptr_nonnull(strstr(r.out, dir));
    kvt_cli_free(&r);
    r = kvt_cli_at(d.socket, "status", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"budget_bytes\":67108864,\"reserved_bytes\":0"));
    ck_assert_ptr_nonnull(strstr(r.out, "\"io_engine\":\""));
    kvt_cli_free(&r);
    r = kvt_cli_at(d.socket, "cache", "create", "cli-big", "--layers", "2", "--tokens-per-block",
                   "4", "--token-bytes", "32", "--budget", "1m", "--disk-budget", "65m",
                   NULL); /* past --disk-budget */
    KVT_EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "ELIMIT"));
    ck_assert_ptr_nonnull(strstr(r.err, "--disk-budget"));
    kvt_cli_free(&r);
    r = kvt_cli_at(d.socket, "cache", "create", "cli-big", "--layers", "2", "--tokens-per-block",
                   "4", "--token-bytes", "32", "--budget", "1m", "--disk-budget", "1m",
                   NULL); /* a cache with a disk level */
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "; 1.0 MiB on disk (0 blocks there)"));
    kvt_cli_free(&r);
    r = kvt_cli_at(d.socket, "cache", "stats", "cli-big", NULL);
    KVT_EXPECT_RC(r, 0);
    {
        char want[128];
        snprintf(want, sizeof(want), "disk blocks  0 (0 B of 1.0 MiB) in %s/u%u-cli-big", dir,
                 (unsigned)getuid());
        ck_assert_msg(strstr(r.out, want) != NULL, "no '%s' in:\n%s", want, r.out);
    }
    ck_assert_ptr_nonnull(strstr(r.out, "0 checksum failures, 0 I/O errors"));
    kvt_cli_free(&r);
    r = kvt_cli_at(d.socket, "cache", "stats", "cli-big", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"disk\":{\"budget_bytes\":1048576,\"blocks\":0,"));
    ck_assert_ptr_nonnull(strstr(r.out, "\"no_space\":0,\"path\":\""));
    kvt_cli_free(&r);
    r = kvt_cli_at(d.socket, "cache", "ls", NULL);
    KVT_EXPECT_RC(r, 0);
    {
        char *row = line_with(r.out, "cli-big");
        ck_assert_ptr_nonnull(row);
        ck_assert_msg(strstr(row, " 0      1.0 MiB    -") != NULL, "DISK_BLOCKS, DISK_BUDGET: %s",
                      row);
        free(row);
    }
    kvt_cli_free(&r);
    kvt_disk_daemon_stop(&d, top);
}
END_TEST

/*
 * A daemon started again on its --cache-dir lists, in `kvdock status`
 * (text and JSON), each directory there it did not reopen and why: a cache
 * whose disk budget is past today's --disk-budget (its name and owner read
 * from its manifest), a directory whose manifest is damaged (neither
 * known) and one named by bytes that are not UTF-8 (shown as '?', the
 * JSON valid).  The cache that fits is served; a daemon that skipped none lists
 * none.
 */
START_TEST(test_cli_status_skipped_caches)
{
    char top[64], dir[64], path[192], want[256], *row;
    const char *extra[] = {"--cache-dir", dir, "--disk-budget", "16m", NULL};
    unsigned uid = (unsigned)getuid();
    kvt_daemon_t d;
    kvt_cli_result_t r;
    FILE *f;

    kvt_disk_daemon_start(&d, top, dir, "64m");
    r = kvt_cli_at(d.socket, "cache", "create", "cli-fits", "--layers", "2", "--tokens-per-block",
                   "4", "--token-bytes", "32", "--budget", "1m", "--disk-budget", "8m", NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);
    r = kvt_cli_at(d.socket, "cache", "create", "cli-past", "--layers", "2", "--tokens-per-block",
                   "4", "--token-bytes", "32", "--budget", "1m", "--disk-budget", "32m", NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);
    r = kvt_cli_at(d.socket, "status", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(strstr(r.out, "skipped") == NULL, "none skipped yet:\n%s", r.out);
    kvt_cli_free(&r);
    r = kvt_cli_at(d.socket, "status", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "\"skipped_total\":0,\"skipped\":[]}"));
    kvt_cli_free(&r);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);

    snprintf(path, sizeof(path), "%s/u%u-cli-junk", dir, uid);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/u%u-cli-junk/manifest", dir, uid);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("not a manifest\n", f);
    ck_assert_int_eq(fclose(f), 0);
    snprintf(path, sizeof(path), "%s/x\377y", dir); /* a name not UTF-8, no manifest */
    ck_assert_int_eq(mkdir(path, 0700), 0);
    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);

    r = kvt_cli_at(d.socket, "status", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(strstr(r.out, "\nskipped     3 directories of the cache dir not reopened at "
                                "start: left as they are, not served\n") != NULL,
                  "no skipped caches in:\n%s", r.out);
    snprintf(want, sizeof(want), "\n  u%u-cli-past (cache cli-past, uid %u): its disk budget "
             "(33554432) does not fit the daemon's (--disk-budget 16777216, ", uid, uid);
    ck_assert_msg(strstr(r.out, want) != NULL, "no '%s' in:\n%s", want, r.out);
    row = line_with(r.out, "-cli-past (cache");
    ck_assert_msg(strstr(row, "reopened before it)") != NULL, "the reason cut: %s", row);
    free(row);
    snprintf(want, sizeof(want), "\n  u%u-cli-junk: damaged manifest: ", uid);
    ck_assert_msg(strstr(r.out, want) != NULL, "no '%s' in:\n%s", want, r.out);
    ck_assert_ptr_null(line_with(r.out, "-cli-fits"));
    kvt_cli_free(&r);

    r = kvt_cli_at(d.socket, "status", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"skipped_total\":3,\"skipped\":[{\"dir\":\""));
    ck_assert_ptr_nonnull(strstr(r.out, "{\"dir\":\"x?y\",\"name\":null,\"owner_uid\":null,"
                                        "\"reason\":\"no manifest: "));
    snprintf(want, sizeof(want), "{\"dir\":\"u%u-cli-past\",\"name\":\"cli-past\",\"owner_uid\":%u,"
             "\"reason\":\"its disk budget (33554432) does not fit", uid, uid);
    ck_assert_msg(strstr(r.out, want) != NULL, "no %s in:\n%s", want, r.out);
    snprintf(want, sizeof(want), "{\"dir\":\"u%u-cli-junk\",\"name\":null,\"owner_uid\":null,"
             "\"reason\":\"damaged manifest: ", uid);
    ck_assert_msg(strstr(r.out, want) != NULL, "no %s in:\n%s", want, r.out);
    kvt_cli_free(&r);

    r = kvt_cli_at(d.socket, "cache", "ls", NULL); /* the one that fits is served */
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "cli-fits"));
    ck_assert_ptr_null(strstr(r.out, "cli-past"));
    kvt_cli_free(&r);
    kvt_disk_daemon_stop(&d, top);
}
END_TEST

/* The line of text holding needle (a copy; NULL when none). */
static char *line_with(const char *text, const char *needle)
{
    const char *p = strstr(text, needle), *b, *e;

    if (p == NULL)
        return NULL;
    for (b = p; b > text && b[-1] != '\n'; b--)
        ;
    e = strchr(p, '\n');
    return strndup(b, e != NULL ? (size_t)(e - b) : strlen(b));
}

/* The cell of column col (right-aligned, as the figures are) in row, a
 * line of the table whose header is out's first line (a copy; NULL when
 * out has no such column).  Cells are apart by two spaces or more. */
static char *cell_of(const char *out, const char *row, const char *col)
{
    const char *nl = strchr(out, '\n'), *h = out;
    size_t n = strlen(col), end, b;

    for (;;) {
        h = strstr(h, col);
        if (h == NULL || h > nl)
            return NULL;
        if ((h == out || h[-1] == ' ') && (h[n] == ' ' || h[n] == '\n'))
            break;
        h += n;
    }
    end = (size_t)(h - out) + n;
    if (strlen(row) < end)
        return NULL;
    for (b = end; b > 0 && !(b >= 2 && row[b - 1] == ' ' && row[b - 2] == ' '); b--)
        ;
    return strndup(row + b, end - b);
}

/* `cache ls` USED is its blocks' bytes, and RESERVED the host memory the
 * cache holds for them (its slab, entries and index): one 32 KiB block
 * saved makes a slab of the whole 4 MiB budget; USED says 32 KiB, and
 * RESERVED the slab. */
START_TEST(test_cli_cache_used_and_reserved)
{
    kvd_client_t *c = kvt_connect("cache-used");
    kvd_cache_info_t info;
    kvd_op_result_t res;
    kvt_pool_t p;
    uint8_t key[32];
    const int64_t page = 0;
    kvd_cache_save_t sv;
    char held[32], used[32], *row;
    kvt_cli_result_t r;

    r = kvt_cli("cache", "create", "cli-used", "--layers", "4", "--tokens-per-block", "16",
                "--token-bytes", "256", "--budget", "4m", "--shared", NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);
    KVT_OK(c, kvd_cache_stats(c, 0, "cli-used", &info));
    kvt_pool_make(c, &p, "used", 4, 4 * 16, 256, false, 16);
    memset(key, 7, sizeof(key));
    memset(&sv, 0, sizeof(sv));
    sv.cache = info.id;
    sv.pool = p.info.id;
    sv.keys.blob = key;
    sv.keys.key_size = sizeof(key);
    sv.keys.count = 1;
    sv.blocks.values = &page;
    sv.blocks.count = 1;
    sv.blocks.dtype = KVD_DTYPE_I64;
    KVT_OK(c, kvd_cache_save(c, &sv, NULL, &res));
    ck_assert_uint_eq(res.stored, 1);
    KVT_OK(c, kvd_cache_stats(c, info.id, NULL, &info));
    ck_assert_uint_eq(info.used_bytes, 32 * 1024);
    ck_assert_msg(info.held_bytes >= 4u << 20, "held %" PRIu64 " bytes: no slab counted",
                  info.held_bytes);
    snprintf(held, sizeof(held), "%.1f MiB", (double)info.held_bytes / (1 << 20));
    snprintf(used, sizeof(used), "%.1f KiB", (double)info.used_bytes / 1024);
    r = kvt_cli("cache", "ls", NULL);
    KVT_EXPECT_RC(r, 0);
    row = line_with(r.out, "cli-used");
    ck_assert_ptr_nonnull(row);
    {
        char *u = cell_of(r.out, row, "USED"), *h = cell_of(r.out, row, "RESERVED");
        ck_assert_msg(u != NULL && h != NULL && strcmp(u, used) == 0 && strcmp(h, held) == 0,
                      "not USED %s (the blocks), RESERVED %s (held):\n%s", used, held, r.out);
        free(u);
        free(h);
    }
    free(row);
    kvt_cli_free(&r);
    r = kvt_cli("cache", "stats", "cli-used", NULL); /* both figures, named */
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "1 of 128 (32.0 KiB of 4.0 MiB)"));
    ck_assert_ptr_nonnull(strstr(r.out, held));
    kvt_cli_free(&r);
    kvt_pool_free(c, &p);
    KVT_OK(c, kvd_cache_drop(c, info.id, NULL));
    kvd_client_destroy(&c);
}
END_TEST

/* Caches' budgets may add up past the host-memory budget (each alone
 * fits); the daemon then warns in its log and `kvdock status` says so,
 * in text and JSON, until one goes. */
START_TEST(test_cli_cache_budgets_past_host_budget)
{
    kvd_client_t *c = kvt_connect("cache-budgets");
    double before;
    kvt_cli_result_t r;

    r = kvt_cli("status", "--json", NULL); /* other tests' caches are gone: nothing but a trifle */
    KVT_EXPECT_RC(r, 0);
    before = json_number(r.out, "cache_budgets");
    ck_assert(before < 64 << 20);
    kvt_cli_free(&r);
    r = kvt_cli("cache", "create", "cli-big1", "--layers", "1", "--tokens-per-block", "1",
                "--token-bytes", "1k", "--budget", "1.5g", NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);
    r = kvt_cli("status", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_null(strstr(r.out, "warning"));
    kvt_cli_free(&r);
    r = kvt_cli("status", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "\"caches_over_budget\":false"));
    ck_assert(json_number(r.out, "cache_budgets") == before + 1.5 * (1 << 30));
    kvt_cli_free(&r);
    ck_assert(!log_has("event=cache_budgets_over"));

    r = kvt_cli("cache", "create", "cli-big2", "--layers", "1", "--tokens-per-block", "1",
                "--token-bytes", "1k", "--budget", "1g", NULL);
    KVT_EXPECT_RC(r, 0); /* allowed: each fits, and neither holds memory yet */
    kvt_cli_free(&r);
    ck_assert(log_has("event=cache_budgets_over cache=cli-big2 budgets=%llu host_budget=%llu",
                      (unsigned long long)before + (5ull << 29), (unsigned long long)(2ull << 30)));
    r = kvt_cli("status", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(before > 0 ||
                      strstr(r.out, "  warning     the caches' budgets add up to 2.5 GiB, past "
                                    "the host-memory budget: not all can fill\n") != NULL,
                  "no warning:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "  warning     the caches' budgets add up to "));
    kvt_cli_free(&r);
    r = kvt_cli("status", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"caches_over_budget\":true"));
    ck_assert(json_number(r.out, "cache_budgets") == before + 2.5 * (1 << 30));
    kvt_cli_free(&r);

    KVT_OK(c, kvd_cache_drop(c, 0, "cli-big2"));
    r = kvt_cli("status", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_null(strstr(r.out, "warning"));
    kvt_cli_free(&r);
    KVT_OK(c, kvd_cache_drop(c, 0, "cli-big1"));
    kvd_client_destroy(&c);
}
END_TEST

/* `--metrics 127.0.0.1:0`: the port the daemon picked, as its log says,
 * is in `kvdock status` and its JSON; without --metrics, neither names
 * one. */
START_TEST(test_cli_status_metrics_port)
{
    static const char *const extra[] = {"--metrics", "127.0.0.1:0", NULL};
    kvt_daemon_t d;
    char line[1024], want[96];
    unsigned port = 0;
    kvt_cli_result_t r;
    FILE *f;

    r = kvt_cli("status", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_null(strstr(r.out, "metrics"));
    kvt_cli_free(&r);
    r = kvt_cli("status", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "\"metrics_address\":\"\""));
    kvt_cli_free(&r);

    ck_assert_int_eq(kvt_daemon_start(&d, "cpu", extra, (int)KVT_MS(10000)), 0);
    f = fopen(d.log, "r");
    ck_assert_ptr_nonnull(f);
    while (port == 0 && fgets(line, sizeof(line), f) != NULL) {
        const char *e = strstr(line, "event=metrics_listening");
        if (e != NULL && strstr(e, " port=") != NULL)
            port = (unsigned)strtoul(strstr(e, " port=") + 6, NULL, 10);
    }
    fclose(f);
    ck_assert_uint_ne(port, 0);
    r = kvt_cli_at(d.socket, "status", NULL);
    KVT_EXPECT_RC(r, 0);
    snprintf(want, sizeof(want), "  metrics     http://127.0.0.1:%u/metrics\n", port);
    ck_assert_msg(strstr(r.out, want) != NULL, "no '%s' in:\n%s", want, r.out);
    kvt_cli_free(&r);
    r = kvt_cli_at(d.socket, "status", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    snprintf(want, sizeof(want), "\"metrics_address\":\"127.0.0.1:%u\"", port);
    ck_assert_msg(strstr(r.out, want) != NULL, "no %s in:\n%s", want, r.out);
    kvt_cli_free(&r);
    ck_assert_int_eq(kvt_daemon_stop(&d, 10000), 0);
}
END_TEST

START_TEST(test_cli_unknown_pool)
{
    kvt_cli_result_t r = kvt_cli("pool", "drop", "no-such-pool-anywhere", NULL);

    KVT_EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "ENOENT"));
    ck_assert_ptr_nonnull(strstr(r.err, "pool drop"));
    ck_assert_str_eq(r.out, "");
    kvt_cli_free(&r);
}
END_TEST

START_TEST(test_cli_ping)
{
    kvt_cli_result_t r = kvt_cli("ping", "--count", "5", NULL);
    int lines = 0;

    KVT_EXPECT_RC(r, 0);
    for (const char *p = r.out; (p = strstr(p, "time=")) != NULL; p++)
        lines++;
    ck_assert_int_eq(lines, 5);
    ck_assert_ptr_nonnull(strstr(r.out, "min/avg/p50/p99/max"));
    kvt_cli_free(&r);

    r = kvt_cli("ping", "--count", "20", "--size", "4k", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"count\":20"));
    ck_assert_ptr_nonnull(strstr(r.out, "\"p99_us\":"));
    kvt_cli_free(&r);

    /* nearest rank: with 3 samples the 99th percentile is the largest */
    r = kvt_cli("ping", "--count", "3", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(json_number(r.out, "p99_us") == json_number(r.out, "max_us"),
                  "p99 is not the largest of 3:\n%s", r.out);
    kvt_cli_free(&r);
}
END_TEST

START_TEST(test_cli_stats)
{
    kvt_cli_result_t r = kvt_cli("stats", NULL);

    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "OP"));
    ck_assert_ptr_nonnull(strstr(r.out, "REQUESTS"));
    kvt_cli_free(&r);
    r = kvt_cli("stats", "--json", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"ops\":["));
    ck_assert_ptr_nonnull(strstr(r.out, "\"streams\":["));
    kvt_cli_free(&r);
}
END_TEST

/* Numbers are decimal whatever their zeros, sizes take units and
 * fractions (the parser the daemon shares, proto/src/parse.h); hex, octal
 * and a count with a unit are usage errors. */
START_TEST(test_cli_numbers)
{
    char name[64];
    kvt_cli_result_t r;

    snprintf(name, sizeof(name), "cli-num-%d", (int)getpid());
    r = kvt_cli("--json", "pool", "create", name, "--layers", "010", "--slots", "08",
                "--slot-bytes", "1.5K", "--shared", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(json_number(r.out, "num_layers") == 10, "%s", r.out);
    ck_assert_msg(json_number(r.out, "num_slots") == 8, "%s", r.out);
    ck_assert_msg(json_number(r.out, "slot_bytes") == 1536, "%s", r.out);
    kvt_cli_free(&r);
    r = kvt_cli("pool", "drop", name, NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);

    static const char *const bad[][2] = {{"--layers", "0x10"}, {"--slots", "1k"},
                                         {"--slot-bytes", "0.1K"}, {"--slot-bytes", "1.5"},
                                         {"--layers", "-1"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *v[6] = {"--layers", "2", "--slots", "8", "--slot-bytes", "64"};
        for (int k = 0; k < 6; k += 2)
            if (strcmp(v[k], bad[i][0]) == 0)
                v[k + 1] = bad[i][1];
        r = kvt_cli("pool", "create", name, v[0], v[1], v[2], v[3], v[4], v[5], "--shared", NULL);
        ck_assert_msg(r.rc == 2, "%s %s: exit %d\n%s%s", bad[i][0], bad[i][1], r.rc, r.out,
                      r.err);
        kvt_cli_free(&r);
    }
}
END_TEST

/* Names are UTF-8 or refused (EINVAL, saying so); one that is prints as
 * itself in valid JSON. */
START_TEST(test_cli_utf8_names)
{
    kvd_client_t *c = NULL;
    kvt_cli_result_t r;

    ck_assert_int_eq(kvd_client_create(kvt_d.socket, "bad\xff", &c), KVD_EINVAL);
    ck_assert_ptr_nonnull(strstr(kvd_client_last_error(NULL), "UTF-8"));
    ck_assert_int_eq(kvd_client_create(kvt_d.socket, "over\xc0\xaflong", &c), KVD_EINVAL);
    ck_assert_int_eq(kvd_client_create(kvt_d.socket, "surrogate\xed\xa0\x80", &c), KVD_EINVAL);
    KVT_OK(NULL, kvd_client_create(kvt_d.socket, "w\xc3\xb6rker-\xe2\x9c\x93", &c));
    r = kvt_cli("--json", "status", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "not one JSON object:\n%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "\"w\xc3\xb6rker-\xe2\x9c\x93\""));
    kvt_cli_free(&r);
    kvd_client_destroy(&c);
}
END_TEST

/* Every line of out within 100 columns. */
static void within_100(const char *what, const char *out)
{
    for (const char *line = out; *line;) {
        size_t n = strcspn(line, "\n");
        ck_assert_msg(n <= 100, "%s: a line of %zu columns: %.*s", what, n, (int)n, line);
        line += n + (line[n] == '\n');
    }
}

/* getopt_long-style parsing: whole names, --name=value, "--" ends the
 * options, a near miss gets a suggestion; --help of every command within
 * 100 columns, and the usages say what is required. */
START_TEST(test_cli_by_the_book)
{
    static const char *const cmds[] = {"status", "pools", "pool", "stats", "ping",
                                       "shutdown", "cache", "bench", "top", NULL};
    char name[64], dash[72];
    kvt_cli_result_t r;

    for (int i = 0; cmds[i] != NULL; i++) {
        const char *argv[] = {kvt_cli_path(), cmds[i], "--help", NULL};

        r.rc = kvt_run(argv, &r.out, &r.err, 10000);
        KVT_EXPECT_RC(r, 0);
        ck_assert_ptr_nonnull(strstr(r.out, "usage: kvdock "));
        within_100(cmds[i], r.out);
        if (strcmp(cmds[i], "pool") == 0) /* --kind is optional */
            ck_assert_ptr_nonnull(strstr(r.out, "[--kind host|device|device-vmm]"));
        if (strcmp(cmds[i], "cache") == 0)
            ck_assert_ptr_nonnull(strstr(r.out, "[--cluster]"));
        if (strcmp(cmds[i], "pools") == 0) { /* what OWNER and the flags mean */
            ck_assert_ptr_nonnull(strstr(r.out, "CLIENT is the id of the client connection"));
            ck_assert_ptr_nonnull(strstr(r.out, "orphaned (its maker's connection"));
        }
        kvt_cli_free(&r);
    }
    {
        const char *argv[] = {kvt_cli_path(), "--help", NULL};

        r.rc = kvt_run(argv, &r.out, &r.err, 10000);
        KVT_EXPECT_RC(r, 0);
        within_100("kvdock --help", r.out);
        /* the command list wraps under its summaries */
        ck_assert_ptr_null(strstr(r.out, "\nor clear"));
        ck_assert_ptr_nonnull(strstr(r.out, "\n            and counters, drop, or clear"));
        kvt_cli_free(&r);
    }
    r = kvt_cli("pool", "list", NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "`kvdock pools` lists them"));
    kvt_cli_free(&r);
    /* a near miss: refused, with the option meant */
    r = kvt_cli("pool", "create", "x", "--lay", "2", NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "did you mean --layers?"));
    kvt_cli_free(&r);
    r = kvt_cli("pool", "create", "x", "--slotbytes", "2", NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "did you mean --slot-bytes?"));
    kvt_cli_free(&r);
    r = kvt_cli("status", "--jsn", NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "did you mean --json?"));
    kvt_cli_free(&r);
    /* commands and subcommands the same way; none suggested when far */
    r = kvt_cli("sttus", NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "unknown command 'sttus' (did you mean status?)"));
    kvt_cli_free(&r);
    r = kvt_cli("xyzzy", NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_ptr_null(strstr(r.err, "did you mean"));
    kvt_cli_free(&r);
    r = kvt_cli("pool", "craete", "x", NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "(did you mean create?)"));
    kvt_cli_free(&r);
    r = kvt_cli("cache", "stat", NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "(did you mean stats?)"));
    kvt_cli_free(&r);
    /* a flag with a value, an option without one */
    r = kvt_cli("pool", "create", "x", "--mla=yes", NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "--mla takes no value"));
    kvt_cli_free(&r);
    r = kvt_cli("ping", "--count", NULL);
    KVT_EXPECT_RC(r, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "--count needs a value"));
    kvt_cli_free(&r);

    /* --name=value, options after arguments, common options anywhere, and
     * "--": a pool whose name starts with '-' */
    snprintf(name, sizeof(name), "cli-book-%d", (int)getpid());
    snprintf(dash, sizeof(dash), "-%s", name);
    r = kvt_cli("pool", "create", "--layers=1", "--slots", "2", "--slot-bytes=8", "--json",
                "--shared", "--", dash, NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_msg(kvt_json_object_valid(r.out), "%s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, dash));
    kvt_cli_free(&r);
    r = kvt_cli("pool", "drop", dash, NULL); /* without "--" it is an option */
    KVT_EXPECT_RC(r, 2);
    kvt_cli_free(&r);
    r = kvt_cli("pool", "drop", "--", dash, NULL);
    KVT_EXPECT_RC(r, 0);
    kvt_cli_free(&r);
}
END_TEST

/* Usage errors exit 2 with "kvdock: " and the message, then the
 * command's usage: the message names no command of its own (the usage
 * line below does), whichever command and check refused. */
START_TEST(test_cli_usage_errors)
{
    const char *const cases[][10] = {
        {"frobnicate", NULL},
        {"pool", NULL},
        {"pool", "resize", "x", NULL},
        {"pool", "create", NULL},
        {"pool", "create", "x", "--layers", "2", NULL},
        {"pool", "create", "x", "--kind", "gpu", "--layers", "1", "--slots", "1"},
        {"pool", "create", "x", "--layers", "zero", "--slots", "1", "--slot-bytes"},
        {"ping", "--count", "-3", NULL},
        {"status", "extra", NULL},
        {"pools", "--bogus", NULL},
        {"cache", "frob", NULL},
        {"cache", "create", NULL},
        {"cache", "create", "x", "--layers", "zero", NULL},
        {"cache", "create", "x", "--budget", "0", NULL},
        {"cache", "drop", NULL},
        {"cache", "ls", "extra", NULL},
        {"bench", "extra", NULL},
        {"bench", "--iterations", "0", NULL},
        {"top", "extra", NULL},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvt_cli_result_t r = kvt_cli(cases[i][0], cases[i][1], cases[i][2], cases[i][3],
                                     cases[i][4], cases[i][5], cases[i][6], cases[i][7],
                                     cases[i][8], NULL);
        char own[32];

        ck_assert_msg(r.rc == 2, "case %zu (%s %s): exit %d, expected 2\nstderr:\n%s", i,
                      cases[i][0], cases[i][1] ? cases[i][1] : "", r.rc, r.err);
        ck_assert_msg(strncmp(r.err, "kvdock: ", 8) == 0, "case %zu: no message:\n%s", i,
                      r.err);
        snprintf(own, sizeof(own), "%s: ", cases[i][0]);
        ck_assert_msg(strncmp(r.err + 8, own, strlen(own)) != 0,
                      "case %zu: the message names its command:\n%s", i, r.err);
        ck_assert_msg(strstr(r.err, "\nusage: kvdock ") != NULL ||
                          strstr(r.err, "\nrun 'kvdock --help'") != NULL,
                      "case %zu: no usage:\n%s", i, r.err);
        kvt_cli_free(&r);
    }
    {
        const char *argv[] = {kvt_cli_path(), NULL};
        kvt_cli_result_t r;

        r.rc = kvt_run(argv, &r.out, &r.err, 10000);
        KVT_EXPECT_RC(r, 2);
        kvt_cli_free(&r);
    }
}
END_TEST

START_TEST(test_cli_no_daemon)
{
    kvt_cli_result_t r = kvt_cli_at("/nonexistent/kvdockd.sock", "status", NULL);

    KVT_EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "ECONN"));
    ck_assert_ptr_nonnull(strstr(r.err, "/nonexistent/kvdockd.sock"));
    kvt_cli_free(&r);
}
END_TEST

/* --socket naming a directory: said so */
START_TEST(test_cli_socket_is_a_directory)
{
    kvt_cli_result_t r = kvt_cli_at("/tmp", "status", NULL);

    KVT_EXPECT_RC(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "/tmp: it is a directory"));
    kvt_cli_free(&r);
    { /* and the daemon, given a directory, names the file it wants */
        char dir[] = "/tmp/kvdt-sockdir-XXXXXX";
        const char *argv[] = {kvt_daemon_path(), "--backend", "cpu", "--socket", dir,
                              "--host-memory-budget", "64M", NULL};

        ck_assert_ptr_nonnull(mkdtemp(dir));
        r.rc = kvt_run(argv, &r.out, &r.err, 10000);
        ck_assert_int_ne(r.rc, 0);
        ck_assert_msg(strstr(r.err, "is a directory: --socket names the socket file itself") !=
                          NULL,
                      "%s", r.err);
        kvt_cli_free(&r);
        ck_assert_int_eq(rmdir(dir), 0);
    }
}
END_TEST

START_TEST(test_cli_default_socket_from_env)
{
    const char *argv[] = {kvt_cli_path(), "ping", NULL};
    kvt_cli_result_t r;

    setenv("KVDOCK_SOCKET", kvt_d.socket, 1);
    r.rc = kvt_run(argv, &r.out, &r.err, 10000);
    unsetenv("KVDOCK_SOCKET");
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, kvt_d.socket));
    kvt_cli_free(&r);
}
END_TEST

static Suite *cli_suite(void)
{
    Suite *s = suite_create("client_cli");
    TCase *tc = tcase_create("cli");

    tcase_add_unchecked_fixture(tc, kvt_suite_setup, kvt_suite_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_cli_help);
    tcase_add_test(tc, test_cli_status);
    tcase_add_test(tc, test_cli_pool_create);
    tcase_add_test(tc, test_cli_pools_and_drop);
    tcase_add_test(tc, test_cli_shared_pool_outlives_creator);
    tcase_add_test(tc, test_cli_shared_pool_drop_needs_admin);
    tcase_add_test(tc, test_cli_imported_shared_pool_dies_with_importer);
    tcase_add_test(tc, test_cli_unknown_pool);
    tcase_add_test(tc, test_cli_ping);
    tcase_add_test(tc, test_cli_stats);
    tcase_add_test(tc, test_cli_cache);
    tcase_add_test(tc, test_cli_cache_disk_level);
    tcase_add_test(tc, test_cli_status_skipped_caches);
    tcase_add_test(tc, test_cli_cache_used_and_reserved);
    tcase_add_test(tc, test_cli_cache_budgets_past_host_budget);
    tcase_add_test(tc, test_cli_status_metrics_port);
    tcase_add_test(tc, test_cli_numbers);
    tcase_add_test(tc, test_cli_utf8_names);
    tcase_add_test(tc, test_cli_by_the_book);
    tcase_add_test(tc, test_cli_usage_errors);
    tcase_add_test(tc, test_cli_no_daemon);
    tcase_add_test(tc, test_cli_socket_is_a_directory);
    tcase_add_test(tc, test_cli_default_socket_from_env);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(cli_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
