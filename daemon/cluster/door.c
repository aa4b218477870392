/* The cluster's front door: see link.h, and docs/design/cluster.md.
 *
 * --cluster-listen is a plain TCP listener of the daemon's own loop, and
 * nothing but this file reads what comes on it: no UCX listener faces the
 * network (UCX's connection managers parse a stranger's first bytes and
 * can be made to abort).  A connection from outside --cluster-allow-from
 * is closed at accept; so is one past MAX_STARTUPS connections that have
 * not proved the secret, or past MAX_STARTUPS_PER_SOURCE of them from one
 * address.  Before the proof a connection may send PREAUTH_BYTES in all,
 * in frames (frames.h) of at most PREAUTH_FRAME, and must complete the
 * proof (Hello, Challenge, Auth, Welcome: BLAKE2s keyed with the secret
 * over both sides' fresh nonces) within the deadline; anything else
 * closes it, logged (rate-limited) and counted (status: refused).
 *
 * Control stays on that connection.  Queries, fetches, their answers and
 * pings are framed protobuf on the proven TCP connection, read by the
 * same bounded parser (KVD_LINK_MAX_CTRL a message): they are small, and
 * a second channel for them would be a second thing to prove and to
 * close.  UCX carries only block bytes.
 *
 * Right after Welcome the fetching daemon sends its lanes' rx worker
 * addresses (Lanes) on its outbound link; the answering daemon checks
 * each (kvd__cw_ucx_address_ok: UCX unpacks an address without bounds) and
 * makes one endpoint from it on its own tx worker of that lane
 * (ucp_ep_create from the remote address, UCP_ERR_HANDLING_MODE_PEER),
 * and sends block i of a fetch to lane i % n.  So between two workers
 * endpoints are made from one side only, one per link and lane: with UCX
 * 1.13 two workers that connected to each other both ways tripped an
 * assertion in the wireup ("got REP message") when one side died
 * mid-pull.  The endpoints of one link's lanes are wired up as they are
 * made, and no block goes on any of them before all are (lane.h): the
 * same assertion aborted a fetcher whose reply to a lane's wireup was
 * still queued when the sender died.  Endpoints close with UCP_EP_CLOSE_MODE_FORCE when their link
 * goes.  UCX's TCP transport still listens on a port of each worker (the
 * README says what to firewall); a block lands only if it carries the
 * random token of a fetch this daemon made (pull.c).
 */
#include "door.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frames.h"
#include "server.h"

#define PROTOCOL_VERSION 2       /* 2: framed on TCP, lanes by worker address */
#define MAX_INBOUND 256          /* connections from peers held at once */
#define MAX_STARTUPS 64          /* connections without proof, in all ... */
#define MAX_STARTUPS_PER_SOURCE 8 /* ... and from one address */
#define PREAUTH_FRAME 512u        /* Hello, Challenge and Auth are under 100 bytes */
#define PREAUTH_BYTES 1024u       /* all a connection may send before its proof */
#define PING_NS 1000000000ull
#define BACKOFF_MIN_MS 100u

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* Count a refusal and log it: always for a side that proved the secret
 * (rare, and worth each line), at most a line a second for strangers. */
static void refused(kvd__links_t *ls, int trusted, const char *side, const char *who,
                    const char *node, const char *why)
{
    uint64_t held = 0;

    ls->refused++;
    if (trusted || kvd__ratelimit_take(&ls->refuse_log, kvd__now_ns(), &held))
        kvd_log(KVD_LOG_WARN, "event=cluster_refused %s=%s node=\"%s\" reason=\"%s\" "
                "suppressed=%" PRIu64, side, who, node, why, held);
}

/* Close l for why, logged and counted, telling the other side why (best
 * effort: only what the socket takes at once). */
