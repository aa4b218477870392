/* kvdockd's option table and its parsers: see options.h. */
#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hostmem.h"
#include "parse.h"
#include "log.h"
#include "metrics.h"

#define OFF(field) offsetof(kvd__options_t, field)

/* name, type, field, default, min, max, choices, description */
const kvd__option_def_t kvd__option_table[] = {
    {"socket", KVD_OPT_STR, OFF(socket), "", 0, 0, NULL,
     "socket path (default: $KVDOCK_SOCKET, else $XDG_RUNTIME_DIR/kvdock/kvdockd.sock, else "
     "/tmp/kvdock-UID/kvdockd.sock)"},
    {"socket-group", KVD_OPT_STR, OFF(socket_group), "", 0, 0, NULL,
     "group (a name or a gid) whose members may also connect: the socket directory is 0750 "
     "and the socket 0660 in that group, and the daemon admits them as allow-gids does; "
     "empty: owner only (directory 0700)"},
    {"backend", KVD_OPT_ENUM, OFF(backend), "auto", 0, 0, "cpu|cuda|auto",
     "cuda: GPU pools and kernels; cpu: host pools and the reference kernels; auto: cuda when a "
     "GPU is usable"},
    {"config", KVD_OPT_STR, OFF(config), "", 0, 0, NULL,
     "config file of `key = value` lines (command-line options override it)"},
    {"log-level", KVD_OPT_ENUM, OFF(log_level), "info", 0, 0, "error|warn|info|debug",
     "least severe level logged"},
    {"device", KVD_OPT_INT, OFF(device), "0", 0, 1023, NULL, "CUDA device ordinal"},
    {"max-frame-bytes", KVD_OPT_SIZE, OFF(max_frame_bytes), "16M", 4096, 1 << 30, NULL,
     "largest request frame accepted (ETOOBIG and close past it)"},
    {"max-inflight", KVD_OPT_UINT, OFF(max_inflight), "1024", 1, 1 << 20, NULL,
     "requests in flight per client; past it the daemon stops reading from that client"},
    {"max-clients", KVD_OPT_UINT, OFF(max_clients), "1024", 1, 1 << 20, NULL,
     "connections at once; more are refused (ELIMIT)"},
    {"max-pools", KVD_OPT_UINT, OFF(max_pools), "256", 1, 1 << 20, NULL,
     "pools per client (ELIMIT past it)"},
    {"max-total-pools", KVD_OPT_UINT, OFF(max_total_pools), "4096", 1, 1 << 20, NULL,
     "pools in the daemon, all clients together (ELIMIT past it)"},
    {"max-buffers", KVD_OPT_UINT, OFF(max_buffers), "1024", 1, 1 << 20, NULL,
     "registered buffers and interprocess events per client (ELIMIT past it)"},
    {"max-pool-bytes", KVD_OPT_SIZE, OFF(max_pool_bytes), "0", 0, INT64_MAX, NULL,
     "bytes of pools and buffers per client; 0: no limit"},
    {"max-total-pool-bytes", KVD_OPT_SIZE, OFF(max_total_pool_bytes), "0", 0, INT64_MAX, NULL,
     "bytes of pools and buffers in the daemon; 0: no limit"},
    {"max-inline-bytes", KVD_OPT_SIZE, OFF(max_inline_bytes), "4M", 0, 1 << 30, NULL,
     "largest inline Data or Indices payload of one request (ELIMIT past it)"},
    {"max-caches", KVD_OPT_UINT, OFF(max_caches), "64", 1, 1 << 16, NULL,
     "caches of the cache tier in the daemon, all users together (ELIMIT past it)"},
    {"max-leases", KVD_OPT_UINT, OFF(max_leases), "4096", 1, 1 << 20, NULL,
     "cache leases one client may hold at once (ELIMIT past it)"},
    {"max-client-memory", KVD_OPT_SIZE, OFF(max_client_memory), "256M", 1 << 20, INT64_MAX, NULL,
     "host memory one client's leases and requests may hold, within the host-memory budget "
     "(ELIMIT past it)"},
    {"cache-lease-ms", KVD_OPT_UINT, OFF(cache_lease_ms), "30000", 1, 600000, NULL,
     "how long a cache lease holds its blocks when the lookup names no time"},
    {"host-memory-budget", KVD_OPT_MEMSIZE, OFF(host_memory_budget), "50%", 16 << 20, INT64_MAX,
     NULL,
     "host memory the daemon may reserve for its clients (host pools and buffers, pinned "
     "staging, socket buffers, cache slabs): a SIZE, or a share of the machine's memory (or of "
     "its cgroup's limit) as N%; a reservation past it is refused (ELIMIT), and one past what "
     "the machine has available (ENOMEM)"},
    {"max-socket-buffer-bytes", KVD_OPT_SIZE, OFF(max_socket_buffer_bytes), "1G", 1 << 20,
     INT64_MAX, NULL,
     "receive buffers (past each connection's first 64 KiB), unsent replies and key areas of "
     "all connections together, within the host-memory budget; a connection whose frame does "
     "not fit is refused (ELIMIT) and closed; key areas take at most a quarter"},
    {"device-memory-margin", KVD_OPT_SIZE, OFF(device_memory_margin), "1G", 0, INT64_MAX, NULL,
     "device memory that device pools leave free for the workers (ENOMEM past it)"},
    {"hello-timeout-ms", KVD_OPT_UINT, OFF(hello_timeout_ms), "5000", 0, 3600000, NULL,
     "a connection that has not said hello this long after connecting is closed; 0: never"},
    {"frame-timeout-ms", KVD_OPT_UINT, OFF(frame_timeout_ms), "5000", 0, 3600000, NULL,
     "a frame not whole this long after its first byte arrived is dropped with its "
     "connection (time the daemon is not reading, under back-pressure, does not count); "
     "0: never"},
    {"reqs-per-event", KVD_OPT_UINT, OFF(reqs_per_event), "32", 1, 1 << 16, NULL,
     "requests handled per read event of one connection, so a busy client cannot starve others"},
    {"max-write-queue-bytes", KVD_OPT_SIZE, OFF(max_write_queue_bytes), "64M", 4096, INT64_MAX,
     NULL, "replies queued for a client that does not read; past it the daemon stops reading "
           "from that client"},
    {"shutdown-timeout-ms", KVD_OPT_UINT, OFF(shutdown_timeout_ms), "30000", 0, 3600000, NULL,
     "on SIGTERM, how long to wait for in-flight work before cancelling what has not started"},
    {"allow-uids", KVD_OPT_STR, OFF(allow_uids), "", 0, 0, NULL,
     "comma-separated user ids that may connect besides the daemon's user and root"},
    {"allow-gids", KVD_OPT_STR, OFF(allow_gids), "", 0, 0, NULL,
     "comma-separated group ids whose members (primary or supplementary group) may connect"},
    {"admin-uids", KVD_OPT_STR, OFF(admin_uids), "", 0, 0, NULL,
     "comma-separated user ids that are admins besides the daemon's user and root"},
    {"reload-blocks", KVD_OPT_UINT, OFF(blocks[KVD_STREAM_RELOAD]), "0", 0, 1 << 20, NULL,
     "thread-block budget of the reload stream (host to device); 0: no limit"},
    {"write-blocks", KVD_OPT_UINT, OFF(blocks[KVD_STREAM_WRITE]), "0", 0, 1 << 20, NULL,
     "thread-block budget of the write stream (store, fp8 set, gather); 0: no limit"},
    {"offload-blocks", KVD_OPT_UINT, OFF(blocks[KVD_STREAM_OFFLOAD]), "32", 0, 1 << 20, NULL,
     "thread-block budget of the offload stream (device to host); 0: no limit"},
    {"d2d-blocks", KVD_OPT_UINT, OFF(blocks[KVD_STREAM_D2D]), "32", 0, 1 << 20, NULL,
     "thread-block budget of the device-to-device stream; 0: no limit"},
    {"reload-priority", KVD_OPT_INT, OFF(priority[KVD_STREAM_RELOAD]), "1", 0, 16, NULL,
     "urgency of the reload stream: 0 lowest, higher runs first (clamped to the device's range)"},
    {"write-priority", KVD_OPT_INT, OFF(priority[KVD_STREAM_WRITE]), "1", 0, 16, NULL,
     "urgency of the write stream"},
    {"offload-priority", KVD_OPT_INT, OFF(priority[KVD_STREAM_OFFLOAD]), "0", 0, 16, NULL,
     "urgency of the offload stream"},
    {"d2d-priority", KVD_OPT_INT, OFF(priority[KVD_STREAM_D2D]), "0", 0, 16, NULL,
     "urgency of the device-to-device stream"},
    {"host-copy-path", KVD_OPT_ENUM, OFF(host_copy_path), "copy-engine", 0, 0,
     "copy-engine|kernel",
     "how transfers between host and device memory move by default: copy-engine (no SM is "
     "used, so a worker's forward pass keeps the whole GPU: the kernels of two processes "
     "time-slice it) or kernel (faster for small scattered rows when the GPU is otherwise "
     "idle; harmful beside a running forward pass unless under MPS with a small block "
     "budget); a request may ask for either (Sync.path)"},
    {"copy-threads", KVD_OPT_UINT, OFF(copy_threads), "2", 0, 8, NULL,
     "threads per stream class that hand copy-engine transfers to the driver, each on a "
     "stream of its own (issuing costs CPU time per contiguous run, and blocks while the "
     "stream is full: never on the event loop), twice as many (at most 8) for device-to-host "
     "offloads; a transfer of at least 1,024 copies a thread is split by rows among them; 0: "
     "issue on the event loop"},
    {"copy-issue", KVD_OPT_ENUM, OFF(copy_issue), "batch", 0, 0, "batch|each",
     "how copy-engine transfers from host to device memory whose runs average under 32 KiB "
     "are handed to the driver: batch (cudaMemcpyBatchAsync) or each (one cudaMemcpyAsync per "
     "run, for a machine whose driver issues single copies faster than batches); larger runs "
     "and other directions always go in batches"},
    {"cuda-completion", KVD_OPT_ENUM, OFF(cuda_completion), "loop", 0, 0, "loop|poll|hostfunc",
     "how the cuda backend learns that work is done: loop (the event loop polls the streams "
     "between socket events while work is in flight: no thread hand-off; the fastest), poll (a thread polls an event per operation while work is in "
     "flight) or hostfunc (cudaLaunchHostFunc; no polling)"},
    {"busy-poll-us", KVD_OPT_UINT, OFF(busy_poll_us), "50", 0, 1000000, NULL,
     "after a request comes in or a reply goes out, poll the sockets without sleeping for up "
     "to this many microseconds, so a client's next request is taken without a wake-up from "
     "sleep; only while fewer clients are busy than cores and no thread waits for a core, the "
     "window adapting to the gaps between requests (none when idle); 0: sleep at once"},
    {"io-threads", KVD_OPT_UINT, OFF(io_threads), "0", 0, 64, NULL,
     "threads that read clients' requests, serve them and write the replies, each for a "
     "share of the connections, so that many clients' system calls run on several cores; "
     "requests are still served one at a time (under one lock), in the order each client "
     "sent them; more requests a second with many busy clients, at more CPU each and a "
     "slower round trip for a lone client (no busy polling; --cuda-completion loop becomes "
     "poll); 0: the event loop's thread serves every connection"},
    {"metrics", KVD_OPT_STR, OFF(metrics), "", 0, 0, NULL,
     "serve Prometheus metrics over HTTP at [HOST:]PORT (GET /metrics); a bare PORT listens on "
     "127.0.0.1, 0 picks a free port (kvdock status names it); empty: off"},
    {"metrics-allow-remote", KVD_OPT_ENUM, OFF(metrics_allow_remote), "no", 0, 0, "no|yes",
     "allow a non-loopback metrics address (the endpoint has no authentication)"},
    {"cluster-listen", KVD_OPT_STR, OFF(cluster_listen), "", 0, 0, NULL,
     "HOST:PORT where this daemon meets the other daemons of its cluster (TCP, read by kvdockd "
     "itself; blocks then move over UCX): caches made with cluster = true then find and pull "
     "blocks from theirs; empty: no cluster"},
    {"cluster-peers", KVD_OPT_STR, OFF(cluster_peers), "", 0, KVD_OPT_PEERS_MAX - 1, NULL,
     "the cluster's daemons, comma-separated HOST:PORT, at most 64 (this daemon's own address "
     "among them is skipped, so every node may share one list)"},
    {"cluster-peers-file", KVD_OPT_STR, OFF(cluster_peers_file), "", 0, 0, NULL,
     "a file of the cluster's daemons, one HOST:PORT a line ('#' starts a comment), added to "
     "cluster-peers; with it, at most 64 peers"},
    {"cluster-secret-file", KVD_OPT_STR, OFF(cluster_secret_file), "", 0, 0, NULL,
     "the cluster's shared secret (at least 16 bytes; the file readable by its owner only): "
     "peers prove it before they get anything; required with cluster-listen"},
    {"cluster-allow-from", KVD_OPT_STR, OFF(cluster_allow_from), "peers", 0, 0, NULL,
     "the addresses the cluster's connections may come from, comma-separated: ADDRESS, "
     "ADDRESS/BITS (at most 64), 'peers' (the hosts of cluster-peers and cluster-peers-file) "
     "or 'any'; others are closed at accept, before a byte of theirs is read; of those let "
     "in, at most 64 may be without proof of the secret at once, 8 from one address"},
    {"cluster-deadline-ms", KVD_OPT_UINT, OFF(cluster_deadline_ms), "2000", 10, 600000, NULL,
     "how long a lookup or load waits for the cluster's peers: past it a peer that has not "
     "answered counts as holding nothing, and its blocks are reported missing"},
    {"cluster-lanes", KVD_OPT_UINT, OFF(cluster_lanes), "0", 0, 8, NULL,
     "lanes (each a thread of its own with two UCX workers: one where the blocks this daemon "
     "pulls land, one that sends the blocks peers pull) that blocks move over: one TCP stream "
     "moves what one thread copies; 0: by the CPUs, 1 below 8, 2 below 16, else 4"},
    {"cache-dir", KVD_OPT_STR, OFF(cache_dir), "", 0, 0, NULL,
     "absolute path of the caches' disk level: each cache made with a disk budget keeps its "
     "blocks in a directory of its own there, and a daemon started again on it reopens every "
     "cache it finds, with its owner, sharing rules and the blocks that were whole on disk; "
     "made 0700 when missing; refused when it is not a directory of the daemon's user that "
     "only that user may write; empty: no disk level"},
    {"disk-budget", KVD_OPT_MEMSIZE, OFF(disk_budget), "50%", 1 << 20, INT64_MAX, NULL,
     "bytes of the disk level, all caches' disk budgets together (a cache asking past it is "
     "refused, ELIMIT): a SIZE, or N% of the space the daemon has in cache-dir at start (the "
     "file system's free space plus what its caches hold already); a SIZE past that space "
     "stops the start.  The default leaves half of the free space to the rest of the machine "
     "(model weights, logs), so that a disk level never fills the disk it shares"},
    {"disk-io", KVD_OPT_ENUM, OFF(disk_io), "auto", 0, 0, "auto|io_uring|threads",
     "how the disk level reads and writes: io_uring (one thread driving a ring), threads "
     "(a pool doing pread/pwrite: for sandboxes and tools that do not follow io_uring, such "
     "as valgrind), or auto: io_uring where the kernel allows it, else threads (logged)"},
    {"disk-threads", KVD_OPT_UINT, OFF(disk_threads), "0", 0, 64, NULL,
     "threads doing the disk level's CPU work (copying blocks into and out of their records, "
     "checksums) and, with disk-io threads, its reads and writes: 0 is one per core this "
     "process may run on, at most 8 (4 with disk-io threads); fewer leave cores to the "
     "engines beside the daemon, more serve a drive faster than 8 cores can check"},
    {"disk-wait-ms", KVD_OPT_UINT, OFF(disk_wait_ms), "10000", 1, 600000, NULL,
     "how long a cache save or load waits at most for host slots: those the disk level's "
     "writes in flight hold, or the cache's next slab while it is made; what frees none for "
     "this long is stuck, and the request is answered EBUSY with the reason, nothing of it "
     "stored"},
};
const size_t kvd__option_count = sizeof(kvd__option_table) / sizeof(kvd__option_table[0]);

