/*
 * The cluster's links: one TCP connection between two daemons, either
 * way, read by this daemon alone, over the lanes (lane.h) and the
 * configuration (config.h).  Each daemon opens one link to every
 * configured peer (outbound: its own asks go there) and answers on those
 * peers open to it (inbound).
 *
 * This layer keeps the links and the peers' state (make, send, forget,
 * close); the front door (door.h) reads them.  What a proven link
 * carries past the proof goes upward only through the callbacks the
 * links were given (kvd__link_up_t), as does a peer that is lost.
 */
#ifndef KVD_DAEMON_CLUSTER_LINK_H
#define KVD_DAEMON_CLUSTER_LINK_H

#include <stdint.h>
#include <uv.h>

#include "cluster.pb-c.h"
#include "config.h"
#include "lane.h"
#include "log.h"

#define KVD_LINK_READ_CHUNK 65536u
#define KVD_LINK_MAX_CTRL (8u << 20) /* a query or fetch of 65,536 keys of 64 bytes fits */

enum kvd__peer_state { KVD_PEER_DOWN, KVD_PEER_CONNECTING, KVD_PEER_UP, KVD_PEER_REFUSED };

typedef struct kvd__link kvd__link_t;
typedef struct kvd__links kvd__links_t;

/* A configured peer, and how its outbound link fares. */
typedef struct kvd__peer {
    char addr[KVD_OPT_STR_MAX];
    struct sockaddr_storage sa;
    socklen_t salen;
    int state;
    char error[160];
    uint64_t since_ns;
    uint64_t next_try_ns;
    uint32_t backoff_ms;
    kvd__link_t *link;
    uint64_t ping_sent_ns, ping_t, rtt_ns;
    uint64_t queries, blocks_fetched, bytes_fetched, failures;
} kvd__peer_t;

/* One TCP connection between two daemons, either way; freed in its
 * handle's close callback. */
struct kvd__link {
    uv_tcp_t tcp;
    uv_connect_t connect;    /* outbound */
    kvd__links_t *ls;
    int outbound;
    kvd__peer_t *peer;        /* outbound: the configured peer */
    int authed;              /* the other side proved the secret */
    int hello_seen;          /* inbound: its Hello came (one only) */
    int closed;              /* its handle is closing: nothing more is sent or read */
    int stalled;             /* it reads nothing of what it is sent: dropped at the tick */
    uint8_t my_nonce[KVD_CL_NONCE], their_nonce[KVD_CL_NONCE];
    char node[64];           /* the other side's node name */
    char from[64];           /* inbound: the address it came from */
    uint8_t src[16];         /* inbound: that address's bytes */
    int src_family;
    uint64_t opened_ns;
    uint8_t *rx;             /* bytes read and not yet a whole frame */
    size_t rx_len, rx_cap;
    size_t rx_total;         /* bytes read before the proof */
    /* inbound: endpoints to the peer's lanes (on our lanes' tx workers) */
    kvd__lane_ep_t *lane_ep[KVD_LANES_MAX];
    uint32_t nlanes;
    struct kvd__link *next;
};

/* What the links hand upward, on the loop. */
typedef struct kvd__link_up {
    void *up;
    /* a proven link brought m: a query, fetch, or an answer to ours */
    void (*msg)(void *up, kvd__link_t *l, const Kvdock__Cluster__Msg *m);
    /* the link to configured peer i went: what it owed is lost */
    void (*lost)(void *up, uint32_t i, const char *why);
} kvd__link_up_t;

struct kvd__links {
    kvd__server_t *srv;
    const kvd__cl_config_t *cfg;
    kvd__lanes_t *lanes;
    kvd__link_up_t up;
    kvd__peer_t peers[KVD_CL_MAX_PEERS];
    uint32_t npeers;
    kvd__link_t *links;
    uint32_t ninbound;
    uv_tcp_t listener;       /* the front door */
    int listening;
    int closing;
    uint64_t refused;        /* connections refused, and links closed for misbehaving */
    kvd__ratelimit_t refuse_log;
    uint8_t scratch[KVD_LINK_READ_CHUNK]; /* where the loop reads every connection's bytes */
};

/* The configured peers, none connected yet. */
void kvd__links_init(kvd__links_t *ls, kvd__server_t *srv, const kvd__cl_config_t *cfg,
                     kvd__lanes_t *lanes, const kvd__link_up_t *up);
/* A link with its handle made (freed by kvd__link_drop from now on), at
 * the head of the links. */
kvd__link_t *kvd__link_new(kvd__links_t *ls, int outbound);
/* Frame m and queue it on l (0), or -1 (l closed, no memory, or l reads
 * nothing of what it is sent: then it is marked stalled and goes at the
 * next tick). */
int kvd__link_send(kvd__link_t *l, const Kvdock__Cluster__Msg *m);
/* Forget l (its peer's asks lost, through up.lost) and close it, with its
 * lane endpoints. */
void kvd__link_drop(kvd__link_t *l, const char *why);
/* A peer's state changes (why: its error, or NULL). */
void kvd__peer_set(kvd__peer_t *p, int state, const char *why);
/* The link lep belongs to, or NULL. */
kvd__link_t *kvd__link_of_lane_ep(kvd__links_t *ls, const kvd__lane_ep_t *lep, uint32_t *k);

#endif
