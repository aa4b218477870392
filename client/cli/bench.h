/*
 * kvdock bench: the daemon benchmark cases, run against a running kvdockd
 * (client/cli/bench.c).
 */
#ifndef KVDOCK_CLI_BENCH_H
#define KVDOCK_CLI_BENCH_H

#include <stdbool.h>

/* The usage and help lines of `kvdock bench`. */
#define KVD_BENCH_USAGE                                                                            \
    "bench [--iterations N] [--duration S] [--clients N] [--window N] [--layers N] "              \
    "[--slots N] [--slot-bytes N] [--max-blocks N] [--kind host|device] [--json]"
#define KVD_BENCH_HELP                                                                             \
    "Benchmark the daemon: ping and one-slot transfer round trips, pipelined requests per "       \
    "second with 1 and N clients, and an all-layer transfer against the same kernel "             \
    "in-process; each figure beside its target."

/* Run `kvdock bench`: argv[0] is "bench", the rest its options.  socket may
 * be NULL (the default path).  Returns the exit status: 0 when every case
 * ran (targets missed or not), 1 on a daemon or connection error, 2 on a
 * usage error. */
int kvd__cli_bench(const char *socket, bool json, int argc, char **argv);

/* The option help printed by `kvdock bench --help`. */
void kvd__cli_bench_help(void);

#endif /* KVDOCK_CLI_BENCH_H */
