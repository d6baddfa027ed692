"""The reference's FP8 layer: MoEWeights carrying e4m3 weights with block scales, and moe_forward on them.

The expected layer is written here one (token, expert) pair at a time from the scheme in
reference/forward.py's docstring, quantizing by hand with e4m3_round (tested against hand-worked
codes in test_reference_fp8.py) rather than with the quantize functions the layer calls.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from megamoe.reference import (
    PRESETS,
    InputError,
    MoEConfig,
    activation,
    assert_close,
    moe_forward,
    random_weights,
    round_to_dtype,
)
from megamoe.reference.fp8 import e4m3_round
from megamoe.reference.weights import expected_scale_shapes


def small(name: str, **kw) -> MoEConfig:
    """A preset's semantics with H = 200 and I = 136: one whole and one partial 128-block in each."""
    c = MoEConfig.preset(name)
    return c.replace(hidden_size=200, intermediate_size=136, shared_intermediate_size=72 * c.num_shared_experts,
                     **{"num_experts": min(c.num_experts, 8), **kw})


CONFIGS = {  # the families whose FP8 path differs: grouped sigmoid + shared MLP, input-weighted, biased
    "deepseek-v3": dict(n_group=4, topk_group=2, top_k=4),
    "llama4-maverick": {},  # routing weight scales the input: quantization sees the scaled row
    "gpt-oss-20b": {},  # biases and the clamped swiglu stay float64
    "qwen1.5-moe-a2.7b": {},  # the sigmoid shared-expert gate stays unquantized
}


def fq(v: np.ndarray) -> np.ndarray:
    """One row quantized per 128 columns (float32: scale = amax / 448, code = e4m3(v / scale)) and dequantized."""
    out = np.empty_like(v)
    for j in range(math.ceil(v.size / 128)):
        g = v[j * 128:(j + 1) * 128].astype(np.float32)
        s = max(np.abs(g).max(), np.float32(1e-4)) / np.float32(448)
        out[j * 128:(j + 1) * 128] = e4m3_round(g / s) * np.float64(s)
    return out


