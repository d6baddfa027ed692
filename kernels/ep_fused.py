"""One rank's expert-parallel step in one persistent launch: pulls, expert tiles and push-backs overlapped.

Shape legend: R ranks, P slots, P_r this rank's slots, K top-k (KP: next power of 2), H hidden, I
expert width, N rows received, B row blocks of BM rows, C_r / C'_r pull / push copies of this rank.

``launch_fused`` runs ``reference.ep_tasks.plan_fused_ep``'s tasks (programs take tickets, wait,
run, signal; one int32 sync buffer). Bitwise the phased path's with the same GEMM config.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from ..reference.ep_tasks import FusedEPPlan, plan_fused_ep
from . import configs as cfgs
from .ep import EPInputError, EPShard
from .ep_pull import note_timeout, row_tile, wait_flag
from .grouped_gemm import ACT_CODES, _gemm1_tile, _gemm2_tile, _ieee, device_sms
from .jit_keys import settle
from .megakernel import _now, _signal, _wait

#: int32 words between two counters of the sync buffer (one 128-byte line each on a GPU)
SYNC_STRIDE = 32
#: elements of one copy tile at most (rows x columns), as kernels/ep_pull.py
COPY_TILE = 4096
MAX_COPY_W = 1024
#: programs under the interpreter (each runs the tickets left: program 0 takes them all)
INTERPRET_PROGRAMS = 3


@triton.jit
def _pull_task(c, pulls_ptr, px_ptr, pidx_ptr, pw_ptr, ppos_ptr, rx_ptr, ridx_ptr, rw_ptr, flags_ptr, epoch_ptr,
               spin_limit, status_ptr, local_of_ptr, src_base_ptr, prow_ptr, ppair_ptr, rank, R, P_R,
               H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
               ALIGNED: tl.constexpr, CP_R: tl.constexpr, CP_W: tl.constexpr):
    """Pull copy c of this rank (module docstring)."""
    peer = tl.load(pulls_ptr + c * 4)
    src_row = tl.load(pulls_ptr + c * 4 + 1)
    dst_row = tl.load(pulls_ptr + c * 4 + 2)
    n = tl.load(pulls_ptr + c * 4 + 3).to(tl.int32)
    want = tl.load(epoch_ptr)
    seen, _left = wait_flag(flags_ptr + peer, want, spin_limit)
    if seen < want:
        note_timeout(status_ptr, peer, seen, 1)
    q = (peer - rank + R) % R
    xs = tl.load(px_ptr + peer).to(tl.pointer_type(rx_ptr.dtype.element_ty))
    if ALIGNED:
        xs = tl.multiple_of(xs, 16)
    ids = tl.load(pidx_ptr + peer).to(tl.pointer_type(tl.int64))
    ws = tl.load(pw_ptr + peer).to(tl.pointer_type(tl.float32))
    ps = tl.load(ppos_ptr + peer).to(tl.pointer_type(tl.int64))
    NB_W: tl.constexpr = (H + CP_W - 1) // CP_W
    for t in range(0, tl.cdiv(n, CP_R) * NB_W):
        rows, cols = row_tile(t, H, CP_R, CP_W)
        m = (rows < n)[:, None] & (cols < H)[None, :]
        s_off = (src_row + rows).to(tl.int64)[:, None] * H + cols[None, :]
        d_off = (dst_row + rows).to(tl.int64)[:, None] * H + cols[None, :]
        tl.store(rx_ptr + d_off, tl.load(xs + s_off, mask=m), mask=m)
    kk = tl.arange(0, KP)
    for rb in range(0, tl.cdiv(n, CP_R)):
        rows = rb * CP_R + tl.arange(0, CP_R)
        m = (rows < n)[:, None] & (kk < K)[None, :]
        s_off = (src_row + rows).to(tl.int64)[:, None] * K + kk[None, :]
        d_row = (dst_row + rows).to(tl.int64)
        d_off = d_row[:, None] * K + kk[None, :]
        g = tl.load(ids + s_off, mask=m, other=0)
        tl.store(ridx_ptr + d_off, g, mask=m)
        tl.store(rw_ptr + d_off, tl.load(ws + s_off, mask=m), mask=m)
        pos = tl.load(ps + s_off, mask=m, other=0)
        j = tl.load(local_of_ptr + g, mask=m, other=-1)
        ok = m & (j >= 0)
        pair = tl.load(src_base_ptr + q * P_R + j, mask=ok, other=0) + pos
        tl.store(prow_ptr + pair, (d_row[:, None] + kk[None, :] * 0).to(tl.int32), mask=ok)
        tl.store(ppair_ptr + pair, d_off.to(tl.int32), mask=ok)


@triton.jit
def _push_task(c, pushes_ptr, pcomb_ptr, out_ptr, ridx_ptr, local_of_ptr,
               H: tl.constexpr, K: tl.constexpr, ALIGNED: tl.constexpr, CP_R: tl.constexpr, CP_W: tl.constexpr):
    """Push copy c of this rank: the partial rows summed from the pair rows, into the peer's combine buffer."""
    peer = tl.load(pushes_ptr + c * 4)
    src_row = tl.load(pushes_ptr + c * 4 + 1)
    dst_row = tl.load(pushes_ptr + c * 4 + 2)
    n = tl.load(pushes_ptr + c * 4 + 3).to(tl.int32)
    dst = tl.load(pcomb_ptr + peer).to(tl.pointer_type(out_ptr.dtype.element_ty))
    if ALIGNED:
        dst = tl.multiple_of(dst, 16)
    NB_W: tl.constexpr = (H + CP_W - 1) // CP_W
    for t in range(0, tl.cdiv(n, CP_R) * NB_W):
        rows, cols = row_tile(t, H, CP_R, CP_W)
        r_ok = rows < n
        c_ok = cols < H
        r = (src_row + rows).to(tl.int64)
        acc = tl.zeros((CP_R, CP_W), tl.float32)
        for k in tl.static_range(K):
            g = tl.load(ridx_ptr + r * K + k, mask=r_ok, other=0)
            sel = r_ok & (tl.load(local_of_ptr + g, mask=r_ok, other=-1) >= 0)
            v = tl.load(out_ptr + (r * K + k)[:, None] * H + cols[None, :], mask=sel[:, None] & c_ok[None, :],
                        other=0.0)
            acc += v.to(tl.float32)
        d_off = (dst_row + rows).to(tl.int64)[:, None] * H + cols[None, :]
        tl.store(dst + d_off, acc.to(out_ptr.dtype.element_ty), mask=r_ok[:, None] & c_ok[None, :])


