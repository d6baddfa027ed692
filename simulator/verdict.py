"""The verdict: one line naming what bounds a simulated layer, and by how much.

Shape legend: G GPUs.

The analytic bound's terms (``analytic.TERMS``: compute, HBM, the communication SMs' copy rate,
the send and receive ports, per-round signalling, fixed costs) are each what one GPU would take if
that term alone limited it. The binding term is the largest over all GPUs; the event model then
says how the layer time splits into compute, imbalance and exposed communication. A layer is

* bound by **expert imbalance** when compute binds and the busiest GPU computes more than
  ``IMBALANCED`` times the mean GPU;
* bound by **HBM** when compute binds and the busiest GPU's HBM bytes alone take at least
  ``HBM_SHARE`` of its compute time (weights read again each round, few rows per expert);
* bound by **compute** when compute binds otherwise;
* bound by the binding communication term (copy rate, a port, signalling) when it binds;
* bound by **the first round's fill** when a GPU's wait for its first routed rows plus its compute
  is the largest term and the wait is at least ``FILL_SHARE`` of the layer (a round computes once
  all of its rows are in); a shorter wait leaves the compute named;
* bound by **fixed costs** when they are more than half of the layer.
"""

from __future__ import annotations

import numpy as np

from .analytic import TERMS

FILL_SHARE = 0.1  # the first round's wait, as a share of the layer, from which the fill is named
HBM_SHARE = 0.8  # HBM time over compute time beyond which a compute-bound GPU is called HBM-bound
IMBALANCED = 1.5  # busiest over mean compute beyond which a compute-bound layer is called imbalanced
COMMUNICATION = ("copy", "send_port", "recv_port", "signal")


def _ms(seconds: float) -> str:
    x = seconds * 1e3
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def comp_or_busy(terms: dict, busy_s) -> np.ndarray:
    return np.asarray(terms["compute"] if busy_s is None else busy_s, np.float64)


def binding_terms(terms: dict) -> list[tuple[str, float, int]]:
    """[(term, seconds, GPU)] of every term at the GPU where it is largest, largest first."""
    out = []
    for k, v in terms.items():
        v = np.asarray(v, np.float64)
        if v.size and float(v.max()) > 0:
            g = int(np.argmax(v))
            out.append((k, float(v[g]), g))
    return sorted(out, key=lambda x: -x[1])


def verdict(terms: dict, *, layer_s: float, busy_s: np.ndarray | None = None,
            port_utilization: float | None = None, copy_utilization: float | None = None) -> dict:
    """{bound_by, term, line, terms_us}: what bounds a layer of ``layer_s`` seconds.

    ``terms``: the analytic bound's (G,) terms; ``busy_s``: (G,) compute-SM busy time of the event
    model (None for the bound alone: its compute term is used); ``port_utilization``,
    ``copy_utilization``: the busiest port's and communication SMs' share of the layer, if known."""
    ranked = binding_terms(terms)
    if not ranked:
        return {"bound_by": "nothing", "term": None, "line": "moves and computes nothing", "terms_us": {}}
    name, sec, g = ranked[0]
    comp = np.asarray(terms.get("compute", np.zeros(1)), np.float64)
    busy = comp if busy_s is None else np.asarray(busy_s, np.float64)
    cmax, cmean = float(busy.max()), float(busy.mean())
    exposed = max(layer_s - cmax, 0.0)
    fixed = float(np.max(terms.get("fixed", 0.0)))
    if name == "fill" and float(terms["fill"][g] - busy[g]) < FILL_SHARE * layer_s:
        name = "compute"  # a short wait for the first rows: the compute binds
    if fixed > 0.5 * layer_s:
        name = "fixed"
    elif name in ("compute", "hbm") and cmax > IMBALANCED * cmean:
        name = "imbalance"
    elif name == "compute" and "hbm" in terms and terms["hbm"][g] >= HBM_SHARE * comp_or_busy(terms, busy_s)[g]:
        name = "hbm"
    cause = "expert imbalance" if name == "imbalance" else TERMS[name]
    if name == "fill":
        wait = float(terms["fill"][g] - busy[g])
        head = (f"bound by {cause}: {_ms(wait)} ms waiting for the first round's rows, then {_ms(float(busy[g]))} ms "
                f"computing (GPU {g}; layer {_ms(layer_s)} ms)")
    elif name in COMMUNICATION:
        head = f"bound by {cause}: {_ms(exposed)} of {_ms(layer_s)} ms exposed communication"
    elif name == "imbalance":
        head = (f"bound by {cause}: the busiest GPU computes {_ms(cmax)} ms against a mean of {_ms(cmean)} "
                f"(layer {_ms(layer_s)} ms)")
    elif name == "fixed":
        head = f"bound by {cause}: {_ms(fixed)} of {_ms(layer_s)} ms"
    else:
        head = f"bound by {cause}: {_ms(cmax)} of {_ms(layer_s)} ms computing on the busiest GPU"
        if name == "hbm":
            head += f", {_ms(float(terms['hbm'][g]))} ms of it moving its HBM bytes"
    tail = [f"{TERMS[k].replace('the ', '')} alone {_ms(v)} ms (GPU {gg})" for k, v, gg in ranked[:2]]
    if port_utilization is not None:
        tail.append(f"NVLink ports at {port_utilization:.2f}")
    if copy_utilization is not None:
        tail.append(f"communication SMs at {copy_utilization:.2f}")
    return {"bound_by": name, "term": cause, "line": f"{head}; " + "; ".join(tail),
            "terms_us": {k: v * 1e6 for k, v, _ in ranked}}
