"""Hugging Face configs and checkpoints into megamoe's reference: ``MoEConfig`` and ``MoEWeights``.

Shape legend: E routed experts, K top-k, H hidden size, I expert width, Is shared width (all shared
experts together).

Public names:
    ``read_json(path)``                            a config.json as a dict, with errors naming the file
    ``config_from_hf(config)``                     a transformers config (dict or path) -> ``MoEConfig``
    ``weights_from_hf(state_dict, config, prefix)``  one MoE layer's tensors -> ``MoEWeights`` (float64)

Families, by the config's ``model_type`` (semantics in shared/facts/moe-models.md):

    model_type              router                 experts          shared experts
    mixtral                 softmax_topk, renorm   silu_gated       none
    qwen2_moe               softmax_topk           silu_gated       1 x shared_expert_intermediate_size, sigmoid gate
    qwen3_moe               softmax_topk           silu_gated       none
    deepseek_v3, kimi_k2    sigmoid_grouped_topk   silu_gated       n_shared_experts x moe_intermediate_size
    deepseek_v2             softmax_topk (only topk_method greedy, softmax, no scaling: DeepSeek-V2-Lite)
    gpt_oss                 topk_softmax + bias    clamped_swiglu   none
    llama4, llama4_text     sigmoid_top1_input     silu_gated       1 x intermediate_size
    kimi_k25                its ``text_config`` (a deepseek_v3 / kimi_k2 config)

DeepSeek's grouped top-k masks the dropped groups with -inf (``group_mask="neg_inf"``): DeepSeek's
own inference code, vLLM, SGLang and transformers 5 do so; transformers 4.x and DeepSeek's first
remote code used 0.0. The two differ only when kept biased scores are negative.

Checkpoint tensors accepted by ``weights_from_hf`` (keys relative to the MoE module, e.g. after
``model.layers.3.mlp.``; torch ``nn.Linear`` weights are [out, in]):

    router          gate.weight | router.weight [E, H]; gate.bias | router.bias [E] (gpt-oss);
                    gate.e_score_correction_bias [E] (DeepSeek)
    per expert      experts.{e}.gate_proj / up_proj .weight [I, H], experts.{e}.down_proj.weight [H, I]
                    (Mixtral: experts.{e}.w1 (gate) / w3 (up) [I, H], w2 (down) [H, I])
    fused (3-D)     transformers >= 5 for Mixtral, Qwen, DeepSeek:
                        experts.gate_up_proj [E, 2I, H] (gate rows first), experts.down_proj [E, H, I]
                    gpt-oss: experts.gate_up_proj [E, H, 2I] with gate and up INTERLEAVED (gate columns
                        0, 2, 4, ..., up 1, 3, 5, ...), gate_up_proj_bias [E, 2I] interleaved,
                        down_proj [E, I, H], down_proj_bias [E, H]
                    Llama 4: experts.gate_up_proj [E, H, 2I] (gate columns first), down_proj [E, I, H]
    shared          shared_expert.* | shared_experts.* gate_proj / up_proj [Is, H], down_proj [H, Is];
                    shared_expert_gate.weight [1, H] (Qwen2-MoE)

Which fused layout applies follows from the config, never from shapes (they are ambiguous when
H = 2I): ``activation="clamped_swiglu"`` means gpt-oss's, ``router="sigmoid_top1_input"`` Llama 4's,
anything else the standard one.

FP8 checkpoints (DeepSeek-V3/R1, Kimi K2: ``quantization_config`` fp8, e4m3, weight_block_size
[128, 128]) store each expert and shared-expert weight as float8_e4m3fn with a float32
``weight_scale_inv`` per 128 x 128 block (weight ~= value * scale_inv, see ``fp8.py``):

    per expert      experts.{e}.gate_proj / up_proj / down_proj .weight_scale_inv [ceil(I/128), ceil(H/128)] /
                    [ceil(H/128), ceil(I/128)]; the shared experts' the same under shared_experts.*
    fused (3-D)     transformers 5: experts.gate_up_proj_scale_inv [E, ceil(2I/128), ceil(H/128)],
                    experts.down_proj_scale_inv [E, ceil(H/128), ceil(I/128)] (standard layout only)

They load as FP8 ``MoEWeights`` (``is_fp8``: e4m3 values and ``*_scale_inv``; ``moe_forward`` then
computes the FP8 layer; ``.dequantize()`` gives plain weights). A checkpoint is FP8 when any expert
weight is float8 or has a scale; then every expert and shared weight needs its scale. Per-expert
gate and up scales are stacked into the fused gate_up's, which needs I (and Is) to be a multiple of
128 (it is in every FP8 model shipped). The router stays unquantized (DeepSeek ships it in bf16).
Other quantized tensors (gpt-oss MXFP4 ``*_blocks``/``*_scales``, per-tensor ``weight_scale`` /
``input_scale``, a scaled router) are refused: dequantize first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ._checks import InputError
from .config import WEIGHT_DTYPES, ConfigError, MoEConfig
from .fp8 import WEIGHT_BLOCK, check_e4m3_values, scale_shape
from .weights import MoEWeights

__all__ = ["SUPPORTED_MODEL_TYPES", "config_from_hf", "read_json", "weights_from_hf"]


# ====================================================================== config.json


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


#: The routed-expert count's names: real config.json files say ``num_experts`` (Qwen) or
#: ``num_local_experts`` (Mixtral, gpt-oss, Llama 4); transformers 5 writes ``num_local_experts`` for Qwen3.
_NUM_EXPERTS = ("num_local_experts", "num_experts")


def _silu(f: _Fields) -> dict[str, Any]:
    f.choice("hidden_act", ("silu",), "silu", "gated-SiLU experts")
    return {}


def _mixtral(f: _Fields) -> dict[str, Any]:
    """Mixtral: softmax over E, top-k, always renormalized; no shared expert."""
    return dict(
        _silu(f),
        hidden_size=f.int("hidden_size"),
        intermediate_size=f.int("intermediate_size"),
        num_experts=f.int(_NUM_EXPERTS),
        top_k=f.int("num_experts_per_tok"),
        router="softmax_topk",
        norm_topk_prob=True,
    )


def _qwen_moe(f: _Fields, *, shared: bool) -> dict[str, Any]:
    """Qwen2/3-MoE: softmax top-k, renormalized if norm_topk_prob (transformers' default: false)."""
    out = dict(
        _silu(f),
        hidden_size=f.int("hidden_size"),
        intermediate_size=f.int("moe_intermediate_size"),
        num_experts=f.int(_NUM_EXPERTS),
        top_k=f.int("num_experts_per_tok"),
        router="softmax_topk",
        norm_topk_prob=f.bool("norm_topk_prob", False, required=False),
    )
    if shared:
        Is = f.int("shared_expert_intermediate_size")
        if Is > 0:  # one shared MLP scaled by sigmoid(x . w_sg)
            out.update(num_shared_experts=1, shared_intermediate_size=Is, shared_expert_gate=True)
    return out


def _deepseek_sizes(f: _Fields) -> dict[str, Any]:
    """The sizes and shared experts that DeepSeek-V2 and -V3 configs spell the same way."""
    I = f.int("moe_intermediate_size")
    n_shared = f.int("n_shared_experts", 0, required=False)
    return dict(
        _silu(f),
        hidden_size=f.int("hidden_size"),
        intermediate_size=I,
        num_experts=f.int(("n_routed_experts", "num_local_experts")),
        top_k=f.int("num_experts_per_tok"),
        num_shared_experts=n_shared,
        shared_intermediate_size=n_shared * I,
    )


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
    return dict(
        _deepseek_sizes(f),
        router="softmax_topk",
        norm_topk_prob=False,
    )


def _gpt_oss(f: _Fields) -> dict[str, Any]:
    """gpt-oss: biased router, top-k of logits then softmax; clamped swiglu experts with biases."""
    return dict(
        hidden_size=f.int("hidden_size"),
        intermediate_size=f.int("intermediate_size"),
        num_experts=f.int(_NUM_EXPERTS),
        top_k=f.int("num_experts_per_tok"),
        router="topk_softmax",
        router_bias=True,
        activation="clamped_swiglu",
        swiglu_alpha=f.float("swiglu_alpha", 1.702, required=False),
        swiglu_limit=f.float("swiglu_limit", 7.0, required=False),
        expert_bias=True,
    )


def _llama4(f: _Fields) -> dict[str, Any]:
    """Llama 4 text: top-k of logits, sigmoid weight on the expert input; shared MLP as wide as an expert."""
    I = f.int("intermediate_size")  # the routed experts' and the shared expert's width
    return dict(
        _silu(f),
        hidden_size=f.int("hidden_size"),
        intermediate_size=I,
        num_experts=f.int(_NUM_EXPERTS),
        top_k=f.int("num_experts_per_tok"),
        router="sigmoid_top1_input",
        num_shared_experts=1,
        shared_intermediate_size=I,
    )


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


def config_from_hf(config: Mapping[str, Any] | str | Path) -> MoEConfig:
    """One MoE layer of a transformers model, from its config dict (``PretrainedConfig.to_dict()``
    or a parsed config.json) or the path of a config.json.

    The ``model_type`` picks the semantics (see the module docstring); fields that only describe
    other layers (attention, dense layers, which layers are MoE) are ignored. ``name`` is the
    config's ``_name_or_path``, else its model_type. ``weight_dtype`` is the config's ``dtype`` /
    ``torch_dtype`` when megamoe knows it, else bfloat16 (quantization configs are not read).

    Raises ``ConfigError`` naming the field for a missing or mistyped field, an unknown model_type
    (listing the supported ones) and a variant megamoe does not model (e.g. DeepSeek with
    scoring_func softmax or topk_method greedy).
    """
    source = "config"
    if isinstance(config, (str, Path)):
        source = f"config file {str(config)!r}"
        config = read_json(config)
    if not isinstance(config, Mapping):
        raise ConfigError(f"config_from_hf expects a dict or a path to a config.json, got {type(config).__name__}")
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
    try:
        return MoEConfig(**fields, weight_dtype=_weight_dtype(inner, outer), name=str(name))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


# ====================================================================== state dicts

# Keys relative to the MoE module. Every key of a checkpoint that belongs to an MoE layer matches one.
_KEY_RE = re.compile(
    r"(?P<router>gate|router)\.(?P<rparam>weight|bias|e_score_correction_bias)"
    r"|experts\.(?P<e>\d+)\.(?P<proj>w1|w2|w3|gate_proj|up_proj|down_proj)\.(?P<eparam>weight|bias|weight_scale_inv)"
    r"|experts\.(?P<fused>gate_up_proj|down_proj)(?P<fsuffix>_bias|_scale_inv)?"
    r"|(?P<shared>shared_experts?)\.(?P<sproj>gate_proj|up_proj|down_proj)\.(?P<sparam>weight|weight_scale_inv)"
    r"|(?P<sgate>shared_expert_gate)\.weight"
    r"|(?P<quant>experts\.(?:\d+\.)?\w+?(?:_blocks|_scales|_scale|\.weight_scale|\.input_scale)"
    r"|(?:shared_experts?\.\w+)\.(?:weight_scale|input_scale)|(?:gate|router|shared_expert_gate)\.weight_scale_inv)"
)


def _module_prefix(key: str) -> str | None:
    """The part of ``key`` before an MoE-module-relative key, or None if ``key`` is no MoE tensor."""
    start = 0
    while True:
        if _KEY_RE.fullmatch(key, start):
            return key[:start]
        dot = key.find(".", start)
        if dot < 0:
            return None
        start = dot + 1


def _select_module(state_dict: Mapping[str, Any], prefix: str | None) -> tuple[str, dict[str, Any]]:
    """(module prefix P, {key relative to P: tensor}) for the one MoE module in ``state_dict``."""
    if prefix is not None:
        if not isinstance(prefix, str):
            raise InputError(f"prefix must be a string or None, got {type(prefix).__name__}")
        if prefix and not prefix.endswith("."):
            prefix += "."
        keys = [k for k in state_dict if k.startswith(prefix)]
        if not keys:
            some = ", ".join(repr(k) for k in list(state_dict)[:4])
            raise InputError(f"no key of the state dict starts with prefix {prefix!r}; keys look like {some}")
    else:
        keys = list(state_dict)
    found: dict[str, None] = {}  # module prefixes, in order of appearance
    for k in keys:
        p = _module_prefix(k)
        if p is not None:
            found.setdefault(p, None)
    if not found:
        some = ", ".join(repr(k) for k in keys[:4])
        raise InputError(
            f"no MoE tensors found{f' under prefix {prefix!r}' if prefix else ''}: expected keys like "
            f"'gate.weight', 'experts.gate_up_proj' or 'experts.0.gate_proj.weight' (after a prefix such as "
            f"'model.layers.3.mlp.'); got {some}"
        )
    if len(found) > 1:
        listed = ", ".join(repr(p) for p in list(found)[:4]) + (", ..." if len(found) > 4 else "")
        raise InputError(
            f"the state dict holds {len(found)} MoE modules ({listed}); pass prefix= to pick one layer"
        )
    (P,) = found
    return P, {k[len(P):]: state_dict[k] for k in keys if k.startswith(P)}


def _to_float64(key: str, a: Any) -> np.ndarray:
    """A torch tensor (any float dtype, incl. bf16 / fp8) or array-like as a float64 NumPy array."""
    if hasattr(a, "detach"):  # torch
        import torch

        if not (a.is_floating_point()):
            raise InputError(f"state_dict[{key!r}] has dtype {a.dtype}; expected a floating-point tensor")
        return a.detach().to(device="cpu", dtype=torch.float64).numpy()
    arr = np.asarray(a)
    if arr.dtype.kind in "biuOSU":
        raise InputError(f"state_dict[{key!r}] has dtype {arr.dtype}; expected a floating-point array")
    try:
        return arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"state_dict[{key!r}] (dtype {arr.dtype}) cannot be read as float64: {exc}") from None


