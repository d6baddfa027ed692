"""The megakernel (one persistent launch) against its task plan and the float64 reference.

Under the interpreter the launch's programs run one after another: program 0 takes every ticket in
plan order and the others find none left, so these tests also check that the plan's order alone
finishes the layer (no task waits on a later one) and that the last program out resets the sync
words. Numerics of every router family are in test_kernels_moe.py (both backends)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from megamoe.reference import InputError, MoEConfig, assert_close, moe_forward, random_weights, round_to_dtype
from megamoe.reference.tiles import KINDS, task_layout, task_plan

pytestmark = [
    pytest.mark.interpret,
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                       reason="interpreter tests need TRITON_INTERPRET=1 (set automatically without a GPU)"),
]

BASE = dict(hidden_size=40, intermediate_size=36, num_experts=7, top_k=3)
#: name -> (config fields, T, why)
CASES = {
    "one_chunk": (dict(num_shared_experts=1, shared_intermediate_size=20, shared_expert_gate=True), 5,
                  "one logits chunk split over H, top-k groups of 4 tokens (G = 2: scan, scatter); gated shared MLP"),
    "one_token": (dict(router="sigmoid_grouped_topk", num_experts=8, n_group=4, topk_group=2, score_bias=True), 1,
                  "decode: a one-row top-k task that aligns too (G = 1)"),
    "two_chunks": (dict(router="sigmoid_grouped_topk", num_experts=8, n_group=4, topk_group=2, score_bias=True,
                        num_shared_experts=1, shared_intermediate_size=20), 37,
                   "C = 2: scan and scatter tasks; grouped router; shared MLP overlapping the router"),
    "top1_input": (dict(router="sigmoid_top1_input", top_k=1), 23, "K = 1, routing weight on the input"),
}
#: gpt-oss's expert: clamped SwiGLU with gate/up and down biases, a router bias
SWIGLU_BIASES = dict(router="softmax_topk", router_bias=True, activation="clamped_swiglu", swiglu_alpha=1.702,
                     swiglu_limit=7.0, expert_bias=True)


def _cpu(cfg, T, rng, *, router_zero=False):
    w = random_weights(cfg, seed=int(rng.integers(1 << 30)))
    if router_zero:  # every logit ties: every token picks experts 0..K-1
        w = type(w)(**{**w.arrays(), "router_weight": np.zeros_like(w.router_weight)})
    x = rng.standard_normal((T, cfg.hidden_size))
    return x, w


def _mk(cfg, x, w, **kw):
    from megamoe.kernels.megakernel import megakernel_forward

    return megakernel_forward(torch.from_numpy(x).float(), w.to_torch("cpu", torch.float32), cfg, **kw)


def _const(kwargs: dict, name: str):
    from megamoe.kernels.megakernel import constexpr_values

    return constexpr_values(kwargs)[name]


#: case -> programs: one program taking every ticket, the interpreter's three (two find none left), five
PROGRAMS = {"one_chunk": 3, "one_token": 1, "two_chunks": 5, "top1_input": 3}


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_runs_the_plan(case, rng):
    """Tasks the kernel ran per kind, and tiles finished per expert, equal reference.tiles.task_plan's;
    the layer matches the float64 reference."""
    from megamoe.kernels.megakernel import megakernel_config

    fields, T, _why = CASES[case]
    programs = PROGRAMS[case]
    cfg = MoEConfig(**{**BASE, **fields})
    x, w = _cpu(cfg, T, rng)
    mk = megakernel_config(cfg, T, torch.float32, torch.device("cpu"))
    y, ran = _mk(cfg, x, w, record=True, mk=mk, nprog=programs)
    ref = moe_forward(round_to_dtype(x, "float32"), w.round_to("float32"), cfg, details=True)
    assert_close(y, ref.y, "float32", case)
    counts = np.bincount(ref.routing.topk_idx.ravel(), minlength=cfg.num_experts)
    plan = task_plan(cfg, counts, T, mk["tiles"], num_programs=ran["programs"])
    assert ran["programs"] == programs
    assert {k: ran[k] for k in KINDS} == plan.tasks_per_kind()
    np.testing.assert_array_equal(ran["gemm1_per_expert"], plan.tiles_per_expert("gemm1"))
    np.testing.assert_array_equal(ran["gemm2_per_expert"], plan.tiles_per_expert("gemm2"))


def test_layout_words_and_constexpr_groups(rng):
    """The static layout reaches the kernel as one int32 tensor of LAYOUT_WORDS (made once per layout
    and kept), its constexprs as the named groups; at most 100 parameters. A layout no longer planned
    (expert_slice tasks, stream-K segments) is refused by name."""
    from megamoe.kernels.megakernel import (
        CONSTEXPR_GROUPS,
        LAYOUT_WORDS,
        _megakernel,
        build_launch,
        layout_words,
        megakernel_config,
    )

    fields, T, _why = CASES["two_chunks"]
    cfg = MoEConfig(**{**BASE, **fields})
    x, w = _cpu(cfg, T, rng)
    xt, wt = torch.from_numpy(x).float(), w.to_torch("cpu", torch.float32)
    mk = megakernel_config(cfg, T, torch.float32, torch.device("cpu"))
    _g, args, kwargs, _y, _s = build_launch(xt, wt, cfg, mk, nprog=5)
    lay = task_layout(cfg, T, mk["tiles"])
    words = dict(zip(LAYOUT_WORDS, args[_megakernel.arg_names.index("lay_ptr")].tolist()))
    assert words == dict(zip(LAYOUT_WORDS, layout_words(lay, 5)))
    assert (words["nprog"], words["s0"], words["g"], words["b_max"]) == (5, lay.s0, lay.topk_groups, lay.b_max)
    assert words["max_tasks"] == lay.max_tasks and words["sync_n"] == lay.sync_words
    again = build_launch(xt, wt, cfg, mk, nprog=5)[1][_megakernel.arg_names.index("lay_ptr")]
    assert again is args[_megakernel.arg_names.index("lay_ptr")]
    assert set(CONSTEXPR_GROUPS) <= set(kwargs) and len(_megakernel.arg_names) <= 100
    assert _const(kwargs, "SPLIT") == (lay.split if lay.split > 1 else 0) and _const(kwargs, "KS") == cfg.top_k + 1
    routed = MoEConfig(**BASE)
    for part, key in (("gemm1", "SLICE"), ("order", "STREAM_K")):
        bad = megakernel_config(routed, 9, torch.float32, torch.device("cpu"))
        bad["tiles"]["router"].pop("ALIGN_EACH", None)
        bad["tiles"][part][key] = 16 if key == "SLICE" else 1
        with pytest.raises(InputError, match=key):
            build_launch(torch.zeros(9, routed.hidden_size), random_weights(routed, seed=1).to_torch("cpu", torch.float32),
                         routed, bad)


#: name -> config fields: one token routed by every GEMM 1 task itself (tiles["router"]["EACH"])
EACH = {
    "grouped": CASES["one_token"][0],
    "softmax_shared_gate": dict(num_shared_experts=1, shared_intermediate_size=20, shared_expert_gate=True),
    "top1_input": CASES["top1_input"][0],
    "swiglu_biases": SWIGLU_BIASES,
}


@pytest.mark.parametrize("case", list(EACH))
def test_gemm1_tasks_route_the_token_themselves(case, rng):
    """tiles["router"]["EACH"] at T = 1: each GEMM 1 task waits for the logits' partials and routes
    and aligns the token itself from its picks' ranks (the top-k task's values, stored again), not
    waiting for the top-k task; the float64 reference's answer into a poisoned buffer, bitwise the
    layer the top-k task's routing and align give (EACH off), the plan's tasks per kind (the same as
    without the switch) against what ran, and GEMM 1's waits on the logits."""
    programs = 4
    from megamoe.kernels.megakernel import build_launch, megakernel_config

    cfg = MoEConfig(**{**BASE, **EACH[case]})
    x, w = _cpu(cfg, 1, rng)
    mk = megakernel_config(cfg, 1, torch.float32, torch.device("cpu"))
    mk["tiles"]["router"].update(SPLIT=3, BLOCK_H=16)
    mk["tiles"]["router"]["EACH"] = 1
    kw = build_launch(torch.from_numpy(x).float(), w.to_torch("cpu", torch.float32), cfg, mk, nprog=programs)[2]
    assert _const(kw, "ROUTE_EACH") and _const(kw, "SPLIT") == 3
    y = torch.full((1, cfg.hidden_size), float("nan"))
    y, ran = _mk(cfg, x, w, record=True, mk=mk, out=y, nprog=programs)
    ref = moe_forward(round_to_dtype(x, "float32"), w.round_to("float32"), cfg, details=True)
    assert_close(y, ref.y, "float32", f"route each {case}")
    counts = np.bincount(ref.routing.topk_idx.ravel(), minlength=cfg.num_experts)
    plan = task_plan(cfg, counts, 1, mk["tiles"], num_programs=programs)
    assert {k: ran[k] for k in KINDS} == plan.tasks_per_kind()
    off = {**mk["tiles"], "router": {**mk["tiles"]["router"], "EACH": 0}}
    assert plan.tasks_per_kind() == task_plan(cfg, counts, 1, off, num_programs=programs).tasks_per_kind()
    y_off, ran_off = _mk(cfg, x, w, record=True, mk={**mk, "tiles": off}, nprog=programs)
    assert torch.equal(y, y_off) and ran_off["gemm1_per_expert"] == ran["gemm1_per_expert"]
    g1 = np.nonzero(plan.kind == KINDS.index("gemm1"))[0]
    assert g1.size and all(plan.waits(i) == [("logits[0]", 3)] for i in g1)
    with pytest.raises(InputError, match="EACH.*one token"):
        task_layout(cfg, 2, mk["tiles"])
    given = (torch.zeros((1, cfg.top_k), dtype=torch.int32), torch.full((1, cfg.top_k), 1.0 / cfg.top_k))
    with pytest.raises(InputError, match="routing given takes no router logits.*SPLIT.*must be 1"):
        build_launch(torch.from_numpy(x).float(), w.to_torch("cpu", torch.float32), cfg, mk, nprog=programs,
                     routing=given)
    with pytest.raises(InputError, match="EACH.*split router.*or reads a routing given"):
        task_plan(cfg, counts, 1, {**mk["tiles"], "router": {**mk["tiles"]["router"], "SPLIT": 1}})


