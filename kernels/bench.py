"""``megamoe bench``: the fused MoE layer against its floor, the ideal grouped GEMM and PyTorch, on a GPU.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, m rows per expert.

Per (preset, T, dtype) row, all in one run on one GPU:
    ceilings     streaming-read bandwidth (Triton read kernel over 4 GiB), bf16 matmul rate
                 (8192^3), FP8 matmul rate (torch._scaled_mm, e4m3 x e4m3 8192^3, per-tensor
                 scales; None and the error recorded where it fails), and the ideal grouped GEMM:
                 torch.bmm over E experts of m = ceil(T*K/E) rows each (gate/up and down), its FLOP rate
    floor        max(FLOPs / matmul rate, bytes / bandwidth); bytes = weights of the experts touched
                 (as routed) + router weight + x read + y written (``reference.sizes.layer_bytes``);
                 fp8 rows count e4m3 weights with their block scales, and the FP8 matmul rate where
                 the activations are FP8 too (weight-only FP8 multiplies in bf16)
    ours         megamoe.kernels.moe_forward, whole layer with routing, CUDA graph of NI calls on
                 NI fresh random inputs, median over replays, per call
    torch        the plain PyTorch pipeline (router, sort, torch._grouped_mm, activation,
                 torch._grouped_mm, weighted index_add), captured and timed the same way
``--dtype bf16,fp8,fp8-act`` (``DTYPES``): bf16 weights; e4m3 weights with 128 x 128 block scales,
quantized on the GPU from the same bf16 weights (fp8_weights.py); the same with FP8 activations.
FP8 runs where ``--backend auto`` sends it (the FP8 mode's measured table, configs.select_backend;
the multi-launch backend where there is none) and on the megakernel with ``--backend megakernel`` (its FP8 tiles, fp8_gemm.py's); the rows of one (preset, T) run back to back on the same inputs, and fp8 rows carry
``speedup_vs_bf16`` (the bf16 row's time on the same backend over theirs).
Rows are printed and appended as JSON lines (with GPU, versions, date and the code: the HEAD commit,
a ``dirty`` flag and a hash of ``git diff HEAD``; see ``git_state``) to
benchmarks/results/kernels_<date>.jsonl (or --out). ``--tune`` searches the GEMM configs per
shape and T bucket and writes kernels/configs/<gpu>__<dtype>__triton-<v>.json.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b")
TOKENS = (1, 8, 64, 512, 4096, 16384)
#: vLLM 0.33 fused_moe Triton kernels on an H200, us, without router/align (shared/facts/h200-measured.md)
VLLM_US = {
    ("mixtral-8x7b", 1): 200.7, ("mixtral-8x7b", 8): 668.3, ("mixtral-8x7b", 64): 689.8,
    ("mixtral-8x7b", 512): 1186.3, ("mixtral-8x7b", 4096): 6139.6, ("mixtral-8x7b", 16384): 23099.4,
    ("qwen3-30b-a3b", 1): 45.9, ("qwen3-30b-a3b", 8): 156.8, ("qwen3-30b-a3b", 64): 311.6,
    ("qwen3-30b-a3b", 512): 360.2, ("qwen3-30b-a3b", 4096): 989.4, ("qwen3-30b-a3b", 16384): 3277.7,
    ("deepseek-v3", 1): 208.6, ("deepseek-v3", 8): 1289.2, ("deepseek-v3", 64): 4456.5,
    ("deepseek-v3", 512): 5524.3, ("deepseek-v3", 4096): 9692.2, ("deepseek-v3", 16384): 29554.7,
}
REPO = Path(__file__).resolve().parent.parent
#: --dtype names -> the layer's FP8 mode (kernels.plan.FP8_MODES): None, "weights", "weights+act"
DTYPES = {"bf16": None, "fp8": "weights", "fp8-act": "weights+act"}
#: side of the square FP8 and bf16 matmuls of the ceilings
MATMUL_N = 8192


def bench_config(name: str):
    """The preset as benchmarked: DeepSeek-V3's routed experts only (as in vLLM's figures)."""
    from ..reference import MoEConfig

    cfg = MoEConfig.preset(name)
    if name == "deepseek-v3":
        cfg = cfg.replace(num_shared_experts=0, shared_intermediate_size=0)
    return cfg


# --------------------------------------------------------------------------- provenance
class ProvenanceError(ValueError):
    """The commit given for a results row is not one anybody could check out."""


def _git(*argv: str, repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *argv], cwd=repo, capture_output=True, timeout=30)


def git_state(repo: Path = REPO) -> dict:
    """{"commit", "dirty", "diff_sha256"}: the code a results row was made with.

    ``commit`` is the full HEAD commit (one that exists, so it can be checked out); ``dirty`` is
    True when tracked files differ from it (untracked files are not counted), and then
    ``diff_sha256`` is the SHA-256 of ``git diff HEAD`` (binary), so that a run from the same
    uncommitted changes can be recognized; None when clean. Without git or outside a checkout (a
    copied tree, as on the GPU machines) the three come from MEGAMOE_COMMIT (7 to 40 hex digits;
    anything else, like ``bd5693b+final``, is refused), MEGAMOE_DIRTY (0 or 1) and
    MEGAMOE_DIFF_SHA256, set from the checkout the tree was copied from::

        MEGAMOE_COMMIT=$(git rev-parse HEAD) MEGAMOE_DIRTY=$(git diff HEAD --quiet; echo $?) \
        MEGAMOE_DIFF_SHA256=$(git diff HEAD --binary | sha256sum | cut -c1-64)

    and ``commit`` is "unknown" when neither is there.
    """
    import hashlib
    import re

    try:
        head = _git("rev-parse", "--verify", "HEAD", repo=repo)
        top = _git("rev-parse", "--show-toplevel", repo=repo)
        inside = head.returncode == 0 and Path(top.stdout.decode().strip()).resolve() == Path(repo).resolve()
    except (OSError, subprocess.SubprocessError):
        inside = False
    if inside:
        diff = _git("diff", "HEAD", "--binary", repo=repo).stdout
        return {"commit": head.stdout.decode().strip(), "dirty": bool(diff),
                "diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None}
    commit = os.environ.get("MEGAMOE_COMMIT")
    if commit is None:
        return {"commit": "unknown", "dirty": None, "diff_sha256": None}
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        raise ProvenanceError(f"MEGAMOE_COMMIT={commit!r} is not a commit id (7 to 40 hex digits); give "
                              f"$(git rev-parse HEAD) and mark local changes with MEGAMOE_DIRTY=1 and "
                              f"MEGAMOE_DIFF_SHA256")
    dirty = os.environ.get("MEGAMOE_DIRTY")
    if dirty not in (None, "0", "1"):
        raise ProvenanceError(f"MEGAMOE_DIRTY={dirty!r} must be 0 or 1")
    sha = os.environ.get("MEGAMOE_DIFF_SHA256") or None
    if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ProvenanceError(f"MEGAMOE_DIFF_SHA256={sha!r} must be 64 hex digits (sha256sum of git diff HEAD)")
    return {"commit": commit, "dirty": None if dirty is None else dirty == "1", "diff_sha256": sha}


def provenance() -> dict:
    """GPU, versions, date and ``git_state()`` (commit, dirty, diff_sha256) for a results row."""
    import torch
    import triton

    return {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
        **git_state(), "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


# --------------------------------------------------------------------------- timing
def inputs_per_graph(T: int) -> int:
    """NI: fresh inputs (and layer calls) captured in one CUDA graph of T-token calls; every timing of
    the layer and the cost model's amortized graph cost (megamoe.predict, calls_per_graph) read this."""
    return 8 if T <= 512 else (4 if T <= 4096 else 2)


