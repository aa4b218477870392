/*
 * Counters: per operation (requests, errors, bytes, latency histogram) and
 * per stream class (launches, bytes, busy time, queue depth).  Loop thread
 * only.
 */
#ifndef KVD_DAEMON_STATS_H
#define KVD_DAEMON_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "options.h"

#define KVD_HIST_BOUNDS 14

/* Upper bounds (microseconds) of the latency buckets; one more bucket
 * holds everything slower. */
extern const double kvd__hist_bounds_us[KVD_HIST_BOUNDS];

typedef struct kvd__op_counters {
    uint64_t requests;
    uint64_t errors;
    uint64_t bytes;
    uint64_t counts[KVD_HIST_BOUNDS + 1];
    double sum_us;
} kvd__op_counters_t;

typedef struct kvd__stream_counters {
    uint64_t launches;
    uint64_t copy_engine_launches;
    uint64_t bytes;
    uint64_t busy_ns;
    uint64_t busy_since;
    uint32_t depth;
} kvd__stream_counters_t;

typedef struct kvd__stats {
    kvd__op_counters_t *ops; /* one per dispatch-table row, plus "unknown" */
    size_t nops;
    kvd__stream_counters_t streams[KVD_STREAM_END];
    uint64_t bytes_in;
    uint64_t bytes_out;
    uint64_t connections;
    /* connections closed or refused to keep the daemon's resources */
    uint64_t timeouts_hello;      /* no hello in time */
    uint64_t timeouts_frame;      /* a frame not whole in time */
    uint64_t refused_no_fd;       /* accepted and refused: no descriptors left */
    uint64_t refused_socket_mem;  /* a frame that did not fit the socket-buffer memory */
} kvd__stats_t;

int kvd__stats_init(kvd__stats_t *s, size_t nops);
void kvd__stats_deinit(kvd__stats_t *s);

/* A reply sent: op row, its status, bytes moved, latency. */
void kvd__stats_op(kvd__stats_t *s, size_t op, int status, uint64_t bytes, uint64_t latency_ns);
void kvd__stats_stream_enter(kvd__stats_t *s, int sclass, uint64_t now_ns);
void kvd__stats_stream_leave(kvd__stats_t *s, int sclass, uint64_t bytes, int copy_engine,
                             uint64_t now_ns);
/* Busy time including the current busy period. */
uint64_t kvd__stats_stream_busy(const kvd__stats_t *s, int sclass, uint64_t now_ns);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t kvd__now_ns(void);

#endif
