"""MoEConfig: what one MoE layer is, validated on construction.

Shape legend (used by every module in megamoe):
    T tokens, E routed experts, K top-k, H hidden size, I expert width (intermediate size),
    Is shared-expert width (all shared experts together), G GPUs (ranks), S SMs.

The config says *what* the layer computes; the weights (``weights.MoEWeights``) hold the numbers.
Every other part of megamoe (simulator, kernels, validation) reads this one class.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._checks import ConfigError
from .hf_config import hf_config_fields, read_json
from .presets import PRESETS, preset_fields
from .sizes import DTYPE_BYTES, WEIGHT_DTYPES, expert_params, layer_flops

#: Router families. Each is documented in ``routing.py``.
ROUTERS = (
    "softmax_topk",  # Mixtral, Qwen2/3-MoE: softmax over E, top-k, optional renormalization
    "topk_softmax",  # gpt-oss: top-k of the logits, then softmax over those k
    "sigmoid_grouped_topk",  # DeepSeek-V3/R1, Kimi K2: sigmoid, bias for selection, group top-k
    "sigmoid_top1_input",  # Llama 4: top-k of logits, sigmoid of the chosen logit scales the INPUT
)
#: Expert activations. Each is documented in ``forward.py``.
ACTIVATIONS = ("silu_gated", "clamped_swiglu")
#: Value that masked groups get in the grouped top-k (routing.py says who uses which).
GROUP_MASKS = ("zero", "neg_inf")
__all__ = ["ACTIVATIONS", "DTYPE_BYTES", "GROUP_MASKS", "ROUTERS", "WEIGHT_DTYPES", "ConfigError", "MoEConfig",
           "config_to_json"]


@dataclass(frozen=True)
class MoEConfig:
    """One MoE layer.

    Sizes: ``hidden_size`` H, ``intermediate_size`` I (one routed expert's width),
    ``num_experts`` E, ``top_k`` K.

    Router (``routing.py`` defines each field's effect): ``router`` (one of ``ROUTERS``),
    ``norm_topk_prob``, ``n_group`` / ``topk_group``, ``routed_scaling_factor``, ``score_bias``
    (e_score_correction_bias [E]), ``group_mask``, ``router_bias`` (a bias [E]).
    Experts: ``activation`` (one of ``ACTIVATIONS``, formulas in ``forward.py``), ``swiglu_alpha``,
    ``swiglu_limit``, ``expert_bias``. Shared experts (every token): ``num_shared_experts``,
    ``shared_intermediate_size`` (Is, all together), ``shared_expert_gate`` (Qwen2-MoE).
    ``weight_dtype``: how the weights are stored on the device (kernels, simulator bytes).
    """

    hidden_size: int
    intermediate_size: int
    num_experts: int
    top_k: int
    router: str = "softmax_topk"
    norm_topk_prob: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    score_bias: bool = False
    group_mask: str = "neg_inf"
    router_bias: bool = False
    activation: str = "silu_gated"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    expert_bias: bool = False
    num_shared_experts: int = 0
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False
    weight_dtype: str = "bfloat16"
    name: str = "custom"

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        for f in ("hidden_size", "intermediate_size", "num_experts", "top_k", "n_group", "topk_group"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"MoEConfig.{f} must be a positive integer, got {v!r}")
        for f in ("num_shared_experts", "shared_intermediate_size"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"MoEConfig.{f} must be a non-negative integer, got {v!r}")
        for f, allowed in (
            ("router", ROUTERS),
            ("activation", ACTIVATIONS),
            ("group_mask", GROUP_MASKS),
            ("weight_dtype", WEIGHT_DTYPES),
        ):
            v = getattr(self, f)
            if v not in allowed:
                raise ConfigError(f"MoEConfig.{f} must be one of {allowed}, got {v!r}")
        for f in ("norm_topk_prob", "score_bias", "router_bias", "expert_bias", "shared_expert_gate"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"MoEConfig.{f} must be a bool, got {getattr(self, f)!r}")
        for f in ("routed_scaling_factor", "swiglu_alpha", "swiglu_limit"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"MoEConfig.{f} must be a positive finite number, got {v!r}")
        if self.top_k > self.num_experts:
            raise ConfigError(
                f"MoEConfig.top_k={self.top_k} must be <= num_experts={self.num_experts}"
            )
        if self.num_experts % self.n_group:
            raise ConfigError(
                f"MoEConfig.n_group={self.n_group} must divide num_experts={self.num_experts}"
            )
        if self.topk_group > self.n_group:
            raise ConfigError(
                f"MoEConfig.topk_group={self.topk_group} must be <= n_group={self.n_group}"
            )
        if self.router == "sigmoid_grouped_topk":
            per_group = self.num_experts // self.n_group
            if self.n_group > 1 and per_group < 2:
                raise ConfigError(
                    f"MoEConfig.n_group={self.n_group}: grouped top-k scores a group by its top-2 "
                    f"experts, so each group needs >= 2 experts (num_experts={self.num_experts})"
                )
            if self.top_k > self.topk_group * per_group:
                raise ConfigError(
                    f"MoEConfig.top_k={self.top_k} must be <= topk_group * experts per group "
                    f"= {self.topk_group} * {per_group}"
                )
        elif self.n_group != 1 or self.topk_group != 1:
            raise ConfigError(
                f"MoEConfig.n_group/topk_group apply only to router='sigmoid_grouped_topk', "
                f"got n_group={self.n_group}, topk_group={self.topk_group} with router={self.router!r}"
            )
        if self.score_bias and self.router != "sigmoid_grouped_topk":
            raise ConfigError(
                f"MoEConfig.score_bias applies only to router='sigmoid_grouped_topk', got router={self.router!r}"
            )
        if (self.num_shared_experts == 0) != (self.shared_intermediate_size == 0):
            raise ConfigError(
                "MoEConfig.num_shared_experts and shared_intermediate_size must both be 0 or both "
                f"positive, got {self.num_shared_experts} and {self.shared_intermediate_size}"
            )
        if self.shared_expert_gate and self.num_shared_experts == 0:
            raise ConfigError("MoEConfig.shared_expert_gate=True needs num_shared_experts > 0")

    # ------------------------------------------------------------------ derived
    @property
    def weight_on_input(self) -> bool:
        """True where the routing weight scales the expert's input (Llama 4), not its output."""
        return self.router == "sigmoid_top1_input"

    @property
    def weight_bytes_per_element(self) -> int:
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert: gate+up [2I, H] and down [H, I] (+ biases)."""
        return expert_params(self)

    def flops_per_token(self) -> int:
        """Multiply-add FLOPs (2 per MAC) of one token through its K experts and the shared MLP."""
        return int(layer_flops(self, 1, router=False))

    def replace(self, **changes: Any) -> MoEConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MoEConfig:
        """Inverse of ``to_dict``; unknown keys are an error naming them."""
        if not isinstance(d, dict):
            raise ConfigError(f"MoEConfig.from_dict expects a dict, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown MoEConfig field(s) {unknown}; known fields: {sorted(known)}")
        try:
            return cls(**d)
        except TypeError as exc:  # missing required fields
            raise ConfigError(f"MoEConfig.from_dict: {exc}") from None

    # ------------------------------------------------------------------ constructors
    @classmethod
    def preset(cls, name: str) -> MoEConfig:
        """A public model's MoE layer by name; ``presets.PRESETS`` lists them."""
        return cls(name=name, **preset_fields(name))

    @classmethod
    def from_hf(cls, config: dict[str, Any] | str | Path) -> MoEConfig:
        """From a transformers-style config dict or a path to a config.json (``hf.config_from_hf``)."""
        fields, where = hf_config_fields(config)
        try:
            return cls(**fields)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    @classmethod
    def load(cls, spec: str | Path) -> MoEConfig:
        """A preset name, a megamoe config JSON (``to_dict`` output) or a HF config.json path."""
        if isinstance(spec, str) and spec in PRESETS:
            return cls.preset(spec)
        path = Path(spec)
        if not path.exists():
            raise ConfigError(
                f"{str(spec)!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor an existing file"
            )
        d = read_json(path)
        try:
            if "hidden_size" in d and "intermediate_size" in d and "model_type" not in d and "top_k" in d:
                return cls.from_dict(d)
            return cls.from_hf(d)
        except ValueError as exc:  # ConfigError, InputError: say which file
            raise ConfigError(f"{path}: {exc}") from None

    def describe(self) -> str:
        s = (
            f"{self.name}: E={self.num_experts} K={self.top_k} H={self.hidden_size} "
            f"I={self.intermediate_size} router={self.router}"
        )
        if self.num_shared_experts:
            s += f" shared={self.num_shared_experts}x{self.shared_intermediate_size // self.num_shared_experts}"
        return s

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.describe()


def config_to_json(config: MoEConfig) -> str:
    return json.dumps(config.to_dict(), indent=2, sort_keys=True)
