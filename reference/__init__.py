"""megamoe.reference: the float64 NumPy MoE layer that defines correctness.

Shape legend: T tokens, E routed experts, K top-k, H hidden, I expert width, G GPUs, S SMs.
Imports nothing of megamoe's other rooms; NumPy only.
"""

from ._checks import InputError
from .config import ACTIVATIONS, ROUTERS, ConfigError, MoEConfig
from .dispatch import DispatchPlan, plan_dispatch, rank_traffic
from .forward import MoEOutput, activation, combine, expert_ffn, experts_forward, moe_forward, shared_forward
from .fp8 import (
    dequantize_activations,
    dequantize_weight_blocks,
    fake_quantize_activations,
    quantize_activations,
    quantize_weight_blocks,
)
from .presets import PRESETS
from .routing import Routing, route, router_logits, select_experts
from .tolerance import TOLERANCES, ErrorReport, assert_close, normalized_error, round_to_dtype, tolerance_for
from .weights import MoEWeights, expected_scale_shapes, expected_shapes, random_weights

__all__ = [
    "ACTIVATIONS", "PRESETS", "ROUTERS", "TOLERANCES", "ConfigError", "DispatchPlan", "ErrorReport",
    "InputError", "MoEConfig", "MoEOutput", "MoEWeights", "Routing", "activation", "assert_close",
    "combine", "dequantize_activations", "dequantize_weight_blocks", "expected_scale_shapes", "expected_shapes",
    "expert_ffn", "experts_forward", "fake_quantize_activations", "moe_forward", "normalized_error",
    "plan_dispatch", "quantize_activations", "quantize_weight_blocks", "random_weights", "rank_traffic",
    "round_to_dtype", "route", "router_logits", "select_experts", "shared_forward", "tolerance_for",
]
