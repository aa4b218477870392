/* Serving the peers: see serve.h. */
#include "serve.h"

#include <stdlib.h>
#include <string.h>

#include "caches.h"
#include "server.h"

/* A block sent to a peer's lane (the loop's bookkeeping of it). */
typedef struct sendctx {
    kvd__lane_op_t op;        /* first: the lanes hand this back */
    kvd__cache_t *cache;      /* unheld when sent */
    uint32_t block;
    uint64_t hdr[KVD_LANE_HDR]; /* its header (fetch id, index, token): UCX reads it
                                 * until the send completes */
} sendctx_t;

static kvd__cache_t *cluster_cache(kvd__serve_t *sv, const Kvdock__Cluster__CacheRef *ref)
{
    if (ref == NULL || ref->name == NULL)
        return NULL;
    for (kvd__cache_t *k = sv->srv->caches; k; k = k->next) {
        const kvd__block_layout_t *l = &k->store.layout;
        if (k->cluster && strcmp(k->name, ref->name) == 0 && l->num_layers == ref->num_layers &&
            !l->mla == !ref->mla && l->tokens_per_block == ref->tokens_per_block &&
            l->token_bytes == ref->token_bytes && ref->dtype != NULL &&
            strcmp(l->dtype, ref->dtype) == 0)
            return k;
    }
    return NULL;
}

void kvd__serve_query(kvd__serve_t *sv, kvd__link_t *l, const Kvdock__Cluster__Query *q)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__QueryReply qr = KVDOCK__CLUSTER__QUERY_REPLY__INIT;
    kvd__cache_t *k = cluster_cache(sv, q->cache);
    uint8_t *bits = calloc((q->n_keys + 7) / 8 + 1, 1);

    if (bits == NULL)
        return;
    for (size_t i = 0; k != NULL && i < q->n_keys; i++) {
        uint32_t id;
        if (q->keys[i].len < 1 || q->keys[i].len > KVD_CACHE_KEY_MAX)
            continue;
        id = kvd__cache_find(&k->store, q->keys[i].data, q->keys[i].len);
        /* blocks on disk only are not served to peers: reported missing */
        if (id != KVD_CBLOCK_NONE && kvd__cache_in_host(&k->store, id))
            kvd__cl_set_bit(bits, (uint32_t)i);
    }
    qr.id = q->id;
    qr.present.data = bits;
    qr.present.len = (q->n_keys + 7) / 8;
    m.m_case = KVDOCK__CLUSTER__MSG__M_QUERY_REPLY;
    m.query_reply = &qr;
    (void)kvd__link_send(l, &m);
    free(bits);
}

void kvd__serve_fetch(kvd__serve_t *sv, kvd__link_t *l, const Kvdock__Cluster__Fetch *f)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__FetchDone fd = KVDOCK__CLUSTER__FETCH_DONE__INIT;
    kvd__cache_t *k = cluster_cache(sv, f->cache);
    uint8_t *missing = calloc((f->n_keys + 7) / 8 + 1, 1);
    uint32_t sent = 0;

    if (missing == NULL)
        return;
    for (size_t i = 0; i < f->n_keys; i++) {
        uint32_t id = KVD_CBLOCK_NONE;
        sendctx_t *sc;

        if (k != NULL && f->keys[i].len >= 1 && f->keys[i].len <= KVD_CACHE_KEY_MAX)
            id = kvd__cache_find(&k->store, f->keys[i].data, f->keys[i].len);
        if (l->nlanes == 0 || id == KVD_CBLOCK_NONE ||
            !kvd__cache_in_host(&k->store, id) ||
            (sc = calloc(1, sizeof(*sc))) == NULL) {
            kvd__cl_set_bit(missing, (uint32_t)i);
            continue;
        }
        kvd__cache_hold(&k->store, id);
        kvd__cache_touch(&k->store, id);
        k->refs++;
        sc->cache = k;
        sc->block = id;
        sc->hdr[0] = f->id;
        sc->hdr[1] = i;
        sc->hdr[2] = f->token;
        /* block i to the fetcher's lane i % n */
        kvd__lane_send(l->lane_ep[i % l->nlanes], &sc->op, sc->hdr,
                       kvd__cache_block_bytes(&k->store, id), k->store.block_bytes);
        sent++;
    }
    fd.id = f->id;
    fd.sent = sent;
    fd.missing.data = missing;
    fd.missing.len = (f->n_keys + 7) / 8;
    m.m_case = KVDOCK__CLUSTER__MSG__M_FETCH_DONE;
    m.fetch_done = &fd;
    (void)kvd__link_send(l, &m);
    free(missing);
}

void kvd__serve_sent(kvd__serve_t *sv, kvd__lane_op_t *op)
{
    sendctx_t *sc = (sendctx_t *)op;
    ucs_status_t status = op->status;

    if (sc->cache != NULL) {
        kvd__cache_unhold(&sc->cache->store, sc->block);
        if (status == UCS_OK) {
            sc->cache->served++;
            sv->blocks_served++;
            sv->bytes_served += sc->cache->store.block_bytes;
        }
        kvd__cache_unref(sc->cache);
    }
    free(sc);
}
