"""Q-denoise MLP (A -> H -> A, defaults 12 -> 24 -> 12), docs/layers.md section 2: loss and backward.

    z1 = q @ W1^T + b1, h1 = relu(z1), y = h1 @ W2^T + b2, loss = mean((y - q_target)^2)

`loss_and_grads` validates, then dispatches: "reference" to `reference_loss_and_grads`
(float64 NumPy), "cute"/"naive" to foxcute.kernels.q_denoise / naive_q_denoise where those exist.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from . import _layer
from ._arrays import to_float64


class QDenoiseGrads(NamedTuple):
    dW1: Any
    db1: Any
    dW2: Any
    db2: Any
    dq: Any


def kernel_modules() -> dict[str, ModuleType]:
    """The GPU backends' kernel modules: "cute" foxcute.kernels.q_denoise, "naive"
    foxcute.kernels.naive_q_denoise (imported on first use: they load the CuTe DSL)."""
    from .kernels import q_denoise as cute_kernels, naive_q_denoise as naive_kernels

    return {"cute": cute_kernels, "naive": naive_kernels}


def loss_and_grads(q, q_target, W1, b1, W2, b2, *, backend="reference", precision="tf32"):
    """(loss, QDenoiseGrads). From the reference backend loss is a Python float; from a GPU
    backend a 1-element device array (no host sync)."""
    where = "foxcute.q_denoise.loss_and_grads"
    chk = _layer.start(where, backend, precision)
    chk.array("q", q, ("B", "A"))
    chk.array("q_target", q_target, ("B", "A"))
    chk.array("W1", W1, ("H", "A"))
    chk.array("b1", b1, ("H",))
    chk.array("W2", W2, ("A", "H"))
    chk.array("b2", b2, ("A",))
    if backend == "reference":
        return reference_loss_and_grads(*to_float64(q, q_target, W1, b1, W2, b2))
    kernel, options = _layer.kernel_module(kernel_modules, backend, chk, precision=precision)
    loss, *grads = kernel.loss_and_grads(q, q_target, W1, b1, W2, b2, **options)
    return loss, QDenoiseGrads(*grads)


def reference_loss_and_grads(q, q_target, W1, b1, W2, b2) -> tuple[float, QDenoiseGrads]:
    """Float64 arrays in; (loss as a Python float, float64 gradients)."""
    z1 = q @ W1.T + b1
    h1 = _layer.relu(z1)
    y = h1 @ W2.T + b2
    diff = y - q_target
    loss = float(np.mean(diff**2))
    dy = 2.0 * diff / diff.size
    dz1 = (dy @ W2) * (z1 > 0)
    return loss, QDenoiseGrads(dW1=dz1.T @ q, db1=dz1.sum(axis=0), dW2=dy.T @ h1,
                               db2=dy.sum(axis=0), dq=dz1 @ W1)
