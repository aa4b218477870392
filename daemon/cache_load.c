/* A cache load as a plan: see cache_load.h. */
#include "cache_load.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "account.h"
#include "cache_copy.h"
#include "conn.h"
#include "log.h"
#include "park.h"

#define MAX_GROUPS 128  /* layer events or flags of one load (ops_cache.c checks) */
#define EARLY_COPIES 2  /* copies of landed blocks in flight at once, at most */

/* A block of the plan: not here (or being read), held, its copy
 * submitted, copied early with its holds let go (its host slot may take
 * the next block read). */
enum { B_ABSENT, B_HELD, B_COPYING, B_DONE };

struct load_fetch {
    kvd__load_t *l; /* set once its read was asked for: never asked again */
    uint32_t pos;
};

/* A copy of landed blocks in flight: the places in the plan it moves. */
struct early_copy {
    kvd__load_t *l;
    uint32_t m;
    uint32_t pos[];
};

struct kvd__load {
    kvd__origin_t origin;       /* held: bytes of this plan */
    kvd__cache_t *cache;        /* referenced */
    kvd__pool_t *pool;
    kvd__dataop_sync_t sync;    /* each copy's: the pool, buffers, events */
    void *levs[MAX_GROUPS];
    uint32_t nevents;
    uint32_t *flags;
    uint32_t nflags, flag_value;
    uint32_t n;
    int64_t *pages;            /* [n] */
    /* [n] of KVD_CACHE_KEY_MAX: the request's keys, or a lease's blocks'
     * where the cache has a disk level (load_free finds again by them the
     * blocks it let go early); else NULL */
    uint8_t *keys;
    uint8_t *klen;
    kvd__lease_t *lease;        /* the client's until the load runs, then the plan's */
    int lease_taken;
    uint32_t *ids;             /* [n] the block of each while held, else NONE */
    uint8_t *state;            /* [n] B_* */
    uint32_t *heldq;           /* [n] places made B_HELD, in order: [qhead, qtail) not */
    uint32_t qhead, qtail;     /* submitted in an early copy yet */
    uint32_t fetch_next;       /* places before it: each read asked for, or not on disk */
    uint32_t copies;           /* copies of landed blocks in flight */
    uint32_t copied;           /* blocks they moved */
    kvd_status_t copy_status;  /* the first one's failure */
    int waiting;               /* kvd__load_wait: an operation in flight on its connection */
    int ending;                /* kvd__load_end came: ends once copies is 0 */
    int brought;               /* blocks were to be brought (why names what failed) */
    int busy;                  /* a block on disk found no host slot to be read into */
    char busy_why[200];        /* why not (the cache's words) */
    uint64_t deadline_ns;      /* its wait for a slot ends (load_park; 0: none yet) */
    int fetching;              /* the reads from disk end the plan (kvd__load_fetch) */
    uint32_t let_go;           /* blocks copied early, their holds let go */
    struct load_fetch *fetches; /* [n] the reads from disk (kvd__load_fetch) */
    uint32_t reading;          /* of them, in flight */
    char why[200];
};

static uint64_t plan_bytes(uint32_t n, int keys)
{
    return sizeof(kvd__load_t) +
           (uint64_t)n * (sizeof(int64_t) + 2 * sizeof(uint32_t) + 1 +
                          sizeof(struct load_fetch) + (keys ? KVD_CACHE_KEY_MAX + 1 : 0));
}

/* The plan goes.  Its blocks go back to the recency and host lists as
 * one chain, the last first, so that the first is the most recent, as a
 * lookup's touch leaves a chain: those it holds are let go, the lease's
 * holds first so that each block's last hold goes in that pass; and where
 * it let blocks go early (each as its copy ended: in the order the reads
 * and copies ended), those are touched again in their places, found by
 * their keys (an id let go may name another block by now).  So the next
 * lookup of the chain finds it one piece. */
