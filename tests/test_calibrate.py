"""Calibration: the microbenchmark kernels compute the right thing (interpreter, tiny sizes; never
timed), and the profile ``megamoe calibrate`` writes is one the loader and the cost model take."""

from __future__ import annotations

import json

import pytest
import torch

from megamoe.simulator import load_profile
from megamoe.simulator.cost import hbm_rate, mma_rate_per_sm, occupancy, sm_copy_rate
from megamoe.simulator.task_cost import predict_task_plan


@pytest.mark.interpret
def test_microbench_kernels_compute_what_they_claim():
    pytest.importorskip("triton")
    from megamoe.calibrate import microbench as mb

    x = torch.randn(8 * 256)
    mb.stream_read(x, 4, 512, block=128, offset=0, check=True)  # 4 programs x 1 KiB-ish each
    mb.stream_read(x, 2, 256, block=128, offset=512, check=True)  # an offset start
    mb.mma(torch.randn(16, 64), torch.randn(64, 32), 3, block_k=32, check=True)
    mb.mma(torch.randn(2, 16, 64), torch.randn(2, 64, 32), 3, block_k=32, check=True)  # programs over 2 copies
    mb.mma_resident(torch.randn(16, 32), torch.randn(32, 16), 2, 3, check=True)  # 3 steps on chip
    e4m3 = torch.float8_e4m3fn  # the FP8 step's operands: e4m3 x e4m3 into fp32
    c, _ = mb.mma_resident(torch.randn(16, 32).to(e4m3), torch.randn(32, 16).to(e4m3), 2, 3, check=True)
    assert c.dtype == torch.float32
    with pytest.raises(ValueError, match="two float8_e4m3fn operands or none"):
        mb.mma_resident(torch.randn(16, 32).to(e4m3), torch.randn(32, 16), 1, 1)
    w = torch.randn(4 * 16 * 32)
    mb.stream_tile(w, 3, 16 * 32 * 4, block_n=16, block_k=16, block_m=16, num_stages=1, check=True)  # 2 K tiles
    # the L2 form: 5 programs over the regions of 2, each cycling 2 of its K tiles 3.5 times
    mb.stream_tile(w, 5, 16 * 16 * 4 * 7, block_n=16, block_k=16, block_m=16, num_stages=1, check=True,
                   wrap_bytes=16 * 16 * 4 * 2, wrap_programs=2)
    tile = 16 * 16 * w.element_size()
    for bad, match in ((dict(bytes_per_program=1000), "must be a positive multiple of"),
                       (dict(bytes_per_program=tile, wrap_bytes=tile // 2), "wrap_bytes=.* must be a positive multiple"),
                       (dict(bytes_per_program=tile, wrap_programs=0), "wrap_programs must be >= 1"),
                       (dict(bytes_per_program=64 * tile), "reads past the end of w")):
        with pytest.raises(ValueError, match=match):
            mb.stream_tile(w, 1, block_n=16, block_k=16, **bad)
    mb.empty(x)
    mb.handoff(7, 1, "cpu", check=True)  # the interpreter runs programs one by one: one program
    mb.barrier(5, 1, "cpu", check=True)
    owner = mb.tickets(9, 1, "cpu", check=True)
    assert owner.tolist() == [0] * 9
    src = torch.randn(10, 40)
    idx = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6], dtype=torch.int32)  # repeats: a gather, not a permutation
    mb.gather_copy(src, idx, 3, block_h=16, check=True)  # H = 40: a masked last block
    mb.serial_load(torch.randn(16, 3 * 32), torch.randn(3 * 32, 16), 3, block_h=32, check=True)
    mb.serial_reduce(torch.randn(16, 32), 5, check=True)
    with pytest.raises(ValueError, match="multiple of block"):
        mb.stream_read(x, 1, 100, block=128)


def test_dense_gemm_microbench_computes_a_gemm():
    """The dense GEMM microbenchmark (every loop form: a tile per program or persistent programs,
    fewer than the tiles; pointer or TMA loads) against torch, odd tile counts and a grouped order
    whose last group is short (output poisoned first); bad shapes and forms are refused by name."""
    from megamoe.calibrate.microbench_gemm import LOADS, dense_gemm

    a, w = torch.randn(80, 96), torch.randn(96, 96)  # 5 row blocks: groups of 2, 2, 1
    for form, gated in ((f, v.gated) for f, v in LOADS.items()):
        c = torch.full((80, 48 if gated else 96), float("nan"))  # gated: w is 48 gate rows, then 48 up rows
        dense_gemm(a, w, block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=2, loads=form, programs=4,
                   group_m=2, out=c, check=True)
        assert not c.isnan().any(), form
    with pytest.raises(ValueError, match="gate rows then up rows"):
        dense_gemm(a, w[:95], block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=2, loads="pointer_gated")
    with pytest.raises(ValueError, match="loads must be one of"):
        dense_gemm(a, w, block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=2, loads="tma_a")
    with pytest.raises(ValueError, match="N = 40 must be a multiple"):
        dense_gemm(a, torch.randn(40, 96), block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=2)
    with pytest.raises(ValueError, match="K differs"):
        dense_gemm(a, torch.randn(48, 64), block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=2)


def _deep_rate(n, d, g, b):
    """The fake deep readers' bytes/s: more programs, deeper pipelines, longer reads and sharing read faster."""
    return 3e10 * n * (1 + d / (256 << 10)) * (1 + g / 8) * (1 + b / (8 << 20))


