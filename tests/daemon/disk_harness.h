/*
 * What the daemon suites of the disk level share (check_disk_daemon,
 * check_disk_restart): a scratch folder on the build tree's file system
 * (KVD_TEST_SCRATCH: the machine's disk, not tmpfs), kvdockd started on a
 * --cache-dir in it, and CacheCreate requests of a small layout.
 */
#ifndef KVDT_DISK_HARNESS_H
#define KVDT_DISK_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "harness.h"

/* A fresh folder NAME-PID under KVD_TEST_SCRATCH (what a killed run left
 * there removed first), made 0700; its path in dir. */
void kvdt_scratch_make(char *dir, size_t len, const char *name);
/* Remove dir and everything in it (what a case made unwritable too). */
void kvdt_scratch_remove(const char *dir);

/* Start kvdockd with --cache-dir cache_dir --disk-budget disk_budget and
 * extra (NULL-terminated, may be NULL), on sock (NULL: the harness's own),
 * and connect as client_name: the hello answered means the caches found in
 * cache_dir are reopened (the socket listens before, the loop serves only
 * after).  The connection. */
int kvdt_disk_start(kvdt_daemon_t *d, const char *sock, const char *cache_dir,
                    const char *disk_budget, const char *const *extra, const char *client_name);

/* A CacheCreate request and what it points to, in one place: built by
 * kvdt_cache_req, changed as a case needs (cc.shared, cl.num_layers, ...),
 * then sent as req.  Not to be copied (req points into it). */
typedef struct kvdt_cache_req {
    Kvdock__Request req;
    Kvdock__CacheCreate cc;
    Kvdock__CacheLayout cl;
} kvdt_cache_req_t;

/* q as the request (id) to make cache name of 2 layers of 4 tokens of 64
 * bytes, "bf16", with a host budget and a disk budget (0: none). */
void kvdt_cache_req(kvdt_cache_req_t *q, uint64_t id, const char *name, uint64_t budget,
                    uint64_t disk_budget);

#endif
