"""``megamoe configure``: the cost model's launch-config tables, written as data for the kernels.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width.

For a profile (a shipped name or a calibrated profile JSON) and presets, ``megamoe.choose`` picks
each (preset, T bucket)'s GEMM entry and backend; the table goes to
``kernels/configs/model/<profile>__<dtype>.json`` in the tuned files' schema (``configs``,
``backend``) with ``predicted_us`` and a ``source`` block (profile, command, date, commit, number of
candidates). The kernels read it at run time for the devices ``kernels/configs/model/families.json``
maps to that profile (``kernels.configs.select_config``: tuned, then model, then heuristic).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

#: the presets the tables cover by default: ``megamoe bench``'s
TABLE_PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b")
REPO = Path(__file__).resolve().parents[1]


class ConfigureError(ValueError):
    """A bad ``megamoe configure`` input (profile, preset, output folder); the message names it."""


def family_name(profile) -> str:
    """The table's profile name: the profile's name without a "-calibrated" suffix (a calibrated
    H100 profile configures the h100 family)."""
    name = profile.name
    return name[: -len("-calibrated")] if name.endswith("-calibrated") else name


def _commit() -> str:
    """The short commit the tables are written from (kernels.provenance.git_state's)."""
    from megamoe.kernels.provenance import git_state

    commit = git_state()["commit"]
    return commit if commit == "unknown" else commit[:7]


def profile_spec(spec: str) -> str:
    """``spec`` as the table's source records it: a shipped name as is, a file relative to the repository."""
    p = Path(spec)
    if p.exists() and p.is_file():
        try:
            return str(p.resolve().relative_to(REPO))
        except ValueError:
            return str(p.resolve())
    return spec


def load(spec: str):
    """The profile ``spec`` names, a shipped name or a file (also relative to the repository); a
    ConfigureError naming it and the shipped profiles if bad."""
    from megamoe.simulator.hardware import ProfileError, available_profiles, load_profile

    if spec not in available_profiles() and not Path(spec).exists() and (REPO / spec).is_file():
        spec = str(REPO / spec)
    try:
        return load_profile(spec)
    except ProfileError as exc:
        raise ConfigureError(f"--profile: {exc}") from None


def check_presets(names) -> list[str]:
    """The preset names, each known (a ConfigureError naming the unknown ones and the presets)."""
    from megamoe.reference import PRESETS

    names = [n.strip() for n in names if n.strip()]
    bad = [n for n in names if n not in PRESETS]
    if bad or not names:
        raise ConfigureError(f"unknown preset(s) {bad or names}; presets: {', '.join(PRESETS)}")
    return names


def build_table(profile_spec_: str, presets, *, dtype: str = "bfloat16", log=None, command: str = "") -> dict:
    """The model table of ``presets`` x T_BUCKETS on the profile ``profile_spec_`` (a dict ready to write)."""
    from megamoe.kernels import configs as cfgs
    from megamoe.reference import MoEConfig

    from .choose import choose

    prof = load(profile_spec_)
    configs, backend, predicted, n_cands = {}, {}, {}, 0
    for name in check_presets(presets):
        cfg = MoEConfig.preset(name)
        key = cfgs.shape_key(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k)
        for T in cfgs.T_BUCKETS:
            c = choose(cfg, T, prof, dtype=dtype)
            n_cands += len(c.ranking)
            configs.setdefault(key, {})[str(T)] = c.entry
            backend.setdefault(key, {})[str(T)] = c.backend
            predicted.setdefault(key, {})[str(T)] = {"multi": round(c.predicted_us, 2),
                                                    "megakernel": round(c.megakernel_us, 2),
                                                    "gemms": round(c.gemm_us, 2),
                                                    "price": {k: round(v, 2) for k, v in c.price.items()}}
            if log:
                log(f"{name} T={T}: {c.backend} (uniform routing: multi {c.predicted_us:.1f} us, megakernel "
                    f"{c.megakernel_us:.1f}; price over both routings: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in c.price.items()) + f"; {len(c.ranking)} entries priced)")
    source = {"profile": profile_spec(profile_spec_), "profile_name": prof.name, "presets": list(presets),
              "command": command or f"megamoe configure --profile {profile_spec(profile_spec_)} "
                                    f"--presets {','.join(presets)}",
              "date": dt.date.today().isoformat(), "commit": _commit(),
              "chosen_by": f"the cost model over {n_cands} candidate entries (megamoe.choose: kernels.configs."
                           "candidates priced in the launch plan, the megakernel through its task plan, each at "
                           "its predicted us summed over the uniform and the concentrated routing)"}
    return {"gpu": family_name(prof), "dtype": dtype, "triton": "any", "configs": configs, "backend": backend,
            "predicted_us": predicted, "source": source}


def out_folder(out_dir: Path | str | None) -> Path:
    """The folder a table goes to (default kernels/configs/model), made if missing (ConfigureError
    naming it if it is a file or cannot be made)."""
    from megamoe.kernels import configs as cfgs

    out_dir = Path(out_dir) if out_dir else cfgs.MODEL_DIR
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigureError(f"--out {str(out_dir)!r} is a file; want a folder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigureError(f"--out {str(out_dir)!r}: cannot make the folder: {exc}") from None
    return out_dir


def write_table(table: dict, out_dir: Path | None = None) -> Path:
    """Write ``table`` to OUT_DIR/<profile>__<dtype>.json (default kernels/configs/model), merged
    with the shapes already there; checked by the kernels' loader before it replaces the file."""
    from megamoe.kernels import configs as cfgs

    out_dir = out_folder(out_dir)
    path = out_dir / cfgs.model_path(table["gpu"], table["dtype"]).name
    if path.exists():
        old = json.loads(path.read_text())
        for k in ("configs", "backend", "predicted_us"):
            table[k] = {**old.get(k, {}), **table[k]}
        table["source"]["presets"] = sorted(set(old.get("source", {}).get("presets", [])) | set(table["source"]["presets"]))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    cfgs.load_file(tmp, model=True)  # fail loudly before replacing a good table
    tmp.replace(path)
    cfgs._model.cache_clear()
    cfgs._model_backends.cache_clear()
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="h100", help="shipped profile name or calibrated profile JSON (default h100)")
    p.add_argument("--presets", default=",".join(TABLE_PRESETS), help="comma-separated presets (default: "
                   f"{','.join(TABLE_PRESETS)})")
    p.add_argument("--all-presets", action="store_true", help="every preset megamoe knows")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16",), help="the activations' dtype")
    p.add_argument("--out", default=None, help="output folder (default kernels/configs/model)")
    p.add_argument("--show", metavar="GPU", default=None, help="write nothing: print where each preset and bucket's "
                   "config and backend come from on device GPU (as torch names it, e.g. 'NVIDIA H100 80GB HBM3')")


def show(gpu: str, presets, *, dtype: str = "bfloat16", triton_version: str | None = None, log=print) -> None:
    """Print, per preset and T bucket, the config and backend the kernels take on ``gpu`` and where
    each comes from (tuned, model, heuristic)."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.plan import _triton_version
    from megamoe.reference import MoEConfig

    tv = triton_version or _triton_version()
    log(f"{gpu} (Triton {tv}): model table {cfgs.family_of(gpu) or 'none'}")
    for name in check_presets(presets):
        cfg = MoEConfig.preset(name)
        shape = (cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k)
        for T in cfgs.T_BUCKETS:
            kw = dict(gpu=gpu, dtype=dtype, triton_version=tv)
            g1 = cfgs.select_config(*shape, T, **kw)["gemm1"]
            log(f"  {name:<16} T={T:<6} config {cfgs.config_source(*shape, T, **kw):<9} (BLOCK_M {g1['BLOCK_M']}, "
                f"{g1['variant']})  backend {cfgs.select_backend(*shape, T, **kw):<10} "
                f"({cfgs.backend_source(*shape, T, **kw)})")


def run(args: argparse.Namespace) -> int:
    from megamoe.reference import PRESETS

    presets = list(PRESETS) if args.all_presets else args.presets.split(",")
    if args.show:
        try:
            show(args.show, presets, dtype=args.dtype)
        except ConfigureError as exc:
            print(f"megamoe configure: error: {exc}", file=sys.stderr)
            return 2
        return 0
    flags = f"--profile {profile_spec(args.profile)} " + ("--all-presets" if args.all_presets
                                                          else f"--presets {','.join(presets)}")
    try:
        out_folder(args.out)
        table = build_table(args.profile, presets, dtype=args.dtype, log=print, command=f"megamoe configure {flags}")
        path = write_table(table, args.out)
    except ConfigureError as exc:
        print(f"megamoe configure: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({table['source']['chosen_by'].split(' (')[0]})")
    return 0
