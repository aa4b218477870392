/* A raw cluster peer (rawpeer.h). */
#include "rawpeer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>

#include "kvdock/blake2s.h"

#define QUEUE 64

struct rawpeer {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;
    ucp_ep_h *silent;            /* rawpeer_open_silent's */
    int nsilent;
    int failed;                  /* the endpoint failed: the daemon closed it */
    Kvdock__Cluster__Msg *q[QUEUE];
    int nq;
    char refused[256];           /* the last Refused reason */
    uint8_t nonce[RAWPEER_NONCE], their_nonce[RAWPEER_NONCE];
};

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static ucs_status_t on_ctrl(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param)
{
    rawpeer_t *rp = arg;
    Kvdock__Cluster__Msg *m;

    (void)header;
    (void)header_length;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)
        return UCS_OK; /* the daemon sends control messages eagerly */
    m = kvdock__cluster__msg__unpack(NULL, length, data);
    if (m == NULL)
        return UCS_OK;
    if (m->m_case == KVDOCK__CLUSTER__MSG__M_REFUSED)
        snprintf(rp->refused, sizeof(rp->refused), "%s",
                 m->refused->reason ? m->refused->reason : "");
    if (rp->nq == QUEUE) {
        kvdock__cluster__msg__free_unpacked(m, NULL);
        return UCS_OK;
    }
    rp->q[rp->nq++] = m;
    return UCS_OK;
}

static void on_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    (void)status;
    ((rawpeer_t *)arg)->failed = 1;
}

rawpeer_t *rawpeer_new(void)
{
    rawpeer_t *rp = calloc(1, sizeof(*rp));
    ucp_params_t p;
    ucp_worker_params_t wp;
    ucp_am_handler_param_t ap;

    if (rp == NULL)
        return NULL;
    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_AM;
    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_init(&p, NULL, &rp->ctx) != UCS_OK) {
        free(rp);
        return NULL;
    }
    if (ucp_worker_create(rp->ctx, &wp, &rp->worker) != UCS_OK) {
        ucp_cleanup(rp->ctx);
        free(rp);
        return NULL;
    }
    memset(&ap, 0, sizeof(ap));
    ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    ap.id = RAWPEER_AM_CTRL;
    ap.cb = on_ctrl;
    ap.arg = rp;
    (void)ucp_worker_set_am_recv_handler(rp->worker, &ap);
    for (int i = 0; i < RAWPEER_NONCE; i++)
        rp->nonce[i] = (uint8_t)(rand() ^ (i * 37));
    return rp;
}

void rawpeer_progress(rawpeer_t *rp, int ms)
{
    int64_t end = now_ms() + ms;

    do {
        while (ucp_worker_progress(rp->worker) != 0) {
        }
    } while (now_ms() < end);
}

static void close_ep(rawpeer_t *rp, ucp_ep_h ep)
{
    ucp_request_param_t prm;
    void *req;

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    req = ucp_ep_close_nbx(ep, &prm);
    if (UCS_PTR_IS_PTR(req)) {
        int64_t end = now_ms() + 2000;
        while (ucp_request_check_status(req) == UCS_INPROGRESS && now_ms() < end)
            ucp_worker_progress(rp->worker);
        ucp_request_free(req);
    }
}

void rawpeer_free(rawpeer_t *rp)
{
    if (rp == NULL)
        return;
    if (rp->ep != NULL)
        close_ep(rp, rp->ep);
    for (int i = 0; i < rp->nsilent; i++)
        close_ep(rp, rp->silent[i]);
    free(rp->silent);
    for (int i = 0; i < rp->nq; i++)
        kvdock__cluster__msg__free_unpacked(rp->q[i], NULL);
    ucp_worker_destroy(rp->worker);
    ucp_cleanup(rp->ctx);
    free(rp);
}

static int connect_ep(rawpeer_t *rp, int port, ucp_ep_h *out)
{
    struct sockaddr_in sa;
    ucp_ep_params_t ep;

    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = (const struct sockaddr *)&sa;
    ep.sockaddr.addrlen = sizeof(sa);
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = on_error;
    ep.err_handler.arg = rp;
    return ucp_ep_create(rp->worker, &ep, out) == UCS_OK ? 0 : -1;
}

int rawpeer_connect(rawpeer_t *rp, int port)
{
    return connect_ep(rp, port, &rp->ep);
}

