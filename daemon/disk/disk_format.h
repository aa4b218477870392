/*
 * The disk level's files (docs/design/disk-level.md says why they are so).
 * Little-endian, fixed-width fields; every structure carries a CRC-32C.
 *
 * A store is a directory of segments, each three files:
 *   seg-NNNNNNNN.kvd   the segment: a 4096-byte header, then records
 *                      packed back to back (each 64-byte aligned);
 *                      written only forwards, in large aligned batches.
 *   seg-NNNNNNNN.idx   its index, written once the segment is sealed (full,
 *                      or at a clean close): one entry per record (offset,
 *                      sequence, key, parent).  Recovery reads it instead of
 *                      the segment; missing or damaged, the segment is read.
 *   seg-NNNNNNNN.drop  the offsets of its records dropped since, appended
 *                      4 bytes each; the segment goes once all are dropped.
 */
#ifndef KVD_DAEMON_DISK_FORMAT_H
#define KVD_DAEMON_DISK_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#define KVD_DISK_KEY_MAX 64
#define KVD_DISK_VERSION 1u

#define KVD_DISK_SEG_MAGIC 0x3147455344564b4bull /* "KKVDSEG1" */
#define KVD_DISK_IDX_MAGIC 0x3158444944564b4bull /* "KKVDIDX1" */
#define KVD_DISK_REC_MAGIC 0x5244564bu           /* "KVDR" */

#define KVD_DISK_SEG_HDR 4096u    /* the segment header's room */
#define KVD_DISK_REC_HDR 192u     /* a record's header */
#define KVD_DISK_REC_ALIGN 64u    /* records start on these */
#define KVD_DISK_LAYOUT_TEXT 160u

/* At offset 0 of a segment (the rest of its 4096 bytes zero). */
typedef struct kvd__disk_seg_hdr {
    uint64_t magic;
    uint32_t version;
    uint32_t seg_no;
    uint64_t layout_id;   /* the cache layout's identity (its hash) */
    uint64_t block_bytes; /* a record's data */
    uint64_t rec_bytes;   /* a record: header and data, aligned */
    uint64_t seg_bytes;   /* the segment's size when full */
    char layout[KVD_DISK_LAYOUT_TEXT]; /* the layout in words, for log lines */
    uint32_t reserved;
    uint32_t crc;         /* of the bytes before */
} kvd__disk_seg_hdr_t;

/* A record: this header, then block_bytes of data, then zeros up to
 * rec_bytes.  hcrc covers the header before it (so a scan can find
 * records), crc the header before hcrc and the data (so a read can trust
 * them). */
typedef struct kvd__disk_rec_hdr {
    uint32_t magic;
    uint8_t klen;
    uint8_t plen;         /* 0: the first block of its chain */
    uint16_t hdr_bytes;   /* KVD_DISK_REC_HDR */
    uint32_t seg_no;
    uint32_t reserved;
    uint64_t data_bytes;
    uint64_t layout_id;
    uint64_t seq;         /* the store's append count: the newest copy wins */
    uint8_t key[KVD_DISK_KEY_MAX];
    uint8_t parent[KVD_DISK_KEY_MAX];
    uint8_t pad[16];
    uint32_t hcrc;
    uint32_t crc;
} kvd__disk_rec_hdr_t;

_Static_assert(sizeof(kvd__disk_rec_hdr_t) == KVD_DISK_REC_HDR, "record header size");
_Static_assert(sizeof(kvd__disk_seg_hdr_t) <= KVD_DISK_SEG_HDR, "segment header size");

/* The index file's header, then count entries of kvd__disk_idx_ent_t each
 * followed by its key and parent bytes. */
typedef struct kvd__disk_idx_hdr {
    uint64_t magic;
    uint32_t version;
    uint32_t seg_no;
    uint64_t layout_id;
    uint64_t rec_bytes;
    uint64_t data_end;    /* the segment's bytes written */
    uint32_t count;
    uint32_t body_crc;    /* of the entries */
    uint64_t body_bytes;
    uint32_t reserved;
    uint32_t crc;         /* of the bytes before */
} kvd__disk_idx_hdr_t;

typedef struct kvd__disk_idx_ent {
    uint32_t off;
    uint8_t klen, plen;
    uint16_t reserved;
    uint64_t seq;
} kvd__disk_idx_ent_t;

uint32_t kvd__disk_crc32c(uint32_t crc, const void *data, size_t n);

#endif
