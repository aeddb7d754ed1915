#!/usr/bin/env bash
# Makes sure PostgreSQL's server binaries are on this machine, for the sandbox's production-like
# Temporal (twc_sandbox::production), which starts a private cluster of its own (initdb into its
# state folder, a loopback port) and never the system service.
#
# Does nothing when /usr/lib/postgresql/<version>/bin/initdb exists (or $TWC_POSTGRES_BIN_DIR
# names a folder with it) and, as root, the `postgres` user exists (PostgreSQL refuses to run as
# root; the sandbox runs it as that user). Otherwise installs Debian's `postgresql` package with
# apt-get (as root, or through sudo), telling postgresql-common not to create its `main` cluster.
#
# Usage: scripts/install-postgres.sh
set -euo pipefail

have_binaries() {
    if [[ -n "${TWC_POSTGRES_BIN_DIR:-}" ]]; then
        [[ -x "$TWC_POSTGRES_BIN_DIR/initdb" ]]
        return
    fi
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

if have_binaries && { [[ $(id -u) -ne 0 ]] || id postgres >/dev/null 2>&1; }; then
    exit 0
fi

if ! command -v apt-get >/dev/null; then
    echo "install-postgres: no PostgreSQL found and apt-get is missing; install PostgreSQL's server" \
        "binaries and set TWC_POSTGRES_BIN_DIR to their folder" >&2
    exit 1
fi

as_root=()
if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null; then
        echo "install-postgres: not root and no sudo; run 'apt-get install postgresql' as root" >&2
        exit 1
    fi
    as_root=(sudo)
fi

# No `main` cluster and no service of the package's own: the sandbox runs private clusters.
if [[ ! -e /etc/postgresql-common/createcluster.conf ]]; then
    "${as_root[@]}" mkdir -p /etc/postgresql-common
    echo "create_main_cluster = false" | "${as_root[@]}" tee /etc/postgresql-common/createcluster.conf >/dev/null
fi

install() {
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-confold postgresql
}
if ! install; then
    # A fresh machine has no package lists: fetch them once and retry.
    echo "install-postgres: apt-get install failed; running apt-get update and retrying" >&2
    "${as_root[@]}" apt-get update -qq
    install
fi

if ! have_binaries; then
    echo "install-postgres: postgresql is installed but no /usr/lib/postgresql/*/bin/initdb was found" >&2
    exit 1
fi
ls -d /usr/lib/postgresql/*/bin | tail -n 1
