"""The multi-launch router's prefill logits launch of every preset, compiled for Hopper (sm_90) on
this machine (a compile, not a run): within an H200 SM's shared memory and without spills. Run BU
(H200) found Kimi-K2's 128 x 512 fp32 tile past the limit at T = 600, an OutOfResources raised from
inside the launch; configs.ROUTER_PREFILL_ACC_BYTES bounds the tile since."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from megamoe.kernels import configs as cfgs
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
    args = [[*k, T, H, E, hps] for k, (_, T, H, E, hps) in launches.items()]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    bench = str(Path(__file__).resolve().parents[1] / "benchmarks")
    r = subprocess.run([sys.executable, "-c", _COMPILE, bench, json.dumps(args)], capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    compiled = json.loads(r.stdout.strip().splitlines()[-1])
    for (key, who), (shared, spills) in zip(launches.items(), compiled):
        assert shared <= H200_BLOCK_SHARED and spills == 0, (who, key, shared, spills)
