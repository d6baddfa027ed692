"""Bandwidth sharing: max-min fair rates and the SimPy fabric, on cases worked by hand."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from megamoe.simulator.entities import Fabric
from megamoe.simulator.flows import _SAT, maxmin_rates


def maxmin_rates_py(cap, flows: list[dict[int, float]]) -> np.ndarray:
    """Plain-Python progressive filling on a list of {resource: coef} flows: the oracle ``maxmin_rates`` is held to."""
    cap = np.asarray(cap, float)
    rem = cap.copy()
    rate = np.zeros(len(flows))
    unfrozen = set(range(len(flows)))
    while unfrozen:
        w = np.zeros(cap.size)
        for f in unfrozen:
            for r, c in flows[f].items():
                w[r] += c
        mask = w > 0
        inc = float(np.min(rem[mask] / w[mask]))
        rem -= inc * w
        full = {r for r in np.nonzero(mask & (rem <= _SAT * cap))[0]}
        for f in list(unfrozen):
            rate[f] += inc
            if any(r in full and c > 0 for r, c in flows[f].items()):
                unfrozen.discard(f)
    return rate


def _csr(flows):
    ptr = np.zeros(len(flows) + 1, np.int64)
    ptr[1:] = np.cumsum([len(f) for f in flows])
    res = np.array([r for f in flows for r in f], np.int64)
    coef = np.array([c for f in flows for c in f.values()], np.float64)
    return ptr, res, coef


@pytest.mark.parametrize(
    "cap, flows, want",
    [
        # two flows share one port: half each
        ([10.0], [{0: 1.0}, {0: 1.0}], [5.0, 5.0]),
        # classic: A uses r0+r1, B r0, C r1; r0 = 10, r1 = 4 -> A = C = 2, B = 8
        ([10.0, 4.0], [{0: 1.0, 1: 1.0}, {0: 1.0}, {1: 1.0}], [2.0, 8.0, 2.0]),
        # a coflow that puts a quarter of its bytes on r1 is limited by r0 (cap 4) only: 4
        ([4.0, 4.0], [{0: 1.0, 1: 0.25}], [4.0]),
        # a coflow with 3/4 of its bytes on a port of 3 runs at 4
        ([100.0, 3.0], [{0: 1.0, 1: 0.75}], [4.0]),
    ],
)
def test_maxmin_by_hand(cap, flows, want):
    ptr, res, coef = _csr(flows)
    rate, load = maxmin_rates(np.array(cap), ptr, res, coef, np.ones(len(flows), np.bool_))
    assert rate == pytest.approx(want)
    assert maxmin_rates_py(cap, flows) == pytest.approx(want)
    assert (load <= np.array(cap) * (1 + 1e-9)).all()


def test_maxmin_matches_python_on_random_cases(rng):
    for _ in range(30):
        R, F = rng.integers(2, 8), rng.integers(1, 12)
        cap = rng.uniform(1, 10, R)
        flows = []
        for _ in range(F):
            rs = rng.choice(R, rng.integers(1, R + 1), replace=False)
            flows.append({int(r): float(rng.uniform(0.1, 1.0)) for r in rs})
        ptr, res, coef = _csr(flows)
        rate, load = maxmin_rates(cap, ptr, res, coef, np.ones(F, np.bool_))
        assert rate == pytest.approx(maxmin_rates_py(cap, flows), rel=1e-9)
        assert (load <= cap * (1 + 1e-9)).all()
        # max-min: every flow crosses a full resource (else it could go faster)
        full = load >= cap * (1 - 1e-7)
        for f in flows:
            assert any(full[r] for r in f)


def test_inactive_flows_get_nothing():
    ptr, res, coef = _csr([{0: 1.0}, {0: 1.0}])
    rate, _ = maxmin_rates(np.array([10.0]), ptr, res, coef, np.array([True, False]))
    assert rate.tolist() == [10.0, 0.0]


def test_fabric_two_flows_one_port_exact_times():
    # 1e9 B/s port; A 1e9 B and B 0.5e9 B start together: both at 0.5e9 until B ends at 1 s,
    # then A alone at 1e9 for its last 0.5e9 B: ends at 1.5 s.
    env = simpy.Environment()
    fab = Fabric(env, np.array([1e9]))
    a = fab.add([0], [1.0], 1e9, "A")
    b = fab.add([0], [1.0], 0.5e9, "B")
    ends = {}

    def go(fid, name):
        yield fab.start(fid)
        ends[name] = env.now

    env.process(go(a, "A"))
    env.process(go(b, "B"))
    env.run()
    assert ends == pytest.approx({"A": 1.5, "B": 1.0})
    assert fab.resource_bytes[0] == pytest.approx(1.5e9)  # bytes through the port = bytes sent


def test_fabric_late_start_and_latency():
    # A (2e9 B) starts at 0 alone at 1e9; B (0.5e9 B) joins at 1 s: both at 0.5e9 until B ends at
    # 2 s; A has 0.5e9 left, alone again: 2.5 s. Latency 0.1 s is added to each end.
    env = simpy.Environment()
    fab = Fabric(env, np.array([1e9]), latency_s=0.1)
    a = fab.add([0], [1.0], 2e9)
    b = fab.add([0], [1.0], 0.5e9)
    ends = {}

    def go(fid, delay):
        yield env.timeout(delay)
        yield fab.start(fid)
        ends[fid] = env.now

    env.process(go(a, 0.0))
    env.process(go(b, 1.0))
    env.run()
    assert ends[b] == pytest.approx(2.1)
    assert ends[a] == pytest.approx(2.6)


def test_fabric_zero_bytes_is_instant():
    env = simpy.Environment()
    fab = Fabric(env, np.array([1.0]), latency_s=1.0)
    f = fab.add([0], [1.0], 0.0)
    ev = fab.start(f)
    env.run()
    assert ev.triggered and env.now == 0.0


def test_compute_job_shares_hbm_with_a_copy():
    # HBM of 6 B/s; a compute job of 10 HBM bytes capped at 5 B/s (alone: 2 s, its tile-model
    # time). A copy of 10 B through the same HBM (port 100 B/s) starts with it: max-min gives
    # each 3 B/s, so both end at 10/3 s: the copy slows the GEMM, as on a real GPU.
    def run(with_copy):
        env = simpy.Environment()
        fab = Fabric(env, np.array([6.0, 5.0, 100.0]))
        job = fab.add([0, 1], [1.0, 1.0], 10.0, "job", latency_s=0.0)
        copy = fab.add([0, 2], [1.0, 1.0], 10.0, "copy")
        fab.start(job)
        if with_copy:
            fab.start(copy)
        env.run()
        return fab.end_s[job]

    assert run(False) == pytest.approx(2.0)
    assert run(True) == pytest.approx(10 / 3)


def test_fabric_refuses_to_start_a_flow_twice():
    env = simpy.Environment()
    fab = Fabric(env, np.array([1.0]))
    a = fab.add([0], [1.0], 1.0, "A")
    b = fab.add([0], [1.0], 1.0, "B")
    fab.start(a)
    with pytest.raises(RuntimeError, match=r"flow 0 \(A\) started twice"):
        fab.start(a)
    with pytest.raises(RuntimeError, match=r"flow 1 \(B\) started twice"):  # twice in one call
        fab.start_many([b, b])
