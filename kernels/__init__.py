"""megamoe.kernels: the fused MoE layer as Triton kernels on one GPU.

Shape legend: T tokens, E routed experts, K top-k, H hidden, I expert width, Is shared width.

Public names (loaded lazily, so ``import megamoe.kernels`` needs neither torch nor triton):
    moe_forward(x, weights, config, deterministic=True)   the layer (kernels.moe)
    launch_plan(config, T, ...)                           what the kernels run, as data (kernels.plan)
Files: routing.py (router), align.py (sort/pad pairs by expert), grouped_gemm.py (GEMMs, combine),
configs.py + configs/*.json (tuned launch configs), plan.py, moe.py (the torch op), checks.py (the routing
check of moe_experts), bench.py.
"""

from __future__ import annotations

_LAZY = {
    "moe_forward": ("moe", "moe_forward"),
    "moe_forward_details": ("moe", "moe_forward_details"),
    "bind": ("moe", "bind"),
    "moe_experts": ("moe", "moe_experts"),
    "check_captured_routing": ("checks", "check_captured_routing"),
    "register_transformers": ("hf_experts", "register"),
    "check_inputs": ("moe", "check_inputs"),
    "KernelInputError": ("moe", "KernelInputError"),
    "launch_plan": ("plan", "launch_plan"),
    "LaunchPlan": ("plan", "LaunchPlan"),
    "Stage": ("plan", "Stage"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{mod}", __name__), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