static const kvd__option_def_t *find(const char *name, size_t name_len)
{
    size_t i;

    for (i = 0; i < kvd__option_count; i++) {
        const char *n = kvd__option_table[i].name;
        if (strlen(n) == name_len && strncmp(n, name, name_len) == 0)
            return &kvd__option_table[i];
    }
    return NULL;
}

/* The option nearest to name[0..n), '_' read as '-' (a config file's
 * habit), if it is at most a third of its length in edits away (one below
 * 6 characters); NULL if none is that near. */
static const char *nearest(const char *name, size_t n)
{
    char given[40];
    size_t best_d = n < 6 ? 2 : n / 3 + 1, i;
    const char *best = NULL;

    if (n >= sizeof(given))
        return NULL;
    for (i = 0; i < n; i++)
        given[i] = name[i] == '_' ? '-' : name[i];
    given[n] = '\0';
    for (i = 0; i < kvd__option_count; i++) {
        size_t d = kvd__edit_distance(given, n, kvd__option_table[i].name);

        if (d < best_d) {
            best_d = d;
            best = kvd__option_table[i].name;
        }
    }
    return best;
}

/* Index of value in "a|b|c", or -1. */
static int choice_index(const char *choices, const char *value)
{
    const char *p = choices;
    size_t vlen = strlen(value);
    int i = 0;

    while (*p) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == vlen && strncmp(p, value, n) == 0)
            return i;
        if (!bar)
            break;
        p = bar + 1;
        i++;
    }
    return -1;
}

