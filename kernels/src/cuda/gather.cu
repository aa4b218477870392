/*
 * Page-table gather with padding: row r of out is row req_pool_indices[r]
 * of req_to_page up to ceil(seq_lens[r] / page_size) columns, dummy_slot
 * after.  The smallest calls (a block per multiprocessor at most, page
 * size a power of two): gather_pred, an element a thread.  Small calls:
 * one pass, a thread per vector of every row (gather_even when the page
 * size is a power of two and the rows are whole vectors, gather_once
 * otherwise).  Larger ones: one block
 * per output row (grid-stride over rows).  Rows move in 16-byte vectors
 * when every row start is 16-byte aligned.
 */
#include <stddef.h>
#include <string.h>

#include <type_traits>

#include "cuda_common.cuh"

namespace {

constexpr int kUnroll = 4;

/* Every field within the first two 64-byte lines of the kernel
 * parameters, where a line's first read in a launch is a constant-cache
 * miss (see RowHead in copy_rows.cu). */
struct Gather {
    const void *req;
    const void *seq;
    const char *table;
    char *out;
    int64_t table_stride;
    int64_t out_stride;
    int64_t table_rows;
    int64_t table_cols;
    int64_t max_pages;
    int64_t page_size;
    int64_t dummy;
    bool req64;
    bool seq64;
    int page_shift; /* log2(page_size) when a power of two, else -1 */
    unsigned long long *oob;
    int64_t bs;
};

template <typename T, int VEC> struct Vec;
template <typename T> struct Vec<T, 1> {
    T v[1];
};
template <> struct alignas(16) Vec<int32_t, 4> {
    int32_t v[4];
};
template <> struct alignas(16) Vec<int64_t, 2> {
    int64_t v[2];
};

template <typename T, int VEC>
__global__ void __launch_bounds__(KVD_BLOCK_THREADS, KVD_MIN_BLOCKS_PER_SM) gather_kernel(const Gather p)
{
    using V = Vec<T, VEC>;
    const T dummy = (T)p.dummy;
    const int64_t nvec = (p.max_pages + VEC - 1) / VEC;

    for (int64_t r = blockIdx.x; r < p.bs; r += gridDim.x) {
        const int64_t req = kvd__load_index(p.req, p.req64, r);
        const int64_t len = kvd__load_index(p.seq, p.seq64, r);
        int64_t n = len > 0 ? len / p.page_size + (len % p.page_size != 0) : 0;
        if (req < 0) {
            n = 0; /* padding row */
        } else if (req >= p.table_rows) {
            n = 0;
            if (threadIdx.x == 0 && p.oob)
                atomicAdd(p.oob, 1ull);
        }
        if (n > p.table_cols)
            n = p.table_cols;
        const T *src = (const T *)(p.table + (n > 0 ? req * p.table_stride : 0));
        T *dst = (T *)(p.out + r * p.out_stride);

        for (int64_t c0 = threadIdx.x; c0 < nvec; c0 += (int64_t)blockDim.x * kUnroll) {
            V val[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                const int64_t c = (c0 + (int64_t)u * blockDim.x) * VEC;
                if (c + VEC <= n) {
                    val[u] = *(const V *)(src + c); /* whole vector valid */
                } else {
#pragma unroll
                    for (int j = 0; j < VEC; j++)
                        val[u].v[j] = c + j < n ? src[c + j] : dummy;
                }
            }
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                const int64_t c = (c0 + (int64_t)u * blockDim.x) * VEC;
                if (c >= p.max_pages)
                    continue;
                if (c + VEC <= p.max_pages) {
                    *(V *)(dst + c) = val[u];
                } else {
#pragma unroll
                    for (int j = 0; j < VEC; j++)
                        if (c + j < p.max_pages)
                            dst[c + j] = val[u].v[j];
                }
            }
        }
    }
}

