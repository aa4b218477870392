/* The registry of pools, buffers and events: see registry.h. */
#include "registry.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

void kvd__registry_init(kvd__registry_t *reg, kvd__backend_t *be, kvd__hostmem_t *hostmem)
{
    memset(reg, 0, sizeof(*reg));
    reg->be = be;
    reg->hostmem = hostmem;
    reg->next_id = 1;
    reg->orphans.client_id = 0; /* the daemon itself: no connection has id 0 */
    kvd__idmap_init(&reg->objs);
}

void kvd__registry_set_host_release(kvd__registry_t *reg,
                                    void (*fn)(void *ctx, kvd__mem_t *mem, int host_kind,
                                               uint64_t host_bytes),
                                   void *ctx)
{
    reg->host_release = fn;
    reg->host_release_ctx = ctx;
}

/* The host memory of obj goes to the release hook, with the budget's
 * bytes, where there is one; *mem is then NULL. */
static void release_host(kvd__registry_t *reg, kvd__obj_t *obj, kvd__mem_t **mem)
{
    if (reg->host_release == NULL || *mem == NULL || (*mem)->kind != KVD_MEM_HOST)
        return;
    reg->host_release(reg->host_release_ctx, *mem, obj->host_kind, obj->host_bytes);
    *mem = NULL;
    obj->host_bytes = 0;
}

void kvd__pool_free(kvd__backend_t *be, kvd__pool_t *p)
{
    uint32_t i;

    be->mem_destroy(be, &p->mem);
    for (i = 0; i < p->n_regions; i++)
        be->mem_destroy(be, &p->regions[i]);
    if (p->k_table)
        be->table_destroy(be, p->k_table);
    if (p->v_table)
        be->table_destroy(be, p->v_table);
    free(p->regions);
    free(p->k_addr);
    free(p->v_addr);
    free(p);
}

static void free_obj(kvd__registry_t *reg, kvd__obj_t *obj)
{
    kvd__backend_t *be = reg->be;

    reg->live_bytes -= obj->bytes;
    if (obj->type == KVD_OBJ_POOL && !((kvd__pool_t *)obj)->imported)
        release_host(reg, obj, &((kvd__pool_t *)obj)->mem);
    else if (obj->type == KVD_OBJ_BUFFER)
        release_host(reg, obj, &((kvd__buffer_t *)obj)->mem);
    if (obj->host_bytes)
        kvd__hostmem_release(reg->hostmem, obj->host_kind, obj->host_bytes);
    switch (obj->type) {
    case KVD_OBJ_POOL:
        kvd__pool_free(be, (kvd__pool_t *)obj);
        break;
    case KVD_OBJ_BUFFER: {
        kvd__buffer_t *b = (kvd__buffer_t *)obj;
        be->mem_destroy(be, &b->mem);
        free(b);
        break;
    }
    case KVD_OBJ_EVENT: {
        kvd__event_t *e = (kvd__event_t *)obj;
        if (e->ev)
            be->event_close(be, e->ev);
        free(e);
        break;
    }
    }
}

void kvd__obj_ref(kvd__obj_t *obj)
{
    obj->refs++;
}

void kvd__obj_unref(kvd__registry_t *reg, kvd__obj_t *obj)
{
    if (obj == NULL)
        return;
    if (--obj->refs == 0)
        free_obj(reg, obj);
}

/* Put obj at the head of owner's list and count it there. */
static void owner_link(kvd__owner_t *owner, kvd__obj_t *obj)
{
    obj->owner = owner;
    obj->oprev = NULL;
    obj->onext = owner->head;
    if (owner->head)
        owner->head->oprev = obj;
    owner->head = obj;
    owner->bytes += obj->bytes;
    switch (obj->type) {
    case KVD_OBJ_POOL: owner->pools++; break;
    case KVD_OBJ_BUFFER: owner->buffers++; break;
    case KVD_OBJ_EVENT: owner->events++; break;
    }
}

/* Take obj off its owner's list and counts (obj->owner is left as it was). */
static void owner_unlink(kvd__owner_t *owner, kvd__obj_t *obj)
{
    if (obj->oprev)
        obj->oprev->onext = obj->onext;
    else
        owner->head = obj->onext;
    if (obj->onext)
        obj->onext->oprev = obj->oprev;
    obj->onext = obj->oprev = NULL;
    owner->bytes -= obj->bytes;
    switch (obj->type) {
    case KVD_OBJ_POOL: owner->pools--; break;
    case KVD_OBJ_BUFFER: owner->buffers--; break;
    case KVD_OBJ_EVENT: owner->events--; break;
    }
}

