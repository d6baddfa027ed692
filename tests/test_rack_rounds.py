"""The minibatch's terms, round by round: the split of a fused layer adds up, tiles counted by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from megamoe.reference import MoEConfig
from megamoe.simulator import simulate
from megamoe.simulator.hardware import load_profile, override
from megamoe.simulator.rounds import round_tiles, two_wave_rows

SMALL = MoEConfig(hidden_size=1024, intermediate_size=512, num_experts=16, top_k=2, name="small")


def test_tiles_and_the_two_wave_rule_by_hand():
    p = load_profile("gb300-nvl72")  # 128 x 256 output tiles
    rows = np.array([[130, 0], [1, 256]])  # two slots, two rounds: 2 + 1 row tiles, then 0 + 2
    up, down = round_tiles(rows, SMALL, p)
    assert up.tolist() == [3 * 4, 2 * 4] and down.tolist() == [3 * 4, 2 * 4]  # 2I = H = 1024: 4 column tiles
    kimi = MoEConfig.preset("kimi-k2")  # min(2I, H) = 4096: T = 2 x 120 x 128 x 256 / 4096
    assert two_wave_rows(kimi, 120, p) == pytest.approx(1920.0)


@pytest.mark.parametrize("minibatch", [16, 64])  # several rounds; one round
def test_the_split_adds_up_to_the_last_gpus_end(minibatch):
    p = override(load_profile("gb200-nvl72"), gpus=4)
    r = simulate(SMALL, p, 64, routing="skewed", minibatch=minibatch, comm_sms=8)
    t = r.rounds
    parts = ("start_s", "shared_s", "fill_s", "routed_compute_s", "gaps_s", "drain_s")
    assert sum(t[k] for k in parts) == pytest.approx(t["end_s"], rel=1e-9)
    assert t["end_s"] * 1e6 == pytest.approx(r.layer_time_us, rel=1e-9)
    assert all(t[k] >= -1e-12 for k in parts)
    assert t["rounds"] == r.inputs["num_minibatches"] == len(t["round_rows"]) == len(t["down_waves"])
    assert sum(t["round_rows"]) == r.per_gpu["rows"][t["gpu"]]
    assert sum(t["round_compute_s"]) == pytest.approx(t["routed_compute_s"])
    assert t["signalling_s"] == pytest.approx(t["rounds"] * (p.protocol.pull_signal_s + p.protocol.push_signal_s))
    assert json.loads(r.to_json(links=False))["rounds"]["rounds"] == t["rounds"]  # in --json, strict JSON


def test_the_minibatch_curve_is_the_event_model_at_each_minibatch():
    from megamoe.simulator import build_workload, simulate_workload
    from megamoe.simulator.knobs import minibatch_curve

    p = override(load_profile("gb200-nvl72"), gpus=4)
    w = build_workload(SMALL, 4, 64, "skewed", "contiguous", minibatch=64, seed=3)
    curve = minibatch_curve(w, p, (16, 64), comm_sms=8)
    one = simulate_workload(build_workload(SMALL, 4, 64, "skewed", "contiguous", minibatch=16, seed=3), p, comm_sms=8)
    assert [c["rounds"] for c in curve] == [4, 1]
    assert curve[0]["layer_us"] == pytest.approx(one.layer_time_us, rel=1e-9)  # rebatched = built at that minibatch
    assert curve[0]["fill_us"] + curve[0]["drain_us"] < curve[1]["fill_us"] + curve[1]["drain_us"]  # one round pipelines nothing


def test_one_stream_shares_the_last_wave_but_keeps_the_dependency():
    from megamoe.simulator.gemm_cost import GemmCost, ffn_cost, ffn_roofline_s, one_stream_s

    def stage(tiles, slots):  # tiles of one unit of time each; alone they take ceil(tiles / slots)
        waves = float(-(-tiles // slots))
        return GemmCost(waves, waves, 0.0, 0.0, 0.0, 0.0, tiles, stream=(np.array([tiles]), np.array([1.0]), slots))

    assert one_stream_s(stage(3, 2), stage(3, 2)) == 3.0  # 6 unit tiles on 2 slots; one launch each: 2 + 2
    assert one_stream_s(stage(1, 4), stage(1, 4)) == 2.0  # a down tile waits for its gate/up tile
    p = load_profile("gb300-nvl72")
    kw = dict(profile=p, num_sms=120, weight_dtype="fp8", act_dtype="fp8")
    for rows in ([85] * 6, [341] * 6, [40, 900, 3000]):  # under a wave, a few waves, uneven experts
        one, two = ffn_cost(rows, 7168, 2048, one_stream=True, **kw), ffn_cost(rows, 7168, 2048, **kw)
        assert one.time_s <= two.time_s * (1 + 1e-12)
        assert one.time_s >= ffn_roofline_s(rows, 7168, 2048, profile=p, weight_dtype="fp8", act_dtype="fp8") * 120 / 160
        assert one.flops == two.flops and one.hbm_bytes == two.hbm_bytes
