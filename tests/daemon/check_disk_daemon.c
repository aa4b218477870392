/*
 * The daemon's side of the disk level: --cache-dir and --disk-budget
 * refused at start with a clear error, a cache's disk budget checked
 * against them, the manifests that bring caches back after a restart
 * (written atomically, read strictly), and directories that cannot be
 * trusted skipped and left as they are.
 *
 * Every directory lies under the build tree (KVD_TEST_SCRATCH), on the
 * machine's disk, not tmpfs.  Cases that need root (a directory of
 * another user) say SKIP without it.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache_disk.h"
#include "disk_harness.h"

#define OTHER_UID 65534u

static char scratch[512];

/* A fresh directory of the build tree for one case. */
static void scratch_make(const char *name)
{
    char full[64];

    snprintf(full, sizeof(full), "disk-daemon-%s", name);
    kvdt_scratch_make(scratch, sizeof(scratch), full);
}

static void path_in(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", scratch, name);
}

/* kvdockd with extra args must stop at start, saying what. */
static void refused_at_start(const char *const *extra, const char *what)
{
    char log[600], sock[600];
    int st;

    path_in(log, sizeof(log), "run.log");
    path_in(sock, sizeof(sock), "run.sock");
    st = kvdt_run_log(sock, log, extra, KVDT_TIMEOUT_MS);
    if (st == 0 || st == -1 || !kvdt_file_has(log, what)) {
        kvdt_dump_file(log);
        ck_abort_msg("expected a refusal at start saying '%s' (exit %d)", what, st);
    }
}

/* ---- start ------------------------------------------------------------------ */

