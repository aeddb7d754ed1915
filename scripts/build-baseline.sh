#!/usr/bin/env bash
# Builds `twc` at the release the upgrade test starts from (tests/e2e/baseline_upgrade.rs) and
# prints the binary's path on stdout (everything else goes to stderr).
#
# TWC_BASELINE_REF         the release: a tag, branch or commit of this clone (default v0.1.0)
# TWC_BASELINE_TARGET_DIR  cargo's target dir for it (default: the build under test's,
#                          CARGO_TARGET_DIR or target/ of this clone), so the dependencies the
#                          two builds have in common are compiled once (below)
#
# The binary is cached by commit in ~/.cache/twc/baseline/<commit>/twc, outside the clone: once
# it is there this script only resolves the ref. Otherwise the tree at the ref is exported
# (`git archive`, into a temporary folder) and its `twc` is built (debug) from its own sources,
# Cargo.toml and Cargo.lock (`--locked`), with two things taken from this clone so that cargo
# finds the dependencies already compiled by `make build` in the shared target dir instead of
# compiling them again (from empty caches that was a full dependency build of its own, 303 s of
# `make test` on 2026-12-03, benchmarks/make-test-empty-caches-2026-12-03.log):
# - this clone's [profile] settings, given as `--config profile...` (config beats a manifest's
#   profile); a dependency's compiled unit is reused only at the same opt-level and debug info;
# - the dependency features of a build with dev-dependencies, as `make build` has them (its
#   `test-hooks` feature turns on what the dev-dependencies ask for, see Cargo.toml): the
#   release's replay test target (`--test replay`, small) is built beside `twc` so cargo
#   resolves the features with the dev-dependencies, which the release's own `test-hooks` did
#   not yet do. Features change no dependency's behaviour that the release relies on, and the
#   release's `twc` itself is built without the test hooks, as released.
# Neither changes the release's code. Its workspace crates live at the exported tree's path, so
# their compiled units never collide with the build under test's; only the binary cargo copies
# to <target>/debug/twc would, and the build under test's is put back after the build.
#
# Usage: scripts/build-baseline.sh
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
ref=${TWC_BASELINE_REF:-v0.1.0}
target_dir=${TWC_BASELINE_TARGET_DIR:-${CARGO_TARGET_DIR:-$repo/target}}
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

# This clone's [profile] tables as cargo `--config` arguments (profile.dev.opt-level=1, ...).
mapfile -t profile_config < <(python3 - "$repo/Cargo.toml" <<'PY'
import json, re, sys, tomllib

def walk(path, value):
    if isinstance(value, dict):
        for key, inner in value.items():
            part = key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)
            yield from walk(path + [part], inner)
    else:
        yield "--config=" + ".".join(path) + "=" + json.dumps(value)

with open(sys.argv[1], "rb") as manifest:
    for argument in walk(["profile"], tomllib.load(manifest).get("profile", {})):
        print(argument)
PY
)
# The release's replay test, when it has one (see above).
dev_target=()
if [[ -f "$work/workflows/tests/replay.rs" ]]; then
    dev_target=(--test replay)
fi

# The build under test's uplifted binary and its dep-info, put back after the release's build.
uplifted=$target_dir/debug/twc
saved=$(mktemp -d "${TMPDIR:-/tmp}/twc-baseline-saved.XXXXXX")
for file in "$uplifted" "$uplifted.d"; do
    if [[ -e "$file" ]]; then
        ln "$file" "$saved/" 2>/dev/null || cp -p "$file" "$saved/"
    fi
done
restore() {
    for file in "$uplifted" "$uplifted.d"; do
        name=$(basename "$file")
        if [[ -e "$saved/$name" ]]; then
            ln -f "$saved/$name" "$file" 2>/dev/null || cp -p "$saved/$name" "$file"
        else
            rm -f "$file"
        fi
    done
}
# On every exit, the build's failure included (the binary is cached before it).
trap 'restore; rm -rf "$work" "$saved"' EXIT

started=$SECONDS
(cd "$work" && CARGO_TARGET_DIR=$target_dir "$cargo" build --locked --workspace \
    --bin twc "${dev_target[@]}" "${profile_config[@]}") >&2
echo "build-baseline: built in $((SECONDS - started)) s" >&2

mkdir -p "$cache/$commit"
cp "$uplifted" "$binary.tmp.$$"
mv -f "$binary.tmp.$$" "$binary"
echo "$binary"
