/*
 * The Prometheus endpoint (metrics.c): the address parser, and the real
 * kvdockd started with --metrics 127.0.0.1:0 (the bound port read from its
 * log), driven with requests, scraped over HTTP, and every line of the
 * exposition checked: HELP/TYPE syntax, sample and label syntax, families
 * declared before their samples, histogram buckets cumulative and
 * ordered, +Inf == _count; then that the values moved.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "metrics.h"
#include "options.h"

/* ---- the address parser ---------------------------------------------- */

START_TEST(test_parse_addr)
{
    kvd__metrics_addr_t a;
    char err[256];

    ck_assert_int_eq(kvd__metrics_parse_addr("9400", 0, &a, err, sizeof(err)), KVD_OK);
    ck_assert_str_eq(a.host, "127.0.0.1");
    ck_assert_uint_eq(a.port, 9400);
    ck_assert_int_eq(a.loopback, 1);
    ck_assert_int_eq(kvd__metrics_parse_addr("localhost:0", 0, &a, err, sizeof(err)), KVD_OK);
    ck_assert_str_eq(a.host, "127.0.0.1");
    ck_assert_uint_eq(a.port, 0);
    ck_assert_int_eq(kvd__metrics_parse_addr("127.0.0.2:81", 0, &a, err, sizeof(err)), KVD_OK);
    ck_assert_int_eq(kvd__metrics_parse_addr("[::1]:9400", 0, &a, err, sizeof(err)), KVD_OK);
    ck_assert_int_eq(a.family, AF_INET6);
    ck_assert_int_eq(a.loopback, 1);
    /* not loopback: refused unless allowed */
    ck_assert_int_eq(kvd__metrics_parse_addr("0.0.0.0:9400", 0, &a, err, sizeof(err)), KVD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "metrics-allow-remote"));
    ck_assert_int_eq(kvd__metrics_parse_addr("10.1.2.3:9400", 0, &a, err, sizeof(err)), KVD_EINVAL);
    ck_assert_int_eq(kvd__metrics_parse_addr("[::]:9400", 0, &a, err, sizeof(err)), KVD_EINVAL);
    ck_assert_int_eq(kvd__metrics_parse_addr("0.0.0.0:9400", 1, &a, err, sizeof(err)), KVD_OK);
    ck_assert_int_eq(a.loopback, 0);
    /* malformed */
    {
        static const char *const bad[] = {"",           "x",          "65536",    "-1",
                                          ":9400",      "1.2.3.4:",   "host:80",  "::1:80",
                                          "[::1]",      "[::1]9400",  "[]:80",    "127.0.0.1:8x",
                                          "127.0.0.1:123456", "999.0.0.1:80"};
        size_t i;
        for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
            ck_assert_msg(kvd__metrics_parse_addr(bad[i], 1, &a, err, sizeof(err)) == KVD_EINVAL,
                          "'%s' accepted", bad[i]);
    }
}
END_TEST

START_TEST(test_option_checked)
{
    kvd__options_t o;
    char err[256];

    kvd__options_init(&o);
    ck_assert_str_eq(o.metrics, ""); /* off unless asked */
    ck_assert_int_eq(kvd__options_set(&o, "metrics", "0.0.0.0:9400", err, sizeof(err)), KVD_OK);
    ck_assert_int_eq(kvd__options_check(&o, err, sizeof(err)), KVD_EINVAL);
    ck_assert_int_eq(kvd__options_set(&o, "metrics-allow-remote", "yes", err, sizeof(err)), KVD_OK);
    ck_assert_int_eq(kvd__options_check(&o, err, sizeof(err)), KVD_OK);
    /* and the daemon refuses to start with it */
    {
        char dir[] = "/tmp/kvdt-mx-XXXXXX", sock[128];
        const char *const extra[] = {"--metrics", "0.0.0.0:0", NULL};
        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(sock, sizeof(sock), "%s/s.sock", dir);
        ck_assert_int_eq(kvdt_run(sock, extra, KVDT_TIMEOUT_MS), 2);
        rmdir(dir);
    }
}
END_TEST

/* ---- the daemon --------------------------------------------------------- */

static kvdt_daemon_t D;
static int port;

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The port the daemon logged (event=metrics_listening ... port=N). */
static int logged_port(const kvdt_daemon_t *d)
{
    uint64_t deadline = now_ms() + KVDT_TIMEOUT_MS;

    while (now_ms() < deadline) {
        FILE *f = fopen(d->log, "r");
        char line[1024];
        int p = -1;

        if (f != NULL) {
            while (fgets(line, sizeof(line), f) != NULL) {
                char *e = strstr(line, "event=metrics_listening");
                char *q = e ? strstr(e, " port=") : NULL;
                if (q)
                    p = atoi(q + 6);
            }
            fclose(f);
        }
        if (p > 0)
            return p;
        usleep(10000);
    }
    return -1;
}

