/* The cluster's configuration: see config.h. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include "log.h"
#include "stats.h"

void kvd__clc_random(uint8_t *p, size_t n)
{
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    size_t got = 0;

    while (fd >= 0 && got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (fd >= 0)
        close(fd);
    if (got < n) { /* never on Linux; still no predictable nonce from a bad day */
        uint64_t t = kvd__now_ns() ^ (uint64_t)getpid() << 32;
        for (size_t i = got; i < n; i++)
            p[i] = (uint8_t)((t >> (8 * (i & 7))) ^ i);
    }
}

/* proof = BLAKE2s(key; label || a || b) */
void kvd__clc_prove(const kvd__cl_config_t *cl, const char *label, const uint8_t *a,
                    const uint8_t *b, uint8_t out[KVD_BLAKE2S_BYTES])
{
    kvd__b2s_t s;

    kvd__b2s_init(&s, cl->key, sizeof(cl->key));
    kvd__b2s_update(&s, label, strlen(label));
    kvd__b2s_update(&s, a, KVD_CL_NONCE);
    kvd__b2s_update(&s, b, KVD_CL_NONCE);
    kvd__b2s_final(&s, out);
}

int kvd__clc_same(const uint8_t *a, const uint8_t *b, size_t n)
{
    uint8_t d = 0; /* every byte compared: no early exit to time */

    for (size_t i = 0; i < n; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

/* "HOST:PORT" (HOST a name, an IPv4 address or [IPv6]) to a socket address. */
static kvd_status_t resolve(const char *text, struct sockaddr_storage *sa, socklen_t *len,
                            char *why, size_t why_len)
{
    char host[128];
    const char *colon = strrchr(text, ':'), *h = text;
    size_t hl;
    struct addrinfo hints, *res = NULL;
    int rc;

    if (colon == NULL || colon == text || colon[1] == '\0') {
        snprintf(why, why_len, "'%s' is not HOST:PORT", text);
        return KVD_EINVAL;
    }
    hl = (size_t)(colon - text);
    if (text[0] == '[' && colon[-1] == ']') {
        h = text + 1;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof(host)) {
        snprintf(why, why_len, "'%s' is not HOST:PORT", text);
        return KVD_EINVAL;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if ((rc = getaddrinfo(host, colon + 1, &hints, &res)) != 0 || res == NULL) {
        snprintf(why, why_len, "cannot resolve '%s': %s", text, gai_strerror(rc));
        return KVD_EINVAL;
    }
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return KVD_OK;
}

/* A cluster address UCX can carry.  UCX 1.13's TCP transport (Debian 12's,
 * which kvdockd links) fails over IPv6: the data connections of an endpoint
 * made to an IPv6 address go to IPv4 listeners and are refused, and with
 * UCX_TCP_AF_PRIO=inet6 its connect overruns a heap buffer (seen under
 * ASan); later versions are let through. */
static kvd_status_t usable_family(const struct sockaddr_storage *sa, const char *text, char *why,
                                  size_t why_len)
{
    unsigned major = 0, minor = 0, release = 0;

    if (sa->ss_family != AF_INET6)
        return KVD_OK;
    ucp_get_version(&major, &minor, &release);
    if (major > 1 || (major == 1 && minor > 13))
        return KVD_OK;
    snprintf(why, why_len, "'%s' is an IPv6 address: the UCX this kvdockd is built with "
             "(%u.%u.%u) cannot carry a cluster over IPv6; use IPv4 addresses", text, major,
             minor, release);
    return KVD_EINVAL;
}

static int same_addr(const struct sockaddr_storage *a, socklen_t al,
                     const struct sockaddr_storage *b, socklen_t bl)
{
    return al == bl && memcmp(a, b, al) == 0;
}

static kvd_status_t next_item(const char **s, char *item, size_t len)
{
    const char *p = *s;
    size_t n = strcspn(p, ","), a = 0, b = n;

    if (*p == '\0')
        return KVD_ENOENT;
    while (a < b && (p[a] == ' ' || p[a] == '\t'))
        a++;
    while (b > a && (p[b - 1] == ' ' || p[b - 1] == '\t' || p[b - 1] == '\r'))
        b--;
    if (b - a >= len)
        return KVD_ELIMIT;
    memcpy(item, p + a, b - a);
    item[b - a] = '\0';
    *s = p + n + (p[n] == ',');
    return KVD_OK;
}

/* The address's bytes and family, an IPv4 address mapped into IPv6 as IPv4. */
int kvd__clc_addr_bytes(const struct sockaddr_storage *s, uint8_t out[16])
{
    if (s->ss_family == AF_INET) {
        memcpy(out, &((const struct sockaddr_in *)s)->sin_addr, 4);
        return AF_INET;
    }
    if (s->ss_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)s)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) {
            memcpy(out, a6->s6_addr + 12, 4);
            return AF_INET;
        }
        memcpy(out, a6->s6_addr, 16);
        return AF_INET6;
    }
    return AF_UNSPEC;
}

