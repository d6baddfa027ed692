"""The reuse microbenchmark (kernels/microbench_gemm.reuse_gemm: a grouped GEMM whose weight tiles
are each read by r row blocks), its calibrate step gemm_reuse (megamoe/calibrate.py) and the
profile table it writes (kernel_model.gemm_reuse_<form>, simulator/hardware.py), without a GPU:
the kernel under the interpreter against torch, the step with fake timings, its measurements
through build_profile and the loader. The cost model does not read the table (its switch,
USE_GEMM_REUSE_TABLE, was removed: simulator/README.md; tests/test_cost_switches.py
test_recorded_tables_are_not_read)."""

from __future__ import annotations

import json

import pytest
import torch

from megamoe.simulator import load_profile

RUN36 = "benchmarks/results/validation_2026-12-02_run36/profile.json"


@pytest.mark.parametrize("r", [1, 2, 3])
def test_reuse_gemm_is_each_experts_matmul(r):
    """Every loop form, r row blocks per expert (3: not a power of two, groups of GROUP_M = 2 row
    blocks crossing experts), fresh random inputs, output poisoned first, persistent forms on
    fewer programs than tiles: expert e's rows times its own weights, as torch computes them."""
    from megamoe.kernels.microbench_gemm import LOADS, reuse_gemm

    g = torch.Generator().manual_seed(1000 + r)
    E, bm, K = 3, 16, 64
    for form, v in LOADS.items():
        n_out = 32 if v.gated else 48  # gated: each expert's w is 32 gate rows, then 32 up rows
        a = torch.randn((E * r * bm, K), generator=g)
        w = torch.randn((E, 2 * n_out if v.gated else n_out, K), generator=g)
        c = torch.full((E * r * bm, n_out), float("nan"))
        reuse_gemm(a, w, row_blocks=r, block_m=bm, block_n=16, block_k=32, num_warps=4, num_stages=2, loads=form,
                   programs=4, group_m=2, out=c)
        assert not c.isnan().any(), form
        rows = r * bm
        for e in range(E):
            want = a[e * rows:(e + 1) * rows] @ w[e].T
            if v.gated:
                gg, u = want[:, :n_out], want[:, n_out:]
                want = gg * torch.sigmoid(gg) * u
            # normalized error: the gated products reach a few hundred, where fp32 sums in another order
            # differ by ~1e-4 absolute (torch 2.13 / Triton 3.9's interpreter: 1.6e-4 at 526)
            err = float((c[e * rows:(e + 1) * rows] - want).abs().max() / want.abs().max())
            assert err < 1e-5, f"{form} e={e}: normalized error {err:.2e}"


def test_reuse_gemm_refuses_bad_shapes_by_name():
    from megamoe.kernels.microbench_gemm import reuse_gemm

    kw = dict(block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=2)
    a, w = torch.randn(2 * 2 * 16, 64), torch.randn(2, 48, 64)
    reuse_gemm(a, w, row_blocks=2, check=True, **kw)  # the good case
    with pytest.raises(ValueError, match="E x row_blocks x block_m = 2 x 1 x 16 rows, got 64"):
        reuse_gemm(a, w, row_blocks=1, **kw)
    with pytest.raises(ValueError, match="row_blocks must be >= 1"):
        reuse_gemm(a, w, row_blocks=0, **kw)
    with pytest.raises(ValueError, match="one weight matrix per expert"):
        reuse_gemm(a, w[0], row_blocks=2, **kw)
    with pytest.raises(ValueError, match="K differs"):
        reuse_gemm(a, torch.randn(2, 48, 32), row_blocks=2, **kw)
    with pytest.raises(ValueError, match="N = 40 must be a multiple of its block 16"):  # the kernel does not mask
        reuse_gemm(a, torch.randn(2, 40, 64), row_blocks=2, **kw)
    with pytest.raises(ValueError, match="gate rows then up rows: got 47"):
        reuse_gemm(a, torch.randn(2, 47, 64), row_blocks=2, loads="pointer_gated", **kw)
    with pytest.raises(ValueError, match="loads must be one of"):
        reuse_gemm(a, w, row_blocks=2, loads="tma_a", **kw)


