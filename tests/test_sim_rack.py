"""The rack model's behaviour: per-peer copies, milestones and limits, the fused schedule's pipeline,
bounded buffers, L2 residency, one GPU, and the calibration to the published points."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from megamoe.reference import MoEConfig
from megamoe.simulator import simulate, simulate_workload
from megamoe.simulator.entities import Fabric
from megamoe.simulator.hardware import comm_sm_curve, load_profile, override
from megamoe.simulator.schedules import Layout, _peer_flows, build_layer_work
from megamoe.simulator.workload import build_workload

FOUR = MoEConfig(hidden_size=128, intermediate_size=128, num_experts=4, top_k=1, name="four")


def _bare_two_gpus(**extra):
    """2 GPUs, one 1e9 B/s link each way, no fixed costs, no message cost, a hard port limit."""
    return override(load_profile("hgx-h200"), gpus=2, links_per_gpu=1, link_bandwidth=1e9, payload_efficiency=1.0,
                    link_latency=0.0, gpu__kernel_launch_s=0.0, gpu__grid_sync_s=0.0, message_cost=0.0,
                    comm_sm_exponent=50, megakernel__router_topk_s=0.0, megakernel__layer_barrier_s=0.0, **extra)


# ---------------------------------------------------------------------------- the fabric
def test_a_slow_peer_slows_only_its_own_flow():
    # GPU 0 pulls 1 MB from GPU 1 and 1 MB from GPU 2, whose send port is ten times slower. As one
    # coflow both parts would move at GPU 2's rate; per peer, GPU 1's part ends at its own rate.
    env = simpy.Environment()
    lay = Layout(3)
    fab = Fabric(env, np.zeros(0))
    flows = _peer_flows(fab, lay, 0, np.array([0.0, 1e6, 1e6]), "pull", pull=True, copy_coef=1.0)
    cap = np.full(12, 1e9)  # send, recv, copy, HBM for 3 GPUs
    cap[lay.send(2)] = 1e8
    fab.set_capacity(cap)
    fab.start_many(list(flows.values()))
    env.run()
    assert fab.end_s[flows[1]] == pytest.approx(1e6 / 9e8, rel=1e-9)  # shares g0's receive port with the slow part
    assert fab.end_s[flows[2]] == pytest.approx(1e-2, rel=1e-9)


def test_milestone_fires_when_every_flow_has_delivered_its_share():
    env = simpy.Environment()
    fab = Fabric(env, np.array([1e9, 2e9]))
    a = fab.add([0], [1.0], 1e9)
    b = fab.add([1], [1.0], 1e9)
    m = fab.milestone([a, b], [5e8, 8e8])  # a reaches 5e8 at 0.5 s, b reaches 8e8 at 0.4 s
    seen = []
    fab.milestone_event(m).callbacks.append(lambda _e: seen.append(env.now))
    fab.start_many([a, b])
    env.run()
    assert seen == [pytest.approx(0.5)]


def test_a_limited_flow_sends_only_what_it_is_allowed():
    # a push of 1e9 B that may send half at t = 0 and the rest from t = 2 s: ends at 2.5 s, not 1 s
    env = simpy.Environment()
    fab = Fabric(env, np.array([1e9]))
    f = fab.add([0], [1.0], 1e9, limited=True)

    def proc():
        fab.raise_limit([f], [5e8])
        fab.start(f)
        yield env.timeout(2.0)
        fab.raise_limit([f], [5e8])

    env.process(proc())
    env.run()
    assert fab.end_s[f] == pytest.approx(2.5)


def test_comm_sm_curve_is_linear_when_few_and_flat_at_the_port():
    n = np.array([1, 2, 1000])
    b = comm_sm_curve(n, 1e9, 100e9, 4.0)
    assert b[1] == pytest.approx(2 * b[0], rel=1e-6) and b[0] == pytest.approx(1e9, rel=1e-6)
    assert b[2] == pytest.approx(100e9, rel=1e-3) and (b <= 100e9).all()


# ---------------------------------------------------------------------------- the fused schedule
def _two_experts_on_gpu1(minibatch=None):
    # GPU 0's 8 tokens: 4 to expert 2, 4 to expert 3, both on GPU 1 (contiguous); GPU 1's tokens stay home
    idx = np.array([[2]] * 4 + [[3]] * 4 + [[2]] * 8, np.int64)
    return build_workload(FOUR, 2, 8, "uniform", "contiguous", minibatch=minibatch, topk_idx=idx)


def test_an_expert_computes_before_the_whole_minibatch_has_landed():
    r = simulate_workload(_two_experts_on_gpu1(), _bare_two_gpus(), schedule="fused", comm_sms=4, resolution=0)
    pull = [s for s in r._spans if s.gpu == 1 and s.track == "dispatch"]
    first = [s for s in r._spans if s.gpu == 1 and s.name == "slot 2 mb0"]
    assert len(pull) == 1 and len(first) == 1
    assert first[0].start_s < pull[0].end_s  # slot 2's rows come first in the pull
    push = [s for s in r._spans if s.gpu == 1 and s.track == "combine"]
    second = [s for s in r._spans if s.gpu == 1 and s.name == "slot 3 mb0"]
    assert push[0].start_s < second[0].end_s  # slot 2's results go back while slot 3 computes


def test_fused_overlaps_what_bulk_runs_in_a_row():
    w = _two_experts_on_gpu1()
    p = _bare_two_gpus()
    bulk = simulate_workload(w, p, schedule="bulk", comm_sms=4, resolution=0)
    fused = simulate_workload(w, p, schedule="fused", comm_sms=4, resolution=0)
    assert fused.layer_time_us < bulk.layer_time_us


def test_bounded_buffers_hold_the_pulls_back():
    w = build_workload(MoEConfig.preset("qwen3-30b-a3b"), 8, 256, "uniform", "contiguous", minibatch=32, seed=1)
    p = load_profile("hgx-h200")
    one = simulate_workload(w, override(p, buffer_minibatches=1), schedule="fused", comm_sms=16, resolution=0)
    many = simulate_workload(w, override(p, buffer_minibatches=8), schedule="fused", comm_sms=16, resolution=0)
    assert one.layer_time_us >= many.layer_time_us * (1 - 1e-9)
    for g in range(8):  # with one buffer, minibatch 1 is pulled only once minibatch 0 is computed
        done0 = max(s.end_s for s in one._spans if s.gpu == g and s.track == "compute" and s.name.endswith(" mb0")
                    and s.name.startswith("slot"))
        pull1 = [s for s in one._spans if s.gpu == g and s.name == "pull mb1"]
        assert pull1 and pull1[0].start_s >= done0 - 1e-12


def test_weights_stay_in_l2_between_minibatches_only_if_they_fit():
    w = build_workload(MoEConfig.preset("qwen3-30b-a3b"), 8, 256, "uniform", "contiguous", minibatch=64, seed=1)
    p = load_profile("hgx-h200")
    kw = dict(schedule="fused", comm_sms=16, weight_dtype="bf16", dispatch_dtype="bf16")
    fits, _ = build_layer_work(w, override(p, l2_weight_fraction=1.0, gpu__l2_bytes=1e11), **kw)
    spills, _ = build_layer_work(w, override(p, l2_weight_fraction=0.0), **kw)
    cfg = w.config
    wbytes = 3 * cfg.hidden_size * cfg.intermediate_size * 2
    touched = (w.rows_slot_mb > 0)
    acts = fits.job_hbm_bytes.sum() - wbytes * touched.any(axis=1).sum()  # weights read once
    assert spills.job_hbm_bytes.sum() == pytest.approx(acts + wbytes * touched.sum())  # once per minibatch


def test_fused_on_one_gpu_is_no_slower_than_bulk():
    # one GPU moves nothing: the megakernel needs no communication SMs and no minibatches
    for tokens in (64, 4096, 16384):
        f = simulate("deepseek-v3", "h200", tokens, schedule="fused", minibatch=512)
        b = simulate("deepseek-v3", "h200", tokens, schedule="bulk")
        assert f.layer_time_us <= b.layer_time_us
        assert f.inputs["compute_sms"] == load_profile("h200").num_sms


def test_fixed_costs_and_the_owners_reduction_are_charged():
    p = load_profile("gb200-nvl72")
    r = simulate("qwen3-30b-a3b", "gb200-nvl72", 1, routing="uniform")
    assert r.layer_time_us * 1e-6 >= p.kernel_launch_s + p.rack.router_topk_s + p.rack.layer_barrier_s
    assert any(s.name.startswith("reduce") for s in r._spans)


# ---------------------------------------------------------------------------- calibration
def _calibration():
    from benchload import load_benchmark

    return load_benchmark("rack_calibration")


def test_the_profile_reproduces_its_calibration_points():
    cal = _calibration()
    p = load_profile(cal.SYSTEM)
    shape = cal.fit_shape(p.port_bytes_per_s)
    assert shape["exponent"] == pytest.approx(p.rack.saturation_exponent, rel=1e-3)
    assert np.allclose(shape["ratio_model_over_measured"], 1.0, atol=0.01)  # DeepEP V1's three points (quoted by HybridEP's document)
    t = cal.mok_layer_s(p.sm_copy_bytes_per_s, p.rack.saturation_exponent)
    assert t == pytest.approx(cal.MOK["layer_s"], rel=0.01)  # Mixture-of-Kittens at 8 communication SMs


@pytest.mark.parametrize("system", ["gb200-nvl72", "hgx-h200"])  # 18 links over 18 chips; over 4 chips, unevenly
def test_link_bytes_without_the_graph_match_the_graph(system):
    from megamoe.simulator.topology import build_topology, link_bytes, stripe, uniform_link_bytes

    p = load_profile(system)
    traffic = np.random.default_rng(0).random((p.num_gpus, p.num_gpus)) * 1e9
    graph = build_topology(p)
    want = link_bytes(graph, traffic)
    got, bw, frac = uniform_link_bytes(p, traffic)
    assert got.keys() == want.keys()
    assert all(got[e] == pytest.approx(want[e], rel=1e-12) for e in want)
    assert all(bw[(u, v)] == graph[u][v]["bandwidth_bytes_per_s"] for u, v in want)
    assert frac == pytest.approx({c: f for (u, c, f) in stripe(graph, 0, 1) if u == ("gpu", 0)})
