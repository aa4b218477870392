/*
 * The cluster's configuration, the bottom layer with frames.h: the secret
 * and the proof made with it, the peers' addresses, the networks
 * connections may come from (--cluster-*), read once at start.  Nothing
 * here does I/O after that, and nothing here knows of links or lanes.
 */
#ifndef KVD_DAEMON_CLUSTER_CONFIG_H
#define KVD_DAEMON_CLUSTER_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "blake2s.h"
#include "kvdock/status.h"
#include "options.h"

#define KVD_CL_MAX_PEERS 64
#define KVD_CL_MAX_ALLOW 64      /* networks of --cluster-allow-from */
#define KVD_CL_NONCE 16

/* A peer as configured. */
typedef struct kvd__cl_addr {
    char text[KVD_OPT_STR_MAX];
    struct sockaddr_storage sa;
    socklen_t salen;
} kvd__cl_addr_t;

typedef struct kvd__cl_config {
    char node[KVD_OPT_STR_MAX];      /* --cluster-listen, as given */
    struct sockaddr_storage listen_sa;
    socklen_t listen_salen;
    uint8_t key[KVD_BLAKE2S_BYTES];  /* BLAKE2s of the secret */
    kvd__cl_addr_t peers[KVD_CL_MAX_PEERS];
    uint32_t npeers;
    uint64_t deadline_ns;            /* --cluster-deadline-ms */
    int allow_any;
    struct kvd__cl_allow {
        int family;
        uint8_t addr[16];
        unsigned bits;
    } allow[KVD_CL_MAX_ALLOW];
    uint32_t nallow;
} kvd__cl_config_t;

/* Time from t to now; 0 when t is later (set after now was read: a
 * difference of unsigned times would wrap to an age of centuries). */
static inline uint64_t kvd__cl_since(uint64_t now, uint64_t t)
{
    return now > t ? now - t : 0;
}

static inline void kvd__cl_set_bit(uint8_t *b, uint32_t i)
{
    b[i >> 3] |= (uint8_t)(1u << (i & 7));
}

/* The options o as a configuration (the secret read, the peers resolved,
 * this daemon itself and repeats skipped).  why says what is wrong. */
kvd_status_t kvd__clc_read(kvd__cl_config_t *c, const kvd__options_t *o, char *why,
                           size_t why_len);

/* May a connection come from this address (--cluster-allow-from)? */
int kvd__clc_allowed(const kvd__cl_config_t *c, const struct sockaddr_storage *from);

/* proof = BLAKE2s(key; label || a || b), a and b nonces. */
void kvd__clc_prove(const kvd__cl_config_t *c, const char *label, const uint8_t *a,
                    const uint8_t *b, uint8_t out[KVD_BLAKE2S_BYTES]);
/* a and b equal, compared in time that does not depend on where they differ. */
int kvd__clc_same(const uint8_t *a, const uint8_t *b, size_t n);
/* n unpredictable bytes. */
void kvd__clc_random(uint8_t *p, size_t n);

/* The address's bytes and family, an IPv4 address mapped into IPv6 as
 * IPv4 (AF_UNSPEC for others); its numeric host as text. */
int kvd__clc_addr_bytes(const struct sockaddr_storage *s, uint8_t out[16]);
void kvd__clc_addr_text(const struct sockaddr_storage *s, char *out, size_t len);

#endif
