/* A raw cluster peer (rawpeer.h). */
#include "rawpeer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "blake2s.h"

#define QUEUE 64
#define RX_MAX (16u << 20)

struct rawpeer {
    int fd;
    int closed;                  /* the daemon closed the connection */
    int *silent;                 /* rawpeer_open_silent's */
    int nsilent;
    uint8_t *rx;
    size_t rx_len;
    Kvdock__Cluster__Msg *q[QUEUE];
    int nq;
    char refused[256];           /* the last Refused reason */
    uint8_t nonce[RAWPEER_NONCE], their_nonce[RAWPEER_NONCE];
    uint8_t auth[128];
    size_t auth_len;
    int lfd;                     /* rawpeer_listen's */
    uint8_t *lane[8];            /* the daemon's lanes' worker addresses (rawpeer_serve) */
    size_t lane_len[8];
    int nlanes;
    ucp_context_h ctx;           /* rawpeer_send_block's, made at its first call */
    ucp_worker_h worker;
    ucp_ep_h ep[8];
    ucp_worker_h gone;           /* rawpeer_offer_split_lanes' second worker */
    int landed;                  /* block messages that came to worker */
};

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

rawpeer_t *rawpeer_new(void)
{
    rawpeer_t *rp = calloc(1, sizeof(*rp));

    if (rp == NULL)
        return NULL;
    rp->fd = -1;
    rp->lfd = -1;
    rp->rx = malloc(RX_MAX);
    if (rp->rx == NULL) {
        free(rp);
        return NULL;
    }
    for (int i = 0; i < RAWPEER_NONCE; i++)
        rp->nonce[i] = (uint8_t)(rand() ^ (i * 37));
    return rp;
}

void rawpeer_free(rawpeer_t *rp)
{
    if (rp == NULL)
        return;
    if (rp->fd >= 0)
        close(rp->fd);
    for (int i = 0; i < rp->nsilent; i++)
        if (rp->silent[i] >= 0)
            close(rp->silent[i]);
    free(rp->silent);
    if (rp->lfd >= 0)
        close(rp->lfd);
    for (int k = 0; k < 8; k++) {
        if (rp->ep[k] != NULL) {
            ucp_request_param_t prm;
            void *req;
            memset(&prm, 0, sizeof(prm));
            prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
            req = ucp_ep_close_nbx(rp->ep[k], &prm);
            if (UCS_PTR_IS_PTR(req)) {
                int64_t end = now_ms() + 2000;
                while (ucp_request_check_status(req) == UCS_INPROGRESS && now_ms() < end)
                    ucp_worker_progress(rp->worker);
                ucp_request_free(req);
            }
        }
        free(rp->lane[k]);
    }
    if (rp->gone != NULL)
        ucp_worker_destroy(rp->gone);
    if (rp->worker != NULL)
        ucp_worker_destroy(rp->worker);
    if (rp->ctx != NULL)
        ucp_cleanup(rp->ctx);
    for (int i = 0; i < rp->nq; i++)
        kvdock__cluster__msg__free_unpacked(rp->q[i], NULL);
    free(rp->rx);
    free(rp);
}