int kvd__clc_allowed(const kvd__cl_config_t *cl, const struct sockaddr_storage *from)
{
    uint8_t b[16];
    int family = kvd__clc_addr_bytes(from, b);

    if (cl->allow_any)
        return 1;
    for (uint32_t i = 0; i < cl->nallow; i++) {
        const struct kvd__cl_allow *n = &cl->allow[i];
        unsigned full = n->bits / 8, rest = n->bits % 8;
        if (n->family != family || memcmp(n->addr, b, full) != 0)
            continue;
        if (rest == 0 || ((n->addr[full] ^ b[full]) & (uint8_t)(0xff00u >> rest)) == 0)
            return 1;
    }
    return 0;
}

static kvd_status_t allow_add(kvd__cl_config_t *cl, const struct sockaddr_storage *sa, int bits,
                              const char *item, char *why, size_t why_len)
{
    struct kvd__cl_allow *n;
    int family;

    if (cl->nallow >= KVD_CL_MAX_ALLOW) {
        snprintf(why, why_len, "cluster-allow-from: more than %d addresses", KVD_CL_MAX_ALLOW);
        return KVD_ELIMIT;
    }
    n = &cl->allow[cl->nallow];
    family = kvd__clc_addr_bytes(sa, n->addr);
    if (family == AF_UNSPEC || bits > (family == AF_INET ? 32 : 128)) {
        snprintf(why, why_len, "cluster-allow-from: '%s' is not ADDRESS or ADDRESS/BITS", item);
        return KVD_EINVAL;
    }
    n->family = family;
    n->bits = bits < 0 ? (family == AF_INET ? 32u : 128u) : (unsigned)bits;
    cl->nallow++;
    return KVD_OK;
}

/* --cluster-allow-from, once the peers are known. */
static kvd_status_t allow_parse(kvd__cl_config_t *cl, const char *list, char *why, size_t why_len)
{
    const char *s = list;
    char item[128];
    kvd_status_t st;

    while ((st = next_item(&s, item, sizeof(item))) == KVD_OK) {
        char *slash, *end;
        struct sockaddr_storage sa;
        int bits = -1;

        if (item[0] == '\0')
            continue;
        if (strcmp(item, "any") == 0) {
            cl->allow_any = 1;
            continue;
        }
        if (strcmp(item, "peers") == 0) {
            for (uint32_t i = 0; i < cl->npeers; i++)
                if ((st = allow_add(cl, &cl->peers[i].sa, -1, item, why, why_len)) != KVD_OK)
                    return st;
            continue;
        }
        memset(&sa, 0, sizeof(sa));
        if ((slash = strchr(item, '/')) != NULL) {
            long v = strtol(slash + 1, &end, 10);
            if (slash[1] == '\0' || *end != '\0' || v < 0 || v > 128) {
                snprintf(why, why_len, "cluster-allow-from: '%s' is not ADDRESS or ADDRESS/BITS",
                         item);
                return KVD_EINVAL;
            }
            bits = (int)v;
            *slash = '\0';
        }
        if (inet_pton(AF_INET, item, &((struct sockaddr_in *)&sa)->sin_addr) == 1)
            sa.ss_family = AF_INET;
        else if (inet_pton(AF_INET6, item, &((struct sockaddr_in6 *)&sa)->sin6_addr) == 1)
            sa.ss_family = AF_INET6;
        if (slash != NULL)
            *slash = '/';
        if ((st = allow_add(cl, &sa, bits, item, why, why_len)) != KVD_OK)
            return st;
    }
    if (st == KVD_ELIMIT) {
        snprintf(why, why_len, "cluster-allow-from: an item is too long");
        return KVD_EINVAL;
    }
    return KVD_OK;
}

/* The numeric host of a socket address. */
void kvd__clc_addr_text(const struct sockaddr_storage *s, char *out, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";

    if (s->ss_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)s)->sin_addr, host, sizeof(host));
    else if (s->ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)s)->sin6_addr, host, sizeof(host));
    snprintf(out, len, "%s", host);
}

