"""FP8 (OCP float8 e4m3fn) with block scales: what an FP8 MoE layer must compute, bit for bit.

Shape legend: T tokens, H hidden, I expert width; R, C the rows and columns of one weight matrix
(torch ``nn.Linear`` layout [out, in]); Rb = ceil(R / 128), Cb = ceil(C / 128) its scale blocks.

e4m3fn (OCP 8-bit float spec): sign, 4 exponent bits (bias 7), 3 mantissa bits; subnormals at
E = 0, NaN at 0x7F / 0xFF, no infinity; largest finite 448, smallest normal 2^-6, smallest
subnormal 2^-9. Encoding rounds to nearest even; beyond 448 it saturates to +-448
(``saturate=True``, torch's cast and ``cvt.rn.satfinite``) or gives NaN (``saturate=False``).

Scales follow DeepSeek-V3's ``weight_scale_inv``: a block ``a`` is stored as codes q and one
float32 ``scale_inv`` s with

    s = max(amax(|a|), AMAX_FLOOR) / 448        q = e4m3(a / s)        a ~= value(q) * s

``a`` is rounded to float32 and both divisions are correctly rounded float32 ones (as on a GPU:
bf16 inputs often land on e4m3 ties, so float64 would give other codes). Dequantization is
value(q) * s in float64. Weights use 128 x 128 blocks over a matrix's last two dimensions
(WEIGHT_BLOCK), activations 1 x 128 groups per token (ACT_GROUP); a partial last block has a scale
of its own. NumPy only.
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import InputError
from .sizes import FP8_BLOCK

E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4
WEIGHT_BLOCK = (FP8_BLOCK, FP8_BLOCK)
ACT_GROUP = FP8_BLOCK

_EXP_BIAS = 7
_MANT_BITS = 3
_MIN_EXP = 1 - _EXP_BIAS  # exponent of the smallest normal, and of the subnormals' binade
_MAX_CODE = 0x7E  # +448
_NAN_CODE = 0x7F


def _decode_table() -> np.ndarray:
    """The value of every one of the 256 codes, from the bit fields."""
    c = np.arange(256)
    s, e, m = c >> 7, (c >> _MANT_BITS) & 0xF, c & 0x7
    mag = np.where(e == 0, m / 8.0 * 2.0**_MIN_EXP, (1.0 + m / 8.0) * np.exp2(e - _EXP_BIAS))
    mag = np.where((e == 15) & (m == 7), np.nan, mag)
    return np.where(s == 1, -mag, mag)


_TABLE = _decode_table()
_TABLE.flags.writeable = False


def e4m3_encode(x, *, saturate: bool = True) -> np.ndarray:
    """x: any real array -> uint8 codes of the same shape: round to nearest, ties to even."""
    x = np.asarray(x)
    if x.dtype.kind not in "fiu":
        raise InputError(f"e4m3_encode takes a real array, got dtype {x.dtype}")
    x = x.astype(np.float64, copy=False)
    sign = np.signbit(x).astype(np.uint8) << 7
    a = np.abs(x)
    finite = np.isfinite(a)
    a_fin = np.where(finite, a, 0.0)
    _, ex = np.frexp(np.where(a_fin > 0, a_fin, 1.0))  # a = f * 2^ex, f in [0.5, 1)
    e = np.maximum(ex - 1, _MIN_EXP)  # binade exponent; the subnormals share the smallest normal's
    q = np.rint(np.ldexp(a_fin, _MANT_BITS - e))  # a / 2^(e-3) is exact; rint rounds ties to even
    carry = q >= 16  # rounded up into the next binade
    e = np.where(carry, e + 1, e)
    q = np.where(carry, 8.0, q)
    normal = q >= 8  # q < 8 only in the subnormal binade
    field = np.where(normal, e + _EXP_BIAS, 0)
    mant = np.where(normal, q - 8, q).astype(np.int64)
    code = (np.clip(field, 0, 15) << _MANT_BITS) | mant
    over = (~finite & ~np.isnan(a)) | (field > 15) | (code > _MAX_CODE)
    code = np.where(over, _MAX_CODE if saturate else _NAN_CODE, code)
    code = np.where(np.isnan(a), _NAN_CODE, code)
    return (code.astype(np.uint8) | sign).astype(np.uint8)


def e4m3_decode(codes) -> np.ndarray:
    """uint8 codes (or the ``.view(torch.uint8)`` of a float8_e4m3fn tensor) -> float64 values."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise InputError(f"e4m3_decode takes uint8 codes, got dtype {codes.dtype}")
    return _TABLE[codes]


