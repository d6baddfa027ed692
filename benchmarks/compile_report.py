"""Compile the megakernel or the grouped GEMMs for Hopper (sm_90) on a machine without a GPU and report their resources.

    python benchmarks/compile_report.py qwen3-30b-a3b:1 deepseek-v3:1 [--warps 8] [--stages 3]
    python benchmarks/compile_report.py mixtral-8x7b:512 deepseek-v3:16384 --gemm current tma128
    python benchmarks/compile_report.py deepseek-v3:1 deepseek-v3:4096 --gemm current --fp8 weights+act
    python benchmarks/compile_report.py qwen3-30b-a3b:4096 --gemm current --fp8 weights+act --fp8a-tiles default m128
    python benchmarks/compile_report.py qwen3-30b-a3b:1 --fp8 weights --variants default fp8fast --dump DIR --loops
    python benchmarks/compile_report.py qwen3-30b-a3b:1 --variants default rank bitonic --set tiles.router.TOPK_T=4

Builds the launch as kernels.megakernel.megakernel_forward does for the preset at T (its
``build_launch``, on CPU tensors of the right dtypes), or with ``--gemm`` the routed GEMM 1 and
GEMM 2 launches of the multi-launch path (grouped_gemm.gemm1_launch / gemm2_launch) for each named
candidate (configs.candidate_entry: "current", the shipped config of that T bucket; "tmaNN", the
"tma_persistent" variant at BLOCK_M NN; "tma128:num_stages=3,g2.BLOCK_N=128" with overrides), compiles it with Triton's own ptxas for sm_90, and prints
registers per thread, spilled registers, shared memory, and counts of the PTX instructions that
tell whether the inner loops are pipelined (cp.async, TMA loads cp.async.bulk.tensor, wgmma,
mma.sync) and whether registers went to local memory. Costs no device time; this machine's Triton
may differ from the GPU machine's, so the figures are a guide, not the GPU's report.
``--fp8 weights`` / ``--fp8 weights+act`` compiles the FP8 GEMMs (fp8_gemm.py) instead, the
candidate's entry through fp8_plan.fp8_entry (BLOCK_K 128 ...; with a "tma_persistent" candidate the
persistent FP8 GEMMs: fp8_act_tma's with FP8 activations, fp8w_tma's weight-only); the PTX count "fp8.mma" tells whether
the e4m3 x e4m3 products reach the tensor cores as FP8 MMAs (wgmma or mma.sync). The weight-only GEMMs
compile with the GPU's e4m3 conversion (configs.FP8_CONVERT_DEFAULT on a GPU: inline PTX), not the
interpreter's that this machine's CPU tensors would give them (before that fix, their figures were CVT 1's).
``--fp8a-tiles NAME ...`` (with ``--fp8 weights+act``) compiles each 128-row tile candidate of the fp8a
GEMMs (fp8_plan.FP8A_TILE_CANDIDATES; "m64" for the 64-row tiles, "default" for the default tiles: m128c at 128-row entries).
For the megakernel, ``--set KEY=VALUE`` changes its config (a top-level key such as
``topk_rank=1``, or a tile key such as ``tiles.router.TOPK_T=4``) and ``--variants NAME ...``
compiles named variants of megakernel_variants.py ("default" for none); each report then also
counts the spill instructions of the SASS (``sass.STL`` / ``sass.LDL``) and, per section of
SECTIONS (the PTX instructions of the top-k and of the align code, see ``section_counts``), the
barriers (bar.sync), warp shuffles, warp reductions (redux.sync), shared and local memory accesses
and instructions, e.g. ``topk.bar``.

``--dump DIR`` also writes each compiled kernel's TTIR, TTGIR, LLIR, PTX and SASS (nvdisasm of the
cubin) to DIR/<case>.<ext>; ``--loops`` then prints the SASS's innermost loops that hold an MMA
(``loop_report``: per K step, instructions, MMAs (HMMA: mma.sync; GMMA: wgmma, QGMMA for e4m3), TMA
loads (UTMALDG), cp.async and waits, shared-memory loads, stores
and barriers, global and local loads, conversions, and the source line, e.g. fp8_gemm.py:190).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)

#: section -> the jit functions of megamoe.kernels whose PTX instructions it counts (``section_counts``)
SECTIONS = {"topk": ("routing._topk_maxima", "routing._topk_bitonic"),
            "align": ("align._finish_offsets", "align._scatter_block"), "align1": ("align._align_one",)}
#: what ``section_counts`` counts in each section
SECTION_OPS = {"bar": r"\bbar\.sync|\bbarrier\.sync", "shfl": r"\bshfl\.sync", "redux": r"\bredux\.sync",
               "ld.shared": r"\bld\.shared", "st.shared": r"\bst\.shared", "local": r"\b(?:ld|st)\.local"}

OPS = {"cp.async": r"cp\.async\.cg", "cp.async.bulk": r"cp\.async\.bulk", "tma.load": r"cp\.async\.bulk\.tensor",
       "wgmma": r"wgmma\.mma_async",
       "mma.sync": r"mma\.sync", "ld.local": r"ld\.local", "st.local": r"st\.local",
       "fp8.mma": r"mma\S*\.e4m3"}


_TY = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.int32": "i32",
       "torch.int64": "i64", "torch.float8_e4m3fn": "fp8e4nv"}


def _sig(v) -> str:
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    if isinstance(v, torch.Tensor):
        return "*" + _TY[str(v.dtype)]
    if isinstance(v, TensorDescriptor):  # as the JIT types a host-side descriptor
        return f"tensordesc<{_TY[str(v.base.dtype)]}[{', '.join(str(b) for b in v.block_shape)}]>"
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i64" if abs(v) >= 2**31 else "i32"
    if isinstance(v, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(v).__name__}")


def parse_sets(items) -> dict:
    """``KEY=VALUE`` strings -> {key: value}, values as Python literals (1, 0.5, True) or strings."""
    import ast

    out = {}
    for item in items or ():
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"compile_report: --set {item!r}: want KEY=VALUE")
        try:
            out[key] = ast.literal_eval(val)
        except (ValueError, SyntaxError):
            out[key] = val
    return out


def apply_sets(mk: dict, sets: dict) -> dict:
    """A copy of megakernel config ``mk`` with ``sets`` applied (dotted keys reach into nested dicts;
    the key must exist there, except at the top level, where the kernel reads keys with defaults)."""
    import copy

    mk = copy.deepcopy(mk)
    for key, val in sets.items():
        *path, last = key.split(".")
        d = mk
        for part in path:
            if not isinstance(d.get(part), dict):
                raise SystemExit(f"compile_report: --set {key}: no {part!r} in the config")
            d = d[part]
        if path and last not in d:
            raise SystemExit(f"compile_report: --set {key}: no {last!r} in {'.'.join(path)} ({sorted(d)})")
        d[last] = val
    return mk


def compile_case(name: str, T: int, warps: int | None = None, stages: int | None = None, sms: int = 132,
                 mk: dict | None = None, fp8: str | None = None, dump: str | None = None,
                 variant: str | None = None, sets: dict | None = None, traced: bool = False) -> dict:
    from megamoe.kernels import megakernel as mkm

    case, args, kwargs = megakernel_launch(name, T, warps, stages, sms, mk, fp8, variant, sets, traced)
    return {"case": case, **compile_kernel(mkm._megakernel, args, kwargs, dump=dump and (dump, case),
                                           sections=SECTIONS)}


def megakernel_launch(name: str, T: int, warps: int | None = None, stages: int | None = None, sms: int = 132,
                      mk: dict | None = None, fp8: str | None = None, variant: str | None = None,
                      sets: dict | None = None, traced: bool = False, *, config=None,
                      device: str = "cpu") -> tuple[str, tuple, dict]:
    """(case, args, kwargs) of the megakernel's launch for the preset at T as megakernel_forward builds it
    on a GPU of ``sms`` SMs (``build_launch``, on tensors of the right dtypes on ``device``: "meta" allocates
    nothing); ``config``: a MoEConfig instead of the preset as benchmarked (kernels.bench.bench_config)."""
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels import megakernel as mkm
    from megamoe.kernels import megakernel_config as mkc
    from megamoe.reference import MoEWeights, expected_scale_shapes, expected_shapes
    from megamoe.reference.tiles import task_layout
    from megamoe.reference.weights import SCALE_FIELDS

    cfg = config or kb.bench_config(name)
    fp8_fields = set(SCALE_FIELDS.values()) if fp8 else set()
    w = {k: torch.empty(s, dtype=torch.float8_e4m3fn if k in fp8_fields else torch.bfloat16, device=device)
         for k, s in expected_shapes(cfg).items() if s is not None}
    if fp8:
        w.update({k: torch.empty(s, dtype=torch.float32, device=device)
                  for k, s in expected_scale_shapes(cfg).items() if s is not None})
    w = MoEWeights(**w)
    mk = mk or mkc.megakernel_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k,
                                      cfg.shared_intermediate_size, T, num_sms=sms, fp8=fp8)
    if variant:  # a named variant of the default (megakernel_variants.VARIANTS)
        from megakernel_variants import VARIANTS

        mk = VARIANTS[variant][0](mk)
    mk = apply_sets(mk, sets or {})
    mk = {**mk, "num_warps": warps or mk["num_warps"], "num_stages": stages or mk["num_stages"]}
    lay = task_layout(cfg, T, mk["tiles"])
    x = torch.empty((T, cfg.hidden_size), dtype=torch.bfloat16, device=device)
    nprog = min(sms * mk["occupancy"], lay.max_tasks)
    trace = (torch.empty((mkm.trace_rows(cfg, T, mk, nprog)[0], 3), dtype=torch.int64, device=device) if traced
             else None)
    _grid, args, kwargs, _y, _stats = mkm.build_launch(
        x, w, cfg, mk, nprog=nprog, sync=torch.zeros(lay.sync_words, dtype=torch.int32, device=device), fp8=fp8,
        gpu=True, trace=trace)
    tag = " ".join(f"{k}={v}" for k, v in (sets or {}).items()) + (" traced" if traced else "")
    case = f"{name}:{T}" + (f" fp8:{fp8}" if fp8 else "") + (f" {variant}" if variant else "") + (f" {tag}" if tag else "")
    return case, args, kwargs


def compile_kernel(fn, args, kwargs, dump: tuple[str, str] | None = None, sections: dict | None = None) -> dict:
    """Compile one launch (a @triton.jit function, its positional args and keyword constexprs,
    warps and stages) for sm_90 as the JIT would specialize it; -> warps, stages, resources, PTX
    counts, SASS spill instructions (and per section of ``sections``, see ``section_counts``).
    ``dump`` (DIR, case): write the kernel's IRs, PTX and SASS to DIR/<case>.<ext> (``dump_asm``)."""
    return compile_spec(fn, launch_spec(fn, args, kwargs), dump=dump, sections=sections)


