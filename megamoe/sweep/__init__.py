"""Design-space sweeps of the simulator on Dask, into Parquet, resumable.

    from megamoe.sweep import run_sweep, load_results, best
    df = run_sweep({"fixed": {"model": "deepseek-v3", "analytic": True},
                    "grid": {"tokens-per-gpu": [128, 4096], "placement": ["contiguous", "eplb"]}},
                   out="sweep-out", workers=2)           # a pandas DataFrame, one row per point
    best("sweep-out", objective="exposed_comm_us", top=5)

The modules: docs/sweep.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

from .cli import add_arguments as add_arguments  # the hooks megamoe.cli calls
from .cli import run as run
from .spec import OPTIONS, Spec, SpecError, load_spec, parse_spec

#: What a sweep needs beyond the simulator: module -> the pip requirement that provides it.
DEPENDENCIES = {"dask": "dask[distributed]", "distributed": "dask[distributed]", "pyarrow": "pyarrow",
                "pandas": "pandas", "matplotlib": "matplotlib"}
OBJECTIVES = ("layer_time_us", "exposed_comm_us")
LOCK = ".lock"  # in an output folder while a sweep writes it: the holder's pid


class SweepError(ValueError):
    """A sweep cannot start: bad output folder, missing dependency, no results; the message says which."""


def check_dependencies(names=tuple(DEPENDENCIES)) -> None:
    for name in names:
        if importlib.util.find_spec(name) is None:
            raise SweepError(f"missing dependency {name!r}: pip install '{DEPENDENCIES[name]}'")


def check_workers(workers: int | None, scheduler: str | None = None) -> None:
    """Refuse a LocalCluster of fewer than 0 or more workers than this machine has cores."""
    import os

    if workers is None:
        return
    cores = os.cpu_count() or 1
    if workers < 0:
        raise SweepError(f"--workers {workers}: must be >= 0 (0 runs the points in this process)")
    if workers > cores and not scheduler:
        raise SweepError(f"--workers {workers}: this machine has {cores} cores; give at most {cores} "
                         "(or --scheduler ADDRESS for a bigger cluster)")


@contextlib.contextmanager
def lock(out: Path):
    """Hold ``out/.lock`` (this pid) while a sweep writes ``out``: a live holder's lock refuses, a dead one's
    is taken over."""
    import os

    path = out / LOCK
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            try:
                pid = int(path.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and _alive(pid):
                raise SweepError(f"{str(out)!r} is being written by another megamoe sweep (pid {pid}); wait for it "
                                 f"or give another --out (if pid {pid} is not a sweep, delete {path})") from None
            path.unlink(missing_ok=True)  # its holder is gone
    else:
        raise SweepError(f"cannot take the lock {path}; delete it if no sweep is writing {str(out)!r}")
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        yield
    finally:
        path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_out(out: str | Path) -> Path:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SweepError(f"--out {str(out)!r} is a file; give a folder (results.parquet goes inside)")
    return out


def as_spec(spec: Spec | dict | str | Path) -> Spec:
    if isinstance(spec, Spec):
        return spec
    if isinstance(spec, dict):
        return parse_spec(spec)
    return load_spec(spec)


def run_sweep(spec: Spec | dict | str | Path, out: str | Path = "sweep-out", *, workers: int | None = None,
              scheduler: str | None = None, retry_failed: bool = False, progress: bool = True,
              plot: bool = True):
    """Run the points of ``spec`` not yet in ``out`` and return this spec's rows as a DataFrame.

    ``workers``: LocalCluster processes (default the CPU count; 0: in this process);
    ``scheduler``: an existing Dask scheduler's address. ``out`` is locked while the sweep writes it."""
    import os

    from .progress import Progress
    from .runner import execute

    spec = as_spec(spec)
    check_dependencies(tuple(n for n in DEPENDENCIES if plot or n != "matplotlib"))
    out = check_out(out)
    check_workers(workers, scheduler)
    workers = (os.cpu_count() or 1) if workers is None else int(workers)
    out.mkdir(parents=True, exist_ok=True)
    bar = Progress(len(spec), enabled=progress)
    with lock(out):
        counts = execute(spec, out, workers=workers, scheduler=scheduler, retry_failed=retry_failed, progress=bar)
    df = rows_of(spec, load_results(out))
    df.attrs["counts"] = counts
    if plot and not df.empty:
        from .plot import plot as draw

        draw(df, spec, out / "sweep.png")
    return df


def load_results(out: str | Path):
    """Every row in ``out`` (results.parquet and any parts an interrupted run left) as a DataFrame."""
    from .store import Store

    return Store(out).read()


def rows_of(spec: Spec, df):
    """The rows of ``df`` that are points of ``spec``, in grid order."""
    if df.empty:
        return df
    order = {p.point_id: i for i, p in enumerate(spec.points())}
    sel = df[df["point_id"].isin(order)].copy()
    sel["_order"] = sel["point_id"].map(order)
    return sel.sort_values("_order").drop(columns="_order").reset_index(drop=True)


def best(results, objective: str = "layer_time_us", top: int = 10, within: str | None = "tokens-per-gpu"):
    """The ``top`` points with the smallest ``objective`` (failed points left out), as a DataFrame.

    ``results``: a DataFrame or an output folder. Where ``within`` (default tokens-per-gpu) takes
    several values, the ``top`` of each value; ``attrs["ranked_within"]`` names it (else None)."""
    import pandas as pd

    df = results if hasattr(results, "columns") else load_results(results)
    if df.empty:
        raise SweepError("no results to rank")
    if objective not in df.columns:
        raise SweepError(f"--objective {objective!r} is not a column; try {', '.join(OBJECTIVES)}")
    if not pd.api.types.is_numeric_dtype(df[objective]) or pd.api.types.is_bool_dtype(df[objective]):
        numeric = [c for c in df.columns if pd.api.types.is_float_dtype(df[c])]
        raise SweepError(f"--objective {objective!r} is not a numeric column; give one of {', '.join(numeric)}")
    ok = df[df["error"].isna()] if "error" in df else df
    group = within if within in ok and ok[within].nunique() > 1 else None
    if group:
        top_df = ok.sort_values([group, objective], kind="stable").groupby(group, sort=False).head(top)
    else:
        top_df = ok.sort_values(objective, kind="stable").head(top)
    top_df = top_df.reset_index(drop=True)
    top_df.attrs.update(ranked_within=group, top=top)
    return top_df


def with_defaults(df):
    """``df`` with the options a row left out (NaN) shown as the default they took."""
    fill = {c: OPTIONS[c].default for c in input_columns(df) if c in OPTIONS and OPTIONS[c].default is not None}
    return df.astype({c: object for c in fill}).fillna(fill) if fill else df


def varied_columns(df) -> list[str]:
    """The input columns whose value differs between rows of ``df`` (a left-out option as its default)."""
    df = with_defaults(df)
    return [c for c in input_columns(df) if df[c].astype(str).nunique(dropna=False) > 1]


def input_columns(df) -> list[str]:
    """The columns of ``df`` that are SPEC options (inputs), in order."""
    from .spec import profile_key_path
    from .worker import OUTPUTS

    return [c for c in df.columns if c != "point_id" and c not in OUTPUTS
            and (c in OPTIONS or profile_key_path(c) is not None)]


__all__ = ["OBJECTIVES", "OPTIONS", "Spec", "SpecError", "SweepError", "best", "check_dependencies", "check_out",
           "check_workers", "load_results", "load_spec", "parse_spec", "run_sweep"]
