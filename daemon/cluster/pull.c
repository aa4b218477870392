/* Pulls and queries of the peers: see pull.h. */
#include "pull.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "caches.h"
#include "server.h"

#define EARLY_MIN 16             /* blocks landed before a batch goes to the asker */
/* Rendezvous receives one pull runs at once (the rest wait in order):
 * UCX shares the link among all it is given, so a pull of 1,024 blocks
 * given at once lands nothing until nearly all of it is in; a few at a
 * time land in a steady stream that the load copies while the rest come,
 * and that shows the peer alive. */
#define RX_WINDOW_BYTES (16ull << 20) /* per lane */
#define RX_WINDOW_MIN 4

enum got_state { GOT_NONE, GOT_IN, GOT_FAILED, GOT_RECEIVING, GOT_WAITING };

/* What a lookup or a load asked of the peers (kvd__cluster_ask). */
struct pend {
    uint64_t id;
    int pull;
    kvd__pulls_t *ps;           /* its pulls */
    void (*landed)(void *arg, const uint32_t *pos, uint32_t count); /* the asker's */
    void (*answer)(void *arg, const uint8_t *present, const char *why,
                   const char *waited_for); /* NULL once called */
    void *arg;
    kvd__cache_t *cache;      /* referenced */
    uint32_t first, n;       /* the asker's keys [first, n) ... */
    uint32_t nask;           /* ... of which these were asked: */
    uint32_t *pos;           /*   their places in the asker's keys */
    uint8_t *keys;           /*   KVD_CACHE_KEY_MAX bytes each */
    uint8_t *klen;
    uint8_t *present;        /* bits over [first, n): some live peer has it */
    uint32_t covered;        /* asked keys some peer that answered holds */
    uint32_t *parent;        /* pulls: per asked key, the local block of the key before it */
    uint8_t *bits[KVD_CL_MAX_PEERS];/* each peer's answer over the asked keys */
    uint8_t asked[KVD_CL_MAX_PEERS], answered[KVD_CL_MAX_PEERS];
    uint8_t silent[KVD_CL_MAX_PEERS]; /* asked, and no answer came (in time, or at all) */
    /* pulls */
    uint32_t *ids;           /* reserved local block per asked key, or NONE */
    int8_t *from;            /* the peer asked for it, -1: none */
    uint8_t *got;            /* GOT_*: where its bytes are */
    uint32_t inflight;       /* block receives UCX still holds */
    void **desc;             /* GOT_WAITING: its rendezvous, not yet received ... */
    uint8_t *desc_lane;      /* ... on this lane */
    uint64_t token[KVD_CL_MAX_PEERS]; /* each peer's fetch: its blocks carry it */
    uint32_t *waitq;         /* the waiting keys in arrival order: [wq_head, wq_tail) */
    uint32_t wq_head, wq_tail;
    uint32_t window;         /* receives run at once at most */
    uint32_t *lpos;          /* the places of a batch of landed blocks, for landed() */
    uint32_t fresh;          /* blocks landed since the last batch */
    uint32_t *flist;         /* the asked keys of each peer's fetch, peer by peer: */
    uint32_t fbase[KVD_CL_MAX_PEERS], fcount[KVD_CL_MAX_PEERS]; /* where its run starts, how long */
    uint32_t expect[KVD_CL_MAX_PEERS], recvd[KVD_CL_MAX_PEERS]; /* blocks sent, blocks whose receive ended */
    uint8_t fetching[KVD_CL_MAX_PEERS], done[KVD_CL_MAX_PEERS];
    uint64_t progress_ns[KVD_CL_MAX_PEERS];
    int phase;               /* 0 asking, 1 pulling, 2 finished (waiting for UCX) */
    struct pend *leader;     /* a pull bringing in keys of this one: it ends after it */
    uint64_t started_ns;
    uint64_t deadline_ns;
    char why[200];
    struct pend *next;
};


/* A block's receive, straight into its reserved block. */
typedef struct block_rx {
    kvd__lane_op_t op;        /* first: the lanes hand this back */
    pend_t *p;
    uint32_t j;
} block_rx_t;

