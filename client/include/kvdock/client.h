/*
 * libkvdock: the C client of kvdockd.
 *
 * Plain C on purpose (opaque handle, structs of plain fields, no protobuf
 * types): C programs, the admin CLI and Python's ctypes all call it.
 *
 * Calls
 * - Every call returns a kvd_status_t: KVD_OK, the daemon's status code for
 *   the request, or a local code (KVD_EINVAL for bad arguments, KVD_ECONN
 *   when the connection is lost, ...).  kvd_client_last_error() then says
 *   what exactly went wrong: the daemon's message, or a local one.
 * - Every operation exists twice: kvd_X() sends the request and blocks
 *   until its reply; kvd_X_submit() sends it and returns at once with a
 *   request id, and kvd_client_wait() collects the reply later.  Several
 *   requests may be in flight; replies that arrive for other ids are kept
 *   until they are asked for, in any order.  The output pointers given to
 *   a _submit call must stay valid until its kvd_client_wait() returns;
 *   they are written only by that wait.  Input arrays are copied at submit.
 * - A client may be shared by threads: sending and receiving are
 *   serialised inside.  kvd_client_last_error() is per thread.
 * - When the connection is lost, every call returns KVD_ECONN; replies that
 *   had already arrived can still be collected.  Reconnect by destroying
 *   the client and creating a new one.
 *
 * Memory
 * - A pool export or a buffer registration maps the shared memory into
 *   the calling process: host memory (MEM_HOST) through mmap of the memfd
 *   passed over the socket; device memory (MEM_DEVICE) through
 *   cudaIpcOpenMemHandle; VMM device memory (MEM_DEVICE_VMM) through the
 *   CUDA virtual memory API.  Device mappings need a library built with
 *   CUDA (kvd_client_has_cuda()); otherwise they are KVD_ENOTSUP.
 * - The caller's own memory becomes a pool with kvd_pool_import(), its
 *   regions described with the kvd_import_region_from_*() helpers.
 */
#ifndef KVDOCK_CLIENT_H
#define KVDOCK_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdock/status.h"
#include "kvdock/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 2: kvd_pool_info_t.orphaned; kvd_client_abi_version().
 * 3: kvd_daemon_status_t's host-memory budget, device memory and stream
 *    paths; kvd_sync_t.path, kvd_op_result_t.path, the copy path in
 *    kvd_stream_stats_t; kvd_mapping_write/read.
 * 4: the cache tier (kvd_cache_*); kvd_op_result_t.stored, skipped,
 *    refused.
 * 5: the cluster: kvd_cache_spec_t.cluster, kvd_cache_info_t.cluster,
 *    fetched, served, kvd_cache_lookup_result_t.local_hits,
 *    kvd_daemon_status_t.cluster.
 * 6: kvd_cache_lookup_result_t.waited_for, kvd_daemon_status_t.metrics_address and
 *    cache_budgets; KVD_CLUSTER_PEERS_MAX 16 -> 64 (kvd_daemon_status_t
 *    grows), so status carries every peer of a 64-peer cluster.  The wire
 *    helpers that leaked out under kvd_ names (kvd_frame_pack,
 *    kvd_default_socket_path, ...) are no longer exported: they are
 *    internal (kvd__) and were never declared here.
 * 7: the disk level: kvd_cache_spec_t.disk_budget_bytes, kvd_cache_info_t.disk
 *    (kvd_cache_disk_level_t), kvd_cache_lookup_result_t.disk_hits,
 *    kvd_daemon_status_t.disk (kvd_disk_status_t); kvd_cache_info_t,
 *    kvd_cache_spec_t, kvd_cache_lookup_result_t and kvd_daemon_status_t grow.
 * 8: kvd_disk_status_t.skipped and num_skipped (kvd_skipped_cache_t): the
 *    caches the daemon did not reopen; kvd_cache_info_t.peer_hits, and
 *    keys_hit counts the keys found on peers too; kvd_disk_status_t,
 *    kvd_daemon_status_t and kvd_cache_info_t grow. */
#define KVD_CLIENT_ABI_VERSION 8

/* KVD_CLIENT_ABI_VERSION of the library loaded at run time (a caller built
 * against another header, or a ctypes binding, compares it with its own). */
int kvd_client_abi_version(void);

#define KVD_HIST_MAX 64         /* latency histogram bounds kept per op */

/* The daemon's backend (the proto's Backend). */
typedef enum kvd_backend {
    KVD_BACKEND_UNSPECIFIED = 0,
    KVD_BACKEND_CPU = 1,
    KVD_BACKEND_CUDA = 2,
} kvd_backend_t;

/* FP8 set scaling (the proto's ScaleMode). */
typedef enum kvd_fp8_scale {
    KVD_FP8_SCALE_NONE = 0,
    KVD_FP8_SCALE_TENSOR = 1,   /* k_scale, v_scale */
    KVD_FP8_SCALE_PER_HEAD = 2, /* k_head_scales, v_head_scales */
} kvd_fp8_scale_t;

/* Names, memory kinds (and kvd_mem_kind_name), stream classes and element
 * types (kvd_dtype_t, KVD_DTYPE_I64, ...) come from kvdock/types.h, shared
 * with the daemon and the kernel library. */

/* "cpu", "cuda"; "unknown" otherwise. */
const char *kvd_backend_name(int backend);
/* True when this library was built with CUDA (device mappings work). */
bool kvd_client_has_cuda(void);

/* ------------------------------------------------------------------------ */
/* Connection                                                                */

typedef struct kvd_client kvd_client_t;

typedef struct kvd_limits {
    uint64_t max_frame_bytes;
    uint32_t max_inflight;
    uint32_t max_pools;
    uint64_t max_pool_bytes;
    uint64_t max_total_pool_bytes;
    uint32_t max_inline_bytes;
} kvd_limits_t;

