#!/usr/bin/env bash
set -u
cd /work/main
for run in "$@"; do
  which=${run%[0-9]}
  rm -f /tmp/ab21/bin/twc
  if [[ $which == old ]]; then cp /tmp/ab21/twc-old-wrapper /tmp/ab21/bin/twc; else cp /tmp/ab21/twc-new /tmp/ab21/bin/twc; fi
  rm -rf /tmp/ab21/env-$run
  echo "== $run $(date -u +%FT%TZ)"
  BENCH_SCENARIOS=idle BENCH_IDLE_SECONDS=300 BENCH_IDLE_TWDS=200 \
  BENCH_JSON=/tmp/ab21/$run.json BENCH_MARKDOWN=/tmp/ab21/$run.md \
  TWC_TOOLS_DIR=/work/main/.tools \
    /tmp/ab21/bin/twc-sandbox exec --state-dir /tmp/ab21/env-$run -- /tmp/ab21/bin/twc-bench > /tmp/ab21/$run.log 2>&1
  echo "== $run rc=$? $(date -u +%FT%TZ)"
done
