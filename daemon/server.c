/*
 * The server: the listening socket (created safely), accepting and
 * authenticating peers, signals, and the drain on shutdown.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_disk.h"
#include "disk_store.h"
#include "caches.h"
#include "cluster.h"
#include "conn.h"
#include "dispatch.h"
#include "spin.h"
#include "wire.h"
#include "log.h"
#include "park.h"
#include "metrics.h"
#include "shard.h"
#include "systemd.h"

#define ACCEPTS_PER_EVENT 64
#define ACCEPT_BACKOFF_MS 100
#define FLUSH_GRACE_NS (2ull * 1000000000ull)
/* Past the drain timeout, work still on a device stream can only be waiting
 * for something that will not come (an event no one records): give it this
 * long, then exit without it rather than hang. */
#define ABANDON_GRACE_NS (5ull * 1000000000ull)

/* ---- peers ------------------------------------------------------------- */

/*
 * A peer's groups are its primary gid and the supplementary groups it had
 * when it connected (SO_PEERGROUPS: fixed by connect, as SO_PEERCRED is,
 * whatever the process does or becomes after).  Not /proc/PID/status: by
 * the time it is read, the pid may have exited and been reused by another
 * user's process, and the installed unit's ProtectProc=invisible hides
 * other users' processes anyway.  A kernel without SO_PEERGROUPS (before
 * 4.13): the primary group alone.
 */
int kvd__server_peer_allowed(const kvd__server_t *srv, int fd, uid_t uid, gid_t gid)
{
    gid_t small[64], *groups = small;
    socklen_t len = sizeof(small);
    int ok = 0;

    if (uid == srv->uid || uid == 0 || kvd__options_id_listed(srv->opts.allow_uids, uid) ||
        kvd__options_group_admitted(&srv->opts, gid))
        return 1;
    if (srv->opts.socket_gid < 0 && srv->opts.allow_gids[0] == '\0')
        return 0;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) != 0) {
        if (errno != ERANGE || (groups = malloc(len)) == NULL)
            return 0;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) != 0) {
            free(groups);
            return 0;
        }
    }
    for (size_t i = 0; i < len / sizeof(gid_t) && !ok; i++)
        ok = kvd__options_group_admitted(&srv->opts, groups[i]);
    if (groups != small)
        free(groups);
    return ok;
}

int kvd__server_peer_admin(const kvd__server_t *srv, uid_t uid)
{
    return uid == srv->uid || uid == 0 || kvd__options_id_listed(srv->opts.admin_uids, uid);
}

/* The calling thread is an I/O thread (shard.h), not the loop's. */
static int on_io_thread(void)
{
    return kvd__shard_self != NULL && kvd__shard_self->threaded;
}

/* Best effort: one error frame to a peer we will not serve, then close. */
static void refuse(int fd, kvd_status_t st, const char *msg)
{
    Kvdock__Response resp = KVDOCK__RESPONSE__INIT;
    uint8_t *frame;
    size_t len;

    resp.status = (uint32_t)st;
    resp.message = (char *)msg;
    if (kvd__frame_pack(&resp.base, &frame, &len) == KVD_OK) {
        ssize_t n = send(fd, frame, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)n;
        free(frame);
    }
    close(fd);
}

static void on_accept(uv_poll_t *h, int status, int events);

static void open_spare(kvd__server_t *srv)
{
    if (srv->spare_fd < 0)
        srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void backoff_cb(uv_timer_t *t)
{
    kvd__server_t *srv = t->data;

    open_spare(srv);
    if (srv->listening && !srv->shutting_down)
        uv_poll_start(&srv->listen_poll, UV_READABLE, on_accept);
}

/*
 * accept failed with EMFILE or ENFILE: the connection stays in the backlog
 * and the socket stays readable, so returning would spin.  As libuv and
 * nginx do, give up the spare descriptor, accept the connection with it,
 * tell the client why and close it; with no spare to give up, stop
 * accepting for a moment.  Returns 1 when a connection was taken off the
 * backlog.
 */
static int shed_connection(kvd__server_t *srv, int err)
{
    uint64_t held = 0;
    int fd = -1;

    if (srv->spare_fd >= 0) {
        close(srv->spare_fd);
        srv->spare_fd = -1;
        fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0)
            refuse(fd, KVD_ELIMIT, "kvdockd has no file descriptor left for this connection "
                   "(RLIMIT_NOFILE); try again when other clients have gone");
        open_spare(srv);
    }
    srv->stats.refused_no_fd += fd >= 0;
    if (kvd__ratelimit_take(&srv->accept_log, kvd__now_ns(), &held))
        kvd_log(KVD_LOG_WARN, "event=accept_no_descriptors error=\"%s\" action=%s "
                "repeated=%" PRIu64, strerror(err), fd >= 0 ? "refused" : "paused", held);
    if (fd >= 0)
        return 1;
    uv_poll_stop(&srv->listen_poll);
    uv_timer_start(&srv->accept_backoff, backoff_cb, ACCEPT_BACKOFF_MS, 0);
    return 0;
}

static void on_accept(uv_poll_t *h, int status, int events)
{
    kvd__server_t *srv = h->data;
    int i;

    if (status < 0 || srv->shutting_down)
        return;
    for (i = 0; i < ACCEPTS_PER_EVENT; i++) {
        struct ucred cred;
        socklen_t len = sizeof(cred);
        kvd__conn_t *c;
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                if (shed_connection(srv, errno))
                    continue;
                break;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED) {
                uint64_t held = 0;
                if (kvd__ratelimit_take(&srv->accept_log, kvd__now_ns(), &held))
                    kvd_log(KVD_LOG_WARN, "event=accept_error error=\"%s\" repeated=%" PRIu64,
                            strerror(errno), held);
            }
            break;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
            close(fd);
            continue;
        }
        if (!kvd__server_peer_allowed(srv, fd, cred.uid, cred.gid)) {
            kvd_log(KVD_LOG_WARN, "event=peer_refused pid=%d uid=%u gid=%u", (int)cred.pid,
                    (unsigned)cred.uid, (unsigned)cred.gid);
            refuse(fd, KVD_EPERM, "this user may not connect to kvdockd "
                   "(allow-uids, allow-gids, socket-group)");
            continue;
        }
        if (srv->nconns >= srv->opts.max_clients) {
            kvd_log(KVD_LOG_WARN, "event=peer_refused pid=%d reason=max_clients",
                    (int)cred.pid);
            refuse(fd, KVD_ELIMIT, "too many clients (max-clients)");
            continue;
        }
        if (kvd__conn_create(srv, fd, &cred, &c) != KVD_OK) {
            close(fd);
            continue;
        }
        srv->stats.connections++;
        kvd_log(KVD_LOG_INFO, "event=conn_open client=%" PRIu64 " pid=%d uid=%u admin=%d", c->id,
                (int)c->pid, (unsigned)c->uid, c->admin);
    }
}

