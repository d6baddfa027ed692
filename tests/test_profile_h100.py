"""The shipped h100 profile: the H100 SXM5 as data, measured where the calibration measured it,
the datasheet elsewhere, and the H200's carried-over numbers flagged as assumptions."""

from __future__ import annotations

import json
import math

import pytest

from megamoe.cli import main
from megamoe.simulator.hardware import PROFILE_DIR, assumptions, load_profile

CALIBRATION = PROFILE_DIR.parents[1] / "benchmarks" / "results" / "h100" / "validation" / "profile.json"


def test_h100_loads_with_its_datasheet_and_measured_numbers():
    """132 SMs, 80 GB, 989 dense bf16 TFLOP/s from the datasheet; HBM rate and the kernel model's
    tables from the stored calibration; every number has a source."""
    p = load_profile("h100")
    assert p.name == "h100" and p.num_sms == 132
    assert p.hbm_capacity_bytes == 80e9 and p.tensor_flops_per_s["bf16"] == 989e12
    cal = json.loads(CALIBRATION.read_text())
    assert p.hbm_bandwidth_bytes_per_s == cal["hbm"]["bandwidth_bytes_per_s"]["value"] < 3.35e12
    assert p.data["kernel_model"]["hbm_read"]["points"] == cal["kernel_model"]["hbm_read"]["points"]
    assert p.kernel.calibrated
    for sec in ("system", "switch", "link", "gpu", "sm", "hbm", "kernel_model"):
        for key, entry in p.data[sec].items():
            assert entry["source"].strip(), f"{sec}.{key} has no source"
    assert "2026-12-07" in p.data["hbm"]["bandwidth_bytes_per_s"]["source"]


def test_h100_flags_what_it_carries_over_from_the_h200():
    """The GEMM efficiency curve and the rack-model numbers are the H200's: flagged, and named so."""
    flagged = {r["path"] for r in assumptions("h100")}
    assert {"gpu.gemm_efficiency", "megakernel.comm_sms", "comm.message_s"} <= flagged
    assert "hbm.bandwidth_bytes_per_s" not in flagged and "gpu.num_sms" not in flagged
    assert "h200" in load_profile("h100").data["gpu"]["gemm_efficiency"]["source"].lower()


@pytest.mark.parametrize("preset, T", [("qwen3-30b-a3b", 1), ("mixtral-8x7b", 8), ("deepseek-v3", 4096)])
def test_h100_prediction_is_finite_and_slower_than_the_h200s(preset, T):
    """The same plan on the H100 takes longer than on the calibrated H200 (3.2 against 4.6 TB/s of
    HBM, the same SMs), by less than twice: a decode layer is memory-bound."""
    from megamoe.choose import choose
    from megamoe.reference import MoEConfig

    h200 = PROFILE_DIR.parents[1] / "benchmarks" / "results" / "h200" / "validation" / "profile.json"
    a = choose(MoEConfig.preset(preset), T, "h100", megakernel=False)
    b = choose(MoEConfig.preset(preset), T, str(h200), megakernel=False)
    assert math.isfinite(a.predicted_us) and a.predicted_us > 0
    assert 1.0 < a.predicted_us / b.predicted_us < 2.0


def test_info_names_the_h100(capsys):
    assert main(["info"]) == 0
    assert "h100" in capsys.readouterr().out
    assert main(["info", "--assumptions", "h100"]) == 0
    assert "gpu.gemm_efficiency" in capsys.readouterr().out
