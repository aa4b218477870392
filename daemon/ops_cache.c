/*
 * The cache tier's operations: create, drop, list, stats, lookup, save,
 * load, evict, release (the proto's "The cache tier" says what each
 * means).  Saves and loads are data operations: transfers between the
 * client's pool, viewed by pages of tokens_per_block slots, and the
 * cache's slabs, one job per slab (and per layer group of a load) that
 * run in order; the store's bookkeeping happens here, on the loop thread,
 * before and after them.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "account.h"
#include "cache_copy.h"
#include "cache_disk.h"
#include "cache_load.h"
#include "caches.h"
#include "cluster.h"
#include "conn.h"
#include "dataop.h"
#include "keyarea.h"
#include "log.h"

#define MAX_KEYS 65536
#define MAX_LAYER_EVENTS 128
#define MAX_LEASE_MS 600000u

/* ---- caches: identity and who may do what ------------------------------- */

void kvd__cache_unref(kvd__cache_t *k)
{
    if (--k->refs > 0)
        return;
    kvd__cache_store_deinit(&k->store); /* closes its disk level */
    if (k->disk_dir != NULL && k->remove_dir)
        kvd__cache_dir_discard(k->srv, k->disk_dir);
    free(k->disk_dir);
    free(k);
}

/* A waiting request's hold on its cache (park.h). */
static void cache_ref(void *owner, int delta)
{
    kvd__cache_t *k = owner;

    if (delta > 0)
        k->refs++;
    else
        kvd__cache_unref(k);
}

int kvd__cache_slots_will_free(const kvd__cache_t *k, uint32_t self)
{
    return kvd__cache_growing(&k->store) ||
           (k->store.disk != NULL && (kvd__cache_disk_writing(&k->store) > 0 ||
                                      k->saving > self || k->loading > 0));
}

void kvd__cache_slots_freed(kvd__cache_t *k, uint32_t n)
{
    kvd__waitq_freed(&k->waiters, n, !kvd__cache_slots_will_free(k, 0));
}

/* The cache's next slab came (n slots; 0: it failed): the requests waiting
 * for host slots run again, whatever they need (one that needs more adds
 * this slab and starts the next). */
static void cache_grown(void *arg, uint32_t n)
{
    kvd__cache_t *k = arg;

    kvd__waitq_freed(&k->waiters, n, 1);
}

/* A record's write ended: the host slot its block held may be taken, which
 * the saves and loads waiting on the cache need. */
static void cache_disk_written(void *arg)
{
    kvd__cache_slots_freed(arg, 1);
}

/* ---- the disk level's directories ------------------------------------------ */

typedef struct dir_removal {
    kvd__disk_req_t r;
    kvd__server_t *srv;
    char path[PATH_MAX];
} dir_removal_t;

static void dir_removal_run(kvd__disk_req_t *r, unsigned part)
{
    dir_removal_t *d = r->arg;

    r->res = kvd__cache_dir_remove(d->path);
}

static void dir_removal_done(kvd__disk_req_t *r)
{
    dir_removal_t *d = r->arg;

    if (r->res < 0)
        kvd_log(KVD_LOG_WARN, "event=cache_dir_remove_failed dir=%s error=\"%s\"", d->path,
                strerror((int)-r->res));
    else
        kvd_log(KVD_LOG_DEBUG, "event=cache_dir_removed dir=%s", d->path);
    d->srv->disk_removals--;
    free(d);
}

/* A dropped cache's directory is first renamed out of the caches' names
 * (here: a new cache of the same name may be made at once, and a crash
 * before the removal ends leaves nothing that is reopened), then its
 * files are removed on the disk threads. */
void kvd__cache_dir_discard(kvd__server_t *srv, const char *path)
{
    dir_removal_t *d = calloc(1, sizeof(*d));
    const char *base = strrchr(path, '/');
    static uint64_t seq;

    if (d == NULL) {
        kvd_log(KVD_LOG_WARN, "event=cache_dir_remove_failed dir=%s error=\"out of memory\"",
                path);
        return;
    }
    base = base ? base + 1 : path;
    if (base[0] == '.') { /* one of the dropped already */
        snprintf(d->path, sizeof(d->path), "%s", path);
    } else {
        snprintf(d->path, sizeof(d->path), "%.*s%s%" PRIu64 "-%s", (int)(base - path), path,
                 KVD_CACHE_DIR_DROPPED, ++seq + kvd__now_ns(), base);
        if (rename(path, d->path) != 0) {
            kvd_log(KVD_LOG_WARN, "event=cache_dir_rename_failed dir=%s error=\"%s\"", path,
                    strerror(errno));
            snprintf(d->path, sizeof(d->path), "%s", path);
        }
    }
    d->srv = srv;
    d->r.op = KVD_DISK_OP_CALL;
    d->r.fd = -1;
    d->r.before = dir_removal_run;
    d->r.done = dir_removal_done;
    d->r.arg = d;
    srv->disk_removals++;
    if (srv->disk_io != NULL) {
        kvd__disk_io_submit(srv->disk_io, &d->r);
    } else {
        dir_removal_run(&d->r, 0);
        dir_removal_done(&d->r);
    }
}

static int listed(const uint32_t *ids, uint32_t n, uint32_t v)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] == v)
            return 1;
    return 0;
}

/* Another user's private cache is invisible (but to admins). */
static int may_see(const kvd__cache_t *k, const kvd__conn_t *c)
{
    return k->owner_uid == c->uid || k->shared || c->admin;
}

static int may_use(const kvd__cache_t *k, const kvd__conn_t *c)
{
    if (k->owner_uid == c->uid)
        return 1;
    if (!k->shared)
        return 0;
    if (k->n_allow_uids == 0 && k->n_allow_gids == 0)
        return 1;
    if (listed(k->allow_uids, k->n_allow_uids, c->uid))
        return 1;
    for (uint32_t i = 0; i < k->n_allow_gids; i++) /* any of its groups */
        if (kvd__conn_in_group(c, (gid_t)k->allow_gids[i]))
            return 1;
    return 0;
}

static int may_manage(const kvd__cache_t *k, const kvd__conn_t *c)
{
    return k->owner_uid == c->uid || c->admin;
}

/* A name as this caller means it: its own cache of that name first, then a
 * shared one. */
static kvd__cache_t *by_name(kvd__server_t *srv, const kvd__conn_t *c, const char *name)
{
    kvd__cache_t *k, *shared = NULL;

    for (k = srv->caches; k; k = k->next) {
        if (strcmp(k->name, name) != 0)
            continue;
        if (k->owner_uid == c->uid)
            return k;
        if (k->shared || c->admin)
            shared = shared ? shared : k;
    }
    return shared;
}

/* The cache a request names (id, or name when id is 0), that the caller
 * may see; then use (need_use) or manage. */
static kvd_status_t find_cache(kvd__req_t *r, uint64_t id, const char *name, int need_use,
                               kvd__cache_t **out)
{
    kvd__conn_t *c = r->conn;
    kvd__cache_t *k = NULL;

    if (id != 0) {
        for (k = r->srv->caches; k; k = k->next)
            if (k->id == id)
                break;
    } else if (name != NULL && name[0] != '\0') {
        k = by_name(r->srv, c, name);
    } else {
        return kvd__req_fail(r, KVD_EINVAL, "name a cache by id or by name");
    }
    if (k == NULL || !may_see(k, c)) {
        if (id != 0)
            return kvd__req_fail(r, KVD_ENOENT, "no cache %" PRIu64, id);
        return kvd__req_fail(r, KVD_ENOENT, "no cache named '%.64s'", name);
    }
    if (need_use ? !may_use(k, c) : !may_manage(k, c))
        return kvd__req_fail(r, KVD_EPERM, "cache '%s' %s", k->name,
                             need_use ? "is not shared with this user"
                                      : "belongs to another user: only its owner or an admin "
                                        "may do that");
    *out = k;
    return KVD_OK;
}

static void fill_layout(kvd__req_t *r, const kvd__block_layout_t *l, Kvdock__CacheLayout *m)
{
    kvdock__cache_layout__init(m);
    m->num_layers = l->num_layers;
    m->mla = l->mla;
    m->tokens_per_block = l->tokens_per_block;
    m->token_bytes = l->token_bytes;
    m->dtype = (char *)l->dtype;
    (void)r;
}

/* A cache's figures in the messages given (d: its disk level's, used when
 * it has one). */
static void info_fill(const kvd__cache_t *k, Kvdock__CacheInfo *ci, Kvdock__CacheLayout *l,
                      Kvdock__CacheDiskLevel *d)
{
    const kvd__cache_store_t *s = &k->store;

    kvdock__cache_info__init(ci);
    fill_layout(NULL, &s->layout, l);
    ci->id = k->id;
    ci->name = (char *)k->name;
    ci->layout = l;
    ci->budget_bytes = s->budget;
    ci->block_bytes = s->block_bytes;
    ci->capacity = s->capacity;
    ci->blocks = kvd__cache_host_blocks(s);
    ci->used_bytes = kvd__cache_used(s);
    ci->held_bytes = s->held_bytes;
    ci->shared = k->shared;
    ci->owner_uid = (uint32_t)k->owner_uid;
    ci->n_allow_uids = k->n_allow_uids;
    ci->allow_uids = (uint32_t *)k->allow_uids;
    ci->n_allow_gids = k->n_allow_gids;
    ci->allow_gids = (uint32_t *)k->allow_gids;
    ci->lookups = s->n.lookups;
    ci->keys_asked = s->n.keys_asked;
    ci->keys_hit = s->n.keys_hit;
    ci->saves = s->n.saves;
    ci->stored = s->n.stored;
    ci->skipped = s->n.skipped;
    ci->refused = s->n.refused;
    ci->loads = s->n.loads;
    ci->loaded = s->n.loaded;
    ci->evictions = s->n.evictions;
    ci->leases = k->leases;
    ci->bytes_in = s->n.bytes_in;
    ci->bytes_out = s->n.bytes_out;
    ci->cluster = k->cluster;
    ci->fetched = k->fetched;
    ci->served = k->served;
    ci->peer_hits = k->peer_hits;
    if (k->disk_dir != NULL) {
        kvd__cache_disk_stats_t ds;

        kvdock__cache_disk_level__init(d);
        kvd__cache_store_disk_stats(s, &ds);
        d->budget_bytes = k->disk_budget;
        d->blocks = ds.blocks;
        d->used_bytes = ds.used_bytes;
        d->hits = ds.hits;
        d->spills = ds.spills;
        d->promotions = ds.promotions;
        d->reads = ds.reads;
        d->read_bytes = ds.read_bytes;
        d->writes = ds.writes;
        d->write_bytes = ds.write_bytes;
        d->evictions = ds.evictions;
        d->checksum_failures = ds.checksum_failures;
        d->io_errors = ds.io_errors;
        d->no_space = ds.no_space;
        d->path = k->disk_dir;
        ci->disk = d;
    }
}

static Kvdock__CacheInfo *cache_info(kvd__req_t *r, const kvd__cache_t *k)
{
    Kvdock__CacheInfo *ci = kvd__req_alloc(r, sizeof(*ci));
    Kvdock__CacheLayout *l = kvd__req_alloc(r, sizeof(*l));
    Kvdock__CacheDiskLevel *d = k->disk_dir ? kvd__req_alloc(r, sizeof(*d)) : NULL;

    if (ci == NULL || l == NULL || (k->disk_dir != NULL && d == NULL))
        return NULL;
    info_fill(k, ci, l, d);
    return ci;
}

