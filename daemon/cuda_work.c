/*
 * The cuda backend's work (see backend_cuda.c): a job runs on its class's
 * stream (after cudaStreamWaitEvent on the request's wait event, before
 * cudaEventRecord of its record event), and its completion comes back to
 * the loop thread in one of three ways (--cuda-completion): the loop
 * itself queries one event per stream for the jobs launched since the
 * last, between rounds of socket I/O (loop); a poller thread queries an
 * event per job (poll); or cudaLaunchHostFunc (hostfunc).  The last two
 * push the job onto a mutex-protected list and wake the loop with
 * uv_async_send.  The loop never blocks.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "log.h"

/* ---- completions ----------------------------------------------------------- */

void kvd__cuda_push_done(cuda_backend_t *cb, kvd__job_t *job)
{
    kvd__done_push(&cb->done, job);
    uv_async_send(&cb->async);
}

/* Runs on a CUDA thread once the stream reaches it: no CUDA calls here. */
static void CUDART_CB host_done(void *arg)
{
    kvd__job_t *job = arg;

    kvd__cuda_push_done((cuda_backend_t *)job->be, job);
}

/* The poller: while work is in flight it queries the event recorded after
 * each stream's oldest job (a stream completes in order); idle, it sleeps. */
void *kvd__cuda_poller_main(void *arg)
{
    cuda_backend_t *cb = arg;
    unsigned idle_spins = 0;

    cudaSetDevice(cb->dev);
    pthread_mutex_lock(&cb->poll_mu);
    for (;;) {
        kvd__job_t *heads[KVD_STREAM_END];
        int i, progressed = 0;

        while (cb->n_inflight == 0 && !cb->poll_stop)
            pthread_cond_wait(&cb->poll_cv, &cb->poll_mu);
        if (cb->n_inflight == 0 && cb->poll_stop)
            break;
        for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++)
            heads[i] = cb->inflight[i].head;
        pthread_mutex_unlock(&cb->poll_mu);
        for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++) {
            kvd__job_t *job = heads[i];
            cudaError_t e;

            if (job == NULL)
                continue;
            e = cudaEventQuery((cudaEvent_t)job->done_event);
            if (e == cudaErrorNotReady)
                continue;
            if (e != cudaSuccess) {
                job->status = kvd__cuda_fail(e, "the stream failed", job->detail, sizeof(job->detail));
            }
            pthread_mutex_lock(&cb->poll_mu);
            (void)fifo_pop(&cb->inflight[i]);
            cb->n_inflight--;
            pthread_mutex_unlock(&cb->poll_mu);
            kvd__cuda_push_done(cb, job);
            progressed = 1;
        }
        if (progressed)
            idle_spins = 0;
        else if (++idle_spins > 64)
            sched_yield(); /* long work: let others run between queries */
        pthread_mutex_lock(&cb->poll_mu);
    }
    pthread_mutex_unlock(&cb->poll_mu);
    return NULL;
}

/* On the loop thread: give back the job's event and counter, and answer. */
static void finish_job(cuda_backend_t *cb, kvd__job_t *job)
{
    /* the work is done: its counter is final */
    job->skipped_oob = *(volatile unsigned long long *)job->oob;
    if (job->done_event != NULL) {
        cb->ev_free[cb->ev_nfree++] = (cudaEvent_t)job->done_event;
        job->done_event = NULL;
    }
    cb->oob_free[cb->oob_nfree++] = job->oob_slot;
    cb->pending--;
    job->done(job);
}

void kvd__cuda_async_cb(uv_async_t *h)
{
    cuda_backend_t *cb = h->data;
    kvd__job_t *list, *next, *issued, *inext;

    list = kvd__done_take(&cb->done, &issued);
    for (; issued; issued = inext) {
        inext = issued->issued_next;
        if (issued->issued != NULL)
            issued->issued(issued);
    }
    for (; list; list = next) {
        next = list->next;
        finish_job(cb, list);
    }
}

/* An event to record after work (from the free list), or NULL. */
static cudaEvent_t completion_event(cuda_backend_t *cb)
{
    cudaEvent_t ev;

    if (cb->ev_nfree > 0)
        return cb->ev_free[--cb->ev_nfree];
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)
        return NULL;
    return ev;
}

/* Loop mode: the event that tells the end of the jobs launched on
 * stream i since the last one, recorded once for all of them (the stream
 * runs them in order).  If it cannot be recorded, wait for the stream. */
