"""L2 prefetch of weight tiles with Hopper's bulk prefetch (``cp.async.bulk.prefetch.L2.global``).

At decode a GEMM tile is a few hundred KB of weights read once, and a program streams only as
fast as the bytes it has in flight: through the tile's software pipeline that is num_stages - 1
K-steps, bounded by shared memory (the H200 traces of 2026-12-01: about 20-30 GB/s per program,
where 34 GB/s on each of 132 SMs is what HBM gives). A GEMM loop with a prefetch distance D
issues, at K-step k, one bulk L2 prefetch per weight row of the tile for K-step k + D, so D more
steps are in flight without shared memory (``_gemm1_tile`` / ``_gemm2_tile``'s PF_DIST).

Measured and dropped (benchmarks/NOTES-gpu-runs.md, run D): prefetching a whole tile as its task
starts, which was slower everywhere (up to 470 MB requested at once against a 50 MB L2).

Callers enable a prefetch only on a CUDA device of compute capability 9.0 or newer (``available``),
never under the interpreter, which has no inline PTX; it only moves data into L2, so results are
the same with and without it.
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


@triton.jit
def _prefetch_l2(w_ptr, offsets, nbytes):
    """Prefetch nbytes (a multiple of 16; 0: nothing) from w_ptr + each element offset of
    ``offsets`` into L2, one bulk prefetch per element (callers pass a 1-D tensor of row starts)."""
    addr = (w_ptr + offsets).to(tl.int64, bitcast=True)
    size = tl.zeros_like(offsets).to(tl.int32) + nbytes
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)
