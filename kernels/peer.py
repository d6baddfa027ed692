"""A same-run peer: another MoE implementation's routed experts, timed beside megamoe's on the same
routing and weights, its output checked against the float64 reference.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, S sampled tokens.

A peer is a Python file (``megamoe bench --peer FILE``) that defines

    fused_experts(x, w13, w2, topk_weights, topk_ids) -> y

with megamoe's layouts: x (T, H); w13 (E, 2I, H), gate rows then up rows; w2 (E, H, I);
topk_weights (T, K) float32; topk_ids (T, K) int32; y (T, H), y[t] = sum_k topk_weights[t, k] *
down_e(silu(gate_e x[t]) * up_e x[t]) with e = topk_ids[t, k]. Whatever the callable does runs in
the timed CUDA graph. A peer whose output is off the reference by more than the dtype's tolerance
is reported wrong and not timed.
"""

from __future__ import annotations

import importlib.util
import inspect
import statistics
import sys
import time
from pathlib import Path

#: the arguments a peer's ``fused_experts`` is called with, in order
PEER_ARGS = ("x", "w13", "w2", "topk_weights", "topk_ids")
#: tokens of a row's first input whose outputs are compared with the float64 reference
SAMPLE = 4


class PeerError(ValueError):
    """A peer file that cannot be compared: missing, no ``fused_experts``, a wrong signature, or a
    call that raised or returned the wrong shape; the message names the file and what was expected."""


def load_peer(path):
    """The ``fused_experts`` of the Python file at ``path`` (``load_peer_module``)."""
    return load_peer_module(path).fused_experts


def load_peer_module(path):
    """The Python file at ``path`` imported as a module of its own, its ``fused_experts`` checked to
    take the 5 ``PEER_ARGS``; ``PeerError`` where it cannot be used."""
    p = Path(path)
    if p.is_dir():
        raise PeerError(f"--peer {str(path)!r} is a folder; give a Python file defining fused_experts(...)")
    if not p.is_file():
        raise PeerError(f"--peer {str(path)!r}: no such file; give a Python file defining "
                        f"fused_experts({', '.join(PEER_ARGS)})")
    if p.suffix != ".py":
        raise PeerError(f"--peer {str(path)!r}: not a .py file; give a Python file defining fused_experts(...)")
    name = f"megamoe_peer_{abs(hash(str(p.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, p)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:  # noqa: BLE001 - whatever the file raises, say where it came from
        del sys.modules[name]
        raise PeerError(f"--peer {str(path)!r}: importing it raised {type(exc).__name__}: {exc}"[:600]) from None
    fn = getattr(mod, "fused_experts", None)
    if fn is None or not callable(fn):
        raise PeerError(f"--peer {str(path)!r} defines no callable fused_experts; it must define "
                        f"fused_experts({', '.join(PEER_ARGS)}) -> y (T, H)")
    try:
        inspect.signature(fn).bind(*PEER_ARGS)
    except TypeError as exc:
        raise PeerError(f"--peer {str(path)!r}: fused_experts{inspect.signature(fn)} cannot be called with the "
                        f"5 arguments ({', '.join(PEER_ARGS)}): {exc}") from None
    except ValueError:  # no signature to read (a builtin): the first call says whether it works
        pass
    return mod


def peer_output(fn, x, w13, w2, topk_weights, topk_ids):
    """fn's y for these inputs, or ``PeerError`` naming what went wrong (it raised, or y is not a
    (T, H) tensor on x's device)."""
    import torch

    try:
        y = fn(x, w13, w2, topk_weights, topk_ids)
    except Exception as exc:  # noqa: BLE001 - the peer's failure, reported as such
        raise PeerError(f"peer fused_experts raised {type(exc).__name__}: {exc}"[:600]) from None
    want = (x.shape[0], x.shape[1])
    if not isinstance(y, torch.Tensor):
        raise PeerError(f"peer fused_experts returned {type(y).__name__}; expected a tensor of shape {list(want)}")
    if tuple(y.shape) != want or y.device != x.device:
        raise PeerError(f"peer fused_experts returned shape {list(y.shape)} on {y.device}; expected "
                        f"{list(want)} (T, H) on {x.device}")
    return y


def routed_reference(x, topk_idx, topk_w, gate_up, down, config, rows, gate_up_bias=None, down_bias=None):
    """The float64 reference of the routed experts on the tokens ``rows`` (S,): y (S, H) =
    sum_k w[t, k] * reference.expert_ffn(x[t]) of expert idx[t, k] (with its biases, if given);
    only the experts they pick are copied to the host. Tensors on any device; the routing is taken
    as given."""
    import numpy as np

    from ..reference import expert_ffn

    def f64(t):
        return t.detach().double().cpu().numpy()

    xs, idx, wts = f64(x[rows]), topk_idx[rows].cpu().numpy(), f64(topk_w[rows])
    y = np.zeros_like(xs)
    for e in np.unique(idx):
        gu, dn = f64(gate_up[int(e)]), f64(down[int(e)])
        gb = None if gate_up_bias is None else f64(gate_up_bias[int(e)])
        db = None if down_bias is None else f64(down_bias[int(e)])
        s, k = np.nonzero(idx == e)
        y[s] += wts[s, k, None] * expert_ffn(xs[s], gu, dn, config, gb, db)
    return y


