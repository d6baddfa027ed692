"""megamoe.kernels: the fused MoE layer as Triton kernels on one GPU.

Shape legend: T tokens, E routed experts, K top-k, H hidden, I expert width, Is shared width.

Public names (loaded lazily, so ``import megamoe.kernels`` needs neither torch nor triton):
    moe_forward(x, weights, config, deterministic=True, backend="auto")   the layer (kernels.moe)
    moe_experts(x, topk_idx, topk_weights, gate_up, down, backend="multi")  a routing made elsewhere
    check_routing(device)                                 waits for moe_experts' pending routing checks, raises
    launch_plan(config, T, ...)                           what the multi-launch path runs, as data (kernels.plan)
    ep_moe_experts(x, topk_idx, topk_weights, shard)      the routed experts expert-parallel (kernels.ep)
    pull_rows_triton(pull, rank, send_buffers, recv)      one rank's one-sided pulls of plan_pull (kernels.ep_pull)
    push_rows_triton(pull, rank, partial, combine_buffers) its push-backs (kernels.ep_pull)
    ep_moe_experts_symmetric(x, topk_idx, topk_weights, shard, buffers)  one-sided, through symmetric
                                                          memory (kernels.ep_symmetric, SymmetricBuffers)
The modules and their jobs: docs/design.md.
"""

from __future__ import annotations

_LAZY = {
    "moe_forward": ("moe", "moe_forward"),
    "moe_forward_details": ("moe", "moe_forward_details"),
    "bind": ("moe", "bind"),
    "moe_experts": ("moe", "moe_experts"),
    "megakernel_forward": ("megakernel", "megakernel_forward"),
    "check_captured_routing": ("checks", "check_captured_routing"),
    "check_routing": ("checks", "check_routing"),
    "register_transformers": ("hf_experts", "register"),
    "check_inputs": ("moe", "check_inputs"),
    "KernelInputError": ("checks", "KernelInputError"),
    "launch_plan": ("plan", "launch_plan"),
    "LaunchPlan": ("plan", "LaunchPlan"),
    "Stage": ("plan", "Stage"),
    "ep_moe_experts": ("ep", "ep_moe_experts"),
    "shard_weights": ("ep", "shard_weights"),
    "pull_rows_triton": ("ep_pull", "pull_rows_triton"),
    "push_rows_triton": ("ep_pull", "push_rows_triton"),
    "ep_moe_experts_symmetric": ("ep_symmetric", "ep_moe_experts_symmetric"),
    "SymmetricBuffers": ("ep_symmetric", "SymmetricBuffers"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{mod}", __name__), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
