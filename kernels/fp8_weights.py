"""FP8 weights made on the device: ``reference.fp8.quantize_weight_blocks`` in torch, bit for bit.

Shape legend: E experts, R, C the rows and columns of one weight matrix ([out, in]);
Rb = ceil(R / 128), Cb = ceil(C / 128) its scale blocks (the last ones partial where 128 does not divide).

The arithmetic is reference/fp8.py's (divisions by a tensor: ``a / scalar`` is not correctly
rounded), in slices of ``chunk_elems`` values of the leading dimension.
"""

from __future__ import annotations

import dataclasses

import torch

from ..reference.fp8 import AMAX_FLOOR, E4M3_MAX, WEIGHT_BLOCK
from ..reference.weights import SCALE_FIELDS, MoEWeights

#: values per slice of the leading dimension: each float32 temporary is 1 GiB at most
CHUNK_ELEMS = 1 << 28


def _quantize(a: torch.Tensor, br: int, bc: int) -> tuple[torch.Tensor, torch.Tensor]:
    """a: (n, R, C) float32 -> (codes (n, R, C) float8_e4m3fn, scale_inv (n, Rb, Cb) float32)."""
    n, R, C = a.shape
    nr, nc = -(-R // br), -(-C // bc)
    padded = torch.nn.functional.pad(a.abs(), (0, nc * bc - C, 0, nr * br - R))  # zeros
    amax = padded.view(n, nr, br, nc, bc).amax(dim=(2, 4))
    del padded
    scale = amax.clamp_min(AMAX_FLOOR) / torch.full_like(amax, E4M3_MAX)
    full = scale.repeat_interleave(br, dim=1)[:, :R].repeat_interleave(bc, dim=2)[:, :, :C]
    q = (a / full).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def quantize_weight_blocks(w: torch.Tensor, block: tuple[int, int] = WEIGHT_BLOCK, *,
                           chunk_elems: int = CHUNK_ELEMS) -> tuple[torch.Tensor, torch.Tensor]:
    """w (..., R, C) -> (codes float8_e4m3fn, scale_inv (..., Rb, Cb) fp32), as reference.fp8's."""
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dim() < 2:
        raise ValueError(f"w must be a float tensor of at least 2 dimensions, got "
                         f"{type(w).__name__} {getattr(w, 'dtype', '')} {list(getattr(w, 'shape', []))}")
    if w.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(f"w is {w.dtype} already: quantize the float weights it came from")
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in block)):
        raise ValueError(f"block must be two positive integers (rows, columns), got {block!r}")
    br, bc = block
    *lead, R, C = w.shape
    flat = w.reshape(-1, R, C)
    step = max(1, chunk_elems // max(1, R * C))
    qs, ss = [], []
    for i in range(0, flat.shape[0], step):
        a = flat[i:i + step].to(torch.float32)
        if not bool(torch.isfinite(a).all()):
            j = int(torch.nonzero(~torch.isfinite(a))[0, 0]) + i
            raise ValueError(f"w has a non-finite value (or one beyond float32's range) in slice {j} of its "
                             f"leading dimensions")
        q, s = _quantize(a, br, bc)
        qs.append(q)
        ss.append(s)
    q = torch.cat(qs) if len(qs) > 1 else qs[0]
    s = torch.cat(ss) if len(ss) > 1 else ss[0]
    return q.reshape(*lead, R, C), s.reshape(*lead, *s.shape[1:])


def to_fp8(weights: MoEWeights, *, chunk_elems: int = CHUNK_ELEMS) -> MoEWeights:
    """``weights`` with the expert weights quantized on their device, as ``MoEWeights.to_fp8()``."""
    if weights.is_fp8:
        raise ValueError("fp8_weights.to_fp8: the weights are FP8 already")
    out = {}
    for k, name in SCALE_FIELDS.items():
        a = getattr(weights, name)
        if a is not None:
            out[name], out[k] = quantize_weight_blocks(a, chunk_elems=chunk_elems)
    return dataclasses.replace(weights, **out)
