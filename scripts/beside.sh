#!/usr/bin/env bash
# Runs CHECKS (one shell command) at the lowest CPU priority beside the command given after it,
# and exits non-zero when either failed. `make test` uses it to run the checks that need no
# server (lint, unit tests, deploy checks) while the end-to-end tests run: those leave about a
# quarter of the CPUs idle (waiting on servers, watches and timers), and at the lowest priority
# (SCHED_IDLE and nice 19) the checks take only that share. The checks' lines are
# printed as they come, prefixed with "[beside]".
#
# Usage: scripts/beside.sh CHECKS COMMAND [ARG...]
set -uo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: $0 CHECKS COMMAND [ARG...]" >&2
    exit 2
fi
checks=$1
shift

# From empty caches the checks compile every dependency again (clippy, the unit tests, the
# deploy checks). On 2026-11-28 they did so at nice 19 beside the tests: the load average stood
# at 9, the Temporal dev server's writes timed out and three tests timed out waiting (README,
# "make test from empty caches"). SCHED_IDLE (chrt, util-linux; nice 19 where it does not work)
# runs the checks only when no test process wants a CPU, which nice 19 does not promise.
# BESIDE_JOBS, when set, caps the checks' compile jobs (CARGO_BUILD_JOBS); unset, cargo's default.
if chrt --idle 0 true 2>/dev/null; then
    lowest=(chrt --idle 0 nice -n 19)
else
    lowest=(nice -n 19)
fi
rc_file=$(mktemp "${TMPDIR:-/tmp}/beside-rc.XXXXXX")
trap 'rm -f "$rc_file"' EXIT
(
    if [[ -n "${BESIDE_JOBS:-}" ]]; then
        export CARGO_BUILD_JOBS=$BESIDE_JOBS
    fi
    "${lowest[@]}" bash -c "$checks" 2>&1 | sed -u 's/^/[beside] /'
    echo "${PIPESTATUS[0]}" > "$rc_file"
) &
checks_pid=$!

"$@"
main_rc=$?

wait "$checks_pid"
checks_rc=$(cat "$rc_file")
checks_rc=${checks_rc:-1}
if [[ "$checks_rc" != 0 ]]; then
    echo "beside: the checks run beside failed (exit $checks_rc): $checks" >&2
fi
if [[ "$main_rc" != 0 ]]; then
    exit "$main_rc"
fi
exit "$checks_rc"
