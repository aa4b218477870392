/*
 * check_daemon: the real kvdockd (cpu backend) on a temporary socket,
 * driven with raw frames: hello and its version check, hello-first,
 * unknown operations, malformed and oversized frames (only that
 * connection closes), the socket's permissions, stale sockets, status,
 * stats and the admin shutdown; clients that come and go while the loop
 * polls.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static kvdt_daemon_t D;

static void setup(void)
{
    kvdt_start(&D, NULL);
}

static void teardown(void)
{
    ck_assert_int_eq(kvdt_stop(&D), 0);
}

static Kvdock__Response *hello(int fd, uint32_t version, const char *name)
{
    Kvdock__Request req;
    Kvdock__Hello h = KVDOCK__HELLO__INIT;

    kvdt_req_init(&req, 5);
    h.protocol_version = version;
    h.client_name = (char *)name;
    req.op_case = KVDOCK__REQUEST__OP_HELLO;
    req.hello = &h;
    return kvdt_call(fd, &req);
}

START_TEST(test_hello)
{
    int fd = kvdt_connect(D.sock);
    Kvdock__Response *r;

    ck_assert_int_ge(fd, 0);
    r = hello(fd, KVD_PROTOCOL_VERSION, "check");
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->status, KVD_OK);
    ck_assert_int_eq(r->result_case, KVDOCK__RESPONSE__RESULT_HELLO);
    ck_assert_uint_eq(r->hello->protocol_version, KVD_PROTOCOL_VERSION);
    ck_assert_int_eq(r->hello->backend, KVDOCK__BACKEND__BACKEND_CPU);
    ck_assert_str_eq(r->hello->device_name, "cpu");
    ck_assert_int_eq(r->hello->device_ordinal, -1);
    ck_assert_int_eq(r->hello->admin, 1); /* same uid */
    ck_assert_uint_gt(r->hello->client_id, 0);
    ck_assert_uint_gt(r->hello->daemon_pid, 0);
    ck_assert_ptr_nonnull(r->hello->limits);
    ck_assert_uint_eq(r->hello->limits->max_frame_bytes, KVD_DEFAULT_MAX_FRAME_BYTES);
    ck_assert_uint_gt(r->hello->limits->max_inflight, 0);
    ck_assert_uint_gt(r->hello->limits->max_inline_bytes, 0);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_ping_ok(fd));
    /* a second hello is refused; the connection goes on */
    r = hello(fd, KVD_PROTOCOL_VERSION, "again");
    ck_assert_uint_eq(r->status, KVD_EPROTO);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
}
END_TEST

START_TEST(test_hello_version_mismatch)
{
    int fd = kvdt_connect(D.sock);
    Kvdock__Response *r;

    r = hello(fd, KVD_PROTOCOL_VERSION + 1, "future");
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->status, KVD_EVERSION);
    ck_assert_ptr_nonnull(strstr(r->message, "version"));
    /* the reply still says which version the daemon speaks */
    ck_assert_int_eq(r->result_case, KVDOCK__RESPONSE__RESULT_HELLO);
    ck_assert_uint_eq(r->hello->protocol_version, KVD_PROTOCOL_VERSION);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_closed(fd, KVDT_TIMEOUT_MS));
    close(fd);
    /* the daemon goes on */
    fd = kvdt_client(&D, "after");
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
}
END_TEST

START_TEST(test_request_before_hello)
{
    int fd = kvdt_connect(D.sock);
    Kvdock__Request req;
    Kvdock__Ping p = KVDOCK__PING__INIT;
    Kvdock__PoolList pl = KVDOCK__POOL_LIST__INIT;
    Kvdock__Response *r;

    kvdt_req_init(&req, 9);
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &p;
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_EPROTO);
    req.op_case = KVDOCK__REQUEST__OP_POOL_LIST;
    req.pool_list = &pl;
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_EPROTO);
    /* still usable: hello now works */
    r = hello(fd, KVD_PROTOCOL_VERSION, "late");
    ck_assert_uint_eq(r->status, KVD_OK);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
}
END_TEST

