/*
 * Data operations: store, fp8 set, page-table gather, transfer.
 *
 * Each handler validates every field first (ids and ownership, byte ranges
 * against sizes, inline index values against slot counts, dtypes and
 * shapes, layer ranges, alignment), holding a reference on every object it
 * names; then it stages inline operands where the kernels can read them and
 * submits one job.  The reply goes out when the job completes (or at
 * enqueue, if asked); the references are released after that.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "log.h"

#define MAX_REFS 8
#define MAX_STAGING 6

typedef struct dataop {
    kvd_job_t job; /* first: the backend hands it back */
    kvd_server_t *srv;
    kvd_conn_t *conn;
    uint64_t req_id;
    size_t op_index;
    uint64_t t_start_ns;
    int reply_at_enqueue;
    int replied;
    kvd_obj_t *refs[MAX_REFS];
    int nrefs;
    void *staging[MAX_STAGING];
    size_t staging_bytes[MAX_STAGING];
    int nstaging;
    uint64_t rows;       /* rows the request covers */
    uint64_t rows_valid; /* rows not known to be padding */
    uint64_t row_bytes;  /* bytes written per row */
    kvd_status_t stage_status; /* why the last stage() failed */
    int path;            /* kvd_copy_path_t: asked for, then the one run */
} dataop_t;

/* An index operand resolved to memory the kernels read. */
typedef struct idx {
    const void *ptr;
    int32_t dtype;
    int64_t count;
    int64_t valid; /* not negative (inline: counted; buffer: assumed) */
    int on_device; /* in a device buffer: not readable by the host */
    int staged;    /* inline: the daemon's own copy */
} idx_t;

static void dataop_destroy(dataop_t *d)
{
    kvd_backend_t *be = d->srv->backend;
    int i;

    for (i = 0; i < d->nrefs; i++)
        kvd_obj_unref(&d->srv->reg, d->refs[i]);
    for (i = 0; i < d->nstaging; i++)
        be->staging_free(be, d->staging[i], d->staging_bytes[i]);
    free(d);
}

static dataop_t *dataop_create(kvd_req_t *r)
{
    dataop_t *d = calloc(1, sizeof(*d));

    if (d == NULL)
        return NULL;
    d->srv = r->srv;
    d->conn = r->conn;
    d->req_id = r->req->id;
    d->op_index = r->op_index;
    d->t_start_ns = r->t_start_ns;
    return d;
}

static void hold(dataop_t *d, kvd_obj_t *o)
{
    /* callers never name more than MAX_REFS objects */
    kvd_obj_ref(o);
    d->refs[d->nrefs++] = o;
}

/* A staging copy of n bytes from src (NULL: left uninitialised), freed with
 * d; NULL when refused, with r's message set and the status in
 * d->stage_status (the budget's ELIMIT, or ENOMEM). */
static void *stage(kvd_req_t *r, dataop_t *d, const void *src, size_t n)
{
    kvd_backend_t *be = r->srv->backend;
    char why[200] = "";
    void *p = NULL;

    if (d->nstaging == MAX_STAGING) {
        d->stage_status = kvd__req_fail(r, KVD_EINTERNAL, "too many staged operands");
        return NULL;
    }
    d->stage_status = be->staging_alloc(be, n, &p, why, sizeof(why));
    if (d->stage_status != KVD_OK) {
        (void)kvd__req_fail(r, d->stage_status, "staging %zu bytes: %s", n, why);
        return NULL;
    }
    if (n && src != NULL)
        memcpy(p, src, n);
    d->staging[d->nstaging] = p;
    d->staging_bytes[d->nstaging] = n;
    d->nstaging++;
    return p;
}

static kvd_status_t get_pool(kvd_req_t *r, dataop_t *d, uint64_t id, const char *what,
                             kvd_pool_t **out)
{
    kvd_obj_t *o = kvd_registry_get(&r->srv->reg, id, KVD_OBJ_POOL);

    if (o == NULL)
        return kvd__req_fail(r, KVD_ENOENT, "%s: no pool %" PRIu64, what, id);
    if (kvd_obj_may_use(o, r->conn->id) != KVD_OK)
        return kvd__req_fail(r, KVD_EPERM, "%s: pool %" PRIu64 " belongs to another client", what,
                         id);
    hold(d, o);
    *out = (kvd_pool_t *)o;
    return KVD_OK;
}

/* need bytes at a buffer's offset, aligned to align. */
static kvd_status_t get_bufref(kvd_req_t *r, dataop_t *d, const Kvdock__BufRef *b, uint64_t need,
                               uint64_t align, const char *what, void **ptr, int *on_device)
{
    kvd_buffer_t *buf;
    kvd_obj_t *o;
    uint64_t len;

    if (b == NULL)
        return kvd__req_fail(r, KVD_ENULL, "%s: a buffer reference is required", what);
    o = kvd_registry_get(&r->srv->reg, b->buffer, KVD_OBJ_BUFFER);
    if (o == NULL)
        return kvd__req_fail(r, KVD_ENOENT, "%s: no buffer %" PRIu64, what, b->buffer);
    if (kvd_obj_may_use(o, r->conn->id) != KVD_OK)
        return kvd__req_fail(r, KVD_EPERM, "%s: buffer %" PRIu64 " belongs to another client", what,
                         b->buffer);
    buf = (kvd_buffer_t *)o;
    len = b->bytes ? b->bytes : need;
    if (len < need)
        return kvd__req_fail(r, KVD_ESHAPE, "%s: %" PRIu64 " bytes given, %" PRIu64 " needed", what,
                         len, need);
    if (b->offset > buf->bytes || len > buf->bytes - b->offset)
        return kvd__req_fail(r, KVD_ERANGE,
                         "%s: bytes [%" PRIu64 ", %" PRIu64 " + %" PRIu64
                         ") pass the end of buffer %" PRIu64 " (%" PRIu64 " bytes)",
                         what, b->offset, b->offset, len, b->buffer, buf->bytes);
    if (align > 1 && b->offset % align != 0)
        return kvd__req_fail(r, KVD_EALIGN, "%s: offset %" PRIu64 " is not a multiple of %" PRIu64,
                         what, b->offset, align);
    hold(d, o);
    *ptr = (char *)buf->mem->ptr + b->offset;
    if (on_device)
        *on_device = buf->kind != KVD_MEM_HOST;
    return KVD_OK;
}

