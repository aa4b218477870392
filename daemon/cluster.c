/*
 * The cluster (cluster.h says what it does, proto/cluster.proto what
 * daemons say to each other).
 *
 * The front door.  --cluster-listen is a plain TCP listener of the
 * daemon's own loop, and nothing but this file reads what comes on it:
 * no UCX listener faces the network (UCX's connection managers parse a
 * stranger's first bytes and can be made to abort).  A connection from
 * outside --cluster-allow-from is closed at accept; so is one past
 * MAX_STARTUPS connections that have not proved the secret, or past
 * MAX_STARTUPS_PER_SOURCE of them from one address.  Before the proof a
 * connection may send PREAUTH_BYTES in all, in frames (cluster_wire.h)
 * of at most PREAUTH_FRAME, and must complete the proof (Hello,
 * Challenge, Auth, Welcome: BLAKE2s keyed with the secret over both
 * sides' fresh nonces) within the deadline; anything else closes it,
 * logged (rate-limited) and counted (status: refused).  Each daemon opens
 * one connection to every configured peer (outbound: its own requests go
 * there) and answers on the ones peers open to it (inbound).
 *
 * Control stays on that connection.  Queries, fetches, their answers and
 * pings are framed protobuf on the proven TCP connection, read by the
 * same bounded parser (MAX_CTRL_BYTES a message): they are small, and a
 * second channel for them would be a second thing to prove and to close.
 * UCX carries only block bytes.
 *
 * Lanes.  Each daemon runs --cluster-lanes lanes, each a thread with two
 * UCX workers of its own: rx, where blocks of this daemon's fetches
 * land, and tx, from which it sends blocks to peers that fetch.  Right
 * after Welcome the fetching daemon sends its rx workers' addresses
 * (Lanes) on its outbound connection; the answering daemon checks each
 * (kvd_cw_ucx_address_ok: UCX unpacks an address without bounds) and
 * makes one endpoint from it on its own tx worker of that lane
 * (ucp_ep_create from the remote address, UCP_ERR_HANDLING_MODE_PEER),
 * and sends block i of a fetch to lane i % n.  So between two workers
 * endpoints are made from one side only, one per link and lane: with
 * UCX 1.13 two workers that connected to each other both ways tripped an
 * assertion in the wireup ("got REP message") when one side died
 * mid-pull.  Endpoints close with UCP_EP_CLOSE_MODE_FORCE when their link
 * goes, and the lanes are progressed until every close has ended before
 * their workers go.  UCX's TCP transport still listens on a port of each
 * worker (the README says what to firewall); a block lands only if it
 * carries the random token of a fetch this daemon made.  A lane's
 * workers are its thread's alone: the loop queues commands for it (send,
 * receive, release, connect, close: lane_cmd), and every callback there
 * only queues an event for the loop (ev_post), which keeps all the
 * bookkeeping (a worker shared by two threads, UCX_THREAD_MODE_MULTI,
 * has the loop wait on a lock the progressing thread spins on).
 *
 * Blocks.  A pull reserves a FILLING block in the local tier for each key
 * it asks a peer for, and the peer's block message lands there: in place
 * for eager messages, by ucp_am_recv_data_nbx straight into the block for
 * rendezvous ones, a window of them at a time (the rest wait in arrival
 * order), so that blocks land in a steady stream.  A block is committed
 * once its bytes are in, aborted otherwise; it stays held until UCX is
 * done with it.  A peer that sends nothing for a whole deadline during a
 * pull is cut off (its connection closed, which closes its lane
 * endpoints), so a pull ends within a deadline of the last progress,
 * however large; a receive its lane still holds is settled whenever UCX
 * ends it.  Landed blocks are committed in batches and handed to the
 * asker (the load's plan copies them into the worker's pool while the
 * rest arrive); at the end the asker hears once what could not come.  A
 * pull that finds blocks another pull has reserved ends after that pull
 * (its leader) instead of pulling them again.
 */
#include "cluster.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include "caches.h"
#include "cluster.pb-c.h"
#include "cluster_wire.h"
#include "conn.h"
#include "dispatch.h"
#include "blake2s.h"
#include "log.h"
#include "server.h"

#define PROTOCOL_VERSION 2       /* 2: framed on TCP, lanes by worker address */
#define AM_BLOCK 2
#define NONCE_BYTES 16
#define MAX_PEERS 64
#define MAX_INBOUND 256          /* connections from peers held at once */
#define MAX_STARTUPS 64          /* connections without proof, in all ... */
#define MAX_STARTUPS_PER_SOURCE 8 /* ... and from one address */
#define MAX_ALLOW 64             /* networks of --cluster-allow-from */
#define MAX_CTRL_BYTES (8u << 20) /* a query or fetch of 65,536 keys of 64 bytes fits */
#define PREAUTH_FRAME 512u        /* Hello, Challenge and Auth are under 100 bytes */
#define PREAUTH_BYTES 1024u       /* all a connection may send before its proof */
#define MAX_WRITE_QUEUE (64ull << 20) /* unsent bytes to a peer that does not read */
#define READ_CHUNK 65536u
#define PING_NS 1000000000ull
#define BACKOFF_MIN_MS 100u
#define BACKOFF_MAX_MS 5000u
#define EARLY_MIN 16             /* blocks landed before a batch goes to the load */
/* Rendezvous receives one pull runs at once (the rest wait in order):
 * UCX shares the link among all it is given, so a pull of 1,024 blocks
 * given at once lands nothing until nearly all of it is in; a few at a
 * time land in a steady stream that the load copies while the rest come,
 * and that shows the peer alive. */
#define RX_WINDOW_BYTES (16ull << 20) /* per lane */
#define RX_WINDOW_MIN 4
#define MAX_LANES 8
#define MAX_LANE_ADDRESS 4096     /* a UCX worker address is tens to hundreds of bytes */
#define ADDRESS_SLACK 64          /* zeros after a peer's address copy */

enum peer_state { PEER_DOWN, PEER_CONNECTING, PEER_UP, PEER_REFUSED };
enum got_state { GOT_NONE, GOT_IN, GOT_FAILED, GOT_RECEIVING, GOT_WAITING };
static const char *const peer_state_name[] = {"down", "connecting", "up", "refused"};

typedef struct peer peer_t;

/* One TCP connection between two daemons, either way; freed in its
 * handle's close callback. */
typedef struct link {
    uv_tcp_t tcp;
    uv_connect_t connect;    /* outbound */
    kvd_cluster_t *cl;
    int outbound;
    peer_t *peer;            /* outbound: the configured peer */
    int authed;              /* the other side proved the secret */
    int hello_seen;          /* inbound: its Hello came (one only) */
    int closed;              /* its handle is closing: nothing more is sent or read */
    int stalled;             /* it reads nothing of what it is sent: dropped at the tick */
    uint8_t my_nonce[NONCE_BYTES], their_nonce[NONCE_BYTES];
    char node[64];           /* the other side's node name */
    char from[64];           /* inbound: the address it came from */
    uint8_t src[16];         /* inbound: that address's bytes (addr_bytes) */
    int src_family;
    uint64_t opened_ns;
    uint8_t *rx;             /* bytes read and not yet a whole frame */
    size_t rx_len, rx_cap;
    size_t rx_total;         /* bytes read before the proof */
    /* inbound: endpoints to the peer's lanes (on our lanes' tx workers) */
    struct lane_ep *lane_ep[MAX_LANES];
    uint32_t nlanes;
    struct link *next;
} link_t;

/* A queue one thread fills and another takes whole, under a lock. */
typedef struct qnode {
    struct qnode *next;
} qnode_t;

typedef struct queue {
    pthread_mutex_t lock;
    qnode_t *head, *tail;
} queue_t;

/* An endpoint of a lane's tx worker to a peer's rx worker: made, used and
 * closed by the lane's thread; freed with the cluster (UCX may name it in
 * an error until then). */
typedef struct lane_ep {
    ucp_ep_h ep;             /* NULL: not made, or failed to be */
    struct lane *lane;
    uint8_t *addr;           /* the peer lane's worker address (checked), then
                              * ADDRESS_SLACK zeros */
    struct lane_ep *all;     /* every lane endpoint, for the cluster to free */
} lane_ep_t;

enum lane_op { LANE_SEND, LANE_RECV, LANE_RELEASE, LANE_CONNECT, LANE_CLOSE };

/* What the loop asks a lane's thread to do with its workers. */
typedef struct lane_cmd {
    qnode_t node;            /* first */
    int op;
    int owned;               /* freed once done (not inside a send or receive) */
    lane_ep_t *lep;          /* SEND, CONNECT, CLOSE */
    void *ctx;               /* SEND: the sendctx; RECV: the block_rx */
    void *desc;              /* RECV, RELEASE: the rendezvous */
    void *buf;               /* SEND: from; RECV: into */
    size_t len;
} lane_cmd_t;

/* Something a lane's thread (or a UCX callback anywhere) hands the loop. */
typedef struct lane_ev {
    qnode_t node;            /* first */
    void (*fn)(kvd_cluster_t *cl, struct lane_ev *ev);
} lane_ev_t;

typedef struct lane {
    kvd_cluster_t *cl;
    ucp_worker_h rx, tx;     /* blocks land on rx; tx's endpoints send them */
    int rx_efd, tx_efd;
    ucp_address_t *address;  /* rx's, as the Lanes message carries it */
    size_t address_len;
    pthread_t thread;
    int running;
    atomic_int stop;
    queue_t cmds;            /* lane_cmd_t, from the loop */
    uint32_t outstanding;    /* its thread's: sends and receives UCX holds */
    uint32_t closing;        /* its thread's: endpoint closes UCX has not ended */
} lane_t;

struct peer {
    char addr[KVD_OPT_STR_MAX];
    struct sockaddr_storage sa;
    socklen_t salen;
    int state;
    char error[160];
    uint64_t since_ns;
    uint64_t next_try_ns;
    uint32_t backoff_ms;
    link_t *link;
    uint64_t ping_sent_ns, ping_t, rtt_ns;
    uint64_t queries, blocks_fetched, bytes_fetched, failures;
};

/* What a lookup or a load asked of the peers (kvd_cluster_ask). */
typedef struct pend {
    uint64_t id;
    int pull;
    kvd_cluster_t *cl;
    void (*landed)(void *arg, const uint32_t *pos, uint32_t count); /* the asker's */
    void (*answer)(void *arg, const uint8_t *present, const char *why); /* NULL once called */
    void *arg;
    kvd_cache_t *cache;      /* referenced */
    uint32_t first, n;       /* the asker's keys [first, n) ... */
    uint32_t nask;           /* ... of which these were asked: */
    uint32_t *pos;           /*   their places in the asker's keys */
    uint8_t *keys;           /*   KVD_CACHE_KEY_MAX bytes each */
    uint8_t *klen;
    uint8_t *present;        /* bits over [first, n): some live peer has it */
    uint32_t covered;        /* asked keys some peer that answered holds */
    uint32_t *parent;        /* pulls: per asked key, the local block of the key before it */
    uint8_t *bits[MAX_PEERS];/* each peer's answer over the asked keys */
    uint8_t asked[MAX_PEERS], answered[MAX_PEERS];
    /* pulls */
    uint32_t *ids;           /* reserved local block per asked key, or NONE */
    int8_t *from;            /* the peer asked for it, -1: none */
    uint8_t *got;            /* GOT_*: where its bytes are */
    uint32_t inflight;       /* block receives UCX still holds */
    void **desc;             /* GOT_WAITING: its rendezvous, not yet received ... */
    uint8_t *desc_lane;      /* ... on this lane */
    uint64_t token[MAX_PEERS]; /* each peer's fetch: its blocks carry it */
    uint32_t *waitq;         /* the waiting keys in arrival order: [wq_head, wq_tail) */
    uint32_t wq_head, wq_tail;
    uint32_t window;         /* receives run at once at most */
    uint32_t *lpos;          /* the places of a batch of landed blocks, for landed() */
    uint32_t fresh;          /* blocks landed since the last batch */
    uint32_t *flist;         /* the asked keys of each peer's fetch, peer by peer: */
    uint32_t fbase[MAX_PEERS], fcount[MAX_PEERS]; /* where its run starts, how long */
    uint32_t expect[MAX_PEERS], recvd[MAX_PEERS]; /* blocks sent, blocks whose receive ended */
    uint8_t fetching[MAX_PEERS], done[MAX_PEERS];
    uint64_t progress_ns[MAX_PEERS];
    int phase;               /* 0 asking, 1 pulling, 2 finished (waiting for UCX) */
    struct pend *leader;     /* a pull bringing in keys of this one: it ends after it */
    uint64_t started_ns;
    uint64_t deadline_ns;
    char why[200];
    struct pend *next;
} pend_t;

struct kvd_cluster {
    kvd_server_t *srv;
    ucp_context_h ctx;
    uv_tcp_t listener;       /* the front door */
    int listening;
    uv_timer_t tick;
    int closing;
    char node[KVD_OPT_STR_MAX];
    struct sockaddr_storage listen_sa;
    socklen_t listen_salen;
    uint8_t key[KVD_BLAKE2S_BYTES];
    peer_t peers[MAX_PEERS];
    uint32_t npeers;
    link_t *links;
    uint32_t ninbound;
    pend_t *pends;
    uint64_t next_id;
    uint64_t deadline_ns;
    kvd_cluster_totals_t n;
    kvd_ratelimit_t refuse_log;
    lane_t lanes[MAX_LANES];
    uint32_t nlanes;
    lane_ep_t *lane_eps;     /* every one made, freed with the cluster */
    queue_t events;          /* lane_ev_t, for the loop */
    uv_async_t ev_async;
    atomic_int ev_open;      /* ev_async is open: lanes may wake the loop with it */
    uint8_t scratch[READ_CHUNK]; /* where the loop reads every connection's bytes */
    /* where connections may come from (--cluster-allow-from) */
    int allow_any;
    struct allow {
        int family;
        uint8_t addr[16];
        unsigned bits;
    } allow[MAX_ALLOW];
    uint32_t nallow;
};
/* ---- small things ---------------------------------------------------------- */

