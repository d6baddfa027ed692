"""megamoe.numerics: sampled-token checks against the reference catch wrong outputs."""

from __future__ import annotations

import numpy as np
import pytest

from megamoe.numerics import check_numerics, reference_on_tokens
from megamoe.reference import PRESETS, MoEConfig, moe_forward, random_weights


def tiny(name):
    c = MoEConfig.preset(name)
    return c.replace(hidden_size=24, intermediate_size=10, shared_intermediate_size=12 * c.num_shared_experts)


@pytest.mark.parametrize("name", PRESETS)
def test_sampled_reference_equals_full_reference(name, rng):
    c = tiny(name)
    w = random_weights(c, seed=0)
    x = rng.standard_normal((31, c.hidden_size))
    rows = np.array([0, 5, 30])
    y_rows, idx = reference_on_tokens(x[rows], w, c)
    full = moe_forward(x, w, c, details=True)
    np.testing.assert_allclose(y_rows, full.y[rows], rtol=1e-12, atol=1e-12)
    assert (idx == full.routing.topk_idx[rows]).all()


def test_check_numerics_passes_right_and_fails_wrong(rng):
    torch = pytest.importorskip("torch")
    c = tiny("deepseek-v3")
    w = random_weights(c, seed=1)
    x = rng.standard_normal((40, c.hidden_size))
    out = moe_forward(x, w, c, details=True)
    tw = w.to_torch(dtype=torch.float64)  # lazy access works on torch tensors
    good = check_numerics(torch.from_numpy(x), torch.from_numpy(out.y), tw, c, dtype="float32",
                          sample=40, topk_idx=torch.from_numpy(out.routing.topk_idx))
    assert good.ok and good.routing_agreement == 1.0 and good.sampled_tokens == 40
    bad_y = out.y.copy()
    bad_y[7] += 0.1 * np.abs(out.y).max()  # one token wrong
    bad = check_numerics(x, bad_y, w, c, dtype="bfloat16", sample=40)
    assert not bad.ok and bad.error.max_err == pytest.approx(0.1, rel=1e-6)


def test_check_numerics_zero_tokens():
    c = tiny("mixtral-8x7b")
    rep = check_numerics(np.zeros((0, 24)), np.zeros((0, 24)), random_weights(c, 0), c, dtype="float16")
    assert rep.ok and rep.sampled_tokens == 0


@pytest.mark.parametrize("fp8_activations", [False, True], ids=["w8", "w8a8"])
def test_sampled_reference_of_fp8_weights(fp8_activations, rng):
    """FP8 weights as the benchmarks hold them (torch float8_e4m3fn codes, float32 scales): the
    sampled reference is the reference's FP8 layer on those rows, shared MLP included."""
    torch = pytest.importorskip("torch")
    # 32 experts in 8 groups (grouped top-k still picks across groups); 136, 130: a partial 128-block of scales
    c = tiny("deepseek-v3").replace(hidden_size=136, intermediate_size=130, shared_intermediate_size=40, num_experts=32)
    w8 = random_weights(c, seed=2, fp8=True)
    x = rng.standard_normal((9, c.hidden_size))
    rows = np.array([1, 4, 8])
    tw = w8.to_torch(dtype=torch.float64)  # the router in float64; codes float8_e4m3fn, scales float32
    y_rows, idx = reference_on_tokens(x[rows], tw, c, fp8_activations=fp8_activations)
    full = moe_forward(x, w8, c, fp8_activations=fp8_activations, details=True)
    np.testing.assert_allclose(y_rows, full.y[rows], rtol=1e-12, atol=1e-12)
    assert (idx == full.routing.topk_idx[rows]).all()
    assert tw.gate_up.dtype == torch.float8_e4m3fn
    rep = check_numerics(x, full.y, tw, c, dtype="fp8_e4m3", sample=9, fp8_activations=fp8_activations)
    assert rep.ok and rep.error.max_err < 1e-12


def test_a_reference_computed_once_serves_every_check_of_the_same_tokens(rng):
    """sampled_reference: the rows and reference a check samples, computed once (bench_megakernel.py's backends
    and variants share it): the same report as computing it in the check; a reference of other rows (another
    seed or sample) is refused by name, not compared against the wrong tokens."""
    from megamoe.numerics import sampled_reference

    cfg = MoEConfig(hidden_size=48, intermediate_size=40, num_experts=6, top_k=2)
    w = random_weights(cfg, seed=3)
    x = rng.standard_normal((23, cfg.hidden_size))
    y = moe_forward(x, w, cfg) * (1 + 1e-3 * rng.standard_normal((23, cfg.hidden_size)))
    ref = sampled_reference(x, w, cfg, sample=8, seed=5)
    assert ref.rows.tolist() == sorted(ref.rows.tolist()) and len(ref.rows) == 8
    idx = moe_forward(x, w, cfg, details=True).routing.topk_idx
    alone = check_numerics(x, y, w, cfg, dtype="bfloat16", sample=8, seed=5, topk_idx=idx)
    shared = check_numerics(x, y, w, cfg, dtype="bfloat16", sample=8, seed=5, topk_idx=idx, reference=ref)
    assert shared == alone and shared.ok and shared.routing_agreement == 1.0
    with pytest.raises(ValueError, match=r"sampled on rows \[.*\], this check samples"):
        check_numerics(x, y, w, cfg, dtype="bfloat16", sample=8, seed=6, reference=ref)
