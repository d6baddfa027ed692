"""megamoe tune's logic with a fake timer (no GPU): the 2% rule, the tuned file, the comparison
rows as they finish, progress lines, the budget and --resume."""

from __future__ import annotations

import json
import time

import pytest

from megamoe.cli import main
from megamoe.kernels import configs as cfgs
from megamoe.kernels.tune import KEEP_MARGIN, keeps, record, tune_shape, verdict
from megamoe.tune import run_tune

SHAPE = (128, 2048, 768, 8)  # Qwen3-30B-A3B's routed experts


def _timer(model_entry, model_factor=1.0, fail=None, sleep=0.0, flat=False):
    """Every config 10 us plus BLOCK_N / 64 (``flat``: 20 us); the model's own configs 20 us times
    model_factor; ``fail``: a BLOCK_N that raises."""
    def t(gemm, c):
        time.sleep(sleep)
        if fail is not None and c["BLOCK_N"] == fail:
            raise RuntimeError("out of resources")
        if c == model_entry[gemm]:
            return 20.0 * model_factor
        return 20.0 if flat else 10.0 + c["BLOCK_N"] / 64
    return t


def test_keep_needs_two_percent():
    assert KEEP_MARGIN == 0.02
    assert keeps(98.0, 100.0) and not keeps(98.1, 100.0)
    assert verdict(41.2, 44.0) == "kept: 41.2 us vs the model's 44.0 (-6.4%)"
    assert verdict(43.5, 44.0).startswith("the model's choice stands: within 2%")


def test_tune_shape_times_every_candidate_and_the_model(capsys):
    """Every candidate of both GEMMs and the model's entry is timed once, with progress lines; the best
    pair shares BLOCK_M; a config that fails is named and the others still run."""
    model = cfgs.untuned_config(*SHAPE, 1, gpu="none")
    seen, lines = [], []
    timer = _timer(model, fail=128)
    r = tune_shape(*SHAPE, 1, model, lambda g, c: seen.append((g, c)) or timer(g, c), log=lines.append, label="q T=1")
    n1 = len(cfgs.candidates(*SHAPE, 1)["gemm1"])
    assert sum(g == "gemm1" for g, _ in seen) == n1
    assert any("gemm1 candidate 1/" in x and " us" in x for x in lines)
    assert r["failed"] and all("BN=128" in f for f in r["failed"])
    assert r["best"]["gemm1"]["BLOCK_M"] == r["best"]["gemm2"]["BLOCK_M"]
    assert r["best_us"] == pytest.approx(2 * (10.0 + 32 / 64))  # the narrowest tiles of this fake timer


@pytest.mark.parametrize("factor, kept", [(1.3, True), (1.0, False)])
def test_tune_writes_only_what_beats_the_model(tmp_path, factor, kept):
    """The model's entry 30% slower than the best: the best is written and the row says kept; as
    fast: nothing written, 'the model's choice stands'; each (preset, T) one comparison row."""
    out, tuned, lines = tmp_path / "rows.jsonl", tmp_path / "tuned.json", []
    model = {}

    def timers(name, cfg, T):
        from megamoe.choose import choose
        from megamoe.reference import MoEConfig

        model.update(choose(MoEConfig.preset(name), T, "h100", megakernel=False).entry)
        return _timer(model, factor, flat=True)

    run_tune(["qwen3-30b-a3b"], [1, 4096], "h100", out, budget_s=600, log=lines.append, timers=timers,
             gpu="Fake GPU", triton_version="0", path=tuned)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["preset"], r["T"], r["kept"]) for r in rows] == [("qwen3-30b-a3b", 1, kept), ("qwen3-30b-a3b", 4096, kept)]
    for r in rows:
        assert r["model_measured_us"] / r["best_us"] == pytest.approx(r["ratio"])
        assert r["model_predicted_us"] > 0 and r["profile"] == "h100"
        assert cfgs.check_entry(r["best_entry"], "row") == r["best_entry"]
    assert tuned.exists() == kept
    if kept:
        assert cfgs.load_file(tuned)["E128_H2048_I768_K8"][1] == rows[0]["best_entry"]
        assert any(x.startswith("qwen3-30b-a3b T=1: kept:") for x in lines)
    else:
        assert any("the model's choice stands: within 2%" in x for x in lines)


