#!/usr/bin/env bash
# Puts Debian's `prometheus` binary into a folder (default .tools/bin) without installing the
# package system-wide: `apt-get download` the .deb, unpack it with `dpkg-deb -x`, copy the one
# binary. The sandbox starts it for canary analysis (`twc-sandbox up --prometheus`).
#
# Usage: scripts/install-prometheus.sh [BIN_DIR]
# Idempotent: does nothing when BIN_DIR/prometheus is there and runs `--version`.
set -euo pipefail

bin_dir=${1:-"$(cd "$(dirname "$0")/.." && pwd)/.tools/bin"}
target="$bin_dir/prometheus"

if [[ -x "$target" ]] && "$target" --version >/dev/null 2>&1; then
    exit 0
fi

for tool in apt-get dpkg-deb; do
    if ! command -v "$tool" >/dev/null; then
        echo "install-prometheus: $tool not found; this script needs a Debian-based system" >&2
        exit 1
    fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# As root, apt-get downloads as user _apt, which must be able to write the folder (else it
# warns and downloads as root).
if [[ $(id -u) -eq 0 ]] && id _apt >/dev/null 2>&1; then
    chown _apt "$work"
fi

download() {
    (cd "$work" && apt-get download prometheus)
}

if ! download; then
    # A fresh machine has no package lists: fetch them once (root only) and retry.
    if [[ $(id -u) -eq 0 ]]; then
        echo "install-prometheus: apt-get download failed; running apt-get update and retrying" >&2
        apt-get update -qq
        download
    else
        echo "install-prometheus: apt-get download prometheus failed; run 'sudo apt-get update' and retry" >&2
        exit 1
    fi
fi

debs=("$work"/prometheus_*.deb)
if [[ ! -f "${debs[0]}" ]]; then
    echo "install-prometheus: apt-get download left no prometheus_*.deb in $work" >&2
    exit 1
fi
dpkg-deb -x "${debs[0]}" "$work/root"
if [[ ! -x "$work/root/usr/bin/prometheus" ]]; then
    echo "install-prometheus: ${debs[0]##*/} has no usr/bin/prometheus" >&2
    exit 1
fi

mkdir -p "$bin_dir"
# Copy then rename, so a concurrent run never sees a half-written binary.
cp "$work/root/usr/bin/prometheus" "$target.tmp"
mv -f "$target.tmp" "$target"
"$target" --version | head -n 1