#: eager calls ``graph_time_us`` makes before it captures the graph
WARMUP_CALLS = 2


def graph_time_us(fn, inputs: list, reps: int, clock: dict | None = None) -> float:
    """Median per-call time (us) of fn over the NI inputs, captured as one CUDA graph of NI calls.

    The warm-up calls and the capture run on the same side stream, so that what a call keeps per
    stream (the megakernel's zeroed sync words, ``megakernel.sync_buffer``) is made once outside
    the capture and the graph holds the kernels alone, as an eager call would run them. In order:
    WARMUP_CALLS eager calls, the capture, one untimed replay, ``reps`` timed replays, all back to
    back (``calls_before_timed_replay``). ``clock``, a dict, is filled with the SM clock and power
    sampled over the timed replays (``telemetry.ClockSampler``'s summary; left empty without NVML)."""
    import torch

    from .telemetry import sampled

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for a in inputs[:WARMUP_CALLS]:
            fn(a)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for a in inputs:
            fn(a)
    g.replay()
    torch.cuda.synchronize()
    times = []
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with sampled(clock):
        for _ in range(reps):
            st.record()
            g.replay()
            en.record()
            en.synchronize()
            times.append(st.elapsed_time(en) * 1e3 / len(inputs))
    del g
    return statistics.median(times)


