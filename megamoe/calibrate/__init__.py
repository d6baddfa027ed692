"""``megamoe calibrate``: measure the cost model's numbers with microbenchmarks (GPU only).

Runs the microbenchmark kernels (``microbench*.py``) step by step (``plan.STEPS``: ``latency``,
``memory``, ``compute``, ``sustained``) and writes a profile whose ``kernel_model`` section
``simulator/cost.py`` reads (``profile``); ``driver`` is the command. See docs/calibration.md.
"""

from .driver import add_arguments, run
from .latency import measure_launch, measure_sync, select_cases
from .profile import build_profile, provenance
from .sustained import sustained_fit
from .timing import event_seconds, flushed_seconds, graph_seconds

__all__ = ["add_arguments", "build_profile", "event_seconds", "flushed_seconds", "graph_seconds",
           "measure_launch", "measure_sync", "provenance", "run", "select_cases", "sustained_fit"]
