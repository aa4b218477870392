// Round 11 experiment (tests/bench/experiments/gather_steps.py drives it, under ncu):
// the page-table gather in steps from the seed's kernel to the library's, to find
// where the library's gather loses its 0.2-0.3 us of kernel time at bs=1 and 64.
// - g_min: the seed's kernel in CUDA: separate arguments, 32-bit column
//   arithmetic, no bounds on the table (the seed has none), page size by shift;
// - g_full: the library's semantics (padding rows, table rows and columns,
//   the out-of-range count, 64-bit arithmetic), parameters in one struct;
//   small_shapes.cu's g_small (round 6) with the page size as a shift, kept
//   whole here so that each experiment builds on its own.
// Both take VEC columns per thread (1 or 4) and any block size.
#include <cstdint>
#include <cuda_runtime.h>

template <int VEC>
__global__ void g_min(const int *table, const long long *req, const int *seq, int *out, int tstride,
                      int ostride, int maxp, int shift, int dummy) {
  const int r = blockIdx.y;
  const int sl = seq[r];
  const long long q = req[r];
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  const int n = (sl + (1 << shift) - 1) >> shift;
  const int *src = table + q * tstride;
  int *dst = out + (long long)r * ostride;
#pragma unroll
  for (int j = 0; j < VEC; j++)
    if (c + j < maxp) dst[c + j] = c + j < n ? src[c + j] : dummy;
}

struct G { const int *table; int64_t rows, cols, stride; const long long *req; const int *seq; int *out;
           int64_t ostride, maxp; int shift; int dummy; unsigned long long *oob; };

template <int VEC>
__global__ void g_full(const G p) {
  const int r = blockIdx.y;
  const int64_t req = p.req[r];
  const int64_t len = p.seq[r];
  const int64_t c = (int64_t)(blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (c >= p.maxp) return;
  const bool live = req >= 0 && req < p.rows;
  if (req >= p.rows && c == 0 && p.oob) atomicAdd(p.oob, 1ull);
  int64_t n = live && len > 0 ? (len >> p.shift) + ((len & ((1ll << p.shift) - 1)) != 0) : 0;
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

// kind 0: g_min, 1: g_full; table rows of `stride` elements, out rows of `ostride`
extern "C" int exp_gather_step(int kind, int vec, int threads, const void *table, long long rows, long long cols,
                               long long stride, const void *req, const void *seq, void *out, long long ostride,
                               int bs, int maxp, int shift, int dummy, void *oob) {
  const int per = threads * vec;
  const dim3 grid((maxp + per - 1) / per, bs);
  if (kind == 0) {
    if (vec == 4) g_min<4><<<grid, threads>>>((const int *)table, (const long long *)req, (const int *)seq, (int *)out,
                                               (int)stride, (int)ostride, maxp, shift, dummy);
    else g_min<1><<<grid, threads>>>((const int *)table, (const long long *)req, (const int *)seq, (int *)out,
                                     (int)stride, (int)ostride, maxp, shift, dummy);
  } else {
    G p = {(const int *)table, rows, cols, stride, (const long long *)req, (const int *)seq, (int *)out, ostride, maxp,
           shift, dummy, (unsigned long long *)oob};
    if (vec == 4) g_full<4><<<grid, threads>>>(p); else g_full<1><<<grid, threads>>>(p);
  }
  return (int)cudaGetLastError();
}
