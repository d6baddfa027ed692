"""Validation: the simulator's launch model by hand, and the kernel-vs-simulator run on the CPU."""

from __future__ import annotations

import json
import math

import pytest

from megamoe.simulator import load_profile
from megamoe.simulator.cost import predict_launch_plan, predict_stage


def stage(**kw):
    base = dict(name="gemm", kernel="_k", active_programs=264, tile=dict(BLOCK_M=128, num_warps=8),
                bytes_per_tile=1e6, flops_per_tile=2 * 128 * 128 * 4096)
    base.update(kw)
    return base


def test_stage_by_hand():
    p = load_profile("h200")
    s = predict_stage(stage(), p)
    # 264 programs, 1 per SM (8 warps), 132 SMs: 2 waves of one tile each
    eff = dict(p.gemm_efficiency)[128.0]
    tile_s = 2 * 128 * 128 * 4096 / (p.tensor_flops_per_s["bf16"] / p.num_sms * eff)
    assert s.compute_us == pytest.approx(2 * tile_s * 1e6)
    assert s.memory_us == pytest.approx(264 * 1e6 / p.hbm_effective_bytes_per_s * 1e6)
    assert s.time_us == pytest.approx(max(s.compute_us, s.memory_us) + p.kernel_launch_s * 1e6)


def test_few_programs_cannot_pull_full_bandwidth():
    p = load_profile("h200")
    # without a calibrated read curve: HBM rate x min(1, programs in flight / SMs); 33 of 132
    few = predict_stage(stage(active_programs=33, flops_per_tile=0.0, tile=dict(BLOCK_M=16, num_warps=4)), p)
    assert few.memory_us == pytest.approx(33 * 1e6 / (p.hbm_effective_bytes_per_s * 0.25) * 1e6)
    assert few.bound == "memory"


def test_plan_is_the_sum_and_monotone():
    a = predict_launch_plan([stage(), stage(name="g2", bytes_per_tile=2e6)])
    assert a["time_us"] == pytest.approx(sum(s["time_us"] for s in a["stages"]))
    faster = predict_launch_plan([stage(), stage(name="g2", bytes_per_tile=2e6)], overrides={"hbm_bandwidth": 9.6e12})
    assert faster["time_us"] < a["time_us"]
    empty = predict_launch_plan([stage(active_programs=0)])
    assert empty["stages"][0]["bound"] == "launch"


def test_bad_stage_is_named():
    with pytest.raises(ValueError, match=r"stage 'gemm' lacks \['flops_per_tile'\]"):
        predict_stage({k: v for k, v in stage().items() if k != "flops_per_tile"}, load_profile("h200"))


def test_measured_overrides_reproduce_the_measured_rates():
    from megamoe.layer_check import measured_overrides
    from megamoe.simulator.cost import gemm_efficiency

    ov = measured_overrides({"read_bytes_per_s": 4.4e12, "matmul_flops_per_s": 700e12})
    p = load_profile("h200")
    from megamoe.simulator import override

    q = override(p, **ov)
    assert q.hbm_effective_bytes_per_s == pytest.approx(4.4e12)
    top = q.gemm_efficiency[-1][0]
    assert q.tensor_flops_per_s["bf16"] * gemm_efficiency([top], q.gemm_efficiency)[0] == pytest.approx(700e12)


@pytest.mark.interpret
def test_validate_on_cpu_runs_kernel_and_prediction(tmp_path, capsys):
    pytest.importorskip("triton")
    from megamoe.cli import main

    out = tmp_path / "v.jsonl"
    rc = main(["validate", "--models", "deepseek-v3", "--tokens", "0,5", "--out", str(out)])
    assert rc == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["T"] for r in rows] == [0, 5]
    r = rows[1]
    assert r["numerics"]["ok"] and r["numerics"]["routing_agreement"] == 1.0
    assert r["predicted_us"] > 0 and math.isfinite(r["predicted_us"])
    assert "measured_us" not in r  # no GPU: nothing is timed


def test_validate_rejects_unknown_model(capsys):
    from megamoe.cli import main

    assert main(["validate", "--models", "gpt-5"]) == 2
    assert "unknown model(s) ['gpt-5']" in capsys.readouterr().err


