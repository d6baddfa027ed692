"""``megamoe validate``: run the real kernel and the simulator on the same launch plan, and compare.

Three runs: on a GPU, the grid predicted then measured (``megamoe.measure``); ``--report`` (with
``--repredict``), the report from stored rows (``megamoe.report``); without a GPU or with
``--numerics``, per (model, T) numerics and the launch plan's prediction (``megamoe.layer_check``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .grid import BACKENDS, GRID_PRESETS, GRID_TOKENS, ROUTINGS
from .layer_check import format_row, predict_bench_row, validate_one
from .layers import has_cuda as _has_cuda
from .measure import COMPARE_PROFILES, CONFIG_TIMEOUT_S, measure_grid
from .report import borrow_counts, load_outcomes, write_report

DEFAULT_MODELS = "qwen3-30b-a3b,mixtral-8x7b,deepseek-v3"
DEFAULT_TOKENS = "1,64,512,4096"


def _fail(message: str) -> int:
    """Print ``megamoe validate: message`` on stderr; the exit code 2."""
    print(f"megamoe validate: {message}", file=sys.stderr)
    return 2


def _append_jsonl(out: Path, row: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")


GPU_RUN_HELP = f"""\
The GPU run (a CUDA GPU and no --numerics): every configuration preset x T x routing x backend,
each predicted (row written) before it is measured (row written again), into
DIR/validation_<date>.jsonl, then DIR/report.md, report.json and scatter.png.

Default configuration set: presets {GRID_PRESETS} x T {','.join(map(str, GRID_TOKENS))}
x routings {','.join(ROUTINGS)} x backends {','.join(BACKENDS)} = 108 configurations, T-major (all
presets at T=1, then T=8, ...), so a budget that runs out still leaves every preset measured at the
smaller T.

