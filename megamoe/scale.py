"""``megamoe validate`` on a GPU: presets x T x routing x backend, each predicted before it is measured.

Shape legend: T tokens, E experts, K top-k, H hidden, NI inputs captured per CUDA graph.

A configuration is (preset, T, routing, backend). The run, in order:

1. compile ahead (``megamoe.warm``, on by default): side-by-side processes, one per (preset, T),
   run each configuration's kernels once so that Triton's on-disk cache holds them; nothing is
   timed there. A megakernel configuration compiles in 15-30 s, so this is most of the run;
2. per configuration, T-major (every preset, routing and backend at T = 1, then at T = 8, ...,
   so a run cut short by its budget still covers every preset at the smaller T): the layer's own
   router routes NI steered inputs (``routing_bias``, ``steer_inputs``); the cost model predicts
   the time from every profile given (the calibrated one first) and the row is written (phase
   "prediction"); then the layer is timed as a CUDA-graph replay of NI calls (median of --reps)
   and the row written again (phase "measurement"), or, if anything raised, with phase "failed"
   and the error. The megakernel's output is compared with the multi-launch path's on the same
   input (``rel_diff_vs_multi``);
3. the report (``validate.write_report``) from the measured rows, and a summary.

Guards: ``--budget`` (no configuration starts that its estimate says would end inside the 15 s
kept for the report; the compile-ahead gets at most half the budget); a watchdog per
configuration (``--config-timeout``, and never past the budget by more than a grace period)
that writes a failed row and the report, then exits with code 4; a lost CUDA context (an
illegal address poisons it) ends the run with code 3. ``--resume`` continues in the same folder
in a fresh process: configurations with an outcome are skipped, and one that has only its
prediction row (the process ended during it) is recorded as failed, not retried.

The device side is a "layer" object (``CudaLayer``; ``InterpreterLayer`` runs the same loop on the
CPU under TRITON_INTERPRET=1 on shrunken shapes, timing meaningless, for tests and smoke runs).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from .deadline import Budget, Watchdog, command_start
from .kernels.bench import calls_before_timed_replay, inputs_per_graph

#: the default GPU run: 3 presets x 6 T x 3 routings x 2 backends = 108 configurations. Three
#: presets that differ in what the model must get right: Qwen3-30B-A3B (128 small experts: fixed
#: and serial costs), Mixtral-8x7B (8 large experts: weight streaming and compute), DeepSeek-V3
#: (256 grouped sigmoid experts and a shared expert; 22 GB of weights). T <= 4096 alone is 90.
SCALE_PRESETS = "qwen3-30b-a3b,mixtral-8x7b,deepseek-v3"
SCALE_TOKENS = (1, 8, 64, 512, 4096, 16384)
ROUTINGS = ("uniform", "zipf", "concentrated")
BACKENDS = ("multi", "megakernel")
COMPARE_PROFILES = "h200"
REPORT_RESERVE_S = 15.0  # kept back from the budget for the report and the summary
GRACE_S = 20.0  # how far past the budget the watchdog lets one configuration run
UNWARMED_S = 30.0  # added to a configuration's estimate when its kernels are not compiled yet
CONFIG_TIMEOUT_S = 150.0
WARM_SHARE = 0.5  # of the budget, at most, for compiling ahead
WARM_MAX_S = 900.0  # without a budget
CONTEXT_LOST_EXIT = 3
#: the interpreter's shrunken layer: small, not tile multiples
CPU_SHAPE = dict(hidden_size=48, intermediate_size=40)


def calls_per_graph(T: int) -> int:
    """NI: fresh inputs (and calls) captured in one CUDA graph (kernels.bench.inputs_per_graph)."""
    return inputs_per_graph(T)


@dataclass(frozen=True)
class Configuration:
    preset: str
    T: int
    routing: str
    backend: str

    @property
    def key(self) -> str:
        return f"{self.preset}/T={self.T}/{self.routing}/{self.backend}"

    def fields(self) -> dict:
        return {"preset": self.preset, "T": self.T, "routing": self.routing, "backend": self.backend}


def configurations(presets, tokens, routings, backends) -> list[Configuration]:
    """Every configuration, T-major: all presets, routings and backends at the first T, then the next."""
    return [Configuration(p, int(T), r, b) for T in tokens for p in presets for r in routings for b in backends]


def key_of(row: dict) -> str:
    return Configuration(row["preset"], int(row["T"]), row.get("routing", "uniform"), row.get("backend", "multi")).key


# --------------------------------------------------------------------------- inputs
def routing_bias(cfg, routing: str, seed: int = 0):
    """(E,) logit bias that steers the layer's own router: 0 (uniform), Zipf(1.2)-like preferences
    (zipf), or +30 on the K experts 0..K-1 (concentrated: every token on the same K experts; they
    share one expert group, so grouped top-k keeps them)."""
    import numpy as np

    E, K = cfg.num_experts, cfg.top_k
    if routing == "uniform":
        return np.zeros(E)
    if routing == "zipf":
        rank = np.random.default_rng(seed).permutation(E) + 1
        return -1.2 * np.log(rank) * 2.0
    if routing == "concentrated":
        b = np.zeros(E)
        b[:K] = 30.0
        return b
    raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")


def steer_inputs(xs: list, router_weight, bias) -> tuple[list, object]:
    """Inputs x (T, H) and a copy of router_weight (E, H) that carry ``bias`` (E,) into the logits:
    x[:, 0] = 1 and W[:, 0] = bias. A zero bias changes nothing (no copies)."""
    import torch

    if not bias.any():
        return list(xs), router_weight
    w = router_weight.clone()
    w[:, 0] = torch.as_tensor(bias, device=w.device, dtype=torch.float32).to(w.dtype)
    out = []
    for x in xs:
        x = x.clone()
        x[:, 0] = 1.0
        out.append(x)
    return out, w


def shrink_for_interpreter(cfg):
    """The preset's layer at interpreter size: H = 48, I = 40, at most 16 experts and top-4."""
    return cfg.replace(**CPU_SHAPE, shared_intermediate_size=56 * cfg.num_shared_experts,
                       num_experts=min(cfg.num_experts, 16),
                       **({"n_group": min(cfg.n_group, 4), "topk_group": min(cfg.topk_group, 2)}
                          if cfg.n_group > 1 else {}),
                       top_k=min(cfg.top_k, 4))


