/*
 * FP8 quantize-and-set: K/V rows of bf16, f16 or f32 are scaled, converted
 * to e4m3 or e5m2 by the hardware (cvt.rn.satfinite: round to nearest
 * even, saturate to the largest finite value, NaN to 0x7f) and scattered
 * into a flat or paged cache.
 *
 * Work split as in copy_rows.cu: a group of lanes per (token, K or V) row,
 * each lane converting vectors of VE elements (16 bytes of input when the
 * layout allows it); small calls one pass with a lane per vector, larger
 * ones UNROLL vectors per lane loaded before the first is converted, the
 * largest a grid-stride loop.  The source row and a device scale do not
 * depend on the slot index, so the one-pass kernels load them together
 * with it.
 */
#include <cuda_fp8.h>
#include <string.h>

#include "cuda_common.cuh"

namespace {

constexpr int kUnroll = 4;

enum SrcKind { kF32 = 0, kF16 = 1, kBF16 = 2 };

struct Fp8Set {
    const char *src[2];
    int64_t src_token_stride[2];
    int64_t src_head_stride[2];
    char *cache[2];
    int64_t page_stride[2];
    int64_t slot_stride[2];
    int64_t head_stride[2];
    int64_t page_size;
    int page_shift; /* log2(page_size), or -1 when not a power of two */
    int64_t num_slots;
    int64_t num_tokens;
    int64_t tasks; /* num_tokens * nbufs */
    int64_t vecs_per_head;
    int vph_shift; /* log2(vecs_per_head), or -1 when not a power of two */
    int64_t vecs_per_row;
    const void *loc;
    bool idx64;
    int nbufs;
    int scale_mode;
    float inv_host[2];
    const float *scale_ptr[2];
    unsigned long long *oob;
};

template <int KIND> __device__ __forceinline__ float to_float(uint32_t bits);
template <> __device__ __forceinline__ float to_float<kF32>(uint32_t bits)
{
    return __uint_as_float(bits);
}
template <> __device__ __forceinline__ float to_float<kF16>(uint32_t bits)
{
    return __half2float(__ushort_as_half((unsigned short)bits));
}
template <> __device__ __forceinline__ float to_float<kBF16>(uint32_t bits)
{
    return __uint_as_float(bits << 16);
}

/* VE input elements as raw bits: one 16-byte vector or one element. */
template <int KIND, int VE> struct Raw {
    static constexpr int kBytes = VE * (KIND == kF32 ? 4 : 2);
    using T = typename std::conditional<
        kBytes == 16, uint4,
        typename std::conditional<kBytes == 4, uint32_t, uint16_t>::type>::type;
};

template <int KIND, int VE>
__device__ __forceinline__ float element(const typename Raw<KIND, VE>::T &r, int j)
{
    if constexpr (Raw<KIND, VE>::kBytes == 16) {
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
        if constexpr (KIND == kF32)
            return to_float<KIND>(w[j]);
        else
            return to_float<KIND>((w[j >> 1] >> ((j & 1) * 16)) & 0xffffu);
    } else {
        return to_float<KIND>((uint32_t)r);
    }
}

/* VE output bytes. */
template <int VE> struct Out {
    using T = typename std::conditional<
        VE == 8, uint2, typename std::conditional<VE == 4, uint32_t, uint8_t>::type>::type;
};

template <bool E5M2> __device__ __forceinline__ uint32_t cvt2(float a, float b)
{
    /* the low byte holds a */
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE,
                                              E5M2 ? __NV_E5M2 : __NV_E4M3);
}

template <int KIND, int VE, bool E5M2>
__device__ __forceinline__ typename Out<VE>::T convert(const typename Raw<KIND, VE>::T &r,
                                                       float inv, bool scaled)
{
    float f[VE];
#pragma unroll
    for (int j = 0; j < VE; j++) {
        f[j] = element<KIND, VE>(r, j);
        if (scaled)
            f[j] = __fmul_rn(f[j], inv);
    }
    if constexpr (VE == 1) {
        return (uint8_t)__nv_cvt_float_to_fp8(f[0], __NV_SATFINITE, E5M2 ? __NV_E5M2 : __NV_E4M3);
    } else if constexpr (VE == 4) {
        return cvt2<E5M2>(f[0], f[1]) | (cvt2<E5M2>(f[2], f[3]) << 16);
    } else {
        uint2 o;
        o.x = cvt2<E5M2>(f[0], f[1]) | (cvt2<E5M2>(f[2], f[3]) << 16);
        o.y = cvt2<E5M2>(f[4], f[5]) | (cvt2<E5M2>(f[6], f[7]) << 16);
        return o;
    }
}

