"""How fast can one program per SM stream weights? The decode question, by the calibration's reader.

    python benchmarks/bench_stream.py --out DIR [--budget S]

At decode the megakernel runs one program per SM, and each streams its weight tiles through the
GEMM tiles' pipelined load + dot loop. The calibration's reader (megamoe.calibrate.microbench.stream_tile, the
same loop on K-contiguous weight rows against a 16-row A) reached 3.72 TB/s with 132 programs of
1 MiB each and 4.12 with 4 MiB (H200), against 4.48 with two programs per SM: about 31 GB/s
per program where HBM needs 34 from each of 132. This sweeps what a program keeps in flight
(pipeline stages x stage bytes: BLOCK_N x BLOCK_K weights) and programs per SM, from a cold L2,
to say whether deeper pipelines or a second program per SM would lift the decode layer's rate.
Rows (one per point: programs, bytes per program, BLOCK_N, BLOCK_K, stages, warps, seconds, TB/s)
go to DIR/stream.jsonl with GPU, versions, commit and date; a table is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

#: (BLOCK_N, BLOCK_K) weight tiles per pipeline stage: 16, 32 and 64 KiB of bf16
TILES = ((64, 128), (128, 128), (128, 256))
STAGES = (2, 3, 4, 6, 8)
#: shared memory a program may take (the H200's 227 KiB less a margin for the A tiles and Triton's own)
SMEM_BYTES = 200 << 10


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--budget", type=float, default=120.0, help="stop starting new points after this many seconds")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    import torch

    from megamoe.calibrate import flushed_seconds
    from megamoe.calibrate import microbench as mb
    from megamoe.kernels.bench import provenance

    if not torch.cuda.is_available():
        print("bench_stream: needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.time()
    S = torch.cuda.get_device_properties(0).multi_processor_count
    prov = provenance()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    w = torch.randn(((2 * S) * (4 << 20)) // 2, device="cuda", dtype=torch.bfloat16)
    print(f"{'programs':>8} {'KiB/prog':>8} {'BN':>4} {'BK':>4} {'stages':>6} {'TB/s':>6} {'GB/s/prog':>9}")
    with open(out / "stream.jsonl", "a") as f:
        for per in (1 << 20, 4 << 20):
            for bn, bk in TILES:
                for st in STAGES:
                    smem = st * (bn * bk + 16 * bk) * 2  # the stages' weight and A tiles, bf16
                    if smem > SMEM_BYTES:
                        continue
                    for P in (S, 2 * S):
                        if time.time() - t0 > args.budget:
                            print("# budget spent", flush=True)
                            return 0
                        if P > S and smem > SMEM_BYTES // 2:
                            continue  # two programs per SM would not fit
                        try:
                            t = flushed_seconds(lambda P=P, bn=bn, bk=bk, st=st, per=per: mb.stream_tile(
                                w, P, per, block_n=bn, block_k=bk, num_stages=st), reps=args.reps)
                        except Exception as exc:  # noqa: BLE001 - a shape that does not compile: say so, go on
                            print(f"# {P} x {per >> 10} KiB, {bn}x{bk}, {st} stages: {type(exc).__name__}: {exc}"[:300])
                            continue
                        rate = P * per / t
                        row = {"programs": P, "bytes_per_program": per, "BLOCK_N": bn, "BLOCK_K": bk,
                               "num_stages": st, "num_warps": 4, "seconds": t, "bytes_per_s": rate, **prov}
                        f.write(json.dumps(row) + "\n")
                        f.flush()
                        print(f"{P:>8} {per >> 10:>8} {bn:>4} {bk:>4} {st:>6} {rate / 1e12:>6.2f} {rate / P / 1e9:>9.1f}",
                              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