/* Check inline indices against bound (< 0: only that none is negative),
 * counting those that are not padding.  One pass without early exits, so
 * the compiler vectorises it; a second pass only on error, to name the
 * first bad index. */
#define SCAN_INLINE(T)                                                                         \
    do {                                                                                       \
        const T *v_ = (const T *)vals;                                                         \
        for (size_t i_ = 0; i_ < n; i_++) {                                                    \
            int64_t x_ = (int64_t)v_[i_];                                                      \
            hi = x_ > hi ? x_ : hi;                                                            \
            lo = x_ < lo ? x_ : lo;                                                            \
            count += x_ >= 0;                                                                  \
        }                                                                                      \
        if ((bound >= 0 && hi >= bound) || (bound < 0 && lo < 0))                              \
            for (size_t i_ = 0; i_ < n; i_++) {                                                \
                int64_t x_ = (int64_t)v_[i_];                                                  \
                if (bound >= 0 && x_ >= bound)                                                 \
                    return kvd__req_fail(r, KVD_ERANGE,                                        \
                                         "%s[%zu] = %" PRId64 " is out of range [0, %" PRId64 \
                                         ")", what, i_, x_, bound);                            \
                if (bound < 0 && x_ < 0)                                                       \
                    return kvd__req_fail(r, KVD_EINVAL, "%s[%zu] = %" PRId64 " is negative",   \
                                         what, i_, x_);                                        \
            }                                                                                  \
    } while (0)

static kvd_status_t check_inline(kvd_req_t *r, const void *vals, size_t n, int is64,
                                 int64_t bound, const char *what, int64_t *valid)
{
    int64_t hi = -1, lo = 0, count = 0;

    if (is64)
        SCAN_INLINE(int64_t);
    else
        SCAN_INLINE(int32_t);
    *valid = count;
    return KVD_OK;
}
#undef SCAN_INLINE

/* bound < 0: values are not checked against a bound (seq_lens). */
static kvd_status_t get_indices(kvd_req_t *r, dataop_t *d, const Kvdock__Indices *ix,
                                int64_t bound, const char *what, idx_t *out)
{
    int forms;
    kvd_status_t st;

    memset(out, 0, sizeof(*out));
    out->dtype = KVD_DTYPE_I64;
    if (ix == NULL)
        return KVD_OK; /* no elements */
    forms = (ix->n_values > 0) + (ix->raw.len > 0) + (ix->buffer != NULL);
    if (forms == 0)
        return KVD_OK;
    if (forms > 1)
        return kvd__req_fail(r, KVD_EINVAL,
                             "%s: inline values, raw bytes and a buffer are exclusive", what);
    if (ix->n_values > 0 || ix->raw.len > 0) {
        const void *vals = ix->n_values > 0 ? (const void *)ix->values : ix->raw.data;
        size_t esize = 8, n = ix->n_values, bytes;

        if (ix->raw.len > 0) {
            if (ix->dtype != KVDOCK__DTYPE__I32 && ix->dtype != KVDOCK__DTYPE__I64)
                return kvd__req_fail(r, KVD_EDTYPE, "%s: index dtype must be I32 or I64", what);
            esize = ix->dtype == KVDOCK__DTYPE__I32 ? 4 : 8;
            if (ix->raw.len % esize != 0)
                return kvd__req_fail(r, KVD_ESHAPE,
                                     "%s: %zu raw bytes are not whole %zu-byte indices", what,
                                     ix->raw.len, esize);
            n = ix->raw.len / esize;
        }
        bytes = n * esize;
        if (bytes > r->srv->opts.max_inline_bytes)
            return kvd__req_fail(r, KVD_ELIMIT,
                                 "%s: %zu inline indices exceed max-inline-bytes (%" PRIu64 ")",
                                 what, n, r->srv->opts.max_inline_bytes);
        /* checked in the (aligned) staging copy: raw bytes need not be */
        out->ptr = stage(r, d, vals, bytes);
        if (out->ptr == NULL)
            return d->stage_status;
        st = check_inline(r, out->ptr, n, esize == 8, bound, what, &out->valid);
        if (st != KVD_OK)
            return st;
        out->dtype = esize == 8 ? KVD_DTYPE_I64 : KVD_DTYPE_I32;
        out->count = (int64_t)n;
        out->staged = 1;
        return KVD_OK;
    }
    {
        uint64_t esize, need;
        void *p;

        if (ix->dtype != KVDOCK__DTYPE__I32 && ix->dtype != KVDOCK__DTYPE__I64)
            return kvd__req_fail(r, KVD_EDTYPE, "%s: index dtype must be I32 or I64", what);
        esize = ix->dtype == KVDOCK__DTYPE__I32 ? 4 : 8;
        if (ix->count > (uint64_t)INT64_MAX / 8)
            return kvd__req_fail(r, KVD_EOVERFLOW, "%s: count %" PRIu64 " is too large", what,
                             ix->count);
        need = ix->count * esize;
        st = get_bufref(r, d, ix->buffer, need, esize, what, &p, &out->on_device);
        if (st != KVD_OK)
            return st;
        out->ptr = p;
        out->dtype = (int32_t)ix->dtype;
        out->count = (int64_t)ix->count;
        out->valid = (int64_t)ix->count;
        return KVD_OK;
    }
}

