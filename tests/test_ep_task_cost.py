"""simulator/ep_task_cost.py: the fused EP launch's plan (reference.ep_tasks) priced and scheduled on one GPU.

Behaviour only: waits respected, link bytes priced, programs helping, the empty and one-rank plans, bad
inputs named. No timing figure is asserted; every expectation comes from the plan or the profile."""

from __future__ import annotations

import numpy as np
import pytest

from megamoe.reference.ep import plan_ep, plan_pull
from megamoe.reference.ep_tasks import EP_KINDS, plan_fused_ep, slot_pair_counts
from megamoe.simulator.cost import resolve_profile
from megamoe.simulator.ep_task_cost import ep_task_costs, link_rate, predict_ep_layer, predict_fused_ep

PROFILE = "hgx-h200"
PULL, GEMM1, GEMM2, PUSH = range(4)


def _routing(rng, R, tokens, P, K, placement="contiguous"):
    """slot_rank (P,) and each rank's (T_r, K) distinct slot ids; "hot_last": most slots on the last rank."""
    if placement == "hot_last":
        slot_rank = np.where(np.arange(P) < P // 4, np.arange(P) % max(R - 1, 1), R - 1).astype(np.int64)
    else:
        slot_rank = np.repeat(np.arange(R, dtype=np.int64), -(-P // R))[:P]
    idx = [np.array([rng.permutation(P)[:K] for _ in range(T)], np.int64).reshape(T, K) for T in tokens]
    return slot_rank, idx


def _plans(rng, R, tokens, *, P=16, K=4, H=256, I=128, bm=16, bn1=32, bn2=64, max_rows=8, placement="contiguous",
           idx=None):
    slot_rank, drawn = _routing(rng, R, tokens, P, K, placement)
    idx = drawn if idx is None else idx
    pull = plan_pull(plan_ep(idx, slot_rank, R), H, 2, max_rows=max_rows, meta_bytes=K * 20)
    counts = np.stack([slot_pair_counts(i, P) for i in idx])
    plans = [plan_fused_ep(pull, r, counts, slot_rank, top_k=K, hidden_size=H, intermediate_size=I, block_m=bm,
                           block_n1=bn1, block_n2=bn2) for r in range(R)]
    return pull, plans, idx


@pytest.mark.parametrize("programs", [1, 5, None], ids=["one", "five", "default"])
def test_every_task_starts_after_the_tasks_it_waits_on_end(rng, programs):
    """For each (counter, target) a task waits on, the target-th of the counter's signalling tasks (by end
    time) ends no later than the task starts; every task with work takes time."""
    _, plans, _ = _plans(rng, 4, [40, 23, 57, 0])
    for plan in plans:
        r = predict_fused_ep(plan, PROFILE, num_programs=programs)
        start, end = r["start_s"], r["end_s"]
        assert start.shape == end.shape == (plan.num_tasks,)
        signallers = [[] for _ in plan.counters]
        for t in range(plan.num_tasks):
            for c in plan.signals(t):
                signallers[c].append(t)
        waited = 0
        for t in range(plan.num_tasks):
            for c, v in plan.waits(t):
                if v == 0:  # a peer step with no copies: met at launch
                    continue
                ends = np.sort(end[signallers[c]])
                assert ends[v - 1] <= start[t] + 1e-15, f"rank {plan.rank} task {t} starts before {plan.counters[c]}"
                waited += 1
        work = (plan.rows > 0) | (plan.weight_bytes > 0) | (plan.link_bytes > 0)
        assert (end - start)[work].min() > 0 and work.all()
        assert r["makespan_s"] == pytest.approx(end.max()) and r["time_s"] > r["makespan_s"]
        assert sum(r["critical_path_s"].values()) == pytest.approx(r["makespan_s"])
        assert waited > 0 or plan.num_tasks == 0


def test_more_link_bytes_take_longer_pulls(rng):
    """Four times the tokens (the first T's routing repeated): more bytes over the link, so the remote
    pulls take longer, alone and as a phase; a slower link stretches them further."""
    _, small, idx = _plans(rng, 2, [32, 32], max_rows=None)
    _, large, _ = _plans(rng, 2, [128, 128], max_rows=None, idx=[np.tile(i, (4, 1)) for i in idx])
    for a, b in zip(small, large):
        remote = lambda plan: (plan.kind == PULL) & (plan.link_bytes > 0)  # noqa: E731
        assert plan_link(b) > plan_link(a) > 0
        ca, cb = ep_task_costs(a, PROFILE), ep_task_costs(b, PROFILE)
        assert cb["link_s"][remote(b)].sum() > ca["link_s"][remote(a)].sum() > 0
        ra, rb = predict_fused_ep(a, PROFILE), predict_fused_ep(b, PROFILE)
        assert rb["busy_s"]["pull"] > ra["busy_s"]["pull"]
        assert rb["span_s"]["pull"][1] > ra["span_s"]["pull"][1]
        bw = resolve_profile(PROFILE).link_bandwidth_bytes_per_s
        slow = predict_fused_ep(b, PROFILE, overrides={"link_bandwidth": bw / 4})
        assert slow["busy_s"]["pull"] > rb["busy_s"]["pull"] and slow["time_s"] > rb["time_s"]


def plan_link(plan) -> float:
    return float(plan.link_bytes[plan.kind == PULL].sum())


def test_doubling_programs_never_slows_a_gemm_heavy_launch(rng):
    _, plans, _ = _plans(rng, 2, [96, 80], P=8, K=2, H=1024, I=512, max_rows=16)
    plan = plans[0]
    n = plan.tasks_per_kind()
    assert n["gemm1"] + n["gemm2"] > 10 * (n["pull"] + n["push"])
    spans = [predict_fused_ep(plan, PROFILE, num_programs=P)["makespan_s"] for P in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    for fewer, more in zip(spans, spans[1:]):
        assert more <= fewer * (1 + 1e-3)
    assert spans[-1] < spans[0] / 4


def test_copies_cut_in_chunks_spread_over_programs(rng):
    """The same rows pulled in chunks of 4 instead of one copy per peer: more programs copy at once, each
    below the per-SM cap, so the pull phase ends sooner; the per-program link rate falls as programs
    share the port, and their sum never exceeds it."""
    _, whole, idx = _plans(rng, 4, [64, 64, 64, 64], max_rows=None)
    _, cut, _ = _plans(rng, 4, [64] * 4, max_rows=4, idx=idx)
    for a, b in zip(whole, cut):
        assert plan_link(a) == plan_link(b)
        assert predict_fused_ep(b, PROFILE)["span_s"]["pull"][1] < predict_fused_ep(a, PROFILE)["span_s"]["pull"][1]
    p = resolve_profile(PROFILE)
    m = np.arange(1, 300)
    r = link_rate(p, m)
    assert np.all(np.diff(r) < 0) and r.max() <= p.sm_copy_bytes_per_s * (1 + 1e-9)
    assert np.all(np.diff(r * m) >= -1e-9 * p.port_bytes_per_s) and (r * m).max() <= p.port_bytes_per_s * (1 + 1e-9)


def test_an_empty_plan_costs_the_launch(rng):
    pull, plans, _ = _plans(rng, 4, [0, 0, 0, 0])
    km = resolve_profile(PROFILE).kernel
    for plan in plans:
        assert plan.num_tasks == 0
        r = predict_fused_ep(plan, PROFILE)
        assert r["makespan_s"] == 0 and r["start_s"].size == 0 and r["span_s"] == {}
        assert r["time_s"] == pytest.approx(km.launch_gap_s + km.graph_fixed_s) == pytest.approx(r["launch_s"])
        assert all(v == 0 for v in r["busy_s"].values())
    layer = predict_ep_layer(plans, pull, 0, PROFILE)
    assert layer["terms_s"]["fused"] == pytest.approx(r["launch_s"])
    assert layer["terms_s"]["pack"] == pytest.approx(km.launch_gap_s) == pytest.approx(layer["terms_s"]["combine"])


def test_one_rank_moves_nothing_over_the_link(rng):
    """R = 1: no link bytes; a pull is its HBM part and the task's fixed cost, the link's figures do not
    matter, and they do for two ranks."""
    pull, (plan,), _ = _plans(rng, 1, [50], max_rows=16)
    assert plan.link_bytes.sum() == 0
    c = ep_task_costs(plan, PROFILE, num_programs=1)
    assert (c["link_s"] == 0).all()
    r = predict_fused_ep(plan, PROFILE, num_programs=1)
    pulls = plan.kind == PULL
    assert pulls.any()
    assert np.allclose((r["end_s"] - r["start_s"])[pulls], c["hbm_s"][pulls] + c["fixed_s"], rtol=1e-12)
    assert (c["hbm_s"][pulls] > 0).all()
    slow = {"link_bandwidth": 1e9, "link_latency": 1e-4}
    assert predict_fused_ep(plan, PROFILE, overrides=slow)["time_s"] == pytest.approx(predict_fused_ep(plan, PROFILE)
                                                                                     ["time_s"])
    one = predict_ep_layer([plan], pull, 50, PROFILE)
    assert one["time_s"] == pytest.approx(predict_ep_layer([plan], pull, 50, PROFILE, overrides=slow)["time_s"])
    pull2, plans2, _ = _plans(rng, 2, [50, 50], max_rows=16)
    assert predict_ep_layer(plans2, pull2, 50, PROFILE, overrides=slow)["time_s"] > \
        predict_ep_layer(plans2, pull2, 50, PROFILE)["time_s"]


def test_the_layer_waits_for_its_slowest_rank(rng):
    """Most slots on the last rank: it receives the most rows and computes the most tiles, so its launch
    sets the layer's fused term; the terms add up to the layer."""
    R = 4
    pull, plans, _ = _plans(rng, R, [48] * R, placement="hot_last")
    layer = predict_ep_layer(plans, pull, [48] * R, PROFILE)
    assert layer["slowest_rank"] == R - 1 and int(np.argmax(pull.recv_rows)) == R - 1
    assert layer["terms_s"]["fused"] == pytest.approx(max(r["time_s"] for r in layer["ranks"]))
    assert layer["time_s"] == pytest.approx(sum(layer["terms_s"].values()))
    assert [r["rank"] for r in layer["ranks"]] == list(range(R))
    assert set(layer["ranks"][0]["busy_s"]) == set(EP_KINDS)


def test_bad_inputs_are_named(rng):
    pull, plans, _ = _plans(rng, 2, [10, 12])
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match=f"num_programs must be an integer >= 1, got {bad!r}"):
            predict_fused_ep(plans[0], PROFILE, num_programs=bad)
    with pytest.raises(ValueError, match="num_warps must be an integer >= 1, got 0"):
        ep_task_costs(plans[0], PROFILE, num_warps=0)
    with pytest.raises(ValueError, match="plan must be a reference.ep_tasks.FusedEPPlan .*got PullSchedule"):
        predict_fused_ep(pull, PROFILE)
    with pytest.raises(ValueError, match="plan must be .*got dict"):
        ep_task_costs({"kind": []}, PROFILE)
    with pytest.raises(ValueError, match="plans must be a list of the 2 ranks' FusedEPPlan .*got 1"):
        predict_ep_layer(plans[:1], pull, 10, PROFILE)
    with pytest.raises(ValueError, match=r"plans\[0\] is rank 1 of 2; expected rank 0 of 2"):
        predict_ep_layer(plans[::-1], pull, 10, PROFILE)
    with pytest.raises(ValueError, match="tokens_per_rank must be an integer >= 0 or 2 of them"):
        predict_ep_layer(plans, pull, [10, -1], PROFILE)
    with pytest.raises(ValueError, match="pull must be a reference.ep.PullSchedule"):
        predict_ep_layer(plans, plans[0], 10, PROFILE)
