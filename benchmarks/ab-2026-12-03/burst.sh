#!/usr/bin/env bash
# Burst-only alternated A/B: a fresh sandbox per run, the release harness of HEAD for both.
# usage: burst.sh RUN...   (RUN = old1, new1, ...)
set -u
cd /work/main
for run in "$@"; do
  which=${run%[0-9]}
  rm -f /tmp/ab21/bin/twc
  if [[ $which == old ]]; then cp /tmp/ab21/twc-old-wrapper /tmp/ab21/bin/twc; bin=/tmp/ab21/twc-old; else cp /tmp/ab21/twc-new /tmp/ab21/bin/twc; bin=/tmp/ab21/twc-new; fi
  cp -f /work/main/BENCHMARKS.md /tmp/ab21/$run.md
  rm -rf /tmp/ab21/env-$run
  echo "== $run burst $(date -u +%FT%TZ) $(sha256sum $bin | cut -c1-16)"
  BENCH_SCENARIOS=burst BENCH_BURST_TWDS=100 \
  BENCH_JSON=/tmp/ab21/$run.json BENCH_MARKDOWN=/tmp/ab21/$run.md \
  TWC_TOOLS_DIR=/work/main/.tools \
    /tmp/ab21/bin/twc-sandbox exec --state-dir /tmp/ab21/env-$run -- /tmp/ab21/bin/twc-bench > /tmp/ab21/$run.log 2>&1
  echo "== $run rc=$? $(date -u +%FT%TZ)"
done
