/* The disk level on the file system: see cache_disk.h. */
#include "cache_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "disk_format.h"
#include "parse.h"
#include "registry.h"

int kvd__cache_dirname(const char *name, uid_t owner, int shared, char *out, size_t out_len)
{
    int n;

    if (!kvd__pool_name_valid(name))
        return -1;
    if (shared)
        n = snprintf(out, out_len, "s-%s", name);
    else
        n = snprintf(out, out_len, "u%u-%s", (unsigned)owner, name);
    return n < 0 || (size_t)n >= out_len ? -1 : 0;
}

/* ---- --cache-dir ---------------------------------------------------------- */

kvd_status_t kvd__cache_dir_check(const char *dir, int *created, char *why, size_t why_len)
{
    struct stat st;
    int fd;

    *created = 0;
    if (dir[0] != '/') {
        snprintf(why, why_len, "cache-dir %s: give an absolute path", dir);
        return KVD_EINVAL;
    }
    if (mkdir(dir, 0700) == 0) {
        *created = 1;
    } else if (errno != EEXIST) {
        snprintf(why, why_len, "cache-dir %s: cannot make it: %s", dir, strerror(errno));
        return errno == EACCES || errno == EPERM ? KVD_EPERM : KVD_EIO;
    }
    /* the directory itself may be reached through a link (an operator's
     * /var/cache/kvdock -> /data/kvdock); what it is, is checked */
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOTDIR || (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)))
            snprintf(why, why_len, "cache-dir %s is not a directory", dir);
        else
            snprintf(why, why_len, "cache-dir %s: cannot open it: %s", dir, strerror(e));
        return e == EACCES ? KVD_EPERM : KVD_EINVAL;
    }
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_len, "cache-dir %s: %s", dir, strerror(errno));
        close(fd);
        return KVD_EIO;
    }
    close(fd);
    if (st.st_uid != geteuid()) {
        snprintf(why, why_len, "cache-dir %s belongs to uid %u, not the daemon's user (uid %u): "
                 "another user could change the blocks it holds", dir, (unsigned)st.st_uid,
                 (unsigned)geteuid());
        return KVD_EPERM;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(why, why_len, "cache-dir %s is writable by %s (mode %04o): chmod go-w it",
                 dir, (st.st_mode & S_IWOTH) ? "others" : "its group",
                 (unsigned)(st.st_mode & 07777));
        return KVD_EPERM;
    }
    if (!(st.st_mode & S_IWUSR) || !(st.st_mode & S_IXUSR)) {
        snprintf(why, why_len, "cache-dir %s is not writable by its owner (mode %04o)", dir,
                 (unsigned)(st.st_mode & 07777));
        return KVD_EPERM;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(why, why_len, "cache-dir %s is not writable: %s", dir, strerror(errno));
        return KVD_EPERM;
    }
    return KVD_OK;
}

int kvd__cache_dir_space(const char *dir, uint64_t *avail, uint64_t *total, char *why,
                         size_t why_len)
{
    struct statvfs sv;

    if (statvfs(dir, &sv) != 0) {
        snprintf(why, why_len, "statvfs %s: %s", dir, strerror(errno));
        return -1;
    }
    *avail = (uint64_t)sv.f_bavail * sv.f_frsize;
    *total = (uint64_t)sv.f_blocks * sv.f_frsize;
    return 0;
}

static uint64_t usage_of(int dfd, int depth)
{
    DIR *d;
    struct dirent *e;
    uint64_t sum = 0;

    if ((d = fdopendir(dfd)) == NULL) {
        close(dfd);
        return 0;
    }
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISREG(st.st_mode)) {
            sum += (uint64_t)st.st_blocks * 512u;
        } else if (S_ISDIR(st.st_mode) && depth > 0) {
            int fd = openat(dirfd(d), e->d_name,
                            O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd >= 0)
                sum += usage_of(fd, depth - 1);
        }
    }
    closedir(d);
    return sum;
}

uint64_t kvd__cache_dir_usage(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    return fd < 0 ? 0 : usage_of(fd, 1);
}

