/*
 * kvdock cache: the cache tier's caches from the command line (create, ls,
 * stats, drop, clear).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

#define CMD (&kvd__cli_cmd_cache)
#define usage(...) kvd__cli_usage(CMD, __VA_ARGS__)

/* "12.5%" of hit tokens among those asked for, or "-": a hit is a key the
 * daemon can serve, from its host memory, its disk or a cluster peer. */
static void hit_rate(char *buf, size_t cap, const kvd_cache_info_t *c)
{
    if (c->keys_asked == 0)
        snprintf(buf, cap, "-");
    else
        snprintf(buf, cap, "%.1f%%", 100.0 * (double)c->keys_hit / (double)c->keys_asked);
}

static void ids_json(const uint32_t *ids, uint32_t n)
{
    putchar('[');
    for (uint32_t i = 0; i < n; i++)
        printf("%s%u", i ? "," : "", ids[i]);
    putchar(']');
}

static void cache_json(const kvd_cache_info_t *c)
{
    printf("{\"id\":%" PRIu64 ",\"name\":", c->id);
    kvd__cli_json_str(c->name);
    printf(",\"layout\":{\"num_layers\":%u,\"mla\":%s,\"tokens_per_block\":%u,"
           "\"token_bytes\":%" PRIu64 ",\"dtype\":",
           c->layout.num_layers, c->layout.mla ? "true" : "false", c->layout.tokens_per_block,
           c->layout.token_bytes);
    kvd__cli_json_str(c->layout.dtype);
    printf("},\"budget_bytes\":%" PRIu64 ",\"block_bytes\":%" PRIu64 ",\"capacity\":%u,"
           "\"blocks\":%u,\"used_bytes\":%" PRIu64 ",\"held_bytes\":%" PRIu64 ",\"shared\":%s,"
           "\"owner_uid\":%u,\"allow_uids\":",
           c->budget_bytes, c->block_bytes, c->capacity, c->blocks, c->used_bytes, c->held_bytes,
           c->shared ? "true" : "false", c->owner_uid);
    ids_json(c->allow_uids, c->num_allow_uids);
    printf(",\"allow_gids\":");
    ids_json(c->allow_gids, c->num_allow_gids);
    printf(",\"lookups\":%" PRIu64 ",\"keys_asked\":%" PRIu64 ",\"keys_hit\":%" PRIu64
           ",\"hit_tokens\":%" PRIu64 ",\"asked_tokens\":%" PRIu64 ",\"saves\":%" PRIu64
           ",\"stored\":%" PRIu64 ",\"skipped\":%" PRIu64 ",\"refused\":%" PRIu64
           ",\"loads\":%" PRIu64 ",\"loaded\":%" PRIu64 ",\"evictions\":%" PRIu64
           ",\"leases\":%u,\"bytes_in\":%" PRIu64 ",\"bytes_out\":%" PRIu64
           ",\"cluster\":%s,\"fetched\":%" PRIu64 ",\"served\":%" PRIu64
           ",\"peer_hits\":%" PRIu64,
           c->lookups, c->keys_asked, c->keys_hit, c->keys_hit * c->layout.tokens_per_block,
           c->keys_asked * c->layout.tokens_per_block, c->saves, c->stored, c->skipped,
           c->refused, c->loads, c->loaded, c->evictions, c->leases, c->bytes_in, c->bytes_out,
           c->cluster ? "true" : "false", c->fetched, c->served, c->peer_hits);
    if (c->disk.enabled) {
        const kvd_cache_disk_level_t *d = &c->disk;
        printf(",\"disk\":{\"budget_bytes\":%" PRIu64 ",\"blocks\":%u,\"used_bytes\":%" PRIu64
               ",\"hits\":%" PRIu64 ",\"spills\":%" PRIu64 ",\"promotions\":%" PRIu64
               ",\"reads\":%" PRIu64 ",\"read_bytes\":%" PRIu64 ",\"writes\":%" PRIu64
               ",\"write_bytes\":%" PRIu64 ",\"evictions\":%" PRIu64
               ",\"checksum_failures\":%" PRIu64 ",\"io_errors\":%" PRIu64
               ",\"no_space\":%" PRIu64 ",\"path\":",
               d->budget_bytes, d->blocks, d->used_bytes, d->hits, d->spills, d->promotions,
               d->reads, d->read_bytes, d->writes, d->write_bytes, d->evictions,
               d->checksum_failures, d->io_errors, d->no_space);
        kvd__cli_json_str(d->path);
        putchar('}');
    } else {
        printf(",\"disk\":null");
    }
    putchar('}');
}

