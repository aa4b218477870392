/*
 * kvdock wire helpers: framing, socket I/O with SCM_RIGHTS descriptor
 * passing, the default socket path and operation names.  See
 * wire.h for the contract.
 */
#include "wire.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* The kernel never passes more than SCM_MAX_FD (253) descriptors in one
 * message; room for all of them means none is dropped silently before we
 * get the chance to close the extras ourselves. */
#define KERNEL_MAX_FDS 253

kvd__parse_t kvd__frame_parse(const uint8_t *buf, size_t len, uint64_t max_frame,
                              size_t *payload_len)
{
    uint32_t n;

    if (buf == NULL || len < KVD_FRAME_HEADER_BYTES)
        return KVD__PARSE_NEED_MORE;
    n = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 |
        (uint32_t)buf[3] << 24;
    if (payload_len != NULL)
        *payload_len = n;
    if ((uint64_t)n > max_frame)
        return KVD__PARSE_ERROR;
    if (len - KVD_FRAME_HEADER_BYTES < (size_t)n)
        return KVD__PARSE_NEED_MORE;
    return KVD__PARSE_FRAME;
}

kvd_status_t kvd__frame_pack(const ProtobufCMessage *msg, uint8_t **out, size_t *out_len)
{
    size_t n;
    uint8_t *buf;

    if (msg == NULL || out == NULL || out_len == NULL)
        return KVD_ENULL;
    n = protobuf_c_message_get_packed_size(msg);
    if (n > UINT32_MAX)
        return KVD_ETOOBIG;
    buf = malloc(KVD_FRAME_HEADER_BYTES + n);
    if (buf == NULL)
        return KVD_ENOMEM;
    buf[0] = (uint8_t)(n & 0xff);
    buf[1] = (uint8_t)((n >> 8) & 0xff);
    buf[2] = (uint8_t)((n >> 16) & 0xff);
    buf[3] = (uint8_t)((n >> 24) & 0xff);
    if (protobuf_c_message_pack(msg, buf + KVD_FRAME_HEADER_BYTES) != n) {
        free(buf);
        return KVD_EINTERNAL;
    }
    *out = buf;
    *out_len = KVD_FRAME_HEADER_BYTES + n;
    return KVD_OK;
}

/* Wait until sock is writable (a non-blocking socket given to send_all). */
static int wait_writable(int sock)
{
    struct pollfd p = {.fd = sock, .events = POLLOUT};
    int rc;

    do {
        rc = poll(&p, 1, -1);
    } while (rc < 0 && errno == EINTR);
    return rc < 0 ? -1 : 0;
}

ssize_t kvd__sock_sendmsg(int sock, const struct iovec *iov, int iovcnt, const int *fds, int nfds,
                          int flags)
{
    struct msghdr mh;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * KVD_MAX_FDS_PER_FRAME)];
    } ctl;

    if (nfds < 0 || nfds > KVD_MAX_FDS_PER_FRAME || iovcnt < 1) {
        errno = EINVAL;
        return -1;
    }
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = (struct iovec *)iov;
    mh.msg_iovlen = (size_t)iovcnt;
    if (nfds > 0) {
        struct cmsghdr *c;

        memset(&ctl, 0, sizeof(ctl));
        mh.msg_control = ctl.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    return sendmsg(sock, &mh, MSG_NOSIGNAL | flags);
}

kvd_status_t kvd__sock_send_all(int sock, const void *buf, size_t len, const int *fds, int nfds)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};

    if (sock < 0 || (buf == NULL && len > 0))
        return KVD_EINVAL;
    if (nfds > 0 && len == 0)
        return KVD_EINVAL; /* descriptors ride on a byte */
    return kvd__sock_send_iov(sock, &iov, 1, fds, nfds);
}

/* The gathering buffer: small appends are copied into buf; a large one
 * becomes a piece of its own, sent from where it lies.  Pieces name the
 * copied runs by offset, since buf may move as it grows. */