/* An inline I32 index array as I64, in a new staging copy. */
static kvd_status_t widen(kvd_req_t *r, dataop_t *d, idx_t *x)
{
    const int32_t *v = x->ptr;
    int64_t *w;

    w = stage(r, d, NULL, (size_t)x->count * sizeof(int64_t));
    if (w == NULL)
        return d->stage_status;
    for (int64_t i = 0; i < x->count; i++)
        w[i] = v[i];
    x->ptr = w;
    x->dtype = KVD_DTYPE_I64;
    return KVD_OK;
}

/* Operand bytes: need bytes, inline or in a buffer.  Inline bytes must be
 * need to most (whole rows at the source stride): more is a client's
 * mismatch between its data and its indices, refused (ESHAPE) rather than
 * silently cut. */
static kvd_status_t get_data(kvd_req_t *r, dataop_t *d, const Kvdock__Data *dd, uint64_t need,
                             uint64_t most, uint64_t align, const char *what, const void **ptr)
{
    *ptr = NULL;
    if (dd == NULL || (dd->inline_.len == 0 && dd->buffer == NULL)) {
        if (need == 0)
            return KVD_OK;
        return kvd__req_fail(r, KVD_ENULL, "%s is required (%" PRIu64 " bytes)", what, need);
    }
    if (dd->inline_.len > 0 && dd->buffer != NULL)
        return kvd__req_fail(r, KVD_EINVAL, "%s: inline bytes and a buffer are exclusive", what);
    if (dd->inline_.len > 0) {
        if (dd->inline_.len > r->srv->opts.max_inline_bytes)
            return kvd__req_fail(r, KVD_ELIMIT, "%s: %zu inline bytes exceed max-inline-bytes (%" PRIu64
                             ")", what, dd->inline_.len, r->srv->opts.max_inline_bytes);
        if (dd->inline_.len < need)
            return kvd__req_fail(r, KVD_ESHAPE, "%s: %zu bytes given, %" PRIu64 " needed", what,
                             dd->inline_.len, need);
        if (dd->inline_.len > most)
            return kvd__req_fail(r, KVD_ESHAPE, "%s: %zu inline bytes given for %" PRIu64
                             " (the rows its indices name)", what, dd->inline_.len, most);
        *ptr = stage(r, d, dd->inline_.data, (size_t)need);
        if (*ptr == NULL && need > 0)
            return d->stage_status;
        return KVD_OK;
    }
    {
        void *p;
        kvd_status_t st = get_bufref(r, d, dd->buffer, need, align, what, &p, NULL);
        if (st == KVD_OK)
            *ptr = p;
        return st;
    }
}

static kvd_status_t get_event(kvd_req_t *r, dataop_t *d, uint64_t id, const char *what,
                              void **ev)
{
    kvd_obj_t *o;

    *ev = NULL;
    if (id == 0)
        return KVD_OK;
    o = kvd_registry_get(&r->srv->reg, id, KVD_OBJ_EVENT);
    if (o == NULL)
        return kvd__req_fail(r, KVD_ENOENT, "sync.%s: no event %" PRIu64, what, id);
    if (kvd_obj_may_use(o, r->conn->id) != KVD_OK)
        return kvd__req_fail(r, KVD_EPERM, "sync.%s: event %" PRIu64 " belongs to another client",
                         what, id);
    hold(d, o);
    *ev = ((kvd_event_t *)o)->ev;
    return KVD_OK;
}

static kvd_status_t get_sync(kvd_req_t *r, dataop_t *d, int sclass, int is_transfer)
{
    const Kvdock__Sync *s = r->req->sync;
    kvd_status_t st;

    d->job.sclass = sclass;
    d->path = KVD_PATH_DEFAULT;
    if (s == NULL)
        return KVD_OK;
    /* the proto's numbers are kvd_stream_class_t's */
    if ((int)s->stream < 0 || (int)s->stream >= KVD_STREAM_END)
        return kvd__req_fail(r, KVD_EINVAL, "sync.stream %d is not a stream class", (int)s->stream);
    if (s->stream != KVDOCK__STREAM_CLASS__STREAM_DEFAULT)
        d->job.sclass = (int)s->stream;
    if ((int)s->path < KVD_PATH_DEFAULT || (int)s->path > KVD_PATH_KERNEL)
        return kvd__req_fail(r, KVD_EINVAL, "sync.path %d is not a copy path", (int)s->path);
    d->path = (int)s->path;
    if (s->copy_engine) {
        if (d->path == KVD_PATH_KERNEL)
            return kvd__req_fail(r, KVD_EINVAL, "sync.copy_engine and sync.path = PATH_KERNEL "
                                 "disagree");
        d->path = KVD_PATH_COPY_ENGINE;
    }
    if (d->path == KVD_PATH_COPY_ENGINE && !is_transfer)
        return kvd__req_fail(r, KVD_EINVAL, "the copy engines move transfers only (sync.path)");
    if ((st = get_event(r, d, s->wait_event, "wait_event", &d->job.wait_event)) != KVD_OK)
        return st;
    if ((st = get_event(r, d, s->record_event, "record_event", &d->job.record_event)) != KVD_OK)
        return st;
    d->job.max_blocks = s->max_blocks;
    d->reply_at_enqueue = s->reply_at_enqueue;
    return KVD_OK;
}

