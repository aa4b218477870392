/*
 * kvdock pool create | drop: shared pools from the command line.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

#define CMD (&kvd__cli_cmd_pool)

enum { O_KIND = 1, O_LAYERS, O_SLOTS, O_SLOT_BYTES, O_PAGE_SIZE, O_MLA, O_SHARED, O_ID };

static int create(kvd__cli_ctx_t *o, int argc, char **argv)
{
    static const kvd__cli_opt_t opts[] = {
        {"kind", 0, true, O_KIND},
        {"layers", 0, true, O_LAYERS},
        {"slots", 0, true, O_SLOTS},
        {"slot-bytes", 0, true, O_SLOT_BYTES},
        {"page-size", 0, true, O_PAGE_SIZE},
        {"mla", 0, false, O_MLA},
        {"shared", 0, false, O_SHARED},
        KVD_CLI_OPT_END,
    };
    kvd__cli_args_t a;
    kvd_client_t *cli = NULL;
    kvd_pool_spec_t spec;
    kvd_pool_info_t info;
    bool have_layers = false, have_slots = false, have_sb = false;
    kvd_status_t st;
    uint64_t v;
    int id, rc;

    memset(&spec, 0, sizeof(spec));
    spec.kind = KVD_MEM_HOST;
    kvd__cli_args_init(&a, argc, argv, 2, opts, o);
    while ((id = kvd__cli_next(&a)) != KVD_CLI_DONE) {
        const char *val = a.val;

        switch (id) {
        case KVD_CLI_BAD:
            return kvd__cli_usage(CMD, "%s", a.err);
        case KVD_CLI_ARG:
            if (spec.name != NULL)
                return kvd__cli_usage(CMD, "unexpected argument '%s'", val);
            spec.name = val;
            break;
        case O_KIND:
            if (strcmp(val, "host") == 0)
                spec.kind = KVD_MEM_HOST;
            else if (strcmp(val, "device") == 0)
                spec.kind = KVD_MEM_DEVICE;
            else if (strcmp(val, "device-vmm") == 0 || strcmp(val, "vmm") == 0)
                spec.kind = KVD_MEM_DEVICE_VMM;
            else
                return kvd__cli_usage(CMD, "--kind must be host, device or device-vmm, not '%s'",
                                      val);
            break;
        case O_LAYERS:
            if (!kvd__cli_parse_u64(val, &v, false) || v == 0 || v > UINT32_MAX)
                return kvd__cli_usage(CMD, "--layers needs a count from 1 to %u, not '%s'",
                                      UINT32_MAX, val);
            spec.num_layers = (uint32_t)v;
            have_layers = true;
            break;
        case O_SLOTS:
            if (!kvd__cli_parse_u64(val, &v, false) || v == 0)
                return kvd__cli_usage(CMD, "--slots needs a positive count, not '%s'", val);
            spec.num_slots = v;
            have_slots = true;
            break;
        case O_SLOT_BYTES:
            if (!kvd__cli_parse_u64(val, &v, true) || v == 0)
                return kvd__cli_bad_size(CMD, "--slot-bytes", val, NULL);
            spec.slot_bytes = v;
            have_sb = true;
            break;
        case O_PAGE_SIZE:
            if (!kvd__cli_parse_u64(val, &v, false) || v > UINT32_MAX)
                return kvd__cli_usage(CMD, "--page-size needs a count, not '%s'", val);
            spec.page_size = (uint32_t)v;
            break;
        case O_MLA:
            spec.mla = true;
            break;
        case O_SHARED:
            spec.shared = true;
            break;
        }
    }
    if (o->help)
        return kvd__cli_help(CMD);
    if (spec.name == NULL)
        return kvd__cli_usage(CMD, "a pool NAME is needed");
    if (!have_layers || !have_slots || !have_sb)
        return kvd__cli_usage(CMD, "--layers, --slots and --slot-bytes are required");
    if (!spec.shared)
        return kvd__cli_usage(CMD,
                              "a private pool lives as long as the connection that made it, and "
                              "kvdock's ends when kvdock exits: --shared makes a pool that stays, "
                              "that other clients may use, and that you (or an admin) drop with "
                              "`kvdock pool drop`");

    if ((rc = kvd__cli_connect(o, "kvdock-cli", &cli)) != 0)
        return rc;
    st = kvd_pool_create(cli, &spec, &info);
    if (st != KVD_OK) {
        rc = kvd__cli_daemon_error(cli, st, "pool create");
        kvd_client_destroy(&cli);
        return rc;
    }
    if (o->json) {
        printf("{\"pool\":");
        kvd__cli_pool_json(&info);
        printf("}\n");
    } else {
        char b[32];

        kvd__cli_human_bytes(b, sizeof(b), (double)info.bytes);
        printf("created pool %s (id %" PRIu64 "): %s, %u layer%s x %" PRIu64 " slot%s x %" PRIu64
               " bytes, %s, %s\n",
               info.name, info.id, kvd_mem_kind_name(info.kind), info.num_layers,
               info.num_layers == 1 ? "" : "s", info.num_slots, info.num_slots == 1 ? "" : "s",
               info.slot_bytes, info.mla ? "mla" : "mha", b);
    }
    kvd_client_destroy(&cli);
    return 0;
}

static int drop(kvd__cli_ctx_t *o, int argc, char **argv)
{
    static const kvd__cli_opt_t opts[] = {{"id", 0, true, O_ID}, KVD_CLI_OPT_END};
    kvd__cli_args_t a;
    kvd_client_t *cli = NULL;
    const char *name = NULL;
    uint64_t pid = 0;
    kvd_status_t st;
    int id, rc;

    kvd__cli_args_init(&a, argc, argv, 2, opts, o);
    while ((id = kvd__cli_next(&a)) != KVD_CLI_DONE) {
        if (id == KVD_CLI_BAD)
            return kvd__cli_usage(CMD, "%s", a.err);
        if (id == KVD_CLI_ARG) {
            if (name != NULL)
                return kvd__cli_usage(CMD, "unexpected argument '%s'", a.val);
            name = a.val;
        } else if (!kvd__cli_parse_u64(a.val, &pid, false) || pid == 0) {
            return kvd__cli_usage(CMD, "--id needs a pool id, not '%s'", a.val);
        }
    }
    if (o->help)
        return kvd__cli_help(CMD);
    if (name == NULL && pid == 0)
        return kvd__cli_usage(CMD, "a pool NAME (or --id ID) is needed");
    if ((rc = kvd__cli_connect(o, "kvdock-cli", &cli)) != 0)
        return rc;
    st = kvd_pool_drop(cli, pid, name);
    if (st != KVD_OK) {
        rc = kvd__cli_daemon_error(cli, st, "pool drop");
        kvd_client_destroy(&cli);
        return rc;
    }
    if (o->json) {
        printf("{\"dropped\":");
        if (name != NULL)
            kvd__cli_json_str(name);
        else
            printf("%" PRIu64, pid);
        printf("}\n");
    } else if (name != NULL) {
        printf("dropped pool %s\n", name);
    } else {
        printf("dropped pool %" PRIu64 "\n", pid);
    }
    kvd_client_destroy(&cli);
    return 0;
}

static int run(kvd__cli_ctx_t *o, int argc, char **argv)
{
    const char *sub;
    int rc = kvd__cli_subcommand(CMD, o, argc, argv, &sub);

    if (rc != 0 || sub == NULL)
        return rc;
    if (strcmp(sub, "create") == 0)
        return create(o, argc, argv);
    if (strcmp(sub, "drop") == 0)
        return drop(o, argc, argv);
    if (o->help)
        return kvd__cli_help(CMD);
    {
        static const char *const subs[] = {"create", "drop", NULL};
        const char *near = kvd__cli_nearest_word(sub, subs);

        if (near != NULL)
            return kvd__cli_usage(CMD, "unknown subcommand '%s' (did you mean %s?)", sub, near);
    }
    return kvd__cli_usage(CMD, "unknown subcommand '%s' (create or drop%s)", sub,
                          strcmp(sub, "list") == 0 || strcmp(sub, "ls") == 0
                              ? "; `kvdock pools` lists them" : "");
}

const kvd__cli_cmd_t kvd__cli_cmd_pool = {
    "pool",
    "pool create NAME --shared --layers N --slots N --slot-bytes SIZE\n"
    "                   [--kind host|device|device-vmm] [--mla] [--page-size N] [--json]\n"
    "       kvdock pool drop NAME|--id ID [--json]",
    "Create or drop a shared pool.",
    "pool create options:\n"
    "  --layers N         layers, >= 1\n"
    "  --slots N          slots per layer\n"
    "  --slot-bytes SIZE  bytes per slot row (SIZE: bytes, or with a unit: K M G T,\n"
    "                     KiB MiB ...: powers of 1024; KB MB ...: powers of 1000; 1.5K)\n"
    "  --kind K           host (default), device or device-vmm\n"
    "  --mla              one latent buffer per layer instead of K and V\n"
    "  --page-size N      slots per page (0 or 1: unpaged)\n"
    "  --shared           required: the pool stays after kvdock exits, other clients may\n"
    "                     use it, and your user (or an admin) drops it with `kvdock pool\n"
    "                     drop`; a private pool would end with kvdock's connection\n"
    "Numbers are decimal (010 is ten).\n",
    run,
};
