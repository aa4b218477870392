/*
 * The operations of the protocol: the ONE list.  X(name, OP, flags), one
 * row per Request oneof field:
 *   name   the proto field's name and the handler's suffix (kvd__op_name);
 *   OP     the Kvdock__Request__OpCase suffix (KVDOCK__REQUEST__OP_OP);
 *   flags  KVD_OPF_* (dispatch.h): checked before the handler runs.
 * The dispatch table and the handlers' declarations are made from it;
 * an operation's name in replies, logs, stats and metrics is its proto
 * field's (kvd__op_name, from the generated descriptor).  A new operation
 * is a row here, its messages in kvdock.proto and a handler.
 */
#ifndef KVD_DAEMON_OP_LIST_H
#define KVD_DAEMON_OP_LIST_H

#define KVD_OPS(X)                                                                              \
    X(hello, HELLO, 0)                                                                          \
    X(ping, PING, KVD_OPF_HELLO)                                                                \
    X(status, STATUS, KVD_OPF_HELLO)                                                            \
    X(stats, STATS, KVD_OPF_HELLO)                                                              \
    X(pool_create, POOL_CREATE, KVD_OPF_HELLO)                                                  \
    X(pool_export, POOL_EXPORT, KVD_OPF_HELLO)                                                  \
    X(pool_import, POOL_IMPORT, KVD_OPF_HELLO)                                                  \
    X(pool_drop, POOL_DROP, KVD_OPF_HELLO)                                                      \
    X(pool_list, POOL_LIST, KVD_OPF_HELLO)                                                      \
    X(buffer_register, BUFFER_REGISTER, KVD_OPF_HELLO)                                          \
    X(buffer_drop, BUFFER_DROP, KVD_OPF_HELLO)                                                  \
    X(event_register, EVENT_REGISTER, KVD_OPF_HELLO)                                            \
    X(event_drop, EVENT_DROP, KVD_OPF_HELLO)                                                    \
    X(store, STORE, KVD_OPF_HELLO | KVD_OPF_DATA)                                               \
    X(fp8_set, FP8_SET, KVD_OPF_HELLO | KVD_OPF_DATA)                                           \
    X(gather, GATHER, KVD_OPF_HELLO | KVD_OPF_DATA)                                             \
    X(transfer, TRANSFER, KVD_OPF_HELLO | KVD_OPF_DATA)                                         \
    X(cache_create, CACHE_CREATE, KVD_OPF_HELLO)                                                \
    X(cache_drop, CACHE_DROP, KVD_OPF_HELLO)                                                    \
    X(cache_list, CACHE_LIST, KVD_OPF_HELLO)                                                    \
    X(cache_stats, CACHE_STATS, KVD_OPF_HELLO)                                                  \
    X(cache_lookup, CACHE_LOOKUP, KVD_OPF_HELLO)                                                \
    X(cache_save, CACHE_SAVE, KVD_OPF_HELLO | KVD_OPF_DATA)                                     \
    X(cache_load, CACHE_LOAD, KVD_OPF_HELLO | KVD_OPF_DATA)                                     \
    X(cache_evict, CACHE_EVICT, KVD_OPF_HELLO)                                                  \
    X(cache_release, CACHE_RELEASE, KVD_OPF_HELLO)                                              \
    X(cache_key_area, CACHE_KEY_AREA, KVD_OPF_HELLO)                                            \
    X(shutdown, SHUTDOWN, KVD_OPF_HELLO | KVD_OPF_ADMIN)

/*
 * The kinds of work a data operation hands the backend: X(KIND, member,
 * args_t, fn).  The job's union member, its args type, and the kernel
 * library's entry points kvd_cpu_fn and kvd_cuda_fn (kvdock/kernels.h),
 * which both backends call through kvd__job_run (backend.h).
 */
#define KVD_JOBS(X)                                                                             \
    X(STORE, store, kvd_store_args_t, kv_store)                                                 \
    X(FP8_SET, fp8, kvd_fp8_set_args_t, fp8_set)                                                \
    X(GATHER, gather, kvd_gather_args_t, page_table_gather)                                     \
    X(TRANSFER, transfer, kvd_transfer_args_t, kv_transfer)

#endif
