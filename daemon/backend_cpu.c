/*
 * The cpu backend: host pools as sealed memfds and the reference kernels,
 * run on one worker thread per stream class so that the operations of one
 * class complete in order.  Completions go back to the loop through a
 * mutex-protected queue and a uv_async_t.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"

typedef struct cpu_queue {
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kvd__job_t *head, *tail;
    int stop;
    unsigned cancels; /* bumped by cancel_pending: the worker drops what it took */
    struct cpu_backend *owner;
} cpu_queue_t;

typedef struct cpu_backend {
    kvd__backend_t be;
    uv_async_t async;
    kvd__done_list_t done;
    cpu_queue_t q[KVD_STREAM_END];
    uint32_t pending; /* loop thread only */
    void (*destroy_cb)(void *arg);
    void *destroy_arg;
} cpu_backend_t;

static void push_done(cpu_backend_t *cb, kvd__job_t *job)
{
    kvd__done_push(&cb->done, job);
    uv_async_send(&cb->async);
}

static void cancel_job(kvd__job_t *job)
{
    job->status = KVD_ESHUTDOWN;
    snprintf(job->detail, sizeof(job->detail), "cancelled before it started");
}

static void run_job(kvd__job_t *job)
{
    unsigned long long oob = 0;
    kvd_status_t st = kvd__job_run(job, 0, &oob, NULL);

    job->status = st;
    job->skipped_oob = oob;
    if (st != KVD_OK)
        snprintf(job->detail, sizeof(job->detail), "%s", kvd_last_error_detail());
    else if (job->layer_flag != NULL) /* the bytes are in: say so, after them */
        __atomic_store_n(job->layer_flag, job->flag_value, __ATOMIC_RELEASE);
}