int kvd__stream_path(const kvd_options_t *o, int sclass)
{
    return kvd__default_path(o, sclass == KVD_STREAM_RELOAD ? KVD_MEM_HOST : KVD_MEM_DEVICE,
                             sclass == KVD_STREAM_OFFLOAD ? KVD_MEM_HOST : KVD_MEM_DEVICE);
}

int kvd__default_path(const kvd_options_t *o, int src_kind, int dst_kind)
{
    if ((src_kind == KVD_MEM_HOST) != (dst_kind == KVD_MEM_HOST))
        return o->host_copy_path == KVD_HOST_PATH_COPY_ENGINE ? KVD_PATH_COPY_ENGINE
                                                              : KVD_PATH_KERNEL;
    return KVD_PATH_KERNEL;
}

/* The path of a transfer between memory of src_kind and dst_kind, after
 * get_sync: the one asked for, or the default.  The copy engines' rows
 * are listed from the indices when the request arrives, not in stream
 * order: device-resident indices cannot be read then, and indices in a
 * buffer that a worker writes before its wait event would be read too
 * early.  Such a transfer gets a kernel by default, and EINVAL when it
 * asks for the copy engines. */
static kvd_status_t choose_path(kvd_req_t *r, dataop_t *d, int src_kind, int dst_kind,
                                int indices_on_device, int buffer_indices)
{
    int readable = !indices_on_device && !(buffer_indices && d->job.wait_event != NULL);

    if (d->path == KVD_PATH_COPY_ENGINE && indices_on_device)
        return kvd__req_fail(r, KVD_EINVAL, "the copy engines need host-readable indices (inline "
                             "or in a host buffer)");
    if (d->path == KVD_PATH_COPY_ENGINE && !readable)
        return kvd__req_fail(r, KVD_EINVAL, "the copy engines with sync.wait_event need inline "
                             "indices (buffer indices are read when the request arrives)");
    if (d->path == KVD_PATH_DEFAULT) {
        d->path = kvd__default_path(&r->srv->opts, src_kind, dst_kind);
        if (d->path == KVD_PATH_COPY_ENGINE && !readable)
            d->path = KVD_PATH_KERNEL;
    }
    d->job.flags = d->path == KVD_PATH_COPY_ENGINE ? KVD_LAUNCH_COPY_ENGINE : 0;
    return KVD_OK;
}

static uint64_t written_bytes(const dataop_t *d)
{
    uint64_t rows = d->rows_valid > d->job.skipped_oob ? d->rows_valid - d->job.skipped_oob : 0;

    return d->job.status == KVD_OK ? rows * d->row_bytes : 0;
}

static void send_op_reply(dataop_t *d, kvd_status_t st, const char *msg, int enqueued)
{
    Kvdock__OpReply op = KVDOCK__OP_REPLY__INIT;
    uint64_t bytes = enqueued ? 0 : written_bytes(d);

    op.rows = d->rows;
    op.skipped_oob = enqueued ? 0 : d->job.skipped_oob;
    op.bytes = bytes;
    op.enqueued = enqueued;
    op.path = (Kvdock__CopyPath)(d->path == KVD_PATH_DEFAULT ? KVD_PATH_KERNEL : d->path);
    kvd__reply_deferred(d->conn, d->req_id, d->op_index, d->t_start_ns, st, msg, &op, bytes);
}

static void job_done(kvd_job_t *job)
{
    dataop_t *d = (dataop_t *)job;
    kvd_conn_t *c = d->conn;

    kvd_stats_stream_leave(&d->srv->stats, job->sclass, written_bytes(d),
                           d->path == KVD_PATH_COPY_ENGINE, kvd_now_ns());
    if (!d->replied) {
        send_op_reply(d, job->status, job->detail, 0);
    } else if (job->status != KVD_OK) {
        kvd_log(KVD_LOG_WARN, "event=op_failed_after_reply client=%" PRIu64 " id=%" PRIu64
                " status=%s detail=\"%s\"", c->id, d->req_id, kvd_err_name(job->status),
                job->detail);
    }
    dataop_destroy(d);
    kvd__conn_op_end(c);
}

/* Submit a validated job; on error the caller still owns d. */
static kvd_status_t submit(kvd_req_t *r, dataop_t *d)
{
    kvd_backend_t *be = r->srv->backend;
    kvd_status_t st;

    d->job.done = job_done;
    st = be->submit(be, &d->job);
    if (st != KVD_OK)
        return kvd__req_fail(r, st, "%s", d->job.detail[0] ? d->job.detail : "cannot submit the work");
    r->deferred = 1;
    kvd__conn_op_begin(r->conn);
    kvd_stats_stream_enter(&r->srv->stats, d->job.sclass, kvd_now_ns());
    if (d->reply_at_enqueue) {
        d->replied = 1;
        send_op_reply(d, KVD_OK, NULL, 1);
    }
    return KVD_OK;
}

