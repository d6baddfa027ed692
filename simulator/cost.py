"""The cost model: from a launch plan, a task plan or rows per expert to seconds on one GPU.

Shape legend: P programs, S SMs, o programs resident per SM, n programs in flight, E experts.

One model, in modules of one job each; every name is importable from here:

    rates        the calibrated rates: occupancy, the MMA tables, the HBM read grid, the SMs' intake,
                 serial steps, waves
    depth_rates  rates by the bytes a reader keeps in flight: the L2 shared-read table, the deep
                 readers' HBM table
    clocks       the sustained SM clock over a plan's busy window
    launch_cost  a launch plan (``predict_stage``, ``predict_launch_plan``)
    task_cost    the persistent megakernel's task plan (``predict_task_plan``)
    gemm_cost    the rack model's grouped GEMMs (``stage_cost``, ``ffn_cost``, ``ffn_roofline_s``)

docs/cost-model.md states each term, its formula and the measurements that keep it.

``CostOptions`` holds the alternatives of the model still under study, passed in explicitly; it
has none today (every alternative tried is either the model or deleted).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..reference.sizes import row_bytes, weight_bytes_per_element
from .clocks import busy_window_s, duty_fall, mma_duty, sustained_ratio, sustained_scale, sustained_table_ratio
from .depth_rates import (
    HBM_GRID_READER_DEPTH_BYTES,
    L2_READERS_EDGE,
    L2_SHARED_READER_DEPTH_BYTES,
    deep_read_rate,
    deep_stream_rate,
    deep_table_covers,
    l2_intake_rate,
    l2_readers,
    l2_shared_rate,
)
from .gemm_cost import (
    DEFAULT_GROUP_M,
    ZERO_COST,
    GemmCost,
    ffn_cost,
    ffn_roofline_s,
    ffn_row_bytes,
    stage_cost,
    tile_rows,
    tile_widths,
)
from .launch_cost import (
    BOUND_TERMS,
    MEMORY_TERMS,
    STAGE_KEYS,
    WINDOW_STEPS,
    StagePrediction,
    _work_tile,
    dram_bytes,
    launch_order_dram,
    predict_launch_plan,
    predict_stage,
    resolve_profile,
    stage_flops,
    stage_intake_s,
    stage_l2_hit_s,
    term_name,
    window_shares,
)
from .rates import (
    DTYPES,
    GEMM_TABLE_MIN_ROWS,
    _km,
    _nearest_shape,
    compute_dtype,
    gemm_efficiency,
    grouped_dram_bytes,
    hbm_peak,
    hbm_rate,
    hbm_stream_rate,
    launch_read_s,
    mma_rate_per_sm,
    normalize_dtype,
    occupancy,
    reduce_step_at_width,
    route_select_s,
    selection_width,
    serial_step_s,
    sm_copy_rate,
    sm_ingest_s,
    transfer_s,
    waves_s,
)
from .task_cost import GATED_KINDS, GEMM_KINDS, MEGAKERNEL_LOADS, _of_kinds, predict_task_plan


@dataclass(frozen=True)
class CostOptions:
    """Alternatives of the cost model still under study, each a field whose default is the model's
    behaviour; ``megamoe validate --repredict ... --variant`` sets them by name. None today."""


__all__ = [
    "BOUND_TERMS", "DEFAULT_GROUP_M", "DTYPES", "GATED_KINDS", "GEMM_KINDS", "GEMM_TABLE_MIN_ROWS",
    "HBM_GRID_READER_DEPTH_BYTES", "L2_READERS_EDGE", "L2_SHARED_READER_DEPTH_BYTES", "MEGAKERNEL_LOADS",
    "MEMORY_TERMS", "STAGE_KEYS", "WINDOW_STEPS", "ZERO_COST", "CostOptions", "GemmCost", "StagePrediction",
    "_km", "_nearest_shape", "_of_kinds", "sustained_scale", "_work_tile", "busy_window_s", "compute_dtype",
    "deep_read_rate", "deep_stream_rate", "deep_table_covers", "dram_bytes", "duty_fall", "ffn_cost",
    "ffn_roofline_s", "ffn_row_bytes", "gemm_efficiency", "grouped_dram_bytes", "hbm_peak", "hbm_rate",
    "hbm_stream_rate", "l2_intake_rate", "l2_readers", "l2_shared_rate", "launch_order_dram", "launch_read_s",
    "mma_duty", "mma_rate_per_sm", "normalize_dtype", "occupancy", "predict_launch_plan", "predict_stage",
    "predict_task_plan", "reduce_step_at_width", "resolve_profile", "route_select_s", "row_bytes",
    "selection_width", "serial_step_s", "sm_copy_rate", "sm_ingest_s", "stage_cost", "stage_flops",
    "stage_intake_s", "stage_l2_hit_s", "sustained_ratio", "sustained_table_ratio", "term_name", "tile_rows",
    "tile_widths", "transfer_s", "waves_s", "weight_bytes_per_element", "window_shares",
]
