/* The finished-job list both backends hand to the loop thread. */
#include "backend.h"

void kvd__done_init(kvd_done_list_t *dl)
{
    pthread_mutex_init(&dl->mu, NULL);
    dl->head = dl->tail = NULL;
}

void kvd__done_destroy(kvd_done_list_t *dl)
{
    pthread_mutex_destroy(&dl->mu);
}

void kvd__done_push(kvd_done_list_t *dl, kvd_job_t *job)
{
    pthread_mutex_lock(&dl->mu);
    kvd__jobs_append(&dl->head, &dl->tail, job);
    pthread_mutex_unlock(&dl->mu);
}

kvd_job_t *kvd__done_take(kvd_done_list_t *dl)
{
    pthread_mutex_lock(&dl->mu);
    kvd_job_t *list = dl->head;
    dl->head = dl->tail = NULL;
    pthread_mutex_unlock(&dl->mu);
    return list;
}