static void load_free(kvd__load_t *l)
{
    kvd__cache_store_t *c = &l->cache->store;
    int waiting = l->waiting;
    kvd__conn_t *conn = l->origin.conn;
    uint32_t held = 0, id;

    if (l->lease_taken)
        kvd__lease_end(l->cache, l->lease);
    for (uint32_t i = l->n; i-- > 0;) {
        if (l->ids[i] != KVD_CBLOCK_NONE) {
            kvd__cache_unhold(c, l->ids[i]);
            held++;
        } else if (l->let_go > 0 && l->state[i] == B_DONE && l->keys != NULL &&
                   l->klen[i] > 0 &&
                   (id = kvd__cache_find(c, l->keys + (size_t)i * KVD_CACHE_KEY_MAX,
                                         l->klen[i])) != KVD_CBLOCK_NONE) {
            kvd__cache_touch(c, id);
        }
    }
    if (l->fetching) {
        /* the saves and loads waiting for slots hear of its slots now:
         * while it read, the slots its copies let go took its next reads */
        l->cache->loading--;
        kvd__cache_slots_freed(l->cache, held + l->let_go);
    }
    kvd__dataop_sync_release(&l->sync, &l->origin.srv->reg);
    kvd__cache_unref(l->cache);
    kvd__account_release(l->origin.conn, KVD_HM_REQUESTS, l->origin.held);
    free(l->pages);
    free(l->keys);
    free(l->klen);
    free(l->ids);
    free(l->state);
    free(l->heldq);
    free(l->fetches);
    free(l);
    if (waiting)
        kvd__conn_op_end(conn);
}

void kvd__load_destroy(kvd__load_t **lp)
{
    if (lp != NULL && *lp != NULL)
        load_free(*lp);
    if (lp != NULL)
        *lp = NULL;
}

/* Block i of the plan as the tier has it now: its id, or NONE. */
static uint32_t find(const kvd__load_t *l, uint32_t i)
{
    if (l->lease != NULL)
        return l->lease->ids[i];
    return kvd__cache_find(&l->cache->store, l->keys + (size_t)i * KVD_CACHE_KEY_MAX,
                           l->klen[i]);
}

/* Ready with its bytes in host memory (a block on disk only is read
 * there first: kvd__load_fetch). */
static int ready(const kvd__load_t *l, uint32_t id)
{
    return id != KVD_CBLOCK_NONE && kvd__cache_in_host(&l->cache->store, id);
}

/* Block i of the plan is id, in host memory: held from now on (what
 * brings the others cannot evict it), queued for the next early copy. */
static void hold(kvd__load_t *l, uint32_t i, uint32_t id)
{
    kvd__cache_hold(&l->cache->store, id);
    l->ids[i] = id;
    l->state[i] = B_HELD;
    l->heldq[l->qtail++] = i;
}