# --------------------------------------------------------------------------- the device side
class CudaLayer:
    """Weights, steered inputs, the kernels' routing, forward and CUDA-graph timing, in bf16 on the GPU."""

    kind = "cuda"
    device = "cuda"

    def __init__(self):
        import torch

        self.torch = torch
        self.dtype = torch.bfloat16

    def config(self, preset: str):
        from megamoe.reference import MoEConfig

        return MoEConfig.preset(preset)

    def weights(self, cfg, seed: int):
        from megamoe.kernels.bench import random_device_weights

        return random_device_weights(cfg, seed)

    def device_name(self) -> str:
        return self.torch.cuda.get_device_name(0)

    def provenance(self) -> dict:
        from megamoe.kernels.bench import provenance

        p = provenance()
        p["num_sms"] = int(self.torch.cuda.get_device_properties(0).multi_processor_count)
        return p

    def inputs(self, cfg, w, T: int, routing: str, seed: int, n: int):
        """n steered inputs (T, H) and the weights with the steered router -> (xs, ws)."""
        torch = self.torch
        gen = torch.Generator(device=self.device).manual_seed(seed + T)
        base = [torch.randn((T, cfg.hidden_size), generator=gen, device=self.device, dtype=self.dtype) for _ in range(n)]
        xs, rw = steer_inputs(base, w.router_weight, routing_bias(cfg, routing, seed))
        return xs, dataclasses.replace(w, router_weight=rw)

    def routing(self, x, ws, cfg):
        """topk_idx (T, K) int32 as a NumPy array: the kernels' own router on x."""
        from megamoe import kernels

        return kernels.moe_forward_details(x, ws, cfg)["topk_idx"].cpu().numpy()

    def forward(self, x, ws, cfg, backend: str):
        from megamoe import kernels

        return kernels.moe_forward(x, ws, cfg, check=False, backend=backend)

    def time_us(self, cfg, ws, xs: list, backend: str, reps: int) -> float:
        """Median per-call us of the layer's CUDA graph (kernels.bench.graph_time_us); the SM clock
        and power sampled over its timed replays are left in ``last_clock`` (kernels.telemetry)."""
        from megamoe.kernels.bench import graph_time_us

        self.last_clock = {}
        return graph_time_us(lambda a: self.forward(a, ws, cfg, backend), list(xs), reps, clock=self.last_clock)

    def stage_us(self, cfg, ws, xs: list, reps: int, total_us: float, idle_s: float = 0.0) -> dict:
        """The multi-launch path's stages as measured (kernels.bench.stage_split): CUDA-graph times
        of its prefixes (kernels.moe._forward's ``stop_after``) and ``total_us``, the whole layer's;
        each prefix after ``idle_s`` seconds idle (``idle``) where that is above 0."""
        from megamoe.kernels import moe as kmoe
        from megamoe.kernels.bench import BREAKDOWN_STOPS, graph_time_us, stage_split

        pre = {}
        for stop in BREAKDOWN_STOPS:
            if idle_s > 0:
                self.idle(idle_s)
            pre[stop] = graph_time_us(lambda a, stop=stop: kmoe._forward(a, ws, cfg, True, stop), list(xs), reps)
        return stage_split(pre, total_us)

    def idle(self, seconds: float) -> None:
        """Wait for the GPU's queued work, then leave it idle ``seconds``."""
        self.torch.cuda.synchronize()
        time.sleep(seconds)

    def rel_diff(self, y, ref) -> float:
        """||y - ref|| / ||ref|| in float32."""
        d = (y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)
        return float(d.item())

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def alive(self) -> bool:
        """Whether the CUDA context still works (an illegal address or a device assert poisons it)."""
        try:
            self.torch.cuda.synchronize()
            return float(self.torch.ones(1, device=self.device).add_(1).item()) == 2.0
        except Exception:  # noqa: BLE001 - any failure here means the context is gone
            return False

    def free(self) -> None:
        self.torch.cuda.empty_cache()

    def free_memory(self) -> float:
        return float(self.torch.cuda.mem_get_info()[0])

    def weight_bytes(self, cfg) -> float:
        from megamoe.reference.sizes import expert_bytes, router_bytes, shared_bytes

        return float(cfg.num_experts * expert_bytes(cfg, "bfloat16") + shared_bytes(cfg, "bfloat16")
                     + router_bytes(cfg, "bfloat16"))

    def job_bytes(self, cfg, T: int) -> float:
        """GPU memory a compile-ahead process for (cfg, T) needs, estimated: its weights, one
        forward's buffers (x and its steered copy, the KS pair rows in up to fp32, y, the padded
        activation rows, the shared activation), with a quarter more, and 1.5 GB for the context."""
        H, I, K, E = cfg.hidden_size, cfg.intermediate_size, cfg.top_k, cfg.num_experts
        KS = K + (1 if cfg.num_shared_experts else 0)
        fwd = (3 * T * H * 2 + T * KS * H * 4 + (T * K + min(E, T * K) * 128) * I * 2
               + T * cfg.shared_intermediate_size * 2)
        return self.weight_bytes(cfg) + 1.25 * fwd + 1.5e9


