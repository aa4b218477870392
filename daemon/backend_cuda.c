/*
 * The cuda backend: plain C on the CUDA runtime API.
 *
 * - device pools: one cudaMalloc allocation each, exported by
 *   cudaIpcGetMemHandle; VMM pools: cuMemCreate with a POSIX-fd handle type,
 *   exported as that descriptor; host pools: a sealed memfd, mapped and
 *   registered with cudaHostRegister;
 * - imports: a legacy handle is opened once per daemon and reference-counted
 *   (a process may open a handle only once); a VMM descriptor is imported,
 *   mapped and given access; a host memfd is mapped and registered;
 * - one stream per class, created with priorities; kernels run with
 *   kvd_cuda_* on the class's stream and block budget, after
 *   cudaStreamWaitEvent on the request's wait event and before cudaEventRecord
 *   of its record event;
 * - completion (--cuda-completion): a poller thread queries an event
 *   recorded after each job (poll), or cudaLaunchHostFunc (hostfunc), pushes
 *   the job onto a mutex-protected queue and wakes the loop with
 *   uv_async_send; or the loop itself queries the events between rounds of
 *   socket I/O while work is in flight (loop; one event per stream for the
 *   jobs launched since the last, not one per job).  The loop never blocks.
 *
 * The driver API (VMM, address ranges) is reached through
 * cudaGetDriverEntryPointByVersion: the binary never links libcuda, so it
 * starts on machines without a driver (and picks the cpu backend there).
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "log.h"

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

/* What a kvd_mem_t holds on this backend. */
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
    kvd_job_t *head, *tail;
} job_fifo_t;

static void fifo_push(job_fifo_t *q, kvd_job_t *job)
{
    kvd__jobs_append(&q->head, &q->tail, job);
}

/* The head, which the caller has checked is there. */
static kvd_job_t *fifo_pop(job_fifo_t *q)
{
    kvd_job_t *job = q->head;

    q->head = job->next;
    if (q->head == NULL)
        q->tail = NULL;
    return job;
}

typedef struct cuda_backend {
    kvd_backend_t be;
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
    job_fifo_t inflight[KVD_SC_COUNT];
    int unrecorded[KVD_SC_COUNT]; /* loop: jobs launched since the last event */
    uint32_t n_inflight; /* under poll_mu */
    int poll_stop;
    cudaEvent_t *ev_free; /* loop thread only */
    uint32_t ev_nfree;
    uv_async_t async;
    kvd_done_list_t done;
    cudaStream_t streams[KVD_SC_COUNT];
    uint32_t pending;
    driver_api_t drv;
    unsigned long long *oob; /* pinned, mapped: OOB_SLOTS counters */
    uint32_t *oob_free;
    uint32_t oob_nfree;
    ipc_open_t *ipc_opened;
    staging_block_t *bins[STAGING_BINS];
    staging_slab_t *slabs;
    uint64_t staging_cached; /* bytes of larger blocks in the bins */
    void (*destroy_cb)(void *arg);
    void *destroy_arg;
} cuda_backend_t;

/* Map a CUDA error to KVD_ECUDA with where it happened; clears the sticky
 * error of the runtime's last-error slot. */
