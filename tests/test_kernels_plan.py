"""The launch plan (megamoe.kernels.plan) describes the launches moe_forward really makes.

The Triton kernels are wrapped to record each launch's grid and block sizes while the layer runs
under the interpreter; the plan computed from the same routing must list the same launches.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from launches import LaunchRecorder

from megamoe.reference import MoEConfig, random_weights

KERNEL_MODULES = {
    "_router_logits_kernel": "routing", "_router_kernel": "routing", "_scan_experts_kernel": "align",
    "_layout_kernel": "align",
    "_scatter_pairs_kernel": "align", "_gemm1_kernel": "grouped_gemm", "_act_kernel": "grouped_gemm",
    "_gemm2_kernel": "grouped_gemm", "_combine_kernel": "grouped_gemm",
}


def test_plan_is_importable_without_torch_or_triton():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"
            "from megamoe.reference import MoEConfig\nfrom megamoe.kernels import launch_plan\n"
            "p = launch_plan(MoEConfig.preset('deepseek-v3'), counts=[8] * 256, T=256)\n"
            "assert p.stage('gemm1').active_programs > 0")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), reason="interpreter only")
@pytest.mark.parametrize("T,shared", [(37, False), (2, True)])  # three router chunks; one chunk (the router aligns) with a shared MLP
def test_plan_matches_launches(T, shared, rng, monkeypatch):
    """Same kernels in the same order with the same grids; active GEMM programs = routed blocks."""
    import importlib

    from megamoe.kernels import launch_plan, moe_forward, moe_forward_details

    cfg = MoEConfig(hidden_size=40, intermediate_size=36, num_experts=7, top_k=3,
                    num_shared_experts=int(shared), shared_intermediate_size=20 * int(shared))
    w = random_weights(cfg, seed=1).to_torch("cpu", torch.float32)
    x = torch.from_numpy(rng.standard_normal((T, 40))).float()
    log: list = []
    for name, mod in KERNEL_MODULES.items():
        m = importlib.import_module(f"megamoe.kernels.{mod}")
        monkeypatch.setattr(m, name, LaunchRecorder(getattr(m, name), name, log))
    moe_forward(x, w, cfg, backend="multi")  # the multi-launch path is what the launch plan describes
    monkeypatch.undo()
    d = moe_forward_details(x, w, cfg)
    plan = launch_plan(cfg, topk_idx=d["topk_idx"].numpy(), dtype="float32", device_name="cpu-interpreter")
    assert [(s.kernel, s.grid) for s in plan.stages] == [(n, g) for n, g, _ in log]
    for st, (_, _, blocks) in zip(plan.stages, log):
        for k, v in blocks.items():
            if k in st.tile:
                assert st.tile[k] == v, (st.name, k)
    g1 = plan.stage("gemm1")
    routed_blocks = int((d["block_expert"].numpy() >= 0).sum())
    n_tiles = -(-cfg.intermediate_size // g1.tile["BLOCK_N"])
    assert g1.active_programs == routed_blocks * n_tiles * g1.tile["SPLIT_K"]
    assert sum(g1.tiles_per_expert) == g1.active_programs
    np.testing.assert_array_equal(plan.counts, d["counts"].numpy())


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), reason="interpreter only")
def test_launchers_take_their_sizes_from_the_plan(rng, monkeypatch):
    """The plan is what runs: change the static plan's router, act and combine sizes and the
    launches change with them (nothing in a launcher re-derives a size), and the output is still right."""
    import dataclasses
    import importlib

    from megamoe.kernels import moe as kmoe
    from megamoe.kernels import moe_forward
    from megamoe.kernels.plan import combine_launch, static_plan
    from megamoe.reference import moe_forward as ref_forward

    T = 13  # T % 3 == 1: the interpreter's configs split GEMM K, so the act kernel runs too
    cfg = MoEConfig(hidden_size=40, intermediate_size=36, num_experts=7, top_k=3, num_shared_experts=1,
                    shared_intermediate_size=20)
    w = random_weights(cfg, seed=1)
    x = rng.standard_normal((T, 40))

    def edited(config, T, **kw):
        sp = static_plan(config, T, **kw)
        act = dict(sp.act, BLOCK_N=16, grid=(sp.B_max * -(-config.intermediate_size // 16),))
        cb = combine_launch(T, config.hidden_size)
        cb = dict(cb, BLOCK_H=16, grid=(cb["grid"][0], -(-config.hidden_size // 16)))
        return dataclasses.replace(sp, router=dict(sp.router, BLOCK_H=16), act=act, combine=cb)

    log: list = []
    for name, mod in KERNEL_MODULES.items():
        m = importlib.import_module(f"megamoe.kernels.{mod}")
        monkeypatch.setattr(m, name, LaunchRecorder(getattr(m, name), name, log))
    monkeypatch.setattr(kmoe, "static_plan", edited)
    y = moe_forward(torch.from_numpy(x).float(), w.to_torch("cpu", torch.float32), cfg, backend="multi")
    blocks = {n: (g, b) for n, g, b in reversed(log)}  # the first launch of each kernel (routed before shared)
    assert blocks["_router_kernel"][1]["BLOCK_H"] == 16
    assert blocks["_act_kernel"][1]["BLOCK_N"] == 16
    assert blocks["_combine_kernel"] == ((T, 3), {"BLOCK_T": 1, "BLOCK_H": 16})
    want = ref_forward(x, w, cfg)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-3, atol=1e-3)


def test_plan_needs_a_routing():
    from megamoe.kernels import launch_plan

    cfg = MoEConfig(hidden_size=40, intermediate_size=36, num_experts=7, top_k=3)
    with pytest.raises(ValueError, match="needs topk_idx or counts"):
        launch_plan(cfg, 5)
    with pytest.raises(ValueError, match="sum to T"):
        launch_plan(cfg, 5, counts=[1] * 7)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), reason="interpreter only")
@pytest.mark.parametrize("fp8", ["weights", "weights+act"])
def test_fp8_plan_matches_launches(fp8, rng, monkeypatch):
    """The FP8 layer (fp8_gemm.py's GEMMs, routed and shared) launches what launch_plan(fp8=...) lists."""
    import importlib

    from megamoe.kernels import launch_plan, moe_forward, moe_forward_details

    cfg = MoEConfig(hidden_size=40, intermediate_size=36, num_experts=7, top_k=3, num_shared_experts=1,
                    shared_intermediate_size=20)
    w = random_weights(cfg, seed=1, fp8=True).to_torch("cpu", torch.float32)
    x = torch.from_numpy(rng.standard_normal((13, 40))).float()
    log: list = []
    kernels = {**KERNEL_MODULES, "_gemm1_fp8_kernel": "fp8_gemm", "_gemm2_fp8_kernel": "fp8_gemm",
               "_quantize_x_kernel": "fp8_gemm"}
    for name, mod in kernels.items():
        m = importlib.import_module(f"megamoe.kernels.{mod}")
        monkeypatch.setattr(m, name, LaunchRecorder(getattr(m, name), name, log))
    moe_forward(x, w, cfg, backend="multi", fp8_activations=fp8 == "weights+act")
    monkeypatch.undo()
    d = moe_forward_details(x, w, cfg)
    plan = launch_plan(cfg, topk_idx=d["topk_idx"].numpy(), dtype="float32", device_name="cpu-interpreter", fp8=fp8)
    assert [(s.kernel, s.grid) for s in plan.stages] == [(n, g) for n, g, _ in log]
    for st, (_, _, blocks) in zip(plan.stages, log):
        for k, v in blocks.items():
            if k in st.tile:
                assert st.tile[k] == v, (st.name, k)
    assert plan.fp8 == fp8 and plan.to_dict()["fp8"] == fp8


def test_fp8_plan_reads_fp8_bytes_and_multiplies_in_fp8_with_fp8_activations():
    """Hand-worked bytes (H, I multiples of 128): e4m3 weights 1 + 4 / 128^2 bytes per element, FP8
    activations 1 + 4 / 128 (GEMM 1's gathered x rows too: x quantized once, stage "quantize_x"); x and y
    stay bf16; FLOPs as the bf16 plan's for the same tiles."""
    from megamoe.kernels import launch_plan

    cfg = MoEConfig(hidden_size=512, intermediate_size=256, num_experts=8, top_k=2)
    counts = [4, 0, 12, 1, 3, 0, 8, 4]
    H, I = 512, 256
    w8, a8 = 1 + 4 / 128**2, 1 + 4 / 128
    for fp8, ab, mma in ((None, 2, "bf16"), ("weights", 2, "bf16"), ("weights+act", a8, "fp8")):
        plan = launch_plan(cfg, counts=counts, T=16, dtype="bfloat16", fp8=fp8)
        g1, g2 = plan.stage("gemm1"), plan.stage("gemm2")
        wb = 2 if fp8 is None else w8
        bm, bn1, bn2 = g1.tile["BLOCK_M"], g1.tile["BLOCK_N"], g2.tile["BLOCK_N"]
        assert g1.tile["SPLIT_K"] == 1 or fp8 is None
        if g1.tile["SPLIT_K"] == 1:
            assert g1.operand_bytes_per_tile == pytest.approx({"a": bm * H * (ab if mma == "fp8" else 2),
                                                               "b": 2 * bn1 * H * wb,
                                                               "out": bm * bn1 * ab})
        s2 = g2.tile.get("SPLIT_K", 1)
        assert g2.operand_bytes_per_tile["a"] == pytest.approx(bm * I / s2 * ab)
        assert g2.operand_bytes_per_tile["b"] == pytest.approx(bn2 * I / s2 * wb)
        assert g1.mma_dtype == g2.mma_dtype == mma and plan.stage("router").mma_dtype is None
        assert fp8 is None or (g1.kernel, g2.kernel) == ("_gemm1_fp8_kernel", "_gemm2_fp8_kernel")
        assert g1.flops_per_tile == 2 * bm * 2 * bn1 * H / g1.tile["SPLIT_K"]


def test_router_serial_steps_count_the_selections_reductions():
    """The router stage's and the megakernel's top-k tasks' dependent reductions are
    reference.tiles.topk_passes: K maxima, and for grouped routing the two group maxima and the
    topk_group group picks (DeepSeek-V3: 8 + 2 + 4)."""
    from megamoe.kernels.megakernel_config import megakernel_config
    from megamoe.kernels.plan import launch_plan
    from megamoe.reference.tiles import task_plan, topk_passes

    ds, qw = MoEConfig.preset("deepseek-v3"), MoEConfig.preset("qwen3-30b-a3b")
    assert topk_passes(ds) == 14 and topk_passes(qw) == qw.top_k == 8
    for cfg in (ds, qw):
        T = 64
        counts = np.bincount(np.arange(T * cfg.top_k) % cfg.num_experts, minlength=cfg.num_experts)
        plan = launch_plan(cfg, T, counts=counts, device_name="NVIDIA H200", dtype="bfloat16", triton_version="3.6.0")
        router = next(s for s in plan.stages if s.name == "router")
        fused = router.tile["FUSE_ALIGN"]
        assert router.serial_steps["select"] == topk_passes(cfg) and router.serial_steps["reduce"] == (2 if fused else 0)
        mk = megakernel_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k,
                               cfg.shared_intermediate_size, T, num_sms=132)
        assert task_plan(cfg, counts, T, mk["tiles"], num_programs=132).topk_passes == topk_passes(cfg)


