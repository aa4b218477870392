/*
 * kvdock stats: per-operation counters and latencies, per-stream load.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

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

static int run(kvd__cli_ctx_t *o, int argc, char **argv)
{
    kvd_client_t *cli = NULL;
    kvd_daemon_stats_t s;
    kvd_op_stats_t *ops = NULL;
    kvd_stream_stats_t streams[MAX_STREAMS];
    kvd_status_t st;
    size_t nops, nstreams;
    int rc;

    if ((rc = kvd__cli_no_args(&kvd__cli_cmd_stats, o, argc, argv, 1)) != 0 || o->help)
        return rc;
    ops = calloc(MAX_OPS, sizeof(*ops));
    if (ops == NULL) {
        fprintf(stderr, "kvdock: out of memory\n");
        return KVD_CLI_EXIT_DAEMON;
    }
    rc = kvd__cli_connect(o, "kvdock-cli", &cli);
    if (rc != 0) {
        free(ops);
        return rc;
    }
    st = kvd_daemon_stats(cli, &s, ops, MAX_OPS, streams, MAX_STREAMS);
    if (st != KVD_OK) {
        rc = kvd__cli_daemon_error(cli, st, "stats");
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
                   kvd__cli_path_name(p->path), p->copy_engine_launches);
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
                kvd__cli_table_row(&t, p->name, kvd__cli_path_name(p->path), pr, mb, la, ce, b, busy, q);
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

const kvd__cli_cmd_t kvd__cli_cmd_stats = {
    "stats",
    "stats [--json]",
    "Show per-operation counters and latencies, and per-stream load.",
    "",
    run,
};