@triton.jit
def _ep_fused_kernel(
    kind_ptr, arg_ptr, tile_ptr, wptr_ptr, wcnt_ptr, wtgt_ptr, sptr_ptr, scnt_ptr, num_tasks, sync_ptr,
    pulls_ptr, pushes_ptr, px_ptr, pidx_ptr, pw_ptr, ppos_ptr, pcomb_ptr, rx_ptr, ridx_ptr, rw_ptr,
    flags_ptr, epoch_ptr, spin_limit, status_ptr, local_of_ptr, src_base_ptr, block_slot_ptr, prow_ptr, ppair_ptr,
    w1_ptr, b1_ptr, h_ptr, w2_ptr, b2_ptr, out_ptr,
    rank, R, N, NPAD, P_R, stride_w1e, stride_w1n, stride_b1e, stride_w2e, stride_w2n, stride_b2e, alpha, limit,
    H: tl.constexpr, I: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, ACT: tl.constexpr, HAS_B1: tl.constexpr,
    HAS_B2: tl.constexpr, IEEE: tl.constexpr, ALIGNED_X: tl.constexpr,
    ALIGNED_C: tl.constexpr, BM: tl.constexpr, BN1: tl.constexpr, BK1: tl.constexpr, BN2: tl.constexpr,
    BK2: tl.constexpr, CP_R: tl.constexpr, CP_W: tl.constexpr, SW: tl.constexpr, trace_ptr, TRACE: tl.constexpr,
):
    """Every task of a FusedEPPlan, tickets in order. TRACE (GPU only): per-task stamps in ns."""
    pid = tl.program_id(0)
    t = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    while t < num_tasks:
        t_taken = _now(TRACE)
        for w in range(tl.load(wptr_ptr + t), tl.load(wptr_ptr + t + 1)):
            _wait(sync_ptr + SW * (1 + tl.load(wcnt_ptr + w)), tl.load(wtgt_ptr + w))
        t_ready = _now(TRACE)
        kind = tl.load(kind_ptr + t)
        a = tl.load(arg_ptr + t)
        if kind == 0:
            _pull_task(a, pulls_ptr, px_ptr, pidx_ptr, pw_ptr, ppos_ptr, rx_ptr, ridx_ptr, rw_ptr, flags_ptr,
                       epoch_ptr, spin_limit, status_ptr, local_of_ptr, src_base_ptr, prow_ptr, ppair_ptr, rank, R,
                       P_R, H, K, KP, ALIGNED_X, CP_R, CP_W)
        elif kind == 1:
            e = tl.load(block_slot_ptr + a)
            _gemm1_tile(rx_ptr, w1_ptr, b1_ptr, h_ptr, h_ptr, prow_ptr, ppair_ptr, rw_ptr, a, tl.load(tile_ptr + t),
                        e, a * 0, 0, (H + BK1 - 1) // BK1, N, I, H, NPAD, H, stride_w1e, stride_w1n, stride_b1e, I,
                        alpha, limit, ACT, HAS_B1, False, False, H % BK1 == 0, IEEE, 1, BM, BN1, BK1)
        elif kind == 2:
            e = tl.load(block_slot_ptr + a)
            _gemm2_tile(h_ptr, w2_ptr, b2_ptr, out_ptr, ppair_ptr, rw_ptr, a, tl.load(tile_ptr + t), e, a * 0, 0,
                        (I + BK2 - 1) // BK2, N, H, I, I, stride_w2e, stride_w2n, stride_b2e, H, K, K, HAS_B2, True,
                        False, False, I % BK2 == 0, IEEE, 1, BM, BN2, BK2)
        else:
            _push_task(a, pushes_ptr, pcomb_ptr, out_ptr, ridx_ptr, local_of_ptr, H, K, ALIGNED_C, CP_R, CP_W)
        for s in range(tl.load(sptr_ptr + t), tl.load(sptr_ptr + t + 1)):
            _signal(sync_ptr + SW * (1 + tl.load(scnt_ptr + s)))
        if TRACE:
            tl.store(trace_ptr + 4 * t, pid.to(tl.int64))
            tl.store(trace_ptr + 4 * t + 1, t_taken)
            tl.store(trace_ptr + 4 * t + 2, t_ready)
            tl.store(trace_ptr + 4 * t + 3, _now(TRACE))
        t = tl.atomic_add(sync_ptr, 1, sem="relaxed")


