"""The deep readers of the hbm_deep calibration step (megamoe/calibrate/microbench_deep.py) read what they claim
under the interpreter at tiny sizes (never timed), and compile for sm_90 to the depths the step's table
is keyed by."""

from __future__ import annotations

import json

import pytest
import torch


@pytest.mark.interpret
def test_deep_read_streams_each_groups_region():
    """Program p sums region p // g (checked against torch: a @ the region's K tiles, gate and up rows
    added): the programs of a group get the same sums, the groups different ones; one tile a step or
    two (gated); a given A and a given output buffer (its first P rows); bad sizes refused by name."""
    from megamoe.calibrate import microbench_deep as md

    dtype = torch.float16  # the bf16 weights' stand-in
    torch.manual_seed(0)
    w = torch.randn(4 * 2 * 16 * 16 * 3).to(dtype)  # 4 gated regions of 3 K steps of 16 x 16 tiles
    kw = dict(block_n=16, block_k=16, num_stages=1)
    for P, g, gated in ((5, 2, False), (6, 4, True)):  # a short last group; gated, P not a multiple of g
        per = (2 if gated else 1) * 16 * 16 * w.element_size() * 3
        out, _ = md.deep_read(w, P, per, group=g, gated=gated, check=True, **kw)
        assert out.shape == (P, 16, 16)
        for p in range(P):  # a group reads one region: the same sums
            assert torch.equal(out[p], out[p - p % g])
        if P > g:
            assert not torch.allclose(out[0], out[g])  # the next group reads the next region
    gated, ungated = (md.deep_read(w, 2, 2 * 16 * 16 * w.element_size(), gated=x, check=True, **kw)[0]
                      for x in (True, False))
    assert not torch.allclose(gated, ungated)  # gated: a region's gate rows and up rows
    a = torch.randn(16, 16).to(dtype)
    buf = torch.full((7, 16, 16), float("nan"))
    out, _ = md.deep_read(w, 3, 16 * 16 * w.element_size(), group=2, a=a, out=buf, check=True, **kw)
    assert out.data_ptr() == buf.data_ptr() and not buf[:3].isnan().any() and buf[3:].isnan().all()
    tile = 16 * 16 * w.element_size()
    for bad, match in ((dict(programs=1, bytes_per_program=tile + 4), "must be a positive multiple of"),
                       (dict(programs=1, bytes_per_program=tile, gated=True), "must be a positive multiple of"),
                       (dict(programs=9, bytes_per_program=6 * tile), "9 regions of .* read past the end of w"),
                       (dict(programs=2, bytes_per_program=tile, group=0), "programs and group must be >= 1"),
                       (dict(programs=8, bytes_per_program=tile, out=buf), "out must be a contiguous fp32"),
                       (dict(programs=1, bytes_per_program=tile, a=a[:, :8]), "a must be a contiguous")):
        args = {**kw, **bad}
        with pytest.raises(ValueError, match=match):
            md.deep_read(w, args.pop("programs"), args.pop("bytes_per_program"), **args)


def test_deep_read_depths_are_the_plans_pipeline_formula():
    """A reader's depth is plan.gemm_shared_bytes of its tile without A bytes (16-row tiles:
    num_stages - 1 buffers): the calibrate step's readers keep 32, 48, 96, 128 and 192 KiB in flight, the
    second the hbm step's reader (stream_tile's 64 x 128 tiles at 4 stages: cost.HBM_GRID_READER_DEPTH_BYTES);
    the quick step keeps the grid's reader first."""
    from megamoe.calibrate.memory import HBM_DEEP_READERS, HBM_DEEP_READERS_QUICK
    from megamoe.calibrate.microbench_deep import deep_read_depth
    from megamoe.simulator import cost

    depths = [deep_read_depth(bn, bk, st, gated=g) for bn, bk, st, g in HBM_DEEP_READERS]
    assert depths == [32 << 10, 48 << 10, 96 << 10, 128 << 10, 192 << 10]
    assert depths[1] == cost.HBM_GRID_READER_DEPTH_BYTES
    assert set(HBM_DEEP_READERS_QUICK) <= set(HBM_DEEP_READERS) and HBM_DEEP_READERS_QUICK[0] == HBM_DEEP_READERS[1]
    assert deep_read_depth(64, 128, 4, block_m=64) == 4 * 64 * 128 * 2  # wgmma tiles: num_stages buffers


_COMPILE_DEEP = r"""
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource
from megamoe.calibrate.memory import HBM_DEEP_READERS
from megamoe.calibrate.microbench_deep import _deep_read_kernel as fn

target = GPUTarget("cuda", 90, 32)
out = []
for bn, bk, st, gated in (HBM_DEEP_READERS[1], HBM_DEEP_READERS[-1]):
    signature, constexprs, attrs = {}, {}, {}
    nospec = set(getattr(fn, "do_not_specialize", ()) or ())
    for i, (p, n) in enumerate(zip(fn.params, fn.arg_names)):
        if p.is_constexpr:
            signature[n] = "constexpr"
            constexprs[n] = {"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk, "GATED": gated}[n]
            continue
        signature[n] = {"w_ptr": "*bf16", "a_ptr": "*bf16", "out_ptr": "*fp32"}.get(n, "i32")
        if signature[n].startswith("*") and n not in nospec:
            attrs[(i,)] = CUDABackend(target).parse_attr("D")  # as the JIT marks a 16-byte aligned pointer
    k = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                       options={"num_warps": 4, "num_stages": st})
    ptx = k.asm["ptx"]
    out.append([k.metadata.shared, len(re.findall(r"cp\.async\.cg", ptx))])
print(json.dumps(out))
"""


def test_deep_readers_compile_to_their_depth_for_hopper():
    """Compiled for sm_90 as the calibrate step launches them (4 warps, bf16), the shallowest ungated
    reader's and the deepest gated reader's shared memory is its depth and one 16 x BK A tile (Triton keeps num_stages - 1 buffers of cp.async
    loads for 16-row tiles, as plan.gemm_shared_bytes says), at most an H200 SM's 227 KiB a block,
    the 192 KiB one above half of it (one program per SM). (In a process without TRITON_INTERPRET;
    a compile, not a run.)"""
    import os
    import subprocess
    import sys

    from megamoe.calibrate.memory import HBM_DEEP_READERS
    from megamoe.calibrate.microbench_deep import deep_read_depth

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE_DEEP], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    compiled = json.loads(r.stdout.strip().splitlines()[-1])
    for (bn, bk, st, gated), (shared, cp_async) in zip((HBM_DEEP_READERS[1], HBM_DEEP_READERS[-1]), compiled):
        assert shared == deep_read_depth(bn, bk, st, gated=gated) + 16 * bk * 2, (bn, bk, st, gated, shared)
        assert cp_async > 0 and shared <= 227 * 1024
    assert compiled[-1][0] > 227 * 1024 // 2
