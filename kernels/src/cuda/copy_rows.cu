/*
 * Indexed row copies: store (tokens -> slots) and transfer (slots -> slots,
 * one layer or all), MHA (K and V) or MLA (one buffer).  One engine serves
 * them all: every (pair, buffer, layer) is a task that copies one row.
 *
 * Work split, by size:
 * - small stores and small single-buffer (MLA) transfers without layer
 *   tables: a block per row, a thread per vector, with parameters packed
 *   so that a block reads one 64-byte line of them;
 * - otherwise a group of G lanes (a power of two) copies one row; other
 *   small calls (every row's lanes fit on the device at once): one
 *   pass, a lane for every vector of a row (up to a block), each lane one
 *   load; this spreads a handful of rows over the most multiprocessors;
 * - up to KVD_ONE_PASS_WAVES grids of that: one pass, up to a warp per
 *   row, each lane keeping UNROLL vector loads in flight before it stores;
 * - larger calls: the same groups walk the task list with a grid stride
 *   and the next task's indices prefetched, so the grid never needs more
 *   blocks than the device holds at once; when a block budget keeps the
 *   grid smaller than that, groups of half the lanes with twice the loads
 *   each, so the few warps still keep enough bytes in flight.
 * A block budget (max_blocks) caps every grid: it only slows the copy
 * down.  Task order puts the pair index fastest, so neighbouring groups
 * read neighbouring index entries.
 *
 * Small calls are latency, not bandwidth: after an L2 flush each dependent
 * load is a DRAM round trip, so a store loads its source row together with
 * the slot index (the row does not depend on it), and table entries load
 * together with the indices.
 *
 * The vector width is the largest of 16/8/4/2/1 bytes that divides every
 * base address, stride and the row size known on the host.  With per-layer
 * address tables the addresses are only known on the device, so each row
 * checks its own alignment and falls back to bytes if it must.
 */
#include <stddef.h>
#include <string.h>

#include <type_traits>

#include "cuda_common.cuh"

