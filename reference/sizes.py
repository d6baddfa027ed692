"""Bytes and FLOPs of the experts, per dtype: the one place every room reads them from.

Shape legend: T tokens, E routed experts, K top-k, H hidden, I expert width, Is shared width.

Dtype names: the long names of ``config.WEIGHT_DTYPES`` ("bfloat16", "float16", "float32",
"fp8_e4m3") or the short ones the simulator uses ("bf16", "fp16", "fp32", "fp8"). fp8 rows carry one
float32 scale per ``FP8_BLOCK`` values (the DeepEP / DeepSeek format); weights in fp8 are counted
at one byte per element (their block scales are 1/16384 of the bytes and not counted).

FLOPs count 2 per multiply-add. An expert is gate/up [H -> 2I] and down [I -> H]: 6 H I FLOPs
per row it computes.
"""

from __future__ import annotations

import math

from .config import DTYPE_BYTES

FP8_BLOCK = 128
SHORT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "fp8_e4m3"}


def long_dtype(name: str) -> str:
    """'bfloat16' | 'float16' | 'float32' | 'fp8_e4m3' from a long or short name."""
    if name in DTYPE_BYTES:
        return name
    if name in SHORT:
        return SHORT[name]
    raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)} or {sorted(SHORT)}, got {name!r}")


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype (long or short name)."""
    return DTYPE_BYTES[long_dtype(name)]


def row_bytes(width: int, dtype: str) -> int:
    """Bytes of one activation row of ``width`` elements: fp8 adds a float32 scale per 128 values."""
    d = long_dtype(dtype)
    if d == "fp8_e4m3":
        return width + 4 * math.ceil(width / FP8_BLOCK)
    return DTYPE_BYTES[d] * width


def ffn_params(hidden: int, width: int) -> int:
    """Weights of a gated FFN of width ``width``: gate/up [2 width, H] and down [H, width], no biases."""
    return 3 * hidden * width


def expert_params(config) -> int:
    """Parameters of one routed expert (gate/up, down, biases)."""
    p = ffn_params(config.hidden_size, config.intermediate_size)
    if config.expert_bias:
        p += 2 * config.intermediate_size + config.hidden_size
    return p


def expert_bytes(config, dtype: str | None = None) -> int:
    """Bytes of one routed expert's weights in ``dtype`` (default: the config's weight_dtype)."""
    return expert_params(config) * dtype_bytes(dtype or config.weight_dtype)


def shared_bytes(config, dtype: str | None = None) -> int:
    """Bytes of the shared MLP's weights (all shared experts together)."""
    return ffn_params(config.hidden_size, config.shared_intermediate_size) * dtype_bytes(dtype or config.weight_dtype)


def router_bytes(config, dtype: str | None = None) -> int:
    """Bytes of the router's weight (E, H)."""
    return config.num_experts * config.hidden_size * dtype_bytes(dtype or config.weight_dtype)


def ffn_flops(rows, hidden: int, width: int):
    """FLOPs of a gated FFN of width ``width`` on ``rows`` rows (scalar or array): 6 rows H I."""
    return 6.0 * rows * hidden * width


def layer_flops(config, T: int, *, router: bool = True) -> float:
    """FLOPs of one layer on T tokens: K experts and the shared MLP per token, and the router."""
    f = T * (config.top_k * ffn_flops(1, config.hidden_size, config.intermediate_size)
             + ffn_flops(1, config.hidden_size, config.shared_intermediate_size))
    return float(f + (2.0 * T * config.num_experts * config.hidden_size if router else 0.0))


def layer_bytes(config, T: int, experts_touched: float, dtype: str | None = None) -> float:
    """The fewest HBM bytes a layer on T tokens can move: the weights of the experts touched, the
    shared MLP and the router, read once; x read and y written once."""
    d = dtype or config.weight_dtype
    return float(experts_touched * expert_bytes(config, d) + shared_bytes(config, d) + router_bytes(config, d)
                 + 2 * T * row_bytes(config.hidden_size, d))
