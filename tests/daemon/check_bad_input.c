/*
 * check_bad_input: ONE table of invalid and malformed inputs, each with the
 * exact status code it must get from the real kvdockd (cpu backend).
 *
 * Every row runs against the same daemon, one after another:
 * - a malformed frame (truncated, oversized, garbage, not a Request) closes
 *   that connection only: the row's own connection is closed, a bystander
 *   keeps working;
 * - every other bad request gets its error (and a message), and the same
 *   connection goes on: a ping and a valid store work on it right after;
 * - nothing a row sends changes a byte of the pools it names (checksums);
 * - descriptors that came with a refused frame are closed (the daemon's
 *   descriptor count is back where it was at the end), and the daemon
 *   exits cleanly (the sanitizer build reports leaks at that exit).
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define NO_REPLY (-1)

enum where {
    ON_OWNER = 0,  /* the connection that owns the pools */
    ON_FRESH = 1,  /* a new connection, no hello yet */
    ON_HELLOD = 2, /* a new connection after hello */
};

/* The objects the rows name. */
typedef struct ctx {
    kvdt_daemon_t d;
    int c; /* owner */
    int y; /* bystander */
    uint64_t mha, mla, q16, three, ok, dropped_pool, dropped_buf, buf;
    uint8_t *bmap;
    uint8_t *map[4];
    size_t map_len[4];
} ctx_t;

/* Scratch messages of one row. */
typedef struct m {
    Kvdock__Request req;
    Kvdock__Sync sync;
    Kvdock__Hello hello;
    Kvdock__Ping ping;
    Kvdock__StatusRequest status;
    Kvdock__PoolCreate pc;
    Kvdock__PoolExport pe;
    Kvdock__PoolImport pi;
    Kvdock__ImportRegion reg[2];
    Kvdock__ImportRegion *regs[2];
    Kvdock__MemRef mr[4];
    Kvdock__MemRef *kl[2], *vl[2];
    Kvdock__PoolDrop pd;
    Kvdock__BufferRegister br;
    Kvdock__BufferDrop bd;
    Kvdock__EventRegister er;
    Kvdock__EventDrop ed;
    Kvdock__Store st;
    Kvdock__Fp8Set f8;
    Kvdock__PageTableGather g;
    Kvdock__Transfer t;
    Kvdock__Indices i1, i2, i3;
    Kvdock__Data d1, d2;
    Kvdock__BufRef r1, r2, r3;
    int64_t v[600];
    int64_t w[8];
    uint8_t bytes[512];
    float fl[2 * 2 * 16];
    float scales[4];
    uint8_t raw[256];
    size_t raw_len;
    int is_raw;
    uint64_t raw_id; /* the id the reply to a raw frame carries */
    int hang_up;     /* the client closes right after sending */
    int fds[24];
    int nfds;
    char name[80];
} m_t;

typedef struct row {
    const char *name;
    void (*build)(ctx_t *x, m_t *m);
    int want;
    int where;
    int closes;
} row_t;

/* ---- base requests ------------------------------------------------------ */

static void m_init(m_t *m)
{
    int i;

    memset(m, 0, sizeof(*m));
    kvdt_req_init(&m->req, 4242);
    kvdock__sync__init(&m->sync);
    kvdock__hello__init(&m->hello);
    kvdock__ping__init(&m->ping);
    kvdock__status_request__init(&m->status);
    kvdock__pool_create__init(&m->pc);
    kvdock__pool_export__init(&m->pe);
    kvdock__pool_import__init(&m->pi);
    for (i = 0; i < 2; i++) {
        kvdock__import_region__init(&m->reg[i]);
        m->regs[i] = &m->reg[i];
    }
    for (i = 0; i < 4; i++)
        kvdock__mem_ref__init(&m->mr[i]);
    m->kl[0] = &m->mr[0];
    m->kl[1] = &m->mr[1];
    m->vl[0] = &m->mr[2];
    m->vl[1] = &m->mr[3];
    kvdock__pool_drop__init(&m->pd);
    kvdock__buffer_register__init(&m->br);
    kvdock__buffer_drop__init(&m->bd);
    kvdock__event_register__init(&m->er);
    kvdock__event_drop__init(&m->ed);
    kvdock__store__init(&m->st);
    kvdock__fp8_set__init(&m->f8);
    kvdock__page_table_gather__init(&m->g);
    kvdock__transfer__init(&m->t);
    kvdock__indices__init(&m->i1);
    kvdock__indices__init(&m->i2);
    kvdock__indices__init(&m->i3);
    kvdock__data__init(&m->d1);
    kvdock__data__init(&m->d2);
    kvdock__buf_ref__init(&m->r1);
    kvdock__buf_ref__init(&m->r2);
    kvdock__buf_ref__init(&m->r3);
    for (i = 0; i < 600; i++)
        m->v[i] = i % 16;
    m->w[0] = 1;
    m->w[1] = 2;
    m->w[2] = 3;
    for (i = 0; i < (int)(sizeof(m->fl) / sizeof(m->fl[0])); i++)
        m->fl[i] = (float)(i % 7) - 3.0f;
    m->scales[0] = m->scales[1] = 1.0f;
}

static void inline_idx(Kvdock__Indices *ix, int64_t *v, size_t n)
{
    ix->values = v;
    ix->n_values = n;
}

/* n little-endian elements of dtype dt, as the raw bytes at p */
static void raw_idx(Kvdock__Indices *ix, void *p, size_t bytes, Kvdock__DType dt)
{
    ix->n_values = 0;
    ix->raw.data = p;
    ix->raw.len = bytes;
    ix->dtype = dt;
}

static void buf_idx(Kvdock__Indices *ix, Kvdock__BufRef *r, uint64_t buf, uint64_t offset,
                    uint64_t count, Kvdock__DType dt)
{
    ix->n_values = 0;
    r->buffer = buf;
    r->offset = offset;
    ix->buffer = r;
    ix->count = count;
    ix->dtype = dt;
}

static void inline_data(Kvdock__Data *d, void *p, size_t n)
{
    d->inline_.data = p;
    d->inline_.len = n;
}

/* store one row of 32 bytes into pool slot 1 (valid for mha) */
static void store_base(ctx_t *x, m_t *m, uint64_t pool)
{
    m->req.op_case = KVDOCK__REQUEST__OP_STORE;
    m->req.store = &m->st;
    m->st.pool = pool;
    inline_idx(&m->i1, &m->w[0], 1);
    m->st.loc = &m->i1;
    inline_data(&m->d1, m->bytes, 32);
    inline_data(&m->d2, m->bytes, 32);
    m->st.k = &m->d1;
    m->st.v = &m->d2;
}

static void transfer_base(m_t *m, uint64_t src, uint64_t dst)
{
    m->req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    m->req.transfer = &m->t;
    m->t.src_pool = src;
    m->t.dst_pool = dst;
    inline_idx(&m->i1, &m->w[0], 1);
    inline_idx(&m->i2, &m->w[1], 1);
    m->t.src = &m->i1;
    m->t.dst = &m->i2;
}

/* 1 token, 2 heads x 16 of f32 into the mha pool (32 fp8 bytes a slot) */
static void fp8_base(ctx_t *x, m_t *m)
{
    m->req.op_case = KVDOCK__REQUEST__OP_FP8_SET;
    m->req.fp8_set = &m->f8;
    m->f8.pool = x->mha;
    inline_idx(&m->i1, &m->w[0], 1);
    m->f8.loc = &m->i1;
    inline_data(&m->d1, m->fl, 2 * 16 * sizeof(float));
    inline_data(&m->d2, m->fl, 2 * 16 * sizeof(float));
    m->f8.k = &m->d1;
    m->f8.v = &m->d2;
    m->f8.src_dtype = KVDOCK__DTYPE__F32;
    m->f8.cache_dtype = KVDOCK__DTYPE__E4M3;
    m->f8.num_heads = 2;
    m->f8.head_dim = 16;
}

