"""The walking router's BLOCK_H as a choice of the launch plan (issue 10): ``plan.router_launch(block_h=...)``.

The default plan moves only where a GPU run measured a better step (``data/router_pinned.json``: the router
entries of every preset's plan at T = 512, 4096 and 16384; since H200 run BN the walking routers of at most 128
experts step 128 columns from T = 4096 on, ``configs.walk_block_h``); the cost model reads the steps the plan
states; and under the interpreter (CI) the routing programs walking H at another BLOCK_H route as the
float64 reference does, on odd sizes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from megamoe.reference import MoEConfig, random_weights, round_to_dtype
from megamoe.reference.presets import PRESETS

PINNED = Path(__file__).parent / "data" / "router_pinned.json"
PINNED_T = (512, 4096, 16384)


def _plans(name: str, T: int, router: dict | None = None):
    """The static plan and the launch plan (an even routing) of preset ``name`` at T on an H200 as the
    layer makes them, or with the router launch ``router`` instead of the default one."""
    from megamoe.kernels.plan import launch_plan, static_plan

    cfg = MoEConfig.preset(name)
    kw = dict(device_name="NVIDIA H200", dtype="bfloat16", triton_version="3.6.0")
    if router is not None:
        kw["router"] = router
    counts = np.bincount(np.arange(T * cfg.top_k) % cfg.num_experts, minlength=cfg.num_experts)
    return static_plan(cfg, T, **kw), launch_plan(cfg, T, counts=counts, **kw)


def pinned_entries(names=tuple(PRESETS)) -> dict:
    """The router entries of presets ``names`` at PINNED_T, keyed "preset:T": the static plan's router dict
    and the launch plan's router stages, as JSON values."""
    out = {}
    for name in names:
        for T in PINNED_T:
            sp, lp = _plans(name, T)
            stages = [s.to_dict() for s in lp.stages if s.name.startswith("router")]
            out[f"{name}:{T}"] = json.loads(json.dumps({"router": sp.router, "stages": stages}))
    return out


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_default_router_entries_are_pinned(name):
    """No default moves unnoticed: every preset's static-plan router and launch-plan router stages at T = 512,
    4096, 16384 are the pinned ones (those before ``block_h`` existed, but Qwen3-30B-A3B's and Qwen1.5-MoE's walks
    at 4096 and 16384: 128 columns a step since run BN; Kimi-K2's logits tiles: 64 tokens since run BU)."""
    want = json.loads(PINNED.read_text())["cases"]
    got = pinned_entries([name])
    for T in PINNED_T:
        assert got[f"{name}:{T}"] == want[f"{name}:{T}"], f"{name} T={T}"


