/* The disk level's store: see disk_store.h and disk_format.h. */
#include "disk_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

#define ALIGN_UP(x, a) (((x) + (a)-1) / (a) * (a))
#define ALIGN_DOWN(x, a) ((x) / (a) * (a))
#define SEG_DEFAULT (256ull << 20)
#define WRITE_DEFAULT (8u << 20)
#define WRITES_DEFAULT 8u
/* Reads that hold a bounce buffer at once, at least (twice the engine's
 * depth where that is more): a read past them waits in the store for one
 * to end and takes its buffer.  So a load of many blocks reuses a few
 * buffers, never maps (and faults in, zeroed) a buffer per block. */
#define READS_MIN 64u
/* A write batch is prepared (its records copied and summed) in up to this
 * many parts of whole records, run at once on the engine's prep threads
 * (as many as it starts by itself at most): one large batch is not left
 * to one thread. */
#define PREP_PARTS 8u
/* A block is copied into a batch and summed this much at a time: a
 * multiple of the CRC's three 8 KiB lanes that fits a core's L2 cache. */
#define COPY_PIECE (96u << 10)
/* The scan of a segment without its index reads this much at a time. */
#define SCAN_CHUNK (8u << 20)

enum seg_state { SEG_CREATING, SEG_OPEN, SEG_FAILED };

typedef struct seg {
    uint32_t no;
    int state;
    int fd, dropfd;
    int sealed;       /* takes no more records */
    int idx_done;     /* its index is on disk (or being written) */
    int dying;        /* being deleted */
    uint64_t tail;    /* bytes placed: the next record's offset */
    uint64_t file_bytes;
    uint32_t live;    /* records kept */
    uint32_t jobs;    /* requests in flight that use its descriptors */
    uint32_t writing; /* batches placed in it, not yet written */
    int err;          /* the creation's errno when SEG_FAILED */
    /* its index so far: kvd__disk_idx_ent_t, key, parent, ... (written records) */
    uint8_t *body;
    size_t body_len, body_cap;
    uint32_t count;
} seg_t;

typedef struct prec {
    const void *src;
    kvd__disk_append_cb cb;
    void *arg;
    uint32_t rel;
    kvd__disk_rec_hdr_t hdr;
} prec_t;

typedef struct batch {
    kvd__disk_req_t req;
    kvd__disk_store_t *s;
    seg_t *seg;
    uint64_t off;  /* in the segment, aligned */
    uint32_t used; /* bytes of records */
    uint32_t n, cap_n;
    uint32_t per_part; /* records in one part of its preparation */
    prec_t *recs;
    struct batch *next;  /* queued */
    struct batch *onext; /* sent, in the order appended */
    int finished;        /* its write ended (or its segment failed): st */
    kvd_status_t st;
} batch_t;

struct kvd__disk_store {
    kvd__disk_store_config_t cfg;
    char *dir;
    char *layout_text;
    kvd__disk_io_t *io;
    int direct;
    uint64_t rec_bytes, seg_bytes;
    uint32_t batch_bytes;
    uint64_t seq;
    uint32_t next_no;
    seg_t **segs; /* by number, ascending */
    uint32_t nsegs, cap_segs;
    seg_t *cur, *spare;
    batch_t *filling;
    batch_t *queued_head, *queued_tail;
    /* batches closed, oldest first: their appends complete in this order,
     * whatever order their writes end in (a batch whose segment is still
     * being made waits while a later segment's go) */
    batch_t *order_head, *order_tail;
    int completing;
    uint32_t writes_in_flight;
    void **wbufs; /* free write buffers */
    uint32_t nwbufs, wbufs_made;
    void **rbufs; /* free read buffers */
    uint32_t nrbufs;
    size_t rbuf_bytes;
    uint32_t reads_max; /* reads holding a buffer at most */
    uint32_t reads_out; /* reads holding a buffer */
    struct rd *rwait_head, *rwait_tail; /* reads waiting for one, in order */
    uint64_t jobs; /* requests in flight */
    kvd__disk_store_stats_t st;
};

/* ---- helpers ------------------------------------------------------------------ */

static void seg_path(const kvd__disk_store_t *s, uint32_t no, const char *ext, char *buf,
                     size_t len)
{
    snprintf(buf, len, "%s/seg-%08u.%s", s->dir, no, ext);
}

static seg_t *seg_find(const kvd__disk_store_t *s, uint32_t no)
{
    uint32_t lo = 0, hi = s->nsegs;

    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (s->segs[mid]->no < no)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->nsegs && s->segs[lo]->no == no ? s->segs[lo] : NULL;
}

static int seg_add(kvd__disk_store_t *s, seg_t *g)
{
    uint32_t i;

    if (s->nsegs == s->cap_segs) {
        uint32_t n = s->cap_segs ? s->cap_segs * 2 : 16;
        seg_t **p = realloc(s->segs, n * sizeof(*p));
        if (p == NULL)
            return -1;
        s->segs = p;
        s->cap_segs = n;
    }
    for (i = s->nsegs; i > 0 && s->segs[i - 1]->no > g->no; i--)
        s->segs[i] = s->segs[i - 1];
    s->segs[i] = g;
    s->nsegs++;
    s->st.segments++;
    return 0;
}

static void seg_remove(kvd__disk_store_t *s, seg_t *g)
{
    uint32_t i;

    for (i = 0; i < s->nsegs; i++)
        if (s->segs[i] == g) {
            memmove(&s->segs[i], &s->segs[i + 1], (s->nsegs - i - 1) * sizeof(*s->segs));
            s->nsegs--;
            s->st.segments--;
            break;
        }
    if (g->fd >= 0)
        close(g->fd);
    if (g->dropfd >= 0)
        close(g->dropfd);
    free(g->body);
    free(g);
}

static seg_t *seg_new(uint32_t no)
{
    seg_t *g = calloc(1, sizeof(*g));

    if (g == NULL)
        return NULL;
    g->no = no;
    g->fd = g->dropfd = -1;
    return g;
}

static int body_add(seg_t *g, uint32_t off, uint64_t seq, const uint8_t *key, uint8_t klen,
                    const uint8_t *parent, uint8_t plen)
{
    size_t need = sizeof(kvd__disk_idx_ent_t) + klen + plen;
    kvd__disk_idx_ent_t e = {.off = off, .klen = klen, .plen = plen, .seq = seq};

    if (g->body_len + need > g->body_cap) {
        size_t n = g->body_cap ? g->body_cap * 2 : 4096;
        uint8_t *p;
        while (n < g->body_len + need)
            n *= 2;
        if ((p = realloc(g->body, n)) == NULL)
            return -1;
        g->body = p;
        g->body_cap = n;
    }
    memcpy(g->body + g->body_len, &e, sizeof(e));
    memcpy(g->body + g->body_len + sizeof(e), key, klen);
    memcpy(g->body + g->body_len + sizeof(e) + klen, parent, plen);
    g->body_len += need;
    g->count++;
    return 0;
}

static void seg_hdr_make(const kvd__disk_store_t *s, uint32_t no, kvd__disk_seg_hdr_t *h)
{
    memset(h, 0, sizeof(*h));
    h->magic = KVD_DISK_SEG_MAGIC;
    h->version = KVD_DISK_VERSION;
    h->seg_no = no;
    h->layout_id = s->cfg.layout_id;
    h->block_bytes = s->cfg.block_bytes;
    h->rec_bytes = s->rec_bytes;
    h->seg_bytes = s->seg_bytes;
    snprintf(h->layout, sizeof(h->layout), "%s", s->layout_text);
    h->crc = kvd__disk_crc32c(0, h, offsetof(kvd__disk_seg_hdr_t, crc));
}

/* Whether a record header looks whole (magic, its own CRC, its fields). */
static int rec_hdr_ok(const kvd__disk_store_t *s, const kvd__disk_rec_hdr_t *h, uint32_t seg_no)
{
    return h->magic == KVD_DISK_REC_MAGIC && h->hdr_bytes == KVD_DISK_REC_HDR &&
           h->klen >= 1 && h->klen <= KVD_DISK_KEY_MAX && h->plen <= KVD_DISK_KEY_MAX &&
           h->hcrc == kvd__disk_crc32c(0, h, offsetof(kvd__disk_rec_hdr_t, hcrc)) &&
           h->seg_no == seg_no && h->layout_id == s->cfg.layout_id &&
           h->data_bytes == s->cfg.block_bytes;
}

