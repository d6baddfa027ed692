"""Persistent TMA grouped GEMMs with FP8 (e4m3) weights and activations in x's dtype ("fp8w", prefill).

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width (N: a GEMM's output width, KD:
its depth), KB = 128 (reference.fp8: WEIGHT_BLOCK).

The bf16 persistent GEMMs with e4m3 weight tiles through TMA and the block scale folded in before
the dot: acc += dot(a, w), w[n, k] = code[n, k] x s_w[n] in a's dtype (``_e4m3_folded``; BLOCK_K
divides KB). SWAP_AB: acc^T = w @ a^T (docs/kernels.md). plan.fp8_entry sizes the tiles.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..reference import fp8 as fp8_ref
from ..reference.sizes import FP8_BLOCK
from .fp8_common import _BIAS_2_8, _BIAS_2_120, _E4M3X4_MOVES, _band_scale, _e4m3_to, _multi_cvt
from .grouped_gemm import (
    ACT_CODES,
    _act_epilogue,
    _descriptor,
    _gemm1_tile_start,
    _gemm2_epilogue,
    _gemm2_tile_start,
    _ieee,
    _mma,
    _routed_blocks,
    _routed_tile,
    device_sms,
)
from .jit_keys import settle
from .plan import gemm_grid

#: _e4m3_folded's inline PTX (CVT 2): out = fma(c, hi, c * lo) per pair, hi + lo the fold factor
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
    """e4m3 codes w (BN, BK) float8e4nv and their rows' block scales s (BN,) fp32 -> code x s (BN, BK)
    in dtype (bf16, fp16 or fp32), each rounded once (docs/kernels.md); must be finite in dtype
    (fold_scale_max, checked by the launchers)."""
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
    """Fold factors f (BN,) fp32 -> (hi, lo) in dtype, hi = dtype(f), lo = dtype(f - hi)."""
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
    """acc + a @ w^T for rows a (BM, BK) and folded weights w (BN, BK); SWAP_AB: acc^T + w @ a^T."""
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
    """One GEMM 1 tile as grouped_gemm._gemm1_tma_tile's, the e4m3 gate and up tiles through w_desc
    over gate_up as (E*2N, KD) with their block scales folded in."""
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
    """Persistent weight-only FP8 GEMM 1: tiles in grouped_gemm._gemm1_tma_kernel's order."""
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
    """One GEMM 2 tile as grouped_gemm._gemm2_tma_tile's, e4m3 down tiles through w_desc over down
    as (E*N, KD), block scales folded in as GEMM 1's."""
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


def fold_scale_max(dtype, cvt: int) -> float:
    """The largest weight block scale the weight-only persistent GEMMs take with ``dtype`` and ``cvt``."""
    import torch

    big = torch.finfo(dtype).max
    lim = big / fp8_ref.E4M3_MAX
    if cvt == 2 and dtype != torch.float32:
        lim = min(lim, big / float(_BIAS_2_120.value if dtype == torch.bfloat16 else _BIAS_2_8.value))
    return lim


def check_fold_scales(w_scale, dtype, cvt: int, what: str) -> None:
    """ValueError naming ``what`` where ``w_scale`` passes fold_scale_max(dtype, cvt); skipped in capture."""
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
                         f"weights: fold_scale_max); run the pointer FP8 GEMMs (a 'pointer' entry) for such weights")
    if done is None:
        done = base._megamoe_fold_checked = {}
    done[key] = base._version


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


def gemm1_fp8w_launch(x, w, w_scale, bias, out, meta, topk_w, cfg: dict, *, activation: str, alpha: float,
                       limit: float, scale_input: bool, dense: bool, num_m: int, num_sms: int | None):
    """(kernel, grid, args, kwargs) of the weight-only persistent GEMM 1; arguments as fp8_gemm.gemm1_fp8_launch's."""
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


def gemm2_fp8w_launch(act, w, w_scale, bias, out, meta, scale, cfg: dict, *, T: int, K: int, KS: int, dense: bool,
                       atomic: bool, num_m: int, num_sms: int | None):
    """(kernel, grid, args, kwargs) of the weight-only persistent GEMM 2; arguments as fp8_gemm.gemm2_fp8_launch's."""
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


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
