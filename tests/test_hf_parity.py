"""The reference computes what the public model definitions (HF transformers) compute, family by family.

For each family: build transformers' MoE block from a tiny config, give it seeded random weights,
load its ``state_dict()`` and ``config.to_dict()`` through ``MoEWeights.from_hf`` /
``MoEConfig.from_hf``, and run both on the same tokens. Three checks per family:

1. routing: the same set of experts for every token, and the same routing weights;
2. the whole block with each side routing itself: transformers routes in float32 (all but gpt-oss),
   so this holds to the float32 tolerance;
3. the whole block with transformers' router replaced by ours: the remaining arithmetic (weight
   layouts, activations, shared experts, combine) is all float64 and must agree to float64 tolerance.

Checked against transformers 5.24 (torch 2.13 CPU); the suite skips without transformers.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from megamoe.reference import MoEConfig, MoEWeights, assert_close, moe_forward  # noqa: E402

T = 48  # tokens: enough that every expert of the tiny configs is hit several times


@dataclass(frozen=True)
class Family:
    """How to build one family's transformers MoE block and talk to its router."""

    module: str  # transformers.models.<module>
    config_cls: str
    block_cls: str
    router_attr: str  # the block's router submodule
    router_out: str  # what the router returns: "logits_weights_idx" | "logits_scores_idx" | "dense_scores_logits"
    config_kwargs: dict[str, Any]
    route_dtype: str  # precision transformers' router computes in (sets the tolerance of check 2)
    why: str

    def classes(self):
        """(config class, block class), or a skip naming what this transformers version lacks. Any other
        failure to import (a broken dependency, a shadowed package) is an error, not a skip."""
        name = f"transformers.models.{self.module}"
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
            pytest.skip(f"transformers {transformers.__version__} has no module {name}")
        missing = [c for c in (self.config_cls, self.block_cls) if not hasattr(mod, c)]
        if missing:
            pytest.skip(f"transformers {transformers.__version__} lacks {', '.join(missing)} in {name}")
        return getattr(mod, self.config_cls), getattr(mod, self.block_cls)

    def build(self):
        config_cls, block_cls = self.classes()
        cfg = config_cls(**self.config_kwargs)
        torch.manual_seed(0)
        block = block_cls(cfg).double().eval()
        gen = torch.Generator().manual_seed(20261129)
        with torch.no_grad():  # every parameter and buffer (incl. e_score_correction_bias) random, O(1) outputs
            for t in [*block.parameters(), *block.buffers()]:
                t.copy_(0.5 * torch.randn(t.shape, generator=gen, dtype=t.dtype))
        return cfg, block