/* ---- the socket -------------------------------------------------------- */

static kvd_status_t prepare_dir(const char *path, gid_t gid, int have_group, char *why,
                                size_t why_len)
{
    char copy[sizeof(((struct sockaddr_un *)0)->sun_path)];
    const char *dir;
    struct stat st;
    mode_t mode = have_group ? 0750 : 0700;

    snprintf(copy, sizeof(copy), "%s", path);
    dir = dirname(copy);
    if (mkdir(dir, mode) == 0) {
        /* ours: the mode exactly as wanted, whatever the umask */
        if (chmod(dir, mode) != 0 || (have_group && chown(dir, (uid_t)-1, gid) != 0)) {
            snprintf(why, why_len, "%s: %s", dir, strerror(errno));
            return KVD_EIO;
        }
        return KVD_OK;
    }
    if (errno != EEXIST) {
        snprintf(why, why_len, "cannot create socket directory %s: %s", dir, strerror(errno));
        return KVD_EIO;
    }
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(why, why_len, "%s is not a directory", dir);
        return KVD_EINVAL;
    }
    if (st.st_uid != getuid() && st.st_uid != 0) {
        snprintf(why, why_len, "socket directory %s belongs to uid %u, not to us", dir,
                 (unsigned)st.st_uid);
        return KVD_EPERM;
    }
    if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) {
        snprintf(why, why_len, "socket directory %s is world-writable", dir);
        return KVD_EPERM;
    }
    /* an existing directory is left as it is (it may be shared): say when
     * the group named cannot get through it */
    if (have_group && !(st.st_mode & S_IXOTH) && (st.st_gid != gid || !(st.st_mode & S_IXGRP)))
        kvd_log(KVD_LOG_WARN, "event=socket_dir_closed_to_group dir=%s mode=%04o gid=%u "
                "socket_gid=%u hint=\"members of the socket group cannot reach the socket: "
                "chgrp %u %s && chmod g+x %s, or remove the directory\"", dir,
                (unsigned)(st.st_mode & 07777), (unsigned)st.st_gid, (unsigned)gid,
                (unsigned)gid, dir, dir);
    if (st.st_mode & (S_IXOTH | S_IWOTH))
        kvd_log(KVD_LOG_WARN, "event=socket_dir_open dir=%s mode=%04o hint=\"others can enter "
                "it; the socket itself is 0660\"", dir, (unsigned)(st.st_mode & 07777));
    return KVD_OK;
}

/* A socket already at path: replace it only if nothing answers on it. */
static kvd_status_t clear_stale(const char *path, char *why, size_t why_len)
{
    struct stat st;
    struct sockaddr_un sa;
    int fd, rc;

    if (lstat(path, &st) != 0)
        return KVD_OK; /* nothing there */
    if (S_ISDIR(st.st_mode)) {
        snprintf(why, why_len, "%s is a directory: --socket names the socket file itself (such "
                 "as %s/kvdockd.sock)", path, path);
        return KVD_EEXIST;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(why, why_len, "%s exists and is not a socket", path);
        return KVD_EEXIST;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, why_len, "socket: %s", strerror(errno));
        return KVD_EIO;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    close(fd);
    if (rc == 0) {
        snprintf(why, why_len, "another daemon is answering on %s", path);
        return KVD_EBUSY;
    }
    if (errno != ECONNREFUSED) {
        snprintf(why, why_len, "cannot tell whether %s is in use: %s", path, strerror(errno));
        return KVD_EBUSY;
    }
    kvd_log(KVD_LOG_INFO, "event=stale_socket_removed path=%s", path);
    if (unlink(path) != 0 && errno != ENOENT) {
        snprintf(why, why_len, "cannot remove stale %s: %s", path, strerror(errno));
        return KVD_EIO;
    }
    return KVD_OK;
}

static kvd_status_t open_listener(kvd__server_t *srv, char *why, size_t why_len)
{
    struct sockaddr_un sa;
    gid_t gid = (gid_t)-1;
    int have_group = srv->opts.socket_group[0] != '\0';
    kvd_status_t st;
    mode_t old;
    int fd;

    if (srv->opts.socket[0] != '\0') {
        if (strlen(srv->opts.socket) >= sizeof(srv->socket_path)) {
            snprintf(why, why_len, "socket path longer than %zu bytes",
                     sizeof(srv->socket_path) - 1);
            return KVD_ERANGE;
        }
        snprintf(srv->socket_path, sizeof(srv->socket_path), "%s", srv->opts.socket);
    } else if (kvd__socket_path_resolve(srv->socket_path, sizeof(srv->socket_path), NULL) !=
               KVD_OK) {
        snprintf(why, why_len, "default socket path does not fit");
        return KVD_ERANGE;
    }
    if (have_group) {
        char *end;
        struct group *gr = getgrnam(srv->opts.socket_group);
        if (gr != NULL) {
            gid = gr->gr_gid;
        } else {
            unsigned long v = strtoul(srv->opts.socket_group, &end, 10);
            if (*end != '\0') {
                snprintf(why, why_len, "no group '%s'", srv->opts.socket_group);
                return KVD_EINVAL;
            }
            gid = (gid_t)v;
        }
    }
    if ((st = prepare_dir(srv->socket_path, gid, have_group, why, why_len)) != KVD_OK)
        return st;
    if ((st = clear_stale(srv->socket_path, why, why_len)) != KVD_OK)
        return st;

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, why_len, "socket: %s", strerror(errno));
        return KVD_EIO;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", srv->socket_path);
    old = umask(0177); /* never reachable by others, not even briefly */
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        umask(old);
        snprintf(why, why_len, "bind %s: %s", srv->socket_path, strerror(errno));
        close(fd);
        return errno == EADDRINUSE ? KVD_EBUSY : KVD_EIO;
    }
    umask(old);
    if ((have_group && chown(srv->socket_path, (uid_t)-1, gid) != 0) ||
        chmod(srv->socket_path, 0660) != 0 || listen(fd, 512) != 0) {
        snprintf(why, why_len, "%s: %s", srv->socket_path, strerror(errno));
        unlink(srv->socket_path);
        close(fd);
        return KVD_EIO;
    }
    srv->listen_fd = fd;
    return KVD_OK;
}