/* an I32 table of 4 x 4 at offset 0 of the buffer, out at offset 1024 */
static void gather_base(ctx_t *x, m_t *m)
{
    m->req.op_case = KVDOCK__REQUEST__OP_GATHER;
    m->req.gather = &m->g;
    m->r1.buffer = x->buf;
    m->r2.buffer = x->buf;
    m->r2.offset = 1024;
    m->g.req_to_page = &m->r1;
    m->g.out = &m->r2;
    m->g.table_dtype = KVDOCK__DTYPE__I32;
    m->g.table_rows = 4;
    m->g.table_cols = 4;
    m->g.max_num_pages = 4;
    m->g.page_size = 1;
    inline_idx(&m->i1, &m->w[0], 1);
    inline_idx(&m->i2, &m->w[1], 1);
    m->g.req_pool_indices = &m->i1;
    m->g.seq_lens = &m->i2;
}

static void create_base(m_t *m, const char *name)
{
    m->req.op_case = KVDOCK__REQUEST__OP_POOL_CREATE;
    m->req.pool_create = &m->pc;
    m->pc.name = (char *)name;
    m->pc.kind = KVDOCK__MEM_KIND__MEM_HOST;
    m->pc.num_layers = 1;
    m->pc.num_slots = 4;
    m->pc.slot_bytes = 8;
}

static int sealed_memfd(size_t bytes, int seal)
{
    int fd = memfd_create("kvdt-bad", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)bytes), 0);
    if (seal)
        ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    return fd;
}

/* an MLA pool of 1 layer, 4 slots of 8 bytes in a 4096-byte memfd */
static void import_base(m_t *m, int fd)
{
    m->req.op_case = KVDOCK__REQUEST__OP_POOL_IMPORT;
    m->req.pool_import = &m->pi;
    m->pi.name = "imp";
    m->pi.num_layers = 1;
    m->pi.num_slots = 4;
    m->pi.slot_bytes = 8;
    m->pi.mla = 1;
    m->reg[0].kind = KVDOCK__MEM_KIND__MEM_HOST;
    m->reg[0].fd_index = 0;
    m->reg[0].bytes = 4096;
    m->pi.n_regions = 1;
    m->pi.regions = m->regs;
    m->pi.n_k_layers = 1;
    m->pi.k_layers = m->kl;
    if (fd >= 0)
        m->fds[m->nfds++] = fd;
}

static void raw_u32(m_t *m, uint32_t n)
{
    m->is_raw = 1;
    m->raw[m->raw_len++] = (uint8_t)n;
    m->raw[m->raw_len++] = (uint8_t)(n >> 8);
    m->raw[m->raw_len++] = (uint8_t)(n >> 16);
    m->raw[m->raw_len++] = (uint8_t)(n >> 24);
}

/* A frame holding any message's bytes. */
static void raw_msg(m_t *m, const ProtobufCMessage *msg, size_t cut)
{
    size_t n = protobuf_c_message_get_packed_size(msg);

    ck_assert_uint_le(n + 4, sizeof(m->raw));
    raw_u32(m, (uint32_t)(n - cut));
    protobuf_c_message_pack(msg, m->raw + 4);
    m->raw_len += n - cut;
}

/* The frame of a request, with every byte X of its strings made NUL: a
 * decoder would cut "abXcd" to "ab". */
static void nul_in_strings(m_t *m)
{
    size_t i;

    raw_msg(m, &m->req.base, 0);
    for (i = 4; i < m->raw_len; i++)
        if (m->raw[i] == 'X')
            m->raw[i] = 0;
    m->raw_id = m->req.id;
}
#define B(fn) static void fn(ctx_t *x, m_t *m)

/* ---- frames ------------------------------------------------------------- */

B(f_truncated_payload)
{
    raw_u32(m, 100);
    memset(m->raw + 4, 0x08, 10);
    m->raw_len += 10;
    m->hang_up = 1;
}
B(f_truncated_header)
{
    m->is_raw = 1;
    m->raw[0] = 0x10;
    m->raw[1] = 0x00;
    m->raw_len = 2;
    m->hang_up = 1;
}
B(f_oversized) { raw_u32(m, (64u << 10) + 1); }
B(f_huge_header) { raw_u32(m, 0xffffffffu); }
B(f_garbage)
{
    raw_u32(m, 16);
    memset(m->raw + 4, 0xff, 16);
    m->raw_len += 16;
}
B(f_response_frame)
{
    Kvdock__Response r = KVDOCK__RESPONSE__INIT;

    r.id = 9;
    r.status = 3;
    r.message = "not a request";
    raw_msg(m, &r.base, 0);
}
B(f_wrong_wire_type)
{
    /* Request.id (field 1, a varint) sent length-delimited */
    raw_u32(m, 4);
    m->raw[4] = 0x0a;
    m->raw[5] = 0x02;
    m->raw[6] = 0x01;
    m->raw[7] = 0x02;
    m->raw_len += 4;
}
B(f_cut_submessage)
{
    Kvdock__Request q;
    Kvdock__Ping p = KVDOCK__PING__INIT;

    kvdt_req_init(&q, 3);
    p.payload.data = m->bytes;
    p.payload.len = 100;
    q.op_case = KVDOCK__REQUEST__OP_PING;
    q.ping = &p;
    raw_msg(m, &q.base, 10); /* the frame ends inside the payload */
}
B(f_bad_varint)
{
    /* a varint of 11 bytes */
    raw_u32(m, 12);
    m->raw[4] = 0x08;
    memset(m->raw + 5, 0xff, 11);
    m->raw_len += 12;
}
B(f_empty_frame) { raw_u32(m, 0); }
B(f_unknown_field)
{
    /* id = 7, then field 99 (varint 1): no operation this daemon knows */
    raw_u32(m, 5);
    m->raw[4] = 0x08;
    m->raw[5] = 0x07;
    m->raw[6] = 0x98;
    m->raw[7] = 0x06;
    m->raw[8] = 0x01;
    m->raw_len += 5;
    m->raw_id = 7;
}
B(f_empty_oneof)
{
    m->req.op_case = KVDOCK__REQUEST__OP__NOT_SET; /* id only */
}

/* ---- session ------------------------------------------------------------ */

B(s_wrong_version)
{
    m->req.op_case = KVDOCK__REQUEST__OP_HELLO;
    m->req.hello = &m->hello;
    m->hello.protocol_version = KVD_PROTOCOL_VERSION + 1;
    m->hello.client_name = "future";
}
B(s_version_zero)
{
    s_wrong_version(x, m);
    m->hello.protocol_version = 0;
}
B(s_before_hello)
{
    m->req.op_case = KVDOCK__REQUEST__OP_PING;
    m->req.ping = &m->ping;
}
B(s_pool_before_hello) { create_base(m, "early"); }
B(s_long_name)
{
    memset(m->name, 'n', 70);
    m->name[70] = '\0';
    m->req.op_case = KVDOCK__REQUEST__OP_HELLO;
    m->req.hello = &m->hello;
    m->hello.protocol_version = KVD_PROTOCOL_VERSION;
    m->hello.client_name = m->name;
}
B(s_control_name)
{
    s_long_name(x, m);
    m->hello.client_name = "worker\n0";
}
B(s_nul_name)
{
    s_long_name(x, m);
    m->hello.client_name = "workerX0";
    nul_in_strings(m);
}
B(s_utf8_name)
{
    s_long_name(x, m);
    m->hello.client_name = "worker\xff";
}
B(s_second_hello)
{
    s_wrong_version(x, m);
    m->hello.protocol_version = KVD_PROTOCOL_VERSION;
}
B(s_sync_on_ping)
{
    s_before_hello(x, m);
    m->sync.reply_at_enqueue = 1;
    m->req.sync = &m->sync;
}
B(s_sync_on_status)
{
    m->req.op_case = KVDOCK__REQUEST__OP_STATUS;
    m->req.status = &m->status;
    m->sync.wait_event = 5;
    m->req.sync = &m->sync;
}
B(s_sync_on_pool_create)
{
    create_base(m, "synced");
    m->sync.max_blocks = 4;
    m->req.sync = &m->sync;
}

/* ---- store -------------------------------------------------------------- */