# attention sizes only so the tiny hidden sizes validate; eager experts: the plain per-expert loop
_ATTN = dict(num_attention_heads=4, num_key_value_heads=4, experts_implementation="eager")
FAMILIES = {
    # softmax top-2 of 8, always renormalized; fused experts.gate_up_proj [E, 2I, H]
    "mixtral": Family("mixtral.modeling_mixtral", "MixtralConfig", "MixtralSparseMoeBlock", "gate",
                      "logits_weights_idx", dict(hidden_size=24, intermediate_size=16, num_local_experts=8,
                                                 num_experts_per_tok=2, **_ATTN), "float32",
                      "softmax router, fused [E, 2I, H] layout"),
    # not renormalized (Qwen1.5-MoE), plus a sigmoid-gated shared expert of another width
    "qwen2_moe": Family("qwen2_moe.modeling_qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeSparseMoeBlock", "gate",
                        "logits_weights_idx", dict(hidden_size=24, moe_intermediate_size=12, num_experts=8,
                                                   num_experts_per_tok=3, norm_topk_prob=False,
                                                   shared_expert_intermediate_size=20, **_ATTN), "float32",
                        "shared expert with sigmoid gate, no renormalization"),
    # renormalized, no shared expert
    "qwen3_moe": Family("qwen3_moe.modeling_qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeSparseMoeBlock", "gate",
                        "logits_weights_idx", dict(hidden_size=24, moe_intermediate_size=12, num_experts=8,
                                                   num_experts_per_tok=2, norm_topk_prob=True, **_ATTN), "float32",
                        "norm_topk_prob true"),
    # 16 experts in 4 groups, keep 2 groups, top-4, x2.5, two shared experts; score bias large enough to be
    # negative, so the group mask value matters
    "deepseek_v3": Family("deepseek_v3.modeling_deepseek_v3", "DeepseekV3Config", "DeepseekV3MoE", "gate",
                          "logits_weights_idx", dict(hidden_size=32, moe_intermediate_size=8, n_routed_experts=16,
                                                     n_group=4, topk_group=2, num_experts_per_tok=4,
                                                     routed_scaling_factor=2.5, n_shared_experts=2, **_ATTN),
                          "float32", "grouped sigmoid top-k with score bias"),
    # Kimi K2's shape of routing: one group, scale 2.827
    "kimi_k2": Family("deepseek_v3.modeling_deepseek_v3", "DeepseekV3Config", "DeepseekV3MoE", "gate",
                      "logits_weights_idx", dict(hidden_size=32, moe_intermediate_size=8, n_routed_experts=12,
                                                 n_group=1, topk_group=1, num_experts_per_tok=3,
                                                 routed_scaling_factor=2.827, n_shared_experts=1, **_ATTN),
                      "float32", "single group (n_group=1)"),
    # DeepSeek-V2-Lite: greedy softmax top-k, not renormalized, two shared experts
    "deepseek_v2": Family("deepseek_v2.modeling_deepseek_v2", "DeepseekV2Config", "DeepseekV2Moe", "gate",
                          "logits_weights_idx", dict(hidden_size=32, moe_intermediate_size=8, n_routed_experts=8,
                                                     num_experts_per_tok=3, n_shared_experts=2, topk_method="greedy",
                                                     **_ATTN), "float32", "softmax greedy routing"),
    # H = 2I so the fused [E, H, 2I] tensor has the same shape as the standard [E, 2I, H] one; a small
    # swiglu_limit so both sides of the clamps occur
    "gpt_oss": Family("gpt_oss.modeling_gpt_oss", "GptOssConfig", "GptOssMLP", "router", "logits_scores_idx",
                      dict(hidden_size=16, intermediate_size=8, num_local_experts=8, num_experts_per_tok=3,
                           swiglu_limit=1.5, **_ATTN), "float64",
                      "interleaved gate/up, biases, clamped swiglu; H = 2I"),
    # top-2 (real models use 1) to exercise the sum of input-scaled experts; H = 2I again
    "llama4_text": Family("llama4.modeling_llama4", "Llama4TextConfig", "Llama4TextMoe", "router",
                          "dense_scores_logits", dict(hidden_size=16, intermediate_size=8, num_local_experts=4,
                                                      num_experts_per_tok=2, **_ATTN), "float32",
                          "sigmoid weight on the expert input, shared expert; H = 2I"),
}


def _load(name: str):
    fam = FAMILIES[name]
    hf_cfg, block = fam.build()
    cfg = MoEConfig.from_hf(hf_cfg.to_dict())
    weights = MoEWeights.from_hf(block.state_dict(), cfg)
    return fam, block, cfg, weights


def _x(H: int) -> np.ndarray:
    return np.random.default_rng(7).standard_normal((T, H))


