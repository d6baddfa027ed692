"""The cost model's megakernel prediction next to measured megakernel rows (no GPU needed).

    python benchmarks/megakernel_vs_model.py benchmarks/results/megakernel_2026-12-01_run3.jsonl [--profile h200]

For each row of bench_megakernel.py: the task plan of the config that ran (the row's
``megakernel_config``) on a routing like the row's (uniform: K distinct experts per token drawn
here with a fixed seed; concentrated: every token on experts 0..K-1), predicted by
``simulator.task_cost.predict_task_plan`` with ``--profile``, beside the measured time. When the
prediction is made after the measurement, from a profile not calibrated by ``megamoe calibrate``,
this is a look at the model, not a validation: the output says which it is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    from megamoe.kernels import bench as kb
    from megamoe.kernels.megakernel_config import megakernel_weight_loads
    from megamoe.reference.tiles import task_plan
    from megamoe.simulator.task_cost import predict_task_plan

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows")
    p.add_argument("--profile", default="h200")
    p.add_argument("--out", default=None, help="JSON-lines file for the comparison rows")
    a = p.parse_args(argv)
    rows = [json.loads(line) for line in Path(a.rows).read_text().splitlines() if line.strip()]
    out, ratios = [], []
    for r in rows:
        if "megakernel_us" not in r:
            continue
        cfg, T, mk = kb.bench_config(r["preset"]), r["T"], r["megakernel_config"]
        E, K = cfg.num_experts, cfg.top_k
        rng = np.random.default_rng(0)
        idx = (np.tile(np.arange(K), (T, 1)) if r["routing"] == "concentrated"
               else np.stack([rng.choice(E, K, replace=False) for _ in range(T)]))
        plan = task_plan(cfg, np.bincount(idx.ravel(), minlength=E), T, mk["tiles"], num_programs=132)
        ni = kb.inputs_per_graph(T)
        pred = predict_task_plan(plan, a.profile, num_programs=132, num_warps=mk["num_warps"], calls_per_graph=ni,
                                 weight_loads=megakernel_weight_loads(mk))
        ratio = r["megakernel_us"] / pred["time_us"]
        ratios.append(ratio)
        out.append({"preset": r["preset"], "T": T, "routing": r["routing"], "measured_us": r["megakernel_us"],
                    "predicted_us": pred["time_us"], "measured_over_predicted": ratio, "profile": a.profile,
                    "rows": a.rows, "measured_commit": r.get("commit"), "kind": "post-hoc look, not a validation", "backend": "megakernel"})
        print(f"{r['preset']:<16}{T:>6} {r['routing']:<13} measured {r['megakernel_us']:9.1f}  predicted "
              f"{pred['time_us']:9.1f}  ratio {ratio:5.2f}", flush=True)
    if ratios:
        err = [abs(1 - 1 / x) for x in ratios]
        print(f"# {len(ratios)} rows: median |pred - meas| / meas {statistics.median(err):.1%}, max {max(err):.1%} "
              f"(profile {a.profile}; prediction after the measurement: a look at the model, not a validation)")
    if a.out:
        Path(a.out).write_text("".join(json.dumps(o) + "\n" for o in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