B(st_no_k)
{
    store_base(x, m, x->mha);
    m->st.k = NULL;
}
B(st_no_v)
{
    store_base(x, m, x->mha);
    m->st.v = NULL;
}
B(st_unknown_pool) { store_base(x, m, 987654321); }
B(st_pool_zero) { store_base(x, m, 0); }
B(st_dropped_pool) { store_base(x, m, x->dropped_pool); }
B(st_buffer_as_pool) { store_base(x, m, x->buf); }
B(st_layer)
{
    store_base(x, m, x->mha);
    m->st.layer = 2;
}
B(st_loc_past)
{
    store_base(x, m, x->mha);
    m->w[0] = 16;
}
B(st_loc_huge)
{
    store_base(x, m, x->mha);
    m->w[0] = INT64_MAX;
}
B(st_k_short)
{
    store_base(x, m, x->mha);
    m->d1.inline_.len = 31;
}
B(st_k_long)
{
    store_base(x, m, x->mha);
    m->d1.inline_.len = 33;
}
B(st_no_tokens_with_data)
{
    store_base(x, m, x->mha);
    m->st.loc = NULL;
}
B(st_v_short)
{
    store_base(x, m, x->mha);
    m->d2.inline_.len = 1;
}
B(st_mla_v)
{
    store_base(x, m, x->mla);
}
B(st_k_both)
{
    store_base(x, m, x->mha);
    m->r1.buffer = x->buf;
    m->d1.buffer = &m->r1;
}
B(st_loc_both)
{
    store_base(x, m, x->mha);
    m->r1.buffer = x->buf;
    m->i1.buffer = &m->r1;
    m->i1.dtype = KVDOCK__DTYPE__I64;
    m->i1.count = 1;
}
B(st_stride_small)
{
    store_base(x, m, x->mha);
    m->st.src_stride = 16;
}
B(st_stride_overflow)
{
    store_base(x, m, x->mha);
    inline_idx(&m->i1, &m->w[0], 2);
    m->st.src_stride = UINT64_MAX / 2;
}
B(st_loc_misaligned)
{
    store_base(x, m, x->mha);
    buf_idx(&m->i1, &m->r1, x->buf, 4, 1, KVDOCK__DTYPE__I64);
}
B(st_loc_i32_misaligned)
{
    store_base(x, m, x->mha);
    buf_idx(&m->i1, &m->r1, x->buf, 2, 1, KVDOCK__DTYPE__I32);
}
B(st_loc_dtype)
{
    store_base(x, m, x->mha);
    buf_idx(&m->i1, &m->r1, x->buf, 0, 1, KVDOCK__DTYPE__F32);
}
B(st_loc_count_neg)
{
    store_base(x, m, x->mha);
    buf_idx(&m->i1, &m->r1, x->buf, 0, UINT64_MAX, KVDOCK__DTYPE__I64); /* (uint64)-1 */
}
B(st_loc_count_past)
{
    store_base(x, m, x->mha);
    buf_idx(&m->i1, &m->r1, x->buf, 0, 1000, KVDOCK__DTYPE__I64); /* 8000 of 4096 bytes */
}
B(st_loc_unknown_buf)
{
    store_base(x, m, x->mha);
    buf_idx(&m->i1, &m->r1, 987654321, 0, 1, KVDOCK__DTYPE__I64);
}
B(st_k_past_end)
{
    store_base(x, m, x->mha);
    m->d1.inline_.len = 0;
    m->r1.buffer = x->buf;
    m->r1.offset = 4096 - 16;
    m->d1.buffer = &m->r1;
}
B(st_k_offset_wraps)
{
    st_k_past_end(x, m);
    m->r1.offset = UINT64_MAX - 7;
    m->r1.bytes = 32;
}
B(st_k_bytes_wrap)
{
    st_k_past_end(x, m);
    m->r1.offset = 8;
    m->r1.bytes = UINT64_MAX - 3; /* offset + bytes wraps to 4 */
}
B(st_k_bytes_short)
{
    st_k_past_end(x, m);
    m->r1.offset = 0;
    m->r1.bytes = 16;
}
B(st_k_unknown_buf)
{
    st_k_past_end(x, m);
    m->r1.offset = 0;
    m->r1.buffer = 987654321;
}
B(st_k_dropped_buf)
{
    st_k_past_end(x, m);
    m->r1.offset = 0;
    m->r1.buffer = x->dropped_buf;
}
B(st_k_pool_as_buf)
{
    st_k_past_end(x, m);
    m->r1.offset = 0;
    m->r1.buffer = x->mha;
}
B(st_wait_event)
{
    store_base(x, m, x->mha);
    m->sync.wait_event = 987654321;
    m->req.sync = &m->sync;
}
B(st_record_event)
{
    store_base(x, m, x->mha);
    m->sync.record_event = x->buf; /* a buffer is not an event */
    m->req.sync = &m->sync;
}
B(st_stream)
{
    store_base(x, m, x->mha);
    m->sync.stream = (Kvdock__StreamClass)99;
    m->req.sync = &m->sync;
}
B(st_copy_engine)
{
    store_base(x, m, x->mha);
    m->sync.copy_engine = 1;
    m->req.sync = &m->sync;
}
B(st_path_copy_engine)
{
    st_copy_engine(x, m);
    m->sync.copy_engine = 0;
    m->sync.path = KVDOCK__COPY_PATH__PATH_COPY_ENGINE;
}
B(st_inline_limit)
{
    store_base(x, m, x->mha);
    inline_idx(&m->i1, m->v, 513); /* 4104 bytes > max-inline-bytes 4096 */
}
B(st_raw_partial)
{
    store_base(x, m, x->mha);
    raw_idx(&m->i1, m->w, 7, KVDOCK__DTYPE__I64); /* 7 bytes: no whole I64 */
}
B(st_raw_dtype)
{
    store_base(x, m, x->mha);
    raw_idx(&m->i1, m->w, 4, KVDOCK__DTYPE__F32);
}
B(st_raw_and_values)
{
    store_base(x, m, x->mha);
    m->i1.raw.data = (uint8_t *)&m->w[1];
    m->i1.raw.len = 8;
    m->i1.dtype = KVDOCK__DTYPE__I64;
}
B(st_raw_i32_past)
{
    store_base(x, m, x->mha);
    memcpy(&m->w[4], (int32_t[]){16}, 4); /* slot 16 of 16 */
    raw_idx(&m->i1, &m->w[4], 4, KVDOCK__DTYPE__I32);
}

/* ---- transfer ----------------------------------------------------------- */

B(t_slot_bytes) { transfer_base(m, x->mha, x->q16); }
B(t_mha_mla) { transfer_base(m, x->mha, x->mla); }
B(t_count)
{
    transfer_base(m, x->mha, x->mha);
    inline_idx(&m->i1, &m->w[0], 2);
}
B(t_dtype)
{
    transfer_base(m, x->mha, x->mha);
    buf_idx(&m->i2, &m->r2, x->buf, 0, 1, KVDOCK__DTYPE__I32);
}
B(t_layers_past)
{
    transfer_base(m, x->mha, x->mha);
    m->t.layer_begin = 1;
    m->t.layer_count = 2;
}
B(t_layer_begin_huge)
{
    transfer_base(m, x->mha, x->mha);
    m->t.layer_begin = UINT32_MAX;
    m->t.layer_count = 1;
}
B(t_all_with_range)
{
    transfer_base(m, x->mha, x->mha);
    m->t.all_layers = 1;
    m->t.layer_count = 2;
}
B(t_all_layer_counts)
{
    transfer_base(m, x->mha, x->three);
    m->t.all_layers = 1;
}
B(t_dst_past)
{
    transfer_base(m, x->mha, x->mha);
    m->w[1] = 16;
}
B(t_unknown_src) { transfer_base(m, 987654321, x->mha); }
B(t_dropped_dst) { transfer_base(m, x->mha, x->dropped_pool); }

/* ---- fp8 set ------------------------------------------------------------ */