def _is_float8(a: Any) -> bool:
    return "float8" in str(getattr(a, "dtype", ""))


class _Reader:
    """Takes tensors out of one MoE module's keys, checking shapes; remembers which were used.

    ``fp8``: the checkpoint stores expert weights as float8 with block scales (``weight``).
    """

    def __init__(self, P: str, local: dict[str, Any], config: MoEConfig):
        self.P, self.local, self.config, self.used = P, local, config, set()
        expert_w = [k for k in local if (m := _KEY_RE.fullmatch(k)) and (m["e"] or m["fused"] or m["shared"])]
        scaled = [k for k in expert_w if k.endswith("scale_inv")]
        float8 = [k for k in expert_w if _is_float8(local[k])]
        self.fp8_evidence = (scaled or float8 or [None])[0]
        self.fp8 = self.fp8_evidence is not None

    def weight(self, k: str, shape: tuple[int, ...], scale_key: str) -> tuple[np.ndarray, np.ndarray | None]:
        """(values, scale_inv or None): a weight, and in an FP8 checkpoint its block scales."""
        w = self.take(k, shape)
        if not self.fp8:
            return w, None
        want = scale_shape(shape, WEIGHT_BLOCK)
        if scale_key not in self.local:
            raise InputError(f"missing key {self.full(scale_key)!r} (expected shape {list(want)}): the checkpoint "
                             f"is FP8 ({self.full(self.fp8_evidence)!r}), so every expert weight needs its "
                             "128 x 128 block scales")
        s = self.take(scale_key, want)
        bad = ~np.isfinite(s) | (s < 0)
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            raise InputError(f"state_dict[{self.full(scale_key)!r}] must be finite and >= 0, got {s[i]} at index {i}")
        return check_e4m3_values(f"state_dict[{self.full(k)!r}] (it has {scale_key.rsplit('.', 1)[-1]})", w), s

    def full(self, k: str) -> str:
        return self.P + k

    def take(self, k: str, shape: tuple[int, ...]) -> np.ndarray:
        if k not in self.local:
            raise InputError(f"missing key {self.full(k)!r} (expected shape {list(shape)}) for config {self.config.name!r}")
        self.used.add(k)
        a = self.local[k]
        got = tuple(a.shape) if hasattr(a, "shape") else np.shape(a)
        if got != shape:
            raise InputError(f"state_dict[{self.full(k)!r}] must have shape {list(shape)}, got {list(got)}")
        return _to_float64(self.full(k), a)

    def one_of(self, names: tuple[str, ...], what: str) -> str:
        """The single module name of ``names`` some key starts with (e.g. 'gate' or 'router')."""
        present = [n for n in names if any(k.startswith(n + ".") for k in self.local)]
        if len(present) > 1:
            raise InputError(f"both {self.full(present[0])!r}* and {self.full(present[1])!r}* keys given for the {what}")
        return present[0] if present else names[0]


