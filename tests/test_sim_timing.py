"""Timing functions: bytes and FLOPs to seconds, worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from megamoe.simulator.cost import ffn_cost, ffn_roofline_s, gemm_efficiency, row_bytes, stage_cost, transfer_s
from megamoe.simulator.hardware import load_profile, override


def _flat_profile(**kw):
    # 132 SMs at 1e12 FLOP/s each, efficiency 1, 128 x 128 tiles
    return override(load_profile("h200"), bf16_flops=132e12, fp8_flops=264e12, gpu__gemm_efficiency=1.0, **kw)


@pytest.mark.parametrize(
    "width, dtype, want",
    [(7168, "bf16", 14336), (7168, "fp8", 7168 + 56 * 4), (100, "fp8", 100 + 4)],  # fp8: a float32 per 128
)
def test_row_bytes(width, dtype, want):
    assert row_bytes(width, dtype) == want


def test_transfer_alpha_beta():
    assert transfer_s(1e9, 1e9, 1e-6) == pytest.approx(1.000001)
    assert transfer_s(0, 1e9, 1e-6) == 0.0


def test_efficiency_curve_interpolates_in_log2():
    curve = ((128.0, 0.4), (512.0, 0.6))
    e = gemm_efficiency([1, 128, 256, 512, 4096], curve)
    assert e == pytest.approx([0.4, 0.4, 0.5, 0.6, 0.6])


def test_stage_cost_by_hand():
    p = _flat_profile()
    # 3 experts with 128, 1, 200 rows; N = 256, K = 128: tile heights 128, 16, 128. With the
    # profile's 128-wide tiles: (1 + 1 + 2) * 2 = 8 tiles, one wave lasting the longest tile,
    # 2*128*128*128 FLOP at 1e12 = 4.194304 us; with 64-wide tiles: 16 tiles, one wave of
    # 2*128*64*128 FLOP = 2.097152 us. The tuned choice is the 64-wide one.
    c = stage_cost([128, 1, 200, 0], 256, 128, profile=p, num_sms=132, peak_flops_per_s=132e12,
                   weight_bytes_per_elem=2, in_row_bytes=256, out_row_bytes=256)
    assert c.tiles == 16
    assert c.compute_s == pytest.approx(2.097152e-6)
    assert c.padded_flops == 2 * (6 * 128 + 2 * 16) * 128 * 128
    assert c.flops == 2 * 329 * 256 * 128
    assert c.hbm_bytes == 3 * 256 * 128 * 2 + 329 * 512
    assert c.time_s == max(c.compute_s, c.hbm_s)
    # on 8 SMs the 64-wide tiles take two waves (16 tiles): 2 * 2.097152 * mean share; 128-wide
    # tiles one wave of 4.194304 us: a tie broken towards the profile's tile
    c8 = stage_cost([128, 1, 200, 0], 256, 128, profile=p, num_sms=8, peak_flops_per_s=132e12,
                    weight_bytes_per_elem=2, in_row_bytes=256, out_row_bytes=256)
    assert c8.compute_s <= 4.194304e-6 * (1 + 1e-12)


def test_waves_quantize():
    p = _flat_profile()
    kw = dict(profile=p, peak_flops_per_s=132e12, weight_bytes_per_elem=2, in_row_bytes=0, out_row_bytes=0)
    one = stage_cost([128], 64 * 4, 128, num_sms=4, **kw)  # 4 tiles (64 wide) on 4 SMs: one wave
    two = stage_cost([128], 64 * 5, 128, num_sms=4, **kw)  # 5 on 4 SMs: two waves (or 3 128-wide: one long)
    assert two.compute_s == pytest.approx(2 * one.compute_s)


def test_small_batch_is_memory_bound():
    p = load_profile("h200")
    # DeepSeek-V3 expert, 8 rows: weights (3 * 7168 * 2048 * 2 B) dominate
    c = ffn_cost([8], 7168, 2048, profile=p, num_sms=132, weight_dtype="bf16", act_dtype="bf16")
    assert c.hbm_s > c.compute_s
    assert c.hbm_bytes >= 3 * 7168 * 2048 * 2


def test_fp8_halves_weight_bytes_and_doubles_peak():
    p = load_profile("h200")
    kw = dict(profile=p, num_sms=132)
    b = ffn_cost([4096] * 4, 7168, 2048, weight_dtype="bf16", act_dtype="bf16", **kw)
    f = ffn_cost([4096] * 4, 7168, 2048, weight_dtype="fp8", act_dtype="fp8", **kw)
    assert f.compute_s == pytest.approx(b.compute_s / 2, rel=1e-3)  # 1979 vs 2 x 989
    assert f.flops == b.flops


def test_fp8_weights_are_read_with_their_block_scales():
    """The weight bytes an FFN reads in fp8 are reference.sizes' expert bytes: 128 x 128 scales included."""
    from megamoe.reference import MoEConfig
    from megamoe.reference.sizes import expert_bytes

    p = load_profile("h200")
    kw = dict(profile=p, num_sms=132, weight_dtype="fp8", act_dtype="fp8")
    read = ffn_cost([8], 7168, 2048, **kw)
    skip = ffn_cost([8], 7168, 2048, read_weights=False, **kw)
    assert read.hbm_bytes - skip.hbm_bytes == pytest.approx(expert_bytes(MoEConfig.preset("deepseek-v3"), "fp8"))


@pytest.mark.parametrize("rows", [[1], [7, 300, 0, 4096], [128] * 32, [5000, 1]])  # decode, mixed, even, hot
def test_roofline_is_below_tile_model(rows):
    p = load_profile("gb200-nvl72")
    for sms in (148, 100):
        c = ffn_cost(rows, 7168, 2048, profile=p, num_sms=sms, weight_dtype="bf16", act_dtype="bf16")
        assert ffn_roofline_s(rows, 7168, 2048, profile=p, weight_dtype="bf16", act_dtype="bf16") <= c.time_s
        assert c.flops / p.tensor_flops_per_s["bf16"] <= c.time_s
    assert math.isfinite(c.time_s) and np.all(np.asarray(rows) >= 0)
