"""The GPU run's machinery without a GPU: budget and watchdog, the compile-ahead scheduler (with a
fake job process), the measuring loop on a fake layer (failures, lost context, budget, resume)
and, under the interpreter, the real loop end to end. Nothing here times anything that matters."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time

import numpy as np
import pytest

from megamoe.deadline import Budget, Watchdog
from megamoe.grid import Configuration, configurations
from megamoe.measure import CONTEXT_LOST_EXIT, measure_grid
from megamoe.warm import Job, plan_jobs, run_jobs


# --------------------------------------------------------------------------- budget and watchdog
def test_budget_counts_from_its_start():
    now = [100.0]
    b = Budget(10.0, clock=lambda: now[0])
    now[0] = 104.0
    assert b.elapsed() == 4.0 and b.left() == 6.0
    assert b.allows(5.0) and not b.allows(5.0, reserve_s=2.0)
    assert Budget(None).left() == float("inf")
    with pytest.raises(ValueError, match="positive"):
        Budget(0)


def test_watchdog_fires_once_past_the_deadline_and_not_when_disarmed():
    fired, exits = [], []
    wd = Watchdog(fired.append, exit=exits.append, poll_s=0.01)
    wd.arm(5.0, "slow")
    wd.disarm()  # disarmed in time: nothing happens
    wd.arm(0.05, "stuck step")
    for _ in range(200):
        if exits:
            break
        time.sleep(0.01)
    wd.close()
    assert fired == ["stuck step"] and exits == [4]


# --------------------------------------------------------------------------- configurations and jobs
def test_configurations_are_t_major():
    cs = configurations(["a", "b"], [1, 8], ["uniform", "zipf"], ["multi", "megakernel"])
    assert len(cs) == 16 and [c.T for c in cs[:8]] == [1] * 8  # every preset at T = 1 first
    assert cs[0].key == "a/T=1/uniform/multi" and cs[4].preset == "b"


def test_jobs_group_by_preset_and_t_largest_first():
    cs = configurations(["small", "big"], [1, 64], ["uniform"], ["multi", "megakernel"])
    jobs = plan_jobs(cs, lambda p, T: (100.0 if p == "big" else 1.0) + T)
    assert [(j.preset, j.T) for j in jobs] == [("big", 64), ("big", 1), ("small", 64), ("small", 1)]
    assert jobs[0].pairs == (("uniform", "multi"), ("uniform", "megakernel"))


# A job process that does what each configuration's routing name says.
FAKE_WORKER = textwrap.dedent("""
    import json, os, sys, time
    job = json.load(open(sys.argv[1]))
    st = open(job["status"], "a")
    def emit(**e):
        st.write(json.dumps(e) + "\\n"); st.flush()
    for routing, backend in job["pairs"]:
        key = f"{job['preset']}/T={job['T']}/{routing}/{backend}"
        emit(key=key, event="start")
        if routing == "crash":
            os._exit(9)
        if routing == "hang":
            time.sleep(60)
        if routing == "err":
            emit(key=key, event="error", error="ValueError: no")
        else:
            emit(key=key, event="ok")