kvd_status_t kvd__load_create(kvd__req_t *r, kvd__dataop_t *d, const kvd__load_spec_t *s,
                              kvd__load_t **out)
{
    /* a lease's plan may read from disk, and let blocks go early, only
     * where the cache has a disk level: then it keeps their keys */
    int keys = s->keys != NULL || (s->lease != NULL && s->cache->store.disk != NULL);
    uint64_t held = plan_bytes(s->n, keys);
    kvd__load_t *l;
    kvd_status_t st;

    *out = NULL;
    if ((st = kvd__account_charge(r->conn, KVD_HM_REQUESTS, held, r->msg, sizeof(r->msg))) !=
        KVD_OK)
        return st;
    l = calloc(1, sizeof(*l));
    if (l == NULL || (l->pages = malloc(s->n * sizeof(*l->pages))) == NULL ||
        (l->ids = malloc(s->n * sizeof(*l->ids))) == NULL ||
        (l->state = calloc(s->n, 1)) == NULL ||
        (l->heldq = malloc(s->n * sizeof(*l->heldq))) == NULL ||
        (keys && ((l->keys = malloc((size_t)s->n * KVD_CACHE_KEY_MAX)) == NULL ||
                  (l->klen = malloc(s->n)) == NULL))) {
        if (l != NULL) {
            free(l->pages);
            free(l->ids);
            free(l->state);
            free(l->heldq);
            free(l->keys);
            free(l);
        }
        kvd__account_release(r->conn, KVD_HM_REQUESTS, held);
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    }
    l->origin = kvd__origin_of(r);
    l->origin.held = held;
    l->cache = s->cache;
    s->cache->refs++;
    l->pool = s->pool;
    kvd__dataop_sync_keep(&l->sync, d);
    l->nevents = s->nevents;
    for (uint32_t g = 0; g < s->nevents; g++)
        l->levs[g] = s->levs[g];
    l->flags = s->flags;
    l->nflags = s->nflags;
    l->flag_value = s->flag_value;
    l->n = s->n;
    l->lease = s->lease;
    memcpy(l->pages, s->pages, s->n * sizeof(*l->pages));
    for (uint32_t i = 0; i < s->n && s->keys != NULL; i++) {
        memcpy(l->keys + (size_t)i * KVD_CACHE_KEY_MAX, s->keys[i], s->lens[i]);
        l->klen[i] = (uint8_t)s->lens[i];
    }
    for (uint32_t i = 0; i < s->n && s->keys == NULL && keys; i++) { /* the lease holds them */
        size_t len = 0;
        const uint8_t *k = s->lease->ids[i] != KVD_CBLOCK_NONE
                               ? kvd__cache_key(&s->cache->store, s->lease->ids[i], &len)
                               : NULL;
        if (len > 0)
            memcpy(l->keys + (size_t)i * KVD_CACHE_KEY_MAX, k, len);
        l->klen[i] = (uint8_t)len;
    }
    /* the blocks here now are held from now on: what brings the others
     * cannot evict them */
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t id = find(l, i);
        l->ids[i] = KVD_CBLOCK_NONE;
        if (ready(l, id))
            hold(l, i, id);
    }
    *out = l;
    return KVD_OK;
}

uint32_t kvd__load_missing(const kvd__load_t *l)
{
    uint32_t m = 0;

    for (uint32_t i = 0; i < l->n; i++)
        m += l->state[i] == B_ABSENT;
    return m;
}

/* ENOENT naming every block of the plan that is not in the tier, as index
 * ranges, and why they could not be brought; EBUSY where blocks on disk had
 * no host slot to be read into (every one held or still being written):
 * they are still there, and the same load sent again may find room. */
static kvd_status_t missing_named(const kvd__load_t *l, char *msg, size_t len)
{
    char ranges[96];
    size_t at = 0;
    uint32_t i = 0, missing = 0, n = l->n;

    ranges[0] = '\0';
    while (i < n) {
        uint32_t j;
        if (l->state[i] != B_ABSENT || ready(l, find(l, i))) {
            i++;
            continue;
        }
        for (j = i + 1; j < n; j++)
            if (l->state[j] != B_ABSENT || ready(l, find(l, j)))
                break;
        missing += j - i;
        if (at < sizeof(ranges) - 24) {
            int w = j - i > 1 ? snprintf(ranges + at, sizeof(ranges) - at, "%s%u-%u",
                                         at ? "," : "", i, j - 1)
                              : snprintf(ranges + at, sizeof(ranges) - at, "%s%u",
                                         at ? "," : "", i);
            at += w > 0 ? (size_t)w : 0;
        } else if (ranges[at - 1] != '.') {
            at += (size_t)snprintf(ranges + at, sizeof(ranges) - at, ",...");
        }
        i = j;
    }
    if (l->busy) {
        snprintf(msg, len, "keys[%s] (%u of %u) could not be brought into host memory now: "
                 "%.150s; send the load again", ranges, missing, n, l->why);
        return KVD_EBUSY;
    }
    if (l->why[0] != '\0')
        snprintf(msg, len, "keys[%s] (%u of %u) could not be loaded: %.150s", ranges, missing,
                 n, l->why);
    else
        snprintf(msg, len, "keys[%s] (%u of %u) are not in the cache", ranges, missing, n);
    return KVD_ENOENT;
}

