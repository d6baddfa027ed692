"""Stream-K segments of the megakernel's GEMM phases: K-tile ranges balanced over the programs.

Shape legend: J tiles of a phase (row blocks x N tiles, in grouped order), KT K tiles per tile,
U = J x KT units, Q segments, BM x BN a tile (GEMM 1: BM x 2BN, gate and up).

A phase's work is the U units laid end to end, tile after tile; segment q (one task, one ticket)
takes units [q U // Q, (q + 1) U // Q) (``reference.tiles.segment_bounds``, the same integers). With
Q = J every segment is one whole tile (the plain tile order); with Q = the programs (config
``stream_k``) every program gets the same number of K steps, where J tiles would leave a last
wave part-empty (Qwen3-30B-A3B at T = 1: 96 GEMM 1 tiles on 132 programs).

A segment's piece of a tile that it does not cover whole (at most its first and its last) stores
its fp32 sums in the segment's two workspace slots (2q: its first tile, 2q + 1: its last), then
counts itself on the tile's counter (release). The piece that completes the count sums every
piece's slot in segment order, a fixed order, so the result does not depend on which program
comes last (bitwise deterministic), runs the epilogue, signals the tile, and sets the counter back
to zero for the next launch. No piece waits for another: the plan's ticket order alone still
finishes the layer.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _seg_bounds(q, Q, U):
    """Units [u0, u1) of segment q of Q over U units (int64)."""
    q64 = q.to(tl.int64)
    return (q64 * U) // Q, ((q64 + 1) * U) // Q


@triton.jit
def _seg_tiles(u0, u1, KT):
    """int32 [first, end) of the tiles that units [u0, u1) touch (KT units a tile)."""
    return (u0 // KT).to(tl.int32), ((u1 + KT - 1) // KT).to(tl.int32)


@triton.jit
def _piece_k(u0, u1, j, KT):
    """int32 K tiles [k_lo, k_hi) of tile j inside units [u0, u1)."""
    return tl.maximum(u0 - j * KT, 0).to(tl.int32), tl.minimum(u1 - j * KT, KT).to(tl.int32)


@triton.jit
def _seg_of(u, Q, U):
    """The segment that holds unit u (int64)."""
    return ((u + 1) * Q - 1) // U


@triton.jit
def _slot(q, j, Q, U, KT):
    """Workspace slot of segment q's piece of tile j: 2q for the segment's first tile, 2q + 1 else."""
    q64 = U * 0 + q  # int64 (q may be a loop index)
    u0 = (q64 * U) // Q
    return 2 * q64 + (j != u0 // KT).to(tl.int64)


@triton.jit
def _arrive(cnt_ptr, j, Q, U, KT):
    """Count one piece of tile j done (after every thread's stores: barrier, acq_rel atomic);
    True for the piece that completes the tile, which also resets the counter."""
    tl.debug_barrier()
    old = tl.atomic_add(cnt_ptr + j, 1, sem="acq_rel")
    pieces = _seg_of((j + 1) * KT - 1, Q, U) - _seg_of(j * KT, Q, U) + 1
    last = old == pieces - 1
    if last:
        tl.store(cnt_ptr + j, 0)
    tl.debug_barrier()
    return last


@triton.jit
def _ws_offsets(BM: tl.constexpr, BN: tl.constexpr):
    """(BM, BN) offsets of one fp32 workspace tile."""
    return tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]


@triton.jit
def _store_piece(ws_ptr, slot, acc, BM: tl.constexpr, BN: tl.constexpr, PARTS: tl.constexpr, part):
    """acc (BM, BN) fp32 into part ``part`` of workspace slot ``slot`` (PARTS tiles per slot)."""
    tl.store(ws_ptr + (slot * PARTS + part) * (BM * BN) + _ws_offsets(BM, BN), acc)


@triton.jit
def _sum_pieces(ws_ptr, j, Q, U, KT, part, BM: tl.constexpr, BN: tl.constexpr, PARTS: tl.constexpr):
    """The fp32 sum of tile j's pieces (part ``part``), in segment order, read past L1 (.cg)."""
    offs = _ws_offsets(BM, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    for q in range(_seg_of(j * KT, Q, U), _seg_of((j + 1) * KT - 1, Q, U) + 1):
        slot = _slot(q, j, Q, U, KT)
        acc += tl.load(ws_ptr + (slot * PARTS + part) * (BM * BN) + offs, cache_modifier=".cg")
    return acc
