/* Buffer operations: register and drop. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "log.h"

/* A buffer whose reply could not be sent: the client was told the
 * register failed and never learned the id, so the buffer goes now rather
 * than stay charged to it until it closes. */
static void buffer_unsent(kvd__req_t *r)
{
    kvd__obj_t *o = kvd__registry_get(&r->srv->reg, r->resp.buffer->id, KVD_OBJ_BUFFER);

    if (o != NULL)
        kvd__registry_drop(&r->srv->reg, o);
}

kvd_status_t kvd__op_buffer_register(kvd__req_t *r)
{
    const Kvdock__BufferRegister *br = r->req->buffer_register;
    kvd__backend_t *be = r->srv->backend;
    Kvdock__BufferInfo *bi;
    kvd__buffer_t *b;
    char why[160] = "";
    kvd_status_t st;

    if (br->bytes == 0)
        return kvd__req_fail(r, KVD_EINVAL, "bytes must be >= 1");
    if (br->bytes > (uint64_t)INT64_MAX / 2)
        return kvd__req_fail(r, KVD_EOVERFLOW, "bytes is too large");
    if (br->kind != KVDOCK__MEM_KIND__MEM_HOST && br->kind != KVDOCK__MEM_KIND__MEM_DEVICE)
        return kvd__req_fail(r, KVD_EINVAL, "kind must be MEM_HOST or MEM_DEVICE");
    if (strlen(br->name) >= KVD_NAME_MAX)
        return kvd__req_fail(r, KVD_EINVAL, "name is longer than %d bytes", KVD_NAME_MAX - 1);
    if (br->name[0] != '\0' && !kvd__pool_name_valid(br->name))
        return kvd__req_fail(r, KVD_EINVAL, "a buffer name is empty or up to 63 characters of "
                             "[A-Za-z0-9._-]");
    if (r->conn->owner.buffers >= r->srv->opts.max_buffers)
        return kvd__req_fail(r, KVD_ELIMIT, "this client has %u buffers already (max-buffers)",
                         r->conn->owner.buffers);
    if ((st = kvd__check_mem_limits(r, br->bytes)) != KVD_OK)
        return st;

    b = calloc(1, sizeof(*b));
    bi = kvd__req_alloc(r, sizeof(*bi));
    if (b == NULL || bi == NULL) {
        free(b);
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    }
    if (br->kind == KVDOCK__MEM_KIND__MEM_HOST &&
        (st = kvd__reserve_host(r, &b->obj, KVD_HM_BUFFERS, br->bytes, "host buffer")) !=
            KVD_OK) {
        free(b);
        return st;
    }
    st = be->mem_create(be, (int)br->kind, br->bytes, br->name[0] ? br->name : "buffer", &b->mem,
                        why, sizeof(why));
    if (st != KVD_OK) {
        kvd__unreserve_host(r, &b->obj);
        free(b);
        return kvd__req_fail(r, st, "cannot allocate %" PRIu64 " bytes: %s", br->bytes, why);
    }
    b->obj.type = KVD_OBJ_BUFFER;
    b->obj.bytes = br->bytes;
    b->kind = (int)br->kind;
    b->bytes = br->bytes;
    snprintf(b->name, sizeof(b->name), "%s", br->name);
    if (kvd__registry_add(&r->srv->reg, &b->obj, &r->conn->owner) != KVD_OK) {
        be->mem_destroy(be, &b->mem);
        kvd__unreserve_host(r, &b->obj);
        free(b);
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    }
    kvdock__buffer_info__init(bi);
    bi->id = b->obj.id;
    bi->bytes = b->bytes;
    bi->kind = (Kvdock__MemKind)b->kind;
    bi->name = b->name;
    bi->fd_index = -1;
    if (b->mem->has_ipc) {
        bi->cuda_ipc_handle.data = b->mem->ipc;
        bi->cuda_ipc_handle.len = KVD_IPC_HANDLE_BYTES;
    }
    if (b->mem->fd >= 0) {
        bi->fd_index = 0;
        r->reply_fds[0] = b->mem->fd;
        r->n_reply_fds = 1;
    }
    r->unsent = buffer_unsent;
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_BUFFER;
    r->resp.buffer = bi;
    kvd_log(KVD_LOG_DEBUG, "event=buffer_register client=%" PRIu64 " buffer=%" PRIu64
            " bytes=%" PRIu64, r->conn->id, b->obj.id, b->bytes);
    return KVD_OK;
}

kvd_status_t kvd__op_buffer_drop(kvd__req_t *r)
{
    return kvd__req_drop_obj(r, r->req->buffer_drop->buffer, KVD_OBJ_BUFFER, "buffer");
}
