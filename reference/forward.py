"""The MoE layer forward pass in float64: the definition of correctness for megamoe.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, Is shared width,
N rows given to one expert.

Stages: ``route`` (routing.py) x -> topk_idx, topk_weights (T, K); ``plan_dispatch`` (dispatch.py)
pairs sorted by expert; ``experts_forward`` sorted rows -> (T*K, H); ``combine`` -> y (T, H);
``shared_forward`` x -> (T, H).

Activations on z = [g | u] (each (N, I)): silu_gated silu(g) * u; clamped_swiglu
g = min(g, limit), u = clamp(u, -limit, limit), (u + 1) * g * sigmoid(alpha * g).
Routing weights scale each expert's output, or its input for Llama 4 (``weight_on_input``).

FP8 layer (``MoEWeights.is_fp8``, format in ``fp8.py``): block-scaled weights are dequantized and
the input of every expert GEMM (x, and h) is quantized per token per 128 columns and dequantized
again; the router and the shared gate stay float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import InputError, as_float_array
from .config import MoEConfig
from .dispatch import DispatchPlan, plan_dispatch
from .fp8 import check_e4m3_values, fake_quantize_activations
from .routing import Routing, _sigmoid, route
from .weights import MoEWeights


def activation(z, config: MoEConfig) -> np.ndarray:
    """z: (N, 2I) gate then up halves -> (N, I)."""
    I = config.intermediate_size
    z = np.asarray(z, dtype=np.float64)
    g, u = z[..., :I], z[..., I:]
    if config.activation == "silu_gated":
        return g * _sigmoid(g) * u
    lim = config.swiglu_limit
    g = np.minimum(g, lim)
    u = np.clip(u, -lim, lim)
    return (u + 1.0) * g * _sigmoid(config.swiglu_alpha * g)


def expert_ffn(x, gate_up, down, config: MoEConfig, gate_up_bias=None, down_bias=None, *,
               fp8_activations: bool = False) -> np.ndarray:
    """One expert on N rows.  x: (N, H); gate_up: (2I, H); down: (H, I) -> (N, H)."""
    qdq = fake_quantize_activations if fp8_activations else np.asarray
    z = qdq(x) @ np.asarray(gate_up).T
    if gate_up_bias is not None:
        z = z + gate_up_bias
    y = qdq(activation(z, config)) @ np.asarray(down).T
    if down_bias is not None:
        y = y + down_bias
    return y


def experts_forward(x, routing: Routing, plan: DispatchPlan, weights: MoEWeights, config: MoEConfig, *,
                    fp8_activations: bool = False) -> np.ndarray:
    """Every (token, expert) pair through its expert.  -> (T*K, H), row r is plan.sorted_pair[r].

    For ``config.weight_on_input`` the input row is x[t] * topk_weights[t, k]; float weights only."""
    H = config.hidden_size
    out = np.zeros((plan.num_pairs, H), np.float64)
    in_scale = routing.topk_weights.reshape(-1)[plan.sorted_pair] if config.weight_on_input else None
    for e in np.nonzero(plan.counts)[0]:
        lo, hi = plan.offsets[e], plan.offsets[e + 1]
        rows = x[plan.sorted_token[lo:hi]]
        if in_scale is not None:
            rows = rows * in_scale[lo:hi, None]
        out[lo:hi] = expert_ffn(
            rows, weights.gate_up[e], weights.down[e], config,
            None if weights.gate_up_bias is None else weights.gate_up_bias[e],
            None if weights.down_bias is None else weights.down_bias[e],
            fp8_activations=fp8_activations,
        )
    return out


def combine(expert_out, plan: DispatchPlan, topk_weights, config: MoEConfig) -> np.ndarray:
    """y[t] = sum_k w[t, k] * expert_out[row of pair (t, k)], k ascending.  -> (T, H).

    expert_out: (T*K, H) in sorted-row order; unweighted for ``config.weight_on_input``."""
    T, K = plan.num_tokens, plan.top_k
    expert_out = np.asarray(expert_out)
    per_pair = expert_out[plan.pair_row].reshape(T, K, expert_out.shape[-1])
    if config.weight_on_input:
        return per_pair.sum(axis=1)
    return np.einsum("tk,tkh->th", np.asarray(topk_weights, np.float64), per_pair)


def shared_forward(x, weights: MoEWeights, config: MoEConfig, *, fp8_activations: bool = False) -> np.ndarray:
    """The shared experts (one fused MLP of width Is), optionally sigmoid-gated.  x: (T, H) -> (T, H)."""
    if config.num_shared_experts == 0:
        return np.zeros_like(x)
    shared_cfg = config.replace(intermediate_size=config.shared_intermediate_size, activation="silu_gated",
                                expert_bias=False)
    y = expert_ffn(x, weights.shared_gate_up, weights.shared_down, shared_cfg, fp8_activations=fp8_activations)
    if weights.shared_gate is not None:
        y = y * _sigmoid(x @ weights.shared_gate)[:, None]
    return y


@dataclass(frozen=True)
class MoEOutput:
    """Everything ``moe_forward(..., details=True)`` computed."""

    y: np.ndarray  # (T, H)
    routing: Routing
    plan: DispatchPlan
    expert_out: np.ndarray  # (T*K, H), sorted-row order
    shared_out: np.ndarray  # (T, H)


def moe_forward(x, weights: MoEWeights, config: MoEConfig, *, fp8_activations: bool | None = None,
                details: bool = False):
    """The MoE layer.  x: (T, H) real array (any float dtype; computed in float64) -> y: (T, H) float64.

    FP8 weights (``weights.is_fp8``) give the FP8 layer of the module docstring.
    ``fp8_activations``: whether the GEMM inputs are quantized too (None: as the weights).
    ``details=True`` returns an ``MoEOutput`` holding every stage's result.
    """
    if not isinstance(config, MoEConfig):
        raise InputError(f"config must be a MoEConfig, got {type(config).__name__}")
    if not isinstance(weights, MoEWeights):
        raise InputError(f"weights must be a MoEWeights, got {type(weights).__name__}")
    x = as_float_array("x", x, (None, config.hidden_size))
    weights = weights.to_numpy().validate(config)
    if fp8_activations is None:
        fp8_activations = weights.is_fp8
    elif not isinstance(fp8_activations, bool):
        raise InputError(f"fp8_activations must be True, False or None, got {fp8_activations!r}")
    if weights.is_fp8:
        for k in ("gate_up", "down", "shared_gate_up", "shared_down"):
            if getattr(weights, k) is not None:
                check_e4m3_values(f"MoEWeights.{k}", getattr(weights, k))
        weights = weights.dequantize()
    routing = route(x, weights.router_weight, config, weights.router_bias, weights.score_bias)
    plan = plan_dispatch(routing.topk_idx, config.num_experts)
    expert_out = experts_forward(x, routing, plan, weights, config, fp8_activations=fp8_activations)
    y = combine(expert_out, plan, routing.topk_weights, config)
    shared = shared_forward(x, weights, config, fp8_activations=fp8_activations)
    y = y + shared
    if details:
        return MoEOutput(y=y, routing=routing, plan=plan, expert_out=expert_out, shared_out=shared)
    return y