--budget S: no configuration starts unless its estimate ends 15 s before S (the report's share);
the compile-ahead (--warm, on by default) takes at most half of S. A configuration that raises is a
row with phase "failed" and its error; one that hangs is ended by the watchdog (--config-timeout,
exit code 4); a lost CUDA context ends the run (exit code 3). Either way the report is written,
and --resume in the same --out goes on with what is left in a fresh process.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = GPU_RUN_HELP
    parser.add_argument("--models", default=None, help=f"comma-separated presets (default: GPU run {GRID_PRESETS}; "
                        f"CPU or --numerics {DEFAULT_MODELS})")
    parser.add_argument("--tokens", default=None, help="comma-separated T (default: GPU run "
                        f"{','.join(map(str, GRID_TOKENS))}; CPU or --numerics {DEFAULT_TOKENS}, without a GPU capped at 64)")
    parser.add_argument("--routings", default=",".join(ROUTINGS), help=f"GPU run: routings (default {','.join(ROUTINGS)})")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"GPU run: backends (default {','.join(BACKENDS)})")
    parser.add_argument("--profile", default=None, help="calibrated profile JSON (megamoe calibrate); overrides --system "
                        "as the profile whose predictions the report judges")
    parser.add_argument("--compare-profiles", default=COMPARE_PROFILES, help="GPU run: comma-separated profiles that "
                        f"also predict every configuration, recorded beside it (default {COMPARE_PROFILES}; '' for none)")
    parser.add_argument("--stages", action=argparse.BooleanOptionalAction, default=True,
                        help="GPU run: also time the multi-launch path's stages (prefixes of the pipeline) for the "
                             "report's per-stage errors")
    parser.add_argument("--reps", type=int, default=5, help="GPU run: CUDA-graph replays per configuration (median)")
    parser.add_argument("--idle-before", type=float, default=0.0, metavar="SECONDS",
                        help="GPU run: leave the GPU idle this long before each configuration's layer timing (and "
                             "each stage prefix's), so that it starts from the idle clocks the cost model's sustained "
                             "ratio assumes (calibrate's sustained step pauses 1.5 s); default 0, back to back")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="GPU run: wall-time limit from the start (default none); see below")
    parser.add_argument("--warm", action=argparse.BooleanOptionalAction, default=True,
                        help="GPU run: compile every configuration's kernels first, in parallel processes (default on)")
    parser.add_argument("--warm-procs", type=int, default=None,
                        help="GPU run: compile-ahead processes at once (default: the CPU count)")
    parser.add_argument("--config-timeout", type=float, default=CONFIG_TIMEOUT_S, metavar="SECONDS",
                        help=f"GPU run: a configuration running longer is taken for a hang (default {CONFIG_TIMEOUT_S:.0f})")
    parser.add_argument("--resume", action="store_true", help="GPU run: skip the configurations --out already has an "
                        "outcome for")
    parser.add_argument("--scale", action="store_true", help="run the GPU run's loop even without a GPU (interpreter, "
                        "shrunken layers, meaningless times): a smoke test of its machinery")
    parser.add_argument("--numerics", action="store_true", help="on a GPU: the per-(model, T) numerics-and-timing "
                        "rows instead of the predicted-vs-measured run")
    parser.add_argument("--report", metavar="DIR_OR_JSONL", default=None,
                        help="no GPU: rebuild report.md, report.json and scatter.png from stored rows (into --out or beside them)")
    parser.add_argument("--system", default="h200", help="simulator profile of the GPU the kernel runs on")
    parser.add_argument("--repredict", metavar="PROFILE", default=None,
                        help="with --report: predict the stored rows again with this profile (name or profile.json), "
                             "offline, from the counts the rows carry; the report says so (megamoe/repredict.py)")
    parser.add_argument("--switch", action="append", default=[], metavar="NAME=on|off",
                        help="with --repredict: set a cost-model option (a field of simulator.cost.CostOptions) for this "
                             "re-prediction; in the GPU run (or --scale): for its predictions, made before each "
                             "measurement (rows carry cost_switches); repeatable; the report's note lists them")
    parser.add_argument("--variant", action="append", default=[], metavar="A=on[,B=off...]",
                        help="in the GPU run (or --scale): one more prediction per row, made before the measurement "
                             "with the first profile and these cost options on top of --switch, stored under "
                             "predictions['<profile>+<label>'] so that the report gives its statistics too: several "
                             "model variants held out by one measurement; repeatable")
    parser.add_argument("--counts-from", metavar="DIR_OR_JSONL", default=None,
                        help="with --repredict: rows without counts (rebuilt from a log) take the counts and "
                             "calls_per_graph of the same configuration in these stored rows (a run of the same "
                             "seeds, presets and routings: the routings are deterministic)")
    parser.add_argument("--sample", type=int, default=16, help="tokens checked against the float64 reference")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="GPU run / --report: output folder; otherwise append rows as "
                        "JSON lines to this file")
    parser.add_argument("--json", action="store_true", help="print rows as JSON lines")
    parser.add_argument("--from-bench", metavar="JSONL", default=None,
                        help="no kernel run: predict the rows a `megamoe bench` run measured and compare")