class InterpreterLayer(CudaLayer):
    """The same loop on the CPU: Triton's interpreter (TRITON_INTERPRET=1 before triton is
    imported) on the preset shrunk by ``shrink_for_interpreter``, float32. ``time_us`` is one call's
    wall time: it exercises the run, it measures nothing."""

    kind = "interpreter"
    device = "cpu"

    def __init__(self):
        os.environ.setdefault("TRITON_INTERPRET", "1")
        import torch

        self.torch = torch
        self.dtype = torch.float32

    def config(self, preset: str):
        return shrink_for_interpreter(super().config(preset))

    def weights(self, cfg, seed: int):
        from megamoe.reference import random_weights

        return random_weights(cfg, seed).to_torch(device="cpu", dtype=self.torch.float32)

    def device_name(self) -> str:
        return "cpu-interpreter"

    def provenance(self) -> dict:
        import datetime as dt

        import triton

        from megamoe.kernels.bench import git_state

        return {"gpu": "cpu-interpreter", "torch": self.torch.__version__, "triton": triton.__version__, **git_state(),
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "num_sms": 132}

    def time_us(self, cfg, ws, xs: list, backend: str, reps: int) -> float:
        t = time.perf_counter()
        self.forward(xs[0], ws, cfg, backend)
        return (time.perf_counter() - t) * 1e6

    def idle(self, seconds: float) -> None:
        """Nothing to cool down on the CPU: the interpreter's loop does not wait."""

    def stage_us(self, cfg, ws, xs: list, reps: int, total_us: float, idle_s: float = 0.0) -> dict:
        """Each prefix run once, by wall time (exercises the breakdown; measures nothing)."""
        from megamoe.kernels import moe as kmoe
        from megamoe.kernels.bench import BREAKDOWN_STOPS, stage_split

        pre = {}
        for stop in BREAKDOWN_STOPS:
            t = time.perf_counter()
            kmoe._forward(xs[0], ws, cfg, True, stop)
            pre[stop] = (time.perf_counter() - t) * 1e6
        return stage_split(pre, total_us)

    def sync(self) -> None:
        pass

    def alive(self) -> bool:
        return True

    def free(self) -> None:
        pass

    def free_memory(self) -> float:
        return 64e9


def make_layer(kind: str) -> CudaLayer:
    if kind == "cuda":
        return CudaLayer()
    if kind == "interpreter":
        return InterpreterLayer()
    raise ValueError(f"layer kind must be 'cuda' or 'interpreter', got {kind!r}")


class WeightCache:
    """Each preset's weights made once and kept while they fit in ``limit_bytes``; the least
    recently used are dropped first (they are remade from the seed if needed again)."""

    def __init__(self, layer: CudaLayer, seed: int, limit_bytes: float):
        self.layer, self.seed, self.limit = layer, seed, limit_bytes
        self._held: dict[str, tuple] = {}  # preset -> (cfg, weights, bytes), in use order

    def get(self, preset: str):
        if preset in self._held:
            self._held[preset] = self._held.pop(preset)
            return self._held[preset][:2]
        cfg = self.layer.config(preset)
        need = self.layer.weight_bytes(cfg)
        while self._held and sum(b for *_, b in self._held.values()) + need > self.limit:
            self._held.pop(next(iter(self._held)))
            self.layer.free()
        w = self.layer.weights(cfg, self.seed)
        self._held[preset] = (cfg, w, need)
        return cfg, w


