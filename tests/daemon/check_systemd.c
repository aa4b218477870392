/*
 * systemd integration (systemd.c) with the variables set up here, no
 * systemd needed:
 * - socket activation: a listening socket made by the test, dup'ed to
 *   descriptor 3 in the child, LISTEN_FDS=1 and LISTEN_PID=<child> set,
 *   kvdockd exec'ed; a client connects to that path and pings; the daemon
 *   leaves the socket file alone at exit (it is not its own);
 * - a LISTEN_PID of another process is ignored; descriptor 3 that is not a
 *   listening Unix stream socket is refused;
 * - readiness: NOTIFY_SOCKET naming a datagram socket (a path, and an
 *   abstract '@' name): READY=1 arrives once the daemon accepts, and
 *   STOPPING=1 on SIGTERM.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int unix_socket(int type, const char *path)
{
    struct sockaddr_un sa;
    int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

    ck_assert_int_ge(fd, 0);
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    ck_assert_msg(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "bind %s: %s", path,
                  strerror(errno));
    return fd;
}

/*
 * Start kvdockd with fd3 as descriptor 3 and LISTEN_FDS=nfds,
 * LISTEN_PID=<child pid> (or pid_value when not 0); its stderr to d->log.
 */
static void spawn_activated(kvdt_daemon_t *d, int fd3, int nfds, long pid_value,
                            const char *socket_opt)
{
    pid_t pid = fork();

    if (pid == 0) { /* no Check assertion in the child (harness.h, kvdt_child_close_fds) */
        char buf[32];
        int lf = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        const char *argv[12];
        int n = 0;

        if (lf >= 0) {
            dup2(lf, 2);
            close(lf);
        }
        if (fd3 != 3) {
            if (dup2(fd3, 3) < 0)
                _exit(126);
            close(fd3);
        }
        fcntl(3, F_SETFD, 0); /* survives exec */
        snprintf(buf, sizeof(buf), "%d", nfds);
        setenv("LISTEN_FDS", buf, 1);
        snprintf(buf, sizeof(buf), "%ld", pid_value ? pid_value : (long)getpid());
        setenv("LISTEN_PID", buf, 1);
        setenv("LISTEN_FDNAMES", "kvdockd.socket", 1);
        argv[n++] = getenv("KVDOCKD") ? getenv("KVDOCKD") : KVDOCKD_PATH;
        argv[n++] = "--backend";
        argv[n++] = "cpu";
        argv[n++] = "--log-level";
        argv[n++] = "debug";
        if (socket_opt) {
            argv[n++] = "--socket";
            argv[n++] = socket_opt;
        }
        argv[n] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    ck_assert_int_ge(pid, 0);
    d->pid = pid;
}

static void make_dir(kvdt_daemon_t *d)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/kvdt-sd-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d->dir));
    snprintf(d->sock, sizeof(d->sock), "%s/kvdockd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/kvdockd.log", d->dir);
}

static void ping_ok(const kvdt_daemon_t *d)
{
    int fd = kvdt_client(d, "sd-test");
    Kvdock__Request req;
    Kvdock__Ping p = KVDOCK__PING__INIT;
    Kvdock__StatusRequest sr = KVDOCK__STATUS_REQUEST__INIT;
    Kvdock__Response *r;

    kvdt_req_init(&req, 1);
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &p;
    ck_assert_int_eq(kvdt_status_of(fd, &req), 0);
    /* the daemon reports the socket it was given */
    kvdt_req_init(&req, 2);
    req.op_case = KVDOCK__REQUEST__OP_STATUS;
    req.status = &sr;
    r = kvdt_call(fd, &req);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, 0);
    ck_assert_str_eq(r->status_reply->socket_path, d->sock);
    kvdock__response__free_unpacked(r, NULL);
    close(fd);
}

