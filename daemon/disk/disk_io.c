/* The disk level's I/O engine: see disk_io.h. */
#include "disk_io.h"

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define POOL_THREADS_MAX 64
/* prep threads (io_uring) when the configuration leaves it to the cores */
#define PREP_THREADS_AUTO_MAX 8

enum { STAGE_BEFORE = 0, STAGE_AFTER = 1 };
/* A prep thread hands the requests it ended to the caller as soon as it
 * finds nothing more queued, or at this many (or bytes) while it goes on:
 * a done waits at most for a few small requests' work. */
#define DONE_BATCH 8u
#define DONE_BATCH_BYTES (1u << 20)

struct kvd__disk_io {
    int uring; /* the engine: io_uring, else the pool */
    unsigned depth;
    void (*notify)(void *arg);
    void *notify_arg;

    pthread_mutex_t mu;
    pthread_cond_t todo_cv; /* the pool: requests queued, or stop */
    pthread_cond_t done_cv; /* kvd__disk_io_wait */
    pthread_cond_t prep_cv; /* the prep threads: parts queued, or stop */
    kvd__disk_req_t *todo_head, *todo_tail;
    kvd__disk_req_t *done_head, *done_tail;
    kvd__disk_req_t *prep_head, *prep_tail;   /* parts of before or after to run */
    kvd__disk_req_t *ready_head, *ready_tail; /* prepared: for the ring */
    uint64_t pending; /* submitted, done not run yet (caller's thread) */
    int stop;

    /* io_uring */
    struct io_uring ring;
    int efd;
    pthread_t ring_thread;
    pthread_t prep[POOL_THREADS_MAX];
    unsigned nprep;
    /* the pool */
    pthread_t threads[POOL_THREADS_MAX];
    unsigned nthreads;
};

/* ---- aligned memory ------------------------------------------------------ */

void *kvd__disk_alloc_aligned(size_t bytes)
{
    void *p;

    if (bytes == 0)
        bytes = KVD_DISK_ALIGN;
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void kvd__disk_free_aligned(void *p, size_t bytes)
{
    if (p != NULL)
        munmap(p, bytes ? bytes : KVD_DISK_ALIGN);
}

/* ---- completions ------------------------------------------------------- */

/* Append the list first..last (linked through next, last's next NULL). */
static void list_append(kvd__disk_req_t **head, kvd__disk_req_t **tail, kvd__disk_req_t *first,
                        kvd__disk_req_t *last)
{
    if (*tail)
        (*tail)->next = first;
    else
        *head = first;
    *tail = last;
}

static void list_push(kvd__disk_req_t **head, kvd__disk_req_t **tail, kvd__disk_req_t *r)
{
    r->next = NULL;
    list_append(head, tail, r, r);
}

/* The parts a request's before and after work come in. */
static inline unsigned parts_of(const kvd__disk_req_t *r)
{
    return r->parts ? r->parts : 1;
}

/* Hand a list of finished requests to the caller's thread. */
static void finish_list(kvd__disk_io_t *io, kvd__disk_req_t *head, kvd__disk_req_t *tail)
{
    if (head == NULL)
        return;
    pthread_mutex_lock(&io->mu);
    list_append(&io->done_head, &io->done_tail, head, tail);
    pthread_cond_broadcast(&io->done_cv);
    pthread_mutex_unlock(&io->mu);
    if (io->notify)
        io->notify(io->notify_arg);
}

/* ---- the pool --------------------------------------------------------- */

/* The whole operation with pread/pwrite, short transfers continued. */
static void run_sync(kvd__disk_req_t *r)
{
    unsigned i, parts = parts_of(r);

    r->res = 0;
    if (r->before) {
        for (i = 0; i < parts; i++)
            r->before(r, i);
        if (r->res < 0)
            return;
    }
    if (r->op == KVD_DISK_OP_CALL)
        return;
    r->moved = 0;
    while (r->moved < r->len) {
        ssize_t n = r->op == KVD_DISK_OP_READ
                        ? pread(r->fd, (char *)r->buf + r->moved, r->len - r->moved,
                                (off_t)(r->off + r->moved))
                        : pwrite(r->fd, (char *)r->buf + r->moved, r->len - r->moved,
                                 (off_t)(r->off + r->moved));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r->res = -errno;
            return;
        }
        if (n == 0) { /* a read past the end: the file is shorter than it said */
            r->res = r->op == KVD_DISK_OP_READ ? -ENODATA : -EIO;
            return;
        }
        r->moved += (size_t)n;
    }
    r->res = (int64_t)r->len;
    if (r->after)
        for (i = 0; i < parts; i++)
            r->after(r, i);
}

