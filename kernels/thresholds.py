"""The hand-set thresholds of the launch choices, as data: ``configs/thresholds.json``.

One object per section (the reading module: "router", "align", "fp8"), each value {"value",
"unit", "source"}. ``th = Thresholds("router"); X = th["X"]; th.close()``: a missing name is an
error, and so is a name in the file that nothing read.
"""

from __future__ import annotations

import json
from pathlib import Path

PATH = Path(__file__).parent / "configs" / "thresholds.json"
ENTRY_KEYS = ("value", "unit", "source")


class ThresholdError(ValueError):
    """The thresholds file is malformed, lacks a value a module reads, or has one nothing reads."""


def load(path: Path = PATH) -> dict:
    """The whole file, checked: {section: {name: {"value", "unit", "source"}}}, every source non-empty."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ThresholdError(f"{path}: cannot read thresholds: {exc}") from None
    if not isinstance(d, dict):
        raise ThresholdError(f"{path}: want an object of sections, got {type(d).__name__}")
    for sec, entries in d.items():
        if not isinstance(entries, dict):
            raise ThresholdError(f"{path}: section {sec!r} must be an object")
        for name, e in entries.items():
            if not isinstance(e, dict) or set(e) != set(ENTRY_KEYS):
                got = sorted(e) if isinstance(e, dict) else e
                raise ThresholdError(f"{path}: {sec}.{name} must have exactly the keys {list(ENTRY_KEYS)}, got {got}")
            if not isinstance(e["source"], str) or not e["source"].strip() or not isinstance(e["unit"], str):
                raise ThresholdError(f"{path}: {sec}.{name} needs a unit and a non-empty source")
    return d


class Thresholds:
    """One section's values: ``th[name]`` (lists become tuples); ``close()`` refuses names never read."""

    def __init__(self, section: str, path: Path = PATH):
        d = load(path)
        if section not in d:
            raise ThresholdError(f"{path}: no section {section!r}; sections: {sorted(d)}")
        self.path, self.section = path, section
        self._entries = d[section]
        self._read: set[str] = set()

    def __getitem__(self, name: str):
        if name not in self._entries:
            raise ThresholdError(f"{self.path}: section {self.section!r} lacks {name!r}")
        self._read.add(name)
        v = self._entries[name]["value"]
        return tuple(v) if isinstance(v, list) else v

    def close(self) -> None:
        unknown = sorted(set(self._entries) - self._read)
        if unknown:
            raise ThresholdError(f"{self.path}: section {self.section!r} has values nothing reads: {unknown}")
