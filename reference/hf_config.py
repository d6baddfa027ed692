"""Hugging Face config.json -> the fields of ``MoEConfig`` (``MoEConfig.from_hf``; the families
are tabled in docs/design.md).

Shape legend: E routed experts, K top-k, H hidden size, I expert width, Is shared width.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ._checks import ConfigError
from .sizes import WEIGHT_DTYPES


def read_json(path: str | Path) -> dict[str, Any]:
    """The JSON object in ``path``; ``ConfigError`` naming the file if missing, unreadable or not an object."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"config file {str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(d, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a JSON object, got {type(d).__name__}")
    return d


class _Fields:
    """Typed, erroring access to one HF config dict; every error names the field and the source."""

    def __init__(self, d: Mapping[str, Any], where: str):
        self.d, self.where = d, where

    def _error(self, msg: str) -> ConfigError:
        return ConfigError(f"{self.where}: {msg}")

    def has(self, name: str) -> bool:
        return self.d.get(name) is not None

    def _get(self, name: str | tuple[str, ...], default: Any, required: bool) -> Any:
        """The value of ``name``, or of the first present of several names (aliases across releases)."""
        names = (name,) if isinstance(name, str) else name
        present = [(n, self.d[n]) for n in names if self.d.get(n) is not None]
        if len({repr(v) for _, v in present}) > 1:
            raise self._error(f"fields {[n for n, _ in present]} name the same thing but differ: {present}")
        if not present:
            if required:
                raise self._error(f"missing required field {' or '.join(map(repr, names))}")
            return default
        return present[0][1]

    def int(self, name: str | tuple[str, ...], default: int | None = None, *, required: bool = True) -> int:
        v = self._get(name, default, required)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._error(f"field {name!r} must be an integer, got {v!r}")
        return v

    def float(self, name: str, default: float | None = None, *, required: bool = True) -> float:
        v = self._get(name, default, required)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self._error(f"field {name!r} must be a number, got {v!r}")
        return float(v)

    def bool(self, name: str, default: bool | None = None, *, required: bool = True) -> bool:
        v = self._get(name, default, required)
        if not isinstance(v, bool):
            raise self._error(f"field {name!r} must be true or false, got {v!r}")
        return v

    def choice(self, name: str, allowed: tuple[str, ...], default: str, what: str) -> str:
        """A string field that megamoe supports only in the values ``allowed`` (default if absent)."""
        v = self._get(name, default, False)
        if v not in allowed:
            raise self._error(
                f"{name}={v!r} is not supported (megamoe models {what} only with {name} in {list(allowed)})"
            )
        return v


#: The routed-expert count's names in config.json files.
_NUM_EXPERTS = ("num_local_experts", "num_experts")


def _silu(f: _Fields) -> dict[str, Any]:
    f.choice("hidden_act", ("silu",), "silu", "gated-SiLU experts")
    return {}


def _sizes(f: _Fields, width: str = "intermediate_size", experts: str | tuple[str, ...] = _NUM_EXPERTS) -> dict:
    """hidden_size, intermediate_size (from ``width``), num_experts and top_k, read in that order."""
    return dict(hidden_size=f.int("hidden_size"), intermediate_size=f.int(width), num_experts=f.int(experts),
                top_k=f.int("num_experts_per_tok"))


def _mixtral(f: _Fields) -> dict[str, Any]:
    """Mixtral: softmax over E, top-k, always renormalized; no shared expert."""
    return dict(_silu(f), **_sizes(f), router="softmax_topk", norm_topk_prob=True)


def _qwen_moe(f: _Fields, *, shared: bool) -> dict[str, Any]:
    """Qwen2/3-MoE: softmax top-k, renormalized if norm_topk_prob (transformers' default: false)."""
    out = dict(_silu(f), **_sizes(f, "moe_intermediate_size"), router="softmax_topk",
               norm_topk_prob=f.bool("norm_topk_prob", False, required=False))
    if shared:
        Is = f.int("shared_expert_intermediate_size")
        if Is > 0:  # one shared MLP scaled by sigmoid(x . w_sg)
            out.update(num_shared_experts=1, shared_intermediate_size=Is, shared_expert_gate=True)
    return out


def _deepseek_sizes(f: _Fields) -> dict[str, Any]:
    """The sizes and shared experts that DeepSeek-V2 and -V3 configs spell the same way."""
    I = f.int("moe_intermediate_size")
    n_shared = f.int("n_shared_experts", 0, required=False)
    return dict(_silu(f), **_sizes(f, "moe_intermediate_size", ("n_routed_experts", "num_local_experts")),
                num_shared_experts=n_shared, shared_intermediate_size=n_shared * I)


def _deepseek_v3(f: _Fields) -> dict[str, Any]:
    """DeepSeek-V3/R1 and Kimi K2: sigmoid scores, e_score_correction_bias, grouped top-k (noaux_tc)."""
    f.choice("scoring_func", ("sigmoid",), "sigmoid", "DeepSeek-V3-style routing")
    f.choice("topk_method", ("noaux_tc",), "noaux_tc", "DeepSeek-V3-style routing")
    return dict(
        _deepseek_sizes(f),
        router="sigmoid_grouped_topk",
        norm_topk_prob=f.bool("norm_topk_prob"),
        n_group=f.int("n_group", 1, required=False),
        topk_group=f.int("topk_group", 1, required=False),
        routed_scaling_factor=f.float("routed_scaling_factor"),
        score_bias=True,
        group_mask="neg_inf",
    )


def _deepseek_v2(f: _Fields) -> dict[str, Any]:
    """DeepSeek-V2(-Lite) with greedy softmax top-k; the group-limited and scaled variants are refused."""
    f.choice("scoring_func", ("softmax",), "softmax", "DeepSeek-V2-style routing")
    f.choice("topk_method", ("greedy",), "greedy", "DeepSeek-V2-style routing")
    scale = f.float("routed_scaling_factor", 1.0, required=False)
    if scale != 1.0:
        raise f._error(
            f"routed_scaling_factor={scale} with softmax routing is not supported (megamoe's softmax_topk "
            "router has no scaling; DeepSeek-V2-Lite has 1.0)"
        )
    if f.bool("norm_topk_prob", False, required=False):
        raise f._error(
            "norm_topk_prob=true with topk_method 'greedy' is not supported: DeepSeek's own code "
            "renormalizes, transformers 5 does not, so the model is ambiguous"
        )
    return dict(_deepseek_sizes(f), router="softmax_topk", norm_topk_prob=False)


def _gpt_oss(f: _Fields) -> dict[str, Any]:
    """gpt-oss: biased router, top-k of logits then softmax; clamped swiglu experts with biases."""
    return dict(
        **_sizes(f),
        router="topk_softmax",
        router_bias=True,
        activation="clamped_swiglu",
        swiglu_alpha=f.float("swiglu_alpha", 1.702, required=False),
        swiglu_limit=f.float("swiglu_limit", 7.0, required=False),
        expert_bias=True,
    )


def _llama4(f: _Fields) -> dict[str, Any]:
    """Llama 4 text: top-k of logits, sigmoid weight on the expert input; shared MLP as wide as an expert."""
    out = dict(_silu(f), **_sizes(f), router="sigmoid_top1_input", num_shared_experts=1)
    return {**out, "shared_intermediate_size": out["intermediate_size"]}  # as wide as a routed expert


_FAMILIES: dict[str, Callable[[_Fields], dict[str, Any]]] = {
    "mixtral": _mixtral,
    "qwen2_moe": lambda f: _qwen_moe(f, shared=True),
    "qwen3_moe": lambda f: _qwen_moe(f, shared=False),
    "deepseek_v3": _deepseek_v3,
    "kimi_k2": _deepseek_v3,
    "deepseek_v2": _deepseek_v2,
    "gpt_oss": _gpt_oss,
    "llama4_text": _llama4,
}
#: Multimodal wrappers whose MoE fields live in ``text_config`` (top-level fields are accepted too).
_WRAPPERS = {"llama4": "llama4_text", "kimi_k25": "deepseek_v3"}
#: Every model_type ``config_from_hf`` reads.
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted({*_FAMILIES, *_WRAPPERS}))


def _weight_dtype(*dicts: Mapping[str, Any]) -> str:
    """The checkpoint's dtype (``dtype``, or ``torch_dtype`` before transformers 5) if megamoe knows it."""
    for d in dicts:
        for key in ("dtype", "torch_dtype"):
            v = str(d.get(key)).replace("torch.", "")  # a string in JSON, a torch.dtype in a live config
            if v in WEIGHT_DTYPES:
                return v
    return "bfloat16"


def hf_config_fields(config: Mapping[str, Any] | str | Path) -> tuple[dict[str, Any], str]:
    """(MoEConfig fields, where) of one MoE layer of a transformers config; ``where`` names the source."""
    source = "config"
    if isinstance(config, (str, Path)):
        source = f"config file {str(config)!r}"
        config = read_json(config)
    if not isinstance(config, Mapping):
        raise ConfigError(f"MoEConfig.from_hf expects a dict or a path to a config.json, got {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type is None:
        raise ConfigError(
            f"{source}: missing required field 'model_type'; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    outer, inner, family = config, config, model_type
    if model_type in _WRAPPERS:  # MoE fields in text_config, or (flattened) at the top level
        text = config.get("text_config")
        if text is not None:
            if not isinstance(text, Mapping):
                raise ConfigError(f"{source} ({model_type}): field 'text_config' must be an object, got {text!r}")
            inner = text
        family = (inner is not outer and inner.get("model_type")) or _WRAPPERS[model_type]
    if family not in _FAMILIES:
        raise ConfigError(
            f"{source}: model_type {family!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    where = f"{source} (model_type {model_type!r}" + (", text_config)" if inner is not outer else ")")
    fields = _FAMILIES[family](_Fields(inner, where))
    name = outer.get("_name_or_path") or model_type
    return {**fields, "weight_dtype": _weight_dtype(inner, outer), "name": str(name)}, where
