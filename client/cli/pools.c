/*
 * kvdock pools: the pools this client may see (an admin: every client's).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

void kvd__cli_pool_json(const kvd_pool_info_t *p)
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

    kvd__cli_table_init(&t, ">ID,NAME,KIND,>LAYERS,>SLOTS,>SLOT_BYTES,LAYOUT,>PAGE,>BYTES,>CLIENT,FLAGS");
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

static int run(kvd__cli_ctx_t *o, int argc, char **argv)
{
    kvd_client_t *cli = NULL;
    kvd_pool_info_t *pools = NULL;
    size_t cap = 64, n = 0;
    kvd_status_t st;
    int rc;

    if ((rc = kvd__cli_no_args(&kvd__cli_cmd_pools, o, argc, argv, 1)) != 0 || o->help)
        return rc;
    if ((rc = kvd__cli_connect(o, "kvdock-cli", &cli)) != 0)
        return rc;
    for (;;) {
        pools = calloc(cap, sizeof(*pools));
        if (pools == NULL) {
            fprintf(stderr, "kvdock: out of memory\n");
            rc = KVD_CLI_EXIT_DAEMON;
            goto out;
        }
        st = kvd_pool_list(cli, pools, cap, &n);
        if (st != KVD_OK) {
            rc = kvd__cli_daemon_error(cli, st, "pools");
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
            kvd__cli_pool_json(&pools[i]);
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

const kvd__cli_cmd_t kvd__cli_cmd_pools = {
    "pools",
    "pools [--json]",
    "List the pools this client may see.",
    "Columns: CLIENT is the id of the client connection that made the pool (the ID of\n"
    "kvdock status; kept after that connection ends); a cache's OWNER (kvdock cache ls)\n"
    "is a user id.  FLAGS: shared (other clients may use it, and it stays after its\n"
    "maker's connection ends), imported (another process's memory: it goes with its\n"
    "importer), orphaned (its maker's connection has ended: a shared pool stays until\n"
    "`kvdock pool drop`).  A pool that `kvdock pool create` makes is shared, and orphaned\n"
    "as soon as kvdock exits.\n",
    run,
};
