/*
 * check_cuda: every CUDA kernel against the CPU reference, bit for bit.
 *
 * Each case draws fresh random inputs from its own seed, fills every output
 * (the CUDA copy and the reference copy alike) with the same poison
 * pattern, runs kvd_cuda_* on device or pinned host memory and kvd_cpu_* on
 * host copies of the same bytes, synchronises, and compares EVERY byte of
 * EVERY buffer it made: outputs, inputs, index arrays, scales, counters,
 * and the guard bytes before and after each allocation.  Unwritten,
 * mis-indexed or stray bytes all show.  The reference is in turn compared
 * with a small model of kernels.h written here, so a mistake that both
 * backends share shows too.
 *
 * Suites (Check test cases, selectable with CK_RUN_CASE=<name>):
 *   basics          probe, ABI version
 *   store           kvd_cuda_kv_store
 *   fp8             kvd_cuda_fp8_set on random data plus special values
 *   fp8_exhaustive  every bf16 and f16 bit pattern through e4m3 and e5m2
 *   gather          kvd_cuda_page_table_gather
 *   transfer        kvd_cuda_kv_transfer (one layer, many, tables, pinned
 *                   host memory, block budgets, copy engines, streams)
 *   launch          NULL launch, max_blocks 1/8, a created stream (checked
 *                   to be used and not waited on), all giving the same bytes
 *   big_pool        a 9 GiB device pool (offsets past 2^32 bytes, 2^31
 *                   elements), store and transfer at its far end
 *   wide_bounds     pools that declare 2^32 + 5 slots, a slot stride past
 *                   2^32 bytes: bounds and strides kept 64-bit
 *
 * Environment:
 *   KVD_TEST_QUICK=1  smaller counts (for compute-sanitizer memcheck)
 *   KVD_TEST_SEED=N   base seed (default fixed); every case prints its own
 *                     seed, derived from the base seed and the case number
 *   KVD_TEST_NO_GATE=1  launches on a created stream are not held by a gate
 *                     (for tools that may serialise launches, such as
 *                     compute-sanitizer; the plain run checks asynchrony)
 *
 * Exits 77 after printing "SKIP: <why>" when no GPU is usable, so ctest
 * reports the suite as skipped.
 *
 * The runner does not fork (CK_NOFORK): a CUDA context does not survive
 * fork().  Allocations are tracked and released by the checked fixture's
 * teardown, which Check runs after a failed test too.
 */
#include <check.h>
#include <cuda_runtime_api.h>

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kvdock/kernels.h"
#include "kvt_skip.h"

#define ARRAY_LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define GUARD 256              /* poisoned bytes before and after every buffer */
#define GATE_TIMEOUT_S 10.0    /* how long a gated stream waits at most */
#define QUICK_BYTES (24 << 20) /* KVD_TEST_QUICK: bytes moved per case, at most */

/* ======================================================================== */
/* State of the running case                                                 */

static int g_quick;
static int g_nogate;
static uint64_t g_seed_base = 0x6b76646f636b3031ull; /* "kvdock01" */
static char g_case[640];
static uint64_t g_seed;
static double g_t0;
static int g_digest_on;
static uint64_t g_digest;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fail_case(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fail_case(const char *fmt, ...)
{
    char msg[1536];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    printf("\n    FAIL %s [seed=0x%016" PRIx64 "]: %s\n", g_case, g_seed, msg);
    fflush(stdout);
    ck_abort_msg("%s [seed=0x%016" PRIx64 "]: %s", g_case, g_seed, msg);
}

#define CUDA_OK(call)                                                                   \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess)                                                          \
            fail_case("%s:%d: %s -> %s (%s)", __FILE__, __LINE__, #call,                \
                      cudaGetErrorName(e_), cudaGetErrorString(e_));                    \
    } while (0)

#define KVD_CALL_OK(call)                                                               \
    do {                                                                                \
        kvd_status_t s_ = (call);                                                       \
        if (s_ != KVD_OK)                                                               \
            fail_case("%s:%d: %s -> KVD_%s: %s", __FILE__, __LINE__, #call,             \
                      kvd_err_name(s_), kvd_last_error_detail());                       \
    } while (0)

#define REQUIRE(cond, ...)                                                              \
    do {                                                                                \
        if (!(cond))                                                                    \
            fail_case(__VA_ARGS__);                                                     \
    } while (0)

static void case_begin(uint64_t seed, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A cudaMalloc of total bytes for a case failed with e.  Expected only on
 * a GPU without that much free memory: the case then skips, saying so on
 * a line of its own (kvt_skip.h); with the memory free it fails. */
static void big_alloc_failed(cudaError_t e, int64_t total)
{
    size_t free_b = 0, all_b = 0;
    cudaError_t q;

    (void)cudaGetLastError();
    q = cudaMemGetInfo(&free_b, &all_b);
    if (q != cudaSuccess)
        fail_case("cudaMalloc(%.1f GiB) failed: %s; cudaMemGetInfo failed too: %s",
                  (double)total / (1 << 30), cudaGetErrorString(e), cudaGetErrorString(q));
    if ((int64_t)free_b >= total)
        fail_case("cudaMalloc(%.1f GiB) failed with %.1f GiB free of %.1f GiB: %s",
                  (double)total / (1 << 30), (double)free_b / (1 << 30),
                  (double)all_b / (1 << 30), cudaGetErrorString(e));
    kvt_skip_case(g_case, "cudaMalloc(%.1f GiB) failed: the GPU has %.1f GiB free of %.1f GiB",
                  (double)total / (1 << 30), (double)free_b / (1 << 30),
                  (double)all_b / (1 << 30));
}
static void case_begin(uint64_t seed, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(g_case, sizeof(g_case), fmt, ap);
    va_end(ap);
    g_seed = seed;
    printf("  %s seed=0x%016" PRIx64 " ...", g_case, seed);
    fflush(stdout);
    g_t0 = now_s();
}

static void case_end(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void case_end(const char *fmt, ...)
{
    char extra[256] = "";
    va_list ap;

    if (fmt) {
        va_start(ap, fmt);
        vsnprintf(extra, sizeof(extra), fmt, ap);
        va_end(ap);
    }
    printf(" ok %.0f ms%s%s\n", (now_s() - g_t0) * 1e3, extra[0] ? ", " : "", extra);
    fflush(stdout);
}

/* ======================================================================== */
/* Random numbers: splitmix64 to seed, xorshift64* to draw                   */

typedef struct rng {
    uint64_t s;
} rng_t;

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(rng_t *r, uint64_t seed)
{
    uint64_t x = seed;
    r->s = splitmix64(&x);
    if (!r->s)
        r->s = 1;
}

static uint64_t rng_next(rng_t *r)
{
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* Uniform in [0, n); 0 when n is 0. */
static uint64_t rng_below(rng_t *r, uint64_t n)
{
    return n ? (uint64_t)(((unsigned __int128)rng_next(r) * n) >> 64) : 0;
}

static float rng_unit(rng_t *r) /* [0, 1) */
{
    return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

static void rng_fill(rng_t *r, void *p, size_t n)
{
    uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rng_next(r);
        memcpy(b + i, &v, 8);
    }
    if (i < n) {
        uint64_t v = rng_next(r);
        memcpy(b + i, &v, n - i);
    }
}

static uint64_t case_seed(const char *tag, int i, int variant)
{
    uint64_t h = g_seed_base ^ 0xcbf29ce484222325ull;
    for (const char *c = tag; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    h ^= ((uint64_t)(uint32_t)i << 32) ^ (uint32_t)variant;
    return splitmix64(&h);
}

/* ======================================================================== */
/* Tracked resources: released by the fixture's teardown, even after a      */
/* failed assertion has jumped out of the test.                              */

enum { T_HOST, T_DEV, T_PINNED, T_MMAP, T_STREAM };

typedef struct track {
    int kind;
    void *p;
    size_t n;
} track_t;

static track_t *g_track;
static size_t g_ntrack, g_captrack;
static uint8_t *g_scratch; /* readback buffer, grown on demand */
static size_t g_scratch_n;

/* A host function that holds a stream until the test opens it. */
typedef struct gate {
    int open;
    int timed_out;
    double deadline;
} gate_t;
static gate_t g_gate = {1, 0, 0};

static void CUDART_CB gate_fn(void *p)
{
    gate_t *g = p;
    while (!__atomic_load_n(&g->open, __ATOMIC_ACQUIRE)) {
        if (now_s() > g->deadline) {
            __atomic_store_n(&g->timed_out, 1, __ATOMIC_RELEASE);
            break;
        }
        usleep(100);
    }
}

static void gate_open(void)
{
    __atomic_store_n(&g_gate.open, 1, __ATOMIC_RELEASE);
}

static void track_push(int kind, void *p, size_t n)
{
    if (g_ntrack == g_captrack) {
        size_t cap = g_captrack ? 2 * g_captrack : 64;
        track_t *t = realloc(g_track, cap * sizeof(*t));
        if (!t)
            fail_case("out of host memory (tracking)");
        g_track = t;
        g_captrack = cap;
    }
    g_track[g_ntrack++] = (track_t){kind, p, n};
}

/* Release one resource; the first CUDA error is kept in *first. */
static void track_free_one(const track_t *t, cudaError_t *first, const char **what)
{
    cudaError_t e = cudaSuccess;
    switch (t->kind) {
    case T_HOST:
        free(t->p);
        break;
    case T_DEV:
        e = cudaFree(t->p);
        if (e != cudaSuccess && *first == cudaSuccess)
            *what = "cudaFree";
        break;
    case T_PINNED:
        e = cudaFreeHost(t->p);
        if (e != cudaSuccess && *first == cudaSuccess)
            *what = "cudaFreeHost";
        break;
    case T_MMAP:
        munmap(t->p, t->n);
        break;
    case T_STREAM: {
        cudaError_t e1 = cudaStreamSynchronize((cudaStream_t)t->p);
        cudaError_t e2 = cudaStreamDestroy((cudaStream_t)t->p);
        e = e1 != cudaSuccess ? e1 : e2;
        if (e != cudaSuccess && *first == cudaSuccess)
            *what = e1 != cudaSuccess ? "cudaStreamSynchronize" : "cudaStreamDestroy";
        break;
    }
    }
    if (e != cudaSuccess && *first == cudaSuccess)
        *first = e;
}

/* Release everything tracked after mark (newest first; streams before
 * memory so no work is in flight on memory being freed). */
static void track_release_to(size_t mark, int in_teardown)
{
    cudaError_t first = cudaSuccess;
    const char *what = "";

    gate_open();
    for (size_t i = g_ntrack; i-- > mark;)
        if (g_track[i].kind == T_STREAM)
            track_free_one(&g_track[i], &first, &what);
    for (size_t i = g_ntrack; i-- > mark;)
        if (g_track[i].kind != T_STREAM)
            track_free_one(&g_track[i], &first, &what);
    g_ntrack = mark;
    if (first != cudaSuccess) {
        if (in_teardown)
            ck_abort_msg("cleanup after %s: %s failed: %s", g_case, what,
                         cudaGetErrorString(first));
        fail_case("cleanup: %s failed: %s", what, cudaGetErrorString(first));
    }
}

static size_t track_mark(void)
{
    return g_ntrack;
}

static void *host_alloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        fail_case("out of host memory (%zu bytes)", n);
    track_push(T_HOST, p, n);
    return p;
}

static void *dev_alloc(size_t n)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, n ? n : 1));
    track_push(T_DEV, p, n);
    return p;
}

/* Pinned host memory, mapped: with unified addressing the same pointer
 * works on the device. */
static void *pinned_alloc(size_t n)
{
    void *p = NULL;
    CUDA_OK(cudaHostAlloc(&p, n ? n : 1, cudaHostAllocPortable | cudaHostAllocMapped));
    track_push(T_PINNED, p, n);
    return p;
}

static cudaStream_t new_stream(void)
{
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    track_push(T_STREAM, (void *)s, 0);
    return s;
}

static uint8_t *scratch(size_t n)
{
    if (n > g_scratch_n) {
        free(g_scratch);
        g_scratch = malloc(n);
        g_scratch_n = g_scratch ? n : 0;
        if (!g_scratch)
            fail_case("out of host memory (scratch %zu bytes)", n);
    }
    return g_scratch;
}

static void setup(void)
{
    g_ntrack = 0;
    g_case[0] = '\0';
    g_seed = 0;
    g_digest_on = 0;
    gate_open();
}

static void teardown(void)
{
    track_release_to(0, 1);
    free(g_scratch);
    g_scratch = NULL;
    g_scratch_n = 0;
}

/* ======================================================================== */
/* Test buffers: a CUDA-side allocation (device or pinned) and a host       */
/* mirror for the reference, both GUARD bytes wider on each side.           */

enum { MEM_DEV = 0, MEM_PINNED = 1 };

static const uint8_t POISON[8] = {0xde, 0xad, 0xbe, 0xef, 0xa5, 0x5a, 0xc3, 0x3c};

static void fill_poison(uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        memcpy(p + i, POISON, 8);
    for (; i < n; i++)
        p[i] = POISON[i & 7];
}

typedef struct tbuf {
    const char *name;
    int kind;        /* MEM_DEV or MEM_PINNED: where the CUDA side lives */
    size_t size;     /* usable bytes */
    size_t front;    /* guard + misalignment before the usable start */
    size_t total;    /* whole allocation */
    uint8_t *gbase;  /* CUDA side */
    uint8_t *rbase;  /* reference side */
    uint8_t *g, *r;  /* usable starts */
    uint8_t *gexpect; /* what the CUDA side must hold when it differs from r */
    uint8_t *model;   /* the test's own expectation of the reference side */
    int64_t row_stride; /* diagnostics: bytes per row, 0 if none */
    int no_digest;
} tbuf_t;

static void tb_upload(tbuf_t *b)
{
    if (b->kind == MEM_DEV)
        CUDA_OK(cudaMemcpy(b->gbase, b->rbase, b->total, cudaMemcpyHostToDevice));
    else
        memcpy(b->gbase, b->rbase, b->total);
}

/* Allocate, and poison all of it (CUDA side and reference side). */
static void tb_alloc(tbuf_t *b, const char *name, int kind, size_t size, size_t mis)
{
    memset(b, 0, sizeof(*b));
    b->name = name;
    b->kind = kind;
    b->size = size;
    b->front = GUARD + mis;
    b->total = b->front + size + GUARD;
    b->gbase = kind == MEM_DEV ? dev_alloc(b->total) : pinned_alloc(b->total);
    b->rbase = host_alloc(b->total);
    b->g = b->gbase + b->front;
    b->r = b->rbase + b->front;
    fill_poison(b->rbase, b->total);
    tb_upload(b);
}

/* Random usable bytes (guards stay poisoned), on both sides. */
static void tb_random(tbuf_t *b, rng_t *r)
{
    rng_fill(r, b->r, b->size);
    tb_upload(b);
}

/* Keep a copy of the reference side before the op: the model's start. */
static void tb_model_init(tbuf_t *b)
{
    b->model = host_alloc(b->total);
    memcpy(b->model, b->rbase, b->total);
}

static void describe_offset(const tbuf_t *b, size_t off, char *out, size_t n)
{
    int64_t rel = (int64_t)off - (int64_t)b->front;
    if (rel < 0)
        snprintf(out, n, "front guard byte %" PRId64, rel);
    else if ((size_t)rel >= b->size)
        snprintf(out, n, "back guard byte %" PRId64, rel - (int64_t)b->size);
    else if (b->row_stride > 0)
        snprintf(out, n, "offset %" PRId64 " (row %" PRId64 ", byte %" PRId64 ")", rel,
                 rel / b->row_stride, rel % b->row_stride);
    else
        snprintf(out, n, "offset %" PRId64, rel);
}

static void report_mismatch(const tbuf_t *b, const uint8_t *got, const uint8_t *want,
                            const char *got_name, const char *want_name)
{
    size_t bad = 0, first = 0;
    int shown = 0;

    printf("\n    %s: %s differs from %s:\n", b->name, got_name, want_name);
    for (size_t i = 0; i < b->total; i++) {
        if (got[i] == want[i])
            continue;
        if (!bad)
            first = i;
        bad++;
        if (shown < 12) {
            char where[128];
            describe_offset(b, i, where, sizeof(where));
            printf("      %-44s %s 0x%02x, %s 0x%02x%s\n", where, got_name, got[i], want_name,
                   want[i], got[i] == POISON[i & 7] ? " (poison: never written)" : "");
            shown++;
        }
    }
    char where[128];
    describe_offset(b, first, where, sizeof(where));
    fail_case("%s: %s differs from %s in %zu of %zu bytes; first at %s", b->name, got_name,
              want_name, bad, b->total, where);
}

