"""What a Dask worker runs: ``run_batch(points)``, points sharing one workload -> one flat row per point
(a point that raises: its row's ``error``). Workloads, profiles and analytic pieces are cached per process."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from typing import Any

from .spec import OPTIONS, WORKLOAD_OPTIONS, WORKLOAD_PROFILE_KEYS, Point, canonical

#: Output columns, in order, after the inputs.
OUTPUTS = ("mode", "layer_time_us", "analytic_us", "expert_compute_us", "load_imbalance_wait_us", "exposed_comm_us",
           "dispatch_us", "combine_us", "imbalance_by_gpu", "imbalance_by_expert", "imbalance_by_slot", "num_gpus",
           "num_slots", "minibatch_tokens", "num_minibatches", "workload_s", "wall_s", "error")
_BREAKDOWN = {"expert_compute": "expert_compute_us", "load_imbalance_wait": "load_imbalance_wait_us",
              "exposed_communication": "exposed_comm_us", "dispatch": "dispatch_us", "combine": "combine_us"}
#: Workloads kept per worker (a full NVL72 layer at 4096 tokens per GPU is about 60 MB).
MAX_WORKLOADS = 4


class _LRU(OrderedDict):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get_or(self, key, make):
        if key in self:
            self.move_to_end(key)
            return self[key], False
        value = make()
        self[key] = value
        while len(self) > self.size:
            self.popitem(last=False)
        return value, True


_configs: dict = {}
_profiles = _LRU(64)
_workloads = _LRU(MAX_WORKLOADS)
_pieces = _LRU(4096)  # analytic: roofline compute and byte matrices per workload


def _config(name: str):
    from megamoe.reference import MoEConfig

    if name not in _configs:
        _configs[name] = MoEConfig.load(name)
    return _configs[name]


def _profile(options: dict):
    from .spec import resolve_profile

    prof_opts = {k: v for k, v in options.items() if k not in OPTIONS or k == "system"}
    key = json.dumps(prof_opts, sort_keys=True)
    def make():
        prof = resolve_profile(prof_opts)
        return prof, _compute_key(prof)

    return _profiles.get_or(key, make)[0]


def workload_key(point: Point) -> str:
    """Points with the same key share one workload (the client groups batches by it)."""
    c = canonical(point.options)
    key = {k: c.get(k) for k in WORKLOAD_OPTIONS}
    key["system"] = c["system"]
    for p in WORKLOAD_PROFILE_KEYS:
        key[p] = c.get("profile:" + p)
    if c.get("analytic"):
        key["minibatch"] = "any"
        key["analytic"] = True
    return json.dumps(key, sort_keys=True)


def _workload(c: dict, profile, minibatch: int | None):
    from megamoe.simulator import build_workload

    key = json.dumps([c["model"], profile.num_gpus, profile.num_nodes, c["tokens-per-gpu"], c["routing"],
                      c["placement"], c.get("slots"), minibatch, c["seed"]])

    def make():
        w = build_workload(_config(c["model"]), profile.num_gpus, c["tokens-per-gpu"], c["routing"], c["placement"],
                           minibatch=minibatch, seed=c["seed"], num_slots=c.get("slots"), num_nodes=profile.num_nodes)
        return {"workload": w, "imbalance": None, "key": key}

    t0 = time.perf_counter()
    entry, built = _workloads.get_or(key, make)
    return entry, (time.perf_counter() - t0) if built else 0.0


def _imbalance(entry: dict) -> dict:
    if entry["imbalance"] is None:
        entry["imbalance"] = entry["workload"].imbalance()
    return entry["imbalance"]


def _event_point(c: dict, row: dict) -> None:
    from megamoe.simulator import simulate_workload
    from megamoe.simulator.simulate import default_minibatch

    p, _ = _profile(row["_options"])
    mb = default_minibatch(c["tokens-per-gpu"], p) if c.get("minibatch") is None else c["minibatch"]
    entry, row["workload_s"] = _workload(c, p, mb)
    w = entry["workload"]
    r = simulate_workload(w, p, schedule=c["schedule"], comm_sms=c.get("comm-sms"), dtype=c["dtype"],
                          weight_dtype=c.get("weight-dtype"), dispatch_dtype=c.get("dispatch-dtype"),
                          include_shared=not c["no-shared"], seed=c["seed"])
    row.update(mode="event", layer_time_us=r.layer_time_us, analytic_us=r.analytic_us)
    for k, col in _BREAKDOWN.items():
        row[col] = r.breakdown_us[k]
    _shape(row, _imbalance(entry), w)


def _analytic_point(c: dict, row: dict) -> None:
    from megamoe.simulator.analytic import compute_roofline_s, estimate, phase_bounds_s, rack_terms
    from megamoe.simulator.cost import normalize_dtype, row_bytes
    from megamoe.simulator.schedules import layer_start_s
    from megamoe.simulator.simulate import check_comm_sms, default_minibatch
    from megamoe.simulator.workload import minibatch_count

    p, compute_key = _profile(row["_options"])
    tg = c["tokens-per-gpu"]
    comm = check_comm_sms(c.get("comm-sms"), p)
    mb, nmb = minibatch_count(tg, default_minibatch(tg, p) if c.get("minibatch") is None else c["minibatch"])
    entry, row["workload_s"] = _workload(c, p, None)
    w = entry["workload"]
    cfg = w.config
    wd = normalize_dtype(c.get("weight-dtype") or c["dtype"])
    ad = normalize_dtype(c.get("dispatch-dtype") or c["dtype"])
    shared = not c["no-shared"]
    pkey = entry["key"]

    def roofline():
        return compute_roofline_s(w.rows_slot, w.placement.slot_rank, w.tokens_per_gpu if shared else 0, w.num_gpus,
                                  hidden=cfg.hidden_size, width=cfg.intermediate_size,
                                  shared_width=cfg.shared_intermediate_size, profile=p, weight_dtype=wd, act_dtype=ad)

    def traffic_bytes(dtype):
        return lambda: w.traffic_mb.sum(axis=1, keepdims=True) * row_bytes(cfg.hidden_size, dtype)

    comp = _pieces.get_or((pkey, compute_key, wd, ad, shared), roofline)[0]
    dis = _pieces.get_or((pkey, "bytes", ad), traffic_bytes(ad))[0]
    com = _pieces.get_or((pkey, "bytes", "bf16"), traffic_bytes("bf16"))[0]
    start = _pieces.get_or((pkey, compute_key, "start"), lambda: layer_start_s(p, cfg, tg))[0]
    terms = rack_terms(p, cfg, tg, comm_sms=comm, dispatch_dtype=ad, start_s=start)
    e = estimate(c["schedule"], compute_s=comp, dispatch_bytes=dis, combine_bytes=com, profile=p, **terms)
    dis_s, com_s = phase_bounds_s(c["schedule"], dis, com, p, terms["copy_bytes_per_s"], terms["copy_coefs"])
    t, cmax, cmean = e.time_s, float(comp.max()), float(comp.mean())
    row.update(mode="analytic", layer_time_us=e.time_us, analytic_us=e.time_us, expert_compute_us=cmean * 1e6,
               load_imbalance_wait_us=(cmax - cmean) * 1e6, exposed_comm_us=(t - cmax) * 1e6,
               dispatch_us=float(dis_s.max()) * 1e6, combine_us=float(com_s.max()) * 1e6)
    _shape(row, _imbalance(entry), w)
    row["minibatch_tokens"], row["num_minibatches"] = mb, nmb


def _compute_key(profile) -> str:
    """The profile without its fabric (link, switch, switch chips): what a GPU's roofline reads."""
    d = {k: v for k, v in profile.data.items() if k not in ("link", "switch", "name", "description")}
    d["system"] = {k: v for k, v in d["system"].items() if k != "num_switch_chips"}
    return json.dumps(d, sort_keys=True, default=str)


