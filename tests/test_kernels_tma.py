"""The "tma_persistent" grouped-GEMM variant (kernels/grouped_gemm.py) against the float64 reference.

On the ``device`` fixture: under TRITON_INTERPRET=1 on the CPU (float32 and float16; the
interpreter's bfloat16 dot is wrong) with tiny tiles and 3 persistent programs, so that each
program walks several tiles; on a GPU in bfloat16 with the real tiles (BLOCK_M 64, 128, 256).
The variant is chosen by a config entry given to the static plan (``static_plan_for(gemm=...)``),
as a benchmark's candidate or a tuned table would choose it. Shapes are odd: H = 40 and I = 24 are
not multiples of any tile (the TMA descriptors zero-fill past them, GEMM 1's gate tile runs into
the up rows and the store masks it), yet 16-byte strided, as TMA needs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pairs import pair_rows_reference

from megamoe.reference import MoEConfig, assert_close, random_weights, round_to_dtype
from megamoe.reference import moe_forward as ref_forward

pytestmark = [pytest.mark.interpret,
              # GEMM 2 reads the activation's padding rows (never written: garbage, NaN in the
              # poisoned test); they only reach output rows that are masked
              pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")]

BASE = dict(hidden_size=40, intermediate_size=24, num_experts=7, top_k=3)


def _entry(device, block_m: int | None = None) -> dict:
    from megamoe.kernels import configs as cfgs

    if device.name == "cpu":
        return cfgs.tma_entry(block_m or 16, interpret=True)
    return cfgs.tma_entry(block_m or 128)


def _block_ms(device) -> list[int]:
    return [16, 64, 256] if device.name == "cpu" else [64, 128, 256]


def _layer(device, cfg, x, w, dtype, entry, deterministic=True):
    """The layer with the variant's plan (the shared MLP's too), and the reference on the same rounded inputs."""
    from megamoe.kernels import moe as kmoe

    tdt = getattr(torch, dtype)
    xt = device.tensor(x, dtype)
    sp = kmoe.static_plan_for(cfg, x.shape[0], tdt, xt.device, deterministic, gemm=entry,
                              shared_gemm=entry if cfg.num_shared_experts else None)
    y = kmoe._forward(xt, w.to_torch(device.name, tdt), cfg, deterministic, plan=sp)
    return y.cpu(), ref_forward(round_to_dtype(x, dtype), w.round_to(dtype), cfg), sp


#: name -> (config fields, T, why)
CASES = {
    "softmax_shared": (dict(num_shared_experts=1, shared_intermediate_size=24), 37,
                       "scan + scatter align; the shared MLP through the dense TMA kernels"),
    "swiglu_biases": (dict(router="topk_softmax", router_bias=True, activation="clamped_swiglu", expert_bias=True,
                           swiglu_limit=1.5), 13, "gpt-oss: biases in both epilogues; one router chunk aligns inside"),
    "input_scaled": (dict(router="sigmoid_top1_input", top_k=1, num_shared_experts=1, shared_intermediate_size=16),
                     29, "Llama 4: the routing weight scales GEMM 1's input, K = 1 (KS = 2 with the shared MLP)"),
    "grouped": (dict(num_experts=8, router="sigmoid_grouped_topk", n_group=4, topk_group=2, score_bias=True,
                     routed_scaling_factor=2.5), 41, "DeepSeek-V3 routing, 8 experts, no shared MLP"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_layer_matches_reference(case, rng, device):
    fields, T, _why = CASES[case]
    cfg = MoEConfig(**{**BASE, **fields})
    w = random_weights(cfg, seed=int(rng.integers(1 << 30)))
    x = rng.standard_normal((T, cfg.hidden_size))
    y, ref, sp = _layer(device, cfg, x, w, device.dtype, _entry(device))
    assert sp.gemm["gemm1"]["variant"] == sp.gemm["gemm2"]["variant"] == "tma_persistent"
    assert_close(y, ref, device.dtype, f"{case} {device.dtype}")


@pytest.mark.parametrize("case", ["softmax_shared", "swiglu_biases"])
def test_layer_float16(case, rng, device):
    fields, T, _why = CASES[case]
    cfg = MoEConfig(**{**BASE, **fields})
    w = random_weights(cfg, seed=int(rng.integers(1 << 30)))
    x = rng.standard_normal((T, cfg.hidden_size))
    y, ref, _ = _layer(device, cfg, x, w, "float16", _entry(device))
    assert_close(y, ref, "float16", f"{case} float16")


def test_block_m_choices(rng, device):
    """Every BLOCK_M the variant offers (64 and 256 beside 128 on a GPU) computes the same layer:
    the align pads experts to it, both GEMMs tile by it."""
    cfg = MoEConfig(**BASE)
    w = random_weights(cfg, seed=11)
    x = rng.standard_normal((53, cfg.hidden_size))
    for bm in _block_ms(device):
        y, ref, sp = _layer(device, cfg, x, w, device.dtype, _entry(device, bm))
        assert sp.gemm["gemm1"]["BLOCK_M"] == bm
        assert_close(y, ref, device.dtype, f"BLOCK_M={bm}")


def test_empty_experts_and_shared_rows(rng, device):
    """Zero router weights: every token on experts 0..K-1 (ties to the lower index), four experts
    empty; 29 tokens fill two row blocks of 16 on each busy expert; the atomic combine too."""
    cfg = MoEConfig(**BASE)
    w = random_weights(cfg, seed=4)
    w = type(w)(**{**w.arrays(), "router_weight": np.zeros_like(w.router_weight)})
    x = rng.standard_normal((29, cfg.hidden_size))
    for det in (True, False):
        y, ref, _ = _layer(device, cfg, x, w, device.dtype, _entry(device), deterministic=det)
        assert_close(y, ref, device.dtype, f"all tokens on experts 0..2, deterministic={det}")


def test_one_expert_takes_every_token(rng, device):
    """top-1 with expert 5 always winning: one expert with four row blocks, six empty."""
    cfg = MoEConfig(**{**BASE, "top_k": 1})
    w = random_weights(cfg, seed=5)
    rw = np.full_like(w.router_weight, -1.0)
    rw[5] = 0.0
    w = type(w)(**{**w.arrays(), "router_weight": rw})
    x = np.abs(rng.standard_normal((57, cfg.hidden_size)))
    y, ref, _ = _layer(device, cfg, x, w, device.dtype, _entry(device))
    assert_close(y, ref, device.dtype, "every token on expert 5")


@pytest.mark.parametrize("T", [0, 1])
def test_tiny_batches(T, rng, device):
    """T = 0: an empty output and no launch; T = 1: one row block, fewer tiles than programs."""
    cfg = MoEConfig(**BASE, num_shared_experts=1, shared_intermediate_size=24)
    w = random_weights(cfg, seed=3)
    x = rng.standard_normal((T, cfg.hidden_size))
    y, ref, _ = _layer(device, cfg, x, w, device.dtype, _entry(device))
    assert y.shape == (T, cfg.hidden_size)
    assert_close(y, ref, device.dtype, f"T={T}")


@pytest.mark.parametrize("num_sms,flatten", [(1, 1), (3, 0), (1000, 0)])  # one program walks all (flattened
def test_poisoned_buffers(num_sms, flatten, rng, device):  # loop), several, more programs than tiles
    """The GEMMs alone on a given routing, with the activation and the pair buffer poisoned (NaN):
    every pair row is written, the activation's padding rows (left NaN) reach no output, and the
    persistent programs cover every tile whether one program walks them all, three share them, or
    there are more SMs than tiles (then one program per tile); with the walk flattened into the K
    loop (FLATTEN=1) or not."""
    from megamoe.kernels.grouped_gemm import launch_gemm1, launch_gemm2
    from megamoe.kernels.moe import align_only

    cfg = MoEConfig(**BASE)
    E, K, H, I = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    T = 23
    idx = np.stack([rng.permutation(E)[:K] for _ in range(T)])
    idx[:12, 0] = 2  # a busy expert (two row blocks of 16) beside thin ones
    idx[:12, 1:] = np.array([0, 1])[None, :]
    tw = rng.uniform(0.1, 1.0, (T, K))
    x = rng.standard_normal((T, H))
    w = random_weights(cfg, seed=6)
    entry = {g: dict(c, FLATTEN=flatten) for g, c in _entry(device).items()}
    bm = entry["gemm1"]["BLOCK_M"]
    dt = device.dtype
    meta = align_only(torch.from_numpy(idx).to(torch.int32).to(device.name), E, bm)
    P_max, B_max = meta["padded_token"].shape[0], meta["block_expert"].shape[0]
    wt = w.to_torch(device.name, device.torch_dtype())
    act = torch.full((P_max, I), float("nan"), device=device.name, dtype=device.torch_dtype())
    pairs = torch.full((T * K, H), float("nan"), device=device.name, dtype=device.torch_dtype())
    topk_w = device.tensor(tw, "float32")
    launch_gemm1(device.tensor(x), wt.gate_up, None, act, meta, topk_w, entry["gemm1"], activation="silu_gated",
                 alpha=1.0, limit=1.0, scale_input=False, dense=False, num_m=B_max, num_sms=num_sms)
    launch_gemm2(act, wt.down, None, pairs, meta, topk_w, entry["gemm2"], T=T, K=K, KS=K, dense=False,
                 atomic=False, num_m=B_max, num_sms=num_sms)
    got = pairs.cpu().double().numpy()
    assert np.isfinite(got).all(), "a pair row was left unwritten or took NaN from a padding row"
    xr, wr = round_to_dtype(x, dt), w.round_to(dt)
    want = pair_rows_reference(xr, wr, idx, tw, cfg)
    assert_close(got, want, dt, f"pair rows, {num_sms} programs")
    n_rows = int(meta["padded_offsets"][E])
    pad = (meta["padded_token"][:n_rows] < 0).cpu()
    assert pad.any() and torch.isnan(act.cpu()[:n_rows][pad]).all(), "padding rows were written"


def test_plan_matches_launches(rng, monkeypatch, device):
    """The launch plan names the kernels and grids that run: the variant's kernels, one program per
    SM (the interpreter's 3), and as working tiles the routed row blocks x N tiles."""
    if device.name != "cpu":
        pytest.skip("the launch recorder wraps the interpreter's kernels")
    import importlib

    from launches import LaunchRecorder
    from test_kernels_plan import KERNEL_MODULES

    from megamoe.kernels import grouped_gemm as gg
    from megamoe.kernels import moe_forward_details
    from megamoe.kernels.plan import launch_plan

    cfg = MoEConfig(**BASE, num_shared_experts=1, shared_intermediate_size=24)
    w = random_weights(cfg, seed=1)
    x = rng.standard_normal((37, cfg.hidden_size))
    log: list = []
    names = dict(KERNEL_MODULES, _gemm1_tma_kernel="grouped_gemm", _gemm2_tma_kernel="grouped_gemm")
    for name, mod in names.items():
        m = importlib.import_module(f"megamoe.kernels.{mod}")
        monkeypatch.setattr(m, name, LaunchRecorder(getattr(m, name), name, log))
    entry = _entry(device)
    _layer(device, cfg, x, w, "float32", entry)
    monkeypatch.undo()
    d = moe_forward_details(torch.from_numpy(x).float(), w.to_torch("cpu", torch.float32), cfg)
    plan = launch_plan(cfg, topk_idx=d["topk_idx"].numpy(), dtype="float32", device_name="cpu-interpreter",
                       gemm=entry, shared_gemm=entry)
    assert [(s.kernel, s.grid) for s in plan.stages] == [(n, g) for n, g, _ in log]
    assert [s.kernel for s in plan.stages if "gemm" in s.name] == [
        "_gemm1_tma_kernel", "_gemm2_tma_kernel", "_gemm1_tma_kernel", "_gemm2_tma_kernel"]
    g1 = plan.stage("gemm1")
    routed = int((d["block_expert"].numpy() >= 0).sum())
    assert g1.grid == (3,) and g1.active_programs == routed * -(-cfg.intermediate_size // g1.tile["BLOCK_N"])
    assert gg.device_sms(torch.device("cpu")) == 3


def test_rows_not_16_byte_strided_fall_back(rng, device):
    """float16 rows of I = 36 are 72 bytes: TMA cannot read GEMM 2's operands, so GEMM 2 falls
    back to the pointer kernel (GEMM 1's 80-byte rows of H = 40 keep TMA); the layer is the same."""
    cfg = MoEConfig(**{**BASE, "intermediate_size": 36})
    w = random_weights(cfg, seed=8)
    x = rng.standard_normal((19, cfg.hidden_size))
    y, ref, sp = _layer(device, cfg, x, w, "float16", _entry(device))
    assert (sp.gemm["gemm1"]["variant"], sp.gemm["gemm2"]["variant"]) == ("tma_persistent", "pointer")
    assert_close(y, ref, "float16", "I = 36 in float16")


def test_moe_experts_with_a_tuned_variant(rng, device, monkeypatch):
    """moe_experts (a routing made elsewhere) runs the variant when the config table names it."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import moe_experts
    from megamoe.reference import route

    cfg = MoEConfig(**BASE)
    w = random_weights(cfg, seed=9)
    x = rng.standard_normal((21, cfg.hidden_size))
    entry = _entry(device)
    monkeypatch.setattr(cfgs, "select_config", lambda *a, **k: cfgs.resolve_variants(entry, 40, 24, device.dtype))
    xr, wr = round_to_dtype(x, device.dtype), w.round_to(device.dtype)
    r = route(xr, wr.router_weight, cfg)
    wt = w.to_torch(device.name, device.torch_dtype())
    y = moe_experts(device.tensor(x), torch.from_numpy(r.topk_idx).to(device.name),
                    torch.from_numpy(r.topk_weights).float().to(device.name), wt.gate_up, wt.down)
    assert_close(y.cpu(), ref_forward(xr, wr, cfg), device.dtype, "moe_experts, tma_persistent")


def test_variant_configs_are_checked():
    """A variant the kernels lack, or split-K with the persistent variant, fail loudly; the shipped
    table names the persistent variant only where bench_prefill measured it faster (prefill
    buckets, benchmarks/adopt_prefill.py) and keeps the pointer path at decode."""
    from megamoe.kernels import configs as cfgs

    good = cfgs.tma_config("gemm1", 128)
    assert cfgs.check_gemm_config(good, "x")["variant"] == "tma_persistent"
    with pytest.raises(cfgs.KernelConfigError, match="variant must be one of"):
        cfgs.check_gemm_config(dict(good, variant="wgmma"), "x")
    with pytest.raises(cfgs.KernelConfigError, match="no split-K"):
        cfgs.check_gemm_config(dict(good, SPLIT_K=2), "x")
    with pytest.raises(ValueError, match="block_m"):
        cfgs.tma_config("gemm2", 32)
    assert cfgs.check_gemm_config(dict(good, FLATTEN=1), "x")["FLATTEN"] == 1
    for bad in (2, True, -1):
        with pytest.raises(cfgs.KernelConfigError, match="FLATTEN must be 0 or 1"):
            cfgs.check_gemm_config(dict(good, FLATTEN=bad), "x")
    with pytest.raises(cfgs.KernelConfigError, match="needs variant 'tma_persistent'"):
        cfgs.check_gemm_config(dict(good, variant="pointer", FLATTEN=1), "x")
    assert cfgs.candidate_entry("tma128:FLATTEN=1")["gemm2"]["FLATTEN"] == 1
    for E, H, I, K in ((8, 4096, 14336, 2), (128, 2048, 768, 8), (256, 7168, 2048, 8)):
        for T in cfgs.T_BUCKETS:
            e = cfgs.select_config(E, H, I, K, T, gpu="NVIDIA H200", dtype="bfloat16", triton_version="3.6.0")
            assert {e["gemm1"]["variant"], e["gemm2"]["variant"]} <= {"pointer", "tma_persistent"}
            if T <= 64:
                assert e["gemm1"]["variant"] == e["gemm2"]["variant"] == "pointer"
    # both GEMMs of every candidate fit Hopper's shared memory with their stages (bf16)
    for bm in (64, 128, 256):
        for gemm, b_tiles in (("gemm1", 2), ("gemm2", 1)):
            c = cfgs.tma_config(gemm, bm)
            per_stage = 2 * c["BLOCK_K"] * (c["BLOCK_M"] + b_tiles * c["BLOCK_N"])
            assert per_stage * c["num_stages"] <= 227 * 1024, (gemm, bm)


def _bench_prefill():
    from benchload import load_benchmark

    return load_benchmark("bench_prefill")


def test_bench_prefill_row_checks_every_candidate(monkeypatch, device):
    """benchmarks/bench_prefill.py's row on a tiny layer under the interpreter (its CUDA-graph timer
    and cuBLAS ideal replaced by constants): each candidate ran the layer and met the reference;
    a candidate that cannot run is recorded, not fatal."""
    if device.name != "cpu":
        pytest.skip("the GPU run is the benchmark itself")
    from megamoe.kernels import bench as kb

    bp = _bench_prefill()
    monkeypatch.setattr(kb, "graph_time_us", lambda fn, xs, reps: 100.0)
    monkeypatch.setattr(kb, "ideal_grouped_rate", lambda cfg, T: 1e12)
    cfg = MoEConfig(**BASE)
    w = random_weights(cfg, seed=2).to_torch("cpu", torch.float32)
    ceil = {"matmul_flops_per_s": 1e12, "read_bytes_per_s": 1e12}
    r = bp.bench_row("tiny", cfg, w, 19, ceil, ["current", "tma16", "tma16:num_warps=0"], reps=1, sample=5,
                     with_torch=False, with_ideal=True, device="cpu")
    c = r["candidates"]
    assert c["current"]["ok"] and c["tma16"]["ok"], r
    assert c["tma16"]["config"]["gemm1"]["variant"] == "tma_persistent"
    assert c["current"]["config"]["gemm1"]["variant"] == "pointer"
    assert "positive integer" in c["tma16:num_warps=0"]["error"]
    assert r["best"] in ("current", "tma16") and r["best_speedup_vs_current"] == 1.0
    assert c["tma16"]["over_ideal_rate"] == pytest.approx(r["routed_flops"] / 100e-6 / 1e12)
    assert bp.fmt_row(r)[0].startswith("tiny T=19")
