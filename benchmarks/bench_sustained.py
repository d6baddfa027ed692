"""Does a dense GEMM's rate hold over a long CUDA graph? The rate by duration, for issue 8.

    python benchmarks/bench_sustained.py [--out DIR] [--size 8192] [--counts 1,4,16,64,192] [--pause 2]

The validation measures the layer in CUDA graphs of several calls (DeepSeek-V3 T = 16384: ~190 ms a
graph), where its prefill GEMMs ran 13-25% slower than the same kernels eager (on an H200), while the calibrated MMA rates come from
short launches. If the SM clock falls under sustained load (power or heat), a GEMM's rate depends on
how long it has been running. This times graphs of N back-to-back bf16 matmuls (size^3 each; cuBLAS,
so the figure is the hardware's, not our kernels'), each graph replayed after a pause that lets the
clocks recover, and records per N: seconds, TFLOP/s, and the SM clock NVML reports right after the
replay (torch.cuda.clock_rate, MHz; None where NVML is missing). Rows go to DIR/sustained.jsonl with
GPU, versions, commit and date; a table is printed. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for sustained.jsonl")
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--counts", default="1,4,16,64,192", help="matmuls per graph")
    p.add_argument("--pause", type=float, default=2.0, help="seconds idle before each replay")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_sustained: needs a CUDA GPU", file=sys.stderr)
        return 2
    from megamoe.kernels.bench import provenance

    prov = provenance()
    print(f"# {prov}")
    out = Path(args.out) / "sustained.jsonl" if args.out else None
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
    n = args.size
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * n ** 3

    def clock():
        try:
            return int(torch.cuda.clock_rate())
        except Exception:  # NVML missing or refused: the rate stands alone
            return None

    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    for count in (int(x) for x in args.counts.split(",")):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.matmul(a, b, out=c)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(count):
                torch.matmul(a, b, out=c)
        secs, clocks = [], []
        for _ in range(args.reps):
            torch.cuda.synchronize()
            time.sleep(args.pause)
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            g.replay()
            t1.record()
            t1.synchronize()
            clocks.append(clock())
            secs.append(t0.elapsed_time(t1) / 1e3)
        med = sorted(secs)[len(secs) // 2]
        row = {"size": n, "matmuls": count, "seconds": med, "seconds_all": secs,
               "tflops": count * flops / med / 1e12, "sm_clock_mhz_after": clocks, "pause_s": args.pause, **prov}
        print(f"{count:4d} matmuls of {n}^3: {med * 1e3:9.2f} ms  {row['tflops']:7.1f} TFLOP/s  "
              f"SM clock after {clocks} MHz", flush=True)
        if out:
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