static void setup(void)
{
    const char *const extra[] = {"--metrics", "127.0.0.1:0", "--host-memory-budget", "64M",
                                 "--hello-timeout-ms", "200", NULL};

    kvdt_start(&D, extra);
    port = logged_port(&D);
    if (port <= 0) {
        kvdt_dump_log(&D);
        ck_abort_msg("no metrics port in the log");
    }
}

static void teardown(void)
{
    ck_assert_int_eq(kvdt_stop(&D), 0);
}

/* Send raw bytes (NULL: the usual GET) and read the whole reply. */
static char *http(const char *request, size_t req_len)
{
    struct sockaddr_in sa;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    uint64_t deadline = now_ms() + KVDT_TIMEOUT_MS;

    ck_assert_int_ge(fd, 0);
    ck_assert_ptr_nonnull(buf);
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    if (request == NULL)
        request = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n";
    if (req_len == 0)
        req_len = strlen(request);
    ck_assert_int_eq(send(fd, request, req_len, MSG_NOSIGNAL), (ssize_t)req_len);
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        ssize_t n;
        int left = (int)(deadline - now_ms());

        ck_assert_msg(left > 0, "no whole reply in time");
        if (poll(&p, 1, left) <= 0)
            continue;
        if (len + 4096 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
        n = recv(fd, buf + len, cap - len - 1, 0);
        if (n < 0 && errno == ECONNRESET)
            break;
        ck_assert_int_ge(n, 0);
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    close(fd);
    return buf;
}

static int status_code(const char *reply)
{
    int code = 0;

    ck_assert_msg(sscanf(reply, "HTTP/1.1 %d ", &code) == 1, "no status line: %.80s", reply);
    return code;
}

/* ---- the exposition parser --------------------------------------------- */

#define MAX_SAMPLES 4096
#define MAX_FAMILIES 128

typedef struct sample {
    char name[96];
    char labels[256]; /* canonical: k="v",k="v" as written */
    char le[128];     /* the le label, if any */
    char rest[224];   /* the labels without le */
    double value;
} sample_t;

typedef struct expo {
    sample_t s[MAX_SAMPLES];
    int n;
    char fam[MAX_FAMILIES][96];
    char type[MAX_FAMILIES][16];
    int nfam;
} expo_t;

static int name_start(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}

static int name_char(int c)
{
    return name_start(c) || (c >= '0' && c <= '9');
}

/* A metric name at *p; advances; 0 if none. */
static int take_name(const char **p, char *out, size_t cap, int allow_colon)
{
    const char *s = *p;
    size_t n = 0;

    if (!name_start((unsigned char)*s) || (!allow_colon && *s == ':'))
        return 0;
    while (name_char((unsigned char)s[n]) && (allow_colon || s[n] != ':'))
        n++;
    if (n >= cap)
        return 0;
    memcpy(out, s, n);
    out[n] = '\0';
    *p = s + n;
    return 1;
}

static int family_index(const expo_t *e, const char *name)
{
    int i;

    for (i = 0; i < e->nfam; i++)
        if (strcmp(e->fam[i], name) == 0)
            return i;
    return -1;
}

static int parse_value(const char *s, double *v)
{
    char *end;

    if (strcmp(s, "+Inf") == 0) {
        *v = INFINITY;
        return 1;
    }
    if (strcmp(s, "-Inf") == 0) {
        *v = -INFINITY;
        return 1;
    }
    if (strcmp(s, "NaN") == 0) {
        *v = NAN;
        return 1;
    }
    if (*s == '\0')
        return 0;
    *v = strtod(s, &end);
    return *end == '\0';
}

/* Parse one sample line into e; fails the test on bad syntax. */
static void parse_sample(expo_t *e, const char *line, int lineno)
{
    sample_t *sm = &e->s[e->n];
    const char *p = line;
    char key[96], val[128], vbuf[64];
    size_t vl;
    int fi;

    ck_assert_msg(e->n < MAX_SAMPLES, "too many samples");
    memset(sm, 0, sizeof(*sm));
    ck_assert_msg(take_name(&p, sm->name, sizeof(sm->name), 1), "line %d: bad metric name: %s",
                  lineno, line);
    if (*p == '{') {
        p++;
        while (*p != '}') {
            size_t n = 0;
            ck_assert_msg(take_name(&p, key, sizeof(key), 0), "line %d: bad label name: %s",
                          lineno, line);
            ck_assert_msg(strncmp(key, "__", 2) != 0, "line %d: reserved label %s", lineno, key);
            ck_assert_msg(*p == '=' && p[1] == '"', "line %d: label without =\": %s", lineno,
                          line);
            p += 2;
            while (*p != '"') {
                ck_assert_msg(*p != '\0' && *p != '\n', "line %d: unterminated label value",
                              lineno);
                if (*p == '\\') {
                    ck_assert_msg(p[1] == '\\' || p[1] == '"' || p[1] == 'n',
                                  "line %d: bad escape in label value", lineno);
                    val[n++] = p[1] == 'n' ? '\n' : p[1];
                    p += 2;
                } else {
                    val[n++] = *p++;
                }
                ck_assert_msg(n < sizeof(val) - 1, "line %d: label value too long", lineno);
            }
            val[n] = '\0';
            p++;
            if (strcmp(key, "le") == 0) {
                snprintf(sm->le, sizeof(sm->le), "%s", val);
            } else {
                size_t rl = strlen(sm->rest);
                snprintf(sm->rest + rl, sizeof(sm->rest) - rl, "%s%s=\"%s\"", rl ? "," : "", key,
                         val);
            }
            {
                size_t ll = strlen(sm->labels);
                snprintf(sm->labels + ll, sizeof(sm->labels) - ll, "%s%s=\"%s\"", ll ? "," : "",
                         key, val);
            }
            if (*p == ',')
                p++;
            else
                ck_assert_msg(*p == '}', "line %d: expected , or }: %s", lineno, line);
        }
        p++;
    }
    ck_assert_msg(*p == ' ', "line %d: no space before the value: %s", lineno, line);
    p++;
    vl = strcspn(p, " ");
    ck_assert_msg(vl > 0 && vl < sizeof(vbuf), "line %d: no value", lineno);
    memcpy(vbuf, p, vl);
    vbuf[vl] = '\0';
    ck_assert_msg(parse_value(vbuf, &sm->value), "line %d: bad value '%s'", lineno, vbuf);
    p += vl;
    if (*p == ' ') { /* optional timestamp: an integer */
        char *end;
        p++;
        (void)strtoll(p, &end, 10);
        ck_assert_msg(end != p && *end == '\0', "line %d: bad timestamp", lineno);
    }
    /* its family was declared (TYPE) before it */
    fi = family_index(e, sm->name);
    if (fi < 0) {
        static const char *const suffix[] = {"_bucket", "_sum", "_count"};
        size_t k, nl = strlen(sm->name);
        for (k = 0; k < 3 && fi < 0; k++) {
            size_t sl = strlen(suffix[k]);
            char base[96];
            if (nl <= sl || strcmp(sm->name + nl - sl, suffix[k]) != 0)
                continue;
            snprintf(base, sizeof(base), "%.*s", (int)(nl - sl), sm->name);
            fi = family_index(e, base);
            if (fi >= 0)
                ck_assert_msg(strcmp(e->type[fi], "histogram") == 0 ||
                                  strcmp(e->type[fi], "summary") == 0,
                              "line %d: %s on a %s", lineno, suffix[k], e->type[fi]);
        }
    } else {
        ck_assert_msg(strcmp(e->type[fi], "histogram") != 0,
                      "line %d: bare sample of histogram %s", lineno, sm->name);
    }
    ck_assert_msg(fi >= 0, "line %d: sample %s of no declared family", lineno, sm->name);
    ck_assert_msg(fi == e->nfam - 1, "line %d: %s is not in its family's block", lineno,
                  sm->name);
    if (strcmp(e->type[fi], "counter") == 0)
        ck_assert_msg(sm->value >= 0, "line %d: negative counter", lineno);
    e->n++;
}

static void parse_exposition(expo_t *e, char *text)
{
    char *line, *save = NULL;
    int lineno = 0, helped = 0;
    size_t len = strlen(text);
    char help_of[96] = "";

    memset(e, 0, sizeof(*e));
    ck_assert_msg(len > 0 && text[len - 1] == '\n', "exposition does not end with a newline");
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        ck_assert_msg(strchr(line, '\r') == NULL, "line %d: carriage return", lineno);
        if (strncmp(line, "# HELP ", 7) == 0) {
            const char *p = line + 7;
            char name[96];
            ck_assert_msg(take_name(&p, name, sizeof(name), 1) && *p == ' ' && p[1] != '\0',
                          "line %d: bad HELP: %s", lineno, line);
            for (p++; *p; p++)
                if (*p == '\\')
                    ck_assert_msg(p[1] == '\\' || p[1] == 'n', "line %d: bad escape in HELP",
                                  lineno), p++;
            snprintf(help_of, sizeof(help_of), "%s", name);
            helped = 1;
        } else if (strncmp(line, "# TYPE ", 7) == 0) {
            const char *p = line + 7;
            char name[96];
            ck_assert_msg(take_name(&p, name, sizeof(name), 1) && *p == ' ',
                          "line %d: bad TYPE: %s", lineno, line);
            p++;
            ck_assert_msg(strcmp(p, "counter") == 0 || strcmp(p, "gauge") == 0 ||
                              strcmp(p, "histogram") == 0 || strcmp(p, "summary") == 0 ||
                              strcmp(p, "untyped") == 0,
                          "line %d: bad type '%s'", lineno, p);
            ck_assert_msg(family_index(e, name) < 0, "line %d: %s declared twice", lineno, name);
            ck_assert_msg(helped && strcmp(help_of, name) == 0, "line %d: %s has no HELP", lineno,
                          name);
            ck_assert_int_lt(e->nfam, MAX_FAMILIES);
            snprintf(e->fam[e->nfam], sizeof(e->fam[0]), "%s", name);
            snprintf(e->type[e->nfam], sizeof(e->type[0]), "%s", p);
            e->nfam++;
            helped = 0;
        } else if (line[0] == '#') {
            continue; /* a comment */
        } else {
            parse_sample(e, line, lineno);
        }
    }
    ck_assert_msg(e->nfam > 10 && e->n > 50, "only %d families, %d samples", e->nfam, e->n);
}

