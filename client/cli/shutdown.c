/*
 * kvdock shutdown: ask the daemon to exit (admin only).
 */
#include <stdio.h>

#include "commands.h"

#define CMD (&kvd__cli_cmd_shutdown)

enum { O_NO_DRAIN = 1 };

static int run(kvd__cli_ctx_t *o, int argc, char **argv)
{
    static const kvd__cli_opt_t opts[] = {{"no-drain", 0, false, O_NO_DRAIN}, KVD_CLI_OPT_END};
    kvd__cli_args_t a;
    kvd_client_t *cli = NULL;
    bool drain = true;
    kvd_status_t st;
    int id, rc;

    kvd__cli_args_init(&a, argc, argv, 1, opts, o);
    while ((id = kvd__cli_next(&a)) != KVD_CLI_DONE) {
        if (id == KVD_CLI_BAD)
            return kvd__cli_usage(CMD, "%s", a.err);
        if (id == KVD_CLI_ARG)
            return kvd__cli_usage(CMD, "unexpected argument '%s'", a.val);
        drain = false;
    }
    if (o->help)
        return kvd__cli_help(CMD);
    if ((rc = kvd__cli_connect(o, "kvdock-cli", &cli)) != 0)
        return rc;
    st = kvd_daemon_shutdown(cli, drain);
    if (st != KVD_OK) {
        rc = kvd__cli_daemon_error(cli, st, "shutdown");
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

const kvd__cli_cmd_t kvd__cli_cmd_shutdown = {
    "shutdown",
    "shutdown [--no-drain] [--json]",
    "Ask the daemon to exit, finishing in-flight work first (admin only).",
    "shutdown options:\n"
    "  --no-drain  exit without finishing the work in flight\n",
    run,
};
