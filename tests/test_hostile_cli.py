"""Hostile and first-hour input at the command line: each is refused with one line naming the value
and what is allowed (exit code 2, no traceback), before any work; or gets what a user expects.

The table runs ``megamoe.cli.main`` in-process; every case is refused before a simulation, a sweep
or a kernel starts, so the whole table takes seconds. Paths in the table: DEEP (JSON nested 100,000
deep), DEEPSPEC (a SPEC naming DEEP as its model), BIN (random bytes), EMPTY (an empty file), DIR
(an empty folder), FILE (a text file), BADPQ (a folder whose results.parquet is not Parquet), DONE
(a folder holding two sweep rows), HUGE (a config of hidden size 1e18), HUGET (a bench row of
T = 1e8), OUT (a folder that does not exist yet).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from megamoe.cli import main


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


SMALL = ["--model", "qwen3-30b-a3b", "--system", "hgx-h200"]
BIG_GRID = ["--tokens-per-gpu", ",".join(map(str, range(1, 201))), "--seed", ",".join(map(str, range(100))),
            "--comm-sms", ",".join(map(str, range(1, 101)))]  # 2,000,000 points

CASES = [
    # deeply nested JSON where a model, a profile or a profile's assumptions are read
    (["simulate", "--model", "DEEP", "--analytic"], "--model 'DEEP': JSON nested too deeply"),
    (["simulate", "--system", "DEEP", "--analytic"], "--system 'DEEP': JSON nested too deeply"),
    (["info", "--assumptions", "DEEP"], "--assumptions 'DEEP': JSON nested too deeply"),
    (["sweep", "DEEPSPEC", "--dry-run"], "[grid] model = 'DEEP': JSON nested too deeply to read"),
    (["info", "--assumptions", ""], "--assumptions '': empty"),
    (["info", "--json"], "give --system NAME"),
    # files that are not what they should be
    (["simulate", "--model", "/dev/zero", "--analytic"], "--model '/dev/zero' is not a regular file"),
    (["sweep", "BIN", "--dry-run"], "SPEC 'BIN' is not a text file"),
    (["sweep", "EMPTY", "--dry-run"], "the SPEC is empty"),
    (["sweep", "--best", "BADPQ"], "results.parquet is not a readable Parquet file"),
    (["validate", "--report", "BIN"], "--report 'BIN' is not a text file"),
    (["validate", "--from-bench", "DIR"], "--from-bench 'DIR' is a folder"),
    (["validate", "--from-bench", "HUGET"], "T=100,000,000 tokens; a measured layer has at most 1,048,576"),
    (["validate", "--report", "DIR", "--out", "FILE"], "--out 'FILE' is a file; give a folder"),
    (["validate", "--report", "DIR", "--out", "FILE/x"], "cannot be made: 'FILE' is not a folder"),
    pytest.param(["validate", "--models", "mixtral-8x7b", "--tokens", "1", "--out", "DIR"],
                 "--out 'DIR' is a folder; give a file", marks=pytest.mark.skipif(
                     _cuda(), reason="with a GPU, validate's --out is the GPU run's folder")),
    # validate's options are checked on any machine, before it looks for a GPU
    (["validate", "--budget", "-5"], "--budget -5.0: must be a positive number"),
    (["validate", "--routings", "bogus"], "--routings 'bogus': give a comma-separated subset of"),
    (["validate", "--report", "DIR", "--from-bench", "FILE"], "give one of them"),
    # options that would be ignored or contradict each other
    (["simulate", "--schedule", "bulk", "--minibatch", "512", "--analytic"], "no effect under --schedule bulk"),
    (["simulate", "--slots", "1152", "--analytic"], "applies to the eplb placement only"),
    (["simulate", "--set", "link_bandwidth=1e11", "--link-bandwidth", "2e11", "--analytic"],
     "both set link.bandwidth_per_direction_bytes_per_s: give it once"),
    (["simulate", "--set", "nope.key=1", "--analytic"], "--set nope.key: not a profile key; give section.key"),
    (["sweep", "--schedule", "bulk", "--minibatch", "128,256", "--out", "OUT", "--dry-run"],
     "minibatch = 128 has no effect under schedule = bulk"),
    (["sweep", "--best", "DIR", "EMPTY"], "--best ranks the results already in 'DIR' and runs nothing: drop EMPTY"),
    (["sweep", "--best", "DIR", "--tokens-per-gpu", "8"], "drop --tokens-per-gpu"),
    (["sweep", "--best", "DONE", "--objective", "model"], "--objective 'model' is not a numeric column"),
    (["sweep", "--retry-failed", "--tokens-per-gpu", "8,16", "--out", "DIR"], "holds no results of an earlier run"),
    (["sweep", "--out", "OUT", "--dry-run"], "nothing to sweep: give a SPEC file or the grid as flags"),
    (["sweep", "--scheduler", "garbage", "--tokens-per-gpu", "8,16", "--out", "OUT"],
     "--scheduler 'garbage': give a Dask scheduler address"),
    # sizes: refused with what is allowed, before any work
    (["sweep", "--workers", "100000", "--tokens-per-gpu", "8,16", "--out", "OUT"],
     "--workers 100000: this machine has"),
    (["sweep", *BIG_GRID, "--out", "OUT", "--dry-run"], "the grid has 2,000,000 points"),
    (["sweep", "--slots", "100000008", "--placement", "eplb", "--tokens-per-gpu", "8,16", "--out", "OUT",
      "--dry-run"], "slots = 100,000,008: at most 18,432 for deepseek-v3 on 72 GPUs"),
    (["simulate", "--slots", "100000008", "--placement", "eplb", "--analytic"], "--slots 100,000,008: at most 18,432"),
    (["simulate", "--model", "HUGE", "--analytic"], "more than the 186 GB of HBM of a gb200-nvl72 GPU"),
    (["sweep", "--model", "HUGE", "--tokens-per-gpu", "8,16", "--out", "OUT", "--dry-run"],
     "weights need 6.14e+13 GB per GPU (4 of 256 experts on each of 72 GPUs and the shared expert)"),
    # numbers that name the wrong input or none
    (["simulate", "--sms", "1", "--analytic"], "--sms 1: a GPU needs at least 2 SMs"),
    (["simulate", "--sms", "4", "--analytic"], "--sms 4 leaves no SM for compute with gb200-nvl72's 40 communication"),
    (["simulate", "--routing", "zipf:nan", "--analytic"], "--routing zipf:nan: nan is not a finite number"),
    (["simulate", *SMALL, "--tokens-per-gpu", "8", "--trace", "/dev/full"], "--trace /dev/full: cannot write"),
]


@pytest.fixture
def paths(tmp_path):
    """The table's placeholders -> real paths under tmp_path."""
    from megamoe.reference import MoEConfig
    from megamoe.sweep.store import Store

    names = ("DEEPSPEC", "DEEP", "BIN", "EMPTY", "DIR", "FILE", "BADPQ", "DONE", "HUGE", "HUGET", "OUT")
    p = {k: tmp_path / k.lower() for k in names}
    p["DEEP"].write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    p["DEEPSPEC"].write_text(f'[grid]\nmodel = ["{p["DEEP"]}"]\nseed = [0, 1]\n')
    p["BIN"].write_bytes(bytes(range(256)) * 8)
    p["EMPTY"].write_text("")
    p["DIR"].mkdir()
    p["FILE"].write_text("x\n")
    p["BADPQ"].mkdir()
    (p["BADPQ"] / "results.parquet").write_text("not parquet")
    Store(p["DONE"]).append([{"point_id": "a", "model": "deepseek-v3", "layer_time_us": 1.0, "error": None},
                             {"point_id": "b", "model": "qwen3-30b-a3b", "layer_time_us": 2.0, "error": None}])
    d = MoEConfig.preset("deepseek-v3").to_dict()
    d["hidden_size"] = 10**18
    p["HUGE"].write_text(json.dumps(d))
    p["HUGET"].write_text(json.dumps({"preset": "qwen3-30b-a3b", "T": 10**8, "ours_us": 100.0}) + "\n")
    return {k: str(v) for k, v in p.items()}