static void layout_text(char *buf, size_t cap, const kvd_cache_info_t *c)
{
    char row[32];

    kvd__cli_human_bytes(row, sizeof(row), (double)c->layout.token_bytes);
    snprintf(buf, cap, "%uL %s %ux%s%s%s", c->layout.num_layers, c->layout.mla ? "mla" : "kv",
             c->layout.tokens_per_block, row, c->layout.dtype[0] ? " " : "", c->layout.dtype);
}

static void caches_table(const kvd_cache_info_t *c, size_t n)
{
    kvd__cli_table_t t;

    kvd__cli_table_init(&t, "ID,NAME,LAYOUT,>BLOCKS,>USED,>RESERVED,>BUDGET,>DISK_BLOCKS,"
                            ">DISK_BUDGET,>HIT,>SAVES,>LOADS,>EVICTED,>LEASES,>OWNER,FLAGS");
    for (size_t i = 0; i < n; i++) {
        char id[24], lay[64], blocks[24], used[32], held[32], budget[32], hit[16], saves[24],
            loads[24], ev[24], leases[16], owner[16], flags[40], dblocks[24], dbudget[32];

        snprintf(id, sizeof(id), "%" PRIu64, c[i].id);
        layout_text(lay, sizeof(lay), &c[i]);
        snprintf(blocks, sizeof(blocks), "%u", c[i].blocks);
        /* what its blocks take; and the host memory it holds for them (their
         * slabs, a slab at a time, its entries and index) */
        kvd__cli_human_bytes(used, sizeof(used), (double)c[i].used_bytes);
        kvd__cli_human_bytes(held, sizeof(held), (double)c[i].held_bytes);
        kvd__cli_human_bytes(budget, sizeof(budget), (double)c[i].budget_bytes);
        /* the disk level: "-" for a cache without one */
        if (c[i].disk.enabled) {
            snprintf(dblocks, sizeof(dblocks), "%u", c[i].disk.blocks);
            kvd__cli_human_bytes(dbudget, sizeof(dbudget), (double)c[i].disk.budget_bytes);
        } else {
            snprintf(dblocks, sizeof(dblocks), "-");
            snprintf(dbudget, sizeof(dbudget), "-");
        }
        hit_rate(hit, sizeof(hit), &c[i]);
        snprintf(saves, sizeof(saves), "%" PRIu64, c[i].saves);
        snprintf(loads, sizeof(loads), "%" PRIu64, c[i].loads);
        snprintf(ev, sizeof(ev), "%" PRIu64, c[i].evictions);
        snprintf(leases, sizeof(leases), "%u", c[i].leases);
        snprintf(owner, sizeof(owner), "%u", c[i].owner_uid);
        snprintf(flags, sizeof(flags), "%s%s%s",
                 !c[i].shared ? ""
                 : c[i].num_allow_uids || c[i].num_allow_gids ? "shared,restricted"
                                                              : "shared",
                 c[i].shared && c[i].cluster ? "," : "", c[i].cluster ? "cluster" : "");
        kvd__cli_table_row(&t, id, c[i].name, lay, blocks, used, held, budget, dblocks, dbudget,
                           hit, saves, loads, ev, leases, owner, flags[0] != '\0' ? flags : "-");
    }
    kvd__cli_table_print(&t);
}