START_TEST(test_ping_payload)
{
    int fd = kvdt_client(&D, "ping");
    Kvdock__Request req;
    Kvdock__Ping p = KVDOCK__PING__INIT;
    Kvdock__Response *r;
    uint8_t payload[100];

    memset(payload, 0x5a, sizeof(payload));
    kvdt_req_init(&req, 0xfeedbeefcafeull);
    p.payload.data = payload;
    p.payload.len = sizeof(payload);
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &p;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_int_eq(r->result_case, KVDOCK__RESPONSE__RESULT_PONG);
    ck_assert_uint_eq(r->pong->payload.len, sizeof(payload));
    ck_assert_mem_eq(r->pong->payload.data, payload, sizeof(payload));
    kvdock__response__free_unpacked(r, NULL);
    close(fd);
}
END_TEST

START_TEST(test_unknown_op)
{
    int fd = kvdt_client(&D, "unknown");
    /* Request{id = 3, field 99 (varint) = 1}: an operation from the future */
    const uint8_t frame[] = {5, 0, 0, 0, 0x08, 0x03, 0x98, 0x06, 0x01};
    Kvdock__Response *r;

    kvdt_send_raw(fd, frame, sizeof(frame));
    r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->id, 3);
    ck_assert_uint_eq(r->status, KVD_EUNKNOWNOP);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
}
END_TEST

START_TEST(test_sync_on_session_op)
{
    int fd = kvdt_client(&D, "sync");
    Kvdock__Request req;
    Kvdock__Ping p = KVDOCK__PING__INIT;
    Kvdock__Sync s = KVDOCK__SYNC__INIT;

    kvdt_req_init(&req, 4);
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &p;
    s.reply_at_enqueue = 1;
    req.sync = &s;
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_EINVAL);
    /* an empty Sync is fine */
    s.reply_at_enqueue = 0;
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_OK);
    close(fd);
}
END_TEST

START_TEST(test_oversized_frame)
{
    int a = kvdt_client(&D, "big"), b = kvdt_client(&D, "bystander");
    uint8_t hdr[4];
    uint32_t n = KVD_DEFAULT_MAX_FRAME_BYTES + 1;
    Kvdock__Response *r;

    hdr[0] = (uint8_t)n;
    hdr[1] = (uint8_t)(n >> 8);
    hdr[2] = (uint8_t)(n >> 16);
    hdr[3] = (uint8_t)(n >> 24);
    kvdt_send_raw(a, hdr, 4); /* the header alone is enough to refuse it */
    r = kvdt_recv(a, NULL, NULL, KVDT_TIMEOUT_MS);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->id, 0);
    ck_assert_uint_eq(r->status, KVD_ETOOBIG);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_closed(a, KVDT_TIMEOUT_MS));
    /* only that connection */
    ck_assert(kvdt_ping_ok(b));
    close(a);
    close(b);
}
END_TEST

START_TEST(test_max_frame_exact)
{
    /* a frame of exactly max-frame-bytes is accepted (it is a ping) */
    int fd = kvdt_client(&D, "exact");
    Kvdock__Request req;
    Kvdock__Ping p = KVDOCK__PING__INIT;
    uint8_t *frame;
    size_t len, extra;
    Kvdock__Response *r;

    kvdt_req_init(&req, 8);
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &p;
    /* find a payload size that makes the packed request exactly the max */
    for (extra = KVD_DEFAULT_MAX_FRAME_BYTES - 16;; extra++) {
        p.payload.len = extra;
        p.payload.data = calloc(1, extra);
        if (protobuf_c_message_get_packed_size(&req.base) >= KVD_DEFAULT_MAX_FRAME_BYTES)
            break;
        free(p.payload.data);
    }
    ck_assert_uint_eq(protobuf_c_message_get_packed_size(&req.base), KVD_DEFAULT_MAX_FRAME_BYTES);
    ck_assert_int_eq(kvd__frame_pack(&req.base, &frame, &len), KVD_OK);
    kvdt_send_raw(fd, frame, len);
    r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_uint_eq(r->pong->payload.len, extra);
    kvdock__response__free_unpacked(r, NULL);
    free(frame);
    free(p.payload.data);
    close(fd);
}
END_TEST

START_TEST(test_garbage_bytes)
{
    int a = kvdt_client(&D, "garbage"), b = kvdt_client(&D, "bystander");
    /* a length that fits, then bytes that are no protobuf message */
    const uint8_t frame[] = {8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    Kvdock__Response *r;

    kvdt_send_raw(a, frame, sizeof(frame));
    r = kvdt_recv(a, NULL, NULL, KVDT_TIMEOUT_MS);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->status, KVD_EPROTO);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_closed(a, KVDT_TIMEOUT_MS));
    ck_assert(kvdt_ping_ok(b));
    close(a);
    close(b);
}
END_TEST

