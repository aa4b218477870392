/*
 * Data operations: store, FP8 set, page-table gather, transfer.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "Indices.raw is little-endian: this host's arrays would need converting"
#endif

/* One Data message and its buffer reference. */
typedef struct data_msg {
    Kvdock__Data msg;
    Kvdock__BufRef ref;
} data_msg_t;

kvd_status_t kvd__indices_build(kvd_client_t *cli, const kvd_indices_t *in, kvd__idx_msg_t *t,
                                const char *what)
{
    int32_t dtype = in->dtype == 0 ? 2 /* I64 */ : in->dtype;
    uint64_t size = dtype == 1 ? 4 : 8;

    kvdock__indices__init(&t->msg);
    kvdock__buf_ref__init(&t->ref);
    if (dtype != 1 && dtype != 2)
        return kvd__client_fail(cli, KVD_EDTYPE, "%s: indices must be I32 or I64, not dtype %d",
                                what, in->dtype);
    if (in->count > SIZE_MAX / size)
        return kvd__client_fail(cli, KVD_EOVERFLOW, "%s: %llu indices is too many", what,
                                (unsigned long long)in->count);
    if (in->values != NULL) {
        /* the array as it is (Indices.raw): one copy into the frame */
        t->msg.raw.data = (uint8_t *)in->values;
        t->msg.raw.len = (size_t)(in->count * size);
        t->msg.dtype = (Kvdock__DType)dtype;
        return KVD_OK;
    }
    if (in->buffer != 0) {
        t->ref.buffer = in->buffer;
        t->ref.offset = in->offset;
        t->ref.bytes = in->count * size;
        t->msg.buffer = &t->ref;
        t->msg.dtype = (Kvdock__DType)dtype;
        t->msg.count = in->count;
        return KVD_OK;
    }
    if (in->count != 0)
        return kvd__client_fail(cli, KVD_ENULL, "%s: %llu indices but neither values nor a buffer",
                                what, (unsigned long long)in->count);
    return KVD_OK; /* empty */
}

/* NULL when the operand is absent (no data, no buffer, no bytes). */
static Kvdock__Data *data_build(const kvd_data_t *in, data_msg_t *t)
{
    kvdock__data__init(&t->msg);
    kvdock__buf_ref__init(&t->ref);
    if (in->data != NULL) {
        t->msg.inline_.data = (uint8_t *)in->data;
        t->msg.inline_.len = (size_t)in->bytes;
        return &t->msg;
    }
    if (in->buffer != 0) {
        t->ref.buffer = in->buffer;
        t->ref.offset = in->offset;
        t->ref.bytes = in->bytes;
        t->msg.buffer = &t->ref;
        return &t->msg;
    }
    return NULL;
}

Kvdock__Sync *kvd__sync_build(const kvd_sync_t *in, Kvdock__Sync *s)
{
    if (in == NULL)
        return NULL;
    kvdock__sync__init(s);
    s->wait_event = in->wait_event;
    s->record_event = in->record_event;
    s->reply_at_enqueue = in->reply_at_enqueue;
    s->stream = (Kvdock__StreamClass)in->stream;
    s->max_blocks = in->max_blocks;
    s->copy_engine = in->copy_engine;
    s->path = (Kvdock__CopyPath)in->path;
    return s;
}

static void bufref_build(const kvd_bufref_t *in, Kvdock__BufRef *r)
{
    kvdock__buf_ref__init(r);
    r->buffer = in->buffer;
    r->offset = in->offset;
    r->bytes = in->bytes;
}

static kvd_status_t op_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    kvd_op_result_t *o = p->out.op.out;
    const Kvdock__OpReply *r;

    if (p->resp->result_case == KVDOCK__RESPONSE__RESULT__NOT_SET) {
        r = NULL;
    } else if (p->resp->result_case == KVDOCK__RESPONSE__RESULT_OP) {
        r = p->resp->op;
    } else {
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered %s without an OpReply",
                                kvd__op_name(p->op));
    }
    if (o == NULL)
        return KVD_OK;
    memset(o, 0, sizeof(*o));
    if (r != NULL) {
        o->rows = r->rows;
        o->skipped_oob = r->skipped_oob;
        o->bytes = r->bytes;
        o->enqueued = r->enqueued != 0;
        o->path = (int32_t)r->path;
        o->stored = r->stored;
        o->skipped = r->skipped;
        o->refused = r->refused;
    }
    return KVD_OK;
}

