/* What the disk level's daemon suites share: see disk_harness.h. */
#include "disk_harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef KVD_TEST_SCRATCH
#error "KVD_TEST_SCRATCH: a directory on the build tree's file system"
#endif

void kvdt_scratch_make(char *dir, size_t len, const char *name)
{
    char cmd[700];

    ck_assert_int_lt(snprintf(dir, len, "%s/%s-%d", KVD_TEST_SCRATCH, name, (int)getpid()),
                     (int)len);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
}

void kvdt_scratch_remove(const char *dir)
{
    char cmd[1200];

    snprintf(cmd, sizeof(cmd), "chmod -R u+rwx '%s' 2>/dev/null; rm -rf '%s'", dir, dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
}

int kvdt_disk_start(kvdt_daemon_t *d, const char *sock, const char *cache_dir,
                    const char *disk_budget, const char *const *extra, const char *client_name)
{
    const char *argv[32];
    int n = 0;

    argv[n++] = "--cache-dir";
    argv[n++] = cache_dir;
    argv[n++] = "--disk-budget";
    argv[n++] = disk_budget;
    for (int i = 0; extra != NULL && extra[i] != NULL; i++) {
        ck_assert_int_lt(n, 31);
        argv[n++] = extra[i];
    }
    argv[n] = NULL;
    kvdt_start_sock(d, sock, argv);
    return kvdt_client(d, client_name);
}

void kvdt_cache_req(kvdt_cache_req_t *q, uint64_t id, const char *name, uint64_t budget,
                    uint64_t disk_budget)
{
    kvdock__cache_layout__init(&q->cl);
    q->cl.num_layers = 2;
    q->cl.tokens_per_block = 4;
    q->cl.token_bytes = 64;
    q->cl.dtype = "bf16";
    kvdock__cache_create__init(&q->cc);
    q->cc.name = (char *)name;
    q->cc.layout = &q->cl;
    q->cc.budget_bytes = budget;
    q->cc.disk_budget_bytes = disk_budget;
    kvdt_req_init(&q->req, id);
    q->req.op_case = KVDOCK__REQUEST__OP_CACHE_CREATE;
    q->req.cache_create = &q->cc;
}