def grid_args_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the GPU run's presets, T or profiles (None if nothing), before any GPU
    work; ``guards.check_validate`` has checked the other options."""
    from megamoe.reference import PRESETS
    from megamoe.simulator import ProfileError, load_profile

    bad = [m.strip() for m in args.models.split(",") if m.strip() and m.strip() not in PRESETS]
    if bad:
        return f"unknown model(s) {bad}; presets: {', '.join(PRESETS)}"
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    except ValueError:
        return f"--tokens must be comma-separated integers, got {args.tokens!r}"
    if not tokens or any(t < 1 for t in tokens):
        return f"--tokens must list token counts >= 1 for the GPU run, got {args.tokens!r}"

    for spec in [args.profile or args.system, *(s.strip() for s in (args.compare_profiles or "").split(","))]:
        if spec:
            try:
                load_profile(spec)
            except ProfileError as exc:
                return f"profile: {exc}"
    return None


def bench_row_problem(r: dict) -> str | None:
    """What makes a bench row unusable for ``--from-bench`` (None if nothing): checked for every row
    before any prediction."""
    import math

    from megamoe.kernels.bench import DTYPES
    from megamoe.reference import PRESETS

    if r.get("preset") not in PRESETS:
        return f"preset {r.get('preset')!r} is not a preset ({', '.join(PRESETS)})"
    if r.get("dtype", "bf16") not in DTYPES:
        return f"dtype={r.get('dtype')!r} is not one of megamoe bench's ({', '.join(DTYPES)})"
    T = r.get("T")
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        return f"T={T!r} must be a whole number of tokens >= 1"
    us = r["ours_us"]
    if isinstance(us, bool) or not isinstance(us, (int, float)) or not math.isfinite(us) or us <= 0:
        return f"ours_us={us!r} must be a positive time in us"
    for k in ("ceiling_read_bytes_per_s", "ceiling_matmul_flops_per_s"):
        v = r.get(k, 1.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            return f"{k}={v!r} must be a positive rate"
    return None


def run_from_bench(path: Path, args: argparse.Namespace) -> int:
    """Compare the simulator's launch model with measured bench rows (deterministic mode)."""
    if not path.exists():
        return _fail(f"--from-bench file {str(path)!r} does not exist")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as exc:
            return _fail(f"{path}:{n}: not JSON ({exc.msg})")
        if isinstance(r, dict) and "ours_us" in r and r.get("deterministic", True):
            bad = bench_row_problem(r)
            if bad:
                return _fail(f"{path}:{n}: {bad}")
            rows.append(r)
    if not rows:
        return _fail(f"{path} holds no bench rows with 'ours_us'")
    from megamoe.simulator import ProfileError, load_profile

    try:
        load_profile(args.system)
    except ProfileError as exc:
        return _fail(f"--system: {exc}")
    out = Path(args.out) if args.out else None
    for r in rows:
        c = predict_bench_row(r, system=args.system, seed=args.seed)
        if args.json:
            print(json.dumps(c))
        else:
            extra = (f"  with the run's rates: {c['predicted_measured_rates_us']:9.1f} us "
                     f"(meas/pred {c['ratio_measured_rates']:.2f})" if "ratio_measured_rates" in c else "")
            print(f"{c['preset']:<16} T={c['T']:<6} {c['dtype']:<7} measured {c['measured_us']:9.1f} us  predicted "
                  f"{c['predicted_us']:9.1f} us (meas/pred {c['ratio']:.2f}){extra}"
                  f"{'' if c['same_tiles'] else '  [tiles differ from the run]'}")
        if out:
            _append_jsonl(out, c)
    return 0


def run(args: argparse.Namespace) -> int:
    """``megamoe validate``: the option checks, then the report, the GPU run or the per-layer check."""
    if args.counts_from and not args.repredict:
        return _fail("--counts-from needs --repredict PROFILE")
    if args.counts_from and not Path(args.counts_from).exists():
        return _fail(f"--counts-from {args.counts_from!r} does not exist")
    if getattr(args, "variant", None) and (args.repredict or args.report or not (_has_cuda() or args.scale)):
        return _fail("--variant is for the GPU run (or --scale), whose predictions come before its "
                     "measurements; to re-predict stored rows with other switches, run --repredict once per --switch set")
    if getattr(args, "switch", None) and not (args.repredict or _has_cuda() or args.scale):
        return _fail("--switch needs --repredict PROFILE or the GPU run (or --scale)")
    if args.repredict and not args.report:
        return _fail("--repredict needs --report DIR (the stored rows to predict again)")
    if args.report:
        return _run_report(args)
    if args.from_bench:
        return run_from_bench(Path(args.from_bench), args)
    grid = (_has_cuda() or args.scale) and not args.numerics
    args.models = args.models or (GRID_PRESETS if grid else DEFAULT_MODELS)
    args.tokens = args.tokens or (",".join(map(str, GRID_TOKENS)) if grid else DEFAULT_TOKENS)
    if grid:
        return _run_grid(args)
    return _run_layers(args)