@pytest.mark.parametrize("picks", ["distinct", "bad_slots"])
def test_gemm1_tasks_read_a_routing_given_themselves(picks, rng):
    """One token with the routing given (moe_experts' megakernel): the default config takes EACH, so
    every GEMM 1 task reads the token's K picks and aligns them itself, waiting for nothing (the
    plan's GEMM 1 tasks have no waits); the answer is bitwise the top-k task's align (EACH off) and
    the float64 reference's. ``bad_slots``: an id out of range and a repeated one, which moe_experts'
    check turns into unused experts of weight 0: they contribute nothing."""
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels.checks import launch_check, new_flag
    from megamoe.kernels.megakernel import megakernel_config
    from megamoe.kernels.peer import routed_reference

    cfg = MoEConfig(**{**BASE, "num_experts": 9, "top_k": 4})
    x, w = _cpu(cfg, 1, rng)
    ids = rng.choice(9, 4, replace=False)
    if picks == "bad_slots":
        ids[1], ids[3] = -1, ids[0]
    idx = torch.from_numpy(ids[None].astype(np.int32))
    wts = torch.from_numpy(rng.random((1, 4)).astype(np.float32))
    mk = megakernel_config(cfg, 1, torch.float32, torch.device("cpu"), routing_given=True)
    assert mk["tiles"]["router"]["EACH"] == 1 and mk["tiles"]["router"]["SPLIT"] == 1
    good = ids[(ids >= 0) & (np.arange(4) != 3)] if picks == "bad_slots" else ids
    counts = np.bincount(good, minlength=9)
    counts[0] += 4 - counts.sum()  # the plan's counts sum to T*K: the dropped slots' rows as one more expert's
    plan = task_plan(cfg, counts, 1, mk["tiles"], num_programs=3, routing_given=True)
    g1 = np.nonzero(plan.kind == KINDS.index("gemm1"))[0]
    assert g1.size and all(plan.waits(i) == [] for i in g1)
    wt = w.to_torch("cpu", torch.float32)
    xt = torch.from_numpy(x).float()
    y = kmoe.moe_experts(xt, idx, wts, wt.gate_up, wt.down, backend="megakernel", check=False)
    off = {**mk, "tiles": {**mk["tiles"], "router": {**mk["tiles"]["router"], "EACH": 0, "TOPK_T": 16}}}
    safe = launch_check(idx, wts, 9, new_flag("cpu"))  # what moe_experts gives the kernel: bad slots, weight 0
    y_off = _mk(cfg, x, w, mk=off, routing=safe)
    assert torch.equal(y, y_off)
    keep = torch.tensor([True, picks == "distinct", True, picks == "distinct"])
    ref = routed_reference(xt, idx[:, keep], wts[:, keep], wt.gate_up, wt.down, cfg, np.arange(1))
    assert_close(y.numpy(), ref, "float32", f"routing given, T = 1, {picks}")


