/*
 * libkvdock internals shared by the client's source files.
 */
#ifndef KVDOCK_CLIENT_INTERNAL_H
#define KVDOCK_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

#include "kvdock/client.h"
#include "spin.h"
#include "wire.h"

/* Largest reply frame this client accepts (replies are not bounded by the
 * daemon's request limit). */
#define KVD__MAX_REPLY_BYTES ((uint64_t)1 << 30)
#define KVD__ERR_MAX 512

/* Internals stay out of libkvdock.so's dynamic symbol table. */
#pragma GCC visibility push(hidden)

typedef struct kvd__pending kvd__pending_t;

/* Turns a successful reply into the caller's outputs. */
typedef kvd_status_t (*kvd__finish_cb)(kvd_client_t *cli, kvd__pending_t *p);

enum kvd__state {
    KVD__SENT = 0,      /* waiting for its reply */
    KVD__DONE = 1,      /* reply parked */
    KVD__ABANDONED = 2, /* reply to be discarded */
};

/* Where a request's reply goes: the caller's output pointers. */
typedef union kvd__out {
    struct {
        uint8_t *payload; /* owned copy, to compare with the echo */
        size_t len;
    } ping;
    struct {
        kvd_daemon_status_t *out;
        kvd_client_entry_t *clients;
        size_t cap;
    } status;
    struct {
        kvd_daemon_stats_t *out;
        kvd_op_stats_t *ops;
        size_t ops_cap;
        kvd_stream_stats_t *streams;
        size_t streams_cap;
    } stats;
    struct {
        kvd_pool_info_t *out;
    } pool;
    struct {
        kvd_mapping_t **out;
        uint32_t flags;
    } pexport;
    struct {
        kvd_pool_info_t *out;
        size_t cap;
        size_t *count;
    } list;
    struct {
        uint64_t *id;
        kvd_mapping_t **map;
    } buffer;
    struct {
        uint64_t *id;
    } event;
    struct {
        kvd_op_result_t *out;
    } op;
    struct {
        kvd_cache_info_t *out;
        size_t cap;
        size_t *count; /* lists */
    } cache;
    struct {
        kvd_cache_lookup_result_t *out;
    } lookup;
    struct {
        kvd_cache_evict_result_t *out;
    } evict;
    struct {
        uint8_t **base;
        uint64_t *bytes;
    } area;
} kvd__out_t;

struct kvd__pending {
    uint64_t id;
    int op; /* Kvdock__Request__OpCase */
    int state;
    kvd__finish_cb finish;
    kvd__out_t out;
    Kvdock__Response *resp;         /* once DONE */
    int fds[KVD_MAX_FDS_PER_FRAME]; /* descriptors that came with the reply */
    int nfds;
    bool area; /* its chain is in the key area until its reply comes */
};

/* Descriptors that arrived with one recvmsg, and the stream bytes it read
 * [start, end): they belong to the frame that read ended in. */
typedef struct kvd__fd_group {
    uint64_t start;
    uint64_t end;
    int fds[KVD_MAX_FDS_PER_FRAME];
    int nfds;
} kvd__fd_group_t;

struct kvd_client {
    int sock;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    kvd_hello_info_t info;
    int timeout_ms; /* blocking calls; 0: none */
    kvd__spin_t spin; /* how long a blocking wait polls before it sleeps (mu) */

    pthread_mutex_t mu; /* everything below but the receive state */
    pthread_cond_t cv;  /* a reader finished a round */
    pthread_mutex_t send_mu;

    bool reading; /* a thread owns the receive state */
    bool dead;
    kvd_status_t dead_status;
    char dead_msg[KVD__ERR_MAX];

    uint64_t next_id;
    kvd__pending_t **pend;
    size_t npend;
    size_t pend_cap;
    size_t outstanding; /* sent, reply not yet received */
    /* The key area (keyarea.c): area_state and the room under mu; the
     * bytes [0, area_top) are held by area_users requests. */
    int area_state;
    uint64_t area_want; /* bytes to ask for; 0: never */
    uint8_t *area;
    uint64_t area_bytes;
    uint64_t area_top;
    uint32_t area_users;

    /* Receive state: touched only by the thread that set reading. */
    uint8_t *rx;
    size_t rx_len;
    size_t rx_cap;
    uint64_t rx_pos; /* stream offset of rx[0] */
    kvd__fd_group_t *groups;
    size_t ngroups;
    size_t groups_cap;
};