# --------------------------------------------------------------------------- predictions
def megakernel_task_plan(cfg, counts, T: int, *, device_name: str, profile, mk: dict | None = None):
    """The megakernel's task plan for this routing, with the tiles, warps and programs the kernel
    launches with (``kernels.configs.megakernel_config``, or the config ``mk``; P = SMs x occupancy,
    never more than the tasks, as ``kernels.megakernel.num_programs``). -> (TaskPlan, num_warps,
    weight loads: "tma" where the config reads the weights through descriptors, else "pointer")."""
    from megamoe.kernels import megakernel_config as cfgs
    from megamoe.reference.tiles import task_layout, task_plan

    if mk is None:
        mk = cfgs.megakernel_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k,
                                    cfg.shared_intermediate_size, T, num_sms=profile.num_sms,
                                    interpret=device_name == "cpu-interpreter")
    lay = task_layout(cfg, T, mk["tiles"])
    P = max(1, min(profile.num_sms * int(mk.get("occupancy", 1)), lay.max_tasks))
    return (task_plan(cfg, counts, T, mk["tiles"], num_programs=P), int(mk.get("num_warps", 4)),
            cfgs.megakernel_weight_loads(mk))


def megakernel_read_depth(mk: dict) -> int:
    """Bytes of operand tiles one megakernel program keeps in flight: its GEMM 1 tasks' pipeline
    buffers (``kernels.plan.gemm_shared_bytes`` of the gemm1 tile at the config's num_stages, bf16
    rows, gate and up weight tiles), which the cost model's USE_L2_READ_DEPTH reads."""
    from megamoe.kernels.plan import gemm_shared_bytes

    g1 = mk["tiles"]["gemm1"]
    return gemm_shared_bytes({**g1, "num_stages": int(mk.get("num_stages", 1))}, 2, 2, 2)


def megakernel_weight_depth(mk: dict, w_bytes: float = 2.0) -> dict[str, int]:
    """{GEMM kind: weight bytes one megakernel program keeps in flight in its loop}: the pipeline
    buffers' weight tiles (``kernels.plan.gemm_shared_bytes`` with no A bytes, the hbm_deep step's
    depth, ``kernels.microbench_deep.deep_read_depth``) of GEMM 1 (gate and up tiles) and GEMM 2 at
    the config's num_stages and GEMM 1's BLOCK_M, ``w_bytes`` a weight element; the cost model's
    USE_TASK_DEEP_READ reads it. Qwen3-30B-A3B T = 64 (64 x 128 x 64, 5 stages): 163,840 and 81,920."""
    from megamoe.kernels.plan import gemm_shared_bytes

    g1, g2, st = mk["tiles"]["gemm1"], mk["tiles"]["gemm2"], int(mk.get("num_stages", 1))
    g2 = {"BLOCK_M": g1["BLOCK_M"], "BLOCK_N": g2["BLOCK_N"], "BLOCK_K": g2["BLOCK_K"]}
    return {"gemm1": gemm_shared_bytes({**g1, "num_stages": st}, 0, w_bytes, 2),
            "gemm2": gemm_shared_bytes({**g2, "num_stages": st}, 0, w_bytes, 1)}


def predict_config(cfg, counts, T: int, backend: str, profile, *, device_name: str, calls_per_graph: int,
                   triton_version: str | None = None, reps: int | None = None, mk: dict | None = None) -> dict:
    """The prediction for one configuration from its pairs per expert ``counts`` (E,) (both plans
    read only those): total and per-stage (multi) or per-kind (megakernel) us.
    ``triton_version``: the tuned table's version (default this process's Triton; megamoe.repredict
    passes the stored row's, whose run picked its configs by it). ``reps``: the timed replays of the
    measurement (``kernels.bench.graph_time_us``): the calls run before its median replay
    (``calls_before_timed_replay``) start the busy window USE_SUSTAINED_CLOCKS reads; None: the
    timed graph from idle clocks. ``mk``: the megakernel's config as the measurement ran it (a stored
    row's ``megakernel_config``; default the config ``kernels.configs.megakernel_config`` gives now);
    megakernel predictions return the config they priced under "megakernel_config"."""
    import numpy as np

    from megamoe.kernels.plan import launch_plan
    from megamoe.reference.sizes import weight_bytes_per_element
    from megamoe.simulator.cost import predict_launch_plan, term_name
    from megamoe.simulator.task_cost import predict_task_plan

    counts = np.asarray(counts, dtype=np.int64)
    before = calls_before_timed_replay(calls_per_graph, reps) if reps else 0.0
    sustained = {}
    if backend == "multi":
        dtype = "float32" if device_name == "cpu-interpreter" else "bfloat16"
        plan = launch_plan(cfg, T, counts=counts, device_name=device_name, dtype=dtype, triton_version=triton_version)
        pred = predict_launch_plan([s.to_dict() for s in plan.stages], profile, calls_per_graph=calls_per_graph,
                                   calls_before=before)
        if "sustained_ratio" in pred:
            sustained["predicted_sustained_ratio"] = pred["sustained_ratio"]
        main = max(pred["stages"], key=lambda s: s["time_us"]) if pred["stages"] else {"name": "-", "bound": "launch"}
        return {"predicted_us": pred["time_us"], "predicted_fixed_us": pred["fixed_us"],
                "predicted_stages": {s["name"]: {"us": s["time_us"], "bound": s["bound"],
                                                 "term": term_name(s["bound"], s.get("memory_term"))}
                                     for s in pred["stages"]},
                "dominant": f"{main['name']}:{main['bound']}",
                "dominant_term": term_name(main["bound"], main.get("memory_term")), **sustained}
    from megamoe.kernels import megakernel_config as cfgs

    if mk is None:
        mk = cfgs.megakernel_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k,
                                    cfg.shared_intermediate_size, T, num_sms=profile.num_sms,
                                    interpret=device_name == "cpu-interpreter")
    tp, warps, loads = megakernel_task_plan(cfg, counts, T, device_name=device_name, profile=profile, mk=mk)
    pred = predict_task_plan(tp, profile, num_warps=warps, calls_per_graph=calls_per_graph, weight_loads=loads,
                             calls_before=before, read_depth=megakernel_read_depth(mk),
                             weight_depth=megakernel_weight_depth(mk, weight_bytes_per_element(cfg.weight_dtype)))
    if "sustained_ratio" in pred:
        sustained["predicted_sustained_ratio"] = pred["sustained_ratio"]
    crit = {k: v for k, v in pred["critical_path_us"].items() if v > 0}
    main = max(crit, key=crit.get) if crit else "-"

    def bound_of(kind: str) -> tuple[str, str]:  # the kind's tasks' most common bound, and its term
        by = pred["bound_tasks"].get(kind, {})
        b = max(by, key=by.get) if by else "wait"
        l2 = b == "memory" and 2 * pred.get("l2_bound_tasks", {}).get(kind, 0) > by.get("memory", 0)
        return b, term_name(b, "l2" if l2 else "hbm")

    stages = {}
    for k, v in crit.items():
        b, term = bound_of(k)
        stages[k] = {"us": v, "bound": b, "term": term}
    b, term = bound_of(main)
    return {"predicted_us": pred["time_us"], "predicted_fixed_us": pred["fixed_us"] + pred["launch_us"],
            "predicted_stages": stages, "busy_us": pred["busy_us"],
            "tasks": pred["tasks"], "programs": pred["programs"],
            "dominant": f"{main}:{b}", "dominant_term": term, "megakernel_config": mk, **sustained}