def _shape(row: dict, imb: dict, w) -> None:
    row["imbalance_by_gpu"], row["imbalance_by_expert"], row["imbalance_by_slot"] = (
        imb["by_gpu"], imb["by_expert"], imb["by_slot"])
    row.update(num_gpus=w.num_gpus, num_slots=w.placement.num_slots, minibatch_tokens=w.minibatch,
               num_minibatches=w.num_minibatches)


def run_point(point: Point) -> dict[str, Any]:
    """One point as a flat row: the inputs as given, then ``OUTPUTS``; never raises."""
    c = canonical(point.options)
    row: dict[str, Any] = {"point_id": point.point_id, "model": c["model"], "system": c["system"], **point.options}
    row.update(dict.fromkeys(OUTPUTS))
    row["_options"] = point.options
    t0 = time.perf_counter()
    row["mode"] = "analytic" if c["analytic"] else "event"
    try:
        (_analytic_point if c["analytic"] else _event_point)(c, row)
    except Exception as exc:  # noqa: BLE001 - a failing point is recorded, the sweep goes on
        for k in OUTPUTS:
            if k not in ("workload_s", "mode"):
                row[k] = None
        row["error"] = f"{type(exc).__name__}: {exc}"
    row["wall_s"] = time.perf_counter() - t0
    del row["_options"]
    return row


def run_batch(points: list[Point]) -> list[dict]:
    """Rows for points that share a workload (see ``workload_key``), in the order given."""
    return [run_point(p) for p in points]
