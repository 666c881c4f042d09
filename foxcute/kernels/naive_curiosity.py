"""Naive curiosity forward model, forward and backward (docs/layers.md section 5): the trainer's
"before" kernels, whose fault is too few blocks.

Each layer runs one thread per hidden unit, per output feature or per weight, and every
thread loops over the whole batch: the hidden layer is H = 128 threads (one CTA on a
132-SM GPU), the output layer F = 256 threads. Only the per-sample error r gets one thread
per sample. Intermediates (hid, pred - s_next, dz) go through global memory."""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .._arrays import Checker, empty
from .._layer import KernelContract
from . import _cute, _naive
from ._naive import CHUNK_ROWS, launch, relu, row_major, thread_index


CONTRACT = KernelContract(passes=("forward_backward",))  # plain FFMA float32: no options


def check_sizes(chk: Checker) -> None:
    """Dims B, F, F+A, H (s is [B, F], W1 [H, F+A])."""
    _naive.check_int32_extent(chk, "s", "B", "F")
    _naive.check_int32_extent(chk, "the hidden activations", "B", "H")
    _naive.check_int32_extent(chk, "W1", "H", "F+A")


class Hidden:
    """One thread per hidden unit j, looping over the batch:
    hid[b, j] = relu(b1[j] + s[b] . W1[j, :F] + W1[j, F + a[b]])."""

    @cute.jit
    def __call__(self, s_ptr: cute.Pointer, a_ptr: cute.Pointer, w1_ptr: cute.Pointer,
                 b1_ptr: cute.Pointer, hid_ptr: cute.Pointer, batch: Int32, features: Int32,
                 actions: Int32, hidden: Int32, stream):
        launch(self.kernel(row_major(s_ptr, batch, features), row_major(a_ptr, batch, 1),
                           row_major(w1_ptr, hidden, features + actions),
                           row_major(b1_ptr, 1, hidden), row_major(hid_ptr, batch, hidden)),
               hidden, stream)

    @cute.kernel
    def kernel(self, mS: cute.Tensor, mA: cute.Tensor, mW1: cute.Tensor, mB1: cute.Tensor,
               mHid: cute.Tensor):
        batch, features = mS.shape
        hidden = mW1.shape[0]
        j = thread_index()
        if j < hidden:
            for b in cutlass.range(batch, unroll=1):
                z = mB1[0, j] + mW1[j, features + Int32(mA[b, 0])]
                for f in cutlass.range(features, unroll=1):
                    z += mS[b, f] * mW1[j, f]
                mHid[b, j] = relu(z)


class Output:
    """One thread per output feature f, looping over the batch:
    diff[b, f] = b2[f] + hid[b] . W2[f] - s_next[b, f]   (= pred - s_next)."""

    @cute.jit
    def __call__(self, hid_ptr: cute.Pointer, w2_ptr: cute.Pointer, b2_ptr: cute.Pointer,
                 s_next_ptr: cute.Pointer, diff_ptr: cute.Pointer, batch: Int32, features: Int32,
                 hidden: Int32, stream):
        launch(self.kernel(row_major(hid_ptr, batch, hidden), row_major(w2_ptr, features, hidden),
                           row_major(b2_ptr, 1, features), row_major(s_next_ptr, batch, features),
                           row_major(diff_ptr, batch, features)),
               features, stream)

    @cute.kernel
    def kernel(self, mHid: cute.Tensor, mW2: cute.Tensor, mB2: cute.Tensor, mSNext: cute.Tensor,
               mDiff: cute.Tensor):
        batch, hidden = mHid.shape
        features = mW2.shape[0]
        f = thread_index()
        if f < features:
            for b in cutlass.range(batch, unroll=1):
                pred = mB2[0, f]
                for j in cutlass.range(hidden, unroll=1):
                    pred += mHid[b, j] * mW2[f, j]
                mDiff[b, f] = pred - mSNext[b, f]


