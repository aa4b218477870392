/*
 * The cluster over UCX (cluster.h says what it does, proto/cluster.proto
 * what daemons say to each other).
 *
 * Endpoints.  Each daemon opens one endpoint to every configured peer
 * (outbound: its own requests go there) and accepts the endpoints peers
 * open to it (inbound: it answers there).  Every message is sent with
 * UCP_AM_SEND_FLAG_REPLY, so a handler learns the endpoint a message came
 * on and finds its link.  A link is trusted only once the secret is
 * proven (Hello, Challenge, Auth, Welcome); until then a daemon answers
 * nothing else, and a wrong proof closes the endpoint.
 *
 * Events.  The UCP worker's event descriptor sits in a uv_poll; before
 * the loop sleeps (uv_prepare) the worker is progressed until it can be
 * armed, so no completion waits for a wake-up that never comes; while
 * transfers run the loop polls instead of sleeping.  A timer ticks the
 * deadlines, pings, and reconnects with back-off.
 *
 * Lanes.  Blocks do not travel on those endpoints: one TCP stream moves
 * what one thread on each side copies, so each daemon runs --cluster-lanes
 * lanes, each a worker with a listener of its own (the cluster's host, a
 * port the system picks, --cluster-allow-from checked as on the cluster's
 * listener) and a thread that progresses it, and tells its peers where
 * they listen (Lanes, right after Welcome).  A daemon answering a fetch
 * connects to those listeners from its own lanes (UCX's client-server
 * flow, as for the control endpoints: connecting to a worker's address
 * instead tripped an assertion inside UCX 1.13 when a peer died
 * mid-pull) and sends block i to the fetcher's lane i % n.  A lane's
 * worker is its thread's alone: the loop queues commands for it (send,
 * receive, release, connect, close: lane_cmd), and every callback there
 * only queues an event for the loop (ev_post), which keeps all the
 * bookkeeping (a worker shared by two threads, UCX_THREAD_MODE_MULTI,
 * has the loop wait on a lock the progressing thread spins on).  A block
 * carries its fetch's random token and lands only if it names a fetch of
 * this daemon.
 *
 * Blocks.  A pull reserves a FILLING block in the local tier for each key
 * it asks a peer for, and the peer's block message lands there: in place
 * for eager messages, by ucp_am_recv_data_nbx straight into the block for
 * rendezvous ones, a window of them at a time (the rest wait in arrival
 * order), so that blocks land in a steady stream.  A block is committed
 * once its bytes are in, aborted otherwise; it stays held until UCX is
 * done with it.  A peer that sends
 * nothing for a whole deadline during a pull is cut off (its endpoint
 * closed: it then closes its lane endpoints to us, and a peer that died
 * ends them anyway), so a pull ends within a deadline of the last
 * progress, however large; a receive its lane still holds is settled
 * whenever UCX ends it.  Landed blocks are committed and
 * copied into the worker's pool by early runs of the load while the rest
 * arrive; the last run copies what is left and replies.  A load that
 * finds blocks another pull has reserved runs after that pull (its
 * leader) instead of pulling them again.
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
#include <uct/api/uct.h>

#include "caches.h"
#include "cluster.pb-c.h"
#include "conn.h"
#include "dispatch.h"
#include "kvdock/blake2s.h"
#include "log.h"
#include "server.h"

#define AM_CTRL 1
#define AM_BLOCK 2
#define NONCE_BYTES 16
#define MAX_PEERS 64
#define MAX_INBOUND 256          /* endpoints peers may hold open to us */
#define MAX_ALLOW 64             /* networks of --cluster-allow-from */
#define MAX_CTRL_BYTES (8u << 20) /* a query or fetch of 65,536 keys of 64 bytes fits */
#define PREAUTH_BYTES 4096u       /* Hello and Auth are tens of bytes */
#define PING_NS 1000000000ull
#define REFUSE_GRACE_NS 100000000ull /* a refusal's reason is sent, then the endpoint closed */
#define REFUSING_MAX 64          /* past it the oldest refused endpoint closes at once */
#define BACKOFF_MIN_MS 100u
#define BACKOFF_MAX_MS 5000u
#define SPIN_QUERY_NS 2000000ull /* a query's answers are polled for this long */
#define EARLY_MIN 16             /* blocks landed before an early run copies them */
#define EARLY_RUNS 2             /* early runs of one load in flight at most */
/* Rendezvous receives one pull runs at once (the rest wait in order):
 * UCX shares the link among all it is given, so a pull of 1,024 blocks
 * given at once lands nothing until nearly all of it is in; a few at a
 * time land in a steady stream that early runs copy while the rest come,
 * and that shows the peer alive. */
#define RX_WINDOW_BYTES (16ull << 20) /* per lane */
#define RX_WINDOW_MIN 4
#define MAX_LANES 8
#define MAX_LANE_ADDRESS 64       /* HOST:PORT */

enum peer_state { PEER_DOWN, PEER_CONNECTING, PEER_UP, PEER_REFUSED };
enum got_state { GOT_NONE, GOT_IN, GOT_FAILED, GOT_RECEIVING, GOT_WAITING };
static const char *const peer_state_name[] = {"down", "connecting", "up", "refused"};

typedef struct peer peer_t;

