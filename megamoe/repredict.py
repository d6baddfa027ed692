"""Predict the stored rows of a validation run again, offline, with another profile.

    megamoe validate --report DIR --repredict PROFILE [--out DIR2] [--switch NAME=on|off ...]

Rows with ``counts`` are predicted again and the report is written under a note that these are
re-predictions, not predictions made before the measurements; rows without counts are counted.
``--switch`` / ``--variant`` set fields of ``simulator.cost.CostOptions`` by name.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

_VALUES = {"on": True, "1": True, "true": True, "off": False, "0": False, "false": False}


def option_names() -> list[str]:
    """The names ``--switch`` / ``--variant`` take: the boolean fields of ``CostOptions``."""
    from megamoe.simulator.cost import CostOptions

    return sorted(f.name for f in dataclasses.fields(CostOptions))


def parse_switches(specs) -> dict[str, bool]:
    """{name: bool} from "NAME=on|off" strings (also 1/0, true/false); a name that is not a field of
    ``CostOptions`` or a bad value is a ValueError naming the choices."""
    known = option_names()
    out = {}
    for spec in specs or ():
        name, sep, val = str(spec).partition("=")
        name = name.strip()
        if not known:
            raise ValueError(f"unknown cost option {name!r}: no cost-model options are under study")
        if name not in known:
            raise ValueError(f"unknown cost option {name!r}; the options: {', '.join(known)}")
        if not sep or val.strip().lower() not in _VALUES:
            raise ValueError(f"--switch {spec!r}: expected {name}=on or {name}=off")
        out[name] = _VALUES[val.strip().lower()]
    return out


def variant_label(settings: dict[str, bool]) -> str:
    """A variant's name in a row's predictions: its options, lower case, joined by "+", an off option
    prefixed "no-" (a=on, b=off -> "a+no-b")."""
    return "+".join(("" if v else "no-") + k.lower() for k, v in settings.items())


def parse_variants(specs) -> dict[str, dict[str, bool]]:
    """{label: settings} from --variant strings, each "A=on[,B=off...]" (parse_switches per part); an
    empty one or two that name the same settings are a ValueError."""
    out: dict[str, dict[str, bool]] = {}
    for spec in specs or ():
        settings = parse_switches(p for p in str(spec).split(",") if p.strip())
        if not settings:
            raise ValueError(f"--variant {spec!r}: expected NAME=on|off[,OTHER=on|off...]")
        label = variant_label(settings)
        if label in out:
            raise ValueError(f"--variant {spec!r} repeats the variant {label!r}")
        out[label] = settings
    return out


def switch_note(settings: dict[str, bool], what: str) -> tuple[str, ...]:
    """The report note naming the options ``settings`` set for ``what`` (none: no note)."""
    if not settings:
        return ()
    return (f"cost options set for {what}: " + ", ".join(f"{k}={'on' if v else 'off'}" for k, v in settings.items()),)


@contextmanager
def switches(settings: dict[str, bool]):
    """The ``CostOptions`` of ``settings`` (parse_switches) for the block, yielded: a field added to
    CostOptions is passed from here to the prediction functions that read it (none while it has no field)."""
    from megamoe.simulator.cost import CostOptions

    yield CostOptions(**settings)


def repredict_rows(rows: list[dict], profile) -> tuple[list[dict], int]:
    """(rows predicted again with ``profile``, rows left out for lack of counts); a megakernel row
    that stored its ``megakernel_config`` is priced with it."""
    from megamoe.predict import predict_config
    from megamoe.reference import MoEConfig

    out, skipped = [], 0
    for r in rows:
        if "counts" not in r:
            skipped += 1
            continue
        cfg = MoEConfig.preset(r["preset"])  # the whole layer, as the GPU run's CudaLayer.config
        pr = predict_config(cfg, r["counts"], int(r["T"]), r["backend"], profile, device_name=r.get("gpu", "NVIDIA H200"),
                            calls_per_graph=int(r.get("calls_per_graph", 1)), triton_version=r.get("triton"),
                            reps=r.get("reps"), mk=r.get("megakernel_config"))
        row = {k: v for k, v in r.items() if k not in ("predictions", "busy_us", "tasks", "programs")}
        row.update(pr, profile=profile.name, predictions={profile.name: {k: pr[k] for k in
                                                                         ("predicted_us", "predicted_fixed_us", "dominant")}})
        out.append(row)
    return out, skipped
