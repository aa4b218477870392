#!/usr/bin/env bash
# The request path beside a raw Unix socket: start kvdockd on a temporary
# socket, run bench_reqpath against it (which runs its own raw echo server
# in the same run), stop the daemon.
#
#   tests/bench/bench_reqpath.sh [BUILD_DIR] [-- BENCH_REQPATH-OPTIONS...]
#
#   BUILD_DIR         a build tree (default build); its daemon/kvdockd and
#                     tests/bench/bench_reqpath are used
#   -- ...            options for bench_reqpath (--clients 1,8,64 --seconds 1
#                     --rounds 3 --window 32 --cases closed,spinraw,pipelined)
#   $KVDOCKD_ARGS     more options for the daemon (e.g. --busy-poll-us 0)
#   $KVDOCK_SPIN_US   the client library's spin, as for any client
#
# Each row ends with the CPU time of the daemon's loop thread per request
# ("loop ... us/req"): 1e6 over it is the most one loop thread serves.
#
# The daemon runs the cpu backend with --host-memory-budget 256M: the
# request path is the same on every backend, and a one-slot transfer
# between host pools keeps the device out of the figures.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build="$root/build"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; args=("$@"); break ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) build=$1; shift ;;
  esac
done
daemon="$build/daemon/kvdockd"
bench="$build/tests/bench/bench_reqpath"
for f in "$daemon" "$bench"; do
  if [ ! -x "$f" ]; then
    echo "bench_reqpath.sh: $f is not an executable (build first)" >&2
    exit 1
  fi
done
tmp=$(mktemp -d /tmp/kvdock-reqpath-XXXXXX)
sock="$tmp/run/kvdockd.sock"
pid=""
# shellcheck disable=SC2317 # called by the EXIT trap
stop() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap stop EXIT
trap 'exit 130' INT TERM
# shellcheck disable=SC2086 # options, split on spaces
"$daemon" --socket "$sock" --backend cpu --host-memory-budget 256M --max-clients 1024 \
  ${KVDOCKD_ARGS:-} >"$tmp/kvdockd.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
  [ -S "$sock" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
if [ ! -S "$sock" ]; then
  echo "bench_reqpath.sh: kvdockd did not come up; its log:" >&2
  cat "$tmp/kvdockd.log" >&2
  exit 1
fi
echo "bench_reqpath.sh: kvdockd ${KVDOCKD_ARGS:-(defaults)}, KVDOCK_SPIN_US=${KVDOCK_SPIN_US:-(default)}" >&2
"$bench" --socket "$sock" --daemon-pid "$pid" ${args[@]+"${args[@]}"}