/* The disk threads are named (top, ps -L, /proc/PID/task/TID/comm). */
#define THREAD_NAME "kvd-disk"

static void *pool_main(void *arg)
{
    kvd__disk_io_t *io = arg;

    (void)pthread_setname_np(pthread_self(), THREAD_NAME);

    for (;;) {
        kvd__disk_req_t *r;

        pthread_mutex_lock(&io->mu);
        while (io->todo_head == NULL && !io->stop)
            pthread_cond_wait(&io->todo_cv, &io->mu);
        r = io->todo_head;
        if (r == NULL) {
            pthread_mutex_unlock(&io->mu);
            return NULL;
        }
        io->todo_head = r->next;
        if (io->todo_head == NULL)
            io->todo_tail = NULL;
        pthread_mutex_unlock(&io->mu);
        r->next = NULL;
        run_sync(r);
        finish_list(io, r, r);
    }
}

/* ---- io_uring ------------------------------------------------------------ */

/* user_data of the eventfd's read: no request */
#define EFD_TAG 1ull

static void ring_wake(kvd__disk_io_t *io)
{
    uint64_t one = 1;

    (void)!write(io->efd, &one, sizeof(one));
}

/* The prep threads run requests' before and after work, part by part:
 * a request's parts are handed to whichever threads are free, in order,
 * and the thread that ends its last part sends it on: to the ring once
 * before has ended, to the caller once after has. */

/* Queue a list of requests (their stage set) for the prep threads. */
static void prep_queue(kvd__disk_io_t *io, kvd__disk_req_t *head, kvd__disk_req_t *tail)
{
    kvd__disk_req_t *r;
    uint64_t parts = 0;

    if (head == NULL)
        return;
    for (r = head; r != NULL; r = r->next) {
        r->part_next = 0;
        r->part_left = parts_of(r);
        parts += r->part_left;
    }
    pthread_mutex_lock(&io->mu);
    list_append(&io->prep_head, &io->prep_tail, head, tail);
    /* as many threads woken as there are parts to take */
    if (parts >= io->nprep)
        pthread_cond_broadcast(&io->prep_cv);
    else
        while (parts-- > 0)
            pthread_cond_signal(&io->prep_cv);
    pthread_mutex_unlock(&io->mu);
}

/* Every part of r's stage has ended: where it goes next.  1: to the
 * caller (the prep thread hands it over with others). */
static int prep_ended(kvd__disk_io_t *io, kvd__disk_req_t *r)
{
    r->next = NULL;
    if (r->stage == STAGE_BEFORE && r->res >= 0 && r->op != KVD_DISK_OP_CALL) {
        if (r->len > 0) { /* prepared: to the ring */
            pthread_mutex_lock(&io->mu);
            list_push(&io->ready_head, &io->ready_tail, r);
            pthread_mutex_unlock(&io->mu);
            ring_wake(io);
            return 0;
        }
        if (r->after) { /* nothing to move: after at once */
            r->stage = STAGE_AFTER;
            prep_queue(io, r, r);
            return 0;
        }
    }
    return 1;
}

