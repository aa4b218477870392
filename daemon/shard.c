/* Shards and the I/O threads: see shard.h. */
#include "shard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "conn.h"
#include "log.h"

#define EVENTS_PER_WAIT 64

__thread kvd__shard_t *kvd__shard_self;

static kvd__shard_t *self(kvd__server_t *srv)
{
    return kvd__shard_self != NULL ? kvd__shard_self : &srv->shards[0];
}

/* Wake s from its epoll_wait; not needed for the calling thread's own. */
static void wake(kvd__shard_t *s)
{
    uint64_t one = 1;

    if (!s->threaded || !s->asleep || s == kvd__shard_self)
        return;
    s->asleep = 0; /* one write is enough */
    while (write(s->wake_fd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
}

int kvd__shard_may_read_unlocked(const kvd__conn_t *c)
{
    return c->shard->threaded && c->shard == kvd__shard_self;
}

int kvd__shard_may_write_unlocked(const kvd__conn_t *c)
{
    return c->shard->threaded &&
           (c->shard == kvd__shard_self ||
            (kvd__shard_self != NULL && kvd__shard_self->outside_loop));
}

/* Shard 0: the loop's poll handle says the socket is ready. */
static void on_uv_poll(uv_poll_t *h, int status, int events)
{
    kvd__conn_t *c = h->data;

    if (status < 0) {
        kvd__conn_close(c, uv_strerror(status));
        return;
    }
    kvd__conn_event(c, ((events & UV_READABLE) ? EPOLLIN : 0u) |
                           ((events & UV_WRITABLE) ? EPOLLOUT : 0u));
}

void kvd__shard_watch(kvd__conn_t *c, uint32_t events)
{
    struct epoll_event e;

    if (!c->shard->threaded) {
        if (events == 0)
            uv_poll_stop(&c->poll);
        else
            uv_poll_start(&c->poll, ((events & EPOLLIN) ? UV_READABLE : 0) |
                                        ((events & EPOLLOUT) ? UV_WRITABLE : 0),
                          on_uv_poll);
        c->watched = events != 0;
        return;
    }
    memset(&e, 0, sizeof(e));
    e.events = events;
    e.data.ptr = c;
    /* none: out of the set, or a hung-up peer would be reported forever */
    if (events == 0) {
        if (c->watched)
            (void)epoll_ctl(c->shard->epfd, EPOLL_CTL_DEL, c->fd, &e);
        c->watched = 0;
        return;
    }
    if (epoll_ctl(c->shard->epfd, c->watched ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &e) != 0)
        kvd_log(KVD_LOG_ERROR, "event=epoll_ctl_failed client=%" PRIu64 " error=\"%s\"", c->id,
                strerror(errno));
    c->watched = 1;
}

void kvd__shard_kick(kvd__conn_t *c)
{
    kvd__shard_t *s = c->shard;

    if (c->in_ready || c->srv->shutting_down == 2)
        return;
    c->in_ready = 1;
    c->ready_next = s->ready;
    s->ready = c;
    if (s->threaded)
        wake(s);
    else
        kvd__server_want_idle(c->srv);
}

void kvd__shard_want_flush(kvd__conn_t *c)
{
    kvd__shard_t *s = self(c->srv);

    if (c->flush_queued || c->srv->shutting_down == 2)
        return;
    c->flush_queued = 1;
    c->flush_next = s->to_flush;
    s->to_flush = c;
    /* with I/O threads the loop's thread writes once libuv's loop has run
     * (server.c, run_locked): outside it, it may let go of the lock */
    if (!s->threaded && c->srv->nio == 0)
        kvd__server_flush_soon(c->srv);
}

/* Take c off shard 0's lists (the loop's thread's, the only ones without
 * I/O threads). */
static void unlist(kvd__shard_t *s, kvd__conn_t *c)
{
    kvd__conn_t **pp;

    if (c->in_ready) {
        for (pp = &s->ready; *pp; pp = &(*pp)->ready_next) {
            if (*pp == c) {
                *pp = c->ready_next;
                break;
            }
        }
    }
    if (c->flush_queued) {
        for (pp = &s->to_flush; *pp; pp = &(*pp)->flush_next) {
            if (*pp == c) {
                *pp = c->flush_next;
                break;
            }
        }
    }
}

static void free_conn(kvd__conn_t *c)
{
    c->shard->nconns--;
    kvd__server_conn_gone(c->srv, c);
    close(c->fd);
    free(c);
}

static void uv_closed_cb(uv_handle_t *h)
{
    kvd__conn_t *c = h->data;

    unlist(c->shard, c);
    free_conn(c);
}

void kvd__shard_bury(kvd__conn_t *c)
{
    kvd__shard_t *s = c->shard;

    if (!s->threaded) { /* freed in the loop's closing phase */
        uv_close((uv_handle_t *)&c->poll, uv_closed_cb);
        return;
    }
    c->grave_next = s->grave;
    s->grave = c;
    wake(s);
}

/* Free the I/O thread's closed connections that nothing holds now. */
static void bury_dead(kvd__shard_t *s)
{
    kvd__conn_t **pp = &s->grave;

    while (*pp != NULL) {
        kvd__conn_t *c = *pp;

        /* on a list of some thread (which pops it before it lets go of
         * the lock for long) or in a system call of its own shard */
        if (c->flush_queued || c->in_ready || c->reading || c->writing) {
            pp = &c->grave_next;
            continue;
        }
        *pp = c->grave_next;
        free_conn(c);
    }
}

void kvd__shard_flush_all(kvd__shard_t *s)
{
    while (s->to_flush != NULL) {
        kvd__conn_t *c = s->to_flush;

        s->to_flush = c->flush_next;
        c->flush_next = NULL;
        c->flush_queued = 0;
        kvd__conn_flush(c);
        /* a connection of another I/O thread waiting to be freed was
         * held back by this list */
        if (c->handle_closing && c->shard != s)
            wake(c->shard);
    }
}

void kvd__shard_run_ready(kvd__shard_t *s)
{
    kvd__conn_t *list = s->ready;

    s->ready = NULL;
    while (list) {
        kvd__conn_t *c = list;
        list = c->ready_next;
        c->ready_next = NULL;
        c->in_ready = 0;
        kvd__conn_process(c);
    }
}

/* Socket events of shard s's connections, as epoll reported them. */
static void handle_events(kvd__shard_t *s, const struct epoll_event *ev, int n)
{
    int i;

    for (i = 0; i < n; i++) {
        if (ev[i].data.ptr == NULL) { /* the wake-up descriptor */
            uint64_t v;
            (void)!read(s->wake_fd, &v, sizeof(v));
            continue;
        }
        kvd__conn_event(ev[i].data.ptr, ev[i].events);
    }
}

static void *io_main(void *arg)
{
    kvd__shard_t *s = arg;
    kvd__server_t *srv = s->srv;
    struct epoll_event ev[EVENTS_PER_WAIT];
    char name[16];

    kvd__shard_self = s;
    snprintf(name, sizeof(name), "kvd-io-%u", s->index);
    (void)pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&srv->mu);
    /* under the lock: a daemon stopped before this thread ran has no
     * backend left */
    if (srv->backend != NULL && srv->backend->bind_thread != NULL)
        srv->backend->bind_thread(srv->backend);
    for (;;) {
        int n, busy;

        kvd__shard_run_ready(s);
        kvd__shard_flush_all(s);
        bury_dead(s);
        if (s->stop)
            break;
        /* frames still buffered (past --reqs-per-event): the others'
         * events are taken first, without waiting */
        busy = s->ready != NULL || s->to_flush != NULL;
        s->asleep = !busy;
        kvd__server_let_go(srv);
        n = epoll_wait(s->epfd, ev, EVENTS_PER_WAIT, busy ? 0 : -1);
        pthread_mutex_lock(&srv->mu);
        s->asleep = 0;
        if (n > 0)
            handle_events(s, ev, n);
    }
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

kvd_status_t kvd__shards_init(kvd__server_t *srv, char *why, size_t why_len)
{
    unsigned n = 1 + srv->nio, i;

    srv->shards = calloc(n, sizeof(*srv->shards));
    if (srv->shards == NULL) {
        snprintf(why, why_len, "out of memory for the I/O threads");
        return KVD_ENOMEM;
    }
    for (i = 0; i < n; i++)
        srv->shards[i].epfd = srv->shards[i].wake_fd = -1;
    for (i = 0; i < n; i++) {
        kvd__shard_t *s = &srv->shards[i];

        s->srv = srv;
        s->index = i;
        s->threaded = i > 0;
        if (s->threaded) {
            struct epoll_event e;

            s->epfd = epoll_create1(EPOLL_CLOEXEC);
            if (s->epfd < 0)
                goto fail;
            memset(&e, 0, sizeof(e));
            e.events = EPOLLIN;
            e.data.ptr = NULL;
            s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
            if (s->wake_fd < 0 || epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->wake_fd, &e) != 0)
                goto fail;
        }
    }
    return KVD_OK;

fail:
    snprintf(why, why_len, "cannot make the connections' epoll sets: %s", strerror(errno));
    kvd__shards_deinit(srv);
    return KVD_EIO;
}

kvd_status_t kvd__shards_start(kvd__server_t *srv, char *why, size_t why_len)
{
    unsigned i;

    for (i = 1; i <= srv->nio; i++) {
        kvd__shard_t *s = &srv->shards[i];
        int e = pthread_create(&s->thread, NULL, io_main, s);

        if (e != 0) {
            snprintf(why, why_len, "cannot start I/O thread %u of %u: %s", i, srv->nio,
                     strerror(e));
            kvd__shards_stop(srv);
            return KVD_EIO;
        }
        s->thread_started = 1;
    }
    return KVD_OK;
}

void kvd__shards_stop(kvd__server_t *srv)
{
    unsigned i;

    for (i = 1; srv->shards != NULL && i <= srv->nio; i++) {
        kvd__shard_t *s = &srv->shards[i];
        uint64_t one = 1;

        if (!s->thread_started)
            continue;
        pthread_mutex_lock(&srv->mu);
        s->stop = 1;
        pthread_mutex_unlock(&srv->mu);
        while (write(s->wake_fd, &one, sizeof(one)) < 0 && errno == EINTR)
            ;
        pthread_join(s->thread, NULL);
        s->thread_started = 0;
    }
}

void kvd__shards_deinit(kvd__server_t *srv)
{
    unsigned i;

    if (srv->shards == NULL)
        return;
    for (i = 0; i <= srv->nio; i++) {
        if (srv->shards[i].epfd >= 0)
            close(srv->shards[i].epfd);
        if (srv->shards[i].wake_fd >= 0)
            close(srv->shards[i].wake_fd);
    }
    free(srv->shards);
    srv->shards = NULL;
}

kvd__shard_t *kvd__shard_pick(kvd__server_t *srv)
{
    kvd__shard_t *s;

    if (srv->nio == 0)
        return &srv->shards[0];
    /* the one with the fewest connections; ties in turn */
    s = &srv->shards[1 + srv->next_shard++ % srv->nio];
    for (unsigned i = 1; i <= srv->nio; i++)
        if (srv->shards[i].nconns < s->nconns)
            s = &srv->shards[i];
    return s;
}
