"""Predict the stored rows of a validation run again, offline, with another profile.

    megamoe validate --report DIR --repredict PROFILE [--out DIR2] [--switch USE_NAME=on|off ...]

Rows written since run K carry ``counts`` (pairs per expert of the routing that ran), which is all
the launch and task plans need (``scale.predict_config`` takes them): each measured configuration
is predicted again with PROFILE (a profile name or a calibrated profile.json) and the report is
written as for a GPU run, under a note that says these are re-predictions of stored measurements, not predictions made before them.
A cost-model change tried this way still needs a fresh GPU run (predict, then measure) before its
figures are quoted. Rows without counts are left out and counted.
``--switch`` sets a cost-model switch (``simulator/cost.py``'s ``USE_*``) for the re-prediction only
(``switches``): how a switch still off is tried on stored rows before a GPU run holds it out.
"""

from __future__ import annotations

from contextlib import contextmanager


def parse_switches(specs) -> dict[str, bool]:
    """{"USE_NAME": bool} from "USE_NAME=on|off" strings (also 1/0, true/false); an unknown name
    (not a ``USE_*`` switch of simulator/cost.py) or value is a ValueError naming the choices."""
    from megamoe.simulator import cost

    known = sorted(k for k in vars(cost) if k.startswith("USE_") and isinstance(getattr(cost, k), bool))
    values = {"on": True, "1": True, "true": True, "off": False, "0": False, "false": False}
    out = {}
    for spec in specs or ():
        name, sep, val = str(spec).partition("=")
        name = name.strip()
        if name not in known:
            raise ValueError(f"unknown cost switch {name!r}; the switches: {', '.join(known)}")
        if not sep or val.strip().lower() not in values:
            raise ValueError(f"--switch {spec!r}: expected {name}=on or {name}=off")
        out[name] = values[val.strip().lower()]
    return out


def variant_label(settings: dict[str, bool]) -> str:
    """A variant's name in a row's predictions: its switches without the USE_ prefix, lower case,
    joined by "+", an off switch prefixed "no-" (USE_L2_READ_DEPTH=on, USE_SUSTAINED_CLOCKS=off ->
    "l2_read_depth+no-sustained_clocks")."""
    return "+".join(("" if v else "no-") + k.removeprefix("USE_").lower() for k, v in settings.items())


def parse_variants(specs) -> dict[str, dict[str, bool]]:
    """{label: settings} from --variant strings, each "USE_A=on[,USE_B=off...]" (parse_switches per
    part); an empty one or two that name the same settings are a ValueError."""
    out: dict[str, dict[str, bool]] = {}
    for spec in specs or ():
        settings = parse_switches(p for p in str(spec).split(",") if p.strip())
        if not settings:
            raise ValueError(f"--variant {spec!r}: expected USE_NAME=on|off[,USE_OTHER=on|off...]")
        label = variant_label(settings)
        if label in out:
            raise ValueError(f"--variant {spec!r} repeats the variant {label!r}")
        out[label] = settings
    return out


def switch_note(settings: dict[str, bool], what: str) -> tuple[str, ...]:
    """The report note naming the switches ``settings`` set for ``what`` (none: no note)."""
    if not settings:
        return ()
    return (f"cost switches set for {what}: " + ", ".join(f"{k}={'on' if v else 'off'}" for k, v in settings.items()),)


@contextmanager
def switches(settings: dict[str, bool]):
    """Set simulator/cost.py's switches to ``settings`` (parse_switches) inside the block, restore after."""
    from megamoe.simulator import cost

    old = {k: getattr(cost, k) for k in settings}
    try:
        for k, v in settings.items():
            setattr(cost, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(cost, k, v)


def repredict_rows(rows: list[dict], profile) -> tuple[list[dict], int]:
    """(rows predicted again with ``profile`` (predicted_us, stages, dominant replaced), rows left
    out for lack of counts). A megakernel row that stored the config it ran (``megakernel_config``,
    rows since run BJ's commit) is priced with it, not with the config the code would pick now (run BH
    changed T = 512's router; older rows are priced with today's config)."""
    from megamoe.reference import MoEConfig
    from megamoe.scale import predict_config

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
