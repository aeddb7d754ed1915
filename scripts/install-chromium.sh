#!/usr/bin/env bash
# Makes sure Debian's headless browser for the dashboard's browser tests is on this machine:
# /usr/bin/chromium and /usr/bin/chromedriver (packages `chromium` and `chromium-driver`, one
# version, so the driver always matches the browser). Does nothing when both exist; otherwise
# installs them with apt-get (as root, or through sudo), running `apt-get update` once when a
# fresh machine has no package lists.
#
# Usage: scripts/install-chromium.sh
set -euo pipefail

if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
    exit 0
fi

if ! command -v apt-get >/dev/null; then
    echo "install-chromium: chromium and chromedriver are missing and apt-get is not here;" \
        "install Chromium and its matching chromedriver as /usr/bin/chromium and /usr/bin/chromedriver" >&2
    exit 1
fi

as_root=()
if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null; then
        echo "install-chromium: not root and no sudo; run 'apt-get install chromium chromium-driver' as root" >&2
        exit 1
    fi
    as_root=(sudo)
fi

install() {
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-confold chromium chromium-driver
}
if ! install; then
    echo "install-chromium: apt-get install failed; running apt-get update and retrying" >&2
    "${as_root[@]}" apt-get update -qq
    install
fi

for binary in /usr/bin/chromium /usr/bin/chromedriver; do
    if [[ ! -x $binary ]]; then
        echo "install-chromium: the packages are installed but $binary is missing" >&2
        exit 1
    fi
done
