/*
 * Pools, buffers and events: create, export (and map), import, drop, list.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void kvd__pool_info_from_pb(kvd_pool_info_t *d, const Kvdock__PoolInfo *s)
{
    memset(d, 0, sizeof(*d));
    d->id = s->id;
    kvd__copy_str(d->name, sizeof(d->name), s->name);
    d->kind = (int32_t)s->kind;
    d->num_layers = s->num_layers;
    d->num_slots = s->num_slots;
    d->slot_bytes = s->slot_bytes;
    d->mla = s->mla != 0;
    d->page_size = s->page_size;
    d->shared = s->shared != 0;
    d->imported = s->imported != 0;
    d->bytes = s->bytes;
    d->layer_stride = s->layer_stride;
    d->v_offset = s->v_offset;
    d->slot_stride = s->slot_stride;
    d->owner = s->owner;
    d->orphaned = s->orphaned != 0;
}

/* ------------------------------------------------------------------------ */
/* Create, import                                                            */

static kvd_status_t pool_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    if (p->resp->result_case != KVDOCK__RESPONSE__RESULT_POOL || p->resp->pool == NULL)
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered %s without a PoolInfo",
                                kvd__op_name(p->op));
    if (p->out.pool.out != NULL)
        kvd__pool_info_from_pb(p->out.pool.out, p->resp->pool);
    return KVD_OK;
}