/* n / d (non-negative): out of line, since it is long and only huge rows
 * or slot numbers need it. */
__device__ __noinline__ int64_t div64(int64_t n, int64_t d)
{
    return n / d;
}

/* Vector v of a row: head h, vector e within the head.  Shift when the
 * vectors per head are a power of two, 32-bit division when the row allows
 * it: the 64-bit division costs more than the conversion. */
__device__ __forceinline__ void head_of(int64_t v, int64_t vph, int vph_shift, int64_t *h,
                                        int64_t *e)
{
    if (vph_shift >= 0) {
        *h = v >> vph_shift;
        *e = v & (vph - 1);
    } else if ((uint64_t)(v | vph) <= UINT32_MAX) {
        const uint32_t q = (uint32_t)v / (uint32_t)vph;
        *h = q;
        *e = (uint32_t)v - q * (uint32_t)vph;
    } else {
        *h = div64(v, vph);
        *e = v - *h * vph;
    }
}

/* Slot -> its row in the cache: shift and mask for a power-of-two page
 * size, 32-bit division when the numbers allow it. */
__device__ __forceinline__ char *slot_row(const Fp8Set &p, int buf, int64_t slot)
{
    int64_t page, off;
    if (p.page_shift >= 0) {
        page = slot >> p.page_shift;
        off = slot & (p.page_size - 1);
    } else if ((uint64_t)(slot | p.page_size) <= UINT32_MAX) {
        const uint32_t q = (uint32_t)slot / (uint32_t)p.page_size;
        page = q;
        off = (uint32_t)slot - q * (uint32_t)p.page_size;
    } else {
        page = div64(slot, p.page_size);
        off = slot - page * p.page_size;
    }
    return p.cache[buf] + page * p.page_stride[buf] + off * p.slot_stride[buf];
}

/* Vectors v0, v0 + g, ... (U of them, those below vecs_per_row) of a
 * source row, loaded. */
template <int KIND, int VE, int U>
__device__ __forceinline__ void load_vecs(const Fp8Set &p, int buf, const char *srow, int64_t v0,
                                          int g, typename Raw<KIND, VE>::T (&r)[U])
{
    using RawT = typename Raw<KIND, VE>::T;
    const int64_t sh = p.src_head_stride[buf];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t v = v0 + u * g;
        if (v < p.vecs_per_row) {
            int64_t h, e;
            head_of(v, p.vecs_per_head, p.vph_shift, &h, &e);
            r[u] = *(const RawT *)(srow + h * sh + e * VE * (KIND == kF32 ? 4 : 2));
        }
    }
}

/* The same vectors, scaled, converted and stored into the cache row. */
template <int KIND, int VE, bool E5M2, int U>
__device__ __forceinline__ void store_vecs(const Fp8Set &p, int buf, char *drow, int64_t v0, int g,
                                           const typename Raw<KIND, VE>::T (&r)[U], float inv)
{
    using OutT = typename Out<VE>::T;
    const int64_t dh = p.head_stride[buf];
    const bool scaled = p.scale_mode != KVD_SCALE_NONE;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t v = v0 + u * g;
        if (v < p.vecs_per_row) {
            int64_t h, e;
            head_of(v, p.vecs_per_head, p.vph_shift, &h, &e);
            const float hinv =
                p.scale_mode == KVD_SCALE_PER_HEAD ? __frcp_rn(p.scale_ptr[buf][h]) : inv;
            *(OutT *)(drow + h * dh + e * VE) = convert<KIND, VE, E5M2>(r[u], hinv, scaled);
        }
    }
}