/* What the daemon said at hello. */
typedef struct kvd_hello_info {
    uint32_t protocol_version;
    char daemon_version[KVD_NAME_MAX];
    int32_t backend; /* kvd_backend_t */
    char device_name[KVD_NAME_MAX];
    int32_t device_ordinal; /* -1 on cpu */
    kvd_limits_t limits;
    uint64_t client_id;
    uint32_t daemon_pid;
    bool admin;
} kvd_hello_info_t;

/*
 * Connect to the daemon at socket_path (NULL: the default path, which is
 * $KVDOCK_SOCKET, else /run/kvdock/kvdockd.sock when the system
 * service's socket is there, else $XDG_RUNTIME_DIR/kvdock/kvdockd.sock, else
 * /tmp/kvdock-<uid>/kvdockd.sock) and say hello as client_name (NULL:
 * "kvdock-client").  On failure *out is NULL and kvd_client_last_error(NULL)
 * says why.
 */
kvd_status_t kvd_client_create(const char *socket_path, const char *client_name,
                               kvd_client_t **out);
/* Close the connection and free the client; NULL and *p == NULL are fine.
 * Mappings made through the client stay valid (destroy them separately). */
void kvd_client_destroy(kvd_client_t **p);

/* The hello reply (valid as long as the client). */
const kvd_hello_info_t *kvd_client_info(const kvd_client_t *cli);
/* The socket path this client connected to. */
const char *kvd_client_socket_path(const kvd_client_t *cli);
/* The socket descriptor (readable when a reply is waiting); -1 if NULL. */
int kvd_client_fd(const kvd_client_t *cli);
/* False once the connection is lost. */
bool kvd_client_connected(const kvd_client_t *cli);

/*
 * Message of this thread's last failed call on cli (cli NULL: of the last
 * failed kvd_client_create and the helpers that take no client); "" when
 * there was none.  Valid until this thread's next call on cli.
 */
const char *kvd_client_last_error(const kvd_client_t *cli);

/*
 * Busy waiting: before a blocking call sleeps for its reply, it polls the
 * socket for up to spin_us microseconds, which saves the wake-up from
 * sleep (several microseconds on servers with deep idle states) when the
 * reply is quick, at the cost of a core while it polls.  It polls only
 * while that pays: while the machine's ready threads fit its cores, with
 * at most cores - 1 of the process's threads polling at once, and for a
 * window that adapts to how long replies take (docs/design/event-loop.md).
 * The default is
 * $KVDOCK_SPIN_US when set (0 to KVD_CLIENT_SPIN_US_MAX), else
 * KVD_CLIENT_SPIN_US_DEFAULT; 0 sleeps at once.  Larger values are capped.
 */
#define KVD_CLIENT_SPIN_US_DEFAULT 100
#define KVD_CLIENT_SPIN_US_MAX 1000000
void kvd_client_set_spin_us(kvd_client_t *cli, uint32_t spin_us);

/* Timeout of the blocking calls in milliseconds (0, the default: none).
 * A blocking call that times out returns KVD_ETIMEDOUT; its reply is
 * discarded when it comes. */
void kvd_client_set_timeout(kvd_client_t *cli, int timeout_ms);

/* Collect the reply to a submitted request, blocking until it comes. */
kvd_status_t kvd_client_wait(kvd_client_t *cli, uint64_t req_id);
/* The same with a timeout (ms; < 0: none).  KVD_ETIMEDOUT leaves the
 * request pending: wait for it again later. */
kvd_status_t kvd_client_wait_timeout(kvd_client_t *cli, uint64_t req_id, int timeout_ms);
/* Whether the reply to req_id has arrived (reads what is waiting on the
 * socket without blocking).  KVD_ENOENT for an unknown id. */
kvd_status_t kvd_client_poll(kvd_client_t *cli, uint64_t req_id, bool *done);
/* Requests submitted and not yet collected. */
size_t kvd_client_pending(const kvd_client_t *cli);
/* Forget a pending request: its reply is discarded when it comes (its
 * output pointers are never written). */
kvd_status_t kvd_client_abandon(kvd_client_t *cli, uint64_t req_id);

/* ------------------------------------------------------------------------ */
/* Session operations                                                        */

/* Send payload (may be NULL with len 0) and check that it comes back. */
kvd_status_t kvd_ping(kvd_client_t *cli, const void *payload, size_t len);
kvd_status_t kvd_ping_submit(kvd_client_t *cli, const void *payload, size_t len, uint64_t *req_id);

typedef struct kvd_client_entry {
    uint64_t id;
    char name[KVD_NAME_MAX];
    uint32_t pid;
    uint32_t uid;
    uint32_t inflight;
    uint32_t pools;
    uint64_t requests;
} kvd_client_entry_t;

/* One kind of host memory the daemon holds ("pools", "buffers", "staging",
 * "sockets", "cache"). */
#define KVD_MEMORY_KINDS_MAX 8
typedef struct kvd_memory_use {
    char kind[16];
    uint64_t used;
    uint64_t limit;
    uint64_t refused; /* reservations refused since the daemon started */
} kvd_memory_use_t;

/* The daemon's cluster (kvdockd --cluster-listen): its peers as it sees
 * them.  KVD_CLUSTER_PEERS_MAX is the daemon's limit on --cluster-peers,
 * so the array holds every peer. */
#define KVD_CLUSTER_PEERS_MAX 64
typedef struct kvd_cluster_peer {
    char address[128];    /* HOST:PORT, as configured */
    char state[16];       /* "up", "connecting", "down", "refused" */
    char error[160];      /* why it is not up */
    uint64_t rtt_us;      /* the last ping's round trip */
    uint64_t since_ms;    /* in this state for so long */
    uint64_t queries;
    uint64_t blocks_fetched;
    uint64_t bytes_fetched;
    uint64_t failures;    /* times it went down or missed a deadline */
} kvd_cluster_peer_t;