#: shared memory of the shipped 16-bit GEMM configs as Triton compiled them for sm_90
#: (benchmarks/compile_report.py --gemm current, Triton 3.9 on a machine without a GPU, 2026-12-02):
#: (preset, T, stage) -> bytes (the TMA GEMM's 32 barrier bytes left out)
COMPILED_SHARED = {("qwen3-30b-a3b", 64, "gemm1"): 139264, ("qwen3-30b-a3b", 64, "gemm2"): 73728,
                   ("qwen3-30b-a3b", 1, "gemm1"): 110592, ("qwen3-30b-a3b", 512, "gemm1"): 163840,
                   ("qwen3-30b-a3b", 512, "gemm2"): 98304, ("deepseek-v3", 512, "gemm1"): 147456,
                   ("deepseek-v3", 512, "gemm2"): 49152, ("deepseek-v3", 4096, "gemm1"): 196608,
                   ("deepseek-v3", 4096, "gemm2"): 147456, ("deepseek-v3", 8, "gemm1"): 139264}


@pytest.mark.parametrize("preset,T", sorted({(k[0], k[1]) for k in COMPILED_SHARED}))
def test_gemm_shared_bytes_match_the_compiled_kernels(preset, T):
    """plan.gemm_shared_bytes against ptxas' figures: num_stages buffers in the wgmma loops (64+ rows),
    num_stages - 1 in the mma.sync ones (16 and 32 rows); the FP8 plans state none."""
    from megamoe.kernels.plan import launch_plan
    from megamoe.reference import MoEConfig

    cfg = MoEConfig.preset(preset)
    counts = np.zeros(cfg.num_experts, np.int64)
    counts[: cfg.top_k] = T  # the shipped config depends on T only
    plan = launch_plan(cfg, T, counts=counts, device_name="NVIDIA H200", triton_version="3.6.0")
    for name in ("gemm1", "gemm2"):
        if (preset, T, name) in COMPILED_SHARED:
            assert plan.stage(name).shared_bytes == COMPILED_SHARED[preset, T, name]
    fp8 = launch_plan(cfg, T, counts=counts, device_name="NVIDIA H200", triton_version="3.6.0", fp8="weights")
    assert fp8.stage("gemm1").shared_bytes is None