class Error:
    """One thread per sample: r[b] = (1/(2F)) sum_f diff[b, f]^2."""

    @cute.jit
    def __call__(self, diff_ptr: cute.Pointer, r_ptr: cute.Pointer, batch: Int32, features: Int32,
                 scale: Float32, stream):
        launch(self.kernel(row_major(diff_ptr, batch, features), row_major(r_ptr, batch, 1), scale),
               batch, stream)

    @cute.kernel
    def kernel(self, mDiff: cute.Tensor, mR: cute.Tensor, scale: Float32):
        batch, features = mDiff.shape
        b = thread_index()
        if b < batch:
            sq = Float32(0.0)
            for f in cutlass.range(features, unroll=1):
                sq += mDiff[b, f] * mDiff[b, f]
            mR[b, 0] = scale * sq


class HiddenGrad:
    """One thread per hidden unit j, looping over the batch:
    dz[b, j] = (hid[b, j] > 0) * scale * diff[b] . W2[:, j], scale = 1/(F*B)."""

    @cute.jit
    def __call__(self, diff_ptr: cute.Pointer, w2_ptr: cute.Pointer, hid_ptr: cute.Pointer,
                 dz_ptr: cute.Pointer, batch: Int32, features: Int32, hidden: Int32,
                 scale: Float32, stream):
        launch(self.kernel(row_major(diff_ptr, batch, features), row_major(w2_ptr, features, hidden),
                           row_major(hid_ptr, batch, hidden), row_major(dz_ptr, batch, hidden),
                           scale),
               hidden, stream)

    @cute.kernel
    def kernel(self, mDiff: cute.Tensor, mW2: cute.Tensor, mHid: cute.Tensor, mDz: cute.Tensor,
               scale: Float32):
        batch, features = mDiff.shape
        hidden = mW2.shape[1]
        j = thread_index()
        if j < hidden:
            for b in cutlass.range(batch, unroll=1):
                dhid = Float32(0.0)
                for f in cutlass.range(features, unroll=1):
                    dhid += mDiff[b, f] * mW2[f, j]
                dz = scale * dhid
                if mHid[b, j] <= Float32(0.0):
                    dz = Float32(0.0)
                mDz[b, j] = dz


class InputGrad:
    """One thread per input feature f, looping over the batch: ds[b, f] = dz[b] . W1[:, f]."""

    @cute.jit
    def __call__(self, dz_ptr: cute.Pointer, w1_ptr: cute.Pointer, ds_ptr: cute.Pointer,
                 batch: Int32, features: Int32, actions: Int32, hidden: Int32, stream):
        launch(self.kernel(row_major(dz_ptr, batch, hidden),
                           row_major(w1_ptr, hidden, features + actions),
                           row_major(ds_ptr, batch, features)),
               features, stream)

    @cute.kernel
    def kernel(self, mDz: cute.Tensor, mW1: cute.Tensor, mDs: cute.Tensor):
        batch, features = mDs.shape
        hidden = mW1.shape[0]
        f = thread_index()
        if f < features:
            for b in cutlass.range(batch, unroll=1):
                ds = Float32(0.0)
                for j in cutlass.range(hidden, unroll=1):
                    ds += mDz[b, j] * mW1[j, f]
                mDs[b, f] = ds


class W1Grad:
    """One thread per weight W1[j, k], looping over the batch:
    dW1[j, k] = sum_b dz[b, j] * [s, onehot(a)][b, k]. Partial sums over CHUNK_ROWS rows,
    as in _naive.BatchSum."""

    @cute.jit
    def __call__(self, dz_ptr: cute.Pointer, s_ptr: cute.Pointer, a_ptr: cute.Pointer,
                 dw1_ptr: cute.Pointer, batch: Int32, features: Int32, actions: Int32,
                 hidden: Int32, stream):
        launch(self.kernel(row_major(dz_ptr, batch, hidden), row_major(s_ptr, batch, features),
                           row_major(a_ptr, batch, 1),
                           row_major(dw1_ptr, hidden, features + actions)),
               hidden * (features + actions), stream)

    @cute.kernel
    def kernel(self, mDz: cute.Tensor, mS: cute.Tensor, mA: cute.Tensor, mDW1: cute.Tensor):
        batch, features = mS.shape
        hidden, columns = mDW1.shape
        t = thread_index()
        if t < hidden * columns:
            j = t // columns
            k = t - j * columns
            total = Float32(0.0)
            for b0 in cutlass.range(0, batch, CHUNK_ROWS, unroll=1):
                part = Float32(0.0)
                for b in cutlass.range(b0, cutlass.min(b0 + CHUNK_ROWS, batch), unroll=1):
                    if k < features:
                        part += mDz[b, j] * mS[b, k]
                    elif Int32(mA[b, 0]) == k - features:
                        part += mDz[b, j]
                total += part
            mDW1[j, k] = total


