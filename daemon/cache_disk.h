/*
 * The daemon's disk level on the file system: --cache-dir, its checks and
 * its space, each cache's directory in it, and the manifest that lets a
 * restarted daemon make a cache again (with its owner, sharing rules and
 * layout) before its store recovers the blocks.  No protocol here.
 *
 * A cache's directory is named from its identity, so that two caches that
 * may live at once never share one: a private cache `u<UID>-<NAME>` (names
 * are unique per owner), a shared one `s-<NAME>` (unique among shared
 * caches).  NAME is [A-Za-z0-9._-], as cache names are.
 *
 * The manifest (`manifest` in the cache's directory) is text, one
 * `key=value` a line in a fixed order, ending with `crc32c=` over every
 * byte before that line; at most KVD_MANIFEST_MAX bytes.  It is written
 * atomically (a temporary file, fsync, rename, fsync of the directory)
 * and read strictly: the file must be a regular file of the daemon's user
 * that no one else may write, every line present once in its order,
 * every number within its bounds, the checksum right, and the identity
 * it holds must match its directory's name.  Anything else is refused with
 * why, and the caller logs and skips it: nothing here deletes what it
 * cannot trust.
 */
#ifndef KVD_DAEMON_CACHE_DISK_H
#define KVD_DAEMON_CACHE_DISK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cache.h"
#include "kvdock/status.h"

#define KVD_MANIFEST_MAX 4096
#define KVD_MANIFEST_NAME "manifest"
#define KVD_MANIFEST_VERSION 1
#define KVD_CACHE_DIRNAME_MAX 96
/* A dropped cache's directory is renamed to this prefix and its name,
 * then removed off the loop; one left by a crash is removed at start. */
#define KVD_CACHE_DIR_DROPPED ".dropped-"

/* What makes a cache again after a restart. */
typedef struct kvd__manifest {
    char name[64];
    uint32_t owner_uid;
    int shared, cluster;
    uint32_t allow_uids[16], allow_gids[16];
    uint32_t n_allow_uids, n_allow_gids;
    kvd__block_layout_t layout;
    uint64_t budget;      /* host memory */
    uint64_t disk_budget; /* bytes of records on disk */
} kvd__manifest_t;

/* The directory name of a cache (see above); 0, or -1 when name is not a
 * cache name. */
int kvd__cache_dirname(const char *name, uid_t owner, int shared, char *out, size_t out_len);

/* --cache-dir at start: made 0700 when missing (its parent must exist);
 * refused with why when it is not a directory, not the daemon user's,
 * writable by group or others, or not writable (its owner's write bit
 * clear, a read-only file system).  KVD_EINVAL / KVD_EPERM / KVD_EIO. */
kvd_status_t kvd__cache_dir_check(const char *dir, int *created, char *why, size_t why_len);

/* The file system's space for dir: avail (what an unprivileged writer may
 * still take) and total; -1 with why when statvfs fails. */
int kvd__cache_dir_space(const char *dir, uint64_t *avail, uint64_t *total, char *why,
                         size_t why_len);
/* Bytes the files under dir take on disk (one level of subdirectories,
 * as caches lay them out); lstat only, no link followed. */
uint64_t kvd__cache_dir_usage(const char *dir);

/* The manifest as text (len bytes); -1 when it does not fit. */
int kvd__manifest_format(const kvd__manifest_t *m, char *out, size_t out_len, size_t *len);
/* Parse text of len bytes strictly (see above); KVD_EINVAL with why. */
kvd_status_t kvd__manifest_parse(const char *text, size_t len, kvd__manifest_t *m, char *why,
                                 size_t why_len);
/* Write dir/manifest atomically; KVD_EIO with why. */
kvd_status_t kvd__manifest_write(const char *dir, const kvd__manifest_t *m, char *why,
                                 size_t why_len);
/* Read and check dir/manifest: the directory and the file this user's and
 * written by no one else, the text strict, the identity matching the
 * directory's name (dirname).  KVD_EPERM (not to be trusted), KVD_ENOENT
 * (no manifest), KVD_EINVAL (damaged), KVD_EIO, with why. */
kvd_status_t kvd__manifest_read(const char *dir, const char *dirname, kvd__manifest_t *m,
                                char *why, size_t why_len);

/* Remove a directory that holds files only (a cache's): its manifest
 * first, so that a crash half-way leaves nothing that is reopened.  Waits
 * for the disk: for the disk I/O threads.  0, or -errno of the first
 * failure (the rest still tried). */
int kvd__cache_dir_remove(const char *dir);

#endif