def _fake_measurements(S=132):
    return {
        "launch": {"launch_gap_s": 7e-7, "graph_fixed_s": 3e-6},
        "sync": {"flag_handoff_s": 6e-7, "grid_barrier_s": 9e-7, "ticket_s": 4e-8},
        "hbm": {"points": [[n, b, min(4.4e12, n * b / 2e-6)] for n in (1, S, 8 * S) for b in (16384, 1 << 20)],
                "l2_bytes_per_s": 9e12},
        "mma": {"points": [[16, 64, 4, d, 1.5e12 + d * 1e8] for d in (256, 4096)]
                + [[128, 128, 8, d, 4e12 + d * 1e8] for d in (256, 4096)], "occupancy": {4: 3, 8: 1}},
        "gemm": {"points_pointer": [[128, 128, 8, d, 2e12 + d * 1e8] for d in (256, 4096)],
                 "points_tma": [[128, 128, 8, d, 3e12] for d in (256, 4096)],
                 "points_tma_persistent": [[128, 128, 8, d, 3.5e12] for d in (256, 4096)],
                 "points_pointer_persistent_gated": [[128, 256, 8, d, 2.5e12] for d in (256, 4096)]},
        "mma_fp8": {"points": [[16, 64, 4, d, 1.2e12 + d * 1e8] for d in (256, 4096)]
                    + [[128, 128, 8, d, 7e12 + d * 1e8] for d in (256, 4096)]},
        "copy": {"points": [[1, 9e10], [16, 7e10], [S, 3e10]]},
        "serial": {"serial_load_step_s": 5e-8, "serial_reduce_step_s": 3e-8},
        "select": {"points": [[1, 128, 8, 1, 32, 1, 1.5e-5], [3, 256, 8, 8, 32, 2, 5e-5], [3, 256, 8, 8, 16, 1, 4e-5]]},
        "l2_shared": {"points": [[n, g, 5e12 + n * 1e10 + g * 2e11] for n in (16, S // 2, S, 2 * S)
                                 for g in (1, 4, 8)]},
        "hbm_deep": {"points": [[n, d, g, b, _deep_rate(n, d, g, b)] for n in (16, 33, 66, S)
                                for d in (48 << 10, 128 << 10) for g in (1, 4) for b in (256 << 10, 4 << 20)]},
        "sustained": _fake_sustained(),
    }


#: the fake sustained GPU: 1.1e12 flop a matmul at 800 TFLOP/s for the first 30 ms of work, at 680
#: after, and 30 us of fixed cost per replay
SUSTAINED_FLOPS = 2.0 * 8192 ** 3


def _sustained_seconds(n):
    t_full = SUSTAINED_FLOPS / 800e12
    fast = min(n, 0.03 // t_full)
    return 30e-6 + fast * t_full + (n - fast) * SUSTAINED_FLOPS / 680e12


def _fake_sustained():
    from megamoe.calibrate import sustained_fit

    return sustained_fit(SUSTAINED_FLOPS, [[n, _sustained_seconds(n), 1980] for n in (4, 15, 44, 109, 218)],
                         recheck=[4, _sustained_seconds(4), 1980])


@pytest.mark.parametrize("device, name", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                          ("NVIDIA GH200 480GB", "gh200"), ("Tesla", "tesla"), ("", "gpu")])
def test_the_calibrated_profile_is_named_after_the_gpu_it_measured(device, name):
    """Calibrating an H100 on the h200 base gives "h100-calibrated", never the base's name."""
    from megamoe.calibrate.profile import gpu_slug

    assert gpu_slug(device) == name


def test_calibrated_profile_loads_and_drives_the_cost_model(tmp_path):
    from megamoe.calibrate import build_profile
    from megamoe.calibrate.summary import summary

    prov = {"gpu": "NVIDIA H200", "torch": "x", "triton": "y", "commit": "c", "date": "2026-12-02", "num_sms": 132,
            "l2_bytes": 62914560}
    m = _fake_measurements()
    prof = build_profile(load_profile("h200").to_dict(), m, prov)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(prof))
    p = load_profile(str(path))  # --system path.json
    assert p.name == "h200-calibrated"
    assert p.kernel.calibrated and p.kernel.flag_handoff_s == 6e-7 and p.kernel.graph_fixed_s == 3e-6
    assert p.hbm_effective_bytes_per_s == pytest.approx(4.4e12)
    assert p.kernel.sources["mma"] == "measured by megamoe calibrate on NVIDIA H200 2026-12-02"
    assert occupancy(p, 4) == 3 and occupancy(p, 8) == 1
    assert hbm_rate(p, 132, 1 << 20) == pytest.approx(min(4.4e12, 132 * (1 << 20) / 2e-6))
    assert mma_rate_per_sm(p, 16, 64, 256, 4) == pytest.approx(1.5e12 + 256 * 1e8)
    assert sm_copy_rate(p, 16) == pytest.approx(7e10)
    assert p.kernel.route_select == tuple(sorted(tuple(float(x) for x in q) for q in m["select"]["points"]))
    assert "flag handoff" in summary(m, prof) and "route select, sigmoid_grouped_topk E<=256 K=8" in summary(m, prof)
    from megamoe.reference import MoEConfig
    from megamoe.reference.tiles import task_plan

    cfg = MoEConfig.preset("qwen3-30b-a3b")
    tiles = {"router": {"BLOCK_T": 16, "BLOCK_H": 64, "SPLIT": 4}, "gemm1": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128},
             "gemm2": {"BLOCK_N": 64, "BLOCK_K": 128}, "shared": {"BLOCK_M": 16, "BLOCK_N1": 64, "BLOCK_N2": 64, "BLOCK_K": 128},
             "combine": {"BLOCK_T": 1, "BLOCK_H": 1024}, "order": {"GROUP_M": 8}}
    counts = [1] * 8 + [0] * (cfg.num_experts - 8)
    r = predict_task_plan(task_plan(cfg, __import__("numpy").array(counts), 1, tiles, num_programs=264), p)
    assert r["time_us"] > r["fixed_us"] > 0 and r["critical_path_us"]["router_logits"] > 0


