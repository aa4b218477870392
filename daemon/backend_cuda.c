/*
 * The cuda backend: plain C on the CUDA runtime API.  This file makes
 * and ends it; cuda_mem.c holds its memory, cuda_work.c its work.
 *
 * - device pools: one cudaMalloc allocation each, exported by
 *   cudaIpcGetMemHandle; VMM pools: cuMemCreate with a POSIX-fd handle type,
 *   exported as that descriptor; host pools: a sealed memfd, mapped and
 *   registered with cudaHostRegister;
 * - imports: a legacy handle is opened once per daemon and reference-counted
 *   (a process may open a handle only once); a VMM descriptor is imported,
 *   mapped and given access; a host memfd is mapped and registered;
 * - one stream per class, created with priorities; kernels run with
 *   kvd_cuda_* on the class's stream and block budget, after
 *   cudaStreamWaitEvent on the request's wait event and before cudaEventRecord
 *   of its record event;
 * - completion (--cuda-completion): a poller thread queries an event
 *   recorded after each job (poll), or cudaLaunchHostFunc (hostfunc), pushes
 *   the job onto a mutex-protected queue and wakes the loop with
 *   uv_async_send; or the loop itself queries the events between rounds of
 *   socket I/O while work is in flight (loop; one event per stream for the
 *   jobs launched since the last, not one per job).  The loop never blocks.
 *
 * The driver API (VMM, address ranges) is reached through
 * cudaGetDriverEntryPointByVersion: the binary never links libcuda, so it
 * starts on machines without a driver (and picks the cpu backend there).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "log.h"

static void free_backend(cuda_backend_t *cb)
{
    int i;

    kvd__cuda_stop_poller(cb);
    kvd__cuda_copy_stop(cb);
    pthread_mutex_destroy(&cb->ce_mu);
    while (cb->ev_nfree > 0)
        cudaEventDestroy(cb->ev_free[--cb->ev_nfree]);
    free(cb->ev_free);
    pthread_mutex_destroy(&cb->poll_mu);
    pthread_cond_destroy(&cb->poll_cv);

    for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++)
        if (cb->streams[i] != NULL)
            cudaStreamDestroy(cb->streams[i]);
    kvd__cuda_staging_release(cb);
    if (cb->oob)
        cudaFreeHost(cb->oob);
    free(cb->oob_free);
    kvd__done_destroy(&cb->done);
    free(cb);
}

static void async_closed_cb(uv_handle_t *h)
{
    cuda_backend_t *cb = h->data;
    void (*fn)(void *) = cb->destroy_cb;
    void *arg = cb->destroy_arg;

    free_backend(cb);
    if (fn)
        fn(arg);
}

static void idle_closed_cb(uv_handle_t *h)
{
    cuda_backend_t *cb = h->data;

    uv_close((uv_handle_t *)&cb->async, async_closed_cb);
}

static void cuda_bind_thread(kvd__backend_t *be)
{
    (void)cudaSetDevice(((cuda_backend_t *)be)->dev);
}

static void cuda_destroy(kvd__backend_t *be, void (*fn)(void *arg), void *arg)
{
    cuda_backend_t *cb = (cuda_backend_t *)be;

    cudaDeviceSynchronize();
    /* the copy-engine completion threads hand jobs back through the async
     * handle: ended before it closes */
    kvd__cuda_copy_stop(cb);
    cb->destroy_cb = fn;
    cb->destroy_arg = arg;
    if (cb->loop_poll) {
        if (cb->n_inflight > 0)
            kvd__cuda_idle_cb(&cb->idle); /* all done after the synchronize: answer them */
        uv_close((uv_handle_t *)&cb->idle, idle_closed_cb);
        return;
    }
    uv_close((uv_handle_t *)&cb->async, async_closed_cb);
}

