"""Risk budget head, docs/layers.md section 6: forward.

    x = [h, isv broadcast over b, e[:, None]],  risk = sigmoid(relu(x @ W1^T + b1) @ w2 + b2)

`forward` validates, then dispatches: "reference" to `reference_forward` (float64 NumPy),
"cute"/"naive" to foxcute.kernels.risk_budget / naive_risk_budget where those exist.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from . import _layer
from ._arrays import to_float64


def kernel_modules() -> dict[str, ModuleType]:
    """The GPU backends' kernel modules: "cute" foxcute.kernels.risk_budget, "naive"
    foxcute.kernels.naive_risk_budget (imported on first use: they load the CuTe DSL)."""
    from .kernels import risk_budget as cute_kernels, naive_risk_budget as naive_kernels

    return {"cute": cute_kernels, "naive": naive_kernels}


def forward(h, isv, e, W1, b1, w2, b2, *, backend="reference", precision="tf32"):
    """risk [B] in (0, 1). h [B, SH2], isv [I], e [B], W1 [H, SH2+I+1], b1 [H], w2 [H], b2 scalar."""
    where = "foxcute.risk_budget.forward"
    chk = _layer.start(where, backend, precision)
    chk.array("h", h, ("B", "SH2"))
    chk.array("isv", isv, ("I",))
    chk.array("e", e, ("B",))
    chk.array("W1", W1, ("H", "SH2+I+1"))
    columns = chk.dims["SH2"] + chk.dims["I"] + 1
    if chk.dims["SH2+I+1"] != columns:
        raise chk.fail("W1", f"must have SH2+I+1 = {columns} columns (h, isv, e), "
                             f"got shape {tuple(W1.shape)}")
    chk.array("b1", b1, ("H",))
    chk.array("w2", w2, ("H",))
    b2 = chk.scalar("b2", b2)
    if backend == "reference":
        return reference_forward(*to_float64(h, isv, e, W1, b1, w2), b2)
    kernel, options = _layer.kernel_module(kernel_modules, backend, chk, precision=precision)
    return kernel.forward(h, isv, e, W1, b1, w2, b2, **options)


def reference_forward(h, isv, e, W1, b1, w2, b2) -> np.ndarray:
    """Float64 arrays in (b2 a float), risk [B] float64."""
    x = np.concatenate([h, np.broadcast_to(isv, (h.shape[0], isv.shape[0])), e[:, None]], axis=1)
    return _layer.sigmoid(_layer.relu(x @ W1.T + b1) @ w2 + b2)