static kvd_status_t cuda_fail(cudaError_t e, const char *what, char *why, size_t why_len)
{
    if (why != NULL && why_len > 0)
        snprintf(why, why_len, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    (void)cudaGetLastError();
    return e == cudaErrorMemoryAllocation ? KVD_ENOMEM : KVD_ECUDA;
}

static kvd_status_t drv_fail(CUresult r, const char *what, char *why, size_t why_len)
{
    if (why != NULL && why_len > 0)
        snprintf(why, why_len, "%s: CUresult %d", what, (int)r);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? KVD_ENOMEM : KVD_ECUDA;
}

static void *entry(const char *name)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;

    if (cudaGetDriverEntryPointByVersion(name, &fn, DRIVER_API_VERSION, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
    return fn;
}

static void load_driver_api(driver_api_t *d)
{
    d->mem_create = (pfn_mem_create_t)entry("cuMemCreate");
    d->mem_release = (pfn_mem_release_t)entry("cuMemRelease");
    d->addr_reserve = (pfn_addr_reserve_t)entry("cuMemAddressReserve");
    d->addr_free = (pfn_addr_free_t)entry("cuMemAddressFree");
    d->mem_map = (pfn_mem_map_t)entry("cuMemMap");
    d->mem_unmap = (pfn_mem_unmap_t)entry("cuMemUnmap");
    d->set_access = (pfn_set_access_t)entry("cuMemSetAccess");
    d->export_handle = (pfn_export_t)entry("cuMemExportToShareableHandle");
    d->import_handle = (pfn_import_t)entry("cuMemImportFromShareableHandle");
    d->granularity = (pfn_granularity_t)entry("cuMemGetAllocationGranularity");
    d->addr_range = (pfn_addr_range_t)entry("cuMemGetAddressRange");
    d->vmm = d->mem_create && d->mem_release && d->addr_reserve && d->addr_free && d->mem_map &&
             d->mem_unmap && d->set_access && d->export_handle && d->import_handle &&
             d->granularity;
}

/* ---- completions ----------------------------------------------------------- */

static void push_done(cuda_backend_t *cb, kvd_job_t *job)
{
    kvd__done_push(&cb->done, job);
    uv_async_send(&cb->async);
}

/* Runs on a CUDA thread once the stream reaches it: no CUDA calls here. */
static void CUDART_CB host_done(void *arg)
{
    kvd_job_t *job = arg;

    push_done((cuda_backend_t *)job->be, job);
}

/* The poller: while work is in flight it queries the event recorded after
 * each stream's oldest job (a stream completes in order); idle, it sleeps. */
static void *poller_main(void *arg)
{
    cuda_backend_t *cb = arg;
    unsigned idle_spins = 0;

    cudaSetDevice(cb->dev);
    pthread_mutex_lock(&cb->poll_mu);
    for (;;) {
        kvd_job_t *heads[KVD_SC_COUNT];
        int i, progressed = 0;

        while (cb->n_inflight == 0 && !cb->poll_stop)
            pthread_cond_wait(&cb->poll_cv, &cb->poll_mu);
        if (cb->n_inflight == 0 && cb->poll_stop)
            break;
        for (i = 0; i < KVD_SC_COUNT; i++)
            heads[i] = cb->inflight[i].head;
        pthread_mutex_unlock(&cb->poll_mu);
        for (i = 0; i < KVD_SC_COUNT; i++) {
            kvd_job_t *job = heads[i];
            cudaError_t e;

            if (job == NULL)
                continue;
            e = cudaEventQuery((cudaEvent_t)job->done_event);
            if (e == cudaErrorNotReady)
                continue;
            if (e != cudaSuccess) {
                job->status = cuda_fail(e, "the stream failed", job->detail, sizeof(job->detail));
            }
            pthread_mutex_lock(&cb->poll_mu);
            (void)fifo_pop(&cb->inflight[i]);
            cb->n_inflight--;
            pthread_mutex_unlock(&cb->poll_mu);
            push_done(cb, job);
            progressed = 1;
        }
        if (progressed)
            idle_spins = 0;
        else if (++idle_spins > 64)
            sched_yield(); /* long work: let others run between queries */
        pthread_mutex_lock(&cb->poll_mu);
    }
    pthread_mutex_unlock(&cb->poll_mu);
    return NULL;
}

/* On the loop thread: give back the job's event and counter, and answer. */
static void finish_job(cuda_backend_t *cb, kvd_job_t *job)
{
    /* the work is done: its counter is final */
    job->skipped_oob = *(volatile unsigned long long *)job->oob;
    if (job->done_event != NULL) {
        cb->ev_free[cb->ev_nfree++] = (cudaEvent_t)job->done_event;
        job->done_event = NULL;
    }
    cb->oob_free[cb->oob_nfree++] = job->oob_slot;
    cb->pending--;
    job->done(job);
}

static void async_cb(uv_async_t *h)
{
    cuda_backend_t *cb = h->data;
    kvd_job_t *list, *next;

    list = kvd__done_take(&cb->done);
    for (; list; list = next) {
        next = list->next;
        finish_job(cb, list);
    }
}

/* An event to record after work (from the free list), or NULL. */
static cudaEvent_t completion_event(cuda_backend_t *cb)
{
    cudaEvent_t ev;

    if (cb->ev_nfree > 0)
        return cb->ev_free[--cb->ev_nfree];
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)
        return NULL;
    return ev;
}

/* Loop mode: the event that tells the end of the jobs launched on
 * stream i since the last one, recorded once for all of them (the stream
 * runs them in order).  If it cannot be recorded, wait for the stream. */
static void mark_batch_end(cuda_backend_t *cb, int i)
{
    job_fifo_t *q = &cb->inflight[i];
    cudaEvent_t ev;
    cudaError_t e;
    kvd_job_t *job;

    cb->unrecorded[i] = 0;
    if (q->tail == NULL)
        return;
    ev = completion_event(cb);
    if (ev != NULL && cudaEventRecord(ev, cb->streams[i]) == cudaSuccess) {
        q->tail->done_event = ev;
        return;
    }
    (void)cudaGetLastError();
    if (ev != NULL)
        cudaEventDestroy(ev);
    kvd_log(KVD_LOG_WARN, "event=completion_event_failed action=synchronize stream=%d", i);
    e = cudaStreamSynchronize(cb->streams[i]);
    job = q->head; /* what the wait covered: a done callback may queue more */
    q->head = q->tail = NULL;
    while (job != NULL) {
        kvd_job_t *next = job->next;

        if (e != cudaSuccess)
            job->status = cuda_fail(e, "the stream failed", job->detail, sizeof(job->detail));
        cb->n_inflight--;
        finish_job(cb, job);
        job = next;
    }
}

/* Loop mode: while the idle handle is active the loop polls sockets without
 * blocking and calls this between rounds; finished jobs are answered here,
 * with no other thread between the GPU and the reply.  Jobs complete in
 * groups: each group ends at the job that holds the group's event. */
static void idle_cb(uv_idle_t *h)
{
    cuda_backend_t *cb = h->data;
    int i;

    for (i = 0; i < KVD_SC_COUNT; i++) {
        job_fifo_t *q = &cb->inflight[i];

        if (cb->unrecorded[i])
            mark_batch_end(cb, i);
        while (q->head != NULL) {
            kvd_job_t *end = q->head, *job;
            kvd_status_t st = KVD_OK;
            char detail[sizeof(end->detail)] = "";
            cudaError_t e;

            while (end != NULL && end->done_event == NULL)
                end = end->next;
            if (end == NULL)
                break; /* queued by a done callback: recorded next round */
            e = cudaEventQuery((cudaEvent_t)end->done_event);
            if (e == cudaErrorNotReady)
                break;
            if (e != cudaSuccess)
                st = cuda_fail(e, "the stream failed", detail, sizeof(detail));
            do {
                job = fifo_pop(q);
                if (st != KVD_OK) {
                    job->status = st;
                    snprintf(job->detail, sizeof(job->detail), "%s", detail);
                }
                cb->n_inflight--;
                finish_job(cb, job);
            } while (job != end);
        }
    }
    if (cb->n_inflight == 0)
        uv_idle_stop(&cb->idle);
}

/* ---- memory ---------------------------------------------------------------- */

static kvd_mem_t *mem_new(int kind, int how)
{
    kvd_mem_t *m = calloc(1, sizeof(*m));
    cuda_mem_t *cm = calloc(1, sizeof(*cm));

    if (m == NULL || cm == NULL) {
        free(m);
        free(cm);
        return NULL;
    }
    m->kind = kind;
    m->fd = -1;
    cm->how = how;
    m->priv = cm;
    return m;
}

static void mem_free_struct(kvd_mem_t *m)
{
    if (m->fd >= 0)
        close(m->fd);
    free(m->priv);
    free(m);
}

/* Zero new device memory and wait for it: cudaMemset runs on the legacy
 * stream, which neither the daemon's non-blocking streams nor an importing
 * process wait for, so a first store could otherwise be zeroed after it. */
static void zero_device(void *p, uint64_t bytes)
{
    cudaError_t e = cudaMemset(p, 0, bytes);

    if (e == cudaSuccess)
        e = cudaStreamSynchronize(0);
    if (e != cudaSuccess) {
        kvd_log(KVD_LOG_WARN, "event=zero_fill_failed bytes=%llu error=\"%s\"",
                (unsigned long long)bytes, cudaGetErrorString(e));
        (void)cudaGetLastError();
    }
}

static kvd_status_t vmm_prop(cuda_backend_t *cb, CUmemAllocationProp *prop, uint64_t *gran,
                             char *why, size_t why_len)
{
    size_t g = 0;
    CUresult r;

    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = cb->dev;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    r = cb->drv.granularity(&g, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || g == 0)
        return drv_fail(r, "cuMemGetAllocationGranularity", why, why_len);
    *gran = g;
    return KVD_OK;
}

/* Reserve, map and give this device access to size bytes of handle h. */
static kvd_status_t vmm_map(cuda_backend_t *cb, CUmemGenericAllocationHandle h, uint64_t size,
                            void **out, char *why, size_t why_len)
{
    CUdeviceptr va = 0;
    CUmemAccessDesc acc;
    CUresult r;

    r = cb->drv.addr_reserve(&va, size, 0, 0, 0);
    if (r != CUDA_SUCCESS)
        return drv_fail(r, "cuMemAddressReserve", why, why_len);
    r = cb->drv.mem_map(va, size, 0, h, 0);
    if (r != CUDA_SUCCESS) {
        cb->drv.addr_free(va, size);
        return drv_fail(r, "cuMemMap", why, why_len);
    }
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = cb->dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cb->drv.set_access(va, size, &acc, 1);
    if (r != CUDA_SUCCESS) {
        cb->drv.mem_unmap(va, size);
        cb->drv.addr_free(va, size);
        return drv_fail(r, "cuMemSetAccess", why, why_len);
    }
    *out = (void *)(uintptr_t)va;
    return KVD_OK;
}

static kvd_status_t create_vmm(cuda_backend_t *cb, uint64_t bytes, kvd_mem_t *m, char *why,
                               size_t why_len)
{
    cuda_mem_t *cm = m->priv;
    CUmemAllocationProp prop;
    uint64_t gran, size;
    kvd_status_t st;
    CUresult r;
    int fd = -1;

    if (!cb->drv.vmm) {
        snprintf(why, why_len, "the driver has no virtual memory management API");
        return KVD_ENOTSUP;
    }
    if ((st = vmm_prop(cb, &prop, &gran, why, why_len)) != KVD_OK)
        return st;
    size = (bytes + gran - 1) / gran * gran;
    r = cb->drv.mem_create(&cm->vmm, size, &prop, 0);
    if (r != CUDA_SUCCESS)
        return drv_fail(r, "cuMemCreate", why, why_len);
    if ((st = vmm_map(cb, cm->vmm, size, &m->ptr, why, why_len)) != KVD_OK) {
        cb->drv.mem_release(cm->vmm);
        return st;
    }
    r = cb->drv.export_handle(&fd, cm->vmm, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) {
        cb->drv.mem_unmap((CUdeviceptr)(uintptr_t)m->ptr, size);
        cb->drv.addr_free((CUdeviceptr)(uintptr_t)m->ptr, size);
        cb->drv.mem_release(cm->vmm);
        return drv_fail(r, "cuMemExportToShareableHandle", why, why_len);
    }
    cm->vmm_size = size;
    m->fd = fd;
    m->map_bytes = size;
    zero_device(m->ptr, size);
    return KVD_OK;
}

/* Register a mapped memfd with CUDA; on failure it is unmapped. */
static kvd_status_t register_host(kvd_mem_t *m, char *why, size_t why_len)
{
    cudaError_t e = cudaHostRegister(m->ptr, m->map_bytes,
                                     cudaHostRegisterPortable | cudaHostRegisterMapped);

    if (e == cudaSuccess)
        return KVD_OK;
    munmap(m->ptr, m->map_bytes);
    return cuda_fail(e, "cudaHostRegister", why, why_len);
}

static kvd_status_t cuda_device_memory(kvd_backend_t *be, uint64_t *free_bytes,
                                       uint64_t *total_bytes)
{
    size_t f = 0, t = 0;
    cudaError_t e = cudaMemGetInfo(&f, &t);

    (void)be;
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaMemGetInfo", NULL, 0);
    *free_bytes = f;
    *total_bytes = t;
    return KVD_OK;
}

/* A device allocation must leave the workers device-memory-margin free. */
static kvd_status_t check_device_room(cuda_backend_t *cb, uint64_t bytes, char *why,
                                      size_t why_len)
{
    uint64_t f, t;
    char a[32], b[32], c[32];
    kvd_status_t st = cuda_device_memory(&cb->be, &f, &t);

    if (st != KVD_OK) {
        snprintf(why, why_len, "cannot read the device's free memory");
        return st;
    }
    if (bytes > f || f - bytes < cb->device_margin) {
        snprintf(why, why_len, "%s requested, %s free on the device, of which %s stays free "
                 "for the workers (device-memory-margin)", kvd_fmt_bytes(bytes, a, sizeof(a)),
                 kvd_fmt_bytes(f, b, sizeof(b)), kvd_fmt_bytes(cb->device_margin, c, sizeof(c)));
        return KVD_ENOMEM;
    }
    return KVD_OK;
}

static kvd_status_t cuda_mem_create(kvd_backend_t *be, int kind, uint64_t bytes,
                                    const char *label, kvd_mem_t **out, char *why,
                                    size_t why_len)
{
    cuda_backend_t *cb = (cuda_backend_t *)be;
    kvd_mem_t *m;
    kvd_status_t st = KVD_OK;
    cudaError_t e;

    if (kind != KVD_MEM_HOST && (st = check_device_room(cb, bytes, why, why_len)) != KVD_OK)
        return st;

    m = mem_new(kind, kind == KVD_MEM_HOST     ? HOW_HOST
                      : kind == KVD_MEM_DEVICE ? HOW_MALLOC
                                               : HOW_VMM);
    if (m == NULL)
        return KVD_ENOMEM;
    m->bytes = bytes;
    switch (kind) {
    case KVD_MEM_HOST:
        st = kvd__memfd_create(label, bytes, &m->fd, &m->ptr, &m->map_bytes, why, why_len);
        if (st == KVD_OK)
            st = register_host(m, why, why_len);
        break;
    case KVD_MEM_DEVICE:
        e = cudaMalloc(&m->ptr, bytes);
        if (e != cudaSuccess) {
            st = cuda_fail(e, "cudaMalloc", why, why_len);
            break;
        }
        e = cudaIpcGetMemHandle((cudaIpcMemHandle_t *)m->ipc, m->ptr);
        if (e != cudaSuccess) {
            st = cuda_fail(e, "cudaIpcGetMemHandle", why, why_len);
            cudaFree(m->ptr);
            break;
        }
        zero_device(m->ptr, bytes);
        m->has_ipc = 1;
        m->map_bytes = bytes;
        break;
    case KVD_MEM_DEVICE_VMM:
        st = create_vmm(cb, bytes, m, why, why_len);
        break;
    default:
        st = KVD_EINVAL;
    }
    if (st != KVD_OK) {
        mem_free_struct(m);
        return st;
    }
    *out = m;
    return KVD_OK;
}

static kvd_status_t import_ipc(cuda_backend_t *cb, const unsigned char *h, uint64_t bytes,
                               kvd_mem_t *m, char *why, size_t why_len)
{
    cuda_mem_t *cm = m->priv;
    ipc_open_t *o;
    cudaIpcMemHandle_t handle;
    cudaError_t e;

    for (o = cb->ipc_opened; o; o = o->next)
        if (memcmp(o->handle, h, KVD_IPC_HANDLE_BYTES) == 0)
            break;
    if (o == NULL) {
        void *p = NULL;
        CUdeviceptr base = 0;
        size_t size = 0;

        memcpy(&handle, h, sizeof(handle));
        e = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess)
            return cuda_fail(e, "cudaIpcOpenMemHandle", why, why_len);
        if (cb->drv.addr_range == NULL ||
            cb->drv.addr_range(&base, &size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
            size = 0; /* unknown: trust the client's size */
        o = calloc(1, sizeof(*o));
        if (o == NULL) {
            cudaIpcCloseMemHandle(p);
            return KVD_ENOMEM;
        }
        memcpy(o->handle, h, KVD_IPC_HANDLE_BYTES);
        o->ptr = p;
        o->size = size;
        o->next = cb->ipc_opened;
        cb->ipc_opened = o;
    }
    if (o->size != 0 && bytes > o->size) {
        snprintf(why, why_len, "the allocation holds %llu bytes, %llu claimed",
                 (unsigned long long)o->size, (unsigned long long)bytes);
        if (o->refs == 0) {
            ipc_open_t **pp;
            for (pp = &cb->ipc_opened; *pp != o; pp = &(*pp)->next)
                ;
            *pp = o->next;
            cudaIpcCloseMemHandle(o->ptr);
            free(o);
        }
        return KVD_ERANGE;
    }
    o->refs++;
    cm->ipc = o;
    m->ptr = o->ptr;
    return KVD_OK;
}

static void release_ipc(cuda_backend_t *cb, ipc_open_t *o)
{
    ipc_open_t **pp;

    if (--o->refs > 0)
        return;
    for (pp = &cb->ipc_opened; *pp && *pp != o; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = o->next;
    cudaIpcCloseMemHandle(o->ptr);
    free(o);
}

static kvd_status_t cuda_mem_import(kvd_backend_t *be, int kind, const unsigned char *ipc,
                                    size_t ipc_len, int fd, uint64_t bytes, kvd_mem_t **out,
                                    char *why, size_t why_len)
{
    cuda_backend_t *cb = (cuda_backend_t *)be;
    kvd_mem_t *m;
    cuda_mem_t *cm;
    kvd_status_t st = KVD_OK;

    m = mem_new(kind, kind == KVD_MEM_HOST     ? HOW_HOST
                      : kind == KVD_MEM_DEVICE ? HOW_IPC_OPEN
                                               : HOW_VMM);
    if (m == NULL)
        return KVD_ENOMEM;
    cm = m->priv;
    m->bytes = bytes;
    switch (kind) {
    case KVD_MEM_DEVICE:
        if (ipc == NULL || ipc_len != KVD_IPC_HANDLE_BYTES) {
            st = KVD_EINVAL;
            break;
        }
        st = import_ipc(cb, ipc, bytes, m, why, why_len);
        break;
    case KVD_MEM_DEVICE_VMM: {
        CUmemAllocationProp prop;
        uint64_t gran;
        CUresult r;

        if (!cb->drv.vmm) {
            snprintf(why, why_len, "the driver has no virtual memory management API");
            st = KVD_ENOTSUP;
            break;
        }
        if ((st = vmm_prop(cb, &prop, &gran, why, why_len)) != KVD_OK)
            break;
        if (bytes % gran != 0) {
            snprintf(why, why_len, "a VMM allocation's size is a multiple of %llu",
                     (unsigned long long)gran);
            st = KVD_EALIGN;
            break;
        }
        r = cb->drv.import_handle(&cm->vmm, (void *)(uintptr_t)fd,
                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r != CUDA_SUCCESS) {
            st = drv_fail(r, "cuMemImportFromShareableHandle", why, why_len);
            break;
        }
        st = vmm_map(cb, cm->vmm, bytes, &m->ptr, why, why_len);
        if (st != KVD_OK) {
            cb->drv.mem_release(cm->vmm);
            break;
        }
        cm->vmm_size = bytes;
        break;
    }
    case KVD_MEM_HOST:
        st = kvd__memfd_map(fd, bytes, &m->ptr, &m->map_bytes, why, why_len);
        if (st == KVD_OK)
            st = register_host(m, why, why_len);
        break;
    default:
        st = KVD_EINVAL;
    }
    if (st != KVD_OK) {
        mem_free_struct(m);
        return st;
    }
    *out = m;
    return KVD_OK;
}

static void cuda_mem_destroy(kvd_backend_t *be, kvd_mem_t **mp)
{
    cuda_backend_t *cb = (cuda_backend_t *)be;
    kvd_mem_t *m = mp ? *mp : NULL;
    cuda_mem_t *cm;

    if (m == NULL)
        return;
    cm = m->priv;
    switch (cm->how) {
    case HOW_MALLOC:
        cudaFree(m->ptr);
        break;
    case HOW_VMM:
        cb->drv.mem_unmap((CUdeviceptr)(uintptr_t)m->ptr, cm->vmm_size);
        cb->drv.addr_free((CUdeviceptr)(uintptr_t)m->ptr, cm->vmm_size);
        cb->drv.mem_release(cm->vmm);
        break;
    case HOW_HOST:
        cudaHostUnregister(m->ptr);
        munmap(m->ptr, m->map_bytes);
        break;
    case HOW_IPC_OPEN:
        release_ipc(cb, cm->ipc);
        break;
    }
    (void)cudaGetLastError();
    mem_free_struct(m);
    *mp = NULL;
}

/* ---- tables: device memory; staging: pinned, mapped host memory ----------- */

/* Layer-address tables are read by every row a kernel copies: device memory,
 * not a read across the bus each time. */
static kvd_status_t cuda_table_create(kvd_backend_t *be, const uint64_t *vals, size_t n,
                                      void **out)
{
    size_t bytes = n ? n * sizeof(uint64_t) : 8;
    void *p = NULL;
    cudaError_t e;

    (void)be;
    e = cudaMalloc(&p, bytes);
    if (e == cudaSuccess && n)
        e = cudaMemcpy(p, vals, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        if (p != NULL)
            cudaFree(p);
        (void)cudaGetLastError();
        return e == cudaErrorMemoryAllocation ? KVD_ENOMEM : KVD_ECUDA;
    }
    *out = p;
    return KVD_OK;
}

static void cuda_table_destroy(kvd_backend_t *be, void *t)
{
    (void)be;
    cudaFree(t);
    (void)cudaGetLastError();
}

/* Larger staging blocks kept pinned for reuse: at most STAGING_KEEP_BYTES,
 * and no more than an eighth of the host-memory budget. */
static uint64_t staging_keep(const cuda_backend_t *cb)
{
    uint64_t share = cb->be.hostmem->budget / 8;

    return share < STAGING_KEEP_BYTES ? share : STAGING_KEEP_BYTES;
}

static int bin_of(size_t bytes)
{
    int b = 0;
    size_t cap = (size_t)1 << STAGING_MIN_SHIFT;

    while (cap < bytes && b < STAGING_BINS) {
        cap <<= 1;
        b++;
    }
    return b; /* STAGING_BINS: too large to cache */
}

/* Pin bytes of staging, counted in the budget. */
static kvd_status_t staging_pin(cuda_backend_t *cb, size_t bytes, void **out, char *why,
                                size_t why_len)
{
    kvd_status_t st = kvd_hostmem_reserve(cb->be.hostmem, KVD_HM_STAGING, bytes, why, why_len);

    if (st != KVD_OK)
        return st;
    if (cudaHostAlloc(out, bytes, cudaHostAllocPortable | cudaHostAllocMapped) != cudaSuccess) {
        (void)cudaGetLastError();
        kvd_hostmem_release(cb->be.hostmem, KVD_HM_STAGING, bytes);
        snprintf(why, why_len, "cannot pin %zu bytes of host memory", bytes);
        return KVD_ENOMEM;
    }
    return KVD_OK;
}

static void staging_unpin(cuda_backend_t *cb, void *p, size_t bytes)
{
    cudaFreeHost(p);
    kvd_hostmem_release(cb->be.hostmem, KVD_HM_STAGING, bytes);
}

/* Fill small bin b from a new slab: pinning memory costs far more than a
 * request (and cudaFreeHost synchronizes), so it happens once per slab. */
static kvd_status_t staging_refill(cuda_backend_t *cb, int b, char *why, size_t why_len)
{
    size_t cap = (size_t)1 << (STAGING_MIN_SHIFT + b), n, i;
    size_t bytes = cap * 64;
    staging_slab_t *slab = malloc(sizeof(*slab));
    kvd_status_t st;

    if (bytes < STAGING_SLAB_MIN)
        bytes = STAGING_SLAB_MIN;
    if (bytes > STAGING_SLAB_MAX)
        bytes = STAGING_SLAB_MAX;
    if (slab == NULL)
        return KVD_ENOMEM;
    if ((st = staging_pin(cb, bytes, &slab->mem, why, why_len)) != KVD_OK) {
        free(slab);
        return st;
    }
    slab->bytes = bytes;
    slab->next = cb->slabs;
    cb->slabs = slab;
    n = bytes / cap;
    for (i = 0; i < n; i++) {
        staging_block_t *blk = (staging_block_t *)((char *)slab->mem + i * cap);
        blk->next = cb->bins[b];
        cb->bins[b] = blk;
    }
    return KVD_OK;
}

static kvd_status_t cuda_staging_alloc(kvd_backend_t *be, size_t bytes, void **out, char *why,
                                       size_t why_len)
{
    cuda_backend_t *cb = (cuda_backend_t *)be;
    int b = bin_of(bytes);
    size_t cap = b < STAGING_BINS ? (size_t)1 << (STAGING_MIN_SHIFT + b) : bytes;
    kvd_status_t st;

    if (b < STAGING_SLAB_BINS && cb->bins[b] == NULL &&
        (st = staging_refill(cb, b, why, why_len)) != KVD_OK)
        return st;
    if (b < STAGING_BINS && cb->bins[b] != NULL) {
        staging_block_t *blk = cb->bins[b];
        cb->bins[b] = blk->next;
        if (b >= STAGING_SLAB_BINS)
            cb->staging_cached -= cap;
        *out = blk;
        return KVD_OK;
    }
    return staging_pin(cb, cap, out, why, why_len);
}

static void cuda_staging_free(kvd_backend_t *be, void *p, size_t bytes)
{
    cuda_backend_t *cb = (cuda_backend_t *)be;
    int b = bin_of(bytes);
    size_t cap = b < STAGING_BINS ? (size_t)1 << (STAGING_MIN_SHIFT + b) : bytes;

    if (p == NULL)
        return;
    if (b < STAGING_SLAB_BINS ||
        (b < STAGING_BINS && cb->staging_cached + cap <= staging_keep(cb))) {
        staging_block_t *blk = p;
        blk->next = cb->bins[b];
        cb->bins[b] = blk;
        if (b >= STAGING_SLAB_BINS)
            cb->staging_cached += cap;
        return;
    }
    staging_unpin(cb, p, cap); /* past the cache, or larger than any bin: rare */
}

/* ---- events ---------------------------------------------------------------- */

static kvd_status_t cuda_event_open(kvd_backend_t *be, const unsigned char *h, size_t len,
                                    void **ev, char *why, size_t why_len)
{
    cudaIpcEventHandle_t handle;
    cudaEvent_t e = NULL;
    cudaError_t rc;

    if (len != sizeof(handle)) {
        snprintf(why, why_len, "an event handle is %zu bytes", sizeof(handle));
        return KVD_EINVAL;
    }
    memcpy(&handle, h, sizeof(handle));
    rc = cudaIpcOpenEventHandle(&e, handle);
    if (rc != cudaSuccess)
        return cuda_fail(rc, "cudaIpcOpenEventHandle", why, why_len);
    *ev = e;
    return KVD_OK;
}

static void cuda_event_close(kvd_backend_t *be, void *ev)
{
    cudaEventDestroy((cudaEvent_t)ev);
    (void)cudaGetLastError();
}

/* ---- work ------------------------------------------------------------------ */

static kvd_status_t cuda_submit(kvd_backend_t *be, kvd_job_t *job)
{
    cuda_backend_t *cb = (cuda_backend_t *)be;
    cudaStream_t s;
    kvd_launch_t launch;
    kvd_status_t st = KVD_EINTERNAL;
    cudaError_t e;
    uint32_t slot;

    if (job->sclass < 0 || job->sclass >= KVD_SC_COUNT)
        return KVD_EINVAL;
    if (cb->oob_nfree == 0) {
        snprintf(job->detail, sizeof(job->detail), "too many operations in flight");
        return KVD_EBUSY;
    }
    s = cb->streams[job->sclass];
    slot = cb->oob_free[--cb->oob_nfree];
    cb->oob[slot] = 0;
    job->oob_slot = slot;
    job->oob = &cb->oob[slot];
    job->status = KVD_OK;
    job->skipped_oob = 0;
    job->detail[0] = '\0';

    if (job->wait_event != NULL) {
        e = cudaStreamWaitEvent(s, (cudaEvent_t)job->wait_event, 0);
        if (e != cudaSuccess) {
            st = cuda_fail(e, "cudaStreamWaitEvent", job->detail, sizeof(job->detail));
            goto fail;
        }
    }
    launch.stream = s;
    launch.max_blocks = job->max_blocks ? job->max_blocks : be->blocks[job->sclass];
    launch.flags = job->flags;
    switch (job->kind) {
    case KVD_JOB_STORE:
        job->a.store.oob_count = job->oob;
        st = kvd_cuda_kv_store(&job->a.store, &launch);
        break;
    case KVD_JOB_FP8_SET:
        job->a.fp8.oob_count = job->oob;
        st = kvd_cuda_fp8_set(&job->a.fp8, &launch);
        break;
    case KVD_JOB_GATHER:
        job->a.gather.oob_count = job->oob;
        st = kvd_cuda_page_table_gather(&job->a.gather, &launch);
        break;
    case KVD_JOB_TRANSFER:
        job->a.transfer.oob_count = job->oob;
        st = kvd_cuda_kv_transfer(&job->a.transfer, &launch);
        break;
    }
    if (st != KVD_OK) {
        snprintf(job->detail, sizeof(job->detail), "%s", kvd_last_error_detail());
        goto fail;
    }
    if (job->record_event != NULL) {
        e = cudaEventRecord((cudaEvent_t)job->record_event, s);
        if (e != cudaSuccess)
            kvd_log(KVD_LOG_WARN, "event=record_failed error=\"%s\"", cudaGetErrorString(e));
    }
    job->be = be;
    cb->pending++;
    if (cb->loop_poll) { /* loop thread only: no lock; the event comes in idle_cb */
        job->done_event = NULL;
        fifo_push(&cb->inflight[job->sclass], job);
        cb->unrecorded[job->sclass] = 1;
        if (cb->n_inflight++ == 0)
            uv_idle_start(&cb->idle, idle_cb);
        return KVD_OK;
    }
    if (cb->use_poll) {
        cudaEvent_t ev = completion_event(cb);

        if (ev != NULL && cudaEventRecord(ev, s) == cudaSuccess) {
            job->done_event = ev;
            pthread_mutex_lock(&cb->poll_mu);
            fifo_push(&cb->inflight[job->sclass], job);
            if (cb->n_inflight++ == 0)
                pthread_cond_signal(&cb->poll_cv);
            pthread_mutex_unlock(&cb->poll_mu);
            return KVD_OK;
        }
        /* no event: fall back to a host function for this one */
        (void)cudaGetLastError();
        if (ev != NULL)
            cudaEventDestroy(ev);
    }
    e = cudaLaunchHostFunc(s, host_done, job);
    if (e != cudaSuccess) {
        /* the work is queued: wait for it here rather than lose its end */
        (void)cudaGetLastError();
        kvd_log(KVD_LOG_WARN, "event=host_func_failed error=\"%s\" action=synchronize",
                cudaGetErrorString(e));
        e = cudaStreamSynchronize(s);
        if (e != cudaSuccess)
            job->status = cuda_fail(e, "cudaStreamSynchronize", job->detail, sizeof(job->detail));
        push_done(cb, job);
    }
    return KVD_OK;

fail:
    cb->oob_free[cb->oob_nfree++] = slot;
    return st;
}

static void cuda_cancel_pending(kvd_backend_t *be)
{
    /* everything submitted is already on a stream: nothing waits host-side */
}

static uint32_t cuda_pending(kvd_backend_t *be)
{
    return ((cuda_backend_t *)be)->pending;
}

static void stop_poller(cuda_backend_t *cb)
{
    if (!cb->poller_started)
        return;
    pthread_mutex_lock(&cb->poll_mu);
    cb->poll_stop = 1;
    pthread_cond_signal(&cb->poll_cv);
    pthread_mutex_unlock(&cb->poll_mu);
    pthread_join(cb->poller, NULL);
    cb->poller_started = 0;
}

static void free_backend(cuda_backend_t *cb)
{
    int i;

    stop_poller(cb);
    while (cb->ev_nfree > 0)
        cudaEventDestroy(cb->ev_free[--cb->ev_nfree]);
    free(cb->ev_free);
    pthread_mutex_destroy(&cb->poll_mu);
    pthread_cond_destroy(&cb->poll_cv);

    for (i = 0; i < KVD_SC_COUNT; i++)
        if (cb->streams[i] != NULL)
            cudaStreamDestroy(cb->streams[i]);
    for (i = STAGING_SLAB_BINS; i < STAGING_BINS; i++) {
        while (cb->bins[i]) {
            staging_block_t *b = cb->bins[i];
            cb->bins[i] = b->next;
            cudaFreeHost(b);
        }
    }
    while (cb->slabs != NULL) { /* the small bins' blocks live in these */
        staging_slab_t *sl = cb->slabs;
        cb->slabs = sl->next;
        cudaFreeHost(sl->mem);
        free(sl);
    }
    if (cb->oob)
        cudaFreeHost(cb->oob);
    free(cb->oob_free);
    kvd__done_destroy(&cb->done);
    free(cb);
}

static void async_closed_cb(uv_handle_t *h)
{
    cuda_backend_t *cb = h->data;
    void (*fn)(void *) = cb->destroy_cb;
    void *arg = cb->destroy_arg;

    free_backend(cb);
    if (fn)
        fn(arg);
}

static void idle_closed_cb(uv_handle_t *h)
{
    cuda_backend_t *cb = h->data;

    uv_close((uv_handle_t *)&cb->async, async_closed_cb);
}

static void cuda_destroy(kvd_backend_t *be, void (*fn)(void *arg), void *arg)
{
    cuda_backend_t *cb = (cuda_backend_t *)be;

    cudaDeviceSynchronize();
    cb->destroy_cb = fn;
    cb->destroy_arg = arg;
    if (cb->loop_poll) {
        if (cb->n_inflight > 0)
            idle_cb(&cb->idle); /* all done after the synchronize: answer them */
        uv_close((uv_handle_t *)&cb->idle, idle_closed_cb);
        return;
    }
    uv_close((uv_handle_t *)&cb->async, async_closed_cb);
}

kvd_status_t kvd_backend_cuda_create(uv_loop_t *loop, const kvd_options_t *opts,
                                     kvd_backend_t **out, char *why, size_t why_len)
{
    cuda_backend_t *cb;
    struct cudaDeviceProp prop;
    int least = 0, greatest = 0, i, ndev = 0;
    cudaError_t e;
    kvd_status_t st;

    e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        (void)cudaGetLastError();
        snprintf(why, why_len, "no usable GPU: %s",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        return KVD_ENODEV;
    }
    if (opts->device >= ndev) {
        snprintf(why, why_len, "device %lld does not exist (%d found)", (long long)opts->device,
                 ndev);
        return KVD_ENODEV;
    }
    e = cudaSetDevice((int)opts->device);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaSetDevice", why, why_len);
    /* before any stream can wait on a client's event: a lazy kernel load at
     * a first launch could otherwise block the loop until that event fires */
    if (kvd_cuda_load_kernels() != KVD_OK) {
        snprintf(why, why_len, "loading the kernels: %s", kvd_last_error_detail());
        return KVD_ECUDA;
    }
    if ((e = cudaGetDeviceProperties(&prop, (int)opts->device)) != cudaSuccess)
        return cuda_fail(e, "cudaGetDeviceProperties", why, why_len);
    if ((e = cudaDeviceGetStreamPriorityRange(&least, &greatest)) != cudaSuccess)
        return cuda_fail(e, "cudaDeviceGetStreamPriorityRange", why, why_len);

    cb = calloc(1, sizeof(*cb));
    if (cb == NULL)
        return KVD_ENOMEM;
    kvd__done_init(&cb->done);
    pthread_mutex_init(&cb->poll_mu, NULL);
    pthread_cond_init(&cb->poll_cv, NULL);
    cb->dev = (int)opts->device;
    cb->device_margin = opts->device_memory_margin;
    cb->be.name = "cuda";
    cb->be.proto_backend = 2; /* BACKEND_CUDA */
    snprintf(cb->be.device_name, sizeof(cb->be.device_name), "%.127s", prop.name);
    cb->be.device_ordinal = cb->dev;
    load_driver_api(&cb->drv);
    if (cb->drv.vmm) {
        CUmemAllocationProp vprop;
        char vwhy[96];

        if (vmm_prop(cb, &vprop, &cb->be.vmm_granularity, vwhy, sizeof(vwhy)) != KVD_OK)
            cb->be.vmm_granularity = 0;
    }
    for (i = 0; i < KVD_SC_COUNT; i++) {
        /* CUDA: a lower number runs first; greatest is the most urgent */
        int prio = least - (int)opts->priority[i];
        if (prio < greatest)
            prio = greatest;
        cb->be.priority[i] = prio;
        cb->be.blocks[i] = (uint32_t)opts->blocks[i];
        e = cudaStreamCreateWithPriority(&cb->streams[i], cudaStreamNonBlocking, prio);
        if (e != cudaSuccess) {
            st = cuda_fail(e, "cudaStreamCreateWithPriority", why, why_len);
            goto fail;
        }
    }
    e = cudaHostAlloc((void **)&cb->oob, OOB_SLOTS * sizeof(*cb->oob),
                      cudaHostAllocPortable | cudaHostAllocMapped);
    cb->oob_free = malloc(OOB_SLOTS * sizeof(*cb->oob_free));
    if (e != cudaSuccess || cb->oob_free == NULL) {
        st = e != cudaSuccess ? cuda_fail(e, "cudaHostAlloc", why, why_len) : KVD_ENOMEM;
        goto fail;
    }
    for (i = 0; i < OOB_SLOTS; i++)
        cb->oob_free[i] = (uint32_t)(OOB_SLOTS - 1 - i);
    cb->oob_nfree = OOB_SLOTS;
    /* every job in flight holds at most one event: never more than slots */
    cb->ev_free = malloc(OOB_SLOTS * sizeof(*cb->ev_free));
    if (cb->ev_free == NULL) {
        st = KVD_ENOMEM;
        goto fail;
    }
    cb->use_poll = opts->cuda_completion == KVD_COMPLETION_POLL;
    if (cb->use_poll) {
        if (pthread_create(&cb->poller, NULL, poller_main, cb) != 0) {
            snprintf(why, why_len, "cannot start the completion thread");
            st = KVD_ENOMEM;
            goto fail;
        }
        cb->poller_started = 1;
    }

    cb->be.device_memory = cuda_device_memory;
    cb->be.mem_create = cuda_mem_create;
    cb->be.mem_import = cuda_mem_import;
    cb->be.mem_destroy = cuda_mem_destroy;
    cb->be.table_create = cuda_table_create;
    cb->be.table_destroy = cuda_table_destroy;
    cb->be.staging_alloc = cuda_staging_alloc;
    cb->be.staging_free = cuda_staging_free;
    cb->be.event_open = cuda_event_open;
    cb->be.event_close = cuda_event_close;
    cb->be.submit = cuda_submit;
    cb->be.cancel_pending = cuda_cancel_pending;
    cb->be.pending = cuda_pending;
    cb->be.destroy = cuda_destroy;
    if (uv_async_init(loop, &cb->async, async_cb) != 0) {
        snprintf(why, why_len, "uv_async_init failed");
        st = KVD_EINTERNAL;
        goto fail;
    }
    cb->async.data = cb;
    cb->loop_poll = opts->cuda_completion == KVD_COMPLETION_LOOP;
    if (cb->loop_poll) {
        uv_idle_init(loop, &cb->idle);
        cb->idle.data = cb;
    }
    kvd_log(KVD_LOG_INFO,
            "event=cuda_backend device=%d name=\"%s\" vmm=%d priority_range=%d..%d "
            "completion=%s", cb->dev, prop.name, cb->drv.vmm, least, greatest,
            cb->use_poll ? "poll" : cb->loop_poll ? "loop" : "hostfunc");
    *out = &cb->be;
    return KVD_OK;
fail:
    free_backend(cb);
    return st;
}