START_TEST(test_start_refused)
{
    char file[600], ww[600], gw[600], ro[600], cd[600];
    const char *a_file[] = {"--cache-dir", file, NULL};
    const char *a_ww[] = {"--cache-dir", ww, NULL};
    const char *a_gw[] = {"--cache-dir", gw, NULL};
    const char *a_ro[] = {"--cache-dir", ro, NULL};
    const char *a_free[] = {"--cache-dir", cd, "--disk-budget", "8000T", NULL};
    const char *a_nodir[] = {"--disk-budget", "1G", NULL};
    const char *a_rel[] = {"--cache-dir", "relative/dir", NULL};
    const char *a_noparent[] = {"--cache-dir", "/nonexistent-kvdock-parent/cache", NULL};
    int fd;

    scratch_make("start");
    path_in(file, sizeof(file), "a-file");
    fd = open(file, O_WRONLY | O_CREAT, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    refused_at_start(a_file, "is not a directory");
    path_in(ww, sizeof(ww), "world-writable");
    ck_assert_int_eq(mkdir(ww, 0700), 0);
    ck_assert_int_eq(chmod(ww, 0777), 0);
    refused_at_start(a_ww, "is writable by others (mode 0777)");
    path_in(gw, sizeof(gw), "group-writable");
    ck_assert_int_eq(mkdir(gw, 0700), 0);
    ck_assert_int_eq(chmod(gw, 0770), 0);
    refused_at_start(a_gw, "is writable by its group (mode 0770)");
    path_in(ro, sizeof(ro), "read-only");
    ck_assert_int_eq(mkdir(ro, 0500), 0);
    refused_at_start(a_ro, "is not writable");
    /* more than the file system has free: refused before a byte is written */
    path_in(cd, sizeof(cd), "cd");
    refused_at_start(a_free, "is more than the disk level has in");
    refused_at_start(a_nodir, "disk-budget needs cache-dir");
    refused_at_start(a_rel, "give an absolute path");
    refused_at_start(a_noparent, "cannot make it");
    kvdt_scratch_remove(scratch);
}
END_TEST

START_TEST(test_start_other_user)
{
    char dir[600];
    const char *a[] = {"--cache-dir", dir, NULL};

    if (geteuid() != 0) {
        kvt_skip_case("start_other_user", "needs root to make a directory of uid %u (this "
                      "runs as uid %u)", OTHER_UID, (unsigned)geteuid());
        return;
    }
    scratch_make("other");
    path_in(dir, sizeof(dir), "theirs");
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(chown(dir, OTHER_UID, OTHER_UID), 0);
    refused_at_start(a, "belongs to uid 65534, not the daemon's user");
    kvdt_scratch_remove(scratch);
}
END_TEST

/* Made 0700 when missing; the status names it, its budget and engine. */
START_TEST(test_start_made)
{
    char dir[600];
    kvdt_daemon_t d;
    Kvdock__StatusReply *s;
    struct stat st;
    int fd;

    scratch_make("made");
    path_in(dir, sizeof(dir), "cd");
    fd = kvdt_disk_start(&d, NULL, dir, "64M", NULL, "status");
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert(S_ISDIR(st.st_mode));
    ck_assert_uint_eq(st.st_mode & 07777, 0700);
    ck_assert(kvdt_log_has(&d, "event=disk_level"));
    ck_assert(kvdt_log_has(&d, "io_engine="));
    ck_assert(kvdt_log_has(&d, "event=disk_reopen"));
    s = kvdt_status(fd);
    ck_assert_ptr_nonnull(s->disk);
    ck_assert_str_eq(s->disk->cache_dir, dir);
    ck_assert_uint_eq(s->disk->budget_bytes, 64u << 20);
    ck_assert_uint_eq(s->disk->reserved_bytes, 0);
    ck_assert_uint_gt(s->disk->fs_free_bytes, 0);
    ck_assert(strncmp(s->disk->io_engine, "io_uring", 8) == 0 ||
              strncmp(s->disk->io_engine, "threads (", 9) == 0);
    kvdock__status_reply__free_unpacked(s, NULL);
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    kvdt_scratch_remove(scratch);
}
END_TEST

/* --disk-io threads: the pool even where io_uring works, and the status
 * says it was asked for. */
START_TEST(test_disk_io_threads)
{
    char dir[600];
    const char *extra[] = {"--disk-io", "threads", NULL};
    kvdt_daemon_t d;
    Kvdock__StatusReply *s;
    int fd;

    scratch_make("threads");
    path_in(dir, sizeof(dir), "cd");
    fd = kvdt_disk_start(&d, NULL, dir, "64M", extra, "status");
    s = kvdt_status(fd);
    ck_assert_ptr_nonnull(s->disk);
    ck_assert_str_eq(s->disk->io_engine, "threads (asked for)");
    kvdock__status_reply__free_unpacked(s, NULL);
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    kvdt_scratch_remove(scratch);
}
END_TEST

/* --disk-threads: the engine runs that many threads for its CPU work,
 * and the log says so; past the bound the start is refused. */
START_TEST(test_disk_threads)
{
    char dir[600];
    const char *extra[] = {"--disk-threads", "3", NULL};
    kvdt_daemon_t d;
    int fd;

    scratch_make("dthreads");
    path_in(dir, sizeof(dir), "cd");
    fd = kvdt_disk_start(&d, NULL, dir, "64M", extra, "status");
    ck_assert_msg(kvdt_log_has(&d, "cpu_threads=3 "), "the log names 3 disk threads");
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    kvdt_scratch_remove(scratch);
}
END_TEST

/* ---- a cache's disk budget ------------------------------------------------------ */

static Kvdock__Response *create(int fd, const char *name, uint64_t budget, uint64_t disk,
                                int shared)
{
    kvdt_cache_req_t q;

    kvdt_cache_req(&q, 7, name, budget, disk);
    q.cc.shared = shared;
    return kvdt_call(fd, &q.req);
}

START_TEST(test_create_without_cache_dir)
{
    kvdt_daemon_t d;
    Kvdock__Response *r;
    int fd;

    kvdt_start(&d, NULL);
    fd = kvdt_client(&d, "nodir");
    r = create(fd, "c", 1 << 20, 1 << 20, 0);
    ck_assert_uint_eq(r->status, KVD_ENOTSUP);
    ck_assert_ptr_nonnull(strstr(r->message, "--cache-dir"));
    kvdock__response__free_unpacked(r, NULL);
    /* the connection goes on; a cache without a disk level is made */
    r = create(fd, "c", 1 << 20, 0, 0);
    ck_assert_msg(r->status == 0, "%u %s", r->status, r->message);
    ck_assert_ptr_null(r->cache->disk);
    kvdock__response__free_unpacked(r, NULL);
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

/* Whether dir holds no entry. */
static int dir_empty(const char *dir)
{
    char cmd[700];

    snprintf(cmd, sizeof(cmd), "test -z \"$(ls -A '%s')\"", dir);
    return system(cmd) == 0;
}

/* Whether dir comes to hold no entry within the harness's timeout (what
 * a refused create made is removed on the disk threads). */
static int dir_empties(const char *dir)
{
    for (int i = 0; i < KVDT_TIMEOUT_MS / 20; i++) {
        if (dir_empty(dir))
            return 1;
        usleep(20000);
    }
    return 0;
}

START_TEST(test_create_budgets)
{
    char dir[600], sub[700], man[800];
    kvdt_daemon_t d;
    Kvdock__Response *r;
    Kvdock__StatusReply *s;
    struct stat st;
    int fd;

    scratch_make("budgets");
    path_in(dir, sizeof(dir), "cd");
    fd = kvdt_disk_start(&d, NULL, dir, "64M", NULL, "budgets");
    r = create(fd, "big", 1 << 20, 65u << 20, 0);
    ck_assert_uint_eq(r->status, KVD_ELIMIT);
    ck_assert_ptr_nonnull(strstr(r->message, "--disk-budget"));
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(dir_empty(dir));
    r = create(fd, "one", 1 << 20, 40u << 20, 0);
    snprintf(sub, sizeof(sub), "%s/u%u-one", dir, (unsigned)geteuid());
    snprintf(man, sizeof(man), "%s/manifest", sub);
    if (r->status == KVD_OK) {
        /* its directory and manifest, both the daemon user's alone */
        ck_assert_ptr_nonnull(r->cache->disk);
        ck_assert_str_eq(r->cache->disk->path, sub);
        ck_assert_uint_eq(r->cache->disk->budget_bytes, 40u << 20);
        ck_assert_int_eq(stat(sub, &st), 0);
        ck_assert_uint_eq(st.st_mode & 07777, 0700);
        ck_assert_int_eq(stat(man, &st), 0);
        ck_assert_uint_eq(st.st_mode & 07777, 0600);
        kvdock__response__free_unpacked(r, NULL);
        /* together past --disk-budget: refused, as the host budget is */
        r = create(fd, "two", 1 << 20, 40u << 20, 0);
        ck_assert_uint_eq(r->status, KVD_ELIMIT);
        ck_assert_ptr_nonnull(strstr(r->message, "caches made already"));
        kvdock__response__free_unpacked(r, NULL);
        s = kvdt_status(fd);
        ck_assert_uint_eq(s->disk->reserved_bytes, 40u << 20);
        kvdock__status_reply__free_unpacked(s, NULL);
    } else {
        /* a store without a disk level: refused whole, nothing left behind */
        ck_assert_msg(r->status == KVD_ENOTSUP, "%u %s", r->status, r->message);
        kvdock__response__free_unpacked(r, NULL);
        ck_assert_msg(dir_empties(dir), "a refused create left files in %s", dir);
        s = kvdt_status(fd);
        ck_assert_uint_eq(s->disk->reserved_bytes, 0);
        kvdock__status_reply__free_unpacked(s, NULL);
    }
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    kvdt_scratch_remove(scratch);
}
END_TEST

/* A disk budget within --disk-budget but past what the file system has
 * free now (others wrote since the start): ELIMIT, nothing written. */
START_TEST(test_create_past_free_space)
{
    char dir[600], big[600];
    kvdt_daemon_t d;
    Kvdock__Response *r;
    Kvdock__StatusReply *s;
    uint64_t free0, fill;
    int fd, bf;

    scratch_make("free");
    path_in(dir, sizeof(dir), "cd");
    path_in(big, sizeof(big), "filler");
    fd = kvdt_disk_start(&d, NULL, dir, "100%", NULL, "free");
    s = kvdt_status(fd);
    free0 = s->disk->fs_free_bytes;
    ck_assert_uint_ge(s->disk->budget_bytes, free0 / 2); /* 100% of what was free at start */
    kvdock__status_reply__free_unpacked(s, NULL);
    /* take a quarter of the free space (at most 2 GiB) */
    fill = free0 / 4 < (2ull << 30) ? free0 / 4 : (2ull << 30);
    bf = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(bf, 0);
    ck_assert_int_eq(posix_fallocate(bf, 0, (off_t)fill), 0);
    ck_assert_int_eq(fsync(bf), 0);
    close(bf);
    /* within the daemon's budget, past what is free now (unless others
     * freed more than fill / 2 meanwhile) */
    r = create(fd, "toobig", 1 << 20, free0 - fill / 2, 0);
    ck_assert_msg(r->status == KVD_ELIMIT, "%u %s", r->status, r->message);
    ck_assert_ptr_nonnull(strstr(r->message, "does not fit the free space"));
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(dir_empty(dir));
    ck_assert_int_eq(unlink(big), 0);
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    kvdt_scratch_remove(scratch);
}
END_TEST

/* SIGTERM with creates in flight (their directories being made on the
 * disk threads): every one is answered, the daemon exits 0, and what it
 * leaves is whole: a created cache's directory with its manifest, nothing
 * of a refused one (its removal is waited for before the exit). */
START_TEST(test_sigterm_answers_creates)
{
    char dir[600], sub[700];
    kvdt_daemon_t d;
    kvdt_cache_req_t q;
    char names[8][8];
    int fd, ok[8];

    scratch_make("sigterm");
    path_in(dir, sizeof(dir), "cd");
    fd = kvdt_disk_start(&d, NULL, dir, "64M", NULL, "drain");
    for (int i = 0; i < 8; i++) {
        snprintf(names[i], sizeof(names[i]), "c%d", i);
        kvdt_cache_req(&q, 100 + (uint64_t)i, names[i], 1 << 20, 4u << 20);
        kvdt_send(fd, &q.req, NULL, 0);
    }
    ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
    for (int i = 0; i < 8; i++) {
        Kvdock__Response *r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
        ck_assert_msg(r != NULL, "create %d of 8 was not answered", i);
        ck_assert_uint_ge(r->id, 100);
        ck_assert_uint_lt(r->id, 108);
        ck_assert_msg(r->status == KVD_OK || r->status == KVD_ENOTSUP ||
                      r->status == KVD_ESHUTDOWN, "%u %s", r->status, r->message);
        ok[r->id - 100] = r->status == KVD_OK;
        kvdock__response__free_unpacked(r, NULL);
    }
    ck_assert_int_eq(kvdt_wait_exit(&d, KVDT_TIMEOUT_MS), 0);
    close(fd);
    for (int i = 0; i < 8; i++) {
        snprintf(sub, sizeof(sub), "%s/u%u-c%d/manifest", dir, (unsigned)geteuid(), i);
        ck_assert_msg((access(sub, F_OK) == 0) == ok[i], "cache c%d: created %d, manifest %s",
                      i, ok[i], access(sub, F_OK) == 0 ? "there" : "missing");
    }
    if (!ok[0])
        ck_assert_msg(dir_empty(dir), "refused creates left files in %s", dir);
    (void)kvdt_stop(&d);
    kvdt_scratch_remove(scratch);
}
END_TEST

/* ---- manifests ------------------------------------------------------------------- */

static void manifest_sample(kvd__manifest_t *m)
{
    memset(m, 0, sizeof(*m));
    snprintf(m->name, sizeof(m->name), "chat-7b.tp0_x");
    m->owner_uid = 1234;
    m->shared = 1;
    m->cluster = 1;
    m->allow_uids[0] = 1000;
    m->allow_uids[1] = 4294967295u;
    m->n_allow_uids = 2;
    m->allow_gids[0] = 0;
    m->n_allow_gids = 1;
    m->layout.num_layers = 32;
    m->layout.mla = 0;
    m->layout.tokens_per_block = 16;
    m->layout.token_bytes = 1024;
    snprintf(m->layout.dtype, sizeof(m->layout.dtype), "bf16");
    m->budget = 1ull << 30;
    m->disk_budget = 200ull << 30;
}

static void manifest_equal(const kvd__manifest_t *a, const kvd__manifest_t *b)
{
    ck_assert_str_eq(a->name, b->name);
    ck_assert_uint_eq(a->owner_uid, b->owner_uid);
    ck_assert_int_eq(a->shared, b->shared);
    ck_assert_int_eq(a->cluster, b->cluster);
    ck_assert_uint_eq(a->n_allow_uids, b->n_allow_uids);
    ck_assert_uint_eq(a->n_allow_gids, b->n_allow_gids);
    ck_assert_mem_eq(a->allow_uids, b->allow_uids, sizeof(a->allow_uids));
    ck_assert_mem_eq(a->allow_gids, b->allow_gids, sizeof(a->allow_gids));
    ck_assert_uint_eq(a->layout.num_layers, b->layout.num_layers);
    ck_assert_int_eq(a->layout.mla, b->layout.mla);
    ck_assert_uint_eq(a->layout.tokens_per_block, b->layout.tokens_per_block);
    ck_assert_uint_eq(a->layout.token_bytes, b->layout.token_bytes);
    ck_assert_str_eq(a->layout.dtype, b->layout.dtype);
    ck_assert_uint_eq(a->budget, b->budget);
    ck_assert_uint_eq(a->disk_budget, b->disk_budget);
}

START_TEST(test_manifest_text)
{
    kvd__manifest_t m, back;
    char text[KVD_MANIFEST_MAX], bad[KVD_MANIFEST_MAX + 8], why[200];
    size_t len;

    manifest_sample(&m);
    ck_assert_int_eq(kvd__manifest_format(&m, text, sizeof(text), &len), 0);
    ck_assert_int_eq(kvd__manifest_parse(text, len, &back, why, sizeof(why)), KVD_OK);
    manifest_equal(&m, &back);
    /* every flipped bit of every byte, every truncation: refused */
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(bad, text, len);
            bad[i] ^= (char)(1 << bit);
            ck_assert_msg(kvd__manifest_parse(bad, len, &back, why, sizeof(why)) == KVD_EINVAL,
                          "byte %zu bit %d flipped was taken", i, bit);
        }
        ck_assert_msg(kvd__manifest_parse(text, i, &back, why, sizeof(why)) == KVD_EINVAL,
                      "truncated at %zu was taken", i);
    }
    memcpy(bad, text, len);
    memcpy(bad + len, "x=1\n", 4);
    ck_assert_int_eq(kvd__manifest_parse(bad, len + 4, &back, why, sizeof(why)), KVD_EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "after the checksum"));
    /* allowed users on a private cache: refused even with a right checksum */
    m.shared = 0;
    ck_assert_int_eq(kvd__manifest_format(&m, text, sizeof(text), &len), 0);
    ck_assert_int_eq(kvd__manifest_parse(text, len, &back, why, sizeof(why)), KVD_EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "private"));
    /* a name that is no cache name, a budget of 0 */
    manifest_sample(&m);
    m.disk_budget = 0;
    ck_assert_int_eq(kvd__manifest_format(&m, text, sizeof(text), &len), 0);
    ck_assert_int_eq(kvd__manifest_parse(text, len, &back, why, sizeof(why)), KVD_EINVAL);
    manifest_sample(&m);
    snprintf(m.name, sizeof(m.name), "../x");
    ck_assert_int_eq(kvd__manifest_format(&m, text, sizeof(text), &len), 0);
    ck_assert_int_eq(kvd__manifest_parse(text, len, &back, why, sizeof(why)), KVD_EINVAL);
}
END_TEST