kvd_status_t kvd__backend_cuda_create(uv_loop_t *loop, const kvd__options_t *opts,
                                      kvd__backend_t **out, char *why, size_t why_len)
{
    cuda_backend_t *cb;
    struct cudaDeviceProp prop;
    int least = 0, greatest = 0, i, ndev = 0;
    cudaError_t e;
    kvd_status_t st;

    e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        (void)cudaGetLastError();
        snprintf(why, why_len, "no usable GPU: %s",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        return KVD_ENODEV;
    }
    if (opts->device >= ndev) {
        snprintf(why, why_len, "device %lld does not exist (%d found)", (long long)opts->device,
                 ndev);
        return KVD_ENODEV;
    }
    e = cudaSetDevice((int)opts->device);
    if (e != cudaSuccess)
        return kvd__cuda_fail(e, "cudaSetDevice", why, why_len);
    /* before any stream can wait on a client's event: a lazy kernel load at
     * a first launch could otherwise block the loop until that event fires */
    if (kvd_cuda_load_kernels() != KVD_OK) {
        snprintf(why, why_len, "loading the kernels: %s", kvd_last_error_detail());
        return KVD_ECUDA;
    }
    if ((e = cudaGetDeviceProperties(&prop, (int)opts->device)) != cudaSuccess)
        return kvd__cuda_fail(e, "cudaGetDeviceProperties", why, why_len);
    if ((e = cudaDeviceGetStreamPriorityRange(&least, &greatest)) != cudaSuccess)
        return kvd__cuda_fail(e, "cudaDeviceGetStreamPriorityRange", why, why_len);

    cb = calloc(1, sizeof(*cb));
    if (cb == NULL)
        return KVD_ENOMEM;
    kvd__done_init(&cb->done);
    pthread_mutex_init(&cb->poll_mu, NULL);
    pthread_mutex_init(&cb->ce_mu, NULL);
    cb->ce_threads = (int)opts->copy_threads;
    pthread_cond_init(&cb->poll_cv, NULL);
    cb->dev = (int)opts->device;
    cb->device_margin = opts->device_memory_margin;
    cb->be.name = "cuda";
    cb->be.proto_backend = 2; /* BACKEND_CUDA */
    snprintf(cb->be.device_name, sizeof(cb->be.device_name), "%.127s", prop.name);
    cb->be.device_ordinal = cb->dev;
    kvd__cuda_load_driver(&cb->drv);
    if (cb->drv.vmm) {
        CUmemAllocationProp vprop;
        char vwhy[96];

        if (kvd__cuda_vmm_prop(cb, &vprop, &cb->be.vmm_granularity, vwhy, sizeof(vwhy)) != KVD_OK)
            cb->be.vmm_granularity = 0;
    }
    for (i = KVD_STREAM_FIRST; i < KVD_STREAM_END; i++) {
        /* CUDA: a lower number runs first; greatest is the most urgent */
        int prio = least - (int)opts->priority[i];
        if (prio < greatest)
            prio = greatest;
        cb->be.priority[i] = prio;
        cb->be.blocks[i] = (uint32_t)opts->blocks[i];
        e = cudaStreamCreateWithPriority(&cb->streams[i], cudaStreamNonBlocking, prio);
        if (e != cudaSuccess) {
            st = kvd__cuda_fail(e, "cudaStreamCreateWithPriority", why, why_len);
            goto fail;
        }
    }
    e = cudaHostAlloc((void **)&cb->oob, OOB_SLOTS * sizeof(*cb->oob),
                      cudaHostAllocPortable | cudaHostAllocMapped);
    cb->oob_free = malloc(OOB_SLOTS * sizeof(*cb->oob_free));
    if (e != cudaSuccess || cb->oob_free == NULL) {
        st = e != cudaSuccess ? kvd__cuda_fail(e, "cudaHostAlloc", why, why_len) : KVD_ENOMEM;
        goto fail;
    }
    for (i = 0; i < OOB_SLOTS; i++)
        cb->oob_free[i] = (uint32_t)(OOB_SLOTS - 1 - i);
    cb->oob_nfree = OOB_SLOTS;
    /* every job in flight holds at most one event: never more than slots */
    cb->ev_free = malloc(OOB_SLOTS * sizeof(*cb->ev_free));
    if (cb->ev_free == NULL) {
        st = KVD_ENOMEM;
        goto fail;
    }
    cb->ce_h2d_each = opts->copy_issue == KVD_COPY_ISSUE_EACH;
    cb->use_poll = opts->cuda_completion == KVD_COMPLETION_POLL;
    if (cb->use_poll) {
        if (pthread_create(&cb->poller, NULL, kvd__cuda_poller_main, cb) != 0) {
            snprintf(why, why_len, "cannot start the completion thread");
            st = KVD_ENOMEM;
            goto fail;
        }
        cb->poller_started = 1;
    }

    kvd__cuda_mem_ops(&cb->be);
    kvd__cuda_work_ops(&cb->be);
    cb->be.destroy = cuda_destroy;
    cb->be.bind_thread = cuda_bind_thread;
    if (uv_async_init(loop, &cb->async, kvd__cuda_async_cb) != 0) {
        snprintf(why, why_len, "uv_async_init failed");
        st = KVD_EINTERNAL;
        goto fail;
    }
    cb->async.data = cb;
    cb->loop_poll = opts->cuda_completion == KVD_COMPLETION_LOOP;
    if (cb->loop_poll) {
        uv_idle_init(loop, &cb->idle);
        cb->idle.data = cb;
    }
    kvd_log(KVD_LOG_INFO,
            "event=cuda_backend device=%d name=\"%s\" vmm=%d priority_range=%d..%d "
            "completion=%s", cb->dev, prop.name, cb->drv.vmm, least, greatest,
            cb->use_poll ? "poll" : cb->loop_poll ? "loop" : "hostfunc");
    *out = &cb->be;
    return KVD_OK;
fail:
    free_backend(cb);
    return st;
}
