/*
 * The cache tier: create, drop, list, stats, lookup, save, load, evict,
 * release.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void layout_to_pb(const kvd_cache_layout_t *l, Kvdock__CacheLayout *m)
{
    kvdock__cache_layout__init(m);
    m->num_layers = l->num_layers;
    m->mla = l->mla;
    m->tokens_per_block = l->tokens_per_block;
    m->token_bytes = l->token_bytes;
    m->dtype = (char *)l->dtype;
}

static void info_from_pb(kvd_cache_info_t *d, const Kvdock__CacheInfo *s)
{
    memset(d, 0, sizeof(*d));
    d->id = s->id;
    kvd__copy_str(d->name, sizeof(d->name), s->name);
    if (s->layout != NULL) {
        d->layout.num_layers = s->layout->num_layers;
        d->layout.mla = s->layout->mla != 0;
        d->layout.tokens_per_block = s->layout->tokens_per_block;
        d->layout.token_bytes = s->layout->token_bytes;
        kvd__copy_str(d->layout.dtype, sizeof(d->layout.dtype), s->layout->dtype);
    }
    d->budget_bytes = s->budget_bytes;
    d->block_bytes = s->block_bytes;
    d->capacity = s->capacity;
    d->blocks = s->blocks;
    d->used_bytes = s->used_bytes;
    d->held_bytes = s->held_bytes;
    d->shared = s->shared != 0;
    d->owner_uid = s->owner_uid;
    for (size_t i = 0; i < s->n_allow_uids && i < KVD_CACHE_ALLOW_MAX; i++)
        d->allow_uids[d->num_allow_uids++] = s->allow_uids[i];
    for (size_t i = 0; i < s->n_allow_gids && i < KVD_CACHE_ALLOW_MAX; i++)
        d->allow_gids[d->num_allow_gids++] = s->allow_gids[i];
    d->lookups = s->lookups;
    d->keys_asked = s->keys_asked;
    d->keys_hit = s->keys_hit;
    d->saves = s->saves;
    d->stored = s->stored;
    d->skipped = s->skipped;
    d->refused = s->refused;
    d->loads = s->loads;
    d->loaded = s->loaded;
    d->evictions = s->evictions;
    d->leases = s->leases;
    d->bytes_in = s->bytes_in;
    d->bytes_out = s->bytes_out;
    d->cluster = s->cluster != 0;
    d->fetched = s->fetched;
    d->served = s->served;
    d->peer_hits = s->peer_hits;
    if (s->disk != NULL) {
        const Kvdock__CacheDiskLevel *k = s->disk;
        kvd_cache_disk_level_t *o = &d->disk;

        o->enabled = true;
        o->budget_bytes = k->budget_bytes;
        o->blocks = k->blocks;
        o->used_bytes = k->used_bytes;
        o->hits = k->hits;
        o->spills = k->spills;
        o->promotions = k->promotions;
        o->reads = k->reads;
        o->read_bytes = k->read_bytes;
        o->writes = k->writes;
        o->write_bytes = k->write_bytes;
        o->evictions = k->evictions;
        o->checksum_failures = k->checksum_failures;
        o->io_errors = k->io_errors;
        o->no_space = k->no_space;
        kvd__copy_str(o->path, sizeof(o->path), k->path);
    }
}

static kvd_status_t info_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    if (p->resp->result_case != KVDOCK__RESPONSE__RESULT_CACHE || p->resp->cache == NULL)
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered %s without a CacheInfo",
                                kvd__op_name(p->op));
    if (p->out.cache.out != NULL)
        info_from_pb(p->out.cache.out, p->resp->cache);
    return KVD_OK;
}

static kvd_status_t list_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    const Kvdock__CacheListReply *r =
        p->resp->result_case == KVDOCK__RESPONSE__RESULT_CACHES ? p->resp->caches : NULL;
    size_t n = r != NULL ? r->n_caches : 0;

    /* an empty list may travel as an unset result */
    if (r == NULL && p->resp->result_case != KVDOCK__RESPONSE__RESULT__NOT_SET)
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered cache_list without a list");
    for (size_t i = 0; i < n && i < p->out.cache.cap; i++)
        info_from_pb(&p->out.cache.out[i], r->caches[i]);
    *p->out.cache.count = n;
    return KVD_OK;
}

