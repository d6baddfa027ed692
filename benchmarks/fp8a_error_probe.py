"""Where the fp8a GEMMs' error against the FP8 reference comes from: h's codes, GEMM 1's sums or GEMM 2.

    python benchmarks/fp8a_error_probe.py --out DIR [--seeds 4] [--cases one_expert,odd] [--tiles m64,m128c]
        [--budget 40]
    python benchmarks/fp8a_error_probe.py --out DIR --cpu-smoke      (the Triton interpreter, float32, 1 seed)

Shape legend: T tokens, E = 5 experts, K = 2 top-k, H hidden, I expert width, P = T x K pairs.

Why: on the H200 (run 73) test_fp8a_tile_candidates_match_default_and_reference failed at one_expert for
m128 and m128c (max 1.82e-2 > 1.5e-2, rms 4.93e-3 > 5e-3); the test never checks the 64-row tiles against
the reference on the GPU (its "default" there is tma_entry(128) with no tile set named, hence
plan.FP8A_DEFAULT_TILES' 128-row tiles with PIPE 1 put back: not the 64-row ones). Here every tile set is
measured the same way: "m64" the 64-row tiles (fp8_plan.FP8A_NO_CANDIDATE, set explicitly), "m128" and "m128c"
the candidates of fp8_plan.FP8A_TILE_CANDIDATES (on the GPU from tma_entry(128), as the test; under the
interpreter from tma_entry(64, interpret=True), whose GEMM 2 keeps 16-column tiles at 64 rows).

Per (case, tiles, seed) row, both fp8a GEMMs on their own (x quantized once by the kernel, as the layer
does; outputs poisoned with NaN), against the float64 FP8 reference recomputed here step by step
(reference.fp8: x rounded to the kernel's dtype and quantized, h_pre = silu(gate) x up in float64, h
quantized from it, pair row = routing weight x dequantized h @ down^T):
    err_max, err_rms     the pair rows against the reference (reference.normalized_error, as assert_close:
                         max|d| / max|ref|, RMS(d) / RMS(ref)); limit_max, limit_rms the fp8_e4m3 ones; ok
    h_code_diff, h_code_diff_frac   h elements whose e4m3 code differs from the reference's quantized h
    h_code_steps_max     the largest such difference in e4m3 steps (codes apart, +0 = -0)
    h_value_diff         h elements whose dequantized value (code x scale) differs (scale-only changes too)
    h_scale_diff, h_scale_rel_max   h scales (one per row per 128 columns) that differ from the
                         reference's (an fp32 amax a bit off moves every value of its group a hair)
    gemm2_max, gemm2_rms the pair rows against a float64 GEMM 2 of the KERNEL's own h (dequantized codes):
                         GEMM 2's own error, the output's rounding included (bf16: ~1e-3 rms).
                         gemm2_rounded_*: against that reference rounded to the output dtype: what is left
                         is the accumulation (fp32-exact sums: a rare element on the other bf16 neighbour)
    codes_max, codes_rms that float64 GEMM 2 of the kernel's h against the reference: the error h's codes
                         alone cause (with gemm2_* small, about err_*)
    x_code_diff          x's e4m3 codes (the kernel's quantize_x) that differ from the reference's
    h_pre_steps_max      GEMM 1's check: max |kernel h (dequantized) - reference h before quantization|, in
                         e4m3 steps of the reference's scale. 0.5 is rounding alone; 0.5 + d means some
                         kernel accumulator was at least d steps from float64's. The kernel's pre-quantization
                         h is not kept, so this is its bound.
How to read it: (a) m64's err_* next to m128's and m128c's. (b) codes flipped by fp32 sum order: h_code_diff
small, h_code_steps_max 1, h_pre_steps_max 0.5 + a few 1e-5 (fp32 rounding of a 128-deep sum), gemm2_* small:
the error is in the codes, inherent. (c) the e4m3 wgmma's reduced-precision accumulation: h_pre_steps_max
well above 0.5 (d about 1e-3 and more: ~14-bit sums), more flips, and/or gemm2_rounded_* well above what
fp32 sums leave (the interpreter's rows: ~1e-7; in bf16 a rare rounding flip, rms ~1e-4 at most): a kernel
defect (max_num_imprecise_acc).

Seed s draws as tests/conftest.py's rng fixture with seed 20261129 + s (seed 0: the test's draws) and the
weights with seed 23 + s (the test's 23); x is rounded to the dtype before it goes to the device. Rows go
to DIR/rows.jsonl as they are made (provenance: kernels.bench.provenance, or the interpreter's), one line
each is printed; seed by seed, so that seed 0 of every case and tile set comes first. ``--budget`` seconds
from the start (default 40): no row started after it (said so). On the H200 about 11 kernels compile (GEMM 1:
3 K/band shapes x the 64- and 128-row tiles; GEMM 2: 3 tile sets) and 48 rows run by default.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

#: name -> (T, routing, H, I): tests/test_kernels_fp8a.py's TILE_CASES, the failing case first
CASES = {
    "one_expert": (133, "one", 208, 256),
    "odd": (21, "random", 208, 144),
    "aligned": (37, "random", 256, 256),
    "one_token": (1, "random", 208, 144),
}
TILES = ("m64", "m128", "m128c")
E, K = 5, 2
RNG_SEED, WEIGHT_SEED = 20261129, 23


def make_inputs(case: str, seed: int):
    """(cfg, x (T, H) float64, idx (T, K), tw (T, K), FP8 weights) of ``case`` at ``seed``."""
    from megamoe.reference import MoEConfig, random_weights

    T, routing, H, I = CASES[case]
    cfg = MoEConfig(hidden_size=H, intermediate_size=I, num_experts=E, top_k=K)
    rng = np.random.default_rng(RNG_SEED + seed)
    if routing == "one":  # every token on expert 3, then expert 1
        idx = np.tile(np.array([3, 1]), (T, 1))
    else:
        idx = np.stack([rng.permutation(E)[:K] for _ in range(T)])
    tw = rng.uniform(0.1, 1.0, (T, K))
    x = rng.standard_normal((T, H))
    return cfg, x, idx, tw, random_weights(cfg, seed=WEIGHT_SEED + seed, fp8=True)


def fp8a_entry(tiles: str, H: int, I: int, dev: str, dtype: str) -> dict:
    """The fp8a {"gemm1", "gemm2"} entry of tile set ``tiles`` (fp8_plan.fp8_entry with FP8Options(fp8a_tiles=tiles))."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.fp8_plan import FP8A_NO_CANDIDATE, FP8Options, fp8_entry

    base = cfgs.tma_entry(64, interpret=True) if dev == "cpu" else cfgs.tma_entry(128)
    entry = fp8_entry(base, "weights+act", dtype, depths=(H, I), options=FP8Options(fp8a_tiles=tiles))
    want_m = 64 if tiles == FP8A_NO_CANDIDATE else 128
    assert all(entry[g].get("FP8A") == 1 and entry[g]["BLOCK_M"] == want_m for g in entry), entry
    return entry