/* A copy's bookkeeping ends (its finish hook): counted once it is done. */
static void copy_finish(kvd__dataop_t *d, kvd_status_t st, Kvdock__OpReply *rep, uint64_t *bytes)
{
    kvd__load_t *l = d->ext;
    kvd__cache_store_t *c = &l->cache->store;

    (void)rep;
    (void)bytes;
    if (st == KVD_OK) {
        c->n.loaded += (uint32_t)d->rows;
        c->n.bytes_out += d->rows * c->block_bytes;
        l->copied += (uint32_t)d->rows;
    } else if (l->copy_status == KVD_OK) {
        l->copy_status = st;
    }
}

static void load_last(kvd__load_t *l);
static kvd_status_t copy_held(kvd__load_t *l, char *why, size_t why_len);
static void advance(kvd__load_t *l);
static void fetched(void *arg, kvd_status_t st);

/* Block i of the plan is in its page: the plan's hold on it goes, and
 * the lease's where the plan has taken it, so that its host slot may go
 * (a block on disk keeps its record: it is a clean copy). */
static void let_go(kvd__load_t *l, uint32_t i)
{
    kvd__cache_store_t *c = &l->cache->store;

    if (l->ids[i] != KVD_CBLOCK_NONE)
        kvd__cache_unhold(c, l->ids[i]);
    l->ids[i] = KVD_CBLOCK_NONE;
    if (l->lease_taken && l->lease->ids[i] != KVD_CBLOCK_NONE) {
        kvd__cache_unhold(c, l->lease->ids[i]);
        l->lease->ids[i] = KVD_CBLOCK_NONE;
    }
    l->state[i] = B_DONE;
}

/* A copy of landed blocks ended (no reply: the plan's last copy has it):
 * its blocks are let go, and the plan goes on. */
static void copy_ended(void *arg, kvd_status_t st)
{
    struct early_copy *ec = arg;
    kvd__load_t *l = ec->l;
    char why[200];

    (void)st; /* copy_finish kept it: the last copy fails with it */
    for (uint32_t k = 0; k < ec->m; k++)
        let_go(l, ec->pos[k]);
    l->let_go += ec->m;
    free(ec);
    l->copies--;
    if (l->ending) {
        if (l->copies == 0)
            load_last(l);
        return;
    }
    if (l->fetching) {
        advance(l);
        return;
    }
    if (copy_held(l, why, sizeof(why)) != KVD_OK)
        kvd_log(KVD_LOG_DEBUG, "event=load_early_copy_failed client=%" PRIu64 " id=%" PRIu64
                " reason=\"%s\"", l->origin.conn->id, l->origin.req_id, why);
}

/* The last copy ends: the load's counters, its reply's rows and bytes;
 * the plan goes. */
static void last_finish(kvd__dataop_t *d, kvd_status_t st, Kvdock__OpReply *rep, uint64_t *bytes)
{
    kvd__load_t *l = d->ext;
    kvd__cache_store_t *c;

    if (l == NULL)
        return;
    c = &l->cache->store;
    if (st == KVD_OK) {
        c->n.loads++;
        c->n.loaded += (uint32_t)d->rows;
        c->n.bytes_out += d->rows * c->block_bytes;
        *bytes = (uint64_t)l->n * c->block_bytes; /* the early copies' blocks included */
    }
    rep->rows = l->n;
    d->ext = NULL;
    load_free(l);
}

/* A dataop for a copy of the plan, its operands held and its Sync set. */
static kvd__dataop_t *copy_new(kvd__load_t *l)
{
    kvd__dataop_t *d = kvd__dataop_new(&l->origin);

    if (d == NULL)
        return NULL;
    kvd__dataop_sync_apply(&l->sync, d);
    d->ext = l;
    return d;
}

/* The held blocks whose copy was not submitted: their places in the
 * plan, ids and pages (the count returned). */
static uint32_t list_held(const kvd__load_t *l, uint32_t *pos, uint32_t *ids, int64_t *pages)
{
    uint32_t m = 0;

    for (uint32_t i = 0; i < l->n; i++)
        if (l->state[i] == B_HELD) {
            pos[m] = i;
            ids[m] = l->ids[i];
            pages[m++] = l->pages[i];
        }
    return m;
}

