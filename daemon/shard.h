/*
 * Shards: who waits on a connection's socket.  Shard 0 is the event
 * loop's thread, which watches its connections with libuv as it watches
 * everything else; with --io-threads N, shards 1..N each have a thread of
 * their own waiting on an epoll set, and take the connections in turn.
 *
 * The rule that keeps this simple: the daemon's state (connections,
 * registry, caches, budgets, the loop's handles) is touched only under
 * srv->mu, by whichever thread holds it, exactly as the one loop thread
 * touched it before.  The loop thread holds it while it runs libuv's
 * callbacks; an I/O thread holds it while it serves requests.  An I/O
 * thread lets go of it only to wait in epoll_wait, and around the
 * recvmsg and sendmsg of its own connections (the loop's thread around
 * the sendmsg of the replies it made, once libuv's run is over): those
 * system calls, most of a small request's cost, run on several cores at
 * once.  While one does, the connection is marked (reading, writing) so
 * that no other thread frees or writes what the call uses.  A connection
 * is freed only by its own shard, between two waits (kvd__shard_bury).
 * With --io-threads 0 no lock is taken.
 */
#ifndef KVD_DAEMON_SHARD_H
#define KVD_DAEMON_SHARD_H

#include <pthread.h>
#include <stdint.h>
#include <uv.h>

#include "server.h"

typedef struct kvd__shard {
    kvd__server_t *srv;
    unsigned index;
    int epfd;
    int wake_fd;      /* eventfd in epfd (I/O threads): wakes it from epoll_wait */
    int threaded;     /* has a thread of its own (else the loop's) */
    int asleep;       /* in epoll_wait, the lock let go (I/O threads) */
    int stop;
    int outside_loop; /* shard 0: the loop's thread writes replies outside libuv */
    pthread_t thread;
    int thread_started;
    kvd__conn_t *ready; /* its connections with frames left to handle */
    kvd__conn_t *to_flush; /* connections whose replies this shard's thread writes */
    kvd__conn_t *grave;    /* closed connections, freed between waits (I/O threads) */
    uint32_t nconns;
} kvd__shard_t;

/* The shard of the calling thread: the loop's thread is shard 0. */
extern __thread kvd__shard_t *kvd__shard_self;

/* Make the shards: shard 0, and with --io-threads the I/O threads' (not
 * yet started). */
kvd_status_t kvd__shards_init(kvd__server_t *srv, char *why, size_t why_len);
/* Start and stop the I/O threads (stop joins them: the loop has ended). */
kvd_status_t kvd__shards_start(kvd__server_t *srv, char *why, size_t why_len);
void kvd__shards_stop(kvd__server_t *srv);
/* Close the shards' descriptors (after stop). */
void kvd__shards_deinit(kvd__server_t *srv);

/* The shard a new connection goes to. */
kvd__shard_t *kvd__shard_pick(kvd__server_t *srv);
/* Wait on c's socket for events (EPOLLIN, EPOLLOUT; 0: none). */
void kvd__shard_watch(kvd__conn_t *c, uint32_t events);
/* c has frames buffered: its shard handles them before it waits again. */
void kvd__shard_kick(kvd__conn_t *c);
/* c has replies queued: the calling thread writes them before it lets go
 * of the lock (or, on the loop's thread, at the end of this loop phase). */
void kvd__shard_want_flush(kvd__conn_t *c);
/* c is closed and nothing of it is in flight: its shard frees it. */
void kvd__shard_bury(kvd__conn_t *c);
/* Whether the calling thread may let go of the lock around c's recvmsg
 * (c is its own and it is an I/O thread) or sendmsg (that, or it is the
 * loop's thread writing replies between two runs of libuv's loop). */
int kvd__shard_may_read_unlocked(const kvd__conn_t *c);
int kvd__shard_may_write_unlocked(const kvd__conn_t *c);

/* The loop thread's side: write queued replies, handle buffered frames
 * (the server calls these from its loop phases). */
void kvd__shard_flush_all(kvd__shard_t *s);
void kvd__shard_run_ready(kvd__shard_t *s);

#endif
