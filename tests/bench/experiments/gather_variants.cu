/*
 * Round 14 experiment (module_path.py with EXP_MP_VARIANTS=1 loads it as a
 * module of its own): the page-table gather's one-pass kernel in shapes
 * between the library's gather_even and the seed's Triton kernel, each on
 * gather_even's parameter block, to find in which step the library's loses
 * its 0.08-0.1 us at bs=1 under do_bench (the seed's own cubin, launched the
 * same way, does not: round 14 call 1).
 *
 *   nvcc -cubin -O3 -arch=sm_90 gather_variants.cu -o variants.cubin
 */
#include <cstdint>

struct GatherEven { /* gather.cu's, field for field */
    const void *req;
    const void *seq;
    const char *table;
    uint64_t table_rows;
    uint32_t table_stride;
    uint32_t cols;
    uint32_t max_pages;
    uint32_t page_shift;
    char *out;
    int64_t out_stride;
    int64_t dummy;
    unsigned long long *oob;
};

struct alignas(16) I4 {
    int v[4];
};

/* gather_even<int32, 4, int64, int32>: THREADS threads of 16-byte vectors,
 * rows on y (or on x), the out-of-range count (or not). */
template <int THREADS, bool ROWS_ON_X, bool OOB> __device__ __forceinline__ void even(const GatherEven &p)
{
    const uint32_t r = ROWS_ON_X ? blockIdx.x : blockIdx.y;
    const uint32_t b = ROWS_ON_X ? blockIdx.y : blockIdx.x;
    const int64_t req = ((const int64_t *)p.req)[r];
    const int len = ((const int *)p.seq)[r];
    const uint32_t c = (b * THREADS + threadIdx.x) * 4;
    const uint32_t pages = len > 0 ? (((uint32_t)len - 1) >> p.page_shift) + 1 : 0;
    uint32_t n = pages < p.cols ? pages : p.cols;
    n = (uint64_t)req < p.table_rows ? n : 0;
    const int *src = (const int *)(p.table + (uint64_t)req * p.table_stride) + c;
    I4 val = {{0, 0, 0, 0}};
    if (c < n)
        val = *(const I4 *)src;
    const int dummy = (int)p.dummy;
#pragma unroll
    for (int j = 0; j < 4; j++)
        val.v[j] = c + j < n ? val.v[j] : dummy;
    if (c < p.max_pages)
        *(I4 *)(p.out + (uint64_t)r * p.out_stride + (uint64_t)c * 4) = val;
    if (OOB && c == 0 && req >= 0 && (uint64_t)req >= p.table_rows && p.oob)
        atomicAdd(p.oob, 1ull);
}

/* One element per thread in blocks of 128, rows on x: the seed's grid;
 * CHECKS: the library's semantics (rows out of range are padding and
 * counted), else the seed's (no bounds: every index taken as valid). */
template <bool CHECKS> __device__ __forceinline__ void narrow(const GatherEven &p)
{
    const uint32_t r = blockIdx.x;
    const int len = ((const int *)p.seq)[r];
    const int64_t req = ((const int64_t *)p.req)[r];
    const uint32_t c = blockIdx.y * 128 + threadIdx.x;
    int n = (len + (1 << p.page_shift) - 1) >> p.page_shift;
    if (CHECKS)
        n = (uint64_t)req < p.table_rows ? min(n, (int)p.cols) : 0;
    const int *src = (const int *)(p.table + req * (int64_t)p.table_stride) + c;
    int v = (int)p.dummy;
    if ((int)c < n && c < p.max_pages)
        v = *src;
    if (c < p.max_pages)
        ((int *)(p.out + (int64_t)r * p.out_stride))[c] = v;
    if (CHECKS && c == 0 && req >= 0 && (uint64_t)req >= p.table_rows && p.oob)
        atomicAdd(p.oob, 1ull);
}

/* gather_even's work on parameters that fit the first 64-byte line of the
 * parameter bank (48 bytes from 0x210), as the seed's kernel reads one line:
 * page shift packed above the columns, output rows dense (out_stride given,
 * but a library kernel would take it from max_pages), dummy 0, no table
 * bound.  LINE2: 0 reads nothing else; 1 the dummy from the second line
 * after the table load is on its way (as gather_even does); 2 also the table
 * bound before it (the index check on the path). */
struct GatherL1 {
    const void *req;
    const void *seq;
    const char *table;
    char *out;
    uint32_t table_stride; /* bytes */
    uint32_t out_stride;   /* bytes */
    uint32_t cols_shift;   /* cols | page_shift << 27 */
    uint32_t max_pages;
};
static_assert(sizeof(GatherL1) == 48, "one line");
struct GatherL1Pad { /* the same, in a block as large as GatherEven (80 bytes) */
    GatherL1 a;
    char pad[32];
};
struct GatherL1X { /* the same, and a second line's table bound and dummy (56 bytes) */
    GatherL1 a;
    uint32_t table_rows;
    int32_t dummy;
};