static void cache_text(const kvd_cache_info_t *c)
{
    char a[32], b[32], lay[64], hit[16];

    layout_text(lay, sizeof(lay), c);
    hit_rate(hit, sizeof(hit), c);
    printf("cache %s (id %" PRIu64 "), owner uid %u%s\n", c->name, c->id, c->owner_uid,
           c->shared ? ", shared" : "");
    kvd__cli_human_bytes(a, sizeof(a), (double)c->block_bytes);
    printf("  layout       %s: blocks of %s\n", lay, a);
    kvd__cli_human_bytes(a, sizeof(a), (double)c->used_bytes);
    kvd__cli_human_bytes(b, sizeof(b), (double)c->budget_bytes);
    printf("  host blocks  %u of %u (%s of %s)\n", c->blocks, c->capacity, a, b);
    kvd__cli_human_bytes(a, sizeof(a), (double)c->held_bytes);
    printf("  host memory  %s held (slabs, entries, index)\n", a);
    printf("  lookups      %" PRIu64 ": %" PRIu64 " of %" PRIu64 " tokens hit (%s)", c->lookups,
           c->keys_hit * c->layout.tokens_per_block, c->keys_asked * c->layout.tokens_per_block,
           hit);
    if (c->cluster)
        printf(", %" PRIu64 " of them on peers", c->peer_hits * c->layout.tokens_per_block);
    putchar('\n');
    kvd__cli_human_bytes(a, sizeof(a), (double)c->bytes_in);
    printf("  saves        %" PRIu64 ": %" PRIu64 " blocks stored (%s), %" PRIu64
           " found there, %" PRIu64 " refused\n",
           c->saves, c->stored, a, c->skipped, c->refused);
    kvd__cli_human_bytes(a, sizeof(a), (double)c->bytes_out);
    printf("  loads        %" PRIu64 ": %" PRIu64 " blocks (%s)\n", c->loads, c->loaded, a);
    printf("  evictions    %" PRIu64 "\n  leases       %u held now\n", c->evictions, c->leases);
    if (c->disk.enabled) {
        const kvd_cache_disk_level_t *d = &c->disk;
        char r[32];

        kvd__cli_human_bytes(a, sizeof(a), (double)d->used_bytes);
        kvd__cli_human_bytes(b, sizeof(b), (double)d->budget_bytes);
        printf("  disk blocks  %u (%s of %s) in %s\n", d->blocks, a, b, d->path);
        kvd__cli_human_bytes(a, sizeof(a), (double)d->write_bytes);
        kvd__cli_human_bytes(r, sizeof(r), (double)d->read_bytes);
        printf("  disk         %" PRIu64 " hits; %s written in %" PRIu64 " writes; %" PRIu64
               " spilled (host copy dropped); %" PRIu64 " promoted (%s in %" PRIu64
               " reads); %" PRIu64 " evicted\n",
               d->hits, a, d->writes, d->spills, d->promotions, r, d->reads, d->evictions);
        printf("  disk faults  %" PRIu64 " checksum failures, %" PRIu64 " I/O errors, %" PRIu64
               " spills refused for space\n",
               d->checksum_failures, d->io_errors, d->no_space);
    } else {
        printf("  disk         none (no disk budget)\n");
    }
    if (c->cluster)
        printf("  cluster      %" PRIu64 " blocks pulled from peers, %" PRIu64 " served to them\n",
               c->fetched, c->served);
    if (c->num_allow_uids || c->num_allow_gids) {
        printf("  allowed      uids");
        for (uint32_t i = 0; i < c->num_allow_uids; i++)
            printf(" %u", c->allow_uids[i]);
        printf("; gids");
        for (uint32_t i = 0; i < c->num_allow_gids; i++)
            printf(" %u", c->allow_gids[i]);
        putchar('\n');
    }
}

/* "1,2,3" into ids (at most KVD_CACHE_ALLOW_MAX). */
static bool parse_ids(const char *s, uint32_t *ids, uint32_t *n)
{
    char buf[256], *save = NULL, *tok;

    if (s == NULL || strlen(s) >= sizeof(buf))
        return false;
    snprintf(buf, sizeof(buf), "%s", s);
    *n = 0;
    for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (*n == KVD_CACHE_ALLOW_MAX || !kvd__cli_parse_u64(tok, &v, false) || v > UINT32_MAX)
            return false;
        ids[(*n)++] = (uint32_t)v;
    }
    return *n > 0;
}

enum {
    O_LAYERS = 1,
    O_TPB,
    O_TOKEN_BYTES,
    O_BUDGET,
    O_DTYPE,
    O_ALLOW_UIDS,
    O_ALLOW_GIDS,
    O_MLA,
    O_SHARED,
    O_OPEN,
    O_CLUSTER,
    O_DISK_BUDGET,
    O_ID,
};