void kvd__door_refuse(kvd__link_t *l, const char *why)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Refused rf = KVDOCK__CLUSTER__REFUSED__INIT;
    uint8_t frame[KVD_CW_HEADER + 256];
    size_t len;

    refused(l->ls, l->authed, l->outbound ? "peer" : "from",
            l->outbound && l->peer ? l->peer->addr : l->from, l->node, why);
    rf.reason = (char *)why;
    m.m_case = KVDOCK__CLUSTER__MSG__M_REFUSED;
    m.refused = &rf;
    len = kvdock__cluster__msg__get_packed_size(&m);
    if (!l->closed && len <= sizeof(frame) - KVD_CW_HEADER) {
        uv_buf_t b = uv_buf_init((char *)frame, (unsigned)(KVD_CW_HEADER + len));
        kvd__cw_header(frame, (uint32_t)len);
        kvdock__cluster__msg__pack(&m, frame + KVD_CW_HEADER);
        (void)uv_try_write((uv_stream_t *)&l->tcp, &b, 1);
    }
    if (l->outbound && l->peer != NULL)
        kvd__peer_set(l->peer, KVD_PEER_REFUSED, why);
    kvd__link_drop(l, why);
}

static void on_connected(uv_connect_t *req, int status)
{
    kvd__link_t *l = req->data;
    kvd__links_t *ls = l->ls;
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Hello h = KVDOCK__CLUSTER__HELLO__INIT;
    char why[160];
    int rc;

    if (l->closed)
        return; /* dropped meanwhile (its close cancelled the connect) */
    if (status < 0 || (rc = uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read)) != 0) {
        snprintf(why, sizeof(why), "cannot connect: %s", uv_strerror(status < 0 ? status : rc));
        kvd__link_drop(l, why);
        return;
    }
    (void)uv_tcp_nodelay(&l->tcp, 1);
    kvd__clc_random(l->my_nonce, KVD_CL_NONCE);
    h.version = PROTOCOL_VERSION;
    h.node = (char *)ls->cfg->node;
    h.nonce.data = l->my_nonce;
    h.nonce.len = KVD_CL_NONCE;
    m.m_case = KVDOCK__CLUSTER__MSG__M_HELLO;
    m.hello = &h;
    if (kvd__link_send(l, &m) != 0)
        kvd__link_drop(l, "cannot send hello");
}

static void peer_connect(kvd__links_t *ls, kvd__peer_t *p)
{
    kvd__link_t *l = kvd__link_new(ls, 1);
    char why[160];
    int rc;

    if (l == NULL)
        return;
    l->peer = p;
    p->link = l;
    kvd__peer_set(p, p->state == KVD_PEER_REFUSED ? KVD_PEER_REFUSED : KVD_PEER_CONNECTING, NULL);
    l->connect.data = l;
    if ((rc = uv_tcp_connect(&l->connect, &l->tcp, (const struct sockaddr *)&p->sa,
                             on_connected)) != 0) {
        snprintf(why, sizeof(why), "cannot connect: %s", uv_strerror(rc));
        kvd__link_drop(l, why);
    }
}

/* The front door: a connection comes.  Refused at once, before a byte of
 * it is read, when it comes from outside --cluster-allow-from or when
 * too many have not proved the secret yet (in all, or from its address);
 * else read by on_read, within the limits before the proof. */
static void on_accept(uv_stream_t *server, int status)
{
    kvd__links_t *ls = server->data;
    struct sockaddr_storage sa;
    int salen = sizeof(sa);
    uint32_t startups = 0, same = 0;
    const char *why = NULL;
    kvd__link_t *l;

    if (status < 0)
        return;
    if ((l = kvd__link_new(ls, 0)) == NULL) {
        /* the connection stays queued: taken when memory is back */
        kvd_log(KVD_LOG_ERROR, "event=cluster_accept_failed reason=\"no memory\"");
        return;
    }
    ls->ninbound++;
    if (uv_accept(server, (uv_stream_t *)&l->tcp) != 0) {
        kvd__link_drop(l, "cannot accept");
        return;
    }
    memset(&sa, 0, sizeof(sa));
    if (uv_tcp_getpeername(&l->tcp, (struct sockaddr *)&sa, &salen) != 0)
        sa.ss_family = AF_UNSPEC;
    kvd__clc_addr_text(&sa, l->from, sizeof(l->from));
    l->src_family = kvd__clc_addr_bytes(&sa, l->src);
    for (const kvd__link_t *o = ls->links; o; o = o->next)
        if (o != l && !o->outbound && !o->authed) {
            startups++;
            same += o->src_family == l->src_family && memcmp(o->src, l->src, 16) == 0;
        }
    if (!kvd__clc_allowed(ls->cfg, &sa))
        why = "not in cluster-allow-from";
    else if (ls->closing)
        why = "shutting down";
    else if (startups >= MAX_STARTUPS)
        why = "too many connections without proof of the secret";
    else if (same >= MAX_STARTUPS_PER_SOURCE)
        why = "too many connections without proof of the secret from this address";
    else if (ls->ninbound > MAX_INBOUND)
        why = "too many inbound connections";
    if (why != NULL || uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read) != 0) {
        refused(ls, 0, "from", l->from, "", why ? why : "cannot read");
        kvd__link_drop(l, why ? why : "cannot read");
        return;
    }
    (void)uv_tcp_nodelay(&l->tcp, 1);
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