def calls_before_timed_replay(ni: int, reps: int) -> float:
    """Calls ``graph_time_us`` runs back to back before the replay whose time is its median, for a
    graph of ``ni`` calls timed ``reps`` times: the warm-up calls, the untimed replay and the
    (reps - 1) / 2 timed replays before the middle one (half-way between the two middle ones for an
    even reps). Later replays run after more busy time (and, where the SM clock falls, slower), so
    the median is the middle replay's. The cost model's busy window (``simulator.cost.busy_window_s``,
    read by the sustained-clock term) starts there."""
    ni, reps = max(int(ni), 1), max(int(reps), 1)
    return min(WARMUP_CALLS, ni) + ni * (1 + (reps - 1) / 2)


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
    """FLOP/s of torch._scaled_mm on (n, n) e4m3 x (n, n) e4m3 -> bf16, fp32 accumulate: A row-major,
    B column-major (as _scaled_mm requires), per-tensor float32 scales of 1."""
    import torch
    import triton

    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major
    one = torch.ones((), device="cuda", dtype=torch.float32)
    ms = triton.testing.do_bench(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                                 warmup=50, rep=300, return_mode="median")
    return 2 * n**3 / (ms * 1e-3)


def measure_ceilings() -> dict:
    """Streaming-read bytes/s (best of a few grids), bf16 matmul FLOP/s and FP8 matmul FLOP/s
    (``fp8_matmul_flops_per_s``; None with ``fp8_matmul_error`` where _scaled_mm fails), measured now."""
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