B(f8_cache_f16)
{
    fp8_base(x, m);
    m->f8.cache_dtype = KVDOCK__DTYPE__F16;
}
B(f8_cache_unset)
{
    fp8_base(x, m);
    m->f8.cache_dtype = KVDOCK__DTYPE__U8;
}
B(f8_src_i32)
{
    fp8_base(x, m);
    m->f8.src_dtype = KVDOCK__DTYPE__I32;
}
B(f8_heads_zero)
{
    fp8_base(x, m);
    m->f8.num_heads = 0;
}
B(f8_shape)
{
    fp8_base(x, m);
    m->f8.num_heads = 3;
}
B(f8_scale_zero)
{
    fp8_base(x, m);
    m->f8.scale_mode = KVDOCK__SCALE_MODE__SCALE_TENSOR;
    m->f8.k_scale = 0.0f;
    m->f8.v_scale = 1.0f;
}
B(f8_scale_nan)
{
    f8_scale_zero(x, m);
    m->f8.k_scale = 1.0f;
    m->f8.v_scale = NAN;
}
B(f8_head_scale_zero)
{
    fp8_base(x, m);
    m->f8.scale_mode = KVDOCK__SCALE_MODE__SCALE_PER_HEAD;
    m->scales[2] = 1.0f;
    m->scales[3] = 0.0f;
    m->f8.k_head_scales = &m->scales[2];
    m->f8.n_k_head_scales = 2;
    m->f8.v_head_scales = m->scales; /* 1, 1 */
    m->f8.n_v_head_scales = 2;
}
B(f8_head_scale_nan)
{
    f8_head_scale_zero(x, m);
    m->scales[3] = NAN;
}
B(f8_head_scales)
{
    fp8_base(x, m);
    m->f8.scale_mode = KVDOCK__SCALE_MODE__SCALE_PER_HEAD;
    m->f8.k_head_scales = m->scales;
    m->f8.n_k_head_scales = 1;
    m->f8.v_head_scales = m->scales;
    m->f8.n_v_head_scales = 2;
}
B(f8_scale_mode)
{
    fp8_base(x, m);
    m->f8.scale_mode = (Kvdock__ScaleMode)7;
}
B(f8_k_misaligned)
{
    fp8_base(x, m);
    m->d1.inline_.len = 0;
    m->r1.buffer = x->buf;
    m->r1.offset = 2;
    m->d1.buffer = &m->r1;
}
B(f8_k_length)
{
    fp8_base(x, m);
    m->d1.inline_.len = 100;
}
B(f8_v_long)
{
    fp8_base(x, m);
    m->d2.inline_.len = 132;
}

/* ---- gather ------------------------------------------------------------- */

B(g_page_size)
{
    gather_base(x, m);
    m->g.page_size = 0;
}
B(g_no_table)
{
    gather_base(x, m);
    m->g.req_to_page = NULL;
}
B(g_no_out)
{
    gather_base(x, m);
    m->g.out = NULL;
}
B(g_seq_negative)
{
    gather_base(x, m);
    m->w[1] = -5;
}
B(g_req_past)
{
    gather_base(x, m);
    m->w[0] = 4;
}
B(g_dummy)
{
    gather_base(x, m);
    m->g.dummy_slot = (int64_t)1 << 40;
}
B(g_stride_align)
{
    gather_base(x, m);
    m->g.table_stride = 18;
}
B(g_stride_short)
{
    gather_base(x, m);
    m->g.table_stride = 8;
}
B(g_counts)
{
    gather_base(x, m);
    inline_idx(&m->i2, &m->w[1], 2);
}
B(g_dtype)
{
    gather_base(x, m);
    m->g.table_dtype = KVDOCK__DTYPE__F32;
}
B(g_table_past)
{
    gather_base(x, m);
    m->g.table_rows = 1000;
}
B(g_out_stride_align)
{
    gather_base(x, m);
    m->g.out_stride = 18; /* a whole row of 4 I32 and more, not a multiple of 4 */
}
B(g_out_misaligned)
{
    gather_base(x, m);
    m->r2.offset = 1026;
}
B(g_cols_huge)
{
    gather_base(x, m);
    m->g.table_cols = (uint64_t)1 << 62;
}

/* ---- pools -------------------------------------------------------------- */

B(p_duplicate) { create_base(m, "mha"); }
B(p_bad_name) { create_base(m, "a b"); }
B(p_empty_name) { create_base(m, ""); }
B(p_long_name)
{
    memset(m->name, 'p', 64);
    m->name[64] = '\0';
    create_base(m, m->name);
}
B(p_nul_name)
{
    create_base(m, "abXcd");
    nul_in_strings(m);
}
B(p_layers_zero)
{
    create_base(m, "nolayers");
    m->pc.num_layers = 0;
}
B(p_slot_bytes_zero)
{
    create_base(m, "noslotbytes");
    m->pc.slot_bytes = 0;
}
B(p_kind_unset)
{
    create_base(m, "nokind");
    m->pc.kind = KVDOCK__MEM_KIND__MEM_UNSPECIFIED;
}
B(p_kind_device)
{
    create_base(m, "device");
    m->pc.kind = KVDOCK__MEM_KIND__MEM_DEVICE;
}
B(p_overflow)
{
    create_base(m, "enormous");
    m->pc.num_slots = (uint64_t)1 << 40;
    m->pc.slot_bytes = (uint64_t)1 << 40;
}
B(p_page_size)
{
    create_base(m, "pages");
    m->pc.page_size = 3;
}
B(p_export_nothing)
{
    m->req.op_case = KVDOCK__REQUEST__OP_POOL_EXPORT;
    m->req.pool_export = &m->pe;
}
B(p_export_unknown_name)
{
    p_export_nothing(x, m);
    m->pe.name = "nope";
}
B(p_drop_dropped)
{
    m->req.op_case = KVDOCK__REQUEST__OP_POOL_DROP;
    m->req.pool_drop = &m->pd;
    m->pd.pool = x->dropped_pool;
}
B(p_drop_buffer_id)
{
    p_drop_dropped(x, m);
    m->pd.pool = x->buf;
}

/* ---- import ------------------------------------------------------------- */

B(i_unsealed) { import_base(m, sealed_memfd(4096, 0)); }
B(i_small) { import_base(m, sealed_memfd(1024, 1)); }
B(i_not_memfd)
{
    int p[2];

    ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
    close(p[1]);
    import_base(m, p[0]);
}
B(i_no_fd) { import_base(m, -1); }
B(i_fd_index_past)
{
    import_base(m, sealed_memfd(4096, 1));
    m->reg[0].fd_index = 1;
}
B(i_fd_index_negative)
{
    import_base(m, sealed_memfd(4096, 1));
    m->reg[0].fd_index = -1;
}
B(i_too_many_fds)
{
    int fd = sealed_memfd(4096, 1), i;

    import_base(m, fd);
    for (i = 1; i < 20; i++)
        m->fds[m->nfds++] = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    m->reg[0].fd_index = 17; /* sent, but past the 16 a frame may carry */
}
B(i_layers)
{
    import_base(m, sealed_memfd(4096, 1));
    m->pi.num_layers = 2;
}
B(i_v_for_mla)
{
    import_base(m, sealed_memfd(4096, 1));
    m->pi.n_v_layers = 1;
    m->pi.v_layers = m->vl;
}
B(i_offset_past)
{
    import_base(m, sealed_memfd(4096, 1));
    m->mr[0].offset = 4096 - 16;
}
B(i_offset_wraps)
{
    import_base(m, sealed_memfd(4096, 1));
    m->mr[0].offset = UINT64_MAX - 8;
}
B(i_region_index)
{
    import_base(m, sealed_memfd(4096, 1));
    m->mr[0].region = 5;
}
B(i_no_regions)
{
    import_base(m, sealed_memfd(4096, 1));
    m->pi.n_regions = 0;
}
B(i_duplicate)
{
    import_base(m, sealed_memfd(4096, 1));
    m->pi.name = "mla";
}
B(i_stride)
{
    import_base(m, sealed_memfd(4096, 1));
    m->pi.slot_stride = 4;
}
B(i_stride_huge)
{
    import_base(m, sealed_memfd(4096, 1));
    m->pi.slot_stride = (uint64_t)INT64_MAX + 1;
}
B(i_page_size)
{
    import_base(m, sealed_memfd(4096, 1));
    m->pi.page_size = 3; /* 4 slots */
}
B(i_too_many_regions)
{
    static Kvdock__ImportRegion *many[4097];

    import_base(m, sealed_memfd(4096, 1));
    for (size_t i = 0; i < 4097; i++)
        many[i] = &m->reg[0];
    m->pi.regions = many;
    m->pi.n_regions = 4097;
}
B(i_mixed_kinds)
{
    import_base(m, sealed_memfd(4096, 1));
    m->reg[1].kind = KVDOCK__MEM_KIND__MEM_DEVICE;
    m->reg[1].cuda_ipc_handle.data = m->bytes;
    m->reg[1].cuda_ipc_handle.len = 64;
    m->reg[1].bytes = 4096;
    m->pi.n_regions = 2;
}
B(i_sizes_overflow)
{
    import_base(m, sealed_memfd(4096, 1));
    m->reg[0].bytes = UINT64_MAX / 2 + 1;
    m->reg[1] = m->reg[0];
    m->pi.n_regions = 2;
}
B(i_device_kind)
{
    import_base(m, -1);
    m->reg[0].kind = KVDOCK__MEM_KIND__MEM_DEVICE;
    m->reg[0].cuda_ipc_handle.data = m->bytes;
    m->reg[0].cuda_ipc_handle.len = 64;
}
B(i_handle_length)
{
    i_device_kind(x, m);
    m->reg[0].cuda_ipc_handle.len = 10;
}