static void choice_name(const char *choices, int idx, char *buf, size_t len)
{
    const char *p = choices;
    int i;

    for (i = 0; i < idx && p; i++) {
        p = strchr(p, '|');
        if (p)
            p++;
    }
    if (!p) {
        snprintf(buf, len, "?");
        return;
    }
    snprintf(buf, len, "%.*s", (int)(strchr(p, '|') ? (size_t)(strchr(p, '|') - p) : strlen(p)),
             p);
}

/* A decimal number (proto/src/parse.h), signed or not; a SIZE with
 * allow_suffix.  0, or -1 when it is not one. */
static int parse_number(const char *s, int is_signed, int allow_suffix, int64_t *out_s,
                        uint64_t *out_u)
{
    if (is_signed)
        return kvd__parse_i64(s, out_s) == KVD_OK ? 0 : -1;
    return (allow_suffix ? kvd__parse_size(s, out_u) : kvd__parse_u64(s, out_u)) == KVD_OK ? 0
                                                                                           : -1;
}

/* A switch's value ("no|yes" choices) in any of the usual spellings. */
static const char *boolean_word(const kvd__option_def_t *d, const char *v)
{
    static const char *const yes[] = {"yes", "true", "on", "1"}, *const no[] = {"no", "false",
                                                                                "off", "0"};

    if (strcmp(d->choices, "no|yes") != 0)
        return v;
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return "yes";
        if (strcasecmp(v, no[i]) == 0)
            return "no";
    }
    return v;
}

