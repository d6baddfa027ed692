"""Input checks shared by the reference stages (and their two errors): clear errors instead of NumPy tracebacks."""

from __future__ import annotations

import numpy as np


class InputError(ValueError):
    """An input array has a bad shape, dtype or value; the message names it and what was expected."""


class ConfigError(ValueError):
    """A config field has a bad value; the message names the field and what was expected."""


def as_float_array(name: str, a, shape: tuple, *, finite: bool = True) -> np.ndarray:
    """``a`` as a float64 array of ``shape`` (None entries match any size)."""
    if hasattr(a, "detach"):  # a torch tensor
        a = a.detach().cpu().float().numpy() if str(a.dtype) == "torch.bfloat16" else a.detach().cpu().numpy()
    a = np.asarray(a)
    if a.dtype.kind != "f":
        raise InputError(f"{name} must be a real floating-point array, got dtype {a.dtype}")
    check_shape(name, a, shape)
    a = a.astype(np.float64, copy=False)
    if finite and a.size and not np.isfinite(a).all():
        bad = np.argwhere(~np.isfinite(a))[0]
        raise InputError(f"{name} has a non-finite value {a[tuple(bad)]} at index {tuple(int(i) for i in bad)}")
    return a


def check_shape(name: str, a: np.ndarray, shape: tuple) -> None:
    if a.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, a.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise InputError(f"{name} must have shape {want}, got {list(a.shape)}")


def as_index_array(name: str, a, shape: tuple, upper: int) -> np.ndarray:
    """``a`` as an int64 array of ``shape`` with every value in [0, upper)."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise InputError(f"{name} must be an integer array, got dtype {a.dtype}")
    check_shape(name, a, shape)
    a = a.astype(np.int64, copy=False)
    if a.size and (a.min() < 0 or a.max() >= upper):
        bad = a[(a < 0) | (a >= upper)][0]
        raise InputError(f"{name} has value {int(bad)} outside [0, {upper})")
    return a


def check_distinct_rows(name: str, idx: np.ndarray, what: str) -> np.ndarray:
    """``idx`` (T, K), after checking that no row names one ``what`` twice."""
    if idx.shape[0] and idx.shape[1] > 1:
        s = np.sort(idx, axis=1)
        dup = np.nonzero((s[:, 1:] == s[:, :-1]).any(axis=1))[0]
        if dup.size:
            raise InputError(f"{name} row {int(dup[0])} names {what} twice: {idx[dup[0]].tolist()}")
    return idx
