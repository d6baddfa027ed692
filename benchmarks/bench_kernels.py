"""Benchmark the fused MoE kernels on a GPU: ``python benchmarks/bench_kernels.py [--tune] ...``.

The same as ``megamoe bench``; see megamoe/kernels/bench.py for what is measured and written.
"""

from __future__ import annotations

import sys

from megamoe.kernels.bench import main

if __name__ == "__main__":
    sys.exit(main())