namespace {

constexpr int kUnroll = 4;
/* Vectors per lane in flight when a block budget holds the grid below
 * what the device holds: fewer warps must keep the same bytes in flight.
 * Its kernel asks for 2 resident blocks per SM, not KVD_MIN_BLOCKS_PER_SM,
 * so the registers hold eight 16-byte vectors without spilling (a
 * budgeted grid never needs more than that). */
constexpr int kUnrollDeep = 8;

/*
 * Kernel parameters are read through the constant cache, where the first
 * read of each 64-byte line in a launch misses: what a kernel reads first
 * must share a line.  They start at bank offset 0x210 on sm_90, so the
 * first line holds 48 bytes: what a one-pass kernel needs before it can
 * load its indices.  The row addresses fill the second line, read
 * (side_now) while the indices load, so its miss overlaps their round
 * trip.  The out-of-range counter follows; a one-pass call within one
 * layer launches with only these (RowHead): a launch carries what its
 * kernel reads, since a parameter block's size costs launch time of its
 * own.  Tables, layer strides and what only the grid-stride loop needs
 * come after (RowCopy).
 */
struct RowHead {
    const void *dst_idx;
    const void *src_idx; /* NULL: src row = pair index (store) */
    int64_t count;       /* pairs */
    int64_t row_bytes;
    int64_t src_slots; /* bounds */
    int64_t dst_slots;
    /* --- second line --- */
    const char *src[2]; /* layer-0 base of K and V (store: token rows) */
    char *dst[2];
    int64_t src_stride[2]; /* bytes between rows */
    int64_t dst_stride[2];
    /* --- third line --- */
    unsigned long long *oob;
};

struct RowCopy : RowHead {
    const uint64_t *src_tab[2]; /* per-layer addresses, or NULL */
    const uint64_t *dst_tab[2];
    int64_t src_layer_stride;
    int64_t dst_layer_stride;
    int64_t tasks; /* count * nbufs * num_layers */
    int nbufs;     /* 2: K and V, 1: MLA */
    bool idx64;
};

/* One buffer's layer-0 row addresses. */
struct Side {
    const char *src;
    char *dst;
    int64_t src_stride;
    int64_t dst_stride;
};

__device__ __forceinline__ Side side_of(const RowHead &p, int buf)
{
    return Side{p.src[buf], p.dst[buf], p.src_stride[buf], p.dst_stride[buf]};
}

/* side_of, read here: the compiler may not sink the parameter reads past
 * this point (to where the row addresses are first used, after the
 * indices arrive). */
__device__ __forceinline__ Side side_now(const RowHead &p, int buf)
{
    Side w = side_of(p, buf);
    asm volatile("" : "+l"(w.src), "+l"(w.dst), "+l"(w.src_stride), "+l"(w.dst_stride));
    /* as parameters they were known to be global; through the asm, not */
    __builtin_assume(__isGlobal(w.src));
    __builtin_assume(__isGlobal(w.dst));
    return w;
}

/* Byte-wise copy for a row whose addresses defeat the vector width. */
__device__ void copy_row_bytes(const char *s, char *d, int64_t n, int lane, int g)
{
    for (int64_t b = lane; b < n; b += g)
        d[b] = s[b];
}

/* Vectors v0, v0 + g, ... below vecs of one row: U loads in flight per
 * lane before the first store. */
template <typename V, int U>
__device__ __forceinline__ void copy_span(const V *sv, V *dv, int64_t v0, int64_t vecs, int g)
{
    for (; v0 < vecs; v0 += (int64_t)g * U) {
        V r[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (v0 + u * g < vecs)
                r[u] = sv[v0 + u * g];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (v0 + u * g < vecs)
                dv[v0 + u * g] = r[u];
    }
}

/* Task t's pair index, buffer (0 = K, 1 = V) and layer: pair fastest. */
struct Task {
    int64_t i;
    int64_t layer;
    int buf;
};

__device__ __forceinline__ Task decode(const RowCopy &p, int64_t t)
{
    int64_t i, rest;
    if (p.tasks <= UINT32_MAX) { /* 32-bit division is several times cheaper */
        i = (uint32_t)t % (uint32_t)p.count;
        rest = (uint32_t)t / (uint32_t)p.count;
    } else {
        i = t % p.count;
        rest = t / p.count;
    }
    Task k;
    k.i = i;
    k.buf = p.nbufs == 2 ? (int)(rest & 1) : 0;
    k.layer = p.nbufs == 2 ? rest >> 1 : rest;
    return k;
}

/* One row: dst slot d of (layer, buf) from src row s, w the buffer's
 * rows.  counts: this task is the pair's first (buffer 0, layer 0), the
 * one that counts it when out of range.  Without LAYERS the call is one
 * layer without tables, p may be a RowHead, and no layer field is read. */
template <typename V, int U, bool LAYERS, typename P>
__device__ __forceinline__ void copy_task(const P &p, const Side &w, bool counts, int64_t layer,
                                          int buf, int64_t d, int64_t s, int lane, int g)
{
    /* layer addresses first: a table load need not wait for the indices */
    const char *sbase = w.src;
    char *dbase = w.dst;
    if constexpr (LAYERS) {
        sbase = p.src_tab[buf] ? (const char *)(uintptr_t)p.src_tab[buf][layer]
                               : sbase + layer * p.src_layer_stride;
        dbase = p.dst_tab[buf] ? (char *)(uintptr_t)p.dst_tab[buf][layer]
                               : dbase + layer * p.dst_layer_stride;
    }
    if (d < 0 || s < 0)
        return; /* padding */
    if (d >= p.dst_slots || (p.src_idx && s >= p.src_slots)) {
        /* never dereferenced; counted once per pair */
        if (counts && lane == 0 && p.oob)
            atomicAdd(p.oob, 1ull);
        return;
    }
    const char *srow = sbase + s * w.src_stride;
    char *drow = dbase + d * w.dst_stride;

    if constexpr (LAYERS && sizeof(V) > 1) {
        if ((p.src_tab[buf] || p.dst_tab[buf]) && (((uintptr_t)srow | (uintptr_t)drow) & (sizeof(V) - 1))) {
            copy_row_bytes(srow, drow, p.row_bytes, lane, g);
            return;
        }
    }
    copy_span<V, U>((const V *)srow, (V *)drow, lane, p.row_bytes / (int64_t)sizeof(V), g);
}

/* Each group walks its tasks with the next task's indices already loading
 * while the current row is copied, so the index latency is paid once. */
template <typename V, int U>
__global__ void __launch_bounds__(KVD_BLOCK_THREADS, U > kUnroll ? 2 : KVD_MIN_BLOCKS_PER_SM)
copy_rows_kernel(const RowCopy p, int gshift)
{
    const int g = 1 << gshift;
    const int lane = threadIdx.x & (g - 1);
    const int64_t ngroups = ((int64_t)gridDim.x * blockDim.x) >> gshift;

    int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> gshift;
    if (t >= p.tasks)
        return;
    Task k = decode(p, t);
    int64_t d = kvd__load_index(p.dst_idx, p.idx64, k.i);
    int64_t s = p.src_idx ? kvd__load_index(p.src_idx, p.idx64, k.i) : k.i;
    for (;;) {
        const int64_t tn = t + ngroups;
        Task kn = {0, 0, 0};
        int64_t dn = -1, sn = -1;
        if (tn < p.tasks) {
            kn = decode(p, tn);
            dn = kvd__load_index(p.dst_idx, p.idx64, kn.i);
            sn = p.src_idx ? kvd__load_index(p.src_idx, p.idx64, kn.i) : kn.i;
        }
        copy_task<V, U, true>(p, side_of(p, k.buf), t < p.count, k.layer, k.buf, d, s, lane, g);
        if (tn >= p.tasks)
            break;
        t = tn;
        k = kn;
        d = dn;
        s = sn;
    }
}

/* What a one-pass launch copies: token rows to slots (a store: one
 * layer, no tables), slots to slots in one layer without tables, or slots
 * to slots over layers (strides or tables).  A template parameter, as is
 * the index width, so that a kernel reads only the parameters its call
 * needs (see RowCopy). */
enum class Rows { kStore, kOneLayer, kLayers };

/* A one-pass kernel's parameters: all of RowCopy over layers, its head
 * (120 bytes instead of 184) within one layer. */
template <Rows R>
using OnceParams = typename std::conditional<R == Rows::kLayers, RowCopy, RowHead>::type;

/* Layer addresses come from per-layer tables on either side. */
bool has_tables(const RowCopy &p)
{
    return p.src_tab[0] || p.src_tab[1] || p.dst_tab[0] || p.dst_tab[1];
}

Rows rows_kind(const RowCopy &p, int64_t num_layers)
{
    if (!p.src_idx)
        return Rows::kStore;
    return num_layers == 1 && !has_tables(p) ? Rows::kOneLayer : Rows::kLayers;
}

/* f(R, I) with R and I std::integral_constants of the kind and the index
 * width: how a launch (or the loading of every kernel) picks its
 * instantiation. */
template <typename F> kvd_status_t with_kind(Rows r, bool idx64, F f)
{
    using Store = std::integral_constant<Rows, Rows::kStore>;
    using One = std::integral_constant<Rows, Rows::kOneLayer>;
    using Layers = std::integral_constant<Rows, Rows::kLayers>;
    using I64 = std::true_type;
    using I32 = std::false_type;
    switch (r) {
    case Rows::kStore:
        return idx64 ? f(Store(), I64()) : f(Store(), I32());
    case Rows::kOneLayer:
        return idx64 ? f(One(), I64()) : f(One(), I32());
    default:
        return idx64 ? f(Layers(), I64()) : f(Layers(), I32());
    }
}

/* Lanes per row (log2) of a group with U vectors per lane: for U = 1 a
 * lane for every vector, up to a block; otherwise enough lanes that U
 * loads each cover the row, at most a warp. */
template <int U> __host__ __device__ __forceinline__ int lane_shift(int64_t vecs)
{
    if (U == 1)
        return kvd__wide_shift(vecs);
    const int shift = kvd__ceil_log2((vecs + U - 1) / U);
    return shift < 5 ? shift : 5;
}

/*
 * One pass: group i of block (x, layer, buf) copies pair i of that layer
 * and buffer, and nothing else; for calls whose groups the device holds
 * all at once (or in a few waves), where a grid-stride loop has nothing
 * to overlap.  No division, no loop over tasks, 32-bit thread numbering
 * (the grid is small), the group size worked out here rather than passed
 * (a parameter past the head would sit on a line of its own).  Store: the
 * source row is token i's, known before its slot index arrives, so the
 * row's first vectors load in the same round trip as the index and only
 * the stores wait for the slot.  The parameters are __grid_constant__:
 * read in place, never copied to local memory first (the build refuses
 * local memory: kernels/CMakeLists.txt).
 */
template <typename V, int U, Rows R, bool IDX64>
__global__ void __launch_bounds__(KVD_BLOCK_THREADS, KVD_MIN_BLOCKS_PER_SM)
copy_rows_once(const __grid_constant__ OnceParams<R> p)
{
    const int64_t vecs = p.row_bytes / (int64_t)sizeof(V);
    const int gshift = lane_shift<U>(vecs);
    const int g = 1 << gshift;
    const int lane = threadIdx.x & (g - 1);
    const uint32_t i = (blockIdx.x * KVD_BLOCK_THREADS + threadIdx.x) >> gshift;
    if (i >= (uint32_t)p.count)
        return;
    const int buf = (int)blockIdx.z;
    const int64_t layer = blockIdx.y;
    const Side w = side_now(p, buf);
    const int64_t d = kvd__load_index(p.dst_idx, IDX64, i);
    if (R != Rows::kStore) {
        const int64_t s = kvd__load_index(p.src_idx, IDX64, i);
        copy_task<V, U, R == Rows::kLayers>(p, w, layer == 0 && buf == 0, layer, buf, d, s, lane, g);
        return;
    }
    /* store: one layer, no tables, the vector width fits every row */
    const V *sv = (const V *)(w.src + (int64_t)i * w.src_stride);
    V r[U];
#pragma unroll
    for (int u = 0; u < U; u++)
        if (lane + u * g < vecs)
            r[u] = sv[lane + u * g];
    if (d < 0)
        return; /* padding */
    if (d >= p.dst_slots) {
        if (buf == 0 && lane == 0 && p.oob)
            atomicAdd(p.oob, 1ull);
        return;
    }
    V *dv = (V *)(w.dst + d * w.dst_stride);
#pragma unroll
    for (int u = 0; u < U; u++)
        if (lane + u * g < vecs)
            dv[lane + u * g] = r[u];
    copy_span<V, U>(sv, dv, lane + (int64_t)g * U, vecs, g);
}

/*
 * Block-per-row copies: block (i, buf, layer) copies row i of that buffer
 * and layer, thread t its vector t (a block has exactly a row's vectors,
 * so no lane test).  For stores and single-buffer (MLA) transfers without
 * layer tables whose rows all fit on the device at once: there a block per
 * row beats the wide one-pass kernel for one buffer, while with K and V
 * the wide kernel stays ahead.
 *
 * A transfer's block reads what it needs on its way from one 48-byte
 * view: the kernel parameters start at bank offset 0x210 on sm_90, so
 * the view fills the first 64-byte line's last 48 bytes.  A line's first
 * read in a launch is a constant-cache miss that the loads wait for
 * (RowHead); one line per block is what the seed's kernels read.  A store
 * has a layout of its own (RowBlocksOf<Rows::kStore>), with everything its
 * two loads need in the first line.  Strides and bounds are 32-bit (row_blocks_fit checks
 * that they fit), the lanes per row come from the block size, and only an
 * out-of-range pair or a call over layers reads past the first line.
 */
struct RowView {
    const void *dst_idx;
    const void *src_idx; /* NULL: a store, src row = i */
    const char *src;
    char *dst;
    uint32_t src_stride; /* vectors between rows */
    uint32_t dst_stride;
    uint32_t src_slots; /* bounds (a store has none on its source) */
    uint32_t dst_slots;
};
static_assert(sizeof(RowView) == 48, "a view must be one parameter line's 48 bytes");

/* What a block-per-row launch of kind R carries: a transfer here has one
 * buffer, and only a call over layers reads layer strides.  The size of a
 * parameter block costs launch time apart from the lines a block reads, so
 * each kind carries no byte its kernel does not read: a transfer within a
 * layer 56 bytes, one over layers 72, a store 72. */
template <Rows R> struct RowBlocksOf {
    RowView view[1];
    unsigned long long *oob;
};
/* A store's: the slot indices, both token sources and the bound in the
 * first line, so that a V block's row load, like a K block's, waits on
 * that line alone; the destinations in the second, read once the slot
 * index is back.  This is the smaller block and the plainer kernel of the
 * two layouts that time the same (two 48-byte views being the other). */
template <> struct RowBlocksOf<Rows::kStore> {
    const void *dst_idx;
    const char *src[2];
    uint32_t src_stride[2]; /* vectors between rows */
    uint32_t dst_slots;
    uint32_t dst_stride[2];
    uint32_t unused;
    /* --- second line --- */
    char *dst[2];
    unsigned long long *oob;
};
static_assert(offsetof(RowBlocksOf<Rows::kStore>, dst) == 48,
              "a store's row loads must need the first line only");
template <> struct RowBlocksOf<Rows::kLayers> {
    RowView view[1];
    unsigned long long *oob;
    int64_t src_layer_stride;
    int64_t dst_layer_stride;
};

template <typename V, Rows R, bool IDX64>
__global__ void __launch_bounds__(1024) copy_row_blocks(const __grid_constant__ RowBlocksOf<R> p)
{
    const uint32_t i = blockIdx.x;
    const uint32_t t = threadIdx.x;
    if constexpr (R == Rows::kStore) {
        const uint32_t b = blockIdx.y;
        const int64_t d = kvd__load_index(p.dst_idx, IDX64, i);
        /* the token row is known before the slot index arrives */
        const V r = kvd__load_now((const V *)p.src[b] + (uint64_t)i * p.src_stride[b] + t);
        /* One unsigned test takes padding (negative, so huge as unsigned)
         * and an index out of range: a compare and a branch fewer on the
         * way to the store. */
        if ((uint64_t)d >= p.dst_slots) {
            if (d >= 0 && t == 0 && b == 0 && p.oob) /* not padding: out of range */
                atomicAdd(p.oob, 1ull);
            return;
        }
        ((V *)p.dst[b])[(uint64_t)d * p.dst_stride[b] + t] = r;
    } else {
        /* Straight-line, as the seed's kernel: the row load predicated on
         * its source index's test alone, the store on both, the
         * out-of-range count after the store.  No branch before the store,
         * so the row load waits on the source index only; keep it so (a
         * load behind a taken branch trails the seed at small counts).  A
         * negative (padding) index is huge as unsigned: one compare takes
         * padding and out of range. */
        const RowView &w = p.view[0];
        const int64_t d = kvd__load_index(w.dst_idx, IDX64, i);
        const int64_t s = kvd__load_index(w.src_idx, IDX64, i);
        const bool src_ok = (uint64_t)s < w.src_slots, dst_ok = (uint64_t)d < w.dst_slots;
        const char *sbase = w.src;
        char *dbase = w.dst;
        if constexpr (R == Rows::kLayers) {
            sbase += blockIdx.z * p.src_layer_stride;
            dbase += blockIdx.z * p.dst_layer_stride;
        }
        V r = {};
        kvd__load_if(r, (const V *)sbase + (uint64_t)s * w.src_stride + t, src_ok);
        kvd__store_if((V *)dbase + (uint64_t)d * w.dst_stride + t, r, src_ok && dst_ok);
        /* neither index padding, one out of range: counted once per pair */
        if (!(src_ok && dst_ok) && s >= 0 && d >= 0 && t == 0 && blockIdx.z == 0 && p.oob)
            atomicAdd(p.oob, 1ull);
    }
}

/* p can run as a block-per-row launch: no layer tables, a store or a
 * single buffer, rows of at most a block's vectors, strides and bounds
 * within 32 bits, every block resident at once within the budget. */
template <typename V>
bool row_blocks_fit(const RowCopy &p, int64_t num_layers, const kvd_grid_limits_t &g)
{
    const int64_t vecs = p.row_bytes / (int64_t)sizeof(V);
    if (has_tables(p) || vecs > 1024 ||
        (p.src_idx && p.nbufs != 1))
        return false;
    const int64_t lanes = (vecs + 31) / 32 * 32;
    const int64_t blocks = kvd__mul_sat(kvd__mul_sat(p.count, p.nbufs), num_layers);
    if (kvd__mul_sat(blocks, lanes) > g.one_wave * KVD_BLOCK_THREADS || blocks > g.budget ||
        p.dst_slots > UINT32_MAX || (p.src_idx && p.src_slots > UINT32_MAX))
        return false;
    for (int k = 0; k < p.nbufs; k++)
        if (p.src_stride[k] / (int64_t)sizeof(V) > UINT32_MAX ||
            p.dst_stride[k] / (int64_t)sizeof(V) > UINT32_MAX)
            return false;
    return true;
}

/* p's block-per-row parameters for kind R, once row_blocks_fit<V> holds. */
template <typename V, Rows R> RowBlocksOf<R> row_views(const RowCopy &p)
{
    RowBlocksOf<R> b;
    memset(&b, 0, sizeof(b));
    if constexpr (R == Rows::kStore) {
        b.dst_idx = p.dst_idx;
        b.dst_slots = (uint32_t)p.dst_slots;
        for (int k = 0; k < p.nbufs && k < 2; k++) {
            b.src[k] = p.src[k];
            b.dst[k] = p.dst[k];
            b.src_stride[k] = (uint32_t)(p.src_stride[k] / (int64_t)sizeof(V));
            b.dst_stride[k] = (uint32_t)(p.dst_stride[k] / (int64_t)sizeof(V));
        }
    } else {
        RowView &w = b.view[0];
        w.dst_idx = p.dst_idx;
        w.src_idx = p.src_idx;
        w.src = p.src[0];
        w.dst = p.dst[0];
        w.src_stride = (uint32_t)(p.src_stride[0] / (int64_t)sizeof(V));
        w.dst_stride = (uint32_t)(p.dst_stride[0] / (int64_t)sizeof(V));
        w.src_slots = (uint32_t)p.src_slots;
        w.dst_slots = (uint32_t)p.dst_slots;
        if constexpr (R == Rows::kLayers) {
            b.src_layer_stride = p.src_layer_stride;
            b.dst_layer_stride = p.dst_layer_stride;
        }
    }
    b.oob = p.oob;
    return b;
}

template <typename V>
kvd_status_t launch_row_blocks(const RowCopy &p, int64_t num_layers, const kvd_launch_t *launch)
{
    const dim3 grid((unsigned)p.count, (unsigned)p.nbufs, (unsigned)num_layers);
    const unsigned threads = (unsigned)(p.row_bytes / (int64_t)sizeof(V));
    cudaStream_t st = kvd__stream(launch);
    return with_kind(rows_kind(p, num_layers), p.idx64, [&](auto r, auto i64) {
        constexpr Rows R = decltype(r)::value;
        copy_row_blocks<V, R, decltype(i64)::value><<<grid, threads, 0, st>>>(row_views<V, R>(p));
        KVD_CUDA_LAUNCHED("copy_row_blocks");
        return KVD_OK;
    });
}

/* Blocks of a one-pass grid: groups of 2^gshift lanes, count of them per
 * block row, by block rows. */
int64_t once_blocks(int64_t count, int gshift, int64_t by, int64_t *bx)
{
    const int64_t per_block = KVD_BLOCK_THREADS >> gshift;
    *bx = count / per_block + (count % per_block != 0);
    return kvd__mul_sat(*bx, by);
}

template <typename V, int U>
kvd_status_t launch_once(const RowCopy &p, int64_t num_layers, int64_t bx, const kvd_launch_t *launch)
{
    const dim3 grid((unsigned)bx, (unsigned)num_layers, (unsigned)p.nbufs);
    cudaStream_t st = kvd__stream(launch);
    return with_kind(rows_kind(p, num_layers), p.idx64, [&](auto r, auto i64) {
        constexpr Rows R = decltype(r)::value;
        copy_rows_once<V, U, R, decltype(i64)::value>
            <<<grid, KVD_BLOCK_THREADS, 0, st>>>(static_cast<const OnceParams<R> &>(p));
        KVD_CUDA_LAUNCHED("copy_rows_once");
        return KVD_OK;
    });
}

/*
 * Four shapes, by size:
 * - stores and single-buffer rows without tables, when they all fit on
 *   the device at once: a block per row;
 * - wide one pass, one vector per lane and a lane for every vector of a
 *   row, when all the rows fit on the device at once: the most rows, and
 *   the most multiprocessors, working on the first round trip;
 * - narrow one pass, UNROLL vectors per lane, up to KVD_ONE_PASS_WAVES;
 * - beyond that, the grid-stride loop with index prefetch.
 */
template <typename V>
kvd_status_t launch_width(const RowCopy &p, int64_t num_layers, const kvd_launch_t *launch)
{
    const int64_t vecs = p.row_bytes / (int64_t)sizeof(V);
    const int64_t by = (int64_t)p.nbufs * num_layers;
    kvd_grid_limits_t g;
    kvd_status_t st = kvd__cuda_limits(launch, &g);
    if (st != KVD_OK)
        return st;
    int64_t bx;

    if (row_blocks_fit<V>(p, num_layers, g))
        return launch_row_blocks<V>(p, num_layers, launch);
    if (by <= g.one_wave && once_blocks(p.count, lane_shift<1>(vecs), by, &bx) <= g.one_wave)
        return launch_once<V, 1>(p, num_layers, bx, launch);
    const int gshift = lane_shift<kUnroll>(vecs);
    if (by <= g.waves && once_blocks(p.count, gshift, by, &bx) <= g.waves)
        return launch_once<V, kUnroll>(p, num_layers, bx, launch);

    /* grid-stride: a group per task, at most what the device holds */
    const int64_t threads = kvd__mul_sat(p.tasks, (int64_t)1 << gshift);
    const unsigned blocks = kvd__grid_blocks(&g, threads);
    if (blocks < kvd__grid_unbudgeted(&g, threads) && blocks <= 2u * (unsigned)g.sms) {
        /* the budget, not the work, sets the grid: half the lanes per row,
         * twice the loads per lane, so each warp moves two rows at once */
        copy_rows_kernel<V, kUnrollDeep><<<blocks, KVD_BLOCK_THREADS, 0, kvd__stream(launch)>>>(
            p, lane_shift<kUnrollDeep>(vecs));
    } else {
        copy_rows_kernel<V, kUnroll><<<blocks, KVD_BLOCK_THREADS, 0, kvd__stream(launch)>>>(p, gshift);
    }
    KVD_CUDA_LAUNCHED("copy_rows_kernel");
    return KVD_OK;
}

template <typename V> void load_width(void)
{
    cudaFuncAttributes a;
    (void)cudaFuncGetAttributes(&a, (const void *)copy_rows_kernel<V, kUnroll>);
    (void)cudaFuncGetAttributes(&a, (const void *)copy_rows_kernel<V, kUnrollDeep>);
    for (Rows r : {Rows::kStore, Rows::kOneLayer, Rows::kLayers}) {
        for (bool idx64 : {false, true}) {
            (void)with_kind(r, idx64, [&](auto rk, auto i64) {
                constexpr Rows R = decltype(rk)::value;
                constexpr bool I = decltype(i64)::value;
                (void)cudaFuncGetAttributes(&a, (const void *)copy_row_blocks<V, R, I>);
                (void)cudaFuncGetAttributes(&a, (const void *)copy_rows_once<V, 1, R, I>);
                (void)cudaFuncGetAttributes(&a, (const void *)copy_rows_once<V, kUnroll, R, I>);
                return KVD_OK;
            });
        }
    }
}

kvd_status_t launch_copy(const RowCopy &p, uint64_t align_bits, int64_t num_layers,
                         const kvd_launch_t *launch)
{
    kvd__cuda_load_kernels();
    switch (kvd__common_align(align_bits | (uint64_t)p.row_bytes, 16)) {
    case 16:
        return launch_width<uint4>(p, num_layers, launch);
    case 8:
        return launch_width<uint2>(p, num_layers, launch);
    case 4:
        return launch_width<uint32_t>(p, num_layers, launch);
    case 2:
        return launch_width<uint16_t>(p, num_layers, launch);
    default:
        return launch_width<uint8_t>(p, num_layers, launch);
    }
}

/* --- copy engines ------------------------------------------------------- */

/* Host scratch for the batch descriptors, reused across calls. */
struct CeScratch {
    void **dsts;
    const void **srcs;
    size_t *sizes;
    size_t cap;
    int side_device; /* device of side/before/after, -1 = none yet */
    cudaStream_t side;
    cudaEvent_t before;
    cudaEvent_t after;
};
thread_local CeScratch ce_scratch = {NULL, NULL, NULL, 0, -1, 0, 0, 0};

/* This thread's side stream and events for the current device. */
kvd_status_t ce_side_stream_ready(void)
{
    CeScratch &c = ce_scratch;
    int dev;
    KVD_CUDA_TRY(cudaGetDevice(&dev));
    if (c.side_device == dev)
        return KVD_OK;
    if (c.side_device >= 0) { /* the thread moved to another device */
        int cur = dev;
        KVD_CUDA_TRY(cudaSetDevice(c.side_device));
        cudaStreamDestroy(c.side);
        cudaEventDestroy(c.before);
        cudaEventDestroy(c.after);
        c.side_device = -1;
        KVD_CUDA_TRY(cudaSetDevice(cur));
    }
    KVD_CUDA_TRY(cudaStreamCreateWithFlags(&c.side, cudaStreamNonBlocking));
    KVD_CUDA_TRY(cudaEventCreateWithFlags(&c.before, cudaEventDisableTiming));
    KVD_CUDA_TRY(cudaEventCreateWithFlags(&c.after, cudaEventDisableTiming));
    c.side_device = dev;
    return KVD_OK;
}

kvd_status_t ce_reserve(size_t n)
{
    CeScratch &c = ce_scratch;
    if (n <= c.cap)
        return KVD_OK;
    size_t cap = c.cap ? c.cap : 1024;
    while (cap < n)
        cap *= 2;
    void **d = (void **)realloc(c.dsts, cap * sizeof(*d));
    if (d)
        c.dsts = d;
    const void **s = (const void **)realloc(c.srcs, cap * sizeof(*s));
    if (s)
        c.srcs = s;
    size_t *z = (size_t *)realloc(c.sizes, cap * sizeof(*z));
    if (z)
        c.sizes = z;
    if (!d || !s || !z)
        return kvd__fail(KVD_ENOMEM, "kv_transfer: no memory for %zu copy descriptors", n);
    c.cap = cap;
    return KVD_OK;
}

/* True when the host may read p directly (host memory, pinned or not). */
bool host_readable(const void *ptr)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost ||
           a.type == cudaMemoryTypeManaged;
}

int64_t host_index(const void *p, bool is64, int64_t i)
{
    return is64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* Descriptors per batch: bounds the host scratch whatever the row count
 * (the GPU suite's largest copy-engine case spans several batches). */
constexpr size_t kCeBatch = (size_t)1 << 14;

/* Runs under this many bytes on average go one call each with
 * KVD_LAUNCH_COPY_EACH. */
constexpr size_t kCeEachBelow = (size_t)32 << 10;

/* Hand n copies to the copy engines, in the caller's stream order. */
kvd_status_t ce_flush(size_t n, const kvd_launch_t *launch)
{
    CeScratch &c = ce_scratch;
    cudaStream_t stream = kvd__stream(launch);
    if (launch && (launch->flags & KVD_LAUNCH_COPY_EACH)) {
        size_t total = 0;
        for (size_t i = 0; i < n; i++)
            total += c.sizes[i];
        if (total < kCeEachBelow * n) {
            for (size_t i = 0; i < n; i++)
                KVD_CUDA_TRY(cudaMemcpyAsync(c.dsts[i], c.srcs[i], c.sizes[i], cudaMemcpyDefault,
                                             stream));
            return KVD_OK;
        }
    }
    cudaMemcpyAttributes attr;
    memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_idx = 0;
    if (stream != 0) {
        KVD_CUDA_TRY(cudaMemcpyBatchAsync(c.dsts, c.srcs, c.sizes, n, &attr, &attr_idx, 1, stream));
        return KVD_OK;
    }
    /* Batches refuse the legacy default stream: run the batch on a side
     * stream ordered after and before it by events. */
    kvd_status_t st = ce_side_stream_ready();
    if (st != KVD_OK)
        return st;
    KVD_CUDA_TRY(cudaEventRecord(c.before, 0));
    KVD_CUDA_TRY(cudaStreamWaitEvent(c.side, c.before, 0));
    KVD_CUDA_TRY(cudaMemcpyBatchAsync(c.dsts, c.srcs, c.sizes, n, &attr, &attr_idx, 1, c.side));
    KVD_CUDA_TRY(cudaEventRecord(c.after, c.side));
    KVD_CUDA_TRY(cudaStreamWaitEvent(0, c.after, 0));
    return KVD_OK;
}

/* Whether p lies in pinned (page-locked or registered) host memory, in
 * device memory, or neither. */
enum class Mem { Other, Pinned, Device };

Mem mem_of(const void *ptr)
{
    cudaPointerAttributes a;
    if (ptr == NULL || cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        (void)cudaGetLastError();
        return Mem::Other;
    }
    return a.type == cudaMemoryTypeHost ? Mem::Pinned
           : a.type == cudaMemoryTypeDevice ? Mem::Device
                                            : Mem::Other;
}

/* The bytes from one layer of a side's buffer to the next when every layer
 * is the same distance on (a stride, or a table that happens to be one),
 * positive and within the copy engines' pitch; 0 otherwise. */
int64_t layer_pitch(const uint64_t *tab, int64_t stride, int64_t num_layers, int64_t max_pitch)
{
    int64_t pitch = stride;
    if (tab != NULL) {
        pitch = (int64_t)(tab[1] - tab[0]);
        for (int64_t l = 2; l < num_layers; l++)
            if ((int64_t)(tab[l] - tab[l - 1]) != pitch)
                return 0;
    }
    return pitch > 0 && pitch <= max_pitch ? pitch : 0;
}

/* Where a layer of buffer buf begins, on the source side and the
 * destination side. */
const char *src_base(const RowCopy &p, int buf, int64_t layer)
{
    return p.src_tab[buf] ? (const char *)(uintptr_t)p.src_tab[buf][layer]
                          : p.src[buf] + layer * p.src_layer_stride;
}

char *dst_base(const RowCopy &p, int buf, int64_t layer)
{
    return p.dst_tab[buf] ? (char *)(uintptr_t)p.dst_tab[buf][layer]
                          : p.dst[buf] + layer * p.dst_layer_stride;
}

/* Calls emit(src_row, dst_row) for each index pair of buffer buf in one
 * layer: negative indices are padding, out-of-range pairs are counted in
 * *oob (when given) and skipped.  Stops at emit's first error. */
template <typename Emit>
kvd_status_t for_each_row(const RowCopy &p, int buf, int64_t layer, unsigned long long *oob,
                          Emit emit)
{
    const char *sbase = src_base(p, buf, layer);
    char *dbase = dst_base(p, buf, layer);
    for (int64_t i = 0; i < p.count; i++) {
        int64_t d = host_index(p.dst_idx, p.idx64, i);
        int64_t s = p.src_idx ? host_index(p.src_idx, p.idx64, i) : i;
        if (d < 0 || s < 0)
            continue;
        if (d >= p.dst_slots || (p.src_idx && s >= p.src_slots)) {
            if (oob)
                (*oob)++;
            continue;
        }
        kvd_status_t st = emit(sbase + s * p.src_stride[buf], dbase + d * p.dst_stride[buf]);
        if (st != KVD_OK)
            return st;
    }
    return KVD_OK;
}

/* The distances between layers of buffer buf on each side when every run
 * of its rows may go as one 2D copy over all layers (the caller asked for
 * 2D copies, and vouches that each side's layers lie in one allocation):
 * evenly spaced within the copy engines' pitch and at least a row apart
 * (a row wider than a pitch would overlap the next layer).  False
 * otherwise. */
bool flat_pitches(const RowCopy &p, int buf, int64_t num_layers, int max_pitch, int64_t *spitch,
                  int64_t *dpitch)
{
    *spitch = layer_pitch(p.src_tab[buf], p.src_layer_stride, num_layers, max_pitch);
    *dpitch = layer_pitch(p.dst_tab[buf], p.dst_layer_stride, num_layers, max_pitch);
    return *spitch >= p.row_bytes && *dpitch >= p.row_bytes;
}

/*
 * Buffer buf's rows as 2D copies, a run of rows (consecutive on both
 * sides, at most the narrower pitch wide) each: width the run, height the
 * layers, each side's layer distance its pitch.
 */
kvd_status_t copy_2d(const RowCopy &p, int buf, int64_t num_layers, int64_t spitch,
                     int64_t dpitch, cudaStream_t stream, unsigned long long *oob)
{
    const int64_t widest = spitch < dpitch ? spitch : dpitch;
    const char *run_src = NULL;
    char *run_dst = NULL;
    int64_t run_bytes = 0;
    auto issue = [&]() -> kvd_status_t {
        cudaError_t e = cudaMemcpy2DAsync(run_dst, (size_t)dpitch, run_src, (size_t)spitch,
                                          (size_t)run_bytes, (size_t)num_layers,
                                          cudaMemcpyDefault, stream);
        if (e != cudaSuccess)
            return kvd__cuda_fail(e, "cudaMemcpy2DAsync", __FILE__, __LINE__);
        return KVD_OK;
    };
    kvd_status_t st = for_each_row(p, buf, 0, oob, [&](const char *sr, char *dr) {
        if (run_bytes > 0 && run_src + run_bytes == sr && run_dst + run_bytes == dr &&
            run_bytes + p.row_bytes <= widest) {
            run_bytes += p.row_bytes;
            return KVD_OK;
        }
        if (run_bytes > 0) {
            kvd_status_t s2 = issue();
            if (s2 != KVD_OK)
                return s2;
        }
        run_src = sr;
        run_dst = dr;
        run_bytes = p.row_bytes;
        return KVD_OK;
    });
    if (st == KVD_OK && run_bytes > 0)
        st = issue();
    return st;
}

/*
 * Every row becomes one copy of a batch; rows that continue the previous
 * copy on both sides (consecutive slots, packed rows) are merged into it.
 *
 * With KVD_LAUNCH_TABLES_ONE_ALLOCATION, between pinned host memory and
 * the device, where both sides' layers are evenly spaced, a run goes
 * instead as one 2D copy over all layers (copy_2d): one call for all
 * layers where a batch costs a descriptor per layer.  Device to device
 * stays in batches, which keep off the multiprocessors (a 2D copy there
 * may run as a kernel).
 *
 * Out-of-range pairs are counted on the host, where the counter must then
 * be host-readable too.
 */
kvd_status_t copy_engine(const RowCopy &p, int64_t num_layers, const kvd_launch_t *launch)
{
    if ((p.src_idx && !host_readable(p.src_idx)) || !host_readable(p.dst_idx))
        return kvd__fail(KVD_ENOTSUP, "kv_transfer: the copy-engine path needs host-readable "
                                      "index arrays");
    for (int b = 0; b < p.nbufs; b++)
        if ((p.src_tab[b] && !host_readable(p.src_tab[b])) ||
            (p.dst_tab[b] && !host_readable(p.dst_tab[b])))
            return kvd__fail(KVD_ENOTSUP, "kv_transfer: the copy-engine path needs host-readable "
                                          "layer tables");
    if (p.oob && !host_readable(p.oob))
        return kvd__fail(KVD_ENOTSUP, "kv_transfer: the copy-engine path needs a host-readable "
                                      "oob_count");

    kvd_status_t st = ce_reserve((size_t)p.tasks < kCeBatch ? (size_t)p.tasks : kCeBatch);
    if (st != KVD_OK)
        return st;
    CeScratch &c = ce_scratch;
    cudaStream_t stream = kvd__stream(launch);
    unsigned long long oob = 0;
    bool flat[2] = {false, false};

    /* the buffers whose layers go as 2D copies: their runs first */
    if (num_layers > 1 && launch && (launch->flags & KVD_LAUNCH_TABLES_ONE_ALLOCATION)) {
        Mem sm = mem_of(src_base(p, 0, 0)), dm = mem_of(dst_base(p, 0, 0));
        if ((sm == Mem::Pinned && dm == Mem::Device) || (sm == Mem::Device && dm == Mem::Pinned)) {
            int dev, max_pitch = 0;
            KVD_CUDA_TRY(cudaGetDevice(&dev));
            KVD_CUDA_TRY(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, dev));
            for (int buf = 0; buf < p.nbufs; buf++) {
                int64_t spitch, dpitch;
                if (!flat_pitches(p, buf, num_layers, max_pitch, &spitch, &dpitch))
                    continue;
                unsigned long long buf_oob = 0;
                st = copy_2d(p, buf, num_layers, spitch, dpitch, stream, &buf_oob);
                if (st != KVD_OK)
                    return st;
                flat[buf] = true;
                if (buf == 0)
                    oob = buf_oob;
            }
        }
    }

    /* the rest in batches: a descriptor per row and layer, runs merged */
    size_t n = 0;
    for (int64_t layer = 0; layer < num_layers; layer++) {
        for (int buf = 0; buf < p.nbufs; buf++) {
            if (flat[buf])
                continue;
            size_t run_start = n;
            st = for_each_row(p, buf, layer, layer == 0 && buf == 0 ? &oob : NULL,
                              [&](const char *sr, char *dr) {
                if (n > run_start && (const char *)c.srcs[n - 1] + c.sizes[n - 1] == sr &&
                    (char *)c.dsts[n - 1] + c.sizes[n - 1] == dr) {
                    c.sizes[n - 1] += (size_t)p.row_bytes;
                    return KVD_OK;
                }
                if (n == kCeBatch) { /* full: send it, start the next batch */
                    kvd_status_t s2 = ce_flush(n, launch);
                    if (s2 != KVD_OK)
                        return s2;
                    n = run_start = 0;
                }
                c.dsts[n] = dr;
                c.srcs[n] = sr;
                c.sizes[n] = (size_t)p.row_bytes;
                n++;
                return KVD_OK;
            });
            if (st != KVD_OK)
                return st;
        }
    }
    if (n > 0 && (st = ce_flush(n, launch)) != KVD_OK)
        return st;
    if (p.oob && oob)
        *p.oob += oob;
    return KVD_OK;
}

kvd_status_t run(const RowCopy &p, uint64_t align_bits, int64_t num_layers,
                 const kvd_launch_t *launch)
{
    if (launch && (launch->flags & KVD_LAUNCH_COPY_ENGINE))
        return copy_engine(p, num_layers, launch);
    return launch_copy(p, align_bits, num_layers, launch);
}

} // namespace

void kvd__load_copy_rows_kernels(void)
{
    load_width<uint4>();
    load_width<uint2>();
    load_width<uint32_t>();
    load_width<uint16_t>();
    load_width<uint8_t>();
}

extern "C" kvd_status_t kvd_cuda_kv_store(const kvd_store_args_t *a, const kvd_launch_t *launch)
{
    kvd__clear_error();
    kvd_status_t st = kvd__check_store(a);
    if (st != KVD_OK || a->num_tokens == 0)
        return st;
    if (launch && (launch->flags & KVD_LAUNCH_COPY_ENGINE))
        return kvd__fail(KVD_ENOTSUP, "kv_store: the copy-engine path is for transfers only");

    RowCopy p;
    memset(&p, 0, sizeof(p));
    p.nbufs = a->v_src ? 2 : 1;
    p.src[0] = (const char *)a->k_src;
    p.src[1] = (const char *)a->v_src;
    p.dst[0] = (char *)a->k_dst;
    p.dst[1] = (char *)a->v_dst;
    p.src_stride[0] = a->k_src_stride;
    p.src_stride[1] = a->v_src_stride;
    p.dst_stride[0] = a->k_dst_stride;
    p.dst_stride[1] = a->v_dst_stride;
    p.src_slots = a->num_tokens;
    p.dst_slots = a->num_slots;
    p.dst_idx = a->loc;
    p.idx64 = a->loc_dtype == KVD_DTYPE_I64;
    p.count = a->num_tokens;
    p.tasks = a->num_tokens * p.nbufs;
    p.row_bytes = a->row_bytes;
    p.oob = a->oob_count;

    uint64_t bits = (uintptr_t)a->k_src | (uintptr_t)a->k_dst | (uint64_t)a->k_src_stride |
                    (uint64_t)a->k_dst_stride;
    if (p.nbufs == 2)
        bits |= (uintptr_t)a->v_src | (uintptr_t)a->v_dst | (uint64_t)a->v_src_stride |
                (uint64_t)a->v_dst_stride;
    return launch_copy(p, bits, 1, launch);
}

extern "C" kvd_status_t kvd_cuda_kv_transfer(const kvd_transfer_args_t *a,
                                             const kvd_launch_t *launch)
{
    kvd__clear_error();
    kvd_status_t st = kvd__check_transfer(a);
    if (st != KVD_OK || a->count == 0)
        return st;

    const kvd_kv_side_t *src = &a->src, *dst = &a->dst;
    RowCopy p;
    memset(&p, 0, sizeof(p));
    p.nbufs = (src->v || src->v_layers) ? 2 : 1;
    p.src[0] = (const char *)src->k;
    p.src[1] = (const char *)src->v;
    p.dst[0] = (char *)dst->k;
    p.dst[1] = (char *)dst->v;
    p.src_tab[0] = src->k_layers;
    p.src_tab[1] = p.nbufs == 2 ? src->v_layers : NULL;
    p.dst_tab[0] = dst->k_layers;
    p.dst_tab[1] = p.nbufs == 2 ? dst->v_layers : NULL;
    p.src_layer_stride = a->num_layers > 1 ? src->layer_stride : 0;
    p.dst_layer_stride = a->num_layers > 1 ? dst->layer_stride : 0;
    p.src_stride[0] = p.src_stride[1] = src->slot_stride;
    p.dst_stride[0] = p.dst_stride[1] = dst->slot_stride;
    p.src_slots = src->num_slots;
    p.dst_slots = dst->num_slots;
    p.src_idx = a->src_idx;
    p.dst_idx = a->dst_idx;
    p.idx64 = a->idx_dtype == KVD_DTYPE_I64;
    p.count = a->count;
    p.tasks = a->count * p.nbufs * a->num_layers; /* checked against overflow */
    p.row_bytes = a->row_bytes;
    p.oob = a->oob_count;

    uint64_t bits = (uint64_t)src->slot_stride | (uint64_t)dst->slot_stride;
    for (int b = 0; b < p.nbufs; b++) {
        if (!p.src_tab[b])
            bits |= (uintptr_t)p.src[b] | (uint64_t)p.src_layer_stride;
        if (!p.dst_tab[b])
            bits |= (uintptr_t)p.dst[b] | (uint64_t)p.dst_layer_stride;
    }
    return run(p, bits, a->num_layers, launch);
}
