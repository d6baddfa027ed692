"""The fused MoE layer forward on one GPU: router, align, grouped GEMMs, shared MLP, combine.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, Is shared width,
C router chunks, P_max padded rows, KS = K (+1 with a shared MLP).

``moe_forward(x, weights, config)`` -> y (T, H), x's dtype. Launches, in order, with no host
synchronization (every size comes from T and the config: CUDA-graph capturable):
    router (routing.py)       topk_idx (T, K) int32, topk_weights (T, K) fp32, hist (C, E)
    scan, scatter (align.py)  padded metadata, equal to reference.plan_dispatch(topk_idx, E, BLOCK_M)
    quantize_x (fp8_gemm.py)  FP8 activations: x's e4m3 codes and per-128 scales, once
    gemm1, gemm2 (grouped_gemm.py), routed experts and the shared MLP -> pair buffer (T*KS, H)
    combine                   y[t] = sum over the KS rows of token t, fixed order (deterministic)
With ``deterministic=False`` GEMM 2 adds into an fp32 (T, H) buffer with atomics; with KS = 1
GEMM 2 writes y directly.

Torch ops ``megamoe::moe_forward`` and ``megamoe::moe_experts`` (forward only); ``bind(weights,
config)`` gives a closure for torch.compile. Eager calls keep their plans, checks and intermediate
buffers between calls and skip the op's dispatch where it adds nothing (docs/kernels.md, "Eager calls").
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections import OrderedDict
from functools import cache, lru_cache

import torch
import triton

from ..reference.config import MoEConfig
from ..reference.sizes import FP8_BLOCK
from ..reference.weights import SCALE_FIELDS, MoEWeights
from . import checks, workspace
from . import configs as cfgs
from .align import launch_align, launch_hist
from .checks import KernelInputError, check_weights
from .fp8_gemm import launch_gemm1_fp8, launch_gemm2_fp8, launch_quantize_x
from .grouped_gemm import device_sms, launch_combine, launch_gemm1, launch_gemm2
from .plan import align_launch, combine_launch, router_launch, static_plan
from .routing import launch_router
from .tape import Tape, record

DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
INT32_MAX = 2**31 - 1


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@cache
def _gpu_name(device_index: int) -> str:
    return torch.cuda.get_device_name(device_index)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return _gpu_name(device.index if device.index is not None else torch.cuda.current_device())
    return "cpu-interpreter"


def kernel_config(config: MoEConfig, T: int, dtype: torch.dtype, device: torch.device, *, dense: bool = False) -> dict:
    """The GEMM configs this call launches with (see configs.py)."""
    E, H, K = config.num_experts, config.hidden_size, config.top_k
    I = config.intermediate_size
    if dense:
        E, K, I = 1, 1, config.shared_intermediate_size
    return cfgs.select_config(E, H, I, K, T, gpu=device_name(device), dtype=DTYPES[dtype],
                              triton_version=triton.__version__, interpret=device.type == "cpu")


def align_buffers(T: int, K: int, E: int, block_m: int, device, *,
                  poison: bool = False) -> tuple[dict, torch.Tensor, int]:
    """The router/align metadata buffers (see align.py), the histogram hist (C, E) and block_t.
    ``poison``: outputs start as -7 (counts and offsets 0) so tests see unwritten entries."""
    i32 = torch.int32
    block_t = cfgs.router_block_t(T, E)
    C = triton.cdiv(T, block_t) if T else 0
    P_max = cfgs.max_padded_rows(T * K, E, block_m)

    def out(n, zero=False):
        if not poison:
            return torch.empty((n,), device=device, dtype=i32)
        return torch.full((n,), 0 if zero else -7, device=device, dtype=i32)

    meta = {
        "chunk_base": torch.empty((C, E), device=device, dtype=i32),
        "counts": out(E, zero=True),
        "padded_offsets": out(E + 1, zero=True),
        "padded_token": out(P_max),
        "padded_pair": out(P_max),
        "block_expert": out(P_max // block_m),
        "pair_dest": out(T * K),
    }
    hist = torch.empty((C, E), device=device, dtype=i32)
    return meta, hist, block_t


def check_inputs(x, weights, config) -> None:
    """Raise KernelInputError for anything the kernels cannot take (see the tests for the cases)."""
    if not isinstance(config, MoEConfig):
        raise KernelInputError(f"config must be a MoEConfig, got {type(config).__name__}")
    if not isinstance(weights, MoEWeights):
        raise KernelInputError(f"weights must be a MoEWeights (MoEWeights.to_torch(...)), got {type(weights).__name__}")
    _check_x(x, config)
    check_weights(weights, config, x.device, x.dtype)


def _check_x(x, config: MoEConfig) -> None:
    """check_inputs' checks of x (its shape, sizes, place and layout)."""
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[1] != config.hidden_size:
        raise KernelInputError(f"x must have shape [T, {config.hidden_size}] (hidden_size of {config.name!r}), got {list(x.shape)}")
    (_check_sizes if torch.compiler.is_compiling() else _sizes_ok)(x.shape[0], _dims(config))
    _check_place(x.device, x.dtype)
    if not x.is_contiguous():
        raise KernelInputError(f"x must be contiguous, got strides {list(x.stride())}")


def _dims(config: MoEConfig) -> tuple[int, ...]:
    """(H, I, E, K, KS, Is) of ``config`` as plain ints (what ``_check_sizes`` reads)."""
    K = config.top_k
    return (config.hidden_size, config.intermediate_size, config.num_experts, K,
            K + (1 if config.num_shared_experts else 0), config.shared_intermediate_size)


def _check_sizes(T: int, dims: tuple[int, ...]) -> None:
    """Every buffer of a call on T tokens within 32-bit indexing; ``dims`` from ``_dims(config)``."""
    H, I, E, K, KS, Is = dims
    sizes = {
        "x (T*H)": T * H,
        "pair buffer (T*KS*H)": T * KS * H,
        "activation buffer (P_max*I)": cfgs.max_padded_rows(T * K, E, 128) * I,
        "one expert's gate_up (2I*H)": 2 * I * H,
        "shared activation (T*Is)": T * Is,
        "pairs (T*K)": T * K,
    }
    for what, n in sizes.items():
        if n > INT32_MAX:
            raise KernelInputError(f"{what} = {n} elements overflows 32-bit indexing (max {INT32_MAX}); split the batch")


_sizes_ok = lru_cache(maxsize=4096)(_check_sizes)  # eager calls: each (T, dims) checked once


def _check_place(device: torch.device, dtype: torch.dtype) -> None:
    """x's dtype and device (the weights' too) are ones the kernels run on."""
    if dtype not in DTYPES:
        raise KernelInputError(f"x dtype must be one of bfloat16, float16, float32, got {dtype}")
    if device.type == "cuda":
        if dtype == torch.float32:
            raise KernelInputError("float32 on CUDA is not supported: use bfloat16 or float16")
    elif device.type == "cpu":
        if not _interpret():
            raise KernelInputError("x is on the CPU: the Triton kernels run there only with TRITON_INTERPRET=1 set before triton is imported")
        if dtype == torch.bfloat16:
            raise KernelInputError("bfloat16 on the CPU interpreter gives wrong dot products: use float32 or float16 there")
    else:
        raise KernelInputError(f"x must be on a CUDA device (or the CPU under TRITON_INTERPRET=1), got {device}")


