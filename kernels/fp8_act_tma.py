"""Persistent TMA grouped GEMMs with FP8 (e4m3) weights AND activations at prefill ("fp8a").

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width (N: a GEMM's output width,
KD: its depth), KB = 128 (reference.fp8: WEIGHT_BLOCK, ACT_GROUP).

Per 128-deep K step acc += dot(a8, w8) * (sa[:, None] * sw). GEMM 1 gathers x's codes (quantized
once), GEMM 2 reads h's codes through a descriptor; PIPE: docs/kernels.md. Tiles (plan.fp8_entry):
BLOCK_K = 128, GEMM 1 BLOCK_N = 128.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..reference.sizes import FP8_BLOCK
from .fp8_common import _band_scale, _gemm1_fp8_epilogue
from .grouped_gemm import (
    ACT_CODES,
    _descriptor,
    _gemm1_tile_start,
    _gemm2_epilogue,
    _gemm2_tile_start,
    _routed_blocks,
    _routed_tile,
    device_sms,
)
from .jit_keys import settle
from .plan import gemm_grid


@triton.jit
def _scaled(acc, p, c):
    """acc + p * c[:, None]: a K step's product p scaled by its rows' scales c = sa * sw (one FFMA)."""
    return acc + p * c[:, None]


@triton.jit
def _fresh(acc):
    """A zero accumulator computed as acc x 0, so the wgmma waits for acc's scaling (docs/kernels.md)."""
    return acc * 0.0


@triton.jit
def _gemm1_fp8a_tile(
    xq_ptr, xs_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr, topk_w_ptr,
    pid_m, pid_n, e, T, N, KD, stride_xt, stride_xs, stride_wse, stride_wsn, stride_be, stride_ot, stride_os,
    alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, DENSE: tl.constexpr, EVEN_K: tl.constexpr, UP_BAND: tl.constexpr,
    PIPE: tl.constexpr, KB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One GEMM 1 tile as fp8_tma_tiles' with XQ and FP8_A, persistent; BLOCK_N == BLOCK_K == KB."""
    rows, tok, row_mask, offs_n, offs_bn, offs_k, a_ptrs = _gemm1_tile_start(
        xq_ptr, padded_token_ptr, pid_m, pid_n, 0, T, N, stride_xt, DENSE, BLOCK_M, BLOCK_N, BLOCK_K)
    xs_ptrs = xs_ptr + tok.to(tl.int64) * stride_xs
    row_g = e * (2 * N) + pid_n * BLOCK_N
    ws_e = ws_ptr + e.to(tl.int64) * stride_wse
    sg_ptr = ws_e + pid_n * stride_wsn  # the gate band: scale block row pid_n (BLOCK_N == KB)
    su_ptr = ws_e + ((N + pid_n * BLOCK_N) // KB) * stride_wsn  # the up band's first block (all of it: UP_BAND)
    last = tl.cdiv(2 * N, KB) - 1
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    pg = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)  # PIPE: the gate product in flight, and its scales
    cg = tl.zeros((BLOCK_M,), tl.float32)
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_mask[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k < KD - kt * BLOCK_K)[None, :], other=0.0)
        sa = tl.load(xs_ptrs + kt, mask=row_mask, other=0.0)
        bg = w_desc.load([row_g, kt * BLOCK_K])
        bu = w_desc.load([row_g + N, kt * BLOCK_K])
        sg = tl.load(sg_ptr + kt)
        if PIPE:
            pu = tl.dot(a, bu.T)  # synchronous: its wait also completes the previous step's gate product
            acc_g = _scaled(acc_g, pg, cg)
            pg = tl.dot(a, bg.T, _fresh(acc_g))  # in flight under the scaling below and the next step's loads
            cg = sa * sg
        else:
            acc_g = _scaled(acc_g, tl.dot(a, bg.T), sa * sg)
            pu = tl.dot(a, bu.T)
        if UP_BAND:
            acc_u = _scaled(acc_u, pu, sa * tl.load(su_ptr + kt))
        else:  # the up band straddles two scale blocks (N % KB != 0): a scale per column
            su = _band_scale(ws_e, N + pid_n * BLOCK_N, last, kt, stride_wsn, KB, BLOCK_N)
            acc_u += pu * (sa[:, None] * su[None, :])
        a_ptrs += BLOCK_K
    if PIPE:
        acc_g = _scaled(acc_g, pg, cg)
    _gemm1_fp8_epilogue(acc_g, acc_u, rows, row_mask, e, pid_n, offs_n, offs_bn, N, bias_ptr, stride_be,
                        padded_pair_ptr, topk_w_ptr, out_ptr, outs_ptr, stride_ot, stride_os, alpha, limit,
                        ACT, HAS_BIAS, False, True)