/* One endpoint, either way. */
typedef struct link {
    ucp_ep_h ep;
    int outbound;
    peer_t *peer;            /* outbound: the configured peer */
    int authed;              /* the other side proved the secret */
    int hello_seen;          /* inbound: its Hello came (one only) */
    int closed;              /* ep closed: nothing more is sent on it */
    uint8_t my_nonce[NONCE_BYTES], their_nonce[NONCE_BYTES];
    char node[64];           /* the other side's node name */
    char from[64];           /* inbound: the address it came from */
    uint64_t opened_ns;
    uint64_t refused_ns;     /* refused: closed REFUSE_GRACE_NS after this */
    /* inbound: endpoints to the peer's lanes (on our lane workers) */
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

/* An endpoint of a lane's worker: made, used and closed by its thread;
 * freed with the cluster (UCX may name it in an error until then). */
typedef struct lane_ep {
    ucp_ep_h ep;             /* NULL: not made, or failed to be */
    struct lane *lane;
    struct sockaddr_storage sa; /* the peer lane's listener */
    socklen_t salen;
    struct lane_ep *all;     /* every lane endpoint, for the cluster to free */
} lane_ep_t;

enum lane_op { LANE_SEND, LANE_RECV, LANE_RELEASE, LANE_CONNECT, LANE_CLOSE };

/* What the loop asks a lane's thread to do with its worker. */
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
    ucp_worker_h worker;
    int efd;
    pthread_t thread;
    int running;
    atomic_int stop;
    queue_t cmds;            /* lane_cmd_t, from the loop */
    uint32_t outstanding;    /* its thread's: sends and receives UCX holds */
    uint32_t closing;        /* its thread's: endpoint closes UCX has not ended */
    ucp_listener_h listener; /* where peers' lanes connect to it */
    char where[MAX_LANE_ADDRESS]; /* its HOST:PORT, as the Lanes message says */
    ucp_ep_h *in;            /* its thread's: the endpoints peers opened to it */
    uint32_t nin, in_cap;
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

/* A request set aside while the peers are asked. */
typedef struct pend {
    uint64_t id;
    int pull;
    kvd_cluster_t *cl;
    kvd_conn_t *conn;
    uint8_t *frame;          /* the request, packed: it runs again from this */
    size_t frame_len;
    uint64_t t_start_ns;
    kvd_cache_t *cache;      /* referenced */
    uint32_t first, n;       /* the request's keys [first, n) ... */
    uint32_t nask;           /* ... of which these were asked: */
    uint32_t *pos;           /*   their places in the request */
    uint8_t *keys;           /*   KVD_CACHE_KEY_MAX bytes each */
    uint8_t *klen;
    uint8_t *present;        /* the request's bits over [first, n): some live peer has it */
    uint32_t *parent;        /* pulls: per asked key, the local block of the key before it */
    uint32_t *held;          /* pulls: the request's blocks here, held until it runs again */
    uint32_t nheld;
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
    uint8_t *copied;         /* bits over the request's keys: copied by an early run */
    uint8_t *only;           /* an early run's keys */
    uint32_t fresh;          /* blocks landed since the last early run */
    uint32_t early_inflight; /* early runs not yet done */
    kvd_status_t early_status; /* the first early run's failure */
    uint32_t *flist;         /* the asked keys of each peer's fetch, peer by peer: */
    uint32_t fbase[MAX_PEERS], fcount[MAX_PEERS]; /* where its run starts, how long */
    uint32_t expect[MAX_PEERS], recvd[MAX_PEERS]; /* blocks sent, blocks whose receive ended */
    uint8_t fetching[MAX_PEERS], done[MAX_PEERS];
    uint64_t progress_ns[MAX_PEERS];
    int phase;               /* 0 asking, 1 pulling, 2 finished (waiting for UCX) */
    struct pend *leader;     /* a pull bringing in keys of this one: it runs after it */
    uint64_t started_ns;
    uint64_t deadline_ns;
    char why[200];
    struct pend *next;
} pend_t;

struct kvd_cluster {
    kvd_server_t *srv;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    int efd;
    uv_poll_t poll;
    uv_prepare_t prepare;
    uv_idle_t spin;          /* keeps the loop from sleeping while transfers run */
    uv_timer_t tick;
    uint32_t sending;        /* sends UCX has not completed */
    int closing;
    char node[KVD_OPT_STR_MAX];
    struct sockaddr_storage listen_sa;
    socklen_t listen_salen;
    uint8_t key[KVD_BLAKE2S_BYTES];
    peer_t peers[MAX_PEERS];
    uint32_t npeers;
    link_t *links;
    link_t *refusing;        /* refused, their endpoints closed soon (newest first) */
    uint32_t nrefusing;
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
    /* where endpoints may come from (--cluster-allow-from) */
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

typedef struct sendctx {
    lane_ev_t ev;            /* a block's send ended (first: the event is the context) */
    lane_cmd_t cmd;          /* a block's send, for the lane of cmd.lep */
    ucs_status_t status;
    kvd_cluster_t *cl;
    void *buf;               /* a control message: freed when sent */
    kvd_cache_t *cache;      /* a block: unheld when sent */
    uint32_t block;
    uint64_t hdr[3];         /* a block's header (fetch id, index, token): UCX reads it
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
    free(sc->buf);
    free(sc);
}

static void on_sent(void *request, ucs_status_t status, void *user_data)
{
    sendctx_t *sc = user_data;

    sc->cl->sending--;
    sent_done(sc, status);
    ucp_request_free(request);
}

static int am_send(kvd_cluster_t *cl, link_t *l, sendctx_t *sc, const void *data, size_t len)
{
    ucp_request_param_t rp;
    void *req;

    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                      UCP_OP_ATTR_FIELD_FLAGS;
    rp.cb.send = on_sent;
    rp.user_data = sc;
    /* control messages go eagerly: a query of a long chain is tens of KiB,
     * and rendezvous would cost two more round trips */
    rp.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    req = ucp_am_send_nbx(l->ep, AM_CTRL, NULL, 0, data, len, &rp);
    if (req == NULL) {
        sent_done(sc, UCS_OK);
        return 0;
    }
    if (UCS_PTR_IS_ERR(req)) {
        sent_done(sc, UCS_PTR_STATUS(req));
        return -1;
    }
    cl->sending++;
    return 0;
}

static int send_msg(kvd_cluster_t *cl, link_t *l, const Kvdock__Cluster__Msg *m)
{
    size_t len = kvdock__cluster__msg__get_packed_size(m);
    sendctx_t *sc = calloc(1, sizeof(*sc));
    uint8_t *buf = malloc(len ? len : 1);

    if (l->closed || sc == NULL || buf == NULL) {
        free(sc);
        free(buf);
        return -1;
    }
    kvdock__cluster__msg__pack(m, buf);
    sc->cl = cl;
    sc->buf = buf;
    return am_send(cl, l, sc, buf, len);
}

/* ---- endpoints ------------------------------------------------------------------ */

/* An endpoint of worker w to the listener at sa (UCX's client-server
 * flow), its failures reported to cb(arg). */
static ucs_status_t ep_connect(ucp_worker_h w, const struct sockaddr_storage *sa, socklen_t salen,
                               ucp_err_handler_cb_t cb, void *arg, ucp_ep_h *ep)
{
    ucp_ep_params_t pr;

    memset(&pr, 0, sizeof(pr));
    pr.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    pr.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    pr.sockaddr.addr = (const struct sockaddr *)sa;
    pr.sockaddr.addrlen = salen;
    pr.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    pr.err_handler.cb = cb;
    pr.err_handler.arg = arg;
    return ucp_ep_create(w, &pr, ep);
}

/* An endpoint of worker w for a connection request its listener took. */
static ucs_status_t ep_accept(ucp_worker_h w, ucp_conn_request_h req, ucp_err_handler_cb_t cb,
                              void *arg, ucp_ep_h *ep)
{
    ucp_ep_params_t pr;

    memset(&pr, 0, sizeof(pr));
    pr.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    pr.conn_request = req;
    pr.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    pr.err_handler.cb = cb;
    pr.err_handler.arg = arg;
    return ucp_ep_create(w, &pr, ep);
}

static void on_closed(void *request, ucs_status_t status, void *user_data);

/* Close endpoint e forcibly, on the thread that owns its worker: what it
 * carries ends at once, failed.  ln: the lane whose worker it is (which
 * counts closes not yet ended), NULL for the loop's. */
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
        ucp_worker_signal(ln->worker);
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
        req = ucp_am_recv_data_nbx(ln->worker, c->desc, c->buf, c->len, &rp);
        if (req == NULL || UCS_PTR_IS_ERR(req))
            lane_receive_ended(c->ctx, req == NULL ? UCS_OK : UCS_PTR_STATUS(req),
                               req == NULL ? c->len : 0);
        else
            ln->outstanding++;
        break;
    case LANE_RELEASE:
        ucp_am_data_release(ln->worker, c->desc);
        break;
    case LANE_CONNECT: {
        ucs_status_t st = ep_connect(ln->worker, &c->lep->sa, c->lep->salen, on_lane_ep_error,
                                     c->lep, &c->lep->ep);
        if (st != UCS_OK) {
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

/* Do every command queued for ln so far; how many. */
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
    if (UCS_PTR_IS_PTR(req) && ln != NULL)
        ln->closing++; /* on_closed ends it */
}

/* A lane's thread: an endpoint a peer opened to it failed (the peer died
 * or closed it): its receives end, failed, and it goes. */
static void lane_in_failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    lane_t *ln = arg;

    (void)status;
    for (uint32_t i = 0; i < ln->nin; i++)
        if (ln->in[i] == ep) {
            ln->in[i] = ln->in[--ln->nin];
            ep_close_now(ln, ep);
            return;
        }
}

static int allowed(const kvd_cluster_t *cl, const struct sockaddr_storage *from);

/* A lane's thread: a peer's lane connects.  Where from is checked as on
 * the cluster's own listener (the list is fixed once the daemon runs);
 * what comes on it lands only with a fetch's token. */
static void lane_on_conn(ucp_conn_request_h req, void *arg)
{
    lane_t *ln = arg;
    ucp_conn_request_attr_t a;
    ucp_ep_h e;

    memset(&a, 0, sizeof(a));
    a.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(req, &a) != UCS_OK || !allowed(ln->cl, &a.client_address) ||
        atomic_load(&ln->stop) || ln->nin >= MAX_INBOUND) {
        ucp_listener_reject(ln->listener, req);
        return;
    }
    if (ln->nin == ln->in_cap) {
        uint32_t cap = ln->in_cap ? 2 * ln->in_cap : 8;
        ucp_ep_h *in = realloc(ln->in, cap * sizeof(*in));
        if (in == NULL) {
            ucp_listener_reject(ln->listener, req);
            return;
        }
        ln->in = in;
        ln->in_cap = cap;
    }
    if (ep_accept(ln->worker, req, lane_in_failed, ln, &e) == UCS_OK)
        ln->in[ln->nin++] = e;
}

/* A lane's thread: its commands, then progress, polling while transfers
 * run, else sleeping on its worker's descriptor (a command signals it). */
static void *lane_run(void *arg)
{
    lane_t *ln = arg;

    while (!atomic_load(&ln->stop)) {
        struct pollfd pf;
        unsigned n = lane_run_cmds(ln);
        n += ucp_worker_progress(ln->worker);
        if (n > 0)
            continue;
        if (ln->outstanding > 0) {
            sched_yield(); /* the loop, which feeds it, may want this core */
            continue;
        }
        if (ucp_worker_arm(ln->worker) == UCS_ERR_BUSY)
            continue; /* events came meanwhile, or a command's signal */
        pf.fd = ln->efd;
        pf.events = POLLIN;
        pf.revents = 0;
        (void)poll(&pf, 1, 100);
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

/* A forcible close ended (user_data: its lane, NULL for a link's). */
static void on_closed(void *request, ucs_status_t status, void *user_data)
{
    lane_t *ln = user_data;

    (void)status;
    if (ln != NULL)
        ln->closing--;
    ucp_request_free(request);
}

/* Take l out of the links (messages on its endpoint are ignored from now
 * on) and settle its peer's state. */
static void link_forget(kvd_cluster_t *cl, link_t *l, const char *why)
{
    link_t **pp;

    for (pp = &cl->links; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    if (!l->outbound && cl->ninbound > 0)
        cl->ninbound--;
    if (l->outbound && l->peer != NULL) {
        peer_t *p = l->peer;
        uint32_t idx = (uint32_t)(p - cl->peers);
        p->link = NULL;
        if (p->state == PEER_UP)
            p->failures++;
        if (p->state != PEER_REFUSED)
            peer_set(cl, p, PEER_DOWN, why);
        p->next_try_ns = kvd_now_ns() + (uint64_t)p->backoff_ms * 1000000ull;
        p->backoff_ms = p->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : p->backoff_ms * 2;
        pend_peer_lost(cl, idx, why);
    }
}

/* Close a forgotten link's endpoint, forcibly (its transfers end with
 * errors at once: a flushing close would wait on the other side), and
 * free it. */
static void link_close(link_t *l)
{
    if (!l->closed) {
        l->closed = 1;
        ep_close_now(NULL, l->ep);
    }
    for (uint32_t k = 0; k < l->nlanes; k++) /* the sends on them end, failed */
        lane_cmd_new(l->lane_ep[k]->lane, LANE_CLOSE, l->lane_ep[k], NULL);
    free(l);
}

static void link_drop(kvd_cluster_t *cl, link_t *l, const char *why)
{
    link_forget(cl, l, why);
    link_close(l);
}

static link_t *link_of(kvd_cluster_t *cl, ucp_ep_h ep)
{
    for (link_t *l = cl->links; l; l = l->next)
        if (l->ep == ep && !l->closed)
            return l;
    return NULL;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvd_cluster_t *cl = arg;
    link_t *l = link_of(cl, ep);
    char why[160];

    if (l == NULL)
        return;
    snprintf(why, sizeof(why), "endpoint failed: %s", ucs_status_string(status));
    if (!l->outbound)
        kvd_log(KVD_LOG_INFO, "event=cluster_inbound_closed from=%s node=%s reason=\"%s\"",
                l->from, l->node, why);
    link_drop(cl, l, why);
}

static link_t *link_new(kvd_cluster_t *cl, int outbound)
{
    link_t *l = calloc(1, sizeof(*l));

    if (l == NULL)
        return NULL;
    l->outbound = outbound;
    l->opened_ns = kvd_now_ns();
    l->next = cl->links;
    cl->links = l;
    return l;
}

static void peer_connect(kvd_cluster_t *cl, peer_t *p)
{
    link_t *l = link_new(cl, 1);
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Hello h = KVDOCK__CLUSTER__HELLO__INIT;
    ucs_status_t st;

    if (l == NULL)
        return;
    l->peer = p;
    p->link = l;
    peer_set(cl, p, p->state == PEER_REFUSED ? PEER_REFUSED : PEER_CONNECTING, NULL);
    if ((st = ep_connect(cl->worker, &p->sa, p->salen, on_ep_error, cl, &l->ep)) != UCS_OK) {
        char why[160];
        l->closed = 1;
        snprintf(why, sizeof(why), "cannot connect: %s", ucs_status_string(st));
        link_drop(cl, l, why);
        return;
    }
    fill_random(l->my_nonce, NONCE_BYTES);
    h.version = 1;
    h.node = cl->node;
    h.nonce.data = l->my_nonce;
    h.nonce.len = NONCE_BYTES;
    m.m_case = KVDOCK__CLUSTER__MSG__M_HELLO;
    m.hello = &h;
    if (send_msg(cl, l, &m) != 0)
        link_drop(cl, l, "cannot send hello");
}

static void refuse_link(kvd_cluster_t *cl, link_t *l, const char *why)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Refused rf = KVDOCK__CLUSTER__REFUSED__INIT;
    uint64_t held = 0;

    cl->n.refused++;
    if (kvd_ratelimit_take(&cl->refuse_log, kvd_now_ns(), &held))
        kvd_log(KVD_LOG_WARN, "event=cluster_refused %s=%s node=\"%s\" reason=\"%s\" "
                "suppressed=%" PRIu64, l->outbound ? "peer" : "from",
                l->outbound && l->peer ? l->peer->addr : l->from, l->node, why, held);
    rf.reason = (char *)why;
    m.m_case = KVDOCK__CLUSTER__MSG__M_REFUSED;
    m.refused = &rf;
    (void)send_msg(cl, l, &m); /* best effort */
    if (l->outbound && l->peer != NULL)
        peer_set(cl, l->peer, PEER_REFUSED, why);
    /* closed a moment later, so the reason can reach the peer first;
     * meanwhile nothing it sends is read */
    link_forget(cl, l, why);
    l->refused_ns = kvd_now_ns();
    l->next = cl->refusing;
    cl->refusing = l;
    if (++cl->nrefusing > REFUSING_MAX) { /* a flood of refusals holds no more endpoints */
        link_t **pp = &cl->refusing;
        while ((*pp)->next != NULL)
            pp = &(*pp)->next;
        link_close(*pp);
        *pp = NULL;
        cl->nrefusing--;
    }
}

/* The next comma-separated item of *s, blanks around it trimmed, into item
 * (len bytes): KVD_OK (an empty one too), KVD_ENOENT at the end, KVD_ELIMIT
 * when it does not fit. */
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

static void on_conn(ucp_conn_request_h req, void *arg)
{
    kvd_cluster_t *cl = arg;
    ucp_conn_request_attr_t a;
    link_t *l;
    char from[64] = "?";

    memset(&a, 0, sizeof(a));
    a.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(req, &a) != UCS_OK)
        a.client_address.ss_family = AF_UNSPEC;
    else {
        char host[INET6_ADDRSTRLEN] = "?";
        const struct sockaddr_storage *s = &a.client_address;
        if (s->ss_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)s)->sin_addr, host, sizeof(host));
        else if (s->ss_family == AF_INET6)
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)s)->sin6_addr, host,
                      sizeof(host));
        snprintf(from, sizeof(from), "%s", host);
    }
    if (!allowed(cl, &a.client_address)) {
        /* refused before its endpoint exists: UCX assembles a message of
         * many fragments before any handler sees it, so a stranger let in
         * could make the daemon hold whatever it sends */
        uint64_t held = 0;
        ucp_listener_reject(cl->listener, req);
        cl->n.refused++;
        if (kvd_ratelimit_take(&cl->refuse_log, kvd_now_ns(), &held))
            kvd_log(KVD_LOG_WARN, "event=cluster_refused from=%s reason=\"not in "
                    "cluster-allow-from\" suppressed=%" PRIu64, from, held);
        return;
    }
    if (!cl->closing && cl->ninbound >= MAX_INBOUND) {
        /* full: the oldest endpoint that has not proved the secret makes
         * room, so strangers that open endpoints and say nothing cannot
         * keep a peer out until their deadline */
        link_t *oldest = NULL;
        for (link_t *o = cl->links; o; o = o->next)
            if (!o->outbound && !o->authed && (oldest == NULL || o->opened_ns < oldest->opened_ns))
                oldest = o;
        if (oldest != NULL)
            refuse_link(cl, oldest, "too many inbound endpoints: the oldest without proof goes");
    }
    if (cl->closing || cl->ninbound >= MAX_INBOUND || (l = link_new(cl, 0)) == NULL) {
        ucp_listener_reject(cl->listener, req);
        cl->n.refused++;
        kvd_log(KVD_LOG_WARN, "event=cluster_refused from=%s reason=\"%s\"", from,
                cl->closing ? "shutting down" : "too many inbound endpoints");
        return;
    }
    cl->ninbound++;
    snprintf(l->from, sizeof(l->from), "%s", from);
    if (ep_accept(cl->worker, req, on_ep_error, cl, &l->ep) != UCS_OK) {
        l->closed = 1;
        link_drop(cl, l, "cannot accept");
    }
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

