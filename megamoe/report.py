"""The validation report: stored rows read back, their statistics (median and largest
|pred - meas| / meas per profile and backend, per-stage errors, configurations outside 15% and
their likely cause), and report.json, report.md and scatter.png.
"""

from __future__ import annotations

import json
from pathlib import Path

OUTLIER = 0.15  # |pred - meas| / meas beyond which the report lists a configuration
#: the multi-launch stage groups as measured (kernels.bench.stage_split) -> the plan stages' name prefixes
STAGE_GROUPS = {"router+align": ("router", "align"), "gemm1": ("quantize_x", "gemm1"), "gemm2": ("gemm2", "shared"),
                "combine": ("combine",)}


def stage_group(name: str) -> str | None:
    """The measured stage group (STAGE_GROUPS) of a launch-plan stage, None if none holds it."""
    return next((g for g, pre in STAGE_GROUPS.items() if name.startswith(pre)), None)


def stage_errors(rows: list[dict]) -> dict:
    """Per measured stage group of multi-launch rows with ``measured_stages_us``: signed errors of
    the group's summed predicted stages, their median, median |error| and max |error|. Groups
    under 2 us measured are left out."""
    import numpy as np

    errs: dict[str, list] = {g: [] for g in STAGE_GROUPS}
    for r in rows:
        for g, (p, m, _) in _stage_gaps(r).items():
            if m >= 2.0:
                errs[g].append(((p - m) / m, r))
    out = {}
    for g, es in errs.items():
        if not es:
            continue
        e = np.array([x for x, _ in es])
        worst = max(es, key=lambda x: abs(x[0]))
        out[g] = {"configurations": int(e.size), "median_error": float(np.median(e)),
                  "median_abs_error": float(np.median(np.abs(e))), "max_abs_error": float(np.abs(e).max()),
                  "worst": {k: worst[1][k] for k in ("preset", "T", "routing")} | {"error": worst[0]}}
    return out


def _row_files(src: Path) -> list[Path]:
    if not src.is_dir():
        return [src]
    return sorted(src.glob("validation_*.jsonl")) or sorted(src.glob("*.jsonl"))


def _last_rows(src: str | Path) -> tuple[dict, dict]:
    """({key: last row with predicted_us and measured_us}, {key: last row}) of a jsonl file or a
    folder's validation_*.jsonl (else *.jsonl); lines that are not JSON objects are skipped."""
    from .report_rows import row_problem

    measured: dict = {}
    last: dict = {}
    for p in _row_files(Path(src)):
        for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue
            if not isinstance(r, dict) or "T" not in r or row_problem(r):  # counted by report_rows.scan
                continue
            r.setdefault("routing", "uniform")
            r.setdefault("backend", "multi")
            r.setdefault("preset", r.get("model"))
            key = (r["preset"], r["T"], r["routing"], r["backend"])
            last[key] = r
            if r.get("predicted_us") is not None and r.get("measured_us") is not None:
                measured[key] = r
    return measured, last


def load_rows(src: str | Path) -> list[dict]:
    """Measured rows from a jsonl file or every validation_*.jsonl / *.jsonl in a folder: the last
    row per (preset, T, routing, backend) that has both predicted_us and measured_us."""
    return list(_last_rows(src)[0].values())


def borrow_counts(rows: list[dict], src: str | Path) -> tuple[list[dict], int]:
    """(rows, how many took counts): rows without ``counts`` take counts and calls_per_graph of the
    same configuration among ``src``'s measured rows."""
    other = {(o["preset"], o["T"], o["routing"], o["backend"]): o for o in load_rows(src) if "counts" in o}
    out, n = [], 0
    for r in rows:
        o = other.get((r["preset"], r["T"], r["routing"], r["backend"]))
        if "counts" not in r and o is not None:
            r = {**r, "counts": o["counts"], "calls_per_graph": o.get("calls_per_graph", 1), "counts_from": str(src)}
            n += 1
        out.append(r)
    return out, n


def load_outcomes(src: str | Path) -> tuple[list[dict], list[dict]]:
    """(measured rows as ``load_rows``, failed rows): a configuration failed when it has no
    measured row and its last row is a failure, or only its prediction (the run ended during it)."""
    measured, last = _last_rows(src)
    failed = []
    for key, r in last.items():
        if key in measured or r.get("phase") not in ("failed", "prediction"):
            continue
        if r.get("phase") == "prediction":
            r = {**r, "phase": "failed", "failure": "no measurement row: the run ended during this configuration"}
        failed.append(r)
    return list(measured.values()), failed


