#!/usr/bin/env bash
# Runs COMMAND at the lowest CPU priority: SCHED_IDLE (`chrt --idle 0`, util-linux), which gives
# it a CPU only when nothing else on the machine wants one, and nice 19 (alone where SCHED_IDLE
# cannot be set). Child processes inherit both. `make test` runs its compiles beside the Go
# builds this way, and its checks beside the end-to-end tests (scripts/beside.sh).
#
# Usage: scripts/lowest.sh COMMAND [ARG...]
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 COMMAND [ARG...]" >&2
    exit 2
fi
if chrt --idle 0 true 2>/dev/null; then
    exec chrt --idle 0 nice -n 19 "$@"
fi
exec nice -n 19 "$@"
