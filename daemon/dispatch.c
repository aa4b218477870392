/* The dispatch table and the checks every operation shares: see dispatch.h. */
#include "dispatch.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "account.h"
#include "log.h"
#include "park.h"

/* One row per operation (op_list.h): existence, hello-first, permission
 * and Sync are checked from these flags before the handler runs. */
const kvd__op_def_t kvd__op_table[] = {
#define KVD_OP_ROW_(name, OP, flags) {KVDOCK__REQUEST__OP_##OP, kvd__op_##name, flags},
    KVD_OPS(KVD_OP_ROW_)
#undef KVD_OP_ROW_
};
const size_t kvd__op_count = sizeof(kvd__op_table) / sizeof(kvd__op_table[0]);

/* Packed numeric fields other than index arrays (scales, uids, events)
 * decode within this much even with --max-inline-bytes 0. */
#define MIN_PACKED_BYTES (64u << 10)

const char *kvd__op_row_name(size_t i)
{
    return i < kvd__op_count ? kvd__op_name(kvd__op_table[i].op_case) : "unknown";
}

static size_t find_op(int op_case)
{
    size_t i;

    for (i = 0; i < kvd__op_count; i++)
        if (kvd__op_table[i].op_case == op_case)
            return i;
    return kvd__op_count;
}

kvd_status_t kvd__req_fail(kvd__req_t *r, kvd_status_t st, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
    va_end(ap);
    return st;
}

void *kvd__req_alloc(kvd__req_t *r, size_t bytes)
{
    return kvd__arena_alloc(r->arena, bytes);
}

kvd_status_t kvd__req_drop_obj(kvd__req_t *r, uint64_t id, kvd__obj_type_t type, const char *what)
{
    kvd__obj_t *o = kvd__registry_get(&r->srv->reg, id, type);

    if (o == NULL)
        return kvd__req_fail(r, KVD_ENOENT, "no %s %" PRIu64, what, id);
    if (kvd__obj_may_drop(o, r->conn->id, r->conn->uid, r->conn->admin) != KVD_OK)
        return kvd__req_fail(r, KVD_EPERM, "%s %" PRIu64 " belongs to another client", what, id);
    kvd__registry_drop(&r->srv->reg, o);
    return KVD_OK;
}

/* Send resp (with fds) and count it; 0 when it could not be queued and a
 * smaller error reply went instead. */
static int send_and_count(kvd__conn_t *c, Kvdock__Response *resp, size_t op_index,
                          uint64_t t_start_ns, uint64_t bytes, const int *fds, int nfds)
{
    kvd__server_t *srv = c->srv;
    kvd_status_t st = kvd__conn_send(c, &resp->base, fds, nfds);

    if (st != KVD_OK && resp->status == KVD_OK) {
        /* the reply did not fit in memory, or its descriptor found no
         * number: say so in a smaller one */
        Kvdock__Response err = KVDOCK__RESPONSE__INIT;
        err.id = resp->id;
        err.status = st == KVD_ELIMIT ? KVD_ELIMIT : KVD_ENOMEM;
        err.message = st == KVD_ELIMIT ? (char *)"no file descriptor left to pass the reply's "
                                                 "descriptor (the daemon's RLIMIT_NOFILE)"
                                       : (char *)"reply could not be built";
        (void)kvd__conn_send(c, &err.base, NULL, 0);
        resp->status = err.status;
    }
    kvd__stats_op(&srv->stats, op_index, (int)resp->status, bytes, kvd__now_ns() - t_start_ns);
    return st == KVD_OK;
}

kvd__origin_t kvd__origin_of(const kvd__req_t *r)
{
    kvd__origin_t o = {r->srv, r->conn, r->req->id, r->op_index, r->t_start_ns, 0};

    return o;
}

void kvd__reply_deferred_response(const kvd__origin_t *o, Kvdock__Response *resp)
{
    resp->id = o->req_id;
    send_and_count(o->conn, resp, o->op_index, o->t_start_ns, 0, NULL, 0);
}

void kvd__reply_error(kvd__conn_t *c, uint64_t id, kvd_status_t st, const char *msg)
{
    Kvdock__Response resp = KVDOCK__RESPONSE__INIT;

    resp.id = id;
    resp.status = (uint32_t)st;
    resp.message = (char *)(msg ? msg : kvd_strerror(st));
    (void)kvd__conn_send(c, &resp.base, NULL, 0);
    kvd__stats_op(&c->srv->stats, kvd__op_count, (int)st, 0, 0);
}

