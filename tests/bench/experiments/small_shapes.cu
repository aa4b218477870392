// Round 6 experiment (tests/bench/experiments/small_shapes.py drives it):
// kernel shapes for the small cases, outside the library.
// - small_copy: full semantics (padding, bounds, oob count), one block per
//   pair; NB=2 copies K and V in one block, NB=1 one buffer per block row;
// - st_min / tr_min / mla_min: the seed's shapes without any checks;
// - g_small: page-table gather with the library's semantics, VEC columns
//   per thread.
#include <cstdint>
#include <cuda_runtime.h>

struct Small {
  const char *src[2]; char *dst[2]; int64_t sstride[2], dstride[2];
  const void *sidx, *didx; int64_t sslots, dslots; int vecs; unsigned long long *oob;
};

template <typename I> __device__ __forceinline__ int64_t ld(const void *p, int64_t i) { return ((const I *)p)[i]; }

// one block per pair; PAIR: the block copies buffer 0 and 1 (K and V)
template <typename V, typename I, bool STORE, int NB>
__global__ void __launch_bounds__(1024) small_copy(const Small p) {
  const int i = blockIdx.x, t = threadIdx.x;
  const int b0 = NB == 2 ? 0 : blockIdx.y;  // NB: buffers per block (2) or 1 per blockIdx.y
  // select, not index: a run-time index into the parameter struct copies it to the stack
  const char *sb[NB]; char *db[NB]; int64_t ss[NB], ds[NB];
#pragma unroll
  for (int b = 0; b < NB; b++) {
    const bool one = NB == 2 ? b == 1 : b0 == 1;
    sb[b] = one ? p.src[1] : p.src[0]; db[b] = one ? p.dst[1] : p.dst[0];
    ss[b] = one ? p.sstride[1] : p.sstride[0]; ds[b] = one ? p.dstride[1] : p.dstride[0];
  }
  const int64_t d = ld<I>(p.didx, i);
  int64_t s = i;
  V r[NB];
  if (STORE) {
#pragma unroll
    for (int b = 0; b < NB; b++) if (t < p.vecs) r[b] = ((const V *)(sb[b] + (int64_t)i * ss[b]))[t];
  } else {
    s = ld<I>(p.sidx, i);
  }
  if (d < 0 || s < 0) return;
  if (d >= p.dslots || (!STORE && s >= p.sslots)) {
    if (t == 0 && b0 == 0 && p.oob) atomicAdd(p.oob, 1ull);
    return;
  }
  if (t >= p.vecs) return;
  if (!STORE) {
#pragma unroll
    for (int b = 0; b < NB; b++) r[b] = ((const V *)(sb[b] + s * ss[b]))[t];
  }
#pragma unroll
  for (int b = 0; b < NB; b++) ((V *)(db[b] + d * ds[b]))[t] = r[b];
}

extern "C" int exp_small(int store, int nb, int pairblock, const void *k, const void *v, void *kc, void *vc,
                         const void *sidx, const void *didx, int n, long long row_bytes, long long sslots,
                         long long dslots, void *oob, int threads) {
  Small p = {};
  p.src[0] = (const char *)k; p.src[1] = (const char *)v; p.dst[0] = (char *)kc; p.dst[1] = (char *)vc;
  p.sstride[0] = p.sstride[1] = p.dstride[0] = p.dstride[1] = row_bytes;
  p.sidx = sidx; p.didx = didx; p.sslots = sslots; p.dslots = dslots; p.vecs = (int)(row_bytes / 16);
  p.oob = (unsigned long long *)oob;
  if (threads == 0) threads = (p.vecs + 31) / 32 * 32;
  if (nb == 1) {
    if (store) small_copy<uint4, int64_t, true, 1><<<dim3(n, 1), threads>>>(p);
    else small_copy<uint4, int64_t, false, 1><<<dim3(n, 1), threads>>>(p);
  } else if (pairblock) {
    if (store) small_copy<uint4, int64_t, true, 2><<<dim3(n, 1), threads>>>(p);
    else small_copy<uint4, int64_t, false, 2><<<dim3(n, 1), threads>>>(p);
  } else {
    if (store) small_copy<uint4, int64_t, true, 1><<<dim3(n, 2), threads>>>(p);
    else small_copy<uint4, int64_t, false, 1><<<dim3(n, 2), threads>>>(p);
  }
  return (int)cudaGetLastError();
}