template <int LINE2, typename P> __device__ __forceinline__ void line1(const P &q)
{
    const GatherL1 &p = *(const GatherL1 *)&q;
    const uint32_t r = blockIdx.y;
    const int64_t req = ((const int64_t *)p.req)[r];
    const int len = ((const int *)p.seq)[r];
    const uint32_t c = (blockIdx.x * 256 + threadIdx.x) * 4;
    const uint32_t shift = p.cols_shift >> 27, cols = p.cols_shift & ((1u << 27) - 1);
    const uint32_t pages = len > 0 ? (((uint32_t)len - 1) >> shift) + 1 : 0;
    uint32_t n = pages < cols ? pages : cols;
    if constexpr (LINE2 == 2)
        n = (uint64_t)req < ((const GatherL1X *)&q)->table_rows ? n : 0;
    const int *src = (const int *)(p.table + (uint64_t)req * p.table_stride) + c;
    I4 val = {{0, 0, 0, 0}};
    if (c < n)
        val = *(const I4 *)src;
    int dummy = 0;
    if constexpr (LINE2 > 0)
        dummy = ((const GatherL1X *)&q)->dummy;
#pragma unroll
    for (int j = 0; j < 4; j++)
        val.v[j] = c + j < n ? val.v[j] : dummy;
    if (c < p.max_pages)
        *(I4 *)(p.out + (uint64_t)r * p.out_stride + (uint64_t)c * 4) = val;
}

/* The seed's kernel as Triton's PTX has it: no branch, the row load and
 * the store predicated (inline PTX, so neither becomes a branch), the
 * store's address worked out before the load; SEMANTICS as narrow's
 * CHECKS. */
template <bool CHECKS> __device__ __forceinline__ void pred1(const GatherEven &p)
{
    const uint32_t r = blockIdx.x;
    const int len = ((const int *)p.seq)[r];
    const int64_t req = ((const int64_t *)p.req)[r];
    const uint32_t c = blockIdx.y * 128 + threadIdx.x;
    int *dst = (int *)(p.out + (int64_t)r * p.out_stride) + c;
    int n = (len + (1 << p.page_shift) - 1) >> p.page_shift;
    if (CHECKS)
        n = (uint64_t)req < p.table_rows ? min(n, (int)p.cols) : 0;
    const int *src = (const int *)(p.table + req * (int64_t)p.table_stride) + c;
    int v = (int)p.dummy;
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %2, 0;\n\t@q ld.global.b32 %0, [%1];\n\t}"
                 : "+r"(v)
                 : "l"(src), "r"((uint32_t)((int)c < n && c < p.max_pages)));
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %2, 0;\n\t@q st.global.b32 [%0], %1;\n\t}" ::"l"(dst),
                 "r"(v), "r"((uint32_t)(c < p.max_pages))
                 : "memory");
    if (CHECKS && c == 0 && req >= 0 && (uint64_t)req >= p.table_rows && p.oob)
        atomicAdd(p.oob, 1ull);
}

/* The library's gather_pred since 7e82f47 (round 16: a column is live when
 * column x page size < length, so the length meets one compare), with the
 * page shift from the parameters (SHIFT < 0) or compiled in (SHIFT >= 0,
 * as the seed compiles its page size in).  Round 17 calls 1-3: compiling
 * the shift in changed nothing.  small() below repeats its predicated load
 * and store: kept as they ran (sharing them reorders the PTX). */
template <int SHIFT> __device__ __forceinline__ void live(const GatherEven &p)
{
    const uint32_t r = blockIdx.x;
    const int64_t req = ((const int64_t *)p.req)[r];
    const int len = ((const int *)p.seq)[r];
    const uint32_t c = blockIdx.y * 128 + threadIdx.x;
    const uint32_t shift = SHIFT < 0 ? p.page_shift : (uint32_t)SHIFT;
    const bool on = c < p.cols && (int64_t)((uint64_t)c << shift) < (int64_t)len && (uint64_t)req < p.table_rows;
    const int *src = (const int *)(p.table + (uint64_t)req * p.table_stride) + c;
    int *dst = (int *)(p.out + (uint64_t)r * p.out_stride) + c;
    int v = 0;
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %2, 0;\n\t@q ld.global.b32 %0, [%1];\n\t}"
                 : "+r"(v)
                 : "l"(src), "r"((uint32_t)on));
    v = on ? v : (int)p.dummy;
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %2, 0;\n\t@q st.global.b32 [%0], %1;\n\t}" ::"l"(dst),
                 "r"(v), "r"((uint32_t)(c < p.max_pages))
                 : "memory");
    if (c == 0 && req >= 0 && (uint64_t)req >= p.table_rows && p.oob)
        atomicAdd(p.oob, 1ull);
}

