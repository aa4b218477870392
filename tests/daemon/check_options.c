/*
 * check_options: the daemon's option table and its three consumers (the
 * command line, the config file, --help), with good and bad values; the
 * copy paths they choose between, and which copies may go as 2D copies
 * over the layers.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "dataop.h"
#include "dispatch.h"
#include "options.h"

static char err[512];

START_TEST(test_defaults)
{
    kvd__options_t o;
    size_t i;

    kvd__options_init(&o);
    ck_assert_str_eq(o.socket, "");
    ck_assert_int_eq(o.backend, KVD_BACKEND_AUTO);
    ck_assert_int_eq(o.log_level, 2);
    ck_assert_uint_eq(o.max_frame_bytes, 16u << 20);
    ck_assert_uint_eq(o.max_inline_bytes, 4u << 20);
    ck_assert_uint_eq(o.blocks[KVD_STREAM_OFFLOAD], 32);
    ck_assert_int_eq(o.priority[KVD_STREAM_RELOAD], 1);
    ck_assert_int_eq(kvd__options_check(&o, err, sizeof(err)), KVD_OK);
    /* every default is itself a valid value of its option */
    for (i = 0; i < kvd__option_count; i++)
        ck_assert_msg(kvd__options_set(&o, kvd__option_table[i].name, kvd__option_table[i].def,
                                       err, sizeof(err)) == KVD_OK,
                      "%s: %s", kvd__option_table[i].name, err);
}
END_TEST

START_TEST(test_set_values)
{
    kvd__options_t o;
    char buf[64];

    kvd__options_init(&o);
    ck_assert_int_eq(kvd__options_set(&o, "backend", "cpu", err, sizeof(err)), KVD_OK);
    ck_assert_int_eq(o.backend, KVD_BACKEND_CPU);
    ck_assert_int_eq(kvd__options_set(&o, "max-frame-bytes", "1M", err, sizeof(err)), KVD_OK);
    ck_assert_uint_eq(o.max_frame_bytes, 1u << 20);
    ck_assert_int_eq(kvd__options_set(&o, "max-pool-bytes", "2g", err, sizeof(err)), KVD_OK);
    ck_assert_uint_eq(o.max_pool_bytes, 2ull << 30);
    ck_assert_int_eq(kvd__options_set(&o, "max-total-pool-bytes", "1T", err, sizeof(err)), KVD_OK);
    ck_assert_uint_eq(o.max_total_pool_bytes, 1ull << 40);
    ck_assert_int_eq(kvd__options_set(&o, "d2d-blocks", "8", err, sizeof(err)), KVD_OK);
    ck_assert_uint_eq(o.blocks[KVD_STREAM_D2D], 8);
    ck_assert_int_eq(kvd__options_set(&o, "log-level", "debug", err, sizeof(err)), KVD_OK);
    ck_assert_int_eq(o.log_level, 3);
    /* numbers are decimal, sizes take binary and decimal units and fractions
     * (the parser CLI and daemon share, proto/src/parse.h) */
    ck_assert_int_eq(kvd__options_set(&o, "max-inflight", "010", err, sizeof(err)), KVD_OK);
    ck_assert_uint_eq(o.max_inflight, 10);
    ck_assert_int_eq(kvd__options_set(&o, "host-memory-budget", "2GiB", err, sizeof(err)), KVD_OK);
    ck_assert_uint_eq(o.host_memory_budget.bytes, 2ull << 30);
    ck_assert_int_eq(kvd__options_set(&o, "host-memory-budget", "2GB", err, sizeof(err)), KVD_OK);
    ck_assert_uint_eq(o.host_memory_budget.bytes, 2000000000ull);
    ck_assert_int_eq(kvd__options_set(&o, "host-memory-budget", "1.5G", err, sizeof(err)), KVD_OK);
    ck_assert_uint_eq(o.host_memory_budget.bytes, 3ull << 29);
    ck_assert_int_eq(kvd__options_set(&o, "max-frame-bytes", "16MB", err, sizeof(err)), KVD_OK);
    ck_assert_uint_eq(o.max_frame_bytes, 16000000);
    /* a size out of range is said in sizes */
    ck_assert_int_eq(kvd__options_set(&o, "host-memory-budget", "8M", err, sizeof(err)),
                     KVD_ERANGE);
    ck_assert_str_eq(err, "host-memory-budget: 8M (8.0 MiB) is below the least, 16.0 MiB");
    ck_assert_int_eq(kvd__options_set(&o, "socket", "/run/x.sock", err, sizeof(err)), KVD_OK);
    ck_assert_str_eq(o.socket, "/run/x.sock");
    kvd__options_format(&o, &kvd__option_table[2], buf, sizeof(buf)); /* backend */
    ck_assert_str_eq(buf, "cpu");
}
END_TEST

