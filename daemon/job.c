/* What both backends share about jobs: running one's kernel, the shape of
 * a transfer's runs, and the finished-job list they hand to the loop
 * thread. */
#include "backend.h"

kvd_status_t kvd__job_run(kvd__job_t *job, int cuda, unsigned long long *oob,
                          const kvd_launch_t *launch)
{
    switch (job->kind) {
#define KVD_JOB_RUN_(K, member, args_t, fn)                                                      \
    case KVD_JOB_##K:                                                                            \
        job->a.member.oob_count = oob;                                                           \
        return cuda ? kvd_cuda_##fn(&job->a.member, launch) : kvd_cpu_##fn(&job->a.member, launch);
        KVD_JOBS(KVD_JOB_RUN_)
#undef KVD_JOB_RUN_
    }
    return KVD_EINTERNAL;
}

void kvd__done_init(kvd__done_list_t *dl)
{
    pthread_mutex_init(&dl->mu, NULL);
    dl->head = dl->tail = NULL;
    dl->issued_head = dl->issued_tail = NULL;
}

void kvd__done_destroy(kvd__done_list_t *dl)
{
    pthread_mutex_destroy(&dl->mu);
}

void kvd__done_push(kvd__done_list_t *dl, kvd__job_t *job)
{
    pthread_mutex_lock(&dl->mu);
    kvd__jobs_append(&dl->head, &dl->tail, job);
    pthread_mutex_unlock(&dl->mu);
}

void kvd__issued_push(kvd__done_list_t *dl, kvd__job_t *job)
{
    job->issued_next = NULL;
    pthread_mutex_lock(&dl->mu);
    if (dl->issued_tail)
        dl->issued_tail->issued_next = job;
    else
        dl->issued_head = job;
    dl->issued_tail = job;
    pthread_mutex_unlock(&dl->mu);
}

kvd__job_t *kvd__done_take(kvd__done_list_t *dl, kvd__job_t **issued)
{
    pthread_mutex_lock(&dl->mu);
    kvd__job_t *list = dl->head;
    *issued = dl->issued_head;
    dl->head = dl->tail = NULL;
    dl->issued_head = dl->issued_tail = NULL;
    pthread_mutex_unlock(&dl->mu);
    return list;
}

static int64_t index_at(const void *p, int is64, int64_t i)
{
    return is64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* Whether pair i of a starts a run after pair i - 1 (see kvd__rows_of_runs). */
static int run_breaks(const kvd_transfer_args_t *a, int is64, int packed, int64_t i)
{
    return !packed || index_at(a->dst_idx, is64, i) != index_at(a->dst_idx, is64, i - 1) + 1 ||
           (a->src_idx != NULL &&
            index_at(a->src_idx, is64, i) != index_at(a->src_idx, is64, i - 1) + 1);
}

int64_t kvd__rows_of_runs(const kvd_transfer_args_t *a, int64_t from, int64_t max_runs)
{
    int is64 = a->idx_dtype == KVD_DTYPE_I64;
    int packed = a->src.slot_stride == a->row_bytes && a->dst.slot_stride == a->row_bytes;
    int64_t runs = 0, i;

    for (i = from; i < a->count; i++) {
        if (i == from || run_breaks(a, is64, packed, i)) {
            if (runs == max_runs)
                break;
            runs++;
        }
    }
    return i - from;
}

int64_t kvd__transfer_runs(const kvd_transfer_args_t *a)
{
    int is64 = a->idx_dtype == KVD_DTYPE_I64;
    int packed = a->src.slot_stride == a->row_bytes && a->dst.slot_stride == a->row_bytes;
    int64_t runs = a->count > 0;

    for (int64_t i = 1; i < a->count; i++)
        runs += run_breaks(a, is64, packed, i);
    return runs;
}