def run_gemms(xr, idx, tw, w8, cfg, entry: dict, dev: str, dtype: str, num_sms):
    """Both fp8a GEMMs (x quantized once): (x codes (T, H) uint8, h codes (P, I) uint8, h scales
    (P, ceil(I/128)), pairs (P, H) float64), h's rows put in pair order."""
    import torch

    from megamoe.kernels.fp8_gemm import launch_gemm1_fp8, launch_gemm2_fp8, launch_quantize_x
    from megamoe.kernels.moe import align_only
    from megamoe.kernels.plan import quantize_launch

    T, H, I = xr.shape[0], cfg.hidden_size, cfg.intermediate_size
    tdt = getattr(torch, dtype)
    wt = w8.to_torch(dev, tdt)
    meta = align_only(torch.from_numpy(idx).to(torch.int32).to(dev), E, entry["gemm1"]["BLOCK_M"])
    P_max, B_max = meta["padded_token"].shape[0], meta["block_expert"].shape[0]
    nan, e4m3 = float("nan"), torch.float8_e4m3fn
    act = torch.full((P_max, I), nan, device=dev, dtype=e4m3)
    act_s = torch.full((P_max, -(-I // 128)), nan, device=dev, dtype=torch.float32)
    pairs = torch.full((T * K, H), nan, device=dev, dtype=tdt)
    topk_w = torch.from_numpy(tw).to(dev).float()
    xt = torch.from_numpy(xr).to(dev).to(tdt)
    xq = torch.empty((T, H), device=dev, dtype=e4m3)
    xs = torch.empty((T, -(-H // 128)), device=dev, dtype=torch.float32)
    launch_quantize_x(xt, xq, xs, quantize_launch(T, H, interpret=dev == "cpu"))
    launch_gemm1_fp8(xt, wt.gate_up, wt.gate_up_scale_inv, None, act, act_s, meta, topk_w, entry["gemm1"],
                     activation="silu_gated", alpha=1.0, limit=1.0, scale_input=False, dense=False, num_m=B_max,
                     num_sms=num_sms, x_q=(xq, xs))
    launch_gemm2_fp8(act, act_s, wt.down, wt.down_scale_inv, None, pairs, meta, topk_w, entry["gemm2"], T=T, K=K,
                     KS=K, dense=False, atomic=False, num_m=B_max, num_sms=num_sms)
    n = int(meta["padded_offsets"][E])
    pair = meta["padded_pair"][:n].cpu().numpy()
    valid = pair >= 0
    order = np.argsort(pair[valid])
    assert np.array_equal(pair[valid][order], np.arange(T * K)), "the align lost or repeated a pair"
    codes = act.cpu()[:n][valid].view(torch.uint8).numpy()[order]
    scales = act_s.cpu()[:n][valid].double().numpy()[order]
    return xq.cpu().view(torch.uint8).numpy(), codes, scales, pairs.cpu().double().numpy()


def reference(xr, idx, tw, w, cfg):
    """The float64 FP8 layer's steps per pair: (h_pre (P, I), h codes, h scales, pair rows (P, H))."""
    from megamoe.reference import activation, fake_quantize_activations, quantize_activations
    from megamoe.reference.fp8 import dequantize_activations

    xq = fake_quantize_activations(xr)
    e_of, tok = idx.reshape(-1), np.arange(idx.size) // K
    h_pre = np.empty((idx.size, cfg.intermediate_size))
    for e in np.unique(e_of):
        sel = e_of == e
        h_pre[sel] = activation(xq[tok[sel]] @ w.gate_up[e].T, cfg)
    hq, hs = quantize_activations(h_pre)
    return h_pre, hq, hs.astype(np.float64), gemm2_f64(dequantize_activations(hq, hs), idx, tw, w)


def gemm2_f64(h, idx, tw, w):
    """Pair rows tw x h @ down^T in float64, h (P, I) in pair order."""
    e_of = idx.reshape(-1)
    y = np.empty((idx.size, w.down.shape[1]))
    for e in np.unique(e_of):
        sel = e_of == e
        y[sel] = h[sel] @ w.down[e].T
    return tw.reshape(-1, 1) * y


def e4m3_ordinal(codes):
    """e4m3 codes as their place on the number line, in steps from zero (+0 and -0 both 0)."""
    mag = (codes & 0x7F).astype(np.int64)
    return np.where(codes & 0x80, -mag, mag)


def e4m3_ulp(u):
    """The spacing of e4m3 values at |u| (u in units of the scale; the subnormals' 2^-9 below 2^-6)."""
    _, ex = np.frexp(np.maximum(np.abs(u), 2.0**-6))  # |u| = f 2^ex, f in [0.5, 1)
    return np.ldexp(1.0, ex - 1 - 3)


def probe_row(case: str, tiles: str, seed: int, dev: str, dtype: str, num_sms) -> dict:
    """One row (module docstring)."""
    from megamoe.reference import normalized_error, quantize_activations, round_to_dtype, tolerance_for
    from megamoe.reference.fp8 import ACT_GROUP, e4m3_decode

    cfg, x, idx, tw, w8 = make_inputs(case, seed)
    xr = round_to_dtype(x, dtype)
    w = w8.dequantize()
    entry = fp8a_entry(tiles, cfg.hidden_size, cfg.intermediate_size, dev, dtype)
    x_codes, codes, scales, pairs = run_gemms(xr, idx, tw, w8, cfg, entry, dev, dtype, num_sms)
    h_pre, hq, hs, y_ref = reference(xr, idx, tw, w, cfg)
    I = cfg.intermediate_size
    expand = lambda s: np.repeat(s, ACT_GROUP, axis=1)[:, :I]  # noqa: E731
    written = bool(np.isfinite(pairs).all() and np.isfinite(scales).all() and ((codes & 0x7F) != 0x7F).all())
    h_k = e4m3_decode(codes) * expand(scales)  # the kernel's h, dequantized
    s_ref = expand(hs)
    u_k, u_r, u_pre = h_k / s_ref, e4m3_decode(hq), h_pre / s_ref  # on the reference's scale
    code_steps = np.abs(e4m3_ordinal(codes) - e4m3_ordinal(hq))
    tw32 = tw.astype(np.float32).astype(np.float64)  # the kernel's routing weights
    y_own = gemm2_f64(h_k, idx, tw32, w)
    tmax, trms = tolerance_for("fp8_e4m3")
    err, g2 = normalized_error(pairs, y_ref), normalized_error(pairs, y_own)
    g2r, codes_err = normalized_error(pairs, round_to_dtype(y_own, dtype)), normalized_error(y_own, y_ref)
    T, _, H, _ = CASES[case]
    return {
        "case": case, "tiles": tiles, "seed": seed, "T": T, "H": H, "I": I, "dtype": dtype,
        "config": {g: {k: entry[g][k] for k in ("BLOCK_M", "BLOCK_N", "PIPE", "num_warps", "num_stages")}
                   for g in ("gemm1", "gemm2")},
        "written": written, "err_max": err.max_err, "err_rms": err.rms_err, "limit_max": tmax, "limit_rms": trms,
        "ok": err.within("fp8_e4m3"),
        "h_elems": int(h_k.size), "h_code_diff": int((code_steps > 0).sum()),
        "h_code_diff_frac": float((code_steps > 0).mean()), "h_code_steps_max": int(code_steps.max()),
        "h_value_diff": int((h_k != u_r * s_ref).sum()),
        "h_scales": int(hs.size), "h_scale_diff": int((scales != hs).sum()),
        "h_scale_rel_max": float(np.abs(scales / hs - 1.0).max()),
        "gemm2_max": g2.max_err, "gemm2_rms": g2.rms_err,
        "gemm2_rounded_max": g2r.max_err, "gemm2_rounded_rms": g2r.rms_err,
        "codes_max": codes_err.max_err, "codes_rms": codes_err.rms_err,
        "x_code_diff": int((x_codes != quantize_activations(xr)[0]).sum()),
        "h_pre_steps_max": float((np.abs(u_k - u_pre) / e4m3_ulp(u_pre)).max()),
    }


def fmt_row(r: dict) -> str:
    return (f"{r['case']:<10} {r['tiles']:<5} s{r['seed']}  err {r['err_max']:.3e} / {r['err_rms']:.3e}"
            f"{'' if r['ok'] else ' FAIL'}{'' if r['written'] else ' UNWRITTEN'}  h codes {r['h_code_diff']}/{r['h_elems']}"
            f" ({r['h_code_diff_frac']:.2%}, <= {r['h_code_steps_max']} steps; values {r['h_value_diff']}, scales"
            f" {r['h_scale_diff']}/{r['h_scales']} <= {r['h_scale_rel_max']:.1e})"
            f"  gemm2 {r['gemm2_max']:.2e} / {r['gemm2_rms']:.2e} (rounded {r['gemm2_rounded_max']:.2e} / "
            f"{r['gemm2_rounded_rms']:.2e})  codes {r['codes_max']:.3e} / {r['codes_rms']:.3e}"
            f"  x codes {r['x_code_diff']}  h-pre <= {r['h_pre_steps_max']:.6f} steps")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for rows.jsonl")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..S-1 (default 4; 1 with --cpu-smoke)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--tiles", default=",".join(TILES), help=f"comma-separated, of {', '.join(TILES)}")
    p.add_argument("--cpu-smoke", action="store_true", help="the Triton interpreter on the CPU, float32")
    p.add_argument("--budget", type=float, default=40.0, help="start no row after this many seconds")
    args = p.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    args.tiles = [t for t in args.tiles.split(",") if t]
    bad = [c for c in args.cases if c not in CASES] + [t for t in args.tiles if t not in TILES]
    if bad or not args.cases or not args.tiles:
        p.error(f"unknown or no case(s) / tile set(s) {bad}; cases: {', '.join(CASES)}; tiles: {', '.join(TILES)}")
    if args.seeds is None:
        args.seeds = 1 if args.cpu_smoke else 4
    if args.seeds < 1:
        p.error("--seeds wants a positive count")
    return args


def _provenance(dev: str) -> dict:
    import torch
    import triton

    from megamoe.kernels import bench as kb

    if dev == "cuda":
        return kb.provenance()
    import datetime as dt

    return {"gpu": "cpu-interpreter", "torch": torch.__version__, "triton": triton.__version__, **kb.git_state(),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu_smoke:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("--cpu-smoke needs TRITON_INTERPRET=1 before triton is imported", file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (below, by the kernels)
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("fp8a_error_probe needs a CUDA GPU (or --cpu-smoke)", file=sys.stderr)
        return 2
    dev, dtype, num_sms = ("cpu", "float32", 3) if args.cpu_smoke else ("cuda", "bfloat16", None)
    t0 = time.time()
    path = Path(args.out) / "rows.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    prov = _provenance(dev)
    print(f"# {prov}", flush=True)
    print("# case tiles seed  err max / rms vs the FP8 reference  h codes differing  gemm2 vs own h  "
          "codes (own-h GEMM 2 vs reference)  GEMM 1: kernel h vs h before quantization", flush=True)
    n = 0
    for seed in range(args.seeds):  # seed 0 of every case and tile set first (and every compile)
        for case in args.cases:
            for tiles in args.tiles:
                if time.time() - t0 > args.budget:
                    print(f"# budget spent: skipping {case} {tiles} seed {seed}", flush=True)
                    continue
                try:
                    r = probe_row(case, tiles, seed, dev, dtype, num_sms)
                except Exception as exc:  # noqa: BLE001 - one failed row must not lose the others
                    print(f"# {case} {tiles} seed {seed} failed: {type(exc).__name__}: {str(exc)[:500]}", flush=True)
                    continue
                r.update(prov, wall_s=round(time.time() - t0, 1))
                with path.open("a") as fh:
                    fh.write(json.dumps(r) + "\n")
                n += 1
                print(fmt_row(r), flush=True)
    print(f"# {n} rows in {path}, {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
