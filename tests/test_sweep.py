"""megamoe sweep: SPEC checks, a tiny grid on a LocalCluster, resume, failing points, the analytic path.

Expected numbers come from ``megamoe.simulator.simulate`` called point by point (the public API a
sweep must agree with), never from the sweep's own code. Small shapes (Qwen3-30B-A3B on an HGX
H200, a few tokens per GPU) keep each point in milliseconds.
"""

from __future__ import annotations

import json
import sys

import pytest

from megamoe.cli import main
from megamoe.simulator import simulate
from megamoe.sweep import SpecError, best, load_results, parse_spec, run_sweep
from megamoe.sweep.store import Store

SMALL = {"model": "qwen3-30b-a3b", "system": "hgx-h200", "routing": "uniform"}


def write_spec(path, fixed: dict, grid: dict, extra: str = "") -> str:
    def toml(d):
        return "\n".join(f"{k} = {json.dumps(v)}" for k, v in d.items())

    path.write_text(f"[fixed]\n{toml(fixed)}\n\n[grid]\n{toml(grid)}\n{extra}")
    return str(path)


def test_grid_expands_in_order_and_ids_ignore_spelling():
    spec = parse_spec({"fixed": SMALL, "grid": {"schedule": ["bulk", "fused"], "tokens-per-gpu": [8, 16]}})
    assert [(p.options["schedule"], p.options["tokens-per-gpu"]) for p in spec.points()] == [
        ("bulk", 8), ("bulk", 16), ("fused", 8), ("fused", 16)]
    # a default written out, a flag spelling and a --set spelling name the same point
    a = parse_spec({"fixed": {**SMALL, "tokens-per-gpu": 8, "link-bandwidth": 2.5e10}, "grid": {}}).points()[0]
    b = parse_spec({"fixed": {**SMALL, "tokens-per-gpu": 8, "seed": 0, "link_bandwidth": 25_000_000_000},
                    "grid": {}}).points()[0]
    assert a.point_id == b.point_id


@pytest.mark.parametrize("body,message", [
    # unknown option, named with its table
    ('[fixed]\nmodle = "deepseek-v3"\n', r"\[fixed\] modle: unknown option"),
    ('[grid]\ncomm_sm = [8, 16]\n', r"\[grid\] comm_sm: unknown option"),
    # bad values: wrong type, not a choice, not a preset, out of the profile's range
    ('[grid]\ntokens-per-gpu = [128, "many"]\n', r"tokens-per-gpu = 'many': must be an integer"),
    ('[grid]\nplacement = ["contiguous", "sideways"]\n', r"placement = 'sideways': must be one of"),
    ('[fixed]\nmodel = "gpt-17"\n', r"model = 'gpt-17'.*neither a preset"),
    ('[grid]\nrouting = ["skewed", "zipf"]\n', r"routing = 'zipf'"),
    ('[grid]\n"link.payload_efficiency" = [0.8, 1.5]\n', r"link.payload_efficiency"),
    ('[grid]\nschedule = "fused"\n', r"\[grid\] schedule = 'fused': must be a non-empty list"),
    # unknown table
    ('[fixed]\nmodel = "deepseek-v3"\n[grdi]\nschedule = ["bulk"]\n', r"unknown table \[grdi\]"),
])
def test_bad_spec_is_named_before_anything_runs(tmp_path, capsys, body, message):
    spec = tmp_path / "bad.toml"
    spec.write_text(body)
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    import re

    assert re.search(message, err[0]), err[0]
    assert not out.exists()  # nothing ran, nothing was written


def test_out_is_a_file_and_missing_dependency_fail_first(tmp_path, capsys, monkeypatch):
    spec = write_spec(tmp_path / "s.toml", SMALL, {"tokens-per-gpu": [8, 16]})
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["sweep", spec, "--out", str(f), "--workers", "0"]) == 2
    assert "is a file" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # importlib.util.find_spec now says "not installed"
    assert main(["sweep", spec, "--out", str(tmp_path / "o"), "--workers", "0"]) == 2
    assert "missing dependency 'pyarrow'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_tiny_grid_on_a_local_cluster_of_two_workers(tmp_path, capsys):
    spec = write_spec(tmp_path / "s.toml", SMALL, {"tokens-per-gpu": [8, 32], "schedule": ["bulk", "fused"],
                                                   "placement": ["contiguous", "eplb"]})
    out = tmp_path / "out"
    assert main(["sweep", spec, "--out", str(out), "--workers", "2"]) == 0
    df = load_results(out)
    assert len(df) == 8 and df["error"].isna().all()
    assert {"model", "system", "routing", "tokens-per-gpu", "schedule", "placement", "layer_time_us",
            "exposed_comm_us", "imbalance_by_gpu", "wall_s", "error"} <= set(df.columns)
    assert (df["layer_time_us"] >= df["analytic_us"] * (1 - 1e-9)).all()
    row = df[(df["tokens-per-gpu"] == 32) & (df["schedule"] == "fused") & (df["placement"] == "eplb")].iloc[0]
    ref = simulate(SMALL["model"], SMALL["system"], 32, routing="uniform", placement="eplb", schedule="fused")
    assert row["layer_time_us"] == pytest.approx(ref.layer_time_us, rel=1e-12)
    assert row["exposed_comm_us"] == pytest.approx(ref.breakdown_us["exposed_communication"], rel=1e-9, abs=1e-9)
    assert (out / "sweep.png").stat().st_size > 1000
    assert not (out / "parts").exists()  # folded into results.parquet
    # --best ranks what is there
    capsys.readouterr()
    assert main(["sweep", "--best", str(out), "--top", "3", "--objective", "exposed_comm_us"]) == 0
    printed = capsys.readouterr().out
    # ranked within each token count (a layer's time grows with its batch), every axis that varied shown
    assert "best 6 of 8 points by exposed_comm_us (up to 3 per tokens-per-gpu, ranked within each" in printed
    header = next(line for line in printed.splitlines() if "layer_time_us" in line).split()
    assert header[:3] == ["tokens-per-gpu", "schedule", "placement"]
    top = best(out, "exposed_comm_us", 3)
    assert top.attrs["ranked_within"] == "tokens-per-gpu" and list(top["tokens-per-gpu"]) == [8, 8, 8, 32, 32, 32]


