"""GPU-only checks of the megakernel (skipped without CUDA): bf16 numerics of every preset at full
size in several T buckets, concentrated routing, CUDA-graph capture with 100 bitwise-identical
replays. The reference runs on sampled tokens (megamoe.numerics)."""

from __future__ import annotations

import pytest
import torch

from megamoe.reference import PRESETS, MoEConfig

pytestmark = pytest.mark.gpu


def _assert_replays_equal(run, ref, replays: int) -> None:
    """``run()`` once on a side stream (as capture wants), then captured in a CUDA graph and replayed
    ``replays`` times: every replay's output bitwise equal to ``ref``."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = run()
    for _ in range(replays):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, ref)


@pytest.mark.parametrize("name", PRESETS)
def test_presets_bf16_megakernel(name):
    from megamoe.kernels import moe_forward, moe_forward_details
    from megamoe.kernels.bench import random_device_weights
    from megamoe.numerics import check_numerics

    cfg = MoEConfig.preset(name)
    w = random_device_weights(cfg, seed=12)
    for T in (1, 13, 97, 600):
        x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        y = moe_forward(x, w, cfg, backend="megakernel")
        d = moe_forward_details(x, w, cfg)
        rep = check_numerics(x, y, w, cfg, dtype="bfloat16", sample=4, topk_idx=d["topk_idx"])
        print(f"NUMERICS megakernel {name} T={T} max_err={rep.error.max_err:.3e} rms_err={rep.error.rms_err:.3e}")
        assert rep.routing_agreement == 1.0 and rep.ok, (T, rep.to_dict())
    wz = type(w)(**{**w.arrays(), "router_weight": torch.zeros_like(w.router_weight)})
    x = torch.randn(64, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    rep = check_numerics(x, moe_forward(x, wz, cfg, backend="megakernel"), wz, cfg, dtype="bfloat16", sample=4)
    assert rep.ok, ("concentrated", rep.to_dict())
    del w, wz
    torch.cuda.empty_cache()


@pytest.mark.parametrize("T", [1, 8, 64, 300])
def test_graph_replays_bitwise(T):
    """Captured once, replayed 100 times: every replay bitwise equal to an eager call (the kernel
    leaves its sync words reset)."""
    from megamoe.kernels import moe_forward
    from megamoe.kernels.bench import random_device_weights

    cfg = MoEConfig.preset("qwen3-30b-a3b")
    w = random_device_weights(cfg, seed=13)
    x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    ref = moe_forward(x, w, cfg, backend="megakernel")
    _assert_replays_equal(lambda: moe_forward(x, w, cfg, backend="megakernel"), ref, 100)


@pytest.mark.parametrize("T", [1, 8])
def test_l2_prefetch_changes_no_bit(T):
    """"prefetch_wait" (a GEMM 2 task that must wait for its GEMM 1 prefetches its weight tile into
    L2 first) only moves data: every graph replay bitwise equal to the default layer."""
    from megamoe.kernels.bench import random_device_weights
    from megamoe.kernels.megakernel import build_launch, megakernel_config, megakernel_forward

    cfg = MoEConfig.preset("qwen3-30b-a3b")
    w = random_device_weights(cfg, seed=14)
    x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    mk = {**megakernel_config(cfg, T, torch.bfloat16, x.device), "prefetch_wait": True}
    assert build_launch(x, w, cfg, mk)[2]["PF_WAIT"]
    ref = megakernel_forward(x, w, cfg)
    _assert_replays_equal(lambda: megakernel_forward(x, w, cfg, mk=mk), ref, 20)


@pytest.mark.parametrize("tma", [False, True], ids=["ptr", "tma"])
@pytest.mark.parametrize("down_t", [False, True], ids=["down", "down_t"])
@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-120b", "deepseek-v3"])
def test_expert_slices_bf16(name, down_t, tma):
    """expert_slice tasks (configs.apply_slices; the down weights as stored or as a (E, I, H) copy,
    config "slice_down_t"; loaded by pointers or, tma, through the slices' TMA descriptors) at T = 1
    and 8 and under concentrated routing: bf16 numerics against the float64 reference on sampled
    tokens, and 20 graph replays bitwise equal to an eager call (the fp32 slabs are summed in a
    fixed order)."""
    from megamoe.kernels.configs import apply_slices
    from megamoe.kernels.megakernel import build_launch, megakernel_config

    def layout(cfg, T, x, ww):
        mk = {**apply_slices(megakernel_config(cfg, T, torch.bfloat16, x.device), tma=tma), "slice_down_t": down_t}
        if not mk["tiles"]["gemm1"].get("SLICE"):
            assert tma, mk  # no width divides I: the TMA slices fall back to the two-GEMM tiles
            return None
        if tma:
            assert build_launch(x, ww, cfg, mk)[2]["TMA_S"]
        return mk

    _check_decode_layout(name, 15, f"slices tma={tma}", layout)


def _check_decode_layout(name: str, seed: int, label: str, layout) -> None:
    """A decode layout of the preset at T = 1, 8 and 8 with every token on the same experts (a zero
    router): ``layout(cfg, T, x, weights)`` -> the megakernel config to run (None: skip that T),
    checked against the float64 reference on sampled tokens (bf16 tolerances) and over 20 graph
    replays bitwise equal to an eager call."""
    from megamoe.kernels import moe_forward_details
    from megamoe.kernels.bench import random_device_weights
    from megamoe.kernels.megakernel import megakernel_forward
    from megamoe.numerics import check_numerics

    cfg = MoEConfig.preset(name)
    w = random_device_weights(cfg, seed=seed)
    wz = type(w)(**{**w.arrays(), "router_weight": torch.zeros_like(w.router_weight)})
    for T, ww in ((1, w), (8, w), (8, wz)):
        x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        mk = layout(cfg, T, x, ww)
        if mk is None:
            continue
        y = megakernel_forward(x, ww, cfg, mk=mk)
        d = moe_forward_details(x, ww, cfg)
        rep = check_numerics(x, y, ww, cfg, dtype="bfloat16", sample=4, topk_idx=d["topk_idx"])
        print(f"NUMERICS {label} {name} T={T} concentrated={ww is wz} max_err={rep.error.max_err:.3e}")
        assert rep.ok, (T, rep.to_dict())
        _assert_replays_equal(lambda x=x, ww=ww, mk=mk: megakernel_forward(x, ww, cfg, mk=mk), y, 20)
    del w, wz
    torch.cuda.empty_cache()


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-120b"])
def test_combine_in_gemm2_bf16(name):
    """The combine in GEMM 2's tiles (tiles["combine"]["IN_G2"], variant "fcomb") at T = 1, 8 and 8
    under concentrated routing: bf16 numerics against the float64 reference on sampled tokens, and
    20 graph replays bitwise equal to an eager call (each column block's slots summed in slot order,
    whichever program completes it)."""
    from megamoe.kernels.megakernel import megakernel_config

    def layout(cfg, T, x, ww):
        mk = megakernel_config(cfg, T, torch.bfloat16, x.device)
        mk["tiles"]["combine"]["IN_G2"] = 1
        return mk

    _check_decode_layout(name, 16, "fcomb", layout)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-120b", "deepseek-v3"])
def test_align_each_bf16(name):
    """GEMM 1 tasks placing their own rows (tiles["router"]["ALIGN_EACH"], the default at T = 8 and 64)
    give bitwise the layer of the scan and scatter tasks, under the preset's router and with every
    token on the same experts, and pass the reference on sampled tokens."""
    from megamoe.kernels.bench import random_device_weights
    from megamoe.kernels.megakernel import megakernel_config, megakernel_forward
    from megamoe.numerics import check_numerics

    cfg = MoEConfig.preset(name)
    w = random_device_weights(cfg, seed=14)
    wz = type(w)(**{**w.arrays(), "router_weight": torch.zeros_like(w.router_weight)})
    for T in (8, 64):
        x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        mk = megakernel_config(cfg, T, torch.bfloat16, x.device)
        assert mk["tiles"]["router"].get("ALIGN_EACH") == 1
        off = {**mk, "tiles": {**mk["tiles"], "router": {**mk["tiles"]["router"], "ALIGN_EACH": 0}}}
        for ww, routing in ((w, "preset"), (wz, "concentrated")):
            y = megakernel_forward(x, ww, cfg, mk=mk)
            assert torch.equal(y, megakernel_forward(x, ww, cfg, mk=off)), (T, routing)
            rep = check_numerics(x, y, ww, cfg, dtype="bfloat16", sample=4)
            print(f"NUMERICS align_each {name} T={T} {routing} max_err={rep.error.max_err:.3e}")
            assert rep.ok, (T, routing, rep.to_dict())
    del w, wz
    torch.cuda.empty_cache()