static void mark_batch_end(cuda_backend_t *cb, int i)
{
    job_fifo_t *q = &cb->inflight[i];
    cudaEvent_t ev;
    cudaError_t e;
    kvd__job_t *job;

    cb->unrecorded[i] = 0;
    if (q->tail == NULL)
        return;
    ev = completion_event(cb);
    if (ev != NULL && cudaEventRecord(ev, cb->streams[i]) == cudaSuccess) {
        q->tail->done_event = ev;
        return;
    }
    (void)cudaGetLastError();
    if (ev != NULL)
        cudaEventDestroy(ev);
    kvd_log(KVD_LOG_WARN, "event=completion_event_failed action=synchronize stream=%d", i);
    e = cudaStreamSynchronize(cb->streams[i]);
    job = q->head; /* what the wait covered: a done callback may queue more */
    q->head = q->tail = NULL;
    while (job != NULL) {
        kvd__job_t *next = job->next;

        if (e != cudaSuccess)
            job->status = kvd__cuda_fail(e, "the stream failed", job->detail, sizeof(job->detail));
        cb->n_inflight--;
        finish_job(cb, job);
        job = next;
    }
}

/* Loop mode: while the idle handle is active the loop polls sockets without
 * blocking and calls this between rounds; finished jobs are answered here,
 * with no other thread between the GPU and the reply.  Jobs complete in
 * groups: each group ends at the job that holds the group's event. */
void kvd__cuda_idle_cb(uv_idle_t *h)
{
    cuda_backend_t *cb = h->data;
    int i;

    for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++) {
        job_fifo_t *q = &cb->inflight[i];

        if (cb->unrecorded[i])
            mark_batch_end(cb, i);
        while (q->head != NULL) {
            kvd__job_t *end = q->head, *job;
            kvd_status_t st = KVD_OK;
            char detail[sizeof(end->detail)] = "";
            cudaError_t e;

            while (end != NULL && end->done_event == NULL)
                end = end->next;
            if (end == NULL)
                break; /* queued by a done callback: recorded next round */
            e = cudaEventQuery((cudaEvent_t)end->done_event);
            if (e == cudaErrorNotReady)
                break;
            if (e != cudaSuccess)
                st = kvd__cuda_fail(e, "the stream failed", detail, sizeof(detail));
            do {
                job = fifo_pop(q);
                if (st != KVD_OK) {
                    job->status = st;
                    snprintf(job->detail, sizeof(job->detail), "%s", detail);
                }
                cb->n_inflight--;
                finish_job(cb, job);
            } while (job != end);
        }
    }
    if (cb->n_inflight == 0)
        uv_idle_stop(&cb->idle);
}

/* ---- work ------------------------------------------------------------------ */

void kvd__cuda_record_events(cuda_backend_t *cb, const kvd__job_t *job, cudaStream_t s)
{
    void *evs[2] = {job->layer_event, job->record_event};

    /* the layer flag: written on the stream after the work (with the fence
     * that makes the work's writes visible first), so that a worker's
     * stream may wait on it before or after this is queued */
    if (job->layer_flag != NULL) {
        CUdeviceptr flag = (CUdeviceptr)(uintptr_t)job->layer_flag;
        CUresult r = cb->drv.write_value32 != NULL
                         ? cb->drv.write_value32((CUstream)s, flag, job->flag_value, 0)
                         : CUDA_ERROR_NOT_SUPPORTED;
        if (r != CUDA_SUCCESS)
            kvd_log(KVD_LOG_WARN, "event=flag_write_failed result=%d", (int)r);
    }
    for (int i = 0; i < 2; i++)
        if (evs[i] != NULL && cudaEventRecord((cudaEvent_t)evs[i], s) != cudaSuccess) {
            kvd_log(KVD_LOG_WARN, "event=record_failed error=\"%s\"",
                    cudaGetErrorString(cudaGetLastError()));
        }
}

