/* One client connection: see conn.h. */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "caches.h"
#include "dispatch.h"
#include "keyarea.h"
#include "log.h"
#include "park.h"
#include "shard.h"

/* Every connection may hold one read chunk without counting it: a client
 * can always be read and answered, whatever the others hold. */
#define READ_CHUNK (64u << 10)
/* Replies a connection may have queued and still be read while socket
 * memory is full. */
#define WQ_FREE (64u << 10)
#define MAX_PENDING_FDS (2 * KVD_MAX_FDS_PER_FRAME)
#define RBUF_ALIGN 4096u
#define RBUF_ALIGNED_MAX (4 * READ_CHUNK)

/* Stop reading this client: too much in flight, or its unread replies pile
 * up (past its own limit, or past a little while socket memory is full). */
static int paused(const kvd__conn_t *c)
{
    const kvd__options_t *o = &c->srv->opts;

    return c->inflight >= o->max_inflight || c->wq_bytes >= o->max_write_queue_bytes ||
           (c->wq_bytes > WQ_FREE && kvd__hostmem_full(&c->srv->hostmem, KVD_HM_SOCKETS));
}

/* The frame deadline: set when bytes of an incomplete frame wait while the
 * daemon reads, renewed for each new frame, cleared when nothing waits or
 * the daemon has stopped reading (back-pressure is not the client's delay).
 * Before hello the hello's deadline stands. */
static void update_deadline(kvd__conn_t *c)
{
    const kvd__options_t *o = &c->srv->opts;
    uint64_t start;

    if (c->deadline_hello)
        return;
    if (o->frame_timeout_ms == 0 || c->closing || c->close_after_flush ||
        c->rlen == c->rstart || paused(c)) {
        c->deadline_ns = 0;
        return;
    }
    start = c->rabs + c->rstart;
    if (c->deadline_ns == 0 || c->deadline_frame != start) {
        c->deadline_ns = kvd__now_ns() + o->frame_timeout_ms * 1000000ull;
        c->deadline_frame = start;
        kvd__server_sweep_arm(c->srv);
    }
}

/* Give back the read buffer and what it counted (not while its I/O
 * thread reads into it: that thread gives it back after). */
static void free_rbuf(kvd__conn_t *c)
{
    if (c->reading)
        return;
    kvd__hostmem_release(&c->srv->hostmem, KVD_HM_SOCKETS, c->rcharged);
    c->rcharged = 0;
    free(c->rbuf);
    c->rbuf = NULL;
    c->rcap = c->rlen = c->rstart = 0;
}

static void update_poll(kvd__conn_t *c)
{
    uint32_t ev = 0;

    if (c->closing)
        return;
    if (!c->close_after_flush && !paused(c))
        ev |= EPOLLIN;
    if (c->wq != NULL && !c->flush_queued && !c->writing)
        ev |= EPOLLOUT; /* a flush found the socket full */
    update_deadline(c);
    if (ev == c->poll_events && (ev == 0 || c->watched))
        return;
    kvd__shard_watch(c, ev);
    c->poll_events = ev;
}

/* The bytes not yet handled; NULL before the first read (NULL + 0 is
 * undefined behaviour, and UBSan says so). */
static const uint8_t *unread(const kvd__conn_t *c)
{
    return c->rbuf != NULL ? c->rbuf + c->rstart : NULL;
}

static int has_frame(const kvd__conn_t *c)
{
    size_t plen;

    return kvd__frame_parse(unread(c), c->rlen - c->rstart, c->srv->opts.max_frame_bytes,
                            &plen) != KVD__PARSE_NEED_MORE;
}

static void maybe_finish(kvd__conn_t *c)
{
    if (c->closing && c->inflight == 0 && !c->handle_closing) {
        c->handle_closing = 1;
        kvd__shard_bury(c);
    }
}

static void free_fdgroups(kvd__conn_t *c)
{
    while (c->fdq) {
        kvd__fdgroup_t *g = c->fdq;
        int i;
        c->fdq = g->next;
        for (i = 0; i < g->n; i++)
            close(g->fds[i]);
        free(g);
    }
    c->fdq_tail = NULL;
}

static void free_wbuf(kvd__conn_t *c, kvd__wbuf_t *w)
{
    int i;

    for (i = 0; i < w->nfds; i++)
        close(w->fds[i]);
    kvd__hostmem_release(&c->srv->hostmem, KVD_HM_SOCKETS, w->len);
    free(w->buf);
    free(w);
}