def _run_report(args: argparse.Namespace) -> int:
    """``--report DIR`` (with ``--repredict PROFILE``: the stored rows predicted again first)."""
    src = Path(args.report)
    if not src.exists():
        return _fail(f"--report {str(src)!r} does not exist")
    rows, failed = load_outcomes(src)
    from .report import _row_files
    from .report_rows import scan, summary

    unusable = summary(*scan(_row_files(src)))
    for line in unusable:
        print(f"megamoe validate: {line}", file=sys.stderr)
    if not rows:
        return _fail(f"{src} holds no rows with predicted_us and measured_us")
    out = Path(args.out) if args.out else (src if src.is_dir() else src.parent)
    notes = tuple(unusable)
    if args.repredict:
        from megamoe.simulator.hardware import load_profile

        from .repredict import parse_switches, repredict_rows, switch_note, switches

        try:
            settings = parse_switches(getattr(args, "switch", None))
        except ValueError as e:
            return _fail(str(e))
        profile = load_profile(args.repredict)
        borrowed = 0
        if args.counts_from:
            rows, borrowed = borrow_counts(rows, args.counts_from)
        with switches(settings):
            rows, skipped = repredict_rows(rows, profile)
        if not rows:
            return _fail(f"no row of {src} carries counts (pairs per expert): nothing to predict again")
        out = Path(args.out) if args.out else out / f"repredicted-{profile.name}"
        notes = (f"Re-predicted offline with profile {profile.name} from the stored measurements' routings "
                 f"({len(rows)} rows; {skipped} without counts left out): not predictions made before the "
                 "measurements.",) + ((f"{borrowed} rows took their counts from {args.counts_from} (the same "
                                       "configurations' routings)",) if borrowed else ()) + \
            switch_note(settings, "this re-prediction") + tuple(unusable)
    write_report(rows, out, failures=failed, notes=notes)
    return 0


def _run_grid(args: argparse.Namespace) -> int:
    """The GPU run (``megamoe.measure``), or ``--scale`` on the CPU under the interpreter."""
    bad = grid_args_problem(args)
    if bad:
        return _fail(bad)
    if not _has_cuda():  # --scale on the CPU: before triton is imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    args.out = args.out or "validate-out"
    from .repredict import parse_switches, parse_variants, switches

    try:
        args.cost_switches = parse_switches(getattr(args, "switch", None))
        args.variants = parse_variants(getattr(args, "variant", None))
    except ValueError as e:
        return _fail(str(e))
    with switches(args.cost_switches):  # the predictions, made before each measurement, with these switches
        return measure_grid(args)


def _run_layers(args: argparse.Namespace) -> int:
    """Per (model, T): the kernel's numerics against the reference, and its launch plan's prediction."""
    from megamoe.reference import PRESETS

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in PRESETS]
    if bad:
        return _fail(f"unknown model(s) {bad}; presets: {', '.join(PRESETS)}")
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        return _fail(f"--tokens must be comma-separated integers, got {args.tokens!r}")
    if any(t < 0 for t in tokens):
        return _fail(f"--tokens must be >= 0, got {tokens}")
    if args.sample < 1:
        return _fail(f"--sample must be >= 1 token, got {args.sample}")
    if not 0 <= args.seed < 2**32:
        return _fail(f"--seed must be in [0, 2^32), got {args.seed}")
    gpu = _has_cuda()
    if not gpu:  # before triton is imported: the interpreter is chosen at import
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as exc:
        return _fail(f"needs torch and triton (pip install -e '.[gpu]'): {exc}")
    if not gpu:
        tokens = sorted({min(t, 64) for t in tokens})
        print("no GPU: kernels run under TRITON_INTERPRET=1 on shrunken layers in float32 "
              "(numerics and predictions only)", file=sys.stderr)
    ceilings = None
    if gpu:
        from megamoe.kernels.bench import measure_ceilings, provenance

        ceilings = measure_ceilings()
        prov = provenance()
    else:
        prov = {}
    failed = 0
    out = Path(args.out) if args.out else None
    for m in models:
        for T in tokens:
            r = validate_one(m, T, gpu=gpu, seed=args.seed, sample=args.sample, system=args.system, ceilings=ceilings)
            r.update(prov)
            if ceilings:
                r["ceilings"] = ceilings
            failed += not r["numerics"]["ok"]
            print(json.dumps(r) if args.json else format_row(r), flush=True)
            if out:
                _append_jsonl(out, r)
    if failed:
        print(f"megamoe validate: {failed} row(s) outside the {'bfloat16' if gpu else 'float32'} tolerance",
              file=sys.stderr)
    return 1 if failed else 0