def e4m3_round(x, *, saturate: bool = True) -> np.ndarray:
    """The e4m3 value nearest to each element of x (ties to even), as float64."""
    return e4m3_decode(e4m3_encode(x, saturate=saturate))


def check_e4m3_values(name: str, a) -> np.ndarray:
    """``a`` as float64, after checking that every element is a finite e4m3 value."""
    a = np.asarray(a, dtype=np.float64)
    bad = ~(e4m3_round(a, saturate=False) == a)
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise InputError(f"{name} must hold float8 e4m3 values (from a float8_e4m3fn tensor or "
                         f"quantize_weight_blocks), got {float(a[i])!r} at index {i}")
    return a


# ---------------------------------------------------------------------- blocks and scales


def _check_block(block) -> tuple[int, int]:
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in block)):
        raise InputError(f"block must be two positive integers (rows, columns), got {block!r}")
    return int(block[0]), int(block[1])


def _check_group(group) -> int:
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise InputError(f"group must be a positive integer, got {group!r}")
    return group


def num_blocks(size: int, block: int) -> int:
    """Blocks of ``block`` covering ``size`` (the last one partial when block does not divide size)."""
    return math.ceil(size / block)


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """Shape of the scales of an array of ``shape`` in blocks over its last two dimensions."""
    *lead, R, C = shape
    return (*lead, num_blocks(R, block[0]), num_blocks(C, block[1]))


def _real(name: str, a, min_ndim: int) -> np.ndarray:
    """``a`` as float32 (the quantization's arithmetic), finite."""
    a = np.asarray(a)
    if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
        raise InputError(f"{name} must be a real array, got dtype {a.dtype}")
    if a.ndim < min_ndim:
        raise InputError(f"{name} must have at least {min_ndim} dimensions, got shape {list(a.shape)}")
    a64 = a.astype(np.float64, copy=False)
    if a64.size and not np.isfinite(a64).all():
        i = tuple(int(j) for j in np.argwhere(~np.isfinite(a64))[0])
        raise InputError(f"{name} has a non-finite value {a64[i]} at index {i}")
    with np.errstate(over="ignore"):
        a32 = a64.astype(np.float32)
    if a32.size and not np.isfinite(a32).all():
        i = tuple(int(j) for j in np.argwhere(~np.isfinite(a32))[0])
        raise InputError(f"{name} has a value {a64[i]} at index {i} beyond float32's range")
    return a32