static char *layer_k(const kvd_pool_t *p, uint32_t l)
{
    if (p->imported)
        return (char *)(uintptr_t)p->k_addr[l];
    return (char *)p->mem->ptr + (uint64_t)l * p->layer_stride;
}

static char *layer_v(const kvd_pool_t *p, uint32_t l)
{
    if (p->mla)
        return NULL;
    if (p->imported)
        return (char *)(uintptr_t)p->v_addr[l];
    return (char *)p->mem->ptr + (uint64_t)l * p->layer_stride + p->v_offset;
}

static int data_given(const Kvdock__Data *dd)
{
    return dd != NULL && (dd->inline_.len > 0 || dd->buffer != NULL);
}

/* (n - 1) * stride + last, or 0 for n == 0; -1 on overflow. */
static int rows_extent(uint64_t n, uint64_t stride, uint64_t last, uint64_t *out)
{
    uint64_t v;

    if (n == 0) {
        *out = 0;
        return 0;
    }
    if (__builtin_mul_overflow(n - 1, stride, &v) || __builtin_add_overflow(v, last, &v) ||
        v > (uint64_t)INT64_MAX)
        return -1;
    *out = v;
    return 0;
}

/* ---- store ----------------------------------------------------------------- */

static kvd_status_t do_store(kvd_req_t *r, dataop_t *d)
{
    const Kvdock__Store *s = r->req->store;
    kvd_pool_t *p = NULL;
    idx_t loc;
    const void *k, *v = NULL;
    uint64_t stride, need, most;
    kvd_status_t st;

    if ((st = get_pool(r, d, s->pool, "pool", &p)) != KVD_OK)
        return st;
    if (s->layer >= p->num_layers)
        return kvd__req_fail(r, KVD_ERANGE, "layer %u: pool %" PRIu64 " has %u layers", s->layer,
                         p->obj.id, p->num_layers);
    if ((st = get_indices(r, d, s->loc, (int64_t)p->num_slots, "loc", &loc)) != KVD_OK)
        return st;
    stride = s->src_stride ? s->src_stride : p->slot_bytes;
    if (stride < p->slot_bytes)
        return kvd__req_fail(r, KVD_EINVAL, "src_stride %" PRIu64 " < slot_bytes %" PRIu64, stride,
                         p->slot_bytes);
    if (rows_extent((uint64_t)loc.count, stride, p->slot_bytes, &need) != 0)
        return kvd__req_fail(r, KVD_EOVERFLOW, "source size overflows");
    if (__builtin_mul_overflow((uint64_t)loc.count, stride, &most) || most < need)
        most = need;
    if ((st = get_data(r, d, s->k, need, most, 1, "k", &k)) != KVD_OK)
        return st;
    if (p->mla) {
        if (data_given(s->v))
            return kvd__req_fail(r, KVD_EINVAL, "pool %" PRIu64 " is MLA: it takes no v", p->obj.id);
    } else if ((st = get_data(r, d, s->v, need, most, 1, "v", &v)) != KVD_OK) {
        return st;
    }
    if ((st = get_sync(r, d, KVD_STREAM_WRITE, 0)) != KVD_OK)
        return st;

    if (loc.count == 0) {
        /* nothing is read: the kernels only want K and V paired */
        k = layer_k(p, s->layer);
        v = layer_v(p, s->layer);
    }
    d->job.kind = KVD_JOB_STORE;
    d->job.a.store = (kvd_store_args_t){
        .k_src = k,
        .v_src = v,
        .k_src_stride = (int64_t)stride,
        .v_src_stride = (int64_t)stride,
        .k_dst = layer_k(p, s->layer),
        .v_dst = layer_v(p, s->layer),
        .k_dst_stride = (int64_t)p->slot_stride,
        .v_dst_stride = (int64_t)p->slot_stride,
        .num_slots = (int64_t)p->num_slots,
        .loc = loc.ptr,
        .loc_dtype = loc.dtype,
        .num_tokens = loc.count,
        .row_bytes = (int64_t)p->slot_bytes,
    };
    d->rows = (uint64_t)loc.count;
    d->rows_valid = (uint64_t)loc.valid;
    d->row_bytes = p->slot_bytes * (p->mla ? 1 : 2);
    return submit(r, d);
}

/* ---- fp8 set --------------------------------------------------------------- */

static kvd_status_t check_scales(kvd_req_t *r, const float *v, size_t n, const char *what)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (!isfinite(v[i]) || v[i] == 0.0f)
            return kvd__req_fail(r, KVD_EINVAL, "%s[%zu] = %g: scales must be finite and non-zero",
                             what, i, (double)v[i]);
    return KVD_OK;
}