START_TEST(test_dirnames)
{
    char n[KVD_CACHE_DIRNAME_MAX];

    ck_assert_int_eq(kvd__cache_dirname("a.b-c_d", 1000, 0, n, sizeof(n)), 0);
    ck_assert_str_eq(n, "u1000-a.b-c_d");
    ck_assert_int_eq(kvd__cache_dirname("a.b-c_d", 1000, 1, n, sizeof(n)), 0);
    ck_assert_str_eq(n, "s-a.b-c_d");
    ck_assert_int_eq(kvd__cache_dirname("a/b", 0, 0, n, sizeof(n)), -1);
    ck_assert_int_eq(kvd__cache_dirname("", 0, 1, n, sizeof(n)), -1);
}
END_TEST

START_TEST(test_manifest_file)
{
    char dir[600], path[700], why[300], text[KVD_MANIFEST_MAX];
    kvd__manifest_t m, back;
    struct stat st;
    int fd;
    ssize_t n;

    scratch_make("manifest");
    manifest_sample(&m);
    m.owner_uid = (uint32_t)geteuid();
    path_in(dir, sizeof(dir), "s-chat-7b.tp0_x");
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(kvd__manifest_write(dir, &m, why, sizeof(why)), KVD_OK);
    snprintf(path, sizeof(path), "%s/manifest", dir);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 07777, 0600);
    snprintf(path, sizeof(path), "%s/manifest.tmp", dir);
    ck_assert_int_eq(access(path, F_OK), -1); /* renamed into place */
    ck_assert_int_eq(kvd__manifest_read(dir, "s-chat-7b.tp0_x", &back, why, sizeof(why)),
                     KVD_OK);
    manifest_equal(&m, &back);
    /* in another cache's directory: refused */
    ck_assert_int_eq(kvd__manifest_read(dir, "s-other", &back, why, sizeof(why)), KVD_EINVAL);
    /* writable by others: not trusted */
    snprintf(path, sizeof(path), "%s/manifest", dir);
    ck_assert_int_eq(chmod(path, 0622), 0);
    ck_assert_int_eq(kvd__manifest_read(dir, "s-chat-7b.tp0_x", &back, why, sizeof(why)),
                     KVD_EPERM);
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(chmod(dir, 0770), 0);
    ck_assert_int_eq(kvd__manifest_read(dir, "s-chat-7b.tp0_x", &back, why, sizeof(why)),
                     KVD_EPERM);
    ck_assert_int_eq(chmod(dir, 0700), 0);
    /* a flipped byte on disk */
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    n = pread(fd, text, sizeof(text), 0);
    ck_assert_int_gt(n, 40);
    text[30] ^= 0x01;
    ck_assert_int_eq(pwrite(fd, text, (size_t)n, 0), n);
    close(fd);
    ck_assert_int_eq(kvd__manifest_read(dir, "s-chat-7b.tp0_x", &back, why, sizeof(why)),
                     KVD_EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "damaged"));
    /* a link in its place: not followed */
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(symlink("/etc/hostname", path), 0);
    ck_assert_int_eq(kvd__manifest_read(dir, "s-chat-7b.tp0_x", &back, why, sizeof(why)),
                     KVD_EPERM);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(kvd__manifest_read(dir, "s-chat-7b.tp0_x", &back, why, sizeof(why)),
                     KVD_ENOENT);
    /* removal takes everything, the manifest first */
    ck_assert_int_eq(kvd__manifest_write(dir, &m, why, sizeof(why)), KVD_OK);
    snprintf(path, sizeof(path), "%s/seg-00000001.dat", dir);
    fd = open(path, O_WRONLY | O_CREAT, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(kvd__cache_dir_remove(dir), 0);
    ck_assert_int_eq(access(dir, F_OK), -1);
    if (geteuid() == 0) { /* another user's manifest */
        ck_assert_int_eq(mkdir(dir, 0700), 0);
        ck_assert_int_eq(kvd__manifest_write(dir, &m, why, sizeof(why)), KVD_OK);
        snprintf(path, sizeof(path), "%s/manifest", dir);
        ck_assert_int_eq(chown(path, OTHER_UID, OTHER_UID), 0);
        ck_assert_int_eq(kvd__manifest_read(dir, "s-chat-7b.tp0_x", &back, why, sizeof(why)),
                         KVD_EPERM);
    } else {
        kvt_skip_case("manifest_other_user", "needs root to chown a manifest to uid %u",
                      OTHER_UID);
    }
    kvdt_scratch_remove(scratch);
}
END_TEST

