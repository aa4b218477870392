/*
 * gen_seeds DIR: writes the seed corpus of fuzz_frames into DIR, made at
 * build time from valid messages (nothing binary is committed).  Each seed
 * is the byte stream of one client session on a fresh daemon: hello, then
 * requests of one operation or a few that go together (a pool made, then
 * stored into, exported, dropped).  Every operation of the protocol is in
 * at least one seed, and a few invalid streams start the fuzzer on the
 * error paths.  Ids: the daemon numbers objects from 1 in a fresh server,
 * as fuzz_frames runs it, so a seed can name the pool it made.
 *
 * Seeds ending in -fd expect the fuzz harness's memfd with their second
 * frame (it attaches one to each of frames 2..4).  Seeds named err-* get
 * an error reply by design (on the cpu backend the fuzzer runs; a
 * shutdown without drain may cancel what has not started); every
 * other one is a valid session, which run.sh replays with
 * KVD_FUZZ_EXPECT_OK=1 (every request one reply, every reply OK).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "wire.h"

static const char *dir;
static uint8_t *buf;
static size_t len, cap;
static uint64_t next_id;

static void put(const void *p, size_t n)
{
    if (len + n > cap) {
        cap = (len + n) * 2;
        buf = realloc(buf, cap);
        if (buf == NULL) {
            perror("realloc");
            exit(1);
        }
    }
    memcpy(buf + len, p, n);
    len += n;
}

static void frame(Kvdock__Request *req)
{
    uint8_t *f;
    size_t n;

    req->id = next_id++;
    if (kvd__frame_pack(&req->base, &f, &n) != KVD_OK) {
        fprintf(stderr, "gen_seeds: cannot pack\n");
        exit(1);
    }
    put(f, n);
    free(f);
}

static void begin(void)
{
    len = 0;
    next_id = 1;
}

static void end(const char *name)
{
    char path[512];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    if (f == NULL || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "gen_seeds: %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

static void hello(uint32_t version)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__Hello h = KVDOCK__HELLO__INIT;

    h.protocol_version = version;
    h.client_name = "fuzz-seed";
    r.op_case = KVDOCK__REQUEST__OP_HELLO;
    r.hello = &h;
    frame(&r);
}

static void ping(const char *payload)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__Ping p = KVDOCK__PING__INIT;

    p.payload.data = (uint8_t *)payload;
    p.payload.len = strlen(payload);
    r.op_case = KVDOCK__REQUEST__OP_PING;
    r.ping = &p;
    frame(&r);
}

static void pool_create(const char *name, uint32_t layers, uint64_t slots, uint64_t slot_bytes,
                        int mla, uint32_t page, int shared)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__PoolCreate pc = KVDOCK__POOL_CREATE__INIT;

    pc.name = (char *)name;
    pc.kind = KVDOCK__MEM_KIND__MEM_HOST;
    pc.num_layers = layers;
    pc.num_slots = slots;
    pc.slot_bytes = slot_bytes;
    pc.mla = mla;
    pc.page_size = page;
    pc.shared = shared;
    r.op_case = KVDOCK__REQUEST__OP_POOL_CREATE;
    r.pool_create = &pc;
    frame(&r);
}

static void pool_export(uint64_t id, const char *name)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__PoolExport pe = KVDOCK__POOL_EXPORT__INIT;

    pe.pool = id;
    pe.name = (char *)name;
    r.op_case = KVDOCK__REQUEST__OP_POOL_EXPORT;
    r.pool_export = &pe;
    frame(&r);
}

static void pool_drop(uint64_t id, const char *name)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__PoolDrop pd = KVDOCK__POOL_DROP__INIT;

    pd.pool = id;
    pd.name = (char *)name;
    r.op_case = KVDOCK__REQUEST__OP_POOL_DROP;
    r.pool_drop = &pd;
    frame(&r);
}

static void simple(int op)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__StatusRequest st = KVDOCK__STATUS_REQUEST__INIT;
    Kvdock__StatsRequest sa = KVDOCK__STATS_REQUEST__INIT;
    Kvdock__PoolList pl = KVDOCK__POOL_LIST__INIT;

    r.op_case = op;
    switch (op) {
    case KVDOCK__REQUEST__OP_STATUS:
        r.status = &st;
        break;
    case KVDOCK__REQUEST__OP_STATS:
        r.stats = &sa;
        break;
    case KVDOCK__REQUEST__OP_POOL_LIST:
        r.pool_list = &pl;
        break;
    default:
        break;
    }
    frame(&r);
}

static void buffer_register(uint64_t bytes)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__BufferRegister br = KVDOCK__BUFFER_REGISTER__INIT;

    br.bytes = bytes;
    br.kind = KVDOCK__MEM_KIND__MEM_HOST;
    br.name = "seed-buffer";
    r.op_case = KVDOCK__REQUEST__OP_BUFFER_REGISTER;
    r.buffer_register = &br;
    frame(&r);
}

static void buffer_drop(uint64_t id)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__BufferDrop bd = KVDOCK__BUFFER_DROP__INIT;

    bd.buffer = id;
    r.op_case = KVDOCK__REQUEST__OP_BUFFER_DROP;
    r.buffer_drop = &bd;
    frame(&r);
}

static void store_inline(uint64_t pool, uint32_t layer, int mla, uint64_t slot_bytes)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__Store s = KVDOCK__STORE__INIT;
    Kvdock__Indices loc = KVDOCK__INDICES__INIT;
    Kvdock__Data k = KVDOCK__DATA__INIT, v = KVDOCK__DATA__INIT;
    int64_t slots[4] = {3, 0, 7, -1};
    static uint8_t kb[4 * 256], vb[4 * 256];
    size_t i;

    for (i = 0; i < sizeof(kb); i++) {
        kb[i] = (uint8_t)(i * 7 + 1);
        vb[i] = (uint8_t)(i * 13 + 5);
    }
    loc.values = slots;
    loc.n_values = 4;
    k.inline_.data = kb;
    k.inline_.len = 4 * slot_bytes;
    v.inline_.data = vb;
    v.inline_.len = 4 * slot_bytes;
    s.pool = pool;
    s.layer = layer;
    s.loc = &loc;
    s.k = &k;
    s.v = mla ? NULL : &v;
    r.op_case = KVDOCK__REQUEST__OP_STORE;
    r.store = &s;
    frame(&r);
}

/* Store with the indices and the rows in registered buffer 2 (the pool is 1). */
static void store_buffers(uint64_t slot_bytes)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__Store s = KVDOCK__STORE__INIT;
    Kvdock__Indices loc = KVDOCK__INDICES__INIT;
    Kvdock__BufRef lref = KVDOCK__BUF_REF__INIT, kref = KVDOCK__BUF_REF__INIT,
                   vref = KVDOCK__BUF_REF__INIT;
    Kvdock__Data k = KVDOCK__DATA__INIT, v = KVDOCK__DATA__INIT;
    Kvdock__Sync sync = KVDOCK__SYNC__INIT;

    lref.buffer = 2;
    lref.offset = 0;
    lref.bytes = 4 * sizeof(int32_t);
    loc.buffer = &lref;
    loc.dtype = KVDOCK__DTYPE__I32;
    loc.count = 4;
    kref.buffer = 2;
    kref.offset = 64;
    kref.bytes = 4 * slot_bytes;
    vref.buffer = 2;
    vref.offset = 64 + 4 * slot_bytes;
    vref.bytes = 4 * slot_bytes;
    k.buffer = &kref;
    v.buffer = &vref;
    s.pool = 1;
    s.layer = 0;
    s.loc = &loc;
    s.k = &k;
    s.v = &v;
    sync.stream = KVDOCK__STREAM_CLASS__STREAM_WRITE;
    r.sync = &sync;
    r.op_case = KVDOCK__REQUEST__OP_STORE;
    r.store = &s;
    frame(&r);
}

