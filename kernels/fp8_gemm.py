"""The grouped GEMMs of the MoE layer with FP8 (e4m3) weights carrying 128 x 128 block scales.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, P_max padded rows,
KB = 128 (reference.fp8: WEIGHT_BLOCK, ACT_GROUP).

reference.forward's FP8 layer, pointer kernels. BLOCK_K == KB: weight-only acc += dot(a, w8.to(a's
dtype)) * s_w[n]; FP8_A acc += dot(a8, w8) * s_a[m] * s_w[n], x quantized once
(``_quantize_x_kernel``) unless SCALE_INPUT, h quantized in GEMM 1's epilogue (BLOCK_N == KB).
"tma_persistent" entries run fp8_act_tma.py's or fp8w_tma.py's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..reference.sizes import FP8_BLOCK
from .fp8_act_tma import gemm1_fp8a_launch, gemm2_fp8a_launch, is_fp8a
from .fp8_common import (  # noqa: F401 - convert_code: the megakernel imports it from here
    _fp8_step,
    _gemm1_fp8_epilogue,
    _multi_cvt,
    _quantize_groups,
    convert_code,
)
from .fp8w_tma import check_fold_scales, gemm1_fp8w_launch, gemm2_fp8w_launch
from .grouped_gemm import ACT_CODES, _gemm1_tile_start, _gemm2_epilogue, _gemm2_tile_start, _ieee, _program_tile
from .jit_keys import settle
from .plan import gemm_grid


@triton.jit(do_not_specialize=["T"])
def _quantize_x_kernel(x_ptr, q_ptr, s_ptr, T, H, stride_xt, stride_qt, stride_st, KB: tl.constexpr,
                       BLOCK_T: tl.constexpr):
    """x (T, H) -> codes (T, H) e4m3 and scales (T, ceil(H / KB)) fp32; program (i, g): BLOCK_T tokens x group g."""
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
def _gemm1_fp8_tile(
    x_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
    pid_m, pid_n, e, T, N, KD, stride_xt, stride_we, stride_wn, stride_wse, stride_wsn, stride_be, stride_ot,
    stride_os, alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    FP8_A: tl.constexpr, IEEE: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CVT: tl.constexpr,
):
    """One GEMM 1 tile (row block pid_m of expert e, N tile pid_n) with e4m3 weights w (E, 2N, KD)
    and scales ws (E, ceil(2N / KB), ceil(KD / KB)); BLOCK_K == KB. FP8_A: h quantized into out
    (codes) and outs (scales); BLOCK_N == KB."""
    _gemm1_fp8_xq_tile(x_ptr, x_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr,
                       topk_w_ptr, pid_m, pid_n, e, T, N, KD, stride_xt, 0, stride_we, stride_wn, stride_wse,
                       stride_wsn, stride_be, stride_ot, stride_os, alpha, limit, ACT, HAS_BIAS, SCALE_INPUT, DENSE,
                       FP8_A, False, IEEE, KB, BLOCK_M, BLOCK_N, BLOCK_K, CVT)


@triton.jit
def _gemm1_fp8_xq_tile(
    x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
    pid_m, pid_n, e, T, N, KD, stride_xt, stride_xs, stride_we, stride_wn, stride_wse, stride_wsn, stride_be,
    stride_ot, stride_os, alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SCALE_INPUT: tl.constexpr, DENSE: tl.constexpr,
    FP8_A: tl.constexpr, XQ: tl.constexpr, IEEE: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CVT: tl.constexpr,
):
    """_gemm1_fp8_tile; XQ: x_ptr / xs_ptr hold x's codes and scales from _quantize_x_kernel."""
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
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        k_mask = offs_k < KD - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        bg = tl.load(wg_ptrs, mask=k_mask[:, None], other=0.0)
        bu = tl.load(wu_ptrs, mask=k_mask[:, None], other=0.0)
        sg = tl.load(sg_ptrs + kt)
        su = tl.load(su_ptrs + kt)
        sa = tl.zeros((BLOCK_M,), tl.float32)
        if FP8_A and XQ:
            sa = tl.load(xs_ptrs + kt, mask=row_mask, other=0.0)
        elif FP8_A:
            a32 = a.to(tl.float32)
            if SCALE_INPUT:
                a32 = a32 * in_sc[:, None]
            a, sa = _quantize_groups(a32)
        acc_g += _fp8_step(a, bg, sa, sg, FP8_A, IEEE, CVT)
        acc_u += _fp8_step(a, bu, sa, su, FP8_A, IEEE, CVT)
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
                       FP8_A, XQ, IEEE, KB, BLOCK_M, BLOCK_N, BLOCK_K, CVT)


