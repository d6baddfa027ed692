"""How a layer is measured on a GPU: the preset as benchmarked, weights made on the device, and the
median per call of CUDA-graph replays over fresh inputs (``graph_time_us``).

Shape legend: T tokens, NI inputs (and layer calls) per graph.
"""

from __future__ import annotations

import statistics


def bench_config(name: str):
    """The preset as benchmarked: DeepSeek-V3's routed experts only (as in vLLM's figures)."""
    from ..reference import MoEConfig

    cfg = MoEConfig.preset(name)
    if name == "deepseek-v3":
        cfg = cfg.replace(num_shared_experts=0, shared_intermediate_size=0)
    return cfg


def random_device_weights(cfg, seed: int = 0):
    """bf16 weights on the GPU, N(0, 1/fan_in), made on the device (a full DeepSeek-V3 layer is 22 GB)."""
    import torch

    from ..reference import MoEWeights, expected_shapes

    gen = torch.Generator(device="cuda").manual_seed(seed)
    H, I = cfg.hidden_size, cfg.intermediate_size
    fan = {"router_weight": H, "gate_up": H, "down": I, "shared_gate_up": H,
           "shared_down": max(cfg.shared_intermediate_size, 1), "shared_gate": H}
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if shape is None:
            continue
        t = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        scale = fan[name] ** -0.5 if name in fan else (0.05 if name == "score_bias" else 0.1)
        out[name] = t.mul_(scale)
    return MoEWeights(**out)


def inputs_per_graph(T: int) -> int:
    """NI: fresh inputs (and layer calls) captured in one CUDA graph of T-token calls."""
    return 8 if T <= 512 else (4 if T <= 4096 else 2)


#: eager calls ``graph_time_us`` makes before it captures the graph
WARMUP_CALLS = 2


def graph_time_us(fn, inputs: list, reps: int, clock: dict | None = None) -> float:
    """Median per-call time (us) of fn over the NI inputs, captured as one CUDA graph of NI calls
    after WARMUP_CALLS eager calls; ``clock``: filled with telemetry's summary."""
    import torch

    from .telemetry import sampled

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for a in inputs[:WARMUP_CALLS]:
            fn(a)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for a in inputs:
            fn(a)
    g.replay()
    torch.cuda.synchronize()
    times = []
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with sampled(clock):
        for _ in range(reps):
            st.record()
            g.replay()
            en.record()
            en.synchronize()
            times.append(st.elapsed_time(en) * 1e3 / len(inputs))
    del g
    return statistics.median(times)


def calls_before_timed_replay(ni: int, reps: int) -> float:
    """Calls ``graph_time_us`` runs before the median replay (``ni`` calls, ``reps`` replays)."""
    ni, reps = max(int(ni), 1), max(int(reps), 1)
    return min(WARMUP_CALLS, ni) + ni * (1 + (reps - 1) / 2)


#: the multi-launch pipeline's prefixes the per-stage breakdown times (kernels.moe._forward's stop_after)
BREAKDOWN_STOPS = ("align", "gemm1", "gemm2")


def stage_split(prefix_us: dict, total_us: float) -> dict:
    """The multi-launch stages' times from its prefixes' times (BREAKDOWN_STOPS -> us)."""
    return {"router+align": prefix_us["align"], "gemm1": prefix_us["gemm1"] - prefix_us["align"],
            "gemm2": prefix_us["gemm2"] - prefix_us["gemm1"], "combine": total_us - prefix_us["gemm2"]}