#: name -> (config fields, T, BLOCK_M, router zero: every token on experts 0..K-1): GEMM 1 tasks that
#: place their own block's rows (tiles["router"]["ALIGN_EACH"]), no scan and scatter tasks
ALIGN_EACH = {
    "shared_gated": (CASES["one_chunk"][0], 5, 16, False),
    "grouped": (CASES["two_chunks"][0], 13, 16, False),
    "top1_input": (CASES["top1_input"][0], 23, 16, False),
    "swiglu_biases": (SWIGLU_BIASES, 11, 16, False),
    # an expert of 37 rows in 16-row blocks: ranks 16..31 and 32..36 of its pairs in later blocks
    "same_experts_blocks": ({}, 37, 16, True),
}


def _align_each(mk: dict, on: bool, topk_t: int = 4) -> dict:
    """``mk`` with a split router over 16-column ranges (G > 1 top-k tasks of topk_t tokens), ALIGN_EACH on or off."""
    mk = {**mk, "tiles": {**mk["tiles"], "router": dict(mk["tiles"]["router"], SPLIT=3, BLOCK_H=16, TOPK_T=topk_t)}}
    mk["tiles"]["router"].pop("EACH", None)
    mk["tiles"]["router"]["ALIGN_EACH"] = int(on)
    return mk