static const struct {
    const char *name, *value;
    kvd_status_t want;
} bad_values[] = {
    {"no-such-option", "1", KVD_EINVAL},
    {"backend", "gpu", KVD_EINVAL},
    {"backend", "", KVD_EINVAL},
    {"log-level", "verbose", KVD_EINVAL},
    {"max-inflight", "0", KVD_ERANGE},
    {"max-inflight", "-1", KVD_EINVAL},
    {"max-inflight", "12abc", KVD_EINVAL},
    {"max-inflight", "", KVD_EINVAL},
    {"max-inflight", " 5", KVD_EINVAL},
    {"max-inflight", "99999999999999999999999", KVD_EINVAL},
    {"max-frame-bytes", "1K", KVD_ERANGE}, /* below 4096 */
    {"max-frame-bytes", "2G", KVD_ERANGE},
    {"max-frame-bytes", "16Q", KVD_EINVAL},
    {"max-frame-bytes", "16XB", KVD_EINVAL},
    {"max-inflight", "0x10", KVD_EINVAL}, /* decimal only */
    {"max-inflight", "1k", KVD_EINVAL},   /* a count, not a size */
    {"host-memory-budget", "1.5", KVD_EINVAL},
    {"host-memory-budget", "0.1K", KVD_EINVAL}, /* a fraction of a byte */
    {"max-pool-bytes", "99999999999T", KVD_EINVAL}, /* overflows */
    {"device", "-1", KVD_ERANGE},
    {"device", "x", KVD_EINVAL},
    {"reload-priority", "17", KVD_ERANGE},
    {"offload-blocks", "1.5", KVD_EINVAL},
    {"disk-threads", "65", KVD_ERANGE},
};

START_TEST(test_bad_values)
{
    kvd__options_t o, before;

    kvd__options_init(&o);
    before = o;
    err[0] = '\0';
    ck_assert_int_eq(kvd__options_set(&o, bad_values[_i].name, bad_values[_i].value, err,
                                      sizeof(err)),
                     bad_values[_i].want);
    ck_assert_msg(err[0] != '\0', "no message for %s", bad_values[_i].name);
    ck_assert_mem_eq(&o, &before, sizeof(o)); /* unchanged */
}
END_TEST

/* A fraction of a byte is said as such, in a size option and in one
 * that also takes a share of memory. */
START_TEST(test_inexact_size_said)
{
    kvd__options_t o;

    kvd__options_init(&o);
    ck_assert_int_eq(kvd__options_set(&o, "host-memory-budget", "0.1G", err, sizeof(err)),
                     KVD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "'0.1G' is not a whole number of bytes"));
    ck_assert_int_eq(kvd__options_set(&o, "max-frame-bytes", "0.3M", err, sizeof(err)),
                     KVD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "'0.3M' is not a whole number of bytes"));
    ck_assert_int_eq(kvd__options_set(&o, "max-frame-bytes", "lots", err, sizeof(err)),
                     KVD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "is not a size"));
}
END_TEST

START_TEST(test_long_string)
{
    kvd__options_t o;
    char big[KVD_OPT_STR_MAX + 10];

    kvd__options_init(&o);
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    ck_assert_int_eq(kvd__options_set(&o, "socket", big, err, sizeof(err)), KVD_ERANGE);
}
END_TEST

/* --cluster-peers takes as many peers as the cluster does (64 of the
 * longest names), not 255 bytes; past its own limit it is refused. */
START_TEST(test_cluster_peers_long)
{
    kvd__options_t *o = malloc(sizeof(*o));
    char *list = malloc(KVD_OPT_PEERS_MAX + 10);
    size_t len = 0;

    kvd__options_init(o);
    for (int i = 0; i < 64; i++)
        len += (size_t)snprintf(list + len, KVD_OPT_PEERS_MAX - len, "%s10.0.%d.%d:7070",
                                i ? "," : "", i / 8, i);
    ck_assert_uint_gt(len, KVD_OPT_STR_MAX);
    ck_assert_int_eq(kvd__options_set(o, "cluster-peers", list, err, sizeof(err)), KVD_OK);
    ck_assert_str_eq(o->cluster_peers, list);
    memset(list, 'a', KVD_OPT_PEERS_MAX + 1);
    list[KVD_OPT_PEERS_MAX] = '\0';
    ck_assert_int_eq(kvd__options_set(o, "cluster-peers", list, err, sizeof(err)), KVD_ERANGE);
    ck_assert_ptr_nonnull(strstr(err, "longer than 16383 bytes"));
    free(list);
    free(o);
}
END_TEST

