"""Naive Mamba2 temporal layer (docs/layers.md section 1): the trainer's "before" kernels.

What the trainer did: the forward ran one thread per sample, each doing its own projections
h_hist[b, t, :] @ W_A[:, s] (an SH2-long dot product per step and state) and the K-step scan.
Its backward (mamba2_scan_backward) ran one thread per weight element, dW_A[j, s], dW_B[j, s]
and dW_C[j, s], each looping over all B*K rows and recomputing, for every row, the
per-sample projections over SH2 and the reverse scan that gives da/du/dc: 1567 ms per call
at B=8192 on an H100.

What is reproduced here: the same forward; a per-sample kernel that runs the forward and
the reverse scan once per sample and writes da, du, dc (and the per-sample parts of ctx and
dsigma) to global memory; then the dominant anti-pattern, one thread per weight looping over
all B*K rows (`_naive.batch_sum`) for dW_A, dW_B, dW_C, dw and dsigma; and one thread per
sample for dh_hist and dh. Computing da/du/dc once per sample instead of once per weight
removes the trainer's redundant recomputation (each of its SH2*D threads per weight matrix
redid every sample's scan), so this baseline is faster than the trainer's kernel was:
speedups measured against it understate, never overstate, the gain over the trainer.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .._arrays import Checker, empty
from .._layer import KernelContract
from . import _cute, _naive
from ._naive import launch, row_major, sigmoid, thread_index


CONTRACT = KernelContract(passes=("forward", "backward"))  # plain FFMA float32: no options


def check_sizes(chk: Checker) -> None:
    """Dims B, K, SH2, D (h_hist is [B, K, SH2], the weights [SH2, D])."""
    _naive.check_int32_extent(chk, "h_hist", "B", "K", "SH2")
    _naive.check_int32_extent(chk, "da", "B", "K", "D")
    _naive.check_int32_extent(chk, "W_A", "SH2", "D")


class Forward:
    """One thread per sample: its projections, the scan of every state, ctx, and its output row."""

    @cute.jit
    def __call__(self, h_hist_ptr: cute.Pointer, h_ptr: cute.Pointer, wa_ptr: cute.Pointer,
                 wb_ptr: cute.Pointer, wc_ptr: cute.Pointer, w_ptr: cute.Pointer,
                 out_ptr: cute.Pointer, batch: Int32, steps: Int32, width: Int32, states: Int32,
                 sigma: Float32, stream):
        launch(self.kernel(row_major(h_hist_ptr, batch * steps, width), row_major(h_ptr, batch, width),
                           row_major(wa_ptr, width, states), row_major(wb_ptr, width, states),
                           row_major(wc_ptr, width, states), row_major(w_ptr, 1, width),
                           row_major(out_ptr, batch, width), steps, sigma),
               batch, stream)

    @cute.kernel
    def kernel(self, mHHist: cute.Tensor, mH: cute.Tensor, mWA: cute.Tensor, mWB: cute.Tensor,
               mWC: cute.Tensor, mW: cute.Tensor, mOut: cute.Tensor, steps: Int32, sigma: Float32):
        batch, width = mH.shape
        states = mWA.shape[1]
        b = thread_index()
        if b < batch:
            ctx = Float32(0.0)
            for s in cutlass.range(states, unroll=1):
                c = Float32(0.0)
                for j in cutlass.range(width, unroll=1):
                    c += mH[b, j] * mWC[j, s]
                x = Float32(0.0)
                for t in cutlass.range(steps, unroll=1):
                    a = Float32(0.0)
                    u = Float32(0.0)
                    for j in cutlass.range(width, unroll=1):
                        a += mHHist[b * steps + t, j] * mWA[j, s]
                        u += mHHist[b * steps + t, j] * mWB[j, s]
                    x = sigma * sigmoid(a) * x + u
                ctx += c * x
            ctx = ctx / Float32(states)
            for j in cutlass.range(width, unroll=1):
                mOut[b, j] = mH[b, j] + ctx * mW[0, j]


class ScanBackward:
    """One thread per sample: recompute the forward scan of every state, keeping sigmoid(a_t)
    and x_t in global memory, then run the reverse scan. Writes da, du [B*K, D], dc [B, D],
    ctx [B] and the sample's share of dsigma [B]."""

    @cute.jit
    def __call__(self, dout_ptr: cute.Pointer, h_hist_ptr: cute.Pointer, h_ptr: cute.Pointer,
                 wa_ptr: cute.Pointer, wb_ptr: cute.Pointer, wc_ptr: cute.Pointer,
                 w_ptr: cute.Pointer, sig_ptr: cute.Pointer, xs_ptr: cute.Pointer,
                 da_ptr: cute.Pointer, du_ptr: cute.Pointer, dc_ptr: cute.Pointer,
                 ctx_ptr: cute.Pointer, dsig_ptr: cute.Pointer, batch: Int32, steps: Int32,
                 width: Int32, states: Int32, sigma: Float32, stream):
        rows = batch * steps
        launch(self.kernel(row_major(dout_ptr, batch, width), row_major(h_hist_ptr, rows, width),
                           row_major(h_ptr, batch, width), row_major(wa_ptr, width, states),
                           row_major(wb_ptr, width, states), row_major(wc_ptr, width, states),
                           row_major(w_ptr, 1, width), row_major(sig_ptr, rows, states),
                           row_major(xs_ptr, rows, states), row_major(da_ptr, rows, states),
                           row_major(du_ptr, rows, states), row_major(dc_ptr, batch, states),
                           row_major(ctx_ptr, batch, 1), row_major(dsig_ptr, batch, 1),
                           steps, sigma),
               batch, stream)

    @cute.kernel
    def kernel(self, mDout: cute.Tensor, mHHist: cute.Tensor, mH: cute.Tensor, mWA: cute.Tensor,
               mWB: cute.Tensor, mWC: cute.Tensor, mW: cute.Tensor, mSig: cute.Tensor,
               mXs: cute.Tensor, mDa: cute.Tensor, mDu: cute.Tensor, mDc: cute.Tensor,
               mCtx: cute.Tensor, mDsig: cute.Tensor, steps: Int32, sigma: Float32):
        batch, width = mH.shape
        states = mWA.shape[1]
        inv_states = Float32(1.0) / Float32(states)
        b = thread_index()
        if b < batch:
            dctx = Float32(0.0)
            for j in cutlass.range(width, unroll=1):
                dctx += mDout[b, j] * mW[0, j]
            ctx = Float32(0.0)
            dsig = Float32(0.0)
            for s in cutlass.range(states, unroll=1):
                c = Float32(0.0)
                for j in cutlass.range(width, unroll=1):
                    c += mH[b, j] * mWC[j, s]
                x = Float32(0.0)
                for t in cutlass.range(steps, unroll=1):
                    a = Float32(0.0)
                    u = Float32(0.0)
                    for j in cutlass.range(width, unroll=1):
                        a += mHHist[b * steps + t, j] * mWA[j, s]
                        u += mHHist[b * steps + t, j] * mWB[j, s]
                    g = sigmoid(a)
                    mSig[b * steps + t, s] = g
                    mXs[b * steps + t, s] = x
                    x = sigma * g * x + u
                ctx += c * x
                mDc[b, s] = dctx * x * inv_states
                lam = dctx * c * inv_states
                for k in cutlass.range(steps, unroll=1):
                    row = b * steps + (steps - 1 - k)
                    g = mSig[row, s]
                    x_t = mXs[row, s]
                    mDu[row, s] = lam
                    mDa[row, s] = lam * x_t * sigma * g * (Float32(1.0) - g)
                    dsig += lam * x_t * g
                    lam = lam * sigma * g
            mCtx[b, 0] = ctx * inv_states
            mDsig[b, 0] = dsig


