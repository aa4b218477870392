/*
 * Round 16 experiment (row_path.py loads it as a module of its own and
 * times it in CUDA graphs): the block-per-row kernels of a store and of a
 * per-layer MLA transfer in shapes between the library's copy_row_blocks
 * and the seed's Triton kernels.  With the host's pace out, round 15 found
 * the library 0.03-0.05 us behind the seed at store N=1 and 0.04-0.08 us
 * behind at MLA 64 rows.  Rows are int64-indexed, 16-byte vectors.
 *
 *   nvcc -cubin -O3 -arch=sm_90 row_variants.cu -o row_variants.cubin
 *
 * Transfers (one buffer, block i copies pair i, thread t vector t):
 *   t_lib       copy_row_blocks<uint4, kOneLayer, true> as in the library
 *               (ec6bc7b): both indices tested before the row load;
 *   t_src       the row load waits on the source index alone and is
 *               pinned; the destination's tests come after it
 *               (round 15's next-transfer-order patch);
 *   t_src128    t_src in blocks of 128 threads, lanes past the row idle (the
 *               seed's block for 576-element rows);
 *   t_pred      no branch: the row load predicated on the source index's
 *               test, the store on both (the library's semantics, the out-of-
 *               range count left out);
 *   t_seed      the seed's semantics: no test of either index, every lane
 *               past the row masked (a floor, not a candidate).
 * Stores (two buffers on y, block i stores token i):
 *   s_lib       copy_row_blocks<uint4, kStore, true> as in the library
 *               (ec6bc7b): the token row through ld.volatile before the
 *               slot's tests;
 *   s_weak      a weak row load, the slot's tests and the store predicated
 *               (no branch for ptxas to sink the load below);
 *   s_nc        s_weak with the row through the non-coherent path.
 *
 * Round 16 call 1 put s_weak and s_nc 0.39 us behind: ptxas turned the
 * predicated store into an early exit and sank the weak row load below it
 * (their SASS, call 3).  The library's SASS (call 3) has the fast path
 * behind taken branches (the out-of-range count laid out first) and reads
 * a store's destination from the second constant line only once the slot
 * index is back; the seed's is straight-line, every constant read while
 * its loads are in flight.  Round 16 call 4:
 *   t_cold      t_src with the padding and out-of-range paths marked
 *               unlikely, so that the copy falls through, and each index
 *               tested once, unsigned (padding is huge so);
 *   s_cold      s_lib so;
 *   s_sel       s_cold with K or V picked by selects on blockIdx.y, not
 *               an indexed constant read;
 *   s_l2        s_cold over StoreL2: the destinations in the first line,
 *               the strides in the second, so that the row load itself
 *               fetches every line the store needs.
 * The hint changed nothing: the cubin is the same byte for byte with
 * UNLIKELY(c) defined as (c), and ptxas still lays the copy out behind a
 * taken branch (call 4's SASS).  What changed the machine code is the
 * single unsigned test: one compare and branch fewer before the store.
 * For round 17 (written in round 16, not yet run on a GPU):
 *   t_ool       t_cold's tests without an early return: the copy nested
 *               under them, the out-of-range count after it, in a
 *               function kept out of line, so that the copy need not
 *               sit behind a taken branch.
 * Round 17 call 1 put t_ool 0.06-0.07 us behind t_cold.  Round 17:
 *   t_pred_oob  t_pred with the out-of-range count after the store:
 *               straight-line, the seed's SASS plus the index tests and
 *               the count's tail.  Call 3 had it 0.04 us ahead of t_lib's
 *               library at MLA 64 (32 pairs); the library took it
 *               (round 17 call 6).
 */
#include <cstddef>
#include <cstdint>

