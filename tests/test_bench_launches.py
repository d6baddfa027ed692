"""benchmarks/bench_router.py, profile_launches.py and bench_sustained.py without a GPU: they refuse to run (exit 2, a
line naming what they need) before any GPU work, and profile_launches prices the launch plan of a
routing kernel by kernel as it prints it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from benchload import load_benchmark


@pytest.mark.parametrize("name", ["bench_router", "profile_launches", "bench_sustained"])
def test_without_a_gpu_they_say_so(name, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the scripts would run")
    assert load_benchmark(name).main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_model_column_sums_a_kernels_stages():
    """The routed and the shared MLP's GEMMs share a kernel: profile_launches' model figure for a
    kernel is the sum of its stages' prices, as the profiler's is the sum of its launches (DeepSeek-V3
    with its shared expert, T = 64)."""
    from megamoe.kernels.plan import launch_plan
    from megamoe.reference import MoEConfig

    cfg = MoEConfig.preset("deepseek-v3")
    rng = np.random.default_rng(0)
    idx = np.stack([rng.choice(cfg.num_experts, cfg.top_k, replace=False) for _ in range(64)]).astype(np.int32)
    lp = launch_plan(cfg, 64, topk_idx=idx, dtype="bfloat16", device_name="NVIDIA H200", num_sms=132,
                     triton_version="3.6.0")
    by_kernel, pred = load_benchmark("profile_launches").predicted_by_kernel(lp, "h200")
    kernels = [s.kernel for s in lp.stages]
    assert len(set(kernels)) < len(kernels) and set(by_kernel) == set(kernels)  # some kernel runs twice
    twice = next(k for k in kernels if kernels.count(k) > 1)
    assert by_kernel[twice] == pytest.approx(sum(p["time_us"] for s, p in zip(lp.stages, pred["stages"])
                                                 if s.kernel == twice))
    assert sum(by_kernel.values()) == pytest.approx(pred["time_us"] - pred["fixed_us"])