def launch_spec(fn, args, kwargs) -> dict:
    """What the JIT compiles a launch of ``fn`` as (its positional args, keyword constexprs, num_warps and
    num_stages): {"signature": {arg: type or "constexpr"}, "constexprs": {arg: value}, "divisible": [indices
    of the args specialized as 16-byte aligned pointers / integers divisible by 16], "num_warps", "num_stages"}.
    Picklable, with no tensors: two launches with equal specs compile to the same kernel."""
    import torch

    kwargs = dict(kwargs)
    opts = {k: kwargs.pop(k) for k in ("num_warps", "num_stages")}
    vals = {**dict(zip(fn.arg_names, args)), **kwargs}
    signature, constexprs, divisible = {}, {}, []
    nospec = set(getattr(fn, "do_not_specialize", ()) or ())
    for i, (p, n) in enumerate(zip(fn.params, fn.arg_names)):
        v = vals[n]
        if p.is_constexpr or v is None:
            signature[n], constexprs[n] = "constexpr", v
            continue
        signature[n] = _sig(v)
        # what the JIT infers at a launch: 16-byte aligned pointers, integers divisible by 16
        if n not in nospec and i not in nospec and isinstance(v, (int, torch.Tensor)) and not isinstance(v, bool) and (
                isinstance(v, torch.Tensor) or v % 16 == 0):
            divisible.append(i)
    return {"signature": signature, "constexprs": constexprs, "divisible": divisible, **opts}