@triton.jit(do_not_specialize=["T", "E"])
def _gemm1_fp8a_kernel(
    xq_ptr, xs_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr, padded_pair_ptr,
    block_expert_ptr, padded_off_ptr, topk_w_ptr, T, N, KD, E, stride_xt, stride_xs, stride_wse, stride_wsn,
    stride_be, stride_ot, stride_os, alpha, limit,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, DENSE: tl.constexpr, EVEN_K: tl.constexpr, UP_BAND: tl.constexpr,
    PIPE: tl.constexpr, KB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, FLATTEN: tl.constexpr,
):
    """Persistent FP8 GEMM 1: tiles in grouped_gemm._gemm1_tma_kernel's order."""
    num_m = _routed_blocks(padded_off_ptr, T, E, DENSE, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), num_m * num_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n, e = _routed_tile(t, num_m, num_n, block_expert_ptr, DENSE, GROUP_M)
        _gemm1_fp8a_tile(xq_ptr, xs_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, outs_ptr, padded_token_ptr,
                         padded_pair_ptr, topk_w_ptr, pid_m, pid_n, e, T, N, KD, stride_xt, stride_xs, stride_wse,
                         stride_wsn, stride_be, stride_ot, stride_os, alpha, limit, ACT, HAS_BIAS, DENSE, EVEN_K,
                         UP_BAND, PIPE, KB, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _gemm2_fp8a_tile(
    a_desc, as_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
    pid_m, pid_n, e, T, N, KD, stride_as, stride_wse, stride_wsn, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr,
    ATOMIC: tl.constexpr, PIPE: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One GEMM 2 tile: h's e4m3 rows through a_desc over (rows, KD) with scales as_ptr
    (rows, ceil(KD / KB)); the down weights as two column halves (BLOCK_N / 2, KB) through w_desc
    over down as (E*N, KD). PIPE 1 / 2 (CHAIN): docs/kernels.md; the same sums in the same order."""
    HALF: tl.constexpr = BLOCK_N // 2
    row_mask, tok, slot, srow, _, _, _, a_row, _, row_a, _ = _gemm2_tile_start(
        None, padded_pair_ptr, pid_m, pid_n, e, 0, T, N, 0, K, DENSE, BLOCK_M, HALF, BLOCK_K)
    sa_ptrs = as_ptr + a_row * stride_as
    ws_e = ws_ptr + e.to(tl.int64) * stride_wse
    last = tl.cdiv(N, KB) - 1
    n0 = pid_n * BLOCK_N
    s0_ptr = ws_e + tl.minimum(n0 // KB, last) * stride_wsn
    s1_ptr = ws_e + tl.minimum((n0 + HALF) // KB, last) * stride_wsn  # past N: masked columns only
    row_w0 = e * N + n0
    acc0 = tl.zeros((BLOCK_M, HALF), tl.float32)
    acc1 = tl.zeros((BLOCK_M, HALF), tl.float32)
    p0 = tl.zeros((BLOCK_M, HALF), tl.float32)  # PIPE: half 0's product in flight, and its scales
    c0 = tl.zeros((BLOCK_M,), tl.float32)
    for kt in range(0, tl.cdiv(KD, BLOCK_K)):
        a = a_desc.load([row_a, kt * BLOCK_K])
        b0 = w_desc.load([row_w0, kt * BLOCK_K])
        b1 = w_desc.load([row_w0 + HALF, kt * BLOCK_K])
        sa = tl.load(sa_ptrs + kt, mask=row_mask, other=0.0)
        if PIPE == 1:
            p1 = tl.dot(a, b1.T)  # synchronous: its wait also completes the previous step's p0
            acc0 = _scaled(acc0, p0, c0)
            p0 = tl.dot(a, b0.T, _fresh(acc0))  # in flight under the scaling below
            c0 = sa * tl.load(s0_ptr + kt)
        elif PIPE == 2:  # CHAIN: half 1's product starts from half 0's scaled sum x 0 (one product live)
            acc0 = _scaled(acc0, tl.dot(a, b0.T), sa * tl.load(s0_ptr + kt))
            p1 = tl.dot(a, b1.T, _fresh(acc0))
        else:
            acc0 = _scaled(acc0, tl.dot(a, b0.T), sa * tl.load(s0_ptr + kt))
            p1 = tl.dot(a, b1.T)
        acc1 = _scaled(acc1, p1, sa * tl.load(s1_ptr + kt))
    if PIPE == 1:
        acc0 = _scaled(acc0, p0, c0)
    offs_n0 = n0 + tl.arange(0, HALF)  # (_gemm2_tile_start's offs_n / offs_bn are a HALF-wide tile's)
    _gemm2_epilogue(acc0, row_mask, tok, slot, srow, e, pid_m * 0, offs_n0, offs_n0 % N, T, N,
                    bias_ptr, stride_be, scale_ptr, out_ptr, stride_ot, KS, HAS_BIAS, HAS_SCALE, ATOMIC, 1)
    offs_n1 = offs_n0 + HALF
    _gemm2_epilogue(acc1, row_mask, tok, slot, srow, e, pid_m * 0, offs_n1, offs_n1 % N, T, N,
                    bias_ptr, stride_be, scale_ptr, out_ptr, stride_ot, KS, HAS_BIAS, HAS_SCALE, ATOMIC, 1)


@triton.jit(do_not_specialize=["T", "E"])
def _gemm2_fp8a_kernel(
    a_desc, as_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, block_expert_ptr, padded_off_ptr, scale_ptr,
    T, N, KD, E, stride_as, stride_wse, stride_wsn, stride_be, stride_ot,
    K: tl.constexpr, KS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DENSE: tl.constexpr,
    ATOMIC: tl.constexpr, PIPE: tl.constexpr, KB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    """Persistent FP8 GEMM 2, walking its tiles as _gemm1_fp8a_kernel does."""
    num_m = _routed_blocks(padded_off_ptr, T, E, DENSE, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), num_m * num_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n, e = _routed_tile(t, num_m, num_n, block_expert_ptr, DENSE, GROUP_M)
        _gemm2_fp8a_tile(a_desc, as_ptr, w_desc, ws_ptr, bias_ptr, out_ptr, padded_pair_ptr, scale_ptr,
                         pid_m, pid_n, e, T, N, KD, stride_as, stride_wse, stride_wsn, stride_be, stride_ot,
                         K, KS, HAS_BIAS, HAS_SCALE, DENSE, ATOMIC, PIPE, KB, BLOCK_M, BLOCK_N, BLOCK_K)


# --------------------------------------------------------------------------- launchers
def is_fp8a(cfg: dict) -> bool:
    """Whether a GEMM config asks for these kernels: "tma_persistent" with "FP8A" 1."""
    return cfg.get("variant") == "tma_persistent" and bool(cfg.get("FP8A", 0))


#: the "PIPE" values each GEMM takes: 0 off, 1 PIPE, 2 CHAIN (GEMM 2 only; docs/kernels.md)
PIPE_MODES = {"gemm1": (0, 1), "gemm2": (0, 1, 2)}


def check_fp8a(cfg: dict, gemm: str, depth: int) -> None:
    """The tiles these kernels take: BLOCK_K = 128, GEMM 1 BLOCK_N = 128, GEMM 2 BLOCK_N halves
    dividing 128, no split-K, 16-byte row strides, "PIPE" one of PIPE_MODES[gemm]."""
    bn, bk = cfg["BLOCK_N"], cfg["BLOCK_K"]
    ok = bk == FP8_BLOCK and cfg.get("SPLIT_K", 1) == 1 and depth % 16 == 0
    ok = ok and (bn == FP8_BLOCK if gemm == "gemm1" else (bn % 2 == 0 and FP8_BLOCK % (bn // 2) == 0))
    ok = ok and cfg.get("PIPE", 1) in PIPE_MODES[gemm]
    if not ok:
        raise ValueError(f"the fp8a persistent FP8 {gemm} needs BLOCK_K={FP8_BLOCK}, no split-K, "
                         f"{'BLOCK_N=128' if gemm == 'gemm1' else 'BLOCK_N/2 dividing 128'}, PIPE in "
                         f"{PIPE_MODES[gemm]} and rows of a multiple of 16 codes, got {cfg} over {depth} codes "
                         "(plan.fp8_entry makes such an entry)")


def gemm1_fp8a_launch(x_q: tuple, w, w_scale, bias, out, out_scale, meta, topk_w, cfg: dict, *, activation: str,
                      alpha: float, limit: float, dense: bool, num_m: int, num_sms: int | None = None):
    """(kernel, grid, args, kwargs) of the persistent FP8 GEMM 1; arguments as fp8_gemm.gemm1_fp8_launch's
    with FP8 activations (x_q from fp8_gemm.launch_quantize_x)."""
    xq, xs = x_q
    T, KD = xq.shape
    N = w.shape[1] // 2
    check_fp8a(cfg, "gemm1", KD)
    if tuple(xs.shape) != (T, -(-KD // FP8_BLOCK)) or out_scale is None:
        raise ValueError(f"fp8a GEMM 1 needs x's scales {[T, -(-KD // FP8_BLOCK)]} and h's scales, got "
                         f"{list(xs.shape)}, {None if out_scale is None else list(out_scale.shape)}")
    kwargs = dict(ACT=ACT_CODES[activation], HAS_BIAS=bias is not None, DENSE=dense, EVEN_K=KD % FP8_BLOCK == 0,
                  UP_BAND=N % FP8_BLOCK == 0, PIPE=int(cfg.get("PIPE", 1)), KB=FP8_BLOCK, BLOCK_M=cfg["BLOCK_M"],
                  BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"],
                  FLATTEN=bool(cfg.get("FLATTEN", 0)), num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"])
    args = (xq, xs, _descriptor(w, w.shape[0] * 2 * N, cfg["BLOCK_N"], cfg["BLOCK_K"]), w_scale, bias, out,
            out_scale, meta.get("padded_token"), meta.get("padded_pair"), meta.get("block_expert"),
            meta.get("padded_offsets"), topk_w, T, N, KD, w.shape[0], xq.stride(0), xs.stride(0), w_scale.stride(0),
            w_scale.stride(1), 0 if bias is None else bias.stride(0), out.stride(0), out_scale.stride(0),
            float(alpha), float(limit))
    return _gemm1_fp8a_kernel, gemm_grid(num_m, N, cfg, num_sms=num_sms or device_sms(xq.device)), args, kwargs


def gemm2_fp8a_launch(act, act_scale, w, w_scale, bias, out, meta, scale, cfg: dict, *, T: int, K: int, KS: int,
                      dense: bool, atomic: bool, num_m: int, num_sms: int | None = None):
    """(kernel, grid, args, kwargs) of the persistent FP8 GEMM 2; arguments as fp8_gemm.gemm2_fp8_launch's."""
    KD = act.shape[1]
    N = w.shape[1]
    check_fp8a(cfg, "gemm2", KD)
    BK, BN = cfg["BLOCK_K"], cfg["BLOCK_N"]
    kwargs = dict(K=K, KS=KS, HAS_BIAS=bias is not None, HAS_SCALE=scale is not None, DENSE=dense, ATOMIC=atomic,
                  PIPE=int(cfg.get("PIPE", 1)), KB=FP8_BLOCK, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=BN, BLOCK_K=BK,
                  GROUP_M=cfg["GROUP_M"], FLATTEN=bool(cfg.get("FLATTEN", 0)),
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    args = (_descriptor(act, act.shape[0], cfg["BLOCK_M"], BK), act_scale,
            _descriptor(w, w.shape[0] * N, BN // 2, BK), w_scale, bias, out, meta.get("padded_pair"),
            meta.get("block_expert"), meta.get("padded_offsets"), scale, T, N, KD, w.shape[0],
            act_scale.stride(0), w_scale.stride(0), w_scale.stride(1), 0 if bias is None else bias.stride(0),
            out.stride(0))
    return _gemm2_fp8a_kernel, gemm_grid(num_m, N, cfg, num_sms=num_sms or device_sms(act.device)), args, kwargs


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
