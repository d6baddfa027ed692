"""Bytes and FLOPs of the experts, per dtype: the one place every room reads them from.

Shape legend: T tokens, E routed experts, K top-k, H hidden, I expert width, Is shared width.

Dtype names: ``WEIGHT_DTYPES`` ("bfloat16", "float16", "float32", "fp8_e4m3") or the simulator's
("bf16", "fp16", "fp32", "fp8"). fp8 rows carry one float32 scale per ``FP8_BLOCK`` values, fp8
weights one per ``FP8_BLOCK`` x ``FP8_BLOCK`` block (``matrix_bytes``); an fp8 layer's router
counts in bf16. FLOPs: 2 per multiply-add, 6 H I per expert row.
"""

from __future__ import annotations

import math

#: Storage dtypes of the weights (the reference always computes in float64).
WEIGHT_DTYPES = ("bfloat16", "float16", "float32", "fp8_e4m3")
#: Bytes per element of each weight dtype.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8_e4m3": 1}
#: Rows and columns of one FP8 scale block (weights: FP8_BLOCK x FP8_BLOCK; activations: 1 x FP8_BLOCK).
FP8_BLOCK = 128
SCALE_BYTES = 4  # one float32 scale
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


def weight_bytes_per_element(dtype: str) -> float:
    """Bytes per weight element with its share of the block scales (``matrix_bytes``: exact sizes)."""
    d = long_dtype(dtype)
    if d == "fp8_e4m3":
        return DTYPE_BYTES[d] + SCALE_BYTES / FP8_BLOCK**2
    return float(DTYPE_BYTES[d])


def matrix_bytes(rows: int, cols: int, dtype: str) -> int:
    """Bytes of a [rows, cols] weight matrix: fp8 adds a float32 scale per 128 x 128 block (ceil each way)."""
    d = long_dtype(dtype)
    b = DTYPE_BYTES[d] * rows * cols
    if d == "fp8_e4m3":
        b += SCALE_BYTES * math.ceil(rows / FP8_BLOCK) * math.ceil(cols / FP8_BLOCK)
    return b


def row_bytes(width: int, dtype: str) -> int:
    """Bytes of one activation row of ``width`` elements: fp8 adds a float32 scale per 128 values."""
    d = long_dtype(dtype)
    if d == "fp8_e4m3":
        return width + SCALE_BYTES * math.ceil(width / FP8_BLOCK)
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
    """Bytes of one routed expert's weights in ``dtype`` (default the config's), fp8 scales included."""
    d = dtype or config.weight_dtype
    H, I = config.hidden_size, config.intermediate_size
    biases = expert_params(config) - 3 * H * I
    return matrix_bytes(2 * I, H, d) + matrix_bytes(H, I, d) + biases * dtype_bytes(d)


def shared_bytes(config, dtype: str | None = None) -> int:
    """Bytes of the shared MLP's weights (all shared experts together), fp8 block scales included."""
    d = dtype or config.weight_dtype
    H, Is = config.hidden_size, config.shared_intermediate_size
    return matrix_bytes(2 * Is, H, d) + matrix_bytes(H, Is, d)


def router_bytes(config, dtype: str | None = None) -> int:
    """Bytes of the router's weight (E, H); an fp8 layer's router is bf16 (see the module docstring)."""
    d = long_dtype(dtype or config.weight_dtype)
    return config.num_experts * config.hidden_size * dtype_bytes("bfloat16" if d == "fp8_e4m3" else d)


def ffn_flops(rows, hidden: int, width: int):
    """FLOPs of a gated FFN of width ``width`` on ``rows`` rows (scalar or array): 6 rows H I."""
    return 6.0 * rows * hidden * width


def layer_flops(config, T: int, *, router: bool = True) -> float:
    """FLOPs of one layer on T tokens: K experts and the shared MLP per token, and the router."""
    f = T * (config.top_k * ffn_flops(1, config.hidden_size, config.intermediate_size)
             + ffn_flops(1, config.hidden_size, config.shared_intermediate_size))
    return float(f + (2.0 * T * config.num_experts * config.hidden_size if router else 0.0))


def layer_bytes(config, T: int, experts_touched: float, dtype: str | None = None,
                io_dtype: str | None = None) -> float:
    """The fewest HBM bytes a layer on T tokens can move: the weights touched read once in ``dtype``,
    x and y once in ``io_dtype`` (default ``dtype``)."""
    d = dtype or config.weight_dtype
    return float(experts_touched * expert_bytes(config, d) + shared_bytes(config, d) + router_bytes(config, d)
                 + 2 * T * row_bytes(config.hidden_size, io_dtype or d))