static kvd_status_t reply_info(kvd__req_t *r, const kvd__cache_t *k)
{
    Kvdock__CacheInfo *ci = cache_info(r, k);

    if (ci == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_CACHE;
    r->resp.cache = ci;
    return KVD_OK;
}

/* Slab memory: the backend's host memory (pinned on cuda), counted by the
 * store itself. */
static kvd_status_t slab_alloc(void *ctx, uint64_t bytes, void **ptr, void **handle, char *why,
                               size_t why_len)
{
    kvd__server_t *srv = ctx;
    kvd__mem_t *m = NULL;
    kvd_status_t st = srv->backend->mem_create(srv->backend, KVD_MEM_HOST, bytes, "cache", &m,
                                               why, why_len);

    if (st != KVD_OK)
        return st;
    *ptr = m->ptr;
    *handle = m;
    return KVD_OK;
}

static void slab_free(void *ctx, void *handle)
{
    kvd__server_t *srv = ctx;
    kvd__mem_t *m = handle;

    srv->backend->mem_destroy(srv->backend, &m);
}

static void slab_free_later(void *ctx, void *handle, int hm_kind, uint64_t bytes)
{
    kvd__server_host_release(ctx, handle, hm_kind, bytes);
}

/* A slab allocated ahead on libuv's thread pool (mem_create of host
 * memory is safe off the loop); the server's backend stays until the last
 * one is back. */
typedef struct slab_work {
    uv_work_t w;
    kvd__server_t *srv;
    uint64_t bytes;
    void *ptr, *handle;
    kvd_status_t st;
    char why[200];
    kvd__cache_mem_done_fn done;
    void *arg;
} slab_work_t;

static void slab_work_run(uv_work_t *w)
{
    slab_work_t *sw = w->data;

    sw->st = slab_alloc(sw->srv, sw->bytes, &sw->ptr, &sw->handle, sw->why, sizeof(sw->why));
}

static void slab_work_end(uv_work_t *w, int status)
{
    slab_work_t *sw = w->data;
    kvd__server_t *srv = sw->srv;

    if (status != 0 && sw->st == KVD_OK) { /* cancelled before it ran */
        sw->st = KVD_ESHUTDOWN;
        snprintf(sw->why, sizeof(sw->why), "%s", uv_strerror(status));
    }
    if (sw->st != KVD_OK)
        kvd_log(KVD_LOG_WARN, "event=cache_slab_ahead_failed bytes=%" PRIu64 " reason=\"%s\"",
                sw->bytes, sw->why);
    sw->done(sw->arg, sw->st, sw->ptr, sw->handle);
    free(sw);
    kvd__server_mem_work_done(srv);
}

static kvd_status_t slab_alloc_ahead(void *ctx, uint64_t bytes, kvd__cache_mem_done_fn done,
                                     void *arg)
{
    kvd__server_t *srv = ctx;
    slab_work_t *sw;

    if (srv->shutting_down)
        return KVD_ESHUTDOWN;
    sw = calloc(1, sizeof(*sw));
    if (sw == NULL)
        return KVD_ENOMEM;
    sw->w.data = sw;
    sw->srv = srv;
    sw->bytes = bytes;
    sw->done = done;
    sw->arg = arg;
    if (uv_queue_work(srv->loop, &sw->w, slab_work_run, slab_work_end) != 0) {
        free(sw);
        return KVD_EIO;
    }
    srv->mem_works++;
    return KVD_OK;
}

static int layout_equal(const kvd__block_layout_t *a, const kvd__block_layout_t *b)
{
    return a->num_layers == b->num_layers && !a->mla == !b->mla &&
           a->tokens_per_block == b->tokens_per_block && a->token_bytes == b->token_bytes &&
           strcmp(a->dtype, b->dtype) == 0;
}

/* A disk budget a new cache asks for: the daemon has a disk level, the
 * caches' disk budgets together stay within --disk-budget, and the file
 * system has room for it beside what the other caches may still write. */
static kvd_status_t disk_budget_check(kvd__server_t *srv, uint64_t want, char *why,
                                      size_t why_len)
{
    uint64_t avail = 0, total = 0, promised = 0, have = kvd__caches_disk_budgets(srv);
    char a[32], b[32], c[32];

    if (srv->disk_io == NULL) {
        snprintf(why, why_len, "disk_budget_bytes: this daemon has no disk level (start it "
                 "with --cache-dir)");
        return KVD_ENOTSUP;
    }
    if (want > srv->disk_budget || have > srv->disk_budget - want) {
        snprintf(why, why_len, "disk_budget_bytes (%s) and the disk budgets of the caches "
                 "made already (%s) are more than the daemon's disk budget (%s, --disk-budget)",
                 kvd__fmt_bytes(want, a, sizeof(a)), kvd__fmt_bytes(have, b, sizeof(b)),
                 kvd__fmt_bytes(srv->disk_budget, c, sizeof(c)));
        return KVD_ELIMIT;
    }
    if (kvd__cache_dir_space(srv->opts.cache_dir, &avail, &total, why, why_len) != 0)
        return KVD_EIO;
    for (const kvd__cache_t *k = srv->caches; k; k = k->next) {
        kvd__cache_disk_stats_t ds;
        if (k->disk_dir == NULL)
            continue;
        kvd__cache_store_disk_stats(&k->store, &ds);
        promised += k->disk_budget > ds.used_bytes ? k->disk_budget - ds.used_bytes : 0;
    }
    for (const kvd__cache_t *k = srv->caches_opening; k; k = k->next)
        promised += k->disk_budget;
    if (want > avail || promised > avail - want) {
        snprintf(why, why_len, "disk_budget_bytes (%s) does not fit the free space of the "
                 "cache-dir's file system (%s, of which the other caches' disk budgets may "
                 "still take %s)", kvd__fmt_bytes(want, a, sizeof(a)),
                 kvd__fmt_bytes(avail, b, sizeof(b)), kvd__fmt_bytes(promised, c, sizeof(c)));
        return KVD_ELIMIT;
    }
    return KVD_OK;
}

/* A cache of m, not on any list yet (its disk level not opened). */
static kvd_status_t cache_new(kvd__server_t *srv, const kvd__manifest_t *m, kvd__cache_t **out,
                              char *why, size_t why_len)
{
    kvd__cache_mem_t mem = {srv, slab_alloc, slab_free, slab_alloc_ahead, slab_free_later};
    char dirname[KVD_CACHE_DIRNAME_MAX], path[PATH_MAX];
    kvd__cache_t *k = calloc(1, sizeof(*k));
    kvd_status_t st;

    if (k == NULL) {
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    st = kvd__cache_store_init(&k->store, &m->layout, m->budget, &srv->hostmem, &mem, why,
                               why_len);
    if (st != KVD_OK) {
        free(k);
        return st;
    }
    if (m->disk_budget != 0) {
        if (kvd__cache_dirname(m->name, m->owner_uid, m->shared, dirname, sizeof(dirname)) != 0 ||
            snprintf(path, sizeof(path), "%s/%s", srv->opts.cache_dir, dirname) >=
                (int)sizeof(path) || (k->disk_dir = strdup(path)) == NULL) {
            snprintf(why, why_len, "no directory for cache '%s'", m->name);
            kvd__cache_store_deinit(&k->store);
            free(k);
            return KVD_EINVAL;
        }
        k->disk_budget = m->disk_budget;
    }
    snprintf(k->name, sizeof(k->name), "%s", m->name);
    k->owner_uid = (uid_t)m->owner_uid;
    k->shared = m->shared;
    k->cluster = m->cluster;
    k->n_allow_uids = m->n_allow_uids;
    k->n_allow_gids = m->n_allow_gids;
    memcpy(k->allow_uids, m->allow_uids, sizeof(k->allow_uids));
    memcpy(k->allow_gids, m->allow_gids, sizeof(k->allow_gids));
    k->srv = srv;
    k->refs = 1;
    kvd__waitq_init(&k->waiters, srv, cache_ref, k);
    k->store.grown = cache_grown;
    k->store.grown_arg = k;
    if (k->cluster)
        kvd__cache_grow(&k->store);
    *out = k;
    return KVD_OK;
}

static void cache_free_new(kvd__cache_t *k)
{
    kvd__cache_store_deinit(&k->store);
    free(k->disk_dir);
    free(k);
}

/* On the list: it is seen and used from now on. */
static void cache_link(kvd__server_t *srv, kvd__cache_t *k)
{
    k->id = srv->next_cache_id++;
    k->next = srv->caches;
    k->prev = NULL;
    if (srv->caches)
        srv->caches->prev = k;
    srv->caches = k;
}

static kvd_status_t cache_open_disk(kvd__server_t *srv, kvd__cache_t *k, char *why,
                                    size_t why_len)
{
    kvd__cache_disk_config_t cfg;
    char reason[300];
    kvd_status_t st;

    memset(&cfg, 0, sizeof(cfg));
    cfg.dir = k->disk_dir;
    cfg.budget = k->disk_budget;
    cfg.io = srv->disk_io;
    cfg.written = cache_disk_written;
    cfg.written_arg = k;
    if ((st = kvd__cache_store_open_disk(&k->store, &cfg, reason, sizeof(reason))) != KVD_OK)
        snprintf(why, why_len, "the disk level of '%s': %s", k->name, reason);
    return st;
}

/*
 * A create with a disk level: the cache's directory and manifest are made
 * on the disk threads (mkdir and two fsyncs may wait on a busy disk for
 * tens of ms, which every client of the loop would wait for); meanwhile
 * the cache is on srv->caches_opening, where names and budgets see it and
 * nothing else does.  Back on the loop the store opens the empty
 * directory, the cache goes on the list and the reply is sent.
 */
typedef struct create_work {
    kvd__disk_req_t r;
    kvd__origin_t origin;
    uint64_t loop_ns;
    kvd__cache_t *k;
    kvd__manifest_t m;
    kvd_status_t st;
    char why[400];
} create_work_t;

static void create_dir_run(kvd__disk_req_t *r, unsigned part)
{
    create_work_t *w = r->arg;
    char reason[300];

    if (mkdir(w->k->disk_dir, 0700) != 0) {
        int e = errno;
        if (e == EEXIST)
            snprintf(w->why, sizeof(w->why), "the directory %.180s exists already (a dropped "
                     "cache's, being removed, or one the daemon did not reopen at start: "
                     "`kvdock status` says why; restart with what it needs, or remove the "
                     "directory to make the cache anew)", w->k->disk_dir);
        else
            snprintf(w->why, sizeof(w->why), "cannot make %.300s: %s", w->k->disk_dir,
                     strerror(e));
        w->st = e == EEXIST ? KVD_EBUSY : KVD_EIO;
    } else if ((w->st = kvd__manifest_write(w->k->disk_dir, &w->m, reason, sizeof(reason))) !=
               KVD_OK) {
        snprintf(w->why, sizeof(w->why), "%s", reason);
        (void)kvd__cache_dir_remove(w->k->disk_dir);
    }
    r->res = 0;
}

static void opening_remove(kvd__server_t *srv, kvd__cache_t *k)
{
    kvd__cache_t **pp;

    for (pp = &srv->caches_opening; *pp; pp = &(*pp)->next)
        if (*pp == k) {
            *pp = k->next;
            break;
        }
    k->next = NULL;
}

static void log_create(const kvd__conn_t *c, const kvd__cache_t *k, uint64_t loop_ns,
                       uint64_t t_start_ns)
{
    const kvd__block_layout_t *l = &k->store.layout;
    kvd__server_t *srv = k->srv;

    kvd_log(KVD_LOG_INFO, "event=cache_create client=%" PRIu64 " cache=%" PRIu64 " name=%s "
            "uid=%u layers=%u mla=%d tokens=%u token_bytes=%" PRIu64 " budget=%" PRIu64
            " shared=%d cluster=%d disk_budget=%" PRIu64 " loop_us=%" PRIu64 " us=%" PRIu64,
            c->id, k->id, k->name, (unsigned)k->owner_uid, l->num_layers, l->mla,
            l->tokens_per_block, l->token_bytes, k->store.budget, k->shared, k->cluster,
            k->disk_budget, loop_ns / 1000u, (kvd__now_ns() - t_start_ns) / 1000u);
    if (kvd__caches_budgets(srv) > srv->hostmem.budget)
        kvd_log(KVD_LOG_WARN, "event=cache_budgets_over cache=%s budgets=%" PRIu64
                " host_budget=%" PRIu64 " reason=\"the caches cannot all fill: each fills until "
                "the host-memory budget is spent\"", k->name, kvd__caches_budgets(srv),
                srv->hostmem.budget);
}

static void create_dir_done(kvd__disk_req_t *r)
{
    create_work_t *w = r->arg;
    kvd__server_t *srv = w->origin.srv;
    kvd__cache_t *k = w->k;
    Kvdock__Response resp = KVDOCK__RESPONSE__INIT;
    Kvdock__CacheInfo ci;
    Kvdock__CacheLayout cl;
    Kvdock__CacheDiskLevel cd;
    uint64_t t0 = kvd__now_ns();

    opening_remove(srv, k);
    if (w->st == KVD_OK && (w->st = cache_open_disk(srv, k, w->why, sizeof(w->why))) != KVD_OK)
        kvd__cache_dir_discard(srv, k->disk_dir); /* made here: nothing of a client's in it */
    if (w->st != KVD_OK) {
        resp.status = (uint32_t)w->st;
        resp.message = w->why;
        kvd_log(KVD_LOG_WARN, "event=cache_create_failed client=%" PRIu64 " name=%s "
                "status=%s reason=\"%s\"", w->origin.conn->id, k->name, kvd_err_name(w->st),
                w->why);
        cache_free_new(k);
    } else {
        cache_link(srv, k);
        w->loop_ns += kvd__now_ns() - t0;
        log_create(w->origin.conn, k, w->loop_ns, w->origin.t_start_ns);
        info_fill(k, &ci, &cl, &cd);
        resp.result_case = KVDOCK__RESPONSE__RESULT_CACHE;
        resp.cache = &ci;
    }
    kvd__reply_deferred_response(&w->origin, &resp);
    kvd__conn_op_end(w->origin.conn);
    free(w);
}

kvd_status_t kvd__op_cache_create(kvd__req_t *r)
{
    const Kvdock__CacheCreate *cc = r->req->cache_create;
    kvd__server_t *srv = r->srv;
    kvd__conn_t *c = r->conn;
    kvd__block_layout_t l;
    kvd__cache_t *k, *same;
    kvd__manifest_t m;
    uint32_t n = 0;
    uint64_t t0;
    char why[400];
    kvd_status_t st;

    if (!kvd__pool_name_valid(cc->name))
        return kvd__req_fail(r, KVD_EINVAL, "cache name must be 1 to 63 characters of "
                             "[A-Za-z0-9._-]");
    if (cc->layout == NULL)
        return kvd__req_fail(r, KVD_ENULL, "layout is required");
    memset(&l, 0, sizeof(l));
    l.num_layers = cc->layout->num_layers;
    l.mla = cc->layout->mla;
    l.tokens_per_block = cc->layout->tokens_per_block;
    l.token_bytes = cc->layout->token_bytes;
    if (strlen(cc->layout->dtype) >= sizeof(l.dtype))
        return kvd__req_fail(r, KVD_EINVAL, "layout.dtype is longer than %zu bytes",
                             sizeof(l.dtype) - 1);
    if (!kvd__text_valid(cc->layout->dtype))
        return kvd__req_fail(r, KVD_EINVAL, "layout.dtype holds a control character");
    snprintf(l.dtype, sizeof(l.dtype), "%s", cc->layout->dtype);
    if (cc->n_allow_uids > 16 || cc->n_allow_gids > 16)
        return kvd__req_fail(r, KVD_ELIMIT, "at most 16 allowed users and 16 groups");
    if ((cc->n_allow_uids || cc->n_allow_gids) && !cc->shared)
        return kvd__req_fail(r, KVD_EINVAL, "allow_uids and allow_gids restrict a shared cache");
    if (cc->budget_bytes == 0)
        return kvd__req_fail(r, KVD_EINVAL, "budget_bytes must be > 0");
    if (cc->cluster && srv->cluster == NULL)
        return kvd__req_fail(r, KVD_EINVAL, "cluster: this daemon is in no cluster (start it "
                             "with --cluster-listen)");
    if (cc->budget_bytes > srv->hostmem.budget) {
        char a[32], b[32];
        return kvd__req_fail(r, KVD_ELIMIT, "budget_bytes (%s) is more than the daemon's "
                             "host-memory budget (%s, --host-memory-budget)",
                             kvd__fmt_bytes(cc->budget_bytes, a, sizeof(a)),
                             kvd__fmt_bytes(srv->hostmem.budget, b, sizeof(b)));
    }
    same = by_name(srv, c, cc->name);
    if (same != NULL && cc->open_existing && (same->owner_uid == c->uid || same->shared)) {
        if (!may_use(same, c))
            return kvd__req_fail(r, KVD_EPERM, "cache '%s' is not shared with this user",
                                 same->name);
        if (!layout_equal(&same->store.layout, &l))
            return kvd__req_fail(r, KVD_ESHAPE, "cache '%s' exists with another layout",
                                 same->name);
        if (!same->cluster != !cc->cluster)
            return kvd__req_fail(r, KVD_EINVAL, "cache '%s' exists %s the cluster", same->name,
                                 same->cluster ? "in" : "outside");
        return reply_info(r, same);
    }
    for (int pass = 0; pass < 2; pass++) /* the caches, and those being made */
        for (k = pass ? srv->caches_opening : srv->caches; k; k = k->next) {
            if (strcmp(k->name, cc->name) == 0 &&
                (k->owner_uid == c->uid || (cc->shared && k->shared)))
                return kvd__req_fail(r, KVD_EEXIST, "a cache named '%s' exists%s", cc->name,
                                     pass ? " (being made)" : "");
            n++;
        }
    if (n >= srv->opts.max_caches)
        return kvd__req_fail(r, KVD_ELIMIT, "the daemon holds %u caches already (max-caches)", n);
    memset(&m, 0, sizeof(m));
    snprintf(m.name, sizeof(m.name), "%s", cc->name);
    m.owner_uid = (uint32_t)c->uid;
    m.shared = cc->shared;
    m.cluster = cc->cluster;
    m.n_allow_uids = (uint32_t)cc->n_allow_uids;
    m.n_allow_gids = (uint32_t)cc->n_allow_gids;
    for (size_t i = 0; i < cc->n_allow_uids; i++)
        m.allow_uids[i] = cc->allow_uids[i];
    for (size_t i = 0; i < cc->n_allow_gids; i++)
        m.allow_gids[i] = cc->allow_gids[i];
    m.layout = l;
    m.budget = cc->budget_bytes;
    m.disk_budget = cc->disk_budget_bytes;
    if (m.disk_budget != 0 && (st = disk_budget_check(srv, m.disk_budget, why,
                                                      sizeof(why))) != KVD_OK)
        return kvd__req_fail(r, st, "%s", why);
    t0 = kvd__now_ns();
    if ((st = cache_new(srv, &m, &k, why, sizeof(why))) != KVD_OK)
        return kvd__req_fail(r, st, "%s", why);
    if (k->disk_dir != NULL) {
        create_work_t *w = calloc(1, sizeof(*w));

        if (w == NULL) {
            cache_free_new(k);
            return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
        }
        w->origin = kvd__origin_of(r);
        w->k = k;
        w->m = m;
        w->r.op = KVD_DISK_OP_CALL;
        w->r.fd = -1;
        w->r.before = create_dir_run;
        w->r.done = create_dir_done;
        w->r.arg = w;
        k->next = srv->caches_opening;
        srv->caches_opening = k;
        kvd__conn_op_begin(c); /* a drain waits for the reply */
        r->deferred = 1;
        w->loop_ns = kvd__now_ns() - t0;
        kvd__disk_io_submit(srv->disk_io, &w->r);
        return KVD_OK;
    }
    cache_link(srv, k);
    log_create(c, k, kvd__now_ns() - t0, r->t_start_ns);
    return reply_info(r, k);
}

uint64_t kvd__caches_disk_budgets(const kvd__server_t *srv)
{
    uint64_t sum = 0;

    for (const kvd__cache_t *k = srv->caches; k; k = k->next)
        sum += k->disk_budget;
    for (const kvd__cache_t *k = srv->caches_opening; k; k = k->next)
        sum += k->disk_budget;
    return sum;
}

uint64_t kvd__caches_budgets(const kvd__server_t *srv)
{
    uint64_t sum = 0;

    for (const kvd__cache_t *k = srv->caches; k; k = k->next)
        sum += k->store.budget;
    return sum;
}

/* ---- leases ----------------------------------------------------------------- */

/* What a lease of n blocks holds, charged to its client. */
static uint64_t lease_bytes(uint32_t n)
{
    return sizeof(kvd__lease_t) + (uint64_t)n * sizeof(uint32_t);
}

void kvd__lease_end(kvd__cache_t *k, kvd__lease_t *l)
{
    for (uint32_t i = l->n; i-- > 0;) /* the last first; NONE: a load let it go */
        if (l->ids[i] != KVD_CBLOCK_NONE)
            kvd__cache_unhold(&k->store, l->ids[i]);
    k->leases--;
    kvd__account_release(l->conn, KVD_HM_LEASES, lease_bytes(l->n));
    free(l->ids);
    free(l);
    kvd__cache_unref(k);
}

kvd__lease_t *kvd__lease_take(kvd__conn_t *c, uint64_t id)
{
    kvd__lease_t **pp;

    for (pp = &c->leases; *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id) {
            kvd__lease_t *l = *pp;
            *pp = l->next;
            c->nleases--;
            return l;
        }
    }
    return NULL;
}

void kvd__leases_drop(kvd__conn_t *c)
{
    while (c->leases) {
        kvd__lease_t *l = c->leases;
        c->leases = l->next;
        kvd__lease_end(l->cache, l);
    }
    c->nleases = 0;
}

void kvd__leases_expire(kvd__conn_t *c, uint64_t now_ns)
{
    kvd__lease_t **pp = &c->leases;

    while (*pp) {
        kvd__lease_t *l = *pp;
        if (now_ns >= l->expires_ns) {
            *pp = l->next;
            c->nleases--;
            kvd__lease_end(l->cache, l);
        } else {
            pp = &l->next;
        }
    }
}

/* Leases on k end (k is dropped). */
static void leases_of_cache_end(kvd__server_t *srv, kvd__cache_t *k)
{
    kvd__conn_t *c;

    for (c = srv->conns; c; c = c->next) {
        kvd__lease_t **pp = &c->leases;
        while (*pp) {
            kvd__lease_t *l = *pp;
            if (l->cache == k) {
                *pp = l->next;
                c->nleases--;
                kvd__lease_end(k, l);
            } else {
                pp = &l->next;
            }
        }
    }
}

kvd_status_t kvd__op_cache_release(kvd__req_t *r)
{
    kvd__lease_t *l = kvd__lease_take(r->conn, r->req->cache_release->lease);

    if (l == NULL)
        return kvd__req_fail(r, KVD_ENOENT, "no lease %" PRIu64 " of this client",
                             r->req->cache_release->lease);
    kvd__lease_end(l->cache, l);
    return KVD_OK;
}

/* ---- drop, list, stats, evict ------------------------------------------------- */

static void cache_drop(kvd__server_t *srv, kvd__cache_t *k)
{
    leases_of_cache_end(srv, k);
    if (k->prev)
        k->prev->next = k->next;
    else
        srv->caches = k->next;
    if (k->next)
        k->next->prev = k->prev;
    k->next = k->prev = NULL;
    k->dropped = 1;
    kvd__waitq_wake_all(&k->waiters); /* they hear that it is gone */
    kvd__cache_unref(k); /* the list's; saves and loads in flight keep theirs */
}

void kvd__caches_wake_waiting(kvd__server_t *srv)
{
    for (kvd__cache_t *k = srv->caches; k; k = k->next)
        kvd__waitq_wake_all(&k->waiters);
}

kvd_status_t kvd__op_cache_drop(kvd__req_t *r)
{
    const Kvdock__CacheDrop *cd = r->req->cache_drop;
    kvd__origin_t origin = kvd__origin_of(r);
    kvd__cache_t *k = NULL;
    kvd_status_t st = find_cache(r, cd->cache, cd->name, 0, &k);

    if (st != KVD_OK)
        return st;
    kvd_log(KVD_LOG_INFO, "event=cache_drop client=%" PRIu64 " cache=%" PRIu64 " name=%s "
            "blocks=%u", r->conn->id, k->id, k->name, k->store.ready);
    /* the reply waits for the slabs to be unmapped, where they go now */
    kvd__server_drop_wait_begin(&origin);
    k->remove_dir = 1; /* its blocks on disk go with it, once nothing uses it */
    cache_drop(r->srv, k);
    r->deferred = kvd__server_drop_wait_end(r->srv);
    return KVD_OK;
}

void kvd__caches_destroy(kvd__server_t *srv)
{
    while (srv->caches)
        cache_drop(srv, srv->caches);
    free(srv->skipped);
    srv->skipped = NULL;
    srv->n_skipped_kept = srv->n_skipped = 0;
}

/* A directory of --cache-dir this user owns and no one else may write. */
static int dir_trusted(int dfd, const char *name, char *why, size_t why_len)
{
    struct stat st;

    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        snprintf(why, why_len, "%s", strerror(errno));
        return 0;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, why_len, "not a directory");
        return 0;
    }
    if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        snprintf(why, why_len, "it belongs to uid %u with mode %04o: only the daemon's user "
                 "(uid %u) may write a cache's directory", (unsigned)st.st_uid,
                 (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
        return 0;
    }
    return 1;
}

