"""The GPU's SM clock and board power, sampled in a thread while timed work runs.

``graph_time_us(..., clock=d)`` fills ``d`` with this module's ``summary`` (docs/kernels.md: why).
NVML through ``torch.cuda.clock_rate`` / ``torch.cuda.power_draw``; where it is missing or
refuses, nothing is recorded and ``summary`` is None.
"""

from __future__ import annotations

import statistics
import threading
import time
from contextlib import contextmanager

#: seconds between samples
INTERVAL_S = 0.002


def _read(device) -> tuple[float, float | None] | None:
    """(SM clock MHz, board power W or None) now, or None where NVML is missing or refuses."""
    import torch

    try:
        mhz = float(torch.cuda.clock_rate(device))
    except Exception:  # noqa: BLE001 - pynvml missing or refused: nothing to record
        return None
    try:
        watts = float(torch.cuda.power_draw(device)) / 1e3  # NVML reports milliwatts
    except Exception:  # noqa: BLE001 - some boards refuse the power query alone
        watts = None
    return mhz, watts


def summarize(samples: list[tuple[float, float, float | None]]) -> dict | None:
    """Summary {"sm_clock_mhz", "power_w", "samples", "seconds"} of ``samples``; None for none."""
    if not samples:
        return None
    mhz = [s[1] for s in samples]
    out = {"sm_clock_mhz": {"mean": statistics.fmean(mhz), "min": min(mhz), "max": max(mhz),
                            "first": mhz[0], "last": mhz[-1]},
           "samples": len(samples), "seconds": samples[-1][0] - samples[0][0]}
    watts = [s[2] for s in samples if s[2] is not None]
    if watts:
        out["power_w"] = {"mean": statistics.fmean(watts), "max": max(watts)}
    return out


class ClockSampler:
    """``with ClockSampler() as s: ...`` samples SM clock and power in a thread; ``s.summary()`` after."""

    def __init__(self, interval_s: float = INTERVAL_S, device=None):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s!r}")
        self.interval_s, self.device = float(interval_s), device
        self.samples: list[tuple[float, float, float | None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def _sample(self) -> bool:
        got = _read(self.device)
        if got is None:
            return False
        self.samples.append((time.monotonic() - self._t0, got[0], got[1]))
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self._sample():
                return

    def __enter__(self) -> ClockSampler:
        self._t0 = time.monotonic()
        if self._sample():  # NVML answers: sample in the background too
            self._thread = threading.Thread(target=self._loop, name="clock-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._sample()

    def summary(self) -> dict | None:
        return summarize(self.samples)


@contextmanager
def sampled(clock: dict | None, interval_s: float = INTERVAL_S):
    """Sample while the block runs and leave the summary in ``clock`` (None: no sampling)."""
    if clock is None:
        yield
        return
    with ClockSampler(interval_s) as s:
        yield
    clock.update(s.summary() or {})
