/* Status codes to words, both made from the one table in kvdock/status.h. */
#include "kvdock/status.h"
#include "kvdock/types.h"

const char *kvd_strerror(int status)
{
    switch (status) {
#define KVD_STATUS_MSG_(name, num, msg) \
    case num:                           \
        return msg;
        KVD_STATUS_MAP(KVD_STATUS_MSG_)
#undef KVD_STATUS_MSG_
    }
    return "unknown status";
}

const char *kvd_err_name(int status)
{
    switch (status) {
#define KVD_STATUS_NAME_(name, num, msg) \
    case num:                            \
        return #name;
        KVD_STATUS_MAP(KVD_STATUS_NAME_)
#undef KVD_STATUS_NAME_
    }
    return "UNKNOWN";
}

const char *kvd_mem_kind_name(int kind)
{
    switch (kind) {
    case KVD_MEM_HOST: return "host";
    case KVD_MEM_DEVICE: return "device";
    case KVD_MEM_DEVICE_VMM: return "device-vmm";
    default: return "unknown";
    }
}