static void *prep_main(void *arg)
{
    kvd__disk_io_t *io = arg;
    kvd__disk_req_t *done_head = NULL, *done_tail = NULL; /* ended, for the caller */
    unsigned ndone = 0;
    size_t done_bytes = 0;

    (void)pthread_setname_np(pthread_self(), THREAD_NAME);
    pthread_mutex_lock(&io->mu);
    for (;;) {
        kvd__disk_req_t *r = io->prep_head;
        unsigned part;
        int last;

        /* ended requests go to the caller together (one wake for several
         * small reads), at once when nothing more is queued */
        if (done_head != NULL &&
            (r == NULL || ndone >= DONE_BATCH || done_bytes >= DONE_BATCH_BYTES)) {
            pthread_mutex_unlock(&io->mu);
            finish_list(io, done_head, done_tail);
            done_head = done_tail = NULL;
            ndone = 0;
            done_bytes = 0;
            pthread_mutex_lock(&io->mu);
            continue;
        }
        if (r == NULL) {
            if (io->stop)
                break;
            pthread_cond_wait(&io->prep_cv, &io->mu);
            continue;
        }
        part = r->part_next++;
        if (r->part_next == parts_of(r)) { /* its last part handed out */
            io->prep_head = r->next;
            if (io->prep_head == NULL)
                io->prep_tail = NULL;
        }
        pthread_mutex_unlock(&io->mu);
        if (r->stage == STAGE_BEFORE)
            r->before(r, part);
        else
            r->after(r, part);
        pthread_mutex_lock(&io->mu);
        last = --r->part_left == 0;
        if (last) {
            pthread_mutex_unlock(&io->mu);
            if (prep_ended(io, r)) {
                list_push(&done_head, &done_tail, r);
                ndone++;
                done_bytes += r->len;
            }
            pthread_mutex_lock(&io->mu);
        }
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

static void prep(struct io_uring_sqe *sqe, kvd__disk_req_t *r)
{
    char *p = (char *)r->buf + r->moved;
    unsigned n = (unsigned)(r->len - r->moved > (1u << 30) ? (1u << 30) : r->len - r->moved);

    if (r->op == KVD_DISK_OP_READ)
        io_uring_prep_read(sqe, r->fd, p, n, r->off + r->moved);
    else
        io_uring_prep_write(sqe, r->fd, p, n, r->off + r->moved);
    io_uring_sqe_set_data(sqe, r);
}

/* Hand waiting requests to the ring while it has room; how many went. */
static unsigned ring_fill(kvd__disk_io_t *io, kvd__disk_req_t **wait_head,
                          kvd__disk_req_t **wait_tail, unsigned inflight)
{
    unsigned n = 0;

    while (*wait_head && inflight + n < io->depth) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
        kvd__disk_req_t *r;

        if (sqe == NULL)
            break;
        r = *wait_head;
        *wait_head = r->next;
        if (*wait_head == NULL)
            *wait_tail = NULL;
        prep(sqe, r);
        n++;
    }
    return n;
}

/* The ring's thread: it submits and reaps, and does no CPU work on the
 * blocks (that would leave the drive idle while one thread works through
 * a queue of it).  A request with work before its operation goes to the
 * prep threads first and comes back prepared (the ready list, with a
 * wake on the eventfd); a completed one with work after goes to them
 * again, and they hand it to the caller. */
static void *ring_main(void *arg)
{
    kvd__disk_io_t *io = arg;
    kvd__disk_req_t *wait_head = NULL, *wait_tail = NULL; /* no room in the ring yet */
    unsigned inflight = 0;
    int armed = 0, stopping = 0;
    uint64_t efd_val;

    (void)pthread_setname_np(pthread_self(), THREAD_NAME);

    for (;;) {
        kvd__disk_req_t *take, *r;
        kvd__disk_req_t *prep_head = NULL, *prep_tail = NULL, *done_head = NULL, *done_tail = NULL;
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0, n;

        pthread_mutex_lock(&io->mu);
        take = io->todo_head;
        io->todo_head = io->todo_tail = NULL;
        if (io->ready_head != NULL) /* prepared: after those waiting */
            list_append(&wait_head, &wait_tail, io->ready_head, io->ready_tail);
        io->ready_head = io->ready_tail = NULL;
        stopping = io->stop;
        pthread_mutex_unlock(&io->mu);
        while (take) {
            r = take;
            take = r->next;
            r->res = 0;
            r->moved = 0;
            if (r->before) {
                r->stage = STAGE_BEFORE;
                list_push(&prep_head, &prep_tail, r);
            } else if (r->op != KVD_DISK_OP_CALL && r->len > 0) {
                list_push(&wait_head, &wait_tail, r);
            } else if (r->op != KVD_DISK_OP_CALL && r->after) {
                r->stage = STAGE_AFTER;
                list_push(&prep_head, &prep_tail, r);
            } else {
                list_push(&done_head, &done_tail, r);
            }
        }
        prep_queue(io, prep_head, prep_tail);
        inflight += ring_fill(io, &wait_head, &wait_tail, inflight);
        if (!armed && !stopping) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
            if (sqe) {
                io_uring_prep_read(sqe, io->efd, &efd_val, sizeof(efd_val), 0);
                io_uring_sqe_set_data64(sqe, EFD_TAG);
                armed = 1;
            }
        }
        finish_list(io, done_head, done_tail);
        if (stopping && !armed && inflight == 0 && wait_head == NULL)
            return NULL;
        if (io_uring_submit_and_wait(&io->ring, 1) < 0 && errno != EINTR) {
            /* the ring is unusable: nothing more to do than wait */
        }
        prep_head = prep_tail = done_head = done_tail = NULL;
        io_uring_for_each_cqe(&io->ring, head, cqe)
        {
            seen++;
            if (io_uring_cqe_get_data64(cqe) == EFD_TAG) {
                armed = 0;
                continue;
            }
            r = io_uring_cqe_get_data(cqe);
            inflight--;
            if (cqe->res < 0 || (cqe->res == 0 && r->moved < r->len)) {
                r->res = cqe->res < 0 ? cqe->res : (r->op == KVD_DISK_OP_READ ? -ENODATA : -EIO);
                if (r->res == -EINTR || r->res == -EAGAIN) { /* try again */
                    r->res = 0;
                    list_push(&wait_head, &wait_tail, r);
                    continue;
                }
                list_push(&done_head, &done_tail, r);
                continue;
            }
            r->moved += (size_t)cqe->res;
            if (r->moved < r->len) { /* a short transfer: the rest */
                list_push(&wait_head, &wait_tail, r);
                continue;
            }
            r->res = (int64_t)r->len;
            if (r->after) {
                r->stage = STAGE_AFTER;
                list_push(&prep_head, &prep_tail, r);
            } else {
                list_push(&done_head, &done_tail, r);
            }
        }
        io_uring_cq_advance(&io->ring, seen);
        if ((n = ring_fill(io, &wait_head, &wait_tail, inflight)) > 0) {
            inflight += n;
            (void)io_uring_submit(&io->ring);
        }
        prep_queue(io, prep_head, prep_tail);
        finish_list(io, done_head, done_tail);
        /* a stop: wake the eventfd read so that it ends */
    }
}