def test_calibrate_without_a_gpu_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from megamoe.cli import main

    assert main(["calibrate", "--out", "unused"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_budget_plans_full_quick_or_no_step():
    from megamoe.calibrate.plan import STEP_COST_S, STEPS, plan_step

    assert plan_step("launch", 1e9, quick=False) == "full"
    assert plan_step("launch", 1e9, quick=True) == "quick"
    rest_quick = sum(STEP_COST_S[k][1] for k in STEPS[STEPS.index("mma") + 1:])
    assert plan_step("mma", STEP_COST_S["mma"][0] + rest_quick - 1, quick=False) == "quick"  # full would crowd out the rest
    assert plan_step("sync", 1.0, quick=False) is None


def test_profile_from_some_steps_keeps_the_base_numbers_of_the_others():
    from megamoe.calibrate import build_profile
    from megamoe.calibrate.summary import summary
    from megamoe.simulator.hardware import validate

    prov = {"gpu": "NVIDIA H200", "date": "2026-12-02", "num_sms": 132}
    m = {k: v for k, v in _fake_measurements().items() if k not in ("mma", "sync")}
    base = load_profile("h200")
    prof = build_profile(base.to_dict(), m, prov)
    p = validate(prof)  # the loader takes it
    assert prof["calibration"]["not_measured"] == ["mma", "sync"]
    assert p.kernel.mma == () and p.kernel.flag_handoff_s == base.grid_sync_s  # derived from the base profile
    assert p.kernel.launch_gap_s == 7e-7 and p.hbm_effective_bytes_per_s == pytest.approx(4.4e12)
    text = summary(m, prof)
    assert "flag handoff" not in text and "not measured (the base profile's numbers kept): mma, sync" in text


def test_calibrate_run_records_a_failed_step_and_writes_after_each(tmp_path, monkeypatch, capsys):
    """The run loop with the GPU parts replaced: a step that raises is recorded, the others go on,
    and the profile written loads."""
    from megamoe.calibrate import driver as calibrate
    from megamoe.calibrate.plan import STEPS
    from megamoe.cli import main

    fake = _fake_measurements()
    seen = []

    def measure(name, reps, S, gap_s, quick):
        seen.append((name, quick, (tmp_path / "cal" / "profile.json").exists()))
        if name == "copy":
            raise RuntimeError("out of resources")
        return fake[name]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(calibrate, "provenance", lambda: {"gpu": "NVIDIA H200", "torch": "x", "triton": "y",
                                                          "date": "2026-12-02", "num_sms": 132, "l2_bytes": 0})
    monkeypatch.setattr(calibrate, "_measure", measure)
    monkeypatch.setattr(calibrate, "_cuda_alive", lambda: True)
    assert main(["calibrate", "--out", str(tmp_path / "cal"), "--budget", "1000"]) == 0
    assert [s[0] for s in seen] == list(STEPS) and not any(q for _, q, _ in seen)
    assert [w for *_, w in seen] == [False] + [True] * (len(STEPS) - 1)  # rewritten after every step
    prof = json.loads((tmp_path / "cal" / "profile.json").read_text())
    assert prof["calibration"]["errors"] == {"copy": "RuntimeError: out of resources"}
    assert prof["calibration"]["not_measured"] == ["copy"]
    assert load_profile(str(tmp_path / "cal" / "profile.json")).kernel.calibrated
    assert "copy: FAILED" in capsys.readouterr().err
    # a small budget: later steps in their quick form or skipped, and still a profile
    seen.clear()
    assert main(["calibrate", "--out", str(tmp_path / "cal2"), "--budget", "40"]) == 0
    prof = json.loads((tmp_path / "cal2" / "profile.json").read_text())
    assert any(q for _, q, _ in seen) and prof["calibration"]["skipped"]


def test_fp8_mma_points_travel_to_the_profile_and_drive_fp8_rates():
    """microbench.json's mma_fp8 points -> kernel_model.mma_fp8 -> mma_rate_per_sm(dtype="fp8"),
    unscaled; without them fp8 is the bf16 table x the fp8/bf16 peak ratio (the profile's peaks)."""
    from megamoe.calibrate import build_profile
    from megamoe.calibrate.summary import summary
    from megamoe.simulator.hardware import validate

    prov = {"gpu": "NVIDIA H200", "date": "2026-12-02", "num_sms": 132}
    m = _fake_measurements()
    prof = build_profile(load_profile("h200").to_dict(), m, prov)
    p = validate(prof)
    assert p.kernel.sources["mma_fp8"] == "measured by megamoe calibrate on NVIDIA H200 2026-12-02"
    assert mma_rate_per_sm(p, 16, 64, 256, 4, dtype="fp8") == pytest.approx(1.2e12 + 256 * 1e8)
    assert mma_rate_per_sm(p, 128, 128, 4096, 8, dtype="fp8") == pytest.approx(7e12 + 4096 * 1e8)
    assert mma_rate_per_sm(p, 16, 64, 256, 4) == pytest.approx(1.5e12 + 256 * 1e8)  # bf16 keeps its own
    assert "mma fp8 128x128 8 warps" in summary(m, prof)

    m.pop("mma_fp8")  # not measured: the ratio of the profile's peaks
    prof = build_profile(load_profile("h200").to_dict(), m, prov)
    p = validate(prof)
    assert "mma_fp8" not in prof["kernel_model"] and "mma_fp8" in prof["calibration"]["not_measured"]
    ratio = p.tensor_flops_per_s["fp8"] / p.tensor_flops_per_s["bf16"]
    assert p.kernel.mma_fp8 == () and ratio > 1
    assert mma_rate_per_sm(p, 16, 64, 256, 4, dtype="fp8") == pytest.approx((1.5e12 + 256 * 1e8) * ratio)


def test_sustained_dense_rate_caps_the_tile_table_and_stream_rate_is_marginal(tmp_path):
    """The dense GEMM's measured rate caps the on-chip tile table (per SM); without it the table
    stands. The persistent tasks' HBM rate is the grid's marginal rate between its two largest
    reads, never below their one-shot rate."""
    from megamoe.calibrate import build_profile
    from megamoe.simulator.cost import hbm_stream_rate

    prov = {"gpu": "NVIDIA H200", "torch": "x", "triton": "y", "commit": "c", "date": "2026-12-02", "num_sms": 132}
    def profile(m, name):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(build_profile(load_profile("h200").to_dict(), m, prov)))
        return load_profile(str(path))

    m = _fake_measurements()
    p0 = profile(m, "table")
    m["mma"]["dense_flops_per_s"] = 132 * 3e12
    p1 = profile(m, "capped")
    assert p0.kernel.mma_sustained_flops_per_s == 0 and p1.kernel.mma_sustained_flops_per_s == 132 * 3e12
    assert mma_rate_per_sm(p0, 128, 128, 4096, 8) == pytest.approx(4e12 + 4096 * 1e8)
    assert mma_rate_per_sm(p1, 128, 128, 4096, 8) == pytest.approx(3e12)  # capped
    assert mma_rate_per_sm(p1, 16, 64, 256, 4) == pytest.approx(1.5e12 + 256 * 1e8)  # below the cap
    # fake grid: t = n b / min(4.4e12, n b / 2 us): at 132 programs both reads take 2 us or are
    # HBM-bound, so the marginal rate is the HBM rate wherever the larger read is bandwidth-bound
    t1, t2 = 132 * 16384 / hbm_rate(p1, 132, 16384), 132 * (1 << 20) / hbm_rate(p1, 132, 1 << 20)
    assert hbm_stream_rate(p1, 132) == pytest.approx(max(132 * ((1 << 20) - 16384) / (t2 - t1),
                                                         hbm_rate(p1, 132, 1 << 20)))


def test_dense_gemm_tables_price_pointer_and_tma_tiles(tmp_path):
    """microbench.json's gemm points -> kernel_model.gemm_pointer / gemm_tma -> the rate a kernel
    of that load kind reads; "any" and profiles without them read the on-chip mma table."""
    from megamoe.calibrate import build_profile
    from megamoe.calibrate.summary import summary

    prov = {"gpu": "NVIDIA H200", "torch": "x", "triton": "y", "commit": "c", "date": "2026-12-02", "num_sms": 132}
    m = _fake_measurements()
    prof = build_profile(load_profile("h200").to_dict(), m, prov)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    p = load_profile(str(path))
    assert mma_rate_per_sm(p, 128, 128, 256, 8, loads="pointer") == pytest.approx(2e12 + 256 * 1e8)
    assert mma_rate_per_sm(p, 128, 128, 1024, 8, loads="tma") == pytest.approx(3e12)
    assert mma_rate_per_sm(p, 128, 128, 256, 8) == pytest.approx(4e12 + 256 * 1e8)  # loads="any": on chip
    # below GEMM_TABLE_MIN_ROWS rows the dense GEMM is bound by its operand traffic: the on-chip table
    assert mma_rate_per_sm(p, 16, 64, 256, 4, loads="pointer") == mma_rate_per_sm(p, 16, 64, 256, 4)
    # persistent loops read their own table, or the nearest measured one (GEMM_LOADS' fallbacks)
    assert mma_rate_per_sm(p, 128, 128, 1024, 8, loads="tma_persistent") == pytest.approx(3.5e12)
    assert mma_rate_per_sm(p, 128, 128, 1024, 8, loads="tma_ab_persistent") == pytest.approx(3.5e12)
    assert (mma_rate_per_sm(p, 128, 128, 256, 8, loads="pointer_persistent")
            == mma_rate_per_sm(p, 128, 128, 256, 8, loads="pointer"))
    # gated forms: the table row is the whole GEMM 1 tile (BLOCK_N = gate + up columns)
    assert mma_rate_per_sm(p, 128, 256, 1024, 8, loads="pointer_persistent_gated") == pytest.approx(2.5e12)
    assert mma_rate_per_sm(p, 128, 128, 1024, 8, loads="tma_persistent_gated") == pytest.approx(3.5e12)
    text = summary(m, prof)
    assert "gemm pointer" in text and "gemm tma_persistent" in text and "128x128" in text
    del m["gemm"]
    path.write_text(json.dumps(build_profile(load_profile("h200").to_dict(), m, prov)))
    q = load_profile(str(path))
    assert mma_rate_per_sm(q, 128, 128, 256, 8, loads="pointer") == mma_rate_per_sm(q, 128, 128, 256, 8)
    with pytest.raises(ValueError, match="loads must be"):
        mma_rate_per_sm(p, 128, 128, 256, 8, loads="ldmatrix")


_COMPILE_DENSE = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource
from megamoe.calibrate.microbench_gemm import _dense_gemm_kernel as fn

target = GPUTarget("cuda", 90, 32)
ints = {"M": 4096, "N": 4096, "K": 1024}
nospec = set(getattr(fn, "do_not_specialize", ()) or ())
out = {}
for persistent, flat in ((False, False), (True, True)):
    signature, constexprs, attrs = {}, {}, {}
    for i, (p, n) in enumerate(zip(fn.params, fn.arg_names)):
        if p.is_constexpr or n in ("w_desc", "a_desc"):
            signature[n] = "constexpr"
            constexprs[n] = {"w_desc": None, "a_desc": None, "PERSISTENT": persistent, "TMA": False, "TMA_A": False,
                             "GATED": persistent, "FLAT": flat, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}[n]
            continue
        signature[n] = "i32" if n in ints else "*bf16"
        if n not in nospec and i not in nospec and (n not in ints or ints[n] % 16 == 0):
            attrs[(i,)] = CUDABackend(target).parse_attr("D")  # as the JIT marks a 16-divisible argument
    k = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                       options={"num_warps": 8, "num_stages": 3})
    ptx = k.asm["ptx"]
    out[f"{persistent}-{flat}"] = [len(re.findall(p, ptx)) for p in (r"cp\.async\.cg", r"wgmma\.mma_async", r"ld\.global")]
