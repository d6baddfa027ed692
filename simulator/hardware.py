"""Hardware profiles: the one strict loader of the system JSON files beside this module.

Shape legend: G GPUs, S SMs per GPU, C switch chips.

A profile is nested data (``system``, ``switch``, ``link``, ``gpu``, ``sm``, ``hbm``). Every number
is an object ``{"value": v, "unit": u, "source": "...", "assumption": true?, "note": "..."}``; the
unit is also the suffix of the key (``_bytes_per_s``, ``_flops_per_s``, ``_bytes``, ``_s``), and the
loader checks that the two agree. Efficiency curves are ``{"unit": "fraction", "over":
"rows_per_expert", "points": [[x, y], ...], "source": ...}``.

``load_profile(spec)`` takes a profile name (a file in ``profiles/``) or a path; ``override(profile,
**fields)`` returns a copy with fields changed and their source marked as an override. Any bad
key, unit, type or range raises ``ProfileError`` naming the key path.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..reference.tiles import GEMM_LOOP_FORMS

PROFILE_DIR = Path(__file__).with_name("profiles")
FORMAT = "megamoe.system/1"


class ProfileError(ValueError):
    """A hardware profile has a bad key, unit, type or value; the message names the key path."""


@dataclass(frozen=True)
class _Num:
    unit: str
    lo: float
    hi: float
    integer: bool = False
    lo_open: bool = False  # value must be > lo rather than >= lo


_COUNT = dict(unit="count", integer=True)
#: The schema: section -> key -> what the key must hold. "curve" marks an efficiency curve.
SCHEMA: dict[str, dict[str, Any]] = {
    "system": {
        "num_gpus": _Num(lo=1, hi=100_000, **_COUNT),
        "num_switch_chips": _Num(lo=0, hi=10_000, **_COUNT),
        "num_nodes": _Num(lo=1, hi=100_000, **_COUNT),
    },
    "switch": {"ports_per_chip": _Num(lo=1, hi=100_000, **_COUNT)},
    "link": {
        "links_per_gpu": _Num(lo=1, hi=1_000, **_COUNT),
        "bandwidth_per_direction_bytes_per_s": _Num("bytes/s", 0, 1e15, lo_open=True),
        "latency_s": _Num("s", 0, 1e-2),
        "payload_efficiency": _Num("fraction", 0, 1, lo_open=True),
    },
    "gpu": {
        "num_sms": _Num(lo=1, hi=100_000, **_COUNT),
        "tensor_bf16_flops_per_s": _Num("flop/s", 0, 1e18, lo_open=True),
        "tensor_fp8_flops_per_s": _Num("flop/s", 0, 1e18, lo_open=True),
        "gemm_efficiency": "curve",
        "gemm_tile_m_rows": _Num(lo=1, hi=4096, **_COUNT),
        "gemm_min_tile_m_rows": _Num(lo=1, hi=4096, **_COUNT),
        "gemm_tile_n_cols": _Num(lo=1, hi=4096, **_COUNT),
        "kernel_launch_s": _Num("s", 0, 1e-2),
        "grid_sync_s": _Num("s", 0, 1e-2),
        "l2_bytes": _Num("bytes", 0, 1e12),
    },
    "sm": {"copy_bytes_per_s": _Num("bytes/s", 0, 1e15, lo_open=True)},
    "hbm": {
        "capacity_bytes": _Num("bytes", 0, 1e15, lo_open=True),
        "bandwidth_bytes_per_s": _Num("bytes/s", 0, 1e16, lo_open=True),
        "efficiency": _Num("fraction", 0, 1, lo_open=True),
    },
}

# ---------------------------------------------------------------------------- rack model
# Communication SMs as a throughput curve and the megakernel's plan: what the rack schedules read.
#   comm.*        B(n) = r * n_eff(n),  n_eff(n) = (n^-p + n_sat^-p)^(-1/p),  n_sat = port / r
#                 (r = sm.copy_bytes_per_s, p = comm.saturation_exponent); each message (one token
#                 row) costs comm.message_s of an SM besides its bytes; quantize / transpose / stash
#                 are per-SM rates of the work a communication SM does besides copying.
#   megakernel.*  default communication SMs and minibatch, the L2 share that keeps weights resident
#                 between minibatches, buffers in minibatches, and the fixed per-layer costs.
_RATE = dict(unit="bytes/s", lo=0, hi=1e15, lo_open=True)
SCHEMA["comm"] = {
    "saturation_exponent": _Num("ratio", 0, 100, lo_open=True),
    "message_s": _Num("s", 0, 1e-3),
    "quantize_bytes_per_s": _Num(**_RATE),
    "transpose_bytes_per_s": _Num(**_RATE),
    "stash_bytes_per_s": _Num(**_RATE),
}
SCHEMA["megakernel"] = {
    "comm_sms": _Num(lo=1, hi=100_000, **_COUNT),
    "minibatch_tokens": _Num(lo=1, hi=10_000_000, **_COUNT),
    "l2_weight_fraction": _Num("fraction", 0, 1),
    "buffer_minibatches": _Num(lo=1, hi=64, **_COUNT),
    "router_topk_s": _Num("s", 0, 1e-2),
    "layer_barrier_s": _Num("s", 0, 1e-2),
}


@dataclass(frozen=True)
class RackModel:
    """The ``comm`` and ``megakernel`` sections, in SI units (see the comment above ``SCHEMA["comm"]``)."""

    saturation_exponent: float
    message_s: float
    quantize_bytes_per_s: float
    transpose_bytes_per_s: float
    stash_bytes_per_s: float
    comm_sms: int
    minibatch_tokens: int
    l2_weight_fraction: float
    buffer_minibatches: int
    router_topk_s: float
    layer_barrier_s: float


def _rack_model(v: dict) -> RackModel:
    return RackModel(**{k: v[f"{sec}.{k}"] for sec in ("comm", "megakernel") for k in SCHEMA[sec]})


def comm_sm_curve(num_sms, per_sm_bytes_per_s: float, port_bytes_per_s: float, exponent: float):
    """Pure-copy throughput (bytes/s per GPU) of ``num_sms`` communication SMs: linear in the SMs at
    ``per_sm_bytes_per_s`` while few, bending smoothly onto the port's rate (a p-norm soft minimum)."""
    import numpy as np

    n = np.maximum(np.asarray(num_sms, dtype=np.float64), 1e-12)
    x = n * per_sm_bytes_per_s / port_bytes_per_s
    return port_bytes_per_s * (x ** -exponent + 1.0) ** (-1.0 / exponent)