static uint64_t digest_update(uint64_t h, const uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        h = (h ^ v) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* The CUDA side must equal the reference side (or gexpect), every byte of
 * the allocation. */
static void tb_check(const tbuf_t *b)
{
    const uint8_t *want = b->gexpect ? b->gexpect : b->rbase;
    const uint8_t *got = b->gbase;

    if (b->kind == MEM_DEV) {
        uint8_t *s = scratch(b->total);
        CUDA_OK(cudaMemcpy(s, b->gbase, b->total, cudaMemcpyDeviceToHost));
        got = s;
    }
    if (g_digest_on && !b->no_digest)
        g_digest = digest_update(g_digest, got, b->total);
    if (memcmp(got, want, b->total) != 0)
        report_mismatch(b, got, want, "CUDA", b->gexpect ? "expected" : "CPU reference");
}

/* The reference must equal the test's model. */
static void tb_check_model(const tbuf_t *b)
{
    if (memcmp(b->rbase, b->model, b->total) != 0)
        report_mismatch(b, b->rbase, b->model, "CPU reference", "test model");
}

/* An oob counter: 8 bytes starting at a non-zero value (the calls add). */
static unsigned long long tb_counter(tbuf_t *b, const char *name, int kind, rng_t *r)
{
    unsigned long long start = 1000 + rng_below(r, 1000);
    tb_alloc(b, name, kind, sizeof(start), 0);
    memcpy(b->r, &start, sizeof(start));
    tb_upload(b);
    return start;
}

static unsigned long long read_u64(const uint8_t *p)
{
    unsigned long long v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* The counters: CUDA == reference == start + expected. */
static void check_counter(const tbuf_t *b, unsigned long long start, int64_t expected)
{
    unsigned long long ref = read_u64(b->r);
    tb_check(b); /* CUDA side == reference side, guards included */
    REQUIRE(ref == start + (unsigned long long)expected,
            "oob counter: the CPU reference added %lld, the test expects %" PRId64,
            (long long)(ref - start), expected);
}

/* ======================================================================== */
/* Index arrays                                                              */

enum { IDX_PERM, IDX_MIXED, IDX_RUNS, IDX_CONTIG };
static const char *const IDX_NAMES[] = {"perm", "mixed", "runs", "contig"};

static const char *dt_name(int dt)
{
    return kvd_dtype_name(dt);
}

static void idx_put(void *p, int dtype, int64_t i, int64_t v)
{
    if (dtype == KVD_DTYPE_I32)
        ((int32_t *)p)[i] = (int32_t)v;
    else
        ((int64_t *)p)[i] = v;
}

static int64_t idx_get(const void *p, int dtype, int64_t i)
{
    return dtype == KVD_DTYPE_I32 ? ((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}

static int64_t neg_index(rng_t *r, int dtype, int64_t bound)
{
    switch (rng_below(r, 5)) {
    case 0:
        return -1;
    case 1:
        return -2;
    case 2:
        return -(int64_t)(1 + rng_below(r, 1 << 20));
    case 3:
        return dtype == KVD_DTYPE_I32 ? INT32_MIN : INT64_MIN;
    default:
        return -(bound > 0 ? bound : 1);
    }
}

static int64_t oob_index(rng_t *r, int dtype, int64_t bound)
{
    switch (rng_below(r, 5)) {
    case 0:
        return bound;
    case 1:
        return bound + 1;
    case 2:
        return bound + (int64_t)rng_below(r, 4096);
    case 3:
        return dtype == KVD_DTYPE_I32 ? INT32_MAX : INT64_MAX;
    default:
        return 2 * bound + 7;
    }
}

/* n distinct values of [0, bound), in random order. */
static void perm_prefix(rng_t *r, int64_t bound, int64_t n, int64_t *out)
{
    REQUIRE(n <= bound, "test bug: %" PRId64 " distinct values of [0, %" PRId64 ")", n, bound);
    if (n == 0)
        return;
    size_t mark = track_mark();
    int64_t *a = host_alloc((size_t)bound * sizeof(*a));
    for (int64_t i = 0; i < bound; i++)
        a[i] = i;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = i + (int64_t)rng_below(r, (uint64_t)(bound - i));
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
        out[i] = a[i];
    }
    track_release_to(mark, 0);
}

/* Runs of consecutive slots (1 to 64 long), distinct, on one or two sides
 * (two: pair j of a run is (s0 + j, d0 + j)). */
static void gen_runs(rng_t *r, int64_t n, int64_t dbound, int64_t *d, int64_t sbound, int64_t *s)
{
    size_t mark = track_mark();
    int64_t nbd = dbound / 64, nbs = s ? sbound / 64 : 0;
    int64_t *bd = host_alloc((size_t)(nbd + 1) * sizeof(int64_t));
    int64_t *bs = host_alloc((size_t)(nbs + 1) * sizeof(int64_t));
    uint8_t *ud = host_alloc((size_t)dbound + 1), *us = host_alloc((size_t)sbound + 1);
    int64_t k = 0;

    memset(ud, 0, (size_t)dbound + 1);
    memset(us, 0, (size_t)sbound + 1);
    perm_prefix(r, nbd, nbd, bd);
    if (s)
        perm_prefix(r, nbs, nbs, bs);
    for (int64_t b = 0; b < nbd && (!s || b < nbs) && k < n; b++) {
        int64_t len = 1 + (int64_t)rng_below(r, 64);
        if (len > n - k)
            len = n - k;
        int64_t d0 = bd[b] * 64 + (int64_t)rng_below(r, (uint64_t)(64 - len + 1));
        int64_t s0 = s ? bs[b] * 64 + (int64_t)rng_below(r, (uint64_t)(64 - len + 1)) : 0;
        for (int64_t j = 0; j < len; j++, k++) {
            d[k] = d0 + j;
            ud[d0 + j] = 1;
            if (s) {
                s[k] = s0 + j;
                us[s0 + j] = 1;
            }
        }
    }
    /* Not enough blocks: the unused slots, in increasing order. */
    for (int64_t x = 0, y = 0; k < n; k++) {
        while (x < dbound && ud[x])
            x++;
        REQUIRE(x < dbound, "test bug: runs of %" PRId64 " in %" PRId64 " slots", n, dbound);
        d[k] = x;
        ud[x] = 1;
        if (s) {
            while (y < sbound && us[y])
                y++;
            REQUIRE(y < sbound, "test bug: runs of %" PRId64 " in %" PRId64 " slots", n, sbound);
            s[k] = y;
            us[y] = 1;
        }
    }
    track_release_to(mark, 0);
}

/* One index array (store, fp8 set): valid values are distinct, so the
 * result does not depend on the order rows are written in. */
static void gen_slots(rng_t *r, int mode, int64_t n, int64_t bound, int dtype, int64_t *out)
{
    switch (mode) {
    case IDX_PERM:
        perm_prefix(r, bound, n, out);
        break;
    case IDX_MIXED:
        perm_prefix(r, bound, n, out);
        for (int64_t i = 0; i < n; i++) {
            uint64_t u = rng_below(r, 32);
            if (u < 3)
                out[i] = neg_index(r, dtype, bound);
            else if (u < 5)
                out[i] = oob_index(r, dtype, bound);
        }
        if (n >= 3) {
            out[n / 3] = -1;
            out[2 * n / 3] = bound;
        }
        break;
    case IDX_RUNS:
        gen_runs(r, n, bound, out, 0, NULL);
        break;
    default: {
        int64_t s0 = (int64_t)rng_below(r, (uint64_t)(bound - n + 1));
        for (int64_t i = 0; i < n; i++)
            out[i] = s0 + i;
    }
    }
}

/* Index pairs (transfer): valid destinations are distinct; sources may
 * repeat in mixed mode.  Every kind of bad pair occurs. */
static void gen_pairs(rng_t *r, int mode, int64_t n, int64_t sbound, int64_t dbound, int dtype,
                      int64_t *s, int64_t *d)
{
    switch (mode) {
    case IDX_PERM:
        perm_prefix(r, sbound, n, s);
        perm_prefix(r, dbound, n, d);
        break;
    case IDX_MIXED:
        perm_prefix(r, dbound, n, d);
        for (int64_t i = 0; i < n; i++)
            s[i] = (int64_t)rng_below(r, (uint64_t)sbound);
        for (int64_t i = 0; i < n; i++) {
            int cat = (int)rng_below(r, 64);
            if (n >= 16 && i % (n / 16) == 0 && i / (n / 16) >= 1 && i / (n / 16) <= 8)
                cat = (int)(i / (n / 16)) - 1; /* each kind at least once */
            switch (cat) {
            case 0: s[i] = neg_index(r, dtype, sbound); break;
            case 1: d[i] = neg_index(r, dtype, dbound); break;
            case 2: s[i] = oob_index(r, dtype, sbound); break;
            case 3: d[i] = oob_index(r, dtype, dbound); break;
            case 4: s[i] = oob_index(r, dtype, sbound); d[i] = oob_index(r, dtype, dbound); break;
            case 5: s[i] = neg_index(r, dtype, sbound); d[i] = oob_index(r, dtype, dbound); break;
            case 6: s[i] = oob_index(r, dtype, sbound); d[i] = neg_index(r, dtype, dbound); break;
            case 7: s[i] = neg_index(r, dtype, sbound); d[i] = neg_index(r, dtype, dbound); break;
            default: break;
            }
        }
        break;
    case IDX_RUNS:
        gen_runs(r, n, dbound, d, sbound, s);
        break;
    default: {
        int64_t s0 = (int64_t)rng_below(r, (uint64_t)(sbound - n + 1));
        int64_t d0 = (int64_t)rng_below(r, (uint64_t)(dbound - n + 1));
        for (int64_t i = 0; i < n; i++) {
            s[i] = s0 + i;
            d[i] = d0 + i;
        }
    }
    }
}

/* An index tbuf from n int64 values. */
static void tb_index(tbuf_t *b, const char *name, int kind, int dtype, const int64_t *v, int64_t n)
{
    tb_alloc(b, name, kind, (size_t)n * kvd_dtype_size(dtype), 0);
    b->row_stride = (int64_t)kvd_dtype_size(dtype);
    for (int64_t i = 0; i < n; i++)
        idx_put(b->r, dtype, i, v[i]);
    tb_upload(b);
}

static int64_t auto_slots(int64_t n, int mode, int64_t extra)
{
    return mode == IDX_RUNS || mode == IDX_CONTIG ? 4 * n + 64 + extra : 2 * n + 37 + extra;
}

static int64_t quick_count(int64_t n, int64_t bytes_per_item)
{
    if (!g_quick || n <= 0 || bytes_per_item <= 0 || n * bytes_per_item <= QUICK_BYTES)
        return n;
    int64_t q = QUICK_BYTES / bytes_per_item;
    return q < 1 ? 1 : q;
}

/* ======================================================================== */
/* Launch variants and the GPU call                                          */

enum { L_DEFAULT, L_NULL, L_MB1, L_MB8, L_STREAM, L_STREAM_MB3, L_CE, L_CE_STREAM, L_CE_EACH,
       L_CE_EACH_STREAM, L_CE_ONE, L_COUNT };

typedef struct launch_spec {
    const char *name;
    int null_ptr;        /* pass NULL as the launch pointer */
    uint32_t max_blocks;
    uint32_t flags;
    int stream;          /* a created stream, held by a gate during the call */
} launch_spec_t;

static const launch_spec_t LS[L_COUNT] = {
    [L_DEFAULT] = {"default", 0, 0, 0, 0},
    [L_NULL] = {"launch=NULL", 1, 0, 0, 0},
    [L_MB1] = {"max_blocks=1", 0, 1, 0, 0},
    [L_MB8] = {"max_blocks=8", 0, 8, 0, 0},
    [L_STREAM] = {"stream", 0, 0, 0, 1},
    [L_STREAM_MB3] = {"stream+max_blocks=3", 0, 3, 0, 1},
    [L_CE] = {"copy_engine", 0, 0, KVD_LAUNCH_COPY_ENGINE, 0},
    [L_CE_STREAM] = {"copy_engine+stream", 0, 0, KVD_LAUNCH_COPY_ENGINE, 1},
    [L_CE_EACH] = {"copy_engine+each", 0, 0, KVD_LAUNCH_COPY_ENGINE | KVD_LAUNCH_COPY_EACH, 0},
    [L_CE_EACH_STREAM] = {"copy_engine+each+stream", 0, 0,
                          KVD_LAUNCH_COPY_ENGINE | KVD_LAUNCH_COPY_EACH, 1},
    /* 2D copies over layers asked for (tables vouched for as one allocation) */
    [L_CE_ONE] = {"copy_engine+tables_one", 0, 0,
                  KVD_LAUNCH_COPY_ENGINE | KVD_LAUNCH_TABLES_ONE_ALLOCATION, 0},
};

typedef kvd_status_t (*op_fn)(const void *args, const kvd_launch_t *launch);

static kvd_status_t op_store(const void *a, const kvd_launch_t *l)
{
    return kvd_cuda_kv_store(a, l);
}
static kvd_status_t op_fp8(const void *a, const kvd_launch_t *l)
{
    return kvd_cuda_fp8_set(a, l);
}
static kvd_status_t op_gather(const void *a, const kvd_launch_t *l)
{
    return kvd_cuda_page_table_gather(a, l);
}
static kvd_status_t op_transfer(const void *a, const kvd_launch_t *l)
{
    return kvd_cuda_kv_transfer(a, l);
}

/* While the stream is held, nothing may have changed in peek yet.  stage:
 * pinned memory allocated before the stream was held (nothing in the held
 * window may call anything that could synchronise the device). */
static void peek_unchanged(const char *op, const tbuf_t *peek, cudaStream_t ps, uint8_t *stage)
{
    const uint8_t *got = peek->gbase;
    if (peek->kind == MEM_DEV) {
        uint8_t *s = stage;
        cudaError_t e1 = cudaMemcpyAsync(s, peek->gbase, peek->total, cudaMemcpyDeviceToHost, ps);
        cudaError_t e2 = e1 == cudaSuccess ? cudaStreamSynchronize(ps) : e1;
        if (e2 != cudaSuccess) {
            gate_open();
            CUDA_OK(e2);
        }
        got = s;
    }
    if (memcmp(got, peek->rbase, peek->total) != 0) {
        gate_open();
        fail_case("%s wrote %s while its stream was still held by an earlier host function: "
                  "the work did not go to the stream in kvd_launch_t",
                  op, peek->name);
    }
}

/*
 * Run one CUDA op as the launch spec says and wait for it.  With a stream:
 * the stream is first held by a host function, so the call must return
 * without waiting for it (the daemon relies on asynchronous calls) and
 * must not have written anything before the stream is released.
 */
static void gpu_call(const char *op, op_fn fn, const void *args, int launch, const tbuf_t *peek)
{
    const launch_spec_t *ls = &LS[launch];
    kvd_launch_t l = {NULL, ls->max_blocks, ls->flags};
    kvd_status_t st;

    CUDA_OK(cudaDeviceSynchronize()); /* inputs are in place */
    CUDA_OK(cudaGetLastError());
    if (!ls->stream) {
        st = fn(args, ls->null_ptr ? NULL : &l);
        if (st != KVD_OK)
            fail_case("%s (%s) -> KVD_%s: %s", op, ls->name, kvd_err_name(st),
                      kvd_last_error_detail());
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        return;
    }

    cudaStream_t s = new_stream(), ps = new_stream();
    if (g_nogate) { /* on the created stream, not held */
        l.stream = s;
        st = fn(args, &l);
        if (st != KVD_OK)
            fail_case("%s (%s) -> KVD_%s: %s", op, ls->name, kvd_err_name(st),
                      kvd_last_error_detail());
        CUDA_OK(cudaStreamSynchronize(s));
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        return;
    }
    uint8_t *stage = peek && peek->kind == MEM_DEV ? pinned_alloc(peek->total) : NULL;
    g_gate.timed_out = 0;
    g_gate.deadline = now_s() + GATE_TIMEOUT_S;
    __atomic_store_n(&g_gate.open, 0, __ATOMIC_RELEASE);
    cudaError_t e = cudaLaunchHostFunc(s, gate_fn, &g_gate);
    if (e != cudaSuccess) {
        gate_open();
        CUDA_OK(e);
    }
    l.stream = s;
    double t0 = now_s();
    st = fn(args, &l);
    double took = now_s() - t0;
    if (st != KVD_OK) {
        gate_open();
        fail_case("%s (%s) -> KVD_%s: %s", op, ls->name, kvd_err_name(st),
                  kvd_last_error_detail());
    }
    if (__atomic_load_n(&g_gate.timed_out, __ATOMIC_ACQUIRE) || took > GATE_TIMEOUT_S / 2) {
        gate_open();
        fail_case("%s (%s) returned only after %.1f s, when the gate holding its stream gave "
                  "up: the call waits for its stream instead of enqueueing",
                  op, ls->name, took);
    }
    usleep(20000); /* let misplaced work (on another stream) land */
    if (peek)
        peek_unchanged(op, peek, ps, stage);
    gate_open();
    CUDA_OK(cudaStreamSynchronize(s));
    REQUIRE(!__atomic_load_n(&g_gate.timed_out, __ATOMIC_ACQUIRE),
            "the gate on the stream timed out");
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
}

/* ======================================================================== */
/* store                                                                     */

typedef struct store_case {
    int64_t n, row;
    int dtype, mla, mode;
    int qkv;         /* K and V are views into one fused QKV row */
    int64_t src_pad; /* bytes added to the source token stride */
    int src_mis;     /* source misalignment (bytes) */
    int interleave;  /* K and V of a slot side by side in one pool buffer */
    int64_t dst_pad; /* bytes added to the slot stride */
    int dst_mis;
} store_case_t;

#define I32 KVD_DTYPE_I32
#define I64 KVD_DTYPE_I64

static const store_case_t STORE_CASES[] = {
    /* n, row, dtype, mla, mode, qkv, src_pad, src_mis, interleave, dst_pad, dst_mis */
    {0, 1536, I64, 0, IDX_PERM, 0, 0, 0, 0, 0, 0},
    {1, 1536, I32, 0, IDX_PERM, 0, 0, 0, 0, 0, 0},
    {1, 6, I64, 1, IDX_PERM, 0, 0, 2, 0, 0, 4},
    {3, 2048, I64, 0, IDX_MIXED, 0, 0, 0, 0, 0, 0},
    {7, 1536, I64, 0, IDX_MIXED, 0, 0, 0, 0, 0, 0},
    {7, 34, I32, 0, IDX_MIXED, 0, 6, 2, 0, 2, 4},
    {7, 6, I64, 0, IDX_MIXED, 1, 10, 2, 0, 0, 0},
    {7, 1152, I32, 1, IDX_MIXED, 0, 0, 0, 0, 0, 0},
    {1000, 1536, I64, 0, IDX_MIXED, 1, 4, 2, 0, 0, 0},
    {1000, 576, I32, 0, IDX_PERM, 0, 0, 0, 0, 64, 0},
    {1000, 2048, I64, 0, IDX_RUNS, 0, 0, 0, 1, 0, 0},
    {1000, 2048, I32, 0, IDX_CONTIG, 0, 0, 0, 0, 0, 0},
    {1000, 1152, I64, 1, IDX_MIXED, 0, 2, 4, 0, 0, 2},
    {4096, 34, I64, 0, IDX_MIXED, 0, 0, 0, 1, 6, 2},
    {4096, 6, I32, 1, IDX_RUNS, 0, 0, 2, 0, 0, 0},
    {65535, 6, I32, 0, IDX_MIXED, 0, 0, 0, 0, 0, 0},
    {65536, 2048, I64, 0, IDX_PERM, 0, 0, 0, 0, 0, 0}, /* the seed's failing case */
    {65536, 34, I32, 1, IDX_MIXED, 0, 0, 2, 0, 0, 4},
    {65537, 1536, I32, 0, IDX_MIXED, 1, 4, 2, 0, 0, 0},
    {100000, 6, I64, 0, IDX_PERM, 0, 10, 4, 0, 0, 0},
    {100000, 576, I32, 0, IDX_MIXED, 0, 0, 0, 0, 0, 0},
    {100000, 1152, I64, 1, IDX_RUNS, 0, 0, 0, 0, 0, 0},
    {100000, 1536, I64, 0, IDX_MIXED, 0, 0, 0, 1, 0, 0},
};

static void run_store(const store_case_t *c, int launch, uint64_t seed)
{
    size_t mark = track_mark();
    rng_t rng;
    rng_seed(&rng, seed);

    const int64_t row = c->row, n = quick_count(c->n, row * (c->mla ? 1 : 2));
    const int64_t slots = auto_slots(n, c->mode, 0);
    int64_t src_stride, k_off = 0, v_off = 0;
    if (c->qkv) {
        REQUIRE(c->src_pad >= 2 * c->src_mis, "test bug: qkv padding");
        src_stride = 3 * row + c->src_pad;
        k_off = row + c->src_mis;
        v_off = 2 * row + 2 * c->src_mis;
    } else {
        src_stride = row + c->src_pad;
    }
    const int inter = c->interleave && !c->mla;
    const int64_t dst_stride = (inter ? 2 * row : row) + c->dst_pad;

    case_begin(seed,
               "store n=%" PRId64 " row=%" PRId64 " %s loc=%s/%s src=%s stride=%" PRId64
               " k_off=%" PRId64 " mis=%d dst=%s stride=%" PRId64 " mis=%d slots=%" PRId64
               " launch=%s",
               n, row, c->mla ? "MLA" : "MHA", dt_name(c->dtype), IDX_NAMES[c->mode],
               c->qkv ? "qkv" : "plain", src_stride, k_off, c->src_mis,
               inter ? "interleaved" : "separate", dst_stride, c->dst_mis, slots, LS[launch].name);

    tbuf_t ks, vs, kd, vd, loc, oob;
    int64_t *lv = host_alloc((size_t)(n + 1) * sizeof(int64_t));
    gen_slots(&rng, c->mode, n, slots, c->dtype, lv);
    tb_index(&loc, "loc", MEM_DEV, c->dtype, lv, n);
    unsigned long long start = tb_counter(&oob, "oob_count", MEM_DEV, &rng);

    if (c->qkv) {
        tb_alloc(&ks, "qkv source", MEM_DEV, (size_t)(n * src_stride), 0);
        ks.row_stride = src_stride;
        tb_random(&ks, &rng);
    } else {
        tb_alloc(&ks, "k source", MEM_DEV, (size_t)(n * src_stride), (size_t)c->src_mis);
        ks.row_stride = src_stride;
        tb_random(&ks, &rng);
        if (!c->mla) {
            tb_alloc(&vs, "v source", MEM_DEV, (size_t)(n * src_stride), (size_t)c->src_mis);
            vs.row_stride = src_stride;
            tb_random(&vs, &rng);
        }
    }
    tb_alloc(&kd, inter ? "kv pool" : "k pool", MEM_DEV, (size_t)(slots * dst_stride),
             (size_t)c->dst_mis);
    kd.row_stride = dst_stride;
    tb_model_init(&kd);
    const int sep_v = !c->mla && !inter;
    if (sep_v) {
        tb_alloc(&vd, "v pool", MEM_DEV, (size_t)(slots * dst_stride), (size_t)c->dst_mis);
        vd.row_stride = dst_stride;
        tb_model_init(&vd);
    }
    const tbuf_t *vsrc = c->qkv ? &ks : &vs;

    kvd_store_args_t ag = {0}, ar = {0};
    ag.k_src = ks.g + k_off;
    ar.k_src = ks.r + k_off;
    ag.k_src_stride = ar.k_src_stride = src_stride;
    ag.k_dst = kd.g;
    ar.k_dst = kd.r;
    ag.k_dst_stride = ar.k_dst_stride = dst_stride;
    if (!c->mla) {
        ag.v_src = vsrc->g + v_off;
        ar.v_src = vsrc->r + v_off;
        ag.v_src_stride = ar.v_src_stride = src_stride;
        ag.v_dst = inter ? kd.g + row : vd.g;
        ar.v_dst = inter ? kd.r + row : vd.r;
        ag.v_dst_stride = ar.v_dst_stride = dst_stride;
    }
    ag.num_slots = ar.num_slots = slots;
    ag.loc = loc.g;
    ar.loc = loc.r;
    ag.loc_dtype = ar.loc_dtype = c->dtype;
    ag.num_tokens = ar.num_tokens = n;
    ag.row_bytes = ar.row_bytes = row;
    ag.oob_count = (unsigned long long *)oob.g;
    ar.oob_count = (unsigned long long *)oob.r;

    gpu_call("kvd_cuda_kv_store", op_store, &ag, launch, &kd);
    KVD_CALL_OK(kvd_cpu_kv_store(&ar, NULL));

    /* The model: row i of the source to slot loc[i]. */
    int64_t expect_oob = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = lv[i];
        if (s < 0)
            continue;
        if (s >= slots) {
            expect_oob++;
            continue;
        }
        memcpy(kd.model + kd.front + s * dst_stride, ks.r + k_off + i * src_stride, (size_t)row);
        if (!c->mla) {
            uint8_t *vm = inter ? kd.model + kd.front + row : vd.model + vd.front;
            memcpy(vm + s * dst_stride, vsrc->r + v_off + i * src_stride, (size_t)row);
        }
    }

    tb_check(&kd);
    if (sep_v)
        tb_check(&vd);
    tb_check(&ks);
    if (!c->qkv && !c->mla)
        tb_check(&vs);
    tb_check(&loc);
    check_counter(&oob, start, expect_oob);
    tb_check_model(&kd);
    if (sep_v)
        tb_check_model(&vd);
    case_end("oob +%" PRId64, expect_oob);
    track_release_to(mark, 0);
}

START_TEST(test_store)
{
    run_store(&STORE_CASES[_i], L_DEFAULT, case_seed("store", _i, 0));
}
END_TEST

/* ======================================================================== */
/* fp8 set                                                                   */

enum { C_PAGED, C_FLAT, C_PADDED };
static const char *const C_NAMES[] = {"paged", "flat", "padded"};
enum { S_CONTIG, S_STRIDED, S_QKV };
static const char *const S_NAMES[] = {"contig", "strided", "qkv"};
static const char *const SCALE_NAMES[] = {"none", "host", "device", "per_head"};

#define BF16 KVD_DTYPE_BF16
#define F16 KVD_DTYPE_F16
#define F32 KVD_DTYPE_F32
#define E4M3 KVD_DTYPE_E4M3
#define E5M2 KVD_DTYPE_E5M2

typedef struct fp8_case {
    int src_dtype, cache_dtype;
    int64_t page_size;
    int cache_layout;
    int scale_mode;
    float k_scale, v_scale;
    int src_layout;
    int64_t n, H, D;
    int dtype, mode;
    int exhaustive; /* element e of the source holds the 16-bit pattern e */
    int k_only;     /* v_src and v_cache NULL (MLA latent) */
} fp8_case_t;

static const fp8_case_t FP8_CASES[] = {
    /* src, cache, page, cache layout, scale, k, v, src layout, n, H, D, idx, mode */
    {BF16, E4M3, 16, C_PAGED, KVD_SCALE_HOST, 0.5f, 0.25f, S_CONTIG, 512, 8, 128, I64, IDX_PERM, 0, 0},
    {BF16, E4M3, 16, C_PAGED, KVD_SCALE_DEVICE, 0.5f, 0.25f, S_CONTIG, 32, 8, 128, I64, IDX_PERM, 0, 0},
    {BF16, E5M2, 1, C_FLAT, KVD_SCALE_NONE, 1, 1, S_CONTIG, 512, 1, 576, I32, IDX_MIXED, 0, 0},
    {F16, E4M3, 64, C_PAGED, KVD_SCALE_PER_HEAD, 0.8f, 1.3f, S_STRIDED, 512, 8, 128, I32, IDX_MIXED, 0, 0},
    {F32, E4M3, 16, C_FLAT, KVD_SCALE_HOST, 2.0f, 0.37f, S_CONTIG, 512, 3, 96, I64, IDX_MIXED, 0, 0},
    {F32, E5M2, 64, C_PADDED, KVD_SCALE_DEVICE, 1.5f, 0.125f, S_STRIDED, 512, 5, 7, I32, IDX_RUNS, 0, 0},
    {F16, E5M2, 1, C_PAGED, KVD_SCALE_NONE, 1, 1, S_QKV, 1, 5, 7, I64, IDX_PERM, 0, 0},
    {BF16, E4M3, 16, C_PAGED, KVD_SCALE_NONE, 1, 1, S_CONTIG, 0, 3, 96, I64, IDX_PERM, 0, 0},
    {BF16, E4M3, 16, C_PAGED, KVD_SCALE_HOST, 0.5f, 0.25f, S_CONTIG, 65536, 8, 128, I64, IDX_PERM, 0, 0},
    {F16, E4M3, 64, C_PADDED, KVD_SCALE_PER_HEAD, 0.5f, 2.0f, S_STRIDED, 100000, 5, 7, I32, IDX_MIXED, 0, 0},
    {F32, E5M2, 1, C_FLAT, KVD_SCALE_DEVICE, 0.75f, 3.0f, S_CONTIG, 65536, 1, 576, I64, IDX_MIXED, 0, 0},
    {BF16, E5M2, 16, C_PAGED, KVD_SCALE_PER_HEAD, 1.0f, 0.5f, S_QKV, 100000, 3, 96, I64, IDX_RUNS, 0, 0},
    {F16, E4M3, 1, C_PADDED, KVD_SCALE_HOST, 0.37f, 2.5f, S_CONTIG, 32, 1, 576, I32, IDX_MIXED, 0, 0},
    {BF16, E4M3, 64, C_PAGED, KVD_SCALE_DEVICE, 4.0f, 0.5f, S_STRIDED, 1, 8, 128, I32, IDX_PERM, 0, 0},
    {F32, E4M3, 16, C_PAGED, KVD_SCALE_PER_HEAD, 1.0f, 1.0f, S_QKV, 32, 8, 128, I64, IDX_MIXED, 0, 0},
    {BF16, E4M3, 16, C_PADDED, KVD_SCALE_HOST, 0.5f, 0.25f, S_QKV, 512, 8, 128, I64, IDX_CONTIG, 0, 0},
    {BF16, E5M2, 64, C_PAGED, KVD_SCALE_HOST, 1.0f, 1.0f, S_STRIDED, 512, 1, 576, I32, IDX_MIXED, 0, 0},
    {F16, E5M2, 16, C_FLAT, KVD_SCALE_NONE, 1, 1, S_STRIDED, 65536, 5, 7, I64, IDX_MIXED, 0, 0},
    {F32, E4M3, 1, C_PAGED, KVD_SCALE_NONE, 1, 1, S_CONTIG, 100000, 3, 96, I32, IDX_PERM, 0, 0},
    {BF16, E4M3, 1, C_PAGED, KVD_SCALE_PER_HEAD, 1.0f, 1.0f, S_CONTIG, 512, 5, 7, I64, IDX_MIXED, 0, 0},
    {F16, E4M3, 16, C_PAGED, KVD_SCALE_DEVICE, 0.001f, 1000.0f, S_CONTIG, 512, 8, 128, I32, IDX_PERM, 0, 0},
    /* K only (MLA latent) */
    {BF16, E4M3, 1, C_FLAT, KVD_SCALE_HOST, 0.37f, 1, S_CONTIG, 512, 1, 576, I64, IDX_MIXED, 0, 1},
    {F32, E5M2, 16, C_PADDED, KVD_SCALE_PER_HEAD, 2.0f, 1, S_STRIDED, 4096, 5, 7, I32, IDX_RUNS, 0, 1},
};

/* Every 16-bit pattern: {bf16, f16} x {e4m3, e5m2} x {no scale, host 0.37}. */
static const fp8_case_t FP8_EXHAUSTIVE[] = {
    {BF16, E4M3, 1, C_FLAT, KVD_SCALE_NONE, 1, 1, S_CONTIG, 256, 1, 256, I64, IDX_PERM, 1, 0},
    {BF16, E5M2, 1, C_FLAT, KVD_SCALE_NONE, 1, 1, S_CONTIG, 256, 1, 256, I32, IDX_PERM, 1, 0},
    {BF16, E4M3, 1, C_FLAT, KVD_SCALE_HOST, 0.37f, 0.37f, S_CONTIG, 256, 1, 256, I64, IDX_PERM, 1, 0},
    {BF16, E5M2, 1, C_FLAT, KVD_SCALE_HOST, 0.37f, 0.37f, S_CONTIG, 256, 1, 256, I32, IDX_PERM, 1, 0},
    {F16, E4M3, 16, C_PAGED, KVD_SCALE_NONE, 1, 1, S_CONTIG, 256, 1, 256, I64, IDX_PERM, 1, 0},
    {F16, E5M2, 16, C_PAGED, KVD_SCALE_NONE, 1, 1, S_CONTIG, 256, 1, 256, I32, IDX_PERM, 1, 0},
    {F16, E4M3, 1, C_FLAT, KVD_SCALE_HOST, 0.37f, 0.37f, S_CONTIG, 256, 1, 256, I64, IDX_PERM, 1, 0},
    {F16, E5M2, 1, C_FLAT, KVD_SCALE_HOST, 0.37f, 0.37f, S_CONTIG, 256, 1, 256, I32, IDX_PERM, 1, 0},
};

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float -> bf16, round to nearest even; NaN stays NaN (payload kept when
 * it survives, otherwise quiet). */
static uint16_t f32_to_bf16(uint32_t x)
{
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        uint16_t h = (uint16_t)(x >> 16);
        return (h & 0x7f) ? h : (uint16_t)(h | 0x40);
    }
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* float -> f16, round to nearest even, overflow to infinity. */
static uint16_t f32_to_f16(uint32_t x)
{
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        uint32_t h = 0x7c00u | ((ax >> 13) & 0x3ffu);
        return (uint16_t)(sign | ((h & 0x3ffu) ? h : (h | 0x200u)));
    }
    if (ax >= 0x477ff000u) /* >= 65520: rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal or zero */
        float t = u2f(ax) * 16777216.0f; /* exact: in units of 2^-24 */
        return (uint16_t)(sign | (uint32_t)nearbyintf(t));
    }
    uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax & 0x7fffffu) >> 13));
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