print(json.dumps(out))
"""


def test_dense_gemm_microbench_compiles_to_a_pipelined_tile_loop():
    """Compiled for sm_90 as the JIT specializes a launch (16-byte aligned pointers, integers
    divisible by 16 unless do_not_specialize), the pointer-load tile loop, one tile per program and
    persistent with the walk flattened into the K loop, is cp.async-pipelined into wgmma, with no
    scalar global loads (a K left unspecialized compiles to scalar loads).
    (In a process without TRITON_INTERPRET: the kernel calls a jitted tile function.)"""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE_DENSE], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    for persistent, (cp_async, wgmma, ld_global) in counts.items():
        assert cp_async > 0 and wgmma > 0 and ld_global == 0, (persistent, counts)


def _fake_timed(last):
    """graph_seconds with the GPU replaced: runs fn once (the fake kernels set last["t"]) and
    returns that time."""
    def timed(fn, **kw):
        fn(0)
        return last["t"]
    return timed


def test_l2_shared_step_times_every_program_count_and_group(monkeypatch):
    """measure_l2_shared with fake timings (gap + bytes at a rate of P and g): its points are
    [P, g, bytes/s] with the launch gap taken off, over S/8, S/2, S, 2S programs and the groups."""
    from megamoe.calibrate import memory as calibrate
    from megamoe.calibrate import microbench_shared as ms

    last, seen = {}, []

    def fake_read(w, P, g, per, **kw):
        seen.append((P, g, per))
        last["t"] = 1e-6 + P * per / (1e12 * (1 + P / 100) * (1 + g / 10))

    with monkeypatch.context() as mp:
        mp.setattr(ms, "l2_shared_read", fake_read)
        mp.setattr(calibrate, "graph_seconds", _fake_timed(last))
        mp.setattr(torch, "randn", lambda *a, **kw: torch.zeros(1))  # no CUDA buffer
        full = calibrate.measure_l2_shared(1, 132, 1e-6)
        quick = calibrate.measure_l2_shared(1, 132, 1e-6, quick=True)
    assert [p[:2] for p in full["points"]] == [[P, g] for P in (16, 66, 132, 264, 396) for g in calibrate.L2_SHARED_GROUPS]
    assert [p[:2] for p in quick["points"]] == [[P, g] for P in (66, 132) for g in (1, 8)]
    for P, g, r in full["points"]:
        assert r == pytest.approx(1e12 * (1 + P / 100) * (1 + g / 10))
    assert {per for *_, per in seen} == {calibrate.L2_SHARED_PER_PROGRAM}


def test_shared_read_table_travels_to_the_profile(tmp_path):
    """microbench.json's l2_shared -> kernel_model.l2_shared_read (a grid over programs x sharing
    group) with the calibrate source; a table that does not fill its grid is refused by name; a step
    not measured writes none."""
    from megamoe.calibrate import build_profile
    from megamoe.calibrate.summary import summary
    from megamoe.simulator.hardware import ProfileError, validate

    prov = {"gpu": "NVIDIA H200", "date": "2026-12-02", "num_sms": 132}
    m = _fake_measurements()
    prof = build_profile(load_profile("h200").to_dict(), m, prov)
    km = prof["kernel_model"]
    assert km["l2_shared_read"]["source"] == "measured by megamoe calibrate on NVIDIA H200 2026-12-02"
    assert km["l2_shared_read"]["over"] == ["programs", "sharing_group"] and km["l2_shared_read"]["unit"] == "bytes/s"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    k = load_profile(str(path)).kernel
    assert k.l2_shared_programs == (16.0, 66.0, 132.0, 264.0) and k.l2_shared_groups == (1.0, 4.0, 8.0)
    assert k.l2_shared_rate[2][1] == pytest.approx(5e12 + 132 * 1e10 + 4 * 2e11)  # (132 programs, g = 4)
    assert "L2 shared read, 132 programs, g = 1/4/8" in summary(m, prof)
    bad = json.loads(json.dumps(prof))
    bad["kernel_model"]["l2_shared_read"]["points"].pop()
    with pytest.raises(ProfileError, match="l2_shared_read.points must fill a grid of programs x sharing_group"):
        validate(bad)
    m3 = {k2: v for k2, v in _fake_measurements().items() if k2 != "l2_shared"}
    prof3 = build_profile(load_profile("h200").to_dict(), m3, prov)
    assert "l2_shared_read" not in prof3["kernel_model"] and prof3["calibration"]["not_measured"] == ["l2_shared"]
    assert validate(prof3).kernel.l2_shared_rate == ()


def test_launch_fit_takes_each_graph_size_median_over_rounds():
    """A first round taken at idle clocks (one kernel's graph 24.4 us, sixteen's 12.2 us) does
    not move the fit: each size's median over the rounds, then fixed + N x gap by least squares."""
    from megamoe.calibrate.latency import LAUNCH_GRAPH_SIZES, launch_fit

    ns = LAUNCH_GRAPH_SIZES
    true = [10e-6 + n * 0.4e-6 for n in ns]
    slow = [24.4e-6, 30e-6, 12.2e-6, 40e-6]
    fit = launch_fit(ns, [slow, true, [t * 1.01 for t in true]])
    assert fit["graph_fixed_s"] == pytest.approx(10e-6, rel=0.03)
    assert fit["launch_gap_s"] == pytest.approx(0.4e-6, rel=0.03)
    assert len(fit["rounds"]) == 3 and [n for n, _ in fit["points"]] == list(ns)
    assert launch_fit((1, 64), [[1e-6, 100e-6]])["graph_fixed_s"] == 0.0  # never negative


