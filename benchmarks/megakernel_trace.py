"""Where the megakernel's time goes: per-task timestamps (%globaltimer) of one launch, by kind.

    python benchmarks/megakernel_trace.py --out DIR [--cases qwen3-30b-a3b:1,deepseek-v3:1] [--variants]
        [--fp8 weights|weights+act]
    python benchmarks/megakernel_trace.py --from benchmarks/results/h100/megakernel_trace/trace_2026-12-07_routed.jsonl \
        [--plot DIR]

For each case (preset:T[:concentrated | a validation routing, e.g. zipf]) the layer runs traced (kernels.megakernel's ``trace``:
program, start and end of every ticket; each program's first ticket and exit) in every call of a
CUDA graph of 8 calls, as the layer is timed (``--eager``: one eager call), and is timed untraced
beside the multi-launch path. The graph's calls give the kernel's time from its first program in to
its last out and the gap to the next call's first program (one eager call's span and the replayed
time can disagree by microseconds). Per kind: tasks, mean task time (wait included), first
start and last end relative to the launch's first start; the launch span and the programs' busy
fraction; every task's (kind, program, start ns, end ns) and its weight bytes from the plan ("tasks",
"task_weight_bytes", the kinds' names in "kind_names") and, per kind that reads weights, the programs
that ran it and its read rate over its window (``read_phases``). ``--variants a,b`` traces named
variants of megakernel_variants.py too. Rows go to DIR/trace.jsonl with GPU, versions, commit and date. ``--from FILE`` prints the read
phases of a stored trace.jsonl, without a GPU; ``--plot DIR`` also draws each launch's timeline. ``--fp8``: the FP8 megakernel (e4m3 weights with
128 x 128 block scales quantized on the GPU from the same bf16 weights, kernels/fp8_weights.py; with
FP8 activations too), its plan's weight and activation bytes FP8's, beside the same multi-launch path.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megakernel_variants import variant_configs  # noqa: E402


def program_phases(tasks: np.ndarray, programs: np.ndarray, topk: np.ndarray) -> dict:
    """From the rows past the tasks' (kernels.megakernel.trace_rows): how long before the first task
    the earliest program asked for a ticket and how long after the last task the last program
    exited (both us; the launch's edges inside the kernel), and the first top-k task's phases (us
    from the first task's start: logits seen, routed, aligned and signalled)."""
    t0, t1 = tasks[:, 1].min(), tasks[:, 2].max()
    us = lambda v: float(v) / 1e3  # noqa: E731
    return {"programs_first_us": us(t0 - programs[:, 1].min()), "programs_exit_us": us(programs[:, 2].max() - t1),
            "topk_seen_us": us(topk[0] - t0), "topk_routed_us": us(topk[1] - t0), "topk_done_us": us(topk[2] - t0)}


def graph_edges(programs: list) -> dict:
    """From each traced call's program rows (p, first ticket asked ns, exit ns) in launch order: the
    mean kernel time (earliest program in to latest out) and the mean gap from one call's last
    program out to the next call's first program in (the launch-to-launch cost inside a graph)."""
    starts = np.array([p[:, 1].min() for p in programs], np.float64)
    ends = np.array([p[:, 2].max() for p in programs], np.float64)
    gaps = starts[1:] - ends[:-1]
    return {"kernel_us": float(np.mean(ends - starts)) / 1e3,
            "gap_us": float(np.mean(gaps)) / 1e3 if gaps.size else float("nan")}


def summarize(trace: np.ndarray, kinds: np.ndarray, names) -> dict:
    """trace (n, 3) int64 rows (program, start, end) in ticket order; kinds (n,) codes into names."""
    t0 = trace[:, 1].min()
    out = {"span_us": float(trace[:, 2].max() - t0) / 1e3, "programs": int(np.unique(trace[:, 0]).size)}
    busy = float((trace[:, 2] - trace[:, 1]).sum())
    out["busy_fraction"] = busy / (out["programs"] * (trace[:, 2].max() - t0))
    per = {}
    for i, k in enumerate(names):
        m = kinds == i
        if not m.any():
            continue
        d = (trace[m, 2] - trace[m, 1]) / 1e3
        per[k] = {"tasks": int(m.sum()), "mean_us": float(d.mean()), "max_us": float(d.max()),
                  "first_start_us": float(trace[m, 1].min() - t0) / 1e3,
                  "last_end_us": float(trace[m, 2].max() - t0) / 1e3}
    out["kinds"] = per
    return out


def read_phases(tasks: list, weight_bytes: list, names) -> dict:
    """Per task kind that reads weights, from a traced launch's stored rows (``tasks``: [kind, program,
    start ns, end ns] from the first task's start; ``weight_bytes``: the plan's, per task): the
    programs that ran it, its weight MB, its window (first start, median start, last end, us) and
    the read rate from first start to last end (TB/s; a task's time includes its waits)."""
    t = np.asarray(tasks, dtype=np.int64).reshape(-1, 4)
    wb = np.asarray(weight_bytes, dtype=np.float64)
    out = {}
    for i, k in enumerate(names):
        m = (t[:, 0] == i) & (wb > 0)
        if not m.any():
            continue
        lo, mid, hi = int(t[m, 2].min()), int(np.median(t[m, 2])), int(t[m, 3].max())
        out[k] = {"programs": int(np.unique(t[m, 1]).size), "weight_mb": float(wb[m].sum()) / 1e6,
                  "window_us": (lo / 1e3, mid / 1e3, hi / 1e3),
                  "read_tb_s": float(wb[m].sum()) / max(hi - lo, 1) / 1e3}
    return out


def plot_timeline(tasks: list, names, title: str, out: Path) -> None:
    """A traced launch's tasks as bars, one row per program (time on x, us from the first task's
    start), coloured by kind: where programs stream, wait or sit idle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.asarray(tasks, dtype=np.int64).reshape(-1, 4)
    kinds = sorted(set(t[:, 0].tolist()))
    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(10, 6))
    for j, k in enumerate(kinds):
        m = t[:, 0] == k
        ax.barh(t[m, 1], (t[m, 3] - t[m, 2]) / 1e3, left=t[m, 2] / 1e3, height=0.9, color=cmap(j % 10),
                label=names[k] if k < len(names) else f"kind {k}", linewidth=0)
    ax.set_xlabel("us from the first task's start")
    ax.set_ylabel("program")
    ax.set_title(title, fontsize=10)
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def print_stored(path: Path, plot_dir: Path | None = None) -> int:
    """``--from``: the read phases of every traced launch in a stored trace.jsonl (no GPU);
    ``plot_dir``: also each launch's timeline (``plot_timeline``) as <stem>_<case>_<label>.png there."""
    from megamoe.reference.tiles import KINDS

    shown = 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"megakernel_trace --from {path}: line {n} is not JSON ({exc.msg})") from None
        for label, d in (row.items() if isinstance(row, dict) else ()):
            if not (isinstance(d, dict) and d.get("tasks") and "task_weight_bytes" in d):
                continue
            shown += 1
            names = d.get("kind_names")
            if names is None:  # a row written before rows named their kinds
                names = KINDS
                print(f"{row.get('case')} {label}: kinds read as reference.tiles.KINDS numbers them today "
                      f"(before commit cfac3c0, 2026-12-07, expert_slice was kind 6)", flush=True)
            ph = read_phases(d["tasks"], d["task_weight_bytes"], names)
            span = max(r[3] for r in d["tasks"]) / 1e3
            mb = sum(d["task_weight_bytes"]) / 1e6
            print(f"{row.get('case')} {label}: {d.get('us', float('nan')):.1f} us, span {span:.1f} us, {mb:.1f} MB of "
                  f"weights ({mb / span:.2f} TB/s over the span), {d.get('programs')} programs", flush=True)
            for k, v in ph.items():
                lo, mid, hi = v["window_us"]
                print(f"      {k:<14} {v['programs']:4d} programs  {v['weight_mb']:8.1f} MB  starts {lo:7.1f}"
                      f" (median {mid:7.1f}), ends {hi:7.1f} us  {v['read_tb_s']:.2f} TB/s", flush=True)
            if plot_dir is not None:
                case = str(row.get("case")).replace(":", "_")
                png = plot_dir / f"{path.stem}_{case}_{label}.png"
                plot_timeline(d["tasks"], names, f"{row.get('case')} {label}, {row.get('gpu', '?')}, commit "
                              f"{row.get('commit', '?')}: {d.get('us', float('nan')):.1f} us", png)
                print(f"      timeline: {png}", flush=True)
    if not shown:
        raise SystemExit(f"megakernel_trace --from {path}: no traced launch (a row's \"tasks\") in it")
    return 0


def _routed_case(cfg, w, xs: list):
    """The routed experts alone on the layer's own routing (what ``moe_experts(backend="megakernel")``
    launches after its routing check): (config, weights, inputs (x, topk_idx int32, topk_w fp32))."""
    import torch

    from megamoe.kernels import moe as kmoe
    from megamoe.kernels.megakernel import experts_layer

    ecfg, ew = experts_layer(w.gate_up, w.down, None, None, cfg.top_k, cfg.activation, cfg.swiglu_alpha,
                             cfg.swiglu_limit)
    ins = []
    for x in xs:
        d = kmoe.moe_forward_details(x, w, cfg)
        ins.append((x, d["topk_idx"].to(torch.int32).contiguous(), d["topk_weights"].float().contiguous()))
    return ecfg, ew, ins


def trace_variant(label: str, mk: dict, call, cfg, counts, T: int, ins: list, args, plan_bytes: dict, *,
                  given: bool = False) -> dict:
    """One config traced (every call of a graph, or one eager call) and timed untraced; printed.
    ``call(a, mk, **kw)`` runs the megakernel on input ``a`` (kw: ``trace``, ``record``); ``given``:
    the routing is given (the plan's top-k tasks only read it)."""
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels.megakernel import trace_rows
    from megamoe.reference.tiles import KINDS, task_plan

    _, ran = call(ins[0], mk, record=True)
    plan = task_plan(cfg, counts, T, mk["tiles"], num_programs=ran["programs"], routing_given=given, **plan_bytes)
    rows, mt = trace_rows(cfg, T, mk, ran["programs"])
    P = ran["programs"]
    if args.eager:  # one eager call, traced
        tr = torch.zeros((rows, 3), device="cuda", dtype=torch.int64)
        call(ins[0], mk, trace=tr)
        torch.cuda.synchronize()
        traced_us, graph = None, {}
    else:  # every call of a graph of len(ins) calls traced, each into its own buffer, as the layer is timed
        trs = [torch.zeros((rows, 3), device="cuda", dtype=torch.int64) for _ in ins]
        traced_us = kb.graph_time_us(lambda a: call(a[0], mk, trace=a[1]), list(zip(ins, trs)), args.reps)
        torch.cuda.synchronize()
        graph = graph_edges([t.cpu().numpy()[mt:mt + P] for t in trs])
        tr = trs[0]  # the first call's tasks (the routing of the first input, which the plan counts)
    tra = tr.cpu().numpy()
    trn = tra[:plan.num_tasks]
    summ = summarize(trn, plan.kind, KINDS)
    summ.update(program_phases(trn, tra[mt:mt + P], tra[mt + P]))
    summ.update(graph, traced_us=traced_us)
    us = kb.graph_time_us(lambda a: call(a, mk), ins, args.reps)
    t0 = int(trn[:, 1].min())
    tasks = [[int(k), int(p_), int(a) - t0, int(b) - t0] for k, (p_, a, b) in zip(plan.kind, trn)]
    print(f"{label:<13} mk {us:8.1f} us  span {summ['span_us']:8.1f}  busy {summ['busy_fraction']:.2f}  "
          f"regs {ran['n_regs']} spills {ran['n_spills']} smem {ran['shared_bytes']} P {P}", flush=True)
    if graph:
        print(f"      in a graph of {len(ins)} traced calls ({traced_us:.1f} us a call): kernel "
              f"{graph['kernel_us']:.2f} us (first program in to last out), gap to the next call's first "
              f"program {graph['gap_us']:.2f} us (means over the calls)", flush=True)
    print(f"      programs: first ticket asked {summ['programs_first_us']:.2f} us before the first task,"
          f" last exit {summ['programs_exit_us']:.2f} us after the last task ends;"
          f" top-k task 0: logits seen {summ['topk_seen_us']:.2f}, routed {summ['topk_routed_us']:.2f},"
          f" aligned {summ['topk_done_us']:.2f} us", flush=True)
    for k, d in summ["kinds"].items():
        print(f"      {k:<14} n {d['tasks']:6d}  mean {d['mean_us']:7.2f}  max {d['max_us']:7.2f}  "
              f"start {d['first_start_us']:8.1f}  end {d['last_end_us']:8.1f}", flush=True)
    for k, v in read_phases(tasks, plan.weight_bytes, KINDS).items():
        print(f"      {k:<14} reads {v['weight_mb']:.1f} MB on {v['programs']} programs, {v['read_tb_s']:.2f} TB/s "
              f"from its first start to its last end", flush=True)
    return {"us": us, "mk": mk, "regs": ran["n_regs"], "spills": ran["n_spills"], "shared_bytes": ran["shared_bytes"],
            "programs": P, "trace": summ, "tasks": tasks, "task_weight_bytes": [int(v) for v in plan.weight_bytes],
            "kind_names": list(KINDS)}


def case_inputs(name: str, T: int, rest: list, w, cfg):
    """The case's weights (router zeroed for "concentrated", steered for a validation routing) and
    its 8 inputs."""
    import torch

    if rest and rest[0] == "concentrated":
        w = type(w)(**{**w.arrays(), "router_weight": torch.zeros_like(w.router_weight)})
    gen = torch.Generator(device="cuda").manual_seed(7 + T)
    xs = [torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(8)]
    if rest and rest[0] != "concentrated":  # a validation routing (zipf, ...): inputs and router steered as
        from megamoe.grid import routing_bias, steer_inputs  # megamoe validate steers them

        xs, rw = steer_inputs(xs, w.router_weight, routing_bias(cfg, rest[0], 0))
        w = type(w)(**{**w.arrays(), "router_weight": rw})
    return w, xs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder of trace.jsonl (required unless --from)")
    p.add_argument("--from", dest="stored", type=Path, default=None,
                   help="print the read phases of a stored trace.jsonl (no GPU) and exit")
    p.add_argument("--plot", type=Path, default=None,
                   help="with --from: also write each traced launch's timeline (a PNG per launch) to this folder")
    p.add_argument("--cases", default="qwen3-30b-a3b:1,deepseek-v3:1,gpt-oss-120b:1,qwen3-30b-a3b:64:concentrated")
    p.add_argument("--variants", default="", help="comma-separated names of megakernel_variants.VARIANTS")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--eager", action="store_true", help="trace one eager call, "
                   "not every call of the timed graph")
    p.add_argument("--fp8", choices=["weights", "weights+act"], default=None,
                   help="trace the FP8 megakernel (and time the FP8 multi-launch path beside it)")
    p.add_argument("--routed", action="store_true", help="also trace the routed experts alone on the layer's "
                   "routing (moe_experts' megakernel launch), beside the layer")
    args = p.parse_args(argv)
    if args.plot is not None and args.stored is None:
        p.error("--plot draws a stored trace: give --from FILE")
    if args.stored is not None:
        if not args.stored.is_file():
            p.error(f"--from {args.stored}: no such file")
        if args.plot is not None:
            args.plot.mkdir(parents=True, exist_ok=True)
        return print_stored(args.stored, args.plot)
    if not args.out:
        p.error("--out is required (or --from FILE)")
    import torch  # the traced run's imports: --from reads stored rows without them

    from megamoe.kernels import bench as kb
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels.fp8_weights import to_fp8
    from megamoe.kernels.megakernel import megakernel_config, megakernel_forward
    from megamoe.simulator.cost import weight_bytes_per_element

    fp8 = args.fp8
    act8 = fp8 == "weights+act"
    plan_bytes = ({"act_bytes": 1 if act8 else 2, "weight_bytes": weight_bytes_per_element("fp8_e4m3")}
                  if fp8 else {})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prov = kb.provenance()
    weights = {}
    for case in args.cases.split(","):
        name, T, *rest = case.split(":")
        T = int(T)
        cfg = kb.bench_config(name)
        if name not in weights:
            weights.clear()
            torch.cuda.empty_cache()
            weights[name] = kb.random_device_weights(cfg)
            if fp8:  # the router stays bf16 (to_fp8)
                weights[name] = to_fp8(weights[name])
        w, xs = case_inputs(name, T, rest, weights[name], cfg)
        base = megakernel_config(cfg, T, torch.bfloat16, xs[0].device, fp8=fp8)
        variants = variant_configs(base, args.variants.split(",") if args.variants else [])
        row = {"case": case, "preset": name, "T": T, "fp8": fp8, **prov}
        row["multi_us"] = kb.graph_time_us(lambda a, w=w, cfg=cfg: kmoe.moe_forward(
            a, w, cfg, backend="multi", check=False, fp8_activations=act8), xs, args.reps)
        print(f"{case}: multi-launch layer {row['multi_us']:.1f} us", flush=True)
        counts = np.bincount(kmoe.moe_forward_details(xs[0], w, cfg)["topk_idx"].cpu().numpy().ravel(),
                             minlength=cfg.num_experts)

        def layer(a, mk, w=w, cfg=cfg, **kw):
            return megakernel_forward(a, w, cfg, mk=mk, fp8=fp8, **kw)

        jobs = [(label, mk, layer, cfg, xs) for label, mk in variants]
        if args.routed and not fp8:
            ecfg, ew, ins = _routed_case(cfg, w, xs)

            def routed(a, mk, ew=ew, ecfg=ecfg, **kw):
                return megakernel_forward(a[0], ew, ecfg, mk=mk, routing=(a[1], a[2]), **kw)

            emk = megakernel_config(ecfg, T, torch.bfloat16, xs[0].device, routing_given=True)
            jobs.append(("routed", emk, routed, ecfg, ins))
            r = emk["tiles"]["router"]
            if r.get("EACH") or r.get("ALIGN_EACH"):  # beside one top-k task that aligns every token, waited for
                r = {**r, "EACH": 0, "ALIGN_EACH": 0, "BLOCK_T": 16, "TOPK_T": 16}
                jobs.append(("routed_topk_task", {**emk, "tiles": {**emk["tiles"], "router": r}}, routed, ecfg, ins))
            row["experts_multi_us"] = kb.graph_time_us(lambda a, w=w: kmoe.moe_experts(
                a[0], a[1], a[2], w.gate_up, w.down, backend="multi", check=False), ins, args.reps)
            row["experts_megakernel_us"] = kb.graph_time_us(lambda a, w=w: kmoe.moe_experts(
                a[0], a[1], a[2], w.gate_up, w.down, backend="megakernel", check=False), ins, args.reps)
            print(f"{case}: moe_experts multi {row['experts_multi_us']:.1f} us, megakernel "
                  f"{row['experts_megakernel_us']:.1f} us (routing check included)", flush=True)
        for label, mk, call, c, ins_ in jobs:
            print(f"{case:<34} ", end="")
            try:
                row[label] = trace_variant(label, mk, call, c, counts, T, ins_, args, plan_bytes,
                                           given=label.startswith("routed"))
            except Exception as exc:  # noqa: BLE001 - record and go on
                row[label] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
                print(f"{case} {label} failed: {row[label]['error']}", flush=True)
        with (out / "trace.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
