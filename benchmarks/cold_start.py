"""The first call of a (backend, T) with an empty Triton cache, and after ``megamoe compile`` filled it.

    python benchmarks/cold_start.py --out DIR                 # a GPU; under 3 minutes (--budget-s 160)
    python benchmarks/cold_start.py --smoke --out DIR         # the CPU, TRITON_INTERPRET=1: the machinery only
    python benchmarks/cold_start.py --census                  # the CPU: what a first call compiles (no GPU)

Items (ITEMS): for each preset (default Qwen3-30B-A3B and DeepSeek-V3, the whole layer, bf16, random
weights), the multi-launch path at T = 1 and 4096 and the megakernel at T = 1. Three steps, in order:

1. empty cache: per item, a fresh process with TRITON_CACHE_DIR a new empty folder makes the weights and
   x, synchronizes, then times its first ``moe_forward`` call to the end of the GPU's work (every compile
   and load included), and its second call;
2. ``megamoe compile --models PRESETS --tokens 1,4096 --backends multi,megakernel --cache-dir D`` into a
   new empty folder D: its wall time (the command as a user runs it, process start included);
3. compiled cache: per item, a fresh process with TRITON_CACHE_DIR=D, timed as in 1; then the same for
   OFF_BUCKET_ITEMS, T the compile did not list in a bucket it did (what a server meets between buckets).

Each call's output is checked: finite, not all zero, and the first call's bitwise equal to the second's
(numerics against the reference: ``megamoe validate``). A step that would start past ``--budget-s`` is
skipped and named. Rows (``DIR/cold_start.jsonl``, appended as they finish; provenance from
kernels/provenance.py): ``what`` "first_call" (cache "empty" or "compiled", first_call_s, second_call_s,
process_s, compiles = [[kernel, seconds, specialization digest, the rest of its cache key's parts], ...]
of Triton's JIT hooks, specs = {digest: Triton's serialized specialization}, new_cache_files; a
compiled-cache call that still compiled a kernel also has ``not_compiled_ahead``: per such kernel, what
its specialization has that none of the compile's specializations of that kernel has, field by field,
or, where the specialization is the compile's, which other parts of the cache key differ) or "compile" (wall_s, rc). The table is printed at the end and written to ``DIR/cold_start.md``, the compile's
statuses to ``DIR/compile_status.json`` (its logs to ``DIR/compile_logs.tgz`` if a call failed).

``--census`` (no GPU; ``census``): per preset, backend and tuned bucket, the Triton kernels one
``moe_forward`` call launches at the bucket's T and the distinct specializations (kernel, constexprs,
argument types, Triton's divisibility and ==1 specialization, warps, stages) over every T of the bucket
(CENSUS_T): the launches recorded, not run, on "meta" tensors as compile_audit.py records them, on
``--gpu``'s launch plan (its tuned file for ``--triton``, else the heuristics) with ``--sms`` SMs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESETS = ("qwen3-30b-a3b", "deepseek-v3")
#: (backend, T) measured per preset
ITEMS = (("multi", 1), ("multi", 4096), ("megakernel", 1))
#: the same on the CPU under the interpreter (toy T: the interpreter runs one program at a time)
SMOKE_ITEMS = (("multi", 1), ("multi", 5), ("megakernel", 1))
#: (backend, T) measured last from the compiled cache only: a T in a compiled bucket (1) but not compiled itself
OFF_BUCKET_ITEMS = (("megakernel", 2),)
#: seconds one measuring process may take at most
PROCESS_TIMEOUT_S = 150.0
#: the T of the census: every T to 300, then every 7th to 2000, every 61st beyond (and the buckets)
CENSUS_T = tuple(sorted({*range(1, 300), *range(300, 2000, 7), *range(2000, 16385, 61), 4096, 16384}))


# --------------------------------------------------------------------------- the measuring process
def child(spec: dict) -> dict:
    """In a fresh process: the first and second ``moe_forward`` call of spec's layer, backend and T."""
    import torch

    from megamoe.kernels import moe_forward
    from megamoe.layers import make_layer
    from megamoe.reference import MoEConfig
    from megamoe.warm import triton_compiles

    layer = make_layer("interpreter" if spec["smoke"] else "cuda")
    cfg = MoEConfig.from_dict(spec["model"])
    T, backend = int(spec["T"]), spec["backend"]
    w = layer.weights(cfg, 0)
    gen = torch.Generator(device=layer.device).manual_seed(T)
    x = torch.randn((T, cfg.hidden_size), generator=gen, device=layer.device, dtype=layer.dtype)
    layer.sync()
    t = time.perf_counter()
    specs: dict = {}
    with triton_compiles(specs) as compiled:
        y1 = moe_forward(x, w, cfg, backend=backend)
        layer.sync()
    first = time.perf_counter() - t
    t = time.perf_counter()
    y2 = moe_forward(x, w, cfg, backend=backend)
    layer.sync()
    second = time.perf_counter() - t
    ok = bool(torch.isfinite(y1).all()) and bool(y1.abs().sum() > 0) and torch.equal(y1, y2)
    return {"first_call_s": round(first, 3), "second_call_s": round(second, 5), "compiles": compiled,
            "specs": specs, "output_ok": ok}