def test_hbm_deep_step_times_every_reader_program_group_and_size(monkeypatch):
    """measure_hbm_deep with the GPU replaced (each launch: 5 us of overhead + its bytes at a rate of
    P, depth, g): [P, depth, g, b, bytes/s] over S/8 .. S programs (at most one per SM), the readers'
    depths, the groups and sizes, the overhead taken off; the quick form's smaller grid; a reader that
    fails leaves out its depth only, named under "failed"."""
    from megamoe.calibrate import memory as calibrate
    from megamoe.calibrate import microbench as mb
    from megamoe.calibrate import microbench_deep as md

    last, seen = {}, []

    class Compiled:
        class metadata:
            shared = 12345

    def fake_read(w, P, b, *, group=1, block_n, block_k, num_stages, gated, a, out):
        d = md.deep_read_depth(block_n, block_k, num_stages, gated=gated)
        if fail and d == fail:
            raise RuntimeError("out of resource: shared memory")
        seen.append((P, d, group, b))
        assert P <= 132 and a.shape == (16, block_k)
        last["t"] = 5e-6 + P * b / _deep_rate(P, d, group, b)
        return out[:P], Compiled

    def empty(x):
        last["t"] = 5e-6

    def timed(fn, **kw):
        fn()
        return last["t"]

    with monkeypatch.context() as mp:
        mp.setattr(md, "deep_read", fake_read)
        mp.setattr(mb, "empty", empty)
        mp.setattr(calibrate, "flushed_seconds", timed)
        zeros = torch.zeros
        for name in ("ones", "empty"):  # CPU stand-ins for the CUDA buffers (the weights: one value)
            mp.setattr(torch, name, lambda shape, **kw: zeros(shape if isinstance(shape, tuple) else 1))
        fail = None
        full = calibrate.measure_hbm_deep(1, 132)
        quick = calibrate.measure_hbm_deep(1, 132, quick=True)
        fail = 96 << 10
        failed = calibrate.measure_hbm_deep(1, 132)
    depths = [32 << 10, 48 << 10, 96 << 10, 128 << 10, 192 << 10]
    assert [p[:4] for p in full["points"]] == [[P, d, g, b] for d in depths for P in (16, 33, 66, 132)
                                               for g in calibrate.HBM_DEEP_GROUPS for b in calibrate.HBM_DEEP_SIZES]
    for P, d, g, b, r in full["points"]:  # the 5 us of launch overhead taken off, as the hbm step does
        t = P * b / _deep_rate(P, d, g, b)
        assert r == pytest.approx(P * b / max(t, 0.5 * (5e-6 + t)))
    assert [p[:4] for p in quick["points"]] == [[P, d, g, b] for d in (48 << 10, 128 << 10) for P in (33, 132)
                                                for g in (1, 4) for b in (256 << 10, 4 << 20)]
    assert full["shared_bytes"]["128x128x3 gated"] == 12345 and full["readers"]["64x128x4"] == 48 << 10
    assert "failed" not in full and list(failed["failed"]) == ["64x128x4 gated"]
    assert sorted({p[1] for p in failed["points"]}) == [32 << 10, 48 << 10, 128 << 10, 192 << 10]
    assert calibrate.hbm_deep_programs(132) == [16, 33, 66, 132] and calibrate.hbm_deep_programs(8) == [1, 2, 4, 8]


