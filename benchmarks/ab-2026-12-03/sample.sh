#!/usr/bin/env bash
# sample.sh RUN: every 0.5 s, the controller's RssAnon/RssFile (kB) while env-RUN's controller lives
run=$1; f=/tmp/ab21/env-$run/controller.pid
until [[ -s $f ]]; do sleep 0.2; done
pid=$(cat $f); out=/tmp/ab21/$run.rss
while [[ -r /proc/$pid/status ]]; do
  awk -v t=$(date +%s.%N) '/^RssAnon|^RssFile|^VmRSS/{a[$1]=$2} END{print t, a["VmRSS:"], a["RssAnon:"], a["RssFile:"]}' /proc/$pid/status >> $out 2>/dev/null
  sleep 0.5
done
