/*
 * check_wire: the framing code of proto/src/wire.c and the generated
 * messages.
 *
 * - every Request operation and every Response result survives
 *   pack -> parse -> unpack -> pack with every field set to a non-default
 *   value (filled from the descriptors, so appended fields are covered);
 * - the frame parser at its boundaries (0..4 header bytes, a frame of
 *   exactly max_frame, max_frame + 1);
 * - descriptors passed both ways over a socketpair;
 * - the proto StatusCode enum equals KVD_STATUS_MAP.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire.h"

/* ---- a tiny arena for the messages built by the filler ------------------- */

#define ARENA_MAX 4096
static void *arena[ARENA_MAX];
static int arena_n;

static void *arena_alloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);

    ck_assert_ptr_nonnull(p);
    ck_assert_int_lt(arena_n, ARENA_MAX);
    arena[arena_n++] = p;
    return p;
}

static void arena_free(void)
{
    while (arena_n > 0)
        free(arena[--arena_n]);
}

/* ---- descriptor-driven filling and checking ------------------------------ */

static void fill_message(ProtobufCMessage *m, int depth);

static size_t field_size(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return 8;
    case PROTOBUF_C_TYPE_FLOAT:
        return sizeof(float);
    case PROTOBUF_C_TYPE_DOUBLE:
        return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    }
    return 0;
}

/* One non-default value of field f at p; seed varies it. */
static void fill_value(const ProtobufCFieldDescriptor *f, void *p, int seed, int depth)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        *(int32_t *)p = -7 - seed;
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        *(uint32_t *)p = 0x80000001u + (uint32_t)seed;
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        *(int64_t *)p = -((int64_t)1 << 40) - seed;
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        *(uint64_t *)p = ((uint64_t)1 << 63) + (uint64_t)seed;
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        *(float *)p = 1.5f + (float)seed;
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        *(double *)p = 2.25 + seed;
        break;
    case PROTOBUF_C_TYPE_BOOL:
        *(protobuf_c_boolean *)p = 1;
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *e = f->descriptor;
        /* the last value: non-zero for every enum with two or more values */
        *(int *)p = e->values[e->n_values - 1].value;
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        char *s = arena_alloc(32);
        snprintf(s, 32, "%s-%d", f->name, seed);
        *(char **)p = s;
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = p;
        size_t i;
        b->len = 5 + (size_t)seed;
        b->data = arena_alloc(b->len);
        for (i = 0; i < b->len; i++)
            b->data[i] = (uint8_t)(0xa0 + i);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessageDescriptor *d = f->descriptor;
        ProtobufCMessage *sub = arena_alloc(d->sizeof_message);
        d->message_init(sub);
        fill_message(sub, depth + 1);
        *(ProtobufCMessage **)p = sub;
        break;
    }
    }
}

/* Every field of m set, except the members of a oneof (the caller picks). */
static void fill_message(ProtobufCMessage *m, int depth)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    unsigned i;

    ck_assert_int_lt(depth, 8);
    for (i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        char *base = (char *)m;

        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
            continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t sz = field_size(f), k;
            char *arr = arena_alloc(sz * 3);
            for (k = 0; k < 3; k++)
                fill_value(f, arr + k * sz, (int)k, depth);
            *(size_t *)(base + f->quantifier_offset) = 3;
            *(void **)(base + f->offset) = arr;
        } else {
            fill_value(f, base + f->offset, 0, depth);
        }
    }
}

/* Set the oneof member named name of m (and its case) to a filled value. */
static void fill_oneof(ProtobufCMessage *m, const char *name)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);

    ck_assert_msg(f != NULL, "no field %s", name);
    ck_assert(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF);
    *(uint32_t *)((char *)m + f->quantifier_offset) = f->id;
    fill_value(f, (char *)m + f->offset, 0, 0);
}

/* Every (non-oneof) field of a decoded message is non-default, recursively. */
static void check_all_set(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    unsigned i;

    for (i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *p = (const char *)m + f->offset;

        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (*(const uint32_t *)((const char *)m + f->quantifier_offset) != f->id)
                continue;
        }
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            ck_assert_msg(*(const size_t *)((const char *)m + f->quantifier_offset) == 3,
                          "%s.%s lost its elements", d->name, f->name);
            continue;
        }
        switch (f->type) {
        case PROTOBUF_C_TYPE_STRING:
            ck_assert_msg((*(char *const *)p)[0] != '\0', "%s.%s empty", d->name, f->name);
            break;
        case PROTOBUF_C_TYPE_BYTES:
            ck_assert_msg(((const ProtobufCBinaryData *)p)->len > 0, "%s.%s empty", d->name,
                          f->name);
            break;
        case PROTOBUF_C_TYPE_MESSAGE:
            ck_assert_msg(*(ProtobufCMessage *const *)p != NULL, "%s.%s missing", d->name,
                          f->name);
            check_all_set(*(ProtobufCMessage *const *)p);
            break;
        default: {
            char zero[8] = {0};
            ck_assert_msg(memcmp(p, zero, field_size(f)) != 0, "%s.%s is zero", d->name,
                          f->name);
        }
        }
    }
}

