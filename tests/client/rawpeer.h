/*
 * A raw cluster peer for the hostile-peer tests: a UCP endpoint to a
 * daemon's --cluster-listen address that sends whatever it is told (well
 * formed or not, in turn or not) as proto/cluster.proto's active messages,
 * and reads what the daemon answers.  It can also prove the secret, to
 * act as a trusted peer that misbehaves.
 */
#ifndef KVDOCK_TEST_CLIENT_RAWPEER_H
#define KVDOCK_TEST_CLIENT_RAWPEER_H

#include <stddef.h>
#include <stdint.h>

#include "cluster.pb-c.h"

#define RAWPEER_AM_CTRL 1  /* a packed Msg */
#define RAWPEER_AM_BLOCK 2 /* a block: 16-byte header (request id, index) */
#define RAWPEER_NONCE 16

typedef struct rawpeer rawpeer_t;

/* A worker of its own (UCX over what UCX_TLS says), no endpoint yet. */
rawpeer_t *rawpeer_new(void);
void rawpeer_free(rawpeer_t *rp);

/* Open an endpoint to 127.0.0.1:port (returns at once; 0 or -1). */
int rawpeer_connect(rawpeer_t *rp, int port);

/* Open n more endpoints to 127.0.0.1:port that never say anything
 * (closed with rp); 0 or -1. */
int rawpeer_open_silent(rawpeer_t *rp, int port, int n);

/* Send data as a control message on every endpoint rawpeer_open_silent
 * opened (eagerly, not waiting for completion). */
void rawpeer_silent_send(rawpeer_t *rp, const void *data, size_t len);

/* Send an active message with UCP_AM_SEND_FLAG_REPLY, eagerly or by
 * rendezvous, and progress until UCX is done with it or the endpoint
 * fails (0: sent; -1: failed or timed out). */
int rawpeer_send(rawpeer_t *rp, unsigned am_id, const void *hdr, size_t hdr_len,
                 const void *data, size_t len, int eager, int timeout_ms);
int rawpeer_send_msg(rawpeer_t *rp, const Kvdock__Cluster__Msg *m);

/* Progress for up to timeout_ms or until a message of case want came
 * (returned, the caller frees it with kvdock__cluster__msg__free_unpacked)
 * or the endpoint failed (NULL). */
Kvdock__Cluster__Msg *rawpeer_wait(rawpeer_t *rp, Kvdock__Cluster__Msg__MCase want,
                                   int timeout_ms);

/* Progress until the daemon closed the endpoint (1) or timeout_ms
 * passed (0); the last Refused reason seen is kept in *why if given. */
int rawpeer_wait_closed(rawpeer_t *rp, int timeout_ms, char *why, size_t why_len);

/* Hello, Challenge (checked), Auth, Welcome with the key of the secret
 * file's text (trailing newlines stripped, as the daemon reads it).
 * 0: welcomed; -1: refused or closed. */
int rawpeer_hello(rawpeer_t *rp, uint32_t version);
int rawpeer_auth(rawpeer_t *rp, const char *secret);

void rawpeer_progress(rawpeer_t *rp, int ms);

#endif