/*
 * One pass: thread x of block (bx, r) writes vector
 * bx * KVD_BLOCK_THREADS + x of row r, and nothing else; for calls whose
 * vectors the device holds all at once.  The row's index and length load
 * first, before the exit of the threads past the row (which waits for a
 * parameter line), as volatile loads so that the compiler cannot sink them
 * past it (ptxas did so with a store's row load: kvd__load_now).
 * Column c of the row is live when c < ceil(len / page_size) and
 * c < table_cols.  With a power-of-two page size (POW2) that is one
 * count of live columns, by shifts, and the path from the index loads to
 * the table load has no branch; otherwise each column tests
 * c * page_size < len (no division).  The out-of-range count comes last,
 * off that path: no branch on the page size and no count stands between
 * the index loads and the table load.
 */
template <typename T, int VEC, bool POW2>
__global__ void __launch_bounds__(KVD_BLOCK_THREADS, KVD_MIN_BLOCKS_PER_SM) gather_once(const Gather p)
{
    using V = Vec<T, VEC>;
    const uint32_t r = blockIdx.y;
    const int64_t req = kvd__load_index_now(p.req, p.req64, r);
    const int64_t len = kvd__load_index_now(p.seq, p.seq64, r);
    const int64_t c = (int64_t)(blockIdx.x * KVD_BLOCK_THREADS + threadIdx.x) * VEC;
    if (c >= p.max_pages)
        return;
    const bool live = req >= 0 && req < p.table_rows;
    const T *src = (const T *)(p.table + (live ? req * p.table_stride : 0));
    T *dst = (T *)(p.out + (int64_t)r * p.out_stride);
    bool ok[VEC]; /* column c + j live */
    if constexpr (POW2) {
        int64_t n = live && len > 0 ? ((len - 1) >> p.page_shift) + 1 : 0;
        n = n < p.table_cols ? n : p.table_cols;
#pragma unroll
        for (int j = 0; j < VEC; j++)
            ok[j] = c + j < n;
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const uint64_t cj = (uint64_t)(c + j);
            ok[j] = live && len > 0 && (int64_t)cj < p.table_cols &&
                    __umul64hi(cj, (uint64_t)p.page_size) == 0 &&
                    cj * (uint64_t)p.page_size < (uint64_t)len;
        }
    }
    const T dummy = (T)p.dummy;
    V val;
    if (VEC > 1 && ok[VEC - 1]) {
        val = *(const V *)(src + c); /* whole vector live */
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++)
            val.v[j] = ok[j] ? src[c + j] : dummy;
    }
    if (c + VEC <= p.max_pages) {
        *(V *)(dst + c) = val;
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++)
            if (c + j < p.max_pages)
                dst[c + j] = val.v[j];
    }
    if (req >= p.table_rows && c == 0 && p.oob)
        atomicAdd(p.oob, 1ull);
}

/*
 * The one-pass kernel's common form: page size a power of two, whole
 * vectors on both sides (table columns and max_pages multiples of VEC,
 * row starts 16-byte aligned when VEC > 1), the index widths as template
 * parameters, columns and counts in 32 bits.  What the path from the index loads to
 * the table load reads lies in the first parameter line (48 bytes at bank
 * offset 0x210 on sm_90; see RowHead in copy_rows.cu): no width flag
 * before the index loads, and nothing from the second line (whose first
 * read stalls the warp) until the table load is on its way, so the load's
 * registers start at zero and dead columns take the dummy after it.  No
 * thread exits early: the store is predicated, so the index loads are
 * plain loads that nothing can sink below a branch.  A vector is loaded
 * whole when its first column is live (it lies within the table row, which
 * has whole vectors).  It is the faster of the two one-pass kernels where
 * rows are aligned.
 */
struct GatherEven {
    const void *req;
    const void *seq;
    const char *table;
    uint64_t table_rows;   /* a row is live when (uint64_t)req < table_rows */
    uint32_t table_stride; /* bytes */
    uint32_t cols;         /* min(table_cols, max_pages): live columns at most */
    uint32_t max_pages;
    uint32_t page_shift;
    /* --- second line: read once the table load is on its way --- */
    char *out;
    int64_t out_stride;
    int64_t dummy;
    unsigned long long *oob;
};
static_assert(offsetof(GatherEven, out) == 48, "the path to the table load must fit the first line");