template <int KIND, int VE, bool E5M2>
__global__ void __launch_bounds__(KVD_BLOCK_THREADS, KVD_MIN_BLOCKS_PER_SM) fp8_set_kernel(const Fp8Set p, int gshift)
{
    using RawT = typename Raw<KIND, VE>::T;
    const int g = 1 << gshift;
    const int lane = threadIdx.x & (g - 1);
    const int64_t ngroups = ((int64_t)gridDim.x * blockDim.x) >> gshift;

    for (int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> gshift; t < p.tasks;
         t += ngroups) {
        int64_t i;
        int buf;
        if (p.tasks <= UINT32_MAX) {
            i = (uint32_t)t % (uint32_t)p.num_tokens;
            buf = (int)((uint32_t)t / (uint32_t)p.num_tokens);
        } else {
            i = t % p.num_tokens;
            buf = (int)(t / p.num_tokens);
        }

        const int64_t slot = kvd__load_index(p.loc, p.idx64, i);
        if (slot < 0)
            continue; /* padding */
        if (slot >= p.num_slots) {
            if (buf == 0 && lane == 0 && p.oob)
                atomicAdd(p.oob, 1ull);
            continue;
        }
        const char *srow = p.src[buf] + i * p.src_token_stride[buf];
        char *drow = slot_row(p, buf, slot);

        float inv = 1.0f;
        if (p.scale_mode == KVD_SCALE_HOST)
            inv = p.inv_host[buf];
        else if (p.scale_mode == KVD_SCALE_DEVICE)
            inv = __frcp_rn(p.scale_ptr[buf][0]);

        for (int64_t v0 = lane; v0 < p.vecs_per_row; v0 += (int64_t)g * kUnroll) {
            RawT r[kUnroll];
            load_vecs<KIND, VE, kUnroll>(p, buf, srow, v0, g, r);
            store_vecs<KIND, VE, E5M2, kUnroll>(p, buf, drow, v0, g, r, inv);
        }
    }
}

/*
 * One pass: group i of block row buf converts token i's K (buf 0) or V row,
 * and nothing else; for calls whose groups the device holds all at once.
 * The source row is token i's and the scale is known, so both load in the
 * same round trip as the slot index; only the stores wait for the slot.
 */
template <int KIND, int VE, bool E5M2, int U>
__global__ void __launch_bounds__(KVD_BLOCK_THREADS, KVD_MIN_BLOCKS_PER_SM) fp8_set_once(const Fp8Set p, int gshift)
{
    using RawT = typename Raw<KIND, VE>::T;
    const int g = 1 << gshift;
    const int lane = threadIdx.x & (g - 1);
    const uint32_t i = (blockIdx.x * blockDim.x + threadIdx.x) >> gshift;
    if (i >= (uint32_t)p.num_tokens)
        return;
    const int buf = (int)blockIdx.y;
    const int64_t slot = kvd__load_index(p.loc, p.idx64, i);
    const char *srow = p.src[buf] + (int64_t)i * p.src_token_stride[buf];
    float scale = 1.0f;
    if (p.scale_mode == KVD_SCALE_DEVICE)
        scale = p.scale_ptr[buf][0];
    RawT r[U];
    load_vecs<KIND, VE, U>(p, buf, srow, lane, g, r);
    if (slot < 0)
        return; /* padding */
    if (slot >= p.num_slots) {
        if (buf == 0 && lane == 0 && p.oob)
            atomicAdd(p.oob, 1ull);
        return;
    }
    char *drow = slot_row(p, buf, slot);
    float inv = 1.0f;
    if (p.scale_mode == KVD_SCALE_HOST)
        inv = p.inv_host[buf];
    else if (p.scale_mode == KVD_SCALE_DEVICE)
        inv = __frcp_rn(scale);
    store_vecs<KIND, VE, E5M2, U>(p, buf, drow, lane, g, r, inv);
    for (int64_t v0 = lane + (int64_t)g * U; v0 < p.vecs_per_row; v0 += (int64_t)g * U) {
        load_vecs<KIND, VE, U>(p, buf, srow, v0, g, r);
        store_vecs<KIND, VE, E5M2, U>(p, buf, drow, v0, g, r, inv);
    }
}

int group_shift(int64_t vecs)
{
    int64_t per_lane = (vecs + kUnroll - 1) / kUnroll;
    int shift = 0;
    while (shift < 5 && ((int64_t)1 << shift) < per_lane)
        shift++;
    return shift;
}