/* The library's one-layer block (RowBlocksOf<Rows::kOneLayer>, 56 bytes). */
struct RowView {
    const void *dst_idx;
    const void *src_idx;
    const char *src;
    char *dst;
    uint32_t src_stride; /* vectors between rows */
    uint32_t dst_stride;
    uint32_t src_slots;
    uint32_t dst_slots;
};
struct OneLayer {
    RowView view;
    unsigned long long *oob;
};
/* The library's store block (RowBlocksOf<Rows::kStore>, 72 bytes). */
struct Store {
    const void *dst_idx;
    const char *src[2];
    uint32_t src_stride[2];
    uint32_t dst_slots;
    uint32_t dst_stride[2];
    uint32_t unused;
    char *dst[2];
    unsigned long long *oob;
};
/* s_l2's: first line dst_idx, src, dst, dst_slots; second the strides. */
struct StoreL2 {
    const void *dst_idx;
    const char *src[2];
    char *dst[2];
    uint32_t dst_slots;
    uint32_t unused;
    uint32_t src_stride[2];
    uint32_t dst_stride[2];
    unsigned long long *oob;
};
static_assert(sizeof(StoreL2) == 72 && offsetof(StoreL2, src_stride) == 48, "StoreL2's lines");

__device__ __forceinline__ uint4 ld_volatile(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(__cvta_generic_to_global(p)));
    return v;
}
__device__ __forceinline__ int64_t ld_volatile(const int64_t *p)
{
    int64_t v;
    asm volatile("ld.volatile.global.s64 %0, [%1];" : "=l"(v) : "l"(__cvta_generic_to_global(p)));
    return v;
}
/* v = *p where live, else v unchanged (weak, or non-coherent with NC). */
template <bool NC> __device__ __forceinline__ void ld_if(uint4 &v, const uint4 *p, bool live)
{
    if (NC)
        asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %5, 0;\n\t"
                     "@q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
                     : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
                     : "l"(__cvta_generic_to_global(p)), "r"((uint32_t)live));
    else
        asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %5, 0;\n\t"
                     "@q ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
                     : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
                     : "l"(__cvta_generic_to_global(p)), "r"((uint32_t)live));
}
__device__ __forceinline__ void st_if(uint4 *p, uint4 v, bool live)
{
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %5, 0;\n\t"
                 "@q st.global.v4.u32 [%0], {%1, %2, %3, %4};\n\t}" ::"l"(__cvta_generic_to_global(p)),
                 "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"((uint32_t)live)
                 : "memory");
}

extern "C" __global__ void __launch_bounds__(1024) t_lib(const __grid_constant__ OneLayer p)
{
    const uint32_t i = blockIdx.x, t = threadIdx.x;
    const RowView &w = p.view;
    const int64_t d = ((const int64_t *)w.dst_idx)[i];
    const int64_t s = ((const int64_t *)w.src_idx)[i];
    if (d < 0 || s < 0)
        return;
    if (d >= (int64_t)w.dst_slots || s >= (int64_t)w.src_slots) {
        if (t == 0 && p.oob)
            atomicAdd(p.oob, 1ull);
        return;
    }
    const uint4 r = *((const uint4 *)w.src + (uint64_t)s * w.src_stride + t);
    *((uint4 *)w.dst + (uint64_t)d * w.dst_stride + t) = r;
}

template <int ROW> __device__ __forceinline__ void src_first(const OneLayer &p)
{
    const uint32_t i = blockIdx.x, t = threadIdx.x;
    const RowView &w = p.view;
    const int64_t d = ld_volatile((const int64_t *)w.dst_idx + i);
    const int64_t s = ((const int64_t *)w.src_idx)[i];
    if (s < 0 || s >= (int64_t)w.src_slots || (ROW && t >= ROW)) {
        if (s >= 0 && d >= 0 && t == 0 && p.oob)
            atomicAdd(p.oob, 1ull);
        return;
    }
    const uint4 r = ld_volatile((const uint4 *)w.src + (uint64_t)s * w.src_stride + t);
    if (d < 0)
        return;
    if (d >= (int64_t)w.dst_slots) {
        if (t == 0 && p.oob)
            atomicAdd(p.oob, 1ull);
        return;
    }
    *((uint4 *)w.dst + (uint64_t)d * w.dst_stride + t) = r;
}
extern "C" __global__ void __launch_bounds__(1024) t_src(const __grid_constant__ OneLayer p) { src_first<0>(p); }
/* 72 vectors: the bench's 1,152-byte MLA rows */
extern "C" __global__ void __launch_bounds__(128) t_src128(const __grid_constant__ OneLayer p) { src_first<72>(p); }