static void fp8_set(uint64_t pool, int src_dtype, int cache_dtype, int scale_mode)
{
    enum { T = 3, H = 2, D = 8 };
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__Fp8Set f = KVDOCK__FP8_SET__INIT;
    Kvdock__Indices loc = KVDOCK__INDICES__INIT;
    Kvdock__Data k = KVDOCK__DATA__INIT, v = KVDOCK__DATA__INIT;
    int64_t slots[T] = {1, 4, 2};
    static float kf[T * H * D], vf[T * H * D];
    float ks[H] = {0.5f, 2.0f}, vs[H] = {1.0f, 0.25f};
    size_t esize = src_dtype == KVDOCK__DTYPE__F32 ? 4 : 2, i;

    for (i = 0; i < T * H * D; i++) {
        kf[i] = (float)i * 0.37f - 3.0f;
        vf[i] = 100.0f - (float)i * 1.5f;
    }
    loc.values = slots;
    loc.n_values = T;
    k.inline_.data = (uint8_t *)kf;
    k.inline_.len = T * H * D * esize;
    v.inline_.data = (uint8_t *)vf;
    v.inline_.len = T * H * D * esize;
    f.pool = pool;
    f.layer = 0;
    f.loc = &loc;
    f.k = &k;
    f.v = &v;
    f.src_dtype = src_dtype;
    f.cache_dtype = cache_dtype;
    f.num_heads = H;
    f.head_dim = D;
    f.scale_mode = scale_mode;
    f.k_scale = 0.5f;
    f.v_scale = 2.0f;
    if (scale_mode == KVDOCK__SCALE_MODE__SCALE_PER_HEAD) {
        f.k_head_scales = ks;
        f.n_k_head_scales = H;
        f.v_head_scales = vs;
        f.n_v_head_scales = H;
    }
    r.op_case = KVDOCK__REQUEST__OP_FP8_SET;
    r.fp8_set = &f;
    frame(&r);
}