/* ---- requests set aside -------------------------------------------------------- */

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
    free(p->frame);
    free(p->parent);
    free(p->held);
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
    free(p->copied);
    free(p->only);
    free(p);
}

/* Once finished, p goes when nothing refers to it any more: its
 * connection's run, UCX's receives, the early runs. */
static void pend_maybe_free(kvd_cluster_t *cl, pend_t *p)
{
    if (p->phase == 2 && p->conn == NULL && p->inflight == 0 && p->early_inflight == 0)
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
 * run the request again, and free p once UCX holds none of its blocks. */
static void pend_finish(kvd_cluster_t *cl, pend_t *p)
{
    kvd_cluster_answer_t a;
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
    memset(&a, 0, sizeof(a));
    a.first = p->first;
    a.n = p->n;
    a.present = p->present;
    a.why = p->why;
    a.copied = p->copied;
    a.early_status = p->early_status;
    if (!p->conn->closing)
        kvd__dispatch_replay(p->conn, p->frame, p->frame_len, p->t_start_ns, &a);
    for (uint32_t i = p->nheld; i-- > 0;) /* the load holds them itself now */
        kvd_cache_unhold(c, p->held[i]);
    p->nheld = 0;
    kvd__conn_op_end(p->conn);
    p->conn = NULL;
    for (pend_t *f = cl->pends, *next; f; f = next) { /* loads that waited for this pull */
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

static int pend_all_done(const pend_t *p)
{
    if (p->leader != NULL || p->early_inflight > 0)
        return 0;
    for (uint32_t i = 0; i < MAX_PEERS; i++) {
        if (p->phase == 0 && p->asked[i] && !p->answered[i])
            return 0;
        if (p->phase == 1 && p->fetching[i] && (!p->done[i] || p->recvd[i] < p->expect[i]))
            return 0;
    }
    return 1;
}

static void pend_start_pull(kvd_cluster_t *cl, pend_t *p);

static void pend_early(kvd_cluster_t *cl, pend_t *p);

static void early_done(void *arg, kvd_status_t st)
{
    pend_t *p = arg;

    p->early_inflight--;
    if (st != KVD_OK && p->early_status == KVD_OK)
        p->early_status = st;
    if (p->phase == 2)
        pend_maybe_free(p->cl, p);
    else
        pend_check(p->cl, p);
}

/* Blocks have landed while the pull goes on: commit them and copy them
 * into the worker's pool now (an early run of the load), so that the
 * copy overlaps the rest of the pull instead of following it. */
static void pend_early(kvd_cluster_t *cl, pend_t *p)
{
    kvd_cache_store_t *c = &p->cache->store;
    kvd_cluster_answer_t a;
    uint32_t count = 0;

    if (p->conn->closing || p->cache->dropped)
        return;
    memset(p->only, 0, (p->n + 7) / 8);
    for (uint32_t j = p->nask; j-- > 0;) { /* the last first, as saves commit */
        if (p->got[j] != GOT_IN || p->ids[j] == KVD_CBLOCK_NONE)
            continue;
        if (kvd_cache_commit(c, p->ids[j])) {
            set_bit(p->only, p->pos[j]);
            set_bit(p->copied, p->pos[j]);
            count++;
        }
        p->ids[j] = KVD_CBLOCK_NONE; /* the tier's now */
    }
    p->fresh = 0;
    if (count == 0)
        return;
    memset(&a, 0, sizeof(a));
    a.first = p->first;
    a.n = p->n;
    a.present = p->present;
    a.why = p->why;
    a.early = 1;
    a.only = p->only;
    a.done = early_done;
    a.done_arg = p;
    p->early_inflight++;
    kvd__dispatch_replay(p->conn, p->frame, p->frame_len, p->t_start_ns, &a);
    (void)cl;
}

static void pend_check(kvd_cluster_t *cl, pend_t *p)
{
    if (p->phase == 1 && p->copied != NULL && p->early_inflight < EARLY_RUNS &&
        p->fresh >= (p->nask / 8 > EARLY_MIN ? p->nask / 8 : EARLY_MIN) &&
        !pend_all_done(p))
        pend_early(cl, p);
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
    p->copied = calloc((p->n + 7) / 8, 1); /* no early runs without them: fine */
    p->only = malloc((p->n + 7) / 8);
    if (p->copied == NULL || p->only == NULL) {
        free(p->copied);
        free(p->only);
        p->copied = p->only = NULL;
    }
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

kvd_status_t kvd_cluster_defer(kvd_req_t *r, kvd_cache_t *k, const uint8_t *const *keys,
                               const size_t *lens, uint32_t first, uint32_t n, int pull)
{
    kvd_cluster_t *cl = r->srv->cluster;
    pend_t *p = calloc(1, sizeof(*p));
    uint32_t asked = 0, nask = 0;

    if (p == NULL)
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    p->cl = cl;
    p->id = cl->next_id++;
    p->pull = pull;
    p->first = first;
    p->n = n;
    p->cache = k;
    k->refs++;
    p->pos = malloc((n - first) * sizeof(*p->pos));
    p->keys = malloc((size_t)(n - first) * KVD_CACHE_KEY_MAX);
    p->klen = malloc(n - first);
    p->present = calloc((n - first + 7) / 8 + 1, 1);
    p->parent = malloc((n - first) * sizeof(*p->parent));
    p->held = malloc((n - first) * sizeof(*p->held));
    p->frame_len = kvdock__request__get_packed_size(r->req);
    p->frame = malloc(p->frame_len ? p->frame_len : 1);
    if (p->pos == NULL || p->keys == NULL || p->klen == NULL || p->present == NULL ||
        p->parent == NULL || p->held == NULL || p->frame == NULL) {
        pend_free(cl, p);
        return kvd__req_fail(r, KVD_ENOMEM, "out of memory");
    }
    kvdock__request__pack(r->req, p->frame);
    for (uint32_t i = first, here = KVD_CBLOCK_NONE; i < n; i++) {
        /* a pull asks only for the keys the tier lacks (neither ready nor
         * filling); those it has are held, so that the blocks the pull
         * reserves do not evict them before the load runs */
        uint32_t id = pull ? kvd_cache_find(&k->store, keys[i], lens[i]) : KVD_CBLOCK_NONE;
        if (id != KVD_CBLOCK_NONE) {
            here = KVD_CBLOCK_NONE;
            if (kvd_cache_block(&k->store, id)->state == KVD_CBLOCK_READY) {
                kvd_cache_hold(&k->store, id);
                p->held[p->nheld++] = here = id;
            } else if (p->leader == NULL) { /* filling: if a pull brings it, wait for that */
                p->leader = puller_of(cl, p, id);
            }
            continue;
        }
        p->parent[nask] = here;
        here = KVD_CBLOCK_NONE;
        p->pos[nask] = i;
        memcpy(p->keys + (size_t)nask * KVD_CACHE_KEY_MAX, keys[i], lens[i]);
        p->klen[nask] = (uint8_t)lens[i];
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
    r->deferred = 1;
    r->set_aside = 1;
    p->conn = r->conn;
    p->t_start_ns = r->t_start_ns;
    kvd__conn_op_begin(r->conn);
    if (asked == 0 && nask > 0 && p->why[0] == '\0')
        snprintf(p->why, sizeof(p->why), "no peer is up");
    if (asked == 0 && p->leader == NULL) /* nobody to ask or wait for: run again now */
        pend_finish(cl, p);
    else if (asked == 0)
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

/* Tell the peer behind outbound link l where to send the blocks we fetch. */
static int send_lanes(kvd_cluster_t *cl, link_t *l)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Lanes ln = KVDOCK__CLUSTER__LANES__INIT;
    ProtobufCBinaryData addr[MAX_LANES];

    for (uint32_t k = 0; k < cl->nlanes; k++) {
        addr[k].data = (uint8_t *)cl->lanes[k].where;
        addr[k].len = strlen(cl->lanes[k].where);
    }
    ln.n_address = cl->nlanes;
    ln.address = addr;
    m.m_case = KVDOCK__CLUSTER__MSG__M_LANES;
    m.lanes = &ln;
    return send_msg(cl, l, &m);
}

/* A proven peer's lanes (once, on its endpoint to us): connect to each
 * from one of ours, lane k from our lane k % ours. */
static void take_lanes(kvd_cluster_t *cl, link_t *l, const Kvdock__Cluster__Lanes *ln)
{
    if (l->nlanes > 0 || ln->n_address == 0 || ln->n_address > MAX_LANES) {
        refuse_link(cl, l, "bad lanes");
        return;
    }
    for (size_t k = 0; k < ln->n_address; k++)
        if (ln->address[k].len == 0 || ln->address[k].len > MAX_LANE_ADDRESS) {
            refuse_link(cl, l, "bad lanes");
            return;
        }
    for (uint32_t k = 0; k < ln->n_address; k++) {
        lane_ep_t *lep = calloc(1, sizeof(*lep));
        char text[2 * MAX_LANE_ADDRESS + 2], said[MAX_LANE_ADDRESS + 1], why[320];
        memcpy(said, ln->address[k].data, ln->address[k].len);
        said[ln->address[k].len] = '\0';
        if (strncmp(said, "0.0.0.0:", 8) == 0) /* it listens everywhere: where it came from */
            snprintf(text, sizeof(text), "%s:%s", l->from, said + 8);
        else
            snprintf(text, sizeof(text), "%s", said);
        if (lep == NULL || resolve(text, &lep->sa, &lep->salen, why, sizeof(why)) != KVD_OK ||
            usable_family(&lep->sa, text, why, sizeof(why)) != KVD_OK) {
            free(lep);
            refuse_link(cl, l, "bad lanes"); /* closes those made so far */
            return;
        }
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
            h->version != 1) {
            refuse_link(cl, l, h->version != 1 ? "protocol version" : "bad hello");
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
                if (kvd_cluster_bit(p->bits[i], j))
                    set_bit(p->present, p->pos[j] - p->first);
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

typedef struct ctrl_rx {
    kvd_cluster_t *cl;
    ucp_ep_h ep;
    uint8_t *buf;
    size_t len;
} ctrl_rx_t;

static void ctrl_parse(kvd_cluster_t *cl, ucp_ep_h ep, const uint8_t *data, size_t len)
{
    link_t *l = link_of(cl, ep);
    Kvdock__Cluster__Msg *m;

    if (l == NULL)
        return;
    m = kvdock__cluster__msg__unpack(NULL, len, data);
    if (m == NULL) {
        refuse_link(cl, l, "a message that does not decode");
        return;
    }
    handle_msg(cl, l, m);
    kvdock__cluster__msg__free_unpacked(m, NULL);
}

static void on_ctrl_data(void *request, ucs_status_t status, size_t length, void *user_data)
{
    ctrl_rx_t *rx = user_data;

    if (status == UCS_OK && !rx->cl->closing)
        ctrl_parse(rx->cl, rx->ep, rx->buf, length);
    free(rx->buf);
    free(rx);
    if (request != NULL)
        ucp_request_free(request);
}

static ucs_status_t on_ctrl(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param)
{
    kvd_cluster_t *cl = arg;
    ucp_ep_h ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
    link_t *l = ep ? link_of(cl, ep) : NULL;

    (void)header;
    (void)header_length;
    if (l == NULL || cl->closing)
        return UCS_OK;
    kvd__server_activity(cl->srv); /* the next message likely follows soon */
    if (!l->authed && length > PREAUTH_BYTES) {
        /* before the proof nothing is buffered for a stranger */
        refuse_link(cl, l, "a message over 4 KiB before the proof of the secret");
        return UCS_OK;
    }
    if (length > MAX_CTRL_BYTES) {
        refuse_link(cl, l, "a message over 8 MiB");
        return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        ctrl_rx_t *rx = calloc(1, sizeof(*rx));
        ucp_request_param_t rp;
        void *req;
        if (rx == NULL || (rx->buf = malloc(length ? length : 1)) == NULL) {
            free(rx);
            return UCS_OK;
        }
        rx->cl = cl;
        rx->ep = ep;
        rx->len = length;
        memset(&rp, 0, sizeof(rp));
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        rp.cb.recv_am = on_ctrl_data;
        rp.user_data = rx;
        req = ucp_am_recv_data_nbx(cl->worker, data, rx->buf, length, &rp);
        if (req == NULL) {
            on_ctrl_data(NULL, UCS_OK, length, rx);
        } else if (UCS_PTR_IS_ERR(req)) {
            free(rx->buf);
            free(rx);
        }
        return UCS_OK;
    }
    ctrl_parse(cl, ep, data, length);
    return UCS_OK;
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
    uint8_t bytes[];
} arrival_t;

/* On the loop: a block for a fetch of ours lands (or waits for the
 * window); anything else is dropped. */
static void lane_arrived(kvd_cluster_t *cl, lane_ev_t *ev)
{
    arrival_t *a = (arrival_t *)ev;
    pend_t *p = cl->closing ? NULL : pend_find(cl, a->hdr[0]);
    uint32_t i = MAX_PEERS, j;

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

    if (header_length != sizeof(a->hdr) || (!rndv && length > MAX_CTRL_BYTES))
        return UCS_OK;
    a = malloc(sizeof(*a) + (rndv ? 0 : length));
    if (a == NULL)
        return UCS_OK;
    a->ev.fn = lane_arrived;
    a->lane = ln;
    memcpy(a->hdr, header, sizeof(a->hdr));
    a->length = length;
    a->rndv = rndv;
    a->data = data;
    if (!rndv)
        memcpy(a->bytes, data, length);
    ev_post(ln->cl, &a->ev);
    return rndv ? UCS_INPROGRESS : UCS_OK;
}

/* Blocks come over lanes only: on a link's own endpoint one is dropped,
 * and one before the proof closes it. */
static ucs_status_t on_block(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    kvd_cluster_t *cl = arg;
    ucp_ep_h ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
    link_t *l = ep ? link_of(cl, ep) : NULL;

    (void)header;
    (void)header_length;
    (void)data;
    (void)length;
    if (l != NULL && !cl->closing && !l->authed)
        refuse_link(cl, l, "a block before the proof of the secret");
    return UCS_OK;
}

/* ---- the loop's side ---------------------------------------------------------- */

static void progress(kvd_cluster_t *cl)
{
    while (ucp_worker_progress(cl->worker) != 0) {
    }
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    progress(h->data);
}

/* Control messages are on their way (sends UCX holds, queries just
 * sent): polling beats waking up through the event descriptor for their
 * answers.  Blocks need none of it: lanes' threads poll for them. */
static int busy(const kvd_cluster_t *cl, uint64_t now)
{
    if (cl->sending > 0)
        return 1;
    for (const pend_t *p = cl->pends; p; p = p->next)
        if (p->phase == 0 && since(now, p->started_ns) < SPIN_QUERY_NS)
            return 1;
    return 0;
}

static void on_spin(uv_idle_t *h)
{
    (void)h; /* progress happens in on_prepare, on every turn of the loop */
}

/* Before the loop polls: progress; then keep polling while busy, or arm
 * the worker so that its descriptor wakes the loop. */
static void on_prepare(uv_prepare_t *h)
{
    kvd_cluster_t *cl = h->data;

    progress(cl);
    if (!cl->closing && busy(cl, kvd_now_ns())) {
        if (!uv_is_active((uv_handle_t *)&cl->spin))
            uv_idle_start(&cl->spin, on_spin);
        return;
    }
    if (uv_is_active((uv_handle_t *)&cl->spin))
        uv_idle_stop(&cl->spin);
    for (int i = 0; i < 64; i++) {
        if (ucp_worker_arm(cl->worker) != UCS_ERR_BUSY)
            return;
        progress(cl);
    }
}

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
        if (pe->state == PEER_CONNECTING && since(now, pe->link->opened_ns) > cl->deadline_ns) {
            link_drop(cl, pe->link, "no proof within the deadline");
            continue;
        }
        if (pe->state != PEER_UP)
            continue;
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
    for (link_t **pp = &cl->refusing; *pp;) {
        l = *pp;
        if (since(now, l->refused_ns) < REFUSE_GRACE_NS) {
            pp = &l->next;
            continue;
        }
        *pp = l->next;
        link_close(l);
        cl->nrefusing--;
    }
    /* inbound endpoints that never proved the secret */
    for (l = cl->links; l; l = lnext) {
        lnext = l->next;
        if (!l->outbound && !l->authed && since(now, l->opened_ns) > cl->deadline_ns)
            refuse_link(cl, l, "no proof of the secret within the deadline");
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

/* Whether UCX has a component of this name here (rdmacm only where the
 * machine has RDMA's connection manager). */
static int ucx_has_component(const char *name)
{
    uct_component_h *comps;
    unsigned n;
    int found = 0;

    if (uct_query_components(&comps, &n) != UCS_OK)
        return 0;
    for (unsigned i = 0; i < n && !found; i++) {
        uct_component_attr_t a;
        memset(&a, 0, sizeof(a));
        a.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
        found = uct_component_query(comps[i], &a) == UCS_OK && strcmp(a.name, name) == 0;
    }
    uct_release_component_list(comps);
    return found;
}

void kvd_cluster_environment(void)
{
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0); /* 0: the operator's own value stays */
    /* only where something reads it: UCX warns of UCX_* variables unread */
    if (ucx_has_component("rdmacm"))
        setenv("UCX_RDMA_CM_REUSEADDR", "y", 0);
}

/* Stop the lanes' threads (their workers stay, for the loop to finish). */
static void lanes_stop(kvd_cluster_t *cl)
{
    for (uint32_t k = 0; k < cl->nlanes; k++) {
        lane_t *ln = &cl->lanes[k];
        if (!ln->running)
            continue;
        atomic_store(&ln->stop, 1);
        ucp_worker_signal(ln->worker);
        pthread_join(ln->thread, NULL);
        ln->running = 0;
    }
}

/* With its thread stopped: no more peers' lanes into lane ln. */
static void lane_shut(lane_t *ln)
{
    if (ln->listener != NULL)
        ucp_listener_destroy(ln->listener);
    ln->listener = NULL;
    while (ln->nin > 0)
        ep_close_now(ln, ln->in[--ln->nin]);
}

/* With the threads stopped: do the lanes' last commands and progress
 * their workers from here until nothing moves, running what that hands
 * the loop. */
static void lanes_settle(kvd_cluster_t *cl)
{
    for (uint32_t k = 0; k < cl->nlanes; k++)
        lane_shut(&cl->lanes[k]);
    /* until every transfer and close has ended and handed back what it
     * held (the caches it names go right after), or 2 s have passed */
    for (uint64_t end = kvd_now_ns() + 2000000000ull; kvd_now_ns() < end;) {
        unsigned n = 0, held = 0;
        for (uint32_t k = 0; k < cl->nlanes; k++) {
            lane_t *ln = &cl->lanes[k];
            n += lane_run_cmds(ln);
            n += ucp_worker_progress(ln->worker);
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
        lane_shut(ln);
        free(ln->in);
        if (ln->worker != NULL)
            ucp_worker_destroy(ln->worker);
        pthread_mutex_destroy(&ln->cmds.lock);
        memset(ln, 0, sizeof(*ln));
    }
    cl->nlanes = 0;
    while (cl->lane_eps != NULL) {
        lane_ep_t *lep = cl->lane_eps;
        cl->lane_eps = lep->all;
        free(lep);
    }
}

static ucs_status_t worker_handle(ucp_worker_h w, unsigned id, ucp_am_recv_callback_t cb,
                                  void *arg)
{
    ucp_am_handler_param_t hp;

    memset(&hp, 0, sizeof(hp));
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.cb = cb;
    hp.arg = arg;
    return ucp_worker_set_am_recv_handler(w, &hp);
}

/* A worker for one thread, its event descriptor, and a handler of active
 * message id. */
static ucs_status_t worker_make(kvd_cluster_t *cl, ucp_worker_h *w, int *efd, unsigned id,
                                ucp_am_recv_callback_t cb, void *arg)
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
    if ((us = ucp_worker_get_efd(*w, efd)) != UCS_OK)
        return us;
    return worker_handle(*w, id, cb, arg);
}

/* Lane ln listens where the cluster does, on a port of its own. */
static ucs_status_t lane_listen(kvd_cluster_t *cl, lane_t *ln)
{
    ucp_listener_params_t lp;
    ucp_listener_attr_t la;
    struct sockaddr_storage sa = cl->listen_sa; /* IPv4: usable_family saw to it */
    const struct sockaddr_in *in = (const struct sockaddr_in *)&la.sockaddr;
    char host[INET_ADDRSTRLEN] = "?";
    ucs_status_t us;

    ((struct sockaddr_in *)&sa)->sin_port = 0;
    memset(&lp, 0, sizeof(lp));
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = (const struct sockaddr *)&sa;
    lp.sockaddr.addrlen = cl->listen_salen;
    lp.conn_handler.cb = lane_on_conn;
    lp.conn_handler.arg = ln;
    if ((us = ucp_listener_create(ln->worker, &lp, &ln->listener)) != UCS_OK) {
        ln->listener = NULL;
        return us;
    }
    memset(&la, 0, sizeof(la));
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if ((us = ucp_listener_query(ln->listener, &la)) != UCS_OK)
        return us;
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    snprintf(ln->where, sizeof(ln->where), "%s:%u", host, ntohs(in->sin_port));
    return UCS_OK;
}

/* n lane workers (each its thread's alone), their listeners, their
 * threads. */
static kvd_status_t lanes_start(kvd_cluster_t *cl, uint32_t n, char *why, size_t why_len)
{
    ucs_status_t us = UCS_OK;

    for (cl->nlanes = 0; cl->nlanes < n; cl->nlanes++) {
        lane_t *ln = &cl->lanes[cl->nlanes];
        ln->cl = cl;
        pthread_mutex_init(&ln->cmds.lock, NULL);
        if ((us = worker_make(cl, &ln->worker, &ln->efd, AM_BLOCK, lane_on_block, ln)) !=
                UCS_OK ||
            (us = lane_listen(cl, ln)) != UCS_OK) {
            cl->nlanes++; /* freed below */
            break;
        }
        if (pthread_create(&ln->thread, NULL, lane_run, ln) != 0) {
            cl->nlanes++;
            snprintf(why, why_len, "cannot start a lane's thread");
            lanes_free(cl);
            return KVD_ENOMEM;
        }
        ln->running = 1;
    }
    if (us != UCS_OK) {
        snprintf(why, why_len, "UCX lane worker: %s", ucs_status_string(us));
        lanes_free(cl);
        return KVD_EIO;
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

kvd_status_t kvd_cluster_create(kvd_server_t *srv, kvd_cluster_t **out, char *why,
                                size_t why_len)
{
    const kvd_options_t *o = &srv->opts;
    kvd_cluster_t *cl = calloc(1, sizeof(*cl));
    ucp_params_t up;
    ucp_config_t *cfg = NULL;
    ucp_listener_params_t lp;
    ucs_status_t us;
    kvd_status_t st;

    if (cl == NULL)
        return KVD_ENOMEM;
    cl->srv = srv;
    cl->next_id = 1;
    cl->efd = -1;
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
    memset(&up, 0, sizeof(up));
    up.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    up.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    up.mt_workers_shared = 1; /* the lanes' workers run on threads of their own */
    if ((us = ucp_config_read(NULL, NULL, &cfg)) != UCS_OK ||
        (us = ucp_init(&up, cfg, &cl->ctx)) != UCS_OK) {
        if (cfg)
            ucp_config_release(cfg);
        snprintf(why, why_len, "UCX: %s", ucs_status_string(us));
        free(cl);
        return KVD_EIO;
    }
    ucp_config_release(cfg);
    if ((us = worker_make(cl, &cl->worker, &cl->efd, AM_CTRL, on_ctrl, cl)) != UCS_OK ||
        (us = worker_handle(cl->worker, AM_BLOCK, on_block, cl)) != UCS_OK)
        goto fail_ucx;
    memset(&lp, 0, sizeof(lp));
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = (const struct sockaddr *)&cl->listen_sa;
    lp.sockaddr.addrlen = cl->listen_salen;
    lp.conn_handler.cb = on_conn;
    lp.conn_handler.arg = cl;
    pthread_mutex_init(&cl->events.lock, NULL);
    if ((st = lanes_start(cl, lanes_wanted(o), why, why_len)) != KVD_OK) {
        ucp_worker_destroy(cl->worker);
        ucp_cleanup(cl->ctx);
        pthread_mutex_destroy(&cl->events.lock);
        free(cl);
        return st;
    }
    if ((us = ucp_listener_create(cl->worker, &lp, &cl->listener)) != UCS_OK) {
        snprintf(why, why_len, "cluster-listen %s: UCX cannot listen there: %s", cl->node,
                 ucs_status_string(us));
        lanes_free(cl);
        ev_drain(cl); /* what a stranger's early connection may have queued */
        ucp_worker_destroy(cl->worker);
        ucp_cleanup(cl->ctx);
        pthread_mutex_destroy(&cl->events.lock);
        free(cl);
        return KVD_EIO;
    }
    uv_async_init(srv->loop, &cl->ev_async, on_events);
    cl->ev_async.data = cl;
    atomic_store(&cl->ev_open, 1);
    uv_async_send(&cl->ev_async); /* anything queued before it opened */
    uv_poll_init(srv->loop, &cl->poll, cl->efd);
    uv_prepare_init(srv->loop, &cl->prepare);
    uv_idle_init(srv->loop, &cl->spin);
    uv_timer_init(srv->loop, &cl->tick);
    cl->poll.data = cl->prepare.data = cl->spin.data = cl->tick.data = cl;
    uv_poll_start(&cl->poll, UV_READABLE, on_poll);
    uv_prepare_start(&cl->prepare, on_prepare);
    {
        uint64_t ms = o->cluster_deadline_ms / 4;
        ms = ms < 5 ? 5 : ms > 100 ? 100 : ms;
        uv_timer_start(&cl->tick, on_tick, 0, ms);
    }
    kvd_log(KVD_LOG_INFO, "event=cluster_listen node=%s peers=%u lanes=%u deadline_ms=%" PRIu64,
            cl->node, cl->npeers, cl->nlanes, o->cluster_deadline_ms);
    *out = cl;
    return KVD_OK;

fail_ucx:
    snprintf(why, why_len, "UCX worker: %s", ucs_status_string(us));
    if (cl->worker)
        ucp_worker_destroy(cl->worker);
    ucp_cleanup(cl->ctx);
    free(cl);
    return KVD_EIO;
}

void kvd_cluster_close(kvd_cluster_t *cl)
{
    if (cl == NULL || cl->closing)
        return;
    cl->closing = 1;
    while (cl->pends) { /* run again with what came; freed once UCX lets go */
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
    while (cl->refusing) {
        link_t *l = cl->refusing;
        cl->refusing = l->next;
        link_close(l);
    }
    cl->nrefusing = 0;
    progress(cl);
    /* the lanes' threads go; what their workers still hold ends here */
    lanes_stop(cl);
    lanes_settle(cl);
    atomic_store(&cl->ev_open, 0); /* no thread left to post: lanes_stop joined them */
    uv_close((uv_handle_t *)&cl->ev_async, NULL);
    if (cl->listener) {
        ucp_listener_destroy(cl->listener);
        cl->listener = NULL;
    }
    uv_poll_stop(&cl->poll);
    uv_close((uv_handle_t *)&cl->poll, NULL);
    uv_close((uv_handle_t *)&cl->prepare, NULL);
    uv_close((uv_handle_t *)&cl->spin, NULL);
    uv_close((uv_handle_t *)&cl->tick, NULL);
}

void kvd_cluster_destroy(kvd_cluster_t **clp)
{
    kvd_cluster_t *cl = clp ? *clp : NULL;

    if (cl == NULL)
        return;
    if (!cl->closing)
        kvd_cluster_close(cl);
    progress(cl);
    lanes_settle(cl);
    lanes_free(cl);
    ev_drain(cl);
    ucp_worker_destroy(cl->worker);
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
    t->inbound = 0;
    for (const link_t *l = cl->links; l; l = l->next)
        t->inbound += !l->outbound && l->authed;
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
