/*
 * The server: one libuv loop that owns the listening socket, the
 * connections (their socket I/O shared with I/O threads under srv->mu,
 * shard.h, when --io-threads asks), the backend, the registry and the
 * counters; signals and the drain on shutdown.
 */
#ifndef KVD_DAEMON_SERVER_H
#define KVD_DAEMON_SERVER_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>
#include <uv.h>

#include "account.h"
#include "backend.h"
#include "disk_io.h"
#include "hostmem.h"
#include "spin.h"
#include "log.h"
#include "options.h"
#include "registry.h"
#include "stats.h"

#define KVD_DAEMON_VERSION KVD_VERSION /* the project's (CMakeLists.txt) */

typedef struct kvd__conn kvd__conn_t;
typedef struct kvd__origin kvd__origin_t; /* dispatch.h */
/* A drop whose reply waits for the host memory it releases (server.c). */
typedef struct kvd__release_waiter kvd__release_waiter_t;

typedef struct kvd__server {
    uv_loop_t *loop;
    kvd__options_t opts;
    /* the daemon's state, with --io-threads (shard.h); unused without */
    pthread_mutex_t mu;
    unsigned nio;                /* I/O threads */
    unsigned next_shard;
    struct kvd__shard *shards;   /* [0]: the loop thread's; [1..nio]: the I/O threads' */
    uv_async_t loop_wake;        /* another thread changed what the loop waits for */
    int loop_asleep;             /* the loop waits in poll without the lock... */
    int loop_timeout;            /* ...this long (ms; -1: until woken) */
    int release_pending;         /* the last connection went on an I/O thread */
    int drain_pending;           /* a drain's end to check, seen on an I/O thread */
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int listen_fd;
    int listening;
    uv_poll_t listen_poll;
    uv_signal_t sig_term;
    uv_signal_t sig_int;
    uv_idle_t idle;        /* runs connections with buffered frames */
    uv_idle_t spin;        /* busy-poll window: keeps the loop from sleeping */
    uv_prepare_t flush_prepare; /* write queued replies before the loop polls... */
    uv_check_t flush_check;     /* ...and after the I/O callbacks of a poll */
    uint64_t spin_until_ns;
    kvd__spin_t poll_window; /* how long the loop polls after activity (proto/src/spin.h) */
    uint64_t last_activity_ns; /* the last request read or reply queued */
    kvd__conn_t *spin_conn;    /* read by the polling loop first (no I/O threads) */
    /* clients that sent requests: in the period begun at active_since_ns
     * (1 ms), and in the one before */
    uint64_t active_since_ns, active_period;
    uint32_t active_now, active_before;
    uv_timer_t drain_timer;
    kvd__backend_t *backend;
    kvd__hostmem_t hostmem; /* the host-memory budget (hostmem.h) */
    uint64_t mem_total;    /* the machine's memory (or its cgroup's limit) at start */
    int spare_fd;          /* held open so that a connection can be accepted and
                            * refused when the descriptors run out; -1 if none */
    uv_timer_t accept_backoff; /* accepting paused: no descriptor to refuse with */
    kvd__ratelimit_t accept_log;
    uv_timer_t sweep;      /* closes connections past their hello or frame deadline */
    uv_timer_t watchdog;   /* WATCHDOG=1 to systemd, from the loop: a stuck loop is seen */
    kvd__registry_t reg;
    kvd__stats_t stats;
    struct kvd__metrics *metrics; /* the Prometheus endpoint (--metrics), or NULL */
    int activated;         /* the listening socket came from systemd: not ours to unlink */
    kvd__conn_t *conns;     /* open connections */
    uint32_t nconns;
    uint64_t karea_bytes;   /* the key areas of all connections (keyarea.h) */
    struct kvd__waitq *woken; /* queues of waiting requests to run (park.h) */
    uint64_t next_client_id;
    struct kvd__cache *caches; /* the cache tier's caches (caches.h) */
    struct kvd__cache *caches_opening; /* made, their disk directories not yet */
    struct kvd__cluster *cluster; /* the daemon's peers (cluster.h), or NULL */
    uint64_t next_cache_id, next_lease_id;
    uint64_t start_ns;
    uint32_t inflight;     /* requests submitted to the backend, not completed */
    uid_t uid;
    int shutting_down;
    int cancelled;
    uint64_t shutdown_ns;
    int handles_open;      /* handles still to close before the loop ends */
    int mem_works;         /* host memory made or released on the thread pool
                            * (cache slabs, pools, buffers) */
    kvd__release_waiter_t *release_waiter; /* the drop being handled, if any */
    /* the disk level (--cache-dir): one I/O engine for every cache, its
     * completions run on the loop when disk_async is sent */
    kvd__disk_io_t *disk_io;
    uv_async_t disk_async;
    int disk_async_open;
    uint64_t disk_budget;         /* --disk-budget in bytes */
    char disk_engine[256];        /* "io_uring", or "threads (WHY)" */
    int disk_direct;              /* O_DIRECT taken by cache-dir's file system */
    char disk_direct_why[200];    /* why not */
    uint32_t disk_removals;       /* dropped caches' directories being removed */
    struct kvd__skipped_cache *skipped; /* directories not reopened at start (caches.h):
                                         * the first KVD_SKIPPED_KEPT */
    uint32_t n_skipped_kept, n_skipped; /* kept, and all of them */
    int releasing_backend; /* at the end: memory is freed at once, not on threads */
    int arena_first_busy;  /* a request's arena has arena_first */
    _Alignas(16) uint8_t arena_first[KVD_ARENA_FIRST]; /* its first chunk (account.h) */
} kvd__server_t;