# Optional: how communication SMs move rows, pulled (the receiver reads) or pushed (the sender writes):
#   protocol.*    payload efficiency of each (payload bytes per byte on the wire, one direction) and
#                 the completion signalling each pays once per minibatch round. A profile without it
#                 moves both at link.payload_efficiency and signals for free.
OPTIONAL_SCHEMA: dict[str, dict[str, Any]] = {
    "protocol": {
        "pull_payload_efficiency": _Num("fraction", 0, 1, lo_open=True),
        "push_payload_efficiency": _Num("fraction", 0, 1, lo_open=True),
        "pull_signal_s": _Num("s", 0, 1e-2),
        "push_signal_s": _Num("s", 0, 1e-2),
    },
}


@dataclass(frozen=True)
class Protocol:
    """The ``protocol`` section: payload efficiency and per-round signalling of pulls and pushes."""

    pull_payload_efficiency: float
    push_payload_efficiency: float
    pull_signal_s: float
    push_signal_s: float

    def efficiency(self, mode: str) -> float:
        return self.pull_payload_efficiency if mode == "pull" else self.push_payload_efficiency

    def signal_s(self, mode: str) -> float:
        return self.pull_signal_s if mode == "pull" else self.push_signal_s


_TOP = {"format", "name", "description", *SCHEMA}
#: optional top-level sections (single-GPU kernel model, see the end of this module; the protocol)
_OPTIONAL_TOP = {"kernel_model", "calibration", *OPTIONAL_SCHEMA}
_NUM_KEYS = {"value", "unit", "source", "assumption", "note"}
_CURVE_KEYS = {"unit", "over", "points", "source", "assumption", "note"}
_SUFFIX_UNITS = (("_bytes_per_s", "bytes/s"), ("_flops_per_s", "flop/s"), ("_bytes", "bytes"), ("_s", "s"))

#: Short names for ``override`` and the CLI, mapped to key paths.
ALIASES = {
    "gpus": "system.num_gpus",
    "num_gpus": "system.num_gpus",
    "switch_chips": "system.num_switch_chips",
    "switch_ports": "switch.ports_per_chip",
    "links_per_gpu": "link.links_per_gpu",
    "link_bandwidth": "link.bandwidth_per_direction_bytes_per_s",
    "link_latency": "link.latency_s",
    "payload_efficiency": "link.payload_efficiency",
    "sms": "gpu.num_sms",
    "num_sms": "gpu.num_sms",
    "bf16_flops": "gpu.tensor_bf16_flops_per_s",
    "fp8_flops": "gpu.tensor_fp8_flops_per_s",
    "tile_m": "gpu.gemm_tile_m_rows",
    "tile_n": "gpu.gemm_tile_n_cols",
    "sm_copy_bandwidth": "sm.copy_bytes_per_s",
    "hbm_bandwidth": "hbm.bandwidth_bytes_per_s",
    "hbm_efficiency": "hbm.efficiency",
    # rack model
    "comm_sm_exponent": "comm.saturation_exponent",
    "message_cost": "comm.message_s",
    "l2_weight_fraction": "megakernel.l2_weight_fraction",
    "buffer_minibatches": "megakernel.buffer_minibatches",
}


def _expected_unit(key: str, spec: _Num) -> str:
    for suffix, unit in _SUFFIX_UNITS:
        if key.endswith(suffix):
            assert unit == spec.unit, (key, spec.unit)  # the schema itself keeps the naming rule
            break
    return spec.unit


def _check_num(path: str, entry: Any, spec: _Num) -> float | int:
    if not isinstance(entry, dict):
        raise ProfileError(f"{path} must be an object {{value, unit, source}}, got {entry!r}")
    unknown = sorted(set(entry) - _NUM_KEYS)
    if unknown:
        raise ProfileError(f"{path} has unknown key(s) {unknown}; allowed: {sorted(_NUM_KEYS)}")
    for k in ("value", "unit", "source"):
        if k not in entry:
            raise ProfileError(f"{path} is missing {k!r}")
    unit = _expected_unit(path.rsplit(".", 1)[-1], spec)
    if entry["unit"] != unit:
        raise ProfileError(f"{path}.unit must be {unit!r}, got {entry['unit']!r}")
    if not isinstance(entry["source"], str) or not entry["source"].strip():
        raise ProfileError(f"{path}.source must be a non-empty string saying where the number comes from")
    if "assumption" in entry and not isinstance(entry["assumption"], bool):
        raise ProfileError(f"{path}.assumption must be true or false, got {entry['assumption']!r}")
    v = entry["value"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ProfileError(f"{path}.value must be a finite number, got {v!r}")
    if spec.integer:
        if float(v) != int(v):
            raise ProfileError(f"{path}.value must be an integer count, got {v!r}")
        v = int(v)
    if v < spec.lo or (spec.lo_open and v == spec.lo) or v > spec.hi:
        lo = "(" if spec.lo_open else "["
        raise ProfileError(f"{path}.value={v!r} is outside {lo}{spec.lo:g}, {spec.hi:g}] {unit}")
    return v


def _check_points_header(path: str, entry: Any, unit: str, what: str) -> None:
    """A curve or table object: exactly the keys {unit, over, points, source}, with this unit."""
    if not isinstance(entry, dict):
        raise ProfileError(f"{path} must be a {what} {{unit, over, points, source}}, got {entry!r}")
    unknown = sorted(set(entry) - _CURVE_KEYS)
    if unknown:
        raise ProfileError(f"{path} has unknown key(s) {unknown}; allowed: {sorted(_CURVE_KEYS)}")
    for k in ("unit", "over", "points", "source"):
        if k not in entry:
            raise ProfileError(f"{path} is missing {k!r}")
    if entry["unit"] != unit:
        raise ProfileError(f"{path}.unit must be {unit!r}, got {entry['unit']!r}")


def _check_curve(path: str, entry: Any) -> tuple[tuple[float, float], ...]:
    _check_points_header(path, entry, "fraction", "curve object")
    if entry["over"] != "rows_per_expert":
        raise ProfileError(f"{path}.over must be 'rows_per_expert', got {entry['over']!r}")
    if not isinstance(entry["source"], str) or not entry["source"].strip():
        raise ProfileError(f"{path}.source must be a non-empty string")
    pts = entry["points"]
    if not isinstance(pts, list) or not pts:
        raise ProfileError(f"{path}.points must be a non-empty list of [rows, fraction] pairs")
    out = []
    for i, p in enumerate(pts):
        if (not isinstance(p, list) or len(p) != 2
                or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in p)):
            raise ProfileError(f"{path}.points[{i}] must be [rows, fraction], got {p!r}")
        x, y = float(p[0]), float(p[1])
        if not x >= 1:
            raise ProfileError(f"{path}.points[{i}] rows must be >= 1, got {p[0]!r}")
        if not 0 < y <= 1:
            raise ProfileError(f"{path}.points[{i}] fraction must be in (0, 1], got {p[1]!r}")
        if out and x <= out[-1][0]:
            raise ProfileError(f"{path}.points[{i}] rows must increase, got {p[0]!r} after {out[-1][0]!r}")
        if out and y < out[-1][1]:
            # the analytic bound takes the efficiency at the full per-expert row count: it must not
            # fall as rows grow, or a smaller minibatch could beat the bound
            raise ProfileError(f"{path}.points[{i}] fraction must not decrease, got {p[1]!r} after {out[-1][1]!r}")
        out.append((x, y))
    return tuple(out)


