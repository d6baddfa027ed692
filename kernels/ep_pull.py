"""The one-sided expert-parallel transport as a Triton copy kernel: one rank's pulls (or push-backs).

Shape legend: R ranks, C copies of the whole schedule, C_r those of one rank, W elements per row
(H for the hidden rows, K for topk_idx / topk_weights rows), N rows of a buffer.

Runs one rank's copies of ``reference.ep.plan_pull`` (``pull_rows_triton``, ``push_rows_triton``,
both through ``launch_copies`` from a table of peer addresses); bitwise ``reference.ep.pull_rows``
/ ``push_rows`` (docs/kernels.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from ..reference._checks import InputError
from ..reference.ep import PullSchedule
from .jit_keys import settle

#: elements of one tile (BLOCK_R x BLOCK_W) at most; a column block covers at most MAX_BLOCK_W elements
TILE_ELEMENTS = 4096
MAX_BLOCK_W = 1024
#: persistent programs per SM on a GPU; under the interpreter, a few programs
PROGRAMS_PER_SM = 4
INTERPRET_PROGRAMS = 3


@triton.jit
def wait_flag(flag, epoch, budget):
    """Poll ``flag`` (acquire) until it reaches ``epoch`` or ``budget`` polls -> (value, budget left)."""
    v = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
    while (v < epoch) & (budget > 0):
        v = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
        budget -= 1
    return v, budget


@triton.jit
def note_timeout(status, peer, value, kind):
    """Record the first timed-out wait in ``status`` ((3,) int64: peer + 1, the value read, the flag kind)."""
    if tl.atomic_cas(status, peer * 0, peer + 1, sem="relaxed", scope="gpu") == 0:
        tl.store(status + 1, value)
        tl.store(status + 2, kind)


@triton.jit
def row_tile(t, W: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    """Tile t of a copy W elements wide -> (rows (BLOCK_R,), cols (BLOCK_W,)) from the copy's first row."""
    NB_W: tl.constexpr = (W + BLOCK_W - 1) // BLOCK_W
    return (t // NB_W) * BLOCK_R + tl.arange(0, BLOCK_R), (t % NB_W) * BLOCK_W + tl.arange(0, BLOCK_W)


@triton.jit
def _copy_rows_kernel(local, peers, copies, lo, hi, flags, epoch, spin_limit, status, W: tl.constexpr,
                      PUSH: tl.constexpr, ALIGNED: tl.constexpr, WAIT: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_W: tl.constexpr):
    """Copies lo:hi of ``copies`` ((C, 4) int64 rows: peer, src_row, dst_row, rows), in order.

    local: this rank's buffer; peers: (R,) int64 base addresses of the peers' buffers; rows of W
    contiguous elements. WAIT: poll ``flags[peer]`` until ``epoch[0]`` before a peer's first copy
    (at most ``spin_limit`` polls; a timeout goes to ``status``)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    NB_W: tl.constexpr = (W + BLOCK_W - 1) // BLOCK_W
    base = pid * 0  # tiles of the copies before this one (int32, carried over the copies)
    if WAIT:
        want = tl.load(epoch)
        budget = spin_limit
        prev = (pid * 0 - 1).to(tl.int64)  # the peer of the last copy waited for
    for c in range(lo, hi):
        peer = tl.load(copies + c * 4 + 0)
        src_row = tl.load(copies + c * 4 + 1)
        dst_row = tl.load(copies + c * 4 + 2)
        n = tl.load(copies + c * 4 + 3).to(tl.int32)
        if WAIT:
            if peer != prev:
                seen, budget = wait_flag(flags + peer, want, budget)
                if seen < want:
                    note_timeout(status, peer, seen, 1)
                prev = peer
        remote = tl.load(peers + peer).to(tl.pointer_type(local.dtype.element_ty))
        if ALIGNED:
            remote = tl.multiple_of(remote, 16)
        if PUSH:
            src = local
            dst = remote
        else:
            src = remote
            dst = local
        ntiles = ((n + BLOCK_R - 1) // BLOCK_R) * NB_W
        first = (pid - base % nprog + nprog) % nprog  # this program's first tile of the copy
        for t in range(first, ntiles, nprog):
            rows, cols = row_tile(t, W, BLOCK_R, BLOCK_W)
            mask = (rows < n)[:, None] & (cols < W)[None, :]
            s_off = (src_row + rows).to(tl.int64)[:, None] * W + cols[None, :]
            d_off = (dst_row + rows).to(tl.int64)[:, None] * W + cols[None, :]
            tl.store(dst + d_off, tl.load(src + s_off, mask=mask), mask=mask)
        base += ntiles


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def copy_table(pull: PullSchedule, push: bool) -> np.ndarray:
    """(C, 4) int64 rows (peer, src_row, dst_row, rows) of every pull (push) copy, rank by rank."""
    if push:
        cols = (pull.push_dst, pull.push_src_row, pull.push_dst_row, pull.push_rows)
    else:
        cols = (pull.pull_src, pull.pull_src_row, pull.pull_dst_row, pull.pull_rows)
    return np.ascontiguousarray(np.stack(cols, axis=1).astype(np.int64, copy=False).reshape(-1, 4))


def _check_schedule_rank(pull, rank) -> int:
    if not isinstance(pull, PullSchedule):
        raise InputError(f"pull must be a reference.ep.PullSchedule (plan_pull), got {type(pull).__name__}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise InputError(f"rank must be an integer, got {rank!r}")
    if not 0 <= rank < pull.num_ranks:
        raise InputError(f"need 0 <= rank < num_ranks, got rank={int(rank)}, num_ranks={pull.num_ranks}")
    return int(rank)


def _row_width(t: torch.Tensor) -> int:
    return int(np.prod(t.shape[1:], dtype=np.int64))


def _check_buffer(name: str, b, need_rows: int, like: torch.Tensor | None) -> torch.Tensor:
    """A contiguous tensor of at least ``need_rows`` rows, with ``like``'s dtype, row shape and device type."""
    if not isinstance(b, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(b).__name__}")
    if b.ndim < 1:
        raise InputError(f"{name} must have a row dimension, got a 0-d tensor")
    if like is not None:
        if b.dtype != like.dtype:
            raise InputError(f"{name} is {b.dtype}, the other buffers are {like.dtype}: dtype mismatch")
        if b.shape[1:] != like.shape[1:]:
            raise InputError(f"{name} has rows of shape {list(b.shape[1:])} (H={_row_width(b)}), the other "
                             f"buffers {list(like.shape[1:])} (H={_row_width(like)}): every buffer's H must match")
        if b.device.type != like.device.type:
            raise InputError(f"{name} is on {b.device}, the other buffers on {like.device}")
    if b.shape[0] < need_rows:
        raise InputError(f"{name} has {b.shape[0]} rows, the schedule needs {need_rows}")
    if not b.is_contiguous():
        raise InputError(f"{name} must be contiguous (rows of H elements, row after row), got strides "
                         f"{list(b.stride())}")
    return b


def _check_per_rank(name: str, buffers, num_ranks: int) -> None:
    """``buffers`` is a list (or tuple) of one tensor per rank."""
    if not isinstance(buffers, (list, tuple)) or len(buffers) != num_ranks:
        n = len(buffers) if isinstance(buffers, (list, tuple)) else type(buffers).__name__
        raise InputError(f"need one {name} buffer per rank: got {n} for {num_ranks} ranks")


def _check_device(t: torch.Tensor) -> None:
    if t.device.type == "cpu" and not _interpreting():
        raise InputError("the buffers are on the CPU: the Triton kernel runs there only with TRITON_INTERPRET=1 "
                         "set before triton is imported")
    if t.device.type not in ("cpu", "cuda"):
        raise InputError(f"the buffers must be on a CUDA device (or the CPU under TRITON_INTERPRET=1), got {t.device}")


@dataclass(frozen=True)
class ReadyWait:
    """What a pull waits on: flags (R,) int64, epoch (1,) int64, spin_limit, status (3,) int64."""

    flags: torch.Tensor
    epoch: torch.Tensor
    spin_limit: int
    status: torch.Tensor


def _check_num_programs(num_programs) -> None:
    if num_programs is not None and (isinstance(num_programs, bool) or not isinstance(num_programs, int)
                                     or num_programs < 1):  # checked even where there is nothing to copy
        raise InputError(f"num_programs must be an integer >= 1, got {num_programs!r}")


def launch_copies(copies: np.ndarray, local: torch.Tensor, peers: torch.Tensor, *, push: bool, aligned: bool,
                  num_programs: int | None = None, copies_dev: torch.Tensor | None = None,
                  ready: ReadyWait | None = None) -> None:
    """One launch of the copy kernel over ``copies`` ((C_r, 4) int64 host rows of ``copy_table``).

    local: this rank's buffer; peers: (R,) int64 base addresses of buffers of local's dtype and row
    width; aligned: every address a multiple of 16; ready: wait for each peer's ready flag (pulls)."""
    _check_num_programs(num_programs)
    W = _row_width(local)
    if len(copies) == 0 or W == 0:
        return
    dev = local.device
    if copies_dev is None:
        copies_dev = torch.from_numpy(np.ascontiguousarray(copies)).to(dev)
    block_w = min(triton.next_power_of_2(W), MAX_BLOCK_W)
    longest = int(copies[:, 3].max())
    block_r = max(1, min(triton.next_power_of_2(longest), TILE_ELEMENTS // block_w))
    tiles = int((-(-copies[:, 3] // block_r)).sum()) * -(-W // block_w)
    if num_programs is None:
        if dev.type == "cuda":
            num_programs = torch.cuda.get_device_properties(dev).multi_processor_count * PROGRAMS_PER_SM
        else:
            num_programs = INTERPRET_PROGRAMS
    grid = (max(1, min(num_programs, tiles)),)
    if ready is None:  # the wait arguments are not read: any int64 tensor of the device stands in
        flags = epoch = status = peers
        spin_limit = 0
    else:
        flags, epoch, spin_limit, status = ready.flags, ready.epoch, ready.spin_limit, ready.status
    _copy_rows_kernel[grid](local, peers, copies_dev, 0, len(copies), flags, epoch, spin_limit, status, W=W,
                            PUSH=push, ALIGNED=aligned, WAIT=ready is not None, BLOCK_R=block_r, BLOCK_W=block_w)


def _launch(table: np.ndarray, lo: int, hi: int, local: torch.Tensor, remotes: list[torch.Tensor], push: bool,
            num_programs: int | None) -> None:
    """The copies lo:hi of ``table`` between ``local`` and the tensors ``remotes`` (one per rank)."""
    _check_num_programs(num_programs)
    if hi <= lo or _row_width(local) == 0:
        return
    ptrs = [int(b.data_ptr()) for b in remotes]
    peers = torch.tensor(ptrs, dtype=torch.int64, device=local.device)
    launch_copies(table[lo:hi], local, peers, push=push, aligned=all(p % 16 == 0 for p in ptrs),
                  num_programs=num_programs)


def pull_rows_triton(pull: PullSchedule, rank: int, send_buffers: list[torch.Tensor],
                     recv: torch.Tensor | None = None, *, num_programs: int | None = None) -> torch.Tensor:
    """Dispatch of ``rank``: its pulls from the peers' send buffers into its receive buffer.

    send_buffers: R contiguous tensors of one dtype and row shape -> recv, rows 0:recv_rows[rank]
    as ``reference.ep.pull_rows(pull, send_buffers)[rank]``."""
    rank = _check_schedule_rank(pull, rank)
    R = pull.num_ranks
    _check_per_rank("send", send_buffers, R)
    first = _check_buffer("send buffer of rank 0", send_buffers[0], int(pull.send_rows[0]), None)
    bufs = [first] + [_check_buffer(f"send buffer of rank {s}", b, int(pull.send_rows[s]), first)
                      for s, b in enumerate(send_buffers[1:], start=1)]
    need = int(pull.recv_rows[rank])
    if recv is None:
        recv = torch.empty((need, *first.shape[1:]), dtype=first.dtype, device=bufs[rank].device)
    recv = _check_buffer(f"receive buffer of rank {rank}", recv, need, first)
    if recv.device != bufs[rank].device:
        raise InputError(f"receive buffer of rank {rank} is on {recv.device}, its send buffer on "
                         f"{bufs[rank].device}: both are this rank's")
    _check_device(recv)
    lo, hi = int(pull.pull_offsets[rank]), int(pull.pull_offsets[rank + 1])
    _launch(copy_table(pull, push=False), lo, hi, recv, bufs, False, num_programs)
    return recv


def push_rows_triton(pull: PullSchedule, rank: int, partial: torch.Tensor, combine_buffers: list[torch.Tensor],
                     *, num_programs: int | None = None) -> list[torch.Tensor]:
    """Combine of ``rank``: its partial rows (the receive layout) pushed into the sources' combine buffers.

    combine_buffers: R contiguous tensors, written in place with ``reference.ep.push_rows``'s values."""
    rank = _check_schedule_rank(pull, rank)
    R = pull.num_ranks
    partial = _check_buffer(f"partial buffer of rank {rank}", partial, int(pull.recv_rows[rank]), None)
    _check_per_rank("combine", combine_buffers, R)
    bufs = [_check_buffer(f"combine buffer of rank {s}", b, int(pull.send_rows[s]), partial)
            for s, b in enumerate(combine_buffers)]
    if bufs[rank].device != partial.device:
        raise InputError(f"combine buffer of rank {rank} is on {bufs[rank].device}, its partial buffer on "
                         f"{partial.device}: both are this rank's")
    _check_device(partial)
    lo, hi = int(pull.push_offsets[rank]), int(pull.push_offsets[rank + 1])
    _launch(copy_table(pull, push=True), lo, hi, partial, bufs, True, num_programs)
    return list(combine_buffers)


__all__ = ["ReadyWait", "copy_table", "launch_copies", "note_timeout", "pull_rows_triton", "push_rows_triton",
           "row_tile", "wait_flag"]


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