@pytest.mark.parametrize("case", list(ALIGN_EACH))
def test_gemm1_tasks_place_their_own_rows(case, rng):
    """tiles["router"]["ALIGN_EACH"]: no align_scan and align_scatter tasks; every dynamic task reads
    the layout from the top-k tasks' histograms and each GEMM 1 task places its block's rows. The
    float64 reference's answer into a poisoned buffer, bitwise what the scan and scatter give (the
    same rows in the same places), the plan's tasks per kind and tiles per expert against what ran,
    and GEMM 1 waiting for every top-k task, not for a scatter."""
    from megamoe.kernels.megakernel import build_launch, megakernel_config

    programs = 4
    fields, T, bm, zero = ALIGN_EACH[case]
    cfg = MoEConfig(**{**BASE, **fields})
    x, w = _cpu(cfg, T, rng, router_zero=zero)
    base = megakernel_config(cfg, T, torch.float32, torch.device("cpu"))
    base["tiles"]["gemm1"]["BLOCK_M"] = bm
    mk, off = _align_each(base, True), _align_each(base, False)
    kw = build_launch(torch.from_numpy(x).float(), w.to_torch("cpu", torch.float32), cfg, mk, nprog=programs)[2]
    assert _const(kw, "ALIGN_EACH") and _const(kw, "A_BP") >= T * cfg.top_k and not _const(kw, "FUSED")
    ys = []
    for m in (mk, off):
        y = torch.full((T, cfg.hidden_size), float("nan"))
        ys.append(_mk(cfg, x, w, record=True, mk=m, out=y, nprog=programs))
    (y, ran), (y_off, ran_off) = ys
    ref = moe_forward(round_to_dtype(x, "float32"), w.round_to("float32"), cfg, details=True)
    assert_close(y, ref.y, "float32", f"align each {case}")
    assert torch.equal(y, y_off)
    counts = np.bincount(ref.routing.topk_idx.ravel(), minlength=cfg.num_experts)
    plan = task_plan(cfg, counts, T, mk["tiles"], num_programs=programs)
    kinds = plan.tasks_per_kind()
    assert kinds["align_scan"] == kinds["align_scatter"] == 0 and ran_off["align_scatter"] == plan.layout.topk_groups
    assert {k: ran[k] for k in KINDS} == kinds
    np.testing.assert_array_equal(ran["gemm1_per_expert"], plan.tiles_per_expert("gemm1"))
    np.testing.assert_array_equal(ran["gemm2_per_expert"], ran_off["gemm2_per_expert"])
    if zero:  # experts 0..K-1 took every token, in several row blocks each
        assert ran["gemm1_per_expert"][cfg.top_k:] == [0] * (cfg.num_experts - cfg.top_k)
        assert min(ran["gemm1_per_expert"][:cfg.top_k]) == -(-T // bm) * plan.layout.n1
    g1 = np.nonzero(plan.kind == KINDS.index("gemm1"))[0]
    assert g1.size and all(plan.waits(i) == [("topk", plan.layout.topk_groups)] for i in g1)
    # the histograms are read by each program's first dynamic ticket (kept for its later ones), the
    # routing's expert ids by every GEMM 1 task
    extra = plan.in_bytes[g1] - plan.rows[g1] * plan.depth[g1] * 2 - T * cfg.top_k * 4  # bf16 rows (act_bytes)
    hist = plan.layout.topk_groups * cfg.num_experts * 4
    np.testing.assert_array_equal(extra, np.where(g1 < plan.layout.s0 + programs, hist, 0))


def test_gemm1_tasks_place_the_rows_of_a_routing_made_elsewhere(rng):
    """ALIGN_EACH with the routing given (moe_experts' path): the top-k tasks only count, the GEMM 1
    tasks place rows from the given expert ids; bitwise what the scan and scatter give."""
    from megamoe.kernels.megakernel import megakernel_config

    cfg = MoEConfig(**BASE)
    T = 21
    x, w = _cpu(cfg, T, rng)
    idx = torch.from_numpy(np.stack([rng.choice(7, 3, replace=False) for _ in range(T)]).astype(np.int32))
    wts = torch.from_numpy(rng.random((T, 3)).astype(np.float32))
    base = megakernel_config(cfg, T, torch.float32, torch.device("cpu"), routing_given=True)
    base["tiles"]["router"].update(BLOCK_T=4, TOPK_T=4)  # G = 6 groups that read the routing
    on = {**base, "tiles": {**base["tiles"], "router": {**base["tiles"]["router"], "ALIGN_EACH": 1}}}
    off = {**base, "tiles": {**base["tiles"], "router": {**base["tiles"]["router"], "ALIGN_EACH": 0}}}
    ys = [_mk(cfg, x, w, mk=m, routing=(idx, wts), record=True) for m in (on, off)]
    assert torch.equal(ys[0][0], ys[1][0]) and torch.isfinite(ys[0][0]).all()
    assert ys[0][1]["align_scatter"] == 0 and ys[1][1]["align_scatter"] == 6


def test_align_each_refuses_layouts_it_cannot_take():
    """ALIGN_EACH needs more than one top-k task, at most ALIGN_EACH_MAX_PAIRS pairs and whole GEMM
    tiles; the error names what was given. configs sets it only where it applies (T <= ALIGN_EACH_MAX_T)."""
    from megamoe.kernels import megakernel_config as cfgs
    from megamoe.reference.tiles import ALIGN_EACH_MAX_PAIRS

    cfg = MoEConfig(**BASE)
    on = {**TILES, "router": {**TILES["router"], "TOPK_T": 4, "ALIGN_EACH": 1}}
    assert task_layout(cfg, 9, on).align_each
    for T, tiles, why in ((3, on, "1 top-k task"),
                          (ALIGN_EACH_MAX_PAIRS // 3 + 1, on, f"at most {ALIGN_EACH_MAX_PAIRS} pairs")):
        with pytest.raises(InputError, match="ALIGN_EACH") as exc:
            task_layout(cfg, T, tiles)
        assert why.split()[0] in str(exc.value)
    big = cfgs.megakernel_config(128, 2048, 768, 8, 0, cfgs.ALIGN_EACH_MAX_T, num_sms=132)
    assert big["tiles"]["router"].get("ALIGN_EACH") == 1
    assert not cfgs.megakernel_config(128, 2048, 768, 8, 0, 2 * cfgs.ALIGN_EACH_MAX_T, num_sms=132)[
        "tiles"]["router"].get("ALIGN_EACH")


def test_every_token_on_the_same_experts(rng):
    """All 29 tokens on experts 0..2: three experts with two row blocks each, four with no task."""
    cfg = MoEConfig(**BASE)
    x, w = _cpu(cfg, 29, rng, router_zero=True)
    y, ran = _mk(cfg, x, w, record=True)
    assert_close(y, moe_forward(round_to_dtype(x, "float32"), w.round_to("float32"), cfg), "float32", "same experts")
    assert ran["gemm1_per_expert"][3:] == [0, 0, 0, 0]
    assert min(ran["gemm1_per_expert"][:3]) > 0


def test_poisoned_output_is_overwritten_and_calls_repeat_bitwise(rng):
    """Every element of y written (a NaN-filled buffer comes back finite); the sync words are zero after
    each call, so calls repeat bitwise identically (what CUDA-graph replay relies on)."""
    from megamoe.kernels.megakernel import _SYNC

    fields, T, _ = CASES["one_chunk"]
    cfg = MoEConfig(**{**BASE, **fields})
    x, w = _cpu(cfg, T, rng)
    outs = []
    for _ in range(2):
        y = torch.full((T, cfg.hidden_size), float("nan"))
        _mk(cfg, x, w, out=y)
        assert torch.isfinite(y).all()
        assert all(int(b.abs().sum()) == 0 for b in _SYNC.values())
        outs.append(y)
    assert torch.equal(outs[0], outs[1])


def test_no_tokens(rng):
    cfg = MoEConfig(**BASE)
    x, w = _cpu(cfg, 0, rng)
    y, ran = _mk(cfg, x, w, record=True)
    assert y.shape == (0, cfg.hidden_size) and all(ran[k] == 0 for k in KINDS)


TILES = {"router": {"BLOCK_T": 16, "BLOCK_H": 16, "SPLIT": 3}, "gemm1": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32},
         "gemm2": {"BLOCK_N": 16, "BLOCK_K": 32}, "shared": {"BLOCK_M": 16, "BLOCK_N1": 16, "BLOCK_N2": 16, "BLOCK_K": 32},
         "combine": {"BLOCK_T": 4, "BLOCK_H": 32}, "order": {"GROUP_M": 2}}


@pytest.mark.parametrize("align_each", [False, True], ids=["tiles", "align_each"])
@pytest.mark.parametrize("topk_t", [None, 1, 4])
@pytest.mark.parametrize("T", [1, 16, 17, 200])
def test_plan_waits_only_on_lower_tickets(T, topk_t, align_each, rng):
    """Deadlock freedom by construction: every counter a task waits for is signalled only by lower
    tickets, reaches its target exactly, and the static part matches task_layout; one GEMM task
    per tile."""
    cfg = MoEConfig(**{**BASE, "num_shared_experts": 1, "shared_intermediate_size": 20, "shared_expert_gate": True})
    idx = np.stack([rng.choice(7, 3, replace=False) for _ in range(T)])
    tiles = TILES if topk_t is None else {**TILES, "router": {**TILES["router"], "TOPK_T": topk_t}}
    if align_each:  # where it applies (no scan or scatter tasks)
        from megamoe.reference.tiles import align_each_takes

        if not align_each_takes(T, cfg.hidden_size, cfg.top_k, tiles):
            pytest.skip("ALIGN_EACH does not apply: one top-k task or too many pairs")
        tiles = {**tiles, "router": {**tiles["router"], "ALIGN_EACH": 1}}
    plan = task_plan(cfg, np.bincount(idx.ravel(), minlength=7), T, tiles, num_programs=1)
    lay = task_layout(cfg, T, tiles)
    assert plan.num_tasks <= lay.max_tasks
    assert plan.tasks_per_kind()["gemm1"] == int(plan.tiles_per_expert("gemm1").sum())
    assert np.all(np.diff(plan.kind) >= 0), "kinds come in ticket order"
    reached = np.bincount(plan.signal_counter, minlength=len(plan.counters))
    np.testing.assert_array_equal(reached, plan.counter_target)
    last_signal = np.full(len(plan.counters), -1)
    for i in range(plan.num_tasks):
        for c in plan.signal_counter[plan.signal_ptr[i]:plan.signal_ptr[i + 1]]:
            last_signal[c] = i
    for i in range(plan.num_tasks):
        lo, hi = plan.wait_ptr[i], plan.wait_ptr[i + 1]
        for c in plan.wait_counter[lo:hi]:
            assert last_signal[c] < i, f"task {i} ({KINDS[plan.kind[i]]}) waits on {plan.counters[c]} signalled later"
    for k in KINDS[:5]:
        assert plan.tasks_per_kind()[k] == lay.count[k]


def test_plan_rejects_bad_counts_and_tiles():
    from megamoe.reference import InputError

    cfg = MoEConfig(**BASE)
    with pytest.raises(InputError, match=r"summing to T\*K=6"):
        task_plan(cfg, np.array([1, 1, 1, 0, 0, 0, 0]), 2, TILES)
    with pytest.raises(InputError, match="BLOCK_M"):
        task_plan(cfg, np.zeros(7, np.int64), 0, {**TILES, "gemm1": {"BLOCK_M": 0, "BLOCK_N": 16, "BLOCK_K": 32}})
    with pytest.raises(InputError, match="TOPK_T"):  # groups must tile the logits chunk
        task_layout(cfg, 5, {**TILES, "router": {**TILES["router"], "TOPK_T": 3}})


def test_plan_of_fp8_weights_counts_their_bytes():
    """weight_bytes per element (FP8: 1 byte and its share of the 128 x 128 block scales,
    reference.sizes) scales the GEMM tasks' weight bytes and nothing else."""
    from megamoe.reference.sizes import weight_bytes_per_element

    cfg = MoEConfig(**BASE)
    counts = np.bincount(np.arange(15) % 7, minlength=7)
    b16 = task_plan(cfg, counts, 5, TILES)
    b8 = task_plan(cfg, counts, 5, TILES, weight_bytes=weight_bytes_per_element("fp8_e4m3"))
    g = np.isin(b16.kind, [KINDS.index("gemm1"), KINDS.index("gemm2")])
    np.testing.assert_allclose(b8.weight_bytes[g], b16.weight_bytes[g] * weight_bytes_per_element("fp8_e4m3") / 2)
    np.testing.assert_array_equal(b8.in_bytes, b16.in_bytes)


#: router families for the bitonic top-k: name -> (config fields, why)
TOPK_ROUTERS = {
    "softmax_topk": (dict(), "top-k of the logits, renormalized softmax"),
    "softmax_topk_nonorm": (dict(norm_topk_prob=False), "softmax over all E: the denominator reads every logit"),
    "topk_softmax_bias": (dict(router="topk_softmax", router_bias=True), "gpt-oss: router bias, softmax of the K"),
    "sigmoid_grouped": (dict(router="sigmoid_grouped_topk", num_experts=8, n_group=4, topk_group=2, score_bias=True,
                             routed_scaling_factor=2.5),
                        "DeepSeek-V3: selection on the biased score, weights gathered from the unbiased one"),
    "sigmoid_grouped_zero_mask": (dict(router="sigmoid_grouped_topk", num_experts=8, n_group=4, topk_group=2,
                                       group_mask="zero", norm_topk_prob=False),
                                  "masked groups at 0, not -inf: ties between masked experts"),
    "sigmoid_one_group": (dict(router="sigmoid_grouped_topk", score_bias=True), "Kimi K2: one group"),
    "top1_input": (dict(router="sigmoid_top1_input", top_k=1), "K = 1: the single maximum either way"),
    "top2_input": (dict(router="sigmoid_top1_input", top_k=2), "input scaling with K = 2"),
}


def _tied(cfg, w):
    """w with experts 3 and 0, and 5 and 1, routed alike (equal router rows and biases): every
    token ties there, and the lower expert must win."""
    a = w.arrays()
    for name in ("router_weight", "router_bias", "score_bias"):
        if a.get(name) is not None:
            v = a[name].copy()
            v[3], v[min(5, cfg.num_experts - 1)] = v[0], v[1]
            a[name] = v
    return type(w)(**a)


#: (router, T, tokens per top-k task): every family at T = 1; T = 13 in two-token tasks for a
#: logits router, a router bias and the gathered weights of the grouped one
BITONIC_RUNS = [(r, 1, 1) for r in TOPK_ROUTERS] + [("sigmoid_grouped", 13, 2)]


@pytest.mark.parametrize("router, T, topk_t", BITONIC_RUNS, ids=[f"{r}-T{T}" for r, T, _ in BITONIC_RUNS])
def test_bitonic_topk_picks_what_the_reference_picks(router, T, topk_t, rng):
    """Top-k tasks of one or two tokens take the bitonic top-k (tl.topk over the packed keys): the
    layer matches the float64 reference for every router family, ties included (tied router rows: the
    lower expert wins; at T = 1 also a zero router: every logit equal, the lowest experts win). The
    logits split in two H ranges (as at decode), T = 13 in top-k tasks of 2 tokens: two-row blocks,
    the last with a masked row."""
    from megamoe.kernels.megakernel import build_launch, megakernel_config

    cfg = MoEConfig(**{**BASE, **TOPK_ROUTERS[router][0]})
    base = megakernel_config(cfg, T, torch.float32, torch.device("cpu"))
    r = {**base["tiles"]["router"], "BLOCK_H": 16, "SPLIT": 2, "TOPK_T": topk_t}
    mk = {**base, "tiles": {**base["tiles"], "router": r}}
    for router_zero in (False, True) if T == 1 else (False,):
        x, w = _cpu(cfg, T, rng, router_zero=router_zero)
        w = w if router_zero else _tied(cfg, w)
        kwargs = build_launch(torch.from_numpy(x).float(), w.to_torch("cpu", torch.float32), cfg, mk)[2]
        assert _const(kwargs, "BITONIC") is True
        y = _mk(cfg, x, w, mk=mk)
        ref = moe_forward(round_to_dtype(x, "float32"), w.round_to("float32"), cfg)
        assert_close(y, ref, "float32", f"{router} T={T} router_zero={router_zero} bitonic top-k")


def test_bitonic_topk_only_for_one_or_two_token_tasks():
    """Rows fewer than a decode program's 4 warps (their maxima cross warps), keys few enough."""
    from megamoe.kernels.megakernel_config import bitonic_topk_fits

    assert bitonic_topk_fits(1, 128) and bitonic_topk_fits(2, 256) and bitonic_topk_fits(1, 512)
    assert not bitonic_topk_fits(4, 128) and not bitonic_topk_fits(16, 128) and not bitonic_topk_fits(2, 512)


@pytest.mark.parametrize("case", ["one_chunk", "top1_input"])
def test_tma_weights_compute_what_the_pointer_loads_compute(case, rng):
    """Config "tma_weights": the routed GEMM tasks read their weight tiles through TMA descriptors
    (gate_up as (E*2I, H), down as (E*H, I); I = 36 is not a multiple of the 16-column tiles, so
    the last gate tile reads up rows, masked at the store). The layer matches the pointer loads' to
    float32 rounding and the float64 reference, poisoned outputs overwritten, T = 0 and every
    token on the same experts included."""
    from megamoe.kernels.megakernel import build_launch, megakernel_config

    fields, T, _why = CASES[case]
    cfg = MoEConfig(**{**BASE, **fields})
    for T_, zero in ((T, False), (T, True), (0, False)):
        x, w = _cpu(cfg, T_, rng, router_zero=zero)
        base = megakernel_config(cfg, T_, torch.float32, torch.device("cpu"))
        tma = {**base, "tma_weights": True}
        _g, args, kwargs, _y, _s = build_launch(torch.from_numpy(x).float(), w.to_torch("cpu", torch.float32), cfg,
                                                tma)
        assert _const(kwargs, "TMA_W") is True
        y0 = _mk(cfg, x, w, mk=base)
        out = torch.full((T_, cfg.hidden_size), float("nan"))
        y1 = _mk(cfg, x, w, mk=tma, out=out)
        assert not y1.isnan().any()
        # the same products, summed by another matmul layout (b.T of a descriptor tile): float32 rounding apart
        torch.testing.assert_close(y1, y0, rtol=1e-5, atol=1e-5, msg=f"{case} T={T_} zero={zero}")
        if T_:
            ref = moe_forward(round_to_dtype(x, "float32"), w.round_to("float32"), cfg)
            assert_close(y1, ref, "float32", f"{case} tma weights")


@pytest.mark.parametrize("tma", [False, True], ids=["ptr", "tma"])
def test_gemm2_deeper_than_gemm1(tma, rng):
    """GEMM 2's BLOCK_K apart from GEMM 1's (configs.deep_gemm2_block_k at decode): 64 over I = 36 is one
    masked step, 16 three steps with a partial one; the layer matches the float64 reference with poisoned
    outputs overwritten, every token on the same experts and T = 0 included, by pointer loads and TMA
    (I = 36: one chunk, a shared MLP)."""
    import copy

    from megamoe.kernels.megakernel import megakernel_config

    case = "one_chunk"
    fields, T, _why = CASES[case]
    cfg = MoEConfig(**{**BASE, **fields})
    for bk2, T_, zero in ((64, T, False), (16, T, False), (16, T, True), (16, 0, False)):
        x, w = _cpu(cfg, T_, rng, router_zero=zero)
        mk = copy.deepcopy(megakernel_config(cfg, T_, torch.float32, torch.device("cpu")))
        mk["tiles"]["gemm2"]["BLOCK_K"] = bk2
        mk["tma_weights"] = tma
        out = torch.full((T_, cfg.hidden_size), float("nan"))
        y, ran = _mk(cfg, x, w, mk=mk, out=out, record=True)
        assert not y.isnan().any()
        if T_:
            ref = moe_forward(round_to_dtype(x, "float32"), w.round_to("float32"), cfg, details=True)
            assert_close(y, ref.y, "float32", f"{case} BLOCK_K2={bk2} zero={zero}")
            counts = np.bincount(ref.routing.topk_idx.ravel(), minlength=cfg.num_experts)
            plan = task_plan(cfg, counts, T_, mk["tiles"], num_programs=ran["programs"])
            np.testing.assert_array_equal(ran["gemm2_per_expert"], plan.tiles_per_expert("gemm2"))


def test_deep_gemm2_block_k_keeps_the_stage_count():
    """The decode rule: GEMM 2's step deepens while the stage count that GEMM 1's stage sets holds, up to the
    TMA box's 256; where GEMM 2's stage already matches GEMM 1's it stays."""
    from megamoe.kernels.megakernel_config import (
        GEMM2_MAX_BLOCK_K,
        decode_stage_bytes,
        decode_stages,
        deep_gemm2_block_k,
    )

    def tiles(bn1, bn2, bk):
        return {"gemm1": {"BLOCK_M": 16, "BLOCK_N": bn1, "BLOCK_K": bk}, "gemm2": {"BLOCK_N": bn2, "BLOCK_K": bk},
                "shared": {"BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_K": bk}}

    # Mixtral-8x7B T = 8: 128-column GEMM 1 tiles, 64-column GEMM 2 tiles at 128 deep -> 256
    t = tiles(128, 64, 128)
    assert deep_gemm2_block_k(t, False) == 256 == GEMM2_MAX_BLOCK_K
    deep = {**t, "gemm2": {"BLOCK_N": 64, "BLOCK_K": 256}}
    assert decode_stages(decode_stage_bytes(deep, False)) == decode_stages(decode_stage_bytes(t, False))
    # Qwen3-30B-A3B T = 1: GEMM 2's 128 x 128 stage is GEMM 1's already
    assert deep_gemm2_block_k(tiles(64, 128, 128), False) == 128
    # never shallower than it was, and the input is not changed
    t = tiles(32, 128, 256)
    assert deep_gemm2_block_k(t, True) == 256 and t["gemm2"]["BLOCK_K"] == 256


def test_thresholds_file_is_checked(tmp_path):
    """kernels/configs/megakernel.json: every threshold with a value, a unit and a source; a missing or
    extra key, or a value that is not a positive integer, is refused by name."""
    import json

    from megamoe.kernels import megakernel_config as mkc

    d = json.loads(mkc.THRESHOLDS_PATH.read_text())
    assert mkc.load_thresholds()["stage_bytes"] == mkc.STAGE_BYTES == d["stage_bytes"]["value"]
    bad = tmp_path / "t.json"
    for broken, match in (({k: v for k, v in d.items() if k != "split_steps"}, "exactly the keys"),
                          ({**d, "split_steps": {**d["split_steps"], "value": 0}}, "'split_steps'"),
                          ({**d, "stage_bytes": {"value": 1, "unit": "bytes"}}, "'stage_bytes'")):
        bad.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=match):
            mkc.load_thresholds(bad)


def test_experts_layer_is_the_routed_experts_alone(rng):
    """megakernel.experts_layer: the config and weights of the routed experts with no router and no
    shared MLP, sized from the weights; megakernel_forward with them and a routing given is the
    megakernel moe_experts runs (bitwise)."""
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels.checks import launch_check, new_flag
    from megamoe.kernels.megakernel import experts_layer, megakernel_forward

    E, H, I, K, T = 6, 24, 12, 2, 5
    gu, dn = torch.randn(E, 2 * I, H), torch.randn(E, H, I)
    cfg, w = experts_layer(gu, dn, None, None, K, "silu_gated", 1.702, 7.0)
    assert (cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k) == (E, H, I, K)
    assert cfg.num_shared_experts == 0 and w.router_weight is None and w.shared_gate_up is None
    assert w.gate_up is gu and w.down is dn
    x = torch.randn(T, H)
    idx = torch.from_numpy(np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32))
    wts = torch.rand(T, K)
    y = megakernel_forward(x, w, cfg, routing=launch_check(idx, wts, E, new_flag("cpu")))
    assert torch.equal(y, kmoe.moe_experts(x, idx, wts, gu, dn, backend="megakernel", check=False))