# --------------------------------------------------------------------------- host side
def fused_tiles_of(P_r: int, H: int, I: int, num_pairs: int, *, gpu: str, dtype: str, triton_version: str,
                   interpret: bool) -> dict:
    """The GEMM tiles of the fused launch: the multi-launch entry for the local shape."""
    cfg = cfgs.select_config(max(P_r, 1), H, I, 1, max(num_pairs, 1), gpu=gpu, dtype=dtype,
                             triton_version=triton_version, interpret=interpret)
    g1, g2 = cfg["gemm1"], cfg["gemm2"]
    return {"BM": g1["BLOCK_M"], "BN1": g1["BLOCK_N"], "BK1": g1["BLOCK_K"], "BN2": g2["BLOCK_N"],
            "BK2": g2["BLOCK_K"], "num_warps": max(g1["num_warps"], g2["num_warps"])}


def fused_tiles(shard: EPShard, num_pairs: int, dtype: torch.dtype, device: torch.device) -> dict:
    """``fused_tiles_of`` for this shard on this device."""
    from .moe import DTYPES, device_name

    return fused_tiles_of(shard.gate_up.shape[0], shard.gate_up.shape[2], shard.down.shape[2], num_pairs,
                          gpu=device_name(device), dtype=DTYPES[dtype], triton_version=triton.__version__,
                          interpret=device.type == "cpu")