static kvd_status_t lookup_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    const Kvdock__CacheLookupReply *r =
        p->resp->result_case == KVDOCK__RESPONSE__RESULT_CACHE_LOOKUP ? p->resp->cache_lookup
                                                                      : NULL;
    kvd_cache_lookup_result_t *o = p->out.lookup.out;

    /* a reply of all zeroes may travel as an unset result */
    if (r == NULL && p->resp->result_case != KVDOCK__RESPONSE__RESULT__NOT_SET)
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered cache_lookup without a "
                                "CacheLookupReply");
    if (o == NULL)
        return KVD_OK;
    memset(o, 0, sizeof(*o));
    if (r != NULL) {
        o->hits = r->hits;
        o->lease = r->lease;
        o->lease_expires_ms = r->lease_expires_ms;
        o->local_hits = r->local_hits;
        o->disk_hits = r->disk_hits;
        if (r->waited_for != NULL)
            snprintf(o->waited_for, sizeof(o->waited_for), "%s", r->waited_for);
    }
    return KVD_OK;
}

static kvd_status_t evict_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    const Kvdock__CacheEvictReply *r =
        p->resp->result_case == KVDOCK__RESPONSE__RESULT_CACHE_EVICT ? p->resp->cache_evict
                                                                     : NULL;
    kvd_cache_evict_result_t *o = p->out.evict.out;

    if (r == NULL && p->resp->result_case != KVDOCK__RESPONSE__RESULT__NOT_SET)
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered cache_evict without a "
                                "CacheEvictReply");
    if (o == NULL)
        return KVD_OK;
    memset(o, 0, sizeof(*o));
    if (r != NULL) {
        o->evicted = r->evicted;
        o->busy = r->busy;
        o->missing = r->missing;
    }
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */
/* Keys                                                                      */

/* A CacheKeys message over the caller's chain: in the key area (ref, which
 * lives until the request is sent, names it) when the chain goes there,
 * else in the frame; the list form needs an array of count
 * ProtobufCBinaryData, freed by the caller (*owned).  Called last before
 * the request is sent: room taken in the area is given back through the
 * request's pending entry. */