/* Copy the held blocks not copied yet, without events, flags or reply,
 * when fewer than EARLY_COPIES copies are in flight; once the copy ends
 * its blocks are let go (let_go).  Blocks it could not submit stay for
 * the next copy or the last. */
static kvd_status_t copy_held(kvd__load_t *l, char *why, size_t why_len)
{
    uint32_t *ids, m = 0, next = 0;
    int64_t *pages;
    struct early_copy *ec;
    kvd__slab_plan_t pl;
    kvd__dataop_t *d;
    kvd_status_t st;

    memset(&pl, 0, sizeof(pl));
    if (l->copies >= EARLY_COPIES || l->origin.conn->closing || l->copy_status != KVD_OK)
        return KVD_OK;
    if ((m = l->qtail - l->qhead) == 0)
        return KVD_OK;
    ec = malloc(sizeof(*ec) + m * sizeof(ec->pos[0]));
    ids = malloc(m * sizeof(*ids));
    pages = malloc(m * sizeof(*pages));
    d = copy_new(l);
    st = KVD_ENOMEM;
    snprintf(why, why_len, "out of memory");
    if (ec != NULL && ids != NULL && pages != NULL && d != NULL) {
        ec->l = l;
        ec->m = m;
        for (uint32_t k = 0; k < m; k++) {
            uint32_t i = l->heldq[l->qhead + k];
            ec->pos[k] = i;
            ids[k] = l->ids[i];
            pages[k] = l->pages[i];
        }
        st = kvd__slab_plan(d, &l->cache->store, ids, pages, m, &pl, why, why_len);
        if (st == KVD_OK && (st = kvd__dataop_more(d, pl.nslabs)) == KVD_OK) {
            kvd__slab_jobs(d, l->pool, &l->cache->store, &pl, 0, 0,
                           l->cache->store.layout.num_layers, &next);
            d->rows = m;
            d->finish = copy_finish;
            d->silent_done = copy_ended;
            d->silent_arg = ec;
            st = kvd__dataop_submit(d, why, why_len);
        }
    }
    if (st == KVD_OK) {
        for (uint32_t k = 0; k < m; k++)
            l->state[ec->pos[k]] = B_COPYING;
        l->qhead = l->qtail;
        l->copies++;
    } else {
        kvd__dataop_free(d);
        free(ec);
    }
    kvd__slab_plan_free(&pl);
    free(ids);
    free(pages);
    return st;
}

/* The last copy: every block not copied yet (each must be in the tier
 * now), in layer groups, each group's event recorded and flag written
 * once its layers are in; then the reply.  A failure has submitted
 * nothing (msg says why). */