""")


def test_warm_scheduler_names_every_outcome(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(FAKE_WORKER)
    jobs = [Job("p", 1, (("ok", "m"), ("err", "m"), ("crash", "m"), ("after", "m")), 10.0),
            Job("q", 1, (("ok", "m"), ("hang", "m"), ("ok2", "m")), 10.0),
            Job("huge", 1, (("ok", "m"),), 1e6)]  # more than the memory: runs alone
    logs = []
    st = run_jobs(jobs, folder=tmp_path / "warm", layer_kind="fake", seed=0, procs=2, memory_bytes=100.0,
                  deadline=time.monotonic() + 120, config_timeout_s=5.0, log=logs.append,
                  argv=lambda p: [sys.executable, str(worker), str(p)], poll_s=0.02)
    assert st["p/T=1/ok/m"] == "ok" and st["p/T=1/err/m"].startswith("error: ValueError")
    assert st["p/T=1/crash/m"] == "crashed (exit 9)"
    assert st["p/T=1/after/m"] == "ok"  # the rest of a crashed process's job ran in a new one
    assert st["q/T=1/hang/m"].startswith("hung") and st["q/T=1/ok2/m"] == "ok"
    assert st["huge/T=1/ok/m"] == "ok"
    saved = json.loads((tmp_path / "warm" / "warm_status.json").read_text())
    assert saved["status"] == st and saved["counts"]["ok"] == 5
    assert any("part1" in line for line in logs)


def test_warm_scheduler_stops_at_its_deadline(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(FAKE_WORKER)
    jobs = [Job("p", 1, (("hang", "m"),), 1.0), Job("q", 1, (("ok", "m"),), 1.0)]
    t = time.monotonic()
    st = run_jobs(jobs, folder=tmp_path / "w", layer_kind="fake", seed=0, procs=1, memory_bytes=10.0,
                  deadline=t + 1.0, config_timeout_s=60.0, log=lambda s: None,
                  argv=lambda p: [sys.executable, str(worker), str(p)], poll_s=0.02)
    assert time.monotonic() - t < 15
    assert st["p/T=1/hang/m"].startswith("timeout") and st["q/T=1/ok/m"] == "not reached"


# --------------------------------------------------------------------------- the loop on a fake layer
class FakeLayer:
    """The layer interface with NumPy stand-ins: full-size preset configs (the predictions are
    real), routing drawn by the reference's router, a time per call, chosen failures."""

    kind = "fake"

    def __init__(self, fail=(), lose_context_at=None, seconds=0.0):
        self.fail, self.lose_at, self.seconds = set(fail), lose_context_at, seconds
        self.lost = False
        self.calls = []

    def config(self, preset):
        from megamoe.reference import MoEConfig

        return MoEConfig.preset(preset)

    def weights(self, cfg, seed):
        return {"seed": seed}

    def provenance(self):
        return {"gpu": "NVIDIA H200", "torch": "t", "triton": "3.6.0", "commit": "c", "date": "d", "num_sms": 132}

    def inputs(self, cfg, w, T, routing, seed, n):
        return [np.full(3, float(T))] * n, {"routing": routing}

    def routing(self, x, ws, cfg):
        from megamoe.grid import routing_bias
        from megamoe.reference import select_experts

        T = int(x[0])
        logits = np.random.default_rng(T).standard_normal((T, cfg.num_experts)) + routing_bias(cfg, ws["routing"])
        return select_experts(logits, cfg)[0].astype(np.int32)

    def forward(self, x, ws, cfg, backend):
        return x + (1e-3 if backend == "megakernel" else 0.0)

    def time_us(self, cfg, ws, xs, backend, reps):
        key = Configuration(cfg.name, int(xs[0][0]), ws["routing"], backend).key
        self.calls.append(key)
        time.sleep(self.seconds)
        if key == self.lose_at:
            self.lost = True
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if key in self.fail:
            raise ValueError("boom")
        return 100.0 + int(xs[0][0])

    def stage_us(self, cfg, ws, xs, reps, total_us, idle_s=0.0):
        from megamoe.kernels.bench import stage_split

        for _ in range(3 if idle_s else 0):  # as the CUDA layer: before each of its three prefixes
            self.idle(idle_s)
        T = int(xs[0][0])
        return stage_split({"align": 5.0, "gemm1": 45.0 + T, "gemm2": 75.0 + T}, total_us)

    def idle(self, seconds):
        self.calls.append(f"idle {seconds}")

    def rel_diff(self, y, ref):
        return float(np.abs(y - ref).max())

    def sync(self):
        pass

    def alive(self):
        return not self.lost

    def free(self):
        pass

    def free_memory(self):
        return 1e12

    def weight_bytes(self, cfg):
        return 1.0

    def job_bytes(self, cfg, T):
        return 1.0


def _args(out, **kw):
    a = dict(models="qwen3-30b-a3b,mixtral-8x7b", tokens="1,8", routings="uniform,concentrated",
             backends="multi,megakernel", profile=None, system="h200", compare_profiles="h200,gb200-nvl72", reps=3,
             budget=None, warm=False, warm_procs=None, config_timeout=60.0, resume=False, seed=0, out=str(out))
    a.update(kw)
    return argparse.Namespace(**a)


def _rows(out):
    return [json.loads(line) for p in sorted(out.glob("validation_*.jsonl")) for line in p.read_text().splitlines()]


