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