/* Gather from the table in buffer 1 (4 rows x 8 cols of I32) into buffer 2. */
static void gather(int inline_indices)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__PageTableGather g = KVDOCK__PAGE_TABLE_GATHER__INIT;
    Kvdock__BufRef table = KVDOCK__BUF_REF__INIT, out = KVDOCK__BUF_REF__INIT,
                   rref = KVDOCK__BUF_REF__INIT;
    Kvdock__Indices rows = KVDOCK__INDICES__INIT, lens = KVDOCK__INDICES__INIT;
    int64_t rv[2] = {2, 0}, lv[2] = {5, 17};

    table.buffer = 1;
    table.bytes = 4 * 8 * 4;
    out.buffer = 2;
    out.bytes = 2 * 8 * 4;
    if (inline_indices) {
        rows.values = rv;
        rows.n_values = 2;
    } else {
        rref.buffer = 2;
        rref.offset = 256;
        rref.bytes = 2 * 8;
        rows.buffer = &rref;
        rows.dtype = KVDOCK__DTYPE__I64;
        rows.count = 2;
    }
    lens.values = lv;
    lens.n_values = 2;
    g.req_to_page = &table;
    g.table_dtype = KVDOCK__DTYPE__I32;
    g.table_rows = 4;
    g.table_cols = 8;
    g.req_pool_indices = &rows;
    g.seq_lens = &lens;
    g.out = &out;
    g.max_num_pages = 8;
    g.page_size = 4;
    g.dummy_slot = -1;
    r.op_case = KVDOCK__REQUEST__OP_GATHER;
    r.gather = &g;
    frame(&r);
}

static void transfer(uint64_t src, uint64_t dst, int all_layers, uint32_t begin, uint32_t count,
                     int stream)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__Indices si = KVDOCK__INDICES__INIT, di = KVDOCK__INDICES__INIT;
    Kvdock__Sync sync = KVDOCK__SYNC__INIT;
    int64_t s[5] = {0, 1, 2, 9, -1}, d[5] = {5, 6, 7, 0, 3};

    si.values = s;
    si.n_values = 5;
    di.values = d;
    di.n_values = 5;
    t.src_pool = src;
    t.dst_pool = dst;
    t.src = &si;
    t.dst = &di;
    t.all_layers = all_layers;
    t.layer_begin = begin;
    t.layer_count = count;
    if (stream) {
        sync.stream = stream;
        r.sync = &sync;
    }
    r.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    r.transfer = &t;
    frame(&r);
}

/* Indices as raw bytes: I32 on the source side (the daemon widens it to
 * pair with the I64 destination). */
static void transfer_raw(uint64_t src, uint64_t dst)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__Indices si = KVDOCK__INDICES__INIT, di = KVDOCK__INDICES__INIT;
    int32_t s[4] = {3, 0, -1, 7};
    int64_t d[4] = {1, 2, 3, 4};

    si.raw.data = (uint8_t *)s;
    si.raw.len = sizeof(s);
    si.dtype = KVDOCK__DTYPE__I32;
    di.raw.data = (uint8_t *)d;
    di.raw.len = sizeof(d);
    di.dtype = KVDOCK__DTYPE__I64;
    t.src_pool = src;
    t.dst_pool = dst;
    t.src = &si;
    t.dst = &di;
    t.all_layers = 1;
    r.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    r.transfer = &t;
    frame(&r);
}