/* Histograms: per series, le ascending, counts cumulative, +Inf last and
 * equal to _count; _sum present. */
static void check_histograms(const expo_t *e)
{
    int f;

    for (f = 0; f < e->nfam; f++) {
        char bucket[120], count[120], sum[120];
        int i, series = 0;

        if (strcmp(e->type[f], "histogram") != 0)
            continue;
        snprintf(bucket, sizeof(bucket), "%s_bucket", e->fam[f]);
        snprintf(count, sizeof(count), "%s_count", e->fam[f]);
        snprintf(sum, sizeof(sum), "%s_sum", e->fam[f]);
        for (i = 0; i < e->n; i++) {
            double prev_le = -INFINITY, prev_v = 0;
            int j, nb = 0, inf = 0, found_count = 0, found_sum = 0;
            double inf_v = 0;

            if (strcmp(e->s[i].name, bucket) != 0)
                continue;
            /* first bucket of a series? */
            for (j = 0; j < i; j++)
                if (strcmp(e->s[j].name, bucket) == 0 && strcmp(e->s[j].rest, e->s[i].rest) == 0)
                    break;
            if (j < i)
                continue;
            series++;
            for (j = i; j < e->n; j++) {
                const sample_t *s = &e->s[j];
                if (strcmp(s->rest, e->s[i].rest) != 0)
                    continue;
                if (strcmp(s->name, bucket) == 0) {
                    double le;
                    ck_assert_msg(s->le[0] != '\0', "%s{%s} without le", bucket, s->rest);
                    ck_assert_msg(parse_value(s->le, &le), "bad le '%s'", s->le);
                    ck_assert_msg(!inf, "%s{%s}: a bucket after +Inf", bucket, s->rest);
                    ck_assert_msg(le > prev_le, "%s{%s}: le %s not ascending", bucket, s->rest,
                                  s->le);
                    ck_assert_msg(s->value >= prev_v, "%s{%s}: le %s count %g < %g", bucket,
                                  s->rest, s->le, s->value, prev_v);
                    prev_le = le;
                    prev_v = s->value;
                    nb++;
                    if (isinf(le)) {
                        inf = 1;
                        inf_v = s->value;
                    }
                } else if (strcmp(s->name, count) == 0) {
                    found_count = 1;
                    ck_assert_msg(inf, "%s{%s} before the +Inf bucket", count, s->rest);
                    ck_assert_msg(s->value == inf_v, "%s{%s} = %g but +Inf bucket = %g", count,
                                  s->rest, s->value, inf_v);
                } else if (strcmp(s->name, sum) == 0) {
                    found_sum = 1;
                    ck_assert_msg(s->value >= 0, "negative %s", sum);
                }
            }
            ck_assert_msg(inf && nb >= 2, "%s{%s}: no +Inf bucket", bucket, e->s[i].rest);
            ck_assert_msg(found_count && found_sum, "%s{%s}: no _count or _sum", e->fam[f],
                          e->s[i].rest);
        }
        ck_assert_msg(series > 0, "histogram %s has no series", e->fam[f]);
    }
}

