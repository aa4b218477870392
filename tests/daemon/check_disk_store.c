/*
 * check_disk_store: the disk level's store (daemon/disk/) on its own, on
 * the build tree's file system (a real disk in CI, not tmpfs): records
 * written through io_uring with O_DIRECT and through the thread pool read
 * back byte for byte; a reopened store finds every record not dropped,
 * from the segments' indexes, or from the segments themselves when an
 * index is missing (a crash) or damaged; a flipped byte fails the read's
 * checksum and is counted; a truncated segment loses only its tail; a
 * segment of another layout, another user's file, a file others may write
 * and a directory others may write are refused; a file system that is
 * full fails appends with KVD_ELIMIT and loses nothing written; a
 * million records are found again within 3 seconds.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "disk_format.h"
#include "disk_store.h"

#ifndef KVD_TEST_SCRATCH
#define KVD_TEST_SCRATCH "/tmp"
#endif

#define BLOCK 1000u /* not a multiple of anything: records straddle pages */

static char dir[512];

static void scratch(void)
{
    snprintf(dir, sizeof(dir), "%s/disk-store-XXXXXX", KVD_TEST_SCRATCH);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(chmod(dir, 0700), 0);
}

static void scratch_rm(void)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* KVD_TEST_DISK_THREADS=1 runs every case on the pool (valgrind does not
 * follow io_uring's shared rings). */
static kvd__disk_io_t *io_make(int threads)
{
    threads = threads || getenv("KVD_TEST_DISK_THREADS") != NULL;
    kvd__disk_io_config_t c = {.queue_depth = 16, .threads = 3, .force_threads = threads};
    kvd__disk_io_t *io;
    char why[200];

    ck_assert_int_eq(kvd__disk_io_create(&io, &c, why, sizeof(why)), KVD_OK);
    ck_assert_str_eq(kvd__disk_io_engine(io), threads ? "threads" : "io_uring");
    return io;
}

static kvd__disk_store_config_t config(uint64_t layout_id, uint64_t block)
{
    kvd__disk_store_config_t c = {.dir = dir,
                                 .layout_id = layout_id,
                                 .layout_text = "test layout",
                                 .block_bytes = block,
                                 .segment_bytes = 256 << 10, /* a few segments */
                                 .write_bytes = 64 << 10,
                                 .max_writes = 4};
    return c;
}

static void key_of(uint8_t *k, uint32_t i)
{
    memset(k, 0, 32);
    memcpy(k, &i, 4);
    k[31] = 0x5a;
}

static void fill(uint8_t *p, uint32_t i, uint64_t n)
{
    uint64_t j;
    for (j = 0; j < n; j++)
        p[j] = (uint8_t)(i * 131 + j * 7 + (j >> 8));
}

/* ---- what the callbacks saw ---------------------------------------------------------- */

#define NMAX 4096
static kvd__disk_loc_t locs[NMAX];
static kvd_status_t ast[NMAX];
static int adone, rdone;
static int aorder[NMAX]; /* appends completed before record i's */
static kvd_status_t rst[NMAX];
static uint8_t found_seen[NMAX];
static uint32_t nfound;
static uint64_t last_seq;
static int seq_ordered;

static void on_append(void *arg, kvd_status_t st, kvd__disk_loc_t loc)
{
    uint32_t i = (uint32_t)(uintptr_t)arg;
    ast[i] = st;
    locs[i] = loc;
    aorder[i] = adone;
    adone++;
}

static void on_read(void *arg, kvd_status_t st)
{
    rst[(uint32_t)(uintptr_t)arg] = st;
    rdone++;
}

static int on_found(void *arg, const kvd__disk_found_t *f)
{
    uint32_t i;
    uint8_t k[32];
    (void)arg;
    ck_assert_uint_eq(f->klen, 32);
    memcpy(&i, f->key, 4);
    ck_assert_uint_lt(i, NMAX);
    key_of(k, i);
    ck_assert_mem_eq(f->key, k, 32);
    if (i == 0) {
        ck_assert_ptr_null(f->parent);
    } else {
        key_of(k, i - 1);
        ck_assert_uint_eq(f->plen, 32);
        ck_assert_mem_eq(f->parent, k, 32);
    }
    if (nfound > 0 && f->seq <= last_seq)
        seq_ordered = 0;
    last_seq = f->seq;
    found_seen[i]++;
    locs[i] = f->loc;
    nfound++;
    return 1;
}

static kvd__disk_store_t *open_store(kvd__disk_io_t *io, const kvd__disk_store_config_t *c)
{
    kvd__disk_store_t *s;
    char why[300];
    kvd_status_t st;

    memset(found_seen, 0, sizeof(found_seen));
    nfound = 0;
    seq_ordered = 1;
    st = kvd__disk_store_open(&s, c, io, on_found, NULL, why, sizeof(why));
    ck_assert_msg(st == KVD_OK, "open: %s", why);
    return s;
}

/* Append records [0, n) as one chain from data, and wait for them. */
static void append_all(kvd__disk_io_t *io, kvd__disk_store_t *s, uint8_t *data, uint32_t n,
                       uint64_t block)
{
    uint32_t i;
    uint8_t k[32], p[32];

    adone = 0;
    for (i = 0; i < n; i++) {
        fill(data + (uint64_t)i * block, i, block);
        key_of(k, i);
        key_of(p, i - 1);
        ck_assert_int_eq(kvd__disk_append(s, k, 32, i ? p : NULL, i ? 32 : 0,
                                          data + (uint64_t)i * block, on_append,
                                          (void *)(uintptr_t)i),
                         KVD_OK);
    }
    kvd__disk_store_flush(s);
    while (adone < (int)n)
        kvd__disk_io_wait(io, 10000);
}

/* Read record i and compare; the status of the read. */
static kvd_status_t read_one(kvd__disk_io_t *io, kvd__disk_store_t *s, uint32_t i, uint64_t block)
{
    uint8_t k[32], *got = malloc(block), *want = malloc(block);
    kvd_status_t st;

    key_of(k, i);
    memset(got, 0xee, block);
    rdone = 0;
    ck_assert_int_eq(kvd__disk_read(s, locs[i], k, 32, got, on_read, (void *)(uintptr_t)i),
                     KVD_OK);
    while (rdone < 1)
        kvd__disk_io_wait(io, 10000);
    st = rst[i];
    if (st == KVD_OK) {
        fill(want, i, block);
        ck_assert_mem_eq(got, want, block);
    }
    free(got);
    free(want);
    return st;
}

static void read_all(kvd__disk_io_t *io, kvd__disk_store_t *s, uint32_t from, uint32_t n,
                     uint64_t block)
{
    uint32_t i;
    uint8_t k[32], *got = malloc((uint64_t)n * block), *want = malloc(block);

    /* all in flight at once: the queue's depth is used */
    memset(got, 0xee, (uint64_t)n * block);
    rdone = 0;
    for (i = 0; i < n; i++) {
        key_of(k, from + i);
        ck_assert_int_eq(kvd__disk_read(s, locs[from + i], k, 32, got + (uint64_t)i * block,
                                        on_read, (void *)(uintptr_t)(from + i)),
                         KVD_OK);
    }
    while (rdone < (int)n)
        kvd__disk_io_wait(io, 10000);
    for (i = 0; i < n; i++) {
        ck_assert_int_eq(rst[from + i], KVD_OK);
        fill(want, from + i, block);
        ck_assert_mem_eq(got + (uint64_t)i * block, want, block);
    }
    free(got);
    free(want);
}

static int count_files(const char *suffix)
{
    char cmd[700];
    FILE *f;
    int n = 0;

    snprintf(cmd, sizeof(cmd), "ls '%s' | grep -c '%s$'", dir, suffix);
    f = popen(cmd, "r");
    if (fscanf(f, "%d", &n) != 1)
        n = -1;
    pclose(f);
    return n;
}

/* ---- the engines ---------------------------------------------------------------------- */

static void round_trip(int threads, int buffered)
{
    kvd__disk_io_t *io;
    kvd__disk_store_t *s;
    kvd__disk_store_config_t c;
    kvd__disk_store_stats_t st, rb;
    uint32_t n = 600; /* about 3 segments */
    uint8_t *data = malloc((uint64_t)n * BLOCK);

    scratch();
    io = io_make(threads);
    c = config(7, BLOCK);
    c.buffered = buffered;
    s = open_store(io, &c);
    ck_assert_uint_eq(nfound, 0);
    append_all(io, s, data, n, BLOCK);
    for (uint32_t i = 0; i < n; i++)
        ck_assert_int_eq(ast[i], KVD_OK);
    read_all(io, s, 0, n, BLOCK);
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_eq(st.records, n);
    ck_assert_uint_eq(st.appends, n);
    ck_assert_uint_eq(st.reads, n);
    /* 600 reads at once hold at most 64 bounce buffers (the rest wait for
     * one), and a second round reuses them: a load never maps a buffer per
     * block */
    ck_assert_uint_gt(st.read_buffers, 0);
    ck_assert_uint_le(st.read_buffers, 64);
    read_all(io, s, 0, n, BLOCK);
    kvd__disk_store_stats(s, &rb);
    ck_assert_uint_eq(rb.reads, 2 * n);
    ck_assert_uint_eq(rb.read_buffers, st.read_buffers);
    ck_assert_uint_eq(st.checksum_failures, 0);
    ck_assert_uint_eq(st.io_errors, 0);
    ck_assert_int_eq(st.direct, !buffered);
    ck_assert_uint_ge(st.segments, 3);
    /* large writes: a batch holds many records */
    ck_assert_uint_lt(st.writes, n / 8);
    kvd__disk_store_close(&s);
    ck_assert_int_eq(count_files(".kvd"), count_files(".idx"));

    /* reopened: every record, oldest first, from the indexes */
    s = open_store(io, &c);
    ck_assert_uint_eq(nfound, n);
    ck_assert(seq_ordered);
    for (uint32_t i = 0; i < n; i++)
        ck_assert_uint_eq(found_seen[i], 1);
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_eq(st.rebuilt_indexes, 0);
    ck_assert_uint_eq(st.records, n);
    read_all(io, s, 0, n, BLOCK);
    kvd__disk_store_close(&s);
    kvd__disk_io_destroy(&io);
    free(data);
    scratch_rm();
}

START_TEST(uring_direct)
{
    round_trip(0, 0);
}
END_TEST

START_TEST(threads_direct)
{
    round_trip(1, 0);
}
END_TEST

START_TEST(threads_buffered)
{
    round_trip(1, 1);
}
END_TEST

/* The engines alone: errors come back as -errno, a read past the end as
 * -ENODATA, work before and after runs on an I/O thread, and destroy
 * waits for what is in flight. */
static pthread_t main_thread;
static int off_loop, dones;

static void on_thread_check(kvd__disk_req_t *r, unsigned part)
{
    (void)r;
    if (!pthread_equal(pthread_self(), main_thread))
        __atomic_add_fetch(&off_loop, 1, __ATOMIC_RELAXED); /* threads may run it at once */
}

static void count_done(kvd__disk_req_t *r)
{
    (void)r;
    dones++;
}

static void engine_alone(int threads)
{
    kvd__disk_io_t *io = io_make(threads);
    kvd__disk_req_t r[4];
    char path[600], buf[8192], out[8192];
    int fd;

    scratch();
    main_thread = pthread_self();
    off_loop = dones = 0;
    snprintf(path, sizeof(path), "%s/f", dir);
    fd = open(path, O_RDWR | O_CREAT, 0600);
    ck_assert_int_ge(fd, 0);
    memset(r, 0, sizeof(r));
    memset(buf, 0x5a, sizeof(buf));
    r[0] = (kvd__disk_req_t){.op = KVD_DISK_OP_WRITE, .fd = fd, .off = 0, .buf = buf,
                            .len = sizeof(buf), .before = on_thread_check,
                            .after = on_thread_check, .done = count_done};
    r[1] = (kvd__disk_req_t){.op = KVD_DISK_OP_READ, .fd = -1, .buf = out, .len = 512,
                            .done = count_done};
    r[2] = (kvd__disk_req_t){.op = KVD_DISK_OP_CALL, .before = on_thread_check, .done = count_done};
    kvd__disk_io_submit(io, &r[0]);
    kvd__disk_io_submit(io, &r[1]);
    kvd__disk_io_submit(io, &r[2]);
    while (dones < 3)
        kvd__disk_io_wait(io, 10000);
    ck_assert_int_eq(r[0].res, (int64_t)sizeof(buf));
    ck_assert_int_eq(r[1].res, -EBADF);
    ck_assert_int_eq(r[2].res, 0);
    ck_assert_int_eq(off_loop, 3);
    /* past the end: the file is shorter than the read */
    r[3] = (kvd__disk_req_t){.op = KVD_DISK_OP_READ, .fd = fd, .off = 4096, .buf = out,
                            .len = 8192, .done = count_done};
    kvd__disk_io_submit(io, &r[3]);
    kvd__disk_io_destroy(&io); /* waits, and runs its done */
    ck_assert_int_eq(dones, 4);
    ck_assert_int_eq(r[3].res, -ENODATA);
    close(fd);
    scratch_rm();
}

START_TEST(engine_uring)
{
    engine_alone(0);
}
END_TEST

START_TEST(engine_threads)
{
    engine_alone(1);
}
END_TEST

/* A request's parts: each runs once, off the caller's thread, several at
 * once on io_uring's prep threads; the write goes to the disk only once
 * every part of before has ended (the file holds what each part wrote),
 * after's parts see the whole read, and done runs only once every part of
 * after has ended; destroy with parts in flight waits for them. */
#define PARTS 8
#define PART_BYTES 512
static int part_runs[2][PARTS], part_bad, running, most_running, runs_at_done;

static void part_work(kvd__disk_req_t *r, unsigned part, int stage)
{
    int now = __atomic_add_fetch(&running, 1, __ATOMIC_SEQ_CST);
    int m = __atomic_load_n(&most_running, __ATOMIC_SEQ_CST);
    const uint8_t *p = (const uint8_t *)r->buf + part * PART_BYTES;

    while (now > m && !__atomic_compare_exchange_n(&most_running, &m, now, 0, __ATOMIC_SEQ_CST,
                                                    __ATOMIC_SEQ_CST))
        ;
    if (pthread_equal(pthread_self(), main_thread) || part >= PARTS)
        __atomic_add_fetch(&part_bad, 1, __ATOMIC_SEQ_CST);
    usleep(20000); /* long enough that free threads take the other parts */
    if (stage == 0)
        memset((uint8_t *)r->buf + part * PART_BYTES, 'a' + (int)part, PART_BYTES);
    else if (r->op == KVD_DISK_OP_READ)
        for (unsigned j = 0; j < PART_BYTES; j++)
            if (p[j] != 'a' + part)
                __atomic_add_fetch(&part_bad, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&part_runs[stage][part], 1, __ATOMIC_SEQ_CST);
    __atomic_sub_fetch(&running, 1, __ATOMIC_SEQ_CST);
}

static void part_before(kvd__disk_req_t *r, unsigned part)
{
    part_work(r, part, 0);
}

static void part_after(kvd__disk_req_t *r, unsigned part)
{
    part_work(r, part, 1);
}

static void parts_done(kvd__disk_req_t *r)
{
    (void)r;
    for (int i = 0; i < PARTS; i++)
        runs_at_done += __atomic_load_n(&part_runs[1][i], __ATOMIC_SEQ_CST);
    dones++;
}

static void engine_parts(int threads)
{
    kvd__disk_io_config_t c = {.queue_depth = 16, .threads = 3, .prep_threads = 4};
    kvd__disk_io_t *io;
    kvd__disk_req_t w, rd;
    char path[600], why[200];
    uint8_t buf[PARTS * PART_BYTES], back[PARTS * PART_BYTES], want[PARTS * PART_BYTES];
    int fd, i;

    threads = threads || getenv("KVD_TEST_DISK_THREADS") != NULL; /* as io_make */
    c.force_threads = threads;
    scratch();
    ck_assert_int_eq(kvd__disk_io_create(&io, &c, why, sizeof(why)), KVD_OK);
    ck_assert_str_eq(kvd__disk_io_engine(io), threads ? "threads" : "io_uring");
    ck_assert_uint_eq(kvd__disk_io_cpu_threads(io),
                      strcmp(kvd__disk_io_engine(io), "io_uring") == 0 ? 4 : 3);
    main_thread = pthread_self();
    memset(part_runs, 0, sizeof(part_runs));
    part_bad = running = most_running = runs_at_done = dones = 0;
    snprintf(path, sizeof(path), "%s/f", dir);
    fd = open(path, O_RDWR | O_CREAT, 0600);
    ck_assert_int_ge(fd, 0);
    memset(buf, 0, sizeof(buf));
    w = (kvd__disk_req_t){.op = KVD_DISK_OP_WRITE, .fd = fd, .buf = buf, .len = sizeof(buf),
                          .before = part_before, .after = part_after, .parts = PARTS,
                          .done = parts_done};
    kvd__disk_io_submit(io, &w);
    while (dones < 1)
        kvd__disk_io_wait(io, 10000);
    ck_assert_int_eq(w.res, (int64_t)sizeof(buf));
    ck_assert_int_eq(runs_at_done, PARTS);
    for (i = 0; i < PARTS; i++)
        memset(want + i * PART_BYTES, 'a' + i, PART_BYTES);
    ck_assert_int_eq(pread(fd, back, sizeof(back), 0), (ssize_t)sizeof(back));
    ck_assert_mem_eq(back, want, sizeof(want));
    memset(back, 0, sizeof(back));
    rd = (kvd__disk_req_t){.op = KVD_DISK_OP_READ, .fd = fd, .buf = back, .len = sizeof(back),
                           .after = part_after, .parts = PARTS, .done = parts_done};
    kvd__disk_io_submit(io, &rd);
    kvd__disk_io_destroy(&io); /* with the read's parts in flight: waits, runs its done */
    ck_assert_int_eq(dones, 2);
    ck_assert_int_eq(rd.res, (int64_t)sizeof(back));
    ck_assert_int_eq(runs_at_done, PARTS + 2 * PARTS);
    for (i = 0; i < PARTS; i++) {
        ck_assert_int_eq(part_runs[0][i], 1);
        ck_assert_int_eq(part_runs[1][i], 2);
    }
    ck_assert_int_eq(part_bad, 0);
    /* the pool runs a request's parts in turn; the prep threads at once */
    if (threads)
        ck_assert_int_eq(most_running, 1);
    else
        ck_assert_int_ge(most_running, 2);
    close(fd);
    scratch_rm();
}

START_TEST(engine_parts_uring)
{
    engine_parts(0);
}
END_TEST

START_TEST(engine_parts_threads)
{
    engine_parts(1);
}
END_TEST

/* The probe answers as the file system does: a real disk takes O_DIRECT;
 * tmpfs refused it before Linux 6.6 (the daemon then uses the pool and
 * the page cache). */
START_TEST(probe_direct)
{
    char why[300];

    scratch();
    ck_assert_int_eq(kvd__disk_probe_direct(dir, why, sizeof(why)), 1);
    scratch_rm();
    if (access("/dev/shm", W_OK) == 0) {
        snprintf(dir, sizeof(dir), "/dev/shm/kvd-probe-XXXXXX");
        char f[600];
        int fd, takes;
        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(f, sizeof(f), "%s/f", dir);
        fd = open(f, O_RDWR | O_CREAT | O_DIRECT, 0600);
        takes = fd >= 0;
        if (fd >= 0)
            close(fd);
        unlink(f);
        ck_assert_int_eq(kvd__disk_probe_direct(dir, why, sizeof(why)), takes);
        if (!takes)
            ck_assert_ptr_nonnull(strstr(why, "O_DIRECT"));
        scratch_rm();
    }
}
END_TEST

/* ---- drops ---------------------------------------------------------------------------- */

START_TEST(drops_survive_reopen)
{
    kvd__disk_io_t *io = io_make(0);
    kvd__disk_store_t *s;
    kvd__disk_store_config_t c;
    kvd__disk_store_stats_t st;
    uint32_t n = 600, i, segs;
    uint8_t *data = malloc((uint64_t)n * BLOCK);

    scratch();
    c = config(7, BLOCK);
    s = open_store(io, &c);
    append_all(io, s, data, n, BLOCK);
    kvd__disk_store_stats(s, &st);
    segs = (uint32_t)st.segments;
    /* the first segment's records all, and every third other */
    for (i = 0; i < n; i++)
        if (KVD_DISK_LOC_SEG(locs[i]) == 1 || i % 3 == 0)
            kvd__disk_drop(s, locs[i]);
    while (kvd__disk_io_pending(io) > 0)
        kvd__disk_io_wait(io, 10000);
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_eq(st.segments, segs - 1); /* the first is gone */
    kvd__disk_store_close(&s);
    s = open_store(io, &c);
    for (i = 0; i < n; i++) {
        int dropped = KVD_DISK_LOC_SEG(locs[i]) == 1 || i % 3 == 0;
        ck_assert_uint_eq(found_seen[i], dropped ? 0 : 1);
    }
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_eq(st.records, nfound);
    kvd__disk_store_close(&s);
    kvd__disk_io_destroy(&io);
    free(data);
    scratch_rm();
}
END_TEST

/* ---- crashes and damage ------------------------------------------------------------------ */

/* A child writes n records and dies with SIGKILL once they are on disk:
 * no segment sealed by a close, the open one without its index. */
static void write_and_die(uint32_t n, uint64_t block, uint64_t layout)
{
    pid_t pid = fork();
    int status;

    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        kvd__disk_io_t *io = io_make(0);
        kvd__disk_store_config_t c = config(layout, block);
        kvd__disk_store_t *s = open_store(io, &c);
        uint8_t *data = malloc((uint64_t)n * block);
        append_all(io, s, data, n, block);
        for (uint32_t i = 0; i < n; i++)
            if (ast[i] != KVD_OK)
                _exit(3);
        kill(getpid(), SIGKILL);
        _exit(4);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

START_TEST(killed_then_rebuilt)
{
    kvd__disk_io_t *io;
    kvd__disk_store_t *s;
    kvd__disk_store_config_t c = config(7, BLOCK);
    kvd__disk_store_stats_t st;
    uint32_t n = 600, i;

    scratch();
    /* the fork first: a child forked beside the engine's threads may
     * inherit a lock one of them held (the sanitizers' while a thread
     * starts) and never get it */
    write_and_die(n, BLOCK, 7);
    io = io_make(0);
    ck_assert_int_lt(count_files(".idx"), count_files(".kvd"));
    s = open_store(io, &c);
    ck_assert_uint_eq(nfound, n);
    for (i = 0; i < n; i++)
        ck_assert_uint_eq(found_seen[i], 1);
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_ge(st.rebuilt_indexes, 1);
    read_all(io, s, 0, n, BLOCK);
    kvd__disk_store_close(&s);
    /* the rebuilt indexes were kept */
    s = open_store(io, &c);
    ck_assert_uint_eq(nfound, n);
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_eq(st.rebuilt_indexes, 0);
    kvd__disk_store_close(&s);
    kvd__disk_io_destroy(&io);
    scratch_rm();
}
END_TEST

static void flip_byte(const char *name, off_t off)
{
    char path[700];
    int fd;
    uint8_t b;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, &b, 1, off), 1);
    b ^= 0x10;
    ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

START_TEST(flipped_byte)
{
    kvd__disk_io_t *io = io_make(0);
    kvd__disk_store_t *s;
    kvd__disk_store_config_t c = config(7, BLOCK);
    kvd__disk_store_stats_t st;
    uint32_t n = 100, i, victim = 37;
    uint8_t *data = malloc((uint64_t)n * BLOCK);
    char name[64];

    scratch();
    s = open_store(io, &c);
    append_all(io, s, data, n, BLOCK);
    kvd__disk_store_close(&s);
    /* a byte of record 37's data, then of segment 1's index */
    snprintf(name, sizeof(name), "seg-%08u.kvd", KVD_DISK_LOC_SEG(locs[victim]));
    flip_byte(name, (off_t)KVD_DISK_LOC_OFF(locs[victim]) + KVD_DISK_REC_HDR + 500);
    s = open_store(io, &c);
    ck_assert_uint_eq(nfound, n); /* from the index: found, and refused when read */
    ck_assert_int_eq(read_one(io, s, victim, BLOCK), KVD_EIO);
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_eq(st.checksum_failures, 1);
    for (i = 0; i < n; i++)
        if (i != victim)
            ck_assert_int_eq(read_one(io, s, i, BLOCK), KVD_OK);
    kvd__disk_store_close(&s);
    /* the index damaged too: the segment is read whole, and the bad
     * record is left out */
    snprintf(name, sizeof(name), "seg-%08u.idx", KVD_DISK_LOC_SEG(locs[victim]));
    flip_byte(name, 70);
    s = open_store(io, &c);
    ck_assert_uint_eq(nfound, n - 1);
    ck_assert_uint_eq(found_seen[victim], 0);
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_eq(st.rebuilt_indexes, 1);
    ck_assert_uint_eq(st.lost_records, 1);
    kvd__disk_store_close(&s);
    kvd__disk_io_destroy(&io);
    free(data);
    scratch_rm();
}
END_TEST

/* Many records prepared over several prep threads (batches of about 200
 * records, each split into parts): every record completes and lands in
 * the order appended and reads back byte for byte with every read in flight at
 * once; a flipped byte in any part of a batch (a part's first record, its
 * last, a header, a record's last byte) is still caught, the others
 * served; a reopen finds them all, oldest first. */
static void many_records(unsigned prep_threads)
{
    int threads = getenv("KVD_TEST_DISK_THREADS") != NULL;
    kvd__disk_io_config_t ic = {.queue_depth = 16, .threads = 3, .prep_threads = prep_threads,
                                .force_threads = threads};
    kvd__disk_io_t *io;
    kvd__disk_store_t *s;
    kvd__disk_store_config_t c = config(9, BLOCK);
    kvd__disk_store_stats_t st;
    const uint32_t n = 3000, victims[] = {0, 26, 27, 1000, 1998, n - 1};
    const off_t where[] = {KVD_DISK_REC_HDR, KVD_DISK_REC_HDR + BLOCK - 1, 40,
                           KVD_DISK_REC_HDR + 333, 8, KVD_DISK_REC_HDR + 1};
    uint8_t *data = malloc((uint64_t)n * BLOCK), *got = malloc((uint64_t)n * BLOCK), k[32];
    char why[200], name[64];
    uint32_t i, v, bad;

    ck_assert_ptr_nonnull(data);
    ck_assert_ptr_nonnull(got);
    scratch();
    ck_assert_int_eq(kvd__disk_io_create(&io, &ic, why, sizeof(why)), KVD_OK);
    if (!threads)
        ck_assert_uint_eq(kvd__disk_io_cpu_threads(io), prep_threads);
    c.write_bytes = 256 << 10;
    c.segment_bytes = 1 << 20;
    s = open_store(io, &c);
    append_all(io, s, data, n, BLOCK);
    for (i = 0; i < n; i++) {
        ck_assert_int_eq(ast[i], KVD_OK);
        /* completed in the order appended, whichever batch's write ended
         * first (the cache's recency follows it) */
        ck_assert_int_eq(aorder[i], (int)i);
        if (i > 0) /* placed in that order: later segment, or later in it */
            ck_assert_uint_gt(locs[i], locs[i - 1]);
    }
    read_all(io, s, 0, n, BLOCK);
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_eq(st.appends, n);
    ck_assert_uint_eq(st.checksum_failures, 0);
    ck_assert_uint_ge(st.segments, 3);
    kvd__disk_store_close(&s);
    for (v = 0; v < sizeof(victims) / sizeof(victims[0]); v++) {
        snprintf(name, sizeof(name), "seg-%08u.kvd", KVD_DISK_LOC_SEG(locs[victims[v]]));
        flip_byte(name, (off_t)KVD_DISK_LOC_OFF(locs[victims[v]]) + where[v]);
    }
    s = open_store(io, &c);
    ck_assert_uint_eq(nfound, n); /* from the indexes: found, refused when read */
    ck_assert(seq_ordered);
    memset(got, 0xee, (uint64_t)n * BLOCK);
    rdone = 0;
    for (i = 0; i < n; i++) {
        key_of(k, i);
        ck_assert_int_eq(kvd__disk_read(s, locs[i], k, 32, got + (uint64_t)i * BLOCK, on_read,
                                        (void *)(uintptr_t)i),
                         KVD_OK);
    }
    while (rdone < (int)n)
        kvd__disk_io_wait(io, 10000);
    for (i = 0, bad = 0; i < n; i++) {
        int victim = 0;
        for (v = 0; v < sizeof(victims) / sizeof(victims[0]); v++)
            victim |= victims[v] == i;
        if (victim) {
            ck_assert_int_eq(rst[i], KVD_EIO);
            bad++;
            continue;
        }
        ck_assert_int_eq(rst[i], KVD_OK);
        fill(data, i, BLOCK);
        ck_assert_mem_eq(got + (uint64_t)i * BLOCK, data, BLOCK);
    }
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_eq(st.checksum_failures, bad);
    kvd__disk_store_close(&s);
    kvd__disk_io_destroy(&io);
    free(data);
    free(got);
    scratch_rm();
}

START_TEST(many_records_one_prep_thread)
{
    many_records(1);
}
END_TEST

START_TEST(many_records_four_prep_threads)
{
    many_records(4);
}
END_TEST

START_TEST(truncated_segment)
{
    kvd__disk_io_t *io = io_make(1);
    kvd__disk_store_t *s;
    kvd__disk_store_config_t c = config(7, BLOCK);
    kvd__disk_store_stats_t st;
    uint32_t n = 200, i, kept = 0;
    uint8_t *data = malloc((uint64_t)n * BLOCK);
    char path[700];
    off_t cut;

    scratch();
    s = open_store(io, &c);
    append_all(io, s, data, n, BLOCK);
    kvd__disk_store_close(&s);
    /* segment 1 cut in the middle of record 50 */
    ck_assert_uint_eq(KVD_DISK_LOC_SEG(locs[50]), 1);
    cut = (off_t)KVD_DISK_LOC_OFF(locs[50]) + 300;
    snprintf(path, sizeof(path), "%s/seg-00000001.kvd", dir);
    ck_assert_int_eq(truncate(path, cut), 0);
    s = open_store(io, &c);
    for (i = 0; i < n; i++) {
        if (KVD_DISK_LOC_SEG(locs[i]) == 1 && i >= 50)
            ck_assert_uint_eq(found_seen[i], 0);
        else if (KVD_DISK_LOC_SEG(locs[i]) == 1 && (uint64_t)KVD_DISK_LOC_OFF(locs[i]) + 4096 +
                                                           BLOCK < (uint64_t)cut)
            ck_assert_uint_eq(found_seen[i], 1);
        kept += found_seen[i];
    }
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_gt(st.lost_records, 0);
    for (i = 0; i < n; i++)
        if (found_seen[i])
            ck_assert_int_eq(read_one(io, s, i, BLOCK), KVD_OK);
    ck_assert_uint_eq(kept, nfound);
    kvd__disk_store_close(&s);
    kvd__disk_io_destroy(&io);
    free(data);
    scratch_rm();
}
END_TEST

/* ---- files not to trust -------------------------------------------------------------------- */

START_TEST(untrusted_files)
{
    kvd__disk_io_t *io = io_make(0);
    kvd__disk_store_t *s;
    kvd__disk_store_config_t c = config(7, BLOCK), other = config(8, BLOCK);
    kvd__disk_store_stats_t st;
    uint32_t n = 600, i, bad_owner = 0, bad_mode = 0;
    uint8_t *data = malloc((uint64_t)n * BLOCK);
    char path[700], why[300];

    scratch();
    s = open_store(io, &c);
    append_all(io, s, data, n, BLOCK);
    kvd__disk_store_close(&s);
    /* another layout: every segment skipped */
    s = open_store(io, &other);
    ck_assert_uint_eq(nfound, 0);
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_ge(st.skipped_files, 3);
    kvd__disk_store_close(&s);
    /* segment 1 writable by others; segment 2's drop file another user's
     * (where this test may change owners) */
    snprintf(path, sizeof(path), "%s/seg-00000001.kvd", dir);
    ck_assert_int_eq(chmod(path, 0666), 0);
    bad_mode = 1;
    snprintf(path, sizeof(path), "%s/seg-00000002.kvd", dir);
    if (geteuid() == 0 && chown(path, 65534, 65534) == 0)
        bad_owner = 2;
    s = open_store(io, &c);
    for (i = 0; i < n; i++) {
        uint32_t g = KVD_DISK_LOC_SEG(locs[i]);
        ck_assert_uint_eq(found_seen[i], g == bad_mode || g == bad_owner ? 0 : 1);
    }
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_eq(st.skipped_files, bad_owner ? 2 : 1);
    kvd__disk_store_close(&s);
    /* the files skipped are left alone */
    ck_assert_int_eq(access(path, F_OK), 0);
    /* a directory others may write is refused */
    ck_assert_int_eq(chmod(dir, 0777), 0);
    ck_assert_int_eq(kvd__disk_store_open(&s, &c, io, on_found, NULL, why, sizeof(why)), KVD_EPERM);
    ck_assert_ptr_nonnull(strstr(why, "writable by others"));
    ck_assert_int_eq(chmod(dir, 0700), 0);
    kvd__disk_io_destroy(&io);
    free(data);
    scratch_rm();
}
END_TEST

/* ---- a full file system ---------------------------------------------------------------------- */

/* RLIMIT_FSIZE stands in for a small file system: writes past it fail
 * with EFBIG (SIGXFSZ ignored, as the daemon does). */
START_TEST(file_system_full)
{
    kvd__disk_io_t *io = io_make(0);
    kvd__disk_store_t *s;
    kvd__disk_store_config_t c = config(7, BLOCK);
    kvd__disk_store_stats_t st;
    struct rlimit rl = {.rlim_cur = 300 << 10, .rlim_max = RLIM_INFINITY};
    uint32_t n = 600, i, ok = 0, full = 0;
    uint8_t *data = malloc((uint64_t)n * BLOCK);

    scratch();
    signal(SIGXFSZ, SIG_IGN);
    c.segment_bytes = 512 << 10; /* each segment fills up at 300 KiB */
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    s = open_store(io, &c);
    append_all(io, s, data, n, BLOCK);
    for (i = 0; i < n; i++) {
        ck_assert(ast[i] == KVD_OK || ast[i] == KVD_ELIMIT);
        ok += ast[i] == KVD_OK;
        full += ast[i] == KVD_ELIMIT;
    }
    ck_assert_uint_gt(ok, 100);
    ck_assert_uint_gt(full, 0);
    kvd__disk_store_stats(s, &st);
    ck_assert_uint_eq(st.no_space, full);
    ck_assert_uint_eq(st.records, ok);
    for (i = 0; i < n; i++)
        if (ast[i] == KVD_OK)
            ck_assert_int_eq(read_one(io, s, i, BLOCK), KVD_OK);
    kvd__disk_store_close(&s);
    rl.rlim_cur = RLIM_INFINITY;
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    /* what was written is all there */
    s = open_store(io, &c);
    ck_assert_uint_eq(nfound, ok);
    kvd__disk_store_close(&s);
    kvd__disk_io_destroy(&io);
    free(data);
    scratch_rm();
}
END_TEST

/* ---- a million records ------------------------------------------------------------------------ */

static uint32_t big_found;
static int count_found(void *arg, const kvd__disk_found_t *f)
{
    (void)arg;
    (void)f;
    big_found++;
    return 1;
}

static uint32_t big_done, big_failed;
static void on_big_append(void *arg, kvd_status_t st, kvd__disk_loc_t loc)
{
    (void)arg;
    (void)loc;
    big_done++;
    big_failed += st != KVD_OK;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

START_TEST(million_records_reopen)
{
    kvd__disk_io_t *io = io_make(0);
    kvd__disk_store_t *s;
    kvd__disk_store_config_t c = config(9, 64);
    uint32_t n = 1000000, i;
    uint8_t block[64], k[32], p[32];
    char why[300];
    double t0, dt;

    scratch();
    c.segment_bytes = 64 << 20;
    c.write_bytes = 4 << 20;
    ck_assert_int_eq(kvd__disk_store_open(&s, &c, io, count_found, NULL, why, sizeof(why)), KVD_OK);
    memset(block, 0x3c, sizeof(block));
    adone = 0;
    for (i = 0; i < n; i++) {
        uint32_t ch = i / 1000, j = i % 1000;
        memset(k, 0, 32);
        memcpy(k, &ch, 4);
        memcpy(k + 4, &j, 4);
        memcpy(p, k, 32);
        j--;
        memcpy(p + 4, &j, 4);
        ck_assert_int_eq(kvd__disk_append(s, k, 32, i % 1000 ? p : NULL, i % 1000 ? 32 : 0, block,
                                          on_big_append, NULL),
                         KVD_OK);
        while (i + 1 - big_done > 100000) /* a bounded queue, as the cache keeps it */
            kvd__disk_io_wait(io, 10000);
    }
    kvd__disk_store_flush(s);
    while (big_done < n)
        kvd__disk_io_wait(io, 10000);
    ck_assert_uint_eq(big_failed, 0);
    kvd__disk_store_close(&s);
    big_found = 0;
    t0 = now_s();
    ck_assert_int_eq(kvd__disk_store_open(&s, &c, io, count_found, NULL, why, sizeof(why)), KVD_OK);
    dt = now_s() - t0;
    ck_assert_uint_eq(big_found, n);
    fprintf(stderr, "check_disk_store: 1,000,000 records found again in %.2f s\n", dt);
    ck_assert_msg(dt < 3.0, "reopening took %.2f s", dt);
    kvd__disk_store_close(&s);
    kvd__disk_io_destroy(&io);
    scratch_rm();
}
END_TEST

/* The records' checksum is CRC-32C as the standard defines it: the
 * published check values, and a bit-at-a-time reference over buffers of
 * every shape the fast path splits (three interleaved lanes of 8 KiB, a
 * tail, odd starts, a running value carried across calls). */
static uint32_t crc32c_bitwise(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = crc & 1 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

START_TEST(crc32c_values)
{
    static const size_t lens[] = {0, 1, 7, 8, 9, 4095, 24575, 24576, 24577, 49152,
                                  49159, 73728 + 100, 200003};
    uint8_t zeros[32] = {0}, ones[32];
    uint8_t *buf = malloc(200003 + 16);
    unsigned seed = 7;

    ck_assert_ptr_nonnull(buf);
    memset(ones, 0xff, sizeof(ones));
    /* RFC 3720, B.4, and the common check value */
    ck_assert_uint_eq(kvd__disk_crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(kvd__disk_crc32c(0, zeros, 32), 0x8A9136AAu);
    ck_assert_uint_eq(kvd__disk_crc32c(0, ones, 32), 0x62A8AB43u);
    for (size_t i = 0; i < 200003 + 16; i++)
        buf[i] = (uint8_t)rand_r(&seed);
    for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
        for (size_t off = 0; off < 16; off += 5) {
            size_t n = lens[l], half = n / 3;
            uint32_t want = crc32c_bitwise(0, buf + off, n);

            ck_assert_uint_eq(kvd__disk_crc32c(0, buf + off, n), want);
            ck_assert_uint_eq(kvd__disk_crc32c(kvd__disk_crc32c(0, buf + off, half),
                                               buf + off + half, n - half),
                              want);
        }
    free(buf);
}
END_TEST

/* One case per test, so that CK_RUN_CASE=name runs one. */
#define CASE(s, fn)                                                                        \
    do {                                                                                   \
        TCase *t = tcase_create(#fn);                                                      \
        tcase_set_timeout(t, 120);                                                         \
        tcase_add_test(t, fn);                                                             \
        suite_add_tcase(s, t);                                                             \
    } while (0)

static Suite *suite(void)
{
    Suite *s = suite_create("disk_store");

    CASE(s, crc32c_values);
    CASE(s, engine_uring);
    CASE(s, engine_threads);
    CASE(s, engine_parts_uring);
    CASE(s, engine_parts_threads);
    CASE(s, uring_direct);
    CASE(s, threads_direct);
    CASE(s, threads_buffered);
    CASE(s, probe_direct);
    CASE(s, drops_survive_reopen);
    CASE(s, killed_then_rebuilt);
    CASE(s, flipped_byte);
    CASE(s, many_records_one_prep_thread);
    CASE(s, many_records_four_prep_threads);
    CASE(s, truncated_segment);
    CASE(s, untrusted_files);
    CASE(s, file_system_full);
    CASE(s, million_records_reopen);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    int failed;

    srunner_run_all(r, CK_NORMAL);
    failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