def test_l2_model_reads_weights_once_per_group():
    # one expert, 16 row blocks x 4 N tiles = 64 programs; GROUP_M = 8 -> weights read twice per N tile
    st = stage(active_programs=64, tile=dict(BLOCK_M=128, num_warps=8, GROUP_M=8), bytes_per_tile=7.0,
               operand_bytes_per_tile={"a": 1.0, "b": 2.0, "out": 4.0}, tiles_per_expert=[64, 0],
               row_blocks_per_expert=[16, 0])
    from megamoe.simulator.cost import dram_bytes

    assert dram_bytes(st) == 16 * 1.0 + 4 * 2 * 2.0 + 64 * 4.0
    # without the operand split, every program's bytes count
    assert dram_bytes({k: v for k, v in st.items() if k != "operand_bytes_per_tile"}) == 64 * 7.0


def test_report_rebuilds_from_stored_rows(tmp_path, capsys):
    """--report: statistics, the outliers with a cause, and the scatter plot, from a small jsonl."""
    from megamoe.cli import main

    rows = [
        {"preset": "qwen3-30b-a3b", "T": 1, "routing": "uniform", "backend": "multi", "phase": "prediction",
         "predicted_us": 20.0, "measured_us": None},
        {"preset": "qwen3-30b-a3b", "T": 1, "routing": "uniform", "backend": "multi", "phase": "measurement",
         "predicted_us": 20.0, "measured_us": 50.0, "dominant": "gemm1:memory"},
        {"preset": "mixtral-8x7b", "T": 64, "routing": "zipf", "backend": "multi", "predicted_us": 600.0,
         "measured_us": 620.0, "dominant": "gemm1:memory"},
        {"preset": "mixtral-8x7b", "T": 64, "routing": "zipf", "backend": "megakernel", "predicted_us": 700.0,
         "measured_us": 560.0, "dominant": "gemm1:memory"},
    ]
    rows += [  # a failure, the prediction of a run killed during a configuration, and a line cut short
        {"preset": "deepseek-v3", "T": 1, "routing": "uniform", "backend": "megakernel", "phase": "failed",
         "failure": "RuntimeError: CUDA error"},
        {"preset": "deepseek-v3", "T": 8, "routing": "uniform", "backend": "multi", "phase": "prediction",
         "predicted_us": 300.0},
    ]
    src = tmp_path / "validation_2026-12-02.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"preset": "qwen')
    out = tmp_path / "rep"
    assert main(["validate", "--report", str(src), "--out", str(out)]) == 0
    st = json.loads((out / "report.json").read_text())
    assert st["configurations"] == 3  # the prediction-only row is not a configuration
    assert st["median_abs_error"] == pytest.approx(0.25)
    assert st["max_abs_error"] == pytest.approx(0.6)
    assert [(o["preset"], o["backend"]) for o in st["outside_15pct"]] == [("qwen3-30b-a3b", "multi"),
                                                                         ("mixtral-8x7b", "megakernel")]
    cause = st["outside_15pct"][0]["likely_cause"]  # no stages: said so, and the row's dominant part
    assert cause.startswith("under-predicted; no per-stage figures in this row") and "gemm1" in cause
    assert (out / "scatter.png").stat().st_size > 1000 and "| qwen3-30b-a3b | 1 |" in (out / "report.md").read_text()
    assert [(f["preset"], f["T"]) for f in st["failed"]] == [("deepseek-v3", 1), ("deepseek-v3", 8)]
    assert "RuntimeError: CUDA error" in (out / "report.md").read_text()


def test_bench_rows_of_each_dtype_get_their_launch_plan():
    """``validate --from-bench`` on fp8 rows: the FP8 plan (e4m3 weight bytes; fp8 MMA with FP8
    activations). Decode reads weights: about half the bf16 time; the run's FP8 matmul rate is used."""
    from megamoe.layer_check import measured_overrides, predict_bench_row

    base = {"preset": "deepseek-v3", "T": 8, "ours_us": 100.0, "deterministic": True,
            "ceiling_read_bytes_per_s": 4.4e12, "ceiling_matmul_flops_per_s": 7e14}
    pred = {dt: predict_bench_row({**base, "dtype": dt}) for dt in ("bf16", "fp8", "fp8-act")}
    assert predict_bench_row(base)["predicted_us"] == pred["bf16"]["predicted_us"]  # rows before --dtype
    assert pred["fp8"]["dtype"] == "fp8"
    assert 0.4 < pred["fp8"]["predicted_us"] / pred["bf16"]["predicted_us"] < 0.75
    assert 0.4 < pred["fp8-act"]["predicted_us"] / pred["bf16"]["predicted_us"] < 0.75
    ov = measured_overrides({"read_bytes_per_s": 4.4e12, "matmul_flops_per_s": 7e14,
                             "fp8_matmul_flops_per_s": 1.3e15})
    assert ov["fp8_flops"] / ov["bf16_flops"] == pytest.approx(1.3e15 / 7e14)
    assert "fp8_flops" not in measured_overrides({"read_bytes_per_s": 4.4e12, "matmul_flops_per_s": 7e14,
                                                  "fp8_matmul_flops_per_s": None})
    # prefill: FP8 activations multiply at the fp8 rate, weight-only FP8 at the bf16 one
    big = {**base, "T": 4096}
    t = {dt: predict_bench_row({**big, "dtype": dt})["predicted_us"] for dt in ("bf16", "fp8", "fp8-act")}
    assert t["fp8-act"] < 0.8 * t["fp8"] and t["fp8"] <= 1.02 * t["bf16"]


