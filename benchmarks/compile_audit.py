"""Compile every Triton launch the MoE layer can make on an H200 for sm_90 (no GPU) and flag the ones past a block's limits.

    python benchmarks/compile_audit.py --out benchmarks/results/h200/compile_audit
    python benchmarks/compile_audit.py --presets kimi-k2 llama4-maverick --tokens 512 600 --modes bf16 weights+act
    python benchmarks/compile_audit.py --no-megakernel --budget 600 --jobs 2

For each preset (default: every one of megamoe.reference.PRESETS) x T (default 1 8 64 512 600 4096 16384) x
mode ("bf16"; "weights": FP8 weights; "weights+act": FP8 weights and activations), the multi-launch layer
(kernels/moe.py ``_forward``) is run with the static plan moe_forward makes on an H200 (plan.static_plan with
the H200's tuned configs of the GPU machine's Triton, 132 SMs) on "meta" tensors, with Triton's launch
replaced by a recorder: every launch it makes (the router's logits launch where the plan has one, the routing
program, the align kernels, x's FP8 quantization, the grouped GEMMs routed and shared, bf16 and FP8, the
split-K activation kernel, the combine) is captured as the JIT would compile it (compile_report.launch_spec).
The megakernel (kernels/megakernel.py, ``backend="megakernel"``; "auto" picks it at small T) is added for
each preset and T <= MEGAKERNEL_MAX_AUDIT_T (compile_report.megakernel_launch, the preset itself, shared MLP
included). Launches with equal specs (kernel, argument types and divisibility, constexprs, warps, stages) are
compiled once, for sm_90 with Triton's own ptxas (compile_report.compile_spec), in subprocesses without
TRITON_INTERPRET; each records its shared memory (``k.metadata.shared``), registers and SASS spill stores
(STL), and is flagged when:

    shared > H200_BLOCK_SHARED (232,448 B: Triton raises OutOfResources at the launch, as measured on an H200),
    registers > 255, the compile failed, or (megakernel) the SM cannot hold its ``occupancy`` programs
    (the persistent programs wait on each other: all must be resident).

Writes ``audit.jsonl`` (one line per distinct launch) and ``summary.md`` to ``--out``; prints the flagged
launches first. ``--budget SECONDS`` stops starting compiles after that long (the rest are listed as skipped).
This machine's Triton may differ from the GPU machine's: the figures are a guide, not the GPU's report.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
from pathlib import Path

from compile_report import compile_spec, gpu_convert, launch_spec, megakernel_launch  # beside this script

os.environ.pop("TRITON_INTERPRET", None)

#: an H200 block's shared memory at most (bytes, 227 KiB: the OutOfResources limit measured on an H200)
H200_BLOCK_SHARED = 232448
#: an H200 SM's shared memory (228 KiB; each resident block also takes 1 KiB of it) and registers
H200_SM_SHARED = 233472
H200_SM_REGS = 65536
MAX_REGS = 255
GPU = "NVIDIA H200"
#: the Triton of the GPU machine (its tuned configs, kernels/configs/NVIDIA-H200__bfloat16__triton-3.6.0.json)
GPU_TRITON = "3.6.0"
SMS = 132
TOKENS = (1, 8, 64, 512, 600, 4096, 16384)
MODES = {"bf16": None, "weights": "weights", "weights+act": "weights+act"}
#: the megakernel is audited up to this T (auto picks it at small T; backend="megakernel" allows any T)
MEGAKERNEL_MAX_AUDIT_T = 600
#: presets whose megakernels are compiled first (never run on the GPU at every T)
MEGAKERNEL_FIRST = ("kimi-k2", "llama4-maverick")
#: kernel -> the function that chose its sizes (what to change for a flagged launch)
CHOSEN_BY = {
    "_router_logits_kernel": "plan.router_launch (configs.router_logits_tile, prefill_router_split / decode_router_split)",
    "_router_kernel": "plan.router_launch (configs.router_block_t, router_warps, walk_block_h, router_bitonic)",
    "_scan_experts_kernel": "plan.align_launch", "_layout_kernel": "plan.align_launch (align_blocks)",
    "_scatter_pairs_kernel": "plan.align_launch", "_quantize_x_kernel": "plan.quantize_launch",
    "_act_kernel": "plan.act_launch", "_combine_kernel": "plan.combine_launch",
    "_megakernel": "megakernel_config.megakernel_config",
}
GEMM_CHOSEN_BY = "configs.select_config (H200 tuned entry) through plan.fp8_entry with FP8 (plan._gemm_entry)"


def chosen_by(kernel: str) -> str:
    return CHOSEN_BY.get(kernel, GEMM_CHOSEN_BY if "gemm" in kernel else "?")


# --------------------------------------------------------------------------- launches
@contextlib.contextmanager
def recording():
    """Triton launches recorded instead of run: yields the list (fn, args, kwargs, grid) the launches append to.
    The FP8 weight-only GEMMs' scale check (fp8_gemm.check_fold_scales, a torch reduction that reads the scales,
    no Triton launch) is skipped: the tensors here are "meta"."""
    from triton.runtime.jit import JITFunction

    from megamoe.kernels import fp8_gemm

    out = []

    def run(self, *args, grid, warmup=False, **kwargs):
        out.append((self, args, kwargs, grid))

    saved = JITFunction.run, fp8_gemm.check_fold_scales
    JITFunction.run, fp8_gemm.check_fold_scales = run, lambda *a, **k: None
    try:
        yield out
    finally:
        JITFunction.run, fp8_gemm.check_fold_scales = saved


def meta_weights(cfg, fp8: str | None):
    """The layer's weights as "meta" tensors of the right shapes and dtypes (e4m3 experts and fp32 scales with FP8)."""
    import torch

    from megamoe.reference import MoEWeights, expected_scale_shapes, expected_shapes
    from megamoe.reference.weights import SCALE_FIELDS

    f8 = set(SCALE_FIELDS.values()) if fp8 else set()
    w = {k: torch.empty(s, dtype=torch.float8_e4m3fn if k in f8 else torch.bfloat16, device="meta")
         for k, s in expected_shapes(cfg).items() if s is not None}
    if fp8:
        w.update({k: torch.empty(s, dtype=torch.float32, device="meta")
                  for k, s in expected_scale_shapes(cfg).items() if s is not None})
    return MoEWeights(**w)