START_TEST(test_cross_checks)
{
    kvd__options_t o;

    kvd__options_init(&o);
    o.max_inline_bytes = o.max_frame_bytes + 1;
    ck_assert_int_eq(kvd__options_check(&o, err, sizeof(err)), KVD_EINVAL);
    kvd__options_init(&o);
    o.max_pool_bytes = 100;
    o.max_total_pool_bytes = 50;
    ck_assert_int_eq(kvd__options_check(&o, err, sizeof(err)), KVD_EINVAL);
    kvd__options_init(&o);
    snprintf(o.allow_uids, sizeof(o.allow_uids), "1000,abc");
    ck_assert_int_eq(kvd__options_check(&o, err, sizeof(err)), KVD_EINVAL);
    snprintf(o.allow_uids, sizeof(o.allow_uids), "1000, 1001");
    ck_assert_int_eq(kvd__options_check(&o, err, sizeof(err)), KVD_OK);
    ck_assert(kvd__options_id_listed(o.allow_uids, 1001));
    ck_assert(!kvd__options_id_listed(o.allow_uids, 100));
    ck_assert(!kvd__options_id_listed("", 0));
}
END_TEST

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(test_config_file)
{
    char path[] = "/tmp/kvdt-conf-XXXXXX";
    int fd = mkstemp(path);
    kvd__options_t o;

    ck_assert_int_ge(fd, 0);
    close(fd);
    write_file(path, "# kvdockd config\n"
                     "\n"
                     "backend = cpu\n"
                     "  max-inflight=7   # trailing comment\n"
                     "socket = \"/run/kvdock/a test #1.sock\"  # quoted: spaces and a '#'\n"
                     "metrics = '127.0.0.1:9400'\n"
                     "metrics-allow-remote = True\n"
                     "offload-blocks = 4\n");
    kvd__options_init(&o);
    ck_assert_int_eq(kvd__options_load_file(&o, path, err, sizeof(err)), KVD_OK);
    ck_assert_int_eq(o.backend, KVD_BACKEND_CPU);
    ck_assert_uint_eq(o.max_inflight, 7);
    ck_assert_str_eq(o.socket, "/run/kvdock/a test #1.sock");
    ck_assert_str_eq(o.metrics, "127.0.0.1:9400");
    ck_assert_int_eq(o.metrics_allow_remote, 1);
    ck_assert_uint_eq(o.blocks[KVD_STREAM_OFFLOAD], 4);
    /* every usual spelling of a switch */
    for (int i = 0; i < 8; i++) {
        static const char *const words[] = {"yes", "ON", "true", "1", "no", "Off", "FALSE", "0"};
        ck_assert_int_eq(kvd__options_set(&o, "metrics-allow-remote", words[i], err, sizeof(err)),
                         KVD_OK);
        ck_assert_int_eq(o.metrics_allow_remote, i < 4);
    }
    ck_assert_int_eq(kvd__options_set(&o, "metrics-allow-remote", "maybe", err, sizeof(err)),
                     KVD_EINVAL);
    unlink(path);
}
END_TEST

static const struct {
    const char *text;
    const char *in_msg;
} bad_files[] = {
    {"backend = cpu\nnot a pair\n", ":2:"},
    {"no-such-key = 1\n", "unknown option"},
    {"cache_dir = /tmp/x\n", "unknown option 'cache_dir' (did you mean cache-dir?)"},
    {"max-inflight = zero\n", ":1:"},
    {"config = /etc/other.conf\n", "config"},
    {"backend = cpu\nmax-frame-bytes = 1\n", ":2:"},
};

START_TEST(test_config_file_bad)
{
    char path[] = "/tmp/kvdt-conf-XXXXXX";
    int fd = mkstemp(path);
    kvd__options_t o, before;

    ck_assert_int_ge(fd, 0);
    close(fd);
    write_file(path, bad_files[_i].text);
    kvd__options_init(&o);
    before = o;
    ck_assert_int_ne(kvd__options_load_file(&o, path, err, sizeof(err)), KVD_OK);
    ck_assert_msg(strstr(err, bad_files[_i].in_msg) != NULL, "message '%s' lacks '%s'", err,
                  bad_files[_i].in_msg);
    ck_assert_mem_eq(&o, &before, sizeof(o)); /* all or nothing */
    unlink(path);
    ck_assert_int_eq(kvd__options_load_file(&o, "/nonexistent/kvdockd.conf", err, sizeof(err)),
                     KVD_EIO);
}
END_TEST

