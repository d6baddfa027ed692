"""Compatibility names: the timing functions now live in ``cost.py`` (one cost model).

Kept so that code written against ``simulator.timing`` keeps importing; new code imports
``megamoe.simulator.cost``.
"""

from ..reference.sizes import FP8_BLOCK, row_bytes
from .cost import (  # noqa: I001
           DTYPES,
           ZERO_COST,
           GemmCost,
           compute_dtype,
           ffn_cost,
           ffn_roofline_s,
           gemm_efficiency,
           normalize_dtype,
           stage_cost,
           tile_rows,
           tile_widths,
           transfer_s,
)

__all__ = ["DTYPES", "FP8_BLOCK", "ZERO_COST", "GemmCost", "compute_dtype", "ffn_cost", "ffn_roofline_s",
           "gemm_efficiency", "normalize_dtype", "row_bytes", "stage_cost", "tile_rows", "tile_widths", "transfer_s"]
