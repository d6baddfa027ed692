"""Named MoE layers of public models.

Shapes and router semantics from the models' config.json files as quoted in public code
(summarized in shared/facts/moe-models.md). Each preset is one MoE layer, routed plus shared
experts, bf16 weights.
"""

from __future__ import annotations

from typing import Any

from ._checks import ConfigError

_PRESET_FIELDS: dict[str, dict] = {
    # softmax over 8 experts, top-2, always renormalized
    "mixtral-8x7b": dict(hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2),
    # softmax top-8 of 128, norm_topk_prob true, no shared expert
    "qwen3-30b-a3b": dict(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8),
    "qwen3-235b-a22b": dict(hidden_size=4096, intermediate_size=1536, num_experts=128, top_k=8),
    # Qwen1.5-MoE-A2.7B: 60 experts top-4, not renormalized, a gated shared MLP of width 5632
    "qwen1.5-moe-a2.7b": dict(
        hidden_size=2048, intermediate_size=1408, num_experts=60, top_k=4, norm_topk_prob=False,
        num_shared_experts=1, shared_intermediate_size=5632, shared_expert_gate=True,
    ),
    # sigmoid scores + e_score_correction_bias, 8 groups keep 4, top-8, x2.5, one shared expert
    "deepseek-v3": dict(
        hidden_size=7168, intermediate_size=2048, num_experts=256, top_k=8,
        router="sigmoid_grouped_topk", n_group=8, topk_group=4, routed_scaling_factor=2.5,
        score_bias=True, num_shared_experts=1, shared_intermediate_size=2048,
    ),
    # DeepSeek-V3 architecture with 384 experts in a single group, x2.827
    "kimi-k2": dict(
        hidden_size=7168, intermediate_size=2048, num_experts=384, top_k=8,
        router="sigmoid_grouped_topk", n_group=1, topk_group=1, routed_scaling_factor=2.827,
        score_bias=True, num_shared_experts=1, shared_intermediate_size=2048,
    ),
    # router with bias, top-k then softmax, clamped swiglu (alpha 1.702, limit 7), biased experts
    "gpt-oss-20b": dict(
        hidden_size=2880, intermediate_size=2880, num_experts=32, top_k=4, router="topk_softmax",
        router_bias=True, activation="clamped_swiglu", expert_bias=True,
    ),
    "gpt-oss-120b": dict(
        hidden_size=2880, intermediate_size=2880, num_experts=128, top_k=4, router="topk_softmax",
        router_bias=True, activation="clamped_swiglu", expert_bias=True,
    ),
    # top-1 of raw logits, sigmoid(score) scales the expert INPUT, plus a shared MLP of width 8192
    "llama4-maverick": dict(
        hidden_size=5120, intermediate_size=8192, num_experts=128, top_k=1,
        router="sigmoid_top1_input", num_shared_experts=1, shared_intermediate_size=8192,
    ),
}

PRESETS: tuple[str, ...] = tuple(_PRESET_FIELDS)


def preset_fields(name: str) -> dict[str, Any]:
    """The ``MoEConfig`` fields of preset ``name`` (``MoEConfig.preset(name)`` builds it)."""
    try:
        return dict(_PRESET_FIELDS[name])
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}") from None
