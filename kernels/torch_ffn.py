"""The experts' gated activation in plain torch, for the torch-side paths (the PyTorch baseline
of kernels/bench.py, the CPU local experts of kernels/ep.py); the Triton kernels apply the same
formulas in grouped_gemm._act_epilogue."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gated_activation(h: torch.Tensor, width: int, activation: str, alpha: float, limit: float) -> torch.Tensor:
    """h (rows, 2 * width) = [gate | up] -> (rows, width): the activation (reference.forward's formulas)."""
    g, u = h[:, :width], h[:, width:]
    if activation == "silu_gated":
        return F.silu(g) * u
    g = g.clamp(max=limit)
    u = u.clamp(-limit, limit)
    return (u + 1) * g * torch.sigmoid(alpha * g)
