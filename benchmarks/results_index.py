"""The results index and the tables made from it (no GPU needed).

    python benchmarks/results_index.py            # rewrite index.jsonl, docs/results.md and README's tables
    python benchmarks/results_index.py --check    # exit 1 if any of the three is out of date

Stored results live in ``benchmarks/results/<gpu>/<question>/``: ``<gpu>`` names what was measured or
predicted (``h200``, ``gb200-nvl72``; ``cpu`` for the simulator's own speed), ``<question>`` one of
QUESTIONS. Each data file (``*.jsonl``, ``*.json``, ``*.jsonl.gz``; a folder holding a ``report.md`` is
one result) gets one line of ``benchmarks/results/index.jsonl``: gpu, device, versions (torch, triton,
cuda; python and numba for CPU rows), commit, date, question, path, rows, tool; every field read from
the rows' own provenance. A field the rows lack keeps the value the index already holds.

The tables in ``docs/results.md`` and between the ``<!-- results:NAME -->`` markers of ``README.md``
are made here, from the rows the index lists; each ends with its provenance.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "index.jsonl"
README = ROOT / "README.md"
RESULTS_MD = ROOT / "docs" / "results.md"

#: question -> (what it answers, the command that writes it)
QUESTIONS = {
    "validation": ("the cost model against the GPU: every configuration predicted, then measured",
                   "benchmarks/gpu_validate.sh OUT 320"),
    "kernels": ("the multi-launch layer against the floor, PyTorch and vLLM (and the model's price of those rows)",
                "megamoe bench --breakdown; megamoe validate --from-bench ROWS"),
    "megakernel": ("the persistent megakernel against the multi-launch path, PyTorch and the floor",
                   "python benchmarks/bench_megakernel.py --out DIR"),
    "megakernel_trace": ("where the megakernel's time goes, task by task", "python benchmarks/megakernel_trace.py --out DIR"),
    "prefill": ("prefill GEMMs and router against the ideal grouped GEMM and the floor",
                "python benchmarks/bench_prefill.py --out DIR; python benchmarks/bench_router.py --out DIR"),
    "fp8_prefill": ("FP8 weights (and activations) against bf16 at prefill",
                    "megamoe bench --dtype bf16,fp8-act; python benchmarks/bench_fp8w.py; python benchmarks/bench_fp8a.py"),
    "fp8_decode": ("the FP8 megakernel at decode against FP8 multi-launch and the bf16 megakernel",
                   "python benchmarks/bench_megakernel.py --fp8 weights+act --out DIR"),
    "launches": ("the multi-launch layer launch by launch, beside the model's price of each",
                 "python benchmarks/profile_launches.py --out DIR"),
    "ep_fused": ("one rank's part of the fused expert-parallel layer, ranks emulated on one GPU",
                 "python benchmarks/bench_ep_fused.py --out DIR"),
    "sustained": ("a dense GEMM's rate over long CUDA graphs (clocks under sustained MMA)",
                  "python benchmarks/bench_sustained.py --out DIR"),
    "stream": ("how fast one program per SM streams weights", "python benchmarks/bench_stream.py --out DIR"),
    "sync": ("flag handoff, grid barrier and tickets inside one persistent kernel", "python benchmarks/bench_sync.py --out DIR"),
    "cold_start": ("the first call of a (backend, T) with an empty Triton cache and after megamoe compile",
                   "python benchmarks/cold_start.py --out DIR"),
    "compile_audit": ("every launch compiled for sm_90 (no GPU), flagged past an H200 block's limits",
                      "python benchmarks/compile_audit.py --out DIR"),
    "scenarios": ("predicted DeepSeek-V3 and Kimi K2 layers on the rack", "python benchmarks/simulator_scenarios.py"),
    "rack_calibration": ("the communication-SM curve fitted to published points", "python benchmarks/rack_calibration.py"),
    "simulator_speed": ("how fast the simulator predicts a layer", "python benchmarks/bench_simulator.py"),
    "sweep_speed": ("how fast megamoe sweep runs thousands of points", "python benchmarks/bench_sweep.py"),
    "tune": ("the launch-config candidates timed on the GPU against the cost model's choice, each (preset, T) "
             "kept as a tuned entry only where 2% faster", "megamoe tune --out benchmarks/results/<gpu>/tune/tune_DATE.jsonl"),
    "eager": ("host time of eager calls (moe_forward, bind, bind with graphs, moe_experts) and moe_experts' "
              "no-wait proof", "python benchmarks/bench_host.py --out FILE.jsonl"),
    "peer": ("megamoe's backends against a same-run peer (vLLM's Triton fused-MoE kernels), the floor and the "
             "cost model's prediction", "python benchmarks/peer_table.py --peer benchmarks/peer_vllm.py --out DIR"),
}
DATA_SUFFIXES = (".jsonl", ".json", ".jsonl.gz")
#: files inside a result folder that belong to it, not results of their own
FOLDER_PARTS = {"profile.json", "microbench.json", "report.json"}


def read_rows(path: Path) -> list[dict]:
    """The JSON rows of a .jsonl, .jsonl.gz or .json file (a .json file is one row)."""
    if path.name.endswith(".jsonl.gz"):
        text = gzip.open(path, "rt").read()
    else:
        text = path.read_text()
    if path.suffix == ".json":
        return [json.loads(text)]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _cuda_of(torch_version: str | None) -> str | None:
    m = re.search(r"\+cu(\d+)(\d)$", torch_version or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _most_common(values) -> str | None:
    values = [v for v in values if v]
    return Counter(values).most_common(1)[0][0] if values else None


def provenance(rows: list[dict]) -> dict:
    """gpu name, versions, commit and date as the rows record them (the most common value of each)."""
    flat = []
    for r in rows:
        p = {**r, **(r.get("provenance") or {})}
        machine = p.get("machine") if isinstance(p.get("machine"), dict) else {}
        versions = p.get("versions") if isinstance(p.get("versions"), dict) else {}
        flat.append({"device": p.get("gpu") or machine.get("cpu") or p.get("cpu"),
                     "torch": p.get("torch"), "triton": p.get("triton"), "cuda": p.get("cuda") or _cuda_of(p.get("torch")),
                     "python": versions.get("python") or p.get("python"), "numba": versions.get("numba") or p.get("numba"),
                     "commit": p.get("commit") or p.get("git_commit"), "date": (p.get("date") or "")[:10] or None,
                     "dirty": p.get("dirty")})
    out = {k: _most_common(f[k] for f in flat) for k in ("device", "commit", "date")}
    if out["commit"]:
        out["commit"] = re.sub(r"^([0-9a-f]{7})[0-9a-f]*", r"\1", out["commit"])  # 7 hex digits; a suffix kept
    if _most_common(f["dirty"] for f in flat if f["dirty"] is not None) is True:
        out["dirty"] = True  # made from the commit with uncommitted changes
    out["versions"] = {k: v for k in ("torch", "triton", "cuda", "python", "numba")
                       if (v := _most_common(f[k] for f in flat))}
    return out


def stored_results() -> list[tuple[str, str, Path, Path]]:
    """(gpu, question, result path, rows file) of every stored result, in path order."""
    found = []
    for qdir in sorted(p for p in RESULTS.glob("*/*") if p.is_dir()):
        gpu, question = qdir.parent.name, qdir.name
        if question not in QUESTIONS:
            raise SystemExit(f"{qdir}: not a question this index knows ({', '.join(QUESTIONS)})")
        if (qdir / "report.md").exists():
            rows = sorted(f for f in qdir.glob("*.jsonl"))
            found.append((gpu, question, qdir, rows[0]))
            continue
        for f in sorted(qdir.iterdir()):
            if f.name.endswith(DATA_SUFFIXES) and f.name not in FOLDER_PARTS:
                found.append((gpu, question, f, f))
    return found


def build_index(old: dict[str, dict] | None = None) -> list[dict]:
    old = old or {}
    lines = []
    for gpu, question, path, rows_file in stored_results():
        rows = read_rows(rows_file)
        rel = str(path.relative_to(RESULTS))
        prov = provenance(rows)
        keep = old.get(rel, {})
        line = {"gpu": gpu, "device": prov["device"] or keep.get("device"),
                "versions": prov["versions"] or keep.get("versions", {}), "commit": prov["commit"] or keep.get("commit"),
                "date": prov["date"] or keep.get("date"), "question": question, "path": rel, "rows": len(rows),
                "tool": QUESTIONS[question][1], **({"dirty": True} if prov.get("dirty") else {})}
        lines.append(line)
    return lines


def load_index() -> list[dict]:
    return [json.loads(line) for line in INDEX.read_text().splitlines() if line.strip()] if INDEX.exists() else []


def index_text(lines: list[dict]) -> str:
    return "".join(json.dumps(x) + "\n" for x in lines)


# ---- tables -------------------------------------------------------------------------------------

PRESET_NAMES = {"qwen3-30b-a3b": "Qwen3-30B-A3B", "mixtral-8x7b": "Mixtral-8x7B", "deepseek-v3": "DeepSeek-V3",
                "qwen3-235b-a22b": "Qwen3-235B-A22B", "gpt-oss-120b": "gpt-oss-120b", "kimi-k2": "Kimi K2"}


def _name(preset: str) -> str:
    return PRESET_NAMES.get(preset, preset)


def _us(v) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 1000 else f"{v:,.1f}"


def md_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def commit_text(e: dict) -> str:
    """An index entry's commit as the tables print it: "-" for none, and saying so where the rows
    were made with uncommitted changes on top of it."""
    return str(e["commit"] or "-") + (" with uncommitted changes" if e.get("dirty") else "")


def prov_text(entries: list[dict]) -> str:
    """One provenance line for the index entries a table was made from, grouped by device and versions."""
    groups: dict[str, list[str]] = {}
    for e in entries:
        v = e.get("versions", {})
        head = ", ".join([str(e["device"])] + [f"{k} {v[k]}" for k in ("torch", "triton", "cuda", "python", "numba") if k in v])
        groups.setdefault(head, []).append(f"commit {commit_text(e)}, {e['date']} "
                                           f"([{Path(e['path']).name}](benchmarks/results/{e['path']}))")
    return "Provenance: " + "; ".join(f"{head}: {'; '.join(runs)}" for head, runs in groups.items()) + "."


def entries(index: list[dict], gpu: str, question: str) -> list[dict]:
    return [e for e in index if e["gpu"] == gpu and e["question"] == question]


def rows_of(es: list[dict]) -> list[dict]:
    """The rows of the entries, later files replacing earlier rows of the same key."""
    out = []
    for e in es:
        p = RESULTS / e["path"]
        if p.is_dir():
            p = sorted(p.glob("*.jsonl"))[0]
        out += read_rows(p)
    return out


def having(es: list[dict], *keys: str) -> tuple[list[dict], list[dict]]:
    """The entries whose rows carry every one of ``keys`` (what a table needs), and those rows."""
    kept = [e for e in es if all(k in rows_of([e])[0] for k in keys)]
    return kept, rows_of(kept)


def _err_stats(errs: list[float]) -> str:
    a = [abs(x) * 100 for x in errs]
    return f"{statistics.median(a):.1f}% / {max(a):.1f}% / {sum(x > 15 for x in a)}"


def validation_rows(index, gpu: str):
    es = entries(index, gpu, "validation")
    return es, [r for r in rows_of(es) if r.get("phase") == "measurement" and r.get("measured_us")]


def table_layer(index, gpu: str, routings=("uniform",)) -> str:
    es, rows = validation_rows(index, gpu)
    Ts = sorted({r["T"] for r in rows})
    by = {(r["preset"], r["routing"], r["T"], r["backend"]): r for r in rows}
    body = []
    for preset in dict.fromkeys(r["preset"] for r in rows):
        for routing in routings:
            cells = []
            for T in Ts:
                mk, mu = by.get((preset, routing, T, "megakernel")), by.get((preset, routing, T, "multi"))
                cells.append(f"{_us(mk and mk['measured_us'])} / {_us(mu and mu['measured_us'])}")
            errs = [r["error"] for r in rows if r["preset"] == preset and r["routing"] == routing]
            label = _name(preset) if len(routings) == 1 else f"{_name(preset)}, {routing}"
            body.append([label, *cells, _err_stats(errs)])
    header = ["preset" if len(routings) > 1 else f"preset ({routings[0]} routing)", *[f"T={T}" for T in Ts],
              "model error: median / max / outside 15%"]
    allerr = [r["error"] for r in rows]
    summary = (f"Whole layer with routing, CUDA-graph replays, us: megakernel / multi-launch. The cost model "
               f"predicted each of the {len(rows)} configurations (3 routings x 2 backends) before it ran, from "
               f"a profile calibrated minutes earlier on the same GPU: median |error| {_err_stats(allerr).split(' / ')[0]}, "
               f"max {_err_stats(allerr).split(' / ')[1]}, {_err_stats(allerr).split(' / ')[2]} outside 15%.")
    return "\n\n".join([md_table(header, body), summary, prov_text(es)])


def table_accuracy(index, gpu: str) -> str:
    es, rows = validation_rows(index, gpu)
    body = []
    for preset in dict.fromkeys(r["preset"] for r in rows):
        for backend in ("megakernel", "multi"):
            errs = [r["error"] for r in rows if r["preset"] == preset and r["backend"] == backend]
            body.append([_name(preset), backend, str(len(errs)), _err_stats(errs)])
    for backend in ("megakernel", "multi"):
        errs = [r["error"] for r in rows if r["backend"] == backend]
        body.append(["all", backend, str(len(errs)), _err_stats(errs)])
    body.append(["all", "both", str(len(rows)), _err_stats([r["error"] for r in rows])])
    return "\n\n".join([md_table(["preset", "backend", "configurations", "|error| median / max / outside 15%"], body),
                        prov_text(es)])


def table_h200_kernels(index) -> str:
    es, rows = having(entries(index, "h200", "kernels"), "ours_over_floor")
    Ts = sorted({r["T"] for r in rows})
    by = {(r["preset"], r["T"]): r for r in rows}
    body = [[_name(p), *[f"{by[(p, T)]['ours_over_floor']:.2f}" if (p, T) in by else "-" for T in Ts]]
            for p in dict.fromkeys(r["preset"] for r in rows)]
    return "\n\n".join([
        md_table(["multi-launch layer / floor", *[f"T={T}" for T in Ts]], body),
        "The floor: the bytes of the experts touched at the measured streaming-read rate or the FLOPs at the "
        "measured matmul rate, whichever is larger, both measured in the same run.", prov_text(es)])


def table_h200_megakernel(index) -> str:
    es = entries(index, "h200", "megakernel")
    keyed = {}
    for r in rows_of(es):
        if "megakernel_us" in r and "multi_us" in r:
            keyed[(r["preset"], r["T"], r.get("routing", "uniform"))] = r
    body = [[_name(p), str(T), routing, _us(r["floor_us"]), _us(r["megakernel_us"]), _us(r["multi_us"]),
             _us(r.get("torch_us")), f"{r['multi_us'] / r['megakernel_us']:.2f}"]
            for (p, T, routing), r in sorted(keyed.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2]))]
    return "\n\n".join([md_table(["preset", "T", "routing", "floor us", "megakernel us", "multi-launch us",
                                  "PyTorch us", "multi / megakernel"], body), prov_text(es)])


def table_h200_prefill(index) -> str:
    es, rows = having(entries(index, "h200", "prefill"), "ideal_us", "best_us")
    body = [[_name(r["preset"]), str(r["T"]), _us(r["floor_us"]), _us(r["ideal_us"]), _us(r["best_us"]),
             _us(r["torch_us"]), f"{r['ideal_us'] / r['best_us']:.2f}"] for r in rows]
    return "\n\n".join([md_table(["preset", "T", "floor us", "ideal grouped GEMM us", "ours us", "PyTorch us",
                                  "ours / ideal rate"], body), prov_text(es)])


def table_h200_fp8(index) -> str:
    es, rows = having(entries(index, "h200", "fp8_prefill"), "dtype", "ours_us")
    by = {(r["preset"], r["T"], r["dtype"]): r for r in rows}
    body = []
    for (p, T, dt), r in by.items():
        if dt == "bf16" and (p, T, "fp8-act") in by:
            f8 = by[(p, T, "fp8-act")]
            body.append([_name(p), str(T), _us(r["ours_us"]), _us(f8["ours_us"]), f"{r['ours_us'] / f8['ours_us']:.2f}"])
    out = [md_table(["preset (routed experts)", "T", "bf16 us", "FP8 weights and activations us", "speedup"], body),
           prov_text(es)]
    es2, rows2 = having(entries(index, "h200", "fp8_decode"), "bf16_megakernel_us")
    body2 = [[_name(r["preset"]), str(r["T"]), r.get("routing", "uniform"), _us(r["megakernel_us"]), _us(r["multi_us"]),
              _us(r.get("bf16_megakernel_us"))] for r in rows2]
    out += [md_table(["preset", "T", "routing", "FP8 megakernel us", "FP8 multi-launch us", "bf16 megakernel us"], body2),
            prov_text(es2)]
    return "\n\n".join(out)


def table_gb200(index) -> str:
    es, rows = having(entries(index, "gb200-nvl72", "scenarios"), "part", "layer_us")
    rows = [r for r in rows if r.get("part") == "grid"]
    by = {(r["model"], r["tokens_per_gpu"], r["routing"].split(":")[0], r["placement"], r["schedule"]): r["layer_us"]
          for r in rows}
    cases = [("uniform", "contiguous"), ("skewed", "contiguous"), ("skewed", "eplb")]
    body = []
    for model, tg in dict.fromkeys((r["model"], r["tokens_per_gpu"]) for r in rows):
        cells = [f"{_us(by.get((model, tg, ro, pl, 'bulk')))} / {_us(by.get((model, tg, ro, pl, 'fused')))}"
                 for ro, pl in cases]
        body.append([_name(model), str(tg), *cells])
    note = ("Predicted layer time in us, bulk-synchronous / fused megakernel schedule; bf16, 40 communication SMs, "
            "4096-token minibatches; skewed: a by-expert imbalance of 10.9. Predictions: the Blackwell GEMM "
            "efficiencies are carried over from H200 measurements and the communication SMs' rate is fitted to "
            "published points ([docs/simulator.md](docs/simulator.md)).")
    return "\n\n".join([md_table(["model", "tokens/GPU", *[f"{ro}, {pl}" for ro, pl in cases]], body), note,
                        prov_text(es)])


def table_cpu(index) -> str:
    es = entries(index, "cpu", "simulator_speed")
    last = rows_of(es)[-1]
    body = [[r["schedule"], f"{r['event_model_s']:.2f}", f"{r['analytic_s'] * 1e3:.1f}", f"{r['layer_time_us']:,.0f}"]
            for r in last["results"]]
    es2 = entries(index, "cpu", "sweep_speed")
    body2 = [[r["part"], f"{r['points']:,}", f"{r['wall_s']:.0f}", f"{r['target_s']:.0f}", "yes" if r["met"] else "no"]
             for r in rows_of(es2)]
    return "\n\n".join([
        "DeepSeek-V3 on a GB200 NVL72, 4096 tokens per GPU, skewed routing, in a warm process:",
        md_table(["schedule", "event model s", "analytic bound ms", "predicted layer us"], body),
        f"Provenance: {last['machine']['cpu']}, {last['machine']['cores']} cores, python {last['versions']['python']}, "
        f"numba {last['versions']['numba']}, commit {last['git_commit'][:7]}, {last['date'][:10]} "
        f"([simulator_speed.jsonl](benchmarks/results/{es[0]['path']})).",
        "`megamoe sweep` on 2 cores (LocalCluster of 2 workers, from an empty folder):",
        md_table(["part", "points", "wall s", "target s", "met"], body2), prov_text(es2)])


def table_index(index) -> str:
    body = [[e["gpu"], e["question"], f"[{Path(e['path']).name}](../benchmarks/results/{e['path']})", str(e["date"]),
             commit_text(e), ", ".join(f"{k} {v}" for k, v in e["versions"].items() if k in ("torch", "triton", "cuda"))]
            for e in index]
    return md_table(["gpu", "question", "result", "date", "commit", "versions"], body)


def validated_gpus(index) -> list[str]:
    """The GPUs with a stored validation, in path order."""
    return list(dict.fromkeys(e["gpu"] for e in index if e["question"] == "validation"))


def readme_tables(index) -> dict:
    """README marker name -> table: each validated GPU's layer table, and the rack's predictions."""
    out = {gpu: (lambda ix, g=gpu: table_layer(ix, g)) for gpu in validated_gpus(index)}
    out["gb200-nvl72"] = table_gb200
    return out


def results_md(index) -> str:
    sections = []
    for gpu in validated_gpus(index):
        name = gpu.upper()
        sections += [(f"{name}: the cost model, predicted before measured", lambda ix, g=gpu: table_accuracy(ix, g)),
                     (f"{name}: the layer, megakernel and multi-launch (every routing)",
                      lambda ix, g=gpu: table_layer(ix, g, ("uniform", "zipf", "concentrated")))]
    sections += [
        ("H200: the multi-launch layer against its floor", table_h200_kernels),
        ("H200: the megakernel against multi-launch, PyTorch and the floor", table_h200_megakernel),
        ("H200: prefill", table_h200_prefill),
        ("H200: FP8", table_h200_fp8),
        ("GB200 NVL72 (predicted)", table_gb200),
        ("The simulator's speed (CPU)", table_cpu),
    ]
    out = ["# Results", "",
           "<!-- Generated by `python benchmarks/results_index.py` from benchmarks/results/index.jsonl: do not edit. -->",
           "", "Every table is made from the stored rows its provenance line names; "
           "`benchmarks/README.md` says which tool writes each question's rows. Older results are in git history "
           "([history/results-before-2026-12-07.md](history/results-before-2026-12-07.md) lists them).", ""]
    for title, fn in sections:
        out += [f"## {title}", "", fn(index).replace("](benchmarks/", "](../benchmarks/").replace("](docs/", "]("), ""]
    out += ["## Every stored result", "", table_index(index), ""]
    return "\n".join(out)


def fill_readme(text: str, index) -> str:
    for name, fn in readme_tables(index).items():
        pat = re.compile(rf"(<!-- results:{re.escape(name)} -->\n)(?:.*?\n)??(<!-- /results -->)", re.S)
        if not pat.search(text):
            raise SystemExit(f"README.md: no <!-- results:{name} --> ... <!-- /results --> markers: add the two lines where its table goes")
        table = fn(index)
        text = pat.sub(lambda m, t=table: m.group(1) + t + "\n" + m.group(2), text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the index or a generated table is out of date")
    args = ap.parse_args(argv)
    index = build_index({e["path"]: e for e in load_index()})
    want = {INDEX: index_text(index), RESULTS_MD: results_md(index), README: fill_readme(README.read_text(), index)}
    stale = [p for p, text in want.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)}: out of date (python benchmarks/results_index.py)", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(want[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
