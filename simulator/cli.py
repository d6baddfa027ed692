"""``megamoe simulate``: the simulator's command line (``add_arguments`` + ``run``).

With no arguments: DeepSeek-V3 on a GB200 NVL72, 4096 tokens per GPU, skewed routing, contiguous
placement, fused schedule; prints a table (``--json`` prints strict JSON with ``layer_time_us``
and ``breakdown_us``; ``--trace FILE`` writes a Perfetto timeline).

Bad input is refused before any work with one line on stderr and exit code 2; notes (a clamped
default skew, implausible profile numbers, the size of a long run and its progress) go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys

from .cost import DTYPES
from .placement import POLICIES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--system", default="gb200-nvl72", help="profile name (gb200-nvl72, gb300-nvl72, hgx-h200, h200) or JSON file "
      "(make one with: megamoe info --system gb200-nvl72 --json > my-rack.json) (default gb200-nvl72)")
    a("--model", default="deepseek-v3", help="MoEConfig preset or config.json path (default deepseek-v3)")
    a("--tokens-per-gpu", type=int, default=4096, help="tokens each GPU starts with (default 4096)")
    a("--routing", default="skewed",
      help="uniform | skewed[:R] (R = by-expert (max-mean)/mean, default 10.9, clamped where E/K leaves "
           "no room) | zipf:S | hot:F[:N] | trace:FILE | router (default skewed)")
    a("--routing-trace", metavar="FILE", help="shortcut for --routing trace:FILE (npz key topk_idx, or CSV)")
    a("--placement", default="contiguous", choices=POLICIES, help="expert placement (default contiguous)")
    a("--slots", type=int, help="physical expert slots for --placement eplb (default E + E/8 rounded up to a multiple of G)")
    a("--schedule", default="fused", choices=("fused", "bulk"), help="fused megakernel or bulk-synchronous (default fused)")
    a("--comm-sms", type=int, help="SMs given to communication (default: the profile's megakernel.comm_sms, 40)")
    a("--minibatch", type=int,
      help="tokens per GPU per pipelined minibatch (default: the profile's megakernel.minibatch_tokens, 4096)")
    a("--minibatch-rows", type=int, metavar="T",
      help="the minibatch as Mixture-of-Kittens counts it: rows each GPU receives per round (T = top-k x tokens "
           "per round); instead of --minibatch")
    a("--dispatch", default="pull", choices=("pull", "push"),
      help="dispatch: the receiver's communication SMs pull the rows, or the sender's push them (default pull)")
    a("--combine", default="push", choices=("pull", "push"),
      help="combine: the expert GPU pushes the partial sums, or their owner pulls them (default push)")
    a("--optimize", metavar="KNOBS",
      help="search these knobs for the layer: comm-sms, minibatch or both comma-separated; prints the best setting, "
           "the runner-up and the term binding each")
    a("--plot", metavar="FILE", help="with --optimize: draw layer time against each knob around the optimum (PNG)")
    a("--comm-work", metavar="LIST",
      help="what communication SMs do besides copying, comma-separated: quantize, transpose, stash "
           "(default: quantize when rows are pulled as fp8; 'none' for nothing)")
    a("--dtype", default="bf16", choices=DTYPES, help="weights and dispatched activations (combine is bf16)")
    a("--weight-dtype", choices=DTYPES, help="override --dtype for the weights")
    a("--dispatch-dtype", choices=DTYPES, help="override --dtype for the dispatched activations")
    a("--no-shared", action="store_true", help="leave the shared expert out")
    a("--seed", type=int, default=0, help="random seed, in [0, 2^32) (default 0)")
    g = parser.add_argument_group("hardware overrides (units: bytes/s, s, counts)")
    g.add_argument("--gpus", type=int, help="GPU count")
    g.add_argument("--link-bandwidth", type=float, help="per link per direction, bytes/s")
    g.add_argument("--link-latency", type=float, help="GPU-to-GPU message latency, s")
    g.add_argument("--sms", type=int, help="SMs per GPU")
    g.add_argument("--hbm-bandwidth", type=float, help="HBM bytes/s")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any profile number as section.key or an alias, e.g. --set link.payload_efficiency=0.9 "
                   "(repeatable)")
    a("--trace", metavar="FILE", help="write a Chrome-trace/Perfetto JSON timeline to FILE")
    a("--analytic", action="store_true", help="the analytic bound only (no event model; milliseconds)")
    a("--json", action="store_true", help="print JSON instead of a table")
    a("--links", action="store_true", help="with --json: include every link's bytes and utilization")


#: The hardware flags and the profile override each sets.
HARDWARE_FLAGS = {"gpus": "--gpus", "link_bandwidth": "--link-bandwidth", "link_latency": "--link-latency",
                  "sms": "--sms", "hbm_bandwidth": "--hbm-bandwidth"}


def key_path(name: str) -> str | None:
    """The profile key path (``link.payload_efficiency``) an override name or alias sets, or None."""
    from .hardware import ALIASES, OPTIONAL_SCHEMA, SCHEMA

    path = ALIASES.get(name, name.replace("__", "."))
    sec, _, key = path.partition(".")
    return path if key in SCHEMA.get(sec, OPTIONAL_SCHEMA.get(sec, {})) else None


def _overrides(args) -> dict:
    """{override name: value} from the hardware flags and every ``--set``; a key set twice is refused."""
    from .hardware import ALIASES, ProfileError, parse_assignment

    o = {k: getattr(args, k) for k in HARDWARE_FLAGS if getattr(args, k) is not None}
    given = {key_path(k): HARDWARE_FLAGS[k] for k in o}
    for s in args.set:
        k, v = parse_assignment(s)
        path = key_path(k)
        if path is None:
            raise ProfileError(f"--set {s.split('=', 1)[0].strip()}: not a profile key; give section.key "
                               f"(e.g. link.payload_efficiency) or one of {', '.join(sorted(ALIASES))}")
        if path in given:
            raise ProfileError(f"--set {s} and {given[path]} both set {path}: give it once")
        given[path] = f"--set {s}"
        o[k] = v
    return o


def _comm_work(text):
    if text is None:
        return None
    return () if text.strip() == "none" else tuple(w.strip() for w in text.split(",") if w.strip())


def check_options(args) -> str | None:
    """What is wrong with a combination of options (None if nothing): checked before any work."""
    if args.links and not args.json:
        return "--links adds every link's bytes to the JSON output: use it with --json"
    if args.trace and args.analytic:
        return "--trace needs the event model's timeline; --analytic runs the bound only (drop one of them)"
    if args.trace:
        from pathlib import Path

        t = Path(args.trace)
        if t.is_dir():
            return f"--trace {args.trace}: is a directory; give a file name, e.g. {t / 'layer.json'}"
        if not t.parent.is_dir():
            return f"--trace {args.trace}: the directory {str(t.parent)!r} does not exist"
    if args.routing_trace and args.routing != "skewed":
        return f"--routing-trace and --routing {args.routing} both give the routing: use one"
    kind, _, rest = args.routing.partition(":")
    if kind != "trace" and rest:
        for part in rest.split(":"):
            try:
                bad = not math.isfinite(float(part))
            except ValueError:
                bad = False  # not a number: the routing parser names it
            if bad:
                return f"--routing {args.routing}: {part} is not a finite number"
    if args.plot and not args.optimize:
        return "--plot draws the curves of --optimize: give --optimize comm-sms,minibatch (or one of them)"
    if args.optimize:
        from .knobs import KNOBS

        knobs = [k.strip() for k in args.optimize.split(",") if k.strip()]
        bad = [k for k in knobs if k not in KNOBS]
        if bad or not knobs:
            return f"--optimize {args.optimize}: knobs are {', '.join(KNOBS)} (comma-separated)"
        if args.schedule == "bulk":
            return "--optimize searches the fused megakernel's knobs: drop --schedule bulk"
        if args.analytic or args.trace:
            return "--optimize runs its own bound and event model: drop --analytic / --trace"
        if "comm-sms" in knobs and args.comm_sms is not None:
            return "--optimize comm-sms searches the communication SMs: drop --comm-sms"
        if "minibatch" in knobs and (args.minibatch is not None or args.minibatch_rows is not None):
            return "--optimize minibatch searches the minibatch: drop --minibatch / --minibatch-rows"
    if args.minibatch is not None and args.minibatch_rows is not None:
        return "--minibatch (tokens per GPU) and --minibatch-rows (rows received per GPU) give the same knob: use one"
    if args.minibatch_rows is not None and args.minibatch_rows < 1:
        return f"--minibatch-rows {args.minibatch_rows}: give a whole number of rows >= 1"
    if args.minibatch is not None and args.schedule == "bulk":
        return (f"--minibatch {args.minibatch} has no effect under --schedule bulk (it moves every token at once); "
                "drop it or use --schedule fused")
    if args.sms is not None and args.sms < 2:
        return f"--sms {args.sms}: a GPU needs at least 2 SMs (at least one copies and one computes)"
    if args.sms is not None and args.comm_sms is not None and args.comm_sms >= args.sms:
        return f"--comm-sms {args.comm_sms} must leave at least one of the --sms {args.sms} SMs for compute"
    return None


def size_problem(args) -> str | None:
    """Refuse, with the estimate, a model whose weights fit no GPU of the system or more --slots than
    every expert on every GPU; None if the sizes are possible."""
    from megamoe.reference import MoEConfig

    from .hardware import load_profile, override

    cfg = MoEConfig.load(args.model)
    p = load_profile(args.system)
    o = _overrides(args)
    p = override(p, **o) if o else p
    G, E = p.num_gpus, cfg.num_experts
    if args.slots is not None and args.slots > E * G:
        return (f"--slots {args.slots:,}: at most {E * G:,} (every one of the {E} experts on every one of the {G} "
                f"GPUs)")
    if args.comm_sms is None and p.rack is not None and p.rack.comm_sms >= p.num_sms:
        return (f"--sms {p.num_sms} leaves no SM for compute with {args.system}'s {p.rack.comm_sms} communication SMs: "
                f"give --comm-sms below {p.num_sms}")
    bad = weights_problem(cfg, p, args.weight_dtype or args.dtype, not args.no_shared, args.system)
    return f"--model {args.model}: {bad}" if bad else None


def weights_problem(cfg, profile, weight_dtype: str, shared: bool, system: str) -> str | None:
    """Why the layer's weights fit no GPU of ``profile`` (its routed experts spread evenly, the shared
    expert on every GPU), with the estimate; None if they fit."""
    from megamoe.reference.sizes import expert_bytes, shared_bytes

    E, G = cfg.num_experts, profile.num_gpus
    per_gpu = -(-E // G) * expert_bytes(cfg, weight_dtype) + (shared_bytes(cfg, weight_dtype) if shared else 0)
    if per_gpu <= profile.hbm_capacity_bytes:
        return None
    return (f"its {weight_dtype} weights need {per_gpu / 1e9:,.3g} GB per GPU ({-(-E // G)} of {E} experts on each "
            f"of {G} GPUs{' and the shared expert' if shared else ''}), more than the "
            f"{profile.hbm_capacity_bytes / 1e9:,.0f} GB of HBM of a {system} GPU")


def _log(line: str) -> None:
    print(f"megamoe simulate: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def compile_notice():
    """Say once on stderr when numba compiles the simulator's kernels (a cache miss: the first run
    after an install or an upgrade); a run that loads them from the cache says nothing."""
    from numba.core import event

    class Notice(event.Listener):
        said = False

        def on_start(self, ev):
            if not self.said:
                self.said = True
                cache = os.environ.get("NUMBA_CACHE_DIR") or "beside the sources"
                _log(f"compiling the simulator's numba kernels once, after an install or upgrade (tens of "
                     f"seconds; then cached in {cache})")

        def on_end(self, ev):
            pass

    with event.install_listener("numba:compile", Notice()):
        yield


def run(args) -> int:
    from .hardware import ProfileError
    from .simulate import simulate
    from .workload import TraceError

    bad = check_options(args)
    if bad:
        print(f"megamoe simulate: error: {bad}", file=sys.stderr)
        return 2
    routing = f"trace:{args.routing_trace}" if args.routing_trace else args.routing
    try:
        bad = size_problem(args)
        if bad:
            print(f"megamoe simulate: error: {bad}", file=sys.stderr)
            return 2
        if args.optimize:
            with compile_notice():
                return run_optimize(args, routing)
        with compile_notice():
            r = simulate(args.model, args.system, args.tokens_per_gpu, routing=routing, placement=args.placement,
                         schedule=args.schedule, comm_sms=args.comm_sms, minibatch=args.minibatch, dtype=args.dtype,
                         weight_dtype=args.weight_dtype, dispatch_dtype=args.dispatch_dtype, seed=args.seed,
                         num_slots=args.slots, include_shared=not args.no_shared, overrides=_overrides(args),
                         analytic_only=args.analytic, comm_work=_comm_work(args.comm_work), log=_log,
                         minibatch_rows=args.minibatch_rows, dispatch_mode=args.dispatch, combine_mode=args.combine)
    except (ProfileError, TraceError, ValueError, OSError) as exc:
        print(f"megamoe simulate: error: {exc}", file=sys.stderr)
        return 2
    except RecursionError:
        print(f"megamoe simulate: error: --model {args.model} or --system {args.system}: JSON nested too deeply to "
              "read", file=sys.stderr)
        return 2
    if args.trace:
        try:
            r.write_trace(args.trace)
        except OSError as exc:
            print(f"megamoe simulate: error: --trace {args.trace}: cannot write: {exc.strerror or exc}", file=sys.stderr)
            return 2
    if args.json:
        print(r.to_json(links=args.links))
    else:
        print_table(r, trace=args.trace)
    return 0


def run_optimize(args, routing: str) -> int:
    """``--optimize``: build the layer's workload once, search the knobs (``knobs.optimize``), print."""
    import json

    from megamoe.reference import MoEConfig

    from .knobs import optimize, plot_curves
    from .simulate import check_request, resolve_system, tokens_for_rows
    from .workload import build_workload

    cfg = MoEConfig.load(args.model)
    p = resolve_system(args.system, _overrides(args))
    for n in check_request(cfg, p, args.tokens_per_gpu, routing=routing, placement=args.placement,
                           comm_sms=args.comm_sms, minibatch=args.minibatch, seed=args.seed, num_slots=args.slots,
                           comm_work=_comm_work(args.comm_work)):
        _log(n)
    mb = args.minibatch
    if args.minibatch_rows is not None:
        mb = tokens_for_rows(args.minibatch_rows, cfg, args.tokens_per_gpu)
    w = build_workload(cfg, p.num_gpus, args.tokens_per_gpu, routing, args.placement, seed=args.seed,
                       num_slots=args.slots, num_nodes=p.num_nodes, minibatch=args.tokens_per_gpu)
    r = optimize(w, p, knobs=tuple(k.strip() for k in args.optimize.split(",") if k.strip()), dtype=args.dtype,
                 weight_dtype=args.weight_dtype, dispatch_dtype=args.dispatch_dtype, include_shared=not args.no_shared,
                 comm_work=_comm_work(args.comm_work), dispatch_mode=args.dispatch, combine_mode=args.combine,
                 comm_sms=args.comm_sms, minibatch=mb, curve_events=1 if args.plot else 0)
    if args.plot:
        plot_curves(r, args.plot, title=f"{cfg.name} on {p.name}, {args.tokens_per_gpu} tokens/GPU")
    if args.json:
        def d(q):
            return None if q is None else {**q.__dict__, "time_us": q.time_us}
        print(json.dumps({"best": d(r["best"]), "runner_up": d(r["runner_up"]),
                          "curves": {k: [d(q) for q in v] for k, v in r["curves"].items()},
                          "wall_s": r["wall_s"], "bound_s_per_point": r["bound_s_per_point"]}, indent=2))
        return 0
    print(f"{cfg.name} on {p.name} ({p.num_gpus} GPUs), {args.tokens_per_gpu} tokens/GPU, routing {routing}: "
          f"searched {args.optimize} over {len(r['points'])} points in {r['wall_s']:.1f} s")
    for label, q in (("best", r["best"]), ("runner-up", r["runner_up"])):
        if q is None:
            continue
        print(f"{label:>9}: {q.comm_sms} communication SMs, minibatch {q.minibatch} tokens per GPU "
              f"({q.rows_per_round:,.0f} rows received per GPU per round): {q.time_us / 1e3:,.3f} ms "
              f"(event model; bound {q.bound_us / 1e3:,.3f} ms, bound by {q.bound_term})")
        if q.verdict:
            print(f"{'':>11}{q.verdict}")
    if args.plot:
        print(f"curves written to {args.plot}")
    return 0


