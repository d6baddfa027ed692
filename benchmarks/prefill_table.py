"""Issue 10's prefill table and targets, from bench_prefill.py's rows (no GPU needed).

    python benchmarks/prefill_table.py ROWS.jsonl [ROWS2.jsonl ...] [--router ROUTER.jsonl ...]
        [--candidate NAME] [--md OUT.md]

One line per (preset, T): the floor, the ideal grouped GEMM (cuBLAS bmm over E experts of
ceil(T*K/E) rows), ours (the candidate ``--candidate``, by default "current": the layer as
moe_forward runs it) and the PyTorch pipeline (sort, torch._grouped_mm twice), in us as
bench_prefill.py measured them in one run; their ratios; and each target of issue 10 that the row
is held to, met or by how much it is missed:

- T in {4096, 16384}: ours at least 0.85 of the ideal grouped GEMM's rate;
- T = 512: ours at most 1.25 x the floor;
- every T: faster than the PyTorch pipeline;
- T >= 4096: router + align at most 3% of the layer, where a bench_router.py row of that
  (preset, T) is given (``--router``); combine is not timed there, so it is not in the share.

The ratios are the stored times' (one source of truth): ours / floor, ideal / ours (the ideal rate
over ours, bench_prefill's ``over_ideal_rate``: both rates are of the same routed FLOPs) and
PyTorch / ours. The router share is the default router's router + align over the layer, both
from one bench_router.py row (its ``layer_us`` is the multi-launch layer with the default router,
whatever other routers that row times; the default's tag by the row's vintage: ``default_*`` keys,
else the tag in ``default``, else the tiles where ``prefill_router``, else unknown).

A candidate that failed (its numerics over the tolerance, or an error) is shown as failed, not as
a time, and misses every target about ours. A figure the row lacks (no PyTorch time, no ideal, no
router row) leaves its target "not measured", counted apart. Where a (preset, T) appears in more
than one file, the last file's row is taken (list the files oldest first), for both kinds.
"""

from __future__ import annotations

import argparse
import sys

from bench_prefill import PRESETS, TOKENS
from table_rows import emit, fmt, load_keyed, md_table, missing_files, provenance

#: ours over the ideal grouped GEMM's rate, at least, at these T
IDEAL_RATE, IDEAL_T = 0.85, (4096, 16384)
#: ours over the floor, at most, at these T
FLOOR_RATIO, FLOOR_T = 1.25, (512,)
#: router + align as a share of the layer (%), at most, from this T up
ROUTER_SHARE, ROUTER_MIN_T = 3.0, 4096


def _key(r: dict) -> tuple[str, int]:
    return r["preset"], int(r["T"])


def load_rows(paths: list[str]) -> list[dict]:
    """One row per (preset, T), the later file's where they repeat; the issue's presets first, in its order."""
    keyed = load_keyed(paths, _key)
    order = {p: i for i, p in enumerate(PRESETS)}
    return [keyed[k] for k in sorted(keyed, key=lambda k: (order.get(k[0], len(order)), k[0], k[1]))]


def load_router(paths: list[str]) -> dict[tuple[str, int], dict]:
    """bench_router.py's rows by (preset, T), the later file's where they repeat."""
    return load_keyed(paths, _key)


def default_tag(r: dict) -> str | None:
    """The tag of the router that ``layer_us`` of bench_router.py's row ``r`` ran with: "default" where
    the row times it as such (run 47 on), else the tag the row names (run 46), else "tiles" where the
    row says the prefill router was the default (run 42's rows: the layer was measured with the tiles),
    else None (not known)."""
    if "default_router_align_us" in r:
        return "default"
    if isinstance(r.get("default"), str):
        return r["default"]
    if r.get("prefill_router") is True:
        return "tiles"
    return None


def router_share(r: dict | None) -> float | None:
    """Router + align of the default router as a % of the layer, from one bench_router.py row (None
    without a row, or where its default router is not known)."""
    tag = default_tag(r) if r else None
    if tag is None or r.get(f"{tag}_router_align_us") is None or not r.get("layer_us"):
        return None
    return 100.0 * r[f"{tag}_router_align_us"] / r["layer_us"]


def ours(row: dict, candidate: str) -> tuple[float | None, str | None, bool]:
    """(ours us, why there is none, whether it failed): the time where the candidate was timed and its
    numerics passed; else None, the reason, and True where it ran and failed (False where the row
    has no such candidate)."""
    c = row.get("candidates", {}).get(candidate)
    if c is None:
        return None, f"no {candidate} candidate", False
    if "error" in c:
        return None, f"{candidate} failed: {c['error'][:80]}", True
    if not c.get("ok"):
        return None, f"{candidate} failed numerics (err_max {fmt(c.get('err_max'), '{:.1e}')})", True
    if c.get("us") is None:
        return None, f"{candidate} not timed", True
    return c["us"], None, False