def test_hbm_deep_table_travels_to_the_profile_and_the_loader_checks_its_grid(tmp_path):
    """microbench.json's hbm_deep points -> kernel_model.hbm_deep_read (programs x bytes in flight x
    sharing group x bytes per program, the calibrate source) -> the kernel model's grid, which the
    deep rate reads at its points; the summary names it; a grid with a hole, a group below 1 or a
    step not measured: refused, or no table."""
    from megamoe.calibrate import build_profile
    from megamoe.calibrate.summary import summary
    from megamoe.simulator.cost import deep_read_rate
    from megamoe.simulator.hardware import HBM_DEEP_AXES, ProfileError, validate

    prov = {"gpu": "NVIDIA H200", "date": "2026-12-02", "num_sms": 132}
    m = _fake_measurements()
    prof = build_profile(load_profile("h200").to_dict(), m, prov)
    t = prof["kernel_model"]["hbm_deep_read"]
    assert t["over"] == list(HBM_DEEP_AXES) and t["unit"] == "bytes/s"
    assert t["source"] == "measured by megamoe calibrate on NVIDIA H200 2026-12-02"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    k = load_profile(str(path)).kernel
    assert k.hbm_deep_programs == (16.0, 33.0, 66.0, 132.0) and k.hbm_deep_depths == (49152.0, 131072.0)
    assert k.hbm_deep_groups == (1.0, 4.0) and k.hbm_deep_bytes == (262144.0, 4194304.0)
    assert k.hbm_deep_rate[3][1][0][1] == pytest.approx(_deep_rate(132, 128 << 10, 1, 4 << 20))
    p = load_profile(str(path))
    assert deep_read_rate(p, 66, 48 << 10, 4, 256 << 10) == pytest.approx(_deep_rate(66, 48 << 10, 4, 256 << 10))
    assert "HBM deep read, 128 KiB in flight, g = 4, 4096 KiB each, 16/33/66/132 programs" in summary(m, prof)
    bad = json.loads(json.dumps(prof))
    bad["kernel_model"]["hbm_deep_read"]["points"].pop()
    with pytest.raises(ProfileError, match="hbm_deep_read.points must fill a grid of programs_in_flight x "
                                           "bytes_in_flight x sharing_group x bytes_per_program"):
        validate(bad)
    bad = json.loads(json.dumps(prof))
    for q in bad["kernel_model"]["hbm_deep_read"]["points"]:
        q[2] = q[2] / 2  # groups 0.5 and 2
    with pytest.raises(ProfileError, match="sharing_group must be >= 1"):
        validate(bad)
    m.pop("hbm_deep")
    prof = build_profile(load_profile("h200").to_dict(), m, prov)
    assert "hbm_deep_read" not in prof["kernel_model"] and "hbm_deep" in prof["calibration"]["not_measured"]
    assert validate(prof).kernel.hbm_deep_rate == ()
    assert "HBM deep read" not in summary(m, prof)


def test_sustained_step_times_each_graph_once_after_a_pause(monkeypatch):
    """measure_sustained with the GPU replaced (a graph of N matmuls: 30 us + N matmuls at 800
    TFLOP/s for 30 ms, 680 after): graphs sized from the per-matmul time for 5, 20, 60, 150, 300 ms
    (quick: 20, 60, 300), shortest first, each replayed once after SUSTAINED_PAUSE_S idle, the full
    form's shortest once more; its points are each graph's average rate / the best, its marginal
    rates the extra matmuls' between two graphs."""
    from megamoe.calibrate import sustained as calibrate

    per = SUSTAINED_FLOPS / 800e12  # 1.374 ms
    replays = []

    class Graph:
        def __init__(self, count):
            self.count = count

        def replay(self):
            replays.append(self.count)

    def idle(replay, pause_s, clock=None):
        replay()
        replays[-1] = (replays[-1], pause_s)
        if clock is not None:
            clock["sm_clock_mhz"] = {"mean": 2000.0 - replays[-1][0]}
        return _sustained_seconds(replays[-1][0])

    with monkeypatch.context() as mp:
        mp.setattr(calibrate, "graph_seconds", lambda fn, **kw: per)
        mp.setattr(calibrate, "matmul_graph", lambda a, b, c, count, between=None: Graph(count))
        mp.setattr(calibrate, "idle_replay_seconds", idle)
        mp.setattr(calibrate, "measure_duty", lambda a, b, c, per_s, ref: [{"duty": 0.5, "per_matmul_s": per_s}])
        mp.setattr(calibrate, "sm_clock_mhz", lambda: 1515)
        for name in ("randn", "empty"):
            mp.setattr(torch, name, lambda *a, **kw: torch.zeros(1))
        full = calibrate.measure_sustained(5)
        n_full = list(replays)
        replays.clear()
        quick = calibrate.measure_sustained(5, quick=True)
    counts = [4, 15, 44, 109, 218]  # round(busy / 1.374 ms)
    assert n_full == [(n, calibrate.SUSTAINED_PAUSE_S) for n in counts + [4]]
    assert replays == [(n, calibrate.SUSTAINED_PAUSE_S) for n in (15, 44, 218)]
    assert [r[0] for r in full["rates"]] == counts and [r[0] for r in quick["rates"]] == [15, 44, 218]
    assert full["sm_clock_mhz_mean"] == [2000.0 - n for n in counts]  # the recheck's left out
    assert full["duty"] == [{"duty": 0.5, "per_matmul_s": per}] and "duty" not in quick
    best = max(n * SUSTAINED_FLOPS / _sustained_seconds(n) for n in counts)
    assert full["reference_flops_per_s"] == pytest.approx(best)
    for (n, t, r), (busy, ratio) in zip(full["rates"], full["points"]):
        assert t == busy == _sustained_seconds(n) and ratio == pytest.approx(r / best) and ratio <= 1
    assert full["points"][1][1] == 1.0 and full["points"][-1][1] < 0.9  # 15 matmuls (20.6 ms) all fast
    assert full["marginal"][-1][2] == pytest.approx(680e12)  # 109 -> 218 matmuls: all past 30 ms
    assert full["recovery"] == 1.0 and "recovery" not in quick
    assert full["sm_clock_mhz_after"] == [1515] * 5 and full["size"] == 8192 and full["per_matmul_s"] == per


