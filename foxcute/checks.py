"""Numerical comparison against the float64 reference, as docs/layers.md section 8 defines it."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import array_kind

# docs/layers.md section 8: ||out - ref|| / ||ref|| must stay under these, for every output.
TOLERANCE = {"tf32": 2e-3, "fp32": 1e-5}


def to_numpy(x: Any) -> np.ndarray:
    """Host copy of a NumPy, cupy or torch array (or a Python scalar)."""
    kind = array_kind(x)
    if kind == "cupy":
        return x.get()
    if kind == "torch":
        return x.detach().cpu().numpy()
    return np.asarray(x)


def rel_err(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in float64; a NaN or inf anywhere in out gives inf (never passes)."""
    out = to_numpy(out).astype(np.float64)
    ref = to_numpy(ref).astype(np.float64)
    if out.shape != ref.shape:
        if out.size != 1 or ref.size != 1:  # only a scalar may come as a 1-element array
            raise ValueError(f"rel_err: shape {out.shape} does not match the reference's {ref.shape}")
        out = out.reshape(ref.shape)
    if not np.all(np.isfinite(out)):
        return float("inf")
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0))