static int cmd_create(kvd_client_t **cli, kvd__cli_ctx_t *o, int argc, char **argv)
{
    static const kvd__cli_opt_t opts[] = {
        {"layers", 0, true, O_LAYERS},
        {"tokens-per-block", 0, true, O_TPB},
        {"token-bytes", 0, true, O_TOKEN_BYTES},
        {"budget", 0, true, O_BUDGET},
        {"dtype", 0, true, O_DTYPE},
        {"allow-uids", 0, true, O_ALLOW_UIDS},
        {"allow-gids", 0, true, O_ALLOW_GIDS},
        {"mla", 0, false, O_MLA},
        {"shared", 0, false, O_SHARED},
        {"open", 0, false, O_OPEN},
        {"cluster", 0, false, O_CLUSTER},
        {"disk-budget", 0, true, O_DISK_BUDGET},
        KVD_CLI_OPT_END,
    };
    kvd__cli_args_t a;
    kvd_cache_spec_t s;
    kvd_cache_info_t info;
    uint32_t uids[KVD_CACHE_ALLOW_MAX], gids[KVD_CACHE_ALLOW_MAX];
    bool have_layers = false, have_tpb = false, have_tb = false, have_budget = false;
    kvd_status_t st;
    uint64_t v;
    int id;

    memset(&s, 0, sizeof(s));
    kvd__cli_args_init(&a, argc, argv, 2, opts, o);
    while ((id = kvd__cli_next(&a)) != KVD_CLI_DONE) {
        const char *val = a.val;

        switch (id) {
        case KVD_CLI_BAD:
            return usage("%s", a.err);
        case KVD_CLI_ARG:
            if (s.name != NULL)
                return usage("unexpected argument '%s'", val);
            s.name = val;
            break;
        case O_LAYERS:
            if (!kvd__cli_parse_u64(val, &v, false) || v == 0 || v > UINT32_MAX)
                return usage("--layers needs a count from 1, not '%s'", val);
            s.layout.num_layers = (uint32_t)v;
            have_layers = true;
            break;
        case O_TPB:
            if (!kvd__cli_parse_u64(val, &v, false) || v == 0 || v > UINT32_MAX)
                return usage("--tokens-per-block needs a count from 1, not '%s'", val);
            s.layout.tokens_per_block = (uint32_t)v;
            have_tpb = true;
            break;
        case O_TOKEN_BYTES:
            if (!kvd__cli_parse_u64(val, &v, true) || v == 0)
                return kvd__cli_bad_size(CMD, "--token-bytes", val, NULL);
            s.layout.token_bytes = v;
            have_tb = true;
            break;
        case O_BUDGET:
            if (!kvd__cli_parse_u64(val, &v, true) || v == 0)
                return kvd__cli_bad_size(CMD, "--budget", val, "1.5G, 512MiB");
            s.budget_bytes = v;
            have_budget = true;
            break;
        case O_DTYPE:
            if (strlen(val) >= sizeof(s.layout.dtype))
                return usage("--dtype needs a label of at most 15 characters");
            snprintf(s.layout.dtype, sizeof(s.layout.dtype), "%s", val);
            break;
        case O_ALLOW_UIDS:
            if (!parse_ids(val, uids, &s.num_allow_uids))
                return usage("--allow-uids needs 1 to %d comma-separated user ids",
                             KVD_CACHE_ALLOW_MAX);
            s.allow_uids = uids;
            break;
        case O_ALLOW_GIDS:
            if (!parse_ids(val, gids, &s.num_allow_gids))
                return usage("--allow-gids needs 1 to %d comma-separated group ids",
                             KVD_CACHE_ALLOW_MAX);
            s.allow_gids = gids;
            break;
        case O_MLA:
            s.layout.mla = true;
            break;
        case O_SHARED:
            s.shared = true;
            break;
        case O_OPEN:
            s.open_existing = true;
            break;
        case O_CLUSTER:
            s.cluster = true;
            break;
        case O_DISK_BUDGET:
            if (!kvd__cli_parse_u64(val, &v, true) || v == 0)
                return kvd__cli_bad_size(CMD, "--disk-budget", val, "200g, 512MiB");
            s.disk_budget_bytes = v;
            break;
        }
    }
    if (o->help)
        return kvd__cli_help(CMD);
    if (s.name == NULL)
        return usage("a cache NAME is needed");
    if (!have_layers || !have_tpb || !have_tb || !have_budget)
        return usage("--layers, --tokens-per-block, --token-bytes and --budget are required");
    if (kvd__cli_connect(o, "kvdock-cli", cli) != 0)
        return KVD_CLI_EXIT_DAEMON;
    if ((st = kvd_cache_create(*cli, &s, &info)) != KVD_OK)
        return kvd__cli_daemon_error(*cli, st, "cache create");
    if (o->json) {
        printf("{\"cache\":");
        cache_json(&info);
        printf("}\n");
    } else {
        char b[32], blk[32];
        kvd__cli_human_bytes(b, sizeof(b), (double)info.budget_bytes);
        kvd__cli_human_bytes(blk, sizeof(blk), (double)info.block_bytes);
        printf("%s cache %s (id %" PRIu64 "): %u blocks of %s in %s%s",
               s.open_existing ? "open:" : "created", info.name, info.id, info.capacity, blk, b,
               info.shared ? ", shared" : "");
        if (info.budget_bytes != s.budget_bytes) { /* an existing cache keeps its own */
            char asked[32];
            kvd__cli_human_bytes(asked, sizeof(asked), (double)s.budget_bytes);
            printf(" (its budget, not the %s asked)", asked);
        }
        if (info.disk.enabled) {
            kvd__cli_human_bytes(b, sizeof(b), (double)info.disk.budget_bytes);
            printf("; %s on disk (%u blocks there)", b, info.disk.blocks);
        }
        putchar('\n');
    }
    return 0;
}