template <int KIND, int VE, bool E5M2, int U>
kvd_status_t launch_once(const Fp8Set &p, int64_t bx, int gshift, const kvd_launch_t *launch)
{
    const dim3 grid((unsigned)bx, (unsigned)p.nbufs);
    fp8_set_once<KIND, VE, E5M2, U><<<grid, KVD_BLOCK_THREADS, 0, kvd__stream(launch)>>>(p, gshift);
    KVD_CUDA_LAUNCHED("fp8_set_once");
    return KVD_OK;
}

/* Shapes by size, as in copy_rows.cu: wide one pass (a lane per vector,
 * when every row fits on the device at once), narrow one pass (UNROLL
 * vectors per lane, up to KVD_ONE_PASS_WAVES), then the grid-stride loop. */
template <int KIND, int VE, bool E5M2>
kvd_status_t launch_vec(Fp8Set &p, int64_t head_dim, const kvd_launch_t *launch)
{
    p.vecs_per_head = head_dim / VE;
    p.vph_shift = -1;
    for (int b = 0; b < 63; b++)
        if (p.vecs_per_head == (int64_t)1 << b)
            p.vph_shift = b;
    p.vecs_per_row = p.vecs_per_row * p.vecs_per_head; /* caller put num_heads there */

    kvd_grid_limits_t g;
    kvd_status_t st = kvd__cuda_limits(launch, &g);
    if (st != KVD_OK)
        return st;
    const int wshift = kvd__wide_shift(p.vecs_per_row);
    int64_t per_block = KVD_BLOCK_THREADS >> wshift;
    int64_t bx = p.num_tokens / per_block + (p.num_tokens % per_block != 0);
    if (kvd__mul_sat(bx, p.nbufs) <= g.one_wave)
        return launch_once<KIND, VE, E5M2, 1>(p, bx, wshift, launch);
    const int gshift = group_shift(p.vecs_per_row);
    per_block = KVD_BLOCK_THREADS >> gshift;
    bx = p.num_tokens / per_block + (p.num_tokens % per_block != 0);
    if (kvd__mul_sat(bx, p.nbufs) <= g.waves)
        return launch_once<KIND, VE, E5M2, kUnroll>(p, bx, gshift, launch);

    const unsigned blocks = kvd__grid_blocks(&g, kvd__mul_sat(p.tasks, (int64_t)1 << gshift));
    fp8_set_kernel<KIND, VE, E5M2><<<blocks, KVD_BLOCK_THREADS, 0, kvd__stream(launch)>>>(p, gshift);
    KVD_CUDA_LAUNCHED("fp8_set_kernel");
    return KVD_OK;
}

template <int KIND, int VE, bool E5M2> void load_vec(void)
{
    cudaFuncAttributes a;
    (void)cudaFuncGetAttributes(&a, (const void *)fp8_set_kernel<KIND, VE, E5M2>);
    (void)cudaFuncGetAttributes(&a, (const void *)fp8_set_once<KIND, VE, E5M2, 1>);
    (void)cudaFuncGetAttributes(&a, (const void *)fp8_set_once<KIND, VE, E5M2, kUnroll>);
}

template <int KIND, bool E5M2> void load_kind(void)
{
    load_vec<KIND, KIND == kF32 ? 4 : 8, E5M2>();
    load_vec<KIND, 1, E5M2>();
}

template <int KIND, bool E5M2>
kvd_status_t launch_kind(Fp8Set &p, int64_t head_dim, bool wide, const kvd_launch_t *l)
{
    constexpr int kWide = KIND == kF32 ? 4 : 8;
    return wide ? launch_vec<KIND, kWide, E5M2>(p, head_dim, l)
                : launch_vec<KIND, 1, E5M2>(p, head_dim, l);
}

template <bool E5M2>
kvd_status_t launch_fmt(Fp8Set &p, int kind, int64_t head_dim, bool wide, const kvd_launch_t *l)
{
    switch (kind) {
    case kF32:
        return launch_kind<kF32, E5M2>(p, head_dim, wide, l);
    case kF16:
        return launch_kind<kF16, E5M2>(p, head_dim, wide, l);
    default:
        return launch_kind<kBF16, E5M2>(p, head_dim, wide, l);
    }
}

} // namespace

