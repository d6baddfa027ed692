"""The float64 reference of the grouped GEMMs' pair rows, shared by the kernel tests that launch GEMM 1
and GEMM 2 on their own: row t x K + k is token t's k-th pick through its expert's FFN, times its
routing weight (the rows moe_forward's combine sums)."""

from __future__ import annotations

import numpy as np

from megamoe.reference import expert_ffn


def pair_rows_reference(xr, w, idx, tw, cfg, **ffn_kwargs) -> np.ndarray:
    """(T x K, H) float64 pair rows of tokens ``xr`` (already rounded to the kernels' dtype) through
    the weights ``w`` (gate_up, down: rounded or dequantized) for picks ``idx`` (T, K) with routing
    weights ``tw``; ``ffn_kwargs`` go to reference.expert_ffn (e.g. fp8_activations=True)."""
    return np.stack([tw[t, k] * expert_ffn(xr[t:t + 1], w.gate_up[e], w.down[e], cfg, **ffn_kwargs)[0]
                     for t in range(len(idx)) for k, e in enumerate(idx[t])])


def dequantized_rows(codes, scales, width: int):
    """FP8 rows (e4m3 ``codes``, one float32 scale per 128 columns in ``scales``) as float32, cut to
    ``width`` columns: GEMM 1's quantized activation as GEMM 2 reads it."""
    return codes.float() * scales.repeat_interleave(128, 1)[:, :width]