/* ---- buffers and events ------------------------------------------------- */

B(b_zero)
{
    m->req.op_case = KVDOCK__REQUEST__OP_BUFFER_REGISTER;
    m->req.buffer_register = &m->br;
    m->br.kind = KVDOCK__MEM_KIND__MEM_HOST;
}
B(b_huge)
{
    b_zero(x, m);
    m->br.bytes = UINT64_MAX;
}
B(b_kind)
{
    b_zero(x, m);
    m->br.bytes = 64;
    m->br.kind = KVDOCK__MEM_KIND__MEM_DEVICE_VMM;
}
B(b_device)
{
    b_zero(x, m);
    m->br.bytes = 64;
    m->br.kind = KVDOCK__MEM_KIND__MEM_DEVICE;
}
B(b_long_name)
{
    b_zero(x, m);
    m->br.bytes = 64;
    memset(m->name, 'b', 70);
    m->name[70] = '\0';
    m->br.name = m->name;
}
B(b_bad_name)
{
    b_zero(x, m);
    m->br.bytes = 64;
    m->br.name = "k v";
}
B(b_nul_name)
{
    b_zero(x, m);
    m->br.bytes = 64;
    m->br.name = "kXv";
    nul_in_strings(m);
}
B(b_drop_dropped)
{
    m->req.op_case = KVDOCK__REQUEST__OP_BUFFER_DROP;
    m->req.buffer_drop = &m->bd;
    m->bd.buffer = x->dropped_buf;
}
B(b_drop_pool_id)
{
    b_drop_dropped(x, m);
    m->bd.buffer = x->mha;
}
B(e_handle_length)
{
    m->req.op_case = KVDOCK__REQUEST__OP_EVENT_REGISTER;
    m->req.event_register = &m->er;
    m->er.cuda_ipc_event_handle.data = m->bytes;
    m->er.cuda_ipc_event_handle.len = 10;
}
B(e_cpu)
{
    e_handle_length(x, m);
    m->er.cuda_ipc_event_handle.len = 64;
}
B(e_drop_unknown)
{
    m->req.op_case = KVDOCK__REQUEST__OP_EVENT_DROP;
    m->req.event_drop = &m->ed;
    m->ed.event = 987654321;
}
B(e_drop_buffer_id)
{
    e_drop_unknown(x, m);
    m->ed.event = x->buf;
}

