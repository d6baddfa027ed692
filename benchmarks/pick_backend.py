"""Write backend="auto"'s table from measured rows: per shape and T bucket, the faster backend.

    python benchmarks/pick_backend.py ROWS.jsonl [ROWS.jsonl ...] [--margin 0.03] [--adopt NAME[@T,...] ...]

Reads bench_megakernel.py rows and ``megamoe validate`` rows (phase "measurement", one per
backend; paired by preset, T and routing), uniform routing only (the table is keyed by shape and
T bucket, not by routing); a later file's row replaces an earlier one's for the same (shape,
bucket). For each (shape, bucket) with both backends timed in the same run it writes
"megakernel" where it was faster by more than ``margin`` (default 3%, about the run-to-run spread
of a CUDA-graph median here) and "multi" otherwise, into the tuned-config file of the rows' GPU,
dtype bf16 and Triton version (its "backend" table; kernels/configs.py select_backend reads it).

FP8 rows (bench_megakernel.py --fp8 weights|weights+act: the FP8 megakernel and FP8 multi-launch
path in one row, its ``fp8`` field the mode) go to that mode's table, ``backend_fp8[mode]`` of the
same file, read by backend="auto" with FP8 weights. Only the tables the given rows fill are
rewritten: bf16 rows replace "backend", each FP8 mode's rows its own table, the rest is kept.
``--adopt NAME[@T,...]`` (megakernel_table.py's): a bench_megakernel.py variant that has since become
the default stands for the megakernel's time in the rows that timed it (and passed its check).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from megakernel_table import adopt, parse_adopt


def paired(rows: list[dict]) -> list[dict]:
    """bench_megakernel rows as they are; validate rows paired into {preset, T, routing,
    megakernel_us, multi_us} (their measurement rows, by preset, T and routing)."""
    out, pairs = [], {}
    for r in rows:
        if "megakernel_us" in r or "multi_us" in r:
            out.append(r)
        elif r.get("phase") == "measurement" and r.get("backend") in ("megakernel", "multi"):
            key = (r["preset"], r["T"], r.get("routing", "uniform"))
            d = pairs.setdefault(key, {"preset": key[0], "T": key[1], "routing": key[2]})
            d[f"{r['backend']}_us"] = r["measured_us"]
    return out + list(pairs.values())


def pick(rows: list[dict], margin: float) -> dict:
    """{fp8 mode or None (bf16): {shape key: {bucket: "megakernel" | "multi"}}} from the rows that
    timed both backends on uniform routing."""
    from megamoe.kernels import bench as kb
    from megamoe.kernels import configs as cfgs

    tables: dict = {}
    for r in paired(rows):
        if r.get("routing", "uniform") != "uniform" or "megakernel_us" not in r or "multi_us" not in r:
            continue
        c = kb.bench_config(r["preset"])
        key = cfgs.shape_key(c.num_experts, c.hidden_size, c.intermediate_size, c.top_k)
        faster = r["megakernel_us"] * (1 + margin) < r["multi_us"]
        tables.setdefault(r.get("fp8"), {}).setdefault(key, {})[str(cfgs.bucket_of(r["T"]))] = (
            "megakernel" if faster else "multi")
    return tables


def main(argv=None) -> int:
    from megamoe.kernels import configs as cfgs

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+")
    p.add_argument("--margin", type=float, default=0.03)
    p.add_argument("--adopt", nargs="*", default=[], metavar="NAME[@T,...]",
                   help="variants that became the default since the rows were measured (megakernel_table.py's)")
    a = p.parse_args(argv)
    try:
        adopted = parse_adopt(a.adopt)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    rows = [adopt(json.loads(line), adopted) for f in a.rows for line in Path(f).read_text().splitlines()
            if line.strip()]
    if not rows:
        print(f"{' '.join(a.rows)}: no rows", file=sys.stderr)
        return 2
    bad = sorted({str(r["fp8"]) for r in rows if r.get("fp8") not in (None, *cfgs.FP8_MODES)})
    if bad:
        print(f"rows with fp8 mode(s) {bad}: expected one of {list(cfgs.FP8_MODES)} or none (bf16)", file=sys.stderr)
        return 2
    path = cfgs.config_path(rows[0]["gpu"], "bfloat16", rows[0]["triton"])
    data = json.loads(path.read_text())
    tables = pick(rows, a.margin)
    if not tables:
        print(f"{' '.join(a.rows)}: no uniform-routing row timed both backends; nothing written", file=sys.stderr)
        return 2
    for mode, table in sorted(tables.items(), key=lambda kv: str(kv[0])):
        if mode is None:
            data["backend"] = table
        else:
            data.setdefault("backend_fp8", {})[mode] = table
        for k, v in table.items():
            print("bf16" if mode is None else f"fp8 {mode}", k, v)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    cfgs.load_file(path)  # fail loudly now if what was written is malformed
    cfgs._backends.cache_clear()
    for mode in tables:
        cfgs._backends(rows[0]["gpu"], "bfloat16", rows[0]["triton"], mode)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
