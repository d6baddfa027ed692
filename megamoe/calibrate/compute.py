"""Calibration steps that measure tensor rates: tiles on chip and L2-fed (bf16, fp8), and every
tile-loop form in a dense GEMM from HBM.
"""

from __future__ import annotations

import statistics

from megamoe.reference.tiles import GEMM_LOOP_FORMS, gemm_loop_form_text

from .timing import graph_seconds

MMA_SHAPES = ((16, 64, 4, 128), (16, 128, 4, 128), (32, 64, 4, 128), (64, 64, 4, 64), (64, 128, 4, 64),
              (128, 128, 8, 64), (128, 256, 8, 64))
#: the on-chip mma step's shapes: MMA_SHAPES and the tuned multi-launch GEMM 1 tiles under 128 rows
MMA_TABLE_SHAPES = MMA_SHAPES + ((16, 256, 4, 64), (32, 256, 8, 64), (64, 256, 4, 64))


def _occupancy(kernel, warps: int) -> int | None:
    """Programs per SM from a compiled kernel's registers and shared memory (None if unknown)."""
    try:
        import triton

        props = triton.runtime.driver.active.utils.get_device_properties(0)
        regs = int(getattr(kernel, "n_regs", 0))
        smem = int(getattr(kernel.metadata, "shared", 0))
        by_regs = 65536 // max(1, regs * 32 * warps) if regs else 32
        by_smem = int(props.get("max_shared_mem", 232448)) // max(1, smem + 1024) if smem else 32
        return max(1, min(by_regs, by_smem, 64 // warps, 32))
    except Exception:  # noqa: BLE001 - the driver API differs between Triton versions
        return None


def measure_mma(reps: int, S: int, gap_s: float, quick: bool = False) -> dict:
    """Tensor rate per SM by tile shape and depth: the best of operands on chip (``mma_resident``)
    and 8S programs over 16 L2-resident operand copies at 3 and 4 stages ("points"); the compiled
    kernels' occupancy; the dense bf16 GEMM's sustained rate (cuBLAS), which caps the table."""
    import torch

    from . import microbench as mb

    depths = (1024,) if quick else (256, 1024, 4096)
    shapes = MMA_SHAPES[::3] if quick else MMA_TABLE_SHAPES
    P, Q = 8 * S, 16
    pts, occ, failed = [], {}, {}
    for bm, bn, w, bk in shapes:
        extra = (bm, bn, w, bk) not in MMA_SHAPES  # a small tile's shape: its failure drops it alone
        try:
            pts.extend(_mma_shape_points(mb, torch, bm, bn, w, bk, depths, P, Q, S, reps, gap_s, quick,
                                         occ=None if extra else occ))
        except Exception as exc:  # noqa: BLE001 - the other shapes' table still stands
            if not extra:
                raise
            failed[f"{bm}x{bn}x{w}"] = f"{type(exc).__name__}: {exc}"[:300]
    n = 4096 if quick else 8192  # a dense bf16 GEMM (cuBLAS): the rate it sustains
    a, b = (torch.randn((n, n), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    t = graph_seconds(lambda i: torch.matmul(a, b), inner=2, reps=reps)
    out = {"points": pts, "occupancy": {w: int(statistics.median(v)) for w, v in occ.items()},
           "dense_flops_per_s": 2.0 * n ** 3 / t}
    if failed:
        out["failed_shapes"] = failed
    return out


def _mma_shape_points(mb, torch, bm, bn, w, bk, depths, P, Q, S, reps, gap_s, quick, occ) -> list:
    """``measure_mma``'s points of one tile shape over ``depths``: [[bm, bn, w, d, best rate], ...]; the
    compiled kernels' occupancy into ``occ`` (by warps) unless it is None."""
    pts = []
    c = torch.empty((P, bm, bn), device="cuda", dtype=torch.bfloat16)
    for d in depths:
        a = torch.randn((Q, bm, d), device="cuda", dtype=torch.bfloat16)
        b = torch.randn((Q, d, bn), device="cuda", dtype=torch.bfloat16)
        ar, br = a[0, :, :bk].contiguous(), b[0, :bk, :].contiguous()  # operands on chip
        mb.mma_resident(ar, br, P, d // bk, num_warps=w, out=c)
        t = max(graph_seconds(lambda i, ar=ar, br=br, w=w, c=c, d=d, bk=bk:
                              mb.mma_resident(ar, br, P, d // bk, num_warps=w, out=c), inner=4, reps=reps) - gap_s,
                1e-7)
        rate = P * 2.0 * bm * bn * d / t / S
        fed = 0.0  # operands by pointer loads from L2
        for st in ((3,) if quick else (3, 4)):
            _, k = mb.mma(a, b, P, block_k=bk, num_warps=w, num_stages=st, out=c)
            t = max(graph_seconds(lambda i, a=a, b=b, bk=bk, w=w, c=c, st=st:
                                  mb.mma(a, b, P, block_k=bk, num_warps=w, num_stages=st, out=c),
                                  inner=4, reps=reps) - gap_s, 1e-7)
            fed = max(fed, P * 2.0 * bm * bn * d / t / S)
            rate = max(rate, fed)
            o = _occupancy(k, w) if occ is not None else None
            if o is not None:
                occ.setdefault(w, []).append(o)
        pts.append([bm, bn, w, d, rate])
    return pts


def measure_mma_fp8(reps: int, S: int, gap_s: float, quick: bool = False) -> dict:
    """FP8 tensor rate per SM (e4m3 x e4m3, fp32 accumulate) at the bf16 step's shapes and depths,
    operands on chip, 8S programs (no L2-fed variant: FP8 wgmma takes no N-contiguous B)."""
    import torch

    from . import microbench as mb

    depths = (1024,) if quick else (256, 1024, 4096)
    shapes = MMA_SHAPES[::3] if quick else MMA_SHAPES
    P = 8 * S
    pts = []
    for bm, bn, w, bk in shapes:
        c = torch.empty((P, bm, bn), device="cuda", dtype=torch.float32)
        a = torch.randn((bm, bk), device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn((bk, bn), device="cuda").to(torch.float8_e4m3fn)
        for d in depths:
            mb.mma_resident(a, b, P, d // bk, num_warps=w, out=c)
            t = max(graph_seconds(lambda i, w=w, c=c, d=d, bk=bk, a=a, b=b:
                                  mb.mma_resident(a, b, P, d // bk, num_warps=w, out=c), inner=4, reps=reps) - gap_s,
                    1e-7)
            pts.append([bm, bn, w, d, P * 2.0 * bm * bn * d / t / S])
    return {"points": pts}


#: rows and columns of the dense GEMM microbenchmark's output (operands in HBM, not L2)
GEMM_MN = 4096
#: its pipeline stages by warps
GEMM_STAGES = {4: 4, 8: 3}
#: the dense GEMM's loop forms -> their text in the profile's sources
GEMM_FORMS = {name: gemm_loop_form_text(name) for name in GEMM_LOOP_FORMS}
#: the dense-GEMM step's depths
GEMM_DEPTHS = (256, 1024, 4096, 16384)


def measure_gemm(reps: int, S: int, gap_s: float, quick: bool = False) -> dict:
    """Tensor rate per SM of each ``MMA_SHAPES`` tile loop in a dense bf16 GEMM C (4096, 4096) =
    A (4096, depth) @ W (4096, depth)^T from HBM, per loop form of microbench_gemm.LOADS:
    "points_<form>"."""
    import torch

    from .microbench_gemm import LOADS, dense_gemm

    depths = (1024,) if quick else GEMM_DEPTHS
    shapes = MMA_SHAPES[::3] if quick else MMA_SHAPES
    n = GEMM_MN
    out = {f"points_{form}": [] for form in LOADS}
    failed: dict[str, str] = {}
    c = torch.empty((n, n), device="cuda", dtype=torch.bfloat16)
    c_half = torch.empty((n, n // 2), device="cuda", dtype=torch.bfloat16)  # the gated forms' output
    for d in depths:
        a = torch.randn((n, d), device="cuda", dtype=torch.bfloat16)
        w = torch.randn((n, d), device="cuda", dtype=torch.bfloat16)
        for bm, bn, warps, bk in shapes:
            for form, gated in ((f, v.gated) for f, v in LOADS.items()):
                if form in failed:
                    continue
                # gated: a table row is the whole tile, two accumulators of bn / 2 columns
                stages = GEMM_STAGES[warps] + (1 if gated and warps == 8 else 0)
                kw = dict(block_m=bm, block_n=bn // 2 if gated else bn, block_k=bk, num_warps=warps,
                          num_stages=stages, loads=form, programs=S, out=c_half if gated else c)
                try:
                    t = max(graph_seconds(lambda i, kw=kw, a=a, w=w: dense_gemm(a, w, **kw), inner=2, reps=reps)
                            - gap_s, 1e-7)
                except Exception as exc:  # noqa: BLE001 - one loop form failing keeps the others' tables
                    failed[form] = f"{type(exc).__name__}: {exc}"[:300]
                    continue
                out[f"points_{form}"].append([bm, bn, warps, d, 2.0 * n * n * d / t / S])
    for form, why in failed.items():  # a table with some shapes missing would misprice them: none at all
        out.pop(f"points_{form}")
        out.setdefault("failed", {})[form] = why
    return out
