/*
 * disk_probe: a drive's own rates through io_uring with O_DIRECT, for
 * machines without fio (the GPU machine): a sequential write and then
 * random reads of the same file, the two fio jobs bench_disk.sh runs.
 *
 *   disk_probe DIR [--bytes SIZE] [--write-bs SIZE] [--write-depth N]
 *                  [--read-bs SIZE] [--read-depth N]
 *
 * Write: SIZE bytes (default 1g) to a new file in DIR in --write-bs
 * (8m) writes, --write-depth (8) in flight, no fsync (fio --rw=write
 * --direct=1 --ioengine=io_uring).  Read: every --read-bs (2m) piece of
 * that file once, in a random order, --read-depth (32) in flight (fio
 * --rw=randread).  Sizes are multiples of 4 KiB.  One line:
 *   write_MBps=... read_MBps=... read_iops=... bytes=... read_bs=... read_depth=...
 * (MB: 10^6 bytes, as fio's bw_bytes).  The file is removed at the end.
 * DIR must be on the drive to probe and allow O_DIRECT: where open refuses
 * it, the probe says so and exits 2.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ALIGN 4096u

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* "2m", "1.5g", "4096": bytes (K M G T: powers of 1024); 0 when bad. */
static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);

    if (end == s || v <= 0)
        return 0;
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; end++; break;
    case 'm': case 'M': v *= 1024.0 * 1024; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': v *= 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B')
        end++;
    return *end == '\0' ? (uint64_t)v : 0;
}