void kvd__reply_deferred(const kvd__origin_t *o, kvd_status_t st, const char *msg,
                         Kvdock__OpReply *op, uint64_t bytes)
{
    Kvdock__Response resp = KVDOCK__RESPONSE__INIT;

    resp.id = o->req_id;
    resp.status = (uint32_t)st;
    if (st != KVD_OK) {
        resp.message = (char *)(msg && msg[0] ? msg : kvd_strerror(st));
    } else if (op != NULL) {
        resp.result_case = KVDOCK__RESPONSE__RESULT_OP;
        resp.op = op;
    }
    send_and_count(o->conn, &resp, o->op_index, o->t_start_ns, bytes, NULL, 0);
}

/* Sync carries something (a client may send an empty one anywhere). */
static int sync_set(const Kvdock__Sync *s)
{
    return s != NULL && (s->wait_event || s->record_event || s->reply_at_enqueue ||
                         s->stream != KVDOCK__STREAM_CLASS__STREAM_DEFAULT || s->max_blocks ||
                         s->copy_engine);
}

static kvd_status_t precheck(kvd__req_t *r, const kvd__op_def_t *op)
{
    kvd__conn_t *c = r->conn;

    if (r->srv->shutting_down)
        return kvd__req_fail(r, KVD_ESHUTDOWN, "the daemon is shutting down");
    if ((op->flags & KVD_OPF_HELLO) && !c->hello_done)
        return kvd__req_fail(r, KVD_EPROTO, "%s before hello: the first request must be hello",
                         kvd__op_name(op->op_case));
    if ((op->flags & KVD_OPF_ADMIN) && !c->admin)
        return kvd__req_fail(r, KVD_EPERM, "%s needs an admin peer (uid %u is not)",
                             kvd__op_name(op->op_case), (unsigned)c->uid);
    if (!(op->flags & KVD_OPF_DATA) && sync_set(r->req->sync))
        return kvd__req_fail(r, KVD_EINVAL, "sync applies to data operations only, not %s",
                         kvd__op_name(op->op_case));
    return KVD_OK;
}

/* Handle one frame: a new one (replay_deadline_ns 0), or a waiting
 * request's run again from t_start_ns (park.h). */