/* The value of name{labels} (labels as written, without le); -1 if absent. */
static double value_of(const expo_t *e, const char *name, const char *labels)
{
    int i;

    for (i = 0; i < e->n; i++)
        if (strcmp(e->s[i].name, name) == 0 && strcmp(e->s[i].labels, labels) == 0)
            return e->s[i].value;
    return -1;
}

static void scrape(expo_t *e)
{
    char *reply = http(NULL, 0), *body;

    ck_assert_int_eq(status_code(reply), 200);
    ck_assert_ptr_nonnull(strstr(reply, "Content-Type: text/plain; version=0.0.4"));
    body = strstr(reply, "\r\n\r\n");
    ck_assert_ptr_nonnull(body);
    {
        const char *cl = strstr(reply, "Content-Length: ");
        ck_assert_ptr_nonnull(cl);
        ck_assert_uint_eq(strtoull(cl + 16, NULL, 10), strlen(body + 4));
    }
    parse_exposition(e, body + 4);
    check_histograms(e);
    free(reply);
}

static void ping(int fd, uint64_t id)
{
    Kvdock__Request req;
    Kvdock__Ping p = KVDOCK__PING__INIT;

    kvdt_req_init(&req, id);
    req.op_case = KVDOCK__REQUEST__OP_PING;
    req.ping = &p;
    ck_assert_int_eq(kvdt_status_of(fd, &req), 0);
}

