/*
 * A data operation in flight: what the handlers of ops_data.c and
 * ops_cache.c share.  A handler validates every field first (ids and
 * ownership, byte ranges, index values, shapes), holding a reference on
 * every object it names and staging inline operands where the kernels can
 * read them; then it submits one job, or several that run in order (a
 * cache load's layer groups, its slabs).  The reply goes out when every
 * job has completed (or at enqueue, if asked); a finish hook may act on
 * the outcome first; the references go after that.
 */
#ifndef KVD_DAEMON_DATAOP_H
#define KVD_DAEMON_DATAOP_H

#include "dispatch.h"

/* the operands, and a cache load's layer events (at most 128) */
#define KVD_DATAOP_MAX_REFS (8 + 128)
#define KVD_DATAOP_MAX_STAGING 8

typedef struct kvd__dataop kvd__dataop_t;

struct kvd__dataop {
    kvd__job_t job;     /* the first job */
    kvd__job_t *more;   /* the others (njobs - 1), each after the one before */
    uint32_t njobs;
    uint32_t pending;  /* jobs submitted and not yet done */
    kvd_status_t status; /* the first failure of its jobs */
    char detail[160];
    unsigned long long skipped_oob; /* summed over the jobs */
    kvd__origin_t origin; /* the reply's (held 0) */
    int reply_at_enqueue;
    int replied;
    uint32_t to_issue;   /* jobs whose work another thread has yet to enqueue */
    kvd__obj_t *refs[KVD_DATAOP_MAX_REFS];
    int nrefs;
    void *staging[KVD_DATAOP_MAX_STAGING];
    size_t staging_bytes[KVD_DATAOP_MAX_STAGING];
    int nstaging;
    uint64_t rows;       /* rows the request covers */
    uint64_t rows_valid; /* rows not known to be padding */
    uint64_t row_bytes;  /* bytes written per row */
    kvd_status_t stage_status; /* why the last kvd__stage failed */
    int path;            /* kvd_copy_path_t: asked for, then the one run */
    /* Run on the loop thread once every job is done (st: their outcome),
     * before the reply; it may fill the reply's cache fields and set
     * *bytes (the bytes moved; by default the rows' bytes).  Also run,
     * with the failure, when the operation fails before anything ran. */
    void (*finish)(kvd__dataop_t *d, kvd_status_t st, Kvdock__OpReply *op, uint64_t *bytes);
    void *ext; /* the hook's */
    int submitted;       /* kvd__dataop_submit took it: freed when its jobs are done */
    /* Set for a part the daemon runs on its own (a load plan's copy of
     * blocks that landed early, cache_load.h): no reply goes out; this
     * hears how it ended instead. */
    void (*silent_done)(void *arg, kvd_status_t st);
    void *silent_arg;
};

/* An index operand resolved to memory the kernels read. */
typedef struct kvd__idx {
    const void *ptr;
    int32_t dtype;
    int64_t count;
    int64_t valid; /* not negative (inline: counted; buffer: assumed) */
    int on_device; /* in a device buffer: not readable by the host */
    int staged;    /* inline: the daemon's own copy */
} kvd__idx_t;

/*
 * Run fn on a new dataop for r: fn validates and ends with kvd__submit.
 * If fn fails, or submits nothing (a load plan submits dataops of its
 * own), nothing of this dataop was launched: the finish hook (if fn set
 * one) runs with the status and the dataop is freed.
 */
kvd_status_t kvd__dataop_run(kvd__req_t *r, kvd_status_t (*fn)(kvd__req_t *, kvd__dataop_t *));

/* A dataop outside any handler, for work decided earlier and submitted
 * now (a load plan's copies, cache_load.h): its reply goes to o's request
 * (o's held is not this dataop's).  NULL out of memory.  One never
 * submitted goes with kvd__dataop_free. */
kvd__dataop_t *kvd__dataop_new(const kvd__origin_t *o);
void kvd__dataop_free(kvd__dataop_t *d);

/* Jobs beyond the first: d->more[0..n-2], cleared (KVD_ENOMEM if none). */
kvd_status_t kvd__dataop_jobs(kvd__req_t *r, kvd__dataop_t *d, uint32_t n);
kvd_status_t kvd__dataop_more(kvd__dataop_t *d, uint32_t n); /* the same, outside a handler */
/* Job i of d (0: d->job). */
kvd__job_t *kvd__dataop_job(kvd__dataop_t *d, uint32_t i);

/* Hold a reference on o until d is freed (at most KVD_DATAOP_MAX_REFS). */
void kvd__hold(kvd__dataop_t *d, kvd__obj_t *o);

