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
 * A request may carry work for the I/O thread before its operation (fill
 * a write buffer, compute a checksum) and after it (check one): CPU work
 * on blocks never runs on the caller's thread, which is the daemon's event
 * loop.  KVD_DISK_OP_CALL runs only that work (fallocate, unlink, an index
 * file): any syscall that may wait on the disk goes through here.
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
    /* On an I/O thread, before the operation: may set buf and len, or
     * fail the request by setting res < 0 (then no operation, no after). */
    void (*before)(kvd__disk_req_t *r);
    /* On an I/O thread, after a whole read or write (res == len). */
    void (*after)(kvd__disk_req_t *r);
    /* On the caller's thread, from kvd__disk_io_poll. */
    void (*done)(kvd__disk_req_t *r);
    void *arg;
    int64_t res; /* the bytes moved (all of len), or -errno */
    /* the engine's */
    size_t moved;
    kvd__disk_req_t *next;
};

typedef struct kvd__disk_io_config {
    unsigned queue_depth;   /* operations in flight (io_uring); 0: 32 */
    unsigned threads;       /* the pool's threads; 0: 4 */
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

/* Memory aligned for direct I/O (KVD_DISK_ALIGN), zeroed; freed with
 * kvd__disk_free_aligned. */
#define KVD_DISK_ALIGN 4096u
void *kvd__disk_alloc_aligned(size_t bytes);
void kvd__disk_free_aligned(void *p, size_t bytes);

#endif
