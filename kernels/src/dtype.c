/* Element sizes and names of kvd_dtype_t, and the library's ABI version. */
#include "internal.h"

size_t kvd_dtype_size(int dtype)
{
    switch (dtype) {
    case KVD_DTYPE_U8:
    case KVD_DTYPE_E4M3:
    case KVD_DTYPE_E5M2:
        return 1;
    case KVD_DTYPE_F16:
    case KVD_DTYPE_BF16:
        return 2;
    case KVD_DTYPE_I32:
    case KVD_DTYPE_F32:
        return 4;
    case KVD_DTYPE_I64:
        return 8;
    }
    return 0;
}

const char *kvd_dtype_name(int dtype)
{
    switch (dtype) {
    case KVD_DTYPE_U8:
        return "u8";
    case KVD_DTYPE_I32:
        return "i32";
    case KVD_DTYPE_I64:
        return "i64";
    case KVD_DTYPE_F32:
        return "f32";
    case KVD_DTYPE_F16:
        return "f16";
    case KVD_DTYPE_BF16:
        return "bf16";
    case KVD_DTYPE_E4M3:
        return "e4m3";
    case KVD_DTYPE_E5M2:
        return "e5m2";
    }
    return "unknown";
}

int kvd__is_index_dtype(int dtype)
{
    return dtype == KVD_DTYPE_I32 || dtype == KVD_DTYPE_I64;
}

int kvd_kernels_abi_version(void)
{
    return KVD_KERNELS_ABI_VERSION;
}