def _stage_gaps(r: dict) -> dict:
    """{group: (predicted us, measured us, the group's largest predicted plan stage)} of a multi row
    that carries both ``predicted_stages`` and ``measured_stages_us`` (STAGE_GROUPS); {} otherwise."""
    meas, pred = r.get("measured_stages_us"), r.get("predicted_stages")
    if not meas or not pred:
        return {}
    sums: dict[str, float] = {}
    top: dict[str, str] = {}
    for name, v in pred.items():
        g = stage_group(name)
        if g:
            sums[g] = sums.get(g, 0.0) + float(v["us"])
            if g not in top or float(v["us"]) > float(pred[top[g]]["us"]):
                top[g] = name
    return {g: (sums[g], float(m), top[g]) for g, m in meas.items() if g in sums}


def _term_of(stage: dict, r: dict, name: str) -> str:
    """The model term behind predicted stage (or task kind) ``name`` of row ``r``: its ``term``,
    else from its bound or the row's ``dominant`` ("part:bound") for the same part."""
    from megamoe.simulator.cost import term_name

    if stage.get("term"):
        return stage["term"]
    bound = stage.get("bound")
    dom, _, dom_bound = (r.get("dominant") or "").partition(":")
    if bound is None and dom == name and dom_bound:
        bound = dom_bound
    if bound is None:
        return "a term this row does not record"
    if bound == "memory":
        return "memory traffic (HBM, L2 hits or the SMs' intake: this row does not record which)"
    return term_name(bound)


def likely_cause(r: dict) -> str:
    """Why a configuration is off, as far as the row can tell: with ``measured_stages_us``, the
    stage group with the largest gap, its plan stage with the most predicted time and that stage's
    term; otherwise the prediction's dominant part and term."""
    err = (r["predicted_us"] - r["measured_us"]) / r["measured_us"]
    side = "over-predicted" if err > 0 else "under-predicted"
    gaps = _stage_gaps(r)
    noise = {g: v for g, v in gaps.items() if v[1] <= 0}
    gaps = {g: v for g, v in gaps.items() if v[1] > 0}
    said = ""
    if noise:
        said = "; " + ", ".join(f"{g} measured {v[1]:.1f} us" for g, v in noise.items()) + (
            " (the whole layer's graph timed faster than its prefix's: the prefixes' timings disagree with it "
            "by that much, so this row's stage split is noise there)")
    if gaps:
        same = {g: v for g, v in gaps.items() if (v[0] - v[1]) * err > 0} or gaps
        g = max(same, key=lambda k: abs(same[k][0] - same[k][1]))
        p, m, stage = same[g]
        return (f"{side}: largest stage gap {g}, predicted {p:.1f} us against {m:.1f} measured ({(p - m) / m:+.0%}); "
                f"its stage {stage} is priced by {_term_of(r['predicted_stages'][stage], r, stage)}{said}")
    why = ("no per-stage figures in this row (one persistent launch)" if r.get("backend") == "megakernel"
           else "no per-stage figures in this row") + said
    pred = r.get("predicted_stages") or {}
    if pred:
        main = max(pred, key=lambda k: float(pred[k]["us"]))
        total = sum(float(v["us"]) for v in pred.values())
        part = "critical path" if r.get("backend") == "megakernel" else "stages"
        return (f"{side}; {why}; the prediction's {part}: mostly {main} ({float(pred[main]['us']):.0f} of "
                f"{total:.0f} us), priced by {_term_of(pred[main], r, main)}")
    dom = r.get("dominant")
    if dom:
        from megamoe.simulator.cost import term_name

        name, _, bound = dom.partition(":")
        term = r.get("dominant_term") or (
            "memory traffic (this row does not record which term)" if bound == "memory" else term_name(bound or "wait"))
        return f"{side}; {why}; the prediction's dominant part is {name}, priced by {term}"
    return f"{side}; {why} and no prediction detail (a row rebuilt from a log: re-predict it for the dominant term)"