extern "C" __global__ void __launch_bounds__(1024) t_pred(const __grid_constant__ OneLayer p)
{
    const uint32_t i = blockIdx.x, t = threadIdx.x;
    const RowView &w = p.view;
    const int64_t d = ((const int64_t *)w.dst_idx)[i];
    const int64_t s = ((const int64_t *)w.src_idx)[i];
    const bool src_ok = (uint64_t)s < (uint64_t)w.src_slots;
    uint4 r = make_uint4(0, 0, 0, 0);
    ld_if<false>(r, (const uint4 *)w.src + (uint64_t)s * w.src_stride + t, src_ok);
    st_if((uint4 *)w.dst + (uint64_t)d * w.dst_stride + t, r, src_ok && (uint64_t)d < (uint64_t)w.dst_slots);
}

/* t_pred with the library's out-of-range count, after the store (round 17). */
extern "C" __global__ void __launch_bounds__(1024) t_pred_oob(const __grid_constant__ OneLayer p)
{
    const uint32_t i = blockIdx.x, t = threadIdx.x;
    const RowView &w = p.view;
    const int64_t d = ((const int64_t *)w.dst_idx)[i];
    const int64_t s = ((const int64_t *)w.src_idx)[i];
    const bool src_ok = (uint64_t)s < (uint64_t)w.src_slots, dst_ok = (uint64_t)d < (uint64_t)w.dst_slots;
    uint4 r = make_uint4(0, 0, 0, 0);
    ld_if<false>(r, (const uint4 *)w.src + (uint64_t)s * w.src_stride + t, src_ok);
    st_if((uint4 *)w.dst + (uint64_t)d * w.dst_stride + t, r, src_ok && dst_ok);
    if (!(src_ok && dst_ok) && s >= 0 && d >= 0 && t == 0 && p.oob)
        atomicAdd(p.oob, 1ull);
}

/* 72 vectors a row in blocks of 128, no index tests: the seed's kernel. */
extern "C" __global__ void __launch_bounds__(128) t_seed(const __grid_constant__ OneLayer p)
{
    const uint32_t i = blockIdx.x, t = threadIdx.x;
    const RowView &w = p.view;
    const int64_t s = ((const int64_t *)w.src_idx)[i];
    const int64_t d = ((const int64_t *)w.dst_idx)[i];
    uint4 r = make_uint4(0, 0, 0, 0);
    ld_if<false>(r, (const uint4 *)w.src + (uint64_t)s * w.src_stride + t, t < 72);
    st_if((uint4 *)w.dst + (uint64_t)d * w.dst_stride + t, r, t < 72);
}

extern "C" __global__ void __launch_bounds__(1024) s_lib(const __grid_constant__ Store p)
{
    const uint32_t i = blockIdx.x, t = threadIdx.x, b = blockIdx.y;
    const int64_t d = ((const int64_t *)p.dst_idx)[i];
    const uint4 r = ld_volatile((const uint4 *)p.src[b] + (uint64_t)i * p.src_stride[b] + t);
    if (d < 0)
        return;
    if (d >= (int64_t)p.dst_slots) {
        if (t == 0 && b == 0 && p.oob)
            atomicAdd(p.oob, 1ull);
        return;
    }
    *((uint4 *)p.dst[b] + (uint64_t)d * p.dst_stride[b] + t) = r;
}

template <bool NC> __device__ __forceinline__ void store_pred(const Store &p)
{
    const uint32_t i = blockIdx.x, t = threadIdx.x, b = blockIdx.y;
    const int64_t d = ((const int64_t *)p.dst_idx)[i];
    uint4 r = make_uint4(0, 0, 0, 0);
    ld_if<NC>(r, (const uint4 *)p.src[b] + (uint64_t)i * p.src_stride[b] + t, true);
    st_if((uint4 *)p.dst[b] + (uint64_t)d * p.dst_stride[b] + t, r, (uint64_t)d < (uint64_t)p.dst_slots);
}
extern "C" __global__ void __launch_bounds__(1024) s_weak(const __grid_constant__ Store p) { store_pred<false>(p); }
extern "C" __global__ void __launch_bounds__(1024) s_nc(const __grid_constant__ Store p) { store_pred<true>(p); }