/* Give back the queued replies (not while its I/O thread writes them:
 * that thread gives them back after). */
static void free_wq(kvd__conn_t *c)
{
    if (c->writing)
        return;
    while (c->wq) {
        kvd__wbuf_t *w = c->wq;
        c->wq = w->next;
        free_wbuf(c, w);
    }
    c->wq_tail = NULL;
    c->wq_bytes = 0;
}

void kvd__conn_close(kvd__conn_t *c, const char *reason)
{
    kvd__server_t *srv = c->srv;

    if (c->closing)
        return;
    c->closing = 1;
    if (srv->spin_conn == c)
        srv->spin_conn = NULL;
    kvd_log(KVD_LOG_INFO,
            "event=conn_close client=%" PRIu64 " pid=%d reason=\"%s\" inflight=%u pools=%u "
            "buffers=%u",
            c->id, (int)c->pid, reason, c->inflight, c->owner.pools, c->owner.buffers);
    kvd__shard_watch(c, 0);
    c->poll_events = 0;
    shutdown(c->fd, SHUT_RDWR); /* the peer sees the end now */
    free_wq(c);
    c->deadline_ns = 0;
    free_fdgroups(c);
    free_rbuf(c);
    /* What it owns leaves the registry now; the memory goes once the
     * operations that use it have completed. */
    kvd__registry_drop_owner(&srv->reg, &c->owner);
    kvd__leases_drop(c);
    kvd__park_drop_conn(c);
    kvd__key_area_drop(c); /* a waiting request was its last reader */
    maybe_finish(c);
    kvd__server_check_drained(srv);
}

/* After close_after_flush: close once nothing is in flight or queued. */
static int close_if_done(kvd__conn_t *c)
{
    if (!c->close_after_flush || c->inflight > 0 || c->wq != NULL)
        return 0;
    kvd__conn_close(c, c->close_reason);
    return 1;
}

void kvd__conn_close_after_flush(kvd__conn_t *c, const char *reason)
{
    if (c->closing || c->close_after_flush)
        return;
    c->close_after_flush = 1;
    c->close_reason = reason;
    /* nothing more is read: bytes of a frame not yet whole are of no use */
    free_fdgroups(c);
    free_rbuf(c);
    if (!close_if_done(c))
        update_poll(c);
}

/* Frames per sendmsg: replies that queued up while the loop ran go out
 * in one system call. */
#define FLUSH_IOV 64

void kvd__conn_flush(kvd__conn_t *c)
{
    int was_paused = paused(c);
    int unlocked = kvd__shard_may_write_unlocked(c);

    /* its I/O thread is writing: it writes what was queued meanwhile too */
    if (c->closing || c->writing)
        return;
    while (c->wq != NULL) {
        struct iovec iov[FLUSH_IOV];
        kvd__wbuf_t *w;
        int niov = 0;
        ssize_t n;

        /* a frame with descriptors goes alone: they ride on its first
         * byte, and the peer gives them to the frame its read ends in */
        for (w = c->wq; w != NULL && niov < FLUSH_IOV; w = w->next) {
            if (niov > 0 && w->nfds > 0)
                break;
            iov[niov].iov_base = w->buf + w->off;
            iov[niov].iov_len = w->len - w->off;
            niov++;
            if (w->nfds > 0)
                break;
        }
        w = c->wq;
        if (unlocked) {
            c->writing = 1;
            kvd__server_let_go(c->srv);
        }
        n = kvd__sock_sendmsg(c->fd, iov, niov, w->fds, w->nfds, MSG_DONTWAIT);
        if (unlocked) {
            kvd__server_take(c->srv);
            c->writing = 0;
            if (c->closing) { /* closed meanwhile: what it left is ours */
                free_wq(c);
                return;
            }
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            kvd__conn_close(c, errno == EPIPE || errno == ECONNRESET ? "peer gone" : "write error");
            return;
        }
        if (w->nfds > 0) { /* they went with the first byte */
            int i;
            for (i = 0; i < w->nfds; i++)
                close(w->fds[i]);
            w->nfds = 0;
        }
        c->wq_bytes -= (size_t)n;
        c->srv->stats.bytes_out += (uint64_t)n;
        while (n > 0) {
            size_t left = w->len - w->off;

            if ((size_t)n < left) {
                w->off += (size_t)n;
                break;
            }
            n -= (ssize_t)left;
            c->wq = w->next;
            if (c->wq == NULL)
                c->wq_tail = NULL;
            free_wbuf(c, w);
            w = c->wq;
        }
    }
    if (close_if_done(c))
        return;
    update_poll(c);
    if (was_paused && !paused(c) && has_frame(c))
        kvd__shard_kick(c);
}

