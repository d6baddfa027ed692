"""The megakernel's trace buffer (kernels.megakernel.trace_rows) and benchmarks/megakernel_trace.py's
reading of its rows past the tasks'. The traced kernel itself needs a GPU (%globaltimer)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from benchload import load_benchmark

from megamoe.reference import MoEConfig


def test_trace_rows_hold_tasks_programs_and_the_topk_phases():
    from megamoe.kernels.megakernel import megakernel_config, trace_rows
    from megamoe.reference.tiles import task_layout

    cfg = MoEConfig(hidden_size=40, intermediate_size=36, num_experts=7, top_k=3)
    mk = megakernel_config(cfg, 5, torch.float32, torch.device("cpu"))
    rows, mt = trace_rows(cfg, 5, mk, 4)
    assert mt == task_layout(cfg, 5, mk["tiles"]).max_tasks
    assert rows == mt + 4 + 1


def test_a_short_or_float_trace_buffer_is_refused_before_the_launch():
    from megamoe.kernels.megakernel import build_launch, megakernel_config, trace_rows
    from megamoe.reference import random_weights

    cfg = MoEConfig(hidden_size=40, intermediate_size=36, num_experts=7, top_k=3)
    mk = megakernel_config(cfg, 5, torch.float32, torch.device("cpu"))
    x = torch.randn(5, 40)
    w = random_weights(cfg, seed=1).to_torch("cpu", torch.float32)
    rows, _ = trace_rows(cfg, 5, mk, 4)
    for bad in (torch.zeros((rows - 1, 3), dtype=torch.int64), torch.zeros((rows, 3), dtype=torch.float32)):
        with pytest.raises(ValueError, match=rf"trace.*\({rows}, 3\)"):
            build_launch(x, w, cfg, mk, nprog=4, trace=bad)


def test_program_phases_measure_from_the_first_task():
    mod = load_benchmark("megakernel_trace")
    tasks = np.array([[0, 1_000, 3_000], [1, 1_500, 9_000]])
    programs = np.array([[0, 400, 9_600], [1, 700, 9_200]])
    ph = mod.program_phases(tasks, programs, np.array([2_000, 2_500, 4_000]))
    assert ph == {"programs_first_us": 0.6, "programs_exit_us": 0.6, "topk_seen_us": 1.0, "topk_routed_us": 1.5,
                  "topk_done_us": 3.0}


def test_graph_edges_are_kernel_times_and_launch_gaps():
    mod = load_benchmark("megakernel_trace")
    calls = [np.array([[0, 1_000, 30_000], [1, 1_200, 31_000]]), np.array([[0, 32_000, 60_000], [1, 31_800, 62_000]])]
    e = mod.graph_edges(calls)
    assert e["kernel_us"] == (30.0 + 30.2) / 2 and e["gap_us"] == 0.8
    assert np.isnan(mod.graph_edges(calls[:1])["gap_us"])


def test_read_phases_count_programs_bytes_and_rate_per_kind(tmp_path, capsys):
    mod = load_benchmark("megakernel_trace")
    names = ("router_logits", "gemm1", "combine")
    # [kind, program, start ns, end ns]: two programs read 3 MB of GEMM 1 weights in 0.2..3.0 us; combine reads none
    tasks = [[0, 2, 0, 500], [1, 0, 200, 2_000], [1, 1, 300, 3_000], [1, 0, 2_000, 2_900], [2, 2, 3_000, 3_100]]
    wb = [4096, 1_000_000, 1_000_000, 1_000_000, 0]
    ph = mod.read_phases(tasks, wb, names)
    assert set(ph) == {"router_logits", "gemm1"}
    g = ph["gemm1"]
    assert g["programs"] == 2 and g["weight_mb"] == 3.0 and g["window_us"] == (0.2, 0.3, 3.0)
    assert g["read_tb_s"] == pytest.approx(3e6 / 2_800 / 1e3)
    row = {"case": "toy:1", "default": {"us": 4.0, "programs": 3, "tasks": tasks, "task_weight_bytes": wb,
                                        "kind_names": list(names)}}
    f = tmp_path / "trace.jsonl"
    f.write_text(json.dumps(row) + "\n")
    assert mod.main(["--from", str(f)]) == 0
    out = capsys.readouterr().out
    assert "toy:1 default: 4.0 us, span 3.1 us, 3.0 MB" in out and "gemm1" in out and "combine" not in out
    assert mod.main(["--from", str(f), "--plot", str(tmp_path / "plots")]) == 0  # a timeline per launch
    png = tmp_path / "plots" / "trace_toy_1_default.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        mod.main(["--plot", str(tmp_path / "plots"), "--out", str(tmp_path)])  # --plot draws a stored trace
    with pytest.raises(SystemExit):
        mod.main(["--from", str(tmp_path / "missing.jsonl")])
    f.write_text(json.dumps({"case": "toy:1", "multi_us": 3.0}) + "\n{not json\n")
    with pytest.raises(SystemExit, match="line 2 is not JSON"):
        mod.main(["--from", str(f)])
    f.write_text(json.dumps({"case": "toy:1", "multi_us": 3.0}) + "\n")
    with pytest.raises(SystemExit, match="no traced launch"):
        mod.main(["--from", str(f)])