static void pool_import(void)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__PoolImport pi = KVDOCK__POOL_IMPORT__INIT;
    Kvdock__ImportRegion reg = KVDOCK__IMPORT_REGION__INIT, *regs[1] = {&reg};
    Kvdock__MemRef k0 = KVDOCK__MEM_REF__INIT, k1 = KVDOCK__MEM_REF__INIT,
                   v0 = KVDOCK__MEM_REF__INIT, v1 = KVDOCK__MEM_REF__INIT;
    Kvdock__MemRef *ks[2] = {&k0, &k1}, *vs[2] = {&v0, &v1};

    reg.kind = KVDOCK__MEM_KIND__MEM_HOST;
    reg.fd_index = 0;
    reg.bytes = 64 << 10;
    k0.offset = 0;
    v0.offset = 4096;
    k1.offset = 8192;
    v1.offset = 12288;
    pi.name = "imported";
    pi.num_layers = 2;
    pi.num_slots = 32;
    pi.slot_bytes = 64;
    pi.slot_stride = 128;
    pi.regions = regs;
    pi.n_regions = 1;
    pi.k_layers = ks;
    pi.n_k_layers = 2;
    pi.v_layers = vs;
    pi.n_v_layers = 2;
    r.op_case = KVDOCK__REQUEST__OP_POOL_IMPORT;
    r.pool_import = &pi;
    frame(&r);
}

static void event_ops(void)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__EventRegister er = KVDOCK__EVENT_REGISTER__INIT;
    Kvdock__EventDrop ed = KVDOCK__EVENT_DROP__INIT;
    static uint8_t handle[64];

    er.cuda_ipc_event_handle.data = handle;
    er.cuda_ipc_event_handle.len = sizeof(handle);
    r.op_case = KVDOCK__REQUEST__OP_EVENT_REGISTER;
    r.event_register = &er;
    frame(&r);
    kvdock__request__init(&r);
    ed.event = 1;
    r.op_case = KVDOCK__REQUEST__OP_EVENT_DROP;
    r.event_drop = &ed;
    frame(&r);
}

/* Where n bytes at p first occur in the session so far (they must). */
static size_t where(const void *p, size_t n)
{
    for (size_t i = 0; i + n <= len; i++)
        if (memcmp(buf + i, p, n) == 0)
            return i;
    fprintf(stderr, "gen_seeds: bytes not in the session\n");
    exit(1);
}

/* The cache tier: a cache of the pool's layout (2 layers, pages of 4
 * slots of 32 bytes), a save, a lookup with a lease, loads by keys and by
 * the lease, another lease released, a key area with a lookup, a load and
 * an eviction through it, figures, a list, a drop (ids as the first
 * session of a fresh daemon gets them).  fuzz_frames fills a key area
 * with the session's own bytes, repeated: the area's chain is the saved
 * blob, named where it stands in the save's frame. */
