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


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-120b"])
def test_route_each_bf16(name):
    """GEMM 1 tasks routing the token themselves (tiles["router"]["EACH"], the default at T = 1 up to
    128 experts) give bitwise the layer of the top-k task's routing and align, under the preset's
    router and with every token on the same experts, and 20 graph replays repeat it bitwise."""
    from megamoe.kernels.bench import random_device_weights
    from megamoe.kernels.megakernel import megakernel_config, megakernel_forward

    cfg = MoEConfig.preset(name)
    w = random_device_weights(cfg, seed=15)
    wz = type(w)(**{**w.arrays(), "router_weight": torch.zeros_like(w.router_weight)})
    x = torch.randn(1, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    mk = megakernel_config(cfg, 1, torch.bfloat16, x.device)
    assert mk["tiles"]["router"].get("EACH") == 1
    off = {**mk, "tiles": {**mk["tiles"], "router": {**mk["tiles"]["router"], "EACH": 0}}}
    for ww in (w, wz):
        y = megakernel_forward(x, ww, cfg, mk=mk)
        assert torch.equal(y, megakernel_forward(x, ww, cfg, mk=off))
        _assert_replays_equal(lambda ww=ww: megakernel_forward(x, ww, cfg, mk=mk), y, 20)
    del w, wz
    torch.cuda.empty_cache()


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
