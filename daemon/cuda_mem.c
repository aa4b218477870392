/*
 * The cuda backend's memory (see backend_cuda.c): device pools (cudaMalloc
 * with a legacy IPC handle, or cuMemCreate exported as a descriptor),
 * pinned host pools (a sealed memfd registered with CUDA), imports of a
 * client's memory (legacy handles opened once and reference-counted, VMM
 * descriptors, memfds), layer tables, pinned operand staging, and
 * interprocess events.  The driver API is reached through
 * cudaGetDriverEntryPointByVersion: the binary never links libcuda.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_backend.h"
#include "log.h"

kvd_status_t kvd__cuda_fail(cudaError_t e, const char *what, char *why, size_t why_len)
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

void kvd__cuda_load_driver(driver_api_t *d)
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
    d->write_value32 = (pfn_write_value32_t)entry("cuStreamWriteValue32");
    d->wait_value32 = (pfn_wait_value32_t)entry("cuStreamWaitValue32");
    d->vmm = d->mem_create && d->mem_release && d->addr_reserve && d->addr_free && d->mem_map &&
             d->mem_unmap && d->set_access && d->export_handle && d->import_handle &&
             d->granularity;
}

/* ---- memory ---------------------------------------------------------------- */

static kvd__mem_t *mem_new(int kind, int how)
{
    kvd__mem_t *m = calloc(1, sizeof(*m));
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

static void mem_free_struct(kvd__mem_t *m)
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

kvd_status_t kvd__cuda_vmm_prop(cuda_backend_t *cb, CUmemAllocationProp *prop, uint64_t *gran,
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

static kvd_status_t create_vmm(cuda_backend_t *cb, uint64_t bytes, kvd__mem_t *m, char *why,
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
    if ((st = kvd__cuda_vmm_prop(cb, &prop, &gran, why, why_len)) != KVD_OK)
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
static kvd_status_t register_host(kvd__mem_t *m, char *why, size_t why_len)
{
    cudaError_t e = cudaHostRegister(m->ptr, m->map_bytes,
                                     cudaHostRegisterPortable | cudaHostRegisterMapped);

    if (e == cudaSuccess)
        return KVD_OK;
    munmap(m->ptr, m->map_bytes);
    return kvd__cuda_fail(e, "cudaHostRegister", why, why_len);
}

static kvd_status_t cuda_device_memory(kvd__backend_t *be, uint64_t *free_bytes,
                                       uint64_t *total_bytes)
{
    size_t f = 0, t = 0;
    cudaError_t e = cudaMemGetInfo(&f, &t);

    (void)be;
    if (e != cudaSuccess)
        return kvd__cuda_fail(e, "cudaMemGetInfo", NULL, 0);
    *free_bytes = f;
    *total_bytes = t;
    return KVD_OK;
}

/* A device allocation must leave the workers device-memory-margin free. */
static kvd_status_t check_device_room(cuda_backend_t *cb, uint64_t bytes, char *why,
                                      size_t why_len)
{
    uint64_t f = 0, t = 0;
    char a[32], b[32], c[32];
    kvd_status_t st = cuda_device_memory(&cb->be, &f, &t);

    if (st != KVD_OK) {
        snprintf(why, why_len, "cannot read the device's free memory");
        return st;
    }
    if (bytes > f || f - bytes < cb->device_margin) {
        snprintf(why, why_len, "%s requested, %s free on the device, of which %s stays free "
                 "for the workers (device-memory-margin)", kvd__fmt_bytes(bytes, a, sizeof(a)),
                 kvd__fmt_bytes(f, b, sizeof(b)), kvd__fmt_bytes(cb->device_margin, c, sizeof(c)));
        return KVD_ENOMEM;
    }
    return KVD_OK;
}

static kvd_status_t cuda_mem_create(kvd__backend_t *be, int kind, uint64_t bytes,
                                    const char *label, kvd__mem_t **out, char *why,
                                    size_t why_len)
{
    cuda_backend_t *cb = (cuda_backend_t *)be;
    kvd__mem_t *m;
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
        /* may run on a thread of its own (a cache's slab ahead of need) */
        e = cudaSetDevice(cb->dev);
        if (e != cudaSuccess) {
            st = kvd__cuda_fail(e, "cudaSetDevice", why, why_len);
            break;
        }
        st = kvd__memfd_create(label, bytes, &m->fd, &m->ptr, &m->map_bytes, why, why_len);
        if (st == KVD_OK)
            st = register_host(m, why, why_len);
        break;
    case KVD_MEM_DEVICE:
        e = cudaMalloc(&m->ptr, bytes);
        if (e != cudaSuccess) {
            st = kvd__cuda_fail(e, "cudaMalloc", why, why_len);
            break;
        }
        e = cudaIpcGetMemHandle((cudaIpcMemHandle_t *)m->ipc, m->ptr);
        if (e != cudaSuccess) {
            st = kvd__cuda_fail(e, "cudaIpcGetMemHandle", why, why_len);
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
                               kvd__mem_t *m, char *why, size_t why_len)
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
            return kvd__cuda_fail(e, "cudaIpcOpenMemHandle", why, why_len);
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

static kvd_status_t cuda_mem_import(kvd__backend_t *be, int kind, const unsigned char *ipc,
                                    size_t ipc_len, int fd, uint64_t bytes, kvd__mem_t **out,
                                    char *why, size_t why_len)
{
    cuda_backend_t *cb = (cuda_backend_t *)be;
    kvd__mem_t *m;
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
        if ((st = kvd__cuda_vmm_prop(cb, &prop, &gran, why, why_len)) != KVD_OK)
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

static void cuda_mem_destroy(kvd__backend_t *be, kvd__mem_t **mp)
{
    cuda_backend_t *cb = (cuda_backend_t *)be;
    kvd__mem_t *m = mp ? *mp : NULL;
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
static kvd_status_t cuda_table_create(kvd__backend_t *be, const uint64_t *vals, size_t n,
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

static void cuda_table_destroy(kvd__backend_t *be, void *t)
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
    kvd_status_t st = kvd__hostmem_reserve(cb->be.hostmem, KVD_HM_STAGING, bytes, why, why_len);

    if (st != KVD_OK)
        return st;
    if (cudaHostAlloc(out, bytes, cudaHostAllocPortable | cudaHostAllocMapped) != cudaSuccess) {
        (void)cudaGetLastError();
        kvd__hostmem_release(cb->be.hostmem, KVD_HM_STAGING, bytes);
        snprintf(why, why_len, "cannot pin %zu bytes of host memory", bytes);
        return KVD_ENOMEM;
    }
    return KVD_OK;
}

static void staging_unpin(cuda_backend_t *cb, void *p, size_t bytes)
{
    cudaFreeHost(p);
    kvd__hostmem_release(cb->be.hostmem, KVD_HM_STAGING, bytes);
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

static kvd_status_t cuda_staging_alloc(kvd__backend_t *be, size_t bytes, void **out, char *why,
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

static void cuda_staging_free(kvd__backend_t *be, void *p, size_t bytes)
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

static kvd_status_t cuda_event_open(kvd__backend_t *be, const unsigned char *h, size_t len,
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
        return kvd__cuda_fail(rc, "cudaIpcOpenEventHandle", why, why_len);
    *ev = e;
    return KVD_OK;
}

static void cuda_event_close(kvd__backend_t *be, void *ev)
{
    cudaEventDestroy((cudaEvent_t)ev);
    (void)cudaGetLastError();
}

/* ---- the table, and teardown --------------------------------------------- */

void kvd__cuda_mem_ops(kvd__backend_t *be)
{
    be->device_memory = cuda_device_memory;
    be->mem_create = cuda_mem_create;
    be->mem_import = cuda_mem_import;
    be->mem_destroy = cuda_mem_destroy;
    be->table_create = cuda_table_create;
    be->table_destroy = cuda_table_destroy;
    be->staging_alloc = cuda_staging_alloc;
    be->staging_free = cuda_staging_free;
    be->event_open = cuda_event_open;
    be->event_close = cuda_event_close;
}

void kvd__cuda_staging_release(cuda_backend_t *cb)
{
    int i;

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
}
