/*
 * kvdock status: the daemon (version, backend, device, limits, host
 * memory, disk level and the caches it did not reopen, copy paths,
 * cluster) and its clients.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "wire.h"

/* What a kind of the daemon's host memory holds (kvdock.proto's
 * MemoryUse), for the MEMORY table; "" for a kind this CLI does not know. */
static const char *memory_kind_text(const char *kind)
{
    static const char *const text[][2] = {
        {"pools", "host pools"},
        {"buffers", "registered host buffers"},
        {"staging", "copies of request operands"},
        {"sockets", "clients' unread requests and unsent replies"},
        {"cache", "the cache tier's blocks"},
        {"cache-index", "the cache tier's entries and index"},
        {"leases", "cache leases clients hold"},
        {"requests", "requests being decoded or served, and those in flight"},
    };

    for (size_t i = 0; i < sizeof(text) / sizeof(text[0]); i++)
        if (strcmp(kind, text[i][0]) == 0)
            return text[i][1];
    return "";
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

static const char *const stream_names[KVD_STREAM_END] = {"default", "reload", "write", "offload",
                                                         "d2d"};

#define MAX_CLIENTS_SHOWN 1024

static int run(kvd__cli_ctx_t *o, int argc, char **argv)
{
    kvd_client_t *cli = NULL;
    kvd_daemon_status_t s;
    kvd_client_entry_t *cl = NULL;
    const kvd_hello_info_t *h;
    kvd_status_t st;
    int rc;

    if ((rc = kvd__cli_no_args(&kvd__cli_cmd_status, o, argc, argv, 1)) != 0 || o->help)
        return rc;
    if ((rc = kvd__cli_connect(o, "kvdock-cli", &cli)) != 0)
        return rc;
    cl = calloc(MAX_CLIENTS_SHOWN, sizeof(*cl));
    if (cl == NULL) {
        kvd_client_destroy(&cli);
        fprintf(stderr, "kvdock: out of memory\n");
        return KVD_CLI_EXIT_DAEMON;
    }
    st = kvd_daemon_status(cli, &s, cl, MAX_CLIENTS_SHOWN);
    if (st != KVD_OK) {
        rc = kvd__cli_daemon_error(cli, st, "status");
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
        printf("],\"cache_budgets\":%" PRIu64 ",\"caches_over_budget\":%s}", s.cache_budgets,
               s.cache_budgets > s.host_budget ? "true" : "false");
        printf(",\"metrics_address\":");
        kvd__cli_json_str(s.metrics_address);
        printf(",\"stream_paths\":{");
        for (int i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++)
            printf("%s\"%s\":\"%s\"", i > KVD_STREAM_FIRST ? "," : "", stream_names[i],
                   kvd__cli_path_name(s.stream_paths[i]));
        printf("}");
        if (s.device_total > 0)
            printf(",\"device_memory\":{\"free\":%" PRIu64 ",\"total\":%" PRIu64
                   ",\"margin\":%" PRIu64 "}",
                   s.device_free, s.device_total, s.device_margin);
        if (s.disk.enabled) {
            printf(",\"disk\":{\"cache_dir\":");
            kvd__cli_json_str(s.disk.cache_dir);
            printf(",\"io_engine\":");
            kvd__cli_json_str(s.disk.io_engine);
            printf(",\"direct\":%s,\"budget_bytes\":%" PRIu64 ",\"reserved_bytes\":%" PRIu64
                   ",\"used_bytes\":%" PRIu64 ",\"fs_free_bytes\":%" PRIu64
                   ",\"skipped_total\":%u,\"skipped\":[",
                   s.disk.direct ? "true" : "false", s.disk.budget_bytes, s.disk.reserved_bytes,
                   s.disk.used_bytes, s.disk.fs_free_bytes, s.disk.num_skipped);
            for (uint32_t i = 0; i < s.disk.num_skipped && i < KVD_DISK_SKIPPED_MAX; i++) {
                const kvd_skipped_cache_t *k = &s.disk.skipped[i];
                printf("%s{\"dir\":", i ? "," : "");
                kvd__cli_json_str(k->dir);
                if (k->name[0]) {
                    printf(",\"name\":");
                    kvd__cli_json_str(k->name);
                    printf(",\"owner_uid\":%u", k->owner_uid);
                } else {
                    printf(",\"name\":null,\"owner_uid\":null");
                }
                printf(",\"reason\":");
                kvd__cli_json_str(k->reason);
                printf("}");
            }
            printf("]}");
        } else {
            printf(",\"disk\":null");
        }
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
            /* the client library carries the first KVD_CLUSTER_PEERS_MAX;
             * the metrics name them all */
            printf("],\"peers_total\":%u,\"peers_shown\":%u}", c->num_peers,
                   c->num_peers < KVD_CLUSTER_PEERS_MAX ? c->num_peers : KVD_CLUSTER_PEERS_MAX);
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
            if (s.cache_budgets > s.host_budget) {
                kvd__cli_human_bytes(u, sizeof(u), (double)s.cache_budgets);
                printf("  warning     the caches' budgets add up to %s, past the host-memory "
                       "budget: not all can fill\n", u);
            }
        }
        if (s.disk.enabled) {
            char u[32], b[32], r[32], f[32];
            kvd__cli_human_bytes(u, sizeof(u), (double)s.disk.used_bytes);
            kvd__cli_human_bytes(b, sizeof(b), (double)s.disk.budget_bytes);
            kvd__cli_human_bytes(r, sizeof(r), (double)s.disk.reserved_bytes);
            kvd__cli_human_bytes(f, sizeof(f), (double)s.disk.fs_free_bytes);
            printf("  disk        %s used of a %s budget (%s given to caches; %s free on the "
                   "file system)\n", u, b, r, f);
            printf("  cache dir   %s (%s, %s)\n", s.disk.cache_dir, s.disk.io_engine,
                   s.disk.direct ? "O_DIRECT" : "page cache");
        } else {
            printf("  disk        none (no --cache-dir)\n");
        }
        if (s.metrics_address[0])
            printf("  metrics     http://%s/metrics\n", s.metrics_address);
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
                   kvd__cli_path_name(s.stream_paths[i]));
        putchar('\n');
        if (s.num_host_kinds > 0) {
            putchar('\n');
            kvd__cli_table_init(&t, "MEMORY,>USED,>LIMIT,>REFUSED,WHAT");
            for (uint32_t k = 0; k < s.num_host_kinds; k++) {
                char u[32], l[32], r[24];
                kvd__cli_human_bytes(u, sizeof(u), (double)s.host_kinds[k].used);
                kvd__cli_human_bytes(l, sizeof(l), (double)s.host_kinds[k].limit);
                snprintf(r, sizeof(r), "%" PRIu64, s.host_kinds[k].refused);
                kvd__cli_table_row(&t, s.host_kinds[k].kind, u, l, r,
                                   memory_kind_text(s.host_kinds[k].kind));
            }
            kvd__cli_table_print(&t);
        }
        if (s.disk.num_skipped > 0) {
            /* a line each, the reason whole (a table cell would cut it) */
            uint32_t n = s.disk.num_skipped;
            printf("\nskipped     %u director%s of the cache dir not reopened at start: left as "
                   "%s, not served\n", n, n == 1 ? "y" : "ies", n == 1 ? "it is" : "they are");
            for (uint32_t i = 0; i < n && i < KVD_DISK_SKIPPED_MAX; i++) {
                const kvd_skipped_cache_t *k = &s.disk.skipped[i];
                printf("  %s", k->dir);
                if (k->name[0])
                    printf(" (cache %s, uid %u)", k->name, k->owner_uid);
                printf(": %s\n", k->reason);
            }
            if (n > KVD_DISK_SKIPPED_MAX)
                printf("  ... and %u more (the daemon's log names each: "
                       "event=cache_reopen_skipped)\n", n - KVD_DISK_SKIPPED_MAX);
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
            if (c->num_peers > KVD_CLUSTER_PEERS_MAX)
                printf("... and %u more peers not shown (%u in all; the metrics, "
                       "kvdock_cluster_peer_up, name every one)\n",
                       c->num_peers - KVD_CLUSTER_PEERS_MAX, c->num_peers);
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

const kvd__cli_cmd_t kvd__cli_cmd_status = {
    "status",
    "status [--json]",
    "Show the daemon: version, backend, device, limits, host memory, clients.",
    "With --cache-dir, the disk level, and each directory there the daemon did not\n"
    "reopen at start (damaged, another user's, or a cache past today's options) and\n"
    "why: it is left as it is and not served until a start that can reopen it.\n",
    run,
};