/* Set up everything (backend, socket) without running; on error nothing
 * is left behind and why says what failed. */
kvd_status_t kvd__server_create(uv_loop_t *loop, const kvd__options_t *opts, kvd__server_t **out,
                                char *why, size_t why_len);
/* Run until shut down; returns the process exit status. */
int kvd__server_run(kvd__server_t *srv);
void kvd__server_destroy(kvd__server_t **srv);

/* Stop accepting, answer what is pending, then stop the loop.  drain:
 * let queued work finish (else it is cancelled with ESHUTDOWN). */
void kvd__server_begin_shutdown(kvd__server_t *srv, int drain, const char *why);
/* Something for the idle turn (woken waiting requests, shard 0's
 * buffered frames): the loop runs it on its next iteration. */
void kvd__server_want_idle(kvd__server_t *srv);
/* The loop thread has replies to write (shard 0's list): written at the
 * end of this loop phase, together with whatever else the phase queues
 * (the replies to one read, or to one round of completions, in one
 * sendmsg). */
void kvd__server_flush_soon(kvd__server_t *srv);
/* Run the loop's next iteration soon, from an I/O thread (a drain's end
 * to check, the last connection gone). */
void kvd__server_wake_loop(kvd__server_t *srv);
/* An I/O thread takes and lets go of the state's lock; letting go wakes
 * the loop if what it waits for changed meanwhile (a timer, an idle
 * handle).  Without I/O threads, nothing. */
void kvd__server_take(kvd__server_t *srv);
void kvd__server_let_go(kvd__server_t *srv);
/* A request came in or a reply went out: with --busy-poll-us the loop
 * polls without sleeping until that long after the last such moment, so
 * the next request is taken without a wake-up from sleep. */
void kvd__server_activity(kvd__server_t *srv);
/* A connection has a deadline or a lease: the timer that ends them runs
 * until none has. */
void kvd__server_sweep_arm(kvd__server_t *srv);
/* c sent a request: it counts among the busy clients (busy polling pays
 * only while they are fewer than the cores). */
void kvd__server_client_active(kvd__server_t *srv, kvd__conn_t *c);
/* Called by a connection in its close callback, before it is freed. */
void kvd__server_conn_gone(kvd__server_t *srv, kvd__conn_t *conn);
/* A request finished (completion or reply): check for the end of a drain. */
void kvd__server_check_drained(kvd__server_t *srv);
/* Host memory made or released on the thread pool came back: at the end
 * the backend waits for the last one. */
void kvd__server_mem_work_done(kvd__server_t *srv);

/* Destroy host memory mem on the thread pool, then give bytes of the
 * budget's kind back (at the very end: here and now). */
void kvd__server_host_release(kvd__server_t *srv, kvd__mem_t *mem, int kind, uint64_t bytes);

/* A drop request (of o) about to release an object: when that releases
 * host memory off the loop, the reply to o waits until the memory is gone
 * (so that the client's next request finds the budget free again) and
 * kvd__server_drop_wait_end returns 1; else 0 and the caller replies. */
void kvd__server_drop_wait_begin(const kvd__origin_t *o);
int kvd__server_drop_wait_end(kvd__server_t *srv);

/* Peer permission from the config: may connect (fd the peer's socket, for
 * its supplementary groups), is admin. */
int kvd__server_peer_allowed(const kvd__server_t *srv, int fd, uid_t uid, gid_t gid);
int kvd__server_peer_admin(const kvd__server_t *srv, uid_t uid);

#endif
