/*
 * CUDA plumbing shared by the kernel library's entry points: device
 * probing, error mapping, grid sizing.
 */
#include <stdio.h>
#include <string.h>

#include "cuda_common.cuh"

#define KVD_MAX_DEVICES 64

/* Per-device SM count, filled on first use; 0 = not yet known. */
static int sm_counts[KVD_MAX_DEVICES];

kvd_status_t kvd__cuda_fail(cudaError_t err, const char *what, const char *file, int line)
{
    const char *base = strrchr(file, '/');
    (void)cudaGetLastError(); /* clear the (non-sticky) error */
    return kvd__fail(KVD_ECUDA, "%s: %s (%s) at %s:%d", what, cudaGetErrorName(err),
                     cudaGetErrorString(err), base ? base + 1 : file, line);
}

kvd_status_t kvd__cuda_sm_count(int *sm_count)
{
    int dev;
    KVD_CUDA_TRY(cudaGetDevice(&dev));
    if (dev >= 0 && dev < KVD_MAX_DEVICES && sm_counts[dev] > 0) {
        *sm_count = sm_counts[dev];
        return KVD_OK;
    }
    int n;
    KVD_CUDA_TRY(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    if (dev >= 0 && dev < KVD_MAX_DEVICES)
        sm_counts[dev] = n; /* racing writers store the same value */
    *sm_count = n;
    return KVD_OK;
}

kvd_status_t kvd__cuda_limits(const kvd_launch_t *launch, kvd_grid_limits_t *g)
{
    kvd_status_t st = kvd__cuda_sm_count(&g->sms);
    if (st != KVD_OK)
        return st;
    g->resident = (int64_t)g->sms * KVD_MIN_BLOCKS_PER_SM;
    g->budget = launch && launch->max_blocks > 0 ? (int64_t)launch->max_blocks : INT64_MAX;
    g->one_wave = g->resident < g->budget ? g->resident : g->budget;
    const int64_t w = g->resident * KVD_ONE_PASS_WAVES;
    g->waves = w < g->budget ? w : g->budget;
    return KVD_OK;
}

/* Devices whose kernels are loaded. */
static int kernels_loaded[KVD_MAX_DEVICES];

void kvd__cuda_load_kernels(void)
{
    int dev;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    const bool tracked = dev >= 0 && dev < KVD_MAX_DEVICES;
    if (tracked && __atomic_load_n(&kernels_loaded[dev], __ATOMIC_ACQUIRE))
        return;
    kvd__load_copy_rows_kernels(); /* racing threads load twice: harmless */
    kvd__load_fp8_kernels();
    kvd__load_gather_kernels();
    (void)cudaGetLastError();
    if (tracked)
        __atomic_store_n(&kernels_loaded[dev], 1, __ATOMIC_RELEASE);
}

/* Never launched: only asked whether this card has code for it. */
__global__ void probe_kernel(void) {}

extern "C" kvd_status_t kvd_cuda_load_kernels(void)
{
    cudaFuncAttributes attr;
    int dev;

    kvd__clear_error();
    KVD_CUDA_TRY(cudaGetDevice(&dev));
    kvd__cuda_load_kernels();
    /* a card this build has no code for loads nothing: say so */
    KVD_CUDA_TRY(cudaFuncGetAttributes(&attr, (const void *)probe_kernel));
    return KVD_OK;
}

extern "C" kvd_status_t kvd_cuda_probe(char *why, size_t why_len)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        int driver = 0;
        /* no driver at all reads as "insufficient" to the runtime: say which */
        if (why && why_len && cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0)
            snprintf(why, why_len, "no usable CUDA device: no NVIDIA driver (libcuda.so.1 "
                     "not found)");
        else if (why && why_len)
            snprintf(why, why_len, "no usable CUDA device: %s",
                     err != cudaSuccess ? cudaGetErrorString(err) : "none found");
        (void)cudaGetLastError();
        return KVD_ENODEV;
    }
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        if (why && why_len)
            snprintf(why, why_len, "CUDA device %d cannot be queried", dev);
        (void)cudaGetLastError();
        return KVD_ENODEV;
    }
    /* Ask for one of this library's kernels: fails when the build carries no
     * code this card can run (built for other architectures). */
    cudaFuncAttributes attr;
    err = cudaFuncGetAttributes(&attr, (const void *)probe_kernel);
    if (err != cudaSuccess) {
        if (why && why_len)
            snprintf(why, why_len,
                     "CUDA device %d (sm_%d%d) cannot run this build's kernels: %s "
                     "(rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%d)",
                     dev, major, minor, cudaGetErrorString(err), major, minor);
        (void)cudaGetLastError();
        return KVD_ENODEV;
    }
    if (why && why_len)
        why[0] = '\0';
    return KVD_OK;
}