def by_pairs(x, w, c: MoEConfig, topk_idx, topk_weights, quantize: bool):
    """The layer from dequantized weights ``w``, one (token, expert) pair at a time."""
    q = fq if quantize else (lambda v: v)
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, wt in zip(topk_idx[t], topk_weights[t]):
            row = x[t] * wt if c.weight_on_input else x[t]
            z = w.gate_up[e] @ q(row) + (0 if w.gate_up_bias is None else w.gate_up_bias[e])
            out = w.down[e] @ q(activation(z, c)) + (0 if w.down_bias is None else w.down_bias[e])
            y[t] += out if c.weight_on_input else wt * out
        if c.num_shared_experts:
            Is = c.shared_intermediate_size
            z = w.shared_gate_up @ q(x[t])
            h = z[:Is] / (1 + np.exp(-z[:Is])) * z[Is:]
            s = w.shared_down @ q(h)
            y[t] += s / (1 + np.exp(-x[t] @ w.shared_gate)) if w.shared_gate is not None else s
    return y


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fp8_layer_matches_pair_loop(name, rng):
    c = small(name, **CONFIGS[name])
    w8 = random_weights(c, seed=3, fp8=True)
    x = rng.standard_normal((9, c.hidden_size))
    out = moe_forward(x, w8, c, details=True)
    want = by_pairs(x, w8.dequantize(), c, out.routing.topk_idx, out.routing.topk_weights, quantize=True)
    np.testing.assert_allclose(out.y, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_router_ignores_fp8(name, rng):
    """The router reads the unquantized x and router weight: the same experts and weights as float64."""
    c = small(name, **CONFIGS[name])
    w8 = random_weights(c, seed=4, fp8=True)
    x = rng.standard_normal((16, c.hidden_size))
    a = moe_forward(x, w8, c, details=True).routing
    b = moe_forward(x, w8.dequantize(), c, details=True).routing
    np.testing.assert_array_equal(a.topk_idx, b.topk_idx)
    np.testing.assert_array_equal(a.topk_weights, b.topk_weights)


def test_weight_only_and_activation_only(rng):
    c = small("deepseek-v3", **CONFIGS["deepseek-v3"])
    w = random_weights(c, seed=5)
    w8 = w.to_fp8()
    x = rng.standard_normal((6, c.hidden_size))
    # FP8 weights, float64 activations: exactly the float layer on the dequantized weights
    np.testing.assert_array_equal(moe_forward(x, w8, c, fp8_activations=False), moe_forward(x, w8.dequantize(), c))
    # float weights, FP8 activations
    r = moe_forward(x, w, c, details=True).routing
    np.testing.assert_allclose(moe_forward(x, w, c, fp8_activations=True),
                               by_pairs(x, w, c, r.topk_idx, r.topk_weights, quantize=True), rtol=1e-12, atol=1e-12)
    with pytest.raises(InputError, match=r"fp8_activations must be True, False or None, got 'yes'"):
        moe_forward(x, w8, c, fp8_activations="yes")


def test_random_fp8_weights():
    c = small("deepseek-v3", **CONFIGS["deepseek-v3"])
    w, w8 = random_weights(c, seed=6), random_weights(c, seed=6, fp8=True)
    assert w8.is_fp8 and not w.is_fp8
    E = c.num_experts
    assert w8.gate_up_scale_inv.shape == (E, 3, 2) and w8.down_scale_inv.shape == (E, 2, 2)  # 2I=272, H=200, I=136
    assert w8.shared_gate_up_scale_inv.shape == (2, 2) and w8.shared_down_scale_inv.shape == (2, 1)  # 2Is=144, Is=72
    assert {k: v.shape for k, v in w8.arrays().items() if k.endswith("scale_inv")} == expected_scale_shapes(c)
    assert w8.gate_up_scale_inv.dtype == np.float32
    np.testing.assert_array_equal(e4m3_round(w8.gate_up), w8.gate_up)  # stored as e4m3 values
    np.testing.assert_array_equal(w8.router_weight, w.router_weight)  # the router is not quantized
    np.testing.assert_array_equal(w8.score_bias, w.score_bias)
    d = w8.dequantize()
    assert not d.is_fp8 and d.gate_up_scale_inv is None
    np.testing.assert_allclose(d.gate_up, w.gate_up, rtol=2**-4, atol=2**-10 * float(w8.gate_up_scale_inv.max()))
    assert w8.nbytes > w.nbytes  # nbytes counts the scales too
    with pytest.raises(InputError, match="FP8 already"):
        w8.to_fp8()


def test_fp8_weights_are_validated(rng):
    c = small("deepseek-v3", **CONFIGS["deepseek-v3"])
    w8 = random_weights(c, seed=7, fp8=True)
    x = rng.standard_normal((2, c.hidden_size))
    with pytest.raises(InputError, match=r"MoEWeights.shared_down_scale_inv is missing \(expected shape \[2, 1\]\)"):
        moe_forward(x, dataclasses.replace(w8, shared_down_scale_inv=None), c)
    with pytest.raises(InputError, match=r"MoEWeights.down_scale_inv must have shape \[8, 2, 2\], got \[8, 2, 1\]"):
        moe_forward(x, dataclasses.replace(w8, down_scale_inv=w8.down_scale_inv[..., :1]), c)
    with pytest.raises(InputError, match=r"MoEWeights.gate_up must hold float8 e4m3 values"):
        moe_forward(x, dataclasses.replace(w8, gate_up=w8.dequantize().gate_up), c)  # scaled values with scales
    for v in (np.nan, -1.0, 0.0):  # a corrupt checkpoint's scales: the layer would be NaN, flipped or zero
        bad = dataclasses.replace(w8, down_scale_inv=np.full_like(w8.down_scale_inv, v))
        with pytest.raises(InputError, match=rf"MoEWeights.down_scale_inv \(shape \[8, 2, 2\]\) must be finite and > 0, "
                                             rf"got {v} at index \(0, 0, 0\)"):
            moe_forward(x, bad, c)
    no_shared = c.replace(num_shared_experts=0, shared_intermediate_size=0)
    w_ns = random_weights(no_shared, seed=7, fp8=True)
    with pytest.raises(InputError, match=r"MoEWeights.shared_down_scale_inv is given but config"):
        moe_forward(x, dataclasses.replace(w_ns, shared_down_scale_inv=w8.shared_down_scale_inv), no_shared)


def test_to_torch_keeps_fp8(rng):
    torch = pytest.importorskip("torch")
    c = small("deepseek-v3", **CONFIGS["deepseek-v3"])
    w8 = random_weights(c, seed=8, fp8=True)
    t = w8.to_torch(dtype=torch.bfloat16)
    assert t.gate_up.dtype == torch.float8_e4m3fn and t.shared_down.dtype == torch.float8_e4m3fn
    assert t.gate_up_scale_inv.dtype == torch.float32 and t.router_weight.dtype == torch.bfloat16
    x = rng.standard_normal((3, c.hidden_size))
    # the float8 tensors read back as the same values: the same layer
    np.testing.assert_array_equal(moe_forward(x, w8.to_torch(dtype=torch.float64), c), moe_forward(x, w8, c))
    # host scales are checked on conversion, before they reach a device
    bad = dataclasses.replace(w8, gate_up_scale_inv=np.full_like(w8.gate_up_scale_inv, np.nan))
    with pytest.raises(InputError, match=r"MoEWeights.gate_up_scale_inv \(shape .*\) must be finite and > 0, got nan"):
        bad.to_torch()


# ---------------------------------------------------------------------- what FP8 costs, and the kernel row


@pytest.mark.parametrize("name", PRESETS)
def test_fp8_layer_is_within_its_documented_distance_of_float64(name, rng):
    """tolerance.py's fp8_e4m3_vs_float64 row: what a user gives up by running the FP8 layer."""
    c0 = MoEConfig.preset(name)
    c = c0.replace(hidden_size=256, intermediate_size=128, num_experts=min(c0.num_experts, 16),
                   num_shared_experts=min(c0.num_shared_experts, 1),
                   shared_intermediate_size=128 if c0.num_shared_experts else 0,
                   **({"n_group": 4, "topk_group": 2, "top_k": 4} if c0.n_group > 1 else {}))
    w = random_weights(c, seed=1)
    x = rng.standard_normal((32, c.hidden_size))
    rep = assert_close(moe_forward(x, w.to_fp8(), c), moe_forward(x, w, c), "fp8_e4m3_vs_float64", name)
    assert rep.rms_err > 3e-2  # and the FP8 layer really is quantized: e4m3's ~6% is there


def _q32(a):
    """A GPU's per-row, per-128 quantization: float32 amax, scale and quotient (IEEE division)."""
    a = a.astype(np.float32)
    out = np.empty_like(a)
    s = np.empty((a.shape[0], math.ceil(a.shape[1] / 128)), np.float32)
    for j in range(s.shape[1]):
        g = a[:, j * 128:(j + 1) * 128]
        s[:, j] = np.maximum(np.abs(g).max(axis=1), np.float32(1e-4)) / np.float32(448)
        out[:, j * 128:(j + 1) * 128] = e4m3_round(g / s[:, j:j + 1])
    return out, s


def _gemm32(q, s, wq, ws):
    """[N, K] x [M, K]^T on FP8 operands: fp32 per 128-wide K block, both scales applied as it is added in."""
    acc = np.zeros((q.shape[0], wq.shape[0]), np.float32)
    ws_rows = np.repeat(ws.astype(np.float32), 128, axis=0)[:wq.shape[0]]  # (M, Kb)
    for kb in range(s.shape[1]):
        k = slice(kb * 128, (kb + 1) * 128)
        acc += (q[:, k] @ wq[:, k].astype(np.float32).T) * s[:, kb:kb + 1] * ws_rows[None, :, kb]
    return acc


def _kernel_like(xb, w8, c, routing, mistake=None):
    """An FP8 MoE kernel written in float32 NumPy; ``mistake`` adds one of two real-world departures."""
    def b16(a):
        return round_to_dtype(a, "bfloat16").astype(np.float32)

    y = np.zeros(xb.shape, np.float32)
    for e in range(c.num_experts):
        t, k = np.nonzero(routing.topk_idx == e)
        if t.size == 0:
            continue
        q, s = _q32(xb[t])
        h = activation(_gemm32(q, s, w8.gate_up[e], w8.gate_up_scale_inv[e]).astype(np.float64), c).astype(np.float32)
        if mistake == "h_from_bf16":
            h = b16(h)
        if mistake == "no_activation_quantization":
            q, s = h, np.ones((h.shape[0], math.ceil(h.shape[1] / 128)), np.float32)
        else:
            q, s = _q32(h)
        out = b16(_gemm32(q, s, w8.down[e], w8.down_scale_inv[e]))
        np.add.at(y, t, out * routing.topk_weights[t, k, None].astype(np.float32))
    return b16(y)


@pytest.mark.parametrize("mistake", [None, "h_from_bf16", "no_activation_quantization"])
def test_fp8_kernel_row_passes_fp8_arithmetic_and_fails_departures(mistake, rng):
    """tolerance.py's fp8_e4m3 row: met by FP8 GEMMs done as the row says, missed by the two easy departures."""
    c = MoEConfig.preset("mixtral-8x7b").replace(hidden_size=384, intermediate_size=256, num_experts=4)
    w8 = random_weights(c, seed=2, fp8=True)
    xb = round_to_dtype(rng.standard_normal((48, c.hidden_size)), "bfloat16")  # the kernel's bf16 x
    ref = moe_forward(xb, w8, c, details=True)
    got = _kernel_like(xb.astype(np.float32), w8, c, ref.routing, mistake)
    if mistake is None:
        rep = assert_close(got, ref.y, "fp8_e4m3", "FP8 kernel emulation")
        assert rep.rms_err > 1e-4  # bf16 outputs: not trivially equal
    else:
        with pytest.raises(AssertionError, match="dtype fp8_e4m3"):
            assert_close(got, ref.y, "fp8_e4m3", mistake)
