"""Naive Q-denoise MLP loss and backward (docs/layers.md section 2): the trainer's "before" kernels.

One thread per sample runs the whole MLP forward, the loss terms and the per-sample
gradients (dy, dz1, dq), writing h1, dy and dz1 to global memory; then one thread per weight
of W1, b1, W2, b2 (and one thread for the loss) loops over the whole batch."""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .._arrays import Checker, empty
from .._layer import KernelContract
from . import _cute, _naive
from ._naive import launch, relu, row_major, thread_index


CONTRACT = KernelContract(passes=("loss_and_grads",))  # plain FFMA float32: no options


def check_sizes(chk: Checker) -> None:
    """Dims B, A, H (q is [B, A], W1 [H, A])."""
    _naive.check_int32_extent(chk, "q", "B", "A")
    _naive.check_int32_extent(chk, "the hidden activations", "B", "H")


class PerSample:
    """One thread per sample: z1, h1, y, its squared errors, dy, dz1 and dq."""

    @cute.jit
    def __call__(self, q_ptr: cute.Pointer, target_ptr: cute.Pointer, w1_ptr: cute.Pointer,
                 b1_ptr: cute.Pointer, w2_ptr: cute.Pointer, b2_ptr: cute.Pointer,
                 h1_ptr: cute.Pointer, dy_ptr: cute.Pointer, dz1_ptr: cute.Pointer,
                 dq_ptr: cute.Pointer, sq_ptr: cute.Pointer, batch: Int32, actions: Int32,
                 hidden: Int32, dy_scale: Float32, stream):
        launch(self.kernel(row_major(q_ptr, batch, actions), row_major(target_ptr, batch, actions),
                           row_major(w1_ptr, hidden, actions), row_major(b1_ptr, 1, hidden),
                           row_major(w2_ptr, actions, hidden), row_major(b2_ptr, 1, actions),
                           row_major(h1_ptr, batch, hidden), row_major(dy_ptr, batch, actions),
                           row_major(dz1_ptr, batch, hidden), row_major(dq_ptr, batch, actions),
                           row_major(sq_ptr, batch, 1), dy_scale),
               batch, stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mTarget: cute.Tensor, mW1: cute.Tensor, mB1: cute.Tensor,
               mW2: cute.Tensor, mB2: cute.Tensor, mH1: cute.Tensor, mDy: cute.Tensor,
               mDz1: cute.Tensor, mDq: cute.Tensor, mSq: cute.Tensor, dy_scale: Float32):
        batch, actions = mQ.shape
        hidden = mW1.shape[0]
        b = thread_index()
        if b < batch:
            for j in cutlass.range(hidden, unroll=1):
                z = mB1[0, j]
                for a in cutlass.range(actions, unroll=1):
                    z += mQ[b, a] * mW1[j, a]
                mH1[b, j] = relu(z)
            sq = Float32(0.0)
            for a in cutlass.range(actions, unroll=1):
                y = mB2[0, a]
                for j in cutlass.range(hidden, unroll=1):
                    y += mH1[b, j] * mW2[a, j]
                diff = y - mTarget[b, a]
                sq += diff * diff
                mDy[b, a] = diff * dy_scale
            mSq[b, 0] = sq
            for j in cutlass.range(hidden, unroll=1):
                dz = Float32(0.0)
                for a in cutlass.range(actions, unroll=1):
                    dz += mDy[b, a] * mW2[a, j]
                if mH1[b, j] <= Float32(0.0):
                    dz = Float32(0.0)
                mDz1[b, j] = dz
            for a in cutlass.range(actions, unroll=1):
                dq = Float32(0.0)
                for j in cutlass.range(hidden, unroll=1):
                    dq += mDz1[b, j] * mW1[j, a]
                mDq[b, a] = dq


KERNELS = _naive.Kernels(__name__, {"per_sample": (PerSample(), _naive.fake_args(11, 3, 1))})


def loss_and_grads(q: Any, q_target: Any, W1: Any, b1: Any, W2: Any, b2: Any) -> tuple[Any, ...]:
    """-> (loss [1], dW1, db1, dW2, db2, dq)"""
    batch, actions = q.shape
    hidden = W1.shape[0]
    h1, dz1 = (empty(q, (batch, hidden)) for _ in range(2))
    dy, dq = (empty(q, (batch, actions)) for _ in range(2))
    sq = empty(q, (batch,))
    ptr = _cute.gmem_ptr
    KERNELS["per_sample"](ptr(q), ptr(q_target), ptr(W1), ptr(b1), ptr(W2), ptr(b2), ptr(h1),
                          ptr(dy), ptr(dz1), ptr(dq), ptr(sq), Int32(batch), Int32(actions),
                          Int32(hidden), Float32(2.0 / (batch * actions)), _cute.current_stream(q))
    loss = _naive.batch_sum_new(sq, None, batch, 1, scale=1.0 / (batch * actions))
    dW1 = _naive.batch_sum_new(dz1, q, batch, hidden, actions)
    db1 = _naive.batch_sum_new(dz1, None, batch, hidden)
    dW2 = _naive.batch_sum_new(dy, h1, batch, actions, hidden)
    db2 = _naive.batch_sum_new(dy, None, batch, actions)
    return loss, dW1, db1, dW2, db2, dq


def compiled_for_ci() -> dict[str, Any]:
    return KERNELS.compiled_for_ci()