/* pack -> parse -> unpack -> check -> pack: same bytes both times. */
static ProtobufCMessage *round_trip(const ProtobufCMessage *msg)
{
    uint8_t *frame = NULL, *again = NULL;
    size_t len = 0, len2 = 0, plen = 0;
    ProtobufCMessage *out;

    ck_assert_int_eq(kvd__frame_pack(msg, &frame, &len), KVD_OK);
    ck_assert_uint_gt(len, KVD_FRAME_HEADER_BYTES);
    ck_assert_int_eq(kvd__frame_parse(frame, len, KVD_DEFAULT_MAX_FRAME_BYTES, &plen),
                     KVD__PARSE_FRAME);
    ck_assert_uint_eq(plen + KVD_FRAME_HEADER_BYTES, len);
    out = protobuf_c_message_unpack(msg->descriptor, NULL, plen, frame + KVD_FRAME_HEADER_BYTES);
    ck_assert_ptr_nonnull(out);
    check_all_set(out);
    ck_assert_int_eq(kvd__frame_pack(out, &again, &len2), KVD_OK);
    ck_assert_uint_eq(len, len2);
    ck_assert_mem_eq(frame, again, len);
    free(frame);
    free(again);
    return out;
}

static const struct {
    const char *field;
    int op_case;
    const char *name;
} request_ops[] = {
    {"hello", KVDOCK__REQUEST__OP_HELLO, "hello"},
    {"ping", KVDOCK__REQUEST__OP_PING, "ping"},
    {"status", KVDOCK__REQUEST__OP_STATUS, "status"},
    {"stats", KVDOCK__REQUEST__OP_STATS, "stats"},
    {"pool_create", KVDOCK__REQUEST__OP_POOL_CREATE, "pool_create"},
    {"pool_export", KVDOCK__REQUEST__OP_POOL_EXPORT, "pool_export"},
    {"pool_import", KVDOCK__REQUEST__OP_POOL_IMPORT, "pool_import"},
    {"pool_drop", KVDOCK__REQUEST__OP_POOL_DROP, "pool_drop"},
    {"pool_list", KVDOCK__REQUEST__OP_POOL_LIST, "pool_list"},
    {"buffer_register", KVDOCK__REQUEST__OP_BUFFER_REGISTER, "buffer_register"},
    {"buffer_drop", KVDOCK__REQUEST__OP_BUFFER_DROP, "buffer_drop"},
    {"event_register", KVDOCK__REQUEST__OP_EVENT_REGISTER, "event_register"},
    {"event_drop", KVDOCK__REQUEST__OP_EVENT_DROP, "event_drop"},
    {"store", KVDOCK__REQUEST__OP_STORE, "store"},
    {"fp8_set", KVDOCK__REQUEST__OP_FP8_SET, "fp8_set"},
    {"gather", KVDOCK__REQUEST__OP_GATHER, "gather"},
    {"transfer", KVDOCK__REQUEST__OP_TRANSFER, "transfer"},
    {"cache_create", KVDOCK__REQUEST__OP_CACHE_CREATE, "cache_create"},
    {"cache_drop", KVDOCK__REQUEST__OP_CACHE_DROP, "cache_drop"},
    {"cache_list", KVDOCK__REQUEST__OP_CACHE_LIST, "cache_list"},
    {"cache_stats", KVDOCK__REQUEST__OP_CACHE_STATS, "cache_stats"},
    {"cache_lookup", KVDOCK__REQUEST__OP_CACHE_LOOKUP, "cache_lookup"},
    {"cache_save", KVDOCK__REQUEST__OP_CACHE_SAVE, "cache_save"},
    {"cache_load", KVDOCK__REQUEST__OP_CACHE_LOAD, "cache_load"},
    {"cache_evict", KVDOCK__REQUEST__OP_CACHE_EVICT, "cache_evict"},
    {"cache_release", KVDOCK__REQUEST__OP_CACHE_RELEASE, "cache_release"},
    {"cache_key_area", KVDOCK__REQUEST__OP_CACHE_KEY_AREA, "cache_key_area"},
    {"shutdown", KVDOCK__REQUEST__OP_SHUTDOWN, "shutdown"},
};
#define N_REQUEST_OPS (int)(sizeof(request_ops) / sizeof(request_ops[0]))

