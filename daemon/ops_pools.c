/* Pool operations: create, export, import, drop, list. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dispatch.h"
#include "log.h"

#define POOL_ALIGN 256u
/* Allocations one import may name: an engine that allocates every layer's K
 * and V apart needs two per layer. */
#define MAX_IMPORT_REGIONS 4096

kvd_status_t kvd__check_mem_limits(kvd__req_t *r, uint64_t bytes)
{
    const kvd__options_t *o = &r->srv->opts;
    const kvd__owner_t *own = &r->conn->owner;

    if (o->max_pool_bytes != 0 && (bytes > o->max_pool_bytes ||
                                   own->bytes > o->max_pool_bytes - bytes))
        return kvd__req_fail(r, KVD_ELIMIT,
                         "%" PRIu64 " more bytes would pass this client's limit of %" PRIu64
                         " (%" PRIu64 " in use; max-pool-bytes)",
                         bytes, o->max_pool_bytes, own->bytes);
    if (o->max_total_pool_bytes != 0 &&
        (bytes > o->max_total_pool_bytes ||
         r->srv->reg.live_bytes > o->max_total_pool_bytes - bytes))
        return kvd__req_fail(r, KVD_ELIMIT,
                         "%" PRIu64 " more bytes would pass the daemon's limit of %" PRIu64
                         " (max-total-pool-bytes)",
                         bytes, o->max_total_pool_bytes);
    return KVD_OK;
}

kvd_status_t kvd__reserve_host(kvd__req_t *r, kvd__obj_t *obj, int kind, uint64_t bytes,
                               const char *what)
{
    char why[200];
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    kvd_status_t st;

    bytes = (bytes + page - 1) / page * page; /* memfds hold whole pages */
    st = kvd__hostmem_reserve(&r->srv->hostmem, kind, bytes, why, sizeof(why));
    if (st != KVD_OK)
        return kvd__req_fail(r, st, "%s: %s", what, why);
    obj->host_bytes = bytes;
    obj->host_kind = kind;
    return KVD_OK;
}

void kvd__unreserve_host(kvd__req_t *r, kvd__obj_t *obj)
{
    kvd__hostmem_release(&r->srv->hostmem, obj->host_kind, obj->host_bytes);
    obj->host_bytes = 0;
}

static void fill_info(const kvd__pool_t *p, Kvdock__PoolInfo *pi)
{
    kvdock__pool_info__init(pi);
    pi->id = p->obj.id;
    pi->name = (char *)p->name;
    pi->kind = (Kvdock__MemKind)p->kind;
    pi->num_layers = p->num_layers;
    pi->num_slots = p->num_slots;
    pi->slot_bytes = p->slot_bytes;
    pi->mla = p->mla;
    pi->page_size = p->page_size;
    pi->shared = p->obj.shared;
    pi->imported = p->imported;
    pi->bytes = p->bytes;
    pi->layer_stride = p->layer_stride;
    pi->v_offset = p->v_offset;
    pi->slot_stride = p->slot_stride;
    pi->owner = p->obj.owner_id;
    pi->orphaned = p->obj.orphaned;
}

/* A pool named by id, or by name when the id is 0. */
static kvd_status_t find_pool(kvd__req_t *r, uint64_t id, const char *name, kvd__pool_t **out)
{
    kvd__pool_t *p = NULL;

    if (id != 0)
        p = (kvd__pool_t *)kvd__registry_get(&r->srv->reg, id, KVD_OBJ_POOL);
    else if (name != NULL && name[0] != '\0')
        p = kvd__registry_pool_by_name(&r->srv->reg, name, r->conn->id);
    else
        return kvd__req_fail(r, KVD_EINVAL, "name a pool by id or by name");
    if (p == NULL) {
        if (id != 0)
            return kvd__req_fail(r, KVD_ENOENT, "no pool %" PRIu64, id);
        return kvd__req_fail(r, KVD_ENOENT, "no pool named '%.64s'", name);
    }
    *out = p;
    return KVD_OK;
}

