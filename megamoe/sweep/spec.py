"""The sweep SPEC: a ``[fixed]`` table of simulate options and a ``[grid]`` table of lists.

Options are spelled as on ``megamoe simulate``'s command line, plus any ``--set`` profile field.
Every value is checked before anything runs (``SpecError`` names it); combinations the simulator
refuses are left to the points.

    spec = load_spec("grid.toml")          # or parse_spec({"fixed": {...}, "grid": {...}})
    points = spec.points()                 # [Point(point_id, options)], in grid order
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class SpecError(ValueError):
    """A sweep SPEC has an unknown table, an unknown option or a bad value; the message names it."""


def _positive_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError("must be an integer >= 1")
    return v


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("must be an integer")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError("must be true or false")
    return v


def _number(v: Any) -> int | float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError("must be a number")
    return v


def _minibatch(v: Any) -> int | None:
    if v == "auto":
        return None  # the simulator's default: all tokens up to 512, else Tg / 8
    return _positive_int(v)


def _choice(*allowed: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if v not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return v
    return check


def _loads(v: Any, load: Callable[[str], Any], what: str) -> str:
    """``v`` if ``load(v)`` accepts it (its own error names the problem otherwise)."""
    if not isinstance(v, str):
        raise ValueError(f"must be {what}")
    try:
        load(v)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None
    return v


def _model(v: Any) -> str:
    from megamoe.reference import MoEConfig

    return _loads(v, MoEConfig.load, "a preset name or a config JSON path")


def _system(v: Any) -> str:
    from megamoe.simulator import load_profile

    return _loads(v, load_profile, "a profile name or a profile JSON path")


def _routing(v: Any) -> str:
    from megamoe.simulator import parse_routing

    if not isinstance(v, str):
        raise ValueError("must be a routing string such as skewed:10.9")
    spec = parse_routing(v)
    if spec.kind == "trace" and not Path(spec.path).exists():
        raise ValueError(f"trace file {spec.path!r} does not exist")
    return v


def _choice_of(module: str, name: str) -> Callable[[Any], str]:
    """_choice of the keys of ``module.name``, imported when a value is checked."""
    return lambda v: _choice(*getattr(importlib.import_module(module), name))(v)


_placement = _choice_of("megamoe.simulator.placement", "POLICIES")
_schedule = _choice_of("megamoe.simulator.schedules", "SCHEDULE_ALIASES")
_dtype = _choice_of("megamoe.simulator.cost", "DTYPES")


@dataclass(frozen=True)
class Option:
    """One simulate option: how a value is checked, its default (None: the simulator's), help."""

    check: Callable[[Any], Any]
    default: Any
    help: str


#: Options spelled as on ``megamoe simulate``'s command line. Profile fields are handled apart.
OPTIONS: dict[str, Option] = {
    "model": Option(_model, "deepseek-v3", "MoEConfig preset or config JSON path"),
    "system": Option(_system, "gb200-nvl72", "hardware profile name or JSON path"),
    "tokens-per-gpu": Option(_positive_int, 4096, "tokens each GPU starts with"),
    "routing": Option(_routing, "skewed", "uniform | skewed[:R] | zipf:S | hot:F[:N] | trace:FILE | router"),
    "placement": Option(_placement, "contiguous", "contiguous | round_robin | random | eplb"),
    "slots": Option(_positive_int, None, "physical expert slots for eplb"),
    "schedule": Option(_schedule, "fused", "fused | bulk"),
    "comm-sms": Option(_positive_int, None, "SMs given to communication (default: the profile's megakernel.comm_sms)"),
    "minibatch": Option(_minibatch, None, "tokens per GPU per minibatch, or \"auto\""),
    "dtype": Option(_dtype, "bf16", "weights and dispatched activations"),
    "weight-dtype": Option(_dtype, None, "override dtype for the weights"),
    "dispatch-dtype": Option(_dtype, None, "override dtype for the dispatch"),
    "no-shared": Option(_bool, False, "leave the shared expert out"),
    "seed": Option(_int, 0, "routing and placement seed"),
    "analytic": Option(_bool, False, "the analytic bound only (no event model)"),
}
#: simulate's hardware flags and the profile override they set.
PROFILE_FLAGS = {"gpus": "gpus", "sms": "sms", "link-bandwidth": "link_bandwidth", "link-latency": "link_latency",
                 "hbm-bandwidth": "hbm_bandwidth"}
TABLES = ("fixed", "grid")
#: Most points one sweep may have (the list of points alone takes about 20 us per point to build).
MAX_POINTS = 1_000_000
#: Points per second and worker, roughly, to estimate a grid's time: analytic bound, event model.
RATE_ANALYTIC, RATE_EVENT = 5_000, 5
#: Options that decide the workload (routing, placement, per-GPU work): points that agree on them
#: share one built workload.
WORKLOAD_OPTIONS = ("model", "tokens-per-gpu", "routing", "placement", "slots", "minibatch", "seed")
WORKLOAD_PROFILE_KEYS = ("system.num_gpus", "system.num_nodes")


def profile_key_path(name: str) -> str | None:
    """The profile key path an option name sets (``link-bandwidth`` -> ``link.bandwidth_...``), or None."""
    from megamoe.simulator.hardware import ALIASES, SCHEMA

    name = PROFILE_FLAGS.get(name, name)
    alias = name.replace("-", "_")
    if alias in ALIASES:
        return ALIASES[alias]
    path = name.replace("__", ".")
    sec, _, key = path.partition(".")
    if sec in SCHEMA and key in SCHEMA[sec]:
        return path
    return None


def _check_value(table: str, name: str, value: Any) -> Any:
    try:
        if name in OPTIONS:
            return OPTIONS[name].check(value)
        return _number(value)  # a profile field; its range is checked with the whole profile
    except ValueError as exc:
        raise SpecError(f"[{table}] {name} = {value!r}: {exc}") from None


def _flatten(table: str, d: dict) -> dict[str, Any]:
    """TOML reads ``link.payload_efficiency = 0.9`` as a nested table; give back the dotted name."""
    out = {}
    for name, v in d.items():
        if isinstance(v, dict):
            if not _is_section(name):
                raise SpecError(f"[{table}] {name}: unknown option (only a profile section may be a table)")
            for key, sub in v.items():
                if isinstance(sub, dict):
                    raise SpecError(f"[{table}] {name}.{key}: unknown option")
                out[f"{name}.{key}"] = sub
        else:
            out[name] = v
    return out


def _is_section(name: str) -> bool:
    from megamoe.simulator.hardware import SCHEMA

    return name in SCHEMA


def _known(table: str, name: str) -> None:
    if name in OPTIONS or profile_key_path(name) is not None:
        return
    from megamoe.simulator.hardware import ALIASES

    raise SpecError(f"[{table}] {name}: unknown option; options are {', '.join(OPTIONS)}, "
                    f"{', '.join(PROFILE_FLAGS)}, or a profile field ({', '.join(sorted(ALIASES))} or section.key)")


@dataclass(frozen=True)
class Point:
    """One configuration: ``options`` as written in the SPEC (fixed and grid), ``point_id`` its hash."""

    point_id: str
    options: dict

    def canonical(self) -> dict:
        return canonical(self.options)


def canonical(options: dict) -> dict:
    """Defaults filled in, profile fields under their key path: two spellings of a point agree."""
    from megamoe.simulator.schedules import normalize_schedule

    out: dict[str, Any] = {}
    for name, opt in OPTIONS.items():
        v = options.get(name, opt.default)
        if name == "schedule":
            v = normalize_schedule(v)
        if v is not None:
            out[name] = v
    for name, v in options.items():
        if name not in OPTIONS:
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            out["profile:" + profile_key_path(name)] = v
    return out


def point_id(options: dict) -> str:
    text = json.dumps(canonical(options), sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Spec:
    """A checked SPEC: ``fixed`` {option: value}, ``grid`` {option: [values]} (in SPEC order)."""

    fixed: dict
    grid: dict

    @property
    def columns(self) -> list[str]:
        return [*self.fixed, *self.grid]

    def __len__(self) -> int:
        n = 1
        for v in self.grid.values():
            n *= len(v)
        return n

    def points(self) -> list[Point]:
        names = list(self.grid)
        out = []
        for combo in itertools.product(*(self.grid[n] for n in names)):
            opts = {**self.fixed, **dict(zip(names, combo))}
            out.append(Point(point_id(opts), opts))
        return out


def parse_spec(data: dict) -> Spec:
    """Check a SPEC given as a dict ``{"fixed": {...}, "grid": {...}}``."""
    if not isinstance(data, dict):
        raise SpecError(f"a SPEC is a table with [fixed] and [grid], got {type(data).__name__}")
    if not any(data.values()):
        raise SpecError("the SPEC is empty: give a [grid] table of lists (and a [fixed] table of single values)")
    unknown = [k for k in data if k not in TABLES]
    if unknown:
        raise SpecError(f"unknown table [{unknown[0]}]; a SPEC has only {', '.join(f'[{t}]' for t in TABLES)}")
    for t in TABLES:
        if not isinstance(data.get(t, {}), dict):
            raise SpecError(f"[{t}] must be a table of options, got {data[t]!r}")
    fixed_in = _flatten("fixed", data.get("fixed", {}))
    grid_in = _flatten("grid", data.get("grid", {}))
    fixed, grid = {}, {}
    for name, v in fixed_in.items():
        _known("fixed", name)
        if isinstance(v, list):
            raise SpecError(f"[fixed] {name} = {v!r}: a list belongs in [grid]")
        fixed[name] = _check_value("fixed", name, v)
    for name, values in grid_in.items():
        _known("grid", name)
        if name in fixed:
            raise SpecError(f"[grid] {name}: also in [fixed]; give it in one table")
        if not isinstance(values, list) or not values:
            raise SpecError(f"[grid] {name} = {values!r}: must be a non-empty list")
        checked = [_check_value("grid", name, v) for v in values]
        if len({json.dumps(v) for v in checked}) != len(checked):
            raise SpecError(f"[grid] {name} = {values!r}: a value is repeated")
        grid[name] = checked
    paths: dict[str, str] = {}
    for name in [*fixed, *grid]:
        p = profile_key_path(name) if name not in OPTIONS else None
        if p and p in paths:
            raise SpecError(f"{name} and {paths[p]} set the same profile field {p}")
        if p:
            paths[p] = name
    spec = Spec(fixed, grid)
    _check_size(spec)
    _check_minibatch(spec)
    _check_profiles(spec)
    _check_sizes(spec)
    return spec


def _check_size(spec: Spec) -> None:
    """Refuse, with an estimate, a grid of more than MAX_POINTS points (before any point is made)."""
    n = len(spec)
    if n <= MAX_POINTS:
        return
    analytic = spec.fixed.get("analytic", False) is True
    hours = n / (RATE_ANALYTIC if analytic else RATE_EVENT) / 3600
    shape = " x ".join(f"{len(v)} {k}" for k, v in spec.grid.items())
    raise SpecError(f"the grid has {n:,} points ({shape}): at most {MAX_POINTS:,} in one sweep (this one would take "
                    f"about {hours:,.0f} worker-hours{' with the analytic bound' if analytic else ''}); narrow an "
                    "axis or split the grid")


def _values(spec: Spec, name: str) -> list:
    if name in spec.grid:
        return spec.grid[name]
    return [spec.fixed.get(name, OPTIONS[name].default if name in OPTIONS else None)]


def _check_minibatch(spec: Spec) -> None:
    """A minibatch changes nothing under the bulk schedule: refuse it where every point is bulk."""
    from megamoe.simulator.schedules import normalize_schedule

    mb = [v for v in _values(spec, "minibatch") if v not in (None, "auto")]
    if mb and all(normalize_schedule(s) == "bulk" for s in _values(spec, "schedule")):
        raise SpecError(f"minibatch = {mb[0]!r} has no effect under schedule = bulk (it moves every token at once); "
                        "drop it or sweep schedule = fused too")


def _check_sizes(spec: Spec) -> None:
    """Refuse a model whose weights fit no GPU of a system of the grid (with the estimate), and slots
    beyond every expert on every GPU (E x G)."""
    from megamoe.reference import MoEConfig
    from megamoe.simulator.cli import weights_problem

    slots = [v for v in _values(spec, "slots") if v is not None]
    names = ["system", *(n for n in [*spec.fixed, *spec.grid] if n not in OPTIONS)]
    dtypes = {w or d for w in _values(spec, "weight-dtype") for d in _values(spec, "dtype")}
    shared = {not v for v in _values(spec, "no-shared")}
    for model in _values(spec, "model"):
        cfg = MoEConfig.load(model)
        E = cfg.num_experts
        for combo in itertools.product(*(_values(spec, n) for n in names)):
            p = resolve_profile(dict(zip(names, combo)))
            G = p.num_gpus
            if slots and max(slots) > E * G:
                raise SpecError(f"slots = {max(slots):,}: at most {E * G:,} for {model} on {G} GPUs (every one of its "
                                f"{E} experts on every GPU)")
            for wd, sh in itertools.product(sorted(dtypes), sorted(shared)):
                if bad := weights_problem(cfg, p, wd, sh, combo[0] or OPTIONS["system"].default):
                    raise SpecError(f"model = {model!r}: {bad}")


def _check_profiles(spec: Spec) -> None:
    """Every system x profile-override combination of the grid must make a valid profile."""
    from megamoe.simulator.hardware import ProfileError

    names = ["system", *(n for n in [*spec.fixed, *spec.grid] if n not in OPTIONS)]
    for combo in itertools.product(*(_values(spec, n) for n in names)):
        opts = dict(zip(names, combo))
        try:
            resolve_profile(opts)
        except ProfileError as exc:
            shown = ", ".join(f"{k} = {v!r}" for k, v in opts.items())
            raise SpecError(f"bad profile ({shown}): {exc}") from None


def profile_overrides(options: dict) -> dict:
    """{override name: value} for ``hardware.override`` from a point's profile options."""
    return {profile_key_path(n).replace(".", "__"): v for n, v in options.items() if n not in OPTIONS}


def resolve_profile(options: dict):
    from megamoe.simulator import load_profile, override

    p = load_profile(options.get("system") or OPTIONS["system"].default)
    o = profile_overrides(options)
    return override(p, **o) if o else p


def load_spec(path: str | Path) -> Spec:
    """Read and check a SPEC TOML file."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"SPEC {str(path)!r} is not a file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise SpecError(f"SPEC {str(path)!r} is not a text file (binary or not UTF-8)") from None
    except RecursionError:
        raise SpecError(f"SPEC {str(path)!r}: tables nested too deeply to read") from None
    try:
        return parse_spec(data)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None