static kvd_status_t copy_last(kvd__load_t *l, char *msg, size_t len)
{
    kvd__cache_store_t *c = &l->cache->store;
    uint32_t groups, g, m, next = 0, *ids = NULL, *pos = NULL;
    int64_t *pages = NULL;
    kvd__slab_plan_t pl;
    kvd__dataop_t *d;
    kvd_status_t st;

    memset(&pl, 0, sizeof(pl));
    if (l->origin.srv->shutting_down > 1) {
        snprintf(msg, len, "the daemon is shutting down");
        return KVD_ESHUTDOWN;
    }
    if (l->copy_status != KVD_OK) {
        snprintf(msg, len, "copying blocks that landed into pool '%s' failed: %s",
                 l->pool->name, kvd_strerror(l->copy_status));
        return l->copy_status;
    }
    for (uint32_t i = 0; i < l->n; i++) {
        uint32_t id;
        if (l->state[i] != B_ABSENT)
            continue;
        id = find(l, i);
        /* a block still filling after a pull that lost a peer may be one
         * its receive still writes: missing like the rest */
        if (id != KVD_CBLOCK_NONE && !ready(l, id) && !(l->brought && l->why[0] != '\0')) {
            snprintf(msg, len, "keys[%u] is being saved: not in the cache until its bytes "
                     "are complete", i);
            return KVD_ENOENT;
        }
        if (!ready(l, id)) {
            if (l->brought)
                return missing_named(l, msg, len);
            snprintf(msg, len, "keys[%u] is not in the cache", i);
            return KVD_ENOENT;
        }
        kvd__cache_hold(c, id);
        l->ids[i] = id;
        l->state[i] = B_HELD;
    }
    if ((d = copy_new(l)) == NULL || (ids = malloc(l->n * sizeof(*ids))) == NULL ||
        (pos = malloc(l->n * sizeof(*pos))) == NULL ||
        (pages = malloc(l->n * sizeof(*pages))) == NULL) {
        st = KVD_ENOMEM;
        snprintf(msg, len, "out of memory");
        goto fail;
    }
    m = list_held(l, pos, ids, pages);
    d->job.record_event = l->sync.record_event;
    d->reply_at_enqueue = l->sync.reply_at_enqueue;
    /* layer groups as even as they come: group g is layers [g L / G, (g + 1) L / G) */
    groups = l->nevents ? l->nevents : l->nflags ? l->nflags : 1;
    if ((st = kvd__slab_plan(d, c, ids, pages, m, &pl, msg, len)) != KVD_OK)
        goto fail;
    if ((st = kvd__dataop_more(d, pl.nslabs ? groups * pl.nslabs : groups)) != KVD_OK) {
        snprintf(msg, len, "out of memory");
        goto fail;
    }
    for (g = 0; g < groups; g++) {
        uint32_t L = c->layout.num_layers;
        uint32_t begin = (uint32_t)((uint64_t)g * L / groups);
        uint32_t end = (uint32_t)((uint64_t)(g + 1) * L / groups);
        kvd__job_t *job;

        if (pl.nslabs == 0) /* early copies moved every block: the groups still signal */
            kvd__empty_job(d, kvd__dataop_job(d, next++), l->pool, c->layout.tokens_per_block);
        else
            kvd__slab_jobs(d, l->pool, c, &pl, 0, begin, end - begin, &next);
        job = kvd__dataop_job(d, next - 1);
        if (l->nevents)
            job->layer_event = l->levs[g];
        if (l->flags != NULL) {
            job->layer_flag = l->flags + g;
            job->flag_value = l->flag_value;
        }
    }
    d->rows = m;
    d->finish = last_finish;
    if ((st = kvd__dataop_submit(d, msg, len)) != KVD_OK)
        goto fail;
    if (l->lease != NULL && !l->lease_taken) { /* the load ends the lease: the plan's now */
        kvd__lease_take(l->origin.conn, l->lease->id);
        l->lease_taken = 1;
    }
    for (uint32_t k = 0; k < m; k++)
        l->state[pos[k]] = B_COPYING;
    kvd__slab_plan_free(&pl);
    free(pos);
    free(ids);
    free(pages);
    return KVD_OK;
fail:
    kvd__slab_plan_free(&pl);
    free(pos);
    free(ids);
    free(pages);
    if (d != NULL)
        d->ext = NULL; /* the plan goes with the caller */
    kvd__dataop_free(d);
    return st;
}

kvd_status_t kvd__load_run(kvd__req_t *r, kvd__load_t *l, const char *why)
{
    kvd_status_t st;

    if (why != NULL) {
        l->brought = 1;
        snprintf(l->why, sizeof(l->why), "%s", why);
    }
    st = copy_last(l, r->msg, sizeof(r->msg));
    if (st != KVD_OK) {
        load_free(l);
        return st;
    }
    r->deferred = 1;
    return KVD_OK;
}

void kvd__load_wait(kvd__load_t *l)
{
    l->waiting = 1;
    l->brought = 1;
    kvd__conn_op_begin(l->origin.conn);
}

void kvd__load_land(kvd__load_t *l, const uint32_t *pos, uint32_t n)
{
    char why[200];

    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = pos[k], id;
        if (i >= l->n || l->state[i] != B_ABSENT)
            continue;
        id = find(l, i);
        if (!ready(l, id))
            continue; /* the last copy names it missing */
        hold(l, i, id);
    }
    if (!l->ending && copy_held(l, why, sizeof(why)) != KVD_OK)
        kvd_log(KVD_LOG_DEBUG, "event=load_early_copy_failed client=%" PRIu64 " id=%" PRIu64
                " reason=\"%s\"", l->origin.conn->id, l->origin.req_id, why);
}

