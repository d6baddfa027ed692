"""``megamoe tune``: time the launch-config candidates on this GPU against the cost model's choice.

Shape legend: T tokens.

Per (preset, T): the model's entry (the GPU's model table's, which the kernels take without a tuned
file; with ``--profile``, ``megamoe.choose`` on that profile) and every candidate are timed
(``kernels.tune``); the tuned JSON keeps an entry only where the best candidate beats the model's by
2% or more and matches the float64 reference (the layer run with it, 16 sampled tokens). Each
(preset, T) appends one JSON line to ``--out`` as it finishes (preset, T, the model's entry, its
predicted and measured us, the best entry and its us, their ratio, kept, both entries' numerics), so a
run cut short keeps what it measured and ``--resume`` goes on from there.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

#: the presets ``megamoe tune`` times by default
TUNE_PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3")
TUNE_TOKENS = (1, 8, 64, 512, 4096, 16384)


class TuneError(ValueError):
    """A bad ``megamoe tune`` input; the message names it."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--presets", default=",".join(TUNE_PRESETS), help=f"comma-separated presets (default "
                   f"{','.join(TUNE_PRESETS)})")
    p.add_argument("--tokens", default=",".join(map(str, TUNE_TOKENS)), help="comma-separated T (one per bucket)")
    p.add_argument("--profile", default=None, help="price the model's choice on this profile (name or calibrated "
                   "JSON) instead of taking it from this GPU's model table (kernels/configs/model)")
    p.add_argument("--budget", type=float, default=900.0, metavar="SECONDS",
                   help="no (preset, T) starts, and none is finished, past this many seconds (default 900)")
    p.add_argument("--out", default=None, help="comparison JSONL (default tune_<gpu>_<date>.jsonl here)")
    p.add_argument("--resume", action="store_true", help="skip the (preset, T) --out already has")


def parse(args: argparse.Namespace) -> tuple[list[str], list[int]]:
    """(presets, tokens) of the arguments, each checked (TuneError naming a bad one)."""
    from megamoe.reference import PRESETS

    presets = [s.strip() for s in args.presets.split(",") if s.strip()]
    bad = [s for s in presets if s not in PRESETS]
    if bad or not presets:
        raise TuneError(f"unknown preset(s) {bad or presets}; presets: {', '.join(PRESETS)}")
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    except ValueError:
        raise TuneError(f"--tokens must be comma-separated integers, got {args.tokens!r}") from None
    if not tokens or min(tokens) < 1:
        raise TuneError(f"--tokens must list token counts >= 1, got {args.tokens!r}")
    if args.budget <= 0:
        raise TuneError(f"--budget must be > 0 seconds, got {args.budget}")
    if args.profile is not None:
        from .tune_tables import load

        load(args.profile)  # a bad --profile is named before any GPU work
    return presets, tokens


def model_entries(profile, gpu: str, log=print):
    """model(name, T) -> (the model's entry for preset ``name`` at T, its predicted us of the
    stages the tuner times): with ``profile``, the cost model's choice on it; without, the entry
    the kernels take on ``gpu`` without a tuned file (its model table's, with the table's
    prediction; the heuristic, unpredicted, where the GPU has no table)."""
    from megamoe.kernels import configs as cfgs
    from megamoe.reference import MoEConfig

    from .choose import choose

    def model(name: str, T: int):
        cfg = MoEConfig.preset(name)
        if profile is not None:
            c = choose(cfg, T, profile, megakernel=False)
            log(f"{name} T={T}: the model's entry on {c.profile}: GEMMs {c.gemm_us:.1f} us predicted "
                f"(the layer {c.predicted_us:.1f} us)")
            return c.entry, round(c.gemm_us, 2)
        shape = (cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k)
        entry = cfgs.untuned_config(*shape, T, gpu=gpu)
        pred = cfgs.model_prediction(*shape, T, gpu=gpu)
        log(f"{name} T={T}: the model's entry from the {'model table' if pred else 'heuristic (no model table)'}"
            + (f": GEMMs {pred['gemms']:.1f} us predicted" if pred and "gemms" in pred else ""))
        return entry, (pred or {}).get("gemms")

    return model


