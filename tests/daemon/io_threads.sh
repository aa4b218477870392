#!/usr/bin/env bash
# io_threads: the daemon's suites against kvdockd --io-threads 3.
#
#   io_threads.sh KVDOCKD KVDOCK SUITE...
#
# With --io-threads N the connections are served by N I/O threads, the
# daemon's state under one lock (daemon/shard.h,
# docs/design/event-loop.md).  First a daemon started so must run its
# three I/O threads (kvd-io-1..3), spread eight clients of `kvdock bench`
# over them (each thread's CPU time grows), and exit 0 on SIGTERM.  Then
# each SUITE runs against a wrapper that adds --io-threads 3 to every
# daemon it starts (the client suites find the daemon through
# $KVDOCKD_PATH, the raw-frame suites through $KVDOCKD): every request,
# reply, close and shutdown path those suites drive, with replies written
# by the loop's thread and by I/O threads for the same connections.
# Passes when all of that holds.
set -euo pipefail
daemon=$1
cli=$2
shift 2
work=$(mktemp -d /tmp/kvd-io-threads-XXXXXX)
pid=""
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# CPU ticks (user + system) of each of pid's threads named kvd-io-*
io_ticks() {
  local t
  for t in /proc/"$pid"/task/*; do
    if [ "$(cat "$t/comm")" = "kvd-io-${1}" ]; then
      awk '{print $14 + $15}' "$t/stat"
      return
    fi
  done
  echo missing
}

sock="$work/kvdockd.sock"
"$daemon" --socket "$sock" --backend cpu --host-memory-budget 256M --io-threads 3 \
  >"$work/kvdockd.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
  [ -S "$sock" ] && break
  sleep 0.05
done
if [ ! -S "$sock" ]; then
  echo "io_threads: the daemon did not start"; cat "$work/kvdockd.log"; exit 1
fi
rc=0
for i in 1 2 3; do
  if [ "$(io_ticks $i)" = missing ]; then
    echo "io_threads: no thread kvd-io-$i in the daemon"; rc=1
  fi
done
KVDOCK_SOCKET=$sock "$cli" bench --iterations 3000 --duration 1 --clients 8 --layers 4 --slots 64 >"$work/bench.out"
for i in 1 2 3; do
  t=$(io_ticks $i)
  if [ "$t" = missing ] || [ "$t" -eq 0 ]; then
    echo "io_threads: kvd-io-$i served nothing (CPU ticks: $t)"; rc=1
  fi
done
kill -TERM "$pid"
if wait "$pid"; then
  echo "io_threads: the daemon with 3 I/O threads served 8 clients and exited 0"
else
  echo "io_threads: the daemon exited $? on SIGTERM"; cat "$work/kvdockd.log"; rc=1
fi
pid=""

cat >"$work/kvdockd" <<EOF
#!/bin/sh
exec "$daemon" "\$@" --io-threads 3
EOF
chmod +x "$work/kvdockd"
for suite in "$@"; do
  if ! KVDOCKD_PATH="$work/kvdockd" KVDOCKD="$work/kvdockd" "$suite"; then
    echo "io_threads: $(basename "$suite") failed against kvdockd --io-threads 3"
    rc=1
  fi
done
exit $rc
