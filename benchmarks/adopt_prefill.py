"""Adopt the GEMM candidates that bench_prefill.py measured faster into the tuned-config file.

    python benchmarks/adopt_prefill.py benchmarks/results/prefill_2026-12-01_run6.jsonl [--margin 0.03]

For each (preset, T) row: the fastest candidate whose numerics passed, if it beat "current" (the
tuned entry the row ran) by more than ``margin`` (default 3%, about the run-to-run spread of a
CUDA-graph median here), replaces the tuned entry of that shape and T bucket, with the row's
commit and date recorded under the file's "sources" note. The file is the one of the rows' GPU,
dtype and Triton version; it is checked after writing (kernels.configs.load_file).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def adopt(rows: list[dict], margin: float) -> dict:
    """{(shape key, bucket): (candidate name, entry, speed-up over current)} to write."""
    from megamoe.kernels import bench as kb
    from megamoe.kernels import configs as cfgs

    out = {}
    for r in rows:
        cands = r.get("candidates", {})
        cur = cands.get("current", {})
        if "us" not in cur:
            continue
        ok = {n: c for n, c in cands.items() if n != "current" and c.get("ok") and "us" in c and "config" in c}
        if not ok:
            continue
        name = min(ok, key=lambda n: ok[n]["us"])
        if ok[name]["us"] * (1 + margin) >= cur["us"]:
            continue
        c = kb.bench_config(r["preset"])
        key = (cfgs.shape_key(c.num_experts, c.hidden_size, c.intermediate_size, c.top_k), cfgs.bucket_of(r["T"]))
        out[key] = (name, ok[name]["config"], cur["us"] / ok[name]["us"])
    return out


def main(argv=None) -> int:
    from megamoe.kernels import configs as cfgs

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows")
    p.add_argument("--margin", type=float, default=0.03)
    a = p.parse_args(argv)
    rows = [json.loads(line) for line in Path(a.rows).read_text().splitlines() if line.strip()]
    if not rows:
        print(f"{a.rows}: no rows", file=sys.stderr)
        return 2
    path = cfgs.config_path(rows[0]["gpu"], "bfloat16", rows[0]["triton"])
    data = json.loads(path.read_text())
    for (key, bucket), (name, entry, speedup) in sorted(adopt(rows, a.margin).items()):
        data["configs"].setdefault(key, {})[str(bucket)] = {g: dict(entry[g]) for g in ("gemm1", "gemm2")}
        print(f"{key} T~{bucket}: {name} ({speedup:.2f}x the current entry)")
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    cfgs.load_file(path)  # fail loudly now if what was written is malformed
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