static kvd_status_t keys_build(kvd_client_t *cli, const kvd_cache_keys_t *in, Kvdock__CacheKeys *m,
                               Kvdock__KeyAreaRef *ref, ProtobufCBinaryData **owned,
                               const char *what)
{
    kvdock__cache_keys__init(m);
    *owned = NULL;
    if (in == NULL || in->count == 0)
        return KVD_OK;
    if (in->count > KVD_CACHE_KEYS_MAX)
        return kvd__client_fail(cli, KVD_ELIMIT, "%s: %u keys, at most %d in one request", what,
                                in->count, KVD_CACHE_KEYS_MAX);
    if (in->keys == NULL) {
        if (in->blob == NULL)
            return kvd__client_fail(cli, KVD_ENULL, "%s: neither keys nor a blob", what);
        if (in->key_size < 1 || in->key_size > KVD_CACHE_KEY_MAX)
            return kvd__client_fail(cli, KVD_EINVAL, "%s: key_size %u: keys are 1 to %d bytes",
                                    what, in->key_size, KVD_CACHE_KEY_MAX);
        if (kvd__key_area_take(cli, in, m, ref))
            return KVD_OK;
        m->blob.data = (uint8_t *)in->blob;
        m->blob.len = (size_t)in->count * in->key_size;
        m->key_size = in->key_size;
        return KVD_OK;
    }
    if (in->lens == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "%s: keys without lens", what);
    if (kvd__key_area_take(cli, in, m, ref))
        return KVD_OK;
    *owned = malloc(in->count * sizeof(**owned));
    if (*owned == NULL)
        return kvd__client_fail(cli, KVD_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < in->count; i++) {
        (*owned)[i].data = (uint8_t *)in->keys[i];
        (*owned)[i].len = in->lens[i];
    }
    m->n_keys = in->count;
    m->keys = *owned;
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */
/* Create, drop, list, stats                                                 */

static kvd_status_t create_go(kvd_client_t *cli, const kvd_cache_spec_t *spec,
                              kvd_cache_info_t *out, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__CacheCreate m = KVDOCK__CACHE_CREATE__INIT;
    Kvdock__CacheLayout l;
    kvd__out_t o;

    if (cli == NULL || spec == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client or spec is NULL");
    if (memchr(spec->layout.dtype, '\0', sizeof(spec->layout.dtype)) == NULL)
        return kvd__client_fail(cli, KVD_EINVAL, "layout.dtype is not a string of at most 15 "
                                "bytes");
    if ((spec->num_allow_uids && spec->allow_uids == NULL) ||
        (spec->num_allow_gids && spec->allow_gids == NULL))
        return kvd__client_fail(cli, KVD_ENULL, "allow_uids or allow_gids is NULL");
    layout_to_pb(&spec->layout, &l);
    m.name = (char *)(spec->name ? spec->name : "");
    m.layout = &l;
    m.budget_bytes = spec->budget_bytes;
    m.shared = spec->shared;
    m.n_allow_uids = spec->num_allow_uids;
    m.allow_uids = (uint32_t *)spec->allow_uids;
    m.n_allow_gids = spec->num_allow_gids;
    m.allow_gids = (uint32_t *)spec->allow_gids;
    m.open_existing = spec->open_existing;
    m.cluster = spec->cluster;
    m.disk_budget_bytes = spec->disk_budget_bytes;
    memset(&o, 0, sizeof(o));
    o.cache.out = out;
    req.op_case = KVDOCK__REQUEST__OP_CACHE_CREATE;
    req.cache_create = &m;
    return kvd__call(cli, &req, NULL, 0, info_finish, &o, req_id);
}

kvd_status_t kvd_cache_create(kvd_client_t *cli, const kvd_cache_spec_t *spec,
                              kvd_cache_info_t *out)
{
    return create_go(cli, spec, out, NULL);
}

kvd_status_t kvd_cache_create_submit(kvd_client_t *cli, const kvd_cache_spec_t *spec,
                                     kvd_cache_info_t *out, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return create_go(cli, spec, out, req_id);
}

static kvd_status_t drop_go(kvd_client_t *cli, uint64_t cache, const char *name,
                            uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__CacheDrop m = KVDOCK__CACHE_DROP__INIT;

    if (cli == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client is NULL");
    m.cache = cache;
    m.name = (char *)(name ? name : "");
    req.op_case = KVDOCK__REQUEST__OP_CACHE_DROP;
    req.cache_drop = &m;
    return kvd__call(cli, &req, NULL, 0, NULL, NULL, req_id);
}

kvd_status_t kvd_cache_drop(kvd_client_t *cli, uint64_t cache, const char *name)
{
    return drop_go(cli, cache, name, NULL);
}

kvd_status_t kvd_cache_drop_submit(kvd_client_t *cli, uint64_t cache, const char *name,
                                   uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return drop_go(cli, cache, name, req_id);
}

static kvd_status_t list_go(kvd_client_t *cli, kvd_cache_info_t *out, size_t cap, size_t *count,
                            uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__CacheList m = KVDOCK__CACHE_LIST__INIT;
    kvd__out_t o;

    if (cli == NULL || count == NULL || (out == NULL && cap > 0))
        return kvd__client_fail(cli, KVD_ENULL, "client, out or count is NULL");
    memset(&o, 0, sizeof(o));
    o.cache.out = out;
    o.cache.cap = cap;
    o.cache.count = count;
    req.op_case = KVDOCK__REQUEST__OP_CACHE_LIST;
    req.cache_list = &m;
    return kvd__call(cli, &req, NULL, 0, list_finish, &o, req_id);
}

kvd_status_t kvd_cache_list(kvd_client_t *cli, kvd_cache_info_t *out, size_t cap, size_t *count)
{
    return list_go(cli, out, cap, count, NULL);
}

kvd_status_t kvd_cache_list_submit(kvd_client_t *cli, kvd_cache_info_t *out, size_t cap,
                                   size_t *count, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return list_go(cli, out, cap, count, req_id);
}

static kvd_status_t stats_go(kvd_client_t *cli, uint64_t cache, const char *name,
                             kvd_cache_info_t *out, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__CacheStats m = KVDOCK__CACHE_STATS__INIT;
    kvd__out_t o;

    if (cli == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client is NULL");
    m.cache = cache;
    m.name = (char *)(name ? name : "");
    memset(&o, 0, sizeof(o));
    o.cache.out = out;
    req.op_case = KVDOCK__REQUEST__OP_CACHE_STATS;
    req.cache_stats = &m;
    return kvd__call(cli, &req, NULL, 0, info_finish, &o, req_id);
}

kvd_status_t kvd_cache_stats(kvd_client_t *cli, uint64_t cache, const char *name,
                             kvd_cache_info_t *out)
{
    return stats_go(cli, cache, name, out, NULL);
}

kvd_status_t kvd_cache_stats_submit(kvd_client_t *cli, uint64_t cache, const char *name,
                                    kvd_cache_info_t *out, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return stats_go(cli, cache, name, out, req_id);
}

/* ------------------------------------------------------------------------ */
/* Lookup, evict, release                                                    */

static kvd_status_t lookup_go(kvd_client_t *cli, uint64_t cache, const kvd_cache_keys_t *keys,
                              bool lease, uint32_t lease_ms, kvd_cache_lookup_result_t *out,
                              uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__CacheLookup m = KVDOCK__CACHE_LOOKUP__INIT;
    Kvdock__CacheKeys k;
    Kvdock__KeyAreaRef ref;
    ProtobufCBinaryData *owned;
    kvd__out_t o;
    kvd_status_t st;

    if (cli == NULL || keys == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client or keys is NULL");
    if ((st = keys_build(cli, keys, &k, &ref, &owned, "lookup keys")) != KVD_OK)
        return st;
    m.cache = cache;
    m.keys = &k;
    m.lease = lease;
    m.lease_ms = lease_ms;
    memset(&o, 0, sizeof(o));
    o.lookup.out = out;
    req.op_case = KVDOCK__REQUEST__OP_CACHE_LOOKUP;
    req.cache_lookup = &m;
    st = kvd__call(cli, &req, NULL, 0, lookup_finish, &o, req_id);
    free(owned);
    return st;
}

kvd_status_t kvd_cache_lookup(kvd_client_t *cli, uint64_t cache, const kvd_cache_keys_t *keys,
                              bool lease, uint32_t lease_ms, kvd_cache_lookup_result_t *out)
{
    return lookup_go(cli, cache, keys, lease, lease_ms, out, NULL);
}

kvd_status_t kvd_cache_lookup_submit(kvd_client_t *cli, uint64_t cache,
                                     const kvd_cache_keys_t *keys, bool lease, uint32_t lease_ms,
                                     kvd_cache_lookup_result_t *out, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return lookup_go(cli, cache, keys, lease, lease_ms, out, req_id);
}

static kvd_status_t evict_go(kvd_client_t *cli, uint64_t cache, const kvd_cache_keys_t *keys,
                             bool all, kvd_cache_evict_result_t *out, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__CacheEvict m = KVDOCK__CACHE_EVICT__INIT;
    Kvdock__CacheKeys k;
    Kvdock__KeyAreaRef ref;
    ProtobufCBinaryData *owned;
    kvd__out_t o;
    kvd_status_t st;

    if (cli == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client is NULL");
    if ((st = keys_build(cli, keys, &k, &ref, &owned, "evict keys")) != KVD_OK)
        return st;
    m.cache = cache;
    m.keys = &k;
    m.all = all;
    memset(&o, 0, sizeof(o));
    o.evict.out = out;
    req.op_case = KVDOCK__REQUEST__OP_CACHE_EVICT;
    req.cache_evict = &m;
    st = kvd__call(cli, &req, NULL, 0, evict_finish, &o, req_id);
    free(owned);
    return st;
}

kvd_status_t kvd_cache_evict(kvd_client_t *cli, uint64_t cache, const kvd_cache_keys_t *keys,
                             bool all, kvd_cache_evict_result_t *out)
{
    return evict_go(cli, cache, keys, all, out, NULL);
}

kvd_status_t kvd_cache_evict_submit(kvd_client_t *cli, uint64_t cache,
                                    const kvd_cache_keys_t *keys, bool all,
                                    kvd_cache_evict_result_t *out, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return evict_go(cli, cache, keys, all, out, req_id);
}

static kvd_status_t release_go(kvd_client_t *cli, uint64_t lease, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__CacheRelease m = KVDOCK__CACHE_RELEASE__INIT;

    if (cli == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client is NULL");
    m.lease = lease;
    req.op_case = KVDOCK__REQUEST__OP_CACHE_RELEASE;
    req.cache_release = &m;
    return kvd__call(cli, &req, NULL, 0, NULL, NULL, req_id);
}

kvd_status_t kvd_cache_release(kvd_client_t *cli, uint64_t lease)
{
    return release_go(cli, lease, NULL);
}

kvd_status_t kvd_cache_release_submit(kvd_client_t *cli, uint64_t lease, uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return release_go(cli, lease, req_id);
}

/* ------------------------------------------------------------------------ */
/* Save, load                                                                */

static kvd_status_t save_go(kvd_client_t *cli, const kvd_cache_save_t *a, const kvd_sync_t *sync,
                            kvd_op_result_t *out, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__CacheSave m = KVDOCK__CACHE_SAVE__INIT;
    Kvdock__CacheKeys k;
    Kvdock__KeyAreaRef ref;
    Kvdock__Sync s;
    ProtobufCBinaryData *owned;
    kvd__idx_msg_t blocks;
    kvd_status_t st;

    if (cli == NULL || a == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client or args is NULL");
    if (a->parent_len > 0 && a->parent == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "parent is NULL with parent_len %zu",
                                a->parent_len);
    if ((st = kvd__indices_build(cli, &a->blocks, &blocks, "save blocks")) != KVD_OK ||
        (st = keys_build(cli, &a->keys, &k, &ref, &owned, "save keys")) != KVD_OK)
        return st;
    m.cache = a->cache;
    m.pool = a->pool;
    m.keys = &k;
    m.blocks = &blocks.msg;
    m.parent.data = (uint8_t *)a->parent;
    m.parent.len = a->parent_len;
    req.sync = kvd__sync_build(sync, &s);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_SAVE;
    req.cache_save = &m;
    st = kvd__op_call(cli, &req, out, req_id);
    free(owned);
    return st;
}

kvd_status_t kvd_cache_save(kvd_client_t *cli, const kvd_cache_save_t *args,
                            const kvd_sync_t *sync, kvd_op_result_t *out)
{
    return save_go(cli, args, sync, out, NULL);
}

kvd_status_t kvd_cache_save_submit(kvd_client_t *cli, const kvd_cache_save_t *args,
                                   const kvd_sync_t *sync, kvd_op_result_t *out,
                                   uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return save_go(cli, args, sync, out, req_id);
}

static kvd_status_t load_go(kvd_client_t *cli, const kvd_cache_load_t *a, const kvd_sync_t *sync,
                            kvd_op_result_t *out, uint64_t *req_id)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__CacheLoad m = KVDOCK__CACHE_LOAD__INIT;
    Kvdock__CacheKeys k;
    Kvdock__KeyAreaRef ref;
    Kvdock__Sync s;
    Kvdock__BufRef flags = KVDOCK__BUF_REF__INIT;
    ProtobufCBinaryData *owned;
    kvd__idx_msg_t blocks;
    kvd_status_t st;

    if (cli == NULL || a == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client or args is NULL");
    if (a->num_layer_events > 0 && a->layer_events == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "layer_events is NULL");
    if ((st = kvd__indices_build(cli, &a->blocks, &blocks, "load blocks")) != KVD_OK ||
        (st = keys_build(cli, &a->keys, &k, &ref, &owned, "load keys")) != KVD_OK)
        return st;
    m.cache = a->cache;
    m.pool = a->pool;
    m.keys = &k;
    m.lease = a->lease;
    m.blocks = &blocks.msg;
    m.n_layer_events = a->num_layer_events;
    m.layer_events = (uint64_t *)a->layer_events;
    if (a->layer_flags.buffer != 0) {
        flags.buffer = a->layer_flags.buffer;
        flags.offset = a->layer_flags.offset;
        flags.bytes = a->layer_flags.bytes;
        m.layer_flags = &flags;
        m.flag_value = a->flag_value;
    }
    req.sync = kvd__sync_build(sync, &s);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_LOAD;
    req.cache_load = &m;
    st = kvd__op_call(cli, &req, out, req_id);
    free(owned);
    return st;
}

kvd_status_t kvd_cache_load(kvd_client_t *cli, const kvd_cache_load_t *args,
                            const kvd_sync_t *sync, kvd_op_result_t *out)
{
    return load_go(cli, args, sync, out, NULL);
}

kvd_status_t kvd_cache_load_submit(kvd_client_t *cli, const kvd_cache_load_t *args,
                                   const kvd_sync_t *sync, kvd_op_result_t *out,
                                   uint64_t *req_id)
{
    if (req_id == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "req_id is NULL");
    return load_go(cli, args, sync, out, req_id);
}
