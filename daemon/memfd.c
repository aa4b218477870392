/* Host memory shared by descriptor: sealed memfds, created or mapped. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"

#ifdef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE_ MADV_POPULATE_WRITE
#else
#define MADV_POPULATE_WRITE_ 23 /* Linux 5.14 */
#endif

static uint64_t page_round(uint64_t n)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

    return (n + page - 1) / page * page;
}

kvd_status_t kvd__memfd_create(const char *label, uint64_t bytes, int *fd_out, void **ptr_out,
                               uint64_t *map_out, char *why, size_t why_len)
{
    char name[80];
    uint64_t map_bytes;
    int fd, rc;
    void *p;

    if (bytes == 0 || bytes > (uint64_t)INT64_MAX / 2) {
        snprintf(why, why_len, "bad size %" PRIu64, bytes);
        return KVD_EINVAL;
    }
    map_bytes = page_round(bytes);
    snprintf(name, sizeof(name), "kvdock-%s", label ? label : "mem");
    fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        snprintf(why, why_len, "memfd_create: %s", strerror(errno));
        return errno == ENOMEM || errno == EMFILE || errno == ENFILE ? KVD_ENOMEM : KVD_EIO;
    }
    if (ftruncate(fd, (off_t)map_bytes) != 0) {
        snprintf(why, why_len, "ftruncate %" PRIu64 ": %s", map_bytes, strerror(errno));
        goto fail_nomem;
    }
    /* Reserve the pages now: touching an unbacked page of a full tmpfs
     * later would be a SIGBUS in the daemon. */
    do {
        rc = posix_fallocate(fd, 0, (off_t)map_bytes);
    } while (rc == EINTR);
    if (rc != 0) {
        snprintf(why, why_len, "cannot reserve %" PRIu64 " bytes: %s", map_bytes, strerror(rc));
        goto fail_nomem;
    }
    /* Clients get this descriptor: none may shrink it under our mapping. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        snprintf(why, why_len, "F_ADD_SEALS: %s", strerror(errno));
        close(fd);
        return KVD_EIO;
    }
    p = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(why, why_len, "mmap %" PRIu64 ": %s", map_bytes, strerror(errno));
        goto fail_nomem;
    }
    *fd_out = fd;
    *ptr_out = p;
    *map_out = map_bytes;
    return KVD_OK;
fail_nomem:
    close(fd);
    return KVD_ENOMEM;
}

kvd_status_t kvd__memfd_map(int fd, uint64_t bytes, void **ptr_out, uint64_t *map_out, char *why,
                            size_t why_len)
{
    struct stat st;
    int seals;
    uint64_t map_bytes;
    void *p;

    if (fd < 0) {
        snprintf(why, why_len, "no descriptor");
        return KVD_ENULL;
    }
    if (bytes == 0 || bytes > (uint64_t)INT64_MAX / 2) {
        snprintf(why, why_len, "bad size %" PRIu64, bytes);
        return KVD_EINVAL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "descriptor is not a memfd");
        return KVD_EINVAL;
    }
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        snprintf(why, why_len, "memfd must be sealed with F_SEAL_SHRINK");
        return KVD_EPERM;
    }
    if ((uint64_t)st.st_size < bytes) {
        snprintf(why, why_len, "memfd holds %" PRIu64 " bytes, %" PRIu64 " claimed",
                 (uint64_t)st.st_size, bytes);
        return KVD_ERANGE;
    }
    map_bytes = page_round(bytes);
    if (map_bytes > (uint64_t)st.st_size)
        map_bytes = bytes; /* the last partial page maps whole anyway */
    p = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(why, why_len, "mmap: %s", strerror(errno));
        return errno == ENOMEM ? KVD_ENOMEM : KVD_EPERM;
    }
    /* Fault every page in now: a client's memfd whose pages cannot be had
     * later (hugetlb pool exhausted) must fail this import, not raise
     * SIGBUS in a worker thread.  Kernels before 5.14 lack the advice. */
    if (madvise(p, map_bytes, MADV_POPULATE_WRITE_) != 0 && errno != EINVAL) {
        snprintf(why, why_len, "populating the memfd: %s", strerror(errno));
        munmap(p, map_bytes);
        return KVD_ENOMEM;
    }
    *ptr_out = p;
    *map_out = map_bytes;
    return KVD_OK;
}
