"""moe_forward against an independent per-token loop, and its properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megamoe.reference import (
    PRESETS,
    InputError,
    MoEConfig,
    MoEWeights,
    activation,
    assert_close,
    moe_forward,
    normalized_error,
    random_weights,
    round_to_dtype,
)


def tiny(name: str, **kw) -> MoEConfig:
    """A preset's semantics on small, odd sizes (H=19, I=11) so the test runs in milliseconds."""
    c = MoEConfig.preset(name)
    return c.replace(hidden_size=19, intermediate_size=11,
                     shared_intermediate_size=13 * c.num_shared_experts, **kw)


def naive_layer(x, w: MoEWeights, c: MoEConfig):
    """One token at a time, straight from the model definitions in shared/facts/moe-models.md."""
    def sig(z):
        return 1 / (1 + np.exp(-z))

    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        logits = w.router_weight @ x[t] + (w.router_bias if w.router_bias is not None else 0)
        if c.router == "softmax_topk":
            p = np.exp(logits - logits.max())
            p /= p.sum()
            sel = np.argsort(-p, kind="stable")[: c.top_k]
            wt = p[sel] / p[sel].sum() if c.norm_topk_prob else p[sel]
        elif c.router == "topk_softmax":
            sel = np.argsort(-logits, kind="stable")[: c.top_k]
            wt = np.exp(logits[sel] - logits[sel].max())
            wt /= wt.sum()
        elif c.router == "sigmoid_top1_input":
            sel = np.argsort(-logits, kind="stable")[: c.top_k]
            wt = sig(logits[sel])
        else:
            s = sig(logits)
            b = s + w.score_bias
            per = c.num_experts // c.n_group
            if c.n_group > 1:
                gs = [np.sort(b[g * per:(g + 1) * per])[-2:].sum() for g in range(c.n_group)]
                keep = np.argsort(-np.array(gs), kind="stable")[: c.topk_group]
                mask = np.zeros(c.num_experts, bool)
                for g in keep:
                    mask[g * per:(g + 1) * per] = True
                b = np.where(mask, b, 0.0 if c.group_mask == "zero" else -np.inf)
            sel = np.argsort(-b, kind="stable")[: c.top_k]
            wt = s[sel] / (s[sel].sum() + 1e-20) if c.norm_topk_prob else s[sel]
            wt = wt * c.routed_scaling_factor
        for e, we in zip(sel, wt):
            inp = x[t] * we if c.weight_on_input else x[t]
            z = w.gate_up[e] @ inp + (w.gate_up_bias[e] if w.gate_up_bias is not None else 0)
            g, u = z[: c.intermediate_size], z[c.intermediate_size:]
            if c.activation == "silu_gated":
                h = g * sig(g) * u
            else:
                g = np.minimum(g, c.swiglu_limit)
                u = np.clip(u, -c.swiglu_limit, c.swiglu_limit)
                h = (u + 1) * g * sig(c.swiglu_alpha * g)
            o = w.down[e] @ h + (w.down_bias[e] if w.down_bias is not None else 0)
            y[t] += o if c.weight_on_input else we * o
        if c.num_shared_experts:
            z = w.shared_gate_up @ x[t]
            g, u = np.split(z, 2)
            o = w.shared_down @ (g * sig(g) * u)
            if w.shared_gate is not None:
                o = o * sig(w.shared_gate @ x[t])
            y[t] += o
    return y


@pytest.mark.parametrize("name", PRESETS)
def test_matches_per_token_loop(name, rng):
    c = tiny(name)
    w = random_weights(c, seed=1)
    x = rng.standard_normal((23, c.hidden_size))
    assert_close(moe_forward(x, w, c), naive_layer(x, w, c), "float64", what=name)


def test_deepseek_zero_mask_matches_loop(rng):
    c = tiny("deepseek-v3", group_mask="zero")
    w = random_weights(c, seed=2)
    x = rng.standard_normal((9, c.hidden_size))
    assert_close(moe_forward(x, w, c), naive_layer(x, w, c), "float64")


def test_clamped_swiglu_by_hand():
    c = MoEConfig(hidden_size=2, intermediate_size=3, num_experts=2, top_k=1, activation="clamped_swiglu")
    z = np.array([[9.0, -1.0, 0.5, 8.0, -9.0, 0.25]])  # gate | up
    g = np.array([7.0, -1.0, 0.5])  # gate clamped above at 7
    u = np.array([7.0, -7.0, 0.25])  # up clamped to [-7, 7]
    want = (u + 1) * g / (1 + np.exp(-1.702 * g))
    np.testing.assert_allclose(activation(z, c), [want], rtol=1e-14)


def test_silu_gated_by_hand():
    c = MoEConfig(hidden_size=2, intermediate_size=2, num_experts=2, top_k=1)
    z = np.array([[1.0, -2.0, 3.0, 0.5]])
    want = np.array([1.0 / (1 + np.exp(-1.0)) * 3.0, -2.0 / (1 + np.exp(2.0)) * 0.5])
    np.testing.assert_allclose(activation(z, c), [want], rtol=1e-14)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(PRESETS), T=st.integers(1, 12), seed=st.integers(0, 10**6))