def _block_amax(a: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """max |a| over each block of the last two dimensions: (..., R, C) -> (..., Rb, Cb)."""
    *lead, R, C = a.shape
    br, bc = block
    nr, nc = num_blocks(R, br), num_blocks(C, bc)
    padded = np.zeros((*lead, nr * br, nc * bc), a.dtype)
    padded[..., :R, :C] = np.abs(a)
    return padded.reshape(*lead, nr, br, nc, bc).max(axis=(-3, -1), initial=0.0)


def _expand(s: np.ndarray, shape: tuple[int, ...], block: tuple[int, int]) -> np.ndarray:
    """Per-block scales (..., Rb, Cb) repeated over their blocks and cut to (..., R, C)."""
    R, C = shape[-2:]
    return np.repeat(np.repeat(s, block[0], axis=-2), block[1], axis=-1)[..., :R, :C]


def _quantize(a: np.ndarray, block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """a: float32 -> (codes, float32 scales), every operation in float32 (see the module docstring)."""
    scale = np.maximum(_block_amax(a, block), np.float32(AMAX_FLOOR)) / np.float32(E4M3_MAX)
    return e4m3_encode(a / _expand(scale, a.shape, block)), scale


def _values(name: str, q, min_ndim: int) -> np.ndarray:
    """uint8 codes decoded, or float arrays checked to hold e4m3 values."""
    if hasattr(q, "detach"):  # a torch float8_e4m3fn (or other float) tensor
        q = q.detach().cpu().double().numpy()
    q = np.asarray(q)
    if q.ndim < min_ndim:
        raise InputError(f"{name} must have at least {min_ndim} dimensions, got shape {list(q.shape)}")
    if q.dtype == np.uint8:
        v = e4m3_decode(q)
        if np.isnan(v).any():
            i = tuple(int(j) for j in np.argwhere(np.isnan(v))[0])
            raise InputError(f"{name} holds the e4m3 NaN code {int(q[i]):#04x} at index {i}")
        return v
    if q.dtype.kind != "f":
        raise InputError(f"{name} must be uint8 e4m3 codes or float e4m3 values, got dtype {q.dtype}")
    return check_e4m3_values(name, q)


def _scales(name: str, s, want: tuple[int, ...]) -> np.ndarray:
    if hasattr(s, "detach"):
        s = s.detach().cpu().double().numpy()
    s = np.asarray(s)
    if s.dtype.kind != "f":
        raise InputError(f"{name} must be a float array, got dtype {s.dtype}")
    if s.shape != want:
        raise InputError(f"{name} must have shape {list(want)} (one scale per block), got {list(s.shape)}")
    return check_scales(name, s)


def check_scales(name: str, s) -> np.ndarray:
    """``s`` as float64, after checking that every scale is finite and > 0."""
    s = np.asarray(s, dtype=np.float64)
    bad = ~(np.isfinite(s) & (s > 0))
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise InputError(f"{name} (shape {list(s.shape)}) must be finite and > 0, got {s[i]} at index {i}")
    return s


def quantize_weight_blocks(w, block=WEIGHT_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """w: (..., R, C) real -> (codes (..., R, C) uint8, scale_inv (..., Rb, Cb) float32).

    One scale per ``block`` = (rows, columns) block of the last two dimensions (a leading expert
    dimension E is allowed); dequantize_weight_blocks(codes, scale_inv) ~= w.
    """
    block = _check_block(block)
    w = _real("w", w, 2)
    return _quantize(w, block)


def dequantize_weight_blocks(q, scale_inv, block=WEIGHT_BLOCK) -> np.ndarray:
    """q: (..., R, C) uint8 codes or e4m3 values; scale_inv: (..., Rb, Cb) -> (..., R, C) float64."""
    block = _check_block(block)
    v = _values("q", q, 2)
    s = _scales("scale_inv", scale_inv, scale_shape(v.shape, block))
    return v * _expand(s, v.shape, block)  # exact: 4 significant bits times float32's 24


def quantize_activations(x, group: int = ACT_GROUP) -> tuple[np.ndarray, np.ndarray]:
    """x: (T, C) real -> (codes (T, C) uint8, scale (T, ceil(C / group)) float32): per token, per group columns."""
    group = _check_group(group)
    x = _real("x", x, 2)
    if x.ndim != 2:
        raise InputError(f"x must have shape [T, C], got {list(x.shape)}")
    return _quantize(x, (1, group))


def dequantize_activations(q, scale, group: int = ACT_GROUP) -> np.ndarray:
    """q: (T, C) uint8 codes or e4m3 values; scale: (T, ceil(C / group)) -> (T, C) float64."""
    group = _check_group(group)
    v = _values("q", q, 2)
    if v.ndim != 2:
        raise InputError(f"q must have shape [T, C], got {list(v.shape)}")
    s = _scales("scale", scale, scale_shape(v.shape, (1, group)))
    return v * _expand(s, v.shape, (1, group))


def fake_quantize_activations(x, group: int = ACT_GROUP) -> np.ndarray:
    """x: (T, C) -> (T, C) float64: x quantized per token per ``group`` columns and dequantized."""
    q, s = quantize_activations(x, group)
    return dequantize_activations(q, s, group)
