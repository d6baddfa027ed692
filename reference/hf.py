"""Hugging Face configs and checkpoints into megamoe's reference: ``MoEConfig`` and ``MoEWeights``.

Shape legend: E routed experts, K top-k, H hidden size, I expert width, Is shared width (all shared
experts together).

Public names:
    ``read_json(path)``                            a config.json as a dict, with errors naming the file
    ``config_from_hf(config)``                     a transformers config (dict or path) -> ``MoEConfig``
    ``weights_from_hf(state_dict, config, prefix)``  one MoE layer's tensors -> ``MoEWeights`` (float64)

Families, by the config's ``model_type`` (semantics in shared/facts/moe-models.md):

    model_type              router                 experts          shared experts
    mixtral                 softmax_topk, renorm   silu_gated       none
    qwen2_moe               softmax_topk           silu_gated       1 x shared_expert_intermediate_size, sigmoid gate
    qwen3_moe               softmax_topk           silu_gated       none
    deepseek_v3, kimi_k2    sigmoid_grouped_topk   silu_gated       n_shared_experts x moe_intermediate_size
    deepseek_v2             softmax_topk (only topk_method greedy, softmax, no scaling: DeepSeek-V2-Lite)
    gpt_oss                 topk_softmax + bias    clamped_swiglu   none
    llama4, llama4_text     sigmoid_top1_input     silu_gated       1 x intermediate_size
    kimi_k25                its ``text_config`` (a deepseek_v3 / kimi_k2 config)

DeepSeek's grouped top-k masks the dropped groups with -inf (``group_mask="neg_inf"``, routing.py).

Checkpoint tensors accepted by ``weights_from_hf`` (keys relative to the MoE module, e.g. after
``model.layers.3.mlp.``; torch ``nn.Linear`` weights are [out, in]):

    router          gate.weight | router.weight [E, H]; gate.bias | router.bias [E] (gpt-oss);
                    gate.e_score_correction_bias [E] (DeepSeek)
    per expert      experts.{e}.gate_proj / up_proj .weight [I, H], experts.{e}.down_proj.weight [H, I]
                    (Mixtral: experts.{e}.w1 (gate) / w3 (up) [I, H], w2 (down) [H, I])
    fused (3-D)     transformers >= 5 for Mixtral, Qwen, DeepSeek:
                        experts.gate_up_proj [E, 2I, H] (gate rows first), experts.down_proj [E, H, I]
                    gpt-oss: experts.gate_up_proj [E, H, 2I] with gate and up INTERLEAVED (gate columns
                        0, 2, 4, ..., up 1, 3, 5, ...), gate_up_proj_bias [E, 2I] interleaved,
                        down_proj [E, I, H], down_proj_bias [E, H]
                    Llama 4: experts.gate_up_proj [E, H, 2I] (gate columns first), down_proj [E, I, H]
    shared          shared_expert.* | shared_experts.* gate_proj / up_proj [Is, H], down_proj [H, Is];
                    shared_expert_gate.weight [1, H] (Qwen2-MoE)

Which fused layout applies follows from the config, never from shapes (they are ambiguous when
H = 2I): ``activation="clamped_swiglu"`` means gpt-oss's, ``router="sigmoid_top1_input"`` Llama 4's,
anything else the standard one.

FP8 checkpoints (DeepSeek-V3/R1, Kimi K2: ``quantization_config`` fp8, e4m3, weight_block_size
[128, 128]) store each expert and shared-expert weight as float8_e4m3fn with a float32
``weight_scale_inv`` per 128 x 128 block (weight ~= value * scale_inv, see ``fp8.py``):

    per expert      experts.{e}.gate_proj / up_proj / down_proj .weight_scale_inv [ceil(I/128), ceil(H/128)] /
                    [ceil(H/128), ceil(I/128)]; the shared experts' the same under shared_experts.*
    fused (3-D)     transformers 5: experts.gate_up_proj_scale_inv [E, ceil(2I/128), ceil(H/128)],
                    experts.down_proj_scale_inv [E, ceil(H/128), ceil(I/128)] (standard layout only)

They load as FP8 ``MoEWeights`` (``is_fp8``: e4m3 values and ``*_scale_inv``; ``moe_forward`` then
computes the FP8 layer; ``.dequantize()`` gives plain weights). A checkpoint is FP8 when any expert
weight is float8 or has a scale; then every expert and shared weight needs its scale. Per-expert
gate and up scales are stacked into the fused gate_up's, which needs I (and Is) to be a multiple of
128 (it is in every FP8 model shipped). The router stays unquantized (DeepSeek ships it in bf16).
Other quantized tensors (gpt-oss MXFP4 ``*_blocks``/``*_scales``, per-tensor ``weight_scale`` /
``input_scale``, a scaled router) are refused: dequantize first.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .config import MoEConfig
from .hf_config import SUPPORTED_MODEL_TYPES, read_json
from .weights import MoEWeights

__all__ = ["SUPPORTED_MODEL_TYPES", "config_from_hf", "read_json", "weights_from_hf"]


def config_from_hf(config: Mapping[str, Any] | str | Path) -> MoEConfig:
    """One MoE layer of a transformers model, from its config dict (``PretrainedConfig.to_dict()``
    or a parsed config.json) or the path of a config.json.

    The ``model_type`` picks the semantics (module docstring); fields of other layers are ignored.
    ``name``: ``_name_or_path``, else the model_type; ``weight_dtype``: ``dtype`` / ``torch_dtype``
    when megamoe knows it, else bfloat16. Raises ``ConfigError`` naming the field for a missing or
    mistyped field, an unknown model_type (listing the supported ones) and a variant megamoe does
    not model (e.g. DeepSeek-V3 with scoring_func softmax).
    """
    return MoEConfig.from_hf(config)


def weights_from_hf(state_dict: Mapping[str, Any], config: MoEConfig, prefix: str | None = None) -> MoEWeights:
    """One MoE layer's weights in megamoe's canonical layout (float64 NumPy), from a HF state dict.

    ``state_dict``: {key: torch tensor of any float dtype or NumPy array}, the keys of the module
    docstring. ``prefix`` selects one layer in a dict holding several, e.g. ``"model.layers.3.mlp."``
    or ``"model.layers.3."``; with None the one MoE module in the dict is found (several: an error
    asking for ``prefix``). FP8 checkpoints give FP8 weights (``is_fp8``), the scales as stored.
    Raises ``InputError`` naming the key for a missing, unexpected, misshaped or quantized tensor or
    scale. The result passes ``MoEWeights.validate(config)``.
    """
    return MoEWeights.from_hf(state_dict, config, prefix)
