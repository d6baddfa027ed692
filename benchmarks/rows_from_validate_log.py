"""Rebuild a validation's rows from its log, where the rows themselves were lost.

    python benchmarks/rows_from_validate_log.py benchmarks/results/validation_2026-12-01_run29

Reads DIR/validate.log (``megamoe validate``'s progress lines: preset, T, routing, backend, the
prediction from the run's first profile and from h200, the measurement, the error) and DIR/preflight.txt
(GPU, versions, commit) and writes DIR/validation_from_log.jsonl, one row per configuration with
``"from_log": true``: enough for ``megamoe validate --report DIR`` (statistics, scatter plot, the
configurations outside 15%), not for re-predictions (no counts) or the stage table. Run AC's rows did
not come back from the device (too many files); its log did.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"\s*\d+/\d+ (?P<preset>\S+)\s+T=(?P<T>\d+)\s+(?P<routing>\S+)\s+(?P<backend>\S+)\s+pred\s+"
                  r"(?P<pred>[\d.]+) us \(h200 (?P<h200>[\d.]+)\)\s+meas\s+(?P<meas>[\d.]+) us\s+err (?P<err>[+-][\d.]+)%")
PROFILES = re.compile(r"profiles (?P<first>[\w.-]+), (?P<second>[\w.-]+);")


def provenance(folder: Path) -> dict:
    """GPU, torch, triton and the code's commit from preflight.txt."""
    out: dict = {}
    text = (folder / "preflight.txt").read_text() if (folder / "preflight.txt").exists() else ""
    for line in text.splitlines():
        w = line.split()
        if len(w) >= 2 and w[0] in ("torch", "triton"):
            out[w[0]] = w[1]
        elif w and w[0] == "gpu":
            out["gpu"] = line.split(",")[0][4:]
        elif w and w[0] == "code":
            m = re.search(r"'commit': '([0-9a-f]+)', 'dirty': (\w+)", line)
            if m:
                out["commit"], out["dirty"] = m.group(1), m.group(2) == "True"
    return out


def rows_from_log(folder: Path) -> list[dict]:
    log = (folder / "validate.log").read_text()
    m = PROFILES.search(log)
    first = m.group("first") if m else "h200-calibrated"
    base = {"from_log": True, "phase": "measurement", "profile": first, **provenance(folder)}
    rows = []
    for line in log.splitlines():
        m = LINE.search(line)
        if not m:
            continue
        pred, h200, meas = float(m["pred"]), float(m["h200"]), float(m["meas"])
        rows.append({**base, "preset": m["preset"], "T": int(m["T"]), "routing": m["routing"], "backend": m["backend"],
                     "predicted_us": pred, "measured_us": meas, "error": (pred - meas) / meas,
                     "predictions": {first: {"predicted_us": pred, "error": (pred - meas) / meas},
                                     "h200": {"predicted_us": h200, "error": (h200 - meas) / meas}}})
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    folder = Path(argv[0])
    if not (folder / "validate.log").is_file():
        print(f"rows_from_validate_log.py: {folder / 'validate.log'} does not exist (give a validation folder "
              "holding megamoe validate's log)", file=sys.stderr)
        return 2
    rows = rows_from_log(folder)
    if not rows:
        print(f"{folder / 'validate.log'}: no configuration lines", file=sys.stderr)
        return 1
    out = folder / "validation_from_log.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} rows -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
