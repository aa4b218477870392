/*
 * bench_disk: the disk level's store (daemon/disk/) at full rate on one
 * directory.  bench_disk.sh runs it beside fio on the same directory.
 *
 *   bench_disk DIR [--block BYTES] [--bytes TOTAL] [--depth N]
 *              [--write-bytes BYTES] [--writes N] [--threads] [--prep-threads N]
 *
 * Spill: TOTAL bytes of blocks appended as chains of 64 (what eviction
 * spills), every record in flight that the store queues, timed from the
 * first append to the last completion.  Load: every record read back in a
 * random order, DEPTH reads in flight, each checked (CRC-32C) and copied
 * out as a load does.  Rates count the blocks' bytes; one line each:
 *   spill_MBps=... load_MBps=... load_iops=... record_bytes=... read_bytes=...
 * and the cores busy in each phase: this process's (its threads' CPU time
 * over the phase's time) and the machine's (/proc/stat), so that a run can
 * tell a store bound by its own threads from a machine out of cores (a
 * drive in RAM spends CPU on its own copies).
 * read_bytes is the aligned range one read moves (what fio's randread
 * should be run at).  --threads: the pread/pwrite pool instead of
 * io_uring; --prep-threads: io_uring's threads for the copies and
 * checksums (default: one per core, at most 8).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "disk_store.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* CPU seconds of this process, and busy and total seconds of the machine. */
typedef struct cpu_mark {
    double t, self, busy, all;
} cpu_mark_t;

static cpu_mark_t cpu_mark(void)
{
    cpu_mark_t m = {now_s(), 0, 0, 0};
    struct rusage ru;
    unsigned long long v[8] = {0};
    FILE *f;

    if (getrusage(RUSAGE_SELF, &ru) == 0)
        m.self = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
                 (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    if ((f = fopen("/proc/stat", "r")) != NULL) {
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]) == 8) {
            double hz = (double)sysconf(_SC_CLK_TCK);
            m.all = (double)(v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]) / hz;
            m.busy = m.all - (double)(v[3] + v[4]) / hz; /* less idle and iowait */
        }
        fclose(f);
    }
    return m;
}

/* Cores busy between a and b: this process's, the machine's. */
static void cpu_cores(cpu_mark_t a, cpu_mark_t b, double *self, double *machine)
{
    double wall = b.t - a.t, all = b.all - a.all;
    long n = sysconf(_SC_NPROCESSORS_ONLN);

    *self = wall > 0 ? (b.self - a.self) / wall : 0;
    *machine = all > 0 ? (b.busy - a.busy) / all * (double)(n > 0 ? n : 1) : 0;
}

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (uint64_t)v;
}

static uint64_t done, failed;
static kvd__disk_loc_t *locs;

static void on_append(void *arg, kvd_status_t st, kvd__disk_loc_t loc)
{
    locs[(uintptr_t)arg] = loc;
    done++;
    failed += st != KVD_OK;
}

static void on_read(void *arg, kvd_status_t st)
{
    (void)arg;
    done++;
    failed += st != KVD_OK;
}

