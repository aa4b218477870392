/*
 * The backend: where pools live and how operations run.  Two
 * implementations behind one table of functions:
 *
 * - cpu  (backend_cpu.c): host pools as sealed memfds, the reference
 *   kernels (kvd_cpu_*) on one worker thread per stream class;
 * - cuda (backend_cuda.c): device pools (cudaMalloc, or cuMemCreate
 *   exported as a POSIX fd), pinned host pools, the CUDA kernels on one
 *   stream per class.
 *
 * Every function is called on the loop thread.  A job's completion comes
 * back on the loop thread too: the backend calls job->done(job) from its
 * uv_async_t (cuda with --cuda-completion loop: from its uv_idle_t).  If
 * submit returns an error, done never runs.
 */
#ifndef KVD_DAEMON_BACKEND_H
#define KVD_DAEMON_BACKEND_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "kvdock/kernels.h"
#include "hostmem.h"
#include "kvdock/status.h"
#include "kvdock/types.h"
#include "op_list.h"
#include "options.h"

/* One region of memory the daemon can address: allocated by it (exportable)
 * or imported from a client. */
typedef struct kvd__mem {
    int kind;        /* kvd_mem_kind_t */
    void *ptr;       /* the daemon's address (device or host, unified) */
    uint64_t bytes;  /* usable bytes from ptr */
    uint64_t map_bytes; /* bytes a client maps from fd (page-rounded) */
    int fd;          /* memfd or VMM fd to export, -1 if none */
    int has_ipc;
    unsigned char ipc[KVD_IPC_HANDLE_BYTES]; /* cudaIpcMemHandle_t */
    void *priv;      /* the backend's */
} kvd__mem_t;

typedef enum kvd__job_kind {
#define KVD_JOB_KIND_(K, member, args_t, fn) KVD_JOB_##K,
    KVD_JOBS(KVD_JOB_KIND_)
#undef KVD_JOB_KIND_
} kvd__job_kind_t;

typedef struct kvd__job kvd__job_t;
typedef struct kvd__backend kvd__backend_t;
struct kvd__job {
    kvd__job_kind_t kind;
    union {
#define KVD_JOB_ARGS_(K, member, args_t, fn) args_t member;
        KVD_JOBS(KVD_JOB_ARGS_)
#undef KVD_JOB_ARGS_
    } a;
    int sclass;          /* enum kvd_stream_class */
    uint32_t max_blocks; /* 0: the class's budget */
    uint32_t flags;      /* KVD_LAUNCH_* */
    void *wait_event;    /* backend event (kvd_backend_ops.event_open), or NULL */
    void *layer_event;   /* recorded after the work, before record_event: the
                          * event of a layer group (cache loads), or NULL */
    uint32_t *layer_flag; /* written flag_value after the work (before the
                           * events): a layer group's flag (cache loads), in
                           * host or device memory, or NULL */
    uint32_t flag_value;
    void *record_event;
    /* the job before this one of the same request (same stream class), or
     * NULL: this one starts once that one's work is done */
    kvd__job_t *after;
    void *owner;         /* the submitter's */
    /* Set by submit when another thread enqueues the job's device work
     * (and records its events) later: the backend then calls issued(job),
     * if set, on the loop thread once it has, before done(job).  Until then
     * a reply at enqueue would let the client wait on an event not yet
     * recorded, which CUDA treats as already complete. */
    int issue_later;
    void (*issued)(kvd__job_t *job);
    kvd__job_t *issued_next; /* the backend's */
    /* filled by the backend */
    kvd_status_t status;
    unsigned long long skipped_oob;
    char detail[160];
    /* the submitter's */
    void (*done)(kvd__job_t *job);
    /* the backend's */
    kvd__backend_t *be;
    kvd__job_t *next;
    unsigned long long *oob; /* device-accessible counter */
    uint32_t oob_slot;
    void *done_event; /* cuda: recorded after the work, polled for completion */
    void *ce_group;   /* cuda: its copy-engine parts while they run */
};

struct kvd__backend {
    const char *name;     /* "cpu" or "cuda" */
    int proto_backend;    /* Kvdock__Backend */
    char device_name[128];
    int device_ordinal;   /* -1 on cpu */
    int priority[KVD_STREAM_END]; /* stream priority used (CUDA numbers on cuda) */
    uint32_t blocks[KVD_STREAM_END];
    /* Bytes a MEM_DEVICE_VMM allocation rounds up to (what it holds); 0
     * where there are no VMM pools. */
    uint64_t vmm_granularity;
    /* The host-memory budget (set by the server before any request):
     * staging is counted there. */
    kvd__hostmem_t *hostmem;

