/*
 * kvdock: the admin CLI of kvdockd, on libkvdock.
 *
 *   kvdock [--socket PATH] [--json] COMMAND [ARGS]
 *
 * Human-readable tables by default, one JSON object with --json.  Exit
 * status: 0 on success, 1 when the daemon (or the connection) reports an
 * error, 2 on a usage error.  Each command lives in a file of its own
 * (commands.h); options are parsed getopt_long style (util.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "kvdock/client.h"
#include "wire.h"

static const kvd__cli_cmd_t *const cmds[] = {
    &kvd__cli_cmd_status, &kvd__cli_cmd_pools, &kvd__cli_cmd_pool,
    &kvd__cli_cmd_stats,  &kvd__cli_cmd_ping,  &kvd__cli_cmd_shutdown,
    &kvd__cli_cmd_cache,  &kvd__cli_cmd_bench, &kvd__cli_cmd_top,
};
#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

const char *kvd__cli_path_name(int path)
{
    return path == KVD_PATH_COPY_ENGINE ? "copy-engine" : path == KVD_PATH_KERNEL ? "kernel"
                                                                                  : "default";
}

int kvd__cli_no_args(const kvd__cli_cmd_t *cmd, kvd__cli_ctx_t *ctx, int argc, char **argv,
                     int first)
{
    kvd__cli_args_t a;
    int id;

    kvd__cli_args_init(&a, argc, argv, first, NULL, ctx);
    while ((id = kvd__cli_next(&a)) != KVD_CLI_DONE) {
        if (id == KVD_CLI_BAD)
            return kvd__cli_usage(cmd, "%s", a.err);
        return kvd__cli_usage(cmd, "unexpected argument '%s'", a.val);
    }
    return ctx->help ? kvd__cli_help(cmd) : 0;
}

int kvd__cli_subcommand(const kvd__cli_cmd_t *cmd, kvd__cli_ctx_t *ctx, int argc, char **argv,
                        const char **sub)
{
    kvd__cli_args_t a;
    int id;

    *sub = NULL;
    kvd__cli_args_init(&a, argc, argv, 1, NULL, ctx);
    while ((id = kvd__cli_next(&a)) != KVD_CLI_DONE) {
        if (id == KVD_CLI_ARG) {
            /* move it to argv[1]; what came before it follows it */
            char *s = argv[a.next - 1];

            memmove(&argv[2], &argv[1], (size_t)(a.next - 2) * sizeof(*argv));
            argv[1] = s;
            *sub = s;
            return 0;
        }
        /* a subcommand's option before the subcommand: its parse says */
        if (id == KVD_CLI_BAD)
            break;
    }
    if (ctx->help)
        return kvd__cli_help(cmd);
    if (id == KVD_CLI_BAD)
        return kvd__cli_usage(cmd, "%s (options come after the subcommand)", a.err);
    return kvd__cli_usage(cmd, "a subcommand is needed");
}

static const kvd__cli_cmd_t *find_cmd(const char *name)
{
    for (size_t i = 0; i < NCMDS; i++)
        if (strcmp(cmds[i]->name, name) == 0)
            return cmds[i];
    return NULL;
}

/* "  name      summary", the summary wrapped within 80 columns under itself. */
static void print_summary(FILE *f, const char *name, const char *summary)
{
    enum { INDENT = 12, WIDTH = 80 };
    const char *p = summary;
    int col = fprintf(f, "  %-9s", name);

    while (*p != '\0') {
        size_t n;

        while (*p == ' ' || *p == '\n')
            p++;
        n = strcspn(p, " \n");
        if (n == 0)
            break;
        if (col > INDENT && col + 1 + (int)n > WIDTH)
            col = fprintf(f, "\n%*s", INDENT - 1, "") - 1;
        col += fprintf(f, " %.*s", (int)n, p);
        p += n;
    }
    fputc('\n', f);
}

static void print_usage(FILE *f)
{
    char path[256];

    if (kvd__default_socket_path(path, sizeof(path)) != KVD_OK)
        snprintf(path, sizeof(path), "(too long)");
    fprintf(f, "usage: kvdock [--socket PATH] [--json] COMMAND [ARGS]\n\n"
               "Admin CLI of kvdockd, the KV-cache daemon.\n\ncommands:\n");
    for (size_t i = 0; i < NCMDS; i++)
        print_summary(f, cmds[i]->name, cmds[i]->summary);
    fprintf(f,
            "\noptions (before or after the command):\n"
            "  -s, --socket PATH  the daemon's socket; now %s:\n"
            "                     $KVDOCK_SOCKET, else /run/kvdock/kvdockd.sock when a system\n"
            "                     service listens there, else\n"
            "                     $XDG_RUNTIME_DIR/kvdock/kvdockd.sock, else\n"
            "                     /tmp/kvdock-<uid>/kvdockd.sock\n"
            "  --json             print one JSON object instead of tables\n"
            "  -h, --help         this help; 'kvdock COMMAND --help' for a command\n"
            "  --version          kvdock's version, its library's ABI, the protocol\n"
            "  --                 the end of the options: what follows is arguments\n\n"
            "Numbers are decimal; a SIZE is bytes, or a number with a unit: K, M, G, T (or\n"
            "KiB, MiB, ...: powers of 1024), KB, MB, GB, TB (powers of 1000), fractions\n"
            "like 1.5G.  Option names are whole (no abbreviations).\n\n"
            "exit status: 0 ok, 1 daemon or connection error, 2 usage error\n",
            path);
}

enum { O_VERSION = 1 };

int main(int argc, char **argv)
{
    static const kvd__cli_opt_t opts[] = {{"version", 0, false, O_VERSION}, KVD_CLI_OPT_END};
    kvd__cli_ctx_t ctx;
    kvd__cli_args_t a;
    const kvd__cli_cmd_t *c;
    int id;

    memset(&ctx, 0, sizeof(ctx));
    /* the options before the command; the command parses the rest */
    kvd__cli_args_init(&a, argc, argv, 1, opts, &ctx);
    while ((id = kvd__cli_next(&a)) != KVD_CLI_DONE && id != KVD_CLI_ARG) {
        if (id == KVD_CLI_BAD)
            return kvd__cli_usage(NULL, "%s", a.err);
        printf("kvdock %s (libkvdock ABI %d, protocol %u)\n", KVD_VERSION,
               kvd_client_abi_version(), KVD_PROTOCOL_VERSION);
        return 0;
    }
    if (id == KVD_CLI_DONE) {
        print_usage(ctx.help ? stdout : stderr);
        return ctx.help ? 0 : KVD_CLI_EXIT_USAGE;
    }
    c = find_cmd(a.val);
    if (c == NULL) {
        const char *names[NCMDS + 1], *near;

        for (size_t i = 0; i < NCMDS; i++)
            names[i] = cmds[i]->name;
        names[NCMDS] = NULL;
        near = kvd__cli_nearest_word(a.val, names);
        if (near != NULL)
            return kvd__cli_usage(NULL, "unknown command '%s' (did you mean %s?)", a.val, near);
        return kvd__cli_usage(NULL, "unknown command '%s'", a.val);
    }
    /* the command sees argv from its name on */
    return c->run(&ctx, argc - (a.next - 1), argv + (a.next - 1));
}