def compile_spec(fn, spec: dict, dump: tuple[str, str] | None = None, sections: dict | None = None) -> dict:
    """``compile_kernel`` of a launch given as its ``launch_spec``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource

    opts = {k: spec[k] for k in ("num_warps", "num_stages")}
    target = GPUTarget("cuda", 90, 32)
    backend = CUDABackend(target)
    attrs = {(i,): backend.parse_attr("D") for i in spec["divisible"]}
    src = ASTSource(fn, dict(spec["signature"]), dict(spec["constexprs"]), attrs)
    k = triton.compile(src, target=target, options=opts)
    ptx = k.asm.get("ptx", "")
    if dump:
        dump_asm(k.asm, *dump)
    sass = _cuobjdump(k.asm["cubin"], "-sass")
    return {"warps": opts["num_warps"], "stages": opts["num_stages"],
            **resource_usage(k.asm["cubin"]), "shared": k.metadata.shared,
            **{op: len(re.findall(rx, ptx)) for op, rx in OPS.items()},
            **{f"sass.{op}": len(re.findall(rf"\b{op}(?:\.[\w.]+)?\s", sass)) for op in ("STL", "LDL")},
            **section_counts(ptx, sections or {})}


_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+(?:,.*?inlined_at\s+(\d+)\s+(\d+)\s+\d+)?")
_CHAIN = re.compile(r"([\w.-]+\.py):(\d+):\d+")
_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]+)"')
_INSTR = re.compile(r"^\s+(?:@!?%p\d+\s+)?[a-z][\w.:]*[\s;]")


def _function_lines(qualname: str) -> tuple[str, int, int] | None:
    """(file name, first line, last line) of a jit function "module.name" of megamoe.kernels (None
    where this checkout has no such function)."""
    import importlib
    import inspect
    from pathlib import Path

    mod, name = qualname.rsplit(".", 1)
    fn = getattr(importlib.import_module(f"megamoe.kernels.{mod}"), name, None)
    if fn is None:
        return None
    fn = getattr(fn, "fn", fn)
    lines, first = inspect.getsourcelines(fn)
    return Path(inspect.getsourcefile(fn)).name, first, first + len(lines) - 1


def section_counts(ptx: str, sections: dict) -> dict:
    """{"<section>.<op>": count} over the PTX instructions of each section: those whose source
    location, or a location it was inlined at, lies in one of the section's functions (the .loc
    directive gives one inlined-at level, Triton 3.6's comment the whole chain). An instruction of
    Triton's own library (tl.max, tl.topk, ...) whose locations name no file of ours belongs to the
    next instruction that does (library code is inlined just before its result is used). A section
    none of whose functions reached the PTX gets no entries. Counts SECTION_OPS and "instr"."""
    from pathlib import Path

    lines = ptx.splitlines()
    files = {m.group(1): m.group(2) for m in map(_FILE.match, lines) if m}
    library = {Path(f).name for f in files.values() if "/triton/" in f}
    ranges = {sec: [r for r in map(_function_lines, fns) if r] for sec, fns in sections.items()}
    owners, pending, where = [], [], None
    for i, line in enumerate(lines):
        m = _LOC.match(line)
        if m:
            at = [(Path(files.get(m.group(1), "")).name, int(m.group(2)))]
            if m.group(3):
                at.append((Path(files.get(m.group(3), "")).name, int(m.group(4))))
            at += [(f, int(n)) for f, n in _CHAIN.findall(line.partition("//")[2])]
            where = at
            continue
        if where is None or not _INSTR.match(line):
            continue
        if all(f in library for f, _ in where):  # Triton's library: the next instruction of ours decides
            pending.append(i)
            continue
        secs = {sec for sec, rs in ranges.items() for f, n in where for g, lo, hi in rs if f == g and lo <= n <= hi}
        owners += [(j, secs) for j in pending + [i]]
        pending = []
    out = {}
    for sec in ranges:
        body = [lines[j] for j, secs in owners if sec in secs]
        if body:
            text = "\n".join(body)
            out.update({f"{sec}.{op}": len(re.findall(rx, text)) for op, rx in SECTION_OPS.items()})
            out[f"{sec}.instr"] = len(body)
    return out



def gemm_candidate(name: str, cfg, T: int) -> dict:
    """The {"gemm1", "gemm2"} entry a candidate name stands for (configs.candidate_entry; "current":
    the shipped H200 table's for this T bucket)."""
    from megamoe.kernels import configs as cfgs

    entry = cfgs.candidate_entry(name)
    if entry is None:
        return cfgs.select_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k, T,
                                  gpu="NVIDIA H200", dtype="bfloat16", triton_version="3.6.0")
    return entry