// seed-shaped minimal kernels (no checks)
__global__ void st_min(const uint4 *k, const uint4 *v, uint4 *kc, uint4 *vc, const long long *loc, int vecs) {
  int row = blockIdx.y, isv = blockIdx.x, t = threadIdx.x;
  long long d = loc[row];
  if (t < vecs) (isv ? vc : kc)[d * vecs + t] = (isv ? v : k)[(long long)row * vecs + t];
}
__global__ void tr_min(const uint4 *sk, const uint4 *sv, uint4 *dk, uint4 *dv, const long long *si,
                       const long long *di, int vecs) {
  int row = blockIdx.x, t = threadIdx.x;
  long long s = si[row], d = di[row];
  if (t < vecs) { uint4 a = sk[s * vecs + t], b = sv[s * vecs + t]; dk[d * vecs + t] = a; dv[d * vecs + t] = b; }
}
__global__ void mla_min(const uint4 *src, uint4 *dst, const long long *si, const long long *di, int vecs) {
  int row = blockIdx.x, t = threadIdx.x;
  long long s = si[row], d = di[row];
  if (t < vecs) dst[d * vecs + t] = src[s * vecs + t];
}
extern "C" int exp_min(int kind, const void *k, const void *v, void *kc, void *vc, const void *si, const void *di,
                       int n, long long row_bytes) {
  int vecs = (int)(row_bytes / 16);
  if (kind == 0) st_min<<<dim3(2, n), 128>>>((const uint4 *)k, (const uint4 *)v, (uint4 *)kc, (uint4 *)vc, (const long long *)di, vecs);
  else if (kind == 1) tr_min<<<n, 128>>>((const uint4 *)k, (const uint4 *)v, (uint4 *)kc, (uint4 *)vc, (const long long *)si, (const long long *)di, vecs);
  else mla_min<<<n, 128>>>((const uint4 *)k, (uint4 *)kc, (const long long *)si, (const long long *)di, vecs);
  return (int)cudaGetLastError();
}

// gather: full semantics (padding rows, oob, table_cols), one thread per VEC columns
struct G { const int *table; int64_t rows, cols, stride; const long long *req; const int *seq; int *out;
           int64_t ostride, maxp, page; int dummy; unsigned long long *oob; };
template <int VEC>
__global__ void g_small(const G p) {
  const int r = blockIdx.y;
  const int64_t c = (int64_t)(blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (c >= p.maxp) return;
  const int64_t req = p.req[r];
  const int64_t len = p.seq[r];
  const bool live = req >= 0 && req < p.rows;
  if (req >= p.rows && c == 0 && p.oob) atomicAdd(p.oob, 1ull);
  int64_t n = live && len > 0 ? (len - 1) / p.page + 1 : 0;
  if (n > p.cols) n = p.cols;
  const int *src = p.table + (live ? req * p.stride : 0);
  int *dst = p.out + r * p.ostride;
  if (VEC == 4) {
    int4 v;
    if (c + 4 <= n) v = *(const int4 *)(src + c);
    else { v.x = c < n ? src[c] : p.dummy; v.y = c + 1 < n ? src[c + 1] : p.dummy;
           v.z = c + 2 < n ? src[c + 2] : p.dummy; v.w = c + 3 < n ? src[c + 3] : p.dummy; }
    if (c + 4 <= p.maxp) *(int4 *)(dst + c) = v;
    else { dst[c] = v.x; if (c + 1 < p.maxp) dst[c + 1] = v.y; if (c + 2 < p.maxp) dst[c + 2] = v.z; }
  } else {
    dst[c] = c < n ? src[c] : p.dummy;
  }
}
extern "C" int exp_gather(int vec, int threads, const void *table, long long rows, long long cols, long long stride,
                          const void *req, const void *seq, void *out, long long ostride, int bs, int maxp, int page,
                          int dummy, void *oob) {
  G p = {(const int *)table, rows, cols, stride, (const long long *)req, (const int *)seq, (int *)out, ostride, maxp, page, dummy,
         (unsigned long long *)oob};
  int per = threads * vec;
  dim3 grid((maxp + per - 1) / per, bs);
  if (vec == 4) g_small<4><<<grid, threads>>>(p); else g_small<1><<<grid, threads>>>(p);
  return (int)cudaGetLastError();
}