def test_reuse_experts_stream_weights_in_whole_waves():
    """H200 (132 SMs, 50 MB L2): GEMM 2's 28 or 56 N tiles of 7168 x 2048 bf16 experts (29 MB):
    33 experts (7 or 14 whole waves at r = 1, 0.97 GB of weights); GEMM 1's 16 N tiles of
    4096 x 7168 (59 MB): 66 (8 waves); weights >= 8 x L2 and r = 1 >= 6 waves in every case."""
    from megamoe import calibrate

    L2 = 50 << 20
    assert calibrate.reuse_experts(132, 28, 7168 * 2048 * 2, L2) == 33
    assert calibrate.reuse_experts(132, 56, 7168 * 2048 * 2, L2) == 33
    assert calibrate.reuse_experts(132, 16, 4096 * 7168 * 2, L2) == 66
    assert calibrate.reuse_experts(132, 28, 1 << 20, L2) == 400  # small experts: 8 x L2 bounds; past the cap, not whole waves
    for S, nt, eb in ((132, 28, 7168 * 2048 * 2), (132, 16, 4096 * 7168 * 2), (127, 28, 1 << 24)):
        E = calibrate.reuse_experts(S, nt, eb, L2)
        assert E * eb >= calibrate.GEMM_REUSE_L2_TIMES * L2 and E * nt >= calibrate.GEMM_REUSE_MIN_WAVES * S


def test_reuse_step_times_every_case_row_blocks_and_depth(monkeypatch):
    """measure_gemm_reuse with the kernel and the timer replaced (time = gap + flops at a rate of
    r): per case and depth, E experts of r BLOCK_M rows, the rate per SM of 2 x rows x weight rows
    x depth flop with the launch gap taken off; quick: the first depth and r in 1, 2, 8; a case
    that raises loses its shape's points, and the others keep theirs."""
    from megamoe import calibrate
    from megamoe.kernels import microbench_gemm as mg

    last, seen = {}, []

    def rate(r):
        return 1e12 * (1 + r / 4)

    def fake(a, w, *, row_blocks, block_m, block_n, loads, num_stages, **kw):
        if loads == "pointer_gated":
            raise RuntimeError("out of resources")
        seen.append((loads, block_m, block_n, row_blocks, num_stages, a.shape[0], w.shape))
        last["t"] = 1e-6 + a.shape[0] * w.shape[1] * w.shape[2] * 2.0 / (132 * rate(row_blocks))

    with monkeypatch.context() as mp:
        mp.setattr(mg, "reuse_gemm", fake)
        mp.setattr(calibrate, "graph_seconds", _fake_timed(last))
        for name in ("randn", "empty"):  # no CUDA buffers; shapes kept for the fake
            mp.setattr(torch, name, lambda shape, **kw: _Shaped(shape))
        full = calibrate.measure_gemm_reuse(1, 132, 1e-6, l2_bytes=50 << 20)
        quick = calibrate.measure_gemm_reuse(1, 132, 1e-6, quick=True, l2_bytes=50 << 20)
    assert full["failed"] == {"pointer_gated 64x128x4": "RuntimeError: out of resources"}
    assert "points_pointer_gated" not in full
    forms = {c[0] for c in calibrate.GEMM_REUSE_CASES} - {"pointer_gated"}
    assert {k for k in full if k.startswith("points_")} == {f"points_{f}" for f in forms}
    for form, bm, bn, warps, _bk, _n, depths in calibrate.GEMM_REUSE_CASES:
        if form == "pointer_gated":
            continue
        pts = [p for p in full[f"points_{form}"] if p[:3] == [bm, bn, warps]]
        assert [p[3:5] for p in pts] == [[d, r] for d in depths for r in calibrate.GEMM_REUSE_ROW_BLOCKS]
        for p in pts:
            assert p[5] == pytest.approx(rate(p[4]))
        q = [p for p in quick[f"points_{form}"] if p[:3] == [bm, bn, warps]]
        assert [p[3:5] for p in q] == [[depths[0], r] for r in calibrate.GEMM_REUSE_ROW_BLOCKS_QUICK]
    # GEMM 2's tile: 33 experts of 7168 x depth, a of 33 r x 128 rows; GEMM 1's gated tile: two
    # 128-column accumulators over 66 experts of 4096 weight rows, one more stage
    assert ("tma_ab_persistent", 128, 256, 1, 3, 33 * 128, (33, 7168, 2048)) in seen
    assert ("tma_persistent_gated", 128, 128, 16, 4, 66 * 16 * 128, (66, 4096, 7168)) in seen
    assert full["experts"]["tma_persistent_gated 128x256x8 depth 7168"] == 66


