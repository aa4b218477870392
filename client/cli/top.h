/*
 * kvdock top: a live view of a running kvdockd (client/cli/top.c).
 */
#ifndef KVDOCK_CLI_TOP_H
#define KVDOCK_CLI_TOP_H

#include <stdbool.h>

#define KVD_TOP_USAGE "top [--once] [--interval SECONDS] [--count N]"
#define KVD_TOP_HELP                                                                               \
    "Live view of the daemon, refreshed every second: throughput per stream and per operation, " \
    "pool occupancy, clients and in-flight requests.  q or Ctrl-C quits."

/* Run `kvdock top`: argv[0] is "top", the rest its options.  socket may be
 * NULL (the default path).  0 on a clean exit (q, Ctrl-C, --once,
 * --count), 1 when the daemon cannot be reached, 2 on a usage error. */
int kvd__cli_top(const char *socket, bool json, int argc, char **argv);

/* The option help printed by `kvdock top --help`. */
void kvd__cli_top_help(void);

#endif /* KVDOCK_CLI_TOP_H */
