"""Column (bias-gradient) reduction, docs/layers.md section 3: column_sum(G [M, N]) -> [N].

The IQN head's bias gradient is M = B*Q = 524288 rows of N = 3 actions; its hidden layer
has N = 128. The "before" kernel ran 3 threads, each looping over 524288 rows. The kernels
are foxcute.kernels.column_sum ("cute") and foxcute.kernels.naive_column_sum ("naive").
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from . import _layer
from ._arrays import Checker, check_backend

MAX_N = 4096  # columns a CTA's threads hold in registers


def kernel_modules() -> dict[str, ModuleType]:
    """The GPU backends' kernel modules: "cute" foxcute.kernels.column_sum, "naive"
    foxcute.kernels.naive_column_sum (imported on first use: they load the CuTe DSL)."""
    from .kernels import column_sum as cute_kernels, naive_column_sum as naive_kernels

    return {"cute": cute_kernels, "naive": naive_kernels}


def column_sum(G: Any, *, backend: str = "reference") -> Any:
    """Sum of G over its rows: out[n] = sum_m G[m, n], accumulated in float32 on the GPU,
    float64 in the reference. Bit-identical from run to run on every backend."""
    where = "foxcute.column_sum"
    check_backend(where, backend, _layer.BACKENDS)
    chk = Checker(where, gpu=backend != "reference")
    chk.array("G", G, ("M", "N"))
    chk.dim_range("N", 1, MAX_N, "columns a CTA's threads hold in registers")
    if backend == "reference":
        return reference(G)
    kernel, _ = _layer.kernel_module(kernel_modules, backend, chk)
    return kernel.column_sum(G)


def reference(G: np.ndarray) -> np.ndarray:
    return np.asarray(G, dtype=np.float64).sum(axis=0)