static kvd_status_t read_secret(kvd__cl_config_t *cl, const char *path, char *why, size_t why_len)
{
    uint8_t buf[4097];
    struct stat sb;
    ssize_t n;
    size_t len;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    kvd__b2s_t s;

    if (fd < 0) {
        snprintf(why, why_len, "cluster-secret-file %s: %s", path, strerror(errno));
        return KVD_EINVAL;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        snprintf(why, why_len, "cluster-secret-file %s is not a regular file", path);
        return KVD_EINVAL;
    }
    if (sb.st_mode & 077) {
        close(fd);
        snprintf(why, why_len, "cluster-secret-file %s is readable by others (mode %03o): "
                 "chmod 600 it", path, (unsigned)(sb.st_mode & 0777));
        return KVD_EPERM;
    }
    n = read(fd, buf, sizeof(buf));
    close(fd);
    len = n > 0 ? (size_t)n : 0;
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' '))
        len--;
    if (n < 0 || len < 16 || (size_t)n > 4096) {
        snprintf(why, why_len, "cluster-secret-file %s: the secret must be 16 to 4,096 bytes "
                 "(head -c 32 /dev/urandom | base64 > FILE)", path);
        return KVD_EINVAL;
    }
    kvd__b2s_init(&s, NULL, 0);
    kvd__b2s_update(&s, buf, len);
    kvd__b2s_final(&s, cl->key);
    memset(buf, 0, sizeof(buf));
    return KVD_OK;
}

static kvd_status_t add_peer(kvd__cl_config_t *cl, const char *text, char *why, size_t why_len)
{
    kvd__cl_addr_t *p;
    struct sockaddr_storage sa;
    socklen_t len = 0;
    kvd_status_t st;

    if (text[0] == '\0')
        return KVD_OK;
    if ((st = resolve(text, &sa, &len, why, why_len)) != KVD_OK ||
        (st = usable_family(&sa, text, why, why_len)) != KVD_OK)
        return st;
    if (same_addr(&sa, len, &cl->listen_sa, cl->listen_salen) || strcmp(text, cl->node) == 0)
        return KVD_OK; /* this daemon itself */
    for (uint32_t i = 0; i < cl->npeers; i++)
        if (same_addr(&sa, len, &cl->peers[i].sa, cl->peers[i].salen))
            return KVD_OK; /* listed twice */
    if (cl->npeers >= KVD_CL_MAX_PEERS) {
        snprintf(why, why_len, "more than %d cluster peers", KVD_CL_MAX_PEERS);
        return KVD_ELIMIT;
    }
    p = &cl->peers[cl->npeers++];
    snprintf(p->text, sizeof(p->text), "%s", text);
    p->sa = sa;
    p->salen = len;
    return KVD_OK;
}

static kvd_status_t add_peers(kvd__cl_config_t *cl, const char *list, char *why, size_t why_len)
{
    char item[256];
    const char *s = list;
    kvd_status_t st;

    while ((st = next_item(&s, item, sizeof(item))) == KVD_OK)
        if (item[0] != '\0' && (st = add_peer(cl, item, why, why_len)) != KVD_OK)
            return st;
    if (st == KVD_ELIMIT) {
        snprintf(why, why_len, "a cluster peer address is too long");
        return KVD_EINVAL;
    }
    return KVD_OK;
}

static kvd_status_t read_peers_file(kvd__cl_config_t *cl, const char *path, char *why,
                                    size_t why_len)
{
    FILE *f = fopen(path, "re");
    char line[512];
    kvd_status_t st = KVD_OK;
    unsigned lineno = 0;

    if (f == NULL) {
        snprintf(why, why_len, "cluster-peers-file %s: %s", path, strerror(errno));
        return KVD_EINVAL;
    }
    while (st == KVD_OK && fgets(line, sizeof(line), f) != NULL) {
        char *hash;
        lineno++;
        if (strchr(line, '\n') == NULL && !feof(f)) { /* longer: it would split an address */
            snprintf(why, why_len, "cluster-peers-file %s: line %u is over %zu bytes", path,
                     lineno, sizeof(line) - 2);
            st = KVD_EINVAL;
            break;
        }
        hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        line[strcspn(line, "\r\n")] = '\0';
        st = add_peers(cl, line, why, why_len);
    }
    fclose(f);
    return st;
}

kvd_status_t kvd__clc_read(kvd__cl_config_t *cl, const kvd__options_t *o, char *why,
                           size_t why_len)
{
    kvd_status_t st;

    memset(cl, 0, sizeof(*cl));
    cl->deadline_ns = o->cluster_deadline_ms * 1000000ull;
    snprintf(cl->node, sizeof(cl->node), "%s", o->cluster_listen);
    if ((st = resolve(o->cluster_listen, &cl->listen_sa, &cl->listen_salen, why, why_len)) !=
            KVD_OK ||
        (st = usable_family(&cl->listen_sa, o->cluster_listen, why, why_len)) != KVD_OK ||
        (st = read_secret(cl, o->cluster_secret_file, why, why_len)) != KVD_OK ||
        (st = add_peers(cl, o->cluster_peers, why, why_len)) != KVD_OK ||
        (o->cluster_peers_file[0] != '\0' &&
         (st = read_peers_file(cl, o->cluster_peers_file, why, why_len)) != KVD_OK) ||
        (st = allow_parse(cl, o->cluster_allow_from, why, why_len)) != KVD_OK)
        return st;
    return KVD_OK;
}