START_TEST(test_args)
{
    char path[] = "/tmp/kvdt-conf-XXXXXX";
    int fd = mkstemp(path);
    kvd__options_t o;

    ck_assert_int_ge(fd, 0);
    close(fd);
    write_file(path, "max-inflight = 7\nmax-pools = 3\n");
    {
        /* the command line overrides the file, wherever --config stands */
        char *argv[] = {"kvdockd", "--max-inflight", "9", "--config", path,
                        "--backend=cpu", NULL};
        ck_assert_int_eq(kvd__options_parse_args(&o, 6, argv, err, sizeof(err)), KVD_OPTS_RUN);
        ck_assert_uint_eq(o.max_inflight, 9);
        ck_assert_uint_eq(o.max_pools, 3);
        ck_assert_int_eq(o.backend, KVD_BACKEND_CPU);
    }
    {
        char *argv[] = {"kvdockd", "--help", NULL};
        ck_assert_int_eq(kvd__options_parse_args(&o, 2, argv, err, sizeof(err)), KVD_OPTS_HELP);
    }
    {
        char *argv[] = {"kvdockd", "--version", NULL};
        ck_assert_int_eq(kvd__options_parse_args(&o, 2, argv, err, sizeof(err)),
                         KVD_OPTS_VERSION);
    }
    {
        char *argv[] = {"kvdockd", "--print-config", "--max-pools", "5", NULL};
        ck_assert_int_eq(kvd__options_parse_args(&o, 4, argv, err, sizeof(err)), KVD_OPTS_PRINT);
        ck_assert_uint_eq(o.max_pools, 5);
    }
    {
        char *argv[] = {"kvdockd", "--max-pools", NULL};
        ck_assert_int_eq(kvd__options_parse_args(&o, 2, argv, err, sizeof(err)), KVD_OPTS_ERROR);
        ck_assert_ptr_nonnull(strstr(err, "needs a value"));
    }
    {
        char *argv[] = {"kvdockd", "stray", NULL};
        ck_assert_int_eq(kvd__options_parse_args(&o, 2, argv, err, sizeof(err)), KVD_OPTS_ERROR);
    }
    {
        char *argv[] = {"kvdockd", "--bogus=1", NULL};
        ck_assert_int_eq(kvd__options_parse_args(&o, 2, argv, err, sizeof(err)), KVD_OPTS_ERROR);
        ck_assert_ptr_nonnull(strstr(err, "unknown option '--bogus' (see --help)"));
    }
    {
        char *argv[] = {"kvdockd", "--host-memory-budge", "1G", NULL};
        ck_assert_int_eq(kvd__options_parse_args(&o, 3, argv, err, sizeof(err)), KVD_OPTS_ERROR);
        ck_assert_ptr_nonnull(
            strstr(err, "unknown option '--host-memory-budge' (did you mean --host-memory-budget?)"));
    }
    {
        char *argv[] = {"kvdockd", "--config", "/nonexistent.conf", NULL};
        ck_assert_int_eq(kvd__options_parse_args(&o, 3, argv, err, sizeof(err)), KVD_OPTS_ERROR);
    }
    {
        char *argv[] = {"kvdockd", "--max-inline-bytes", "32M", NULL};
        ck_assert_int_eq(kvd__options_parse_args(&o, 3, argv, err, sizeof(err)), KVD_OPTS_ERROR);
        ck_assert_ptr_nonnull(strstr(err, "max-inline-bytes"));
    }
    unlink(path);
}
END_TEST

