/*
 * CUDA interop of the client: open legacy IPC memory handles, map VMM
 * allocations received as descriptors, describe the caller's device memory
 * for an import, and take IPC event handles.
 *
 * Driver functions are reached through cudaGetDriverEntryPointByVersion:
 * the library never links libcuda (CI machines have no driver), only the
 * CUDA runtime.  Without CUDA every entry point says KVD_ENOTSUP.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

#ifdef KVD_HAVE_CUDA

#include <cuda.h> /* types and enums only: nothing is linked from libcuda */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

typedef CUresult (*get_address_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr p);
typedef CUresult (*import_shareable_fn)(CUmemGenericAllocationHandle *h, void *os_handle,
                                        CUmemAllocationHandleType type);
typedef CUresult (*export_shareable_fn)(void *os_handle, CUmemGenericAllocationHandle h,
                                        CUmemAllocationHandleType type, unsigned long long flags);
typedef CUresult (*retain_handle_fn)(CUmemGenericAllocationHandle *h, void *addr);
typedef CUresult (*address_reserve_fn)(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                       unsigned long long flags);
typedef CUresult (*address_free_fn)(CUdeviceptr p, size_t size);
typedef CUresult (*mem_map_fn)(CUdeviceptr p, size_t size, size_t offset,
                               CUmemGenericAllocationHandle h, unsigned long long flags);
typedef CUresult (*mem_unmap_fn)(CUdeviceptr p, size_t size);
typedef CUresult (*set_access_fn)(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc,
                                  size_t count);
typedef CUresult (*mem_release_fn)(CUmemGenericAllocationHandle h);

static struct {
    get_address_range_fn get_address_range;
    import_shareable_fn import_shareable;
    export_shareable_fn export_shareable;
    retain_handle_fn retain_handle;
    address_reserve_fn address_reserve;
    address_free_fn address_free;
    mem_map_fn mem_map;
    mem_unmap_fn mem_unmap;
    set_access_fn set_access;
    mem_release_fn mem_release;
    bool ok;
    char why[160];
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void *entry_point(const char *name)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e;

#if CUDART_VERSION >= 12050
    e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
#else
    e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return fn;
}

static void drv_load(void)
{
#define LOAD_(field, name)                                                                         \
    do {                                                                                           \
        drv.field = (__typeof__(drv.field))entry_point(name);                                      \
        if (drv.field == NULL) {                                                                   \
            snprintf(drv.why, sizeof(drv.why), "CUDA driver entry point %s not found", name);      \
            return;                                                                                \
        }                                                                                          \
    } while (0)
    LOAD_(get_address_range, "cuMemGetAddressRange");
    LOAD_(import_shareable, "cuMemImportFromShareableHandle");
    LOAD_(export_shareable, "cuMemExportToShareableHandle");
    LOAD_(retain_handle, "cuMemRetainAllocationHandle");
    LOAD_(address_reserve, "cuMemAddressReserve");
    LOAD_(address_free, "cuMemAddressFree");
    LOAD_(mem_map, "cuMemMap");
    LOAD_(mem_unmap, "cuMemUnmap");
    LOAD_(set_access, "cuMemSetAccess");
    LOAD_(mem_release, "cuMemRelease");
#undef LOAD_
    drv.ok = true;
}

/* Initialise the runtime (and its primary context) and the driver table. */
static kvd_status_t cuda_ready(const kvd_client_t *cli)
{
    cudaError_t e = cudaFree(0);

    if (e != cudaSuccess) {
        cudaGetLastError();
        return kvd__client_fail(cli, KVD_ENODEV, "CUDA is not usable here: %s",
                                cudaGetErrorString(e));
    }
    pthread_once(&drv_once, drv_load);
    if (!drv.ok)
        return kvd__client_fail(cli, KVD_ECUDA, "%s", drv.why);
    return KVD_OK;
}

static kvd_status_t cuda_fail(const kvd_client_t *cli, const char *what, cudaError_t e)
{
    cudaGetLastError(); /* clear a sticky-free error */
    return kvd__client_fail(cli, KVD_ECUDA, "%s: %s (%s)", what, cudaGetErrorString(e),
                            cudaGetErrorName(e));
}

