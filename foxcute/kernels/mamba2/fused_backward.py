"""The fused Mamba2 backward: one persistent kernel for all seven gradients, the weight
gradients as per-CTA partials that column_sum adds up (see FusedBackward)."""

from __future__ import annotations

import operator
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from .. import _wgmma
from .._mma import store_pair, warp_mma
from .._tf32 import tf32_operand
from ._sigmoid import _sigmoid, _sigmoid_slope
from ._tiles import (CHUNK, SMEM_PER_SM, THREADS, TILE_ROWS, _k_order_view, _k_pairs_view, _mma_smem,
                     _pair_pitch, _slots, _StateProduct, _store_accumulators, _TileCopies, _w_pitch, store_cta_sum)


def _partial_width(SH2: int, D: int) -> int:
    """Columns of the [num_ctas, width] partials array: the weight-gradient entries rounded
    up to whole float4 vectors, so column_sum sums every column block in one launch."""
    return -(-_num_weights(SH2, D) // 4) * 4


def _num_weights(SH2: int, D: int) -> int:
    """Entries of the flat weight gradient [dW_A | dW_B | dW_C | dw | dsigma]."""
    return 3 * SH2 * D + SH2 + 1


class FusedBackward(_TileCopies):
    """All seven gradients; the weight gradients as per-CTA partials that column_sum adds up.

    Persistent, one CTA an SM (up to 255 registers a thread): each CTA walks tiles cta, cta +
    num_ctas, ..., and sums its weight gradients over all its tiles, in tile order, in
    registers ([dW_A|dW_B], dW_C and dw per chunk; fp32's dsigma too, TF32 keeps that one in
    shared memory); it writes them once, to its own row of the partials, and after its tile
    loop triggers its column_sum, launched as this kernel's programmatic dependent (PDL). No
    float atomics: bit-identical runs.
    A tile (TILE_ROWS h_hist rows, Bt whole samples) goes through three phases (kernel):
    1. forward_products: a|u = h_hist @ [W_A|W_B], c = h @ W_C, dctx = dout @ w, chunk by
       chunk as the tile's cp.async groups land (one group a CHUNK of h_hist, 16-byte copies
       straight into shared memory, no registers held; the whole tile stays for phase 3);
    2. scans: per (sample, state) pair the forward scan recomputed in registers, then the
       reverse scan writes da|du over a|u and dc over c;
    3. gradient_products, per chunk (unrolled: each chunk's accumulators are registers of their
       own): dh_hist = [da|du] @ [W_A|W_B]^T, [dW_A|dW_B] += h_hist^T [da|du], dh = dout +
       dc @ W_C^T and dW_C += h^T dc (TF32: mma.sync on one CTA half each, dh_and_dwc_mma;
       fp32: FFMA), dw += ctx^T dout; then the chunk's h_hist (and h, dout) of the CTA's next
       tile by cp.async into the buffers it frees, so the next tile does not start by waiting.

    TF32 a|u recompute: the last warpgroup issues 8 m64n(2D)k8 wgmmas per chunk, A = the
    h_hist chunk as cp.async left it (128B-swizzled), B = [W_A|W_B]^T stored transposed and
    rounded; dW = h_hist^T [da|du] stays mma.sync (h_hist^T is MN-major, which TF32 wgmma does
    not take) and reads the swizzled tile with its K (tile rows) relabeled by _k_pairs_view, so
    that a warp's loads hit 32 distinct banks. dh_hist goes out as 64-bit pairs (store_pair).
    h_hist is not rounded to TF32: its two products (a|u, dW) read it as cp.async wrote it and
    the tensor cores truncate it, a relative error of up to 2^-10 an element, biased toward
    zero (rounding: up to 2^-11, unbiased); every other TF32 operand is rounded to nearest
    where it is staged (_tf32.tf32_operand).

    Where they fit beside the tile (TF32 only; the defaults): the weights resident (`resident`:
    [W_A|W_B]^T as a|u's wgmma B, [W_A|W_B] at dh_hist's pitch, W_C for the c product and a
    rounded copy for dh, 4 * SH2 * (2D + w_pitch3 + 2 wc_pitch) bytes more, staged once a CTA
    by stage_weights, all loads in flight at once), and, where that still fits, the tile's
    whole h and dout too (`rows_resident`), brought by cp.async in each h_hist chunk's group,
    h rounded in place once a tile in phase 2; then nothing of phase 1 is rewritten between
    chunks and phase 3 needs no staging barrier (220 KB of the SM's 226 at the defaults).
    Elsewhere the weights, h and dout are staged a chunk at a time through registers, with a
    barrier a chunk. Shared-memory bank conflicts left (a bank model of a warp's word
    addresses): the scans' a|u reads and da|du stores (2-way, 160 a tile), W_C^T staging
    (2-way, 128).

    Measured: the backward (this kernel and its column_sum) 81.7 us graph-replayed at the
    defaults, 2.04x its floor; FusedBackward 74.5 us in the step breakdown (run
    20261203T162501Z: papermill_runs/20261203T162501Z_nvidia-h200_726b8c4c/summary.md).
    History: docs/notes/mamba2-backward.md.
    """

    def __init__(self, K: int, SH2: int, D: int, precision: str):
        self.K, self.SH2, self.D = K, SH2, D
        self.tf32 = precision == "tf32"
        self.samples = TILE_ROWS // K
        self.pairs = _slots(self.samples * D)
        self.c_product = _StateProduct(self.samples, D)
        self.L = _num_weights(SH2, D)
        self.width = _partial_width(SH2, D)
        self.au_pitch = 2 * D + 4  # dh_hist's A reads (g, t) at g * pitch + t, conflict-free
        # TF32 runs dh and dW_C on the tensor cores (dh_and_dwc_mma): h and dc take rows past
        # the tile's samples, kept zero, up to whole MMA tiles (dW_C's K = samples: 8; dh's
        # M = samples: 16), and dc a row pitch at which dh's A reads (g, t) are conflict-free
        if self.tf32:
            self.h_rows = -(-self.samples // 8) * 8
            self.dc_rows = -(-self.samples // 16) * 16
            self.dc_pitch = D + 4
        else:
            self.h_rows = self.dc_rows = self.samples
            self.dc_pitch = D
        # sW holds W_A|W_B twice a tile: phase 1 for a|u (TF32: [W_A|W_B]^T, wgmma's B operand,
        # K-major and 128B-swizzled; fp32: K = rows), phase 3 with K = columns through
        # _k_pairs_view (dh_hist's B operand, 64-bit pairs)
        self.w_pitch3 = _pair_pitch(2 * D, True)  # 8 mod 16, in fp32 too
        if not self.tf32:  # TF32's h_hist tile is wgmma's A operand: 128B-swizzled, no pitch
            self.hist_pitch = _pair_pitch(SH2, False)
            self.w_pitch1 = _w_pitch(D)
        # W_C at the c product's conflict-free pitch where the CTA still fits with it;
        # elsewhere pitch D
        self.wc_pitch = self.c_product.w_pitch
        self.resident = self.rows_resident = False  # decided below, at the pitch chosen here
        if self.smem_bytes() > SMEM_PER_SM:
            self.wc_pitch = D
        # TF32: W_A|W_B (as a|u's wgmma B operand and as dh_hist's pair layout) and W_C (as
        # it is for the c product, rounded for dh) staged once a CTA where they fit beside the
        # tile, instead of once a chunk and phase (see the class docstring)
        self.resident = self.tf32 and self.smem_bytes(resident=True, rows_resident=False) <= SMEM_PER_SM
        # and, where that still fits, the tile's whole h and dout (cp.async with its h_hist)
        self.rows_resident = self.resident and self.smem_bytes(resident=True, rows_resident=True) <= SMEM_PER_SM

    def ctas_per_sm(self) -> int:
        """One CTA an SM: its weight-gradient partials stay in registers for the whole launch
        (the cap is then 255 registers a thread)."""
        return 1

    def smem_bytes(self, resident: bool | None = None, rows_resident: bool | None = None) -> int:
        D, SH2, Bt = self.D, self.SH2, self.samples
        if resident is None:
            resident = self.resident
        if rows_resident is None:
            rows_resident = self.rows_resident
        wc_rows = SH2 if resident else CHUNK
        # h's and dout's chunk buffers; with rows_resident, the tile's whole rows instead
        rows = (self.h_rows + Bt) * ((SH2 if rows_resident else CHUNK) + 4)
        small = (rows + wc_rows * self.wc_pitch + SH2
                 + TILE_ROWS * self.au_pitch + self.dc_rows * self.dc_pitch + Bt + THREADS // 32)
        slack = 16 * 10  # alignment slack per allocation
        if resident:  # [W_A|W_B]^T swizzled, [W_A|W_B] at dh_hist's pitch, W_C rounded too
            w_floats = 2 * D * SH2 + SH2 * self.w_pitch3 + SH2 * self.wc_pitch
            return 4 * (TILE_ROWS * SH2 + w_floats + small + THREADS) + 2 * _wgmma.ATOM_BYTES + slack
        if self.tf32:  # h_hist and sW on swizzle-atom boundaries; sDsigma
            return 4 * (TILE_ROWS * SH2 + self.w_floats() + small + THREADS) + 2 * _wgmma.ATOM_BYTES + slack
        # sWCt: W_C[chunk]^T for the FFMA dh
        return 4 * (TILE_ROWS * self.hist_pitch + self.w_floats() + small + D * (CHUNK + 4)) + slack

    def w_floats(self) -> int:
        """Floats of the sW buffer: the larger of its phase-1 and phase-3 layouts."""
        if self.tf32:
            return max(2 * self.D * CHUNK, CHUNK * self.w_pitch3)
        return CHUNK * max(self.w_pitch1, self.w_pitch3)

    @cute.jit
    def __call__(self, p_dout: cute.Pointer, p_hist: cute.Pointer, p_h: cute.Pointer,
                 p_wa: cute.Pointer, p_wb: cute.Pointer, p_wc: cute.Pointer, p_w: cute.Pointer,
                 p_partials: cute.Pointer, p_dhist: cute.Pointer, p_dh: cute.Pointer,
                 sigma: Float32, batch: Int32, num_ctas: Int32, stream: cuda.CUstream):
        K, SH2, D = self.K, self.SH2, self.D
        mDout = cute.make_tensor(p_dout, cute.make_layout((batch, SH2), stride=(SH2, 1)))
        mHist = cute.make_tensor(p_hist, cute.make_layout((batch * K, SH2), stride=(SH2, 1)))
        mH = cute.make_tensor(p_h, cute.make_layout((batch, SH2), stride=(SH2, 1)))
        mWA = cute.make_tensor(p_wa, cute.make_layout((SH2, D), stride=(D, 1)))
        mWB = cute.make_tensor(p_wb, cute.make_layout((SH2, D), stride=(D, 1)))
        mWC = cute.make_tensor(p_wc, cute.make_layout((SH2, D), stride=(D, 1)))
        mw = cute.make_tensor(p_w, cute.make_layout((1, SH2), stride=(SH2, 1)))
        mP = cute.make_tensor(p_partials, cute.make_layout((num_ctas, self.width), stride=(self.width, 1)))
        mDHist = cute.make_tensor(p_dhist, cute.make_layout((batch * K, SH2), stride=(SH2, 1)))
        mDH = cute.make_tensor(p_dh, cute.make_layout((batch, SH2), stride=(SH2, 1)))
        self.kernel(mDout, mHist, mH, mWA, mWB, mWC, mw, mP, mDHist, mDH, sigma, batch,
                    num_ctas).launch(grid=(num_ctas, 1, 1), block=(THREADS, 1, 1), stream=stream,
                                     min_blocks_per_mp=self.ctas_per_sm(), preferred_smem_carveout=100)

    @cute.jit
    def fetch_chunk(self, mWA: cute.Tensor, mWB: cute.Tensor, mH: cute.Tensor, mWC: cute.Tensor,
                    mDout: cute.Tensor, b0: Int32, n_samples: Int32, col0: Int32, rW: cute.Tensor,
                    rH: cute.Tensor, rWC: cute.Tensor, rDout: cute.Tensor,
                    w_transposed: cutlass.Constexpr[bool] = False):
        """Registers <- SH2 columns col0 : col0 + CHUNK of W_A|W_B, W_C (unless they are
        resident), and h, dout of the tile's samples b0 : b0 + n_samples; W_A|W_B for
        store_weights_t if `w_transposed`."""
        if const_expr(not self.resident):
            if const_expr(w_transposed):
                self.fetch_weights_t(mWA, mWB, col0, rW)
            else:
                self.fetch_weights_ab(mWA, mWB, col0, rW, self.D)
            self.fetch_rows(mWC, col0, CHUNK, 0, rWC, CHUNK, self.D)
        self.fetch_rows(mH, b0, n_samples, col0, rH, self.samples, CHUNK)
        self.fetch_rows(mDout, b0, n_samples, col0, rDout, self.samples, CHUNK)

    @cute.jit
    def stage_weights(self, mWA: cute.Tensor, mWB: cute.Tensor, mWC: cute.Tensor, sWt: cute.Tensor,
                      sW3: cute.Tensor, sWC: cute.Tensor, sWCr: cute.Tensor):
        """The resident weights, once a CTA: sWt (2D, CHUNK, chunks) <- [W_A|W_B]^T rounded
        (a|u's wgmma B), sW3 (SH2, 2D) <- [W_A|W_B] rounded (dh_hist's B), sWC (SH2, D) <-
        W_C as it is (the c product's FFMA) and sWCr <- W_C rounded (dh's B). Every chunk's
        loads are issued before the first store: one round trip, not one a chunk."""
        D = self.D
        n_chunks = self.SH2 // CHUNK
        slots_w = _slots(CHUNK * 2 * D // 4)
        slots_wc = _slots(CHUNK * D // 4)
        rT, rAB, rC = [], [], []
        for kc in cutlass.range_constexpr(n_chunks):
            rT.append(cute.make_rmem_tensor(cute.make_layout((4, slots_w)), Float32))
            rAB.append(cute.make_rmem_tensor(cute.make_layout((4, slots_w)), Float32))
            rC.append(cute.make_rmem_tensor(cute.make_layout((4, slots_wc)), Float32))
            self.fetch_weights_t(mWA, mWB, kc * CHUNK, rT[kc])
            self.fetch_weights_ab(mWA, mWB, kc * CHUNK, rAB[kc], D)
            self.fetch_rows(mWC, kc * CHUNK, CHUNK, 0, rC[kc], CHUNK, D)
        for kc in cutlass.range_constexpr(n_chunks):
            self.store_weights_t(rT[kc], sWt[None, None, kc])
            self.store_rows(rAB[kc], cute.local_tile(sW3, (CHUNK, 2 * D), (kc, 0)), CHUNK, 2 * D, True)
            self.store_rows(rC[kc], cute.local_tile(sWC, (CHUNK, D), (kc, 0)), CHUNK, D)
            self.store_rows(rC[kc], cute.local_tile(sWCr, (CHUNK, D), (kc, 0)), CHUNK, D, True)
        _wgmma.publish()  # sWt -> the tensor cores; a barrier follows before the first wgmma

    def hist_chunk(self, sHist: cute.Tensor, kc: Int32) -> cute.Tensor:
        """The (TILE_ROWS, CHUNK) h_hist chunk kc of the tile in shared memory."""
        if const_expr(self.tf32):
            return sHist[None, None, kc]
        return cute.local_tile(sHist, (TILE_ROWS, CHUNK), (0, kc))

    def ab_entry(self, coord_dw: cute.Tensor, col0: Int32, i: int) -> Int32:
        """Flat weight-gradient index of [dW_A|dW_B] accumulator entry i (trace-time Python):
        n < D: dW_A[col0 + j, n]; n >= D: dW_B[col0 + j, n - D], SH2 * D entries later."""
        j, n = coord_dw[i]
        return (col0 + j) * self.D + n + (n // self.D) * (self.SH2 * self.D - self.D)

    def wc_vector(self, col0: Int32, tid: Int32, i: int) -> Int32:
        """Float4 index in a partials row of dW_C[col0 + j, 4*s4 : 4*s4 + 4], where the
        thread's slot i holds (j, s4) = divmod(tid + i * THREADS, D // 4)."""
        return (2 * self.SH2 * self.D + col0 * self.D) // 4 + tid + i * THREADS

    def wc_entry(self, coord_wc: cute.Tensor, col0: Int32, i: int) -> Int32:
        """Flat index in a partials row of dW_C[col0 + j, s], TF32 dW_C accumulator entry i."""
        j, s = coord_wc[i]
        return 2 * self.SH2 * self.D + (col0 + j) * self.D + s

    @cute.jit
    def dh_and_dwc_mma(self, tid: Int32, tiled_dh: cute.TiledMma, thr_dh: Any, tiled_wc: cute.TiledMma,
                       thr_wc: Any, sDC: cute.Tensor, sWC: cute.Tensor, sH: cute.Tensor,
                       sDout: cute.Tensor, acc_wc: cute.Tensor, mDH: cute.Tensor,
                       b0: Int32, n_samples: Int32, col0: Int32):
        """TF32 phase 3 of one chunk, the two small products on the tensor cores, side by side:
        the first 4 warps dh[b, chunk] = dout + dc @ W_C[chunk]^T (M = samples, padded to
        dc_rows; N = CHUNK; K = D), the other 4 dW_C[chunk] += h^T dc (M = CHUNK, N = D,
        K = samples, padded to h_rows with zero rows) into acc_wc, the chunk's dW_C
        accumulators for the whole launch. dh stores 64-bit pairs. dc, h and W_C were rounded
        when they were put in shared memory. As FFMA (fp32's path) these took 1 + 2D shared
        loads and 4D FFMAs per 4 outputs of dh, on half of the threads, and 2 Bt loads per 4
        of dW_C."""
        D = self.D
        if tid < THREADS // 2:
            acc = tiled_dh.make_fragment_C(tiled_dh.partition_shape_C((self.dc_rows, CHUNK)))
            acc.fill(0.0)
            _mma_smem(tiled_dh, thr_dh, acc, sDC, sWC, True, a_rounded=True, b_rounded=True)
            coord = thr_dh.partition_C(cute.make_identity_tensor((self.dc_rows, CHUNK)))
            for i in cutlass.range_constexpr(0, cute.size(acc), 2):
                b, n = coord[i]
                if b < n_samples:
                    store_pair(mDH[b0 + b, None], col0 + n, sDout[b, n] + acc[i], sDout[b, n + 1] + acc[i + 1])
        else:
            sHt = cute.make_tensor(sH.iterator, cute.select(sH.layout, mode=[1, 0]))
            sDCt = cute.make_tensor(sDC.iterator, cute.make_layout((D, self.h_rows), stride=(1, self.dc_pitch)))
            _mma_smem(tiled_wc, thr_wc, acc_wc, sHt, sDCt, True, a_rounded=True, b_rounded=True)

    @cute.jit
    def dh_and_dwc_ffma(self, tid: Int32, sDC: cute.Tensor, sWCt: cute.Tensor, sH: cute.Tensor, sDout: cute.Tensor,
                        acc_wc: cute.Tensor, mDH: cute.Tensor, b0: Int32, n_samples: Int32, col0: Int32):
        """fp32 phase 3 of one chunk: dh[b, chunk] = dout + dc @ W_C[chunk]^T and dW_C[chunk] +=
        h^T dc (into acc_wc [n_wc, 4], the chunk's dW_C for the whole launch) as exact float32
        FFMA."""
        D, Bt = self.D, self.samples
        quads = D // 4
        n_wc = _slots(CHUNK * quads)  # dW_C: 4 consecutive states per thread and slot
        # 4 outputs a thread below: each shared-memory read feeds 4 FFMAs, not 1
        v = cute.make_rmem_tensor(cute.make_layout((4,)), Float32)
        x4 = cute.make_rmem_tensor(cute.make_layout((4,)), Float32)
        # dh[b, chunk] = dout + dc @ W_C[chunk]^T
        for i in cutlass.range_constexpr(_slots(Bt * CHUNK // 4)):
            idx = tid + i * THREADS
            b = idx // (CHUNK // 4)
            q = idx - b * (CHUNK // 4)
            if b < n_samples:
                cute.autovec_copy(cute.local_tile(sDout[b, None], (4,), (q,)), v)
                for s in cutlass.range_constexpr(D):
                    dc = sDC[b, s]
                    cute.autovec_copy(cute.local_tile(sWCt[s, None], (4,), (q,)), x4)
                    for e in cutlass.range_constexpr(4):
                        v[e] = v[e] + dc * x4[e]
                cute.autovec_copy(v, cute.local_tile(mDH[b0 + b, None], (4,), (col0 // 4 + q,)))
        # dW_C[chunk] += h[:, chunk]^T @ dc
        for i in cutlass.range_constexpr(n_wc):
            idx = tid + i * THREADS
            j = idx // quads
            s4 = idx - j * quads
            if idx < CHUNK * quads:
                v.fill(0.0)
                for b in cutlass.range_constexpr(Bt):
                    hj = sH[b, j]
                    cute.autovec_copy(cute.local_tile(sDC[b, None], (4,), (s4,)), x4)
                    for e in cutlass.range_constexpr(4):
                        v[e] = v[e] + hj * x4[e]
                for e in cutlass.range_constexpr(4):
                    acc_wc[i, e] = acc_wc[i, e] + v[e]

    @cute.jit
    def forward_products(self, tid: Int32, b0: Int32, n_samples: Int32, mWA: cute.Tensor, mWB: cute.Tensor,
                         mWC: cute.Tensor, mH: cute.Tensor, mDout: cute.Tensor, sHist: cute.Tensor, sWt: cute.Tensor,
                         sW1: Any, sWC: cute.Tensor, sWCall: cute.Tensor, sH: Any, sDout: Any, sHall: Any,
                         sDoutAll: Any, sWv: cute.Tensor, sDC: cute.Tensor, sAU: cute.Tensor, rW: cute.Tensor,
                         rH: cute.Tensor, rWC: cute.Tensor, rDout: cute.Tensor, tiled_au: Any, thr_au: Any,
                         mma_group: Any, tCrA: Any, tCrB: Any, c_acc: cute.Tensor, dctx_acc: cute.Tensor):
        """Phase 1 of a tile: a|u = h_hist @ [W_A|W_B] into sAU (the h_hist tile stays), c = h @ W_C
        into sDC, and this thread's share of dctx = dout @ w into dctx_acc (its pairs' partial
        sums), chunk by chunk as the tile's cp.async groups land."""
        D, Bt = self.D, self.samples
        n_chunks = self.SH2 // CHUNK
        slice_k = CHUNK // D  # columns of dout @ w each lane of a sample's D-lane group sums
        acc = tiled_au.make_fragment_C(tiled_au.partition_shape_C((TILE_ROWS, 2 * D)))
        acc.fill(0.0)
        c_acc.fill(0.0)
        dctx_acc.fill(0.0)
        if const_expr(not self.rows_resident):
            self.fetch_chunk(mWA, mWB, mH, mWC, mDout, b0, n_samples, 0, rW, rH, rWC, rDout, self.tf32)
        for kc in cutlass.range(n_chunks, unroll=1):
            for j in cutlass.range_constexpr(n_chunks):  # wait_group takes an immediate
                if kc == j:
                    cute.arch.cp_async_wait_group(n_chunks - 1 - j)  # chunk kc has landed
            if const_expr(self.resident):
                sWCk = cute.local_tile(sWCall, (CHUNK, D), (kc, 0))
            else:
                sWCk = sWC
                if const_expr(self.tf32):
                    self.store_weights_t(rW, sWt)
                else:
                    self.store_rows(rW, sW1, CHUNK, 2 * D)
                self.store_rows(rWC, sWC, CHUNK, D)
            if const_expr(self.rows_resident):  # arrived with the chunk's h_hist
                sHk = cute.local_tile(sHall, (Bt, CHUNK), (0, kc))
                sDoutK = cute.local_tile(sDoutAll, (Bt, CHUNK), (0, kc))
            else:
                sHk, sDoutK = sH, sDout
                self.store_rows(rH, sH, Bt, CHUNK)
                self.store_rows(rDout, sDout, Bt, CHUNK)
            if const_expr(self.tf32):
                # h_hist stays as cp.async wrote it: its two products (a|u, dW) truncate
                # it to TF32 rather than round it (see the class docstring)
                _wgmma.publish()  # the chunk and the stores above -> the tensor cores' (async proxy) reads
            cute.arch.barrier()
            if const_expr(self.tf32):
                # the chunk's a|u as one wgmma group, issued first: the tensor cores read
                # sHist and sWt while the next chunk's loads are issued and c, dctx
                # accumulate; waited for before the closing barrier, after which sWt is rewritten
                if mma_group:  # resident: the chunk's own [W_A|W_B]^T; else the one staged
                    _wgmma.mma_group(tiled_au, acc, tCrA, tCrB, a_at=(kc,),
                                     b_at=(kc,) if const_expr(self.resident) else ())
            if const_expr(not self.rows_resident):
                if kc + 1 < n_chunks:
                    self.fetch_chunk(mWA, mWB, mH, mWC, mDout, b0, n_samples, (kc + 1) * CHUNK,
                                     rW, rH, rWC, rDout, self.tf32)
            if const_expr(not self.tf32):
                _mma_smem(tiled_au, thr_au, acc, self.hist_chunk(sHist, kc), sWt, False)
            self.c_product.accumulate(c_acc, sHk, sWCk, tid)
            for p in cutlass.range_constexpr(self.pairs):
                pair = tid + p * THREADS
                if pair < Bt * D:
                    b = pair // D
                    s = pair - b * D
                    dc = dctx_acc[p]
                    for k in cutlass.range_constexpr(slice_k):
                        dc = dc + sDoutK[b, s * slice_k + k] * sWv[0, kc * CHUNK + s * slice_k + k]
                    dctx_acc[p] = dc
            if const_expr(self.tf32):
                # every warp (a no-op where nothing is in flight), as in the forward
                warpgroup.wait_group(0)
            if const_expr(not self.rows_resident):
                # the next chunk's staging rewrites sW, sWC, sH, sDout. With h and dout
                # resident nothing of phase 1 is rewritten (each chunk has its own
                # buffers), so warps done with chunk kc go on to chunk kc + 1 while the
                # others finish it
                cute.arch.barrier()
        self.c_product.store(c_acc, sDC, tid)
        if const_expr(self.tf32):
            if mma_group:
                _store_accumulators(thr_au, acc, sAU)
        else:
            _store_accumulators(thr_au, acc, sAU)
        cute.arch.barrier()

    @cute.jit
    def scans(self, tid: Int32, sigma: Float32, dsigma: Float32, sAU: cute.Tensor, sDC: cute.Tensor,
              sCtx: cute.Tensor, sDsigma: Any, sHall: Any, xs: cute.Tensor, dctx_acc: cute.Tensor) -> Float32:
        """Phase 2 of a tile: per (sample, state) pair the forward scan recomputed from a|u (its
        states x_t kept in xs), ctx, then the reverse scan: da|du written over a|u, dc over c,
        ctx to sCtx; returns dsigma plus this thread's terms (TF32 keeps the running sum in
        sDsigma). With h and dout resident, h rounded in place for phase 3's dW_C."""
        K, D, Bt = self.K, self.D, self.samples
        n_chunks = self.SH2 // CHUNK
        if const_expr(self.tf32):
            dsigma = sDsigma[tid]
        for p in cutlass.range_constexpr(self.pairs):
            pair = tid + p * THREADS
            b = pair // D
            s = pair - b * D
            bs = cutlass.min(b, Bt - 1)  # lanes past the tile: c = dctx = 0, so all zero
            x = Float32(0.0)
            for t in cutlass.range_constexpr(K):
                xs[t] = x
                x = sigma * _sigmoid(sAU[bs * K + t, s]) * x + sAU[bs * K + t, D + s]
            if const_expr(p == self.pairs - 1 and Bt * D % THREADS != 0):
                # lanes past the tile read sample Bt-1's a|u, which that sample's own lanes
                # (all in this last pass) overwrite with da|du below: all reads before any write
                cute.arch.barrier()
            c = Float32(0.0)
            if pair < Bt * D:  # read by the thread that overwrites it with dc below
                c = sDC[b, s]
            ctx = cute.arch.warp_reduction(c * x, operator.add, threads_in_group=D) * Float32(1.0 / D)
            dctx = cute.arch.warp_reduction(dctx_acc[p], operator.add, threads_in_group=D)
            lam = dctx * c * Float32(1.0 / D)
            dcs = dctx * x * Float32(1.0 / D)
            if pair < Bt * D:
                for tr in cutlass.range_constexpr(K):
                    t = K - 1 - tr
                    # a_t is read again (not kept in K registers) before da_t overwrites it
                    a = sAU[b * K + t, s]
                    sig = _sigmoid(a)
                    xt = xs[t]
                    da = lam * xt * sigma * _sigmoid_slope(a)
                    du = lam
                    if const_expr(self.tf32):  # da|du feed only the tensor cores (dh_hist, dW)
                        da = tf32_operand(da)
                        du = tf32_operand(du)
                    sAU[b * K + t, s] = da
                    sAU[b * K + t, D + s] = du
                    dsigma = dsigma + lam * xt * sig
                    lam = lam * sigma * sig
                if const_expr(self.tf32):  # dc, too, feeds only the tensor cores (dh, dW_C)
                    dcs = tf32_operand(dcs)
                sDC[b, s] = dcs
                if s == 0:
                    sCtx[b] = ctx
        if const_expr(self.tf32):
            sDsigma[tid] = dsigma
        if const_expr(self.rows_resident):
            # h feeds only dW_C's MMA from here: rounded once for the whole tile (phase 1's
            # c product read it as it is), so phase 3's chunks need no staging barrier
            for kc in cutlass.range_constexpr(n_chunks):
                self.round_rows_in_place(cute.local_tile(sHall, (Bt, CHUNK), (0, kc)), Bt, CHUNK)
        cute.arch.barrier()
        return dsigma

    @cute.jit
    def gradient_products(self, tid: Int32, b0: Int32, n_samples: Int32, row0: Int32, next_b0: Int32,
                          next_samples: Int32, mWA: cute.Tensor, mWB: cute.Tensor, mWC: cute.Tensor, mH: cute.Tensor,
                          mDout: cute.Tensor, mHist: cute.Tensor, mDHist: cute.Tensor, mDH: cute.Tensor,
                          sHist: cute.Tensor, sW3: Any, sW3all: Any, sWC: cute.Tensor, sWCr: Any, sWCt: Any,
                          sH: Any, sDout: Any, sHall: Any, sDoutAll: Any, sAUk: cute.Tensor, sAU: cute.Tensor,
                          sAUt: cute.Tensor, sDC: cute.Tensor, sCtx: cute.Tensor, rW: cute.Tensor, rH: cute.Tensor,
                          rWC: cute.Tensor, rDout: cute.Tensor, tiled: cute.TiledMma, thr: Any, tiled_dh: Any,
                          thr_dh: Any, tiled_wc: Any, thr_wc: Any, acc_ab: list, acc_wc: list, acc_w: cute.Tensor):
        """Phase 3 of a tile, chunk by chunk (unrolled: each chunk's weight-gradient accumulators
        by name): dh_hist = [da|du] @ [W_A|W_B]^T out to global memory, [dW_A|dW_B] += h_hist^T
        [da|du] into acc_ab, dh out and dW_C into acc_wc (dh_and_dwc_mma / _ffma), dw += ctx^T
        dout into acc_w; then the next tile's cp.async into the chunk's freed buffers."""
        K, D, Bt = self.K, self.D, self.samples
        n_chunks = self.SH2 // CHUNK
        if const_expr(not self.rows_resident):
            self.fetch_chunk(mWA, mWB, mH, mWC, mDout, b0, n_samples, 0, rW, rH, rWC, rDout)
        for kc in cutlass.range_constexpr(n_chunks):  # unrolled: the chunk's accumulators by name
            col0 = kc * CHUNK
            if const_expr(self.resident):
                sW3k = cute.local_tile(sW3all, (CHUNK, 2 * D), (kc, 0))
                sWCk = cute.local_tile(sWCr, (CHUNK, D), (kc, 0))
            else:
                sW3k, sWCk = sW3, sWC
                self.store_rows(rW, sW3, CHUNK, 2 * D, self.tf32)
                # TF32: W_C feeds only dh's MMA in this phase
                if const_expr(self.tf32):
                    self.store_rows(rWC, sWC, CHUNK, D, True)
                else:
                    self.store_rows_transposed(rWC, sWCt, CHUNK, D)
            if const_expr(self.rows_resident):  # in place since phase 2; h rounded there
                sHk = cute.local_tile(sHall, (self.h_rows, CHUNK), (0, kc))
                sDoutK = cute.local_tile(sDoutAll, (Bt, CHUNK), (0, kc))
            else:
                sHk, sDoutK = sH, sDout
                # TF32: h feeds only dW_C's MMA in this phase
                self.store_rows(rH, sH, Bt, CHUNK, self.tf32)
                self.store_rows(rDout, sDout, Bt, CHUNK)
                cute.arch.barrier()
            if const_expr(kc + 1 < n_chunks and not self.rows_resident):
                self.fetch_chunk(mWA, mWB, mH, mWC, mDout, b0, n_samples, (kc + 1) * CHUNK,
                                 rW, rH, rWC, rDout)

            # dh_hist[rows, chunk] = [da|du] @ [W_A|W_B][chunk]^T
            acc_dh = tiled.make_fragment_C(tiled.partition_shape_C((TILE_ROWS, CHUNK)))
            acc_dh.fill(0.0)
            if const_expr(self.tf32):
                # K relabeled by _k_pairs_view: W's fragment pairs adjacent; sAUk holds
                # [da|du] in that K order (_k_order_view), so it is read as stored
                _mma_smem(tiled, thr, acc_dh, sAUk, _k_pairs_view(sW3k), True, a_rounded=True,
                          b_rounded=True, b_pairs=True)
            else:
                _mma_smem(tiled, thr, acc_dh, sAU, sW3, False)
            coord_dh = thr.partition_C(cute.make_identity_tensor((TILE_ROWS, CHUNK)))
            if const_expr(self.tf32):
                # m16n8k8 accumulators come in column pairs (c0, c1) = (g, 2t), (g, 2t + 1):
                # one 64-bit store each (element by element, these stores were the largest
                # stall of the kernel: docs/notes/mamba2-backward.md)
                for i in cutlass.range_constexpr(0, cute.size(acc_dh), 2):
                    m, n = coord_dh[i]
                    if m < n_samples * K:
                        store_pair(mDHist[row0 + m, None], col0 + n, acc_dh[i], acc_dh[i + 1])
            else:
                for i in cutlass.range_constexpr(cute.size(acc_dh)):
                    m, n = coord_dh[i]
                    if m < n_samples * K:
                        mDHist[row0 + m, col0 + n] = acc_dh[i]

            # [dW_A|dW_B][chunk] += h_hist[rows, chunk]^T @ [da|du]
            sHistChunk = self.hist_chunk(sHist, kc)
            sHistT = cute.make_tensor(sHistChunk.iterator, cute.select(sHistChunk.layout, mode=[1, 0]))
            acc_dw = acc_ab[kc]
            if const_expr(self.tf32):
                # K (tile rows) relabeled by _k_pairs_view in both operands: lane (g, t)
                # reads rows 2t, 2t + 1, whose swizzle spreads the warp's h_hist^T loads
                # over 32 banks (2-way conflicts at rows t) and the [da|du]^T loads too
                # (2-way at pitch 2D + 4 before). h_hist's bits go in as they are (a_rounded:
                # no cvt.rna), so the tensor cores truncate it (see the class docstring)
                _mma_smem(tiled, thr, acc_dw, _k_pairs_view(sHistT), _k_pairs_view(sAUt), True,
                          a_rounded=True, b_rounded=True)
            else:
                _mma_smem(tiled, thr, acc_dw, sHistT, sAUt, False)

            if const_expr(self.tf32):
                self.dh_and_dwc_mma(tid, tiled_dh, thr_dh, tiled_wc, thr_wc, sDC, sWCk, sHk, sDoutK,
                                    acc_wc[kc], mDH, b0, n_samples, col0)
            else:
                self.dh_and_dwc_ffma(tid, sDC, sWCt, sH, sDout, acc_wc[kc], mDH, b0, n_samples, col0)
            # dw[chunk] += ctx @ dout[:, chunk]
            if tid < CHUNK:
                w_sum = Float32(0.0)
                for b in cutlass.range_constexpr(Bt):
                    w_sum = w_sum + sCtx[b] * sDoutK[b, tid]
                acc_w[kc] = acc_w[kc] + w_sum
            cute.arch.barrier()
            if next_samples > 0:  # every warp is past this chunk's dW product: its h_hist is free
                if const_expr(self.rows_resident):  # and its h, dout: the next tile's join its group
                    self.copy_rows_async(mH, next_b0, next_samples, col0,
                                         cute.local_tile(sHall, (Bt, CHUNK), (0, kc)), Bt, CHUNK, False)
                    self.copy_rows_async(mDout, next_b0, next_samples, col0,
                                         cute.local_tile(sDoutAll, (Bt, CHUNK), (0, kc)), Bt, CHUNK, False)
                self.copy_rows_async(mHist, next_b0 * K, next_samples * K, col0,
                                     self.hist_chunk(sHist, kc), TILE_ROWS, CHUNK)

    @cute.kernel
    def kernel(self, mDout: cute.Tensor, mHist: cute.Tensor, mH: cute.Tensor, mWA: cute.Tensor,
               mWB: cute.Tensor, mWC: cute.Tensor, mw: cute.Tensor, mP: cute.Tensor,
               mDHist: cute.Tensor, mDH: cute.Tensor, sigma: Float32, batch: Int32, num_ctas: Int32):
        K, SH2, D, Bt = self.K, self.SH2, self.D, self.samples
        n_chunks = SH2 // CHUNK
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        # the buffers of other configurations (the phases take them all): None here
        sW1 = sW3 = sW3all = sWCr = sH = sDout = sHall = sDoutAll = None
        if const_expr(self.tf32):
            # a|u's wgmma operands (see _wgmma), K-major and 128B-swizzled: the h_hist tile as
            # (TILE_ROWS, CHUNK, chunks), chunk kc = [None, None, kc], and [W_A|W_B]^T of a chunk
            sHist = _wgmma.allocate_sw128(smem, (TILE_ROWS, CHUNK, n_chunks))
            if const_expr(self.resident):
                sWt = _wgmma.allocate_sw128(smem, (2 * D, CHUNK, n_chunks))
                sW3all = smem.allocate_tensor(Float32, cute.make_layout((SH2, 2 * D), stride=(self.w_pitch3, 1)), 16)
            else:
                sWbuf = smem.allocate_tensor(Float32, cute.make_layout((self.w_floats(),)), _wgmma.ATOM_BYTES)
                sWt = _wgmma.sw128_view(sWbuf.iterator, (2 * D, CHUNK))
        else:
            hist_layout = cute.make_layout((TILE_ROWS, SH2), stride=(self.hist_pitch, 1))
            sHist = smem.allocate_tensor(Float32, hist_layout, 16)
            w_pitch = max(self.w_pitch1, self.w_pitch3)
            sWbuf = smem.allocate_tensor(Float32, cute.make_layout((CHUNK, w_pitch), stride=(w_pitch, 1)), 16)
            sW1 = cute.make_tensor(sWbuf.iterator, cute.make_layout((CHUNK, 2 * D), stride=(self.w_pitch1, 1)))
            # [W_A|W_B]^T (2D, Kc) for a|u
            sWt = cute.make_tensor(sW1.iterator, cute.make_layout((2 * D, CHUNK), stride=(1, self.w_pitch1)))
        if const_expr(not self.resident):
            sW3 = cute.make_tensor(sWbuf.iterator, cute.make_layout((CHUNK, 2 * D), stride=(self.w_pitch3, 1)))
        if const_expr(self.rows_resident):
            # the tile's h and dout, whole, brought by cp.async with its h_hist chunks (pitch
            # SH2 + 4 = 4 mod 32 words, as CHUNK + 4 below: the same banks); h's rows past the
            # tile's samples are dW_C's K padding, as in sH
            sHall = smem.allocate_tensor(Float32, cute.make_layout((self.h_rows, SH2), stride=(SH2 + 4, 1)), 16)
            sDoutAll = smem.allocate_tensor(Float32, cute.make_layout((Bt, SH2), stride=(SH2 + 4, 1)), 16)
        else:  # a chunk of each at a time, staged through registers
            sH = smem.allocate_tensor(Float32, cute.make_layout((self.h_rows, CHUNK), stride=(CHUNK + 4, 1)), 16)
            sDout = smem.allocate_tensor(Float32, cute.make_layout((Bt, CHUNK), stride=(CHUNK + 4, 1)), 16)
        wc_rows = SH2 if const_expr(self.resident) else CHUNK
        sWCall = smem.allocate_tensor(Float32, cute.make_layout((wc_rows, D), stride=(self.wc_pitch, 1)), 16)
        sWC = cute.local_tile(sWCall, (CHUNK, D), (0, 0))
        if const_expr(self.resident):  # W_C rounded, dh's B operand
            sWCr = smem.allocate_tensor(Float32, cute.make_layout((SH2, D), stride=(self.wc_pitch, 1)), 16)
        # fp32's phase 3 reads W_C[chunk] with lanes along SH2: transposed, so those reads hit
        # distinct banks (TF32's dh reads sWC, restaged rounded, as its MMA's B operand)
        sWCt = None
        if const_expr(not self.tf32):
            sWCt = smem.allocate_tensor(Float32, cute.make_layout((D, CHUNK), stride=(CHUNK + 4, 1)), 16)
        sWv = smem.allocate_tensor(Float32, cute.make_layout((1, SH2), stride=(SH2, 1)), 16)
        sAUk = smem.allocate_tensor(Float32, cute.make_layout((TILE_ROWS, 2 * D), stride=(self.au_pitch, 1)), 16)
        # a|u, then da|du: TF32 keeps its columns in dh_hist's K order (see _k_order_view)
        sAU = _k_order_view(sAUk) if const_expr(self.tf32) else sAUk
        # c from phase 1, then dc written over it in phase 2 (each (b, s) by the thread that read it)
        sDC = smem.allocate_tensor(Float32, cute.make_layout((self.dc_rows, D), stride=(self.dc_pitch, 1)), 16)
        sCtx = smem.allocate_tensor(Float32, cute.make_layout((Bt,)), 16)
        sRed = smem.allocate_tensor(Float32, cute.make_layout((THREADS // 32,)), 16)
        # TF32: each thread's running dsigma sum, touched once a tile (why not a register:
        # docs/notes/mamba2-backward.md, 2026-11-29)
        sDsigma = smem.allocate_tensor(Float32, cute.make_layout((THREADS,)), 16) if const_expr(self.tf32) else None
        # [da|du]^T (2D, TILE_ROWS) for dW
        sAUt = cute.make_tensor(sAU.iterator, cute.select(sAU.layout, mode=[1, 0]))

        rW = cute.make_rmem_tensor(cute.make_layout((4, _slots(CHUNK * 2 * D // 4))), Float32)
        rH = cute.make_rmem_tensor(cute.make_layout((4, _slots(Bt * CHUNK // 4))), Float32)
        rDout = cute.make_rmem_tensor(cute.make_layout((4, _slots(Bt * CHUNK // 4))), Float32)
        rWC = cute.make_rmem_tensor(cute.make_layout((4, _slots(CHUNK * D // 4))), Float32)

        tiled = warp_mma(4, 2) if self.tf32 else warp_mma(2, 4, tf32=False)
        thr = tiled.get_slice(tid)
        if const_expr(self.tf32):
            # a|u = one 64 x 2D wgmma tile (M = TILE_ROWS), issued by the last warpgroup (the c
            # product's tasks and dctx's pairs fill the low threads first)
            tiled_au = _wgmma.tiled_mma_tf32(2 * D)
            mma_group = tid // _wgmma.WARPGROUP == THREADS // _wgmma.WARPGROUP - 1
            thr_au = tiled_au.get_slice(tid % _wgmma.WARPGROUP)
            tCrA = tiled_au.make_fragment_A(thr_au.partition_A(sHist))  # (MMA, 1, CHUNK / 8, chunks)
            tCrB = tiled_au.make_fragment_B(thr_au.partition_B(sWt))  # (MMA, 1, CHUNK / 8)
        else:
            tiled_au = warp_mma(2, 4, tf32=False)
            thr_au = tiled_au.get_slice(tid)
            mma_group = tCrA = tCrB = None
        c_acc = self.c_product.accumulators()
        dctx_acc = cute.make_rmem_tensor(cute.make_layout((self.pairs,)), Float32)
        xs = cute.make_rmem_tensor(cute.make_layout((K,)), Float32)
        coord_dw = thr.partition_C(cute.make_identity_tensor((CHUNK, 2 * D)))
        n_ab = cute.size(coord_dw)
        quads = D // 4
        n_wc = _slots(CHUNK * quads)  # dW_C: 4 consecutive states per thread and slot
        # The CTA's weight gradients, held in registers over all its tiles and written to its
        # partials row once at the end: per SH2 chunk the [dW_A|dW_B] MMA accumulators, dW_C's
        # (TF32: the dW_C half's MMA accumulators; fp32: 4 states a slot) and dw's (one column
        # a thread, threads < CHUNK). Lists over the chunks: the chunk loop is unrolled, so each
        # is indexed at trace time (a run-time index would put them in local memory).
        acc_ab = []
        for kc in cutlass.range_constexpr(n_chunks):
            acc_ab.append(tiled.make_fragment_C(tiled.partition_shape_C((CHUNK, 2 * D))))
            acc_ab[kc].fill(0.0)
        acc_w = cute.make_rmem_tensor(cute.make_layout((n_chunks,)), Float32)
        acc_w.fill(0.0)
        acc_wc = []
        if const_expr(self.tf32):
            # dh and dW_C on the tensor cores, one half of the CTA (4 warps) each (dh_and_dwc_mma)
            half_tid = tid % (THREADS // 2)
            tiled_dh = warp_mma(1, 4)
            tiled_wc = warp_mma(4, 1)
            thr_dh = tiled_dh.get_slice(half_tid)
            thr_wc = tiled_wc.get_slice(half_tid)
            coord_wc = thr_wc.partition_C(cute.make_identity_tensor((CHUNK, D)))
            for kc in cutlass.range_constexpr(n_chunks):
                acc_wc.append(tiled_wc.make_fragment_C(tiled_wc.partition_shape_C((CHUNK, D))))
                acc_wc[kc].fill(0.0)
            # h's and dc's rows past the tile's samples: dW_C's K padding, zero for good
            if const_expr(self.rows_resident):
                self.zero_rows(sHall, Bt, self.h_rows - Bt, SH2)
            else:
                self.zero_rows(sH, Bt, self.h_rows - Bt, CHUNK)
            self.zero_rows(sDC, Bt, self.dc_rows - Bt, D)
        else:
            tiled_dh = thr_dh = tiled_wc = thr_wc = None
            for kc in cutlass.range_constexpr(n_chunks):
                acc_wc.append(cute.make_rmem_tensor(cute.make_layout((n_wc, 4)), Float32))
                acc_wc[kc].fill(0.0)
        dsigma = Float32(0.0)  # fp32's running sum (its register allocation is left as it was)
        if const_expr(self.tf32):
            sDsigma[tid] = dsigma

        for i in cutlass.range_constexpr(_slots(SH2 // 4)):  # w stays in shared memory throughout
            if tid + i * THREADS < SH2 // 4:
                cute.autovec_copy(cute.local_tile(mw[0, None], (4,), (tid + i * THREADS,)),
                                  cute.local_tile(sWv[0, None], (4,), (tid + i * THREADS,)))

        if const_expr(self.resident):
            self.stage_weights(mWA, mWB, mWC, sWt, sW3all, sWCall, sWCr)

        # The first tile's whole h_hist tile in flight at once, straight into shared memory,
        # one cp.async group per chunk so that chunk 0 is multiplied while the rest arrive.
        # Each later tile's is issued chunk by chunk during the previous tile's phase 3, as
        # soon as that chunk's shared memory is free, so the tile does not start by waiting.
        num_tiles = (batch + Bt - 1) // Bt
        first_samples = cutlass.min(batch - cta * Bt, Bt)
        for kc in cutlass.range(n_chunks, unroll=1):
            if const_expr(self.rows_resident):  # h and dout in the chunk's group
                self.copy_rows_async(mH, cta * Bt, first_samples, kc * CHUNK,
                                     cute.local_tile(sHall, (Bt, CHUNK), (0, kc)), Bt, CHUNK, False)
                self.copy_rows_async(mDout, cta * Bt, first_samples, kc * CHUNK,
                                     cute.local_tile(sDoutAll, (Bt, CHUNK), (0, kc)), Bt, CHUNK, False)
            self.copy_rows_async(mHist, cta * Bt * K, first_samples * K, kc * CHUNK,
                                 self.hist_chunk(sHist, kc), TILE_ROWS, CHUNK)
        for tile in cutlass.range(cta, num_tiles, num_ctas, unroll=1):
            b0 = tile * Bt
            n_samples = cutlass.min(batch - b0, Bt)
            row0 = b0 * K
            next_b0 = b0 + num_ctas * Bt
            next_samples = cutlass.min(batch - next_b0, Bt)  # <= 0: this is the CTA's last tile

            self.forward_products(tid, b0, n_samples, mWA, mWB, mWC, mH, mDout, sHist, sWt, sW1, sWC, sWCall, sH,
                                  sDout, sHall, sDoutAll, sWv, sDC, sAU, rW, rH, rWC, rDout, tiled_au, thr_au,
                                  mma_group, tCrA, tCrB, c_acc, dctx_acc)
            dsigma = self.scans(tid, sigma, dsigma, sAU, sDC, sCtx, sDsigma, sHall, xs, dctx_acc)
            self.gradient_products(tid, b0, n_samples, row0, next_b0, next_samples, mWA, mWB, mWC, mH, mDout, mHist,
                                   mDHist, mDH, sHist, sW3, sW3all, sWC, sWCr, sWCt, sH, sDout, sHall, sDoutAll,
                                   sAUk, sAU, sAUt, sDC, sCtx, rW, rH, rWC, rDout, tiled, thr, tiled_dh, thr_dh,
                                   tiled_wc, thr_wc, acc_ab, acc_wc, acc_w)

        # Every read of the inputs is done: column_sum, launched as this kernel's programmatic
        # dependent, may start its launch now (its CTAs wait for this grid's end to read).
        cute.arch.griddepcontrol_launch_dependents()
        # The CTA's weight gradients, once: its row of the partials
        for kc in cutlass.range_constexpr(n_chunks):
            col0 = kc * CHUNK
            for i in cutlass.range_constexpr(n_ab):
                mP[cta, self.ab_entry(coord_dw, col0, i)] = acc_ab[kc][i]
            if const_expr(self.tf32):
                if tid >= THREADS // 2:  # the dW_C half
                    for i in cutlass.range_constexpr(0, cute.size(acc_wc[kc]), 2):
                        store_pair(mP[cta, None], self.wc_entry(coord_wc, col0, i), acc_wc[kc][i],
                                   acc_wc[kc][i + 1])
            else:
                for i in cutlass.range_constexpr(n_wc):
                    if tid + i * THREADS < CHUNK * quads:
                        cute.autovec_copy(acc_wc[kc][i, None],
                                          cute.local_tile(mP[cta, None], (4,), (self.wc_vector(col0, tid, i),)))
            if tid < CHUNK:
                mP[cta, 3 * SH2 * D + col0 + tid] = acc_w[kc]

        # dsigma: this CTA's sum, reduced in a fixed order
        if const_expr(self.tf32):
            dsigma = sDsigma[tid]

        def store_dsigma(total):
            mP[cta, self.L - 1] = total
            for pad in cutlass.range_constexpr(self.L, self.width):  # summed too: keep them zero
                mP[cta, pad] = Float32(0.0)

        store_cta_sum(dsigma, sRed, tid, store_dsigma)