static uint32_t to_src_bits(uint32_t fbits, int dt)
{
    switch (dt) {
    case BF16:
        return f32_to_bf16(fbits);
    case F16:
        return f32_to_f16(fbits);
    default:
        return fbits;
    }
}

/* Special values, as float bits: zeros, subnormals of every source type,
 * infinities, NaNs, fp8 subnormals and rounding ties, the e4m3 and e5m2
 * saturation edges, and the largest floats.  Each also with its sign
 * flipped. */
static uint32_t g_spec[512];
static int g_nspec;

static void build_specials(void)
{
    static const uint32_t raw[] = {
        0x00000000u, 0x00000001u, 0x007fffffu, 0x00010000u, 0x007f0000u, 0x00400000u,
        0x7f800000u, 0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fffffffu, 0x7f810000u,
        0x7f7fffffu, 0x00800000u,
    };
    static const float vals[] = {
        0.5f, 1.0f, 2.0f, 3.0f, 240.0f, 256.0f, 384.0f, 416.0f, 432.0f, 440.0f, 447.0f, 447.5f,
        448.0f, 448.5f, 449.0f, 455.0f, 456.0f, 457.0f, 463.0f, 463.9375f, 464.0f, 464.0625f,
        465.0f, 479.0f, 480.0f, 496.0f, 500.0f, 512.0f, 1e4f, 49152.0f, 53248.0f, 57343.0f,
        57344.0f, 57345.0f, 59392.0f, 61439.0f, 61440.0f, 61441.0f, 65504.0f, 65519.0f,
        65520.0f, 65535.0f, 65536.0f, 1e5f, 1e10f, 3.0e38f,
        /* f16 subnormals */
        5.9604644775390625e-8f, 6.097555160522461e-5f, 6.103515625e-5f,
    };
    int k = 0;
    for (int i = 0; i < ARRAY_LEN(raw); i++)
        g_spec[k++] = raw[i];
    for (int i = 0; i < ARRAY_LEN(vals); i++)
        g_spec[k++] = f2u(vals[i]);
    for (int m = 1; m <= 17; m++) /* e4m3 subnormals and ties: m * 2^-10 */
        g_spec[k++] = f2u(ldexpf((float)m, -10));
    for (int m = 1; m <= 9; m++) /* e5m2 subnormals and ties: m * 2^-17 */
        g_spec[k++] = f2u(ldexpf((float)m, -17));
    for (int m = 0; m < 32; m++) /* mantissa ties near 1: 1 + m/32 */
        g_spec[k++] = f2u(1.0f + (float)m / 32.0f);
    g_spec[k++] = f2u(ldexpf(1.0f, -6));  /* e4m3 smallest normal */
    g_spec[k++] = f2u(ldexpf(1.0f, -7));
    g_spec[k++] = f2u(ldexpf(1.0f, -14)); /* e5m2 smallest normal */
    g_spec[k++] = f2u(ldexpf(1.0f, -15));
    g_spec[k++] = f2u(ldexpf(15.0f, -10) * 1.0000001f);
    int n = k;
    for (int i = 0; i < n; i++)
        g_spec[k++] = g_spec[i] ^ 0x80000000u;
    g_nspec = k;
}

