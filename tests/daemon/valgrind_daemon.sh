#!/usr/bin/env bash
# valgrind_daemon: the daemon's integration session under valgrind.
#
#   valgrind_daemon.sh KVDOCKD [+]SUITE...
#
# (the client suites find the daemon through $KVDOCKD_PATH, the raw-frame
# daemon suites through $KVDOCKD: both point at the valgrind wrapper)
#
# Runs each client SUITE (check_client_ops: a session doing every
# operation: hello, ping, status, stats, pool create/list/export/import/
# drop, buffers, events, store, fp8 set, gather, transfer) against kvdockd
# started under
#   valgrind --leak-check=full --errors-for-leak-kinds=definite
# (with valgrind-ucx.supp: defects inside UCX, named there) (the suites start the daemon through $KVDOCKD_PATH, here a wrapper that
# execs valgrind), and SIGTERM at the end: the daemon drains and exits, and
# valgrind reports.  Passes when every suite passes and every valgrind log
# says 0 errors and no definite leak; a SUITE written +SUITE kills some of
# its daemons with SIGKILL on purpose (check_cluster: a node dies
# mid-pull), so its logs without a summary are those and pass.  Exit 77
# (skipped, with the reason) when valgrind is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
daemon=$1
shift
if ! command -v valgrind >/dev/null 2>&1; then
  echo "SKIP: valgrind not installed (deploy/setup.sh installs it)"
  exit 77
fi
work=$(mktemp -d /tmp/kvd-valgrind-XXXXXX)
trap 'rm -rf "$work"' EXIT
cat >"$work/kvdockd" <<EOF
#!/bin/sh
exec valgrind --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=99 \\
  --show-leak-kinds=definite --track-fds=no --num-callers=30 \\
  --suppressions="$here/valgrind-ucx.supp" \\
  --log-file="$work/vg.\${KVD_VG_SUITE:-0}.%p.log" "$daemon" --disk-io threads "\$@"
EOF
chmod +x "$work/kvdockd"

rc=0
n=0
killed_ok=" "
for suite in "$@"; do
  n=$((n + 1))
  if [ "${suite#+}" != "$suite" ]; then
    suite=${suite#+}
    killed_ok="$killed_ok$n "
  fi
  # valgrind runs the daemon many times slower: every time bound 5 times longer
  if ! KVD_VG_SUITE=$n KVDOCKD_PATH="$work/kvdockd" KVDOCKD="$work/kvdockd" \
      KVD_TEST_TIME_SCALE=$((${KVD_TEST_TIME_SCALE:-1} * 5)) CK_DEFAULT_TIMEOUT=600 "$suite"; then
    echo "valgrind_daemon: $(basename "$suite") failed against the daemon under valgrind"
    rc=1
  fi
done

logs=("$work"/vg.*.log)
if [ ! -e "${logs[0]}" ]; then
  echo "valgrind_daemon: no valgrind log: the daemon never ran under valgrind"
  exit 1
fi
for log in "${logs[@]}"; do
  errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' "$log" | tail -n 1)
  definite=$(sed -n 's/.*definitely lost: \([0-9,]*\) bytes.*/\1/p' "$log" | tail -n 1 | tr -d ,)
  echo "valgrind_daemon: $(basename "$log"): errors=${errors:-?} definitely_lost=${definite:-0} bytes"
  grep -E 'in use at exit|total heap usage|definitely lost|indirectly lost|possibly lost' "$log" \
    | sed 's/^==[0-9]*== */  /' || true
  suite_of=$(basename "$log" | cut -d. -f2)
  if [ -z "$errors" ] && [ "${killed_ok#* "$suite_of" }" != "$killed_ok" ]; then
    echo "  (a daemon its suite killed on purpose: no summary)"
  elif [ -z "$errors" ]; then
    echo "valgrind_daemon: $log has no error summary (did the daemon exit?)"
    cat "$log"
    rc=1
  elif [ "$errors" != 0 ] || [ "${definite:-0}" != 0 ]; then
    cat "$log"
    rc=1
  fi
done
exit $rc
