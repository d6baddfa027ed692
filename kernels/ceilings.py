"""The GPU's ceilings and the layer's floor: streaming-read bandwidth, bf16 and FP8 matmul rates, the
ideal grouped GEMM, and max(FLOPs / rate, bytes / bandwidth) of a layer (``floor_terms``).

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, m rows per expert.
"""

from __future__ import annotations

import math

from .jit_keys import settle
from .measure import graph_time_us

#: --dtype names -> the layer's FP8 mode (kernels.plan.FP8_MODES): None, "weights", "weights+act"
DTYPES = {"bf16": None, "fp8": "weights", "fp8-act": "weights+act"}


#: side of the square FP8 and bf16 matmuls of the ceilings
MATMUL_N = 8192


def _read_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _stream_read(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        pid = tl.program_id(0)
        acc = tl.zeros((BLOCK,), tl.float32)
        base = pid.to(tl.int64) * BLOCK * ITERS
        for i in range(ITERS):
            offs = base + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    return _stream_read


def fp8_matmul_rate(n: int = MATMUL_N) -> float:
    """FLOP/s of torch._scaled_mm on (n, n) e4m3 x (n, n) e4m3 -> bf16, per-tensor scales of 1."""
    import torch
    import triton

    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major
    one = torch.ones((), device="cuda", dtype=torch.float32)
    ms = triton.testing.do_bench(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                                 warmup=50, rep=300, return_mode="median")
    return 2 * n**3 / (ms * 1e-3)


def measure_ceilings() -> dict:
    """Streaming-read bytes/s, bf16 and FP8 matmul FLOP/s (None, with the error, where FP8 fails)."""
    import torch
    import triton

    kern = _read_kernel()
    n = (4 << 30) // 2
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    best_bw = 0.0
    for block, iters in ((4096, 8), (8192, 4), (2048, 16)):
        nprog = triton.cdiv(n, block * iters)
        out = torch.empty(nprog, device="cuda", dtype=torch.float32)
        ms = triton.testing.do_bench(lambda nprog=nprog, out=out, block=block, iters=iters: kern[(nprog,)](
                                         x, out, n, BLOCK=block, ITERS=iters, num_warps=8),
                                     warmup=25, rep=200, return_mode="median")
        best_bw = max(best_bw, n * 2 / (ms * 1e-3))
    m = MATMUL_N
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    ceil = {"read_bytes_per_s": best_bw, "matmul_flops_per_s": 2 * m**3 / (ms * 1e-3)}
    try:
        ceil["fp8_matmul_flops_per_s"] = fp8_matmul_rate(m)
    except Exception as exc:  # noqa: BLE001 - no FP8 matmul here: fp8 rows get no FP8 floor
        ceil.update(fp8_matmul_flops_per_s=None, fp8_matmul_error=f"{type(exc).__name__}: {exc}"[:300])
    torch.cuda.empty_cache()
    return ceil


def ideal_grouped_rate(cfg, T: int, reps: int = 20) -> float:
    """FLOP/s of torch.bmm over E experts of m = ceil(T*K/E) rows (gate/up then down): the ideal."""
    import torch

    E, H, I, K = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    m = max(1, math.ceil(T * K / E))
    dt = torch.bfloat16
    xa = torch.randn(E, m, H, device="cuda", dtype=dt)
    wgu = torch.randn(E, H, 2 * I, device="cuda", dtype=dt)
    ha = torch.randn(E, m, I, device="cuda", dtype=dt)
    wd = torch.randn(E, I, H, device="cuda", dtype=dt)

    def f(_):
        torch.bmm(xa, wgu)
        torch.bmm(ha, wd)

    us = graph_time_us(f, [None, None], reps)
    flops = 2 * E * m * (H * 2 * I + I * H)
    return flops / (us * 1e-6)


def floor_terms(cfg, T: int, experts_touched: float, dtype: str = "bf16") -> tuple[float, float]:
    """(FLOPs, bytes) of the layer (``reference.sizes``); ``dtype`` a ``DTYPES`` name."""
    from ..reference.sizes import layer_bytes, layer_flops

    wd = "bfloat16" if DTYPES[dtype] is None else "fp8_e4m3"
    return layer_flops(cfg, T), layer_bytes(cfg, T, experts_touched, wd, io_dtype="bfloat16")


def floor_matmul_rate(ceil: dict, dtype: str) -> tuple[str, float | None]:
    """(which, FLOP/s) of the floor's compute term: the FP8 rate with FP8 activations, else bf16's."""
    if DTYPES[dtype] == "weights+act":
        return "fp8", ceil.get("fp8_matmul_flops_per_s")
    return "bf16", ceil["matmul_flops_per_s"]


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
