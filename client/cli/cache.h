/*
 * kvdock cache: the cache tier's caches (client/cli/cache.c).
 */
#ifndef KVDOCK_CLI_CACHE_H
#define KVDOCK_CLI_CACHE_H

#include <stdbool.h>

#define KVD_CACHE_USAGE                                                                            \
    "cache create NAME --layers N --tokens-per-block N --token-bytes N --budget SIZE [--mla] "    \
    "[--dtype LABEL] [--shared] [--allow-uids A,B] [--allow-gids A,B] [--open]\n"                  \
    "       kvdock cache ls\n"                                                                     \
    "       kvdock cache stats|drop|clear NAME|--id ID"
#define KVD_CACHE_HELP                                                                             \
    "Manage the cache tier's caches: create, list, show one's contents and counters, drop, or "   \
    "clear (evict every block nothing holds)."

/* Run `kvdock cache`: argv[0] is "cache", argv[1] the subcommand.  0 on
 * success, 1 on a daemon error, 2 on a usage error. */
int kvd__cli_cache(const char *socket, bool json, int argc, char **argv);

/* The option help printed by `kvdock cache --help`. */
void kvd__cli_cache_help(void);

#endif /* KVDOCK_CLI_CACHE_H */
