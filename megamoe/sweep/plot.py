"""The trade-off plot beside ``results.parquet``: per grid axis the best, median and worst layer time
at each value; last, each point's busiest-GPU compute against its exposed communication."""

from __future__ import annotations

import textwrap
from pathlib import Path

MAX_AXES = 8


def plot(df, spec, path: str | Path, objective: str = "layer_time_us") -> Path | None:
    """Write the figure to ``path``; None when nothing succeeded or nothing varies."""
    import numpy as np
    from matplotlib.figure import Figure  # no pyplot: the caller's backend (a notebook's) stays as it is

    ok = df[df["error"].isna()] if "error" in df else df
    axes = [a for a, v in spec.grid.items() if len(v) > 1 and a in ok][:MAX_AXES]
    if ok.empty or not axes:
        return None
    n = len(axes) + 1
    cols = min(3, n)
    rows = -(-n // cols)
    fig = Figure(figsize=(4.6 * cols, 3.6 * rows), layout="constrained")
    grid = fig.subplots(rows, cols, squeeze=False)
    flat = grid.ravel()
    label = objective.removesuffix("_us").replace("_", " ") + (" (us)" if objective.endswith("_us") else "")
    for ax, name in zip(flat, axes):
        values = [v for v in spec.grid[name] if (ok[name] == v).any()]
        by = [ok.loc[ok[name] == v, objective].to_numpy() for v in values]
        x = np.arange(len(values))
        lo, med, hi = (np.array([f(b) for b in by]) for f in (np.min, np.median, np.max))
        ax.vlines(x, lo, hi, color="0.75", lw=6, label="range over other axes")
        ax.plot(x, med, "o", color="C0", label="median")
        ax.plot(x, lo, "v", color="C2", label="best")
        ax.set_xticks(x, [str(v) for v in values], rotation=30 if len(values) > 4 else 0)
        ax.set_xlabel(name)
        ax.set_ylabel(label)
        if hi.max() > 10 * max(lo.min(), 1e-9):
            ax.set_yscale("log")
        ax.grid(True, axis="y", alpha=0.3)
    flat[0].legend(fontsize=7)
    ax = flat[len(axes)]
    comp = ok["expert_compute_us"] + ok["load_imbalance_wait_us"]
    sc = ax.scatter(comp, ok["exposed_comm_us"], c=ok[objective], s=10, cmap="viridis")
    top = float(max(comp.max(), ok["exposed_comm_us"].max(), 1e-9))
    ax.plot([0, top], [0, top], color="0.6", lw=0.8, ls="--")
    ax.set_xlabel("busiest GPU compute (us)")
    ax.set_ylabel("exposed communication (us)")
    fig.colorbar(sc, ax=ax, label=label)
    for extra in flat[n:]:
        extra.set_visible(False)
    from .spec import OPTIONS

    named = {"model": OPTIONS["model"].default, "system": OPTIONS["system"].default, **spec.fixed}
    fixed = ", ".join(f"{k}={v}" for k, v in named.items() if k not in spec.grid)
    failed = len(df) - len(ok)
    title = f"Sweep of {len(ok)} points" + (f" ({failed} failed)" if failed else "") + (f": {fixed}" if fixed else "")
    fig.suptitle("\n".join(textwrap.wrap(title, 40 * cols)), fontsize=10)
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
