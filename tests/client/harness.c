/* Test harness of the client suites: see harness.h. */
#define _GNU_SOURCE
#include "harness.h"
#include "kvt_time.h"

#include "wire.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef KVDOCKD_PATH
#error "KVDOCKD_PATH must name the kvdockd binary"
#endif
#ifndef KVDOCK_CLI_PATH
#error "KVDOCK_CLI_PATH must name the kvdock binary"
#endif

kvt_daemon_t kvt_d;

const char *kvt_daemon_path(void)
{
    const char *p = getenv("KVDOCKD_PATH");

    return p != NULL && p[0] != '\0' ? p : KVDOCKD_PATH;
}

int64_t kvt_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

    nanosleep(&ts, NULL);
}

static bool can_connect(const char *path)
{
    struct sockaddr_un sa;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool ok;

    if (s < 0)
        return false;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sa.sun_path)) {
        close(s);
        return false;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    ok = connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(s);
    return ok;
}

void kvt_daemon_dump_log(const kvt_daemon_t *d)
{
    char buf[4096];
    FILE *f = fopen(d->log, "r");
    size_t n;

    if (f == NULL)
        return;
    fprintf(stderr, "---- kvdockd log (%s) ----\n", d->log);
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        fwrite(buf, 1, n, stderr);
    fprintf(stderr, "---- end of log ----\n");
    fclose(f);
}

int kvt_daemon_start(kvt_daemon_t *d, const char *backend, const char *const *extra, int timeout_ms)
{
    const char *argv[64];
    int argc = 0;
    int64_t deadline;
    char tmpl[] = "/tmp/kvdock-test-XXXXXX";

    memset(d, 0, sizeof(*d));
    d->pid = -1;
    if (mkdtemp(tmpl) == NULL) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    snprintf(d->dir, sizeof(d->dir), "%s", tmpl);
    snprintf(d->socket, sizeof(d->socket), "%s/run/kvdockd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/kvdockd.log", d->dir);

    argv[argc++] = kvt_daemon_path();
    argv[argc++] = "--socket";
    argv[argc++] = d->socket;
    argv[argc++] = "--backend";
    argv[argc++] = backend;
    /* no test daemon reserves more than this unless extra says otherwise */
    argv[argc++] = "--host-memory-budget";
    argv[argc++] = "2G";
    for (int i = 0; extra != NULL && extra[i] != NULL && argc < 62; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;

    d->pid = fork();
    if (d->pid < 0) {
        fprintf(stderr, "fork: %s\n", strerror(errno));
        return -1;
    }
    if (d->pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

        /* Never outlive the test, whatever kills it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (fd >= 0) {
            dup2(fd, STDERR_FILENO);
            dup2(fd, STDOUT_FILENO);
        }
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }

    deadline = kvt_now_ms() + timeout_ms;
    while (kvt_now_ms() < deadline) {
        int status;

        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            fprintf(stderr, "kvdockd exited at start (status 0x%x)\n", status);
            kvt_daemon_dump_log(d);
            d->pid = -1;
            return -1;
        }
        if (can_connect(d->socket))
            return 0;
        sleep_ms(10);
    }
    fprintf(stderr, "kvdockd did not accept connections on %s within %d ms\n", d->socket,
            timeout_ms);
    kvt_daemon_dump_log(d);
    kvt_daemon_kill(d);
    return -1;
}

static void remove_tree(const char *dir)
{
    char cmd[600];

    /* The directory is ours (mkdtemp); a plain recursive removal. */
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

void kvt_daemon_kill(kvt_daemon_t *d)
{
    int status;

    if (d->pid <= 0)
        return;
    kill(d->pid, SIGKILL);
    waitpid(d->pid, &status, 0);
    d->pid = -1;
}

int kvt_daemon_stop(kvt_daemon_t *d, int timeout_ms)
{
    int status = -1;
    int64_t deadline = kvt_now_ms() + timeout_ms;
    bool exited = false;

    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        while (kvt_now_ms() < deadline) {
            if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
                exited = true;
                break;
            }
            sleep_ms(10);
        }
        if (!exited) {
            fprintf(stderr, "kvdockd did not exit within %d ms of SIGTERM; killing it\n",
                    timeout_ms);
            kvt_daemon_dump_log(d);
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &status, 0);
            status = -1;
        }
        d->pid = -1;
    }
    if (d->dir[0] != '\0')
        remove_tree(d->dir);
    d->dir[0] = '\0';
    return status;
}

