/*
 * The kvdock CLI's commands, one file each under client/cli/ (status.c,
 * pools.c, pool.c, stats.c, ping.c, shutdown.c, cache.c, bench.c, top.c);
 * kvdock.c holds the table and main.
 */
#ifndef KVDOCK_CLI_COMMANDS_H
#define KVDOCK_CLI_COMMANDS_H

#include "kvdock/client.h"
#include "util.h"

extern const kvd__cli_cmd_t kvd__cli_cmd_status;
extern const kvd__cli_cmd_t kvd__cli_cmd_pools;
extern const kvd__cli_cmd_t kvd__cli_cmd_pool;
extern const kvd__cli_cmd_t kvd__cli_cmd_stats;
extern const kvd__cli_cmd_t kvd__cli_cmd_ping;
extern const kvd__cli_cmd_t kvd__cli_cmd_shutdown;
extern const kvd__cli_cmd_t kvd__cli_cmd_cache;
extern const kvd__cli_cmd_t kvd__cli_cmd_bench;
extern const kvd__cli_cmd_t kvd__cli_cmd_top;

/* A pool as a JSON object on stdout (pools.c; pool create prints one). */
void kvd__cli_pool_json(const kvd_pool_info_t *p);
/* A kvd_copy_path_t as a word: "copy-engine", "kernel", "default". */
const char *kvd__cli_path_name(int path);

/* Parse a command that takes no options or arguments of its own:
 * 0 to run it, else the exit status (help printed or a usage error). */
int kvd__cli_no_args(const kvd__cli_cmd_t *cmd, kvd__cli_ctx_t *ctx, int argc, char **argv,
                     int first);

/* A command with subcommands: the first argument (common options aside)
 * is moved to argv[1], so that the subcommand parses from argv[2], and
 * *sub names it.  0 with *sub set; else the exit status with *sub NULL
 * (help printed when asked for and no subcommand is given, or a usage
 * error). */
int kvd__cli_subcommand(const kvd__cli_cmd_t *cmd, kvd__cli_ctx_t *ctx, int argc, char **argv,
                        const char **sub);

#endif /* KVDOCK_CLI_COMMANDS_H */