/* Why a cache of manifest m cannot be made next to the caches made so
 * far; NULL: it can. */
static const char *reopen_conflict(kvd__server_t *srv, const kvd__manifest_t *m, char *why,
                                   size_t why_len)
{
    uint32_t n = 0;

    for (const kvd__cache_t *k = srv->caches; k; k = k->next, n++)
        if (strcmp(k->name, m->name) == 0 &&
            (k->owner_uid == (uid_t)m->owner_uid || (k->shared && m->shared))) {
            snprintf(why, why_len, "a cache named '%s' is open already", m->name);
            return why;
        }
    if (n >= srv->opts.max_caches) {
        snprintf(why, why_len, "the daemon holds %u caches already (max-caches)", n);
        return why;
    }
    if (m->budget > srv->hostmem.budget) {
        snprintf(why, why_len, "its budget (%" PRIu64 ") is more than the host-memory budget "
                 "(%" PRIu64 ", --host-memory-budget)", m->budget, srv->hostmem.budget);
        return why;
    }
    if (m->disk_budget > srv->disk_budget ||
        kvd__caches_disk_budgets(srv) > srv->disk_budget - m->disk_budget) {
        snprintf(why, why_len, "its disk budget (%" PRIu64 ") does not fit the daemon's "
                 "(--disk-budget %" PRIu64 ", %" PRIu64 " taken by caches reopened before it)",
                 m->disk_budget, srv->disk_budget, kvd__caches_disk_budgets(srv));
        return why;
    }
    return NULL;
}

/* Directory dirname of --cache-dir is left as it is, for why; m: its
 * manifest, when it could be read.  Logged, counted and (the first
 * KVD_SKIPPED_KEPT) kept for the status, the name's bytes outside
 * printable ASCII as '?'. */
