/* The cluster's framing and the check of peers' UCX addresses (frames.h). */
#include "frames.h"

#include <math.h>
#include <string.h>

int kvd__cw_frame(const uint8_t *buf, size_t len, size_t max, uint32_t *n)
{
    uint32_t v;

    *n = 0;
    if (len < KVD_CW_HEADER)
        return KVD_CW_NEED;
    v = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 |
        (uint32_t)buf[3] << 24;
    if (v == 0 || v > max)
        return KVD_CW_BAD;
    *n = v;
    return len - KVD_CW_HEADER >= v ? KVD_CW_FRAME : KVD_CW_NEED;
}

void kvd__cw_header(uint8_t out[KVD_CW_HEADER], uint32_t n)
{
    out[0] = (uint8_t)n;
    out[1] = (uint8_t)(n >> 8);
    out[2] = (uint8_t)(n >> 16);
    out[3] = (uint8_t)(n >> 24);
}

/* UCX 1.13's packed worker address (src/ucp/wireup/address.c there):
 *   header: version (low 4 bits; 0: v1, 1: v2), flags (v1: the high 4
 *           bits; v2: a second byte)
 *   uuid (8 bytes: always in v1, with its flag in v2), client id (8 bytes,
 *   with its flag), worker name (a length byte and the name, with the
 *   debug-info flag)
 *   per device: md index (low 5 bits in v1, 7 in v2, 127 extended by a
 *           byte in v2; 0x80: a device without transports), device
 *           address length (low 5 bits, 31 extended in v2; 0x80 last
 *           device, 0x40 a paths byte follows, 0x20 a system device byte
 *           follows), the device address
 *     per transport: name checksum (2 bytes), interface attributes (16
 *           bytes in v1, 8 in v2), interface address length (low 6 bits,
 *           63 extended in v2; 0x80 last transport, 0x40 endpoint
 *           addresses follow: never in a worker's address), the address */
#define V1 0
#define V2 1
#define F_WORKER_UUID 0x02
#define F_CLIENT_ID 0x04
#define F_DEBUG_INFO 0x01
#define MAX_TL 32

/* A float of v1 interface attributes (little-endian) UCX can compute
 * with: finite and within [lo, hi] (UCX asserts on some others). */
static int sane_float(const uint8_t *p, float lo, float hi)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    float f;

    memcpy(&f, &u, sizeof(f));
    return isfinite(f) && f >= lo && f <= hi;
}

typedef struct tl {
    uint16_t csum;
    uint8_t md, dev_len, iface_len;
} tl_t;

/* Walk a[0..len): the transports into tl (at most MAX_TL), how many;
 * -1 when it is not an address of that form. */
static int walk(const uint8_t *a, size_t len, tl_t *tl)
{
    size_t at = 0;
    unsigned version, flags;
    int n = 0, last_dev = 0;

#define NEED(k)                                                                                   \
    do {                                                                                          \
        if (len - at < (size_t)(k))                                                               \
            return -1;                                                                            \
    } while (0)
    NEED(1);
    version = a[0] & 0x0f;
    if (version == V1) {
        flags = a[0] >> 4;
        at = 1;
    } else if (version == V2) {
        NEED(2);
        flags = a[1];
        at = 2;
    } else {
        return -1; /* UCX asserts on any other version */
    }
    if (version == V1 || (flags & F_WORKER_UUID)) {
        NEED(8);
        at += 8;
    }
    if (flags & F_CLIENT_ID) {
        NEED(8);
        at += 8;
    }
    if (flags & F_DEBUG_INFO) {
        NEED(1);
        NEED(1 + (size_t)a[at]);
        at += 1 + (size_t)a[at];
    }
    NEED(1);
    if (a[at] == 0xff)
        return -1; /* no transport at all: nothing to connect to */
    while (!last_dev) {
        unsigned md, dev_len, b;
        int empty, last_tl;

        NEED(1);
        b = a[at++];
        empty = (b & 0x80) != 0;
        md = b & (version == V1 ? 0x1fu : 0x7fu);
        if (version == V2 && md == 0x7f) {
            NEED(1);
            md = a[at++];
        }
        NEED(1);
        b = a[at++];
        last_dev = (b & 0x80) != 0;
        dev_len = b & 0x1f;
        if (version == V2 && dev_len == 0x1f) {
            NEED(1);
            dev_len = a[at++];
        }
        if (b & 0x40) { /* paths */
            NEED(1);
            at++;
        }
        if (b & 0x20) { /* system device */
            NEED(1);
            at++;
        }
        NEED(dev_len);
        at += dev_len;
        for (last_tl = empty; !last_tl;) {
            unsigned iface_len;
            if (n == MAX_TL)
                return -1;
            NEED(2);
            tl[n].csum = (uint16_t)(a[at] | a[at + 1] << 8);
            at += 2;
            NEED(version == V1 ? 16 : 8);
            /* v1: overhead and latency in seconds, bandwidth in bytes/s
             * (negative from UCX 1.11 and older) */
            if (version == V1 && (!sane_float(a + at, 0.0f, 1.0f) ||
                                  !sane_float(a + at + 4, -1e15f, 1e15f) ||
                                  !sane_float(a + at + 8, 0.0f, 1.0f)))
                return -1;
            at += version == V1 ? 16 : 8;
            NEED(1);
            b = a[at++];
            last_tl = (b & 0x80) != 0;
            if (b & 0x40)
                return -1; /* endpoint addresses: not a worker's address */
            iface_len = b & 0x3f;
            if (version == V2 && iface_len == 0x3f) {
                NEED(1);
                iface_len = a[at++];
            }
            NEED(iface_len);
            at += iface_len;
            tl[n].md = (uint8_t)md;
            tl[n].dev_len = (uint8_t)dev_len;
            tl[n].iface_len = (uint8_t)iface_len;
            n++;
        }
    }
#undef NEED
    return at == len ? n : -1; /* nothing after it either */
}

int kvd__cw_ucx_address_ok(const uint8_t *addr, size_t len, const uint8_t *own, size_t own_len)
{
    tl_t theirs[MAX_TL], ours[MAX_TL];
    int nt, no;

    if (addr == NULL || own == NULL || len == 0 || own_len == 0 ||
        (addr[0] & 0x0f) != (own[0] & 0x0f))
        return 0;
    if ((nt = walk(addr, len, theirs)) <= 0 || (no = walk(own, own_len, ours)) <= 0)
        return 0;
    for (int i = 0; i < nt; i++) {
        int found = 0;
        for (int j = 0; j < no && !found; j++)
            found = theirs[i].csum == ours[j].csum && theirs[i].md == ours[j].md &&
                    theirs[i].dev_len == ours[j].dev_len &&
                    theirs[i].iface_len == ours[j].iface_len;
        if (!found)
            return 0;
    }
    return 1;
}
