"""KAN layer with a Gaussian RBF basis, docs/layers.md section 4: forward and parameter gradients.

    phi[b, i*G+g] = exp(-((x[b,i] - mu_g) / delta)^2),  mu = linspace(-2, 2, G), delta = 4/(G-1)
    y = phi @ C^T + silu(x) @ Wb^T

G is not passed: it is C.shape[1] // I, and C.shape[1] must be a multiple of I with G >= 2.
`forward`/`backward` validate, then dispatch: "reference" to the float64 NumPy functions below,
"cute"/"naive" to foxcute.kernels.kan / naive_kan where those exist.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from . import _layer
from ._arrays import Checker, to_float64

GRID_LO, GRID_HI = -2.0, 2.0


class KanGrads(NamedTuple):
    dC: Any
    dWb: Any
    dx: Any


def kernel_modules() -> dict[str, ModuleType]:
    """The GPU backends' kernel modules: "cute" foxcute.kernels.kan, "naive"
    foxcute.kernels.naive_kan (imported on first use: they load the CuTe DSL)."""
    from .kernels import kan as cute_kernels, naive_kan as naive_kernels

    return {"cute": cute_kernels, "naive": naive_kernels}


def rbf_grid(G: int) -> tuple[np.ndarray, float]:
    """The basis centres mu [G] (float64) and the common width delta."""
    return np.linspace(GRID_LO, GRID_HI, G), (GRID_HI - GRID_LO) / (G - 1)


def forward(x, C, Wb, *, backend="reference", precision="tf32"):
    """y [B, O] = phi(x) @ C^T + silu(x) @ Wb^T."""
    chk = _check("foxcute.kan.forward", backend, precision, x, C, Wb)
    if backend == "reference":
        return reference_forward(*to_float64(x, C, Wb))
    kernel, options = _layer.kernel_module(kernel_modules, backend, chk, precision=precision)
    return kernel.forward(x, C, Wb, **options)


def backward(dy, x, C, Wb, *, backend="reference", precision="tf32") -> KanGrads:
    """Gradients of sum(dy * y) with respect to C, Wb and x, given dy [B, O]."""
    chk = _check("foxcute.kan.backward", backend, precision, x, C, Wb)
    chk.array("dy", dy, ("B", "O"))
    if backend == "reference":
        return reference_backward(*to_float64(dy, x, C, Wb))
    kernel, options = _layer.kernel_module(kernel_modules, backend, chk, precision=precision)
    return KanGrads(*kernel.backward(dy, x, C, Wb, **options))


def _check(where, backend, precision, x, C, Wb) -> Checker:
    chk = _layer.start(where, backend, precision)
    chk.array("x", x, ("B", "I"))
    chk.array("C", C, ("O", "I*G"))
    chk.dim_multiple("I*G", chk.dims["I"], "C holds G basis coefficients for each of the I inputs")
    if chk.dims["I*G"] // chk.dims["I"] < 2:
        raise chk.fail("C", f"must have G >= 2 basis functions per input (the RBF width is "
                            f"4/(G-1)), got G = {C.shape[1]} // I={chk.dims['I']} = 1")
    chk.array("Wb", Wb, ("O", "I"))
    return chk


def _silu_and_slope(x):
    """silu(x) = x * sigmoid(x) and its derivative."""
    s = _layer.sigmoid(x)
    return x * s, s * (1.0 + x * (1.0 - s))


def reference_forward(x, C, Wb) -> np.ndarray:
    """Float64 arrays in, y [B, O] float64."""
    phi, _, _ = _phi(x, C.shape[1] // x.shape[1])
    silu, _ = _silu_and_slope(x)
    return phi.reshape(x.shape[0], -1) @ C.T + silu @ Wb.T


def reference_backward(dy, x, C, Wb) -> KanGrads:
    """Float64 arrays in, float64 gradients."""
    batch, inputs = x.shape
    phi, offset, delta = _phi(x, C.shape[1] // inputs)
    silu, slope = _silu_and_slope(x)
    dphi = (dy @ C).reshape(phi.shape)
    dx = (dphi * phi * (-2.0 * offset / delta**2)).sum(axis=2) + (dy @ Wb) * slope
    return KanGrads(dC=dy.T @ phi.reshape(batch, -1), dWb=dy.T @ silu, dx=dx)


def _phi(x, G):
    """phi [B, I, G] (flattened row-major it is docs/layers.md's [B, I*G]), x - mu [B, I, G], delta."""
    mu, delta = rbf_grid(G)
    offset = x[:, :, None] - mu
    return np.exp(-((offset / delta) ** 2)), offset, delta