typedef struct kvd_cluster_status {
    bool enabled;         /* the daemon is in a cluster */
    char node[128];       /* its own address there */
    uint32_t deadline_ms;
    uint32_t inbound;     /* peers connected to it, proven */
    uint64_t blocks_fetched, bytes_fetched, blocks_served, bytes_served;
    uint64_t refused;     /* connections refused: no proof of the secret */
    uint32_t num_peers;   /* peers in the reply (may exceed the array) */
    kvd_cluster_peer_t peers[KVD_CLUSTER_PEERS_MAX];
} kvd_cluster_status_t;

#define KVD_DISK_SKIPPED_MAX 16 /* skipped caches a status carries */

/* A directory of --cache-dir the daemon left as it was when it started
 * (damaged, another user's, or a cache that does not fit its options):
 * not served until a start that can reopen it. */
typedef struct kvd_skipped_cache {
    char dir[256];          /* its name in --cache-dir */
    char name[KVD_NAME_MAX]; /* the cache's, from its manifest ("" unread) */
    uint32_t owner_uid;     /* from its manifest (0 unread) */
    char reason[400];       /* why it was not reopened */
} kvd_skipped_cache_t;

/* The daemon's disk level (kvdockd --cache-dir) as a whole. */
typedef struct kvd_disk_status {
    bool enabled;           /* the daemon has a --cache-dir; the rest is 0 otherwise */
    bool direct;            /* O_DIRECT in use (else the page cache; io_engine says why) */
    char cache_dir[256];    /* the daemon's --cache-dir (at most 255 bytes) */
    char io_engine[256];    /* "io_uring", or "threads (WHY)" */
    uint64_t budget_bytes;  /* --disk-budget */
    uint64_t reserved_bytes; /* the caches' disk budgets together */
    uint64_t used_bytes;    /* their records now */
    uint64_t fs_free_bytes; /* the file system's free space now */
    uint32_t num_skipped;   /* directories not reopened at start (may exceed the array) */
    kvd_skipped_cache_t skipped[KVD_DISK_SKIPPED_MAX];
} kvd_disk_status_t;

typedef struct kvd_daemon_status {
    char daemon_version[KVD_NAME_MAX];
    int32_t backend;
    char device_name[KVD_NAME_MAX];
    uint64_t uptime_ms;
    uint32_t clients;
    uint32_t pools;
    uint64_t pool_bytes;
    uint32_t buffers;
    uint32_t events;
    uint32_t inflight;
    char socket_path[256];
    bool shutting_down;
    size_t num_clients; /* entries in the reply (may exceed the array) */
    /* the host-memory budget (kvdockd --host-memory-budget) and its use */
    uint64_t host_budget;
    uint64_t host_used;
    uint64_t host_available; /* the machine's available memory now */
    uint64_t host_machine;   /* the machine's memory (or its cgroup's limit) */
    kvd_memory_use_t host_kinds[KVD_MEMORY_KINDS_MAX];
    uint32_t num_host_kinds;
    /* cuda: device memory free and in all, and what device pools leave free */
    uint64_t device_free;
    uint64_t device_total;
    uint64_t device_margin;
    /* each stream class's default path (kvd_copy_path_t), by class number */
    int32_t stream_paths[KVD_STREAM_END];
    kvd_cluster_status_t cluster;
    /* --metrics: the HOST:PORT it listens on (the port it picked for 0);
     * "": no endpoint */
    char metrics_address[80];
    /* the caches' budgets added up: past host_budget, they cannot all fill */
    uint64_t cache_budgets;
    kvd_disk_status_t disk; /* enabled: the daemon has a disk level (--cache-dir) */
} kvd_daemon_status_t;

/* Daemon status; the connected clients go to clients[0..cap) (may be NULL
 * with cap 0), out->num_clients says how many there were. */
kvd_status_t kvd_daemon_status(kvd_client_t *cli, kvd_daemon_status_t *out,
                               kvd_client_entry_t *clients, size_t cap);
kvd_status_t kvd_daemon_status_submit(kvd_client_t *cli, kvd_daemon_status_t *out,
                                      kvd_client_entry_t *clients, size_t cap, uint64_t *req_id);

typedef struct kvd_op_stats {
    char op[32];
    uint64_t requests;
    uint64_t errors;
    uint64_t bytes;
    uint32_t num_bounds; /* histogram bounds kept (<= KVD_HIST_MAX) */
    double bounds_us[KVD_HIST_MAX];
    uint64_t counts[KVD_HIST_MAX + 1]; /* num_bounds + 1 counts; the last one
                                        * has no upper bound */
    double sum_us;
} kvd_op_stats_t;

typedef struct kvd_stream_stats {
    char name[32];
    int32_t priority;
    uint32_t max_blocks;
    uint64_t launches;
    uint64_t bytes;
    uint64_t busy_ns;
    uint32_t queue_depth;
    int32_t path;                  /* kvd_copy_path_t: the class's default */
    uint64_t copy_engine_launches; /* operations that ran on the copy engines */
} kvd_stream_stats_t;

typedef struct kvd_daemon_stats {
    uint64_t bytes_in;
    uint64_t bytes_out;
    uint64_t connections;
    size_t num_ops; /* entries in the reply (may exceed the arrays) */
    size_t num_streams;
} kvd_daemon_stats_t;

kvd_status_t kvd_daemon_stats(kvd_client_t *cli, kvd_daemon_stats_t *out, kvd_op_stats_t *ops,
                              size_t ops_cap, kvd_stream_stats_t *streams, size_t streams_cap);
