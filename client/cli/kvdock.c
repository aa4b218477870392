/*
 * kvdock: the admin CLI of kvdockd, on libkvdock.
 *
 *   kvdock [--socket PATH] [--json] COMMAND [ARGS]
 *
 * Human-readable tables by default, one JSON object with --json.  Exit
 * status: 0 on success, 1 when the daemon (or the connection) reports an
 * error, 2 on a usage error.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "bench_util.h"
#include "cache.h"
#include "top.h"
#include "util.h"
#include "kvdock/client.h"
#include "kvdock/wire.h"

#define EXIT_DAEMON 1
#define EXIT_USAGE 2

typedef struct opts {
    const char *socket;
    bool json;
    bool help;
    int argc; /* what is left: the command and its arguments */
    char **argv;
} opts_t;

typedef int (*cmd_fn)(opts_t *o);

typedef struct cmd {
    const char *name;
    const char *usage;
    const char *help;
    cmd_fn run;
} cmd_t;

static const cmd_t *find_cmd(const char *name);
static void print_usage(FILE *f);

/* ------------------------------------------------------------------------ */
/* Errors and output helpers                                                 */

static int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    const cmd_t *c = cmd != NULL ? find_cmd(cmd) : NULL;

    fputs("kvdock: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (c != NULL)
        fprintf(stderr, "usage: kvdock %s\n", c->usage);
    else
        fprintf(stderr, "run 'kvdock --help' for the commands\n");
    return EXIT_USAGE;
}

static int daemon_error(kvd_client_t *cli, kvd_status_t st, const char *what)
{
    const char *msg = kvd_client_last_error(cli);

    fprintf(stderr, "kvdock: %s: %s: %s\n", what, kvd_err_name(st),
            msg[0] != '\0' ? msg : kvd_strerror(st));
    return EXIT_DAEMON;
}

static int connect_or_fail(const opts_t *o, kvd_client_t **cli)
{
    kvd_status_t st = kvd_client_create(o->socket, "kvdock-cli", cli);

    if (st != KVD_OK) {
        fprintf(stderr, "kvdock: %s: %s\n", kvd_err_name(st), kvd_client_last_error(NULL));
        return EXIT_DAEMON;
    }
    return 0;
}

static void human_duration_ms(char *buf, size_t cap, uint64_t ms)
{
    uint64_t s = ms / 1000;

    if (s >= 86400)
        snprintf(buf, cap, "%" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m", s / 86400,
                 s % 86400 / 3600, s % 3600 / 60);
    else if (s >= 3600)
        snprintf(buf, cap, "%" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s", s / 3600, s % 3600 / 60,
                 s % 60);
    else if (s >= 60)
        snprintf(buf, cap, "%" PRIu64 "m %02" PRIu64 "s", s / 60, s % 60);
    else
        snprintf(buf, cap, "%" PRIu64 ".%03" PRIu64 " s", s, ms % 1000);
}

/* The value of option argv[*i] ("--x V" or "--x=V"); NULL if missing. */
static const char *opt_value(opts_t *o, int *i, const char *name)
{
    return kvd__cli_opt_value(o->argc, o->argv, i, name);
}

/* ------------------------------------------------------------------------ */
/* status                                                                    */

/* A kvd_copy_path_t as a word. */
static const char *path_name(int path)
{
    return path == KVD_PATH_COPY_ENGINE ? "copy-engine" : path == KVD_PATH_KERNEL ? "kernel"
                                                                                  : "default";
}

static const char *const stream_names[KVD_STREAM_END] = {"default", "reload", "write", "offload",
                                                         "d2d"};

#define MAX_CLIENTS_SHOWN 1024