def print_table(r, trace: str | None = None) -> None:
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    c = Console()
    i = r.inputs
    c.print(f"[bold]{i['model']}[/] on [bold]{i['system']}[/] ({i['num_gpus']} GPUs), {i['tokens_per_gpu']} tokens/GPU, "
            f"routing {i['routing']}, placement {i['placement']} ({i['num_slots']} slots), schedule [bold]{i['schedule']}[/] "
            f"({i['comm_sms']} comm SMs, {i['num_minibatches']} x {i['minibatch']}-token minibatches), "
            f"weights {i['weight_dtype']}, dispatch {i['dispatch_dtype']}, seed {i['seed']}")
    t = Table(title="Predicted MoE layer time")
    t.add_column("quantity")
    t.add_column("us", justify="right")
    t.add_column("note")
    analytic = bool(i.get("analytic_only"))
    if analytic:
        t.add_row("[bold]analytic bound", f"[bold]{r.analytic_us:,.1f}", "roofline + busiest endpoint (no event model run)")
    else:
        t.add_row("[bold]layer time (event model)", f"[bold]{r.layer_time_us:,.1f}", "")
        t.add_row("analytic bound", f"{r.analytic_us:,.1f}", "roofline + busiest endpoint; never above the event model")
    notes = {
        "expert_compute": "mean compute-SM busy time per GPU (+)",
        "load_imbalance_wait": "most loaded GPU's extra compute (+)",
        "exposed_communication": "layer time not covered by the busiest GPU's compute (+)",
        "dispatch": "first to last dispatch byte, longest GPU (overlaps the (+) rows: do not add)",
        "combine": "first to last combine byte, longest GPU (overlaps the (+) rows: do not add)",
    }
    if analytic:
        notes.update(dispatch="bound of the phase alone: busiest GPU's bytes at port/copy rate (do not add)",
                     combine="bound of the phase alone: busiest GPU's bytes at port/copy rate (do not add)")
    for k in ("expert_compute", "load_imbalance_wait", "exposed_communication", "dispatch", "combine"):
        t.add_row(f"  {k.replace('_', ' ')}", f"{r.breakdown_us[k]:,.1f}", notes[k])
    c.print(t)
    if r.verdict:
        c.print(f"[bold]verdict:[/] {r.verdict['line']}")
    if analytic:
        c.print(f"imbalance (max-mean)/mean by GPU {r.imbalance['by_gpu']:.2f}, by expert {r.imbalance['by_expert']:.2f}, "
                f"by slot {r.imbalance['by_slot']:.2f}")
        return
    pg = r.per_gpu
    busiest = int(np.argmax(pg["compute_busy_us"]))
    s = Table(title="Load and traffic")
    s.add_column("quantity")
    s.add_column("value", justify="right")
    s.add_row("imbalance (max-mean)/mean by GPU", f"{r.imbalance['by_gpu']:.2f}")
    s.add_row("imbalance by expert / by slot", f"{r.imbalance['by_expert']:.2f} / {r.imbalance['by_slot']:.2f}")
    s.add_row("busiest GPU (compute)", f"GPU {busiest}: {pg['rows'][busiest]:,} rows, {pg['compute_busy_us'][busiest]:,.1f} us")
    s.add_row("NVLink bytes sent = received", f"{r.totals['nvlink_bytes_sent'] / 1e9:,.3f} GB")
    su, ru = np.asarray(pg["send_port_utilization"]), np.asarray(pg["recv_port_utilization"])
    s.add_row("send port utilization max / mean", f"{su.max():.2f} / {su.mean():.2f}")
    s.add_row("recv port utilization max / mean", f"{ru.max():.2f} / {ru.mean():.2f}")
    if r.per_link:
        lu = np.array([x["utilization"] for x in r.per_link])
        s.add_row("link utilization max / mean", f"{lu.max():.2f} / {lu.mean():.2f} over {lu.size} links")
    if r.rounds:
        q = r.rounds
        s.add_row(f"GPU {q['gpu']} (ends last): fill / compute / gaps / drain",
                  " / ".join(f"{q[k] * 1e6:,.0f}" for k in ("fill_s", "routed_compute_s", "gaps_s", "drain_s"))
                  + f" us, {q['rounds']} rounds")
    s.add_row("TFLOP/s per GPU (mean, over the layer)",
              f"{np.mean(pg['flops']) / max(r.layer_time_us, 1e-9) / 1e6:,.0f}")
    s.add_row("simulation wall time", f"{r.stats.get('workload_s', 0):.2f} s workload + {r.stats['total_s']:.2f} s model")
    c.print(s)
    if trace:
        c.print(f"timeline written to {trace} (open in ui.perfetto.dev)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m megamoe.simulator", description=__doc__.splitlines()[0])
    add_arguments(p)
    try:
        return run(p.parse_args(argv))
    except BrokenPipeError:  # the reader left (``| head``): stop writing, quietly, as a Unix tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
