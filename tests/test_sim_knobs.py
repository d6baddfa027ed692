"""The rack model's answers to the megakernel's design questions: the verdict naming what bounds a
layer, the minibatch, the communication-SM knee and the knob search."""

from __future__ import annotations

import json

import numpy as np
import pytest

from megamoe.reference import MoEConfig
from megamoe.simulator import simulate
from megamoe.simulator.verdict import verdict

SMALL = MoEConfig(hidden_size=1024, intermediate_size=512, num_experts=16, top_k=2, name="small")
WIDE = MoEConfig(hidden_size=512, intermediate_size=16384, num_experts=16, top_k=2, name="wide")  # FLOPs per byte moved


# ---------------------------------------------------------------------------- the verdict
def test_verdict_names_the_largest_term_and_imbalance():
    t = {"compute": np.array([1e-3, 1e-3]), "copy": np.array([3e-3, 5e-4]), "fixed": np.array([1e-4, 1e-4])}
    v = verdict(t, layer_s=3.5e-3, busy_s=np.array([1e-3, 1e-3]))
    assert v["bound_by"] == "copy" and "copy rate" in v["line"] and "2.5 of 3.5 ms exposed" in v["line"]
    t = {"compute": np.array([4.0, 1.0]), "copy": np.array([0.5, 0.5])}
    assert verdict(t, layer_s=4.2, busy_s=np.array([4.0, 1.0]))["bound_by"] == "imbalance"  # busiest above 1.5 x the mean
    assert verdict(t, layer_s=4.2, busy_s=np.array([4.0, 3.0]))["bound_by"] == "compute"
    assert verdict({"compute": np.array([1.0]), "fixed": np.array([3.0])}, layer_s=4.0)["bound_by"] == "fixed"


@pytest.mark.parametrize("cfg, comm_sms, want", [(SMALL, 1, "copy"), (WIDE, 60, "compute")])
def test_every_simulate_output_carries_a_verdict(cfg, comm_sms, want):
    # one communication SM of an H200 moves little: the copy rate binds; a wide expert on many SMs computes
    r = simulate(cfg, "hgx-h200", 512, routing="uniform", comm_sms=comm_sms, dtype="fp8")
    d = json.loads(r.to_json(links=False))
    assert d["verdict"]["bound_by"] == want, d["verdict"]["line"]
    assert set(d["overlapping_breakdown_keys"]) == {"dispatch", "combine"}
    assert sum(d["breakdown_us"][k] for k in d["additive_breakdown_keys"]) == pytest.approx(d["layer_time_us"], rel=1e-6)
    a = simulate(cfg, "hgx-h200", 512, routing="uniform", comm_sms=comm_sms, dtype="fp8", analytic_only=True)
    assert a.verdict["line"].startswith("bound by")


def test_cli_table_prints_the_verdict(capsys):
    from megamoe.simulator.cli import main

    assert main(["--system", "hgx-h200", "--tokens-per-gpu", "256", "--model", "mixtral-8x7b"]) == 0
    out = capsys.readouterr().out
    assert "verdict: bound by" in out and "do not add" in out
