/*
 * A raw cluster peer for the hostile-peer tests: a TCP connection to a
 * daemon's --cluster-listen address (the front door) that sends whatever
 * it is told (framed messages in turn or not, or any bytes at all) and
 * reads what the daemon answers.  It can also prove the secret, to act as
 * a trusted peer that misbehaves.
 */
#ifndef KVDOCK_TEST_CLIENT_RAWPEER_H
#define KVDOCK_TEST_CLIENT_RAWPEER_H

#include <stddef.h>
#include <stdint.h>

#include "cluster.pb-c.h"

#define RAWPEER_NONCE 16
#define RAWPEER_VERSION 2 /* the protocol version kvdockd speaks */

typedef struct rawpeer rawpeer_t;

rawpeer_t *rawpeer_new(void);
void rawpeer_free(rawpeer_t *rp);

/* Connect to 127.0.0.1:port from the loopback address `from` (NULL:
 * 127.0.0.1); 0 or -1. */
int rawpeer_connect(rawpeer_t *rp, int port);
int rawpeer_connect_from(rawpeer_t *rp, const char *from, int port);

/* Open n more connections to 127.0.0.1:port from `from` (NULL: 127.0.0.1)
 * that say nothing (closed with rp); how many connected. */
int rawpeer_open_silent(rawpeer_t *rp, const char *from, int port, int n);

/* Write data on every connection rawpeer_open_silent opened (what the
 * socket takes at once). */
void rawpeer_silent_send(rawpeer_t *rp, const void *data, size_t len);

/* How many of the silent connections the daemon has closed, looking for
 * up to timeout_ms. */
int rawpeer_silent_closed(rawpeer_t *rp, int timeout_ms);

/* Write bytes as they are (0: all written; -1: the connection failed). */
int rawpeer_send_raw(rawpeer_t *rp, const void *data, size_t len);
/* One framed message: its 4-byte little-endian length, then m packed. */
int rawpeer_send_msg(rawpeer_t *rp, const Kvdock__Cluster__Msg *m);

/* Read until a message of case want came (returned, the caller frees it
 * with kvdock__cluster__msg__free_unpacked), the connection ended or
 * timeout_ms passed (NULL). */
Kvdock__Cluster__Msg *rawpeer_wait(rawpeer_t *rp, Kvdock__Cluster__Msg__MCase want,
                                   int timeout_ms);

/* Read until the daemon closed the connection (1) or timeout_ms passed
 * (0); the last Refused reason seen is kept in *why if given. */
int rawpeer_wait_closed(rawpeer_t *rp, int timeout_ms, char *why, size_t why_len);

/* Hello with this version and rawpeer's nonce; then Challenge (checked),
 * Auth, Welcome with the key of the secret file's text (trailing
 * newlines stripped, as the daemon reads it).  0: welcomed; -1: refused
 * or closed. */
int rawpeer_hello(rawpeer_t *rp, uint32_t version);
int rawpeer_auth(rawpeer_t *rp, const char *secret);

/* The last Auth frame rawpeer_auth sent (for a replay), its length. */
size_t rawpeer_last_auth(const rawpeer_t *rp, uint8_t *out, size_t cap);
/* Use this nonce in Hello from now on (a replay says the same). */
void rawpeer_set_nonce(rawpeer_t *rp, const uint8_t nonce[RAWPEER_NONCE]);

/* Act as a configured peer of a daemon: listen on 127.0.0.1:port, take
 * the daemon's connection, answer its Hello with a Challenge proving the
 * secret, take its Auth, say Welcome and wait for its Lanes (the UCX
 * worker addresses of its lanes, kept).  0, or -1 (timeout_ms passed,
 * or the daemon said something else). */
int rawpeer_listen(rawpeer_t *rp, int port);
int rawpeer_serve(rawpeer_t *rp, const char *secret, int timeout_ms);
/* Lanes the daemon said it has (after rawpeer_serve). */
int rawpeer_lanes(const rawpeer_t *rp);
/* Send a block message to the daemon's lane k over UCX, as a peer
 * answering a fetch does: header hdr (hdr_len bytes: 24 for a real one,
 * fetch id, index, token), data len bytes.  0 once UCX is done with it,
 * -1 on failure or after timeout_ms. */
int rawpeer_send_block(rawpeer_t *rp, int k, const void *hdr, size_t hdr_len,
                       const void *data, size_t len, int timeout_ms);

/* As a peer that connected to the daemon and proved the secret: send
 * Lanes naming n lanes (1 to 8), each the address of one UCX worker of
 * rawpeer's own that is never progressed (rawpeer_send_block's, which
 * then must not be used): the endpoints the daemon makes to them never
 * finish their wireup.  0, or -1. */
int rawpeer_offer_mute_lanes(rawpeer_t *rp, int n);
/* As rawpeer_offer_mute_lanes, but n lanes (2 to 8) split between two
 * UCX workers: the even ones rawpeer_send_block's worker, which answers
 * their wireup while rawpeer_lanes_progress runs it, the odd ones a
 * second worker that is never progressed and that rawpeer_lanes_vanish
 * destroys (its sockets close: the daemon's wireup to them fails).  0, or
 * -1.  Block messages that come to the first worker are counted
 * (rawpeer_lanes_landed) and dropped. */
int rawpeer_offer_split_lanes(rawpeer_t *rp, int n);
void rawpeer_lanes_progress(rawpeer_t *rp, int ms);
int rawpeer_lanes_landed(const rawpeer_t *rp);
void rawpeer_lanes_vanish(rawpeer_t *rp);
/* Close the connection to the daemon as a peer that goes away does (the
 * UCX worker stays until rawpeer_free). */
void rawpeer_hangup(rawpeer_t *rp);

/* Read (and keep) whatever comes for ms. */
void rawpeer_progress(rawpeer_t *rp, int ms);

#endif