/* Round 17: the same one element a thread, page size 16 compiled in, on
 * smaller parameter blocks, to see whether the 80-byte GatherEven is what
 * keeps v_pred_seed (the seed's own logic) 0.03 us behind the seed at bs=1
 * (round 17 call 1): LIVE false is the seed's logic (no bounds) on the
 * seed's 48 bytes (GatherL1, as Triton's four pointers and two strides);
 * LIVE true the library's (v_live16's) on GatherL1X (56 bytes, no
 * out-of-range count) or GatherP64 (64 bytes, with it). */
struct GatherP64 {
    GatherL1 a;
    uint32_t table_rows;
    int32_t dummy;
    unsigned long long *oob;
};
static_assert(sizeof(GatherP64) == 64, "64 bytes");

template <bool LIVE, bool OOB, typename P> __device__ __forceinline__ void small(const P &q)
{
    const GatherL1 &p = *(const GatherL1 *)&q;
    const uint32_t r = blockIdx.x;
    const int64_t req = ((const int64_t *)p.req)[r];
    const int len = ((const int *)p.seq)[r];
    const uint32_t c = blockIdx.y * 128 + threadIdx.x;
    const uint32_t cols = p.cols_shift & ((1u << 27) - 1);
    bool on;
    int dummy = 0;
    uint32_t rows = 0;
    if constexpr (LIVE) {
        const GatherL1X &x = *(const GatherL1X *)&q;
        rows = x.table_rows;
        dummy = x.dummy;
        on = c < cols && (int64_t)((uint64_t)c << 4) < (int64_t)len && (uint64_t)req < rows;
    } else {
        on = (int)c < (len + 15) >> 4 && c < p.max_pages;
    }
    const int *src = (const int *)(p.table + (uint64_t)req * p.table_stride) + c;
    int *dst = (int *)(p.out + (uint64_t)r * p.out_stride) + c;
    int v = 0;
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %2, 0;\n\t@q ld.global.b32 %0, [%1];\n\t}"
                 : "+r"(v)
                 : "l"(src), "r"((uint32_t)on));
    v = on ? v : dummy;
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %2, 0;\n\t@q st.global.b32 [%0], %1;\n\t}" ::"l"(dst),
                 "r"(v), "r"((uint32_t)(c < p.max_pages))
                 : "memory");
    if constexpr (OOB) {
        const GatherP64 &x = *(const GatherP64 *)&q;
        if (c == 0 && req >= 0 && (uint64_t)req >= rows && x.oob)
            atomicAdd(x.oob, 1ull);
    }
}

/* The kernels.  -DLONE=1 or 2 builds only v_even or only v_seedlike: a
 * kernel alone in its module, as the seed's is (module_path.py,
 * EXP_MP_LONE=1). */
#if !defined(LONE) || LONE == 1
extern "C" __global__ void __launch_bounds__(256) v_even(const GatherEven p) { even<256, false, true>(p); }
#endif
#if !defined(LONE) || LONE == 2
extern "C" __global__ void __launch_bounds__(128) v_seedlike(const GatherEven p) { narrow<false>(p); }
#endif
#ifndef LONE
extern "C" __global__ void __launch_bounds__(256) v_even_nooob(const GatherEven p) { even<256, false, false>(p); }
extern "C" __global__ void __launch_bounds__(256) v_even_x(const GatherEven p) { even<256, true, true>(p); }
extern "C" __global__ void __launch_bounds__(64) v_even64(const GatherEven p) { even<64, false, true>(p); }
extern "C" __global__ void __launch_bounds__(128) v_narrow(const GatherEven p) { narrow<true>(p); }
extern "C" __global__ void __launch_bounds__(256) v_l1(const __grid_constant__ GatherL1 p) { line1<0>(p); }
extern "C" __global__ void __launch_bounds__(256) v_l1_pad(const __grid_constant__ GatherL1Pad p) { line1<0>(p); }
extern "C" __global__ void __launch_bounds__(256) v_l1_late(const __grid_constant__ GatherL1X p) { line1<1>(p); }
extern "C" __global__ void __launch_bounds__(256) v_l1_bound(const __grid_constant__ GatherL1X p) { line1<2>(p); }
extern "C" __global__ void __launch_bounds__(128) v_pred_seed(const GatherEven p) { pred1<false>(p); }
extern "C" __global__ void __launch_bounds__(128) v_pred(const GatherEven p) { pred1<true>(p); }
extern "C" __global__ void __launch_bounds__(128) v_live(const GatherEven p) { live<-1>(p); }
/* pages of 16 tokens only (the bench's gather) */
extern "C" __global__ void __launch_bounds__(128) v_live16(const GatherEven p) { live<4>(p); }
extern "C" __global__ void __launch_bounds__(128) v_seed_l1(const __grid_constant__ GatherL1 p) { small<false, false>(p); }
extern "C" __global__ void __launch_bounds__(128) v_live_l1x(const __grid_constant__ GatherL1X p) { small<true, false>(p); }
extern "C" __global__ void __launch_bounds__(128) v_live_p64(const __grid_constant__ GatherP64 p) { small<true, true>(p); }
#endif