static int handle_frame(kvd__conn_t *c, const uint8_t *payload, size_t len, int *fds, int nfds,
                        uint64_t t_start_ns, uint64_t replay_deadline_ns)
{
    kvd__server_t *srv = c->srv;
    kvd__wire_limits_t lim = {KVD_MAX_REPEATED, srv->opts.max_inline_bytes};
    Kvdock__Request *req;
    kvd__req_t r;
    const kvd__op_def_t *op;
    kvd_status_t st;
    kvd__arena_t arena;
    ProtobufCAllocator pa;
    uint64_t need, id;
    char field[128], why[200];
    int i, bad;

    /* Measured from the wire before anything is allocated for it: a
     * repeated field past its limit is refused here, and the decoder
     * allocates from an arena charged to the client, capped at the
     * measure. */
    if (lim.max_packed_bytes < MIN_PACKED_BYTES)
        lim.max_packed_bytes = MIN_PACKED_BYTES;
    st = kvd__wire_measure(&kvdock__request__descriptor, payload, len, &lim, &need, &id, why,
                           sizeof(why));
    if (st == KVD_OK) {
        kvd__arena_init(&arena, c);
        arena.cap = need;
        kvd__arena_pb_allocator(&arena, &pa);
        req = kvdock__request__unpack(&pa, len, payload);
        if (req == NULL && arena.refusal != KVD_OK) {
            st = arena.refusal;
            snprintf(why, sizeof(why), "%s", arena.why);
            if (st == KVD_EINTERNAL)
                kvd_log(KVD_LOG_WARN, "event=decode_past_measure client=%" PRIu64 " bytes=%zu "
                        "measure=%" PRIu64, c->id, len, need);
        } else if (req == NULL) {
            st = KVD_EPROTO;
        }
        if (req == NULL)
            kvd__arena_deinit(&arena);
    }
    if (st != KVD_OK) {
        for (i = 0; i < nfds; i++)
            close(fds[i]);
        if (st == KVD_EPROTO) {
            kvd__reply_error(c, 0, KVD_EPROTO, "request frame does not decode");
            return -1;
        }
        /* well framed, but refused whole: the connection goes on */
        c->requests += replay_deadline_ns == 0;
        kvd__reply_error(c, id, st, why);
        return 0;
    }
    arena.cap = UINT64_MAX; /* the handler's allocations: charged as they come */
    c->requests += replay_deadline_ns == 0;

    memset(&r, 0, sizeof(r));
    r.srv = srv;
    r.conn = c;
    r.req = req;
    r.arena = &arena;
    r.fds = fds;
    r.nfds = nfds;
    r.t_start_ns = t_start_ns;
    r.replayed = replay_deadline_ns != 0;
    r.op_index = find_op((int)req->op_case);
    kvdock__response__init(&r.resp);
    r.resp.id = req->id;

    if ((bad = kvd__wire_bad_string(&kvdock__request__descriptor, payload, len, field,
                                   sizeof(field))) > 0) {
        /* the decoder cut that string at its NUL: refuse it whole */
        st = kvd__req_fail(&r, KVD_EINVAL, bad == KVD_WIRE_STR_NUL
                                               ? "%s holds a NUL byte (names and text are "
                                                 "refused, not cut)"
                                               : "%s is not valid UTF-8", field);
    } else if (r.op_index == kvd__op_count) {
        if (req->op_case == KVDOCK__REQUEST__OP__NOT_SET)
            st = kvd__req_fail(&r, KVD_EUNKNOWNOP, "the request names no operation this daemon "
                               "knows (none set, or one newer than protocol version %u)",
                               KVD_PROTOCOL_VERSION);
        else
            st = kvd__req_fail(&r, KVD_EUNKNOWNOP, "unknown operation (field %d)",
                               (int)req->op_case);
    } else {
        op = &kvd__op_table[r.op_index];
        st = precheck(&r, op);
        if (st == KVD_OK)
            st = op->handler(&r);
        if (st != KVD_OK && arena.refusal != KVD_OK) {
            /* what failed was memory for the request: say which limit */
            st = arena.refusal;
            snprintf(r.msg, sizeof(r.msg), "%s", arena.why);
        }
        if (st == KVD_EBUSY && r.park != NULL) {
            kvd__origin_t o = kvd__origin_of(&r);

            if (kvd__park(r.park, &o, payload, len, replay_deadline_ns, r.park_need, r.msg) ==
                KVD_OK) {
                st = KVD_OK; /* it waits: the reply comes when it runs again */
                r.deferred = 1;
            }
        }
    }

    for (i = 0; i < nfds; i++)
        if (fds[i] >= 0)
            close(fds[i]);

    if (st != KVD_OK || !r.deferred) {
        if (st != KVD_OK) {
            r.resp.status = (uint32_t)st;
            r.resp.message = r.msg[0] ? r.msg : (char *)kvd_strerror(st);
            if (r.resp.result_case != KVDOCK__RESPONSE__RESULT_HELLO)
                r.resp.result_case = KVDOCK__RESPONSE__RESULT__NOT_SET;
            r.n_reply_fds = 0;
            if (kvd__log_level >= KVD_LOG_DEBUG) {
                char q[300];
                kvd_log(KVD_LOG_DEBUG, "event=request_error client=%" PRIu64 " id=%" PRIu64
                        " op=%s status=%s msg=%s", c->id, req->id,
                        kvd__op_row_name(r.op_index),
                        kvd_err_name(st), kvd__log_quote(r.msg, q, sizeof(q)));
            }
        }
        if (!send_and_count(c, &r.resp, r.op_index, r.t_start_ns, 0, r.reply_fds,
                            r.n_reply_fds) &&
            st == KVD_OK && r.unsent != NULL)
            r.unsent(&r);
    }
    kvd__arena_deinit(&arena); /* the request and every allocation of its handler */
    if (r.close_after)
        kvd__conn_close_after_flush(c, "closed after error reply");
    return 0;
}

int kvd__dispatch_frame(kvd__conn_t *c, const uint8_t *payload, size_t len, int *fds, int nfds)
{
    return handle_frame(c, payload, len, fds, nfds, kvd__now_ns(), 0);
}

void kvd__dispatch_replay(kvd__conn_t *c, const uint8_t *payload, size_t len, uint64_t t_start_ns,
                          uint64_t deadline_ns)
{
    /* it decoded once: a frame that no longer does is refused, not fatal */
    (void)handle_frame(c, payload, len, NULL, 0, t_start_ns, deadline_ns);
}