/* ---- the manifest ----------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int over;
} sbuf_t;

static void put(sbuf_t *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (b->over)
        return;
    va_start(ap, fmt);
    n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= b->cap - b->len)
        b->over = 1;
    else
        b->len += (size_t)n;
}

static void put_ids(sbuf_t *b, const char *key, const uint32_t *ids, uint32_t n)
{
    put(b, "%s=", key);
    for (uint32_t i = 0; i < n; i++)
        put(b, "%s%u", i ? "," : "", ids[i]);
    put(b, "\n");
}

int kvd__manifest_format(const kvd__manifest_t *m, char *out, size_t out_len, size_t *len)
{
    sbuf_t b = {out, 0, out_len < KVD_MANIFEST_MAX ? out_len : KVD_MANIFEST_MAX, 0};
    uint32_t crc;

    put(&b, "kvdock-cache-manifest=%d\n", KVD_MANIFEST_VERSION);
    put(&b, "name=%s\n", m->name);
    put(&b, "owner_uid=%u\n", m->owner_uid);
    put(&b, "shared=%d\n", m->shared ? 1 : 0);
    put_ids(&b, "allow_uids", m->allow_uids, m->n_allow_uids);
    put_ids(&b, "allow_gids", m->allow_gids, m->n_allow_gids);
    put(&b, "cluster=%d\n", m->cluster ? 1 : 0);
    put(&b, "layers=%u\n", m->layout.num_layers);
    put(&b, "mla=%d\n", m->layout.mla ? 1 : 0);
    put(&b, "tokens_per_block=%u\n", m->layout.tokens_per_block);
    put(&b, "token_bytes=%" PRIu64 "\n", m->layout.token_bytes);
    put(&b, "dtype=%s\n", m->layout.dtype);
    put(&b, "budget_bytes=%" PRIu64 "\n", m->budget);
    put(&b, "disk_budget_bytes=%" PRIu64 "\n", m->disk_budget);
    if (b.over)
        return -1;
    crc = kvd__disk_crc32c(0, out, b.len);
    put(&b, "crc32c=%08x\n", crc);
    if (b.over)
        return -1;
    *len = b.len;
    return 0;
}

/* The next line of text: key must be the one expected, its value (NUL
 * terminated, in val) is returned; NULL when the line is not that. */
static const char *next_line(const char **p, const char *end, const char *key, char *val,
                             size_t val_len)
{
    const char *nl = memchr(*p, '\n', (size_t)(end - *p));
    size_t klen = strlen(key), vlen;

    if (nl == NULL || (size_t)(nl - *p) <= klen || memcmp(*p, key, klen) != 0 ||
        (*p)[klen] != '=')
        return NULL;
    vlen = (size_t)(nl - (*p + klen + 1));
    if (vlen >= val_len || memchr(*p + klen + 1, '\0', vlen) != NULL)
        return NULL;
    memcpy(val, *p + klen + 1, vlen);
    val[vlen] = '\0';
    *p = nl + 1;
    return val;
}

static int num(const char *v, uint64_t max, uint64_t *out)
{
    uint64_t x;

    if (v[0] == '\0' || kvd__parse_u64(v, &x) != KVD_OK || x > max)
        return -1;
    /* one spelling only: what format writes (no sign, no leading zero) */
    if ((v[0] == '0' && v[1] != '\0') || v[0] < '0' || v[0] > '9')
        return -1;
    *out = x;
    return 0;
}

static int ids(const char *v, uint32_t *out, uint32_t *n)
{
    char tmp[24];
    uint64_t x;

    *n = 0;
    while (*v) {
        const char *comma = strchr(v, ',');
        size_t len = comma ? (size_t)(comma - v) : strlen(v);
        if (len == 0 || len >= sizeof(tmp) || *n >= 16)
            return -1;
        memcpy(tmp, v, len);
        tmp[len] = '\0';
        if (num(tmp, UINT32_MAX, &x) != 0)
            return -1;
        out[(*n)++] = (uint32_t)x;
        v += len + (comma ? 1 : 0);
        if (comma && *v == '\0')
            return -1;
    }
    return 0;
}