def fp8_mode(weights: MoEWeights, fp8_activations: bool) -> str | None:
    """The static plan's ``fp8`` for these weights: None (float weights), "weights" or "weights+act"."""
    if not weights.is_fp8:
        if fp8_activations:
            raise KernelInputError("fp8_activations=True with float weights (activation-only FP8) is not supported "
                                   "by the kernels: give FP8 weights (MoEWeights.to_fp8) or fp8_activations=False")
        return None
    return "weights+act" if fp8_activations else "weights"


def _act_buffers(rows: int, width: int, fp8: str | None, x: torch.Tensor):
    """GEMM 1's output: (rows, width) in x's dtype, or e4m3 codes and (rows, ceil(width / 128)) scales."""
    if fp8 != "weights+act":
        return torch.empty((rows, width), device=x.device, dtype=x.dtype), None
    return (torch.empty((rows, width), device=x.device, dtype=torch.float8_e4m3fn),
            torch.empty((rows, triton.cdiv(width, FP8_BLOCK)), device=x.device, dtype=torch.float32))


def _x_buffers(x: torch.Tensor, quant: dict | None):
    """x quantized once for the FP8 GEMM 1s: (codes (T, H), scales (T, ceil(H / 128))), or None."""
    if quant is None:
        return None
    T, H = x.shape
    return (torch.empty((T, H), device=x.device, dtype=torch.float8_e4m3fn),
            torch.empty((T, triton.cdiv(H, FP8_BLOCK)), device=x.device, dtype=torch.float32))


def static_plan_for(config: MoEConfig, T: int, dtype: torch.dtype, device: torch.device,
                    deterministic: bool = True, *, gemm: dict | None = None, shared_gemm: dict | None = None,
                    fp8: str | None = None):
    """The routing-independent launch plan (``plan.static_plan``) this call executes; ``gemm`` /
    ``shared_gemm``: entries instead of the tuned ones."""
    return static_plan(config, T, dtype=DTYPES[dtype], device_name=device_name(device),
                       triton_version=triton.__version__, deterministic=deterministic,
                       num_sms=device_sms(device), gemm=gemm, shared_gemm=shared_gemm, fp8=fp8)


def _forward(x, weights: MoEWeights, config: MoEConfig, deterministic: bool, stop_after: str | None = None, *,
             plan=None, fp8_activations: bool = False, buffers: dict | None = None) -> torch.Tensor:
    """The launches of the layer (module docstring) with the sizes of the static plan ``plan``
    (default the tuned one). ``stop_after`` ("align", "gemm1", "gemm2") ends early (the benchmark's
    per-stage breakdown; the output is then unfinished). ``buffers``: ``_forward_buffers`` of this
    plan and x's shape made beforehand (kept by workspace.get), else fresh ones."""
    T, H = x.shape
    E, K = config.num_experts, config.top_k
    dev = x.device
    y = torch.empty((T, H), device=dev, dtype=x.dtype)
    if T == 0:
        return y
    fp8 = plan.fp8 if buffers is not None else fp8_mode(weights, fp8_activations)  # (_layer checked it)
    sp = plan or static_plan_for(config, T, x.dtype, dev, deterministic, fp8=fp8)
    if sp.T != T or sp.atomic != (not deterministic and (sp.KS > 1 or sp.split2 > 1)) or sp.fp8 != fp8:
        raise KernelInputError(f"the static plan given is for T={sp.T}, atomic={sp.atomic}, fp8={sp.fp8}: this call "
                               f"has T={T}, deterministic={deterministic}, fp8={fp8}")
    g1, g2 = sp.gemm["gemm1"], sp.gemm["gemm2"]
    bm = g1["BLOCK_M"]
    ws = buffers or _forward_buffers(x, sp, config, fp8, weights.shared_gate is not None)
    meta, hist, block_t = ws["meta"], ws["hist"], ws["block_t"]
    B_max = sp.B_max
    KS, split2, atomic = sp.KS, sp.split2, sp.atomic
    topk_idx, topk_w, sgate = ws["topk_idx"], ws["topk_w"], ws["sgate"]
    if not launch_router(x, weights, config, topk_idx, topk_w, hist, sgate, block_t, meta=meta, block_m=bm,
                         launch=sp.router, part=ws["router_part"]):
        launch_align(topk_idx, hist, E, block_t, bm, meta, launch=sp.align)
    if stop_after == "align":
        return y

    act, act_s = ws["act"]
    x_q = ws["x_q"]  # x's codes and scales, once for the routed and the shared GEMM 1
    if x_q is not None:
        launch_quantize_x(x, *x_q, sp.quant)
    if fp8:
        launch_gemm1_fp8(x, weights.gate_up, weights.gate_up_scale_inv, weights.gate_up_bias, act, act_s, meta, topk_w,
                         g1, activation=config.activation, alpha=config.swiglu_alpha, limit=config.swiglu_limit,
                         scale_input=config.weight_on_input, dense=False, num_m=B_max, num_sms=sp.num_sms, x_q=x_q)
    else:
        launch_gemm1(x, weights.gate_up, weights.gate_up_bias, act, meta, topk_w, g1,
                     activation=config.activation, alpha=config.swiglu_alpha, limit=config.swiglu_limit,
                     scale_input=config.weight_on_input, dense=False, num_m=B_max, act=sp.act, num_sms=sp.num_sms,
                     part=ws["gemm1_part"])
    if stop_after == "gemm1":
        return y
    out = _gemm2_out(y, KS, split2, atomic, ws["pairs"])
    if fp8:
        launch_gemm2_fp8(act, act_s, weights.down, weights.down_scale_inv, weights.down_bias, out, meta,
                         None if config.weight_on_input else topk_w, g2,
                         T=T, K=K, KS=KS, dense=False, atomic=atomic, num_m=B_max, split=split2,
                         num_sms=sp.num_sms)
    else:
        launch_gemm2(act, weights.down, weights.down_bias, out, meta,
                     None if config.weight_on_input else topk_w, g2,
                     T=T, K=K, KS=KS, dense=False, atomic=atomic, num_m=B_max, split=split2, num_sms=sp.num_sms)
    if sp.shared:
        Is = config.shared_intermediate_size
        sh, sh_s = ws["shared_act"]
        if fp8:
            launch_gemm1_fp8(x, weights.shared_gate_up.view(1, 2 * Is, H),
                             weights.shared_gate_up_scale_inv.unsqueeze(0), None, sh, sh_s, {}, None,
                             sp.shared["gemm1"], activation="silu_gated", alpha=1.0, limit=1.0, scale_input=False,
                             dense=True, num_m=sp.shared_m, num_sms=sp.num_sms, x_q=x_q)
            launch_gemm2_fp8(sh, sh_s, weights.shared_down.view(1, H, Is), weights.shared_down_scale_inv.unsqueeze(0),
                             None, out, {}, sgate, sp.shared["gemm2"], T=T, K=K, KS=KS, dense=True, atomic=atomic,
                             num_m=sp.shared_m, split=split2, num_sms=sp.num_sms)
        else:
            launch_gemm1(x, weights.shared_gate_up.view(1, 2 * Is, H), None, sh, {}, None, sp.shared["gemm1"],
                         activation="silu_gated", alpha=1.0, limit=1.0, scale_input=False, dense=True,
                         num_m=sp.shared_m, act=sp.shared_act, num_sms=sp.num_sms, part=ws["shared_part"])
            launch_gemm2(sh, weights.shared_down.view(1, H, Is), None, out, {}, sgate, sp.shared["gemm2"],
                         T=T, K=K, KS=KS, dense=True, atomic=atomic, num_m=sp.shared_m, split=split2,
                         num_sms=sp.num_sms)
    if stop_after == "gemm2":
        return y
    _combine(out, y, KS, split2, atomic, sp.combine)
    return y


