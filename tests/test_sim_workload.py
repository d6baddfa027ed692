"""Routing, traces, placement and the per-GPU work read off the reference's dispatch plan."""

from __future__ import annotations

import numpy as np
import pytest

from megamoe.reference import MoEConfig, plan_dispatch, rank_traffic
from megamoe.simulator.placement import assign_slots, contiguous, default_num_slots, eplb, make_placement, round_robin
from megamoe.simulator.workload import (
    TraceError,
    build_workload,
    calibrate_zipf,
    imbalance,
    load_trace,
    make_topk,
    parse_routing,
    sample_topk,
    zipf_popularity,
)

SMALL = MoEConfig(hidden_size=64, intermediate_size=32, num_experts=16, top_k=4, name="small")


@pytest.mark.parametrize(
    "text, kind, value",
    [("uniform", "uniform", None), ("skewed", "skewed", 10.9), ("skewed:2.5", "skewed", 2.5),
     ("zipf:1.2", "zipf", 1.2), ("hot:0.5", "hot", 0.5), ("router", "router", None)],
)
def test_parse_routing(text, kind, value):
    s = parse_routing(text)
    assert (s.kind, s.value) == (kind, value)


@pytest.mark.parametrize("text", ["zipf", "skewed:-1", "hot:2", "hot:0.5:0", "uniform:3", "trace", "gaussian"])
def test_parse_routing_rejects(text):  # each malformed form names itself
    with pytest.raises(ValueError, match="routing"):
        parse_routing(text)


@pytest.mark.parametrize("routing", ["uniform", "skewed:1.5", "zipf:1.0", "hot:0.6:2", "router"])
def test_topk_rows_are_distinct_and_in_range(routing):
    a = make_topk(SMALL, 500, routing, seed=3)
    assert a.shape == (500, 4) and a.min() >= 0 and a.max() < 16
    assert (np.sort(a, axis=1)[:, 1:] != np.sort(a, axis=1)[:, :-1]).all()
    assert np.array_equal(a, make_topk(SMALL, 500, routing, seed=3))  # deterministic for a seed


@pytest.mark.parametrize(
    "E, K, target",
    [(256, 8, 10.9), (256, 8, 1.79), (384, 8, 10.9), (128, 8, 3.0)],  # TRT-LLM's no-LB and EPLB ratios; Kimi K2; Qwen3
)
def test_skew_calibration_hits_target(E, K, target):
    s = calibrate_zipf(E, K, target)
    a = sample_topk(zipf_popularity(E, s, 0), 200_000, K, 1)
    got = imbalance(np.bincount(a.ravel(), minlength=E))
    assert got == pytest.approx(target, rel=0.08)  # Hajek's approximation and sampling noise


def test_skew_beyond_limit_is_an_error():
    with pytest.raises(ValueError, match="must be in"):
        calibrate_zipf(16, 4, 3.0)  # 16/4 - 1 = 3: the hottest expert in every token


def test_hot_expert_fraction():
    a = make_topk(SMALL, 20_000, "hot:0.75", seed=0)
    counts = np.bincount(a.ravel(), minlength=16)
    assert counts.max() / 20_000 == pytest.approx(0.75, abs=0.02)


def test_csv_and_npz_traces(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("# expert ids\n0,1,2,3\n4,5,6,7\n")
    assert load_trace(f, 16, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    z = tmp_path / "t.npz"
    np.savez(z, topk_idx=np.array([[3, 2, 1, 0]]))
    assert load_trace(z, 16, 4).tolist() == [[3, 2, 1, 0]]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("0,1,2,3\n0,1,2\n", "line 2: expected 4 expert ids, got 3"),  # short line
        ("0,1,2,3\n0,1,x,3\n", "line 2: expert ids must be integers"),  # not a number
        ("0,1,2,16\n", "line 1: expert id 16 is outside [0, 16)"),  # out of range
        ("0,1,1,3\n", "line 1: names an expert twice"),  # duplicate
        ("# nothing\n", "no token lines"),
    ],
)
def test_bad_csv_trace_names_line(tmp_path, text, needle):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(TraceError, match="bad.csv") as e:
        load_trace(f, 16, 4)
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "arrays, needle",
    [
        ({"idx": np.zeros((1, 4), int)}, "no array named 'topk_idx'"),
        ({"topk_idx": np.zeros((2, 3), int)}, "shape [T, 4]"),
        ({"topk_idx": np.full((1, 4), 0.5)}, "must be integers"),
        ({"topk_idx": np.array([[0, 1, 2, 99]])}, "topk_idx[0, 3]=99"),
    ],
)
def test_bad_npz_trace(tmp_path, arrays, needle):
    f = tmp_path / "bad.npz"
    np.savez(f, **arrays)
    with pytest.raises(TraceError) as e:
        load_trace(f, 16, 4)
    assert needle in str(e.value)