START_TEST(test_help_lists_every_option)
{
    char *text = NULL;
    size_t len = 0, i;
    FILE *f = open_memstream(&text, &len);

    kvd__options_help(f, "kvdockd");
    fclose(f);
    for (i = 0; i < kvd__option_count; i++) {
        char want[80];
        snprintf(want, sizeof(want), "--%s ", kvd__option_table[i].name);
        ck_assert_msg(strstr(text, want) != NULL, "--help lacks %s", want);
        ck_assert_msg(kvd__option_table[i].help[0] != '\0', "%s has no description",
                      kvd__option_table[i].name);
    }
    /* within 100 columns */
    for (const char *line = text; *line;) {
        size_t n = strcspn(line, "\n");
        ck_assert_msg(n <= 100, "--help line of %zu columns: %.*s", n, (int)n, line);
        line += n + (line[n] == '\n');
    }
    free(text);
    /* --print-config writes a file the config parser reads back */
    {
        char path[] = "/tmp/kvdt-conf-XXXXXX";
        int fd = mkstemp(path);
        kvd__options_t o, back;
        FILE *out = fdopen(fd, "w");

        kvd__options_init(&o);
        o.max_pools = 77;
        kvd__options_print(&o, out);
        fclose(out);
        kvd__options_init(&back);
        ck_assert_int_eq(kvd__options_load_file(&back, path, err, sizeof(err)), KVD_OK);
        ck_assert_uint_eq(back.max_pools, 77);
        ck_assert_mem_eq(&back, &o, sizeof(o));
        unlink(path);
    }
}
END_TEST

START_TEST(test_example_config)
{
    /* deploy/kvdockd.example.conf is what the table generates now, parses,
     * and names every option */
    kvd__options_t o;
    FILE *f = fopen(KVD_EXAMPLE_CONF, "r");
    char *text = NULL, *gen = NULL;
    size_t cap = 0, i, gen_len = 0;
    ssize_t n;
    char all[32768] = "";
    FILE *g;

    ck_assert_ptr_nonnull(f);
    while ((n = getline(&text, &cap, f)) > 0)
        strncat(all, text, sizeof(all) - strlen(all) - 1);
    fclose(f);
    free(text);
    g = open_memstream(&gen, &gen_len);
    ck_assert_ptr_nonnull(g);
    kvd__options_print_example(g);
    fclose(g);
    ck_assert_msg(strcmp(all, gen) == 0, "deploy/kvdockd.example.conf is out of date: "
                  "regenerate it with `kvdockd --print-example-config`");
    free(gen);
    for (i = 0; i < kvd__option_count; i++) {
        char want[80];
        if (strcmp(kvd__option_table[i].name, "config") == 0)
            continue;
        snprintf(want, sizeof(want), "\n# %s =", kvd__option_table[i].name);
        ck_assert_msg(strstr(all, want) != NULL, "example config lacks %s", want);
    }
    kvd__options_init(&o);
    ck_assert_int_eq(kvd__options_load_file(&o, KVD_EXAMPLE_CONF, err, sizeof(err)), KVD_OK);
}
END_TEST

START_TEST(test_default_path)
{
    /* host <-> device on the copy engines (or kernels with
     * --host-copy-path kernel); every other pair on kernels */
    kvd__options_t o;
    static const int kinds[] = {KVD_MEM_HOST, KVD_MEM_DEVICE, KVD_MEM_DEVICE_VMM};
    size_t i, j;

    kvd__options_init(&o);
    for (i = 0; i < 3; i++)
        for (j = 0; j < 3; j++)
            ck_assert_int_eq(kvd__default_path(&o, kinds[i], kinds[j]),
                             (i == 0) != (j == 0) ? KVD_PATH_COPY_ENGINE : KVD_PATH_KERNEL);
    ck_assert_int_eq(kvd__stream_path(&o, KVD_STREAM_RELOAD), KVD_PATH_COPY_ENGINE);
    ck_assert_int_eq(kvd__stream_path(&o, KVD_STREAM_OFFLOAD), KVD_PATH_COPY_ENGINE);
    ck_assert_int_eq(kvd__stream_path(&o, KVD_STREAM_WRITE), KVD_PATH_KERNEL);
    ck_assert_int_eq(kvd__stream_path(&o, KVD_STREAM_D2D), KVD_PATH_KERNEL);
    ck_assert_int_eq(kvd__options_set(&o, "host-copy-path", "kernel", err, sizeof(err)), KVD_OK);
    ck_assert_int_eq(kvd__default_path(&o, KVD_MEM_HOST, KVD_MEM_DEVICE), KVD_PATH_KERNEL);
    ck_assert_int_eq(kvd__stream_path(&o, KVD_STREAM_OFFLOAD), KVD_PATH_KERNEL);
    ck_assert_int_eq(kvd__options_set(&o, "host-copy-path", "sm", err, sizeof(err)), KVD_EINVAL);
    /* how small host-to-device runs are issued: in batches unless told */
    kvd__options_init(&o);
    ck_assert_int_eq(o.copy_issue, KVD_COPY_ISSUE_BATCH);
    ck_assert_int_eq(kvd__options_set(&o, "copy-issue", "each", err, sizeof(err)), KVD_OK);
    ck_assert_int_eq(o.copy_issue, KVD_COPY_ISSUE_EACH);
    ck_assert_int_eq(kvd__options_set(&o, "copy-issue", "batch", err, sizeof(err)), KVD_OK);
    ck_assert_int_eq(o.copy_issue, KVD_COPY_ISSUE_BATCH);
    ck_assert_int_eq(kvd__options_set(&o, "copy-issue", "auto", err, sizeof(err)), KVD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "batch|each"));
}
END_TEST