def test_walking_router_takes_wide_steps_at_prefill_only():
    """configs.walk_block_h: the multi-launch routing program that walks H itself steps 128 columns at a
    time from WALK_WIDE_MIN_T tokens on, up to WALK_WIDE_MAX_E experts (H200 run BN, Qwen3-30B-A3B); decode,
    more experts, an explicit block_h and the interpreter keep their steps."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.plan import router_launch

    E, H, K = 128, 2048, 8  # Qwen3-30B-A3B: 32 walking steps of 64, so no prefill logits launch
    for T in (cfgs.WALK_WIDE_MIN_T, 16384):
        r = router_launch(T, E, H, K)
        assert r["SPLIT"] == 0 and r["BLOCK_H"] == cfgs.WALK_WIDE_BLOCK_H, T
        assert router_launch(T, E, H, K, split=0, block_h=64)["BLOCK_H"] == 64
    assert router_launch(cfgs.WALK_WIDE_MIN_T // 2, E, H, K, split=0)["BLOCK_H"] == cfgs.router_block_h(E, H)
    assert router_launch(4096, 256, H, K, split=0)["BLOCK_H"] == cfgs.router_block_h(256, H)
    assert router_launch(4096, E, H, K, split=0, interpret=True)["BLOCK_H"] == cfgs.router_block_h(E, H, interpret=True)