def test_sustained_table_travels_to_the_profile_and_the_loader_checks_it(tmp_path):
    """microbench.json's sustained points -> kernel_model.sustained_mma (fraction over busy_s, the
    calibrate source) -> the kernel model's table, which cost.sustained_ratio reads at its points;
    the summary names it; a ratio above 1 or a busy duration twice is refused; not measured: no
    table, and the ratio is 1."""
    from megamoe.calibrate import build_profile
    from megamoe.calibrate.summary import summary
    from megamoe.simulator.cost import sustained_ratio
    from megamoe.simulator.hardware import ProfileError, validate

    prov = {"gpu": "NVIDIA H200", "date": "2026-12-02", "num_sms": 132}
    m = _fake_measurements()
    prof = build_profile(load_profile("h200").to_dict(), m, prov)
    t = prof["kernel_model"]["sustained_mma"]
    assert t["over"] == ["busy_s"] and t["unit"] == "fraction" and "cuBLAS 8192^3" in t["note"]
    assert t["source"] == "measured by megamoe calibrate on NVIDIA H200 2026-12-02"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    p = load_profile(str(path))
    assert p.kernel.sustained_mma == tuple(tuple(q) for q in m["sustained"]["points"])
    for busy, ratio in m["sustained"]["points"]:  # the average from idle over a point's seconds: the point
        assert sustained_ratio(p, busy) == pytest.approx(ratio)
    assert sustained_ratio(p, 0.6, 1.0) == pytest.approx(m["sustained"]["marginal"][-1][2]
                                                         / m["sustained"]["reference_flops_per_s"])  # the last part's
    text = summary(m, prof)
    assert "dense bf16 GEMM from idle, 347 ms" in text and "x0.864, last 176 ms 680.0" in text and "shortest graph again" in text
    bad = json.loads(json.dumps(prof))
    bad["kernel_model"]["sustained_mma"]["points"][0][1] = 1.02
    with pytest.raises(ProfileError, match="must be at most 1"):
        validate(bad)
    bad["kernel_model"]["sustained_mma"]["points"][0] = list(bad["kernel_model"]["sustained_mma"]["points"][1])
    with pytest.raises(ProfileError, match="busy duration twice"):
        validate(bad)
    m.pop("sustained")
    prof = build_profile(load_profile("h200").to_dict(), m, prov)
    assert "sustained_mma" not in prof["kernel_model"] and "sustained" in prof["calibration"]["not_measured"]
    assert validate(prof).kernel.sustained_mma == () and sustained_ratio(validate(prof), 0.3, 1.0) == 1.0
    assert "from idle" not in summary(m, prof)


def test_median_of_passes_keeps_each_points_middle_rate_in_the_first_sweeps_order():
    """The gemm steps' sweeps: a point dipping (a transient clock drop) or peaking in one
    sweep takes the middle rate of three; fields that are not tables are the first sweep's; the
    spread is the largest best / worst ratio of a point; one pass returns the sweep as it is."""
    from megamoe.calibrate.driver import median_of_passes

    sweeps = iter([
        {"points_tma": [[128, 256, 8, 1024, 3.0], [64, 128, 4, 256, 2.0]], "failed": {"x": "why"}},
        {"points_tma": [[64, 128, 4, 256, 1.0], [128, 256, 8, 1024, 4.5]], "failed": {}},
        {"points_tma": [[64, 128, 4, 256, 2.5], [128, 256, 8, 1024, 4.4]], "failed": {}},
    ])
    out = median_of_passes(lambda: next(sweeps), 3)
    assert out["points_tma"] == [[128, 256, 8, 1024, 4.4], [64, 128, 4, 256, 2.0]]
    assert out["failed"] == {"x": "why"} and out["passes"] == 3
    assert out["pass_spread"]["points_tma"] == pytest.approx(2.5)
    one = {"points_tma": [[1, 2, 3]]}
    assert median_of_passes(lambda: one, 1) == one