/* All caches this client may see (*out malloc'd). */
static kvd_status_t list_all(kvd_client_t *cli, kvd_cache_info_t **out, size_t *n)
{
    size_t cap = 16;

    for (;;) {
        kvd_cache_info_t *c = calloc(cap, sizeof(*c));
        kvd_status_t st;

        if (c == NULL)
            return KVD_ENOMEM;
        st = kvd_cache_list(cli, c, cap, n);
        if (st != KVD_OK || *n <= cap) {
            *out = c;
            return st;
        }
        free(c);
        cap = *n;
    }
}

static int cmd_ls(kvd_client_t **cli, kvd__cli_ctx_t *o, int argc, char **argv)
{
    kvd_cache_info_t *c = NULL;
    size_t n = 0;
    kvd_status_t st;
    int rc;

    if ((rc = kvd__cli_no_args(CMD, o, argc, argv, 2)) != 0 || o->help)
        return rc;
    if (kvd__cli_connect(o, "kvdock-cli", cli) != 0)
        return KVD_CLI_EXIT_DAEMON;
    if ((st = list_all(*cli, &c, &n)) != KVD_OK) {
        free(c);
        return kvd__cli_daemon_error(*cli, st, "cache ls");
    }
    if (o->json) {
        printf("{\"caches\":[");
        for (size_t i = 0; i < n; i++) {
            if (i)
                putchar(',');
            cache_json(&c[i]);
        }
        printf("]}\n");
    } else if (n == 0) {
        printf("no caches\n");
    } else {
        caches_table(c, n);
    }
    free(c);
    return 0;
}

/* stats, drop and clear name one cache: NAME or --id ID. */
static int cmd_one(kvd_client_t **cli, kvd__cli_ctx_t *o, int argc, char **argv)
{
    static const kvd__cli_opt_t opts[] = {{"id", 0, true, O_ID}, KVD_CLI_OPT_END};
    kvd__cli_args_t a;
    const char *sub = argv[1], *name = NULL;
    char what[32];
    uint64_t id = 0;
    kvd_cache_info_t info;
    kvd_status_t st;
    int r;

    kvd__cli_args_init(&a, argc, argv, 2, opts, o);
    while ((r = kvd__cli_next(&a)) != KVD_CLI_DONE) {
        if (r == KVD_CLI_BAD)
            return usage("%s", a.err);
        if (r == KVD_CLI_ARG) {
            if (name != NULL)
                return usage("unexpected argument '%s'", a.val);
            name = a.val;
        } else if (!kvd__cli_parse_u64(a.val, &id, false) || id == 0) {
            return usage("--id needs a cache id, not '%s'", a.val);
        }
    }
    if (o->help)
        return kvd__cli_help(CMD);
    if (name == NULL && id == 0)
        return usage("%s needs a cache NAME (or --id ID)", sub);
    snprintf(what, sizeof(what), "cache %s", sub);
    if (kvd__cli_connect(o, "kvdock-cli", cli) != 0)
        return KVD_CLI_EXIT_DAEMON;
    if ((st = kvd_cache_stats(*cli, id, name, &info)) != KVD_OK)
        return kvd__cli_daemon_error(*cli, st, what);
    if (strcmp(sub, "stats") == 0) {
        if (o->json) {
            printf("{\"cache\":");
            cache_json(&info);
            printf("}\n");
        } else {
            cache_text(&info);
        }
        return 0;
    }
    if (strcmp(sub, "drop") == 0) {
        if ((st = kvd_cache_drop(*cli, info.id, NULL)) != KVD_OK)
            return kvd__cli_daemon_error(*cli, st, what);
        if (o->json) {
            printf("{\"dropped\":%" PRIu64 ",\"blocks\":%u}\n", info.id, info.blocks);
        } else {
            printf("dropped cache %s (id %" PRIu64 ", %u blocks)\n", info.name, info.id,
                   info.blocks);
        }
        return 0;
    }
    /* clear */
    {
        kvd_cache_evict_result_t ev;
        if ((st = kvd_cache_evict(*cli, info.id, NULL, true, &ev)) != KVD_OK)
            return kvd__cli_daemon_error(*cli, st, what);
        if (o->json)
            printf("{\"cache\":%" PRIu64 ",\"evicted\":%u}\n", info.id, ev.evicted);
        else
            printf("cleared cache %s: %u blocks evicted%s\n", info.name, ev.evicted,
                   ev.evicted < info.blocks ? " (held blocks stay)" : "");
    }
    return 0;
}