/* Every copy of landed blocks ended and nothing more will land: the last
 * copy, or the failure's reply. */
static void load_last(kvd__load_t *l)
{
    char msg[256];
    kvd_status_t st;

    if (l->origin.conn->closing) { /* nobody to copy for */
        load_free(l);
        return;
    }
    st = copy_last(l, msg, sizeof(msg));
    if (st != KVD_OK) {
        kvd__reply_deferred(&l->origin, st, msg, NULL, 0);
        load_free(l);
    }
}

/* Read the plan's blocks on disk only that were not asked for yet, into
 * host slots, while there are slots: the first block that finds none
 * ends the round (busy), the rest waiting for the slots the plan's own
 * copies let go. */
static void fetch_more(kvd__load_t *l)
{
    kvd__cache_store_t *c = &l->cache->store;
    kvd_status_t st;
    char why[200];

    l->busy = 0;
    if (l->origin.conn->closing || l->copy_status != KVD_OK)
        return;
    for (uint32_t i = l->fetch_next; i < l->n; l->fetch_next = ++i) {
        uint32_t id;
        if (l->state[i] != B_ABSENT || (l->fetches != NULL && l->fetches[i].l != NULL) ||
            (id = find(l, i)) == KVD_CBLOCK_NONE ||
            kvd__cache_block(c, id)->state != KVD_CBLOCK_READY || kvd__cache_in_host(c, id))
            continue;
        if (l->fetches == NULL && (l->fetches = calloc(l->n, sizeof(*l->fetches))) == NULL) {
            snprintf(l->why, sizeof(l->why), "out of memory");
            break;
        }
        l->fetches[i].l = l; /* asked for: a read refused is not asked again */
        l->fetches[i].pos = i;
        st = kvd__cache_fetch(c, id, fetched, &l->fetches[i], why, sizeof(why));
        if (st == KVD_EBUSY) {
            l->fetches[i].l = NULL; /* asked again once the plan lets slots go */
            l->busy = 1;
            snprintf(l->busy_why, sizeof(l->busy_why), "reading blocks from disk: %.170s", why);
            break;
        }
        if (st != KVD_OK) {
            if (l->why[0] == '\0')
                snprintf(l->why, sizeof(l->why), "reading blocks from disk: %.170s", why);
            continue;
        }
        l->reading++;
        l->deadline_ns = 0; /* it got on: a new wait from here */
    }
}

/* The plan ends with the blocks it has, where blocks on disk found no
 * host slot: why says so (missing_named's EBUSY). */
static void keep_busy_why(kvd__load_t *l)
{
    if (l->busy && l->why[0] == '\0')
        snprintf(l->why, sizeof(l->why), "%s", l->busy_why);
}

static void advance(kvd__load_t *l);

/* A waiting plan's turn came: it counts as a load reading from disk again
 * (load_free lets that go). */
static void load_unpark(kvd__load_t *l)
{
    l->cache->loading++;
}

static void load_resume(void *arg)
{
    kvd__load_t *l = arg;

    load_unpark(l);
    if (l->origin.srv->shutting_down)
        kvd__load_end(l, "the daemon is shutting down");
    else
        advance(l);
}

static void load_expire(void *arg, const char *msg)
{
    kvd__load_t *l = arg;
    char why[sizeof(l->why)];

    (void)msg; /* the wait's words; the reply names the keys, then this */
    load_unpark(l);
    snprintf(why, sizeof(why), "waited %" PRIu64 " ms (--disk-wait-ms) for a host slot to read "
             "into: %.120s", l->origin.srv->opts.disk_wait_ms, l->busy_why);
    kvd__load_end(l, why);
}

static void load_drop(void *arg)
{
    kvd__load_t *l = arg;

    load_unpark(l);
    kvd__load_end(l, "the client went"); /* no reply: its connection is closing */
}

static const kvd__park_ops_t load_park_ops = {load_resume, load_expire, load_drop};

