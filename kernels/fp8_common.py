"""The FP8 arithmetic every FP8 GEMM shares (fp8_gemm, fp8w_tma, fp8_act_tma, fp8_tma_tiles, the megakernel).

Shape legend: BM, BN, BK tile sizes, KB = 128 (reference.fp8: WEIGHT_BLOCK, ACT_GROUP).

FP8 activations are quantized as reference.fp8 defines it (per token, per 128 columns, float32
divisions, ties to even in integer ops: ``_e4m3_rne``); the weights' 128 x 128 block scales are
applied per K tile (``_fp8a_part``, ``_band_scale``). ``_e4m3_to`` converts e4m3 codes for
weight-only FP8.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..reference import fp8 as fp8_ref
from .grouped_gemm import _act_values
from .jit_keys import settle
from .megakernel_config import FP8_CONVERT_DEFAULT

E4M3_MAX = tl.constexpr(fp8_ref.E4M3_MAX)


AMAX_FLOOR = tl.constexpr(fp8_ref.AMAX_FLOOR)


@triton.jit
def _e4m3_rne(v):
    """fp32 -> the nearest e4m3 value (ties to even, saturating at +-448), still fp32."""
    v = tl.minimum(tl.maximum(v, -E4M3_MAX), E4M3_MAX)
    bits = v.to(tl.uint32, bitcast=True)
    sign = bits & 0x80000000
    mag = bits & 0x7FFFFFFF
    normal = (mag + 0x7FFFF + ((mag >> 20) & 1)) & 0xFFF00000
    a = mag.to(tl.float32, bitcast=True)
    sub = ((a + 24576.0) - 24576.0).to(tl.uint32, bitcast=True)
    r = tl.where(a < 0.015625, sub, normal) | sign
    return r.to(tl.float32, bitcast=True)


#: _e4m3_to's powers of two: moved bits read as the code times 2^-120 (bf16, fp32) or 2^-8 (fp16)
_BIAS_2_120 = tl.constexpr(2.0 ** 120)


_BIAS_2_8 = tl.constexpr(2.0 ** 8)


#: the bit moves both conversions share (four codes into two pairs of 16-bit lanes)
_E4M3X4_MOVES = """    prmt.b32 lo, $2, 0, 0x1404;
    prmt.b32 hi, $2, 0, 0x3424;
    and.b32 s, lo, 0x80008000;
    and.b32 m, lo, 0x7F007F00;
    shr.b32 m, m, SHIFT;
    or.b32 lo, m, s;
    and.b32 s, hi, 0x80008000;
    and.b32 m, hi, 0x7F007F00;
    shr.b32 m, m, SHIFT;
    or.b32 hi, m, s;
"""


#: inline PTX of CVT 2: four codes in $2 -> two pairs ($0: codes 0, 1; $1: codes 2, 3) of the target
_E4M3X4_PTX = """{
    .reg .b32 lo, hi, s, m, bias;
    mov.b32 bias, BIAS;
""" + _E4M3X4_MOVES + """    mul.rn.TYPE $0, lo, bias;
    mul.rn.TYPE $1, hi, bias;
}"""


_E4M3_BF16X4 = tl.constexpr(_E4M3X4_PTX.replace("BIAS", "0x7B807B80").replace("SHIFT", "4").replace("TYPE", "bf16x2"))


_E4M3_F16X4 = tl.constexpr(_E4M3X4_PTX.replace("BIAS", "0x5C005C00").replace("SHIFT", "1").replace("TYPE", "f16x2"))


@triton.jit
def _e4m3_to(w, dtype: tl.constexpr, CVT: tl.constexpr):
    """e4m3 codes w (float8e4nv) -> dtype (bf16, fp16 or fp32), exactly.

    CVT 0: Triton's cast. 1: bit moves in Triton integer ops. 2: the same in inline PTX (GPU; bf16 and
    fp16). NaN codes give +-480 (quantized weights have none)."""
    if CVT == 0:
        return w.to(dtype)
    elif CVT == 2 and dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(_E4M3_BF16X4, "=r,=r,r", [w.to(tl.uint8, bitcast=True)], dtype=tl.bfloat16,
                                         is_pure=True, pack=4)
    elif CVT == 2 and dtype == tl.float16:
        return tl.inline_asm_elementwise(_E4M3_F16X4, "=r,=r,r", [w.to(tl.uint8, bitcast=True)], dtype=tl.float16,
                                         is_pure=True, pack=4)
    else:
        u = w.to(tl.uint8, bitcast=True).to(tl.uint32)
        if dtype == tl.bfloat16:
            b = ((u & 0x7F) << 4) | ((u & 0x80) << 8)
            return b.to(tl.uint16).to(tl.bfloat16, bitcast=True) * _BIAS_2_120
        elif dtype == tl.float16:
            b = ((u & 0x7F) << 7) | ((u & 0x80) << 8)
            return b.to(tl.uint16).to(tl.float16, bitcast=True) * _BIAS_2_8
        else:
            b = ((u & 0x7F) << 20) | ((u & 0x80) << 24)
            return b.to(tl.float32, bitcast=True) * _BIAS_2_120


@triton.jit
def _quantize_groups(a):
    """a (BM, KB) fp32 -> (codes (BM, KB) float8e4nv, scale (BM,) fp32), reference.fp8's arithmetic."""
    amax = tl.max(tl.abs(a), axis=1)
    s = tl.math.div_rn(tl.maximum(amax, AMAX_FLOOR), tl.full(amax.shape, E4M3_MAX, tl.float32))
    q = _e4m3_rne(tl.math.div_rn(a, s[:, None]))
    return q.to(tl.float8e4nv), s


