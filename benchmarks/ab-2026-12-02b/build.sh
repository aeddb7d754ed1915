#!/usr/bin/env bash
set -u
export CARGO_TARGET_DIR=/tmp/ab21/target CARGO_INCREMENTAL=0 CARGO_TERM_COLOR=never
s=$SECONDS
(cd /tmp/ab21/old-src && cargo build --release --locked --bin twc) > /tmp/ab21/build-old.log 2>&1
echo "old rc=$? $((SECONDS-s)) s"
cp /tmp/ab21/target/release/twc /tmp/ab21/twc-old
s=$SECONDS
(cd /work/main && cargo build --release --locked --bin twc) > /tmp/ab21/build-new.log 2>&1
echo "new rc=$? $((SECONDS-s)) s"
cp /tmp/ab21/target/release/twc /tmp/ab21/twc-new
