"""reference/sizes.py: bytes per dtype, fp8 block scales included. Expected values worked by hand."""

from __future__ import annotations

import pytest

from megamoe.reference import MoEConfig
from megamoe.reference.sizes import (
    expert_bytes,
    matrix_bytes,
    router_bytes,
    row_bytes,
    shared_bytes,
    weight_bytes_per_element,
)

DSV3 = MoEConfig.preset("deepseek-v3")  # H = 7168 = 56 x 128, I = 2048 = 16 x 128


@pytest.mark.parametrize("rows, cols, dtype, want", [
    (4096, 7168, "fp8", 4096 * 7168 + 4 * 32 * 56),  # DeepSeek-V3's gate_up: 32 x 56 blocks
    (200, 130, "fp8", 200 * 130 + 4 * 2 * 2),  # partial blocks each way still carry a scale
    (1, 1, "fp8_e4m3", 1 + 4),
    (200, 130, "bf16", 2 * 200 * 130),  # no scales outside fp8
])
def test_matrix_bytes(rows, cols, dtype, want):
    assert matrix_bytes(rows, cols, dtype) == want


def test_fp8_expert_counts_its_block_scales():
    # gate_up [4096, 7168]: 32 x 56 = 1792 blocks; down [7168, 2048]: 56 x 16 = 896; a float32 each
    assert expert_bytes(DSV3, "fp8") == 3 * 7168 * 2048 + 4 * (1792 + 896)
    assert shared_bytes(DSV3, "fp8") == 3 * 7168 * 2048 + 4 * (1792 + 896)  # one shared expert as wide
    assert expert_bytes(DSV3, "bf16") == 2 * 3 * 7168 * 2048
    assert expert_bytes(DSV3, "fp8") == 3 * 7168 * 2048 * weight_bytes_per_element("fp8")  # multiples of 128


def test_weight_bytes_per_element():
    assert weight_bytes_per_element("fp8") == 1 + 4 / 128**2
    assert weight_bytes_per_element("bfloat16") == 2.0 and weight_bytes_per_element("fp32") == 4.0


def test_fp8_router_stays_bf16_and_rows_carry_group_scales():
    assert router_bytes(DSV3, "fp8") == 256 * 7168 * 2
    assert row_bytes(7168, "fp8") == 7168 + 4 * 56


def test_layer_bytes_with_bf16_io_around_fp8_weights():
    """The kernels' FP8 layer reads bf16 x and writes bf16 y: io_dtype counts them apart from the weights."""
    from megamoe.reference.sizes import layer_bytes

    H, T = DSV3.hidden_size, 8
    fp8 = layer_bytes(DSV3, T, 60.0, "fp8")
    io16 = layer_bytes(DSV3, T, 60.0, "fp8", io_dtype="bf16")
    assert fp8 - io16 == 2 * T * ((H + 4 * 56) - 2 * H)  # x and y: e4m3 rows with 56 scales vs bf16 rows
    assert layer_bytes(DSV3, T, 60.0, "bf16", io_dtype="bf16") == layer_bytes(DSV3, T, 60.0, "bf16")