static void pend_check(kvd__pulls_t *ps, pend_t *p);
static void pend_start_pull(kvd__pulls_t *ps, pend_t *p);
static void rx_next(kvd__pulls_t *ps, pend_t *p);

static void fill_ref(const kvd__cache_t *k, Kvdock__Cluster__CacheRef *ref)
{
    kvdock__cluster__cache_ref__init(ref);
    ref->name = (char *)k->name;
    ref->num_layers = k->store.layout.num_layers;
    ref->mla = k->store.layout.mla;
    ref->tokens_per_block = k->store.layout.tokens_per_block;
    ref->token_bytes = k->store.layout.token_bytes;
    ref->dtype = (char *)k->store.layout.dtype;
}

static pend_t *pend_find(kvd__pulls_t *ps, uint64_t id)
{
    for (pend_t *p = ps->pends; p; p = p->next)
        if (p->id == id)
            return p;
    return NULL;
}

static void pend_free(kvd__pulls_t *ps, pend_t *p)
{
    pend_t **pp;

    for (pp = &ps->pends; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    for (uint32_t i = 0; i < KVD_CL_MAX_PEERS; i++)
        free(p->bits[i]);
    kvd__cache_unref(p->cache);
    free(p->parent);
    free(p->pos);
    free(p->keys);
    free(p->klen);
    free(p->present);
    free(p->ids);
    free(p->from);
    free(p->got);
    free(p->flist);
    free(p->desc);
    free(p->desc_lane);
    free(p->waitq);
    free(p->lpos);
    free(p);
}

/* Once finished, p goes when UCX holds none of its blocks. */
static void pend_maybe_free(kvd__pulls_t *ps, pend_t *p)
{
    if (p->phase == 2 && p->inflight == 0)
        pend_free(ps, p);
}

/* Drop the rendezvous still waiting for a receive, of peer `peer` or of
 * every peer (-1): their blocks did not come. */
static void rx_drop_waiting(kvd__pulls_t *ps, pend_t *p, int peer)
{
    for (uint32_t q = p->wq_head; p->waitq != NULL && q < p->wq_tail; q++) {
        uint32_t j = p->waitq[q];
        if (p->got[j] != GOT_WAITING || (peer >= 0 && p->from[j] != peer))
            continue;
        kvd__lane_release(kvd__lane_at(ps->lanes, p->desc_lane[j]), p->desc[j]);
        p->desc[j] = NULL;
        p->got[j] = GOT_FAILED;
    }
}

/* The peers p asked that did not answer, HOST:PORT comma-separated (as
 * many as fit, then "..."). */
static void silent_peers(const kvd__pulls_t *ps, const pend_t *p, char *out, size_t len)
{
    size_t at = 0;

    out[0] = '\0';
    for (uint32_t i = 0; i < ps->links->npeers; i++) {
        const char *a = ps->links->peers[i].addr;
        if (!p->silent[i])
            continue;
        if (at + strlen(a) + 5 > len) { /* room for ",..." */
            snprintf(out + at, len - at, "%s...", at ? "," : "");
            return;
        }
        at += (size_t)snprintf(out + at, len - at, "%s%s", at ? "," : "", a);
    }
}

/* Every asked peer answered or the deadline passed: commit what came,
 * tell the asker, and free p once UCX holds none of its blocks. */
static void pend_finish(kvd__pulls_t *ps, pend_t *p)
{
    kvd__cache_store_t *c = &p->cache->store;
    uint32_t missing = 0, first_missing = 0;

    if (p->phase == 2)
        return;
    p->phase = 2;
    if (p->pull) {
        rx_drop_waiting(ps, p, -1);
        for (uint32_t j = p->nask; p->ids != NULL && j-- > 0;) { /* the last first: parents
                                                                  * stay more recent */
            if (p->ids[j] == KVD_CBLOCK_NONE || p->got[j] == GOT_RECEIVING)
                continue; /* UCX still writes it: settled when its receive ends */
            if (p->got[j] == GOT_IN && !p->cache->dropped)
                kvd__cache_commit(c, p->ids[j]);
            else
                kvd__cache_abort(c, p->ids[j]);
            p->ids[j] = KVD_CBLOCK_NONE;
        }
        kvd__cache_disk_flush(c);
        for (uint32_t j = 0; j < p->nask; j++)
            if ((p->got == NULL || p->got[j] != GOT_IN) && missing++ == 0)
                first_missing = p->pos[j];
        if (missing > 0 && p->why[0] == '\0')
            snprintf(p->why, sizeof(p->why), "no live peer had them");
        kvd_log(KVD_LOG_DEBUG, "event=cluster_pull cache=%s asked=%u missing=%u first=%u",
                p->cache->name, p->nask, missing, first_missing);
    }
    if (p->answer != NULL) {
        void (*answer)(void *, const uint8_t *, const char *, const char *) = p->answer;
        char silent[256];
        p->answer = NULL;
        p->landed = NULL;
        silent_peers(ps, p, silent, sizeof(silent));
        answer(p->arg, p->present, p->why, silent);
    }
    for (pend_t *f = ps->pends, *next; f; f = next) { /* pulls that waited for this one */
        next = f->next;
        if (f->leader == p) {
            f->leader = NULL;
            pend_check(ps, f);
            next = ps->pends; /* the list may have changed: again from the start */
        }
    }
    pend_maybe_free(ps, p);
}

/* A receive UCX held ended: the block is in (ok) or not. */
static void block_landed(pend_t *p, uint32_t j, int ok)
{
    kvd__pulls_t *ps = p->ps;
    int8_t from = p->from[j];

    p->got[j] = ok ? GOT_IN : GOT_FAILED;
    if (from >= 0) {
        p->recvd[from]++;
        p->progress_ns[from] = kvd__now_ns();
    }
    if (ok && from >= 0) {
        kvd__peer_t *pe = &ps->links->peers[from];
        pe->blocks_fetched++;
        pe->bytes_fetched += p->cache->store.block_bytes;
        p->cache->fetched++;
        ps->blocks_fetched++;
        ps->bytes_fetched += p->cache->store.block_bytes;
        p->fresh++;
    }
    if (p->phase == 2) { /* finished before this receive ended */
        if (p->ids[j] != KVD_CBLOCK_NONE) {
            if (p->got[j] == GOT_IN && !p->cache->dropped)
                kvd__cache_commit(&p->cache->store, p->ids[j]);
            else
                kvd__cache_abort(&p->cache->store, p->ids[j]);
            kvd__cache_disk_flush(&p->cache->store);
            p->ids[j] = KVD_CBLOCK_NONE;
        }
    }
}

/* Asking ends when every asked peer answered, or once the peers that
 * answered hold every asked key between them: a peer that is slow or
 * stopped then costs nothing (its answer could change nothing). */
static int pend_all_done(const pend_t *p)
{
    if (p->leader != NULL)
        return 0;
    if (p->phase == 0 && p->nask > 0 && p->covered == p->nask)
        return 1;
    for (uint32_t i = 0; i < KVD_CL_MAX_PEERS; i++) {
        if (p->phase == 0 && p->asked[i] && !p->answered[i])
            return 0;
        if (p->phase == 1 && p->fetching[i] && (!p->done[i] || p->recvd[i] < p->expect[i]))
            return 0;
    }
    return 1;
}

/* Blocks have landed while the pull goes on: commit them and hand them to
 * the asker now (a load copies them into the worker's pool), so that the
 * copy overlaps the rest of the pull instead of following it. */
static void pend_early(pend_t *p)
{
    kvd__cache_store_t *c = &p->cache->store;
    uint32_t count = 0;

    if (p->cache->dropped)
        return;
    for (uint32_t j = p->nask; j-- > 0;) { /* the last first, as saves commit */
        if (p->got[j] != GOT_IN || p->ids[j] == KVD_CBLOCK_NONE)
            continue;
        if (kvd__cache_commit(c, p->ids[j]))
            p->lpos[count++] = p->pos[j];
        p->ids[j] = KVD_CBLOCK_NONE; /* the tier's now */
    }
    kvd__cache_disk_flush(c); /* their records go to disk now */
    p->fresh = 0;
    if (count > 0)
        p->landed(p->arg, p->lpos, count);
}

static void pend_check(kvd__pulls_t *ps, pend_t *p)
{
    if (p->phase == 1 && p->landed != NULL && p->lpos != NULL &&
        p->fresh >= (p->nask / 8 > EARLY_MIN ? p->nask / 8 : EARLY_MIN) && !pend_all_done(p))
        pend_early(p);
    if (p->phase == 2 || !pend_all_done(p))
        return;
    if (p->phase == 0 && p->pull) {
        pend_start_pull(ps, p);
        if (p->phase == 1 && !pend_all_done(p))
            return;
    }
    pend_finish(ps, p);
}

/* Peer i is gone: what it owed every request is lost. */
void kvd__pull_peer_lost(kvd__pulls_t *ps, uint32_t i, const char *why)
{
    pend_t *p, *next;

    for (p = ps->pends; p; p = next) {
        next = p->next;
        if (p->phase == 2)
            continue;
        if (p->phase == 0 && p->asked[i] && !p->answered[i])
            p->silent[i] = 1;
        if ((p->phase == 0 && p->asked[i] && !p->answered[i]) ||
            (p->phase == 1 && p->fetching[i] && (!p->done[i] || p->recvd[i] < p->expect[i]))) {
            if (p->why[0] == '\0')
                snprintf(p->why, sizeof(p->why), "peer %s: %s", ps->links->peers[i].addr, why);
            p->answered[i] = 1;
            p->done[i] = 1;
            p->expect[i] = p->recvd[i];
            if (p->phase == 1)
                rx_drop_waiting(ps, p, (int)i);
            if (p->phase == 1)
                for (uint32_t j = 0; j < p->nask; j++)
                    if (p->from[j] == (int8_t)i && p->got[j] == GOT_NONE)
                        p->got[j] = GOT_FAILED;
            pend_check(ps, p);
        }
    }
}

static int ask(kvd__pulls_t *ps, pend_t *p, uint32_t i, int fetch, const uint32_t *which,
               uint32_t count)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Query q = KVDOCK__CLUSTER__QUERY__INIT;
    Kvdock__Cluster__Fetch f = KVDOCK__CLUSTER__FETCH__INIT;
    Kvdock__Cluster__CacheRef ref;
    ProtobufCBinaryData *keys = calloc(count ? count : 1, sizeof(*keys));
    int rc;

    if (keys == NULL)
        return -1;
    fill_ref(p->cache, &ref);
    for (uint32_t j = 0; j < count; j++) {
        uint32_t a = which ? which[j] : j;
        keys[j].data = p->keys + (size_t)a * KVD_CACHE_KEY_MAX;
        keys[j].len = p->klen[a];
    }
    if (fetch) {
        f.id = p->id;
        f.token = p->token[i];
        f.cache = &ref;
        f.n_keys = count;
        f.keys = keys;
        m.m_case = KVDOCK__CLUSTER__MSG__M_FETCH;
        m.fetch = &f;
    } else {
        q.id = p->id;
        q.cache = &ref;
        q.n_keys = count;
        q.keys = keys;
        m.m_case = KVDOCK__CLUSTER__MSG__M_QUERY;
        m.query = &q;
    }
    rc = kvd__link_send(ps->links->peers[i].link, &m);
    free(keys);
    return rc;
}