def test_each_configuration_is_predicted_then_measured_and_a_failure_is_a_row(tmp_path, capsys):
    out = tmp_path / "v"
    bad = "mixtral-8x7b/T=8/concentrated/megakernel"
    assert measure_grid(_args(out), layer=FakeLayer(fail=[bad])) == 0
    rows = _rows(out)
    assert len(rows) == 2 * 16  # a prediction row, then a measurement or failure row, per configuration
    for pred, meas in zip(rows[::2], rows[1::2]):
        assert pred["phase"] == "prediction" and "measured_us" not in pred
        assert meas["predicted_us"] == pred["predicted_us"]
    failed = [r for r in rows if r["phase"] == "failed"]
    assert [Configuration(r["preset"], r["T"], r["routing"], r["backend"]).key for r in failed] == [bad]
    assert failed[0]["failure"] == "ValueError: boom" and "predicted_us" in failed[0]
    m = [r for r in rows if r["phase"] == "measurement"]
    assert len(m) == 15 and all(set(r["predictions"]) == {"h200", "gb200-nvl72"} for r in m)
    assert all(r["predictions"]["h200"]["predicted_us"] == r["predicted_us"] for r in m)  # h200 is the primary here
    assert all(r["rel_diff_vs_multi"] == pytest.approx(1e-3) for r in m if r["backend"] == "megakernel")
    rep = json.loads((out / "report.json").read_text())
    assert rep["configurations"] == 15 and rep["failed"][0]["failure"] == "ValueError: boom"
    assert set(rep["by_profile"]) == {"h200", "gb200-nvl72"} and rep["run"]["measured"] == 15
    assert "## Failed" in (out / "report.md").read_text()
    assert "15 measured, 1 failed, 0 not reached of 16" in capsys.readouterr().out


def test_a_lost_context_ends_the_run_and_resume_goes_on(tmp_path):
    out = tmp_path / "v"
    lost = "mixtral-8x7b/T=1/uniform/megakernel"
    assert measure_grid(_args(out), layer=FakeLayer(lose_context_at=lost)) == CONTEXT_LOST_EXIT
    rows = _rows(out)
    assert rows[-1]["phase"] == "failed" and "illegal memory access" in rows[-1]["failure"]
    done = {Configuration(r["preset"], r["T"], r["routing"], r["backend"]).key for r in rows if r["phase"] != "prediction"}
    assert len(done) == 6  # qwen3 at T=1 (4), then mixtral uniform multi, then the lost one
    # a run killed during a configuration leaves its prediction alone: resume records it as failed
    hung = {**rows[0], "preset": "mixtral-8x7b", "routing": "concentrated", "backend": "multi", "phase": "prediction"}
    with (out / "validation_2000-01-01.jsonl").open("w") as f:
        f.write(json.dumps(hung) + "\n" + '{"preset": "cut sho')  # and a line cut short
    layer = FakeLayer()
    assert measure_grid(_args(out, resume=True), layer=layer) == 0
    assert "mixtral-8x7b/T=1/concentrated/multi" not in layer.calls and len(layer.calls) == 16 - 6 - 1
    rep = json.loads((out / "report.json").read_text())
    assert rep["configurations"] == 14 and len(rep["failed"]) == 2
    assert any("interrupted" in f["failure"] for f in rep["failed"])


def test_the_budget_stops_new_configurations_and_the_report_is_still_written(tmp_path, capsys, monkeypatch):
    """On a virtual clock that each timing advances by 1 s, a configuration starts while its estimate
    and the 15 s kept for the report fit in the 19 s budget: the first of its (T, backend) is estimated
    at 2 s (starts at 0 and 1 s), a later one at the last one's 1 s (at 2 and 3 s); at 4 s none fits."""
    import functools
    import types

    from megamoe import measure

    now = [0.0]

    class OneSecondLayer(FakeLayer):
        def time_us(self, *a):
            now[0] += 1.0
            return super().time_us(*a)

    monkeypatch.setattr(measure, "Budget", functools.partial(Budget, clock=lambda: now[0]))
    monkeypatch.setattr(measure, "command_start", lambda: 0.0)
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    out = tmp_path / "v"
    assert measure_grid(_args(out, budget=19.0), layer=OneSecondLayer()) == 0
    rows = _rows(out)
    measured = [r for r in rows if r["phase"] == "measurement"]
    assert len(measured) == 4
    rep = json.loads((out / "report.json").read_text())
    assert rep["run"]["stop_reason"].startswith("budget") and len(rep["run"]["not_reached"]) == 16 - len(measured)
    assert rep["configurations"] == len(measured)
    assert "not reached" in capsys.readouterr().out