def test_a_tuned_entry_the_model_matches_is_dropped(tmp_path):
    tuned = tmp_path / "tuned.json"
    e = cfgs.untuned_config(*SHAPE, 1, gpu="none")
    record(tuned, "g", "bfloat16", "t", "E128_H2048_I768_K8", 1, e)
    record(tuned, "g", "bfloat16", "t", "E128_H2048_I768_K8", 4096, e)
    record(tuned, "g", "bfloat16", "t", "E128_H2048_I768_K8", 1, None)
    assert set(cfgs.load_file(tuned)["E128_H2048_I768_K8"]) == {4096}


def test_budget_keeps_what_was_measured_and_resume_goes_on(tmp_path):
    """A budget that runs out inside T=4096 keeps the T=1 row and writes nothing for T=4096;
    --resume then times T=4096 only."""
    out, tuned, lines, calls = tmp_path / "rows.jsonl", tmp_path / "tuned.json", [], []

    def timers(name, cfg, T):
        calls.append(T)
        return _timer({"gemm1": {}, "gemm2": {}}, sleep=0.0 if T == 1 else 0.05)

    kw = dict(timers=timers, gpu="Fake GPU", triton_version="0", path=tuned)
    run_tune(["qwen3-30b-a3b"], [1, 4096], "h100", out, budget_s=0.5, log=lines.append, **kw)
    assert [json.loads(x)["T"] for x in out.read_text().splitlines()] == [1]
    assert any("budget" in x and "nothing written" in x for x in lines)
    calls.clear()
    run_tune(["qwen3-30b-a3b"], [1, 4096], "h100", out, budget_s=600, resume=True, log=lines.append, **kw)
    assert calls == [4096]
    assert [json.loads(x)["T"] for x in out.read_text().splitlines()] == [1, 4096]