def _fused_layout(config: MoEConfig) -> str:
    if config.activation == "clamped_swiglu":
        return "gpt_oss"
    if config.router == "sigmoid_top1_input":
        return "llama4"
    return "standard"


def _experts(r: _Reader, config: MoEConfig) -> dict[str, np.ndarray]:
    """gate_up (E, 2I, H), down (E, H, I) and biases from per-expert or fused keys."""
    E, H, I = config.num_experts, config.hidden_size, config.intermediate_size
    matches = [m for k in r.local if (m := _KEY_RE.fullmatch(k)) and m["e"] is not None]
    per_expert = sorted({int(m["e"]) for m in matches})
    fused = any(k.startswith(("experts.gate_up_proj", "experts.down_proj")) for k in r.local)
    if per_expert and fused:
        raise InputError(f"both per-expert ({r.full('experts.{e}.*')}) and fused ({r.full('experts.gate_up_proj')}) "
                         "expert tensors given; pass one layout")
    if per_expert:
        if per_expert[-1] >= E:
            raise InputError(f"key {r.full(f'experts.{per_expert[-1]}.*')!r}: expert index {per_expert[-1]} is out "
                             f"of range for num_experts={E}")
        if config.expert_bias:
            raise InputError(f"per-expert keys ({r.full('experts.0.*')}) with expert biases are not a known "
                             "checkpoint layout; gpt-oss uses the fused 'experts.gate_up_proj' tensors")
        mixtral = any(m["proj"] in ("w1", "w2", "w3") for m in matches)
        g, u, d = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        if r.fp8:
            _stackable(r, I, "intermediate_size I")
        gate_up, down, gate_up_s, down_s = [], [], [], []
        for e in range(E):
            pg, pu, pd = (f"experts.{e}.{p}." for p in (g, u, d))
            wg, sg = r.weight(pg + "weight", (I, H), pg + "weight_scale_inv")
            wu, su = r.weight(pu + "weight", (I, H), pu + "weight_scale_inv")
            wd, sd = r.weight(pd + "weight", (H, I), pd + "weight_scale_inv")
            gate_up.append(np.concatenate([wg, wu]))
            down.append(wd)
            if r.fp8:
                gate_up_s.append(np.concatenate([sg, su]))
                down_s.append(sd)
        out = {"gate_up": np.stack(gate_up), "down": np.stack(down)}
        if r.fp8:
            out |= {"gate_up_scale_inv": np.stack(gate_up_s), "down_scale_inv": np.stack(down_s)}
        return out
    if not fused:
        raise InputError(
            f"missing expert weights for config {config.name!r}: expected {r.full('experts.gate_up_proj')!r} and "
            f"{r.full('experts.down_proj')!r}, or per-expert keys like {r.full('experts.0.gate_proj.weight')!r}"
        )
    layout = _fused_layout(config)
    if layout == "standard":  # [E, 2I, H] gate rows first, [E, H, I]: already canonical
        gu, gu_s = r.weight("experts.gate_up_proj", (E, 2 * I, H), "experts.gate_up_proj_scale_inv")
        dn, dn_s = r.weight("experts.down_proj", (E, H, I), "experts.down_proj_scale_inv")
        out = {"gate_up": gu, "down": dn}
        if r.fp8:
            out |= {"gate_up_scale_inv": gu_s, "down_scale_inv": dn_s}
        return out
    if r.fp8:
        raise InputError(f"FP8 expert weights ({r.full(r.fp8_evidence)!r}) are read only in the per-expert and "
                         f"the standard fused layout, not in {layout}'s [E, H, 2I] one; dequantize first")
    w = r.take("experts.gate_up_proj", (E, H, 2 * I)).transpose(0, 2, 1)  # (E, 2I, H)
    out = {"down": r.take("experts.down_proj", (E, I, H)).transpose(0, 2, 1).copy()}
    if layout == "llama4":  # gate columns first
        out["gate_up"] = w.copy()
        return out
    # gpt-oss: rows 2i are gate i, rows 2i+1 are up i -> gate block then up block
    out["gate_up"] = np.concatenate([w[:, 0::2], w[:, 1::2]], axis=1)
    b = r.take("experts.gate_up_proj_bias", (E, 2 * I))
    out["gate_up_bias"] = np.concatenate([b[:, 0::2], b[:, 1::2]], axis=1)
    out["down_bias"] = r.take("experts.down_proj_bias", (E, H))
    return out


