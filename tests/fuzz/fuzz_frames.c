/*
 * fuzz_frames: libFuzzer target for kvdockd's decode and dispatch path
 * (cpu backend), built with AddressSanitizer and UndefinedBehaviorSanitizer
 * (cmake -DKVD_FUZZ=ON with clang; see tests/fuzz/run.sh).
 *
 * Nothing of the daemon is stubbed: one real server (kvd__server_create,
 * options, cpu backend, registry, counters) lives for the whole run, and
 * each input goes through a real connection (kvd__conn_create) on one end
 * of a socketpair, driven by the server's own libuv loop: framing, the
 * frame-size check, protobuf unpacking, the dispatch table's checks, every
 * handler's validation, the backend's jobs and the replies.  The input is
 * the byte stream a client would write: frames as the framing defines them
 * (a 4-byte little-endian length, then a Request), garbage included.  The
 * harness only chooses where writes end: each of the second to fourth
 * frames (as the length headers cut the input) goes with its own sendmsg
 * carrying one sealed memfd of 64 KiB, so pool imports and every
 * descriptor path see a real descriptor.  The harness reads the replies
 * after each frame; a key area the daemon sends (cache_key_area) is
 * filled with the input itself, repeated, as a client writes chains into
 * it: an area reference names bytes of the input (a key saved earlier in
 * the session, or garbage), so lookups, saves, loads and evictions read
 * keys from the area as from a frame.  With KVD_FUZZ_SERIAL the harness
 * waits for each whole frame's reply before the next (run.sh's serial
 * mode), so sessions reach what their earlier requests made.
 *
 * After the input, the harness closes its end (the daemon sees the client
 * go, as when a process dies), runs the loop until the connection has
 * been freed, every job has completed and the memory made or freed on
 * threads is done, and checks what a client would: every reply frame
 * decodes as a Response.  Then the registry must be
 * empty (the client's pools and buffers released); ids restart so that
 * an input replays the same way.  An input that shuts the daemon down (an
 * admin shutdown) ends the server; the next input gets a fresh one.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "conn.h"
#include "wire.h"
#include "log.h"
#include "options.h"
#include "server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MEMFD_BYTES (64u << 10)
#define FD_FRAMES 3 /* frames 2..4 carry a memfd */

static uv_loop_t loop;
static kvd__server_t *srv;
/* KVD_FUZZ_EXPECT_OK: the inputs are valid sessions (the seeds named ok-*):
 * every request must get exactly one reply, and that reply must be OK. */
static int expect_ok;
/* KVD_FUZZ_SERIAL (implied by KVD_FUZZ_EXPECT_OK): the harness is a client
 * that waits for each reply before the next request, so a session's later
 * requests find what its earlier ones made (a pool made on a thread, then
 * a save into it, a chain saved, then named in a key area); without it,
 * requests are pipelined and race what they depend on. */
static int serial;
static unsigned replies;
static char sock_dir[64];
static char sock_path[128];
/* the input being run: what a key area is filled with */
static const uint8_t *cur_data;
static size_t cur_size;

static void die(const char *what)
{
    fprintf(stderr, "fuzz_frames: %s\n", what);
    abort();
}

static void server_up(void)
{
    kvd__options_t o;
    char why[256] = "", err[256];

    kvd__options_init(&o);
    if (kvd__options_set(&o, "backend", "cpu", err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "socket", sock_path, err, sizeof(err)) != KVD_OK ||
        /* a crash, not a memory limit, is what we look for: keep pools small */
        kvd__options_set(&o, "max-pool-bytes", "32M", err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "max-total-pool-bytes", "64M", err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "max-frame-bytes", "1M", err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "max-inline-bytes", "512K", err, sizeof(err)) != KVD_OK ||
        kvd__options_set(&o, "shutdown-timeout-ms", "2000", err, sizeof(err)) != KVD_OK)
        die(err);
    if (kvd__server_create(&loop, &o, &srv, why, sizeof(why)) != KVD_OK)
        die(why);
}

static void server_down(void)
{
    if (srv == NULL)
        return;
    if (!srv->shutting_down)
        kvd__server_begin_shutdown(srv, 1, "fuzz: fresh server");
    uv_run(&loop, UV_RUN_DEFAULT);
    kvd__server_destroy(&srv);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    kvd__log_level = getenv("KVD_FUZZ_LOG") ? KVD_LOG_DEBUG : KVD_LOG_ERROR;
    expect_ok = getenv("KVD_FUZZ_EXPECT_OK") != NULL;
    serial = expect_ok || getenv("KVD_FUZZ_SERIAL") != NULL;
    snprintf(sock_dir, sizeof(sock_dir), "/tmp/kvd-fuzz-XXXXXX");
    if (mkdtemp(sock_dir) == NULL)
        die("mkdtemp");
    snprintf(sock_path, sizeof(sock_path), "%s/kvdockd.sock", sock_dir);
    if (uv_loop_init(&loop) != 0)
        die("uv_loop_init");
    server_up();
    return 0;
}