/* The plan has nothing of its own in flight and no host slot for its next
 * read.  Where slots will free without anyone asking (writes in flight,
 * other saves and loads), it waits on the cache's queue for one, as a
 * save does, rather than answer EBUSY (docs/design/disk-level.md); 1: it
 * waits. */
static int load_park(kvd__load_t *l)
{
    kvd__cache_t *k = l->cache;

    if (l->origin.conn->closing || l->copy_status != KVD_OK || l->origin.srv->shutting_down)
        return 0;
    k->loading--; /* a waiting load frees no slot itself */
    if (!kvd__cache_slots_will_free(k, 0) ||
        kvd__park_plan(&k->waiters, &l->origin, &load_park_ops, l, &l->deadline_ns, 1,
                       l->busy_why) != KVD_OK) {
        k->loading++;
        return 0;
    }
    return 1;
}

/* A read or an early copy of a plan that reads from disk ended: the
 * blocks held are copied, the slots let go take the next reads, and once
 * nothing is left to read (or nothing in flight could free a slot) the
 * plan ends. */
static void advance(kvd__load_t *l)
{
    char why[200];

    if (l->ending)
        return;
    if (copy_held(l, why, sizeof(why)) != KVD_OK)
        kvd_log(KVD_LOG_DEBUG, "event=load_early_copy_failed client=%" PRIu64 " id=%" PRIu64
                " reason=\"%s\"", l->origin.conn->id, l->origin.req_id, why);
    fetch_more(l);
    if (l->reading > 0 || (l->busy && l->copies > 0) || (l->busy && load_park(l)))
        return;
    keep_busy_why(l);
    kvd__load_end(l, l->why);
}

static void fetched(void *arg, kvd_status_t st)
{
    struct load_fetch *f = arg;
    kvd__load_t *l = f->l;

    if (st == KVD_OK)
        kvd__load_land(l, &f->pos, 1);
    else if (l->why[0] == '\0')
        snprintf(l->why, sizeof(l->why), "a block's record on disk failed its checks, or its "
                 "read failed");
    l->reading--;
    advance(l);
}

uint32_t kvd__load_disk_only(const kvd__load_t *l)
{
    const kvd__cache_store_t *c = &l->cache->store;
    uint32_t m = 0, id;

    for (uint32_t i = 0; i < l->n; i++)
        m += l->state[i] == B_ABSENT && (id = find(l, i)) != KVD_CBLOCK_NONE &&
             kvd__cache_block(c, id)->state == KVD_CBLOCK_READY && !kvd__cache_in_host(c, id);
    return m;
}

int kvd__load_busy(const kvd__load_t *l)
{
    return l->busy;
}

uint32_t kvd__load_fetch(kvd__load_t *l)
{
    char why[200];

    fetch_more(l);
    /* no slot for any read: the plan's own blocks may hold them; copied
     * first, they make room */
    if (l->reading == 0 && l->busy && copy_held(l, why, sizeof(why)) != KVD_OK)
        kvd_log(KVD_LOG_DEBUG, "event=load_early_copy_failed client=%" PRIu64 " id=%" PRIu64
                " reason=\"%s\"", l->origin.conn->id, l->origin.req_id, why);
    if (l->reading == 0 && l->copies == 0) {
        keep_busy_why(l);
        if (l->why[0] != '\0')
            l->brought = 1;
        return 0;
    }
    l->fetching = 1;
    l->cache->loading++; /* until the plan goes */
    if (l->lease != NULL && !l->lease_taken) {
        /* the plan ends the lease: its holds go block by block as each
         * is copied, and a release or expiry meanwhile cannot free it */
        kvd__lease_take(l->origin.conn, l->lease->id);
        l->lease_taken = 1;
    }
    kvd__load_wait(l);
    return l->reading + l->copies;
}

void kvd__load_end(kvd__load_t *l, const char *why)
{
    l->ending = 1;
    if (why != l->why)
        snprintf(l->why, sizeof(l->why), "%s", why ? why : "");
    if (l->copies == 0)
        load_last(l);
}
