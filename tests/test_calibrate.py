"""Calibration: the microbenchmark kernels compute the right thing (interpreter, tiny sizes; never
timed), and the profile ``megamoe calibrate`` writes is one the loader and the cost model take."""

from __future__ import annotations

import json

import pytest
import torch

from megamoe.simulator import load_profile
from megamoe.simulator.cost import hbm_rate, mma_rate_per_sm, occupancy, predict_task_plan, sm_copy_rate


@pytest.mark.interpret
def test_microbench_kernels_compute_what_they_claim():
    pytest.importorskip("triton")
    from megamoe.kernels import microbench as mb

    x = torch.randn(8 * 256)
    mb.stream_read(x, 4, 512, block=128, offset=0, check=True)  # 4 programs x 1 KiB-ish each
    mb.stream_read(x, 2, 256, block=128, offset=512, check=True)  # an offset start
    mb.mma(torch.randn(16, 64), torch.randn(64, 32), 3, block_k=32, check=True)
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


def _fake_measurements(S=132):
    return {
        "launch": {"launch_gap_s": 7e-7, "graph_fixed_s": 3e-6},
        "sync": {"flag_handoff_s": 6e-7, "grid_barrier_s": 9e-7, "ticket_s": 4e-8},
        "hbm": {"points": [[n, b, min(4.4e12, n * b / 2e-6)] for n in (1, S, 8 * S) for b in (16384, 1 << 20)],
                "l2_bytes_per_s": 9e12},
        "mma": {"points": [[16, 64, 4, d, 1.5e12 + d * 1e8] for d in (256, 4096)]
                + [[128, 128, 8, d, 4e12 + d * 1e8] for d in (256, 4096)], "occupancy": {4: 3, 8: 1}},
        "copy": {"points": [[1, 9e10], [16, 7e10], [S, 3e10]]},
        "serial": {"serial_load_step_s": 5e-8, "serial_reduce_step_s": 3e-8},
    }


def test_calibrated_profile_loads_and_drives_the_cost_model(tmp_path):
    from megamoe.calibrate import build_profile, summary

    prov = {"gpu": "NVIDIA H200", "torch": "x", "triton": "y", "commit": "c", "date": "2026-12-02", "num_sms": 132,
            "l2_bytes": 62914560}
    m = _fake_measurements()
    prof = build_profile(load_profile("h200").to_dict(), m, prov)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(prof))
    p = load_profile(str(path))  # --system path.json
    assert p.kernel.calibrated and p.kernel.flag_handoff_s == 6e-7 and p.kernel.graph_fixed_s == 3e-6
    assert p.hbm_effective_bytes_per_s == pytest.approx(4.4e12)
    assert p.kernel.sources["mma"] == "measured by megamoe calibrate on NVIDIA H200 2026-12-02"
    assert occupancy(p, 4) == 3 and occupancy(p, 8) == 1
    assert hbm_rate(p, 132, 1 << 20) == pytest.approx(min(4.4e12, 132 * (1 << 20) / 2e-6))
    assert mma_rate_per_sm(p, 16, 64, 256, 4) == pytest.approx(1.5e12 + 256 * 1e8)
    assert sm_copy_rate(p, 16) == pytest.approx(7e10)
    assert "flag handoff" in summary(m, prof)
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
