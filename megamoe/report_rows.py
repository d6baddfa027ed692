"""Which stored validation rows ``megamoe validate --report`` can use: corrupt lines (not a JSON object)
and unusable rows (bad times or key fields) are left out and counted, named by file and line."""

from __future__ import annotations

import json
import math
from pathlib import Path

#: Longest time one layer may take, us (1000 s): anything above is a unit slip or garbage.
MAX_US = 1e9
#: Rows named one by one in the summary line; the rest are counted.
NAMED = 3


def _time_problem(name: str, v) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v <= MAX_US:
        return f"{name}={v!r} is not a time in (0, {MAX_US:g}] us"
    return None


def row_problem(r: dict) -> str | None:
    """Why the row ``r`` cannot be used (None if it can): its key fields and, where present, its times."""
    T = r.get("T")
    if isinstance(T, bool) or not isinstance(T, int) or T < 0:
        return f"T={T!r} is not a whole number of tokens"
    for k in ("preset", "model", "routing", "backend", "profile", "phase"):
        if r.get(k) is not None and not isinstance(r[k], str):
            return f"{k}={r[k]!r} is not a name"
    for k in ("predicted_us", "measured_us"):
        if r.get(k) is not None and (bad := _time_problem(k, r[k])):
            return bad
    preds = r.get("predictions")
    if preds is not None:
        if not isinstance(preds, dict) or not all(isinstance(p, dict) for p in preds.values()):
            return "predictions is not a table of {profile: {predicted_us: ...}}"
        for name, p in preds.items():
            if p.get("predicted_us") is not None and (bad := _time_problem(f"predictions.{name}.predicted_us",
                                                                           p["predicted_us"])):
                return bad
    for k in ("measured_stages_us", "predicted_stages"):
        v = r.get(k)
        if v is not None and not isinstance(v, dict):
            return f"{k} is not a table"
    meas = r.get("measured_stages_us") or {}
    for name, v in meas.items():  # a stage is a difference of two graph times: it may be small or negative
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"measured_stages_us.{name}={v!r} is not a number"
    return None


def scan(files: list[Path]) -> tuple[list[str], list[str]]:
    """(corrupt lines, unusable rows) of ``files``, each as ``file:line: why``."""
    corrupt, unusable = [], []
    for p in files:
        with open(p, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except (ValueError, RecursionError):
                    corrupt.append(f"{p}:{n}: not a JSON object")
                    continue
                if not isinstance(r, dict):
                    corrupt.append(f"{p}:{n}: not a JSON object")
                elif "T" in r and (why := row_problem(r)):
                    unusable.append(f"{p}:{n}: {why}")
    return corrupt, unusable


def summary(corrupt: list[str], unusable: list[str]) -> list[str]:
    """One line per kind of skipped input, naming the first few (empty when nothing was skipped)."""
    out = []
    for what, items in (("corrupt line(s)", corrupt), ("row(s) with unusable values", unusable)):
        if items:
            more = f"; and {len(items) - NAMED} more" if len(items) > NAMED else ""
            out.append(f"skipped {len(items)} {what}: " + "; ".join(items[:NAMED]) + more)
    return out
