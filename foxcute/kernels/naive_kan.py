"""Naive KAN layer (docs/layers.md section 4): the trainer's "before" kernels.

Forward: one thread per (sample, output) evaluating all I*G basis functions itself.
Backward: one thread per sample writes its basis values phi, silu(x) and dx to global
memory; then one thread per element of dC and of dWb loops over the whole batch (the
trainer's "kan_grad_reduce")."""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .._arrays import Checker, empty
from .._layer import KernelContract
from . import _cute, _naive
from ._naive import launch, row_major, sigmoid, thread_index

GRID_LO = -2.0  # centres mu_g = GRID_LO + g * delta, delta = 4 / (G - 1): linspace(-2, 2, G)
GRID_SPAN = 4.0


CONTRACT = KernelContract(passes=("forward", "backward"))  # plain FFMA float32: no options


def check_sizes(chk: Checker) -> None:
    """Dims B, I, O, I*G (x is [B, I], C [O, I*G])."""
    _naive.check_int32_extent(chk, "phi", "B", "I*G")
    _naive.check_int32_extent(chk, "the (sample, output) threads", "B", "O")
    _naive.check_int32_extent(chk, "C", "O", "I*G")


class Forward:
    """One thread per (sample b, output o): y[b, o] = sum_i sum_g C[o, i*G+g] phi_g(x[b, i])
    + silu(x[b, i]) Wb[o, i]."""

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, c_ptr: cute.Pointer, wb_ptr: cute.Pointer,
                 y_ptr: cute.Pointer, batch: Int32, inputs: Int32, outputs: Int32, basis: Int32,
                 delta: Float32, stream):
        launch(self.kernel(row_major(x_ptr, batch, inputs), row_major(c_ptr, outputs, inputs * basis),
                           row_major(wb_ptr, outputs, inputs), row_major(y_ptr, batch, outputs),
                           basis, delta),
               batch * outputs, stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mC: cute.Tensor, mWb: cute.Tensor, mY: cute.Tensor,
               basis: Int32, delta: Float32):
        batch, inputs = mX.shape
        outputs = mWb.shape[0]
        t = thread_index()
        if t < batch * outputs:
            b = t // outputs
            o = t - b * outputs
            y = Float32(0.0)
            for i in cutlass.range(inputs, unroll=1):
                xi = mX[b, i]
                for g in cutlass.range(basis, unroll=1):
                    r = (xi - (Float32(GRID_LO) + Float32(g) * delta)) / delta
                    y += mC[o, i * basis + g] * cute.math.exp(-(r * r))
                y += xi * sigmoid(xi) * mWb[o, i]
            mY[b, o] = y


class PerSampleBackward:
    """One thread per sample: phi[b, :], silu(x[b, :]) and
    dx[b, i] = sum_g (dy[b] @ C)[i*G+g] phi (-2 (x - mu_g) / delta^2) + (dy[b] @ Wb)[i] silu'(x)."""

    @cute.jit
    def __call__(self, dy_ptr: cute.Pointer, x_ptr: cute.Pointer, c_ptr: cute.Pointer,
                 wb_ptr: cute.Pointer, phi_ptr: cute.Pointer, silu_ptr: cute.Pointer,
                 dx_ptr: cute.Pointer, batch: Int32, inputs: Int32, outputs: Int32, basis: Int32,
                 delta: Float32, stream):
        launch(self.kernel(row_major(dy_ptr, batch, outputs), row_major(x_ptr, batch, inputs),
                           row_major(c_ptr, outputs, inputs * basis), row_major(wb_ptr, outputs, inputs),
                           row_major(phi_ptr, batch, inputs * basis), row_major(silu_ptr, batch, inputs),
                           row_major(dx_ptr, batch, inputs), basis, delta),
               batch, stream)

    @cute.kernel
    def kernel(self, mDy: cute.Tensor, mX: cute.Tensor, mC: cute.Tensor, mWb: cute.Tensor,
               mPhi: cute.Tensor, mSilu: cute.Tensor, mDx: cute.Tensor, basis: Int32,
               delta: Float32):
        batch, inputs = mX.shape
        outputs = mWb.shape[0]
        b = thread_index()
        if b < batch:
            for i in cutlass.range(inputs, unroll=1):
                xi = mX[b, i]
                sig = sigmoid(xi)
                mSilu[b, i] = xi * sig
                dbase = Float32(0.0)
                for o in cutlass.range(outputs, unroll=1):
                    dbase += mDy[b, o] * mWb[o, i]
                dx = dbase * sig * (Float32(1.0) + xi * (Float32(1.0) - sig))
                for g in cutlass.range(basis, unroll=1):
                    r = (xi - (Float32(GRID_LO) + Float32(g) * delta)) / delta
                    phi = cute.math.exp(-(r * r))
                    mPhi[b, i * basis + g] = phi
                    dphi = Float32(0.0)
                    for o in cutlass.range(outputs, unroll=1):
                        dphi += mDy[b, o] * mC[o, i * basis + g]
                    dx += dphi * phi * (Float32(-2.0) * r / delta)
                mDx[b, i] = dx


KERNELS = _naive.Kernels(__name__, {
    "forward": (Forward(), _naive.fake_args(4, 4, 1)),
    "per_sample_backward": (PerSampleBackward(), _naive.fake_args(7, 4, 1)),
})


def _sizes(x: Any, C: Any, Wb: Any) -> tuple[int, int, int, int, float]:
    batch, inputs = x.shape
    basis = C.shape[1] // inputs
    return batch, inputs, Wb.shape[0], basis, GRID_SPAN / (basis - 1)


def forward(x: Any, C: Any, Wb: Any) -> Any:
    batch, inputs, outputs, basis, delta = _sizes(x, C, Wb)
    y = empty(x, (batch, outputs))
    ptr = _cute.gmem_ptr
    KERNELS["forward"](ptr(x), ptr(C), ptr(Wb), ptr(y), Int32(batch), Int32(inputs),
                       Int32(outputs), Int32(basis), Float32(delta), _cute.current_stream(x))
    return y


def backward(dy: Any, x: Any, C: Any, Wb: Any) -> tuple[Any, Any, Any]:
    """-> (dC, dWb, dx)"""
    batch, inputs, outputs, basis, delta = _sizes(x, C, Wb)
    phi = empty(x, (batch, inputs * basis))
    silu = empty(x, (batch, inputs))
    dx = empty(x, (batch, inputs))
    ptr = _cute.gmem_ptr
    KERNELS["per_sample_backward"](ptr(dy), ptr(x), ptr(C), ptr(Wb), ptr(phi), ptr(silu), ptr(dx),
                                   Int32(batch), Int32(inputs), Int32(outputs), Int32(basis),
                                   Float32(delta), _cute.current_stream(x))
    dC = _naive.batch_sum_new(dy, phi, batch, outputs, inputs * basis)
    dWb = _naive.batch_sum_new(dy, silu, batch, outputs, inputs)
    return dC, dWb, dx


def compiled_for_ci() -> dict[str, Any]:
    return KERNELS.compiled_for_ci()
