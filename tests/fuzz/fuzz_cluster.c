/*
 * fuzz_cluster: libFuzzer target for what the cluster's front door reads
 * from the network (daemon/cluster/frames.c, with ASan and UBSan: see
 * tests/fuzz/run.sh).
 *
 * The input is a byte stream as a connection to --cluster-listen brings
 * it.  It is cut where the frames' length headers say, under the limit
 * before the proof (512 bytes a frame, 1 KiB in all) and then, once a
 * frame decodes as an Auth, under the limit after it (8 MiB), exactly as
 * door.c's on_read does; each whole frame is unpacked as a
 * kvdock.cluster.Msg, and the addresses of a Lanes message go through
 * kvd__cw_ucx_address_ok against a real UCX 1.13 worker address (TCP on
 * the loopback, as ucp_worker_get_address packs it).  The first byte of
 * the input chooses how the stream is split into reads (1 to 256 bytes
 * each), so that partial headers and frames are exercised.
 *
 * What must hold: no crash, no read outside the input, a frame handed on
 * only when whole and within the limit, and the UCX address check never
 * accepting an address that walks outside its bytes (the check walks it
 * again here with the length cut by one: that must not be accepted).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.pb-c.h"
#include "cluster/frames.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define PREAUTH_FRAME 512u
#define PREAUTH_BYTES 1024u
#define MAX_CTRL_BYTES (8u << 20)

/* A v1 worker address of UCX 1.13 (tcp over lo): uuid, one device, one
 * transport, its port. */
static const uint8_t own[] = {
    0x20, 0x8b, 0x59, 0x63, 0xa0, 0x1f, 0xde, 0x70, 0x5d, 0x20, 0x92, 0x01, 0x02,
    0x40, 0x65, 0x5e, 0xde, 0x30, 0x07, 0xd1, 0xcc, 0xf9, 0xff, 0xff, 0xef, 0x00,
    0x00, 0x00, 0x00, 0xcf, 0x19, 0x17, 0xb7, 0x51, 0x38, 0x53, 0x9e, 0x3e, 0x4b,
    0xd7, 0xe0, 0x37, 0x37, 0x01, 0x13, 0x23, 0x00, 0x82, 0xd4, 0x17};

static void check_lanes(const Kvdock__Cluster__Lanes *ln)
{
    for (size_t k = 0; k < ln->n_address; k++) {
        const ProtobufCBinaryData *a = &ln->address[k];
        /* a copy of exactly its length: ASan sees any read past it */
        uint8_t *copy = malloc(a->len ? a->len : 1);
        if (copy == NULL)
            abort();
        if (a->len > 0) /* an empty field's data may be NULL */
            memcpy(copy, a->data, a->len);
        if (kvd__cw_ucx_address_ok(copy, a->len, own, sizeof(own)) && a->len > 0 &&
            kvd__cw_ucx_address_ok(copy, a->len - 1, own, sizeof(own)))
            abort(); /* accepted both whole and cut short: the walk is not bounded by len */
        free(copy);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *rx;
    size_t rx_len = 0, at = 0, total = 0, pos = 1, step;
    int authed = 0;

    if (size < 1)
        return 0;
    if (!kvd__cw_ucx_address_ok(own, sizeof(own), own, sizeof(own)))
        abort(); /* the sample must pass */
    step = (size_t)data[0] + 1;
    rx = malloc(size);
    while (pos < size) {
        size_t n = size - pos < step ? size - pos : step;
        /* a read */
        memcpy(rx + rx_len, data + pos, n);
        rx_len += n;
        pos += n;
        if (!authed && (total += n) > PREAUTH_BYTES)
            break; /* refused */
        for (;;) {
            uint32_t len;
            int r = kvd__cw_frame(rx + at, rx_len - at, authed ? MAX_CTRL_BYTES : PREAUTH_FRAME,
                                  &len);
            Kvdock__Cluster__Msg *m;
            if (r == KVD_CW_BAD)
                goto done;
            if (r == KVD_CW_NEED)
                break;
            if (len == 0 || len > (authed ? MAX_CTRL_BYTES : PREAUTH_FRAME) ||
                at + KVD_CW_HEADER + len > rx_len)
                abort(); /* a frame handed on that is not whole or within the limit */
            /* an exact copy, so that ASan sees a read past the frame */
            {
                uint8_t *frame = malloc(len);
                memcpy(frame, rx + at + KVD_CW_HEADER, len);
                m = kvdock__cluster__msg__unpack(NULL, len, frame);
                free(frame);
            }
            at += KVD_CW_HEADER + len;
            if (m == NULL)
                goto done; /* refused */
            if (m->m_case == KVDOCK__CLUSTER__MSG__M_AUTH)
                authed = 1;
            else if (m->m_case == KVDOCK__CLUSTER__MSG__M_LANES)
                check_lanes(m->lanes);
            kvdock__cluster__msg__free_unpacked(m, NULL);
        }
    }
done:
    /* the address check alone, on the raw input */
    {
        uint8_t *copy = malloc(size);
        memcpy(copy, data, size);
        (void)kvd__cw_ucx_address_ok(copy, size, own, sizeof(own));
        free(copy);
    }
    free(rx);
    return 0;
}