void kvt_suite_setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (kvt_daemon_start(&kvt_d, "cpu", NULL, (int)KVT_MS(10000)) != 0) {
        fprintf(stderr, "cannot start kvdockd for the suite\n");
        exit(EXIT_FAILURE);
    }
}

void kvt_suite_teardown(void)
{
    int status = kvt_daemon_stop(&kvt_d, (int)KVT_MS(10000));

    if (status != 0)
        fprintf(stderr, "note: kvdockd exit status 0x%x after SIGTERM\n", status);
}

kvd_client_t *kvt_connect(const char *name)
{
    kvd_client_t *cli = NULL;
    kvd_status_t st = kvd_client_create(kvt_d.socket, name, &cli);

    ck_assert_msg(st == KVD_OK, "connect to %s: %s: %s", kvt_d.socket, kvd_err_name(st),
                  kvd_client_last_error(NULL));
    kvd_client_set_timeout(cli, (int)KVT_MS(20000));
    return cli;
}

void kvt_fill(void *buf, size_t n, uint64_t seed)
{
    uint8_t *p = buf;
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;

    for (size_t i = 0; i < n; i++) {
        /* xorshift64* */
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        p[i] = (uint8_t)((x * 0x2545F4914F6CDD1Dull) >> 56);
    }
}

/* Read what is available of fd into a growing string; false at EOF. */
static bool slurp(int fd, char **buf, size_t *len, size_t *cap)
{
    char tmp[4096];
    ssize_t n = read(fd, tmp, sizeof(tmp));

    if (n <= 0)
        return n < 0 && errno == EINTR;
    if (*len + (size_t)n + 1 > *cap) {
        size_t c = (*cap + (size_t)n + 1) * 2;
        char *nb = realloc(*buf, c);

        if (nb == NULL)
            return false;
        *buf = nb;
        *cap = c;
    }
    memcpy(*buf + *len, tmp, (size_t)n);
    *len += (size_t)n;
    (*buf)[*len] = '\0';
    return true;
}

int kvt_run(const char *const *argv, char **out, char **err, int timeout_ms)
{
    int po[2], pe[2];
    pid_t pid;
    size_t ol = 0, oc = 1, el = 0, ec = 1;
    bool o_open = true, e_open = true;
    int64_t deadline = kvt_now_ms() + timeout_ms;
    int status;

    *out = calloc(1, 1);
    *err = calloc(1, 1);
    if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0)
        return -1;
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(po[1], STDOUT_FILENO);
        dup2(pe[1], STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    while ((o_open || e_open) && kvt_now_ms() < deadline) {
        struct pollfd p[2] = {{.fd = o_open ? po[0] : -1, .events = POLLIN},
                              {.fd = e_open ? pe[0] : -1, .events = POLLIN}};

        if (poll(p, 2, 100) <= 0)
            continue;
        if (p[0].revents)
            o_open = slurp(po[0], out, &ol, &oc);
        if (p[1].revents)
            e_open = slurp(pe[0], err, &el, &ec);
    }
    close(po[0]);
    close(pe[0]);
    if (o_open || e_open) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return -1;
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* ------------------------------------------------------------------------ */
/* A strict little JSON checker (RFC 8259 grammar, no extensions).          */

static const char *ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

static const char *value(const char *p, int depth);

static const char *string(const char *p)
{
    if (*p != '"')
        return NULL;
    for (p++; *p != '"'; p++) {
        if ((unsigned char)*p < 0x20)
            return NULL;
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", p[i]) || p[i] == '\0')
                        return NULL;
                p += 4;
            } else if (*p == '\0' || !strchr("\"\\/bfnrt", *p)) {
                return NULL;
            }
        }
    }
    return p + 1;
}

static const char *number(const char *p)
{
    const char *s = p;

    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (*p >= '0' && *p <= '9')
            p++;
    else
        return NULL;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9'))
            return NULL;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!(*p >= '0' && *p <= '9'))
            return NULL;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    return p > s ? p : NULL;
}

