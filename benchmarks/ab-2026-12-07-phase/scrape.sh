#!/usr/bin/env bash
# scrape.sh RUN: once the run's idle window starts, saves the controller's Kubernetes request counters every 60 s
run=$1; d=/tmp/abr
until grep -q "measuring idle cost" $d/$run.log 2>/dev/null; do sleep 2; done
url=$(python3 -c "import json;print(json.load(open('$d/env-$run/env.json'))['controllerMetricsUrl'])")
i=0
while curl -sf "$url" > $d/$run.metrics.$i.txt; do
  i=$((i+1)); sleep 60
  grep -q "rc=" <(grep "== $run rc" $d/ab4.log) && break
done