/* Errors: set this thread's message for cli (NULL: the client-less slot). */
kvd_status_t kvd__client_fail(const kvd_client_t *cli, kvd_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Send req (its id is set here) with fds, and record where its reply goes.
 * On success *req_id is the request's id; on failure nothing is pending
 * and the caller still owns everything it passed.
 */
kvd_status_t kvd__submit(kvd_client_t *cli, Kvdock__Request *req, const int *fds, int nfds,
                         kvd__finish_cb finish, const kvd__out_t *out, uint64_t *req_id);

/* Wait for req_id's reply (timeout_ms < 0: none) and finish it. */
kvd_status_t kvd__wait(kvd_client_t *cli, uint64_t req_id, int timeout_ms);

/* Wait for id's reply with the client's timeout; on timeout the request
 * is abandoned (what a blocking call does after its submit). */
kvd_status_t kvd__wait_blocking(kvd_client_t *cli, uint64_t id);

/* req_id NULL: a blocking call (submit, then wait with the client's
 * timeout; on timeout the request is abandoned).  Otherwise kvd__submit. */
kvd_status_t kvd__call(kvd_client_t *cli, Kvdock__Request *req, const int *fds, int nfds,
                       kvd__finish_cb finish, const kvd__out_t *out, uint64_t *req_id);

/* Free everything the connection holds and close the socket. */
void kvd__conn_teardown(kvd_client_t *cli);

/* Take the reply's descriptor fd_index (ownership passes; -1 if none). */
int kvd__take_fd(kvd__pending_t *p, int fd_index);

/* Copy a protobuf string into a fixed buffer, truncating. */
void kvd__copy_str(char *dst, size_t cap, const char *src);

/* Drop the pending entry for a request that failed before it was sent,
 * and free a reply with its descriptors. */
void kvd__pending_free(kvd__pending_t *p);

/* Data operations' parts (ops.c): an Indices message and what it points
 * to; a Sync (NULL for in NULL); send an operation whose reply is an
 * OpReply (blocking when req_id is NULL). */
typedef struct kvd__idx_msg {
    Kvdock__Indices msg;
    Kvdock__BufRef ref;
} kvd__idx_msg_t;
kvd_status_t kvd__indices_build(kvd_client_t *cli, const kvd_indices_t *in, kvd__idx_msg_t *t,
                                const char *what);
Kvdock__Sync *kvd__sync_build(const kvd_sync_t *in, Kvdock__Sync *s);
kvd_status_t kvd__op_call(kvd_client_t *cli, Kvdock__Request *req, kvd_op_result_t *out,
                          uint64_t *req_id);

/* The key area (keyarea.c).  init reads $KVDOCK_KEY_AREA (a size, 0:
 * never use one); teardown unmaps it. */
void kvd__key_area_init(kvd_client_t *c);
void kvd__key_area_teardown(kvd_client_t *c);
/* Write in's chain into the area and name it in m through ref (which must
 * live until the request is sent): true when it went there, false when it
 * stays for the frame (too short, mixed widths, no area or no room).  The
 * room taken is held until kvd__key_area_put, which the request's pending
 * entry calls (mu held) when its reply comes or it is dropped unsent. */
bool kvd__key_area_take(kvd_client_t *c, const kvd_cache_keys_t *in, Kvdock__CacheKeys *m,
                        Kvdock__KeyAreaRef *ref);
void kvd__key_area_put(kvd_client_t *c);
/* Whether req names a chain in the key area. */
bool kvd__key_area_named(const Kvdock__Request *req);
/* A PoolInfo as the API's struct (pools.c). */
void kvd__pool_info_from_pb(kvd_pool_info_t *dst, const Kvdock__PoolInfo *src);

/* Mappings (mapping.c). */
kvd_status_t kvd__mapping_from_fd(const kvd_client_t *cli, int fd, uint64_t bytes, int32_t kind,
                                  int32_t device, kvd_mapping_t **out);
kvd_status_t kvd__mapping_from_ipc(const kvd_client_t *cli, const uint8_t *handle,
                                   size_t handle_len, uint64_t bytes, int32_t device,
                                   kvd_mapping_t **out);
kvd_status_t kvd__mapping_unmapped(const kvd_client_t *cli, int32_t kind, int fd,
                                   const uint8_t *handle, size_t handle_len, uint64_t bytes,
                                   kvd_mapping_t **out);

/* CUDA interop (cuda.c); KVD_ENOTSUP without CUDA.  Messages go to cli's
 * slot. */
kvd_status_t kvd__cuda_ipc_open(const kvd_client_t *cli, const uint8_t *handle, int device,
                                void **base);
void kvd__cuda_ipc_close(void *base);
kvd_status_t kvd__cuda_vmm_map(const kvd_client_t *cli, int fd, uint64_t bytes, int device,
                               void **base, uint64_t *mapped, unsigned long long *alloc);
void kvd__cuda_vmm_unmap(void *base, uint64_t mapped, unsigned long long alloc);

#pragma GCC visibility pop

#endif /* KVDOCK_CLIENT_INTERNAL_H */