    /* Free and total device memory; NULL where there is no device. */
    kvd_status_t (*device_memory)(kvd__backend_t *be, uint64_t *free_bytes, uint64_t *total_bytes);
    /* Device kinds are refused (ENOMEM) when they would leave the device
     * less free memory than --device-memory-margin.  KVD_MEM_HOST may be
     * created on another thread than the loop's (a cache's next slab). */
    kvd_status_t (*mem_create)(kvd__backend_t *be, int kind, uint64_t bytes, const char *label,
                               kvd__mem_t **out, char *why, size_t why_len);
    /* Import a client's region: ipc (MEM_DEVICE) or fd (MEM_HOST,
     * MEM_DEVICE_VMM; the backend dups what it keeps, the caller closes fd). */
    kvd_status_t (*mem_import)(kvd__backend_t *be, int kind, const unsigned char *ipc,
                               size_t ipc_len, int fd, uint64_t bytes, kvd__mem_t **out, char *why,
                               size_t why_len);
    void (*mem_destroy)(kvd__backend_t *be, kvd__mem_t **mem);
    /* n uint64 values copied to memory the kernels can read (device tables). */
    kvd_status_t (*table_create)(kvd__backend_t *be, const uint64_t *vals, size_t n, void **out);
    void (*table_destroy)(kvd__backend_t *be, void *table);
    /* Operand staging the kernels can read (pinned on cuda), counted as
     * staging in the host-memory budget: KVD_OK, or the budget's refusal
     * (ELIMIT, ENOMEM) with why set. */
    kvd_status_t (*staging_alloc)(kvd__backend_t *be, size_t bytes, void **out, char *why,
                                  size_t why_len);
    void (*staging_free)(kvd__backend_t *be, void *p, size_t bytes);

    kvd_status_t (*event_open)(kvd__backend_t *be, const unsigned char *handle, size_t len,
                               void **ev, char *why, size_t why_len);
    void (*event_close)(kvd__backend_t *be, void *ev);

    /* Queue a job on its class's stream.  KVD_OK: job->done will run (on
     * the loop thread) once the job has completed. */
    kvd_status_t (*submit)(kvd__backend_t *be, kvd__job_t *job);
    /* Complete every job that has not started with KVD_ESHUTDOWN. */
    void (*cancel_pending)(kvd__backend_t *be);
    /* Jobs submitted and not yet handed back through done. */
    uint32_t (*pending)(kvd__backend_t *be);
    /* Stops the workers (the caller has waited for pending() == 0), closes
     * the uv handles; cb runs once they are closed and the backend freed. */
    void (*destroy)(kvd__backend_t *be, void (*cb)(void *arg), void *arg);
    /* Ready a thread other than the loop's to make requests of it (an I/O
     * thread: the device current); NULL where nothing is needed. */
    void (*bind_thread)(kvd__backend_t *be);
};

kvd_status_t kvd__backend_cpu_create(uv_loop_t *loop, const kvd__options_t *opts,
                                     kvd__backend_t **out, char *why, size_t why_len);
/* KVD_ENOTSUP when built without CUDA. */
kvd_status_t kvd__backend_cuda_create(uv_loop_t *loop, const kvd__options_t *opts,
                                      kvd__backend_t **out, char *why, size_t why_len);

/* Shared by both: a sealed memfd of bytes, mapped; KVD_ENOMEM when the
 * pages cannot be reserved. */
kvd_status_t kvd__memfd_create(const char *label, uint64_t bytes, int *fd, void **ptr,
                               uint64_t *map_bytes, char *why, size_t why_len);
/* Map a client's memfd: it must be sealed against shrinking and hold at
 * least bytes. */
kvd_status_t kvd__memfd_map(int fd, uint64_t bytes, void **ptr, uint64_t *map_bytes, char *why,
                            size_t why_len);

/* How many of transfer a's pairs from pair `from` on make at most max_runs
 * runs, whole runs only (at least one pair while any is left): pairs
 * consecutive on both sides form one run where each side's rows lie packed
 * (slot stride the row); otherwise each pair is a run.  The indices must
 * be host-readable. */
int64_t kvd__rows_of_runs(const kvd_transfer_args_t *a, int64_t from, int64_t max_runs);
/* How many runs transfer a's pairs make (as kvd__rows_of_runs counts). */
int64_t kvd__transfer_runs(const kvd_transfer_args_t *a);

/* Run job's kernel (cuda: on launch's stream; else the CPU reference),
 * adding the indices it skipped as out of range to *oob. */
kvd_status_t kvd__job_run(kvd__job_t *job, int cuda, unsigned long long *oob,
                          const kvd_launch_t *launch);

/* Append job to the list head/tail (no lock: the caller holds the list's). */
static inline void kvd__jobs_append(kvd__job_t **head, kvd__job_t **tail, kvd__job_t *job)
{
    job->next = NULL;
    if (*tail)
        (*tail)->next = job;
    else
        *head = job;
    *tail = job;
}

/* Shared by both: finished jobs on their way from the threads that finish
 * them (workers, CUDA callbacks, the poller) to the loop thread, in
 * order.  The backend wakes the loop (uv_async_send) after a push. */
typedef struct kvd__done_list {
    pthread_mutex_t mu;
    kvd__job_t *head, *tail;
    kvd__job_t *issued_head, *issued_tail; /* jobs issued off the loop thread */
} kvd__done_list_t;

void kvd__done_init(kvd__done_list_t *dl);
void kvd__done_destroy(kvd__done_list_t *dl);
void kvd__done_push(kvd__done_list_t *dl, kvd__job_t *job);
/* A job whose work another thread has just enqueued (issue_later). */
void kvd__issued_push(kvd__done_list_t *dl, kvd__job_t *job);
/* Everything pushed so far, oldest first: the finished jobs linked
 * through job->next, and (*issued) those issued, through issued_next.
 * Taken together, so that a job's issue is always seen before its end. */
kvd__job_t *kvd__done_take(kvd__done_list_t *dl, kvd__job_t **issued);

#endif
