/* systemd socket activation and readiness, without libsystemd: see systemd.h. */
#include "systemd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

static int parse_int(const char *s, long *out)
{
    char *end;
    long v;

    if (s == NULL || *s == '\0')
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

kvd_status_t kvd__sd_listen_socket(int *fd, char *path, size_t path_len, char *why,
                                   size_t why_len)
{
    const char *spid = getenv("LISTEN_PID"), *sfds = getenv("LISTEN_FDS");
    long pid, n, i;
    int fl, val;
    socklen_t len;
    struct sockaddr_un sa;

    *fd = -1;
    if (spid == NULL || sfds == NULL)
        return KVD_OK;
    if (parse_int(spid, &pid) != 0 || pid != (long)getpid()) {
        /* meant for another process (a parent that did not unset them) */
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_FDNAMES");
        return KVD_OK;
    }
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (parse_int(sfds, &n) != 0 || n < 0 || n > INT_MAX - KVD_SD_LISTEN_FDS_START) {
        snprintf(why, why_len, "LISTEN_FDS='%s' is not a count", sfds);
        return KVD_EINVAL;
    }
    if (n == 0)
        return KVD_OK;
    /* one socket is ours; more are a unit mistake: close them */
    for (i = 1; i < n; i++) {
        kvd_log(KVD_LOG_WARN, "event=socket_activation_extra_fd fd=%ld action=closed",
                KVD_SD_LISTEN_FDS_START + i);
        close((int)(KVD_SD_LISTEN_FDS_START + i));
    }
    len = sizeof(val);
    if (getsockopt(KVD_SD_LISTEN_FDS_START, SOL_SOCKET, SO_DOMAIN, &val, &len) != 0) {
        snprintf(why, why_len, "socket activation: descriptor 3 is not a socket: %s",
                 strerror(errno));
        return KVD_EINVAL;
    }
    if (val != AF_UNIX) {
        snprintf(why, why_len, "socket activation: descriptor 3 is not an AF_UNIX socket "
                 "(use ListenStream=/path in the .socket unit)");
        return KVD_EINVAL;
    }
    len = sizeof(val);
    if (getsockopt(KVD_SD_LISTEN_FDS_START, SOL_SOCKET, SO_TYPE, &val, &len) != 0 ||
        val != SOCK_STREAM) {
        snprintf(why, why_len, "socket activation: descriptor 3 is not a stream socket");
        return KVD_EINVAL;
    }
    len = sizeof(val);
    if (getsockopt(KVD_SD_LISTEN_FDS_START, SOL_SOCKET, SO_ACCEPTCONN, &val, &len) != 0 ||
        !val) {
        snprintf(why, why_len, "socket activation: descriptor 3 is not listening "
                 "(Accept=no in the .socket unit)");
        return KVD_EINVAL;
    }
    memset(&sa, 0, sizeof(sa));
    len = sizeof(sa);
    if (getsockname(KVD_SD_LISTEN_FDS_START, (struct sockaddr *)&sa, &len) != 0) {
        snprintf(why, why_len, "socket activation: getsockname: %s", strerror(errno));
        return KVD_EIO;
    }
    if (len <= offsetof(struct sockaddr_un, sun_path) || sa.sun_path[0] == '\0')
        snprintf(path, path_len, "@%.*s", (int)(len > offsetof(struct sockaddr_un, sun_path) + 1
                                                    ? len - offsetof(struct sockaddr_un, sun_path) - 1
                                                    : 0),
                 sa.sun_path + 1);
    else
        snprintf(path, path_len, "%.*s", (int)sizeof(sa.sun_path), sa.sun_path);
    fl = fcntl(KVD_SD_LISTEN_FDS_START, F_GETFL);
    if (fl < 0 || fcntl(KVD_SD_LISTEN_FDS_START, F_SETFL, fl | O_NONBLOCK) != 0 ||
        fcntl(KVD_SD_LISTEN_FDS_START, F_SETFD, FD_CLOEXEC) != 0) {
        snprintf(why, why_len, "socket activation: fcntl: %s", strerror(errno));
        return KVD_EIO;
    }
    *fd = KVD_SD_LISTEN_FDS_START;
    return KVD_OK;
}

int kvd__sd_notify(const char *state)
{
    const char *e = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa;
    socklen_t salen;
    size_t n;
    ssize_t sent;
    int fd, err;

    if (e == NULL || e[0] == '\0')
        return 0;
    n = strlen(e);
    if ((e[0] != '/' && e[0] != '@') || n >= sizeof(sa.sun_path))
        return -EINVAL;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, e, n);
    if (e[0] == '@')
        sa.sun_path[0] = '\0'; /* abstract: the length says where the name ends */
    salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (e[0] == '/' ? 1 : 0));
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    do {
        sent = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
    } while (sent < 0 && errno == EINTR);
    err = sent < 0 ? -errno : 1;
    close(fd);
    if (err < 0)
        kvd_log(KVD_LOG_WARN, "event=sd_notify_failed socket=%s error=\"%s\"", e, strerror(-err));
    return err;
}

uint64_t kvd__sd_watchdog_usec(void)
{
    const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
    unsigned long long v;
    char *end;

    if (usec == NULL || usec[0] == '\0')
        return 0;
    if (pid != NULL && pid[0] != '\0' && strtol(pid, NULL, 10) != (long)getpid())
        return 0;
    errno = 0;
    v = strtoull(usec, &end, 10);
    if (errno != 0 || *end != '\0')
        return 0;
    return v;
}
