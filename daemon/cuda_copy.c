/*
 * Copy-engine transfers of the cuda backend, issued by worker threads.
 *
 * Handing a copy to the copy engines (cudaMemcpyBatchAsync) costs the
 * calling thread CPU time per descriptor, and the call blocks
 * once its stream holds enough queued work: a stream waiting on a
 * client's event would block whoever calls it.  So the loop thread never
 * issues copy-engine work.  Each stream class has --copy-threads workers,
 * each with a stream of its own at the class's priority; a transfer with
 * copies enough is split by rows into a part per worker (issuing threads
 * raise the rate of descriptors for small runs, up to a few:
 * --copy-threads), every part waits on the request's wait event, and the
 * worker that issues the last part joins the others through their events,
 * records the request's record event and the job's end, and hands the job
 * to its completion thread, which waits for that end and hands the job
 * back to the loop.
 *
 * The completion thread waits on the event off the stream: a host
 * function on the stream (cudaLaunchHostFunc) would hold the stream's
 * next copies until the CUDA callback thread had run it.  A worker's jobs
 * end in its stream's order, so its completion thread takes them in turn.
 *
 * A part is issued in slices of at most GATE_DESCRIPTORS copies, each
 * behind a gate: the stream first waits for a word in pinned host memory
 * (cuStreamWaitValue32), and the worker opens it once the slice is
 * issued.  Handing copies to a stream the GPU has drained costs the
 * issuing thread several times more per copy than handing them to one
 * with work queued (the driver submits each to the idle engine at once),
 * and a worker alone on an idle GPU keeps its stream drained: the engines
 * finish each small copy before the next is handed over.  Behind the
 * gate the slice queues whole, and the slice after it is issued while the
 * engines move this one.  Slices bound what waits behind a gate well
 * under what a stream holds before issuing blocks, which behind a closed
 * gate would never end.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "log.h"

/* Copies (runs x layers x K and V) a part takes at least: a transfer
 * with fewer is not split over the workers. */
#define MIN_PART_COPIES 1024
/* Copies (runs x layers x K and V) a gated slice holds at most. */
#define GATE_DESCRIPTORS 4096

typedef struct ce_group ce_group_t;

typedef struct ce_part {
    ce_group_t *g;
    kvd_transfer_args_t a; /* its rows */
    unsigned long long oob;
    cudaEvent_t done;      /* recorded after its copies */
    int recorded;
    struct ce_part *next;
} ce_part_t;

struct ce_group {
    cuda_backend_t *cb;
    kvd__job_t *job;
    uint32_t flags;       /* of its launches: the copy engines, maybe one call a run */
    int nparts;
    int to_issue; /* atomic: parts not yet issued */
    cudaEvent_t end;      /* recorded after every part (for the job after it) */
    cudaEvent_t wait_end; /* the end of the job before it, or NULL */
    int issued;           /* every part issued, end recorded (under cb->ce_mu) */
    struct ce_group *next; /* the job after it, held back until this one is issued */
    struct ce_group *reap_next; /* in its completion thread's queue */
    kvd_status_t status; /* the first error (under cb->ce_mu) */
    char detail[sizeof(((kvd__job_t *)0)->detail)];
    ce_part_t parts[];
};

typedef struct ce_worker {
    cuda_backend_t *cb;
    pthread_t th;
    int started;
    int stop;
    cudaStream_t stream;
    pthread_cond_t cv;
    ce_part_t *head, *tail; /* under cb->ce_mu */
    /* its completion thread: the groups whose end it recorded, in order */
    pthread_t reaper;
    int reaper_started;
    pthread_cond_t reap_cv;
    ce_group_t *reap_head, *reap_tail; /* under cb->ce_mu */
    int reap_stop;                     /* its worker has ended (under cb->ce_mu) */
    /* its stream's gate: pinned, device-mapped; slice n waits for >= n
     * (NULL: slices are not gated) */
    uint32_t *gate;
    CUdeviceptr gate_dev;
    uint32_t gate_seq;
    int gate_off; /* the driver refused a wait on it: no more slices */
} ce_worker_t;