static kvd_status_t cuda_submit(kvd__backend_t *be, kvd__job_t *job)
{
    cuda_backend_t *cb = (cuda_backend_t *)be;
    cudaStream_t s;
    kvd_launch_t launch;
    kvd_status_t st = KVD_EINTERNAL;
    cudaError_t e;
    uint32_t slot;

    if (job->sclass < KVD_STREAM_FIRST || job->sclass >= KVD_STREAM_END)
        return KVD_EINVAL;
    if (cb->oob_nfree == 0) {
        snprintf(job->detail, sizeof(job->detail), "too many operations in flight");
        return KVD_EBUSY;
    }
    s = cb->streams[job->sclass];
    slot = cb->oob_free[--cb->oob_nfree];
    cb->oob[slot] = 0;
    job->oob_slot = slot;
    job->oob = &cb->oob[slot];
    job->status = KVD_OK;
    job->skipped_oob = 0;
    job->detail[0] = '\0';
    job->be = be;
    job->done_event = NULL;

    /* The copy engines cost the issuing thread CPU time per descriptor,
     * and the call blocks while its stream holds enough queued work: never
     * on the loop thread. */
    if ((job->flags & KVD_LAUNCH_COPY_ENGINE) && job->kind == KVD_JOB_TRANSFER &&
        cb->ce_threads > 0) {
        st = kvd__cuda_copy_submit(cb, job);
        if (st != KVD_OK)
            goto fail;
        cb->pending++;
        return KVD_OK;
    }

    if (job->wait_event != NULL) {
        e = cudaStreamWaitEvent(s, (cudaEvent_t)job->wait_event, 0);
        if (e != cudaSuccess) {
            st = kvd__cuda_fail(e, "cudaStreamWaitEvent", job->detail, sizeof(job->detail));
            goto fail;
        }
    }
    launch.stream = s;
    launch.max_blocks = job->max_blocks ? job->max_blocks : be->blocks[job->sclass];
    launch.flags = job->flags;
    if ((job->flags & KVD_LAUNCH_COPY_ENGINE) && job->kind == KVD_JOB_TRANSFER)
        launch.flags = job->flags | kvd__cuda_copy_flags(cb, &job->a.transfer);
    st = kvd__job_run(job, 1, job->oob, &launch);
    if (st != KVD_OK) {
        snprintf(job->detail, sizeof(job->detail), "%s", kvd_last_error_detail());
        goto fail;
    }
    /* (a job after another of its request is on the same stream: in order) */
    kvd__cuda_record_events(cb, job, s);
    cb->pending++;
    if (cb->loop_poll) { /* loop thread only: no lock; the event comes in kvd__cuda_idle_cb */
        job->done_event = NULL;
        fifo_push(&cb->inflight[job->sclass], job);
        cb->unrecorded[job->sclass] = 1;
        if (cb->n_inflight++ == 0)
            uv_idle_start(&cb->idle, kvd__cuda_idle_cb);
        return KVD_OK;
    }
    if (cb->use_poll) {
        cudaEvent_t ev = completion_event(cb);

        if (ev != NULL && cudaEventRecord(ev, s) == cudaSuccess) {
            job->done_event = ev;
            pthread_mutex_lock(&cb->poll_mu);
            fifo_push(&cb->inflight[job->sclass], job);
            if (cb->n_inflight++ == 0)
                pthread_cond_signal(&cb->poll_cv);
            pthread_mutex_unlock(&cb->poll_mu);
            return KVD_OK;
        }
        /* no event: fall back to a host function for this one */
        (void)cudaGetLastError();
        if (ev != NULL)
            cudaEventDestroy(ev);
    }
    e = cudaLaunchHostFunc(s, host_done, job);
    if (e != cudaSuccess) {
        /* the work is queued: wait for it here rather than lose its end */
        (void)cudaGetLastError();
        kvd_log(KVD_LOG_WARN, "event=host_func_failed error=\"%s\" action=synchronize",
                cudaGetErrorString(e));
        e = cudaStreamSynchronize(s);
        if (e != cudaSuccess)
            job->status = kvd__cuda_fail(e, "cudaStreamSynchronize", job->detail, sizeof(job->detail));
        kvd__cuda_push_done(cb, job);
    }
    return KVD_OK;

fail:
    cb->oob_free[cb->oob_nfree++] = slot;
    return st;
}

static void cuda_cancel_pending(kvd__backend_t *be)
{
    /* everything else is already on a stream; the copy workers skip the
     * parts they have not issued yet */
    ((cuda_backend_t *)be)->ce_cancel = 1;
}

static uint32_t cuda_pending(kvd__backend_t *be)
{
    return ((cuda_backend_t *)be)->pending;
}

void kvd__cuda_stop_poller(cuda_backend_t *cb)
{
    if (!cb->poller_started)
        return;
    pthread_mutex_lock(&cb->poll_mu);
    cb->poll_stop = 1;
    pthread_cond_signal(&cb->poll_cv);
    pthread_mutex_unlock(&cb->poll_mu);
    pthread_join(cb->poller, NULL);
    cb->poller_started = 0;
}

void kvd__cuda_work_ops(kvd__backend_t *be)
{
    be->submit = cuda_submit;
    be->cancel_pending = cuda_cancel_pending;
    be->pending = cuda_pending;
}