_INDEX_TYPES = {"int32": cutlass.Int32, "int64": cutlass.Int64}  # action index dtypes taken


def _hidden_args(index: str) -> tuple:
    """Hidden's and W1Grad's compile arguments differ from fake_args in the action pointer."""
    return (_cute.fake_ptr(), _cute.fake_ptr(_INDEX_TYPES[index]), *_naive.fake_args(3, 4))


def _w1_grad_args(index: str) -> tuple:
    return (_cute.fake_ptr(), _cute.fake_ptr(), _cute.fake_ptr(_INDEX_TYPES[index]),
            *_naive.fake_args(1, 4))


KERNELS = _naive.Kernels(__name__, {
    "output": (Output(), _naive.fake_args(5, 3)),
    "error": (Error(), _naive.fake_args(2, 2, 1)),
    "hidden_grad": (HiddenGrad(), _naive.fake_args(4, 3, 1)),
    "input_grad": (InputGrad(), _naive.fake_args(3, 4)),
    **{f"hidden_{index}": (Hidden(), _hidden_args(index)) for index in _INDEX_TYPES},
    **{f"w1_grad_{index}": (W1Grad(), _w1_grad_args(index)) for index in _INDEX_TYPES},
})


def forward_backward(s: Any, a: Any, s_next: Any, W1: Any, b1: Any, W2: Any,
                     b2: Any) -> tuple[Any, ...]:
    """-> (loss [1], r, dW1, db1, dW2, db2, ds)"""
    batch, features = s.shape
    hidden, columns = W1.shape
    actions = columns - features
    index = str(a.dtype).replace("torch.", "")
    hid, dz = (empty(s, (batch, hidden)) for _ in range(2))
    diff = empty(s, (batch, features))
    r = empty(s, (batch,))
    ds = empty(s, (batch, features))
    dW1 = empty(s, (hidden, columns))
    ptr = _cute.gmem_ptr
    a_ptr = _cute.gmem_ptr(a, _INDEX_TYPES[index])
    stream = _cute.current_stream(s)
    B, F, A, H = Int32(batch), Int32(features), Int32(actions), Int32(hidden)
    dpred_scale = 1.0 / (features * batch)
    KERNELS[f"hidden_{index}"](ptr(s), a_ptr, ptr(W1), ptr(b1), ptr(hid), B, F, A, H, stream)
    KERNELS["output"](ptr(hid), ptr(W2), ptr(b2), ptr(s_next), ptr(diff), B, F, H, stream)
    KERNELS["error"](ptr(diff), ptr(r), B, F, Float32(1.0 / (2 * features)), stream)
    KERNELS["hidden_grad"](ptr(diff), ptr(W2), ptr(hid), ptr(dz), B, F, H, Float32(dpred_scale),
                           stream)
    KERNELS["input_grad"](ptr(dz), ptr(W1), ptr(ds), B, F, A, H, stream)
    KERNELS[f"w1_grad_{index}"](ptr(dz), ptr(s), a_ptr, ptr(dW1), B, F, A, H, stream)
    loss = _naive.batch_sum_new(r, None, batch, 1, scale=1.0 / batch)
    db1 = _naive.batch_sum_new(dz, None, batch, hidden)
    dW2 = _naive.batch_sum_new(diff, hid, batch, features, hidden, scale=dpred_scale)
    db2 = _naive.batch_sum_new(diff, None, batch, features, scale=dpred_scale)
    return loss, r, dW1, db1, dW2, db2, ds


def compiled_for_ci() -> dict[str, Any]:
    return KERNELS.compiled_for_ci()
