/*
 * Structured logging: one line per event, key=value fields, to stderr.
 *
 *   kvd_log(KVD_LOG_INFO, "event=conn_open client=%" PRIu64, id);
 *
 * prints "ts=2026-12-02T10:00:00.123Z level=info event=conn_open client=7".
 * The level is checked before anything is formatted.
 */
#ifndef KVD_DAEMON_LOG_H
#define KVD_DAEMON_LOG_H

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kvd__log_level {
    KVD_LOG_ERROR = 0,
    KVD_LOG_WARN = 1,
    KVD_LOG_INFO = 2,
    KVD_LOG_DEBUG = 3,
} kvd__log_level_t;

extern int kvd__log_level;

#define kvd_log(level, ...)                                                     \
    do {                                                                        \
        if ((int)(level) <= kvd__log_level)                                     \
            kvd__log_write((level), __VA_ARGS__);                               \
    } while (0)

void kvd__log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "error", "warn", "info", "debug"; -1 for anything else. */
int kvd__log_level_parse(const char *name);

/* Format a message into err[len] (nothing when err is NULL or len 0). */
void kvd__seterr(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *kvd__log_level_name(int level);

/* At most one line a second for an event that can repeat without end (a
 * client flood, descriptors exhausted): kvd__ratelimit_take says whether a
 * line may be written now and how many were held back since the last. */
typedef struct kvd__ratelimit {
    uint64_t last_ns;
    uint64_t held;
} kvd__ratelimit_t;

int kvd__ratelimit_take(kvd__ratelimit_t *rl, uint64_t now_ns, uint64_t *held_back);

/* Copy s into buf (len bytes) as a log value: quoted when it holds spaces,
 * '=' or quotes, with control characters and quotes escaped. */
const char *kvd__log_quote(const char *s, char *buf, size_t len);

#endif
