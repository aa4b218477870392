/* A connection's key area (keyarea.h) and the cache_key_area operation. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "account.h"
#include "backend.h"
#include "cache.h"
#include "conn.h"
#include "hostmem.h"
#include "keyarea.h"
#include "log.h"

/* Why ck's area reference does not name whole keys inside c's area (why
 * may hold the words), or NULL when it does. */
static const char *bad_ref(const kvd__conn_t *c, const Kvdock__CacheKeys *ck, char *why,
                           size_t len)
{
    const Kvdock__KeyAreaRef *a = ck->area;
    uint64_t span;

    if (c->karea == NULL)
        return "this connection has no key area (ask for one with cache_key_area)";
    if (ck->n_keys > 0 || ck->blob.len > 0)
        return "an area reference excludes keys and a blob";
    if (ck->key_size < 1 || ck->key_size > KVD_CACHE_KEY_MAX) {
        snprintf(why, len, "key_size %u: keys are 1 to %d bytes", ck->key_size,
                 KVD_CACHE_KEY_MAX);
        return why;
    }
    if (a->count == 0)
        return "count is 0: the chain is empty";
    span = (uint64_t)a->count * ck->key_size; /* < 2^39: no overflow */
    if (a->offset > c->karea_bytes || span > c->karea_bytes - a->offset) {
        snprintf(why, len, "%u keys of %u bytes from offset %" PRIu64 " pass the area's end "
                 "(%" PRIu64 " bytes)", a->count, ck->key_size, a->offset, c->karea_bytes);
        return why;
    }
    return NULL;
}

