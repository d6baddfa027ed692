"""Routers: from hidden states to (expert ids, routing weights) per token.

Shape legend: T tokens, E routed experts, K top-k, H hidden size.

Every router first computes logits = x @ Wr^T (+ b_r): [T, E]. Then, by ``MoEConfig.router``:

``softmax_topk`` (Mixtral, Qwen2/3-MoE)
    p = softmax(logits); the K largest p; w = p_topk / sum(p_topk) if norm_topk_prob else p_topk.
``topk_softmax`` (gpt-oss)
    the K largest logits; w = softmax over those K logits.
``sigmoid_grouped_topk`` (DeepSeek-V3/R1, Kimi K2; topk_method noaux_tc)
    s = sigmoid(logits); b = s + e_score_correction_bias (used for selection only).
    If n_group > 1: a group's score is the sum of its top-2 b; keep the topk_group best groups and
    set the others' b to -inf (``group_mask="neg_inf"``, default) or 0.0 (``"zero"``, transformers
    4.x). The K largest b choose the experts;
    w = s_topk / (sum(s_topk) + 1e-20) if norm_topk_prob else s_topk; then w *= routed_scaling_factor.
``sigmoid_top1_input`` (Llama 4)
    the K largest logits; w = sigmoid(logit). The weight scales the expert's *input* (see forward.py).

Ties go to the lower expert (and group) index; ``topk_idx[t]`` lists a token's experts in
descending selection score. Computed in float64 (the models route in float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import InputError, as_float_array
from .config import MoEConfig


@dataclass(frozen=True)
class Routing:
    """The router's decision for T tokens.

    topk_idx: (T, K) int64, expert ids, each row distinct, in descending selection score.
    topk_weights: (T, K) float64, the routing weights (see the module docstring per router).
    logits: (T, E) float64, the router logits (x @ Wr^T + b_r).
    """

    topk_idx: np.ndarray
    topk_weights: np.ndarray
    logits: np.ndarray

    @property
    def num_tokens(self) -> int:
        return self.topk_idx.shape[0]


def _topk_desc(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of each row, descending, ties to the lower index."""
    order = np.argsort(-scores, axis=-1, kind="stable")
    return order[..., :k]


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-z))


def router_logits(x, router_weight, router_bias=None) -> np.ndarray:
    """logits = x @ Wr^T (+ b_r).  x: (T, H), router_weight: (E, H), router_bias: (E,) -> (T, E)."""
    w = as_float_array("router_weight", router_weight, (None, None))
    x = as_float_array("x", x, (None, w.shape[1]))
    logits = x @ w.T
    if router_bias is not None:
        logits = logits + as_float_array("router_bias", router_bias, (w.shape[0],))
    return logits


def select_experts(logits, config: MoEConfig, score_bias=None) -> tuple[np.ndarray, np.ndarray]:
    """The router's top-k from logits.  logits: (T, E) -> topk_idx (T, K) int64, topk_weights (T, K)."""
    E, K = config.num_experts, config.top_k
    logits = as_float_array("logits", logits, (None, E))
    T = logits.shape[0]
    if T == 0:
        return np.zeros((0, K), np.int64), np.zeros((0, K), np.float64)
    kind = config.router
    if kind == "softmax_topk":
        p = _softmax(logits)
        idx = _topk_desc(p, K)
        w = np.take_along_axis(p, idx, axis=1)
        if config.norm_topk_prob:
            w = w / w.sum(axis=1, keepdims=True)
    elif kind == "topk_softmax":
        idx = _topk_desc(logits, K)
        w = _softmax(np.take_along_axis(logits, idx, axis=1))
    elif kind == "sigmoid_top1_input":
        idx = _topk_desc(logits, K)
        w = _sigmoid(np.take_along_axis(logits, idx, axis=1))
    elif kind == "sigmoid_grouped_topk":
        s = _sigmoid(logits)
        if config.score_bias:
            if score_bias is None:
                raise InputError("config.score_bias is True but no score_bias (e_score_correction_bias) was given")
            b = s + as_float_array("score_bias", score_bias, (E,))
        else:
            if score_bias is not None:
                raise InputError("score_bias given but config.score_bias is False")
            b = s
        if config.n_group > 1:
            G = config.n_group
            grouped = b.reshape(T, G, E // G)
            group_score = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)  # (T, G): sum of top-2
            keep_groups = _topk_desc(group_score, config.topk_group)  # (T, topk_group)
            keep = np.zeros((T, G), dtype=bool)
            np.put_along_axis(keep, keep_groups, True, axis=1)
            keep_e = np.repeat(keep, E // G, axis=1)
            fill = 0.0 if config.group_mask == "zero" else -np.inf
            b = np.where(keep_e, b, fill)
        idx = _topk_desc(b, K)
        w = np.take_along_axis(s, idx, axis=1)
        if config.norm_topk_prob:
            w = w / (w.sum(axis=1, keepdims=True) + 1e-20)
        w = w * config.routed_scaling_factor
    else:  # pragma: no cover - MoEConfig validates router
        raise AssertionError(kind)
    return idx.astype(np.int64), w.astype(np.float64)


def route(x, router_weight, config: MoEConfig, router_bias=None, score_bias=None) -> Routing:
    """Route T tokens.  x: (T, H); router_weight: (E, H); router_bias, score_bias: (E,) or None."""
    H, E = config.hidden_size, config.num_experts
    router_weight = as_float_array("router_weight", router_weight, (E, H))
    x = as_float_array("x", x, (None, H))
    if config.router_bias and router_bias is None:
        raise InputError("config.router_bias is True but no router_bias was given")
    if not config.router_bias and router_bias is not None:
        raise InputError("router_bias given but config.router_bias is False")
    logits = router_logits(x, router_weight, router_bias)
    idx, w = select_experts(logits, config, score_bias)
    return Routing(topk_idx=idx, topk_weights=w, logits=logits)