/* Time from t to now; 0 when t is later (set after now was read: a
 * difference of unsigned times would wrap to an age of centuries). */
static uint64_t since(uint64_t now, uint64_t t)
{
    return now > t ? now - t : 0;
}

static void set_bit(uint8_t *b, uint32_t i)
{
    b[i >> 3] |= (uint8_t)(1u << (i & 7));
}

static void fill_random(uint8_t *p, size_t n)
{
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    size_t got = 0;

    while (fd >= 0 && got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (fd >= 0)
        close(fd);
    if (got < n) { /* never on Linux; still no predictable nonce from a bad day */
        uint64_t t = kvd_now_ns() ^ (uint64_t)getpid() << 32;
        for (size_t i = got; i < n; i++)
            p[i] = (uint8_t)((t >> (8 * (i & 7))) ^ i);
    }
}

/* proof = BLAKE2s(key; label || a || b) */
static void prove(const kvd_cluster_t *cl, const char *label, const uint8_t *a, const uint8_t *b,
                  uint8_t out[KVD_BLAKE2S_BYTES])
{
    kvd_b2s_t s;

    kvd_b2s_init(&s, cl->key, sizeof(cl->key));
    kvd_b2s_update(&s, label, strlen(label));
    kvd_b2s_update(&s, a, NONCE_BYTES);
    kvd_b2s_update(&s, b, NONCE_BYTES);
    kvd_b2s_final(&s, out);
}

static int same_bytes(const uint8_t *a, const uint8_t *b, size_t n)
{
    uint8_t d = 0; /* every byte compared: no early exit to time */

    for (size_t i = 0; i < n; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

/* "HOST:PORT" (HOST a name, an IPv4 address or [IPv6]) to a socket address. */
static kvd_status_t resolve(const char *text, struct sockaddr_storage *sa, socklen_t *len,
                            char *why, size_t why_len)
{
    char host[128];
    const char *colon = strrchr(text, ':'), *h = text;
    size_t hl;
    struct addrinfo hints, *res = NULL;
    int rc;

    if (colon == NULL || colon == text || colon[1] == '\0') {
        snprintf(why, why_len, "'%s' is not HOST:PORT", text);
        return KVD_EINVAL;
    }
    hl = (size_t)(colon - text);
    if (text[0] == '[' && colon[-1] == ']') {
        h = text + 1;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof(host)) {
        snprintf(why, why_len, "'%s' is not HOST:PORT", text);
        return KVD_EINVAL;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if ((rc = getaddrinfo(host, colon + 1, &hints, &res)) != 0 || res == NULL) {
        snprintf(why, why_len, "cannot resolve '%s': %s", text, gai_strerror(rc));
        return KVD_EINVAL;
    }
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return KVD_OK;
}

/* A cluster address UCX can carry.  UCX 1.13's TCP transport (Debian 12's,
 * which kvdockd links) fails over IPv6: the data connections of an endpoint
 * made to an IPv6 address go to IPv4 listeners and are refused, and with
 * UCX_TCP_AF_PRIO=inet6 its connect overruns a heap buffer (seen under
 * ASan); later versions are let through. */
static kvd_status_t usable_family(const struct sockaddr_storage *sa, const char *text, char *why,
                                  size_t why_len)
{
    unsigned major = 0, minor = 0, release = 0;

    if (sa->ss_family != AF_INET6)
        return KVD_OK;
    ucp_get_version(&major, &minor, &release);
    if (major > 1 || (major == 1 && minor > 13))
        return KVD_OK;
    snprintf(why, why_len, "'%s' is an IPv6 address: the UCX this kvdockd is built with "
             "(%u.%u.%u) cannot carry a cluster over IPv6; use IPv4 addresses", text, major,
             minor, release);
    return KVD_EINVAL;
}

static int same_addr(const struct sockaddr_storage *a, socklen_t al,
                     const struct sockaddr_storage *b, socklen_t bl)
{
    return al == bl && memcmp(a, b, al) == 0;
}

/* ---- sending ----------------------------------------------------------------- */

/* A block sent from a lane (the loop's bookkeeping of it). */
typedef struct sendctx {
    lane_ev_t ev;            /* its send ended (first: the event is the context) */
    lane_cmd_t cmd;          /* its send, for the lane of cmd.lep */
    ucs_status_t status;
    kvd_cluster_t *cl;
    kvd_cache_t *cache;      /* unheld when sent */
    uint32_t block;
    uint64_t hdr[3];         /* its header (fetch id, index, token): UCX reads it
                              * until the send completes */
} sendctx_t;

static void sent_done(sendctx_t *sc, ucs_status_t status)
{
    if (sc->cache != NULL) {
        kvd_cache_unhold(&sc->cache->store, sc->block);
        if (status == UCS_OK) {
            sc->cache->served++;
            sc->cl->n.blocks_served++;
            sc->cl->n.bytes_served += sc->cache->store.block_bytes;
        }
        kvd__cache_unref(sc->cache);
    }
    free(sc);
}

/* A control message on its way: the frame lives until its write ends. */
typedef struct wreq {
    uv_write_t req;
    uint8_t frame[];
} wreq_t;

static void on_written(uv_write_t *req, int status)
{
    (void)status; /* a failed write shows as a read error or EOF on the link */
    free(req);
}

/* Frame m and queue it on l (0), or -1 (l closed, no memory, or l reads
 * nothing of what it is sent: then it is marked stalled and goes at the
 * next tick). */
static int send_msg(kvd_cluster_t *cl, link_t *l, const Kvdock__Cluster__Msg *m)
{
    size_t len = kvdock__cluster__msg__get_packed_size(m);
    wreq_t *w;
    uv_buf_t b;

    (void)cl;
    if (l->closed || len == 0 || len > MAX_CTRL_BYTES)
        return -1;
    if (uv_stream_get_write_queue_size((uv_stream_t *)&l->tcp) > MAX_WRITE_QUEUE) {
        l->stalled = 1;
        return -1;
    }
    if ((w = malloc(sizeof(*w) + KVD_CW_HEADER + len)) == NULL)
        return -1;
    kvd_cw_header(w->frame, (uint32_t)len);
    kvdock__cluster__msg__pack(m, w->frame + KVD_CW_HEADER);
    b = uv_buf_init((char *)w->frame, (unsigned)(KVD_CW_HEADER + len));
    if (uv_write(&w->req, (uv_stream_t *)&l->tcp, &b, 1, on_written) != 0) {
        free(w);
        return -1;
    }
    return 0;
}

/* ---- endpoints ------------------------------------------------------------------ */

static void on_closed(void *request, ucs_status_t status, void *user_data);

/* Close a lane's endpoint e forcibly, on the lane's thread (or the loop's
 * once that thread is gone): what it carries ends at once, failed. */
static void ep_close_now(struct lane *ln, ucp_ep_h e);

/* ---- lanes ---------------------------------------------------------------------- */

/* Append n; 1 when the queue was empty. */
static int queue_push(queue_t *q, qnode_t *n)
{
    int first;

    n->next = NULL;
    pthread_mutex_lock(&q->lock);
    first = q->head == NULL;
    if (q->tail != NULL)
        q->tail->next = n;
    else
        q->head = n;
    q->tail = n;
    pthread_mutex_unlock(&q->lock);
    return first;
}

/* Everything queued so far, in order. */
static qnode_t *queue_take(queue_t *q)
{
    qnode_t *n;

    pthread_mutex_lock(&q->lock);
    n = q->head;
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->lock);
    return n;
}

/* Hand ev to the loop: from a lane's thread, or from the loop itself. */
static void ev_post(kvd_cluster_t *cl, lane_ev_t *ev)
{
    (void)queue_push(&cl->events, &ev->node);
    if (atomic_load(&cl->ev_open))
        uv_async_send(&cl->ev_async);
}

/* Run the events queued so far; how many. */
static unsigned ev_drain(kvd_cluster_t *cl)
{
    qnode_t *n, *next;
    unsigned count = 0;

    for (n = queue_take(&cl->events); n != NULL; n = next, count++) {
        next = n->next;
        ((lane_ev_t *)n)->fn(cl, (lane_ev_t *)n);
    }
    return count;
}

static void on_events(uv_async_t *h)
{
    kvd_cluster_t *cl = h->data;

    if (ev_drain(cl) > 0)
        kvd__server_activity(cl->srv); /* more likely follow soon */
}

/* Queue c for lane ln's thread (from the loop). */
static void lane_cmd(lane_t *ln, lane_cmd_t *c)
{
    /* wake its thread (safe from any thread); a queue that was not empty
     * is one it has yet to take, and it takes all of it before it sleeps */
    if (queue_push(&ln->cmds, &c->node))
        ucp_worker_signal(ln->tx); /* its thread sleeps on both workers */
}

/* A command the loop makes and forgets (a release, a connect, a close). */
static void lane_cmd_new(lane_t *ln, int op, lane_ep_t *lep, void *desc)
{
    lane_cmd_t *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        kvd_log(KVD_LOG_ERROR, "event=cluster_lane_command_lost op=%d reason=\"no memory\"", op);
        return;
    }
    c->op = op;
    c->owned = 1;
    c->lep = lep;
    c->desc = desc;
    lane_cmd(ln, c);
}

static void lane_sent(kvd_cluster_t *cl, lane_ev_t *ev)
{
    sendctx_t *sc = (sendctx_t *)ev;

    (void)cl;
    sent_done(sc, sc->status);
}

/* A block's send ended (on the lane's thread): back to the loop. */
static void lane_send_ended(sendctx_t *sc, ucs_status_t status)
{
    sc->status = status;
    sc->ev.fn = lane_sent;
    ev_post(sc->cl, &sc->ev);
}

static void on_lane_sent(void *request, ucs_status_t status, void *user_data)
{
    sendctx_t *sc = user_data;

    ucp_request_free(request);
    sc->cmd.lep->lane->outstanding--;
    lane_send_ended(sc, status);
}

/* Send a block (sc: its header, held block) to a peer's lane lep, from
 * our lane that holds that endpoint. */
static void lane_send(lane_ep_t *lep, sendctx_t *sc, const void *data, size_t len)
{
    sc->cmd.op = LANE_SEND;
    sc->cmd.lep = lep;
    sc->cmd.ctx = sc;
    sc->cmd.buf = (void *)data;
    sc->cmd.len = len;
    lane_cmd(lep->lane, &sc->cmd);
}

typedef struct lane_ep_error {
    lane_ev_t ev;
    lane_ep_t *lep;
    ucs_status_t status;
} lane_ep_error_t;

static void link_drop(kvd_cluster_t *cl, struct link *l, const char *why);

/* An endpoint to a peer's lane failed: drop the link it belongs to (the
 * peer connects again; its pulls from us end with what they got). */
static void lane_ep_failed(kvd_cluster_t *cl, lane_ev_t *ev)
{
    lane_ep_error_t *e = (lane_ep_error_t *)ev;
    link_t *l;
    uint32_t k = 0;
    char why[160];

    for (l = cl->links; l != NULL; l = l->next) {
        for (k = 0; k < l->nlanes && l->lane_ep[k] != e->lep; k++) {
        }
        if (k < l->nlanes && !l->closed)
            break;
    }
    if (l != NULL) {
        snprintf(why, sizeof(why), "lane %u failed: %s", k, ucs_status_string(e->status));
        link_drop(cl, l, why);
    }
    free(e);
}

static void on_lane_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    lane_ep_t *lep = arg;
    lane_ep_error_t *e = calloc(1, sizeof(*e));

    (void)ep;
    if (e == NULL)
        return;
    e->ev.fn = lane_ep_failed;
    e->lep = lep;
    e->status = status;
    ev_post(lep->lane->cl, &e->ev);
}

static void on_lane_received(void *request, ucs_status_t status, size_t length, void *user_data);
static void lane_receive_ended(void *rx, ucs_status_t status, size_t length);

/* On lane ln's thread (or the loop's once that thread is gone): do c. */
/* On lane ln's thread (or the loop's once that thread is gone): do c. */
static void lane_do(lane_t *ln, lane_cmd_t *c)
{
    ucp_request_param_t rp;
    void *req;

    memset(&rp, 0, sizeof(rp));
    switch (c->op) {
    case LANE_SEND:
        if (c->lep->ep == NULL) {
            lane_send_ended(c->ctx, UCS_ERR_NOT_CONNECTED);
            break;
        }
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        rp.cb.send = on_lane_sent;
        rp.user_data = c->ctx;
        req = ucp_am_send_nbx(c->lep->ep, AM_BLOCK, ((sendctx_t *)c->ctx)->hdr,
                              sizeof(((sendctx_t *)c->ctx)->hdr), c->buf, c->len, &rp);
        if (req == NULL || UCS_PTR_IS_ERR(req))
            lane_send_ended(c->ctx, req == NULL ? UCS_OK : UCS_PTR_STATUS(req));
        else
            ln->outstanding++;
        break;
    case LANE_RECV:
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        rp.cb.recv_am = on_lane_received;
        rp.user_data = c->ctx;
        req = ucp_am_recv_data_nbx(ln->rx, c->desc, c->buf, c->len, &rp);
        if (req == NULL || UCS_PTR_IS_ERR(req))
            lane_receive_ended(c->ctx, req == NULL ? UCS_OK : UCS_PTR_STATUS(req),
                               req == NULL ? c->len : 0);
        else
            ln->outstanding++;
        break;
    case LANE_RELEASE:
        ucp_am_data_release(ln->rx, c->desc);
        break;
    case LANE_CONNECT: {
        /* from the tx worker only: the peer's rx worker never makes an
         * endpoint back, so these two workers are connected one way */
        ucp_ep_params_t pr;
        ucs_status_t st;
        memset(&pr, 0, sizeof(pr));
        pr.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        pr.address = (const ucp_address_t *)c->lep->addr;
        pr.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        pr.err_handler.cb = on_lane_ep_error;
        pr.err_handler.arg = c->lep;
        if ((st = ucp_ep_create(ln->tx, &pr, &c->lep->ep)) != UCS_OK) {
            c->lep->ep = NULL;
            on_lane_ep_error(c->lep, NULL, st);
        }
        break;
    }
    case LANE_CLOSE:
        if (c->lep->ep != NULL) {
            ep_close_now(ln, c->lep->ep); /* the sends on it end at once, failed */
            c->lep->ep = NULL;
        }
        break;
    }
}

static unsigned lane_run_cmds(lane_t *ln)
{
    qnode_t *n, *next;
    unsigned count = 0;

    for (n = queue_take(&ln->cmds); n != NULL; n = next, count++) {
        lane_cmd_t *c = (lane_cmd_t *)n;
        int owned = c->owned;
        next = n->next;
        lane_do(ln, c);
        if (owned)
            free(c);
    }
    return count;
}


static void ep_close_now(lane_t *ln, ucp_ep_h e)
{
    ucp_request_param_t rp;
    void *req;

    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                      UCP_OP_ATTR_FIELD_USER_DATA;
    rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    rp.cb.send = on_closed;
    rp.user_data = ln;
    req = ucp_ep_close_nbx(e, &rp);
    if (UCS_PTR_IS_PTR(req))
        ln->closing++; /* on_closed ends it */
}

/* A forcible close ended. */
static void on_closed(void *request, ucs_status_t status, void *user_data)
{
    lane_t *ln = user_data;

    (void)status;
    ln->closing--;
    ucp_request_free(request);
}

/* Progress both of ln's workers once; what moved. */
static unsigned lane_progress(lane_t *ln)
{
    return ucp_worker_progress(ln->rx) + ucp_worker_progress(ln->tx);
}

/* A lane's thread: its commands, then progress, polling while transfers
 * run, else sleeping on its workers' descriptors (a command signals tx). */
static void *lane_run(void *arg)
{
    lane_t *ln = arg;

    while (!atomic_load(&ln->stop)) {
        struct pollfd pf[2];
        unsigned n = lane_run_cmds(ln);
        n += lane_progress(ln);
        if (n > 0)
            continue;
        if (ln->outstanding > 0) {
            sched_yield(); /* the loop, which feeds it, may want this core */
            continue;
        }
        if (ucp_worker_arm(ln->rx) == UCS_ERR_BUSY || ucp_worker_arm(ln->tx) == UCS_ERR_BUSY)
            continue; /* events came meanwhile, or a command's signal */
        pf[0].fd = ln->rx_efd;
        pf[1].fd = ln->tx_efd;
        pf[0].events = pf[1].events = POLLIN;
        pf[0].revents = pf[1].revents = 0;
        (void)poll(pf, 2, 100);
    }
    return NULL;
}

/* ---- links and peers ---------------------------------------------------------- */

static void pend_peer_lost(kvd_cluster_t *cl, uint32_t p, const char *why);

static void peer_set(kvd_cluster_t *cl, peer_t *p, int state, const char *why)
{
    if (p->state != state) {
        if (state == PEER_UP)
            kvd_log(KVD_LOG_INFO, "event=cluster_peer_up peer=%s", p->addr);
        else if (p->state == PEER_UP)
            kvd_log(KVD_LOG_WARN, "event=cluster_peer_down peer=%s reason=\"%s\"", p->addr,
                    why ? why : "");
        p->since_ns = kvd_now_ns();
    }
    p->state = state;
    if (why != NULL)
        snprintf(p->error, sizeof(p->error), "%s", why);
    else if (state == PEER_UP)
        p->error[0] = '\0';
    (void)cl;
}

/* Take l out of the links (nothing it sends is read from now on) and
 * settle its peer's state. */
static void link_forget(kvd_cluster_t *cl, link_t *l, const char *why)
{
    link_t **pp;

    for (pp = &cl->links; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    l->next = NULL;
    if (!l->outbound && cl->ninbound > 0)
        cl->ninbound--;
    if (l->outbound && l->peer != NULL) {
        peer_t *p = l->peer;
        uint32_t idx = (uint32_t)(p - cl->peers);
        p->link = NULL;
        l->peer = NULL;
        if (p->state == PEER_UP)
            p->failures++;
        if (p->state != PEER_REFUSED)
            peer_set(cl, p, PEER_DOWN, why);
        p->next_try_ns = kvd_now_ns() + (uint64_t)p->backoff_ms * 1000000ull;
        p->backoff_ms = p->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : p->backoff_ms * 2;
        pend_peer_lost(cl, idx, why);
    }
}

static void on_link_closed(uv_handle_t *h)
{
    link_t *l = h->data;

    free(l->rx);
    free(l);
}

/* Close a forgotten link: its connection (freed once closed) and its
 * lane endpoints, forcibly (the sends on them end at once, failed: a
 * flushing close would wait on the other side). */
static void link_close(link_t *l)
{
    for (uint32_t k = 0; k < l->nlanes; k++)
        lane_cmd_new(l->lane_ep[k]->lane, LANE_CLOSE, l->lane_ep[k], NULL);
    l->nlanes = 0;
    if (!l->closed) {
        l->closed = 1;
        uv_close((uv_handle_t *)&l->tcp, on_link_closed);
    }
}

static void link_drop(kvd_cluster_t *cl, link_t *l, const char *why)
{
    link_forget(cl, l, why);
    link_close(l);
}

/* A link with its handle made (freed by link_close from now on), at the
 * head of the links. */
static link_t *link_new(kvd_cluster_t *cl, int outbound)
{
    link_t *l = calloc(1, sizeof(*l));

    if (l == NULL)
        return NULL;
    l->cl = cl;
    l->outbound = outbound;
    l->opened_ns = kvd_now_ns();
    uv_tcp_init(cl->srv->loop, &l->tcp);
    l->tcp.data = l;
    l->next = cl->links;
    cl->links = l;
    return l;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void on_connected(uv_connect_t *req, int status)
{
    link_t *l = req->data;
    kvd_cluster_t *cl = l->cl;
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Hello h = KVDOCK__CLUSTER__HELLO__INIT;
    char why[160];
    int rc;

    if (l->closed)
        return; /* dropped meanwhile (its close cancelled the connect) */
    if (status < 0 || (rc = uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read)) != 0) {
        snprintf(why, sizeof(why), "cannot connect: %s", uv_strerror(status < 0 ? status : rc));
        link_drop(cl, l, why);
        return;
    }
    (void)uv_tcp_nodelay(&l->tcp, 1);
    fill_random(l->my_nonce, NONCE_BYTES);
    h.version = PROTOCOL_VERSION;
    h.node = cl->node;
    h.nonce.data = l->my_nonce;
    h.nonce.len = NONCE_BYTES;
    m.m_case = KVDOCK__CLUSTER__MSG__M_HELLO;
    m.hello = &h;
    if (send_msg(cl, l, &m) != 0)
        link_drop(cl, l, "cannot send hello");
}

static void peer_connect(kvd_cluster_t *cl, peer_t *p)
{
    link_t *l = link_new(cl, 1);
    char why[160];
    int rc;

    if (l == NULL)
        return;
    l->peer = p;
    p->link = l;
    peer_set(cl, p, p->state == PEER_REFUSED ? PEER_REFUSED : PEER_CONNECTING, NULL);
    l->connect.data = l;
    if ((rc = uv_tcp_connect(&l->connect, &l->tcp, (const struct sockaddr *)&p->sa,
                             on_connected)) != 0) {
        snprintf(why, sizeof(why), "cannot connect: %s", uv_strerror(rc));
        link_drop(cl, l, why);
    }
}

/* Count a refusal and log it: always for a side that proved the secret
 * (rare, and worth each line), at most a line a second for strangers. */
static void refused(kvd_cluster_t *cl, int trusted, const char *side, const char *who,
                    const char *node, const char *why)
{
    uint64_t held = 0;

    cl->n.refused++;
    if (trusted || kvd_ratelimit_take(&cl->refuse_log, kvd_now_ns(), &held))
        kvd_log(KVD_LOG_WARN, "event=cluster_refused %s=%s node=\"%s\" reason=\"%s\" "
                "suppressed=%" PRIu64, side, who, node, why, held);
}

/* Close l for why, logged and counted, telling the other side why (best
 * effort: only what the socket takes at once). */
static void refuse_link(kvd_cluster_t *cl, link_t *l, const char *why)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Refused rf = KVDOCK__CLUSTER__REFUSED__INIT;
    uint8_t frame[KVD_CW_HEADER + 256];
    size_t len;

    refused(cl, l->authed, l->outbound ? "peer" : "from",
            l->outbound && l->peer ? l->peer->addr : l->from, l->node, why);
    rf.reason = (char *)why;
    m.m_case = KVDOCK__CLUSTER__MSG__M_REFUSED;
    m.refused = &rf;
    len = kvdock__cluster__msg__get_packed_size(&m);
    if (!l->closed && len <= sizeof(frame) - KVD_CW_HEADER) {
        uv_buf_t b = uv_buf_init((char *)frame, (unsigned)(KVD_CW_HEADER + len));
        kvd_cw_header(frame, (uint32_t)len);
        kvdock__cluster__msg__pack(&m, frame + KVD_CW_HEADER);
        (void)uv_try_write((uv_stream_t *)&l->tcp, &b, 1);
    }
    if (l->outbound && l->peer != NULL)
        peer_set(cl, l->peer, PEER_REFUSED, why);
    link_drop(cl, l, why);
}

static kvd_status_t next_item(const char **s, char *item, size_t len)
{
    const char *p = *s;
    size_t n = strcspn(p, ","), a = 0, b = n;

    if (*p == '\0')
        return KVD_ENOENT;
    while (a < b && (p[a] == ' ' || p[a] == '\t'))
        a++;
    while (b > a && (p[b - 1] == ' ' || p[b - 1] == '\t' || p[b - 1] == '\r'))
        b--;
    if (b - a >= len)
        return KVD_ELIMIT;
    memcpy(item, p + a, b - a);
    item[b - a] = '\0';
    *s = p + n + (p[n] == ',');
    return KVD_OK;
}

/* The address's bytes and family, an IPv4 address mapped into IPv6 as IPv4. */
static int addr_bytes(const struct sockaddr_storage *s, uint8_t out[16])
{
    if (s->ss_family == AF_INET) {
        memcpy(out, &((const struct sockaddr_in *)s)->sin_addr, 4);
        return AF_INET;
    }
    if (s->ss_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)s)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) {
            memcpy(out, a6->s6_addr + 12, 4);
            return AF_INET;
        }
        memcpy(out, a6->s6_addr, 16);
        return AF_INET6;
    }
    return AF_UNSPEC;
}