kvd_status_t kvd_daemon_stats_submit(kvd_client_t *cli, kvd_daemon_stats_t *out,
                                     kvd_op_stats_t *ops, size_t ops_cap,
                                     kvd_stream_stats_t *streams, size_t streams_cap,
                                     uint64_t *req_id);

/* Ask the daemon to exit (admin only); drain: finish in-flight work first. */
kvd_status_t kvd_daemon_shutdown(kvd_client_t *cli, bool drain);
kvd_status_t kvd_daemon_shutdown_submit(kvd_client_t *cli, bool drain, uint64_t *req_id);

/* ------------------------------------------------------------------------ */
/* Pools                                                                     */

typedef struct kvd_pool_spec {
    const char *name; /* 1..63 of [A-Za-z0-9._-] */
    int32_t kind;     /* KVD_MEM_HOST, KVD_MEM_DEVICE or KVD_MEM_DEVICE_VMM */
    uint32_t num_layers;
    uint64_t num_slots;
    uint64_t slot_bytes;
    bool mla;
    uint32_t page_size; /* 0 or 1: unpaged */
    bool shared;
} kvd_pool_spec_t;

typedef struct kvd_pool_info {
    uint64_t id;
    char name[KVD_NAME_MAX];
    int32_t kind;
    uint32_t num_layers;
    uint64_t num_slots;
    uint64_t slot_bytes;
    bool mla;
    uint32_t page_size;
    bool shared;
    bool imported;
    uint64_t bytes;
    uint64_t layer_stride;
    uint64_t v_offset;
    uint64_t slot_stride;
    uint64_t owner;
    bool orphaned; /* shared pool whose creator has gone: its user or an admin drops it */
} kvd_pool_info_t;

kvd_status_t kvd_pool_create(kvd_client_t *cli, const kvd_pool_spec_t *spec, kvd_pool_info_t *out);
kvd_status_t kvd_pool_create_submit(kvd_client_t *cli, const kvd_pool_spec_t *spec,
                                    kvd_pool_info_t *out, uint64_t *req_id);

/* Drop a pool by id, or by name when pool is 0. */
kvd_status_t kvd_pool_drop(kvd_client_t *cli, uint64_t pool, const char *name);
kvd_status_t kvd_pool_drop_submit(kvd_client_t *cli, uint64_t pool, const char *name,
                                  uint64_t *req_id);

/* The pools this client may see: the first cap go to out, *count says how
 * many there were. */
kvd_status_t kvd_pool_list(kvd_client_t *cli, kvd_pool_info_t *out, size_t cap, size_t *count);
/* Every client's pools (an admin's view; KVD_EPERM for others). */
kvd_status_t kvd_pool_list_all(kvd_client_t *cli, kvd_pool_info_t *out, size_t cap,
                               size_t *count);
kvd_status_t kvd_pool_list_all_submit(kvd_client_t *cli, kvd_pool_info_t *out, size_t cap,
                                      size_t *count, uint64_t *req_id);
kvd_status_t kvd_pool_list_submit(kvd_client_t *cli, kvd_pool_info_t *out, size_t cap,
                                  size_t *count, uint64_t *req_id);

/* Shared memory mapped into this process: an exported pool, a registered
 * buffer, or host memory made here for an import. */
typedef struct kvd_mapping {
    void *base;                               /* address of byte 0 (host, or device) */
    uint64_t bytes;                           /* bytes mapped */
    int32_t kind;                             /* kvd_mem_kind_t */
    int32_t device_ordinal;                   /* device memory: the daemon's device */
    int fd;                                   /* descriptor kept open (memfd, VMM fd); -1 if none */
    uint8_t ipc_handle[KVD_IPC_HANDLE_BYTES]; /* MEM_DEVICE: the handle */
    kvd_pool_info_t pool;                     /* pool exports: the pool */
    uint64_t buffer;                          /* buffer registrations: the buffer id */
} kvd_mapping_t;

enum {
    /* Export: fetch the handle or descriptor but do not map it (base NULL);
     * for callers that open it themselves (PyTorch, another process). */
    KVD_EXPORT_NO_MAP = 1u << 0,
};

/* Export a daemon-owned pool (by id, or by name when pool is 0) and map
 * it; *out is then destroyed with kvd_mapping_destroy(). */
kvd_status_t kvd_pool_export(kvd_client_t *cli, uint64_t pool, const char *name, uint32_t flags,
                             kvd_mapping_t **out);
kvd_status_t kvd_pool_export_submit(kvd_client_t *cli, uint64_t pool, const char *name,
                                    uint32_t flags, kvd_mapping_t **out, uint64_t *req_id);

/* Unmap and free; NULL and *p == NULL are fine. */
void kvd_mapping_destroy(kvd_mapping_t **p);

/* Address of layer's K (v false) or V (v true) in a daemon-owned pool's
 * mapping (pool.layer_stride, pool.v_offset); NULL when out of range. */
void *kvd_mapping_layer(const kvd_mapping_t *m, uint32_t layer, bool v);

/* Copy len bytes between the caller's host memory and a mapping at offset:
 * memcpy for host memory, a synchronous CUDA copy for device memory
 * (KVD_ENOTSUP in a library built without CUDA).  KVD_ERANGE when
 * [offset, offset + len) passes the mapping's end; nothing is copied then. */
kvd_status_t kvd_mapping_write(kvd_mapping_t *m, uint64_t offset, const void *src, uint64_t len);
kvd_status_t kvd_mapping_read(const kvd_mapping_t *m, uint64_t offset, void *dst, uint64_t len);

/* New shared host memory for an import: a memfd of bytes, mapped here,
 * sealed against shrinking and growing (the daemon requires a memfd it
 * maps to be sealed with F_SEAL_SHRINK). */
kvd_status_t kvd_mapping_create_host(uint64_t bytes, kvd_mapping_t **out);

