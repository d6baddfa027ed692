"""What the scripts that turn stored benchmark rows into a markdown table share (no GPU needed).

megakernel_table.py reads JSONL files of rows, listed oldest first, keeps one row per key (the
later file's, so a re-run replaces what it measured again and leaves the rest), writes the rows as
a markdown table and ends with where they were measured. Those steps are here, so the table
script holds only its own columns and targets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path


def read_jsonl(path) -> list[dict]:
    """The JSON rows of a .jsonl file, in file order, blank lines left out."""
    import json

    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def load_keyed(paths: Iterable[str], key: Callable[[dict], Hashable],
               keep: Callable[[dict], bool] | None = None) -> dict:
    """{key(row): row} over the JSONL files in the order given: where a key repeats, the later row
    (the later file's, or the later line's in one file). Rows ``keep`` refuses are left out before
    they can replace another."""
    keyed = {}
    for p in paths:
        for r in read_jsonl(p):
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


def run_of(row: dict) -> tuple:
    """(GPU, torch, Triton, commit to 7 characters, date to the day): the run a row came from."""
    return (row.get("gpu"), row.get("torch"), row.get("triton"), (row.get("commit") or "")[:7],
            (row.get("date") or "")[:10])


def provenance_text(runs: Iterable[tuple]) -> str:
    """The distinct runs (``run_of`` tuples), sorted, as "GPU, torch T, Triton V, commit C, DATE" joined by "; "."""
    return "; ".join(f"{g}, torch {t}, Triton {tr}, commit {c}, {d}"
                     for g, t, tr, c, d in sorted(set(runs), key=lambda k: tuple("" if v is None else str(v) for v in k)))


def provenance(rows: Iterable[dict]) -> str:
    """Where the rows were measured: ``provenance_text`` of their runs."""
    return provenance_text(run_of(r) for r in rows)


def missing_files(paths: Iterable[str]) -> list[str]:
    """The paths that are not files (a table script refuses to run on them rather than skip them)."""
    return [p for p in paths if not Path(p).is_file()]


def emit(text: str, md: str | None) -> None:
    """Print the table's text, and write it to ``md`` too where given."""
    print(text, end="")
    if md:
        Path(md).write_text(text)
