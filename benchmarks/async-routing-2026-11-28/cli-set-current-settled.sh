#!/bin/bash
# The second CLI experiment of BENCHMARKS.md "Temporal's asynchronous routing mode": a dev server
# with matching.deploymentWorkflowVersion=$1 on ports $2..$2+2, two sample workers of one worker
# deployment (b1, b2) running, and the Current switched between them six times, each call 3 s
# after the one before. Prints the wall time of each set-current-version (the CLI process included).
# Run: cli-set-current-settled.sh 2 17243; cli-set-current-settled.sh 0 17233 (TEMPORAL names the
# CLI, SAMPLE_WORKER the worker).
MODE=$1; P=$2; D=${TMPDIR:-/tmp}/cli-set-current-settled-$MODE; rm -rf $D; mkdir -p $D
T=${TEMPORAL:-.tools/venv/bin/temporal}
# EXTRA_DC: more dynamic config, key=value entries separated by spaces.
extra=(); for kv in $EXTRA_DC; do extra+=(--dynamic-config-value "$kv"); done
$T server start-dev --headless --port $P --http-port $((P+1)) --metrics-port $((P+2)) --db-filename $D/db --sqlite-pragma journal_mode=wal --sqlite-pragma synchronous=normal --dynamic-config-value matching.deploymentWorkflowVersion=$MODE "${extra[@]}" > $D/server.log 2>&1 &
for i in $(seq 1 60); do $T operator namespace describe default --address 127.0.0.1:$P >/dev/null 2>&1 && break; sleep 0.5; done
for b in b1 b2; do
  TEMPORAL_ADDRESS=127.0.0.1:$P TEMPORAL_DEPLOYMENT_NAME=exp TEMPORAL_WORKER_BUILD_ID=$b ${SAMPLE_WORKER:-target/release/sample-worker} > $D/w-$b.log 2>&1 &
done
for i in $(seq 1 60); do n=$($T worker deployment describe --name exp --address 127.0.0.1:$P -o json 2>/dev/null | grep -c '"buildId"'); [ "${n:-0}" -ge 2 ] && break; sleep 0.5; done
for r in 1 2 3; do
  for b in b1 b2; do
    sleep 3
    s=$(date +%s%N); $T worker deployment set-current-version --deployment-name exp --build-id $b --address 127.0.0.1:$P -y >/dev/null 2>&1 || echo fail; e=$(date +%s%N)
    echo "mode=$MODE settled $b set-current $(( (e-s)/1000000 )) ms"
  done
done
kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