static void *worker_main(void *arg)
{
    cpu_queue_t *q = arg;

    for (;;) {
        kvd__job_t *job, *next;
        unsigned cancels;

        /* the whole queue at once: one lock for a burst of small jobs */
        pthread_mutex_lock(&q->mu);
        while (q->head == NULL && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        job = q->head;
        q->head = q->tail = NULL;
        cancels = q->cancels;
        pthread_mutex_unlock(&q->mu);
        if (job == NULL)
            break;
        for (; job; job = next) {
            next = job->next;
            if (__atomic_load_n(&q->cancels, __ATOMIC_RELAXED) != cancels)
                cancel_job(job);
            else
                run_job(job);
            push_done(q->owner, job);
        }
    }
    return NULL;
}

static void async_cb(uv_async_t *h)
{
    cpu_backend_t *cb = h->data;
    kvd__job_t *list, *next, *issued;

    list = kvd__done_take(&cb->done, &issued);
    (void)issued; /* the cpu backend issues nothing later */
    for (; list; list = next) {
        next = list->next;
        cb->pending--;
        list->done(list);
    }
}

/* Host memory of a new memfd (fd < 0, named label), or a client's memfd
 * fd mapped here (the descriptor stays the caller's). */
static kvd_status_t host_mem(int fd, const char *label, uint64_t bytes, kvd__mem_t **out, char *why,
                             size_t why_len)
{
    kvd__mem_t *m = calloc(1, sizeof(*m));
    kvd_status_t st;

    if (m == NULL)
        return KVD_ENOMEM;
    m->fd = -1;
    st = fd < 0 ? kvd__memfd_create(label, bytes, &m->fd, &m->ptr, &m->map_bytes, why, why_len)
                : kvd__memfd_map(fd, bytes, &m->ptr, &m->map_bytes, why, why_len);
    if (st != KVD_OK) {
        free(m);
        return st;
    }
    m->kind = KVD_MEM_HOST;
    m->bytes = bytes;
    *out = m;
    return KVD_OK;
}

static kvd_status_t cpu_mem_create(kvd__backend_t *be, int kind, uint64_t bytes, const char *label,
                                   kvd__mem_t **out, char *why, size_t why_len)
{
    if (kind != KVD_MEM_HOST) {
        snprintf(why, why_len, "the cpu backend has host memory only");
        return KVD_ENOTSUP;
    }
    return host_mem(-1, label, bytes, out, why, why_len);
}

static kvd_status_t cpu_mem_import(kvd__backend_t *be, int kind, const unsigned char *ipc,
                                   size_t ipc_len, int fd, uint64_t bytes, kvd__mem_t **out,
                                   char *why, size_t why_len)
{
    if (kind != KVD_MEM_HOST) {
        snprintf(why, why_len, "the cpu backend imports host memory (memfd) only");
        return KVD_ENOTSUP;
    }
    return host_mem(fd, NULL, bytes, out, why, why_len);
}

static void cpu_mem_destroy(kvd__backend_t *be, kvd__mem_t **mp)
{
    kvd__mem_t *m = mp ? *mp : NULL;

    if (m == NULL)
        return;
    if (m->ptr)
        munmap(m->ptr, m->map_bytes);
    if (m->fd >= 0)
        close(m->fd);
    free(m);
    *mp = NULL;
}

static kvd_status_t cpu_table_create(kvd__backend_t *be, const uint64_t *vals, size_t n,
                                     void **out)
{
    uint64_t *t = malloc(n ? n * sizeof(*t) : 1);

    if (t == NULL)
        return KVD_ENOMEM;
    if (n)
        memcpy(t, vals, n * sizeof(*t));
    *out = t;
    return KVD_OK;
}

static void cpu_table_destroy(kvd__backend_t *be, void *t)
{
    free(t);
}

static kvd_status_t cpu_staging_alloc(kvd__backend_t *be, size_t bytes, void **out, char *why,
                                      size_t why_len)
{
    kvd_status_t st = kvd__hostmem_reserve(be->hostmem, KVD_HM_STAGING, bytes, why, why_len);

    if (st != KVD_OK)
        return st;
    *out = malloc(bytes ? bytes : 1);
    if (*out == NULL) {
        kvd__hostmem_release(be->hostmem, KVD_HM_STAGING, bytes);
        snprintf(why, why_len, "out of memory");
        return KVD_ENOMEM;
    }
    return KVD_OK;
}

static void cpu_staging_free(kvd__backend_t *be, void *p, size_t bytes)
{
    if (p == NULL)
        return;
    kvd__hostmem_release(be->hostmem, KVD_HM_STAGING, bytes);
    free(p);
}

static kvd_status_t cpu_event_open(kvd__backend_t *be, const unsigned char *h, size_t len,
                                   void **ev, char *why, size_t why_len)
{
    snprintf(why, why_len, "interprocess events need the cuda backend");
    return KVD_ENOTSUP;
}

static void cpu_event_close(kvd__backend_t *be, void *ev)
{
}

static kvd_status_t cpu_submit(kvd__backend_t *be, kvd__job_t *job)
{
    cpu_backend_t *cb = (cpu_backend_t *)be;
    cpu_queue_t *q;

    if (job->sclass < KVD_STREAM_FIRST || job->sclass >= KVD_STREAM_END)
        return KVD_EINVAL;
    /* one worker per class runs a request's jobs in order: after holds */
    if (job->wait_event || job->record_event || job->layer_event)
        return KVD_ENOTSUP;
    q = &cb->q[job->sclass];
    job->status = KVD_OK;
    job->skipped_oob = 0;
    job->detail[0] = '\0';
    pthread_mutex_lock(&q->mu);
    kvd__jobs_append(&q->head, &q->tail, job);
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    cb->pending++;
    return KVD_OK;
}

static void cpu_cancel_pending(kvd__backend_t *be)
{
    cpu_backend_t *cb = (cpu_backend_t *)be;
    int i;

    for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++) {
        kvd__job_t *list, *next;

        pthread_mutex_lock(&cb->q[i].mu);
        list = cb->q[i].head;
        cb->q[i].head = cb->q[i].tail = NULL;
        __atomic_store_n(&cb->q[i].cancels, cb->q[i].cancels + 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&cb->q[i].mu);
        for (; list; list = next) {
            next = list->next;
            cancel_job(list);
            push_done(cb, list);
        }
    }
}

