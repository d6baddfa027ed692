"""``megamoe calibrate``: measure the cost model's numbers with microbenchmarks (GPU only).

Shape legend: P programs, S SMs, R rounds, N rows, H row width.

Runs the microbenchmark kernels beside this module (``microbench*.py``, never the MoE kernels) and
writes a profile whose ``kernel_model`` section ``simulator/cost.py`` reads. One module per group of
steps, in run order (``plan.STEPS``):

    latency     launch (graph replay = fixed + N x gap), serial (one program's load + dot step and
                top-1 pass, by row width), select (a routing program's selection per router family),
                sync (flag handoff, grid barrier, ticket; last: its spin kernels could hang)
    memory      hbm (streaming read over programs x bytes from a cold L2; the L2 re-read rate),
                copy (SM gather copy), l2_shared (programs sharing L2-resident tiles in groups),
                hbm_deep (weights streamed by programs keeping 48-192 KiB in flight)
    compute     mma (tile shapes x depth, on chip or L2-fed; occupancy), mma_fp8, gemm (every
                tile-loop form in a dense GEMM from HBM, median of three sweeps)
    sustained   a dense GEMM's rate by how long it has run from idle clocks, and at a duty
    profile     the calibrated profile and its provenance; summary: the printed table;
    plan        step order and the budget's plan; driver: the command; timing: graph and event timing
"""

from .driver import add_arguments, run
from .latency import measure_launch, measure_sync, select_cases
from .profile import build_profile, provenance
from .sustained import sustained_fit
from .timing import event_seconds, flushed_seconds, graph_seconds

__all__ = ["add_arguments", "build_profile", "event_seconds", "flushed_seconds", "graph_seconds",
           "measure_launch", "measure_sync", "provenance", "run", "select_cases", "sustained_fit"]
