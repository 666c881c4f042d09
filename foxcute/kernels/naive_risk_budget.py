"""Naive risk budget head (docs/layers.md section 6): the trainer's "before" kernel, one thread per
sample computing the whole MLP serially, the shared isv part of every hidden unit included."""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .._arrays import Checker, empty
from .._layer import KernelContract
from . import _cute, _naive
from ._naive import launch, relu, row_major, sigmoid, thread_index


CONTRACT = KernelContract(passes=("forward",))  # plain FFMA float32: no options


def check_sizes(chk: Checker) -> None:
    """Dims B, SH2, I, SH2+I+1, H (h is [B, SH2], W1 [H, SH2+I+1])."""
    _naive.check_int32_extent(chk, "h", "B", "SH2")
    _naive.check_int32_extent(chk, "W1", "H", "SH2+I+1")


class Forward:
    """One thread per sample b:
    risk[b] = sigmoid(b2 + sum_j w2[j] relu(b1[j] + W1[j] . [h[b], isv, e[b]]))."""

    @cute.jit
    def __call__(self, h_ptr: cute.Pointer, isv_ptr: cute.Pointer, e_ptr: cute.Pointer,
                 w1_ptr: cute.Pointer, b1_ptr: cute.Pointer, w2_ptr: cute.Pointer,
                 risk_ptr: cute.Pointer, batch: Int32, width: Int32, signals: Int32,
                 hidden: Int32, b2: Float32, stream):
        launch(self.kernel(row_major(h_ptr, batch, width), row_major(isv_ptr, 1, signals),
                           row_major(e_ptr, batch, 1), row_major(w1_ptr, hidden, width + signals + 1),
                           row_major(b1_ptr, 1, hidden), row_major(w2_ptr, 1, hidden),
                           row_major(risk_ptr, batch, 1), b2),
               batch, stream)

    @cute.kernel
    def kernel(self, mH: cute.Tensor, mIsv: cute.Tensor, mE: cute.Tensor, mW1: cute.Tensor,
               mB1: cute.Tensor, mW2: cute.Tensor, mRisk: cute.Tensor, b2: Float32):
        batch, width = mH.shape
        signals = mIsv.shape[1]
        hidden = mW1.shape[0]
        b = thread_index()
        if b < batch:
            logit = b2
            for j in cutlass.range(hidden, unroll=1):
                z = mB1[0, j] + mE[b, 0] * mW1[j, width + signals]
                for k in cutlass.range(width, unroll=1):
                    z += mH[b, k] * mW1[j, k]
                for i in cutlass.range(signals, unroll=1):
                    z += mIsv[0, i] * mW1[j, width + i]
                logit += mW2[0, j] * relu(z)
            mRisk[b, 0] = sigmoid(logit)


KERNELS = _naive.Kernels(__name__, {"forward": (Forward(), _naive.fake_args(7, 4, 1))})


def forward(h: Any, isv: Any, e: Any, W1: Any, b1: Any, w2: Any, b2: float) -> Any:
    batch, width = h.shape
    hidden = W1.shape[0]
    signals = isv.shape[0]
    risk = empty(h, (batch,))
    ptr = _cute.gmem_ptr
    KERNELS["forward"](ptr(h), ptr(isv), ptr(e), ptr(W1), ptr(b1), ptr(w2), ptr(risk),
                       Int32(batch), Int32(width), Int32(signals), Int32(hidden), Float32(b2),
                       _cute.current_stream(h))
    return risk


def compiled_for_ci() -> dict[str, Any]:
    return KERNELS.compiled_for_ci()