def _abs_err(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas


def report_stats(rows: list[dict]) -> dict:
    """Errors of the rows' own predictions (``predicted_us``: the profile the run was given) overall
    and by backend, of every profile the rows also hold (``predictions``), and the outliers."""
    import numpy as np

    err = np.array([_abs_err(r["predicted_us"], r["measured_us"]) for r in rows])
    out = {"configurations": len(rows), "median_abs_error": float(np.median(err)) if err.size else None,
           "max_abs_error": float(err.max()) if err.size else None, "by_backend": {},
           "profiles": sorted({r["profile"] for r in rows if r.get("profile")}), "by_profile": {}}
    for b in sorted({r["backend"] for r in rows}):
        e = np.array([_abs_err(r["predicted_us"], r["measured_us"]) for r in rows if r["backend"] == b])
        out["by_backend"][b] = {"configurations": int(e.size), "median_abs_error": float(np.median(e)),
                                "max_abs_error": float(e.max())}
    per: dict[str, dict[str, list]] = {}
    for r in rows:
        for name, p in (r.get("predictions") or {}).items():
            if isinstance(p.get("predicted_us"), (int, float)):
                per.setdefault(name, {}).setdefault(r["backend"], []).append(_abs_err(p["predicted_us"], r["measured_us"]))
    for name, by in sorted(per.items()):
        e = np.array([v for vs in by.values() for v in vs])
        out["by_profile"][name] = {"configurations": int(e.size), "median_abs_error": float(np.median(e)),
                                   "max_abs_error": float(e.max()), "outside_15pct": int((e > OUTLIER).sum()),
                                   "by_backend": {b: float(np.median(v)) for b, v in sorted(by.items())}}
    out["outside_15pct"] = sorted(
        ({"preset": r["preset"], "T": r["T"], "routing": r["routing"], "backend": r["backend"],
          "predicted_us": r["predicted_us"], "measured_us": r["measured_us"],
          "error": (r["predicted_us"] - r["measured_us"]) / r["measured_us"], "likely_cause": likely_cause(r)}
         for r in rows if abs(r["predicted_us"] - r["measured_us"]) > OUTLIER * r["measured_us"]),
        key=lambda x: -abs(x["error"]))
    out["stages"] = stage_errors(rows)
    return out


def write_report(rows: list[dict], out: Path, *, notes=(), failures=(), run: dict | None = None) -> dict:
    """report.json, report.md and scatter.png in ``out`` from measured ``rows``, listing
    ``failures``; ``run`` (the GPU run's summary) goes into report.json. Returns the statistics."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    st = report_stats(rows)
    st["notes"] = list(notes)
    st["failed"] = [{"preset": f.get("preset"), "T": f.get("T"), "routing": f.get("routing"), "backend": f.get("backend"),
                     "failure": f.get("failure")} for f in failures]
    if run is not None:
        st["run"] = {k: v for k, v in run.items() if k != "lines"}
    (out / "report.json").write_text(json.dumps(st, indent=1, default=str))
    head = [f"# Predicted vs measured: {st['configurations']} configurations"
            + (f" ({len(failures)} more failed)" if failures else ""), ""]
    if rows:
        own = ", ".join(st["profiles"]) or "the run's profile"
        head.append(f"median |pred - meas| / meas = {st['median_abs_error']:.1%}, max = {st['max_abs_error']:.1%} ({own})")
        for b, s in st["by_backend"].items():
            head.append(f"- {b}: {s['configurations']} configurations, median {s['median_abs_error']:.1%}, "
                        f"max {s['max_abs_error']:.1%}")
        for name, s in st["by_profile"].items():
            head.append(f"- profile {name}: median {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%} over "
                        f"{s['configurations']}, {s['outside_15pct']} outside {OUTLIER:.0%} ("
                        + ", ".join(f"{b} {v:.1%}" for b, v in s["by_backend"].items()) + ")")
    head += [f"- note: {n}" for n in notes]
    lines = head + ["", f"## Outside {OUTLIER:.0%}", "",
                    "| preset | T | routing | backend | predicted us | measured us | error | likely cause |",
                    "|---|---|---|---|---|---|---|---|"]
    for o in st["outside_15pct"]:
        lines.append(f"| {o['preset']} | {o['T']} | {o['routing']} | {o['backend']} | {o['predicted_us']:.1f} | "
                     f"{o['measured_us']:.1f} | {o['error']:+.1%} | {o['likely_cause']} |")
    if st["stages"]:
        lines += ["", "## Multi-launch stages, predicted vs measured", "",
                  "Measured: CUDA-graph times of the pipeline's prefixes (router and align; + GEMM 1; + GEMM 2 and "
                  "the shared MLP), their differences; the combine is the layer less the GEMM 2 prefix. "
                  "Error: (predicted - measured) / measured.", "",
                  "| stage | configurations | median error | median abs | max abs | worst at |", "|---|---|---|---|---|---|"]
        for g, e in st["stages"].items():
            w = e["worst"]
            lines.append(f"| {g} | {e['configurations']} | {e['median_error']:+.1%} | {e['median_abs_error']:.1%} | "
                         f"{e['max_abs_error']:.1%} | {w['preset']} T={w['T']} {w['routing']} ({w['error']:+.1%}) |")
    lines += clock_lines(rows)
    if failures:
        lines += ["", "## Failed", "", "| preset | T | routing | backend | error |", "|---|---|---|---|---|"]
        for f in st["failed"]:
            msg = str(f["failure"]).replace("|", "/").replace("\n", " ")[:300]
            lines.append(f"| {f['preset']} | {f['T']} | {f['routing']} | {f['backend']} | {msg} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    if rows:
        _scatter(rows, out / "scatter.png")
    print("\n".join(head))
    print(f"{len(st['outside_15pct'])} configuration(s) outside {OUTLIER:.0%}; see {out / 'report.md'}, {out / 'scatter.png'}")
    return st


#: rows whose clock the report lists: the long ones, where the cost model lowers the MMA rate
CLOCK_MIN_T = 512


def clock_lines(rows: list[dict]) -> list[str]:
    """The report's section on the SM clock the layers ran at (``measured_clock``) beside the cost
    model's assumed MMA-rate fraction (``predicted_sustained_ratio``); nothing for rows without it."""
    sel = [r for r in rows if (r.get("measured_clock") or {}).get("sm_clock_mhz") and int(r["T"]) >= CLOCK_MIN_T]
    if not sel:
        return []
    top = max(r["measured_clock"]["sm_clock_mhz"]["max"] for r in sel)
    out = ["", "## SM clock during the timed replays", "",
           f"Sampled by NVML every few ms over each row's timed replays (kernels/telemetry.py); clock ratio = "
           f"mean / {top:.0f} MHz (the highest sampled in these rows). The model's ratio is the mean MMA rate it "
           "assumed over the measured replay's busy window as a fraction of the short-launch rate "
           "(the cost model's sustained-clock term; rate falls less than clock where memory terms bound).", "",
           "| preset | T | routing | backend | error | model's ratio | clock mean MHz | min | clock ratio | power W |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(sel, key=lambda r: (r["preset"], int(r["T"]), r["routing"], r["backend"])):
        c = r["measured_clock"]["sm_clock_mhz"]
        ratio = r.get("predicted_sustained_ratio")
        pw = (r["measured_clock"].get("power_w") or {}).get("mean")
        err = (r["predicted_us"] - r["measured_us"]) / r["measured_us"]
        out.append(f"| {r['preset']} | {r['T']} | {r['routing']} | {r['backend']} | {err:+.1%} | "
                   + (f"{ratio:.3f}" if isinstance(ratio, float) else "-")
                   + f" | {c['mean']:.0f} | {c['min']:.0f} | {c['mean'] / top:.3f} | "
                   + (f"{pw:.0f}" if pw is not None else "-") + " |")
    return out


def _scatter(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    colours = {"multi": "tab:blue", "megakernel": "tab:orange"}
    values = []
    for b in sorted({r["backend"] for r in rows}):
        sel = [r for r in rows if r["backend"] == b]
        own = sorted({r["profile"] for r in sel if r.get("profile")})
        ax.scatter([r["measured_us"] for r in sel], [r["predicted_us"] for r in sel], s=14,
                   c=colours.get(b, "tab:gray"), label=f"{b} ({len(sel)})" + (f", {', '.join(own)}" if own else ""),
                   alpha=0.8)
        values += [v for r in sel for v in (r["measured_us"], r["predicted_us"])]
        # the other profiles' predictions (not the "<profile>+<label>" variants): hollow markers
        others = sorted({n for r in sel for n in (r.get("predictions") or {})
                         if n != r.get("profile") and "+" not in n})
        for name, marker in zip(others, "^sDv"):
            pts = [(r["measured_us"], r["predictions"][name]["predicted_us"]) for r in sel
                   if isinstance(r["predictions"].get(name, {}).get("predicted_us"), (int, float))]
            if pts:
                ax.scatter(*zip(*pts), s=16, marker=marker, facecolors="none", edgecolors=colours.get(b, "tab:gray"),
                           alpha=0.7, label=f"{b}, {name}")
                values += [v for pt in pts for v in pt]
    lo = min(v for v in values if v > 0) * 0.7
    hi = max(values) * 1.4
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="y = x")
    ax.plot([lo, hi], [lo * (1 + OUTLIER), hi * (1 + OUTLIER)], "k:", lw=0.6)
    ax.plot([lo, hi], [lo * (1 - OUTLIER), hi * (1 - OUTLIER)], "k:", lw=0.6, label=f"+-{OUTLIER:.0%}")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured us", ylabel="predicted us",
           title="one MoE layer on one GPU: cost model vs measurement")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