def _gemm2_out(y: torch.Tensor, KS: int, split2: int, atomic: bool, buf: torch.Tensor | None = None) -> torch.Tensor:
    """GEMM 2's output: an fp32 (T, H) sum (atomic), y itself (KS = 1, no split), else the pair buffer
    (split2*T*KS, H), split s, token t, slot k at row s*T*KS + t*KS + k (fp32 when split2 > 1).
    ``buf``: that buffer made beforehand (``_pairs_buffer``; zeroed here when atomic)."""
    if KS == 1 and split2 == 1 and not atomic:
        return y
    if buf is None:
        buf = _pairs_buffer(y, KS, split2, atomic)
    if atomic:
        buf.zero_()
    return buf


def _pairs_buffer(x: torch.Tensor, KS: int, split2: int, atomic: bool) -> torch.Tensor | None:
    """The buffer ``_gemm2_out`` returns (None where GEMM 2 writes y), uncleared."""
    T, H = x.shape
    if atomic:
        return torch.empty((T, H), device=x.device, dtype=torch.float32)
    if KS == 1 and split2 == 1:
        return None
    return torch.empty((split2 * T * KS, H), device=x.device, dtype=torch.float32 if split2 > 1 else x.dtype)


def _forward_buffers(x: torch.Tensor, sp, config: MoEConfig, fp8: str | None, gated: bool) -> dict:
    """Every intermediate buffer of ``_forward`` for x's T, dtype and device under static plan ``sp``
    (nothing that depends on the data; ``gated``: the layer has a shared gate)."""
    T, H = x.shape
    E, K, I = config.num_experts, config.top_k, config.intermediate_size
    dev, f32 = x.device, torch.float32
    meta, hist, block_t = align_buffers(T, K, E, sp.gemm["gemm1"]["BLOCK_M"], dev)
    rl = sp.router
    split = rl["SPLIT"]
    ws = dict(meta=meta, hist=hist, block_t=block_t, topk_idx=torch.empty((T, K), device=dev, dtype=torch.int32),
              topk_w=torch.empty((T, K), device=dev, dtype=f32),
              sgate=torch.empty((T,), device=dev, dtype=f32) if gated else None,
              router_part=None if not split else (torch.empty((split, T, E), device=dev, dtype=f32),
                                                  torch.empty((split, T), device=dev, dtype=f32) if gated else None),
              act=_act_buffers(sp.P_max, I, fp8, x), x_q=_x_buffers(x, sp.quant),
              gemm1_part=None if fp8 else _split_part(sp.gemm["gemm1"], sp.P_max, I, dev),
              pairs=_pairs_buffer(x, sp.KS, sp.split2, sp.atomic), shared_act=(None, None), shared_part=None,
              plan=sp)
    if sp.shared:
        Is = config.shared_intermediate_size
        ws["shared_act"] = _act_buffers(T, Is, fp8, x)
        ws["shared_part"] = None if fp8 else _split_part(sp.shared["gemm1"], T, Is, dev)
    return ws


def _split_part(g1: dict, rows: int, width: int, dev) -> torch.Tensor | None:
    """A split-K GEMM 1's fp32 partials (split, rows, 2 * width) (launch_gemm1's ``part``), or None."""
    split = g1.get("SPLIT_K", 1)
    return torch.empty((split, rows, 2 * width), device=dev, dtype=torch.float32) if split > 1 else None


def _combine(out: torch.Tensor, y: torch.Tensor, KS: int, split2: int, atomic: bool, launch=None) -> None:
    """y from GEMM 2's output (``_gemm2_out``); nothing to do when GEMM 2 wrote y."""
    if atomic:
        launch_combine(out, y, 1, launch=launch)
    elif out is not y:
        launch_combine(out, y, KS, split2, launch=launch)


def _experts(x, topk_idx, topk_w, gate_up, down, gate_up_bias, down_bias, activation: str, alpha: float,
             limit: float, deterministic: bool, backend: str = "auto", sticky: bool = False) -> torch.Tensor:
    """The routed experts for a routing made elsewhere: y[t] = sum_k topk_w[t, k] *
    expert_{topk_idx[t, k]}(x[t]), the routing sanitized first (checks.py; ``sticky``: the sticky
    flag, else the device's eager flag, ``checks.call_flag``'s)."""
    T, H = x.shape
    K = topk_idx.shape[1]
    E, I = gate_up.shape[0], gate_up.shape[1] // 2
    dev = x.device
    y = torch.empty((T, H), device=dev, dtype=x.dtype)
    if T == 0:
        return y
    flag = checks.flag_for(dev, sticky or checks.capturing(dev))
    if backend == "auto":  # (here, inside the op: torch.compile does not trace the tables' lookup)
        backend = _experts_backend(E, H, I, K, T, x.dtype, dev)
    if backend == "megakernel":  # one launch; deterministic whatever is asked (fixed-order combine)
        from .megakernel import megakernel_experts

        out = workspace.get(("experts_routing", T, K), dev, lambda: (
            torch.empty((T, K), device=dev, dtype=torch.int32), torch.empty((T, K), device=dev, dtype=torch.float32)))
        topk_idx, topk_w = checks.launch_check(topk_idx, topk_w, E, flag, out=out)
        return megakernel_experts(x, topk_idx, topk_w, gate_up, down, gate_up_bias, down_bias, activation, alpha,
                                  limit)
    p = _experts_plan(E, H, I, K, T, x.dtype, dev, bool(deterministic))
    ws = workspace.get(("experts", id(p), x.dtype), dev, lambda: _experts_buffers(p, x, K))
    meta, hist, B_max = ws["meta"], ws["hist"], p["B_max"]
    if T <= checks.CHECK_ALIGN_MAX_T:  # decode: the check and the align in one launch
        topk_idx, topk_w = checks.launch_check_align(topk_idx, topk_w, E, flag, ws["routing"], meta, p["bm"])
    else:
        topk_idx, topk_w = checks.launch_check(topk_idx, topk_w, E, flag, out=ws["routing"])
        launch_hist(topk_idx, hist, E, p["block_t"], launch=p["align"])
        launch_align(topk_idx, hist, E, p["block_t"], p["bm"], meta, launch=p["align"])
    g1, g2, split2, atomic = p["gemm1"], p["gemm2"], p["split2"], p["atomic"]
    launch_gemm1(x, gate_up, gate_up_bias, ws["act"], meta, topk_w, g1, activation=activation, alpha=alpha,
                 limit=limit, scale_input=False, dense=False, num_m=B_max, part=ws["gemm1_part"])
    out = _gemm2_out(y, K, split2, atomic, ws["pairs"])
    launch_gemm2(ws["act"], down, down_bias, out, meta, topk_w, g2, T=T, K=K, KS=K, dense=False,
                 atomic=atomic, num_m=B_max, split=split2)
    _combine(out, y, K, split2, atomic, p["combine"])
    return y