static const struct {
    const char *field;
    int result_case;
} response_results[] = {
    {"hello", KVDOCK__RESPONSE__RESULT_HELLO},
    {"pong", KVDOCK__RESPONSE__RESULT_PONG},
    {"status_reply", KVDOCK__RESPONSE__RESULT_STATUS_REPLY},
    {"stats", KVDOCK__RESPONSE__RESULT_STATS},
    {"pool", KVDOCK__RESPONSE__RESULT_POOL},
    {"pool_export", KVDOCK__RESPONSE__RESULT_POOL_EXPORT},
    {"pools", KVDOCK__RESPONSE__RESULT_POOLS},
    {"buffer", KVDOCK__RESPONSE__RESULT_BUFFER},
    {"event", KVDOCK__RESPONSE__RESULT_EVENT},
    {"op", KVDOCK__RESPONSE__RESULT_OP},
    {"cache", KVDOCK__RESPONSE__RESULT_CACHE},
    {"caches", KVDOCK__RESPONSE__RESULT_CACHES},
    {"cache_lookup", KVDOCK__RESPONSE__RESULT_CACHE_LOOKUP},
    {"cache_evict", KVDOCK__RESPONSE__RESULT_CACHE_EVICT},
    {"cache_key_area", KVDOCK__RESPONSE__RESULT_CACHE_KEY_AREA},
};
#define N_RESPONSE_RESULTS (int)(sizeof(response_results) / sizeof(response_results[0]))

START_TEST(test_request_round_trip)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__Request *out;

    fill_message(&req.base, 0);
    fill_oneof(&req.base, request_ops[_i].field);
    ck_assert_int_eq(req.op_case, request_ops[_i].op_case);
    out = (Kvdock__Request *)round_trip(&req.base);
    ck_assert_int_eq(out->op_case, request_ops[_i].op_case);
    ck_assert_uint_eq(out->id, req.id);
    ck_assert_str_eq(kvd__op_name(out->op_case), request_ops[_i].name);
    protobuf_c_message_free_unpacked(&out->base, NULL);
    arena_free();
}
END_TEST

START_TEST(test_request_every_op_listed)
{
    /* every oneof member of Request is in request_ops: a new operation
     * appended to the proto must be added there (and to kvd__op_name). */
    const ProtobufCMessageDescriptor *d = &kvdock__request__descriptor;
    unsigned i;
    int found = 0;

    for (i = 0; i < d->n_fields; i++) {
        if (d->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            found++;
            ck_assert_str_ne(kvd__op_name((int)d->fields[i].id), "unknown");
        }
    }
    ck_assert_int_eq(found, N_REQUEST_OPS);
    ck_assert_str_eq(kvd__op_name(KVDOCK__REQUEST__OP__NOT_SET), "unknown");
    ck_assert_str_eq(kvd__op_name(9999), "unknown");
}
END_TEST

START_TEST(test_response_round_trip)
{
    Kvdock__Response resp = KVDOCK__RESPONSE__INIT;
    Kvdock__Response *out;

    fill_message(&resp.base, 0);
    fill_oneof(&resp.base, response_results[_i].field);
    out = (Kvdock__Response *)round_trip(&resp.base);
    ck_assert_int_eq(out->result_case, response_results[_i].result_case);
    ck_assert_uint_eq(out->status, resp.status);
    ck_assert_str_eq(out->message, resp.message);
    protobuf_c_message_free_unpacked(&out->base, NULL);
    arena_free();
}
END_TEST