void kvd__load_fp8_kernels(void)
{
    load_kind<kF32, false>();
    load_kind<kF16, false>();
    load_kind<kBF16, false>();
    load_kind<kF32, true>();
    load_kind<kF16, true>();
    load_kind<kBF16, true>();
}

extern "C" kvd_status_t kvd_cuda_fp8_set(const kvd_fp8_set_args_t *a, const kvd_launch_t *launch)
{
    kvd__clear_error();
    kvd_status_t st = kvd__check_fp8_set(a);
    if (st != KVD_OK || a->num_tokens == 0)
        return st;

    Fp8Set p;
    memset(&p, 0, sizeof(p));
    p.nbufs = a->v_src ? 2 : 1;
    p.src[0] = (const char *)a->k_src;
    p.src[1] = (const char *)a->v_src;
    p.src_token_stride[0] = a->k_src_token_stride;
    p.src_token_stride[1] = a->v_src_token_stride;
    p.src_head_stride[0] = a->k_src_head_stride;
    p.src_head_stride[1] = a->v_src_head_stride;
    p.cache[0] = (char *)a->k_cache;
    p.cache[1] = (char *)a->v_cache;
    p.page_stride[0] = a->k_page_stride;
    p.page_stride[1] = a->v_page_stride;
    p.slot_stride[0] = a->k_slot_stride;
    p.slot_stride[1] = a->v_slot_stride;
    p.head_stride[0] = a->k_head_stride;
    p.head_stride[1] = a->v_head_stride;
    p.page_size = a->page_size;
    p.page_shift = -1;
    for (int b = 0; b < 63; b++)
        if (a->page_size == (int64_t)1 << b)
            p.page_shift = b;
    p.num_slots = a->num_slots;
    p.num_tokens = a->num_tokens;
    p.tasks = a->num_tokens * p.nbufs;
    p.vecs_per_row = a->num_heads; /* times vectors per head, set at launch */
    p.loc = a->loc;
    p.idx64 = a->loc_dtype == KVD_DTYPE_I64;
    p.scale_mode = a->scale_mode;
    if (a->scale_mode == KVD_SCALE_HOST) {
        /* float division, correctly rounded, as the device would do it */
        volatile float one = 1.0f;
        p.inv_host[0] = one / a->k_scale;
        p.inv_host[1] = one / a->v_scale;
    }
    p.scale_ptr[0] = a->k_scale_ptr;
    p.scale_ptr[1] = a->v_scale_ptr;
    p.oob = a->oob_count;

    const int kind = a->src_dtype == KVD_DTYPE_F32 ? kF32 : a->src_dtype == KVD_DTYPE_F16 ? kF16 : kBF16;
    const int wide_elems = kind == kF32 ? 4 : 8;
    /* Wide vectors need whole vectors per head and every address aligned:
     * 16 bytes on the input side, wide_elems bytes on the cache side. */
    uint64_t in_bits = (uintptr_t)a->k_src | (uint64_t)a->k_src_token_stride;
    uint64_t out_bits = (uintptr_t)a->k_cache | (uint64_t)a->k_page_stride |
                        (uint64_t)a->k_slot_stride;
    if (a->num_heads > 1) { /* head strides are only used with several heads */
        in_bits |= (uint64_t)a->k_src_head_stride;
        out_bits |= (uint64_t)a->k_head_stride;
    }
    if (p.nbufs == 2) {
        in_bits |= (uintptr_t)a->v_src | (uint64_t)a->v_src_token_stride;
        out_bits |= (uintptr_t)a->v_cache | (uint64_t)a->v_page_stride |
                    (uint64_t)a->v_slot_stride;
        if (a->num_heads > 1) {
            in_bits |= (uint64_t)a->v_src_head_stride;
            out_bits |= (uint64_t)a->v_head_stride;
        }
    }
    const bool wide = a->head_dim % wide_elems == 0 && (in_bits & 15) == 0 &&
                      (out_bits & (uint64_t)(wide_elems - 1)) == 0;

    kvd__cuda_load_kernels();
    if (a->cache_dtype == KVD_DTYPE_E5M2)
        return launch_fmt<true>(p, kind, a->head_dim, wide, launch);
    return launch_fmt<false>(p, kind, a->head_dim, wide, launch);
}
