"""Stored results read back for notebooks and reports: ``benchmarks/results/<gpu>/<question>/*.jsonl``
(listed in ``benchmarks/results/index.jsonl``); these helpers only select and reshape.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def load_rows(name: str | Path) -> list[dict]:
    """The JSON lines of ``name`` (a path, or a path under benchmarks/results such as ``h200/megakernel/x.jsonl``)."""
    path = Path(name)
    if not path.exists():
        path = RESULTS / name
    if not path.exists():
        raise FileNotFoundError(f"{name}: no such results file (looked in {RESULTS})")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def megakernel_ratios(rows: list[dict]) -> list[dict]:
    """Per bench_megakernel.py row with both backends timed: preset, T, routing, the megakernel's
    time over the floor, and multi-launch time over megakernel time (above 1: the megakernel wins)."""
    out = []
    for r in rows:
        if "megakernel_us" in r and "multi_us" in r:
            out.append({"preset": r["preset"], "T": r["T"], "routing": r.get("routing", "uniform"),
                        "megakernel_over_floor": r["megakernel_us"] / r["floor_us"],
                        "multi_over_megakernel": r["multi_us"] / r["megakernel_us"]})
    return out


def trace_phases(row: dict, variant: str = "default") -> list[dict]:
    """A megakernel_trace.py row's task kinds in ticket order: kind, tasks, first start and last end
    (us from the launch's first task), mean task time (waits included)."""
    kinds = row[variant]["trace"]["kinds"]
    return [{"kind": k, "tasks": d["tasks"], "start_us": d["first_start_us"], "end_us": d["last_end_us"],
             "mean_us": d["mean_us"]} for k, d in kinds.items()]


def machine() -> dict:
    """{"cpu", "cores", "platform"} of this machine, as CPU benchmark rows record it."""
    import os
    import platform

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform()}
