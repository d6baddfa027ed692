"""Progress of a sweep: points done, failed, rate and ETA; a live bar on a terminal, plain lines in a pipe."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _hms(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """``update(ok, failed)`` after each batch; ``close()`` at the end. ``every_s``: plain-line interval."""

    def __init__(self, total: int, *, skipped: int = 0, stream: TextIO | None = None, live: bool | None = None,
                 every_s: float = 5.0, enabled: bool = True):
        self.total, self.skipped = total, skipped
        self.done = self.failed = 0
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.every_s, self.enabled = every_s, enabled
        self.t0 = time.perf_counter()
        self._last = self.t0
        self._bar = None
        if enabled and self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[failed]} failed, {task.fields[rate]}"), TimeRemainingColumn(),
                            console=Console(file=self.stream), transient=False)
            self._bar.start()
            self._task = self._bar.add_task("sweep", total=total, failed=0, rate="")

    @property
    def rate(self) -> float:
        dt = time.perf_counter() - self.t0
        return (self.done + self.failed) / dt if dt > 0 else 0.0

    def line(self) -> str:
        n = self.done + self.failed
        r = self.rate
        eta = (self.total - n) / r if r > 0 else float("inf")
        return (f"sweep: {n}/{self.total} points ({self.failed} failed), {r:,.1f} points/s, "
                f"ETA {_hms(eta) if n < self.total else '0:00:00'}")

    def update(self, ok: int, failed: int) -> None:
        self.done += ok
        self.failed += failed
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, advance=ok + failed, failed=self.failed, rate=f"{self.rate:,.1f} points/s")
            return
        now = time.perf_counter()
        if now - self._last >= self.every_s and self.done + self.failed < self.total:
            self._last = now
            print(self.line(), file=self.stream, flush=True)

    def start(self) -> None:
        if self.enabled and self._bar is None:
            extra = f", {self.skipped} already done" if self.skipped else ""
            print(f"sweep: {self.total} points to run{extra}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif self.enabled:
            print(self.line() + f", {_hms(time.perf_counter() - self.t0)} elapsed", file=self.stream, flush=True)
