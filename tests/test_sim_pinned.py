"""The event model's results pinned on small cases, so that work on its speed cannot move them.

``data/sim_pinned.json`` holds what the event model gave on these cases at commit b621a74, before
the fabric stepped over its started flows only (``entities.Fabric``, ``flows.step_rates``); a faster
model must give the same numbers to within 1e-9 relative (float round-off). Regenerate the file
(``python tests/test_sim_pinned.py``) only with a change that is meant to move the model's results,
and say so in its commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from megamoe.simulator import simulate

PINNED = Path(__file__).parent / "data" / "sim_pinned.json"
CASES = {
    # fused, 4 minibatches: milestones, push limits, bounded buffers, the per-minibatch sync
    "h200-fused-skewed-4mb": dict(system="hgx-h200", tokens_per_gpu=256, routing="skewed", minibatch=64,
                                  schedule="fused"),
    # fp8 dispatch (quantize on the copy SMs), two hot experts, round-robin placement
    "h200-fused-hot-fp8": dict(system="hgx-h200", tokens_per_gpu=256, routing="hot:0.5:2", placement="round_robin",
                               minibatch=128, schedule="fused", dtype="fp8"),
    # the full rack, replicated experts, few communication SMs, 2 minibatches
    "nvl72-fused-eplb-uniform": dict(system="gb200-nvl72", tokens_per_gpu=32, routing="uniform", placement="eplb",
                                     minibatch=16, schedule="fused", comm_sms=16),
    # the full rack, bulk-synchronous: every flow of a phase at once
    "nvl72-bulk-skewed": dict(system="gb200-nvl72", tokens_per_gpu=64, routing="skewed", schedule="bulk"),
}


def results(case: str) -> dict:
    """The numbers pinned for a case: the layer time, its breakdown, and per-GPU ends, busy times and bytes."""
    r = simulate("deepseek-v3", **CASES[case])
    g = r.per_gpu
    return {"layer_time_us": r.layer_time_us, "analytic_us": r.analytic_us, "breakdown_us": r.breakdown_us,
            "end_us": list(map(float, g["end_us"])), "compute_busy_us": list(map(float, g["compute_busy_us"])),
            "nvlink_sent_bytes": list(map(float, g["nvlink_sent_bytes"])),
            "hbm_utilization": list(map(float, g["hbm_utilization"]))}


@pytest.mark.parametrize("case", sorted(CASES))
def test_event_model_matches_its_pinned_results(case):
    want = json.loads(PINNED.read_text())["cases"][case]
    got = results(case)
    assert got.keys() == want.keys()
    for key, w in want.items():
        w = np.array(list(w.values()) if isinstance(w, dict) else w, dtype=np.float64)
        v = np.array(list(got[key].values()) if isinstance(got[key], dict) else got[key], dtype=np.float64)
        np.testing.assert_allclose(v, w, rtol=1e-9, atol=1e-12, err_msg=f"{case}: {key}")


if __name__ == "__main__":  # regenerate the pinned file (see the module docstring)
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    PINNED.write_text(json.dumps({"commit": commit, "cases": {c: results(c) for c in sorted(CASES)}}, indent=1) + "\n")