static kvd_status_t do_fp8_set(kvd_req_t *r, dataop_t *d)
{
    const Kvdock__Fp8Set *f = r->req->fp8_set;
    kvd_fp8_set_args_t *a = &d->job.a.fp8;
    kvd_pool_t *p = NULL;
    idx_t loc;
    const void *k, *v = NULL;
    uint64_t esize, row, need;
    kvd_status_t st;

    if ((st = get_pool(r, d, f->pool, "pool", &p)) != KVD_OK)
        return st;
    if (f->layer >= p->num_layers)
        return kvd__req_fail(r, KVD_ERANGE, "layer %u: pool %" PRIu64 " has %u layers", f->layer,
                         p->obj.id, p->num_layers);
    if (f->src_dtype != KVDOCK__DTYPE__F32 && f->src_dtype != KVDOCK__DTYPE__F16 &&
        f->src_dtype != KVDOCK__DTYPE__BF16)
        return kvd__req_fail(r, KVD_EDTYPE, "src_dtype must be F32, F16 or BF16");
    if (f->cache_dtype != KVDOCK__DTYPE__E4M3 && f->cache_dtype != KVDOCK__DTYPE__E5M2)
        return kvd__req_fail(r, KVD_EDTYPE, "cache_dtype must be E4M3 or E5M2");
    if (f->num_heads < 1 || f->head_dim < 1)
        return kvd__req_fail(r, KVD_EINVAL, "num_heads and head_dim must be >= 1");
    if ((uint64_t)f->num_heads * f->head_dim != p->slot_bytes)
        return kvd__req_fail(r, KVD_ESHAPE,
                         "num_heads x head_dim = %" PRIu64 " fp8 bytes, but the pool's slots "
                         "are %" PRIu64 " bytes",
                         (uint64_t)f->num_heads * f->head_dim, p->slot_bytes);
    if ((st = get_indices(r, d, f->loc, (int64_t)p->num_slots, "loc", &loc)) != KVD_OK)
        return st;
    esize = kvd_dtype_size((int)f->src_dtype);
    row = (uint64_t)f->num_heads * f->head_dim * esize;
    if (rows_extent((uint64_t)loc.count, row, row, &need) != 0)
        return kvd__req_fail(r, KVD_EOVERFLOW, "source size overflows");
    if ((st = get_data(r, d, f->k, need, need, esize, "k", &k)) != KVD_OK)
        return st;
    if (p->mla) {
        if (data_given(f->v))
            return kvd__req_fail(r, KVD_EINVAL, "pool %" PRIu64 " is MLA: it takes no v", p->obj.id);
    } else if ((st = get_data(r, d, f->v, need, need, esize, "v", &v)) != KVD_OK) {
        return st;
    }

    memset(a, 0, sizeof(*a));
    switch (f->scale_mode) {
    case KVDOCK__SCALE_MODE__SCALE_NONE:
        a->scale_mode = KVD_SCALE_NONE;
        break;
    case KVDOCK__SCALE_MODE__SCALE_TENSOR:
        if ((st = check_scales(r, &f->k_scale, 1, "k_scale")) != KVD_OK ||
            (!p->mla && (st = check_scales(r, &f->v_scale, 1, "v_scale")) != KVD_OK))
            return st;
        a->scale_mode = KVD_SCALE_HOST;
        a->k_scale = f->k_scale;
        a->v_scale = f->v_scale;
        break;
    case KVDOCK__SCALE_MODE__SCALE_PER_HEAD:
        if (f->n_k_head_scales != f->num_heads ||
            (!p->mla && f->n_v_head_scales != f->num_heads))
            return kvd__req_fail(r, KVD_ESHAPE, "per-head scales: %zu k and %zu v for %u heads",
                             f->n_k_head_scales, f->n_v_head_scales, f->num_heads);
        if ((st = check_scales(r, f->k_head_scales, f->n_k_head_scales, "k_head_scales")) !=
                KVD_OK ||
            (!p->mla && (st = check_scales(r, f->v_head_scales, f->n_v_head_scales,
                                           "v_head_scales")) != KVD_OK))
            return st;
        a->scale_mode = KVD_SCALE_PER_HEAD;
        a->k_scale_ptr = stage(r, d, f->k_head_scales, f->num_heads * sizeof(float));
        if (!p->mla)
            a->v_scale_ptr = stage(r, d, f->v_head_scales, f->num_heads * sizeof(float));
        if (a->k_scale_ptr == NULL || (!p->mla && a->v_scale_ptr == NULL))
            return d->stage_status;
        break;
    default:
        return kvd__req_fail(r, KVD_EINVAL, "scale_mode %d is unknown", (int)f->scale_mode);
    }
    if ((st = get_sync(r, d, KVD_STREAM_WRITE, 0)) != KVD_OK)
        return st;

    if (loc.count == 0) {
        k = layer_k(p, f->layer); /* nothing is read */
        v = layer_v(p, f->layer);
    }
    d->job.kind = KVD_JOB_FP8_SET;
    a->k_src = k;
    a->v_src = v;
    a->src_dtype = (int32_t)f->src_dtype;
    a->k_src_token_stride = a->v_src_token_stride = (int64_t)row;
    a->k_src_head_stride = a->v_src_head_stride = (int64_t)(f->head_dim * esize);
    a->k_cache = layer_k(p, f->layer);
    a->v_cache = layer_v(p, f->layer);
    a->cache_dtype = (int32_t)f->cache_dtype;
    a->page_size = 1; /* the pool's slots are flat: page l holds slot l */
    a->k_page_stride = a->v_page_stride = (int64_t)p->slot_stride;
    a->k_slot_stride = a->v_slot_stride = (int64_t)p->slot_stride;
    a->k_head_stride = a->v_head_stride = (int64_t)f->head_dim;
    a->num_slots = (int64_t)p->num_slots;
    a->num_heads = f->num_heads;
    a->head_dim = f->head_dim;
    a->loc = loc.ptr;
    a->loc_dtype = loc.dtype;
    a->num_tokens = loc.count;
    d->rows = (uint64_t)loc.count;
    d->rows_valid = (uint64_t)loc.valid;
    d->row_bytes = p->slot_bytes * (p->mla ? 1 : 2);
    return submit(r, d);
}