def plan_for(shard: EPShard, pull, slot_counts: np.ndarray, top_k: int, dtype: torch.dtype,
             device: torch.device) -> tuple[FusedEPPlan, dict]:
    """(the plan, its tiles) of this rank's fused launch."""
    tiles = fused_tiles(shard, int(np.asarray(slot_counts)[:, shard.slots].sum()), dtype, device)
    plan = plan_fused_ep(pull, shard.rank, slot_counts, shard.slot_rank, top_k=top_k,
                         hidden_size=shard.gate_up.shape[2], intermediate_size=shard.down.shape[2],
                         block_m=tiles["BM"], block_n1=tiles["BN1"], block_n2=tiles["BN2"],
                         act_bytes=torch.empty(0, dtype=dtype).element_size(),
                         weight_bytes=shard.gate_up.element_size())
    return plan, tiles


def fused_programs(device: torch.device) -> int:
    """The fused launch's programs by default: one per SM on a GPU, INTERPRET_PROGRAMS under the interpreter."""
    return INTERPRET_PROGRAMS if device.type == "cpu" else device_sms(device)


@dataclass
class FusedBuffers:
    """The per-launch device arrays of one plan: the task list, the layout tables, the pair buffers."""

    tasks: dict
    local_of: torch.Tensor
    src_base: torch.Tensor
    block_slot: torch.Tensor
    padded_row: torch.Tensor
    padded_pair: torch.Tensor
    h: torch.Tensor
    out: torch.Tensor
    sync: torch.Tensor


def device_plan(plan: FusedEPPlan, slot_rank: np.ndarray, N: int, dtype: torch.dtype, device) -> FusedBuffers:
    """The plan's arrays on the device (int32), the padded layout, h and pair-output buffers, a zeroed sync buffer."""
    def i32(a):
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device)

    local_of = np.full(max(slot_rank.size, 1), -1, np.int64)
    local_of[plan.slots] = np.arange(plan.slots.size)
    tasks = {k: i32(getattr(plan, k)) for k in ("kind", "arg", "tile", "wait_ptr", "wait_counter", "wait_target",
                                                "signal_ptr", "signal_counter")}
    npad, K, H, I = plan.num_padded, plan.top_k, plan.hidden_size, plan.intermediate_size
    return FusedBuffers(
        tasks=tasks, local_of=i32(local_of), src_base=i32(plan.src_base.reshape(-1) if plan.src_base.size else [0]),
        block_slot=i32(plan.block_slot if plan.block_slot.size else [0]),
        padded_row=torch.full((max(npad, 1),), -1, dtype=torch.int32, device=device),
        padded_pair=torch.full((max(npad, 1),), -1, dtype=torch.int32, device=device),
        h=torch.empty((max(npad, 1), I), dtype=dtype, device=device),
        out=torch.empty((max(N * K, 1), H), dtype=dtype, device=device),
        sync=torch.zeros(SYNC_STRIDE * (1 + len(plan.counters)), dtype=torch.int32, device=device))