template <typename T, int VEC, typename R, typename L>
__global__ void __launch_bounds__(KVD_BLOCK_THREADS, KVD_MIN_BLOCKS_PER_SM) gather_even(const GatherEven p)
{
    using V = Vec<T, VEC>;
    using UR = typename std::make_unsigned<R>::type;
    using UL = typename std::make_unsigned<L>::type;
    const uint32_t r = blockIdx.y;
    const R req = ((const R *)p.req)[r];
    const L len = ((const L *)p.seq)[r];
    const uint32_t c = (blockIdx.x * KVD_BLOCK_THREADS + threadIdx.x) * VEC;
    /* live columns: ceil(len / page_size), at most cols; none for a
     * padding or out-of-range row or len <= 0 (the address is then never
     * dereferenced) */
    const UL pages = len > 0 ? (((UL)len - 1) >> p.page_shift) + 1 : 0;
    uint32_t n = pages < (UL)p.cols ? (uint32_t)pages : p.cols;
    n = (uint64_t)(int64_t)req < p.table_rows ? n : 0;
    const T *src = (const T *)(p.table + (uint64_t)(UR)req * p.table_stride) + c;
    V val;
#pragma unroll
    for (int j = 0; j < VEC; j++)
        val.v[j] = 0;
    if (c < n)
        val = *(const V *)src;
    const T dummy = (T)p.dummy;
#pragma unroll
    for (int j = 0; j < VEC; j++)
        val.v[j] = c + j < n ? val.v[j] : dummy;
    if (c < p.max_pages)
        *(V *)(p.out + (uint64_t)r * p.out_stride + (uint64_t)c * sizeof(T)) = val;
    if (c == 0 && req >= 0 && (uint64_t)(int64_t)req >= p.table_rows && p.oob)
        atomicAdd(p.oob, 1ull);
}

/*
 * gather_even's work for the smallest calls, in the seed's shape: blocks
 * of kPredThreads threads, one element each, rows on x; no branch, the
 * table load and the store predicated.  A call takes it when its blocks
 * number at most the multiprocessors (pred_fits): the seed's shape wins
 * only there, and gather_even wins once the call needs more blocks.
 *
 * Column c is live when c < ceil(len / page_size), that is when
 * c * page_size < len: the product needs no length, so the length meets
 * one compare on its way to the table load rather than a page count (a
 * shift, two adds, a select, a minimum); the two time the same, and this
 * is the plainer.  pred_fits keeps the page shift within
 * 31 bits, so the product of a 32-bit column fits an int64_t.
 */
constexpr int kPredThreads = 128;
constexpr uint32_t kPredMaxShift = 31;

template <typename T, typename R, typename L>
__global__ void __launch_bounds__(kPredThreads) gather_pred(const GatherEven p)
{
    using UR = typename std::make_unsigned<R>::type;
    const uint32_t r = blockIdx.x;
    const R req = ((const R *)p.req)[r];
    const L len = ((const L *)p.seq)[r];
    const uint32_t c = blockIdx.y * kPredThreads + threadIdx.x;
    const int64_t first = (int64_t)((uint64_t)c << p.page_shift); /* the column's first token */
    const bool live = c < p.cols && first < (int64_t)len && (uint64_t)(int64_t)req < p.table_rows;
    T v = 0;
    kvd__load_if(v, (const T *)(p.table + (uint64_t)(UR)req * p.table_stride) + c, live);
    v = live ? v : (T)p.dummy;
    kvd__store_if((T *)(p.out + (uint64_t)r * p.out_stride) + c, v, c < p.max_pages);
    if (c == 0 && req >= 0 && (uint64_t)(int64_t)req >= p.table_rows && p.oob)
        atomicAdd(p.oob, 1ull);
}

/* p's call takes gather_pred: its blocks (bs by *by) number at most the
 * multiprocessors, within the budget (the rest of what gather_pred needs
 * is even_fits<1>'s). */
bool pred_fits(const Gather &p, const kvd_grid_limits_t &g, int64_t *by)
{
    *by = p.max_pages / kPredThreads + (p.max_pages % kPredThreads != 0);
    return p.page_shift <= (int)kPredMaxShift && p.bs <= g.sms && *by <= g.sms && p.bs * *by <= g.sms &&
           p.bs * *by <= g.budget;
}

