/*
 * The suites' one skip convention:
 *
 *  - a whole test that cannot run here prints "SKIP: reason" on a line of
 *    its own and exits 77 (ctest's SKIP_RETURN_CODE: reported skipped);
 *  - one case of a suite that cannot run here calls kvt_skip_case, which
 *    prints "SKIP: case: reason" on a line of its own; the suite goes on.
 *
 * deploy/test.sh names every skipped test and case with its reason, and
 * with KVD_NO_SKIP_LABEL=label set at configure time (.ci/run sets cpu)
 * ctest fails a test of that label that prints a SKIP line or exits 77.
 */
#ifndef KVDOCK_TEST_COMMON_KVT_SKIP_H
#define KVDOCK_TEST_COMMON_KVT_SKIP_H

#include <stdarg.h>
#include <stdio.h>

__attribute__((format(printf, 2, 3))) static inline void kvt_skip_case(const char *name,
                                                                        const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    fflush(stderr);
    printf("\nSKIP: %s: ", name);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

#endif /* KVDOCK_TEST_COMMON_KVT_SKIP_H */
