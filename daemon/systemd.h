/*
 * systemd integration without libsystemd: socket activation (the
 * listening socket passed as descriptor 3 with LISTEN_PID/LISTEN_FDS) and
 * readiness notification (datagrams to $NOTIFY_SOCKET).  Both follow
 * sd_listen_fds(3) and sd_notify(3); without those variables they do
 * nothing, so the daemon runs the same outside systemd.
 */
#ifndef KVD_DAEMON_SYSTEMD_H
#define KVD_DAEMON_SYSTEMD_H

#include <stddef.h>
#include <stdint.h>

#include "kvdock/status.h"

#define KVD_SD_LISTEN_FDS_START 3

/*
 * The listening socket systemd passed us, if any.  When LISTEN_PID is our
 * pid and LISTEN_FDS >= 1, checks that descriptor 3 is a listening
 * AF_UNIX stream socket, makes it non-blocking and close-on-exec, closes
 * any further passed descriptors, and sets *fd to 3 and path to its
 * address.  LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES are unset either
 * way.  *fd = -1 (and KVD_OK) when the daemon was not socket-activated;
 * an error (why says it) when it was but descriptor 3 is unusable.
 * Call it before any thread starts (it changes the environment).
 */
kvd_status_t kvd__sd_listen_socket(int *fd, char *path, size_t path_len, char *why,
                                   size_t why_len);

/*
 * Send state ("READY=1", "STOPPING=1", "STATUS=...", lines joined by
 * '\n') to $NOTIFY_SOCKET: a path, or an abstract name written '@name'.
 * 0 when NOTIFY_SOCKET is not set, 1 when sent, -errno on failure.
 */
int kvd__sd_notify(const char *state);

/*
 * The watchdog interval systemd expects "WATCHDOG=1" within (WatchdogSec=:
 * $WATCHDOG_USEC, for this process when $WATCHDOG_PID is unset or ours),
 * in microseconds; 0 when there is no watchdog.
 */
uint64_t kvd__sd_watchdog_usec(void);

#endif