kvd_status_t kvd__key_area_read(kvd__req_t *r, const Kvdock__CacheKeys *ck,
                                const uint8_t **blob, size_t *count)
{
    char why[160];
    const char *bad = bad_ref(r->conn, ck, why, sizeof(why));
    size_t bytes;
    uint8_t *copy;

    if (bad != NULL)
        return kvd__req_fail(r, KVD_EINVAL, "keys.area: %s", bad);
    bytes = (size_t)ck->area->count * ck->key_size; /* at most the area's size */
    if ((copy = kvd__req_alloc(r, bytes)) == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    memcpy(copy, r->conn->karea + ck->area->offset, bytes);
    *blob = copy;
    *count = ck->area->count;
    return KVD_OK;
}

kvd_status_t kvd__key_area_view(kvd__req_t *r, const Kvdock__CacheKeys *ck,
                                const uint8_t **keys, size_t *count)
{
    char why[160];
    const char *bad = bad_ref(r->conn, ck, why, sizeof(why));

    if (bad != NULL)
        return kvd__req_fail(r, KVD_EINVAL, "keys.area: %s", bad);
    *keys = r->conn->karea + ck->area->offset;
    *count = ck->area->count;
    return KVD_OK;
}

int kvd__key_area_first(const kvd__conn_t *c, const Kvdock__CacheKeys *ck, uint8_t *key,
                        size_t *count)
{
    char why[160];

    if (bad_ref(c, ck, why, sizeof(why)) != NULL)
        return 0;
    memcpy(key, c->karea + ck->area->offset, ck->key_size);
    *count = ck->area->count;
    return 1;
}

void kvd__key_area_drop(kvd__conn_t *c)
{
    if (c->karea == NULL)
        return;
    munmap((void *)c->karea, c->karea_bytes);
    close(c->karea_fd);
    kvd__account_release(c, KVD_HM_SOCKETS, c->karea_bytes);
    c->srv->karea_bytes -= c->karea_bytes;
    c->karea = NULL;
    c->karea_bytes = 0;
    c->karea_fd = -1;
}

/* The most bytes (whole pages) an area for c may take now, by the rules of
 * KVD_KEY_AREA_SHARE; when less than KVD_KEY_AREA_MIN, why says which rule
 * holds it back. */
static uint64_t area_room(const kvd__conn_t *c, uint64_t page, char *why, size_t len)
{
    const kvd__server_t *srv = c->srv;
    uint64_t share = srv->hostmem.cap[KVD_HM_SOCKETS] / KVD_KEY_AREA_SHARE;
    uint64_t shared = share > srv->karea_bytes ? share - srv->karea_bytes : 0;
    uint64_t lim = srv->opts.max_client_memory;
    uint64_t own = (lim > c->held ? lim - c->held : 0) / 2;
    uint64_t room = (shared < own ? shared : own) / page * page;
    char a[32], b[32], d[32];

    if (room >= KVD_KEY_AREA_MIN)
        return room;
    if (shared < own)
        snprintf(why, len, "the key areas of all clients may take %s (a quarter of the socket "
                 "memory, max-socket-buffer-bytes), %s of it is taken",
                 kvd__fmt_bytes(share, a, sizeof(a)),
                 kvd__fmt_bytes(srv->karea_bytes, b, sizeof(b)));
    else
        snprintf(why, len, "an area may take half of what this client may still hold: %s of "
                 "its limit of %s is taken (max-client-memory)",
                 kvd__fmt_bytes(c->held, a, sizeof(a)), kvd__fmt_bytes(lim, d, sizeof(d)));
    return room;
}

static void area_unsent(kvd__req_t *r)
{
    kvd__key_area_drop(r->conn);
}

kvd_status_t kvd__op_cache_key_area(kvd__req_t *r)
{
    const Kvdock__CacheKeyArea *m = r->req->cache_key_area;
    kvd__conn_t *c = r->conn;
    Kvdock__CacheKeyAreaReply *rep;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), want, room, map_bytes;
    void *p;
    int fd;
    char why[240];
    kvd_status_t st;

    if (c->karea != NULL)
        return kvd__req_fail(r, KVD_EEXIST, "this connection has a key area of %" PRIu64
                             " bytes already", c->karea_bytes);
    want = m->bytes != 0 ? m->bytes : KVD_KEY_AREA_DEFAULT;
    if (want < KVD_KEY_AREA_MIN || want > KVD_KEY_AREA_MAX)
        return kvd__req_fail(r, KVD_EINVAL, "bytes %" PRIu64 ": a key area is %u to %u bytes",
                             m->bytes, KVD_KEY_AREA_MIN, KVD_KEY_AREA_MAX);
    want = (want + page - 1) / page * page;
    room = area_room(c, page, why, sizeof(why));
    if (room < KVD_KEY_AREA_MIN) {
        c->srv->hostmem.refused[KVD_HM_SOCKETS]++; /* kvdock status counts it */
        return kvd__req_fail(r, KVD_ELIMIT, "key area: no room for one: %s", why);
    }
    if (want > room)
        want = room; /* smaller than asked: the reply names the size */
    if ((rep = kvd__req_alloc(r, sizeof(*rep))) == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    if ((st = kvd__account_charge(c, KVD_HM_SOCKETS, want, why, sizeof(why))) != KVD_OK)
        return kvd__req_fail(r, st, "key area: %s", why);
    st = kvd__memfd_create("keys", want, &fd, &p, &map_bytes, why, sizeof(why));
    if (st != KVD_OK) {
        kvd__account_release(c, KVD_HM_SOCKETS, want);
        return kvd__req_fail(r, st, "key area: %s", why);
    }
    c->karea = p;
    c->karea_bytes = want; /* == map_bytes: want is whole pages */
    c->karea_fd = fd;
    c->srv->karea_bytes += want;
    kvdock__cache_key_area_reply__init(rep);
    rep->bytes = want;
    r->reply_fds[0] = fd;
    r->n_reply_fds = 1;
    r->unsent = area_unsent; /* a client that never got it may ask again */
    r->resp.result_case = KVDOCK__RESPONSE__RESULT_CACHE_KEY_AREA;
    r->resp.cache_key_area = rep;
    kvd_log(KVD_LOG_DEBUG, "event=key_area client=%" PRIu64 " bytes=%" PRIu64 " asked=%" PRIu64,
            c->id, want, m->bytes);
    return KVD_OK;
}