/* Replies read so far: a stream of frames, each must decode. */
typedef struct rx {
    uint8_t *buf;
    size_t len, cap;
} rx_t;

static void rx_check(rx_t *r)
{
    size_t off = 0, plen;

    while (kvd__frame_parse(r->buf + off, r->len - off, UINT32_MAX, &plen) == KVD__PARSE_FRAME) {
        Kvdock__Response *resp =
            kvdock__response__unpack(NULL, plen, r->buf + off + KVD_FRAME_HEADER_BYTES);
        if (resp == NULL)
            die("a reply frame does not decode");
        if (resp->status != 0 && (resp->message == NULL || resp->message[0] == '\0'))
            die("an error reply without a message");
        if (expect_ok && resp->status != 0) {
            fprintf(stderr, "fuzz_frames: reply to request %" PRIu64 ": status %" PRIu32 ": %s\n",
                    resp->id, resp->status, resp->message);
            die("a valid session got an error reply");
        }
        replies++;
        kvdock__response__free_unpacked(resp, NULL);
        off += KVD_FRAME_HEADER_BYTES + plen;
    }
    memmove(r->buf, r->buf + off, r->len - off);
    r->len -= off;
}

/* A descriptor the daemon sent: a key area (a memfd of at most 4 MiB named
 * kvdock-keys) is filled with the input, repeated; then it is closed. */
static void take_fd(int fd)
{
    char link[64], name[128];
    ssize_t n;
    struct stat st;
    uint8_t *p;

    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    n = readlink(link, name, sizeof(name) - 1);
    if (n > 0 && cur_size > 0) {
        name[n] = '\0';
        if (strstr(name, "kvdock-keys") != NULL && fstat(fd, &st) == 0 && st.st_size > 0 &&
            st.st_size <= (4 << 20)) {
            p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED)
                die("mmap of a key area");
            for (size_t off = 0; off < (size_t)st.st_size; off += cur_size) {
                size_t k = (size_t)st.st_size - off;
                memcpy(p + off, cur_data, k < cur_size ? k : cur_size);
            }
            munmap(p, (size_t)st.st_size);
        }
    }
    close(fd);
}

/* Read what the daemon wrote (descriptors it sends are taken by take_fd);
 * -1 once the daemon has closed its end. */
static int drain(int fd, rx_t *r)
{
    for (;;) {
        int fds[KVD_MAX_FDS_PER_FRAME], nfds = 0, i;
        ssize_t n;

        if (r->cap - r->len < 65536) {
            size_t cap = r->cap ? r->cap * 2 : 131072;
            uint8_t *nb = realloc(r->buf, cap);
            if (nb == NULL)
                die("out of memory");
            r->buf = nb;
            r->cap = cap;
        }
        n = kvd__sock_recv(fd, r->buf + r->len, r->cap - r->len, fds, &nfds,
                           KVD_MAX_FDS_PER_FRAME);
        for (i = 0; i < nfds; i++)
            take_fd(fds[i]);
        if (n == -EAGAIN || n == -EWOULDBLOCK || n == -EINTR)
            return 0;
        if (n <= 0)
            return -1;
        r->len += (size_t)n;
        rx_check(r);
    }
}

/* One turn of the daemon's loop, waiting at most ms for it or for fd. */
static void turn(int fd, int ms)
{
    struct pollfd p[2] = {{.fd = uv_backend_fd(&loop), .events = POLLIN},
                          {.fd = fd, .events = POLLIN}};
    int t = uv_backend_timeout(&loop);

    if (t < 0 || t > ms)
        t = ms;
    (void)poll(p, fd >= 0 ? 2 : 1, t);
    uv_run(&loop, UV_RUN_NOWAIT);
}