static uint32_t rec_crc(const kvd__disk_rec_hdr_t *h, const void *data, uint64_t n)
{
    return kvd__disk_crc32c(kvd__disk_crc32c(0, h, offsetof(kvd__disk_rec_hdr_t, hcrc)), data, n);
}

/* ---- files: checks shared by open and recovery ----------------------------------------- */

/* A file of the store may be trusted: a regular file of this user that no
 * one else may write.  0, or -1 with what is wrong in why. */
static int file_trusted(int fd, char *why, size_t why_len)
{
    struct stat st;

    if (fstat(fd, &st) != 0) {
        snprintf(why, why_len, "cannot stat: %s", strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "not a regular file");
        return -1;
    }
    if (st.st_uid != geteuid()) {
        snprintf(why, why_len, "owned by uid %u, not the daemon's %u", (unsigned)st.st_uid,
                 (unsigned)geteuid());
        return -1;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(why, why_len, "writable by others (mode %04o)", (unsigned)st.st_mode & 07777);
        return -1;
    }
    return 0;
}

static int open_trusted(const char *path, int flags, char *why, size_t why_len)
{
    int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC);

    if (fd < 0) {
        snprintf(why, why_len, "%s", errno == ELOOP ? "a symbolic link" : strerror(errno));
        return -1;
    }
    if (file_trusted(fd, why, why_len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* ---- buffers ------------------------------------------------------------------------ */

static void *wbuf_get(kvd__disk_store_t *s)
{
    if (s->nwbufs > 0)
        return s->wbufs[--s->nwbufs];
    s->wbufs_made++;
    return kvd__disk_alloc_aligned(s->batch_bytes);
}

static void wbuf_put(kvd__disk_store_t *s, void *b)
{
    if (b == NULL)
        return;
    if (s->nwbufs < s->cfg.max_writes)
        s->wbufs[s->nwbufs++] = b;
    else
        kvd__disk_free_aligned(b, s->batch_bytes);
}

static void *rbuf_get(kvd__disk_store_t *s)
{
    void *b;

    if (s->nrbufs > 0)
        return s->rbufs[--s->nrbufs];
    if ((b = kvd__disk_alloc_aligned(s->rbuf_bytes)) != NULL)
        s->st.read_buffers++;
    return b;
}

static void rbuf_put(kvd__disk_store_t *s, void *b)
{
    s->rbufs[s->nrbufs++] = b; /* never more than reads_max */
}

/* ---- segments: creation, sealing, deletion (on the I/O threads) ----------------------------- */

typedef struct seg_job {
    kvd__disk_req_t req;
    kvd__disk_store_t *s;
    seg_t *g;
    /* creation */
    int fd, dropfd;
    /* the index */
    uint8_t *body;
    size_t body_len;
    uint32_t count;
    uint64_t data_end;
    /* paths */
    char path[PATH_MAX], path2[PATH_MAX], path3[PATH_MAX];
} seg_job_t;

static void seg_submit_ready(kvd__disk_store_t *s);
static void seg_maybe_finish(kvd__disk_store_t *s, seg_t *g);

/* Every request the store submits counts in s->jobs (close waits for
 * none) and, while it uses a segment's descriptors, in g->jobs (the
 * segment is deleted only at none); job_end undoes job_submit's counts. */
/* A request in flight from now: close waits for it, its segment stays. */
static void job_begin(kvd__disk_store_t *s, seg_t *g)
{
    s->jobs++;
    if (g != NULL)
        g->jobs++;
}

static void job_submit(kvd__disk_store_t *s, seg_t *g, kvd__disk_req_t *req)
{
    job_begin(s, g);
    kvd__disk_io_submit(s->io, req);
}

static void job_end(kvd__disk_store_t *s, seg_t *g)
{
    s->jobs--;
    if (g != NULL)
        g->jobs--;
}

/* The job of a counted segment's request, its counts undone. */
static seg_job_t *seg_job_end(kvd__disk_req_t *r)
{
    seg_job_t *j = r->arg;

    job_end(j->s, j->g);
    return j;
}

/* A segment job's call on the I/O thread: before on it, done back here. */
static void seg_job_submit(seg_job_t *j, seg_t *counted,
                           void (*before)(kvd__disk_req_t *, unsigned),
                           void (*done)(kvd__disk_req_t *))
{
    j->req.op = KVD_DISK_OP_CALL;
    j->req.before = before;
    j->req.done = done;
    j->req.arg = j;
    job_submit(j->s, counted, &j->req);
}

static void create_before(kvd__disk_req_t *r, unsigned part)
{
    seg_job_t *j = r->arg;
    kvd__disk_store_t *s = j->s;
    kvd__disk_seg_hdr_t *h;
    void *buf;
    int e;

    j->fd = open(j->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (s->direct ? O_DIRECT : 0),
                 0600);
    if (j->fd < 0) {
        r->res = -errno;
        return;
    }
    /* the whole segment at once: its writes then fill allocated space
     * instead of growing the file one batch at a time.  Where that is
     * refused (no room for all of it, a file size limit) the segment grows
     * as written, and a write that finds no room fails on its own. */
    (void)!fallocate(j->fd, 0, 0, (off_t)s->seg_bytes);
    buf = kvd__disk_alloc_aligned(KVD_DISK_SEG_HDR);
    if (buf == NULL) {
        e = ENOMEM;
        goto fail;
    }
    h = buf;
    seg_hdr_make(s, j->g->no, h);
    if (pwrite(j->fd, buf, KVD_DISK_SEG_HDR, 0) != KVD_DISK_SEG_HDR) {
        e = errno ? errno : EIO;
        kvd__disk_free_aligned(buf, KVD_DISK_SEG_HDR);
        goto fail;
    }
    kvd__disk_free_aligned(buf, KVD_DISK_SEG_HDR);
    j->dropfd = open(j->path2, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    if (j->dropfd < 0) {
        e = errno;
        goto fail;
    }
    return;
fail:
    close(j->fd);
    unlink(j->path);
    j->fd = -1;
    r->res = -e;
}

static void create_done(kvd__disk_req_t *r)
{
    seg_job_t *j = seg_job_end(r);
    kvd__disk_store_t *s = j->s;
    seg_t *g = j->g;

    if (r->res < 0) {
        g->state = SEG_FAILED;
        g->err = (int)-r->res;
        kvd_log(KVD_LOG_ERROR, "event=disk_segment_failed dir=%s seg=%u error=\"%s\"", s->dir,
                g->no, strerror(g->err));
    } else {
        g->state = SEG_OPEN;
        g->fd = j->fd;
        g->dropfd = j->dropfd;
        g->file_bytes = s->seg_bytes;
        s->st.file_bytes += s->seg_bytes;
    }
    free(j);
    seg_submit_ready(s);
    seg_maybe_finish(s, g);
}

static seg_t *seg_create(kvd__disk_store_t *s)
{
    seg_t *g = seg_new(s->next_no);
    seg_job_t *j = calloc(1, sizeof(*j));

    if (g == NULL || j == NULL || seg_add(s, g) != 0) {
        free(g);
        free(j);
        return NULL;
    }
    s->next_no++;
    g->state = SEG_CREATING;
    g->tail = KVD_DISK_SEG_HDR;
    j->s = s;
    j->g = g;
    j->fd = j->dropfd = -1;
    seg_path(s, g->no, "kvd", j->path, sizeof(j->path));
    seg_path(s, g->no, "drop", j->path2, sizeof(j->path2));
    seg_job_submit(j, g, create_before, create_done);
    return g;
}

/* Write an index file whole, under a temporary name then renamed: a
 * crash leaves the old state or the new, and a damaged one fails its
 * CRC.  0, or -errno. */
static int idx_write(const char *path, const char *tmp, uint32_t seg_no, uint64_t layout_id,
                     uint64_t rec_bytes, uint64_t data_end, const uint8_t *body, size_t len,
                     uint32_t count)
{
    kvd__disk_idx_hdr_t h;
    int fd, e = 0;

    memset(&h, 0, sizeof(h));
    h.magic = KVD_DISK_IDX_MAGIC;
    h.version = KVD_DISK_VERSION;
    h.seg_no = seg_no;
    h.layout_id = layout_id;
    h.rec_bytes = rec_bytes;
    h.data_end = data_end;
    h.count = count;
    h.body_bytes = len;
    h.body_crc = kvd__disk_crc32c(0, body, len);
    h.crc = kvd__disk_crc32c(0, &h, offsetof(kvd__disk_idx_hdr_t, crc));
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if (write(fd, &h, sizeof(h)) != (ssize_t)sizeof(h))
        e = errno ? errno : EIO;
    while (e == 0 && len > 0) {
        ssize_t n = write(fd, body, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            e = n < 0 ? errno : EIO;
            break;
        }
        body += n;
        len -= (size_t)n;
    }
    if (close(fd) != 0 && e == 0)
        e = errno;
    if (e == 0 && rename(tmp, path) != 0)
        e = errno;
    if (e != 0)
        unlink(tmp);
    return -e;
}

static void idx_before(kvd__disk_req_t *r, unsigned part)
{
    seg_job_t *j = r->arg;
    kvd__disk_store_t *s = j->s;

    r->res = idx_write(j->path, j->path2, j->g->no, s->cfg.layout_id, s->rec_bytes, j->data_end,
                       j->body, j->body_len, j->count);
}

static void idx_done(kvd__disk_req_t *r)
{
    seg_job_t *j = seg_job_end(r);
    kvd__disk_store_t *s = j->s;
    seg_t *g = j->g;

    if (r->res < 0) {
        s->st.io_errors++;
        kvd_log(KVD_LOG_WARN,
                "event=disk_index_failed dir=%s seg=%u error=\"%s\" effect=\"read whole at the "
                "next start\"",
                s->dir, g->no, strerror((int)-r->res));
    }
    free(j->body);
    free(j);
    seg_maybe_finish(s, g);
}

static void delete_before(kvd__disk_req_t *r, unsigned part)
{
    seg_job_t *j = r->arg;

    if (j->fd >= 0)
        close(j->fd);
    if (j->dropfd >= 0)
        close(j->dropfd);
    unlink(j->path);
    unlink(j->path2);
    unlink(j->path3);
}

static void delete_done(kvd__disk_req_t *r)
{
    seg_job_t *j = r->arg;
    kvd__disk_store_t *s = j->s;

    job_end(s, NULL);
    s->st.file_bytes -= s->st.file_bytes >= j->g->file_bytes ? j->g->file_bytes : s->st.file_bytes;
    seg_remove(s, j->g);
    free(j);
}

/* A sealed segment: write its index once its batches are written; delete
 * it once no record of it is kept and nothing uses it. */
static void seg_maybe_finish(kvd__disk_store_t *s, seg_t *g)
{
    seg_job_t *j;

    if (!g->sealed || g->dying || g->writing > 0 || g->state == SEG_CREATING)
        return;
    if (g->live == 0 && g->jobs == 0 && g != s->cur && g != s->spare) {
        if ((j = calloc(1, sizeof(*j))) == NULL)
            return; /* stays; tried again at the next drop or close */
        g->dying = 1;
        j->s = s;
        j->g = g;
        j->fd = g->fd;
        j->dropfd = g->dropfd;
        g->fd = g->dropfd = -1;
        seg_path(s, g->no, "kvd", j->path, sizeof(j->path));
        seg_path(s, g->no, "drop", j->path2, sizeof(j->path2));
        seg_path(s, g->no, "idx", j->path3, sizeof(j->path3));
        seg_job_submit(j, NULL, delete_before, delete_done); /* g is going */
        return;
    }
    if (g->idx_done || g->state != SEG_OPEN || g->live == 0)
        return;
    if ((j = calloc(1, sizeof(*j))) == NULL)
        return;
    g->idx_done = 1;
    j->s = s;
    j->g = g;
    j->body = g->body;
    j->body_len = g->body_len;
    j->count = g->count;
    j->data_end = g->tail;
    g->body = NULL;
    g->body_len = g->body_cap = 0;
    seg_path(s, g->no, "idx", j->path, sizeof(j->path));
    seg_path(s, g->no, "idx.tmp", j->path2, sizeof(j->path2));
    seg_job_submit(j, g, idx_before, idx_done);
}

/* ---- writes ---------------------------------------------------------------------------- */

/* Copy n bytes from src to dst and return the CRC-32C (from crc) of what
 * dst holds: in pieces small enough to be summed while still in the
 * core's cache, so that a block is read from memory once, not twice. */
static uint32_t copy_sum(uint32_t crc, char *dst, const char *src, uint64_t n)
{
    while (n > 0) {
        size_t k = n < COPY_PIECE ? (size_t)n : COPY_PIECE;
        memcpy(dst, src, k);
        crc = kvd__disk_crc32c(crc, dst, k);
        dst += k;
        src += k;
        n -= k;
    }
    return crc;
}

/* One part of a batch's records (b->per_part of them) into its buffer,
 * summed; the last part also zeroes the buffer's tail.  The parts run at
 * once on the engine's prep threads, each on its own records. */
static void batch_before(kvd__disk_req_t *r, unsigned part)
{
    batch_t *b = r->arg;
    kvd__disk_store_t *s = b->s;
    char *buf = r->buf;
    uint32_t i = part * b->per_part, end = i + b->per_part;

    if (end >= b->n) {
        end = b->n;
        memset(buf + b->used, 0, r->len - b->used);
    }
    for (; i < end; i++) {
        prec_t *p = &b->recs[i];
        char *at = buf + p->rel;
        /* hcrc: the header before it; crc: the same bytes, then the data */
        p->hdr.hcrc = kvd__disk_crc32c(0, &p->hdr, offsetof(kvd__disk_rec_hdr_t, hcrc));
        p->hdr.crc = copy_sum(p->hdr.hcrc, at + KVD_DISK_REC_HDR, p->src, s->cfg.block_bytes);
        memcpy(at, &p->hdr, KVD_DISK_REC_HDR);
        memset(at + KVD_DISK_REC_HDR + s->cfg.block_bytes, 0,
               s->rec_bytes - KVD_DISK_REC_HDR - s->cfg.block_bytes);
    }
}

static void batch_free(batch_t *b)
{
    free(b->recs);
    free(b);
}

/* A batch's appends complete: its records indexed, their callbacks run.
 * In the order the batches were appended (batch_ended), so that appends
 * complete in the order made: the cache's recency follows it. */
static void batch_complete(kvd__disk_store_t *s, batch_t *b)
{
    seg_t *g = b->seg;
    uint32_t i;

    g->writing--;
    if (b->st == KVD_OK)
        for (i = 0; i < b->n; i++) {
            prec_t *p = &b->recs[i];
            if (body_add(g, (uint32_t)(b->off + p->rel), p->hdr.seq, p->hdr.key, p->hdr.klen,
                         p->hdr.parent, p->hdr.plen) != 0) {
                p->rel = UINT32_MAX; /* cannot be indexed: reported as failed below */
                continue;
            }
            g->live++;
            s->st.records++;
            s->st.live_bytes += s->rec_bytes;
            s->st.appends++;
            s->st.append_bytes += s->cfg.block_bytes;
        }
    for (i = 0; i < b->n; i++) {
        prec_t *p = &b->recs[i];
        if (b->st != KVD_OK)
            p->cb(p->arg, b->st, 0);
        else if (p->rel == UINT32_MAX)
            p->cb(p->arg, KVD_ENOMEM, 0);
        else
            p->cb(p->arg, KVD_OK, KVD_DISK_LOC(g->no, b->off + p->rel));
    }
    batch_free(b);
    seg_maybe_finish(s, g);
}

/* b has ended with st: complete every batch at the head of the order
 * that has (an append's callback may end more, even this one's: once). */
static void batch_ended(kvd__disk_store_t *s, batch_t *b, kvd_status_t st)
{
    b->finished = 1;
    b->st = st;
    if (s->completing)
        return; /* the loop below, further up the stack, takes it */
    s->completing = 1;
    while (s->order_head != NULL && s->order_head->finished) {
        batch_t *h = s->order_head;
        s->order_head = h->onext;
        if (s->order_head == NULL)
            s->order_tail = NULL;
        batch_complete(s, h);
    }
    s->completing = 0;
}

/* b, just closed, goes to the end of the order. */
static void batch_order(kvd__disk_store_t *s, batch_t *b)
{
    b->onext = NULL;
    b->finished = 0;
    if (s->order_tail)
        s->order_tail->onext = b;
    else
        s->order_head = b;
    s->order_tail = b;
}

/* A batch that could not be written (errno e) fails its records: no
 * room is ELIMIT (the caller keeps them in host memory), else EIO; the
 * stats count it. */
static kvd_status_t batch_failed(kvd__disk_store_t *s, const batch_t *b, int e)
{
    if (e == ENOSPC || e == EFBIG || e == EDQUOT) {
        s->st.no_space += b->n;
        return KVD_ELIMIT;
    }
    s->st.io_errors++;
    return KVD_EIO;
}

static void batch_done(kvd__disk_req_t *r)
{
    batch_t *b = r->arg;
    kvd__disk_store_t *s = b->s;
    seg_t *g = b->seg;
    kvd_status_t st = KVD_OK;

    job_end(s, g);
    s->writes_in_flight--;
    wbuf_put(s, r->buf);
    if (r->res < 0) {
        int e = (int)-r->res;
        st = batch_failed(s, b, e);
        kvd_log(KVD_LOG_ERROR,
                "event=disk_write_failed dir=%s seg=%u off=%" PRIu64 " records=%u error=\"%s\"",
                s->dir, g->no, b->off, b->n, strerror(e));
    } else {
        s->st.writes++;
        s->st.write_bytes += r->len;
    }
    seg_submit_ready(s);
    batch_ended(s, b, st);
}

static void nomem_before(kvd__disk_req_t *r, unsigned part)
{
    r->res = -ENOMEM;
}

static void batch_send(kvd__disk_store_t *s, batch_t *b)
{
    b->req.op = KVD_DISK_OP_WRITE;
    b->req.fd = b->seg->fd;
    b->req.off = b->off;
    b->req.len = ALIGN_UP(b->used, KVD_DISK_ALIGN);
    b->req.buf = wbuf_get(s);
    b->req.before = batch_before;
    b->req.done = batch_done;
    b->req.arg = b;
    b->per_part = (b->n + PREP_PARTS - 1) / PREP_PARTS;
    b->req.parts = (b->n + b->per_part - 1) / b->per_part;
    if (b->req.buf == NULL) { /* no memory for the buffer: the batch fails */
        b->req.before = nomem_before;
        b->req.parts = 1;
    }
    s->writes_in_flight++;
    job_submit(s, b->seg, &b->req);
}

/* Send the queued batches whose segment is ready, in order, while fewer
 * than max_writes are in flight; fail those whose segment failed. */
static void seg_submit_ready(kvd__disk_store_t *s)
{
    batch_t **pp = &s->queued_head, *b, *prev = NULL;

    while ((b = *pp) != NULL) {
        if (b->seg->state == SEG_CREATING ||
            (b->seg->state == SEG_OPEN && s->writes_in_flight >= s->cfg.max_writes)) {
            prev = b;
            pp = &b->next;
            continue;
        }
        *pp = b->next;
        if (s->queued_tail == b)
            s->queued_tail = prev;
        if (b->seg->state == SEG_OPEN) {
            batch_send(s, b);
            continue;
        }
        /* the segment could not be made: the batch fails, in its turn */
        batch_ended(s, b, batch_failed(s, b, b->seg->err));
    }
}

static void batch_close(kvd__disk_store_t *s)
{
    batch_t *b = s->filling;

    if (b == NULL)
        return;
    s->filling = NULL;
    if (b->n == 0) {
        b->seg->writing--;
        batch_free(b);
        return;
    }
    b->next = NULL;
    if (s->queued_tail)
        s->queued_tail->next = b;
    else
        s->queued_head = b;
    s->queued_tail = b;
    batch_order(s, b); /* closed in the order appended; sent as its segment allows */
    seg_submit_ready(s);
}

void kvd__disk_store_flush(kvd__disk_store_t *s)
{
    batch_close(s);
}

/* The segment that takes the next record: the open one while it has room,
 * else the one made ahead (and another made ahead of it). */
static seg_t *seg_for_record(kvd__disk_store_t *s)
{
    seg_t *g = s->cur;

    if (g != NULL && g->state != SEG_FAILED &&
        ALIGN_UP(g->tail, (s->filling ? KVD_DISK_REC_ALIGN : KVD_DISK_ALIGN)) + s->rec_bytes <=
            s->seg_bytes)
        return g;
    batch_close(s);
    if (g != NULL) {
        g->sealed = 1;
        s->cur = NULL;
        seg_maybe_finish(s, g);
    }
    if (s->spare != NULL && s->spare->state != SEG_FAILED) {
        s->cur = s->spare;
        s->spare = NULL;
    } else {
        if (s->spare != NULL) { /* failed: gone, tried again with a new one */
            seg_t *f = s->spare;
            s->spare = NULL;
            f->sealed = 1;
            seg_maybe_finish(s, f);
        }
        s->cur = seg_create(s);
    }
    if (s->cur != NULL && s->spare == NULL)
        s->spare = seg_create(s);
    return s->cur;
}

kvd_status_t kvd__disk_append(kvd__disk_store_t *s, const uint8_t *key, size_t klen,
                              const uint8_t *parent, size_t plen, const void *src,
                              kvd__disk_append_cb cb, void *arg)
{
    seg_t *g;
    batch_t *b;
    prec_t *p;

    if (klen < 1 || klen > KVD_DISK_KEY_MAX || plen > KVD_DISK_KEY_MAX ||
        (parent == NULL) != (plen == 0) || src == NULL || cb == NULL)
        return KVD_EINVAL;
    if ((g = seg_for_record(s)) == NULL)
        return KVD_ENOMEM;
    b = s->filling;
    if (b != NULL && b->used + s->rec_bytes > s->batch_bytes) {
        batch_close(s);
        if ((g = seg_for_record(s)) == NULL)
            return KVD_ENOMEM;
        b = NULL;
    }
    if (b == NULL) {
        if ((b = calloc(1, sizeof(*b))) == NULL)
            return KVD_ENOMEM;
        b->s = s;
        b->seg = g;
        b->off = ALIGN_UP(g->tail, KVD_DISK_ALIGN);
        g->tail = b->off;
        g->writing++;
        s->filling = b;
    }
    if (b->n == b->cap_n) {
        uint32_t n = b->cap_n ? b->cap_n * 2 : 16;
        prec_t *r = realloc(b->recs, n * sizeof(*r));
        if (r == NULL)
            return KVD_ENOMEM;
        b->recs = r;
        b->cap_n = n;
    }
    p = &b->recs[b->n++];
    memset(p, 0, sizeof(*p));
    p->src = src;
    p->cb = cb;
    p->arg = arg;
    p->rel = b->used;
    p->hdr.magic = KVD_DISK_REC_MAGIC;
    p->hdr.klen = (uint8_t)klen;
    p->hdr.plen = (uint8_t)plen;
    p->hdr.hdr_bytes = KVD_DISK_REC_HDR;
    p->hdr.seg_no = g->no;
    p->hdr.data_bytes = s->cfg.block_bytes;
    p->hdr.layout_id = s->cfg.layout_id;
    p->hdr.seq = s->seq++;
    memcpy(p->hdr.key, key, klen);
    if (plen)
        memcpy(p->hdr.parent, parent, plen);
    b->used += (uint32_t)s->rec_bytes;
    g->tail = b->off + b->used;
    if (b->used + s->rec_bytes > s->batch_bytes ||
        g->tail + s->rec_bytes > s->seg_bytes) /* full: goes now */
        batch_close(s);
    return KVD_OK;
}

/* ---- reads -------------------------------------------------------------------------- */

typedef struct rd {
    kvd__disk_req_t req;
    kvd__disk_store_t *s;
    seg_t *g;
    uint32_t skip; /* the record's place in the buffer */
    uint8_t klen;
    uint8_t key[KVD_DISK_KEY_MAX];
    void *dst;
    kvd__disk_read_cb cb;
    void *arg;
    const char *bad; /* what failed the checks */
    struct rd *next; /* waiting for a buffer */
} rd_t;

static void read_after(kvd__disk_req_t *r, unsigned part)
{
    rd_t *d = r->arg;
    kvd__disk_store_t *s = d->s;
    const char *at = (const char *)r->buf + d->skip;
    kvd__disk_rec_hdr_t h;

    memcpy(&h, at, sizeof(h));
    if (!rec_hdr_ok(s, &h, d->g->no))
        d->bad = "header";
    else if (h.klen != d->klen || memcmp(h.key, d->key, d->klen) != 0)
        d->bad = "key";
    else if (h.crc != rec_crc(&h, at + KVD_DISK_REC_HDR, s->cfg.block_bytes))
        d->bad = "checksum";
    else
        memcpy(d->dst, at + KVD_DISK_REC_HDR, s->cfg.block_bytes);
}

static void read_done(kvd__disk_req_t *r)
{
    rd_t *d = r->arg;
    kvd__disk_store_t *s = d->s;
    seg_t *g = d->g;
    kvd_status_t st = KVD_OK;
    char path[PATH_MAX];

    job_end(s, g);
    if (s->rwait_head != NULL) { /* the next read waiting takes the buffer, and goes first */
        rd_t *w = s->rwait_head;

        if ((s->rwait_head = w->next) == NULL)
            s->rwait_tail = NULL;
        w->req.buf = r->buf;
        kvd__disk_io_submit(s->io, &w->req); /* counted when made */
    } else {
        rbuf_put(s, r->buf);
        s->reads_out--;
    }
    if (r->res < 0) {
        s->st.io_errors++;
        st = KVD_EIO;
        seg_path(s, g->no, "kvd", path, sizeof(path));
        kvd_log(KVD_LOG_ERROR,
                "event=disk_read_failed path=%s off=%" PRIu64 " error=\"%s\" "
                "effect=\"block treated as missing\"",
                path, r->off + d->skip, strerror((int)-r->res));
    } else if (d->bad != NULL) {
        s->st.checksum_failures++;
        st = KVD_EIO;
        seg_path(s, g->no, "kvd", path, sizeof(path));
        kvd_log(KVD_LOG_ERROR,
                "event=disk_record_bad path=%s off=%" PRIu64 " failed=%s "
                "effect=\"block treated as missing\"",
                path, r->off + d->skip, d->bad);
    } else {
        s->st.reads++;
        s->st.read_bytes += s->cfg.block_bytes;
    }
    d->cb(d->arg, st);
    free(d);
    seg_maybe_finish(s, g);
}

kvd_status_t kvd__disk_read(kvd__disk_store_t *s, kvd__disk_loc_t loc, const uint8_t *key,
                            size_t klen, void *dst, kvd__disk_read_cb cb, void *arg)
{
    seg_t *g = seg_find(s, KVD_DISK_LOC_SEG(loc));
    uint64_t off = KVD_DISK_LOC_OFF(loc), start;
    rd_t *d;

    if (g == NULL || g->state != SEG_OPEN || g->dying || klen < 1 || klen > KVD_DISK_KEY_MAX ||
        off < KVD_DISK_SEG_HDR || off + s->rec_bytes > g->tail || dst == NULL || cb == NULL)
        return KVD_EINVAL;
    if ((d = calloc(1, sizeof(*d))) == NULL)
        return KVD_ENOMEM;
    start = ALIGN_DOWN(off, KVD_DISK_ALIGN);
    if (s->reads_out < s->reads_max) {
        if ((d->req.buf = rbuf_get(s)) == NULL) {
            free(d);
            return KVD_ENOMEM;
        }
        s->reads_out++;
    }
    d->s = s;
    d->g = g;
    d->skip = (uint32_t)(off - start);
    d->klen = (uint8_t)klen;
    memcpy(d->key, key, klen);
    d->dst = dst;
    d->cb = cb;
    d->arg = arg;
    d->req.op = KVD_DISK_OP_READ;
    d->req.fd = g->fd;
    d->req.off = start;
    d->req.len = ALIGN_UP(off + s->rec_bytes, KVD_DISK_ALIGN) - start;
    d->req.after = read_after;
    d->req.done = read_done;
    d->req.arg = d;
    if (d->req.buf != NULL) {
        job_submit(s, g, &d->req);
        return KVD_OK;
    }
    /* counted now, sent by the read_done that hands it a buffer */
    job_begin(s, g);
    if (s->rwait_tail != NULL)
        s->rwait_tail->next = d;
    else
        s->rwait_head = d;
    s->rwait_tail = d;
    return KVD_OK;
}

/* ---- drops ----------------------------------------------------------------------------- */

typedef struct drop_job {
    kvd__disk_req_t req;
    kvd__disk_store_t *s;
    seg_t *g;
    int fd, dropfd;
    uint32_t off;
    uint64_t rec_bytes;
} drop_job_t;

static void drop_before(kvd__disk_req_t *r, unsigned part)
{
    drop_job_t *j = r->arg;
    uint64_t a = ALIGN_UP((uint64_t)j->off, KVD_DISK_ALIGN);
    uint64_t e = ALIGN_DOWN((uint64_t)j->off + j->rec_bytes, KVD_DISK_ALIGN);

    if (write(j->dropfd, &j->off, sizeof(j->off)) != (ssize_t)sizeof(j->off))
        r->res = -(errno ? errno : EIO);
    /* the space back where whole pages are the record's alone */
    if (e > a)
        (void)fallocate(j->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a,
                        (off_t)(e - a));
}

static void drop_done(kvd__disk_req_t *r)
{
    drop_job_t *j = r->arg;
    kvd__disk_store_t *s = j->s;

    job_end(s, j->g);
    if (r->res < 0) {
        s->st.io_errors++;
        kvd_log(KVD_LOG_WARN,
                "event=disk_drop_unrecorded dir=%s seg=%u off=%u error=\"%s\" "
                "effect=\"the record may come back after a restart\"",
                s->dir, j->g->no, j->off, strerror((int)-r->res));
    }
    seg_maybe_finish(s, j->g);
    free(j);
}

void kvd__disk_drop(kvd__disk_store_t *s, kvd__disk_loc_t loc)
{
    seg_t *g = seg_find(s, KVD_DISK_LOC_SEG(loc));
    drop_job_t *j;

    if (g == NULL || g->live == 0 || g->dying)
        return;
    g->live--;
    s->st.records--;
    s->st.live_bytes -= s->rec_bytes;
    s->st.drops++;
    /* recorded even when it was the segment's last record: the segment is
     * deleted once this job ends, and a crash before that must not bring
     * the record back */
    if ((j = calloc(1, sizeof(*j))) == NULL) {
        seg_maybe_finish(s, g);
        return;
    }
    j->s = s;
    j->g = g;
    j->fd = g->fd;
    j->dropfd = g->dropfd;
    j->off = KVD_DISK_LOC_OFF(loc);
    j->rec_bytes = s->rec_bytes;
    j->req.op = KVD_DISK_OP_CALL;
    j->req.before = drop_before;
    j->req.done = drop_done;
    j->req.arg = j;
    job_submit(s, g, &j->req);
}

/* ---- recovery ------------------------------------------------------------------------------ */

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Read a whole small file (an index, a drop list) of at most max bytes. */
static uint8_t *slurp(int fd, size_t max, size_t *len, char *why, size_t why_len)
{
    struct stat st;
    uint8_t *p;
    size_t got = 0;

    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size > max) {
        snprintf(why, why_len, "larger than its segment allows");
        return NULL;
    }
    p = malloc((size_t)st.st_size + 1);
    if (p == NULL) {
        snprintf(why, why_len, "out of memory");
        return NULL;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = pread(fd, p + got, (size_t)st.st_size - got, (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            snprintf(why, why_len, "cannot read: %s", n < 0 ? strerror(errno) : "short");
            free(p);
            return NULL;
        }
        got += (size_t)n;
    }
    *len = got;
    return p;
}

/* Entries of a segment found at open. */
typedef struct found_set {
    uint8_t *body; /* kvd__disk_idx_ent_t + key + parent, ... */
    size_t len;
    uint32_t count;
    uint64_t data_end;
} found_set_t;

/* The segment's index file, checked against the segment: 0, or -1 with
 * why (missing, damaged, another segment's or layout's). */
static int idx_read(kvd__disk_store_t *s, seg_t *g, uint64_t file_size, found_set_t *fs,
                    uint64_t *lost, char *why, size_t why_len)
{
    char path[PATH_MAX];
    kvd__disk_idx_hdr_t h;
    uint8_t *p, *q, *end;
    size_t len, max;
    uint32_t i, kept = 0;
    int fd;

    seg_path(s, g->no, "idx", path, sizeof(path));
    fd = open_trusted(path, O_RDONLY, why, why_len);
    if (fd < 0)
        return -1;
    max = sizeof(h) + (s->seg_bytes / s->rec_bytes + 1) *
                          (sizeof(kvd__disk_idx_ent_t) + 2 * KVD_DISK_KEY_MAX);
    p = slurp(fd, max, &len, why, why_len);
    close(fd);
    if (p == NULL)
        return -1;
    if (len < sizeof(h)) {
        snprintf(why, why_len, "truncated");
        goto bad;
    }
    memcpy(&h, p, sizeof(h));
    if (h.magic != KVD_DISK_IDX_MAGIC || h.version != KVD_DISK_VERSION ||
        h.crc != kvd__disk_crc32c(0, &h, offsetof(kvd__disk_idx_hdr_t, crc))) {
        snprintf(why, why_len, "not an index of this version, or its header is damaged");
        goto bad;
    }
    if (h.seg_no != g->no || h.layout_id != s->cfg.layout_id || h.rec_bytes != s->rec_bytes) {
        snprintf(why, why_len, "of another segment or layout");
        goto bad;
    }
    if (h.body_bytes != len - sizeof(h) ||
        h.body_crc != kvd__disk_crc32c(0, p + sizeof(h), len - sizeof(h))) {
        snprintf(why, why_len, "damaged (checksum)");
        goto bad;
    }
    /* entries: bounded, aligned, within what was written; those past a
     * truncated end are lost */
    q = p + sizeof(h);
    end = p + len;
    for (i = 0; i < h.count; i++) {
        kvd__disk_idx_ent_t e;
        if ((size_t)(end - q) < sizeof(e))
            break;
        memcpy(&e, q, sizeof(e));
        if (e.klen < 1 || e.klen > KVD_DISK_KEY_MAX || e.plen > KVD_DISK_KEY_MAX ||
            (size_t)(end - q) < sizeof(e) + e.klen + e.plen || e.off < KVD_DISK_SEG_HDR ||
            e.off % KVD_DISK_REC_ALIGN != 0 || e.off + s->rec_bytes > h.data_end)
            break;
        if (ALIGN_UP(e.off + s->rec_bytes, KVD_DISK_ALIGN) > file_size) {
            (*lost)++;
            q += sizeof(e) + e.klen + e.plen;
            continue;
        }
        kept++;
        q += sizeof(e) + e.klen + e.plen;
    }
    if (i != h.count) {
        snprintf(why, why_len, "entry %u is malformed", i);
        goto bad;
    }
    fs->body = p;
    fs->len = len;
    fs->count = h.count;
    fs->data_end = h.data_end;
    (void)kept;
    return 0;
bad:
    free(p);
    return -1;
}

/* Read chunk bytes of the file from the aligned offset at or below pos. */
static int refill(int fd, uint8_t *buf, size_t chunk, uint64_t pos, uint64_t *base, uint64_t *have)
{
    uint64_t a = ALIGN_DOWN(pos, KVD_DISK_ALIGN);
    ssize_t n;

    do
        n = pread(fd, buf, chunk, (off_t)a);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return -1;
    *base = a;
    *have = (uint64_t)n;
    return 0;
}

/* Read a segment whole for its records (no index, or a damaged one): every
 * record whose header and data pass their checks, in order.  Pages not
 * written read as zeros and are passed over; so are records torn by a
 * crash (counted in *lost). */
static int seg_scan(kvd__disk_store_t *s, seg_t *g, int fd, uint64_t file_size, found_set_t *fs,
                    uint64_t *lost)
{
    size_t chunk = SCAN_CHUNK, blen;
    uint8_t *buf;
    uint64_t pos = KVD_DISK_SEG_HDR, base = UINT64_MAX, have = 0, end = file_size;
    seg_t tmp = {0};

    if (chunk < ALIGN_UP(s->rec_bytes, KVD_DISK_ALIGN) + KVD_DISK_ALIGN)
        chunk = ALIGN_UP(s->rec_bytes, KVD_DISK_ALIGN) + KVD_DISK_ALIGN;
    blen = chunk;
    buf = kvd__disk_alloc_aligned(blen);
    if (buf == NULL)
        return -1;
    if (end > s->seg_bytes)
        end = s->seg_bytes;
    while (pos + KVD_DISK_REC_HDR <= end) {
        kvd__disk_rec_hdr_t h;
        /* the buffer holds [base, base + have) */
        if (base == UINT64_MAX || pos < base || pos + KVD_DISK_REC_HDR > base + have) {
            if (refill(fd, buf, chunk, pos, &base, &have) != 0 ||
                pos + KVD_DISK_REC_HDR > base + have)
                break;
        }
        memcpy(&h, buf + (pos - base), sizeof(h));
        if (h.magic != KVD_DISK_REC_MAGIC || !rec_hdr_ok(s, &h, g->no)) {
            pos += KVD_DISK_REC_ALIGN;
            continue;
        }
        if (pos + s->rec_bytes > base + have &&
            (refill(fd, buf, chunk, pos, &base, &have) != 0 || pos + s->rec_bytes > base + have)) {
            (*lost)++; /* the file ends inside it */
            break;
        }
        if (h.crc != rec_crc(&h, buf + (pos - base) + KVD_DISK_REC_HDR, s->cfg.block_bytes)) {
            (*lost)++;
            pos += s->rec_bytes;
            continue;
        }
        if (body_add(&tmp, (uint32_t)pos, h.seq, h.key, h.klen, h.parent, h.plen) != 0) {
            free(tmp.body);
            kvd__disk_free_aligned(buf, blen);
            return -1;
        }
        pos += s->rec_bytes;
        if (pos > fs->data_end)
            fs->data_end = pos;
    }
    kvd__disk_free_aligned(buf, blen);
    fs->body = tmp.body; /* entries only, no header */
    fs->len = tmp.body_len;
    fs->count = tmp.count;
    if (fs->data_end < KVD_DISK_SEG_HDR)
        fs->data_end = KVD_DISK_SEG_HDR;
    return 0;
}

static uint32_t ent_off(const uint8_t *p)
{
    kvd__disk_idx_ent_t e;
    memcpy(&e, p, sizeof(e));
    return e.off;
}

static int cmp_ent(const void *a, const void *b)
{
    uint32_t x = ent_off(*(const uint8_t *const *)a), y = ent_off(*(const uint8_t *const *)b);
    return x < y ? -1 : x > y;
}

/* The offsets dropped from segment no, sorted (*n of them); the drop
 * file opened for appending in *dfd.  -1 with why when it cannot be
 * trusted (then neither can the segment: its dropped records would come
 * back). */
static int drops_read(kvd__disk_store_t *s, uint32_t no, uint32_t **out, uint32_t *n, int *dfd,
                      char *path, size_t path_len, char *why, size_t why_len)
{
    size_t len = 0;
    uint8_t *d;
    struct stat st;

    *out = NULL;
    *n = 0;
    seg_path(s, no, "drop", path, path_len);
    if (lstat(path, &st) != 0 && errno == ENOENT) {
        *dfd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        return 0;
    }
    *dfd = open_trusted(path, O_RDWR | O_APPEND, why, why_len);
    if (*dfd < 0)
        return -1;
    d = slurp(*dfd, (s->seg_bytes / KVD_DISK_REC_ALIGN + 1) * 4, &len, why, why_len);
    if (d == NULL) {
        close(*dfd);
        *dfd = -1;
        return -1;
    }
    *n = (uint32_t)(len / 4); /* a torn last entry is left out */
    *out = (uint32_t *)(void *)d;
    if (*n > 1)
        qsort(*out, *n, sizeof(**out), cmp_u32);
    return 0;
}

/* Open one segment found in the directory; its records to found.  A file
 * that cannot be trusted is logged and skipped, and so is a segment whose
 * drop file cannot be. */
static void recover_seg(kvd__disk_store_t *s, uint32_t no, kvd__disk_found_cb found, void *arg)
{
    char path[PATH_MAX], dpath[PATH_MAX], why[400];
    kvd__disk_seg_hdr_t h;
    void *hb = NULL;
    struct stat st;
    found_set_t fs = {0};
    uint32_t *drops = NULL, ndrops = 0, i;
    uint8_t *q;
    size_t skip_hdr = 0;
    uint64_t lost = 0;
    int fd, dfd = -1, rebuilt = 0, unsorted = 0;
    uint8_t **ents;
    seg_t *g;

    seg_path(s, no, "kvd", path, sizeof(path));
    fd = open_trusted(path, O_RDWR | (s->direct ? O_DIRECT : 0), why, sizeof(why));
    if (fd < 0) {
        s->st.skipped_files++;
        kvd_log(KVD_LOG_WARN, "event=disk_file_skipped path=%s reason=\"%s\"", path, why);
        return;
    }
    hb = kvd__disk_alloc_aligned(KVD_DISK_SEG_HDR);
    if (hb == NULL || fstat(fd, &st) != 0 ||
        pread(fd, hb, KVD_DISK_SEG_HDR, 0) != (ssize_t)KVD_DISK_SEG_HDR) {
        snprintf(why, sizeof(why), "shorter than a segment header");
        goto skip;
    }
    memcpy(&h, hb, sizeof(h));
    kvd__disk_free_aligned(hb, KVD_DISK_SEG_HDR);
    hb = NULL;
    if (h.magic != KVD_DISK_SEG_MAGIC || h.version != KVD_DISK_VERSION ||
        h.crc != kvd__disk_crc32c(0, &h, offsetof(kvd__disk_seg_hdr_t, crc)) || h.seg_no != no) {
        snprintf(why, sizeof(why), "not a kvdock segment of this version, or its header is "
                 "damaged");
        goto skip;
    }
    if (h.layout_id != s->cfg.layout_id || h.block_bytes != s->cfg.block_bytes ||
        h.rec_bytes != s->rec_bytes) {
        h.layout[sizeof(h.layout) - 1] = 0;
        snprintf(why, sizeof(why), "another layout (%s; this cache: %s)", h.layout,
                 s->layout_text);
        goto skip;
    }
    if (drops_read(s, no, &drops, &ndrops, &dfd, dpath, sizeof(dpath), why, sizeof(why)) != 0) {
        char w2[sizeof(why)];
        snprintf(w2, sizeof(w2), "its drop file: %.150s", why);
        memcpy(why, w2, sizeof(why));
        goto skip;
    }
    if ((g = seg_new(no)) == NULL || seg_add(s, g) != 0) {
        free(g);
        snprintf(why, sizeof(why), "out of memory");
        goto skip;
    }
    g->fd = fd;
    g->dropfd = dfd;
    g->state = SEG_OPEN;
    g->sealed = 1;
    g->file_bytes = (uint64_t)st.st_blocks * 512;
    s->st.file_bytes += g->file_bytes;
    if (idx_read(s, g, (uint64_t)st.st_size, &fs, &lost, why, sizeof(why)) == 0) {
        skip_hdr = sizeof(kvd__disk_idx_hdr_t);
        g->idx_done = 1;
        if (lost > 0)
            kvd_log(KVD_LOG_WARN,
                    "event=disk_segment_truncated path=%s lost_records=%" PRIu64
                    " effect=\"the rest served\"",
                    path, lost);
    } else {
        char ipath[PATH_MAX];
        struct stat ist;
        seg_path(s, no, "idx", ipath, sizeof(ipath));
        if (lstat(ipath, &ist) == 0)
            kvd_log(KVD_LOG_WARN,
                    "event=disk_index_bad path=%s reason=\"%s\" effect=\"segment read whole\"",
                    ipath, why);
        lost = 0;
        if (seg_scan(s, g, fd, (uint64_t)st.st_size, &fs, &lost) != 0) {
            kvd_log(KVD_LOG_ERROR, "event=disk_file_skipped path=%s reason=\"out of memory\"",
                    path);
            s->st.skipped_files++;
            free(drops);
            return; /* an empty sealed segment: goes at the end of open */
        }
        rebuilt = 1;
        s->st.rebuilt_indexes++;
        if (lost > 0)
            kvd_log(KVD_LOG_WARN,
                    "event=disk_records_torn path=%s lost_records=%" PRIu64
                    " effect=\"skipped, the rest served\"",
                    path, lost);
    }
    s->st.lost_records += lost;
    g->tail = fs.data_end;
    /* every record not dropped, oldest first: in order of offset (an
     * index lists them as their batches completed, which the thread pool
     * does out of order) */
    ents = malloc((fs.count ? fs.count : 1) * sizeof(*ents));
    if (ents == NULL) {
        kvd_log(KVD_LOG_ERROR, "event=disk_file_skipped path=%s reason=\"out of memory\"", path);
        s->st.skipped_files++;
        free(fs.body);
        free(drops);
        return;
    }
    q = fs.body + skip_hdr;
    for (i = 0; i < fs.count; i++) {
        kvd__disk_idx_ent_t e;
        memcpy(&e, q, sizeof(e));
        ents[i] = q;
        if (i > 0 && ent_off(ents[i - 1]) > e.off)
            unsorted = 1;
        q += sizeof(e) + e.klen + e.plen;
    }
    if (unsorted)
        qsort(ents, fs.count, sizeof(*ents), cmp_ent);
    for (i = 0; i < fs.count; i++) {
        kvd__disk_idx_ent_t e;
        kvd__disk_found_t f;
        q = ents[i];
        memcpy(&e, q, sizeof(e));
        f.key = q + sizeof(e);
        f.parent = e.plen ? q + sizeof(e) + e.klen : NULL;
        f.klen = e.klen;
        f.plen = e.plen;
        f.seq = e.seq;
        f.loc = KVD_DISK_LOC(no, e.off);
        if (ALIGN_UP(e.off + s->rec_bytes, KVD_DISK_ALIGN) > (uint64_t)st.st_size)
            continue; /* past a truncated end (counted above) */
        if (ndrops && bsearch(&e.off, drops, ndrops, sizeof(*drops), cmp_u32))
            continue;
        if (e.seq >= s->seq)
            s->seq = e.seq + 1;
        g->live++;
        s->st.records++;
        s->st.live_bytes += s->rec_bytes;
        if (found != NULL && !found(arg, &f)) {
            /* the caller does not want it: dropped as any other */
            kvd__disk_drop(s, f.loc);
            s->st.drops--;
        }
    }
    /* an index rebuilt is kept for the next start */
    if (rebuilt && g->live > 0) {
        char ipath[PATH_MAX], tpath[PATH_MAX];
        seg_path(s, no, "idx", ipath, sizeof(ipath));
        seg_path(s, no, "idx.tmp", tpath, sizeof(tpath));
        if (idx_write(ipath, tpath, no, s->cfg.layout_id, s->rec_bytes, fs.data_end, fs.body,
                      fs.len, fs.count) == 0)
            g->idx_done = 1;
    }
    free(ents);
    free(fs.body);
    free(drops);
    return;
skip:
    kvd__disk_free_aligned(hb, KVD_DISK_SEG_HDR);
    close(fd);
    if (dfd >= 0)
        close(dfd);
    free(drops);
    s->st.skipped_files++;
    kvd_log(KVD_LOG_WARN, "event=disk_file_skipped path=%s reason=\"%s\"", path, why);
}

/* ---- open and close ------------------------------------------------------------------------ */

kvd_status_t kvd__disk_store_open(kvd__disk_store_t **out, const kvd__disk_store_config_t *cfg,
                                  kvd__disk_io_t *io, kvd__disk_found_cb found, void *arg,
                                  char *why, size_t why_len)
{
    kvd__disk_store_t *s;
    struct stat st;
    DIR *d;
    struct dirent *de;
    uint32_t *nos = NULL, n = 0, cap = 0, i, no;
    char tail[8];
    int dfd;

    *out = NULL;
    if (cfg->block_bytes < 1 || cfg->block_bytes > (1ull << 30)) {
        snprintf(why, why_len, "a block of %" PRIu64 " bytes cannot go to disk (1 B to 1 GiB)",
                 cfg->block_bytes);
        return KVD_EINVAL;
    }
    dfd = open(cfg->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0 || fstat(dfd, &st) != 0) {
        snprintf(why, why_len, "cannot open the directory %s: %s", cfg->dir, strerror(errno));
        if (dfd >= 0)
            close(dfd);
        return KVD_EINVAL;
    }
    close(dfd);
    if (st.st_uid != geteuid()) {
        snprintf(why, why_len, "%s belongs to uid %u, not the daemon's %u", cfg->dir,
                 (unsigned)st.st_uid, (unsigned)geteuid());
        return KVD_EPERM;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(why, why_len, "%s is writable by others (mode %04o)", cfg->dir,
                 (unsigned)st.st_mode & 07777);
        return KVD_EPERM;
    }
    if ((s = calloc(1, sizeof(*s))) == NULL) {
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    s->cfg = *cfg;
    s->io = io;
    s->dir = strdup(cfg->dir);
    s->layout_text = strdup(cfg->layout_text ? cfg->layout_text : "");
    s->rec_bytes = ALIGN_UP(KVD_DISK_REC_HDR + cfg->block_bytes, KVD_DISK_REC_ALIGN);
    s->seg_bytes = ALIGN_UP(cfg->segment_bytes ? cfg->segment_bytes : SEG_DEFAULT, KVD_DISK_ALIGN);
    if (s->seg_bytes < KVD_DISK_SEG_HDR + 4 * ALIGN_UP(s->rec_bytes, KVD_DISK_ALIGN))
        s->seg_bytes = KVD_DISK_SEG_HDR + 4 * ALIGN_UP(s->rec_bytes, KVD_DISK_ALIGN);
    if (s->seg_bytes > (4ull << 30) - KVD_DISK_ALIGN)
        s->seg_bytes = (4ull << 30) - KVD_DISK_ALIGN;
    s->batch_bytes = cfg->write_bytes ? cfg->write_bytes : WRITE_DEFAULT;
    s->batch_bytes = (uint32_t)ALIGN_UP(s->batch_bytes, KVD_DISK_ALIGN);
    if (s->batch_bytes < ALIGN_UP(s->rec_bytes, KVD_DISK_ALIGN))
        s->batch_bytes = (uint32_t)ALIGN_UP(s->rec_bytes, KVD_DISK_ALIGN);
    if (s->cfg.max_writes == 0)
        s->cfg.max_writes = WRITES_DEFAULT;
    s->rbuf_bytes = ALIGN_UP(s->rec_bytes, KVD_DISK_ALIGN) + KVD_DISK_ALIGN;
    s->reads_max = 2 * kvd__disk_io_depth(io);
    if (s->reads_max < READS_MIN)
        s->reads_max = READS_MIN;
    s->wbufs = calloc(s->cfg.max_writes, sizeof(*s->wbufs));
    s->rbufs = calloc(s->reads_max, sizeof(*s->rbufs));
    s->direct = !cfg->buffered;
    s->st.direct = s->direct;
    s->next_no = 1;
    if (s->dir == NULL || s->layout_text == NULL || s->wbufs == NULL || s->rbufs == NULL) {
        kvd__disk_store_close(&s);
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    /* the segments there, in order of number (= of age) */
    if ((d = opendir(cfg->dir)) == NULL) {
        snprintf(why, why_len, "cannot read the directory %s: %s", cfg->dir, strerror(errno));
        kvd__disk_store_close(&s);
        return KVD_EIO;
    }
    while ((de = readdir(d)) != NULL) {
        if (sscanf(de->d_name, "seg-%8u.%7s", &no, tail) != 2 || strlen(de->d_name) != 16 ||
            strcmp(tail, "kvd") != 0 || no == 0)
            continue;
        if (n == cap) {
            uint32_t *p = realloc(nos, (cap = cap ? cap * 2 : 64) * sizeof(*p));
            if (p == NULL) {
                closedir(d);
                free(nos);
                kvd__disk_store_close(&s);
                snprintf(why, why_len, "out of memory");
                return KVD_ENOMEM;
            }
            nos = p;
        }
        nos[n++] = no;
    }
    closedir(d);
    if (n > 1)
        qsort(nos, n, sizeof(*nos), cmp_u32);
    for (i = 0; i < n; i++) {
        recover_seg(s, nos[i], found, arg);
        if (nos[i] >= s->next_no)
            s->next_no = nos[i] + 1;
    }
    free(nos);
    /* segments left with no record go */
    for (i = 0; i < s->nsegs; i++)
        seg_maybe_finish(s, s->segs[i]);
    while (s->jobs > 0)
        kvd__disk_io_wait(s->io, -1);
    *out = s;
    return KVD_OK;
}

void kvd__disk_store_close(kvd__disk_store_t **sp)
{
    kvd__disk_store_t *s = *sp;
    uint32_t i;

    if (s == NULL)
        return;
    *sp = NULL;
    batch_close(s);
    while (s->jobs > 0 || s->queued_head != NULL)
        kvd__disk_io_wait(s->io, -1);
    /* seal the open segment and the one made ahead: indexed, or gone when
     * empty */
    if (s->cur) {
        s->cur->sealed = 1;
        s->cur = NULL;
    }
    if (s->spare) {
        s->spare->sealed = 1;
        s->spare = NULL;
    }
    for (i = 0; i < s->nsegs; i++)
        seg_maybe_finish(s, s->segs[i]);
    while (s->jobs > 0)
        kvd__disk_io_wait(s->io, -1);
    while (s->nsegs > 0)
        seg_remove(s, s->segs[s->nsegs - 1]);
    for (i = 0; i < s->nwbufs; i++)
        kvd__disk_free_aligned(s->wbufs[i], s->batch_bytes);
    for (i = 0; i < s->nrbufs; i++)
        kvd__disk_free_aligned(s->rbufs[i], s->rbuf_bytes);
    free(s->wbufs);
    free(s->rbufs);
    free(s->segs);
    free(s->dir);
    free(s->layout_text);
    free(s);
}

int kvd__disk_probe_direct(const char *dir, char *why, size_t why_len)
{
    char path[PATH_MAX];
    int fd;

    snprintf(path, sizeof(path), "%s/.direct-probe.%d", dir, (int)getpid());
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT | O_NOFOLLOW, 0600);
    if (fd >= 0) {
        close(fd);
        unlink(path);
        return 1;
    }
    snprintf(why, why_len, "O_DIRECT refused by the file system of %s (%s)", dir,
             strerror(errno));
    return 0;
}

void kvd__disk_store_stats(const kvd__disk_store_t *s, kvd__disk_store_stats_t *out)
{
    *out = s->st;
}

uint64_t kvd__disk_store_rec_bytes(const kvd__disk_store_t *s)
{
    return s->rec_bytes;
}