/* ---- the interface ---------------------------------------------------- */

/* The cores this process may run on, at most PREP_THREADS_AUTO_MAX. */
static unsigned cores_available(void)
{
    cpu_set_t set;
    long n;

    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        n = CPU_COUNT(&set);
    else
        n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n > PREP_THREADS_AUTO_MAX ? PREP_THREADS_AUTO_MAX : (unsigned)n;
}

kvd_status_t kvd__disk_io_create(kvd__disk_io_t **out, const kvd__disk_io_config_t *cfg, char *why,
                                 size_t why_len)
{
    kvd__disk_io_t *io = calloc(1, sizeof(*io));
    unsigned i;
    int rc;

    *out = NULL;
    if (why_len)
        why[0] = 0;
    if (io == NULL) {
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    io->depth = cfg->queue_depth ? cfg->queue_depth : 32;
    if (io->depth > 4096)
        io->depth = 4096;
    io->notify = cfg->notify;
    io->notify_arg = cfg->notify_arg;
    io->efd = -1;
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->todo_cv, NULL);
    pthread_cond_init(&io->done_cv, NULL);
    pthread_cond_init(&io->prep_cv, NULL);
    if (!cfg->force_threads) {
        io->efd = eventfd(0, EFD_CLOEXEC);
        rc = io->efd < 0 ? -errno : io_uring_queue_init(io->depth + 1, &io->ring, 0);
        if (rc == 0 && (rc = pthread_create(&io->ring_thread, NULL, ring_main, io)) != 0) {
            io_uring_queue_exit(&io->ring);
            rc = -rc;
        }
        if (rc == 0) {
            unsigned want = cfg->prep_threads ? cfg->prep_threads : cores_available();
            io->uring = 1;
            if (want > POOL_THREADS_MAX)
                want = POOL_THREADS_MAX;
            for (i = 0; i < want; i++) {
                if ((rc = pthread_create(&io->prep[i], NULL, prep_main, io)) != 0) {
                    kvd__disk_io_destroy(&io);
                    snprintf(why, why_len, "cannot start the disk prep threads: %s",
                             strerror(rc));
                    return KVD_ENOMEM;
                }
                io->nprep++;
            }
            *out = io;
            return KVD_OK;
        }
        snprintf(why, why_len, "io_uring unavailable (%s): a thread pool with pread/pwrite",
                 strerror(-rc));
        if (io->efd >= 0)
            close(io->efd);
        io->efd = -1;
    }
    io->nthreads = cfg->threads ? cfg->threads : 4;
    if (io->nthreads > POOL_THREADS_MAX)
        io->nthreads = POOL_THREADS_MAX;
    for (i = 0; i < io->nthreads; i++) {
        if ((rc = pthread_create(&io->threads[i], NULL, pool_main, io)) != 0) {
            io->nthreads = i;
            kvd__disk_io_destroy(&io);
            snprintf(why, why_len, "cannot start the disk I/O threads: %s", strerror(rc));
            return KVD_ENOMEM;
        }
    }
    *out = io;
    return KVD_OK;
}