#define CLOSES 1
static const row_t rows[] = {
    /* frames: the connection closes (or the peer hangs up) */
    {"truncated frame, peer closes mid-payload", f_truncated_payload, NO_REPLY, ON_HELLOD, 0},
    {"truncated header, peer closes", f_truncated_header, NO_REPLY, ON_HELLOD, 0},
    {"oversized frame (max + 1)", f_oversized, KVD_ETOOBIG, ON_HELLOD, CLOSES},
    {"frame length 0xffffffff", f_huge_header, KVD_ETOOBIG, ON_HELLOD, CLOSES},
    {"garbage bytes", f_garbage, KVD_EPROTO, ON_HELLOD, CLOSES},
    {"a Response frame, not a Request", f_response_frame, KVD_EPROTO, ON_HELLOD, CLOSES},
    {"a field with the wrong wire type", f_wrong_wire_type, KVD_EPROTO, ON_HELLOD, CLOSES},
    {"frame ends inside a sub-message", f_cut_submessage, KVD_EPROTO, ON_HELLOD, CLOSES},
    {"a varint of 11 bytes", f_bad_varint, KVD_EPROTO, ON_HELLOD, CLOSES},
    {"garbage before hello", f_garbage, KVD_EPROTO, ON_FRESH, CLOSES},
    /* frames that decode: an error, the connection goes on */
    {"empty frame (no operation)", f_empty_frame, KVD_EUNKNOWNOP, ON_OWNER, 0},
    {"unknown operation (field 99)", f_unknown_field, KVD_EUNKNOWNOP, ON_OWNER, 0},
    {"Request with an empty oneof", f_empty_oneof, KVD_EUNKNOWNOP, ON_OWNER, 0},
    /* session */
    {"wrong protocol version", s_wrong_version, KVD_EVERSION, ON_FRESH, CLOSES},
    {"protocol version 0", s_version_zero, KVD_EVERSION, ON_FRESH, CLOSES},
    {"request before hello", s_before_hello, KVD_EPROTO, ON_FRESH, 0},
    {"pool_create before hello", s_pool_before_hello, KVD_EPROTO, ON_FRESH, 0},
    {"hello with a 70-byte client name", s_long_name, KVD_EINVAL, ON_FRESH, 0},
    {"hello with a newline in the client name", s_control_name, KVD_EINVAL, ON_FRESH, 0},
    {"hello with a NUL byte in the client name", s_nul_name, KVD_EINVAL, ON_FRESH, 0},
    {"hello with a client name that is not UTF-8", s_utf8_name, KVD_EINVAL, ON_FRESH, 0},
    {"second hello", s_second_hello, KVD_EPROTO, ON_OWNER, 0},
    {"Sync on ping", s_sync_on_ping, KVD_EINVAL, ON_OWNER, 0},
    {"Sync on status", s_sync_on_status, KVD_EINVAL, ON_OWNER, 0},
    {"Sync on pool_create", s_sync_on_pool_create, KVD_EINVAL, ON_OWNER, 0},
    /* store */
    {"store without k", st_no_k, KVD_ENULL, ON_OWNER, 0},
    {"store into an MHA pool without v", st_no_v, KVD_ENULL, ON_OWNER, 0},
    {"store into an unknown pool", st_unknown_pool, KVD_ENOENT, ON_OWNER, 0},
    {"store into pool 0", st_pool_zero, KVD_ENOENT, ON_OWNER, 0},
    {"store into a dropped pool", st_dropped_pool, KVD_ENOENT, ON_OWNER, 0},
    {"store naming a buffer id as the pool", st_buffer_as_pool, KVD_ENOENT, ON_OWNER, 0},
    {"store layer past the pool's layers", st_layer, KVD_ERANGE, ON_OWNER, 0},
    {"store loc = num_slots", st_loc_past, KVD_ERANGE, ON_OWNER, 0},
    {"store loc = INT64_MAX", st_loc_huge, KVD_ERANGE, ON_OWNER, 0},
    {"store k inline 31 of 32 bytes", st_k_short, KVD_ESHAPE, ON_OWNER, 0},
    {"store v inline 1 of 32 bytes", st_v_short, KVD_ESHAPE, ON_OWNER, 0},
    {"store k inline 33 bytes for 32", st_k_long, KVD_ESHAPE, ON_OWNER, 0},
    {"store of 0 tokens with 32 bytes of k", st_no_tokens_with_data, KVD_ESHAPE, ON_OWNER, 0},
    {"store v into an MLA pool", st_mla_v, KVD_EINVAL, ON_OWNER, 0},
    {"store k both inline and in a buffer", st_k_both, KVD_EINVAL, ON_OWNER, 0},
    {"store loc both inline and in a buffer", st_loc_both, KVD_EINVAL, ON_OWNER, 0},
    {"store src_stride below slot_bytes", st_stride_small, KVD_EINVAL, ON_OWNER, 0},
    {"store src_stride overflows the extent", st_stride_overflow, KVD_EOVERFLOW, ON_OWNER, 0},
    {"store I64 loc at buffer offset 4", st_loc_misaligned, KVD_EALIGN, ON_OWNER, 0},
    {"store I32 loc at buffer offset 2", st_loc_i32_misaligned, KVD_EALIGN, ON_OWNER, 0},
    {"store loc buffer of dtype F32", st_loc_dtype, KVD_EDTYPE, ON_OWNER, 0},
    {"store loc count (uint64)-1", st_loc_count_neg, KVD_EOVERFLOW, ON_OWNER, 0},
    {"store loc count past the buffer", st_loc_count_past, KVD_ERANGE, ON_OWNER, 0},
    {"store loc in an unknown buffer", st_loc_unknown_buf, KVD_ENOENT, ON_OWNER, 0},
    {"store k range past the buffer's end", st_k_past_end, KVD_ERANGE, ON_OWNER, 0},
    {"store k offset near 2^64", st_k_offset_wraps, KVD_ERANGE, ON_OWNER, 0},
    {"store k offset + bytes wraps 64 bits", st_k_bytes_wrap, KVD_ERANGE, ON_OWNER, 0},
    {"store k BufRef shorter than needed", st_k_bytes_short, KVD_ESHAPE, ON_OWNER, 0},
    {"store k in an unknown buffer", st_k_unknown_buf, KVD_ENOENT, ON_OWNER, 0},
    {"store k in a dropped buffer", st_k_dropped_buf, KVD_ENOENT, ON_OWNER, 0},
    {"store k naming a pool id as the buffer", st_k_pool_as_buf, KVD_ENOENT, ON_OWNER, 0},
    {"store waiting on an unknown event", st_wait_event, KVD_ENOENT, ON_OWNER, 0},
    {"store recording a buffer id as event", st_record_event, KVD_ENOENT, ON_OWNER, 0},
    {"store on stream class 99", st_stream, KVD_EINVAL, ON_OWNER, 0},
    {"store with copy_engine", st_copy_engine, KVD_EINVAL, ON_OWNER, 0},
    {"store with path = PATH_COPY_ENGINE", st_path_copy_engine, KVD_EINVAL, ON_OWNER, 0},
    {"store with 513 inline indices (4 KiB max)", st_inline_limit, KVD_ELIMIT, ON_OWNER, 0},
    {"store loc raw bytes: 7, not whole I64s", st_raw_partial, KVD_ESHAPE, ON_OWNER, 0},
    {"store loc raw bytes of dtype F32", st_raw_dtype, KVD_EDTYPE, ON_OWNER, 0},
    {"store loc both raw bytes and values", st_raw_and_values, KVD_EINVAL, ON_OWNER, 0},
    {"store loc raw I32 index = num_slots", st_raw_i32_past, KVD_ERANGE, ON_OWNER, 0},
    /* transfer */
    {"transfer slot_bytes 32 -> 16", t_slot_bytes, KVD_ESHAPE, ON_OWNER, 0},
    {"transfer MHA -> MLA", t_mha_mla, KVD_ESHAPE, ON_OWNER, 0},
    {"transfer 2 src indices, 1 dst", t_count, KVD_ESHAPE, ON_OWNER, 0},
    {"transfer inline src, I32 buffer dst", t_dtype, KVD_EDTYPE, ON_OWNER, 0},
    {"transfer layers [1, 3) of 2", t_layers_past, KVD_ERANGE, ON_OWNER, 0},
    {"transfer layer_begin UINT32_MAX", t_layer_begin_huge, KVD_ERANGE, ON_OWNER, 0},
    {"all-layer transfer with a layer range", t_all_with_range, KVD_EINVAL, ON_OWNER, 0},
    {"all-layer transfer 2 -> 3 layers", t_all_layer_counts, KVD_ESHAPE, ON_OWNER, 0},
    {"transfer dst index = num_slots", t_dst_past, KVD_ERANGE, ON_OWNER, 0},
    {"transfer from an unknown pool", t_unknown_src, KVD_ENOENT, ON_OWNER, 0},
    {"transfer into a dropped pool", t_dropped_dst, KVD_ENOENT, ON_OWNER, 0},
    /* fp8 set */
    {"fp8 set, cache dtype F16", f8_cache_f16, KVD_EDTYPE, ON_OWNER, 0},
    {"fp8 set, cache dtype unset (U8)", f8_cache_unset, KVD_EDTYPE, ON_OWNER, 0},
    {"fp8 set, source dtype I32", f8_src_i32, KVD_EDTYPE, ON_OWNER, 0},
    {"fp8 set, 0 heads", f8_heads_zero, KVD_EINVAL, ON_OWNER, 0},
    {"fp8 set, heads x dim != slot_bytes", f8_shape, KVD_ESHAPE, ON_OWNER, 0},
    {"fp8 set, k_scale 0", f8_scale_zero, KVD_EINVAL, ON_OWNER, 0},
    {"fp8 set, v_scale NaN", f8_scale_nan, KVD_EINVAL, ON_OWNER, 0},
    {"fp8 set, 1 per-head k scale for 2 heads", f8_head_scales, KVD_ESHAPE, ON_OWNER, 0},
    {"fp8 set, per-head k scale 0", f8_head_scale_zero, KVD_EINVAL, ON_OWNER, 0},
    {"fp8 set, per-head k scale NaN", f8_head_scale_nan, KVD_EINVAL, ON_OWNER, 0},
    {"fp8 set, scale_mode 7", f8_scale_mode, KVD_EINVAL, ON_OWNER, 0},
    {"fp8 set, F32 k at buffer offset 2", f8_k_misaligned, KVD_EALIGN, ON_OWNER, 0},
    {"fp8 set, k inline 100 of 128 bytes", f8_k_length, KVD_ESHAPE, ON_OWNER, 0},
    {"fp8 set, v inline 132 bytes for 128", f8_v_long, KVD_ESHAPE, ON_OWNER, 0},
    /* gather */
    {"gather with page_size 0", g_page_size, KVD_EINVAL, ON_OWNER, 0},
    {"gather out_stride 18 for I32 rows", g_out_stride_align, KVD_EALIGN, ON_OWNER, 0},
    {"gather without req_to_page", g_no_table, KVD_ENULL, ON_OWNER, 0},
    {"gather without out", g_no_out, KVD_ENULL, ON_OWNER, 0},
    {"gather with a negative seq_len", g_seq_negative, KVD_EINVAL, ON_OWNER, 0},
    {"gather req index = table_rows", g_req_past, KVD_ERANGE, ON_OWNER, 0},
    {"gather dummy_slot 2^40 into I32", g_dummy, KVD_ERANGE, ON_OWNER, 0},
    {"gather table_stride 18 for I32", g_stride_align, KVD_EALIGN, ON_OWNER, 0},
    {"gather table_stride below a row", g_stride_short, KVD_EINVAL, ON_OWNER, 0},
    {"gather 1 req index, 2 seq_lens", g_counts, KVD_ESHAPE, ON_OWNER, 0},
    {"gather table dtype F32", g_dtype, KVD_EDTYPE, ON_OWNER, 0},
    {"gather table past the buffer's end", g_table_past, KVD_ERANGE, ON_OWNER, 0},
    {"gather out at offset 1026 (I32)", g_out_misaligned, KVD_EALIGN, ON_OWNER, 0},
    {"gather table_cols 2^62", g_cols_huge, KVD_EOVERFLOW, ON_OWNER, 0},
    /* pools */
    {"pool_create, duplicate name", p_duplicate, KVD_EEXIST, ON_OWNER, 0},
    {"pool_create, name with a space", p_bad_name, KVD_EINVAL, ON_OWNER, 0},
    {"pool_create, empty name", p_empty_name, KVD_EINVAL, ON_OWNER, 0},
    {"pool_create, 64-byte name", p_long_name, KVD_EINVAL, ON_OWNER, 0},
    {"pool_create, name with a NUL byte (ab\\0cd)", p_nul_name, KVD_EINVAL, ON_OWNER, 0},
    {"pool_create, 0 layers", p_layers_zero, KVD_EINVAL, ON_OWNER, 0},
    {"pool_create, slot_bytes 0", p_slot_bytes_zero, KVD_EINVAL, ON_OWNER, 0},
    {"pool_create, kind unset", p_kind_unset, KVD_EINVAL, ON_OWNER, 0},
    {"pool_create, device pool on cpu", p_kind_device, KVD_ENOTSUP, ON_OWNER, 0},
    {"pool_create, size overflows", p_overflow, KVD_EOVERFLOW, ON_OWNER, 0},
    {"pool_create, page_size 3 of 4 slots", p_page_size, KVD_ESHAPE, ON_OWNER, 0},
    {"pool_export naming no pool", p_export_nothing, KVD_EINVAL, ON_OWNER, 0},
    {"pool_export of an unknown name", p_export_unknown_name, KVD_ENOENT, ON_OWNER, 0},
    {"pool_drop of a dropped pool", p_drop_dropped, KVD_ENOENT, ON_OWNER, 0},
    {"pool_drop naming a buffer id", p_drop_buffer_id, KVD_ENOENT, ON_OWNER, 0},
    /* import */
    {"import of an unsealed memfd", i_unsealed, KVD_EPERM, ON_OWNER, 0},
    {"import claiming more than the memfd", i_small, KVD_ERANGE, ON_OWNER, 0},
    {"import of a pipe", i_not_memfd, KVD_EINVAL, ON_OWNER, 0},
    {"import with no descriptor", i_no_fd, KVD_ENULL, ON_OWNER, 0},
    {"import fd_index 1 of 1 descriptor", i_fd_index_past, KVD_ENULL, ON_OWNER, 0},
    {"import fd_index -1", i_fd_index_negative, KVD_ENULL, ON_OWNER, 0},
    {"import with 20 descriptors, fd_index 17", i_too_many_fds, KVD_ENULL, ON_OWNER, 0},
    {"import, 1 k_layer for 2 layers", i_layers, KVD_ESHAPE, ON_OWNER, 0},
    {"import, v_layers for MLA", i_v_for_mla, KVD_ESHAPE, ON_OWNER, 0},
    {"import, layer past the region's end", i_offset_past, KVD_ERANGE, ON_OWNER, 0},
    {"import, layer offset near 2^64", i_offset_wraps, KVD_ERANGE, ON_OWNER, 0},
    {"import, MemRef region 5 of 1", i_region_index, KVD_ERANGE, ON_OWNER, 0},
    {"import, no regions", i_no_regions, KVD_EINVAL, ON_OWNER, 0},
    {"import, duplicate name", i_duplicate, KVD_EEXIST, ON_OWNER, 0},
    {"import, slot_stride below slot_bytes", i_stride, KVD_EINVAL, ON_OWNER, 0},
    {"import, slot_stride past int64", i_stride_huge, KVD_EOVERFLOW, ON_OWNER, 0},
    {"import, page_size 3 for 4 slots", i_page_size, KVD_ESHAPE, ON_OWNER, 0},
    {"import with 4097 regions (4096 max)", i_too_many_regions, KVD_EINVAL, ON_OWNER, 0},
    {"import, a host and a device region", i_mixed_kinds, KVD_EINVAL, ON_OWNER, 0},
    {"import, region sizes past 2^64", i_sizes_overflow, KVD_EOVERFLOW, ON_OWNER, 0},
    {"import of a CUDA handle on cpu", i_device_kind, KVD_ENOTSUP, ON_OWNER, 0},
    {"import, CUDA handle of 10 bytes", i_handle_length, KVD_EINVAL, ON_OWNER, 0},
    /* buffers and events */
    {"buffer_register, 0 bytes", b_zero, KVD_EINVAL, ON_OWNER, 0},
    {"buffer_register, 2^64-1 bytes", b_huge, KVD_EOVERFLOW, ON_OWNER, 0},
    {"buffer_register, kind VMM", b_kind, KVD_EINVAL, ON_OWNER, 0},
    {"buffer_register, device buffer on cpu", b_device, KVD_ENOTSUP, ON_OWNER, 0},
    {"buffer_register, 70-byte name", b_long_name, KVD_EINVAL, ON_OWNER, 0},
    {"buffer_register, name with a space", b_bad_name, KVD_EINVAL, ON_OWNER, 0},
    {"buffer_register, name with a NUL byte", b_nul_name, KVD_EINVAL, ON_OWNER, 0},
    {"buffer_drop of a dropped buffer", b_drop_dropped, KVD_ENOENT, ON_OWNER, 0},
    {"buffer_drop naming a pool id", b_drop_pool_id, KVD_ENOENT, ON_OWNER, 0},
    {"event_register, handle of 10 bytes", e_handle_length, KVD_EINVAL, ON_OWNER, 0},
    {"event_register on cpu", e_cpu, KVD_ENOTSUP, ON_OWNER, 0},
    {"event_drop of an unknown event", e_drop_unknown, KVD_ENOENT, ON_OWNER, 0},
    {"event_drop naming a buffer id", e_drop_buffer_id, KVD_ENOENT, ON_OWNER, 0},
};
#define N_ROWS (sizeof(rows) / sizeof(rows[0]))

