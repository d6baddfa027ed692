"""The routed-experts entry (moe_experts) and the transformers 5 experts backend, on the ``device``
fixture (CUDA where there is a GPU, else the Triton interpreter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megamoe.reference import (
    MoEConfig,
    assert_close,
    combine,
    experts_forward,
    plan_dispatch,
    random_weights,
    round_to_dtype,
    route,
)

pytestmark = pytest.mark.interpret


@pytest.mark.parametrize("activation,bias", [("silu_gated", False), ("clamped_swiglu", True)])
def test_moe_experts_matches_reference(activation, bias, rng, device):
    """A routing made outside (the reference's), experts by the kernels: equal to the reference's experts."""
    from megamoe.kernels import moe_experts

    cfg = MoEConfig(hidden_size=40, intermediate_size=36, num_experts=7, top_k=3, activation=activation,
                    expert_bias=bias, swiglu_limit=1.5)
    w = random_weights(cfg, seed=3)
    x = rng.standard_normal((19, 40))
    r = route(x, w.router_weight, cfg)
    plan = plan_dispatch(r.topk_idx, cfg.num_experts)
    ref = combine(experts_forward(x, r, plan, w, cfg), plan, r.topk_weights, cfg)
    dt = device.dtype
    if dt != "float32":  # the reference on the same rounded inputs
        xr, wr = round_to_dtype(x, dt), w.round_to(dt)
        ref = combine(experts_forward(xr, r, plan, wr, cfg), plan, r.topk_weights, cfg)
    tw = w.to_torch(device.name, device.torch_dtype())
    y = moe_experts(device.tensor(x), device.tensor(r.topk_idx), device.tensor(r.topk_weights, "float32"),
                    tw.gate_up, tw.down, tw.gate_up_bias, tw.down_bias, activation=activation, alpha=cfg.swiglu_alpha,
                    limit=cfg.swiglu_limit)
    assert_close(y.cpu(), ref, dt, f"moe_experts {activation}")


def test_moe_experts_rejects_bad_shapes():
    from megamoe.kernels import KernelInputError, moe_experts

    x = torch.randn(3, 8)
    with pytest.raises(KernelInputError, match="shapes disagree"):
        moe_experts(x, torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1), torch.randn(2, 6, 8), torch.randn(2, 8, 4))


def test_transformers_backend_qwen3_moe_block(device):
    """A transformers Qwen3-MoE block with experts_implementation='megamoe' equals its eager experts."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_moe import modeling_qwen3_moe as q

    from megamoe.kernels import register_transformers

    name = register_transformers()
    conf = transformers.Qwen3MoeConfig(hidden_size=40, moe_intermediate_size=36, num_experts=7, num_experts_per_tok=3,
                                       norm_topk_prob=True)
    torch.manual_seed(0)
    block = q.Qwen3MoeSparseMoeBlock(conf).to(device.name, device.torch_dtype())
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.2)
    from megamoe.kernels.hf_experts import _supported

    assert _supported(block.experts), "the block should run on megamoe's kernels, not the fallback"
    x = device.tensor(torch.randn(2, 9, 40))
    with torch.no_grad():
        conf._experts_implementation = "eager"
        ref = block(x)
        conf._experts_implementation = name
        y = block(x)
    assert_close(y.cpu(), ref.cpu().double().numpy(), device.dtype, "transformers megamoe backend")
    assert np.isfinite(y.cpu().float().numpy()).all()