void kvd__disk_io_submit(kvd__disk_io_t *io, kvd__disk_req_t *r)
{
    r->res = 0;
    r->moved = 0;
    pthread_mutex_lock(&io->mu);
    io->pending++;
    list_push(&io->todo_head, &io->todo_tail, r);
    if (!io->uring)
        pthread_cond_signal(&io->todo_cv);
    pthread_mutex_unlock(&io->mu);
    if (io->uring)
        ring_wake(io);
}

unsigned kvd__disk_io_poll(kvd__disk_io_t *io)
{
    kvd__disk_req_t *r;
    unsigned n = 0;

    pthread_mutex_lock(&io->mu);
    r = io->done_head;
    io->done_head = io->done_tail = NULL;
    pthread_mutex_unlock(&io->mu);
    while (r) {
        kvd__disk_req_t *next = r->next;
        pthread_mutex_lock(&io->mu);
        io->pending--;
        pthread_mutex_unlock(&io->mu);
        if (r->done)
            r->done(r); /* may free r, may submit more */
        r = next;
        n++;
    }
    return n;
}

unsigned kvd__disk_io_wait(kvd__disk_io_t *io, int timeout_ms)
{
    struct timespec until;

    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_ms >= 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&io->mu);
    while (io->done_head == NULL && io->pending > 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&io->done_cv, &io->mu);
        else if (pthread_cond_timedwait(&io->done_cv, &io->mu, &until) != 0)
            break;
    }
    pthread_mutex_unlock(&io->mu);
    return kvd__disk_io_poll(io);
}

uint64_t kvd__disk_io_pending(const kvd__disk_io_t *io)
{
    uint64_t n;

    pthread_mutex_lock((pthread_mutex_t *)&io->mu);
    n = io->pending;
    pthread_mutex_unlock((pthread_mutex_t *)&io->mu);
    return n;
}

void kvd__disk_io_destroy(kvd__disk_io_t **iop)
{
    kvd__disk_io_t *io = *iop;
    unsigned i;

    if (io == NULL)
        return;
    *iop = NULL;
    while (kvd__disk_io_pending(io) > 0)
        kvd__disk_io_wait(io, -1);
    pthread_mutex_lock(&io->mu);
    io->stop = 1;
    pthread_cond_broadcast(&io->todo_cv);
    pthread_cond_broadcast(&io->prep_cv);
    pthread_mutex_unlock(&io->mu);
    if (io->uring) {
        ring_wake(io); /* ends the armed read */
        pthread_join(io->ring_thread, NULL);
        for (i = 0; i < io->nprep; i++)
            pthread_join(io->prep[i], NULL);
        io_uring_queue_exit(&io->ring);
        close(io->efd);
    }
    for (i = 0; i < io->nthreads; i++)
        pthread_join(io->threads[i], NULL);
    pthread_mutex_destroy(&io->mu);
    pthread_cond_destroy(&io->todo_cv);
    pthread_cond_destroy(&io->done_cv);
    pthread_cond_destroy(&io->prep_cv);
    free(io);
}

const char *kvd__disk_io_engine(const kvd__disk_io_t *io)
{
    return io->uring ? "io_uring" : "threads";
}

unsigned kvd__disk_io_depth(const kvd__disk_io_t *io)
{
    return io->uring ? io->depth : io->nthreads;
}

unsigned kvd__disk_io_cpu_threads(const kvd__disk_io_t *io)
{
    return io->uring ? io->nprep : io->nthreads;
}