/* An event for a part, from the free list that group_done refills (it may
 * not call CUDA, so it cannot destroy them). */
static cudaEvent_t event_get(cuda_backend_t *cb)
{
    cudaEvent_t ev = NULL;

    pthread_mutex_lock(&cb->ce_mu);
    if (cb->ce_nevents > 0)
        ev = cb->ce_events[--cb->ce_nevents];
    pthread_mutex_unlock(&cb->ce_mu);
    /* blocking: the completion thread sleeps in cudaEventSynchronize */
    if (ev == NULL && cudaEventCreateWithFlags(&ev, cudaEventDisableTiming |
                                                        cudaEventBlockingSync) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return ev;
}

/* Under cb->ce_mu. */
static void event_put(cuda_backend_t *cb, cudaEvent_t ev)
{
    if (cb->ce_nevents == cb->ce_cap) {
        uint32_t cap = cb->ce_cap ? 2 * cb->ce_cap : 64;
        cudaEvent_t *n = realloc(cb->ce_events, cap * sizeof(*n));
        if (n == NULL)
            return; /* leaks one event handle rather than fail the job */
        cb->ce_events = n;
        cb->ce_cap = cap;
    }
    cb->ce_events[cb->ce_nevents++] = ev;
}

static void group_fail(ce_group_t *g, kvd_status_t st, const char *detail)
{
    pthread_mutex_lock(&g->cb->ce_mu);
    if (g->status == KVD_OK) {
        g->status = st;
        snprintf(g->detail, sizeof(g->detail), "%s", detail);
    }
    pthread_mutex_unlock(&g->cb->ce_mu);
}

/* On the completion thread once the job's end is reached. */
static void group_done(ce_group_t *g)
{
    cuda_backend_t *cb = g->cb;
    kvd__job_t *job = g->job;
    unsigned long long oob = 0;
    int i;

    pthread_mutex_lock(&cb->ce_mu);
    for (i = 0; i < g->nparts; i++) {
        oob += g->parts[i].oob;
        event_put(cb, g->parts[i].done);
    }
    /* a job after it that has not waited yet waits on an event given back
     * here: at worst on later work, never too little */
    event_put(cb, g->end);
    job->ce_group = NULL;
    pthread_mutex_unlock(&cb->ce_mu);
    *job->oob = oob; /* the job's pinned counter: read by finish_job */
    if (g->status != KVD_OK) {
        job->status = g->status;
        snprintf(job->detail, sizeof(job->detail), "%s", g->detail);
    }
    free(g);
    kvd__cuda_push_done(cb, job);
}

/* Queue g's parts on its class's workers (under cb->ce_mu). */
static void dispatch(cuda_backend_t *cb, ce_group_t *g)
{
    int sc = g->job->sclass, first = cb->ce_next[sc], i;
    ce_worker_t *ws = cb->ce[sc];

    /* spread over the workers, starting where the last job stopped */
    cb->ce_next[sc] = (first + g->nparts) % cb->ce_n[sc];
    for (i = 0; i < g->nparts; i++) {
        ce_worker_t *w = &ws[(first + i) % cb->ce_n[sc]];
        ce_part_t *p = &g->parts[i];

        p->next = NULL;
        if (w->tail)
            w->tail->next = p;
        else
            w->head = p;
        w->tail = p;
        pthread_cond_signal(&w->cv);
    }
}

/* The copies a run of a's rows takes: one a layer, K and V (MLA: one). */
static int64_t copies_per_run(const kvd_transfer_args_t *a)
{
    return a->num_layers * (a->src.v != NULL || a->src.v_layers != NULL ? 2 : 1);
}

/* Issue part p's copies on w's stream, in gated slices (see the top). */
static kvd_status_t issue_copies(ce_worker_t *w, ce_part_t *p, uint32_t flags, char *why,
                                 size_t why_len)
{
    const kvd_transfer_args_t *a = &p->a;
    size_t esize = a->idx_dtype == KVD_DTYPE_I64 ? 8 : 4;
    int64_t per_run = copies_per_run(a), max_runs, at = 0;
    kvd_launch_t launch = {w->stream, 0, flags};
    kvd_status_t st = KVD_OK;

    if (a->src_idx == NULL) { /* pairs numbered from 0: not cut */
        if ((st = kvd_cuda_kv_transfer(a, &launch)) != KVD_OK)
            snprintf(why, why_len, "%s", kvd_last_error_detail());
        return st;
    }
    max_runs = GATE_DESCRIPTORS / per_run > 0 ? GATE_DESCRIPTORS / per_run : 1;
    while (st == KVD_OK && at < a->count) {
        kvd_transfer_args_t rest = *a;
        int gated = 0;

        rest.src_idx = (const char *)a->src_idx + (size_t)at * esize;
        rest.dst_idx = (const char *)a->dst_idx + (size_t)at * esize;
        rest.count = a->count - at;
        if (w->gate != NULL && !w->gate_off) {
            CUresult r = w->cb->drv.wait_value32((CUstream)w->stream, w->gate_dev,
                                                 w->gate_seq + 1, CU_STREAM_WAIT_VALUE_GEQ);
            if (r == CUDA_SUCCESS) {
                gated = 1;
                w->gate_seq++;
                rest.count = kvd__rows_of_runs(a, at, max_runs);
            } else { /* a driver without stream memory operations */
                w->gate_off = 1;
                kvd_log(KVD_LOG_WARN, "event=copy_gate_unavailable reason=\"cuStreamWaitValue32: "
                                      "CUresult %d\"",
                        (int)r);
            }
        }
        if ((st = kvd_cuda_kv_transfer(&rest, &launch)) != KVD_OK)
            snprintf(why, why_len, "%s", kvd_last_error_detail());
        at += rest.count;
        /* open whatever happened: nothing may stay behind a closed gate */
        if (gated)
            __atomic_store_n(w->gate, w->gate_seq, __ATOMIC_RELEASE);
    }
    return st;
}

/* Issue one part on w's stream; the last part issued joins the others. */
static void issue(ce_worker_t *w, ce_part_t *p)
{
    ce_group_t *g = p->g;
    kvd__job_t *job = g->job;
    cudaError_t e;

    if (w->cb->ce_cancel) {
        group_fail(g, KVD_ESHUTDOWN, "cancelled before it started");
    } else if ((job->wait_event != NULL &&
                (e = cudaStreamWaitEvent(w->stream, (cudaEvent_t)job->wait_event, 0)) !=
                    cudaSuccess) ||
               (g->wait_end != NULL &&
                (e = cudaStreamWaitEvent(w->stream, g->wait_end, 0)) != cudaSuccess)) {
        char why[160];
        group_fail(g, kvd__cuda_fail(e, "cudaStreamWaitEvent", why, sizeof(why)), why);
    } else {
        char why[sizeof(g->detail)];
        kvd_status_t st = issue_copies(w, p, g->flags, why, sizeof(why));

        if (st != KVD_OK)
            group_fail(g, st, why);
        else if (cudaEventRecord(p->done, w->stream) == cudaSuccess)
            p->recorded = 1;
        else
            group_fail(g, KVD_ECUDA, "cudaEventRecord after a copy-engine part failed");
    }
    if (__atomic_sub_fetch(&g->to_issue, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    /* the last part issued: after every part, the job's events, its end
     * (for the job after it, which may go now) and the hand-back */
    for (int i = 0; i < g->nparts; i++)
        if (&g->parts[i] != p && g->parts[i].recorded)
            (void)cudaStreamWaitEvent(w->stream, g->parts[i].done, 0);
    if (g->status == KVD_OK)
        kvd__cuda_record_events(w->cb, job, w->stream);
    if (cudaEventRecord(g->end, w->stream) != cudaSuccess) {
        /* no end to wait for: the copies are queued, wait for them here */
        (void)cudaGetLastError();
        if ((e = cudaStreamSynchronize(w->stream)) != cudaSuccess) {
            char why[160];
            group_fail(g, kvd__cuda_fail(e, "cudaStreamSynchronize", why, sizeof(why)), why);
        }
    }
    pthread_mutex_lock(&w->cb->ce_mu);
    g->issued = 1;
    if (g->next != NULL) {
        g->next->wait_end = g->end;
        dispatch(w->cb, g->next);
    }
    pthread_mutex_unlock(&w->cb->ce_mu);
    kvd__issued_push(&w->cb->done, job); /* before group_done can push it as done */
    uv_async_send(&w->cb->async);
    pthread_mutex_lock(&w->cb->ce_mu);
    g->reap_next = NULL;
    if (w->reap_tail)
        w->reap_tail->reap_next = g;
    else
        w->reap_head = g;
    w->reap_tail = g;
    pthread_cond_signal(&w->reap_cv);
    pthread_mutex_unlock(&w->cb->ce_mu);
}

/* A worker's completion thread: each group whose end the worker recorded,
 * in the worker's stream order, once that end is reached.  It stops once
 * its worker has ended and its queue is empty. */
static void *reaper_main(void *arg)
{
    ce_worker_t *w = arg;
    cuda_backend_t *cb = w->cb;

    cudaSetDevice(cb->dev);
    pthread_mutex_lock(&cb->ce_mu);
    for (;;) {
        ce_group_t *g;
        cudaError_t e;

        while (w->reap_head == NULL && !w->reap_stop)
            pthread_cond_wait(&w->reap_cv, &cb->ce_mu);
        if (w->reap_head == NULL)
            break;
        g = w->reap_head;
        w->reap_head = g->reap_next;
        if (w->reap_head == NULL)
            w->reap_tail = NULL;
        pthread_mutex_unlock(&cb->ce_mu);
        if ((e = cudaEventSynchronize(g->end)) != cudaSuccess) {
            char why[160];
            group_fail(g, kvd__cuda_fail(e, "cudaEventSynchronize", why, sizeof(why)), why);
        }
        group_done(g);
        pthread_mutex_lock(&cb->ce_mu);
    }
    pthread_mutex_unlock(&cb->ce_mu);
    return NULL;
}

static void *worker_main(void *arg)
{
    ce_worker_t *w = arg;
    cuda_backend_t *cb = w->cb;

    cudaSetDevice(cb->dev);
    pthread_mutex_lock(&cb->ce_mu);
    for (;;) {
        ce_part_t *p;

        while (w->head == NULL && !w->stop)
            pthread_cond_wait(&w->cv, &cb->ce_mu);
        if (w->head == NULL)
            break;
        p = w->head;
        w->head = p->next;
        if (w->head == NULL)
            w->tail = NULL;
        pthread_mutex_unlock(&cb->ce_mu);
        issue(w, p);
        pthread_mutex_lock(&cb->ce_mu);
    }
    pthread_mutex_unlock(&cb->ce_mu);
    return NULL;
}

/* w's gate, where the driver has stream memory operations; without one
 * its slices go ungated. */
static void gate_init(cuda_backend_t *cb, ce_worker_t *w)
{
    void *dev = NULL;

    if (cb->drv.wait_value32 == NULL ||
        cudaHostAlloc((void **)&w->gate, sizeof(*w->gate),
                      cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        w->gate = NULL;
        kvd_log(KVD_LOG_WARN, "event=copy_gate_unavailable reason=\"%s\"",
                cb->drv.wait_value32 == NULL ? "no cuStreamWaitValue32"
                                             : "cudaHostAlloc of the gate failed");
        return;
    }
    if (cudaHostGetDevicePointer(&dev, w->gate, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFreeHost(w->gate);
        w->gate = NULL;
        kvd_log(KVD_LOG_WARN, "event=copy_gate_unavailable reason=\"no device address\"");
        return;
    }
    *w->gate = 0;
    w->gate_dev = (CUdeviceptr)(uintptr_t)dev;
}

/* Workers of a stream class: --copy-threads, and twice that (at most
 * MAX_OFFLOAD_THREADS) for device-to-host offloads.  Small offloads are
 * bound by the threads issuing them, and a device-to-host descriptor
 * costs the driver about half the CPU time of a host-to-device one: more
 * threads raise them to the copy engines' own rate at little cost to
 * compute beside them, where more threads issuing host-to-device copies
 * slow it (tests/bench/RESULTS.md, "The copy engines beside a decode
 * step"). */
#define MAX_OFFLOAD_THREADS 8

static int class_threads(const cuda_backend_t *cb, int sclass)
{
    if (sclass == KVD_STREAM_OFFLOAD)
        return 2 * cb->ce_threads < MAX_OFFLOAD_THREADS ? 2 * cb->ce_threads
                                                         : MAX_OFFLOAD_THREADS;
    return cb->ce_threads;
}

/* The class's workers, started at its first copy-engine transfer. */
static kvd_status_t workers_of(cuda_backend_t *cb, int sclass, char *why, size_t why_len)
{
    ce_worker_t *ws;
    int i, n = class_threads(cb, sclass);

    if (cb->ce[sclass] != NULL)
        return KVD_OK;
    ws = calloc((size_t)n, sizeof(*ws));
    if (ws == NULL)
        return KVD_ENOMEM;
    cb->ce_n[sclass] = n;
    for (i = 0; i < n; i++) {
        ce_worker_t *w = &ws[i];
        cudaError_t e = cudaStreamCreateWithPriority(&w->stream, cudaStreamNonBlocking,
                                                     cb->be.priority[sclass]);
        w->cb = cb;
        pthread_cond_init(&w->cv, NULL);
        pthread_cond_init(&w->reap_cv, NULL);
        if (e == cudaSuccess)
            gate_init(cb, w);
        /* the completion thread first: a worker hands every job to it */
        if (e == cudaSuccess && pthread_create(&w->reaper, NULL, reaper_main, w) == 0)
            w->reaper_started = 1;
        if (!w->reaper_started || pthread_create(&w->th, NULL, worker_main, w) != 0) {
            snprintf(why, why_len, "cannot start copy-engine workers");
            (void)cudaGetLastError();
            cb->ce[sclass] = ws; /* stopped and freed with the backend */
            return KVD_ECUDA;
        }
        w->started = 1;
    }
    cb->ce[sclass] = ws;
    return KVD_OK;
}

/* Whether a transfer side's first layer lies in host memory. */
static int on_host(const kvd_kv_side_t *s)
{
    const void *p = s->k_layers != NULL ? (const void *)(uintptr_t)s->k_layers[0] : s->k;
    struct cudaPointerAttributes at;

    if (p == NULL || cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return at.type == cudaMemoryTypeHost || at.type == cudaMemoryTypeUnregistered;
}

uint32_t kvd__cuda_copy_flags(const cuda_backend_t *cb, const kvd_transfer_args_t *a)
{
    uint32_t f = KVD_LAUNCH_COPY_ENGINE;

    if (cb->ce_h2d_each && on_host(&a->src) && !on_host(&a->dst))
        f |= KVD_LAUNCH_COPY_EACH;
    return f;
}

kvd_status_t kvd__cuda_copy_submit(cuda_backend_t *cb, kvd__job_t *job)
{
    const kvd_transfer_args_t *a = &job->a.transfer;
    size_t esize = a->idx_dtype == KVD_DTYPE_I64 ? 8 : 4;
    int64_t rows = a->count, per, copies;
    int n, i;
    ce_group_t *g;
    kvd_status_t st;

    if ((st = workers_of(cb, job->sclass, job->detail, sizeof(job->detail))) != KVD_OK)
        return st;
    /* split by the copies to issue, not the rows: a row of the cache tier
     * is a block, dozens of copies */
    copies = kvd__transfer_runs(a) * copies_per_run(a);
    n = copies / MIN_PART_COPIES < cb->ce_n[job->sclass] ? (int)(copies / MIN_PART_COPIES)
                                                          : cb->ce_n[job->sclass];
    if (n < 1 || rows < n || a->src_idx == NULL)
        n = 1;
    g = calloc(1, sizeof(*g) + (size_t)n * sizeof(ce_part_t));
    if (g == NULL)
        return KVD_ENOMEM;
    g->cb = cb;
    g->job = job;
    g->flags = kvd__cuda_copy_flags(cb, a);
    g->nparts = n;
    g->to_issue = n;
    per = (rows + n - 1) / n;
    for (i = 0; i < n; i++) {
        ce_part_t *p = &g->parts[i];
        int64_t lo = i * per, hi = lo + per < rows ? lo + per : rows;

        p->g = g;
        p->a = *a;
        p->a.src_idx = (const char *)a->src_idx + (size_t)lo * esize;
        p->a.dst_idx = (const char *)a->dst_idx + (size_t)lo * esize;
        p->a.count = hi > lo ? hi - lo : 0;
        p->a.oob_count = &p->oob; /* each part counts its own rows */
        p->done = event_get(cb);
        if (p->done == NULL) {
            while (--i >= 0)
                cudaEventDestroy(g->parts[i].done);
            free(g);
            snprintf(job->detail, sizeof(job->detail), "no CUDA event for a copy part");
            return KVD_ECUDA;
        }
    }
    g->end = event_get(cb);
    if (g->end == NULL) {
        for (i = 0; i < n; i++)
            cudaEventDestroy(g->parts[i].done);
        free(g);
        snprintf(job->detail, sizeof(job->detail), "no CUDA event for a copy job");
        return KVD_ECUDA;
    }
    /* a job after another of its request waits for that one's end: until
     * that one is issued (its end recorded), its issuer dispatches this one */
    job->issue_later = 1;
    pthread_mutex_lock(&cb->ce_mu);
    job->ce_group = g;
    if (job->after != NULL && job->after->ce_group != NULL) {
        ce_group_t *prev = job->after->ce_group;

        if (!prev->issued) {
            prev->next = g;
            pthread_mutex_unlock(&cb->ce_mu);
            return KVD_OK;
        }
        g->wait_end = prev->end;
    }
    dispatch(cb, g);
    pthread_mutex_unlock(&cb->ce_mu);
    return KVD_OK;
}

void kvd__cuda_copy_stop(cuda_backend_t *cb)
{
    int sc, i;

    for (sc = KVD_STREAM_FIRST; sc < KVD_STREAM_END; sc++) {
        ce_worker_t *ws = cb->ce[sc];

        if (ws == NULL)
            continue;
        pthread_mutex_lock(&cb->ce_mu);
        for (i = 0; i < cb->ce_n[sc]; i++) {
            ws[i].stop = 1;
            pthread_cond_signal(&ws[i].cv);
        }
        pthread_mutex_unlock(&cb->ce_mu);
        for (i = 0; i < cb->ce_n[sc]; i++) {
            if (ws[i].started)
                pthread_join(ws[i].th, NULL);
            /* after its worker: every group it was handed is in its queue */
            pthread_mutex_lock(&cb->ce_mu);
            ws[i].reap_stop = 1;
            pthread_cond_signal(&ws[i].reap_cv);
            pthread_mutex_unlock(&cb->ce_mu);
            if (ws[i].reaper_started)
                pthread_join(ws[i].reaper, NULL);
            if (ws[i].stream != NULL)
                cudaStreamDestroy(ws[i].stream);
            if (ws[i].gate != NULL)
                cudaFreeHost(ws[i].gate);
            pthread_cond_destroy(&ws[i].cv);
            pthread_cond_destroy(&ws[i].reap_cv);
        }
        free(ws);
        cb->ce[sc] = NULL;
    }
    while (cb->ce_nevents > 0)
        cudaEventDestroy(cb->ce_events[--cb->ce_nevents]);
    free(cb->ce_events);
    cb->ce_events = NULL;
    cb->ce_cap = 0;
}