/* gather_pred<T, R, L> with R and L the index widths. */
template <typename T>
kvd_status_t launch_pred(const GatherEven &e, bool req64, bool seq64, int64_t bs, int64_t by,
                         const kvd_launch_t *launch)
{
    const dim3 grid((unsigned)bs, (unsigned)by);
    cudaStream_t st = kvd__stream(launch);
    if (req64 && seq64)
        gather_pred<T, int64_t, int64_t><<<grid, kPredThreads, 0, st>>>(e);
    else if (req64)
        gather_pred<T, int64_t, int32_t><<<grid, kPredThreads, 0, st>>>(e);
    else if (seq64)
        gather_pred<T, int32_t, int64_t><<<grid, kPredThreads, 0, st>>>(e);
    else
        gather_pred<T, int32_t, int32_t><<<grid, kPredThreads, 0, st>>>(e);
    KVD_CUDA_LAUNCHED("gather_pred");
    return KVD_OK;
}

/* gather_even<T, VEC, R, L> with R and L the index widths of p, a
 * thread per vector of each of the bs rows of nvec vectors. */
template <typename T, int VEC>
kvd_status_t launch_even(const GatherEven &e, bool req64, bool seq64, int64_t nvec, int64_t bs,
                         const kvd_launch_t *launch)
{
    const int64_t bx = nvec / KVD_BLOCK_THREADS + (nvec % KVD_BLOCK_THREADS != 0);
    const dim3 grid((unsigned)bx, (unsigned)bs);
    cudaStream_t st = kvd__stream(launch);
    if (req64 && seq64)
        gather_even<T, VEC, int64_t, int64_t><<<grid, KVD_BLOCK_THREADS, 0, st>>>(e);
    else if (req64)
        gather_even<T, VEC, int64_t, int32_t><<<grid, KVD_BLOCK_THREADS, 0, st>>>(e);
    else if (seq64)
        gather_even<T, VEC, int32_t, int64_t><<<grid, KVD_BLOCK_THREADS, 0, st>>>(e);
    else
        gather_even<T, VEC, int32_t, int32_t><<<grid, KVD_BLOCK_THREADS, 0, st>>>(e);
    KVD_CUDA_LAUNCHED("gather_even");
    return KVD_OK;
}

/* p as gather_even's parameters, when its shape allows: see gather_even. */
template <int VEC> bool even_fits(const Gather &p, GatherEven *e)
{
    if (p.page_shift < 0 || p.table_cols % VEC || p.max_pages % VEC ||
        p.max_pages > UINT32_MAX || p.table_stride > UINT32_MAX)
        return false;
    memset(e, 0, sizeof(*e));
    e->req = p.req;
    e->seq = p.seq;
    e->table = p.table;
    e->table_rows = (uint64_t)p.table_rows;
    e->table_stride = (uint32_t)p.table_stride;
    e->cols = (uint32_t)(p.table_cols < p.max_pages ? p.table_cols : p.max_pages);
    e->max_pages = (uint32_t)p.max_pages;
    e->page_shift = (uint32_t)p.page_shift;
    e->out = p.out;
    e->out_stride = p.out_stride;
    e->dummy = p.dummy;
    e->oob = p.oob;
    return true;
}

template <typename T, int VEC>
kvd_status_t launch_rows(const Gather &p, const kvd_launch_t *launch)
{
    kvd_grid_limits_t g;
    kvd_status_t st = kvd__cuda_limits(launch, &g);
    if (st != KVD_OK)
        return st;
    const int64_t limit = g.one_wave;
    int64_t by;
    GatherEven e;
    if (pred_fits(p, g, &by) && even_fits<1>(p, &e))
        return launch_pred<T>(e, p.req64, p.seq64, p.bs, by, launch);
    /* One pass when every vector of every row fits on the device at once
     * (past that, the loop's four vectors per thread win). */
    const int64_t nvec = p.max_pages / VEC + (p.max_pages % VEC != 0);
    const int64_t bx = nvec / KVD_BLOCK_THREADS + (nvec % KVD_BLOCK_THREADS != 0);
    if (bx <= limit && p.bs <= limit && kvd__mul_sat(bx, p.bs) <= limit) {
        if (even_fits<VEC>(p, &e))
            return launch_even<T, VEC>(e, p.req64, p.seq64, nvec, p.bs, launch);
        const dim3 grid((unsigned)bx, (unsigned)p.bs);
        if (p.page_shift >= 0)
            gather_once<T, VEC, true><<<grid, KVD_BLOCK_THREADS, 0, kvd__stream(launch)>>>(p);
        else
            gather_once<T, VEC, false><<<grid, KVD_BLOCK_THREADS, 0, kvd__stream(launch)>>>(p);
        KVD_CUDA_LAUNCHED("gather_once");
        return KVD_OK;
    }
    /* one block per row, as many rows at once as the device holds */
    const unsigned blocks = kvd__grid_blocks(&g, kvd__mul_sat(p.bs, KVD_BLOCK_THREADS));
    gather_kernel<T, VEC><<<blocks, KVD_BLOCK_THREADS, 0, kvd__stream(launch)>>>(p);
    KVD_CUDA_LAUNCHED("gather_kernel");
    return KVD_OK;
}

