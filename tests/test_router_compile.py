"""Launches the H200 refused, or the compile audit (benchmarks/compile_audit.py) flagged, compiled for Hopper
(sm_90) on this machine (a compile, not a run): within an H200 block's shared memory. Run BU (H200) found the
multi-launch router's prefill logits launch for Kimi-K2 (a 128 x 512 fp32 tile) past the limit at T = 600, an
OutOfResources raised from inside the launch (configs.ROUTER_PREFILL_ACC_BYTES bounds the tile since); the
audit found the weight-only FP8 megakernel of Kimi-K2 and DeepSeek-V3 past it at T = 400-512
(configs.FP8_WIDE_SHARED_MAX_STAGES)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from megamoe.kernels import configs as cfgs
from megamoe.kernels import megakernel_config as mkc
from megamoe.kernels.plan import router_launch
from megamoe.reference import PRESETS, MoEConfig

#: an H200 SM's shared memory a block may take (bytes; 227 KiB, the OutOfResources limit of run BU)
H200_BLOCK_SHARED = 232448
PREFILL_T = (512, 4096, 16384)

_COMPILE = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from compile_report import compile_kernel
from megamoe.kernels.routing import _router_logits_kernel
bf, f32 = torch.empty(8, dtype=torch.bfloat16), torch.empty(8, dtype=torch.float32)
out = []
for lt, be, bh, warps, T, H, E, hps in json.loads(sys.argv[2]):
    r = compile_kernel(_router_logits_kernel, (bf, bf, None, f32, None, T, H, E, H, H, hps),
                       dict(HAS_SG=False, IEEE=False, BLOCK_T=lt, BLOCK_E=be, BLOCK_H=bh, num_warps=warps, num_stages=3))
    out.append([r["shared"], r["sass.STL"]])
print(json.dumps(out))
"""


def _compiled(script: str, cases: list) -> list:
    """``script``'s JSON answer for ``cases`` (JSON), run in a process without TRITON_INTERPRET (a compile for
    sm_90 needs the kernels defined for the GPU) with benchmarks/ as its first argument."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    bench = str(Path(__file__).resolve().parents[1] / "benchmarks")
    r = subprocess.run([sys.executable, "-c", script, bench, json.dumps(cases)], capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _prefill_launches() -> dict:
    """{(LOGITS_T, BLOCK_E, BLOCK_H, warps): (preset, T, H, E, H_PER_SPLIT)} of the presets' prefill logits launches."""
    out = {}
    for name in PRESETS:
        cfg = MoEConfig.preset(name)
        E, H = cfg.num_experts, cfg.hidden_size
        for T in PREFILL_T:
            if not cfgs.router_prefill(T, E, H):
                continue
            rl = router_launch(T, E, H, cfg.top_k, cfg.n_group)
            key = (rl["LOGITS_T"], rl["BLOCK_E"], rl["BLOCK_H"], rl["logits_warps"])
            out.setdefault(key, (name, T, H, E, rl["H_PER_SPLIT"]))
    return out


def test_prefill_logits_tile_keeps_its_accumulator_bounded():
    """Every preset's prefill tile holds at most ROUTER_PREFILL_ACC_BYTES of fp32 logits; DeepSeek-V3
    keeps its 128-token tiles (256 experts), Kimi-K2 (384) takes 64."""
    launches = _prefill_launches()
    assert {v[0] for v in launches.values()} >= {"deepseek-v3", "kimi-k2"}
    for (lt, be, _, _), who in launches.items():
        assert lt * be * 4 <= cfgs.ROUTER_PREFILL_ACC_BYTES, who
    assert cfgs.router_logits_tile(4096, 256, 7168, tiles=True)[0] == cfgs.ROUTER_PREFILL_T
    assert cfgs.router_logits_tile(4096, 384, 7168, tiles=True)[0] == 64


def test_prefill_logits_launches_compile_within_an_h200_sm():
    """Compiled for sm_90 (Triton's own ptxas, no GPU): each distinct prefill logits launch of the
    presets fits an H200 block's shared memory and spills nothing."""
    launches = _prefill_launches()
    compiled = _compiled(_COMPILE, [[*k, T, H, E, hps] for k, (_, T, H, E, hps) in launches.items()])
    for (key, who), (shared, spills) in zip(launches.items(), compiled):
        assert shared <= H200_BLOCK_SHARED and spills == 0, (who, key, shared, spills)


_COMPILE_MK = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import compile_audit as ca
from megamoe.reference import MoEConfig
out = []
for name, T, fp8 in json.loads(sys.argv[2]):
    spec, _occ = ca.megakernel_spec(MoEConfig.preset(name), name, T, fp8)
    r = ca.compile_entry(spec)
    out.append([r.get("shared"), r.get("regs"), r.get("error")])
print(json.dumps(out))
"""


def test_fp8_weight_megakernel_with_a_wide_shared_mlp_fits_an_h200_sm():
    """The compile audit's one finding (session 18): the weight-only FP8 megakernel of Kimi-K2 (its shared MLP,
    64-row tiles, a 128-column shared GEMM 1 tile) at T = 512 took 327,680 bytes of shared memory at 4 stages;
    configs.FP8_WIDE_SHARED_MAX_STAGES keeps it within an H200 block (a compile for sm_90, no GPU)."""
    cfg = MoEConfig.preset("kimi-k2")
    mk = mkc.megakernel_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k,
                                cfg.shared_intermediate_size, 512, num_sms=132, fp8="weights")
    assert mk["tiles"]["shared"]["BLOCK_N1"] == 128 and mk["tiles"]["gemm1"]["BLOCK_M"] == 64
    assert mk["num_stages"] <= mkc.FP8_WIDE_SHARED_MAX_STAGES
    (shared, regs, error), = _compiled(_COMPILE_MK, [["kimi-k2", 512, "weights"]])
    assert error is None and shared <= H200_BLOCK_SHARED and regs <= 255, (shared, regs, error)