def numerics_check(sample: int = 16, seed: int = 0):
    """check(name, cfg, weights, T, entry) -> {"ok", "max_err", "rms_err"}: the multi-launch layer
    run with ``entry`` on random x (T, H) in the weights' dtype and device (the same x for every
    entry of a (preset, T)), against the float64 reference on ``sample`` tokens
    (``megamoe.numerics.check_numerics``; the reference computed once per (preset, T))."""
    refs = {}

    def check(name, cfg, w, T: int, entry: dict) -> dict:
        import torch

        from megamoe.kernels import moe

        from .numerics import check_numerics, sampled_reference

        dev, dt = w.router_weight.device, w.router_weight.dtype
        gen = torch.Generator(device=dev).manual_seed(seed + T)
        x = torch.randn(T, cfg.hidden_size, device=dev, dtype=dt, generator=gen)
        if (name, T) not in refs:
            refs.clear()  # one (preset, T) at a time
            refs[name, T] = sampled_reference(x, w, cfg, sample=sample, seed=seed)
        y = moe._forward(x, w, cfg, True, plan=moe.static_plan_for(cfg, T, x.dtype, x.device, gemm=entry))
        rep = check_numerics(x, y, w, cfg, dtype=str(dt).removeprefix("torch."), sample=sample, seed=seed,
                             reference=refs[name, T])
        return {"ok": bool(rep.ok), "max_err": float(rep.error.max_err), "rms_err": float(rep.error.rms_err)}

    return check


def done_rows(out: Path) -> set[tuple[str, int]]:
    """(preset, T) of the rows ``out`` holds (a --resume skips them)."""
    if not out.exists():
        return set()
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {(r["preset"], int(r["T"])) for r in rows}


def run_tune(presets, tokens, profile, out: Path, *, budget_s: float, gpu: str, resume: bool = False, log=print,
             provenance: dict | None = None, **tune_kw) -> Path:
    """Tune ``presets`` x ``tokens`` on ``gpu`` against the model's entries (``model_entries``:
    priced on ``profile``, or with None the GPU's model table); rows appended to ``out``;
    ``provenance``: fields every row carries (kernels.provenance's: versions, commit, date);
    ``tune_kw``: kernels.tune.tune's (timers, triton_version, path: tests' fakes). -> the tuned file."""
    from megamoe.kernels.tune import tune

    from .tune_tables import load

    prof = load(profile) if profile is not None else None
    done = done_rows(out) if resume else set()
    out.parent.mkdir(parents=True, exist_ok=True)
    date = dt.date.today().isoformat()

    def on_row(row: dict) -> None:
        with out.open("a") as f:
            f.write(json.dumps({**row, "profile": prof.name if prof else "model table", "date": date,
                                **(provenance or {})}, sort_keys=True) + "\n")

    return tune(presets, tokens, log=log, budget_s=budget_s, model_entries=model_entries(prof, gpu, log),
                on_row=on_row, skip=lambda name, T: (name, T) in done, gpu=gpu, **tune_kw)


def run(args: argparse.Namespace) -> int:
    from megamoe.kernels import configs as cfgs

    try:
        presets, tokens = parse(args)
        import torch

        if not torch.cuda.is_available():
            print("megamoe tune: error: no CUDA GPU: tune times kernels on this GPU; `megamoe configure` writes "
                  "the model's tables without one", file=sys.stderr)
            return 2
        gpu = torch.cuda.get_device_name(0)
        if args.profile is None and cfgs.family_of(gpu) is None:
            print(f"megamoe tune: {gpu!r} has no model table ({cfgs.MODEL_DIR / 'families.json'}): the candidates are "
                  "timed against the heuristic; --profile PROFILE prices the model's choice instead")
        out = Path(args.out or f"tune_{cfgs.slug(gpu)}_{dt.date.today().isoformat()}.jsonl")
        from megamoe.kernels.provenance import provenance

        path = run_tune(presets, tokens, args.profile, out, budget_s=args.budget, gpu=gpu, resume=args.resume,
                        log=lambda line: print(line, flush=True), provenance=provenance(), check=numerics_check())
    except ValueError as exc:
        if not type(exc).__module__.startswith("megamoe."):
            raise
        print(f"megamoe tune: error: {exc}", file=sys.stderr)
        return 2
    print(f"comparison rows: {out}; tuned entries: {path if path.exists() else 'none (the model stands)'}")
    return 0
