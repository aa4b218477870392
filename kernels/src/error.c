/* Per-thread detail of the last failed call, so concurrent callers (the
 * daemon's workers, Python threads) never see each other's messages. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

static _Thread_local char detail[512];

const char *kvd_last_error_detail(void)
{
    return detail;
}

kvd_status_t kvd__fail(kvd_status_t st, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    /* vsnprintf truncates and terminates; a cut message beats none. */
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    return st;
}

void kvd__clear_error(void)
{
    detail[0] = '\0';
}
