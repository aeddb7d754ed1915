#!/usr/bin/env bash
# Records histories of the engine's own workflows (types `twd`, `rollout`, `notify`) from a Temporal
# server as replay fixtures: workflows/tests/histories/<type>-<scenario>.json, which
# workflows/tests/replay.rs replays against the current workflow code in `cargo test`.
#
# Usage:
#   scripts/record-histories.sh [options] --list
#       List the twd/rollout workflows on the server with the fixture name each would get.
#   scripts/record-histories.sh [options] --auto [PATTERN...]
#       Export every listed workflow whose suggested name matches one of the shell PATTERNs
#       (all of them without PATTERNs), e.g. --auto 'rollout-progressive-v2' 'twd-delete'.
#   scripts/record-histories.sh [options] NAME=WORKFLOW_ID[@RUN_ID]...
#       Export the given workflows as NAME.json. NAME must start with the workflow type.
#
# Options:
#   --address HOST:PORT  Temporal frontend (default: temporalAddress from $TWC_ENV_FILE, which
#                        `twc-sandbox exec` sets)
#   --namespace NS       Namespace of the engine's workflows (default: temporalNamespace from
#                        $TWC_ENV_FILE, else "default")
#   --out DIR            Fixture folder (default: workflows/tests/histories)
#   --force              Overwrite existing fixtures (default: keep them and say so)
#
# Suggested names come from the workflow IDs the controller uses: `twd/<ns>/<name>` becomes
# `twd-<scenario>` and `rollout/<ns>/<name>/<build>` becomes `rollout-<scenario>-<version>`,
# where <scenario> is the Kubernetes namespace without the random suffix the end-to-end tests
# add (`progressive-3fa2c1` -> `progressive`) and <version> the build ID up to its first dash
# (`v2-5d8c...` -> `v2`). Running workflows are fine: their history so far is replayed.
#
# Recording from the end-to-end suite, with the sandbox still up (see workflows/README.md):
#   target/debug/twc-sandbox exec --state-dir /tmp/rec-env -- bash -c \
#     'cargo test --test e2e -- rollout::progressive && scripts/record-histories.sh --auto "*-progressive*"'
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TEMPORAL=${TWC_TEMPORAL_CLI:-${TWC_TOOLS_DIR:-$ROOT/.tools}/venv/bin/temporal}
PYTHON=${PYTHON:-python3}
OUT_DIR=$ROOT/workflows/tests/histories
ADDRESS=""
NAMESPACE=""
MODE=""
FORCE=0
ARGS=()

die() {
  echo "record-histories: $*" >&2
  exit 1
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --address) ADDRESS=${2:?--address needs a value}; shift 2 ;;
    --namespace) NAMESPACE=${2:?--namespace needs a value}; shift 2 ;;
    --out) OUT_DIR=${2:?--out needs a value}; shift 2 ;;
    --force) FORCE=1; shift ;;
    --list) MODE=list; shift ;;
    --auto) MODE=auto; shift ;;
    -h | --help) usage 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