def _files(folder: Path) -> int:
    return sum(len(fs) for _, _, fs in os.walk(folder)) if folder.exists() else 0


def measure(preset: str, cfg, backend: str, T: int, cache: Path, *, smoke: bool, timeout_s: float) -> dict:
    """Run ``child`` in a fresh process with TRITON_CACHE_DIR=cache -> its row (or its error)."""
    spec = {"model": cfg.to_dict(), "backend": backend, "T": T, "smoke": smoke}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1", **({"TRITON_INTERPRET": "1"} if smoke else {}))
    before = _files(cache)
    row = {"what": "first_call", "preset": preset, "backend": backend, "T": T}
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env, capture_output=True,
                           text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timeout: no result after {timeout_s:.0f} s"}
    row["process_s"] = round(time.perf_counter() - t, 2)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {**row, "error": f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}"}
    return {**row, **json.loads(lines[-1]), "new_cache_files": _files(cache) - before}


# --------------------------------------------------------------------------- megamoe compile
def run_compile(names: list[str], cfgs: dict, tokens: list[int], cache: Path, work: Path, *, smoke: bool,
                budget_s: float) -> dict:
    """``megamoe compile`` of the presets at ``tokens``, both backends, into ``cache`` -> its row. On the
    GPU the command itself runs (a process, as a user runs it); ``--smoke``: its driver in this process
    on the interpreter's layers."""
    row = {"what": "compile", "presets": names, "tokens": tokens, "backends": ["multi", "megakernel"]}
    t = time.perf_counter()
    if smoke:
        from megamoe import compile as mc

        jobs = mc.plan_jobs([(n, cfgs[n]) for n in names], tokens, ["bf16"], ["multi", "megakernel"],
                            lambda c, T, d: 1.0)
        r = mc.compile_ahead(jobs, budget_s=budget_s, item_timeout_s=budget_s, procs=2, memory_bytes=64e9,
                             folder=work, cache_dir=str(cache), layer_kind="interpreter", log=print)
        return {**row, "wall_s": round(time.perf_counter() - t, 2), "rc": int(bool(r["failed"])),
                "items_ok": sum(v == "ok" for v in r["status"].values()), "items": len(r["status"])}
    argv = [sys.executable, "-m", "megamoe", "compile", "--models", ",".join(names), "--tokens",
            ",".join(map(str, tokens)), "--backends", "multi,megakernel", "--cache-dir", str(cache),
            "--work-dir", str(work), "--budget", str(max(budget_s, 1.0))]
    print("$ " + " ".join(argv[1:]), flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("TRITON_INTERPRET", None)
    try:
        rc = subprocess.run(argv, env=env, timeout=budget_s + 60).returncode  # its progress lines pass through
    except subprocess.TimeoutExpired:
        rc = 124
    status = Path(work) / "warm_status.json"
    counts = json.loads(status.read_text()).get("counts", {}) if status.exists() else {}
    return {**row, "wall_s": round(time.perf_counter() - t, 2), "rc": rc, "counts": counts}


# --------------------------------------------------------------------------- the census (no GPU)
def jit_key(fn, args, kwargs) -> tuple:
    """What Triton's JIT keys a launch of ``fn`` by (every tensor taken as 16-byte aligned: each buffer is
    its own allocation): (kernel, ((arg, type, specialization), ...), (("num_stages", s), ("num_warps", w)))."""
    import torch
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    kw = dict(kwargs)
    opts = tuple(sorted({"num_warps": kw.pop("num_warps", 4), "num_stages": kw.pop("num_stages", 3)}.items()))
    vals = {**dict(zip(fn.arg_names, args)), **kw}
    spec = []
    for p, n in zip(fn.params, fn.arg_names):
        v = vals.get(n)
        if p.is_constexpr:
            spec.append((n, "constexpr", repr(v)))
        elif isinstance(v, torch.Tensor):
            spec.append((n, str(v.dtype), "D"))
        elif v is None:
            spec.append((n, "none", ""))
        else:
            t, a = native_specialize_impl(BaseBackend, v, False, not p.do_not_specialize,
                                          not p.do_not_specialize_on_alignment)[:2]
            spec.append((n, t, repr(a)))
    return getattr(fn, "fn", fn).__name__, tuple(spec), opts


def launch_keys(cfg, name: str, backend: str, T: int, *, gpu: str, triton_version: str, sms: int) -> list:
    """The jit_key of each launch of one bf16 ``moe_forward`` of ``cfg`` at T by ``backend``, in order."""
    import torch
    from compile_audit import gpu_convert, meta_weights, recording  # beside this script
    from compile_report import megakernel_launch

    from megamoe.kernels import megakernel as mkm
    from megamoe.kernels import megakernel_config as mkc
    from megamoe.kernels import moe, plan

    if backend == "megakernel":
        mk = mkc.megakernel_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k,
                                    cfg.shared_intermediate_size, T, num_sms=sms)
        _case, args, kwargs = megakernel_launch(name, T, sms=sms, mk=mk, config=cfg, device="meta")
        return [jit_key(mkm._megakernel, args, gpu_convert(kwargs))]
    sp = plan.static_plan(cfg, T, dtype="bfloat16", device_name=gpu, triton_version=triton_version,
                          deterministic=True, num_sms=sms)
    x = torch.empty((T, cfg.hidden_size), dtype=torch.bfloat16, device="meta")
    with recording() as launches:
        moe._forward(x, meta_weights(cfg, None), cfg, True, plan=sp)
    return [jit_key(fn, a, gpu_convert({"num_warps": 4, "num_stages": 3, **k})) for fn, a, k, _grid in launches]


