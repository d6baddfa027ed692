"""What the scripts that turn stored benchmark rows into a markdown table share (no GPU needed).

megakernel_table.py and prefill_table.py read JSONL files of rows, listed oldest first, keep one
row per key (the later file's, so a re-run replaces what it measured again and leaves the rest),
write the rows as a markdown table and end with where they were measured. Those steps are here,
once, so each table script holds only its own columns and targets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path


def load_keyed(paths: Iterable[str], key: Callable[[dict], Hashable],
               keep: Callable[[dict], bool] | None = None) -> dict:
    """{key(row): row} over the JSONL files in the order given: where a key repeats, the later row
    (the later file's, or the later line's in one file). Blank lines are skipped; rows ``keep``
    refuses are left out before they can replace another."""
    import json

    keyed = {}
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if keep is None or keep(r):
                keyed[key(r)] = r
    return keyed


def fmt(v, spec: str = "{:,.1f}") -> str:
    """``v`` formatted with ``spec`` (a str.format pattern), or "-" where there is no figure (None, NaN)."""
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)


def md_table(header: list[str], body: Iterable[list[str]]) -> str:
    """A markdown table: the header, its rule, a line per row of cells (no trailing newline)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def provenance(rows: Iterable[dict]) -> str:
    """Where the rows were measured: each distinct (GPU, torch, Triton, commit, date), sorted, as
    "GPU, torch T, Triton V, commit C, DATE" joined by "; " (commit to 7 characters, date to the day)."""
    prov = {(r.get("gpu"), r.get("torch"), r.get("triton"), (r.get("commit") or "")[:7], (r.get("date") or "")[:10])
            for r in rows}
    return "; ".join(f"{g}, torch {t}, Triton {tr}, commit {c}, {d}"
                     for g, t, tr, c, d in sorted(prov, key=lambda k: tuple("" if v is None else str(v) for v in k)))


def missing_files(paths: Iterable[str]) -> list[str]:
    """The paths that are not files (a table script refuses to run on them rather than skip them)."""
    return [p for p in paths if not Path(p).is_file()]


def emit(text: str, md: str | None) -> None:
    """Print the table's text, and write it to ``md`` too where given."""
    print(text, end="")
    if md:
        Path(md).write_text(text)