def launch_fused(plan: FusedEPPlan, tiles: dict, fb: FusedBuffers, shard: EPShard, bufs, pulls_dev: torch.Tensor,
                 pushes_dev: torch.Tensor, N: int, *, num_programs: int | None = None,
                 trace: torch.Tensor | None = None) -> None:
    """One launch of ``plan`` on this rank's SymmetricBuffers; trace: int64 (num_tasks, 4) stamps."""
    if plan.num_tasks == 0:
        return
    if trace is not None and (trace.device.type != "cuda" or trace.dtype != torch.int64
                              or tuple(trace.shape) != (plan.num_tasks, 4)):
        raise EPInputError(f"trace must be an int64 ({plan.num_tasks}, 4) tensor on a GPU (the timer is PTX), got "
                           f"{trace.dtype} {list(trace.shape)} on {trace.device}")
    if num_programs is not None and (isinstance(num_programs, bool) or not isinstance(num_programs, int)
                                     or num_programs < 1):
        raise EPInputError(f"num_programs must be an integer >= 1, got {num_programs!r}")
    dev = bufs.device
    if num_programs is None:
        num_programs = fused_programs(dev)
    grid = (max(1, min(num_programs, plan.num_tasks)),)
    H, K = plan.hidden_size, plan.top_k
    cp_w = min(triton.next_power_of_2(H), MAX_COPY_W)
    cp_r = max(1, COPY_TILE // cp_w)
    ready = bufs.ready_wait()
    t = fb.tasks
    gu, dn = shard.gate_up, shard.down
    b1, b2 = shard.gate_up_bias, shard.down_bias
    _ep_fused_kernel[grid](
        t["kind"], t["arg"], t["tile"], t["wait_ptr"], t["wait_counter"], t["wait_target"], t["signal_ptr"],
        t["signal_counter"], plan.num_tasks, fb.sync,
        pulls_dev, pushes_dev, bufs.peers["send_x"], bufs.peers["send_idx"], bufs.peers["send_w"],
        bufs.peers["send_pos"], bufs.peers["combine"], bufs.recv_x, bufs.recv_idx, bufs.recv_w,
        ready.flags, ready.epoch, ready.spin_limit, ready.status, fb.local_of, fb.src_base, fb.block_slot,
        fb.padded_row, fb.padded_pair, gu, b1, fb.h, dn, b2, fb.out,
        plan.rank, plan.num_ranks, N, max(plan.num_padded, 1), max(plan.slots.size, 1),
        gu.stride(0), gu.stride(1), 0 if b1 is None else b1.stride(0), dn.stride(0), dn.stride(1),
        0 if b2 is None else b2.stride(0), float(shard.alpha), float(shard.limit),
        H=H, I=plan.intermediate_size, K=K, KP=triton.next_power_of_2(K), ACT=ACT_CODES[shard.activation],
        HAS_B1=b1 is not None, HAS_B2=b2 is not None, IEEE=_ieee(bufs.recv_x),
        ALIGNED_X=bufs.aligned["send_x"], ALIGNED_C=bufs.aligned["combine"], BM=tiles["BM"], BN1=tiles["BN1"],
        BK1=tiles["BK1"], BN2=tiles["BN2"], BK2=tiles["BK2"], CP_R=cp_r, CP_W=cp_w, SW=SYNC_STRIDE,
        trace_ptr=fb.sync if trace is None else trace, TRACE=trace is not None, num_warps=tiles["num_warps"])


def trace_summary(plan: FusedEPPlan, trace) -> dict:
    """Per task kind of a traced launch, us: {kind: {n, wait, work, start, end}} and "span"."""
    from ..reference.ep_tasks import EP_KINDS

    tr = np.asarray(trace.cpu() if isinstance(trace, torch.Tensor) else trace, dtype=np.int64)
    if tr.shape != (plan.num_tasks, 4):
        raise EPInputError(f"trace must have shape ({plan.num_tasks}, 4), got {list(tr.shape)}")
    if plan.num_tasks == 0:
        return {"span": 0.0}
    t0 = tr[:, 1].min()
    us = (tr[:, 1:] - t0) / 1e3
    out = {"span": float(us[:, 2].max())}
    for i, k in enumerate(EP_KINDS):
        m = plan.kind == i
        if m.any():
            out[k] = {"n": int(m.sum()), "wait": float((us[m, 1] - us[m, 0]).mean()),
                      "work": float((us[m, 2] - us[m, 1]).mean()), "start": float(us[m, 0].min()),
                      "end": float(us[m, 2].max())}
    return out


__all__ = ["FusedBuffers", "device_plan", "fused_programs", "fused_tiles", "fused_tiles_of", "launch_fused", "plan_for",
           "trace_summary"]


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