def test_block_h_sets_the_walks_step_and_nothing_else():
    """Qwen3-30B-A3B at T = 4096 walks H (no logits launch): block_h changes BLOCK_H alone; without it, or at
    configs.walk_block_h (128 there since run BN), the launch is the default's. It is refused off a power of two
    >= 16 and where a logits launch walks H instead (DeepSeek-V3's prefill tiles, or an explicit split)."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.plan import router_launch

    qw, ds = MoEConfig.preset("qwen3-30b-a3b"), MoEConfig.preset("deepseek-v3")
    args = (4096, qw.num_experts, qw.hidden_size, qw.top_k, qw.n_group)
    default = router_launch(*args)
    assert default["SPLIT"] == 0 and default["BLOCK_H"] == cfgs.walk_block_h(4096, qw.num_experts, qw.hidden_size) == 128
    assert router_launch(*args, block_h=128) == default == router_launch(*args, split=0)
    for bh in (64, 256):
        rl = router_launch(*args, split=0, block_h=bh)
        assert rl == dict(default, BLOCK_H=bh)
    for bad in (0, 8, 48, 96):
        with pytest.raises(ValueError, match="power of two >= 16"):
            router_launch(*args, block_h=bad)
    with pytest.raises(ValueError, match="needs split=0"):
        router_launch(*args, split=2, block_h=128)
    with pytest.raises(ValueError, match="needs split=0"):  # DeepSeek-V3's default at 4096: the prefill logits launch
        router_launch(4096, ds.num_experts, ds.hidden_size, ds.top_k, ds.n_group, block_h=128)
    wide = router_launch(4096, ds.num_experts, ds.hidden_size, ds.top_k, ds.n_group, split=0, block_h=128)
    assert wide["SPLIT"] == 0 and wide["BLOCK_H"] == 128


def test_the_plan_carries_a_router_launch():
    """static_plan(router=...) carries the given launch into the static plan and the launch plan's router
    stage (the default launch gives the default plan); it refuses a launch whose chunks differ from the
    layer's (the align is sized from them) or whose keys are not router_launch's."""
    from megamoe.kernels.plan import router_launch, static_plan

    cfg = MoEConfig.preset("qwen3-30b-a3b")
    E, K, H = cfg.num_experts, cfg.top_k, cfg.hidden_size
    sp0, lp0 = _plans(cfg.name, 4096)
    assert _plans(cfg.name, 4096, router=dict(sp0.router)) == (sp0, lp0)
    rl = router_launch(4096, E, H, K, cfg.n_group, split=0, block_h=128)
    sp, lp = _plans(cfg.name, 4096, router=json.loads(json.dumps(rl)))  # through JSON: grids as lists
    assert sp.router == rl and sp.align == sp0.align and sp.gemm == sp0.gemm
    st, st0 = lp.stage("router"), lp0.stage("router")
    assert st.tile == dict(st0.tile, BLOCK_H=128) and st.serial_steps == dict(st0.serial_steps, load=H // 128)
    assert [s.name for s in lp.stages] == [s.name for s in lp0.stages]
    assert all(a == b for a, b in zip(lp.stages, lp0.stages) if a.name != "router")
    kw = dict(device_name="NVIDIA H200", dtype="bfloat16", triton_version="3.6.0")
    with pytest.raises(ValueError, match="BLOCK_T=16 is not the layer's 32"):
        static_plan(cfg, 4096, router=router_launch(16, E, H, K), **kw)
    with pytest.raises(ValueError, match="want the keys of router_launch"):
        static_plan(cfg, 4096, router={k: v for k, v in rl.items() if k != "BITONIC"}, **kw)


@pytest.mark.parametrize("T", [4096, 16384])
def test_the_cost_model_prices_the_plans_walking_steps(T):
    """The router stage's serial term is its plan's steps (cdiv(H, BLOCK_H) loads) at the profile's load
    step: at BLOCK_H 128 half of the default's 64, at 256 a quarter (Qwen3-30B-A3B, 2048 columns); the rest
    of the stage's price (memory, selection, waves) does not move."""
    from megamoe.kernels.plan import router_launch
    from megamoe.simulator.cost import predict_stage, serial_step_s
    from megamoe.simulator.hardware import load_profile

    cfg = MoEConfig.preset("qwen3-30b-a3b")
    p = load_profile("h200")
    preds, steps = {}, {}
    for bh in (64, 128, 256):
        rl = router_launch(T, cfg.num_experts, cfg.hidden_size, cfg.top_k, cfg.n_group, split=0, block_h=bh)
        st = _plans(cfg.name, T, router=rl)[1].stage("router").to_dict()
        steps[bh], preds[bh] = st["serial_steps"]["load"], predict_stage(st, p)
    assert (steps[64], steps[128], steps[256]) == (32, 16, 8)
    step = preds[64].waves * serial_step_s(p, "load") * 1e6
    for bh in (128, 256):
        assert preds[64].serial_us - preds[bh].serial_us == pytest.approx((steps[64] - steps[bh]) * step)
        assert (preds[bh].compute_us, preds[bh].memory_us, preds[bh].waves) == \
            (preds[64].compute_us, preds[64].memory_us, preds[64].waves)


#: router families for the interpreter's walks: name -> (config fields, why)
WALK_CASES = {
    "softmax_topk_shared_gate": (
        dict(hidden_size=72, num_experts=12, top_k=3, norm_topk_prob=False, num_shared_experts=1,
             shared_intermediate_size=8, shared_expert_gate=True),
        "Qwen2-MoE: softmax top-k over 12 of 16 columns, the shared gate summed in the same walk; H = 72: a "
        "partial last step at 16, 32 and 64"),
    "topk_softmax_bias": (
        dict(hidden_size=72, num_experts=7, top_k=2, router="topk_softmax", router_bias=True),
        "gpt-oss: router bias, softmax over the picks"),
    "sigmoid_grouped": (
        dict(hidden_size=40, num_experts=16, top_k=4, router="sigmoid_grouped_topk", n_group=4, topk_group=2,
             routed_scaling_factor=2.5, score_bias=True),
        "DeepSeek-V3: sigmoid, score bias, 2 of 4 groups, scaling; H = 40 < 64: one masked step at 64"),
    "sigmoid_top1": (
        dict(hidden_size=40, num_experts=9, top_k=1, router="sigmoid_top1_input"),
        "Llama 4: one pick (one maximum), its sigmoid the weight"),
}
#: the walk's steps: 16, the interpreter's smallest (a tl.dot's depth), and 2x and 4x it
WALK_BLOCK_H = (16, 32, 64)