typedef struct gather_buf {
    ProtobufCBuffer base;
    kvd__frame_gather_t *g;
    struct {
        const uint8_t *ref; /* NULL: the copied run [off, off + len) of buf */
        size_t off, len;
    } piece[KVD_FRAME_GATHER_IOV];
    int npieces;
    size_t mark; /* where in buf the current copied run starts */
    int failed;
} gather_buf_t;

static void gather_copy(gather_buf_t *b, size_t len, const uint8_t *data)
{
    kvd__frame_gather_t *g = b->g;

    if (g->len + len > g->cap) {
        size_t cap = g->cap * 2 > g->len + len ? g->cap * 2 : g->len + len;
        uint8_t *nb = realloc(g->buf, cap);

        if (nb == NULL) {
            b->failed = 1;
            return;
        }
        g->buf = nb;
        g->cap = cap;
    }
    memcpy(g->buf + g->len, data, len);
    g->len += len;
}

static void gather_append(ProtobufCBuffer *base, size_t len, const uint8_t *data)
{
    gather_buf_t *b = (gather_buf_t *)base;
    kvd__frame_gather_t *g = b->g;

    if (b->failed)
        return;
    /* a large run goes by reference while room is left for it, the copied
     * run before it and the one after */
    if (len >= KVD_FRAME_GATHER_MIN && b->npieces + 3 <= KVD_FRAME_GATHER_IOV) {
        if (g->len > b->mark) {
            b->piece[b->npieces].ref = NULL;
            b->piece[b->npieces].off = b->mark;
            b->piece[b->npieces].len = g->len - b->mark;
            b->npieces++;
        }
        b->piece[b->npieces].ref = data;
        b->piece[b->npieces].len = len;
        b->npieces++;
        b->mark = g->len;
        return;
    }
    gather_copy(b, len, data);
}

kvd_status_t kvd__frame_gather(const ProtobufCMessage *msg, kvd__frame_gather_t *g)
{
    gather_buf_t b;
    size_t n, packed;
    int i;

    if (msg == NULL || g == NULL)
        return KVD_ENULL;
    memset(g, 0, sizeof(*g));
    n = protobuf_c_message_get_packed_size(msg);
    if (n > UINT32_MAX)
        return KVD_ETOOBIG;
    g->cap = n + KVD_FRAME_HEADER_BYTES < 4096 ? n + KVD_FRAME_HEADER_BYTES : 4096;
    if ((g->buf = malloc(g->cap)) == NULL)
        return KVD_ENOMEM;
    g->buf[0] = (uint8_t)(n & 0xff);
    g->buf[1] = (uint8_t)((n >> 8) & 0xff);
    g->buf[2] = (uint8_t)((n >> 16) & 0xff);
    g->buf[3] = (uint8_t)((n >> 24) & 0xff);
    g->len = KVD_FRAME_HEADER_BYTES;
    memset(&b, 0, sizeof(b));
    b.base.append = gather_append;
    b.g = g;
    packed = protobuf_c_message_pack_to_buffer(msg, &b.base);
    if (b.failed) {
        kvd__frame_gather_free(g);
        return KVD_ENOMEM;
    }
    if (packed != n) {
        kvd__frame_gather_free(g);
        return KVD_EINTERNAL;
    }
    if (g->len > b.mark) {
        b.piece[b.npieces].ref = NULL;
        b.piece[b.npieces].off = b.mark;
        b.piece[b.npieces].len = g->len - b.mark;
        b.npieces++;
    }
    for (i = 0; i < b.npieces; i++) {
        g->iov[i].iov_base = b.piece[i].ref != NULL ? (void *)b.piece[i].ref
                                                    : (void *)(g->buf + b.piece[i].off);
        g->iov[i].iov_len = b.piece[i].len;
    }
    g->iovcnt = b.npieces;
    g->total = KVD_FRAME_HEADER_BYTES + n;
    return KVD_OK;
}

