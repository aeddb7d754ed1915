#!/usr/bin/env bash
set -u
cd /work/main
s=$SECONDS; make tools > /tmp/ab21/tools.log 2>&1; echo "tools rc=$? $((SECONDS-s)) s"
export CARGO_TARGET_DIR=/tmp/ab21/target CARGO_INCREMENTAL=0 CARGO_TERM_COLOR=never
s=$SECONDS; cargo build --release --locked --workspace --bins > /tmp/ab21/build-new.log 2>&1; echo "new rc=$? $((SECONDS-s)) s"
cp /tmp/ab21/target/release/twc /tmp/ab21/twc-new
for b in twc-sandbox twc-bench sample-worker; do cp /tmp/ab21/target/release/$b /tmp/ab21/bin/; done
s=$SECONDS; (cd /tmp/ab21/old-src && cargo build --release --locked --bin twc) > /tmp/ab21/build-old.log 2>&1; echo "old rc=$? $((SECONDS-s)) s"
cp /tmp/ab21/target/release/twc /tmp/ab21/twc-old
cp benchmarks/ab-2026-12-02b/twc-old-wrapper /tmp/ab21/
sha256sum /tmp/ab21/twc-old /tmp/ab21/twc-new