kvd_status_t kvd__conn_send(kvd__conn_t *c, const ProtobufCMessage *msg, const int *fds, int nfds)
{
    kvd__wbuf_t *w;
    kvd_status_t st;
    int i;

    if (c->closing)
        return KVD_OK; /* the client is gone: nobody to answer */
    if (nfds < 0 || nfds > 2)
        return KVD_EINTERNAL;
    w = calloc(1, sizeof(*w));
    if (w == NULL)
        return KVD_ENOMEM;
    st = kvd__frame_pack(msg, &w->buf, &w->len);
    if (st != KVD_OK) {
        free(w);
        return st;
    }
    kvd__hostmem_charge(&c->srv->hostmem, KVD_HM_SOCKETS, w->len);
    for (i = 0; i < nfds; i++) {
        w->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
        if (w->fds[i] < 0) {
            int e = errno;
            w->nfds = i;
            free_wbuf(c, w);
            return e == EMFILE || e == ENFILE ? KVD_ELIMIT : KVD_EIO;
        }
    }
    w->nfds = nfds;
    if (c->wq_tail)
        c->wq_tail->next = w;
    else
        c->wq = w;
    c->wq_tail = w;
    c->wq_bytes += w->len;
    kvd__server_activity(c->srv);
    /* written once the loop has run this round's callbacks (see
     * kvd__server_want_flush); a queue that was blocked waits for the
     * socket instead */
    if (c->wq == w)
        kvd__shard_want_flush(c);
    return KVD_OK;
}

void kvd__conn_op_begin(kvd__conn_t *c)
{
    c->inflight++;
    c->srv->inflight++;
    update_poll(c);
}

void kvd__conn_op_end(kvd__conn_t *c)
{
    int was_paused = paused(c);

    c->inflight--;
    c->srv->inflight--;
    if (c->closing) {
        maybe_finish(c);
    } else if (close_if_done(c)) {
        /* the last reply a closing connection waited for was written */
    } else {
        update_poll(c);
        if (was_paused && !paused(c) && has_frame(c))
            kvd__shard_kick(c);
    }
    kvd__server_check_drained(c->srv);
}

/* Descriptors for the frame [s, e) of the stream: those of reads that
 * ended inside it.  Those of reads that ended before it belong to no frame
 * and are closed. */
static int take_fds(kvd__conn_t *c, uint64_t s, uint64_t e, int *fds)
{
    int n = 0, i;

    while (c->fdq != NULL && c->fdq->end <= e) {
        kvd__fdgroup_t *g = c->fdq;
        c->fdq = g->next;
        for (i = 0; i < g->n; i++) {
            if (g->end > s && n < KVD_MAX_FDS_PER_FRAME)
                fds[n++] = g->fds[i];
            else
                close(g->fds[i]);
        }
        free(g);
    }
    if (c->fdq == NULL)
        c->fdq_tail = NULL;
    return n;
}

static int pending_fds(const kvd__conn_t *c)
{
    const kvd__fdgroup_t *g;
    int n = 0;

    for (g = c->fdq; g; g = g->next)
        n += g->n;
    return n;
}

/* Handle whole frames in the buffer.  0: need more bytes; 1: stopped (the
 * cap, or back-pressure); -1: the connection is closing. */