if [[ -z "$MODE" ]]; then
  [[ ${#ARGS[@]} -gt 0 ]] || usage 2
  MODE=explicit
fi

[[ -x "$TEMPORAL" ]] || die "temporal CLI not found at $TEMPORAL (run 'make tools' or set TWC_TEMPORAL_CLI)"
command -v "$PYTHON" > /dev/null || die "$PYTHON not found (set PYTHON)"

# Address and namespace: flags first, then the sandbox's env file.
if [[ -n "${TWC_ENV_FILE:-}" && -f "${TWC_ENV_FILE}" ]]; then
  read -r env_address env_namespace < <("$PYTHON" -c '
import json, sys
env = json.load(open(sys.argv[1]))
print(env.get("temporalAddress", "-"), env.get("temporalNamespace", "-"))' "$TWC_ENV_FILE")
  [[ -n "$ADDRESS" || "$env_address" == "-" ]] || ADDRESS=$env_address
  [[ -n "$NAMESPACE" || "$env_namespace" == "-" ]] || NAMESPACE=$env_namespace
fi
[[ -n "$ADDRESS" ]] || die "no Temporal address: pass --address or run under 'twc-sandbox exec'"
NAMESPACE=${NAMESPACE:-default}

# The CLI runs with a clean environment and an empty home, so neither TEMPORAL_* variables nor a
# CLI profile of the person running this can point it elsewhere.
CLI_HOME=$(mktemp -d)
WORK=$(mktemp -d)
trap 'rm -rf "$CLI_HOME" "$WORK"' EXIT
temporal() {
  env -i PATH="$PATH" HOME="$CLI_HOME" "$TEMPORAL" "$@" --address "$ADDRESS" --namespace "$NAMESPACE"
}

# Prints "<suggested name> <status> <workflow id> <run id>" per twd/rollout/notify run, oldest first.
list_runs() {
  temporal workflow list --query "WorkflowType = 'twd' OR WorkflowType = 'rollout' OR WorkflowType = 'notify'" \
    --limit 10000 --output jsonl > "$WORK/list.jsonl"
  "$PYTHON" - "$WORK/list.jsonl" <<'PY'
import json, re, sys

runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
runs.sort(key=lambda r: r.get("startTime", ""))

def scenario(namespace):
    # End-to-end test namespaces are "<prefix>-<hex suffix>".
    return re.sub(r"-[0-9a-f]{4,}$", "", namespace)

seen = {}
for run in runs:
    workflow_type = run["type"]["name"]
    workflow_id = run["execution"]["workflowId"]
    parts = workflow_id.split("/")
    if workflow_type in ("twd", "notify") and len(parts) == 3:
        name = f"{workflow_type}-{scenario(parts[1])}"
    elif workflow_type == "rollout" and len(parts) == 4:
        name = f"rollout-{scenario(parts[1])}-{parts[3].split('-')[0]}"
    else:
        name = f"{workflow_type}-" + re.sub(r"[^A-Za-z0-9]+", "-", workflow_id).strip("-")
    name = re.sub(r"[^A-Za-z0-9.-]+", "-", name)
    seen[name] = seen.get(name, 0) + 1
    if seen[name] > 1:
        name = f"{name}-{seen[name]}"
    status = run.get("status", "").replace("WORKFLOW_EXECUTION_STATUS_", "").lower()
    print(name, status, workflow_id, run["execution"]["runId"])
PY
}

# export_one NAME WORKFLOW_ID [RUN_ID]
export_one() {
  local name=$1 workflow_id=$2 run_id=${3:-}
  local type=${name%%-*}
  [[ "$name" =~ ^(twd|rollout|notify)-[A-Za-z0-9.-]+$ ]] ||
    die "fixture name $name must be twd-<scenario>, rollout-<scenario> or notify-<scenario> (letters, digits, '.', '-')"
  local target=$OUT_DIR/$name.json
  if [[ -e "$target" && $FORCE -eq 0 ]]; then
    echo "keep    $name.json (exists; --force to overwrite)"
    return 0
  fi
  local raw=$WORK/raw.json
  local run_args=()
  [[ -z "$run_id" ]] || run_args=(--run-id "$run_id")
  temporal workflow show --workflow-id "$workflow_id" "${run_args[@]}" --output json > "$raw" ||
    die "exporting $workflow_id failed"
  # Check it is a whole history of the expected type, and write it one event per line: small,
  # and a re-recording diffs event by event.
  local summary
  summary=$("$PYTHON" - "$raw" "$type" "$WORK/out.json" <<'PY'
import json, sys

raw, expected_type, out = sys.argv[1:4]
history = json.load(open(raw))
events = history.get("events") or []
if not events:
    sys.exit(f"no events in the exported history")
started = events[0].get("workflowExecutionStartedEventAttributes")
if started is None:
    sys.exit("the first event is not WorkflowExecutionStarted")
actual_type = started.get("workflowType", {}).get("name")
if actual_type != expected_type:
    sys.exit(f"workflow type is {actual_type!r}, the fixture name says {expected_type!r}")
ids = [int(e.get("eventId", 0)) for e in events]
if ids != list(range(1, len(events) + 1)):
    sys.exit("event IDs are not consecutive from 1")
with open(out, "w") as f:
    f.write('{"events": [\n')
    f.write(",\n".join(json.dumps(e, separators=(",", ":"), sort_keys=False) for e in events))
    f.write("\n]}\n")
last = events[-1].get("eventType", "").replace("EVENT_TYPE_", "").lower()
print(f"{len(events)} events, last {last}")
PY
) || die "$workflow_id cannot become $name.json"
  mkdir -p "$OUT_DIR"
  mv "$WORK/out.json" "$target"
  echo "wrote   $name.json ($summary, $(wc -c < "$target") bytes) from $workflow_id${run_id:+@$run_id}"
}

case "$MODE" in
  list)
    list_runs > "$WORK/runs.txt"
    { echo "NAME STATUS WORKFLOW_ID RUN_ID"; cat "$WORK/runs.txt"; } | column -t
    ;;
  auto)
    list_runs > "$WORK/runs.txt"
    matched=0
    while read -r name _status workflow_id run_id; do
      if [[ ${#ARGS[@]} -gt 0 ]]; then
        keep=0
        for pattern in "${ARGS[@]}"; do
          # shellcheck disable=SC2053 # the pattern is meant to glob
          [[ "$name" == $pattern ]] && keep=1
        done
        [[ $keep -eq 1 ]] || continue
      fi
      matched=$((matched + 1))
      export_one "$name" "$workflow_id" "$run_id"
    done < "$WORK/runs.txt"
    [[ $matched -gt 0 ]] || die "no twd/rollout/notify workflow matched ${ARGS[*]:-anything} on $ADDRESS"
    ;;
  explicit)
    for arg in "${ARGS[@]}"; do
      [[ "$arg" == *=* ]] || die "expected NAME=WORKFLOW_ID[@RUN_ID], got $arg"
      name=${arg%%=*}
      target=${arg#*=}
      workflow_id=${target%@*}
      run_id=""
      [[ "$target" != *@* ]] || run_id=${target##*@}
      export_one "$name" "$workflow_id" "$run_id"
    done
    ;;
esac
