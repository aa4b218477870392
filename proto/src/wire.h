/*
 * kvdock wire helpers, shared by the daemon and the client library:
 * framing (4-byte little-endian length + one protobuf message), socket I/O
 * with SCM_RIGHTS descriptor passing, and the default socket path.
 *
 * The message types come from kvdock.pb-c.h, generated from
 * proto/kvdock.proto at build time.
 */
#ifndef KVDOCK_WIRE_H
#define KVDOCK_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "kvdock.pb-c.h"
#include "kvdock/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 2: Indices.raw (index arrays as bytes), which a version-1 daemon would
 * ignore, answering with nothing done. */
#define KVD_PROTOCOL_VERSION 2u
#define KVD_FRAME_HEADER_BYTES 4u
#define KVD_DEFAULT_MAX_FRAME_BYTES (16u << 20)
/* Descriptors accepted with one frame; more are closed and refused. */
#define KVD_MAX_FDS_PER_FRAME 16

typedef enum kvd__parse {
    KVD__PARSE_ERROR = -1,    /* length past max_frame: ETOOBIG */
    KVD__PARSE_NEED_MORE = 0, /* not a whole frame yet */
    KVD__PARSE_FRAME = 1,     /* a whole frame: payload at buf + 4 */
} kvd__parse_t;

/*
 * Look at len buffered bytes.  Sets *payload_len as soon as the header is
 * there (so a reader can reserve room), before checking it against
 * max_frame: the length is checked before anything is allocated.
 */
kvd__parse_t kvd__frame_parse(const uint8_t *buf, size_t len, uint64_t max_frame,
                              size_t *payload_len);

/* Serialize msg into a new malloc'd frame (header + payload). */
kvd_status_t kvd__frame_pack(const ProtobufCMessage *msg, uint8_t **out, size_t *out_len);

/* A frame gathered, not copied: header and small fields in buf, each
 * bytes field of at least KVD_FRAME_GATHER_MIN bytes sent from the
 * message's own memory (which must stay unchanged until the frame is
 * sent).  iov[0..iovcnt) is the frame; kvd__frame_gather_free frees buf. */
#define KVD_FRAME_GATHER_MIN 2048u
#define KVD_FRAME_GATHER_IOV 16
typedef struct kvd__frame_gather {
    uint8_t *buf;
    size_t len, cap, total;
    struct iovec iov[KVD_FRAME_GATHER_IOV];
    int iovcnt;
} kvd__frame_gather_t;

/* Pack msg as a frame into *g (which need not be initialized).  total is
 * the frame's length, header included. */
kvd_status_t kvd__frame_gather(const ProtobufCMessage *msg, kvd__frame_gather_t *g);
void kvd__frame_gather_free(kvd__frame_gather_t *g);

/*
 * kvd__sock_send_all over iovcnt buffers (at most KVD_FRAME_GATHER_IOV),
 * in as few sendmsg calls as the socket takes.
 */
kvd_status_t kvd__sock_send_iov(int sock, const struct iovec *iov, int iovcnt, const int *fds,
                               int nfds);

/*
 * One sendmsg of the iovcnt buffers in iov with nfds descriptors (0 to
 * KVD_MAX_FDS_PER_FRAME) as SCM_RIGHTS data on the first byte,
 * MSG_NOSIGNAL | flags.  The bytes sent, or -1 with errno set.
 */
ssize_t kvd__sock_sendmsg(int sock, const struct iovec *iov, int iovcnt, const int *fds, int nfds,
                          int flags);

/*
 * Send all len bytes on a blocking socket, the descriptors (if any)
 * attached to the first byte.  Retries on EINTR and partial writes.
 * KVD_OK, or KVD_ECONN when the peer is gone, KVD_EIO otherwise.
 */
kvd_status_t kvd__sock_send_all(int sock, const void *buf, size_t len, const int *fds, int nfds);

/*
 * One recvmsg of at most cap bytes.  Descriptors that arrive are appended
 * to fds (up to max_fds; extra ones are closed) and *nfds is increased,
 * marked close-on-exec.  Returns the bytes read, 0 at end of stream, or
 * -errno (-EAGAIN on a non-blocking socket with nothing to read).
 */
ssize_t kvd__sock_recv(int sock, void *buf, size_t cap, int *fds, int *nfds, int max_fds);

/* As kvd__sock_recv, never waiting (MSG_DONTWAIT), whatever the socket's
 * mode: -EAGAIN when nothing is there. */
ssize_t kvd__sock_recv_nowait(int sock, void *buf, size_t cap, int *fds, int *nfds,
                              int max_fds);

/* Where the installed system service listens (deploy/kvdockd.socket). */
#define KVD_SYSTEM_SOCKET "/run/kvdock/kvdockd.sock"

/*
 * The socket path a client uses when none is given: $KVDOCK_SOCKET, else
 * KVD_SYSTEM_SOCKET when a socket is there (or its directory is closed to
 * us: connecting then says so), else the per-user path,
 * $XDG_RUNTIME_DIR/kvdock/kvdockd.sock, else /tmp/kvdock-<uid>/kvdockd.sock.
 * KVD_OK, or KVD_ERANGE if it does not fit in len.
 */
kvd_status_t kvd__default_socket_path(char *buf, size_t len);

/*
 * The same order with system_path in the place of KVD_SYSTEM_SOCKET;
 * NULL skips it: the path a daemon listens on when none is given
 * ($KVDOCK_SOCKET, else the per-user path), never the system service's.
 */
kvd_status_t kvd__socket_path_resolve(char *buf, size_t len, const char *system_path);

/* Whether s[0..n) is UTF-8 (no overlong forms, surrogates or code points
 * past U+10FFFF): 1 or 0. */
int kvd__utf8_valid(const uint8_t *s, size_t n);

/*
 * Does a string field of the encoded message buf (of type desc, nested
 * messages included) hold a NUL byte or bytes that are not UTF-8?  The
 * decoder cuts such a string at the NUL, so "ab\0cd" would pass for "ab";
 * and a string that is not UTF-8 (which proto3 strings must be) would go
 * on into names that status and JSON print: the daemon refuses both
 * first.  KVD_WIRE_STR_NUL or KVD_WIRE_STR_UTF8 with path set to the field
 * ("hello.client_name"), 0 when none is bad, -1 when the bytes do not
 * parse (left to the decoder to refuse).
 */
#define KVD_WIRE_STR_NUL 1
#define KVD_WIRE_STR_UTF8 2
int kvd__wire_bad_string(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                        char *path, size_t path_len);

/* The operation's name ("transfer", "pool_create", ...), "unknown" if none. */
const char *kvd__op_name(int op_case);

#ifdef __cplusplus
}
#endif

#endif /* KVDOCK_WIRE_H */