/* ---- shutdown ---------------------------------------------------------- */

static void handle_closed_cb(uv_handle_t *h)
{
    kvd__server_t *srv = h->data;

    srv->handles_open--;
}

static void backend_gone_cb(void *arg)
{
    kvd__server_t *srv = arg;

    srv->backend = NULL;
}

/* A drop whose reply waits for the host memory it releases: the
 * releases it starts share it, and the last to end replies. */
struct kvd__release_waiter {
    kvd__origin_t origin;
    uint32_t pending; /* releases still running */
};

/* A dropped pool's or buffer's host memory, unmapped (and unpinned) on
 * the thread pool: half a GiB takes tens of ms, which on the loop every
 * client would wait for.  The budget counts it until it is gone. */
typedef struct host_release_work {
    uv_work_t w;
    kvd__server_t *srv;
    kvd__mem_t *mem;
    int kind;
    uint64_t bytes;
    kvd__release_waiter_t *waiter; /* NULL: none */
} host_release_work_t;

void kvd__server_drop_wait_begin(const kvd__origin_t *o)
{
    kvd__release_waiter_t *w = calloc(1, sizeof(*w));

    if (w != NULL) /* else the drop answers at once */
        w->origin = *o;
    o->srv->release_waiter = w;
}

int kvd__server_drop_wait_end(kvd__server_t *srv)
{
    kvd__release_waiter_t *w = srv->release_waiter;
    int taken = w != NULL && w->pending > 0;

    srv->release_waiter = NULL;
    if (w != NULL && !taken)
        free(w);
    else if (taken)
        kvd__conn_op_begin(w->origin.conn);
    return taken;
}

static void host_release_run(uv_work_t *w)
{
    host_release_work_t *hw = w->data;

    hw->srv->backend->mem_destroy(hw->srv->backend, &hw->mem);
}

static void host_release_end(uv_work_t *w, int status)
{
    host_release_work_t *hw = w->data;
    kvd__server_t *srv = hw->srv;

    if (hw->mem != NULL) /* cancelled before it ran */
        srv->backend->mem_destroy(srv->backend, &hw->mem);
    kvd__hostmem_release(&srv->hostmem, hw->kind, hw->bytes);
    if (hw->waiter != NULL && --hw->waiter->pending == 0) {
        Kvdock__Response resp = KVDOCK__RESPONSE__INIT;
        kvd__release_waiter_t *rw = hw->waiter;

        kvd__reply_deferred_response(&rw->origin, &resp);
        kvd__conn_op_end(rw->origin.conn);
        free(rw);
    }
    free(hw);
    kvd__server_mem_work_done(srv);
}

static void host_release(void *ctx, kvd__mem_t *mem, int kind, uint64_t bytes)
{
    kvd__server_host_release(ctx, mem, kind, bytes);
}

void kvd__server_host_release(kvd__server_t *srv, kvd__mem_t *mem, int kind, uint64_t bytes)
{
    host_release_work_t *hw = srv->releasing_backend ? NULL : calloc(1, sizeof(*hw));

    if (hw != NULL) {
        hw->w.data = hw;
        hw->srv = srv;
        hw->mem = mem;
        hw->kind = kind;
        hw->bytes = bytes;
        if (uv_queue_work(srv->loop, &hw->w, host_release_run, host_release_end) == 0) {
            srv->mem_works++;
            if (srv->release_waiter != NULL) {
                hw->waiter = srv->release_waiter;
                hw->waiter->pending++;
            }
            return;
        }
        free(hw);
    }
    srv->backend->mem_destroy(srv->backend, &mem); /* here, then */
    kvd__hostmem_release(&srv->hostmem, kind, bytes);
}

/* ---- the disk level -------------------------------------------------------- */

/* The engine's completions (any thread): the loop runs them. */
static void disk_notify(void *arg)
{
    kvd__server_t *srv = arg;

    uv_async_send(&srv->disk_async);
}

static void disk_async_cb(uv_async_t *h)
{
    kvd__server_t *srv = h->data;

    if (srv->disk_io != NULL)
        kvd__disk_io_poll(srv->disk_io);
}

static void handle_closed_cb(uv_handle_t *h);

/* The engine goes once every cache is closed: it waits for what is still
 * submitted (directory removals) and runs their completions. */
static void disk_stop(kvd__server_t *srv)
{
    kvd__disk_io_destroy(&srv->disk_io);
    if (srv->disk_async_open) {
        srv->disk_async_open = 0;
        if (srv->loop != NULL && !uv_is_closing((uv_handle_t *)&srv->disk_async)) {
            srv->disk_async.data = srv;
            srv->handles_open++;
            uv_close((uv_handle_t *)&srv->disk_async, handle_closed_cb);
        }
    }
}

/*
 * --cache-dir at start: the directory checked (made 0700 when missing),
 * --disk-budget against the space the disk level has there (the file
 * system's free space plus what its caches hold already: a restart counts
 * its own blocks as its own), then the I/O engine; all before a client is
 * served.  Each failure stops the start with why.
 */