def compile_gemms(name: str, T: int, candidate: str, sms: int = 132, fp8: str | None = None,
                  dump: str | None = None, fp8a_tiles: str | None = None) -> list[dict]:
    """GEMM 1 and GEMM 2 of the preset's routed experts at T with the candidate's configs, compiled for sm_90
    (``fp8``: the FP8 GEMMs of fp8_gemm.py, "weights" or "weights+act"; ``fp8a_tiles``: a 128-row tile
    set of the fp8a GEMMs, fp8_plan.FP8A_TILE_CANDIDATES, passed as FP8Options(fp8a_tiles=...));
    ``dump``: a folder for each kernel's IRs, PTX and SASS (DIR/<case>.<candidate>.<gemm>.<ext>)."""
    import torch

    from megamoe.kernels import bench as kb
    from megamoe.kernels import plan
    from megamoe.kernels.fp8_plan import FP8Options
    from megamoe.reference import MoEConfig

    # the preset as benchmarked; with FP8, whole (DeepSeek-V3's shared MLP too: its dense GEMMs compile apart)
    cfg = MoEConfig.preset(name) if fp8 else kb.bench_config(name)
    E, K, H, I = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    entry = gemm_candidate(candidate, cfg, T)
    sp = plan.static_plan(cfg, T, dtype="bfloat16", triton_version="3.6.0", num_sms=sms, gemm=entry, fp8=fp8,
                          fp8_options=FP8Options(fp8a_tiles=fp8a_tiles))
    bf, i32 = torch.bfloat16, torch.int32
    meta = {k: torch.empty(n, dtype=i32) for k, n in (("padded_token", sp.P_max), ("padded_pair", sp.P_max),
                                                      ("block_expert", sp.B_max), ("padded_offsets", E + 1))}
    x, act = torch.empty((T, H), dtype=bf), torch.empty((sp.P_max, I), dtype=bf)
    gu, dn = torch.empty((E, 2 * I, H), dtype=bf), torch.empty((E, H, I), dtype=bf)
    topk_w, pairs = torch.empty((T, K), dtype=torch.float32), torch.empty((T * K, H), dtype=bf)
    g1, g2 = sp.gemm["gemm1"], sp.gemm["gemm2"]
    if fp8:
        l1, l2 = _fp8_launches(sp, cfg, T, x, meta, topk_w, pairs, fp8, sms)
    else:
        l1, l2 = _launches(sp, cfg, T, x, act, gu, dn, meta, topk_w, pairs, sms)
    todo = [("gemm1", l1, g1), ("gemm2", l2, g2)]
    if fp8 and sp.shared:  # the shared MLP's dense GEMMs (no align metadata: None pointers; on an H200
        # a load through one faulted that the routed GEMMs never compile)
        s1, s2 = _fp8_shared_launches(sp, cfg, T, x, pairs, fp8, sms)
        todo += [("shared_gemm1", s1, sp.shared["gemm1"]), ("shared_gemm2", s2, sp.shared["gemm2"])]
    out = []
    for gemm, (fn, grid, args, kwargs), c in todo:
        kwargs = gpu_convert(kwargs)
        tile = "x".join(str(c[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        cand = candidate + (f"+fp8:{fp8}" if fp8 else "") + (f"+{fp8a_tiles}" if fp8a_tiles else "")
        where = (dump, _case_file(f"{name}:{T}.{cand}.{gemm}")) if dump else None
        out.append({"case": f"{name}:{T}", "candidate": cand, "gemm": gemm,
                    "kernel": fn.__name__, "variant": c["variant"], "tile": tile, "grid": grid[0],
                    **compile_kernel(fn, args, kwargs, dump=where)})
    return out


def gpu_convert(kwargs: dict) -> dict:
    """An FP8 GEMM launch's kwargs with the GPU's e4m3 conversion: CPU (or meta) tensors give the launchers the
    interpreter's CVT code (fp8_gemm.py keys it on the device); a GPU's is configs.FP8_CONVERT_DEFAULT's (0 stays)."""
    if "CVT" not in kwargs:
        return kwargs
    from megamoe.kernels.fp8_gemm import convert_code
    from megamoe.kernels.megakernel_config import FP8_CONVERT_DEFAULT

    return {**kwargs, "CVT": convert_code(FP8_CONVERT_DEFAULT, True) if kwargs["CVT"] else 0}


def _launches(sp, cfg, T, x, act, gu, dn, meta, topk_w, pairs, sms):
    from megamoe.kernels import grouped_gemm as gg

    K = cfg.top_k
    g1, g2 = sp.gemm["gemm1"], sp.gemm["gemm2"]
    l1 = gg.gemm1_launch(x, gu, None, act, None, meta, topk_w, g1, activation=cfg.activation, alpha=cfg.swiglu_alpha,
                         limit=cfg.swiglu_limit, scale_input=cfg.weight_on_input, dense=False, num_m=sp.B_max,
                         num_sms=sms)
    l2 = gg.gemm2_launch(act, dn, None, pairs, meta, topk_w, g2, T=T, K=K, KS=K, dense=False, atomic=False,
                         num_m=sp.B_max, num_sms=sms)
    return l1, l2


def _fp8_launches(sp, cfg, T, x, meta, topk_w, pairs, fp8, sms):
    """The FP8 GEMMs' launches: e4m3 weights with their fp32 block scales; with FP8 activations the
    activation buffer as e4m3 codes and per-128-column scales."""
    import torch

    from megamoe.kernels import fp8_gemm as fg
    from megamoe.reference import expected_scale_shapes

    E, K, H, I = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    f8, f32 = torch.float8_e4m3fn, torch.float32
    ss = expected_scale_shapes(cfg)
    gu, dn = torch.empty((E, 2 * I, H), dtype=f8), torch.empty((E, H, I), dtype=f8)
    gus, dns = torch.empty(ss["gate_up_scale_inv"], dtype=f32), torch.empty(ss["down_scale_inv"], dtype=f32)
    if fp8 == "weights+act":
        act, act_s = torch.empty((sp.P_max, I), dtype=f8), torch.empty((sp.P_max, -(-I // 128)), dtype=f32)
    else:
        act, act_s = torch.empty((sp.P_max, I), dtype=x.dtype), None
    g1, g2 = sp.gemm["gemm1"], sp.gemm["gemm2"]
    # x quantized once where the layer does it (plan.quantizes_x): GEMM 1 then reads e4m3 rows and their scales
    x_q = None if sp.quant is None else (torch.empty((T, H), dtype=f8), torch.empty((T, -(-H // 128)), dtype=f32))
    l1 = fg.gemm1_fp8_launch(x, gu, gus, None, act, act_s, meta, topk_w, g1, activation=cfg.activation,
                             alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit, scale_input=cfg.weight_on_input,
                             dense=False, num_m=sp.B_max, num_sms=sms, x_q=x_q)
    out = pairs if sp.split2 == 1 else torch.empty((sp.split2 * T * K, H), dtype=f32)
    l2 = fg.gemm2_fp8_launch(act, act_s, dn, dns, None, out, meta, topk_w, g2, T=T, K=K, KS=K, dense=False,
                             atomic=False, num_m=sp.B_max, split=sp.split2, num_sms=sms)
    return l1, l2


def _fp8_shared_launches(sp, cfg, T, x, pairs, fp8, sms):
    """The shared MLP's FP8 GEMMs as moe.py launches them: dense, one "expert", no align metadata."""
    import torch

    from megamoe.kernels import fp8_gemm as fg

    H, Is, K = cfg.hidden_size, cfg.shared_intermediate_size, cfg.top_k
    f8, f32 = torch.float8_e4m3fn, torch.float32
    kb = 128
    gu, dn = torch.empty((1, 2 * Is, H), dtype=f8), torch.empty((1, H, Is), dtype=f8)
    gus = torch.empty((1, -(-2 * Is // kb), -(-H // kb)), dtype=f32)
    dns = torch.empty((1, -(-H // kb), -(-Is // kb)), dtype=f32)
    if fp8 == "weights+act":
        sh, sh_s = torch.empty((T, Is), dtype=f8), torch.empty((T, -(-Is // kb)), dtype=f32)
    else:
        sh, sh_s = torch.empty((T, Is), dtype=x.dtype), None
    x_q = None if sp.quant is None else (torch.empty((T, H), dtype=f8), torch.empty((T, -(-H // kb)), dtype=f32))
    l1 = fg.gemm1_fp8_launch(x, gu, gus, None, sh, sh_s, {}, None, sp.shared["gemm1"], activation="silu_gated",
                             alpha=1.0, limit=1.0, scale_input=False, dense=True, num_m=sp.shared_m, num_sms=sms,
                             x_q=x_q)
    out = pairs if sp.split2 == 1 else torch.empty((sp.split2 * T * K, H), dtype=f32)
    l2 = fg.gemm2_fp8_launch(sh, sh_s, dn, dns, None, out, {}, None, sp.shared["gemm2"], T=T, K=K, KS=K,
                             dense=True, atomic=False, num_m=sp.shared_m, split=sp.split2, num_sms=sms)
    return l1, l2


def _case_file(case: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", case).strip("_")


def dump_asm(asm: dict, folder: str, case: str) -> None:
    """Write the compiled kernel's ttir, ttgir, llir, ptx and SASS (nvdisasm of the cubin) to folder/<case>.*."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / _case_file(case)
    for ext in ("ttir", "ttgir", "llir", "ptx"):
        if ext in asm:
            Path(f"{stem}.{ext}").write_text(asm[ext])
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(asm["cubin"])
        f.flush()
        sass = subprocess.run([str(tool), "-c", "-g", f.name], capture_output=True, text=True).stdout
    Path(f"{stem}.sass").write_text(sass)


#: what loop_report counts in each innermost loop of the SASS (the PTX names in comments)
LOOP_OPS = {"HMMA": r"HMMA\.", "GMMA": r"[HQ]GMMA\.", "UTMALDG": r"UTMALDG",  # mma.sync; wgmma (QGMMA: e4m3); TMA
            "LDGSTS": r"LDGSTS",  # cp.async.cg
            "DEPBAR": r"DEPBAR",  # cp.async.wait_group
            "LDSM": r"LDSM", "LDS": r"LDS(?:\.|$)", "STS": r"STS", "BAR.SYNC": r"BAR\.SYNC",  # ldmatrix; ld/st.shared
            "LDG": r"LDG(?:\.|$)", "LDL/STL": r"(?:LDL|STL)",  # ld.global; local memory
            "F2F": r"F2F\.", "F2FP": r"F2FP", "PRMT": r"PRMT", "LOP3": r"LOP3", "IMAD.MOV": r"IMAD\.MOV",
            "HMUL2": r"HMUL2", "FFMA": r"FFMA"}


def loop_report(sass: str) -> list[dict]:
    """The innermost loops of ``nvdisasm -c -g`` SASS (a label and a later branch back to it, holding
    no other such loop): per loop its label, instructions, the LOOP_OPS counts and the source line
    most of its instructions come from (file:line, to tell GEMM 1's K loop from GEMM 2's)."""
    import collections

    lines = sass.splitlines()
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", ln.strip()))}
    loops = [(labels[m.group(1)], i, m.group(1)) for i, ln in enumerate(lines)
             if (m := re.search(r"\bBRA\s+`?\(?(\.L_x_\d+)", ln)) and labels.get(m.group(1), i) < i]
    out = []
    for lo, hi, lab in loops:
        if any((o, p) != (lo, hi) and lo <= o and p <= hi for o, p, _ in loops):
            continue
        ops, src, where = [], collections.Counter(), None
        for ln in lines[lo:hi + 1]:
            if m := re.search(r'File "([^"]+)", line (\d+)', ln):
                where = f"{m.group(1).rsplit('/', 1)[-1]}:{m.group(2)}"
            elif m := re.match(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", ln):
                ops.append(m.group(1))
                src[where] += 1
        row = {"label": lab, "source": src.most_common(1)[0][0] if src else None, "instructions": len(ops)}
        row.update({k: sum(1 for o in ops if re.match(rx, o)) for k, rx in LOOP_OPS.items()})
        out.append(row)
    return out


def _cuobjdump(cubin: bytes, *flags: str) -> str:
    """The stdout of Triton's own cuobjdump on a cubin."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), *flags, f.name], capture_output=True, text=True).stdout


def resource_usage(cubin: bytes) -> dict:
    """Registers, stack frame and spill bytes of the kernel, from cuobjdump --dump-resource-usage
    (the one that ships with Triton)."""
    text = _cuobjdump(cubin, "--dump-resource-usage")
    out = {}
    for key, rx in (("regs", r"REG:(\d+)"), ("stack_bytes", r"STACK:(\d+)"), ("local_bytes", r"LOCAL:(\d+)")):
        m = re.search(rx, text)
        out[key] = int(m.group(1)) if m else None
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="+", help="preset:T")
    p.add_argument("--warps", type=int)
    p.add_argument("--stages", type=int)
    p.add_argument("--gemm", nargs="+", default=None,
                   help="GEMM candidates (current tma64 tma128 tma256, or with overrides: configs.candidate_entry): "
                        "compile the routed grouped GEMMs instead of the megakernel")
    p.add_argument("--fp8", choices=["weights", "weights+act"], default=None,
                   help="the FP8 GEMMs (e4m3 weights with block scales; activations too): with --gemm the "
                        "multi-launch GEMMs, else the megakernel's FP8 tiles")
    p.add_argument("--fp8a-tiles", nargs="+", default=[None], metavar="NAME",
                   help="with --gemm and --fp8 weights+act: 128-row tile candidates of the fp8a GEMMs "
                        "(fp8_plan.FP8A_TILE_CANDIDATES, 'm64' the 64-row tiles; 'default' the default) to compile each")
    p.add_argument("--variants", nargs="+", default=[None], metavar="NAME",
                   help="megakernel variants (megakernel_variants.VARIANTS) to compile instead of the default "
                        "('default' for the default itself)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="megakernel config change, e.g. topk_bitonic=1 or tiles.router.TOPK_T=4 (repeatable)")
    p.add_argument("--dump", default=None, help="write each kernel's IRs, PTX and SASS to this folder")
    p.add_argument("--loops", action="store_true", help="with --dump: print the innermost SASS loops holding an MMA "
                   "(loop_report)")
    p.add_argument("--trace", action="store_true", help="compile the traced megakernel (kernels.megakernel's trace: "
                   "%%globaltimer stamps per task, per program and of the first top-k task)")
    a = p.parse_args(argv)
    if a.fp8a_tiles != [None] and (not a.gemm or a.fp8 != "weights+act"):
        p.error("--fp8a-tiles needs --gemm and --fp8 weights+act")
    sets = parse_sets(a.set)
    for c in a.cases:
        name, T = c.split(":")
        if a.gemm:
            for cand in a.gemm:
                for tiles in a.fp8a_tiles:
                    for r in compile_gemms(name, int(T), cand, fp8=a.fp8, dump=a.dump,
                                           fp8a_tiles=None if tiles == "default" else tiles):
                        print(r, flush=True)
                        if a.dump and a.loops:
                            _print_loops(a.dump, f"{r['case']}.{r['candidate']}.{r['gemm']}")
        else:
            for v in a.variants:
                r = compile_case(name, int(T), a.warps, a.stages, fp8=a.fp8, dump=a.dump,
                                 variant=None if v == "default" else v, sets=sets, traced=a.trace)
                print(r, flush=True)
                if a.dump and a.loops:
                    _print_loops(a.dump, r["case"])
    return 0


def _print_loops(folder: str, case: str) -> None:
    """Print the innermost SASS loops holding an MMA of the kernel dumped as ``case``."""
    from pathlib import Path

    for lp in loop_report((Path(folder) / f"{_case_file(case)}.sass").read_text()):
        if lp["HMMA"] or lp["GMMA"]:
            print("    loop", lp, flush=True)


if __name__ == "__main__":
    sys.exit(main())