static int allowed(const kvd_cluster_t *cl, const struct sockaddr_storage *from)
{
    uint8_t b[16];
    int family = addr_bytes(from, b);

    if (cl->allow_any)
        return 1;
    for (uint32_t i = 0; i < cl->nallow; i++) {
        const struct allow *n = &cl->allow[i];
        unsigned full = n->bits / 8, rest = n->bits % 8;
        if (n->family != family || memcmp(n->addr, b, full) != 0)
            continue;
        if (rest == 0 || ((n->addr[full] ^ b[full]) & (uint8_t)(0xff00u >> rest)) == 0)
            return 1;
    }
    return 0;
}

static kvd_status_t allow_add(kvd_cluster_t *cl, const struct sockaddr_storage *sa, int bits,
                              const char *item, char *why, size_t why_len)
{
    struct allow *n;
    int family;

    if (cl->nallow >= MAX_ALLOW) {
        snprintf(why, why_len, "cluster-allow-from: more than %d addresses", MAX_ALLOW);
        return KVD_ELIMIT;
    }
    n = &cl->allow[cl->nallow];
    family = addr_bytes(sa, n->addr);
    if (family == AF_UNSPEC || bits > (family == AF_INET ? 32 : 128)) {
        snprintf(why, why_len, "cluster-allow-from: '%s' is not ADDRESS or ADDRESS/BITS", item);
        return KVD_EINVAL;
    }
    n->family = family;
    n->bits = bits < 0 ? (family == AF_INET ? 32u : 128u) : (unsigned)bits;
    cl->nallow++;
    return KVD_OK;
}

/* --cluster-allow-from, once the peers are known. */
static kvd_status_t allow_parse(kvd_cluster_t *cl, const char *list, char *why, size_t why_len)
{
    const char *s = list;
    char item[128];
    kvd_status_t st;

    while ((st = next_item(&s, item, sizeof(item))) == KVD_OK) {
        char *slash, *end;
        struct sockaddr_storage sa;
        int bits = -1;

        if (item[0] == '\0')
            continue;
        if (strcmp(item, "any") == 0) {
            cl->allow_any = 1;
            continue;
        }
        if (strcmp(item, "peers") == 0) {
            for (uint32_t i = 0; i < cl->npeers; i++)
                if ((st = allow_add(cl, &cl->peers[i].sa, -1, item, why, why_len)) != KVD_OK)
                    return st;
            continue;
        }
        memset(&sa, 0, sizeof(sa));
        if ((slash = strchr(item, '/')) != NULL) {
            long v = strtol(slash + 1, &end, 10);
            if (slash[1] == '\0' || *end != '\0' || v < 0 || v > 128) {
                snprintf(why, why_len, "cluster-allow-from: '%s' is not ADDRESS or ADDRESS/BITS",
                         item);
                return KVD_EINVAL;
            }
            bits = (int)v;
            *slash = '\0';
        }
        if (inet_pton(AF_INET, item, &((struct sockaddr_in *)&sa)->sin_addr) == 1)
            sa.ss_family = AF_INET;
        else if (inet_pton(AF_INET6, item, &((struct sockaddr_in6 *)&sa)->sin6_addr) == 1)
            sa.ss_family = AF_INET6;
        if (slash != NULL)
            *slash = '/';
        if ((st = allow_add(cl, &sa, bits, item, why, why_len)) != KVD_OK)
            return st;
    }
    if (st == KVD_ELIMIT) {
        snprintf(why, why_len, "cluster-allow-from: an item is too long");
        return KVD_EINVAL;
    }
    return KVD_OK;
}