def _hf_block(block, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = block(torch.from_numpy(x).unsqueeze(0))
    out = out[0] if isinstance(out, tuple) else out
    return out.reshape(T, -1).double().numpy()


def _hf_routing(fam: Family, block, x: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """transformers' (topk_idx (T, K), topk_weights (T, K)), sorted by expert id per token."""
    with torch.no_grad():
        out = getattr(block, fam.router_attr)(torch.from_numpy(x))
    if fam.router_out == "dense_scores_logits":  # (T, E) with sigmoid(logit) at the chosen experts, 0 elsewhere
        scores = out[0]
        idx = torch.topk(out[1], K, dim=-1).indices
        w = scores.gather(1, idx)
    else:
        _, w, idx = out
    idx, w = idx.numpy(), w.double().numpy()
    order = np.argsort(idx, axis=1)
    return np.take_along_axis(idx, order, 1), np.take_along_axis(w, order, 1)


def _patch_router(fam: Family, block, idx: np.ndarray, w: np.ndarray, logits: np.ndarray, E: int) -> None:
    """Make transformers' router return our routing (float64) in its own output format."""
    t_idx, t_w, t_logits = torch.from_numpy(idx), torch.from_numpy(w), torch.from_numpy(logits)
    if fam.router_out == "dense_scores_logits":
        dense = torch.zeros(len(idx), E, dtype=torch.float64).scatter_(1, t_idx, t_w)
        getattr(block, fam.router_attr).forward = lambda h: (dense, t_logits)
    else:
        getattr(block, fam.router_attr).forward = lambda h: (t_logits, t_w, t_idx)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_routing_matches_transformers(name):
    fam, block, cfg, weights = _load(name)
    x = _x(cfg.hidden_size)
    ref = moe_forward(x, weights, cfg, details=True).routing
    hf_idx, hf_w = _hf_routing(fam, block, x, cfg.top_k)
    order = np.argsort(ref.topk_idx, axis=1)
    ref_idx, ref_w = np.take_along_axis(ref.topk_idx, order, 1), np.take_along_axis(ref.topk_weights, order, 1)
    np.testing.assert_array_equal(ref_idx, hf_idx, err_msg=f"{name}: selected experts differ")
    assert_close(hf_w, ref_w, fam.route_dtype, what=f"{name} routing weights")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_block_matches_transformers(name):
    fam, block, cfg, weights = _load(name)
    x = _x(cfg.hidden_size)
    assert_close(_hf_block(block, x), moe_forward(x, weights, cfg), fam.route_dtype, what=f"{name} MoE block")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_block_matches_transformers_in_float64_given_the_same_routing(name):
    fam, block, cfg, weights = _load(name)
    x = _x(cfg.hidden_size)
    out = moe_forward(x, weights, cfg, details=True)
    r = out.routing
    _patch_router(fam, block, r.topk_idx, r.topk_weights, r.logits, cfg.num_experts)
    assert_close(_hf_block(block, x), out.y, "float64", what=f"{name} MoE block with our routing")


def test_deepseek_group_mask_is_neg_inf_like_transformers():
    """Kept groups' biased scores all negative: masking with 0.0 would pick experts of dropped groups.

    transformers 5 (like DeepSeek's inference code and vLLM) masks with -inf; ``config_from_hf`` says
    ``group_mask="neg_inf"``. The "zero" reading must pick differently here, or the test has no teeth.
    """
    fam, block, cfg, weights = _load("deepseek_v3")
    assert cfg.group_mask == "neg_inf"
    with torch.no_grad():
        block.gate.e_score_correction_bias.fill_(-2.0)  # s + b in (-2, -1) for every expert
    weights = MoEWeights.from_hf(block.state_dict(), cfg)
    x = _x(cfg.hidden_size)
    hf_idx, _ = _hf_routing(fam, block, x, cfg.top_k)
    for mask, should_match in (("neg_inf", True), ("zero", False)):
        r = moe_forward(x, weights, cfg.replace(group_mask=mask), details=True).routing
        same = (np.sort(r.topk_idx, axis=1) == hf_idx).all(axis=1)
        assert same.all() == should_match and (should_match or not same.any()), (
            f"group_mask={mask!r}: {int(same.sum())} of {T} tokens route like transformers"
        )
