"""Issue 12's (FP8) table and targets, from stored FP8 benchmark rows (no GPU needed).

    python benchmarks/fp8_table.py ROWS.jsonl [ROWS2.jsonl ...] [--md OUT.md]

One line per (preset, T, routing, FP8 mode, backend or variant): the bf16 times it is compared with,
the FP8 time, the speedup, the FP8 check (err_max, ok) and the issue's target for that T, met or not:

- T <= 8: FP8 at least 1.8x faster than the bf16 path on the same preset;
- T >= 4096: FP8 at least 1.6x the bf16 path's throughput (the same ratio of times, same inputs);
- T in between: no target ("-").

**The bf16 baseline** is "the bf16 path" as users get it: the faster of the bf16 megakernel and the bf16
multi-launch path that the same run measured (both columns are shown; a row that measured one of them
is compared with that one). speedup = that bf16 time / the FP8 time. A line meets its target when the
speedup reaches it and its FP8 check did not fail (ok "-": the writer checks no numerics, as
``megamoe bench``; then the time alone decides). FP8 lines that failed (no time) are listed as failed.

Row formats read (the writers' fields):

- ``bench_megakernel.py --fp8 weights|weights+act``: ``fp8`` the mode; lines "megakernel"
  (``megakernel_us`` / ``_ok`` / ``_err_max`` / ``_error``), "multi-launch" (``multi_*``) and each of
  ``variants`` ("megakernel: <name>": ``us``, ``ok``, ``err_max`` or ``error``); bf16: the bf16
  megakernel of the same row (``bf16_megakernel_us``; these rows time no bf16 multi-launch path).
- ``bench_fp8w.py`` / ``bench_fp8a.py`` (fp8_prefill_rows.py): ``candidates``, each FP8 one a line
  "multi-launch: <name>" (mode "weights" for fp8w*, "weights+act" for fp8a*); bf16: the "bf16"
  candidate of the same row (multi-launch).
- ``megamoe bench --dtype bf16,fp8,fp8-act`` (kernels/bench.py): a row per dtype; an FP8 row is the line
  "megakernel" or "multi-launch" (its ``backend``; the multi-launch GEMM kind in brackets), no check;
  bf16: the row's ``bf16_us`` (on ``bf16_backend``).

Rows without ``routing`` (megamoe bench, the prefill benchmarks) run the preset's router on random
inputs: "uniform". **Pairing:** an FP8 row that carries no bf16 time (``megamoe bench`` with only FP8
dtypes, e.g. a second process with a switch set) is paired with the bf16 rows of the same run: the same
(preset, T, routing, commit, day, GPU), from any of the files (``megamoe bench`` bf16 rows,
bench_megakernel.py's bf16 rows, a prefill row's bf16 candidate; the last one read where several
match). Such bf16 figures are marked with a dagger. An FP8 row with no bf16 time of its own run is
skipped and counted in the closing "Skipped" line: no baseline is made up.

Where a (preset, T, routing, mode, backend or variant) appears more than once, the last row read wins
(list the files oldest first). "Targets met: N of M lines" counts every line held to a target (variants
included); "K of L cases" counts the (preset, T, routing, mode) that at least one line meets. The
provenance line lists the distinct GPU, torch, Triton, commit and day of the rows shown (bf16 rows paired
included), then the rows' commit notes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from table_rows import emit, fmt, md_table, missing_files, provenance_text, read_jsonl, run_of

# --------------------------------------------------------------------------- FP8 rows -> lines

#: megamoe bench's dtype names -> the FP8 mode
BENCH_MODES = {"fp8": "weights", "fp8-act": "weights+act"}
#: the issue's speed targets: (applies to T, needed speedup over the bf16 path, name)
TARGETS = ((lambda T: T <= 8, 1.8, ">= 1.8x bf16"), (lambda T: T >= 4096, 1.6, ">= 1.6x bf16"))
#: bf16 backends as the rows name them -> the table's columns
BF16_COLUMNS = ("megakernel", "multi")


def _line(row: dict, src: str, mode: str, backend: str, us, ok=None, err_max=None, error=None, detail=""):
    """One FP8 line of a row: its key fields, FP8 time and check, where it came from."""
    return {"preset": row["preset"], "T": int(row["T"]), "routing": row.get("routing") or "uniform", "mode": mode,
            "backend": backend, "detail": detail, "us": us, "ok": ok, "err_max": err_max, "error": error,
            "source": src, "prov": {run_of(row)}, "note": row.get("commit_note"), "bf16": {}, "paired": False}


def _decode_lines(row: dict, src: str) -> tuple[list[dict], dict]:
    """bench_megakernel.py --fp8 rows: the megakernel, the multi-launch path and each variant; bf16: the bf16
    megakernel of the row."""
    mode = row["fp8"]
    lines = [_line(row, src, mode, name, row.get(f"{key}_us"), row.get(f"{key}_ok"), row.get(f"{key}_err_max"),
                   row.get(f"{key}_error")) for key, name in (("megakernel", "megakernel"), ("multi", "multi-launch"))]
    lines += [_line(row, src, mode, f"megakernel: {v['name']}", v.get("us"), v.get("ok"), v.get("err_max"),
                    v.get("error")) for v in row.get("variants") or []]
    bf16 = {"megakernel": row["bf16_megakernel_us"]} if row.get("bf16_megakernel_us") is not None else {}
    return lines, bf16


def _prefill_mode(name: str) -> str | None:
    """A prefill candidate's FP8 mode from its name (bench_fp8w.py's fp8w*, bench_fp8a.py's fp8a*)."""
    return "weights+act" if name.startswith("fp8a") else "weights" if name.startswith("fp8w") else None