START_TEST(test_response_every_result_listed)
{
    const ProtobufCMessageDescriptor *d = &kvdock__response__descriptor;
    unsigned i;
    int found = 0;

    for (i = 0; i < d->n_fields; i++)
        if (d->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
            found++;
    ck_assert_int_eq(found, N_RESPONSE_RESULTS);
}
END_TEST

START_TEST(test_empty_messages)
{
    /* a default Request packs to a frame with an empty payload */
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    uint8_t *frame;
    size_t len, plen = 99;

    ck_assert_int_eq(kvd__frame_pack(&req.base, &frame, &len), KVD_OK);
    ck_assert_uint_eq(len, 4);
    ck_assert_int_eq(kvd__frame_parse(frame, len, 0, &plen), KVD__PARSE_FRAME);
    ck_assert_uint_eq(plen, 0);
    free(frame);
    ck_assert_int_eq(kvd__frame_pack(NULL, &frame, &len), KVD_ENULL);
}
END_TEST

/* ---- frame parser boundaries --------------------------------------------- */

static void put_len(uint8_t *b, uint32_t n)
{
    b[0] = (uint8_t)n;
    b[1] = (uint8_t)(n >> 8);
    b[2] = (uint8_t)(n >> 16);
    b[3] = (uint8_t)(n >> 24);
}

START_TEST(test_parse_header_bytes)
{
    uint8_t b[8] = {0};
    size_t plen;
    size_t i;

    put_len(b, 4);
    for (i = 0; i < 4; i++) {
        plen = 12345;
        ck_assert_int_eq(kvd__frame_parse(b, i, 100, &plen), KVD__PARSE_NEED_MORE);
        ck_assert_uint_eq(plen, 12345); /* not set before the header is whole */
    }
    /* header whole, payload missing: the length is known already */
    ck_assert_int_eq(kvd__frame_parse(b, 4, 100, &plen), KVD__PARSE_NEED_MORE);
    ck_assert_uint_eq(plen, 4);
    ck_assert_int_eq(kvd__frame_parse(b, 7, 100, &plen), KVD__PARSE_NEED_MORE);
    ck_assert_int_eq(kvd__frame_parse(b, 8, 100, &plen), KVD__PARSE_FRAME);
    ck_assert_int_eq(kvd__frame_parse(NULL, 8, 100, &plen), KVD__PARSE_NEED_MORE);
    /* payload_len may be NULL */
    ck_assert_int_eq(kvd__frame_parse(b, 8, 100, NULL), KVD__PARSE_FRAME);
}
END_TEST

START_TEST(test_parse_max_frame)
{
    const uint32_t max = 1000;
    uint8_t *b = calloc(1, 4 + max + 1);
    size_t plen;

    put_len(b, max);
    ck_assert_int_eq(kvd__frame_parse(b, 4, max, &plen), KVD__PARSE_NEED_MORE);
    ck_assert_int_eq(kvd__frame_parse(b, 4 + max - 1, max, &plen), KVD__PARSE_NEED_MORE);
    ck_assert_int_eq(kvd__frame_parse(b, 4 + max, max, &plen), KVD__PARSE_FRAME);
    ck_assert_uint_eq(plen, max);
    /* more bytes than one frame: still that one frame */
    ck_assert_int_eq(kvd__frame_parse(b, 4 + max + 1, max, &plen), KVD__PARSE_FRAME);

    put_len(b, max + 1);
    /* refused from the header alone, before any payload arrived */
    ck_assert_int_eq(kvd__frame_parse(b, 4, max, &plen), KVD__PARSE_ERROR);
    ck_assert_uint_eq(plen, max + 1);
    ck_assert_int_eq(kvd__frame_parse(b, 4 + max + 1, max, &plen), KVD__PARSE_ERROR);

    put_len(b, UINT32_MAX);
    ck_assert_int_eq(kvd__frame_parse(b, 4, max, &plen), KVD__PARSE_ERROR);
    ck_assert_int_eq(kvd__frame_parse(b, 4, UINT32_MAX, &plen), KVD__PARSE_NEED_MORE);
    free(b);
}
END_TEST

START_TEST(test_parse_little_endian)
{
    uint8_t b[4] = {0x01, 0x02, 0x03, 0x04};
    size_t plen = 0;

    ck_assert_int_eq(kvd__frame_parse(b, 4, UINT64_MAX, &plen), KVD__PARSE_NEED_MORE);
    ck_assert_uint_eq(plen, 0x04030201u);
}
END_TEST

/* ---- descriptor passing -------------------------------------------------- */

static int make_memfd(const char *content)
{
    int fd = memfd_create("check_wire", MFD_CLOEXEC);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    return fd;
}

static void check_fd_content(int fd, const char *content)
{
    size_t n = strlen(content);
    char *map = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);

    ck_assert_ptr_ne(map, MAP_FAILED);
    ck_assert_mem_eq(map, content, n);
    munmap(map, n);
    ck_assert_int_ne(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
}

/* Send a frame with one memfd from a to b, receive it, read its content. */
static void pass_fd(int a, int b, const char *content)
{
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__Ping ping = KVDOCK__PING__INIT;
    uint8_t *frame, buf[256];
    size_t len, plen, got = 0;
    int fd = make_memfd(content), fds[KVD_MAX_FDS_PER_FRAME], nfds = 0;

    req.id = 42;
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &ping;
    ck_assert_int_eq(kvd__frame_pack(&req.base, &frame, &len), KVD_OK);
    ck_assert_int_eq(kvd__sock_send_all(a, frame, len, &fd, 1), KVD_OK);
    close(fd); /* the receiver holds its own reference now */
    while (kvd__frame_parse(buf, got, 1024, &plen) == KVD__PARSE_NEED_MORE) {
        ssize_t n = kvd__sock_recv(b, buf + got, sizeof(buf) - got, fds, &nfds,
                                   KVD_MAX_FDS_PER_FRAME);
        ck_assert_int_gt(n, 0);
        got += (size_t)n;
    }
    ck_assert_uint_eq(got, len);
    ck_assert_mem_eq(buf, frame, len);
    ck_assert_int_eq(nfds, 1);
    check_fd_content(fds[0], content);
    close(fds[0]);
    free(frame);
}

START_TEST(test_fd_passing_both_ways)
{
    int sv[2];

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pass_fd(sv[0], sv[1], "client to daemon: a VMM fd or memfd");
    pass_fd(sv[1], sv[0], "daemon to client: the pool's memfd");
    close(sv[0]);
    close(sv[1]);
}
END_TEST

START_TEST(test_fd_extra_closed)
{
    /* more descriptors than the receiver takes: the extra ones are closed */
    int sv[2], fds_out[3], fds_in[4], nfds = 0, i;
    char c = 'x', buf[4];

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    for (i = 0; i < 3; i++)
        fds_out[i] = make_memfd("extra");
    ck_assert_int_eq(kvd__sock_send_all(sv[0], &c, 1, fds_out, 3), KVD_OK);
    ck_assert_int_eq(kvd__sock_recv(sv[1], buf, sizeof(buf), fds_in, &nfds, 2), 1);
    ck_assert_int_eq(nfds, 2);
    check_fd_content(fds_in[0], "extra");
    check_fd_content(fds_in[1], "extra");
    close(fds_in[0]);
    close(fds_in[1]);
    for (i = 0; i < 3; i++)
        close(fds_out[i]);
    /* no descriptor wanted at all */
    fds_out[0] = make_memfd("none");
    ck_assert_int_eq(kvd__sock_send_all(sv[0], &c, 1, fds_out, 1), KVD_OK);
    ck_assert_int_eq(kvd__sock_recv(sv[1], buf, sizeof(buf), NULL, NULL, 0), 1);
    close(fds_out[0]);
    close(sv[0]);
    close(sv[1]);
}
END_TEST

START_TEST(test_sock_errors)
{
    int sv[2], fd = 0;
    char buf[4];

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    ck_assert_int_eq(kvd__sock_recv(sv[1], buf, sizeof(buf), NULL, NULL, 0), -EAGAIN);
    ck_assert_int_eq(kvd__sock_send_all(sv[0], buf, 0, &fd, 1), KVD_EINVAL);
    ck_assert_int_eq(kvd__sock_send_all(sv[0], buf, 1, &fd, KVD_MAX_FDS_PER_FRAME + 1),
                     KVD_EINVAL);
    ck_assert_int_eq(kvd__sock_send_all(-1, buf, 1, NULL, 0), KVD_EINVAL);
    close(sv[0]);
    ck_assert_int_eq(kvd__sock_recv(sv[1], buf, sizeof(buf), NULL, NULL, 0), 0); /* EOF */
    ck_assert_int_eq(kvd__sock_send_all(sv[1], "abc", 3, NULL, 0), KVD_ECONN);
    close(sv[1]);
}
END_TEST

START_TEST(test_sendmsg_gathers)
{
    /* the daemon's flush: several frames in one call, a descriptor with the
     * first byte; nothing sent without a buffer or with too many fds */
    int sv[2], fds[KVD_MAX_FDS_PER_FRAME + 1], got[KVD_MAX_FDS_PER_FRAME], ngot = 0;
    struct iovec iov[3] = {{"ab", 2}, {"cde", 3}, {"f", 1}};
    char buf[16];
    int i;

    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    for (i = 0; i <= KVD_MAX_FDS_PER_FRAME; i++)
        fds[i] = 0;
    errno = 0;
    ck_assert_int_eq(kvd__sock_sendmsg(sv[0], iov, 0, NULL, 0, 0), -1);
    ck_assert_int_eq(errno, EINVAL);
    errno = 0;
    ck_assert_int_eq(kvd__sock_sendmsg(sv[0], iov, 3, fds, KVD_MAX_FDS_PER_FRAME + 1, 0), -1);
    ck_assert_int_eq(errno, EINVAL);
    ck_assert_int_eq(kvd__sock_recv(sv[1], buf, sizeof(buf), got, &ngot, KVD_MAX_FDS_PER_FRAME),
                     -EAGAIN);
    ck_assert_int_eq(kvd__sock_sendmsg(sv[0], iov, 3, fds, 1, 0), 6);
    ck_assert_int_eq(kvd__sock_recv(sv[1], buf, sizeof(buf), got, &ngot, KVD_MAX_FDS_PER_FRAME), 6);
    ck_assert_mem_eq(buf, "abcdef", 6);
    ck_assert_int_eq(ngot, 1);
    ck_assert_int_ge(got[0], 0);
    close(got[0]);
    close(sv[0]);
    close(sv[1]);
}
END_TEST

START_TEST(test_send_large)
{
    /* a frame larger than the socket buffer arrives whole */
    int sv[2];
    size_t len = 4u << 20, got = 0;
    uint8_t *out = malloc(len), *in = malloc(len);
    size_t i;

    for (i = 0; i < len; i++)
        out[i] = (uint8_t)(i * 7);
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    if (fork() == 0) {
        close(sv[1]);
        _exit(kvd__sock_send_all(sv[0], out, len, NULL, 0) == KVD_OK ? 0 : 1);
    }
    close(sv[0]);
    while (got < len) {
        ssize_t n = kvd__sock_recv(sv[1], in + got, len - got, NULL, NULL, 0);
        ck_assert_int_gt(n, 0);
        got += (size_t)n;
    }
    ck_assert_mem_eq(in, out, len);
    close(sv[1]);
    free(in);
    free(out);
}
END_TEST

START_TEST(test_frame_gather)
{
    /* a gathered frame holds the bytes kvd__frame_pack makes, whether its
     * large fields go by reference (a few) or are copied (past the iovec
     * cap), and arrives whole through a socket smaller than it */
    static const unsigned nkeys[] = {0, 1, 3, 40};
    for (size_t t = 0; t < sizeof(nkeys) / sizeof(nkeys[0]); t++) {
        Kvdock__Request req = KVDOCK__REQUEST__INIT;
        Kvdock__CacheLookup cl = KVDOCK__CACHE_LOOKUP__INIT;
        Kvdock__CacheKeys ck = KVDOCK__CACHE_KEYS__INIT;
        ProtobufCBinaryData keys[40];
        uint8_t *data = malloc(40 * 5000), *flat, *got, *packed = NULL;
        size_t packed_len = 0, at = 0, n = 0;
        kvd__frame_gather_t g;
        int sv[2], sz = 4096;

        for (size_t i = 0; i < 40 * 5000; i++)
            data[i] = (uint8_t)(i * 13 + t);
        for (unsigned i = 0; i < nkeys[t]; i++) {
            keys[i].data = data + i * 5000;
            keys[i].len = i % 2 ? 5000 : 7; /* large and small in turn */
        }
        ck.n_keys = nkeys[t];
        ck.keys = keys;
        ck.key_size = 9;
        cl.cache = 77;
        cl.keys = &ck;
        cl.lease_ms = 300;
        req.id = 5;
        req.op_case = KVDOCK__REQUEST__OP_CACHE_LOOKUP;
        req.cache_lookup = &cl;
        ck_assert_int_eq(kvd__frame_pack(&req.base, &packed, &packed_len), KVD_OK);
        ck_assert_int_eq(kvd__frame_gather(&req.base, &g), KVD_OK);
        ck_assert_uint_eq(g.total, packed_len);
        ck_assert_int_ge(g.iovcnt, 1);
        ck_assert_int_le(g.iovcnt, KVD_FRAME_GATHER_IOV);
        flat = malloc(packed_len);
        for (int i = 0; i < g.iovcnt; i++) {
            ck_assert_uint_le(at + g.iov[i].iov_len, packed_len);
            memcpy(flat + at, g.iov[i].iov_base, g.iov[i].iov_len);
            at += g.iov[i].iov_len;
        }
        ck_assert_uint_eq(at, packed_len);
        ck_assert_mem_eq(flat, packed, packed_len);

        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        ck_assert_int_eq(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz)), 0);
        got = malloc(packed_len);
        if (fork() == 0) {
            close(sv[1]);
            _exit(kvd__sock_send_iov(sv[0], g.iov, g.iovcnt, NULL, 0) == KVD_OK ? 0 : 1);
        }
        close(sv[0]);
        while (n < packed_len) {
            ssize_t r = kvd__sock_recv(sv[1], got + n, packed_len - n, NULL, NULL, 0);
            ck_assert_int_gt(r, 0);
            n += (size_t)r;
        }
        ck_assert_mem_eq(got, packed, packed_len);
        close(sv[1]);
        kvd__frame_gather_free(&g);
        free(got);
        free(flat);
        free(packed);
        free(data);
    }
    {
        struct iovec v = {"x", 1};
        ck_assert_int_eq(kvd__sock_send_iov(-1, &v, 1, NULL, 0), KVD_EINVAL);
        ck_assert_int_eq(kvd__sock_send_iov(0, &v, 0, NULL, 0), KVD_EINVAL);
        ck_assert_int_eq(kvd__sock_send_iov(0, &v, KVD_FRAME_GATHER_IOV + 1, NULL, 0),
                         KVD_EINVAL);
    }
}
END_TEST