template <typename T, int VEC> void load_rows(void)
{
    cudaFuncAttributes a;
    (void)cudaFuncGetAttributes(&a, (const void *)gather_kernel<T, VEC>);
    (void)cudaFuncGetAttributes(&a, (const void *)gather_once<T, VEC, true>);
    (void)cudaFuncGetAttributes(&a, (const void *)gather_once<T, VEC, false>);
    (void)cudaFuncGetAttributes(&a, (const void *)gather_even<T, VEC, int64_t, int64_t>);
    (void)cudaFuncGetAttributes(&a, (const void *)gather_even<T, VEC, int64_t, int32_t>);
    (void)cudaFuncGetAttributes(&a, (const void *)gather_even<T, VEC, int32_t, int64_t>);
    (void)cudaFuncGetAttributes(&a, (const void *)gather_even<T, VEC, int32_t, int32_t>);
    (void)cudaFuncGetAttributes(&a, (const void *)gather_pred<T, int64_t, int64_t>);
    (void)cudaFuncGetAttributes(&a, (const void *)gather_pred<T, int64_t, int32_t>);
    (void)cudaFuncGetAttributes(&a, (const void *)gather_pred<T, int32_t, int64_t>);
    (void)cudaFuncGetAttributes(&a, (const void *)gather_pred<T, int32_t, int32_t>);
}

} // namespace

void kvd__load_gather_kernels(void)
{
    load_rows<int32_t, 4>();
    load_rows<int32_t, 1>();
    load_rows<int64_t, 2>();
    load_rows<int64_t, 1>();
}

extern "C" kvd_status_t kvd_cuda_page_table_gather(const kvd_gather_args_t *a,
                                                   const kvd_launch_t *launch)
{
    kvd__clear_error();
    kvd_status_t st = kvd__check_gather(a);
    if (st != KVD_OK || a->bs == 0 || a->max_num_pages == 0)
        return st;

    Gather p;
    memset(&p, 0, sizeof(p));
    p.table = (const char *)a->req_to_page;
    p.table_rows = a->table_rows;
    p.table_cols = a->table_cols;
    p.table_stride = a->table_stride;
    p.req = a->req_pool_indices;
    p.req64 = a->req_dtype == KVD_DTYPE_I64;
    p.seq = a->seq_lens;
    p.seq64 = a->seq_lens_dtype == KVD_DTYPE_I64;
    p.out = (char *)a->out;
    p.out_stride = a->out_stride;
    p.bs = a->bs;
    p.max_pages = a->max_num_pages;
    p.page_size = a->page_size;
    p.page_shift = (a->page_size & (a->page_size - 1)) == 0 ? __builtin_ctzll((uint64_t)a->page_size) : -1;
    p.dummy = a->dummy_slot;
    p.oob = a->oob_count;

    /* Vectors need every row start 16-byte aligned on both sides. */
    const bool wide = (((uintptr_t)a->req_to_page | (uint64_t)a->table_stride |
                        (uintptr_t)a->out | (uint64_t)a->out_stride) & 15) == 0;
    kvd__cuda_load_kernels();
    if (a->table_dtype == KVD_DTYPE_I64)
        return wide ? launch_rows<int64_t, 2>(p, launch) : launch_rows<int64_t, 1>(p, launch);
    return wide ? launch_rows<int32_t, 4>(p, launch) : launch_rows<int32_t, 1>(p, launch);
}