def test_bench_row_stages_group_the_plan_as_the_prefixes_measure_them():
    """A bench row's measured stages (``megamoe bench --breakdown``: kernels.bench.stage_split) are
    compared with the plan's stages grouped as validate.STAGE_GROUPS: Kimi K2's shared MLP runs
    inside the GEMM 2 prefix, so its stages count in "gemm2"; the groups sum to the layer's stages."""
    from megamoe.kernels.bench import stage_split
    from megamoe.layer_check import predict_bench_row

    row = {"preset": "kimi-k2", "T": 64, "ours_us": 400.0, "deterministic": True,
           "stage_us": stage_split({"align": 30.0, "gemm1": 230.0, "gemm2": 390.0}, 400.0)}
    out = predict_bench_row(row)
    assert set(out["stages"]) == {"router+align", "gemm1", "gemm2", "combine"}
    assert out["stages"]["combine"]["measured_us"] == pytest.approx(10.0)
    assert all(v["predicted_us"] and v["predicted_us"] > 0 for v in out["stages"].values())
    # every stage of the plan (the shared MLP's included) is in one group
    assert sum(v["predicted_us"] for v in out["stages"].values()) == pytest.approx(
        out["predicted_us"] - out["predicted_fixed_us"])
    no_shared = predict_bench_row({**row, "preset": "qwen3-30b-a3b"})
    assert all(v["predicted_us"] > 0 for v in no_shared["stages"].values())


def test_stored_rows_predicted_again_from_their_counts():
    """megamoe.repredict: a row that carries counts is predicted again with another profile, the
    same as a prediction from a routing with those counts; rows without counts are left out."""
    import numpy as np

    from megamoe.predict import predict_config
    from megamoe.reference import MoEConfig
    from megamoe.repredict import repredict_rows
    from megamoe.simulator.hardware import load_profile

    counts = np.zeros(128, np.int64)
    counts[[3, 9, 40, 41, 77, 100, 101, 127]] = [3, 3, 3, 3, 3, 3, 3, 3]
    p = load_profile("h200")
    rows = [{"preset": "qwen3-30b-a3b", "T": 3, "backend": b, "counts": counts.tolist(), "measured_us": 50.0,
             "predicted_us": 1.0, "profile": "old", "gpu": "NVIDIA H200", "triton": "3.6.0", "calls_per_graph": 8}
            for b in ("multi", "megakernel")]  # a Triton with a tuned file: the entries that ran are its
    rows.append({k: v for k, v in rows[0].items() if k != "counts"})
    new, skipped = repredict_rows(rows, p)
    assert skipped == 1 and len(new) == 2 and all(r["profile"] == "h200" for r in new)
    cfg = MoEConfig.preset("qwen3-30b-a3b")
    for r in new:
        want = predict_config(cfg, counts, 3, r["backend"], p, device_name="NVIDIA H200", calls_per_graph=8,
                              triton_version="3.6.0")
        assert r["predicted_us"] == pytest.approx(want["predicted_us"]) and r["measured_us"] == 50.0
    for backend in ("multi", "megakernel"):  # counts that are not this T's pairs: a clear error
        with pytest.raises(ValueError, match=r"T\*K=16"):
            predict_config(cfg, counts, 2, backend, p, device_name="NVIDIA H200", calls_per_graph=8)


def test_repredict_needs_stored_rows(capsys):
    from megamoe.cli import main

    assert main(["validate", "--repredict", "h200"]) == 2
    assert "--repredict needs --report" in capsys.readouterr().err