/* ---- page-table gather ----------------------------------------------------- */

static kvd_status_t do_gather(kvd_req_t *r, dataop_t *d)
{
    const Kvdock__PageTableGather *g = r->req->gather;
    kvd_gather_args_t *a = &d->job.a.gather;
    uint64_t esize, table_row, out_row, table_stride, out_stride, need;
    idx_t req, seq;
    void *table = NULL, *out = NULL;
    kvd_status_t st;

    if (g->table_dtype != KVDOCK__DTYPE__I32 && g->table_dtype != KVDOCK__DTYPE__I64)
        return kvd__req_fail(r, KVD_EDTYPE, "table_dtype must be I32 or I64");
    esize = g->table_dtype == KVDOCK__DTYPE__I32 ? 4 : 8;
    if (g->page_size < 1)
        return kvd__req_fail(r, KVD_EINVAL, "page_size must be >= 1");
    if (g->table_rows > (uint64_t)INT64_MAX || g->table_cols > (uint64_t)INT64_MAX / 8 ||
        g->max_num_pages > (uint64_t)INT64_MAX / 8)
        return kvd__req_fail(r, KVD_EOVERFLOW, "table or output dimensions are too large");
    if (g->table_dtype == KVDOCK__DTYPE__I32 &&
        (g->dummy_slot < INT32_MIN || g->dummy_slot > INT32_MAX))
        return kvd__req_fail(r, KVD_ERANGE, "dummy_slot %" PRId64 " does not fit an I32 table",
                         g->dummy_slot);
    table_row = g->table_cols * esize;
    out_row = g->max_num_pages * esize;
    table_stride = g->table_stride ? g->table_stride : table_row;
    out_stride = g->out_stride ? g->out_stride : out_row;
    if (table_stride < table_row || out_stride < out_row)
        return kvd__req_fail(r, KVD_EINVAL, "table_stride and out_stride must cover a whole row");
    if (table_stride % esize || out_stride % esize)
        return kvd__req_fail(r, KVD_EALIGN, "strides must be multiples of %" PRIu64, esize);
    if ((st = get_indices(r, d, g->req_pool_indices, (int64_t)g->table_rows, "req_pool_indices",
                          &req)) != KVD_OK)
        return st;
    if ((st = get_indices(r, d, g->seq_lens, -1, "seq_lens", &seq)) != KVD_OK)
        return st;
    if (req.count != seq.count)
        return kvd__req_fail(r, KVD_ESHAPE, "%" PRId64 " req_pool_indices but %" PRId64 " seq_lens",
                         req.count, seq.count);
    if (rows_extent(g->table_rows, table_stride, table_row, &need) != 0)
        return kvd__req_fail(r, KVD_EOVERFLOW, "table size overflows");
    if ((st = get_bufref(r, d, g->req_to_page, need, esize, "req_to_page", &table, NULL)) !=
        KVD_OK)
        return st;
    if (rows_extent((uint64_t)req.count, out_stride, out_row, &need) != 0)
        return kvd__req_fail(r, KVD_EOVERFLOW, "output size overflows");
    if ((st = get_bufref(r, d, g->out, need, esize, "out", &out, NULL)) != KVD_OK)
        return st;
    if ((st = get_sync(r, d, KVD_STREAM_WRITE, 0)) != KVD_OK)
        return st;

    d->job.kind = KVD_JOB_GATHER;
    memset(a, 0, sizeof(*a));
    a->req_to_page = table;
    a->table_dtype = (int32_t)g->table_dtype;
    a->table_rows = (int64_t)g->table_rows;
    a->table_cols = (int64_t)g->table_cols;
    a->table_stride = (int64_t)table_stride;
    a->req_pool_indices = req.ptr;
    a->req_dtype = req.dtype;
    a->seq_lens = seq.ptr;
    a->seq_lens_dtype = seq.dtype;
    a->out = out;
    a->out_stride = (int64_t)out_stride;
    a->bs = req.count;
    a->max_num_pages = (int64_t)g->max_num_pages;
    a->page_size = g->page_size;
    a->dummy_slot = g->dummy_slot;
    d->rows = (uint64_t)req.count;
    d->rows_valid = (uint64_t)req.count;
    d->row_bytes = out_row;
    return submit(r, d);
}

/* ---- transfer -------------------------------------------------------------- */

/* An imported pool's layers are scattered: the kernels read their addresses
 * from the backend's tables (device memory on cuda), the copy engines from
 * the host arrays. */
static void fill_side(const kvd_pool_t *p, uint32_t begin, int copy_engine, kvd_kv_side_t *s)
{
    memset(s, 0, sizeof(*s));
    if (p->imported) {
        const uint64_t *k = copy_engine ? p->k_addr : (const uint64_t *)p->k_table;
        const uint64_t *v = copy_engine ? p->v_addr : (const uint64_t *)p->v_table;

        s->k_layers = k + begin;
        s->v_layers = p->mla ? NULL : v + begin;
    } else {
        s->k = layer_k(p, begin);
        s->v = layer_v(p, begin);
        s->layer_stride = (int64_t)p->layer_stride;
    }
    s->slot_stride = (int64_t)p->slot_stride;
    s->num_slots = (int64_t)p->num_slots;
}