/* socket-group's gid, kept beside its text: a name (looked up once,
 * here, not at every connection) or a decimal gid; "" is none. */
static kvd_status_t resolve_group(kvd__options_t *o, const char *value, char *err,
                                  size_t err_len)
{
    struct group *gr;
    uint64_t v;

    if (value[0] == '\0') {
        o->socket_gid = -1;
        return KVD_OK;
    }
    gr = getgrnam(value);
    if (gr != NULL) {
        o->socket_gid = (int64_t)gr->gr_gid;
        return KVD_OK;
    }
    if (parse_number(value, 0, 0, NULL, &v) != 0 || v >= (uint64_t)(gid_t)-1) {
        kvd__seterr(err, err_len, "socket-group: no group '%s'", value);
        return KVD_EINVAL;
    }
    o->socket_gid = (int64_t)v;
    return KVD_OK;
}

/* A size out of its option's range, said in the units sizes are given in. */
static kvd_status_t size_range_error(const kvd__option_def_t *d, const char *value, uint64_t v,
                                     char *err, size_t err_len)
{
    char a[32], b[32];

    if (v < (uint64_t)d->min)
        kvd__seterr(err, err_len, "%s: %s (%s) is below the least, %s", d->name, value,
                    kvd__fmt_bytes(v, a, sizeof(a)),
                    kvd__fmt_bytes((uint64_t)d->min, b, sizeof(b)));
    else
        kvd__seterr(err, err_len, "%s: %s (%s) is above the most, %s", d->name, value,
                    kvd__fmt_bytes(v, a, sizeof(a)),
                    kvd__fmt_bytes((uint64_t)d->max, b, sizeof(b)));
    return KVD_ERANGE;
}

