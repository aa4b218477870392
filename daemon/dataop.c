/* A data operation in flight: see dataop.h. */
#include "dataop.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static void dataop_destroy(kvd__dataop_t *d)
{
    kvd__backend_t *be = d->origin.srv->backend;
    int i;

    for (i = 0; i < d->nrefs; i++)
        kvd__obj_unref(&d->origin.srv->reg, d->refs[i]);
    for (i = 0; i < d->nstaging; i++)
        be->staging_free(be, d->staging[i], d->staging_bytes[i]);
    free(d->more);
    free(d);
}

kvd__dataop_t *kvd__dataop_new(const kvd__origin_t *o)
{
    kvd__dataop_t *d = calloc(1, sizeof(*d));

    if (d == NULL)
        return NULL;
    d->origin = *o;
    d->origin.held = 0;
    d->njobs = 1;
    return d;
}

void kvd__dataop_free(kvd__dataop_t *d)
{
    if (d != NULL)
        dataop_destroy(d);
}

kvd_status_t kvd__dataop_more(kvd__dataop_t *d, uint32_t n)
{
    if (n < 1)
        n = 1;
    free(d->more);
    d->more = n > 1 ? calloc(n - 1, sizeof(*d->more)) : NULL;
    if (n > 1 && d->more == NULL) {
        d->njobs = 1;
        return KVD_ENOMEM;
    }
    d->njobs = n;
    return KVD_OK;
}

kvd_status_t kvd__dataop_jobs(kvd__req_t *r, kvd__dataop_t *d, uint32_t n)
{
    if (kvd__dataop_more(d, n) != KVD_OK)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    return KVD_OK;
}

kvd__job_t *kvd__dataop_job(kvd__dataop_t *d, uint32_t i)
{
    return i == 0 ? &d->job : &d->more[i - 1];
}

void kvd__hold(kvd__dataop_t *d, kvd__obj_t *o)
{
    /* callers never name more than KVD_DATAOP_MAX_REFS objects */
    kvd__obj_ref(o);
    d->refs[d->nrefs++] = o;
}

void kvd__dataop_sync_keep(kvd__dataop_sync_t *k, const kvd__dataop_t *d)
{
    k->nrefs = 0;
    for (int i = 0; i < d->nrefs; i++) {
        kvd__obj_ref(d->refs[i]);
        k->refs[k->nrefs++] = d->refs[i];
    }
    k->sclass = d->job.sclass;
    k->path = d->path;
    k->reply_at_enqueue = d->reply_at_enqueue;
    k->launch_flags = d->job.flags;
    k->max_blocks = d->job.max_blocks;
    k->wait_event = d->job.wait_event;
    k->record_event = d->job.record_event;
}

void kvd__dataop_sync_apply(const kvd__dataop_sync_t *k, kvd__dataop_t *d)
{
    for (int i = 0; i < k->nrefs; i++)
        kvd__hold(d, k->refs[i]);
    d->job.sclass = k->sclass;
    d->job.flags = k->launch_flags;
    d->job.max_blocks = k->max_blocks;
    d->job.wait_event = k->wait_event;
    d->path = k->path;
}

void kvd__dataop_sync_release(kvd__dataop_sync_t *k, kvd__registry_t *reg)
{
    for (int i = 0; i < k->nrefs; i++)
        kvd__obj_unref(reg, k->refs[i]);
    k->nrefs = 0;
}

void *kvd__stage(kvd__req_t *r, kvd__dataop_t *d, const void *src, size_t n)
{
    return kvd__dataop_stage(d, src, n, r->msg, sizeof(r->msg));
}

void *kvd__dataop_stage(kvd__dataop_t *d, const void *src, size_t n, char *why, size_t why_len)
{
    kvd__backend_t *be = d->origin.srv->backend;
    char bwhy[200] = "";
    void *p = NULL;

    if (d->nstaging == KVD_DATAOP_MAX_STAGING) {
        d->stage_status = KVD_EINTERNAL;
        snprintf(why, why_len, "too many staged operands");
        return NULL;
    }
    d->stage_status = be->staging_alloc(be, n, &p, bwhy, sizeof(bwhy));
    if (d->stage_status != KVD_OK) {
        snprintf(why, why_len, "staging %zu bytes: %s", n, bwhy);
        return NULL;
    }
    if (n && src != NULL)
        memcpy(p, src, n);
    d->staging[d->nstaging] = p;
    d->staging_bytes[d->nstaging] = n;
    d->nstaging++;
    return p;
}

