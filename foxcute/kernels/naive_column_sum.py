"""Naive column sum (docs/layers.md section 3), the trainer's "before" kernel: one thread per column,
each looping over all M rows. For the IQN head's bias gradient (N = 3) that is 3 working
threads for 524288 rows."""

from __future__ import annotations

from typing import Any

from .._arrays import Checker
from .._layer import KernelContract
from . import _naive


CONTRACT = KernelContract(passes=("column_sum",))  # plain FFMA float32: no options


def check_sizes(chk: Checker) -> None:
    """Dims M, N (G is [M, N])."""
    _naive.check_int32_extent(chk, "G", "M", "N")


def column_sum(G: Any) -> Any:
    """out[n] = sum_m G[m, n] for a validated float32 [M, N] device array."""
    rows, cols = G.shape
    return _naive.batch_sum_new(G, None, rows, cols)


def compiled_for_ci() -> dict[str, Any]:
    return {"column_sum": _naive.KERNELS.compiled("batch_sum_x", keep=True)}