static kvd_status_t set_def(kvd__options_t *o, const kvd__option_def_t *d, const char *value,
                            char *err, size_t err_len)
{
    char *field = (char *)o + d->offset;
    int64_t sv = 0;
    uint64_t uv = 0;
    int idx;

    switch (d->type) {
    case KVD_OPT_STR: {
        size_t most = d->max > 0 ? (size_t)d->max : KVD_OPT_STR_MAX - 1;
        if (strlen(value) > most) {
            kvd__seterr(err, err_len, "%s: value longer than %zu bytes", d->name, most);
            return KVD_ERANGE;
        }
        if (d->offset == OFF(socket_group) && resolve_group(o, value, err, err_len) != KVD_OK)
            return KVD_EINVAL;
        snprintf(field, most + 1, "%s", value);
        return KVD_OK;
    }
    case KVD_OPT_ENUM:
        idx = choice_index(d->choices, boolean_word(d, value));
        if (idx < 0) {
            kvd__seterr(err, err_len, "%s: '%s' is not one of %s", d->name, value, d->choices);
            return KVD_EINVAL;
        }
        *(int *)field = idx;
        return KVD_OK;
    case KVD_OPT_INT:
        if (parse_number(value, 1, 0, &sv, &uv) != 0) {
            kvd__seterr(err, err_len, "%s: '%s' is not a whole number", d->name, value);
            return KVD_EINVAL;
        }
        if (sv < d->min || sv > d->max) {
            kvd__seterr(err, err_len, "%s: %" PRId64 " is outside [%" PRId64 ", %" PRId64 "]",
                   d->name, sv, d->min, d->max);
            return KVD_ERANGE;
        }
        *(int64_t *)field = sv;
        return KVD_OK;
    case KVD_OPT_MEMSIZE: {
        kvd__memsize_t *m = (kvd__memsize_t *)field;
        size_t n = strlen(value);

        if (n > 1 && value[n - 1] == '%') {
            char num[32];
            if (n - 1 >= sizeof(num)) {
                kvd__seterr(err, err_len, "%s: '%s' is not a percentage", d->name, value);
                return KVD_EINVAL;
            }
            memcpy(num, value, n - 1);
            num[n - 1] = '\0';
            if (parse_number(num, 0, 0, &sv, &uv) != 0) {
                kvd__seterr(err, err_len, "%s: '%s' is not a percentage", d->name, value);
                return KVD_EINVAL;
            }
            if (uv < 1 || uv > 100) {
                kvd__seterr(err, err_len, "%s: %s is outside [1%%, 100%%]", d->name, value);
                return KVD_ERANGE;
            }
            m->bytes = 0;
            m->percent = (uint32_t)uv;
            return KVD_OK;
        }
        if (parse_number(value, 0, 1, &sv, &uv) != 0) {
            if (kvd__size_inexact(value))
                kvd__seterr(err, err_len, "%s: '%s' " KVD_SIZE_INEXACT, d->name, value);
            else
                kvd__seterr(err, err_len, "%s: '%s' is not a size (" KVD_SIZE_WORDS ") or a "
                            "percentage (N%%)", d->name, value);
            return KVD_EINVAL;
        }
        if (uv < (uint64_t)d->min || uv > (uint64_t)d->max)
            return size_range_error(d, value, uv, err, err_len);
        m->bytes = uv;
        m->percent = 0;
        return KVD_OK;
    }
    case KVD_OPT_UINT:
    case KVD_OPT_SIZE:
        if (parse_number(value, 0, d->type == KVD_OPT_SIZE, &sv, &uv) != 0) {
            if (d->type == KVD_OPT_SIZE && kvd__size_inexact(value)) {
                kvd__seterr(err, err_len, "%s: '%s' " KVD_SIZE_INEXACT, d->name, value);
                return KVD_EINVAL;
            }
            kvd__seterr(err, err_len, "%s: '%s' is not a %s", d->name, value,
                   d->type == KVD_OPT_SIZE ? "size (" KVD_SIZE_WORDS ")"
                                           : "non-negative whole number (decimal)");
            return KVD_EINVAL;
        }
        if ((uv < (uint64_t)d->min || uv > (uint64_t)d->max) && d->type == KVD_OPT_SIZE)
            return size_range_error(d, value, uv, err, err_len);
        if (uv < (uint64_t)d->min || uv > (uint64_t)d->max) {
            kvd__seterr(err, err_len, "%s: %" PRIu64 " is outside [%" PRId64 ", %" PRId64 "]",
                   d->name, uv, d->min, d->max);
            return KVD_ERANGE;
        }
        *(uint64_t *)field = uv;
        return KVD_OK;
    }
    kvd__seterr(err, err_len, "%s: bad option type", d->name);
    return KVD_EINTERNAL;
}

void kvd__options_init(kvd__options_t *o)
{
    size_t i;

    memset(o, 0, sizeof(*o));
    for (i = 0; i < kvd__option_count; i++)
        (void)set_def(o, &kvd__option_table[i], kvd__option_table[i].def, NULL, 0);
}

kvd_status_t kvd__options_set(kvd__options_t *o, const char *name, const char *value, char *err,
                              size_t err_len)
{
    const kvd__option_def_t *d;

    if (o == NULL || name == NULL || value == NULL)
        return KVD_ENULL;
    d = find(name, strlen(name));
    if (d == NULL) {
        const char *near = nearest(name, strlen(name));

        if (near != NULL)
            kvd__seterr(err, err_len, "unknown option '%s' (did you mean %s?)", name, near);
        else
            kvd__seterr(err, err_len, "unknown option '%s'", name);
        return KVD_EINVAL;
    }
    return set_def(o, d, value, err, err_len);
}