static kvd_status_t do_transfer(kvd_req_t *r, dataop_t *d)
{
    const Kvdock__Transfer *t = r->req->transfer;
    kvd_transfer_args_t *a = &d->job.a.transfer;
    kvd_pool_t *src = NULL, *dst = NULL;
    uint32_t begin, count;
    idx_t si, di;
    int sclass;
    kvd_status_t st;

    if ((st = get_pool(r, d, t->src_pool, "src_pool", &src)) != KVD_OK ||
        (st = get_pool(r, d, t->dst_pool, "dst_pool", &dst)) != KVD_OK)
        return st;
    if (src->slot_bytes != dst->slot_bytes)
        return kvd__req_fail(r, KVD_ESHAPE, "slot_bytes differ: %" PRIu64 " (src) vs %" PRIu64
                         " (dst)", src->slot_bytes, dst->slot_bytes);
    if (src->mla != dst->mla)
        return kvd__req_fail(r, KVD_ESHAPE, "src is %s but dst is %s", src->mla ? "MLA" : "MHA",
                         dst->mla ? "MLA" : "MHA");
    if (t->all_layers) {
        if (t->layer_begin != 0 || t->layer_count != 0)
            return kvd__req_fail(r, KVD_EINVAL, "all_layers takes no layer_begin or layer_count");
        if (src->num_layers != dst->num_layers)
            return kvd__req_fail(r, KVD_ESHAPE, "all_layers: %u layers (src) vs %u (dst)",
                             src->num_layers, dst->num_layers);
        begin = 0;
        count = src->num_layers;
    } else {
        begin = t->layer_begin;
        count = t->layer_count ? t->layer_count : 1;
        if ((uint64_t)begin + count > src->num_layers ||
            (uint64_t)begin + count > dst->num_layers)
            return kvd__req_fail(r, KVD_ERANGE, "layers [%u, %" PRIu64 ") pass the end of a pool "
                             "(%u src, %u dst layers)", begin, (uint64_t)begin + count,
                             src->num_layers, dst->num_layers);
    }
    if ((st = get_indices(r, d, t->src, (int64_t)src->num_slots, "src", &si)) != KVD_OK ||
        (st = get_indices(r, d, t->dst, (int64_t)dst->num_slots, "dst", &di)) != KVD_OK)
        return st;
    if (si.count != di.count)
        return kvd__req_fail(r, KVD_ESHAPE, "%" PRId64 " src indices but %" PRId64 " dst", si.count,
                         di.count);
    if (si.count > 0 && si.dtype != di.dtype) {
        /* the kernels take one index type: widen an inline I32 side */
        idx_t *narrow = si.dtype == KVD_DTYPE_I32 ? &si : &di;

        if (!narrow->staged)
            return kvd__req_fail(r, KVD_EDTYPE, "src and dst indices must have one dtype (an "
                                 "I32 buffer cannot be paired with I64 indices)");
        if ((st = widen(r, d, narrow)) != KVD_OK)
            return st;
    }
    if (dst->kind != KVD_MEM_HOST && src->kind == KVD_MEM_HOST)
        sclass = KVD_STREAM_RELOAD;
    else if (src->kind != KVD_MEM_HOST && dst->kind == KVD_MEM_HOST)
        sclass = KVD_STREAM_OFFLOAD;
    else
        sclass = KVD_STREAM_D2D;
    if ((st = get_sync(r, d, sclass, 1)) != KVD_OK ||
        (st = choose_path(r, d, src->kind, dst->kind, si.on_device || di.on_device,
                          (t->src && t->src->buffer) || (t->dst && t->dst->buffer))) != KVD_OK)
        return st;

    d->job.kind = KVD_JOB_TRANSFER;
    memset(a, 0, sizeof(*a));
    fill_side(src, begin, (d->job.flags & KVD_LAUNCH_COPY_ENGINE) != 0, &a->src);
    fill_side(dst, begin, (d->job.flags & KVD_LAUNCH_COPY_ENGINE) != 0, &a->dst);
    a->num_layers = count;
    a->src_idx = si.ptr;
    a->dst_idx = di.ptr;
    a->idx_dtype = si.dtype;
    a->count = si.count;
    a->row_bytes = (int64_t)src->slot_bytes;
    d->rows = (uint64_t)si.count;
    d->rows_valid = (uint64_t)(si.valid < di.valid ? si.valid : di.valid);
    d->row_bytes = src->slot_bytes * (src->mla ? 1 : 2) * count;
    return submit(r, d);
}

/* ---- entry points ---------------------------------------------------------- */

static kvd_status_t run(kvd_req_t *r, kvd_status_t (*fn)(kvd_req_t *, dataop_t *))
{
    dataop_t *d = dataop_create(r);
    kvd_status_t st;

    if (d == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    st = fn(r, d);
    if (st != KVD_OK)
        dataop_destroy(d); /* nothing was launched */
    return st;
}

kvd_status_t kvd__op_store(kvd_req_t *r)
{
    return run(r, do_store);
}

kvd_status_t kvd__op_fp8_set(kvd_req_t *r)
{
    return run(r, do_fp8_set);
}

kvd_status_t kvd__op_gather(kvd_req_t *r)
{
    return run(r, do_gather);
}

kvd_status_t kvd__op_transfer(kvd_req_t *r)
{
    return run(r, do_transfer);
}