@triton.jit
def _fp8a_part(aq, b, sa, sw):
    """One K tile of FP8 activations: dot(aq, b) fp32 times row scales sa (BM,) and column scales sw (BN,)."""
    return tl.dot(aq, b) * sa[:, None] * sw[None, :]


@triton.jit
def _fp8_step(a, b, sa, sw, FP8_A: tl.constexpr, IEEE: tl.constexpr, CVT: tl.constexpr):
    """One K step's scaled product of rows a (BM, KB) and weight tile b (KB, BN)."""
    if FP8_A:
        return _fp8a_part(a, b, sa, sw)
    elif IEEE:
        return tl.dot(a, _e4m3_to(b, a.dtype, CVT), input_precision="ieee") * sw[None, :]
    else:
        return tl.dot(a, _e4m3_to(b, a.dtype, CVT)) * sw[None, :]


@triton.jit
def _gemm1_fp8_epilogue(acc_g, acc_u, rows, row_mask, e, pid_n, offs_n, offs_bn, N, bias_ptr, stride_be,
                        padded_pair_ptr, topk_w_ptr, out_ptr, outs_ptr, stride_ot, stride_os, alpha, limit,
                        ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, FP8_A: tl.constexpr):
    """FP8 GEMM 1's epilogue: biases, activation, then h (quantized into out / outs with FP8_A)."""
    h = _act_values(acc_g, acc_u, rows, row_mask, e, offs_bn, N, bias_ptr, stride_be, padded_pair_ptr, topk_w_ptr,
                    alpha, limit, ACT, HAS_BIAS, SCALE_INPUT and not FP8_A)
    col_mask = offs_n < N
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_ot + offs_n[None, :]
    if FP8_A:
        hq, hs = _quantize_groups(tl.where(col_mask[None, :], h, 0.0))
        tl.store(out_ptrs, hq, mask=row_mask[:, None] & col_mask[None, :])
        tl.store(outs_ptr + rows.to(tl.int64) * stride_os + pid_n, hs, mask=row_mask)
    else:
        tl.store(out_ptrs, h.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _band_scale(s_ptr, first, last, kb, stride_sn, KB: tl.constexpr, BLOCK_N: tl.constexpr):
    """The weight scales (BLOCK_N,) fp32 of rows first .. first + BLOCK_N - 1 of one matrix in its K
    block kb: s_ptr -> the matrix's scales (Rb, Cb) (row stride stride_sn), last = Rb - 1 (rows
    past it take the last block's scale). One uniform load per row block, picked per row."""
    j = (first % KB + tl.arange(0, BLOCK_N)) // KB  # each row's block, counted from first // KB
    b0 = first // KB
    s = tl.zeros([BLOCK_N], tl.float32) + tl.load(s_ptr + b0 * stride_sn + kb)
    for i in tl.static_range(1, (BLOCK_N + KB - 1) // KB + 1):
        s = tl.where(j >= i, tl.load(s_ptr + tl.minimum(b0 + i, last) * stride_sn + kb), s)
    return s


@triton.jit
def _gate_up_tma_step(w_desc, ws_e, row_g, first, kt, N, last, stride_wsn, KB: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """K step kt of a GEMM 1 tile with e4m3 weights through TMA: (gate tile, up tile, their scales)."""
    bg = w_desc.load([row_g, kt * BLOCK_K])
    bu = w_desc.load([row_g + N, kt * BLOCK_K])
    sg = _band_scale(ws_e, first, last, kt, stride_wsn, KB, BLOCK_N)
    su = _band_scale(ws_e, N + first, last, kt, stride_wsn, KB, BLOCK_N)
    return bg, bu, sg, su


#: ``_e4m3_to``'s CVT per convert name ("bits", "cast") on a GPU and under the interpreter
FP8_CONVERT = {"cast": (0, 0), "bits": (2, 1)}


def convert_code(name: str, gpu: bool, what: str = "FP8 conversion") -> int:
    """CVT for a conversion name of FP8_CONVERT (``gpu`` or the interpreter); an unknown name is an error."""
    if name not in FP8_CONVERT:
        raise ValueError(f"{what} must be one of {list(FP8_CONVERT)}, got {name!r}")
    return FP8_CONVERT[name][0 if gpu else 1]


def _multi_cvt(x, fp8_act: bool) -> int:
    """The multi-launch GEMMs' CVT: FP8_CONVERT_DEFAULT for weight-only FP8, 0 with FP8 activations."""
    return 0 if fp8_act else convert_code(FP8_CONVERT_DEFAULT, x.device.type == "cuda")


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
