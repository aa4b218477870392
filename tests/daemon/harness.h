/*
 * Test harness for the daemon suites: start the real kvdockd on a
 * temporary socket, talk to it with raw frames through proto/src/wire.h, stop
 * it.  Every wait has a timeout.
 */
#ifndef KVDT_HARNESS_H
#define KVDT_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wire.h"
#include "kvt_skip.h"
#include "kvt_time.h"

#define KVDT_TIMEOUT_MS ((int)KVT_MS(10000)) /* waits of the harness, scaled */
/* Every daemon a test starts has this host-memory budget unless its extra
 * arguments give another: no test can fill a CI machine's memory. */
#define KVDT_HOST_BUDGET "2G"

/* Resource limits (RLIMIT_NOFILE, RLIMIT_FSIZE; 0: inherited) of the
 * daemons started from now on.  RLIMIT_FSIZE makes a memfd larger than it
 * fail, so a test of a huge reservation cannot reserve it by accident. */
void kvdt_set_limits(uint64_t nofile, uint64_t fsize);
/* The two lowest descriptor numbers process pid has free: lowering its
 * RLIMIT_NOFILE (prlimit) to *f1 leaves it exactly one, *f0. */
void kvdt_free_fds(pid_t pid, int *f0, int *f1);

typedef struct kvdt_daemon {
    pid_t pid;
    char dir[64];
    char sock[128];
    char log[128];
} kvdt_daemon_t;

/* Start kvdockd --backend cpu --socket DIR/kvdockd.sock [extra...] (NULL
 * terminated) and wait until it accepts.  Aborts the test on failure. */
void kvdt_start(kvdt_daemon_t *d, const char *const *extra);
/* The same on a given socket path (the directory is still made, for the log). */
void kvdt_start_sock(kvdt_daemon_t *d, const char *sock, const char *const *extra);
/* Run kvdockd --backend cpu --socket sock [extra...] to its end; its exit
 * status (-1 on timeout: it is then killed). */
int kvdt_run(const char *sock, const char *const *extra, int timeout_ms);
/* The same with its log (stderr) in the file log, emptied first. */
int kvdt_run_log(const char *sock, const char *log, const char *const *extra, int timeout_ms);
/* SIGTERM (SIGKILL after the timeout) if still running, reap, remove the
 * directory.  The daemon's exit status (0 if it had exited already). */
int kvdt_stop(kvdt_daemon_t *d);
/* Wait for the daemon to exit; its exit status, or -1 on timeout. */
int kvdt_wait_exit(kvdt_daemon_t *d, int timeout_ms);
/* Print the daemon's log (on failure); kvdt_dump_file: a log at path. */
void kvdt_dump_log(const kvdt_daemon_t *d);
void kvdt_dump_file(const char *path);
/* Whether a line of d's log contains what; kvdt_file_has: of the file at path. */
int kvdt_log_has(const kvdt_daemon_t *d, const char *what);
int kvdt_file_has(const char *path, const char *what);
/* In a child just forked from a test: close every descriptor from 3 up but
 * keep (-1: none).  Check's message file is among them, and every process
 * that holds it can write into the test's record: the faults suite failed
 * twice in sanitizer runs under load with "Bad message type", its record
 * holding a path where a message should start.  A forked child calls this
 * before anything else and makes no Check assertion, so that the test's
 * own process is the record's only writer. */
void kvdt_child_close_fds(int keep);

int kvdt_connect(const char *sock);
/* Connect to sock as uid and gid with ngroups supplementary groups (needs
 * root): a forked child drops its identity, connects (SO_PEERCRED is
 * taken at connect time) and hands the socket back.  The socket, or -1
 * with *err (when err is not NULL) the child's connect errno. */
int kvdt_connect_as(const char *sock, uid_t uid, gid_t gid, size_t ngroups, const gid_t *groups,
                    int *err);

/* Send one Request frame (descriptors with its first byte). */
void kvdt_send(int fd, const Kvdock__Request *req, const int *fds, int nfds);
/* Send raw bytes. */
void kvdt_send_raw(int fd, const void *buf, size_t len);
/* One Response, or NULL at end of stream or timeout.  Descriptors that came
 * with it land in fds (up to 4) when fds is not NULL. */
Kvdock__Response *kvdt_recv(int fd, int *fds, int *nfds, int timeout_ms);
/* Send req and wait for its reply (the first reply must carry its id). */
Kvdock__Response *kvdt_call(int fd, Kvdock__Request *req);
Kvdock__Response *kvdt_call_fds(int fd, Kvdock__Request *req, const int *send_fds, int nsend,
                                int *fds, int *nfds);
/* Send req; the reply's status (or -1 with no reply); the reply is freed. */
int kvdt_status_of(int fd, Kvdock__Request *req);
/* The daemon's status on a hello'd connection (asserted OK); free with
 * kvdock__status_reply__free_unpacked. */
Kvdock__StatusReply *kvdt_status(int fd);
/* 1 when a ping on fd is answered OK. */
int kvdt_ping_ok(int fd);
/* 1 when the daemon closed fd (EOF) within timeout_ms, else 0. */
int kvdt_closed(int fd, int timeout_ms);

/* Connect and hello; the connected socket. */
int kvdt_client(const kvdt_daemon_t *d, const char *name);

/* Requests built on the stack: kvdt_req(&req, id) sets id and clears op. */
void kvdt_req_init(Kvdock__Request *req, uint64_t id);

/* Pool helpers on a hello'd connection; return the pool id (0 on error). */
uint64_t kvdt_pool_create(int fd, const char *name, uint32_t layers, uint64_t slots,
                          uint64_t slot_bytes, int mla);
/* Export a host pool and map it; *map_bytes set; NULL on failure. */
void *kvdt_pool_map(int fd, uint64_t pool, Kvdock__PoolInfo **info, size_t *map_bytes);
/* Register a host buffer and map it; returns id, *map set. */
uint64_t kvdt_buffer_map(int fd, uint64_t bytes, void **map);

#endif