/* Tell the peer behind outbound link l where to send the blocks we fetch:
 * our lanes' rx workers. */
static int send_lanes(kvd__links_t *ls, kvd__link_t *l)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Lanes ln = KVDOCK__CLUSTER__LANES__INIT;
    ProtobufCBinaryData addr[KVD_LANES_MAX];

    for (uint32_t k = 0; k < ls->lanes->n; k++)
        addr[k].data = (uint8_t *)kvd__lane_address(ls->lanes, k, &addr[k].len);
    ln.n_address = ls->lanes->n;
    ln.address = addr;
    m.m_case = KVDOCK__CLUSTER__MSG__M_LANES;
    m.lanes = &ln;
    return kvd__link_send(l, &m);
}

/* A proven peer's lanes (once, on its connection to us): each address
 * checked before UCX sees it, then an endpoint to each from one of our
 * lanes' tx workers, lane k from our lane k % ours, all in one group (no
 * block goes on any before all are wired up: lane.h). */
static void take_lanes(kvd__links_t *ls, kvd__link_t *l, const Kvdock__Cluster__Lanes *ln)
{
    if (l->nlanes > 0 || ln->n_address == 0 || ln->n_address > KVD_LANES_MAX) {
        kvd__door_refuse(l, "bad lanes");
        return;
    }
    for (size_t k = 0; k < ln->n_address; k++)
        if (!kvd__lanes_address_ok(ls->lanes, ln->address[k].data, ln->address[k].len)) {
            kvd__door_refuse(l, "bad lanes: not a UCX worker address of this cluster's kind");
            return;
        }
    for (uint32_t k = 0; k < ln->n_address; k++) {
        kvd__lane_ep_t *lep = kvd__lane_connect(ls->lanes, k, ln->address[k].data,
                                                ln->address[k].len,
                                                l->nlanes > 0 ? l->lane_ep[0] : NULL);
        if (lep == NULL) {
            kvd__door_refuse(l, "bad lanes: no memory"); /* closes those made so far */
            return;
        }
        l->lane_ep[l->nlanes++] = lep;
    }
}