/* One region of the caller's memory, for kvd_pool_import(). */
typedef struct kvd_import_region {
    int32_t kind; /* KVD_MEM_DEVICE, KVD_MEM_DEVICE_VMM or KVD_MEM_HOST */
    uint8_t ipc_handle[KVD_IPC_HANDLE_BYTES]; /* MEM_DEVICE: the allocation's */
    int fd;                                   /* MEM_DEVICE_VMM, MEM_HOST: descriptor to send */
    uint64_t bytes;                           /* size of the allocation or mapping */
} kvd_import_region_t;

/* Where one layer's K, V or latent starts. */
typedef struct kvd_memref {
    uint32_t region; /* index into kvd_pool_import_t.regions */
    uint64_t offset; /* bytes from the region's start */
} kvd_memref_t;

typedef struct kvd_pool_import {
    const char *name;
    uint32_t num_layers;
    uint64_t num_slots;
    uint64_t slot_bytes;
    uint64_t slot_stride; /* 0: slot_bytes */
    bool mla;
    uint32_t page_size;
    bool shared;
    const kvd_import_region_t *regions;
    uint32_t num_regions;
    const kvd_memref_t *k_layers; /* num_layers (the latent for MLA) */
    const kvd_memref_t *v_layers; /* num_layers for MHA, NULL for MLA */
} kvd_pool_import_t;

/* Make the caller's memory a pool.  Descriptors in the regions are sent
 * (duplicated by the kernel) and stay the caller's. */
kvd_status_t kvd_pool_import(kvd_client_t *cli, const kvd_pool_import_t *spec,
                             kvd_pool_info_t *out);
kvd_status_t kvd_pool_import_submit(kvd_client_t *cli, const kvd_pool_import_t *spec,
                                    kvd_pool_info_t *out, uint64_t *req_id);

/* A host mapping (kvd_mapping_create_host, or an exported MEM_HOST pool or
 * buffer) as an import region; the descriptor stays the mapping's. */
kvd_status_t kvd_import_region_from_mapping(const kvd_mapping_t *m, kvd_import_region_t *region);

/*
 * The cudaMalloc allocation that holds dptr, as a legacy IPC region: finds
 * the allocation's base and size (cuMemGetAddressRange), takes the base's
 * IPC handle, and sets *offset to dptr's offset in it.  KVD_ENOTSUP without
 * CUDA.
 */
kvd_status_t kvd_import_region_from_device_ptr(const void *dptr, kvd_import_region_t *region,
                                               uint64_t *offset);

/*
 * The cuMemCreate allocation mapped at dptr, as a VMM region: exports it as
 * a POSIX descriptor (region->fd, which the caller closes after the
 * import), sets *offset to dptr's offset in the allocation's mapping.
 * KVD_ENOTSUP without CUDA; KVD_EINVAL when dptr is not VMM memory.
 */
kvd_status_t kvd_import_region_from_vmm_ptr(const void *dptr, kvd_import_region_t *region,
                                            uint64_t *offset);

/* ------------------------------------------------------------------------ */
/* Buffers and events                                                        */

/* Register a buffer of bytes (KVD_MEM_HOST or KVD_MEM_DEVICE).  *id gets
 * its id.  map, when not NULL, gets the buffer mapped here (destroy it
 * with kvd_mapping_destroy).  If the mapping fails after the daemon made
 * the buffer, *id is set, the buffer stays registered, and the error is
 * returned. */
kvd_status_t kvd_buffer_register(kvd_client_t *cli, uint64_t bytes, int32_t kind, const char *name,
                                 uint64_t *id, kvd_mapping_t **map);
kvd_status_t kvd_buffer_register_submit(kvd_client_t *cli, uint64_t bytes, int32_t kind,
                                        const char *name, uint64_t *id, kvd_mapping_t **map,
                                        uint64_t *req_id);

kvd_status_t kvd_buffer_drop(kvd_client_t *cli, uint64_t buffer);
kvd_status_t kvd_buffer_drop_submit(kvd_client_t *cli, uint64_t buffer, uint64_t *req_id);

/* Register an interprocess event by its cudaIpcEventHandle_t bytes. */
kvd_status_t kvd_event_register(kvd_client_t *cli, const void *ipc_event_handle, uint64_t *id);
kvd_status_t kvd_event_register_submit(kvd_client_t *cli, const void *ipc_event_handle,
                                       uint64_t *id, uint64_t *req_id);

kvd_status_t kvd_event_drop(kvd_client_t *cli, uint64_t event);
kvd_status_t kvd_event_drop_submit(kvd_client_t *cli, uint64_t event, uint64_t *req_id);

/* The IPC handle of a cudaEvent_t created with cudaEventInterprocess |
 * cudaEventDisableTiming.  KVD_ENOTSUP without CUDA. */
kvd_status_t kvd_event_ipc_handle(void *cuda_event, uint8_t out[KVD_IPC_HANDLE_BYTES]);

/* ------------------------------------------------------------------------ */
/* Data operations                                                           */

/* An index array: inline (values non-NULL: count values of dtype, I32 or
 * I64) or count values of dtype at offset in registered buffer. */
typedef struct kvd_indices {
    const void *values;
    uint64_t count;
    int32_t dtype; /* KVD_DTYPE_I32 or KVD_DTYPE_I64; 0 (U8) means I64 */
    uint64_t buffer;
    uint64_t offset;
} kvd_indices_t;

/* Operand bytes: inline (data non-NULL) or bytes at offset in buffer. */
typedef struct kvd_data {
    const void *data;
    uint64_t bytes;
    uint64_t buffer;
    uint64_t offset;
} kvd_data_t;

/* A byte range of a registered buffer. */
typedef struct kvd_bufref {
    uint64_t buffer;
    uint64_t offset;
    uint64_t bytes;
} kvd_bufref_t;

