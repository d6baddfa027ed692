"""The float64 reference of the grouped GEMMs' pair rows, shared by the kernel tests that launch GEMM 1
and GEMM 2 on their own: row t x K + k is token t's k-th pick through its expert's FFN, times its
routing weight (the rows moe_forward's combine sums)."""

from __future__ import annotations

import numpy as np
import torch

from megamoe.reference import assert_close, expert_ffn, round_to_dtype


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


def assert_fp8a_gemms_close_on_gpu(got, want, width: int) -> None:
    """Two runs of the FP8-activation GEMMs on a GPU, (h codes, h scales, pair rows) each: h within
    one e4m3 step (an fp32 sum's last bit can move a code) and the pair rows within a bf16 rounding."""
    h_got, h_want = dequantized_rows(got[0], got[1], width), dequantized_rows(want[0], want[1], width)
    torch.testing.assert_close(h_got, h_want, rtol=2**-3, atol=1e-3)
    torch.testing.assert_close(got[2].float(), want[2].float(), rtol=2**-6, atol=1e-3)


def assert_fp8a_pairs_match_reference(pairs, x, w8, idx, tw, cfg, dtype: str, what: str) -> None:
    """The FP8-activation GEMMs' ``pairs`` against the float64 FP8 layer's pair rows (x rounded to
    ``dtype``, the weights ``w8`` dequantized), at the e4m3 tolerance."""
    ref = pair_rows_reference(round_to_dtype(x, dtype), w8.dequantize(), idx, tw, cfg, fp8_activations=True)
    assert_close(pairs.double().numpy(), ref, "fp8_e4m3", what)