static expo_t E1, E2;

START_TEST(test_scrape)
{
    int fd;
    uint64_t pool;
    int i;
    Kvdock__Request req;
    Kvdock__PoolDrop pd = KVDOCK__POOL_DROP__INIT;
    Kvdock__Store s = KVDOCK__STORE__INIT;
    Kvdock__Indices loc = KVDOCK__INDICES__INIT;
    Kvdock__Data kd = KVDOCK__DATA__INIT, vd = KVDOCK__DATA__INIT;
    int64_t slots[] = {0, 3, 5, 7};
    uint8_t k[4 * 64], v[4 * 64];

    /* The daemon may not yet have seen an earlier probe connection close. */
    for (i = 0; i < 200; i++) {
        scrape(&E1);
        if (value_of(&E1, "kvdock_clients", "") == 0)
            break;
        usleep(10000);
    }
    ck_assert(value_of(&E1, "kvdock_build_info", "") < 0); /* it has labels */
    ck_assert_double_eq(value_of(&E1, "kvdock_clients", ""), 0);
    ck_assert_double_eq(value_of(&E1, "kvdock_requests_total", "op=\"ping\""), 0);

    fd = kvdt_client(&D, "metrics-test");
    for (i = 0; i < 5; i++)
        ping(fd, (uint64_t)(10 + i));
    pool = kvdt_pool_create(fd, "mx", 2, 16, 64, 0);
    ck_assert_uint_ne(pool, 0);
    /* a request that fails */
    kvdt_req_init(&req, 30);
    pd.pool = 999999;
    req.op_case = KVDOCK__REQUEST__OP_POOL_DROP;
    req.pool_drop = &pd;
    ck_assert_int_eq(kvdt_status_of(fd, &req), KVD_ENOENT);
    /* data moved on a stream */
    memset(k, 1, sizeof(k));
    memset(v, 2, sizeof(v));
    loc.n_values = 4;
    loc.values = slots;
    kd.inline_.data = k;
    kd.inline_.len = sizeof(k);
    vd.inline_.data = v;
    vd.inline_.len = sizeof(v);
    s.pool = pool;
    s.layer = 1;
    s.loc = &loc;
    s.k = &kd;
    s.v = &vd;
    kvdt_req_init(&req, 31);
    req.op_case = KVDOCK__REQUEST__OP_STORE;
    req.store = &s;
    ck_assert_int_eq(kvdt_status_of(fd, &req), 0);

    /* a cache, looked up once: its figures, labelled by name and owner */
    {
        Kvdock__CacheCreate cc = KVDOCK__CACHE_CREATE__INIT;
        Kvdock__CacheLayout cl = KVDOCK__CACHE_LAYOUT__INIT;
        Kvdock__CacheLookup lk = KVDOCK__CACHE_LOOKUP__INIT;
        Kvdock__CacheKeys ks = KVDOCK__CACHE_KEYS__INIT;
        Kvdock__Response *r;
        uint8_t keys[3][8] = {"key-one", "key-two", "key-thr"};

        cl.num_layers = 2;
        cl.tokens_per_block = 4;
        cl.token_bytes = 64;
        cl.dtype = "bf16";
        cc.name = "mxc";
        cc.layout = &cl;
        cc.budget_bytes = 16 * 2 * 2 * 4 * 64;
        kvdt_req_init(&req, 32);
        req.op_case = KVDOCK__REQUEST__OP_CACHE_CREATE;
        req.cache_create = &cc;
        kvdt_send(fd, &req, NULL, 0);
        r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
        ck_assert_msg(r->status == 0, "cache_create: %u %s", r->status, r->message);
        ck_assert_uint_eq(r->cache->capacity, 16);
        lk.cache = r->cache->id;
        kvdock__response__free_unpacked(r, NULL);
        ks.blob.data = &keys[0][0];
        ks.blob.len = sizeof(keys);
        ks.key_size = 8;
        lk.keys = &ks;
        kvdt_req_init(&req, 33);
        req.op_case = KVDOCK__REQUEST__OP_CACHE_LOOKUP;
        req.cache_lookup = &lk;
        ck_assert_int_eq(kvdt_status_of(fd, &req), 0);
    }

    /* a connection that never says hello, closed at its deadline, counted */
    {
        int silent = kvdt_connect(D.sock);
        ck_assert_int_ge(silent, 0);
        ck_assert(kvdt_closed(silent, 3000));
        close(silent);
    }
    scrape(&E2);
    ck_assert_double_eq(value_of(&E2, "kvdock_connections_dropped_total",
                                 "reason=\"hello_timeout\""), 1);
    ck_assert_double_eq(value_of(&E2, "kvdock_connections_dropped_total",
                                 "reason=\"frame_timeout\""), 0);
    {
        char lab[64];
        snprintf(lab, sizeof(lab), "cache=\"mxc\",owner=\"%u\"", (unsigned)getuid());
        ck_assert_double_eq(value_of(&E2, "kvdock_cache_lookups_total", lab), 1);
        ck_assert_double_eq(value_of(&E2, "kvdock_cache_requested_tokens_total", lab), 12);
        ck_assert_double_eq(value_of(&E2, "kvdock_cache_hit_tokens_total", lab), 0);
        ck_assert_double_eq(value_of(&E2, "kvdock_cache_capacity_blocks", lab), 16);
        ck_assert_double_eq(value_of(&E2, "kvdock_cache_blocks", lab), 0);
        ck_assert_double_eq(value_of(&E2, "kvdock_cache_budget_bytes", lab), 16 * 1024);
    }
    ck_assert_double_eq(value_of(&E2, "kvdock_host_memory_budget_bytes", ""), 64 << 20);
    ck_assert_double_eq(value_of(&E2, "kvdock_host_memory_bytes", "kind=\"pools\""), 4096);
    ck_assert_double_eq(value_of(&E2, "kvdock_host_memory_limit_bytes", "kind=\"pools\""),
                        64 << 20);
    ck_assert_double_eq(value_of(&E2, "kvdock_host_memory_refused_total", "kind=\"pools\""), 0);
    ck_assert_double_eq(value_of(&E2, "kvdock_requests_total", "op=\"ping\""), 5);
    ck_assert_double_eq(value_of(&E2, "kvdock_request_duration_seconds_count", "op=\"ping\""), 5);
    ck_assert_double_eq(
        value_of(&E2, "kvdock_request_duration_seconds_bucket", "op=\"ping\",le=\"+Inf\""), 5);
    ck_assert(value_of(&E2, "kvdock_request_duration_seconds_sum", "op=\"ping\"") > 0);
    ck_assert_double_eq(value_of(&E2, "kvdock_requests_total", "op=\"hello\""), 1);
    ck_assert_double_eq(value_of(&E2, "kvdock_request_errors_total", "op=\"pool_drop\""), 1);
    ck_assert_double_eq(value_of(&E2, "kvdock_requests_total", "op=\"store\""), 1);
    ck_assert_double_eq(value_of(&E2, "kvdock_request_bytes_total", "op=\"store\""), 2 * 4 * 64);
    ck_assert_double_eq(value_of(&E2, "kvdock_stream_launches_total", "stream=\"write\""), 1);
    ck_assert_double_eq(value_of(&E2, "kvdock_stream_queue_depth", "stream=\"write\""), 0);
    ck_assert(value_of(&E2, "kvdock_stream_busy_seconds_total", "stream=\"write\"") >= 0);
    ck_assert_double_eq(value_of(&E2, "kvdock_clients", ""), 1);
    ck_assert(value_of(&E2, "kvdock_connections_total", "") >= 1); /* kvdt_start probes too */
    ck_assert_double_eq(value_of(&E2, "kvdock_pools", "kind=\"host\""), 1);
    ck_assert_double_eq(value_of(&E2, "kvdock_pool_bytes", "kind=\"host\""), 2 * 2 * 16 * 64);
    ck_assert_double_eq(value_of(&E2, "kvdock_pool_bytes", "kind=\"device\""), 0);
    ck_assert(value_of(&E2, "kvdock_socket_received_bytes_total", "") >
              value_of(&E1, "kvdock_socket_received_bytes_total", ""));
    ck_assert_double_eq(value_of(&E2, "kvdock_inflight_requests", ""), 0);
    ck_assert(value_of(&E2, "kvdock_metrics_scrapes_total", "") >= 2);
    ck_assert(value_of(&E2, "kvdock_uptime_seconds", "") >=
              value_of(&E1, "kvdock_uptime_seconds", ""));
    {
        int found = 0;
        for (i = 0; i < E2.n; i++)
            if (strcmp(E2.s[i].name, "kvdock_build_info") == 0) {
                found = 1;
                ck_assert_double_eq(E2.s[i].value, 1);
                ck_assert_ptr_nonnull(strstr(E2.s[i].labels, "backend=\"cpu\""));
                ck_assert_ptr_nonnull(strstr(E2.s[i].labels, "version=\""));
            }
        ck_assert(found);
    }
    /* every counter moved forward or stayed */
    for (i = 0; i < E1.n; i++) {
        int f = -1, j;
        for (j = 0; j < E1.nfam; j++)
            if (strncmp(E1.s[i].name, E1.fam[j], strlen(E1.fam[j])) == 0 &&
                strcmp(E1.type[j], "counter") == 0)
                f = j;
        if (f >= 0) {
            double v2 = value_of(&E2, E1.s[i].name, E1.s[i].labels);
            ck_assert_msg(v2 >= E1.s[i].value, "%s{%s} went back", E1.s[i].name,
                          E1.s[i].labels);
        }
    }
    /* the connection goes: the gauge follows */
    close(fd);
    {
        uint64_t deadline = now_ms() + KVDT_TIMEOUT_MS;
        for (;;) {
            scrape(&E1);
            if (value_of(&E1, "kvdock_clients", "") == 0)
                break;
            ck_assert_msg(now_ms() < deadline, "kvdock_clients stays at 1");
            usleep(10000);
        }
        ck_assert_double_eq(value_of(&E1, "kvdock_pools", "kind=\"host\""), 0);
    }
}
END_TEST