static void cache_ops(void)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__CacheCreate cc = KVDOCK__CACHE_CREATE__INIT;
    Kvdock__CacheLayout cl = KVDOCK__CACHE_LAYOUT__INIT;
    Kvdock__CacheKeys keys = KVDOCK__CACHE_KEYS__INIT;
    Kvdock__CacheSave sv = KVDOCK__CACHE_SAVE__INIT;
    Kvdock__CacheLookup lk = KVDOCK__CACHE_LOOKUP__INIT;
    Kvdock__CacheLoad ld = KVDOCK__CACHE_LOAD__INIT;
    Kvdock__CacheEvict ev = KVDOCK__CACHE_EVICT__INIT;
    Kvdock__CacheStats cs = KVDOCK__CACHE_STATS__INIT;
    Kvdock__CacheRelease rl = KVDOCK__CACHE_RELEASE__INIT;
    Kvdock__CacheList list = KVDOCK__CACHE_LIST__INIT;
    Kvdock__CacheDrop cd = KVDOCK__CACHE_DROP__INIT;
    Kvdock__CacheKeyArea ka = KVDOCK__CACHE_KEY_AREA__INIT;
    Kvdock__CacheKeys akeys = KVDOCK__CACHE_KEYS__INIT;
    Kvdock__KeyAreaRef ref = KVDOCK__KEY_AREA_REF__INIT;
    Kvdock__Indices pages = KVDOCK__INDICES__INIT, back = KVDOCK__INDICES__INIT;
    static uint8_t blob[3 * 16] = "chain-key-0000aa" "chain-key-0001bb" "chain-key-0002cc";
    int64_t p[3] = {0, 1, 2}, q[3] = {5, 6, 7};

    cl.num_layers = 2;
    cl.tokens_per_block = 4;
    cl.token_bytes = 32;
    cl.dtype = "bf16";
    cc.name = "seedcache";
    cc.layout = &cl;
    cc.budget_bytes = 64 << 10;
    cc.shared = 1;
    r.op_case = KVDOCK__REQUEST__OP_CACHE_CREATE;
    r.cache_create = &cc;
    frame(&r);
    keys.blob.data = blob;
    keys.blob.len = sizeof(blob);
    keys.key_size = 16;
    pages.n_values = 3;
    pages.values = p;
    back.n_values = 3;
    back.values = q;
    sv.cache = 1;
    sv.pool = 1;
    sv.keys = &keys;
    sv.blocks = &pages;
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_SAVE;
    r.cache_save = &sv;
    frame(&r);
    lk.cache = 1;
    lk.keys = &keys;
    lk.lease = 1;
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_LOOKUP;
    r.cache_lookup = &lk;
    frame(&r);
    ld.cache = 1;
    ld.pool = 1;
    ld.keys = &keys;
    ld.blocks = &back;
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_LOAD;
    r.cache_load = &ld;
    frame(&r);
    ld.keys = NULL;
    ld.lease = 1; /* the load ends it */
    frame(&r);
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_LOOKUP;
    r.cache_lookup = &lk;
    frame(&r);
    rl.lease = 2;
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_RELEASE;
    r.cache_release = &rl;
    frame(&r);
    /* a key area, and a lookup, a load and an eviction of the saved
     * chain in it (fuzz_frames fills the area with this session) */
    ka.bytes = 4096;
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_KEY_AREA;
    r.cache_key_area = &ka;
    frame(&r);
    ref.offset = where(blob, sizeof(blob));
    ref.count = 3;
    akeys.area = &ref;
    akeys.key_size = 16;
    lk.keys = &akeys;
    lk.lease = 0;
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_LOOKUP;
    r.cache_lookup = &lk;
    frame(&r);
    ld.keys = &akeys;
    ld.lease = 0;
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_LOAD;
    r.cache_load = &ld;
    frame(&r);
    lk.keys = &keys;
    ev.cache = 1;
    ev.keys = &akeys;
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_EVICT;
    r.cache_evict = &ev;
    frame(&r);
    cs.name = "seedcache";
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_STATS;
    r.cache_stats = &cs;
    frame(&r);
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_LIST;
    r.cache_list = &list;
    frame(&r);
    cd.cache = 1;
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_DROP;
    r.cache_drop = &cd;
    frame(&r);
}

/* A key area's bad requests, each refused: a reference before the area,
 * sizes out of bounds, a second area, references past the end (an offset
 * near 2^64 among them), a count of 0, a width past 64, more keys than a
 * chain may have; then a lookup of the area's first bytes (the session's
 * own), whatever they hold. */