static int run(kvd__cli_ctx_t *o, int argc, char **argv)
{
    kvd_client_t *cli = NULL;
    const char *sub;
    int rc = kvd__cli_subcommand(CMD, o, argc, argv, &sub);

    if (rc != 0 || sub == NULL)
        return rc;
    if (strcmp(sub, "create") == 0)
        rc = cmd_create(&cli, o, argc, argv);
    else if (strcmp(sub, "ls") == 0 || strcmp(sub, "list") == 0)
        rc = cmd_ls(&cli, o, argc, argv);
    else if (strcmp(sub, "stats") == 0 || strcmp(sub, "drop") == 0 || strcmp(sub, "clear") == 0)
        rc = cmd_one(&cli, o, argc, argv);
    else if (o->help)
        rc = kvd__cli_help(CMD);
    else {
        static const char *const subs[] = {"create", "ls", "stats", "drop", "clear", NULL};
        const char *near = kvd__cli_nearest_word(sub, subs);

        if (near != NULL)
            rc = usage("unknown subcommand '%s' (did you mean %s?)", sub, near);
        else
            rc = usage("unknown subcommand '%s' (create, ls, stats, drop or clear)", sub);
    }
    kvd_client_destroy(&cli);
    return rc;
}

const kvd__cli_cmd_t kvd__cli_cmd_cache = {
    "cache",
    "cache create NAME --layers N --tokens-per-block N --token-bytes SIZE --budget SIZE\n"
    "                    [--mla] [--dtype LABEL] [--shared] [--allow-uids A,B]\n"
    "                    [--allow-gids A,B] [--open] [--cluster] [--disk-budget SIZE]\n"
    "                    [--json]\n"
    "       kvdock cache ls [--json]\n"
    "       kvdock cache stats|drop|clear NAME|--id ID [--json]",
    "Manage the cache tier's caches: create, list, show one's contents and counters, drop,\n"
    "or clear (evict every block nothing holds).",
    "cache create options:\n"
    "  --layers N            layers of a block, >= 1\n"
    "  --tokens-per-block N  tokens of a block (the engine's block size)\n"
    "  --token-bytes SIZE    one token's row of one layer's K (or V)\n"
    "  --budget SIZE         host memory for blocks at most (SIZE: bytes, or with a unit:\n"
    "                        K M G T, KiB MiB ...: powers of 1024; KB MB ...: powers of\n"
    "                        1000; fractions like 1.5G)\n"
    "  --mla                 one latent per layer instead of K and V\n"
    "  --dtype LABEL         element type label, compared exactly (\"bf16\")\n"
    "  --shared              other users may use it\n"
    "  --allow-uids A,B      shared with these users only (and --allow-gids)\n"
    "  --allow-gids A,B      shared with members of these groups only\n"
    "  --open                return an existing cache of this name and layout\n"
    "  --cluster             also reach the caches of this name on the cluster's peers\n"
    "  --disk-budget SIZE    a disk level: blocks leave host memory for disk (kvdockd\n"
    "                        --cache-dir) rather than being dropped, up to SIZE, and come\n"
    "                        back when the daemon restarts\n"
    "\nA cache belongs to the user that made it (OWNER: its user id) and stays until\n"
    "dropped.  `cache ls` USED: the bytes of its blocks in host memory; RESERVED: the\n"
    "host memory it holds for them (slabs, taken a slab at a time, and its entries\n"
    "and index); DISK_BLOCKS and DISK_BUDGET: its disk level (\"-\": none); HIT: of\n"
    "the tokens lookups asked for, those found in host memory, on disk or (a\n"
    "--cluster cache) on a peer: what a load can bring.  `cache stats` shows the rest.\n",
    run,
};
