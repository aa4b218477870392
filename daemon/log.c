/* Structured logging to stderr: see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int kvd__log_level = KVD_LOG_INFO;

/* 1 when stderr is systemd's journal (JOURNAL_STREAM names its device and
 * inode): each line then starts with its syslog priority, "<3>" to "<7>",
 * which the journal takes as the line's level and strips; -1: not known. */
static int to_journal = -1;

static int stderr_is_journal(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;

    return js != NULL && sscanf(js, "%llu:%llu", &dev, &ino) == 2 &&
           fstat(STDERR_FILENO, &st) == 0 && (unsigned long long)st.st_dev == dev &&
           (unsigned long long)st.st_ino == ino;
}

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int kvd__log_level_parse(const char *name)
{
    int i;

    for (i = 0; i < 4; i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

const char *kvd__log_level_name(int level)
{
    return level >= 0 && level < 4 ? level_names[level] : "unknown";
}

void kvd__log_write(int level, const char *fmt, ...)
{
    char line[1024];
    struct timeval tv;
    struct tm tm;
    size_t n;
    int m;
    va_list ap;

    static const char prio[] = {'3', '4', '6', '7'}; /* err, warning, info, debug */

    if (to_journal < 0)
        to_journal = stderr_is_journal();
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    n = 0;
    if (to_journal && level >= 0 && level < 4) {
        line[n++] = '<';
        line[n++] = prio[level];
        line[n++] = '>';
    }
    n += strftime(line + n, sizeof(line) - n, "ts=%Y-%m-%dT%H:%M:%S", &tm);
    m = snprintf(line + n, sizeof(line) - n, ".%03dZ level=%s ", (int)(tv.tv_usec / 1000),
                 kvd__log_level_name(level));
    if (m > 0)
        n += (size_t)m;
    va_start(ap, fmt);
    m = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    n += (size_t)m;
    if (n > sizeof(line) - 2)
        n = sizeof(line) - 2; /* truncated: still one line */
    line[n++] = '\n';
    fwrite(line, 1, n, stderr); /* one write per line: lines never interleave */
}

const char *kvd__log_quote(const char *s, char *buf, size_t len)
{
    size_t i = 0;
    int quote = 0;
    const char *p;

    if (len < 3) {
        if (len > 0)
            buf[0] = '\0';
        return buf;
    }
    if (s == NULL)
        s = "";
    for (p = s; *p; p++)
        if (*p == ' ' || *p == '=' || *p == '"' || (unsigned char)*p < 0x20)
            quote = 1;
    if (*s == '\0')
        quote = 1;
    if (quote)
        buf[i++] = '"';
    for (p = s; *p && i + 4 < len; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') {
            buf[i++] = '\\';
            buf[i++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            buf[i++] = '?';
        } else {
            buf[i++] = (char)c;
        }
    }
    if (quote)
        buf[i++] = '"';
    buf[i] = '\0';
    return buf;
}

void kvd__seterr(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || len == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

int kvd__ratelimit_take(kvd__ratelimit_t *rl, uint64_t now_ns, uint64_t *held_back)
{
    if (rl->last_ns != 0 && now_ns - rl->last_ns < 1000000000ull) {
        rl->held++;
        return 0;
    }
    *held_back = rl->held;
    rl->held = 0;
    rl->last_ns = now_ns;
    return 1;
}