/* Ordering and completion of a data operation (NULL: all defaults). */
typedef struct kvd_sync {
    uint64_t wait_event;   /* registered event waited on first (0: none) */
    uint64_t record_event; /* registered event recorded when done (0: none) */
    bool reply_at_enqueue; /* reply once the work and its events are enqueued */
    int32_t stream;        /* kvd_stream_class_t; 0: the op's class */
    uint32_t max_blocks;   /* thread-block budget; 0: the class default */
    bool copy_engine;      /* the same as path = KVD_PATH_COPY_ENGINE */
    int32_t path;          /* kvd_copy_path_t: how a transfer moves; 0: the
                            * daemon's choice (copy engines between host and
                            * device memory, kernels otherwise) */
} kvd_sync_t;

/* What a data operation did. */
typedef struct kvd_op_result {
    uint64_t rows;
    uint64_t skipped_oob;
    uint64_t bytes;
    bool enqueued;
    int32_t path; /* kvd_copy_path_t: how the rows moved */
    /* cache saves: blocks stored, found there already, refused (every
     * block held) */
    uint32_t stored;
    uint32_t skipped;
    uint32_t refused;
} kvd_op_result_t;

typedef struct kvd_kv_store {
    uint64_t pool;
    uint32_t layer;
    kvd_indices_t loc; /* num_tokens slots */
    kvd_data_t k;
    kvd_data_t v;        /* MHA only */
    uint64_t src_stride; /* bytes between token rows (0: slot_bytes) */
} kvd_kv_store_t;

typedef struct kvd_kv_fp8_set {
    uint64_t pool;
    uint32_t layer;
    kvd_indices_t loc;
    kvd_data_t k; /* num_tokens x num_heads x head_dim of src_dtype */
    kvd_data_t v;
    int32_t src_dtype;   /* KVD_DTYPE_F32, F16 or BF16 */
    int32_t cache_dtype; /* KVD_DTYPE_E4M3 or E5M2 */
    uint32_t num_heads;
    uint32_t head_dim;
    int32_t scale_mode; /* kvd_fp8_scale_t */
    float k_scale;
    float v_scale;
    const float *k_head_scales; /* num_heads each, SCALE_PER_HEAD */
    const float *v_head_scales; /* MHA pools only: NULL for MLA */
} kvd_kv_fp8_set_t;

typedef struct kvd_page_table_gather {
    kvd_bufref_t req_to_page; /* table_rows x table_cols of table_dtype */
    int32_t table_dtype;      /* I32 or I64; out has the same dtype */
    uint64_t table_rows;
    uint64_t table_cols;
    uint64_t table_stride; /* bytes (0: table_cols * size) */
    kvd_indices_t req_pool_indices;
    kvd_indices_t seq_lens;
    kvd_bufref_t out; /* bs x max_num_pages */
    uint64_t out_stride;
    uint64_t max_num_pages;
    uint32_t page_size;
    int64_t dummy_slot;
} kvd_page_table_gather_t;

typedef struct kvd_kv_transfer {
    uint64_t src_pool;
    uint64_t dst_pool;
    kvd_indices_t src;
    kvd_indices_t dst; /* as many as src */
    bool all_layers;
    uint32_t layer_begin;
    uint32_t layer_count; /* 0 with all_layers false: one layer */
} kvd_kv_transfer_t;

/* out may be NULL; sync may be NULL. */
kvd_status_t kvd_kv_store(kvd_client_t *cli, const kvd_kv_store_t *args, const kvd_sync_t *sync,
                          kvd_op_result_t *out);
kvd_status_t kvd_kv_store_submit(kvd_client_t *cli, const kvd_kv_store_t *args,
                                 const kvd_sync_t *sync, kvd_op_result_t *out, uint64_t *req_id);
kvd_status_t kvd_kv_fp8_set(kvd_client_t *cli, const kvd_kv_fp8_set_t *args, const kvd_sync_t *sync,
                            kvd_op_result_t *out);
kvd_status_t kvd_kv_fp8_set_submit(kvd_client_t *cli, const kvd_kv_fp8_set_t *args,
                                   const kvd_sync_t *sync, kvd_op_result_t *out, uint64_t *req_id);
kvd_status_t kvd_page_table_gather(kvd_client_t *cli, const kvd_page_table_gather_t *args,
                                   const kvd_sync_t *sync, kvd_op_result_t *out);
kvd_status_t kvd_page_table_gather_submit(kvd_client_t *cli, const kvd_page_table_gather_t *args,
                                          const kvd_sync_t *sync, kvd_op_result_t *out,
                                          uint64_t *req_id);
kvd_status_t kvd_kv_transfer(kvd_client_t *cli, const kvd_kv_transfer_t *args,
                             const kvd_sync_t *sync, kvd_op_result_t *out);
kvd_status_t kvd_kv_transfer_submit(kvd_client_t *cli, const kvd_kv_transfer_t *args,
                                    const kvd_sync_t *sync, kvd_op_result_t *out, uint64_t *req_id);

/* ------------------------------------------------------------------------ */
/* The cache tier                                                            */
/*
 * A cache is a named store of KV blocks in the daemon's host memory, shared
 * by the workers of a node; blocks are named by keys (1 to
 * KVD_CACHE_KEY_MAX bytes: in serving engines, hashes of a block's tokens
 * chained to the key before it).  The proto's "The cache tier" says what
 * each operation does; kvd_block_hashes() makes keys from token ids.
 */

