"""A transformers 5 experts backend: ``experts_implementation="megamoe"``.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width.

The experts module gets ``(hidden_states (T, H), top_k_index (T, K), top_k_weights (T, K))`` and
holds ``gate_up_proj`` (E, 2I, H) and ``down_proj`` (E, H, I) (megamoe's layout), run through
``moe.moe_experts``.

    from megamoe.kernels import register_transformers
    register_transformers()                      # once, before loading
    model = AutoModelForCausalLM.from_pretrained(..., experts_implementation="megamoe")

Modules it cannot take exactly (other layouts, activations, norms, expert parallelism) go to
transformers' ``grouped_mm`` backend.
"""

from __future__ import annotations

NAME = "megamoe"


def _supported(module) -> bool:
    import torch
    from transformers.integrations import moe as hf_moe

    if not getattr(module, "has_gate", True) or not getattr(module, "is_concatenated", True):
        return False
    if getattr(module, "is_transposed", False) or getattr(module, "has_post_expert_norm", False):
        return False
    if getattr(module, "_is_expert_parallel", False):
        return False
    if getattr(type(module), "_apply_gate", hf_moe._default_apply_gate) is not hf_moe._default_apply_gate:
        return False
    act = getattr(module, "act_fn", None)
    if not (isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"
            or getattr(act, "__name__", "") == "silu"):
        return False
    gu, dn = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gu, torch.Tensor) or not isinstance(dn, torch.Tensor) or gu.dim() != 3 or dn.dim() != 3:
        return False
    E, I2, H = gu.shape
    if tuple(dn.shape) != (E, H, I2 // 2):
        return False
    return gu.is_cuda or gu.device.type == "cpu"


def experts_forward(self, hidden_states, top_k_index, top_k_weights, *, backend: str = "auto"):
    """The ExpertsInterface entry: (T, H), (T, K), (T, K) -> (T, H) in hidden_states' dtype."""
    if not _supported(self) or hidden_states.dtype != self.gate_up_proj.dtype:
        from transformers.integrations.moe import grouped_mm_experts_forward

        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    from .moe import moe_experts

    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    has_bias = getattr(self, "has_bias", False)
    y = moe_experts(
        x, top_k_index.reshape(x.shape[0], -1), top_k_weights.reshape(x.shape[0], -1), self.gate_up_proj,
        self.down_proj, self.gate_up_proj_bias if has_bias else None, self.down_proj_bias if has_bias else None,
        backend=backend,
    )
    return y.reshape(shape)


def register(name: str = NAME, *, backend: str = "auto") -> str:
    """Register the backend in transformers' ExpertsInterface under ``name``; returns the name."""
    import functools

    from transformers.integrations.moe import ExpertsInterface

    from .moe import BACKENDS, KernelInputError

    if backend not in BACKENDS:
        raise KernelInputError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    fn = experts_forward if backend == "auto" else functools.partial(experts_forward, backend=backend)
    ExpertsInterface.register(name, fn)
    return name
