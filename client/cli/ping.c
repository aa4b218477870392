/*
 * kvdock ping: round trips through the daemon, with their times.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "commands.h"

#define CMD (&kvd__cli_cmd_ping)

enum { O_COUNT = 1, O_SIZE };

static int run(kvd__cli_ctx_t *o, int argc, char **argv)
{
    static const kvd__cli_opt_t opts[] = {
        {"count", 'c', true, O_COUNT},
        {"size", 0, true, O_SIZE},
        KVD_CLI_OPT_END,
    };
    kvd__cli_args_t a;
    kvd_client_t *cli = NULL;
    uint64_t count = 1, size = 0;
    uint8_t *payload = NULL;
    double *rtt = NULL, sum = 0;
    kvd_status_t st;
    int id, rc;

    kvd__cli_args_init(&a, argc, argv, 1, opts, o);
    while ((id = kvd__cli_next(&a)) != KVD_CLI_DONE) {
        if (id == KVD_CLI_BAD)
            return kvd__cli_usage(CMD, "%s", a.err);
        if (id == KVD_CLI_ARG)
            return kvd__cli_usage(CMD, "unexpected argument '%s'", a.val);
        if (id == O_COUNT &&
            (!kvd__cli_parse_u64(a.val, &count, false) || count == 0 || count > 100000000))
            return kvd__cli_usage(CMD, "--count needs a count from 1 to 100000000, not '%s'",
                                  a.val);
        if (id == O_SIZE && (!kvd__cli_parse_u64(a.val, &size, true) || size > (64u << 20)))
            return kvd__cli_usage(CMD, "--size needs a payload SIZE up to 64 MiB, not '%s'",
                                  a.val);
    }
    if (o->help)
        return kvd__cli_help(CMD);
    rtt = calloc((size_t)count, sizeof(*rtt));
    payload = size ? malloc((size_t)size) : NULL;
    if (rtt == NULL || (size && payload == NULL)) {
        free(rtt);
        free(payload);
        fprintf(stderr, "kvdock: out of memory\n");
        return KVD_CLI_EXIT_DAEMON;
    }
    for (uint64_t i = 0; i < size; i++)
        payload[i] = (uint8_t)(i * 131u + 7u);
    rc = kvd__cli_connect(o, "kvdock-cli", &cli);
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
            rc = kvd__cli_daemon_error(cli, st, "ping");
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
            rc = KVD_CLI_EXIT_DAEMON;
            goto out;
        }
        memcpy(sorted, rtt, (size_t)count * sizeof(*sorted));
        {
            kvd__bench_lat_t lat; /* nearest rank: the p99 of 3 samples is the largest */
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

const kvd__cli_cmd_t kvd__cli_cmd_ping = {
    "ping",
    "ping [--count N] [--size SIZE] [--json]",
    "Round-trip a ping through the daemon and print the times.",
    "ping options:\n"
    "  -c, --count N  pings, one after the other (default 1)\n"
    "  --size SIZE    payload of each, up to 64 MiB (default 0)\n",
    run,
};
