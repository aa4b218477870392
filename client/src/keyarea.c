/*
 * The key area: memory the daemon shares with this connection (a sealed
 * memfd, asked for with cache_key_area the first time a long chain is
 * sent) into which a chain of keys is written and named by offset and
 * count instead of crossing the socket.  Chains of more than
 * KVD__AREA_MIN_KEYS keys of one width use it; shorter ones, chains of
 * mixed widths, and chains that do not fit the room left go in the frame.
 *
 * The area is a bump allocator: a request takes the bytes after the last
 * one taken, and gives them back when its reply has come (the daemon reads
 * a chain only while handling the request that names it); once no request
 * holds any, the next starts from the beginning again.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "parse.h"

/* Chains of at most this many keys always go in the frame: for them the
 * frame's copy costs less than the area's bookkeeping. */
#define KVD__AREA_MIN_KEYS 16
#define KVD__AREA_DEFAULT (1u << 20)
#define KVD__AREA_MIN (4u << 10) /* the daemon's bounds */
#define KVD__AREA_MAX (4u << 20)

enum { AREA_UNASKED = 0, AREA_ASKING, AREA_READY, AREA_NONE };

void kvd__key_area_init(kvd_client_t *c)
{
    const char *e = getenv("KVDOCK_KEY_AREA");
    uint64_t v;

    c->area_want = KVD__AREA_DEFAULT;
    if (e != NULL && *e != '\0' && kvd__parse_size(e, &v) == KVD_OK)
        c->area_want = v == 0 ? 0 : v < KVD__AREA_MIN ? KVD__AREA_MIN
                     : v > KVD__AREA_MAX ? KVD__AREA_MAX : v;
    c->area_state = c->area_want == 0 ? AREA_NONE : AREA_UNASKED;
}

void kvd__key_area_teardown(kvd_client_t *c)
{
    if (c->area != NULL)
        munmap(c->area, c->area_bytes);
    c->area = NULL;
    c->area_bytes = 0;
}

static kvd_status_t area_finish(kvd_client_t *cli, kvd__pending_t *p)
{
    const Kvdock__CacheKeyAreaReply *r =
        p->resp->result_case == KVDOCK__RESPONSE__RESULT_CACHE_KEY_AREA ? p->resp->cache_key_area
                                                                        : NULL;
    struct stat st;
    int fd = kvd__take_fd(p, 0);
    void *m;

    if (r == NULL || fd < 0 || r->bytes == 0 || r->bytes > KVD__AREA_MAX ||
        fstat(fd, &st) != 0 || (uint64_t)st.st_size < r->bytes) {
        if (fd >= 0)
            close(fd);
        return kvd__client_fail(cli, KVD_EPROTO, "kvdockd answered cache_key_area without "
                                "an area of the size it named");
    }
    m = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return kvd__client_fail(cli, KVD_ENOMEM, "mapping the key area: %s", strerror(errno));
    *p->out.area.base = m;
    *p->out.area.bytes = r->bytes;
    return KVD_OK;
}

/* Whether c has an area, asking for one the first time (a blocking call:
 * a daemon that refuses, or predates areas, leaves chains in the frame). */
static bool area_ready(kvd_client_t *c)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__CacheKeyArea m = KVDOCK__CACHE_KEY_AREA__INIT;
    kvd__out_t o;
    uint8_t *base = NULL;
    uint64_t bytes = 0;
    kvd_status_t st;
    int state;

    pthread_mutex_lock(&c->mu);
    state = c->area_state;
    if (state == AREA_UNASKED)
        c->area_state = AREA_ASKING;
    pthread_mutex_unlock(&c->mu);
    if (state != AREA_UNASKED)
        return state == AREA_READY;
    m.bytes = c->area_want;
    memset(&o, 0, sizeof(o));
    o.area.base = &base;
    o.area.bytes = &bytes;
    req.op_case = KVDOCK__REQUEST__OP_CACHE_KEY_AREA;
    req.cache_key_area = &m;
    st = kvd__call(c, &req, NULL, 0, area_finish, &o, NULL);
    pthread_mutex_lock(&c->mu);
    if (st == KVD_OK) {
        c->area = base;
        c->area_bytes = bytes;
    }
    c->area_state = st == KVD_OK ? AREA_READY : AREA_NONE;
    pthread_mutex_unlock(&c->mu);
    return st == KVD_OK;
}

bool kvd__key_area_take(kvd_client_t *c, const kvd_cache_keys_t *in, Kvdock__CacheKeys *m,
                        Kvdock__KeyAreaRef *ref)
{
    size_t width, bytes;
    uint64_t off;
    uint8_t *dst;

    if (in->count <= KVD__AREA_MIN_KEYS || in->count > KVD_CACHE_KEYS_MAX)
        return false;
    if (in->keys == NULL) {
        width = in->key_size;
    } else {
        width = in->lens[0];
        for (uint32_t i = 0; i < in->count; i++)
            if (in->lens[i] != width || in->keys[i] == NULL)
                return false;
    }
    if (width < 1 || width > KVD_CACHE_KEY_MAX || !area_ready(c))
        return false;
    bytes = (size_t)in->count * width;
    pthread_mutex_lock(&c->mu);
    if (c->dead || bytes > c->area_bytes - c->area_top) {
        pthread_mutex_unlock(&c->mu);
        return false;
    }
    off = c->area_top;
    c->area_top += bytes;
    c->area_users++;
    pthread_mutex_unlock(&c->mu);
    dst = c->area + off;
    if (in->keys == NULL) {
        memcpy(dst, in->blob, bytes);
    } else {
        for (uint32_t i = 0; i < in->count; i++)
            memcpy(dst + (size_t)i * width, in->keys[i], width);
    }
    kvdock__key_area_ref__init(ref);
    ref->offset = off;
    ref->count = in->count;
    m->area = ref;
    m->key_size = (uint32_t)width;
    return true;
}

void kvd__key_area_put(kvd_client_t *c)
{
    if (c->area_users > 0 && --c->area_users == 0)
        c->area_top = 0;
}

bool kvd__key_area_named(const Kvdock__Request *req)
{
    const Kvdock__CacheKeys *k = NULL;

    switch (req->op_case) {
    case KVDOCK__REQUEST__OP_CACHE_LOOKUP:
        k = req->cache_lookup->keys;
        break;
    case KVDOCK__REQUEST__OP_CACHE_SAVE:
        k = req->cache_save->keys;
        break;
    case KVDOCK__REQUEST__OP_CACHE_LOAD:
        k = req->cache_load->keys;
        break;
    case KVDOCK__REQUEST__OP_CACHE_EVICT:
        k = req->cache_evict->keys;
        break;
    default:
        break;
    }
    return k != NULL && k->area != NULL;
}