@pytest.mark.parametrize("argv, message", [
    (["--presets", "nope-7b"], "unknown preset(s) ['nope-7b']"),
    (["--tokens", "1,x"], "--tokens must be comma-separated integers"),
    (["--budget", "0"], "--budget must be > 0"),
    (["--profile", "h999"], "neither a shipped profile"),
])
def test_tune_bad_input_is_one_clear_line(capsys, argv, message):
    assert main(["tune", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_tune_without_a_gpu_says_what_runs_instead(capsys):
    assert main(["tune"]) == 2
    assert "megamoe configure" in capsys.readouterr().err


def test_without_a_profile_the_model_entry_is_the_gpus_table(tmp_path):
    """No --profile: the entry timed as the model's is the one the kernels take on that GPU without
    a tuned file (its model table's), and the row carries the table's predicted GEMM us."""
    out, seen = tmp_path / "rows.jsonl", []

    def timers(name, cfg, T):
        t = _timer({"gemm1": {}, "gemm2": {}})
        return lambda g, c: seen.append(c) or t(g, c)

    gpu = "NVIDIA H100 80GB HBM3"
    run_tune(["qwen3-30b-a3b"], [8], None, out, budget_s=600, log=lambda s: None, timers=timers, gpu=gpu,
             triton_version="0", path=tmp_path / "tuned.json")
    row = json.loads(out.read_text())
    table = cfgs.load_file(cfgs.model_path("h100", "bfloat16"), model=True)["E128_H2048_I768_K8"][8]
    assert row["model_entry"] == table and table["gemm1"] in seen
    assert row["model_predicted_us"] == cfgs.model_prediction(128, 2048, 768, 8, 8, gpu=gpu)["gemms"] > 0


def test_an_entry_that_fails_the_reference_check_is_not_kept(tmp_path):
    """The best entry 30% faster but wrong against the float64 reference: not kept, the row says
    why; the model's entry is checked too."""
    out, tuned, lines, checked = tmp_path / "rows.jsonl", tmp_path / "tuned.json", [], []
    model = {}

    def timers(name, cfg, T):
        from megamoe.choose import choose
        from megamoe.reference import MoEConfig

        model.update(choose(MoEConfig.preset(name), T, "h100", megakernel=False).entry)
        return _timer(model, 1.3, flat=True)

    def check(name, cfg, w, T, entry):
        checked.append(entry)
        ok = entry == model
        return {"ok": ok, "max_err": 0.0 if ok else 1.0, "rms_err": 0.0 if ok else 1.0}

    run_tune(["qwen3-30b-a3b"], [1], "h100", out, budget_s=600, log=lines.append, timers=timers, gpu="Fake GPU",
             triton_version="0", path=tuned, check=check)
    row = json.loads(out.read_text())
    assert not row["kept"] and not tuned.exists() and len(checked) == 2
    assert row["model_numerics"]["ok"] and not row["best_numerics"]["ok"]
    assert any("not kept: the best entry fails the float64 reference check" in x for x in lines)


@pytest.mark.parametrize("T", [5, 37])  # one routing block and several; odd sizes
def test_numerics_check_runs_the_layer_with_the_entry(device, T, monkeypatch):
    """The check ``megamoe tune`` gives a kept entry: the layer with that entry against the float64
    reference (here the interpreter's tiny entries on a shrunken Qwen3-30B-A3B); a wrong layer fails it."""
    import numpy as np

    from megamoe.reference import MoEConfig, random_weights
    from megamoe.tune import numerics_check

    cfg = MoEConfig.preset("qwen3-30b-a3b").replace(hidden_size=48, intermediate_size=40, num_experts=8, top_k=2)
    w = random_weights(cfg, seed=3).to_torch(device.name, device.torch_dtype())
    entry = cfgs.default_config(8, 48, 40, 2, T, interpret=device.name == "cpu")
    rep = numerics_check(sample=4)("tiny", cfg, w, T, entry)
    assert rep["ok"] and 0 < rep["max_err"] < 1e-3, rep
    from megamoe.kernels import moe

    forward = moe._forward
    monkeypatch.setattr(moe, "_forward", lambda *a, **k: forward(*a, **k) * 1.5)  # a layer 50% off
    bad = numerics_check(sample=4)("tiny", cfg, w, T, entry)
    assert not bad["ok"] and np.isfinite(bad["max_err"]) and bad["max_err"] > 0.1


@pytest.mark.parametrize("T", [3, 21])
def test_gemm_launches_run_every_gemm_alone(device, T):
    """What the GPU timer launches: each GEMM alone on the layer's own routing (the interpreter's tiny
    tiles on a shrunken layer); split-K 2 gives GEMM 1's activation and GEMM 2's pair rows of split-K 1."""
    import torch

    from megamoe.kernels.tune import gemm_launches
    from megamoe.reference import MoEConfig, random_weights

    cfg = MoEConfig.preset("qwen3-30b-a3b").replace(hidden_size=48, intermediate_size=40, num_experts=8, top_k=2)
    w = random_weights(cfg, seed=5).to_torch(device.name, device.torch_dtype())
    bufs = {}
    launch_of = gemm_launches(cfg, w, T, bufs)
    base = cfgs.default_config(8, 48, 40, 2, 2, interpret=device.name == "cpu")["gemm1"]
    acts, rows = [], []
    for sk in (1, 2):
        c = dict(base, SPLIT_K=sk)
        launch_of("gemm1", c)()
        acts.append(bufs["act"][c["BLOCK_M"]].clone())
        launch_of("gemm1", dict(base, SPLIT_K=1))()  # GEMM 2 reads one activation whatever its split
        launch_of("gemm2", c)()
        out = bufs["out"][sk].float()
        rows.append(out.view(sk, T * 2, 48).sum(0))
    tol = dict(rtol=2e-3, atol=2e-3)
    assert torch.count_nonzero(acts[0]) > 0 and torch.allclose(acts[0], acts[1], **tol)
    assert torch.count_nonzero(rows[0]) > 0 and torch.allclose(rows[0], rows[1], **tol)