/* The numeric host of a socket address. */
static void addr_text(const struct sockaddr_storage *s, char *out, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";

    if (s->ss_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)s)->sin_addr, host, sizeof(host));
    else if (s->ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)s)->sin6_addr, host, sizeof(host));
    snprintf(out, len, "%s", host);
}

/* The front door: a connection comes.  Refused at once, before a byte of
 * it is read, when it comes from outside --cluster-allow-from or when
 * too many have not proved the secret yet (in all, or from its address);
 * else read by on_read, within the limits before the proof. */
static void on_accept(uv_stream_t *server, int status)
{
    kvd_cluster_t *cl = server->data;
    struct sockaddr_storage sa;
    int salen = sizeof(sa);
    uint32_t startups = 0, same = 0;
    const char *why = NULL;
    link_t *l;

    if (status < 0)
        return;
    if ((l = link_new(cl, 0)) == NULL) {
        /* the connection stays queued: taken when memory is back */
        kvd_log(KVD_LOG_ERROR, "event=cluster_accept_failed reason=\"no memory\"");
        return;
    }
    cl->ninbound++;
    if (uv_accept(server, (uv_stream_t *)&l->tcp) != 0) {
        link_drop(cl, l, "cannot accept");
        return;
    }
    memset(&sa, 0, sizeof(sa));
    if (uv_tcp_getpeername(&l->tcp, (struct sockaddr *)&sa, &salen) != 0)
        sa.ss_family = AF_UNSPEC;
    addr_text(&sa, l->from, sizeof(l->from));
    l->src_family = addr_bytes(&sa, l->src);
    for (const link_t *o = cl->links; o; o = o->next)
        if (o != l && !o->outbound && !o->authed) {
            startups++;
            same += o->src_family == l->src_family && memcmp(o->src, l->src, 16) == 0;
        }
    if (!allowed(cl, &sa))
        why = "not in cluster-allow-from";
    else if (cl->closing)
        why = "shutting down";
    else if (startups >= MAX_STARTUPS)
        why = "too many connections without proof of the secret";
    else if (same >= MAX_STARTUPS_PER_SOURCE)
        why = "too many connections without proof of the secret from this address";
    else if (cl->ninbound > MAX_INBOUND)
        why = "too many inbound connections";
    if (why != NULL || uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read) != 0) {
        refused(cl, 0, "from", l->from, "", why ? why : "cannot read");
        link_drop(cl, l, why ? why : "cannot read");
        return;
    }
    (void)uv_tcp_nodelay(&l->tcp, 1);
}

/* ---- the caches peers ask about ---------------------------------------------- */

static kvd_cache_t *cluster_cache(kvd_cluster_t *cl, const Kvdock__Cluster__CacheRef *ref)
{
    if (ref == NULL || ref->name == NULL)
        return NULL;
    for (kvd_cache_t *k = cl->srv->caches; k; k = k->next) {
        const kvd_cache_layout_t *l = &k->store.layout;
        if (k->cluster && strcmp(k->name, ref->name) == 0 && l->num_layers == ref->num_layers &&
            !l->mla == !ref->mla && l->tokens_per_block == ref->tokens_per_block &&
            l->token_bytes == ref->token_bytes && ref->dtype != NULL &&
            strcmp(l->dtype, ref->dtype) == 0)
            return k;
    }
    return NULL;
}

static void fill_ref(const kvd_cache_t *k, Kvdock__Cluster__CacheRef *ref)
{
    kvdock__cluster__cache_ref__init(ref);
    ref->name = (char *)k->name;
    ref->num_layers = k->store.layout.num_layers;
    ref->mla = k->store.layout.mla;
    ref->tokens_per_block = k->store.layout.tokens_per_block;
    ref->token_bytes = k->store.layout.token_bytes;
    ref->dtype = (char *)k->store.layout.dtype;
}

static void answer_query(kvd_cluster_t *cl, link_t *l, const Kvdock__Cluster__Query *q)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__QueryReply qr = KVDOCK__CLUSTER__QUERY_REPLY__INIT;
    kvd_cache_t *k = cluster_cache(cl, q->cache);
    uint8_t *bits = calloc((q->n_keys + 7) / 8 + 1, 1);

    if (bits == NULL)
        return;
    for (size_t i = 0; k != NULL && i < q->n_keys; i++) {
        uint32_t id;
        if (q->keys[i].len < 1 || q->keys[i].len > KVD_CACHE_KEY_MAX)
            continue;
        id = kvd_cache_find(&k->store, q->keys[i].data, q->keys[i].len);
        if (id != KVD_CBLOCK_NONE && kvd_cache_block(&k->store, id)->state == KVD_CBLOCK_READY)
            set_bit(bits, (uint32_t)i);
    }
    qr.id = q->id;
    qr.present.data = bits;
    qr.present.len = (q->n_keys + 7) / 8;
    m.m_case = KVDOCK__CLUSTER__MSG__M_QUERY_REPLY;
    m.query_reply = &qr;
    (void)send_msg(cl, l, &m);
    free(bits);
}

static void answer_fetch(kvd_cluster_t *cl, link_t *l, const Kvdock__Cluster__Fetch *f)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__FetchDone fd = KVDOCK__CLUSTER__FETCH_DONE__INIT;
    kvd_cache_t *k = cluster_cache(cl, f->cache);
    uint8_t *missing = calloc((f->n_keys + 7) / 8 + 1, 1);
    uint32_t sent = 0;

    if (missing == NULL)
        return;
    for (size_t i = 0; i < f->n_keys; i++) {
        uint32_t id = KVD_CBLOCK_NONE;
        sendctx_t *sc;

        if (k != NULL && f->keys[i].len >= 1 && f->keys[i].len <= KVD_CACHE_KEY_MAX)
            id = kvd_cache_find(&k->store, f->keys[i].data, f->keys[i].len);
        if (l->nlanes == 0 || id == KVD_CBLOCK_NONE ||
            kvd_cache_block(&k->store, id)->state != KVD_CBLOCK_READY ||
            (sc = calloc(1, sizeof(*sc))) == NULL) {
            set_bit(missing, (uint32_t)i);
            continue;
        }
        kvd_cache_hold(&k->store, id);
        kvd_cache_touch(&k->store, id);
        k->refs++;
        sc->cl = cl;
        sc->cache = k;
        sc->block = id;
        sc->hdr[0] = f->id;
        sc->hdr[1] = i;
        sc->hdr[2] = f->token;
        /* block i to the fetcher's lane i % n */
        lane_send(l->lane_ep[i % l->nlanes], sc, kvd_cache_block_bytes(&k->store, id),
                  k->store.block_bytes);
        sent++;
    }
    fd.id = f->id;
    fd.sent = sent;
    fd.missing.data = missing;
    fd.missing.len = (f->n_keys + 7) / 8;
    m.m_case = KVDOCK__CLUSTER__MSG__M_FETCH_DONE;
    m.fetch_done = &fd;
    (void)send_msg(cl, l, &m);
    free(missing);
}

/* ---- asks of the peers ---------------------------------------------------------- */

static pend_t *pend_find(kvd_cluster_t *cl, uint64_t id)
{
    for (pend_t *p = cl->pends; p; p = p->next)
        if (p->id == id)
            return p;
    return NULL;
}

static void pend_free(kvd_cluster_t *cl, pend_t *p)
{
    pend_t **pp;

    for (pp = &cl->pends; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    for (uint32_t i = 0; i < MAX_PEERS; i++)
        free(p->bits[i]);
    kvd__cache_unref(p->cache);
    free(p->parent);
    free(p->pos);
    free(p->keys);
    free(p->klen);
    free(p->present);
    free(p->ids);
    free(p->from);
    free(p->got);
    free(p->flist);
    free(p->desc);
    free(p->desc_lane);
    free(p->waitq);
    free(p->lpos);
    free(p);
}

/* Once finished, p goes when UCX holds none of its blocks. */
static void pend_maybe_free(kvd_cluster_t *cl, pend_t *p)
{
    if (p->phase == 2 && p->inflight == 0)
        pend_free(cl, p);
}

static void pend_check(kvd_cluster_t *cl, pend_t *p);

/* Drop the rendezvous still waiting for a receive, of peer `peer` or of
 * every peer (-1): their blocks did not come. */
static void rx_drop_waiting(kvd_cluster_t *cl, pend_t *p, int peer)
{
    for (uint32_t q = p->wq_head; p->waitq != NULL && q < p->wq_tail; q++) {
        uint32_t j = p->waitq[q];
        if (p->got[j] != GOT_WAITING || (peer >= 0 && p->from[j] != peer))
            continue;
        lane_cmd_new(&cl->lanes[p->desc_lane[j]], LANE_RELEASE, NULL, p->desc[j]);
        p->desc[j] = NULL;
        p->got[j] = GOT_FAILED;
    }
}

/* Every asked peer answered or the deadline passed: commit what came,
 * tell the asker, and free p once UCX holds none of its blocks. */
static void pend_finish(kvd_cluster_t *cl, pend_t *p)
{
    kvd_cache_store_t *c = &p->cache->store;
    uint32_t missing = 0, first_missing = 0;

    if (p->phase == 2)
        return;
    p->phase = 2;
    if (p->pull) {
        rx_drop_waiting(cl, p, -1);
        for (uint32_t j = p->nask; p->ids != NULL && j-- > 0;) { /* the last first: parents
                                                                  * stay more recent */
            if (p->ids[j] == KVD_CBLOCK_NONE || p->got[j] == GOT_RECEIVING)
                continue; /* UCX still writes it: settled when its receive ends */
            if (p->got[j] == GOT_IN && !p->cache->dropped)
                kvd_cache_commit(c, p->ids[j]);
            else
                kvd_cache_abort(c, p->ids[j]);
            p->ids[j] = KVD_CBLOCK_NONE;
        }
        for (uint32_t j = 0; j < p->nask; j++)
            if ((p->got == NULL || p->got[j] != GOT_IN) && missing++ == 0)
                first_missing = p->pos[j];
        if (missing > 0 && p->why[0] == '\0')
            snprintf(p->why, sizeof(p->why), "no live peer had them");
        kvd_log(KVD_LOG_DEBUG, "event=cluster_pull cache=%s asked=%u missing=%u first=%u",
                p->cache->name, p->nask, missing, first_missing);
    }
    if (p->answer != NULL) {
        void (*answer)(void *, const uint8_t *, const char *) = p->answer;
        p->answer = NULL;
        p->landed = NULL;
        answer(p->arg, p->present, p->why);
    }
    for (pend_t *f = cl->pends, *next; f; f = next) { /* pulls that waited for this one */
        next = f->next;
        if (f->leader == p) {
            f->leader = NULL;
            pend_check(cl, f);
            next = cl->pends; /* the list may have changed: again from the start */
        }
    }
    pend_maybe_free(cl, p);
}

/* A receive UCX held ended: the block is in (ok) or not. */
static void block_landed(pend_t *p, uint32_t j, int ok)
{
    kvd_cluster_t *cl = p->cl;
    int8_t from = p->from[j];

    p->got[j] = ok ? GOT_IN : GOT_FAILED;
    if (from >= 0) {
        p->recvd[from]++;
        p->progress_ns[from] = kvd_now_ns();
    }
    if (ok && from >= 0) {
        peer_t *pe = &cl->peers[from];
        pe->blocks_fetched++;
        pe->bytes_fetched += p->cache->store.block_bytes;
        p->cache->fetched++;
        cl->n.blocks_fetched++;
        cl->n.bytes_fetched += p->cache->store.block_bytes;
        p->fresh++;
    }
    if (p->phase == 2) { /* finished before this receive ended */
        if (p->ids[j] != KVD_CBLOCK_NONE) {
            if (p->got[j] == GOT_IN && !p->cache->dropped)
                kvd_cache_commit(&p->cache->store, p->ids[j]);
            else
                kvd_cache_abort(&p->cache->store, p->ids[j]);
            p->ids[j] = KVD_CBLOCK_NONE;
        }
    }
}

/* Asking ends when every asked peer answered, or once the peers that
 * answered hold every asked key between them: a peer that is slow or
 * stopped then costs nothing (its answer could change nothing). */
static int pend_all_done(const pend_t *p)
{
    if (p->leader != NULL)
        return 0;
    if (p->phase == 0 && p->nask > 0 && p->covered == p->nask)
        return 1;
    for (uint32_t i = 0; i < MAX_PEERS; i++) {
        if (p->phase == 0 && p->asked[i] && !p->answered[i])
            return 0;
        if (p->phase == 1 && p->fetching[i] && (!p->done[i] || p->recvd[i] < p->expect[i]))
            return 0;
    }
    return 1;
}

static void pend_start_pull(kvd_cluster_t *cl, pend_t *p);

/* Blocks have landed while the pull goes on: commit them and hand them to
 * the asker now (a load copies them into the worker's pool), so that the
 * copy overlaps the rest of the pull instead of following it. */
static void pend_early(pend_t *p)
{
    kvd_cache_store_t *c = &p->cache->store;
    uint32_t count = 0;

    if (p->cache->dropped)
        return;
    for (uint32_t j = p->nask; j-- > 0;) { /* the last first, as saves commit */
        if (p->got[j] != GOT_IN || p->ids[j] == KVD_CBLOCK_NONE)
            continue;
        if (kvd_cache_commit(c, p->ids[j]))
            p->lpos[count++] = p->pos[j];
        p->ids[j] = KVD_CBLOCK_NONE; /* the tier's now */
    }
    p->fresh = 0;
    if (count > 0)
        p->landed(p->arg, p->lpos, count);
}

static void pend_check(kvd_cluster_t *cl, pend_t *p)
{
    if (p->phase == 1 && p->landed != NULL && p->lpos != NULL &&
        p->fresh >= (p->nask / 8 > EARLY_MIN ? p->nask / 8 : EARLY_MIN) && !pend_all_done(p))
        pend_early(p);
    if (p->phase == 2 || !pend_all_done(p))
        return;
    if (p->phase == 0 && p->pull) {
        pend_start_pull(cl, p);
        if (p->phase == 1 && !pend_all_done(p))
            return;
    }
    pend_finish(cl, p);
}

/* Peer i is gone: what it owed every request is lost. */
static void pend_peer_lost(kvd_cluster_t *cl, uint32_t i, const char *why)
{
    pend_t *p, *next;

    for (p = cl->pends; p; p = next) {
        next = p->next;
        if (p->phase == 2)
            continue;
        if ((p->phase == 0 && p->asked[i] && !p->answered[i]) ||
            (p->phase == 1 && p->fetching[i] && (!p->done[i] || p->recvd[i] < p->expect[i]))) {
            if (p->why[0] == '\0')
                snprintf(p->why, sizeof(p->why), "peer %s: %s", cl->peers[i].addr, why);
            p->answered[i] = 1;
            p->done[i] = 1;
            p->expect[i] = p->recvd[i];
            if (p->phase == 1)
                rx_drop_waiting(cl, p, (int)i);
            if (p->phase == 1)
                for (uint32_t j = 0; j < p->nask; j++)
                    if (p->from[j] == (int8_t)i && p->got[j] == GOT_NONE)
                        p->got[j] = GOT_FAILED;
            pend_check(cl, p);
        }
    }
}

static int ask(kvd_cluster_t *cl, pend_t *p, uint32_t i, int fetch, const uint32_t *which,
               uint32_t count)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Query q = KVDOCK__CLUSTER__QUERY__INIT;
    Kvdock__Cluster__Fetch f = KVDOCK__CLUSTER__FETCH__INIT;
    Kvdock__Cluster__CacheRef ref;
    ProtobufCBinaryData *keys = calloc(count ? count : 1, sizeof(*keys));
    int rc;

    if (keys == NULL)
        return -1;
    fill_ref(p->cache, &ref);
    for (uint32_t j = 0; j < count; j++) {
        uint32_t a = which ? which[j] : j;
        keys[j].data = p->keys + (size_t)a * KVD_CACHE_KEY_MAX;
        keys[j].len = p->klen[a];
    }
    if (fetch) {
        f.id = p->id;
        f.token = p->token[i];
        f.cache = &ref;
        f.n_keys = count;
        f.keys = keys;
        m.m_case = KVDOCK__CLUSTER__MSG__M_FETCH;
        m.fetch = &f;
    } else {
        q.id = p->id;
        q.cache = &ref;
        q.n_keys = count;
        q.keys = keys;
        m.m_case = KVDOCK__CLUSTER__MSG__M_QUERY;
        m.query = &q;
    }
    rc = send_msg(cl, cl->peers[i].link, &m);
    free(keys);
    return rc;
}