def _prefill_lines(row: dict, src: str) -> tuple[list[dict], dict]:
    """bench_fp8w.py / bench_fp8a.py rows: a line per FP8 candidate; bf16: the row's bf16 candidate."""
    lines = [_line(row, src, _prefill_mode(name), f"multi-launch: {name}", c.get("us"), c.get("ok"), c.get("err_max"),
                   c.get("error")) for name, c in row["candidates"].items() if _prefill_mode(name)]
    return lines, _bf16_times(row)


def _bench_lines(row: dict, src: str) -> tuple[list[dict], dict]:
    """megamoe bench FP8 rows: one line on the row's backend (no check); bf16: the row's bf16_us."""
    multi = row.get("backend") != "megakernel"
    gemm = ((row.get("config") or {}).get("gemm1") or {}).get("variant") if multi else None
    line = _line(row, src, BENCH_MODES[row["dtype"]], "multi-launch" if multi else "megakernel", row.get("ours_us"),
                 detail=f" [{gemm}]" if gemm else "")
    bf16 = {row.get("bf16_backend", "multi"): row["bf16_us"]} if row.get("bf16_us") is not None else {}
    return [line], bf16


def _bf16_times(row: dict) -> dict:
    """{bf16 backend: us} that a row measured with bf16 weights: a megamoe bench bf16 row, a bench_megakernel.py
    bf16 row (megakernel and multi-launch), a prefill row's bf16 candidate; {} for other rows."""
    if "candidates" in row:
        us = row["candidates"].get("bf16", {}).get("us")
        return {"multi": us} if us is not None else {}
    if row.get("dtype") == "bf16" and row.get("ours_us") is not None:
        return {row.get("backend", "multi"): row["ours_us"]}
    if "dtype" not in row and "routing" in row and not row.get("fp8"):
        return {k: row[f"{k}_us"] for k in BF16_COLUMNS if row.get(f"{k}_us") is not None}
    return {}


def _fp8_lines(row: dict, src: str):
    """(lines, in-row bf16 times) of an FP8 row of a known format; None for a bf16 row; a str (why) for a row
    that gives no line."""
    if "skipped" in row:
        return f"not run: {str(row['skipped'])[:60]}"
    if "candidates" in row:
        return _prefill_lines(row, src) if any(_prefill_mode(n) for n in row["candidates"]) else None
    if row.get("fp8"):
        return _decode_lines(row, src)
    if row.get("dtype") in BENCH_MODES:
        return _bench_lines(row, src)
    if _bf16_times(row) or row.get("dtype") == "bf16" or ("routing" in row and "fp8" in row):
        return None
    return "not an FP8 row of a known format"


def _run_key(row: dict) -> tuple:
    """The same run's (preset, T, routing, commit, day, GPU): how an FP8 row finds its bf16 rows."""
    return (row.get("preset"), int(row.get("T", -1)), row.get("routing") or "uniform", (row.get("commit") or "")[:7],
            (row.get("date") or "")[:10], row.get("gpu"))