def layer_launches(cfg, T: int, fp8: str | None, *, deterministic: bool = True, sms: int = SMS,
                   triton_version: str = GPU_TRITON) -> list:
    """[(fn, args, kwargs, grid)]: the Triton launches of moe_forward's multi-launch path (moe._forward;
    ``deterministic=False``: GEMM 2 adds into fp32 with atomics) for ``cfg`` at T on an H200, in order."""
    import torch
    from triton.runtime.jit import JITFunction

    from megamoe.kernels import moe, plan, routing

    if not isinstance(routing._router_kernel, JITFunction):
        raise RuntimeError("compile_audit: the kernels were defined under TRITON_INTERPRET; run in a process without it")
    sp = plan.static_plan(cfg, T, dtype="bfloat16", device_name=GPU, triton_version=triton_version,
                          deterministic=deterministic, num_sms=sms, fp8=fp8)
    x = torch.empty((T, cfg.hidden_size), dtype=torch.bfloat16, device="meta")
    with recording() as launches:
        moe._forward(x, meta_weights(cfg, fp8), cfg, deterministic, plan=sp, fp8_activations=fp8 == "weights+act")
    return launches


def spec_of(fn, args, kwargs) -> dict:
    """The launch as compile_report.launch_spec has it, plus the kernel's module and name (what a worker
    imports), with the default warps and stages where the launch gave none."""

    kwargs = {"num_warps": 4, "num_stages": 3, **gpu_convert(kwargs)}
    base = getattr(fn, "fn", fn)
    return {"module": base.__module__, "kernel": base.__name__, **launch_spec(fn, args, kwargs)}


def spec_key(spec: dict) -> str:
    """Equal for launches that compile to the same kernel."""
    return json.dumps(spec, sort_keys=True, default=repr)


