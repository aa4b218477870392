/*
 * The disk level's I/O engine: reads and writes at file offsets, run off
 * the caller's thread, completed back on it.
 *
 * Two engines behind one interface:
 *   - io_uring: one thread owns a ring of queue_depth entries, keeps up to
 *     queue_depth operations in flight and waits on their completions and
 *     on an eventfd that says new requests are queued;
 *   - threads: a pool of threads, each doing pread/pwrite, used where
 *     io_uring is unavailable (a sandbox's seccomp, an old kernel) or when
 *     asked for.
 * A request may carry work before its operation (fill a write buffer,
 * compute a checksum) and after it (check one), in one or more parts:
 * CPU work on blocks never runs on the caller's thread, which is the
 * daemon's event loop, nor on the ring's thread, which only submits and
 * reaps.  Under io_uring a small fixed pool of prep threads runs it (one
 * per core available, at most 8, or as configured): a request's parts run
 * at once on as many threads, and its operation goes to the ring once all
 * of them have ended; its done is queued once all parts of after have.
 * KVD_DISK_OP_CALL runs only that work (fallocate, unlink, an index
 * file): any syscall that may wait on the disk goes through here.
 * Requests run in any order, and calls may run at once (as in the pool).
 *
 * The caller's thread submits (kvd__disk_io_submit never blocks on the
 * disk) and runs the done callbacks from kvd__disk_io_poll; notify, called
 * from an I/O thread after completions are queued, tells it to poll (the
 * daemon sends a uv_async_t).
 */
#ifndef KVD_DAEMON_DISK_IO_H
#define KVD_DAEMON_DISK_IO_H

#include <stddef.h>
#include <stdint.h>

#include "kvdock/status.h"

typedef struct kvd__disk_io kvd__disk_io_t;
typedef struct kvd__disk_req kvd__disk_req_t;

enum kvd__disk_op {
    KVD_DISK_OP_READ = 0,
    KVD_DISK_OP_WRITE = 1,
    KVD_DISK_OP_CALL = 2, /* before() only */
};

struct kvd__disk_req {
    int op;
    int fd;
    uint64_t off;
    void *buf;
    size_t len;
    /* On an I/O thread, before the operation, once per part: may set buf
     * and len, or fail the request by setting res < 0 (then no operation,
     * no after), only where the request has one part. */
    void (*before)(kvd__disk_req_t *r, unsigned part);
    /* On an I/O thread, after a whole read or write (res == len), once per
     * part. */
    void (*after)(kvd__disk_req_t *r, unsigned part);
    /* Parts of before and after (0: one), numbered 0 .. parts-1, that may
     * run at once on different threads: each touches only its own part of
     * the request's memory. */
    unsigned parts;
    /* On the caller's thread, from kvd__disk_io_poll. */
    void (*done)(kvd__disk_req_t *r);
    void *arg;
    int64_t res; /* the bytes moved (all of len), or -errno */
    /* the engine's */
    size_t moved;
    unsigned part_next, part_left; /* parts handed out, parts not ended */
    int stage;                     /* before or after */
    kvd__disk_req_t *next;
};

typedef struct kvd__disk_io_config {
    unsigned queue_depth;   /* operations in flight (io_uring); 0: 32 */
    unsigned threads;       /* the pool's threads; 0: 4 */
    unsigned prep_threads;  /* io_uring: threads for before and after work;
                             * 0: one per core available, at most 8 */
    int force_threads;      /* the pool even where io_uring works */
    void (*notify)(void *arg); /* completions are queued (any thread) */
    void *notify_arg;
} kvd__disk_io_config_t;

/* KVD_OK, or the status with why (threads or memory refused).  Where
 * io_uring cannot be set up the pool runs instead and why says so (the
 * caller logs it); kvd__disk_io_engine names the engine. */
kvd_status_t kvd__disk_io_create(kvd__disk_io_t **out, const kvd__disk_io_config_t *cfg,
                                 char *why, size_t why_len);
/* Waits for every submitted request to finish and runs their done
 * callbacks; then frees.  NULL is fine. */
void kvd__disk_io_destroy(kvd__disk_io_t **io);

/* Queue r; its done runs later from kvd__disk_io_poll, always. */
void kvd__disk_io_submit(kvd__disk_io_t *io, kvd__disk_req_t *r);
/* Run the done callbacks of the requests finished so far; how many. */
unsigned kvd__disk_io_poll(kvd__disk_io_t *io);
/* Block until a request has finished (or timeout_ms passed; -1: no
 * limit), then poll: for tests and shutdown, never the event loop. */
unsigned kvd__disk_io_wait(kvd__disk_io_t *io, int timeout_ms);
/* Requests submitted whose done has not run yet. */
uint64_t kvd__disk_io_pending(const kvd__disk_io_t *io);

/* "io_uring" or "threads". */
const char *kvd__disk_io_engine(const kvd__disk_io_t *io);
unsigned kvd__disk_io_depth(const kvd__disk_io_t *io);
/* The threads that run requests' before and after work (io_uring: the
 * prep threads; the pool: its threads). */
unsigned kvd__disk_io_cpu_threads(const kvd__disk_io_t *io);

/* Memory aligned for direct I/O (KVD_DISK_ALIGN), zeroed; freed with
 * kvd__disk_free_aligned. */
#define KVD_DISK_ALIGN 4096u
void *kvd__disk_alloc_aligned(size_t bytes);
void kvd__disk_free_aligned(void *p, size_t bytes);

#endif