static kvd_status_t drv_fail(const kvd_client_t *cli, const char *what, CUresult r)
{
    return kvd__client_fail(cli, KVD_ECUDA, "%s failed: CUDA driver error %d", what, (int)r);
}

/*
 * Legacy IPC handles are opened once per process and shared by every
 * mapping of the same allocation (a second cudaIpcOpenMemHandle of one
 * handle in one process is an error): a small table with counts.
 */
typedef struct ipc_open {
    uint8_t handle[KVD_IPC_HANDLE_BYTES];
    void *base;
    unsigned refs;
} ipc_open_t;

static pthread_mutex_t ipc_mu = PTHREAD_MUTEX_INITIALIZER;
static ipc_open_t *ipc_tab;
static size_t ipc_n, ipc_cap;

kvd_status_t kvd__cuda_ipc_open(const kvd_client_t *cli, const uint8_t *handle, int device,
                                void **base)
{
    cudaIpcMemHandle_t h;
    cudaError_t e;
    void *p = NULL;
    kvd_status_t st = cuda_ready(cli);

    (void)device; /* opened on the caller's current device */
    if (st != KVD_OK)
        return st;
    pthread_mutex_lock(&ipc_mu);
    for (size_t i = 0; i < ipc_n; i++) {
        if (memcmp(ipc_tab[i].handle, handle, KVD_IPC_HANDLE_BYTES) == 0) {
            ipc_tab[i].refs++;
            *base = ipc_tab[i].base;
            pthread_mutex_unlock(&ipc_mu);
            return KVD_OK;
        }
    }
    if (ipc_n == ipc_cap) {
        size_t cap = ipc_cap ? ipc_cap * 2 : 8;
        ipc_open_t *n = realloc(ipc_tab, cap * sizeof(*n));

        if (n == NULL) {
            pthread_mutex_unlock(&ipc_mu);
            return kvd__client_fail(cli, KVD_ENOMEM, "out of memory");
        }
        ipc_tab = n;
        ipc_cap = cap;
    }
    memcpy(&h, handle, sizeof(h));
    e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        pthread_mutex_unlock(&ipc_mu);
        return cuda_fail(cli, "cudaIpcOpenMemHandle", e);
    }
    memcpy(ipc_tab[ipc_n].handle, handle, KVD_IPC_HANDLE_BYTES);
    ipc_tab[ipc_n].base = p;
    ipc_tab[ipc_n].refs = 1;
    ipc_n++;
    pthread_mutex_unlock(&ipc_mu);
    *base = p;
    return KVD_OK;
}

void kvd__cuda_ipc_close(void *base)
{
    if (base == NULL)
        return;
    pthread_mutex_lock(&ipc_mu);
    for (size_t i = 0; i < ipc_n; i++) {
        if (ipc_tab[i].base != base)
            continue;
        if (--ipc_tab[i].refs == 0) {
            if (cudaIpcCloseMemHandle(base) != cudaSuccess)
                cudaGetLastError();
            ipc_tab[i] = ipc_tab[--ipc_n];
        }
        break;
    }
    pthread_mutex_unlock(&ipc_mu);
}

kvd_status_t kvd__cuda_vmm_map(const kvd_client_t *cli, int fd, uint64_t bytes, int device,
                               void **base, uint64_t *mapped, unsigned long long *alloc)
{
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    CUmemAccessDesc acc;
    CUresult r;
    int dev = 0;
    kvd_status_t st = cuda_ready(cli);

    (void)device;
    if (st != KVD_OK)
        return st;
    if (cudaGetDevice(&dev) != cudaSuccess)
        return cuda_fail(cli, "cudaGetDevice", cudaGetLastError());
    r = drv.import_shareable(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS)
        return drv_fail(cli, "cuMemImportFromShareableHandle", r);
    r = drv.address_reserve(&va, (size_t)bytes, 0, 0, 0);
    if (r != CUDA_SUCCESS) {
        st = drv_fail(cli, "cuMemAddressReserve", r);
        goto fail;
    }
    r = drv.mem_map(va, (size_t)bytes, 0, h, 0);
    if (r != CUDA_SUCCESS) {
        st = drv_fail(cli, "cuMemMap", r);
        drv.address_free(va, (size_t)bytes);
        goto fail;
    }
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = drv.set_access(va, (size_t)bytes, &acc, 1);
    if (r != CUDA_SUCCESS) {
        st = drv_fail(cli, "cuMemSetAccess", r);
        drv.mem_unmap(va, (size_t)bytes);
        drv.address_free(va, (size_t)bytes);
        goto fail;
    }
    *base = (void *)(uintptr_t)va;
    *mapped = bytes;
    *alloc = h;
    return KVD_OK;

fail:
    drv.mem_release(h);
    return st;
}