kvd_status_t kvd__registry_add(kvd__registry_t *reg, kvd__obj_t *obj, kvd__owner_t *owner)
{
    uint64_t id = reg->next_id;

    if (kvd__idmap_put(&reg->objs, id, obj) != 0)
        return KVD_ENOMEM;
    reg->next_id++;
    obj->id = id;
    obj->refs = 1;
    obj->owner_id = owner->client_id;
    obj->owner_uid = owner->uid;
    obj->orphaned = 0;
    owner_link(owner, obj);
    reg->live_bytes += obj->bytes;
    switch (obj->type) {
    case KVD_OBJ_POOL: {
        kvd__pool_t *p = (kvd__pool_t *)obj;
        reg->npools++;
        p->prev = NULL;
        p->next = reg->pools;
        if (reg->pools)
            reg->pools->prev = p;
        reg->pools = p;
        break;
    }
    case KVD_OBJ_BUFFER:
        reg->nbuffers++;
        break;
    case KVD_OBJ_EVENT:
        reg->nevents++;
        break;
    }
    return KVD_OK;
}

kvd__obj_t *kvd__registry_get(kvd__registry_t *reg, uint64_t id, kvd__obj_type_t type)
{
    kvd__obj_t *obj = kvd__idmap_get(&reg->objs, id);

    if (obj != NULL && type == KVD_OBJ_POOL && obj->type == type && ((kvd__pool_t *)obj)->creating)
        return NULL;
    return obj != NULL && obj->type == type ? obj : NULL;
}

kvd__pool_t *kvd__registry_pool_by_name(kvd__registry_t *reg, const char *name, uint64_t client_id)
{
    kvd__pool_t *p, *shared = NULL;

    for (p = reg->pools; p; p = p->next) {
        if (p->creating || strcmp(p->name, name) != 0)
            continue;
        if (p->obj.owner_id == client_id)
            return p;
        if (p->obj.shared && shared == NULL)
            shared = p;
    }
    return shared;
}

int kvd__registry_name_taken(kvd__registry_t *reg, const char *name, uint64_t client_id,
                             int shared)
{
    for (kvd__pool_t *p = reg->pools; p; p = p->next)
        if (strcmp(p->name, name) == 0 &&
            (p->obj.owner_id == client_id || (shared && p->obj.shared)))
            return 1;
    return 0;
}

void kvd__registry_drop(kvd__registry_t *reg, kvd__obj_t *obj)
{
    kvd__owner_t *owner = obj->owner;

    if (owner == NULL)
        return; /* already dropped */
    kvd__idmap_del(&reg->objs, obj->id);
    owner_unlink(owner, obj);
    obj->owner = NULL;
    switch (obj->type) {
    case KVD_OBJ_POOL: {
        kvd__pool_t *p = (kvd__pool_t *)obj;
        reg->npools--;
        if (p->prev)
            p->prev->next = p->next;
        else
            reg->pools = p->next;
        if (p->next)
            p->next->prev = p->prev;
        p->next = p->prev = NULL;
        break;
    }
    case KVD_OBJ_BUFFER:
        reg->nbuffers--;
        break;
    case KVD_OBJ_EVENT:
        reg->nevents--;
        break;
    }
    kvd__obj_unref(reg, obj);
}

int kvd__obj_outlives_owner(const kvd__obj_t *obj)
{
    /* An imported pool's memory is its client's: it cannot outlive it. */
    return obj->type == KVD_OBJ_POOL && obj->shared && !((const kvd__pool_t *)obj)->imported;
}

void kvd__registry_drop_owner(kvd__registry_t *reg, kvd__owner_t *owner)
{
    kvd__obj_t *obj = owner->head;

    if (owner == &reg->orphans)
        return; /* the daemon's own: dropped one by one, or at deinit */
    while (obj != NULL) {
        kvd__obj_t *next = obj->onext;

        if (kvd__obj_outlives_owner(obj)) {
            owner_unlink(owner, obj);
            owner_link(&reg->orphans, obj);
            obj->orphaned = 1;
            kvd_log(KVD_LOG_INFO,
                    "event=pool_orphaned pool=%" PRIu64 " name=%s creator=%" PRIu64
                    " bytes=%" PRIu64,
                    obj->id, ((kvd__pool_t *)obj)->name, obj->owner_id, obj->bytes);
        } else {
            kvd__registry_drop(reg, obj);
        }
        obj = next;
    }
}

void kvd__registry_deinit(kvd__registry_t *reg)
{
    while (reg->pools)
        kvd__registry_drop(reg, &reg->pools->obj);
    kvd__idmap_deinit(&reg->objs);
}

kvd_status_t kvd__obj_may_use(const kvd__obj_t *obj, uint64_t client_id)
{
    if (obj->owner_id == client_id || obj->shared)
        return KVD_OK;
    return KVD_EPERM;
}

kvd_status_t kvd__obj_may_drop(const kvd__obj_t *obj, uint64_t client_id, uid_t uid, int admin)
{
    if ((!obj->orphaned && obj->owner_id == client_id) ||
        (obj->shared && (admin || obj->owner_uid == uid)))
        return KVD_OK;
    return KVD_EPERM;
}

int kvd__pool_name_valid(const char *name)
{
    size_t n = name ? strlen(name) : 0, i;

    if (n == 0 || n >= KVD_NAME_MAX)
        return 0;
    for (i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

int kvd__text_valid(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return 0;
    return 1;
}