#define KVD_CACHE_KEY_MAX 64
#define KVD_CACHE_ALLOW_MAX 16 /* allowed users, and groups, of a cache */
#define KVD_CACHE_KEYS_MAX 65536 /* keys in one request */
/* A chain of more than 16 keys of one width goes to the daemon through
 * memory it shares with the connection (the key area, asked for with the
 * first such chain), not through the socket; shorter chains, chains of
 * mixed widths and a daemon without key areas use the frame.  The area's
 * size is $KVDOCK_KEY_AREA when set (a size, 4K to 4M; 0: never use one),
 * else 1 MiB. */
#define KVD_CACHE_LAYER_EVENTS_MAX 128

typedef struct kvd_cache_layout {
    uint32_t num_layers;
    bool mla;                  /* one latent per layer instead of K and V */
    uint32_t tokens_per_block;
    uint64_t token_bytes;      /* one token's row of one layer's K (or V) */
    char dtype[16];            /* a label ("bf16"), compared exactly */
} kvd_cache_layout_t;

typedef struct kvd_cache_spec {
    const char *name; /* 1..63 of [A-Za-z0-9._-] */
    kvd_cache_layout_t layout;
    uint64_t budget_bytes;
    bool shared;
    const uint32_t *allow_uids; /* shared: only these users and groups (none: */
    uint32_t num_allow_uids;    /* every peer allowed to connect) */
    const uint32_t *allow_gids;
    uint32_t num_allow_gids;
    bool open_existing; /* return a usable cache of this name and layout */
    bool cluster;       /* lookups and loads reach the peers' caches of this name */
    /* bytes of block records on disk at most, within the daemon's
     * --disk-budget (KVD_ELIMIT past it); 0: no disk level.  Needs a daemon
     * with --cache-dir (else KVD_ENOTSUP).  Blocks then leave host memory for
     * disk rather than being dropped, and survive a restart of the daemon. */
    uint64_t disk_budget_bytes;
} kvd_cache_spec_t;

/* A cache's disk level: its state now and its counters since the daemon
 * started.  A block may be on both levels at once (read back into host
 * memory, or spilled and still there). */
typedef struct kvd_cache_disk_level {
    bool enabled;               /* the cache has a disk level; the rest is 0 otherwise */
    uint32_t blocks;            /* complete blocks on disk */
    uint64_t budget_bytes;
    uint64_t used_bytes;        /* bytes their records take */
    uint64_t hits;              /* keys of lookups found on disk only */
    uint64_t spills;            /* host copies dropped, the block staying on disk only
                                 * (every block is written through to disk) */
    uint64_t promotions;        /* blocks read back into host memory */
    uint64_t reads;             /* records read */
    uint64_t read_bytes;
    uint64_t writes;            /* batches written */
    uint64_t write_bytes;
    uint64_t evictions;         /* blocks dropped from disk */
    uint64_t checksum_failures; /* records that failed their checks (never served) */
    uint64_t io_errors;
    uint64_t no_space;          /* spills refused: the file system or budget was full */
    char path[384];             /* the cache's directory: cache_dir/u<UID>-<NAME>
                                 * (s-<NAME> when shared) */
} kvd_cache_disk_level_t;

typedef struct kvd_cache_info {
    uint64_t id;
    char name[KVD_NAME_MAX];
    kvd_cache_layout_t layout;
    uint64_t budget_bytes;
    uint64_t block_bytes;
    uint32_t capacity;   /* blocks the budget holds */
    uint32_t blocks;     /* resident */
    uint64_t used_bytes;
    uint64_t held_bytes; /* host memory held: slabs, entries, index */
    bool shared;
    uint32_t owner_uid;
    uint32_t allow_uids[KVD_CACHE_ALLOW_MAX];
    uint32_t num_allow_uids;
    uint32_t allow_gids[KVD_CACHE_ALLOW_MAX];
    uint32_t num_allow_gids;
    uint64_t lookups;
    uint64_t keys_asked;
    uint64_t keys_hit;   /* found here (host memory or disk) or on cluster peers */
    uint64_t saves;
    uint64_t stored;
    uint64_t skipped;
    uint64_t refused;
    uint64_t loads;
    uint64_t loaded;
    uint64_t evictions;
    uint32_t leases;
    uint64_t bytes_in;
    uint64_t bytes_out;
    bool cluster;
    uint64_t fetched;    /* blocks loads pulled from peers */
    uint64_t served;     /* blocks peers pulled from it */
    kvd_cache_disk_level_t disk; /* the level below host memory (disk.enabled) */
    uint64_t peer_hits;  /* of keys_hit, those found on cluster peers only */
} kvd_cache_info_t;

/* A chain of count keys: keys[i] of lens[i] bytes each, or (keys NULL) a
 * blob of count keys of key_size bytes back to back. */
typedef struct kvd_cache_keys {
    const void *const *keys;
    const size_t *lens;
    const void *blob;
    uint32_t key_size;
    uint32_t count;
} kvd_cache_keys_t;

typedef struct kvd_cache_lookup_result {
    uint32_t hits;              /* leading keys present */
    uint64_t lease;             /* the lease on them, or 0 */
    uint64_t lease_expires_ms;  /* from the reply */
    uint32_t local_hits;        /* of hits, in this daemon (the lease holds these); the
                                 * rest are on peers: a load by keys pulls them */
    char waited_for[256];       /* peers asked that did not answer (within the cluster's
                                 * deadline, or lost), HOST:PORT comma-separated: hits
                                 * counts the others; "" when all answered */
    uint32_t disk_hits;         /* of local_hits, those on disk only: a load reads
                                 * them back first */
} kvd_cache_lookup_result_t;

typedef struct kvd_cache_save {
    uint64_t cache;
    uint64_t pool;
    kvd_cache_keys_t keys;
    kvd_indices_t blocks;  /* inline: one page of the pool per key */
    const void *parent;    /* the key before keys[0] in its chain, or NULL */
    size_t parent_len;
} kvd_cache_save_t;

