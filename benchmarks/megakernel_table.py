"""The megakernel issue's table and targets, from bench_megakernel.py's rows (no GPU needed).

    python benchmarks/megakernel_table.py ROWS.jsonl [ROWS2.jsonl ...] [--adopt NAME[@T,T...] ...] [--md OUT.md]

One line per (preset, T, routing): the floor, the megakernel, the multi-launch path and the plain
PyTorch pipeline (us, CUDA-graph replays measured in one run), their ratios, and each target of the
megakernel issue that the row is held to, met or not:

- T = 1: megakernel <= 1.15 x floor + 3 us;
- T in {8, 64}, uniform routing: <= 1.08 x floor;
- concentrated routing (every token on the same K experts) at T = 64: <= 1.3 x floor;
- T = 1, Qwen3-30B-A3B and gpt-oss-120b: at least 1.5x faster than the multi-launch path;
- T <= 512: never slower than the multi-launch path.

Where a (preset, T, routing) appears in more than one file, the last file's row is taken (list the
files oldest first). Rows that failed (no megakernel or multi time) are listed as such.

``--adopt NAME[@T,...]``: a variant that has since become the default (at the T listed, or at every T).
A row that timed it, checked against the reference (``ok``), shows the variant's time as the megakernel's,
marked with a dagger and named under the table: it is the default's configuration of today, measured
side by side with the rest of that row. Rows that did not time it keep the default of their run.
"""

from __future__ import annotations

import argparse
import sys

from table_rows import emit, fmt, load_keyed, md_table, missing_files, provenance

#: the presets held to the 1.5x-over-multi target at T = 1
FAST_T1_PRESETS = ("qwen3-30b-a3b", "gpt-oss-120b")
#: the issue's grid: every T with the preset's own routing, and concentrated routing where
#: bench_megakernel.py times it
GRID = [(T, "uniform") for T in (1, 8, 64, 512, 4096, 16384)] + [(T, "concentrated") for T in (8, 64, 512)]


def targets(row: dict) -> list[tuple[str, bool]]:
    """[(target, met)] for the targets this row is held to (the module docstring's list)."""
    T, routing, floor = int(row["T"]), row["routing"], row["floor_us"]
    mk, multi = row.get("megakernel_us"), row.get("multi_us")
    out = []
    if mk is None:
        return out
    if T == 1:
        out.append(("<= 1.15 x floor + 3 us", mk <= 1.15 * floor + 3.0))
    if T in (8, 64) and routing == "uniform":
        out.append(("<= 1.08 x floor", mk <= 1.08 * floor))
    if T == 64 and routing == "concentrated":
        out.append(("<= 1.3 x floor", mk <= 1.3 * floor))
    if multi is not None:
        if T == 1 and row["preset"] in FAST_T1_PRESETS:
            out.append((">= 1.5x multi", multi / mk >= 1.5))
        if T <= 512:
            out.append(("not slower than multi", mk <= multi))
    return out


def parse_adopt(specs: list[str]) -> dict[str, set[int] | None]:
    """{variant name: the T it is adopted at (None: every T)} from "NAME" or "NAME@T,T" strings."""
    out = {}
    for spec in specs:
        name, _, ts = spec.partition("@")
        try:
            out[name] = {int(t) for t in ts.split(",")} if ts else None
        except ValueError:
            raise ValueError(f"--adopt {spec!r}: expected NAME or NAME@T,T... with integer T") from None
    return out


def adopt(row: dict, adopted: dict[str, set[int] | None]) -> dict:
    """The row with an adopted variant's time (the first listed that the row timed and passed) as its
    megakernel time, ``adopted`` naming it; the row itself where none applies."""
    for name, ts in adopted.items():
        if ts is not None and int(row["T"]) not in ts:
            continue
        v = next((v for v in row.get("variants") or [] if v.get("name") == name), None)
        if v and v.get("ok") and v.get("us") is not None:
            return {**row, "megakernel_us": v["us"], "adopted": name}
    return row


def load_rows(paths: list[str]) -> list[dict]:
    """bf16 rows of the files, one per (preset, T, routing), the later file's where they repeat."""
    keyed = load_keyed(paths, lambda r: (r["preset"], int(r["T"]), r["routing"]), keep=lambda r: not r.get("fp8"))
    return [keyed[k] for k in sorted(keyed, key=lambda k: (k[0], k[1], k[2] != "uniform"))]


def table(rows: list[dict]) -> str:
    """The markdown table and a count of the targets met (a dagger marks an adopted variant's time)."""
    head = ["preset", "T", "routing", "floor us", "megakernel us", "multi us", "PyTorch us", "mk / floor",
            "multi / mk", "targets (met: yes / no)"]
    body, met, held = [], 0, 0
    for r in rows:
        mk, multi = r.get("megakernel_us"), r.get("multi_us")
        ts = targets(r)
        met += sum(ok for _, ok in ts)
        held += len(ts)
        tcell = "; ".join(f"{name}: {'yes' if ok else 'no'}" for name, ok in ts) or "-"
        if mk is None:
            tcell = "megakernel failed: " + str(r.get("megakernel_error", "?"))[:80]
        body.append([r["preset"], str(r["T"]), r["routing"], fmt(r["floor_us"]),
                     fmt(mk) + (" †" if r.get("adopted") else ""), fmt(multi),
                     fmt(r.get("torch_us")), fmt(mk / r["floor_us"] if mk else None, "{:.2f}"),
                     fmt(multi / mk if mk and multi else None, "{:.2f}"), tcell])
    have = {(r["preset"], int(r["T"]), r["routing"]) for r in rows}
    missing = [f"{p} T = {T} {routing}" for p in sorted({r["preset"] for r in rows}) for T, routing in GRID
               if (p, T, routing) not in have]
    gap = f"\nNot measured: {', '.join(missing)}.\n" if missing else ""
    took = sorted({(r["adopted"], r["preset"], int(r["T"]), r["routing"]) for r in rows if r.get("adopted")})
    dag = ("\n† the time of a variant that is the default now, measured in that row's run: "
           + "; ".join(f"{p} T = {T} {routing}: {name}" for name, p, T, routing in took) + ".\n") if took else ""
    return (md_table(head, body) + f"\n\nTargets met: {met} of {held}. Measured on: {provenance(rows)}.\n"
            + dag + gap)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+", help="bench_megakernel.py's megakernel.jsonl files, oldest first")
    p.add_argument("--adopt", nargs="*", default=[], metavar="NAME[@T,...]",
                   help="variants that are the default now (at those T): their times stand for the megakernel's")
    p.add_argument("--md", help="also write the table to this file")
    a = p.parse_args(argv)
    missing = missing_files(a.rows)
    if missing:
        p.error(f"no such rows file: {', '.join(missing)}")
    try:
        adopted = parse_adopt(a.adopt)
    except ValueError as e:
        p.error(str(e))
    emit(table([adopt(r, adopted) for r in load_rows(a.rows)]), a.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
