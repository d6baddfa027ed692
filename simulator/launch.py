"""Predict one GPU's kernel launches from a launch plan given as data.

Shape legend: P working programs of a launch, S SMs, BM/BN tile rows/columns.

The kernels publish what they launch (``megamoe.kernels.launch_plan(...).to_dict()["stages"]``):
per launch the grid, the working programs, the tile (BLOCK_M, BLOCK_N, num_warps, ...), and the
bytes and FLOPs of one working program. The simulator never imports the kernels; it reads that
list of plain dicts. Per launch:

    occupancy   o = programs resident per SM: 1 for 8-warp tiles, 2 for 4-warp tiles (an
                  assumption: Triton's Hopper GEMM tiles of these sizes fit one or two per SM)
    compute_s   = ceil(P / (S * o)) * o * flops_per_program / (peak / S * eff(BLOCK_M))
    memory_s    = P * bytes_per_program / (HBM rate * min(1, P * o / S))
                  (fewer programs than SMs cannot pull the whole HBM rate)
    launch_s    = the profile's per-kernel launch gap (CUDA-graph replay)
    time_s      = max(compute_s, memory_s) + launch_s

eff(BLOCK_M) is the profile's GEMM efficiency curve read at the tile height. Launches run one
after another, as they do in the kernels' stream.

DRAM bytes and L2. A plan stage that publishes ``operand_bytes_per_tile`` ({"a", "b", "out"}: the
gathered activation rows, the weight tile, the output tile of one program) and
``row_blocks_per_expert`` (E,) gets an L2 model of grouped tile order (GROUP_M row blocks sweep
the N tiles together, Triton's L2-friendly order):

    a (activations)  read once per row block: the row block stays in L2 while its N tiles run
    b (weights)      read once per N tile per group of GROUP_M row blocks of the same expert
    out              written once per program

Without those keys the plan's ``bytes_per_tile`` is taken as DRAM traffic per program (no L2
reuse): right for decode (one row block per expert), an overestimate for prefill.

"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .hardware import Profile, load_profile
from .timing import gemm_efficiency

STAGE_KEYS = ("name", "active_programs", "tile", "bytes_per_tile", "flops_per_tile")


@dataclass(frozen=True)
class StagePrediction:
    name: str
    programs: int
    compute_us: float
    memory_us: float
    launch_us: float

    @property
    def time_us(self) -> float:
        return max(self.compute_us, self.memory_us) + self.launch_us

    @property
    def bound(self) -> str:
        if self.programs == 0:
            return "launch"
        return "compute" if self.compute_us >= self.memory_us else "memory"

    def to_dict(self) -> dict:
        return {"name": self.name, "programs": self.programs, "compute_us": self.compute_us,
                "memory_us": self.memory_us, "launch_us": self.launch_us, "time_us": self.time_us,
                "bound": self.bound}


def _occupancy(tile: dict) -> int:
    return 1 if int(tile.get("num_warps", 4)) >= 8 else 2


def dram_bytes(stage: dict) -> float:
    """DRAM bytes of one launch (see the module docstring for the L2 model)."""
    P = int(stage["active_programs"])
    ob, rb = stage.get("operand_bytes_per_tile"), stage.get("row_blocks_per_expert")
    tpe = stage.get("tiles_per_expert")
    if not ob or rb is None or tpe is None:
        return P * float(stage["bytes_per_tile"])
    group = max(1, int(stage["tile"].get("GROUP_M", 1)))
    total = 0.0
    for tiles, blocks in zip(tpe, rb):
        if tiles == 0 or blocks == 0:
            continue
        n_tiles = tiles / blocks  # N tiles (x split-K) per row block
        total += blocks * float(ob["a"]) * (1 if n_tiles >= 1 else n_tiles)
        total += n_tiles * math.ceil(blocks / group) * float(ob["b"])
        total += tiles * float(ob["out"])
    return total


def predict_stage(stage: dict, profile: Profile, *, dtype: str = "bf16") -> StagePrediction:
    """One launch's time on one GPU of ``profile``."""
    missing = [k for k in STAGE_KEYS if k not in stage]
    if missing:
        raise ValueError(f"launch-plan stage {stage.get('name', '?')!r} lacks {missing}; expected keys {STAGE_KEYS}")
    P = int(stage["active_programs"])
    if P < 0:
        raise ValueError(f"stage {stage['name']!r}: active_programs must be >= 0, got {P}")
    S = profile.num_sms
    launch_us = profile.kernel_launch_s * 1e6
    if P == 0:
        return StagePrediction(stage["name"], 0, 0.0, 0.0, launch_us)
    tile = stage["tile"]
    occ = _occupancy(tile)
    flops = float(stage["flops_per_tile"])
    compute_s = 0.0
    if flops > 0:
        bm = int(tile.get("BLOCK_M", tile.get("BLOCK_T", 1)))
        eff = float(gemm_efficiency([bm], profile.gemm_efficiency)[0])
        sm_rate = profile.tensor_flops_per_s[dtype] / S
        compute_s = math.ceil(P / (S * occ)) * occ * flops / (sm_rate * eff)
    rate = profile.hbm_effective_bytes_per_s * min(1.0, P * occ / S)
    memory_s = dram_bytes(stage) / rate
    return StagePrediction(stage["name"], P, compute_s * 1e6, memory_s * 1e6, launch_us)


def predict_launch_plan(stages: list[dict], system: str | Profile = "h200", *, dtype: str = "bf16",
                        overrides: dict | None = None) -> dict:
    """Every launch of a plan, in order.  -> {"time_us", "stages": [...], "system"}.

    ``overrides`` are ``hardware.override`` fields, e.g. the HBM rate and tensor rate measured in
    the same run as the kernel, so that the comparison tests the model's structure rather than the
    datasheet.
    """
    from .hardware import override

    p = load_profile(system) if not isinstance(system, Profile) else system
    if overrides:
        p = override(p, **overrides)
    preds = [predict_stage(s, p, dtype=dtype) for s in stages]
    return {"time_us": sum(s.time_us for s in preds), "stages": [s.to_dict() for s in preds], "system": p.name}