def _outlier(**kw) -> dict:
    r = {"preset": "qwen3-30b-a3b", "T": 64, "routing": "zipf", "backend": "multi", "predicted_us": 80.0,
         "measured_us": 100.0}
    r.update(kw)
    return r


def test_likely_cause_names_the_stage_with_the_largest_gap_and_its_term():
    """A multi row with measured stages: the group whose gap (same sign as the layer's error)
    is largest, its plan stage with the most predicted time, and that stage's term (recorded by
    the prediction, or named from its bound)."""
    from megamoe.report import likely_cause

    pred = {"router_logits": {"us": 6.0, "bound": "memory", "term": "HBM streaming (x)"},
            "router": {"us": 6.0, "bound": "serial"},
            "gemm1": {"us": 38.0, "bound": "memory", "term": "the SMs' intake (y)"},
            "gemm2": {"us": 26.0, "bound": "memory"}, "combine": {"us": 4.0, "bound": "memory"}}
    meas = {"router+align": 20.0, "gemm1": 52.0, "gemm2": 25.0, "combine": 3.0}
    cause = likely_cause(_outlier(predicted_stages=pred, measured_stages_us=meas))
    assert cause.startswith("under-predicted: largest stage gap gemm1, predicted 38.0 us against 52.0 measured (-27%)")
    assert cause.endswith("its stage gemm1 is priced by the SMs' intake (y)")
    # router+align has the largest gap once GEMM 1 is right; its largest stage (first on a tie) and its bound
    cause = likely_cause(_outlier(predicted_stages=pred, measured_stages_us={**meas, "gemm1": 38.5}))
    assert "largest stage gap router+align" in cause and "router_logits is priced by HBM streaming (x)" in cause
    # over-predicted: only the gaps of the same sign count
    cause = likely_cause(_outlier(predicted_stages=pred, measured_stages_us=meas, predicted_us=120.0))
    assert cause.startswith("over-predicted: largest stage gap gemm2")
    assert "memory traffic (HBM, L2 hits or the SMs' intake: this row does not record which)" in cause


def test_likely_cause_leaves_out_a_stage_measured_below_zero():
    """A stage measured at or below zero (the layer's graph faster than its prefix's, as
    Mixtral-8x7B T = 4096's combine at -525 us) is never the largest gap: the cause names the
    largest real gap and says the prefixes disagree there; with no real stage left it says so."""
    from megamoe.report import likely_cause

    pred = {"router": {"us": 6.0, "bound": "serial"}, "gemm1": {"us": 60.0, "bound": "compute"},
            "gemm2": {"us": 30.0, "bound": "compute"}, "combine": {"us": 4.0, "bound": "memory"}}
    meas = {"router+align": 6.0, "gemm1": 50.0, "gemm2": 29.0, "combine": -20.0}
    cause = likely_cause(_outlier(predicted_stages=pred, measured_stages_us=meas, predicted_us=100.0,
                                  measured_us=65.0))
    assert cause.startswith("over-predicted: largest stage gap gemm1, predicted 60.0 us against 50.0 measured (+20%)")
    assert "combine measured -20.0 us (the whole layer's graph timed faster than its prefix's" in cause
    only = likely_cause(_outlier(predicted_stages=pred, measured_stages_us={"combine": -20.0}, predicted_us=100.0,
                                 measured_us=65.0))
    assert only.startswith("over-predicted; no per-stage figures in this row; combine measured -20.0 us")


def test_likely_cause_without_stages_says_so_and_names_the_dominant_term():
    from megamoe.report import likely_cause

    mk = _outlier(backend="megakernel", predicted_us=120.0,
                  predicted_stages={"router_topk": {"us": 6.0, "bound": "serial"},
                                    "gemm1": {"us": 60.0, "bound": "memory", "term": "L2-hit bytes (z)"}})
    assert likely_cause(mk) == ("over-predicted; no per-stage figures in this row (one persistent launch); the "
                                "prediction's critical path: mostly gemm1 (60 of 66 us), priced by L2-hit bytes (z)")
    old = _outlier(backend="megakernel", predicted_stages={"gemm1": {"us": 60.0}}, dominant="gemm1:compute")
    assert likely_cause(old).endswith("priced by MMA rate (the tile loop's dense-GEMM / mma table)")
    assert likely_cause(_outlier(dominant="gemm1:serial", dominant_term="T")) == (
        "under-predicted; no per-stage figures in this row; the prediction's dominant part is gemm1, priced by T")
    assert "no per-stage figures in this row and no prediction detail" in likely_cause(_outlier())