def load_lines(paths: list[str]) -> tuple[list[dict], list[str]]:
    """(the table's lines, one per key with the last row read winning; the skipped rows, why). bf16 rows of
    every file are indexed first, so that an FP8 row can be paired with its run's bf16 row in another file."""
    rows = [(Path(p).stem, r) for p in paths for r in read_jsonl(p)]
    bf16_runs = {}
    for _, r in rows:
        if r.get("preset") is not None and "T" in r and (t := _bf16_times(r)):
            bf16_runs.setdefault(_run_key(r), {}).update({k: (us, r) for k, us in t.items()})
    keyed, skipped = {}, []
    for src, r in rows:
        got = _fp8_lines(r, src)
        if got is None:
            continue
        what = f"{r.get('preset')} T={r.get('T')} {r.get('fp8') or r.get('dtype') or 'prefill'} ({src})"
        if isinstance(got, str):
            skipped.append(f"{what}: {got}")
            continue
        lines, bf16 = got
        paired = not bf16
        if paired:
            found = bf16_runs.get(_run_key(r), {})
            bf16 = {k: us for k, (us, _) in found.items()}
            provs = {run_of(b) for _, b in found.values()}
        if not bf16:
            skipped.append(f"{what}: no bf16 time in the row or in a bf16 row of the same run")
            continue
        for ln in lines:
            ln.update(bf16=bf16, paired=paired)
            if paired:
                ln["prov"] |= provs
            keyed[(ln["preset"], ln["T"], ln["routing"], ln["mode"], ln["backend"])] = ln
    order = {"weights": 0, "weights+act": 1}
    return [keyed[k] for k in sorted(keyed, key=lambda k: (k[0], k[1], k[2] != "uniform", order.get(k[3], 2), k[4]))], \
        skipped


# --------------------------------------------------------------------------- targets and the table


def bf16_path(line: dict) -> tuple[float, str] | None:
    """(us, backend) of the faster bf16 path the line's run measured, or None."""
    got = [(us, k) for k, us in line["bf16"].items() if us is not None]
    return min(got) if got else None


def speedup(line: dict) -> float | None:
    """The faster bf16 path's time over the FP8 time (> 1: FP8 faster), or None."""
    base = bf16_path(line)
    return base[0] / line["us"] if base and line["us"] else None


def target(line: dict) -> tuple[str, bool, str] | None:
    """(target, met, why not) for the line's T (TARGETS), or None where T has none or the FP8 path failed."""
    s = speedup(line)
    for applies, need, name in TARGETS:
        if applies(line["T"]) and s is not None:
            if line["ok"] is False:
                return name, False, "numerics"
            return name, s >= need, "" if s >= need else "speed"
    return None


def _target_cell(line: dict) -> str:
    t = target(line)
    if line["us"] is None:
        return "failed: " + str(line["error"] or "no time")[:60]
    if t is None:
        return "-"
    name, met, why = t
    return f"{name}: " + ("yes" if met else f"no ({why})")


def _bf16_cell(line: dict, k: str) -> str:
    us = line["bf16"].get(k)
    return fmt(us) + (" †" if us is not None and line["paired"] else "")


def table(lines: list[dict], skipped: list[str]) -> str:
    """The markdown table, the targets met (over lines, and over cases: the best line of each (preset, T,
    routing, mode)), the provenance and the skipped rows."""
    head = ["preset", "T", "routing", "FP8", "backend / variant", "bf16 megakernel us", "bf16 multi us", "FP8 us",
            "speedup vs faster bf16", "err_max", "ok", "target (met)", "rows"]
    cells = [[ln["preset"], str(ln["T"]), ln["routing"], ln["mode"], ln["backend"] + ln["detail"],
              _bf16_cell(ln, "megakernel"), _bf16_cell(ln, "multi"), fmt(ln["us"]), fmt(speedup(ln), "{:.2f}x"),
              fmt(ln["err_max"], "{:.1e}"), "-" if ln["ok"] is None else ("yes" if ln["ok"] else "FAILED"),
              _target_cell(ln), ln["source"]] for ln in lines]
    held = [(ln, t) for ln in lines if (t := target(ln))]
    cases = {}
    for ln, (_, met, _) in held:
        k = (ln["preset"], ln["T"], ln["routing"], ln["mode"])
        cases[k] = cases.get(k, False) or met
    out = [md_table(head, cells), "",
           "speedup: the faster of the two bf16 paths of the same run (the lower bf16 column) over the FP8 time. "
           "† bf16 from a separate bf16 row of the same run (same preset, T, routing, commit, day, GPU), paired.",
           f"Targets met: {sum(t[1] for _, t in held)} of {len(held)} lines; "
           f"{sum(cases.values())} of {len(cases)} cases (preset, T, routing, FP8 mode) met by at least one line.",
           "Measured on: " + provenance_text(p for ln in lines for p in ln["prov"]) + "."]
    notes = sorted({ln["note"] for ln in lines if ln["note"]})
    out += [f"Commit note in the rows: {n}" for n in notes]
    out.append(f"Skipped: {len(skipped)} rows" + (": " + "; ".join(skipped) if skipped else "") + ".")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+", help="FP8 rows (.jsonl) of bench_megakernel.py --fp8, bench_fp8w.py, "
                                           "bench_fp8a.py, megamoe bench; oldest first")
    p.add_argument("--md", help="also write the table to this file")
    a = p.parse_args(argv)
    missing = missing_files(a.rows)
    if missing:
        p.error(f"no such rows file: {', '.join(missing)}")
    emit(table(*load_lines(a.rows)), a.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
