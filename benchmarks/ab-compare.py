#!/usr/bin/env python3
"""Compare alternated A/B runs of `twc-bench` (BENCH_JSON files) figure by figure.

usage: ab-compare.py DIR [RUN...]

Reads DIR/<RUN>.json for each RUN (default: old1 new1 ... old9 new9, those that exist). A run
whose name starts with "old" is side A, "new" side B. Prints a Markdown table of every figure
any run has (p50 / p95 for a distribution, the value for a single figure), then one line per
figure: each side's range and median over its runs, B's median against A's, and whether the
two ranges overlap. Figures a run lacks are left out of its side.
"""
import json
import os
import sys

# (JSON path, name, format). A path ending at a distribution ({"n", "median", "p95", ...})
# compares its median; a path ending at a number compares the number.
FIGURES = [
    ("latency.watch_reaction_ms", "reaction from the watch event (ms)", "%.0f"),
    ("latency.reaction_ms", "reaction from the apply (ms)", "%.0f"),
    ("latency.promotion_ms", "promotion (ms)", "%.0f"),
    ("latency.available_to_current_ms", "Available → Current (ms)", "%.0f"),
    ("latency.apply_to_ready_ms", "apply → Ready (ms)", "%.0f"),
    ("latency.status_lag_ms", "status in step, AllAtOnce (ms)", "%.0f"),
    ("latency.rollout_history_events", "events per rollout", "%.0f"),
    ("steps.overshoot_ms", "step hold − pause (ms)", "%.0f"),
    ("steps.ramp_status_lag_ms", "ramp step shown (ms)", "%.0f"),
    ("steps.current_status_lag_ms", "Progressive Current shown (ms)", "%.0f"),
    ("change_burst.last_created_ms", "burst of 20: last Deployment (ms)", "%.0f"),
    ("change_burst.created_spread_ms", "burst of 20: spread (ms)", "%.0f"),
    ("change_burst.all_current_ms", "burst of 20: every build Current (ms)", "%.0f"),
    ("change_burst.all_ready_ms", "burst of 20: every TWD Ready (ms)", "%.0f"),
    ("burst.all_ready_after_last_poller_s", "burst of 100: every TWD Ready after the last first poller (s)", "%.1f"),
    ("burst.all_ready_after_apply_s", "burst of 100: every TWD Ready after the apply (s)", "%.1f"),
    ("burst.last_poller_after_apply_s", "burst of 100: last first poller after the apply (s)", "%.1f"),
    ("burst.ready_after_apply_s", "burst of 100: one TWD's apply → Ready (s)", "%.1f"),
    ("burst.peak_server_reads_per_s", "burst: reads served by Temporal, highest 10 s mean (/s)", "%.1f"),
    ("burst.mean_server_reads_per_s", "burst: reads served by Temporal, mean (/s)", "%.1f"),
    ("burst.rate_limited_calls", "burst: calls refused for rate or concurrency limits", "%.0f"),
    ("burst.busy_refusals", "burst: busy refusals (retried)", "%.0f"),
    ("burst.controller_peak_rss_mib", "burst: controller peak RSS (MiB)", "%.1f"),
    ("burst.controller_cpu_s", "burst: controller CPU (s)", "%.2f"),
    ("burst.temporal_cpu_s", "burst: dev server CPU (s)", "%.1f"),
    ("burst.other_cpu_s", "burst: every other process's CPU (s)", "%.1f"),
    ("burst.machine_busy_pct", "burst: machine busy (%)", "%.1f"),
    ("idle.reads_per_twd_per_5min", "idle: reads per TWD per 5 min", "%.2f"),
    ("idle.server_reads_per_min", "idle: reads served a minute", "%.1f"),
    ("idle.kube_requests_per_twd_per_min", "idle: Kubernetes requests per TWD a minute", "%.2f"),
    ("idle.controller_cpu_pct", "idle: controller CPU (%)", "%.2f"),
    ("idle.controller_cpu_pct.mean", "idle: controller CPU, mean over the window (%)", "%.2f"),
    ("idle.controller_rss_mib", "idle: controller RSS (MiB)", "%.1f"),
    ("idle.twd_workflows.events_per_twd_per_5min", "idle: TWD workflow events per TWD per 5 min", "%.2f"),
]


def lookup(run, path):
    value = run
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def cell(value, fmt):
    """The table's text for a value, and the number its side is compared by (None: absent)."""
    if isinstance(value, dict):
        if not value.get("n"):
            return "–", None
        return f"{fmt % value['median']} / {fmt % value['p95']}", value["median"]
    if isinstance(value, (int, float)):
        return fmt % value, value
    return "–", None


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    folder = argv[1]
    names = argv[2:] or [f"{side}{i}" for i in range(1, 10) for side in ("old", "new")]
    runs = [name for name in names if os.path.exists(os.path.join(folder, f"{name}.json"))]
    if not runs:
        sys.exit(f"no run's JSON in {folder} among {' '.join(names)}")
    data = {}
    for name in runs:
        with open(os.path.join(folder, f"{name}.json"), encoding="utf-8") as file:
            data[name] = json.load(file)
    present = [f for f in FIGURES if any(cell(lookup(data[r], f[0]), f[2])[1] is not None for r in runs)]

    print("| figure (p50 / p95, or the value) | " + " | ".join(runs) + " |")
    print("|---" * (len(runs) + 1) + "|")
    for path, name, fmt in present:
        print(f"| {name} | " + " | ".join(cell(lookup(data[r], path), fmt)[0] for r in runs) + " |")
    print()
    for path, name, fmt in present:
        sides = {}
        for side in ("old", "new"):
            values = [cell(lookup(data[r], path), fmt)[1] for r in runs if r.startswith(side)]
            sides[side] = [v for v in values if v is not None]
        old, new = sides["old"], sides["new"]
        if not old or not new:
            continue
        mo, mn = median(old), median(new)
        change = f"{100 * (mn / mo - 1):+.0f} %" if mo else "old is 0"
        overlap = "overlap" if not (min(new) > max(old) or max(new) < min(old)) else "apart"
        print(
            f"{name}: old {fmt % min(old)}–{fmt % max(old)} (median {fmt % mo}, {len(old)} runs), "
            f"new {fmt % min(new)}–{fmt % max(new)} (median {fmt % mn}, {len(new)} runs), "
            f"new/old {change}, ranges {overlap}"
        )


if __name__ == "__main__":
    main(sys.argv)
