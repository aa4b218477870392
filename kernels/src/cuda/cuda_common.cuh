/*
 * Shared by the CUDA translation units of the kernel library.
 */
#ifndef KVDOCK_CUDA_COMMON_CUH
#define KVDOCK_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "internal.h"

#define KVD_BLOCK_THREADS 256
/* Blocks of KVD_BLOCK_THREADS that every kernel keeps resident per SM (its
 * register cap follows from it); grids are sized to this many per SM. */
#define KVD_MIN_BLOCKS_PER_SM 4
/* Waves (grids of what the device holds at once) up to which the row
 * kernels launch one group per row instead of a grid-stride loop: one
 * pass is the faster launch for grids of up to this many waves (the store
 * and per-layer transfer rows of tests/bench/bench_kernels.py check it). */
#define KVD_ONE_PASS_WAVES 8

/* Map a CUDA error to KVD_ECUDA, record where it happened, and clear the
 * error so the next call starts clean. */
kvd_status_t kvd__cuda_fail(cudaError_t err, const char *what, const char *file, int line);

#define KVD_CUDA_TRY(call)                                                     \
    do {                                                                       \
        cudaError_t kvd_err_ = (call);                                         \
        if (kvd_err_ != cudaSuccess)                                           \
            return kvd__cuda_fail(kvd_err_, #call, __FILE__, __LINE__);       \
    } while (0)

/* Check that the launch just made was accepted. */
#define KVD_CUDA_LAUNCHED(name) KVD_CUDA_TRY(cudaGetLastError())

/* Multiprocessors of the current device (cached per device). */
kvd_status_t kvd__cuda_sm_count(int *sm_count);

/*
 * Grid limits of one launch on the current device: what it holds at once
 * (KVD_MIN_BLOCKS_PER_SM blocks of KVD_BLOCK_THREADS per SM) and the
 * caller's block budget, which caps every grid.
 */
typedef struct kvd_grid_limits {
    int sms;
    int64_t resident; /* blocks the device holds at once */
    int64_t budget;   /* launch->max_blocks, INT64_MAX when none */
    int64_t one_wave; /* blocks a one-pass launch may use: resident, within the budget */
    int64_t waves;    /* the same for KVD_ONE_PASS_WAVES waves */
} kvd_grid_limits_t;

kvd_status_t kvd__cuda_limits(const kvd_launch_t *launch, kvd_grid_limits_t *g);

/* Blocks a grid-stride kernel needs without the budget: enough to give
 * every one of threads (saturated, not rounded up by the caller) its own
 * work, at most what the device holds at once. */
static inline int64_t kvd__grid_unbudgeted(const kvd_grid_limits_t *g, int64_t threads)
{
    int64_t want = threads / KVD_BLOCK_THREADS + (threads % KVD_BLOCK_THREADS != 0);
    if (want > g->resident)
        want = g->resident;
    return want < 1 ? 1 : want;
}

/* The same within the budget. */
static inline unsigned kvd__grid_blocks(const kvd_grid_limits_t *g, int64_t threads)
{
    const int64_t want = kvd__grid_unbudgeted(g, threads);
    return (unsigned)(want < g->budget ? want : g->budget);
}

/* log2 of the smallest power of two >= x (0 for x <= 1), the same on the
 * host and on the device. */
__host__ __device__ __forceinline__ int kvd__ceil_log2(int64_t x)
{
#ifdef __CUDA_ARCH__
    return x <= 1 ? 0 : 64 - __clzll(x - 1);
#else
    return x <= 1 ? 0 : 64 - __builtin_clzll((unsigned long long)(x - 1));
#endif
}

/* Lanes for a row of vecs vectors, one vector each: log2 of the smallest
 * power of two covering the row, at most a block. */
__host__ __device__ __forceinline__ int kvd__wide_shift(int64_t vecs)
{
    const int shift = kvd__ceil_log2(vecs), most = kvd__ceil_log2(KVD_BLOCK_THREADS);
    return shift < most ? shift : most;
}

/*
 * Load every kernel of the library on this device, once, before our first
 * launch.  CUDA loads a kernel lazily by default, at its first launch, and
 * a kernel's first launch into a stream held by an earlier host function
 * can run before the stream is released; a launch of an already loaded
 * kernel waits its turn.  So no launch of ours may be a kernel's first.
 * Asking for a kernel's attributes loads it.  Errors are cleared: a kernel
 * this card cannot run fails at its launch, with the launch's error.
 */
void kvd__cuda_load_kernels(void);
/* Each kernel file's part: ask for the attributes of each of its kernels. */
void kvd__load_copy_rows_kernels(void);
void kvd__load_fp8_kernels(void);
void kvd__load_gather_kernels(void);

static inline cudaStream_t kvd__stream(const kvd_launch_t *launch)
{
    return launch ? (cudaStream_t)launch->stream : (cudaStream_t)0;
}

/* Largest power of two, at most max_bytes, dividing every value given. */
static inline int kvd__common_align(uint64_t bits, int max_bytes)
{
    int a = max_bytes;
    while (a > 1 && (bits & (uint64_t)(a - 1)))
        a >>= 1;
    return a;
}

/* a * b, saturated at INT64_MAX (both non-negative). */
static inline int64_t kvd__mul_sat(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

/* Load one index of an int32 or int64 array (a uniform branch). */
__device__ __forceinline__ int64_t kvd__load_index(const void *p, bool is64, int64_t i)
{
    return is64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* A load issued here and now.  The compiler sinks a plain load whose value
 * is only used past a branch into that branch, after whatever the branch
 * waits for (a store's slot index): a DRAM round trip more after an L2
 * flush.  An asm volatile load stays where it is written in the PTX, and a
 * volatile one where it is in the machine code too (ptxas sank a plain
 * one past the early exit of a padding slot; a volatile access it must
 * make on every path).  The row copies load a store's token row with it,
 * the gather its row's index and length (kvd__load_index_now). */
/* Volatile: a weaker load (ld.global, ld.relaxed) lets ptxas move it past
 * the slot index test, which costs a store a DRAM round trip. */
#define KVD_LOAD_NOW_OP "ld.volatile.global" /* LDG.E.STRONG.SYS */
template <typename V> __device__ __forceinline__ V kvd__load_now(const V *p);
template <> __device__ __forceinline__ uint4 kvd__load_now(const uint4 *p)
{
    uint4 v;
    asm volatile(KVD_LOAD_NOW_OP ".v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(__cvta_generic_to_global(p)));
    return v;
}
template <> __device__ __forceinline__ uint2 kvd__load_now(const uint2 *p)
{
    uint2 v;
    asm volatile(KVD_LOAD_NOW_OP ".v2.u32 {%0, %1}, [%2];"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(__cvta_generic_to_global(p)));
    return v;
}
/* The scalar forms: T in a register of constraint C, loaded as PTX type PT. */
#define KVD_LOAD_NOW_SCALAR(T, PT, C)                                                    \
    template <> __device__ __forceinline__ T kvd__load_now(const T *p)                  \
    {                                                                                    \
        T v;                                                                             \
        asm volatile(KVD_LOAD_NOW_OP "." PT " %0, [%1];" : "=" C(v)                  \
                     : "l"(__cvta_generic_to_global(p)));                                \
        return v;                                                                        \
    }
KVD_LOAD_NOW_SCALAR(int64_t, "s64", "l")
KVD_LOAD_NOW_SCALAR(int32_t, "s32", "r")
KVD_LOAD_NOW_SCALAR(uint32_t, "u32", "r")
KVD_LOAD_NOW_SCALAR(uint16_t, "u16", "h")
#undef KVD_LOAD_NOW_SCALAR
/* no 8-bit register: through a 16-bit one */
template <> __device__ __forceinline__ uint8_t kvd__load_now(const uint8_t *p)
{
    uint16_t v;
    asm volatile(KVD_LOAD_NOW_OP ".u8 %0, [%1];" : "=h"(v) : "l"(__cvta_generic_to_global(p)));
    return (uint8_t)v;
}

/* kvd__load_index through kvd__load_now. */
__device__ __forceinline__ int64_t kvd__load_index_now(const void *p, bool is64, int64_t i)
{
    return is64 ? kvd__load_now((const int64_t *)p + i) : (int64_t)kvd__load_now((const int32_t *)p + i);
}

/*
 * Predicated accesses: v = *p where live, else v unchanged; *p = v where
 * live.  No branch, so ptxas has nothing to sink a load below: the load
 * waits on what its address and predicate need, and nothing else (ptxas
 * sinks a plain load written before a test below the test's early exit).
 * The gather's table loads and the
 * block-per-row transfer's row copies use them.
 */
#define KVD_PRED_Q "{\n\t.reg .pred q;\n\tsetp.ne.u32 q, "
template <typename V> __device__ __forceinline__ void kvd__load_if(V &v, const V *p, bool live);
template <typename V> __device__ __forceinline__ void kvd__store_if(V *p, const V &v, bool live);
template <> __device__ __forceinline__ void kvd__load_if(uint4 &v, const uint4 *p, bool live)
{
    asm volatile(KVD_PRED_Q "%5, 0;\n\t@q ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
                 : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
                 : "l"(__cvta_generic_to_global(p)), "r"((uint32_t)live));
}
template <> __device__ __forceinline__ void kvd__store_if(uint4 *p, const uint4 &v, bool live)
{
    asm volatile(KVD_PRED_Q "%5, 0;\n\t@q st.global.v4.u32 [%0], {%1, %2, %3, %4};\n\t}" ::"l"(
                     __cvta_generic_to_global(p)),
                 "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"((uint32_t)live)
                 : "memory");
}
template <> __device__ __forceinline__ void kvd__load_if(uint2 &v, const uint2 *p, bool live)
{
    asm volatile(KVD_PRED_Q "%3, 0;\n\t@q ld.global.v2.u32 {%0, %1}, [%2];\n\t}"
                 : "+r"(v.x), "+r"(v.y)
                 : "l"(__cvta_generic_to_global(p)), "r"((uint32_t)live));
}
template <> __device__ __forceinline__ void kvd__store_if(uint2 *p, const uint2 &v, bool live)
{
    asm volatile(KVD_PRED_Q "%3, 0;\n\t@q st.global.v2.u32 [%0], {%1, %2};\n\t}" ::"l"(
                     __cvta_generic_to_global(p)),
                 "r"(v.x), "r"(v.y), "r"((uint32_t)live)
                 : "memory");
}
/* The scalar forms: T in a register of constraint C, accessed as PTX type PT. */
#define KVD_PRED_SCALAR(T, PT, C)                                                                  \
    template <> __device__ __forceinline__ void kvd__load_if(T &v, const T *p, bool live)          \
    {                                                                                              \
        asm volatile(KVD_PRED_Q "%2, 0;\n\t@q ld.global." PT " %0, [%1];\n\t}"                    \
                     : "+" C(v)                                                                    \
                     : "l"(__cvta_generic_to_global(p)), "r"((uint32_t)live));                     \
    }                                                                                              \
    template <> __device__ __forceinline__ void kvd__store_if(T *p, const T &v, bool live)         \
    {                                                                                              \
        asm volatile(KVD_PRED_Q "%2, 0;\n\t@q st.global." PT " [%0], %1;\n\t}" ::"l"(                \
                         __cvta_generic_to_global(p)),                                             \
                     C(v), "r"((uint32_t)live)                                                     \
                     : "memory");                                                                  \
    }
KVD_PRED_SCALAR(int64_t, "b64", "l")
KVD_PRED_SCALAR(int32_t, "b32", "r")
KVD_PRED_SCALAR(uint32_t, "b32", "r")
KVD_PRED_SCALAR(uint16_t, "b16", "h")
#undef KVD_PRED_SCALAR
/* no 8-bit register: through a 16-bit one */
template <> __device__ __forceinline__ void kvd__load_if(uint8_t &v, const uint8_t *p, bool live)
{
    uint16_t w = v;
    asm volatile(KVD_PRED_Q "%2, 0;\n\t@q ld.global.u8 %0, [%1];\n\t}"
                 : "+h"(w)
                 : "l"(__cvta_generic_to_global(p)), "r"((uint32_t)live));
    v = (uint8_t)w;
}
template <> __device__ __forceinline__ void kvd__store_if(uint8_t *p, const uint8_t &v, bool live)
{
    asm volatile(KVD_PRED_Q "%2, 0;\n\t@q st.global.u8 [%0], %1;\n\t}" ::"l"(__cvta_generic_to_global(p)),
                 "h"((uint16_t)v), "r"((uint32_t)live)
                 : "memory");
}
#undef KVD_PRED_Q

#endif /* KVDOCK_CUDA_COMMON_CUH */