/* How a copy-engine transfer is cut into gated slices and counted for its
 * parts: whole runs (rows consecutive on both sides where both lie
 * packed), at most so many a slice. */
START_TEST(test_copy_slices)
{
    kvd_transfer_args_t a;
    int64_t dst[16], src[16];
    int32_t dst32[16];
    int i;

    /* rows of 2 KiB packed on both sides: 16 consecutive are one run; broken
     * after 8 on the destination, two runs */
    memset(&a, 0, sizeof(a));
    a.row_bytes = 2048;
    a.src.slot_stride = a.dst.slot_stride = 2048;
    a.idx_dtype = KVD_DTYPE_I64;
    a.dst_idx = dst;
    a.count = 16;
    for (i = 0; i < 16; i++) {
        dst[i] = 40 + i;
        dst32[i] = 40 + i;
    }
    ck_assert_int_eq(kvd__rows_of_runs(&a, 0, 1), 16);
    ck_assert_int_eq(kvd__rows_of_runs(&a, 5, 1), 11);
    ck_assert_int_eq(kvd__transfer_runs(&a), 1);
    for (i = 8; i < 16; i++) {
        dst[i] = 100 + i;
        dst32[i] = 100 + i;
    }
    ck_assert_int_eq(kvd__rows_of_runs(&a, 0, 1), 8);
    ck_assert_int_eq(kvd__rows_of_runs(&a, 0, 2), 16);
    ck_assert_int_eq(kvd__transfer_runs(&a), 2);
    ck_assert_int_eq(kvd__rows_of_runs(&a, 8, 1), 8);
    ck_assert_int_eq(kvd__rows_of_runs(&a, 16, 1), 0);
    a.idx_dtype = KVD_DTYPE_I32;
    a.dst_idx = dst32;
    ck_assert_int_eq(kvd__rows_of_runs(&a, 0, 1), 8);
    /* a source index that breaks every pair: a run a row */
    a.idx_dtype = KVD_DTYPE_I64;
    a.dst_idx = dst;
    for (i = 0; i < 16; i++)
        src[i] = 2 * i;
    a.src_idx = src;
    ck_assert_int_eq(kvd__rows_of_runs(&a, 0, 3), 3);
    ck_assert_int_eq(kvd__transfer_runs(&a), 16);
    /* a side not packed (a slab's rows a block apart): each row a run */
    a.src_idx = NULL;
    a.src.slot_stride = 1 << 20;
    ck_assert_int_eq(kvd__rows_of_runs(&a, 0, 5), 5);
    ck_assert_int_eq(kvd__rows_of_runs(&a, 14, 5), 2);
    ck_assert_int_eq(kvd__transfer_runs(&a), 16);
    a.count = 0;
    ck_assert_int_eq(kvd__rows_of_runs(&a, 0, 5), 0);
    ck_assert_int_eq(kvd__transfer_runs(&a), 0);
}
END_TEST

static Suite *options_suite(void)
{
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("options");

    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_set_values);
    tcase_add_loop_test(tc, test_bad_values, 0, sizeof(bad_values) / sizeof(bad_values[0]));
    tcase_add_test(tc, test_inexact_size_said);
    tcase_add_test(tc, test_long_string);
    tcase_add_test(tc, test_cluster_peers_long);
    tcase_add_test(tc, test_cross_checks);
    tcase_add_test(tc, test_config_file);
    tcase_add_loop_test(tc, test_config_file_bad, 0, sizeof(bad_files) / sizeof(bad_files[0]));
    tcase_add_test(tc, test_args);
    tcase_add_test(tc, test_help_lists_every_option);
    tcase_add_test(tc, test_example_config);
    tcase_add_test(tc, test_default_path);
    tcase_add_test(tc, test_copy_slices);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(options_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