static void key_area_refs(void)
{
    static const struct {
        uint64_t offset;
        uint32_t count, key_size;
    } bad[] = {{4090, 1, 16}, {UINT64_MAX - 8, 1, 16}, {0, 0, 16}, {0, 1, 65},
               {0, 65537, 1}, {4096, 1, 1}, {0, 257, 16}};
    static const uint64_t sizes[] = {1, 4095, (4u << 20) + 1, 4096, 4096};
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__CacheCreate cc = KVDOCK__CACHE_CREATE__INIT;
    Kvdock__CacheLayout cl = KVDOCK__CACHE_LAYOUT__INIT;
    Kvdock__CacheLookup lk = KVDOCK__CACHE_LOOKUP__INIT;
    Kvdock__CacheKeyArea ka = KVDOCK__CACHE_KEY_AREA__INIT;
    Kvdock__CacheKeys akeys = KVDOCK__CACHE_KEYS__INIT;
    Kvdock__KeyAreaRef ref = KVDOCK__KEY_AREA_REF__INIT;

    cl.num_layers = 2;
    cl.tokens_per_block = 4;
    cl.token_bytes = 32;
    cl.dtype = "bf16";
    cc.name = "areacache";
    cc.layout = &cl;
    cc.budget_bytes = 64 << 10;
    r.op_case = KVDOCK__REQUEST__OP_CACHE_CREATE;
    r.cache_create = &cc;
    frame(&r);
    akeys.area = &ref;
    akeys.key_size = 16;
    ref.count = 1;
    lk.cache = 1;
    lk.keys = &akeys;
    kvdock__request__init(&r);
    r.op_case = KVDOCK__REQUEST__OP_CACHE_LOOKUP;
    r.cache_lookup = &lk;
    frame(&r); /* no area yet */
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        ka.bytes = sizes[i];
        kvdock__request__init(&r);
        r.op_case = KVDOCK__REQUEST__OP_CACHE_KEY_AREA;
        r.cache_key_area = &ka;
        frame(&r);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ref.offset = bad[i].offset;
        ref.count = bad[i].count;
        akeys.key_size = bad[i].key_size;
        kvdock__request__init(&r);
        r.op_case = KVDOCK__REQUEST__OP_CACHE_LOOKUP;
        r.cache_lookup = &lk;
        frame(&r);
    }
    ref.offset = 0;
    ref.count = 8;
    akeys.key_size = 8;
    frame(&r);
}

static void shutdown_op(int drain)
{
    Kvdock__Request r = KVDOCK__REQUEST__INIT;
    Kvdock__Shutdown sd = KVDOCK__SHUTDOWN__INIT;

    sd.drain = drain;
    r.op_case = KVDOCK__REQUEST__OP_SHUTDOWN;
    r.shutdown = &sd;
    frame(&r);
}

