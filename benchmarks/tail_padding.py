"""Padding and program balance of the persistent grouped GEMMs with and without tail tiles (config
TAIL_M, kernels/grouped_gemm.py), for near-uniform prefill routing. No GPU, no Triton.

    python benchmarks/tail_padding.py [--presets qwen3-30b-a3b,deepseek-v3,mixtral-8x7b]
        [--tokens 512,4096,16384] [--block-m 128] [--tail-m 64] [--seeds 20] [--sms 132]

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, P programs (one per SM).

Per (preset, T), averaged over ``--seeds`` routings whose per-expert pair counts are independent
Binomial(T*K, 1/E) draws:
    pad_bm     MMA rows padded to BLOCK_M over the pairs: sum ceil(c / BM) BM / sum c - 1
    pad_tail   the same with tail tiles: BM rows a tile, TM for an expert's last <= TM rows
    saved      MMA rows the tail tiles save: 1 - tail rows / BM rows
Program balance of the walk (static: program p runs tiles p, p + P, ... of the grouped order,
GROUP_M 8, the tma128 candidate's BLOCK_N: GEMM 1 over I in 128-column tiles, GEMM 2 over H in
256-column tiles), a tile's time taken as its rows (BM 2 units, TM 1), as the busiest program over
the no-tail walk's busiest (``bm``): ``expert`` the tail walk in expert order (TAIL_LAST 0), ``last``
tail tiles last (TAIL_LAST 1), ``skip`` the walk over TAIL_M blocks skipping the odd ones of each
expert (not built: grouped_gemm.py's docstring says why), ``mean`` the tail walk's mean program.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

GROUP_M = 8
BLOCK_N = {"gemm1": 128, "gemm2": 256}


def tile_ids(t, num_m: int, num_n: int, group_m: int = GROUP_M):
    """grouped_gemm._tile_ids for arrays: (row tile, N tile) of walk index t."""
    width = group_m * num_n
    first = t // width * group_m
    size = np.minimum(num_m - first, group_m)
    return first + (t % width) % size, (t % width) // size


def program_load(units, num_n: int, programs: int) -> np.ndarray:
    """(P,) work of each program walking row tiles of ``units`` work each (walk order) x num_n N tiles."""
    t = np.arange(len(units) * num_n)
    pid_m, _ = tile_ids(t, len(units), num_n)
    return np.bincount(t % programs, weights=np.asarray(units, dtype=np.float64)[pid_m], minlength=programs)


def walks(counts, bm: int, tm: int) -> dict:
    """Per-tile work (rows / tm) of each walk over experts with ``counts`` pairs, in walk order."""
    expert, tail, none = [], [], []
    for c in counts:
        n = -(-int(c) // bm)
        for j in range(n):
            expert.append(1.0 if j == n - 1 and c - j * bm <= tm else bm / tm)
            none.append(bm / tm)
    tail = sorted(expert, reverse=True)  # TAIL_LAST: BLOCK_M tiles first (each kind in expert order)
    skip = []
    for c in counts:
        blocks = -(-int(c) // tm)
        for b in range(blocks):
            skip.append(0.0 if b % 2 else (bm / tm if b + 1 < blocks else 1.0))
    return {"bm": none, "expert": expert, "last": tail, "skip": skip}


def row(E: int, K: int, H: int, I: int, T: int, *, bm: int, tm: int, seeds: int, programs: int) -> dict:
    out = {k: 0.0 for k in ("pad_bm", "pad_tail", "saved")}
    bal = {g: {k: 0.0 for k in ("expert", "last", "skip", "mean")} for g in BLOCK_N}
    for s in range(seeds):
        c = np.random.default_rng(s).binomial(T * K, 1.0 / E, size=E)
        tiles = -(-c // bm)
        tails = (tiles > 0) & (c - (tiles - 1) * bm <= tm)
        rows_bm = int(tiles.sum()) * bm
        rows_tail = rows_bm - int(tails.sum()) * (bm - tm)
        out["pad_bm"] += rows_bm / c.sum() - 1
        out["pad_tail"] += rows_tail / c.sum() - 1
        out["saved"] += 1 - rows_tail / rows_bm
        w = walks(c, bm, tm)
        for g, N in (("gemm1", I), ("gemm2", H)):
            nn = -(-N // BLOCK_N[g])
            ref = program_load(w["bm"], nn, programs).max()
            for k in ("expert", "last", "skip"):
                bal[g][k] += program_load(w[k], nn, programs).max() / ref
            bal[g]["mean"] += program_load(w["expert"], nn, programs).mean() / ref
    return {"T": T, **{k: v / seeds for k, v in out.items()},
            **{f"{g}.{k}": v / seeds for g in bal for k, v in bal[g].items()}}


def main(argv=None) -> int:
    from megamoe.reference import MoEConfig

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="qwen3-30b-a3b,deepseek-v3,mixtral-8x7b")
    p.add_argument("--tokens", default="512,4096,16384")
    p.add_argument("--block-m", type=int, default=128)
    p.add_argument("--tail-m", type=int, default=64)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--sms", type=int, default=132)
    a = p.parse_args(argv)
    print("preset T: pad_bm pad_tail saved | busiest program / no-tail walk's, GEMM 1 and GEMM 2: "
          "expert-order last skip (mean)")
    for name in a.presets.split(","):
        cfg = MoEConfig.preset(name)
        for T in (int(t) for t in a.tokens.split(",")):
            r = row(cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size, T, bm=a.block_m,
                    tm=a.tail_m, seeds=a.seeds, programs=a.sms)
            bal = " | ".join(f"{r[g + '.expert']:.3f} {r[g + '.last']:.3f} {r[g + '.skip']:.3f} ({r[g + '.mean']:.3f})"
                             for g in BLOCK_N)
            print(f"{name} T={T}: {r['pad_bm']:.1%} {r['pad_tail']:.1%} {r['saved']:.1%} | {bal}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
