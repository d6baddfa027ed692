"""Hugging Face configs and checkpoints into megamoe's reference: ``MoEConfig`` and ``MoEWeights``.

Shape legend: E routed experts, K top-k, H hidden size, I expert width, Is shared width.

    ``read_json(path)``                            a config.json as a dict, with errors naming the file
    ``config_from_hf(config)``                     a transformers config (dict or path) -> ``MoEConfig``
    ``weights_from_hf(state_dict, config, prefix)``  one MoE layer's tensors -> ``MoEWeights`` (float64)

The families (by ``model_type``), the checkpoint keys and layouts accepted, and the FP8 checkpoints
(block scales, loaded as FP8 ``MoEWeights``) are tabled in docs/design.md. The fused layout follows
from the config, never from shapes. Other quantized tensors (MXFP4, per-tensor scales) are refused.
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

    The ``model_type`` picks the semantics. Raises ``ConfigError`` naming the field for a missing or
    mistyped field, an unknown model_type and a variant megamoe does not model.
    """
    return MoEConfig.from_hf(config)


def weights_from_hf(state_dict: Mapping[str, Any], config: MoEConfig, prefix: str | None = None) -> MoEWeights:
    """One MoE layer's weights in megamoe's canonical layout (float64 NumPy), from a HF state dict.

    ``state_dict``: {key: torch tensor or NumPy array}. ``prefix`` selects one layer (e.g.
    ``"model.layers.3.mlp."``; None: the one MoE module in the dict). FP8 checkpoints give FP8
    weights. Raises ``InputError`` naming the key for a missing, unexpected, misshaped or quantized
    tensor or scale.
    """
    return MoEWeights.from_hf(state_dict, config, prefix)