/* Source element e (token-major, then head, then dim) as source bits:
 * specials first, then the specials scaled by the element's scale (so they
 * land on the edges after the kernel divides), then random values. */
static uint32_t gen_elem(rng_t *r, int dt, int64_t e, float scale)
{
    if (e < g_nspec)
        return to_src_bits(g_spec[e], dt);
    if (e < 2 * g_nspec)
        return to_src_bits(f2u(u2f(g_spec[e - g_nspec]) * scale), dt);
    uint64_t u = rng_below(r, 8);
    if (u < 2) /* any bit pattern: NaN, inf, subnormal, huge, tiny */
        return dt == F32 ? (uint32_t)rng_next(r) : (uint32_t)(uint16_t)rng_next(r);
    float f;
    if (u < 6) /* log-uniform over 2^-20 .. 2^18: all of both formats' ranges */
        f = ldexpf(1.0f + rng_unit(r), -20 + (int)rng_below(r, 38));
    else
        f = rng_unit(r) * 8.0f;
    if (rng_next(r) & 1)
        f = -f;
    return to_src_bits(f2u(f * scale), dt);
}

static void put_src(uint8_t *p, int dt, uint32_t bits)
{
    if (dt == F32) {
        memcpy(p, &bits, 4);
    } else {
        uint16_t h = (uint16_t)bits;
        memcpy(p, &h, 2);
    }
}

static float get_src(const uint8_t *p, int dt)
{
    uint16_t h;
    if (dt == F32) {
        uint32_t u;
        memcpy(&u, p, 4);
        return u2f(u);
    }
    memcpy(&h, p, 2);
    return dt == BF16 ? kvd_bf16_to_float(h) : kvd_f16_to_float(h);
}

typedef struct fp8_geom {
    int64_t tok, head; /* source strides */
    int64_t off;       /* source byte offset inside its buffer */
    int64_t page, slot, chead; /* cache strides */
} fp8_geom_t;

static void fill_fp8_src(rng_t *r, const fp8_case_t *c, uint8_t *base, const fp8_geom_t *g,
                         const float *scales /* per head */)
{
    const int64_t es = (int64_t)kvd_dtype_size(c->src_dtype);
    for (int64_t i = 0; i < c->n; i++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t d = 0; d < c->D; d++) {
                int64_t e = (i * c->H + h) * c->D + d;
                uint32_t bits = c->exhaustive ? (uint32_t)(e & 0xffff)
                                              : gen_elem(r, c->src_dtype, e, scales[h]);
                put_src(base + g->off + i * g->tok + h * g->head + d * es, c->src_dtype, bits);
            }
}

/* One token of K or V through the model, into the model copy of a cache. */
static void fp8_model_row(const fp8_case_t *c, const uint8_t *src, const fp8_geom_t *g,
                          uint8_t *cache, int64_t slot, const float *scales, int64_t i)
{
    const int64_t es = (int64_t)kvd_dtype_size(c->src_dtype);
    const int64_t page = slot / c->page_size, in_page = slot % c->page_size;
    for (int64_t h = 0; h < c->H; h++) {
        float inv = 1.0f / scales[h];
        for (int64_t d = 0; d < c->D; d++) {
            float x = get_src(src + g->off + i * g->tok + h * g->head + d * es, c->src_dtype);
            float y = c->scale_mode == KVD_SCALE_NONE ? x : x * inv;
            cache[page * g->page + in_page * g->slot + h * g->chead + d] =
                kvd_fp8_from_float(y, c->cache_dtype);
        }
    }
}

static void run_fp8(const fp8_case_t *c0, int launch, uint64_t seed)
{
    size_t mark = track_mark();
    rng_t rng;
    rng_seed(&rng, seed);
    fp8_case_t cc = *c0;
    const fp8_case_t *c = &cc;
    const int64_t es = (int64_t)kvd_dtype_size(c->src_dtype);
    cc.n = c->exhaustive ? c->n : quick_count(c->n, 2 * c->H * c->D * (es + 1));
    REQUIRE(!c->exhaustive || c->n * c->H * c->D == 65536, "test bug: exhaustive shape");

    const int64_t n = c->n, H = c->H, D = c->D, ps = c->page_size;
    int64_t slots = auto_slots(n, c->mode, 0);
    slots = (slots + ps - 1) / ps * ps; /* whole pages */
    const int64_t pages = slots / ps;

    /* Source geometry. */
    fp8_geom_t gk = {0}, gv = {0};
    int64_t ksize, vsize = 0;
    switch (c->src_layout) {
    case S_CONTIG:
        gk.head = gv.head = D * es;
        gk.tok = gv.tok = H * D * es;
        ksize = vsize = n * gk.tok;
        break;
    case S_STRIDED: /* heads padded; V padded differently from K */
        gk.head = (D + 3) * es;
        gk.tok = H * gk.head + 5 * es;
        gv.head = (D + 1) * es;
        gv.tok = H * gv.head + 2 * es;
        ksize = n * gk.tok;
        vsize = n * gv.tok;
        break;
    default: /* one fused row: Q (2H heads), K (H), V (H) */
        gk.head = gv.head = D * es;
        gk.tok = gv.tok = 4 * H * D * es;
        gk.off = 2 * H * D * es;
        gv.off = 3 * H * D * es;
        ksize = n * gk.tok;
        break;
    }
    /* Cache geometry. */
    if (c->cache_layout == C_PADDED) {
        gk.chead = D + 8;
        gk.slot = H * gk.chead + 16;
        gk.page = ps * gk.slot + 32;
        gv.chead = D + 3;
        gv.slot = H * gv.chead + 5;
        gv.page = ps * gv.slot + 64;
    } else { /* [pages, page_size, H, D]; flat is the same with page_size slots */
        gk.chead = gv.chead = D;
        gk.slot = gv.slot = H * D;
        gk.page = gv.page = ps * gk.slot;
    }

    /* Scales: per head for the model; the host fields are set to 1 when the
     * scales come from the device, so using them would show. */
    float ksc[64], vsc[64];
    REQUIRE(H <= 64, "test bug: H");
    for (int64_t h = 0; h < H; h++) {
        ksc[h] = c->scale_mode == KVD_SCALE_NONE ? 1.0f : c->k_scale;
        vsc[h] = c->scale_mode == KVD_SCALE_NONE ? 1.0f : c->v_scale;
        if (c->scale_mode == KVD_SCALE_PER_HEAD && h > 0) {
            ksc[h] = 0.05f + 3.0f * rng_unit(&rng);
            vsc[h] = 0.05f + 3.0f * rng_unit(&rng);
        }
    }
    if (c->scale_mode == KVD_SCALE_PER_HEAD && H >= 4) {
        ksc[1] = -0.75f; /* flips signs */
        ksc[2] = 1e-30f; /* 1/scale = 1e30: nearly everything saturates */
        ksc[3] = 0.0f;   /* 1/scale = inf: saturation, and NaN from 0 * inf */
        vsc[1] = 1.0e-39f; /* a subnormal scale: 1/scale overflows to inf */
    }

    case_begin(seed,
               "fp8 %s->%s n=%" PRId64 " H=%" PRId64 " D=%" PRId64 " page=%" PRId64
               " cache=%s src=%s scale=%s(%g,%g) loc=%s/%s slots=%" PRId64 " launch=%s%s%s",
               dt_name(c->src_dtype), dt_name(c->cache_dtype), n, H, D, ps,
               C_NAMES[c->cache_layout], S_NAMES[c->src_layout], SCALE_NAMES[c->scale_mode],
               (double)c->k_scale, (double)c->v_scale, dt_name(c->dtype), IDX_NAMES[c->mode],
               slots, LS[launch].name, c->exhaustive ? " exhaustive" : "", c->k_only ? " K-only" : "");

    tbuf_t ks, vs, kc, vc, loc, oob, kscb, vscb;
    int64_t *lv = host_alloc((size_t)(n + 1) * sizeof(int64_t));
    gen_slots(&rng, c->mode, n, slots, c->dtype, lv);
    tb_index(&loc, "loc", MEM_DEV, c->dtype, lv, n);
    unsigned long long start = tb_counter(&oob, "oob_count", MEM_DEV, &rng);

    tb_alloc(&ks, c->src_layout == S_QKV ? "qkv source" : "k source", MEM_DEV, (size_t)ksize, 0);
    ks.row_stride = gk.tok;
    rng_fill(&rng, ks.r, ks.size); /* padding between heads and tokens: random */
    fill_fp8_src(&rng, c, ks.r, &gk, ksc);
    const tbuf_t *vsrc = &ks;
    const int sep_vs = c->src_layout != S_QKV && !c->k_only;
    if (sep_vs) {
        tb_alloc(&vs, "v source", MEM_DEV, (size_t)vsize, 0);
        vs.row_stride = gv.tok;
        rng_fill(&rng, vs.r, vs.size);
        vsrc = &vs;
    }
    if (!c->k_only)
        fill_fp8_src(&rng, c, vsrc->r, &gv, vsc);
    tb_upload(&ks);
    if (sep_vs)
        tb_upload(&vs);

    tb_alloc(&kc, "k cache", MEM_DEV, (size_t)(pages * gk.page), 0);
    kc.row_stride = gk.slot;
    tb_model_init(&kc);
    if (!c->k_only) {
        tb_alloc(&vc, "v cache", MEM_DEV, (size_t)(pages * gv.page), 0);
        vc.row_stride = gv.slot;
        tb_model_init(&vc);
    }

    kvd_fp8_set_args_t ag = {0};
    ag.src_dtype = c->src_dtype;
    ag.k_src_token_stride = gk.tok;
    ag.k_src_head_stride = gk.head;
    ag.v_src_token_stride = gv.tok;
    ag.v_src_head_stride = gv.head;
    ag.cache_dtype = c->cache_dtype;
    ag.page_size = ps;
    ag.k_page_stride = gk.page;
    ag.k_slot_stride = gk.slot;
    ag.k_head_stride = gk.chead;
    ag.v_page_stride = gv.page;
    ag.v_slot_stride = gv.slot;
    ag.v_head_stride = gv.chead;
    ag.num_slots = slots;
    ag.num_heads = H;
    ag.head_dim = D;
    ag.loc_dtype = c->dtype;
    ag.num_tokens = n;
    ag.scale_mode = c->scale_mode;
    ag.k_scale = c->scale_mode == KVD_SCALE_HOST ? c->k_scale : 1.0f;
    ag.v_scale = c->scale_mode == KVD_SCALE_HOST ? c->v_scale : 1.0f;
    kvd_fp8_set_args_t ar = ag;

    ag.k_src = ks.g + gk.off;
    ar.k_src = ks.r + gk.off;
    ag.k_cache = kc.g;
    ar.k_cache = kc.r;
    if (!c->k_only) {
        ag.v_src = vsrc->g + gv.off;
        ar.v_src = vsrc->r + gv.off;
        ag.v_cache = vc.g;
        ar.v_cache = vc.r;
    }
    ag.loc = loc.g;
    ar.loc = loc.r;
    ag.oob_count = (unsigned long long *)oob.g;
    ar.oob_count = (unsigned long long *)oob.r;
    const int scale_ptrs =
        c->scale_mode == KVD_SCALE_DEVICE || c->scale_mode == KVD_SCALE_PER_HEAD;
    if (scale_ptrs) {
        int64_t ns = c->scale_mode == KVD_SCALE_DEVICE ? 1 : H;
        tb_alloc(&kscb, "k scales", MEM_DEV, (size_t)ns * sizeof(float), 0);
        tb_alloc(&vscb, "v scales", MEM_DEV, (size_t)ns * sizeof(float), 0);
        memcpy(kscb.r, ksc, (size_t)ns * sizeof(float));
        memcpy(vscb.r, vsc, (size_t)ns * sizeof(float));
        tb_upload(&kscb);
        tb_upload(&vscb);
        ag.k_scale_ptr = (const float *)kscb.g;
        ar.k_scale_ptr = (const float *)kscb.r;
        if (!c->k_only) {
            ag.v_scale_ptr = (const float *)vscb.g;
            ar.v_scale_ptr = (const float *)vscb.r;
        }
    }

    gpu_call("kvd_cuda_fp8_set", op_fp8, &ag, launch, &kc);
    KVD_CALL_OK(kvd_cpu_fp8_set(&ar, NULL));

    int64_t expect_oob = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = lv[i];
        if (s < 0)
            continue;
        if (s >= slots) {
            expect_oob++;
            continue;
        }
        fp8_model_row(c, ks.r, &gk, kc.model + kc.front, s, ksc, i);
        if (!c->k_only)
            fp8_model_row(c, vsrc->r, &gv, vc.model + vc.front, s, vsc, i);
    }

    tb_check(&kc);
    if (!c->k_only)
        tb_check(&vc);
    tb_check(&ks);
    if (sep_vs)
        tb_check(&vs);
    tb_check(&loc);
    if (scale_ptrs) {
        tb_check(&kscb);
        tb_check(&vscb);
    }
    check_counter(&oob, start, expect_oob);
    tb_check_model(&kc);
    if (!c->k_only)
        tb_check_model(&vc);
    case_end("oob +%" PRId64, expect_oob);
    track_release_to(mark, 0);
}

