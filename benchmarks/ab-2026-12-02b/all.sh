#!/usr/bin/env bash
while ! grep -q '^new rc=' /tmp/ab21/build.times; do sleep 5; done
sleep 2
sha256sum /tmp/ab21/twc-old /tmp/ab21/twc-new > /tmp/ab21/shas.txt
/tmp/ab21/run.sh latency,steps,change-burst old1 new1 old2 new2 old3 new3
/tmp/ab21/run.sh burst,idle old4 new4
echo ALLDONE
