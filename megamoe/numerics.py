"""Check a kernel's output against the float64 reference, on a sample of tokens.

Shape legend: T tokens, S sampled tokens, E experts, K top-k, H hidden, I expert width.

Tokens are independent, so the reference runs on S sampled tokens with only the experts they pick
copied to the host. Low-precision inputs are compared with the reference of the same rounded
values; thresholds are ``reference.tolerance.TOLERANCES``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from megamoe.reference import (
    ErrorReport,
    MoEConfig,
    MoEWeights,
    combine,
    experts_forward,
    normalized_error,
    plan_dispatch,
    route,
    shared_forward,
    tolerance_for,
)


def _to_f64(a) -> np.ndarray | None:
    if a is None:
        return None
    if hasattr(a, "detach"):
        return a.detach().double().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def _dequantized(codes, scale_inv) -> np.ndarray | None:
    from megamoe.reference.fp8 import dequantize_weight_blocks

    return None if codes is None else dequantize_weight_blocks(_to_f64(codes), _to_f64(scale_inv))


class _LazyExperts:
    """``view[e]``: expert e's slice of a stacked (E, ...) tensor as float64 NumPy, copied on first use;
    with ``scale_inv``, FP8 codes dequantized by their 128 x 128 block scales."""

    def __init__(self, stacked, scale_inv=None):
        self._stacked, self._scale_inv = stacked, scale_inv
        self._cache: dict[int, np.ndarray] = {}

    def __getitem__(self, e) -> np.ndarray:
        e = int(e)
        if e not in self._cache:
            s = self._stacked[e]
            self._cache[e] = _to_f64(s) if self._scale_inv is None else _dequantized(s, self._scale_inv[e])
        return self._cache[e]


@dataclass(frozen=True)
class NumericsReport:
    """Normalized error of a kernel's output on S sampled tokens, against the float64 reference."""

    dtype: str
    sampled_tokens: int
    error: ErrorReport
    limit_max: float
    limit_rms: float
    routing_agreement: float  # fraction of sampled (token, expert) choices the kernel made too, or nan

    @property
    def ok(self) -> bool:
        return self.error.max_err <= self.limit_max and self.error.rms_err <= self.limit_rms

    def to_dict(self) -> dict:
        return {
            "dtype": self.dtype, "sampled_tokens": self.sampled_tokens, "max_err": self.error.max_err,
            "rms_err": self.error.rms_err, "limit_max": self.limit_max, "limit_rms": self.limit_rms,
            "routing_agreement": self.routing_agreement, "ok": self.ok,
        }


def reference_on_tokens(x_rows, weights: MoEWeights, config: MoEConfig, *, fp8_activations: bool | None = None):
    """The reference layer on S rows. x_rows: (S, H) -> (y (S, H) float64, topk_idx (S, K)).

    ``weights`` may hold torch tensors on any device (only picked experts are copied). FP8 weights
    (``weights.is_fp8``) give the reference's FP8 layer; ``fp8_activations`` as
    ``reference.moe_forward``'s (None: follow the weights)."""
    x = _to_f64(x_rows)
    fp8_activations = weights.is_fp8 if fp8_activations is None else fp8_activations
    router_weight = _to_f64(weights.router_weight)
    r = route(x, router_weight, config, _to_f64(weights.router_bias), _to_f64(weights.score_bias))
    plan = plan_dispatch(r.topk_idx, config.num_experts)
    if weights.is_fp8:
        experts = dict(gate_up=_LazyExperts(weights.gate_up, weights.gate_up_scale_inv),
                       down=_LazyExperts(weights.down, weights.down_scale_inv),
                       shared_gate_up=_dequantized(weights.shared_gate_up, weights.shared_gate_up_scale_inv),
                       shared_down=_dequantized(weights.shared_down, weights.shared_down_scale_inv))
    else:
        experts = dict(gate_up=_LazyExperts(weights.gate_up), down=_LazyExperts(weights.down),
                       shared_gate_up=_to_f64(weights.shared_gate_up), shared_down=_to_f64(weights.shared_down))
    lazy = MoEWeights(
        router_weight=router_weight, **experts,
        gate_up_bias=None if weights.gate_up_bias is None else _LazyExperts(weights.gate_up_bias),
        down_bias=None if weights.down_bias is None else _LazyExperts(weights.down_bias),
        shared_gate=_to_f64(weights.shared_gate),
    )
    y = combine(experts_forward(x, r, plan, lazy, config, fp8_activations=fp8_activations), plan, r.topk_weights,
                config)
    return y + shared_forward(x, lazy, config, fp8_activations=fp8_activations), r.topk_idx


@dataclass(frozen=True)
class SampledReference:
    """The reference on the tokens ``check_numerics`` samples: rows (S,), y_ref (S, H) float64,
    ref_idx (S, K); computed once and shared by checks of the same x and weights."""

    rows: np.ndarray
    y_ref: np.ndarray
    ref_idx: np.ndarray


def sample_rows(T: int, sample: int, seed: int) -> np.ndarray:
    """The sorted token rows a check with ``sample`` and ``seed`` compares on T tokens."""
    return np.sort(np.random.default_rng(seed).choice(T, size=min(sample, T), replace=False))


def sampled_reference(x, weights: MoEWeights, config: MoEConfig, *, sample: int = 16, seed: int = 0,
                      fp8_activations: bool | None = None) -> SampledReference:
    """``check_numerics``'s reference for x (T >= 1 tokens): the rows it samples and the reference
    layer on them (``reference_on_tokens``)."""
    rows = sample_rows(int(x.shape[0]), sample, seed)
    y_ref, ref_idx = reference_on_tokens(x[rows], weights, config, fp8_activations=fp8_activations)
    return SampledReference(rows, y_ref, ref_idx)


def check_numerics(x, y, weights: MoEWeights, config: MoEConfig, *, dtype: str, sample: int = 16,
                   seed: int = 0, topk_idx=None, fp8_activations: bool | None = None,
                   reference: SampledReference | None = None) -> NumericsReport:
    """Compare a kernel's y (T, H) with the reference on ``sample`` tokens drawn with ``seed``.

    x, y: torch or NumPy; ``topk_idx`` (T, K): the kernel's routing, reported as the fraction of
    the reference's choices it agrees with. ``reference``: ``sampled_reference`` of the same
    inputs (its rows must be the ones this check samples)."""
    T = int(x.shape[0])
    if T == 0:
        tmax, trms = tolerance_for(dtype)
        return NumericsReport(dtype, 0, ErrorReport(0.0, 0.0), tmax, trms, float("nan"))
    rows = sample_rows(T, sample, seed)
    if reference is None:
        y_ref, ref_idx = reference_on_tokens(x[rows], weights, config, fp8_activations=fp8_activations)
    elif not np.array_equal(reference.rows, rows):
        raise ValueError(f"check_numerics: the reference was sampled on rows {reference.rows.tolist()}, this check "
                         f"samples {rows.tolist()} (T={T}, sample={sample}, seed={seed}): pass the same sample and seed")
    else:
        y_ref, ref_idx = reference.y_ref, reference.ref_idx
    err = normalized_error(_to_f64(y[rows]), y_ref)
    agree = float("nan")
    if topk_idx is not None:
        k_idx = _to_f64(topk_idx[rows]).astype(np.int64)
        agree = float(np.mean([len(set(a) & set(b)) / len(a) for a, b in zip(ref_idx.tolist(), k_idx.tolist())]))
    tmax, trms = tolerance_for(dtype)
    return NumericsReport(dtype, len(rows), err, tmax, trms, agree)
