/* Test harness for the daemon suites: see harness.h. */
#include "harness.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef KVDOCKD_PATH
#error "KVDOCKD_PATH must name the kvdockd binary"
#endif

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int kvdt_connect(const char *sock)
{
    struct sockaddr_un sa;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -1;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int kvdt_connect_as(const char *sock, uid_t uid, gid_t gid, size_t ngroups, const gid_t *groups,
                    int *err)
{
    int sp[2], fds[4], nfds = 0, status;
    int32_t cerr = 0;
    ssize_t n;
    pid_t pid;

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    pid = fork();
    if (pid == 0) { /* no Check assertion here (kvdt_child_close_fds) */
        int fd;
        kvdt_child_close_fds(sp[1]);
        if (setgroups(ngroups, groups) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
            _exit(3);
        fd = kvdt_connect(sock);
        cerr = fd < 0 ? errno : 0;
        if (fd >= 0)
            (void)kvd__sock_send_all(sp[1], &cerr, sizeof(cerr), &fd, 1);
        else
            (void)kvd__sock_send_all(sp[1], &cerr, sizeof(cerr), NULL, 0);
        _exit(0);
    }
    ck_assert_int_ge(pid, 0);
    close(sp[1]);
    n = kvd__sock_recv(sp[0], &cerr, sizeof(cerr), fds, &nfds, 4);
    close(sp[0]);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child could not become %u",
                  (unsigned)uid);
    ck_assert_int_eq(n, (ssize_t)sizeof(cerr));
    if (err)
        *err = cerr;
    if (nfds == 0)
        return -1;
    return fds[0];
}

int kvdt_file_has(const char *path, const char *what)
{
    FILE *f = fopen(path, "r");
    char line[2048];
    int found = 0;

    if (f == NULL)
        return 0;
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = strstr(line, what) != NULL;
    fclose(f);
    return found;
}

int kvdt_log_has(const kvdt_daemon_t *d, const char *what)
{
    return kvdt_file_has(d->log, what);
}

void kvdt_dump_file(const char *path)
{
    char buf[4096];
    FILE *f = fopen(path, "r");
    size_t n;

    if (f == NULL) {
        fprintf(stderr, "---- no kvdockd log (%s) ----\n", path);
        return;
    }
    fprintf(stderr, "---- kvdockd log (%s) ----\n", path);
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        fwrite(buf, 1, n, stderr);
    fclose(f);
}

void kvdt_dump_log(const kvdt_daemon_t *d)
{
    kvdt_dump_file(d->log);
}

void kvdt_child_close_fds(int keep)
{
    int fds[1024], n = 0, i;
    struct dirent *e;
    DIR *dir;

#ifdef SYS_close_range
    /* one call where the kernel has it (Linux 5.9) */
    if ((keep <= 3 || syscall(SYS_close_range, 3u, (unsigned)keep - 1, 0u) == 0) &&
        syscall(SYS_close_range, keep < 3 ? 3u : (unsigned)keep + 1, ~0u, 0u) == 0)
        return;
#endif
    /* else what /proc lists (the directory's own descriptor skipped) */
    dir = opendir("/proc/self/fd");
    if (dir == NULL)
        _exit(125);
    while ((e = readdir(dir)) != NULL && n < 1024) {
        int fd = atoi(e->d_name);
        if (fd >= 3 && fd != keep && fd != dirfd(dir))
            fds[n++] = fd;
    }
    closedir(dir);
    for (i = 0; i < n; i++)
        close(fds[i]);
}

static rlim_t child_nofile, child_fsize;

void kvdt_free_fds(pid_t pid, int *f0, int *f1)
{
    char path[64];
    static unsigned char used[65536];
    struct dirent *e;
    DIR *dir;
    int n = 0;

    memset(used, 0, sizeof(used));
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    dir = opendir(path);
    ck_assert_ptr_nonnull(dir);
    while ((e = readdir(dir)) != NULL) {
        long v = e->d_name[0] >= '0' && e->d_name[0] <= '9' ? strtol(e->d_name, NULL, 10) : -1;
        if (v >= 0 && v < (long)sizeof(used))
            used[v] = 1;
    }
    closedir(dir);
    for (int i = 0; i < (int)sizeof(used) && n < 2; i++)
        if (!used[i])
            *(n++ == 0 ? f0 : f1) = i;
    ck_assert_int_eq(n, 2);
}

void kvdt_set_limits(uint64_t nofile, uint64_t fsize)
{
    child_nofile = (rlim_t)nofile;
    child_fsize = (rlim_t)fsize;
}

static pid_t spawn(const char *sock, const char *log, const char *const *extra)
{
    const char *argv[64];
    int argc = 0, i;
    pid_t pid;

    /* KVDOCKD overrides the binary built beside the tests (another machine) */
    argv[argc++] = getenv("KVDOCKD") ? getenv("KVDOCKD") : KVDOCKD_PATH;
    argv[argc++] = "--backend";
    /* KVDT_BACKEND=cuda runs the same suites on the GPU machine */
    argv[argc++] = getenv("KVDT_BACKEND") ? getenv("KVDT_BACKEND") : "cpu";
    argv[argc++] = "--socket";
    argv[argc++] = sock;
    argv[argc++] = "--log-level";
    argv[argc++] = "debug";
    /* a test daemon never reserves more than this (extra may say less) */
    argv[argc++] = "--host-memory-budget";
    argv[argc++] = KVDT_HOST_BUDGET;
    for (i = 0; extra && extra[i] && argc < 62; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    pid = fork();
    if (pid == 0) { /* the daemon holds nothing of the test's (kvdt_child_close_fds) */
        int lf;

        kvdt_child_close_fds(-1);
        if (child_nofile) {
            struct rlimit rl = {child_nofile, child_nofile};
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
                _exit(126);
        }
        if (child_fsize) {
            struct rlimit rl = {child_fsize, child_fsize};
            if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
                _exit(126);
        }
        lf = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (lf >= 0) {
            dup2(lf, 2);
            close(lf);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    ck_assert_int_ge(pid, 0);
    return pid;
}

int kvdt_run(const char *sock, const char *const *extra, int timeout_ms)
{
    return kvdt_run_log(sock, "/dev/null", extra, timeout_ms);
}

int kvdt_run_log(const char *sock, const char *log, const char *const *extra, int timeout_ms)
{
    kvdt_daemon_t d;
    int st, lf = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

    if (lf >= 0) /* this run's lines alone */
        close(lf);
    memset(&d, 0, sizeof(d));
    d.pid = spawn(sock, log, extra);
    st = kvdt_wait_exit(&d, timeout_ms);
    if (st < 0) {
        kill(d.pid, SIGKILL);
        waitpid(d.pid, NULL, 0);
    }
    return st;
}

/* Daemons started by this process: a failed assertion exits the test
 * process without its teardown, so an exit handler cleans up. */
static kvdt_daemon_t *started[16];

static void cleanup_at_exit(void)
{
    int i;

    for (i = 0; i < 16; i++)
        if (started[i] != NULL)
            (void)kvdt_stop(started[i]);
}

static void track(kvdt_daemon_t *d)
{
    static int registered;
    int i;

    if (!registered) {
        atexit(cleanup_at_exit);
        registered = 1;
    }
    for (i = 0; i < 16; i++) {
        if (started[i] == NULL || started[i] == d) {
            started[i] = d;
            return;
        }
    }
}

static void untrack(kvdt_daemon_t *d)
{
    int i;

    for (i = 0; i < 16; i++)
        if (started[i] == d)
            started[i] = NULL;
}

void kvdt_start(kvdt_daemon_t *d, const char *const *extra)
{
    kvdt_start_sock(d, NULL, extra);
}

void kvdt_start_sock(kvdt_daemon_t *d, const char *sock, const char *const *extra)
{
    uint64_t deadline;

    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/kvdt-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d->dir));
    if (sock)
        snprintf(d->sock, sizeof(d->sock), "%s", sock);
    else
        snprintf(d->sock, sizeof(d->sock), "%s/kvdockd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/kvdockd.log", d->dir);
    d->pid = spawn(d->sock, d->log, extra);
    track(d);
    deadline = now_ms() + KVDT_TIMEOUT_MS;
    while (now_ms() < deadline) {
        int fd = kvdt_connect(d->sock), status;
        if (fd >= 0) {
            close(fd);
            return;
        }
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            d->pid = 0;
            kvdt_dump_log(d);
            ck_abort_msg("kvdockd exited at start (status %d)", status);
        }
        usleep(5000);
    }
    kvdt_dump_log(d);
    ck_abort_msg("kvdockd did not accept within %d ms", KVDT_TIMEOUT_MS);
}

int kvdt_wait_exit(kvdt_daemon_t *d, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    int status;

    if (d->pid <= 0)
        return -1;
    while (now_ms() < deadline) {
        pid_t p = waitpid(d->pid, &status, WNOHANG);
        if (p == d->pid) {
            d->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        usleep(2000);
    }
    return -1;
}

int kvdt_stop(kvdt_daemon_t *d)
{
    char cmd[160];
    int st = 0;

    untrack(d);
    if (d->pid > 0) {
        /* a clean exit first: the sanitizer build then reports leaks */
        kill(d->pid, SIGTERM);
        st = kvdt_wait_exit(d, KVDT_TIMEOUT_MS);
        if (st != 0)
            kvdt_dump_log(d);
        if (d->pid > 0) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, NULL, 0);
            d->pid = 0;
        }
    }
    if (d->dir[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", d->dir);
        d->dir[0] = '\0';
    }
    return st;
}

void kvdt_send(int fd, const Kvdock__Request *req, const int *fds, int nfds)
{
    uint8_t *frame;
    size_t len;

    ck_assert_int_eq(kvd__frame_pack(&req->base, &frame, &len), KVD_OK);
    ck_assert_int_eq(kvd__sock_send_all(fd, frame, len, fds, nfds), KVD_OK);
    free(frame);
}

void kvdt_send_raw(int fd, const void *buf, size_t len)
{
    ck_assert_int_eq(kvd__sock_send_all(fd, buf, len, NULL, 0), KVD_OK);
}

/* Read exactly n bytes (descriptors collected), or -1 at EOF/timeout. */
static int read_exact(int fd, uint8_t *buf, size_t n, int *fds, int *nfds, uint64_t deadline)
{
    size_t got = 0;

    while (got < n) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int64_t left = (int64_t)(deadline - now_ms());
        ssize_t r;

        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            return -1;
        r = kvd__sock_recv(fd, buf + got, n - got, fds, nfds, fds ? 4 : 0);
        if (r == -EAGAIN || r == -EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

Kvdock__Response *kvdt_recv(int fd, int *fds, int *nfds, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    uint8_t hdr[4], *payload;
    size_t plen;
    Kvdock__Response *resp;
    int dummy = 0;

    if (nfds == NULL)
        nfds = &dummy;
    else
        *nfds = 0;
    if (read_exact(fd, hdr, 4, fds, nfds, deadline) != 0)
        return NULL;
    (void)kvd__frame_parse(hdr, 4, UINT32_MAX, &plen);
    payload = malloc(plen ? plen : 1);
    ck_assert_ptr_nonnull(payload);
    if (read_exact(fd, payload, plen, fds, nfds, deadline) != 0) {
        free(payload);
        return NULL;
    }
    resp = kvdock__response__unpack(NULL, plen, payload);
    free(payload);
    ck_assert_msg(resp != NULL, "reply does not decode");
    return resp;
}

Kvdock__Response *kvdt_call_fds(int fd, Kvdock__Request *req, const int *send_fds, int nsend,
                                int *fds, int *nfds)
{
    Kvdock__Response *resp;

    kvdt_send(fd, req, send_fds, nsend);
    resp = kvdt_recv(fd, fds, nfds, KVDT_TIMEOUT_MS);
    if (resp != NULL)
        ck_assert_uint_eq(resp->id, req->id);
    return resp;
}

Kvdock__Response *kvdt_call(int fd, Kvdock__Request *req)
{
    return kvdt_call_fds(fd, req, NULL, 0, NULL, NULL);
}

int kvdt_status_of(int fd, Kvdock__Request *req)
{
    Kvdock__Response *resp = kvdt_call(fd, req);
    int st;

    if (resp == NULL)
        return -1;
    st = (int)resp->status;
    if (st != 0)
        ck_assert_msg(resp->message[0] != '\0', "error reply without a message");
    kvdock__response__free_unpacked(resp, NULL);
    return st;
}

Kvdock__StatusReply *kvdt_status(int fd)
{
    Kvdock__Request req;
    Kvdock__StatusRequest sr = KVDOCK__STATUS_REQUEST__INIT;
    Kvdock__Response *r;
    Kvdock__StatusReply *s;

    kvdt_req_init(&req, 33);
    req.op_case = KVDOCK__REQUEST__OP_STATUS;
    req.status = &sr;
    r = kvdt_call(fd, &req);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->status == 0, "status: %s", r->message);
    s = r->status_reply;
    r->status_reply = NULL; /* the caller's now */
    r->result_case = KVDOCK__RESPONSE__RESULT__NOT_SET;
    kvdock__response__free_unpacked(r, NULL);
    return s;
}

int kvdt_ping_ok(int fd)
{
    Kvdock__Request req;
    Kvdock__Ping p = KVDOCK__PING__INIT;

    kvdt_req_init(&req, 777);
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &p;
    return kvdt_status_of(fd, &req) == 0;
}

int kvdt_closed(int fd, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    char buf[256];

    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int64_t left = (int64_t)(deadline - now_ms());
        ssize_t r;

        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            return 0;
        r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
            return 1;
    }
}

void kvdt_req_init(Kvdock__Request *req, uint64_t id)
{
    kvdock__request__init(req);
    req->id = id;
}

int kvdt_client(const kvdt_daemon_t *d, const char *name)
{
    Kvdock__Request req;
    Kvdock__Hello h = KVDOCK__HELLO__INIT;
    Kvdock__Response *resp;
    int fd = kvdt_connect(d->sock);

    ck_assert_int_ge(fd, 0);
    kvdt_req_init(&req, 1);
    h.protocol_version = KVD_PROTOCOL_VERSION;
    h.client_name = (char *)name;
    req.op_case = KVDOCK__REQUEST__OP_HELLO;
    req.hello = &h;
    resp = kvdt_call(fd, &req);
    ck_assert_ptr_nonnull(resp);
    ck_assert_uint_eq(resp->status, 0);
    ck_assert_int_eq(resp->result_case, KVDOCK__RESPONSE__RESULT_HELLO);
    kvdock__response__free_unpacked(resp, NULL);
    return fd;
}

uint64_t kvdt_pool_create(int fd, const char *name, uint32_t layers, uint64_t slots,
                          uint64_t slot_bytes, int mla)
{
    Kvdock__Request req;
    Kvdock__PoolCreate pc = KVDOCK__POOL_CREATE__INIT;
    Kvdock__Response *resp;
    uint64_t id = 0;

    kvdt_req_init(&req, 100);
    pc.name = (char *)name;
    pc.kind = KVDOCK__MEM_KIND__MEM_HOST;
    pc.num_layers = layers;
    pc.num_slots = slots;
    pc.slot_bytes = slot_bytes;
    pc.mla = mla;
    req.op_case = KVDOCK__REQUEST__OP_POOL_CREATE;
    req.pool_create = &pc;
    resp = kvdt_call(fd, &req);
    ck_assert_ptr_nonnull(resp);
    if (resp->status == 0) {
        ck_assert_int_eq(resp->result_case, KVDOCK__RESPONSE__RESULT_POOL);
        id = resp->pool->id;
    }
    kvdock__response__free_unpacked(resp, NULL);
    return id;
}

void *kvdt_pool_map(int fd, uint64_t pool, Kvdock__PoolInfo **info, size_t *map_bytes)
{
    Kvdock__Request req;
    Kvdock__PoolExport pe = KVDOCK__POOL_EXPORT__INIT;
    Kvdock__Response *resp;
    int fds[4], nfds = 0;
    void *map;

    kvdt_req_init(&req, 101);
    pe.pool = pool;
    req.op_case = KVDOCK__REQUEST__OP_POOL_EXPORT;
    req.pool_export = &pe;
    resp = kvdt_call_fds(fd, &req, NULL, 0, fds, &nfds);
    ck_assert_ptr_nonnull(resp);
    ck_assert_msg(resp->status == 0, "export: %s", resp->message);
    ck_assert_int_eq(nfds, 1);
    ck_assert_int_eq(resp->pool_export->fd_index, 0);
    *map_bytes = resp->pool_export->map_bytes;
    map = mmap(NULL, *map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    ck_assert_ptr_ne(map, MAP_FAILED);
    close(fds[0]);
    if (info) {
        *info = resp->pool_export->pool;
        resp->pool_export->pool = NULL; /* the caller frees it */
    }
    kvdock__response__free_unpacked(resp, NULL);
    return map;
}

uint64_t kvdt_buffer_map(int fd, uint64_t bytes, void **map)
{
    Kvdock__Request req;
    Kvdock__BufferRegister br = KVDOCK__BUFFER_REGISTER__INIT;
    Kvdock__Response *resp;
    int fds[4], nfds = 0;
    uint64_t id;

    kvdt_req_init(&req, 102);
    br.bytes = bytes;
    br.kind = KVDOCK__MEM_KIND__MEM_HOST;
    req.op_case = KVDOCK__REQUEST__OP_BUFFER_REGISTER;
    req.buffer_register = &br;
    resp = kvdt_call_fds(fd, &req, NULL, 0, fds, &nfds);
    ck_assert_ptr_nonnull(resp);
    ck_assert_msg(resp->status == 0, "buffer: %s", resp->message);
    ck_assert_int_eq(nfds, 1);
    *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    ck_assert_ptr_ne(*map, MAP_FAILED);
    close(fds[0]);
    id = resp->buffer->id;
    kvdock__response__free_unpacked(resp, NULL);
    return id;
}
