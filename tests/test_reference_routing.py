"""Routers against hand-computed cases, one per family, and the DeepSeek group-mask choice."""

from __future__ import annotations

import numpy as np
import pytest

from megamoe.reference import InputError, MoEConfig, route, select_experts


def cfg(**kw):
    base = dict(hidden_size=4, intermediate_size=4, num_experts=4, top_k=2)
    return MoEConfig(**{**base, **kw})


def softmax(z):
    e = np.exp(z - np.max(z))
    return e / e.sum()


def sig(z):
    return 1 / (1 + np.exp(-np.asarray(z, float)))


def test_softmax_topk_renormalized():
    logits = np.array([[1.0, 3.0, 2.0, 0.0]])
    idx, w = select_experts(logits, cfg())
    assert idx.tolist() == [[1, 2]]
    p = softmax(logits[0])
    np.testing.assert_allclose(w[0], [p[1] / (p[1] + p[2]), p[2] / (p[1] + p[2])], rtol=1e-14)


def test_softmax_topk_not_renormalized():
    logits = np.array([[1.0, 3.0, 2.0, 0.0]])
    _, w = select_experts(logits, cfg(norm_topk_prob=False))
    np.testing.assert_allclose(w[0], softmax(logits[0])[[1, 2]], rtol=1e-14)


def test_topk_softmax_softmax_over_the_k():
    logits = np.array([[0.5, -1.0, 2.0, 1.5]])
    idx, w = select_experts(logits, cfg(router="topk_softmax"))
    assert idx.tolist() == [[2, 3]]
    np.testing.assert_allclose(w[0], softmax(np.array([2.0, 1.5])), rtol=1e-14)


def test_llama4_sigmoid_of_the_top_logit():
    logits = np.array([[0.5, -1.0, 2.0, 1.5]])
    idx, w = select_experts(logits, cfg(router="sigmoid_top1_input", top_k=1))
    assert idx.tolist() == [[2]]
    np.testing.assert_allclose(w[0], sig([2.0]), rtol=1e-14)


def deepseek_cfg(**kw):
    base = dict(hidden_size=4, intermediate_size=4, num_experts=8, top_k=2, router="sigmoid_grouped_topk",
                n_group=4, topk_group=2, routed_scaling_factor=2.5, score_bias=True)
    return MoEConfig(**{**base, **kw})


def test_deepseek_grouped_topk_by_hand():
    # 4 groups of 2. Scores s = sigmoid(logits); bias shifts selection only.
    logits = np.array([[2.0, 1.0, -3.0, -3.0, 0.0, 0.5, 3.0, -4.0]])
    bias = np.array([0.0, 0.0, 0.0, 0.0, 0.3, 0.3, 0.0, 0.0])
    s = sig(logits[0])
    b = s + bias
    # group scores: sum of top-2 of b in each group
    g = [b[0] + b[1], b[2] + b[3], b[4] + b[5], b[6] + b[7]]
    assert np.argsort(g)[::-1][:2].tolist() == [2, 0]  # groups 2 and 0 kept (g3 has a -4 logit)
    idx, w = select_experts(logits, deepseek_cfg(), score_bias=bias)
    # among experts {0,1,4,5}: b = s0, s1, s4+.3, s5+.3 -> top-2 by b
    cand = {0: b[0], 1: b[1], 4: b[4], 5: b[5]}
    want = sorted(cand, key=lambda e: -cand[e])[:2]
    assert idx[0].tolist() == want
    np.testing.assert_allclose(w[0], 2.5 * s[want] / s[want].sum(), rtol=1e-13)
    # expert 6 has the largest single score but sits in a dropped group
    assert 6 not in idx[0]


def test_deepseek_group_mask_zero_vs_neg_inf():
    # Kept experts have negative biased scores: with HF's 0.0 fill a masked expert can win.
    logits = np.array([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    bias = np.array([-0.9, -0.9, -2.0, -2.0, -2.0, -2.0, -2.0, -2.0])  # group 0 best, all b < 0
    c = deepseek_cfg(n_group=4, topk_group=1, top_k=2)
    assert c.group_mask == "neg_inf"  # the default, as transformers 5, vLLM and DeepSeek's code
    idx_zero, _ = select_experts(logits, c.replace(group_mask="zero"), score_bias=bias)
    idx_inf, _ = select_experts(logits, c, score_bias=bias)
    assert idx_inf[0].tolist() == [0, 1]  # only the kept group can be chosen
    assert idx_zero[0].tolist() == [2, 3]  # masked experts (0.0) beat kept ones (-0.4): transformers 4.x
    # when biased scores are positive the two agree
    idx_a, _ = select_experts(logits, c.replace(group_mask="zero"), score_bias=np.abs(bias) * 0.1)
    idx_b, _ = select_experts(logits, c, score_bias=np.abs(bias) * 0.1)
    assert idx_a.tolist() == idx_b.tolist()


def test_deepseek_without_norm_and_single_group():
    c = deepseek_cfg(n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=2.0)
    logits = np.array([[0.1, 0.2, 0.3, 0.4, -0.1, -0.2, -0.3, 0.05]])
    idx, w = select_experts(logits, c, score_bias=np.zeros(8))
    assert idx[0].tolist() == [3, 2]
    np.testing.assert_allclose(w[0], 2.0 * sig([0.4, 0.3]), rtol=1e-14)


def test_ties_go_to_the_lower_index():
    idx, _ = select_experts(np.zeros((1, 4)), cfg(top_k=3))
    assert idx.tolist() == [[0, 1, 2]]


def test_route_uses_router_bias():
    c = cfg(router="topk_softmax", router_bias=True)
    x = np.array([[1.0, 0.0, 0.0, 0.0]])
    wr = np.eye(4)
    r = route(x, wr, c, router_bias=np.array([0.0, 5.0, 0.0, 0.0]))
    np.testing.assert_allclose(r.logits, [[1.0, 5.0, 0.0, 0.0]])
    assert r.topk_idx.tolist() == [[1, 0]]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(x=np.ones((2, 3))), r"x must have shape \[\*, 4\], got \[2, 3\]"),
        (dict(x=np.array([[1.0, np.nan, 0, 0]])), "x has a non-finite value nan at index"),
        (dict(x=np.array([[1.0, np.inf, 0, 0]])), "non-finite value inf"),
        (dict(x=np.array([["a", "b", "c", "d"]])), "x must be a real floating-point array"),
        (dict(router_weight=np.ones((3, 4))), r"router_weight must have shape \[4, 4\]"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    args = dict(x=np.ones((2, 4)), router_weight=np.eye(4))
    args.update(kwargs)
    with pytest.raises(InputError, match=message):
        route(args["x"], args["router_weight"], cfg())


def test_missing_biases_are_errors():
    with pytest.raises(InputError, match="router_bias is True but no router_bias"):
        route(np.ones((1, 4)), np.eye(4), cfg(router_bias=True))
    with pytest.raises(InputError, match="no score_bias"):
        select_experts(np.zeros((1, 8)), deepseek_cfg())


def test_zero_tokens():
    r = route(np.zeros((0, 4)), np.eye(4), cfg())
    assert r.topk_idx.shape == (0, 2) and r.topk_weights.shape == (0, 2)


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.complex128])
def test_non_float_x_is_refused(dtype):
    with pytest.raises(InputError, match=f"x must be a real floating-point array, got dtype {np.dtype(dtype)}"):
        route(np.ones((2, 4), dtype=dtype), np.eye(4), cfg())