/* The pull in flight (other than self) that reserved block id of self's
 * cache, if any. */
static pend_t *puller_of(kvd_cluster_t *cl, const pend_t *self, uint32_t id)
{
    for (pend_t *p = cl->pends; p; p = p->next)
        if (p != self && p->cache == self->cache && p->phase == 1 && p->ids != NULL)
            for (uint32_t j = 0; j < p->nask; j++)
                if (p->ids[j] == id && p->got[j] != GOT_FAILED)
                    return p;
    return NULL;
}

/* The answers are in: each asked key goes to the peer holding it that has
 * the fewest so far (the pull spreads over the holders), into a block
 * reserved for it in the local tier. */
static void pend_start_pull(kvd_cluster_t *cl, pend_t *p)
{
    kvd_cache_store_t *c = &p->cache->store;
    uint32_t load[MAX_PEERS] = {0}, parent, there, at = 0;
    char why[160];
    int full = 0; /* the tier refused a block: none after it */

    p->phase = 1;
    p->ids = malloc(p->nask * sizeof(*p->ids));
    p->from = malloc(p->nask);
    p->got = calloc(p->nask, 1);
    p->flist = malloc(p->nask * sizeof(*p->flist));
    p->desc = calloc(p->nask, sizeof(*p->desc));
    p->desc_lane = calloc(p->nask, 1);
    p->waitq = malloc(p->nask * sizeof(*p->waitq));
    p->window = (uint32_t)(RX_WINDOW_BYTES / c->block_bytes);
    if (p->window < RX_WINDOW_MIN)
        p->window = RX_WINDOW_MIN;
    p->window *= cl->nlanes;
    p->lpos = malloc(p->nask * sizeof(*p->lpos)); /* no batches without it: fine */
    if (p->ids == NULL || p->from == NULL || p->got == NULL || p->flist == NULL ||
        p->desc == NULL || p->desc_lane == NULL || p->waitq == NULL) {
        free(p->ids); /* nothing is pulled: the load names every key missing */
        free(p->from);
        free(p->got);
        free(p->flist);
        free(p->desc);
        free(p->desc_lane);
        free(p->waitq);
        p->ids = NULL;
        p->from = NULL;
        p->got = NULL;
        p->flist = NULL;
        p->desc = NULL;
        p->desc_lane = NULL;
        p->waitq = NULL;
        snprintf(p->why, sizeof(p->why), "out of memory");
        return;
    }
    for (uint32_t j = 0; j < p->nask; j++) {
        int best = -1;
        p->ids[j] = KVD_CBLOCK_NONE;
        p->from[j] = -1;
        for (uint32_t i = 0; i < cl->npeers; i++)
            if (p->bits[i] != NULL && kvd_cluster_bit(p->bits[i], j) &&
                cl->peers[i].state == PEER_UP && (best < 0 || load[i] < load[best]))
                best = (int)i;
        /* the parent: the block reserved for the request's key before this
         * one, or that key's block here (held since the request came) */
        parent = j > 0 && p->pos[j - 1] + 1 == p->pos[j] ? p->ids[j - 1] : p->parent[j];
        if (best < 0 || full)
            continue; /* on no peer, or the tier is full: not reserved */
        there = kvd_cache_find(c, p->keys + (size_t)j * KVD_CACHE_KEY_MAX, p->klen[j]);
        if (there != KVD_CBLOCK_NONE) { /* another save or pull made it meanwhile */
            if (p->leader == NULL && kvd_cache_block(c, there)->state == KVD_CBLOCK_FILLING)
                p->leader = puller_of(cl, p, there); /* run after that pull */
            continue;
        }
        if (kvd_cache_reserve(c, parent, p->keys + (size_t)j * KVD_CACHE_KEY_MAX, p->klen[j],
                              &p->ids[j], why, sizeof(why)) != KVD_OK) {
            p->ids[j] = KVD_CBLOCK_NONE;
            snprintf(p->why, sizeof(p->why), "the local tier has no room for them (%s)", why);
            full = 1;
            continue;
        }
        p->from[j] = (int8_t)best;
        load[best]++;
    }
    for (uint32_t i = 0; i < cl->npeers; i++) {
        uint32_t *which = p->flist + at;
        if (load[i] == 0)
            continue;
        p->fbase[i] = at;
        for (uint32_t j = 0; j < p->nask; j++)
            if (p->from[j] == (int8_t)i)
                p->flist[at++] = j;
        p->fcount[i] = at - p->fbase[i];
        p->fetching[i] = 1;
        p->progress_ns[i] = kvd_now_ns();
        fill_random((uint8_t *)&p->token[i], sizeof(p->token[i]));
        if (ask(cl, p, i, 1, which, p->fcount[i]) != 0) {
            p->done[i] = 1;
            for (uint32_t j = 0; j < p->fcount[i]; j++)
                p->got[which[j]] = GOT_FAILED;
        }
    }
}