/* ---- the runner --------------------------------------------------------- */

static uint64_t checksum(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    size_t i;

    for (i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int count_fds(pid_t pid)
{
    char path[64];
    struct dirent *e;
    DIR *dir;
    int n = 0;

    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    dir = opendir(path);
    if (dir == NULL)
        return -1;
    while ((e = readdir(dir)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(dir);
    return n;
}

static uint64_t pool(int fd, const char *name, uint32_t layers, uint64_t slots,
                     uint64_t slot_bytes, int mla, int shared)
{
    m_t m;
    Kvdock__Response *r;
    uint64_t id;

    m_init(&m);
    create_base(&m, name);
    m.pc.num_layers = layers;
    m.pc.num_slots = slots;
    m.pc.slot_bytes = slot_bytes;
    m.pc.mla = mla;
    m.pc.shared = shared;
    r = kvdt_call(fd, &m.req);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->status == 0, "create %s: %s", name, r->message);
    id = r->pool->id;
    kvdock__response__free_unpacked(r, NULL);
    return id;
}

/* The connection still works: a ping, and a valid store into the shared
 * pool "ok". */
static void assert_works(ctx_t *x, int fd, const char *row, const char *who)
{
    m_t m;
    Kvdock__Response *r;

    m_init(&m);
    m.req.op_case = KVDOCK__REQUEST__OP_PING;
    m.req.ping = &m.ping;
    r = kvdt_call(fd, &m.req);
    ck_assert_msg(r != NULL && r->status == 0, "after '%s': %s cannot ping", row, who);
    kvdock__response__free_unpacked(r, NULL);
    m_init(&m);
    store_base(x, &m, x->ok);
    m.d1.inline_.len = m.d2.inline_.len = 8;
    m.w[0] = 3;
    r = kvdt_call(fd, &m.req);
    ck_assert_msg(r != NULL && r->status == 0, "after '%s': %s cannot store (%s)", row, who,
                  r ? r->message : "no reply");
    kvdock__response__free_unpacked(r, NULL);
}

static void ctx_up(ctx_t *x)
{
    const char *extra[] = {"--max-frame-bytes", "64K", "--max-inline-bytes", "4096", NULL};
    m_t m;
    uint64_t ids[4];
    int i, n;

    memset(x, 0, sizeof(*x));
    kvdt_start(&x->d, extra);
    x->c = kvdt_client(&x->d, "owner");
    x->y = kvdt_client(&x->d, "bystander");
    x->mha = pool(x->c, "mha", 2, 16, 32, 0, 0);
    x->mla = pool(x->c, "mla", 2, 16, 32, 1, 0);
    x->q16 = pool(x->c, "q16", 2, 16, 16, 0, 0);
    x->three = pool(x->c, "three", 3, 16, 32, 0, 0);
    x->ok = pool(x->c, "ok", 1, 4, 8, 0, 1);
    x->dropped_pool = pool(x->c, "gone", 1, 4, 8, 0, 0);
    x->buf = kvdt_buffer_map(x->c, 4096, (void **)&x->bmap);
    x->dropped_buf = kvdt_buffer_map(x->c, 64, (void **)&x->map[3]);
    munmap(x->map[3], 64);
    x->map[3] = NULL;
    /* the buffer: small valid indices everywhere */
    for (i = 0; i < 4096 / 8; i++)
        ((int64_t *)x->bmap)[i] = i % 4;
    m_init(&m);
    p_drop_dropped(x, &m);
    m.pd.pool = x->dropped_pool;
    ck_assert_int_eq(kvdt_status_of(x->c, &m.req), 0);
    m_init(&m);
    b_drop_dropped(x, &m);
    m.bd.buffer = x->dropped_buf;
    ck_assert_int_eq(kvdt_status_of(x->c, &m.req), 0);
    ids[0] = x->mha;
    ids[1] = x->mla;
    ids[2] = x->q16;
    n = 3;
    for (i = 0; i < n; i++) {
        x->map[i] = kvdt_pool_map(x->c, ids[i], NULL, &x->map_len[i]);
        for (size_t k = 0; k < x->map_len[i]; k++)
            x->map[i][k] = (uint8_t)(k * 131 + (size_t)i);
    }
}

/* Send a whole buffer, with up to 24 descriptors on its first byte (more
 * than kvd__sock_send_all allows: the daemon must cope with them). */
static void send_with_fds(int sock, const uint8_t *buf, size_t len, const int *fds, int nfds)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * 24)];
    } ctl;
    struct msghdr mh;
    struct iovec iov;
    ssize_t n;

    ck_assert_int_le(nfds, 24);
    if (nfds <= KVD_MAX_FDS_PER_FRAME) {
        ck_assert_int_eq(kvd__sock_send_all(sock, buf, len, fds, nfds), KVD_OK);
        return;
    }
    memset(&mh, 0, sizeof(mh));
    memset(&ctl, 0, sizeof(ctl));
    iov.iov_base = (void *)buf;
    iov.iov_len = 1;
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    {
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    n = sendmsg(sock, &mh, MSG_NOSIGNAL);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(kvd__sock_send_all(sock, buf + 1, len - 1, NULL, 0), KVD_OK);
}