@triton.jit
def _gemm2_fp8_tile(
    a_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
    pid_m, pid_n, e, s, k_lo, k_hi, T, N, KD, stride_at, stride_as, stride_we, stride_wn, stride_wse, stride_wsn,
    stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr, ATOMIC: tl.constexpr,
    FP8_A: tl.constexpr, IEEE: tl.constexpr, SPLIT_K: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CVT: tl.constexpr,
):
    """One GEMM 2 tile with e4m3 weights w (E, N, KD) and scales ws (E, ceil(N / KB), ceil(KD / KB)),
    K tiles [k_lo, k_hi) of BLOCK_K == KB. FP8_A: a holds codes with scales as (rows, ceil(KD / KB))."""
    row_mask, tok, slot, srow, offs_n, offs_bn, offs_k, a_row, a_ptrs, _, _ = _gemm2_tile_start(
        a_ptr, padded_pair_ptr, pid_m, pid_n, e, k_lo * BLOCK_K, T, N, stride_at, K, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    w_ptrs = w_ptr + e.to(tl.int64) * stride_we + offs_bn[None, :] * stride_wn + (k_lo * BLOCK_K + offs_k)[:, None]
    sw_ptrs = ws_ptr + e.to(tl.int64) * stride_wse + (offs_bn // KB) * stride_wsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(k_lo, k_hi):
        k_mask = offs_k < KD - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_mask[:, None], other=0.0)
        sw = tl.load(sw_ptrs + kt)
        sa = tl.zeros((BLOCK_M,), tl.float32)
        if FP8_A:
            sa = tl.load(as_ptr + a_row * stride_as + kt, mask=row_mask, other=0.0)
        acc += _fp8_step(a, b, sa, sw, FP8_A, IEEE, CVT)
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
                    SPLIT_K, KB, BLOCK_M, BLOCK_N, BLOCK_K, CVT)


def _kind(cfg: dict, gemm: str, fp8_act: bool, split: int = 1) -> str:
    """Which FP8 GEMMs ``cfg`` asks for: "pointer", "fp8a" or "fp8w"; the tiles checked."""
    if cfg.get("variant", "pointer") == "tma_persistent":
        if split != 1:
            raise ValueError(f"the tma_persistent FP8 {gemm} has no split-K, got split={split} (plan.fp8_entry "
                             "makes such an entry)")
        if fp8_act and not is_fp8a(cfg):
            raise ValueError(f"a tma_persistent FP8 {gemm} with FP8 activations is fp8_act_tma's: its entry needs "
                             f"'FP8A': 1, got {cfg} (plan.fp8_entry makes such an entry)")
        if not fp8_act and FP8_BLOCK % cfg["BLOCK_K"]:
            raise ValueError(f"the weight-only tma_persistent FP8 {gemm} needs BLOCK_K dividing {FP8_BLOCK} (each "
                             f"K tile in one scale block), got BLOCK_K={cfg['BLOCK_K']} (plan.fp8_entry makes such "
                             "an entry)")
        return "fp8a" if fp8_act else "fp8w"
    if cfg["BLOCK_K"] != FP8_BLOCK or (gemm == "gemm1" and (cfg.get("SPLIT_K", 1) != 1 or
                                                           (fp8_act and cfg["BLOCK_N"] != FP8_BLOCK))):
        raise ValueError(f"FP8 {gemm} needs BLOCK_K={FP8_BLOCK} (one scale block per K tile)"
                         f"{', no split-K' if gemm == 'gemm1' else ''}"
                         f"{f' and BLOCK_N={FP8_BLOCK} (whole activation groups)' if gemm == 'gemm1' and fp8_act else ''}"
                         f", got {cfg} (plan.fp8_entry makes such an entry)")
    return "pointer"


