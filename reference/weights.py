"""MoEWeights: one MoE layer's parameters in megamoe's canonical layout.

Shape legend: E routed experts, H hidden size, I expert width, Is shared width (all shared experts).

Canonical layout (torch ``nn.Linear`` convention: weight [out_features, in_features]):

    router_weight   (E, H)        logits = x @ router_weight.T (+ router_bias)
    router_bias     (E,) | None   gpt-oss
    score_bias      (E,) | None   DeepSeek e_score_correction_bias (expert selection only)
    gate_up         (E, 2I, H)    rows [0, I) the gate projection, rows [I, 2I) the up projection
                                  (NOT interleaved; gpt-oss's interleaved tensor is split on load)
    gate_up_bias    (E, 2I) | None
    down            (E, H, I)
    down_bias       (E, H) | None
    shared_gate_up  (2Is, H) | None  the shared experts fused into one MLP of width Is
    shared_down     (H, Is) | None
    shared_gate     (H,) | None   Qwen2-MoE: shared output scaled by sigmoid(x . shared_gate)

Arrays are float64 NumPy in the reference; ``to_torch`` gives the same class holding torch tensors,
which is what ``megamoe.kernels.moe_forward`` takes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._checks import InputError, check_shape
from .config import MoEConfig

#: Field names in canonical order.
FIELDS = (
    "router_weight", "router_bias", "score_bias", "gate_up", "gate_up_bias", "down", "down_bias",
    "shared_gate_up", "shared_down", "shared_gate",
)


def expected_shapes(config: MoEConfig) -> dict[str, tuple[int, ...] | None]:
    """Shape of every field for ``config``; None where the field must be absent."""
    E, H, I, Is = config.num_experts, config.hidden_size, config.intermediate_size, config.shared_intermediate_size
    shared = config.num_shared_experts > 0
    return {
        "router_weight": (E, H),
        "router_bias": (E,) if config.router_bias else None,
        "score_bias": (E,) if config.score_bias else None,
        "gate_up": (E, 2 * I, H),
        "gate_up_bias": (E, 2 * I) if config.expert_bias else None,
        "down": (E, H, I),
        "down_bias": (E, H) if config.expert_bias else None,
        "shared_gate_up": (2 * Is, H) if shared else None,
        "shared_down": (H, Is) if shared else None,
        "shared_gate": (H,) if config.shared_expert_gate else None,
    }


@dataclass(frozen=True)
class MoEWeights:
    router_weight: Any
    gate_up: Any
    down: Any
    router_bias: Any = None
    score_bias: Any = None
    gate_up_bias: Any = None
    down_bias: Any = None
    shared_gate_up: Any = None
    shared_down: Any = None
    shared_gate: Any = None

    def validate(self, config: MoEConfig) -> MoEWeights:
        """Check every field against ``config``; error names the field and the expected shape."""
        for name, shape in expected_shapes(config).items():
            a = getattr(self, name)
            if shape is None:
                if a is not None:
                    raise InputError(f"MoEWeights.{name} is given but config {config.name!r} has no such tensor")
                continue
            if a is None:
                raise InputError(f"MoEWeights.{name} is missing; expected shape {list(shape)}")
            check_shape(f"MoEWeights.{name}", a, shape)
        return self

    def arrays(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in FIELDS if getattr(self, f) is not None}

    def map(self, fn) -> MoEWeights:
        """Apply ``fn`` to every present tensor."""
        return dataclasses.replace(self, **{k: fn(v) for k, v in self.arrays().items()})

    def to_numpy(self) -> MoEWeights:
        """float64 NumPy arrays (from torch tensors of any dtype, or arrays)."""
        def conv(a):
            if hasattr(a, "detach"):
                return a.detach().cpu().double().numpy()
            return np.asarray(a, dtype=np.float64)

        return self.map(conv)

    def to_torch(self, device=None, dtype=None) -> MoEWeights:
        """The same weights as torch tensors on ``device`` in ``dtype`` (default float32), contiguous."""
        import torch

        dtype = dtype or torch.float32

        def conv(a):
            t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
            return t.to(device=device, dtype=dtype).contiguous()

        return self.map(conv)

    def round_to(self, dtype: str) -> MoEWeights:
        """float64 weights holding values exactly representable in ``dtype`` (see tolerance.round_to_dtype)."""
        from .tolerance import round_to_dtype

        return self.map(lambda a: round_to_dtype(np.asarray(a, np.float64), dtype))

    @property
    def nbytes(self) -> int:
        return int(sum(np.asarray(a).nbytes if not hasattr(a, "element_size") else a.numel() * a.element_size()
                       for a in self.arrays().values()))

    @classmethod
    def from_hf(cls, state_dict, config: MoEConfig, prefix: str | None = None) -> MoEWeights:
        """From a HF checkpoint's state dict for one MoE layer (see ``hf.weights_from_hf``)."""
        from .hf import weights_from_hf

        return weights_from_hf(state_dict, config, prefix=prefix)


def random_weights(config: MoEConfig, seed: int = 0, *, max_bytes: int = 2 << 30) -> MoEWeights:
    """Random float64 weights scaled so that logits and outputs are O(1) for x ~ N(0, 1).

    Weights are N(0, 1/fan_in); biases N(0, 0.1^2); the DeepSeek score bias N(0, 0.05^2).
    Raises if the layer would need more than ``max_bytes`` of float64 (a full DeepSeek-V3 layer
    is ~90 GB): use a smaller config (``config.replace(num_experts=..., hidden_size=...)``).
    """
    shapes = {k: v for k, v in expected_shapes(config).items() if v is not None}
    need = 8 * sum(int(np.prod(s)) for s in shapes.values())
    if need > max_bytes:
        raise InputError(
            f"random_weights({config.name!r}) needs {need / 2**30:.1f} GiB of float64, over "
            f"max_bytes={max_bytes / 2**30:.1f} GiB; shrink the config or raise max_bytes"
        )
    rng = np.random.default_rng(seed)
    H, I = config.hidden_size, config.intermediate_size
    fan_in = {
        "router_weight": H, "gate_up": H, "down": I, "shared_gate_up": H,
        "shared_down": max(config.shared_intermediate_size, 1), "shared_gate": H,
    }
    out = {}
    for name, shape in shapes.items():
        if name in fan_in:
            out[name] = rng.standard_normal(shape) / np.sqrt(fan_in[name])
        elif name == "score_bias":
            out[name] = 0.05 * rng.standard_normal(shape)
        else:
            out[name] = 0.1 * rng.standard_normal(shape)
    return MoEWeights(**out)