START_TEST(test_socket_activation)
{
    kvdt_daemon_t d;
    int lfd, st;
    struct stat sb;

    make_dir(&d);
    lfd = unix_socket(SOCK_STREAM, d.sock);
    ck_assert_int_eq(listen(lfd, 16), 0);
    /* no --socket: the daemon must not bind its default path */
    spawn_activated(&d, lfd, 1, 0, NULL);
    close(lfd); /* only the daemon holds it now */
    ping_ok(&d);
    ck_assert(kvdt_log_has(&d, "event=socket_activated"));
    ck_assert(kvdt_log_has(&d, "event=ready socket="));
    kill(d.pid, SIGTERM);
    st = kvdt_wait_exit(&d, KVDT_TIMEOUT_MS);
    if (st != 0)
        kvdt_dump_log(&d);
    ck_assert_int_eq(st, 0);
    /* the socket file belongs to the service manager: still there */
    ck_assert_int_eq(lstat(d.sock, &sb), 0);
    ck_assert(S_ISSOCK(sb.st_mode));
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

/* A --socket on the command line loses to the socket systemd gave. */
START_TEST(test_socket_activation_overrides_option)
{
    kvdt_daemon_t d;
    int lfd;
    char other[200];
    struct stat sb;

    make_dir(&d);
    snprintf(other, sizeof(other), "%s/other.sock", d.dir);
    lfd = unix_socket(SOCK_STREAM, d.sock);
    ck_assert_int_eq(listen(lfd, 16), 0);
    spawn_activated(&d, lfd, 1, 0, other);
    close(lfd);
    ping_ok(&d);
    ck_assert_int_ne(lstat(other, &sb), 0);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

/* LISTEN_PID of another process: not ours; the daemon binds --socket. */
START_TEST(test_listen_pid_other)
{
    kvdt_daemon_t d;
    char own[128];
    int lfd, i;
    uint64_t deadline;

    make_dir(&d);
    snprintf(own, sizeof(own), "%s/own.sock", d.dir);
    lfd = unix_socket(SOCK_STREAM, d.sock);
    ck_assert_int_eq(listen(lfd, 16), 0);
    spawn_activated(&d, lfd, 1, 1, own); /* pid 1 is not the daemon */
    close(lfd);
    snprintf(d.sock, sizeof(d.sock), "%s", own);
    deadline = now_ms() + KVDT_TIMEOUT_MS;
    for (i = -1; i < 0 && now_ms() < deadline; usleep(5000)) {
        i = kvdt_connect(own);
    }
    ck_assert_int_ge(i, 0);
    close(i);
    ping_ok(&d);
    ck_assert(!kvdt_log_has(&d, "event=socket_activated"));
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

/* Descriptor 3 that is not a listening Unix stream socket: refused. */
START_TEST(test_activation_bad_fd)
{
    static const char *const why[] = {"not listening", "not an AF_UNIX", "not a stream",
                                      "not a socket"};
    kvdt_daemon_t d;
    int fd3 = -1, st;

    make_dir(&d);
    switch (_i) {
    case 0: /* bound, not listening */
        fd3 = unix_socket(SOCK_STREAM, d.sock);
        break;
    case 1: /* a TCP socket */
        fd3 = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_eq(listen(fd3, 1), 0);
        break;
    case 2: /* a datagram socket */
        fd3 = unix_socket(SOCK_DGRAM, d.sock);
        break;
    case 3: /* a file */
        fd3 = open(d.log, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        break;
    }
    ck_assert_int_ge(fd3, 0);
    spawn_activated(&d, fd3, 1, 0, NULL);
    close(fd3);
    st = kvdt_wait_exit(&d, KVDT_TIMEOUT_MS);
    ck_assert_msg(st == 1, "exit %d", st);
    if (!kvdt_log_has(&d, why[_i])) {
        kvdt_dump_log(&d);
        ck_abort_msg("the log does not say '%s'", why[_i]);
    }
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

/* ---- readiness ---------------------------------------------------------- */

/* The next datagram on fd, or "" on timeout. */
static void recv_state(int fd, char *buf, size_t cap, int timeout_ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    ssize_t n;

    buf[0] = '\0';
    if (poll(&p, 1, timeout_ms) <= 0)
        return;
    n = recv(fd, buf, cap - 1, 0);
    ck_assert_int_ge(n, 0);
    buf[n] = '\0';
}

static void readiness(int abstract)
{
    char dir[] = "/tmp/kvdt-ntf-XXXXXX", path[100], env[120], msg[1024];
    kvdt_daemon_t d;
    struct sockaddr_un sa;
    socklen_t salen;
    int nfd, st, one = 1;

    ck_assert_ptr_nonnull(mkdtemp(dir));
    nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(nfd, 0);
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (abstract) {
        int n = snprintf(path, sizeof(path), "kvdt-notify-%d-%ld", (int)getpid(), (long)now_ms());
        memcpy(sa.sun_path + 1, path, (size_t)n);
        salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
        snprintf(env, sizeof(env), "@%s", path);
    } else {
        snprintf(path, sizeof(path), "%s/notify", dir);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        salen = sizeof(sa);
        snprintf(env, sizeof(env), "%s", path);
    }
    ck_assert_int_eq(bind(nfd, (struct sockaddr *)&sa, salen), 0);
    (void)setsockopt(nfd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
    setenv("NOTIFY_SOCKET", env, 1);
    kvdt_start(&d, NULL);
    unsetenv("NOTIFY_SOCKET");
    /* READY=1 comes once it serves (kvdt_start saw it accept) */
    recv_state(nfd, msg, sizeof(msg), KVDT_TIMEOUT_MS);
    ck_assert_msg(strstr(msg, "READY=1") != NULL, "got '%s'", msg);
    ck_assert_ptr_nonnull(strstr(msg, "STATUS="));
    {
        char want[64];
        snprintf(want, sizeof(want), "MAINPID=%d", (int)d.pid);
        ck_assert_msg(strstr(msg, want) != NULL, "got '%s'", msg);
    }
    ping_ok(&d);
    kill(d.pid, SIGTERM);
    recv_state(nfd, msg, sizeof(msg), KVDT_TIMEOUT_MS);
    ck_assert_msg(strstr(msg, "STOPPING=1") != NULL, "got '%s'", msg);
    st = kvdt_wait_exit(&d, KVDT_TIMEOUT_MS);
    ck_assert_int_eq(st, 0);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    close(nfd);
    if (!abstract)
        unlink(path);
    rmdir(dir);
}

START_TEST(test_notify_path)
{
    readiness(0);
}
END_TEST

START_TEST(test_notify_abstract)
{
    readiness(1);
}
END_TEST

/* No NOTIFY_SOCKET, or one nobody listens on: the daemon runs all the same. */
START_TEST(test_notify_absent_or_dead)
{
    kvdt_daemon_t d;

    unsetenv("NOTIFY_SOCKET");
    kvdt_start(&d, NULL);
    ping_ok(&d);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    setenv("NOTIFY_SOCKET", "/nonexistent/notify", 1);
    kvdt_start(&d, NULL);
    unsetenv("NOTIFY_SOCKET");
    ping_ok(&d);
    ck_assert_int_eq(kvdt_stop(&d), 0);
}
END_TEST

/* With stderr the journal's stream (JOURNAL_STREAM names its device and
 * inode), each log line starts with its syslog priority; otherwise not. */
START_TEST(test_journal_priority)
{
    for (int journal = 0; journal < 2; journal++) {
        char dir[] = "/tmp/kvdt-journal-XXXXXX", log[64], sock[96], text[4096] = "";
        struct stat st;
        int lf, status;
        pid_t pid;
        FILE *f;

        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(log, sizeof(log), "%s/err", dir);
        snprintf(sock, sizeof(sock), "%s/run/kvdockd.sock", dir);
        lf = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        ck_assert_int_ge(lf, 0);
        ck_assert_int_eq(fstat(lf, &st), 0);
        pid = fork();
        if (pid == 0) { /* no Check assertion in the child */
            char js[64];
            const char *argv[] = {getenv("KVDOCKD") ? getenv("KVDOCKD") : KVDOCKD_PATH,
                                  "--backend", "cpu", "--socket", sock,
                                  "--host-memory-budget", "64M", NULL};
            dup2(lf, 2);
            snprintf(js, sizeof(js), "%llu:%llu", (unsigned long long)st.st_dev,
                     (unsigned long long)st.st_ino);
            if (journal)
                setenv("JOURNAL_STREAM", js, 1);
            else
                unsetenv("JOURNAL_STREAM");
            execv(argv[0], (char *const *)argv);
            _exit(127);
        }
        ck_assert_int_ge(pid, 0);
        close(lf);
        for (int i = 0; i < 300 && access(sock, F_OK) != 0; i++)
            usleep(10000);
        kill(pid, SIGTERM);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        f = fopen(log, "r");
        ck_assert_ptr_nonnull(f);
        (void)!fread(text, 1, sizeof(text) - 1, f);
        fclose(f);
        if (journal) {
            ck_assert_msg(strncmp(text, "<6>ts=", 6) == 0, "journal line: %.80s", text);
            ck_assert_ptr_nonnull(strstr(text, "\n<6>ts="));
        } else {
            ck_assert_msg(strncmp(text, "ts=", 3) == 0, "plain line: %.80s", text);
            ck_assert_ptr_null(strstr(text, "<6>"));
        }
        unlink(log);
        { /* the daemon made run/ and removed its socket at exit */
            char run[96];
            snprintf(run, sizeof(run), "%s/run", dir);
            rmdir(run);
            rmdir(dir);
        }
    }
}
END_TEST

/* With WATCHDOG_USEC (for this process), WATCHDOG=1 comes from the loop
 * twice per interval; with WATCHDOG_PID naming another process, never. */
START_TEST(test_watchdog)
{
    for (int ours = 1; ours >= 0; ours--) {
        char dir[] = "/tmp/kvdt-wd-XXXXXX", path[100], msg[1024];
        struct sockaddr_un sa;
        kvdt_daemon_t d;
        int nfd, pings = 0;
        uint64_t end;

        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(path, sizeof(path), "%s/notify", dir);
        nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(nfd, 0);
        memset(&sa, 0, sizeof(sa));
        sa.sun_family = AF_UNIX;
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        ck_assert_int_eq(bind(nfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        setenv("NOTIFY_SOCKET", path, 1);
        setenv("WATCHDOG_USEC", "100000", 1);
        if (!ours)
            setenv("WATCHDOG_PID", "1", 1);
        kvdt_start(&d, NULL);
        unsetenv("NOTIFY_SOCKET");
        unsetenv("WATCHDOG_USEC");
        unsetenv("WATCHDOG_PID");
        for (end = now_ms() + 600; now_ms() < end;) {
            recv_state(nfd, msg, sizeof(msg), 50);
            pings += strstr(msg, "WATCHDOG=1") != NULL;
        }
        if (ours)
            ck_assert_msg(pings >= 6, "%d watchdog pings in 600 ms at 100 ms", pings);
        else
            ck_assert_int_eq(pings, 0);
        ck_assert_int_eq(kvdt_stop(&d), 0);
        close(nfd);
        unlink(path);
        rmdir(dir);
    }
}
END_TEST

static Suite *systemd_suite(void)
{
    Suite *s = suite_create("systemd");
    TCase *act = tcase_create("activation");
    TCase *ntf = tcase_create("notify");

    tcase_add_test(act, test_socket_activation);
    tcase_add_test(act, test_journal_priority);
    tcase_add_test(act, test_watchdog);
    tcase_add_test(act, test_socket_activation_overrides_option);
    tcase_add_test(act, test_listen_pid_other);
    tcase_add_loop_test(act, test_activation_bad_fd, 0, 4);
    suite_add_tcase(s, act);
    tcase_add_test(ntf, test_notify_path);
    tcase_add_test(ntf, test_notify_abstract);
    tcase_add_test(ntf, test_notify_absent_or_dead);
    suite_add_tcase(s, ntf);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(systemd_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