/* ---- default socket path ------------------------------------------------- */

START_TEST(test_default_socket_path)
{
    char buf[256], want[256];

    setenv("KVDOCK_SOCKET", "/run/x/kvd.sock", 1);
    ck_assert_int_eq(kvd__default_socket_path(buf, sizeof(buf)), KVD_OK);
    ck_assert_str_eq(buf, "/run/x/kvd.sock");
    ck_assert_int_eq(kvd__default_socket_path(buf, 5), KVD_ERANGE);

    unsetenv("KVDOCK_SOCKET");
    setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
    ck_assert_int_eq(kvd__socket_path_resolve(buf, sizeof(buf), NULL), KVD_OK);
    ck_assert_str_eq(buf, "/run/user/1234/kvdock/kvdockd.sock");

    unsetenv("XDG_RUNTIME_DIR");
    ck_assert_int_eq(kvd__socket_path_resolve(buf, sizeof(buf), NULL), KVD_OK);
    snprintf(want, sizeof(want), "/tmp/kvdock-%u/kvdockd.sock", (unsigned)getuid());
    ck_assert_str_eq(buf, want);
    ck_assert_int_eq(kvd__default_socket_path(NULL, 10), KVD_ENULL);
}
END_TEST

/* A system daemon's socket comes after $KVDOCK_SOCKET and before the
 * per-user paths, when a socket is there; the daemon's own default never
 * takes it. */
