"""Bad inputs to megamoe.kernels.moe_forward give a clear KernelInputError, before any launch."""

from __future__ import annotations

import os

import pytest
import torch

from megamoe.reference import MoEConfig, random_weights

CFG = MoEConfig(hidden_size=24, intermediate_size=20, num_experts=5, top_k=2)


@pytest.fixture
def xw():
    w = random_weights(CFG, seed=0).to_torch("cpu", torch.float32)
    x = torch.randn(3, 24)
    return x, w


def _err(x, w, cfg=CFG, match=""):
    from megamoe.kernels import KernelInputError, check_inputs

    with pytest.raises(KernelInputError, match=match):
        check_inputs(x, w, cfg)


def test_wrong_hidden_size(xw):
    x, w = xw
    _err(torch.randn(3, 25), w, match=r"x must have shape \[T, 24\]")


def test_wrong_dtype(xw):
    x, w = xw
    _err(x.to(torch.int32), w, match="x dtype")
    _err(x.double(), w, match="x dtype")
    _err(x.half(), w, match="has dtype torch.float32, x has torch.float16")


def test_bfloat16_on_cpu_refused(xw):
    x, w = xw
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("interpreter only")
    _err(x.bfloat16(), w.map(lambda t: t.bfloat16()), match="bfloat16 on the CPU")


def test_wrong_device(xw):
    x, w = xw
    _err(x.to("meta"), w, match="CUDA device")


def test_non_contiguous(xw):
    x, w = xw
    _err(torch.randn(24, 3).t(), w, match="x must be contiguous")
    bad = w.map(lambda t: t)
    gu = torch.randn(5, 24, 40).transpose(1, 2)
    _err(x, type(w)(**{**bad.arrays(), "gate_up": gu}), match="gate_up must be contiguous")


def test_weight_shape_disagrees_with_config(xw):
    x, w = xw
    _err(x, type(w)(**{**w.arrays(), "down": torch.randn(5, 24, 21)}), match=r"down must have shape \[5, 24, 20\]")
    _err(x, type(w)(**{**w.arrays(), "router_bias": torch.randn(5)}), match="router_bias is given")
    cfg = CFG.replace(router_bias=True)
    _err(x, w, cfg, match="router_bias is missing")


def test_not_a_tensor(xw):
    x, w = xw
    _err(x.numpy(), w, match="torch.Tensor")
    _err(x, random_weights(CFG, seed=0), match="torch.Tensor")


def test_32bit_overflow():
    """T*H past 2^31 elements: refused before anything is allocated (meta tensors hold no memory)."""
    cfg = MoEConfig(hidden_size=4096, intermediate_size=64, num_experts=4, top_k=2)
    x = torch.empty((2**20, 4096), device="meta")
    _err(x, None, cfg, match="weights must be a MoEWeights")
    w = random_weights(cfg.replace(hidden_size=16), seed=0).to_torch("cpu")
    _err(x, w, cfg, match="overflows 32-bit indexing")


# ---------------------------------------------------------------- bind: the weights against the config, once

BIG = MoEConfig(hidden_size=128, intermediate_size=32, num_experts=8, top_k=2)


@pytest.mark.parametrize("change, match", [
    # H = 64 weights under H = 128: the kernels would read past every weight row
    (dict(hidden_size=64), r"router_weight must have shape \[8, 128\], got \[8, 64\]"),
    # E = 16 weights under E = 8: would answer plausibly from the first 8 experts
    (dict(num_experts=16), r"router_weight must have shape \[8, 128\], got \[16, 128\]"),
    # the expert width alone disagrees: named on gate_up, the first tensor that shows it
    (dict(intermediate_size=16), r"gate_up must have shape \[8, 64, 128\], got \[8, 32, 128\]"),
])
def test_bind_checks_weights_against_config(change, match, device):
    from megamoe.kernels import KernelInputError, bind

    w = random_weights(BIG.replace(**change), seed=0).to_torch(device.name, device.torch_dtype())
    with pytest.raises(KernelInputError, match=match):
        bind(w, BIG)


def test_bind_refuses_mixed_dtypes_and_bad_x(device):
    from megamoe.kernels import KernelInputError, bind

    w = random_weights(BIG, seed=0).to_torch(device.name, device.torch_dtype())
    with pytest.raises(KernelInputError, match="weights.down has dtype torch.float64"):
        bind(type(w)(**{**w.arrays(), "down": w.down.double()}), BIG)
    f = bind(w, BIG)
    with pytest.raises(KernelInputError, match=r"x must be \[T, 128\].*got list"):
        f([[0.0] * 128])
    with pytest.raises(KernelInputError, match=r"x must be \[T, 128\].*got \[5, 64\]"):
        f(torch.zeros((5, 64), device=device.name, dtype=device.torch_dtype()))


FP8 = MoEConfig(hidden_size=128, intermediate_size=128, num_experts=4, top_k=2)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0])
def test_fp8_scales_checked_at_bind_and_forward(value, device):
    """NaN or negative block scales gave outputs of absmax 1e-4 and 7.6e5 without a word."""
    import dataclasses

    from megamoe.kernels import KernelInputError, bind, moe_forward

    w = random_weights(FP8, seed=0, fp8=True).to_torch(device.name, device.torch_dtype())
    s = w.down_scale_inv.clone()
    s[1, 0, 0] = value
    bad = dataclasses.replace(w, down_scale_inv=s)
    match = rf"weights.down_scale_inv \(shape \[4, 1, 1\]\) must be finite and > 0, got {value} at index \(1, 0, 0\)"
    with pytest.raises(KernelInputError, match=match):
        bind(bad, FP8)
    x = torch.zeros((3, 128), device=device.name, dtype=device.torch_dtype())
    with pytest.raises(KernelInputError, match=match):
        moe_forward(x, bad, FP8)


def test_fp8_scales_read_again_after_an_inplace_change(device):
    """The scale values are read once per tensor, and again once the tensor is written in place."""
    from megamoe.kernels import KernelInputError, bind, check_inputs

    w = random_weights(FP8, seed=0, fp8=True).to_torch(device.name, device.torch_dtype())
    bind(w, FP8)
    x = torch.zeros((3, 128), device=device.name, dtype=device.torch_dtype())
    check_inputs(x, w, FP8)
    w.gate_up_scale_inv.fill_(-1.0)
    with pytest.raises(KernelInputError, match="gate_up_scale_inv .* must be finite and > 0, got -1.0"):
        check_inputs(x, w, FP8)


def test_moe_experts_refuses_non_tensors_and_bad_biases(device):
    from megamoe.kernels import KernelInputError, moe_experts

    w = random_weights(CFG, seed=0).to_torch(device.name, device.torch_dtype())
    x = torch.zeros((3, 24), device=device.name, dtype=device.torch_dtype())
    idx = torch.tensor([[0, 1]] * 3, device=device.name)
    tw = torch.ones((3, 2), device=device.name)
    with pytest.raises(KernelInputError, match=r"topk_idx must be a torch.Tensor \(T, K\) of integer expert ids, got list"):
        moe_experts(x, idx.tolist(), tw, w.gate_up, w.down)
    with pytest.raises(KernelInputError, match="topk_weights must be a torch.Tensor .* got ndarray"):
        moe_experts(x, idx, tw.cpu().numpy(), w.gate_up, w.down)
    with pytest.raises(KernelInputError, match=r"gate_up_bias must have shape \[5, 40\] .* got \[5, 20\]"):
        moe_experts(x, idx, tw, w.gate_up, w.down, gate_up_bias=torch.zeros((5, 20), device=device.name,
                                                                              dtype=device.torch_dtype()))
