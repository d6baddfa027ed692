"""The calibrated profile: the base profile with the measured numbers, and the run's provenance."""

from __future__ import annotations

import datetime as _dt
import re

from .compute import GEMM_FORMS, GEMM_MN
from .latency import serial_width_points
from .plan import STEPS
from .sustained import SUSTAINED_PAUSE_S, SUSTAINED_SIZE, duty_points


def gpu_slug(device_name: str) -> str:
    """A profile name for a GPU: its model word in lower case ("NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA H200" -> "h200"); the whole name slugged where no word has a digit."""
    words = [w for w in re.split(r"[^0-9A-Za-z]+", device_name) if w and w.lower() != "nvidia"]
    model = next((w for w in words if any(c.isdigit() for c in w)), None)
    return (model or "-".join(words) or "gpu").lower()


def build_profile(base: dict, m: dict, prov: dict) -> dict:
    """The calibrated profile: ``base`` (profile JSON) with the measured numbers of ``m``; steps
    missing from ``m`` keep the base's numbers and are named in ``calibration.not_measured``."""
    import copy

    src = f"measured by megamoe calibrate on {prov['gpu']} {prov['date']}"
    d = copy.deepcopy(base)

    def num(v, unit):
        return {"value": float(v), "unit": unit, "source": src}

    def table(unit, over, pts, note=None):
        t = {"unit": unit, "over": over, "points": [[float(x) for x in p] for p in pts], "source": src}
        if note:
            t["note"] = note
        return t

    missing = [k for k in STEPS if k not in m]
    d["name"] = f"{gpu_slug(prov['gpu'])}-calibrated"  # named after the GPU measured, whatever the base
    d["description"] = (f"{base['description']}; single-GPU numbers measured by megamoe calibrate ({prov['date']})"
                        + (f"; not measured (base values kept): {', '.join(missing)}" if missing else ""))
    d["gpu"]["num_sms"] = {"value": prov["num_sms"], "unit": "count", "source": src}
    if prov.get("l2_bytes"):
        d["gpu"]["l2_bytes"] = num(prov["l2_bytes"], "bytes")
    km = {}
    if "launch" in m:
        d["gpu"]["kernel_launch_s"] = num(m["launch"]["launch_gap_s"], "s")
        km["launch_gap_s"] = num(m["launch"]["launch_gap_s"], "s")
        km["graph_fixed_s"] = num(m["launch"]["graph_fixed_s"], "s")
    if "sync" in m:
        d["gpu"]["grid_sync_s"] = num(m["sync"]["grid_barrier_s"], "s")
        km["flag_handoff_s"] = num(m["sync"]["flag_handoff_s"], "s")
        km["grid_barrier_s"] = num(m["sync"]["grid_barrier_s"], "s")
        km["ticket_s"] = num(max(m["sync"]["ticket_s"], 0.0), "s")
    if "serial" in m:
        km["serial_load_step_s"] = num(max(m["serial"]["serial_load_step_s"], 0.0), "s")
        km["serial_reduce_step_s"] = num(max(m["serial"]["serial_reduce_step_s"], 0.0), "s")
        if serial_width_points(m["serial"]):
            km["serial_reduce_width"] = table("s", ["width"], serial_width_points(m["serial"]),
                                              "seconds per dependent top-1 pass of one program over 16 rows of "
                                              "width fp32 scores (the row's BLOCK_E; serial_reduce_step_s is their "
                                              "median)")
    if "hbm" in m:
        read_peak = max(p[2] for p in m["hbm"]["points"])
        d["hbm"]["bandwidth_bytes_per_s"] = num(read_peak, "bytes/s")
        d["hbm"]["efficiency"] = {"value": 1.0, "unit": "fraction",
                                  "source": src + " (the measured rate is the achievable one)"}
        km["l2_bandwidth_bytes_per_s"] = num(m["hbm"]["l2_bytes_per_s"], "bytes/s")
        km["hbm_read"] = table("bytes/s", ["programs_in_flight", "bytes_per_program"], m["hbm"]["points"])
    if "mma" in m:
        occ = m["mma"]["occupancy"] or {4: 2, 8: 1}
        if m["mma"].get("dense_flops_per_s"):
            km["mma_sustained_flops_per_s"] = num(m["mma"]["dense_flops_per_s"], "flop/s")
        km["mma"] = table("flop/s per SM", ["BLOCK_M", "BLOCK_N", "num_warps", "depth"], m["mma"]["points"],
                          "bf16, L2-resident operands, 8 programs per SM launched")
        km["occupancy"] = table("programs per SM", ["num_warps"], sorted([int(w), o] for w, o in occ.items()),
                                "from the mma microbench kernels' registers and shared memory")
    if "gemm" in m:
        src_g = f"dense {GEMM_MN} x {GEMM_MN} x depth bf16 GEMM of these tiles, grouped order, operands from HBM"
        for form, what in GEMM_FORMS.items():
            if f"points_{form}" in m["gemm"]:
                km[f"gemm_{form}"] = table("flop/s per SM", ["BLOCK_M", "BLOCK_N", "num_warps", "depth"],
                                           m["gemm"][f"points_{form}"], f"{src_g}; {what}")
    if "mma_fp8" in m:
        km["mma_fp8"] = table("flop/s per SM", ["BLOCK_M", "BLOCK_N", "num_warps", "depth"], m["mma_fp8"]["points"],
                              "e4m3 x e4m3, fp32 accumulate, operands on chip, 8 programs per SM launched")
    if "l2_shared" in m:
        km["l2_shared_read"] = table("bytes/s", ["programs", "sharing_group"], m["l2_shared"]["points"],
                                     "P programs sweeping one L2-resident working set of weight tiles by the GEMM "
                                     "loop's loads, groups of g consecutive programs reading the same tile at once")
    if m.get("hbm_deep", {}).get("points"):
        from megamoe.simulator.hardware import HBM_DEEP_AXES

        km["hbm_deep_read"] = table("bytes/s", list(HBM_DEEP_AXES), m["hbm_deep"]["points"],
                                    "P programs (one per SM) streaming weight tiles from a cold L2 through GEMM 1's "
                                    "tile loops (microbench_deep.py), each keeping bytes_in_flight of weight "
                                    "tiles in its pipeline buffers, groups of g consecutive programs reading the same "
                                    "tiles at once; bytes/s the programs read (g x the DRAM rate)")
    if m.get("sustained", {}).get("points"):
        su = m["sustained"]
        km["sustained_mma"] = table("fraction", ["busy_s"], su["points"],
                                    f"cuBLAS {su.get('size', SUSTAINED_SIZE)}^3 bf16 matmuls back to back in one CUDA "
                                    f"graph after {su.get('pause_s', SUSTAINED_PAUSE_S):g} s idle: the average rate "
                                    "over the graph's busy_s seconds / the best graph's "
                                    f"({su['reference_flops_per_s'] / 1e12:.1f} TFLOP/s, the short-launch rate)")
        if duty_points(su):
            km["sustained_duty"] = table("fraction", ["duty"], duty_points(su),
                                         "matmuls a share of a long graph's time (HBM reads between): the fall of "
                                         "their rate over the fall of matmuls back to back for as long")
    if "select" in m:
        km["route_select"] = table("s", ["router", "BLOCK_E", "K", "N_GROUP", "BLOCK_T", "BITONIC"], m["select"]["points"],
                                   "seconds of one routing program's selection per block of BLOCK_T tokens "
                                   "(microbench_route.py: routing._route_block on random fp32 logits); "
                                   "router: 1 + its code, routing.ROUTER_CODES (microbench_route.select_key)")
    if "copy" in m:
        copy_pts = m["copy"]["points"]
        near16 = min(copy_pts, key=lambda p: abs(p[0] - 16))
        d["sm"]["copy_bytes_per_s"] = num(near16[1], "bytes/s")
        km["sm_copy"] = table("bytes/s per SM", ["copying_sms"], copy_pts, "gather of 7168-wide bf16 rows")
    d["kernel_model"] = km
    d["calibration"] = {**prov, "measured": [k for k in STEPS if k in m], "not_measured": missing}
    return d


def provenance() -> dict:
    """GPU, versions, date and the code's commit (kernels.bench.git_state: HEAD and a dirty flag, or
    MEGAMOE_COMMIT on a copied tree), as every results row records them."""
    import torch
    import triton

    from megamoe.kernels.bench import git_state

    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            **git_state(), "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"),
            "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "num_sms": int(props.multi_processor_count), "l2_bytes": int(getattr(props, "L2_cache_size", 0))}