def _walk(device, cfg: MoEConfig, w, x: np.ndarray, block_h: int):
    """The routing programs walking H at ``block_h`` (split 0, as bench_router's walk_hNN) on x (T, H),
    outputs poisoned first -> (launched, topk_idx (T, K), topk_w (T, K), hist (C, E), sgate (T,) or None)."""
    from megamoe.kernels.moe import align_buffers
    from megamoe.kernels.plan import router_launch
    from megamoe.kernels.routing import launch_router

    T, E, K = x.shape[0], cfg.num_experts, cfg.top_k
    dt = "float32" if device.name == "cpu" else "float16"
    rl = router_launch(T, E, cfg.hidden_size, K, cfg.n_group, interpret=device.name == "cpu", split=0,
                       block_h=block_h)
    assert rl["SPLIT"] == 0 and rl["BLOCK_H"] == block_h
    xt = device.tensor(x, dt)
    _meta, hist, block_t = align_buffers(T, K, E, 16, xt.device)
    assert hist.shape == (rl["C"], E)
    idx = torch.full((T, K), -7, device=xt.device, dtype=torch.int32)
    wts = torch.full((T, K), float("nan"), device=xt.device, dtype=torch.float32)
    hist.fill_(-7)
    sg = torch.full((T,), float("nan"), device=xt.device, dtype=torch.float32) if cfg.shared_expert_gate else None
    done = launch_router(xt, w.to_torch(device.name, getattr(torch, dt)), cfg, idx, wts, hist, sg, block_t, launch=rl)
    return done, idx.cpu().numpy(), wts.cpu().numpy(), hist.cpu().numpy(), None if sg is None else sg.cpu().numpy()


def _check_walk(device, cfg: MoEConfig, w, x: np.ndarray, block_h: int):
    """The walk's outputs against the reference's routing of the same rounded inputs: the same experts in
    the same slots, the weights to fp32 rounding, each block's histogram of its picks, the shared gate."""
    from megamoe.reference import route

    dt = "float32" if device.name == "cpu" else "float16"
    done, idx, wts, hist, sg = _walk(device, cfg, w, x, block_h)
    assert not done  # no align buffers given: the router never aligns
    wr, xr = w.round_to(dt), round_to_dtype(x, dt)
    r = route(xr, wr.router_weight, cfg, router_bias=wr.router_bias, score_bias=wr.score_bias)
    np.testing.assert_array_equal(idx, r.topk_idx)
    np.testing.assert_allclose(wts, r.topk_weights, rtol=1e-5, atol=1e-6)
    bt = 16 if x.shape[0] <= 16 else 32
    for c in range(hist.shape[0]):
        np.testing.assert_array_equal(hist[c], np.bincount(r.topk_idx[c * bt:(c + 1) * bt].ravel(),
                                                           minlength=cfg.num_experts))
    if sg is not None:
        np.testing.assert_allclose(sg, 1.0 / (1.0 + np.exp(-(xr @ wr.shared_gate))), rtol=1e-5, atol=1e-6)
    return idx, hist


@pytest.mark.interpret
#: every router family once, each step of WALK_BLOCK_H at least once
@pytest.mark.parametrize("case,block_h", [(c, (WALK_BLOCK_H + WALK_BLOCK_H)[i]) for i, c in enumerate(WALK_CASES)])
def test_the_walk_at_any_block_h_routes_as_the_reference(case, block_h, rng, device):
    """T = 1 (one 16-token block, 15 rows masked), 33 (a last block of one token), 70 (three blocks)."""
    cfg = MoEConfig(intermediate_size=12, **WALK_CASES[case][0])
    w = random_weights(cfg, seed=int(rng.integers(1 << 30)))
    for T in (1, 33, 70):
        _check_walk(device, cfg, w, rng.standard_normal((T, cfg.hidden_size)), block_h)


@pytest.mark.interpret
@pytest.mark.parametrize("case", ["softmax_topk_shared_gate", "sigmoid_grouped", "sigmoid_top1"])
def test_a_zero_router_weight_sends_every_token_to_the_lowest_experts(case, rng, device):
    """Every score ties (no router bias, a zero score bias): the lowest K experts (grouped: of the lowest
    groups) take every token at every step size, expert 0 first (top-1: expert 0 takes every token), each
    block's histogram all on them."""
    cfg = MoEConfig(intermediate_size=12, **WALK_CASES[case][0])
    w = random_weights(cfg, seed=1)
    w = dataclasses.replace(w, router_weight=np.zeros_like(w.router_weight),
                            **({"score_bias": np.zeros_like(w.score_bias)} if cfg.score_bias else {}))
    x = rng.standard_normal((37, cfg.hidden_size))
    for bh in WALK_BLOCK_H:
        idx, hist = _check_walk(device, cfg, w, x, bh)
        assert (idx == np.arange(cfg.top_k)).all()
        assert (hist[:, :cfg.top_k] == np.array([32, 5])[:, None]).all() and not hist[:, cfg.top_k:].any()


@pytest.mark.interpret
def test_no_tokens_launch_nothing(device):
    """T = 0: no programs (C = 0), nothing launched, nothing written."""
    cfg = MoEConfig(intermediate_size=12, **WALK_CASES["sigmoid_grouped"][0])
    for bh in WALK_BLOCK_H:
        done, idx, wts, hist, sg = _walk(device, cfg, random_weights(cfg, seed=2), np.zeros((0, cfg.hidden_size)), bh)
        assert not done and idx.shape == (0, cfg.top_k) and hist.shape == (0, cfg.num_experts) and sg is None


if __name__ == "__main__":  # regenerate the pinned file: only with a change meant to move the default router
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cases = pinned_entries()
    lines = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(cases.items()))
    PINNED.write_text(f'{{"commit": {json.dumps(commit)}, "cases": {{\n{lines}\n}}}}\n')