static void reopen_skip(kvd__server_t *srv, const char *path, const char *dirname,
                        const kvd__manifest_t *m, const char *why)
{
    kvd__skipped_cache_t *e;

    if (m != NULL)
        kvd_log(KVD_LOG_WARN, "event=cache_reopen_skipped dir=%s name=%s uid=%u reason=\"%s\" "
                "action=\"left as it is\"", path, m->name, m->owner_uid, why);
    else
        kvd_log(KVD_LOG_WARN, "event=cache_reopen_skipped dir=%s reason=\"%s\" "
                "action=\"left as it is\"", path, why);
    srv->n_skipped++;
    if (srv->n_skipped_kept >= KVD_SKIPPED_KEPT)
        return;
    if (srv->skipped == NULL &&
        (srv->skipped = calloc(KVD_SKIPPED_KEPT, sizeof(*srv->skipped))) == NULL)
        return; /* the log has it; the status goes without */
    e = &srv->skipped[srv->n_skipped_kept++];
    /* any bytes may name a directory; the status carries printable ASCII */
    for (size_t i = 0; dirname[i] != '\0' && i + 1 < sizeof(e->dir); i++)
        e->dir[i] = dirname[i] >= 0x20 && dirname[i] < 0x7f ? dirname[i] : '?';
    if (m != NULL) {
        snprintf(e->name, sizeof(e->name), "%s", m->name);
        e->owner_uid = m->owner_uid;
    }
    snprintf(e->reason, sizeof(e->reason), "%s", why);
}

