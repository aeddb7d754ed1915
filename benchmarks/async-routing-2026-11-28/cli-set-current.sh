#!/bin/bash
# The CLI experiment of BENCHMARKS.md "Temporal's asynchronous routing mode": a dev server with
# matching.deploymentWorkflowVersion=$1 on ports $2..$2+2, five sample workers of one worker deployment
# started one after another; each build made Current with the temporal CLI as soon as describe lists it,
# then 4 s of rest. Prints the wall time of each set-current-version (the CLI process included).
# With a third argument `manager`, the manager identity is set to `me` before b2's call and every
# call is made as `me` (cli-set-current-manager.txt).
# Run: cli-set-current.sh 2 17253; cli-set-current.sh 0 17263 (TEMPORAL names the CLI, SAMPLE_WORKER the worker).
MODE=$1; P=$2; D=${TMPDIR:-/tmp}/cli-set-current-$MODE; rm -rf $D; mkdir -p $D
T=${TEMPORAL:-.tools/venv/bin/temporal}
$T server start-dev --headless --port $P --http-port $((P+1)) --metrics-port $((P+2)) --db-filename $D/db --sqlite-pragma journal_mode=wal --sqlite-pragma synchronous=normal --dynamic-config-value matching.deploymentWorkflowVersion=$MODE > $D/server.log 2>&1 &
SP=$!
for i in $(seq 1 60); do $T operator namespace describe default --address 127.0.0.1:$P >/dev/null 2>&1 && break; sleep 0.5; done
for b in b1 b2 b3 b4 b5; do
  TEMPORAL_ADDRESS=127.0.0.1:$P TEMPORAL_DEPLOYMENT_NAME=exp TEMPORAL_WORKER_BUILD_ID=$b ${SAMPLE_WORKER:-target/release/sample-worker} > $D/w-$b.log 2>&1 &
  for i in $(seq 1 100); do $T worker deployment describe --name exp --address 127.0.0.1:$P -o json 2>/dev/null | grep -q "\"$b\"" && break; sleep 0.1; done
  as=()
  if [ "$3" = manager ]; then
    as=(--identity me)
    [ $b = b2 ] && $T worker deployment manager-identity set --deployment-name exp --manager-identity me --identity me --address 127.0.0.1:$P -y > $D/mgr.log 2>&1
  fi
  s=$(date +%s%N); $T worker deployment set-current-version "${as[@]}" --deployment-name exp --build-id $b --address 127.0.0.1:$P -y >/dev/null 2>&1 || echo fail; e=$(date +%s%N)
  echo "mode=$MODE fresh $b set-current $(( (e-s)/1000000 )) ms"
  sleep 4
done
kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