def predict_all(cfg, counts, T: int, backend: str, profiles: list, *, device_name: str, calls: int,
                reps: int | None = None, variants: dict | None = None) -> dict:
    """The row's prediction fields: the first profile's at the top level (``predicted_us``,
    ``dominant``, ...) and every profile's total under ``predictions[name]``; each of ``variants``
    ({label: cost switches}, repredict.parse_variants) predicted with the first profile and those
    switches set, under ``predictions[f"{name}+{label}"]``. A prediction that raises gets
    ``{"failure": ...}`` there (and, if it is the first profile's, no predicted_us). ``counts`` (pairs
    per expert) go into the row too: with them it can be predicted again offline."""
    from .repredict import switches

    out: dict = {"predictions": {}, "counts": [int(c) for c in counts]}
    runs = [(p.name, p, {}) for p in profiles]
    if profiles:
        runs += [(f"{profiles[0].name}+{label}", profiles[0], s) for label, s in (variants or {}).items()]
    for i, (name, p, settings) in enumerate(runs):
        try:
            with switches(settings):
                pr = predict_config(cfg, counts, T, backend, p, device_name=device_name, calls_per_graph=calls,
                                    reps=reps)
        except Exception as exc:  # noqa: BLE001 - the measurement is still worth having
            out["predictions"][name] = {"failure": f"{type(exc).__name__}: {exc}"[:500]}
            continue
        out["predictions"][name] = {k: pr[k] for k in ("predicted_us", "predicted_fixed_us", "dominant",
                                                       "dominant_term") if k in pr}
        if i == 0:
            out.update(pr)
    return out


# --------------------------------------------------------------------------- rows
def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


class RowWriter:
    """Appends JSON rows to one file, flushed at once; safe to call from the watchdog's thread."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write(self, row: dict) -> None:
        line = json.dumps(row, default=_json_default) + "\n"
        if not self._lock.acquire(timeout=5.0):
            return
        try:
            with self.path.open("a") as f:
                f.write(line)
                f.flush()
        finally:
            self._lock.release()


def row_files(out: Path) -> list[Path]:
    return sorted(Path(out).glob("validation_*.jsonl"))


def previous_outcomes(out: Path) -> dict[str, dict]:
    """key -> the last row of each configuration in ``out``'s validation_*.jsonl files."""
    last: dict[str, dict] = {}
    for p in row_files(out):
        for line in p.read_text().splitlines():
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:  # a line cut short when a run was killed
                continue
            if isinstance(r, dict) and "preset" in r and "T" in r:
                last[key_of(r)] = r
    return last


# --------------------------------------------------------------------------- the run
@dataclass
class RunState:
    """What the run has done, for the progress lines, the summary and the watchdog."""

    total: int
    measured: list = dataclasses.field(default_factory=list)
    failed: list = dataclasses.field(default_factory=list)
    not_reached: list = dataclasses.field(default_factory=list)
    resumed: int = 0
    stop_reason: str | None = None
    current: Configuration | None = None
    current_row: dict | None = None
    warm_s: float = 0.0
    warm_status: dict = dataclasses.field(default_factory=dict)
    durations: dict = dataclasses.field(default_factory=dict)  # (T, backend) -> seconds of the last one

    def done(self) -> int:
        return len(self.measured) + len(self.failed)

    def estimate(self, c: Configuration) -> float:
        """Seconds the configuration will take: the last one at this T and backend, else 1.5 x the
        slowest so far (at least 2 s); plus UNWARMED_S if its kernels were not compiled ahead."""
        est = self.durations.get((c.T, c.backend))
        if est is None:
            est = max(2.0, 1.5 * max(self.durations.values(), default=2.0))
        if self.warm_status and self.warm_status.get(c.key) != "ok":
            est += UNWARMED_S
        return est