@dataclass(frozen=True)
class Profile:
    """A validated system profile.  Attributes carry SI units (bytes, seconds, FLOP/s)."""

    name: str
    description: str
    num_gpus: int
    num_switch_chips: int
    num_nodes: int
    switch_ports_per_chip: int
    links_per_gpu: int
    link_bandwidth_bytes_per_s: float  # one link, one direction
    link_latency_s: float
    payload_efficiency: float
    num_sms: int
    tensor_flops_per_s: dict[str, float]  # "bf16" / "fp8" -> dense peak
    gemm_efficiency: tuple[tuple[float, float], ...]  # (rows per expert, fraction of peak)
    tile_m: int  # rows of a GEMM tile; experts with fewer rows use the next power of two down to min_tile_m
    min_tile_m: int
    tile_n: int
    kernel_launch_s: float
    grid_sync_s: float
    l2_bytes: float
    sm_copy_bytes_per_s: float
    hbm_capacity_bytes: float
    hbm_bandwidth_bytes_per_s: float
    hbm_efficiency: float
    data: dict = field(repr=False, compare=False, default_factory=dict)  # the validated JSON
    rack: RackModel | None = None  # the comm and megakernel sections
    #: the single-GPU kernel model's curves (calibrated, or derived from the fields above)
    kernel: KernelModel | None = field(repr=False, compare=False, default=None)
    protocol: Protocol | None = None  # pulls and pushes; None: both at payload_efficiency, no signalling

    def comm_copy_bytes_per_s(self, num_sms) -> float:
        """Pure-copy throughput of ``num_sms`` communication SMs, bytes/s per GPU (``comm_sm_curve``)."""
        return comm_sm_curve(num_sms, self.sm_copy_bytes_per_s, self.port_bytes_per_s,
                             self.rack.saturation_exponent)

    @property
    def port_bytes_per_s(self) -> float:
        """Payload bandwidth of one GPU's NVLink ports in one direction (all links together)."""
        return self.links_per_gpu * self.link_bandwidth_bytes_per_s * self.payload_efficiency

    @property
    def hbm_effective_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_bytes_per_s * self.hbm_efficiency

    def source(self, path: str) -> str:
        """The source string of a key path, e.g. ``"link.latency_s"``."""
        sec, key = path.split(".")
        return self.data[sec][key]["source"]

    def to_dict(self) -> dict:
        return copy.deepcopy(self.data)


def validate(data: Any, origin: str = "profile") -> Profile:
    """Check a profile dict against ``SCHEMA``; error names ``origin`` and the key path."""
    try:
        return _validate(data)
    except ProfileError as exc:
        raise ProfileError(f"{origin}: {exc}") from None


