#!/usr/bin/env bash
# Idle-only alternated A/B: a fresh sandbox per run; new runs with TWC_MAX_CACHED_WORKFLOWS=$NEW_CACHE.
set -u
cd /work/main
for run in "$@"; do
  which=${run%[0-9]}
  rm -f /tmp/ab21/bin/twc
  if [[ $which == old ]]; then cp /tmp/ab21/twc-old-wrapper /tmp/ab21/bin/twc; bin=/tmp/ab21/twc-old; cache=100; else cp /tmp/ab21/twc-new /tmp/ab21/bin/twc; bin=/tmp/ab21/twc-new; cache=$NEW_CACHE; fi
  cp -f /work/main/BENCHMARKS.md /tmp/ab21/$run.md
  rm -rf /tmp/ab21/env-$run
  echo "== $run idle cache=$cache $(date -u +%FT%TZ) $(sha256sum $bin | cut -c1-16)"
  TWC_MAX_CACHED_WORKFLOWS=$cache BENCH_SCENARIOS=idle BENCH_IDLE_SECONDS=300 BENCH_IDLE_TWDS=200 \
  BENCH_JSON=/tmp/ab21/$run.json BENCH_MARKDOWN=/tmp/ab21/$run.md \
  TWC_TOOLS_DIR=/work/main/.tools \
    /tmp/ab21/bin/twc-sandbox exec --state-dir /tmp/ab21/env-$run -- /tmp/ab21/bin/twc-bench > /tmp/ab21/$run.log 2>&1
  echo "== $run rc=$? $(date -u +%FT%TZ)"
done