def _profiles(args) -> list:
    """The profiles that predict: --profile (or --system) first, then --compare-profiles, each once."""
    from megamoe.simulator import load_profile

    out = [load_profile(args.profile or args.system)]
    for spec in (s.strip() for s in (args.compare_profiles or "").split(",")):
        if spec:
            p = load_profile(spec)
            if p.name not in {q.name for q in out}:
                out.append(p)
    return out


def _fmt_us(v) -> str:
    return f"{v:10.1f}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{'-':>10}"


def progress_line(state: RunState, budget: Budget, c: Configuration, row: dict, profiles: list) -> str:
    n = state.done() + state.resumed
    head = f"{budget.stamp()} {n:>3}/{state.total} {c.preset:<14} T={c.T:<6} {c.routing:<12} {c.backend:<10}"
    if row.get("phase") == "failed":
        return f"{head} FAILED: {row.get('failure', '?')[:200]}"
    s = f"{head} pred {_fmt_us(row.get('predicted_us'))} us"
    for p in profiles[1:]:
        s += f" ({p.name} {_fmt_us(row['predictions'].get(p.name, {}).get('predicted_us')).strip()})"
    s += f"  meas {_fmt_us(row.get('measured_us'))} us"
    if isinstance(row.get("error"), float):
        s += f"  err {row['error']:+.1%}"
    if "rel_diff_vs_multi" in row:
        s += f"  vs multi {row['rel_diff_vs_multi']:.1e}"
    return s + f"  ({row.get('seconds', 0.0):.1f} s)"


