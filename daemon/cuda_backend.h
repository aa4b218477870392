/*
 * The cuda backend's parts (backend_cuda.c): its state, shared by
 * cuda_mem.c (pools, imports, layer tables, staging, events) and
 * cuda_work.c (submission, and completion in its three modes).  Internal
 * to the daemon.
 */
#ifndef KVD_DAEMON_CUDA_BACKEND_H
#define KVD_DAEMON_CUDA_BACKEND_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>

#include "backend.h"

#define DRIVER_API_VERSION 12000
#define OOB_SLOTS 65536
#define STAGING_BINS 19 /* 256 B .. 64 MiB */
#define STAGING_MIN_SHIFT 8
#define STAGING_SLAB_BINS 13 /* bins up to 1 MiB are carved out of slabs */
#define STAGING_SLAB_MIN (64u << 10) /* a slab: 64 blocks, within these bounds */
#define STAGING_SLAB_MAX (4u << 20)
/* Larger blocks are cached up to this many bytes in all: cudaFreeHost
 * synchronizes the device, which the loop must not wait for. */
#define STAGING_KEEP_BYTES (1ull << 30)

typedef CUresult (*pfn_mem_create_t)(CUmemGenericAllocationHandle *, size_t,
                                     const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*pfn_mem_release_t)(CUmemGenericAllocationHandle);
typedef CUresult (*pfn_addr_reserve_t)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                                       unsigned long long);
typedef CUresult (*pfn_addr_free_t)(CUdeviceptr, size_t);
typedef CUresult (*pfn_mem_map_t)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                  unsigned long long);
typedef CUresult (*pfn_mem_unmap_t)(CUdeviceptr, size_t);
typedef CUresult (*pfn_set_access_t)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*pfn_export_t)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                                 unsigned long long);
typedef CUresult (*pfn_import_t)(CUmemGenericAllocationHandle *, void *,
                                 CUmemAllocationHandleType);
typedef CUresult (*pfn_granularity_t)(size_t *, const CUmemAllocationProp *,
                                      CUmemAllocationGranularity_flags);
typedef CUresult (*pfn_addr_range_t)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*pfn_write_value32_t)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*pfn_wait_value32_t)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

typedef struct driver_api {
    pfn_mem_create_t mem_create;
    pfn_mem_release_t mem_release;
    pfn_addr_reserve_t addr_reserve;
    pfn_addr_free_t addr_free;
    pfn_mem_map_t mem_map;
    pfn_mem_unmap_t mem_unmap;
    pfn_set_access_t set_access;
    pfn_export_t export_handle;
    pfn_import_t import_handle;
    pfn_granularity_t granularity;
    pfn_addr_range_t addr_range;
    pfn_write_value32_t write_value32; /* cache loads' layer flags */
    pfn_wait_value32_t wait_value32;   /* copy workers' gates (cuda_copy.c) */
    int vmm; /* every VMM entry point was found */
} driver_api_t;

/* A legacy IPC handle opened by this daemon. */
typedef struct ipc_open {
    unsigned char handle[KVD_IPC_HANDLE_BYTES];
    void *ptr;
    uint64_t size;
    uint32_t refs;
    struct ipc_open *next;
} ipc_open_t;

/* What a kvd__mem_t holds on this backend. */
typedef struct cuda_mem {
    int how; /* see enum below */
    CUmemGenericAllocationHandle vmm;
    uint64_t vmm_size;
    ipc_open_t *ipc;
} cuda_mem_t;

enum { HOW_MALLOC = 1, HOW_VMM, HOW_HOST, HOW_IPC_OPEN };

typedef struct staging_block {
    struct staging_block *next;
} staging_block_t;

/* A pinned allocation that small staging blocks are carved from; kept
 * until the backend goes (so a busy daemon pins its peak, no more). */
typedef struct staging_slab {
    struct staging_slab *next;
    void *mem;
    size_t bytes;
} staging_slab_t;

typedef struct job_fifo {
    kvd__job_t *head, *tail;
} job_fifo_t;

static inline void fifo_push(job_fifo_t *q, kvd__job_t *job)
{
    kvd__jobs_append(&q->head, &q->tail, job);
}

/* The head, which the caller has checked is there. */
static inline kvd__job_t *fifo_pop(job_fifo_t *q)
{
    kvd__job_t *job = q->head;

    q->head = job->next;
    if (q->head == NULL)
        q->tail = NULL;
    return job;
}

