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

FP8 weights (``fp8.py``): gate_up, down, shared_gate_up and shared_down hold e4m3 values, each
with ``<name>_scale_inv`` float32 (..., ceil(R/128), ceil(C/128)) per 128 x 128 block of its last
two dimensions (R, C), or None.

All of them or none (``is_fp8``); the router, biases and shared gate are never quantized.
``to_fp8()`` quantizes, ``dequantize()`` gives plain float64 back; ``to_torch`` the same class
holding torch tensors (what ``megamoe.kernels.moe_forward`` takes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._checks import InputError, check_shape
from .config import MoEConfig
from .fp8 import WEIGHT_BLOCK, check_scales, dequantize_weight_blocks, e4m3_decode, quantize_weight_blocks, scale_shape
from .hf_checkpoint import hf_weight_fields
from .tolerance import round_to_dtype

#: Field names in canonical order (the tensors of the float layer; the torch op takes them in this order).
FIELDS = (
    "router_weight", "router_bias", "score_bias", "gate_up", "gate_up_bias", "down", "down_bias",
    "shared_gate_up", "shared_down", "shared_gate",
)
#: FP8 block scales: scale field -> the weight field it scales.
SCALE_FIELDS = {
    "gate_up_scale_inv": "gate_up", "down_scale_inv": "down",
    "shared_gate_up_scale_inv": "shared_gate_up", "shared_down_scale_inv": "shared_down",
}


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


def expected_scale_shapes(config: MoEConfig) -> dict[str, tuple[int, ...] | None]:
    """Shape of every FP8 scale field for ``config`` (128 x 128 blocks); None where it must be absent."""
    shapes = expected_shapes(config)
    return {k: None if shapes[w] is None else scale_shape(shapes[w], WEIGHT_BLOCK) for k, w in SCALE_FIELDS.items()}


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
    gate_up_scale_inv: Any = None
    down_scale_inv: Any = None
    shared_gate_up_scale_inv: Any = None
    shared_down_scale_inv: Any = None

    @property
    def is_fp8(self) -> bool:
        """True when the expert weights are float8 e4m3 values with block scales."""
        return any(getattr(self, k) is not None for k in SCALE_FIELDS)

    def validate(self, config: MoEConfig) -> MoEWeights:
        """Check every field against ``config``; error names the field and the expected shape."""
        shapes = expected_shapes(config)
        if self.is_fp8:
            for name, shape in expected_scale_shapes(config).items():
                if shape is not None and getattr(self, name) is None:
                    given = next(k for k in SCALE_FIELDS if getattr(self, k) is not None)
                    raise InputError(f"MoEWeights.{name} is missing (expected shape {list(shape)}): FP8 weights "
                                     f"({given} is given) need the scales of every expert weight")
            shapes = {**shapes, **expected_scale_shapes(config)}
        for name, shape in shapes.items():
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
        """Every present tensor, FP8 scales last."""
        return {f: getattr(self, f) for f in (*FIELDS, *SCALE_FIELDS) if getattr(self, f) is not None}

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
        """The same weights as torch tensors on ``device`` in ``dtype`` (default float32), contiguous.

        Host FP8 scales are checked here (``fp8.check_scales``). FP8 weights stay
        ``torch.float8_e4m3fn`` and their scales float32, whatever ``dtype`` says.
        """
        import torch

        dtype = dtype or torch.float32
        quantized = {SCALE_FIELDS[k] for k in SCALE_FIELDS if getattr(self, k) is not None}

        def tensor(a):
            return a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))

        out = {}
        for k, a in self.arrays().items():
            if k in SCALE_FIELDS and not (isinstance(a, torch.Tensor) and a.device.type != "cpu"):
                check_scales(f"MoEWeights.{k}", a.numpy() if isinstance(a, torch.Tensor) else a)
            to = torch.float32 if k in SCALE_FIELDS else torch.float8_e4m3fn if k in quantized else dtype
            out[k] = tensor(a).to(device=device, dtype=to).contiguous()
        return dataclasses.replace(self, **out)

    def round_to(self, dtype: str) -> MoEWeights:
        """float64 weights exactly representable in ``dtype`` (tolerance.round_to_dtype); FP8 scales kept."""
        return dataclasses.replace(self, **{k: round_to_dtype(np.asarray(a, np.float64), dtype)
                                            for k, a in self.arrays().items() if k not in SCALE_FIELDS})

    def to_fp8(self) -> MoEWeights:
        """The expert weights quantized to e4m3 in 128 x 128 blocks (``fp8.py``) with float32 ``*_scale_inv``."""
        if self.is_fp8:
            raise InputError("MoEWeights.to_fp8: the weights are FP8 already")
        out = {}
        for k, w in SCALE_FIELDS.items():
            a = getattr(self, w)
            if a is not None:
                q, out[k] = quantize_weight_blocks(np.asarray(a, np.float64))
                out[w] = e4m3_decode(q)
        return dataclasses.replace(self, **out)

    def dequantize(self) -> MoEWeights:
        """FP8 weights as plain float64 weights (value * scale_inv per block), scales dropped;
        float weights unchanged."""
        if not self.is_fp8:
            return self
        out = {}
        for k, w in SCALE_FIELDS.items():
            if getattr(self, k) is not None:
                out[w] = dequantize_weight_blocks(getattr(self, w), check_scales(f"MoEWeights.{k}", getattr(self, k)))
                out[k] = None
        return dataclasses.replace(self, **out)

    @property
    def nbytes(self) -> int:
        return int(sum(np.asarray(a).nbytes if not hasattr(a, "element_size") else a.numel() * a.element_size()
                       for a in self.arrays().values()))

    @classmethod
    def from_hf(cls, state_dict, config: MoEConfig, prefix: str | None = None) -> MoEWeights:
        """From a HF checkpoint's state dict for one MoE layer (``hf.weights_from_hf`` documents it)."""
        if not isinstance(config, MoEConfig):
            raise InputError(f"config must be a MoEConfig, got {type(config).__name__}")
        return cls(**hf_weight_fields(state_dict, config, prefix)).validate(config)


def random_weights(config: MoEConfig, seed: int = 0, *, fp8: bool = False, max_bytes: int = 2 << 30) -> MoEWeights:
    """Random float64 weights, N(0, 1/fan_in), biases N(0, 0.1^2), score bias N(0, 0.05^2).
    ``fp8=True``: the same draw quantized (``MoEWeights.to_fp8``). Raises past ``max_bytes`` of float64.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
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
    w = MoEWeights(**out)
    return w.to_fp8() if fp8 else w