START_TEST(test_system_socket_path)
{
    char dir[] = "/tmp/kvd-sysXXXXXX", sys[64], plain[64], buf[256];
    struct sockaddr_un sa;
    int fd;

    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(sys, sizeof(sys), "%s/kvdockd.sock", dir);
    snprintf(plain, sizeof(plain), "%s/not-a-socket", dir);
    unsetenv("KVDOCK_SOCKET");
    setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);

    /* nothing there yet: the per-user path */
    ck_assert_int_eq(kvd__socket_path_resolve(buf, sizeof(buf), sys), KVD_OK);
    ck_assert_str_eq(buf, "/run/user/1234/kvdock/kvdockd.sock");

    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sys);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(kvd__socket_path_resolve(buf, sizeof(buf), sys), KVD_OK);
    ck_assert_str_eq(buf, sys);
    /* the daemon's own default skips it */
    ck_assert_int_eq(kvd__socket_path_resolve(buf, sizeof(buf), NULL), KVD_OK);
    ck_assert_str_eq(buf, "/run/user/1234/kvdock/kvdockd.sock");
    /* $KVDOCK_SOCKET comes first */
    setenv("KVDOCK_SOCKET", "/run/x/kvd.sock", 1);
    ck_assert_int_eq(kvd__socket_path_resolve(buf, sizeof(buf), sys), KVD_OK);
    ck_assert_str_eq(buf, "/run/x/kvd.sock");
    unsetenv("KVDOCK_SOCKET");

    /* a file that is not a socket is no daemon */
    fclose(fopen(plain, "w"));
    ck_assert_int_eq(kvd__socket_path_resolve(buf, sizeof(buf), plain), KVD_OK);
    ck_assert_str_eq(buf, "/run/user/1234/kvdock/kvdockd.sock");

    /* the public default names the installed service's socket */
    ck_assert_str_eq(KVD_SYSTEM_SOCKET, "/run/kvdock/kvdockd.sock");
    ck_assert_int_eq(kvd__default_socket_path(buf, sizeof(buf)), KVD_OK);
    {
        struct stat st;
        int there = stat(KVD_SYSTEM_SOCKET, &st) == 0 && S_ISSOCK(st.st_mode);
        ck_assert_str_eq(buf, there ? KVD_SYSTEM_SOCKET : "/run/user/1234/kvdock/kvdockd.sock");
    }
    unsetenv("XDG_RUNTIME_DIR");
    close(fd);
    unlink(sys);
    unlink(plain);
    rmdir(dir);
}
END_TEST

