/*
 * The disk level's store: a log of block records in segment files of one
 * directory, for one cache layout.  No protocol and no key index here
 * (the cache keeps one index over both levels): the store appends a
 * record and says where it went, reads a record back from there and
 * checks it, drops records, and at open hands every whole record it finds
 * to its caller.  Caller's thread only (the daemon's loop); the disk work
 * runs on the I/O engine (disk_io.h), nothing here waits for it but
 * kvd__disk_store_open and kvd__disk_store_close.
 *
 * Writes: records are packed into the open segment in order and written
 * in batches of write_bytes (aligned, O_DIRECT where the file system takes
 * it), up to max_writes batches in flight; a batch goes when full or at
 * kvd__disk_store_flush.  An append completes once its batch is on disk,
 * and appends complete in the order made, whatever order their batches'
 * writes end in (the cache's recency follows it).
 * Reads: the aligned range around one record, checked (magic, layout,
 * key, parent, length, CRC-32C) before its data is copied out; a record
 * that fails is counted, logged and reported as KVD_EIO, never served.
 * Drops: the record's whole pages are punched out of the file, its offset
 * appended to the segment's drop file; a sealed segment whose records are
 * all dropped is deleted.
 */
#ifndef KVD_DAEMON_DISK_STORE_H
#define KVD_DAEMON_DISK_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "disk_format.h"
#include "disk_io.h"
#include "kvdock/status.h"

typedef struct kvd__disk_store kvd__disk_store_t;

/* Where a record lives: 0 is no record. */
typedef uint64_t kvd__disk_loc_t;
#define KVD_DISK_LOC(seg, off) (((uint64_t)(seg) << 32) | (uint32_t)(off))
#define KVD_DISK_LOC_SEG(l) ((uint32_t)((l) >> 32))
#define KVD_DISK_LOC_OFF(l) ((uint32_t)(l))

typedef struct kvd__disk_store_config {
    const char *dir;          /* exists, owned by this user, not writable by others */
    uint64_t layout_id;       /* records of another layout are refused */
    const char *layout_text;  /* the layout in words, for log lines */
    uint64_t block_bytes;     /* one record's data */
    uint64_t segment_bytes;   /* 0: 256 MiB; at least a few records */
    uint32_t write_bytes;     /* a batch; 0: 8 MiB */
    uint32_t max_writes;      /* batches in flight; 0: 8 */
    int buffered;             /* never O_DIRECT (also chosen where refused) */
} kvd__disk_store_config_t;

/* A record found at open. */
typedef struct kvd__disk_found {
    const uint8_t *key, *parent; /* parent NULL: a chain's first */
    uint8_t klen, plen;
    uint64_t seq;
    kvd__disk_loc_t loc;
} kvd__disk_found_t;

/* Return 1 to keep the record, 0 to drop it. */
typedef int (*kvd__disk_found_cb)(void *arg, const kvd__disk_found_t *f);

typedef struct kvd__disk_store_stats {
    uint64_t records;         /* live */
    uint64_t live_bytes;      /* records * rec_bytes */
    uint64_t file_bytes;      /* the segments' sizes */
    uint64_t segments;
    uint64_t appends, append_bytes, writes, write_bytes;
    uint64_t reads, read_bytes;
    uint64_t read_buffers;    /* bounce buffers made: at most the reads let in flight */
    uint64_t drops;
    uint64_t checksum_failures;
    uint64_t io_errors;
    uint64_t no_space;        /* appends refused: the file system was full */
    uint64_t skipped_files;   /* at open: another layout, owner, damaged */
    uint64_t rebuilt_indexes; /* at open: segments read for want of an index */
    uint64_t lost_records;    /* at open: beyond a truncated end, or torn */
    int direct;               /* O_DIRECT in use */
} kvd__disk_store_stats_t;

/* Opens dir (checked: a directory, this user's, not group- or
 * world-writable; KVD_EPERM / KVD_EINVAL / KVD_EIO with why otherwise) and
 * recovers it: found is called for every whole record of this layout, in
 * order of age (the oldest first); files that cannot be trusted are
 * logged and skipped.  New records go to a new segment. */
kvd_status_t kvd__disk_store_open(kvd__disk_store_t **out, const kvd__disk_store_config_t *cfg,
                                  kvd__disk_io_t *io, kvd__disk_found_cb found, void *arg,
                                  char *why, size_t why_len);
/* Writes what is queued, waits for everything in flight, seals the open
 * segment (its index written) and frees.  NULL is fine. */
void kvd__disk_store_close(kvd__disk_store_t **s);

typedef void (*kvd__disk_append_cb)(void *arg, kvd_status_t st, kvd__disk_loc_t loc);
/* Append a record of key (after parent; NULL: a chain's first) with the
 * block_bytes at src, which must stay unchanged until cb runs (from
 * kvd__disk_io_poll; never from inside this call).  KVD_OK: cb will run;
 * else (a refused key length, a store that failed) it will not. */
kvd_status_t kvd__disk_append(kvd__disk_store_t *s, const uint8_t *key, size_t klen,
                              const uint8_t *parent, size_t plen, const void *src,
                              kvd__disk_append_cb cb, void *arg);
/* Send the batch being filled now rather than when it is full. */
void kvd__disk_store_flush(kvd__disk_store_t *s);

typedef void (*kvd__disk_read_cb)(void *arg, kvd_status_t st);
/* Read the record at loc, which must be key's, into dst (block_bytes).
 * cb gets KVD_OK, or KVD_EIO when the record failed its checks or the
 * read failed (counted and logged; the caller treats it as missing). */
kvd_status_t kvd__disk_read(kvd__disk_store_t *s, kvd__disk_loc_t loc, const uint8_t *key,
                            size_t klen, void *dst, kvd__disk_read_cb cb, void *arg);
/* The record at loc is no longer wanted (not while it is being read). */
void kvd__disk_drop(kvd__disk_store_t *s, kvd__disk_loc_t loc);

/* Whether files in dir take O_DIRECT (1), or not (0, with why: tmpfs,
 * some network file systems): then the daemon writes through the page
 * cache with the thread pool, and says so. */
int kvd__disk_probe_direct(const char *dir, char *why, size_t why_len);

void kvd__disk_store_stats(const kvd__disk_store_t *s, kvd__disk_store_stats_t *out);
/* Bytes one record takes (header and data, aligned). */
uint64_t kvd__disk_store_rec_bytes(const kvd__disk_store_t *s);

#endif