def collect(configs: dict, tokens, modes, *, multi: bool = True, megakernel: bool = True, megakernel_tokens=None,
            megakernel_first=MEGAKERNEL_FIRST, nondeterministic: bool = False, log=print) -> list[dict]:
    """The distinct launches of the presets ``configs`` ({name: MoEConfig}) x ``tokens`` x ``modes``, each
    {"path": "multi" or "megakernel", "kernel", "spec", "cases": ["preset:T:mode", ...], ...}: the multi-launch
    ones first (in launch order), then the megakernels (``megakernel_first`` presets first, bf16 and
    weights+act before weights). A case whose launches cannot be built gets an entry with "build_error"."""
    entries: dict[str, dict] = {}
    out_of_order = []

    def add(path, spec, case, extra=None):
        key = spec_key(spec)
        e = entries.get(key)
        if e is None:
            e = entries[key] = {"path": path, "kernel": spec["kernel"], "spec": spec, "cases": [], **(extra or {})}
        if case not in e["cases"]:
            e["cases"].append(case)

    for name, cfg in configs.items() if multi else ():
        for mode in modes:
            for T, det in ((T, det) for T in tokens for det in ((True, False) if nondeterministic else (True,))):
                case = f"{name}:{T}:{mode}" + ("" if det else ":atomic")
                try:
                    for fn, args, kwargs, _grid in layer_launches(cfg, T, MODES[mode], deterministic=det):
                        add("multi", spec_of(fn, args, kwargs), case)
                except Exception as exc:  # noqa: BLE001 - reported as the case's build error
                    out_of_order.append({"path": "multi", "kernel": "(layer)", "spec": None, "cases": [case],
                                         "build_error": f"{type(exc).__name__}: {exc}"[:500]})
                    log(f"compile_audit: {case}: multi-launch build failed: {type(exc).__name__}: {exc}")
    if megakernel:
        mts = [T for T in tokens if T <= MEGAKERNEL_MAX_AUDIT_T] if megakernel_tokens is None else megakernel_tokens
        order = sorted((name not in megakernel_first, mode == "weights", list(configs).index(name), T, name, mode)
                        for name in configs for mode in modes for T in mts)
        for *_, T, name, mode in order:
            case = f"{name}:{T}:{mode}"
            try:
                spec, occ = megakernel_spec(configs[name], name, T, MODES[mode])
                add("megakernel", spec, case, {"occupancy": occ})
            except Exception as exc:  # noqa: BLE001
                out_of_order.append({"path": "megakernel", "kernel": "_megakernel", "spec": None, "cases": [case],
                                     "build_error": f"{type(exc).__name__}: {exc}"[:500]})
                log(f"compile_audit: {case}: megakernel build failed: {type(exc).__name__}: {exc}")
    return list(entries.values()) + out_of_order


def megakernel_spec(cfg, name: str, T: int, fp8: str | None, sms: int = SMS) -> tuple[dict, int]:
    """(spec, occupancy) of the megakernel's launch for ``cfg`` at T (megakernel_forward's config on an H200)."""

    from megamoe.kernels import megakernel as mkm
    from megamoe.kernels import megakernel_config as mkc

    mk = mkc.megakernel_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k,
                                cfg.shared_intermediate_size, T, num_sms=sms, fp8=fp8)
    _case, args, kwargs = megakernel_launch(name, T, sms=sms, mk=mk, fp8=fp8, config=cfg, device="meta")
    return spec_of(mkm._megakernel, args, kwargs), mk["occupancy"]


# --------------------------------------------------------------------------- compiles
def compile_entry(spec: dict) -> dict:
    """Compile one launch spec for sm_90 (in a worker): its resources, or {"error": ...}."""

    t0 = time.monotonic()
    try:
        fn = getattr(importlib.import_module(spec["module"]), spec["kernel"])
        r = compile_spec(fn, spec)
    except Exception as exc:  # noqa: BLE001 - a compile error is a finding
        return {"error": f"{type(exc).__name__}: {exc}"[-2000:], "compile_s": round(time.monotonic() - t0, 1)}
    keep = ("regs", "shared", "sass.STL", "sass.LDL", "stack_bytes", "local_bytes", "wgmma", "tma.load")
    return {**{k: r.get(k) for k in keep}, "compile_s": round(time.monotonic() - t0, 1)}


