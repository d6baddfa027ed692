"""The one error metric and the one tolerance table of megamoe.

Every comparison against the float64 reference, in every test and every validation run, goes
through ``normalized_error`` and ``assert_close``:

    max_err = max|out - ref| / max|ref|          rms_err = RMS(out - ref) / RMS(ref)

Thresholds are per compute dtype; the reference is computed from the same rounded inputs, so the
kernel's arithmetic is measured, not the input rounding. FP8: the reference is the FP8 layer
itself; ``fp8_e4m3_vs_float64`` is what the FP8 layer costs against the unquantized one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: dtype -> (max_err, rms_err) thresholds (docs/design.md, "Tolerances", says where each comes from)
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-12, 1e-13),
    "float32": (1e-4, 1e-5),
    "float16": (5e-3, 1e-3),
    "bfloat16": (3e-2, 8e-3),
    "fp8_e4m3": (1.5e-2, 5e-3),  # a kernel with FP8 GEMMs against the FP8 reference
    "fp8_e4m3_vs_float64": (1.5e-1, 8e-2),  # not a kernel threshold: the FP8 layer against the float64 one
}
#: Other spellings of the dtypes above (torch's names).
ALIASES = {"float8_e4m3fn": "fp8_e4m3"}


@dataclass(frozen=True)
class ErrorReport:
    max_err: float
    rms_err: float

    def within(self, dtype: str) -> bool:
        tmax, trms = tolerance_for(dtype)
        return self.max_err <= tmax and self.rms_err <= trms


def tolerance_for(dtype) -> tuple[float, float]:
    name = str(dtype).replace("torch.", "")
    name = ALIASES.get(name, name)
    try:
        return TOLERANCES[name]
    except KeyError:
        raise ValueError(f"no tolerance for dtype {name!r}; known: {sorted(TOLERANCES)}") from None


def _as_f64(a) -> np.ndarray:
    if hasattr(a, "detach"):
        a = a.detach().cpu()
        a = a.double().numpy()
    return np.asarray(a, dtype=np.float64)


def normalized_error(out, ref) -> ErrorReport:
    """Normalized max and RMS error of ``out`` against ``ref`` (same shape). Empty arrays: 0."""
    out, ref = _as_f64(out), _as_f64(ref)
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: out {list(out.shape)} vs ref {list(ref.shape)}")
    if ref.size == 0:
        return ErrorReport(0.0, 0.0)
    if not np.isfinite(out).all():
        return ErrorReport(float("inf"), float("inf"))
    diff = out - ref
    max_ref = float(np.abs(ref).max())
    rms_ref = float(np.sqrt(np.mean(ref**2)))
    max_abs, rms_abs = float(np.abs(diff).max()), float(np.sqrt(np.mean(diff**2)))
    max_err = max_abs / max_ref if max_ref > 0 else (0.0 if max_abs == 0 else float("inf"))
    rms_err = rms_abs / rms_ref if rms_ref > 0 else (0.0 if rms_abs == 0 else float("inf"))
    return ErrorReport(max_err, rms_err)


def assert_close(out, ref, dtype, what: str = "output") -> ErrorReport:
    """Raise AssertionError naming ``what`` when ``out`` is not within ``dtype``'s tolerance of ``ref``."""
    rep = normalized_error(out, ref)
    tmax, trms = tolerance_for(dtype)
    if not (rep.max_err <= tmax and rep.rms_err <= trms):
        raise AssertionError(
            f"{what}: normalized error max={rep.max_err:.3e} (limit {tmax:.1e}), "
            f"rms={rep.rms_err:.3e} (limit {trms:.1e}) for dtype {dtype}"
        )
    return rep


def round_to_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values rounded (to nearest, ties to even) to ``dtype`` and back to float64."""
    a = np.asarray(a, dtype=np.float64)
    if dtype in ("float64",):
        return a.copy()
    if dtype == "float32":
        return a.astype(np.float32).astype(np.float64)
    if dtype == "float16":
        return a.astype(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        f = a.astype(np.float32)
        u = f.view(np.uint32).astype(np.uint64)
        rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        out = rounded.astype(np.uint32).view(np.float32).astype(np.float64)
        return np.where(np.isfinite(f), out, f.astype(np.float64))
    raise ValueError(f"cannot round to dtype {dtype!r}; known: float64, float32, float16, bfloat16")