def test_permuting_tokens_permutes_outputs(name, T, seed):
    c = tiny(name)
    w = random_weights(c, seed=3)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, c.hidden_size))
    perm = rng.permutation(T)
    np.testing.assert_allclose(moe_forward(x[perm], w, c), moe_forward(x, w, c)[perm], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", PRESETS)
def test_routing_weights_sum_as_defined(name, rng):
    c = tiny(name)
    w = random_weights(c, seed=4)
    out = moe_forward(rng.standard_normal((17, c.hidden_size)), w, c, details=True)
    sums = out.routing.topk_weights.sum(axis=1)
    if c.router in ("topk_softmax",) or (c.router == "softmax_topk" and c.norm_topk_prob):
        np.testing.assert_allclose(sums, 1.0, rtol=1e-12)
    elif c.router == "sigmoid_grouped_topk":
        np.testing.assert_allclose(sums, c.routed_scaling_factor, rtol=1e-12)
    else:  # un-normalized softmax or sigmoid: each weight in (0, 1), sum below K
        assert ((out.routing.topk_weights > 0) & (out.routing.topk_weights < 1)).all()


def test_expert_with_no_tokens_and_hot_expert(rng):
    c = MoEConfig(hidden_size=8, intermediate_size=5, num_experts=6, top_k=1)
    w = random_weights(c, seed=5)
    # a router that sends every token to expert 4 (and never to the others)
    rw = np.full((6, 8), -100.0)
    rw[4] = 0.0  # x > 0, so expert 4's logit (0) beats every other (< -10)
    w = MoEWeights(router_weight=rw, gate_up=w.gate_up, down=w.down)
    x = np.abs(rng.standard_normal((10, 8))) + 0.1
    out = moe_forward(x, w, c, details=True)
    assert out.plan.counts.tolist() == [0, 0, 0, 0, 10, 0]
    # K=1 with renormalization: weight 1, so y is expert 4's FFN
    assert_close(out.y, naive_layer(x, w, c), "float64")


def test_zero_tokens_gives_empty():
    c = tiny("deepseek-v3")
    y = moe_forward(np.zeros((0, c.hidden_size)), random_weights(c, 0), c)
    assert y.shape == (0, c.hidden_size)


def test_bad_inputs_are_named(rng):
    c = tiny("mixtral-8x7b")
    w = random_weights(c, 0)
    with pytest.raises(InputError, match=r"x must have shape \[\*, 19\], got \[3, 18\]"):
        moe_forward(rng.standard_normal((3, 18)), w, c)
    with pytest.raises(InputError, match="non-finite value nan"):
        moe_forward(np.full((2, 19), np.nan), w, c)
    with pytest.raises(InputError, match=r"MoEWeights.down must have shape \[8, 19, 11\]"):
        moe_forward(rng.standard_normal((2, 19)), random_weights(c.replace(intermediate_size=12), 0).__class__(
            router_weight=w.router_weight, gate_up=w.gate_up, down=w.down[:, :, :10].copy()), c)
    with pytest.raises(InputError, match="MoEWeights.shared_gate_up is missing"):
        moe_forward(rng.standard_normal((2, 19)), w, c.replace(num_shared_experts=1, shared_intermediate_size=6))
    with pytest.raises(InputError, match="config must be a MoEConfig"):
        moe_forward(rng.standard_normal((2, 19)), w, "mixtral-8x7b")


def test_random_weights_refuses_huge_layers():
    with pytest.raises(InputError, match="needs .* GiB of float64"):
        random_weights(MoEConfig.preset("deepseek-v3"))


def test_error_metric_and_rounding():
    ref = np.array([1.0, -2.0, 4.0])
    rep = normalized_error(ref + np.array([0.0, 0.0, 0.04]), ref)
    assert rep.max_err == pytest.approx(0.01)
    assert rep.rms_err == pytest.approx(np.sqrt(0.04**2 / 3) / np.sqrt(21 / 3))
    assert normalized_error(np.array([np.nan, 0, 0]), ref).max_err == np.inf
    with pytest.raises(AssertionError, match="out: normalized error max=1.000e-02"):
        assert_close(ref + np.array([0.0, 0.0, 0.04]), ref, "float32", what="out")
    # bfloat16 keeps 8 significant bits: 1 + 2^-8 rounds to 1 (tie to even), 1 + 3 * 2^-8 to 1 + 2^-6... of 2^-7 steps
    vals = np.array([1 + 2**-8, 1 + 3 * 2**-8, 3.14159265])
    np.testing.assert_array_equal(round_to_dtype(vals, "bfloat16"), [1.0, 1 + 2**-6, 3.140625])
    torch = pytest.importorskip("torch")
    r = np.random.default_rng(0).standard_normal(1000) * 100
    np.testing.assert_array_equal(round_to_dtype(r, "bfloat16"),
                                  torch.from_numpy(r).to(torch.bfloat16).double().numpy())