def _id(case) -> str:
    return " ".join((case.values if hasattr(case, "values") else case)[0])[:60]


@pytest.mark.parametrize("argv,fragment", CASES, ids=[_id(c) for c in CASES])
def test_refused_in_one_line(argv, fragment, paths, capsys, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)

    def real(a):
        for k, v in paths.items():
            a = a.replace(k + "/", v + "/") if a.startswith(k + "/") else (v if a == k else a)
        return a

    argv = [real(a) for a in argv]
    for k, v in paths.items():
        fragment = fragment.replace(f"'{k}'", repr(v)).replace(f" {k}", f" {v}")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(f"megamoe {argv[0]}: ")
    assert fragment in err[0], err[0]


def test_report_skips_and_counts_bad_rows(tmp_path, capsys):
    """Negative, zero, NaN, absurd and string times and a cut line are skipped, counted and named by
    line; the statistics come from the good rows only."""
    base = {"preset": "qwen3-30b-a3b", "routing": "uniform", "backend": "multi", "predicted_us": 100.0}
    lines = [json.dumps({**base, "T": 64 + i, "measured_us": m})
             for i, m in enumerate([110.0, -5.0, 0, float("nan"), 1e308, "fast", 125.0])]
    lines.insert(2, '{"preset": "qwen3-30b-a3b", "T": 9')
    (tmp_path / "validation_x.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["validate", "--report", str(tmp_path), "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "skipped 1 corrupt line(s): " in err and "validation_x.jsonl:3: not a JSON object" in err
    assert "skipped 5 row(s) with unusable values" in err and "validation_x.jsonl:2: measured_us=-5.0" in err
    st = json.loads((tmp_path / "r" / "report.json").read_text())
    assert st["configurations"] == 2
    assert st["median_abs_error"] == pytest.approx((10 / 110 + 25 / 125) / 2)
    assert any("skipped 5 row(s)" in n for n in st["notes"])


def test_profile_json_round_trip(tmp_path, capsys):
    """The README's way to make a profile: ``info --system NAME --json > FILE`` loads back the same."""
    from megamoe.simulator.hardware import load_profile

    assert main(["info", "--system", "gb200-nvl72", "--json"]) == 0
    f = tmp_path / "my-rack.json"
    f.write_text(capsys.readouterr().out)
    assert load_profile(f).data == load_profile("gb200-nvl72").data


def test_simulate_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default deepseek-v3)" in out and "(default gb200-nvl72)" in out and "(default fused)" in out
    assert "megamoe info --system gb200-nvl72 --json > my-rack.json" in out