int main(int argc, char **argv)
{
    static const uint8_t garbage[] = {0x05, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t too_big[] = {0xff, 0xff, 0xff, 0x7f, 0x08, 0x01};

    if (argc != 2) {
        fprintf(stderr, "usage: gen_seeds DIR\n");
        return 2;
    }
    dir = argv[1];
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "gen_seeds: %s: %s\n", dir, strerror(errno));
        return 1;
    }

    begin(); hello(KVD_PROTOCOL_VERSION); end("hello");
    begin(); hello(KVD_PROTOCOL_VERSION); ping("fuzz"); ping(""); end("ping");
    begin(); hello(KVD_PROTOCOL_VERSION); simple(KVDOCK__REQUEST__OP_STATUS);
    simple(KVDOCK__REQUEST__OP_STATS); end("status-stats");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("p", 2, 64, 32, 0, 0, 0);
    simple(KVDOCK__REQUEST__OP_POOL_LIST); pool_export(1, ""); pool_drop(1, ""); end("pool");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("mla", 3, 128, 16, 1, 16, 1);
    pool_export(0, "mla"); simple(KVDOCK__REQUEST__OP_POOL_LIST); pool_drop(0, "mla");
    end("pool-mla-paged-shared");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_import(); simple(KVDOCK__REQUEST__OP_POOL_LIST);
    store_inline(1, 1, 0, 64); transfer(1, 1, 1, 0, 0, 0); pool_drop(1, "");
    end("pool-import-fd");
    begin(); hello(KVD_PROTOCOL_VERSION); buffer_register(4096); buffer_drop(1);
    end("buffer");
    begin(); hello(KVD_PROTOCOL_VERSION); event_ops(); end("err-event-cpu");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("s", 2, 16, 64, 0, 0, 0);
    store_inline(1, 1, 0, 64); store_inline(1, 0, 0, 64); end("store-inline");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("m", 1, 16, 48, 1, 0, 0);
    store_inline(1, 0, 1, 48); end("store-mla");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("s", 1, 16, 64, 0, 0, 0);
    buffer_register(4096); store_buffers(64); end("store-buffers");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("f", 1, 8, 16, 0, 0, 0);
    fp8_set(1, KVDOCK__DTYPE__F32, KVDOCK__DTYPE__E4M3, KVDOCK__SCALE_MODE__SCALE_TENSOR);
    fp8_set(1, KVDOCK__DTYPE__F32, KVDOCK__DTYPE__E5M2, KVDOCK__SCALE_MODE__SCALE_NONE);
    end("fp8-f32");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("f", 1, 8, 16, 0, 0, 0);
    fp8_set(1, KVDOCK__DTYPE__F16, KVDOCK__DTYPE__E4M3, KVDOCK__SCALE_MODE__SCALE_PER_HEAD);
    fp8_set(1, KVDOCK__DTYPE__BF16, KVDOCK__DTYPE__E4M3, KVDOCK__SCALE_MODE__SCALE_NONE);
    end("fp8-half");
    begin(); hello(KVD_PROTOCOL_VERSION); buffer_register(4096); buffer_register(4096);
    gather(1); gather(0); end("gather");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("a", 4, 16, 32, 0, 0, 0);
    pool_create("b", 4, 16, 32, 0, 0, 0); transfer(1, 2, 0, 2, 0, 0);
    transfer(1, 2, 0, 1, 2, KVDOCK__STREAM_CLASS__STREAM_OFFLOAD);
    transfer(2, 1, 1, 0, 0, KVDOCK__STREAM_CLASS__STREAM_D2D);
    transfer_raw(1, 2); end("transfer");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("a", 2, 16, 32, 1, 0, 0);
    pool_create("b", 2, 16, 32, 1, 0, 0); transfer(1, 2, 1, 0, 0, 0); end("transfer-mla");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("c", 2, 64, 32, 0, 4, 0); cache_ops();
    end("cache");
    begin(); hello(KVD_PROTOCOL_VERSION); key_area_refs(); end("err-key-area-refs");
    begin(); hello(KVD_PROTOCOL_VERSION); shutdown_op(1); end("shutdown");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("a", 1, 16384, 256, 0, 0, 0);
    pool_create("b", 1, 16384, 256, 0, 0, 0); transfer(1, 2, 0, 0, 0, 0); shutdown_op(0);
    end("err-shutdown-no-drain");
    begin(); hello(KVD_PROTOCOL_VERSION + 1); ping("x"); end("err-bad-version");
    begin(); ping("no hello"); end("err-no-hello");
    begin(); hello(KVD_PROTOCOL_VERSION); put(garbage, sizeof(garbage)); end("err-garbage");
    begin(); hello(KVD_PROTOCOL_VERSION); put(too_big, sizeof(too_big)); end("err-too-big");

    /* Regressions: inputs that once crashed the daemon. */
    /* A shared pool outlives its creator; the daemon then shut down and
     * destroyed its backend before releasing the pool: use after free in
     * kvd__registry_deinit (found by fuzz_frames; fixed in server.c). */
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("mla", 3, 128, 16, 1, 16, 1);
    end("regress-shared-pool-outlives-backend");
    begin(); hello(KVD_PROTOCOL_VERSION); pool_create("kept", 1, 16, 16, 0, 0, 1);
    shutdown_op(1); end("regress-shared-pool-at-shutdown");
    /* A lookup of 349,000 one-byte keys in a frame just under the
     * target's 1 MiB: refused from the wire (ELIMIT), so it is named err-;
     * decoded whole, it would take an 8 MiB scan slab, past the replay's
     * -malloc_limit_mb=4. */
    begin(); hello(KVD_PROTOCOL_VERSION);
    {
        static const uint8_t head[] = {0x08, 0x02, 0x82, 0x04}; /* id 2; cache_lookup */
        uint32_t n = 349000, body = 8 + 3 * n, req, flen;
        uint8_t v[5];
        int k = 0;

        req = (uint32_t)sizeof(head) + 5 + body;
        flen = req;
        put(&flen, 4); /* little-endian hosts (x86-64, aarch64) */
        put(head, sizeof(head));
        for (uint32_t x = body + 0; k < 4; k++, x >>= 7) /* padded varints: fixed sizes */
            v[k] = (uint8_t)(0x80 | (x & 0x7f));
        v[4] = (uint8_t)((body >> 28) & 0x7f);
        put(v, 5);
        put((const uint8_t[]){0x08, 0x01}, 2); /* cache 1 */
        put((const uint8_t[]){0x12}, 1);       /* keys */
        for (k = 0; k < 4; k++)
            v[k] = (uint8_t)(0x80 | (((3 * n) >> (7 * k)) & 0x7f));
        v[4] = (uint8_t)(((3 * n) >> 28) & 0x7f);
        put(v, 5);
        for (uint32_t i = 0; i < n; i++)
            put((const uint8_t[]){0x0a, 0x01, (uint8_t)i}, 3);
    }
    end("err-regress-many-one-byte-keys");
    free(buf);
    return 0;
}