static int process_frames(kvd__conn_t *c, unsigned *handled)
{
    const kvd__options_t *o = &c->srv->opts;

    while (!c->closing && !c->close_after_flush) {
        size_t plen = 0;
        kvd__parse_t pr;
        uint64_t s;
        int fds[KVD_MAX_FDS_PER_FRAME], nfds;
        uint8_t *payload;

        if (paused(c) || *handled >= o->reqs_per_event)
            return 1;
        pr = kvd__frame_parse(unread(c), c->rlen - c->rstart, o->max_frame_bytes, &plen);
        if (pr == KVD__PARSE_NEED_MORE)
            return 0;
        if (pr == KVD__PARSE_ERROR) {
            char msg[128];
            snprintf(msg, sizeof(msg), "frame of %zu bytes exceeds the maximum of %" PRIu64, plen,
                     o->max_frame_bytes);
            kvd_log(KVD_LOG_WARN, "event=frame_too_big client=%" PRIu64 " bytes=%zu", c->id, plen);
            kvd__reply_error(c, 0, KVD_ETOOBIG, msg);
            kvd__conn_close_after_flush(c, "closed after error reply");
            return -1;
        }
        s = c->rabs + c->rstart;
        nfds = take_fds(c, s, s + KVD_FRAME_HEADER_BYTES + plen, fds);
        payload = c->rbuf + c->rstart + KVD_FRAME_HEADER_BYTES;
        c->rstart += KVD_FRAME_HEADER_BYTES + plen;
        (*handled)++;
        if (kvd__dispatch_frame(c, payload, plen, fds, nfds) < 0) {
            kvd_log(KVD_LOG_WARN, "event=bad_frame client=%" PRIu64 " bytes=%zu", c->id, plen);
            kvd__conn_close_after_flush(c, "closed after error reply");
            return -1;
        }
    }
    return -1;
}

/* Set the read buffer's capacity to cap bytes, counting what passes the
 * first chunk as socket memory.  0, or -1 with why set: the budget refused
 * (-2: out of memory). */
static int resize_rbuf(kvd__conn_t *c, size_t cap, char *why, size_t why_len)
{
    kvd__hostmem_t *hm = &c->srv->hostmem;
    uint64_t charge = cap > READ_CHUNK ? cap - READ_CHUNK : 0;
    uint8_t *nb;

    if (charge > c->rcharged &&
        kvd__hostmem_reserve(hm, KVD_HM_SOCKETS, charge - c->rcharged, why, why_len) != KVD_OK)
        return -1;
    /* Up to a few chunks, page-aligned: reads land at a page's start once
     * the buffer is drained, where the kernel's copy out of the socket
     * runs at full speed (at some offsets within a page it takes twice as
     * long, and where a heap block starts would decide it).  Larger ones
     * grow in place (realloc: no second copy resident while a big frame
     * arrives). */
    if (cap <= RBUF_ALIGNED_MAX) {
        if (posix_memalign((void **)&nb, RBUF_ALIGN, cap) != 0)
            nb = NULL;
        else if (c->rbuf != NULL) {
            memcpy(nb, c->rbuf, c->rlen < cap ? c->rlen : cap);
            free(c->rbuf);
        }
    } else {
        nb = realloc(c->rbuf, cap);
    }
    if (nb == NULL) {
        if (charge > c->rcharged)
            kvd__hostmem_release(hm, KVD_HM_SOCKETS, charge - c->rcharged);
        return -2;
    }
    if (charge < c->rcharged)
        kvd__hostmem_release(hm, KVD_HM_SOCKETS, c->rcharged - charge);
    c->rcharged = charge;
    c->rbuf = nb;
    c->rcap = cap;
    return 0;
}

/* Room for the next read: compact, and grow towards the end of the frame
 * being read as its bytes arrive, doubling, never to its announced length
 * at once (a header alone pins no memory).  See resize_rbuf for the result. */
static int make_room(kvd__conn_t *c, char *why, size_t why_len)
{
    size_t plen = 0, want, avail = c->rlen - c->rstart;

    if (c->rstart > 0 && (c->rstart == c->rlen || c->rcap - c->rlen < READ_CHUNK / 4)) {
        memmove(c->rbuf, c->rbuf + c->rstart, avail);
        c->rabs += c->rstart;
        c->rlen = avail;
        c->rstart = 0;
    }
    want = c->rlen + READ_CHUNK;
    if (avail >= KVD_FRAME_HEADER_BYTES) {
        /* the header is checked against the maximum before we get here */
        size_t frame_end;

        (void)kvd__frame_parse(unread(c), avail, UINT64_MAX, &plen);
        frame_end = c->rstart + KVD_FRAME_HEADER_BYTES + plen;
        if (frame_end > want) {
            size_t doubled = 2 * c->rcap > want ? 2 * c->rcap : want;
            want = frame_end < doubled ? frame_end : doubled;
        }
    }
    if (want <= c->rcap)
        return 0;
    return resize_rbuf(c, want, why, why_len);
}