def resident_programs(shared: int, regs: int, warps: int) -> int:
    """Blocks of this launch an H200 SM holds at once (shared memory, registers a warp in 256s, 64 warps)."""
    by_shared = H200_SM_SHARED // (shared + 1024)
    by_regs = H200_SM_REGS // (-(-max(regs, 1) * 32 // 256) * 256 * warps)
    return min(by_shared, by_regs, 64 // warps)


def flags(entry: dict) -> list[str]:
    """Why a compiled launch would fail (or hang) on an H200; [] when it fits."""
    out = []
    if entry.get("build_error"):
        return out  # not compiled: reported apart
    if entry.get("error"):
        return [f"compile error: {entry['error'].strip().splitlines()[-1][:300]}"]
    shared, regs = entry.get("shared") or 0, entry.get("regs") or 0
    if shared > H200_BLOCK_SHARED:
        out.append(f"shared {shared} > {H200_BLOCK_SHARED} (OutOfResources at launch)")
    if regs > MAX_REGS:
        out.append(f"registers {regs} > {MAX_REGS}")
    occ = entry.get("occupancy")
    if occ and shared <= H200_BLOCK_SHARED:
        fit = resident_programs(shared, regs, entry["spec"]["num_warps"])
        if fit < occ:
            out.append(f"occupancy {occ} but an SM holds {fit} (shared {shared}, {regs} registers)")
    return out


def audit(entries: list[dict], *, compile_fn=compile_entry, jobs: int = 2, budget: float | None = None,
          t0: float | None = None, log=print) -> list[dict]:
    """Compile each entry with a spec (``compile_fn(spec)``; ``jobs`` worker processes, 0: in this process)
    and set its results, "flags" and "status" ("ok", "flagged", "skipped" past ``budget`` seconds from
    ``t0``, "build_error"). Entries are compiled once each, in order."""
    t0 = time.monotonic() if t0 is None else t0
    todo = [e for e in entries if e.get("spec") is not None]
    for e in entries:
        if e.get("spec") is None:
            e.update(status="build_error", flags=[])

    def done(e, r):
        e.update(r)
        e["flags"] = flags(e)
        e["status"] = "flagged" if e["flags"] else "ok"
        more = f" +{len(e['cases']) - 1}" if len(e["cases"]) > 1 else ""
        why = " " + "; ".join(e["flags"]) if e["flags"] else ""
        log(f"  [{todo.index(e) + 1}/{len(todo)}] {e['kernel']} {e['status']} shared={e.get('shared')} "
            f"regs={e.get('regs')} STL={e.get('sass.STL')} {e['compile_s']}s ({e['cases'][0]}{more}){why}")

    def over():
        return budget is not None and time.monotonic() - t0 > budget

    if jobs <= 0:
        for e in todo:
            if over():
                e.update(status="skipped", flags=[])
                continue
            done(e, compile_fn(e["spec"]))
        return entries
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        queue, running = list(todo), {}
        while queue or running:
            while queue and len(running) < jobs and not over():
                e = queue.pop(0)
                running[pool.submit(compile_fn, e["spec"])] = e
            if not running:
                break
            finished, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for f in finished:
                e = running.pop(f)
                try:
                    r = f.result()
                except Exception as exc:  # noqa: BLE001 - a crashed worker: the compile's error
                    r = {"error": f"{type(exc).__name__}: {exc}", "compile_s": None}
                done(e, r)
        for e in queue:
            e.update(status="skipped", flags=[])
    return entries


# --------------------------------------------------------------------------- reports
#: launches at or past this fraction of H200_BLOCK_SHARED are listed as near the limit (this machine's Triton is
#: not the GPU's: a few KB either way)
NEAR_FRACTION = 0.95


def row(e: dict) -> dict:
    """An entry as a JSON line (keys without a value left out)."""
    spec = e.get("spec") or {}
    r = {"kernel": e["kernel"], "path": e["path"], "status": e.get("status"), "flags": e.get("flags") or None,
         "shared": e.get("shared"), "regs": e.get("regs"), "spill_stores": e.get("sass.STL"),
         "spill_loads": e.get("sass.LDL"), "num_warps": spec.get("num_warps"), "num_stages": spec.get("num_stages"),
         "occupancy": e.get("occupancy"), "cases": e["cases"],
         "constexprs": {k: v for k, v in spec.get("constexprs", {}).items() if v is not None} or None,
         "compile_s": e.get("compile_s"), "error": e.get("error"), "build_error": e.get("build_error")}
    return {k: v for k, v in r.items() if v is not None}


def normalize(r: dict) -> dict:
    """A JSON line read back as ``row`` writes it (older lines: null values and a "chosen_by" left out)."""
    r = {k: v for k, v in r.items() if v is not None and k != "chosen_by"}
    if "constexprs" in r:
        r["constexprs"] = {k: v for k, v in r["constexprs"].items() if v is not None}
    if not r.get("flags"):
        r.pop("flags", None)
    return r


def constexpr_text(r: dict, skip=("IEEE",), keep=None) -> str:
    """``r``'s constexprs as k=v (``keep``: only those keys)."""
    return " ".join(f"{k}={v}" for k, v in (r.get("constexprs") or {}).items()
                    if k not in skip and (keep is None or k in keep))


#: the megakernel's constexprs the summary's table shows (its tiles, warps aside), where they vary
MEGAKERNEL_TABLE_KEYS = {"BM", "BN1", "BK1", "BN2", "BK2", "S_BM", "S_BN1", "S_BN2", "S_BK", "FP8", "FP8_A", "SHARED", "K"}


def varying(rows: list[dict]) -> dict:
    """{kernel: the constexprs whose values differ between its launches (the megakernel's among
    MEGAKERNEL_TABLE_KEYS)}: what the summary shows of a launch that is not flagged."""
    seen: dict = {}
    for r in rows:
        for k, v in (r.get("constexprs") or {}).items():
            seen.setdefault(r["kernel"], {}).setdefault(k, set()).add(repr(v))
    return {kern: {k for k, vs in ks.items() if len(vs) > 1 and (kern != "_megakernel" or k in MEGAKERNEL_TABLE_KEYS)}
            for kern, ks in seen.items()}


def _launch(r: dict) -> str:
    return f"{r['kernel']} ({r['path']}, warps {r.get('num_warps')}, stages {r.get('num_stages')})"


def summary(rows: list[dict], *, header: str = "") -> str:
    """Markdown from ``row``s: the flagged launches first, then those near the shared limit, those that spill,
    the cases not built, what was skipped, and every compiled launch."""
    lines = [f"# Compile audit (sm_90, H200 limits: {H200_BLOCK_SHARED} B shared a block, {MAX_REGS} registers)",
             "", header, ""]
    st = {k: [r for r in rows if r.get("status") == k] for k in ("flagged", "ok", "skipped", "build_error")}
    compiled = st["flagged"] + st["ok"]
    lines.append(f"{len(rows)} distinct launches: {len(st['ok'])} ok, {len(st['flagged'])} flagged, "
                 f"{len(st['skipped'])} skipped (budget), {len(st['build_error'])} cases not built.")
    lines += ["", "## Flagged", ""]
    if not st["flagged"]:
        lines.append("None.")
    for r in st["flagged"]:
        lines.append(f"- **{_launch(r)}**: {'; '.join(r['flags'])}. Constexprs: {constexpr_text(r)}. "
                     f"Cases ({len(r['cases'])}): {', '.join(r['cases'])}. Sizes chosen by {chosen_by(r['kernel'])}.")
    vary = varying(compiled)
    near = [r for r in st["ok"] if (r.get("shared") or 0) >= NEAR_FRACTION * H200_BLOCK_SHARED]
    lines += ["", f"## Near the shared limit (>= {NEAR_FRACTION:.0%} of {H200_BLOCK_SHARED} B, not flagged)", ""]
    lines += [f"- {_launch(r)}: shared {r['shared']} ({H200_BLOCK_SHARED - r['shared']} B to spare), regs "
              f"{r.get('regs')}; {constexpr_text(r, keep=vary.get(r['kernel']))}; cases: {', '.join(r['cases'])}; "
              f"chosen by "
              f"{chosen_by(r['kernel'])}" for r in near] or ["None."]
    lines += ["", "## Spilling (SASS STL > 0; not flagged: slower, not a launch failure): per kernel, the most", ""]
    kernels = sorted({r["kernel"] for r in compiled})
    for kern in kernels:
        sp = sorted((r for r in compiled if r["kernel"] == kern and r.get("spill_stores")),
                    key=lambda r: -r["spill_stores"])
        if sp:
            top = "; ".join(f"{r['spill_stores']} ({r['cases'][0]})" for r in sp[:4])
            lines.append(f"- {kern}: {len(sp)} of {sum(r['kernel'] == kern for r in compiled)} launches spill; "
                         f"most STL: {top}")
    if st["build_error"]:
        lines += ["", "## Cases whose launches could not be built (not compiled)", ""]
        lines += [f"- {r['cases'][0]} ({r['path']}): {r['build_error']}" for r in st["build_error"]]
    if st["skipped"]:
        lines += ["", "## Skipped (past the budget)", ""]
        lines += [f"- {r['kernel']} ({r['path']}): {', '.join(r['cases'])}" for r in st["skipped"]]
    lines += ["", "## Every compiled launch", "", "(constexprs: those that differ between the kernel's launches)", "",
              "| kernel | path | shared B | regs | STL | warps | stages | cases | first case | constexprs |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in sorted(compiled, key=lambda r: (r["path"], r["kernel"], -(r.get("shared") or 0))):
        lines.append(f"| {r['kernel']} | {r['path']} | {r.get('shared')} | {r.get('regs')} | {r.get('spill_stores')} | "
                     f"{r.get('num_warps')} | {r.get('num_stages')} | {len(r['cases'])} | {r['cases'][0]} | "
                     f"{constexpr_text(r, keep=vary.get(r['kernel']))} |")
    return "\n".join(lines) + "\n"


def print_summary(rows: list[dict], log=print) -> None:
    flagged = [r for r in rows if r.get("status") == "flagged"]
    log(f"\n{len(flagged)} flagged of {len(rows)} distinct launches")
    for r in flagged:
        log(f"FLAGGED {_launch(r)}: {'; '.join(r['flags'])}\n    {constexpr_text(r)}\n    cases: "
            f"{', '.join(r['cases'])}\n    chosen by {chosen_by(r['kernel'])}")
    for r in rows:
        if r.get("status") == "build_error":
            log(f"NOT BUILT {r['cases'][0]} ({r['path']}): {r['build_error'][:300]}")
    skipped = [r for r in rows if r.get("status") == "skipped"]
    if skipped:
        log(f"SKIPPED (budget) {len(skipped)}: " + "; ".join(f"{r['kernel']} {r['cases'][0]}" for r in skipped))
    by = {}
    for r in rows:
        if r.get("status") in ("ok", "flagged"):
            k = by.setdefault((r["path"], r["kernel"]), [0, 0, 0, 0])
            k[0] += 1
            k[1] = max(k[1], r.get("shared") or 0)
            k[2] = max(k[2], r.get("regs") or 0)
            k[3] += (r.get("spill_stores") or 0) > 0
    for (path, kern), (n, sh, rg, sp) in sorted(by.items()):
        log(f"  {path:10s} {kern:28s} {n:4d} launches, max shared {sh:6d}, max regs {rg:3d}, {sp} with spills")


def write(rows: list[dict], out: str, header: str, gz: bool = False) -> None:
    """``rows`` to out/audit.jsonl (``gz``: audit.jsonl.gz) and their ``summary`` to out/summary.md."""
    import gzip

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / ("audit.jsonl.gz" if gz else "audit.jsonl")
    with (gzip.open(path, "wt") if gz else open(path, "w")) as f:
        for r in rows:
            f.write(json.dumps(r, default=repr) + "\n")
    (out / "summary.md").write_text(summary(rows, header=header))
    print(f"wrote {path} and {out / 'summary.md'}")


def read(path: str) -> list[dict]:
    """The rows of an audit.jsonl (or .gz)."""
    import gzip

    text = gzip.open(path, "rt").read() if str(path).endswith(".gz") else Path(path).read_text()
    return [normalize(json.loads(ln)) for ln in text.splitlines() if ln.strip()]


def main(argv=None) -> int:
    from megamoe.reference import PRESETS, MoEConfig

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    p.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--no-megakernel", action="store_true", help="the multi-launch path's launches only")
    p.add_argument("--no-multi", action="store_true", help="the megakernel's launches only")
    p.add_argument("--nondeterministic", action="store_true",
                   help="also the multi-launch path with deterministic=False (cases 'preset:T:mode:atomic')")
    p.add_argument("--megakernel-tokens", nargs="+", type=int, default=None,
                   help=f"T of the megakernel (default: those of --tokens up to {MEGAKERNEL_MAX_AUDIT_T})")
    p.add_argument("--megakernel-first", nargs="*", default=list(MEGAKERNEL_FIRST),
                   help="presets whose megakernels compile first")
    p.add_argument("--budget", type=float, default=None, help="seconds after which no compile starts")
    p.add_argument("--jobs", type=int, default=2, help="compile worker processes (0: in this process)")
    p.add_argument("--out", default=None, help="folder for audit.jsonl and summary.md")
    p.add_argument("--render", nargs="+", default=None, metavar="JSONL",
                   help="compile nothing: write --out's summary from these audit.jsonl files (joined)")
    p.add_argument("--header", default=None, help="with --render: the summary's first paragraph")
    p.add_argument("--gzip", action="store_true", help="write audit.jsonl.gz")
    a = p.parse_args(argv)
    if a.render:
        rows = [r for f in a.render for r in read(f)]
        print_summary(rows)
        if a.out:
            write(rows, a.out, a.header or f"Joined from {', '.join(a.render)}.", gz=a.gzip)
        return 1 if any(r.get("status") == "flagged" for r in rows) else 0
    t0 = time.monotonic()
    configs = {n: MoEConfig.preset(n) for n in a.presets}
    entries = collect(configs, a.tokens, a.modes, multi=not a.no_multi, megakernel=not a.no_megakernel,
                      nondeterministic=a.nondeterministic,
                      megakernel_tokens=a.megakernel_tokens, megakernel_first=a.megakernel_first)
    n_multi = sum(e["path"] == "multi" and e.get("spec") is not None for e in entries)
    print(f"compile_audit: {len(entries)} distinct launches ({n_multi} multi-launch) of {len(a.presets)} presets x "
          f"T {a.tokens} x {a.modes}; built in {time.monotonic() - t0:.1f}s", flush=True)
    audit(entries, jobs=a.jobs, budget=a.budget, t0=t0, log=lambda s: print(s, flush=True))
    took = time.monotonic() - t0
    header = (f"`python benchmarks/compile_audit.py {' '.join(argv if argv is not None else sys.argv[1:])}`: "
              f"presets {', '.join(a.presets)}; T {a.tokens}; modes {a.modes}; megakernel "
              f"{'off' if a.no_megakernel else 'T <= ' + str(MEGAKERNEL_MAX_AUDIT_T)}; H200 plan (tuned configs of "
              f"Triton {GPU_TRITON}, {SMS} SMs); compiled with this machine's Triton "
              f"{importlib.import_module('triton').__version__}; {took:.0f} s.")
    rows = [row(e) for e in entries]
    print_summary(rows)
    if a.out:
        write(rows, a.out, header, gz=a.gzip)
    return 1 if any(e.get("status") == "flagged" for e in entries) else 0


if __name__ == "__main__":
    sys.exit(main())