/* The pull in flight (other than self) that reserved block id of self's
 * cache, if any. */
static pend_t *puller_of(kvd__pulls_t *ps, const pend_t *self, uint32_t id)
{
    for (pend_t *p = ps->pends; p; p = p->next)
        if (p != self && p->cache == self->cache && p->phase == 1 && p->ids != NULL)
            for (uint32_t j = 0; j < p->nask; j++)
                if (p->ids[j] == id && p->got[j] != GOT_FAILED)
                    return p;
    return NULL;
}

/* The answers are in: each asked key goes to the peer holding it that has
 * the fewest so far (the pull spreads over the holders), into a block
 * reserved for it in the local tier. */
static void pend_start_pull(kvd__pulls_t *ps, pend_t *p)
{
    kvd__cache_store_t *c = &p->cache->store;
    uint32_t load[KVD_CL_MAX_PEERS] = {0}, parent, there, at = 0;
    char why[160];
    int full = 0; /* the tier refused a block: none after it */

    p->phase = 1;
    p->ids = malloc(p->nask * sizeof(*p->ids));
    p->from = malloc(p->nask);
    p->got = calloc(p->nask, 1);
    p->flist = malloc(p->nask * sizeof(*p->flist));
    p->desc = calloc(p->nask, sizeof(*p->desc));
    p->desc_lane = calloc(p->nask, 1);
    p->waitq = malloc(p->nask * sizeof(*p->waitq));
    p->window = (uint32_t)(RX_WINDOW_BYTES / c->block_bytes);
    if (p->window < RX_WINDOW_MIN)
        p->window = RX_WINDOW_MIN;
    p->window *= ps->lanes->n;
    p->lpos = malloc(p->nask * sizeof(*p->lpos)); /* no batches without it: fine */
    if (p->ids == NULL || p->from == NULL || p->got == NULL || p->flist == NULL ||
        p->desc == NULL || p->desc_lane == NULL || p->waitq == NULL) {
        free(p->ids); /* nothing is pulled: the load names every key missing */
        free(p->from);
        free(p->got);
        free(p->flist);
        free(p->desc);
        free(p->desc_lane);
        free(p->waitq);
        p->ids = NULL;
        p->from = NULL;
        p->got = NULL;
        p->flist = NULL;
        p->desc = NULL;
        p->desc_lane = NULL;
        p->waitq = NULL;
        snprintf(p->why, sizeof(p->why), "out of memory");
        return;
    }
    for (uint32_t j = 0; j < p->nask; j++) {
        int best = -1;
        p->ids[j] = KVD_CBLOCK_NONE;
        p->from[j] = -1;
        for (uint32_t i = 0; i < ps->links->npeers; i++)
            if (p->bits[i] != NULL && kvd__cluster_bit(p->bits[i], j) &&
                ps->links->peers[i].state == KVD_PEER_UP && (best < 0 || load[i] < load[best]))
                best = (int)i;
        /* the parent: the block reserved for the request's key before this
         * one, or that key's block here (held since the request came) */
        parent = j > 0 && p->pos[j - 1] + 1 == p->pos[j] ? p->ids[j - 1] : p->parent[j];
        if (best < 0 || full)
            continue; /* on no peer, or the tier is full: not reserved */
        there = kvd__cache_find(c, p->keys + (size_t)j * KVD_CACHE_KEY_MAX, p->klen[j]);
        if (there != KVD_CBLOCK_NONE) { /* another save or pull made it meanwhile */
            if (p->leader == NULL && kvd__cache_block(c, there)->state == KVD_CBLOCK_FILLING)
                p->leader = puller_of(ps, p, there); /* run after that pull */
            continue;
        }
        if (kvd__cache_reserve(c, parent, p->keys + (size_t)j * KVD_CACHE_KEY_MAX, p->klen[j],
                               &p->ids[j], why, sizeof(why)) != KVD_OK) {
            p->ids[j] = KVD_CBLOCK_NONE;
            snprintf(p->why, sizeof(p->why), "the local tier has no room for them (%s)", why);
            full = 1;
            continue;
        }
        p->from[j] = (int8_t)best;
        load[best]++;
    }
    for (uint32_t i = 0; i < ps->links->npeers; i++) {
        uint32_t *which = p->flist + at;
        if (load[i] == 0)
            continue;
        p->fbase[i] = at;
        for (uint32_t j = 0; j < p->nask; j++)
            if (p->from[j] == (int8_t)i)
                p->flist[at++] = j;
        p->fcount[i] = at - p->fbase[i];
        p->fetching[i] = 1;
        p->progress_ns[i] = kvd__now_ns();
        kvd__clc_random((uint8_t *)&p->token[i], sizeof(p->token[i]));
        if (ask(ps, p, i, 1, which, p->fcount[i]) != 0) {
            p->done[i] = 1;
            for (uint32_t j = 0; j < p->fcount[i]; j++)
                p->got[which[j]] = GOT_FAILED;
        }
    }
}