static void key_of(uint8_t *k, uint64_t i)
{
    memset(k, 0, 32);
    memcpy(k, &i, 8);
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    uint64_t block = 2u << 20, total = 1ull << 30, n, i, inflight_max;
    unsigned depth = 32, writes = 8, threads = 0, prep_threads = 0;
    uint32_t write_bytes = 8u << 20;
    kvd__disk_io_t *io;
    kvd__disk_store_t *s;
    kvd__disk_io_config_t ic = {0};
    kvd__disk_store_config_t sc = {0};
    kvd__disk_store_stats_t st;
    uint8_t *src, *dst, k[32], p[32];
    uint64_t *order;
    char why[300];
    double t0, spill_s, load_s, spill_self, spill_machine, load_self, load_machine;
    cpu_mark_t c0, c1;
    int a;

    for (a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--block") && a + 1 < argc)
            block = parse_size(argv[++a]);
        else if (!strcmp(argv[a], "--bytes") && a + 1 < argc)
            total = parse_size(argv[++a]);
        else if (!strcmp(argv[a], "--depth") && a + 1 < argc)
            depth = (unsigned)atoi(argv[++a]);
        else if (!strcmp(argv[a], "--write-bytes") && a + 1 < argc)
            write_bytes = (uint32_t)parse_size(argv[++a]);
        else if (!strcmp(argv[a], "--writes") && a + 1 < argc)
            writes = (unsigned)atoi(argv[++a]);
        else if (!strcmp(argv[a], "--threads"))
            threads = 1;
        else if (!strcmp(argv[a], "--prep-threads") && a + 1 < argc && atoi(argv[a + 1]) > 0)
            prep_threads = (unsigned)atoi(argv[++a]);
        else if (argv[a][0] != '-' && dir == NULL)
            dir = argv[a];
        else {
            fprintf(stderr, "usage: bench_disk DIR [--block B] [--bytes B] [--depth N] "
                            "[--write-bytes B] [--writes N] [--threads] "
                            "[--prep-threads N]\n");
            return 2;
        }
    }
    if (dir == NULL || block < 1 || depth < 1 || (n = total / block) < 1) {
        fprintf(stderr, "bench_disk: a directory, and --bytes of at least one --block\n");
        return 2;
    }
    ic.queue_depth = depth > writes ? depth : writes;
    ic.threads = depth;
    ic.force_threads = (int)threads;
    ic.prep_threads = prep_threads;
    if (kvd__disk_io_create(&io, &ic, why, sizeof(why)) != KVD_OK) {
        fprintf(stderr, "bench_disk: %s\n", why);
        return 1;
    }
    sc.dir = dir;
    sc.layout_id = 0xbe4c;
    sc.layout_text = "bench";
    sc.block_bytes = block;
    sc.segment_bytes = 1ull << 30;
    sc.write_bytes = write_bytes;
    sc.max_writes = writes;
    sc.buffered = !kvd__disk_probe_direct(dir, why, sizeof(why));
    if (kvd__disk_store_open(&s, &sc, io, NULL, NULL, why, sizeof(why)) != KVD_OK) {
        fprintf(stderr, "bench_disk: %s\n", why);
        return 1;
    }
    /* the blocks' bytes: one source buffer per record would not fit; the
     * copy into the write batch reads a rotating window of 64 blocks */
    src = malloc(block * 64);
    dst = malloc(block * depth);
    locs = calloc(n, sizeof(*locs));
    order = malloc(n * sizeof(*order));
    if (src == NULL || dst == NULL || locs == NULL || order == NULL) {
        fprintf(stderr, "bench_disk: out of memory\n");
        return 1;
    }
    for (i = 0; i < block * 64; i++)
        src[i] = (uint8_t)(i * 31 + (i >> 12));
    /* as many appends queued as the store writes at once, and one batch more */
    inflight_max = ((uint64_t)write_bytes * (writes + 1)) / block + 1;
    c0 = cpu_mark();
    t0 = now_s();
    for (i = 0; i < n; i++) {
        key_of(k, i);
        key_of(p, i - 1);
        while (i - done >= inflight_max)
            kvd__disk_io_wait(io, 1000);
        if (kvd__disk_append(s, k, 32, i % 64 ? p : NULL, i % 64 ? 32 : 0, src + (i % 64) * block,
                             on_append, (void *)(uintptr_t)i) != KVD_OK) {
            fprintf(stderr, "bench_disk: append refused\n");
            return 1;
        }
        if (i + 1 == n)
            kvd__disk_store_flush(s);
    }
    while (done < n)
        kvd__disk_io_wait(io, 1000);
    spill_s = now_s() - t0;
    c1 = cpu_mark();
    cpu_cores(c0, c1, &spill_self, &spill_machine);
    if (failed) {
        fprintf(stderr, "bench_disk: %llu appends failed\n", (unsigned long long)failed);
        return 1;
    }
    /* drop the page cache's copy where there is one (buffered): a read
     * should come from the drive */
    if (sc.buffered)
        sync();
    for (i = 0; i < n; i++)
        order[i] = i;
    srand(42);
    for (i = n - 1; i > 0; i--) {
        uint64_t j = (uint64_t)rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    done = failed = 0;
    c0 = cpu_mark();
    t0 = now_s();
    for (i = 0; i < n; i++) {
        while (i - done >= depth)
            kvd__disk_io_wait(io, 1000);
        key_of(k, order[i]);
        if (kvd__disk_read(s, locs[order[i]], k, 32, dst + (i % depth) * block, on_read, NULL) !=
            KVD_OK) {
            fprintf(stderr, "bench_disk: read refused\n");
            return 1;
        }
    }
    while (done < n)
        kvd__disk_io_wait(io, 1000);
    load_s = now_s() - t0;
    c1 = cpu_mark();
    cpu_cores(c0, c1, &load_self, &load_machine);
    kvd__disk_store_stats(s, &st);
    printf("engine=%s cpu_threads=%u direct=%d block=%llu records=%llu record_bytes=%llu "
           "read_bytes=%llu write_bytes=%u writes=%u depth=%u\n",
           kvd__disk_io_engine(io), kvd__disk_io_cpu_threads(io), st.direct, (unsigned long long)block, (unsigned long long)n,
           (unsigned long long)kvd__disk_store_rec_bytes(s),
           (unsigned long long)((kvd__disk_store_rec_bytes(s) + 4095) / 4096 * 4096 + 4096),
           write_bytes, writes, depth);
    printf("cores spill_self=%.2f spill_machine=%.2f load_self=%.2f load_machine=%.2f of %ld\n",
           spill_self, spill_machine, load_self, load_machine, sysconf(_SC_NPROCESSORS_ONLN));
    printf("spill_MBps=%.0f load_MBps=%.0f load_iops=%.0f failed_reads=%llu\n",
           (double)n * block / spill_s / 1e6, (double)n * block / load_s / 1e6,
           (double)n / load_s, (unsigned long long)failed);
    kvd__disk_store_close(&s);
    kvd__disk_io_destroy(&io);
    free(src);
    free(dst);
    free(locs);
    free(order);
    return failed ? 1 : 0;
}
