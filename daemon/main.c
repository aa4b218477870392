/* kvdockd: arguments, process set-up, run. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <uv.h>

#include "wire.h"
#include "log.h"
#include "options.h"
#include "server.h"

/* Descriptors: each client can hold several (exports in flight). */
static void raise_fd_limit(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int main(int argc, char **argv)
{
    kvd__options_t opts;
    kvd__server_t *srv = NULL;
    uv_loop_t loop;
    char err[512] = "";
    int rc;

    switch (kvd__options_parse_args(&opts, argc, argv, err, sizeof(err))) {
    case KVD_OPTS_HELP:
        kvd__options_help(stdout, argv[0]);
        return 0;
    case KVD_OPTS_VERSION:
        printf("kvdockd %s (protocol %u)\n", KVD_DAEMON_VERSION, KVD_PROTOCOL_VERSION);
        return 0;
    case KVD_OPTS_PRINT:
        kvd__options_print(&opts, stdout);
        return 0;
    case KVD_OPTS_EXAMPLE:
        kvd__options_print_example(stdout);
        return 0;
    case KVD_OPTS_ERROR:
        fprintf(stderr, "kvdockd: %s\n", err);
        return 2;
    case KVD_OPTS_RUN:
        break;
    }
    kvd__log_level = opts.log_level;
    /* Every module loaded when the CUDA context is made, not at a first
     * launch, where a load can wait for queued work, and the loop with it
     * (see kvd_cuda_load_kernels).  Set before the first CUDA call. */
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);
    signal(SIGPIPE, SIG_IGN);
    /* a memfd past RLIMIT_FSIZE then fails with EFBIG (refused, ENOMEM)
     * instead of killing the daemon */
    signal(SIGXFSZ, SIG_IGN);
    raise_fd_limit();

    if (uv_loop_init(&loop) != 0) {
        kvd_log(KVD_LOG_ERROR, "event=start_failed reason=\"uv_loop_init\"");
        return 1;
    }
    if (kvd__server_create(&loop, &opts, &srv, err, sizeof(err)) != KVD_OK) {
        kvd_log(KVD_LOG_ERROR, "event=start_failed reason=\"%s\"", err);
        uv_loop_close(&loop);
        return 1;
    }
    rc = kvd__server_run(srv);
    kvd__server_destroy(&srv);
    if (uv_loop_close(&loop) != 0)
        kvd_log(KVD_LOG_WARN, "event=loop_not_empty");
    kvd_log(KVD_LOG_INFO, "event=exit status=%d", rc);
    return rc;
}
