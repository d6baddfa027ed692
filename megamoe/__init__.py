"""megamoe: design, predict and validate fused MoE megakernels for rack-scale GPU systems.

Rooms: ``megamoe.reference`` (the float64 oracle), ``megamoe.simulator`` (SimPy model of the
hardware), ``megamoe.kernels`` (Triton kernels). This package holds the front door (``cli``) and
``validate``, the one place that reads both the simulator and the kernels.
"""

__version__ = "0.1.0"