static uint32_t cpu_pending(kvd__backend_t *be)
{
    return ((cpu_backend_t *)be)->pending;
}

static void stop_workers(cpu_backend_t *cb)
{
    int i;

    for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++) {
        cpu_queue_t *q = &cb->q[i];
        if (!q->started)
            continue;
        pthread_mutex_lock(&q->mu);
        q->stop = 1;
        pthread_cond_signal(&q->cv);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->thread, NULL);
        q->started = 0;
    }
}

static void free_backend(cpu_backend_t *cb)
{
    int i;

    for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++) {
        pthread_mutex_destroy(&cb->q[i].mu);
        pthread_cond_destroy(&cb->q[i].cv);
    }
    kvd__done_destroy(&cb->done);
    free(cb);
}

static void async_closed_cb(uv_handle_t *h)
{
    cpu_backend_t *cb = h->data;
    void (*fn)(void *) = cb->destroy_cb;
    void *arg = cb->destroy_arg;

    free_backend(cb);
    if (fn)
        fn(arg);
}

static void cpu_destroy(kvd__backend_t *be, void (*fn)(void *arg), void *arg)
{
    cpu_backend_t *cb = (cpu_backend_t *)be;

    stop_workers(cb);
    cb->destroy_cb = fn;
    cb->destroy_arg = arg;
    uv_close((uv_handle_t *)&cb->async, async_closed_cb);
}

kvd_status_t kvd__backend_cpu_create(uv_loop_t *loop, const kvd__options_t *opts,
                                     kvd__backend_t **out, char *why, size_t why_len)
{
    cpu_backend_t *cb = calloc(1, sizeof(*cb));
    int i;

    if (cb == NULL)
        return KVD_ENOMEM;
    cb->be.name = "cpu";
    cb->be.proto_backend = 1; /* BACKEND_CPU */
    snprintf(cb->be.device_name, sizeof(cb->be.device_name), "cpu");
    cb->be.device_ordinal = -1;
    for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++) {
        cb->be.priority[i] = (int)opts->priority[i];
        cb->be.blocks[i] = (uint32_t)opts->blocks[i];
    }
    cb->be.mem_create = cpu_mem_create;
    cb->be.mem_import = cpu_mem_import;
    cb->be.mem_destroy = cpu_mem_destroy;
    cb->be.table_create = cpu_table_create;
    cb->be.table_destroy = cpu_table_destroy;
    cb->be.staging_alloc = cpu_staging_alloc;
    cb->be.staging_free = cpu_staging_free;
    cb->be.event_open = cpu_event_open;
    cb->be.event_close = cpu_event_close;
    cb->be.submit = cpu_submit;
    cb->be.cancel_pending = cpu_cancel_pending;
    cb->be.pending = cpu_pending;
    cb->be.destroy = cpu_destroy;
    kvd__done_init(&cb->done);
    for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++) {
        pthread_mutex_init(&cb->q[i].mu, NULL);
        pthread_cond_init(&cb->q[i].cv, NULL);
        cb->q[i].owner = cb;
    }
    if (uv_async_init(loop, &cb->async, async_cb) != 0) {
        snprintf(why, why_len, "uv_async_init failed");
        free_backend(cb);
        return KVD_EINTERNAL;
    }
    cb->async.data = cb;
    for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++) {
        if (pthread_create(&cb->q[i].thread, NULL, worker_main, &cb->q[i]) != 0) {
            snprintf(why, why_len, "cannot start worker threads");
            stop_workers(cb);
            cb->destroy_cb = NULL;
            uv_close((uv_handle_t *)&cb->async, async_closed_cb);
            return KVD_ENOMEM;
        }
        cb->q[i].started = 1;
    }
    *out = &cb->be;
    return KVD_OK;
}