kvd_status_t kvd__manifest_parse(const char *text, size_t len, kvd__manifest_t *m, char *why,
                                 size_t why_len)
{
    const char *p = text, *end = text + len, *crc_at;
    char v[KVD_MANIFEST_MAX];
    uint64_t x;
    uint32_t crc;

#define LINE(key)                                                                        \
    do {                                                                                 \
        if (next_line(&p, end, key, v, sizeof(v)) == NULL) {                             \
            snprintf(why, why_len, "the line '" key "=' is missing, out of order or bad"); \
            return KVD_EINVAL;                                                           \
        }                                                                                \
    } while (0)
#define NUM(key, max, dst)                                                               \
    do {                                                                                 \
        LINE(key);                                                                       \
        if (num(v, (max), &x) != 0) {                                                    \
            snprintf(why, why_len, "%s=%.32s is not a number up to %" PRIu64, key, v,   \
                     (uint64_t)(max));                                                   \
            return KVD_EINVAL;                                                           \
        }                                                                                \
        dst = x;                                                                         \
    } while (0)

    memset(m, 0, sizeof(*m));
    if (len == 0 || len > KVD_MANIFEST_MAX) {
        snprintf(why, why_len, "%zu bytes (a manifest has 1 to %d)", len, KVD_MANIFEST_MAX);
        return KVD_EINVAL;
    }
    LINE("kvdock-cache-manifest");
    if (strcmp(v, "1") != 0) {
        snprintf(why, why_len, "version %.16s (this daemon reads %d)", v, KVD_MANIFEST_VERSION);
        return KVD_EINVAL;
    }
    LINE("name");
    if (!kvd__pool_name_valid(v)) {
        snprintf(why, why_len, "name is not a cache name");
        return KVD_EINVAL;
    }
    snprintf(m->name, sizeof(m->name), "%.63s", v);
    NUM("owner_uid", UINT32_MAX - 1, m->owner_uid);
    NUM("shared", 1, m->shared);
    LINE("allow_uids");
    if (ids(v, m->allow_uids, &m->n_allow_uids) != 0) {
        snprintf(why, why_len, "allow_uids is not up to 16 user ids");
        return KVD_EINVAL;
    }
    LINE("allow_gids");
    if (ids(v, m->allow_gids, &m->n_allow_gids) != 0) {
        snprintf(why, why_len, "allow_gids is not up to 16 group ids");
        return KVD_EINVAL;
    }
    if ((m->n_allow_uids || m->n_allow_gids) && !m->shared) {
        snprintf(why, why_len, "allowed users or groups on a private cache");
        return KVD_EINVAL;
    }
    NUM("cluster", 1, m->cluster);
    NUM("layers", UINT32_MAX, m->layout.num_layers);
    NUM("mla", 1, m->layout.mla);
    NUM("tokens_per_block", UINT32_MAX, m->layout.tokens_per_block);
    NUM("token_bytes", INT64_MAX, m->layout.token_bytes);
    LINE("dtype");
    if (strlen(v) >= sizeof(m->layout.dtype) || !kvd__text_valid(v)) {
        snprintf(why, why_len, "dtype is not a dtype label");
        return KVD_EINVAL;
    }
    snprintf(m->layout.dtype, sizeof(m->layout.dtype), "%.15s", v);
    NUM("budget_bytes", INT64_MAX, m->budget);
    NUM("disk_budget_bytes", INT64_MAX, m->disk_budget);
    crc_at = p;
    LINE("crc32c");
    if (strlen(v) != 8 || strspn(v, "0123456789abcdef") != 8) {
        snprintf(why, why_len, "crc32c is not 8 hex digits");
        return KVD_EINVAL;
    }
    crc = (uint32_t)strtoul(v, NULL, 16);
    if (p != end) {
        snprintf(why, why_len, "%zu bytes after the checksum", (size_t)(end - p));
        return KVD_EINVAL;
    }
    if (crc != kvd__disk_crc32c(0, text, (size_t)(crc_at - text))) {
        snprintf(why, why_len, "the checksum does not match (the file is damaged)");
        return KVD_EINVAL;
    }
    if (m->budget == 0 || m->disk_budget == 0) {
        snprintf(why, why_len, "a budget of 0");
        return KVD_EINVAL;
    }
    return KVD_OK;
#undef NUM
#undef LINE
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc;

    if (fd < 0)
        return -1;
    rc = fsync(fd);
    close(fd);
    return rc;
}