def wall_time_us(fn, inputs: list, reps: int) -> float:
    """Median per-call wall time (us) of fn over the inputs, eager, after one warm-up pass (the
    stand-in for ``measure.graph_time_us`` where there is no GPU)."""
    for a in inputs:
        fn(a)
    times = []
    for _ in range(max(reps, 1)):
        t0 = time.perf_counter()
        for a in inputs:
            fn(a)
        times.append((time.perf_counter() - t0) * 1e6 / len(inputs))
    return statistics.median(times)


def unsupported(config) -> str | None:
    """Why a peer's ``fused_experts`` cannot compute this layer's experts (None: it can)."""
    if config.activation != "silu_gated" or config.expert_bias or config.weight_on_input:
        return (f"a peer computes SiLU-gated experts without biases, weights on the output; "
                f"{config.name or 'this layer'} has activation {config.activation!r}, expert_bias "
                f"{config.expert_bias}, weight_on_input {config.weight_on_input}")
    return None


def checked_time(key: str, fn, inputs: list, y_ref, rows, dtype: str, reps: int, timer) -> dict:
    """``{key}_err_max``, ``{key}_err_rms``, ``{key}_ok`` of fn(inputs[0]) on the sampled ``rows``
    against ``y_ref``, then ``{key}_us`` from ``timer`` where it is within tolerance; a wrong or
    failing fn gets ``{key}_error`` instead of a time."""
    from ..reference import normalized_error, tolerance_for

    out = {}
    try:
        y = fn(inputs[0])
        err = normalized_error(y[rows].detach().double().cpu().numpy(), y_ref)
        tmax, trms = tolerance_for(dtype)
        out = {f"{key}_err_max": err.max_err, f"{key}_err_rms": err.rms_err,
               f"{key}_ok": bool(err.max_err <= tmax and err.rms_err <= trms)}
        if not out[f"{key}_ok"]:
            out[f"{key}_error"] = (f"wrong output: normalized error max {err.max_err:.3g} / rms {err.rms_err:.3g} "
                                   f"against the float64 reference (limits {tmax:g} / {trms:g}, {dtype}); not timed")
            return out
        out[f"{key}_us"] = timer(fn, inputs, reps)
    except Exception as exc:  # noqa: BLE001 - recorded in the row, the others go on
        out[f"{key}_error"] = f"{type(exc).__name__}: {exc}"[:600]
    return out


def routings(xs: list, w, config) -> list[tuple]:
    """(x, topk_weights (T, K) float32, topk_idx (T, K) int32) per input: the layer's own router
    (``moe_forward_details``), the routing every routed-experts column is then given."""
    from . import moe as kmoe

    out = []
    for x in xs:
        d = kmoe.moe_forward_details(x, w, config)
        out.append((x, d["topk_weights"].contiguous(), d["topk_idx"].contiguous()))
    return out


def peer_columns(config, w, xs: list, backend: str, reps: int, peer, *, timer=None, sample: int = SAMPLE) -> dict:
    """megamoe's routed experts (``moe_experts`` with ``backend``) and the peer on the same routing
    (the layer's router on each input of ``xs``) and weights ``w``: ``experts_*`` and ``peer_*``
    figures (``checked_time``), ``speedup_vs_peer`` = peer us / megamoe us. ``timer``:
    ``graph_time_us`` (default) or ``wall_time_us`` without a GPU."""
    import numpy as np

    from . import moe as kmoe
    from .measure import graph_time_us

    timer = timer or graph_time_us
    why = unsupported(config)
    if why:
        return {"peer_error": why}
    ins = routings(xs, w, config)
    x0, tw0, ti0 = ins[0]
    rows = np.sort(np.random.default_rng(0).choice(x0.shape[0], size=min(sample, x0.shape[0]), replace=False))
    y_ref = routed_reference(x0, ti0, tw0, w.gate_up, w.down, config, rows)
    dtype = str(x0.dtype).replace("torch.", "")
    row = {"peer_sampled_tokens": len(rows), "experts_backend": backend}
    row.update(checked_time("experts", lambda a: kmoe.moe_experts(a[0], a[2], a[1], w.gate_up, w.down, backend=backend,
                                                                   check=False), ins, y_ref, rows, dtype, reps, timer))

    def run_peer(a):
        return peer_output(peer, a[0], w.gate_up, w.down, a[1], a[2])

    row.update(checked_time("peer", run_peer, ins, y_ref, rows, dtype, reps, timer))
    if "peer_us" in row and "experts_us" in row:
        row["speedup_vs_peer"] = row["peer_us"] / row["experts_us"]
    return row
