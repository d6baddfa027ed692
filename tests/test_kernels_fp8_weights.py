"""kernels/fp8_weights.py (the benchmark's on-device quantizer) against reference.fp8, on CPU torch:
codes bit for bit and scales exactly, partial blocks included. No Triton: it is plain torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megamoe.kernels.fp8_weights import quantize_weight_blocks, to_fp8
from megamoe.reference import MoEConfig, random_weights
from megamoe.reference.fp8 import quantize_weight_blocks as ref_quantize
from megamoe.reference.weights import SCALE_FIELDS, expected_scale_shapes

#: name -> (shape, why)
SHAPES = {
    "one_partial_block": ((1, 77, 45), "smaller than one block both ways"),
    "odd_both_ways": ((3, 200, 136), "H=200, I=136: a partial last block each way"),
    "whole_and_partial": ((2, 256, 130), "whole row blocks, a 2-column last block"),
    "matrix": ((129, 257), "2-D (a shared MLP's matrix): one row and one column past a block"),
}


def _codes(q: torch.Tensor) -> np.ndarray:
    return q.view(torch.uint8).numpy()


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_codes_and_scales_equal_the_reference(name, dtype, rng):
    """bf16 inputs land on e4m3 ties often (the reference's docstring): the float32 divisions must match."""
    shape = SHAPES[name][0]
    a = rng.standard_normal(shape) * np.exp(rng.uniform(-6, 3, shape))  # magnitudes over many binades
    a[..., :5, :7] = 0.0  # an all-zero corner: AMAX_FLOOR keeps its scale finite when a block is all zero
    if len(shape) == 3 and shape[1] > 128:
        a[0, 128:, :] = 0.0  # a whole row of zero blocks, the partial one included
    w = torch.from_numpy(a).to(getattr(torch, dtype))
    q, s = quantize_weight_blocks(w)
    rq, rs = ref_quantize(w.double().numpy())
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert s.shape == rs.shape and q.shape == w.shape
    np.testing.assert_array_equal(s.numpy(), rs)  # exact
    np.testing.assert_array_equal(_codes(q), rq)  # bit for bit


def test_slices_of_the_leading_dimension_agree(rng):
    """The chunking over experts (a DeepSeek-V3 gate_up is 30 GB in float32) changes nothing."""
    w = torch.from_numpy(rng.standard_normal((5, 130, 140))).to(torch.bfloat16)
    q1, s1 = quantize_weight_blocks(w)
    q2, s2 = quantize_weight_blocks(w, chunk_elems=130 * 140 * 2)  # slices of 2, 2, 1 experts
    assert torch.equal(s1, s2) and torch.equal(q1.view(torch.uint8), q2.view(torch.uint8))


def test_extreme_blocks_saturate_not_nan():
    """A block's largest value lands on 448 (float32 rounding may put it a hair above): never NaN."""
    w = torch.tensor([[3.0e38, -3.0e38, 1.0], [1e-30, 0.0, -7.0]], dtype=torch.float32)
    q, s = quantize_weight_blocks(w)
    rq, rs = ref_quantize(w.numpy())
    np.testing.assert_array_equal(_codes(q), rq)
    np.testing.assert_array_equal(s.numpy(), rs)
    assert not torch.isnan(q.float()).any()


def test_to_fp8_has_the_fields_of_the_reference(rng):
    """Same fields, shapes and values as MoEWeights.to_fp8().to_torch(); the router stays as it was."""
    cfg = MoEConfig(hidden_size=200, intermediate_size=136, num_experts=4, top_k=2, num_shared_experts=1,
                    shared_intermediate_size=72, router="sigmoid_grouped_topk", n_group=2, topk_group=1,
                    score_bias=True)
    w = random_weights(cfg, seed=int(rng.integers(1 << 30)))
    wt = w.to_torch("cpu", torch.bfloat16)
    got = to_fp8(wt)
    want = w.round_to("bfloat16").to_fp8().to_torch("cpu", torch.bfloat16)
    assert got.is_fp8
    got.validate(cfg)
    assert sorted(got.arrays()) == sorted(want.arrays())
    for k, t in got.arrays().items():
        assert t.dtype == want.arrays()[k].dtype, k
        if k in SCALE_FIELDS:
            assert tuple(t.shape) == expected_scale_shapes(cfg)[k]
        same = torch.equal(t.view(torch.uint8), want.arrays()[k].view(torch.uint8)) if t.dtype == torch.float8_e4m3fn \
            else torch.equal(t, want.arrays()[k])
        assert same, k
    assert got.router_weight is wt.router_weight and got.score_bias is wt.score_bias


@pytest.mark.parametrize("bad, match", [
    (torch.zeros(4, dtype=torch.float32), "at least 2 dimensions"),
    (torch.zeros(4, 4, dtype=torch.int32), "float tensor"),
    (torch.zeros(4, 4).to(torch.float8_e4m3fn), "already"),
    (torch.tensor([[1.0, float("nan")]]), "non-finite"),
])
def test_bad_inputs_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        quantize_weight_blocks(bad)


def test_fp8_weights_are_refused_by_to_fp8(rng):
    cfg = MoEConfig(hidden_size=64, intermediate_size=32, num_experts=2, top_k=1)
    w = to_fp8(random_weights(cfg, seed=1).to_torch("cpu", torch.bfloat16))
    with pytest.raises(ValueError, match="FP8 already"):
        to_fp8(w)


@pytest.mark.gpu
def test_on_the_gpu_too(rng):
    """CUDA's division must be the correctly rounded one (not a multiply by the reciprocal): the same
    codes and scales as the reference from a bf16 tensor on the GPU."""
    w = torch.from_numpy(rng.standard_normal((3, 200, 136))).to(torch.bfloat16)
    q, s = quantize_weight_blocks(w.cuda())
    rq, rs = ref_quantize(w.double().numpy())
    np.testing.assert_array_equal(s.cpu().numpy(), rs)
    np.testing.assert_array_equal(_codes(q.cpu()), rq)
