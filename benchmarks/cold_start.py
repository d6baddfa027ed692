"""The first call of a (backend, T) with an empty Triton cache, and after ``megamoe compile`` filled it.

    python benchmarks/cold_start.py --out DIR                 # a GPU; about 3 minutes (--budget-s 170)
    python benchmarks/cold_start.py --smoke --out DIR         # the CPU, TRITON_INTERPRET=1: the machinery only

Items (ITEMS): for each preset (default Qwen3-30B-A3B and DeepSeek-V3, the whole layer, bf16, random
weights), the multi-launch path at T = 1 and 4096 and the megakernel at T = 1. Three steps, in order:

1. empty cache: per item, a fresh process with TRITON_CACHE_DIR a new empty folder makes the weights and
   x, synchronizes, then times its first ``moe_forward`` call to the end of the GPU's work (every compile
   and load included), and its second call;
2. ``megamoe compile --models PRESETS --tokens 1,4096 --backends multi,megakernel --cache-dir D`` into a
   new empty folder D: its wall time (the command as a user runs it, process start included);
3. compiled cache: per item, a fresh process with TRITON_CACHE_DIR=D, timed as in 1.

Each call's output is checked: finite, not all zero, and the first call's bitwise equal to the second's
(numerics against the reference: ``megamoe validate``). A step that would start past ``--budget-s`` is
skipped and named. Rows (``DIR/cold_start.jsonl``, appended as they finish; provenance from
kernels/provenance.py): ``what`` "first_call" (cache "empty" or "compiled", first_call_s, second_call_s,
process_s, compiles = [[kernel, seconds], ...] of Triton's JIT hooks, new_cache_files) or "compile"
(wall_s, rc). The table is printed at the end and written to ``DIR/cold_start.md``, the compile's
statuses to ``DIR/compile_status.json`` (its logs to ``DIR/compile_logs.tgz`` if a call failed).
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
#: seconds one measuring process may take at most
PROCESS_TIMEOUT_S = 150.0


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
    with triton_compiles() as compiled:
        y1 = moe_forward(x, w, cfg, backend=backend)
        layer.sync()
    first = time.perf_counter() - t
    t = time.perf_counter()
    y2 = moe_forward(x, w, cfg, backend=backend)
    layer.sync()
    second = time.perf_counter() - t
    ok = bool(torch.isfinite(y1).all()) and bool(y1.abs().sum() > 0) and torch.equal(y1, y2)
    return {"first_call_s": round(first, 3), "second_call_s": round(second, 5), "compiles": compiled,
            "output_ok": ok}


def _files(folder: Path) -> int:
    return sum(len(fs) for _, _, fs in os.walk(folder)) if folder.exists() else 0


def measure(preset: str, cfg, backend: str, T: int, cache: Path, *, smoke: bool, timeout_s: float) -> dict:
    """Run ``child`` in a fresh process with TRITON_CACHE_DIR=cache -> its row (or its error)."""
    spec = {"model": cfg.to_dict(), "backend": backend, "T": T, "smoke": smoke}
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    env.pop("TRITON_INTERPRET", None) if not smoke else env.update(TRITON_INTERPRET="1")
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

    def first_calls(cache_of, cache: str) -> None:
        for n in names:
            for backend, T in items:
                if left() <= 0:
                    emit({"what": "first_call", "cache": cache, "preset": n, "backend": backend, "T": T,
                          "error": "skipped: past --budget-s"})
                    continue
                emit({**measure(n, cfgs[n], backend, T, cache_of(n, backend, T), smoke=args.smoke,
                                timeout_s=min(PROCESS_TIMEOUT_S, max(left(), 10.0))), "cache": cache})

    first_calls(lambda n, b, T: scratch / f"empty_{n}_{b}_T{T}", "empty")
    compiled, work = scratch / "compiled", scratch / "compile_work"
    if left() > 0:
        emit(run_compile(names, cfgs, sorted({T for _, T in items}), compiled, work, smoke=args.smoke,
                         budget_s=left()))
        keep_compile_files(work, out, failed=bool(rows[-1].get("rc")))
        first_calls(lambda n, b, T: compiled, "compiled")
    else:
        emit({"what": "compile", "presets": names, "error": "skipped: past --budget-s"})
    table = table_lines(rows)
    print("\n".join(table), flush=True)
    (out / "cold_start.md").write_text("\n".join(table) + f"\n\n{prov}\n")
    print(f"# {len(rows)} rows in {out / 'cold_start.jsonl'}, the table in cold_start.md; "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    bad = [r for r in rows if r.get("error") or r.get("output_ok") is False or r.get("rc")]
    return 1 if bad else 0


def _line(r: dict) -> str:
    if r["what"] == "compile":
        return (f"compile {','.join(r['presets'])}: " + (r["error"] if r.get("error") else
                f"{r['wall_s']:.1f} s, rc {r['rc']}"))
    head = f"{r['cache']:8s} {r['preset']} {r['backend']} T={r['T']}: "
    if r.get("error"):
        return head + r["error"]
    ks = r.get("compiles") or []
    return (head + f"first call {r['first_call_s']:.2f} s ({len(ks)} kernels, {sum(s for _, s in ks):.2f} s in "
            f"compiles or loads, {r['new_cache_files']} new cache files), second {r['second_call_s'] * 1e3:.2f} ms,"
            f" process {r['process_s']:.1f} s" + ("" if r["output_ok"] else "  OUTPUT CHECK FAILED"))


def table_lines(rows: list[dict]) -> list[str]:
    """preset, backend, T: the first call's seconds with an empty cache and after megamoe compile, the
    kernels it compiled (or loaded), the cache files the compiled-cache call still added; the compile's wall."""
    got = {(r["preset"], r["backend"], r["T"], r["cache"]): r for r in rows if r["what"] == "first_call"}
    out = ["", "| preset | backend | T | first call, empty cache (s) | kernels | first call, compiled cache (s) |"
           " new cache files |", "|---|---|---|---|---|---|---|"]

    def s(x):
        return "-" if x.get("first_call_s") is None else f"{x['first_call_s']:.2f}"

    for (p, b, T, c), r in got.items():
        if c == "empty":
            w = got.get((p, b, T, "compiled"), {})
            out.append(f"| {p} | {b} | {T} | {s(r)} | {len(r.get('compiles') or [])} | {s(w)} | "
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for cold_start.jsonl (default: a new temporary folder)")
    ap.add_argument("--presets", default=",".join(PRESETS), help="comma-separated presets")
    ap.add_argument("--budget-s", type=float, default=170.0, help="no step starts after this many seconds")
    ap.add_argument("--smoke", action="store_true", help="the CPU under TRITON_INTERPRET=1, shrunken layers")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return 0
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