/* What a request's later copies take from its first dataop, kept by a plan
 * that outlives it (a streaming save, a load plan): the objects it
 * references and its Sync (stream class, path, launch settings, events). */
typedef struct kvd__dataop_sync {
    kvd__obj_t *refs[KVD_DATAOP_MAX_REFS]; /* referenced while kept */
    int nrefs;
    int sclass, path, reply_at_enqueue;
    uint32_t launch_flags, max_blocks;
    void *wait_event, *record_event;
} kvd__dataop_sync_t;

/* Keep d's objects (referenced) and Sync in k. */
void kvd__dataop_sync_keep(kvd__dataop_sync_t *k, const kvd__dataop_t *d);
/* Give d, a later copy of the request, k's objects (held) and Sync; the
 * record event and reply_at_enqueue are the last copy's, set by the
 * caller. */
void kvd__dataop_sync_apply(const kvd__dataop_sync_t *k, kvd__dataop_t *d);
/* Let go of k's objects. */
void kvd__dataop_sync_release(kvd__dataop_sync_t *k, kvd__registry_t *reg);
/* A staging copy of n bytes from src (NULL: left uninitialised), freed with
 * d; NULL when refused, r's message set and the status in d->stage_status. */
void *kvd__stage(kvd__req_t *r, kvd__dataop_t *d, const void *src, size_t n);
/* The same outside a handler: the message in why. */
void *kvd__dataop_stage(kvd__dataop_t *d, const void *src, size_t n, char *why, size_t why_len);

/* The operands: a pool the client may use (held), a buffer range, an index
 * array checked against bound (< 0: no bound), operand bytes, an event. */
kvd_status_t kvd__get_pool(kvd__req_t *r, kvd__dataop_t *d, uint64_t id, const char *what,
                           kvd__pool_t **out);
kvd_status_t kvd__get_bufref(kvd__req_t *r, kvd__dataop_t *d, const Kvdock__BufRef *b,
                             uint64_t need, uint64_t align, const char *what, void **ptr,
                             int *on_device);
kvd_status_t kvd__get_indices(kvd__req_t *r, kvd__dataop_t *d, const Kvdock__Indices *ix,
                              int64_t bound, const char *what, kvd__idx_t *out);
/* An inline I32 index array as I64, in a new staging copy. */
kvd_status_t kvd__widen(kvd__req_t *r, kvd__dataop_t *d, kvd__idx_t *x);
kvd_status_t kvd__get_data(kvd__req_t *r, kvd__dataop_t *d, const Kvdock__Data *dd, uint64_t need,
                           uint64_t most, uint64_t align, const char *what, const void **ptr);
kvd_status_t kvd__get_event(kvd__req_t *r, kvd__dataop_t *d, uint64_t id, const char *what,
                            void **ev);

/* The request's Sync: stream class (sclass unless it names one), events,
 * budget, reply at enqueue, and the path asked for (is_transfer: may ask
 * for the copy engines). */
kvd_status_t kvd__get_sync(kvd__req_t *r, kvd__dataop_t *d, int sclass, int is_transfer);
/* After get_sync: the path of a transfer between memory of src_kind and
 * dst_kind, into d->path and the job flags. */
kvd_status_t kvd__choose_path(kvd__req_t *r, kvd__dataop_t *d, int src_kind, int dst_kind,
                              int indices_on_device, int buffer_indices);

/* Submit the validated jobs in order, each after the one before; on error
 * nothing was submitted and the caller still owns d.  kvd__submit marks
 * r deferred; kvd__dataop_submit is the same outside a handler (the
 * message in why). */
kvd_status_t kvd__submit(kvd__req_t *r, kvd__dataop_t *d);
kvd_status_t kvd__dataop_submit(kvd__dataop_t *d, char *why, size_t why_len);

/* Where a pool's layer l starts (K, or V: NULL for MLA). */
char *kvd__layer_k(const kvd__pool_t *p, uint32_t l);
char *kvd__layer_v(const kvd__pool_t *p, uint32_t l);
/* A transfer side over pool p's layers from begin: the copy engines read
 * an imported pool's layer addresses from host arrays, kernels from the
 * device tables. */
void kvd__fill_side(const kvd__pool_t *p, uint32_t begin, int copy_engine, kvd_kv_side_t *s);

/* (n - 1) * stride + last, or 0 for n == 0; -1 on overflow. */
int kvd__rows_extent(uint64_t n, uint64_t stride, uint64_t last, uint64_t *out);

#endif