def run_scale(args, layer: CudaLayer | None = None) -> int:
    """The GPU run (module docstring). ``layer``: the device side (default: CUDA if present, else
    the interpreter). Returns 0, CONTEXT_LOST_EXIT when the CUDA context was lost (rerun with
    --resume), or exits with the watchdog's code from its thread."""
    import datetime as dt

    from . import warm
    from .validate import load_outcomes, write_report

    budget = Budget(args.budget, start=command_start())  # the seconds spent importing count too
    if layer is None:
        layer = make_layer("cuda" if _cuda() else "interpreter")
    profiles = _profiles(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    writer = RowWriter(out / f"validation_{dt.date.today().isoformat()}.jsonl")
    presets = [m.strip() for m in args.models.split(",") if m.strip()]
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    routings = [r.strip() for r in args.routings.split(",") if r.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    configs = configurations(presets, tokens, routings, backends)
    state = RunState(total=len(configs))
    prior = previous_outcomes(out) if args.resume else {}
    prov = layer.provenance()
    dev_name = prov["gpu"]
    reps = args.reps
    log = _log

    for c in configs:  # a resumed configuration whose process ended during it: failed, not retried
        r = prior.get(c.key)
        if r is not None and r.get("phase") == "prediction":
            r = {**r, "phase": "failed", "failure": "interrupted: an earlier run ended during this configuration "
                 "(hang, crash or time limit); not retried"}
            writer.write(r)
            prior[c.key] = r
    todo = [c for c in configs if c.key not in prior]
    state.resumed = len(configs) - len(todo)
    log(f"megamoe validate: {len(configs)} configurations ({len(presets)} presets x {len(tokens)} T x "
        f"{len(routings)} routings x {len(backends)} backends), {len(todo)} to run"
        + (f" ({state.resumed} done in an earlier run)" if state.resumed else "")
        + f"; budget {'none' if args.budget is None else f'{args.budget:.0f} s'}; profiles "
        + ", ".join(p.name for p in profiles) + f"; {dev_name}, torch {prov.get('torch')}, triton {prov.get('triton')}")

    def finish(notes=()) -> dict:
        """The report from every row in ``out`` (this run's and earlier ones'), and the summary."""
        measured, failed = load_outcomes(out)
        summary = run_summary(state, budget, measured, failed, profiles, out)
        from .repredict import switch_note

        sw_note = switch_note(getattr(args, "cost_switches", None) or {}, "this run's predictions")
        for label, settings in (getattr(args, "variants", None) or {}).items():
            sw_note += switch_note({**(getattr(args, "cost_switches", None) or {}), **settings},
                                   f"the variant {profiles[0].name}+{label} (also predicted before each measurement)")
        write_report(measured, out, notes=[*notes, *sw_note, *summary["notes"]], failures=failed, run=summary)
        for line in summary["lines"]:
            print(line, flush=True)
        return summary

    def on_fire(what: str) -> None:  # the watchdog's thread: the main one is stuck in the GPU
        c, row = state.current, state.current_row
        if c is not None:
            timeout = args.config_timeout
            row = {**(row or {}), **c.fields(), **prov, "phase": "failed",
                   "failure": f"no result after {timeout:.0f} s or past the budget (a GPU hang or a compile "
                              "too slow for the budget); the watchdog ended the run"}
            writer.write(row)
            state.failed.append(row)
        state.stop_reason = f"watchdog: {what} did not finish"
        ended = {key_of(r) for r in state.measured + state.failed}
        state.not_reached = [t for t in todo if t.key not in ended and t != c]
        finish()

    watchdog = Watchdog(on_fire, name="megamoe validate")
    old_term = _exit_on_sigterm()
    try:
        if args.warm and todo:
            t = time.monotonic()
            span = WARM_MAX_S if args.budget is None else min(WARM_SHARE * args.budget, budget.left() - REPORT_RESERVE_S)
            deadline = t + max(0.0, span)
            jobs = warm.plan_jobs(todo, lambda preset, T: layer.job_bytes(layer.config(preset), T))
            state.warm_status = warm.run_jobs(
                jobs, folder=out / "warm", layer_kind=layer.kind, seed=args.seed, procs=args.warm_procs,
                memory_bytes=0.9 * layer.free_memory(), deadline=deadline, config_timeout_s=args.config_timeout,
                log=lambda s: log(f"{budget.stamp()} warm: {s}"))
            state.warm_s = time.monotonic() - t
            ok = sum(v == "ok" for v in state.warm_status.values())
            log(f"{budget.stamp()} warm-up: {ok}/{len(state.warm_status)} configurations compiled in "
                f"{state.warm_s:.0f} s (statuses in {out / 'warm' / 'warm_status.json'})")
        code = _measure_all(todo, args, layer, profiles, writer, state, budget, watchdog, prov, reps)
    except BaseException as exc:  # Ctrl-C or a bug: still the report from what was measured
        state.stop_reason = {KeyboardInterrupt: "interrupted (Ctrl-C)", SystemExit: "terminated (SIGTERM)"}.get(
            type(exc), f"error: {exc!r}"[:300])
        finish()
        raise
    finally:
        watchdog.close()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    finish()
    return code


def _exit_on_sigterm():
    """SIGTERM (the driver's timeout) raises SystemExit(143) in the main thread, so that the
    compile-ahead's processes are killed and the report is written on the way out; returns the
    handler it replaced (None off the main thread, where signals cannot be set)."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


def _measure_all(todo, args, layer, profiles, writer, state, budget, watchdog, prov, reps) -> int:
    import numpy as np

    weights = WeightCache(layer, args.seed, 0.6 * layer.free_memory())
    dev_name = prov["gpu"]
    group_key, group = None, None
    for i, c in enumerate(todo):
        if state.stop_reason:
            state.not_reached.append(c)
            continue
        est = state.estimate(c)
        if not budget.allows(est, reserve_s=REPORT_RESERVE_S):
            state.stop_reason = (f"budget: {budget.left():.0f} s left, the next configuration ({c.key}) was "
                                 f"estimated at {est:.0f} s and {REPORT_RESERVE_S:.0f} s are kept for the report")
            _log(f"{budget.stamp()} {state.stop_reason}; {len(todo) - i} configuration(s) not started")
            state.not_reached.append(c)
            continue
        t0 = time.monotonic()
        row = {**c.fields(), "profile": profiles[0].name, "reps": reps, **prov}
        state.current, state.current_row = c, row
        watchdog.arm(min(args.config_timeout, max(budget.left(), 0.0) + GRACE_S), c.key)
        try:
            warm_says = state.warm_status.get(c.key, "")
            if warm_says.startswith(("crashed", "hung")):
                raise RuntimeError(f"not measured: in the compile-ahead this configuration {warm_says}")
            if group_key != (c.preset, c.T, c.routing):
                group_key, group = (c.preset, c.T, c.routing), None
                layer.free()
                cfg, w = weights.get(c.preset)
                ni = calls_per_graph(c.T)
                xs, ws = layer.inputs(cfg, w, c.T, c.routing, args.seed, ni)
                idx = layer.routing(xs[0], ws, cfg)
                counts = np.bincount(idx.reshape(-1).astype(np.int64), minlength=cfg.num_experts)
                group = {"cfg": cfg, "xs": xs, "ws": ws, "counts": counts, "ni": ni, "y": {}}
            cfg, xs, ws, counts = group["cfg"], group["xs"], group["ws"], group["counts"]
            row.update(calls_per_graph=group["ni"], experts_touched=int((counts > 0).sum()),
                       max_over_mean_load=float(counts.max() / max(counts.mean(), 1e-9)))
            row.update(predict_all(cfg, counts, c.T, c.backend, profiles, device_name=dev_name,
                                   calls=group["ni"], reps=reps, variants=getattr(args, "variants", None)))
            if getattr(args, "cost_switches", None):
                row["cost_switches"] = dict(args.cost_switches)
            if getattr(args, "variants", None):
                row["cost_variants"] = {k: dict(v) for k, v in args.variants.items()}
            writer.write({**row, "phase": "prediction"})  # before anything is timed
            idle = float(getattr(args, "idle_before", 0.0) or 0.0)
            if idle > 0:
                row["idle_before_s"] = idle
                layer.idle(idle)
            row["measured_us"] = layer.time_us(cfg, ws, xs, c.backend, reps)
            if getattr(layer, "last_clock", None):  # a diagnostic: the clock the layer ran at
                row["measured_clock"] = layer.last_clock
            if c.backend == "multi" and getattr(args, "stages", True):
                row["measured_stages_us"] = layer.stage_us(cfg, ws, xs, reps, row["measured_us"], idle_s=idle)
            y = layer.forward(xs[0], ws, cfg, c.backend)
            group["y"][c.backend] = y
            ref = group["y"].get("multi") if c.backend != "multi" else None
            if ref is not None:
                row["rel_diff_vs_multi"] = layer.rel_diff(y, ref)
            m = row["measured_us"]
            if isinstance(row.get("predicted_us"), float):
                row["error"] = (row["predicted_us"] - m) / m
            for p in row["predictions"].values():
                if "predicted_us" in p:
                    p["error"] = (p["predicted_us"] - m) / m
            row["phase"] = "measurement"
        except Exception as exc:  # noqa: BLE001 - one configuration's failure is a row, not the end
            row.update(phase="failed", failure=f"{type(exc).__name__}: {exc}"[:1000],
                       traceback=traceback.format_exc(limit=6)[-2000:])
        row["seconds"] = round(time.monotonic() - t0, 2)
        watchdog.disarm()
        writer.write(row)
        state.current, state.current_row = None, None
        (state.measured if row["phase"] == "measurement" else state.failed).append(row)
        state.durations[(c.T, c.backend)] = row["seconds"]
        print(progress_line(state, budget, c, row, profiles), flush=True)
        if row["phase"] == "failed":
            group_key = None if group is None else group_key
            if not layer.alive():
                state.stop_reason = (f"the CUDA context was lost at {c.key} ({row['failure'][:200]}); "
                                     "rerun with --resume to go on in a fresh process")
                _log(f"{budget.stamp()} {state.stop_reason}")
                state.not_reached.extend(todo[i + 1:])
                return CONTEXT_LOST_EXIT
            layer.free()
    return 0


def run_summary(state: RunState, budget: Budget, measured: list, failed: list, profiles: list, out: Path) -> dict:
    """Counts, errors per profile and backend, what stopped the run, the files: as data and as lines."""
    import statistics

    lines = [f"megamoe validate: {len(state.measured)} measured, {len(state.failed)} failed, {len(state.not_reached)} "
             f"not reached of {state.total} configurations in {budget.elapsed():.0f} s (compile-ahead "
             f"{state.warm_s:.0f} s)" + (f"; {state.resumed} from earlier runs" if state.resumed else "")]
    per_profile: dict = {}
    for p in profiles:
        errs: dict[str, list] = {}
        for r in measured:
            e = r.get("predictions", {}).get(p.name, {}).get("error")
            if e is None and p is profiles[0] and "predictions" not in r and r.get("predicted_us"):
                e = (r["predicted_us"] - r["measured_us"]) / r["measured_us"]
            if e is not None:
                errs.setdefault(r.get("backend", "multi"), []).append(abs(e))
        allv = [v for vs in errs.values() for v in vs]
        if allv:
            per_profile[p.name] = {"configurations": len(allv), "median_abs_error": statistics.median(allv),
                                   "by_backend": {b: statistics.median(v) for b, v in sorted(errs.items())}}
            lines.append(f"  {p.name:<18} median |pred - meas| / meas {statistics.median(allv):6.1%} over {len(allv)} ("
                         + ", ".join(f"{b} {statistics.median(v):.1%}" for b, v in sorted(errs.items())) + ")")
    diffs = [r["rel_diff_vs_multi"] for r in measured if "rel_diff_vs_multi" in r]
    if diffs:
        lines.append(f"  megakernel output vs multi-launch: largest relative difference {max(diffs):.1e} over {len(diffs)}")
    for r in failed[:8]:
        lines.append(f"  failed: {key_of(r)}: {str(r.get('failure', '?'))[:160]}")
    if len(failed) > 8:
        lines.append(f"  ... and {len(failed) - 8} more failed (report.md)")
    notes = []
    if state.stop_reason:
        notes.append(f"stopped early: {state.stop_reason}")
        lines.append(f"  stopped early: {state.stop_reason}")
    if state.not_reached:
        notes.append(f"{len(state.not_reached)} configuration(s) not reached, first {state.not_reached[0].key}")
    lines.append(f"  rows: {', '.join(str(p) for p in row_files(out))}; report: {out / 'report.md'}, {out / 'scatter.png'}")
    return {"measured": len(state.measured), "failed": len(state.failed), "not_reached": [c.key for c in state.not_reached],
            "resumed": state.resumed, "total": state.total, "elapsed_s": round(budget.elapsed(), 1),
            "warm_s": round(state.warm_s, 1), "stop_reason": state.stop_reason, "by_profile": per_profile,
            "max_rel_diff_vs_multi": max(diffs) if diffs else None, "notes": notes, "lines": lines}


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _log(s: str) -> None:
    print(s, file=sys.stderr, flush=True)