int rawpeer_open_silent(rawpeer_t *rp, int port, int n)
{
    ucp_ep_h *more = realloc(rp->silent, (size_t)(rp->nsilent + n) * sizeof(*more));

    if (more == NULL)
        return -1;
    rp->silent = more;
    for (int i = 0; i < n; i++) {
        if (connect_ep(rp, port, &rp->silent[rp->nsilent]) != 0)
            return -1;
        rp->nsilent++;
        ucp_worker_progress(rp->worker);
    }
    return 0;
}

void rawpeer_silent_send(rawpeer_t *rp, const void *data, size_t len)
{
    ucp_request_param_t prm;

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    for (int i = 0; i < rp->nsilent; i++) {
        void *req = ucp_am_send_nbx(rp->silent[i], RAWPEER_AM_CTRL, NULL, 0, data, len, &prm);
        if (UCS_PTR_IS_PTR(req))
            ucp_request_free(req); /* completes inside UCX, or fails with the endpoint */
    }
}

int rawpeer_send(rawpeer_t *rp, unsigned am_id, const void *hdr, size_t hdr_len,
                 const void *data, size_t len, int eager, int timeout_ms)
{
    ucp_request_param_t prm;
    void *req;
    int64_t end = now_ms() + timeout_ms;
    ucs_status_t st;

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_AM_SEND_FLAG_REPLY | (eager ? UCP_AM_SEND_FLAG_EAGER : UCP_AM_SEND_FLAG_RNDV);
    req = ucp_am_send_nbx(rp->ep, am_id, hdr, hdr_len, data, len, &prm);
    if (req == NULL)
        return 0;
    if (UCS_PTR_IS_ERR(req))
        return -1;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS && !rp->failed &&
           now_ms() < end)
        ucp_worker_progress(rp->worker);
    if (st == UCS_INPROGRESS)
        ucp_request_cancel(rp->worker, req);
    ucp_request_free(req);
    return st == UCS_OK ? 0 : -1;
}

int rawpeer_send_msg(rawpeer_t *rp, const Kvdock__Cluster__Msg *m)
{
    size_t len = kvdock__cluster__msg__get_packed_size(m);
    uint8_t *buf = malloc(len ? len : 1);
    int rc;

    if (buf == NULL)
        return -1;
    kvdock__cluster__msg__pack(m, buf);
    rc = rawpeer_send(rp, RAWPEER_AM_CTRL, NULL, 0, buf, len, 1, 5000);
    free(buf);
    return rc;
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
        if (rp->failed || now_ms() >= end)
            return NULL;
        ucp_worker_progress(rp->worker);
    }
}

int rawpeer_wait_closed(rawpeer_t *rp, int timeout_ms, char *why, size_t why_len)
{
    int64_t end = now_ms() + timeout_ms;

    while (!rp->failed && now_ms() < end)
        ucp_worker_progress(rp->worker);
    if (why != NULL)
        snprintf(why, why_len, "%s", rp->refused);
    return rp->failed;
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
    kvd_b2s_t s;

    kvd_b2s_init(&s, key, KVD_BLAKE2S_BYTES);
    kvd_b2s_update(&s, label, strlen(label));
    kvd_b2s_update(&s, a, RAWPEER_NONCE);
    kvd_b2s_update(&s, b, RAWPEER_NONCE);
    kvd_b2s_final(&s, out);
}

int rawpeer_auth(rawpeer_t *rp, const char *secret)
{
    uint8_t key[KVD_BLAKE2S_BYTES], want[KVD_BLAKE2S_BYTES], proof[KVD_BLAKE2S_BYTES];
    size_t len = strlen(secret);
    kvd_b2s_t s;
    Kvdock__Cluster__Msg *ch, *w, m = KVDOCK__CLUSTER__MSG__INIT;
    Kvdock__Cluster__Auth au = KVDOCK__CLUSTER__AUTH__INIT;
    int ok;

    while (len > 0 && (secret[len - 1] == '\n' || secret[len - 1] == '\r' ||
                       secret[len - 1] == ' '))
        len--;
    kvd_b2s_init(&s, NULL, 0);
    kvd_b2s_update(&s, secret, len);
    kvd_b2s_final(&s, key);
    if (rawpeer_hello(rp, 1) != 0 ||
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
    if (rawpeer_send_msg(rp, &m) != 0 ||
        (w = rawpeer_wait(rp, KVDOCK__CLUSTER__MSG__M_WELCOME, 5000)) == NULL)
        return -1;
    kvdock__cluster__msg__free_unpacked(w, NULL);
    return 0;
}
