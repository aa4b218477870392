/*
 * kvdock's shared vocabulary, with status.h: the enums whose numbers travel
 * in the protocol (proto/kvdock.proto) and that every part uses, defined
 * once here.  The kernel library, the daemon, libkvdock and its public
 * header include this; the Python client's copies are checked against it
 * (tests/python/test_abi.py).  Numbers are the proto's: append-only.
 */
#ifndef KVDOCK_TYPES_H
#define KVDOCK_TYPES_H

#ifdef __cplusplus
extern "C" {
#endif

/* Names of pools, buffers, caches and clients: at most KVD_NAME_MAX - 1
 * bytes. */
#define KVD_NAME_MAX 64
/* cudaIpcMemHandle_t and cudaIpcEventHandle_t. */
#define KVD_IPC_HANDLE_BYTES 64

/* Element types (the proto's DType). */
typedef enum kvd_dtype {
    KVD_DTYPE_U8 = 0,
    KVD_DTYPE_I32 = 1,
    KVD_DTYPE_I64 = 2,
    KVD_DTYPE_F32 = 3,
    KVD_DTYPE_F16 = 4,
    KVD_DTYPE_BF16 = 5,
    KVD_DTYPE_E4M3 = 6, /* float8 e4m3fn: max 448, no infinities, NaN 0x7f */
    KVD_DTYPE_E5M2 = 7, /* float8 e5m2: max 57344 */
} kvd_dtype_t;

/* Where memory lives (the proto's MemKind). */
typedef enum kvd_mem_kind {
    KVD_MEM_UNSPECIFIED = 0,
    KVD_MEM_HOST = 1,       /* memfd pages (pinned on the cuda backend) */
    KVD_MEM_DEVICE = 2,     /* cudaMalloc, legacy CUDA IPC handle */
    KVD_MEM_DEVICE_VMM = 3, /* cuMemCreate, POSIX file descriptor */
} kvd_mem_kind_t;

/* "host", "device", "device-vmm"; "unknown" otherwise. */
const char *kvd_mem_kind_name(int kind);

/* Classes of work, each with its own stream (the proto's StreamClass).
 * The daemon's per-class arrays are indexed by these numbers, from
 * KVD_STREAM_FIRST to KVD_STREAM_END - 1. */
typedef enum kvd_stream_class {
    KVD_STREAM_DEFAULT = 0, /* the operation's usual class */
    KVD_STREAM_RELOAD = 1,  /* host to device (high priority) */
    KVD_STREAM_WRITE = 2,   /* store, fp8 set, gather (high priority) */
    KVD_STREAM_OFFLOAD = 3, /* device to host (low priority) */
    KVD_STREAM_D2D = 4,     /* device to device (low priority) */
} kvd_stream_class_t;
#define KVD_STREAM_FIRST 1
#define KVD_STREAM_END 5

/* How a transfer moves its rows (the proto's CopyPath). */
typedef enum kvd_copy_path {
    KVD_PATH_DEFAULT = 0,     /* the daemon's choice */
    KVD_PATH_COPY_ENGINE = 1, /* the copy engines: no SM */
    KVD_PATH_KERNEL = 2,      /* a copy kernel within the class's block budget */
} kvd_copy_path_t;

#ifdef __cplusplus
}
#endif

#endif /* KVDOCK_TYPES_H */