def census(names: list[str], *, gpu: str, triton_version: str, sms: int, tokens=CENSUS_T) -> list[dict]:
    """Per (preset, backend, bucket): {"kernels": [names launched at the bucket's T], "distinct": the
    distinct jit_keys over ``tokens`` in the bucket, "varying": {kernel: [what differs between them]}}."""
    from megamoe.kernels.configs import T_BUCKETS, bucket_of
    from megamoe.reference import MoEConfig

    rows = []
    for name in names:
        cfg = MoEConfig.preset(name)
        for backend in ("multi", "megakernel"):
            keys: dict[int, set] = {b: set() for b in T_BUCKETS}
            at: dict[int, list] = {}
            for T in sorted(set(tokens) | set(T_BUCKETS)):
                ks = launch_keys(cfg, name, backend, T, gpu=gpu, triton_version=triton_version, sms=sms)
                keys[bucket_of(T)].update(ks)
                if T in T_BUCKETS:
                    at[T] = ks
            for b in T_BUCKETS:
                rows.append({"preset": name, "backend": backend, "bucket": b, "kernels": [k[0] for k in at[b]],
                             "distinct": len(keys[b]), "varying": _varying(keys[b])})
    return rows


def _varying(keys) -> dict:
    """{kernel: sorted names of the arguments and options that differ between its keys}."""
    by: dict[str, list] = {}
    for k in keys:
        by.setdefault(k[0], []).append({**{n: (t, a) for n, t, a in k[1]}, **dict(k[2])})
    return {kern: sorted(f for f in ds[0] if len({str(d.get(f)) for d in ds}) > 1)
            for kern, ds in by.items() if len(ds) > 1}