START_TEST(test_fp8)
{
    run_fp8(&FP8_CASES[_i], L_DEFAULT, case_seed("fp8", _i, 0));
}
END_TEST

START_TEST(test_fp8_exhaustive)
{
    run_fp8(&FP8_EXHAUSTIVE[_i], L_DEFAULT, case_seed("fp8_exhaustive", _i, 0));
}
END_TEST

/* ======================================================================== */
/* page-table gather                                                         */

enum { D_ZERO, D_NEG, D_BIG, D_RANDOM };

typedef struct gather_case {
    int tdt, rdt, sdt; /* table (and out), req indices, seq_lens */
    int64_t bs, maxp, page_size, rows, cols;
    int64_t table_pad; /* extra elements per table row */
    int64_t out_pad;   /* extra elements per out row */
    int dummy;
} gather_case_t;

static const gather_case_t GATHER_CASES[] = {
    /* table, req, seq, bs, max_pages, page, rows, cols, table_pad, out_pad, dummy */
    {I32, I64, I32, 0, 256, 16, 1024, 8192, 0, 0, D_ZERO},
    {I32, I64, I32, 1, 256, 16, 1024, 8192, 0, 0, D_ZERO},
    {I32, I64, I32, 64, 2048, 16, 1024, 8192, 0, 0, D_ZERO},
    {I32, I64, I32, 512, 8192, 16, 1024, 8192, 0, 0, D_ZERO},
    {I64, I32, I64, 512, 1000, 1, 600, 900, 3, 24, D_NEG},
    {I64, I64, I64, 70000, 1, 64, 4096, 4, 0, 1, D_BIG},
    {I32, I32, I32, 70000, 16, 16, 2048, 12, 5, 3, D_NEG},
    {I64, I32, I32, 64, 8192, 64, 512, 8192, 1, 7, D_BIG},
    {I32, I64, I64, 1, 1, 1, 8, 1, 0, 0, D_RANDOM},
    {I64, I64, I32, 512, 2048, 1, 1024, 3000, 17, 0, D_NEG},
    {I32, I32, I64, 70000, 256, 16, 4096, 256, 0, 9, D_RANDOM},
    {I32, I64, I32, 1, 8192, 64, 1, 8192, 0, 0, D_ZERO},
    {I64, I32, I64, 64, 1000, 16, 64, 1000, 0, 1000, D_BIG},
    {I32, I64, I32, 512, 1000, 1, 1024, 1000, 0, 0, D_ZERO},
    /* page sizes that are not powers of two: the kernels' multiply test, not their shifts */
    {I32, I64, I32, 64, 2048, 3, 1024, 8192, 0, 0, D_ZERO},
    {I64, I32, I64, 1, 1000, 48, 64, 1000, 0, 5, D_NEG},
    {I32, I32, I32, 70000, 16, 12, 2048, 12, 5, 3, D_RANDOM},
    /* the one-pass kernel's whole-vector form (gather_even), one case per
     * table type and index widths, and two that just miss it */
    {I32, I32, I32, 64, 512, 16, 256, 1024, 0, 0, D_NEG},
    {I32, I32, I64, 64, 2048, 64, 1024, 2048, 4, 4, D_RANDOM},
    {I32, I64, I64, 100, 1024, 2, 512, 512, 0, 0, D_BIG},
    {I64, I64, I64, 32, 1024, 32, 128, 2048, 2, 0, D_NEG},
    {I64, I64, I32, 16, 600, 8, 100, 600, 0, 2, D_RANDOM},
    {I64, I32, I32, 8, 256, 4, 64, 300, 0, 0, D_ZERO},
    {I32, I64, I32, 64, 1024, 16, 512, 1022, 2, 0, D_NEG},   /* columns not whole vectors */
    {I32, I32, I32, 32, 1022, 16, 256, 2048, 0, 2, D_RANDOM}, /* max_pages not whole vectors */
    /* rows not 16-byte aligned, page a power of two: gather_even one element a thread */
    {I32, I64, I32, 40, 300, 4, 100, 301, 1, 1, D_RANDOM},
    {I64, I32, I64, 48, 500, 8, 200, 700, 1, 3, D_NEG},
    /* the smallest calls (gather_pred, at most a block per multiprocessor; bs=1 above too):
     * the index widths the cases above leave out, a block boundary, a table narrower than out */
    {I32, I32, I64, 4, 700, 32, 64, 650, 1, 2, D_NEG},
    {I64, I32, I64, 3, 130, 2, 16, 200, 0, 0, D_RANDOM},
    /* gather_pred's live test (column x page size < length) at page sizes 1 and 2^20, and a
     * page of 2^32, past its shift limit (another kernel takes it) */
    {I32, I64, I32, 2, 256, 1, 64, 300, 0, 0, D_ZERO},
    {I64, I64, I64, 2, 200, (int64_t)1 << 20, 16, 150, 0, 3, D_NEG},
    {I32, I32, I64, 1, 16, (int64_t)1 << 32, 8, 16, 0, 0, D_RANDOM},
};

static void run_gather(const gather_case_t *c0, int launch, uint64_t seed)
{
    size_t mark = track_mark();
    rng_t rng;
    rng_seed(&rng, seed);
    gather_case_t cc = *c0;
    const gather_case_t *c = &cc;
    const int64_t es = (int64_t)kvd_dtype_size(c->tdt);
    cc.bs = quick_count(c->bs, 2 * c->maxp * es);
    const int64_t bs = c->bs, maxp = c->maxp, ps = c->page_size, rows = c->rows, cols = c->cols;
    const int64_t tstride = (cols + c->table_pad) * es, ostride = (maxp + c->out_pad) * es;

    int64_t dummy;
    switch (c->dummy) {
    case D_ZERO: dummy = 0; break;
    case D_NEG: dummy = -1; break;
    case D_BIG: dummy = c->tdt == I32 ? INT32_MAX : ((int64_t)1 << 40) + 3; break;
    default:
        dummy = c->tdt == I32 ? (int64_t)(int32_t)rng_next(&rng) : (int64_t)rng_next(&rng);
    }

    case_begin(seed,
               "gather table=%s[%" PRId64 "x%" PRId64 " stride %" PRId64 "] req=%s seq=%s bs=%"
               PRId64 " max_pages=%" PRId64 " page=%" PRId64 " out_stride=%" PRId64
               " dummy=%" PRId64 " launch=%s",
               dt_name(c->tdt), rows, cols, tstride, dt_name(c->rdt), dt_name(c->sdt), bs, maxp,
               ps, ostride, dummy, LS[launch].name);

    int64_t *req = host_alloc((size_t)(bs + 1) * sizeof(int64_t));
    int64_t *seq = host_alloc((size_t)(bs + 1) * sizeof(int64_t));
    const int64_t big_seq = c->sdt == I32 ? INT32_MAX : INT64_MAX;
    for (int64_t r = 0; r < bs; r++) {
        uint64_t u = rng_below(&rng, 16);
        req[r] = u == 0 ? neg_index(&rng, c->rdt, rows)
                 : u == 1 ? oob_index(&rng, c->rdt, rows)
                          : (int64_t)rng_below(&rng, (uint64_t)rows); /* repeats allowed */
        u = rng_below(&rng, 16);
        if (u < 2)
            seq[r] = 0;
        else if (u < 9)
            seq[r] = 1 + (int64_t)rng_below(&rng, (uint64_t)(cols * ps));
        else if (u < 11)
            seq[r] = 1 + (int64_t)rng_below(&rng, (uint64_t)(maxp * ps));
        else if (u < 13) /* past the table's columns */
            seq[r] = cols * ps + 1 + (int64_t)rng_below(&rng, 100000);
        else if (u == 13)
            seq[r] = rng_below(&rng, 2) ? big_seq : big_seq - (int64_t)rng_below(&rng, 1000);
        else if (u == 14)
            seq[r] = c->sdt == I32 ? INT32_MAX - 1 : ((int64_t)1 << 40) + 1;
        else
            seq[r] = rng_below(&rng, 2) ? -1 : -(ps + 1);
    }
    if (bs >= 4) {
        req[1] = -1;
        req[2] = rows;
        seq[3] = 0;
    }

    tbuf_t table, reqb, seqb, out, oob;
    tb_alloc(&table, "req_to_page", MEM_DEV, (size_t)(rows * tstride), 0);
    table.row_stride = tstride;
    tb_random(&table, &rng);
    tb_index(&reqb, "req_pool_indices", MEM_DEV, c->rdt, req, bs);
    tb_index(&seqb, "seq_lens", MEM_DEV, c->sdt, seq, bs);
    tb_alloc(&out, "out", MEM_DEV, (size_t)(bs * ostride), 0);
    out.row_stride = ostride;
    tb_model_init(&out);
    unsigned long long start = tb_counter(&oob, "oob_count", MEM_DEV, &rng);

    kvd_gather_args_t ag = {0};
    ag.table_dtype = c->tdt;
    ag.table_rows = rows;
    ag.table_cols = cols;
    ag.table_stride = tstride;
    ag.req_dtype = c->rdt;
    ag.seq_lens_dtype = c->sdt;
    ag.out_stride = ostride;
    ag.bs = bs;
    ag.max_num_pages = maxp;
    ag.page_size = ps;
    ag.dummy_slot = dummy;
    kvd_gather_args_t ar = ag;
    ag.req_to_page = table.g;
    ar.req_to_page = table.r;
    ag.req_pool_indices = reqb.g;
    ar.req_pool_indices = reqb.r;
    ag.seq_lens = seqb.g;
    ar.seq_lens = seqb.r;
    ag.out = out.g;
    ar.out = out.r;
    ag.oob_count = (unsigned long long *)oob.g;
    ar.oob_count = (unsigned long long *)oob.r;

    gpu_call("kvd_cuda_page_table_gather", op_gather, &ag, launch, &out);
    KVD_CALL_OK(kvd_cpu_page_table_gather(&ar, NULL));

    /* The model. */
    int64_t expect_oob = 0;
    for (int64_t r = 0; r < bs; r++) {
        int64_t q = req[r], len = seq[r], valid = 0;
        if (q >= rows)
            expect_oob++;
        if (q >= 0 && q < rows && len > 0) {
            valid = len / ps + (len % ps != 0);
            if (valid > cols)
                valid = cols;
        }
        uint8_t *orow = out.model + out.front + r * ostride;
        for (int64_t col = 0; col < maxp; col++)
            idx_put(orow, c->tdt, col,
                    col < valid ? idx_get(table.r + q * tstride, c->tdt, col) : dummy);
    }

    tb_check(&out);
    tb_check(&table);
    tb_check(&reqb);
    tb_check(&seqb);
    check_counter(&oob, start, expect_oob);
    tb_check_model(&out);
    case_end("oob +%" PRId64, expect_oob);
    track_release_to(mark, 0);
}

START_TEST(test_gather)
{
    run_gather(&GATHER_CASES[_i], L_DEFAULT, case_seed("gather", _i, 0));
}
END_TEST

/* ======================================================================== */
/* transfer                                                                  */

/* layers by layer_stride; by tables of addresses in shuffled order; by
 * tables that step evenly (the copy engines' 2D path takes those too) */
enum { XF_STRIDE, XF_TABLE, XF_EVEN };
#define HAS_TABLES(layout) ((layout) != XF_STRIDE)
#define MAXL 64

typedef struct xfer_case {
    int64_t count, row, layers;
    int layout, mla, dtype, mode;
    int src_mem, dst_mem;       /* pools: MEM_DEV or MEM_PINNED */
    int64_t src_pad, dst_pad;   /* slot stride = row + pad */
    int64_t gap;                /* bytes between layers */
    int mis;                    /* pool misalignment */
    int host_meta;              /* indices, tables and counter in pinned memory */
    int launch;
} xfer_case_t;

#define DEV MEM_DEV
#define PIN MEM_PINNED