def test_resume_runs_only_new_points_and_reads_parts_of_a_killed_run(tmp_path):
    out = tmp_path / "out"
    small = {"fixed": {**SMALL, "analytic": True}, "grid": {"tokens-per-gpu": [8, 16]}}
    first = run_sweep(small, out, workers=0, progress=False, plot=False)
    assert first.attrs["counts"]["ran"] == 2
    bigger = {"fixed": {**SMALL, "analytic": True}, "grid": {"tokens-per-gpu": [8, 16, 32, 64]}}
    # a run killed after one finished batch leaves that batch as a part (and maybe a torn temporary)
    from megamoe.sweep.worker import run_batch

    killed = parse_spec(bigger).points()[2:3]
    Store(out).append(run_batch(killed))
    (out / "parts" / ".part-x.parquet.tmp").write_bytes(b"torn")
    assert len(load_results(out)) == 3
    again = run_sweep(bigger, out, workers=0, progress=False, plot=False)
    assert again.attrs["counts"] == {"total": 4, "skipped": 3, "ran": 1, "failed": 0, "interrupted": False}
    assert list(again["tokens-per-gpu"]) == [8, 16, 32, 64]
    assert len(load_results(out)) == 4
    # the first run's rows were kept as they were, not recomputed
    assert (again.loc[:1, "wall_s"].to_numpy() == first["wall_s"].to_numpy()).all()


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "out"
    spec = {"fixed": {**SMALL, "tokens-per-gpu": 8}, "grid": {"comm-sms": [8, 500], "schedule": ["bulk", "fused"]}}
    df = run_sweep(spec, out, workers=0, progress=False, plot=False)
    bad = df[df["comm-sms"] == 500]
    assert len(bad) == 2 and bad["layer_time_us"].isna().all()
    assert bad["error"].str.contains("comm_sms must be").all()
    good = df[df["comm-sms"] == 8]
    assert good["error"].isna().all() and (good["layer_time_us"] > 0).all()
    assert len(best(out)) == 2  # failed points are not ranked
    # a rerun skips failed points too, unless asked to retry them
    assert run_sweep(spec, out, workers=0, progress=False, plot=False).attrs["counts"]["ran"] == 0
    assert run_sweep(spec, out, workers=0, progress=False, plot=False,
                     retry_failed=True).attrs["counts"]["ran"] == 2


@pytest.mark.parametrize("point", [
    dict(schedule="fused", placement="eplb", routing="skewed"),  # redundant slots, skew
    dict(schedule="bulk", dtype="fp8", **{"comm-sms": 8}),  # fp8 dispatch, bulk formula
    dict(schedule="fused", minibatch=16, **{"no-shared": True}),  # minibatches do not change the bound
    dict(schedule="fused", gpus=4, **{"link-bandwidth": 1e10}),  # profile overrides
])
def test_analytic_points_match_simulate_analytic_only(tmp_path, point):
    opts = {**SMALL, "tokens-per-gpu": 64, "analytic": True, **point}
    df = run_sweep({"fixed": opts, "grid": {"seed": [0, 1]}}, tmp_path, workers=0, progress=False, plot=False)
    overrides = {k: v for k, v in (("num_gpus", point.get("gpus")), ("link_bandwidth", point.get("link-bandwidth")))
                 if v is not None}
    for seed, row in zip((0, 1), df.itertuples()):
        ref = simulate(opts["model"], opts["system"], 64, routing=opts["routing"],
                       placement=point.get("placement", "contiguous"), schedule=point["schedule"],
                       comm_sms=point.get("comm-sms"), minibatch=point.get("minibatch"), dtype=point.get("dtype", "bf16"),
                       include_shared=not point.get("no-shared", False), seed=seed, overrides=overrides or None,
                       analytic_only=True)
        assert row.error is None
        assert row.layer_time_us == pytest.approx(ref.layer_time_us, rel=1e-12)
        assert row.exposed_comm_us == pytest.approx(ref.breakdown_us["exposed_communication"], rel=1e-9, abs=1e-9)
        assert row.load_imbalance_wait_us == pytest.approx(ref.breakdown_us["load_imbalance_wait"], rel=1e-9, abs=1e-9)
        assert row.dispatch_us == pytest.approx(ref.breakdown_us["dispatch"], rel=1e-9, abs=1e-9)
        assert row.combine_us == pytest.approx(ref.breakdown_us["combine"], rel=1e-9, abs=1e-9)
        assert row.imbalance_by_expert == pytest.approx(ref.imbalance["by_expert"])


