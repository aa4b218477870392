/*
 * kvdockd's options: ONE table (options.c) from which the command-line
 * parser, the config-file parser (`key = value` lines) and --help are all
 * generated.  Command-line values override the config file's.
 */
#ifndef KVD_DAEMON_OPTIONS_H
#define KVD_DAEMON_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvdock/status.h"
#include "kvdock/types.h"

#define KVD_OPT_STR_MAX 256
/* --cluster-peers: as many HOST:PORT as the cluster takes (64 of up to
 * 255 bytes each, with their commas) */
#define KVD_OPT_PEERS_MAX 16384

enum kvd__backend_choice {
    KVD_BACKEND_CPU = 0,
    KVD_BACKEND_CUDA = 1,
    KVD_BACKEND_AUTO = 2,
};

/* Values are the index in the option's choices ("loop|poll|hostfunc"). */
enum kvd__cuda_completion {
    KVD_COMPLETION_LOOP = 0,     /* the event loop itself polls while work is in flight */
    KVD_COMPLETION_POLL = 1,     /* a thread polls an event per operation */
    KVD_COMPLETION_HOSTFUNC = 2, /* cudaLaunchHostFunc */
};

/* --copy-issue: the index in its choices. */
enum kvd__copy_issue {
    KVD_COPY_ISSUE_BATCH = 0,
    KVD_COPY_ISSUE_EACH = 1,
};

/* --disk-io: the index in its choices. */
enum kvd__disk_io_choice {
    KVD_DISK_IO_AUTO = 0,
    KVD_DISK_IO_URING = 1,
    KVD_DISK_IO_THREADS = 2,
};

/* A size given absolutely or as a share of physical memory. */
typedef struct kvd__memsize {
    uint64_t bytes;   /* used when percent is 0 */
    uint32_t percent; /* 1..100: that share of the machine's memory */
} kvd__memsize_t;

/* --host-copy-path: the index in its choices. */
enum kvd__host_path {
    KVD_HOST_PATH_COPY_ENGINE = 0,
    KVD_HOST_PATH_KERNEL = 1,
};

typedef struct kvd__options {
    char socket[KVD_OPT_STR_MAX];       /* "" = kvd__default_socket_path() */
    char socket_group[KVD_OPT_STR_MAX]; /* "" = no group */
    int64_t socket_gid;                 /* socket_group's gid (set with it); -1: none */
    int backend;                        /* enum kvd__backend_choice */
    char config[KVD_OPT_STR_MAX];
    int log_level; /* kvd__log_level_t */
    int64_t device;
    uint64_t max_frame_bytes;
    uint64_t max_inflight;
    uint64_t max_clients;
    uint64_t max_pools;
    uint64_t max_total_pools;
    uint64_t max_buffers;
    uint64_t max_pool_bytes;
    uint64_t max_total_pool_bytes;
    uint64_t max_inline_bytes;
    uint64_t max_caches;
    uint64_t max_leases;
    uint64_t max_client_memory;
    uint64_t cache_lease_ms;
    kvd__memsize_t host_memory_budget; /* host memory the daemon may reserve */
    uint64_t max_socket_buffer_bytes; /* socket buffers of all connections */
    uint64_t device_memory_margin;    /* device memory left free by device pools */
    uint64_t hello_timeout_ms;        /* connect -> hello; 0: none */
    uint64_t frame_timeout_ms;        /* first byte of a frame -> its last; 0: none */
    uint64_t reqs_per_event;
    uint64_t max_write_queue_bytes;
    uint64_t shutdown_timeout_ms;
    char allow_uids[KVD_OPT_STR_MAX];
    char allow_gids[KVD_OPT_STR_MAX];
    char admin_uids[KVD_OPT_STR_MAX];
    uint64_t blocks[KVD_STREAM_END];  /* per-class block budget, 0 = no limit */
    int64_t priority[KVD_STREAM_END]; /* per-class urgency, higher runs first */
    int cuda_completion;            /* enum kvd__cuda_completion */
    int host_copy_path;             /* enum kvd__host_path */
    uint64_t copy_threads;          /* copy-engine issuing threads per stream class */
    int copy_issue;                 /* enum kvd__copy_issue */
    uint64_t busy_poll_us;          /* poll without sleeping this long after activity */
    uint64_t io_threads;            /* threads that read and answer clients (0: the loop) */
    char metrics[KVD_OPT_STR_MAX];  /* Prometheus endpoint [HOST:]PORT; "" = off */
    int metrics_allow_remote;       /* 1: a non-loopback metrics address is allowed */
    char cluster_listen[KVD_OPT_STR_MAX];  /* HOST:PORT; "" = no cluster */
    char cluster_peers[KVD_OPT_PEERS_MAX]; /* HOST:PORT,HOST:PORT */
    char cluster_peers_file[KVD_OPT_STR_MAX];
    char cluster_secret_file[KVD_OPT_STR_MAX];
    char cluster_allow_from[KVD_OPT_STR_MAX]; /* "peers", "any", ADDRESS[/BITS],... */
    uint64_t cluster_deadline_ms;   /* a lookup's or load's wait for peers */
    uint64_t cluster_lanes;         /* connections a pull spreads over; 0 = by CPUs */
    char cache_dir[KVD_OPT_STR_MAX]; /* the disk level's directory; "" = no disk level */
    kvd__memsize_t disk_budget;      /* bytes, or a share of the space free at start */
    int disk_io;                    /* enum kvd__disk_io_choice */
    uint64_t disk_threads;          /* the disk engine's CPU threads; 0: one per core, <= 8 */
    uint64_t disk_wait_ms;          /* a request's wait for host slots the disk writes hold */
} kvd__options_t;

