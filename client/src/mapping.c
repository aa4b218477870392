/*
 * Mappings of shared memory: memfd pages mapped with mmap, device memory
 * opened through CUDA IPC (cuda.c), and import regions built from them.
 */
#define _GNU_SOURCE /* memfd_create */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef KVD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

enum map_how {
    MAP_NONE = 0, /* handle or descriptor only */
    MAP_MMAP = 1,
    MAP_IPC = 2,
    MAP_VMM = 3,
};

/* The public struct first, so a kvd_mapping_t * is a mapping_t *. */
typedef struct mapping {
    kvd_mapping_t pub;
    int how;
    uint64_t vmm_mapped;
    unsigned long long vmm_alloc;
} mapping_t;

static mapping_t *mapping_new(int32_t kind, uint64_t bytes)
{
    mapping_t *m = calloc(1, sizeof(*m));

    if (m == NULL)
        return NULL;
    m->pub.kind = kind;
    m->pub.bytes = bytes;
    m->pub.fd = -1;
    m->pub.device_ordinal = -1;
    return m;
}

kvd_status_t kvd__mapping_from_fd(const kvd_client_t *cli, int fd, uint64_t bytes, int32_t kind,
                                  int32_t device, kvd_mapping_t **out)
{
    mapping_t *m;
    kvd_status_t st;

    if (fd < 0 || bytes == 0)
        return kvd__client_fail(cli, KVD_EPROTO, "nothing to map: descriptor %d, %llu bytes", fd,
                                (unsigned long long)bytes);
    if (bytes > SIZE_MAX)
        return kvd__client_fail(cli, KVD_EOVERFLOW, "%llu bytes do not fit this address space",
                                (unsigned long long)bytes);
    m = mapping_new(kind, bytes);
    if (m == NULL)
        return kvd__client_fail(cli, KVD_ENOMEM, "out of memory");
    if (kind == KVD_MEM_HOST) {
        void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

        if (p == MAP_FAILED) {
            st = kvd__client_fail(cli, errno == ENOMEM ? KVD_ENOMEM : KVD_EIO,
                                  "mmap of %llu shared bytes failed: %s", (unsigned long long)bytes,
                                  strerror(errno));
            goto fail;
        }
        m->pub.base = p;
        m->how = MAP_MMAP;
    } else if (kind == KVD_MEM_DEVICE_VMM) {
        st = kvd__cuda_vmm_map(cli, fd, bytes, device, &m->pub.base, &m->vmm_mapped, &m->vmm_alloc);
        if (st != KVD_OK)
            goto fail;
        m->how = MAP_VMM;
    } else {
        st = kvd__client_fail(cli, KVD_EINVAL, "cannot map a descriptor of kind %s",
                              kvd_mem_kind_name(kind));
        goto fail;
    }
    m->pub.fd = fd;
    m->pub.device_ordinal = device;
    *out = &m->pub;
    return KVD_OK;

fail:
    free(m);
    return st;
}

kvd_status_t kvd__mapping_from_ipc(const kvd_client_t *cli, const uint8_t *handle,
                                   size_t handle_len, uint64_t bytes, int32_t device,
                                   kvd_mapping_t **out)
{
    mapping_t *m;
    kvd_status_t st;

    if (handle == NULL || handle_len != KVD_IPC_HANDLE_BYTES)
        return kvd__client_fail(cli, KVD_EPROTO, "CUDA IPC handle of %zu bytes, not %d", handle_len,
                                KVD_IPC_HANDLE_BYTES);
    m = mapping_new(KVD_MEM_DEVICE, bytes);
    if (m == NULL)
        return kvd__client_fail(cli, KVD_ENOMEM, "out of memory");
    memcpy(m->pub.ipc_handle, handle, KVD_IPC_HANDLE_BYTES);
    st = kvd__cuda_ipc_open(cli, handle, device, &m->pub.base);
    if (st != KVD_OK) {
        free(m);
        return st;
    }
    m->how = MAP_IPC;
    m->pub.device_ordinal = device;
    *out = &m->pub;
    return KVD_OK;
}

kvd_status_t kvd__mapping_unmapped(const kvd_client_t *cli, int32_t kind, int fd,
                                   const uint8_t *handle, size_t handle_len, uint64_t bytes,
                                   kvd_mapping_t **out)
{
    mapping_t *m = mapping_new(kind, bytes);

    if (m == NULL)
        return kvd__client_fail(cli, KVD_ENOMEM, "out of memory");
    m->pub.fd = fd;
    if (handle != NULL && handle_len == KVD_IPC_HANDLE_BYTES)
        memcpy(m->pub.ipc_handle, handle, KVD_IPC_HANDLE_BYTES);
    m->how = MAP_NONE;
    *out = &m->pub;
    return KVD_OK;
}

void kvd_mapping_destroy(kvd_mapping_t **p)
{
    mapping_t *m;

    if (p == NULL || *p == NULL)
        return;
    m = (mapping_t *)*p;
    *p = NULL;
    switch (m->how) {
    case MAP_MMAP: munmap(m->pub.base, (size_t)m->pub.bytes); break;
    case MAP_IPC: kvd__cuda_ipc_close(m->pub.base); break;
    case MAP_VMM: kvd__cuda_vmm_unmap(m->pub.base, m->vmm_mapped, m->vmm_alloc); break;
    default: break;
    }
    if (m->pub.fd >= 0)
        close(m->pub.fd);
    free(m);
}