def test_old_grid_flags_build_the_same_grid_as_a_spec(tmp_path):
    out = tmp_path / "out"
    rc = main(["sweep", "--model", "qwen3-30b-a3b", "--system", "hgx-h200", "--routing", "uniform", "--analytic",
               "--tokens-per-gpu", "8,16", "--placement", "contiguous,eplb", "--schedule", "fused", "--workers", "0",
               "--quiet", "--out", str(out)])
    assert rc == 0
    same = parse_spec({"fixed": {**SMALL, "analytic": True, "schedule": "fused"},
                       "grid": {"tokens-per-gpu": [8, 16], "placement": ["contiguous", "eplb"]}})
    assert set(load_results(out)["point_id"]) == {p.point_id for p in same.points()}


def test_only_the_axes_given_vary_and_rows_name_model_and_system(tmp_path, capsys):
    """Flags give the grid: 2 x 2 x 2 = 8 points, nothing added; the rest keep simulate's defaults,
    said on stderr; rows carry the model and system even where they were left at their defaults."""
    out = tmp_path / "out"
    rc = main(["sweep", "--analytic", "--tokens-per-gpu", "8,16", "--placement", "contiguous,eplb",
               "--comm-sms", "16,40", "--workers", "0", "--no-plot", "--out", str(out)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "fixed at simulate's defaults: model=deepseek-v3, system=gb200-nvl72, routing=skewed" in err
    df = load_results(out)
    assert len(df) == 8
    assert set(df["model"]) == {"deepseek-v3"} and set(df["system"]) == {"gb200-nvl72"}


def test_plot_title_names_model_and_system(tmp_path):
    pytest.importorskip("matplotlib")
    from megamoe.sweep import plot

    spec = parse_spec({"fixed": {"analytic": True}, "grid": {"tokens-per-gpu": [8, 16]}})
    df = run_sweep(spec, tmp_path, workers=0, progress=False, plot=False)
    titles = []
    from matplotlib.figure import Figure

    orig = Figure.suptitle

    def keep(self, text, **kw):
        titles.append(text)
        return orig(self, text, **kw)

    Figure.suptitle = keep
    try:
        plot.plot(df, spec, tmp_path / "p.png")
    finally:
        Figure.suptitle = orig
    assert "model=deepseek-v3" in titles[0] and "system=gb200-nvl72" in titles[0]


def test_notebook_04_quotes_no_computed_number_and_writes_to_a_temporary_folder():
    """Its prose says what the printed figures show without quoting them (so a rerun cannot
    contradict it), and it writes its config and sweep under a temporary folder."""
    import re
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks" /
                     "04_placement_sweep_kimi_k3_like.ipynb").read_text())
    prose = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    reading = prose[prose.index("## Reading"):]
    assert not re.findall(r"\d[\d.,]*\s*(?:us\b|%)", reading)
    code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "tempfile.mkdtemp" in code and 'Path("kimi-k3-like.json")' not in code and '"sweep-kimi' not in code


def test_spec_error_type_for_the_api():
    with pytest.raises(SpecError, match=r"\[grid\] minibatch = 0"):
        parse_spec({"grid": {"minibatch": [0, 64]}})


def test_best_shows_every_axis_that_varied_across_two_sweeps(tmp_path, capsys):
    """Two sweeps into one folder, the second adding a routing the first left at its default: the
    table shows the routing column (no two rows alike), the first sweep's rows as 'skewed'."""
    out = tmp_path / "out"
    base = ["sweep", *("--model", "qwen3-30b-a3b", "--system", "hgx-h200"), "--analytic", "--workers", "0",
            "--no-plot", "--quiet", "--out", str(out)]
    assert main([*base, "--tokens-per-gpu", "8", "--placement", "contiguous,eplb"]) == 0
    assert main([*base, "--tokens-per-gpu", "8", "--placement", "contiguous,eplb", "--routing", "uniform"]) == 0
    capsys.readouterr()
    assert main(["sweep", "--best", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if "layer_time_us" in line and not line.startswith("best"))
    assert lines[at].split()[:2] == ["placement", "routing"]
    rows = [line.split()[:2][::-1] for line in lines[at + 1:]]
    assert sorted(map(tuple, rows)) == [("skewed", "contiguous"), ("skewed", "eplb"), ("uniform", "contiguous"),
                                        ("uniform", "eplb")]
