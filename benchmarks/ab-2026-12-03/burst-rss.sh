#!/usr/bin/env bash
for run in "$@"; do rm -f /tmp/ab21/$run.rss; (/tmp/ab21/sample.sh $run &) ; /tmp/ab21/burst.sh $run; done