/* ---- UTF-8 ---------------------------------------------------------------- */

START_TEST(test_utf8)
{
    static const char *const good[] = {"", "abc", "w\xc3\xb6rker", "\xe2\x9c\x93",
                                       "\xf0\x9f\x98\x80", "\xef\xbf\xbf", "\xf4\x8f\xbf\xbf"};
    static const char *const bad[] = {"\xff", "\x80", "\xc3", "\xc0\xaf", "\xe0\x80\xaf",
                                      "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80",
                                      "a\xe2\x9c", "\xc3\x28"};
    Kvdock__Request req = KVDOCK__REQUEST__INIT;
    Kvdock__Hello h = KVDOCK__HELLO__INIT;
    uint8_t buf[128];
    char path[64];
    size_t n;

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        ck_assert_msg(kvd__utf8_valid((const uint8_t *)good[i], strlen(good[i])), "good %zu", i);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(!kvd__utf8_valid((const uint8_t *)bad[i], strlen(bad[i])), "bad %zu", i);
    /* in a request: the field is named */
    h.client_name = "w\xc3\xb6rker";
    req.op_case = KVDOCK__REQUEST__OP_HELLO;
    req.hello = &h;
    n = kvdock__request__pack(&req, buf);
    ck_assert_int_eq(kvd__wire_bad_string(&kvdock__request__descriptor, buf, n, path, sizeof(path)),
                     0);
    h.client_name = "worker\xff";
    n = kvdock__request__pack(&req, buf);
    ck_assert_int_eq(kvd__wire_bad_string(&kvdock__request__descriptor, buf, n, path, sizeof(path)),
                     KVD_WIRE_STR_UTF8);
    ck_assert_str_eq(path, "hello.client_name");
}
END_TEST

