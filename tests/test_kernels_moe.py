"""The fused MoE layer (megamoe.kernels) against the float64 reference, on the ``device`` fixture.

Without a GPU the kernels run on CPU tensors under TRITON_INTERPRET=1 (tests/conftest.py sets it before
triton is imported) in float32 and float16 (the interpreter's bfloat16 dot is wrong); with one, the same
tests run on CUDA in bfloat16 and float16. Shapes are tiny and odd: H, I not multiples of a tile,
7 experts, top-3.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megamoe.reference import MoEConfig, assert_close, random_weights, round_to_dtype
from megamoe.reference import moe_forward as ref_forward

pytestmark = pytest.mark.interpret

BASE = dict(hidden_size=40, intermediate_size=36, num_experts=7, top_k=3)

#: name -> (config fields, why)
CASES = {
    "softmax_topk": (dict(), "Mixtral/Qwen router, renormalized"),
    "softmax_topk_nonorm_shared_gate": (
        dict(norm_topk_prob=False, num_shared_experts=1, shared_intermediate_size=28, shared_expert_gate=True),
        "Qwen2-MoE: unnormalized weights over all E, gated shared MLP"),
    "topk_softmax_swiglu": (
        dict(router="topk_softmax", router_bias=True, activation="clamped_swiglu", expert_bias=True,
             swiglu_limit=1.5), "gpt-oss: router bias, clamped swiglu (limit low so it clamps), biases"),
    "sigmoid_grouped": (
        dict(num_experts=8, router="sigmoid_grouped_topk", n_group=4, topk_group=2, routed_scaling_factor=2.5,
             score_bias=True, num_shared_experts=1, shared_intermediate_size=20),
        "DeepSeek-V3: sigmoid, bias, group top-2 sums, 2 of 4 groups, scaling, shared MLP"),
    "sigmoid_grouped_neg_inf": (
        dict(num_experts=8, router="sigmoid_grouped_topk", n_group=4, topk_group=2, score_bias=True,
             group_mask="neg_inf", norm_topk_prob=False), "vLLM's -inf group mask, unnormalized"),
    "sigmoid_grouped_one_group": (
        dict(router="sigmoid_grouped_topk", routed_scaling_factor=2.827, score_bias=True),
        "Kimi K2: one group"),
    "sigmoid_top1_input": (
        dict(router="sigmoid_top1_input", top_k=1, num_shared_experts=1, shared_intermediate_size=24),
        "Llama 4: weight scales the expert input, shared MLP"),
    "sigmoid_top1_input_top2_swiglu": (
        dict(router="sigmoid_top1_input", top_k=2, activation="clamped_swiglu", expert_bias=True),
        "input scaling with biases and K > 1"),
}


@pytest.fixture(params=["multi", "megakernel"])
def backend(request):
    """Both backends of moe_forward must compute the reference's layer."""
    return request.param


def _run(device, cfg: MoEConfig, x: np.ndarray, w, dtype: str | None = None, **kw):
    from megamoe.kernels import moe_forward

    dtype = dtype or device.dtype
    tdt = getattr(torch, dtype)
    y = moe_forward(device.tensor(x, dtype), w.to_torch(device.name, tdt), cfg, **kw)
    ref = ref_forward(round_to_dtype(x, dtype), w.round_to(dtype), cfg)
    assert y.dtype == tdt and y.shape == ref.shape
    return y.cpu(), ref


@pytest.mark.parametrize("case", list(CASES))
def test_router_kinds_main_dtype(case, rng, device, backend):
    """float32 under the interpreter, bfloat16 on CUDA."""
    cfg = MoEConfig(**{**BASE, **CASES[case][0]})
    w = random_weights(cfg, seed=int(rng.integers(1 << 30)))
    x = rng.standard_normal((13, cfg.hidden_size))
    y, ref = _run(device, cfg, x, w, backend=backend)
    assert_close(y, ref, device.dtype, f"{case} {device.dtype}")


@pytest.mark.parametrize("case", ["softmax_topk_nonorm_shared_gate", "topk_softmax_swiglu", "sigmoid_grouped",
                                  "sigmoid_top1_input"])
def test_router_kinds_float16(case, rng, device, backend):
    cfg = MoEConfig(**{**BASE, **CASES[case][0]})
    w = random_weights(cfg, seed=int(rng.integers(1 << 30)))
    x = rng.standard_normal((13, cfg.hidden_size))
    y, ref = _run(device, cfg, x, w, "float16", backend=backend)
    assert_close(y, ref, "float16", f"{case} float16")


@pytest.mark.parametrize("T", [0, 1, 2])
def test_tiny_batches(T, rng, device, backend):
    """T=0 returns an empty tensor; T=1 leaves most of the 7 experts without tokens."""
    cfg = MoEConfig(**BASE, num_shared_experts=1, shared_intermediate_size=20)
    w = random_weights(cfg, seed=3)
    x = rng.standard_normal((T, cfg.hidden_size))
    y, ref = _run(device, cfg, x, w, backend=backend)
    assert y.shape == (T, cfg.hidden_size)
    assert_close(y, ref, device.dtype, f"T={T}")


def test_every_token_on_the_same_experts(rng, device, backend):
    """Zero router weights: all logits tie, every token goes to experts 0..K-1 (ties to the lower index)."""
    cfg = MoEConfig(**BASE)
    w = random_weights(cfg, seed=4)
    w = type(w)(**{**w.arrays(), "router_weight": np.zeros_like(w.router_weight)})
    x = rng.standard_normal((29, cfg.hidden_size))  # 29 rows: two BLOCK_M=16 blocks on each expert
    y, ref = _run(device, cfg, x, w, backend=backend)
    assert_close(y, ref, device.dtype, "all tokens on experts 0..2")