static char *trim(char *s)
{
    char *e;

    while (isspace((unsigned char)*s))
        s++;
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

/* The comment of a config line: a '#' outside quotes. */
static char *comment_of(char *line)
{
    char quote = 0;

    for (char *p = line; *p; p++) {
        if (quote) {
            if (*p == quote)
                quote = 0;
        } else if (*p == '"' || *p == '\'') {
            quote = *p;
        } else if (*p == '#') {
            return p;
        }
    }
    return NULL;
}

/* A value in matching quotes loses them (paths with spaces, a '#'). */
static char *unquote(char *v)
{
    size_t n = strlen(v);

    if (n >= 2 && (v[0] == '"' || v[0] == '\'') && v[n - 1] == v[0]) {
        v[n - 1] = '\0';
        return v + 1;
    }
    return v;
}

kvd_status_t kvd__options_load_file(kvd__options_t *o, const char *path, char *err, size_t err_len)
{
    FILE *f;
    char line[1024];
    int lineno = 0;
    kvd_status_t st = KVD_OK;
    kvd__options_t tmp;

    if (o == NULL || path == NULL)
        return KVD_ENULL;
    f = fopen(path, "re");
    if (f == NULL) {
        kvd__seterr(err, err_len, "%s: %s", path, strerror(errno));
        return KVD_EIO;
    }
    tmp = *o; /* all or nothing */
    while (fgets(line, sizeof(line), f) != NULL) {
        char *s, *eq, *key, *val, *hash;
        char sub[512];

        lineno++;
        if (strchr(line, '\n') == NULL && !feof(f)) {
            kvd__seterr(err, err_len, "%s:%d: line too long", path, lineno);
            st = KVD_EINVAL;
            goto out;
        }
        hash = comment_of(line);
        if (hash)
            *hash = '\0';
        s = trim(line);
        if (*s == '\0')
            continue;
        eq = strchr(s, '=');
        if (eq == NULL) {
            kvd__seterr(err, err_len, "%s:%d: expected `key = value`", path, lineno);
            st = KVD_EINVAL;
            goto out;
        }
        *eq = '\0';
        key = trim(s);
        val = unquote(trim(eq + 1));
        if (strcmp(key, "config") == 0) {
            kvd__seterr(err, err_len, "%s:%d: 'config' cannot be set in a config file", path, lineno);
            st = KVD_EINVAL;
            goto out;
        }
        st = kvd__options_set(&tmp, key, val, sub, sizeof(sub));
        if (st != KVD_OK) {
            kvd__seterr(err, err_len, "%s:%d: %s", path, lineno, sub);
            goto out;
        }
    }
    if (ferror(f)) {
        kvd__seterr(err, err_len, "%s: read error", path);
        st = KVD_EIO;
        goto out;
    }
    *o = tmp;
out:
    fclose(f);
    return st;
}

/* A comma-separated list of decimal ids ("" is an empty list). */
static int id_list_valid(const char *list)
{
    const char *p = list;

    while (*p) {
        if (*p == ',' || *p == ' ') {
            p++;
            continue;
        }
        if (!isdigit((unsigned char)*p))
            return 0;
        while (isdigit((unsigned char)*p))
            p++;
        if (*p != '\0' && *p != ',' && *p != ' ')
            return 0;
    }
    return 1;
}

kvd_status_t kvd__options_check(const kvd__options_t *o, char *err, size_t err_len)
{
    if (!id_list_valid(o->allow_uids) || !id_list_valid(o->allow_gids) ||
        !id_list_valid(o->admin_uids)) {
        kvd__seterr(err, err_len, "allow-uids, allow-gids and admin-uids take comma-separated numbers");
        return KVD_EINVAL;
    }
    if (o->max_inline_bytes > o->max_frame_bytes) {
        kvd__seterr(err, err_len, "max-inline-bytes (%" PRIu64 ") exceeds max-frame-bytes (%" PRIu64 ")",
               o->max_inline_bytes, o->max_frame_bytes);
        return KVD_EINVAL;
    }
    if (o->max_total_pool_bytes != 0 && o->max_pool_bytes > o->max_total_pool_bytes) {
        kvd__seterr(err, err_len, "max-pool-bytes exceeds max-total-pool-bytes");
        return KVD_EINVAL;
    }
    if (o->cluster_listen[0] == '\0' &&
        (o->cluster_peers[0] != '\0' || o->cluster_peers_file[0] != '\0')) {
        kvd__seterr(err, err_len, "cluster-peers and cluster-peers-file need cluster-listen "
                    "(this daemon's own address in the cluster)");
        return KVD_EINVAL;
    }
    if (o->cluster_listen[0] != '\0' && o->cluster_secret_file[0] == '\0') {
        kvd__seterr(err, err_len, "cluster-listen needs cluster-secret-file: peers prove the "
                    "cluster's secret before they get any block");
        return KVD_EINVAL;
    }
    if (o->cache_dir[0] == '\0' && (o->disk_budget.percent != 50 || o->disk_budget.bytes != 0)) {
        kvd__seterr(err, err_len, "disk-budget needs cache-dir (the directory of the disk "
                    "level it budgets)");
        return KVD_EINVAL;
    }
    if (o->cache_dir[0] != '\0' && o->cache_dir[0] != '/') {
        kvd__seterr(err, err_len, "cache-dir %s: give an absolute path", o->cache_dir);
        return KVD_EINVAL;
    }
    if (o->metrics[0] != '\0') {
        kvd__metrics_addr_t ma;
        if (kvd__metrics_parse_addr(o->metrics, o->metrics_allow_remote, &ma, err, err_len) !=
            KVD_OK)
            return KVD_EINVAL;
    }
    return KVD_OK;
}

kvd__opts_action_t kvd__options_parse_args(kvd__options_t *o, int argc, char **argv, char *err,
                                           size_t err_len)
{
    kvd__options_t tmp;
    int i, pass;
    char sub[512];

    kvd__options_init(&tmp);
    /* pass 0 finds --config (and the flags without values); pass 1 sets
     * the rest, so the command line overrides the file. */
    for (pass = 0; pass < 2; pass++) {
        for (i = 1; i < argc; i++) {
            const char *arg = argv[i], *name, *value, *eq;
            const kvd__option_def_t *d;
            size_t name_len;

            if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)
                return KVD_OPTS_HELP;
            if (strcmp(arg, "--version") == 0)
                return KVD_OPTS_VERSION;
            if (strcmp(arg, "--print-config") == 0)
                continue;
            if (strcmp(arg, "--print-example-config") == 0)
                return KVD_OPTS_EXAMPLE;
            if (strncmp(arg, "--", 2) != 0) {
                kvd__seterr(err, err_len, "unexpected argument '%s' (options are --name value)", arg);
                return KVD_OPTS_ERROR;
            }
            name = arg + 2;
            eq = strchr(name, '=');
            name_len = eq ? (size_t)(eq - name) : strlen(name);
            d = find(name, name_len);
            if (d == NULL) {
                const char *near = nearest(name, name_len);

                if (near != NULL)
                    kvd__seterr(err, err_len, "unknown option '--%.*s' (did you mean --%s?)",
                                (int)name_len, name, near);
                else
                    kvd__seterr(err, err_len, "unknown option '--%.*s' (see --help)",
                                (int)name_len, name);
                return KVD_OPTS_ERROR;
            }
            if (eq) {
                value = eq + 1;
            } else {
                if (i + 1 >= argc) {
                    kvd__seterr(err, err_len, "option '--%s' needs a value", d->name);
                    return KVD_OPTS_ERROR;
                }
                value = argv[++i];
            }
            if ((pass == 0) != (strcmp(d->name, "config") == 0))
                continue;
            if (set_def(&tmp, d, value, sub, sizeof(sub)) != KVD_OK) {
                kvd__seterr(err, err_len, "%s", sub);
                return KVD_OPTS_ERROR;
            }
            if (pass == 0 && tmp.config[0] != '\0' &&
                kvd__options_load_file(&tmp, tmp.config, sub, sizeof(sub)) != KVD_OK) {
                kvd__seterr(err, err_len, "%s", sub);
                return KVD_OPTS_ERROR;
            }
        }
    }
    if (kvd__options_check(&tmp, sub, sizeof(sub)) != KVD_OK) {
        kvd__seterr(err, err_len, "%s", sub);
        return KVD_OPTS_ERROR;
    }
    *o = tmp;
    for (i = 1; i < argc; i++)
        if (strcmp(argv[i], "--print-config") == 0)
            return KVD_OPTS_PRINT;
    return KVD_OPTS_RUN;
}