void kvd__cuda_vmm_unmap(void *base, uint64_t mapped, unsigned long long alloc)
{
    if (!drv.ok || base == NULL)
        return;
    drv.mem_unmap((CUdeviceptr)(uintptr_t)base, (size_t)mapped);
    drv.address_free((CUdeviceptr)(uintptr_t)base, (size_t)mapped);
    drv.mem_release(alloc);
}

kvd_status_t kvd_import_region_from_device_ptr(const void *dptr, kvd_import_region_t *region,
                                               uint64_t *offset)
{
    CUdeviceptr base = 0;
    size_t size = 0;
    cudaIpcMemHandle_t h;
    cudaError_t e;
    CUresult r;
    kvd_status_t st;

    if (dptr == NULL || region == NULL || offset == NULL)
        return kvd__client_fail(NULL, KVD_ENULL, "dptr, region or offset is NULL");
    st = cuda_ready(NULL);
    if (st != KVD_OK)
        return st;
    r = drv.get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)dptr);
    if (r != CUDA_SUCCESS)
        return kvd__client_fail(
            NULL, KVD_EINVAL, "%p is not device memory of this process (cuMemGetAddressRange: %d)",
            dptr, (int)r);
    e = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base);
    if (e != cudaSuccess)
        return cuda_fail(NULL, "cudaIpcGetMemHandle (is this cudaMalloc memory?)", e);
    memset(region, 0, sizeof(*region));
    region->kind = KVD_MEM_DEVICE;
    memcpy(region->ipc_handle, &h, sizeof(h));
    region->fd = -1;
    region->bytes = size;
    *offset = (uint64_t)((uintptr_t)dptr - (uintptr_t)base);
    return KVD_OK;
}

kvd_status_t kvd_import_region_from_vmm_ptr(const void *dptr, kvd_import_region_t *region,
                                            uint64_t *offset)
{
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r;
    int fd = -1;
    kvd_status_t st;

    if (dptr == NULL || region == NULL || offset == NULL)
        return kvd__client_fail(NULL, KVD_ENULL, "dptr, region or offset is NULL");
    st = cuda_ready(NULL);
    if (st != KVD_OK)
        return st;
    r = drv.retain_handle(&h, (void *)dptr);
    if (r != CUDA_SUCCESS)
        return kvd__client_fail(
            NULL, KVD_EINVAL,
            "%p is not memory mapped with the VMM API (cuMemRetainAllocationHandle: %d)", dptr,
            (int)r);
    r = drv.get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)dptr);
    if (r != CUDA_SUCCESS) {
        st = drv_fail(NULL, "cuMemGetAddressRange", r);
        goto out;
    }
    r = drv.export_shareable(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) {
        st = kvd__client_fail(NULL, KVD_ECUDA,
                              "cuMemExportToShareableHandle failed (%d): was the allocation made "
                              "with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR?",
                              (int)r);
        goto out;
    }
    memset(region, 0, sizeof(*region));
    region->kind = KVD_MEM_DEVICE_VMM;
    region->fd = fd;
    region->bytes = size;
    *offset = (uint64_t)((uintptr_t)dptr - (uintptr_t)base);
    st = KVD_OK;
out:
    drv.mem_release(h); /* the retain above */
    return st;
}