typedef struct kvd_cache_load {
    uint64_t cache;
    uint64_t pool;
    kvd_cache_keys_t keys;   /* or count 0 with a lease */
    uint64_t lease;
    kvd_indices_t blocks;    /* inline: one page of the pool per key */
    const uint64_t *layer_events; /* registered events, one per layer group */
    uint32_t num_layer_events;
    kvd_bufref_t layer_flags; /* or (buffer != 0) one uint32 per layer group, set to */
    uint32_t flag_value;      /* flag_value once the group has landed (not 0) */
} kvd_cache_load_t;

typedef struct kvd_cache_evict_result {
    uint32_t evicted;
    uint32_t busy;
    uint32_t missing;
} kvd_cache_evict_result_t;

/* Make a cache (or, with open_existing, find it); out may be NULL. */
kvd_status_t kvd_cache_create(kvd_client_t *cli, const kvd_cache_spec_t *spec,
                              kvd_cache_info_t *out);
kvd_status_t kvd_cache_create_submit(kvd_client_t *cli, const kvd_cache_spec_t *spec,
                                     kvd_cache_info_t *out, uint64_t *req_id);
/* Drop a cache by id, or by name when cache is 0 (owner or admin). */
kvd_status_t kvd_cache_drop(kvd_client_t *cli, uint64_t cache, const char *name);
kvd_status_t kvd_cache_drop_submit(kvd_client_t *cli, uint64_t cache, const char *name,
                                   uint64_t *req_id);
/* The caches this client may see: the first cap to out, *count how many. */
kvd_status_t kvd_cache_list(kvd_client_t *cli, kvd_cache_info_t *out, size_t cap, size_t *count);
kvd_status_t kvd_cache_list_submit(kvd_client_t *cli, kvd_cache_info_t *out, size_t cap,
                                   size_t *count, uint64_t *req_id);
/* One cache's figures, by id, or by name when cache is 0. */
kvd_status_t kvd_cache_stats(kvd_client_t *cli, uint64_t cache, const char *name,
                             kvd_cache_info_t *out);
kvd_status_t kvd_cache_stats_submit(kvd_client_t *cli, uint64_t cache, const char *name,
                                    kvd_cache_info_t *out, uint64_t *req_id);
/* How many leading keys are cached; with lease, held for this client
 * (lease_ms 0: the daemon's default). */
kvd_status_t kvd_cache_lookup(kvd_client_t *cli, uint64_t cache, const kvd_cache_keys_t *keys,
                              bool lease, uint32_t lease_ms, kvd_cache_lookup_result_t *out);
kvd_status_t kvd_cache_lookup_submit(kvd_client_t *cli, uint64_t cache,
                                     const kvd_cache_keys_t *keys, bool lease, uint32_t lease_ms,
                                     kvd_cache_lookup_result_t *out, uint64_t *req_id);
/* Save the blocks not yet cached; out->stored, skipped, refused. */
kvd_status_t kvd_cache_save(kvd_client_t *cli, const kvd_cache_save_t *args,
                            const kvd_sync_t *sync, kvd_op_result_t *out);
kvd_status_t kvd_cache_save_submit(kvd_client_t *cli, const kvd_cache_save_t *args,
                                   const kvd_sync_t *sync, kvd_op_result_t *out,
                                   uint64_t *req_id);
/* Load cached blocks (by keys or a lease) into the pool's pages. */
kvd_status_t kvd_cache_load(kvd_client_t *cli, const kvd_cache_load_t *args,
                            const kvd_sync_t *sync, kvd_op_result_t *out);
kvd_status_t kvd_cache_load_submit(kvd_client_t *cli, const kvd_cache_load_t *args,
                                   const kvd_sync_t *sync, kvd_op_result_t *out,
                                   uint64_t *req_id);
/* Evict keys and every block after them, or (all) everything not held. */
kvd_status_t kvd_cache_evict(kvd_client_t *cli, uint64_t cache, const kvd_cache_keys_t *keys,
                             bool all, kvd_cache_evict_result_t *out);
kvd_status_t kvd_cache_evict_submit(kvd_client_t *cli, uint64_t cache,
                                    const kvd_cache_keys_t *keys, bool all,
                                    kvd_cache_evict_result_t *out, uint64_t *req_id);
/* End a lease before its time. */
kvd_status_t kvd_cache_release(kvd_client_t *cli, uint64_t lease);

/* Make a CUDA stream wait until the uint32 at addr is >= value (a cache
 * load's layer flag: addr in a device buffer's mapping, or host memory
 * registered with CUDA).  The wait may be queued before the daemon queues
 * its write.  KVD_ENOTSUP without CUDA. */
kvd_status_t kvd_stream_wait_value32(void *cuda_stream, const void *addr, uint32_t value);
kvd_status_t kvd_cache_release_submit(kvd_client_t *cli, uint64_t lease, uint64_t *req_id);

/*
 * Chained block keys from token ids, the way serving engines name blocks:
 * key i is a 32-byte hash of (key i-1, or salt for the first; the tokens
 * of block i), for every whole block of tokens_per_block tokens.  Equal
 * prefixes (and equal salts: a model and its settings) give equal chains.
 * out receives num_tokens / tokens_per_block keys of KVD_BLOCK_HASH_BYTES;
 * *count says how many.  The hash is BLAKE2s-256, so that another
 * implementation (kvdock.block_hashes in Python) gives the same keys.
 */
#define KVD_BLOCK_HASH_BYTES 32
kvd_status_t kvd_block_hashes(const int64_t *tokens, size_t num_tokens, uint32_t tokens_per_block,
                              const void *salt, size_t salt_len, uint8_t *out, size_t cap_keys,
                              size_t *count);

#ifdef __cplusplus
}
#endif

#endif /* KVDOCK_CLIENT_H */
