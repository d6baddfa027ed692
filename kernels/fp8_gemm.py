"""The grouped GEMMs of the MoE layer with FP8 (e4m3) weights carrying 128 x 128 block scales.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, P_max padded rows,
KB = 128 (reference.fp8: WEIGHT_BLOCK, ACT_GROUP), Rb, Cb a weight's scale blocks (ceil(R / KB), ceil(C / KB)).

What they compute is reference.forward's FP8 layer. The block scales are applied in the fp32
accumulation, once per K tile: BLOCK_K == KB (plan.py's fp8_entry), so each K tile of a weight's
column lies in one scale block and

    weight-only (FP8_A=False):  acc += dot(a, w8.to(a's dtype)) * s_w[n]                 (a: x's dtype)
    FP8 activations (FP8_A):    acc += dot(a8, w8) * s_a[m] * s_w[n]                      (e4m3 x e4m3)

s_w[n] = scale_inv[e, n // KB, kt] per output column n (a column's own row block: GEMM 1's up rows
start at I, mid-block when KB does not divide I), s_a[m] the scale of row m's 128-column group kt.
The dot of e4m3 values is exact in fp32 under the interpreter and a tensor-core FP8 MMA on Hopper.

FP8 activations follow DeepSeek-V3's scheme (per token, per 128 columns), as the reference's
fake quantization does it: s = max(amax, 1e-4) / 448 and q = e4m3(a / s), both IEEE float32
divisions (tl.math.div_rn), q rounded to nearest-even with integer operations (``_e4m3_rne``: the
interpreter's float8 cast does not round ties to even; the exact value then casts exactly anywhere).
    x is quantized once (``_quantize_x_kernel``, the same ``_quantize_groups``: codes (T, H) e4m3 and
    scales (T, ceil(H / KB)) fp32) and GEMM 1 gathers those codes and scales by pointer (XQ), the codes
    bit for bit what its K loop would compute; for Llama 4 (SCALE_INPUT: the routing weight scales
    each pair's row before it is quantized, as the reference) GEMM 1 quantizes its x rows in each K
    tile as it loads them instead. GEMM 1 quantizes h in its epilogue from the fp32
    values (BLOCK_N == KB: a tile holds whole 128-column groups of h): act codes (P_max, I) e4m3
    and act scales (P_max, ceil(I / KB)) fp32.
    GEMM 2 reads those codes and scales.
Without FP8 activations the activation is stored in x's dtype as the bf16 path does.

Program order, row blocks, padding, epilogues and the pair buffer are grouped_gemm.py's (shared
helpers); no split-K in GEMM 1 (its epilogue quantizes whole rows), GEMM 2 splits on K tiles.
The tiles come from plan.fp8_entry (the one place they are sized); the launchers refuse others.

On the GPU (benchmarks/compile_report.py --gemm ... --fp8 ...; figures of Triton 3.9 for sm_90):
with FP8 activations and 64-row tiles the products are FP8 wgmma (e4m3 x e4m3); at 16-row
(decode) tiles Triton uses mma.sync on operands converted to fp16, and weight-only FP8 converts the
weights to bf16 in registers (bf16 wgmma): both still read half the weight bytes.

(Their successor at prefill, fp8_act_tma.py's persistent GEMMs, on by default (env MEGAMOE_FP8A_TMA=0: off), plan.FP8A_TMA_PREFILL,
take precedence over the next two where on: gemm*_fp8_launch hands configs with "FP8A" to them.)
Variant "tma_persistent" (FP8 activations at prefill; OFF unless plan.FP8_TMA_PREFILL, env MEGAMOE_FP8_TMA=1;
unmeasured on the GPU): _gemm1_fp8_tma_kernel / _gemm2_fp8_tma_kernel, one program per SM walking the
routed tiles in grouped_gemm._gemm1_tma_kernel's order (its _routed_blocks / _routed_tile). GEMM 1:
e4m3 gate and up tiles (BLOCK_N, KB) through a TMA descriptor over gate_up as (E*2N, H), x rows
gathered by pointers and quantized per K tile (_quantize_groups), the weight scales of a band by
two uniform loads per K step; GEMM 2: e4m3 act rows and down tiles both through descriptors, the
scales by pointer. The same sums as the pointer kernels (_fp8a_part) and their epilogues
(_gemm1_fp8_epilogue, grouped_gemm._gemm2_epilogue); e4m3 rows need 16-byte strides (H, I % 16 == 0).
Triton 3.6, sm_90 (compile_report.py --gemm current --fp8 weights+act with MEGAMOE_FP8_TMA=1;
qwen3-30b-a3b:4096 and deepseek-v3:4096 alike): GEMM 1 64x128x128, 8 warps, 4 stages, reading x's
codes (XQ): 244 registers, no spills, K loop of 8 QGMMA (e4m3 wgmma) + 2 TMA loads, 305 SASS
instructions per K step (quantizing x in the loop, as before XQ: 255 registers, ~1480, a correctly
rounded division per element, 32 a thread; each wgmma is waited for at once, pendings = 0); at
BLOCK_M 128 the K loop still spills with XQ (16 LDL/STL per K step, 648 instructions; 129 without).
GEMM 2 64x256x128: 227 registers, no spills, 4 QGMMA + 2 TMA loads, 246 instructions. The pointer
GEMM 1 (same tile): with XQ 255 registers, no spills, 371 instructions per K step (without: 1547,
48 LDL/STL, 248 stack bytes).

Variant "tma_persistent", weight-only (prefill; ON by default, plan.FP8W_TMA_PREFILL, env MEGAMOE_FP8W_TMA=0
turns it off; H200 runs AM-AP in NOTES-gpu-runs.md): _gemm1_fp8w_tma_kernel / _gemm2_fp8w_tma_kernel, the bf16 persistent GEMMs'
walk, gathers and epilogues (grouped_gemm's helpers) with e4m3 weight tiles through TMA descriptors
(half the bytes) and, instead of scaling each K tile's product, the block scale folded into the
weights before the dot:
    acc += dot(a, w) with w[n, k] = code[n, k] x s_w[n] rounded to a's dtype (``_e4m3_folded``)
within a K tile (BLOCK_K divides KB) the scale depends only on the row block of the weight row n,
so one accumulator per output (GEMM 1: gate and up, two) as the bf16 GEMMs, and 128-row tiles fit.
SWAP_AB (plan.FP8W_TMA_SWAP_AB, on): the MMA computes acc^T = w @ a^T with the folded weights as
wgmma's A operand in registers (converted to its layout through shared memory), so the MMAs stay
asynchronous under the next K step's conversion; off, they are the B operand, stored to shared
memory, and every K step waits for its wgmma (pendings 0) before converting the next.
Triton 3.6, sm_90 (compile_report.py qwen3-30b-a3b:4096 deepseek-v3:4096 --gemm current --fp8 weights
with MEGAMOE_FP8W_TMA=1; both presets alike): GEMM 1 128x128x64, 8 warps, 4 stages: 255 registers, no
spills, 123 KB shared, K loop of 8 HGMMA (register A, up to 7 pending) + 2 TMA loads, 441 SASS
instructions per 64-deep K step (conversion 32 PRMT + 67 LOP3 + 32 HMUL2 + 32 HFMA2; 8 STS + 8 LDSM
of the layout change, 11 BAR.SYNC); GEMM 2 128x128x64, 3 stages: 220 registers, no spills, 4 HGMMA
+ 2 TMA loads, 260 instructions. Not swapped: GEMM 1 255 registers, 396 instructions, 5 BAR.SYNC;
GEMM 2 at 128x256x64 254 registers, 335; at 256 columns the swapped GEMM 2 spills (16 STL). The
pointer GEMMs they replace (same report, the GPU's conversion): GEMM 1 64x128x128 255 registers, 13
STL / 12 LDL, 695 instructions per 128-deep K step (32 LDG of scales, 64 FFMA of the scaling, wgmma
waited at once); GEMM 2 64x256x128 240 registers, 570. The bf16 TMA GEMM 1: 129 per 64-deep step.

Weight-only decode options (the megakernel's config keys "fp8_convert", default configs.FP8_CONVERT_DEFAULT
= bit moves in both backends, and "fp8_scale_prefetch", off; benchmarks/megakernel_variants.py FP8_VARIANTS):
    CVT, e4m3 -> x's dtype (``_e4m3_to``): 0 Triton's cast, on sm_90 cvt.rn.f16x2.e4m3x2 and two
        scalar cvt.bf16.f16 per pair of codes (SASS F2FP.F16.E4M3.UNPACK_B + 2 F2F.BF16.F16 on the
        conversion pipe: 192 per thread per K step of a 16 x 64 GEMM 1 tile); 1 bit moves in Triton
        integer ops; 2 the same bit moves in inline PTX, two codes per 32-bit lane (GPU only).
    PF: the weight scales of K step kt + 1 loaded during step kt (otherwise the load and its use
        sit in one iteration: a global load's latency per K step, with one warp per scheduler).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..reference import fp8 as fp8_ref
from ..reference.sizes import FP8_BLOCK
from .grouped_gemm import (
    _act_epilogue,
    _act_values,
    _descriptor,
    _gemm1_tile_start,
    _gemm2_epilogue,
    _gemm2_tile_start,
    _ieee,
    _mma,
    _program_tile,
    _routed_blocks,
    _routed_tile,
    device_sms,
)
from .megakernel_config import FP8_CONVERT_DEFAULT
from .plan import gemm_grid

E4M3_MAX = tl.constexpr(fp8_ref.E4M3_MAX)
AMAX_FLOOR = tl.constexpr(fp8_ref.AMAX_FLOOR)


@triton.jit
def _e4m3_rne(v):
    """fp32 -> the nearest e4m3 value (ties to even, saturating at +-448), still fp32, exactly
    representable in float8e4nv. Normals keep 3 of float32's 23 mantissa bits (integer round half
    to even on the bits); below 2^-6 the quantum is 2^-9, rounded by adding and removing 1.5 * 2^14."""
    v = tl.minimum(tl.maximum(v, -E4M3_MAX), E4M3_MAX)
    bits = v.to(tl.uint32, bitcast=True)
    sign = bits & 0x80000000
    mag = bits & 0x7FFFFFFF
    normal = (mag + 0x7FFFF + ((mag >> 20) & 1)) & 0xFFF00000
    a = mag.to(tl.float32, bitcast=True)
    sub = ((a + 24576.0) - 24576.0).to(tl.uint32, bitcast=True)
    r = tl.where(a < 0.015625, sub, normal) | sign
    return r.to(tl.float32, bitcast=True)


#: _e4m3_to's powers of two: a code's 7 magnitude bits moved into bf16's (or fp32's) exponent and
#: mantissa fields read as the code times 2^-120 (exponent bias 127 = 7 + 120), into fp16's as 2^-8 (15 = 7 + 8)
_BIAS_2_120 = tl.constexpr(2.0 ** 120)
_BIAS_2_8 = tl.constexpr(2.0 ** 8)
#: the bit moves both conversions share: four e4m3 codes in $2 into two pairs (lo, hi) of 16-bit lanes,
#: each code at the high byte of its lane (prmt), its magnitude shifted down by SHIFT, its sign kept
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
#: inline PTX of CVT 2: four codes in $2 -> two pairs ($0: codes 0, 1; $1: codes 2, 3) of the target;
#: each code moved to the high byte of a 16-bit lane (prmt), its magnitude shifted down into place
#: (bf16: 4 bits, fp16: 1), its sign kept, then one exact multiply by the bias power of two
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

    CVT 0: Triton's cast. 1: bit moves in Triton integer ops. 2: the same in inline PTX (GPU; bf16
    and fp16, fp32 takes 1). The code's sign goes to the sign bit and its 7 magnitude bits to the
    target's exponent and mantissa fields (bf16 bits 4..10, fp16 7..13, fp32 20..26): that value
    is the code times 2^-120 (bf16, fp32) or 2^-8 (fp16), a normal or a subnormal of the target,
    and one multiply by the power of two, exact in the target, gives the code for every finite
    code, subnormals included (the NaN codes 0x7F and 0xFF give +-480: quantized weights have none)."""
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
    """a (BM, KB) fp32 -> (codes (BM, KB) float8e4nv, scale (BM,) fp32): one group per row,
    scale = max(amax, 1e-4) / 448, codes = e4m3(a / scale) (reference.fp8's arithmetic)."""
    amax = tl.max(tl.abs(a), axis=1)
    s = tl.math.div_rn(tl.maximum(amax, AMAX_FLOOR), tl.full(amax.shape, E4M3_MAX, tl.float32))
    q = _e4m3_rne(tl.math.div_rn(a, s[:, None]))
    return q.to(tl.float8e4nv), s