static void shrink_buffer(kvd__conn_t *c)
{
    size_t avail = c->rlen - c->rstart;
    char why[8];

    if (c->rcap <= 4 * READ_CHUNK || avail > READ_CHUNK)
        return;
    memmove(c->rbuf, c->rbuf + c->rstart, avail);
    c->rabs += c->rstart;
    c->rlen = avail;
    c->rstart = 0;
    (void)resize_rbuf(c, READ_CHUNK, why, sizeof(why)); /* a shrink: never refused */
}

/* The frame being read does not fit in the socket memory: say so and close. */
static void refuse_frame(kvd__conn_t *c, const char *why)
{
    char msg[300];
    size_t plen = 0;

    (void)kvd__frame_parse(unread(c), c->rlen - c->rstart, UINT64_MAX, &plen);
    snprintf(msg, sizeof(msg), "frame of %zu bytes refused: %s (max-socket-buffer-bytes)", plen,
             why);
    c->srv->stats.refused_socket_mem++;
    kvd_log(KVD_LOG_WARN, "event=frame_refused client=%" PRIu64 " bytes=%zu reason=socket_memory",
            c->id, plen);
    kvd__reply_error(c, 0, KVD_ELIMIT, msg);
    kvd__conn_close_after_flush(c, "frame refused: socket memory full");
}

static void read_and_process(kvd__conn_t *c)
{
    unsigned handled = 0;
    int drained = 0, unlocked = kvd__shard_may_read_unlocked(c);
    char why[200];

    for (;;) {
        int fds[KVD_MAX_FDS_PER_FRAME], nfds = 0, r;
        ssize_t n;
        size_t room;

        r = process_frames(c, &handled);
        if (r < 0)
            return;
        /* a read that left room emptied the socket: with every frame read
         * whole, what comes next wakes the (level-triggered) poll again, so
         * no read to see EAGAIN; a frame still arriving is read on */
        if (r > 0 || (drained && c->rstart == c->rlen))
            break;
        if ((r = make_room(c, why, sizeof(why))) != 0) {
            if (r == -2) {
                kvd__conn_close(c, "out of memory");
                return;
            }
            refuse_frame(c, why);
            return;
        }
        room = c->rcap - c->rlen;
        if (unlocked) {
            c->reading = 1;
            kvd__server_let_go(c->srv);
        }
        n = kvd__sock_recv(c->fd, c->rbuf + c->rlen, room, fds, &nfds, KVD_MAX_FDS_PER_FRAME);
        if (unlocked) {
            kvd__server_take(c->srv);
            c->reading = 0;
            if (c->closing || c->close_after_flush) { /* meanwhile: nothing more is read */
                int i;

                for (i = 0; i < nfds; i++)
                    close(fds[i]);
                free_rbuf(c);
                return;
            }
        }
        if (n == -EAGAIN || n == -EWOULDBLOCK)
            break;
        if (n == 0) {
            struct pollfd p = {.fd = c->fd, .events = 0, .revents = 0};

            /* POLLHUP: the client closed its socket, nobody reads replies.
             * Else it only shut down its sending side (shutdown(SHUT_WR)):
             * answer what it sent, then close. */
            if (poll(&p, 1, 0) == 1 && (p.revents & POLLHUP))
                kvd__conn_close(c, "client gone (end of stream)");
            else
                kvd__conn_close_after_flush(c, "client finished sending");
            return;
        }
        if (n < 0) {
            kvd__conn_close(c, "read error");
            return;
        }
        c->rlen += (size_t)n;
        drained = (size_t)n < room;
        c->srv->stats.bytes_in += (uint64_t)n;
        kvd__server_client_active(c->srv, c);
        if (c->srv->nio == 0)
            c->srv->spin_conn = c;
        kvd__server_activity(c->srv);
        if (nfds > 0) {
            kvd__fdgroup_t *g = NULL;
            int i;

            if (pending_fds(c) + nfds <= MAX_PENDING_FDS)
                g = calloc(1, sizeof(*g));
            if (g == NULL) {
                for (i = 0; i < nfds; i++)
                    close(fds[i]);
            } else {
                g->end = c->rabs + c->rlen;
                g->n = nfds;
                memcpy(g->fds, fds, sizeof(int) * (size_t)nfds);
                if (c->fdq_tail)
                    c->fdq_tail->next = g;
                else
                    c->fdq = g;
                c->fdq_tail = g;
            }
        }
    }
    if (!c->closing) {
        if (has_frame(c) && !paused(c))
            kvd__shard_kick(c);
        else
            shrink_buffer(c);
        update_deadline(c);
    }
}

