/*
 * When to poll a socket without sleeping: shared by the daemon's busy
 * polling and the client library's wait for a reply.
 *
 * Polling saves the wake-up from sleep when the answer is quick, and
 * costs a core while it polls.  It pays only while that core is spare: a
 * thread that polls while others wait for a core delays them (the daemon
 * among them, whose answer it is polling for).  So each poller decides
 * from what it observes:
 *
 *   - cores: it polls only while the threads ready to run on the machine
 *     (itself included) are no more than the cores this process may use,
 *     and, of one process's threads, at most cores - 1 poll at once
 *     (one core is left for the peer that answers);
 *   - latency: a window that adapts as haltpoll's does.  An answer that
 *     came within the window leaves it; one that came later but within
 *     the cap doubles it (polling would have caught it); one that came
 *     after the cap halves it (polling was wasted), down to nothing.
 */
#ifndef KVDOCK_SPIN_H
#define KVDOCK_SPIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The smallest window worth polling for, and the first one tried after
 * an answer that polling would have caught. */
#define KVD_SPIN_MIN_NS 4000u

typedef struct kvd__spin {
    uint64_t cap_ns;    /* the configured bound; 0: never poll */
    uint64_t window_ns; /* how long the next wait polls, at most cap_ns */
} kvd__spin_t;

void kvd__spin_init(kvd__spin_t *s, uint64_t cap_ns);
/* The answer came waited_ns after the wait began (polled or not). */
void kvd__spin_learn(kvd__spin_t *s, uint64_t waited_ns);

/* The CPUs this process may run on. */
int kvd__spin_cores(void);
/* Whether a thread may poll now: the machine's ready threads (sampled at
 * most every 500 us, shared by the process's threads) fit its cores.
 * now_ns: CLOCK_MONOTONIC. */
int kvd__spin_cores_free(uint64_t now_ns);
/* Begin polling if fewer than cores - 1 of this process's threads poll
 * now and the cores are free (1: begun; call kvd__spin_end after). */
int kvd__spin_begin(uint64_t now_ns);
void kvd__spin_end(void);

#ifdef __cplusplus
}
#endif

#endif
