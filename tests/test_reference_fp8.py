"""reference/fp8.py: e4m3 codes from the format's definition, block scales, and their errors.

Expected codes are worked by hand from the OCP E4M3 definition (sign, 4 exponent bits of bias 7,
3 mantissa bits; E=15 M=7 is NaN); torch's float8_e4m3fn cast, where installed, is a second,
independent oracle. Block scales are re-derived here block by block with plain loops, in float32
arithmetic as the module defines them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from megamoe.reference import InputError
from megamoe.reference.fp8 import (
    AMAX_FLOOR,
    E4M3_MAX,
    dequantize_activations,
    dequantize_weight_blocks,
    e4m3_decode,
    e4m3_encode,
    e4m3_round,
    fake_quantize_activations,
    quantize_activations,
    quantize_weight_blocks,
)

S = 2.0**-9  # the smallest subnormal

# (value, code): each worked from the bit fields
HAND = [
    (0.0, 0x00), (-0.0, 0x80),
    (S, 0x01), (7 * S, 0x07), (-3 * S, 0x83),  # subnormals: M / 8 * 2^-6
    (2.0**-6, 0x08),  # smallest normal: E=1 M=0
    (1.0, 0x38), (1.125, 0x39), (-1.5, 0xBC), (2.0, 0x40),
    (448.0, 0x7E), (-448.0, 0xFE),  # largest finite: E=15 M=6
    (240.0, 0x77),  # 1.875 * 2^7: E=14 M=7, the largest below the last binade
]
TIES = [  # halfway between two codes: the one with the even mantissa wins
    (1.0625, 0x38),  # 1 (M=0) | 1.125 (M=1)
    (1.1875, 0x3A),  # 1.125 (M=1) | 1.25 (M=2)
    (-1.1875, 0xBA),  # sign does not change the rule
    (S / 2, 0x00),  # 0 | 2^-9: to zero
    (1.5 * S, 0x02),  # 2^-9 (M=1) | 2^-8 (M=2)
    (7.5 * S, 0x08),  # the largest subnormal (M=7) | the smallest normal (M=0)
    (1.96875, 0x40),  # 1.875 (M=7) | 2.0: carries into the next binade
    (464.0, 0x7E),  # 448 (M=6) | 480 (would be M=7, the NaN code): 448, not an overflow
]


def test_hand_worked_codes_and_values():
    for v, c in HAND:
        assert int(e4m3_encode(v)) == c, v
        assert e4m3_decode(np.uint8(c)) == v and math.copysign(1, e4m3_decode(np.uint8(c))) == math.copysign(1, v)


def test_ties_round_to_even():
    vals, codes = zip(*TIES)
    np.testing.assert_array_equal(e4m3_encode(np.array(vals)), np.array(codes, np.uint8))


def test_near_ties_round_to_nearest():
    # 100 lies in [64, 128), step 8: 96 and 104 are the neighbours, 100 is their midpoint -> 96 (M=4, even)
    assert e4m3_round(100.0) == 96.0 and e4m3_round(100.5) == 104.0
    assert e4m3_round(1.07) == 1.125 and e4m3_round(1.06) == 1.0
    assert e4m3_round(0.51 * S) == S and e4m3_round(0.49 * S) == 0.0


def test_overflow_saturates_or_gives_nan():
    big = np.array([465.0, 1e6, np.inf, -500.0, -np.inf])
    np.testing.assert_array_equal(e4m3_encode(big), [0x7E, 0x7E, 0x7E, 0xFE, 0xFE])  # torch's cast, satfinite
    np.testing.assert_array_equal(e4m3_encode(big, saturate=False), [0x7F, 0x7F, 0x7F, 0xFF, 0xFF])
    assert np.isnan(e4m3_decode(e4m3_encode(big, saturate=False))).all()


def test_nan():
    assert int(e4m3_encode(np.nan)) & 0x7F == 0x7F
    assert np.isnan(e4m3_decode(np.array([0x7F, 0xFF], np.uint8))).all()
    assert np.isfinite(e4m3_decode(np.array([0x7E, 0xFE, 0x78], np.uint8))).all()  # E=15 M<7 are numbers


def test_every_code_round_trips():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)  # 254 numbers (+0 and -0)
    np.testing.assert_array_equal(e4m3_encode(e4m3_decode(codes)), codes)
    vals = e4m3_decode(codes)
    assert vals.max() == E4M3_MAX and vals.min() == -E4M3_MAX
    assert len(np.unique(vals[vals > 0])) == 126  # 7 subnormals + 15 binades x 8, less the NaN slot


def test_matches_torch_float8_e4m3fn(rng):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    codes = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(torch.from_numpy(codes).view(torch.float8_e4m3fn).double().numpy(),
                                  e4m3_decode(codes))
    # float32 inputs (torch casts through float32): random magnitudes over the whole range, every
    # value, every midpoint between neighbours, and overflow
    vals = np.unique(e4m3_decode(codes[(codes & 0x7F) != 0x7F]))
    x = np.concatenate([rng.standard_normal(20000) * 10.0 ** rng.uniform(-5, 3, 20000), vals,
                        (vals[1:] + vals[:-1]) / 2, [500.0, -1e5]]).astype(np.float32)
    want = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(e4m3_encode(x), want)


# ---------------------------------------------------------------------- block scales


def _within_half_step(dq, a, s, block):
    """|dq - a| <= half an e4m3 step: 2^-4 |a| for normal values, 2^-10 * scale below the normals."""
    s = np.repeat(np.repeat(s.astype(np.float64), block[0], -2), block[1], -1)[..., :a.shape[-2], :a.shape[-1]]
    assert np.all(np.abs(dq - a) <= 2.0**-4 * np.abs(a) + 2.0**-10 * s)


def _scale_and_codes(blk):
    """One block by the definition: float32 values, float32 divisions, then e4m3."""
    b32 = np.asarray(blk, np.float32)
    s = max(np.abs(b32).max(), np.float32(AMAX_FLOOR)) / np.float32(448)
    assert s.dtype == np.float32
    return s, e4m3_encode(b32 / s)


def _blocks(R, C, br, bc):
    for i in range(math.ceil(R / br)):
        for j in range(math.ceil(C / bc)):
            yield i, j, slice(i * br, (i + 1) * br), slice(j * bc, (j + 1) * bc)


@pytest.mark.parametrize("shape", [
    (128, 256),  # whole blocks only
    (300, 130),  # partial last blocks in both dimensions (300 = 2 x 128 + 44, 130 = 128 + 2)
    (2, 5, 7),  # a leading expert dimension; one partial block per expert
    (1, 1),  # one element
])
def test_weight_blocks_match_a_loop_over_blocks(shape, rng):
    w = rng.standard_normal(shape) * rng.uniform(0.01, 3)
    q, s = quantize_weight_blocks(w)
    *lead, R, C = shape
    assert q.dtype == np.uint8 and q.shape == w.shape
    assert s.dtype == np.float32 and s.shape == (*lead, math.ceil(R / 128), math.ceil(C / 128))
    w3, q3, s3 = w.reshape(-1, R, C), q.reshape(-1, R, C), s.reshape(-1, *s.shape[-2:])
    for e in range(w3.shape[0]):
        for i, j, rs, cs in _blocks(R, C, 128, 128):
            want_s, want_q = _scale_and_codes(w3[e, rs, cs])
            assert s3[e, i, j] == want_s
            np.testing.assert_array_equal(q3[e, rs, cs], want_q)
    _within_half_step(dequantize_weight_blocks(q, s), w, s, (128, 128))


def test_block_maximum_lands_on_448():
    w = np.array([[0.5, -2.0, 1.0], [0.25, 0.0, 1.5]])
    q, s = quantize_weight_blocks(w, block=(2, 2))  # blocks: cols 0-1 (amax 2), col 2 (amax 1.5)
    np.testing.assert_array_equal(s, np.array([[2 / 448, 1.5 / 448]], np.float32))
    assert int(q[0, 1]) == 0xFE and int(q[1, 2]) == 0x7E  # -2 -> -448, 1.5 -> 448
    np.testing.assert_allclose(dequantize_weight_blocks(q, s, block=(2, 2)), w, rtol=2**-4)


def test_zero_block_is_finite_and_zero():
    w = np.zeros((3, 200))
    w[0, 150] = 7.0  # the second column block holds one value; the first is all zero
    q, s = quantize_weight_blocks(w)
    assert s[0, 0] == np.float32(AMAX_FLOOR / 448) and np.all(q[:, :128] == 0)
    np.testing.assert_array_equal(dequantize_weight_blocks(q, s), w)


def test_dequantize_takes_codes_or_values():
    w = np.linspace(-3, 3, 40).reshape(5, 8)
    q, s = quantize_weight_blocks(w, block=(4, 4))
    np.testing.assert_array_equal(dequantize_weight_blocks(q, s, (4, 4)), dequantize_weight_blocks(e4m3_decode(q), s, (4, 4)))


@pytest.mark.parametrize("T, C, group", [
    (4, 256, 128),  # DeepSeek's groups, whole
    (3, 200, 128),  # H not a multiple of 128: a partial last group of 72
    (2, 7, 3),  # tiny groups, partial last one
])
def test_activation_groups_per_token(T, C, group, rng):
    x = rng.standard_normal((T, C)) * np.array([1e-3, 1, 50, 2][:T])[:, None]  # rows of different sizes
    x[0, :group] = 0.0  # an all-zero group
    q, s = quantize_activations(x, group)
    assert q.dtype == np.uint8 and s.dtype == np.float32 and s.shape == (T, math.ceil(C / group))
    for t in range(T):
        for j in range(s.shape[1]):
            cs = slice(j * group, (j + 1) * group)
            want_s, want_q = _scale_and_codes(x[t, cs])
            assert s[t, j] == want_s
            np.testing.assert_array_equal(q[t, cs], want_q)
    dq = dequantize_activations(q, s, group)
    np.testing.assert_array_equal(dq, fake_quantize_activations(x, group))
    _within_half_step(dq, x, s, (1, group))
    assert np.all(dq[0, :group] == 0.0)


def test_float32_quotient_decides_ties():
    """bf16 inputs land on e4m3 ties; the float32 quotient (as a GPU divides) is the one that counts.

    amax = 1.375 and a = 1.03125: exactly, 448 * a / amax = 336, halfway between 320 (M=2) and 352
    (M=3), so 320. In float32, s = 1.375 / 448 rounds and a / s rounds back to exactly 336.0: 320. A
    float64 quotient by the same s is 336.0000073: it would give 352."""
    q, s = quantize_activations(np.array([[1.375, 1.03125]]))
    assert s[0, 0] == np.float32(1.375) / np.float32(448)
    assert int(q[0, 1]) == 0x7A  # 320 = 1.25 * 2^8
    assert int(e4m3_encode(1.03125 / np.float64(s[0, 0]))) == 0x7B  # what float64 arithmetic would give


def test_quantization_is_idempotent(rng):
    """Quantizing dequantized values gives the same values: the FP8 layer's fixed point."""
    x = fake_quantize_activations(rng.standard_normal((5, 300)))
    np.testing.assert_array_equal(fake_quantize_activations(x), x)


