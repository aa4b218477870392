/*
 * check_security: who may do what, through the real kvdockd (cpu backend).
 *
 * - The socket's directory: created 0700 (0750 and the socket group with
 *   --socket-group); an existing directory that others could write, that
 *   belongs to another user, or that is a symlink is refused; the socket is
 *   0660; a stale socket is replaced, a live one or a non-socket is not.
 * - Peer credentials (SO_PEERCRED): a client running as another user
 *   (nobody, through fork + setuid, so this needs root; skipped, saying
 *   why, otherwise) cannot even reach a socket in a 0700 directory; with a
 *   socket group it reaches the socket and the daemon refuses it with
 *   EPERM and closes; allow-uids or allow-gids let it in, as a non-admin.
 * - Ownership: for every operation that names a pool or a buffer, another
 *   client's attempt on a non-shared one is refused with EPERM (by id; ids
 *   are daemon-wide) or ENOENT (by name: a private pool's name is its
 *   owner's), and the owner's bytes are unchanged.
 * - Admin operations (shutdown, dropping another's shared pool) need an
 *   admin peer.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define NOBODY 65534u
#define NOGROUP 65534u

/* ---- helpers ------------------------------------------------------------ */

static int is_root(void)
{
    return geteuid() == 0;
}

static void skip_msg(const char *what)
{
    kvt_skip_case(what, "needs root to run a client as uid %u (this runs as uid %u)", NOBODY,
                  (unsigned)geteuid());
}

static int connect_as(const char *sock, uid_t uid, gid_t gid, int *err)
{
    return kvdt_connect_as(sock, uid, gid, 0, NULL, err);
}

static Kvdock__Response *hello_on(int fd, const char *name)
{
    Kvdock__Request req;
    Kvdock__Hello h = KVDOCK__HELLO__INIT;

    kvdt_req_init(&req, 1);
    h.protocol_version = KVD_PROTOCOL_VERSION;
    h.client_name = (char *)name;
    req.op_case = KVDOCK__REQUEST__OP_HELLO;
    req.hello = &h;
    kvdt_send(fd, &req, NULL, 0);
    return kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
}

/* A hello'd client as nobody; *admin set from the hello reply. */
static int nobody_client(const kvdt_daemon_t *d, int *admin)
{
    int err = 0, fd = connect_as(d->sock, NOBODY, NOGROUP, &err);
    Kvdock__Response *r;

    ck_assert_msg(fd >= 0, "nobody cannot connect: %s", strerror(err));
    r = hello_on(fd, "nobody");
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->status == 0, "hello as nobody: %u %s", r->status, r->message);
    if (admin)
        *admin = r->hello->admin;
    kvdock__response__free_unpacked(r, NULL);
    return fd;
}