class _Shaped:
    """A stand-in for a CUDA tensor: its shape, sliced along the rows."""

    def __init__(self, shape):
        self.shape = tuple(shape)

    def __getitem__(self, sl):
        return _Shaped((len(range(*sl.indices(self.shape[0]))), *self.shape[1:]))


def _fake_timed(last):
    def timed(fn, **kw):
        fn(0)
        return last["t"]
    return timed


def test_reuse_points_travel_to_the_profile_and_load(tmp_path):
    """microbench.json's gemm_reuse points -> kernel_model.gemm_reuse_<form> (unit, axes, the
    calibrate source) -> KernelModel.gemm_reuse grids by shape, read through GEMM_LOADS'
    fallbacks; the summary prints a line per form, shape and depth; a grid with a hole is refused
    by name; profiles without the field (the shipped h200, run 36's calibrated one) load with none."""
    from megamoe.calibrate import build_profile, summary
    from megamoe.simulator.hardware import ProfileError, validate

    prov = {"gpu": "NVIDIA H200", "date": "2026-12-02", "num_sms": 132}
    pts = [[128, 256, 8, d, r, 1e12 * (1 + r / 8) * (1 + d / 1e5)] for d in (2048, 7168) for r in (1, 2, 4, 8, 16)]
    pts += [[64, 128, 4, 2048, r, 5e11 * r ** 0.5] for r in (1, 2, 4, 8, 16)]
    m = {"gemm_reuse": {"points_tma_ab_persistent": pts[:10], "points_pointer": pts[10:], "experts": {"x": 33}}}
    prof = build_profile(load_profile("h200").to_dict(), m, prov)
    km = prof["kernel_model"]
    assert set(km) == {"gemm_reuse_tma_ab_persistent", "gemm_reuse_pointer"}
    t = km["gemm_reuse_tma_ab_persistent"]
    assert t["unit"] == "flop/s per SM" and t["over"] == ["BLOCK_M", "BLOCK_N", "num_warps", "depth", "row_blocks"]
    assert t["source"].startswith("measured by megamoe calibrate on NVIDIA H200 2026-12-02")
    assert "not read by the cost model" in t["note"]
    assert prof["calibration"]["measured"] == ["gemm_reuse"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    k = load_profile(str(path)).kernel
    (shape, depths, rbs, rates), = k.gemm_reuse_table("tma_ab_persistent")
    assert shape == (128.0, 256.0, 8.0) and depths == (2048.0, 7168.0) and rbs == (1.0, 2.0, 4.0, 8.0, 16.0)
    assert rates[1][0] == pytest.approx(1e12 * (1 + 1 / 8) * (1 + 7168 / 1e5))
    assert k.gemm_reuse_table("tma_ab_persistent_flat") == k.gemm_reuse_table("tma_ab_persistent")  # fallback
    assert k.gemm_reuse_table("pointer_gated") == k.gemm_reuse_table("pointer")
    assert k.gemm_reuse_table("tma_persistent_gated") == ()  # none of its GEMM_LOADS chain measured
    text = summary(m, prof)
    assert "gemm reuse tma_ab_persistent 128x256 8 warps depth 2048, r = 1/2/4/8/16  151.5 168.4" in text
    assert "gemm reuse pointer 64x128 4 warps depth 2048, r = 1/2/4/8/16  66.0" in text
    bad = json.loads(json.dumps(prof))
    bad["kernel_model"]["gemm_reuse_tma_ab_persistent"]["points"].pop(3)
    with pytest.raises(ProfileError, match=r"gemm_reuse_tma_ab_persistent.points must fill a grid of depth x "
                                           r"row_blocks of shape \[128, 256, 8\]"):
        validate(bad)
    bad = json.loads(json.dumps(prof))
    bad["kernel_model"]["gemm_reuse_pointer"]["over"] = ["BLOCK_M", "BLOCK_N", "num_warps", "depth"]
    with pytest.raises(ProfileError, match="gemm_reuse_pointer.over must be"):
        validate(bad)
    for spec in ("h200", RUN36):
        assert load_profile(spec).kernel.gemm_reuse == ()
    assert "gemm_reuse" in build_profile(load_profile("h200").to_dict(), {}, prov)["calibration"]["not_measured"]


_COMPILE_REUSE = r"""
import json, re
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource
from megamoe.kernels.microbench_gemm import LOADS, _dense_gemm_kernel as fn
from megamoe.calibrate import GEMM_REUSE_CASES, GEMM_STAGES

target = GPUTarget("cuda", 90, 32)
out = {}
for form, bm, bn, warps, bk, n_out, depths in GEMM_REUSE_CASES:
    v = LOADS[form]
    acc_n = bn // 2 if v.gated else bn
    vals = {"PERSISTENT": v.persistent, "TMA": v.tma_w, "TMA_A": v.tma_a, "GATED": v.gated, "FLAT": v.flat,
            "GROUPED": True, "BLOCK_M": bm, "BLOCK_N": acc_n, "BLOCK_K": bk, "GROUP_M": 8}
    ints = {"M": 33 * bm, "N": n_out, "K": depths[0], "R": 1}
    signature, constexprs, attrs = {}, {}, {}
    for i, (p, n) in enumerate(zip(fn.params, fn.arg_names)):
        if p.is_constexpr or (n == "w_desc" and not v.tma_w) or (n == "a_desc" and not v.tma_a):
            signature[n], constexprs[n] = "constexpr", vals.get(n)
            continue
        if n == "w_desc":
            signature[n] = f"tensordesc<bf16[{acc_n}, {bk}]>"
        elif n == "a_desc":
            signature[n] = f"tensordesc<bf16[{bm}, {bk}]>"
        else:
            signature[n] = "i32" if n in ints else "*bf16"
            if n not in ints or ints[n] % 16 == 0:
                attrs[(i,)] = CUDABackend(target).parse_attr("D")  # as the JIT marks a 16-divisible argument
    stages = GEMM_STAGES[warps] + (1 if v.gated and warps == 8 else 0)
    k = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                       options={"num_warps": warps, "num_stages": stages})
    ptx = k.asm["ptx"]
    out[f"{form} {bm}x{bn}"] = [len(re.findall(p, ptx)) for p in (r"cp\.async\.bulk\.tensor", r"cp\.async\.cg",
                                                                   r"wgmma\.mma_async", r"ld\.global", r"\.local")]
print(json.dumps(out))
"""


def test_reuse_cases_compile_to_wgmma_tile_loops():
    """Compiled for sm_90 (this process's Triton, not the interpreter) as the JIT specializes a
    launch, every GEMM_REUSE_CASES case is a wgmma loop without scalar global loads or local memory;
    its weights come through TMA where the form says (and its rows too for tma_ab), by cp.async
    otherwise. (Triton 3.6, the GPU's, was checked apart: the report of the change.)"""
    import os
    import subprocess
    import sys

    from megamoe.calibrate import GEMM_REUSE_CASES
    from megamoe.kernels.microbench_gemm import LOADS

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE_REUSE], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    for form, bm, bn, *_ in GEMM_REUSE_CASES:
        tma, cp_async, wgmma, ld_global, local = counts[f"{form} {bm}x{bn}"]
        v = LOADS[form]
        assert wgmma > 0 and ld_global == 0 and local == 0, (form, counts)
        assert (tma > 0) == v.tma_w and (cp_async > 0) == (not v.tma_a), (form, counts)
