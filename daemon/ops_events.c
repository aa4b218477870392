/* Interprocess event operations: register and drop (cuda backend). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "log.h"

kvd_status_t kvd__op_event_register(kvd__req_t *r)
{
    const Kvdock__EventRegister *er = r->req->event_register;
    kvd__backend_t *be = r->srv->backend;
    Kvdock__EventInfo *ei;
    kvd__event_t *e;
    kvd__obj_t *o;
    char why[160] = "";
    kvd_status_t st;

    if (er->cuda_ipc_event_handle.len != KVD_IPC_HANDLE_BYTES)
        return kvd__req_fail(r, KVD_EINVAL, "a CUDA IPC event handle is %d bytes, not %zu",
                         KVD_IPC_HANDLE_BYTES, er->cuda_ipc_event_handle.len);
    /* one registration per handle and client */
    for (o = r->conn->owner.head; o; o = o->onext) {
        if (o->type == KVD_OBJ_EVENT &&
            memcmp(((kvd__event_t *)o)->handle, er->cuda_ipc_event_handle.data,
                   KVD_IPC_HANDLE_BYTES) == 0)
            return kvd__req_fail(r, KVD_EEXIST, "this event is registered already as %" PRIu64,
                             o->id);
    }
    if (r->conn->owner.events >= r->srv->opts.max_buffers)
        return kvd__req_fail(r, KVD_ELIMIT, "this client has %u events already (max-buffers)",
                         r->conn->owner.events);
    e = calloc(1, sizeof(*e));
    ei = kvd__req_alloc(r, sizeof(*ei));
    if (e == NULL || ei == NULL) {
        free(e);
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    }
    st = be->event_open(be, er->cuda_ipc_event_handle.data, er->cuda_ipc_event_handle.len,
                        &e->ev, why, sizeof(why));
    if (st != KVD_OK) {
        free(e);
        return kvd__req_fail(r, st, "%s", why);
    }
    e->obj.type = KVD_OBJ_EVENT;
    memcpy(e->handle, er->cuda_ipc_event_handle.data, KVD_IPC_HANDLE_BYTES);
    if (kvd__registry_add(&r->srv->reg, &e->obj, &r->conn->owner) != KVD_OK) {
        be->event_close(be, e->ev);
        free(e);
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    }
    kvdock__event_info__init(ei);
    ei->id = e->obj.id;
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_EVENT;
    r->resp.event = ei;
    return KVD_OK;
}

kvd_status_t kvd__op_event_drop(kvd__req_t *r)
{
    return kvd__req_drop_obj(r, r->req->event_drop->event, KVD_OBJ_EVENT, "event");
}