def test_predictions_record_the_term_they_are_bound_by():
    """predict.predict_config: every multi stage and megakernel kind carries its bound's term
    (cost.term_name; a memory-bound launch names which memory term), and the row its dominant_term."""
    import numpy as np

    from megamoe.predict import predict_config
    from megamoe.reference import MoEConfig
    from megamoe.simulator.cost import BOUND_TERMS, MEMORY_TERMS

    counts = np.zeros(128, np.int64)
    counts[:8] = 64  # every token on the same 8 experts: GEMM 1's 1 MB tiles, two on some SMs
    from pathlib import Path

    p = load_profile(Path(__file__).parent / "data" / "validation" / "h200_calibrated_profile.json")
    cfg = MoEConfig.preset("qwen3-30b-a3b")
    terms = set(BOUND_TERMS.values()) | set(MEMORY_TERMS.values())
    for backend in ("multi", "megakernel"):
        pr = predict_config(cfg, counts, 64, backend, p, device_name="NVIDIA H200", calls_per_graph=8)
        assert pr["dominant_term"] in terms and all(s["term"] in terms for s in pr["predicted_stages"].values())
        assert pr["dominant"].startswith("gemm1:")
    assert pr["predicted_stages"]["gemm1"]["bound"] in ("memory", "compute")


def test_counts_borrowed_for_rows_rebuilt_from_a_log(tmp_path):
    """--counts-from: rows without counts (rebuilt from a log) take the same configuration's counts
    from another run's rows, and --repredict predicts them; without --repredict it is refused."""
    from megamoe.cli import main
    from megamoe.report import borrow_counts

    counts = [0] * 128
    for e in (3, 9, 40, 41, 77, 100, 101, 127):
        counts[e] = 1
    base = {"preset": "qwen3-30b-a3b", "T": 1, "routing": "uniform", "backend": "multi", "measured_us": 45.0,
            "predicted_us": 40.0}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "validation_x.jsonl").write_text(json.dumps({**base, "counts": counts, "calls_per_graph": 8}) + "\n")
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({**base, "from_log": True}) + "\n" + json.dumps({**base, "T": 8, "from_log": True}) + "\n")
    rows, n = borrow_counts([json.loads(x) for x in log.read_text().splitlines()], tmp_path / "a")
    assert n == 1 and rows[0]["counts"] == counts and rows[0]["calls_per_graph"] == 8 and "counts" not in rows[1]
    out = tmp_path / "rep"
    assert main(["validate", "--report", str(log), "--repredict", "h200", "--counts-from", str(tmp_path / "a"),
                 "--out", str(out)]) == 0
    st = json.loads((out / "report.json").read_text())
    assert st["configurations"] == 1 and any("took their counts" in n for n in st["notes"])
    assert main(["validate", "--report", str(log), "--counts-from", str(tmp_path / "a")]) == 2


def test_repredict_switch_sets_a_cost_option_for_the_run_only(tmp_path, capsys, monkeypatch):
    """--switch NAME=on|off with --repredict (a stand-in CostOptions: none is under study today): the
    report's note names it; an unknown name, a bad value or --switch without --repredict is refused."""
    import dataclasses
    import json

    import numpy as np

    from megamoe.cli import main
    from megamoe.repredict import parse_switches
    from megamoe.simulator import cost

    @dataclasses.dataclass(frozen=True)
    class Options:
        deep: bool = False
        wide: bool = True

    monkeypatch.setattr(cost, "CostOptions", Options)
    counts = np.zeros(128, np.int64)
    counts[:8] = 64  # T = 64, every token on the same 8 experts
    row = {"preset": "qwen3-30b-a3b", "T": 64, "routing": "concentrated", "backend": "multi", "counts": counts.tolist(),
           "measured_us": 90.0, "predicted_us": 1.0, "profile": "old", "gpu": "NVIDIA H200", "calls_per_graph": 8,
           "phase": "measurement"}
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps(row) + "\n")
    assert main(["validate", "--report", str(src), "--repredict", "h200", "--switch", "deep=on",
                 "--out", str(tmp_path / "on")]) == 0
    notes = json.loads((tmp_path / "on" / "report.json").read_text())["notes"]
    assert any("deep=on" in n for n in notes)
    assert parse_switches(["deep=on", "wide=off"]) == {"deep": True, "wide": False}
    capsys.readouterr()
    assert main(["validate", "--report", str(src), "--repredict", "h200", "--switch", "nope=on"]) == 2
    assert "unknown cost option" in capsys.readouterr().err
    assert main(["validate", "--report", str(src), "--repredict", "h200", "--switch", "deep=maybe"]) == 2
    assert main(["validate", "--report", str(src), "--switch", "deep=on"]) == 2
    assert "--switch needs --repredict" in capsys.readouterr().err
    assert main(["validate", "--report", str(src), "--repredict", "h200", "--variant", "deep=off"]) == 2
    assert "--variant is for the GPU run" in capsys.readouterr().err