def test_a_crash_in_the_compile_ahead_is_not_measured(tmp_path, monkeypatch):
    import megamoe.warm as warm

    crashed = "qwen3-30b-a3b/T=1/uniform/megakernel"
    monkeypatch.setattr(warm, "run_jobs", lambda jobs, **kw: {"qwen3-30b-a3b/T=1/uniform/multi": "ok",
                                                              crashed: "crashed (exit -11)"})
    out = tmp_path / "v"
    layer = FakeLayer()
    assert measure_grid(_args(out, models="qwen3-30b-a3b", tokens="1", routings="uniform", warm=True), layer=layer) == 0
    assert layer.calls == ["qwen3-30b-a3b/T=1/uniform/multi"]
    last = _rows(out)[-1]
    assert last["phase"] == "failed" and "crashed (exit -11)" in last["failure"]


# --------------------------------------------------------------------------- the real loop, interpreted
@pytest.mark.interpret
@pytest.mark.slow
def test_grid_run_under_the_interpreter_end_to_end(tmp_path):
    """``--scale`` on the CPU: compile-ahead processes, the kernels' routing steered (concentrated:
    the steering shows in the experts touched), both backends, the report. The interpreter's times
    mean nothing; the machinery is what is checked."""
    pytest.importorskip("triton")
    from megamoe.cli import main

    out = tmp_path / "v"
    rc = main(["validate", "--scale", "--models", "mixtral-8x7b", "--tokens", "3", "--routings", "concentrated",
               "--out", str(out), "--budget", "300", "--warm-procs", "2"])
    assert rc == 0
    rows = [r for r in _rows(out) if r["phase"] == "measurement"]
    assert len(rows) == 2 and {r["backend"] for r in rows} == {"multi", "megakernel"}
    assert all(r["experts_touched"] == 2 for r in rows)  # the steered router: every token on experts 0..K-1
    assert all(r["rel_diff_vs_multi"] < 1e-5 for r in rows if r["backend"] == "megakernel")  # float32
    multi = next(r for r in rows if r["backend"] == "multi")  # the interpreter's own tiles, recorded
    assert multi["config_source"] == "heuristic" and multi["gemm_config"]["gemm1"]["BLOCK_M"] == 16
    status = json.loads((out / "warm" / "warm_status.json").read_text())["status"]
    assert set(status.values()) == {"ok"} and len(status) == 2
    assert (out / "scatter.png").stat().st_size > 1000


def test_the_watchdog_records_a_hung_configuration_and_writes_the_report(tmp_path, monkeypatch):
    import functools

    from megamoe import measure

    exits = []
    monkeypatch.setattr(measure, "Watchdog", functools.partial(Watchdog, exit=exits.append, poll_s=0.01))
    out = tmp_path / "v"
    layer = FakeLayer(seconds=2.0)  # every call "hangs" 10x past the 0.2 s timeout; the fake exit lets it go on
    measure_grid(_args(out, models="qwen3-30b-a3b", tokens="1", routings="uniform", config_timeout=0.2), layer=layer)
    assert exits and exits[0] == 4
    rows = _rows(out)
    assert rows[1]["phase"] == "failed" and "watchdog ended the run" in rows[1]["failure"]
    assert (out / "report.json").exists()


