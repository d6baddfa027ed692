"""Compile the megakernel for Hopper (sm_90) on a machine without a GPU and report its resources.

    python benchmarks/compile_report.py qwen3-30b-a3b:1 deepseek-v3:1 [--warps 8] [--stages 3]

Builds the launch as kernels.megakernel.megakernel_forward does for the preset at T (its
``build_launch``, on CPU tensors of the right dtypes), compiles it with Triton's own ptxas for
sm_90, and prints registers per thread, spilled registers, shared memory, and counts of the PTX
instructions that tell whether the inner loops are pipelined (cp.async, wgmma, mma.sync) and
whether registers went to local memory. Costs no device time; this machine's Triton may differ
from the GPU machine's, so the figures are a guide, not the GPU's report.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)

OPS = {"cp.async": r"cp\.async\.cg", "cp.async.bulk": r"cp\.async\.bulk", "wgmma": r"wgmma\.mma_async",
       "mma.sync": r"mma\.sync", "ld.local": r"ld\.local", "st.local": r"st\.local"}


def _sig(v) -> str:
    import torch

    if isinstance(v, torch.Tensor):
        return "*" + {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
                      torch.int64: "i64"}[v.dtype]
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i64" if abs(v) >= 2**31 else "i32"
    if isinstance(v, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(v).__name__}")


def compile_case(name: str, T: int, warps: int | None = None, stages: int | None = None, sms: int = 132,
                 mk: dict | None = None) -> dict:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from megamoe.kernels import bench as kb
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import megakernel as mkm
    from megamoe.reference import MoEWeights, expected_shapes
    from megamoe.reference.tiles import task_layout

    cfg = kb.bench_config(name)
    w = MoEWeights(**{k: torch.empty(s, dtype=torch.bfloat16) for k, s in expected_shapes(cfg).items() if s is not None})
    mk = mk or cfgs.megakernel_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k,
                                      cfg.shared_intermediate_size, T, num_sms=sms)
    mk = {**mk, "num_warps": warps or mk["num_warps"], "num_stages": stages or mk["num_stages"]}
    lay = task_layout(cfg, T, mk["tiles"])
    x = torch.empty((T, cfg.hidden_size), dtype=torch.bfloat16)
    _grid, args, kwargs, _y, _stats = mkm.build_launch(
        x, w, cfg, mk, nprog=min(sms * mk["occupancy"], lay.max_tasks),
        sync=torch.zeros(lay.sync_words, dtype=torch.int32))
    fn = mkm._megakernel
    opts = {k: kwargs.pop(k) for k in ("num_warps", "num_stages")}
    vals = {**dict(zip(fn.arg_names, args)), **kwargs}
    from triton.backends.nvidia.compiler import CUDABackend

    target = GPUTarget("cuda", 90, 32)
    backend = CUDABackend(target)
    signature, constexprs, attrs = {}, {}, {}
    nospec = set(getattr(fn, "do_not_specialize", ()) or ())
    for i, (p, n) in enumerate(zip(fn.params, fn.arg_names)):
        v = vals[n]
        if p.is_constexpr or v is None:
            signature[n], constexprs[n] = "constexpr", v
            continue
        signature[n] = _sig(v)
        # what the JIT infers at a launch: 16-byte aligned pointers, integers divisible by 16
        if n not in nospec and i not in nospec and not isinstance(v, (bool, float)) and (
                isinstance(v, torch.Tensor) or v % 16 == 0):
            attrs[(i,)] = backend.parse_attr("D")
    k = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=opts)
    ptx = k.asm.get("ptx", "")
    return {"case": f"{name}:{T}", "warps": opts["num_warps"], "stages": opts["num_stages"],
            **resource_usage(k.asm["cubin"]), "shared": k.metadata.shared,
            **{op: len(re.findall(rx, ptx)) for op, rx in OPS.items()}}


def resource_usage(cubin: bytes) -> dict:
    """Registers, stack frame and spill bytes of the kernel, from cuobjdump --dump-resource-usage
    (the one that ships with Triton)."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
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
    a = p.parse_args(argv)
    for c in a.cases:
        name, T = c.split(":")
        print(compile_case(name, int(T), a.warps, a.stages), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