def _validate(data: Any) -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(f"a profile must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _TOP - _OPTIONAL_TOP)
    if unknown:
        raise ProfileError(f"unknown top-level key(s) {unknown}; allowed: {sorted(_TOP | _OPTIONAL_TOP)}")
    missing = sorted(_TOP - set(data))
    if missing:
        raise ProfileError(f"missing top-level key(s) {missing}")
    if data["format"] != FORMAT:
        raise ProfileError(f"format must be {FORMAT!r}, got {data['format']!r}")
    for k in ("name", "description"):
        if not isinstance(data[k], str) or not data[k]:
            raise ProfileError(f"{k} must be a non-empty string, got {data[k]!r}")
    v: dict[str, Any] = {}
    for sec, keys in SCHEMA.items():
        s = data[sec]
        if not isinstance(s, dict):
            raise ProfileError(f"{sec} must be an object, got {s!r}")
        unknown = sorted(set(s) - set(keys))
        if unknown:
            raise ProfileError(f"{sec} has unknown key(s) {unknown}; allowed: {sorted(keys)}")
        missing = sorted(set(keys) - set(s))
        if missing:
            raise ProfileError(f"{sec} is missing key(s) {missing}")
        for key, spec in keys.items():
            path = f"{sec}.{key}"
            v[path] = _check_curve(path, s[key]) if spec == "curve" else _check_num(path, s[key], spec)
    for sec, keys in OPTIONAL_SCHEMA.items():
        if sec not in data:
            continue
        s = data[sec]
        if not isinstance(s, dict) or set(s) != set(keys):
            raise ProfileError(f"{sec} must be an object with exactly the keys {sorted(keys)}, got {s!r}")
        for key, spec in keys.items():
            v[f"{sec}.{key}"] = _check_num(f"{sec}.{key}", s[key], spec)
    G, C = v["system.num_gpus"], v["system.num_switch_chips"]
    if G > 1 and C == 0:
        raise ProfileError(f"system.num_switch_chips=0 but system.num_gpus={G}: GPUs need switch chips to talk")
    if C:
        per_chip = G * -(-v["link.links_per_gpu"] // C)
        if per_chip > v["switch.ports_per_chip"]:
            raise ProfileError(
                f"switch.ports_per_chip={v['switch.ports_per_chip']} is fewer than the {per_chip} ports that "
                f"{G} GPUs x {v['link.links_per_gpu']} links over {C} chips need; raise it too"
            )
    if G % v["system.num_nodes"]:
        raise ProfileError(f"system.num_nodes={v['system.num_nodes']} must divide system.num_gpus={G}")
    if v["gpu.tensor_fp8_flops_per_s"] < v["gpu.tensor_bf16_flops_per_s"]:
        raise ProfileError("gpu.tensor_fp8_flops_per_s must be >= gpu.tensor_bf16_flops_per_s")
    return Profile(
        name=data["name"], description=data["description"],
        num_gpus=G, num_switch_chips=C, num_nodes=v["system.num_nodes"],
        switch_ports_per_chip=v["switch.ports_per_chip"], links_per_gpu=v["link.links_per_gpu"],
        link_bandwidth_bytes_per_s=float(v["link.bandwidth_per_direction_bytes_per_s"]),
        link_latency_s=float(v["link.latency_s"]), payload_efficiency=float(v["link.payload_efficiency"]),
        num_sms=v["gpu.num_sms"],
        tensor_flops_per_s={"bf16": float(v["gpu.tensor_bf16_flops_per_s"]),
                            "fp8": float(v["gpu.tensor_fp8_flops_per_s"])},
        gemm_efficiency=v["gpu.gemm_efficiency"], tile_m=v["gpu.gemm_tile_m_rows"],
        min_tile_m=min(v["gpu.gemm_min_tile_m_rows"], v["gpu.gemm_tile_m_rows"]),
        tile_n=v["gpu.gemm_tile_n_cols"], kernel_launch_s=float(v["gpu.kernel_launch_s"]),
        grid_sync_s=float(v["gpu.grid_sync_s"]), l2_bytes=float(v["gpu.l2_bytes"]),
        sm_copy_bytes_per_s=float(v["sm.copy_bytes_per_s"]),
        hbm_capacity_bytes=float(v["hbm.capacity_bytes"]),
        hbm_bandwidth_bytes_per_s=float(v["hbm.bandwidth_bytes_per_s"]),
        hbm_efficiency=float(v["hbm.efficiency"]),
        data=copy.deepcopy(data),
        rack=_rack_model(v),
        kernel=_kernel_model(data.get("kernel_model"), v),
        protocol=Protocol(**{k: float(v[f"protocol.{k}"]) for k in OPTIONAL_SCHEMA["protocol"]})
        if "protocol" in data else None,
    )


def available_profiles() -> list[str]:
    """Names of the profiles shipped beside this module."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


list_profiles = available_profiles  # the name ``megamoe info`` uses


def load_profile(spec: str | Path | Profile) -> Profile:
    """A shipped profile by name, or a profile JSON file by path."""
    if isinstance(spec, Profile):
        return spec
    path = Path(spec)
    if isinstance(spec, str) and (PROFILE_DIR / f"{spec}.json").exists() and not path.exists():
        path = PROFILE_DIR / f"{spec}.json"
    if not path.exists():
        raise ProfileError(
            f"{str(spec)!r} is neither a shipped profile ({', '.join(available_profiles())}) nor an existing file"
        )
    if path.is_dir():
        raise ProfileError(f"{str(spec)!r} is a directory; --system takes a profile name "
                           f"({', '.join(available_profiles())}) or a profile JSON file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read the profile: {exc}") from None
    return validate(data, origin=str(path))


def assumptions(profile: str | Path | Profile) -> list[dict]:
    """Every number or curve of a profile flagged ``"assumption": true``, in file order: dicts of
    ``path`` (section.key), ``value`` (a number, or a curve's points), ``unit``, ``source`` and
    ``note`` (what ``megamoe info --assumptions PROFILE`` prints: what the model takes on trust)."""
    data = load_profile(profile).data
    out = []
    for sec, keys in data.items():
        if not isinstance(keys, dict):
            continue
        for key, e in keys.items():
            if isinstance(e, dict) and e.get("assumption") is True:
                out.append({"path": f"{sec}.{key}", "value": e.get("value", e.get("points")), "unit": e.get("unit", ""),
                            "source": e.get("source", ""), "note": e.get("note", "")})
    return out


#: key path -> (lo, hi) in the key's unit: real hardware's range widened ten times (``plausibility_warnings``)
PLAUSIBLE = {
    "link.bandwidth_per_direction_bytes_per_s": (1e9, 1e12),
    "link.latency_s": (1e-8, 1e-4),
    "gpu.num_sms": (8, 2_000),
    "gpu.tensor_bf16_flops_per_s": (1e13, 1e17),
    "gpu.tensor_fp8_flops_per_s": (1e13, 2e17),
    "gpu.kernel_launch_s": (1e-8, 1e-4),
    "gpu.grid_sync_s": (1e-8, 1e-4),
    "gpu.l2_bytes": (1e6, 1e10),
    "sm.copy_bytes_per_s": (1e9, 1e12),
    "hbm.capacity_bytes": (1e9, 1e13),
    "hbm.bandwidth_bytes_per_s": (1e11, 1e14),
}


def plausibility_warnings(profile: Profile) -> list[str]:
    """One line per profile number far outside what real hardware has (see ``PLAUSIBLE``)."""
    out = []
    for path, (lo, hi) in PLAUSIBLE.items():
        sec, key = path.split(".")
        v = profile.data[sec][key]["value"]
        if v == 0 and path.endswith("_s"):
            continue
        if not lo <= v <= hi:
            unit = profile.data[sec][key]["unit"]
            out.append(f"{path} = {v:g} {unit} is far outside what GPUs have ({lo:g} to {hi:g} {unit}); "
                       f"check the number and its unit (source: {profile.data[sec][key]['source']})")
    return out


def override(profile: Profile, **fields: Any) -> Profile:
    """A copy of ``profile`` with fields changed: ``override(p, gpus=8, link_bandwidth=25e9)``.

    Keys are ``ALIASES`` names or ``section__key`` (double underscore for the dot), values are in
    the key's unit. The changed entries get ``source: "override"``; the result is validated again.
    Changing the SM count scales the tensor peaks with it (same per-SM rate) unless they are
    overridden in the same call.
    """
    data = copy.deepcopy(profile.data)
    changed = []
    for name, value in fields.items():
        if value is None:
            continue
        path = ALIASES.get(name, name.replace("__", "."))
        if "." not in path:
            raise ProfileError(f"unknown override {name!r}; use one of {sorted(ALIASES)} or section__key")
        sec, key = path.split(".", 1)
        known = SCHEMA.get(sec, OPTIONAL_SCHEMA.get(sec, {}) if sec in data else {})
        if key not in known:
            raise ProfileError(f"unknown override {name!r} (key path {path!r} is not in the profile schema"
                               f"{'' if sec in SCHEMA or sec in data or sec not in OPTIONAL_SCHEMA else ' of this profile'})")
        if sec not in SCHEMA:
            data[sec][key] = {**data[sec][key], "value": value, "source": "override"}
            data[sec][key].pop("assumption", None)
            changed.append(path)
            continue
        if SCHEMA[sec][key] == "curve":
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ProfileError(f"override {path} takes a number (a flat efficiency), got {value!r}")
            data[sec][key] = {**data[sec][key], "points": [[1, float(value)]], "source": "override"}
        else:
            data[sec][key] = {**data[sec][key], "value": value, "source": "override"}
            data[sec][key].pop("assumption", None)
        changed.append(path)
    if "gpu.num_sms" in changed:
        # a GPU with more SMs has more tensor cores: keep the per-SM rate unless a peak is given too
        scale = data["gpu"]["num_sms"]["value"] / profile.num_sms
        for key in ("tensor_bf16_flops_per_s", "tensor_fp8_flops_per_s"):
            if f"gpu.{key}" not in changed:
                e = data["gpu"][key]
                data["gpu"][key] = {**e, "value": e["value"] * scale,
                                    "source": f"scaled with gpu.num_sms override from: {e['source']}"}
    if changed:
        data["name"] = f"{profile.name} ({', '.join(changed)} overridden)"
    return validate(data, origin=f"{profile.name} with overrides")


def parse_assignment(text: str) -> tuple[str, float]:
    """``"link.latency_s=2e-6"`` or ``"gpus=8"`` -> (override key, number); for the CLI's --set."""
    if "=" not in text:
        raise ProfileError(f"--set expects key=value, got {text!r}")
    k, val = text.split("=", 1)
    k = k.strip()
    try:
        num = float(val)
    except ValueError:
        raise ProfileError(f"--set {k}: value must be a number, got {val!r}") from None
    if num.is_integer() and "." not in val and "e" not in val.lower():
        num = int(num)
    return (k if k in ALIASES else k.replace(".", "__")), num


# --------------------------------------------------------------------------- single-GPU kernel model
# The optional ``kernel_model`` section: what ``megamoe calibrate`` measures on one GPU with
# microbenchmarks, read by ``cost.py``. Scalars are number objects as above; curves are tables
# ``{"unit", "over": [axis names], "points": [[x..., value], ...], "source"}``. A profile without the
# section (every rack profile) gets each entry derived from its ``gpu`` / ``hbm`` / ``sm`` fields,
# with the source saying so; ``calibration`` is free-form provenance (gpu, versions, date).

_KM_SCALARS = {
    "launch_gap_s": _Num("s", 0, 1e-2),  # one more kernel in a CUDA graph
    "graph_fixed_s": _Num("s", 0, 1e-2),  # one graph replay's fixed cost
    "flag_handoff_s": _Num("s", 0, 1e-2),  # release -> acquire between two programs
    "grid_barrier_s": _Num("s", 0, 1e-2),  # all programs of a persistent launch
    "ticket_s": _Num("s", 0, 1e-3),  # one atomic ticket from a global counter, amortised
    "task_overhead_s": _Num("s", 0, 1e-3),  # fixed cost of one task or program (prologue, epilogue)
    "serial_load_step_s": _Num("s", 0, 1e-3),  # one step of one program's dependent load loop
    "serial_reduce_step_s": _Num("s", 0, 1e-3),  # one dependent row reduction (top-k pass, scan)
    "l2_bandwidth_bytes_per_s": _Num("bytes/s", 0, 1e17),  # 0: L2 hits cost nothing
    "l2_resident_fraction": _Num("fraction", 0, 1),  # share of L2 that weights may stay in
    # the bf16 tensor rate a whole GPU sustains on a large dense GEMM (0: none), a cap on the tile
    # table's on-chip bursts (clocks and power under a GEMM's data movement)
    "mma_sustained_flops_per_s": _Num("flop/s", 0, 1e18),
    # shared memory one SM holds for its resident programs; recorded, not read by the cost model
    "sm_shared_memory_bytes": _Num("bytes", 0, 1e9),
}
#: an SM's shared memory, bytes, where a profile does not say (Hopper's and data-center Blackwell's 228 KiB)
SM_SHARED_MEMORY_BYTES = 228 * 1024
#: the axes of the reuse tables (kernel_model.gemm_reuse_<form>)
GEMM_REUSE_AXES = ("BLOCK_M", "BLOCK_N", "num_warps", "depth", "row_blocks")
#: the axes of the deep readers' table (kernel_model.hbm_deep_read)
HBM_DEEP_AXES = ("programs_in_flight", "bytes_in_flight", "sharing_group", "bytes_per_program")
_KM_TABLES = {
    "hbm_read": ("bytes/s", ("programs_in_flight", "bytes_per_program")),
    # the same grid read with the weight tiles through a TMA descriptor (optional): recorded, not read
    # by the cost model (its reads of weights through TMA price at hbm_read)
    "hbm_read_tma": ("bytes/s", ("programs_in_flight", "bytes_per_program")),
    # HBM read by programs that keep more in flight than hbm_read's reader (48 KiB): P programs of one
    # per SM, each keeping bytes_in_flight of weight tiles in its pipeline, groups of g consecutive
    # programs reading the same tiles at once, from a cold L2 (megamoe/calibrate/microbench_deep.py, calibrate step
    # hbm_deep; optional): bytes/s the programs read (P x bytes_per_program / s; g > 1: g x the DRAM
    # bytes). The points fill a grid of the four axes. Read by the megakernel's GEMM tasks (depth_rates)
    "hbm_deep_read": ("bytes/s", HBM_DEEP_AXES),
    "mma": ("flop/s per SM", ("BLOCK_M", "BLOCK_N", "num_warps", "depth")),
    "mma_fp8": ("flop/s per SM", ("BLOCK_M", "BLOCK_N", "num_warps", "depth")),  # e4m3 x e4m3, fp32 accumulate
    # recorded for diagnosis, not read: L2-fed tiles by pointer loads (docs/cost-model.md)
    "mma_pointer": ("flop/s per SM", ("BLOCK_M", "BLOCK_N", "num_warps", "depth")),
    # a dense GEMM of each tile loop form (megamoe/calibrate/microbench_gemm.py, reference.tiles.GEMM_LOOP_FORMS):
    # a tile per program or persistent programs, pointer or TMA loads, and "_gated": GEMM 1's tile,
    # gate and up accumulators over one row tile, BLOCK_N their columns together
    **{f"gemm_{form}": ("flop/s per SM", ("BLOCK_M", "BLOCK_N", "num_warps", "depth")) for form in GEMM_LOOP_FORMS},
    # grouped GEMMs whose weight tiles are each read by ``row_blocks`` row blocks, weights from HBM
    # (megamoe/calibrate/microbench_gemm.reuse_gemm, calibrate step gemm_reuse; optional), per loop form: each
    # (BLOCK_M, BLOCK_N, num_warps) shape's points fill a grid of depth x row_blocks. Recorded, not
    # read by the cost model
    **{f"gemm_reuse_{form}": ("flop/s per SM", GEMM_REUSE_AXES) for form in GEMM_LOOP_FORMS},
    "occupancy": ("programs per SM", ("num_warps",)),
    "sm_copy": ("bytes/s per SM", ("copying_sms",)),
    # L2-resident weight tiles read by P programs at once, groups of g consecutive programs reading
    # the same tile at the same step (megamoe/calibrate/microbench_shared.py; optional): aggregate bytes/s.
    # Read by the L2-hit bytes of grouped GEMMs and the L2 reads by depth (depth_rates)
    "l2_shared_read": ("bytes/s", ("programs", "sharing_group")),
    # the router's load + dot step and the top-k pass with P programs running them at once
    # (optional; at P = 1 the scalars' kernels): recorded, not read by the cost model (it reads the scalars)
    "serial_load_step": ("s", ("programs",)),
    "serial_reduce_step": ("s", ("programs",)),
    # one program's top-1 pass over rows of ``width`` fp32 scores (the row's BLOCK_E; calibrate step serial:
    # 128 and 256, whose median is serial_reduce_step_s; optional). Read by ``rates.reduce_step_at_width``
    "serial_reduce_width": ("s", ("width",)),
    # recorded, not read: the load step as a dependent chain (each step's address from the last load)
    "serial_chain_step": ("s", ("programs",)),
    # one routing program's selection per block of BLOCK_T tokens, by router family (routing.ROUTER_CODES),
    # BLOCK_E, K, groups, tokens and top-k way (megamoe/calibrate/microbench_route.py; optional): the multi-launch router's selection
    # where a key matches, else topk_passes x serial_reduce_step_s
    "route_select": ("s", ("router", "BLOCK_E", "K", "N_GROUP", "BLOCK_T", "BITONIC")),
    # a dense bf16 GEMM's (cuBLAS) average rate over busy_s seconds of back-to-back matmuls started
    # from idle clocks, as a fraction (at most 1) of its short-launch rate (calibrate step sustained;
    # optional): the SM clock falls under sustained MMA. Read by ``clocks.sustained_ratio``
    "sustained_mma": ("fraction", ("busy_s",)),
    # the sustained fall at a duty: matmuls a fraction "duty" of a long graph's time, HBM reads between
    # (calibrate step sustained, full form), as the fraction of the fall of matmuls back to back over the
    # same seconds: (1 - rate ratio at the duty) / (1 - sustained_mma at that busy_s) (optional). Read by
    # ``clocks.duty_fall``
    "sustained_duty": ("fraction", ("duty",)),
}


#: a tile loop form (reference.tiles.GEMM_LOOP_FORMS) -> the dense-GEMM tables that price it, its own first
GEMM_LOADS = {
    "pointer": ("pointer",),
    "pointer_gated": ("pointer_gated", "pointer"),
    "tma": ("tma",),
    "tma_persistent": ("tma_persistent", "tma"),
    "tma_persistent_gated": ("tma_persistent_gated", "tma_persistent", "tma"),
    "tma_ab_persistent": ("tma_ab_persistent", "tma_persistent", "tma"),
    "pointer_persistent": ("pointer_persistent", "pointer"),
    "pointer_persistent_gated": ("pointer_persistent_gated", "pointer_persistent", "pointer"),
    "tma_persistent_gated_flat": ("tma_persistent_gated_flat", "tma_persistent_gated", "tma_persistent", "tma"),
    "tma_ab_persistent_flat": ("tma_ab_persistent_flat", "tma_ab_persistent", "tma_persistent", "tma"),
}


@dataclass(frozen=True)
class KernelModel:
    """The single-GPU kernel model's data, SI units.

    hbm_programs (n,), hbm_bytes (m,), hbm_rate (n, m): aggregate streaming-read bytes/s with n
    programs in flight each reading m bytes; mma: ((BLOCK_M, BLOCK_N, num_warps, depth, flop/s per
    SM), ...) or () (then the GPU's efficiency curve is used), bf16; mma_fp8: the same for e4m3 x e4m3
    with fp32 accumulation, or () (then fp8 rates are the bf16 ones scaled by the peaks' ratio); occupancy: ((num_warps, programs per
    SM), ...); sm_copy: ((copying SMs, bytes/s per SM), ...); scalars as in ``_KM_SCALARS``;
    sources: key -> source string; calibrated: whether the section was in the file.
    hbm_tma_programs, hbm_tma_bytes, hbm_tma_rate: the same grid read by a TMA-fed reader
    (``kernel_model.hbm_read_tma``), or () where the profile has none; recorded, not read by the cost
    model (TMA reads price at hbm_rate).
    l2_shared_programs (n,), l2_shared_groups (m,), l2_shared_rate (n, m): aggregate L2 read bytes/s
    of n programs sharing tiles in groups of m (``kernel_model.l2_shared_read``), or ();
    serial_load_steps, serial_reduce_steps: ((programs, s per step), ...) (``kernel_model.
    serial_load_step`` / ``serial_reduce_step``), or (); the cost model reads the shared-read table
    (``depth_rates``) and the serial steps' tables not at all (recorded; it reads the scalars).
    route_select: ((router code, BLOCK_E, K, N_GROUP, BLOCK_T, BITONIC, s per block), ...) (``kernel_model.
    route_select``), or (): the multi-launch routing program's selection (cost.route_select_s).
    hbm_deep_programs (n,), hbm_deep_depths (d,), hbm_deep_groups (g,), hbm_deep_bytes (m,),
    hbm_deep_rate (n, d, g, m): the deep readers' bytes/s (``kernel_model.hbm_deep_read``) by
    programs, bytes in flight per program, sharing group and bytes per program, or (); read by
    ``depth_rates.deep_read_rate`` and ``depth_rates.deep_stream_rate``.
    gemm_reuse: ((loop form, (((BLOCK_M, BLOCK_N, num_warps), depths (d,), row blocks (r,), flop/s
    per SM (d, r)), ...)), ...) by form and shape (``kernel_model.gemm_reuse_<form>``), or ();
    recorded, not read by the cost model (``gemm_reuse_table``).
    sustained_mma: ((busy seconds, average rate / short-launch rate), ...) by busy seconds
    (``kernel_model.sustained_mma``), or (); read by ``clocks.sustained_ratio``.
    sustained_duty: ((duty, fraction of the fall at duty 1), ...) by duty (``kernel_model.sustained_duty``),
    or (); read by ``clocks.duty_fall``.
    serial_reduce_width: ((row width, s per top-1 pass), ...) by width (``kernel_model.serial_reduce_width``),
    or (); read by ``rates.reduce_step_at_width``.
    """

    hbm_programs: tuple
    hbm_bytes: tuple
    hbm_rate: tuple
    mma: tuple
    occupancy: tuple
    sm_copy: tuple
    launch_gap_s: float
    graph_fixed_s: float
    flag_handoff_s: float
    grid_barrier_s: float
    ticket_s: float
    task_overhead_s: float
    serial_load_step_s: float
    serial_reduce_step_s: float
    l2_bandwidth_bytes_per_s: float
    l2_resident_fraction: float
    sources: dict = field(default_factory=dict, compare=False)
    calibrated: bool = False
    mma_fp8: tuple = ()
    mma_sustained_flops_per_s: float = 0.0
    sm_shared_memory_bytes: float = 0.0  # 0: unknown (the loader fills SM_SHARED_MEMORY_BYTES)
    gemm_pointer: tuple = ()
    gemm_tma: tuple = ()
    gemm_pointer_gated: tuple = ()
    gemm_tma_persistent: tuple = ()
    gemm_tma_persistent_gated: tuple = ()
    gemm_tma_ab_persistent: tuple = ()
    gemm_pointer_persistent: tuple = ()
    gemm_pointer_persistent_gated: tuple = ()
    gemm_tma_persistent_gated_flat: tuple = ()
    gemm_tma_ab_persistent_flat: tuple = ()
    hbm_tma_programs: tuple = ()
    hbm_tma_bytes: tuple = ()
    hbm_tma_rate: tuple = ()
    l2_shared_programs: tuple = ()
    l2_shared_groups: tuple = ()
    l2_shared_rate: tuple = ()
    serial_load_steps: tuple = ()
    serial_reduce_steps: tuple = ()
    route_select: tuple = ()
    gemm_reuse: tuple = ()
    hbm_deep_programs: tuple = ()
    hbm_deep_depths: tuple = ()
    hbm_deep_groups: tuple = ()
    hbm_deep_bytes: tuple = ()
    hbm_deep_rate: tuple = ()
    sustained_mma: tuple = ()
    sustained_duty: tuple = ()
    serial_reduce_width: tuple = ()

    def gemm_reuse_table(self, loads: str) -> tuple:
        """The reuse grids (((BM, BN, warps), depths, row blocks, rates), ...) of a tile loop that
        loads its operands as ``loads`` (GEMM_LOADS), or of the nearest loop this profile has one
        for (GEMM_LOADS' fallbacks); () where it has none of them."""
        return _first_table(dict(self.gemm_reuse).get, loads)

    def gemm_table(self, loads: str) -> tuple:
        """The dense-GEMM table of a tile loop that loads its operands as ``loads`` (GEMM_LOADS),
        or, where this profile lacks it, of the nearest loop it has (GEMM_LOADS' fallbacks); ()
        where it has none of them."""
        return _first_table(lambda name: getattr(self, "gemm_" + name), loads)


def _first_table(table_of, loads: str) -> tuple:
    """The first non-empty ``table_of(form)`` along ``loads``' fallbacks (GEMM_LOADS[loads]), or ()."""
    for name in GEMM_LOADS[loads]:
        t = table_of(name)
        if t:
            return t
    return ()


def _check_table(path: str, entry: Any, unit: str, over: tuple) -> list:
    _check_points_header(path, entry, unit, "table")
    if list(entry["over"]) != list(over):
        raise ProfileError(f"{path}.over must be {list(over)}, got {entry['over']!r}")
    if not isinstance(entry["source"], str) or not entry["source"].strip():
        raise ProfileError(f"{path}.source must be a non-empty string")
    pts = entry["points"]
    if not isinstance(pts, list) or not pts:
        raise ProfileError(f"{path}.points must be a non-empty list of {list(over) + ['value']} rows")
    for i, p in enumerate(pts):
        if (not isinstance(p, list) or len(p) != len(over) + 1
                or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0
                       for x in p)):
            raise ProfileError(f"{path}.points[{i}] must be {len(over) + 1} positive numbers "
                               f"{list(over) + ['value']}, got {p!r}")
    return [tuple(float(x) for x in p) for p in pts]


def _kernel_model(section: Any, v: dict) -> KernelModel:
    """The kernel model of a profile: ``section`` (the JSON, or None) over defaults from ``v``."""
    S = v["gpu.num_sms"]
    hbm = float(v["hbm.bandwidth_bytes_per_s"]) * float(v["hbm.efficiency"])
    derived = "derived from the profile's gpu/hbm fields (no kernel_model section)"
    d = dict(launch_gap_s=float(v["gpu.kernel_launch_s"]), graph_fixed_s=0.0,
             flag_handoff_s=float(v["gpu.grid_sync_s"]), grid_barrier_s=float(v["gpu.grid_sync_s"]),
             ticket_s=0.0, task_overhead_s=0.0, serial_load_step_s=0.0, serial_reduce_step_s=0.0,
             l2_bandwidth_bytes_per_s=0.0, l2_resident_fraction=float(v["megakernel.l2_weight_fraction"]),
             mma_sustained_flops_per_s=0.0, sm_shared_memory_bytes=float(SM_SHARED_MEMORY_BYTES))
    sources = {k: derived for k in d}
    sources["sm_shared_memory_bytes"] = ("assumption: 228 KiB per SM, Hopper and data-center Blackwell (CUDA C++ "
                                         "Programming Guide, compute capabilities 9.0 and 10.0)")
    sources["l2_resident_fraction"] = "the profile's megakernel.l2_weight_fraction (no kernel_model entry)"
    progs = (1.0, S / 4, S / 2, float(S), 2.0 * S, 8.0 * S)
    tables = {
        "hbm_read": [(n, 1e9, hbm * min(1.0, n / S)) for n in progs],
        "hbm_read_tma": [],
        "mma": [],
        "mma_fp8": [],
        **{"gemm_" + n: [] for n in GEMM_LOADS},
        "mma_pointer": [],
        "occupancy": [(1.0, 2.0), (4.0, 2.0), (8.0, 1.0), (16.0, 1.0)],
        "sm_copy": [(1.0, float(v["sm.copy_bytes_per_s"]))],
        "l2_shared_read": [],
        "serial_load_step": [],
        "serial_reduce_step": [],
        "serial_chain_step": [],
        "route_select": [],
        "hbm_deep_read": [],
        "sustained_mma": [],
        "sustained_duty": [],
        "serial_reduce_width": [],
        **{"gemm_reuse_" + n: [] for n in GEMM_LOADS},
    }
    sources.update(hbm_read=derived + ": HBM rate x min(1, programs / SMs)",
                   hbm_read_tma="none: TMA reads price at the hbm_read table", mma=derived + ": peak x gemm_efficiency",
                   mma_fp8="the bf16 mma rates x gpu.tensor_fp8_flops_per_s / gpu.tensor_bf16_flops_per_s",
                   **{"gemm_" + n: "none: the mma table" for n in GEMM_LOADS},
                   occupancy="assumption: 1 program per SM at 8+ warps, 2 below", sm_copy=derived,
                   l2_shared_read="none: L2 hits price at l2_bandwidth_bytes_per_s",
                   serial_load_step="none: serial_load_step_s", serial_reduce_step="none: serial_reduce_step_s",
                   serial_chain_step="none", route_select="none: topk_passes x serial_reduce_step_s",
                   hbm_deep_read="none: launches read hbm_read",
                   sustained_mma="none: MMA rates as calibrated (short launches) at any busy duration",
                   sustained_duty="none: the whole sustained fall at any MMA duty",
                   serial_reduce_width="none: serial_reduce_step_s at every row width",
                   **{"gemm_reuse_" + n: "none: the gemm_" + n + " table at every reuse" for n in GEMM_LOADS})
    calibrated = section is not None
    if section is not None:
        if not isinstance(section, dict):
            raise ProfileError(f"kernel_model must be an object, got {section!r}")
        unknown = sorted(set(section) - set(_KM_SCALARS) - set(_KM_TABLES))
        if unknown:
            raise ProfileError(f"kernel_model has unknown key(s) {unknown}; allowed: "
                               f"{sorted(set(_KM_SCALARS) | set(_KM_TABLES))}")
        for k, spec in _KM_SCALARS.items():
            if k in section:
                d[k] = float(_check_num(f"kernel_model.{k}", section[k], spec))
                sources[k] = section[k]["source"]
        for k, (unit, over) in _KM_TABLES.items():
            if k in section:
                tables[k] = _check_table(f"kernel_model.{k}", section[k], unit, over)
                sources[k] = section[k]["source"]
    ns, bs, rate = _hbm_grid("hbm_read", tables["hbm_read"])
    tma_ns, tma_bs, tma_rate = _hbm_grid("hbm_read_tma", tables["hbm_read_tma"]) if tables["hbm_read_tma"] else ((),) * 3
    l2s = (_hbm_grid("l2_shared_read", tables["l2_shared_read"], "programs x sharing_group")
           if tables["l2_shared_read"] else ((),) * 3)
    deep = _deep_grid(tables["hbm_deep_read"]) if tables["hbm_deep_read"] else ((),) * 5
    return KernelModel(hbm_programs=ns, hbm_bytes=bs, hbm_rate=rate,
                       hbm_tma_programs=tma_ns, hbm_tma_bytes=tma_bs, hbm_tma_rate=tma_rate,
                       l2_shared_programs=l2s[0], l2_shared_groups=l2s[1], l2_shared_rate=l2s[2],
                       serial_load_steps=_by_programs("serial_load_step", tables["serial_load_step"]),
                       serial_reduce_steps=_by_programs("serial_reduce_step", tables["serial_reduce_step"]),
                       route_select=tuple(sorted(tables["route_select"])),
                       hbm_deep_programs=deep[0], hbm_deep_depths=deep[1], hbm_deep_groups=deep[2],
                       hbm_deep_bytes=deep[3], hbm_deep_rate=deep[4],
                       sustained_mma=_sustained(tables["sustained_mma"]),
                       sustained_duty=_sustained(tables["sustained_duty"], "sustained_duty", "duty"),
                       serial_reduce_width=_by_axis("serial_reduce_width", tables["serial_reduce_width"], "width"),
                       mma=tuple(sorted(tables["mma"])), mma_fp8=tuple(sorted(tables["mma_fp8"])),
                       **{"gemm_" + n: tuple(sorted(tables["gemm_" + n])) for n in GEMM_LOADS},
                       gemm_reuse=tuple((n, _reuse_grids("gemm_reuse_" + n, tables["gemm_reuse_" + n]))
                                        for n in GEMM_LOADS if tables["gemm_reuse_" + n]),
                       occupancy=tuple(sorted(tables["occupancy"])),
                       sm_copy=tuple(sorted(tables["sm_copy"])), sources=sources, calibrated=calibrated, **d)


def _hbm_grid(key: str, pts: list, axes: str = "programs x bytes") -> tuple[tuple, tuple, tuple]:
    """(programs (n,), bytes (m,), rates (n, m)) of an HBM table's points, which must fill the grid
    (or of any two-axis table: ``axes`` names them in the error)."""
    ns = sorted({p[0] for p in pts})
    bs = sorted({p[1] for p in pts})
    grid = {(p[0], p[1]): p[2] for p in pts}
    if len(grid) != len(ns) * len(bs):
        raise ProfileError(f"kernel_model.{key}.points must fill a grid of {axes} "
                           f"({len(ns)} x {len(bs)}), got {len(grid)} distinct points")
    return tuple(ns), tuple(bs), tuple(tuple(grid[(n, b)] for b in bs) for n in ns)


def _deep_grid(pts: list) -> tuple:
    """(programs (n,), bytes in flight (d,), sharing groups (g,), bytes per program (m,), rates
    (n, d, g, m)) of the deep readers' points, which must fill the grid of the four axes; programs
    and sharing groups at least 1."""
    key = "kernel_model.hbm_deep_read"
    axes = [tuple(sorted({p[i] for p in pts})) for i in range(4)]
    for i in (0, 2):
        if axes[i][0] < 1:
            raise ProfileError(f"{key}: {HBM_DEEP_AXES[i]} must be >= 1, got {axes[i][0]}")
    grid = {p[:4]: p[4] for p in pts}
    shape = [len(a) for a in axes]
    if len(grid) != math.prod(shape):
        raise ProfileError(f"{key}.points must fill a grid of {' x '.join(HBM_DEEP_AXES)} "
                           f"({' x '.join(map(str, shape))}), got {len(grid)} distinct points")
    n, d, g, m = axes
    rate = tuple(tuple(tuple(tuple(grid[(a, b, c, e)] for e in m) for c in g) for b in d) for a in n)
    return n, d, g, m, rate


def _by_axis(key: str, pts: list, over: str) -> tuple:
    """((x, value), ...) of a one-axis table over ``over``, sorted by x; () for none. Each x once."""
    out = tuple(sorted(pts))
    if len({p[0] for p in out}) != len(out):
        raise ProfileError(f"kernel_model.{key}.points name a {over} twice: {[p[0] for p in out]}")
    return out


def _by_programs(key: str, pts: list) -> tuple:
    """((programs, value), ...) of a one-axis table over programs (``_by_axis``)."""
    return _by_axis(key, pts, "program count")


def _sustained(pts: list, key: str = "sustained_mma", over: str = "busy duration") -> tuple:
    """((busy seconds, ratio), ...) of kernel_model.sustained_mma by busy seconds (or of ``key``,
    sustained_duty, by duty), () for none: each point once (``_by_axis``), every ratio at most 1 (a
    fraction of the short-launch rate, or of the whole fall)."""
    out = _by_axis(key, pts, over)
    for busy, ratio in out:
        if ratio > 1:
            raise ProfileError(f"kernel_model.{key}: the ratio at {busy:g} must be at most 1, got {ratio:g}")
    return out


def _reuse_grids(key: str, pts: list) -> tuple:
    """A reuse table's points (BM, BN, warps, depth, row blocks, rate) -> (((BM, BN, warps), depths
    (d,), row blocks (r,), rates (d, r)), ...) by shape; each shape's points must fill its grid of
    depth x row_blocks (``_hbm_grid``)."""
    out = []
    for shape in sorted({p[:3] for p in pts}):
        sub = [p[3:] for p in pts if p[:3] == shape]
        what = f"depth x row_blocks of shape {[int(x) for x in shape]}"
        out.append((shape, *_hbm_grid(key, sub, what)))
    return tuple(out)
