"""``megamoe validate --report DIR --repredict PROFILE``: a validation run's stored rows predicted again
with another profile, each with the configs it ran (``ran_gemms``, ``multi_configs``); ``--switch`` /
``--variant`` set fields of ``simulator.cost.CostOptions`` by name."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

_VALUES = {"on": True, "1": True, "true": True, "off": False, "0": False, "false": False}


def option_names() -> list[str]:
    """The names ``--switch`` / ``--variant`` take: the boolean fields of ``CostOptions``."""
    from megamoe.simulator.cost import CostOptions

    return sorted(f.name for f in dataclasses.fields(CostOptions))


def parse_switches(specs) -> dict[str, bool]:
    """{name: bool} from "NAME=on|off" strings (also 1/0, true/false); ValueError names the choices."""
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
    """A variant's name in a row's predictions: {a: on, b: off} -> "a+no-b"."""
    return "+".join(("" if v else "no-") + k.lower() for k, v in settings.items())


def parse_variants(specs) -> dict[str, dict[str, bool]]:
    """{label: settings} from --variant strings "A=on[,B=off...]"; an empty or repeated one is a ValueError."""
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
    """The ``CostOptions`` of ``settings`` (parse_switches), yielded for the block."""
    from megamoe.simulator.cost import CostOptions

    yield CostOptions(**settings)


def _config_kw(gpu: str, triton_version: str | None) -> dict:
    """``configs``' keywords for a row run on ``gpu`` with Triton ``triton_version`` (None: this one),
    in the dtype the validation layer runs there (float32 under the interpreter, else bfloat16)."""
    from megamoe.kernels.plan import _triton_version

    interpret = gpu == "cpu-interpreter"
    return dict(gpu=gpu, dtype="float32" if interpret else "bfloat16", triton_version=triton_version or _triton_version(),
                interpret=interpret)


def multi_configs(cfg, T: int, *, gpu: str, triton_version: str | None) -> dict:
    """The row fields of the GEMM entries ``moe_forward``'s multi-launch path runs for layer ``cfg``
    at T on ``gpu``: ``gemm_config`` (``configs.select_config``), ``config_source`` and, with shared
    experts, ``shared_gemm_config``."""
    from megamoe.kernels import configs

    kw = _config_kw(gpu, triton_version)
    E, H, I, K = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    out = {"gemm_config": configs.select_config(E, H, I, K, T, **kw), "config_source": configs.config_source(E, H, I, K, T, **kw)}
    if cfg.num_shared_experts:
        out["shared_gemm_config"] = configs.select_config(1, H, cfg.shared_intermediate_size, 1, T, **kw)
    return out


def ran_gemms(row: dict, cfg) -> dict:
    """predict_config's ``gemm`` and ``shared_gemm`` for a stored multi-launch row: the entries it
    recorded (``multi_configs``), else ``configs.config_without_model``'s of its GPU, dtype and
    Triton (a row that records none predates the model tables); {} for the megakernel."""
    if row.get("backend") != "multi":
        return {}
    from megamoe.kernels import configs

    kw = _config_kw(row.get("gpu", "NVIDIA H200"), row.get("triton"))  # predict_config's defaults
    kw["made"] = row.get("date")  # the tuned table as it was when the row was measured
    H, T = cfg.hidden_size, int(row["T"])
    gemm = row.get("gemm_config") or configs.config_without_model(cfg.num_experts, H, cfg.intermediate_size,
                                                                  cfg.top_k, T, **kw)
    shared = None
    if cfg.num_shared_experts:
        shared = row.get("shared_gemm_config") or configs.config_without_model(1, H, cfg.shared_intermediate_size,
                                                                               1, T, **kw)
    return {"gemm": gemm, "shared_gemm": shared}


def repredict_rows(rows: list[dict], profile) -> tuple[list[dict], int]:
    """(rows predicted again with ``profile``, rows left out for lack of counts), each with the
    configs it ran: a megakernel row's stored ``megakernel_config``, a multi row's GEMM entries
    (``ran_gemms``)."""
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
                            reps=r.get("reps"), mk=r.get("megakernel_config"), **ran_gemms(r, cfg))
        row = {k: v for k, v in r.items() if k not in ("predictions", "busy_us", "tasks", "programs")}
        row.update(pr, profile=profile.name, predictions={profile.name: {k: pr[k] for k in
                                                                         ("predicted_us", "predicted_fixed_us", "dominant")}})
        out.append(row)
    return out, skipped