START_TEST(test_http_errors)
{
    static const struct {
        const char *req;
        int code;
    } cases[] = {
        {"GET / HTTP/1.1\r\n\r\n", 404},
        {"GET /metricsx HTTP/1.1\r\n\r\n", 404},
        {"GET /metrics/ HTTP/1.0\r\n\r\n", 404},
        {"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405},
        {"DELETE /metrics HTTP/1.1\r\n\r\n", 405},
        {"GET /metrics HTTP/2.0\r\n\r\n", 505},
        {"GET /metrics\r\n\r\n", 400},
        {"GET  /metrics HTTP/1.1\r\n\r\n", 400},
        {"\x01\x02\x03 / HTTP/1.1\r\n\r\n", 400},
        {"GET /metrics FTP/1.1\r\n\r\n", 400},
        {"GET /metrics?name[]=x HTTP/1.1\n\n", 200},
        {"HEAD /metrics HTTP/1.0\r\n\r\n", 200},
    };
    size_t i;
    char *reply;
    char *big;
    int fd;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        reply = http(cases[i].req, 0);
        ck_assert_msg(status_code(reply) == cases[i].code, "'%s' got %.40s, expected %d",
                      cases[i].req, reply, cases[i].code);
        ck_assert_ptr_nonnull(strstr(reply, "Connection: close\r\n"));
        if (strncmp(cases[i].req, "HEAD", 4) == 0)
            ck_assert_str_eq(strstr(reply, "\r\n\r\n"), "\r\n\r\n");
        free(reply);
    }
    /* a head past the limit */
    big = malloc(KVD_METRICS_MAX_REQUEST + 100);
    ck_assert_ptr_nonnull(big);
    memcpy(big, "GET /metrics HTTP/1.1\r\nX-Pad: ", 30);
    memset(big + 30, 'a', KVD_METRICS_MAX_REQUEST + 70);
    reply = http(big, KVD_METRICS_MAX_REQUEST + 100);
    ck_assert_int_eq(status_code(reply), 431);
    free(reply);
    free(big);
    /* a scraper that connects and says nothing, or half a request, then
     * goes: nothing breaks */
    {
        struct sockaddr_in sa;
        int s1 = socket(AF_INET, SOCK_STREAM, 0), s2 = socket(AF_INET, SOCK_STREAM, 0);
        memset(&sa, 0, sizeof(sa));
        sa.sin_family = AF_INET;
        sa.sin_port = htons((uint16_t)port);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ck_assert_int_eq(connect(s1, (struct sockaddr *)&sa, sizeof(sa)), 0);
        ck_assert_int_eq(connect(s2, (struct sockaddr *)&sa, sizeof(sa)), 0);
        ck_assert_int_eq(send(s2, "GET /met", 8, 0), 8);
        close(s2);
        reply = http(NULL, 0); /* served while s1 is open */
        ck_assert_int_eq(status_code(reply), 200);
        free(reply);
        close(s1);
    }
    /* the daemon still serves its clients */
    fd = kvdt_client(&D, "after-http-errors");
    ping(fd, 1);
    close(fd);
}
END_TEST