@triton.jit(do_not_specialize=["T"])
def _quantize_x_kernel(x_ptr, q_ptr, s_ptr, T, H, stride_xt, stride_qt, stride_st, KB: tl.constexpr,
                       BLOCK_T: tl.constexpr):
    """x (T, H) -> codes q (T, H) e4m3 and scales s (T, ceil(H / KB)) fp32, per token per KB columns
    (_quantize_groups, the arithmetic GEMM 1's K loop applies to its x rows): program (i, g) takes
    tokens [i * BLOCK_T, (i + 1) * BLOCK_T) x group g; columns past H count as 0 (as the K loop's
    masked tail), rows past T are neither read nor written."""
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_k = tl.program_id(1) * KB + tl.arange(0, KB)
    t_mask = offs_t < T
    mask = t_mask[:, None] & (offs_k < H)[None, :]
    t64 = offs_t.to(tl.int64)
    a = tl.load(x_ptr + t64[:, None] * stride_xt + offs_k[None, :], mask=mask, other=0.0)
    q, sc = _quantize_groups(a.to(tl.float32))
    tl.store(q_ptr + t64[:, None] * stride_qt + offs_k[None, :], q, mask=mask)
    tl.store(s_ptr + t64 * stride_st + tl.program_id(1), sc, mask=t_mask)


@triton.jit
def _fp8a_part(aq, b, sa, sw):
    """One K tile of FP8 activations: dot(aq, b) of e4m3 (BM, KB) x (KB, BN), fp32, times the row
    scales sa (BM,) and the column scales sw (BN,): what every FP8-activation GEMM adds to its sum."""
    return tl.dot(aq, b) * sa[:, None] * sw[None, :]


@triton.jit
def _gemm1_fp8_epilogue(acc_g, acc_u, rows, row_mask, e, pid_n, offs_n, offs_bn, N, bias_ptr, stride_be,
                        padded_pair_ptr, topk_w_ptr, out_ptr, outs_ptr, stride_ot, stride_os, alpha, limit,
                        ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, FP8_A: tl.constexpr):
    """FP8 GEMM 1's epilogue (every FP8 GEMM 1 tile's): biases and activation (_act_values), then h
    quantized into out (codes) and outs (scales, column pid_n) with FP8_A, else h in out's dtype."""
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
def _gemm1_fp8_tile(
    x_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
    pid_m, pid_n, e, T, N, KD, stride_xt, stride_we, stride_wn, stride_wse, stride_wsn, stride_be, stride_ot,
    stride_os, alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    FP8_A: tl.constexpr, IEEE: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CVT: tl.constexpr, PF: tl.constexpr,
):
    """One GEMM 1 tile (row block pid_m of expert e, N tile pid_n) with e4m3 weights w (E, 2N, KD)
    and their scales ws (E, ceil(2N / KB), ceil(KD / KB)); BLOCK_K == KB. FP8_A: x rows quantized
    per K tile, h quantized into out (codes) and outs (scales, column pid_n); BLOCK_N == KB.
    CVT: how weight-only FP8 converts the codes (``_e4m3_to``); PF: scales loaded a K step ahead.
    (The megakernel's tile: _gemm1_fp8_xq_tile with XQ off.)"""
    _gemm1_fp8_xq_tile(x_ptr, x_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr,
                       topk_w_ptr, pid_m, pid_n, e, T, N, KD, stride_xt, 0, stride_we, stride_wn, stride_wse,
                       stride_wsn, stride_be, stride_ot, stride_os, alpha, limit, ACT, HAS_BIAS, SCALE_INPUT, DENSE,
                       FP8_A, False, IEEE, KB, BLOCK_M, BLOCK_N, BLOCK_K, CVT, PF)


