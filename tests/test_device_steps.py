"""benchmarks/device.sh run as steps (one device call as named steps) on this machine: each step under its
own limit, its output in its folder, everything packed after every step, steps past the total
budget not started; and benchmarks/bench_stream.py's refusal without a GPU."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device.sh"


def test_steps_run_under_their_limits_and_are_packed(tmp_path):
    steps = tmp_path / "steps.txt"
    steps.write_text("# a comment\n"
                     "ok 10 echo made > $W/file.txt; echo printed\n"
                     "\n"
                     "slow 1 sleep 5\n"
                     "late 60 echo never\n")
    out, root = tmp_path / "out", tmp_path / "root"
    r = subprocess.run(["bash", str(SCRIPT), str(out), str(steps), "25"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "STEPS_ROOT": str(root)}, timeout=60)
    assert r.returncode == 0, r.stderr
    log = (root / "driver.log").read_text()
    assert "ok: exit 0" in log and "slow: exit 124" in log  # timeout's code for a step cut at its limit
    assert "late:" in log and "not started" in log and not (root / "late").exists()
    with tarfile.open(out / "all.tgz") as t:
        names = set(t.getnames())
    assert {"./ok/file.txt", "./ok/log.txt", "./slow/log.txt", "./driver.log", "./steps.txt"} <= names
    assert (root / "ok" / "log.txt").read_text() == "printed\n"


def test_bench_stream_says_it_needs_a_gpu(capsys):
    """benchmarks/bench_stream.py without CUDA: exit 2 and a line saying why, nothing written."""
    import torch
    from benchload import load_benchmark

    if torch.cuda.is_available():
        import pytest

        pytest.skip("a GPU is here: the benchmark would run")
    mod = load_benchmark("bench_stream")
    assert mod.main(["--out", "/nonexistent/never-made"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not Path("/nonexistent/never-made").exists()
    # every point the sweep would time fits the shared memory it budgets for one program
    assert all(min(mod.STAGES) * (bn * bk + 16 * bk) * 2 <= mod.SMEM_BYTES for bn, bk in mod.TILES)
