/*
 * One factor for every time bound of the C suites: KVD_TEST_TIME_SCALE
 * (an integer >= 1, default 1).  The harness raises it where the code
 * under test runs slower than on an idle machine: valgrind_daemon.sh
 * multiplies it by 5, deploy/test.sh sets it for the sanitizer tree and
 * on a loaded machine.  A bound on how long something may take is written
 * KVT_MS(n): n milliseconds on an idle machine.
 */
#ifndef KVDOCK_TEST_COMMON_KVT_TIME_H
#define KVDOCK_TEST_COMMON_KVT_TIME_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline int kvt_time_scale(void)
{
    static int scale;

    if (scale == 0) {
        const char *s = getenv("KVD_TEST_TIME_SCALE");
        char *end = NULL;
        long v = s != NULL ? strtol(s, &end, 10) : 1;

        if (s != NULL && (end == s || *end != '\0' || v < 1 || v > 1000)) {
            fprintf(stderr, "KVD_TEST_TIME_SCALE=%s is not an integer from 1 to 1000\n", s);
            exit(2);
        }
        scale = (int)v;
    }
    return scale;
}

#define KVT_MS(n) ((int64_t)(n) * kvt_time_scale())

#endif /* KVDOCK_TEST_COMMON_KVT_TIME_H */