void kvd__options_format(const kvd__options_t *o, const kvd__option_def_t *d, char *buf, size_t len)
{
    const char *field = (const char *)o + d->offset;

    switch (d->type) {
    case KVD_OPT_STR:
        snprintf(buf, len, "%s", field);
        break;
    case KVD_OPT_ENUM:
        choice_name(d->choices, *(const int *)field, buf, len);
        break;
    case KVD_OPT_INT:
        snprintf(buf, len, "%" PRId64, *(const int64_t *)field);
        break;
    case KVD_OPT_UINT:
    case KVD_OPT_SIZE:
        snprintf(buf, len, "%" PRIu64, *(const uint64_t *)field);
        break;
    case KVD_OPT_MEMSIZE: {
        const kvd__memsize_t *m = (const kvd__memsize_t *)field;
        if (m->percent)
            snprintf(buf, len, "%u%%", m->percent);
        else
            snprintf(buf, len, "%" PRIu64, m->bytes);
        break;
    }
    }
}

uint64_t kvd__memsize_bytes(const kvd__memsize_t *m, uint64_t total)
{
    if (m->percent == 0)
        return m->bytes;
    return total / 100 * m->percent + total % 100 * m->percent / 100;
}

static const char *type_word(const kvd__option_def_t *d)
{
    switch (d->type) {
    case KVD_OPT_STR: return "TEXT";
    case KVD_OPT_INT: return "N";
    case KVD_OPT_UINT: return "N";
    case KVD_OPT_SIZE: return "SIZE";
    case KVD_OPT_MEMSIZE: return "SIZE|N%";
    case KVD_OPT_ENUM: return d->choices;
    }
    return "?";
}

/* --help: "  --name TYPE" in HELP_HEAD_COLS, the text from HELP_TEXT_COL,
 * no line past HELP_COLS. */
#define HELP_COLS 100
#define HELP_HEAD_COLS 34
#define HELP_TEXT_COL (2 + HELP_HEAD_COLS + 1)

/* text from column col (the cursor is there), wrapped at spaces to end
 * before column cols, continued at col; then a newline.  A word longer
 * than a line goes on one of its own. */
