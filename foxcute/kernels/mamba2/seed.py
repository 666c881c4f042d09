"""The seed Mamba2 design's own kernels (the trainer's plan, kernel by kernel): the forward
scan, the readout and the reverse scan. Its projections and weight gradients are
foxcute.kernels.gemm's GEMMs, launched by the host side (foxcute.kernels.mamba2)."""

from __future__ import annotations

import operator

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ._sigmoid import _sigmoid, _sigmoid_slope
from ._tiles import THREADS, store_cta_sum


class SeedScanForward:
    """One thread per (sample, state): the K-step scan from a|u [B*K, 2D] and c [B, D], and
    ctx [B] = (1/D) sum_s c x_K by a shuffle over the sample's D lanes."""

    def __init__(self, K: int, D: int):
        self.K, self.D = K, D

    @cute.jit
    def __call__(self, p_au: cute.Pointer, p_c: cute.Pointer, p_ctx: cute.Pointer, sigma: Float32,
                 batch: Int32, stream: cuda.CUstream):
        K, D = self.K, self.D
        mAU = cute.make_tensor(p_au, cute.make_layout((batch * K, 2 * D), stride=(2 * D, 1)))
        mC = cute.make_tensor(p_c, cute.make_layout((batch, D), stride=(D, 1)))
        mCtx = cute.make_tensor(p_ctx, cute.make_layout((batch,)))
        self.kernel(mAU, mC, mCtx, sigma, batch).launch(
            grid=((batch * D + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mAU: cute.Tensor, mC: cute.Tensor, mCtx: cute.Tensor, sigma: Float32, batch: Int32):
        K, D = self.K, self.D
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        pair = bid * THREADS + tid
        b = pair // D
        s = pair - b * D
        bs = cutlass.min(b, batch - 1)  # lanes past the batch compute a real sample, then drop it
        x = Float32(0.0)
        for t in cutlass.range_constexpr(K):
            x = sigma * _sigmoid(mAU[bs * K + t, s]) * x + mAU[bs * K + t, D + s]
        prod = Float32(0.0)
        if b < batch:
            prod = mC[b, s] * x
        ctx = cute.arch.warp_reduction(prod, operator.add, threads_in_group=D) * Float32(1.0 / D)
        if b < batch and s == 0:
            mCtx[b] = ctx


class SeedReadout:
    """out = h + ctx[:, None] * w[None, :], one float4 per thread."""

    def __init__(self, SH2: int):
        self.SH2 = SH2

    @cute.jit
    def __call__(self, p_h: cute.Pointer, p_ctx: cute.Pointer, p_w: cute.Pointer, p_out: cute.Pointer,
                 batch: Int32, stream: cuda.CUstream):
        SH2 = self.SH2
        mH = cute.make_tensor(p_h, cute.make_layout((batch, SH2), stride=(SH2, 1)))
        mCtx = cute.make_tensor(p_ctx, cute.make_layout((batch,)))
        mw = cute.make_tensor(p_w, cute.make_layout((1, SH2), stride=(SH2, 1)))
        mOut = cute.make_tensor(p_out, cute.make_layout((batch, SH2), stride=(SH2, 1)))
        self.kernel(mH, mCtx, mw, mOut, batch).launch(
            grid=((batch * (SH2 // 4) + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1),
            stream=stream)

    @cute.kernel
    def kernel(self, mH: cute.Tensor, mCtx: cute.Tensor, mw: cute.Tensor, mOut: cute.Tensor, batch: Int32):
        per_row = self.SH2 // 4
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        idx = bid * THREADS + tid
        b = idx // per_row
        q = idx - b * per_row
        if b < batch:
            hv = cute.make_rmem_tensor(cute.make_layout((4,)), Float32)
            wv = cute.make_rmem_tensor(cute.make_layout((4,)), Float32)
            cute.autovec_copy(cute.local_tile(mH[b, None], (4,), (q,)), hv)
            cute.autovec_copy(cute.local_tile(mw[0, None], (4,), (q,)), wv)
            ctx = mCtx[b]
            for e in cutlass.range_constexpr(4):
                hv[e] = hv[e] + ctx * wv[e]
            cute.autovec_copy(hv, cute.local_tile(mOut[b, None], (4,), (q,)))


class SeedScanBackward:
    """One thread per (sample, state): dctx = dout @ w (the sample's D lanes split SH2),
    the forward scan recomputed, the reverse scan. Writes [da|du] [B*K, 2D], dc [B, D],
    ctx [B] and one dsigma partial per CTA."""

    def __init__(self, K: int, SH2: int, D: int):
        self.K, self.SH2, self.D = K, SH2, D

    @cute.jit
    def __call__(self, p_dout: cute.Pointer, p_w: cute.Pointer, p_au: cute.Pointer, p_c: cute.Pointer,
                 p_dau: cute.Pointer, p_dc: cute.Pointer, p_ctx: cute.Pointer, p_dsigma: cute.Pointer,
                 sigma: Float32, batch: Int32, stream: cuda.CUstream):
        K, SH2, D = self.K, self.SH2, self.D
        num_ctas = (batch * D + THREADS - 1) // THREADS
        mDout = cute.make_tensor(p_dout, cute.make_layout((batch, SH2), stride=(SH2, 1)))
        mw = cute.make_tensor(p_w, cute.make_layout((SH2,)))
        mAU = cute.make_tensor(p_au, cute.make_layout((batch * K, 2 * D), stride=(2 * D, 1)))
        mC = cute.make_tensor(p_c, cute.make_layout((batch, D), stride=(D, 1)))
        mDAU = cute.make_tensor(p_dau, cute.make_layout((batch * K, 2 * D), stride=(2 * D, 1)))
        mDC = cute.make_tensor(p_dc, cute.make_layout((batch, D), stride=(D, 1)))
        mCtx = cute.make_tensor(p_ctx, cute.make_layout((batch,)))
        mDsig = cute.make_tensor(p_dsigma, cute.make_layout((num_ctas,)))
        self.kernel(mDout, mw, mAU, mC, mDAU, mDC, mCtx, mDsig, sigma, batch).launch(
            grid=(num_ctas, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mDout: cute.Tensor, mw: cute.Tensor, mAU: cute.Tensor, mC: cute.Tensor,
               mDAU: cute.Tensor, mDC: cute.Tensor, mCtx: cute.Tensor, mDsig: cute.Tensor,
               sigma: Float32, batch: Int32):
        K, SH2, D = self.K, self.SH2, self.D
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        sRed = smem.allocate_tensor(Float32, cute.make_layout((THREADS // 32,)), 16)
        pair = bid * THREADS + tid
        b = pair // D
        s = pair - b * D
        valid = b < batch
        bs = cutlass.min(b, batch - 1)
        part = Float32(0.0)
        for i in cutlass.range_constexpr(SH2 // D):  # lane s reads columns s, s + D, ...: coalesced
            part = part + mDout[bs, s + D * i] * mw[s + D * i]
        dctx = cute.arch.warp_reduction(part, operator.add, threads_in_group=D)
        xs = cute.make_rmem_tensor(cute.make_layout((K,)), Float32)
        sigs = cute.make_rmem_tensor(cute.make_layout((K,)), Float32)
        slopes = cute.make_rmem_tensor(cute.make_layout((K,)), Float32)
        x = Float32(0.0)
        for t in cutlass.range_constexpr(K):
            a = mAU[bs * K + t, s]
            sig = _sigmoid(a)
            sigs[t] = sig
            slopes[t] = _sigmoid_slope(a)
            xs[t] = x
            x = sigma * sig * x + mAU[bs * K + t, D + s]
        c = mC[bs, s]
        prod = Float32(0.0)
        if valid:
            prod = c * x
        ctx = cute.arch.warp_reduction(prod, operator.add, threads_in_group=D) * Float32(1.0 / D)
        dsigma = Float32(0.0)
        if valid:
            lam = dctx * c * Float32(1.0 / D)
            for tr in cutlass.range_constexpr(K):
                t = K - 1 - tr
                sig = sigs[t]
                xt = xs[t]
                mDAU[b * K + t, s] = lam * xt * sigma * slopes[t]
                mDAU[b * K + t, D + s] = lam
                dsigma = dsigma + lam * xt * sig
                lam = lam * sigma * sig
            mDC[b, s] = dctx * x * Float32(1.0 / D)
            if s == 0:
                mCtx[b] = ctx

        def store_dsigma(total):
            mDsig[bid] = total

        store_cta_sum(dsigma, sRed, tid, store_dsigma)
