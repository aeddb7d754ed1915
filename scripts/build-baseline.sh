#!/usr/bin/env bash
# Builds `twc` at the release the upgrade test starts from (tests/e2e/baseline_upgrade.rs) and
# prints the binary's path on stdout (everything else goes to stderr).
#
# TWC_BASELINE_REF         the release: a tag, branch or commit of this clone (default v0.1.0)
# TWC_BASELINE_TARGET_DIR  cargo's target dir for it (default ~/.cache/twc/baseline-target):
#                          a dir of its own, so the build under test's binaries are never
#                          overwritten, and kept between runs, so a new release rebuilds only
#                          the workspace crates
#
# The binary is cached by commit in ~/.cache/twc/baseline/<commit>/twc, outside the clone: once
# it is there this script only resolves the ref. Otherwise the tree at the ref is exported
# (`git archive`, into a temporary folder) and built as it is, its own Cargo.toml and Cargo.lock
# (`cargo build --bin twc --locked`, debug).
#
# Usage: scripts/build-baseline.sh
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
ref=${TWC_BASELINE_REF:-v0.1.0}
target_dir=${TWC_BASELINE_TARGET_DIR:-$HOME/.cache/twc/baseline-target}
cache=$HOME/.cache/twc/baseline
cargo=${CARGO:-cargo}

# A clone made without tags still finds a release by the commit scripts/releases.txt records.
commit=$(git -C "$repo" rev-parse --verify --quiet "$ref^{commit}" || true)
if [[ -z "$commit" ]]; then
    recorded=$(awk -v r="$ref" '$1 == r { print $2 }' "$repo/scripts/releases.txt" 2>/dev/null || true)
    if [[ -n "$recorded" ]]; then
        commit=$(git -C "$repo" rev-parse --verify --quiet "$recorded^{commit}" || true)
    fi
fi
if [[ -z "$commit" ]]; then
    cat >&2 <<EOF
build-baseline: TWC_BASELINE_REF=$ref is not a commit of the clone $repo.
The upgrade test runs the last release's controller, then this build, over the same workflows.
Fetch the release tags (git fetch --tags origin), or set TWC_BASELINE_REF to the tag, branch or
commit to upgrade from (e.g. TWC_BASELINE_REF=\$(git rev-parse HEAD) before the first release).
EOF
    exit 1
fi

binary=$cache/$commit/twc
if [[ -x "$binary" ]]; then
    echo "$binary"
    exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/twc-baseline.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "build-baseline: building twc at $ref ($commit) in $work, target dir $target_dir" >&2
git -C "$repo" archive "$commit" | tar -x -C "$work"
# git archive stamps every file with the commit's time. Cargo decides freshness by comparing a
# crate's source mtimes with its last build, and the workspace crates of two commits of the same
# version share their unit names in the target dir: an older commit's sources would look
# unchanged since the last baseline build and its binary would be reused. Sources stamped now
# are always rebuilt (once per commit: the binary is cached).
find "$work" -type f -exec touch {} +
started=$SECONDS
(cd "$work" && CARGO_TARGET_DIR=$target_dir "$cargo" build --bin twc --locked) >&2
echo "build-baseline: built in $((SECONDS - started)) s" >&2

mkdir -p "$cache/$commit"
cp "$target_dir/debug/twc" "$binary.tmp.$$"
mv -f "$binary.tmp.$$" "$binary"
echo "$binary"
