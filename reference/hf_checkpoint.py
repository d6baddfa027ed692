"""Hugging Face state dicts -> the fields of ``MoEWeights`` (``MoEWeights.from_hf``; the accepted
keys, layouts and FP8 scales are tabled in docs/design.md).

Shape legend: E routed experts, H hidden size, I expert width, Is shared width.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._checks import InputError
from .config import MoEConfig
from .fp8 import WEIGHT_BLOCK, check_e4m3_values, check_scales, scale_shape

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
    """Takes tensors out of one MoE module's keys, checking shapes; remembers which were used."""

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
        s = check_scales(f"state_dict[{self.full(scale_key)!r}]", self.take(scale_key, want))
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


def hf_weight_fields(state_dict: Mapping[str, Any], config: MoEConfig, prefix: str | None = None) -> dict[str, Any]:
    """The ``MoEWeights`` fields of one MoE layer of a HF state dict (keys: docs/design.md)."""
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
    return out