/* ---- what cannot be trusted at start ------------------------------------------------ */

/* dir/NAME made 0700 with a manifest of m (its owner the daemon's user). */
static void plant(const char *top, const char *name, kvd__manifest_t *m)
{
    char dir[700], why[300];

    snprintf(dir, sizeof(dir), "%s/%s", top, name);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    m->owner_uid = (uint32_t)geteuid();
    ck_assert_int_eq(kvd__manifest_write(dir, m, why, sizeof(why)), KVD_OK);
}

static int exists(const char *top, const char *name)
{
    char p[800];

    snprintf(p, sizeof(p), "%s/%s", top, name);
    return access(p, F_OK) == 0;
}

START_TEST(test_untrusted_skipped)
{
    char top[600], p[800];
    kvdt_daemon_t d;
    kvd__manifest_t m;
    Kvdock__Request req;
    Kvdock__CacheList cl = KVDOCK__CACHE_LIST__INIT;
    Kvdock__Response *r;
    char uname[64];
    int fd;

    scratch_make("untrusted");
    path_in(top, sizeof(top), "cd");
    ck_assert_int_eq(mkdir(top, 0700), 0);
    manifest_sample(&m);
    m.shared = 0;
    m.n_allow_uids = m.n_allow_gids = 0;
    m.budget = 1 << 20;
    m.disk_budget = 1 << 20;
    /* damaged: a flipped byte */
    snprintf(m.name, sizeof(m.name), "flipped");
    snprintf(uname, sizeof(uname), "u%u-flipped", (unsigned)geteuid());
    plant(top, uname, &m);
    snprintf(p, sizeof(p), "%s/%s/manifest", top, uname);
    {
        int f = open(p, O_RDWR);
        char c;
        ck_assert_int_ge(f, 0);
        ck_assert_int_eq(pread(f, &c, 1, 40), 1);
        c ^= 0x20;
        ck_assert_int_eq(pwrite(f, &c, 1, 40), 1);
        close(f);
    }
    /* writable by others */
    snprintf(m.name, sizeof(m.name), "open");
    snprintf(uname, sizeof(uname), "u%u-open", (unsigned)geteuid());
    plant(top, uname, &m);
    snprintf(p, sizeof(p), "%s/%s", top, uname);
    ck_assert_int_eq(chmod(p, 0777), 0);
    /* a manifest that names another cache than its directory does */
    snprintf(m.name, sizeof(m.name), "elsewhere");
    plant(top, "s-liar", &m);
    /* no manifest at all */
    snprintf(p, sizeof(p), "%s/u0-empty", top);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    /* a file where a directory would be */
    snprintf(p, sizeof(p), "%s/stray-file", top);
    ck_assert_int_eq(close(open(p, O_WRONLY | O_CREAT, 0600)), 0);
    /* another user's directory (root only) */
    if (geteuid() == 0) {
        snprintf(m.name, sizeof(m.name), "theirs");
        plant(top, "u0-theirs", &m);
        snprintf(p, sizeof(p), "%s/u0-theirs", top);
        ck_assert_int_eq(chown(p, OTHER_UID, OTHER_UID), 0);
    }
    /* a dropped cache's directory whose removal a crash cut short */
    snprintf(p, sizeof(p), "%s/" KVD_CACHE_DIR_DROPPED "1-u0-gone", top);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    snprintf(p, sizeof(p), "%s/" KVD_CACHE_DIR_DROPPED "1-u0-gone/seg-00000001.dat", top);
    ck_assert_int_eq(close(open(p, O_WRONLY | O_CREAT, 0600)), 0);

    fd = kvdt_disk_start(&d, NULL, top, "64M", NULL, "list");
    ck_assert(kvdt_log_has(&d, "damaged manifest"));
    ck_assert(kvdt_log_has(&d, "with mode 0777"));
    ck_assert(kvdt_log_has(&d, "names cache 'elsewhere'"));
    ck_assert(kvdt_log_has(&d, "no manifest"));
    ck_assert(kvdt_log_has(&d, "stray-file reason=\"not a directory\""));
    if (geteuid() == 0)
        ck_assert(kvdt_log_has(&d, "belongs to uid 65534"));
    ck_assert(kvdt_log_has(&d, "event=disk_reopen"));
    ck_assert(kvdt_log_has(&d, "caches=0"));
    /* nothing reopened, the daemon serves */
    kvdt_req_init(&req, 3);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_LIST;
    req.cache_list = &cl;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_uint_eq(r->caches->n_caches, 0);
    kvdock__response__free_unpacked(r, NULL);
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    /* what could not be trusted is all still there */
    snprintf(uname, sizeof(uname), "u%u-flipped/manifest", (unsigned)geteuid());
    ck_assert(exists(top, uname));
    snprintf(uname, sizeof(uname), "u%u-open/manifest", (unsigned)geteuid());
    ck_assert(exists(top, uname));
    ck_assert(exists(top, "s-liar/manifest"));
    ck_assert(exists(top, "u0-empty"));
    ck_assert(exists(top, "stray-file"));
    if (geteuid() == 0)
        ck_assert(exists(top, "u0-theirs/manifest"));
    else
        kvt_skip_case("untrusted_other_user", "needs root to chown a directory to uid %u",
                      OTHER_UID);
    /* the dropped one's removal was finished (before the daemon's exit) */
    ck_assert(!exists(top, KVD_CACHE_DIR_DROPPED "1-u0-gone"));
    kvdt_scratch_remove(scratch);
}
END_TEST

