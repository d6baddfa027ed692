"""benchmarks/results_index.py: the index's provenance read from rows, and the generated files kept current."""

from __future__ import annotations

import json

import pytest
from benchload import load_benchmark


@pytest.fixture
def ri(tmp_path, monkeypatch):
    """The tool pointed at a results tree of its own under tmp_path."""
    mod = load_benchmark("results_index")
    monkeypatch.setattr(mod, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(mod, "INDEX", tmp_path / "results" / "index.jsonl")
    return mod


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_provenance_from_the_rows(ri):
    """The most common value of each field; CUDA from torch's +cuXYZ suffix; a 40-hex commit shortened,
    its suffix kept; CPU rows name their machine and versions."""
    gpu = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "date": "2026-12-03T02:10:37+00:00"}
    rows = [{**gpu, "commit": "5744155" + "0" * 33}, {**gpu, "commit": "5744155" + "0" * 33}, {**gpu, "commit": "abc"}]
    p = ri.provenance(rows)
    assert p == {"device": "NVIDIA H200", "commit": "5744155", "date": "2026-12-03",
                 "versions": {"torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0"}}
    assert ri.provenance([{**gpu, "commit": "bd5693b+final"}])["commit"] == "bd5693b+final"
    dirty = ri.provenance([{**gpu, "commit": "bd5693b", "dirty": True}] * 2 + [{**gpu, "commit": "bd5693b", "dirty": False}])
    assert dirty["commit"] == "bd5693b" and dirty["dirty"] is True
    assert ri.commit_text({"commit": "bd5693b", "dirty": True}) == "bd5693b with uncommitted changes"
    assert ri.commit_text({"commit": "5744155"}) == "5744155" and ri.commit_text({"commit": None}) == "-"
    cpu = ri.provenance([{"machine": {"cpu": "Xeon", "cores": 2}, "versions": {"python": "3.11.7", "numba": "0.68.1"},
                          "git_commit": "1c9e6cbb4f", "date": "2026-12-01T08:47:08+00:00"}])
    assert cpu == {"device": "Xeon", "commit": "1c9e6cb", "date": "2026-12-01",
                   "versions": {"python": "3.11.7", "numba": "0.68.1"}}
    sync = ri.provenance([{"provenance": {**gpu, "commit": "95f0370", "date": "2026-12-01"}, "sync": {}}])
    assert sync["device"] == "NVIDIA H200" and sync["commit"] == "95f0370"


def test_index_lines_per_result_and_kept_fields(ri, tmp_path):
    """One line per data file, a folder with a report.md as one result (its rows file counted), and a
    field the rows lack kept from the index as it was; a folder no question names is refused."""
    res = ri.RESULTS
    row = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "commit": "5744155", "date": "2026-12-03"}
    _write(res / "h200" / "validation" / "validation_2026-12-03.jsonl", [row, row])
    (res / "h200" / "validation" / "report.md").write_text("# report\n")
    (res / "h200" / "validation" / "profile.json").write_text("{}")
    _write(res / "h200" / "prefill" / "prefill_a.jsonl", [row])
    (res / "h200" / "prefill" / "prefill_a.log").write_text("log\n")
    _write(res / "gb200-nvl72" / "scenarios" / "s.jsonl", [{"git_commit": "36a35d6904", "layer_us": 1.0}])
    old = {"gb200-nvl72/scenarios/s.jsonl": {"date": "2026-12-01", "device": "predicted"}}
    index = ri.build_index(old)
    assert [(e["gpu"], e["question"], e["path"], e["rows"]) for e in index] == [
        ("gb200-nvl72", "scenarios", "gb200-nvl72/scenarios/s.jsonl", 1),
        ("h200", "prefill", "h200/prefill/prefill_a.jsonl", 1),
        ("h200", "validation", "h200/validation", 2)]
    assert index[0]["date"] == "2026-12-01" and index[0]["device"] == "predicted" and index[0]["commit"] == "36a35d6"
    assert index[2]["versions"]["cuda"] == "13.0" and index[2]["tool"] == ri.QUESTIONS["validation"][1]
    (res / "h200" / "nonsense").mkdir()
    with pytest.raises(SystemExit, match="not a question"):
        ri.build_index()


def test_tune_rows_index_with_their_provenance(ri, tmp_path):
    """A ``megamoe tune`` comparison file stored as results/<gpu>/tune/ is one index line whose device,
    versions, commit and date come from the provenance every row carries (kernels.provenance's fields)."""
    from megamoe.tune import run_tune

    def timers(name, cfg, T):  # every candidate 10 us: nothing beats the model's entry by 2%
        return lambda gemm, c: 10.0

    prov = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "triton": "3.6.0", "commit": "5744155" + "0" * 33,
            "dirty": False, "diff_sha256": None, "date": "2026-12-07T12:00:00+00:00"}
    out = ri.RESULTS / "h100" / "tune" / "tune_2026-12-07.jsonl"
    run_tune(["qwen3-30b-a3b"], [1], "h100", out, budget_s=600, log=lambda line: None, timers=timers,
             gpu=prov["gpu"], triton_version="0", path=tmp_path / "tuned.json", provenance=prov)
    (line,) = ri.build_index()
    assert {k: line[k] for k in ("gpu", "device", "commit", "date", "question", "path", "rows")} == {
        "gpu": "h100", "device": "NVIDIA H100 80GB HBM3", "commit": "5744155", "date": "2026-12-07",
        "question": "tune", "path": "h100/tune/tune_2026-12-07.jsonl", "rows": 1}
    assert line["versions"] == {"torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0"}
    assert line["tool"].startswith("megamoe tune")


def test_readme_markers_are_required(ri):
    with pytest.raises(SystemExit, match="markers"):
        ri.fill_readme("# no markers here\n", [])


def test_the_generated_files_are_current():
    """README's tables, docs/results.md and index.jsonl are what the tool makes of the stored results
    (after adding a result: python benchmarks/results_index.py)."""
    assert load_benchmark("results_index").main(["--check"]) == 0
