"""Numerical comparison against the float64 reference, as docs/layers.md section 8 defines it."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import array_kind

# docs/layers.md section 8: ||out - ref|| / ||ref|| must stay under these, for every output.
# elem_err is reported beside rel_err and held to no bound.
TOLERANCE = {"tf32": 2e-3, "fp32": 1e-5}


def to_numpy(x: Any) -> np.ndarray:
    """Host copy of a NumPy, cupy or torch array (or a Python scalar)."""
    kind = array_kind(x)
    if kind == "cupy":
        return x.get()
    if kind == "torch":
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _host_pair(out: Any, ref: Any, measure: str) -> tuple[np.ndarray, np.ndarray]:
    """out and ref as float64 host arrays of ref's shape (a scalar may come as a 1-element array)."""
    out = to_numpy(out).astype(np.float64)
    ref = to_numpy(ref).astype(np.float64)
    if out.shape != ref.shape:
        if out.size != 1 or ref.size != 1:
            raise ValueError(f"{measure}: shape {out.shape} does not match the reference's {ref.shape}")
        out = out.reshape(ref.shape)
    return out, ref


def rel_err(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in float64; a NaN or inf anywhere in out gives inf (never passes)."""
    out, ref = _host_pair(out, ref, "rel_err")
    if not np.all(np.isfinite(out)):
        return float("inf")
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0))


def elem_err(out: Any, ref: Any) -> float:
    """The element-wise view of docs/layers.md section 8: max |out - ref| / max |ref| in
    float64, so one bad entry of a large output shows at its full size (rel_err dilutes it by
    the output's norm). Denominator 1 where ref is all zeros; a NaN or inf in out gives inf."""
    out, ref = _host_pair(out, ref, "elem_err")
    if not np.all(np.isfinite(out)):
        return float("inf")
    if out.size == 0:
        return 0.0
    denom = float(np.max(np.abs(ref)))
    return float(np.max(np.abs(out - ref)) / (denom if denom > 0 else 1.0))


def worst(errors: dict[str, float]) -> tuple[str, float]:
    """(name, value) of the largest of `errors` (an output's name and its error); NaN counts
    as the largest, so it is never hidden behind a finite error."""
    if not errors:
        raise ValueError("worst: no errors given")
    name = max(errors, key=lambda k: np.inf if np.isnan(errors[k]) else errors[k])
    return name, errors[name]
