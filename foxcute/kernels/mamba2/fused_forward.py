"""The fused Mamba2 forward: one persistent kernel, out = h + ctx * w (see FusedForward)."""

from __future__ import annotations

import operator

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from .. import _wgmma
from .._mma import warp_mma
from ._sigmoid import _sigmoid
from ._tiles import (CHUNK, SMEM_PER_SM, THREADS, TILE_ROWS, _mma_smem, _pair_pitch, _slots, _StateProduct,
                     _store_accumulators, _TileCopies, _w_pitch)


class FusedForward(_TileCopies):
    """out = h + ctx * w, with a|u, c, the scan and ctx computed per 64-row tile.

    Persistent, two CTAs an SM (<= 128 registers a thread): each CTA walks tiles cta, cta +
    num_ctas, ... and SH2 in CHUNK-column steps. Where two CTAs' shared memory allows (the
    defaults), W_A|W_B and W_C are loaded into shared memory once per CTA instead of once per
    tile (per tile they would cost 3/4 of the h_hist tile's traffic in L2 reads). The next
    chunk is the only one in flight: its h_hist and h rows (and, unless resident, its weights)
    are held in registers (16 a thread at the defaults), issued right after the stores that
    free them, so they fly through the chunk's barrier and products; a tile's last chunk
    fetches the next tile's first, in flight through the scan and the output stores.

    TF32 a|u: the last warpgroup issues 8 m64n(2D)k8 wgmmas per chunk (A = the h_hist chunk,
    B = [W_A|W_B]^T, both K-major and 128B-swizzled, rounded as they are stored): no fragment
    loads through the LSU, whose shared-memory pipe bounds this kernel. c = h @ W_C is FFMA
    (_StateProduct, W_C at its conflict-free pitch where that stays resident), then one
    thread per (sample, state) pair scans from the a|u tile in shared memory.

    Shared-memory bank conflicts left at the defaults (a bank model of a warp's word
    addresses): a|u's accumulator stores and the scan's a|u reads at pitch 2D + 4, 2-way each,
    and W_C's staging at a CTA's start.

    Measured: 29.3 us graph-replayed at the defaults, 1.46x its floor (run 20261203T162501Z:
    papermill_runs/20261203T162501Z_nvidia-h200_726b8c4c/summary.md).
    History: docs/notes/mamba2-forward.md."""

    def __init__(self, K: int, SH2: int, D: int, precision: str):
        self.K, self.SH2, self.D = K, SH2, D
        self.tf32 = precision == "tf32"
        self.samples = TILE_ROWS // K  # Bt: whole samples per tile
        self.pairs = _slots(self.samples * D)  # (sample, state) pairs per thread
        self.c_product = _StateProduct(self.samples, D)
        small = 4 * (self.samples * (CHUNK + 4 + D) + TILE_ROWS * (2 * D + 4))  # sH, sC, sAU
        if self.tf32:
            # wgmma operands, K-major and 128B-swizzled: the h_hist chunk, [W_A|W_B]^T
            tiles = _wgmma.sw128_bytes(TILE_ROWS, CHUNK) + small
            resident_w = _wgmma.sw128_bytes(2 * D, SH2)
        else:
            self.a_pitch = _pair_pitch(CHUNK, False)
            self.w_pitch = _w_pitch(D)
            tiles = 4 * TILE_ROWS * self.a_pitch + small
            resident_w = 4 * SH2 * self.w_pitch

        def resident(wc_pitch: int) -> bool:
            return 2 * (tiles + resident_w + 4 * SH2 * wc_pitch + 256) <= SMEM_PER_SM

        # W_C at the c product's conflict-free pitch, unless only pitch D keeps it resident
        self.wc_pitch = self.c_product.w_pitch
        if not resident(self.wc_pitch) and resident(D):
            self.wc_pitch = D
        self.resident_weights = resident(self.wc_pitch)

    def ctas_per_sm(self) -> int:
        """Persistent CTAs per SM the grid is sized for (<= 128 registers, < 113 KB at the defaults)."""
        return 2

    @cute.jit
    def __call__(self, p_hist: cute.Pointer, p_h: cute.Pointer, p_wa: cute.Pointer,
                 p_wb: cute.Pointer, p_wc: cute.Pointer, p_w: cute.Pointer, p_out: cute.Pointer,
                 sigma: Float32, batch: Int32, num_ctas: Int32, stream: cuda.CUstream):
        K, SH2, D = self.K, self.SH2, self.D
        mHist = cute.make_tensor(p_hist, cute.make_layout((batch * K, SH2), stride=(SH2, 1)))
        mH = cute.make_tensor(p_h, cute.make_layout((batch, SH2), stride=(SH2, 1)))
        mWA = cute.make_tensor(p_wa, cute.make_layout((SH2, D), stride=(D, 1)))
        mWB = cute.make_tensor(p_wb, cute.make_layout((SH2, D), stride=(D, 1)))
        mWC = cute.make_tensor(p_wc, cute.make_layout((SH2, D), stride=(D, 1)))
        mw = cute.make_tensor(p_w, cute.make_layout((1, SH2), stride=(SH2, 1)))
        mOut = cute.make_tensor(p_out, cute.make_layout((batch, SH2), stride=(SH2, 1)))
        # TF32: ptxas took ~125 registers at the defaults (225 at D = 32) unless told the
        # grid's 2 CTAs per SM (then <= 128; with the carveout, as the backward: the DSL asks
        # the device for it otherwise). fp32 is launched without them.
        bounds = {}
        if const_expr(self.tf32):
            bounds = dict(min_blocks_per_mp=self.ctas_per_sm(), preferred_smem_carveout=100)
        self.kernel(mHist, mH, mWA, mWB, mWC, mw, mOut, sigma, batch, num_ctas).launch(
            grid=(num_ctas, 1, 1), block=(THREADS, 1, 1), stream=stream, **bounds)

    @cute.jit
    def fetch_chunk(self, mHist: cute.Tensor, mH: cute.Tensor, mWA: cute.Tensor, mWB: cute.Tensor,
                    mWC: cute.Tensor, b0: Int32, n_samples: Int32, col0: Int32, rHist: cute.Tensor,
                    rH: cute.Tensor, rW: cute.Tensor, rWC: cute.Tensor):
        """Registers <- SH2 columns col0 : col0 + CHUNK of the h_hist and h rows of samples
        b0 : b0 + n_samples, and of W_A|W_B and W_C unless they are resident."""
        self.fetch_rows(mHist, b0 * self.K, n_samples * self.K, col0, rHist, TILE_ROWS, CHUNK)
        self.fetch_rows(mH, b0, n_samples, col0, rH, self.samples, CHUNK)
        if const_expr(not self.resident_weights):
            self.fetch_weights(mWA, mWB, col0, rW)
            self.fetch_rows(mWC, col0, CHUNK, 0, rWC, CHUNK, self.D)

    @cute.jit
    def fetch_weights(self, mWA: cute.Tensor, mWB: cute.Tensor, col0: Int32, regs: cute.Tensor):
        """regs <- [W_A | W_B][col0 : col0 + CHUNK, :] for sWt (TF32: store_weights_t) or sW."""
        if const_expr(self.tf32):
            self.fetch_weights_t(mWA, mWB, col0, regs)
        else:
            self.fetch_weights_ab(mWA, mWB, col0, regs, self.D)

    @cute.kernel
    def kernel(self, mHist: cute.Tensor, mH: cute.Tensor, mWA: cute.Tensor, mWB: cute.Tensor,
               mWC: cute.Tensor, mw: cute.Tensor, mOut: cute.Tensor, sigma: Float32, batch: Int32,
               num_ctas: Int32):
        K, SH2, D, Bt = self.K, self.SH2, self.D, self.samples
        n_chunks = SH2 // CHUNK
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        w_rows = SH2 if self.resident_weights else CHUNK
        if const_expr(self.tf32):
            # the wgmma operands (see _wgmma), K-major: the h_hist chunk, and [W_A|W_B]^T as
            # (2D, CHUNK, chunks held) so that chunk kc is [None, None, kc]
            sA = _wgmma.allocate_sw128(smem, (TILE_ROWS, CHUNK))
            sWt = _wgmma.allocate_sw128(smem, (2 * D, CHUNK, w_rows // CHUNK))
        else:
            # row pitches: conflict-free MMA reads of the h_hist chunk (K-contiguous) and of W (K = rows)
            sA = smem.allocate_tensor(Float32, cute.make_layout((TILE_ROWS, CHUNK), stride=(self.a_pitch, 1)), 16)
        sH = smem.allocate_tensor(Float32, cute.make_layout((Bt, CHUNK), stride=(CHUNK + 4, 1)), 16)
        sAU = smem.allocate_tensor(Float32, cute.make_layout((TILE_ROWS, 2 * D), stride=(2 * D + 4, 1)), 16)
        sCtx = smem.allocate_tensor(Float32, cute.make_layout((Bt,)), 16)
        sC = smem.allocate_tensor(Float32, cute.make_layout((Bt, D), stride=(D, 1)), 16)
        if const_expr(not self.tf32):
            sW = smem.allocate_tensor(Float32, cute.make_layout((w_rows, 2 * D), stride=(self.w_pitch, 1)), 16)
        sWC = smem.allocate_tensor(Float32, cute.make_layout((w_rows, D), stride=(self.wc_pitch, 1)), 16)

        rHist = cute.make_rmem_tensor(cute.make_layout((4, _slots(TILE_ROWS * CHUNK // 4))), Float32)
        rW = cute.make_rmem_tensor(cute.make_layout((4, _slots(CHUNK * 2 * D // 4))), Float32)
        rH = cute.make_rmem_tensor(cute.make_layout((4, _slots(Bt * CHUNK // 4))), Float32)
        rWC = cute.make_rmem_tensor(cute.make_layout((4, _slots(CHUNK * D // 4))), Float32)

        c_acc = self.c_product.accumulators()
        if const_expr(self.tf32):
            # a|u = one 64 x 2D wgmma tile (M = TILE_ROWS), issued by the last warpgroup: the
            # c product's tasks fill the low threads first, so its warps have the least else to do
            tiled = _wgmma.tiled_mma_tf32(2 * D)
            mma_group = tid // _wgmma.WARPGROUP == THREADS // _wgmma.WARPGROUP - 1
            thr = tiled.get_slice(tid % _wgmma.WARPGROUP)
            tCrA = tiled.make_fragment_A(thr.partition_A(sA))  # (MMA, 1, CHUNK / 8) descriptors
            tCrB = tiled.make_fragment_B(thr.partition_B(sWt))  # (MMA, 1, CHUNK / 8, chunks held)
        else:
            tiled = warp_mma(2, 4, tf32=False)
            thr = tiled.get_slice(tid)

        if const_expr(self.resident_weights):
            for kc in cutlass.range_constexpr(n_chunks):
                self.fetch_weights(mWA, mWB, kc * CHUNK, rW)
                self.fetch_rows(mWC, kc * CHUNK, CHUNK, 0, rWC, CHUNK, D)
                if const_expr(self.tf32):
                    self.store_weights_t(rW, sWt[None, None, kc])
                else:
                    self.store_rows(rW, cute.local_tile(sW, (CHUNK, 2 * D), (kc, 0)), CHUNK, 2 * D)
                self.store_rows(rWC, cute.local_tile(sWC, (CHUNK, D), (kc, 0)), CHUNK, D)

        # The first tile's first chunk; each later tile's is fetched during the previous
        # tile's last chunk, so it is in flight through the scan and the output stores
        # instead of being waited for at the tile's start.
        num_tiles = (batch + Bt - 1) // Bt
        self.fetch_chunk(mHist, mH, mWA, mWB, mWC, cta * Bt, cutlass.min(batch - cta * Bt, Bt), 0,
                         rHist, rH, rW, rWC)
        for tile in cutlass.range(cta, num_tiles, num_ctas, unroll=1):
            b0 = tile * Bt
            n_samples = cutlass.min(batch - b0, Bt)
            next_b0 = b0 + num_ctas * Bt
            next_samples = cutlass.min(batch - next_b0, Bt)  # <= 0: this is the CTA's last tile
            acc = tiled.make_fragment_C(tiled.partition_shape_C((TILE_ROWS, 2 * D)))  # a|u
            acc.fill(0.0)
            c_acc.fill(0.0)
            for kc in cutlass.range(n_chunks, unroll=1):
                self.store_rows(rHist, sA, TILE_ROWS, CHUNK, self.tf32)
                self.store_rows(rH, sH, Bt, CHUNK)
                if const_expr(not self.resident_weights):
                    if const_expr(self.tf32):
                        self.store_weights_t(rW, sWt[None, None, 0])
                    else:
                        self.store_rows(rW, sW, CHUNK, 2 * D)
                    self.store_rows(rWC, sWC, CHUNK, D)
                if const_expr(self.tf32):
                    _wgmma.publish()  # the stores above -> the tensor cores' (async proxy) reads
                # The next chunk's loads, issued as soon as the stores above freed their
                # registers: they fly through this barrier's wait too, not only through the
                # chunk's products (docs/notes/mamba2-forward.md, 2026-11-30)
                if kc + 1 < n_chunks:
                    self.fetch_chunk(mHist, mH, mWA, mWB, mWC, b0, n_samples, (kc + 1) * CHUNK,
                                     rHist, rH, rW, rWC)
                elif next_samples > 0:
                    self.fetch_chunk(mHist, mH, mWA, mWB, mWC, next_b0, next_samples, 0, rHist, rH, rW, rWC)
                cute.arch.barrier()
                w_chunk = kc if const_expr(self.resident_weights) else 0
                if const_expr(self.tf32):
                    # the chunk's a|u as one wgmma group: the tensor cores read sA and sWt while
                    # c accumulates; waited for before the closing barrier, after which sA is
                    # overwritten
                    if mma_group:
                        _wgmma.mma_group(tiled, acc, tCrA, tCrB, b_at=(w_chunk,))
                sWCk = cute.local_tile(sWC, (CHUNK, D), (w_chunk, 0))
                if const_expr(not self.tf32):
                    sWk = cute.local_tile(sW, (CHUNK, 2 * D), (w_chunk, 0))
                    sWtk = cute.make_tensor(sWk.iterator, cute.make_layout((2 * D, CHUNK), stride=(1, self.w_pitch)))
                    _mma_smem(tiled, thr, acc, sA, sWtk, False)
                self.c_product.accumulate(c_acc, sH, sWCk, tid)
                if const_expr(self.tf32):
                    # every warp (a no-op where nothing is in flight): under `if mma_group`
                    # ptxas could not see the accumulators settled and injected a wait of its own
                    warpgroup.wait_group(0)
                cute.arch.barrier()

            self.c_product.store(c_acc, sC, tid)
            if const_expr(self.tf32):
                if mma_group:
                    _store_accumulators(thr, acc, sAU)
            else:
                _store_accumulators(thr, acc, sAU)
            cute.arch.barrier()

            for p in cutlass.range_constexpr(self.pairs):
                pair = tid + p * THREADS
                b = pair // D
                s = pair - b * D
                bs = cutlass.min(b, Bt - 1)  # lanes past the tile scan a real sample; c = 0 zeroes them
                x = Float32(0.0)
                for t in cutlass.range_constexpr(K):
                    g = sigma * _sigmoid(sAU[bs * K + t, s])
                    x = g * x + sAU[bs * K + t, D + s]
                # every lane of the warp takes part in the shuffles
                ctx = cute.arch.warp_reduction(sC[bs, s] * x, operator.add, threads_in_group=D)
                ctx = ctx * Float32(1.0 / D)
                if pair < Bt * D and s == 0:
                    sCtx[b] = ctx
            cute.arch.barrier()

            per_row = SH2 // 4
            for i in cutlass.range_constexpr(_slots(Bt * per_row)):
                idx = tid + i * THREADS
                b = idx // per_row
                q = idx - b * per_row
                if b < n_samples:
                    hv = cute.make_rmem_tensor(cute.make_layout((4,)), Float32)
                    wv = cute.make_rmem_tensor(cute.make_layout((4,)), Float32)
                    cute.autovec_copy(cute.local_tile(mH[b0 + b, None], (4,), (q,)), hv)
                    cute.autovec_copy(cute.local_tile(mw[0, None], (4,), (q,)), wv)
                    ctx = sCtx[b]
                    for e in cutlass.range_constexpr(4):
                        hv[e] = hv[e] + ctx * wv[e]
                    cute.autovec_copy(hv, cute.local_tile(mOut[b0 + b, None], (4,), (q,)))
            # sCtx and sAU are rewritten by the next tile only after its chunk-loop barriers