START_TEST(test_bad_input_table)
{
    ctx_t x;
    uint64_t sums[3];
    size_t i;
    int fds0, fds1 = -1, k, tries;

    ctx_up(&x);
    for (k = 0; k < 3; k++)
        sums[k] = checksum(x.map[k], x.map_len[k]);
    fds0 = count_fds(x.d.pid);
    ck_assert_int_gt(fds0, 0);

    for (i = 0; i < N_ROWS; i++) {
        const row_t *row = &rows[i];
        Kvdock__Response *r;
        m_t m;
        int conn, j;

        conn = row->where == ON_OWNER ? x.c
               : row->where == ON_HELLOD ? kvdt_client(&x.d, "row")
                                         : kvdt_connect(x.d.sock);
        ck_assert_int_ge(conn, 0);
        m_init(&m);
        row->build(&x, &m);
        if (m.is_raw) {
            kvdt_send_raw(conn, m.raw, m.raw_len);
        } else {
            uint8_t *frame;
            size_t len;
            ck_assert_int_eq(kvd__frame_pack(&m.req.base, &frame, &len), KVD_OK);
            send_with_fds(conn, frame, len, m.fds, m.nfds);
            free(frame);
        }
        for (j = 0; j < m.nfds; j++)
            close(m.fds[j]);

        if (row->want == NO_REPLY) {
            ck_assert_msg(m.hang_up, "row '%s'", row->name);
            close(conn);
        } else {
            r = kvdt_recv(conn, NULL, NULL, KVDT_TIMEOUT_MS);
            ck_assert_msg(r != NULL, "row %zu '%s': no reply", i, row->name);
            ck_assert_msg(r->status == (uint32_t)row->want,
                          "row %zu '%s': status %s (%s), want %s", i, row->name,
                          kvd_err_name((int)r->status), r->message, kvd_err_name(row->want));
            ck_assert_msg(r->message != NULL && r->message[0] != '\0',
                          "row '%s': no message", row->name);
            ck_assert_msg(r->id == (m.is_raw ? m.raw_id : m.req.id),
                          "row '%s': reply id %" PRIu64, row->name, r->id);
            if (getenv("KVDT_VERBOSE"))
                fprintf(stderr, "row %3zu %-45s %-10s %s\n", i, row->name,
                        kvd_err_name((int)r->status), r->message);
            kvdock__response__free_unpacked(r, NULL);
            if (row->closes) {
                ck_assert_msg(kvdt_closed(conn, KVDT_TIMEOUT_MS), "row '%s': not closed",
                              row->name);
                close(conn);
            } else {
                if (row->where == ON_FRESH) {
                    /* it had no hello yet (or a refused one): one now */
                    m_t h;
                    m_init(&h);
                    s_second_hello(&x, &h);
                    r = kvdt_call(conn, &h.req);
                    ck_assert_msg(r && r->status == 0, "row '%s': hello after", row->name);
                    kvdock__response__free_unpacked(r, NULL);
                }
                assert_works(&x, conn, row->name, "the same connection");
                if (conn != x.c)
                    close(conn);
            }
        }
        /* the others go on, and no byte of the pools changed */
        assert_works(&x, x.y, row->name, "the bystander");
        assert_works(&x, x.c, row->name, "the owner");
        for (k = 0; k < 3; k++)
            ck_assert_msg(checksum(x.map[k], x.map_len[k]) == sums[k],
                          "row '%s' changed pool %d", row->name, k);
    }
    fprintf(stderr, "bad input: %zu rows, each with its status; the daemon is still up\n",
            (size_t)N_ROWS);

    /* 20 descriptors with a ping: the extras are closed, none leaks */
    {
        m_t m;
        int fd = sealed_memfd(4096, 1), j;
        uint8_t *frame;
        size_t len;
        Kvdock__Response *r;

        m_init(&m);
        s_before_hello(&x, &m);
        for (j = 0; j < 16; j++)
            m.fds[m.nfds++] = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        ck_assert_int_eq(kvd__frame_pack(&m.req.base, &frame, &len), KVD_OK);
        ck_assert_int_eq(kvd__sock_send_all(x.c, frame, len, m.fds, m.nfds), KVD_OK);
        free(frame);
        for (j = 0; j < m.nfds; j++)
            close(m.fds[j]);
        close(fd);
        r = kvdt_recv(x.c, NULL, NULL, KVDT_TIMEOUT_MS);
        ck_assert_ptr_nonnull(r);
        ck_assert_uint_eq(r->status, 0);
        kvdock__response__free_unpacked(r, NULL);
    }
    /* every descriptor that came with a row is closed again, and every
     * connection the rows closed is gone */
    for (tries = 0; tries < 200; tries++) {
        fds1 = count_fds(x.d.pid);
        if (fds1 <= fds0) /* fewer: something transient was open at the first count */
            break;
        usleep(10000);
    }
    ck_assert_msg(fds1 <= fds0, "the daemon holds %d descriptors, %d before the rows", fds1,
                  fds0);
    for (k = 0; k < 3; k++)
        munmap(x.map[k], x.map_len[k]);
    munmap(x.bmap, 4096);
    close(x.c);
    close(x.y);
    ck_assert_int_eq(kvdt_stop(&x.d), 0);
}
END_TEST

static Suite *bad_input_suite(void)
{
    Suite *s = suite_create("bad_input");
    TCase *tc = tcase_create("table");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_bad_input_table);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(bad_input_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