# ---------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("call, match", [
    (lambda: e4m3_decode(np.array([1, 2], np.int32)), r"e4m3_decode takes uint8 codes, got dtype int32"),
    (lambda: e4m3_encode(np.array(["a"])), r"e4m3_encode takes a real array"),
    (lambda: quantize_weight_blocks(np.ones(5)), r"w must have at least 2 dimensions, got shape \[5\]"),
    (lambda: quantize_weight_blocks(np.array([[1.0, np.nan]])), r"w has a non-finite value nan at index \(0, 1\)"),
    (lambda: quantize_weight_blocks(np.ones((2, 2)), block=(0, 128)), r"block must be two positive integers"),
    (lambda: quantize_weight_blocks(np.ones((2, 2)), block=128), r"block must be two positive integers"),
    (lambda: quantize_activations(np.ones((2, 2)), group=0), r"group must be a positive integer, got 0"),
    (lambda: quantize_activations(np.ones((2, 2, 2))), r"x must have shape \[T, C\], got \[2, 2, 2\]"),
    (lambda: dequantize_weight_blocks(np.zeros((130, 4), np.uint8), np.ones((1, 1), np.float32)),
     r"scale_inv must have shape \[2, 1\] \(one scale per block\), got \[1, 1\]"),
    (lambda: dequantize_weight_blocks(np.full((2, 2), 0.3), np.ones((1, 1))),
     r"q must hold float8 e4m3 values .* got 0.3 at index \(0, 0\)"),
    (lambda: dequantize_weight_blocks(np.full((2, 2), 0x7F, np.uint8), np.ones((1, 1))),
     r"q holds the e4m3 NaN code 0x7f at index \(0, 0\)"),
    (lambda: dequantize_weight_blocks(np.zeros((2, 2), np.uint8), -np.ones((1, 1))),
     r"scale_inv \(shape \[1, 1\]\) must be finite and > 0, got -1.0 at index \(0, 0\)"),
    # a zero or NaN scale comes from no quantizer (AMAX_FLOOR keeps every scale > 0): a corrupt checkpoint
    (lambda: dequantize_weight_blocks(np.zeros((2, 2), np.uint8), np.zeros((1, 1))),
     r"scale_inv \(shape \[1, 1\]\) must be finite and > 0, got 0.0"),
    (lambda: dequantize_weight_blocks(np.zeros((2, 2), np.uint8), np.full((1, 1), np.nan)),
     r"scale_inv \(shape \[1, 1\]\) must be finite and > 0, got nan"),
    (lambda: dequantize_activations(np.zeros((2, 4), np.int16), np.ones((2, 1))),
     r"q must be uint8 e4m3 codes or float e4m3 values, got dtype int16"),
])
def test_bad_inputs_are_named(call, match):
    with pytest.raises(InputError, match=match):
        call()
