/* When to poll a socket without sleeping: see kvdock/spin.h. */
#define _GNU_SOURCE
#include "spin.h"

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#define SAMPLE_NS 500000u

void kvd__spin_init(kvd__spin_t *s, uint64_t cap_ns)
{
    s->cap_ns = cap_ns;
    s->window_ns = cap_ns;
}

void kvd__spin_learn(kvd__spin_t *s, uint64_t waited_ns)
{
    if (s->cap_ns == 0 || waited_ns <= s->window_ns)
        return;
    if (waited_ns <= s->cap_ns) {
        uint64_t w = s->window_ns < KVD_SPIN_MIN_NS ? KVD_SPIN_MIN_NS : 2 * s->window_ns;
        s->window_ns = w < s->cap_ns ? w : s->cap_ns;
    } else {
        s->window_ns /= 2;
        if (s->window_ns < KVD_SPIN_MIN_NS)
            s->window_ns = 0;
    }
}

/* Process-wide state, shared by every client and thread (atomics). */
static int g_cores;          /* CPUs this process may run on; 0: not yet known */
static int g_unreadable;     /* /proc/loadavg cannot be opened */
static int g_polling;        /* threads polling now */
static uint64_t g_sampled;   /* when g_free was sampled */
static int g_free = 1;       /* the last sample: ready threads <= cores */

int kvd__spin_cores(void)
{
    int n = __atomic_load_n(&g_cores, __ATOMIC_RELAXED);

    if (n == 0) {
        cpu_set_t set;

        CPU_ZERO(&set);
        n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
        if (n <= 0) {
            long c = sysconf(_SC_NPROCESSORS_ONLN);
            n = c > 0 ? (int)c : 1;
        }
        __atomic_store_n(&g_cores, n, __ATOMIC_RELAXED);
    }
    return n;
}

/* Threads ready to run on the machine now (the 4th field of /proc/loadavg,
 * "running/total"), or -1 when it cannot be read.  Opened for each sample:
 * a library keeps no descriptor of its own open in its caller's process. */
static int ready_threads(void)
{
    char buf[128], *p;
    ssize_t n;
    int spaces = 0, fd;

    if (__atomic_load_n(&g_unreadable, __ATOMIC_RELAXED))
        return -1;
    fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        __atomic_store_n(&g_unreadable, 1, __ATOMIC_RELAXED);
        return -1;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    for (p = buf; *p != '\0' && spaces < 3; p++)
        spaces += *p == ' ';
    if (spaces < 3 || *p < '0' || *p > '9')
        return -1;
    return (int)strtol(p, NULL, 10);
}

int kvd__spin_cores_free(uint64_t now_ns)
{
    uint64_t at = __atomic_load_n(&g_sampled, __ATOMIC_RELAXED);

    if (now_ns - at >= SAMPLE_NS &&
        __atomic_compare_exchange_n(&g_sampled, &at, now_ns, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {
        int r = ready_threads();
        /* unreadable: the count of this process's pollers alone decides */
        __atomic_store_n(&g_free, r < 0 || r <= kvd__spin_cores(), __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&g_free, __ATOMIC_RELAXED);
}

int kvd__spin_begin(uint64_t now_ns)
{
    int max = kvd__spin_cores() - 1;

    if (max < 1 || !kvd__spin_cores_free(now_ns))
        return 0;
    if (__atomic_add_fetch(&g_polling, 1, __ATOMIC_ACQ_REL) > max) {
        __atomic_sub_fetch(&g_polling, 1, __ATOMIC_ACQ_REL);
        return 0;
    }
    return 1;
}

void kvd__spin_end(void)
{
    __atomic_sub_fetch(&g_polling, 1, __ATOMIC_ACQ_REL);
}