void kvd__conn_process(kvd__conn_t *c)
{
    unsigned handled = 0;

    if (c->closing || c->close_after_flush)
        return;
    if (process_frames(c, &handled) > 0 && !c->closing && has_frame(c) && !paused(c))
        kvd__shard_kick(c);
    update_deadline(c);
}

void kvd__conn_hello_done(kvd__conn_t *c)
{
    c->deadline_hello = 0;
    c->deadline_ns = 0;
    update_deadline(c);
}

void kvd__conn_check_deadline(kvd__conn_t *c, uint64_t now_ns)
{
    const kvd__options_t *o = &c->srv->opts;
    char msg[160];

    if (c->closing || c->deadline_ns == 0 || now_ns < c->deadline_ns)
        return;
    if (c->deadline_hello) {
        c->srv->stats.timeouts_hello++;
        snprintf(msg, sizeof(msg), "no hello within %" PRIu64 " ms of connecting "
                 "(hello-timeout-ms)", o->hello_timeout_ms);
    } else {
        c->srv->stats.timeouts_frame++;
        snprintf(msg, sizeof(msg), "a frame was not whole %" PRIu64 " ms after its first byte "
                 "(frame-timeout-ms)", o->frame_timeout_ms);
    }
    kvd__reply_error(c, 0, KVD_ETIMEDOUT, msg);
    kvd__conn_flush(c); /* as far as the socket takes it now; then it goes */
    kvd__conn_close(c, c->deadline_hello ? "hello timeout" : "frame timeout");
}

void kvd__conn_event(kvd__conn_t *c, uint32_t events)
{
    if (c->closing)
        return;
    /* an error or hang-up: the read or write that follows says which */
    if (events & (EPOLLERR | EPOLLHUP))
        events |= c->poll_events;
    if (events & EPOLLOUT) {
        kvd__conn_flush(c);
        if (c->closing)
            return;
    }
    if ((events & EPOLLIN) && (c->poll_events & EPOLLIN))
        read_and_process(c);
}

int kvd__conn_in_group(const kvd__conn_t *c, gid_t gid)
{
    if (c->gid == gid)
        return 1;
    for (uint32_t i = 0; i < c->ngroups; i++)
        if (c->groups[i] == gid)
            return 1;
    return 0;
}

kvd_status_t kvd__conn_create(kvd__server_t *srv, int fd, const struct ucred *cred,
                              kvd__conn_t **out)
{
    kvd__conn_t *c = calloc(1, sizeof(*c));

    if (c == NULL)
        return KVD_ENOMEM;
    c->fd = fd;
    c->shard = kvd__shard_pick(srv);
    if (!c->shard->threaded) {
        if (uv_poll_init(srv->loop, &c->poll, fd) != 0) {
            free(c);
            return KVD_EIO;
        }
        c->poll.data = c;
    }
    c->shard->nconns++;
    c->karea_fd = -1;
    c->srv = srv;
    c->id = srv->next_client_id++;
    c->pid = cred->pid;
    c->uid = cred->uid;
    c->gid = cred->gid;
    {
        socklen_t len = sizeof(c->groups);

        /* a kernel without it (before 4.13), or more groups than fit:
         * the primary group, and those that fit */
        if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, c->groups, &len) == 0)
            c->ngroups = len / sizeof(gid_t);
        else if (errno == ERANGE)
            c->ngroups = KVD_CONN_GROUPS;
    }
    c->admin = kvd__server_peer_admin(srv, cred->uid);
    c->owner.client_id = c->id;
    c->owner.uid = cred->uid;
    if (srv->opts.hello_timeout_ms != 0) {
        c->deadline_hello = 1;
        c->deadline_ns = kvd__now_ns() + srv->opts.hello_timeout_ms * 1000000ull;
        kvd__server_sweep_arm(srv);
    }
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->nconns++;
    update_poll(c);
    *out = c;
    return KVD_OK;
}