def launch_quantize_x(x, codes, scales, launch: dict) -> None:
    """Quantize x (T, H) into e4m3 codes and (T, ceil(H/128)) fp32 scales; ``launch``: plan.quantize_launch's."""
    T, H = x.shape
    if T == 0:
        return
    if codes.shape != (T, H) or scales.shape != (T, -(-H // FP8_BLOCK)) or x.stride(1) != 1 or codes.stride(1) != 1:
        raise ValueError(f"quantize_x: x {list(x.shape)} needs contiguous rows, codes {[T, H]} and scales "
                         f"{[T, -(-H // FP8_BLOCK)]}, got {list(codes.shape)}, {list(scales.shape)}")
    _quantize_x_kernel[launch["grid"]](x, codes, scales, T, H, x.stride(0), codes.stride(0), scales.stride(0),
                                       KB=FP8_BLOCK, BLOCK_T=launch["BLOCK_T"], num_warps=launch["num_warps"])


def gemm1_fp8_launch(x, w, w_scale, bias, out, out_scale, meta, topk_w, cfg: dict, *, activation: str, alpha: float,
                     limit: float, scale_input: bool, dense: bool, num_m: int, num_sms: int | None = None,
                     x_q: tuple | None = None):
    """(kernel, grid, args, kwargs) of the FP8 GEMM 1. x (T, H); w (E, 2N, H) float8_e4m3fn; w_scale
    (E, ceil(2N/128), ceil(H/128)) fp32; out (P, N): e4m3 codes with out_scale (P, ceil(N/128)) fp32
    for FP8 activations, else x's dtype. ``x_q``: (codes, scales) of x (FP8 activations without
    scale_input), read instead of quantizing x. "tma_persistent" entries run on ``num_sms`` programs."""
    fp8_act = out_scale is not None
    kind = _kind(cfg, "gemm1", fp8_act)
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
    if kind == "fp8w":
        return gemm1_fp8w_launch(x, w, w_scale, bias, out, meta, topk_w, cfg, activation=activation, alpha=alpha,
                                 limit=limit, scale_input=scale_input, dense=dense, num_m=num_m, num_sms=num_sms)
    if kind == "fp8a":
        if x_q is None:
            raise ValueError("fp8_act_tma's GEMM 1 reads x quantized once (x_q); plan.fp8_entry gives a layer that "
                             "scales x before quantizing it (scale_input) the pointer GEMM 1")
        return gemm1_fp8a_launch(x_q, w, w_scale, bias, out, out_scale, meta, topk_w, cfg, activation=activation,
                                 alpha=alpha, limit=limit, dense=dense, num_m=num_m, num_sms=num_sms)
    xa, xs = (x, x) if x_q is None else x_q
    stride_xs = 0 if x_q is None else xs.stride(0)
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
    if _kind(cfg, "gemm1", out_scale is not None) == "fp8w":
        check_fold_scales(w_scale, x.dtype, kwargs["CVT"], "gate_up scale_inv")
    kernel[grid](*args, **kwargs)


def gemm2_fp8_launch(act, act_scale, w, w_scale, bias, out, meta, scale, cfg: dict, *, T: int, K: int, KS: int,
                     dense: bool, atomic: bool, num_m: int, split: int = 1, num_sms: int | None = None):
    """(kernel, grid, args, kwargs) of the FP8 GEMM 2. act (P, I): e4m3 codes with act_scale
    (P, ceil(I/128)) fp32, or x's dtype (act_scale None); w (E, N, I) float8_e4m3fn; w_scale
    (E, ceil(N/128), ceil(I/128)) fp32; out as grouped_gemm.launch_gemm2's."""
    kind = _kind(cfg, "gemm2", act_scale is not None, split)
    KD = act.shape[1]
    N = w.shape[1]
    if kind == "fp8w":
        return gemm2_fp8w_launch(act, w, w_scale, bias, out, meta, scale, cfg, T=T, K=K, KS=KS, dense=dense,
                                 atomic=atomic, num_m=num_m, num_sms=num_sms)
    if kind == "fp8a":
        return gemm2_fp8a_launch(act, act_scale, w, w_scale, bias, out, meta, scale, cfg, T=T, K=K, KS=KS,
                                 dense=dense, atomic=atomic, num_m=num_m, num_sms=num_sms)
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
    if _kind(cfg, "gemm2", act_scale is not None, split) == "fp8w":
        check_fold_scales(w_scale, act.dtype, kwargs["CVT"], "down scale_inv")
    kernel[grid](*args, **kwargs)


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
