"""megamoe: design, predict and validate fused MoE megakernels for rack-scale GPU systems.

Subpackages ``reference`` (float64 oracle), ``simulator`` and ``kernels`` (Triton); this package
holds the front door (``cli``) and ``validate``.
"""

__version__ = "0.1.0"