class InputGradients:
    """One thread per sample: dh_hist[b] = da[b] @ W_A^T + du[b] @ W_B^T and
    dh[b] = dout[b] + dc[b] @ W_C^T."""

    @cute.jit
    def __call__(self, dout_ptr: cute.Pointer, wa_ptr: cute.Pointer, wb_ptr: cute.Pointer,
                 wc_ptr: cute.Pointer, da_ptr: cute.Pointer, du_ptr: cute.Pointer,
                 dc_ptr: cute.Pointer, dh_hist_ptr: cute.Pointer, dh_ptr: cute.Pointer,
                 batch: Int32, steps: Int32, width: Int32, states: Int32, stream):
        rows = batch * steps
        launch(self.kernel(row_major(dout_ptr, batch, width), row_major(wa_ptr, width, states),
                           row_major(wb_ptr, width, states), row_major(wc_ptr, width, states),
                           row_major(da_ptr, rows, states), row_major(du_ptr, rows, states),
                           row_major(dc_ptr, batch, states), row_major(dh_hist_ptr, rows, width),
                           row_major(dh_ptr, batch, width), steps),
               batch, stream)

    @cute.kernel
    def kernel(self, mDout: cute.Tensor, mWA: cute.Tensor, mWB: cute.Tensor, mWC: cute.Tensor,
               mDa: cute.Tensor, mDu: cute.Tensor, mDc: cute.Tensor, mDHHist: cute.Tensor,
               mDH: cute.Tensor, steps: Int32):
        batch, width = mDout.shape
        states = mWA.shape[1]
        b = thread_index()
        if b < batch:
            for t in cutlass.range(steps, unroll=1):
                for j in cutlass.range(width, unroll=1):
                    acc = Float32(0.0)
                    for s in cutlass.range(states, unroll=1):
                        acc += mDa[b * steps + t, s] * mWA[j, s] + mDu[b * steps + t, s] * mWB[j, s]
                    mDHHist[b * steps + t, j] = acc
            for j in cutlass.range(width, unroll=1):
                acc = Float32(0.0)
                for s in cutlass.range(states, unroll=1):
                    acc += mDc[b, s] * mWC[j, s]
                mDH[b, j] = mDout[b, j] + acc