static int cmd_status(opts_t *o)
{
    kvd_client_t *cli = NULL;
    kvd_daemon_status_t s;
    kvd_client_entry_t *cl = NULL;
    const kvd_hello_info_t *h;
    kvd_status_t st;
    int rc;

    if (o->argc > 1)
        return usage_error("status", "unexpected argument '%s'", o->argv[1]);
    rc = connect_or_fail(o, &cli);
    if (rc != 0)
        return rc;
    cl = calloc(MAX_CLIENTS_SHOWN, sizeof(*cl));
    if (cl == NULL) {
        kvd_client_destroy(&cli);
        fprintf(stderr, "kvdock: out of memory\n");
        return EXIT_DAEMON;
    }
    st = kvd_daemon_status(cli, &s, cl, MAX_CLIENTS_SHOWN);
    if (st != KVD_OK) {
        rc = daemon_error(cli, st, "status");
        goto out;
    }
    h = kvd_client_info(cli);
    size_t shown = s.num_clients < MAX_CLIENTS_SHOWN ? s.num_clients : MAX_CLIENTS_SHOWN;

    if (o->json) {
        printf("{\"daemon_version\":");
        kvd__cli_json_str(s.daemon_version);
        printf(",\"protocol_version\":%u,\"backend\":", h->protocol_version);
        kvd__cli_json_str(kvd_backend_name(s.backend));
        printf(",\"device_name\":");
        kvd__cli_json_str(s.device_name);
        printf(",\"device_ordinal\":%d,\"daemon_pid\":%u,\"socket_path\":", h->device_ordinal,
               h->daemon_pid);
        kvd__cli_json_str(s.socket_path[0] ? s.socket_path : kvd_client_socket_path(cli));
        printf(",\"uptime_ms\":%" PRIu64 ",\"clients\":%u,\"pools\":%u,\"pool_bytes\":%" PRIu64
               ",\"buffers\":%u,\"events\":%u,\"inflight\":%u,\"shutting_down\":%s",
               s.uptime_ms, s.clients, s.pools, s.pool_bytes, s.buffers, s.events, s.inflight,
               s.shutting_down ? "true" : "false");
        printf(",\"limits\":{\"max_frame_bytes\":%" PRIu64 ",\"max_inflight\":%u,\"max_pools\":%u,"
               "\"max_pool_bytes\":%" PRIu64 ",\"max_total_pool_bytes\":%" PRIu64
               ",\"max_inline_bytes\":%u}",
               h->limits.max_frame_bytes, h->limits.max_inflight, h->limits.max_pools,
               h->limits.max_pool_bytes, h->limits.max_total_pool_bytes,
               h->limits.max_inline_bytes);
        printf(",\"host_memory\":{\"budget\":%" PRIu64 ",\"used\":%" PRIu64
               ",\"available\":%" PRIu64 ",\"machine\":%" PRIu64 ",\"kinds\":[",
               s.host_budget, s.host_used, s.host_available, s.host_machine);
        for (uint32_t k = 0; k < s.num_host_kinds; k++) {
            printf("%s{\"kind\":", k ? "," : "");
            kvd__cli_json_str(s.host_kinds[k].kind);
            printf(",\"used\":%" PRIu64 ",\"limit\":%" PRIu64 ",\"refused\":%" PRIu64 "}",
                   s.host_kinds[k].used, s.host_kinds[k].limit, s.host_kinds[k].refused);
        }
        printf("]}");
        printf(",\"stream_paths\":{");
        for (int i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++)
            printf("%s\"%s\":\"%s\"", i > KVD_STREAM_FIRST ? "," : "", stream_names[i],
                   path_name(s.stream_paths[i]));
        printf("}");
        if (s.device_total > 0)
            printf(",\"device_memory\":{\"free\":%" PRIu64 ",\"total\":%" PRIu64
                   ",\"margin\":%" PRIu64 "}",
                   s.device_free, s.device_total, s.device_margin);
        if (s.cluster.enabled) {
            const kvd_cluster_status_t *c = &s.cluster;
            printf(",\"cluster\":{\"node\":");
            kvd__cli_json_str(c->node);
            printf(",\"deadline_ms\":%u,\"inbound\":%u,\"blocks_fetched\":%" PRIu64
                   ",\"bytes_fetched\":%" PRIu64 ",\"blocks_served\":%" PRIu64
                   ",\"bytes_served\":%" PRIu64 ",\"refused\":%" PRIu64 ",\"peers\":[",
                   c->deadline_ms, c->inbound, c->blocks_fetched, c->bytes_fetched,
                   c->blocks_served, c->bytes_served, c->refused);
            for (uint32_t i = 0; i < c->num_peers && i < KVD_CLUSTER_PEERS_MAX; i++) {
                const kvd_cluster_peer_t *p = &c->peers[i];
                printf("%s{\"address\":", i ? "," : "");
                kvd__cli_json_str(p->address);
                printf(",\"state\":");
                kvd__cli_json_str(p->state);
                printf(",\"error\":");
                kvd__cli_json_str(p->error);
                printf(",\"rtt_us\":%" PRIu64 ",\"since_ms\":%" PRIu64 ",\"queries\":%" PRIu64
                       ",\"blocks_fetched\":%" PRIu64 ",\"bytes_fetched\":%" PRIu64
                       ",\"failures\":%" PRIu64 "}",
                       p->rtt_us, p->since_ms, p->queries, p->blocks_fetched, p->bytes_fetched,
                       p->failures);
            }
            printf("]}");
        }
        printf(",\"client_list\":[");
        for (size_t i = 0; i < shown; i++) {
            printf("%s{\"id\":%" PRIu64 ",\"name\":", i ? "," : "", cl[i].id);
            kvd__cli_json_str(cl[i].name);
            printf(",\"pid\":%u,\"uid\":%u,\"inflight\":%u,\"pools\":%u,\"requests\":%" PRIu64 "}",
                   cl[i].pid, cl[i].uid, cl[i].inflight, cl[i].pools, cl[i].requests);
        }
        printf("]}\n");
    } else {
        char up[64], pb[64], lim[64], num[64];
        kvd__cli_table_t t;

        human_duration_ms(up, sizeof(up), s.uptime_ms);
        kvd__cli_human_bytes(pb, sizeof(pb), (double)s.pool_bytes);
        kvd__cli_human_bytes(lim, sizeof(lim), (double)h->limits.max_frame_bytes);
        printf("kvdockd %s  pid %u  backend %s  device %s%s\n", s.daemon_version, h->daemon_pid,
               kvd_backend_name(s.backend), s.device_name,
               s.shutting_down ? "  (shutting down)" : "");
        printf("  socket      %s\n",
               s.socket_path[0] ? s.socket_path : kvd_client_socket_path(cli));
        printf("  uptime      %s\n", up);
        printf("  clients     %u\n", s.clients);
        printf("  pools       %u (%s)\n", s.pools, pb);
        printf("  buffers     %u\n", s.buffers);
        printf("  events      %u\n", s.events);
        printf("  in flight   %u\n", s.inflight);
        printf("  max frame   %s, %u in flight per client\n", lim, h->limits.max_inflight);
        {
            char u[32], b[32], a[32], m[32];
            kvd__cli_human_bytes(u, sizeof(u), (double)s.host_used);
            kvd__cli_human_bytes(b, sizeof(b), (double)s.host_budget);
            kvd__cli_human_bytes(a, sizeof(a), (double)s.host_available);
            kvd__cli_human_bytes(m, sizeof(m), (double)s.host_machine);
            printf("  host memory %s used of a %s budget (the machine: %s available of %s)\n",
                   u, b, a, m);
        }
        if (s.device_total > 0) {
            char f[32], t2[32], mg[32];
            kvd__cli_human_bytes(f, sizeof(f), (double)s.device_free);
            kvd__cli_human_bytes(t2, sizeof(t2), (double)s.device_total);
            kvd__cli_human_bytes(mg, sizeof(mg), (double)s.device_margin);
            printf("  device mem  %s free of %s (device pools leave %s free)\n", f, t2, mg);
        }
        printf("  copy paths ");
        for (int i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++)
            printf("%s%s %s", i > KVD_STREAM_FIRST ? ", " : "", stream_names[i],
                   path_name(s.stream_paths[i]));
        putchar('\n');
        if (s.num_host_kinds > 0) {
            putchar('\n');
            kvd__cli_table_init(&t, "MEMORY,>USED,>LIMIT,>REFUSED");
            for (uint32_t k = 0; k < s.num_host_kinds; k++) {
                char u[32], l[32], r[24];
                kvd__cli_human_bytes(u, sizeof(u), (double)s.host_kinds[k].used);
                kvd__cli_human_bytes(l, sizeof(l), (double)s.host_kinds[k].limit);
                snprintf(r, sizeof(r), "%" PRIu64, s.host_kinds[k].refused);
                kvd__cli_table_row(&t, s.host_kinds[k].kind, u, l, r);
            }
            kvd__cli_table_print(&t);
        }
        if (s.cluster.enabled) {
            const kvd_cluster_status_t *c = &s.cluster;
            char fb[32], sb[32];
            kvd__cli_human_bytes(fb, sizeof(fb), (double)c->bytes_fetched);
            kvd__cli_human_bytes(sb, sizeof(sb), (double)c->bytes_served);
            printf("\ncluster     node %s, deadline %u ms, %u peers proven in; pulled %s, "
                   "served %s, refused %" PRIu64 "\n",
                   c->node, c->deadline_ms, c->inbound, fb, sb, c->refused);
            kvd__cli_table_init(&t, "PEER,STATE,>RTT_US,>FETCHED,>FAILURES,ERROR");
            for (uint32_t i = 0; i < c->num_peers && i < KVD_CLUSTER_PEERS_MAX; i++) {
                const kvd_cluster_peer_t *p = &c->peers[i];
                char rtt[24], f[32], fl[24];
                snprintf(rtt, sizeof(rtt), "%" PRIu64, p->rtt_us);
                kvd__cli_human_bytes(f, sizeof(f), (double)p->bytes_fetched);
                snprintf(fl, sizeof(fl), "%" PRIu64, p->failures);
                kvd__cli_table_row(&t, p->address, p->state, rtt, f, fl,
                                   p->error[0] ? p->error : "-");
            }
            kvd__cli_table_print(&t);
        }
        if (shown > 0) {
            putchar('\n');
            kvd__cli_table_init(&t, ">ID,NAME,>PID,>UID,>INFLIGHT,>POOLS,>REQUESTS");
            for (size_t i = 0; i < shown; i++) {
                char id[24], pid[16], uid[16], inf[16], pools[16];

                snprintf(id, sizeof(id), "%" PRIu64, cl[i].id);
                snprintf(pid, sizeof(pid), "%u", cl[i].pid);
                snprintf(uid, sizeof(uid), "%u", cl[i].uid);
                snprintf(inf, sizeof(inf), "%u", cl[i].inflight);
                snprintf(pools, sizeof(pools), "%u", cl[i].pools);
                snprintf(num, sizeof(num), "%" PRIu64, cl[i].requests);
                kvd__cli_table_row(&t, id, cl[i].name, pid, uid, inf, pools, num);
            }
            kvd__cli_table_print(&t);
        }
    }
    rc = 0;
out:
    free(cl);
    kvd_client_destroy(&cli);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* pools, pool create, pool drop                                             */

static void pool_json(const kvd_pool_info_t *p)
{
    printf("{\"id\":%" PRIu64 ",\"name\":", p->id);
    kvd__cli_json_str(p->name);
    printf(",\"kind\":");
    kvd__cli_json_str(kvd_mem_kind_name(p->kind));
    printf(",\"num_layers\":%u,\"num_slots\":%" PRIu64 ",\"slot_bytes\":%" PRIu64
           ",\"mla\":%s,\"page_size\":%u,\"shared\":%s,\"imported\":%s,\"bytes\":%" PRIu64
           ",\"layer_stride\":%" PRIu64 ",\"v_offset\":%" PRIu64 ",\"slot_stride\":%" PRIu64
           ",\"owner\":%" PRIu64 ",\"orphaned\":%s}",
           p->num_layers, p->num_slots, p->slot_bytes, p->mla ? "true" : "false", p->page_size,
           p->shared ? "true" : "false", p->imported ? "true" : "false", p->bytes, p->layer_stride,
           p->v_offset, p->slot_stride, p->owner, p->orphaned ? "true" : "false");
}

static void pools_table(const kvd_pool_info_t *p, size_t n)
{
    kvd__cli_table_t t;

    kvd__cli_table_init(&t, ">ID,NAME,KIND,>LAYERS,>SLOTS,>SLOT_BYTES,LAYOUT,>PAGE,>BYTES,>OWNER,FLAGS");
    for (size_t i = 0; i < n; i++) {
        char id[24], layers[16], slots[24], sb[24], page[16], bytes[32], owner[24], flags[32];

        snprintf(id, sizeof(id), "%" PRIu64, p[i].id);
        snprintf(layers, sizeof(layers), "%u", p[i].num_layers);
        snprintf(slots, sizeof(slots), "%" PRIu64, p[i].num_slots);
        snprintf(sb, sizeof(sb), "%" PRIu64, p[i].slot_bytes);
        if (p[i].page_size > 1)
            snprintf(page, sizeof(page), "%u", p[i].page_size);
        else
            snprintf(page, sizeof(page), "-"); /* unpaged (page_size 0 or 1) */
        kvd__cli_human_bytes(bytes, sizeof(bytes), (double)p[i].bytes);
        snprintf(owner, sizeof(owner), "%" PRIu64, p[i].owner);
        snprintf(flags, sizeof(flags), "%s%s%s%s%s", p[i].shared ? "shared" : "",
                 p[i].shared && p[i].imported ? "," : "", p[i].imported ? "imported" : "",
                 p[i].orphaned && (p[i].shared || p[i].imported) ? "," : "",
                 p[i].orphaned ? "orphaned" : "");
        kvd__cli_table_row(&t, id, p[i].name, kvd_mem_kind_name(p[i].kind), layers, slots, sb,
                  p[i].mla ? "mla" : "mha", page, bytes, owner, flags[0] ? flags : "-");
    }
    kvd__cli_table_print(&t);
}

static int cmd_pools(opts_t *o)
{
    kvd_client_t *cli = NULL;
    kvd_pool_info_t *pools = NULL;
    size_t cap = 64, n = 0;
    kvd_status_t st;
    int rc;

    if (o->argc > 1)
        return usage_error("pools", "unexpected argument '%s'", o->argv[1]);
    rc = connect_or_fail(o, &cli);
    if (rc != 0)
        return rc;
    for (;;) {
        pools = calloc(cap, sizeof(*pools));
        if (pools == NULL) {
            fprintf(stderr, "kvdock: out of memory\n");
            rc = EXIT_DAEMON;
            goto out;
        }
        st = kvd_pool_list(cli, pools, cap, &n);
        if (st != KVD_OK) {
            rc = daemon_error(cli, st, "pools");
            goto out;
        }
        if (n <= cap)
            break;
        free(pools);
        cap = n;
    }
    if (o->json) {
        printf("{\"pools\":[");
        for (size_t i = 0; i < n; i++) {
            if (i)
                putchar(',');
            pool_json(&pools[i]);
        }
        printf("]}\n");
    } else if (n == 0) {
        printf("no pools\n");
    } else {
        pools_table(pools, n);
    }
    rc = 0;
out:
    free(pools);
    kvd_client_destroy(&cli);
    return rc;
}

static int cmd_pool_create(opts_t *o)
{
    kvd_client_t *cli = NULL;
    kvd_pool_spec_t spec;
    kvd_pool_info_t info;
    bool have_layers = false, have_slots = false, have_sb = false;
    kvd_status_t st;
    uint64_t v;
    int rc;

    memset(&spec, 0, sizeof(spec));
    spec.kind = KVD_MEM_HOST;
    for (int i = 2; i < o->argc; i++) {
        const char *a = o->argv[i];
        const char *val;

        if (kvd__cli_opt_is(a, "--kind")) {
            if ((val = opt_value(o, &i, "--kind")) == NULL)
                return usage_error("pool create", "--kind needs a value");
            if (strcmp(val, "host") == 0)
                spec.kind = KVD_MEM_HOST;
            else if (strcmp(val, "device") == 0)
                spec.kind = KVD_MEM_DEVICE;
            else if (strcmp(val, "device-vmm") == 0 || strcmp(val, "vmm") == 0)
                spec.kind = KVD_MEM_DEVICE_VMM;
            else
                return usage_error("pool create",
                                   "--kind must be host, device or device-vmm, not '%s'", val);
        } else if (kvd__cli_opt_is(a, "--layers")) {
            if ((val = opt_value(o, &i, "--layers")) == NULL || !kvd__cli_parse_u64(val, &v, false) ||
                v == 0 || v > UINT32_MAX)
                return usage_error("pool create", "--layers needs a count from 1 to %u",
                                   UINT32_MAX);
            spec.num_layers = (uint32_t)v;
            have_layers = true;
        } else if (kvd__cli_opt_is(a, "--slots")) {
            if ((val = opt_value(o, &i, "--slots")) == NULL || !kvd__cli_parse_u64(val, &v, false) || v == 0)
                return usage_error("pool create", "--slots needs a positive count");
            spec.num_slots = v;
            have_slots = true;
        } else if (kvd__cli_opt_is(a, "--slot-bytes")) {
            if ((val = opt_value(o, &i, "--slot-bytes")) == NULL || !kvd__cli_parse_u64(val, &v, true) ||
                v == 0)
                return usage_error("pool create", "--slot-bytes needs a positive size");
            spec.slot_bytes = v;
            have_sb = true;
        } else if (kvd__cli_opt_is(a, "--page-size")) {
            if ((val = opt_value(o, &i, "--page-size")) == NULL || !kvd__cli_parse_u64(val, &v, false) ||
                v > UINT32_MAX)
                return usage_error("pool create", "--page-size needs a count");
            spec.page_size = (uint32_t)v;
        } else if (strcmp(a, "--mla") == 0) {
            spec.mla = true;
        } else if (strcmp(a, "--shared") == 0) {
            spec.shared = true;
        } else if (a[0] == '-') {
            return usage_error("pool create", "unknown option '%s'", a);
        } else if (spec.name == NULL) {
            spec.name = a;
        } else {
            return usage_error("pool create", "unexpected argument '%s'", a);
        }
    }
    if (spec.name == NULL)
        return usage_error("pool create", "a pool NAME is needed");
    if (!have_layers || !have_slots || !have_sb)
        return usage_error("pool create", "--layers, --slots and --slot-bytes are required");
    if (!spec.shared)
        return usage_error("pool create",
                           "a private pool lives as long as the connection that made it, and "
                           "kvdock's ends when kvdock exits: --shared makes a pool that stays, "
                           "that other clients may use, and that you (or an admin) drop with "
                           "`kvdock pool drop`");

    rc = connect_or_fail(o, &cli);
    if (rc != 0)
        return rc;
    st = kvd_pool_create(cli, &spec, &info);
    if (st != KVD_OK) {
        rc = daemon_error(cli, st, "pool create");
        kvd_client_destroy(&cli);
        return rc;
    }
    if (o->json) {
        printf("{\"pool\":");
        pool_json(&info);
        printf("}\n");
    } else {
        char b[32];

        kvd__cli_human_bytes(b, sizeof(b), (double)info.bytes);
        printf("created pool %s (id %" PRIu64 "): %s, %u layers x %" PRIu64 " slots x %" PRIu64
               " bytes, %s, %s\n",
               info.name, info.id, kvd_mem_kind_name(info.kind), info.num_layers, info.num_slots,
               info.slot_bytes, info.mla ? "mla" : "mha", b);
    }
    kvd_client_destroy(&cli);
    return 0;
}

static int cmd_pool_drop(opts_t *o)
{
    kvd_client_t *cli = NULL;
    const char *name = NULL;
    uint64_t id = 0;
    kvd_status_t st;
    int rc;

    for (int i = 2; i < o->argc; i++) {
        const char *a = o->argv[i];

        if (kvd__cli_opt_is(a, "--id")) {
            const char *val = opt_value(o, &i, "--id");

            if (val == NULL || !kvd__cli_parse_u64(val, &id, false) || id == 0)
                return usage_error("pool drop", "--id needs a pool id");
        } else if (a[0] == '-') {
            return usage_error("pool drop", "unknown option '%s'", a);
        } else if (name == NULL) {
            name = a;
        } else {
            return usage_error("pool drop", "unexpected argument '%s'", a);
        }
    }
    if (name == NULL && id == 0)
        return usage_error("pool drop", "a pool NAME (or --id ID) is needed");
    rc = connect_or_fail(o, &cli);
    if (rc != 0)
        return rc;
    st = kvd_pool_drop(cli, id, name);
    if (st != KVD_OK) {
        rc = daemon_error(cli, st, "pool drop");
        kvd_client_destroy(&cli);
        return rc;
    }
    if (o->json) {
        printf("{\"dropped\":");
        if (name != NULL)
            kvd__cli_json_str(name);
        else
            printf("%" PRIu64, id);
        printf("}\n");
    } else if (name != NULL) {
        printf("dropped pool %s\n", name);
    } else {
        printf("dropped pool %" PRIu64 "\n", id);
    }
    kvd_client_destroy(&cli);
    return 0;
}

static int cmd_pool(opts_t *o)
{
    if (o->argc < 2)
        return usage_error("pool", "a subcommand is needed: create or drop");
    if (strcmp(o->argv[1], "create") == 0)
        return cmd_pool_create(o);
    if (strcmp(o->argv[1], "drop") == 0)
        return cmd_pool_drop(o);
    return usage_error("pool", "unknown subcommand '%s' (create or drop)", o->argv[1]);
}

/* ------------------------------------------------------------------------ */
/* stats                                                                     */

/* Upper bound (us) of the bucket holding quantile q; < 0 past the last. */
static double hist_quantile(const kvd_op_stats_t *s, double q)
{
    uint64_t total = 0, acc = 0;

    for (uint32_t i = 0; i <= s->num_bounds; i++)
        total += s->counts[i];
    if (total == 0)
        return 0;
    for (uint32_t i = 0; i <= s->num_bounds; i++) {
        acc += s->counts[i];
        if ((double)acc >= q * (double)total)
            return i < s->num_bounds ? s->bounds_us[i] : -1;
    }
    return -1;
}

static void fmt_quantile(char *buf, size_t cap, const kvd_op_stats_t *s, double q)
{
    double v = hist_quantile(s, q);

    if (s->requests == 0)
        snprintf(buf, cap, "-");
    else if (v < 0)
        snprintf(buf, cap, ">%.0f", s->num_bounds ? s->bounds_us[s->num_bounds - 1] : 0.0);
    else
        snprintf(buf, cap, v >= 10 ? "<=%.0f" : "<=%g", v);
}

#define MAX_OPS 64
#define MAX_STREAMS 16

static int cmd_stats(opts_t *o)
{
    kvd_client_t *cli = NULL;
    kvd_daemon_stats_t s;
    kvd_op_stats_t *ops = NULL;
    kvd_stream_stats_t streams[MAX_STREAMS];
    kvd_status_t st;
    size_t nops, nstreams;
    int rc;

    if (o->argc > 1)
        return usage_error("stats", "unexpected argument '%s'", o->argv[1]);
    ops = calloc(MAX_OPS, sizeof(*ops));
    if (ops == NULL) {
        fprintf(stderr, "kvdock: out of memory\n");
        return EXIT_DAEMON;
    }
    rc = connect_or_fail(o, &cli);
    if (rc != 0) {
        free(ops);
        return rc;
    }
    st = kvd_daemon_stats(cli, &s, ops, MAX_OPS, streams, MAX_STREAMS);
    if (st != KVD_OK) {
        rc = daemon_error(cli, st, "stats");
        goto out;
    }
    nops = s.num_ops < MAX_OPS ? s.num_ops : MAX_OPS;
    nstreams = s.num_streams < MAX_STREAMS ? s.num_streams : MAX_STREAMS;
    if (o->json) {
        printf("{\"bytes_in\":%" PRIu64 ",\"bytes_out\":%" PRIu64 ",\"connections\":%" PRIu64
               ",\"ops\":[",
               s.bytes_in, s.bytes_out, s.connections);
        for (size_t i = 0; i < nops; i++) {
            const kvd_op_stats_t *p = &ops[i];

            printf("%s{\"op\":", i ? "," : "");
            kvd__cli_json_str(p->op);
            printf(",\"requests\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"bytes\":%" PRIu64
                   ",\"sum_us\":%.3f,\"bounds_us\":[",
                   p->requests, p->errors, p->bytes, p->sum_us);
            for (uint32_t b = 0; b < p->num_bounds; b++)
                printf("%s%g", b ? "," : "", p->bounds_us[b]);
            printf("],\"counts\":[");
            for (uint32_t b = 0; b <= p->num_bounds; b++)
                printf("%s%" PRIu64, b ? "," : "", p->counts[b]);
            printf("]}");
        }
        printf("],\"streams\":[");
        for (size_t i = 0; i < nstreams; i++) {
            const kvd_stream_stats_t *p = &streams[i];

            printf("%s{\"name\":", i ? "," : "");
            kvd__cli_json_str(p->name);
            printf(",\"priority\":%d,\"max_blocks\":%u,\"launches\":%" PRIu64 ",\"bytes\":%" PRIu64
                   ",\"busy_ns\":%" PRIu64 ",\"queue_depth\":%u,\"path\":\"%s\","
                   "\"copy_engine_launches\":%" PRIu64 "}",
                   p->priority, p->max_blocks, p->launches, p->bytes, p->busy_ns, p->queue_depth,
                   path_name(p->path), p->copy_engine_launches);
        }
        printf("]}\n");
    } else {
        char in[32], out_b[32];
        kvd__cli_table_t t;

        kvd__cli_human_bytes(in, sizeof(in), (double)s.bytes_in);
        kvd__cli_human_bytes(out_b, sizeof(out_b), (double)s.bytes_out);
        printf("connections %" PRIu64 "  socket in %s  out %s\n\n", s.connections, in, out_b);
        kvd__cli_table_init(&t, "OP,>REQUESTS,>ERRORS,>BYTES,>MEAN_US,>P50_US,>P99_US");
        size_t idle = 0;
        for (size_t i = 0; i < nops; i++) {
            const kvd_op_stats_t *p = &ops[i];
            char req[24], err[24], b[32], mean[32], p50[32], p99[32];

            if (p->requests == 0) { /* the table shows what ran; --json shows all */
                idle++;
                continue;
            }
            snprintf(req, sizeof(req), "%" PRIu64, p->requests);
            snprintf(err, sizeof(err), "%" PRIu64, p->errors);
            kvd__cli_human_bytes(b, sizeof(b), (double)p->bytes);
            if (p->requests > 0)
                snprintf(mean, sizeof(mean), "%.1f", p->sum_us / (double)p->requests);
            else
                snprintf(mean, sizeof(mean), "-");
            fmt_quantile(p50, sizeof(p50), p, 0.50);
            fmt_quantile(p99, sizeof(p99), p, 0.99);
            kvd__cli_table_row(&t, p->op, req, err, b, mean, p50, p99);
        }
        kvd__cli_table_print(&t);
        if (idle > 0)
            printf("(%zu operations without requests not shown; --json has them)\n", idle);
        if (nstreams > 0) {
            putchar('\n');
            kvd__cli_table_init(&t, "STREAM,PATH,>PRIORITY,>MAX_BLOCKS,>LAUNCHES,>ON_CE,>BYTES,>BUSY_MS,"
                           ">QUEUED");
            for (size_t i = 0; i < nstreams; i++) {
                const kvd_stream_stats_t *p = &streams[i];
                char pr[16], mb[16], la[24], ce[24], b[32], busy[32], q[16];

                snprintf(pr, sizeof(pr), "%d", p->priority);
                if (p->max_blocks)
                    snprintf(mb, sizeof(mb), "%u", p->max_blocks);
                else
                    snprintf(mb, sizeof(mb), "-");
                snprintf(la, sizeof(la), "%" PRIu64, p->launches);
                kvd__cli_human_bytes(b, sizeof(b), (double)p->bytes);
                snprintf(busy, sizeof(busy), "%.1f", (double)p->busy_ns / 1e6);
                snprintf(q, sizeof(q), "%u", p->queue_depth);
                snprintf(ce, sizeof(ce), "%" PRIu64, p->copy_engine_launches);
                kvd__cli_table_row(&t, p->name, path_name(p->path), pr, mb, la, ce, b, busy, q);
            }
            kvd__cli_table_print(&t);
        }
    }
    rc = 0;
out:
    free(ops);
    kvd_client_destroy(&cli);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* ping                                                                      */

static int cmd_ping(opts_t *o)
{
    kvd_client_t *cli = NULL;
    uint64_t count = 1, size = 0;
    uint8_t *payload = NULL;
    double *rtt = NULL, sum = 0;
    kvd_status_t st;
    int rc;

    for (int i = 1; i < o->argc; i++) {
        const char *a = o->argv[i];
        const char *val;

        if (kvd__cli_opt_is(a, "--count") || strcmp(a, "-c") == 0) {
            val = opt_value(o, &i, strcmp(a, "-c") == 0 ? "-c" : "--count");
            if (val == NULL || !kvd__cli_parse_u64(val, &count, false) || count == 0 || count > 100000000)
                return usage_error("ping", "--count needs a count from 1 to 100000000");
        } else if (kvd__cli_opt_is(a, "--size")) {
            val = opt_value(o, &i, "--size");
            if (val == NULL || !kvd__cli_parse_u64(val, &size, true) || size > (64u << 20))
                return usage_error("ping", "--size needs a payload size up to 64 MiB");
        } else {
            return usage_error("ping", "unexpected argument '%s'", a);
        }
    }
    rtt = calloc((size_t)count, sizeof(*rtt));
    payload = size ? malloc((size_t)size) : NULL;
    if (rtt == NULL || (size && payload == NULL)) {
        free(rtt);
        free(payload);
        fprintf(stderr, "kvdock: out of memory\n");
        return EXIT_DAEMON;
    }
    for (uint64_t i = 0; i < size; i++)
        payload[i] = (uint8_t)(i * 131u + 7u);
    rc = connect_or_fail(o, &cli);
    if (rc != 0)
        goto out;
    if (!o->json)
        printf("PING kvdockd %s (pid %u): %" PRIu64 " bytes of payload\n",
               kvd_client_socket_path(cli), kvd_client_info(cli)->daemon_pid, size);
    for (uint64_t i = 0; i < count; i++) {
        double t0 = kvd__cli_now_us();

        st = kvd_ping(cli, payload, (size_t)size);
        rtt[i] = kvd__cli_now_us() - t0;
        if (st != KVD_OK) {
            rc = daemon_error(cli, st, "ping");
            goto out;
        }
        sum += rtt[i];
        if (!o->json && count <= 100)
            printf("reply from kvdockd: seq=%" PRIu64 " time=%.1f us\n", i + 1, rtt[i]);
    }
    {
        double *sorted = malloc((size_t)count * sizeof(*sorted));
        double mn, mx, p50, p99;

        if (sorted == NULL) {
            fprintf(stderr, "kvdock: out of memory\n");
            rc = EXIT_DAEMON;
            goto out;
        }
        memcpy(sorted, rtt, (size_t)count * sizeof(*sorted));
        {
            kvd_lat_t lat; /* nearest rank: the p99 of 3 samples is the largest */
            kvd__bench_lat(&lat, sorted, count);
            mn = lat.min;
            mx = lat.max;
            p50 = lat.p50;
            p99 = lat.p99;
        }
        free(sorted);
        if (o->json) {
            printf("{\"count\":%" PRIu64 ",\"payload_bytes\":%" PRIu64
                   ",\"min_us\":%.3f,\"avg_us\":%.3f,\"p50_us\":%.3f,\"p99_us\":%.3f,"
                   "\"max_us\":%.3f,\"rtt_us\":[",
                   count, size, mn, sum / (double)count, p50, p99, mx);
            for (uint64_t i = 0; i < count && i < 10000; i++)
                printf("%s%.3f", i ? "," : "", rtt[i]);
            printf("]}\n");
        } else {
            printf("--- %" PRIu64 " pings: rtt min/avg/p50/p99/max = %.1f/%.1f/%.1f/%.1f/%.1f us\n",
                   count, mn, sum / (double)count, p50, p99, mx);
        }
    }
    rc = 0;
out:
    free(rtt);
    free(payload);
    kvd_client_destroy(&cli);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* shutdown                                                                  */

static int cmd_shutdown(opts_t *o)
{
    kvd_client_t *cli = NULL;
    bool drain = true;
    kvd_status_t st;
    int rc;

    for (int i = 1; i < o->argc; i++) {
        if (strcmp(o->argv[i], "--no-drain") == 0)
            drain = false;
        else
            return usage_error("shutdown", "unexpected argument '%s'", o->argv[i]);
    }
    rc = connect_or_fail(o, &cli);
    if (rc != 0)
        return rc;
    st = kvd_daemon_shutdown(cli, drain);
    if (st != KVD_OK) {
        rc = daemon_error(cli, st, "shutdown");
        kvd_client_destroy(&cli);
        return rc;
    }
    if (o->json)
        printf("{\"shutdown\":true,\"drain\":%s}\n", drain ? "true" : "false");
    else
        printf("kvdockd is shutting down%s\n", drain ? " (draining in-flight work)" : "");
    kvd_client_destroy(&cli);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* bench (client/cli/bench.c)                                                */

static int cmd_bench(opts_t *o)
{
    return kvd__cli_bench(o->socket, o->json, o->argc, o->argv);
}

/* ------------------------------------------------------------------------ */
/* top (client/cli/top.c)                                                    */

static int cmd_cache(opts_t *o)
{
    return kvd__cli_cache(o->socket, o->json, o->argc, o->argv);
}

static int cmd_top(opts_t *o)
{
    return kvd__cli_top(o->socket, o->json, o->argc, o->argv);
}

/* ------------------------------------------------------------------------ */
/* Command table and main                                                    */

static const cmd_t cmds[] = {
    {"status", "status [--json]", "Show the daemon: version, backend, device, limits, clients.",
     cmd_status},
    {"pools", "pools [--json]", "List the pools this client may see.", cmd_pools},
    {"pool",
     "pool create NAME --shared --kind host|device|device-vmm --layers N --slots N "
     "--slot-bytes N [--mla] [--page-size N] [--json]\n"
     "       kvdock pool drop NAME|--id ID [--json]",
     "Create or drop a pool.  Sizes take k, m, g suffixes (binary).", cmd_pool},
    {"stats", "stats [--json]", "Show per-operation counters and latencies, and per-stream load.",
     cmd_stats},
    {"ping", "ping [--count N] [--size BYTES] [--json]",
     "Round-trip a ping through the daemon and print the times.", cmd_ping},
    {"shutdown", "shutdown [--no-drain] [--json]",
     "Ask the daemon to exit, finishing in-flight work first (admin only).", cmd_shutdown},
    {"cache", KVD_CACHE_USAGE, KVD_CACHE_HELP, cmd_cache},
    {"bench", KVD_BENCH_USAGE, KVD_BENCH_HELP, cmd_bench},
    {"top", KVD_TOP_USAGE, KVD_TOP_HELP, cmd_top},
};

static const cmd_t *find_cmd(const char *name)
{
    char first[32];
    size_t n = strcspn(name, " ");

    if (n >= sizeof(first))
        return NULL;
    memcpy(first, name, n);
    first[n] = '\0';
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (strcmp(cmds[i].name, first) == 0)
            return &cmds[i];
    return NULL;
}

static void print_usage(FILE *f)
{
    char path[256];

    if (kvd_default_socket_path(path, sizeof(path)) != KVD_OK)
        snprintf(path, sizeof(path), "(too long)");
    fprintf(f, "usage: kvdock [--socket PATH] [--json] COMMAND [ARGS]\n\n"
               "Admin CLI of kvdockd, the KV-cache daemon.\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        fprintf(f, "  %-9s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f,
            "\noptions:\n"
            "  --socket PATH  daemon socket (default %s:\n"
            "                 $KVDOCK_SOCKET, else /run/kvdock/kvdockd.sock when a system\n"
            "                 service listens there, else $XDG_RUNTIME_DIR/kvdock/kvdockd.sock,\n"
            "                 else /tmp/kvdock-<uid>/kvdockd.sock)\n"
            "  --json         print one JSON object instead of tables\n"
            "  --help         this help; 'kvdock COMMAND --help' for a command\n"
            "  --version      kvdock's version, its library's ABI, the protocol\n\n"
            "exit status: 0 ok, 1 daemon or connection error, 2 usage error\n",
            path);
}

int main(int argc, char **argv)
{
    opts_t o;
    char **rest;
    int n = 0;
    const cmd_t *c;

    memset(&o, 0, sizeof(o));
    rest = calloc((size_t)argc + 1, sizeof(*rest));
    if (rest == NULL)
        return EXIT_DAEMON;
    /* Global options may come anywhere; the rest is the command line. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];

        if (strcmp(a, "--version") == 0) {
            printf("kvdock %s (libkvdock ABI %d, protocol %u)\n", KVD_VERSION,
                   kvd_client_abi_version(), KVD_PROTOCOL_VERSION);
            free(rest);
            return 0;
        }
        if (strcmp(a, "--json") == 0) {
            o.json = true;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            o.help = true;
        } else if (strcmp(a, "--socket") == 0 || strcmp(a, "-s") == 0) {
            if (i + 1 >= argc) {
                free(rest);
                return usage_error(NULL, "%s needs a PATH", a);
            }
            o.socket = argv[++i];
        } else if (strncmp(a, "--socket=", 9) == 0) {
            o.socket = a + 9;
        } else {
            rest[n++] = argv[i];
        }
    }
    o.argc = n;
    o.argv = rest;
    if (n == 0) {
        print_usage(o.help ? stdout : stderr);
        free(rest);
        return o.help ? 0 : EXIT_USAGE;
    }
    c = find_cmd(rest[0]);
    if (c == NULL) {
        int rc = usage_error(NULL, "unknown command '%s'", rest[0]);

        free(rest);
        return rc;
    }
    if (o.help) {
        printf("usage: kvdock %s\n\n%s\n", c->usage, c->help);
        if (c->run == cmd_pool)
            printf("\npool create options:\n"
                   "  --kind K         host (default), device or device-vmm\n"
                   "  --layers N       layers, >= 1\n"
                   "  --slots N        slots per layer\n"
                   "  --slot-bytes N   bytes per slot row\n"
                   "  --mla            one latent buffer per layer instead of K and V\n"
                   "  --page-size N    slots per page (0 or 1: unpaged)\n"
                   "  --shared         required: the pool stays after kvdock exits, other\n"
                   "                   clients may use it, and your user (or an admin)\n"
                   "                   drops it with `kvdock pool drop`; a private pool\n"
                   "                   would end with kvdock's connection\n");
        if (c->run == cmd_bench)
            kvd__cli_bench_help();
        if (c->run == cmd_top)
            kvd__cli_top_help();
        if (c->run == cmd_cache)
            kvd__cli_cache_help();
        free(rest);
        return 0;
    }
    {
        int rc = c->run(&o);

        free(rest);
        return rc;
    }
}