static Suite *disk_daemon_suite(void)
{
    Suite *s = suite_create("disk_daemon");
    TCase *unit = tcase_create("manifest");
    TCase *start = tcase_create("start");
    TCase *caches = tcase_create("caches");

    tcase_add_test(unit, test_manifest_text);
    tcase_add_test(unit, test_dirnames);
    tcase_add_test(unit, test_manifest_file);
    suite_add_tcase(s, unit);
    tcase_set_timeout(start, KVT_MS(60000) / 1000.0);
    tcase_add_test(start, test_start_refused);
    tcase_add_test(start, test_start_other_user);
    tcase_add_test(start, test_start_made);
    tcase_add_test(start, test_disk_io_threads);
    tcase_add_test(start, test_disk_threads);
    suite_add_tcase(s, start);
    tcase_set_timeout(caches, KVT_MS(60000) / 1000.0);
    tcase_add_test(caches, test_create_without_cache_dir);
    tcase_add_test(caches, test_create_budgets);
    tcase_add_test(caches, test_untrusted_skipped);
    tcase_add_test(caches, test_sigterm_answers_creates);
    tcase_add_test(caches, test_create_past_free_space);
    suite_add_tcase(s, caches);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(disk_daemon_suite());
    int failed;

    signal(SIGPIPE, SIG_IGN);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
