/*
 * The host-memory budget.  Every byte of host memory the daemon reserves
 * for its clients (host pools and buffers, pinned staging, socket buffers
 * past each connection's first read chunk, the cache tier's slabs and
 * index, leases, the memory of decoding and handling requests) is
 * counted here by kind and checked before it is reserved: against the
 * budget (--host-memory-budget), against the kind's own cap, and, for
 * reservations of a megabyte or more, against the memory the kernel says
 * is available (MemAvailable, or the room left in the daemon's cgroup).
 * memfd and pinned pages are limited by no file system and cannot be
 * reclaimed: past the machine's memory the kernel's OOM killer would end
 * processes across the machine, the inference engines among them.
 *
 * Loop thread only.
 */
#ifndef KVD_DAEMON_HOSTMEM_H
#define KVD_DAEMON_HOSTMEM_H

#include <stddef.h>
#include <stdint.h>

#include "kvdock/status.h"

typedef enum kvd__hostmem_kind {
    KVD_HM_POOLS = 0,    /* daemon-owned host pools */
    KVD_HM_BUFFERS = 1,  /* registered host buffers */
    KVD_HM_STAGING = 2,  /* operand staging (pinned on cuda) */
    KVD_HM_SOCKETS = 3,  /* receive buffers, write queues and key areas */
    KVD_HM_CACHE = 4,    /* the cache tier's slabs: the blocks' bytes */
    KVD_HM_CACHE_INDEX = 5, /* the cache tier's entries, free lists and tables */
    KVD_HM_LEASES = 6,   /* cache leases clients hold */
    KVD_HM_REQUESTS = 7, /* requests being decoded and handled, and the
                          * bookkeeping of those in flight */
    KVD_HM_COUNT = 8,
} kvd__hostmem_kind_t;

typedef struct kvd__hostmem {
    uint64_t budget;
    uint64_t used[KVD_HM_COUNT];
    uint64_t cap[KVD_HM_COUNT];     /* most a kind may hold (<= budget) */
    uint64_t refused[KVD_HM_COUNT]; /* reservations refused since start */
    uint64_t total;                 /* sum of used */
} kvd__hostmem_t;

/* The kind's name ("pools", "sockets", ...). */
const char *kvd__hostmem_kind_name(int kind);

/* budget bytes, every cap at the budget. */
void kvd__hostmem_init(kvd__hostmem_t *hm, uint64_t budget);

/*
 * Count bytes more of kind, or refuse: KVD_ELIMIT past the budget or the
 * kind's cap, KVD_ENOMEM past what the machine has available; why then
 * says so in human units ("64.0 GiB requested, 11.2 GiB left of a 12.0 GiB
 * budget").  On refusal nothing is counted.
 */
kvd_status_t kvd__hostmem_reserve(kvd__hostmem_t *hm, int kind, uint64_t bytes, char *why,
                                  size_t why_len);
void kvd__hostmem_release(kvd__hostmem_t *hm, int kind, uint64_t bytes);
/* Count bytes that are already held and cannot be refused (replies
 * queued for a client); the daemon stops reading from clients whose
 * replies pile up while the kind is full (see conn.c). */
void kvd__hostmem_charge(kvd__hostmem_t *hm, int kind, uint64_t bytes);
/* Whether kind, or the whole budget, is used up. */
int kvd__hostmem_full(const kvd__hostmem_t *hm, int kind);

/* Bytes the budget has left (0 when full). */
uint64_t kvd__hostmem_left(const kvd__hostmem_t *hm);

/*
 * What the machine has: physical memory and what is available now, each
 * the smaller of /proc/meminfo's and the daemon's cgroup's (memory.max
 * less memory.current).  -1 when /proc/meminfo cannot be read.
 */
int kvd__sysmem(uint64_t *total, uint64_t *available);

/* bytes as "64.0 GiB", "512 B"; returns buf. */
const char *kvd__fmt_bytes(uint64_t bytes, char *buf, size_t len);

#endif
