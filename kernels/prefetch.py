"""L2 prefetch of a weight tile with Hopper's bulk prefetch (``cp.async.bulk.prefetch.L2.global``).

Used by the megakernel's variant ``prefetch_wait``: a GEMM 2 task whose row block's GEMM 1 is not
done yet puts its own weight tile on the way into L2 before it waits, so that the wait overlaps
the tile's HBM reads (the down-projection weights do not depend on GEMM 1). H200 runs D and E
measured prefetching every task's tile as it starts, and a prefetch distance inside the GEMM
loops, slower (NOTES-gpu-runs.md); this variant, which prefetches only where a program would
otherwise spin, measured slower too at T = 1 (run M: Qwen3-30B-A3B 38.3 us against 36.6) and is off.

The helpers are no-ops unless ``ON`` (a constexpr the host sets on a CUDA device of compute
capability 9.0 or newer, never under the interpreter, which has no inline PTX): they only move data
into L2, so results are the same with and without them.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: bytes per prefetch are multiples of this (the instruction's granularity and alignment)
GRANULE = 16


def available(device) -> bool:
    """Whether the bulk L2 prefetch can be used on this torch device (Hopper or newer CUDA GPU)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def rows_ok(t) -> bool:
    """Whether a weight tensor (E, N, KD) can be prefetched as ranges of whole rows: rows contiguous
    and back to back (stride (N*KD, KD, 1)), row bytes and the tensor's address multiples of GRANULE."""
    if t is None or t.dim() != 3:
        return False
    _, n, kd = t.shape
    row_bytes = kd * t.element_size()
    return (t.stride(2) == 1 and t.stride(1) == kd and t.stride(0) == n * kd and row_bytes % GRANULE == 0
            and t.data_ptr() % GRANULE == 0)


#: one thread's bulk prefetch of $2 bytes at $1 into L2 (none when $2 is 0)
_PF = tl.constexpr("{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; "
                   "mov.u32 $0, 0; }")


@triton.jit
def _prefetch_bytes(ptr, nbytes, ON: tl.constexpr, NCHUNK: tl.constexpr):
    """Prefetch [ptr, ptr + nbytes) into L2 (nbytes a multiple of 16, ptr 16-byte aligned), split
    into NCHUNK pieces, one per thread (NCHUNK = the program's thread count)."""
    if ON:
        c = tl.arange(0, NCHUNK)
        chunk = (nbytes + NCHUNK * 16 - 1) // (NCHUNK * 16) * 16
        start = c.to(tl.int64) * chunk
        size = tl.minimum(tl.maximum(nbytes - start, 0), chunk).to(tl.int32)
        addr = ptr.to(tl.int64, bitcast=True) + start
        tl.inline_asm_elementwise(_PF, "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_rows(w_ptr, e, row0, nrows, N, KD, ON: tl.constexpr, NCHUNK: tl.constexpr):
    """Prefetch rows [row0, row0 + nrows) of expert e of a weight (E, N, KD) whose rows are back
    to back (``rows_ok``); the caller clips nrows to the rows that exist (<= 0: nothing)."""
    if ON:
        if nrows > 0:
            first = w_ptr + (e.to(tl.int64) * N + row0) * KD
            _prefetch_bytes(first, nrows.to(tl.int64) * KD * (w_ptr.dtype.element_ty.primitive_bitwidth // 8), ON,
                            NCHUNK)