static void handle_msg(kvd__links_t *ls, kvd__link_t *l, const Kvdock__Cluster__Msg *m)
{
    uint8_t proof[KVD_BLAKE2S_BYTES];

    switch (m->m_case) {
    case KVDOCK__CLUSTER__MSG__M_HELLO: { /* inbound: prove ourselves, challenge them */
        Kvdock__Cluster__Msg out = KVDOCK__CLUSTER__MSG__INIT;
        Kvdock__Cluster__Challenge ch = KVDOCK__CLUSTER__CHALLENGE__INIT;
        const Kvdock__Cluster__Hello *h = m->hello;
        if (l->outbound || l->authed || l->hello_seen || h->nonce.len != KVD_CL_NONCE ||
            h->version != PROTOCOL_VERSION) {
            kvd__door_refuse(l, h->version != PROTOCOL_VERSION ? "protocol version" : "bad hello");
            return;
        }
        l->hello_seen = 1;
        snprintf(l->node, sizeof(l->node), "%s", h->node ? h->node : "");
        memcpy(l->their_nonce, h->nonce.data, KVD_CL_NONCE);
        kvd__clc_random(l->my_nonce, KVD_CL_NONCE);
        kvd__clc_prove(ls->cfg, "kvdock-cluster-1 B", l->their_nonce, l->my_nonce, proof);
        ch.node = (char *)ls->cfg->node;
        ch.nonce.data = l->my_nonce;
        ch.nonce.len = KVD_CL_NONCE;
        ch.proof.data = proof;
        ch.proof.len = sizeof(proof);
        out.m_case = KVDOCK__CLUSTER__MSG__M_CHALLENGE;
        out.challenge = &ch;
        (void)kvd__link_send(l, &out);
        return;
    }
    case KVDOCK__CLUSTER__MSG__M_CHALLENGE: { /* outbound: check them, prove ourselves */
        Kvdock__Cluster__Msg out = KVDOCK__CLUSTER__MSG__INIT;
        Kvdock__Cluster__Auth au = KVDOCK__CLUSTER__AUTH__INIT;
        const Kvdock__Cluster__Challenge *ch = m->challenge;
        if (!l->outbound || l->authed || ch->nonce.len != KVD_CL_NONCE ||
            ch->proof.len != KVD_BLAKE2S_BYTES) {
            kvd__door_refuse(l, "bad challenge");
            return;
        }
        kvd__clc_prove(ls->cfg, "kvdock-cluster-1 B", l->my_nonce, ch->nonce.data, proof);
        if (!kvd__clc_same(proof, ch->proof.data, sizeof(proof))) {
            kvd__door_refuse(l, "the peer does not know the cluster secret");
            return;
        }
        snprintf(l->node, sizeof(l->node), "%s", ch->node ? ch->node : "");
        memcpy(l->their_nonce, ch->nonce.data, KVD_CL_NONCE);
        kvd__clc_prove(ls->cfg, "kvdock-cluster-1 A", l->their_nonce, l->my_nonce, proof);
        au.proof.data = proof;
        au.proof.len = sizeof(proof);
        out.m_case = KVDOCK__CLUSTER__MSG__M_AUTH;
        out.auth = &au;
        l->authed = 1; /* they proved it; they will say Welcome once we have */
        (void)kvd__link_send(l, &out);
        return;
    }
    case KVDOCK__CLUSTER__MSG__M_AUTH: { /* inbound: their proof */
        Kvdock__Cluster__Msg out = KVDOCK__CLUSTER__MSG__INIT;
        Kvdock__Cluster__Welcome w = KVDOCK__CLUSTER__WELCOME__INIT;
        if (l->outbound || l->authed || !l->hello_seen ||
            m->auth->proof.len != KVD_BLAKE2S_BYTES) {
            kvd__door_refuse(l, "auth out of turn");
            return;
        }
        kvd__clc_prove(ls->cfg, "kvdock-cluster-1 A", l->my_nonce, l->their_nonce, proof);
        if (!kvd__clc_same(proof, m->auth->proof.data, sizeof(proof))) {
            kvd__door_refuse(l, "the peer does not know the cluster secret");
            return;
        }
        l->authed = 1;
        kvd_log(KVD_LOG_INFO, "event=cluster_inbound from=%s node=%s", l->from, l->node);
        out.m_case = KVDOCK__CLUSTER__MSG__M_WELCOME;
        out.welcome = &w;
        (void)kvd__link_send(l, &out);
        return;
    }
    case KVDOCK__CLUSTER__MSG__M_WELCOME:
        if (l->outbound && l->authed && l->peer != NULL) {
            /* before any fetch on this endpoint: where its blocks go */
            if (send_lanes(ls, l) != 0) {
                kvd__link_drop(l, "cannot send our lanes");
                return;
            }
            l->peer->backoff_ms = BACKOFF_MIN_MS;
            kvd__peer_set(l->peer, KVD_PEER_UP, NULL);
            l->peer->ping_sent_ns = 0;
        }
        return;
    case KVDOCK__CLUSTER__MSG__M_REFUSED: {
        char why[160];
        snprintf(why, sizeof(why), "refused by the peer: %s",
                 m->refused->reason ? m->refused->reason : "");
        if (!l->outbound && !l->authed) { /* it never proved the secret either */
            ls->refused++;
            kvd_log(KVD_LOG_WARN, "event=cluster_refused from=%s node=\"%s\" reason=\"no proof "
                    "of the secret (%s)\"", l->from, l->node, why);
            kvd__link_drop(l, why);
            return;
        }
        kvd_log(KVD_LOG_WARN, "event=cluster_refused_by %s=%s reason=\"%s\"",
                l->outbound ? "peer" : "from", l->outbound && l->peer ? l->peer->addr : l->from,
                why);
        if (l->outbound && l->peer != NULL) {
            kvd__peer_set(l->peer, KVD_PEER_REFUSED, why);
        }
        kvd__link_drop(l, why);
        return;
    }
    default:
        break;
    }
    if (!l->authed) { /* nothing else before the proof */
        kvd__door_refuse(l, "a request before the proof of the secret");
        return;
    }
    switch (m->m_case) {
    case KVDOCK__CLUSTER__MSG__M_QUERY:
    case KVDOCK__CLUSTER__MSG__M_FETCH:
        if (!l->outbound)
            ls->up.msg(ls->up.up, l, m);
        return;
    case KVDOCK__CLUSTER__MSG__M_QUERY_REPLY:
    case KVDOCK__CLUSTER__MSG__M_FETCH_DONE:
        if (l->outbound)
            ls->up.msg(ls->up.up, l, m);
        return;
    case KVDOCK__CLUSTER__MSG__M_LANES:
        if (!l->outbound)
            take_lanes(ls, l, m->lanes);
        return;
    case KVDOCK__CLUSTER__MSG__M_PING: {
        Kvdock__Cluster__Msg out = KVDOCK__CLUSTER__MSG__INIT;
        Kvdock__Cluster__Pong po = KVDOCK__CLUSTER__PONG__INIT;
        po.t = m->ping->t;
        out.m_case = KVDOCK__CLUSTER__MSG__M_PONG;
        out.pong = &po;
        (void)kvd__link_send(l, &out);
        return;
    }
    case KVDOCK__CLUSTER__MSG__M_PONG:
        if (l->outbound && l->peer != NULL && m->pong->t == l->peer->ping_t) {
            l->peer->rtt_ns = kvd__now_ns() - l->peer->ping_sent_ns;
            l->peer->ping_sent_ns = 0;
        }
        return;
    default:
        return;
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    kvd__link_t *l = h->data;

    (void)suggested; /* the loop reads one connection at a time, into one buffer */
    buf->base = (char *)l->ls->scratch;
    buf->len = sizeof(l->ls->scratch);
}

/* Keep n more bytes of l's stream; 0, or -1 out of memory.  At most a
 * frame's limit and a read are ever kept: whole frames go as they come. */
static int rx_append(kvd__link_t *l, const uint8_t *data, size_t n)
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
 * all and frames of PREAUTH_FRAME, after it frames of KVD_LINK_MAX_CTRL;
 * each whole frame is decoded and handled as it comes. */
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    kvd__link_t *l = s->data;
    kvd__links_t *ls = l->ls;
    size_t at = 0;
    char why[160];

    if (l->closed || nread == 0)
        return;
    if (nread < 0) {
        snprintf(why, sizeof(why), "connection %s", nread == UV_EOF ? "closed by the other side"
                                                                    : uv_strerror((int)nread));
        if (!l->outbound && !l->authed) {
            refused(ls, 0, "from", l->from, l->node, "left without proof of the secret");
        } else if (!l->outbound) {
            kvd_log(KVD_LOG_INFO, "event=cluster_inbound_closed from=%s node=%s reason=\"%s\"",
                    l->from, l->node, why);
        }
        kvd__link_drop(l, why);
        return;
    }
    kvd__server_activity(ls->srv); /* the next message likely follows soon */
    if (!l->authed && (l->rx_total += (size_t)nread) > PREAUTH_BYTES) {
        kvd__door_refuse(l, "more than 1 KiB before the proof of the secret");
        return;
    }
    if (rx_append(l, (const uint8_t *)buf->base, (size_t)nread) != 0) {
        kvd__link_drop(l, "out of memory");
        return;
    }
    while (!l->closed) {
        uint32_t n;
        int r = kvd__cw_frame(l->rx + at, l->rx_len - at,
                              l->authed ? KVD_LINK_MAX_CTRL : PREAUTH_FRAME, &n);
        Kvdock__Cluster__Msg *m;
        if (r == KVD_CW_BAD) {
            kvd__door_refuse(l, l->authed ? "an empty message or one over 8 MiB"
                                         : "an empty message or one over 512 bytes before the "
                                           "proof of the secret");
            return;
        }
        if (r == KVD_CW_NEED)
            break;
        m = kvdock__cluster__msg__unpack(NULL, n, l->rx + at + KVD_CW_HEADER);
        at += KVD_CW_HEADER + n;
        if (m == NULL) {
            kvd__door_refuse(l, "a message that does not decode");
            return;
        }
        handle_msg(ls, l, m);
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

int kvd__door_socket(const kvd__links_t *ls)
{
    return listen_fd(&ls->cfg->listen_sa, ls->cfg->listen_salen);
}

void kvd__door_open(kvd__links_t *ls, int fd)
{
    int rc;

    uv_tcp_init(ls->srv->loop, &ls->listener);
    ls->listener.data = ls;
    if ((rc = uv_tcp_open(&ls->listener, fd)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&ls->listener, 128, on_accept)) != 0) {
        /* never on Linux once listen(2) took it; the handle owns fd now */
        kvd_log(KVD_LOG_ERROR, "event=cluster_listen_failed reason=\"%s\"", uv_strerror(rc));
    }
    ls->listening = 1;
}

void kvd__door_tick(kvd__links_t *ls, uint64_t now)
{
    uint64_t deadline = ls->cfg->deadline_ns;
    kvd__link_t *l, *lnext;

    for (uint32_t i = 0; i < ls->npeers; i++) {
        kvd__peer_t *pe = &ls->peers[i];
        if (pe->link == NULL) {
            if (now >= pe->next_try_ns)
                peer_connect(ls, pe);
            continue;
        }
        if (pe->state != KVD_PEER_UP) {
            if (kvd__cl_since(now, pe->link->opened_ns) > deadline)
                kvd__link_drop(pe->link, "no proof within the deadline");
            continue;
        }
        if (pe->ping_sent_ns != 0 && kvd__cl_since(now, pe->ping_sent_ns) > deadline) {
            kvd__link_drop(pe->link, "no answer to a ping within the deadline");
            continue;
        }
        if (pe->ping_sent_ns == 0 && kvd__cl_since(now, pe->ping_t) >= PING_NS) {
            Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
            Kvdock__Cluster__Ping pi = KVDOCK__CLUSTER__PING__INIT;
            pe->ping_t = now;
            pe->ping_sent_ns = now;
            pi.t = now;
            m.m_case = KVDOCK__CLUSTER__MSG__M_PING;
            m.ping = &pi;
            (void)kvd__link_send(pe->link, &m);
        }
    }
    /* connections that never proved the secret, and those that read
     * nothing of what they are sent */
    for (l = ls->links; l; l = lnext) {
        lnext = l->next;
        if (l->stalled) {
            if (!l->outbound)
                refused(ls, l->authed, "from", l->from, l->node,
                        "reads nothing of what it is sent");
            kvd__link_drop(l, "reads nothing of what it is sent");
            lnext = ls->links; /* dropping may have changed the list: again */
        } else if (!l->outbound && !l->authed && kvd__cl_since(now, l->opened_ns) > deadline) {
            kvd__door_refuse(l, "no proof of the secret within the deadline");
            lnext = ls->links;
        }
    }
}

void kvd__door_close(kvd__links_t *ls)
{
    ls->closing = 1;
    while (ls->links)
        kvd__link_drop(ls->links, "the daemon is shutting down");
    if (ls->listening)
        uv_close((uv_handle_t *)&ls->listener, NULL);
    ls->listening = 0;
}