static kvd_status_t pool_create_go(kvd_client_t *cli, const kvd_pool_spec_t *spec,
                                   kvd_pool_info_t *out, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__PoolCreate pc = KVDOCK__POOL_CREATE__INIT;
    kvd__out_t o;

    if (cli == NULL || spec == NULL || spec->name == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client, spec or spec->name is NULL");
    memset(&o, 0, sizeof(o));
    o.pool.out = out;
    pc.name = (char *)spec->name;
    pc.kind = (Kvdock__MemKind)spec->kind;
    pc.num_layers = spec->num_layers;
    pc.num_slots = spec->num_slots;
    pc.slot_bytes = spec->slot_bytes;
    pc.mla = spec->mla;
    pc.page_size = spec->page_size;
    pc.shared = spec->shared;
    req.op_case = KVDOCK__REQUEST__OP_POOL_CREATE;
    req.pool_create = &pc;
    return kvd__call(cli, &req, NULL, 0, pool_finish, &o, req_id);
}

kvd_status_t kvd_pool_create(kvd_client_t *cli, const kvd_pool_spec_t *spec, kvd_pool_info_t *out)
{
    return pool_create_go(cli, spec, out, NULL);
}

kvd_status_t kvd_pool_create_submit(kvd_client_t *cli, const kvd_pool_spec_t *spec,
                                    kvd_pool_info_t *out, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return pool_create_go(cli, spec, out, req_id);
}

static kvd_status_t pool_import_go(kvd_client_t *cli, const kvd_pool_import_t *s,
                                   kvd_pool_info_t *out, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__PoolImport pi = KVDOCK__POOL_IMPORT__INIT;
    Kvdock__ImportRegion *regions = NULL, **region_ptrs = NULL;
    Kvdock__MemRef *refs = NULL, **k_ptrs = NULL, **v_ptrs = NULL;
    int fds[KVD_MAX_FDS_PER_FRAME];
    int nfds = 0;
    uint32_t nv;
    kvd__out_t o;
    kvd_status_t st;

    if (cli == NULL || s == NULL || s->name == NULL || s->regions == NULL || s->k_layers == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client, spec, name, regions or k_layers is NULL");
    if (s->num_regions == 0 || s->num_layers == 0)
        return kvd__client_fail(cli, KVD_EINVAL,
                                "an import needs at least one region and one layer");
    if (!s->mla && s->v_layers == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "an MHA import needs v_layers");
    nv = s->mla ? 0 : s->num_layers;
    for (uint32_t i = 0; i < s->num_regions; i++) {
        const kvd_import_region_t *r = &s->regions[i];

        if (r->kind == KVD_MEM_HOST || r->kind == KVD_MEM_DEVICE_VMM) {
            if (r->fd < 0)
                return kvd__client_fail(cli, KVD_EINVAL, "region %u (%s) has no descriptor", i,
                                        kvd_mem_kind_name(r->kind));
            if (nfds == KVD_MAX_FDS_PER_FRAME)
                return kvd__client_fail(cli, KVD_ELIMIT, "at most %d descriptor regions per import",
                                        KVD_MAX_FDS_PER_FRAME);
            fds[nfds++] = r->fd;
        } else if (r->kind != KVD_MEM_DEVICE) {
            return kvd__client_fail(cli, KVD_EINVAL, "region %u has an unknown kind %d", i,
                                    r->kind);
        }
    }

    regions = calloc(s->num_regions, sizeof(*regions));
    region_ptrs = calloc(s->num_regions, sizeof(*region_ptrs));
    refs = calloc((size_t)s->num_layers + nv, sizeof(*refs));
    k_ptrs = calloc(s->num_layers, sizeof(*k_ptrs));
    v_ptrs = calloc(nv ? nv : 1, sizeof(*v_ptrs));
    if (regions == NULL || region_ptrs == NULL || refs == NULL || k_ptrs == NULL ||
        v_ptrs == NULL) {
        st = kvd__client_fail(cli, KVD_ENOMEM, "out of memory");
        goto fail;
    }
    nfds = 0;
    for (uint32_t i = 0; i < s->num_regions; i++) {
        const kvd_import_region_t *r = &s->regions[i];

        kvdock__import_region__init(&regions[i]);
        regions[i].kind = (Kvdock__MemKind)r->kind;
        regions[i].bytes = r->bytes;
        regions[i].fd_index = -1;
        if (r->kind == KVD_MEM_DEVICE) {
            regions[i].cuda_ipc_handle.data = (uint8_t *)r->ipc_handle;
            regions[i].cuda_ipc_handle.len = KVD_IPC_HANDLE_BYTES;
        } else {
            regions[i].fd_index = nfds++;
        }
        region_ptrs[i] = &regions[i];
    }
    for (uint32_t l = 0; l < s->num_layers; l++) {
        kvdock__mem_ref__init(&refs[l]);
        refs[l].region = s->k_layers[l].region;
        refs[l].offset = s->k_layers[l].offset;
        k_ptrs[l] = &refs[l];
    }
    for (uint32_t l = 0; l < nv; l++) {
        Kvdock__MemRef *m = &refs[s->num_layers + l];

        kvdock__mem_ref__init(m);
        m->region = s->v_layers[l].region;
        m->offset = s->v_layers[l].offset;
        v_ptrs[l] = m;
    }
    pi.name = (char *)s->name;
    pi.num_layers = s->num_layers;
    pi.num_slots = s->num_slots;
    pi.slot_bytes = s->slot_bytes;
    pi.slot_stride = s->slot_stride;
    pi.mla = s->mla;
    pi.page_size = s->page_size;
    pi.shared = s->shared;
    pi.n_regions = s->num_regions;
    pi.regions = region_ptrs;
    pi.n_k_layers = s->num_layers;
    pi.k_layers = k_ptrs;
    pi.n_v_layers = nv;
    pi.v_layers = nv ? v_ptrs : NULL;
    memset(&o, 0, sizeof(o));
    o.pool.out = out;
    req.op_case = KVDOCK__REQUEST__OP_POOL_IMPORT;
    req.pool_import = &pi;
    st = kvd__call(cli, &req, fds, nfds, pool_finish, &o, req_id);

fail:
    free(regions);
    free(region_ptrs);
    free(refs);
    free(k_ptrs);
    free(v_ptrs);
    return st;
}

kvd_status_t kvd_pool_import(kvd_client_t *cli, const kvd_pool_import_t *spec, kvd_pool_info_t *out)
{
    return pool_import_go(cli, spec, out, NULL);
}

kvd_status_t kvd_pool_import_submit(kvd_client_t *cli, const kvd_pool_import_t *spec,
                                    kvd_pool_info_t *out, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return pool_import_go(cli, spec, out, req_id);
}

/* ------------------------------------------------------------------------ */
/* Export                                                                    */

static kvd_status_t export_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    const Kvdock__PoolExportReply *r =
        p->resp->result_case == KVDOCK__RESPONSE__RESULT_POOL_EXPORT ? p->resp->pool_export : NULL;
    kvd_mapping_t *m = NULL;
    kvd_pool_info_t info;
    uint64_t bytes;
    int32_t kind;
    kvd_status_t st;
    int fd = -1;

    if (r == NULL || r->pool == NULL)
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered pool_export without a reply");
    kvd__pool_info_from_pb(&info, r->pool);
    kind = info.kind;
    bytes = r->map_bytes != 0 ? r->map_bytes : info.bytes;
    if (kind == KVD_MEM_HOST || kind == KVD_MEM_DEVICE_VMM) {
        fd = kvd__take_fd(p, r->fd_index);
        if (fd < 0)
            return kvd__client_fail(
                cli, KVD_EPROTO,
                "export of pool %s came without its descriptor (fd_index %d, %d "
                "received)",
                info.name, r->fd_index, p->nfds);
    } else if (kind == KVD_MEM_DEVICE) {
        if (r->cuda_ipc_handle.len != KVD_IPC_HANDLE_BYTES)
            return kvd__client_fail(cli, KVD_EPROTO,
                                    "export of pool %s has an IPC handle of %zu bytes, not %d",
                                    info.name, r->cuda_ipc_handle.len, KVD_IPC_HANDLE_BYTES);
    } else {
        return kvd__client_fail(cli, KVD_EPROTO, "export of pool %s has unknown kind %d", info.name,
                                kind);
    }

    if (p->out.pexport.flags & KVD_EXPORT_NO_MAP)
        st = kvd__mapping_unmapped(cli, kind, fd, r->cuda_ipc_handle.data, r->cuda_ipc_handle.len,
                                   bytes, &m);
    else if (kind == KVD_MEM_DEVICE)
        st = kvd__mapping_from_ipc(cli, r->cuda_ipc_handle.data, r->cuda_ipc_handle.len, bytes,
                                   r->device_ordinal, &m);
    else
        st = kvd__mapping_from_fd(cli, fd, bytes, kind, r->device_ordinal, &m);
    if (st != KVD_OK) {
        if (fd >= 0)
            close(fd);
        return st;
    }
    m->pool = info;
    m->device_ordinal = r->device_ordinal;
    *p->out.pexport.out = m;
    return KVD_OK;
}

static kvd_status_t pool_export_go(kvd_client_t *cli, uint64_t pool, const char *name,
                                   uint32_t flags, kvd_mapping_t **out, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__PoolExport pe = KVDOCK__POOL_EXPORT__INIT;
    kvd__out_t o;

    if (cli == NULL || out == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client or out is NULL");
    if (pool == 0 && (name == NULL || name[0] == '\0'))
        return kvd__client_fail(cli, KVD_EINVAL, "name a pool by id or by name");
    *out = NULL;
    memset(&o, 0, sizeof(o));
    o.pexport.out = out;
    o.pexport.flags = flags;
    pe.pool = pool;
    if (pool == 0)
        pe.name = (char *)name;
    req.op_case = KVDOCK__REQUEST__OP_POOL_EXPORT;
    req.pool_export = &pe;
    return kvd__call(cli, &req, NULL, 0, export_finish, &o, req_id);
}

kvd_status_t kvd_pool_export(kvd_client_t *cli, uint64_t pool, const char *name, uint32_t flags,
                             kvd_mapping_t **out)
{
    return pool_export_go(cli, pool, name, flags, out, NULL);
}

kvd_status_t kvd_pool_export_submit(kvd_client_t *cli, uint64_t pool, const char *name,
                                    uint32_t flags, kvd_mapping_t **out, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return pool_export_go(cli, pool, name, flags, out, req_id);
}

/* ------------------------------------------------------------------------ */
/* Drop, list                                                                */

static kvd_status_t pool_drop_go(kvd_client_t *cli, uint64_t pool, const char *name,
                                 uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__PoolDrop pd = KVDOCK__POOL_DROP__INIT;

    if (cli == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client is NULL");
    if (pool == 0 && (name == NULL || name[0] == '\0'))
        return kvd__client_fail(cli, KVD_EINVAL, "name a pool by id or by name");
    pd.pool = pool;
    if (pool == 0)
        pd.name = (char *)name;
    req.op_case = KVDOCK__REQUEST__OP_POOL_DROP;
    req.pool_drop = &pd;
    return kvd__call(cli, &req, NULL, 0, NULL, NULL, req_id);
}

kvd_status_t kvd_pool_drop(kvd_client_t *cli, uint64_t pool, const char *name)
{
    return pool_drop_go(cli, pool, name, NULL);
}

kvd_status_t kvd_pool_drop_submit(kvd_client_t *cli, uint64_t pool, const char *name,
                                  uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return pool_drop_go(cli, pool, name, req_id);
}

static kvd_status_t list_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    const Kvdock__PoolListReply *r =
        p->resp->result_case == KVDOCK__RESPONSE__RESULT_POOLS ? p->resp->pools : NULL;
    size_t n = r != NULL ? r->n_pools : 0;

    /* An empty list may travel as an unset result. */
    if (r == NULL && p->resp->result_case != KVDOCK__RESPONSE__RESULT__NOT_SET)
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered pool_list without a list");
    for (size_t i = 0; i < n && i < p->out.list.cap; i++)
        kvd__pool_info_from_pb(&p->out.list.out[i], r->pools[i]);
    if (p->out.list.count != NULL)
        *p->out.list.count = n;
    return KVD_OK;
}

static kvd_status_t pool_list_go(kvd_client_t *cli, kvd_pool_info_t *out, size_t cap, size_t *count,
                                 bool all, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__PoolList pl = KVDOCK__POOL_LIST__INIT;
    kvd__out_t o;

    if (cli == NULL || count == NULL || (out == NULL && cap > 0))
        return kvd__client_fail(cli, KVD_ENULL, "client, out or count is NULL");
    memset(&o, 0, sizeof(o));
    o.list.out = out;
    o.list.cap = cap;
    o.list.count = count;
    pl.all = all;
    req.op_case = KVDOCK__REQUEST__OP_POOL_LIST;
    req.pool_list = &pl;
    return kvd__call(cli, &req, NULL, 0, list_finish, &o, req_id);
}

kvd_status_t kvd_pool_list(kvd_client_t *cli, kvd_pool_info_t *out, size_t cap, size_t *count)
{
    return pool_list_go(cli, out, cap, count, false, NULL);
}

kvd_status_t kvd_pool_list_all(kvd_client_t *cli, kvd_pool_info_t *out, size_t cap,
                               size_t *count)
{
    return pool_list_go(cli, out, cap, count, true, NULL);
}

kvd_status_t kvd_pool_list_all_submit(kvd_client_t *cli, kvd_pool_info_t *out, size_t cap,
                                      size_t *count, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return pool_list_go(cli, out, cap, count, true, req_id);
}

kvd_status_t kvd_pool_list_submit(kvd_client_t *cli, kvd_pool_info_t *out, size_t cap,
                                  size_t *count, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return pool_list_go(cli, out, cap, count, false, req_id);
}

/* ------------------------------------------------------------------------ */
/* Buffers                                                                   */

static kvd_status_t buffer_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    const Kvdock__BufferInfo *b =
        p->resp->result_case == KVDOCK__RESPONSE__RESULT_BUFFER ? p->resp->buffer : NULL;
    kvd_mapping_t *m = NULL;
    kvd_status_t st;
    int fd;

    if (b == NULL)
        return kvd__client_fail(cli, KVD_EPROTO,
                                "kvdockd answered buffer_register without a BufferInfo");
    if (p->out.buffer.id != NULL)
        *p->out.buffer.id = b->id;
    if (p->out.buffer.map == NULL)
        return KVD_OK;
    if (b->kind == KVDOCK__MEM_KIND__MEM_DEVICE) {
        st = kvd__mapping_from_ipc(cli, b->cuda_ipc_handle.data, b->cuda_ipc_handle.len, b->bytes,
                                   cli->info.device_ordinal, &m);
    } else if (b->kind == KVDOCK__MEM_KIND__MEM_HOST) {
        fd = kvd__take_fd(p, b->fd_index);
        if (fd < 0)
            return kvd__client_fail(
                cli, KVD_EPROTO,
                "buffer %llu came without its descriptor (fd_index %d, %d received)",
                (unsigned long long)b->id, b->fd_index, p->nfds);
        st = kvd__mapping_from_fd(cli, fd, b->bytes, KVD_MEM_HOST, -1, &m);
        if (st != KVD_OK)
            close(fd);
    } else {
        return kvd__client_fail(cli, KVD_EPROTO, "buffer %llu has unknown kind %d",
                                (unsigned long long)b->id, (int)b->kind);
    }
    if (st != KVD_OK)
        return st;
    m->buffer = b->id;
    m->device_ordinal = cli->info.device_ordinal;
    *p->out.buffer.map = m;
    return KVD_OK;
}

static kvd_status_t buffer_register_go(kvd_client_t *cli, uint64_t bytes, int32_t kind,
                                       const char *name, uint64_t *id, kvd_mapping_t **map,
                                       uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__BufferRegister br = KVDOCK__BUFFER_REGISTER__INIT;
    kvd__out_t o;

    if (cli == NULL || id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client or id is NULL");
    if (map != NULL && kind == KVD_MEM_DEVICE && !kvd_client_has_cuda())
        return kvd__client_fail(cli, KVD_ENOTSUP,
                                "mapping a device buffer needs libkvdock built with CUDA");
    if (map != NULL)
        *map = NULL;
    memset(&o, 0, sizeof(o));
    o.buffer.id = id;
    o.buffer.map = map;
    br.bytes = bytes;
    br.kind = (Kvdock__MemKind)kind;
    if (name != NULL)
        br.name = (char *)name;
    req.op_case = KVDOCK__REQUEST__OP_BUFFER_REGISTER;
    req.buffer_register = &br;
    return kvd__call(cli, &req, NULL, 0, buffer_finish, &o, req_id);
}

kvd_status_t kvd_buffer_register(kvd_client_t *cli, uint64_t bytes, int32_t kind, const char *name,
                                 uint64_t *id, kvd_mapping_t **map)
{
    return buffer_register_go(cli, bytes, kind, name, id, map, NULL);
}

kvd_status_t kvd_buffer_register_submit(kvd_client_t *cli, uint64_t bytes, int32_t kind,
                                        const char *name, uint64_t *id, kvd_mapping_t **map,
                                        uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return buffer_register_go(cli, bytes, kind, name, id, map, req_id);
}

static kvd_status_t buffer_drop_go(kvd_client_t *cli, uint64_t buffer, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__BufferDrop bd = KVDOCK__BUFFER_DROP__INIT;

    if (cli == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client is NULL");
    bd.buffer = buffer;
    req.op_case = KVDOCK__REQUEST__OP_BUFFER_DROP;
    req.buffer_drop = &bd;
    return kvd__call(cli, &req, NULL, 0, NULL, NULL, req_id);
}

kvd_status_t kvd_buffer_drop(kvd_client_t *cli, uint64_t buffer)
{
    return buffer_drop_go(cli, buffer, NULL);
}

kvd_status_t kvd_buffer_drop_submit(kvd_client_t *cli, uint64_t buffer, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return buffer_drop_go(cli, buffer, req_id);
}

/* ------------------------------------------------------------------------ */
/* Events                                                                    */

static kvd_status_t event_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    const Kvdock__EventInfo *e =
        p->resp->result_case == KVDOCK__RESPONSE__RESULT_EVENT ? p->resp->event : NULL;

    if (e == NULL)
        return kvd__client_fail(cli, KVD_EPROTO,
                                "kvdockd answered event_register without an EventInfo");
    if (p->out.event.id != NULL)
        *p->out.event.id = e->id;
    return KVD_OK;
}

static kvd_status_t event_register_go(kvd_client_t *cli, const void *handle, uint64_t *id,
                                      uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__EventRegister er = KVDOCK__EVENT_REGISTER__INIT;
    kvd__out_t o;

    if (cli == NULL || handle == NULL || id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client, handle or id is NULL");
    memset(&o, 0, sizeof(o));
    o.event.id = id;
    er.cuda_ipc_event_handle.data = (uint8_t *)handle;
    er.cuda_ipc_event_handle.len = KVD_IPC_HANDLE_BYTES;
    req.op_case = KVDOCK__REQUEST__OP_EVENT_REGISTER;
    req.event_register = &er;
    return kvd__call(cli, &req, NULL, 0, event_finish, &o, req_id);
}

kvd_status_t kvd_event_register(kvd_client_t *cli, const void *ipc_event_handle, uint64_t *id)
{
    return event_register_go(cli, ipc_event_handle, id, NULL);
}

kvd_status_t kvd_event_register_submit(kvd_client_t *cli, const void *ipc_event_handle,
                                       uint64_t *id, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return event_register_go(cli, ipc_event_handle, id, req_id);
}

static kvd_status_t event_drop_go(kvd_client_t *cli, uint64_t event, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__EventDrop ed = KVDOCK__EVENT_DROP__INIT;

    if (cli == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client is NULL");
    ed.event = event;
    req.op_case = KVDOCK__REQUEST__OP_EVENT_DROP;
    req.event_drop = &ed;
    return kvd__call(cli, &req, NULL, 0, NULL, NULL, req_id);
}

kvd_status_t kvd_event_drop(kvd_client_t *cli, uint64_t event)
{
    return event_drop_go(cli, event, NULL);
}

kvd_status_t kvd_event_drop_submit(kvd_client_t *cli, uint64_t event, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return event_drop_go(cli, event, req_id);
}