static const char *container(const char *p, int depth, char open, char close, bool keyed)
{
    if (*p != open || depth > 64)
        return NULL;
    p = ws(p + 1);
    if (*p == close)
        return p + 1;
    for (;;) {
        if (keyed) {
            p = string(p);
            if (p == NULL)
                return NULL;
            p = ws(p);
            if (*p != ':')
                return NULL;
            p = ws(p + 1);
        }
        p = value(p, depth + 1);
        if (p == NULL)
            return NULL;
        p = ws(p);
        if (*p == close)
            return p + 1;
        if (*p != ',')
            return NULL;
        p = ws(p + 1);
    }
}

static const char *value(const char *p, int depth)
{
    p = ws(p);
    switch (*p) {
    case '{': return container(p, depth, '{', '}', true);
    case '[': return container(p, depth, '[', ']', false);
    case '"': return string(p);
    case 't': return strncmp(p, "true", 4) == 0 ? p + 4 : NULL;
    case 'f': return strncmp(p, "false", 5) == 0 ? p + 5 : NULL;
    case 'n': return strncmp(p, "null", 4) == 0 ? p + 4 : NULL;
    default: return number(p);
    }
}

bool kvt_json_object_valid(const char *s)
{
    const char *p = ws(s);

    if (!kvd__utf8_valid((const uint8_t *)s, strlen(s)))
        return false; /* JSON text is UTF-8 */

    if (*p != '{')
        return false;
    p = value(p, 0);
    return p != NULL && *ws(p) == '\0';
}

const char *kvt_cli_path(void)
{
    const char *p = getenv("KVDOCK_CLI");

    return p != NULL && p[0] != '\0' ? p : KVDOCK_CLI_PATH;
}

static kvt_cli_result_t cli_va(const char *socket, const char *first, va_list ap)
{
    const char *argv[32];
    kvt_cli_result_t r;
    int n = 0;

    argv[n++] = kvt_cli_path();
    argv[n++] = "--socket";
    argv[n++] = socket != NULL ? socket : kvt_d.socket;
    for (const char *a = first; a != NULL; a = va_arg(ap, const char *)) {
        ck_assert_int_lt(n, 31);
        argv[n++] = a;
    }
    argv[n] = NULL;
    r.rc = kvt_run(argv, &r.out, &r.err, 20000);
    return r;
}

kvt_cli_result_t kvt_cli_at(const char *socket, const char *first, ...)
{
    kvt_cli_result_t r;
    va_list ap;

    va_start(ap, first);
    r = cli_va(socket, first, ap);
    va_end(ap);
    return r;
}

void kvt_cli_free(kvt_cli_result_t *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

void kvt_disk_daemon_start(kvt_daemon_t *d, char *top, char *dir, const char *disk_budget)
{
    const char *extra[] = {"--cache-dir", dir, "--disk-budget", disk_budget, NULL};

    snprintf(top, 64, "/var/tmp/kvd-disk-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(top));
    snprintf(dir, 64, "%s/cache", top);
    ck_assert_int_eq(kvt_daemon_start(d, "cpu", extra, (int)KVT_MS(10000)), 0);
}

void kvt_disk_daemon_stop(kvt_daemon_t *d, const char *top)
{
    const char *rm[] = {"/bin/rm", "-rf", top, NULL};
    char *out = NULL, *err = NULL;

    ck_assert_int_eq(kvt_daemon_stop(d, 10000), 0);
    ck_assert_int_eq(kvt_run(rm, &out, &err, 20000), 0);
    free(out);
    free(err);
}

kvd_cache_spec_t kvt_cache_spec(const char *name, uint32_t layers, uint32_t tokens_per_block,
                                uint32_t token_bytes, uint64_t budget_bytes)
{
    kvd_cache_spec_t s;

    memset(&s, 0, sizeof(s));
    s.name = name;
    s.layout.num_layers = layers;
    s.layout.tokens_per_block = tokens_per_block;
    s.layout.token_bytes = token_bytes;
    snprintf(s.layout.dtype, sizeof(s.layout.dtype), "bf16");
    s.budget_bytes = budget_bytes;
    return s;
}