void kvd__caches_reopen(kvd__server_t *srv)
{
    const char *top = srv->opts.cache_dir;
    uint64_t t0 = kvd__now_ns(), blocks = 0;
    uint32_t reopened = 0, skipped = 0, removed = 0;
    struct dirent *e;
    DIR *d;
    int dfd;

    if ((dfd = open(top, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 ||
        (d = fdopendir(dfd)) == NULL) {
        kvd_log(KVD_LOG_ERROR, "event=disk_reopen_failed dir=%s error=\"%s\"", top,
                strerror(errno));
        if (dfd >= 0)
            close(dfd);
        return;
    }
    while ((e = readdir(d)) != NULL) {
        char path[PATH_MAX], why[400];
        kvd__manifest_t m;
        kvd__cache_t *k = NULL;
        kvd__cache_disk_stats_t ds;
        uint64_t t1 = kvd__now_ns();
        kvd_status_t st;

        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (snprintf(path, sizeof(path), "%s/%s", top, e->d_name) >= (int)sizeof(path))
            continue;
        if (!dir_trusted(dirfd(d), e->d_name, why, sizeof(why))) {
            reopen_skip(srv, path, e->d_name, NULL, why);
            skipped++;
            continue;
        }
        if (strncmp(e->d_name, KVD_CACHE_DIR_DROPPED, strlen(KVD_CACHE_DIR_DROPPED)) == 0) {
            /* a dropped cache's, its removal cut short */
            kvd__cache_dir_discard(srv, path);
            removed++;
            continue;
        }
        if ((st = kvd__manifest_read(path, e->d_name, &m, why, sizeof(why))) != KVD_OK) {
            reopen_skip(srv, path, e->d_name, NULL, why);
            skipped++;
            continue;
        }
        if (reopen_conflict(srv, &m, why, sizeof(why)) == NULL &&
            cache_new(srv, &m, &k, why, sizeof(why)) == KVD_OK &&
            cache_open_disk(srv, k, why, sizeof(why)) != KVD_OK) {
            cache_free_new(k);
            k = NULL;
        }
        if (k == NULL) {
            reopen_skip(srv, path, e->d_name, &m, why);
            skipped++;
            continue;
        }
        cache_link(srv, k);
        if (k->cluster && srv->cluster == NULL) /* its blocks are here; the peers are not */
            kvd_log(KVD_LOG_WARN, "event=cache_reopened_outside_cluster name=%s uid=%u "
                    "reason=\"made with cluster = true, and this daemon is in no cluster "
                    "(--cluster-listen): it serves its own blocks only\"", k->name,
                    (unsigned)k->owner_uid);
        kvd__cache_store_disk_stats(&k->store, &ds);
        blocks += ds.blocks;
        reopened++;
        kvd_log(KVD_LOG_INFO, "event=cache_reopened cache=%" PRIu64 " name=%s uid=%u shared=%d "
                "cluster=%d layers=%u mla=%d tokens=%u token_bytes=%" PRIu64 " budget=%" PRIu64
                " disk_budget=%" PRIu64 " blocks=%u ms=%" PRIu64, k->id, k->name,
                (unsigned)k->owner_uid, k->shared, k->cluster, m.layout.num_layers,
                m.layout.mla, m.layout.tokens_per_block, m.layout.token_bytes, m.budget,
                m.disk_budget, ds.blocks, (kvd__now_ns() - t1) / 1000000u);
    }
    closedir(d);
    kvd_log(KVD_LOG_INFO, "event=disk_reopen dir=%s caches=%u blocks=%" PRIu64 " skipped=%u "
            "dropped_dirs=%u ms=%" PRIu64, top, reopened, blocks, skipped, removed,
            (kvd__now_ns() - t0) / 1000000u);
}

Kvdock__DiskStatus *kvd__disk_status(kvd__req_t *r)
{
    const kvd__server_t *srv = r->srv;
    Kvdock__DiskStatus *ds;
    uint64_t avail = 0, total = 0;
    char why[200];

    if (srv->disk_io == NULL)
        return NULL;
    if ((ds = kvd__req_alloc(r, sizeof(*ds))) == NULL)
        return NULL;
    kvdock__disk_status__init(ds);
    ds->cache_dir = (char *)srv->opts.cache_dir;
    ds->budget_bytes = srv->disk_budget;
    ds->reserved_bytes = kvd__caches_disk_budgets(srv);
    for (const kvd__cache_t *k = srv->caches; k; k = k->next) {
        kvd__cache_disk_stats_t st;
        if (k->disk_dir == NULL)
            continue;
        kvd__cache_store_disk_stats(&k->store, &st);
        ds->used_bytes += st.used_bytes;
    }
    if (kvd__cache_dir_space(srv->opts.cache_dir, &avail, &total, why, sizeof(why)) == 0)
        ds->fs_free_bytes = avail;
    ds->io_engine = (char *)srv->disk_engine;
    ds->direct = srv->disk_direct;
    ds->skipped_count = srv->n_skipped;
    if (srv->n_skipped_kept > 0 &&
        (ds->skipped = kvd__req_alloc(r, srv->n_skipped_kept * (sizeof(*ds->skipped) +
                                                                 sizeof(**ds->skipped)))) != NULL) {
        Kvdock__SkippedCache *sc = (Kvdock__SkippedCache *)(ds->skipped + srv->n_skipped_kept);

        for (uint32_t i = 0; i < srv->n_skipped_kept; i++, sc++) {
            const kvd__skipped_cache_t *e = &srv->skipped[i];

            kvdock__skipped_cache__init(sc);
            sc->dir = (char *)e->dir;
            sc->name = (char *)e->name;
            sc->owner_uid = e->owner_uid;
            sc->reason = (char *)e->reason;
            ds->skipped[i] = sc;
        }
        ds->n_skipped = srv->n_skipped_kept;
    }
    return ds;
}

kvd_status_t kvd__op_cache_list(kvd__req_t *r)
{
    Kvdock__CacheListReply *l = kvd__req_alloc(r, sizeof(*l));
    kvd__cache_t *k = NULL;
    size_t n = 0;

    if (l == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    kvdock__cache_list_reply__init(l);
    for (k = r->srv->caches; k; k = k->next)
        n++;
    l->caches = kvd__req_alloc(r, sizeof(*l->caches) * (n ? n : 1));
    if (l->caches == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    for (k = r->srv->caches; k; k = k->next) {
        if (!may_see(k, r->conn))
            continue;
        if ((l->caches[l->n_caches] = cache_info(r, k)) == NULL)
            return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
        l->n_caches++;
    }
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_CACHES;
    r->resp.caches = l;
    return KVD_OK;
}

kvd_status_t kvd__op_cache_stats(kvd__req_t *r)
{
    const Kvdock__CacheStats *cs = r->req->cache_stats;
    kvd__cache_t *k = NULL;
    kvd_status_t st = find_cache(r, cs->cache, cs->name, 1, &k);

    if (st == KVD_EPERM && r->conn->admin) /* admins read every cache's figures */
        st = KVD_OK;
    if (st != KVD_OK)
        return st;
    return reply_info(r, k);
}

/* ---- keys -------------------------------------------------------------------- */

/* A request's chain: n keys of width bytes back to back in blob (a blob or
 * the key area), or each with its own length in k and len (a list); a
 * blob's k and len are made only where asked for (keys_list). */
typedef struct keys {
    const uint8_t **k;
    size_t *len;
    uint32_t n;
    const uint8_t *blob;
    size_t width;
} keys_t;

/* ks->k and ks->len of a chain in a blob. */
static kvd_status_t keys_list(kvd__req_t *r, keys_t *ks)
{
    uint32_t i;

    if (ks->blob == NULL || ks->k != NULL)
        return KVD_OK;
    ks->k = kvd__req_alloc(r, ks->n * sizeof(*ks->k));
    ks->len = kvd__req_alloc(r, ks->n * sizeof(*ks->len));
    if (ks->k == NULL || ks->len == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    for (i = 0; i < ks->n; i++) {
        ks->k[i] = ks->blob + (size_t)i * ks->width;
        ks->len[i] = ks->width;
    }
    return KVD_OK;
}

/* The chain of a request, checked: 1..MAX_KEYS keys of 1..64 bytes (none
 * twice is the caller's to check); one named in the connection's key
 * area is copied out of it first, unless in_place: then the blob is the
 * area itself, for kvd__cache_lookup_blob alone (keyarea.h).  A list's k
 * and len are made; a blob's are not (keys_list). */
static kvd_status_t get_keys_form(kvd__req_t *r, const Kvdock__CacheKeys *ck, int allow_empty,
                                  int in_place, keys_t *out)
{
    const uint8_t *blob = NULL;
    size_t n, i, width = 0;
    kvd_status_t st;

    memset(out, 0, sizeof(*out));
    if (ck != NULL && ck->area != NULL) {
        st = in_place ? kvd__key_area_view(r, ck, &blob, &n) : kvd__key_area_read(r, ck, &blob, &n);
        if (st != KVD_OK)
            return st;
        width = ck->key_size;
    } else if (ck == NULL || (ck->n_keys == 0 && ck->blob.len == 0)) {
        if (allow_empty)
            return KVD_OK;
        return kvd__req_fail(r, KVD_EINVAL, "keys: the chain is empty");
    } else if (ck->n_keys > 0 && ck->blob.len > 0) {
        return kvd__req_fail(r, KVD_EINVAL, "keys: a list and a blob are exclusive");
    } else if (ck->blob.len > 0) {
        if (ck->key_size < 1 || ck->key_size > KVD_CACHE_KEY_MAX)
            return kvd__req_fail(r, KVD_EINVAL, "keys.key_size %u: keys are 1 to %d bytes",
                                 ck->key_size, KVD_CACHE_KEY_MAX);
        if (ck->blob.len % ck->key_size != 0)
            return kvd__req_fail(r, KVD_ESHAPE, "keys: %zu blob bytes are not whole keys of %u",
                                 ck->blob.len, ck->key_size);
        blob = ck->blob.data;
        width = ck->key_size;
        n = ck->blob.len / ck->key_size;
    } else {
        n = ck->n_keys;
    }
    if (n > MAX_KEYS)
        return kvd__req_fail(r, KVD_ELIMIT, "keys: %zu keys, at most %d in one request", n,
                             MAX_KEYS);
    out->n = (uint32_t)n;
    if (blob != NULL) {
        out->blob = blob;
        out->width = width;
        return KVD_OK;
    }
    out->k = kvd__req_alloc(r, n * sizeof(*out->k));
    out->len = kvd__req_alloc(r, n * sizeof(*out->len));
    if (out->k == NULL || out->len == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    for (i = 0; i < n; i++) {
        out->k[i] = ck->keys[i].data;
        out->len[i] = ck->keys[i].len;
        if (out->len[i] < 1 || out->len[i] > KVD_CACHE_KEY_MAX)
            return kvd__req_fail(r, KVD_EINVAL, "keys[%zu] is %zu bytes: keys are 1 to %d", i,
                                 out->len[i], KVD_CACHE_KEY_MAX);
    }
    return KVD_OK;
}

/* The chain of a request (get_keys_form), with its k and len made. */
static kvd_status_t get_keys(kvd__req_t *r, const Kvdock__CacheKeys *ck, int allow_empty,
                             keys_t *out)
{
    kvd_status_t st = get_keys_form(r, ck, allow_empty, 0, out);

    return st != KVD_OK ? st : keys_list(r, out);
}

/* A key named twice in one chain is refused.  The probe table hashes with
 * the cache's secret seed: keys are the client's, and a hash it could aim
 * would make this check quadratic. */
static kvd_status_t no_duplicates(kvd__req_t *r, const kvd__cache_store_t *c, const keys_t *ks)
{
    uint32_t size = 16, i, *tab;

    while (size < 2 * ks->n)
        size *= 2;
    tab = kvd__req_alloc(r, size * sizeof(*tab));
    if (tab == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    for (i = 0; i < ks->n; i++) {
        uint32_t j = (uint32_t)kvd__cache_hash(c, ks->k[i], ks->len[i]) & (size - 1);
        for (; tab[j] != 0; j = (j + 1) & (size - 1)) {
            uint32_t o = tab[j] - 1;
            if (ks->len[o] == ks->len[i] && memcmp(ks->k[o], ks->k[i], ks->len[i]) == 0)
                return kvd__req_fail(r, KVD_EINVAL, "keys[%u] repeats keys[%u]: a chain names "
                                     "each block once", i, o);
        }
        tab[j] = i + 1;
    }
    return KVD_OK;
}

/* ---- lookup ------------------------------------------------------------------- */

typedef struct run {
    uint32_t first, n;
} run_t;

static int run_cmp(const void *a, const void *b)
{
    const run_t *x = a, *y = b;

    return x->first < y->first ? -1 : x->first > y->first;
}

/* A key named twice among the hits of a lookup is refused, as save and
 * load refuse one anywhere.  Hits come in runs of consecutive block ids
 * (a chain saved in one go is one run), so a block found twice is two
 * runs that overlap: a chain of one run costs nothing more. */
static kvd_status_t repeated_hit(const uint32_t *ids, uint32_t n, char *msg, size_t len)
{
    uint32_t i, nruns = 0;
    run_t *runs;
    kvd_status_t st = KVD_OK;

    for (i = 1; i < n && ids[i] == ids[i - 1] + 1; i++)
        ;
    if (i >= n)
        return KVD_OK;
    runs = malloc(n * sizeof(*runs));
    if (runs == NULL) {
        snprintf(msg, len, "out of memory");
        return KVD_ENOMEM;
    }
    for (i = 0; i < n; i++) {
        if (nruns > 0 && ids[i] == runs[nruns - 1].first + runs[nruns - 1].n)
            runs[nruns - 1].n++;
        else
            runs[nruns++] = (run_t){ids[i], 1};
    }
    qsort(runs, nruns, sizeof(*runs), run_cmp);
    for (i = 1; i < nruns && st == KVD_OK; i++)
        if ((uint64_t)runs[i - 1].first + runs[i - 1].n > runs[i].first) {
            snprintf(msg, len, "the chain names block %u twice: a chain names each block once",
                     runs[i].first);
            st = KVD_EINVAL;
        }
    free(runs);
    return st;
}

/* The leading keys of chain ks in k (their blocks in ids, the count in
 * *hits), made the most recent. */
static kvd_status_t lookup_hits(kvd__cache_t *k, const keys_t *ks, uint32_t *ids, uint32_t *hits,
                                char *msg, size_t len)
{
    kvd_status_t st;
    int linked = 0;

    if (ks->blob != NULL)
        *hits = kvd__cache_lookup_blob(&k->store, ks->blob, ks->width, ks->n, ids, &linked);
    else
        *hits = kvd__cache_lookup(&k->store, ks->k, ks->len, ks->n, 0, ids);
    if (linked) { /* one run of blocks: none twice */
        if (*hits > 0)
            kvd__cache_touch_run(&k->store, ids[0], *hits);
        return KVD_OK;
    }
    if ((st = repeated_hit(ids, *hits, msg, len)) != KVD_OK)
        return st;
    kvd__cache_touch_chain(&k->store, ids, *hits);
    return KVD_OK;
}

/* A lookup's answer in rep: the hits here (ids[0..hits)), then the run
 * the peers hold from the first key missing here (present: a bit per key
 * from first on, or NULL), and a lease on those here if asked. */
static kvd_status_t lookup_reply(kvd__server_t *srv, kvd__conn_t *c, kvd__cache_t *k,
                                 const Kvdock__CacheLookup *cl, const uint32_t *ids,
                                 uint32_t hits, uint32_t n, uint32_t first,
                                 const uint8_t *present, Kvdock__CacheLookupReply *rep,
                                 char *msg, size_t len)
{
    kvd_status_t st;

    if (cl->lease && c->nleases >= srv->opts.max_leases) {
        snprintf(msg, len, "this client holds %u leases already (max-leases)", c->nleases);
        return KVD_ELIMIT;
    }
    rep->local_hits = hits;
    rep->disk_hits = kvd__cache_disk_hits(&k->store, ids, hits);
    rep->hits = hits;
    while (present != NULL && rep->hits < n && rep->hits >= first &&
           kvd__cluster_bit(present, rep->hits - first))
        rep->hits++;
    k->store.n.lookups++;
    k->store.n.keys_asked += n;
    k->store.n.keys_hit += rep->hits;
    k->peer_hits += rep->hits - hits;
    if (cl->lease && hits > 0) {
        uint32_t ms = cl->lease_ms ? cl->lease_ms : (uint32_t)srv->opts.cache_lease_ms;
        kvd__lease_t *l;

        if ((st = kvd__account_charge(c, KVD_HM_LEASES, lease_bytes(hits), msg, len)) != KVD_OK)
            return st;
        l = calloc(1, sizeof(*l));
        if (l == NULL || (l->ids = malloc(hits * sizeof(*l->ids))) == NULL) {
            free(l);
            kvd__account_release(c, KVD_HM_LEASES, lease_bytes(hits));
            snprintf(msg, len, "out of memory");
            return KVD_ENOMEM;
        }
        l->conn = c;
        if (ms > MAX_LEASE_MS)
            ms = MAX_LEASE_MS;
        memcpy(l->ids, ids, hits * sizeof(*ids));
        l->n = hits;
        for (uint32_t i = 0; i < hits; i++)
            kvd__cache_hold(&k->store, ids[i]);
        l->id = srv->next_lease_id++;
        l->cache = k;
        k->refs++;
        k->leases++;
        l->expires_ns = kvd__now_ns() + (uint64_t)ms * 1000000ull;
        l->next = c->leases;
        c->leases = l;
        c->nleases++;
        kvd__server_sweep_arm(srv);
        rep->lease = l->id;
        rep->lease_expires_ms = ms;
    }
    return KVD_OK;
}

/* A lookup waiting for the peers: what its answer needs, in memory of its
 * own (charged to its client as request bookkeeping). */
typedef struct lookup_wait {
    kvd__origin_t origin;    /* held: this wait's bytes */
    kvd__cache_t *cache;     /* referenced */
    Kvdock__CacheLookup cl; /* its lease and lease_ms */
    uint32_t n, first;      /* the peers were asked about keys [first, n) */
    const uint8_t **keys;   /* [n], into bytes */
    size_t *lens;
    uint32_t *ids;
    uint64_t bytes[];       /* keys, lens, ids, then the keys' bytes */
} lookup_wait_t;

/* The peers answered (or the deadline passed): the lookup's reply, naming
 * the peers that were waited for in vain. */
static void lookup_answered(void *arg, const uint8_t *present, const char *why,
                            const char *waited_for)
{
    lookup_wait_t *w = arg;
    kvd__conn_t *c = w->origin.conn;
    Kvdock__Response resp = KVDOCK__RESPONSE__INIT;
    Kvdock__CacheLookupReply rep = KVDOCK__CACHE_LOOKUP_REPLY__INIT;
    char msg[256] = "";
    uint32_t hits = 0;
    kvd_status_t st;

    if (!c->closing) {
        keys_t ks = {w->keys, w->lens, w->n, NULL, 0};

        st = lookup_hits(w->cache, &ks, w->ids, &hits, msg, sizeof(msg));
        if (st == KVD_OK)
            st = lookup_reply(w->origin.srv, c, w->cache, &w->cl, w->ids, hits, w->n, w->first,
                              present, &rep, msg, sizeof(msg));
        resp.status = (uint32_t)st;
        if (st != KVD_OK) {
            resp.message = msg;
        } else {
            rep.waited_for = (char *)waited_for;
            resp.result_case = KVDOCK__RESPONSE__RESULT_CACHE_LOOKUP;
            resp.cache_lookup = &rep;
            if (waited_for[0] != '\0')
                kvd_log(KVD_LOG_INFO, "event=cluster_lookup_waited client=%" PRIu64 " id=%"
                        PRIu64 " peers=%s reason=\"%s\"", c->id, w->origin.req_id, waited_for,
                        why);
        }
        kvd__reply_deferred_response(&w->origin, &resp);
    }
    kvd__cache_unref(w->cache);
    kvd__account_release(c, KVD_HM_REQUESTS, w->origin.held);
    free(w);
    kvd__conn_op_end(c);
}

/* Ask the live peers about keys [first, n) of r's lookup: KVD_OK with r
 * deferred (lookup_answered replies), KVD_ENOENT when nobody can be
 * asked (r answers from here), or a failure. */
static kvd_status_t lookup_ask(kvd__req_t *r, kvd__cache_t *k, const keys_t *ks, uint32_t first)
{
    uint64_t keybytes = 0, held;
    kvd__cluster_ask_t ask;
    lookup_wait_t *w;
    uint8_t *at;
    char why[200];
    kvd_status_t st;

    for (uint32_t i = 0; i < ks->n; i++)
        keybytes += ks->len[i];
    held = sizeof(*w) + keybytes +
           (uint64_t)ks->n * (sizeof(*w->keys) + sizeof(*w->lens) + sizeof(*w->ids));
    if ((st = kvd__account_charge(r->conn, KVD_HM_REQUESTS, held, r->msg, sizeof(r->msg))) !=
        KVD_OK)
        return st;
    w = calloc(1, held);
    if (w == NULL) {
        kvd__account_release(r->conn, KVD_HM_REQUESTS, held);
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    }
    w->keys = (const uint8_t **)w->bytes;
    w->lens = (size_t *)(w->keys + ks->n);
    w->ids = (uint32_t *)(w->lens + ks->n);
    at = (uint8_t *)(w->ids + ks->n);
    for (uint32_t i = 0; i < ks->n; i++) {
        memcpy(at, ks->k[i], ks->len[i]);
        w->keys[i] = at;
        w->lens[i] = ks->len[i];
        at += ks->len[i];
    }
    w->origin = kvd__origin_of(r);
    w->origin.held = held;
    w->cache = k;
    w->cl = *r->req->cache_lookup;
    w->cl.keys = NULL;
    w->n = ks->n;
    w->first = first;
    memset(&ask, 0, sizeof(ask));
    ask.cache = k;
    ask.keys = w->keys;
    ask.lens = w->lens;
    ask.first = first;
    ask.n = ks->n;
    ask.done = lookup_answered;
    ask.arg = w;
    st = kvd__cluster_ask(r->srv->cluster, &ask, why, sizeof(why));
    if (st != KVD_OK) {
        kvd__account_release(r->conn, KVD_HM_REQUESTS, held);
        free(w);
        return st == KVD_ENOENT ? st : kvd__req_fail(r, st, "%s", why);
    }
    k->refs++;
    kvd__conn_op_begin(r->conn);
    r->deferred = 1;
    return KVD_OK;
}

/* A chain whose first key is not in k, and whose form get_keys would take
 * (else 0, and get_keys says what is wrong): its key count in *n.  Such a
 * lookup is answered from the first key alone, without a table of the
 * rest: a chain that misses at once costs what a one-key lookup does (and
 * one in c's key area has only its first key read). */
static int first_key_missing(const kvd__conn_t *c, kvd__cache_t *k, const Kvdock__CacheKeys *ck,
                             uint32_t *n)
{
    uint8_t first[KVD_CACHE_KEY_MAX];
    const uint8_t *key;
    size_t len, i, count;
    uint32_t id;

    if (ck != NULL && ck->area != NULL) {
        if (!kvd__key_area_first(c, ck, first, &count))
            return 0;
        key = first;
        len = ck->key_size;
    } else if (ck == NULL || (ck->n_keys > 0) == (ck->blob.len > 0)) {
        return 0;
    } else if (ck->blob.len > 0) {
        if (ck->key_size < 1 || ck->key_size > KVD_CACHE_KEY_MAX ||
            ck->blob.len % ck->key_size != 0)
            return 0;
        count = ck->blob.len / ck->key_size;
        key = ck->blob.data;
        len = ck->key_size;
    } else {
        count = ck->n_keys;
        for (i = 0; i < count && i <= MAX_KEYS; i++)
            if (ck->keys[i].len < 1 || ck->keys[i].len > KVD_CACHE_KEY_MAX)
                return 0;
        key = ck->keys[0].data;
        len = ck->keys[0].len;
    }
    if (count > MAX_KEYS || kvd__cache_lookup(&k->store, &key, &len, 1, 0, &id) != 0)
        return 0;
    *n = (uint32_t)count;
    return 1;
}

kvd_status_t kvd__op_cache_lookup(kvd__req_t *r)
{
    const Kvdock__CacheLookup *cl = r->req->cache_lookup;
    Kvdock__CacheLookupReply *rep;
    kvd__cache_t *k = NULL;
    keys_t ks;
    uint32_t *ids = NULL, hits;
    kvd_status_t st;
    int peers;

    if ((st = find_cache(r, cl->cache, NULL, 1, &k)) != KVD_OK)
        return st;
    peers = k->cluster && kvd__cluster_live(r->srv->cluster);
    if (!peers && first_key_missing(r->conn, k, cl->keys, &ks.n)) {
        if (cl->lease && r->conn->nleases >= r->srv->opts.max_leases)
            return kvd__req_fail(r, KVD_ELIMIT, "this client holds %u leases already "
                                 "(max-leases)", r->conn->nleases);
        if ((rep = kvd__req_alloc(r, sizeof(*rep))) == NULL)
            return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
        kvdock__cache_lookup_reply__init(rep);
        if ((st = lookup_reply(r->srv, r->conn, k, cl, NULL, 0, ks.n, 0, NULL, rep, r->msg,
                               sizeof(r->msg))) != KVD_OK)
            return st;
        r->resp.result_case = KVDOCK__RESPONSE__RESULT_CACHE_LOOKUP;
        r->resp.cache_lookup = rep;
        return KVD_OK;
    }
    /* the keys are read in place unless the peers may be asked about them */
    if ((st = get_keys_form(r, cl->keys, 0, !peers, &ks)) != KVD_OK)
        return st;
    if (cl->lease && r->conn->nleases >= r->srv->opts.max_leases)
        return kvd__req_fail(r, KVD_ELIMIT, "this client holds %u leases already (max-leases)",
                             r->conn->nleases);
    rep = kvd__req_alloc(r, sizeof(*rep));
    ids = kvd__req_alloc(r, ks.n * sizeof(*ids));
    if (rep == NULL || ids == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    kvdock__cache_lookup_reply__init(rep);
    if ((st = lookup_hits(k, &ks, ids, &hits, r->msg, sizeof(r->msg))) != KVD_OK)
        return st;
    if (hits < ks.n && peers) {
        /* ask the peers about the rest */
        if ((st = keys_list(r, &ks)) != KVD_OK ||
            (st = lookup_ask(r, k, &ks, hits)) != KVD_ENOENT)
            return st;
    }
    if ((st = lookup_reply(r->srv, r->conn, k, cl, ids, hits, ks.n, 0, NULL, rep, r->msg,
                           sizeof(r->msg))) != KVD_OK)
        return st;
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_CACHE_LOOKUP;
    r->resp.cache_lookup = rep;
    return KVD_OK;
}

/* ---- evict --------------------------------------------------------------------- */

kvd_status_t kvd__op_cache_evict(kvd__req_t *r)
{
    const Kvdock__CacheEvict *ce = r->req->cache_evict;
    Kvdock__CacheEvictReply *rep = kvd__req_alloc(r, sizeof(*rep));
    kvd__cache_t *k = NULL;
    keys_t ks;
    kvd_status_t st;

    if (rep == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    if ((st = find_cache(r, ce->cache, NULL, 0, &k)) != KVD_OK ||
        (st = get_keys(r, ce->keys, ce->all, &ks)) != KVD_OK)
        return st;
    if (ce->all && ks.n > 0)
        return kvd__req_fail(r, KVD_EINVAL, "all takes no keys");
    kvdock__cache_evict_reply__init(rep);
    if (ce->all) {
        rep->evicted = kvd__cache_clear(&k->store);
        /* a slab on its way is dropped too: those waiting for it hear */
        kvd__cache_slots_freed(k, rep->evicted);
    } else {
        for (uint32_t i = 0; i < ks.n; i++) {
            uint32_t n = 0;
            st = kvd__cache_evict_key(&k->store, ks.k[i], ks.len[i], &n);
            if (st == KVD_ENOMEM)
                return kvd__req_fail(r, st, "out of memory");
            rep->evicted += n;
            rep->busy += st == KVD_EBUSY;
            rep->missing += st == KVD_ENOENT;
        }
    }
    kvd_log(KVD_LOG_INFO, "event=cache_evict client=%" PRIu64 " cache=%" PRIu64 " all=%d "
            "evicted=%u busy=%u missing=%u", r->conn->id, k->id, ce->all, rep->evicted,
            rep->busy, rep->missing);
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_CACHE_EVICT;
    r->resp.cache_evict = rep;
    return KVD_OK;
}

/* ---- saves and loads ------------------------------------------------------------ */

/* What a save carries to its finish. */
typedef struct cacheop {
    kvd__cache_t *cache;
    uint32_t *ids;      /* the blocks, in chain order */
    uint8_t *is_new;    /* reserved by this save (else held while it ran) */
    uint32_t n;
    uint32_t stored, skipped, refused;
    kvd__conn_t *conn;   /* charged with held bytes of requests */
    uint64_t held;
} cacheop_t;

/* The pool must hold blocks of the cache's layout, by whole pages. */
static kvd_status_t check_pool(kvd__req_t *r, const kvd__pool_t *p, const kvd__cache_store_t *c)
{
    const kvd__block_layout_t *l = &c->layout;

    if (p->num_layers != l->num_layers || !p->mla != !l->mla || p->slot_bytes != l->token_bytes)
        return kvd__req_fail(r, KVD_ESHAPE, "pool '%s' (%u layers, %s, %" PRIu64 "-byte rows) "
                             "does not hold the cache's blocks (%u layers, %s, %" PRIu64
                             "-byte rows)", p->name, p->num_layers, p->mla ? "MLA" : "MHA",
                             p->slot_bytes, l->num_layers, l->mla ? "MLA" : "MHA",
                             l->token_bytes);
    if (p->page_size > 1 && p->page_size != l->tokens_per_block)
        return kvd__req_fail(r, KVD_ESHAPE, "pool '%s' has pages of %u slots, the cache's "
                             "blocks are %u tokens", p->name, p->page_size, l->tokens_per_block);
    if (p->slot_stride != p->slot_bytes)
        return kvd__req_fail(r, KVD_ESHAPE, "pool '%s' has rows %" PRIu64 " bytes apart: a "
                             "block's rows must be contiguous (slot_stride = slot_bytes)",
                             p->name, p->slot_stride);
    if (p->num_slots < l->tokens_per_block)
        return kvd__req_fail(r, KVD_ESHAPE, "pool '%s' holds no whole block", p->name);
    return KVD_OK;
}

/* The page indices of a save or load: inline, one per key, none negative. */
static kvd_status_t get_pages(kvd__req_t *r, kvd__dataop_t *d, const Kvdock__Indices *ix,
                              const kvd__pool_t *p, uint32_t tokens, uint32_t n, int64_t **out)
{
    kvd__idx_t x;
    kvd_status_t st;

    if (ix != NULL && ix->buffer != NULL)
        return kvd__req_fail(r, KVD_EINVAL, "blocks: cache operations take inline indices");
    if ((st = kvd__get_indices(r, d, ix, (int64_t)(p->num_slots / tokens), "blocks", &x)) !=
        KVD_OK)
        return st;
    if (x.count != (int64_t)n)
        return kvd__req_fail(r, KVD_ESHAPE, "%" PRId64 " blocks for %u keys", x.count, n);
    if (x.valid != x.count)
        return kvd__req_fail(r, KVD_EINVAL, "blocks: a page index is negative");
    if (x.dtype == KVD_DTYPE_I32 && (st = kvd__widen(r, d, &x)) != KVD_OK)
        return st;
    *out = (int64_t *)x.ptr;
    return KVD_OK;
}

/* A save ends: its new blocks are committed (st KVD_OK) or aborted, the
 * last first; its reply's counts; op goes. */
static void save_end(cacheop_t *op, kvd_status_t st, Kvdock__OpReply *rep, uint64_t *bytes)
{
    kvd__cache_store_t *c = &op->cache->store;
    uint32_t i;

    for (i = op->n; i-- > 0;) { /* the last first: parents end up more recent */
        if (op->is_new[i]) {
            if (st != KVD_OK)
                kvd__cache_abort(c, op->ids[i]);
            else if (!kvd__cache_commit(c, op->ids[i]))
                op->stored--; /* another save it chained onto failed */
        } else {
            kvd__cache_unhold(c, op->ids[i]);
        }
    }
    kvd__cache_disk_flush(c); /* the blocks' records go to disk now */
    op->cache->saving--;
    /* its blocks are being written, or free to go where they could not be */
    kvd__cache_slots_freed(op->cache, 0);
    if (st == KVD_OK) {
        c->n.saves++;
        c->n.stored += op->stored;
        c->n.skipped += op->skipped;
        c->n.refused += op->refused;
        c->n.bytes_in += (uint64_t)op->stored * c->block_bytes;
        rep->stored = op->stored;
        rep->skipped = op->skipped;
        rep->refused = op->refused;
        *bytes = (uint64_t)op->stored * c->block_bytes;
    }
    rep->rows = op->n;
    kvd__cache_unref(op->cache);
    kvd__account_release(op->conn, KVD_HM_REQUESTS, op->held);
    free(op->ids);
    free(op->is_new);
    free(op);
}

static void save_finish(kvd__dataop_t *d, kvd_status_t st, Kvdock__OpReply *rep, uint64_t *bytes)
{
    if (d->ext == NULL)
        return;
    save_end(d->ext, st, rep, bytes);
    d->ext = NULL;
}

/* The operation's bookkeeping, reserved before anything else can fail. */
static kvd_status_t cacheop_new(kvd__req_t *r, kvd__dataop_t *d, kvd__cache_t *k, uint32_t n,
                                void (*finish)(kvd__dataop_t *, kvd_status_t, Kvdock__OpReply *,
                                               uint64_t *))
{
    uint64_t held = sizeof(cacheop_t) + (uint64_t)(n ? n : 1) * (sizeof(uint32_t) + 1);
    cacheop_t *op;
    kvd_status_t st;

    if ((st = kvd__account_charge(r->conn, KVD_HM_REQUESTS, held, r->msg, sizeof(r->msg))) !=
        KVD_OK)
        return st;
    op = calloc(1, sizeof(*op));
    if (op == NULL || (op->ids = calloc(n ? n : 1, sizeof(*op->ids))) == NULL ||
        (op->is_new = calloc(n ? n : 1, 1)) == NULL) {
        if (op != NULL)
            free(op->ids);
        free(op);
        kvd__account_release(r->conn, KVD_HM_REQUESTS, held);
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    }
    op->conn = r->conn;
    op->held = held;
    op->cache = k;
    k->refs++;
    d->ext = op;
    d->finish = finish;
    return KVD_OK;
}

/* EBUSY, asking to wait on k's queue for need host slots (park.h): where
 * it may not wait, the client hears why. */
static kvd_status_t wait_for_slots(kvd__req_t *r, kvd__cache_t *k, uint32_t need,
                                   const char *why)
{
    r->park = &k->waiters;
    r->park_need = need;
    return kvd__req_fail(r, KVD_EBUSY, "cache '%s': %s", k->name, why);
}

/* Room for need new blocks before a request takes any (kvd__cache_prepare,
 * at most the host level): KVD_OK to go on; else the request's answer:
 * it waits on k's queue for the slab on its way, or hears why the slab it
 * waited for could not be made. */
static kvd_status_t prepare_slots(kvd__req_t *r, kvd__cache_t *k, uint32_t need)
{
    char why[200];
    kvd_status_t st;

    if (need > k->store.capacity)
        need = k->store.capacity;
    if ((st = kvd__cache_prepare(&k->store, need, why, sizeof(why))) == KVD_OK)
        return KVD_OK;
    if (st == KVD_EBUSY)
        return wait_for_slots(r, k, need, why);
    return kvd__req_fail(r, st, "cache '%s': %s", k->name, why);
}

/* ---- a save larger than the host level ------------------------------------------ */

/*
 * A save into a cache with a disk level that finds no host slot for its
 * next block, while disk writes in flight hold them, streams through the
 * host level: the blocks it has reserved are copied, written to disk at
 * once (still invisible: kvd__cache_write_early), and their host slots
 * let go as their records land; the save takes slots for its next blocks
 * as they free, waiting on the cache's queue at its head in between
 * (park.h: as a plan, no frame kept).  The last part is copied with the
 * reply, whose finish commits every block at once, the last first: a
 * lookup sees the whole save or none of it, and a chain's present blocks
 * stay a prefix over both levels.  A save that fails (its client gone,
 * its wait past --disk-wait-ms, a copy failed, the cache dropped, the
 * daemon stopping) aborts every block it made, records included.
 */
typedef struct save_stream {
    kvd__origin_t origin;       /* held: bytes of this plan */
    cacheop_t *op;              /* the blocks so far, in chain order (holds the cache) */
    kvd__pool_t *pool;
    kvd__dataop_sync_t sync;    /* each copy's: the pool, events */
    uint32_t first;             /* op->ids place of key 0 (1 after a parent) */
    uint32_t n;                 /* keys */
    uint32_t next;              /* keys [next, n) have no block in op yet */
    uint32_t copied;            /* op->ids[0, copied) are copied (or were there) */
    uint8_t *keys;              /* [n] of KVD_CACHE_KEY_MAX */
    uint8_t *klen;              /* [n] */
    int64_t *pages;             /* [n] the pool's page of each key */
    uint32_t writes;            /* blocks the last part handed to the writer */
    uint64_t deadline_ns;       /* of the wait under way (0: a new wait) */
    int waiting;                /* on the cache's queue (not counted in saving) */
    char why[200];              /* why the last slot was refused */
} save_stream_t;

static void stream_go(save_stream_t *s);

static void stream_free(save_stream_t *s)
{
    kvd__conn_t *conn = s->origin.conn;

    kvd__dataop_sync_release(&s->sync, &s->origin.srv->reg);
    kvd__account_release(conn, KVD_HM_REQUESTS, s->origin.held);
    free(s->keys);
    free(s->klen);
    free(s->pages);
    free(s);
    kvd__conn_op_end(conn);
}

/* The save fails: every block it made goes (records too), the client
 * hears st and msg (unless it is gone), the plan goes. */
static void stream_fail(save_stream_t *s, kvd_status_t st, const char *msg)
{
    Kvdock__OpReply rep = KVDOCK__OP_REPLY__INIT;
    uint64_t bytes = 0;

    if (s->waiting) { /* save_end counts it out of the saves in flight */
        s->waiting = 0;
        s->op->cache->saving++;
    }
    kvd_log(KVD_LOG_DEBUG, "event=cache_save_failed client=%" PRIu64 " id=%" PRIu64
            " status=%s reason=\"%s\"", s->origin.conn->id, s->origin.req_id, kvd_err_name(st),
            msg);
    save_end(s->op, st, &rep, &bytes);
    if (!s->origin.conn->closing)
        kvd__reply_deferred(&s->origin, st, msg, NULL, 0);
    stream_free(s);
}

/* The last copy ended: every block commits (or goes), the reply. */
static void stream_last_finish(kvd__dataop_t *d, kvd_status_t st, Kvdock__OpReply *rep,
                               uint64_t *bytes)
{
    save_stream_t *s = d->ext;

    if (s == NULL)
        return;
    d->ext = NULL;
    save_end(s->op, st, rep, bytes);
    stream_free(s);
}

/* A part's copy ended: its blocks go to disk now (their slots free as
 * their records land), and the save goes on. */
static void stream_copied(void *arg, kvd_status_t st)
{
    save_stream_t *s = arg;
    kvd__cache_store_t *c = &s->op->cache->store;
    char msg[240];

    if (st != KVD_OK) {
        snprintf(msg, sizeof(msg), "copying blocks from pool '%s' into cache '%s' failed: %s",
                 s->pool->name, s->op->cache->name, kvd_strerror(st));
        stream_fail(s, st, msg);
        return;
    }
    s->writes = 0;
    for (uint32_t i = s->copied; i < s->op->n; i++)
        if (s->op->is_new[i])
            s->writes += (uint32_t)kvd__cache_write_early(c, s->op->ids[i]);
    s->copied = s->op->n;
    kvd__cache_disk_flush(c);
    stream_go(s);
}

/* Copy the new blocks of op->ids[copied..) into the tier: a part on its
 * own (silent: stream_copied goes on), or the last, with the reply and
 * the request's record event.  A failure has submitted nothing. */
static kvd_status_t stream_copy(save_stream_t *s, int last, char *why, size_t why_len)
{
    kvd__cache_store_t *c = &s->op->cache->store;
    uint32_t *ids = malloc(((s->op->n - s->copied) ? s->op->n - s->copied : 1) * sizeof(*ids));
    int64_t *pages = malloc(((s->op->n - s->copied) ? s->op->n - s->copied : 1) *
                            sizeof(*pages));
    kvd__dataop_t *d = kvd__dataop_new(&s->origin);
    uint32_t m = 0, next = 0;
    kvd__slab_plan_t pl;
    kvd_status_t st = KVD_ENOMEM;

    memset(&pl, 0, sizeof(pl));
    snprintf(why, why_len, "out of memory");
    if (ids == NULL || pages == NULL || d == NULL)
        goto out;
    kvd__dataop_sync_apply(&s->sync, d);
    for (uint32_t i = s->copied; i < s->op->n; i++)
        if (s->op->is_new[i]) {
            ids[m] = s->op->ids[i];
            pages[m++] = s->pages[i - s->first];
        }
    if ((st = kvd__slab_plan(d, c, ids, pages, m, &pl, why, why_len)) != KVD_OK)
        goto out;
    if ((st = kvd__dataop_more(d, pl.nslabs ? pl.nslabs : 1)) != KVD_OK) {
        snprintf(why, why_len, "out of memory");
        goto out;
    }
    if (pl.nslabs == 0)
        kvd__empty_job(d, &d->job, s->pool, c->layout.tokens_per_block);
    else
        kvd__slab_jobs(d, s->pool, c, &pl, 1, 0, c->layout.num_layers, &next);
    d->rows = m;
    d->ext = s;
    if (last) {
        d->job.record_event = s->sync.record_event;
        d->reply_at_enqueue = s->sync.reply_at_enqueue;
        d->finish = stream_last_finish;
        d->rows = s->op->stored;
    } else {
        d->silent_done = stream_copied;
        d->silent_arg = s;
    }
    if ((st = kvd__dataop_submit(d, why, why_len)) == KVD_OK)
        d = NULL;
out:
    if (d != NULL) {
        d->ext = NULL;
        kvd__dataop_free(d);
    }
    kvd__slab_plan_free(&pl);
    free(ids);
    free(pages);
    return st;
}

static void stream_resume(void *arg)
{
    save_stream_t *s = arg;

    s->waiting = 0;
    s->op->cache->saving++;
    stream_go(s);
}

static void stream_expire(void *arg, const char *msg)
{
    stream_fail(arg, KVD_EBUSY, msg);
}

static void stream_drop(void *arg)
{
    stream_fail(arg, KVD_ECONN, "the client went");
}

static const kvd__park_ops_t stream_ops = {stream_resume, stream_expire, stream_drop};

/* Take blocks for the keys left while host slots are free; then copy
 * them (a part, or the last with the reply), or wait for slots to free. */
static void stream_go(save_stream_t *s)
{
    cacheop_t *op = s->op;
    kvd__cache_t *k = op->cache;
    kvd__cache_store_t *c = &k->store;
    kvd_status_t refusal = KVD_OK;
    char why[240], msg[320];
    uint32_t got = 0, need;

    if (s->origin.conn->closing) {
        stream_fail(s, KVD_ECONN, "the client went");
        return;
    }
    if (s->origin.srv->shutting_down) {
        stream_fail(s, KVD_ESHUTDOWN, "the daemon is shutting down");
        return;
    }
    if (k->dropped) {
        snprintf(msg, sizeof(msg), "cache '%s' was dropped", k->name);
        stream_fail(s, KVD_ENOENT, msg);
        return;
    }
    while (s->next < s->n) {
        const uint8_t *key = s->keys + (size_t)s->next * KVD_CACHE_KEY_MAX;
        uint32_t parent = op->n > 0 ? op->ids[op->n - 1] : KVD_CBLOCK_NONE;
        uint32_t id = kvd__cache_find(c, key, s->klen[s->next]);

        if (id != KVD_CBLOCK_NONE) { /* saved meanwhile by another */
            kvd__cache_hold(c, id);
            op->skipped++;
        } else if ((refusal = kvd__cache_reserve(c, parent, key, s->klen[s->next], &id,
                                                 s->why, sizeof(s->why))) == KVD_OK) {
            op->is_new[op->n] = 1;
            op->stored++;
            got++;
        } else if (refusal == KVD_EBUSY && (got > 0 || kvd__cache_slots_will_free(k, 1))) {
            break; /* the blocks it just took free theirs once copied and written */
        } else {
            op->refused = s->n - s->next;
            kvd_log(KVD_LOG_DEBUG, "event=cache_save_refused cache=%" PRIu64 " blocks=%u "
                    "reason=\"%s\"", k->id, op->refused, s->why);
            s->next = s->n;
            break;
        }
        op->ids[op->n++] = id;
        s->next++;
        s->deadline_ns = 0; /* it got on: a new wait from here */
    }
    if (s->next == s->n || got > 0) {
        kvd_status_t st = stream_copy(s, s->next == s->n, why, sizeof(why));
        if (st != KVD_OK) {
            snprintf(msg, sizeof(msg), "cache '%s': %s", k->name, why);
            stream_fail(s, st, msg);
        }
        return;
    }
    /* nothing free: wait at the head of the queue for the writes of its
     * last part (at least), or for a part of the host level */
    need = s->n - s->next;
    if (need > c->capacity / 4)
        need = c->capacity / 4 ? c->capacity / 4 : 1;
    if (s->writes > 0 && need > s->writes)
        need = s->writes;
    snprintf(msg, sizeof(msg), "cache '%s': %u of %u blocks stored, the rest waiting: %.180s",
             k->name, op->stored, s->n, s->why);
    k->saving--; /* a waiting save holds no slot that frees itself */
    s->waiting = 1;
    if (kvd__park_plan(&k->waiters, &s->origin, &stream_ops, s, &s->deadline_ns, need, msg) !=
        KVD_OK)
        stream_fail(s, KVD_EBUSY, msg);
}

/* The save of request r into pool p's pages goes on as a plan (op: its
 * blocks so far, those of the keys before key next; pages[n]: the keys'
 * pages): its blocks so far are copied, and the rest stream.  KVD_OK: r
 * is deferred, op the plan's; a failure: r's message set, nothing kept,
 * op still the caller's. */
static kvd_status_t stream_start(kvd__req_t *r, kvd__dataop_t *d, kvd__pool_t *p, cacheop_t *op,
                                 const keys_t *ks, uint32_t next, const int64_t *pages)
{
    uint64_t held = sizeof(save_stream_t) + (uint64_t)ks->n * (KVD_CACHE_KEY_MAX + 1 + 8);
    save_stream_t *s;
    char why[200];
    kvd_status_t st;

    if ((st = kvd__account_charge(r->conn, KVD_HM_REQUESTS, held, r->msg, sizeof(r->msg))) !=
        KVD_OK)
        return st;
    if ((s = calloc(1, sizeof(*s))) == NULL ||
        (s->keys = malloc((size_t)ks->n * KVD_CACHE_KEY_MAX)) == NULL ||
        (s->klen = malloc(ks->n)) == NULL || (s->pages = malloc(ks->n * sizeof(int64_t))) == NULL) {
        if (s != NULL) {
            free(s->keys);
            free(s->klen);
            free(s);
        }
        kvd__account_release(r->conn, KVD_HM_REQUESTS, held);
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    }
    s->origin = kvd__origin_of(r);
    s->origin.held = held;
    s->op = op;
    s->pool = p;
    kvd__dataop_sync_keep(&s->sync, d);
    s->first = op->n - next;
    s->n = ks->n;
    s->next = next;
    for (uint32_t i = 0; i < ks->n; i++) {
        memcpy(s->keys + (size_t)i * KVD_CACHE_KEY_MAX, ks->k[i], ks->len[i]);
        s->klen[i] = (uint8_t)ks->len[i];
    }
    memcpy(s->pages, pages, ks->n * sizeof(int64_t));
    kvd__conn_op_begin(r->conn);
    if ((st = stream_copy(s, 0, why, sizeof(why))) != KVD_OK) {
        stream_free(s);
        return kvd__req_fail(r, st, "cache '%s': %s", op->cache->name, why);
    }
    d->ext = NULL; /* the plan's now */
    d->finish = NULL;
    r->deferred = 1;
    return KVD_OK;
}

static kvd_status_t do_save(kvd__req_t *r, kvd__dataop_t *d)
{
    const Kvdock__CacheSave *cs = r->req->cache_save;
    kvd__cache_t *k = NULL;
    kvd__cache_store_t *c;
    kvd__pool_t *p;
    keys_t ks;
    int64_t *pages;
    uint32_t parent = KVD_CBLOCK_NONE, i;
    kvd_status_t refusal = KVD_OK;
    kvd__slab_plan_t plan;
    uint32_t *new_ids, nnew = 0;
    int64_t *new_pages;
    cacheop_t *op;
    char why[200];
    kvd_status_t st;

    if ((st = find_cache(r, cs->cache, NULL, 1, &k)) != KVD_OK ||
        (st = kvd__get_pool(r, d, cs->pool, "pool", &p)) != KVD_OK ||
        (st = check_pool(r, p, &k->store)) != KVD_OK ||
        (st = get_keys(r, cs->keys, 0, &ks)) != KVD_OK ||
        (st = no_duplicates(r, &k->store, &ks)) != KVD_OK ||
        (st = get_pages(r, d, cs->blocks, p, k->store.layout.tokens_per_block, ks.n, &pages)) !=
            KVD_OK)
        return st;
    c = &k->store;
    if (cs->parent.len > 0) {
        if (cs->parent.len > KVD_CACHE_KEY_MAX)
            return kvd__req_fail(r, KVD_EINVAL, "parent is %zu bytes: keys are 1 to %d",
                                 cs->parent.len, KVD_CACHE_KEY_MAX);
        parent = kvd__cache_find(c, cs->parent.data, cs->parent.len);
        if (parent == KVD_CBLOCK_NONE)
            return kvd__req_fail(r, KVD_ENOENT, "the parent key is not in the cache");
    }
    if ((st = kvd__get_sync(r, d, p->kind == KVD_MEM_HOST ? KVD_STREAM_D2D : KVD_STREAM_OFFLOAD,
                            1)) != KVD_OK ||
        (st = kvd__choose_path(r, d, p->kind, KVD_MEM_HOST, 0, 0)) != KVD_OK)
        return st;
    /* a save that reaches into slabs not made yet waits for them here,
     * before it takes a block, rather than at each slab it crosses */
    if (c->nfree < ks.n && c->nslabs < c->nslabs_max &&
        (k->waiters.head == NULL || r->replayed)) {
        uint32_t fresh = 0;

        for (i = 0; i < ks.n; i++)
            fresh += kvd__cache_find(c, ks.k[i], ks.len[i]) == KVD_CBLOCK_NONE;
        if ((st = prepare_slots(r, k, fresh)) != KVD_OK)
            return st;
    }
    if ((st = cacheop_new(r, d, k, ks.n + (parent != KVD_CBLOCK_NONE), save_finish)) != KVD_OK)
        return st;
    op = d->ext;
    k->saving++; /* until save_finish */
    /* every block of the chain, held until the save ends: present ones
     * (skipped), new ones (filling); the first refusal ends the chain */
    if (parent != KVD_CBLOCK_NONE) {
        op->ids[op->n++] = parent; /* held like a skipped block, counted as none */
        kvd__cache_hold(c, parent);
    }
    for (i = 0; i < ks.n; i++) {
        uint32_t id = kvd__cache_find(c, ks.k[i], ks.len[i]);

        if (id != KVD_CBLOCK_NONE) {
            kvd__cache_hold(c, id);
            op->skipped++;
        } else if (k->waiters.head != NULL && !r->replayed) {
            /* the slots freed next are theirs: it waits behind them */
            return wait_for_slots(r, k, ks.n - i < c->capacity ? ks.n - i : c->capacity,
                                  "saves sent before it wait for host slots");
        } else if ((refusal = kvd__cache_reserve(c, parent, ks.k[i], ks.len[i], &id, why,
                                                 sizeof(why))) == KVD_OK) {
            op->is_new[op->n] = 1;
            op->stored++;
        } else if (refusal == KVD_EBUSY && op->stored > 0 && c->disk != NULL) {
            /* With blocks taken, the save streams through the host level
             * from here (larger than it, or beside others): what it took
             * is copied, written and let go, and it takes the next slots
             * as they free */
            return stream_start(r, d, p, op, &ks, i, pages);
        } else if (refusal == KVD_EBUSY && kvd__cache_slots_will_free(k, 1)) {
            uint32_t need = ks.n - i;
            /* the disk writer is behind: it runs again, whole, once the
             * writes have freed as many slots (a part of the host level:
             * it streams then) */
            return wait_for_slots(r, k, need < c->capacity ? need : c->capacity, why);
        } else {
            op->refused = ks.n - i;
            kvd_log(KVD_LOG_DEBUG, "event=cache_save_refused cache=%" PRIu64 " blocks=%u "
                    "reason=\"%s\"", k->id, op->refused, why);
            break;
        }
        op->ids[op->n++] = id;
        parent = id;
    }
    if (op->refused > 0 && op->stored == 0)
        return kvd__req_fail(r, refusal, "cache '%s' stored nothing: %s", k->name, why);
    /* page indices line up with op->ids, which may start with the parent */
    if (cs->parent.len > 0) {
        int64_t *shifted = kvd__stage(r, d, NULL, (ks.n + 1) * sizeof(int64_t));
        if (shifted == NULL)
            return d->stage_status;
        shifted[0] = -1; /* the parent moves nothing */
        memcpy(shifted + 1, pages, ks.n * sizeof(int64_t));
        pages = shifted;
    }
    /* the new blocks move, in chain order */
    if ((new_ids = kvd__req_alloc(r, (op->n ? op->n : 1) * sizeof(*new_ids))) == NULL ||
        (new_pages = kvd__req_alloc(r, (op->n ? op->n : 1) * sizeof(*new_pages))) == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    for (i = 0; i < op->n; i++)
        if (op->is_new[i]) {
            new_ids[nnew] = op->ids[i];
            new_pages[nnew++] = pages[i];
        }
    if ((st = kvd__slab_plan(d, c, new_ids, new_pages, nnew, &plan, r->msg, sizeof(r->msg))) !=
        KVD_OK)
        return st;
    if ((st = kvd__dataop_jobs(r, d, plan.nslabs ? plan.nslabs : 1)) == KVD_OK) {
        if (plan.nslabs == 0) {
            kvd__empty_job(d, &d->job, p, c->layout.tokens_per_block);
        } else {
            uint32_t next = 0;
            kvd__slab_jobs(d, p, c, &plan, 1, 0, c->layout.num_layers, &next);
        }
        d->rows = op->stored;
        st = kvd__submit(r, d);
    }
    kvd__slab_plan_free(&plan);
    return st;
}

/* A load's plan hears from the cluster (cluster.h) as blocks land. */
static void load_landed(void *arg, const uint32_t *pos, uint32_t count)
{
    kvd__load_land(arg, pos, count);
}

static void load_pulled(void *arg, const uint8_t *present, const char *why,
                        const char *waited_for)
{
    (void)present;
    (void)waited_for; /* why names it */
    kvd__load_end(arg, why);
}

static kvd_status_t do_load(kvd__req_t *r, kvd__dataop_t *d)
{
    const Kvdock__CacheLoad *cl = r->req->cache_load;
    kvd__cache_t *k = NULL;
    kvd__cache_store_t *c;
    kvd__pool_t *p;
    keys_t ks;
    kvd__lease_t *lease = NULL;
    int64_t *pages;
    uint32_t n, i, nflags = 0, *flags = NULL, disk_only;
    void *levs[MAX_LAYER_EVENTS];
    kvd__load_spec_t spec;
    kvd__load_t *plan;
    kvd_status_t st;

    if ((st = find_cache(r, cl->cache, NULL, 1, &k)) != KVD_OK ||
        (st = kvd__get_pool(r, d, cl->pool, "pool", &p)) != KVD_OK ||
        (st = check_pool(r, p, &k->store)) != KVD_OK ||
        (st = get_keys(r, cl->keys, cl->lease != 0, &ks)) != KVD_OK)
        return st;
    c = &k->store;
    if (cl->lease != 0) {
        if (ks.n > 0)
            return kvd__req_fail(r, KVD_EINVAL, "keys and a lease are exclusive");
        for (lease = r->conn->leases; lease; lease = lease->next)
            if (lease->id == cl->lease)
                break;
        if (lease == NULL || lease->cache != k)
            return kvd__req_fail(r, KVD_ENOENT, "no lease %" PRIu64 " of this client on cache "
                                 "'%s'", cl->lease, k->name);
        n = cl->blocks ? (uint32_t)(cl->blocks->n_values ? cl->blocks->n_values
                                                         : cl->blocks->raw.len /
                                                               (cl->blocks->dtype ==
                                                                        KVDOCK__DTYPE__I32
                                                                    ? 4
                                                                    : 8))
                       : 0;
        if (n > lease->n)
            return kvd__req_fail(r, KVD_ESHAPE, "%u blocks for a lease of %u", n, lease->n);
    } else {
        if ((st = no_duplicates(r, &k->store, &ks)) != KVD_OK)
            return st;
        n = ks.n;
    }
    if (n == 0)
        return kvd__req_fail(r, KVD_EINVAL, "blocks: name at least one page to load into");
    if ((st = get_pages(r, d, cl->blocks, p, c->layout.tokens_per_block, n, &pages)) != KVD_OK)
        return st;
    if (cl->n_layer_events > MAX_LAYER_EVENTS || cl->n_layer_events > c->layout.num_layers)
        return kvd__req_fail(r, KVD_EINVAL, "%zu layer events for %u layers (at most %d)",
                             cl->n_layer_events, c->layout.num_layers, MAX_LAYER_EVENTS);
    for (i = 0; i < cl->n_layer_events; i++)
        if ((st = kvd__get_event(r, d, cl->layer_events[i], "layer_events", &levs[i])) != KVD_OK)
            return st;
    if (cl->layer_flags != NULL) {
        uint64_t fb = cl->layer_flags->bytes;
        void *ptr;

        if (fb == 0 || fb % sizeof(uint32_t) != 0)
            return kvd__req_fail(r, KVD_EINVAL, "layer_flags: %" PRIu64 " bytes: give 4 per "
                                 "layer group", fb);
        nflags = (uint32_t)(fb / sizeof(uint32_t));
        if (nflags > MAX_LAYER_EVENTS || nflags > c->layout.num_layers)
            return kvd__req_fail(r, KVD_EINVAL, "layer_flags: %u groups for %u layers (at "
                                 "most %d)", nflags, c->layout.num_layers, MAX_LAYER_EVENTS);
        if (cl->n_layer_events != 0 && cl->n_layer_events != nflags)
            return kvd__req_fail(r, KVD_ESHAPE, "%zu layer events and %u layer flags: one of "
                                 "each per group", cl->n_layer_events, nflags);
        if (cl->flag_value == 0)
            return kvd__req_fail(r, KVD_EINVAL, "flag_value must not be 0 (a flag's value "
                                 "before it is written)");
        if ((st = kvd__get_bufref(r, d, cl->layer_flags, fb, sizeof(uint32_t), "layer_flags",
                                  &ptr, NULL)) != KVD_OK)
            return st;
        flags = ptr;
    }
    if ((st = kvd__get_sync(r, d, p->kind == KVD_MEM_HOST ? KVD_STREAM_D2D : KVD_STREAM_RELOAD,
                            1)) != KVD_OK ||
        (st = kvd__choose_path(r, d, KVD_MEM_HOST, p->kind, 0, 0)) != KVD_OK)
        return st;
    /* validated: the plan keeps what was decided */
    memset(&spec, 0, sizeof(spec));
    spec.cache = k;
    spec.pool = p;
    spec.n = n;
    spec.pages = pages;
    spec.keys = lease ? NULL : ks.k;
    spec.lens = ks.len;
    spec.lease = lease;
    spec.levs = levs;
    spec.nevents = (uint32_t)cl->n_layer_events;
    spec.flags = flags;
    spec.nflags = nflags;
    spec.flag_value = cl->flag_value;
    if ((st = kvd__load_create(r, d, &spec, &plan)) != KVD_OK)
        return st;
    /* blocks on disk only are read into host memory first; the peers
     * are not asked for the others meanwhile.  Reads take host slots: a
     * load waits behind the requests waiting for them, and waits itself
     * where no read could start while disk writes in flight hold them */
    if (c->disk != NULL && (disk_only = kvd__load_disk_only(plan)) > 0) {
        /* more than the host level holds are read through it a part at a
         * time: it waits for no more slots than that */
        if (disk_only > c->capacity)
            disk_only = c->capacity;
        if (k->waiters.head != NULL && !r->replayed) {
            kvd__load_destroy(&plan);
            return wait_for_slots(r, k, disk_only, "saves and loads sent before it wait for "
                                  "host slots");
        }
        if ((st = prepare_slots(r, k, disk_only)) != KVD_OK) { /* reads take host slots */
            kvd__load_destroy(&plan);
            return st;
        }
        if (kvd__load_fetch(plan) > 0) {
            r->deferred = 1;
            return KVD_OK;
        }
        if (kvd__load_busy(plan) && kvd__cache_slots_will_free(k, 0)) {
            kvd__load_destroy(&plan);
            return wait_for_slots(r, k, disk_only, "every host slot is held, most by the disk "
                                  "writes in flight");
        }
    }
    /* a cluster cache lacking blocks (or pulling them for another load)
     * has the peers bring them: the plan copies them as they land */
    if (lease == NULL && k->cluster && kvd__load_missing(plan) > 0 &&
        kvd__cluster_live(r->srv->cluster)) {
        kvd__cluster_ask_t ask;
        uint32_t missing = kvd__load_missing(plan);
        char why[200];

        /* pulls take host slots and cannot wait in the middle: the load
         * waits first for the slabs they need */
        if ((st = prepare_slots(r, k, missing)) != KVD_OK) {
            kvd__load_destroy(&plan);
            return st;
        }
        memset(&ask, 0, sizeof(ask));
        ask.cache = k;
        ask.keys = ks.k;
        ask.lens = ks.len;
        ask.n = n;
        ask.pull = 1;
        ask.landed = load_landed;
        ask.done = load_pulled;
        ask.arg = plan;
        st = kvd__cluster_ask(r->srv->cluster, &ask, why, sizeof(why));
        if (st == KVD_OK) {
            kvd__load_wait(plan);
            r->deferred = 1;
            return KVD_OK;
        }
        if (st != KVD_ENOENT) {
            kvd__load_destroy(&plan);
            return kvd__req_fail(r, st, "%s", why);
        }
        return kvd__load_run(r, plan, why); /* nobody to ask: what is here, or why not */
    }
    return kvd__load_run(r, plan, NULL);
}

kvd_status_t kvd__op_cache_save(kvd__req_t *r)
{
    return kvd__dataop_run(r, do_save);
}

kvd_status_t kvd__op_cache_load(kvd__req_t *r)
{
    return kvd__dataop_run(r, do_load);
}
