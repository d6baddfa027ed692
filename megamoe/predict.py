"""The cost model's prediction of one validation configuration from its pairs per expert: the
multi-launch launch plan or the megakernel's task plan, priced by ``megamoe.simulator``.

Shape legend: T tokens, E experts.
"""

from __future__ import annotations


def megakernel_task_plan(cfg, counts, T: int, *, device_name: str, profile, mk: dict | None = None):
    """The megakernel's task plan with the kernel's tiles, warps and programs (the config ``mk`` or
    ``megakernel_config``'s; P = SMs x occupancy, at most the tasks) -> (TaskPlan, num_warps,
    weight loads "tma" or "pointer")."""
    from megamoe.kernels import megakernel_config as cfgs
    from megamoe.reference.tiles import task_layout, task_plan

    mk = mk or _megakernel_config(cfg, T, device_name, profile)
    lay = task_layout(cfg, T, mk["tiles"])
    P = max(1, min(profile.num_sms * int(mk.get("occupancy", 1)), lay.max_tasks))
    return (task_plan(cfg, counts, T, mk["tiles"], num_programs=P), int(mk.get("num_warps", 4)),
            cfgs.megakernel_weight_loads(mk))


def _megakernel_config(cfg, T: int, device_name: str, profile) -> dict:
    """The config ``kernels.megakernel_config`` picks for this layer and T."""
    from megamoe.kernels.megakernel_config import megakernel_config

    return megakernel_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k,
                             cfg.shared_intermediate_size, T, num_sms=profile.num_sms,
                             interpret=device_name == "cpu-interpreter")


def megakernel_read_depth(mk: dict) -> int:
    """Bytes of operand tiles a megakernel program keeps in flight: its gemm1 tile's pipeline
    buffers (``gemm_shared_bytes``, bf16 rows, gate and up weight tiles)."""
    from megamoe.kernels.plan import gemm_shared_bytes

    g1 = mk["tiles"]["gemm1"]
    return gemm_shared_bytes({**g1, "num_stages": int(mk.get("num_stages", 1))}, 2, 2, 2)


def megakernel_weight_depth(mk: dict, w_bytes: float = 2.0) -> dict[str, int]:
    """{GEMM kind: weight bytes a megakernel program keeps in flight}: ``gemm_shared_bytes`` with no
    A bytes for gemm1 (gate and up) and gemm2 at the config's num_stages; ``w_bytes`` per element."""
    from megamoe.kernels.plan import gemm_shared_bytes

    g1, g2, st = mk["tiles"]["gemm1"], mk["tiles"]["gemm2"], int(mk.get("num_stages", 1))
    g2 = {"BLOCK_M": g1["BLOCK_M"], "BLOCK_N": g2["BLOCK_N"], "BLOCK_K": g2["BLOCK_K"]}
    return {"gemm1": gemm_shared_bytes({**g1, "num_stages": st}, 0, w_bytes, 2),
            "gemm2": gemm_shared_bytes({**g2, "num_stages": st}, 0, w_bytes, 1)}


def predict_config(cfg, counts, T: int, backend: str, profile, *, device_name: str, calls_per_graph: int,
                   triton_version: str | None = None, reps: int | None = None, mk: dict | None = None,
                   gemm: dict | None = None, shared_gemm: dict | None = None) -> dict:
    """Prediction for one configuration from its pairs per expert ``counts`` (E,): total and
    per-stage (multi) or per-kind (megakernel) us. ``triton_version``: the tuned table's (default
    this Triton). ``reps``: the measurement's timed replays (None: from idle clocks). ``mk``: the
    megakernel config the measurement ran (default the current one), returned under "megakernel_config".
    ``gemm`` / ``shared_gemm``: the multi-launch GEMM entries ({"gemm1", "gemm2"}) the measurement ran
    (default ``configs.select_config``'s, as ``launch_plan`` takes them)."""
    import numpy as np

    from megamoe.kernels.bench import calls_before_timed_replay
    from megamoe.kernels.plan import launch_plan
    from megamoe.reference.sizes import weight_bytes_per_element
    from megamoe.simulator.cost import predict_launch_plan, term_name
    from megamoe.simulator.task_cost import predict_task_plan

    counts = np.asarray(counts, dtype=np.int64)
    before = calls_before_timed_replay(calls_per_graph, reps) if reps else 0.0
    sustained = {}
    if backend == "multi":
        dtype = "float32" if device_name == "cpu-interpreter" else "bfloat16"
        plan = launch_plan(cfg, T, counts=counts, device_name=device_name, dtype=dtype, triton_version=triton_version,
                           gemm=gemm, shared_gemm=shared_gemm)
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
    mk = mk or _megakernel_config(cfg, T, device_name, profile)
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