void *kvd_mapping_layer(const kvd_mapping_t *m, uint32_t layer, bool v)
{
    const kvd_pool_info_t *pi;
    uint64_t off;

    if (m == NULL || m->base == NULL)
        return NULL;
    pi = &m->pool;
    if (layer >= pi->num_layers || (v && pi->mla) || (layer > 0 && pi->layer_stride == 0))
        return NULL;
    off = (uint64_t)layer * pi->layer_stride + (v ? pi->v_offset : 0);
    if (off >= m->bytes)
        return NULL;
    return (uint8_t *)m->base + off;
}

kvd_status_t kvd_mapping_create_host(uint64_t bytes, kvd_mapping_t **out)
{
    mapping_t *m = NULL;
    void *p;
    int fd = -1;
    kvd_status_t st;

    if (out == NULL)
        return kvd__client_fail(NULL, KVD_ENULL, "out is NULL");
    *out = NULL;
    if (bytes == 0 || bytes > SIZE_MAX || bytes > (uint64_t)INT64_MAX)
        return kvd__client_fail(NULL, KVD_EINVAL, "cannot make %llu bytes of shared host memory",
                                (unsigned long long)bytes);
    fd = memfd_create("kvdock-client", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return kvd__client_fail(NULL, KVD_EIO, "memfd_create: %s", strerror(errno));
    if (ftruncate(fd, (off_t)bytes) < 0) {
        st = kvd__client_fail(NULL, KVD_ENOMEM, "ftruncate of a memfd to %llu bytes: %s",
                              (unsigned long long)bytes, strerror(errno));
        goto fail;
    }
    /* The size is fixed for good: the daemon maps these pages and refuses
     * a memfd that could shrink under it (SIGBUS). */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
        st = kvd__client_fail(NULL, KVD_EIO, "sealing the memfd: %s", strerror(errno));
        goto fail;
    }
    p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        st = kvd__client_fail(NULL, KVD_ENOMEM, "mmap of %llu bytes: %s", (unsigned long long)bytes,
                              strerror(errno));
        goto fail;
    }
    m = mapping_new(KVD_MEM_HOST, bytes);
    if (m == NULL) {
        munmap(p, (size_t)bytes);
        st = kvd__client_fail(NULL, KVD_ENOMEM, "out of memory");
        goto fail;
    }
    m->pub.base = p;
    m->pub.fd = fd;
    m->how = MAP_MMAP;
    *out = &m->pub;
    return KVD_OK;

fail:
    close(fd);
    return st;
}

kvd_status_t kvd_import_region_from_mapping(const kvd_mapping_t *m, kvd_import_region_t *region)
{
    if (m == NULL || region == NULL)
        return kvd__client_fail(NULL, KVD_ENULL, "mapping or region is NULL");
    if (m->kind != KVD_MEM_HOST || m->fd < 0)
        return kvd__client_fail(NULL, KVD_EINVAL,
                                "only a host mapping with its descriptor can be an import region");
    memset(region, 0, sizeof(*region));
    region->kind = KVD_MEM_HOST;
    region->fd = m->fd;
    region->bytes = m->bytes;
    return KVD_OK;
}

/* Copy between host memory and a mapping (dir: cudaMemcpy's kind). */
static kvd_status_t mapping_copy(const kvd_mapping_t *m, uint64_t offset, void *host, uint64_t len,
                                 int to_mapping)
{
    char *at;

    if (m == NULL || m->base == NULL || (host == NULL && len > 0))
        return kvd__client_fail(NULL, KVD_ENULL, "no mapping or no host memory");
    if (offset > m->bytes || len > m->bytes - offset)
        return kvd__client_fail(NULL, KVD_ERANGE, "bytes [%llu, %llu) pass the mapping's %llu",
                                (unsigned long long)offset, (unsigned long long)(offset + len),
                                (unsigned long long)m->bytes);
    at = (char *)m->base + offset;
    if (m->kind == KVD_MEM_HOST) {
        if (to_mapping)
            memcpy(at, host, len);
        else
            memcpy(host, at, len);
        return KVD_OK;
    }
#ifdef KVD_HAVE_CUDA
    if (cudaMemcpy(to_mapping ? (void *)at : host, to_mapping ? (const void *)host : at, len,
                   cudaMemcpyDefault) != cudaSuccess)
        return kvd__client_fail(NULL, KVD_ECUDA, "cudaMemcpy: %s",
                                cudaGetErrorString(cudaGetLastError()));
    return KVD_OK;
#else
    return kvd__client_fail(NULL, KVD_ENOTSUP, "this libkvdock was built without CUDA: it cannot "
                            "copy to or from device memory");
#endif
}

kvd_status_t kvd_mapping_write(kvd_mapping_t *m, uint64_t offset, const void *src, uint64_t len)
{
    return mapping_copy(m, offset, (void *)src, len, 1);
}

kvd_status_t kvd_mapping_read(const kvd_mapping_t *m, uint64_t offset, void *dst, uint64_t len)
{
    return mapping_copy(m, offset, dst, len, 0);
}
