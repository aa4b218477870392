/*
 * Round 8 experiment: can Hopper's bulk copies (cp.async.bulk, the TMA's
 * untiled form) lift the large random-row device copies that stay below
 * 80% of the copy ceiling with register copies (per-layer MHA at 16,384
 * rows, per-layer MLA at 131,072, all-layer MLA at 1,024 x 61 layers)?
 *
 * Each lane of a warp owns one row's slot of shared memory and one
 * mbarrier: the warp loads R pairs of indices at once, each lane starts a
 * bulk load of its row into its slot, the next batch's indices load while
 * those are in flight, then each lane waits for its row and starts a bulk
 * store of it; the slots are reused once the stores have read them.  So a
 * warp keeps R rows in flight with a handful of registers, and an SM as
 * many rows as its shared memory holds.  Rows and addresses must be
 * multiples of 16 bytes.
 *
 *   nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC d2d_bulk.cu -o libd2d_bulk.so
 */
#include <cuda_runtime.h>
#include <stdint.h>

struct BulkArgs {
    const char *src[2];
    char *dst[2];
    const uint64_t *src_tab; /* per-layer bases (one buffer), or NULL */
    const uint64_t *dst_tab;
    int64_t src_stride, dst_stride;
    const int64_t *si, *di;
    int64_t count, tasks, row_bytes, slot_bytes;
    int nbufs, rows_per_warp;
};

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

struct Row {
    const char *s;
    char *d;
};

/* task t: pair fastest, then buffer, then layer */
__device__ __forceinline__ Row fetch(const BulkArgs &p, int64_t t)
{
    Row r = {nullptr, nullptr};
    if (t >= p.tasks)
        return r;
    const int64_t i = t % p.count, rest = t / p.count;
    const int buf = p.nbufs == 2 ? (int)(rest & 1) : 0;
    const int64_t layer = p.nbufs == 2 ? rest >> 1 : rest;
    const char *sb = p.src_tab ? (const char *)(uintptr_t)p.src_tab[layer] : p.src[buf];
    char *db = p.dst_tab ? (char *)(uintptr_t)p.dst_tab[layer] : p.dst[buf];
    const int64_t s = p.si[i], d = p.di[i];
    if (s < 0 || d < 0)
        return r;
    r.s = sb + s * p.src_stride;
    r.d = db + d * p.dst_stride;
    return r;
}

__global__ void bulk_rows(const BulkArgs p)
{
    extern __shared__ __align__(128) char smem[];
    const int warps = blockDim.x >> 5;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int R = p.rows_per_warp;
    const bool mine = lane < R;
    uint64_t *bars = (uint64_t *)(smem + (int64_t)warps * R * p.slot_bytes);
    char *slot = smem + (int64_t)(warp * R + lane) * p.slot_bytes;
    const uint32_t bar = smem_addr(&bars[warp * 32 + lane]);
    const uint32_t sslot = smem_addr(slot);
    if (mine)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();

    const int64_t step = (int64_t)gridDim.x * warps * R;
    int64_t base = ((int64_t)blockIdx.x * warps + warp) * R;
    Row cur = mine ? fetch(p, base + lane) : Row{nullptr, nullptr};
    uint32_t phase = 0;
    const uint32_t bytes = (uint32_t)p.row_bytes;
    for (; base < p.tasks; base += step) {
        const bool go = cur.s != nullptr;
        if (go) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(sslot), "l"(cur.s), "r"(bytes), "r"(bar)
                         : "memory");
        }
        const Row nxt = mine ? fetch(p, base + step + lane) : Row{nullptr, nullptr};
        if (go) {
            asm volatile("{\n\t.reg .pred done;\n"
                         "WAIT%=:\n\t"
                         "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                         "@!done bra WAIT%=;\n}" ::"r"(bar),
                         "r"(phase)
                         : "memory");
            phase ^= 1;
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(cur.d), "r"(sslot),
                         "r"(bytes)
                         : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        cur = nxt;
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

/* rows_per_warp lanes of each warp copy a row each; blocks_per_sm blocks of
 * warps_per_block warps on every SM (grid-stride).  Returns a CUDA error
 * code, or -1 when the shared memory does not fit. */
extern "C" int bulk_run(void *stream, const void *sk, const void *sv, void *dk, void *dv, const void *stab,
                        const void *dtab, int64_t src_stride, int64_t dst_stride, const void *si, const void *di,
                        int64_t count, int nbufs, int64_t layers, int64_t row_bytes, int rows_per_warp,
                        int warps_per_block, int blocks_per_sm)
{
    BulkArgs a;
    a.src[0] = (const char *)sk;
    a.src[1] = (const char *)sv;
    a.dst[0] = (char *)dk;
    a.dst[1] = (char *)dv;
    a.src_tab = (const uint64_t *)stab;
    a.dst_tab = (const uint64_t *)dtab;
    a.src_stride = src_stride;
    a.dst_stride = dst_stride;
    a.si = (const int64_t *)si;
    a.di = (const int64_t *)di;
    a.count = count;
    a.tasks = count * nbufs * layers;
    a.row_bytes = row_bytes;
    a.slot_bytes = (row_bytes + 127) / 128 * 128;
    a.nbufs = nbufs;
    a.rows_per_warp = rows_per_warp;
    const size_t smem = (size_t)warps_per_block * rows_per_warp * a.slot_bytes + (size_t)warps_per_block * 32 * 8;
    int dev, sms, most, fit = 0;
    cudaError_t e;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) != cudaSuccess)
        return e;
    if (smem > (size_t)most)
        return -1;
    if ((e = cudaFuncSetAttribute(bulk_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) !=
            cudaSuccess ||
        (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, bulk_rows, warps_per_block * 32, smem)) !=
            cudaSuccess)
        return e;
    if (fit < blocks_per_sm)
        return -1;
    int64_t blocks = (int64_t)sms * blocks_per_sm;
    const int64_t per_block = (int64_t)warps_per_block * rows_per_warp;
    const int64_t want = (a.tasks + per_block - 1) / per_block;
    if (blocks > want)
        blocks = want;
    bulk_rows<<<(unsigned)blocks, warps_per_block * 32, smem, (cudaStream_t)stream>>>(a);
    return cudaGetLastError();
}
