"""Column (bias-gradient) reduction, spec section 3: column_sum(G [M, N]) -> [N].

The IQN head's bias gradient is M = B*Q = 524288 rows of N = 3 actions; its hidden layer
has N = 128. The "before" kernel ran 3 threads, each looping over 524288 rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import Checker, check_backend

BACKENDS = ("reference", "cute")
MAX_N = 4096  # the kernel keeps at most 64 column accumulators per thread


def column_sum(G: Any, *, backend: str = "reference") -> Any:
    """Sum of G over its rows: out[n] = sum_m G[m, n], accumulated in float32 on the GPU,
    float64 in the reference. Bit-identical from run to run on every backend."""
    where = "foxcute.column_sum"
    check_backend(where, backend, BACKENDS)
    chk = Checker(where, gpu=backend != "reference")
    chk.array("G", G, ("M", "N"))
    chk.dim_range("N", 1, MAX_N, "columns a CTA's threads can hold")
    if backend == "reference":
        return reference(G)
    from .kernels import column_sum as kernel

    kernel.check_sizes(chk)
    return kernel.column_sum(G)


def reference(G: np.ndarray) -> np.ndarray:
    return np.asarray(G, dtype=np.float64).sum(axis=0)