kvd_status_t kvd__op_call(kvd_client_t *cli, Kvdock__Request *req, kvd_op_result_t *out,
                          uint64_t *req_id)
{
    kvd__out_t o;

    memset(&o, 0, sizeof(o));
    o.op.out = out;
    return kvd__call(cli, req, NULL, 0, op_finish, &o, req_id);
}

/* ------------------------------------------------------------------------ */

static kvd_status_t store_go(kvd_client_t *cli, const kvd_kv_store_t *a, const kvd_sync_t *sync,
                             kvd_op_result_t *out, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__Store m = KVDOCK__STORE__INIT;
    Kvdock__Sync s;
    kvd__idx_msg_t loc;
    data_msg_t k, v;
    kvd_status_t st;

    if (cli == NULL || a == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client or args is NULL");
    st = kvd__indices_build(cli, &a->loc, &loc, "store loc");
    if (st != KVD_OK)
        return st;
    m.pool = a->pool;
    m.layer = a->layer;
    m.loc = &loc.msg;
    m.k = data_build(&a->k, &k);
    m.v = data_build(&a->v, &v);
    m.src_stride = a->src_stride;
    req.sync = kvd__sync_build(sync, &s);
    req.op_case = KVDOCK__REQUEST__OP_STORE;
    req.store = &m;
    return kvd__op_call(cli, &req, out, req_id);
}

kvd_status_t kvd_kv_store(kvd_client_t *cli, const kvd_kv_store_t *args, const kvd_sync_t *sync,
                          kvd_op_result_t *out)
{
    return store_go(cli, args, sync, out, NULL);
}

kvd_status_t kvd_kv_store_submit(kvd_client_t *cli, const kvd_kv_store_t *args,
                                 const kvd_sync_t *sync, kvd_op_result_t *out, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return store_go(cli, args, sync, out, req_id);
}

static kvd_status_t fp8_go(kvd_client_t *cli, const kvd_kv_fp8_set_t *a, const kvd_sync_t *sync,
                           kvd_op_result_t *out, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__Fp8Set m = KVDOCK__FP8_SET__INIT;
    Kvdock__Sync s;
    kvd__idx_msg_t loc;
    data_msg_t k, v;
    kvd_status_t st;

    if (cli == NULL || a == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client or args is NULL");
    if (a->scale_mode == KVD_FP8_SCALE_PER_HEAD && a->k_head_scales == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "per-head scaling needs k_head_scales");
    st = kvd__indices_build(cli, &a->loc, &loc, "fp8_set loc");
    if (st != KVD_OK)
        return st;
    m.pool = a->pool;
    m.layer = a->layer;
    m.loc = &loc.msg;
    m.k = data_build(&a->k, &k);
    m.v = data_build(&a->v, &v);
    m.src_dtype = (Kvdock__DType)a->src_dtype;
    m.cache_dtype = (Kvdock__DType)a->cache_dtype;
    m.num_heads = a->num_heads;
    m.head_dim = a->head_dim;
    m.scale_mode = (Kvdock__ScaleMode)a->scale_mode;
    m.k_scale = a->k_scale;
    m.v_scale = a->v_scale;
    if (a->scale_mode == KVD_FP8_SCALE_PER_HEAD) {
        m.n_k_head_scales = a->num_heads;
        m.k_head_scales = (float *)a->k_head_scales;
        if (a->v_head_scales != NULL) { /* MLA pools take none */
            m.n_v_head_scales = a->num_heads;
            m.v_head_scales = (float *)a->v_head_scales;
        }
    }
    req.sync = kvd__sync_build(sync, &s);
    req.op_case = KVDOCK__REQUEST__OP_FP8_SET;
    req.fp8_set = &m;
    return kvd__op_call(cli, &req, out, req_id);
}

kvd_status_t kvd_kv_fp8_set(kvd_client_t *cli, const kvd_kv_fp8_set_t *args, const kvd_sync_t *sync,
                            kvd_op_result_t *out)
{
    return fp8_go(cli, args, sync, out, NULL);
}

kvd_status_t kvd_kv_fp8_set_submit(kvd_client_t *cli, const kvd_kv_fp8_set_t *args,
                                   const kvd_sync_t *sync, kvd_op_result_t *out, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return fp8_go(cli, args, sync, out, req_id);
}

static kvd_status_t gather_go(kvd_client_t *cli, const kvd_page_table_gather_t *a,
                              const kvd_sync_t *sync, kvd_op_result_t *out, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__PageTableGather m = KVDOCK__PAGE_TABLE_GATHER__INIT;
    Kvdock__BufRef table, dst;
    Kvdock__Sync s;
    kvd__idx_msg_t rows, lens;
    kvd_status_t st;

    if (cli == NULL || a == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client or args is NULL");
    st = kvd__indices_build(cli, &a->req_pool_indices, &rows, "gather req_pool_indices");
    if (st != KVD_OK)
        return st;
    st = kvd__indices_build(cli, &a->seq_lens, &lens, "gather seq_lens");
    if (st != KVD_OK)
        return st;
    bufref_build(&a->req_to_page, &table);
    bufref_build(&a->out, &dst);
    m.req_to_page = &table;
    m.table_dtype = (Kvdock__DType)a->table_dtype;
    m.table_rows = a->table_rows;
    m.table_cols = a->table_cols;
    m.table_stride = a->table_stride;
    m.req_pool_indices = &rows.msg;
    m.seq_lens = &lens.msg;
    m.out = &dst;
    m.out_stride = a->out_stride;
    m.max_num_pages = a->max_num_pages;
    m.page_size = a->page_size;
    m.dummy_slot = a->dummy_slot;
    req.sync = kvd__sync_build(sync, &s);
    req.op_case = KVDOCK__REQUEST__OP_GATHER;
    req.gather = &m;
    return kvd__op_call(cli, &req, out, req_id);
}

kvd_status_t kvd_page_table_gather(kvd_client_t *cli, const kvd_page_table_gather_t *args,
                                   const kvd_sync_t *sync, kvd_op_result_t *out)
{
    return gather_go(cli, args, sync, out, NULL);
}

kvd_status_t kvd_page_table_gather_submit(kvd_client_t *cli, const kvd_page_table_gather_t *args,
                                          const kvd_sync_t *sync, kvd_op_result_t *out,
                                          uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return gather_go(cli, args, sync, out, req_id);
}

static kvd_status_t transfer_go(kvd_client_t *cli, const kvd_kv_transfer_t *a,
                                const kvd_sync_t *sync, kvd_op_result_t *out, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__Transfer m = KVDOCK__TRANSFER__INIT;
    Kvdock__Sync s;
    kvd__idx_msg_t src, dst;
    kvd_status_t st;

    if (cli == NULL || a == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client or args is NULL");
    st = kvd__indices_build(cli, &a->src, &src, "transfer src");
    if (st != KVD_OK)
        return st;
    st = kvd__indices_build(cli, &a->dst, &dst, "transfer dst");
    if (st != KVD_OK)
        return st;
    m.src_pool = a->src_pool;
    m.dst_pool = a->dst_pool;
    m.src = &src.msg;
    m.dst = &dst.msg;
    m.all_layers = a->all_layers;
    m.layer_begin = a->layer_begin;
    m.layer_count = a->layer_count;
    req.sync = kvd__sync_build(sync, &s);
    req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    req.transfer = &m;
    return kvd__op_call(cli, &req, out, req_id);
}

kvd_status_t kvd_kv_transfer(kvd_client_t *cli, const kvd_kv_transfer_t *args,
                             const kvd_sync_t *sync, kvd_op_result_t *out)
{
    return transfer_go(cli, args, sync, out, NULL);
}

kvd_status_t kvd_kv_transfer_submit(kvd_client_t *cli, const kvd_kv_transfer_t *args,
                                    const kvd_sync_t *sync, kvd_op_result_t *out, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return transfer_go(cli, args, sync, out, req_id);
}
