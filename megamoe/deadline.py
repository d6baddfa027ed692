"""Wall-time budgets for the GPU runs (``megamoe calibrate``, ``megamoe validate``).

``Budget``: seconds since the start and seconds left, asked before each step. ``Watchdog``: a
daemon thread that, when an armed step overruns, calls ``on_fire(what)`` and ends the process with
``os._exit(code)`` (a GPU hang never returns from a synchronize). Both read ``time.monotonic``.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable

#: exit code of a process the watchdog ended (the driver resumes after it)
WATCHDOG_EXIT = 4


_COMMAND_START: list[float] = []


def mark_command_start() -> None:
    """Record that a command starts now (``megamoe.cli.main`` does, before any import of torch)."""
    _COMMAND_START[:] = [time.monotonic()]


def clear_command_start() -> None:
    _COMMAND_START.clear()


def command_start() -> float:
    """When the running command started (``mark_command_start``), else now: a budget counts the
    seconds spent importing torch and triton too."""
    return _COMMAND_START[0] if _COMMAND_START else time.monotonic()


class Budget:
    """Seconds since ``start`` (default: now) against ``seconds`` (None: no limit)."""

    def __init__(self, seconds: float | None, *, start: float | None = None, clock: Callable[[], float] = time.monotonic):
        if seconds is not None and not seconds > 0:
            raise ValueError(f"a budget must be a positive number of seconds, got {seconds!r}")
        self.seconds = seconds
        self._clock = clock
        self.start = clock() if start is None else start

    def elapsed(self) -> float:
        return self._clock() - self.start

    def left(self) -> float:
        """Seconds left (inf without a limit; negative once spent)."""
        return math.inf if self.seconds is None else self.seconds - self.elapsed()

    def allows(self, estimate_s: float, reserve_s: float = 0.0) -> bool:
        """Whether a step of ``estimate_s`` seconds still fits with ``reserve_s`` kept back."""
        return self.left() - reserve_s >= estimate_s

    def stamp(self) -> str:
        """``[  12.3 s]``: the prefix of a progress line."""
        return f"[{self.elapsed():7.1f} s]"


class Watchdog:
    """Ends the process when an armed step overruns: ``arm(seconds, what)`` before the step,
    ``disarm()`` after. On firing: ``on_fire(what)`` (errors printed), a line on stderr, ``os._exit(code)``."""

    def __init__(self, on_fire: Callable[[str], None] | None = None, *, code: int = WATCHDOG_EXIT,
                 exit: Callable[[int], None] = os._exit, poll_s: float = 0.2, name: str = "megamoe"):
        self.on_fire = on_fire
        self.code = code
        self._exit = exit
        self._poll = poll_s
        self._name = name
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._what = ""
        self._seconds = 0.0

        self._stop = False
        self._thread = threading.Thread(target=self._watch, name="megamoe-watchdog", daemon=True)
        self._thread.start()

    def arm(self, seconds: float, what: str) -> None:
        with self._cond:
            self._deadline = time.monotonic() + max(seconds, 0.0)
            self._seconds = seconds
            self._what = what
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._deadline = None
            self._cond.notify()
        self._thread.join(timeout=2.0)

    def _watch(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                due = self._deadline is not None and time.monotonic() >= self._deadline
                if not due:
                    self._cond.wait(self._poll)
                    continue
                what, seconds = self._what, self._seconds
                self._deadline = None

            if self.on_fire is not None:
                try:
                    self.on_fire(what)
                except Exception as exc:  # noqa: BLE001 - the exit must happen whatever on_fire does
                    print(f"{self._name}: watchdog: writing what was measured failed: {type(exc).__name__}: {exc}",
                          file=sys.stderr, flush=True)
            print(f"{self._name}: watchdog: {what} did not finish in {seconds:.0f} s (a GPU hang or a compile "
                  f"past the budget); exiting with code {self.code}", file=sys.stderr, flush=True)
            self._exit(self.code)
            return