def _experts_eager(args: tuple, flag: torch.Tensor | None) -> torch.Tensor:
    """``_experts(*args)`` of an eager call, through a tape (``_taped``): x, the routing, the
    weights and this call's check flag (None: the sticky one, kept) are its per-call tensors."""
    x, idx, tw, gu, dn, gub, dnb = args[:7]
    key = ("experts", x.shape[0], idx.shape[1], idx.dtype, tw.dtype, tuple(gu.shape), x.dtype, gub is None, dnb is None,
           x.device.index, *args[7:])
    return _taped((x, idx, tw, gu, dn, gub, dnb, flag), key, lambda: _experts(*args))


@lru_cache(maxsize=1024)
def _experts_backend(E: int, H: int, I: int, K: int, T: int, dtype: torch.dtype, device: torch.device) -> str:
    """moe_experts' "auto": the backend the layer of this expert shape takes at T (select_backend), cached."""
    return cfgs.select_backend(E, H, I, K, T, gpu=device_name(device), dtype=DTYPES[dtype],
                               triton_version=triton.__version__)


@lru_cache(maxsize=1024)
def _experts_plan(E: int, H: int, I: int, K: int, T: int, dtype: torch.dtype, device: torch.device,
                  deterministic: bool) -> dict:
    """The multi-launch ``_experts``' sizes for T tokens (configs, align launches, combine), cached."""
    cfg = cfgs.select_config(E, H, I, K, T, gpu=device_name(device), dtype=DTYPES[dtype],
                             triton_version=triton.__version__, interpret=device.type == "cpu")
    bm = cfg["gemm1"]["BLOCK_M"]
    block_t = cfgs.router_block_t(T, E)
    P_max = cfgs.max_padded_rows(T * K, E, bm)
    split2 = cfg["gemm2"].get("SPLIT_K", 1)
    atomic = not deterministic and (K > 1 or split2 > 1)
    return dict(gemm1=cfg["gemm1"], gemm2=cfg["gemm2"], bm=bm, block_t=block_t, P_max=P_max, B_max=P_max // bm,
                split2=split2, atomic=atomic, E=E, I=I,
                align=align_launch(triton.cdiv(T, block_t), K, E, block_t, bm, P_max // bm),
                combine=combine_launch(T, H) if (atomic or K > 1 or split2 > 1) else None)


def _experts_buffers(p: dict, x: torch.Tensor, K: int) -> dict:
    """``_experts``' intermediate buffers for plan ``p`` (``_experts_plan``) and x's T and dtype."""
    T = x.shape[0]
    dev = x.device
    meta, hist, _ = align_buffers(T, K, p["E"], p["bm"], dev)
    return dict(meta=meta, hist=hist, act=torch.empty((p["P_max"], p["I"]), device=dev, dtype=x.dtype),
                routing=(torch.empty((T, K), device=dev, dtype=torch.int32),
                         torch.empty((T, K), device=dev, dtype=torch.float32)),
                gemm1_part=_split_part(p["gemm1"], p["P_max"], p["I"], dev),
                pairs=_pairs_buffer(x, K, p["split2"], p["atomic"]), plan=p)


@torch.library.custom_op("megamoe::moe_experts", mutates_args=())
def _experts_op(
    x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
    gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None, activation: str, alpha: float, limit: float,
    deterministic: bool, backend: str, sticky: bool = False,
) -> torch.Tensor:
    return _experts(x, topk_idx, topk_weights, gate_up, down, gate_up_bias, down_bias, activation, alpha, limit,
                    deterministic, backend, sticky)


@_experts_op.register_fake
def _(x, topk_idx, topk_weights, gate_up, down, gate_up_bias, down_bias, activation, alpha, limit, deterministic,
      backend, sticky=False):
    return torch.empty_like(x)


def moe_experts(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, gate_up: torch.Tensor,
                down: torch.Tensor, gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None, *,
                activation: str = "silu_gated", alpha: float = 1.702, limit: float = 7.0,
                deterministic: bool = True, check: bool = True, backend: str = "auto") -> torch.Tensor:
    """The routed experts alone, for a routing made elsewhere (e.g. a transformers MoE block's router).

    x: (T, H); topk_idx: (T, K) integer expert ids, distinct per row; topk_weights: (T, K) (any float
    dtype, used in fp32); gate_up: (E, 2I, H) gate rows then up rows; down: (E, H, I); biases (E, 2I),
    (E, H) or None; all weights in x's dtype on x's device -> y (T, H) = sum_k w[t, k] * expert(x[t]).
    ``backend``: "multi", "megakernel" or "auto": the backend the layer of this expert shape takes at
    T (``configs.select_backend``: tuned, else this GPU's model table, else the megakernel up to
    MEGAKERNEL_MAX_T). On an H100 that choice ran within 2.3% of the faster routed backend in 30 of
    32 rows; "multi" alone was 2% or more slower in 14 (docs/kernels.md).

    The routing is checked and made safe on the device (kernels/checks.py): a bad slot (an id out of
    [0, E), -1 included, a repeated id, a weight not finite) contributes 0 to y, and with ``check``
    it is reported as a ``KernelInputError`` naming token, slot and value, with no host wait:
    - on the CPU (interpreter): raised by this call;
    - on a GPU: raised by the next megamoe call on the device (``moe_experts``, ``moe_forward``, a
      ``bind`` closure) once the GPU has passed this call's check, or by ``check_routing(device)``,
      which waits for it; the check itself adds no host wait (its flag goes to pinned memory behind an event);
    - inside a CUDA-graph capture or under torch.compile (or ``check=False``): kept in the sticky
      flag that ``check_captured_routing(device, ...)`` reads.
    """
    if backend not in BACKENDS:
        raise KernelInputError(f"moe_experts backend must be one of {list(BACKENDS)}, got {backend!r}")
    for name, t, what in (("x", x, "(T, H)"), ("topk_idx", topk_idx, "(T, K) of integer expert ids"),
                          ("topk_weights", topk_weights, "(T, K) float"), ("gate_up", gate_up, "(E, 2I, H)"),
                          ("down", down, "(E, H, I)"), ("gate_up_bias", gate_up_bias, "(E, 2I) or None"),
                          ("down_bias", down_bias, "(E, H) or None")):
        if not isinstance(t, torch.Tensor) and not (t is None and name.endswith("_bias")):
            raise KernelInputError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")
    if x.dim() != 2 or gate_up.dim() != 3 or down.dim() != 3:
        raise KernelInputError(f"x must be [T, H], gate_up [E, 2I, H], down [E, H, I]; got {list(x.shape)}, "
                               f"{list(gate_up.shape)}, {list(down.shape)}")
    T, H = x.shape
    E, I2, H2 = gate_up.shape
    if H2 != H or I2 % 2 or tuple(down.shape) != (E, H, I2 // 2):
        raise KernelInputError(f"shapes disagree: x {list(x.shape)}, gate_up {list(gate_up.shape)}, down {list(down.shape)}")
    for name, t, want in (("gate_up_bias", gate_up_bias, (E, I2)), ("down_bias", down_bias, (E, H))):
        if t is not None and tuple(t.shape) != want:
            raise KernelInputError(f"{name} must have shape {list(want)} (gate_up {list(gate_up.shape)}), "
                                   f"got {list(t.shape)}")
    if topk_idx.dim() != 2 or topk_idx.shape[0] != T or tuple(topk_weights.shape) != tuple(topk_idx.shape):
        raise KernelInputError(f"topk_idx and topk_weights must both be [T={T}, K], got {list(topk_idx.shape)} "
                               f"and {list(topk_weights.shape)}")
    if activation not in ("silu_gated", "clamped_swiglu"):
        raise KernelInputError(f"activation must be 'silu_gated' or 'clamped_swiglu', got {activation!r}")
    for name, t in (("gate_up", gate_up), ("down", down), ("gate_up_bias", gate_up_bias), ("down_bias", down_bias)):
        if t is not None and (t.dtype != x.dtype or t.device != x.device):
            raise KernelInputError(f"{name} is {t.dtype} on {t.device}, x is {x.dtype} on {x.device}: they must agree")
    if T * topk_idx.shape[1] * H > INT32_MAX or 2 * (I2 // 2) * H > INT32_MAX:
        raise KernelInputError("sizes overflow 32-bit indexing; split the batch")
    K = topk_idx.shape[1]
    if not 1 <= K <= E:
        raise KernelInputError(f"topk_idx has K={K} slots per token; K must be in [1, E={E}] (distinct experts)")
    if topk_idx.dtype.is_floating_point or topk_idx.dtype.is_complex or topk_idx.dtype == torch.bool:
        raise KernelInputError(f"topk_idx must hold integer expert ids, got dtype {topk_idx.dtype}")
    if not topk_weights.dtype.is_floating_point:
        raise KernelInputError(f"topk_weights must be floating point, got dtype {topk_weights.dtype}")
    for name, t in (("topk_idx", topk_idx), ("topk_weights", topk_weights)):
        if t.device != x.device:
            raise KernelInputError(f"{name} is on {t.device}, x on {x.device}: they must be on one device")
    dev = x.device
    traced = torch.compiler.is_compiling()
    if checks._pending and not traced:
        checks.poll(dev)
    read = check and not traced and not checks.capturing(dev)
    gpu = dev.type == "cuda"
    if read:  # this call's own flag on a GPU, read later (checks.defer); the CPU reads it at once
        flag = checks.call_flag(dev) if gpu else checks._init(checks.flag_for(dev, captured=False))
    args = (x.contiguous(), topk_idx.contiguous(), topk_weights.contiguous(), gate_up.contiguous(), down.contiguous(),
            None if gate_up_bias is None else gate_up_bias.contiguous(),
            None if down_bias is None else down_bias.contiguous(),
            activation, float(alpha), float(limit), bool(deterministic), backend, not read)
    tensors = (topk_idx, topk_weights, gate_up, down, gate_up_bias, down_bias)
    if not traced and all(type(t) in PLAIN for t in tensors if t is not None) and _direct(x, tensors):
        y = _experts_eager(args, flag if read else None)
    else:
        y = torch.ops.megamoe.moe_experts(*args)
    if read and gpu:
        checks.defer(flag, E, K, topk_idx, topk_weights)
    elif read:
        checks.raise_if_flagged(flag, E, K, topk_idx, topk_weights)
    return y


# --------------------------------------------------------------------------- torch op

@lru_cache(maxsize=64)
def _config_from_json(s: str) -> MoEConfig:
    return MoEConfig.from_dict(json.loads(s))


BACKENDS = ("auto", "megakernel", "multi")


def resolve_backend(backend: str, config: MoEConfig, T: int, dtype: torch.dtype, device: torch.device,
                    fp8: str | None = None) -> str:
    """"megakernel" or "multi": ``backend``, or for "auto" the tuned choice (configs.select_backend)."""
    if backend not in BACKENDS:
        raise KernelInputError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if backend != "auto":
        return backend
    return cfgs.select_backend(config.num_experts, config.hidden_size, config.intermediate_size, config.top_k, T,
                               gpu=device_name(device), dtype=DTYPES[dtype], triton_version=triton.__version__,
                               fp8=fp8)


@lru_cache(maxsize=1024)
def _call_plan(config: MoEConfig, T: int, dtype: torch.dtype, device: torch.device, deterministic: bool,
              backend: str, fp8: str | None) -> tuple[str, object]:
    """(backend, plan) of a layer call on T tokens, everything known without the tensors' data:
    "megakernel" and its config (megakernel.megakernel_config), or "multi" and its static plan."""
    be = resolve_backend(backend, config, T, dtype, device, fp8=fp8)  # "auto" reads the FP8 mode's own table
    if be == "megakernel":
        from .megakernel import default_config

        return be, default_config(config, T, dtype, device, False, fp8)
    return be, static_plan_for(config, T, dtype, device, deterministic, fp8=fp8)


def _layer_plan(x, weights: MoEWeights, config: MoEConfig, deterministic: bool, backend: str,
                fp8_activations: bool) -> tuple:
    """(fp8 mode, backend, plan) of the layer's call on x (T > 0): all ``_layer`` needs besides the tensors."""
    fp8 = fp8_mode(weights, fp8_activations)
    return (fp8, *_call_plan(config, x.shape[0], x.dtype, x.device, bool(deterministic), backend, fp8))


def _layer(x, weights: MoEWeights, config: MoEConfig, deterministic: bool, backend: str,
           fp8_activations: bool = False, *, taped: bool = False, planned: tuple | None = None) -> torch.Tensor:
    """The layer's launches for x. ``taped`` (eager calls on the caller's own weights object):
    replay the launches recorded for this call shape where there is a tape (``_taped``).
    ``planned``: ``_layer_plan``'s answer for this call, where the caller kept it."""
    T = x.shape[0]
    if T == 0:
        return torch.empty(tuple(x.shape), device=x.device, dtype=x.dtype)
    fp8, be, plan = planned or _layer_plan(x, weights, config, deterministic, backend, fp8_activations)

    def run() -> torch.Tensor:
        if be == "megakernel":
            from .megakernel import megakernel_forward  # deterministic whatever is asked: fixed-order combine

            return megakernel_forward(x, weights, config, mk=plan, fp8=fp8)
        gated = weights.shared_gate is not None
        ws = workspace.get(("layer", id(plan), T, x.dtype, gated), x.device,  # the workspace holds its plan
                           lambda: _forward_buffers(x, plan, config, fp8, gated))
        return _forward(x, weights, config, deterministic, plan=plan, fp8_activations=fp8_activations, buffers=ws)

    if not taped:
        return run()
    return _taped((x,), (id(weights), id(config), id(plan), T, x.dtype, x.device.index), run, (weights, config))


#: the most tokens an eager call replays recorded launches for (above it the GPU time hides the host's)
TAPE_MAX_TOKENS = 256
#: recordings tried per call shape before its calls keep Triton's own launch path for good
TAPE_TRIES = 2
#: recorded call shapes kept, least recently used dropped first
TAPE_MAX_KEPT = 512
_tapes: OrderedDict = OrderedDict()  # (shape key, stream, thread) -> its Tape, or the calls seen without one
_tape_owners: set[int] = set()  # id of each weights object whose death drops its tapes


def _taped(inputs: tuple, shape_key: tuple, run, owner: tuple | None = None) -> torch.Tensor:
    """``run()``'s y: the first call of a shape key on this stream and thread runs plain (it makes
    the kept buffers), the next records its launches (tape.py), later ones replay them. ``inputs``:
    the per-call tensors, x first; ``owner``: (weights, config) a layer's tape holds, checked at
    each replay (the tape is dropped with the weights object). No tape for T = 0, above
    TAPE_MAX_TOKENS or inside a CUDA-graph capture."""
    x = inputs[0]
    if not 0 < x.shape[0] <= TAPE_MAX_TOKENS or checks.capturing(x):
        return run()
    stream = torch._C._cuda_getCurrentRawStream(x.device.index) if x.is_cuda else 0
    key = (shape_key, stream, threading.get_ident())
    hit = _tapes.get(key)
    if type(hit) is Tape:
        if (owner is None or (hit.owner() is owner[0] and hit.config is owner[1])) and hit.fits(inputs):
            _tapes.move_to_end(key)  # recently used: the last that _trim_tapes drops
            return hit.replay(inputs, stream)
        return run()
    seen = hit or 0
    if seen == 0 or seen > TAPE_TRIES:
        _tapes[key] = min(seen + 1, TAPE_TRIES + 1)
        _trim_tapes()
        return run()
    y, tp, _why = record(inputs, run)
    if tp is None:
        _tapes[key] = seen + 1
        return y
    if owner is not None:
        weights = owner[0]
        tp.owner, tp.config = weakref.ref(weights), owner[1]
        if id(weights) not in _tape_owners:
            _tape_owners.add(id(weights))
            weakref.finalize(weights, _drop_tapes, id(weights))
    _tapes[key] = tp
    _trim_tapes()
    return y


def _trim_tapes() -> None:
    while len(_tapes) > TAPE_MAX_KEPT:
        _tapes.popitem(last=False)


def _drop_tapes(owner: int) -> None:
    """Forget the tapes of a weights object gone (they hold its tensors)."""
    _tape_owners.discard(owner)
    for k in [k for k in _tapes if k[0][0] == owner]:
        del _tapes[k]


def clear_caches() -> None:
    """Drop every kept eager-call record: workspaces, call plans, megakernel launch data and
    checked weights (to free their memory, or to time a call made from nothing)."""
    from . import megakernel

    workspace.clear()
    for c in (_call_plan, _experts_plan, _experts_backend, _sizes_ok, megakernel.default_config,
              megakernel._experts_config):
        c.cache_clear()
    megakernel._statics.clear()
    _tapes.clear()
    _checked.clear()
    _info.clear()
    _calls.clear()
    _json.clear()


@torch.library.custom_op("megamoe::moe_forward", mutates_args=())
def _moe_op(
    x: torch.Tensor, router_weight: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
    router_bias: torch.Tensor | None, score_bias: torch.Tensor | None, gate_up_bias: torch.Tensor | None,
    down_bias: torch.Tensor | None, shared_gate_up: torch.Tensor | None, shared_down: torch.Tensor | None,
    shared_gate: torch.Tensor | None, config_json: str, deterministic: bool, backend: str,
    gate_up_scale_inv: torch.Tensor | None = None, down_scale_inv: torch.Tensor | None = None,
    shared_gate_up_scale_inv: torch.Tensor | None = None, shared_down_scale_inv: torch.Tensor | None = None,
    fp8_activations: bool = False,
) -> torch.Tensor:
    w = MoEWeights(router_weight=router_weight, gate_up=gate_up, down=down, router_bias=router_bias,
                   score_bias=score_bias, gate_up_bias=gate_up_bias, down_bias=down_bias,
                   shared_gate_up=shared_gate_up, shared_down=shared_down, shared_gate=shared_gate,
                   gate_up_scale_inv=gate_up_scale_inv, down_scale_inv=down_scale_inv,
                   shared_gate_up_scale_inv=shared_gate_up_scale_inv, shared_down_scale_inv=shared_down_scale_inv)
    return _layer(x, w, _config_from_json(config_json), deterministic, backend, fp8_activations)


@_moe_op.register_fake
def _(x, router_weight, gate_up, down, router_bias, score_bias, gate_up_bias, down_bias,
      shared_gate_up, shared_down, shared_gate, config_json, deterministic, backend, gate_up_scale_inv=None,
      down_scale_inv=None, shared_gate_up_scale_inv=None, shared_down_scale_inv=None, fp8_activations=False):
    return torch.empty_like(x)


_json: dict[int, tuple[MoEConfig, str]] = {}  # id(config) -> (config, its JSON)


@torch.compiler.assume_constant_result
def config_json(config: MoEConfig) -> str:
    """The config as the torch op's string argument, made once per config object."""
    hit = _json.get(id(config))
    if hit is not None and hit[0] is config:
        return hit[1]
    s = json.dumps(config.to_dict(), sort_keys=True)
    if len(_json) >= 1024:
        _json.clear()
    _json[id(config)] = (config, s)
    return s


_checked: dict[tuple, weakref.ref] = {}  # (id(weights), config, device, dtype) -> the weights checked
_info: dict[int, tuple] = {}  # id(weights) -> (weakref to weights, (is_fp8, plain, its tensors))
PLAIN = (torch.Tensor, torch.nn.Parameter)  # tensor types the layer may take without the torch op


def _check_weights_once(weights, config: MoEConfig, device: torch.device, dtype: torch.dtype) -> None:
    """``check_weights`` once per (weights object, config, device, dtype) outside a capture or
    compile (MoEWeights is frozen: its tensors stay those checked; FP8 scale values are re-read
    when changed, by check_weights)."""
    key = (id(weights), config, device, dtype)
    hit = _checked.get(key)
    if hit is not None and hit() is weights:
        if _weights_info(weights)[0] and not torch.compiler.is_compiling() and not checks.capturing(device):
            _recheck_scales(weights)
        return
    check_weights(weights, config, device, dtype)
    if not torch.compiler.is_compiling() and not checks.capturing(device):
        if len(_checked) >= 1024:
            _checked.clear()
        _checked[key] = weakref.ref(weights)


def _recheck_scales(weights: MoEWeights) -> None:
    """Checked weights' FP8 scales, each read again only if written since it was (its version)."""
    for name in SCALE_FIELDS:
        if getattr(weights, name) is not None:
            checks._check_scale_values(f"weights.{name}", getattr(weights, name))


#: what an eager ``moe_forward`` call derives from everything but x's data, per call signature
#: (weights and config objects, x's shape, dtype and device, the options): (weakref to the
#: weights, config, the weights' tensors, fp8_activations resolved, ``_layer_plan``'s answer).
#: Filled only by a call that passed the checks (or was told not to check) and ran direct; a
#: ``bind`` layer's calls keep their plans here too, per T ("bind" first in the key, no tensors).
_calls: dict[tuple, tuple] = {}


def _kept_call(key: tuple, weights, config: MoEConfig) -> tuple | None:
    """The entry ``_calls`` keeps for ``key``, where it is of these weights and config objects."""
    hit = _calls.get(key)
    return hit if hit is not None and hit[0]() is weights and hit[1] is config else None


def _keep_call(key: tuple, entry: tuple) -> tuple:
    """``entry`` kept in ``_calls`` (all dropped once it holds 1024)."""
    if len(_calls) >= 1024:
        _calls.clear()
    _calls[key] = entry
    return entry


def _weights_info(weights) -> tuple | None:
    """(is_fp8, every tensor a plain tensor or Parameter, the tensors) of a MoEWeights, made once
    per object (frozen: its fields stay); None for anything else."""
    if not isinstance(weights, MoEWeights):
        return None
    hit = _info.get(id(weights))
    if hit is not None and hit[0]() is weights:
        return hit[1]
    ts = tuple(weights.arrays().values())
    info = (weights.is_fp8, all(type(t) in PLAIN for t in ts), ts)
    if len(_info) >= 1024:
        _info.clear()
    _info[id(weights)] = (weakref.ref(weights), info)
    return info


def _direct(x, tensors) -> bool:
    """Whether a call may run the layer without the torch op's dispatch: eager, plain tensors, no
    torch function or dispatch mode, and nothing that autograd would have to see (``tensors``: the
    others, None allowed)."""
    if (type(x) is not torch.Tensor or torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled()
            or torch._C._len_torch_dispatch_stack()):
        return False
    if torch.is_grad_enabled():
        return not x.requires_grad and not any(t is not None and t.requires_grad for t in tensors)
    return True


def moe_forward(x: torch.Tensor, weights: MoEWeights, config: MoEConfig, *, deterministic: bool = True,
                check: bool = True, backend: str = "auto", fp8_activations: bool | None = None) -> torch.Tensor:
    """The MoE layer.  x: (T, H) bf16/fp16 on CUDA (fp32/fp16 on the CPU under TRITON_INTERPRET=1);
    weights: ``MoEWeights.to_torch(device, dtype)`` in x's dtype -> y: (T, H) in x's dtype.

    ``backend``: "megakernel", "multi" or "auto" (the faster for this shape and T, from the tuned
    configs). ``deterministic=False`` lets the multi-launch GEMM 2 add with atomics (else bitwise
    reproducible). ``check=False`` skips the input checks. FP8 weights (``to_fp8().to_torch(...)``)
    run the FP8 GEMMs; ``fp8_activations`` as the reference's (None: follow the weights, False:
    weight-only; True with float weights is refused).
    """
    if backend not in BACKENDS:
        raise KernelInputError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    traced = torch.compiler.is_compiling()  # traced: the checks and the torch op, nothing kept
    key, det = None, bool(deterministic)
    if not traced and type(x) is torch.Tensor and (fp8_activations is None or type(fp8_activations) is bool):
        key = (id(weights), id(config), x.shape, x.dtype, x.device, backend, det, fp8_activations, not check)
        hit = _kept_call(key, weights, config)
        if hit is not None and x.is_contiguous():
            _, _, tensors, fp8_act, planned = hit
            if check and planned[0] is not None and not checks.capturing(x):
                _recheck_scales(weights)
            if checks._pending:
                checks.poll(x.device)
            if _direct(x, tensors):
                return _layer(x, weights, config, det, backend, fp8_act, taped=True, planned=planned)
    if check and traced:
        check_inputs(x, weights, config)
    elif check:
        _check_x(x, config)
        _check_weights_once(weights, config, x.device, x.dtype)
    info = None if traced else _weights_info(weights)
    is_fp8 = info[0] if info is not None else bool(getattr(weights, "is_fp8", False))
    fp8_act = is_fp8 if fp8_activations is None else _fp8_activations(weights, fp8_activations)
    if is_fp8 or fp8_act:
        fp8_mode(weights, fp8_act)
    if checks._pending and not traced:
        checks.poll(x.device)
    if info is not None and info[1] and _direct(x, info[2]):
        if key is None or x.shape[0] == 0 or checks.capturing(x):
            return _layer(x, weights, config, det, backend, fp8_act, taped=True)
        planned = _layer_plan(x, weights, config, det, backend, fp8_act)
        _keep_call(key, (weakref.ref(weights), config, info[2], fp8_act, planned))
        return _layer(x, weights, config, det, backend, fp8_act, taped=True, planned=planned)
    return torch.ops.megamoe.moe_forward(
        x, weights.router_weight, weights.gate_up, weights.down, weights.router_bias, weights.score_bias,
        weights.gate_up_bias, weights.down_bias, weights.shared_gate_up, weights.shared_down,
        weights.shared_gate, config_json(config), det, backend,
        *(getattr(weights, k) for k in SCALE_FIELDS), fp8_act,
    )


def _fp8_activations(weights: MoEWeights, fp8_activations) -> bool:
    if fp8_activations is None:
        return bool(getattr(weights, "is_fp8", False))
    if not isinstance(fp8_activations, bool):
        raise KernelInputError(f"fp8_activations must be True, False or None, got {fp8_activations!r}")
    return fp8_activations


def bind(weights: MoEWeights, config: MoEConfig, *, deterministic: bool = True, backend: str = "auto",
         fp8_activations: bool | None = None, graphs: bool = False):
    """``f(x) -> y``: the layer with its weights and config bound, calling the torch op directly.

    The weights are checked here, once; each call checks x's shape, dtype and device on the host.
    Under torch.compile the closure calls the torch op with tensors, a string and a bool; eager
    calls skip the op's dispatch (``_direct``) and run the cached plan (docs/kernels.md, "Eager calls").
    ``graphs=True`` (CUDA): an eager call of T <= GRAPH_MAX_TOKENS tokens replays a CUDA graph of
    the layer captured at its first call for that T and stream (a copy of x in, a copy of y out;
    bitwise the eager call's y), where capture works; otherwise, and for larger T, the plain call.
    """
    if backend not in BACKENDS:
        raise KernelInputError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if not isinstance(graphs, bool):
        raise KernelInputError(f"graphs must be True or False, got {graphs!r}")
    rw = getattr(weights, "router_weight", None)
    dev, dt = getattr(rw, "device", None), getattr(rw, "dtype", None)
    check_weights(weights, config, dev, dt)
    _check_place(dev, dt)
    cj = config_json(config)
    ts = tuple(getattr(weights, f) for f in ("router_weight", "gate_up", "down", "router_bias", "score_bias",
                                              "gate_up_bias", "down_bias", "shared_gate_up", "shared_down",
                                              "shared_gate"))
    H, det, dims = config.hidden_size, bool(deterministic), _dims(config)
    fp8_act = _fp8_activations(weights, fp8_activations)
    if weights.is_fp8 or fp8_act:
        fp8_mode(weights, fp8_act)
    scales = tuple(getattr(weights, k) for k in SCALE_FIELDS)
    plain = all(type(t) in PLAIN for t in weights.arrays().values())
    every = tuple(t for t in (*ts, *scales) if t is not None)
    kept = _Graphs() if graphs and dev.type == "cuda" else None

    def run(x: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        key = ("bind", id(weights), id(config), T, det, backend, fp8_act)  # x's dtype and device: bind's
        hit = _kept_call(key, weights, config)
        if hit is None:
            if T == 0:
                return _layer(x, weights, config, det, backend, fp8_act)
            hit = _keep_call(key, (weakref.ref(weights), config, None, fp8_act,
                                   _layer_plan(x, weights, config, det, backend, fp8_act)))
        return _layer(x, weights, config, det, backend, fp8_act, taped=True, planned=hit[4])

    def f(x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != H or x.dtype != dt or x.device != dev:
            got = f"{list(x.shape)} {x.dtype} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise KernelInputError(f"x must be [T, {H}] {dt} on {dev}, got {got}")
        if not torch.compiler.is_compiling():
            _sizes_ok(x.shape[0], dims)
            if checks._pending:
                checks.poll(dev)
            if plain and _direct(x, every):
                if kept is not None and 0 < x.shape[0] <= GRAPH_MAX_TOKENS:
                    y = kept.call(x, run)
                    if y is not None:
                        return y
                return run(x.contiguous())
        return torch.ops.megamoe.moe_forward(x.contiguous(), *ts, cj, det, backend, *scales, fp8_act)

    return f


#: the most tokens a ``bind(..., graphs=True)`` call replays a CUDA graph for (larger T: plain calls)
GRAPH_MAX_TOKENS = 256
#: graphs one bound layer keeps (per T and stream), least recently used dropped first
GRAPH_MAX_KEPT = 16


class _Graphs:
    """A bound layer's CUDA graphs per (T, stream): (graph, static x, static y, buffers the graph
    owns), or None where the capture failed (that T and stream then run plain calls)."""

    def __init__(self):
        self.kept: OrderedDict = OrderedDict()

    def call(self, x: torch.Tensor, run) -> torch.Tensor | None:
        """y of ``run(x)`` through the kept graph (captured now if new); None: make a plain call."""
        if torch.cuda.is_current_stream_capturing():
            return None
        key = (x.shape[0], torch.cuda.current_stream(x.device).cuda_stream)
        if key not in self.kept:
            self.kept[key] = _capture(x, run)
            while len(self.kept) > GRAPH_MAX_KEPT:
                self.kept.popitem(last=False)
        self.kept.move_to_end(key)
        entry = self.kept[key]
        if entry is None:
            return None
        g, sx, sy, _owned = entry
        sx.copy_(x)
        g.replay()
        return sy.clone()


def _capture(x: torch.Tensor, run):
    """(graph, static x, static y) of ``run`` on x's shape, the graph captured on a side stream after
    one call there (compiles, fills caches); None if the capture fails."""
    cur = torch.cuda.current_stream(x.device)
    sx = x.clone(memory_format=torch.contiguous_format)
    side = torch.cuda.Stream(device=x.device)
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        run(sx)
    cur.wait_stream(side)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, stream=side):
            sy = run(sx)
    except RuntimeError:
        return None
    finally:
        from .megakernel import release_sync_buffer

        owned = release_sync_buffer(x.device, side.cuda_stream)  # the megakernel's, now the graph's alone
    cur.wait_stream(side)
    return g, sx, sy, owned


def moe_forward_details(x: torch.Tensor, weights: MoEWeights, config: MoEConfig) -> dict:
    """Routing and alignment metadata as the kernels compute them (for tests and validation):
    topk_idx, topk_weights, counts, padded_offsets, padded_token, padded_pair, block_expert,
    pair_dest, block_m; config_source (configs.config_source of the GEMM entry). Tensors on x's
    device; sizes as in the module docstring."""
    check_inputs(x, weights, config)
    T = x.shape[0]
    E, K = config.num_experts, config.top_k
    dev = x.device
    i32 = torch.int32
    cfg = kernel_config(config, T, x.dtype, dev)
    bm = cfg["gemm1"]["BLOCK_M"]
    meta, hist, block_t = align_buffers(T, K, E, bm, dev, poison=True)
    topk_idx = torch.empty((T, K), device=dev, dtype=i32)
    topk_w = torch.empty((T, K), device=dev, dtype=torch.float32)
    sgate = torch.empty((T,), device=dev, dtype=torch.float32) if weights.shared_gate is not None else None
    rl = router_launch(T, E, config.hidden_size, K, config.n_group, interpret=dev.type == "cpu",
                       num_sms=device_sms(dev))  # as moe_forward's static plan has it
    if T and not launch_router(x, weights, config, topk_idx, topk_w, hist, sgate, block_t, meta=meta, block_m=bm,
                               launch=rl):
        launch_align(topk_idx, hist, E, block_t, bm, meta)
    out = {k: v for k, v in meta.items() if k != "chunk_base"}
    out.update(topk_idx=topk_idx, topk_weights=topk_w, shared_gate=sgate, block_m=bm)
    out["config_source"] = cfgs.config_source(E, config.hidden_size, config.intermediate_size, K, T, gpu=device_name(dev),
                                              dtype=DTYPES[x.dtype], triton_version=triton.__version__,
                                              interpret=dev.type == "cpu")
    return out


def align_only(topk_idx: torch.Tensor, num_experts: int, block_m: int) -> dict:
    """The align kernels on a given topk_idx (T, K) int32 (test helper; hist computed with torch)."""
    T, K = topk_idx.shape
    dev = topk_idx.device
    i32 = torch.int32
    meta, hist, block_t = align_buffers(T, K, num_experts, block_m, dev, poison=True)
    for c in range(hist.shape[0]):  # every row is written: the router's histogram, made with torch
        flat = topk_idx[c * block_t:(c + 1) * block_t].reshape(-1).long()
        hist[c] = torch.bincount(flat, minlength=num_experts).to(i32)
    launch_align(topk_idx.to(i32).contiguous(), hist, num_experts, block_t, block_m, meta)
    return {k: v for k, v in meta.items() if k != "chunk_base"}
