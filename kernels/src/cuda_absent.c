/*
 * The CUDA entry points of a build without nvcc.  They validate exactly as
 * the real ones do, so bad input gets the same status on every build, and
 * only then say that the backend is missing.
 */
#include <stdio.h>

#include "internal.h"

static const char no_cuda[] = KVD_NO_CUDA_REASON;

kvd_status_t kvd_cuda_probe(char *why, size_t why_len)
{
    kvd__clear_error();
    if (why && why_len > 0)
        snprintf(why, why_len, "%s", no_cuda);
    return kvd__fail(KVD_ENOTSUP, "cuda_probe: %s", no_cuda);
}

kvd_status_t kvd_cuda_load_kernels(void)
{
    kvd__clear_error();
    return kvd__fail(KVD_ENOTSUP, "cuda_load_kernels: %s", no_cuda);
}

kvd_status_t kvd_cuda_kv_store(const kvd_store_args_t *a, const kvd_launch_t *launch)
{
    kvd_status_t st;

    kvd__clear_error();
    if ((st = kvd__check_store(a)) != KVD_OK)
        return st;
    return kvd__fail(KVD_ENOTSUP, "kv_store: %s", no_cuda);
}

kvd_status_t kvd_cuda_fp8_set(const kvd_fp8_set_args_t *a, const kvd_launch_t *launch)
{
    kvd_status_t st;

    kvd__clear_error();
    if ((st = kvd__check_fp8_set(a)) != KVD_OK)
        return st;
    return kvd__fail(KVD_ENOTSUP, "fp8_set: %s", no_cuda);
}

kvd_status_t kvd_cuda_page_table_gather(const kvd_gather_args_t *a, const kvd_launch_t *launch)
{
    kvd_status_t st;

    kvd__clear_error();
    if ((st = kvd__check_gather(a)) != KVD_OK)
        return st;
    return kvd__fail(KVD_ENOTSUP, "page_table_gather: %s", no_cuda);
}

kvd_status_t kvd_cuda_kv_transfer(const kvd_transfer_args_t *a, const kvd_launch_t *launch)
{
    kvd_status_t st;

    kvd__clear_error();
    if ((st = kvd__check_transfer(a)) != KVD_OK)
        return st;
    return kvd__fail(KVD_ENOTSUP, "kv_transfer: %s", no_cuda);
}