KERNELS = _naive.Kernels(__name__, {
    "forward": (Forward(), _naive.fake_args(7, 4, 1)),
    "scan_backward": (ScanBackward(), _naive.fake_args(14, 4, 1)),
    "input_gradients": (InputGradients(), _naive.fake_args(9, 4)),
})


def forward(h_hist: Any, h: Any, W_A: Any, W_B: Any, W_C: Any, w: Any, sigma: float) -> Any:
    batch, steps, width = h_hist.shape
    states = W_A.shape[1]
    out = empty(h, (batch, width))
    ptr = _cute.gmem_ptr
    KERNELS["forward"](ptr(h_hist), ptr(h), ptr(W_A), ptr(W_B), ptr(W_C), ptr(w), ptr(out),
                       Int32(batch), Int32(steps), Int32(width), Int32(states), Float32(sigma),
                       _cute.current_stream(h))
    return out


def backward(dout: Any, h_hist: Any, h: Any, W_A: Any, W_B: Any, W_C: Any, w: Any,
             sigma: float) -> tuple[Any, ...]:
    """-> (dW_A, dW_B, dW_C, dw, dsigma [1], dh_hist, dh)"""
    batch, steps, width = h_hist.shape
    states = W_A.shape[1]
    rows = batch * steps
    sig, xs, da, du = (empty(h, (rows, states)) for _ in range(4))
    dc = empty(h, (batch, states))
    ctx = empty(h, (batch,))
    dsig = empty(h, (batch,))
    dh_hist = empty(h, (batch, steps, width))
    dh = empty(h, (batch, width))
    ptr = _cute.gmem_ptr
    sizes = (Int32(batch), Int32(steps), Int32(width), Int32(states))
    KERNELS["scan_backward"](ptr(dout), ptr(h_hist), ptr(h), ptr(W_A), ptr(W_B), ptr(W_C), ptr(w),
                             ptr(sig), ptr(xs), ptr(da), ptr(du), ptr(dc), ptr(ctx), ptr(dsig),
                             *sizes, Float32(sigma), _cute.current_stream(h))
    KERNELS["input_gradients"](ptr(dout), ptr(W_A), ptr(W_B), ptr(W_C), ptr(da), ptr(du), ptr(dc),
                               ptr(dh_hist), ptr(dh), *sizes, _cute.current_stream(h))
    dW_A = _naive.batch_sum_new(h_hist, da, rows, width, states)
    dW_B = _naive.batch_sum_new(h_hist, du, rows, width, states)
    dW_C = _naive.batch_sum_new(h, dc, batch, width, states)
    dw = _naive.batch_sum(dout, ctx, empty(h, (width,)), batch, width, 1)
    dsigma = _naive.batch_sum_new(dsig, None, batch, 1)
    return dW_A, dW_B, dW_C, dw, dsigma, dh_hist, dh


def compiled_for_ci() -> dict[str, Any]:
    return KERNELS.compiled_for_ci()