static kvd_status_t disk_start(kvd__server_t *srv, char *why, size_t why_len)
{
    const char *dir = srv->opts.cache_dir;
    const kvd__memsize_t *m = &srv->opts.disk_budget;
    kvd__disk_io_config_t cfg;
    uint64_t avail = 0, total = 0, held, space;
    char engine_why[200] = "", a[32], b[32], c[32], d[32];
    int created = 0;
    kvd_status_t st;

    if (dir[0] == '\0')
        return KVD_OK;
    if ((st = kvd__cache_dir_check(dir, &created, why, why_len)) != KVD_OK)
        return st;
    if (kvd__cache_dir_space(dir, &avail, &total, why, why_len) != 0)
        return KVD_EIO;
    held = kvd__cache_dir_usage(dir);
    space = avail + held;
    srv->disk_budget = kvd__memsize_bytes(m, space);
    if (m->percent == 0 && srv->disk_budget > space) {
        snprintf(why, why_len, "disk-budget %s is more than the disk level has in %s: %s free "
                 "on its file system plus %s its caches hold already",
                 kvd__fmt_bytes(srv->disk_budget, a, sizeof(a)), dir,
                 kvd__fmt_bytes(avail, b, sizeof(b)), kvd__fmt_bytes(held, c, sizeof(c)));
        return KVD_ELIMIT;
    }
    if (uv_async_init(srv->loop, &srv->disk_async, disk_async_cb) != 0) {
        snprintf(why, why_len, "uv_async_init failed");
        return KVD_EIO;
    }
    srv->disk_async.data = srv;
    srv->disk_async_open = 1;
    memset(&cfg, 0, sizeof(cfg));
    cfg.notify = disk_notify;
    cfg.notify_arg = srv;
    cfg.force_threads = srv->opts.disk_io == KVD_DISK_IO_THREADS;
    cfg.prep_threads = (unsigned)srv->opts.disk_threads;
    cfg.threads = (unsigned)srv->opts.disk_threads;
    if ((st = kvd__disk_io_create(&srv->disk_io, &cfg, engine_why, sizeof(engine_why))) != KVD_OK) {
        snprintf(why, why_len, "the disk I/O engine: %s", engine_why);
        return st;
    }
    if (srv->opts.disk_io == KVD_DISK_IO_URING &&
        strcmp(kvd__disk_io_engine(srv->disk_io), "io_uring") != 0) {
        snprintf(why, why_len, "disk-io io_uring: %s", engine_why);
        return KVD_ENOTSUP;
    }
    if (strcmp(kvd__disk_io_engine(srv->disk_io), "io_uring") == 0)
        snprintf(srv->disk_engine, sizeof(srv->disk_engine), "io_uring");
    else
        snprintf(srv->disk_engine, sizeof(srv->disk_engine), "threads (%s)",
                 engine_why[0] ? engine_why : "asked for");
    srv->disk_direct = kvd__disk_probe_direct(dir, srv->disk_direct_why,
                                              sizeof(srv->disk_direct_why));
    kvd_log(KVD_LOG_INFO, "event=disk_level dir=%s created=%d budget=%" PRIu64 " fs_free=%" PRIu64
            " fs_total=%" PRIu64 " held=%" PRIu64 " io_engine=\"%s\" depth=%u cpu_threads=%u "
            "direct=%d", dir, created, srv->disk_budget, avail, total, held, srv->disk_engine,
            kvd__disk_io_depth(srv->disk_io), kvd__disk_io_cpu_threads(srv->disk_io),
            srv->disk_direct);
    if (!srv->disk_direct)
        kvd_log(KVD_LOG_WARN, "event=disk_direct_refused dir=%s reason=\"%s\" action=\"writes "
                "go through the page cache\"", dir, srv->disk_direct_why);
    if (srv->disk_budget > avail)
        kvd_log(KVD_LOG_INFO, "event=disk_budget_held budget=\"%s\" fs_free=\"%s\" "
                "held=\"%s\"", kvd__fmt_bytes(srv->disk_budget, a, sizeof(a)),
                kvd__fmt_bytes(avail, b, sizeof(b)), kvd__fmt_bytes(held, d, sizeof(d)));
    return KVD_OK;
}

static void close_handle(kvd__server_t *srv, uv_handle_t *h)
{
    if (!uv_is_closing(h)) {
        h->data = srv;
        srv->handles_open++;
        uv_close(h, handle_closed_cb);
    }
}

/* At the end: shared pools outlive their creators, so they are released
 * here, while the backend that made their memory still exists; then the
 * backend goes. */
static void release_backend(kvd__server_t *srv)
{
    if (srv->backend == NULL || srv->mem_works > 0) /* the last one's end calls again */
        return;
    srv->releasing_backend = 1; /* what is freed now is freed here: the backend goes next */
    close_handle(srv, (uv_handle_t *)&srv->loop_wake);
    kvd__park_run_woken(srv); /* queues woken last: their holds on caches go */
    kvd__caches_destroy(srv);
    disk_stop(srv); /* after the caches: their disk levels close on it */
    kvd__registry_deinit(&srv->reg);
    srv->backend->destroy(srv->backend, backend_gone_cb, srv);
}

static void stop_listening(kvd__server_t *srv)
{
    if (!srv->listening)
        return;
    srv->listening = 0;
    close_handle(srv, (uv_handle_t *)&srv->listen_poll);
    uv_timer_stop(&srv->accept_backoff);
    close(srv->listen_fd);
    srv->listen_fd = -1;
    if (srv->spare_fd >= 0)
        close(srv->spare_fd);
    srv->spare_fd = -1;
    if (!srv->activated && unlink(srv->socket_path) != 0 && errno != ENOENT)
        kvd_log(KVD_LOG_WARN, "event=unlink_failed path=%s error=\"%s\"", srv->socket_path,
                strerror(errno));
}

static void finish(kvd__server_t *srv)
{
    kvd__conn_t *c, *next;

    srv->shutting_down = 2; /* finishing: no re-entry */
    kvd__cluster_close(srv->cluster); /* before the caches its pulls write into go */
    for (c = srv->conns; c; c = next) {
        next = c->next;
        kvd__conn_close(c, "daemon shutting down");
    }
    uv_timer_stop(&srv->drain_timer);
    close_handle(srv, (uv_handle_t *)&srv->drain_timer);
    close_handle(srv, (uv_handle_t *)&srv->sweep);
    close_handle(srv, (uv_handle_t *)&srv->watchdog);
    close_handle(srv, (uv_handle_t *)&srv->accept_backoff);
    close_handle(srv, (uv_handle_t *)&srv->sig_term);
    close_handle(srv, (uv_handle_t *)&srv->sig_int);
    close_handle(srv, (uv_handle_t *)&srv->idle);
    close_handle(srv, (uv_handle_t *)&srv->spin);
    close_handle(srv, (uv_handle_t *)&srv->flush_prepare);
    close_handle(srv, (uv_handle_t *)&srv->flush_check);
    kvd__metrics_close(srv->metrics);
    if (srv->conns == NULL)
        release_backend(srv);
    kvd_log(KVD_LOG_INFO, "event=shutdown_done");
}

