/*
 * The connection: one blocking Unix socket, requests sent whole under a
 * send lock, replies read by whichever waiting thread takes the reader
 * role and parked by request id until their caller collects them.
 */
#include "internal.h"

#include "spin.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* This thread's last error, and the client it was about. */
static __thread const kvd_client_t *tls_err_cli;
static __thread char tls_err[KVD__ERR_MAX];

kvd_status_t kvd__client_fail(const kvd_client_t *cli, kvd_status_t st, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(tls_err, sizeof(tls_err), fmt, ap);
    va_end(ap);
    tls_err_cli = cli;
    return st;
}

const char *kvd_client_last_error(const kvd_client_t *cli)
{
    return tls_err_cli == cli ? tls_err : "";
}

void kvd__copy_str(char *dst, size_t cap, const char *src)
{
    size_t n;

    if (cap == 0)
        return;
    if (src == NULL)
        src = "";
    n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Deadline from a timeout in ms (< 0 or 0 with forever: none, as -1). */
static int64_t deadline_of(int timeout_ms)
{
    return timeout_ms < 0 ? -1 : now_ns() + (int64_t)timeout_ms * 1000000;
}

/* ms left until deadline for poll(): -1 forever, 0 when passed. */
static int ms_left(int64_t deadline)
{
    int64_t left;

    if (deadline < 0)
        return -1;
    left = deadline - now_ns();
    if (left <= 0)
        return 0;
    return left / 1000000 > 1000000 ? 1000000 : (int)((left + 999999) / 1000000);
}

static void close_fds(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

void kvd__pending_free(kvd__pending_t *p)
{
    if (p == NULL)
        return;
    if (p->resp != NULL)
        kvdock__response__free_unpacked(p->resp, NULL);
    close_fds(p->fds, p->nfds);
    if (p->op == KVDOCK__REQUEST__OP_PING)
        free(p->out.ping.payload);
    free(p);
}

int kvd__take_fd(kvd__pending_t *p, int fd_index)
{
    int fd;

    if (fd_index < 0 || fd_index >= p->nfds)
        return -1;
    fd = p->fds[fd_index];
    p->fds[fd_index] = -1;
    return fd;
}

/* ------------------------------------------------------------------------ */
/* Pending table (mu held)                                                   */

static kvd__pending_t *pending_find(kvd_client_t *c, uint64_t id, size_t *at)
{
    for (size_t i = 0; i < c->npend; i++) {
        if (c->pend[i]->id == id) {
            if (at != NULL)
                *at = i;
            return c->pend[i];
        }
    }
    return NULL;
}

static void pending_remove_at(kvd_client_t *c, size_t i)
{
    c->pend[i] = c->pend[c->npend - 1];
    c->npend--;
}

static kvd_status_t pending_add(kvd_client_t *c, kvd__pending_t *p)
{
    if (c->npend == c->pend_cap) {
        size_t cap = c->pend_cap ? c->pend_cap * 2 : 16;
        kvd__pending_t **n = realloc(c->pend, cap * sizeof(*n));

        if (n == NULL)
            return KVD_ENOMEM;
        c->pend = n;
        c->pend_cap = cap;
    }
    c->pend[c->npend++] = p;
    return KVD_OK;
}

/* Mark the connection lost (mu held); the first reason is kept. */
static void set_dead(kvd_client_t *c, kvd_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_dead(kvd_client_t *c, kvd_status_t st, const char *fmt, ...)
{
    va_list ap;

    if (c->dead)
        return;
    c->dead = true;
    c->dead_status = st;
    va_start(ap, fmt);
    vsnprintf(c->dead_msg, sizeof(c->dead_msg), fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------ */
/* Receiving                                                                  */

typedef struct rx_item {
    Kvdock__Response *resp;
    int fds[KVD_MAX_FDS_PER_FRAME];
    int nfds;
} rx_item_t;

/* The key area's room that p held, given back (mu held): its reply came,
 * or it never went. */
static void area_release(kvd_client_t *c, kvd__pending_t *p)
{
    if (p->area) {
        p->area = false;
        kvd__key_area_put(c);
    }
}

/* Hand a decoded reply to its pending entry (mu held); takes ownership. */
static void deliver(kvd_client_t *c, rx_item_t *it)
{
    size_t at;
    kvd__pending_t *p = pending_find(c, it->resp->id, &at);

    if (p == NULL || p->state == KVD__DONE) { /* not waited for, or a second reply */
        if (it->resp->id == 0 && it->resp->status != KVD_OK) {
            /* A connection-level error: the daemon closes after it. */
            set_dead(c, (kvd_status_t)it->resp->status, "kvdockd closed the connection: %s: %s",
                     kvd_err_name((int)it->resp->status),
                     it->resp->message != NULL && it->resp->message[0] != '\0'
                         ? it->resp->message
                         : kvd_strerror((int)it->resp->status));
        }
        kvdock__response__free_unpacked(it->resp, NULL);
        close_fds(it->fds, it->nfds);
        return;
    }
    if (c->outstanding > 0)
        c->outstanding--;
    area_release(c, p);
    if (p->state == KVD__ABANDONED) {
        pending_remove_at(c, at);
        kvdock__response__free_unpacked(it->resp, NULL);
        close_fds(it->fds, it->nfds);
        p->resp = NULL;
        kvd__pending_free(p);
        return;
    }
    p->resp = it->resp;
    memcpy(p->fds, it->fds, sizeof(int) * (size_t)it->nfds);
    p->nfds = it->nfds;
    p->state = KVD__DONE;
}

static void groups_drop_before(kvd_client_t *c, uint64_t pos)
{
    size_t w = 0;

    for (size_t i = 0; i < c->ngroups; i++) {
        if (c->groups[i].end <= pos) {
            close_fds(c->groups[i].fds, c->groups[i].nfds);
            continue;
        }
        c->groups[w++] = c->groups[i];
    }
    c->ngroups = w;
}

/*
 * The descriptors that came with the frame [s, e) of the stream: those of
 * the read that ended inside it.  The kernel ends a read right after the
 * segment that carries descriptors, and the daemon sends each frame that
 * has descriptors with its own sendmsg, descriptors on its first byte; so
 * a read with descriptors ends inside their frame (earlier frames may
 * share that read).
 */
static void groups_take(kvd_client_t *c, uint64_t s, uint64_t e, int *fds, int *nfds)
{
    *nfds = 0;
    for (size_t i = 0; i < c->ngroups; i++) {
        kvd__fd_group_t *g = &c->groups[i];

        if (s < g->end && g->end <= e && g->nfds > 0) {
            memcpy(fds, g->fds, sizeof(int) * (size_t)g->nfds);
            *nfds = g->nfds;
            g->nfds = 0;
            return;
        }
    }
}

/*
 * One read of the socket (reader role held, mu NOT held): decodes whole
 * frames into items.  Returns KVD_OK (possibly with no item),
 * KVD_ETIMEDOUT, or a fatal status with msg set.
 */
static kvd_status_t read_round(kvd_client_t *c, int64_t deadline, uint64_t spin_ns,
                               uint64_t *waited_ns, rx_item_t **items, size_t *nitems, char *msg,
                               size_t msg_cap)
{
    int fds[KVD_MAX_FDS_PER_FRAME];
    int nfds = 0;
    struct pollfd pfd = {.fd = c->sock, .events = POLLIN};
    ssize_t n;
    int rc;
    size_t cap_items = 0;
    size_t off = 0; /* bytes of rx consumed this round */

    int64_t t0 = now_ns();

    *items = NULL;
    *nitems = 0;
    *waited_ns = 0;
    if (c->rx_cap - c->rx_len < 4096) {
        size_t cap = c->rx_cap ? c->rx_cap * 2 : 65536;
        uint8_t *nb = realloc(c->rx, cap);

        if (nb == NULL) {
            snprintf(msg, msg_cap, "out of memory for the receive buffer");
            return KVD_ENOMEM;
        }
        c->rx = nb;
        c->rx_cap = cap;
    }
    /* poll without sleeping first, while that pays (proto/src/spin.h): a
     * quick reply is taken at once.  The probe is the read itself, which
     * never waits: a reply that is there costs one system call, not a
     * poll and then a read. */
    if (spin_ns > 0 && (deadline < 0 || deadline > t0) && kvd__spin_begin((uint64_t)t0)) {
        int64_t until = t0 + (int64_t)spin_ns, t;

        if (deadline >= 0 && deadline < until)
            until = deadline;
        while ((n = kvd__sock_recv_nowait(c->sock, c->rx + c->rx_len, c->rx_cap - c->rx_len,
                                          fds, &nfds, KVD_MAX_FDS_PER_FRAME)) == -EAGAIN &&
               (t = now_ns()) < until && kvd__spin_cores_free((uint64_t)t))
            ;
        kvd__spin_end();
        if (n != -EAGAIN)
            goto got;
    }
    /* Sleep in poll, not in a blocking recvmsg: a reader asleep in
     * recvmsg is woken each time the daemon consumes one of our requests
     * (the socket's write space wakes every sleeper on its queue), and
     * goes back to sleep; poll sleeps for POLLIN alone. */
    for (;;) {
        rc = poll(&pfd, 1, ms_left(deadline));
        if (rc > 0)
            break;
        if (rc == 0)
            return KVD_ETIMEDOUT;
        if (errno != EINTR) {
            snprintf(msg, msg_cap, "poll on the kvdockd socket failed: %s", strerror(errno));
            return KVD_EIO;
        }
    }
    n = kvd__sock_recv(c->sock, c->rx + c->rx_len, c->rx_cap - c->rx_len, fds, &nfds,
                       KVD_MAX_FDS_PER_FRAME);
got:
    if (n == -EAGAIN || n == -EWOULDBLOCK || n == -EINTR)
        return KVD_OK;
    if (n == 0) {
        snprintf(msg, msg_cap, "connection to kvdockd lost: the daemon closed the socket");
        return KVD_ECONN;
    }
    if (n < 0) {
        snprintf(msg, msg_cap, "connection to kvdockd lost: %s", strerror((int)-n));
        return KVD_ECONN;
    }
    if (nfds > 0) {
        if (c->ngroups == c->groups_cap) {
            size_t cap = c->groups_cap ? c->groups_cap * 2 : 4;
            kvd__fd_group_t *ng = realloc(c->groups, cap * sizeof(*ng));

            if (ng == NULL) {
                close_fds(fds, nfds);
                snprintf(msg, msg_cap, "out of memory for received descriptors");
                return KVD_ENOMEM;
            }
            c->groups = ng;
            c->groups_cap = cap;
        }
        c->groups[c->ngroups].start = c->rx_pos + c->rx_len;
        c->groups[c->ngroups].end = c->rx_pos + c->rx_len + (uint64_t)n;
        memcpy(c->groups[c->ngroups].fds, fds, sizeof(int) * (size_t)nfds);
        c->groups[c->ngroups].nfds = nfds;
        c->ngroups++;
    }
    c->rx_len += (size_t)n;
    *waited_ns = (uint64_t)(now_ns() - t0);

    for (;;) {
        size_t plen = 0;
        kvd__parse_t pr =
            kvd__frame_parse(c->rx + off, c->rx_len - off, KVD__MAX_REPLY_BYTES, &plen);
        rx_item_t *it;

        if (pr == KVD__PARSE_ERROR) {
            snprintf(msg, msg_cap, "kvdockd sent a frame of %zu bytes, over the client's limit",
                     plen);
            return KVD_EPROTO;
        }
        if (pr == KVD__PARSE_NEED_MORE) {
            /* Drop the frames consumed this round, once. */
            if (off > 0) {
                memmove(c->rx, c->rx + off, c->rx_len - off);
                c->rx_len -= off;
                c->rx_pos += off;
                groups_drop_before(c, c->rx_pos);
                off = 0;
            }
            if (c->rx_len >= KVD_FRAME_HEADER_BYTES && c->rx_cap < KVD_FRAME_HEADER_BYTES + plen) {
                uint8_t *nb = realloc(c->rx, KVD_FRAME_HEADER_BYTES + plen);

                if (nb == NULL) {
                    snprintf(msg, msg_cap, "out of memory for a reply of %zu bytes", plen);
                    return KVD_ENOMEM;
                }
                c->rx = nb;
                c->rx_cap = KVD_FRAME_HEADER_BYTES + plen;
            }
            break;
        }
        if (*nitems == cap_items) {
            size_t cap = cap_items ? cap_items * 2 : 4;
            rx_item_t *ni = realloc(*items, cap * sizeof(*ni));

            if (ni == NULL) {
                snprintf(msg, msg_cap, "out of memory for replies");
                return KVD_ENOMEM;
            }
            *items = ni;
            cap_items = cap;
        }
        it = &(*items)[*nitems];
        it->resp = kvdock__response__unpack(NULL, plen, c->rx + off + KVD_FRAME_HEADER_BYTES);
        if (it->resp == NULL) {
            snprintf(msg, msg_cap, "kvdockd sent a reply that does not decode (%zu bytes)", plen);
            return KVD_EPROTO;
        }
        groups_take(c, c->rx_pos + off, c->rx_pos + off + KVD_FRAME_HEADER_BYTES + plen, it->fds,
                    &it->nfds);
        (*nitems)++;
        off += KVD_FRAME_HEADER_BYTES + plen;
    }
    return KVD_OK;
}

/*
 * Make progress on receiving (mu held on entry and on return): read one
 * round if no other thread is reading, else wait for that thread's round.
 * KVD_OK, or KVD_ETIMEDOUT when deadline passed.  A lost connection is
 * recorded in c->dead, not returned.
 */
static kvd_status_t pump(kvd_client_t *c, int64_t deadline)
{
    rx_item_t *items = NULL;
    size_t nitems = 0;
    char msg[KVD__ERR_MAX];
    uint64_t spin_ns, waited_ns = 0;
    bool may_wait;
    kvd_status_t st;

    if (c->reading) {
        if (deadline < 0) {
            pthread_cond_wait(&c->cv, &c->mu);
        } else {
            struct timespec ts = {.tv_sec = deadline / 1000000000,
                                  .tv_nsec = deadline % 1000000000};

            if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT)
                return KVD_ETIMEDOUT;
        }
        return KVD_OK;
    }
    c->reading = true;
    spin_ns = c->spin.window_ns;
    may_wait = deadline < 0 || deadline > now_ns();
    pthread_mutex_unlock(&c->mu);
    msg[0] = '\0';
    st = read_round(c, deadline, spin_ns, &waited_ns, &items, &nitems, msg, sizeof(msg));
    pthread_mutex_lock(&c->mu);
    if (nitems > 0 && may_wait) /* a look at what is there teaches nothing */
        kvd__spin_learn(&c->spin, waited_ns);
    for (size_t i = 0; i < nitems; i++)
        deliver(c, &items[i]);
    free(items);
    if (st != KVD_OK && st != KVD_ETIMEDOUT)
        set_dead(c, st, "%s", msg);
    c->reading = false;
    pthread_cond_broadcast(&c->cv);
    return st == KVD_ETIMEDOUT ? KVD_ETIMEDOUT : KVD_OK;
}

/* ------------------------------------------------------------------------ */
/* Sending                                                                    */

kvd_status_t kvd__submit(kvd_client_t *cli, Kvdock__Request *req, const int *fds, int nfds,
                         kvd__finish_cb finish, const kvd__out_t *out, uint64_t *req_id)
{
    kvd__pending_t *p = NULL;
    kvd__frame_gather_t frame = {0};
    kvd_status_t st;
    int64_t deadline;
    uint64_t max_frame;
    bool area = kvd__key_area_named(req);

    if (nfds < 0 || nfds > KVD_MAX_FDS_PER_FRAME) {
        st = kvd__client_fail(cli, KVD_EINVAL, "at most %d descriptors per request",
                              KVD_MAX_FDS_PER_FRAME);
        goto fail;
    }
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        st = kvd__client_fail(cli, KVD_ENOMEM, "out of memory");
        goto fail;
    }
    p->area = area;
    area = false; /* p holds it now */
    p->op = (int)req->op_case;
    p->finish = finish;
    if (out != NULL)
        p->out = *out;

    pthread_mutex_lock(&cli->mu);
    if (cli->dead) {
        st = kvd__client_fail(cli, KVD_ECONN, "%s", cli->dead_msg);
        pthread_mutex_unlock(&cli->mu);
        goto fail;
    }
    /* Back-pressure: never have more in flight than the daemon takes, or a
     * single-threaded caller could block sending while replies pile up. */
    deadline = deadline_of(cli->timeout_ms > 0 ? cli->timeout_ms : -1);
    while (cli->info.limits.max_inflight > 0 && cli->outstanding >= cli->info.limits.max_inflight &&
           !cli->dead) {
        if (pump(cli, deadline) == KVD_ETIMEDOUT) {
            st = kvd__client_fail(cli, KVD_ETIMEDOUT,
                                  "timed out waiting for room: %zu requests in flight",
                                  cli->outstanding);
            pthread_mutex_unlock(&cli->mu);
            goto fail;
        }
    }
    if (cli->dead) {
        st = kvd__client_fail(cli, KVD_ECONN, "%s", cli->dead_msg);
        pthread_mutex_unlock(&cli->mu);
        goto fail;
    }
    p->id = cli->next_id++;
    req->id = p->id;
    max_frame = cli->info.limits.max_frame_bytes;
    pthread_mutex_unlock(&cli->mu);

    /* the request's large bytes fields go from the caller's memory, which
     * stays put until this call returns */
    st = kvd__frame_gather(&req->base, &frame);
    if (st != KVD_OK) {
        kvd__client_fail(cli, st, "cannot encode the %s request", kvd__op_name(p->op));
        goto fail;
    }
    if (max_frame > 0 && frame.total - KVD_FRAME_HEADER_BYTES > max_frame) {
        st = kvd__client_fail(
            cli, KVD_ETOOBIG,
            "%s request of %zu bytes exceeds the daemon's maximum frame of %llu bytes "
            "(use a registered buffer for large operands)",
            kvd__op_name(p->op), frame.total - KVD_FRAME_HEADER_BYTES, (unsigned long long)max_frame);
        goto fail;
    }

    pthread_mutex_lock(&cli->mu);
    st = pending_add(cli, p);
    if (st != KVD_OK) {
        pthread_mutex_unlock(&cli->mu);
        kvd__client_fail(cli, st, "out of memory");
        goto fail;
    }
    cli->outstanding++;
    pthread_mutex_unlock(&cli->mu);

    pthread_mutex_lock(&cli->send_mu);
    st = kvd__sock_send_iov(cli->sock, frame.iov, frame.iovcnt, fds, nfds);
    pthread_mutex_unlock(&cli->send_mu);
    kvd__frame_gather_free(&frame);
    if (st != KVD_OK) {
        size_t at;

        pthread_mutex_lock(&cli->mu);
        if (pending_find(cli, p->id, &at) == p) {
            pending_remove_at(cli, at);
            if (cli->outstanding > 0)
                cli->outstanding--;
        }
        /* The daemon may have said why before closing (an id-0 error
         * reply, written before the close that failed our write: already
         * in our receive queue): read it, and report its status rather
         * than the failed write. */
        for (int i = 0; i < 16 && !cli->dead && !cli->reading; i++)
            if (pump(cli, now_ns()) == KVD_ETIMEDOUT)
                break;
        set_dead(cli, KVD_ECONN, "connection to kvdockd lost while sending a %s request (%s)",
                 kvd__op_name(p->op), kvd_strerror(st));
        st = cli->dead_status != KVD_OK ? cli->dead_status : KVD_ECONN;
        kvd__client_fail(cli, st, "%s", cli->dead_msg);
        pthread_mutex_unlock(&cli->mu);
        goto fail;
    }
    if (req_id != NULL)
        *req_id = p->id;
    return KVD_OK;

fail:
    kvd__frame_gather_free(&frame);
    if (area || (p != NULL && p->area)) {
        pthread_mutex_lock(&cli->mu);
        kvd__key_area_put(cli);
        pthread_mutex_unlock(&cli->mu);
    }
    /* The caller keeps what it passed: do not free its ping copy here. */
    free(p);
    return st;
}

/* Turn a parked reply into the caller's outputs; frees p. */
static kvd_status_t finish(kvd_client_t *cli, kvd__pending_t *p)
{
    kvd_status_t st;
    Kvdock__Response *r = p->resp;

    if (r->status != KVD_OK) {
        const char *m =
            r->message != NULL && r->message[0] != '\0' ? r->message : kvd_strerror((int)r->status);

        st = kvd__client_fail(cli, (kvd_status_t)r->status, "%s", m);
    } else if (p->finish != NULL) {
        st = p->finish(cli, p);
    } else {
        st = KVD_OK;
    }
    kvd__pending_free(p);
    return st;
}

kvd_status_t kvd__wait(kvd_client_t *cli, uint64_t req_id, int timeout_ms)
{
    int64_t deadline = deadline_of(timeout_ms);
    kvd__pending_t *p;
    size_t at;

    pthread_mutex_lock(&cli->mu);
    for (;;) {
        p = pending_find(cli, req_id, &at);
        if (p == NULL || p->state == KVD__ABANDONED) {
            pthread_mutex_unlock(&cli->mu);
            return kvd__client_fail(cli, KVD_ENOENT, "no pending request with id %llu",
                                    (unsigned long long)req_id);
        }
        if (p->state == KVD__DONE)
            break;
        if (cli->dead) {
            kvd_status_t st = cli->dead_status;

            pending_remove_at(cli, at);
            area_release(cli, p);
            kvd__client_fail(cli, st, "%s", cli->dead_msg);
            pthread_mutex_unlock(&cli->mu);
            kvd__pending_free(p);
            return st;
        }
        if (pump(cli, deadline) == KVD_ETIMEDOUT) {
            pthread_mutex_unlock(&cli->mu);
            return kvd__client_fail(cli, KVD_ETIMEDOUT, "no reply to request %llu within %d ms",
                                    (unsigned long long)req_id, timeout_ms);
        }
    }
    pending_remove_at(cli, at);
    pthread_mutex_unlock(&cli->mu);
    return finish(cli, p);
}

kvd_status_t kvd__call(kvd_client_t *cli, Kvdock__Request *req, const int *fds, int nfds,
                       kvd__finish_cb fin, const kvd__out_t *out, uint64_t *req_id)
{
    uint64_t id;
    kvd_status_t st;

    if (req_id != NULL)
        return kvd__submit(cli, req, fds, nfds, fin, out, req_id);
    st = kvd__submit(cli, req, fds, nfds, fin, out, &id);
    if (st != KVD_OK)
        return st;
    return kvd__wait_blocking(cli, id);
}

kvd_status_t kvd__wait_blocking(kvd_client_t *cli, uint64_t id)
{
    kvd_status_t st = kvd__wait(cli, id, cli->timeout_ms > 0 ? cli->timeout_ms : -1);

    if (st == KVD_ETIMEDOUT)
        kvd_client_abandon(cli, id);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Public waiting API                                                        */

kvd_status_t kvd_client_wait(kvd_client_t *cli, uint64_t req_id)
{
    if (cli == NULL)
        return kvd__client_fail(NULL, KVD_ENULL, "client is NULL");
    return kvd__wait(cli, req_id, -1);
}

kvd_status_t kvd_client_wait_timeout(kvd_client_t *cli, uint64_t req_id, int timeout_ms)
{
    if (cli == NULL)
        return kvd__client_fail(NULL, KVD_ENULL, "client is NULL");
    return kvd__wait(cli, req_id, timeout_ms);
}

kvd_status_t kvd_client_poll(kvd_client_t *cli, uint64_t req_id, bool *done)
{
    kvd__pending_t *p;

    if (cli == NULL || done == NULL)
        return kvd__client_fail(cli, KVD_ENULL, "client or done is NULL");
    pthread_mutex_lock(&cli->mu);
    p = pending_find(cli, req_id, NULL);
    if (p == NULL || p->state == KVD__ABANDONED) {
        pthread_mutex_unlock(&cli->mu);
        return kvd__client_fail(cli, KVD_ENOENT, "no pending request with id %llu",
                                (unsigned long long)req_id);
    }
    if (p->state == KVD__SENT && !cli->dead && !cli->reading) {
        pump(cli, now_ns()); /* whatever is readable now, no waiting */
        p = pending_find(cli, req_id, NULL);
    }
    *done = p == NULL || p->state != KVD__SENT || cli->dead;
    pthread_mutex_unlock(&cli->mu);
    return KVD_OK;
}

size_t kvd_client_pending(const kvd_client_t *cli)
{
    size_t n = 0;
    kvd_client_t *c = (kvd_client_t *)cli;

    if (c == NULL)
        return 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->npend; i++)
        if (c->pend[i]->state != KVD__ABANDONED)
            n++;
    pthread_mutex_unlock(&c->mu);
    return n;
}

kvd_status_t kvd_client_abandon(kvd_client_t *cli, uint64_t req_id)
{
    kvd__pending_t *p;
    size_t at;

    if (cli == NULL)
        return kvd__client_fail(NULL, KVD_ENULL, "client is NULL");
    pthread_mutex_lock(&cli->mu);
    p = pending_find(cli, req_id, &at);
    if (p == NULL || p->state == KVD__ABANDONED) {
        pthread_mutex_unlock(&cli->mu);
        return kvd__client_fail(cli, KVD_ENOENT, "no pending request with id %llu",
                                (unsigned long long)req_id);
    }
    if (p->state == KVD__DONE || cli->dead) {
        pending_remove_at(cli, at);
        area_release(cli, p);
        pthread_mutex_unlock(&cli->mu);
        kvd__pending_free(p);
        return KVD_OK;
    }
    p->state = KVD__ABANDONED;
    pthread_mutex_unlock(&cli->mu);
    return KVD_OK;
}

void kvd__conn_teardown(kvd_client_t *c)
{
    for (size_t i = 0; i < c->npend; i++)
        kvd__pending_free(c->pend[i]);
    free(c->pend);
    c->pend = NULL;
    c->npend = 0;
    for (size_t i = 0; i < c->ngroups; i++)
        close_fds(c->groups[i].fds, c->groups[i].nfds);
    free(c->groups);
    c->groups = NULL;
    c->ngroups = 0;
    free(c->rx);
    c->rx = NULL;
    if (c->sock >= 0)
        close(c->sock);
    c->sock = -1;
}
