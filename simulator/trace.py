"""Chrome-trace / Perfetto JSON of a simulated layer (ui.perfetto.dev and chrome://tracing open it).

Shape legend: G GPUs, C switch chips.

One process per GPU with three threads (compute, dispatch, combine: "X" complete events) and two
counters (NVLink send and receive GB/s, i.e. the GPU's links together); one "NVLink fabric"
process with a GB/s counter per switch chip (every GPU's traffic striped over the chips). Times
in microseconds, as the format wants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .simulate import SimResult

_TID = {"compute": 1, "dispatch": 2, "combine": 3}


def chrome_trace(result: SimResult) -> dict:
    G = int(result.inputs["num_gpus"])
    ev: list[dict] = []
    for g in range(G):
        ev.append({"ph": "M", "name": "process_name", "pid": g, "args": {"name": f"GPU {g}"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": g, "args": {"sort_index": g}})
        for name, tid in _TID.items():
            ev.append({"ph": "M", "name": "thread_name", "pid": g, "tid": tid, "args": {"name": name}})
    for s in result._spans:
        ev.append({"ph": "X", "name": s.name, "cat": s.track, "pid": s.gpu, "tid": _TID[s.track],
                   "ts": s.start_s * 1e6, "dur": max(s.end_s - s.start_s, 0.0) * 1e6,
                   "args": {k: float(v) for k, v in s.args.items()}})
    fab = G
    if result._link_frac:
        ev.append({"ph": "M", "name": "process_name", "pid": fab, "args": {"name": "NVLink fabric"}})
    prev = None
    for t, load in result._samples:
        if prev is not None and np.array_equal(load, prev):
            continue
        ts = t * 1e6
        for g in range(G):
            if prev is None or load[g] != prev[g] or load[G + g] != prev[G + g]:
                ev.append({"ph": "C", "name": "NVLink GB/s", "pid": g, "ts": ts,
                           "args": {"send": load[g] / 1e9, "recv": load[G + g] / 1e9}})
        if result._link_frac:
            total = float(load[:G].sum())
            ev.append({"ph": "C", "name": "switch GB/s", "pid": fab, "ts": ts,
                       "args": {c: total * f / 1e9 for c, f in result._link_frac.items()}})
        prev = load
    return {"traceEvents": ev, "displayTimeUnit": "ns",
            "otherData": {k: str(v) for k, v in result.inputs.items()}}