START_TEST(test_truncated_then_gone)
{
    /* half a frame, then the client goes: the daemon drops it and goes on */
    int a = kvdt_client(&D, "truncated");
    const uint8_t part[] = {100, 0, 0, 0, 0x08, 0x01};
    int b;

    kvdt_send_raw(a, part, sizeof(part));
    close(a);
    b = kvdt_client(&D, "next");
    ck_assert(kvdt_ping_ok(b));
    close(b);
}
END_TEST

START_TEST(test_socket_permissions)
{
    struct stat st;

    ck_assert_int_eq(stat(D.sock, &st), 0);
    ck_assert(S_ISSOCK(st.st_mode));
    ck_assert_int_eq(st.st_mode & 0777, 0660);
}
END_TEST

START_TEST(test_socket_dir_created)
{
    /* a missing directory is created 0700; the socket is 0660 */
    kvdt_daemon_t d2;
    char base[] = "/tmp/kvdt-dir-XXXXXX", sock[128], dir[96], cmd[160];
    struct stat st;
    int fd;

    ck_assert_ptr_nonnull(mkdtemp(base));
    snprintf(dir, sizeof(dir), "%s/sub", base);
    snprintf(sock, sizeof(sock), "%s/kvd.sock", dir);
    kvdt_start_sock(&d2, sock, NULL);
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700);
    fd = kvdt_client(&d2, "dir");
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d2), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_stale_socket_replaced)
{
    kvdt_daemon_t d2;
    struct stat st;
    int fd;

    /* the daemon dies without cleaning up: its socket is stale */
    kill(D.pid, SIGKILL);
    ck_assert_int_ge(kvdt_wait_exit(&D, KVDT_TIMEOUT_MS), 0);
    ck_assert_int_eq(stat(D.sock, &st), 0);
    ck_assert_int_lt(kvdt_connect(D.sock), 0); /* nothing answers */
    /* a new daemon on the same path replaces it */
    kvdt_start_sock(&d2, D.sock, NULL);
    fd = kvdt_client(&d2, "stale");
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d2), 0);
}
END_TEST

START_TEST(test_second_daemon_refused)
{
    /* a live socket is never taken over */
    int status = kvdt_run(D.sock, NULL, KVDT_TIMEOUT_MS);
    int fd;

    ck_assert_int_eq(status, 1);
    fd = kvdt_client(&D, "first");
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
}
END_TEST

START_TEST(test_not_a_socket_refused)
{
    char path[200];
    FILE *f;

    snprintf(path, sizeof(path), "%s/plain-file", D.dir);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("precious", f);
    fclose(f);
    ck_assert_int_eq(kvdt_run(path, NULL, KVDT_TIMEOUT_MS), 1);
    f = fopen(path, "r"); /* untouched */
    ck_assert_ptr_nonnull(f);
    fclose(f);
}
END_TEST

START_TEST(test_bad_option_exit)
{
    const char *bad[] = {"--max-inflight", "0", NULL};
    const char *unknown[] = {"--no-such-option", "1", NULL};

    ck_assert_int_eq(kvdt_run(D.sock, bad, KVDT_TIMEOUT_MS), 2);
    ck_assert_int_eq(kvdt_run(D.sock, unknown, KVDT_TIMEOUT_MS), 2);
}
END_TEST