@triton.jit
def _gemm1_fp8_xq_tile(
    x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
    pid_m, pid_n, e, T, N, KD, stride_xt, stride_xs, stride_we, stride_wn, stride_wse, stride_wsn, stride_be,
    stride_ot, stride_os, alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    FP8_A: tl.constexpr, XQ: tl.constexpr, IEEE: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CVT: tl.constexpr, PF: tl.constexpr,
):
    """_gemm1_fp8_tile's work; XQ (with FP8_A, not SCALE_INPUT): x_ptr holds x's e4m3 codes (T, KD)
    and xs_ptr their scales (T, ceil(KD / KB)), as _quantize_x_kernel writes them (the codes the
    K loop would compute), loaded instead of quantizing x in every K step."""
    rows, tok, row_mask, offs_n, offs_bn, offs_k, a_ptrs = _gemm1_tile_start(
        x_ptr, padded_token_ptr, pid_m, pid_n, 0, T, N, stride_xt, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    xs_ptrs = xs_ptr + tok.to(tl.int64) * stride_xs
    wg_ptrs = w_ptr + e.to(tl.int64) * stride_we + offs_bn[None, :] * stride_wn + offs_k[:, None]
    wu_ptrs = wg_ptrs + N * stride_wn
    sg_ptrs = ws_ptr + e.to(tl.int64) * stride_wse + (offs_bn // KB) * stride_wsn
    su_ptrs = ws_ptr + e.to(tl.int64) * stride_wse + ((offs_bn + N) // KB) * stride_wsn
    if FP8_A and SCALE_INPUT:  # Llama 4: the routing weight scales the row before it is quantized
        pair = tl.load(padded_pair_ptr + rows)
        in_sc = tl.load(topk_w_ptr + pair, mask=row_mask, other=0.0)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    nk = tl.cdiv(KD, BLOCK_K)
    if PF:
        sg_next = tl.load(sg_ptrs)
        su_next = tl.load(su_ptrs)
    for kt in range(0, nk):
        k_mask = offs_k < KD - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        bg = tl.load(wg_ptrs, mask=k_mask[:, None], other=0.0)
        bu = tl.load(wu_ptrs, mask=k_mask[:, None], other=0.0)
        if PF:  # this step's scales came one step ago; the next step's load overlaps this one
            sg = sg_next
            su = su_next
            sg_next = tl.load(sg_ptrs + tl.minimum(kt + 1, nk - 1))
            su_next = tl.load(su_ptrs + tl.minimum(kt + 1, nk - 1))
        else:
            sg = tl.load(sg_ptrs + kt)
            su = tl.load(su_ptrs + kt)
        if FP8_A and XQ:
            sa = tl.load(xs_ptrs + kt, mask=row_mask, other=0.0)
            acc_g += _fp8a_part(a, bg, sa, sg)
            acc_u += _fp8a_part(a, bu, sa, su)
        elif FP8_A:
            a32 = a.to(tl.float32)
            if SCALE_INPUT:
                a32 = a32 * in_sc[:, None]
            aq, sa = _quantize_groups(a32)
            acc_g += _fp8a_part(aq, bg, sa, sg)
            acc_u += _fp8a_part(aq, bu, sa, su)
        elif IEEE:
            acc_g += tl.dot(a, _e4m3_to(bg, a.dtype, CVT), input_precision="ieee") * sg[None, :]
            acc_u += tl.dot(a, _e4m3_to(bu, a.dtype, CVT), input_precision="ieee") * su[None, :]
        else:
            acc_g += tl.dot(a, _e4m3_to(bg, a.dtype, CVT)) * sg[None, :]
            acc_u += tl.dot(a, _e4m3_to(bu, a.dtype, CVT)) * su[None, :]
        a_ptrs += BLOCK_K
        wg_ptrs += BLOCK_K
        wu_ptrs += BLOCK_K
    _gemm1_fp8_epilogue(acc_g, acc_u, rows, row_mask, e, pid_n, offs_n, offs_bn, N, bias_ptr, stride_be,
                        padded_pair_ptr, topk_w_ptr, out_ptr, outs_ptr, stride_ot, stride_os, alpha, limit,
                        ACT, HAS_BIAS, SCALE_INPUT, FP8_A)


@triton.jit(do_not_specialize=["T", "num_m"])
def _gemm1_fp8_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr, block_expert_ptr,
    topk_w_ptr, T, N, KD, num_m, stride_xt, stride_xs, stride_we, stride_wn, stride_wse, stride_wsn, stride_be,
    stride_ot, stride_os, alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    FP8_A: tl.constexpr, XQ: tl.constexpr, IEEE: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, CVT: tl.constexpr,
):
    pid_m, pid_n, e, _s, _lo, _hi = _program_tile(tl.program_id(0), num_m, N, KD, block_expert_ptr, DENSE, 1,
                                                  BLOCK_N, BLOCK_K, GROUP_M)
    if e < 0:
        return
    _gemm1_fp8_xq_tile(x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr,
                       topk_w_ptr, pid_m, pid_n, e, T, N, KD, stride_xt, stride_xs, stride_we, stride_wn, stride_wse,
                       stride_wsn, stride_be, stride_ot, stride_os, alpha, limit, ACT, HAS_BIAS, SCALE_INPUT, DENSE,
                       FP8_A, XQ, IEEE, KB, BLOCK_M, BLOCK_N, BLOCK_K, CVT, False)


@triton.jit
def _gemm2_fp8_tile(
    a_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
    pid_m, pid_n, e, s, k_lo, k_hi, T, N, KD, stride_at, stride_as, stride_we, stride_wn, stride_wse, stride_wsn,
    stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr,
    FP8_A: tl.constexpr, IEEE: tl.constexpr, SPLIT_K: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CVT: tl.constexpr, PF: tl.constexpr,
):
    """One GEMM 2 tile with e4m3 weights w (E, N, KD) and scales ws (E, ceil(N / KB), ceil(KD / KB));
    K tiles [k_lo, k_hi) of BLOCK_K == KB. FP8_A: a holds e4m3 codes, as (rows, ceil(KD / KB)) their scales.
    CVT, PF as _gemm1_fp8_tile's."""
    row_mask, tok, slot, srow, offs_n, offs_bn, offs_k, a_row, a_ptrs, _, _ = _gemm2_tile_start(
        a_ptr, padded_pair_ptr, pid_m, pid_n, e, k_lo * BLOCK_K, T, N, stride_at, K, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    w_ptrs = w_ptr + e.to(tl.int64) * stride_we + offs_bn[None, :] * stride_wn + (k_lo * BLOCK_K + offs_k)[:, None]
    sw_ptrs = ws_ptr + e.to(tl.int64) * stride_wse + (offs_bn // KB) * stride_wsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    last = tl.cdiv(KD, BLOCK_K) - 1
    if PF:
        sw_next = tl.load(sw_ptrs + tl.minimum(k_lo, last))
        if FP8_A:
            sa_next = tl.load(as_ptr + a_row * stride_as + tl.minimum(k_lo, last), mask=row_mask, other=0.0)
    for kt in range(k_lo, k_hi):
        k_mask = offs_k < KD - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_mask[:, None], other=0.0)
        if PF:  # as GEMM 1's: the next step's scales load during this step
            sw = sw_next
            sw_next = tl.load(sw_ptrs + tl.minimum(kt + 1, last))
        else:
            sw = tl.load(sw_ptrs + kt)
        if FP8_A:
            if PF:
                sa = sa_next
                sa_next = tl.load(as_ptr + a_row * stride_as + tl.minimum(kt + 1, last), mask=row_mask, other=0.0)
            else:
                sa = tl.load(as_ptr + a_row * stride_as + kt, mask=row_mask, other=0.0)
            acc += _fp8a_part(a, b, sa, sw)
        elif IEEE:
            acc += tl.dot(a, _e4m3_to(b, a.dtype, CVT), input_precision="ieee") * sw[None, :]
        else:
            acc += tl.dot(a, _e4m3_to(b, a.dtype, CVT)) * sw[None, :]
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    _gemm2_epilogue(acc, row_mask, tok, slot, srow, e, s, offs_n, offs_bn, T, N, bias_ptr, stride_be, scale_ptr,
                    out_ptr, stride_ot, KS, HAS_BIAS, HAS_SCALE, ATOMIC, SPLIT_K)


@triton.jit(do_not_specialize=["T", "num_m"])
def _gemm2_fp8_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, block_expert_ptr, scale_ptr,
    T, N, KD, num_m, stride_at, stride_as, stride_we, stride_wn, stride_wse, stride_wsn, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr,
    FP8_A: tl.constexpr, IEEE: tl.constexpr, SPLIT_K: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, CVT: tl.constexpr,
):
    pid_m, pid_n, e, s, k_lo, k_hi = _program_tile(tl.program_id(0), num_m, N, KD, block_expert_ptr, DENSE,
                                                   SPLIT_K, BLOCK_N, BLOCK_K, GROUP_M)
    if e < 0:
        return
    _gemm2_fp8_tile(a_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
                    pid_m, pid_n, e, s, k_lo, k_hi, T, N, KD, stride_at, stride_as, stride_we, stride_wn, stride_wse,
                    stride_wsn, stride_be, stride_ot, K, KS, HAS_BIAS, HAS_SCALE, DENSE, ATOMIC, FP8_A, IEEE,
                    SPLIT_K, KB, BLOCK_M, BLOCK_N, BLOCK_K, CVT, False)


# --------------------------------------------------------------------------- variant "tma_persistent"
@triton.jit
def _band_scale(s_ptr, first, last, kb, stride_sn, KB: tl.constexpr, BLOCK_N: tl.constexpr):
    """The weight scales (BLOCK_N,) fp32 of rows first .. first + BLOCK_N - 1 of one matrix in its K
    block kb: s_ptr -> the matrix's scales (Rb, Cb) (row stride stride_sn, unit column stride), last
    = Rb - 1. The band lies in at most cdiv(BLOCK_N, KB) + 1 row blocks from first // KB (clamped
    to last: rows past the matrix, which the epilogues mask, take the last block's scale): one
    uniform load each, picked per row (a per-row gather would load BLOCK_N addresses a K step)."""
    j = (first % KB + tl.arange(0, BLOCK_N)) // KB  # each row's block, counted from first // KB
    b0 = first // KB
    s = tl.zeros([BLOCK_N], tl.float32) + tl.load(s_ptr + b0 * stride_sn + kb)
    for i in tl.static_range(1, (BLOCK_N + KB - 1) // KB + 1):
        s = tl.where(j >= i, tl.load(s_ptr + tl.minimum(b0 + i, last) * stride_sn + kb), s)
    return s


@triton.jit
def _gate_up_tma_step(w_desc, ws_e, row_g, first, kt, N, last, stride_wsn, KB: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """K step kt of a GEMM 1 tile with e4m3 weights through TMA: (gate tile, up tile, their scales): the
    (BLOCK_N, BLOCK_K) boxes of w_desc (gate_up as (E*2N, KD)) at rows row_g and row_g + N, and the
    per-row scales of the bands from weight rows first and N + first (_band_scale; ws_e: the expert's
    scales, last: its last scale block row)."""
    bg = w_desc.load([row_g, kt * BLOCK_K])
    bu = w_desc.load([row_g + N, kt * BLOCK_K])
    sg = _band_scale(ws_e, first, last, kt, stride_wsn, KB, BLOCK_N)
    su = _band_scale(ws_e, N + first, last, kt, stride_wsn, KB, BLOCK_N)
    return bg, bu, sg, su


@triton.jit
def _gemm1_fp8_tma_tile(
    x_ptr, xs_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
    pid_m, pid_n, e, T, N, KD, stride_xt, stride_xs, stride_wse, stride_wsn, stride_be, stride_ot, stride_os, alpha,
    limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr, XQ: tl.constexpr,
    KB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One GEMM 1 tile with FP8 activations as _gemm1_fp8_tile computes it (FP8_A): the e4m3 gate
    and up weight tiles (BLOCK_N, KB) through the TMA descriptor w_desc over gate_up as (E*2N, KD)
    (zero past KD; columns past N read the next rows, and the epilogue masks them), x rows gathered
    by pointers and quantized per K tile (XQ: x_ptr / xs_ptr hold x's codes and scales, as
    _gemm1_fp8_xq_tile's, gathered by pointers instead); BLOCK_K == BLOCK_N == KB."""
    rows, tok, row_mask, offs_n, offs_bn, offs_k, a_ptrs = _gemm1_tile_start(
        x_ptr, padded_token_ptr, pid_m, pid_n, 0, T, N, stride_xt, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    xs_ptrs = xs_ptr + tok.to(tl.int64) * stride_xs
    row_g = e * (2 * N) + pid_n * BLOCK_N
    # the weight scales of the gate and up bands (_band_scale: uniform loads, the same values as
    # _gemm1_fp8_tile's per-column loads in every column < N; the epilogue masks the rest)
    ws_e = ws_ptr + e.to(tl.int64) * stride_wse
    last = tl.cdiv(2 * N, KB) - 1
    if SCALE_INPUT:  # Llama 4: the routing weight scales the row before it is quantized
        pair = tl.load(padded_pair_ptr + rows)
        in_sc = tl.load(topk_w_ptr + pair, mask=row_mask, other=0.0)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k < KD - kt * BLOCK_K)[None, :], other=0.0)
        bg, bu, sg, su = _gate_up_tma_step(w_desc, ws_e, row_g, pid_n * BLOCK_N, kt, N, last, stride_wsn, KB,
                                           BLOCK_N, BLOCK_K)
        if XQ:
            aq = a
            sa = tl.load(xs_ptrs + kt, mask=row_mask, other=0.0)
        else:
            a32 = a.to(tl.float32)
            if SCALE_INPUT:
                a32 = a32 * in_sc[:, None]
            aq, sa = _quantize_groups(a32)
        acc_g += _fp8a_part(aq, bg.T, sa, sg)
        acc_u += _fp8a_part(aq, bu.T, sa, su)
        a_ptrs += BLOCK_K
    _gemm1_fp8_epilogue(acc_g, acc_u, rows, row_mask, e, pid_n, offs_n, offs_bn, N, bias_ptr, stride_be,
                        padded_pair_ptr, topk_w_ptr, out_ptr, outs_ptr, stride_ot, stride_os, alpha, limit,
                        ACT, HAS_BIAS, SCALE_INPUT, True)


@triton.jit(do_not_specialize=["T", "E"])
def _gemm1_fp8_tma_kernel(
    x_ptr, xs_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr, block_expert_ptr,
    padded_off_ptr, topk_w_ptr, T, N, KD, E, stride_xt, stride_xs, stride_wse, stride_wsn, stride_be, stride_ot,
    stride_os, alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr, XQ: tl.constexpr,
    KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    """Persistent FP8 GEMM 1 (FP8 activations): program p walks tiles p, p + programs, ... of the
    routed row blocks x N tiles in grouped_gemm._gemm1_tma_kernel's order."""
    num_m = _routed_blocks(padded_off_ptr, T, E, DENSE, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), num_m * num_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n, e = _routed_tile(t, num_m, num_n, block_expert_ptr, DENSE, GROUP_M)
        _gemm1_fp8_tma_tile(x_ptr, xs_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr,
                            padded_pair_ptr, topk_w_ptr, pid_m, pid_n, e, T, N, KD, stride_xt, stride_xs, stride_wse,
                            stride_wsn, stride_be, stride_ot, stride_os, alpha, limit, ACT, HAS_BIAS, SCALE_INPUT,
                            DENSE, XQ, KB, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _gemm2_fp8_tma_tile(
    a_desc, as_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
    pid_m, pid_n, e, T, N, KD, stride_as, stride_wse, stride_wsn, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One GEMM 2 tile with FP8 activations as _gemm2_fp8_tile computes it (no split-K): the e4m3
    activation rows (contiguous in padded order) through a_desc over (rows, KD), the e4m3 down
    weights through w_desc over (E*N, KD), zero past KD and past the last row; the activation's
    and the weights' scales by pointer. Padding rows read whatever GEMM 1 left there (their scale
    loads are masked); they only reach masked output rows."""
    row_mask, tok, slot, srow, offs_n, offs_bn, _, a_row, _, row_a, row_w = _gemm2_tile_start(
        None, padded_pair_ptr, pid_m, pid_n, e, 0, T, N, 0, K, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    sa_ptrs = as_ptr + a_row * stride_as
    sw_ptrs = ws_ptr + e.to(tl.int64) * stride_wse + (offs_bn // KB) * stride_wsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        a = a_desc.load([row_a, kt * BLOCK_K])
        b = w_desc.load([row_w, kt * BLOCK_K])
        sa = tl.load(sa_ptrs + kt, mask=row_mask, other=0.0)
        sw = tl.load(sw_ptrs + kt)
        acc += _fp8a_part(a, b.T, sa, sw)
    _gemm2_epilogue(acc, row_mask, tok, slot, srow, e, pid_m * 0, offs_n, offs_bn, T, N, bias_ptr, stride_be,
                    scale_ptr, out_ptr, stride_ot, KS, HAS_BIAS, HAS_SCALE, ATOMIC, 1)


@triton.jit(do_not_specialize=["T", "E"])
def _gemm2_fp8_tma_kernel(
    a_desc, as_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, block_expert_ptr, padded_off_ptr, scale_ptr,
    T, N, KD, E, stride_as, stride_wse, stride_wsn, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    """Persistent FP8 GEMM 2 (FP8 activations), walking its tiles as _gemm1_fp8_tma_kernel does."""
    num_m = _routed_blocks(padded_off_ptr, T, E, DENSE, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), num_m * num_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n, e = _routed_tile(t, num_m, num_n, block_expert_ptr, DENSE, GROUP_M)
        _gemm2_fp8_tma_tile(a_desc, as_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
                            pid_m, pid_n, e, T, N, KD, stride_as, stride_wse, stride_wsn, stride_be, stride_ot,
                            K, KS, HAS_BIAS, HAS_SCALE, DENSE, ATOMIC, KB, BLOCK_M, BLOCK_N, BLOCK_K)


# --------------------------------------------------------------------------- variant "tma_persistent", weight-only
#: _e4m3_folded's inline PTX (CVT 2): four codes in $2 moved into two pairs of the target as _E4M3X4_PTX
#: does (code x 2^-BIAS, exact), then each pair times the fold factor f = s x 2^BIAS split in two values of
#: the target, hi ($3: codes 0, 1; $4: codes 2, 3) and lo ($5, $6): t = c * lo, out = fma(c, hi, t)
_E4M3X4_FOLD_PTX = """{
    .reg .b32 lo, hi, s, m, t;
""" + _E4M3X4_MOVES + """    mul.rn.TYPE t, lo, $5;
    fma.rn.TYPE $0, lo, $3, t;
    mul.rn.TYPE t, hi, $6;
    fma.rn.TYPE $1, hi, $4, t;
}"""
_E4M3_BF16X4_FOLD = tl.constexpr(_E4M3X4_FOLD_PTX.replace("SHIFT", "4").replace("TYPE", "bf16x2"))
_E4M3_F16X4_FOLD = tl.constexpr(_E4M3X4_FOLD_PTX.replace("SHIFT", "1").replace("TYPE", "f16x2"))


@triton.jit
def _e4m3_folded(w, s, dtype: tl.constexpr, CVT: tl.constexpr):
    """e4m3 codes w (BN, BK) float8e4nv and their rows' block scales s (BN,) fp32 -> the weights
    code x s (BN, BK) in dtype (bf16, fp16 or fp32): the block scale folded into the weight tile
    before the dot, so that a K tile adds dot(a, w) to ONE accumulator.

    Rounding (the one thing that differs from the pointer kernels, which scale the fp32 product):
    each weight code x s is rounded to dtype, once. CVT 0 / 1 (Triton's cast / bit moves, the
    interpreter's) round code x s to float32 (exact there but for its 28 bits: 4 significant bits
    times 24), then to dtype; CVT 2 (inline PTX, bf16 and fp16 on a GPU) moves the code's bits into
    the target (c = code x 2^-b exactly, b = 120 for bf16, 8 for fp16, as ``_e4m3_to``) and multiplies
    by f = s x 2^b split into hi = dtype(f) and lo = dtype(f - hi): fma(c, hi, c x lo), one rounding
    of code x s to within 2^-17 for bf16 (so the correctly rounded weight, bar ties that close; the
    scale is not rounded apart); for fp16 c x lo underflows for weights below ~0.125, where the
    scale is in effect rounded to fp16 first (11 bits): within one ulp of the correctly rounded weight.
    Range: f and code x s must be finite in dtype (fold_scale_max; the launchers check)."""
    if CVT == 2 and dtype == tl.bfloat16:
        hi, lo = _fold_factors(s * _BIAS_2_120, w.shape, dtype)
        return tl.inline_asm_elementwise(_E4M3_BF16X4_FOLD, "=r,=r,r,r,r,r,r", [w.to(tl.uint8, bitcast=True), hi, lo],
                                         dtype=tl.bfloat16, is_pure=True, pack=4)
    elif CVT == 2 and dtype == tl.float16:
        hi, lo = _fold_factors(s * _BIAS_2_8, w.shape, dtype)
        return tl.inline_asm_elementwise(_E4M3_F16X4_FOLD, "=r,=r,r,r,r,r,r", [w.to(tl.uint8, bitcast=True), hi, lo],
                                         dtype=tl.float16, is_pure=True, pack=4)
    else:
        return (_e4m3_to(w, tl.float32, CVT) * s[:, None]).to(dtype)


@triton.jit
def _fold_factors(f, shape: tl.constexpr, dtype: tl.constexpr):
    """Fold factors f (BN,) fp32 -> (hi, lo) in dtype, hi = dtype(f), lo = dtype(f - hi), broadcast
    along the rows of a (BN, BK) tile ``shape``."""
    hi = f.to(dtype)
    lo = (f - hi.to(tl.float32)).to(dtype)
    return tl.broadcast_to(hi[:, None], shape), tl.broadcast_to(lo[:, None], shape)


@triton.jit
def _fp8w_acc(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """A zero fp32 accumulator of the weight-only persistent tiles: (BLOCK_M, BLOCK_N), or (BLOCK_N,
    BLOCK_M) with SWAP_AB (the weights are the MMA's A operand, see _fp8w_mma)."""
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    return acc


@triton.jit
def _fp8w_mma(a, w, acc, IEEE: tl.constexpr, SWAP_AB: tl.constexpr):
    """acc + a @ w^T for rows a (BM, BK) and folded weights w (BN, BK) (grouped_gemm._mma); SWAP_AB:
    acc^T + w @ a^T instead, so that the weights converted in registers are wgmma's A operand, read
    from registers (asynchronous MMAs; not SWAP_AB, they are B, stored to shared memory for each
    wgmma, which then completes before the next K step's conversion overwrites them)."""
    if SWAP_AB:
        out = _mma(w, a.T, acc, IEEE)
    else:
        out = _mma(a, w.T, acc, IEEE)
    return out


@triton.jit
def _fp8w_sums(acc, SWAP_AB: tl.constexpr):
    """The (BM, BN) sums of a _fp8w_acc accumulator, for the shared epilogues."""
    if SWAP_AB:
        out = acc.T
    else:
        out = acc
    return out


@triton.jit
def _gemm1_fp8w_tma_tile(
    x_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
    pid_m, pid_n, e, T, N, KD, stride_xt, stride_wse, stride_wsn, stride_be, stride_ot, alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CVT: tl.constexpr, SWAP_AB: tl.constexpr,
):
    """One GEMM 1 tile with e4m3 weights and activations in x's dtype, as grouped_gemm._gemm1_tma_tile
    computes the bf16 one: x rows (BLOCK_M, BLOCK_K) gathered by pointers, the e4m3 gate and up
    tiles (BLOCK_N, BLOCK_K) through the TMA descriptor w_desc over gate_up as (E*2N, KD) (zero past
    KD; rows past N read the next rows, and the epilogue masks them), each with its rows' block
    scales of K block kt * BLOCK_K // KB folded in (_band_scale, _e4m3_folded; BLOCK_K divides KB),
    then acc_g += dot(x, wg^T), acc_u += dot(x, wu^T): two fp32 accumulators, as the bf16 tile's."""
    rows, tok, row_mask, offs_n, offs_bn, offs_k, a_ptrs = _gemm1_tile_start(
        x_ptr, padded_token_ptr, pid_m, pid_n, 0, T, N, stride_xt, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    row_g = e * (2 * N) + pid_n * BLOCK_N
    ws_e = ws_ptr + e.to(tl.int64) * stride_wse
    last = tl.cdiv(2 * N, KB) - 1
    acc_g = _fp8w_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    acc_u = _fp8w_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_mask[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k < KD - kt * BLOCK_K)[None, :], other=0.0)
        kb = kt * BLOCK_K // KB
        sg = _band_scale(ws_e, pid_n * BLOCK_N, last, kb, stride_wsn, KB, BLOCK_N)
        su = _band_scale(ws_e, N + pid_n * BLOCK_N, last, kb, stride_wsn, KB, BLOCK_N)
        bg = _e4m3_folded(w_desc.load([row_g, kt * BLOCK_K]), sg, a.dtype, CVT)
        bu = _e4m3_folded(w_desc.load([row_g + N, kt * BLOCK_K]), su, a.dtype, CVT)
        acc_g = _fp8w_mma(a, bg, acc_g, IEEE, SWAP_AB)
        acc_u = _fp8w_mma(a, bu, acc_u, IEEE, SWAP_AB)
        a_ptrs += BLOCK_K
    _act_epilogue(_fp8w_sums(acc_g, SWAP_AB), _fp8w_sums(acc_u, SWAP_AB), rows, row_mask, e, offs_n, offs_bn, N,
                  bias_ptr, stride_be, padded_pair_ptr, topk_w_ptr, out_ptr, stride_ot, alpha, limit, ACT, HAS_BIAS,
                  SCALE_INPUT)


@triton.jit(do_not_specialize=["T", "E"])
def _gemm1_fp8w_tma_kernel(
    x_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, padded_token_ptr, padded_pair_ptr, block_expert_ptr, padded_off_ptr,
    topk_w_ptr, T, N, KD, E, stride_xt, stride_wse, stride_wsn, stride_be, stride_ot, alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    EVEN_K: tl.constexpr, IEEE: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr, CVT: tl.constexpr, SWAP_AB: tl.constexpr,
):
    """Persistent weight-only FP8 GEMM 1: program p walks tiles p, p + programs, ... of the routed
    row blocks x N tiles in grouped_gemm._gemm1_tma_kernel's order."""
    num_m = _routed_blocks(padded_off_ptr, T, E, DENSE, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), num_m * num_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n, e = _routed_tile(t, num_m, num_n, block_expert_ptr, DENSE, GROUP_M)
        _gemm1_fp8w_tma_tile(x_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
                             pid_m, pid_n, e, T, N, KD, stride_xt, stride_wse, stride_wsn, stride_be, stride_ot,
                             alpha, limit, ACT, HAS_BIAS, SCALE_INPUT, DENSE, EVEN_K, IEEE, KB, BLOCK_M, BLOCK_N,
                             BLOCK_K, CVT, SWAP_AB)


@triton.jit
def _gemm2_fp8w_tma_tile(
    a_desc, w_desc, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
    pid_m, pid_n, e, T, N, KD, stride_wse, stride_wsn, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr,
    IEEE: tl.constexpr, KB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    CVT: tl.constexpr, SWAP_AB: tl.constexpr,
):
    """One GEMM 2 tile with e4m3 down weights, as grouped_gemm._gemm2_tma_tile computes the bf16 one:
    the activation rows (x's dtype, contiguous in padded order) through a_desc over (rows, KD), the
    e4m3 down tiles (BLOCK_N, BLOCK_K) through w_desc over down as (E*N, KD), their block scales
    folded in as GEMM 1's (_gemm1_fp8w_tma_tile); one fp32 accumulator. Padding rows read whatever
    GEMM 1 left there; they only reach masked output rows."""
    row_mask, tok, slot, srow, offs_n, offs_bn, _, _, _, row_a, row_w = _gemm2_tile_start(
        None, padded_pair_ptr, pid_m, pid_n, e, 0, T, N, 0, K, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    ws_e = ws_ptr + e.to(tl.int64) * stride_wse
    last = tl.cdiv(N, KB) - 1
    acc = _fp8w_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        a = a_desc.load([row_a, kt * BLOCK_K])
        sw = _band_scale(ws_e, pid_n * BLOCK_N, last, kt * BLOCK_K // KB, stride_wsn, KB, BLOCK_N)
        b = _e4m3_folded(w_desc.load([row_w, kt * BLOCK_K]), sw, a.dtype, CVT)
        acc = _fp8w_mma(a, b, acc, IEEE, SWAP_AB)
    _gemm2_epilogue(_fp8w_sums(acc, SWAP_AB), row_mask, tok, slot, srow, e, pid_m * 0, offs_n, offs_bn, T, N, bias_ptr, stride_be,
                    scale_ptr, out_ptr, stride_ot, KS, HAS_BIAS, HAS_SCALE, ATOMIC, 1)


@triton.jit(do_not_specialize=["T", "E"])
def _gemm2_fp8w_tma_kernel(
    a_desc, w_desc, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, block_expert_ptr, padded_off_ptr, scale_ptr,
    T, N, KD, E, stride_wse, stride_wsn, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr,
    IEEE: tl.constexpr, KB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, FLATTEN: tl.constexpr, CVT: tl.constexpr, SWAP_AB: tl.constexpr,
):
    """Persistent weight-only FP8 GEMM 2, walking its tiles as _gemm1_fp8w_tma_kernel does."""
    num_m = _routed_blocks(padded_off_ptr, T, E, DENSE, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), num_m * num_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n, e = _routed_tile(t, num_m, num_n, block_expert_ptr, DENSE, GROUP_M)
        _gemm2_fp8w_tma_tile(a_desc, w_desc, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
                             pid_m, pid_n, e, T, N, KD, stride_wse, stride_wsn, stride_be, stride_ot,
                             K, KS, HAS_BIAS, HAS_SCALE, DENSE, ATOMIC, IEEE, KB, BLOCK_M, BLOCK_N, BLOCK_K, CVT,
                             SWAP_AB)


# --------------------------------------------------------------------------- launchers
#: how weight-only FP8 converts e4m3 codes to x's dtype (``_e4m3_to``'s CVT) on a GPU and under the
#: interpreter: "bits" (inline PTX on a GPU; the same bit moves in Triton integer ops, which the
#: interpreter runs) or "cast" (Triton's cast). Both backends read it: the megakernel by its config
#: key "fp8_convert", the multi-launch GEMMs by configs.FP8_CONVERT_DEFAULT
FP8_CONVERT = {"cast": (0, 0), "bits": (2, 1)}


def convert_code(name: str, gpu: bool, what: str = "FP8 conversion") -> int:
    """CVT for a conversion name of FP8_CONVERT on a GPU (``gpu``) or under the interpreter; an
    unknown name is an error that names it and ``what`` it was given as."""
    if name not in FP8_CONVERT:
        raise ValueError(f"{what} must be one of {list(FP8_CONVERT)}, got {name!r}")
    return FP8_CONVERT[name][0 if gpu else 1]


def _multi_cvt(x, fp8_act: bool) -> int:
    """The multi-launch GEMMs' CVT: FP8_CONVERT_DEFAULT for weight-only FP8 (0 with FP8 activations:
    e4m3 x e4m3 products convert nothing)."""
    return 0 if fp8_act else convert_code(FP8_CONVERT_DEFAULT, x.device.type == "cuda")


def _check_fp8_tiles(cfg: dict, gemm: str, fp8_act: bool) -> None:
    if _is_fp8w_tma(cfg, fp8_act):  # the weight-only persistent GEMMs: K tiles within one scale block
        if FP8_BLOCK % cfg["BLOCK_K"]:
            raise ValueError(f"the weight-only tma_persistent FP8 {gemm} needs BLOCK_K dividing {FP8_BLOCK} (each "
                             f"K tile in one scale block), got BLOCK_K={cfg['BLOCK_K']} (plan.fp8_entry makes such "
                             f"an entry)")
        return
    if cfg["BLOCK_K"] != FP8_BLOCK or (gemm == "gemm1" and (cfg.get("SPLIT_K", 1) != 1 or
                                                           (fp8_act and cfg["BLOCK_N"] != FP8_BLOCK))):
        raise ValueError(f"FP8 {gemm} needs BLOCK_K={FP8_BLOCK} (one scale block per K tile)"
                         f"{', no split-K' if gemm == 'gemm1' else ''}"
                         f"{f' and BLOCK_N={FP8_BLOCK} (whole activation groups)' if gemm == 'gemm1' and fp8_act else ''}"
                         f", got {cfg} (plan.fp8_entry makes such an entry)")


def _fp8a(cfg: dict) -> bool:
    """Whether cfg asks for fp8_act_tma's persistent GEMMs ("tma_persistent" with "FP8A": plan.FP8A_TMA_PREFILL)."""
    return cfg.get("variant", "pointer") == "tma_persistent" and bool(cfg.get("FP8A", 0))


def _is_fp8w_tma(cfg: dict, fp8_act: bool) -> bool:
    """Whether cfg asks for the weight-only persistent GEMMs (variant "tma_persistent" without FP8 activations)."""
    return cfg.get("variant", "pointer") == "tma_persistent" and not fp8_act


def _check_tma_variant(cfg: dict, gemm: str, fp8_act: bool, split: int = 1) -> bool:
    """Whether cfg asks for the persistent TMA kernels (variant "tma_persistent"), either mode; no split-K."""
    if cfg.get("variant", "pointer") != "tma_persistent":
        return False
    if split != 1:
        raise ValueError(f"the tma_persistent FP8 {gemm} has no split-K, got split={split} (plan.fp8_entry makes "
                         f"such an entry)")
    return True


def fold_scale_max(dtype, cvt: int) -> float:
    """The largest weight block scale s the weight-only persistent GEMMs take with x's ``dtype`` (a
    torch dtype) and conversion ``cvt`` (``_e4m3_folded``): the folded weight 448 x s finite in
    dtype, and with CVT 2 (bf16, fp16) the fold factor s x 2^b as well. bf16: 255 (s x 2^120 <= bf16's
    largest, 255 x 2^120: weights up to 114,240); fp16: 65504 / 448 = 146.2 (weights within fp16's
    range: a fp16 layer cannot hold larger ones); fp32: 7.6e35."""
    import torch

    big = torch.finfo(dtype).max
    lim = big / fp8_ref.E4M3_MAX
    if cvt == 2 and dtype != torch.float32:
        lim = min(lim, big / float(_BIAS_2_120.value if dtype == torch.bfloat16 else _BIAS_2_8.value))
    return lim


def check_fold_scales(w_scale, dtype, cvt: int, what: str) -> None:
    """Refuse weight block scales ``w_scale`` (fp32, any shape) past fold_scale_max(dtype, cvt): a
    ValueError naming ``what``, the largest scale and the limit. One device reduction and host sync
    per scale tensor and version (recorded on the tensor it views, so a layer's later calls and a
    CUDA graph's capture after a warm-up call skip it); skipped while the stream captures a graph
    (no sync there: the eager call before the capture is the check)."""
    import torch

    if w_scale.numel() == 0:
        return
    lim = fold_scale_max(dtype, cvt)
    base = w_scale if w_scale._base is None else w_scale._base
    key = (w_scale.data_ptr(), tuple(w_scale.shape), tuple(w_scale.stride()), lim)
    done = getattr(base, "_megamoe_fold_checked", None)
    if done is not None and done.get(key) == base._version:
        return
    if w_scale.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    big = float(w_scale.abs().max())
    if not big <= lim:
        raise ValueError(f"{what}: a weight block scale of {big:.6g} exceeds {lim:.6g}, the largest the weight-only "
                         f"tma_persistent FP8 GEMMs take with x in {dtype} (the block scale is folded into the "
                         f"weights: fp8_gemm.fold_scale_max); run the pointer FP8 GEMMs "
                         f"(plan.fp8_entry(..., tma_weights=False)) for such weights")
    if done is None:
        done = base._megamoe_fold_checked = {}
    done[key] = base._version


def quantize_x_launch(x, codes, scales, launch: dict):
    """(kernel, grid, args, kwargs) of the x quantization: x (T, H) -> codes (T, H) float8_e4m3fn and
    scales (T, ceil(H/128)) fp32; ``launch``: plan.quantize_launch's (the static plan's "quant")."""
    T, H = x.shape
    if codes.shape != (T, H) or scales.shape != (T, -(-H // FP8_BLOCK)) or x.stride(1) != 1 or codes.stride(1) != 1:
        raise ValueError(f"quantize_x: x {list(x.shape)} needs contiguous rows, codes {[T, H]} and scales "
                         f"{[T, -(-H // FP8_BLOCK)]}, got {list(codes.shape)}, {list(scales.shape)}")
    kwargs = dict(KB=FP8_BLOCK, BLOCK_T=launch["BLOCK_T"], num_warps=launch["num_warps"])
    return (_quantize_x_kernel, launch["grid"],
            (x, codes, scales, T, H, x.stride(0), codes.stride(0), scales.stride(0)), kwargs)


def launch_quantize_x(x, codes, scales, launch: dict) -> None:
    """x quantized once per token per 128 columns into codes and scales (see quantize_x_launch)."""
    if x.shape[0] == 0:
        return
    kernel, grid, args, kwargs = quantize_x_launch(x, codes, scales, launch)
    kernel[grid](*args, **kwargs)


def gemm1_fp8_launch(x, w, w_scale, bias, out, out_scale, meta, topk_w, cfg: dict, *, activation: str, alpha: float,
                     limit: float, scale_input: bool, dense: bool, num_m: int, num_sms: int | None = None,
                     x_q: tuple | None = None):
    """(kernel, grid, args, kwargs) of the FP8 GEMM 1. x (T, H) its dtype; w (E, 2N, H) float8_e4m3fn;
    w_scale (E, ceil(2N/128), ceil(H/128)) fp32; out (P, N) e4m3 codes with out_scale (P, ceil(N/128))
    fp32 when FP8 activations (out_scale given), else out in x's dtype. cfg's variant "tma_persistent":
    _gemm1_fp8_tma_kernel (FP8 activations) or _gemm1_fp8w_tma_kernel (weight-only) on ``num_sms``
    programs (default: the device's SMs).
    ``x_q``: (codes, scales) of x from launch_quantize_x (FP8 activations without scale_input): the
    kernels read them (XQ) instead of quantizing x in their K loop."""
    from .grouped_gemm import ACT_CODES

    fp8_act = out_scale is not None
    _check_fp8_tiles(cfg, "gemm1", fp8_act)
    T, KD = x.shape
    N = w.shape[1] // 2
    if x_q is not None:
        if not fp8_act or scale_input:
            raise ValueError("FP8 GEMM 1 reads quantized x (x_q) only with FP8 activations and without scale_input "
                             f"(the routing weight scales rows before they are quantized), got "
                             f"fp8_activations={fp8_act}, scale_input={scale_input}")
        if tuple(x_q[0].shape) != (T, KD) or tuple(x_q[1].shape) != (T, -(-KD // FP8_BLOCK)):
            raise ValueError(f"x_q must be codes {[T, KD]} and scales {[T, -(-KD // FP8_BLOCK)]}, got "
                             f"{list(x_q[0].shape)}, {list(x_q[1].shape)}")
    xa, xs = (x, x) if x_q is None else x_q
    stride_xs = 0 if x_q is None else xs.stride(0)
    if _check_tma_variant(cfg, "gemm1", fp8_act) and not fp8_act:
        return _gemm1_fp8w_launch(x, w, w_scale, bias, out, meta, topk_w, cfg, activation=activation, alpha=alpha,
                                  limit=limit, scale_input=scale_input, dense=dense, num_m=num_m, num_sms=num_sms)
    if fp8_act and x_q is not None and _fp8a(cfg):  # fp8_act_tma's GEMM 1 (it reads x quantized once)
        from .fp8_act_tma import gemm1_fp8a_launch
        return gemm1_fp8a_launch(x_q, w, w_scale, bias, out, out_scale, meta, topk_w, cfg, activation=activation,
                                 alpha=alpha, limit=limit, dense=dense, num_m=num_m, num_sms=num_sms)
    if _check_tma_variant(cfg, "gemm1", fp8_act):
        kwargs = dict(ACT=ACT_CODES[activation], HAS_BIAS=bias is not None, SCALE_INPUT=scale_input, DENSE=dense,
                      XQ=x_q is not None, KB=FP8_BLOCK, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                      BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"], FLATTEN=bool(cfg.get("FLATTEN", 0)),
                      num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        args = (xa, xs, _descriptor(w, w.shape[0] * 2 * N, cfg["BLOCK_N"], cfg["BLOCK_K"]), w_scale, bias, out,
                out_scale, meta.get("padded_token"), meta.get("padded_pair"), meta.get("block_expert"),
                meta.get("padded_offsets"), topk_w, T, N, KD, w.shape[0], xa.stride(0), stride_xs, w_scale.stride(0),
                w_scale.stride(1), 0 if bias is None else bias.stride(0), out.stride(0), out_scale.stride(0),
                float(alpha), float(limit))
        return _gemm1_fp8_tma_kernel, gemm_grid(num_m, N, cfg, num_sms=num_sms or device_sms(x.device)), args, kwargs
    kwargs = dict(ACT=ACT_CODES[activation], HAS_BIAS=bias is not None, SCALE_INPUT=scale_input, DENSE=dense,
                  FP8_A=fp8_act, XQ=x_q is not None, IEEE=_ieee(x), KB=FP8_BLOCK, BLOCK_M=cfg["BLOCK_M"],
                  BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"], CVT=_multi_cvt(x, fp8_act),
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    args = (xa, xs, w, w_scale, bias, out, out_scale, meta.get("padded_token"), meta.get("padded_pair"),
            meta.get("block_expert"), topk_w, T, N, KD, num_m, xa.stride(0), stride_xs, w.stride(0), w.stride(1),
            w_scale.stride(0), w_scale.stride(1), 0 if bias is None else bias.stride(0), out.stride(0),
            0 if out_scale is None else out_scale.stride(0), float(alpha), float(limit))
    return _gemm1_fp8_kernel, gemm_grid(num_m, N, cfg), args, kwargs


def launch_gemm1_fp8(x, w, w_scale, bias, out, out_scale, meta, topk_w, cfg: dict, *, activation: str, alpha: float,
                     limit: float, scale_input: bool, dense: bool, num_m: int, num_sms: int | None = None,
                     x_q: tuple | None = None) -> None:
    """GEMM 1 with FP8 weights (see gemm1_fp8_launch)."""
    if num_m == 0:
        return
    kernel, grid, args, kwargs = gemm1_fp8_launch(x, w, w_scale, bias, out, out_scale, meta, topk_w, cfg,
                                                  activation=activation, alpha=alpha, limit=limit,
                                                  scale_input=scale_input, dense=dense, num_m=num_m, num_sms=num_sms,
                                                  x_q=x_q)
    if _is_fp8w_tma(cfg, out_scale is not None):
        check_fold_scales(w_scale, x.dtype, kwargs["CVT"], "gate_up scale_inv")
    kernel[grid](*args, **kwargs)


def gemm2_fp8_launch(act, act_scale, w, w_scale, bias, out, meta, scale, cfg: dict, *, T: int, K: int, KS: int,
                     dense: bool, atomic: bool, num_m: int, split: int = 1, num_sms: int | None = None):
    """(kernel, grid, args, kwargs) of the FP8 GEMM 2. act (P, I): e4m3 codes with act_scale
    (P, ceil(I/128)) fp32, or (act_scale None) x's dtype; w (E, N, I) float8_e4m3fn; w_scale
    (E, ceil(N/128), ceil(I/128)) fp32; out as grouped_gemm.launch_gemm2's. cfg's variant
    "tma_persistent" (no split-K): _gemm2_fp8_tma_kernel (FP8 activations) or _gemm2_fp8w_tma_kernel
    (weight-only) on ``num_sms`` programs."""
    _check_fp8_tiles(cfg, "gemm2", act_scale is not None)
    KD = act.shape[1]
    N = w.shape[1]
    if _check_tma_variant(cfg, "gemm2", act_scale is not None, split) and act_scale is None:
        return _gemm2_fp8w_launch(act, w, w_scale, bias, out, meta, scale, cfg, T=T, K=K, KS=KS, dense=dense,
                                  atomic=atomic, num_m=num_m, num_sms=num_sms)
    if act_scale is not None and _fp8a(cfg):  # fp8_act_tma's GEMM 2
        from .fp8_act_tma import gemm2_fp8a_launch
        return gemm2_fp8a_launch(act, act_scale, w, w_scale, bias, out, meta, scale, cfg, T=T, K=K, KS=KS,
                                 dense=dense, atomic=atomic, num_m=num_m, num_sms=num_sms)
    if _check_tma_variant(cfg, "gemm2", act_scale is not None, split):
        BK = cfg["BLOCK_K"]
        kwargs = dict(K=K, KS=KS, HAS_BIAS=bias is not None, HAS_SCALE=scale is not None, DENSE=dense, ATOMIC=atomic,
                      KB=FP8_BLOCK, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=BK,
                      GROUP_M=cfg["GROUP_M"], FLATTEN=bool(cfg.get("FLATTEN", 0)), num_warps=cfg["num_warps"],
                      num_stages=cfg["num_stages"])
        args = (_descriptor(act, act.shape[0], cfg["BLOCK_M"], BK), act_scale,
                _descriptor(w, w.shape[0] * N, cfg["BLOCK_N"], BK), w_scale, bias, out, meta.get("padded_pair"),
                meta.get("block_expert"), meta.get("padded_offsets"), scale, T, N, KD, w.shape[0],
                act_scale.stride(0), w_scale.stride(0), w_scale.stride(1), 0 if bias is None else bias.stride(0),
                out.stride(0))
        return _gemm2_fp8_tma_kernel, gemm_grid(num_m, N, cfg, num_sms=num_sms or device_sms(act.device)), args, kwargs
    kwargs = dict(K=K, KS=KS, HAS_BIAS=bias is not None, HAS_SCALE=scale is not None, DENSE=dense, ATOMIC=atomic,
                  FP8_A=act_scale is not None, IEEE=_ieee(act),
                  SPLIT_K=split, KB=FP8_BLOCK, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                  GROUP_M=cfg["GROUP_M"], CVT=_multi_cvt(act, act_scale is not None), num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"])
    args = (act, act_scale, w, w_scale, bias, out, meta.get("padded_pair"), meta.get("block_expert"), scale,
            T, N, KD, num_m, act.stride(0), 0 if act_scale is None else act_scale.stride(0), w.stride(0), w.stride(1),
            w_scale.stride(0), w_scale.stride(1), 0 if bias is None else bias.stride(0), out.stride(0))
    return _gemm2_fp8_kernel, gemm_grid(num_m, N, cfg, split), args, kwargs


def launch_gemm2_fp8(act, act_scale, w, w_scale, bias, out, meta, scale, cfg: dict, *, T: int, K: int, KS: int,
                     dense: bool, atomic: bool, num_m: int, split: int = 1, num_sms: int | None = None) -> None:
    """GEMM 2 with FP8 weights (see gemm2_fp8_launch)."""
    if num_m == 0:
        return
    kernel, grid, args, kwargs = gemm2_fp8_launch(act, act_scale, w, w_scale, bias, out, meta, scale, cfg, T=T, K=K,
                                                  KS=KS, dense=dense, atomic=atomic, num_m=num_m, split=split,
                                                  num_sms=num_sms)
    if _is_fp8w_tma(cfg, act_scale is not None):
        check_fold_scales(w_scale, act.dtype, kwargs["CVT"], "down scale_inv")
    kernel[grid](*args, **kwargs)



def _swap_ab(cfg: dict, gemm: str) -> bool:
    """The entry's "SWAP_AB" (plan.fp8_entry sets it for the weight-only persistent GEMMs: _fp8w_mma)."""
    if cfg.get("SWAP_AB") not in (0, 1):
        raise ValueError(f"the weight-only tma_persistent FP8 {gemm} needs SWAP_AB 0 or 1 in its config, got "
                         f"{cfg.get('SWAP_AB')!r} (plan.fp8_entry makes such an entry)")
    return bool(cfg["SWAP_AB"])


def _fp8w_rows_check(what: str, depth: int, gemm: str) -> None:
    """TMA's 16-byte rule for e4m3 weight rows of ``depth`` codes (and GEMM 2's activation rows, 2-byte)."""
    if depth % 16:
        raise ValueError(f"the weight-only tma_persistent FP8 {gemm} reads {what} rows of {depth} e4m3 codes "
                         f"through TMA, which needs 16-byte row strides: {depth} is not a multiple of 16 "
                         f"(plan.fp8_entry keeps the pointer kernels there)")


def _gemm1_fp8w_launch(x, w, w_scale, bias, out, meta, topk_w, cfg: dict, *, activation: str, alpha: float,
                       limit: float, scale_input: bool, dense: bool, num_m: int, num_sms: int | None):
    """(kernel, grid, args, kwargs) of the weight-only persistent GEMM 1 (_gemm1_fp8w_tma_kernel):
    x (T, H) its dtype, w (E, 2N, H) float8_e4m3fn with w_scale (E, ceil(2N/128), ceil(H/128)) fp32,
    out (P, N) in x's dtype; cfg's BLOCK_K divides 128; ``num_sms`` programs (default: the device's SMs)."""
    from .grouped_gemm import ACT_CODES

    T, KD = x.shape
    N = w.shape[1] // 2
    _fp8w_rows_check("gate_up", KD, "gemm1")
    BN, BK = cfg["BLOCK_N"], cfg["BLOCK_K"]
    kwargs = dict(ACT=ACT_CODES[activation], HAS_BIAS=bias is not None, SCALE_INPUT=scale_input, DENSE=dense,
                  EVEN_K=KD % BK == 0, IEEE=_ieee(x), KB=FP8_BLOCK, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=BN, BLOCK_K=BK,
                  GROUP_M=cfg["GROUP_M"], FLATTEN=bool(cfg.get("FLATTEN", 0)), CVT=_multi_cvt(x, False),
                  SWAP_AB=_swap_ab(cfg, "gemm1"), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    args = (x, _descriptor(w, w.shape[0] * 2 * N, BN, BK), w_scale, bias, out, meta.get("padded_token"),
            meta.get("padded_pair"), meta.get("block_expert"), meta.get("padded_offsets"), topk_w, T, N, KD,
            w.shape[0], x.stride(0), w_scale.stride(0), w_scale.stride(1), 0 if bias is None else bias.stride(0),
            out.stride(0), float(alpha), float(limit))
    return _gemm1_fp8w_tma_kernel, gemm_grid(num_m, N, cfg, num_sms=num_sms or device_sms(x.device)), args, kwargs


def _gemm2_fp8w_launch(act, w, w_scale, bias, out, meta, scale, cfg: dict, *, T: int, K: int, KS: int, dense: bool,
                       atomic: bool, num_m: int, num_sms: int | None):
    """(kernel, grid, args, kwargs) of the weight-only persistent GEMM 2 (_gemm2_fp8w_tma_kernel):
    act (P, I) in x's dtype, contiguous, w (E, N, I) float8_e4m3fn with w_scale (E, ceil(N/128),
    ceil(I/128)) fp32, out as grouped_gemm.launch_gemm2's."""
    KD = act.shape[1]
    N = w.shape[1]
    _fp8w_rows_check("down", KD, "gemm2")
    BK = cfg["BLOCK_K"]
    kwargs = dict(K=K, KS=KS, HAS_BIAS=bias is not None, HAS_SCALE=scale is not None, DENSE=dense, ATOMIC=atomic,
                  IEEE=_ieee(act), KB=FP8_BLOCK, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=BK,
                  GROUP_M=cfg["GROUP_M"], FLATTEN=bool(cfg.get("FLATTEN", 0)), CVT=_multi_cvt(act, False),
                  SWAP_AB=_swap_ab(cfg, "gemm2"), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    args = (_descriptor(act, act.shape[0], cfg["BLOCK_M"], BK), _descriptor(w, w.shape[0] * N, cfg["BLOCK_N"], BK),
            w_scale, bias, out, meta.get("padded_pair"), meta.get("block_expert"), meta.get("padded_offsets"), scale,
            T, N, KD, w.shape[0], w_scale.stride(0), w_scale.stride(1), 0 if bias is None else bias.stride(0),
            out.stride(0))
    return _gemm2_fp8w_tma_kernel, gemm_grid(num_m, N, cfg, num_sms=num_sms or device_sms(act.device)), args, kwargs
