"""The scripts of benchmarks/ as modules in the tests (they are scripts, not a package)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module: benchmarks/ on sys.path while it loads (the scripts import
    each other by name), the environment as it was (compile_report.py drops TRITON_INTERPRET on
    import, which this test run and the processes it starts must keep)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    saved = dict(os.environ)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
        os.environ.clear()
        os.environ.update(saved)
    return mod