START_TEST(test_status_and_stats)
{
    int a = kvdt_client(&D, "alpha"), b = kvdt_client(&D, "beta");
    Kvdock__Request req;
    Kvdock__StatusRequest sr = KVDOCK__STATUS_REQUEST__INIT;
    Kvdock__StatsRequest tr = KVDOCK__STATS_REQUEST__INIT;
    Kvdock__Response *r;
    size_t i;
    int seen_ping = 0;

    ck_assert(kvdt_ping_ok(a));
    ck_assert(kvdt_ping_ok(a));
    /* the harness's probe of the socket closed before a and b connected;
     * a daemon with I/O threads may see that close after b's request */
    for (i = 0;; i++) {
        kvdt_req_init(&req, 11);
        req.op_case = KVDOCK__REQUEST__OP_STATUS;
        req.status = &sr;
        r = kvdt_call(b, &req);
        ck_assert_uint_eq(r->status, 0);
        ck_assert_int_eq(r->result_case, KVDOCK__RESPONSE__RESULT_STATUS_REPLY);
        if (r->status_reply->clients == 2 || i * 5 >= (size_t)KVDT_TIMEOUT_MS)
            break;
        kvdock__response__free_unpacked(r, NULL);
        usleep(5000);
    }
    ck_assert_uint_eq(r->status_reply->clients, 2);
    ck_assert_uint_eq(r->status_reply->n_client_list, 2); /* admin: sees all */
    ck_assert_str_eq(r->status_reply->socket_path, D.sock);
    ck_assert_int_eq(r->status_reply->backend, KVDOCK__BACKEND__BACKEND_CPU);
    ck_assert_int_eq(r->status_reply->shutting_down, 0);
    kvdock__response__free_unpacked(r, NULL);

    kvdt_req_init(&req, 12);
    req.op_case = KVDOCK__REQUEST__OP_STATS;
    req.stats = &tr;
    r = kvdt_call(b, &req);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_int_eq(r->result_case, KVDOCK__RESPONSE__RESULT_STATS);
    for (i = 0; i < r->stats->n_ops; i++) {
        Kvdock__OpStats *o = r->stats->ops[i];
        ck_assert_uint_eq(o->n_counts, o->n_bounds_us + 1);
        if (strcmp(o->op, "ping") == 0) {
            uint64_t sum = 0;
            size_t k;
            for (k = 0; k < o->n_counts; k++)
                sum += o->counts[k];
            ck_assert_uint_eq(o->requests, 2);
            ck_assert_uint_eq(sum, 2);
            seen_ping = 1;
        }
    }
    ck_assert(seen_ping);
    ck_assert_uint_eq(r->stats->n_streams, 4);
    ck_assert_str_eq(r->stats->streams[0]->name, "reload");
    ck_assert_str_eq(r->stats->streams[3]->name, "d2d");
    ck_assert_uint_ge(r->stats->connections, 2);
    ck_assert_uint_gt(r->stats->bytes_in, 0);
    kvdock__response__free_unpacked(r, NULL);
    close(a);
    close(b);
}
END_TEST

START_TEST(test_shutdown_request)
{
    int fd = kvdt_client(&D, "admin");
    Kvdock__Request req;
    Kvdock__Shutdown sd = KVDOCK__SHUTDOWN__INIT;
    struct stat st;

    kvdt_req_init(&req, 21);
    sd.drain = 1;
    req.op_case = KVDOCK__REQUEST__OP_SHUTDOWN;
    req.shutdown = &sd;
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_OK);
    ck_assert(kvdt_closed(fd, KVDT_TIMEOUT_MS));
    ck_assert_int_eq(kvdt_wait_exit(&D, KVDT_TIMEOUT_MS), 0);
    ck_assert_int_ne(stat(D.sock, &st), 0); /* the socket is gone */
    close(fd);
}
END_TEST

START_TEST(test_backpressure)
{
    /* 2 requests in flight at most, one handled per read event: the daemon
     * stops reading past the limit and still answers every request once */
    kvdt_daemon_t d2;
    const char *extra[] = {"--max-inflight", "2", "--reqs-per-event", "1", NULL};
    enum { N = 400 };
    static uint8_t seen[N];
    Kvdock__Request req;
    Kvdock__Transfer t = KVDOCK__TRANSFER__INIT;
    Kvdock__Ping p = KVDOCK__PING__INIT;
    Kvdock__Indices si = KVDOCK__INDICES__INIT, di = KVDOCK__INDICES__INIT;
    int64_t a = 0, b = 1;
    uint64_t pool;
    int fd, i;

    kvdt_start(&d2, extra);
    fd = kvdt_client(&d2, "pressure");
    pool = kvdt_pool_create(fd, "bp", 4, 1024, 256, 0);
    ck_assert_uint_gt(pool, 0);
    si.n_values = di.n_values = 1;
    si.values = &a;
    di.values = &b;
    t.src_pool = t.dst_pool = pool;
    t.src = &si;
    t.dst = &di;
    t.all_layers = 1;
    for (i = 0; i < N; i++) {
        kvdt_req_init(&req, (uint64_t)i + 1);
        if (i % 4 == 3) {
            req.op_case = KVDOCK__REQUEST__OP_PING;
            req.ping = &p;
        } else {
            req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
            req.transfer = &t;
        }
        kvdt_send(fd, &req, NULL, 0);
    }
    memset(seen, 0, sizeof(seen));
    for (i = 0; i < N; i++) {
        Kvdock__Response *r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
        ck_assert_ptr_nonnull(r);
        ck_assert_uint_eq(r->status, 0);
        ck_assert_int_eq(seen[r->id - 1], 0);
        seen[r->id - 1] = 1;
        kvdock__response__free_unpacked(r, NULL);
    }
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d2), 0);
}
END_TEST