static int usage(const char *why)
{
    fprintf(stderr,
            "disk_probe: %s\nusage: disk_probe DIR [--bytes SIZE] [--write-bs SIZE] "
            "[--write-depth N] [--read-bs SIZE] [--read-depth N]\n",
            why);
    return 2;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/*
 * Move n pieces of bs bytes, depth at once: piece i at offset order[i] * bs
 * (order NULL: i).  Returns the seconds from the first submission to the
 * last completion, or < 0 on an error (said on stderr).
 */
static double run(struct io_uring *ring, int fd, bool write, uint64_t n, uint64_t bs,
                  unsigned depth, const uint64_t *order, char *const *bufs)
{
    uint64_t next = 0, done = 0;
    unsigned inflight = 0, nfree = depth, freeslot[1024];
    double t0 = now_s();

    for (unsigned i = 0; i < depth; i++) /* a buffer is reused once its I/O completed */
        freeslot[i] = i;
    while (done < n) {
        while (inflight < depth && next < n) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
            unsigned slot = freeslot[nfree - 1];
            uint64_t off = (order != NULL ? order[next] : next) * bs;

            if (sqe == NULL)
                break;
            if (write)
                io_uring_prep_write(sqe, fd, bufs[slot], (unsigned)bs, off);
            else
                io_uring_prep_read(sqe, fd, bufs[slot], (unsigned)bs, off);
            io_uring_sqe_set_data64(sqe, next << 10 | slot);
            nfree--;
            next++;
            inflight++;
        }
        int rc = io_uring_submit_and_wait(ring, 1);
        if (rc < 0) {
            fprintf(stderr, "disk_probe: io_uring_submit: %s\n", strerror(-rc));
            return -1;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(ring, head, cqe)
        {
            if (cqe->res != (int)bs) {
                fprintf(stderr, "disk_probe: %s of piece %" PRIu64 ": %s\n",
                        write ? "write" : "read", (uint64_t)io_uring_cqe_get_data64(cqe) >> 10,
                        cqe->res < 0 ? strerror(-cqe->res) : "short");
                return -1;
            }
            freeslot[nfree++] = (unsigned)(io_uring_cqe_get_data64(cqe) & 1023);
            seen++;
        }
        io_uring_cq_advance(ring, seen);
        done += seen;
        inflight -= seen;
    }
    return now_s() - t0;
}

int main(int argc, char **argv)
{
    uint64_t bytes = 1ull << 30, wbs = 8ull << 20, rbs = 2ull << 20, rng = 0x5eed;
    unsigned wdepth = 8, rdepth = 32, depth;
    struct io_uring ring;
    char path[4096], **bufs;
    uint64_t *order, nw, nr;
    double tw, tr;
    int fd, rc;

    if (argc < 2 || argv[1][0] == '-')
        return usage("a directory is needed");
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            return usage("an option needs a value");
        i++;
        if (strcmp(a, "--bytes") == 0)
            bytes = parse_size(v);
        else if (strcmp(a, "--write-bs") == 0)
            wbs = parse_size(v);
        else if (strcmp(a, "--read-bs") == 0)
            rbs = parse_size(v);
        else if (strcmp(a, "--write-depth") == 0)
            wdepth = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(a, "--read-depth") == 0)
            rdepth = (unsigned)strtoul(v, NULL, 10);
        else
            return usage("unknown option");
    }
    if (bytes == 0 || wbs == 0 || rbs == 0 || wbs % ALIGN || rbs % ALIGN ||
        wbs > (1u << 30) || rbs > (1u << 30))
        return usage("sizes are multiples of 4 KiB, pieces at most 1 GiB");
    if (wdepth == 0 || rdepth == 0 || wdepth > 1024 || rdepth > 1024)
        return usage("depths are 1 to 1024");
    nw = bytes / wbs;
    nr = (nw * wbs) / rbs;
    if (nw == 0 || nr == 0)
        return usage("--bytes is smaller than a piece");
    depth = wdepth > rdepth ? wdepth : rdepth;
    bufs = calloc(depth, sizeof(*bufs));
    order = malloc(nr * sizeof(*order));
    if (bufs == NULL || order == NULL)
        return fprintf(stderr, "disk_probe: out of memory\n"), 1;
    for (unsigned i = 0; i < depth; i++) {
        uint64_t b = wbs > rbs ? wbs : rbs;
        if (posix_memalign((void **)&bufs[i], ALIGN, b) != 0)
            return fprintf(stderr, "disk_probe: out of memory\n"), 1;
        for (uint64_t j = 0; j < b; j += 8) /* not zeroes: nothing the drive can skip */
            memcpy(bufs[i] + j, &(uint64_t){rng_next(&rng)}, 8);
    }
    for (uint64_t i = 0; i < nr; i++)
        order[i] = i;
    for (uint64_t i = nr - 1; i > 0; i--) { /* Fisher-Yates */
        uint64_t j = rng_next(&rng) % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    snprintf(path, sizeof(path), "%s/disk_probe.%d", argv[1], (int)getpid());
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0600);
    if (fd < 0) {
        fprintf(stderr, "disk_probe: %s: %s%s\n", path, strerror(errno),
                errno == EINVAL ? " (no O_DIRECT on this file system: tmpfs?)" : "");
        return 2;
    }
    if ((rc = io_uring_queue_init(depth, &ring, 0)) < 0) {
        fprintf(stderr, "disk_probe: io_uring: %s\n", strerror(-rc));
        unlink(path);
        return 2;
    }
    tw = run(&ring, fd, true, nw, wbs, wdepth, NULL, bufs);
    tr = tw < 0 ? -1 : run(&ring, fd, false, nr, rbs, rdepth, order, bufs);
    io_uring_queue_exit(&ring);
    close(fd);
    unlink(path);
    if (tw < 0 || tr < 0)
        return 1;
    printf("write_MBps=%.0f read_MBps=%.0f read_iops=%.0f bytes=%" PRIu64 " read_bs=%" PRIu64
           " read_depth=%u write_bs=%" PRIu64 " write_depth=%u\n",
           (double)(nw * wbs) / tw / 1e6, (double)(nr * rbs) / tr / 1e6, (double)nr / tr,
           nw * wbs, rbs, rdepth, wbs, wdepth);
    for (unsigned i = 0; i < depth; i++)
        free(bufs[i]);
    free(bufs);
    free(order);
    return 0;
}