#define UNLIKELY(c) __builtin_expect(!!(c), 0)

extern "C" __global__ void __launch_bounds__(1024) t_cold(const __grid_constant__ OneLayer p)
{
    const uint32_t i = blockIdx.x, t = threadIdx.x;
    const RowView &w = p.view;
    const int64_t d = ld_volatile((const int64_t *)w.dst_idx + i);
    const int64_t s = ((const int64_t *)w.src_idx)[i];
    if (UNLIKELY((uint64_t)s >= (uint64_t)w.src_slots)) {
        if (s >= 0 && d >= 0 && t == 0 && p.oob)
            atomicAdd(p.oob, 1ull);
        return;
    }
    const uint4 r = ld_volatile((const uint4 *)w.src + (uint64_t)s * w.src_stride + t);
    if (UNLIKELY((uint64_t)d >= (uint64_t)w.dst_slots)) {
        if (d >= 0 && t == 0 && p.oob)
            atomicAdd(p.oob, 1ull);
        return;
    }
    *((uint4 *)w.dst + (uint64_t)d * w.dst_stride + t) = r;
}

/* A store's slot and row with the error paths out of line; S is Store or
 * StoreL2, SEL picks K or V by selects. */
template <typename S, bool SEL> __device__ __forceinline__ void store_cold(const S &p)
{
    const uint32_t i = blockIdx.x, t = threadIdx.x, b = blockIdx.y;
    const int64_t d = ((const int64_t *)p.dst_idx)[i];
    const char *src = SEL ? (b ? p.src[1] : p.src[0]) : p.src[b];
    const uint32_t ss = SEL ? (b ? p.src_stride[1] : p.src_stride[0]) : p.src_stride[b];
    const uint4 r = ld_volatile((const uint4 *)src + (uint64_t)i * ss + t);
    if (UNLIKELY((uint64_t)d >= (uint64_t)p.dst_slots)) {
        if (d >= 0 && t == 0 && b == 0 && p.oob)
            atomicAdd(p.oob, 1ull);
        return;
    }
    char *dst = SEL ? (b ? p.dst[1] : p.dst[0]) : p.dst[b];
    const uint32_t ds = SEL ? (b ? p.dst_stride[1] : p.dst_stride[0]) : p.dst_stride[b];
    *((uint4 *)dst + (uint64_t)d * ds + t) = r;
}
extern "C" __global__ void __launch_bounds__(1024) s_cold(const __grid_constant__ Store p) { store_cold<Store, false>(p); }
extern "C" __global__ void __launch_bounds__(1024) s_sel(const __grid_constant__ Store p) { store_cold<Store, true>(p); }
extern "C" __global__ void __launch_bounds__(1024) s_l2(const __grid_constant__ StoreL2 p) { store_cold<StoreL2, false>(p); }

__device__ __noinline__ void count_oob(unsigned long long *oob) { atomicAdd(oob, 1ull); }

extern "C" __global__ void __launch_bounds__(1024) t_ool(const __grid_constant__ OneLayer p)
{
    const uint32_t i = blockIdx.x, t = threadIdx.x;
    const RowView &w = p.view;
    const int64_t d = ld_volatile((const int64_t *)w.dst_idx + i);
    const int64_t s = ((const int64_t *)w.src_idx)[i];
    const bool src_ok = (uint64_t)s < (uint64_t)w.src_slots, dst_ok = (uint64_t)d < (uint64_t)w.dst_slots;
    if (src_ok) {
        const uint4 r = ld_volatile((const uint4 *)w.src + (uint64_t)s * w.src_stride + t);
        if (dst_ok)
            *((uint4 *)w.dst + (uint64_t)d * w.dst_stride + t) = r;
    }
    if (!(src_ok && dst_ok) && s >= 0 && d >= 0 && t == 0 && p.oob)
        count_oob(p.oob);
}