# --------------------------------------------------------------------------- PyTorch pipeline
def torch_route(x, w, cfg):
    import torch

    logits = (x @ w.router_weight.t()).float()
    if w.router_bias is not None:
        logits = logits + w.router_bias.float()
    K, E = cfg.top_k, cfg.num_experts
    if cfg.router == "softmax_topk":
        p = torch.softmax(logits, dim=-1)
        tw, ti = torch.topk(p, K, dim=-1)
        if cfg.norm_topk_prob:
            tw = tw / tw.sum(-1, keepdim=True)
    elif cfg.router == "topk_softmax":
        tl_, ti = torch.topk(logits, K, dim=-1)
        tw = torch.softmax(tl_, dim=-1)
    elif cfg.router == "sigmoid_top1_input":
        tl_, ti = torch.topk(logits, K, dim=-1)
        tw = torch.sigmoid(tl_)
    else:
        s = torch.sigmoid(logits)
        b = s + w.score_bias.float() if w.score_bias is not None else s
        if cfg.n_group > 1:
            T = b.shape[0]
            gs = b.view(T, cfg.n_group, -1).topk(2, dim=-1)[0].sum(-1)
            gi = gs.topk(cfg.topk_group, dim=-1)[1]
            keep = torch.zeros_like(gs).scatter_(1, gi, 1.0).repeat_interleave(E // cfg.n_group, dim=1)
            b = b.masked_fill(keep == 0, 0.0 if cfg.group_mask == "zero" else float("-inf"))
        ti = b.topk(K, dim=-1)[1]
        tw = s.gather(1, ti)
        if cfg.norm_topk_prob:
            tw = tw / (tw.sum(-1, keepdim=True) + 1e-20)
        tw = tw * cfg.routed_scaling_factor
    return tw, ti


def torch_moe(x, w, cfg):
    """The plain PyTorch layer: route, sort by expert, torch._grouped_mm twice, weighted index_add."""
    import torch
    import torch.nn.functional as F

    from .torch_ffn import gated_activation

    T, H = x.shape
    E, K, I = cfg.num_experts, cfg.top_k, cfg.intermediate_size
    tw, ti = torch_route(x, w, cfg)
    flat = ti.reshape(-1)
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    tok = order // K
    counts = torch.zeros(E, device=x.device, dtype=torch.int32).scatter_add_(
        0, flat.to(torch.int64), torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    xs = x[tok]
    wflat = tw.reshape(-1)[order]
    if cfg.weight_on_input:
        xs = (xs.float() * wflat[:, None]).to(x.dtype)
    h = torch._grouped_mm(xs, w.gate_up.transpose(1, 2), offs=offs)
    if w.gate_up_bias is not None:
        h = h + w.gate_up_bias[sorted_e]
    a = gated_activation(h, I, cfg.activation, cfg.swiglu_alpha, cfg.swiglu_limit)
    o = torch._grouped_mm(a.contiguous(), w.down.transpose(1, 2), offs=offs)
    if w.down_bias is not None:
        o = o + w.down_bias[sorted_e]
    if not cfg.weight_on_input:
        o = o * wflat[:, None].to(o.dtype)
    y = torch.zeros(T, H, device=x.device, dtype=x.dtype).index_add_(0, tok, o)
    if cfg.num_shared_experts:
        Is = cfg.shared_intermediate_size
        hs = x @ w.shared_gate_up.t()
        ys = (F.silu(hs[:, :Is]) * hs[:, Is:]) @ w.shared_down.t()
        if w.shared_gate is not None:
            ys = ys * torch.sigmoid(x @ w.shared_gate)[:, None]
        y = y + ys
    return y


# --------------------------------------------------------------------------- weights and floor
def random_device_weights(cfg, seed: int = 0):
    """bf16 weights on the GPU, N(0, 1/fan_in), made on the device (a full DeepSeek-V3 layer is 22 GB)."""
    import torch

    from ..reference import MoEWeights, expected_shapes

    gen = torch.Generator(device="cuda").manual_seed(seed)
    H, I = cfg.hidden_size, cfg.intermediate_size
    fan = {"router_weight": H, "gate_up": H, "down": I, "shared_gate_up": H,
           "shared_down": max(cfg.shared_intermediate_size, 1), "shared_gate": H}
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if shape is None:
            continue
        t = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        scale = fan[name] ** -0.5 if name in fan else (0.05 if name == "score_bias" else 0.1)
        out[name] = t.mul_(scale)
    return MoEWeights(**out)


def floor_terms(cfg, T: int, experts_touched: float, dtype: str = "bf16") -> tuple[float, float]:
    """(FLOPs, bytes) of the layer: weights of the experts touched, router, x and y
    (``reference.sizes``: the one place expert bytes and FLOPs are counted); ``dtype`` a ``DTYPES``
    name: fp8 rows count e4m3 weights with their block scales, x and y in bf16 all the same."""
    from ..reference.sizes import layer_bytes, layer_flops

    wd = "bfloat16" if DTYPES[dtype] is None else "fp8_e4m3"
    return layer_flops(cfg, T), layer_bytes(cfg, T, experts_touched, wd, io_dtype="bfloat16")


def floor_matmul_rate(ceil: dict, dtype: str) -> tuple[str, float | None]:
    """(which, FLOP/s) of the floor's compute term: the FP8 matmul rate when the activations are FP8
    too, the bf16 one otherwise (weight-only FP8 converts the weights and multiplies in bf16);
    None where the FP8 rate was not measured."""
    if DTYPES[dtype] == "weights+act":
        return "fp8", ceil.get("fp8_matmul_flops_per_s")
    return "bf16", ceil["matmul_flops_per_s"]


def skip_reason(dtype: str, backend: str) -> str | None:
    """Why rows of ``dtype`` are not run on ``backend`` (None: they run; every dtype runs on every
    backend since the megakernel has FP8 tiles; "auto" as moe_forward picks)."""
    if dtype not in DTYPES:
        return f"dtype {dtype!r} is not one of {list(DTYPES)}"
    return None


#: the multi-launch pipeline's prefixes the per-stage breakdown times (kernels.moe._forward's stop_after)
BREAKDOWN_STOPS = ("align", "gemm1", "gemm2")


def stage_split(prefix_us: dict, total_us: float) -> dict:
    """The multi-launch path's stages from the times of its prefixes (BREAKDOWN_STOPS -> us) and
    of the whole layer: router+align, GEMM 1, GEMM 2 (with the shared MLP), combine, each the
    difference of two times (so noise where the two are large and the stage small)."""
    return {"router+align": prefix_us["align"], "gemm1": prefix_us["gemm1"] - prefix_us["align"],
            "gemm2": prefix_us["gemm2"] - prefix_us["gemm1"], "combine": total_us - prefix_us["gemm2"]}


# --------------------------------------------------------------------------- one row
def bench_row(name: str, cfg, w, T: int, ceil: dict, *, reps: int, with_torch: bool = True,
              with_ideal: bool = True, deterministic: bool = True, breakdown: bool = False,
              backend: str = "auto", dtype: str = "bf16") -> dict:
    """One row: ``w`` the weights of ``dtype`` (a ``DTYPES`` name; FP8 ones from fp8_weights.to_fp8).
    FP8 rows run on the multi-launch backend and leave out the PyTorch pipeline, the ideal grouped
    GEMM and vLLM (bf16 figures: the bf16 row of the same run has them)."""
    import torch

    from ..reference.sizes import ffn_flops
    from . import moe as kmoe

    H = cfg.hidden_size
    fp8 = DTYPES[dtype]
    if fp8 is not None and not w.is_fp8:
        raise ValueError(f"dtype {dtype} needs FP8 weights (fp8_weights.to_fp8), got float ones")
    fp8_act = fp8 == "weights+act"
    ni = inputs_per_graph(T)
    gen = torch.Generator(device="cuda").manual_seed(1000 + T)
    xs = [torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(ni)]
    touched = []
    for x in xs[:4]:
        d = kmoe.moe_forward_details(x, w, cfg)
        touched.append(int((d["counts"] > 0).sum().item()))
    et = sum(touched) / len(touched)
    kmoe.check_inputs(xs[0], w, cfg)
    ran = kmoe.resolve_backend(backend, cfg, T, xs[0].dtype, xs[0].device, fp8=fp8)  # FP8: backend_fp8's table
    if fp8 is None:
        config = kmoe.kernel_config(cfg, T, torch.bfloat16, xs[0].device)
    elif ran == "multi":
        config = kmoe.static_plan_for(cfg, T, xs[0].dtype, xs[0].device, deterministic, fp8=fp8).gemm
    else:
        from .megakernel import megakernel_config

        config = megakernel_config(cfg, T, xs[0].dtype, xs[0].device, fp8=fp8)
    ours = graph_time_us(lambda x: kmoe.moe_forward(x, w, cfg, deterministic=deterministic, check=False,
                                                    backend=ran, fp8_activations=fp8_act), xs, reps)
    flops, byt = floor_terms(cfg, T, et, dtype)
    mm_kind, mm_rate = floor_matmul_rate(ceil, dtype)
    floor_us = max(flops / mm_rate, byt / ceil["read_bytes_per_s"]) * 1e6 if mm_rate else None
    row = {
        "preset": name, "T": T, "dtype": dtype, "experts_touched": et, "flops": flops, "bytes": byt,
        "floor_us": floor_us, "floor_matmul": mm_kind, "ours_us": ours,
        "ours_over_floor": ours / floor_us if floor_us else None,
        "ours_tflops": flops / (ours * 1e-6) / 1e12, "deterministic": deterministic, "backend": ran,
        "config": config,
    }
    if floor_us is None:
        row["floor_error"] = f"no {mm_kind} matmul rate: {ceil.get('fp8_matmul_error', 'not measured')}"[:300]
    if fp8 is not None:
        with_torch = with_ideal = False
    if with_torch:
        try:
            tt = graph_time_us(lambda x: torch_moe(x, w, cfg), xs, max(5, reps // 2))
            row.update(torch_us=tt, speedup_vs_torch=tt / ours)
        except Exception as exc:  # noqa: BLE001 - record why, keep going
            row.update(torch_us=None, torch_error=f"{type(exc).__name__}: {exc}"[:300])
    if with_ideal and T >= 512:
        ideal = ideal_grouped_rate(cfg, T)
        routed_flops = ffn_flops(T * cfg.top_k, H, cfg.intermediate_size)
        row.update(ideal_tflops=ideal / 1e12, ours_routed_tflops=routed_flops / (ours * 1e-6) / 1e12,
                   ours_over_ideal_rate=routed_flops / (ours * 1e-6) / ideal)
    if breakdown and ran == "multi":  # CUDA-graph times of the pipeline's prefixes; differences are the stages
        prefix = {stop: graph_time_us(lambda x, stop=stop: kmoe._forward(x, w, cfg, deterministic, stop,
                                                                         fp8_activations=fp8_act), xs, reps)
                  for stop in BREAKDOWN_STOPS}
        row.update(stage_us=stage_split(prefix, ours))
    v = VLLM_US.get((name, T)) if fp8 is None else None
    if v:
        row.update(vllm_us=v, speedup_vs_vllm=v / ours)
    del xs
    return row


def fmt_num(v, spec: str) -> str:
    """``v`` formatted with ``spec``, or "-" in the same width where it is not a number (a figure
    the row did not get); the printed tables of the benchmarks use it."""
    return format(v, spec) if isinstance(v, (int, float)) else "-".rjust(len(format(0.0, spec)))


def fmt_row(r: dict) -> str:
    def f(k, spec):
        return fmt_num(r.get(k), spec)

    return (f"{r['preset']:<16}{r['T']:>6} {r.get('dtype', 'bf16'):>7} {f('floor_us', '10.1f')} {f('ours_us', '10.1f')} "
            f"{f('ours_over_floor', '6.2f')} {f('speedup_vs_bf16', '6.2f')} {f('torch_us', '10.1f')} "
            f"{f('speedup_vs_torch', '6.2f')} "
            f"{f('vllm_us', '9.1f')} {f('speedup_vs_vllm', '6.2f')} {f('ours_over_ideal_rate', '6.2f')} "
            f"{f('ours_tflops', '7.1f')}")


HEADER = (f"{'preset':<16}{'T':>6} {'dtype':>7} {'floor us':>10} {'ours us':>10} {'o/fl':>6} {'xbf16':>6} {'torch us':>10} "
          f"{'xtorch':>6} {'vllm us':>9} {'xvllm':>6} {'o/idl':>6} {'TFLOP/s':>7}")


def dtype_rows(run_one, dtypes, backend: str, emit, key: dict, log=print) -> None:
    """The rows of one (preset, T, combine mode), in ``dtypes`` order: ``run_one(dtype)`` -> row,
    each handed to ``emit`` as it is made. A dtype the backend cannot run gives a skip row (``key``,
    dtype, backend and ``skipped``: why); one that raises is logged and left out, the others go on.
    fp8 rows get the bf16 row's time (``bf16_us``, ``bf16_backend``) and, where both ran on the same
    backend, ``speedup_vs_bf16`` = bf16 time / their time."""
    bf16 = None
    for dt in dtypes:
        why = skip_reason(dt, backend)
        if why:
            log(f"{dt}: skipped: {why}")
            emit({**key, "dtype": dt, "backend": backend, "skipped": why})
            continue
        try:
            r = run_one(dt)
        except Exception as exc:  # noqa: BLE001 - one failed row must not lose the others
            log(f"{dt} failed: {type(exc).__name__}: {str(exc)[:500]}")
            continue
        if DTYPES[dt] is None:
            bf16 = r
        elif bf16 is not None:
            r.update(bf16_us=bf16["ours_us"], bf16_backend=bf16["backend"])
            if bf16["backend"] == r["backend"]:
                r["speedup_vs_bf16"] = bf16["ours_us"] / r["ours_us"]
        emit(r)


# --------------------------------------------------------------------------- tuning
def _candidates(rows_per_expert: float) -> tuple[list[dict], list[dict]]:
    """(gemm1 candidates, gemm2 candidates) for a T bucket; a pair must share BLOCK_M.

    Decode streams weights (narrow N tiles, deep K, many programs); in between, BLOCK_M decides how
    often an expert's weights are re-read (once per row block); prefill wants 64-128 row tiles."""
    def c(bm, bn, bk, nw, ns, sk=1):
        return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=nw, num_stages=ns, SPLIT_K=sk)

    if rows_per_expert <= 4:
        shapes = ((32, 128, 4, 4), (64, 128, 4, 4), (64, 256, 4, 3), (32, 256, 4, 4), (128, 128, 4, 3),
                  (64, 64, 4, 5), (64, 128, 4, 4, 2), (64, 128, 4, 4, 4), (32, 128, 4, 4, 2), (32, 128, 4, 4, 4),
                  (128, 128, 4, 3, 2), (128, 128, 4, 3, 4), (64, 256, 4, 3, 2))
        return [c(16, *t) for t in shapes], [c(16, *t) for t in shapes]
    if rows_per_expert <= 64:
        shapes = ((64, 128, 4, 3), (32, 128, 4, 4), (128, 64, 4, 4), (128, 128, 8, 3))
        bms = (16, 32, 64)
        return [c(bm, *t) for bm in bms for t in shapes], [c(bm, *t) for bm in bms for t in shapes]
    s1 = ((128, 64, 8, 3), (64, 64, 4, 4), (128, 64, 4, 4), (64, 128, 4, 3), (128, 64, 8, 4))
    s2 = ((256, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (128, 64, 4, 4), (256, 64, 8, 4))
    return [c(bm, *t) for bm in (64, 128) for t in s1], [c(bm, *t) for bm in (64, 128) for t in s2]


def tune_shape(cfg, w, T: int, reps: int = 10, log=print) -> dict:
    """Best (gemm1, gemm2) for this shape at T: each GEMM timed alone on the real routing, per BLOCK_M,
    as CUDA-graph replays (graph_time_us), the way the layer runs, not eager launches."""
    import torch
    import triton

    from . import configs as cfgs
    from .align import launch_align
    from .grouped_gemm import launch_gemm1, launch_gemm2
    from .routing import launch_router

    E, K, H, I = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    c1, c2 = _candidates(T * K / E)
    g1s = {json.dumps(a, sort_keys=True): a for a in c1}
    g2s = {json.dumps(b, sort_keys=True): b for b in c2}
    dev = x.device
    i32 = torch.int32
    block_t = cfgs.router_block_t(T, E)
    C = triton.cdiv(T, block_t)
    topk_idx = torch.empty((T, K), device=dev, dtype=i32)
    topk_w = torch.empty((T, K), device=dev, dtype=torch.float32)
    hist = torch.empty((C, E), device=dev, dtype=i32)
    launch_router(x, w, cfg, topk_idx, topk_w, hist, None, block_t)
    metas = {}
    for bm in sorted({a["BLOCK_M"] for a in g1s.values()}):
        P_max = cfgs.max_padded_rows(T * K, E, bm)
        meta = {k: torch.empty(n, device=dev, dtype=i32) for k, n in (
            ("chunk_base", (C, E)), ("counts", (E,)), ("padded_offsets", (E + 1,)), ("padded_token", (P_max,)),
            ("padded_pair", (P_max,)), ("block_expert", (P_max // bm,)), ("pair_dest", (T * K,)))}
        launch_align(topk_idx, hist, E, block_t, bm, meta)
        act = torch.randn((P_max, I), device=dev, dtype=torch.bfloat16)
        metas[bm] = (meta, act, P_max // bm)
    outs = {}

    def in_graph_ms(f):
        """ms per launch of f, as the layer runs it: 4 launches captured in a CUDA graph, median of replays."""
        return graph_time_us(lambda _a: f(), [None] * 4, max(5, reps)) / 1e3

    def out_for(split):
        if split not in outs:
            outs[split] = torch.empty((split * T * K, H), device=dev,
                                      dtype=torch.float32 if split > 1 else torch.bfloat16)
        return outs[split]

    def t1(c):
        meta, act, nm = metas[c["BLOCK_M"]]
        f = lambda: launch_gemm1(x, w.gate_up, w.gate_up_bias, act, meta, topk_w, c,  # noqa: E731
                                 activation=cfg.activation, alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit,
                                 scale_input=cfg.weight_on_input, dense=False, num_m=nm)
        return in_graph_ms(f)

    def t2(c):
        meta, act, nm = metas[c["BLOCK_M"]]
        sk = c.get("SPLIT_K", 1)
        out = out_for(sk)
        f = lambda: launch_gemm2(act, w.down, w.down_bias, out, meta, None if cfg.weight_on_input else topk_w, c,  # noqa: E731
                                 T=T, K=K, KS=K, dense=False, atomic=False, num_m=nm, split=sk)
        return in_graph_ms(f)

    res1, res2 = {}, {}
    for k, c in g1s.items():
        try:
            res1[k] = t1(c)
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory
            log(f"    gemm1 {c} failed: {type(exc).__name__}")
    for k, c in g2s.items():
        try:
            res2[k] = t2(c)
        except Exception as exc:  # noqa: BLE001
            log(f"    gemm2 {c} failed: {type(exc).__name__}")
    best = None
    for bm in metas:
        b1 = min(((v, k) for k, v in res1.items() if g1s[k]["BLOCK_M"] == bm), default=None)
        b2 = min(((v, k) for k, v in res2.items() if g2s[k]["BLOCK_M"] == bm), default=None)
        if b1 and b2 and (best is None or b1[0] + b2[0] < best[0]):
            best = (b1[0] + b2[0], g1s[b1[1]], g2s[b2[1]], b1[0], b2[0])
    if best is None:
        raise RuntimeError(f"no config ran for {cfg.name} T={T}")
    log(f"    T={T}: gemm1 {best[3]*1e3:.1f} us {best[1]}  gemm2 {best[4]*1e3:.1f} us {best[2]}")
    return {"gemm1": best[1], "gemm2": best[2]}


def tune(presets, tokens, log=print, budget_s: float = 480.0) -> Path:
    """Tune every (preset shape, T bucket) and write the tuned JSON (merged with what is there)."""
    import torch
    import triton

    from . import configs as cfgs

    gpu = torch.cuda.get_device_name(0)
    path = cfgs.config_path(gpu, "bfloat16", triton.__version__)
    data = {"gpu": gpu, "dtype": "bfloat16", "triton": triton.__version__, "configs": {}}
    if path.exists():
        data = json.loads(path.read_text())
    t0 = time.time()
    for name in presets:
        cfg = bench_config(name)
        w = random_device_weights(cfg)
        key = cfgs.shape_key(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k)
        log(f"tuning {name} ({key})")
        for T in tokens:
            if time.time() - t0 > budget_s:
                log(f"  tuning budget of {budget_s:.0f} s spent: stopping before {name} T={T}")
                break
            entry = tune_shape(cfg, w, T, log=log)
            data["configs"].setdefault(key, {})[str(cfgs.bucket_of(T))] = entry
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        del w
        torch.cuda.empty_cache()
    cfgs._tuned.cache_clear()
    cfgs.load_file(path)  # fail loudly now if what was written is malformed
    return path


# --------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--presets", default=",".join(PRESETS), help="comma-separated preset names")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma-separated token counts T")
    p.add_argument("--reps", type=int, default=30, help="graph replays per timing (median)")
    p.add_argument("--tune", action="store_true", help="search GEMM configs first and write kernels/configs/*.json")
    p.add_argument("--tune-budget", type=float, default=480.0, help="seconds of tuning at most")
    p.add_argument("--tune-tokens", default=None, help="token counts to tune (default: --tokens)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch pipeline")
    p.add_argument("--fast-combine", action="store_true", help="also time the atomic (non-deterministic) combine")
    p.add_argument("--backend", default="auto", choices=("auto", "megakernel", "multi"),
                   help="moe_forward's backend (rows record the one that ran; default auto)")
    p.add_argument("--dtype", default="bf16",
                   help=f"comma-separated weight formats, of {', '.join(DTYPES)} (default bf16): fp8 = e4m3 weights "
                        f"with 128 x 128 block scales, fp8-act = the same with FP8 activations")
    p.add_argument("--breakdown", action="store_true", help="also time router+align, gemm1, gemm2, combine apart")
    p.add_argument("--out", default=None, help="JSON-lines file to append rows to")


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the options (None if nothing), checked before torch is imported."""
    from ..reference import PRESETS as KNOWN

    bad = [s for s in args.presets.split(",") if s and s not in KNOWN]
    if bad:
        return f"unknown preset(s) {bad}; presets: {', '.join(KNOWN)}"
    for opt, text in (("--tokens", args.tokens), ("--tune-tokens", args.tune_tokens)):
        if text is None:
            continue
        try:
            ts = [int(v) for v in text.split(",") if v]
        except ValueError:
            return f"{opt} must be comma-separated whole numbers, got {text!r}"
        if not ts or any(t < 1 for t in ts):
            return f"{opt} must list token counts >= 1, got {text!r}"
    if args.reps < 1:
        return f"--reps must be >= 1, got {args.reps}"
    dts = [d for d in args.dtype.split(",") if d]
    bad = [d for d in dts if d not in DTYPES]
    if bad or not dts:
        return f"--dtype: unknown dtype(s) {bad or [args.dtype]}; choices: {', '.join(DTYPES)}"
    if len(set(dts)) != len(dts):
        return f"--dtype lists a dtype twice: {args.dtype!r}"
    return None


def run(args: argparse.Namespace) -> int:
    bad = check_args(args)
    if bad:
        print(f"megamoe bench: error: {bad}", file=sys.stderr)
        return 2
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as exc:
        print(f"megamoe bench: needs torch and triton on a CUDA GPU (pip install -e '.[gpu]'): {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("megamoe bench needs a CUDA GPU", file=sys.stderr)
        return 2
    presets = [s for s in args.presets.split(",") if s]
    tokens = [int(s) for s in args.tokens.split(",") if s]
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / (
        f"kernels_{_dt.date.today().isoformat()}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    prov = provenance()
    print(f"# {prov}", flush=True)
    if args.tune:
        tt = [int(v) for v in args.tune_tokens.split(",")] if args.tune_tokens else tokens
        path = tune(presets, tt, budget_s=args.tune_budget)
        print(f"# tuned configs written to {path}", flush=True)
    dtypes = [d for d in DTYPES if d in args.dtype.split(",")]  # bf16 first: the fp8 rows' speedup needs it
    ceil = measure_ceilings()
    fp8_mm = ceil.get("fp8_matmul_flops_per_s")
    print(f"# ceilings: read {ceil['read_bytes_per_s']/1e12:.2f} TB/s, bf16 matmul "
          f"{ceil['matmul_flops_per_s']/1e12:.0f} TFLOP/s, fp8 matmul "
          + (f"{fp8_mm/1e12:.0f} TFLOP/s" if fp8_mm else f"not measured ({ceil.get('fp8_matmul_error')})"), flush=True)
    print(HEADER, flush=True)
    rows = []
    n_total, n_done, t0 = len(presets) * len(tokens), 0, time.time()
    from .fp8_weights import to_fp8

    def emit(r: dict) -> None:
        r.update(prov)
        r.update({f"ceiling_{k}": v for k, v in ceil.items()})
        rows.append(r)
        with out.open("a") as fh:
            fh.write(json.dumps(r) + "\n")

    for name in presets:
        cfg = bench_config(name)
        ws = {"bf16": random_device_weights(cfg)}
        if any(DTYPES[d] and not skip_reason(d, args.backend) for d in dtypes):
            ws["fp8"] = to_fp8(ws["bf16"])  # on the GPU, from the same bf16 weights
        if "bf16" not in dtypes:
            del ws["bf16"]
        for T in tokens:
            modes = [True, False] if args.fast_combine else [True]
            for det in modes:
                def one(dt, det=det, T=T, name=name, cfg=cfg, ws=ws):
                    return bench_row(name, cfg, ws["bf16" if DTYPES[dt] is None else "fp8"], T, ceil, reps=args.reps,
                                     with_torch=not args.no_torch and det, deterministic=det,
                                     breakdown=args.breakdown, backend=args.backend, dtype=dt)

                def show(r, det=det):
                    emit(r)
                    if "skipped" in r:
                        return
                    print(fmt_row(r) + ("" if det else "  (atomic)"), flush=True)
                    if "stage_us" in r:
                        print("    stages us: " + ", ".join(f"{k} {v:.1f}" for k, v in r["stage_us"].items()),
                              flush=True)

                dtype_rows(one, dtypes, args.backend, show, {"preset": name, "T": T, "deterministic": det},
                           log=lambda msg, name=name, T=T: print(f"# {name} T={T} {msg}", flush=True))
            n_done += 1
            print(f"#   progress {n_done}/{n_total}, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        ws.clear()
        torch.cuda.empty_cache()
    print(f"# rows appended to {out}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="megamoe bench", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