void kvd__frame_gather_free(kvd__frame_gather_t *g)
{
    if (g == NULL)
        return;
    free(g->buf);
    memset(g, 0, sizeof(*g));
}

kvd_status_t kvd__sock_send_iov(int sock, const struct iovec *iov, int iovcnt, const int *fds,
                               int nfds)
{
    struct iovec v[KVD_FRAME_GATHER_IOV];
    int at = 0, first = 1;

    if (sock < 0 || iovcnt < 1 || iovcnt > KVD_FRAME_GATHER_IOV || iov == NULL)
        return KVD_EINVAL;
    if (nfds < 0 || nfds > KVD_MAX_FDS_PER_FRAME || (nfds > 0 && fds == NULL))
        return KVD_EINVAL;
    memcpy(v, iov, (size_t)iovcnt * sizeof(*v));
    while (at < iovcnt) {
        ssize_t n;

        if (v[at].iov_len == 0) {
            at++;
            continue;
        }
        n = kvd__sock_sendmsg(sock, v + at, iovcnt - at, fds, first ? nfds : 0, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (wait_writable(sock) < 0)
                    return KVD_EIO;
                continue;
            }
            if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)
                return KVD_ECONN;
            return KVD_EIO;
        }
        first = 0; /* the descriptors went with the first byte sent */
        while (at < iovcnt && (size_t)n >= v[at].iov_len) {
            n -= (ssize_t)v[at].iov_len;
            at++;
        }
        if (at < iovcnt) {
            v[at].iov_base = (uint8_t *)v[at].iov_base + n;
            v[at].iov_len -= (size_t)n;
        }
    }
    return KVD_OK;
}

static ssize_t sock_recv(int sock, void *buf, size_t cap, int *fds, int *nfds, int max_fds,
                         int flags)
{
    struct msghdr mh;
    struct iovec iov;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * KERNEL_MAX_FDS)];
    } ctl;
    struct cmsghdr *c;
    ssize_t n;

    if (sock < 0 || buf == NULL || cap == 0)
        return -EINVAL;
    if (nfds != NULL && (*nfds < 0 || max_fds < 0 || (max_fds > 0 && fds == NULL)))
        return -EINVAL;

    memset(&mh, 0, sizeof(mh));
    iov.iov_base = buf;
    iov.iov_len = cap;
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof(ctl.buf);
    do {
        n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | flags);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;

    for (c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
        const unsigned char *data;
        size_t count, i;

        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        data = CMSG_DATA(c);
        count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (i = 0; i < count; i++) {
            int fd;

            memcpy(&fd, data + i * sizeof(int), sizeof(int));
            if (nfds != NULL && *nfds < max_fds)
                fds[(*nfds)++] = fd;
            else
                close(fd);
        }
    }
    return n;
}

ssize_t kvd__sock_recv(int sock, void *buf, size_t cap, int *fds, int *nfds, int max_fds)
{
    return sock_recv(sock, buf, cap, fds, nfds, max_fds, 0);
}

ssize_t kvd__sock_recv_nowait(int sock, void *buf, size_t cap, int *fds, int *nfds, int max_fds)
{
    return sock_recv(sock, buf, cap, fds, nfds, max_fds, MSG_DONTWAIT);
}

/* A varint at *p (before end); -1 when it is cut off or longer than 10 bytes. */
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    int shift;

    for (shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* Depth of nested messages the scan follows; deeper ones are left to the
 * decoder (the protocol nests three deep). */
#define SCAN_DEPTH 8

int kvd__utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;

    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp, min;

        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf)
            k = 1, cp = c & 0x1f, min = 0x80;
        else if (c >= 0xe0 && c <= 0xef)
            k = 2, cp = c & 0x0f, min = 0x800;
        else if (c >= 0xf0 && c <= 0xf4)
            k = 3, cp = c & 0x07, min = 0x10000;
        else
            return 0; /* a continuation byte first, or C0, C1, F5..FF */
        if (n - i <= k)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0; /* overlong, past Unicode, or a surrogate */
        i += k + 1;
    }
    return 1;
}