def test_multi_rows_carry_measured_stages_and_the_report_compares_them(tmp_path):
    """Each measured multi-launch row has its stages as measured (prefix differences; the combine
    is the layer less the GEMM 2 prefix), the megakernel rows none, and the report's per-stage
    table compares them with the summed predicted stages of each group; --no-stages skips them."""
    from megamoe.report import STAGE_GROUPS, load_rows, report_stats, stage_group

    out = tmp_path / "v"
    assert measure_grid(_args(out, tokens="8", models="qwen3-30b-a3b"), layer=FakeLayer()) == 0
    rows = [r for r in _rows(out) if r["phase"] == "measurement"]
    multi = [r for r in rows if r["backend"] == "multi"]
    assert multi and all(set(r["measured_stages_us"]) == set(STAGE_GROUPS) for r in multi)
    assert all(r["measured_stages_us"]["combine"] == pytest.approx(25.0) for r in multi)
    assert not any("measured_stages_us" in r for r in rows if r["backend"] == "megakernel")
    assert {stage_group(n) for r in multi for n in r["predicted_stages"]} <= set(STAGE_GROUPS)
    st = report_stats(load_rows(out))["stages"]
    assert set(st) == set(STAGE_GROUPS) and all(e["configurations"] == len(multi) for e in st.values())
    assert "Multi-launch stages, predicted vs measured" in (out / "report.md").read_text()
    out2 = tmp_path / "v2"
    assert measure_grid(_args(out2, tokens="8", models="qwen3-30b-a3b", stages=False), layer=FakeLayer()) == 0
    assert not any("measured_stages_us" in r for r in _rows(out2))


def test_multi_rows_record_the_gemm_entries_they_run_and_repredict_with_them(tmp_path):
    """A multi row records the entries moe_forward runs on its GPU (select_config: here an H100, which
    has a model table and no tuned file) and where they come from, is predicted with them, and
    re-predicts to the same time; megakernel rows record none. Qwen1.5-MoE-A2.7B: a shared expert."""
    from megamoe.kernels import configs
    from megamoe.predict import predict_config
    from megamoe.reference import MoEConfig
    from megamoe.repredict import repredict_rows
    from megamoe.simulator import load_profile

    class H100(FakeLayer):
        def provenance(self):
            return {**super().provenance(), "gpu": "NVIDIA H100 80GB HBM3"}

    out = tmp_path / "v"
    assert measure_grid(_args(out, tokens="512", models="qwen1.5-moe-a2.7b", routings="zipf", compare_profiles=""),
                        layer=H100()) == 0
    rows = {r["backend"]: r for r in _rows(out) if r["phase"] == "measurement"}
    r, cfg = rows["multi"], MoEConfig.preset("qwen1.5-moe-a2.7b")
    E, H, I, K, Is = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k, cfg.shared_intermediate_size
    kw = dict(gpu="NVIDIA H100 80GB HBM3", dtype="bfloat16", triton_version="3.6.0")
    assert r["gemm_config"] == configs.select_config(E, H, I, K, 512, **kw)
    assert r["shared_gemm_config"] == configs.select_config(1, H, Is, 1, 512, **kw)
    assert r["config_source"] == configs.config_source(E, H, I, K, 512, **kw)
    assert not {"gemm_config", "config_source"} & set(rows["megakernel"])
    p = load_profile("h200")
    want = predict_config(cfg, r["counts"], 512, "multi", p, device_name=kw["gpu"], calls_per_graph=r["calls_per_graph"],
                          reps=3, gemm=r["gemm_config"], shared_gemm=r["shared_gemm_config"])
    assert r["predicted_us"] == want["predicted_us"]
    again, _ = repredict_rows([r], p)
    assert again[0]["predicted_us"] == pytest.approx(r["predicted_us"], rel=1e-12)


def test_idle_before_leaves_the_gpu_idle_before_each_timing(tmp_path):
    """--idle-before S: the layer idles S before the layer's timing and before each stage prefix of a
    multi row (three here), and the rows say so; by default nothing idles."""
    out = tmp_path / "v"
    layer = FakeLayer()
    assert measure_grid(_args(out, tokens="8", models="qwen3-30b-a3b", routings="uniform", idle_before=0.25),
                     layer=layer) == 0
    multi, mk = "qwen3-30b-a3b/T=8/uniform/multi", "qwen3-30b-a3b/T=8/uniform/megakernel"
    assert layer.calls == ["idle 0.25", multi, "idle 0.25", "idle 0.25", "idle 0.25", "idle 0.25", mk]
    rows = [r for r in _rows(out) if r["phase"] == "measurement"]
    assert len(rows) == 2 and all(r["idle_before_s"] == 0.25 for r in rows)
    plain = FakeLayer()
    assert measure_grid(_args(tmp_path / "w", tokens="8", models="qwen3-30b-a3b", routings="uniform"), layer=plain) == 0
    assert not any(c.startswith("idle") for c in plain.calls)
    assert not any("idle_before_s" in r for r in _rows(tmp_path / "w"))