static const xfer_case_t XFER_CASES[] = {
    /* count, row, L, layout, mla, idx, mode, src, dst, src_pad, dst_pad, gap, mis, host_meta, launch */
    {0, 2048, 1, XF_STRIDE, 0, I64, IDX_PERM, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {1, 2048, 1, XF_STRIDE, 0, I32, IDX_PERM, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {3, 2048, 1, XF_STRIDE, 0, I64, IDX_MIXED, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {64, 2048, 1, XF_STRIDE, 0, I64, IDX_PERM, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {1024, 2048, 1, XF_STRIDE, 0, I32, IDX_MIXED, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {16384, 2048, 1, XF_STRIDE, 0, I64, IDX_PERM, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {131072, 2048, 1, XF_STRIDE, 0, I64, IDX_PERM, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {64, 1152, 1, XF_STRIDE, 1, I64, IDX_PERM, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {1024, 1152, 1, XF_STRIDE, 1, I32, IDX_MIXED, DEV, DEV, 128, 0, 0, 0, 0, L_DEFAULT},
    {131072, 1152, 1, XF_STRIDE, 1, I32, IDX_MIXED, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {200000, 34, 1, XF_STRIDE, 0, I64, IDX_MIXED, DEV, DEV, 0, 0, 0, 2, 0, L_DEFAULT},
    {200000, 6, 1, XF_STRIDE, 1, I32, IDX_PERM, DEV, DEV, 2, 0, 0, 4, 0, L_DEFAULT},
    {16384, 576, 1, XF_STRIDE, 0, I32, IDX_RUNS, DEV, DEV, 0, 64, 0, 0, 0, L_DEFAULT},
    {1024, 1536, 1, XF_STRIDE, 0, I64, IDX_CONTIG, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {1024, 1536, 1, XF_STRIDE, 0, I32, IDX_PERM, DEV, DEV, 0, 512, 0, 0, 0, L_DEFAULT},
    /* several layers: by layer_stride and by device tables of addresses */
    {1024, 1536, 32, XF_STRIDE, 0, I64, IDX_PERM, DEV, DEV, 0, 0, 128, 0, 0, L_DEFAULT},
    {1024, 1152, 61, XF_TABLE, 1, I64, IDX_PERM, DEV, DEV, 0, 0, 128, 0, 0, L_DEFAULT},
    {1024, 576, 32, XF_TABLE, 0, I32, IDX_MIXED, DEV, DEV, 0, 0, 130, 2, 0, L_DEFAULT},
    {4096, 34, 7, XF_STRIDE, 0, I32, IDX_MIXED, DEV, DEV, 6, 2, 6, 2, 0, L_DEFAULT},
    {200000, 34, 2, XF_STRIDE, 0, I32, IDX_MIXED, DEV, DEV, 0, 0, 64, 0, 0, L_MB1},
    /* a few layers by layer_stride, few rows: the one-pass kernels over layers (MLA: a
     * block per row) */
    {64, 1152, 4, XF_STRIDE, 1, I32, IDX_MIXED, DEV, DEV, 0, 0, 128, 0, 0, L_DEFAULT},
    {100, 1152, 3, XF_STRIDE, 1, I64, IDX_PERM, DEV, DEV, 0, 0, 64, 0, 0, L_DEFAULT},
    {64, 2048, 4, XF_STRIDE, 0, I64, IDX_PERM, DEV, DEV, 0, 0, 128, 0, 0, L_DEFAULT},
    /* one buffer, few rows (the block-per-row kernel, its loads and stores predicated), with
     * padding and out-of-range pairs: 64-bit indices at 16-byte vectors, then rows of 24, 12,
     * 6 and 3 bytes for each narrower vector (8, 4, 2 and 1 bytes; 12 over two layers) */
    {64, 1152, 1, XF_STRIDE, 1, I64, IDX_MIXED, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {64, 24, 1, XF_STRIDE, 1, I64, IDX_MIXED, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {64, 12, 2, XF_STRIDE, 1, I32, IDX_MIXED, DEV, DEV, 0, 0, 64, 0, 0, L_DEFAULT},
    {64, 6, 1, XF_STRIDE, 1, I64, IDX_MIXED, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    {64, 3, 1, XF_STRIDE, 1, I32, IDX_MIXED, DEV, DEV, 0, 0, 0, 0, 0, L_DEFAULT},
    /* pinned host pools */
    {64, 2048, 32, XF_TABLE, 0, I64, IDX_PERM, PIN, DEV, 0, 0, 128, 0, 0, L_DEFAULT},
    {1024, 2048, 32, XF_TABLE, 0, I32, IDX_MIXED, DEV, PIN, 0, 0, 128, 0, 0, L_MB8},
    {1024, 2048, 8, XF_STRIDE, 0, I64, IDX_PERM, PIN, DEV, 0, 0, 128, 0, 0, L_MB1},
    {1024, 1152, 8, XF_TABLE, 1, I64, IDX_PERM, DEV, PIN, 0, 0, 128, 0, 0, L_MB1},
    {1024, 34, 3, XF_STRIDE, 0, I32, IDX_MIXED, PIN, PIN, 0, 0, 64, 2, 0, L_DEFAULT},
    {16384, 1536, 4, XF_STRIDE, 0, I64, IDX_PERM, DEV, PIN, 0, 0, 0, 0, 0, L_MB8},
    {16384, 1536, 2, XF_TABLE, 0, I64, IDX_PERM, PIN, DEV, 0, 0, 256, 0, 0, L_DEFAULT},
    {4096, 6, 2, XF_STRIDE, 1, I64, IDX_MIXED, DEV, DEV, 0, 0, 64, 0, 0, L_STREAM},
    {1024, 2048, 4, XF_TABLE, 0, I32, IDX_MIXED, PIN, DEV, 0, 0, 128, 0, 0, L_STREAM_MB3},
    {1024, 2048, 32, XF_EVEN, 0, I64, IDX_MIXED, PIN, DEV, 0, 0, 128, 0, 0, L_DEFAULT},
    {4096, 1152, 16, XF_EVEN, 1, I32, IDX_RUNS, DEV, PIN, 0, 0, 64, 0, 0, L_MB8},
    /* copy engines: indices, tables and counter host-readable */
    {16384, 576, 2, XF_TABLE, 0, I32, IDX_RUNS, DEV, DEV, 0, 0, 128, 0, 1, L_CE},
    {1024, 1536, 4, XF_STRIDE, 0, I64, IDX_CONTIG, PIN, DEV, 0, 0, 128, 0, 1, L_CE},
    {64, 1536, 2, XF_TABLE, 0, I64, IDX_MIXED, DEV, PIN, 0, 0, 128, 0, 1, L_CE},
    {1024, 1152, 4, XF_TABLE, 1, I32, IDX_RUNS, PIN, DEV, 0, 0, 128, 0, 1, L_CE_STREAM},
    {1024, 34, 3, XF_STRIDE, 0, I32, IDX_MIXED, DEV, PIN, 2, 0, 6, 2, 1, L_CE},
    /* ... 2D over layers between pinned and device memory, asked for:
     * evenly spaced tables vouched for as one allocation, strides, runs up
     * to a whole layer (no gap), rows of odd sizes; the same layouts not
     * asked for go in batches */
    {2048, 2048, 32, XF_EVEN, 0, I64, IDX_MIXED, PIN, DEV, 0, 0, 128, 0, 1, L_CE_ONE},
    {2048, 2048, 32, XF_EVEN, 0, I64, IDX_MIXED, PIN, DEV, 0, 0, 128, 0, 1, L_CE},
    {2048, 1024, 32, XF_STRIDE, 0, I32, IDX_CONTIG, DEV, PIN, 0, 0, 0, 0, 1, L_CE},
    {2048, 1024, 32, XF_STRIDE, 0, I32, IDX_CONTIG, DEV, PIN, 0, 0, 0, 0, 1, L_CE_ONE},
    {64, 1024, 8, XF_STRIDE, 0, I32, IDX_RUNS, PIN, DEV, 0, 0, 0, 0, 1, L_CE_STREAM},
    {1000, 578, 5, XF_EVEN, 1, I64, IDX_RUNS, DEV, PIN, 6, 0, 10, 2, 1, L_CE_ONE},
};

typedef struct xside {
    const char *name;
    int mem, layout, mla;
    int64_t L, slots, slot_stride, spacing;
    int64_t kpos[MAXL], vpos[MAXL]; /* where each layer sits in its buffer */
    tbuf_t kb, vb, kt, vt;
} xside_t;

static uint8_t *xs_layer(const xside_t *s, int v, int64_t l, int where /* 0 cuda 1 ref 2 model */)
{
    const tbuf_t *b = v ? &s->vb : &s->kb;
    int64_t pos = v ? s->vpos[l] : s->kpos[l];
    uint8_t *base = where == 0 ? b->g : where == 1 ? b->r : b->model + b->front;
    return base + pos * s->spacing;
}

static void xs_init(xside_t *s, const char *name, rng_t *r, const xfer_case_t *c, int mem,
                    int64_t slots, int64_t pad, int is_dst)
{
    static char names[2][4][32];
    char(*nm)[32] = names[is_dst];

    memset(s, 0, sizeof(*s));
    s->name = name;
    s->mem = mem;
    s->layout = c->layout;
    s->mla = c->mla;
    s->L = c->layers;
    s->slots = slots;
    s->slot_stride = c->row + pad;
    s->spacing = slots * s->slot_stride + (c->layers > 1 || HAS_TABLES(c->layout) ? c->gap : 0);
    for (int64_t l = 0; l < s->L; l++)
        s->kpos[l] = s->vpos[l] = l;
    if (c->layout == XF_TABLE) { /* layers in shuffled order, K and V differently */
        perm_prefix(r, s->L, s->L, s->kpos);
        perm_prefix(r, s->L, s->L, s->vpos);
    }
    size_t bytes = (size_t)(s->L * s->spacing);
    for (int v = 0; v <= !c->mla; v++) {
        tbuf_t *b = v ? &s->vb : &s->kb;
        snprintf(nm[v], sizeof(nm[v]), "%s %s pool", name, v ? "v" : "k");
        tb_alloc(b, nm[v], mem, bytes, (size_t)c->mis);
        b->row_stride = s->slot_stride;
        if (is_dst)
            tb_model_init(b);
        else
            tb_random(b, r);
    }
    if (HAS_TABLES(c->layout)) {
        for (int v = 0; v <= !c->mla; v++) {
            tbuf_t *t = v ? &s->vt : &s->kt;
            snprintf(nm[2 + v], sizeof(nm[2 + v]), "%s %s_layers", name, v ? "v" : "k");
            tb_alloc(t, nm[2 + v], c->host_meta ? MEM_PINNED : MEM_DEV,
                     (size_t)s->L * sizeof(uint64_t), 0);
            t->no_digest = 1;
            for (int64_t l = 0; l < s->L; l++) {
                uint64_t a = (uint64_t)(uintptr_t)xs_layer(s, v, l, 0);
                memcpy(t->r + l * 8, &a, 8);
            }
            tb_upload(t);
            t->gexpect = host_alloc(t->total);
            memcpy(t->gexpect, t->rbase, t->total);
            for (int64_t l = 0; l < s->L; l++) {
                uint64_t a = (uint64_t)(uintptr_t)xs_layer(s, v, l, 1);
                memcpy(t->r + l * 8, &a, 8);
            }
        }
    }
}

static void xs_args(const xside_t *s, kvd_kv_side_t *a, int ref)
{
    memset(a, 0, sizeof(*a));
    if (HAS_TABLES(s->layout)) {
        a->k_layers = (const uint64_t *)(ref ? s->kt.r : s->kt.g);
        if (!s->mla)
            a->v_layers = (const uint64_t *)(ref ? s->vt.r : s->vt.g);
    } else {
        a->k = ref ? s->kb.r : s->kb.g;
        if (!s->mla)
            a->v = ref ? s->vb.r : s->vb.g;
        a->layer_stride = s->L > 1 ? s->spacing : 0; /* unused with one layer */
    }
    a->slot_stride = s->slot_stride;
    a->num_slots = s->slots;
}

static void xs_check(const xside_t *s, int is_dst)
{
    tb_check(&s->kb);
    if (!s->mla)
        tb_check(&s->vb);
    if (HAS_TABLES(s->layout)) {
        tb_check(&s->kt);
        if (!s->mla)
            tb_check(&s->vt);
    }
    if (is_dst) {
        tb_check_model(&s->kb);
        if (!s->mla)
            tb_check_model(&s->vb);
    }
}

static const char *mem_name(int m)
{
    return m == MEM_DEV ? "dev" : "pinned";
}

static void run_transfer(const xfer_case_t *c0, int launch, uint64_t seed)
{
    size_t mark = track_mark();
    rng_t rng;
    rng_seed(&rng, seed);
    xfer_case_t cc = *c0;
    const xfer_case_t *c = &cc;
    REQUIRE(c->layers <= MAXL, "test bug: layers");
    cc.count = quick_count(c->count, c->row * c->layers * (c->mla ? 1 : 2));
    const int64_t n = c->count;
    /* Different bounds on the two sides, so an index valid on one side only
     * shows which bound a kernel checked. */
    const int runs = c->mode == IDX_RUNS || c->mode == IDX_CONTIG;
    const int64_t dslots = runs ? 4 * n + 64 : n + n / 4 + 37;
    const int64_t sslots = runs ? 4 * n + 93 : n + n / 2 + 66;
    const int meta = c->host_meta ? MEM_PINNED : MEM_DEV;

    case_begin(seed,
               "transfer n=%" PRId64 " row=%" PRId64 " layers=%" PRId64 " %s %s %s->%s idx=%s/%s"
               " slots=%" PRId64 "->%" PRId64 " pad=%" PRId64 "/%" PRId64 " gap=%" PRId64
               " mis=%d meta=%s launch=%s",
               n, c->row, c->layers, c->layout == XF_TABLE  ? "tables"
               : c->layout == XF_EVEN ? "even tables"
                                      : "layer_stride",
               c->mla ? "MLA" : "MHA", mem_name(c->src_mem), mem_name(c->dst_mem),
               dt_name(c->dtype), IDX_NAMES[c->mode], sslots, dslots, c->src_pad, c->dst_pad,
               c->gap, c->mis, mem_name(meta), LS[launch].name);

    int64_t *si = host_alloc((size_t)(n + 1) * sizeof(int64_t));
    int64_t *di = host_alloc((size_t)(n + 1) * sizeof(int64_t));
    gen_pairs(&rng, c->mode, n, sslots, dslots, c->dtype, si, di);

    xside_t *src = host_alloc(sizeof(*src)), *dst = host_alloc(sizeof(*dst));
    xs_init(src, "src", &rng, c, c->src_mem, sslots, c->src_pad, 0);
    xs_init(dst, "dst", &rng, c, c->dst_mem, dslots, c->dst_pad, 1);
    tbuf_t sib, dib, oob;
    tb_index(&sib, "src_idx", meta, c->dtype, si, n);
    tb_index(&dib, "dst_idx", meta, c->dtype, di, n);
    unsigned long long start = tb_counter(&oob, "oob_count", meta, &rng);

    kvd_transfer_args_t ag = {0}, ar = {0};
    xs_args(src, &ag.src, 0);
    xs_args(dst, &ag.dst, 0);
    xs_args(src, &ar.src, 1);
    xs_args(dst, &ar.dst, 1);
    ag.num_layers = ar.num_layers = c->layers;
    ag.src_idx = sib.g;
    ar.src_idx = sib.r;
    ag.dst_idx = dib.g;
    ar.dst_idx = dib.r;
    ag.idx_dtype = ar.idx_dtype = c->dtype;
    ag.count = ar.count = n;
    ag.row_bytes = ar.row_bytes = c->row;
    ag.oob_count = (unsigned long long *)oob.g;
    ar.oob_count = (unsigned long long *)oob.r;

    gpu_call("kvd_cuda_kv_transfer", op_transfer, &ag, launch, &dst->kb);
    KVD_CALL_OK(kvd_cpu_kv_transfer(&ar, NULL));

    /* The model: a pair with a negative index on either side is padding; a
     * pair with an index past its side's slots is skipped and counted. */
    int64_t expect_oob = 0;
    for (int64_t i = 0; i < n; i++) {
        if (si[i] < 0 || di[i] < 0)
            continue;
        if (si[i] >= sslots || di[i] >= dslots) {
            expect_oob++;
            continue;
        }
        for (int64_t l = 0; l < c->layers; l++)
            for (int v = 0; v <= !c->mla; v++)
                memcpy(xs_layer(dst, v, l, 2) + di[i] * dst->slot_stride,
                       xs_layer(src, v, l, 1) + si[i] * src->slot_stride, (size_t)c->row);
    }

    xs_check(dst, 1);
    xs_check(src, 0);
    tb_check(&sib);
    tb_check(&dib);
    check_counter(&oob, start, expect_oob);
    case_end("oob +%" PRId64, expect_oob);
    track_release_to(mark, 0);
}

START_TEST(test_transfer)
{
    run_transfer(&XFER_CASES[_i], XFER_CASES[_i].launch, case_seed("transfer", _i, 0));
}
END_TEST

/* Every transfer shape again through the copy engines, which the daemon
 * takes by default between host and device memory: indices, layer tables
 * and the counter then lie in pinned host memory, where the path reads
 * them; rows, padding, out-of-range pairs, tables and layers as above.
 * On a held stream only where the copies are few: the driver blocks a
 * batched copy once its stream holds a few batches of a few thousand
 * descriptors (the daemon issues them from threads of its own for that
 * reason), so a large case there would wait for the gate. */
#define CE_GATED_MAX_DESCRIPTORS 1024

START_TEST(test_transfer_copy_engine)
{
    xfer_case_t c = XFER_CASES[_i];
    int64_t descriptors = c.count * c.layers * (c.mla ? 1 : 2);

    c.host_meta = 1;
    run_transfer(&c, _i % 2 && descriptors <= CE_GATED_MAX_DESCRIPTORS ? L_CE_STREAM : L_CE,
                 case_seed("transfer_ce", _i, 0));
}
END_TEST

/* The same cases with each run its own cudaMemcpyAsync (KVD_LAUNCH_COPY_EACH:
 * batches of runs under 32 KiB on average); on a held stream only where the
 * calls are fewer still (each is a command in the stream's queue). */
#define EACH_GATED_MAX_DESCRIPTORS 256

START_TEST(test_transfer_copy_each)
{
    xfer_case_t c = XFER_CASES[_i];
    int64_t descriptors = c.count * c.layers * (c.mla ? 1 : 2);

    c.host_meta = 1;
    run_transfer(&c,
                 _i % 2 && descriptors <= EACH_GATED_MAX_DESCRIPTORS ? L_CE_EACH_STREAM : L_CE_EACH,
                 case_seed("transfer_each", _i, 0));
}
END_TEST

/* ======================================================================== */
/* launch settings: every variant gives the same bytes                        */

static const store_case_t LAUNCH_STORE = {5000, 1536, I64, 0, IDX_MIXED, 1, 4, 2, 0, 0, 0};
static const fp8_case_t LAUNCH_FP8 = {BF16, E4M3, 16, C_PAGED, KVD_SCALE_PER_HEAD, 0.5f,
                                      0.25f, S_CONTIG, 3000, 8, 128, I32, IDX_MIXED, 0, 0};
static const gather_case_t LAUNCH_GATHER = {I32, I64, I32, 300, 1000, 16, 512, 1000, 0, 3, D_NEG};
static const xfer_case_t LAUNCH_XFER = {3000, 1152, 4, XF_TABLE, 0, I32, IDX_MIXED, PIN, DEV,
                                        0, 0, 128, 0, 1, L_DEFAULT};

static void run_variants(int op, const int *variants, int nv)
{
    uint64_t seed = case_seed("launch", op, 0), first = 0;
    for (int k = 0; k < nv; k++) {
        g_digest_on = 1;
        g_digest = 0xcbf29ce484222325ull;
        switch (op) {
        case 0: run_store(&LAUNCH_STORE, variants[k], seed); break;
        case 1: run_fp8(&LAUNCH_FP8, variants[k], seed); break;
        case 2: run_gather(&LAUNCH_GATHER, variants[k], seed); break;
        default: run_transfer(&LAUNCH_XFER, variants[k], seed); break;
        }
        g_digest_on = 0;
        /* Same seed, same inputs: each run already matched the reference
         * byte for byte; the digests say so once more across runs. */
        if (k == 0)
            first = g_digest;
        else
            REQUIRE(g_digest == first,
                    "launch %s gave other bytes than launch %s (digest %016" PRIx64
                    " vs %016" PRIx64 ")",
                    LS[variants[k]].name, LS[variants[0]].name, g_digest, first);
    }
}

START_TEST(test_launch)
{
    static const int kernels[] = {L_DEFAULT, L_NULL, L_MB1, L_MB8, L_STREAM, L_STREAM_MB3};
    /* (one call a run on a held stream: the case's 24,000 runs would fill
     * the stream's queue, and the call would wait for the gate) */
    static const int xfer[] = {L_DEFAULT,    L_NULL, L_MB1,       L_MB8, L_STREAM,
                               L_STREAM_MB3, L_CE,   L_CE_STREAM, L_CE_EACH};
    if (_i < 3)
        run_variants(_i, kernels, ARRAY_LEN(kernels));
    else
        run_variants(_i, xfer, ARRAY_LEN(xfer));
}
END_TEST

/* ======================================================================== */
/* A pool past 2^31 elements and 2^32 bytes                                  */

#define BIG_ROW 1536                       /* 6 heads x 128 x bf16 */
#define BIG_HALF ((int64_t)4608 << 20)     /* 4.5 GiB: 2.4e9 bf16 elements */
#define BIG_SLOTS (BIG_HALF / BIG_ROW)     /* 3,145,728 */
#define BIG_LAYER ((int64_t)1536 << 20)    /* 1.5 GiB: three layers per half */
#define BIG_LSLOTS (BIG_LAYER / BIG_ROW)   /* 1,048,576 */
#define BIG_P 0xa5
#define BIG_MAXROWS 512

typedef struct bigrow {
    int64_t off;             /* byte offset in the allocation */
    uint8_t data[BIG_ROW];
} bigrow_t;

typedef struct bigctx {
    uint8_t *dev, *ref;      /* allocations: device and host mirror (sparse) */
    int64_t total;
    bigrow_t *rows;          /* the expected content of every row that is not poison */
    int nrows;
    int64_t *watch;          /* offsets of rows that must stay poison */
    int nwatch;
} bigctx_t;

static void big_expect(bigctx_t *b, int64_t off, const uint8_t *data)
{
    REQUIRE(b->nrows < BIG_MAXROWS, "test bug: too many rows");
    b->rows[b->nrows].off = off;
    memcpy(b->rows[b->nrows].data, data, BIG_ROW);
    b->nrows++;
}

static void big_watch(bigctx_t *b, int64_t off)
{
    if (off >= 0 && off + BIG_ROW <= b->total && b->nwatch < BIG_MAXROWS)
        b->watch[b->nwatch++] = off;
}

/* A row of random data at off, on the device and in the mirror. */
static void big_put(bigctx_t *b, rng_t *r, int64_t off)
{
    uint8_t row[BIG_ROW];
    rng_fill(r, row, BIG_ROW);
    CUDA_OK(cudaMemcpy(b->dev + off, row, BIG_ROW, cudaMemcpyHostToDevice));
    memcpy(b->ref + off, row, BIG_ROW);
    big_expect(b, off, row);
}

/* Slots whose rows straddle 2^31 and 2^32 bytes (2^31 bf16 elements) and
 * 3 GiB from each layer's base, and the last ones; at most nmax. */
static int big_slots(int64_t bound, int64_t layer_stride, int64_t layers, int64_t *out, int nmax)
{
    int64_t cand[64];
    int nc = 0;
    static const int64_t targets[] = {(int64_t)1 << 31, (int64_t)1 << 32, (int64_t)3 << 30};
    for (int t = 0; t < 3; t++)
        for (int64_t l = 0; l < layers; l++) {
            int64_t rel = targets[t] - l * layer_stride;
            if (rel < 0)
                continue;
            cand[nc++] = rel / BIG_ROW;
            cand[nc++] = rel / BIG_ROW - 1;
        }
    cand[nc++] = bound - 1;
    cand[nc++] = bound - 2;
    cand[nc++] = bound - 5;
    cand[nc++] = bound - 64;
    int k = 0;
    for (int i = 0; i < nc && k < nmax; i++) {
        int dup = cand[i] < 0 || cand[i] >= bound;
        for (int j = 0; j < k && !dup; j++)
            dup = out[j] == cand[i];
        if (!dup)
            out[k++] = cand[i];
    }
    return k;
}

static int in_list(const int64_t *v, int n, int64_t x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return 1;
    return 0;
}

/* Compare a window around every expected and watched row: the device and
 * the reference mirror must both equal poison overlaid with the expected
 * rows.  Then re-poison the windows and (unless quick) read back the whole
 * allocation: every byte must be poison, so nothing was written elsewhere. */
static void big_verify(bigctx_t *b)
{
    const int64_t pad = BIG_ROW + 64;
    const int64_t wlen = 3 * BIG_ROW + 128;
    uint8_t *got = host_alloc((size_t)wlen), *want = host_alloc((size_t)wlen);
    int nwin = b->nrows + b->nwatch;
    int64_t *wa = host_alloc((size_t)nwin * sizeof(int64_t));
    int64_t *wb = host_alloc((size_t)nwin * sizeof(int64_t));

    for (int w = 0; w < nwin; w++) {
        int64_t center = w < b->nrows ? b->rows[w].off : b->watch[w - b->nrows];
        int64_t a = center - pad, e = center + BIG_ROW + pad;
        if (a < 0)
            a = 0;
        if (e > b->total)
            e = b->total;
        wa[w] = a;
        wb[w] = e;
        size_t len = (size_t)(e - a);
        memset(want, BIG_P, len);
        for (int k = 0; k < b->nrows; k++) {
            int64_t o = b->rows[k].off;
            for (int64_t x = o > a ? o : a; x < o + BIG_ROW && x < e; x++)
                want[x - a] = b->rows[k].data[x - o];
        }
        CUDA_OK(cudaMemcpy(got, b->dev + a, len, cudaMemcpyDeviceToHost));
        for (int side = 0; side < 2; side++) {
            const uint8_t *g = side ? b->ref + a : got;
            if (memcmp(g, want, len) == 0)
                continue;
            size_t i = 0;
            while (g[i] == want[i])
                i++;
            fail_case("big pool: %s byte at allocation offset %" PRId64
                      " (slot row of %d bytes at %" PRId64 ", byte %" PRId64
                      "): got 0x%02x, want 0x%02x%s",
                      side ? "CPU reference" : "CUDA", a + (int64_t)i, BIG_ROW, center,
                      a + (int64_t)i - center, g[i], want[i],
                      g[i] == BIG_P ? " (poison: never written)" : "");
        }
    }
    for (int w = 0; w < nwin; w++)
        CUDA_OK(cudaMemset(b->dev + wa[w], BIG_P, (size_t)(wb[w] - wa[w])));
    if (g_quick) {
        printf(" (quick: whole-pool scan skipped)");
        return;
    }
    const size_t chunk = (size_t)256 << 20;
    uint8_t *stage = pinned_alloc(chunk);
    uint64_t pat;
    memset(&pat, BIG_P, sizeof(pat));
    for (int64_t off = 0; off < b->total; off += (int64_t)chunk) {
        size_t len = (size_t)(b->total - off) < chunk ? (size_t)(b->total - off) : chunk;
        CUDA_OK(cudaMemcpy(stage, b->dev + off, len, cudaMemcpyDeviceToHost));
        size_t i = 0;
        for (; i + 8 <= len; i += 8) {
            uint64_t v;
            memcpy(&v, stage + i, 8);
            if (v != pat)
                break;
        }
        for (; i < len; i++)
            if (stage[i] != BIG_P)
                fail_case("big pool: a byte outside every row it should touch changed: "
                          "allocation offset %" PRId64 " = 0x%02x",
                          off + (int64_t)i, stage[i]);
    }
}

START_TEST(test_big_pool)
{
    uint64_t seed = case_seed("big_pool", _i, 0);
    rng_t rng;
    rng_seed(&rng, seed);
    static const char *const what[] = {
        "store MHA i64 (K in the first 4.5 GiB, V in the second)",
        "store MLA i32 misaligned source",
        "transfer MHA i32 one layer within the pool",
        "transfer MLA i64 3 layers by layer_stride 1.5 GiB",
    };
    const int64_t total = 2 * BIG_HALF + 2 * GUARD;
    case_begin(seed, "big_pool %s: %.1f GiB, row=%d", what[_i], (double)total / (1 << 30),
               BIG_ROW);

    bigctx_t b = {0};
    b.total = total;
    cudaError_t e = cudaMalloc((void **)&b.dev, (size_t)total);
    if (e != cudaSuccess) {
        big_alloc_failed(e, total);
        return;
    }
    track_push(T_DEV, b.dev, (size_t)total);
    b.ref = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    REQUIRE(b.ref != MAP_FAILED, "mmap of a %.1f GiB sparse mirror failed",
            (double)total / (1 << 30));
    track_push(T_MMAP, b.ref, (size_t)total);
    b.rows = host_alloc(BIG_MAXROWS * sizeof(bigrow_t));
    b.watch = host_alloc(BIG_MAXROWS * sizeof(int64_t));
    CUDA_OK(cudaMemset(b.dev, BIG_P, (size_t)total));

    uint8_t *A_d = b.dev + GUARD, *B_d = b.dev + GUARD + BIG_HALF;
    uint8_t *A_r = b.ref + GUARD, *B_r = b.ref + GUARD + BIG_HALF;
    const int64_t A = GUARD, B = GUARD + BIG_HALF; /* offsets in the allocation */
    tbuf_t oob;
    unsigned long long start = tb_counter(&oob, "oob_count", MEM_DEV, &rng);
    int64_t expect_oob = 0;
    int64_t slots[64];

    /* The mirror is zero-filled on demand; poison it where rows are read or
     * written (the windows big_verify compares), i.e. around every row. */
#define BIG_POISON_MIRROR(off)                                                               \
    do {                                                                                     \
        int64_t a_ = (off) - BIG_ROW - 64, e_ = (off) + 2 * BIG_ROW + 64;                    \
        if (a_ < 0)                                                                          \
            a_ = 0;                                                                          \
        if (e_ > total)                                                                      \
            e_ = total;                                                                      \
        memset(b.ref + a_, BIG_P, (size_t)(e_ - a_));                                        \
    } while (0)

    if (_i <= 1) { /* store */
        const int mla = _i == 1, dtype = mla ? I32 : I64, mis = mla ? 2 : 0;
        int ns = big_slots(BIG_SLOTS, 0, 1, slots, 40);
        int64_t *loc = host_alloc(64 * sizeof(int64_t));
        int n = 0;
        for (int k = 0; k < ns; k++)
            loc[n++] = slots[k];
        while (n < ns + 16) { /* and some in the upper half */
            int64_t s = BIG_SLOTS / 2 + (int64_t)rng_below(&rng, BIG_SLOTS / 2);
            if (!in_list(loc, n, s))
                loc[n++] = s;
        }
        loc[n++] = -1;
        loc[n++] = BIG_SLOTS; /* one past the end: the first row of V's half */
        loc[n++] = BIG_SLOTS + 1;
        loc[n++] = dtype == I32 ? INT32_MAX : INT64_MAX;
        expect_oob = 3;
        for (int k = n - 1; k > 0; k--) { /* shuffle */
            int j = (int)rng_below(&rng, (uint64_t)k + 1);
            int64_t t = loc[k];
            loc[k] = loc[j];
            loc[j] = t;
        }
        const int64_t sstride = BIG_ROW + 2 * mis;
        tbuf_t ks, vs, lb;
        tb_alloc(&ks, "k source", MEM_DEV, (size_t)(n * sstride), (size_t)mis);
        tb_random(&ks, &rng);
        if (!mla) {
            tb_alloc(&vs, "v source", MEM_DEV, (size_t)(n * sstride), (size_t)mis);
            tb_random(&vs, &rng);
        }
        tb_index(&lb, "loc", MEM_DEV, dtype, loc, n);
        for (int k = 0; k < n; k++) {
            int64_t s = loc[k];
            if (s >= 0 && s < BIG_SLOTS) {
                BIG_POISON_MIRROR(A + s * BIG_ROW);
                BIG_POISON_MIRROR(B + s * BIG_ROW);
            }
        }
        BIG_POISON_MIRROR(B);
        big_watch(&b, B); /* where loc = num_slots would land for K */
        for (int k = 0; k < n; k++) {
            int64_t s = loc[k];
            if (s < 0 || s >= BIG_SLOTS)
                continue;
            big_expect(&b, A + s * BIG_ROW, ks.r + k * sstride);
            if (!mla)
                big_expect(&b, B + s * BIG_ROW, vs.r + k * sstride);
        }
        kvd_store_args_t ag = {0};
        ag.k_src_stride = ag.v_src_stride = sstride;
        ag.k_dst_stride = ag.v_dst_stride = BIG_ROW;
        ag.num_slots = BIG_SLOTS;
        ag.loc_dtype = dtype;
        ag.num_tokens = n;
        ag.row_bytes = BIG_ROW;
        kvd_store_args_t ar = ag;
        ag.k_src = ks.g;
        ar.k_src = ks.r;
        ag.k_dst = A_d;
        ar.k_dst = A_r;
        if (!mla) {
            ag.v_src = vs.g;
            ar.v_src = vs.r;
            ag.v_dst = B_d;
            ar.v_dst = B_r;
        }
        ag.loc = lb.g;
        ar.loc = lb.r;
        ag.oob_count = (unsigned long long *)oob.g;
        ar.oob_count = (unsigned long long *)oob.r;
        gpu_call("kvd_cuda_kv_store", op_store, &ag, L_DEFAULT, NULL);
        KVD_CALL_OK(kvd_cpu_kv_store(&ar, NULL));
        tb_check(&ks);
        if (!mla)
            tb_check(&vs);
        tb_check(&lb);
    } else { /* transfer */
        const int mla = _i == 3, dtype = mla ? I64 : I32;
        const int64_t L = mla ? 3 : 1, bound = mla ? BIG_LSLOTS : BIG_SLOTS;
        const int64_t lstride = mla ? BIG_LAYER : 0;
        int64_t *si = host_alloc(64 * sizeof(int64_t)), *di = host_alloc(64 * sizeof(int64_t));
        int nd = big_slots(bound, BIG_LAYER, L, slots, 24);
        int n = 0;
        for (int k = 0; k < nd; k++) { /* sources: distinct, disjoint from destinations */
            int64_t s;
            do
                s = bound - 1 - (int64_t)rng_below(&rng, 5000);
            while (in_list(slots, nd, s) || in_list(si, n, s));
            si[n] = s;
            di[n] = slots[k];
            n++;
        }
        const int64_t vs0 = si[0], vd0 = di[0];
        si[n] = -1; di[n] = vd0 + 3; n++;              /* padding: vd0 + 3 must stay poison */
        si[n] = vs0; di[n] = bound; n++;               /* out of range: counted */
        si[n] = bound + 7; di[n] = vd0 + 5; n++;        /* counted */
        si[n] = dtype == I32 ? INT32_MAX : INT64_MAX; di[n] = -1; n++; /* padding */
        expect_oob = 2;
        uint8_t *sk_d = A_d, *dk_d = mla ? B_d : A_d, *sk_r = A_r, *dk_r = mla ? B_r : A_r;
        const int64_t sk = A, dk = mla ? B : A;
        for (int64_t l = 0; l < L; l++)
            for (int k = 0; k < n; k++) {
                for (int v = 0; v <= !mla; v++) {
                    int64_t sb = (v ? B : sk) + l * lstride, db = (v ? B : dk) + l * lstride;
                    if (si[k] >= 0 && si[k] < bound)
                        BIG_POISON_MIRROR(sb + si[k] * BIG_ROW);
                    if (di[k] >= 0 && di[k] < bound)
                        BIG_POISON_MIRROR(db + di[k] * BIG_ROW);
                    if (di[k] == bound)
                        BIG_POISON_MIRROR(db + di[k] * BIG_ROW);
                }
            }
        /* Source rows: random; expected destination rows: copies. */
        for (int64_t l = 0; l < L; l++)
            for (int k = 0; k < nd; k++)
                for (int v = 0; v <= !mla; v++) {
                    int64_t sb = (v ? B : sk) + l * lstride, db = (v ? B : dk) + l * lstride;
                    big_put(&b, &rng, sb + si[k] * BIG_ROW);
                    big_expect(&b, db + di[k] * BIG_ROW, b.rows[b.nrows - 1].data);
                }
        for (int64_t l = 0; l < L; l++)
            for (int v = 0; v <= !mla; v++) {
                int64_t db = (v ? B : dk) + l * lstride;
                big_watch(&b, db + (vd0 + 3) * BIG_ROW);
                big_watch(&b, db + (vd0 + 5) * BIG_ROW);
                big_watch(&b, db + bound * BIG_ROW);
            }
        tbuf_t sib, dib;
        tb_index(&sib, "src_idx", MEM_DEV, dtype, si, n);
        tb_index(&dib, "dst_idx", MEM_DEV, dtype, di, n);
        kvd_transfer_args_t ag = {0};
        ag.src.slot_stride = ag.dst.slot_stride = BIG_ROW;
        ag.src.num_slots = ag.dst.num_slots = bound;
        ag.src.layer_stride = ag.dst.layer_stride = lstride;
        ag.num_layers = L;
        ag.idx_dtype = dtype;
        ag.count = n;
        ag.row_bytes = BIG_ROW;
        kvd_transfer_args_t ar = ag;
        ag.src.k = sk_d;
        ag.dst.k = dk_d;
        ar.src.k = sk_r;
        ar.dst.k = dk_r;
        if (!mla) {
            ag.src.v = ag.dst.v = B_d;
            ar.src.v = ar.dst.v = B_r;
        }
        ag.src_idx = sib.g;
        ag.dst_idx = dib.g;
        ar.src_idx = sib.r;
        ar.dst_idx = dib.r;
        ag.oob_count = (unsigned long long *)oob.g;
        ar.oob_count = (unsigned long long *)oob.r;
        gpu_call("kvd_cuda_kv_transfer", op_transfer, &ag, L_DEFAULT, NULL);
        KVD_CALL_OK(kvd_cpu_kv_transfer(&ar, NULL));
        tb_check(&sib);
        tb_check(&dib);
    }
#undef BIG_POISON_MIRROR
    check_counter(&oob, start, expect_oob);
    big_verify(&b);
    case_end("%d rows checked, oob +%" PRId64, b.nrows, expect_oob);
}
END_TEST

/* ======================================================================== */
/* Bounds past 2^32 slots                                                    */

/* Case 2: a destination pool of 2 slots 2^32 + 1 bytes apart (byte-wise
 * rows, so the stride in vectors is past 32 bits too), MLA rows of 576
 * bytes: src slot 5 -> dst slot 0, src slot 3 -> dst slot 1.  A stride cut
 * to 32 bits (1) would put slot 1's row over slot 0's.  The 4 GiB pool is
 * compared in two windows, around each slot, against poison and the rows. */
static int wide_stride_case(rng_t *rng)
{
    const int64_t row = 576, stride = ((int64_t)1 << 32) + 1, margin = 64;
    const int64_t total = stride + row + 2 * margin;
    uint8_t *pool = NULL;
    cudaError_t e = cudaMalloc((void **)&pool, (size_t)total);
    if (e != cudaSuccess) {
        big_alloc_failed(e, total);
        return 0;
    }
    track_push(T_DEV, pool, (size_t)total);
    CUDA_OK(cudaMemset(pool, 0xa5, (size_t)total));
    uint8_t *dst = pool + margin;

    const int64_t si[2] = {5, 3}, di[2] = {0, 1};
    tbuf_t src, src_i, dst_i, oob;
    tb_alloc(&src, "src pool", MEM_DEV, (size_t)(8 * row), 0);
    src.row_stride = row;
    tb_random(&src, rng);
    tb_index(&src_i, "src_idx", MEM_DEV, I64, si, 2);
    tb_index(&dst_i, "dst_idx", MEM_DEV, I64, di, 2);
    unsigned long long start = tb_counter(&oob, "oob_count", MEM_DEV, rng);

    kvd_transfer_args_t ag = {0};
    ag.src.k = src.g;
    ag.src.slot_stride = row;
    ag.src.num_slots = 8;
    ag.dst.k = dst;
    ag.dst.slot_stride = stride;
    ag.dst.num_slots = 2;
    ag.num_layers = 1;
    ag.src_idx = src_i.g;
    ag.dst_idx = dst_i.g;
    ag.idx_dtype = I64;
    ag.count = 2;
    ag.row_bytes = row;
    ag.oob_count = (unsigned long long *)oob.g;
    gpu_call("kvd_cuda_kv_transfer", op_transfer, &ag, L_DEFAULT, NULL);

    uint8_t *got = host_alloc((size_t)(row + 2 * margin)), *want = host_alloc((size_t)(row + 2 * margin));
    for (int k = 0; k < 2; k++) { /* the window around dst slot di[k] */
        const int64_t at = margin + di[k] * stride - margin;
        CUDA_OK(cudaMemcpy(got, pool + at, (size_t)(row + 2 * margin), cudaMemcpyDeviceToHost));
        memset(want, 0xa5, (size_t)(row + 2 * margin));
        memcpy(want + margin, src.r + si[k] * row, (size_t)row);
        for (int64_t b = 0; b < row + 2 * margin; b++)
            REQUIRE(got[b] == want[b],
                    "dst slot %" PRId64 " (byte offset %" PRId64 " in the pool): byte %" PRId64
                    " of its window is 0x%02x, expected 0x%02x",
                    di[k], at + margin, b - margin, got[b], want[b]);
    }
    tb_check(&src);
    tb_check(&src_i);
    tb_check(&dst_i);
    check_counter(&oob, start, 0);
    return 1;
}

/* A pool that declares more slots than 32 bits count (2^32 + 5) and holds
 * a few real ones at the front, with indices among the real ones and past
 * the bound: small calls whose fields fit 32 bits run a kernel with 32-bit
 * bounds, and these must not (a bound cut to 5 would call slots 5 and up
 * out of range).  0: MHA store, 1: MLA one-layer transfer; 2: a slot
 * stride past 2^32 bytes (wide_stride_case). */
START_TEST(test_wide_bounds)
{
    uint64_t seed = case_seed("wide_bounds", _i, 0);
    rng_t rng;
    rng_seed(&rng, seed);
    if (_i == 2) {
        case_begin(seed, "wide_bounds MLA transfer: dst slot stride 2^32+1 bytes, row=576");
        if (wide_stride_case(&rng))
            case_end(NULL);
        return;
    }
    const int64_t bound = ((int64_t)1 << 32) + 5, real = 64, row = 1152, n = 40;
    const int mla = _i == 1;
    case_begin(seed, "wide_bounds %s: num_slots 2^32+5, %" PRId64 " real slots, row=%" PRId64,
               mla ? "MLA transfer" : "MHA store", real, row);

    int64_t *si = host_alloc((size_t)n * sizeof(int64_t)), *di = host_alloc((size_t)n * sizeof(int64_t));
    int64_t perm_s[64], perm_d[64];
    perm_prefix(&rng, real, real, perm_s);
    perm_prefix(&rng, real, real, perm_d);
    for (int64_t i = 0; i < n; i++) {
        si[i] = perm_s[i];
        di[i] = perm_d[i];
    }
    di[3] = bound;         /* out of range: counted */
    di[7] = bound + 1000;  /* counted */
    di[11] = -1;           /* padding */
    int64_t expect_oob = 2;
    if (mla) {
        si[13] = bound + 2; /* a source out of range: counted */
        si[17] = -5;        /* padding */
        expect_oob++;
    }
    tbuf_t oob, src_i, dst_i;
    unsigned long long start = tb_counter(&oob, "oob_count", MEM_DEV, &rng);
    tb_index(&dst_i, mla ? "dst_idx" : "loc", MEM_DEV, I64, di, n);
    if (mla)
        tb_index(&src_i, "src_idx", MEM_DEV, I64, si, n);

    tbuf_t ks, vs, kd, vd;
    if (mla) {
        tb_alloc(&ks, "src pool", MEM_DEV, (size_t)(real * row), 0);
        ks.row_stride = row;
        tb_random(&ks, &rng);
        tb_alloc(&kd, "dst pool", MEM_DEV, (size_t)(real * row), 0);
        kd.row_stride = row;
        kvd_transfer_args_t ag = {0};
        ag.src.slot_stride = ag.dst.slot_stride = row;
        ag.src.num_slots = ag.dst.num_slots = bound;
        ag.num_layers = 1;
        ag.idx_dtype = I64;
        ag.count = n;
        ag.row_bytes = row;
        kvd_transfer_args_t ar = ag;
        ag.src.k = ks.g;
        ag.dst.k = kd.g;
        ar.src.k = ks.r;
        ar.dst.k = kd.r;
        ag.src_idx = src_i.g;
        ag.dst_idx = dst_i.g;
        ar.src_idx = src_i.r;
        ar.dst_idx = dst_i.r;
        ag.oob_count = (unsigned long long *)oob.g;
        ar.oob_count = (unsigned long long *)oob.r;
        gpu_call("kvd_cuda_kv_transfer", op_transfer, &ag, L_DEFAULT, &kd);
        KVD_CALL_OK(kvd_cpu_kv_transfer(&ar, NULL));
        tb_check(&src_i);
    } else {
        tb_alloc(&ks, "k source", MEM_DEV, (size_t)(n * row), 0);
        tb_alloc(&vs, "v source", MEM_DEV, (size_t)(n * row), 0);
        ks.row_stride = vs.row_stride = row;
        tb_random(&ks, &rng);
        tb_random(&vs, &rng);
        tb_alloc(&kd, "k pool", MEM_DEV, (size_t)(real * row), 0);
        tb_alloc(&vd, "v pool", MEM_DEV, (size_t)(real * row), 0);
        kd.row_stride = vd.row_stride = row;
        kvd_store_args_t ag = {0};
        ag.k_src_stride = ag.v_src_stride = ag.k_dst_stride = ag.v_dst_stride = row;
        ag.num_slots = bound;
        ag.loc_dtype = I64;
        ag.num_tokens = n;
        ag.row_bytes = row;
        kvd_store_args_t ar = ag;
        ag.k_src = ks.g;
        ag.v_src = vs.g;
        ag.k_dst = kd.g;
        ag.v_dst = vd.g;
        ag.loc = dst_i.g;
        ar.k_src = ks.r;
        ar.v_src = vs.r;
        ar.k_dst = kd.r;
        ar.v_dst = vd.r;
        ar.loc = dst_i.r;
        ag.oob_count = (unsigned long long *)oob.g;
        ar.oob_count = (unsigned long long *)oob.r;
        gpu_call("kvd_cuda_kv_store", op_store, &ag, L_DEFAULT, &kd);
        KVD_CALL_OK(kvd_cpu_kv_store(&ar, NULL));
        tb_check(&vs);
        tb_check(&vd);
    }
    tb_check(&ks);
    tb_check(&kd);
    tb_check(&dst_i);
    check_counter(&oob, start, expect_oob);
    case_end("oob +%" PRId64, expect_oob);
}
END_TEST

/* ======================================================================== */

START_TEST(test_basics)
{
    char why[256] = "";
    case_begin(0, "basics: probe, ABI version, device");
    KVD_CALL_OK(kvd_cuda_probe(why, sizeof(why)));
    REQUIRE(kvd_kernels_abi_version() == KVD_KERNELS_ABI_VERSION,
            "library ABI %d, header ABI %d", kvd_kernels_abi_version(), KVD_KERNELS_ABI_VERSION);
    int dev = -1, uva = 0;
    CUDA_OK(cudaGetDevice(&dev));
    CUDA_OK(cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, dev));
    REQUIRE(uva, "device %d has no unified addressing: pinned host pools cannot work", dev);
    /* A pinned allocation is usable on the device at the same address. */
    void *h = pinned_alloc(64), *d = NULL;
    CUDA_OK(cudaHostGetDevicePointer(&d, h, 0));
    REQUIRE(d == h, "pinned memory maps to another device address (%p vs %p)", d, h);
    case_end(NULL);
}
END_TEST

static Suite *cuda_suite(void)
{
    Suite *s = suite_create("kernels_cuda");
    struct {
        const char *name;
        const TTest *test;
        int n;
    } cases[] = {
        {"basics", test_basics, 1},
        {"store", test_store, ARRAY_LEN(STORE_CASES)},
        {"fp8", test_fp8, ARRAY_LEN(FP8_CASES)},
        {"fp8_exhaustive", test_fp8_exhaustive, ARRAY_LEN(FP8_EXHAUSTIVE)},
        {"gather", test_gather, ARRAY_LEN(GATHER_CASES)},
        {"transfer", test_transfer, ARRAY_LEN(XFER_CASES)},
        {"transfer_copy_engine", test_transfer_copy_engine, ARRAY_LEN(XFER_CASES)},
        {"transfer_copy_each", test_transfer_copy_each, ARRAY_LEN(XFER_CASES)},
        {"launch", test_launch, 4},
        {"big_pool", test_big_pool, 4},
        {"wide_bounds", test_wide_bounds, 3},
    };
    for (int i = 0; i < ARRAY_LEN(cases); i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_loop_test(tc, cases[i].test, 0, cases[i].n);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    char why[256] = "";
    kvd_status_t st = kvd_cuda_probe(why, sizeof(why));
    if (st != KVD_OK) {
        printf("SKIP: %s (kvd_cuda_probe: KVD_%s)\n", why[0] ? why : kvd_last_error_detail(),
               kvd_err_name(st));
        return 77;
    }
    const char *q = getenv("KVD_TEST_QUICK");
    g_quick = q && q[0] && strcmp(q, "0") != 0;
    const char *ng = getenv("KVD_TEST_NO_GATE");
    g_nogate = ng && ng[0] && strcmp(ng, "0") != 0;
    const char *sd = getenv("KVD_TEST_SEED");
    if (sd && sd[0])
        g_seed_base = strtoull(sd, NULL, 0);
    build_specials();

    struct cudaDeviceProp prop;
    int dev = 0, rt = 0, drv = 0;
    cudaError_t e;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess ||
        (e = cudaRuntimeGetVersion(&rt)) != cudaSuccess ||
        (e = cudaDriverGetVersion(&drv)) != cudaSuccess) {
        printf("CUDA query failed: %s\n", cudaGetErrorString(e));
        return 1;
    }
    printf("check_cuda: device %d %s (sm_%d%d, %d SMs, %.1f GiB), runtime %d, driver %d; "
           "base seed 0x%016" PRIx64 "%s%s; %d specials\n",
           dev, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (1 << 30), rt, drv, g_seed_base,
           g_quick ? "; QUICK" : "", g_nogate ? "; streams not gated" : "", g_nspec);
    fflush(stdout);

    double t0 = now_s();
    SRunner *sr = srunner_create(cuda_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    free(g_track);
    printf("check_cuda: %s in %.1f s\n", failed ? "FAILED" : "all passed", now_s() - t0);
    return failed ? 1 : 0;
}