typedef struct cuda_backend {
    kvd__backend_t be;
    int dev;
    uint64_t device_margin; /* device memory device pools leave free */
    /* completion by polling: jobs in flight per stream, in launch order,
     * queried by the poller thread (poll) or by the loop itself (loop) */
    int use_poll;
    int loop_poll;
    uv_idle_t idle; /* loop mode: active while jobs are in flight */
    pthread_t poller;
    int poller_started;
    pthread_mutex_t poll_mu;
    pthread_cond_t poll_cv;
    job_fifo_t inflight[KVD_STREAM_END];
    int unrecorded[KVD_STREAM_END]; /* loop: jobs launched since the last event */
    uint32_t n_inflight; /* under poll_mu */
    int poll_stop;
    cudaEvent_t *ev_free; /* loop thread only */
    uint32_t ev_nfree;
    uv_async_t async;
    kvd__done_list_t done;
    cudaStream_t streams[KVD_STREAM_END];
    uint32_t pending;
    driver_api_t drv;
    unsigned long long *oob; /* pinned, mapped: OOB_SLOTS counters */
    uint32_t *oob_free;
    uint32_t oob_nfree;
    ipc_open_t *ipc_opened;
    staging_block_t *bins[STAGING_BINS];
    staging_slab_t *slabs;
    uint64_t staging_cached; /* bytes of larger blocks in the bins */
    /* copy-engine workers (cuda_copy.c): per stream class, threads with
     * streams of their own that issue the copy descriptors off the loop */
    struct ce_worker *ce[KVD_STREAM_END];
    int ce_threads;          /* --copy-threads; 0: on the loop */
    int ce_n[KVD_STREAM_END]; /* workers per class (cuda_copy.c, class_threads) */
    int ce_next[KVD_STREAM_END]; /* round robin over a class's workers */
    int ce_cancel;           /* cancel_pending: parts not yet issued are skipped */
    int ce_h2d_each;         /* small host-to-device runs one call each (--copy-issue) */
    pthread_mutex_t ce_mu;   /* the workers' queues, the event free list */
    cudaEvent_t *ce_events;  /* free events for the parts (under ce_mu) */
    uint32_t ce_nevents, ce_cap;
    void (*destroy_cb)(void *arg);
    void *destroy_arg;
} cuda_backend_t;

/* Map a CUDA error to KVD_ECUDA (KVD_ENOMEM for an allocation) with where
 * it happened; clears the sticky error of the runtime's last-error slot. */
kvd_status_t kvd__cuda_fail(cudaError_t e, const char *what, char *why, size_t why_len);

/* cuda_mem.c: the driver API's entry points (VMM, address ranges); the
 * properties of a VMM allocation on this device and its granularity; the
 * memory functions of the backend's table; pinned staging given back at
 * teardown. */
void kvd__cuda_load_driver(driver_api_t *d);
kvd_status_t kvd__cuda_vmm_prop(cuda_backend_t *cb, CUmemAllocationProp *prop, uint64_t *gran,
                                char *why, size_t why_len);
void kvd__cuda_mem_ops(kvd__backend_t *be);
void kvd__cuda_staging_release(cuda_backend_t *cb);

/* cuda_copy.c: a copy-engine transfer split over the class's workers by
 * rows (KVD_OK: it completes through the done list); starting and stopping
 * the workers. */
kvd_status_t kvd__cuda_copy_submit(cuda_backend_t *cb, kvd__job_t *job);
void kvd__cuda_copy_stop(cuda_backend_t *cb);
/* The launch flags a copy-engine transfer adds to its job's: one call a
 * run for small host-to-device runs under --copy-issue each. */
uint32_t kvd__cuda_copy_flags(const cuda_backend_t *cb, const kvd_transfer_args_t *a);
/* cuda_work.c: a finished job to the loop (done list and wake-up); the
 * job's layer and record events recorded on s. */
void kvd__cuda_push_done(cuda_backend_t *cb, kvd__job_t *job);
void kvd__cuda_record_events(cuda_backend_t *cb, const kvd__job_t *job, cudaStream_t s);

/* cuda_work.c: the work functions of the backend's table; the completion
 * handlers (the async wake-up, the loop mode's idle pass, the poller
 * thread) and the poller's end. */
void kvd__cuda_work_ops(kvd__backend_t *be);
void kvd__cuda_async_cb(uv_async_t *h);
void kvd__cuda_idle_cb(uv_idle_t *h);
void *kvd__cuda_poller_main(void *arg);
void kvd__cuda_stop_poller(cuda_backend_t *cb);

#endif