def test_mma_step_measures_the_small_tiles_the_tuned_launches_run():
    """Every multi-launch GEMM tile of fewer than cost.GEMM_TABLE_MIN_ROWS rows (priced by the on-chip
    mma table at its nearest shape) that the tuned configs launch for the validation presets from
    T = 64 up (uniform routing, the H200's Triton 3.6 table) is a shape the mma step measures, so no
    tile reads another shape's rate (before: 32 x (2 x 128) at 8 warps read 16 x 128 at 4)."""
    import numpy as np

    from megamoe.calibrate.compute import MMA_TABLE_SHAPES
    from megamoe.grid import GRID_PRESETS
    from megamoe.kernels.plan import launch_plan
    from megamoe.reference import MoEConfig
    from megamoe.simulator import cost

    measured = {(bm, bn, w) for bm, bn, w, _ in MMA_TABLE_SHAPES}
    missing = set()
    for name in GRID_PRESETS.split(","):
        cfg = MoEConfig.preset(name)
        for T in (64, 512, 4096, 16384):
            counts = np.full(cfg.num_experts, T * cfg.top_k // cfg.num_experts)
            plan = launch_plan(cfg, T, counts=counts, device_name="NVIDIA H200", dtype="bfloat16",
                               triton_version="3.6.0")
            for s in plan.stages:
                d = s.to_dict()
                if "gemm" in d["name"] and d["flops_per_tile"] > 0:
                    bm, bn, _ = cost._work_tile(d)
                    if bm < cost.GEMM_TABLE_MIN_ROWS and (bm, bn, d["tile"]["num_warps"]) not in measured:
                        missing.add((name, T, d["name"], bm, bn, d["tile"]["num_warps"]))
    assert not missing


def test_duty_fit_takes_the_reads_out_of_the_matmuls_time():
    from megamoe.calibrate.summary import sustained_summary
    from megamoe.calibrate.sustained import duty_fit

    per_read = 1e-4
    # 100 matmuls, each followed by 10 reads: 0.1 s of reads; the matmuls at 0.9 of the reference rate
    t_mm = 100 * SUSTAINED_FLOPS / (0.9 * 800e12)
    got = duty_fit(SUSTAINED_FLOPS, per_read, [[0.5, 100, 10, t_mm + 0.1, 1700.0], [0.75, 5, 1, 5 * 1e-4, None]], 800e12)
    assert got[0]["rate_ratio"] == pytest.approx(0.9)
    assert got[0]["matmul_share"] == pytest.approx(t_mm / (t_mm + 0.1))
    assert got[0]["sm_clock_mhz_mean"] == 1700.0 and got[0]["duty"] == 0.5
    assert got[1]["rate_ratio"] > 1e6  # a graph no longer than its reads: the matmuls' time floors at 1 ns, no crash
    lines = sustained_summary({**_fake_sustained(), "duty": got[:1]})
    assert any(ln.startswith("dense GEMM 50% of") and "x0.900" in ln and "1700 MHz" in ln for ln in lines)


def test_duty_points_travel_to_the_profile():
    """duty_points: per duty graph its matmuls' share and (1 - rate ratio) / (1 - the back-to-back
    average over as many seconds), clipped to [0, 1]; graphs with no back-to-back fall to share, or a
    share of 0 or 1, left out; build_profile writes them as kernel_model.sustained_duty, which the
    loader reads and cost.duty_fall interpolates; without duty graphs no table."""
    from megamoe.calibrate import build_profile
    from megamoe.calibrate.sustained import duty_points
    from megamoe.simulator.cost import duty_fall, sustained_ratio

    prov = {"gpu": "NVIDIA H200", "date": "2026-12-02", "num_sms": 132}
    m = _fake_measurements()
    su = m["sustained"]
    t = su["points"][-1][0]
    p0 = load_profile(str(_write(build_profile(load_profile("h200").to_dict(), m, prov))))
    full = sustained_ratio(p0, t)
    assert full < 0.9
    su["duty"] = [{"duty": 0.5, "seconds": t, "matmul_share": 0.5, "rate_ratio": 1 - 0.25 * (1 - full)},
                  {"duty": 0.75, "seconds": t, "matmul_share": 0.75, "rate_ratio": 0.5},  # more than the fall: 1
                  {"duty": 0.6, "seconds": 0.004, "matmul_share": 0.6, "rate_ratio": 0.99},  # no fall by then
                  {"duty": 1.0, "seconds": t, "matmul_share": 1.0, "rate_ratio": full}]
    pts = duty_points(su)
    assert [q[0] for q in pts] == [0.5, 0.75] and pts[0][1] == pytest.approx(0.25, rel=1e-6) and pts[1][1] == 1.0
    prof = build_profile(load_profile("h200").to_dict(), m, prov)
    assert prof["kernel_model"]["sustained_duty"]["over"] == ["duty"]
    p = load_profile(str(_write(prof)))
    assert duty_fall(p, 0.5) == pytest.approx(0.25, rel=1e-6) and duty_fall(p, 0.25) == pytest.approx(0.125, rel=1e-6)
    su.pop("duty")
    assert duty_points(su) == [] and "sustained_duty" not in build_profile(load_profile("h200").to_dict(), m, prov)["kernel_model"]


def _write(prof: dict):
    import tempfile

    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(prof, f)
    f.close()
    return f.name


def test_serial_step_records_each_widths_pass_as_a_table():
    """The serial step's per-width top-1 passes ("reduce", one per SERIAL_SHAPES width, "widths" naming
    them, or their order where a stored microbench.json predates "widths") become
    kernel_model.serial_reduce_width; the scalar stays their median; a step without them writes no table."""
    from megamoe.calibrate import build_profile
    from megamoe.calibrate.latency import SERIAL_SHAPES, serial_width_points
    from megamoe.calibrate.summary import summary
    from megamoe.simulator.hardware import validate

    assert [be for _, be in SERIAL_SHAPES] == [128, 256]
    prov = {"gpu": "NVIDIA H200", "torch": "x", "triton": "y", "commit": "c", "date": "2026-12-02", "num_sms": 132,
            "l2_bytes": 62914560}
    old = {"serial_load_step_s": 3.7e-7, "serial_reduce_step_s": 6.8e-7, "load": [3.7e-7, 3.7e-7],
           "reduce": [4.0e-7, 9.6e-7]}
    new = {**old, "widths": [256, 128], "reduce": [9.6e-7, 4.0e-7]}
    assert serial_width_points(old) == serial_width_points(new) == [[128.0, 4.0e-7], [256.0, 9.6e-7]]
    assert serial_width_points({**old, "reduce": [4.0e-7, -1e-9]}) == [[128.0, 4.0e-7]]
    assert serial_width_points({"serial_load_step_s": 1e-7, "serial_reduce_step_s": 1e-7}) == []
    for serial in (old, new):
        p = validate(build_profile(load_profile("h200").to_dict(), {"serial": serial}, prov))
        assert p.kernel.serial_reduce_width == ((128.0, 4.0e-7), (256.0, 9.6e-7))
        assert p.kernel.serial_reduce_step_s == pytest.approx(6.8e-7)
    assert "serial top-1 pass, 128 wide" in summary({"serial": old}, build_profile(load_profile("h200").to_dict(),
                                                                                {"serial": old}, prov))
    bare = {"serial_load_step_s": 1e-7, "serial_reduce_step_s": 1e-7}
    assert "serial_reduce_width" not in build_profile(load_profile("h200").to_dict(), {"serial": bare}, prov)["kernel_model"]