static int dial(const char *from, int port)
{
    struct sockaddr_in sa, src;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

    if (fd < 0)
        return -1;
    if (from != NULL) {
        memset(&src, 0, sizeof(src));
        src.sin_family = AF_INET;
        if (inet_pton(AF_INET, from, &src.sin_addr) != 1 ||
            bind(fd, (struct sockaddr *)&src, sizeof(src)) != 0) {
            close(fd);
            return -1;
        }
    }
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

int rawpeer_connect_from(rawpeer_t *rp, const char *from, int port)
{
    rp->fd = dial(from, port);
    return rp->fd >= 0 ? 0 : -1;
}

int rawpeer_connect(rawpeer_t *rp, int port)
{
    return rawpeer_connect_from(rp, NULL, port);
}

int rawpeer_open_silent(rawpeer_t *rp, const char *from, int port, int n)
{
    int *more = realloc(rp->silent, (size_t)(rp->nsilent + n) * sizeof(*more)), got = 0;

    if (more == NULL)
        return 0;
    rp->silent = more;
    for (int i = 0; i < n; i++) {
        int fd = dial(from, port);
        if (fd < 0)
            break;
        rp->silent[rp->nsilent++] = fd;
        got++;
    }
    return got;
}

void rawpeer_silent_send(rawpeer_t *rp, const void *data, size_t len)
{
    for (int i = 0; i < rp->nsilent; i++)
        if (rp->silent[i] >= 0)
            (void)send(rp->silent[i], data, len, MSG_DONTWAIT | MSG_NOSIGNAL);
}

int rawpeer_silent_closed(rawpeer_t *rp, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;
    int closed;

    do {
        closed = 0;
        for (int i = 0; i < rp->nsilent; i++) {
            char b[256];
            ssize_t n;
            if (rp->silent[i] < 0) {
                closed++;
                continue;
            }
            n = recv(rp->silent[i], b, sizeof(b), MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                close(rp->silent[i]);
                rp->silent[i] = -1;
                closed++;
            }
        }
        if (closed == rp->nsilent)
            break;
        usleep(10000);
    } while (now_ms() < end);
    return closed;
}

int rawpeer_send_raw(rawpeer_t *rp, const void *data, size_t len)
{
    const uint8_t *p = data;

    while (len > 0) {
        ssize_t n = send(rp->fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static size_t frame(const Kvdock__Cluster__Msg *m, uint8_t **out)
{
    size_t len = kvdock__cluster__msg__get_packed_size(m);
    uint8_t *b = malloc(len + 4);

    if (b == NULL)
        return 0;
    b[0] = (uint8_t)len;
    b[1] = (uint8_t)(len >> 8);
    b[2] = (uint8_t)(len >> 16);
    b[3] = (uint8_t)(len >> 24);
    kvdock__cluster__msg__pack(m, b + 4);
    *out = b;
    return len + 4;
}

int rawpeer_send_msg(rawpeer_t *rp, const Kvdock__Cluster__Msg *m)
{
    uint8_t *b = NULL;
    size_t n = frame(m, &b);
    int rc;

    if (n == 0)
        return -1;
    rc = rawpeer_send_raw(rp, b, n);
    free(b);
    return rc;
}

/* Read what is there within ms; whole frames go to the queue. */
static void pump(rawpeer_t *rp, int ms)
{
    struct pollfd pf = {.fd = rp->fd, .events = POLLIN};
    ssize_t n;

    if (rp->closed || rp->fd < 0 || poll(&pf, 1, ms) <= 0)
        return;
    n = recv(rp->fd, rp->rx + rp->rx_len, RX_MAX - rp->rx_len, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        rp->closed = 1;
        return;
    }
    if (n < 0)
        return;
    rp->rx_len += (size_t)n;
    for (;;) {
        uint32_t len;
        Kvdock__Cluster__Msg *m;
        if (rp->rx_len < 4)
            break;
        len = (uint32_t)rp->rx[0] | (uint32_t)rp->rx[1] << 8 | (uint32_t)rp->rx[2] << 16 |
              (uint32_t)rp->rx[3] << 24;
        if (len > RX_MAX - 4) {
            rp->closed = 1; /* the daemon never sends that */
            return;
        }
        if (rp->rx_len < 4 + (size_t)len)
            break;
        m = kvdock__cluster__msg__unpack(NULL, len, rp->rx + 4);
        memmove(rp->rx, rp->rx + 4 + len, rp->rx_len - 4 - len);
        rp->rx_len -= 4 + len;
        if (m == NULL)
            continue;
        if (m->m_case == KVDOCK__CLUSTER__MSG__M_REFUSED)
            snprintf(rp->refused, sizeof(rp->refused), "%s",
                     m->refused->reason ? m->refused->reason : "");
        if (rp->nq == QUEUE) {
            kvdock__cluster__msg__free_unpacked(m, NULL);
            continue;
        }
        rp->q[rp->nq++] = m;
    }
}

void rawpeer_progress(rawpeer_t *rp, int ms)
{
    int64_t end = now_ms() + ms;

    do
        pump(rp, 10);
    while (now_ms() < end && !rp->closed);
}

Kvdock__Cluster__Msg *rawpeer_wait(rawpeer_t *rp, Kvdock__Cluster__Msg__MCase want,
                                   int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;

    for (;;) {
        for (int i = 0; i < rp->nq; i++)
            if (rp->q[i]->m_case == want) {
                Kvdock__Cluster__Msg *m = rp->q[i];
                memmove(&rp->q[i], &rp->q[i + 1], (size_t)(rp->nq - i - 1) * sizeof(m));
                rp->nq--;
                return m;
            }
        if (rp->closed || now_ms() >= end)
            return NULL;
        pump(rp, 10);
    }
}

int rawpeer_wait_closed(rawpeer_t *rp, int timeout_ms, char *why, size_t why_len)
{
    int64_t end = now_ms() + timeout_ms;

    while (!rp->closed && now_ms() < end)
        pump(rp, 10);
    if (why != NULL)
        snprintf(why, why_len, "%s", rp->refused);
    return rp->closed;
}

void rawpeer_set_nonce(rawpeer_t *rp, const uint8_t nonce[RAWPEER_NONCE])
{
    memcpy(rp->nonce, nonce, RAWPEER_NONCE);
}

int rawpeer_hello(rawpeer_t *rp, uint32_t version)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Hello h = KVDOCK__CLUSTER__HELLO__INIT;

    h.version = version;
    h.node = "rawpeer";
    h.nonce.data = rp->nonce;
    h.nonce.len = RAWPEER_NONCE;
    m.m_case = KVDOCK__CLUSTER__MSG__M_HELLO;
    m.hello = &h;
    return rawpeer_send_msg(rp, &m);
}

/* BLAKE2s(key; label || a || b), as the daemons prove the secret. */
static void prove(const uint8_t key[KVD_BLAKE2S_BYTES], const char *label, const uint8_t *a,
                  const uint8_t *b, uint8_t out[KVD_BLAKE2S_BYTES])
{
    kvd__b2s_t s;

    kvd__b2s_init(&s, key, KVD_BLAKE2S_BYTES);
    kvd__b2s_update(&s, label, strlen(label));
    kvd__b2s_update(&s, a, RAWPEER_NONCE);
    kvd__b2s_update(&s, b, RAWPEER_NONCE);
    kvd__b2s_final(&s, out);
}

size_t rawpeer_last_auth(const rawpeer_t *rp, uint8_t *out, size_t cap)
{
    if (rp->auth_len > cap)
        return 0;
    memcpy(out, rp->auth, rp->auth_len);
    return rp->auth_len;
}

int rawpeer_auth(rawpeer_t *rp, const char *secret)
{
    uint8_t key[KVD_BLAKE2S_BYTES], want[KVD_BLAKE2S_BYTES], proof[KVD_BLAKE2S_BYTES], *b = NULL;
    size_t len = strlen(secret), n;
    kvd__b2s_t s;
    Kvdock__Cluster__Msg *ch, *w, m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Auth au = KVDOCK__CLUSTER__AUTH__INIT;
    int ok;

    while (len > 0 && (secret[len - 1] == '\n' || secret[len - 1] == '\r' ||
                       secret[len - 1] == ' '))
        len--;
    kvd__b2s_init(&s, NULL, 0);
    kvd__b2s_update(&s, secret, len);
    kvd__b2s_final(&s, key);
    if (rawpeer_hello(rp, RAWPEER_VERSION) != 0 ||
        (ch = rawpeer_wait(rp, KVDOCK__CLUSTER__MSG__M_CHALLENGE, 5000)) == NULL)
        return -1;
    ok = ch->challenge->nonce.len == RAWPEER_NONCE;
    if (ok) {
        memcpy(rp->their_nonce, ch->challenge->nonce.data, RAWPEER_NONCE);
        prove(key, "kvdock-cluster-1 B", rp->nonce, rp->their_nonce, want);
        ok = ch->challenge->proof.len == sizeof(want) &&
             memcmp(ch->challenge->proof.data, want, sizeof(want)) == 0;
    }
    kvdock__cluster__msg__free_unpacked(ch, NULL);
    if (!ok)
        return -1;
    prove(key, "kvdock-cluster-1 A", rp->their_nonce, rp->nonce, proof);
    au.proof.data = proof;
    au.proof.len = sizeof(proof);
    m.m_case = KVDOCK__CLUSTER__MSG__M_AUTH;
    m.auth = &au;
    if ((n = frame(&m, &b)) == 0 || n > sizeof(rp->auth)) {
        free(b);
        return -1;
    }
    memcpy(rp->auth, b, n);
    rp->auth_len = n;
    ok = rawpeer_send_raw(rp, b, n) == 0;
    free(b);
    if (!ok || (w = rawpeer_wait(rp, KVDOCK__CLUSTER__MSG__M_WELCOME, 5000)) == NULL)
        return -1;
    kvdock__cluster__msg__free_unpacked(w, NULL);
    return 0;
}

int rawpeer_listen(rawpeer_t *rp, int port)
{
    struct sockaddr_in sa;
    int one = 1;

    rp->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (rp->lfd < 0)
        return -1;
    setsockopt(rp->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    if (bind(rp->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(rp->lfd, 8) != 0)
        return -1;
    return 0;
}

int rawpeer_serve(rawpeer_t *rp, const char *secret, int timeout_ms)
{
    uint8_t key[KVD_BLAKE2S_BYTES], proof[KVD_BLAKE2S_BYTES];
    size_t len = strlen(secret);
    kvd__b2s_t s;
    struct pollfd pf = {.fd = rp->lfd, .events = POLLIN};
    Kvdock__Cluster__Msg *h, *a, *ln, m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Challenge ch = KVDOCK__CLUSTER__CHALLENGE__INIT;
    Kvdock__Cluster__Welcome w = KVDOCK__CLUSTER__WELCOME__INIT;

    while (len > 0 && (secret[len - 1] == '\n' || secret[len - 1] == '\r' ||
                       secret[len - 1] == ' '))
        len--;
    kvd__b2s_init(&s, NULL, 0);
    kvd__b2s_update(&s, secret, len);
    kvd__b2s_final(&s, key);
    if (poll(&pf, 1, timeout_ms) != 1 || (rp->fd = accept(rp->lfd, NULL, NULL)) < 0)
        return -1;
    if ((h = rawpeer_wait(rp, KVDOCK__CLUSTER__MSG__M_HELLO, timeout_ms)) == NULL)
        return -1;
    if (h->hello->nonce.len != RAWPEER_NONCE) {
        kvdock__cluster__msg__free_unpacked(h, NULL);
        return -1;
    }
    memcpy(rp->their_nonce, h->hello->nonce.data, RAWPEER_NONCE);
    kvdock__cluster__msg__free_unpacked(h, NULL);
    prove(key, "kvdock-cluster-1 B", rp->their_nonce, rp->nonce, proof);
    ch.node = "rawpeer";
    ch.nonce.data = rp->nonce;
    ch.nonce.len = RAWPEER_NONCE;
    ch.proof.data = proof;
    ch.proof.len = sizeof(proof);
    m.m_case = KVDOCK__CLUSTER__MSG__M_CHALLENGE;
    m.challenge = &ch;
    if (rawpeer_send_msg(rp, &m) != 0 ||
        (a = rawpeer_wait(rp, KVDOCK__CLUSTER__MSG__M_AUTH, timeout_ms)) == NULL)
        return -1;
    kvdock__cluster__msg__free_unpacked(a, NULL);
    m.m_case = KVDOCK__CLUSTER__MSG__M_WELCOME;
    m.welcome = &w;
    if (rawpeer_send_msg(rp, &m) != 0 ||
        (ln = rawpeer_wait(rp, KVDOCK__CLUSTER__MSG__M_LANES, timeout_ms)) == NULL)
        return -1;
    for (size_t k = 0; k < ln->lanes->n_address && k < 8; k++) {
        rp->lane[k] = calloc(1, ln->lanes->address[k].len + 64);
        memcpy(rp->lane[k], ln->lanes->address[k].data, ln->lanes->address[k].len);
        rp->lane_len[k] = ln->lanes->address[k].len;
        rp->nlanes++;
    }
    kvdock__cluster__msg__free_unpacked(ln, NULL);
    return rp->nlanes > 0 ? 0 : -1;
}

int rawpeer_lanes(const rawpeer_t *rp)
{
    return rp->nlanes;
}

/* rawpeer's UCX context and worker, made at the first call; 0 or -1. */
static int ucx_make(rawpeer_t *rp)
{
    ucp_params_t p;
    ucp_worker_params_t wp;

    if (rp->worker != NULL)
        return 0;
    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_AM;
    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (rp->ctx == NULL && ucp_init(&p, NULL, &rp->ctx) != UCS_OK) {
        rp->ctx = NULL;
        return -1;
    }
    if (ucp_worker_create(rp->ctx, &wp, &rp->worker) != UCS_OK) {
        rp->worker = NULL;
        return -1;
    }
    return 0;
}

int rawpeer_offer_mute_lanes(rawpeer_t *rp, int n)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Lanes ln = KVDOCK__CLUSTER__LANES__INIT;
    ProtobufCBinaryData addr[8];
    ucp_address_t *a;
    size_t len;
    int rc;

    if (n < 1 || n > 8 || ucx_make(rp) != 0 ||
        ucp_worker_get_address(rp->worker, &a, &len) != UCS_OK)
        return -1;
    for (int k = 0; k < n; k++)
        addr[k] = (ProtobufCBinaryData){len, (uint8_t *)a};
    ln.n_address = (size_t)n;
    ln.address = addr;
    m.m_case = KVDOCK__CLUSTER__MSG__M_LANES;
    m.lanes = &ln;
    rc = rawpeer_send_msg(rp, &m);
    ucp_worker_release_address(rp->worker, a);
    return rc;
}

static ucs_status_t on_block(void *arg, const void *hdr, size_t hdr_len, void *data,
                             size_t len, const ucp_am_recv_param_t *param)
{
    rawpeer_t *rp = arg;

    (void)hdr;
    (void)hdr_len;
    (void)data;
    (void)len;
    (void)param;
    rp->landed++;
    return UCS_OK; /* dropped (a rendezvous too: its data never fetched) */
}

int rawpeer_offer_split_lanes(rawpeer_t *rp, int n)
{
    Kvdock__Cluster__Msg m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Lanes ln = KVDOCK__CLUSTER__LANES__INIT;
    ProtobufCBinaryData addr[8];
    ucp_worker_params_t wp;
    ucp_address_t *a = NULL, *b = NULL;
    size_t alen, blen;
    int rc = -1;

    if (n < 2 || n > 8 || rp->gone != NULL || ucx_make(rp) != 0)
        return -1;
    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_worker_create(rp->ctx, &wp, &rp->gone) != UCS_OK) {
        rp->gone = NULL;
        return -1;
    }
    ucp_am_handler_param_t hp;

    memset(&hp, 0, sizeof(hp));
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = 2;
    hp.cb = on_block;
    hp.arg = rp;
    if (ucp_worker_set_am_recv_handler(rp->worker, &hp) != UCS_OK ||
        ucp_worker_get_address(rp->worker, &a, &alen) != UCS_OK ||
        ucp_worker_get_address(rp->gone, &b, &blen) != UCS_OK)
        goto out;
    for (int k = 0; k < n; k++)
        addr[k] = k % 2 == 0 ? (ProtobufCBinaryData){alen, (uint8_t *)a}
                             : (ProtobufCBinaryData){blen, (uint8_t *)b};
    ln.n_address = (size_t)n;
    ln.address = addr;
    m.m_case = KVDOCK__CLUSTER__MSG__M_LANES;
    m.lanes = &ln;
    rc = rawpeer_send_msg(rp, &m);
out:
    if (a != NULL)
        ucp_worker_release_address(rp->worker, a);
    if (b != NULL)
        ucp_worker_release_address(rp->gone, b);
    return rc;
}

void rawpeer_lanes_progress(rawpeer_t *rp, int ms)
{
    int64_t end = now_ms() + ms;

    while (rp->worker != NULL && now_ms() < end)
        if (ucp_worker_progress(rp->worker) == 0)
            usleep(1000);
}

int rawpeer_lanes_landed(const rawpeer_t *rp)
{
    return rp->landed;
}

void rawpeer_lanes_vanish(rawpeer_t *rp)
{
    if (rp->gone != NULL)
        ucp_worker_destroy(rp->gone);
    rp->gone = NULL;
}

void rawpeer_hangup(rawpeer_t *rp)
{
    if (rp->fd >= 0)
        close(rp->fd);
    rp->fd = -1;
    rp->closed = 1;
}

int rawpeer_send_block(rawpeer_t *rp, int k, const void *hdr, size_t hdr_len,
                       const void *data, size_t len, int timeout_ms)
{
    ucp_request_param_t prm;
    void *req;
    ucs_status_t st = UCS_OK;
    int64_t end = now_ms() + timeout_ms;

    if (k < 0 || k >= rp->nlanes || ucx_make(rp) != 0)
        return -1;
    if (rp->ep[k] == NULL) {
        ucp_ep_params_t ep;
        memset(&ep, 0, sizeof(ep));
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        ep.address = (const ucp_address_t *)rp->lane[k];
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        if (ucp_ep_create(rp->worker, &ep, &rp->ep[k]) != UCS_OK) {
            rp->ep[k] = NULL;
            return -1;
        }
    }
    memset(&prm, 0, sizeof(prm));
    req = ucp_am_send_nbx(rp->ep[k], 2, hdr, hdr_len, data, len, &prm);
    if (req == NULL)
        return 0;
    if (UCS_PTR_IS_ERR(req))
        return -1;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS && now_ms() < end)
        ucp_worker_progress(rp->worker);
    if (st == UCS_INPROGRESS)
        ucp_request_cancel(rp->worker, req);
    ucp_request_free(req);
    return st == UCS_OK ? 0 : -1;
}