def test_trace_too_short_for_the_run(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("0,1,2,3\n")
    with pytest.raises(TraceError, match="has 1 tokens but the run needs 8"):
        build_workload(SMALL, 2, 4, f"trace:{f}")


# ---------------------------------------------------------------------------- placement
def test_contiguous_and_round_robin():
    assert contiguous(8, 4).slot_rank.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert round_robin(8, 4).slot_rank.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert contiguous(256, 72).slots_per_gpu().tolist().count(4) == 40  # 256 = 40 * 4 + 32 * 3


def test_eplb_by_hand():
    # 4 experts, loads 8, 1, 1, 2 on 2 GPUs with 6 slots: both redundant slots go to expert 0
    # (8 -> 4 per replica, then 4 -> 2.67). Packing, heaviest first, 3 slots per GPU:
    # 2.67 -> g0, 2.67 -> g1, 2.67 -> g0 (tie), 2 -> g1, 1 -> g1, 1 -> g0 (g1 full): 6.33 and 5.67
    pl = eplb(np.array([8.0, 1.0, 1.0, 2.0]), 2, 6)
    assert pl.replicas().tolist() == [3, 1, 1, 1]
    per_gpu = np.bincount(pl.slot_rank, weights=np.array([8.0, 1, 1, 2])[pl.slot_expert] / pl.replicas()[pl.slot_expert])
    assert per_gpu.tolist() == pytest.approx([19 / 3, 17 / 3])
    assert pl.slots_per_gpu().tolist() == [3, 3]


def test_default_slots():
    assert default_num_slots(256, 72) == 288  # DeepSeek's 32 redundant experts
    assert default_num_slots(384, 72) == 432
    assert default_num_slots(8, 72) == 72  # fewer experts than GPUs: every GPU gets a replica


def test_assign_slots_prefers_local_then_round_robin():
    pl = eplb(np.array([8.0, 1.0, 1.0, 2.0]), 2, 6)
    topk = np.array([[0], [0], [0], [0]])
    token_rank = np.array([0, 0, 1, 1])
    slots = assign_slots(topk, token_rank, pl)
    assert (pl.slot_expert[slots] == 0).all()  # the right expert, always
    local = pl.slot_rank[slots] == token_rank[:, None]
    has_local = [(pl.slot_rank[pl.slot_expert == 0] == g).any() for g in token_rank]
    assert (local.ravel() == np.array(has_local)).all()


# ---------------------------------------------------------------------------- workload = the reference's plan
@pytest.mark.parametrize("placement", ["contiguous", "round_robin", "random", "eplb"])
@pytest.mark.parametrize("minibatch", [None, 3])  # one minibatch; uneven minibatches (10 = 3+3+3+1)
def test_workload_matches_reference_plan(placement, minibatch):
    G, Tg = 4, 10
    w = build_workload(SMALL, G, Tg, "skewed:1.5", placement, minibatch=minibatch, seed=1)
    pl = w.placement
    # each (token, expert) pair goes to a slot of that expert, and is computed exactly once
    assert np.array_equal(pl.slot_expert[w.slot_topk_idx], w.topk_idx)
    plan = plan_dispatch(w.slot_topk_idx, pl.num_slots)
    assert np.array_equal(w.rows_slot, plan.counts)
    assert w.rows_slot_mb.sum() == G * Tg * SMALL.top_k
    ref = rank_traffic(w.slot_topk_idx, w.token_rank, pl.slot_rank, G)
    assert np.array_equal(w.traffic, ref)


def test_gpu_and_expert_imbalance_reported():
    w = build_workload(SMALL, 4, 64, "uniform", "contiguous", seed=0)
    imb = w.imbalance()
    assert set(imb) == {"by_gpu", "by_expert", "by_slot"}
    assert imb["by_expert"] == pytest.approx(imbalance(np.bincount(w.topk_idx.ravel(), minlength=16)))


def test_eplb_flattens_gpu_load():
    cfg = MoEConfig(hidden_size=64, intermediate_size=32, num_experts=64, top_k=4, name="e64")
    a = build_workload(cfg, 8, 512, "skewed:5", "contiguous", seed=0)
    b = build_workload(cfg, 8, 512, "skewed:5", "eplb", seed=0)
    assert b.imbalance()["by_gpu"] < 0.5 * a.imbalance()["by_gpu"]


def test_make_placement_rejects_unknown():
    with pytest.raises(ValueError, match="placement must be one of"):
        make_placement("striped", 8, 2)