/* ---- status table agreement ---------------------------------------------- */

START_TEST(test_status_map_matches_proto)
{
    const ProtobufCEnumDescriptor *e = &kvdock__status_code__descriptor;
    unsigned entries = 0;

#define CHECK_ONE(name, num, msg)                                                    \
    do {                                                                             \
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value_by_name(  \
            e, #name);                                                               \
        ck_assert_msg(v != NULL, "StatusCode lacks " #name);                         \
        ck_assert_int_eq(v->value, num);                                             \
        ck_assert_int_eq(KVDOCK__STATUS_CODE__##name, KVD_##name);                   \
        entries++;                                                                   \
    } while (0);
    KVD_STATUS_MAP(CHECK_ONE)
#undef CHECK_ONE
    ck_assert_uint_eq(entries, e->n_values);
}
END_TEST

static Suite *wire_suite(void)
{
    Suite *s = suite_create("wire");
    TCase *tc;

    tc = tcase_create("messages");
    tcase_add_loop_test(tc, test_request_round_trip, 0, N_REQUEST_OPS);
    tcase_add_test(tc, test_request_every_op_listed);
    tcase_add_loop_test(tc, test_response_round_trip, 0, N_RESPONSE_RESULTS);
    tcase_add_test(tc, test_response_every_result_listed);
    tcase_add_test(tc, test_empty_messages);
    tcase_add_test(tc, test_status_map_matches_proto);
    suite_add_tcase(s, tc);

    tc = tcase_create("framing");
    tcase_add_test(tc, test_parse_header_bytes);
    tcase_add_test(tc, test_parse_max_frame);
    tcase_add_test(tc, test_parse_little_endian);
    suite_add_tcase(s, tc);

    tc = tcase_create("socket");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_fd_passing_both_ways);
    tcase_add_test(tc, test_fd_extra_closed);
    tcase_add_test(tc, test_sock_errors);
    tcase_add_test(tc, test_sendmsg_gathers);
    tcase_add_test(tc, test_send_large);
    tcase_add_test(tc, test_frame_gather);
    tcase_add_test(tc, test_default_socket_path);
    tcase_add_test(tc, test_system_socket_path);
    tcase_add_test(tc, test_utf8);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(wire_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