kvd_status_t kvd_event_ipc_handle(void *cuda_event, uint8_t out[KVD_IPC_HANDLE_BYTES])
{
    cudaIpcEventHandle_t h;
    cudaError_t e;

    if (cuda_event == NULL || out == NULL)
        return kvd__client_fail(NULL, KVD_ENULL, "event or out is NULL");
    e = cudaIpcGetEventHandle(&h, (cudaEvent_t)cuda_event);
    if (e != cudaSuccess)
        return cuda_fail(NULL,
                         "cudaIpcGetEventHandle (was the event made with cudaEventInterprocess "
                         "| cudaEventDisableTiming?)",
                         e);
    memcpy(out, &h, KVD_IPC_HANDLE_BYTES);
    return KVD_OK;
}

typedef CUresult (*wait_value32_fn)(CUstream s, CUdeviceptr addr, cuuint32_t value,
                                   unsigned int flags);

kvd_status_t kvd_stream_wait_value32(void *cuda_stream, const void *addr, uint32_t value)
{
    static wait_value32_fn fn;
    CUresult r;

    if (addr == NULL)
        return kvd__client_fail(NULL, KVD_ENULL, "addr is NULL");
    if ((uintptr_t)addr % sizeof(uint32_t) != 0)
        return kvd__client_fail(NULL, KVD_EALIGN, "a flag is a 4-byte aligned uint32");
    if (fn == NULL) /* a race here only looks the same pointer up twice */
        fn = (wait_value32_fn)entry_point("cuStreamWaitValue32");
    if (fn == NULL)
        return kvd__client_fail(NULL, KVD_ENOTSUP,
                                "CUDA driver entry point cuStreamWaitValue32 not found");
    r = fn((CUstream)cuda_stream, (CUdeviceptr)(uintptr_t)addr, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS)
        return kvd__client_fail(NULL, KVD_ECUDA, "cuStreamWaitValue32: CUresult %d (is the flag "
                                "in device memory, or host memory registered with CUDA?)",
                                (int)r);
    return KVD_OK;
}

#else /* !KVD_HAVE_CUDA */

#define NO_CUDA_ "libkvdock was built without CUDA"

kvd_status_t kvd_stream_wait_value32(void *cuda_stream, const void *addr, uint32_t value)
{
    (void)cuda_stream;
    (void)addr;
    (void)value;
    return kvd__client_fail(NULL, KVD_ENOTSUP, NO_CUDA_ ": cannot wait on a flag");
}

kvd_status_t kvd__cuda_ipc_open(const kvd_client_t *cli, const uint8_t *handle, int device,
                                void **base)
{
    return kvd__client_fail(cli, KVD_ENOTSUP, NO_CUDA_ ": cannot open a CUDA IPC memory handle");
}

void kvd__cuda_ipc_close(void *base)
{
}

kvd_status_t kvd__cuda_vmm_map(const kvd_client_t *cli, int fd, uint64_t bytes, int device,
                               void **base, uint64_t *mapped, unsigned long long *alloc)
{
    return kvd__client_fail(cli, KVD_ENOTSUP, NO_CUDA_ ": cannot map CUDA VMM memory");
}

void kvd__cuda_vmm_unmap(void *base, uint64_t mapped, unsigned long long alloc)
{
}

kvd_status_t kvd_import_region_from_device_ptr(const void *dptr, kvd_import_region_t *region,
                                               uint64_t *offset)
{
    return kvd__client_fail(NULL, KVD_ENOTSUP, NO_CUDA_ ": cannot describe device memory");
}

kvd_status_t kvd_import_region_from_vmm_ptr(const void *dptr, kvd_import_region_t *region,
                                            uint64_t *offset)
{
    return kvd__client_fail(NULL, KVD_ENOTSUP, NO_CUDA_ ": cannot export VMM memory");
}

kvd_status_t kvd_event_ipc_handle(void *cuda_event, uint8_t out[KVD_IPC_HANDLE_BYTES])
{
    return kvd__client_fail(NULL, KVD_ENOTSUP, NO_CUDA_ ": cannot take an IPC event handle");
}

#endif /* KVD_HAVE_CUDA */
