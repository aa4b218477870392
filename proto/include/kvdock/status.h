/*
 * kvdock status codes: one table for the whole project.
 *
 * The kernel library, the daemon, the protocol and the client library all
 * return these numbers, and the same numbers travel in a reply's status
 * field, so a client prints the words the daemon logged.  Codes are
 * append-only: never renumber or reuse one.
 */
#ifndef KVDOCK_STATUS_H
#define KVDOCK_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, number, message) */
#define KVD_STATUS_MAP(X)                                                       \
    X(OK, 0, "success")                                                         \
    X(EINVAL, 1, "invalid argument")                                            \
    X(ENULL, 2, "required pointer or buffer is missing")                        \
    X(ERANGE, 3, "index or byte range out of bounds")                           \
    X(EALIGN, 4, "misaligned pointer, stride or size")                          \
    X(EDTYPE, 5, "unsupported or mismatched data type")                         \
    X(ESHAPE, 6, "shape mismatch")                                              \
    X(EOVERFLOW, 7, "size arithmetic overflows 64 bits")                        \
    X(ENOMEM, 8, "out of memory")                                               \
    X(ECUDA, 9, "CUDA runtime or driver error")                                 \
    X(ENODEV, 10, "no usable GPU")                                              \
    X(ENOTSUP, 11, "operation not supported by this backend")                   \
    X(EPROTO, 12, "malformed message")                                          \
    X(EVERSION, 13, "protocol version mismatch")                                \
    X(ETOOBIG, 14, "frame larger than the maximum frame size")                  \
    X(ENOENT, 15, "no such pool, buffer or event")                              \
    X(EEXIST, 16, "already exists")                                             \
    X(EPERM, 17, "permission denied")                                           \
    X(ELIMIT, 18, "resource limit reached")                                     \
    X(EBUSY, 19, "resource busy")                                               \
    X(ESHUTDOWN, 20, "daemon is shutting down")                                 \
    X(ECONN, 21, "no connection to the daemon: cannot connect, or it was lost") \
    X(EIO, 22, "input/output error")                                            \
    X(ETIMEDOUT, 23, "timed out")                                               \
    X(EUNKNOWNOP, 24, "unknown operation")                                      \
    X(EINTERNAL, 25, "internal error")

typedef enum kvd_status {
#define KVD_STATUS_ENUM_(name, num, msg) KVD_##name = num,
    KVD_STATUS_MAP(KVD_STATUS_ENUM_)
#undef KVD_STATUS_ENUM_
} kvd_status_t;

/* Human-readable message for a status code ("unknown status" if none). */
const char *kvd_strerror(int status);

/* Symbolic name of a status code without the prefix ("EINVAL"). */
const char *kvd_err_name(int status);

#ifdef __cplusplus
}
#endif

#endif /* KVDOCK_STATUS_H */