def test_numba_cache_goes_to_the_user_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["info", "--assumptions", ""]) == 2
    assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "megamoe" / "numba")


def test_compile_notice_only_when_numba_compiles(capsys):
    from numba import njit

    from megamoe.simulator.cli import compile_notice

    @njit(cache=False)
    def twice(x):
        return 2 * x

    with compile_notice():
        twice(1)
        twice(2.0)  # a second compile says nothing more
    assert capsys.readouterr().err.count("compiling the simulator's numba kernels once,") == 1
    with compile_notice():
        twice(3)  # compiled already
    assert capsys.readouterr().err == ""


def test_gpu_commands_say_what_a_cpu_can_run(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: bench runs")
    assert main(["bench"]) == 2
    err = capsys.readouterr().err
    assert "on a CPU: `megamoe simulate`" in err and "--from-bench" in err


def test_a_second_sweep_into_one_folder_is_refused(tmp_path):
    from megamoe.sweep import SweepError, run_sweep

    spec = {"fixed": {"model": "qwen3-30b-a3b", "system": "hgx-h200", "analytic": True}, "grid": {"seed": [0, 1]}}
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").write_text(str(os.getpid()))  # a live holder
    with pytest.raises(SweepError, match=rf"being written by another megamoe sweep \(pid {os.getpid()}\)"):
        run_sweep(spec, out, workers=0, progress=False, plot=False)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / ".lock").write_text(gone.stdout.strip())  # a holder that is gone: taken over
    assert run_sweep(spec, out, workers=0, progress=False, plot=False).attrs["counts"]["ran"] == 2
    assert not (out / ".lock").exists()


def test_interrupt_before_the_first_batch(tmp_path, capsys, monkeypatch):
    import megamoe.sweep.runner as runner

    def interrupted(spec, out, **kw):
        return {"total": 2, "skipped": 0, "ran": 0, "failed": 0, "interrupted": True}

    monkeypatch.setattr(runner, "execute", interrupted)
    argv = ["sweep", *SMALL, "--analytic", "--seed", "0,1", "--workers", "0", "--no-plot", "--out", str(tmp_path)]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "interrupted; 0 points saved" in err and "Traceback" not in err
