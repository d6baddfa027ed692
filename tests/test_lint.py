"""The code passes the project's lint configuration (ruff, settings in pyproject.toml)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    if importlib.util.find_spec("ruff") is None:  # what runs is `python -m ruff`, not a ruff on PATH
        pytest.skip("ruff not installed in this interpreter (it comes with the test extra)")
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "megamoe", "reference", "simulator", "kernels",
         "tests", "benchmarks"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
