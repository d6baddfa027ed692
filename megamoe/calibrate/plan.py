"""Which calibration steps run, in what order, and in which form a ``--budget`` allows."""

from __future__ import annotations

#: the steps in run order; sync last: its spin kernels (every program resident) are the ones that could hang
STEPS = ("launch", "hbm", "mma", "gemm", "mma_fp8", "copy", "serial", "select", "l2_shared", "hbm_deep",
         "sustained", "sync")
#: (full, --quick) seconds of each step, cold Triton cache, with a margin: used only to plan a --budget
STEP_COST_S = {"launch": (4.0, 4.0), "hbm": (20.0, 8.0), "mma": (18.0, 8.0), "gemm": (50.0, 18.0),
               "mma_fp8": (6.0, 4.0), "copy": (3.0, 2.0), "serial": (4.0, 3.0), "select": (18.0, 9.0),
               "l2_shared": (3.0, 2.0), "hbm_deep": (5.0, 3.0), "sustained": (20.0, 6.0), "sync": (4.0, 3.0)}
RESERVE_S = 5.0  # seconds kept back from the budget for writing the profile


def plan_step(name: str, left_s: float, quick: bool) -> str | None:
    """"full", "quick" or None (skip) for step ``name`` with ``left_s`` seconds of budget left: full if
    it and the quick form of every later step fit, quick if that fits, otherwise not at all."""
    later = STEPS[STEPS.index(name) + 1:]
    rest = sum(STEP_COST_S[k][1] for k in later)
    full, fast = STEP_COST_S[name]
    if not quick and left_s >= full + rest + RESERVE_S:
        return "full"
    if left_s >= fast + RESERVE_S:
        return "quick"
    return None