/* The disk level (--cache-dir): the daemon's figures (a directory there
 * it could not reopen counted), and each cache's that has one, in
 * families the exposition parser accepts. */
START_TEST(test_disk_level)
{
    char dir[512], cmd[1100];
    const char *const extra[] = {"--metrics", "127.0.0.1:0", "--host-memory-budget", "64M",
                                 "--cache-dir", dir, "--disk-budget", "32M", NULL};
    Kvdock__Request req;
    Kvdock__CacheCreate cc = KVDOCK__CACHE_CREATE__INIT;
    Kvdock__CacheLayout cl = KVDOCK__CACHE_LAYOUT__INIT;
    Kvdock__Response *r;
    int fd;

    snprintf(dir, sizeof(dir), "%s/metrics-disk-%d", KVD_TEST_SCRATCH, (int)getpid());
    snprintf(cmd, sizeof(cmd), "%s/junk", dir);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(mkdir(cmd, 0700), 0); /* no manifest: not reopened, and counted */
    kvdt_start(&D, extra);
    port = logged_port(&D);
    ck_assert_int_gt(port, 0);
    scrape(&E1);
    ck_assert_double_eq(value_of(&E1, "kvdock_disk_skipped_caches", ""), 1);
    ck_assert_double_eq(value_of(&E1, "kvdock_disk_budget_bytes", ""), 32.0 * 1048576);
    ck_assert_double_eq(value_of(&E1, "kvdock_disk_reserved_bytes", ""), 0);
    ck_assert_double_eq(value_of(&E1, "kvdock_disk_used_bytes", ""), 0);
    ck_assert(value_of(&E1, "kvdock_disk_free_bytes", "") > 0);
    ck_assert_int_ge(family_index(&E1, "kvdock_cache_disk_blocks"), 0);
    ck_assert_int_ge(family_index(&E1, "kvdock_cache_disk_no_space_total"), 0);
    ck_assert_int_ge(family_index(&E1, "kvdock_cache_disk_checksum_failures_total"), 0);

    fd = kvdt_client(&D, "metrics-disk");
    cl.num_layers = 2;
    cl.tokens_per_block = 4;
    cl.token_bytes = 64;
    cl.dtype = "bf16";
    cc.name = "dk";
    cc.layout = &cl;
    cc.budget_bytes = 16 * 2 * 2 * 4 * 64;
    cc.disk_budget_bytes = 8u << 20;
    kvdt_req_init(&req, 5);
    req.op_case = KVDOCK__REQUEST__OP_CACHE_CREATE;
    req.cache_create = &cc;
    r = kvdt_call(fd, &req);
    scrape(&E2);
    if (r->status == 0) {
        char labels[64];
        snprintf(labels, sizeof(labels), "cache=\"dk\",owner=\"%u\"", (unsigned)geteuid());
        ck_assert_double_eq(value_of(&E2, "kvdock_disk_reserved_bytes", ""), 8.0 * 1048576);
        ck_assert_double_eq(value_of(&E2, "kvdock_cache_disk_budget_bytes", labels),
                            8.0 * 1048576);
        ck_assert_double_eq(value_of(&E2, "kvdock_cache_disk_blocks", labels), 0);
        ck_assert_double_eq(value_of(&E2, "kvdock_cache_disk_spills_total", labels), 0);
    } else { /* a store without a disk level yet: refused, nothing reserved */
        ck_assert_uint_eq(r->status, KVD_ENOTSUP);
        ck_assert_double_eq(value_of(&E2, "kvdock_disk_reserved_bytes", ""), 0);
    }
    kvdock__response__free_unpacked(r, NULL);
    close(fd);
    ck_assert_int_eq(kvdt_stop(&D), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *metrics_suite(void)
{
    Suite *s = suite_create("metrics");
    TCase *unit = tcase_create("address");
    TCase *tc = tcase_create("endpoint");
    TCase *disk;

    tcase_add_test(unit, test_parse_addr);
    tcase_add_test(unit, test_option_checked);
    suite_add_tcase(s, unit);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_scrape);
    tcase_add_test(tc, test_http_errors);
    suite_add_tcase(s, tc);
    disk = tcase_create("disk");
    tcase_add_test(disk, test_disk_level);
    suite_add_tcase(s, disk);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(metrics_suite());
    int failed;

    signal(SIGPIPE, SIG_IGN);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
