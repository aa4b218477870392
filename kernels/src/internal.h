/*
 * Internals shared by the kernel library's backends (CUDA and CPU).
 * Not installed; not part of the ABI.
 */
#ifndef KVDOCK_KERNELS_INTERNAL_H
#define KVDOCK_KERNELS_INTERNAL_H

#include "kvdock/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Record what was wrong for kvd_last_error_detail() and return st. */
kvd_status_t kvd__fail(kvd_status_t st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Forget the calling thread's last detail (called at the start of a call). */
void kvd__clear_error(void);

/* Argument checks, shared so both backends accept and refuse the same
 * inputs.  KVD_OK or the first problem found, with its detail set. */
kvd_status_t kvd__check_store(const kvd_store_args_t *a);
kvd_status_t kvd__check_fp8_set(const kvd_fp8_set_args_t *a);
kvd_status_t kvd__check_gather(const kvd_gather_args_t *a);
kvd_status_t kvd__check_transfer(const kvd_transfer_args_t *a);

/* True for KVD_DTYPE_I32 and KVD_DTYPE_I64. */
int kvd__is_index_dtype(int dtype);

#ifdef __cplusplus
}
#endif

#endif /* KVDOCK_KERNELS_INTERNAL_H */
