"""Curiosity forward model (ICM style), docs/layers.md section 5: forward and backward in one call.

    z = [s, onehot(a)] @ W1^T + b1, hid = relu(z), pred = hid @ W2^T + b2
    r[b] = (1/(2F)) sum_f (pred[b,f] - s_next[b,f])^2,  loss = mean_b r[b]

A (the number of actions) is not passed: it is W1.shape[1] - F, and must be >= 1; every
action index must lie in [0, A). `forward_backward` validates, then dispatches: "reference" to
`reference_forward_backward` (float64 NumPy), "cute"/"naive" to foxcute.kernels.curiosity /
naive_curiosity where those exist.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from . import _layer
from ._arrays import to_float64


class CuriosityGrads(NamedTuple):
    dW1: Any
    db1: Any
    dW2: Any
    db2: Any
    ds: Any


def kernel_modules() -> dict[str, ModuleType]:
    """The GPU backends' kernel modules: "cute" foxcute.kernels.curiosity, "naive"
    foxcute.kernels.naive_curiosity (imported on first use: they load the CuTe DSL)."""
    from .kernels import curiosity as cute_kernels, naive_curiosity as naive_kernels

    return {"cute": cute_kernels, "naive": naive_kernels}


def forward_backward(s, a, s_next, W1, b1, W2, b2, *, backend="reference", precision="tf32",
                     check_actions=True):
    """(loss, r [B], CuriosityGrads): the gradients are those of loss. From the reference
    backend loss is a Python float; from a GPU backend a 1-element device array.

    check_actions=True reads the action indices back to check that they lie in [0, A): on a
    GPU backend a device synchronisation, which a CUDA graph capture forbids. Callers that
    capture (foxcute.torch's operator) pass False and then own that invariant: the kernels
    read column F + a[b] of W1 unchecked, so an index outside [0, A) gives garbage or reads
    out of bounds."""
    where = "foxcute.curiosity.forward_backward"
    chk = _layer.start(where, backend, precision)
    chk.array("s", s, ("B", "F"))
    chk.array("a", a, ("B",), dtype="int")
    chk.array("s_next", s_next, ("B", "F"))
    chk.array("W1", W1, ("H", "F+A"))
    num_actions = chk.dims["F+A"] - chk.dims["F"]
    if num_actions < 1:
        raise chk.fail("W1", f"must have F + A columns (F={chk.dims['F']} state columns, then "
                             f"A >= 1 action columns), got shape {tuple(W1.shape)}")
    chk.array("b1", b1, ("H",))
    chk.array("W2", W2, ("F", "H"))
    chk.array("b2", b2, ("F",))
    if check_actions:
        chk.actions("a", a, num_actions)
    if backend == "reference":
        s, s_next, W1, b1, W2, b2 = to_float64(s, s_next, W1, b1, W2, b2)
        return reference_forward_backward(s, a, s_next, W1, b1, W2, b2)
    kernel, options = _layer.kernel_module(kernel_modules, backend, chk, precision=precision)
    loss, r, *grads = kernel.forward_backward(s, a, s_next, W1, b1, W2, b2, **options)
    return loss, r, CuriosityGrads(*grads)


def reference_forward_backward(s, a, s_next, W1, b1, W2, b2) -> tuple[float, np.ndarray, CuriosityGrads]:
    """Float64 arrays in (a: int action indices [B]); (loss as a Python float, r [B], grads)."""
    batch, features = s.shape
    onehot = np.eye(W1.shape[1] - features)[a]
    inputs = np.concatenate([s, onehot], axis=1)
    z = inputs @ W1.T + b1
    hid = _layer.relu(z)
    diff = hid @ W2.T + b2 - s_next
    r = (diff**2).sum(axis=1) / (2 * features)
    dpred = diff / (features * batch)
    dz = (dpred @ W2) * (z > 0)
    grads = CuriosityGrads(dW1=dz.T @ inputs, db1=dz.sum(axis=0), dW2=dpred.T @ hid,
                           db2=dpred.sum(axis=0), ds=dz @ W1[:, :features])
    return float(r.mean()), r, grads
