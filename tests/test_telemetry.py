"""kernels/telemetry.py (the SM clock sampled while timed work runs) and the validation report's
clock section, on fake NVML readings (no GPU here)."""

import time

import pytest

from megamoe.kernels import telemetry
from megamoe.report import clock_lines


def test_summarize_figures():
    s = telemetry.summarize([(0.0, 1980.0, 600.0), (0.01, 1755.0, None), (0.02, 1500.0, 700.0)])
    c = s["sm_clock_mhz"]
    assert (c["min"], c["max"], c["first"], c["last"]) == (1500.0, 1980.0, 1980.0, 1500.0)
    assert c["mean"] == pytest.approx((1980 + 1755 + 1500) / 3)
    assert s["power_w"] == {"mean": 650.0, "max": 700.0}
    assert s["samples"] == 3 and s["seconds"] == pytest.approx(0.02)
    assert telemetry.summarize([]) is None
    assert "power_w" not in telemetry.summarize([(0.0, 1980.0, None)])


def test_sampler_samples_in_background(monkeypatch):
    clocks = iter(range(2000, 0, -1))
    monkeypatch.setattr(telemetry, "_read", lambda device: (float(next(clocks)), 650.0))
    with telemetry.ClockSampler(interval_s=0.001) as s:
        time.sleep(0.05)
    got = s.summary()
    assert got["samples"] >= 5  # one at entry, one at exit, several between
    assert got["sm_clock_mhz"]["first"] == 2000.0 and got["sm_clock_mhz"]["last"] < 2000.0
    assert got["power_w"]["mean"] == 650.0


def test_sampler_without_nvml_records_nothing(monkeypatch):
    monkeypatch.setattr(telemetry, "_read", lambda device: None)
    with telemetry.ClockSampler() as s:
        pass
    assert s.summary() is None and s._thread is None


def test_sampler_rejects_bad_interval():
    with pytest.raises(ValueError, match="interval_s"):
        telemetry.ClockSampler(interval_s=0)


def _row(T, backend, mean, ratio):
    return {"preset": "mixtral-8x7b", "T": T, "routing": "uniform", "backend": backend, "predicted_us": 110.0,
            "measured_us": 100.0, "predicted_sustained_ratio": ratio,
            "measured_clock": {"sm_clock_mhz": {"mean": mean, "min": mean - 100, "max": mean + 20},
                               "power_w": {"mean": 690.0, "max": 700.0}}}


def test_clock_lines_lists_long_rows_against_the_highest_clock():
    rows = [_row(16384, "multi", 1600.0, 0.88), _row(4096, "megakernel", 1960.0, 0.91), _row(8, "multi", 1980.0, 1.0),
            {"preset": "x", "T": 4096, "routing": "uniform", "backend": "multi", "predicted_us": 1.0, "measured_us": 1.0}]
    lines = clock_lines(rows)
    table = [ln for ln in lines if ln.startswith("| mixtral")]
    assert len(table) == 2  # T = 8 and the row without a clock left out
    top = 1980.0  # the T = 4096 row's max, the highest sampled among the rows listed
    assert f"{1600 / top:.3f}" in table[1] and "0.880" in table[1] and "+10.0%" in table[1]
    assert clock_lines([_row(8, "multi", 1980.0, 1.0)]) == []


def test_sampled_fills_the_dict_or_does_nothing(monkeypatch):
    """sampled(d) leaves the summary in d; sampled(None) starts no sampler at all."""
    calls = []
    monkeypatch.setattr(telemetry, "_read", lambda device: calls.append(1) or (1980.0, None))
    d: dict = {}
    with telemetry.sampled(d, interval_s=0.001):
        time.sleep(0.01)
    assert d["sm_clock_mhz"]["max"] == 1980.0 and d["samples"] >= 2
    calls.clear()
    with telemetry.sampled(None):
        time.sleep(0.005)
    assert calls == []
