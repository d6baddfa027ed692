"""kernels.torch_ffn.gated_activation equals the reference's activation (float64) for both
activation families, with the clamps of gpt-oss's swiglu reached."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megamoe.reference import MoEConfig
from megamoe.reference.forward import activation


@pytest.mark.parametrize("act", ["silu_gated", "clamped_swiglu"])
def test_gated_activation_matches_the_reference(act, rng):
    from megamoe.kernels.torch_ffn import gated_activation

    cfg = MoEConfig(hidden_size=8, intermediate_size=12, num_experts=2, top_k=1, activation=act, swiglu_limit=1.5)
    z = 4 * rng.standard_normal((7, 2 * cfg.intermediate_size))  # |z| beyond the limit: both clamps act
    got = gated_activation(torch.from_numpy(z), cfg.intermediate_size, act, cfg.swiglu_alpha, cfg.swiglu_limit)
    np.testing.assert_allclose(got.numpy(), activation(z, cfg), rtol=1e-12, atol=1e-12)