/* A base directory others may traverse (the daemon makes its own below). */
static void open_base(char *base, size_t len)
{
    snprintf(base, len, "/tmp/kvdt-sec-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(base));
    ck_assert_int_eq(chmod(base, 0755), 0);
}

static void rm_rf(const char *path)
{
    char cmd[300];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    ck_assert_int_eq(system(cmd), 0);
}

static uint64_t checksum(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    size_t i;

    for (i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* ---- the socket and its directory -------------------------------------- */

START_TEST(test_dir_modes)
{
    kvdt_daemon_t d;
    char base[64], sock[200], dir[96], grp[16];
    struct stat st;
    gid_t g = is_root() ? NOGROUP : getgid();
    const char *extra[] = {"--socket-group", grp, NULL};
    int fd;

    /* no group: directory 0700, socket 0660 */
    open_base(base, sizeof(base));
    snprintf(dir, sizeof(dir), "%s/own", base);
    snprintf(sock, sizeof(sock), "%s/kvd.sock", dir);
    kvdt_start_sock(&d, sock, NULL);
    ck_assert_int_eq(lstat(dir, &st), 0);
    ck_assert(S_ISDIR(st.st_mode));
    ck_assert_int_eq(st.st_mode & 07777, 0700);
    ck_assert_uint_eq(st.st_uid, geteuid());
    ck_assert_int_eq(lstat(sock, &st), 0);
    ck_assert(S_ISSOCK(st.st_mode));
    ck_assert_int_eq(st.st_mode & 0777, 0660);
    fd = kvdt_client(&d, "modes");
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    ck_assert_int_ne(lstat(sock, &st), 0); /* removed at exit */

    /* a socket group: directory 0750 of that group, socket 0660 of it */
    snprintf(grp, sizeof(grp), "%u", (unsigned)g);
    snprintf(dir, sizeof(dir), "%s/grp", base);
    snprintf(sock, sizeof(sock), "%s/kvd.sock", dir);
    kvdt_start_sock(&d, sock, extra);
    ck_assert_int_eq(lstat(dir, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0750);
    ck_assert_uint_eq(st.st_gid, g);
    ck_assert_int_eq(lstat(sock, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0660);
    ck_assert_uint_eq(st.st_gid, g);
    ck_assert_int_eq(kvdt_stop(&d), 0);

    /* the 0700 directory kept, now with a group: left as it is, and said */
    snprintf(dir, sizeof(dir), "%s/own", base);
    snprintf(sock, sizeof(sock), "%s/kvd.sock", dir);
    kvdt_start_sock(&d, sock, extra);
    ck_assert_int_eq(lstat(dir, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0700);
    ck_assert(kvdt_log_has(&d, "event=socket_dir_closed_to_group"));
    ck_assert_int_eq(kvdt_stop(&d), 0);
    rm_rf(base);
}
END_TEST

START_TEST(test_unsafe_dirs_refused)
{
    char base[64], dir[96], sock[200], target[128];
    struct stat st;
    FILE *f;

    open_base(base, sizeof(base));
    /* world-writable without the sticky bit: anyone could swap the socket */
    snprintf(dir, sizeof(dir), "%s/open", base);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(chmod(dir, 0777), 0);
    snprintf(sock, sizeof(sock), "%s/kvd.sock", dir);
    ck_assert_int_eq(kvdt_run(sock, NULL, KVDT_TIMEOUT_MS), 1);
    ck_assert_int_ne(lstat(sock, &st), 0);

    /* a symlink where the directory should be */
    snprintf(dir, sizeof(dir), "%s/link", base);
    snprintf(target, sizeof(target), "%s/real", base);
    ck_assert_int_eq(mkdir(target, 0700), 0);
    ck_assert_int_eq(symlink(target, dir), 0);
    snprintf(sock, sizeof(sock), "%s/kvd.sock", dir);
    ck_assert_int_eq(kvdt_run(sock, NULL, KVDT_TIMEOUT_MS), 1);
    snprintf(sock, sizeof(sock), "%s/kvd.sock", target);
    ck_assert_int_ne(lstat(sock, &st), 0);

    /* a symlink (to a file) where the socket should be: neither followed
     * nor removed */
    snprintf(target, sizeof(target), "%s/precious", base);
    f = fopen(target, "w");
    ck_assert_ptr_nonnull(f);
    fputs("keep", f);
    fclose(f);
    snprintf(dir, sizeof(dir), "%s/real", base);
    snprintf(sock, sizeof(sock), "%s/kvd.sock", dir);
    ck_assert_int_eq(symlink(target, sock), 0);
    ck_assert_int_eq(kvdt_run(sock, NULL, KVDT_TIMEOUT_MS), 1);
    ck_assert_int_eq(lstat(sock, &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    ck_assert_int_eq(stat(target, &st), 0);
    ck_assert_int_eq(st.st_size, 4);

    /* a directory that belongs to another user */
    if (is_root()) {
        snprintf(dir, sizeof(dir), "%s/theirs", base);
        ck_assert_int_eq(mkdir(dir, 0700), 0);
        ck_assert_int_eq(chown(dir, NOBODY, NOGROUP), 0);
        snprintf(sock, sizeof(sock), "%s/kvd.sock", dir);
        ck_assert_int_eq(kvdt_run(sock, NULL, KVDT_TIMEOUT_MS), 1);
        ck_assert_int_ne(lstat(sock, &st), 0);
    } else {
        skip_msg("directory of another user");
    }
    rm_rf(base);
}
END_TEST

START_TEST(test_stale_socket)
{
    kvdt_daemon_t d;
    char base[64], dir[80], sock[100];
    struct sockaddr_un sa;
    struct stat st;
    int s, fd;

    open_base(base, sizeof(base));
    snprintf(dir, sizeof(dir), "%s/run", base);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(sock, sizeof(sock), "%s/kvd.sock", dir);
    /* a socket bound by a process that is gone: nothing listens */
    s = socket(AF_UNIX, SOCK_STREAM, 0);
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
    ck_assert_int_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(s);
    ck_assert_int_eq(chmod(sock, 0777), 0); /* and with a careless mode */
    ck_assert_int_lt(kvdt_connect(sock), 0);
    kvdt_start_sock(&d, sock, NULL);
    ck_assert_int_eq(lstat(sock, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0660); /* a new socket, not the old one */
    fd = kvdt_client(&d, "stale");
    ck_assert(kvdt_ping_ok(fd));
    /* a live daemon is never taken over */
    ck_assert_int_eq(kvdt_run(sock, NULL, KVDT_TIMEOUT_MS), 1);
    ck_assert(kvdt_ping_ok(fd));
    close(fd);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    rm_rf(base);
}
END_TEST

/* ---- peer credentials --------------------------------------------------- */

START_TEST(test_other_user_blocked_by_directory)
{
    kvdt_daemon_t d;
    char base[64], sock[128];
    int err = 0, fd;

    if (!is_root()) {
        skip_msg("other user blocked by the directory");
        return;
    }
    open_base(base, sizeof(base));
    snprintf(sock, sizeof(sock), "%s/own/kvd.sock", base);
    kvdt_start_sock(&d, sock, NULL);
    fd = connect_as(sock, NOBODY, NOGROUP, &err);
    ck_assert_int_lt(fd, 0);
    ck_assert_int_eq(err, EACCES); /* the 0700 directory stops it */
    ck_assert_int_eq(kvdt_stop(&d), 0);
    rm_rf(base);
}
END_TEST

START_TEST(test_other_user_refused)
{
    kvdt_daemon_t d;
    char base[64], sock[160], dir[128], grp[16];
    const char *extra[] = {"--socket-group", grp, NULL};
    Kvdock__Response *r;
    int fd, me;

    if (!is_root()) {
        skip_msg("other user refused by SO_PEERCRED");
        return;
    }
    /* a socket made reachable by all (as a socket unit with another mode
     * could): the credentials check is what stops a user outside the
     * socket group */
    snprintf(grp, sizeof(grp), "%u", NOGROUP);
    open_base(base, sizeof(base));
    snprintf(dir, sizeof(dir), "%s/grp", base);
    snprintf(sock, sizeof(sock), "%s/kvd.sock", dir);
    kvdt_start_sock(&d, sock, extra);
    ck_assert_int_eq(chmod(dir, 0755), 0);
    ck_assert_int_eq(chmod(sock, 0666), 0);
    fd = connect_as(sock, NOBODY, 1, NULL);
    ck_assert_int_ge(fd, 0);
    r = kvdt_recv(fd, NULL, NULL, KVDT_TIMEOUT_MS);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->status, KVD_EPERM);
    ck_assert_ptr_nonnull(strstr(r->message, "allow-uids"));
    ck_assert_ptr_nonnull(strstr(r->message, "socket-group"));
    kvdock__response__free_unpacked(r, NULL);
    ck_assert(kvdt_closed(fd, KVDT_TIMEOUT_MS));
    close(fd);
    /* the daemon's own user still gets in */
    me = kvdt_client(&d, "me");
    ck_assert(kvdt_ping_ok(me));
    close(me);
    ck_assert_int_eq(kvdt_stop(&d), 0);
    rm_rf(base);
}
END_TEST

/* --socket-group G alone admits G's members, by their primary group or a
 * supplementary one (as they were when they connected); --allow-gids
 * takes supplementary groups too. */
START_TEST(test_socket_group_admits_members)
{
    static const gid_t supp[] = {NOGROUP};
    kvdt_daemon_t d;
    char base[64], sock[128], grp[16];
    int i;

    if (!is_root()) {
        skip_msg("socket-group members");
        return;
    }
    snprintf(grp, sizeof(grp), "%u", NOGROUP);
    open_base(base, sizeof(base));
    for (i = 0; i < 3; i++) {
        const char *only[] = {"--socket-group", grp, NULL};
        const char *by_allow[] = {"--allow-gids", grp, NULL};
        Kvdock__Response *r;
        char dir[96];
        int err = 0, fd;

        snprintf(dir, sizeof(dir), "%s/g%d", base, i);
        snprintf(sock, sizeof(sock), "%s/kvd.sock", dir);
        kvdt_start_sock(&d, sock, i == 2 ? by_allow : only);
        if (i == 2) { /* no socket group: open the way by hand */
            ck_assert_int_eq(chmod(dir, 0755), 0);
            ck_assert_int_eq(chmod(sock, 0666), 0);
        }
        if (i == 0) /* primary group */
            fd = connect_as(sock, NOBODY, NOGROUP, &err);
        else /* a supplementary group; the primary one is another */
            fd = kvdt_connect_as(sock, NOBODY, 2, 1, supp, &err);
        ck_assert_msg(fd >= 0, "case %d: cannot connect: %s", i, strerror(err));
        r = hello_on(fd, "member");
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(r->status == 0, "case %d: hello: %u %s", i, r->status, r->message);
        ck_assert_int_eq(r->hello->admin, 0);
        kvdock__response__free_unpacked(r, NULL);
        ck_assert(kvdt_ping_ok(fd));
        close(fd);
        ck_assert_int_eq(kvdt_stop(&d), 0);
    }
    rm_rf(base);
}
END_TEST

START_TEST(test_allowed_users_and_groups)
{
    static const char *const opt[][2] = {{"--allow-uids", "1,65534"}, {"--allow-gids", "65534"}};
    kvdt_daemon_t d;
    char base[64], sock[128], grp[16];
    int i;

    if (!is_root()) {
        skip_msg("allow-uids / allow-gids");
        return;
    }
    snprintf(grp, sizeof(grp), "%u", NOGROUP);
    open_base(base, sizeof(base));
    for (i = 0; i < 2; i++) {
        const char *extra[] = {"--socket-group", grp, opt[i][0], opt[i][1], NULL};
        int fd, admin = -1;

        snprintf(sock, sizeof(sock), "%s/d%d/kvd.sock", base, i);
        kvdt_start_sock(&d, sock, extra);
        fd = nobody_client(&d, &admin);
        ck_assert_int_eq(admin, 0); /* allowed in, not an admin */
        ck_assert(kvdt_ping_ok(fd));
        close(fd);
        ck_assert_int_eq(kvdt_stop(&d), 0);
    }
    rm_rf(base);
}
END_TEST

/* ---- ownership ---------------------------------------------------------- */

typedef struct world {
    kvdt_daemon_t d;
    char base[64];
    int a; /* the owner */
    uint64_t priv, shared, buf;
    uint8_t *pmap, *bmap;
    size_t plen;
    int b; /* the other client */
    uint64_t bpool, bbuf;
    uint8_t *bbmap;
} world_t;

#define SLOTS 8
#define SLOT_BYTES 16 /* 2 heads x 8 fp8 */
#define BUF_BYTES 4096

static uint64_t create_pool(int fd, const char *name, int shared)
{
    Kvdock__Request req;
    Kvdock__PoolCreate pc = KVDOCK__POOL_CREATE__INIT;
    Kvdock__Response *r;
    uint64_t id;

    kvdt_req_init(&req, 30);
    pc.name = (char *)name;
    pc.kind = KVDOCK__MEM_KIND__MEM_HOST;
    pc.num_layers = 2;
    pc.num_slots = SLOTS;
    pc.slot_bytes = SLOT_BYTES;
    pc.shared = shared;
    req.op_case = KVDOCK__REQUEST__OP_POOL_CREATE;
    req.pool_create = &pc;
    r = kvdt_call(fd, &req);
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->status == 0, "create %s: %s", name, r->message);
    id = r->pool->id;
    kvdock__response__free_unpacked(r, NULL);
    return id;
}

/* b is another user (nobody, allowed in) when other_user, else another
 * connection of the same (admin) user. */
static void world_up(world_t *w, int other_user)
{
    char sock[128], grp[16];
    const char *extra[] = {"--socket-group", grp, "--allow-uids", "65534", NULL};
    int64_t *idx;
    size_t i;

    memset(w, 0, sizeof(*w));
    snprintf(grp, sizeof(grp), "%u", NOGROUP);
    open_base(w->base, sizeof(w->base));
    snprintf(sock, sizeof(sock), "%s/run/kvd.sock", w->base);
    kvdt_start_sock(&w->d, sock, is_root() ? extra : NULL);
    w->a = kvdt_client(&w->d, "owner");
    w->priv = create_pool(w->a, "private", 0);
    w->shared = create_pool(w->a, "shared", 1);
    w->pmap = kvdt_pool_map(w->a, w->priv, NULL, &w->plen);
    for (i = 0; i < w->plen; i++)
        w->pmap[i] = (uint8_t)(i * 31 + 7);
    w->buf = kvdt_buffer_map(w->a, BUF_BYTES, (void **)&w->bmap);
    /* the owner's buffer holds valid indices, a page table and data */
    idx = (int64_t *)w->bmap;
    for (i = 0; i < BUF_BYTES / 8; i++)
        idx[i] = (int64_t)(i % SLOTS);

    if (other_user) {
        int admin = -1;
        w->b = nobody_client(&w->d, &admin);
        ck_assert_int_eq(admin, 0);
    } else {
        w->b = kvdt_client(&w->d, "other");
    }
    w->bpool = create_pool(w->b, "theirs", 0);
    w->bbuf = kvdt_buffer_map(w->b, BUF_BYTES, (void **)&w->bbmap);
    idx = (int64_t *)w->bbmap;
    for (i = 0; i < BUF_BYTES / 8; i++)
        idx[i] = (int64_t)(i % SLOTS);
}

static void world_down(world_t *w)
{
    munmap(w->pmap, w->plen);
    munmap(w->bmap, BUF_BYTES);
    munmap(w->bbmap, BUF_BYTES);
    close(w->a);
    close(w->b);
    ck_assert_int_eq(kvdt_stop(&w->d), 0);
    rm_rf(w->base);
}

/* Scratch messages for one attack. */
typedef struct msgs {
    Kvdock__Request req;
    Kvdock__PoolExport pe;
    Kvdock__PoolDrop pd;
    Kvdock__BufferDrop bd;
    Kvdock__Store st;
    Kvdock__Fp8Set f8;
    Kvdock__PageTableGather g;
    Kvdock__Transfer t;
    Kvdock__Indices i1, i2, i3;
    Kvdock__Data d1, d2;
    Kvdock__BufRef r1, r2, r3;
    int64_t v[4];
    uint8_t bytes[256];
} msgs_t;

static void msgs_init(msgs_t *m)
{
    memset(m, 0, sizeof(*m));
    kvdt_req_init(&m->req, 500);
    kvdock__pool_export__init(&m->pe);
    kvdock__pool_drop__init(&m->pd);
    kvdock__buffer_drop__init(&m->bd);
    kvdock__store__init(&m->st);
    kvdock__fp8_set__init(&m->f8);
    kvdock__page_table_gather__init(&m->g);
    kvdock__transfer__init(&m->t);
    kvdock__indices__init(&m->i1);
    kvdock__indices__init(&m->i2);
    kvdock__indices__init(&m->i3);
    kvdock__data__init(&m->d1);
    kvdock__data__init(&m->d2);
    kvdock__buf_ref__init(&m->r1);
    kvdock__buf_ref__init(&m->r2);
    kvdock__buf_ref__init(&m->r3);
    m->v[0] = 1;
    m->v[1] = 2;
}

static void inline_idx(Kvdock__Indices *ix, int64_t *v)
{
    ix->n_values = 1;
    ix->values = v;
}

static void buf_idx(Kvdock__Indices *ix, Kvdock__BufRef *r, uint64_t buf)
{
    r->buffer = buf;
    ix->buffer = r;
    ix->dtype = KVDOCK__DTYPE__I64;
    ix->count = 1;
}

static void inline_data(Kvdock__Data *d, uint8_t *bytes, size_t n)
{
    d->inline_.data = bytes;
    d->inline_.len = n;
}

static void store_into(msgs_t *m, uint64_t pool)
{
    m->req.op_case = KVDOCK__REQUEST__OP_STORE;
    m->req.store = &m->st;
    m->st.pool = pool;
    inline_idx(&m->i1, &m->v[0]);
    m->st.loc = &m->i1;
    inline_data(&m->d1, m->bytes, SLOT_BYTES);
    inline_data(&m->d2, m->bytes, SLOT_BYTES);
    m->st.k = &m->d1;
    m->st.v = &m->d2;
}

static void transfer(msgs_t *m, uint64_t src, uint64_t dst)
{
    m->req.op_case = KVDOCK__REQUEST__OP_TRANSFER;
    m->req.transfer = &m->t;
    m->t.src_pool = src;
    m->t.dst_pool = dst;
    inline_idx(&m->i1, &m->v[0]);
    inline_idx(&m->i2, &m->v[1]);
    m->t.src = &m->i1;
    m->t.dst = &m->i2;
}

static void gather(msgs_t *m, uint64_t table, uint64_t out)
{
    m->req.op_case = KVDOCK__REQUEST__OP_GATHER;
    m->req.gather = &m->g;
    m->r1.buffer = table;
    m->r2.buffer = out;
    m->g.req_to_page = &m->r1;
    m->g.out = &m->r2;
    m->g.table_dtype = KVDOCK__DTYPE__I64;
    m->g.table_rows = 4;
    m->g.table_cols = 4;
    m->g.max_num_pages = 4;
    m->g.page_size = 1;
    inline_idx(&m->i1, &m->v[0]);
    inline_idx(&m->i2, &m->v[1]);
    m->g.req_pool_indices = &m->i1;
    m->g.seq_lens = &m->i2;
    m->g.out_stride = 32;
    m->r2.offset = 2048;
}

/* One attack: what it does, and the status the attacker must get. */
typedef struct attack {
    const char *name;
    void (*build)(const world_t *w, msgs_t *m);
    int status; /* 0: EPERM */
} attack_t;

static void a_export_id(const world_t *w, msgs_t *m)
{
    m->req.op_case = KVDOCK__REQUEST__OP_POOL_EXPORT;
    m->req.pool_export = &m->pe;
    m->pe.pool = w->priv;
}
static void a_export_name(const world_t *w, msgs_t *m)
{
    a_export_id(w, m);
    m->pe.pool = 0;
    m->pe.name = "private";
}
static void a_drop_id(const world_t *w, msgs_t *m)
{
    m->req.op_case = KVDOCK__REQUEST__OP_POOL_DROP;
    m->req.pool_drop = &m->pd;
    m->pd.pool = w->priv;
}
static void a_drop_name(const world_t *w, msgs_t *m)
{
    a_drop_id(w, m);
    m->pd.pool = 0;
    m->pd.name = "private";
}
static void a_store(const world_t *w, msgs_t *m)
{
    store_into(m, w->priv);
}
static void a_store_layer1(const world_t *w, msgs_t *m)
{
    store_into(m, w->priv);
    m->st.layer = 1;
}
static void a_store_loc_buf(const world_t *w, msgs_t *m)
{
    store_into(m, w->bpool); /* its own pool, the owner's index buffer */
    m->i1.n_values = 0;
    buf_idx(&m->i1, &m->r1, w->buf);
}
static void a_store_k_buf(const world_t *w, msgs_t *m)
{
    store_into(m, w->bpool); /* its own pool, the owner's data buffer */
    m->d1.inline_.len = 0;
    m->r1.buffer = w->buf;
    m->d1.buffer = &m->r1;
}
static void a_store_v_buf(const world_t *w, msgs_t *m)
{
    store_into(m, w->bpool);
    m->d2.inline_.len = 0;
    m->r1.buffer = w->buf;
    m->d2.buffer = &m->r1;
}
static void a_fp8(const world_t *w, msgs_t *m)
{
    static float kv[2 * 8];
    m->req.op_case = KVDOCK__REQUEST__OP_FP8_SET;
    m->req.fp8_set = &m->f8;
    m->f8.pool = w->priv;
    inline_idx(&m->i1, &m->v[0]);
    m->f8.loc = &m->i1;
    inline_data(&m->d1, (uint8_t *)kv, sizeof(kv));
    inline_data(&m->d2, (uint8_t *)kv, sizeof(kv));
    m->f8.k = &m->d1;
    m->f8.v = &m->d2;
    m->f8.src_dtype = KVDOCK__DTYPE__F32;
    m->f8.cache_dtype = KVDOCK__DTYPE__E4M3;
    m->f8.num_heads = 2;
    m->f8.head_dim = 8;
}
static void a_fp8_k_buf(const world_t *w, msgs_t *m)
{
    a_fp8(w, m);
    m->f8.pool = w->bpool;
    m->d1.inline_.len = 0;
    m->r1.buffer = w->buf;
    m->d1.buffer = &m->r1;
}
static void a_transfer_src(const world_t *w, msgs_t *m)
{
    transfer(m, w->priv, w->bpool); /* read the owner's pool */
}
static void a_transfer_dst(const world_t *w, msgs_t *m)
{
    transfer(m, w->bpool, w->priv); /* write the owner's pool */
}
static void a_transfer_shared_to_priv(const world_t *w, msgs_t *m)
{
    transfer(m, w->shared, w->priv);
}
static void a_transfer_all(const world_t *w, msgs_t *m)
{
    transfer(m, w->priv, w->priv);
    m->t.all_layers = 1;
}
static void a_transfer_idx_buf(const world_t *w, msgs_t *m)
{
    transfer(m, w->bpool, w->bpool);
    m->i1.n_values = m->i2.n_values = 0;
    buf_idx(&m->i1, &m->r1, w->buf);
    buf_idx(&m->i2, &m->r2, w->bbuf);
}
static void a_gather_table(const world_t *w, msgs_t *m)
{
    gather(m, w->buf, w->bbuf); /* read the owner's page table */
}
static void a_gather_out(const world_t *w, msgs_t *m)
{
    gather(m, w->bbuf, w->buf); /* write into the owner's buffer */
}
static void a_gather_idx_buf(const world_t *w, msgs_t *m)
{
    gather(m, w->bbuf, w->bbuf);
    m->i1.n_values = 0;
    buf_idx(&m->i1, &m->r3, w->buf);
}
static void a_buffer_drop(const world_t *w, msgs_t *m)
{
    m->req.op_case = KVDOCK__REQUEST__OP_BUFFER_DROP;
    m->req.buffer_drop = &m->bd;
    m->bd.buffer = w->buf;
}

static const attack_t attacks[] = {
    {"pool_export by id", a_export_id, 0},
    /* by name another client's private pool is not there to find */
    {"pool_export by name", a_export_name, KVD_ENOENT},
    {"pool_drop by id", a_drop_id, 0},
    {"pool_drop by name", a_drop_name, KVD_ENOENT},
    {"store into the pool", a_store, 0},
    {"store into layer 1", a_store_layer1, 0},
    {"store with loc in the owner's buffer", a_store_loc_buf, 0},
    {"store with k from the owner's buffer", a_store_k_buf, 0},
    {"store with v from the owner's buffer", a_store_v_buf, 0},
    {"fp8_set into the pool", a_fp8, 0},
    {"fp8_set with k from the owner's buffer", a_fp8_k_buf, 0},
    {"transfer, the pool as src", a_transfer_src, 0},
    {"transfer, the pool as dst", a_transfer_dst, 0},
    {"transfer from a shared pool into the private one", a_transfer_shared_to_priv, 0},
    {"all-layer transfer within the pool", a_transfer_all, 0},
    {"transfer with indices in the owner's buffer", a_transfer_idx_buf, 0},
    {"gather reading the owner's page table", a_gather_table, 0},
    {"gather writing the owner's buffer", a_gather_out, 0},
    {"gather with indices in the owner's buffer", a_gather_idx_buf, 0},
    {"buffer_drop of the owner's buffer", a_buffer_drop, 0},
};
#define N_ATTACKS (sizeof(attacks) / sizeof(attacks[0]))

static void run_attacks(world_t *w)
{
    uint64_t psum = checksum(w->pmap, w->plen), bsum = checksum(w->bmap, BUF_BYTES);
    size_t i;

    for (i = 0; i < N_ATTACKS; i++) {
        msgs_t m;
        Kvdock__Response *r;
        int fds[4], nfds = 0, k;

        msgs_init(&m);
        attacks[i].build(w, &m);
        r = kvdt_call_fds(w->b, &m.req, NULL, 0, fds, &nfds);
        ck_assert_msg(r != NULL, "%s: no reply", attacks[i].name);
        ck_assert_msg(r->status == (uint32_t)(attacks[i].status ? attacks[i].status : KVD_EPERM),
                      "%s: status %u (%s), want %s", attacks[i].name, r->status, r->message,
                      kvd_err_name(attacks[i].status ? attacks[i].status : KVD_EPERM));
        ck_assert_msg(r->message[0] != '\0', "%s: no message", attacks[i].name);
        if (getenv("KVDT_VERBOSE"))
            fprintf(stderr, "attack '%s': %s: %s\n", attacks[i].name, kvd_err_name(r->status),
                    r->message);
        ck_assert_msg(nfds == 0, "%s: a descriptor came with the refusal", attacks[i].name);
        for (k = 0; k < nfds; k++)
            close(fds[k]);
        kvdock__response__free_unpacked(r, NULL);
        /* no byte of the owner's changed, and the attacker goes on */
        ck_assert_msg(checksum(w->pmap, w->plen) == psum, "%s changed the pool", attacks[i].name);
        ck_assert_msg(checksum(w->bmap, BUF_BYTES) == bsum, "%s changed the buffer",
                      attacks[i].name);
        ck_assert(kvdt_ping_ok(w->b));
    }
    /* the owner still has and uses all of it */
    {
        msgs_t m;
        msgs_init(&m);
        store_into(&m, w->priv);
        ck_assert_int_eq(kvdt_status_of(w->a, &m.req), KVD_OK);
        msgs_init(&m);
        a_gather_out(w, &m);
        m.r1.buffer = w->buf;
        ck_assert_int_eq(kvdt_status_of(w->a, &m.req), KVD_OK);
    }
    ck_assert_uint_ne(checksum(w->pmap, w->plen), psum); /* the owner's store landed */
}

/* The attacks made valid: the attacker's own objects in place of the
 * owner's get OK, so each refusal above was about ownership alone. */
static void run_controls(world_t *w)
{
    size_t i;

    for (i = 0; i < N_ATTACKS; i++) {
        world_t mine = *w;
        msgs_t m;
        Kvdock__Response *r;
        int fds[4], nfds = 0, k;

        if (attacks[i].build == a_drop_id || attacks[i].build == a_drop_name ||
            attacks[i].build == a_buffer_drop || attacks[i].build == a_export_name)
            continue; /* would drop the attacker's own, or names differ */
        mine.priv = w->bpool;
        mine.buf = w->bbuf;
        mine.shared = w->shared;
        msgs_init(&m);
        attacks[i].build(&mine, &m);
        r = kvdt_call_fds(w->b, &m.req, NULL, 0, fds, &nfds);
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(r->status == KVD_OK, "control of '%s': status %u (%s)", attacks[i].name,
                      r->status, r->message);
        for (k = 0; k < nfds; k++)
            close(fds[k]);
        kvdock__response__free_unpacked(r, NULL);
    }
}

/* Whether fd's pool_list (all: every client's) shows pool want; status
 * the reply's status (0 or EPERM). */
static void pool_list_sees_as(int fd, int all, uint64_t want, int expect, uint32_t status)
{
    Kvdock__Request req;
    Kvdock__PoolList pl = KVDOCK__POOL_LIST__INIT;
    Kvdock__Response *r;
    size_t i;
    int seen = 0;

    kvdt_req_init(&req, 70);
    pl.all = all;
    req.op_case = KVDOCK__REQUEST__OP_POOL_LIST;
    req.pool_list = &pl;
    r = kvdt_call(fd, &req);
    ck_assert_uint_eq(r->status, status);
    if (status != 0) {
        kvdock__response__free_unpacked(r, NULL);
        return;
    }
    for (i = 0; i < r->pools->n_pools; i++)
        seen |= r->pools->pools[i]->id == want;
    ck_assert_int_eq(seen, expect);
    kvdock__response__free_unpacked(r, NULL);
}

static void pool_list_sees(int fd, uint64_t want, int expect)
{
    pool_list_sees_as(fd, 0, want, expect, 0);
}

START_TEST(test_ownership_same_user)
{
    /* another connection of the same (admin) user: ownership is per
     * connection, and being an admin does not open private objects */
    world_t w;

    world_up(&w, 0);
    run_attacks(&w);
    run_controls(&w);
    /* an admin's list shows its own pools and the shared ones; all of them
     * only when it asks (PoolList.all) */
    pool_list_sees(w.b, w.priv, 0);
    pool_list_sees(w.b, w.shared, 1);
    pool_list_sees_as(w.b, 1, w.priv, 1, 0);
    world_down(&w);
}
END_TEST

START_TEST(test_ownership_other_user)
{
    world_t w;

    if (!is_root()) {
        skip_msg("ownership against another user");
        return;
    }
    world_up(&w, 1);
    run_attacks(&w);
    run_controls(&w);
    /* a non-admin lists the shared pool, not the private one */
    pool_list_sees(w.b, w.priv, 0);
    pool_list_sees(w.b, w.shared, 1);
    pool_list_sees(w.a, w.priv, 1);
    pool_list_sees_as(w.b, 1, w.priv, 0, KVD_EPERM); /* every pool: admins only */
    world_down(&w);
}
END_TEST

/* ---- admin operations --------------------------------------------------- */

static int drop_status(int fd, uint64_t pool)
{
    Kvdock__Request req;
    Kvdock__PoolDrop pd = KVDOCK__POOL_DROP__INIT;

    kvdt_req_init(&req, 80);
    pd.pool = pool;
    req.op_case = KVDOCK__REQUEST__OP_POOL_DROP;
    req.pool_drop = &pd;
    return kvdt_status_of(fd, &req);
}

START_TEST(test_admin_operations)
{
    world_t w;
    Kvdock__Request req;
    Kvdock__Shutdown sd = KVDOCK__SHUTDOWN__INIT;
    Kvdock__StatusRequest sr = KVDOCK__STATUS_REQUEST__INIT;
    Kvdock__Response *r;
    int admin2;

    if (!is_root()) {
        skip_msg("non-admin peer");
        return;
    }
    world_up(&w, 1); /* b: nobody, allowed in, not an admin */
    /* shutdown needs an admin */
    kvdt_req_init(&req, 90);
    sd.drain = 1;
    req.op_case = KVDOCK__REQUEST__OP_SHUTDOWN;
    req.shutdown = &sd;
    ck_assert_int_eq(kvdt_status_of(w.b, &req), KVD_EPERM);
    ck_assert(kvdt_ping_ok(w.b));
    ck_assert(kvdt_ping_ok(w.a));
    /* a shared pool may be used by anyone, dropped by its owner or an admin */
    {
        msgs_t m;
        msgs_init(&m);
        transfer(&m, w.shared, w.shared);
        ck_assert_int_eq(kvdt_status_of(w.b, &m.req), KVD_OK);
    }
    ck_assert_int_eq(drop_status(w.b, w.shared), KVD_EPERM);
    /* status: a non-admin sees itself only */
    kvdt_req_init(&req, 91);
    req.op_case = KVDOCK__REQUEST__OP_STATUS;
    req.status = &sr;
    r = kvdt_call(w.b, &req);
    ck_assert_uint_eq(r->status, 0);
    ck_assert_uint_eq(r->status_reply->n_client_list, 1);
    ck_assert_uint_eq(r->status_reply->client_list[0]->uid, NOBODY);
    kvdock__response__free_unpacked(r, NULL);
    /* another admin connection may drop the shared pool */
    admin2 = kvdt_client(&w.d, "admin");
    ck_assert_int_eq(drop_status(admin2, w.shared), KVD_OK);
    /* but even an admin may not drop another's private pool */
    ck_assert_int_eq(drop_status(admin2, w.priv), KVD_EPERM);
    ck_assert_int_eq(drop_status(admin2, w.bpool), KVD_EPERM);
    /* and the admin's shutdown works */
    kvdt_req_init(&req, 92);
    req.op_case = KVDOCK__REQUEST__OP_SHUTDOWN;
    req.shutdown = &sd;
    ck_assert_int_eq(kvdt_status_of(admin2, &req), KVD_OK);
    ck_assert_int_eq(kvdt_wait_exit(&w.d, KVDT_TIMEOUT_MS), 0);
    close(admin2);
    world_down(&w);
}
END_TEST

static Suite *security_suite(void)
{
    Suite *s = suite_create("security");
    TCase *tc = tcase_create("socket");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_dir_modes);
    tcase_add_test(tc, test_unsafe_dirs_refused);
    tcase_add_test(tc, test_stale_socket);
    suite_add_tcase(s, tc);

    tc = tcase_create("peers");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_other_user_blocked_by_directory);
    tcase_add_test(tc, test_other_user_refused);
    tcase_add_test(tc, test_socket_group_admits_members);
    tcase_add_test(tc, test_allowed_users_and_groups);
    suite_add_tcase(s, tc);

    tc = tcase_create("ownership");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_ownership_same_user);
    tcase_add_test(tc, test_ownership_other_user);
    tcase_add_test(tc, test_admin_operations);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(security_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
