"""megamoe.simulator: predict one MoE layer's time on a rack of GPUs (SimPy + flow-level NVLink model).

Shape legend: T tokens, E experts, P expert slots, K top-k, H hidden, I expert width, G GPUs,
S SMs, B minibatches.

Public names:
    simulate, simulate_workload, simulate_single_gpu_kernel, SimResult   (simulate)
    estimate_workload, Estimate                                           (analytic: the quick bound)
    build_workload, Workload, parse_routing, calibrate_zipf               (workload)
    load_profile, override, available_profiles, Profile, ProfileError     (hardware)
    make_placement, Placement                                             (placement)
    build_topology                                                        (topology)
    predict_launch_plan                                                   (cost: a kernel's launch plan)
    predict_task_plan                                                     (task_cost: the megakernel's task plan)
    predict_fused_ep, predict_ep_layer                                    (ep_task_cost: the fused EP launch)
Beside them: ``knobs.optimize`` (the best communication SMs and minibatch for a layer) and
``verdict.verdict`` (what bounds a layer; every ``SimResult.verdict``).
Nothing runs on import.
"""

from .analytic import Estimate, estimate_workload
from .cost import predict_launch_plan
from .ep_task_cost import predict_ep_layer, predict_fused_ep
from .hardware import Profile, ProfileError, available_profiles, load_profile, override
from .placement import Placement, make_placement
from .simulate import SimResult, simulate, simulate_single_gpu_kernel, simulate_workload
from .task_cost import predict_task_plan
from .topology import build_topology
from .workload import TraceError, Workload, build_workload, calibrate_zipf, parse_routing

__all__ = [
    "Estimate", "Placement", "Profile", "ProfileError", "SimResult", "TraceError", "Workload", "available_profiles",
    "build_topology", "build_workload", "calibrate_zipf", "estimate_workload", "load_profile", "make_placement", "override",
    "parse_routing", "predict_ep_layer", "predict_fused_ep", "predict_launch_plan", "predict_task_plan", "simulate",
    "simulate_single_gpu_kernel", "simulate_workload",
]
