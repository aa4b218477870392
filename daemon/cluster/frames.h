/*
 * What the cluster's front door reads from the network before anything
 * else does (door.c owns the connections): the framing of control
 * messages on the TCP connection between two daemons, and the check of a
 * UCX worker address a peer gives for its lanes before UCX unpacks it.
 * Pure functions over bytes, no allocation: what the fuzz target
 * (tests/fuzz/fuzz_cluster.c) drives.
 */
#ifndef KVD_DAEMON_CLUSTER_FRAMES_H
#define KVD_DAEMON_CLUSTER_FRAMES_H

#include <stddef.h>
#include <stdint.h>

/* A frame: a 4-byte little-endian length n (1 <= n), then n bytes of a
 * packed kvdock.cluster.Msg. */
#define KVD_CW_HEADER 4u

enum { KVD_CW_NEED = 0, KVD_CW_FRAME = 1, KVD_CW_BAD = -1 };

/* The frame at the start of buf[0..len): KVD_CW_FRAME with its message's
 * length in *n (the message at buf + KVD_CW_HEADER), KVD_CW_NEED when
 * more bytes must come (*n: the message's length once the header is in,
 * else 0), KVD_CW_BAD when the header announces an empty message or one
 * over max bytes (nothing beyond the header is read). */
int kvd__cw_frame(const uint8_t *buf, size_t len, size_t max, uint32_t *n);

/* Write the header of a message of n bytes. */
void kvd__cw_header(uint8_t out[KVD_CW_HEADER], uint32_t n);

/* Is addr[0..len) a UCX worker address this daemon's UCX may unpack?
 * UCX (1.13) reads a worker address without its length and trusts every
 * field, so bytes a peer sends must be checked first: the address is
 * walked as UCX packs it (versions 1 and 2, non-unified), every field
 * inside len, and each transport it names must be one that own (this
 * daemon's own lane address, checked the same way) has, with the same
 * memory domain and the same device and interface address lengths.  The
 * contents of those addresses (hosts, ports) and the worker's id are the
 * peer's.  1: yes; 0: no. */
int kvd__cw_ucx_address_ok(const uint8_t *addr, size_t len, const uint8_t *own, size_t own_len);

#endif