static kvd_status_t check_name(kvd__req_t *r, const char *name, int shared)
{
    if (!kvd__pool_name_valid(name))
        return kvd__req_fail(r, KVD_EINVAL,
                         "pool name must be 1 to 63 characters of [A-Za-z0-9._-]");
    if (kvd__registry_name_taken(&r->srv->reg, name, r->conn->id, shared))
        return kvd__req_fail(r, KVD_EEXIST, "a pool named '%s' exists%s", name,
                             shared ? " (yours, or a shared one)" : " (yours)");
    return KVD_OK;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

static void log_pool(const kvd__conn_t *c, const kvd__pool_t *p)
{
    kvd_log(KVD_LOG_INFO,
            "event=pool_%s client=%" PRIu64 " pool=%" PRIu64 " name=%s kind=%s layers=%u "
            "slots=%" PRIu64 " slot_bytes=%" PRIu64 " mla=%d bytes=%" PRIu64,
            p->imported ? "import" : "create", c->id, p->obj.id, p->name,
            kvd_mem_kind_name(p->kind),
            p->num_layers, p->num_slots, p->slot_bytes, p->mla, p->obj.bytes);
}

static kvd_status_t register_pool(kvd__req_t *r, kvd__pool_t *p)
{
    Kvdock__PoolInfo *pi = kvd__req_alloc(r, sizeof(*pi));

    if (pi == NULL || kvd__registry_add(&r->srv->reg, &p->obj, &r->conn->owner) != KVD_OK)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    fill_info(p, pi);
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_POOL;
    r->resp.pool = pi;
    log_pool(r->conn, p);
    return KVD_OK;
}

/* A host pool's memory made on libuv's thread pool: reserving and
 * populating (and pinning, on cuda) half a GiB takes tens of ms, which on
 * the loop every client would wait for.  The pool is in the registry
 * meanwhile (counted, its name taken) but no request finds it; the reply
 * goes once it is ready. */
typedef struct pool_work {
    uv_work_t w;
    kvd__origin_t origin;
    kvd__pool_t *p;     /* holds a reference */
    kvd__mem_t *mem;
    kvd_status_t st;
    char why[160];
} pool_work_t;

static void pool_work_run(uv_work_t *w)
{
    pool_work_t *pw = w->data;
    kvd__backend_t *be = pw->origin.srv->backend;

    pw->st = be->mem_create(be, KVD_MEM_HOST, pw->p->bytes, pw->p->name, &pw->mem, pw->why,
                            sizeof(pw->why));
}

static void pool_work_end(uv_work_t *w, int status)
{
    pool_work_t *pw = w->data;
    kvd__server_t *srv = pw->origin.srv;
    kvd__pool_t *p = pw->p;
    Kvdock__Response resp = KVDOCK__RESPONSE__INIT;
    Kvdock__PoolInfo pi;
    char msg[220];

    if (status != 0 && pw->st == KVD_OK) { /* cancelled before it ran */
        pw->st = KVD_ESHUTDOWN;
        snprintf(pw->why, sizeof(pw->why), "%s", uv_strerror(status));
    }
    p->mem = pw->mem; /* freed with the pool if it was dropped meanwhile */
    p->creating = 0;
    if (pw->st == KVD_OK && p->obj.owner == NULL) {
        pw->st = KVD_ECONN; /* its client went: nobody reads the reply */
        snprintf(pw->why, sizeof(pw->why), "dropped while it was being made");
    }
    if (pw->st != KVD_OK) {
        if (p->obj.owner != NULL)
            kvd__registry_drop(&srv->reg, &p->obj);
        snprintf(msg, sizeof(msg), "cannot allocate %" PRIu64 " bytes: %s", p->bytes, pw->why);
        resp.status = (uint32_t)pw->st;
        resp.message = msg;
    } else {
        fill_info(p, &pi);
        resp.result_case = KVDOCK__RESPONSE__RESULT_POOL;
        resp.pool = &pi;
        log_pool(pw->origin.conn, p);
    }
    kvd__reply_deferred_response(&pw->origin, &resp);
    kvd__obj_unref(&srv->reg, &p->obj);
    kvd__conn_op_end(pw->origin.conn);
    free(pw);
    kvd__server_mem_work_done(srv);
}

/* Register p (its fields set and its host memory reserved, no memory
 * made yet) and make its memory off the loop; the reply goes from
 * pool_work_end.  p is this function's: on failure it is gone. */
static kvd_status_t pool_create_later(kvd__req_t *r, kvd__pool_t *p)
{
    kvd__server_t *srv = r->srv;
    pool_work_t *pw = calloc(1, sizeof(*pw));

    p->creating = 1;
    if (pw == NULL || kvd__registry_add(&srv->reg, &p->obj, &r->conn->owner) != KVD_OK) {
        free(pw);
        kvd__unreserve_host(r, &p->obj);
        free(p);
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    }
    kvd__obj_ref(&p->obj);
    pw->w.data = pw;
    pw->origin = kvd__origin_of(r);
    pw->p = p;
    if (uv_queue_work(srv->loop, &pw->w, pool_work_run, pool_work_end) != 0) {
        kvd__registry_drop(&srv->reg, &p->obj); /* frees it, and its reservation */
        kvd__obj_unref(&srv->reg, &p->obj);
        free(pw);
        return kvd__req_fail(r, KVD_EIO, "cannot queue the pool's allocation");
    }
    srv->mem_works++;
    kvd__conn_op_begin(r->conn);
    r->deferred = 1;
    return KVD_OK;
}

kvd_status_t kvd__op_pool_create(kvd__req_t *r)
{
    const Kvdock__PoolCreate *pc = r->req->pool_create;
    kvd__backend_t *be = r->srv->backend;
    uint64_t region, region_al, layer_stride, total, held;
    char why[160] = "";
    kvd__pool_t *p = NULL;
    kvd_status_t st;
    unsigned kv = pc->mla ? 1 : 2;

    /* validate everything first */
    if ((st = check_name(r, pc->name, pc->shared)) != KVD_OK)
        return st;
    if (pc->kind != KVDOCK__MEM_KIND__MEM_HOST && pc->kind != KVDOCK__MEM_KIND__MEM_DEVICE &&
        pc->kind != KVDOCK__MEM_KIND__MEM_DEVICE_VMM)
        return kvd__req_fail(r, KVD_EINVAL, "kind must be MEM_HOST, MEM_DEVICE or MEM_DEVICE_VMM");
    if (pc->num_layers < 1 || pc->num_slots < 1 || pc->slot_bytes < 1)
        return kvd__req_fail(r, KVD_EINVAL, "num_layers, num_slots and slot_bytes must be >= 1");
    if (pc->page_size > 1 && pc->num_slots % pc->page_size != 0)
        return kvd__req_fail(r, KVD_ESHAPE,
                         "num_slots (%" PRIu64 ") is not a multiple of page_size (%u)",
                         pc->num_slots, pc->page_size);
    if (__builtin_mul_overflow(pc->num_slots, pc->slot_bytes, &region) ||
        region > (uint64_t)INT64_MAX / 4 ||
        __builtin_mul_overflow(align_up(region, POOL_ALIGN), (uint64_t)kv, &layer_stride) ||
        __builtin_mul_overflow(layer_stride, (uint64_t)pc->num_layers, &total) ||
        total > (uint64_t)INT64_MAX / 2)
        return kvd__req_fail(r, KVD_EOVERFLOW, "pool size overflows");
    region_al = align_up(region, POOL_ALIGN);
    if (r->conn->owner.pools >= r->srv->opts.max_pools)
        return kvd__req_fail(r, KVD_ELIMIT, "this client has %u pools already (max-pools)",
                         r->conn->owner.pools);
    if (r->srv->reg.npools >= r->srv->opts.max_total_pools)
        return kvd__req_fail(r, KVD_ELIMIT, "the daemon holds %u pools already (max-total-pools)",
                         r->srv->reg.npools);
    /* a VMM pool holds whole allocation granules (2 MiB): those count */
    held = total;
    if (pc->kind == KVDOCK__MEM_KIND__MEM_DEVICE_VMM && be->vmm_granularity > 0)
        held = align_up(total, be->vmm_granularity);
    if ((st = kvd__check_mem_limits(r, held)) != KVD_OK)
        return st;

    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    if (pc->kind == KVDOCK__MEM_KIND__MEM_HOST &&
        (st = kvd__reserve_host(r, &p->obj, KVD_HM_POOLS, total, "host pool")) != KVD_OK) {
        free(p);
        return st;
    }
    if (pc->kind != KVDOCK__MEM_KIND__MEM_HOST) {
        st = be->mem_create(be, (int)pc->kind, total, pc->name, &p->mem, why, sizeof(why));
        if (st != KVD_OK) {
            free(p);
            return kvd__req_fail(r, st, "cannot allocate %" PRIu64 " bytes: %s", total, why);
        }
    }
    p->obj.type = KVD_OBJ_POOL;
    p->obj.shared = pc->shared;
    p->obj.bytes = held;
    p->bytes = total;
    snprintf(p->name, sizeof(p->name), "%s", pc->name);
    p->kind = (int)pc->kind;
    p->num_layers = pc->num_layers;
    p->num_slots = pc->num_slots;
    p->slot_bytes = pc->slot_bytes;
    p->slot_stride = pc->slot_bytes;
    p->mla = pc->mla;
    p->page_size = pc->page_size;
    p->layer_stride = layer_stride;
    p->v_offset = pc->mla ? 0 : region_al;
    if (pc->kind == KVDOCK__MEM_KIND__MEM_HOST)
        return pool_create_later(r, p);
    st = register_pool(r, p);
    if (st != KVD_OK) {
        be->mem_destroy(be, &p->mem);
        kvd__unreserve_host(r, &p->obj);
        free(p);
    }
    return st;
}

kvd_status_t kvd__op_pool_export(kvd__req_t *r)
{
    const Kvdock__PoolExport *pe = r->req->pool_export;
    Kvdock__PoolExportReply *x;
    Kvdock__PoolInfo *pi;
    kvd__pool_t *p = NULL;
    kvd_status_t st;

    if ((st = find_pool(r, pe->pool, pe->name, &p)) != KVD_OK)
        return st;
    if (kvd__obj_may_use(&p->obj, r->conn->id) != KVD_OK)
        return kvd__req_fail(r, KVD_EPERM, "pool %" PRIu64 " belongs to another client", p->obj.id);
    if (p->imported)
        return kvd__req_fail(r, KVD_ENOTSUP, "pool %" PRIu64 " is imported: its memory is a client's",
                         p->obj.id);
    x = kvd__req_alloc(r, sizeof(*x));
    pi = kvd__req_alloc(r, sizeof(*pi));
    if (x == NULL || pi == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    kvdock__pool_export_reply__init(x);
    fill_info(p, pi);
    x->pool = pi;
    x->fd_index = -1;
    x->device_ordinal = r->srv->backend->device_ordinal;
    x->map_bytes = p->mem->map_bytes ? p->mem->map_bytes : p->mem->bytes;
    if (p->mem->has_ipc) {
        x->cuda_ipc_handle.data = p->mem->ipc;
        x->cuda_ipc_handle.len = KVD_IPC_HANDLE_BYTES;
    }
    if (p->mem->fd >= 0) {
        x->fd_index = 0;
        r->reply_fds[0] = p->mem->fd;
        r->n_reply_fds = 1;
    }
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_POOL_EXPORT;
    r->resp.pool_export = x;
    return KVD_OK;
}

/* The byte just past the last slot of a layer at offset in a region. */
static int layer_fits(const kvd__pool_t *p, uint64_t offset, uint64_t region_bytes)
{
    uint64_t span, end;

    if (__builtin_mul_overflow(p->num_slots - 1, p->slot_stride, &span) ||
        __builtin_add_overflow(span, p->slot_bytes, &span) ||
        __builtin_add_overflow(offset, span, &end))
        return 0;
    return end <= region_bytes;
}

static kvd_status_t import_layers(kvd__req_t *r, kvd__pool_t *p, Kvdock__MemRef **refs, size_t n,
                                  uint64_t **out, const char *what)
{
    uint64_t *addr = calloc(n ? n : 1, sizeof(*addr));
    size_t l;

    if (addr == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    for (l = 0; l < n; l++) {
        const Kvdock__MemRef *m = refs[l];
        if (m->region >= p->n_regions) {
            free(addr);
            return kvd__req_fail(r, KVD_ERANGE, "%s[%zu].region %u: there are %u regions", what, l,
                             m->region, p->n_regions);
        }
        if (!layer_fits(p, m->offset, p->regions[m->region]->bytes)) {
            free(addr);
            return kvd__req_fail(r, KVD_ERANGE,
                             "%s[%zu]: %" PRIu64 " slots at offset %" PRIu64
                             " pass the end of region %u (%" PRIu64 " bytes)",
                             what, l, p->num_slots, m->offset, m->region,
                             p->regions[m->region]->bytes);
        }
        addr[l] = (uint64_t)(uintptr_t)p->regions[m->region]->ptr + m->offset;
    }
    *out = addr;
    return KVD_OK;
}

kvd_status_t kvd__op_pool_import(kvd__req_t *r)
{
    const Kvdock__PoolImport *pi = r->req->pool_import;
    kvd__backend_t *be = r->srv->backend;
    uint64_t stride = pi->slot_stride ? pi->slot_stride : pi->slot_bytes, total = 0;
    kvd__pool_t *p = NULL;
    kvd_status_t st;
    size_t i;

    /* the request's own fields first */
    if ((st = check_name(r, pi->name, pi->shared)) != KVD_OK)
        return st;
    if (pi->num_layers < 1 || pi->num_slots < 1 || pi->slot_bytes < 1)
        return kvd__req_fail(r, KVD_EINVAL, "num_layers, num_slots and slot_bytes must be >= 1");
    if (stride < pi->slot_bytes)
        return kvd__req_fail(r, KVD_EINVAL, "slot_stride (%" PRIu64 ") < slot_bytes (%" PRIu64 ")",
                         pi->slot_stride, pi->slot_bytes);
    if (stride > (uint64_t)INT64_MAX || pi->slot_bytes > (uint64_t)INT64_MAX)
        return kvd__req_fail(r, KVD_EOVERFLOW, "slot_stride and slot_bytes must fit in int64");
    if (pi->page_size > 1 && pi->num_slots % pi->page_size != 0)
        return kvd__req_fail(r, KVD_ESHAPE, "num_slots is not a multiple of page_size");
    if (pi->n_regions < 1 || pi->n_regions > MAX_IMPORT_REGIONS)
        return kvd__req_fail(r, KVD_EINVAL, "1 to %d regions, not %zu", MAX_IMPORT_REGIONS,
                         pi->n_regions);
    if (pi->n_k_layers != pi->num_layers)
        return kvd__req_fail(r, KVD_ESHAPE, "%zu k_layers for %u layers", pi->n_k_layers,
                         pi->num_layers);
    if (pi->n_v_layers != (pi->mla ? 0 : pi->num_layers))
        return kvd__req_fail(r, KVD_ESHAPE, "%zu v_layers for %u %s layers", pi->n_v_layers,
                         pi->num_layers, pi->mla ? "MLA" : "MHA");
    for (i = 0; i < pi->n_regions; i++) {
        const Kvdock__ImportRegion *g = pi->regions[i];
        if (g->bytes == 0)
            return kvd__req_fail(r, KVD_EINVAL, "regions[%zu].bytes is 0", i);
        if (g->kind == KVDOCK__MEM_KIND__MEM_DEVICE) {
            if (g->cuda_ipc_handle.len != KVD_IPC_HANDLE_BYTES)
                return kvd__req_fail(r, KVD_EINVAL, "regions[%zu]: a CUDA IPC handle is %d bytes",
                                 i, KVD_IPC_HANDLE_BYTES);
        } else if (g->kind == KVDOCK__MEM_KIND__MEM_HOST ||
                   g->kind == KVDOCK__MEM_KIND__MEM_DEVICE_VMM) {
            if (g->fd_index < 0 || g->fd_index >= r->nfds || r->fds[g->fd_index] < 0)
                return kvd__req_fail(r, KVD_ENULL,
                                 "regions[%zu].fd_index %d: %d descriptors came with the frame",
                                 i, g->fd_index, r->nfds);
        } else {
            return kvd__req_fail(r, KVD_EINVAL, "regions[%zu].kind must be MEM_DEVICE, "
                             "MEM_DEVICE_VMM or MEM_HOST", i);
        }
        if (g->kind != pi->regions[0]->kind)
            return kvd__req_fail(r, KVD_EINVAL, "all regions of a pool must be of one kind");
        if (__builtin_add_overflow(total, g->bytes, &total))
            return kvd__req_fail(r, KVD_EOVERFLOW, "region sizes overflow");
    }
    if (r->conn->owner.pools >= r->srv->opts.max_pools)
        return kvd__req_fail(r, KVD_ELIMIT, "this client has %u pools already (max-pools)",
                         r->conn->owner.pools);
    if (r->srv->reg.npools >= r->srv->opts.max_total_pools)
        return kvd__req_fail(r, KVD_ELIMIT, "the daemon holds %u pools already (max-total-pools)",
                         r->srv->reg.npools);

    p = calloc(1, sizeof(*p));
    if (p == NULL || (p->regions = calloc(pi->n_regions, sizeof(*p->regions))) == NULL) {
        free(p);
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    }
    p->obj.type = KVD_OBJ_POOL;
    p->obj.shared = pi->shared;
    p->obj.bytes = 0; /* the client's memory: not counted against the limits */
    p->bytes = total;
    snprintf(p->name, sizeof(p->name), "%s", pi->name);
    p->kind = (int)pi->regions[0]->kind;
    p->num_layers = pi->num_layers;
    p->num_slots = pi->num_slots;
    p->slot_bytes = pi->slot_bytes;
    p->slot_stride = stride;
    p->mla = pi->mla;
    p->page_size = pi->page_size;
    p->imported = 1;
    for (i = 0; i < pi->n_regions; i++) {
        const Kvdock__ImportRegion *g = pi->regions[i];
        char why[160] = "";
        int fd = g->kind == KVDOCK__MEM_KIND__MEM_DEVICE ? -1 : r->fds[g->fd_index];

        st = be->mem_import(be, (int)g->kind, g->cuda_ipc_handle.data, g->cuda_ipc_handle.len,
                            fd, g->bytes, &p->regions[i], why, sizeof(why));
        if (st != KVD_OK) {
            kvd__pool_free(be, p);
            return kvd__req_fail(r, st, "regions[%zu]: %s", i, why);
        }
        p->n_regions++;
    }
    if ((st = import_layers(r, p, pi->k_layers, pi->n_k_layers, &p->k_addr, "k_layers")) !=
            KVD_OK ||
        (!p->mla &&
         (st = import_layers(r, p, pi->v_layers, pi->n_v_layers, &p->v_addr, "v_layers")) !=
             KVD_OK)) {
        kvd__pool_free(be, p);
        return st;
    }
    if ((st = be->table_create(be, p->k_addr, p->num_layers, &p->k_table)) != KVD_OK ||
        (!p->mla && (st = be->table_create(be, p->v_addr, p->num_layers, &p->v_table)) != KVD_OK)) {
        kvd__pool_free(be, p);
        return kvd__req_fail(r, st, st == KVD_ENOMEM ? "out of memory for layer tables"
                                                     : "the device refused the layer tables");
    }
    st = register_pool(r, p);
    if (st != KVD_OK)
        kvd__pool_free(be, p);
    return st;
}

kvd_status_t kvd__op_pool_drop(kvd__req_t *r)
{
    const Kvdock__PoolDrop *pd = r->req->pool_drop;
    kvd__origin_t origin = kvd__origin_of(r);
    kvd__pool_t *p = NULL;
    kvd_status_t st;

    if ((st = find_pool(r, pd->pool, pd->name, &p)) != KVD_OK)
        return st;
    if (kvd__obj_may_drop(&p->obj, r->conn->id, r->conn->uid, r->conn->admin) != KVD_OK) {
        if (p->obj.shared)
            return kvd__req_fail(r, KVD_EPERM,
                             "pool %" PRIu64 " is shared by user %u: only that user or an admin "
                             "may drop it", p->obj.id, (unsigned)p->obj.owner_uid);
        return kvd__req_fail(r, KVD_EPERM, "pool %" PRIu64 " belongs to client %" PRIu64, p->obj.id,
                         p->obj.owner_id);
    }
    kvd_log(KVD_LOG_INFO, "event=pool_drop client=%" PRIu64 " pool=%" PRIu64 " name=%s refs=%u",
            r->conn->id, p->obj.id, p->name, p->obj.refs);
    kvd__server_drop_wait_begin(&origin);
    kvd__registry_drop(&r->srv->reg, &p->obj);
    r->deferred = kvd__server_drop_wait_end(r->srv);
    return KVD_OK;
}

kvd_status_t kvd__op_pool_list(kvd__req_t *r)
{
    Kvdock__PoolListReply *l = kvd__req_alloc(r, sizeof(*l));
    int all = r->req->pool_list != NULL && r->req->pool_list->all;
    kvd__pool_t *p = NULL;

    if (l == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    kvdock__pool_list_reply__init(l);
    if (all && !r->conn->admin)
        return kvd__req_fail(r, KVD_EPERM, "listing every client's pools needs an admin");
    l->pools = kvd__req_alloc(r, sizeof(*l->pools) * (r->srv->reg.npools + 1));
    if (l->pools == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    for (p = r->srv->reg.pools; p; p = p->next) {
        Kvdock__PoolInfo *pi;
        if (p->creating)
            continue;
        /* its own pools and the shared ones: other clients' private pools
         * are theirs, their names too (an admin sees them in status) */
        if (!all && kvd__obj_may_use(&p->obj, r->conn->id) != KVD_OK)
            continue;
        pi = kvd__req_alloc(r, sizeof(*pi));
        if (pi == NULL)
            return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
        fill_info(p, pi);
        l->pools[l->n_pools++] = pi;
    }
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_POOLS;
    r->resp.pools = l;
    return KVD_OK;
}
