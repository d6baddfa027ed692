"""The multi-launch router's routing program: its warps and top-k way (configs.router_warps,
configs.router_bitonic) change how it computes, never what it picks. Under the interpreter (CI) and
on CUDA: the bitonic top-k and the K maxima store the same experts, weights and histogram, bit for
bit, for a DeepSeek-V3-like grouped router over 256 experts (where the plan takes the bitonic one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megamoe.reference import MoEConfig, random_weights

pytestmark = pytest.mark.interpret


def test_router_warps_and_top_k_way():
    """A thread holds at most ROUTER_SCORES_PER_THREAD scores until ROUTER_MAX_WARPS; the bitonic top-k
    only past ROUTER_MAXIMA_MAX_E experts, for K > 1, and never where one program also aligns."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.plan import router_launch

    for bt in (16, 32):
        for be in (16, 64, 128, 256, 512):
            w = cfgs.router_warps(bt, be)
            assert 4 <= w <= cfgs.ROUTER_MAX_WARPS and w & (w - 1) == 0
            assert w == cfgs.ROUTER_MAX_WARPS or bt * be <= 32 * w * cfgs.ROUTER_SCORES_PER_THREAD
    assert router_launch(4096, 256, 7168, 8, 8)["BITONIC"] and router_launch(64, 256, 7168, 8, 8)["BITONIC"]
    assert not router_launch(16, 256, 7168, 8, 8)["BITONIC"]  # one block: the routing program aligns too
    assert not router_launch(4096, 128, 2048, 8)["BITONIC"] and not router_launch(4096, 256, 7168, 1)["BITONIC"]
    rl = router_launch(4096, 256, 7168, 8, 8, warps=8, bitonic=False)
    assert rl["num_warps"] == 8 and not rl["BITONIC"]
    walk = router_launch(4096, 128, 2048, 8)  # Qwen3-30B-A3B's prefill walks H: the walk's warps
    assert walk["SPLIT"] == 0 and walk["num_warps"] == cfgs.router_warps(32, 128, walks=True) == 4


@pytest.mark.parametrize("T", [33])  # two routing blocks (the bitonic top-k needs more than one), the last of one token
def test_bitonic_and_maxima_store_the_same(T, rng, device):
    from megamoe.kernels.moe import align_buffers
    from megamoe.kernels.plan import router_launch
    from megamoe.kernels.routing import launch_router
    from megamoe.reference.routing import route

    cfg = MoEConfig(hidden_size=40, intermediate_size=12, num_experts=256, top_k=8, router="sigmoid_grouped_topk",
                    n_group=8, topk_group=4, routed_scaling_factor=2.5, score_bias=True)
    w = random_weights(cfg, seed=int(rng.integers(1 << 30)))
    dt = getattr(torch, device.dtype)
    tw = w.to_torch(device.name, dt)
    x = device.tensor(rng.standard_normal((T, cfg.hidden_size)), device.dtype)
    interpret = device.name == "cpu"
    out = {}
    for bitonic in (True, False):
        rl = router_launch(T, cfg.num_experts, cfg.hidden_size, cfg.top_k, cfg.n_group, interpret=interpret,
                           bitonic=bitonic)
        assert rl["C"] > 1
        _meta, hist, block_t = align_buffers(T, cfg.top_k, cfg.num_experts, 16, x.device)
        idx = torch.full((T, cfg.top_k), -7, device=x.device, dtype=torch.int32)
        wts = torch.full((T, cfg.top_k), float("nan"), device=x.device, dtype=torch.float32)
        hist.fill_(-7)
        launch_router(x, tw, cfg, idx, wts, hist, None, block_t, launch=rl)
        out[bitonic] = (idx.cpu(), wts.cpu(), hist.cpu())
    # the same experts in the same slots and the same histogram, bit for bit; the weights to fp32 rounding
    # (their normalizing sum runs over the slots in each way's register layout, an order that may differ on
    # a GPU; H200 run AT)
    assert torch.equal(out[True][0], out[False][0]) and torch.equal(out[True][2], out[False][2])
    torch.testing.assert_close(out[True][1], out[False][1], rtol=2e-6, atol=0)
    idx = out[True][0].numpy()
    assert idx.min() >= 0 and all(len(set(r)) == cfg.top_k for r in idx.tolist())
    # and the reference's picks (float64 logits of the same rounded inputs; a near-tie may differ)
    wr = w.round_to(device.dtype)
    ref = route(x.cpu().double().numpy(), wr.router_weight, cfg, score_bias=wr.score_bias)
    same = (np.sort(ref.topk_idx, axis=1) == np.sort(idx, axis=1)).all(axis=1).mean()
    assert same >= 0.9
    counts = np.bincount(idx.ravel(), minlength=cfg.num_experts)
    assert int(out[True][2].sum()) == T * cfg.top_k and (out[True][2].sum(0).numpy() == counts).all()