# --------------------------------------------------------------------------- the run
def provenance(smoke: bool) -> dict:
    if smoke:
        import datetime as dt

        import torch
        import triton

        from megamoe.kernels.provenance import git_state

        return {"gpu": "cpu-interpreter", "torch": torch.__version__, "triton": triton.__version__, **git_state(),
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    from megamoe.kernels.provenance import provenance as prov

    return prov()


def configs(names: list[str], smoke: bool) -> dict:
    from megamoe.reference import MoEConfig

    if smoke:
        from megamoe.grid import shrink_for_interpreter

        return {n: shrink_for_interpreter(MoEConfig.preset(n)) for n in names}
    return {n: MoEConfig.preset(n) for n in names}


def run(args) -> int:
    t0 = time.perf_counter()
    names = [n for n in args.presets.split(",") if n]
    cfgs = configs(names, args.smoke)
    items = SMOKE_ITEMS if args.smoke else ITEMS
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="cold-start-"))
    out.mkdir(parents=True, exist_ok=True)
    prov = provenance(args.smoke)
    print(f"# {prov}", flush=True)
    rows: list[dict] = []
    scratch = Path(tempfile.mkdtemp(prefix="cold-start-caches-"))

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t0)

    def emit(row: dict) -> None:
        row.update(prov)
        rows.append(row)
        with (out / "cold_start.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(_line(row), flush=True)

    def first_calls(cache_of, cache: str, items, ahead: dict | None = None, parts: dict | None = None) -> None:
        for n in names:
            for backend, T in items:
                if left() <= 0:
                    emit({"what": "first_call", "cache": cache, "preset": n, "backend": backend, "T": T,
                          "error": "skipped: past --budget-s"})
                    continue
                row = {**measure(n, cfgs[n], backend, T, cache_of(n, backend, T), smoke=args.smoke,
                                 timeout_s=min(PROCESS_TIMEOUT_S, max(left(), 10.0))), "cache": cache}
                if ahead is not None and row.get("new_cache_files"):
                    row["not_compiled_ahead"] = not_compiled_ahead(row, ahead.get(n, {}), parts)
                emit(row)

    first_calls(lambda n, b, T: scratch / f"empty_{n}_{b}_T{T}", "empty", items)
    compiled, work = scratch / "compiled", scratch / "compile_work"
    if left() > 0:
        emit(run_compile(names, cfgs, sorted({T for _, T in items}), compiled, work, smoke=args.smoke,
                         budget_s=left()))
        keep_compile_files(work, out, failed=bool(rows[-1].get("rc")))
        ahead, parts = compile_specs(out / "compile_status.json"), compile_key_parts(out / "compile_status.json")
        first_calls(lambda n, b, T: compiled, "compiled", items, ahead, parts)
        first_calls(lambda n, b, T: compiled, "compiled", OFF_BUCKET_ITEMS, ahead, parts)
    else:
        emit({"what": "compile", "presets": names, "error": "skipped: past --budget-s"})
    table = table_lines(rows)
    print("\n".join(table), flush=True)
    (out / "cold_start.md").write_text("\n".join(table) + f"\n\n{prov}\n")
    print(f"# {len(rows)} rows in {out / 'cold_start.jsonl'}, the table in cold_start.md; "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    bad = [r for r in rows if r.get("error") or r.get("output_ok") is False or r.get("rc")]
    return 1 if bad else 0


def compile_specs(status: Path) -> dict:
    """{preset: {kernel: [specialization, ...]}}: what ``megamoe compile`` compiled, from its statuses
    (items keyed "preset/T=../dtype/backend")."""
    out: dict = {}
    details = json.loads(status.read_text()).get("details", {}) if status.exists() else {}
    for key, d in details.items():
        specs = d.get("specs") or {}
        for k in d.get("compiles") or []:
            if len(k) > 2 and k[2] in specs:
                out.setdefault(key.split("/")[0], {}).setdefault(k[0], []).append(specs[k[2]])
    return out


def compile_key_parts(status: Path) -> dict:
    """{specialization digest: [key parts, ...]}: the rest of Triton's cache key (megamoe.warm._key_parts)
    of each kernel ``megamoe compile`` compiled, from its statuses."""
    out: dict = {}
    details = json.loads(status.read_text()).get("details", {}) if status.exists() else {}
    for d in details.values():
        for k in d.get("compiles") or []:
            if len(k) > 3 and k[2] is not None:
                out.setdefault(k[2], []).append(k[3])
    return out


def spec_difference(mine: str, theirs: str) -> dict:
    """The fields where two of Triton's serialized specializations of one kernel differ: per field (the
    arguments' types and attributes named by argument, constexprs by position, options by name)
    {name: [mine, theirs]}."""
    a, b = json.loads(mine), json.loads(theirs)
    out: dict = {}
    names = list(a.get("signature") or {})
    for field in sorted(set(a) | set(b)):
        x, y = a.get(field), b.get(field)
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            out.update({f"{field}.{k}": [x.get(k), y.get(k)] for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)})
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            keys = a.get(field.replace("_vals", "_keys")) if field.endswith("_vals") else None
            for i, (u, v) in enumerate(zip(x, y)):
                if u != v:
                    at = keys[i][0] if keys and i < len(keys) and keys[i] else None  # the argument's position
                    out[f"{field}[{names[at] if isinstance(at, int) and at < len(names) else i}]"] = [u, v]
        else:
            out[field] = [x, y]
    return out


def not_compiled_ahead(row: dict, ahead: dict, parts: dict | None = None) -> dict:
    """Per kernel the compiled-cache call compiled (no cache hit): its difference from the nearest of the
    compile's specializations of that kernel (the one differing in fewest fields), or "not compiled by
    the compile" where it made none of that kernel. Where its specialization is one the compile made but
    its cache key is not (``parts``: ``compile_key_parts``), the parts of the key that differ."""
    out = {}
    for k in (k for k in row.get("compiles") or [] if len(k) > 2):
        name, digest = k[0], k[2]
        mine = (row.get("specs") or {}).get(digest)
        if mine is not None and mine in ahead.get(name, []):
            theirs = (parts or {}).get(digest) or []
            if len(k) > 3 and k[3].get("hash") and theirs and all(t.get("hash") != k[3]["hash"] for t in theirs):
                t = theirs[0]
                diff = {p: [k[3].get(p), t.get(p)] for p in sorted(set(k[3]) | set(t)) if k[3].get(p) != t.get(p)}
                if set(diff) == {"hash"}:
                    diff["why"] = ("the specialization, source, constants and environment are the compile's: the "
                                   "rest of Triton's key differs (its own files, the backend, the options' libraries)")
                out[name] = diff
            continue
        if mine is None:
            continue
        diffs = [spec_difference(mine, t) for t in ahead.get(name, [])]
        out[name] = min(diffs, key=len) if diffs else "not compiled by the compile"
    if not out and row.get("new_cache_files"):
        out["*"] = ("every specialization was compiled ahead, yet the cache grew: Triton's cache key differs "
                    "elsewhere (its source, options or environment)")
    return out


def _line(r: dict) -> str:
    if r["what"] == "compile":
        return (f"compile {','.join(r['presets'])}: " + (r["error"] if r.get("error") else
                f"{r['wall_s']:.1f} s, rc {r['rc']}"))
    head = f"{r['cache']:8s} {r['preset']} {r['backend']} T={r['T']}: "
    if r.get("error"):
        return head + r["error"]
    ks = r.get("compiles") or []
    missed = "".join(f"\n    {name} not compiled ahead: {json.dumps(d)[:600]}"
                     for name, d in (r.get("not_compiled_ahead") or {}).items())
    return (head + f"first call {r['first_call_s']:.2f} s ({len(ks)} kernels, {sum(k[1] for k in ks):.2f} s in "
            f"compiles or loads, {r['new_cache_files']} new cache files), second {r['second_call_s'] * 1e3:.2f} ms,"
            f" process {r['process_s']:.1f} s" + ("" if r["output_ok"] else "  OUTPUT CHECK FAILED") + missed)


def table_lines(rows: list[dict]) -> list[str]:
    """preset, backend, T: the first call's seconds with an empty cache and after megamoe compile, the
    kernels it compiled (or loaded), the cache files the compiled-cache call still added; the compile's wall."""
    got = {(r["preset"], r["backend"], r["T"], r["cache"]): r for r in rows if r["what"] == "first_call"}
    out = ["", "| preset | backend | T | first call, empty cache (s) | kernels | first call, compiled cache (s) |"
           " new cache files |", "|---|---|---|---|---|---|---|"]

    def s(x):
        return "-" if x.get("first_call_s") is None else f"{x['first_call_s']:.2f}"

    for p, b, T in dict.fromkeys(k[:3] for k in got):
        r, w = got.get((p, b, T, "empty"), {}), got.get((p, b, T, "compiled"), {})
        out.append(f"| {p} | {b} | {T} | {s(r)} | {len(r.get('compiles') or []) if r else '-'} | {s(w)} | "
                   f"{w.get('new_cache_files', '-')} |")
    for r in rows:
        if r["what"] == "compile":
            out += ["", f"`megamoe compile` ({', '.join(r['presets'])}): "
                    + (r.get("error") or f"{r['wall_s']:.1f} s, rc {r['rc']}")]
    return out


def keep_compile_files(work: Path, out: Path, *, failed: bool) -> None:
    """The compile's statuses (``compile_status.json``) and, if a call failed, its jobs' logs
    (``compile_logs.tgz``) beside the rows."""
    import shutil
    import tarfile

    status = work / "warm_status.json"
    if status.exists():
        shutil.copy(status, out / "compile_status.json")
    if failed and work.exists():
        with tarfile.open(out / "compile_logs.tgz", "w:gz") as tar:
            tar.add(work, arcname="compile_work")


def print_census(args) -> int:
    """``--census``: one Markdown row per (preset, backend, bucket), and the JSON rows to --out if given."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("cold_start --census: run it without TRITON_INTERPRET=1 (it reads the JIT's signatures)", file=sys.stderr)
        return 2
    names = [n for n in args.presets.split(",") if n]
    rows = census(names, gpu=args.gpu, triton_version=args.triton, sms=args.sms)
    print(f"# {args.gpu}, Triton {args.triton} tuned file (else heuristics), {args.sms} SMs: kernels at the "
          "bucket's T / distinct specializations over the bucket's T")
    print("| preset | backend | bucket | kernels at T = bucket | distinct over the bucket | what varies |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        names_at = ", ".join(k.strip("_").removesuffix("_kernel") for k in r["kernels"])
        vary = "; ".join(f"{k.strip('_').removesuffix('_kernel')}: {', '.join(v)}" for k, v in r["varying"].items())
        print(f"| {r['preset']} | {r['backend']} | {r['bucket']} | {len(r['kernels'])}: {names_at} | {r['distinct']} | "
              f"{vary or '-'} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "census.json").write_text(json.dumps(rows, indent=1))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for cold_start.jsonl (default: a new temporary folder)")
    ap.add_argument("--presets", default=",".join(PRESETS), help="comma-separated presets")
    ap.add_argument("--budget-s", type=float, default=160.0, help="no step starts after this many seconds (default 160)")
    ap.add_argument("--smoke", action="store_true", help="the CPU under TRITON_INTERPRET=1, shrunken layers")
    ap.add_argument("--census", action="store_true", help="no GPU: the kernels a first call launches, and their "
                    "specializations over each bucket's T")
    ap.add_argument("--gpu", default="NVIDIA H100 80GB HBM3", help="--census: the GPU whose launch plan is read")
    ap.add_argument("--triton", default="3.6.0", help="--census: the Triton version of its tuned file")
    ap.add_argument("--sms", type=int, default=132, help="--census: the GPU's SMs")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    if args.census:
        return print_census(args)
    if not args.budget_s > 0:
        print(f"cold_start: --budget-s {args.budget_s}: must be > 0", file=sys.stderr)
        return 2
    from megamoe.reference import PRESETS as KNOWN

    bad = [n for n in args.presets.split(",") if n and n not in KNOWN]
    if bad or not args.presets.strip(","):
        print(f"cold_start: --presets {args.presets!r}: unknown {bad}; presets: {', '.join(KNOWN)}", file=sys.stderr)
        return 2
    if not args.smoke:
        import torch

        if not torch.cuda.is_available():
            print("cold_start: needs a CUDA GPU (or --smoke for the CPU)", file=sys.stderr)
            return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