kvd_status_t kvd_cluster_ask(kvd_cluster_t *cl, const kvd_cluster_ask_t *a, char *why,
                             size_t why_len)
{
    kvd_cache_t *k = a->cache;
    uint32_t first = a->first, n = a->n, asked = 0, nask = 0;
    pend_t *p = calloc(1, sizeof(*p));

    if (p == NULL) {
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    p->cl = cl;
    p->id = cl->next_id++;
    p->pull = a->pull;
    p->landed = a->landed;
    p->answer = a->done;
    p->arg = a->arg;
    p->first = first;
    p->n = n;
    p->cache = k;
    k->refs++;
    p->pos = malloc((n - first) * sizeof(*p->pos));
    p->keys = malloc((size_t)(n - first) * KVD_CACHE_KEY_MAX);
    p->klen = malloc(n - first);
    p->present = calloc((n - first + 7) / 8 + 1, 1);
    p->parent = malloc((n - first) * sizeof(*p->parent));
    if (p->pos == NULL || p->keys == NULL || p->klen == NULL || p->present == NULL ||
        p->parent == NULL) {
        pend_free(cl, p);
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    for (uint32_t i = first, here = KVD_CBLOCK_NONE; i < n; i++) {
        /* a pull asks only for the keys the tier lacks (neither ready nor
         * filling); the asker holds those it has */
        uint32_t id = a->pull ? kvd_cache_find(&k->store, a->keys[i], a->lens[i])
                              : KVD_CBLOCK_NONE;
        if (id != KVD_CBLOCK_NONE) {
            here = KVD_CBLOCK_NONE;
            if (kvd_cache_block(&k->store, id)->state == KVD_CBLOCK_READY)
                here = id;
            else if (p->leader == NULL) /* filling: if a pull brings it, wait for that */
                p->leader = puller_of(cl, p, id);
            continue;
        }
        p->parent[nask] = here;
        here = KVD_CBLOCK_NONE;
        p->pos[nask] = i;
        memcpy(p->keys + (size_t)nask * KVD_CACHE_KEY_MAX, a->keys[i], a->lens[i]);
        p->klen[nask] = (uint8_t)a->lens[i];
        nask++;
    }
    p->nask = nask;
    p->next = cl->pends;
    cl->pends = p;
    p->started_ns = kvd_now_ns();
    p->deadline_ns = p->started_ns + cl->deadline_ns;
    for (uint32_t i = 0; i < cl->npeers && nask > 0; i++) {
        if (cl->peers[i].state != PEER_UP || cl->peers[i].link == NULL)
            continue;
        if ((p->bits[i] = calloc((nask + 7) / 8 + 1, 1)) == NULL)
            continue;
        p->asked[i] = 1;
        p->progress_ns[i] = kvd_now_ns();
        cl->peers[i].queries++;
        if (ask(cl, p, i, 0, NULL, nask) != 0) {
            p->answered[i] = 1;
            continue;
        }
        asked++;
    }
    if (asked == 0 && p->leader == NULL) { /* nobody to ask or wait for */
        snprintf(why, why_len, "%s", nask > 0 ? "no peer is up" : "");
        p->answer = NULL;
        p->phase = 2;
        pend_free(cl, p);
        return KVD_ENOENT;
    }
    if (asked == 0)
        p->phase = 1; /* only waiting for the leader's pull */
    return KVD_OK;
}

/* ---- what comes in --------------------------------------------------------------- */

/* The request in phase an answer of request id from l's peer is for (its
 * peer's index in *i), or NULL: not ours, or not in that phase now. */
static pend_t *answered_pend(kvd_cluster_t *cl, const link_t *l, uint64_t id, int phase,
                             uint32_t *i)
{
    pend_t *p = pend_find(cl, id);

    if (p == NULL || l->peer == NULL || p->phase != phase)
        return NULL;
    *i = (uint32_t)(l->peer - cl->peers);
    return p;
}

/* Tell the peer behind outbound link l where to send the blocks we fetch:
 * our lanes' rx workers. */
static int send_lanes(kvd_cluster_t *cl, link_t *l)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Lanes ln = KVDOCK__CLUSTER__LANES__INIT;
    ProtobufCBinaryData addr[MAX_LANES];

    for (uint32_t k = 0; k < cl->nlanes; k++) {
        addr[k].data = (uint8_t *)cl->lanes[k].address;
        addr[k].len = cl->lanes[k].address_len;
    }
    ln.n_address = cl->nlanes;
    ln.address = addr;
    m.m_case = KVDOCK__CLUSTER__MSG__M_LANES;
    m.lanes = &ln;
    return send_msg(cl, l, &m);
}

/* A proven peer's lanes (once, on its connection to us): each address
 * checked before UCX sees it, then an endpoint to each from one of our
 * lanes' tx workers, lane k from our lane k % ours. */
static void take_lanes(kvd_cluster_t *cl, link_t *l, const Kvdock__Cluster__Lanes *ln)
{
    const lane_t *own = &cl->lanes[0];

    if (l->nlanes > 0 || ln->n_address == 0 || ln->n_address > MAX_LANES) {
        refuse_link(cl, l, "bad lanes");
        return;
    }
    for (size_t k = 0; k < ln->n_address; k++)
        if (ln->address[k].len == 0 || ln->address[k].len > MAX_LANE_ADDRESS ||
            !kvd_cw_ucx_address_ok(ln->address[k].data, ln->address[k].len,
                                   (const uint8_t *)own->address, own->address_len)) {
            refuse_link(cl, l, "bad lanes: not a UCX worker address of this cluster's kind");
            return;
        }
    for (uint32_t k = 0; k < ln->n_address; k++) {
        lane_ep_t *lep = calloc(1, sizeof(*lep));
        if (lep == NULL || (lep->addr = calloc(1, ln->address[k].len + ADDRESS_SLACK)) == NULL) {
            free(lep);
            refuse_link(cl, l, "bad lanes: no memory"); /* closes those made so far */
            return;
        }
        memcpy(lep->addr, ln->address[k].data, ln->address[k].len);
        lep->lane = &cl->lanes[k % cl->nlanes];
        lep->all = cl->lane_eps;
        cl->lane_eps = lep;
        l->lane_ep[l->nlanes++] = lep;
        lane_cmd_new(lep->lane, LANE_CONNECT, lep, NULL);
    }
}

static void handle_msg(kvd_cluster_t *cl, link_t *l, const Kvdock__Cluster__Msg *m)
{
    uint8_t proof[KVD_BLAKE2S_BYTES];

    switch (m->m_case) {
    case KVDOCK__CLUSTER__MSG__M_HELLO: { /* inbound: prove ourselves, challenge them */
        Kvdock__Cluster__Msg out = KVDOCK__CLUSTER__MSG__INIT;
        Kvdock__Cluster__Challenge ch = KVDOCK__CLUSTER__CHALLENGE__INIT;
        const Kvdock__Cluster__Hello *h = m->hello;
        if (l->outbound || l->authed || l->hello_seen || h->nonce.len != NONCE_BYTES ||
            h->version != PROTOCOL_VERSION) {
            refuse_link(cl, l, h->version != PROTOCOL_VERSION ? "protocol version" : "bad hello");
            return;
        }
        l->hello_seen = 1;
        snprintf(l->node, sizeof(l->node), "%s", h->node ? h->node : "");
        memcpy(l->their_nonce, h->nonce.data, NONCE_BYTES);
        fill_random(l->my_nonce, NONCE_BYTES);
        prove(cl, "kvdock-cluster-1 B", l->their_nonce, l->my_nonce, proof);
        ch.node = cl->node;
        ch.nonce.data = l->my_nonce;
        ch.nonce.len = NONCE_BYTES;
        ch.proof.data = proof;
        ch.proof.len = sizeof(proof);
        out.m_case = KVDOCK__CLUSTER__MSG__M_CHALLENGE;
        out.challenge = &ch;
        (void)send_msg(cl, l, &out);
        return;
    }
    case KVDOCK__CLUSTER__MSG__M_CHALLENGE: { /* outbound: check them, prove ourselves */
        Kvdock__Cluster__Msg out = KVDOCK__CLUSTER__MSG__INIT;
        Kvdock__Cluster__Auth au = KVDOCK__CLUSTER__AUTH__INIT;
        const Kvdock__Cluster__Challenge *ch = m->challenge;
        if (!l->outbound || l->authed || ch->nonce.len != NONCE_BYTES ||
            ch->proof.len != KVD_BLAKE2S_BYTES) {
            refuse_link(cl, l, "bad challenge");
            return;
        }
        prove(cl, "kvdock-cluster-1 B", l->my_nonce, ch->nonce.data, proof);
        if (!same_bytes(proof, ch->proof.data, sizeof(proof))) {
            refuse_link(cl, l, "the peer does not know the cluster secret");
            return;
        }
        snprintf(l->node, sizeof(l->node), "%s", ch->node ? ch->node : "");
        memcpy(l->their_nonce, ch->nonce.data, NONCE_BYTES);
        prove(cl, "kvdock-cluster-1 A", l->their_nonce, l->my_nonce, proof);
        au.proof.data = proof;
        au.proof.len = sizeof(proof);
        out.m_case = KVDOCK__CLUSTER__MSG__M_AUTH;
        out.auth = &au;
        l->authed = 1; /* they proved it; they will say Welcome once we have */
        (void)send_msg(cl, l, &out);
        return;
    }
    case KVDOCK__CLUSTER__MSG__M_AUTH: { /* inbound: their proof */
        Kvdock__Cluster__Msg out = KVDOCK__CLUSTER__MSG__INIT;
        Kvdock__Cluster__Welcome w = KVDOCK__CLUSTER__WELCOME__INIT;
        if (l->outbound || l->authed || !l->hello_seen ||
            m->auth->proof.len != KVD_BLAKE2S_BYTES) {
            refuse_link(cl, l, "auth out of turn");
            return;
        }
        prove(cl, "kvdock-cluster-1 A", l->my_nonce, l->their_nonce, proof);
        if (!same_bytes(proof, m->auth->proof.data, sizeof(proof))) {
            refuse_link(cl, l, "the peer does not know the cluster secret");
            return;
        }
        l->authed = 1;
        kvd_log(KVD_LOG_INFO, "event=cluster_inbound from=%s node=%s", l->from, l->node);
        out.m_case = KVDOCK__CLUSTER__MSG__M_WELCOME;
        out.welcome = &w;
        (void)send_msg(cl, l, &out);
        return;
    }
    case KVDOCK__CLUSTER__MSG__M_WELCOME:
        if (l->outbound && l->authed && l->peer != NULL) {
            /* before any fetch on this endpoint: where its blocks go */
            if (send_lanes(cl, l) != 0) {
                link_drop(cl, l, "cannot send our lanes");
                return;
            }
            l->peer->backoff_ms = BACKOFF_MIN_MS;
            peer_set(cl, l->peer, PEER_UP, NULL);
            l->peer->ping_sent_ns = 0;
        }
        return;
    case KVDOCK__CLUSTER__MSG__M_REFUSED: {
        char why[160];
        snprintf(why, sizeof(why), "refused by the peer: %s",
                 m->refused->reason ? m->refused->reason : "");
        if (!l->outbound && !l->authed) { /* it never proved the secret either */
            cl->n.refused++;
            kvd_log(KVD_LOG_WARN, "event=cluster_refused from=%s node=\"%s\" reason=\"no proof "
                    "of the secret (%s)\"", l->from, l->node, why);
            link_drop(cl, l, why);
            return;
        }
        kvd_log(KVD_LOG_WARN, "event=cluster_refused_by %s=%s reason=\"%s\"",
                l->outbound ? "peer" : "from", l->outbound && l->peer ? l->peer->addr : l->from,
                why);
        if (l->outbound && l->peer != NULL) {
            peer_set(cl, l->peer, PEER_REFUSED, why);
        }
        link_drop(cl, l, why);
        return;
    }
    default:
        break;
    }
    if (!l->authed) { /* nothing else before the proof */
        refuse_link(cl, l, "a request before the proof of the secret");
        return;
    }
    switch (m->m_case) {
    case KVDOCK__CLUSTER__MSG__M_QUERY:
        if (!l->outbound)
            answer_query(cl, l, m->query);
        return;
    case KVDOCK__CLUSTER__MSG__M_FETCH:
        if (!l->outbound)
            answer_fetch(cl, l, m->fetch);
        return;
    case KVDOCK__CLUSTER__MSG__M_LANES:
        if (!l->outbound)
            take_lanes(cl, l, m->lanes);
        return;
    case KVDOCK__CLUSTER__MSG__M_PING: {
        Kvdock__Cluster__Msg out = KVDOCK__CLUSTER__MSG__INIT;
        Kvdock__Cluster__Pong po = KVDOCK__CLUSTER__PONG__INIT;
        po.t = m->ping->t;
        out.m_case = KVDOCK__CLUSTER__MSG__M_PONG;
        out.pong = &po;
        (void)send_msg(cl, l, &out);
        return;
    }
    case KVDOCK__CLUSTER__MSG__M_PONG:
        if (l->outbound && l->peer != NULL && m->pong->t == l->peer->ping_t) {
            l->peer->rtt_ns = kvd_now_ns() - l->peer->ping_sent_ns;
            l->peer->ping_sent_ns = 0;
        }
        return;
    case KVDOCK__CLUSTER__MSG__M_QUERY_REPLY: {
        uint32_t i;
        pend_t *p = answered_pend(cl, l, m->query_reply->id, 0, &i);
        if (p == NULL || !p->asked[i] || p->answered[i])
            return;
        p->answered[i] = 1;
        if (m->query_reply->present.len >= (p->nask + 7) / 8) {
            memcpy(p->bits[i], m->query_reply->present.data, (p->nask + 7) / 8);
            for (uint32_t j = 0; j < p->nask; j++)
                if (kvd_cluster_bit(p->bits[i], j) &&
                    !kvd_cluster_bit(p->present, p->pos[j] - p->first)) {
                    set_bit(p->present, p->pos[j] - p->first);
                    p->covered++;
                }
        }
        pend_check(cl, p);
        return;
    }
    case KVDOCK__CLUSTER__MSG__M_FETCH_DONE: {
        uint32_t i;
        pend_t *p = answered_pend(cl, l, m->fetch_done->id, 1, &i);
        if (p == NULL || !p->fetching[i] || p->done[i])
            return;
        p->done[i] = 1;
        p->expect[i] = m->fetch_done->sent;
        p->progress_ns[i] = kvd_now_ns();
        pend_check(cl, p);
        return;
    }
    default:
        return;
    }
}


static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    link_t *l = h->data;

    (void)suggested; /* the loop reads one connection at a time, into one buffer */
    buf->base = (char *)l->cl->scratch;
    buf->len = sizeof(l->cl->scratch);
}

/* Keep n more bytes of l's stream; 0, or -1 out of memory.  At most a
 * frame's limit and a read are ever kept: whole frames go as they come. */
static int rx_append(link_t *l, const uint8_t *data, size_t n)
{
    if (l->rx_len + n > l->rx_cap) {
        size_t cap = l->rx_cap ? l->rx_cap : 4096;
        uint8_t *rx;
        while (cap < l->rx_len + n)
            cap *= 2;
        if ((rx = realloc(l->rx, cap)) == NULL)
            return -1;
        l->rx = rx;
        l->rx_cap = cap;
    }
    memcpy(l->rx + l->rx_len, data, n);
    l->rx_len += n;
    return 0;
}

/* Bytes from a connection: before the proof at most PREAUTH_BYTES in
 * all and frames of PREAUTH_FRAME, after it frames of MAX_CTRL_BYTES;
 * each whole frame is decoded and handled as it comes. */
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    link_t *l = s->data;
    kvd_cluster_t *cl = l->cl;
    size_t at = 0;
    char why[160];

    if (l->closed || nread == 0)
        return;
    if (nread < 0) {
        snprintf(why, sizeof(why), "connection %s", nread == UV_EOF ? "closed by the other side"
                                                                    : uv_strerror((int)nread));
        if (!l->outbound && !l->authed) {
            refused(cl, 0, "from", l->from, l->node, "left without proof of the secret");
        } else if (!l->outbound) {
            kvd_log(KVD_LOG_INFO, "event=cluster_inbound_closed from=%s node=%s reason=\"%s\"",
                    l->from, l->node, why);
        }
        link_drop(cl, l, why);
        return;
    }
    kvd__server_activity(cl->srv); /* the next message likely follows soon */
    if (!l->authed && (l->rx_total += (size_t)nread) > PREAUTH_BYTES) {
        refuse_link(cl, l, "more than 1 KiB before the proof of the secret");
        return;
    }
    if (rx_append(l, (const uint8_t *)buf->base, (size_t)nread) != 0) {
        link_drop(cl, l, "out of memory");
        return;
    }
    while (!l->closed) {
        uint32_t n;
        int r = kvd_cw_frame(l->rx + at, l->rx_len - at, l->authed ? MAX_CTRL_BYTES : PREAUTH_FRAME,
                             &n);
        Kvdock__Cluster__Msg *m;
        if (r == KVD_CW_BAD) {
            refuse_link(cl, l, l->authed ? "an empty message or one over 8 MiB"
                                         : "an empty message or one over 512 bytes before the "
                                           "proof of the secret");
            return;
        }
        if (r == KVD_CW_NEED)
            break;
        m = kvdock__cluster__msg__unpack(NULL, n, l->rx + at + KVD_CW_HEADER);
        at += KVD_CW_HEADER + n;
        if (m == NULL) {
            refuse_link(cl, l, "a message that does not decode");
            return;
        }
        handle_msg(cl, l, m);
        kvdock__cluster__msg__free_unpacked(m, NULL);
    }
    if (l->closed)
        return; /* its buffer goes with it */
    memmove(l->rx, l->rx + at, l->rx_len - at);
    l->rx_len -= at;
    if (l->rx_cap > 65536 && l->rx_len < l->rx_cap / 4) { /* a large message went: give it back */
        uint8_t *rx = realloc(l->rx, l->rx_cap / 4);
        if (rx != NULL) {
            l->rx = rx;
            l->rx_cap /= 4;
        }
    }
}

typedef struct block_rx {
    lane_ev_t ev;            /* first: the event is the receive */
    lane_cmd_t cmd;
    lane_t *lane;
    ucs_status_t status;
    size_t length;
    pend_t *p;
    uint32_t j;
} block_rx_t;

/* A receive ended (at once, or its event came): settle its block. */
static void rx_end(block_rx_t *rx, ucs_status_t status, size_t length)
{
    pend_t *p = rx->p;

    p->inflight--;
    block_landed(p, rx->j, status == UCS_OK && length == p->cache->store.block_bytes);
    free(rx);
}

static void rx_next(kvd_cluster_t *cl, pend_t *p);

static void lane_received(kvd_cluster_t *cl, lane_ev_t *ev)
{
    block_rx_t *rx = (block_rx_t *)ev;
    pend_t *p = rx->p;

    rx_end(rx, rx->status, rx->length);
    if (p->phase == 2) {
        pend_maybe_free(cl, p);
        return;
    }
    rx_next(cl, p);
    pend_check(cl, p);
}

/* A block's receive ended (on the lane's thread): back to the loop. */
static void lane_receive_ended(void *arg, ucs_status_t status, size_t length)
{
    block_rx_t *rx = arg;

    rx->status = status;
    rx->length = length;
    rx->ev.fn = lane_received;
    ev_post(rx->lane->cl, &rx->ev);
}

