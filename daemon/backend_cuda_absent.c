/* Built without the CUDA toolkit: the cuda backend does not exist. */
#include <stdio.h>

#include "backend.h"

kvd_status_t kvd__backend_cuda_create(uv_loop_t *loop, const kvd__options_t *opts,
                                      kvd__backend_t **out, char *why, size_t why_len)
{
    snprintf(why, why_len, "%s", KVD_NO_CUDA_REASON);
    return KVD_ENOTSUP;
}
