/*
 * The cluster's front door, on the links (link.h): the listener and its
 * caps on connections without proof, the reads and their limits before
 * the proof, the proof itself (config.h), refusals, the exchange of lane
 * addresses after it, connecting to peers, pings.  door.c's header says
 * what each limit is.
 */
#ifndef KVD_DAEMON_CLUSTER_DOOR_H
#define KVD_DAEMON_CLUSTER_DOOR_H

#include "link.h"

/* The front door's socket, listening on the configured address (a daemon
 * restarted listens again at once: SO_REUSEADDR); -errno on failure.
 * kvd__door_open has the loop accept on it. */
int kvd__door_socket(const kvd__links_t *ls);
void kvd__door_open(kvd__links_t *ls, int fd);
/* Connect to peers that have no link, ping those up, close links that
 * never proved the secret in time or read nothing of what they are sent. */
void kvd__door_tick(kvd__links_t *ls, uint64_t now);
/* Close every link and the listener (the daemon finishes). */
void kvd__door_close(kvd__links_t *ls);
/* Close l for why, logged and counted, telling the other side why. */
void kvd__door_refuse(kvd__link_t *l, const char *why);

#endif