def _stackable(r: _Reader, size: int, what: str) -> None:
    """Stacked gate and up scales are the fused gate_up's only when 128 divides their row count."""
    if size % WEIGHT_BLOCK[0]:
        raise InputError(f"FP8 checkpoint ({r.full(r.fp8_evidence)!r}) with {what}={size}, not a multiple of "
                         f"{WEIGHT_BLOCK[0]}: the gate and up scale blocks do not tile megamoe's fused gate_up; "
                         "dequantize first")


def weights_from_hf(state_dict: Mapping[str, Any], config: MoEConfig, prefix: str | None = None) -> MoEWeights:
    """One MoE layer's weights in megamoe's canonical layout (float64 NumPy), from a HF state dict.

    ``state_dict``: {key: torch tensor of any float dtype (bf16, fp8, ...) or NumPy array}, holding
    the per-expert checkpoint keys or the fused 3-D tensors of transformers' modules (see the
    module docstring). ``prefix`` selects one layer in a dict holding several, e.g.
    ``"model.layers.3.mlp."`` or ``"model.layers.3."`` (the MoE module name is then found); keys
    outside it are ignored. With ``prefix=None`` the one MoE module in the dict is found; a dict
    holding several layers is an error asking for ``prefix``.

    FP8 checkpoints (float8_e4m3fn weights with ``weight_scale_inv``, see the module docstring) give
    FP8 weights (``is_fp8``), the scales as stored.

    Raises ``InputError`` naming the key for a missing, unexpected, misshaped or quantized tensor,
    and for a missing or misshaped scale of an FP8 checkpoint. The result passes
    ``MoEWeights.validate(config)``.
    """
    if not isinstance(config, MoEConfig):
        raise InputError(f"config must be a MoEConfig, got {type(config).__name__}")
    if not isinstance(state_dict, Mapping):
        raise InputError(f"state_dict must be a mapping of key -> tensor, got {type(state_dict).__name__}")
    bad = [k for k in state_dict if not isinstance(k, str)]
    if bad:
        raise InputError(f"state_dict keys must be strings, got {bad[0]!r}")
    P, local = _select_module(state_dict, prefix)
    quantized = [k for k in local if (m := _KEY_RE.fullmatch(k)) and m["quant"]]
    if quantized:
        raise InputError(f"quantized tensor {P + quantized[0]!r}: megamoe reads float checkpoints and FP8 ones "
                         "with 128 x 128 weight_scale_inv only; dequantize to bf16/fp32 first")
    E, H = config.num_experts, config.hidden_size
    r = _Reader(P, local, config)
    rn = r.one_of(("gate", "router"), "router")
    out: dict[str, Any] = {"router_weight": r.take(f"{rn}.weight", (E, H))}
    if config.router_bias:
        out["router_bias"] = r.take(f"{rn}.bias", (E,))
    if config.score_bias:
        out["score_bias"] = r.take(f"{rn}.e_score_correction_bias", (E,))
    out.update(_experts(r, config))
    if config.num_shared_experts:
        Is = config.shared_intermediate_size
        sn = r.one_of(("shared_experts", "shared_expert"), "shared experts")
        if r.fp8:
            _stackable(r, Is, "shared_intermediate_size Is")
        (wg, sg), (wu, su), (wd, sd) = (r.weight(f"{sn}.{p}.weight", shape, f"{sn}.{p}.weight_scale_inv")
                                        for p, shape in (("gate_proj", (Is, H)), ("up_proj", (Is, H)),
                                                         ("down_proj", (H, Is))))
        out["shared_gate_up"] = np.concatenate([wg, wu], axis=0)
        out["shared_down"] = wd
        if r.fp8:
            out["shared_gate_up_scale_inv"] = np.concatenate([sg, su], axis=0)
            out["shared_down_scale_inv"] = sd
        if config.shared_expert_gate:
            out["shared_gate"] = r.take("shared_expert_gate.weight", (1, H))[0]
    extra = sorted(set(local) - r.used)
    if extra:
        listed = ", ".join(repr(P + k) for k in extra[:4]) + (f" and {len(extra) - 4} more" if len(extra) > 4 else "")
        raise InputError(f"unexpected key(s) {listed} for config {config.name!r} ({config.describe()}); "
                         "check the config matches the checkpoint")
    return MoEWeights(**out).validate(config)
