"""Compatibility names: the launch model now lives in ``cost.py`` (one cost model).

``predict_launch_plan(kernels.launch_plan(...).to_dict()["stages"], profile)``: see cost.py.
"""

from .cost import STAGE_KEYS, StagePrediction, dram_bytes, predict_launch_plan, predict_stage

__all__ = ["STAGE_KEYS", "StagePrediction", "dram_bytes", "predict_launch_plan", "predict_stage"]
