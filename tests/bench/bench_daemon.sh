#!/usr/bin/env bash
# The daemon benchmark: start kvdockd on a temporary socket, run `kvdock
# bench --json` and tests/bench/bench_paths --json against it, keep the
# figures, stop the daemon.
#
#   tests/bench/bench_daemon.sh [KVDOCKD] [--kvdock PATH] [--bench-paths PATH]
#                               [--backend cuda|cpu|auto] [--out DIR] [-- BENCH-OPTIONS...]
#
#   KVDOCKD             the daemon (default: build/daemon/kvdockd of this tree)
#   --kvdockd PATH      the same, as an option
#   --kvdock PATH       the CLI (default: client/kvdock beside the daemon's build)
#   --bench-paths PATH  bench_paths (default: tests/bench/bench_paths beside it)
#   --backend B         the daemon's backend (default auto: cuda when a GPU is usable)
#   --out DIR           where the results go (default $OUT, else the current folder)
#   -- ...              options for `kvdock bench` (--iterations, --duration, ...)
#   $KVDOCKD_ARGS       more options for the daemon (e.g. --cuda-completion loop)
#   $BENCH_PATHS_ARGS   options for bench_paths (e.g. --layers 2 --iterations 20)
#
# Writes DIR/bench_daemon.json and DIR/bench_paths.json (one JSON object
# each: every figure, with the targets and their verdicts) and
# DIR/kvdockd.log.  Exit status: the benches'
# (0 when every case ran, targets met or not), or 1 when the daemon would
# not start.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
daemon=""
cli=""
paths=""
backend=auto
out="${OUT:-}"
bench_args=()

while [ $# -gt 0 ]; do
  case "$1" in
    --kvdockd) daemon=$2; shift 2 ;;
    --kvdockd=*) daemon=${1#*=}; shift ;;
    --kvdock) cli=$2; shift 2 ;;
    --kvdock=*) cli=${1#*=}; shift ;;
    --bench-paths) paths=$2; shift 2 ;;
    --bench-paths=*) paths=${1#*=}; shift ;;
    --backend) backend=$2; shift 2 ;;
    --backend=*) backend=${1#*=}; shift ;;
    --out) out=$2; shift 2 ;;
    --out=*) out=${1#*=}; shift ;;
    --) shift; bench_args=("$@"); break ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench_daemon.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) daemon=$1; shift ;;
  esac
done

[ -n "$daemon" ] || daemon="$root/build/daemon/kvdockd"
[ -n "$cli" ] || cli="$(cd "$(dirname "$daemon")/.." && pwd)/client/kvdock"
[ -n "$paths" ] || paths="$(cd "$(dirname "$daemon")/.." && pwd)/tests/bench/bench_paths"
[ -n "$out" ] || out=$(pwd)
for f in "$daemon" "$cli" "$paths"; do
  if [ ! -x "$f" ]; then
    echo "bench_daemon.sh: $f is not an executable (build first, or pass its path)" >&2
    exit 1
  fi
done
mkdir -p "$out"

tmp=$(mktemp -d /tmp/kvdock-bench-XXXXXX)
sock="$tmp/run/kvdockd.sock"
log="$out/kvdockd.log"
pid=""

# shellcheck disable=SC2317 # called by the EXIT trap
stop_daemon() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "bench_daemon.sh: kvdockd did not stop on SIGTERM; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  fi
  pid=""
  rm -rf "$tmp"
}
trap stop_daemon EXIT
trap 'exit 130' INT TERM

# KVDOCKD_ARGS: more daemon options (e.g. --cuda-completion loop).
# shellcheck disable=SC2086
"$daemon" --socket "$sock" --backend "$backend" ${KVDOCKD_ARGS:-} >"$log" 2>&1 &
pid=$!
up=0
for _ in $(seq 200); do
  if ! kill -0 "$pid" 2>/dev/null; then
    break
  fi
  if "$cli" --socket "$sock" ping >/dev/null 2>&1; then
    up=1
    break
  fi
  sleep 0.05
done
if [ "$up" != 1 ]; then
  echo "bench_daemon.sh: kvdockd did not come up on $sock; its log:" >&2
  cat "$log" >&2
  exit 1
fi
echo "bench_daemon.sh: kvdockd pid $pid, backend $backend, socket $sock" >&2

rc=0
"$cli" --socket "$sock" bench --json ${bench_args[@]+"${bench_args[@]}"} \
  >"$out/bench_daemon.json" || rc=$?
if [ "$rc" = 0 ]; then
  # shellcheck disable=SC2086 # options, split on spaces
  "$paths" --socket "$sock" --json ${BENCH_PATHS_ARGS:-} >"$out/bench_paths.json" || rc=$?
fi
if [ "$rc" = 0 ]; then
  echo "bench_daemon.sh: figures in $out/bench_daemon.json and $out/bench_paths.json" >&2
else
  echo "bench_daemon.sh: a bench failed (exit $rc); daemon log in $log" >&2
fi
exit "$rc"