kvd_status_t kvd__get_pool(kvd__req_t *r, kvd__dataop_t *d, uint64_t id, const char *what,
                             kvd__pool_t **out)
{
    kvd__obj_t *o = kvd__registry_get(&r->srv->reg, id, KVD_OBJ_POOL);

    if (o == NULL)
        return kvd__req_fail(r, KVD_ENOENT, "%s: no pool %" PRIu64, what, id);
    if (kvd__obj_may_use(o, r->conn->id) != KVD_OK)
        return kvd__req_fail(r, KVD_EPERM, "%s: pool %" PRIu64 " belongs to another client", what,
                         id);
    kvd__hold(d, o);
    *out = (kvd__pool_t *)o;
    return KVD_OK;
}

/* need bytes at a buffer's offset, aligned to align. */
kvd_status_t kvd__get_bufref(kvd__req_t *r, kvd__dataop_t *d, const Kvdock__BufRef *b,
                             uint64_t need, uint64_t align, const char *what, void **ptr,
                             int *on_device)
{
    kvd__buffer_t *buf;
    kvd__obj_t *o;
    uint64_t len;

    if (b == NULL)
        return kvd__req_fail(r, KVD_ENULL, "%s: a buffer reference is required", what);
    o = kvd__registry_get(&r->srv->reg, b->buffer, KVD_OBJ_BUFFER);
    if (o == NULL)
        return kvd__req_fail(r, KVD_ENOENT, "%s: no buffer %" PRIu64, what, b->buffer);
    if (kvd__obj_may_use(o, r->conn->id) != KVD_OK)
        return kvd__req_fail(r, KVD_EPERM, "%s: buffer %" PRIu64 " belongs to another client", what,
                         b->buffer);
    buf = (kvd__buffer_t *)o;
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
    kvd__hold(d, o);
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

static kvd_status_t check_inline(kvd__req_t *r, const void *vals, size_t n, int is64,
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
kvd_status_t kvd__get_indices(kvd__req_t *r, kvd__dataop_t *d, const Kvdock__Indices *ix,
                                int64_t bound, const char *what, kvd__idx_t *out)
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
        out->ptr = kvd__stage(r, d, vals, bytes);
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
        st = kvd__get_bufref(r, d, ix->buffer, need, esize, what, &p, &out->on_device);
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
kvd_status_t kvd__widen(kvd__req_t *r, kvd__dataop_t *d, kvd__idx_t *x)
{
    const int32_t *v = x->ptr;
    int64_t *w;

    w = kvd__stage(r, d, NULL, (size_t)x->count * sizeof(int64_t));
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
kvd_status_t kvd__get_data(kvd__req_t *r, kvd__dataop_t *d, const Kvdock__Data *dd, uint64_t need,
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
        *ptr = kvd__stage(r, d, dd->inline_.data, (size_t)need);
        if (*ptr == NULL && need > 0)
            return d->stage_status;
        return KVD_OK;
    }
    {
        void *p;
        kvd_status_t st = kvd__get_bufref(r, d, dd->buffer, need, align, what, &p, NULL);
        if (st == KVD_OK)
            *ptr = p;
        return st;
    }
}

kvd_status_t kvd__get_event(kvd__req_t *r, kvd__dataop_t *d, uint64_t id, const char *what,
                              void **ev)
{
    kvd__obj_t *o;

    *ev = NULL;
    if (id == 0)
        return KVD_OK;
    o = kvd__registry_get(&r->srv->reg, id, KVD_OBJ_EVENT);
    if (o == NULL)
        return kvd__req_fail(r, KVD_ENOENT, "%s: no event %" PRIu64, what, id);
    if (kvd__obj_may_use(o, r->conn->id) != KVD_OK)
        return kvd__req_fail(r, KVD_EPERM, "%s: event %" PRIu64 " belongs to another client",
                         what, id);
    kvd__hold(d, o);
    *ev = ((kvd__event_t *)o)->ev;
    return KVD_OK;
}

kvd_status_t kvd__get_sync(kvd__req_t *r, kvd__dataop_t *d, int sclass, int is_transfer)
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
    if ((st = kvd__get_event(r, d, s->wait_event, "sync.wait_event", &d->job.wait_event)) !=
            KVD_OK ||
        (st = kvd__get_event(r, d, s->record_event, "sync.record_event",
                             &d->job.record_event)) != KVD_OK)
        return st;
    d->job.max_blocks = s->max_blocks;
    d->reply_at_enqueue = s->reply_at_enqueue;
    return KVD_OK;
}

int kvd__stream_path(const kvd__options_t *o, int sclass)
{
    return kvd__default_path(o, sclass == KVD_STREAM_RELOAD ? KVD_MEM_HOST : KVD_MEM_DEVICE,
                             sclass == KVD_STREAM_OFFLOAD ? KVD_MEM_HOST : KVD_MEM_DEVICE);
}

int kvd__default_path(const kvd__options_t *o, int src_kind, int dst_kind)
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
kvd_status_t kvd__choose_path(kvd__req_t *r, kvd__dataop_t *d, int src_kind, int dst_kind,
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

static uint64_t written_bytes(const kvd__dataop_t *d, kvd_status_t st)
{
    uint64_t rows = d->rows_valid > d->skipped_oob ? d->rows_valid - d->skipped_oob : 0;

    return st == KVD_OK ? rows * d->row_bytes : 0;
}

static void send_op_reply(kvd__dataop_t *d, kvd_status_t st, const char *msg, int enqueued)
{
    Kvdock__OpReply op = KVDOCK__OP_REPLY__INIT;
    uint64_t bytes = enqueued ? 0 : written_bytes(d, st);

    op.rows = d->rows;
    op.skipped_oob = enqueued ? 0 : d->skipped_oob;
    op.enqueued = enqueued;
    op.path = (Kvdock__CopyPath)(d->path == KVD_PATH_DEFAULT ? KVD_PATH_KERNEL : d->path);
    if (!enqueued && d->finish != NULL)
        d->finish(d, st, &op, &bytes);
    op.bytes = bytes;
    if (d->silent_done != NULL) {
        if (!enqueued)
            d->silent_done(d->silent_arg, st);
        return;
    }
    kvd__reply_deferred(&d->origin, st, msg, &op, bytes);
}

/* A job's work is on the device, its events recorded: once every job's is,
 * a reply at enqueue may go. */
static void job_issued(kvd__job_t *job)
{
    kvd__dataop_t *d = job->owner;

    if (--d->to_issue == 0 && !d->replied) {
        d->replied = 1;
        send_op_reply(d, KVD_OK, NULL, 1);
    }
}

/* The loop thread, as each job completes: the last one ends the operation. */
static void job_done(kvd__job_t *job)
{
    kvd__dataop_t *d = job->owner;
    kvd__conn_t *c = d->origin.conn;

    d->skipped_oob += job->skipped_oob;
    if (job->status != KVD_OK && d->status == KVD_OK) {
        d->status = job->status;
        snprintf(d->detail, sizeof(d->detail), "%s", job->detail);
    }
    if (--d->pending > 0)
        return;
    kvd__stats_stream_leave(&d->origin.srv->stats, d->job.sclass, written_bytes(d, d->status),
                            d->path == KVD_PATH_COPY_ENGINE, kvd__now_ns());
    if (!d->replied) {
        send_op_reply(d, d->status, d->detail, 0);
    } else {
        uint64_t bytes = 0;
        Kvdock__OpReply op = KVDOCK__OP_REPLY__INIT;

        if (d->finish != NULL)
            d->finish(d, d->status, &op, &bytes);
        if (d->status != KVD_OK)
            kvd_log(KVD_LOG_WARN, "event=op_failed_after_reply client=%" PRIu64 " id=%" PRIu64
                    " status=%s detail=\"%s\"", c->id, d->origin.req_id, kvd_err_name(d->status),
                    d->detail);
    }
    dataop_destroy(d);
    kvd__conn_op_end(c);
}

kvd_status_t kvd__dataop_submit(kvd__dataop_t *d, char *why, size_t why_len)
{
    kvd__backend_t *be = d->origin.srv->backend;
    kvd_status_t st = KVD_OK;
    uint32_t i;

    if (d->njobs > 1) { /* recorded once the last job is done */
        kvd__dataop_job(d, d->njobs - 1)->record_event = d->job.record_event;
        d->job.record_event = NULL;
    }
    for (i = 0; i < d->njobs; i++) {
        kvd__job_t *job = kvd__dataop_job(d, i);

        job->done = job_done;
        job->issued = d->reply_at_enqueue ? job_issued : NULL;
        job->owner = d;
        job->after = i > 0 ? kvd__dataop_job(d, i - 1) : NULL;
        if (i > 0) { /* the request's settings; it waits before the first */
            job->sclass = d->job.sclass;
            job->max_blocks = d->job.max_blocks;
            job->flags = d->job.flags;
        }
        st = be->submit(be, job);
        if (st != KVD_OK)
            break;
        d->pending++;
        d->to_issue += job->issue_later != 0;
    }
    if (d->pending == 0) {
        snprintf(why, why_len, "%s", d->job.detail[0] ? d->job.detail : "cannot submit the work");
        return st != KVD_OK ? st : KVD_EINTERNAL;
    }
    if (st != KVD_OK) {
        /* the jobs before it run; the reply says what failed */
        d->status = st;
        snprintf(d->detail, sizeof(d->detail), "job %u of %u could not be submitted: %s", i + 1,
                 d->njobs, kvd_strerror(st));
    }
    d->submitted = 1;
    kvd__conn_op_begin(d->origin.conn);
    kvd__stats_stream_enter(&d->origin.srv->stats, d->job.sclass, kvd__now_ns());
    if (d->reply_at_enqueue && d->to_issue == 0) {
        d->replied = 1;
        send_op_reply(d, KVD_OK, NULL, 1);
    }
    return KVD_OK;
}

/* Submit a validated job; on error the caller still owns d. */
kvd_status_t kvd__submit(kvd__req_t *r, kvd__dataop_t *d)
{
    kvd_status_t st = kvd__dataop_submit(d, r->msg, sizeof(r->msg));

    if (st == KVD_OK)
        r->deferred = 1;
    return st;
}

char *kvd__layer_k(const kvd__pool_t *p, uint32_t l)
{
    if (p->imported)
        return (char *)(uintptr_t)p->k_addr[l];
    return (char *)p->mem->ptr + (uint64_t)l * p->layer_stride;
}

char *kvd__layer_v(const kvd__pool_t *p, uint32_t l)
{
    if (p->mla)
        return NULL;
    if (p->imported)
        return (char *)(uintptr_t)p->v_addr[l];
    return (char *)p->mem->ptr + (uint64_t)l * p->layer_stride + p->v_offset;
}


/* (n - 1) * stride + last, or 0 for n == 0; -1 on overflow. */
int kvd__rows_extent(uint64_t n, uint64_t stride, uint64_t last, uint64_t *out)
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

/* An imported pool's layers are scattered: the kernels read their addresses
 * from the backend's tables (device memory on cuda), the copy engines from
 * the host arrays. */
void kvd__fill_side(const kvd__pool_t *p, uint32_t begin, int copy_engine, kvd_kv_side_t *s)
{
    memset(s, 0, sizeof(*s));
    if (p->imported) {
        const uint64_t *k = copy_engine ? p->k_addr : (const uint64_t *)p->k_table;
        const uint64_t *v = copy_engine ? p->v_addr : (const uint64_t *)p->v_table;

        s->k_layers = k + begin;
        s->v_layers = p->mla ? NULL : v + begin;
    } else {
        s->k = kvd__layer_k(p, begin);
        s->v = kvd__layer_v(p, begin);
        s->layer_stride = (int64_t)p->layer_stride;
    }
    s->slot_stride = (int64_t)p->slot_stride;
    s->num_slots = (int64_t)p->num_slots;
}

kvd_status_t kvd__dataop_run(kvd__req_t *r, kvd_status_t (*fn)(kvd__req_t *, kvd__dataop_t *))
{
    kvd__origin_t origin = kvd__origin_of(r);
    kvd__dataop_t *d = kvd__dataop_new(&origin);
    kvd_status_t st;

    if (d == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    st = fn(r, d);
    if (st != KVD_OK || !d->submitted) { /* nothing was launched */
        if (d->finish != NULL) {
            Kvdock__OpReply op = KVDOCK__OP_REPLY__INIT;
            uint64_t bytes = 0;
            d->finish(d, st, &op, &bytes);
        }
        dataop_destroy(d);
    }
    return st;
}