def test_one_expert_takes_all_top1(rng, device, backend):
    """top-1 with one expert always winning: one full expert, six empty."""
    cfg = MoEConfig(**{**BASE, "top_k": 1})
    w = random_weights(cfg, seed=5)
    rw = np.zeros_like(w.router_weight)
    rw[5] = 0.0
    rw[:5] = -1.0
    rw[6] = -1.0
    x = np.abs(rng.standard_normal((21, cfg.hidden_size)))
    w = type(w)(**{**w.arrays(), "router_weight": rw})
    y, ref = _run(device, cfg, x, w, backend=backend)
    assert_close(y, ref, device.dtype, "every token on expert 5")


def test_group_mask_zero_lets_masked_experts_win(rng, device, backend):
    """score_bias so negative that kept scores are < 0: 'zero' masking then picks masked experts."""
    for mask in ("zero", "neg_inf"):
        cfg = MoEConfig(**{**BASE, **CASES["sigmoid_grouped"][0], "group_mask": mask})
        w = random_weights(cfg, seed=6)
        w = type(w)(**{**w.arrays(), "score_bias": np.full(8, -2.0) + 0.01 * np.arange(8)})
        x = rng.standard_normal((9, cfg.hidden_size))
        y, ref = _run(device, cfg, x, w, backend=backend)
        assert_close(y, ref, device.dtype, f"group_mask={mask}")


def test_atomic_combine_matches(rng, device):
    """deterministic=False (GEMM 2 adds with atomics) computes the same layer."""
    cfg = MoEConfig(**{**BASE, **CASES["sigmoid_grouped"][0]})
    w = random_weights(cfg, seed=7)
    x = rng.standard_normal((13, cfg.hidden_size))
    y, ref = _run(device, cfg, x, w, deterministic=False)
    assert_close(y, ref, device.dtype, "atomic combine")


#: routings for the metadata test: which selection and align code paths each one takes
META_CASES = {
    "grouped8": (CASES["sigmoid_grouped"][0], "E = 8 < BLOCK_E: groups one by one"),
    "grouped16": (dict(CASES["sigmoid_grouped"][0], num_experts=16), "E = BLOCK_E = 16: every group at once"),
    "wide64": (dict(num_experts=64, top_k=8), "16 x 8 x 64 cells > align.ONE_SHOT: the slot-by-slot align"),
}


@pytest.mark.parametrize("case", list(META_CASES))
@pytest.mark.parametrize("T", [1, 13, 37])  # 1, 13: one token block, aligned inside the router; 37: scan + scatter
def test_routing_metadata_matches_reference(T, case, rng, device):
    """The kernels' topk_idx and padded plan equal the reference's route and plan_dispatch exactly
    (float32 under the interpreter; float16 on CUDA, which refuses float32: the reference then
    routes the same float16-rounded inputs, and only the fp32 accumulation order differs)."""
    from megamoe.kernels import moe_forward_details
    from megamoe.reference import plan_dispatch, route

    dt = "float32" if device.name == "cpu" else "float16"
    cfg = MoEConfig(**{**BASE, **META_CASES[case][0]})
    w = random_weights(cfg, seed=8)
    x = rng.standard_normal((T, cfg.hidden_size))
    d = moe_forward_details(device.tensor(x, dt), w.to_torch(device.name, getattr(torch, dt)), cfg)
    d = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in d.items()}
    wr = w.round_to(dt)
    r = route(round_to_dtype(x, dt), wr.router_weight, cfg, score_bias=wr.score_bias)
    np.testing.assert_array_equal(d["topk_idx"].numpy(), r.topk_idx)
    np.testing.assert_allclose(d["topk_weights"].numpy(), r.topk_weights, rtol=1e-5, atol=1e-6)
    plan = plan_dispatch(r.topk_idx, cfg.num_experts, d["block_m"])
    P = plan.num_padded_rows
    np.testing.assert_array_equal(d["counts"].numpy(), plan.counts)
    np.testing.assert_array_equal(d["padded_offsets"].numpy(), plan.padded_offsets)
    np.testing.assert_array_equal(d["padded_token"].numpy()[:P], plan.padded_token)
    np.testing.assert_array_equal(d["padded_pair"].numpy()[:P], plan.padded_pair)
    nb = P // d["block_m"]
    np.testing.assert_array_equal(d["block_expert"].numpy()[:nb], plan.block_expert)
    assert (d["block_expert"].numpy()[nb:] == -1).all()
    assert d["config_source"] == "heuristic"  # no tuned file or model table holds these small shapes


def test_torch_compile_fullgraph(rng, device):
    """The layer is one opaque torch op: dynamo traces the wrapper (input checks included) without breaks."""
    from megamoe.kernels import moe_forward

    cfg = MoEConfig(**BASE)
    w = random_weights(cfg, seed=9).to_torch(device.name, device.torch_dtype())
    x = device.tensor(rng.standard_normal((5, cfg.hidden_size)))
    f = torch.compile(lambda x: moe_forward(x, w, cfg), fullgraph=True, backend="eager")
    assert torch.equal(f(x), moe_forward(x, w, cfg))
    from megamoe.kernels import bind

    g = torch.compile(bind(w, cfg), fullgraph=True, backend="eager")
    assert torch.equal(g(x), moe_forward(x, w, cfg))


def test_custom_op_registered():
    import megamoe.kernels.moe  # noqa: F401

    assert hasattr(torch.ops.megamoe, "moe_forward")
