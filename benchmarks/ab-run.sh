#!/usr/bin/env bash
# Alternated A/B runs of `twc-bench`: each RUN starts a fresh sandbox whose controller is the old
# or the new build, after its name's prefix; the harness is the same for both.
#
# usage: ab-run.sh RUN...            (RUN = old1, new1, ...; run them alternated)
# In AB_DIR (default /tmp/ab21): twc-old, twc-new (release builds of `twc`), twc-old-wrapper (how
# the old build is started, e.g. ../benchmarks/ab-2026-12-02b/twc-old-wrapper), and bin/ with the
# harness (twc-sandbox, twc-bench, sample-worker). Each run writes AB_DIR/RUN.json, RUN.md, RUN.log.
# The scenario is the environment's BENCH_* variables (e.g. BENCH_SCENARIOS=burst); AB_OLD_ENV and
# AB_NEW_ENV add variables to one side's runs (e.g. AB_NEW_ENV=TWC_MAX_CACHED_WORKFLOWS=50).
# AB_SAMPLE=1 also samples the controller's VmRSS, RssAnon and RssFile (kB) every 0.5 s into
# AB_DIR/RUN.rss.txt. TWC_TOOLS_DIR defaults to this checkout's .tools.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${AB_DIR:-/tmp/ab21}
export TWC_TOOLS_DIR=${TWC_TOOLS_DIR:-$here/.tools}

sample() {
  local pidfile=$dir/env-$1/controller.pid out=$dir/$1.rss.txt pid
  until [[ -s $pidfile ]]; do sleep 0.2; done
  pid=$(cat "$pidfile")
  while [[ -r /proc/$pid/status ]]; do
    awk -v t="$(date +%s.%N)" '/^VmRSS|^RssAnon|^RssFile/ {a[$1] = $2}
      END {print t, a["VmRSS:"], a["RssAnon:"], a["RssFile:"]}' "/proc/$pid/status" >> "$out" 2>/dev/null
    sleep 0.5
  done
}

cd "$here"
for run in "$@"; do
  case $run in
    old*) cp -f "$dir/twc-old-wrapper" "$dir/bin/twc"; bin=$dir/twc-old; side_env=${AB_OLD_ENV:-} ;;
    new*) cp -f "$dir/twc-new" "$dir/bin/twc"; bin=$dir/twc-new; side_env=${AB_NEW_ENV:-} ;;
    *) echo "a run's name starts with old or new: $run" >&2; exit 2 ;;
  esac
  # The benchmark rewrites its Markdown file between its markers: give it a copy.
  cp -f BENCHMARKS.md "$dir/$run.md"
  rm -rf "$dir/env-$run" "$dir/$run.rss.txt"
  echo "== $run ${BENCH_SCENARIOS:-} $side_env $(date -u +%FT%TZ) $(sha256sum "$bin" 2>/dev/null | cut -c1-16)"
  if [[ ${AB_SAMPLE:-0} == 1 ]]; then sample "$run" & fi
  # shellcheck disable=SC2086 # side_env is a list of NAME=VALUE words
  env $side_env BENCH_JSON="$dir/$run.json" BENCH_MARKDOWN="$dir/$run.md" \
    "$dir/bin/twc-sandbox" exec --state-dir "$dir/env-$run" -- "$dir/bin/twc-bench" > "$dir/$run.log" 2>&1
  echo "== $run rc=$? $(date -u +%FT%TZ)"
  wait
done
