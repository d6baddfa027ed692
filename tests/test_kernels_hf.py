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


@pytest.mark.parametrize("activation,bias,backend", [("silu_gated", False, "multi"),  # each backend once,
                                                     ("clamped_swiglu", True, "megakernel")])  # each epilogue once
def test_moe_experts_matches_reference(activation, bias, backend, rng, device):
    """A routing made outside (the reference's), experts by the kernels: equal to the reference's experts
    on both backends (the megakernel's top-k tasks then only read the routing and count)."""
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
                    limit=cfg.swiglu_limit, backend=backend)
    assert_close(y.cpu(), ref, dt, f"moe_experts {activation} {backend}")


def test_moe_experts_megakernel_runs_the_given_routing_plan(rng):
    """With a routing given, the megakernel runs the plan of reference.tiles with routing_given: no
    logits tasks, one top-k task per token block, and GEMM tasks only for the experts the routing uses."""
    import os

    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("the task record runs under the interpreter")
    from megamoe.kernels.megakernel import megakernel_config, megakernel_forward
    from megamoe.reference.tiles import KINDS, task_plan

    cfg = MoEConfig(hidden_size=40, intermediate_size=36, num_experts=7, top_k=2)
    w = random_weights(cfg, seed=5).to_torch("cpu", torch.float32)
    T = 37
    idx = torch.from_numpy(np.stack([rng.choice([1, 4, 6], 2, replace=False) for _ in range(T)])).int()
    tw = torch.rand(T, 2)
    x = torch.from_numpy(rng.standard_normal((T, 40))).float()
    _, ran = megakernel_forward(x, w, cfg, routing=(idx, tw), record=True)
    mk = megakernel_config(cfg, T, torch.float32, x.device, routing_given=True)
    plan = task_plan(cfg, np.bincount(idx.numpy().ravel(), minlength=7), T, mk["tiles"], routing_given=True,
                     num_programs=ran["programs"])
    assert {k: ran[k] for k in KINDS} == plan.tasks_per_kind() and ran["router_logits"] == 0
    assert [ran["gemm1_per_expert"][e] > 0 for e in range(7)] == [e in (1, 4, 6) for e in range(7)]


def test_moe_experts_rejects_a_bad_backend():
    from megamoe.kernels import KernelInputError, moe_experts

    with pytest.raises(KernelInputError, match=r"backend must be one of \['auto', 'megakernel', 'multi'\], got 'fast'"):
        moe_experts(torch.randn(3, 8), torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1), torch.randn(2, 8, 8),
                    torch.randn(2, 8, 4), backend="fast")


def test_moe_experts_rejects_bad_shapes():
    from megamoe.kernels import KernelInputError, moe_experts

    x = torch.randn(3, 8)
    with pytest.raises(KernelInputError, match="shapes disagree"):
        moe_experts(x, torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1), torch.randn(2, 6, 8), torch.randn(2, 8, 4))


@pytest.mark.parametrize("backend", ["multi", "megakernel"])
def test_transformers_backend_qwen3_moe_block(backend, device):
    """A transformers Qwen3-MoE block with experts_implementation='megamoe' equals its eager experts
    (registered with either backend of moe_experts)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_moe import modeling_qwen3_moe as q

    from megamoe.kernels import register_transformers

    name = register_transformers("megamoe" if backend == "multi" else "megamoe-megakernel", backend=backend)
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


def test_moe_experts_auto_takes_the_layers_backend(rng):
    """backend="auto" (the default) runs the backend configs.select_backend gives the layer of this
    expert shape at T: bitwise that backend's answer, whichever it is at each T."""
    import triton

    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import moe_experts
    from megamoe.kernels.moe import DTYPES, device_name

    E, H, I, K = 5, 16, 8, 2
    gu, dn = torch.randn(E, 2 * I, H), torch.randn(E, H, I)
    for T in (1, 3):
        x = torch.randn(T, H)
        idx = torch.from_numpy(np.stack([rng.permutation(E)[:K] for _ in range(T)]))
        w = torch.rand(T, K)
        be = cfgs.select_backend(E, H, I, K, T, gpu=device_name(x.device), dtype=DTYPES[x.dtype],
                                 triton_version=triton.__version__)
        assert torch.equal(moe_experts(x, idx, w, gu, dn), moe_experts(x, idx, w, gu, dn, backend=be))