static int make_memfd(void)
{
    int fd = memfd_create("kvd-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    if (fd < 0 || ftruncate(fd, MEMFD_BYTES) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
        die("memfd");
    return fd;
}

/* Send [p, p+n) without blocking; the bytes taken.  fd: one descriptor
 * with the first byte (when n > 0), then -1. */
static size_t send_some(int s, const uint8_t *p, size_t n, int *fd)
{
    struct msghdr mh;
    struct iovec iov = {.iov_base = (void *)p, .iov_len = n};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    ssize_t w;

    if (n == 0)
        return 0;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (*fd >= 0) {
        struct cmsghdr *cm;
        memset(&ctl, 0, sizeof(ctl));
        mh.msg_control = ctl.buf;
        mh.msg_controllen = sizeof(ctl.buf);
        cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), fd, sizeof(int));
    }
    w = sendmsg(s, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w <= 0)
        return 0;
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
    return (size_t)w;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sv[2];
    kvd__conn_t *c;
    size_t off = 0, frame_end = 0;
    int frame_no = 0, pending_fd = -1, whole = 0;
    unsigned sent_after = 0; /* replies when the frame being sent began */
    rx_t rx = {0};

    replies = 0;
    cur_data = data;
    cur_size = size;
    if (srv == NULL)
        server_up();
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        die("socketpair");
    {
        struct ucred cred;
        socklen_t len = sizeof(cred);

        if (getsockopt(sv[0], SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
            kvd__conn_create(srv, sv[0], &cred, &c) != KVD_OK)
            die("kvd__conn_create");
    }

    /* Write the input as a client would, a frame at a time (as the length
     * headers cut it), while the loop runs and the replies are read. */
    while (off < size) {
        size_t n;

        if (off == frame_end) {
            size_t plen = 0;
            kvd__parse_t pr = kvd__frame_parse(data + off, size - off, UINT32_MAX, &plen);
            frame_end = pr == KVD__PARSE_FRAME ? off + KVD_FRAME_HEADER_BYTES + plen : size;
            whole = pr == KVD__PARSE_FRAME;
            sent_after = replies;
            frame_no++;
            if (frame_no >= 2 && frame_no <= 1 + FD_FRAMES)
                pending_fd = make_memfd();
        }
        n = send_some(sv[1], data + off, frame_end - off, &pending_fd);
        off += n;
        if (serial && whole && off == frame_end) {
            /* a valid session runs as a client that waits for each reply
             * (a load after a save finds the saved blocks complete); a
             * fuzzed one waits less (a request that waits in the daemon,
             * or a frame that gets no reply, must not stall the run) */
            int turns = expect_ok ? 2000 : 100;
            unsigned want = expect_ok ? (unsigned)frame_no : sent_after + 1;

            for (int t = 0; t < turns && replies < want; t++) {
                if (drain(sv[1], &rx) < 0)
                    break;
                turn(sv[1], 1);
            }
        }
        if (n == 0) {
            /* the socket is full (or the daemon closed it): let it run */
            if (drain(sv[1], &rx) < 0)
                break;
            turn(sv[1], 5);
        }
        uv_run(&loop, UV_RUN_NOWAIT);
        if (off == frame_end && drain(sv[1], &rx) < 0)
            break; /* the daemon closed the connection */
    }
    if (pending_fd >= 0)
        close(pending_fd);

    /* The client leaves; the daemon finishes its work and frees the
     * connection. */
    shutdown(sv[1], SHUT_WR);
    while (srv->nconns > 0 || srv->mem_works > 0 ||
           (srv->backend != NULL && srv->backend->pending(srv->backend) > 0)) {
        (void)drain(sv[1], &rx);
        turn(sv[1], 10);
        if (srv->shutting_down == 2 && srv->conns == NULL)
            break;
    }
    (void)drain(sv[1], &rx);
    close(sv[1]);
    free(rx.buf);
    if (srv->nconns == 0 && srv->karea_bytes != 0)
        die("a key area still counted after its client left");
    if (expect_ok && replies != (unsigned)frame_no) {
        fprintf(stderr, "fuzz_frames: %d requests, %u replies\n", frame_no, replies);
        die("a request of a valid session got no reply, or two");
    }

    if (srv->shutting_down) {
        /* an admin shutdown: let the server end, start a new one next time */
        server_down();
        return 0;
    }
    /* Everything the client made is gone once its work has completed. */
    if (srv->reg.npools != 0 || srv->reg.nbuffers != 0 || srv->reg.nevents != 0) {
        /* shared objects may outlive their creator: start afresh */
        server_down();
        return 0;
    }
    if (srv->reg.live_bytes != 0)
        die("pool or buffer memory still held after the client left");

    /* the same input replays the same way: ids restart */
    srv->reg.next_id = 1;
    srv->next_client_id = 1;
    if (srv->caches == NULL) { /* and so no lease */
        srv->next_cache_id = 1;
        srv->next_lease_id = 1;
    }
    return 0;
}