static int scan_strings(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                        const uint8_t *end, int depth, char *path, size_t path_len)
{
    while (p < end) {
        uint64_t key, len;
        const ProtobufCFieldDescriptor *f;

        if (get_varint(&p, end, &key) != 0)
            return -1;
        switch (key & 7) {
        case 0:
            if (get_varint(&p, end, &len) != 0)
                return -1;
            continue;
        case 1:
            if (end - p < 8)
                return -1;
            p += 8;
            continue;
        case 5:
            if (end - p < 4)
                return -1;
            p += 4;
            continue;
        case 2:
            break;
        default:
            return -1; /* groups: the decoder says what it makes of them */
        }
        if (get_varint(&p, end, &len) != 0 || len > (uint64_t)(end - p))
            return -1;
        f = key >> 3 <= UINT32_MAX
                ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3))
                : NULL;
        if (f != NULL && f->type == PROTOBUF_C_TYPE_STRING &&
            (memchr(p, 0, (size_t)len) || !kvd__utf8_valid(p, (size_t)len))) {
            snprintf(path, path_len, "%s", f->name);
            return memchr(p, 0, (size_t)len) ? KVD_WIRE_STR_NUL : KVD_WIRE_STR_UTF8;
        }
        if (f != NULL && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < SCAN_DEPTH) {
            char sub[128];
            int r = scan_strings(f->descriptor, p, p + len, depth + 1, sub, sizeof(sub));
            if (r != 0) {
                if (r > 0)
                    snprintf(path, path_len, "%s.%s", f->name, sub);
                return r;
            }
        }
        p += len;
    }
    return 0;
}

int kvd__wire_bad_string(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                        char *path, size_t path_len)
{
    if (desc == NULL || (buf == NULL && len > 0))
        return -1;
    if (path_len > 0)
        path[0] = '\0';
    return len ? scan_strings(desc, buf, buf + len, 0, path, path_len) : 0;
}

/* Whether a daemon may be serving at path: a socket there, or a path we
 * may not even look at (a service's directory closed to us: connecting
 * says so, rather than trying a per-user path where nothing runs). */
static int socket_present(const char *path)
{
    struct stat st;

    if (stat(path, &st) == 0)
        return S_ISSOCK(st.st_mode);
    return errno == EACCES;
}

kvd_status_t kvd__socket_path_resolve(char *buf, size_t len, const char *system_path)
{
    const char *env;
    int n;

    if (buf == NULL || len == 0)
        return KVD_ENULL;
    env = getenv("KVDOCK_SOCKET");
    if (env != NULL && env[0] != '\0') {
        n = snprintf(buf, len, "%s", env);
    } else if (system_path != NULL && system_path[0] != '\0' && socket_present(system_path)) {
        n = snprintf(buf, len, "%s", system_path);
    } else {
        env = getenv("XDG_RUNTIME_DIR");
        if (env != NULL && env[0] == '/')
            n = snprintf(buf, len, "%s/kvdock/kvdockd.sock", env);
        else
            n = snprintf(buf, len, "/tmp/kvdock-%u/kvdockd.sock", (unsigned)getuid());
    }
    if (n < 0 || (size_t)n >= len) {
        buf[0] = '\0';
        return KVD_ERANGE;
    }
    return KVD_OK;
}

kvd_status_t kvd__default_socket_path(char *buf, size_t len)
{
    return kvd__socket_path_resolve(buf, len, KVD_SYSTEM_SOCKET);
}

const char *kvd__op_name(int op_case)
{
    /* the Request oneof's field names are the operations' names */
    const ProtobufCFieldDescriptor *f =
        op_case > 0 ? protobuf_c_message_descriptor_get_field(&kvdock__request__descriptor,
                                                              (unsigned)op_case)
                    : NULL;

    return f != NULL && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) ? f->name : "unknown";
}
