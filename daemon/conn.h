/*
 * One client connection: its socket in a shard's epoll set (shard.h);
 * reads with kvd__sock_recv so SCM_RIGHTS descriptors arrive with their
 * frame; a write queue written at the end of each loop phase or I/O
 * thread round (so the replies of one round leave in one sendmsg), and
 * when the socket is writable again after it was full.  The connection is
 * freed only by its shard, once it is closing and no request of it is in
 * flight.
 */
#ifndef KVD_DAEMON_CONN_H
#define KVD_DAEMON_CONN_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "wire.h"
#include "registry.h"
#include "server.h"

/* Descriptors delivered by one read: they belong to the frame in which
 * that read ended (the kernel ends a read right after the data that
 * carried them, and a sender attaches them to a frame's first byte). */
typedef struct kvd__fdgroup {
    uint64_t end; /* stream offset just past the read */
    int n;
    int fds[KVD_MAX_FDS_PER_FRAME];
    struct kvd__fdgroup *next;
} kvd__fdgroup_t;

#define KVD_CONN_GROUPS 64

typedef struct kvd__wbuf {
    uint8_t *buf;
    size_t len;
    size_t off;
    int nfds;
    int fds[2];
    struct kvd__wbuf *next;
} kvd__wbuf_t;

struct kvd__conn {
    uv_poll_t poll; /* shard 0's: the loop watches the socket */
    int fd;
    kvd__server_t *srv;
    struct kvd__shard *shard; /* whose epoll set has its socket */
    uint64_t id;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    /* its supplementary groups when it connected (SO_PEERGROUPS: fixed at
     * connect, unlike /proc/PID, which a reused pid answers for another
     * process); the first KVD_CONN_GROUPS of them */
    gid_t groups[KVD_CONN_GROUPS];
    uint32_t ngroups;
    char name[64];
    int hello_done;
    int admin;
    int closing;           /* no more I/O; waits for its in-flight work */
    int close_after_flush; /* stop reading; close once the replies are out */
    const char *close_reason; /* with close_after_flush: for the log */
    int handle_closing;    /* handed to its shard to be freed */
    uint32_t poll_events;  /* what its shard waits for now (EPOLLIN, EPOLLOUT) */
    int watched;           /* in its shard's epoll set */
    /* its I/O thread is in recvmsg into rbuf / sendmsg from wq without
     * the lock: no other thread frees or writes them meanwhile */
    int reading, writing;
    /* read side */
    uint8_t *rbuf;
    size_t rcap;
    size_t rstart; /* first unconsumed byte */
    size_t rlen;   /* bytes in rbuf */
    uint64_t rabs; /* stream offset of rbuf[0] */
    uint64_t rcharged; /* rbuf bytes counted as socket memory (past the first chunk) */
    /* the deadline that closes the connection: the hello's, or that of
     * the frame starting at deadline_frame (a stream offset); 0: none */
    uint64_t deadline_ns;
    uint64_t deadline_frame;
    int deadline_hello;
    kvd__fdgroup_t *fdq, *fdq_tail;
    /* write side */
    kvd__wbuf_t *wq, *wq_tail;
    size_t wq_bytes;
    /* accounting */
    uint32_t inflight; /* requests deferred to the backend, not completed */
    uint64_t requests;
    uint64_t active_period; /* the server's period in which it last sent one */
    kvd__owner_t owner;
    struct kvd__lease *leases; /* cache leases it holds (caches.h) */
    struct kvd__parked *parked; /* its requests waiting (park.h) */
    uint32_t nleases;
    uint64_t held; /* bytes of leases and requests charged to it (account.h) */
    /* its key area (keyarea.h; NULL: none), charged as socket memory */
    const uint8_t *karea;
    uint64_t karea_bytes;
    int karea_fd;
    kvd__conn_t *next, *prev;
    kvd__conn_t *ready_next;
    int in_ready;
    kvd__conn_t *flush_next; /* on a thread's list of queues to write */
    int flush_queued;
    kvd__conn_t *grave_next; /* on its I/O thread's list of connections to free */
};

struct ucred;

/* Whether the client is a member of group gid: its primary group or one
 * of its supplementary groups. */
int kvd__conn_in_group(const kvd__conn_t *c, gid_t gid);

/* Take over an accepted, non-blocking socket whose peer is cred
 * (SO_PEERCRED, read once by the caller to admit it). */
kvd_status_t kvd__conn_create(kvd__server_t *srv, int fd, const struct ucred *cred,
                              kvd__conn_t **out);

/* The client is gone or must go: release what it owns (memory goes once
 * its in-flight work has completed) and close the socket. */
void kvd__conn_close(kvd__conn_t *c, const char *reason);
/* Read nothing more; close (logging reason) once the requests in flight
 * have completed and every reply is written. */
void kvd__conn_close_after_flush(kvd__conn_t *c, const char *reason);

/* Queue msg as a frame, with descriptors (duplicated; the caller keeps its
 * own).  Dropped silently when the connection is closing.  KVD_ELIMIT: no
 * descriptor left for a duplicate; then nothing is queued. */
kvd_status_t kvd__conn_send(kvd__conn_t *c, const ProtobufCMessage *msg, const int *fds, int nfds);

/* Write what the queue holds, as far as the socket takes it; the rest
 * waits for the socket to be writable. */
void kvd__conn_flush(kvd__conn_t *c);

/* A request was deferred to the backend / completed. */
void kvd__conn_op_begin(kvd__conn_t *c);
void kvd__conn_op_end(kvd__conn_t *c);

/* Handle buffered frames (up to the per-event cap). */
void kvd__conn_process(kvd__conn_t *c);
/* Its socket is ready (epoll's events): write, read and handle frames. */
void kvd__conn_event(kvd__conn_t *c, uint32_t events);

/* The hello was accepted: the hello deadline no longer applies. */
void kvd__conn_hello_done(kvd__conn_t *c);
/* Close c if its deadline has passed at now_ns (the server's sweep). */
void kvd__conn_check_deadline(kvd__conn_t *c, uint64_t now_ns);

#endif