kvd_status_t kvd__pull_ask(kvd__pulls_t *ps, const kvd__cluster_ask_t *a, char *why,
                             size_t why_len)
{
    kvd__cache_t *k = a->cache;
    uint32_t first = a->first, n = a->n, asked = 0, nask = 0;
    pend_t *p = calloc(1, sizeof(*p));

    if (p == NULL) {
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    p->ps = ps;
    p->id = ps->next_id++;
    p->pull = a->pull;
    p->landed = a->landed;
    p->answer = a->done;
    p->arg = a->arg;
    p->first = first;
    p->n = n;
    p->cache = k;
    k->refs++;
    p->pos = malloc((n - first) * sizeof(*p->pos));
    p->keys = malloc((size_t)(n - first) * KVD_CACHE_KEY_MAX);
    p->klen = malloc(n - first);
    p->present = calloc((n - first + 7) / 8 + 1, 1);
    p->parent = malloc((n - first) * sizeof(*p->parent));
    if (p->pos == NULL || p->keys == NULL || p->klen == NULL || p->present == NULL ||
        p->parent == NULL) {
        pend_free(ps, p);
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    for (uint32_t i = first, here = KVD_CBLOCK_NONE; i < n; i++) {
        /* a pull asks only for the keys the tier lacks (neither ready nor
         * filling); the asker holds those it has */
        uint32_t id = a->pull ? kvd__cache_find(&k->store, a->keys[i], a->lens[i])
                              : KVD_CBLOCK_NONE;
        if (id != KVD_CBLOCK_NONE) {
            here = KVD_CBLOCK_NONE;
            if (kvd__cache_block(&k->store, id)->state == KVD_CBLOCK_READY)
                here = id;
            else if (p->leader == NULL) /* filling: if a pull brings it, wait for that */
                p->leader = puller_of(ps, p, id);
            continue;
        }
        p->parent[nask] = here;
        here = KVD_CBLOCK_NONE;
        p->pos[nask] = i;
        memcpy(p->keys + (size_t)nask * KVD_CACHE_KEY_MAX, a->keys[i], a->lens[i]);
        p->klen[nask] = (uint8_t)a->lens[i];
        nask++;
    }
    p->nask = nask;
    p->next = ps->pends;
    ps->pends = p;
    p->started_ns = kvd__now_ns();
    p->deadline_ns = p->started_ns + ps->deadline_ns;
    for (uint32_t i = 0; i < ps->links->npeers && nask > 0; i++) {
        if (ps->links->peers[i].state != KVD_PEER_UP || ps->links->peers[i].link == NULL)
            continue;
        if ((p->bits[i] = calloc((nask + 7) / 8 + 1, 1)) == NULL)
            continue;
        p->asked[i] = 1;
        p->progress_ns[i] = kvd__now_ns();
        ps->links->peers[i].queries++;
        if (ask(ps, p, i, 0, NULL, nask) != 0) {
            p->answered[i] = 1;
            continue;
        }
        asked++;
    }
    if (asked == 0 && p->leader == NULL) { /* nobody to ask or wait for */
        snprintf(why, why_len, "%s", nask > 0 ? "no peer is up" : "");
        p->answer = NULL;
        p->phase = 2;
        pend_free(ps, p);
        return KVD_ENOENT;
    }
    if (asked == 0)
        p->phase = 1; /* only waiting for the leader's pull */
    return KVD_OK;
}

/* The request that awaits this answer of request id from l's peer, in
 * phase (0: a query's reply, 1: a fetch's end), marked answered (answered[]
 * or done[]), with the peer's index in *i; or NULL: not ours, not in that
 * phase now, not asked of that peer, or answered already (a repeat). */
static pend_t *take_answer(kvd__pulls_t *ps, const kvd__link_t *l, uint64_t id, int phase,
                           uint32_t *i)
{
    pend_t *p = pend_find(ps, id);
    uint8_t *wanted, *answered;

    if (p == NULL || l->peer == NULL || p->phase != phase)
        return NULL;
    *i = (uint32_t)(l->peer - ps->links->peers);
    wanted = phase == 0 ? p->asked : p->fetching;
    answered = phase == 0 ? p->answered : p->done;
    if (!wanted[*i] || answered[*i])
        return NULL;
    answered[*i] = 1;
    return p;
}

/* A receive ended: settle its block. */
static void rx_end(block_rx_t *rx, ucs_status_t status, size_t length)
{
    pend_t *p = rx->p;

    p->inflight--;
    block_landed(p, rx->j, status == UCS_OK && length == p->cache->store.block_bytes);
    free(rx);
}

void kvd__pull_received(kvd__pulls_t *ps, kvd__lane_op_t *op)
{
    block_rx_t *rx = (block_rx_t *)op;
    pend_t *p = rx->p;

    rx_end(rx, op->status, op->length);
    if (p->phase == 2) {
        pend_maybe_free(ps, p);
        return;
    }
    rx_next(ps, p);
    pend_check(ps, p);
}

/* Receive block j's rendezvous `data` (on lane ln) straight into its
 * reserved block. */
static void rx_start(pend_t *p, uint32_t j, kvd__lane_t *ln, void *data)
{
    block_rx_t *rx = calloc(1, sizeof(*rx));

    p->inflight++;
    p->got[j] = GOT_RECEIVING;
    if (rx == NULL) {
        kvd__lane_release(ln, data);
        p->inflight--;
        block_landed(p, j, 0);
        return;
    }
    rx->p = p;
    rx->j = j;
    kvd__lane_recv(ln, &rx->op, data, kvd__cache_block_bytes(&p->cache->store, p->ids[j]),
                   p->cache->store.block_bytes);
}

/* Start the waiting receives the window has room for, in arrival order. */
static void rx_next(kvd__pulls_t *ps, pend_t *p)
{
    while (p->inflight < p->window && p->wq_head < p->wq_tail) {
        uint32_t j = p->waitq[p->wq_head++];
        void *data = p->desc[j];

        if (p->got[j] != GOT_WAITING)
            continue; /* dropped meanwhile */
        p->desc[j] = NULL;
        rx_start(p, j, kvd__lane_at(ps->lanes, p->desc_lane[j]), data);
    }
}

/* A block for a fetch of ours lands (or waits for the window); anything
 * else is dropped. */
void kvd__pull_arrived(kvd__pulls_t *ps, kvd__lane_t *ln, const uint64_t hdr[KVD_LANE_HDR],
                       const void *bytes, void *rndv, size_t length)
{
    pend_t *p = ps->closing ? NULL : pend_find(ps, hdr[0]);
    uint32_t i = KVD_CL_MAX_PEERS, j;

    if (p != NULL && p->phase == 1)
        for (i = 0; i < ps->links->npeers; i++)
            if (p->fetching[i] && p->token[i] == hdr[2])
                break;
    if (p == NULL || p->phase != 1 || i >= ps->links->npeers || hdr[1] >= p->fcount[i])
        goto drop; /* not a fetch of ours, or not a key asked of that peer */
    j = p->flist[p->fbase[i] + hdr[1]];
    if (p->got[j] != GOT_NONE || p->ids[j] == KVD_CBLOCK_NONE ||
        length != p->cache->store.block_bytes)
        goto drop; /* twice, after its peer was given up, or of another size */
    p->progress_ns[i] = kvd__now_ns();
    if (rndv == NULL) {
        memcpy(kvd__cache_block_bytes(&p->cache->store, p->ids[j]), bytes, length);
        block_landed(p, j, 1);
    } else if (p->inflight >= p->window) { /* received when the window has room */
        p->got[j] = GOT_WAITING;
        p->desc[j] = rndv;
        p->desc_lane[j] = (uint8_t)kvd__lane_index(ps->lanes, ln);
        p->waitq[p->wq_tail++] = j;
    } else {
        rx_start(p, j, ln, rndv);
    }
    pend_check(ps, p);
    return;
drop:
    /* a stray block (a fetch given up, or a peer sending what was not
     * asked): the link it came by is not known here, only its lane */
    ps->stray++;
    if (rndv != NULL)
        kvd__lane_release(ln, rndv);
}

void kvd__pull_query_reply(kvd__pulls_t *ps, kvd__link_t *l, const Kvdock__Cluster__QueryReply *r)
{
    uint32_t i;
    pend_t *p = take_answer(ps, l, r->id, 0, &i);

    if (p == NULL)
        return;
    if (r->present.len >= (p->nask + 7) / 8) {
        memcpy(p->bits[i], r->present.data, (p->nask + 7) / 8);
        for (uint32_t j = 0; j < p->nask; j++)
            if (kvd__cluster_bit(p->bits[i], j) &&
                !kvd__cluster_bit(p->present, p->pos[j] - p->first)) {
                kvd__cl_set_bit(p->present, p->pos[j] - p->first);
                p->covered++;
            }
    }
    pend_check(ps, p);
}

void kvd__pull_fetch_done(kvd__pulls_t *ps, kvd__link_t *l, const Kvdock__Cluster__FetchDone *f)
{
    uint32_t i;
    pend_t *p = take_answer(ps, l, f->id, 1, &i);

    if (p == NULL)
        return;
    p->expect[i] = f->sent;
    p->progress_ns[i] = kvd__now_ns();
    pend_check(ps, p);
}

void kvd__pull_tick(kvd__pulls_t *ps, uint64_t now)
{
    pend_t *p, *next;

again:
    for (p = ps->pends; p; p = next) {
        next = p->next;
        if (p->phase == 0 && now >= p->deadline_ns) {
            for (uint32_t i = 0; i < KVD_CL_MAX_PEERS; i++)
                if (p->asked[i] && !p->answered[i]) {
                    p->answered[i] = 1;
                    p->silent[i] = 1;
                    if (p->why[0] == '\0')
                        snprintf(p->why, sizeof(p->why), "peer %s did not answer within %" PRIu64
                                 " ms", ps->links->peers[i].addr, ps->deadline_ns / 1000000);
                }
            pend_check(ps, p);
        } else if (p->phase == 1) {
            for (uint32_t i = 0; i < ps->links->npeers; i++) {
                kvd__peer_t *pe = &ps->links->peers[i];
                if (!p->fetching[i] || (p->done[i] && p->recvd[i] >= p->expect[i]))
                    continue;
                if (kvd__cl_since(now, p->progress_ns[i]) > ps->deadline_ns && pe->link != NULL) {
                    char why[160];
                    snprintf(why, sizeof(why), "sent nothing for %" PRIu64 " ms of a pull",
                             ps->deadline_ns / 1000000);
                    pe->failures++;
                    kvd__link_drop(pe->link, why); /* ends its transfers */
                    goto again; /* asks may have ended meanwhile */
                }
            }
        }
    }
}

void kvd__pull_close(kvd__pulls_t *ps)
{
    ps->closing = 1;
    while (ps->pends) { /* end with what came; freed once UCX lets go */
        pend_t *p = ps->pends;
        if (p->phase == 2) {
            /* only waiting for UCX: the endpoints close later */
            ps->pends = p->next;
            p->next = NULL;
            continue;
        }
        if (p->why[0] == '\0')
            snprintf(p->why, sizeof(p->why), "the daemon is shutting down");
        for (uint32_t i = 0; i < KVD_CL_MAX_PEERS; i++)
            p->answered[i] = p->done[i] = 1;
        pend_finish(ps, p);
    }
}