@pytest.fixture
def study_options(monkeypatch):
    """A stand-in ``CostOptions`` of two fields: the cost model has no alternative under study today, so
    the plumbing of ``--switch`` / ``--variant`` is checked with this one."""
    import dataclasses

    from megamoe.simulator import cost

    @dataclasses.dataclass(frozen=True)
    class Options:
        deep: bool = False
        wide: bool = True

    monkeypatch.setattr(cost, "CostOptions", Options)
    return Options


def test_a_switch_set_for_the_run_is_in_its_predictions_rows_and_report(tmp_path, study_options):
    """``--switch`` in the GPU run: the prediction rows, written before each measurement, carry
    ``cost_switches`` and the report's note names them."""
    from megamoe.repredict import switches

    out = tmp_path / "v"
    settings = {"deep": True}
    args = _args(out, models="qwen3-30b-a3b", tokens="8", routings="uniform", backends="multi")
    args.cost_switches = settings
    with switches(settings) as options:
        assert options == study_options(deep=True)
        assert measure_grid(args, layer=FakeLayer()) == 0
    rows = _rows(out)
    assert rows and all(r["cost_switches"] == settings for r in rows if r["phase"] == "prediction")
    assert "deep=on" in (out / "report.md").read_text()


def test_switch_without_a_run_that_predicts_is_refused(capsys, monkeypatch, study_options):
    from megamoe import validate
    from megamoe.cli import main

    monkeypatch.setattr(validate, "_has_cuda", lambda: False)
    assert main(["validate", "--switch", "deep=on", "--models", "qwen3-30b-a3b", "--tokens", "1"]) == 2
    assert "--switch needs --repredict PROFILE or the GPU run" in capsys.readouterr().err


def test_variants_are_predicted_before_the_measurement_and_reported(tmp_path, study_options):
    """--variant: one more prediction per row with the first profile and those options, in the
    prediction row written before the measurement, with its error after and its own line in the report."""
    from megamoe.report import load_rows, report_stats
    from megamoe.repredict import parse_variants

    variants = parse_variants(["deep=on", "deep=on,wide=off"])
    assert list(variants) == ["deep", "deep+no-wide"]
    out = tmp_path / "v"
    assert measure_grid(_args(out, tokens="8", models="qwen3-30b-a3b", variants=variants), layer=FakeLayer()) == 0
    rows = _rows(out)
    names = {"h200+deep", "h200+deep+no-wide"}
    pred = [r for r in rows if r["phase"] == "prediction"]
    meas = [r for r in rows if r["phase"] == "measurement"]
    assert pred and all(names <= set(r["predictions"]) for r in pred)
    assert all(all("error" not in r["predictions"][n] for n in names) for r in pred)
    assert meas and all(isinstance(r["predictions"][n]["error"], float) for r in meas for n in names)
    assert all(r["cost_variants"]["deep"] == {"deep": True} for r in meas)
    by = report_stats(load_rows(out))["by_profile"]
    assert names <= set(by) and all(by[n]["configurations"] == len(meas) for n in names)
    assert "the variant h200+deep" in (out / "report.md").read_text()


@pytest.mark.parametrize("spec, match", [("", "expected NAME=on"), ("nope=on", "unknown cost option"),
                                         ("deep=maybe", "expected deep=on")])
def test_a_bad_variant_is_named(spec, match, study_options):
    from megamoe.repredict import parse_variants

    with pytest.raises(ValueError, match=match):
        parse_variants([spec])
    with pytest.raises(ValueError, match="repeats"):
        parse_variants(["deep=on", "deep=on"])


def test_no_option_is_under_study_today():
    """The shipped CostOptions has no field: every --variant name is refused, saying why."""
    from megamoe.repredict import parse_variants

    with pytest.raises(ValueError, match="no cost-model options are under study"):
        parse_variants(["USE_L2_READ_DEPTH=on"])