static void wrap(FILE *f, const char *text, int col, int cols)
{
    int at = col;
    const char *p = text;

    while (*p) {
        size_t w = strcspn(p, " ");

        if (at > col && at + 1 + (int)w > cols) {
            fprintf(f, "\n%*s", col, "");
            at = col;
        } else if (at > col) {
            fputc(' ', f);
            at++;
        }
        fwrite(p, 1, w, f);
        at += (int)w;
        p += w;
        while (*p == ' ')
            p++;
    }
    fputc('\n', f);
}

void kvd__options_help(FILE *f, const char *prog)
{
    size_t i;

    fprintf(f,
            "usage: %s [--name VALUE | --name=VALUE]...\n"
            "       [--help] [--version] [--print-config] [--print-example-config]\n"
            "\n"
            "kvdockd owns KV-cache pools and moves KV data on request over a Unix socket.\n"
            "Every option can also be set in the --config file as `name = value`.\n",
            prog);
    wrap(f, "SIZE: " KVD_SIZE_WORDS ".", 0, HELP_COLS);
    fputc('\n', f);
    for (i = 0; i < kvd__option_count; i++) {
        const kvd__option_def_t *d = &kvd__option_table[i];
        char head[128], text[1536];
        int n;

        snprintf(head, sizeof(head), "--%s %s", d->name, type_word(d));
        n = snprintf(text, sizeof(text), "%s", d->help);
        if (d->def[0] != '\0' && n >= 0 && (size_t)n < sizeof(text))
            n += snprintf(text + n, sizeof(text) - (size_t)n, " [default: %s]", d->def);
        if ((d->type == KVD_OPT_INT || d->type == KVD_OPT_UINT || d->type == KVD_OPT_SIZE ||
             d->type == KVD_OPT_MEMSIZE) &&
            n >= 0 && (size_t)n < sizeof(text))
            snprintf(text + n, sizeof(text) - (size_t)n, " [range: %" PRId64 "..%" PRId64 "]",
                     d->min, d->max);
        if (strlen(head) > HELP_HEAD_COLS) /* the name on a line of its own */
            fprintf(f, "  %s\n%*s", head, HELP_TEXT_COL, "");
        else
            fprintf(f, "  %-*s ", HELP_HEAD_COLS, head);
        wrap(f, text, HELP_TEXT_COL, HELP_COLS);
    }
}

void kvd__options_print_example(FILE *f)
{
    size_t i;

    fputs("# kvdockd example configuration: `name = value` lines, \"#\" starts a comment.\n"
          "# Every option of `kvdockd --help` may appear here; options given on the\n"
          "# command line override this file.  Use it with: kvdockd --config FILE\n"
          "# SIZE values: bytes, or with a unit: K, M, G, T (or KiB, MiB, ...: powers of\n"
          "# 1024), KB, MB, GB, TB (powers of 1000); fractions like 1.5G.\n"
          "# The values below are the defaults; uncomment a line to change it.\n"
          "# Generated by `kvdockd --print-example-config`.\n",
          f);
    for (i = 0; i < kvd__option_count; i++) {
        const kvd__option_def_t *d = &kvd__option_table[i];

        if (strcmp(d->name, "config") == 0)
            continue; /* a config file cannot name another one */
        fprintf(f, "\n# %s", d->help);
        if (d->type == KVD_OPT_ENUM)
            fprintf(f, " (%s)", d->choices);
        else if (d->type == KVD_OPT_STR && d->max > 0)
            fprintf(f, " (at most %" PRId64 " bytes)", d->max);
        else if (d->type != KVD_OPT_STR)
            fprintf(f, " (%s, %" PRId64 "..%" PRId64 ")", type_word(d), d->min, d->max);
        fprintf(f, "\n# %s =%s%s\n", d->name, d->def[0] ? " " : "", d->def);
    }
}

void kvd__options_print(const kvd__options_t *o, FILE *f)
{
    size_t i;
    static char buf[KVD_OPT_PEERS_MAX + 32]; /* the longest value: --cluster-peers */

    for (i = 0; i < kvd__option_count; i++) {
        const kvd__option_def_t *d = &kvd__option_table[i];
        kvd__options_format(o, d, buf, sizeof(buf));
        /* a config file cannot name another one: keep it as a comment */
        fprintf(f, "%s%s = %s\n", strcmp(d->name, "config") == 0 ? "# " : "", d->name, buf);
    }
}

const char *kvd__stream_class_name(int sc)
{
    static const char *const names[KVD_STREAM_END] = {"default", "reload", "write", "offload",
                                                      "d2d"};

    return sc >= 0 && sc < KVD_STREAM_END ? names[sc] : "unknown";
}

int kvd__options_id_listed(const char *list, uint64_t id)
{
    const char *p = list;

    while (p && *p) {
        char *end;
        unsigned long long v;

        while (*p == ',' || *p == ' ')
            p++;
        if (*p == '\0')
            break;
        errno = 0;
        v = strtoull(p, &end, 10);
        if (end == p || errno)
            return 0;
        if (v == id)
            return 1;
        p = end;
    }
    return 0;
}

int kvd__options_group_admitted(const kvd__options_t *o, uint64_t gid)
{
    return (o->socket_gid >= 0 && (uint64_t)o->socket_gid == gid) ||
           kvd__options_id_listed(o->allow_gids, gid);
}
