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
    # waiting for the first round's rows binds once the wait is a tenth of the layer or more
    busy = np.array([1e-3])
    assert verdict({"compute": busy, "fill": busy + 5e-4}, layer_s=1.6e-3, busy_s=busy)["bound_by"] == "fill"
    assert verdict({"compute": busy, "fill": busy + 5e-5}, layer_s=1.6e-3, busy_s=busy)["bound_by"] == "compute"
    # a compute-bound GPU whose HBM bytes alone take most of its time is HBM-bound
    assert verdict({"compute": np.array([1.0]), "hbm": np.array([0.9])}, layer_s=1.1)["bound_by"] == "hbm"
    assert verdict({"compute": np.array([1.0]), "hbm": np.array([0.5])}, layer_s=1.1)["bound_by"] == "compute"


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


# ---------------------------------------------------------------------------- minibatch rounds, pull or push
def _gb200(gpus=4, **o):
    from megamoe.simulator.hardware import load_profile, override

    return override(load_profile("gb200-nvl72"), gpus=gpus, **o)


def test_the_minibatch_counted_as_rows_received_per_round():
    from megamoe.simulator.simulate import tokens_for_rows

    assert tokens_for_rows(1000, SMALL, 4096) == 500  # top-2: a GPU receives 2 rows per token per round
    assert tokens_for_rows(1, SMALL, 4096) == 1 and tokens_for_rows(10**6, SMALL, 300) == 300
    with pytest.raises(ValueError, match="minibatch_rows"):
        tokens_for_rows(0, SMALL, 64)
    r = simulate(SMALL, _gb200(), 96, routing="uniform", minibatch_rows=64, analytic_only=True)
    i = r.inputs
    assert i["minibatch"] == 32 and i["num_minibatches"] == 3 and i["minibatch_rows_nominal"] == 64
    assert i["minibatch_rows_mean"] == pytest.approx(64.0)  # every row of 4 GPUs x 96 tokens x 2 lands somewhere


def test_each_round_pays_its_completion_signalling():
    # the bound's signalling term is rounds x the dispatch's signal plus one combine signal; the event
    # model pays at least that, and more rounds cost more on a layer with little else to do
    p = _gb200()
    pr = p.protocol
    times = {}
    for mb in (8, 64):
        r = simulate(SMALL, p, 64, routing="uniform", minibatch=mb, comm_sms=60)
        B = r.inputs["num_minibatches"]
        assert r.verdict["terms_us"]["signal"] == pytest.approx((B * pr.pull_signal_s + pr.push_signal_s) * 1e6)
        assert r.layer_time_us >= r.verdict["terms_us"]["signal"]
        times[B] = r.layer_time_us
    assert times[8] - times[1] > 7 * pr.pull_signal_s * 1e6 * 0.9


def test_pulling_costs_more_port_bytes_than_pushing():
    # slow links: the ports bind; a pulled byte carries more protocol (76% payload) than a pushed one (82%)
    p = _gb200(link_bandwidth=5e6)  # tens of ms on the ports, against 0.2 ms of signalling
    t = {m: simulate(SMALL, p, 256, routing="uniform", comm_sms=60, dispatch_mode=m, combine_mode=m).layer_time_us
         for m in ("pull", "push")}
    assert t["pull"] / t["push"] == pytest.approx(0.82 / 0.76, rel=0.05)
    r = simulate(SMALL, p, 256, routing="uniform", comm_sms=60)
    assert r.verdict["bound_by"] in ("send_port", "recv_port") and "NVLink" in r.verdict["line"]
    with pytest.raises(ValueError, match="dispatch must be one of"):
        simulate(SMALL, p, 64, dispatch_mode="shove")


# ---------------------------------------------------------------------------- the knob search
def test_the_search_finds_what_trying_every_point_finds():
    from megamoe.simulator import build_workload, simulate_workload
    from megamoe.simulator.hardware import load_profile
    from megamoe.simulator.knobs import comm_grid, optimize

    p = load_profile("hgx-h200")
    w = build_workload(SMALL, 8, 512, "skewed", "contiguous", minibatch=512)
    r = optimize(w, p, knobs=("comm-sms",), dtype="fp8", confirm=3)
    every = {n: simulate_workload(w, p, comm_sms=n, dtype="fp8").layer_time_us for n in comm_grid(p)}
    assert r["best"].event_us == pytest.approx(min(every.values()), rel=0.02)
    assert r["runner_up"].event_us >= r["best"].event_us
    for q in r["points"]:  # the bound never exceeds the event model
        assert q.event_us is None or q.bound_us <= q.event_us * (1 + 1e-9)
    assert r["bound_s_per_point"] < 5e-3


def test_cli_optimize_prints_best_and_runner_up_and_plots(capsys, tmp_path):
    from megamoe.simulator.cli import main

    png = tmp_path / "knobs.png"
    assert main(["--system", "hgx-h200", "--tokens-per-gpu", "256", "--model", "mixtral-8x7b",
                 "--optimize", "comm-sms,minibatch", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "best:" in out and "runner-up:" in out and "bound by" in out
    assert png.stat().st_size > 10_000
    assert main(["--system", "hgx-h200", "--tokens-per-gpu", "256", "--model", "mixtral-8x7b",
                 "--optimize", "minibatch", "--comm-sms", "24", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["best"]["comm_sms"] == 24 and d["best"]["time_us"] <= d["runner_up"]["time_us"]
    assert {q["minibatch"] for q in d["curves"]["minibatch"]} == {16, 24, 32, 48, 64, 96, 128, 192, 256}
    assert main(["--plot", str(png)]) == 2
    assert "--plot draws the curves of --optimize" in capsys.readouterr().err
    assert main(["--optimize", "comm-sms,warp"]) == 2
    assert "knobs are comm-sms, minibatch" in capsys.readouterr().err


def test_with_signalling_a_round_computes_once_all_its_rows_are_in():
    # the round's fill: no routed slot of GPU g starts before g's last dispatched row of that round
    # has landed and the round's completion has been signalled; without signalling (an H200
    # profile) a slot may start as soon as its own rows are in
    def first_slot_after_fill(system):
        r = simulate(SMALL, system, 256, routing="uniform", comm_sms=8, include_shared=False)
        sig = system.protocol.pull_signal_s if getattr(system, "protocol", None) else 0.0
        out = []
        for g in range(system.num_gpus):
            land = max(s.end_s for s in r._spans if s.track == "dispatch" and s.gpu == g)
            start = min(s.start_s for s in r._spans if s.track == "compute" and s.gpu == g and s.name.startswith("slot"))
            out.append(start - (land + sig))
        return min(out)

    from megamoe.simulator.hardware import load_profile

    assert first_slot_after_fill(_gb200()) >= -1e-9
    assert first_slot_after_fill(load_profile("hgx-h200")) < 0