kvd_status_t kvd__manifest_write(const char *dir, const kvd__manifest_t *m, char *why,
                                 size_t why_len)
{
    char text[KVD_MANIFEST_MAX], tmp[PATH_MAX], path[PATH_MAX];
    size_t len = 0, off = 0;
    int fd;

    if (kvd__manifest_format(m, text, sizeof(text), &len) != 0) {
        snprintf(why, why_len, "the manifest does not fit %d bytes", KVD_MANIFEST_MAX);
        return KVD_EINVAL;
    }
    snprintf(tmp, sizeof(tmp), "%s/%s.tmp", dir, KVD_MANIFEST_NAME);
    snprintf(path, sizeof(path), "%s/%s", dir, KVD_MANIFEST_NAME);
    (void)unlink(tmp); /* one left by a crash */
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, why_len, "cannot write %s: %s", tmp, strerror(errno));
        return KVD_EIO;
    }
    while (off < len) {
        ssize_t n = write(fd, text + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            snprintf(why, why_len, "cannot write %s: %s", tmp, n < 0 ? strerror(errno) : "short");
            goto fail;
        }
        off += (size_t)n;
    }
    if (fsync(fd) != 0) {
        snprintf(why, why_len, "fsync %s: %s", tmp, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, path) != 0) {
        snprintf(why, why_len, "rename %s: %s", tmp, strerror(errno));
        goto fail;
    }
    if (fsync_dir(dir) != 0) {
        snprintf(why, why_len, "fsync %s: %s", dir, strerror(errno));
        return KVD_EIO;
    }
    return KVD_OK;
fail:
    if (fd >= 0)
        close(fd);
    (void)unlink(tmp);
    return KVD_EIO;
}

kvd_status_t kvd__manifest_read(const char *dir, const char *dirname, kvd__manifest_t *m,
                                char *why, size_t why_len)
{
    char text[KVD_MANIFEST_MAX + 1], expect[KVD_CACHE_DIRNAME_MAX], reason[160];
    struct stat st;
    size_t len = 0;
    kvd_status_t s;
    int dfd, fd;

    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        snprintf(why, why_len, "cannot open the directory: %s", strerror(errno));
        return errno == ELOOP || errno == ENOTDIR ? KVD_EPERM : KVD_EIO;
    }
    if (fstat(dfd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        snprintf(why, why_len, "the directory belongs to uid %u with mode %04o: only the "
                 "daemon's user (uid %u) may write it", (unsigned)st.st_uid,
                 (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
        close(dfd);
        return KVD_EPERM;
    }
    fd = openat(dfd, KVD_MANIFEST_NAME, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    close(dfd);
    if (fd < 0) {
        int e = errno;
        snprintf(why, why_len, "no manifest: %s", strerror(e));
        return e == ENOENT ? KVD_ENOENT : e == ELOOP ? KVD_EPERM : KVD_EIO;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & (S_IWGRP | S_IWOTH))) {
        snprintf(why, why_len, "the manifest is not a regular file of uid %u that only it may "
                 "write (uid %u, mode %04o)", (unsigned)geteuid(), (unsigned)st.st_uid,
                 (unsigned)(st.st_mode & 07777));
        close(fd);
        return KVD_EPERM;
    }
    if (st.st_size > KVD_MANIFEST_MAX) {
        snprintf(why, why_len, "the manifest is %lld bytes (at most %d)", (long long)st.st_size,
                 KVD_MANIFEST_MAX);
        close(fd);
        return KVD_EINVAL;
    }
    for (;;) {
        ssize_t n = read(fd, text + len, sizeof(text) - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(why, why_len, "cannot read the manifest: %s", strerror(errno));
            close(fd);
            return KVD_EIO;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > KVD_MANIFEST_MAX) {
            snprintf(why, why_len, "the manifest is longer than %d bytes", KVD_MANIFEST_MAX);
            close(fd);
            return KVD_EINVAL;
        }
    }
    close(fd);
    if ((s = kvd__manifest_parse(text, len, m, reason, sizeof(reason))) != KVD_OK) {
        snprintf(why, why_len, "damaged manifest: %s", reason);
        return s;
    }
    if (kvd__cache_dirname(m->name, m->owner_uid, m->shared, expect, sizeof(expect)) != 0 ||
        strcmp(expect, dirname) != 0) {
        snprintf(why, why_len, "the manifest names cache '%s' of uid %u (shared=%d), whose "
                 "directory would be %s", m->name, m->owner_uid, m->shared, expect);
        return KVD_EINVAL;
    }
    return KVD_OK;
}

int kvd__cache_dir_remove(const char *dir)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), err = 0;
    DIR *d;
    struct dirent *e;

    if (dfd < 0)
        return -errno;
    if (unlinkat(dfd, KVD_MANIFEST_NAME, 0) != 0 && errno != ENOENT)
        err = -errno;
    if ((d = fdopendir(dfd)) == NULL) {
        err = -errno;
        close(dfd);
        return err;
    }
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) != 0 && err == 0)
            err = -errno;
    }
    closedir(d);
    if (rmdir(dir) != 0 && err == 0)
        err = -errno;
    return err;
}