def test_repredict_prices_a_megakernel_row_with_the_config_it_ran():
    """A megakernel row carries the config its prediction priced (``megakernel_config``, the one the
    kernel ran); re-predicting it uses that config, not the one the code would pick now: a row that
    ran the T = 512 router walking H (before the split router) is priced walking, one without the field
    with today's split config, and a stored config equal to today's gives today's prediction."""
    import copy

    import numpy as np

    from megamoe.predict import predict_config
    from megamoe.reference import MoEConfig
    from megamoe.repredict import repredict_rows

    p = load_profile("h200")
    cfg = MoEConfig.preset("qwen3-30b-a3b")
    counts = np.zeros(128, np.int64)
    counts[:8] = 512  # T = 512, every token on the same 8 experts
    today = predict_config(cfg, counts, 512, "megakernel", p, device_name="NVIDIA H200", calls_per_graph=8)
    mk = today["megakernel_config"]
    assert mk["tiles"]["router"]["SPLIT"] > 1  # today's default: the split router
    walked = copy.deepcopy(mk)
    walked["tiles"]["router"].update(SPLIT=1, TOPK_T=walked["tiles"]["router"]["BLOCK_T"])
    base = {"preset": "qwen3-30b-a3b", "T": 512, "routing": "concentrated", "backend": "megakernel",
            "counts": counts.tolist(), "measured_us": 150.0, "predicted_us": 1.0, "gpu": "NVIDIA H200",
            "calls_per_graph": 8}
    rows = [base, {**base, "megakernel_config": walked}, {**base, "megakernel_config": mk}]
    (no_field, old, same), skipped = repredict_rows(rows, p)
    assert skipped == 0
    assert no_field["predicted_us"] == today["predicted_us"] == same["predicted_us"]
    assert old["megakernel_config"] == walked and old["predicted_us"] != today["predicted_us"]
    assert old["tasks"] < no_field["tasks"]  # 16 walking top-k tasks, not 64 logits and 128 top-k tasks


def test_bench_rows_are_priced_with_the_gemm_entries_they_ran():
    """``validate --from-bench``: a bf16 multi-launch row is priced with the GEMM entries it records
    (its "config"), not with what select_config gives today; a row without them, a megakernel row or
    an FP8 row keeps today's entries, and the output says which."""
    from megamoe.kernels import configs as cfgs
    from megamoe.layer_check import predict_bench_row, recorded_gemm

    base = {"preset": "qwen3-30b-a3b", "T": 64, "ours_us": 300.0, "deterministic": True, "gpu": "NVIDIA H200",
            "triton": "3.6.0"}
    today = predict_bench_row(base)
    assert today["gemm_from"] == "select_config today"
    entry = cfgs.select_config(128, 2048, 768, 8, 64, gpu="NVIDIA H200", dtype="bfloat16", triton_version="3.6.0")
    other = {"gemm1": {**entry["gemm1"], "BLOCK_M": 128}, "gemm2": {**entry["gemm2"], "BLOCK_M": 128}}
    assert other != entry
    ran = predict_bench_row({**base, "config": other})
    assert ran["gemm_from"] == "the row" and ran["predicted_us"] > 1.2 * today["predicted_us"]  # 128-row padding
    assert predict_bench_row({**base, "config": entry})["predicted_us"] == pytest.approx(today["predicted_us"])
    assert recorded_gemm({**base, "config": other, "backend": "megakernel"}) is None
    assert recorded_gemm({**base, "config": {"gemm1": {"BLOCK_M": "x"}}}) is None
    assert predict_bench_row({**base, "config": other, "dtype": "fp8"})["gemm_from"] == "select_config today"