static int writes_pending(const kvd__server_t *srv)
{
    const kvd__conn_t *c;

    for (c = srv->conns; c; c = c->next)
        if (!c->closing && c->wq != NULL)
            return 1;
    return 0;
}

void kvd__server_mem_work_done(kvd__server_t *srv)
{
    /* finish() found no connection left and deferred to this */
    if (--srv->mem_works == 0 && srv->shutting_down == 2 && srv->conns == NULL)
        release_backend(srv);
}

void kvd__server_check_drained(kvd__server_t *srv)
{
    uint64_t now;

    if (srv->shutting_down != 1)
        return;
    if (on_io_thread()) { /* the end runs on the loop's thread */
        srv->drain_pending = 1;
        kvd__server_wake_loop(srv);
        return;
    }
    if (srv->inflight > 0)
        return;
    now = kvd__now_ns();
    if (writes_pending(srv) && now - srv->shutdown_ns < FLUSH_GRACE_NS +
                                   srv->opts.shutdown_timeout_ms * 1000000ull)
        return;
    finish(srv);
}

static void drain_timer_cb(uv_timer_t *t)
{
    kvd__server_t *srv = t->data;
    uint64_t elapsed = kvd__now_ns() - srv->shutdown_ns;

    if (!srv->cancelled && elapsed >= srv->opts.shutdown_timeout_ms * 1000000ull) {
        srv->cancelled = 1;
        kvd_log(KVD_LOG_WARN, "event=drain_timeout inflight=%u action=cancel_not_started",
                srv->inflight);
        srv->backend->cancel_pending(srv->backend);
    }
    if (srv->inflight > 0 &&
        elapsed >= srv->opts.shutdown_timeout_ms * 1000000ull + ABANDON_GRACE_NS) {
        /* The socket is already gone; the driver reclaims the streams and
         * the memory when the process ends.  _exit: no teardown that would
         * wait for those streams. */
        kvd_log(KVD_LOG_ERROR,
                "event=drain_abandoned inflight=%u reason=\"queued device work did not finish "
                "(waiting on an event that is never recorded?)\" status=1",
                srv->inflight);
        (void)kvd__sd_notify("STATUS=exiting with unfinished device work");
        _exit(1);
    }
    kvd__server_check_drained(srv);
}

void kvd__server_begin_shutdown(kvd__server_t *srv, int drain, const char *why)
{
    if (srv->shutting_down) {
        if (!drain && !srv->cancelled) {
            srv->cancelled = 1;
            srv->backend->cancel_pending(srv->backend);
        }
        return;
    }
    kvd_log(KVD_LOG_INFO, "event=shutdown_begin reason=\"%s\" drain=%d inflight=%u", why, drain,
            srv->inflight);
    srv->shutting_down = 1;
    kvd__caches_wake_waiting(srv); /* waiting requests hear that it stops */
    (void)kvd__sd_notify("STOPPING=1\nSTATUS=draining in-flight work");
    srv->shutdown_ns = kvd__now_ns();
    stop_listening(srv);
    if (!drain) {
        srv->cancelled = 1;
        srv->backend->cancel_pending(srv->backend);
    }
    srv->drain_timer.data = srv;
    uv_timer_start(&srv->drain_timer, drain_timer_cb, 5, 5);
    kvd__server_check_drained(srv);
}