static void on_lane_received(void *request, ucs_status_t status, size_t length, void *user_data)
{
    block_rx_t *rx = user_data;

    ucp_request_free(request);
    rx->lane->outstanding--;
    lane_receive_ended(rx, status, length);
}

/* Receive block j's rendezvous `data` (on lane ln) straight into its
 * reserved block. */
static void rx_start(pend_t *p, uint32_t j, lane_t *ln, void *data)
{
    block_rx_t *rx = calloc(1, sizeof(*rx));

    p->inflight++;
    p->got[j] = GOT_RECEIVING;
    if (rx == NULL) {
        lane_cmd_new(ln, LANE_RELEASE, NULL, data);
        p->inflight--;
        block_landed(p, j, 0);
        return;
    }
    rx->p = p;
    rx->j = j;
    rx->lane = ln;
    rx->cmd.op = LANE_RECV;
    rx->cmd.ctx = rx;
    rx->cmd.desc = data;
    rx->cmd.buf = kvd_cache_block_bytes(&p->cache->store, p->ids[j]);
    rx->cmd.len = p->cache->store.block_bytes;
    lane_cmd(ln, &rx->cmd);
}

/* Start the waiting receives the window has room for, in arrival order. */
static void rx_next(kvd_cluster_t *cl, pend_t *p)
{
    while (p->inflight < p->window && p->wq_head < p->wq_tail) {
        uint32_t j = p->waitq[p->wq_head++];
        void *data = p->desc[j];

        if (p->got[j] != GOT_WAITING)
            continue; /* dropped meanwhile */
        p->desc[j] = NULL;
        rx_start(p, j, &cl->lanes[p->desc_lane[j]], data);
    }
}

/* A block message a lane took: what it carries, for the loop. */
typedef struct arrival {
    lane_ev_t ev;
    lane_t *lane;
    uint64_t hdr[3];         /* fetch id, index in the fetch, the fetch's token */
    void *data;              /* rendezvous: its descriptor; eager: bytes below */
    size_t length;
    int rndv;
    int bad;                 /* no block's header: dropped, counted */
    uint8_t bytes[];
} arrival_t;

/* On the loop: a block for a fetch of ours lands (or waits for the
 * window); anything else is dropped. */
static void lane_arrived(kvd_cluster_t *cl, lane_ev_t *ev)
{
    arrival_t *a = (arrival_t *)ev;
    pend_t *p = cl->closing ? NULL : pend_find(cl, a->hdr[0]);
    uint32_t i = MAX_PEERS, j;

    if (a->bad)
        goto drop;
    if (p != NULL && p->phase == 1)
        for (i = 0; i < cl->npeers; i++)
            if (p->fetching[i] && p->token[i] == a->hdr[2])
                break;
    if (p == NULL || p->phase != 1 || i >= cl->npeers || a->hdr[1] >= p->fcount[i])
        goto drop; /* not a fetch of ours, or not a key asked of that peer */
    j = p->flist[p->fbase[i] + a->hdr[1]];
    if (p->got[j] != GOT_NONE || p->ids[j] == KVD_CBLOCK_NONE ||
        a->length != p->cache->store.block_bytes)
        goto drop; /* twice, after its peer was given up, or of another size */
    p->progress_ns[i] = kvd_now_ns();
    if (!a->rndv) {
        memcpy(kvd_cache_block_bytes(&p->cache->store, p->ids[j]), a->bytes, a->length);
        block_landed(p, j, 1);
    } else if (p->inflight >= p->window) { /* received when the window has room */
        p->got[j] = GOT_WAITING;
        p->desc[j] = a->data;
        p->desc_lane[j] = (uint8_t)(a->lane - cl->lanes);
        p->waitq[p->wq_tail++] = j;
    } else {
        rx_start(p, j, a->lane, a->data);
    }
    pend_check(cl, p);
    free(a);
    return;
drop:
    /* a stray block (a fetch given up, or a peer sending what was not
     * asked): the link it came by is not known here, only its lane */
    cl->n.blocks_dropped++;
    if (a->rndv)
        lane_cmd_new(a->lane, LANE_RELEASE, NULL, a->data);
    free(a);
}

/* A lane's thread: a block message came.  Eager bytes are copied (UCX
 * owns them only during the call), a rendezvous is kept for the loop to
 * receive or release. */
static ucs_status_t lane_on_block(void *arg, const void *header, size_t header_length, void *data,
                                  size_t length, const ucp_am_recv_param_t *param)
{
    lane_t *ln = arg;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    arrival_t *a;

    int bad = header_length != sizeof(a->hdr) || (!rndv && length > MAX_CTRL_BYTES);

    /* a bad one is only counted (by the loop): UCX keeps nothing of it */
    a = malloc(sizeof(*a) + (rndv || bad ? 0 : length));
    if (a == NULL)
        return UCS_OK;
    a->ev.fn = lane_arrived;
    a->lane = ln;
    a->bad = bad;
    memset(a->hdr, 0, sizeof(a->hdr));
    if (!bad)
        memcpy(a->hdr, header, sizeof(a->hdr));
    a->length = length;
    a->rndv = rndv && !bad;
    a->data = data;
    if (!rndv && !bad)
        memcpy(a->bytes, data, length);
    if (bad) {
        ev_post(ln->cl, &a->ev);
        return UCS_OK;
    }
    ev_post(ln->cl, &a->ev);
    return rndv ? UCS_INPROGRESS : UCS_OK;
}

/* ---- the loop's side ---------------------------------------------------------- */

static void on_tick(uv_timer_t *t)
{
    kvd_cluster_t *cl = t->data;
    uint64_t now = kvd_now_ns();
    pend_t *p, *next;
    link_t *l, *lnext;

    for (uint32_t i = 0; i < cl->npeers; i++) {
        peer_t *pe = &cl->peers[i];
        if (pe->link == NULL) {
            if (now >= pe->next_try_ns)
                peer_connect(cl, pe);
            continue;
        }
        if (pe->state != PEER_UP) {
            if (since(now, pe->link->opened_ns) > cl->deadline_ns)
                link_drop(cl, pe->link, "no proof within the deadline");
            continue;
        }
        if (pe->ping_sent_ns != 0 && since(now, pe->ping_sent_ns) > cl->deadline_ns) {
            link_drop(cl, pe->link, "no answer to a ping within the deadline");
            continue;
        }
        if (pe->ping_sent_ns == 0 && since(now, pe->ping_t) >= PING_NS) {
            Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
            Kvdock__Cluster__Ping pi = KVDOCK__CLUSTER__PING__INIT;
            pe->ping_t = now;
            pe->ping_sent_ns = now;
            pi.t = now;
            m.m_case = KVDOCK__CLUSTER__MSG__M_PING;
            m.ping = &pi;
            (void)send_msg(cl, pe->link, &m);
        }
    }
    /* connections that never proved the secret, and those that read
     * nothing of what they are sent */
    for (l = cl->links; l; l = lnext) {
        lnext = l->next;
        if (l->stalled) {
            if (!l->outbound)
                refused(cl, l->authed, "from", l->from, l->node,
                        "reads nothing of what it is sent");
            link_drop(cl, l, "reads nothing of what it is sent");
            lnext = cl->links; /* dropping may have changed the list: again */
        } else if (!l->outbound && !l->authed && since(now, l->opened_ns) > cl->deadline_ns) {
            refuse_link(cl, l, "no proof of the secret within the deadline");
            lnext = cl->links;
        }
    }
again:
    for (p = cl->pends; p; p = next) {
        next = p->next;
        if (p->phase == 0 && now >= p->deadline_ns) {
            for (uint32_t i = 0; i < MAX_PEERS; i++)
                if (p->asked[i] && !p->answered[i]) {
                    p->answered[i] = 1;
                    if (p->why[0] == '\0')
                        snprintf(p->why, sizeof(p->why), "peer %s did not answer within %" PRIu64
                                 " ms", cl->peers[i].addr, cl->deadline_ns / 1000000);
                }
            pend_check(cl, p);
        } else if (p->phase == 1) {
            for (uint32_t i = 0; i < cl->npeers; i++) {
                if (!p->fetching[i] || (p->done[i] && p->recvd[i] >= p->expect[i]))
                    continue;
                if (since(now, p->progress_ns[i]) > cl->deadline_ns && cl->peers[i].link != NULL) {
                    char why[160];
                    snprintf(why, sizeof(why), "sent nothing for %" PRIu64 " ms of a pull",
                             cl->deadline_ns / 1000000);
                    cl->peers[i].failures++;
                    link_drop(cl, cl->peers[i].link, why); /* ends its transfers */
                    goto again; /* requests may have ended meanwhile */
                }
            }
        }
    }
}

/* ---- set up and tear down ------------------------------------------------------- */

static kvd_status_t read_secret(kvd_cluster_t *cl, const char *path, char *why, size_t why_len)
{
    uint8_t buf[4097];
    struct stat sb;
    ssize_t n;
    size_t len;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    kvd_b2s_t s;

    if (fd < 0) {
        snprintf(why, why_len, "cluster-secret-file %s: %s", path, strerror(errno));
        return KVD_EINVAL;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        snprintf(why, why_len, "cluster-secret-file %s is not a regular file", path);
        return KVD_EINVAL;
    }
    if (sb.st_mode & 077) {
        close(fd);
        snprintf(why, why_len, "cluster-secret-file %s is readable by others (mode %03o): "
                 "chmod 600 it", path, (unsigned)(sb.st_mode & 0777));
        return KVD_EPERM;
    }
    n = read(fd, buf, sizeof(buf));
    close(fd);
    len = n > 0 ? (size_t)n : 0;
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' '))
        len--;
    if (n < 0 || len < 16 || (size_t)n > 4096) {
        snprintf(why, why_len, "cluster-secret-file %s: the secret must be 16 to 4,096 bytes "
                 "(head -c 32 /dev/urandom | base64 > FILE)", path);
        return KVD_EINVAL;
    }
    kvd_b2s_init(&s, NULL, 0);
    kvd_b2s_update(&s, buf, len);
    kvd_b2s_final(&s, cl->key);
    memset(buf, 0, sizeof(buf));
    return KVD_OK;
}

static kvd_status_t add_peer(kvd_cluster_t *cl, const char *text, char *why, size_t why_len)
{
    peer_t *p;
    struct sockaddr_storage sa;
    socklen_t len = 0;
    kvd_status_t st;

    if (text[0] == '\0')
        return KVD_OK;
    if ((st = resolve(text, &sa, &len, why, why_len)) != KVD_OK ||
        (st = usable_family(&sa, text, why, why_len)) != KVD_OK)
        return st;
    if (same_addr(&sa, len, &cl->listen_sa, cl->listen_salen) || strcmp(text, cl->node) == 0)
        return KVD_OK; /* this daemon itself */
    for (uint32_t i = 0; i < cl->npeers; i++)
        if (same_addr(&sa, len, &cl->peers[i].sa, cl->peers[i].salen))
            return KVD_OK; /* listed twice */
    if (cl->npeers >= MAX_PEERS) {
        snprintf(why, why_len, "more than %d cluster peers", MAX_PEERS);
        return KVD_ELIMIT;
    }
    p = &cl->peers[cl->npeers++];
    snprintf(p->addr, sizeof(p->addr), "%s", text);
    p->sa = sa;
    p->salen = len;
    p->state = PEER_DOWN;
    p->backoff_ms = BACKOFF_MIN_MS;
    p->since_ns = kvd_now_ns();
    snprintf(p->error, sizeof(p->error), "not connected yet");
    return KVD_OK;
}

static kvd_status_t add_peers(kvd_cluster_t *cl, const char *list, char *why, size_t why_len)
{
    char item[256];
    const char *s = list;
    kvd_status_t st;

    while ((st = next_item(&s, item, sizeof(item))) == KVD_OK)
        if (item[0] != '\0' && (st = add_peer(cl, item, why, why_len)) != KVD_OK)
            return st;
    if (st == KVD_ELIMIT) {
        snprintf(why, why_len, "a cluster peer address is too long");
        return KVD_EINVAL;
    }
    return KVD_OK;
}

static kvd_status_t read_peers_file(kvd_cluster_t *cl, const char *path, char *why,
                                    size_t why_len)
{
    FILE *f = fopen(path, "re");
    char line[512];
    kvd_status_t st = KVD_OK;
    unsigned lineno = 0;

    if (f == NULL) {
        snprintf(why, why_len, "cluster-peers-file %s: %s", path, strerror(errno));
        return KVD_EINVAL;
    }
    while (st == KVD_OK && fgets(line, sizeof(line), f) != NULL) {
        char *hash;
        lineno++;
        if (strchr(line, '\n') == NULL && !feof(f)) { /* longer: it would split an address */
            snprintf(why, why_len, "cluster-peers-file %s: line %u is over %zu bytes", path,
                     lineno, sizeof(line) - 2);
            st = KVD_EINVAL;
            break;
        }
        hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        line[strcspn(line, "\r\n")] = '\0';
        st = add_peers(cl, line, why, why_len);
    }
    fclose(f);
    return st;
}

/* Stop the lanes' threads (their workers stay, for the loop to finish). */
static void lanes_stop(kvd_cluster_t *cl)
{
    for (uint32_t k = 0; k < cl->nlanes; k++) {
        lane_t *ln = &cl->lanes[k];
        if (!ln->running)
            continue;
        atomic_store(&ln->stop, 1);
        ucp_worker_signal(ln->tx);
        pthread_join(ln->thread, NULL);
        ln->running = 0;
    }
}

/* With the threads stopped: do the lanes' last commands and progress
 * their workers from here until nothing moves, running what that hands
 * the loop. */