typedef enum kvd__opt_type {
    KVD_OPT_STR,
    KVD_OPT_INT,  /* int64_t */
    KVD_OPT_UINT, /* uint64_t */
    KVD_OPT_SIZE, /* uint64_t, with an optional K, M, G or T suffix (powers of 1024) */
    KVD_OPT_ENUM, /* int: index into choices ("a|b|c") */
    KVD_OPT_MEMSIZE, /* kvd__memsize_t: a SIZE (bounds as for SIZE) or "N%" of physical memory */
} kvd__opt_type_t;

typedef struct kvd__option_def {
    const char *name;
    kvd__opt_type_t type;
    size_t offset;
    const char *def;     /* default, as it would be written in the config file */
    int64_t min, max;    /* bounds for numbers (inclusive); for TEXT, max is the most
                          * bytes (0: KVD_OPT_STR_MAX - 1) */
    const char *choices; /* "cpu|cuda|auto" for KVD_OPT_ENUM */
    const char *help;
} kvd__option_def_t;

/* The table, and its number of rows. */
extern const kvd__option_def_t kvd__option_table[];
extern const size_t kvd__option_count;

/* Every option at its default. */
void kvd__options_init(kvd__options_t *o);

/* Set one option from its text; KVD_EINVAL (unknown name, bad value) or
 * KVD_ERANGE (out of bounds), with a message in err.  On error *o is
 * unchanged. */
kvd_status_t kvd__options_set(kvd__options_t *o, const char *name, const char *value, char *err,
                              size_t err_len);

/* Read `key = value` lines ('#' starts a comment; blank lines are fine). */
kvd_status_t kvd__options_load_file(kvd__options_t *o, const char *path, char *err,
                                    size_t err_len);

/* Checks across options (e.g. max-inline-bytes <= max-frame-bytes). */
kvd_status_t kvd__options_check(const kvd__options_t *o, char *err, size_t err_len);

typedef enum kvd__opts_action {
    KVD_OPTS_RUN = 0,
    KVD_OPTS_HELP = 1,
    KVD_OPTS_VERSION = 2,
    KVD_OPTS_PRINT = 3, /* --print-config */
    KVD_OPTS_EXAMPLE = 4, /* --print-example-config */
    KVD_OPTS_ERROR = -1,
} kvd__opts_action_t;

/* Defaults, then --config FILE (if given), then the other arguments
 * (--name value or --name=value).  Also --help, --version, --print-config. */
kvd__opts_action_t kvd__options_parse_args(kvd__options_t *o, int argc, char **argv, char *err,
                                           size_t err_len);

/* --help text generated from the table. */
void kvd__options_help(FILE *f, const char *prog);

/* One option's current value as text. */
void kvd__options_format(const kvd__options_t *o, const kvd__option_def_t *d, char *buf,
                         size_t len);

/* deploy/kvdockd.example.conf: every option, commented, with its
 * description and default. */
void kvd__options_print_example(FILE *f);

/* Every option as a config file would hold it. */
void kvd__options_print(const kvd__options_t *o, FILE *f);

/* What a memsize option comes to on a machine of total bytes. */
uint64_t kvd__memsize_bytes(const kvd__memsize_t *m, uint64_t total);

/* Name of stream class i ("reload", ...). */
const char *kvd__stream_class_name(int sc);

/* Is id in a comma-separated list of numbers ("1000,1001")? */
int kvd__options_id_listed(const char *list, uint64_t id);

/* Whether members of group gid may connect: it is the socket group or
 * listed in allow-gids. */
int kvd__options_group_admitted(const kvd__options_t *o, uint64_t gid);

#endif