static void signal_cb(uv_signal_t *h, int signum)
{
    kvd__server_t *srv = h->data;

    /* a second signal stops waiting for queued work */
    kvd__server_begin_shutdown(srv, srv->shutting_down ? 0 : 1,
                               signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ---- connections with frames left -------------------------------------- */

static void idle_cb(uv_idle_t *h)
{
    kvd__server_t *srv = h->data;

    kvd__park_run_woken(srv);
    kvd__shard_run_ready(&srv->shards[0]);
    if (srv->shards[0].ready == NULL && srv->woken == NULL)
        uv_idle_stop(&srv->idle);
}

void kvd__server_want_idle(kvd__server_t *srv)
{
    if (srv->shutting_down != 2)
        uv_idle_start(&srv->idle, idle_cb);
}

/* ---- busy polling -------------------------------------------------------- */

#define ACTIVE_PERIOD_NS 1000000ull

/* An active idle handle makes each loop iteration poll with a zero
 * timeout; stopping it lets the loop sleep in epoll again.  The loop stops
 * polling at the end of the window, or as soon as threads wait for a core
 * (its polling would delay the clients whose requests it polls for). */
static void spin_cb(uv_idle_t *h)
{
    kvd__server_t *srv = h->data;
    uint64_t now = kvd__now_ns();
    kvd__conn_t *c = srv->spin_conn;

    if (now >= srv->spin_until_ns || !kvd__spin_cores_free(now)) {
        uv_idle_stop(&srv->spin);
        return;
    }
    /* A client with nothing in flight likely waits to send its next
     * request: its socket is read here, before the loop's zero-timeout
     * epoll_wait, so that the request costs no epoll round and its reply
     * leaves in this same iteration.  One that pipelines is left to epoll,
     * whose later read takes its requests in bulk, and one with frames
     * still buffered to its turn (--reqs-per-event). */
    if (c != NULL && c->inflight == 0 && !c->in_ready && (c->poll_events & EPOLLIN))
        kvd__conn_event(c, EPOLLIN);
}

/* Clients that sent a request in this period or the last. */
static uint32_t clients_active(kvd__server_t *srv, uint64_t now)
{
    if (now - srv->active_since_ns >= ACTIVE_PERIOD_NS) {
        srv->active_before = now - srv->active_since_ns < 2 * ACTIVE_PERIOD_NS
                                 ? srv->active_now : 0;
        srv->active_now = 0;
        srv->active_period++;
        srv->active_since_ns = now;
    }
    return srv->active_now > srv->active_before ? srv->active_now : srv->active_before;
}

void kvd__server_client_active(kvd__server_t *srv, kvd__conn_t *c)
{
    (void)clients_active(srv, kvd__now_ns());
    if (c->active_period != srv->active_period) {
        c->active_period = srv->active_period;
        srv->active_now++;
    }
}

/* The loop polls only while that can pay: while fewer clients are busy
 * than the cores (each busy client is a thread that wants a core, and the
 * loop's polling takes one; with as many clients as cores or more, the
 * loop rarely waits long, and its polling would slow the very clients it
 * polls for), and while no thread waits for a core.  The window adapts to
 * the gaps between requests (proto/src/spin.h): a request that came while
 * the loop polled leaves it; one that came after the loop slept teaches it
 * how long polling would have had to last. */
void kvd__server_activity(kvd__server_t *srv)
{
    uint64_t now;
    int polling;

    /* I/O threads wait in epoll_wait; a loop that polled would only
     * contend for the lock they serve requests under */
    if (srv->opts.busy_poll_us == 0 || srv->shutting_down == 2 || srv->nio > 0)
        return;
    now = kvd__now_ns();
    polling = uv_is_active((uv_handle_t *)&srv->spin);
    if (!polling && srv->last_activity_ns != 0)
        kvd__spin_learn(&srv->poll_window, now - srv->last_activity_ns);
    srv->last_activity_ns = now;
    if (srv->poll_window.window_ns == 0 ||
        (!polling && (clients_active(srv, now) >= (uint32_t)kvd__spin_cores() ||
                      !kvd__spin_cores_free(now))))
        return;
    srv->spin_until_ns = now + srv->poll_window.window_ns;
    if (!polling)
        uv_idle_start(&srv->spin, spin_cb);
}

/* ---- batched writes ------------------------------------------------------ */

static void flush_all(kvd__server_t *srv)
{
    uv_prepare_stop(&srv->flush_prepare);
    uv_check_stop(&srv->flush_check);
    kvd__shard_flush_all(&srv->shards[0]);
}

static void flush_prepare_cb(uv_prepare_t *h)
{
    flush_all(h->data);
}

static void flush_check_cb(uv_check_t *h)
{
    flush_all(h->data);
}

/* Replies made in the idle phase (completions, buffered frames) or by
 * timers leave in the prepare phase, before the loop may sleep in poll;
 * those made by I/O callbacks (reads, wake-ups) leave in the check phase
 * right after them. */
void kvd__server_flush_soon(kvd__server_t *srv)
{
    if (srv->shutting_down != 2 && !uv_is_active((uv_handle_t *)&srv->flush_prepare)) {
        uv_prepare_start(&srv->flush_prepare, flush_prepare_cb);
        uv_check_start(&srv->flush_check, flush_check_cb);
    }
}

/* ---- I/O threads: the loop's side of the lock (shard.h) ------------------ */

void kvd__server_wake_loop(kvd__server_t *srv)
{
    if (!uv_is_closing((uv_handle_t *)&srv->loop_wake))
        uv_async_send(&srv->loop_wake);
}

static void loop_wake_cb(uv_async_t *h)
{
    kvd__server_t *srv = h->data;

    if (srv->drain_pending) {
        srv->drain_pending = 0;
        kvd__server_check_drained(srv);
    }
    if (srv->release_pending) {
        srv->release_pending = 0;
        release_backend(srv);
    }
}

void kvd__server_take(kvd__server_t *srv)
{
    if (srv->nio > 0)
        pthread_mutex_lock(&srv->mu);
}

void kvd__server_let_go(kvd__server_t *srv)
{
    if (srv->nio == 0)
        return;
    /* the loop sleeps in poll for loop_timeout, computed from its handles
     * when it let go: what this thread started since (a timer, an idle
     * handle, a handle to close) may want it sooner */
    if (srv->loop_asleep) {
        int t = uv_backend_timeout(srv->loop);

        if (t >= 0 && (srv->loop_timeout < 0 || t < srv->loop_timeout)) {
            srv->loop_asleep = 0;
            kvd__server_wake_loop(srv);
        }
    }
    pthread_mutex_unlock(&srv->mu);
}

/* With I/O threads the loop runs its callbacks under the lock and waits
 * for events without it (libuv's loop embedded: its backend descriptor
 * polled here). */
static void run_locked(kvd__server_t *srv)
{
    struct pollfd p = {.fd = uv_backend_fd(srv->loop), .events = POLLIN, .revents = 0};

    pthread_mutex_lock(&srv->mu);
    while (uv_run(srv->loop, UV_RUN_NOWAIT) != 0) {
        /* the replies this run made (completions, woken requests): out
         * before the loop sleeps, each sendmsg without the lock */
        srv->shards[0].outside_loop = 1;
        kvd__shard_flush_all(&srv->shards[0]);
        srv->shards[0].outside_loop = 0;
        srv->loop_timeout = uv_backend_timeout(srv->loop);
        srv->loop_asleep = 1;
        pthread_mutex_unlock(&srv->mu);
        (void)poll(&p, 1, srv->loop_timeout);
        pthread_mutex_lock(&srv->mu);
        srv->loop_asleep = 0;
    }
    pthread_mutex_unlock(&srv->mu);
}

void kvd__server_conn_gone(kvd__server_t *srv, kvd__conn_t *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->nconns--;
    if (srv->shutting_down == 2 && srv->conns == NULL && srv->backend != NULL &&
        srv->backend->pending(srv->backend) == 0) {
        if (on_io_thread()) {
            srv->release_pending = 1; /* the loop's thread ends what it began */
            kvd__server_wake_loop(srv);
        } else {
            release_backend(srv);
        }
    }
}

/* ---- deadlines ---------------------------------------------------------- */

static void sweep_cb(uv_timer_t *t)
{
    kvd__server_t *srv = t->data;
    uint64_t now = kvd__now_ns();
    kvd__conn_t *c;

    int waiting = 0;

    /* a closed connection stays on the list until its close callback */
    for (c = srv->conns; c; c = c->next) {
        if (c->leases != NULL)
            kvd__leases_expire(c, now);
        kvd__conn_check_deadline(c, now);
        if (c->parked != NULL)
            kvd__park_expire(c, now);
        waiting |= !c->closing && (c->deadline_ns != 0 || c->leases != NULL || c->parked != NULL);
    }
    if (!waiting) /* nothing to time: an idle daemon is not woken */
        uv_timer_stop(&srv->sweep);
}

/* Deadlines are checked a few times within the shorter of them, and cache
 * leases end within 100 ms of their time; one timer for all connections
 * costs nothing on the request path.  It runs only while a connection has
 * a deadline or a lease (kvd__server_sweep_arm). */
static uint64_t sweep_ms(const kvd__server_t *srv)
{
    uint64_t h = srv->opts.hello_timeout_ms, f = srv->opts.frame_timeout_ms, ms;

    ms = (h == 0 ? f : f == 0 ? h : h < f ? h : f) / 4;
    return ms < 10 ? 10 : ms > 100 ? 100 : ms;
}

void kvd__server_sweep_arm(kvd__server_t *srv)
{
    uint64_t ms = sweep_ms(srv);

    if (srv->shutting_down != 2 && !uv_is_active((uv_handle_t *)&srv->sweep))
        uv_timer_start(&srv->sweep, sweep_cb, ms, ms);
}

/* ---- the host-memory budget ---------------------------------------------- */

static kvd_status_t init_budget(kvd__server_t *srv, char *why, size_t why_len)
{
    const kvd__memsize_t *m = &srv->opts.host_memory_budget;
    uint64_t total = 0, avail = 0, budget;
    char a[32], b[32];

    if (kvd__sysmem(&total, &avail) != 0) {
        if (m->percent != 0) {
            snprintf(why, why_len, "cannot read the machine's memory (/proc/meminfo) to take "
                     "%u%% of it: give --host-memory-budget as a size", m->percent);
            return KVD_EIO;
        }
        total = 0;
    }
    budget = kvd__memsize_bytes(m, total);
    kvd__hostmem_init(&srv->hostmem, budget);
    srv->hostmem.cap[KVD_HM_SOCKETS] = srv->opts.max_socket_buffer_bytes < budget
                                           ? srv->opts.max_socket_buffer_bytes
                                           : budget;
    srv->mem_total = total;
    kvd_log(KVD_LOG_INFO, "event=host_memory_budget budget=%" PRIu64 " machine=%" PRIu64
            " available=%" PRIu64, budget, total, avail);
    if (total != 0 && budget > total)
        kvd_log(KVD_LOG_WARN, "event=host_memory_budget_large budget=\"%s\" machine=\"%s\" "
                "hint=\"reservations are also refused past what the machine has available\"",
                kvd__fmt_bytes(budget, a, sizeof(a)), kvd__fmt_bytes(total, b, sizeof(b)));
    return KVD_OK;
}

/* ---- lifecycle --------------------------------------------------------- */

static kvd_status_t pick_backend(kvd__server_t *srv, char *why, size_t why_len)
{
    const kvd__options_t *o = &srv->opts;
    char probe[256] = "";

    if (o->backend == KVD_BACKEND_CPU)
        return kvd__backend_cpu_create(srv->loop, o, &srv->backend, why, why_len);
    if (o->backend == KVD_BACKEND_CUDA)
        return kvd__backend_cuda_create(srv->loop, o, &srv->backend, why, why_len);
    if (kvd_cuda_probe(probe, sizeof(probe)) == KVD_OK &&
        kvd__backend_cuda_create(srv->loop, o, &srv->backend, why, why_len) == KVD_OK)
        return KVD_OK;
    kvd_log(KVD_LOG_INFO, "event=backend_auto choice=cpu reason=\"%s\"",
            probe[0] ? probe : why);
    return kvd__backend_cpu_create(srv->loop, o, &srv->backend, why, why_len);
}

kvd_status_t kvd__server_create(uv_loop_t *loop, const kvd__options_t *opts, kvd__server_t **out,
                                char *why, size_t why_len)
{
    kvd__server_t *srv = calloc(1, sizeof(*srv));
    kvd_status_t st;

    if (srv == NULL)
        return KVD_ENOMEM;
    srv->loop = loop;
    srv->opts = *opts;
    srv->listen_fd = -1;
    srv->spare_fd = -1;
    srv->uid = getuid();
    srv->nio = (unsigned)opts->io_threads;
    pthread_mutex_init(&srv->mu, NULL);
    if (srv->nio > 0 && srv->opts.cuda_completion == KVD_COMPLETION_LOOP) {
        /* a loop that polled the streams would hold the lock the I/O
         * threads serve requests under, over and over */
        srv->opts.cuda_completion = KVD_COMPLETION_POLL;
        kvd_log(KVD_LOG_INFO, "event=cuda_completion choice=poll reason=\"io-threads\"");
    }
    srv->next_client_id = 1;
    srv->next_cache_id = 1;
    srv->next_lease_id = 1;
    srv->start_ns = kvd__now_ns();
    if (kvd__stats_init(&srv->stats, kvd__op_count + 1) != 0) {
        free(srv);
        return KVD_ENOMEM;
    }
    /* systemd's socket, if any: taken before the backend starts threads */
    st = kvd__sd_listen_socket(&srv->listen_fd, srv->socket_path, sizeof(srv->socket_path), why,
                               why_len);
    if (st != KVD_OK)
        goto fail;
    srv->activated = srv->listen_fd >= 0;
    if ((st = init_budget(srv, why, why_len)) != KVD_OK)
        goto fail;
    if ((st = disk_start(srv, why, why_len)) != KVD_OK)
        goto fail;
    st = pick_backend(srv, why, why_len);
    if (st != KVD_OK)
        goto fail;
    srv->backend->hostmem = &srv->hostmem;
    kvd__registry_init(&srv->reg, srv->backend, &srv->hostmem);
    if (srv->opts.metrics[0] != '\0' &&
        (st = kvd__metrics_create(srv, &srv->metrics, why, why_len)) != KVD_OK)
        goto fail_backend;
    if (srv->opts.cluster_listen[0] != '\0' &&
        (st = kvd__cluster_create(srv, &srv->cluster, why, why_len)) != KVD_OK)
        goto fail_backend;
    uv_async_init(loop, &srv->loop_wake, loop_wake_cb);
    srv->loop_wake.data = srv;
    if ((st = kvd__shards_init(srv, why, why_len)) != KVD_OK)
        goto fail_backend;
    /* before the socket listens: a SIGTERM from a peer that saw it must
     * find the handler, not the default action */
    uv_signal_init(loop, &srv->sig_term);
    uv_signal_init(loop, &srv->sig_int);
    srv->sig_term.data = srv->sig_int.data = srv;
    uv_signal_start(&srv->sig_term, signal_cb, SIGTERM);
    uv_signal_start(&srv->sig_int, signal_cb, SIGINT);
    if (srv->activated) {
        kvd_log(KVD_LOG_INFO, "event=socket_activated socket=%s fd=%d", srv->socket_path,
                srv->listen_fd);
        if (srv->opts.socket[0] != '\0' && strcmp(srv->opts.socket, srv->socket_path) != 0)
            kvd_log(KVD_LOG_WARN, "event=socket_option_ignored socket=%s reason=\"socket "
                    "activation: serving the socket systemd passed\"", srv->opts.socket);
    } else {
        st = open_listener(srv, why, why_len);
    }
    if (st != KVD_OK)
        goto fail_backend;
    uv_poll_init(loop, &srv->listen_poll, srv->listen_fd);
    srv->listen_poll.data = srv;
    uv_poll_start(&srv->listen_poll, UV_READABLE, on_accept);
    srv->listening = 1;
    uv_idle_init(loop, &srv->idle);
    srv->idle.data = srv;
    uv_idle_init(loop, &srv->spin);
    srv->spin.data = srv;
    kvd__spin_init(&srv->poll_window, srv->opts.busy_poll_us * 1000ull);
    uv_prepare_init(loop, &srv->flush_prepare);
    srv->flush_prepare.data = srv;
    uv_check_init(loop, &srv->flush_check);
    srv->flush_check.data = srv;
    uv_timer_init(loop, &srv->drain_timer);
    srv->drain_timer.data = srv;
    uv_timer_init(loop, &srv->accept_backoff);
    srv->accept_backoff.data = srv;
    uv_timer_init(loop, &srv->sweep);
    uv_timer_init(loop, &srv->watchdog);
    srv->sweep.data = srv;
    open_spare(srv);
    kvd__registry_set_host_release(&srv->reg, host_release, srv);
    /* before the loop runs: no client is served before its caches are back */
    if (srv->disk_io != NULL)
        kvd__caches_reopen(srv);
    *out = srv;
    return KVD_OK;

fail_backend:
    if (srv->sig_term.loop != NULL) { /* initialised: the listener failed */
        uv_close((uv_handle_t *)&srv->sig_term, NULL);
        uv_close((uv_handle_t *)&srv->sig_int, NULL);
    }
    if (srv->loop_wake.loop != NULL)
        uv_close((uv_handle_t *)&srv->loop_wake, NULL);
    kvd__metrics_close(srv->metrics);
    kvd__cluster_close(srv->cluster);
    kvd__registry_deinit(&srv->reg);
    srv->backend->destroy(srv->backend, NULL, NULL);
    uv_run(loop, UV_RUN_NOWAIT); /* let the backend's handles close */
    kvd__metrics_destroy(&srv->metrics);
    kvd__cluster_destroy(&srv->cluster);
    kvd__shards_deinit(srv);
fail:
    kvd__disk_io_destroy(&srv->disk_io);
    if (srv->disk_async_open) {
        uv_close((uv_handle_t *)&srv->disk_async, NULL);
        uv_run(loop, UV_RUN_NOWAIT);
    }
    if (srv->activated)
        close(srv->listen_fd);
    kvd__stats_deinit(&srv->stats);
    free(srv);
    return st;
}

static void watchdog_cb(uv_timer_t *t)
{
    (void)t;
    (void)kvd__sd_notify("WATCHDOG=1");
}

int kvd__server_run(kvd__server_t *srv)
{
    uint64_t wd = kvd__sd_watchdog_usec();

    kvd_log(KVD_LOG_INFO,
            "event=ready socket=%s backend=%s device=\"%s\" pid=%d max_frame_bytes=%" PRIu64,
            srv->socket_path, srv->backend->name, srv->backend->device_name, (int)getpid(),
            srv->opts.max_frame_bytes);
    {
        char state[400];
        snprintf(state, sizeof(state), "READY=1\nSTATUS=serving on %s (backend %s)\nMAINPID=%d",
                 srv->socket_path, srv->backend->name, (int)getpid());
        (void)kvd__sd_notify(state);
    }
    if (wd >= 2000) { /* twice per interval, as sd_watchdog_enabled(3) advises */
        srv->watchdog.data = srv;
        uv_timer_start(&srv->watchdog, watchdog_cb, wd / 2000, wd / 2000);
        kvd_log(KVD_LOG_INFO, "event=watchdog interval_us=%" PRIu64, wd);
    }
    kvd__shard_self = &srv->shards[0];
    {
        char why[200];

        if (kvd__shards_start(srv, why, sizeof(why)) != KVD_OK) {
            kvd_log(KVD_LOG_ERROR, "event=io_threads_failed reason=\"%s\"", why);
            kvd__server_begin_shutdown(srv, 1, why);
        }
    }
    if (srv->nio > 0)
        run_locked(srv);
    else
        uv_run(srv->loop, UV_RUN_DEFAULT);
    kvd__shards_stop(srv);
    return 0;
}

void kvd__server_destroy(kvd__server_t **sp)
{
    kvd__server_t *srv = sp ? *sp : NULL;

    if (srv == NULL)
        return;
    kvd__metrics_destroy(&srv->metrics);
    kvd__cluster_destroy(&srv->cluster);
    kvd__disk_io_destroy(&srv->disk_io); /* gone already after a shutdown */
    kvd__registry_deinit(&srv->reg);
    kvd__stats_deinit(&srv->stats);
    kvd__shards_deinit(srv);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
    *sp = NULL;
}