static void lanes_settle(kvd_cluster_t *cl)
{
    /* until every transfer and close has ended and handed back what it
     * held (the caches it names go right after), or 2 s have passed */
    for (uint64_t end = kvd_now_ns() + 2000000000ull; kvd_now_ns() < end;) {
        unsigned n = 0, held = 0;
        for (uint32_t k = 0; k < cl->nlanes; k++) {
            lane_t *ln = &cl->lanes[k];
            n += lane_run_cmds(ln);
            n += lane_progress(ln);
            held += ln->outstanding + ln->closing;
        }
        n += ev_drain(cl);
        if (n == 0 && held == 0)
            break;
    }
}

static void lanes_free(kvd_cluster_t *cl)
{
    lanes_stop(cl);
    for (uint32_t k = 0; k < cl->nlanes; k++) {
        lane_t *ln = &cl->lanes[k];
        for (qnode_t *n = queue_take(&ln->cmds), *next; n != NULL; n = next) {
            next = n->next; /* none left after lanes_settle; none run here */
            if (((lane_cmd_t *)n)->owned)
                free(n);
        }
        if (ln->address != NULL)
            ucp_worker_release_address(ln->rx, ln->address);
        if (ln->tx != NULL)
            ucp_worker_destroy(ln->tx);
        if (ln->rx != NULL)
            ucp_worker_destroy(ln->rx);
        pthread_mutex_destroy(&ln->cmds.lock);
        memset(ln, 0, sizeof(*ln));
    }
    cl->nlanes = 0;
    while (cl->lane_eps != NULL) {
        lane_ep_t *lep = cl->lane_eps;
        cl->lane_eps = lep->all;
        free(lep->addr);
        free(lep);
    }
}

/* A worker for one thread and its event descriptor. */
static ucs_status_t worker_make(kvd_cluster_t *cl, ucp_worker_h *w, int *efd)
{
    ucp_worker_params_t wp;
    ucs_status_t us;

    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if ((us = ucp_worker_create(cl->ctx, &wp, w)) != UCS_OK) {
        *w = NULL;
        return us;
    }
    return ucp_worker_get_efd(*w, efd);
}

/* Lane ln's workers, the handler of blocks on rx, and rx's address,
 * which must be one this daemon can check when a peer sends its own. */
static kvd_status_t lane_make(kvd_cluster_t *cl, lane_t *ln, char *why, size_t why_len)
{
    ucp_am_handler_param_t hp;
    ucs_status_t us;

    if ((us = worker_make(cl, &ln->rx, &ln->rx_efd)) != UCS_OK ||
        (us = worker_make(cl, &ln->tx, &ln->tx_efd)) != UCS_OK)
        goto fail;
    memset(&hp, 0, sizeof(hp));
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = AM_BLOCK;
    hp.cb = lane_on_block;
    hp.arg = ln;
    if ((us = ucp_worker_set_am_recv_handler(ln->rx, &hp)) != UCS_OK ||
        (us = ucp_worker_get_address(ln->rx, &ln->address, &ln->address_len)) != UCS_OK) {
        ln->address = NULL;
        goto fail;
    }
    if (ln->address_len > MAX_LANE_ADDRESS ||
        !kvd_cw_ucx_address_ok((const uint8_t *)ln->address, ln->address_len,
                               (const uint8_t *)ln->address, ln->address_len)) {
        snprintf(why, why_len, "UCX packs its worker addresses in a form kvdockd cannot check "
                 "(UCX_UNIFIED_MODE=y, or a UCX other than 1.13's address format)");
        return KVD_EINVAL;
    }
    return KVD_OK;
fail:
    snprintf(why, why_len, "UCX lane worker: %s", ucs_status_string(us));
    return KVD_EIO;
}

/* n lanes: their workers (each its thread's alone) and threads. */
static kvd_status_t lanes_start(kvd_cluster_t *cl, uint32_t n, char *why, size_t why_len)
{
    kvd_status_t st;

    for (cl->nlanes = 0; cl->nlanes < n; cl->nlanes++) {
        lane_t *ln = &cl->lanes[cl->nlanes];
        ln->cl = cl;
        pthread_mutex_init(&ln->cmds.lock, NULL);
        if ((st = lane_make(cl, ln, why, why_len)) != KVD_OK) {
            cl->nlanes++; /* freed below */
            lanes_free(cl);
            return st;
        }
        if (pthread_create(&ln->thread, NULL, lane_run, ln) != 0) {
            cl->nlanes++;
            snprintf(why, why_len, "cannot start a lane's thread");
            lanes_free(cl);
            return KVD_ENOMEM;
        }
        ln->running = 1;
    }
    return KVD_OK;
}

/* --cluster-lanes, or by the CPUs: each lane's thread polls a core while
 * blocks move, on both sides of a pull, and pulls share a node with the
 * engine's own threads. */
static uint32_t lanes_wanted(const kvd_options_t *o)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);

    if (o->cluster_lanes > 0)
        return (uint32_t)o->cluster_lanes;
    return cpus >= 16 ? 4 : cpus >= 8 ? 2 : 1;
}

/* The front door's socket, listening (a daemon restarted listens again
 * at once: SO_REUSEADDR); -errno on failure. */
static int listen_fd(const struct sockaddr_storage *sa, socklen_t len)
{
    int one = 1, err;
    int fd = socket(sa->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

    if (fd < 0)
        return -errno;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, (const struct sockaddr *)sa, len) != 0 || listen(fd, 128) != 0) {
        err = errno;
        close(fd);
        return -err;
    }
    return fd;
}

kvd_status_t kvd_cluster_create(kvd_server_t *srv, kvd_cluster_t **out, char *why,
                                size_t why_len)
{
    const kvd_options_t *o = &srv->opts;
    kvd_cluster_t *cl = calloc(1, sizeof(*cl));
    ucp_params_t up;
    ucp_config_t *cfg = NULL;
    ucs_status_t us;
    kvd_status_t st;
    int rc, fd;

    if (cl == NULL)
        return KVD_ENOMEM;
    cl->srv = srv;
    cl->next_id = 1;
    cl->deadline_ns = o->cluster_deadline_ms * 1000000ull;
    snprintf(cl->node, sizeof(cl->node), "%s", o->cluster_listen);
    if ((st = resolve(o->cluster_listen, &cl->listen_sa, &cl->listen_salen, why, why_len)) !=
            KVD_OK ||
        (st = usable_family(&cl->listen_sa, o->cluster_listen, why, why_len)) != KVD_OK ||
        (st = read_secret(cl, o->cluster_secret_file, why, why_len)) != KVD_OK ||
        (st = add_peers(cl, o->cluster_peers, why, why_len)) != KVD_OK ||
        (o->cluster_peers_file[0] != '\0' &&
         (st = read_peers_file(cl, o->cluster_peers_file, why, why_len)) != KVD_OK) ||
        (st = allow_parse(cl, o->cluster_allow_from, why, why_len)) != KVD_OK) {
        free(cl);
        return st;
    }
    if ((fd = listen_fd(&cl->listen_sa, cl->listen_salen)) < 0) {
        snprintf(why, why_len, "cluster-listen %s: cannot listen there: %s", cl->node,
                 strerror(-fd));
        free(cl);
        return KVD_EIO;
    }
    memset(&up, 0, sizeof(up));
    up.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    up.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    up.mt_workers_shared = 1; /* the lanes' workers run on threads of their own */
    if ((us = ucp_config_read(NULL, NULL, &cfg)) != UCS_OK ||
        (us = ucp_init(&up, cfg, &cl->ctx)) != UCS_OK) {
        if (cfg)
            ucp_config_release(cfg);
        snprintf(why, why_len, "UCX: %s", ucs_status_string(us));
        close(fd);
        free(cl);
        return KVD_EIO;
    }
    ucp_config_release(cfg);
    pthread_mutex_init(&cl->events.lock, NULL);
    if ((st = lanes_start(cl, lanes_wanted(o), why, why_len)) != KVD_OK) {
        close(fd);
        goto fail;
    }
    uv_tcp_init(srv->loop, &cl->listener);
    cl->listener.data = cl;
    if ((rc = uv_tcp_open(&cl->listener, fd)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&cl->listener, 128, on_accept)) != 0) {
        /* never on Linux once listen(2) took it; the handle owns fd now */
        kvd_log(KVD_LOG_ERROR, "event=cluster_listen_failed reason=\"%s\"", uv_strerror(rc));
    }
    cl->listening = 1;
    uv_async_init(srv->loop, &cl->ev_async, on_events);
    cl->ev_async.data = cl;
    atomic_store(&cl->ev_open, 1);
    uv_async_send(&cl->ev_async); /* anything queued before it opened */
    uv_timer_init(srv->loop, &cl->tick);
    cl->tick.data = cl;
    {
        uint64_t ms = o->cluster_deadline_ms / 4;
        ms = ms < 5 ? 5 : ms > 100 ? 100 : ms;
        uv_timer_start(&cl->tick, on_tick, 0, ms);
    }
    kvd_log(KVD_LOG_INFO, "event=cluster_listen node=%s peers=%u lanes=%u deadline_ms=%" PRIu64,
            cl->node, cl->npeers, cl->nlanes, o->cluster_deadline_ms);
    *out = cl;
    return KVD_OK;

fail:
    ev_drain(cl);
    ucp_cleanup(cl->ctx);
    pthread_mutex_destroy(&cl->events.lock);
    free(cl);
    return st;
}

void kvd_cluster_close(kvd_cluster_t *cl)
{
    if (cl == NULL || cl->closing)
        return;
    cl->closing = 1;
    while (cl->pends) { /* end with what came; freed once UCX lets go */
        pend_t *p = cl->pends;
        if (p->phase == 2) {
            /* only waiting for UCX: the endpoints close below */
            cl->pends = p->next;
            p->next = NULL;
            continue;
        }
        if (p->why[0] == '\0')
            snprintf(p->why, sizeof(p->why), "the daemon is shutting down");
        for (uint32_t i = 0; i < MAX_PEERS; i++)
            p->answered[i] = p->done[i] = 1;
        pend_finish(cl, p);
    }
    while (cl->links)
        link_drop(cl, cl->links, "the daemon is shutting down");
    /* the lanes' threads go; what their workers still hold ends here */
    lanes_stop(cl);
    lanes_settle(cl);
    atomic_store(&cl->ev_open, 0); /* no thread left to post: lanes_stop joined them */
    uv_close((uv_handle_t *)&cl->ev_async, NULL);
    if (cl->listening)
        uv_close((uv_handle_t *)&cl->listener, NULL);
    cl->listening = 0;
    uv_close((uv_handle_t *)&cl->tick, NULL);
}

void kvd_cluster_destroy(kvd_cluster_t **clp)
{
    kvd_cluster_t *cl = clp ? *clp : NULL;

    if (cl == NULL)
        return;
    if (!cl->closing)
        kvd_cluster_close(cl);
    lanes_settle(cl);
    lanes_free(cl);
    ev_drain(cl);
    ucp_cleanup(cl->ctx);
    pthread_mutex_destroy(&cl->events.lock);
    free(cl);
    *clp = NULL;
}

uint32_t kvd_cluster_live(const kvd_cluster_t *cl)
{
    uint32_t n = 0;

    for (uint32_t i = 0; cl != NULL && i < cl->npeers; i++)
        n += cl->peers[i].state == PEER_UP;
    return n;
}

Kvdock__Cluster *kvd_cluster_status(kvd_req_t *r, const kvd_cluster_t *cl)
{
    Kvdock__Cluster *c = kvd__req_alloc(r, sizeof(*c));
    uint64_t now = kvd_now_ns();

    if (c == NULL)
        return NULL;
    kvdock__cluster__init(c);
    c->node = (char *)cl->node;
    c->deadline_ms = (uint32_t)(cl->deadline_ns / 1000000);
    c->inbound = 0;
    for (const link_t *l = cl->links; l; l = l->next)
        c->inbound += !l->outbound && l->authed;
    c->blocks_fetched = cl->n.blocks_fetched;
    c->bytes_fetched = cl->n.bytes_fetched;
    c->blocks_served = cl->n.blocks_served;
    c->bytes_served = cl->n.bytes_served;
    c->refused = cl->n.refused;
    c->peers = kvd__req_alloc(r, sizeof(*c->peers) * (cl->npeers ? cl->npeers : 1));
    if (c->peers == NULL)
        return NULL;
    for (uint32_t i = 0; i < cl->npeers; i++) {
        const peer_t *p = &cl->peers[i];
        Kvdock__ClusterPeer *cp = kvd__req_alloc(r, sizeof(*cp));
        if (cp == NULL)
            return NULL;
        kvdock__cluster_peer__init(cp);
        cp->address = (char *)p->addr;
        cp->state = (char *)peer_state_name[p->state];
        cp->error = (char *)p->error;
        cp->rtt_us = p->rtt_ns / 1000;
        cp->since_ms = since(now, p->since_ns) / 1000000;
        cp->queries = p->queries;
        cp->blocks_fetched = p->blocks_fetched;
        cp->bytes_fetched = p->bytes_fetched;
        cp->failures = p->failures;
        c->peers[c->n_peers++] = cp;
    }
    return c;
}

void kvd_cluster_get_totals(const kvd_cluster_t *cl, kvd_cluster_totals_t *t)
{
    *t = cl->n;
    t->inbound = t->unproven = 0;
    for (const link_t *l = cl->links; l; l = l->next) {
        t->inbound += !l->outbound && l->authed;
        t->unproven += !l->outbound && !l->authed;
    }
}

uint32_t kvd_cluster_peers(const kvd_cluster_t *cl)
{
    return cl ? cl->npeers : 0;
}

const char *kvd_cluster_peer(const kvd_cluster_t *cl, uint32_t i, int *up, uint64_t *rtt_us,
                             uint64_t *failures, uint64_t *bytes_fetched)
{
    const peer_t *p = &cl->peers[i];

    *up = p->state == PEER_UP;
    *rtt_us = p->rtt_ns / 1000;
    *failures = p->failures;
    *bytes_fetched = p->bytes_fetched;
    return p->addr;
}