START_TEST(test_polled_clients_come_and_go)
{
    /* While the loop polls it reads first the connection that sent the
     * last request: one that closes right after its request must not be
     * read again once freed (the sanitizer build sees such a read). */
    kvdt_daemon_t d2;
    const char *extra[] = {"--busy-poll-us", "100000", NULL};
    int keep, i;

    kvdt_start(&d2, extra);
    keep = kvdt_client(&d2, "keeper");
    for (i = 0; i < 100; i++) {
        int gone = kvdt_client(&d2, "gone");

        ck_assert(kvdt_ping_ok(gone));
        close(gone);
        ck_assert(kvdt_ping_ok(keep));
        usleep(200); /* the loop polls, reading the freed one's socket or not */
    }
    close(keep);
    ck_assert_int_eq(kvdt_stop(&d2), 0);
}
END_TEST

START_TEST(test_max_clients)
{
    kvdt_daemon_t d2;
    const char *extra[] = {"--max-clients", "1", NULL};
    Kvdock__Response *r;
    int a, b, i;

    kvdt_start(&d2, extra);
    /* the harness's own probe may still count as the one client: retry */
    for (i = 0;; i++) {
        a = kvdt_connect(d2.sock);
        ck_assert_int_ge(a, 0);
        {
            Kvdock__Request req;
            Kvdock__Hello h = KVDOCK__HELLO__INIT;

            kvdt_req_init(&req, 5);
            h.protocol_version = KVD_PROTOCOL_VERSION;
            h.client_name = "first";
            req.op_case = KVDOCK__REQUEST__OP_HELLO;
            req.hello = &h;
            {
                uint8_t *frame;
                size_t len;
                /* a refused peer may be closed already: the send may fail */
                ck_assert_int_eq(kvd__frame_pack(&req.base, &frame, &len), KVD_OK);
                (void)kvd__sock_send_all(a, frame, len, NULL, 0);
                free(frame);
            }
            r = kvdt_recv(a, NULL, NULL, KVDT_TIMEOUT_MS);
        }
        ck_assert_ptr_nonnull(r);
        if (r->status == KVD_OK)
            break;
        ck_assert_uint_eq(r->status, KVD_ELIMIT);
        ck_assert_int_lt(i, 200);
        kvdock__response__free_unpacked(r, NULL);
        close(a);
        usleep(10000);
    }
    kvdock__response__free_unpacked(r, NULL);
    b = kvdt_connect(d2.sock);
    ck_assert_int_ge(b, 0);
    r = kvdt_recv(b, NULL, NULL, KVDT_TIMEOUT_MS);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->status, KVD_ELIMIT);
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_closed(b, KVDT_TIMEOUT_MS));
    ck_assert(kvdt_ping_ok(a));
    close(a);
    close(b);
    ck_assert_int_eq(kvdt_stop(&d2), 0);
}
END_TEST

static Suite *daemon_suite(void)
{
    Suite *s = suite_create("daemon");
    TCase *tc = tcase_create("session");

    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_hello);
    tcase_add_test(tc, test_hello_version_mismatch);
    tcase_add_test(tc, test_request_before_hello);
    tcase_add_test(tc, test_ping_payload);
    tcase_add_test(tc, test_unknown_op);
    tcase_add_test(tc, test_sync_on_session_op);
    tcase_add_test(tc, test_oversized_frame);
    tcase_add_test(tc, test_max_frame_exact);
    tcase_add_test(tc, test_garbage_bytes);
    tcase_add_test(tc, test_truncated_then_gone);
    tcase_add_test(tc, test_socket_permissions);
    tcase_add_test(tc, test_status_and_stats);
    tcase_add_test(tc, test_shutdown_request);
    suite_add_tcase(s, tc);

    tc = tcase_create("lifecycle");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_socket_dir_created);
    tcase_add_test(tc, test_stale_socket_replaced);
    tcase_add_test(tc, test_second_daemon_refused);
    tcase_add_test(tc, test_not_a_socket_refused);
    tcase_add_test(tc, test_bad_option_exit);
    tcase_add_test(tc, test_backpressure);
    tcase_add_test(tc, test_polled_clients_come_and_go);
    tcase_add_test(tc, test_max_clients);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(daemon_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