def _less_time(ours_us: float, target_us: float) -> str:
    """How much less time ours needs to meet a target at ``target_us``."""
    return f"ours needs {100.0 * (1.0 - target_us / ours_us):.0f}% less time"


def targets(row: dict, us: float | None, share: float | None, failed: bool = False) -> list[tuple[str, bool | None, str]]:
    """[(target, met, detail)] for the targets this row is held to (the module docstring's list):
    met None where a figure is not measured; ``failed`` (ours failed) misses each target about ours."""
    T, floor, ideal, torch_us = int(row["T"]), row.get("floor_us"), row.get("ideal_us"), row.get("torch_us")
    out = []

    def about_ours(name: str, ref: float | None, judge):
        if failed:
            out.append((name, False, "ours failed"))
        elif us is None or ref is None:
            out.append((name, None, "not measured"))
        else:
            out.append((name, *judge(ref)))

    if T in IDEAL_T:
        about_ours(f"ideal rate >= {IDEAL_RATE}", ideal, lambda i: (
            i / us >= IDEAL_RATE, f"{i / us:.2f}" + ("" if i / us >= IDEAL_RATE else f"; {_less_time(us, i / IDEAL_RATE)}")))
    if T in FLOOR_T:
        about_ours(f"<= {FLOOR_RATIO} x floor", floor, lambda f: (
            us <= FLOOR_RATIO * f, f"{us / f:.2f}x" + ("" if us <= FLOOR_RATIO * f else f"; {_less_time(us, FLOOR_RATIO * f)}")))
    about_ours("faster than PyTorch", torch_us, lambda t: (
        us < t, f"{t / us:.2f}x" + ("" if us < t else f"; {_less_time(us, t)}")))
    if T >= ROUTER_MIN_T:
        if share is None:
            out.append((f"router + align <= {ROUTER_SHARE:g}%", None, "not measured"))
        else:
            ok = share <= ROUTER_SHARE
            out.append((f"router + align <= {ROUTER_SHARE:g}%", ok,
                        f"{share:.1f}%" + ("" if ok else f"; {share - ROUTER_SHARE:.1f} points over")))
    return out


def _cell(name: str, met: bool | None, detail: str) -> str:
    word = "not measured" if met is None else ("yes" if met else "no")
    return f"{name}: {word}" + ("" if met is None or not detail else f" ({detail})")


def table(rows: list[dict], router: dict | None = None, candidate: str = "current") -> str:
    """The markdown table, the count of the targets met and where the rows were measured."""
    router = router or {}
    head = ["preset", "T", "floor us", "ideal us", "ours us", "PyTorch us", "ours / floor", "ours / ideal rate",
            "x PyTorch", "router + align", "targets (met: yes / no)"]
    body, met, held, unmeasured, used_router = [], 0, 0, 0, []
    for r in rows:
        us, why, failed = ours(r, candidate)
        rr = router.get(_key(r))
        share = router_share(rr)
        if share is not None:
            used_router.append(rr)
        ts = targets(r, us, share, failed=failed)
        met += sum(m is True for _, m, _ in ts)
        held += sum(m is not None for _, m, _ in ts)
        unmeasured += sum(m is None for _, m, _ in ts)
        tcell = "; ".join(_cell(*t) for t in ts) or "-"
        if why:
            tcell = f"{why}; {tcell}"
        floor, ideal, torch_us = r.get("floor_us"), r.get("ideal_us"), r.get("torch_us")
        body.append([r["preset"], str(r["T"]), fmt(floor), fmt(ideal), "failed" if failed else fmt(us),
                     fmt(torch_us), fmt(us / floor if us and floor else None, "{:.2f}"),
                     fmt(ideal / us if us and ideal else None, "{:.2f}"),
                     fmt(torch_us / us if us and torch_us else None, "{:.2f}"),
                     fmt(share, "{:.1f}%"), tcell])
    have = {_key(r) for r in rows}
    missing = [f"{p} T = {T}" for p in PRESETS for T in TOKENS if (p, T) not in have]
    more = f"; {unmeasured} more not measured" if unmeasured else ""
    text = (md_table(head, body) + f"\n\nTargets met: {met} of {held} (ours: the {candidate} candidate{more}). "
            f"Measured on: {provenance(rows)}.\n")
    if used_router:
        text += f"Router + align (no combine) measured on: {provenance(used_router)}.\n"
    if missing:
        text += f"\nNot measured: {', '.join(missing)}.\n"
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+", help="bench_prefill.py's prefill.jsonl files, oldest first")
    p.add_argument("--router", nargs="+", default=[], help="bench_router.py's router.jsonl files, oldest first")
    p.add_argument("--candidate", default="current", help="the candidate shown as ours (default: current)")
    p.add_argument("--md", help="also write the table to this file")
    a = p.parse_args(argv)
    missing = missing_files(a.rows + a.router)
    if missing:
        p.error(f"no such rows file: {', '.join(missing)}")
    emit(table(load_rows(a.rows), load_router(a.router), a.candidate), a.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
