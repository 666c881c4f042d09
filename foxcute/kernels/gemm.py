"""Skinny float32 GEMMs for the trainer's layers: M = batch (up to 65536 and more) rows,
N and K up to 512, with the epilogues those layers need fused in.

    matmul(A [M, K], B_t [N, K])  -> epilogue(A @ B_t^T)       (B_t is a torch Linear weight)
    weight_grad(dY [M, N], X [M, K]) -> (dW = dY^T X [N, K], db = sum_m dY [N])
    kmajor_weight_grads_into: dW = A_t B_t^T or dY^T X on wgmma, B (and A) stored K-major

Why it is built this way.
- Every shape here is memory-bound (e.g. [65536 x 256] @ [256 x 32]: 64 MB read for 1 GFLOP),
  so what counts is reading A once with 128-bit coalesced loads and keeping the small
  operand in shared memory. The tensor core path is the warp-level mma.sync m16n8k8 TF32
  (precision "tf32", the default): TF32 wgmma (kernels/_wgmma.py, the Mamba2 kernels') takes
  its shared-memory operands K-major only, which a weight gradient of [batch, features]
  activations has not; where the producer writes one activation transposed, KMajorWeightGrad
  runs the product on wgmma (curiosity's TF32 weight gradients). "fp32" runs the same tiles
  with FFMA on the same accumulator layout, so epilogues are shared.
- Operands stream global -> shared memory with cp.async (16-byte copies when the row length
  is a multiple of 4, else 4-byte ones, chosen statically) in K-chunks of 32 through a
  3-stage buffer (matmul: 4), so two (three) chunks are in flight while one is multiplied
  (`mma_chunks`). Rows are padded so the MMA fragment reads are free of bank conflicts.
  TF32 rounding (cvt.rna) happens on the fragment load, so shared memory keeps the exact
  float32 values that the bias-gradient column sums read.
- matmul: one CTA owns a block of rows and walks all N-tiles itself, so a row-wise
  epilogue (the dot with a second layer's single output) sees every column of its rows
  without a second pass; for N <= the tile width A is read exactly once.
- weight_grad: the reduction over M is split over CTAs; each writes its partial tile and
  the last CTA to finish a tile (integer ticket) adds the tile's partials in CTA order:
  deterministic (no float atomics, bit-identical from run to run) in one launch.

At the seed Mamba2's shapes (run 20261203T162501Z, H200, graph-replayed): the projection
[65536 x 256] @ [256 x 32] 24.1 us, the read-back [65536 x 32] @ [32 x 256] 33.6 us, the
weight gradient h_hist^T [da|du] (M = 65536, N = 256, K = 32) 34.6 us (benchmarks.GEMM_CASES).
History: docs/notes/gemm.md.
"""

from __future__ import annotations

import functools
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cutlass.cute.nvgpu import warpgroup

from .. import _arrays
from .._layer import KernelContract
from . import _cute, _wgmma
from ._mma import (CHUNK, MODE, STAGES, THREADS, Operand, columns_view, load_pair, mma_chunks, staging_by_columns,
                   staging_by_rows, store_pair, tile_mma, warp_mma)
from ._tf32 import tf32_operand

EPILOGUES = ("none", "bias_relu", "sigmoid", "row_dot", "residual")
PRECISIONS = ("tf32", "fp32")
# Not a layer: the seed Mamba2 design's products, also timed alone (lab.benchmarks.GEMM_CASES)
CONTRACT = KernelContract(passes=("matmul", "weight_grad"), options={"precision": PRECISIONS})
MAX_DIM = 512  # N and K: the widest layer of the trainer; tiles and grids are sized for it
MAX_ROWS = 2**31 // MAX_DIM  # M: layouts index with 32-bit integers
# SkinnyMatmul's: three chunks in flight (the fastest of 3, 4 and 6 stages on the seed's
# projection; 6 leaves fewer CTAs an SM: docs/notes/gemm.md)
MATMUL_STAGES = 4


@cute.jit
def add_bias_column(total: cute.Tensor, sDyT: cute.Tensor, kt: Int32, col: Int32, buf: Int32):
    """db: in the CTAs of the first K-tile, thread col < bn adds column col of the staged dY
    chunk `buf` (sDyT: [bn, CHUNK, STAGES]) to total[0], in row order."""
    if kt == 0:
        if col < cute.size(sDyT, mode=[0]):
            for i in cutlass.range_constexpr(CHUNK):
                total[0] = total[0] + sDyT[col, i, buf]


def _vec(n: int) -> int:
    return 4 if n % 4 == 0 else 1


class SkinnyMatmul:
    """out = epilogue(A @ B_t^T), or epilogue(A @ B) for B [K, N] (b_vec). One CTA per `bm`
    rows walks every `bn`-column tile.

    epilogue: "none" out = C; "bias_relu" out = relu(C + bias); "sigmoid" out = sigmoid(C + bias);
    "row_dot" out[m] = sum_n relu(C[m, n] + bias[n]) * v[n] + c0 (a second layer with one
    output, reduced in registers and across the 4 lanes sharing a row: out is [M]);
    "residual" out = C + R for R [M, N] (the seed Mamba2 backward's dh = dout + dc W_C^T: the
    sum in the store, not a second pass over both [M, N] arrays).

    With `pairs` (stores_pairs: N even, an output of N columns), each thread's accumulators
    (g, 2t), (g, 2t + 1) are stored as one 64-bit pair (store_pair).

    The seed's projection [65536 x 256] @ [256 x 32] takes 24.1 us, its read-back [65536 x 32]
    @ [32 x 256] 33.6 us (run 20261203T162501Z, graph-replayed). History: docs/notes/gemm.md."""

    def __init__(self, epilogue: str, precision: str, bn: int, vec_k: int, pairs: bool = False,
                 bm: int | None = None, b_vec: int = 0):
        """b_vec: 0, B given as B_t [N, K]; else B [K, N] (the x @ W form, no transposed copy
        needed), its rows read in b_vec-float vectors. bm: rows a CTA (default tile_m's)."""
        self.epilogue = epilogue
        self.mode = MODE[precision]
        self.bn = bn
        self.bm = bm or tile_m(bn, epilogue)
        self.b_vec = b_vec
        self.vec = vec_k
        assert not (pairs and epilogue == "row_dot"), "row_dot's output is [M]: no pairs to store"
        self.pairs = pairs

    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, b_ptr: cute.Pointer, out_ptr: cute.Pointer,
                 bias_ptr: cute.Pointer, aux_ptr: cute.Pointer, c0: Float32,
                 m: Int32, n: Int32, k_vecs: Int32, stream: cuda.CUstream):
        """aux: row_dot's v [N], or residual's R [M, N]; any valid address for the others."""
        k = cute.assume(k_vecs * self.vec, divby=self.vec)
        mA = cute.make_tensor(a_ptr, cute.make_layout((m, k_vecs, self.vec), stride=(k, self.vec, 1)))
        if cutlass.const_expr(self.b_vec):
            n_b = cute.assume(n, divby=self.b_vec)
            mB = cute.make_tensor(b_ptr, cute.make_layout((k, n_b // self.b_vec, self.b_vec),
                                                          stride=(n_b, self.b_vec, 1)))
        else:
            mB = cute.make_tensor(b_ptr, cute.make_layout((n, k_vecs, self.vec), stride=(k, self.vec, 1)))
        if cutlass.const_expr(self.epilogue == "row_dot"):
            mOut = cute.make_tensor(out_ptr, cute.make_layout((m, 1), stride=(1, 1)))
        elif cutlass.const_expr(self.pairs):  # rows start 8-byte aligned: 64-bit pair stores
            mOut = cute.make_tensor(out_ptr, cute.make_layout((m, n), stride=(cute.assume(n, divby=2), 1)))
        else:
            mOut = cute.make_tensor(out_ptr, cute.make_layout((m, n), stride=(n, 1)))
        mBias = cute.make_tensor(bias_ptr, cute.make_layout(n))
        if cutlass.const_expr(self.epilogue == "residual"):
            mAux = cute.make_tensor(aux_ptr, mOut.layout)  # R as laid out as out
        else:
            mAux = cute.make_tensor(aux_ptr, cute.make_layout(n))
        self.kernel(mA, mB, mOut, mBias, mAux, c0, m, n, k_vecs).launch(
            grid=[(m + self.bm - 1) // self.bm, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mOut: cute.Tensor, mBias: cute.Tensor,
               mAux: cute.Tensor, c0: Float32, m: Int32, n: Int32, k_vecs: Int32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        vecs = CHUNK // self.vec
        smem = cutlass.memory.SmemAllocator()
        sA3, sA = staging_by_rows(smem, self.bm, self.vec, MATMUL_STAGES)
        if cutlass.const_expr(self.b_vec):
            sB3, sB = staging_by_columns(smem, self.bn, self.b_vec, MATMUL_STAGES)
        else:
            sB3, sB = staging_by_rows(smem, self.bn, self.vec, MATMUL_STAGES)

        tiled_mma = warp_mma(4, 1)
        thr = tiled_mma.get_slice(tid)
        acc = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((self.bm, self.bn)))
        cC = thr.partition_C(cute.make_identity_tensor((self.bm, self.bn)))
        num_mi = cute.size(acc, mode=[1])
        num_ni = cute.size(acc, mode=[2])
        row0 = cta * self.bm
        row_sum = cute.make_rmem_tensor((2, num_mi), Float32)
        row_sum.fill(0.0)

        # residual: R of the thread's tile entries, all loaded before the first store. Loaded
        # next to each store, every load would wait for a DRAM round trip (the compiler may
        # not move a load of R above a store to out; docs/notes/gemm.md).
        rR = None
        if cutlass.const_expr(self.epilogue == "residual"):
            rR = cute.make_rmem_tensor(acc.layout, Float32)
        for nt in cutlass.range((n + self.bn - 1) // self.bn, unroll=1):
            col0 = nt * self.bn
            if cutlass.const_expr(self.epilogue == "residual"):
                self.load_residual(mAux, rR, cC, row0, col0, m, n)
            acc.fill(0.0)
            if cutlass.const_expr(self.b_vec):  # chunk kc: rows kc * CHUNK... of B, the tile's columns
                b = Operand(mB, k_vecs * self.vec, 0, col0 // self.b_vec, cute.size(mB, mode=[1]), CHUNK,
                            self.bn // self.b_vec, self.b_vec, True, sB3, sB)
            else:
                b = Operand(mB, n, col0, 0, k_vecs, self.bn, vecs, self.vec, False, sB3, sB)
            mma_chunks(tiled_mma, tid, acc, self.mode, (k_vecs + vecs - 1) // vecs,
                       Operand(mA, m, row0, 0, k_vecs, self.bm, vecs, self.vec, False, sA3, sA), b)
            # Epilogue on the registers.
            for mi in cutlass.range_constexpr(num_mi):
                for v1 in cutlass.range_constexpr(2):
                    row = row0 + cC[(0, v1), mi, 0][0]
                    for ni in cutlass.range_constexpr(num_ni):
                        if cutlass.const_expr(self.pairs):
                            col = col0 + cC[(0, v1), mi, ni][1]  # even, and N is: col + 1 < N too
                            if col < n and row < m:
                                lo = self.output(acc[(0, v1), mi, ni], mBias, col)
                                hi = self.output(acc[(1, v1), mi, ni], mBias, col + 1)
                                if cutlass.const_expr(self.epilogue == "residual"):
                                    lo, hi = lo + rR[(0, v1), mi, ni], hi + rR[(1, v1), mi, ni]
                                store_pair(mOut[row, None], col, lo, hi)
                        else:
                            for v0 in cutlass.range_constexpr(2):
                                col = col0 + cC[(v0, v1), mi, ni][1]
                                c = acc[(v0, v1), mi, ni]
                                if col < n:
                                    if cutlass.const_expr(self.epilogue == "row_dot"):
                                        h = c + mBias[col]
                                        h = h if h > Float32(0.0) else Float32(0.0)
                                        row_sum[v1, mi] = row_sum[v1, mi] + h * mAux[col]
                                    elif row < m:
                                        value = self.output(c, mBias, col)
                                        if cutlass.const_expr(self.epilogue == "residual"):
                                            value = value + rR[(v0, v1), mi, ni]
                                        mOut[row, col] = value
        if cutlass.const_expr(self.epilogue == "row_dot"):
            # The 4 lanes t = lane % 4 of a row hold interleaved column pairs: add them in a
            # fixed butterfly order.
            for mi in cutlass.range_constexpr(num_mi):
                for v1 in cutlass.range_constexpr(2):
                    s = row_sum[v1, mi]
                    s = s + cute.arch.shuffle_sync_bfly(s, offset=1)
                    s = s + cute.arch.shuffle_sync_bfly(s, offset=2)
                    row = row0 + cC[(0, v1), mi, 0][0]
                    if tid % 4 == 0 and row < m:
                        mOut[row, 0] = s + c0

    @cute.jit
    def load_residual(self, mR: cute.Tensor, rR: cute.Tensor, cC: cute.Tensor, row0: Int32, col0: Int32,
                      m: Int32, n: Int32):
        """rR <- R at the thread's accumulator entries of the tile at (row0, col0) (64-bit
        pairs where the output is stored as pairs); entries out of range are left unset."""
        for mi in cutlass.range_constexpr(cute.size(rR, mode=[1])):
            for v1 in cutlass.range_constexpr(2):
                row = row0 + cC[(0, v1), mi, 0][0]
                for ni in cutlass.range_constexpr(cute.size(rR, mode=[2])):
                    if cutlass.const_expr(self.pairs):
                        col = col0 + cC[(0, v1), mi, ni][1]
                        if col < n and row < m:
                            rR[(0, v1), mi, ni], rR[(1, v1), mi, ni] = load_pair(mR[row, None], col)
                    else:
                        for v0 in cutlass.range_constexpr(2):
                            col = col0 + cC[(v0, v1), mi, ni][1]
                            if col < n and row < m:
                                rR[(v0, v1), mi, ni] = mR[row, col]

    @cute.jit
    def output(self, c: Float32, mBias: cute.Tensor, col: Int32) -> Float32:
        """The stored value of accumulator c in column col (epilogues other than row_dot; the
        residual's R is added where it is loaded)."""
        out = c
        if cutlass.const_expr(self.epilogue == "bias_relu"):
            h = c + mBias[col]
            out = h if h > Float32(0.0) else Float32(0.0)
        elif cutlass.const_expr(self.epilogue == "sigmoid"):
            out = Float32(1.0) / (Float32(1.0) + cute.math.exp(-(c + mBias[col]), fastmath=False))
        return out


class WeightGrad:
    """dW = dY^T X ([N, K], row stride ldo) and db = column sums of dY ([N]), deterministic,
    for one or two independent problems over the same batch in one launch (curiosity's dW2
    and dW1 in fp32 mode run side by side: twice the CTAs in flight, one launch; TF32 runs
    them on KMajorWeightGrad).

    CTA (c, tile) reduces rows [c*rows_per_cta, (c+1)*rows_per_cta) of the batch into one
    [bn, bk] tile (nt, kt) of a problem's dW; CTAs with kt == 0 also sum dY's columns. In the
    MMA, dW's rows (N) are the M dimension and the batch is the reduction: A = dY^T and
    B = X^T, both read from [batch, feature] shared tiles through transposed views (row
    stride = 8 (mod 32) banks keeps those fragment reads conflict-free).

    Each CTA writes its partial tile to `work[c, tile]` and takes a ticket for its tile (an
    integer atomic, the only atomic); the CTA that draws the last ticket adds the tile's
    partials in CTA order c = 0, 1, ... and writes dW (and db). The order is fixed, so the
    result is bit-identical from run to run, and no second launch is needed (the pattern of
    kernels.column_sum; at these widths, 4096-column column_sum calls would be 8-16 launches).
    The finishing CTA resets the ticket for the next launch or graph replay.

    What bounds the main loop is the latency of each warp's fragment loads and MMAs: not DRAM
    or L2 throughput, nor the instruction count. More CTAs over the batch only lengthen the
    finishers' ordered sums; deeper staging is no faster. The seed's h_hist^T [da|du]
    (M = 65536, N = 256, K = 32) takes 34.6 us (run 20261203T162501Z, benchmarks.GEMM_CASES,
    graph-replayed). History: docs/notes/gemm.md."""

    bn = 64
    BK = (16, 32, 64)  # tile widths along K, the narrowest that covers the widest problem's K
    # Two groups of 4 warps: group g multiplies rows g*CHUNK/2 ... of every staged chunk into
    # its own accumulators, added group 0 + group 1 at the end (a fixed order). Twice the warps
    # an SM over the same tiles and partials: the main loop is bound by the latency of each
    # warp's fragment loads and MMAs, the finish by the number of partials.
    GROUPS = 2
    THREADS = GROUPS * THREADS

    def __init__(self, precision: str, problems: tuple, bk: int):
        """problems: one or two (vec_n, vec_k, with_bias, halves): the float4-ness of dY's and
        X's rows, whether db is wanted, and whether dW's column halves go to two [N, K/2]
        arrays (weight_grads_into). bk: the tile's width along K (one of BK, see tile_k)."""
        self.mode = MODE[precision]
        self.problems = problems
        self.bk = bk

    @classmethod
    def tile_k(cls, k: int) -> int:
        """The tile width along K for problems at most k wide: a tile wider than K stages
        zeros and multiplies them."""
        return next((bk for bk in cls.BK if k <= bk), cls.BK[-1])

    @cute.jit
    def __call__(self, dy0: cute.Pointer, x0: cute.Pointer, dw0: cute.Pointer, db0: cute.Pointer,
                 n_vecs0: Int32, k_vecs0: Int32, ldo0: Int32,
                 dy1: cute.Pointer, x1: cute.Pointer, dw1: cute.Pointer, db1: cute.Pointer,
                 n_vecs1: Int32, k_vecs1: Int32, ldo1: Int32,
                 work_ptr: cute.Pointer, ticket_ptr: cute.Pointer, m: Int32, rows_per_cta: Int32,
                 num_ctas: Int32, stream: cuda.CUstream):
        p0 = self.problem_tensors(0, dy0, x0, dw0, db0, n_vecs0, k_vecs0, ldo0, work_ptr, ticket_ptr,
                                  m, num_ctas)
        tiles = p0[-1]
        p1 = p0
        if cutlass.const_expr(len(self.problems) == 2):
            p1 = self.problem_tensors(1, dy1, x1, dw1, db1, n_vecs1, k_vecs1, ldo1, p0[-3], p0[-2],
                                      m, num_ctas)
            tiles = tiles + p1[-1]
        self.kernel(*p0[:-3], *p1[:-3], p0[-1], m, rows_per_cta, num_ctas).launch(
            grid=[num_ctas, tiles, 1], block=[self.THREADS, 1, 1], stream=stream)

    @cute.jit
    def problem_tensors(self, p: cutlass.Constexpr, dy_ptr, x_ptr, dw_ptr, db_ptr, n_vecs, k_vecs,
                        ldo, work_ptr, ticket_ptr, m, num_ctas):
        """The global tensors of problem p, and where the next problem's work and tickets start."""
        vec_n, vec_k, _, halves = self.problems[p]
        n = cute.assume(n_vecs * vec_n, divby=vec_n)
        k = cute.assume(k_vecs * vec_k, divby=vec_k)
        n_tiles = (n + self.bn - 1) // self.bn
        k_tiles = (k + self.bk - 1) // self.bk
        tiles = n_tiles * k_tiles
        tile_size = self.bn * self.bk
        mDy = cute.make_tensor(dy_ptr, cute.make_layout((m, n_vecs, vec_n), stride=(n, vec_n, 1)))
        mX = cute.make_tensor(x_ptr, cute.make_layout((m, k_vecs, vec_k), stride=(k, vec_k, 1)))
        if cutlass.const_expr(halves):  # [2, n, k/2]: column c of dW -> [c // (k/2), :, c % (k/2)]
            half = k // 2
            mDw = cute.make_tensor(dw_ptr, cute.make_layout((n, (half, 2)), stride=(half, (1, n * half))))
        else:
            mDw = cute.make_tensor(dw_ptr, cute.make_layout((n, k), stride=(ldo, 1)))
        mDb = cute.make_tensor(db_ptr, cute.make_layout(n))
        # work: [tiles][num_ctas][bn * bk] partial tiles (a tile's partials in consecutive rows,
        # as _cute.sum_rows_in_order reads them), then [num_ctas][n_tiles][bn] bias partials.
        mWork4 = cute.make_tensor(work_ptr, cute.make_layout(
            (tile_size // 4, 4, tiles, num_ctas), stride=(4, 1, num_ctas * tile_size, tile_size)))
        bias_ptr = work_ptr + num_ctas * tiles * tile_size
        mWorkB = cute.make_tensor(bias_ptr, cute.make_layout(
            (self.bn, n_tiles, num_ctas), stride=(1, self.bn, n_tiles * self.bn)))
        mTicket = cute.make_tensor(ticket_ptr, cute.make_layout(tiles))
        return (mDy, mX, mDw, mDb, mWork4, mWorkB, mTicket, k_tiles,
                bias_ptr + num_ctas * n_tiles * self.bn, ticket_ptr + tiles, tiles)

    @cute.kernel
    def kernel(self, mDy0: cute.Tensor, mX0: cute.Tensor, mDw0: cute.Tensor, mDb0: cute.Tensor,
               mWork0: cute.Tensor, mWorkB0: cute.Tensor, mTicket0: cute.Tensor, k_tiles0: Int32,
               mDy1: cute.Tensor, mX1: cute.Tensor, mDw1: cute.Tensor, mDb1: cute.Tensor,
               mWork1: cute.Tensor, mWorkB1: cute.Tensor, mTicket1: cute.Tensor, k_tiles1: Int32,
               tiles0: Int32, m: Int32, rows_per_cta: Int32, num_ctas: Int32):
        tid, _, _ = cute.arch.thread_idx()
        cta, tile, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        dy_raw = smem.allocate_tensor(Float32, cute.make_layout(STAGES * CHUNK * (self.bn + 8)), 16)
        x_raw = smem.allocate_tensor(Float32, cute.make_layout(STAGES * CHUNK * (self.bk + 8)), 16)
        sTicket = smem.allocate_tensor(Int32, cute.make_layout(1), 4)
        if cutlass.const_expr(len(self.problems) == 1):
            self.tile(0, mDy0, mX0, mDw0, mDb0, mWork0, mWorkB0, mTicket0, k_tiles0, tile,
                      cta, tid, m, rows_per_cta, num_ctas, dy_raw, x_raw, sTicket)
        else:
            if tile < tiles0:
                self.tile(0, mDy0, mX0, mDw0, mDb0, mWork0, mWorkB0, mTicket0, k_tiles0, tile,
                          cta, tid, m, rows_per_cta, num_ctas, dy_raw, x_raw, sTicket)
            else:
                self.tile(1, mDy1, mX1, mDw1, mDb1, mWork1, mWorkB1, mTicket1, k_tiles1, tile - tiles0,
                          cta, tid, m, rows_per_cta, num_ctas, dy_raw, x_raw, sTicket)

    @cute.jit
    def tile(self, p: cutlass.Constexpr, mDy: cute.Tensor, mX: cute.Tensor, mDw: cute.Tensor,
             mDb: cute.Tensor, mWork4: cute.Tensor, mWorkB: cute.Tensor, mTicket: cute.Tensor,
             k_tiles: Int32, tile: Int32, cta: Int32, tid: Int32, m: Int32, rows_per_cta: Int32,
             num_ctas: Int32, dy_raw: cute.Tensor, x_raw: cute.Tensor, sTicket: cute.Tensor):
        vec_n, vec_k, with_bias, halves = self.problems[p]
        nt = tile // k_tiles
        kt = tile % k_tiles
        n_vecs = cute.size(mDy, mode=[1])
        k_vecs = cute.size(mX, mode=[1])
        n = cute.size(mDw, mode=[0])
        k = cute.size(mDw, mode=[1])
        sDy3, sDyT = columns_view(dy_raw, self.bn, vec_n, CHUNK * (self.bn + 8))
        sX3, sXT = columns_view(x_raw, self.bk, vec_k, CHUNK * (self.bk + 8))

        tiled_mma = warp_mma(2, 2)  # 32 x 32 warp tiles: 256 B of fragment reads per MMA
        group = tid // THREADS
        thr = tiled_mma.get_slice(tid % THREADS)
        cC = thr.partition_C(cute.make_identity_tensor((self.bn, self.bk)))
        acc = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((self.bn, self.bk)))
        acc.fill(0.0)
        col_sum = cute.make_rmem_tensor((1,), Float32)
        col_sum.fill(0.0)
        add_bias_columns = None
        if cutlass.const_expr(with_bias):
            add_bias_columns = functools.partial(add_bias_column, col_sum, sDyT, kt, tid)

        first = cta * rows_per_cta
        last = cutlass.min(first + rows_per_cta, m)
        mma_chunks(tiled_mma, tid, acc, self.mode, (last - first + CHUNK - 1) // CHUNK,
                   Operand(mDy, last, first, nt * (self.bn // vec_n), n_vecs, CHUNK,
                           self.bn // vec_n, vec_n, True, sDy3, sDyT, self.THREADS),
                   Operand(mX, last, first, kt * (self.bk // vec_k), k_vecs, CHUNK,
                           self.bk // vec_k, vec_k, True, sX3, sXT, self.THREADS),
                   after_chunk=add_bias_columns,
                   multiply=functools.partial(self.group_rows_mma, tiled_mma, tid % THREADS, group))

        # This CTA's partial tile (all of it: entries past N or K hold zeros): group 1's
        # accumulators through shared memory (the staging buffer, free after mma_chunks' last
        # barrier), added to group 0's.
        sOther = cute.make_tensor(dy_raw.iterator, cute.make_layout(self.bn * self.bk))
        if group == 1:
            for i in cutlass.range_constexpr(cute.size(acc)):
                sOther[cC[i][0] * self.bk + cC[i][1]] = acc[i]
        cute.arch.sync_threads()
        if group == 0:
            for i in cutlass.range_constexpr(cute.size(acc)):
                e = cC[i][0] * self.bk + cC[i][1]
                mWork4[e // 4, e % 4, tile, cta] = acc[i] + sOther[e]
        if cutlass.const_expr(with_bias):
            if kt == 0 and tid < self.bn:
                mWorkB[tid, nt, cta] = col_sum[0]

        # Publish the partials, then take a ticket; the CTA that draws the last one finishes.
        if _cute.take_ticket(mTicket, tile, tid, sTicket) == num_ctas - 1:
            cute.arch.fence_acq_rel_gpu()
            # Thread t adds float4 vectors t, t + THREADS, ... of the tile over c = 0, 1, ...,
            # ~24 float4 loads in flight a step (the partials of several c at once: this sum is
            # the launch's tail, one L2 round trip a step)
            tile_vecs = self.bn * self.bk // 4
            vecs_per_thread = tile_vecs // self.THREADS
            tile_sum = cute.make_rmem_tensor((vecs_per_thread, 4), Float32)
            mRows = cute.make_tensor(mWork4.iterator, cute.make_layout(
                (cute.size(mWork4, mode=[2]) * num_ctas, tile_vecs, 4), stride=(tile_vecs * 4, 4, 1)))
            _cute.sum_rows_in_order(mRows, tile * num_ctas, num_ctas, tid, tile_sum, self.THREADS, tile_vecs,
                                    max(1, 24 // vecs_per_thread))
            if cutlass.const_expr(halves):
                half = k // 2  # mDw's column mode is (k/2, 2)
            for j in cutlass.range_constexpr(vecs_per_thread):
                e = (tid + j * self.THREADS) * 4
                row = nt * self.bn + e // self.bk
                for v in cutlass.range_constexpr(4):
                    col = kt * self.bk + e % self.bk + v
                    if row < n and col < k:
                        if cutlass.const_expr(halves):
                            # its coordinate (col mod k/2, col div k/2) by a compare: from the
                            # flat col, the runtime k/2 costs a division (17 div/rem in the
                            # PTX; docs/notes/gemm.md)
                            which = Int32(0)
                            col_in_half = col
                            if col >= half:
                                which = Int32(1)
                                col_in_half = col - half
                            mDw[row, (col_in_half, which)] = tile_sum[j, v]
                        else:
                            mDw[row, col] = tile_sum[j, v]
            if cutlass.const_expr(with_bias):
                if kt == 0 and tid < self.bn:
                    total = Float32(0.0)
                    for c in cutlass.range(num_ctas, unroll=4):
                        total = total + mWorkB[tid, nt, c]
                    if nt * self.bn + tid < n:
                        mDb[nt * self.bn + tid] = total
            if tid == 0:
                mTicket[tile] = Int32(0)


    @cute.jit
    def group_rows_mma(self, tiled_mma: cute.TiledMma, group_tid: Int32, group: Int32, sA: cute.Tensor,
                       sB: cute.Tensor, acc: cute.Tensor):
        """mma_chunks' chunk product: the thread's group multiplies its CHUNK / GROUPS batch rows
        of the staged chunk (sA [bn, CHUNK], sB [bk, CHUNK])."""
        rows = CHUNK // self.GROUPS
        tile_mma(tiled_mma, group_tid, cute.local_tile(sA, (self.bn, rows), (0, group)),
                 cute.local_tile(sB, (self.bk, rows), (0, group)), acc, self.mode)


class KMajorWeightGrad:
    """Weight gradients on Hopper's TF32 wgmma, for one or two problems over the same batch in
    one launch, each of one of two kinds (its operands' layouts):

    "kmajor"  dW [M, N] = A_t @ B_t^T, both operands K-major (A_t [M, Kp], B_t [N, Kp]: the
              batch, the reduction, contiguous), A and B from shared memory (SS);
    "rows"    dW [N, M] = B_t @ X, i.e. dY^T X with dY given K-major (B_t = dY^T [N, Kp]) and
              X [B, M] as stored: computed as D = X^T B_t^T [M, N], A = X^T from registers
              (RS: each thread loads its fragment elements from a row-major X tile), stored
              transposed.

    Both operands come already rounded to TF32 except X, which is rounded as it is loaded
    into the fragment. Why: a weight gradient reduces over the batch, and activations stored
    [batch, features] make both of its operands MN-major, which TF32 wgmma takes only from
    registers (WeightGrad multiplies them with mma.sync, each fragment element a scalar
    shared load down a transposed view, ~11 instructions an MMA). A producer that writes one
    activation transposed (curiosity's row pass: hid, dpred, dz) gives the tensor cores a
    K-major B, and A is either K-major too or read into registers; 16-byte cp.async copies
    stage every operand (K-major ones into the 128B-swizzled layout). Kp is a multiple of KB
    (the producer writes zeros past the batch, X's rows past B are zero-filled), so the k
    loop has no bounds; rows past M or N (and X's columns past M) are zero-filled.

    Work, at curiosity's defaults (dW2 [256, 128] and dW1's [128, 256] over 8192 rows): 24 MB
    of operands (mostly still in L2 from the row pass) and 1.1 GFLOP, so what costs is how
    often each CTA reads the operands and how the split batch is summed. A CTA (split, tile)
    is two warpgroups on a [BM, bn] = [128, 128] tile (mt, nt) of a problem's D, each one
    m64 half, over the batch rows of k-blocks [split * kb_per_split, ...) (KB rows each);
    STAGES shared stages: STAGES - 2 k-blocks in flight by cp.async, up to two in the tensor
    cores (a stage is refilled after the barrier that follows every warp's wait for the wgmma
    group that read it; "rows" alternates two sets of fragment registers, reloading one while
    the group reading the other is in flight). At the defaults 4 tiles x 32 splits: each CTA
    reads 256 KB of operands.
    The split sums, deterministic and spread over the tile's CTAs: each stores its partial
    tile to work[tile * splits + split], arrives at the tile's counter and waits until all
    `splits` have; then split j sums slice j of the tile (a splits-th of its float4 vectors)
    over the partials in split order and writes it to dW. The order is fixed, so results are
    bit-identical run to run; no float atomics. A single finishing CTA a tile (the last to
    arrive, as in WeightGrad) would read all 32 partials, 2 MB, through one SM. Waiting for
    the tile's other CTAs needs them to be scheduled, as CUB's decoupled look-back and
    CUTLASS's stream-K fixup need their earlier CTAs: the grid is at most one CTA an SM
    (kmajor_split: tiles x splits <= SMs, or one split and no wait), and a tile's CTAs are
    consecutive in launch order (split is blockIdx.x), so with CTAs dispatched in order a
    launch holds at most one tile partly resident, splits - 1 CTAs at most; every other SM
    is freed by CTAs that finish (whole tiles, or kernels beside this one that never wait
    on it), so every tile completes. That holds for one launch at a time and for concurrent
    launches of this kernel on other streams while their partly resident tiles cannot fill
    the SMs between them (31 CTAs a launch at the defaults: five at once could). A
    cooperative launch would guarantee it outright, but is not taken: it slows the two-lane
    step (the launch waits for room for all its CTAs while the side lane's column sums hold
    the SMs).
    The counter, counted up again after each finish, is zeroed by the tile's last CTA.

    Curiosity's pair at the defaults: 13.215 us in the cute step breakdown of run
    20261203T162501Z (step_breakdown.csv). History: docs/notes/gemm.md."""

    BM = 128  # D rows of a tile: two m64 wgmma halves, one a warpgroup
    HALF = _wgmma.MMA_M
    KB = 32  # batch rows of a stage: one swizzle atom row (128 bytes) of every K-major row
    STAGES = 6
    THREADS = 2 * _wgmma.WARPGROUP
    X_PITCH = HALF + 8  # floats a row of a staged X half: RS fragment loads hit 32 banks
    SPLIT_LOADS = 8  # the finish: partials' float4 loads in flight a thread

    def __init__(self, bn: int, kinds: tuple):
        self.bn = bn  # D columns of a tile (wgmma N)
        self.kinds = kinds

    @cute.jit
    def __call__(self, a0: cute.Pointer, b0: cute.Pointer, dw0: cute.Pointer, m0: Int32, n0: Int32, ldo0: Int32,
                 a1: cute.Pointer, b1: cute.Pointer, dw1: cute.Pointer, m1: Int32, n1: Int32, ldo1: Int32,
                 work_ptr: cute.Pointer, ticket_ptr: cute.Pointer, batch: Int32, kp_vecs: Int32,
                 kb_per_split: Int32, splits: Int32, stream: cuda.CUstream):
        kp = cute.assume(kp_vecs * 4, divby=self.KB)
        p0 = self.problem_tensors(0, a0, b0, dw0, m0, n0, ldo0, batch, kp, kp_vecs)
        p1 = p0
        tiles = p0[-1]
        if cutlass.const_expr(len(self.kinds) == 2):
            p1 = self.problem_tensors(1, a1, b1, dw1, m1, n1, ldo1, batch, kp, kp_vecs)
            tiles = tiles + p1[-1]
        tile_floats = self.BM * self.bn
        # the partial tiles, row-major [BM, bn] each: as pairs (the accumulators' stores) and
        # as float4 vectors (the finish's loads)
        mWork = cute.make_tensor(work_ptr, cute.make_layout((tiles * splits, tile_floats), stride=(tile_floats, 1)))
        mWorkVecs = cute.make_tensor(work_ptr, cute.make_layout((tiles * splits, tile_floats // 4, 4),
                                                                stride=(tile_floats, 4, 1)))
        mTicket = cute.make_tensor(ticket_ptr, cute.make_layout(tiles))
        self.kernel(*p0[:-1], *p1[:-1], p0[-1], mWork, mWorkVecs, mTicket, kp // self.KB, kb_per_split,
                    splits).launch(grid=[splits, tiles, 1], block=[self.THREADS, 1, 1], stream=stream)

    @cute.jit
    def problem_tensors(self, p: cutlass.Constexpr, a_ptr, b_ptr, dw_ptr, m, n, ldo, batch, kp, kp_vecs):
        """(A, B_t, D, n_tiles, tiles) of problem p; D is [M, N], dW itself or its transpose."""
        if cutlass.const_expr(self.kinds[p] == "rows"):
            mA = cute.make_tensor(a_ptr, cute.make_layout((batch, m // 4, 4), stride=(cute.assume(m, divby=4), 4, 1)))
            mD = cute.make_tensor(dw_ptr, cute.make_layout((m, n), stride=(1, ldo)))
        else:
            mA = cute.make_tensor(a_ptr, cute.make_layout((m, kp_vecs, 4), stride=(kp, 4, 1)))
            mD = cute.make_tensor(dw_ptr, cute.make_layout((m, n), stride=(ldo, 1)))
        mB = cute.make_tensor(b_ptr, cute.make_layout((n, kp_vecs, 4), stride=(kp, 4, 1)))
        n_tiles = (n + self.bn - 1) // self.bn
        return mA, mB, mD, n_tiles, ((m + self.BM - 1) // self.BM) * n_tiles

    @cute.kernel
    def kernel(self, mA0: cute.Tensor, mB0: cute.Tensor, mD0: cute.Tensor, n_tiles0: Int32,
               mA1: cute.Tensor, mB1: cute.Tensor, mD1: cute.Tensor, n_tiles1: Int32, tiles0: Int32,
               mWork: cute.Tensor, mWorkVecs: cute.Tensor, mTicket: cute.Tensor, num_kb: Int32,
               kb_per_split: Int32, splits: Int32):
        tid, _, _ = cute.arch.thread_idx()
        split, tile, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        # A's stages, [half, stage]: K-major swizzled ("kmajor") or X's rows ("rows"); the two
        # kinds of a pair share the buffer (a CTA runs one problem)
        a_floats = 0
        if cutlass.const_expr("kmajor" in self.kinds):
            a_floats = self.HALF * self.KB * 2 * self.STAGES
        if cutlass.const_expr("rows" in self.kinds):
            a_floats = max(a_floats, self.KB * self.X_PITCH * 2 * self.STAGES)
        raw = smem.allocate_tensor(Float32, cute.make_layout(a_floats), _wgmma.ATOM_BYTES)
        sA = _wgmma.sw128_view(raw.iterator, (self.HALF, self.KB, 2, self.STAGES))
        x_half = self.KB * self.X_PITCH
        sX = cute.make_tensor(raw.iterator, cute.make_layout((self.KB, self.HALF, 2, self.STAGES),
                                                             stride=(self.X_PITCH, 1, x_half, 2 * x_half)))
        sB = _wgmma.allocate_sw128(smem, (self.bn, self.KB, self.STAGES))
        args = (split, tid, sA, sX, sB, mWork, mWorkVecs, mTicket, num_kb, kb_per_split, splits)
        if cutlass.const_expr(len(self.kinds) == 1):
            self.tile(0, mA0, mB0, mD0, n_tiles0, tile, tile, *args)
        else:
            if tile < tiles0:
                self.tile(0, mA0, mB0, mD0, n_tiles0, tile, tile, *args)
            else:
                self.tile(1, mA1, mB1, mD1, n_tiles1, tile - tiles0, tile, *args)

    @cute.jit
    def copy_vectors(self, mX: cute.Tensor, row0: Int32, vec0: Int32, sX: cute.Tensor,
                     rows: cutlass.Constexpr[int], per_row: cutlass.Constexpr[int], tid: Int32):
        """sX (rows, 4 per_row) <- mX[row0 : row0 + rows, vec0 : vec0 + per_row] (float4 vectors)
        by 16-byte cp.async (a warp copies whole 128-byte row segments); vectors past mX's rows
        or columns are zeroed."""
        atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL),
                                   Float32, num_bits_per_copy=128)
        for j in cutlass.range_constexpr(rows * per_row // self.THREADS):
            idx = tid + j * self.THREADS
            r = idx // per_row
            q = idx % per_row
            dst = cute.local_tile(sX[r, None], (4,), (q,))
            if row0 + r < cute.size(mX, mode=[0]) and vec0 + q < cute.size(mX, mode=[1]):
                cute.copy(atom, mX[row0 + r, vec0 + q, None], dst)
            else:
                zeros = cute.make_rmem_tensor((4,), Float32)
                zeros.fill(0.0)
                cute.autovec_copy(zeros, dst)

    @cute.jit
    def load_block(self, p: cutlass.Constexpr, mA: cute.Tensor, mB: cute.Tensor, m0: Int32, n0: Int32,
                   kblock: Int32, stage: Int32, sA: cute.Tensor, sX: cute.Tensor, sB: cute.Tensor, tid: Int32):
        """k-block `kblock` of both operands into `stage`: B_t's [bn, KB] rows; per half, A_t's
        [HALF, KB] rows ("kmajor") or X's [KB, HALF] batch rows ("rows")."""
        for h in cutlass.range_constexpr(2):
            if cutlass.const_expr(self.kinds[p] == "rows"):
                self.copy_vectors(mA, kblock * self.KB, (m0 + h * self.HALF) // 4, sX[None, None, h, stage],
                                  self.KB, self.HALF // 4, tid)
            else:
                self.copy_vectors(mA, m0 + h * self.HALF, kblock * (self.KB // 4), sA[None, None, h, stage],
                                  self.HALF, self.KB // 4, tid)
        self.copy_vectors(mB, n0, kblock * (self.KB // 4), sB[None, None, stage], self.bn, self.KB // 4, tid)

    @cute.jit
    def step(self, p: cutlass.Constexpr, i: Int32, count: Int32, kb0: Int32, mA: cute.Tensor, mB: cute.Tensor,
             m0: Int32, n0: Int32, sA: cute.Tensor, sX: cute.Tensor, sB: cute.Tensor, tid: Int32,
             tiled: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor, tCsX: cute.Tensor,
             rA: cute.Tensor):
        """k-block i of the CTA's range: wait for it, refill the stage freed two blocks ago, and
        issue this warpgroup's wgmma group on its half (A from the descriptors tCrA, or "rows":
        from X's staged block, rounded into the fragment registers rA), leaving one group in
        flight."""
        stages = self.STAGES
        cute.arch.cp_async_wait_group(stages - 3)  # block i has landed (this thread's copies)
        _wgmma.publish()  # ... and the zero-fill stores: visible to the tensor cores
        # every thread's block i is in; every warp has waited for wgmma group i - 2, so its
        # stage ((i - 2) % STAGES) can be refilled
        cute.arch.barrier()
        ahead = i + stages - 2
        if ahead < count:
            self.load_block(p, mA, mB, m0, n0, kb0 + ahead, ahead % stages, sA, sX, sB, tid)
        cute.arch.cp_async_commit_group()
        if cutlass.const_expr(self.kinds[p] == "rows"):
            for e in cutlass.range_constexpr(cute.size(rA)):
                rA[e] = tf32_operand(tCsX[None, None, None, i % stages][e])
            _wgmma.mma_group(tiled, acc, rA, tCrB, b_at=(i % stages,))
        else:
            _wgmma.mma_group(tiled, acc, tCrA, tCrB, a_at=(i % stages,), b_at=(i % stages,))
        warpgroup.wait_group(1)

    @cute.jit
    def tile(self, p: cutlass.Constexpr, mA: cute.Tensor, mB: cute.Tensor, mD: cute.Tensor, n_tiles: Int32,
             local_tile: Int32, tile: Int32, split: Int32, tid: Int32, sA: cute.Tensor, sX: cute.Tensor,
             sB: cute.Tensor, mWork: cute.Tensor, mWorkVecs: cute.Tensor, mTicket: cute.Tensor, num_kb: Int32,
             kb_per_split: Int32, splits: Int32):
        stages = self.STAGES
        rows = cutlass.const_expr(self.kinds[p] == "rows")
        m0 = (local_tile // n_tiles) * self.BM
        n0 = (local_tile % n_tiles) * self.bn
        half = tid // _wgmma.WARPGROUP  # this warpgroup's m64 half of the tile
        tiled = _wgmma.tiled_mma_tf32(self.bn, a_in_registers=rows)
        thr = tiled.get_slice(tid % _wgmma.WARPGROUP)
        tCrB = tiled.make_fragment_B(thr.partition_B(sB))  # (MMA, 1, KB / 8, STAGES) descriptors
        tCrA = tCsX = rA = None
        if cutlass.const_expr(rows):
            # X^T (M = features, K = batch rows) of each half and stage, and the thread's fragment
            sXt = cute.make_tensor(sX.iterator, cute.select(sX.layout, mode=[1, 0, 2, 3]))
            tCsX = thr.partition_A(sXt)[None, None, None, half, None]  # (MMA, 1, KB / 8, STAGES)
            rA = tiled.make_fragment_A(tCsX[None, None, None, 0])
        else:
            tCrA = tiled.make_fragment_A(thr.partition_A(sA))[None, None, None, half, None]  # descriptors
        acc = tiled.make_fragment_C(tiled.partition_shape_C((self.HALF, self.bn)))
        acc.fill(0.0)
        kb0 = split * kb_per_split
        count = cutlass.max(cutlass.min(kb_per_split, num_kb - kb0), 0)
        for s in cutlass.range_constexpr(stages - 2):
            if s < count:
                self.load_block(p, mA, mB, m0, n0, kb0 + s, s, sA, sX, sB, tid)
            cute.arch.cp_async_commit_group()  # one group a block (empty past the end)
        if cutlass.const_expr(rows):
            # Two fragment register sets, alternating: block i + 1's are loaded while group i
            # (reading block i's) is still in flight.
            rA2 = (rA, tiled.make_fragment_A(tCsX[None, None, None, 0]))
            for i2 in cutlass.range(0, count, 2, unroll=1):
                for u in cutlass.range_constexpr(2):
                    if i2 + u < count:
                        self.step(p, i2 + u, count, kb0, mA, mB, m0, n0, sA, sX, sB, tid, tiled, acc, None,
                                  tCrB, tCsX, rA2[u])
        else:
            for i in cutlass.range(count, unroll=1):
                self.step(p, i, count, kb0, mA, mB, m0, n0, sA, sX, sB, tid, tiled, acc, tCrA, tCrB, None, None)
        warpgroup.wait_group(0)

        # This CTA's partial tile (accumulator pairs (g, 2t), (g, 2t + 1) as 64-bit stores) ...
        coord = thr.partition_C(cute.make_identity_tensor((self.HALF, self.bn)))
        row = tile * splits + split
        for i in cutlass.range_constexpr(0, cute.size(acc), 2):
            e = (half * self.HALF + coord[i][0]) * self.bn + coord[i][1]
            store_pair(mWork[row, None], e, acc[i], acc[i + 1])
        # ... published; then wait until every split of the tile has published its own.
        _cute.wait_for_arrivals(mTicket, tile, _cute.arrive(mTicket, tile, tid), splits, tid)

        # Split `split` finishes its slice of the tile: float4 vectors [first, last), each the
        # sum of the tile's partials in split order.
        tile_vecs = self.BM * self.bn // 4
        per_slice = (tile_vecs + splits - 1) // splits
        first = split * per_slice
        last = cutlass.min(first + per_slice, tile_vecs)
        for vec in cutlass.range(first + tid, last, self.THREADS, unroll=1):
            total = cute.make_rmem_tensor((4,), Float32)
            total.fill(0.0)
            for base in cutlass.range(0, splits, self.SPLIT_LOADS, unroll=1):
                parts = cute.make_rmem_tensor((self.SPLIT_LOADS, 4), Float32)
                for r in cutlass.range_constexpr(self.SPLIT_LOADS):
                    if base + r < splits:
                        parts[r, None].store(mWorkVecs[tile * splits + base + r, vec, None].load())
                    else:
                        parts[r, None].fill(0.0)
                for r in cutlass.range_constexpr(self.SPLIT_LOADS):
                    total.store(total.load() + parts[r, None].load())
            r = m0 + vec * 4 // self.bn
            for v in cutlass.range_constexpr(4):
                c = n0 + vec * 4 % self.bn + v
                if r < cute.size(mD, mode=[0]) and c < cute.size(mD, mode=[1]):
                    mD[r, c] = total[v]
        _cute.depart(mTicket, tile, splits, tid)


# ---------------------------------------------------------------------------------------------
# Host side

_compiled = _cute.CompiledCache(__name__)


def _tile_n(n: int) -> int:
    bn = 8
    while bn < min(n, 128):
        bn *= 2
    return bn


def stores_pairs(epilogue: str, n: int) -> bool:
    """Whether SkinnyMatmul stores its output in 64-bit pairs: N even and an [M, N] output (one
    rule, so that the compile cache gets one key per kernel: row_dot at even and odd N is one)."""
    return n % 2 == 0 and epilogue != "row_dot"


def tile_m(bn: int, epilogue: str, m: int | None = None, sms: int | None = None) -> int:
    """SkinnyMatmul's rows a CTA: at most 64 accumulators a thread (residual's at most 32: it
    holds R's too), and 64 rows where 128-row tiles of m rows would leave some of the sms SMs
    without a CTA (the seed's c = h @ W_C at B = 8192: 64 CTAs of 128 rows)."""
    if bn > 64 or epilogue == "residual" or (m is not None and -(-m // 128) < sms):
        return 64
    return 128


def matmul_compile_args(epilogue: str, precision: str, bn: int, vec_k: int, pairs: bool = False,
                        bm: int | None = None, b_vec: int = 0) -> tuple:
    """(kernel object, arguments) to compile SkinnyMatmul with, on any machine."""
    p = _cute.fake_ptr()
    return (SkinnyMatmul(epilogue, precision, bn, vec_k, pairs, bm, b_vec), p, p, p, p, p, Float32(0.0), Int32(1),
            Int32(1), Int32(1), _cute.fake_stream())


def weight_grad_compile_args(precision: str, problems: tuple, bk: int) -> tuple:
    p, i = _cute.fake_ptr(), Int32(1)
    return (WeightGrad(precision, problems, bk), p, p, p, p, i, i, i, p, p, p, p, i, i, i, p,
            _cute.fake_ptr(Int32), i, i, i, _cute.fake_stream())


def kmajor_weight_grad_compile_args(bn: int, kinds: tuple) -> tuple:
    p, i = _cute.fake_ptr(), Int32(1)
    return (KMajorWeightGrad(bn, kinds), p, p, p, i, i, i, p, p, p, i, i, i, p, _cute.fake_ptr(Int32),
            i, i, i, i, _cute.fake_stream())


def _compile_kmajor_weight_grad(bn: int, kinds: tuple, keep: bool = False) -> Any:
    return _compiled.get(("kmajor_weight_grad", bn, kinds, keep), lambda: _cute.compile_kernel(
        *kmajor_weight_grad_compile_args(bn, kinds), keep=keep))


def _compile_matmul(epilogue: str, precision: str, bn: int, vec_k: int, pairs: bool, bm: int | None = None,
                    b_vec: int = 0, keep: bool = False) -> Any:
    bm = bm or tile_m(bn, epilogue)
    return _compiled.get(("matmul", epilogue, precision, bn, vec_k, pairs, bm, b_vec, keep),
                         lambda: _cute.compile_kernel(*matmul_compile_args(epilogue, precision, bn, vec_k, pairs,
                                                                           bm, b_vec), keep=keep))


def _compile_weight_grad(precision: str, problems: tuple, bk: int, keep: bool = False) -> Any:
    return _compiled.get(("weight_grad", precision, problems, bk, keep), lambda: _cute.compile_kernel(
        *weight_grad_compile_args(precision, problems, bk), keep=keep))


def _check(where: str, precision: str, **dims: int) -> None:
    _arrays.check_choice(where, "precision", precision, PRECISIONS)
    for name, size in dims.items():
        if name in ("N", "K") and not 1 <= size <= MAX_DIM:
            raise _arrays.FoxcuteInputError(f"{where}: {name}={size} is outside the supported range "
                                            f"1 <= {name} <= {MAX_DIM}")
        if name == "M" and not 1 <= size <= MAX_ROWS:
            raise _arrays.FoxcuteInputError(f"{where}: M={size} is outside the supported range "
                                            f"1 <= M <= {MAX_ROWS} (32-bit indexing)")


def matmul(A: Any, B_t: Any = None, *, B: Any = None, epilogue: str = "none", bias: Any = None,
           v: Any = None, c0: float = 0.0, residual: Any = None, precision: str = "tf32",
           out: Any = None) -> Any:
    """epilogue(A @ B_t^T) for float32 cupy arrays / torch CUDA tensors A [M, K], B_t [N, K]
    (a torch Linear weight), or epilogue(A @ B) for B [K, N] given in place of B_t (x @ W:
    no transposed copy of W needed). bias [N] is needed by "bias_relu", "sigmoid" and
    "row_dot"; v [N] and c0 by "row_dot", whose output is [M]; residual [M, N] by
    "residual"; the others give [M, N]. Arguments an epilogue does not use are not read.
    Launched on the current stream."""
    where = "foxcute.kernels.gemm.matmul"
    _arrays.check_choice(where, "epilogue", epilogue, EPILOGUES)
    chk = _arrays.Checker(where, gpu=True)
    chk.array("A", A, ("M", "K"))
    if B_t is None and B is None:
        raise chk.fail("B_t", "is required (or B [K, N] in its place)")
    if B_t is not None and B is not None:
        raise chk.fail("B", "was given with B_t: pass one of them")
    if B is None:
        chk.array("B_t", B_t, ("N", "K"))
    else:
        chk.array("B", B, ("K", "N"))
    if epilogue in ("bias_relu", "sigmoid", "row_dot"):
        if bias is None:
            raise chk.fail("bias", f"is required by epilogue {epilogue!r}")
        chk.array("bias", bias, ("N",))
    aux = None  # the kernel's aux operand: row_dot's v, residual's R
    if epilogue == "row_dot":
        if v is None:
            raise chk.fail("v", "is required by epilogue 'row_dot'")
        aux = chk.array("v", v, ("N",))
        c0 = chk.scalar("c0", c0)
    if epilogue == "residual":
        if residual is None:
            raise chk.fail("residual", "is required by epilogue 'residual'")
        aux = chk.array("residual", residual, ("M", "N"))
    m, n, k = chk.dims["M"], chk.dims["N"], chk.dims["K"]
    _check(where, precision, M=m, N=n, K=k)
    out = chk.output(out, ("M",) if epilogue == "row_dot" else ("M", "N"), A)
    vec = _vec(k)
    bn = _tile_n(n)
    fn = _compile_matmul(epilogue, precision, bn, vec, stores_pairs(epilogue, n),
                         tile_m(bn, epilogue, m, _arrays.sm_count(A)), 0 if B is None else _vec(n))
    unused = A  # pointers an epilogue does not read: any valid address
    fn(_cute.gmem_ptr(A), _cute.gmem_ptr(B_t if B is None else B), _cute.gmem_ptr(out),
       _cute.gmem_ptr(bias if bias is not None else unused), _cute.gmem_ptr(aux if aux is not None else unused),
       Float32(c0), Int32(m), Int32(n), Int32(k // vec), _cute.current_stream(A))
    return out


def weight_grad_grid(m: int, tiles: int, sms: int) -> tuple[int, int]:
    """(num_ctas over the batch, rows per CTA) for `tiles` output tiles: about one CTA per SM,
    each reducing a whole number of CHUNK-row steps (more CTAs would lengthen the serial
    fixed-order sum over their partials at the end). Fixed by (m, tiles, sms), and so is the
    summation order."""
    want = max(1, sms // tiles)
    steps = -(-m // CHUNK)
    rows_per_cta = -(-steps // min(want, steps)) * CHUNK
    return -(-m // rows_per_cta), rows_per_cta


def _tiles(n: int, k: int, bk: int) -> tuple[int, int]:
    return -(-n // WeightGrad.bn), -(-k // bk)


def weight_grad(dY: Any, X: Any, *, with_bias: bool = True, precision: str = "tf32") -> Any:
    """dW = dY^T X [N, K] and (with_bias) db = sum over rows of dY [N], for float32 cupy
    arrays / torch CUDA tensors dY [M, N], X [M, K]. Returns dW, or (dW, db). Deterministic:
    bit-identical from run to run. Launched on the current stream."""
    where = "foxcute.kernels.gemm.weight_grad"
    chk = _arrays.Checker(where, gpu=True)
    chk.array("dY", dY, ("M", "N"))
    chk.array("X", X, ("M", "K"))
    m, n, k = chk.dims["M"], chk.dims["N"], chk.dims["K"]
    _check(where, precision, M=m, N=n, K=k)
    dW = _arrays.empty(dY, (n, k))
    db = _arrays.empty(dY, (n,)) if with_bias else None
    weight_grads_into([(dY, X, dW, k, db)], precision)
    return (dW, db) if with_bias else dW


def weight_grads_into(problems: list, precision: str) -> None:
    """One launch for one or two weight gradients of validated arrays over the same batch:
    problems = [(dY [M, N], X [M, K], dW, ldo, db)], writing dW [N, K] into `dW` (rows `ldo`
    floats apart, e.g. the first K columns of a wider gradient; or, for a [2, N, K/2] `dW`,
    columns :K/2 into dW[0] and K/2: into dW[1], ldo unused: the seed Mamba2 backward's dW_A
    and dW_B out of h_hist^T [da|du] with no copy) and the column sums of dY into `db` (None:
    not wanted)."""
    m = problems[0][0].shape[0]
    shapes = [(dY.shape[1], X.shape[1]) for dY, X, *_ in problems]
    bk = WeightGrad.tile_k(max(k for _, k in shapes))
    tiles = [_tiles(n, k, bk) for n, k in shapes]
    num_ctas, rows_per_cta = weight_grad_grid(m, sum(a * b for a, b in tiles), _arrays.sm_count(problems[0][0]))
    work = _arrays.empty(problems[0][0], (sum(num_ctas * nt * (kt * bk + 1) * WeightGrad.bn
                                              for nt, kt in tiles),))
    tickets = _cute.tickets(problems[0][0], sum(a * b for a, b in tiles))
    config = tuple((_vec(n), _vec(k), db is not None, dW.ndim == 3)
                   for (n, k), (_, _, dW, _, db) in zip(shapes, problems))
    fn = _compile_weight_grad(precision, config, bk)
    ptr = _cute.gmem_ptr
    args = []
    for (dY, X, dW, ldo, db), (n, k), (vec_n, vec_k, *_) in zip(problems, shapes, config):
        args += [ptr(dY), ptr(X), ptr(dW), ptr(db if db is not None else dW), Int32(n // vec_n),
                 Int32(k // vec_k), Int32(ldo)]
    if len(problems) == 1:
        args += args  # the second problem's slots, unused
    fn(*args, ptr(work), ptr(tickets, Int32), Int32(m), Int32(rows_per_cta), Int32(num_ctas),
       _cute.current_stream(problems[0][0]))


KMAJOR_TILE_N = 128  # dW columns of a KMajorWeightGrad tile


def kmajor_split(num_kb: int, tiles: int, sms: int) -> tuple[int, int]:
    """(splits of the batch, k-blocks a split) for KMajorWeightGrad: at most one CTA an SM over
    all tiles (a tile's CTAs wait for each other, so they must all be resident), one split
    where the tiles alone outnumber the SMs. Fixed by its arguments, and so is the summation
    order."""
    want = max(1, min(sms // tiles, num_kb))
    per_split = -(-num_kb // want)
    return -(-num_kb // per_split), per_split


def kmajor_weight_grads_into(problems: list, batch: int, kp: int) -> None:
    """One launch for one or two weight gradients of validated arrays on wgmma over `batch`
    rows, their K-major operands padded to kp rows (a multiple of KMajorWeightGrad.KB, zeros
    past the batch) and already rounded to TF32: problems = [(kind, A, B_t, dW, ldo)], each
    writing into `dW` (rows `ldo` floats apart)
      "kmajor": A = A_t [M, kp], B_t [N, kp]: dW[:M, :N] = A_t @ B_t^T;
      "rows":   A = X [batch, M] (float32, rounded in the kernel), B_t = dY^T [N, kp]:
                dW[:N, :M] = B_t @ X."""
    kernel = KMajorWeightGrad
    bn = KMAJOR_TILE_N

    def m_of(kind, a):
        return a.shape[1] if kind == "rows" else a.shape[0]
    x = problems[0][1]
    tiles = sum(-(-m_of(kind, a) // kernel.BM) * -(-b.shape[0] // bn) for kind, a, b, *_ in problems)
    splits, per_split = kmajor_split(kp // kernel.KB, tiles, _arrays.sm_count(x))
    work = _arrays.empty(x, (tiles * splits * kernel.BM * bn,))
    tickets = _cute.tickets(x, tiles)
    ptr = _cute.gmem_ptr
    args = []
    for kind, a, b, dw, ldo in problems:
        args += [ptr(a), ptr(b), ptr(dw), Int32(m_of(kind, a)), Int32(b.shape[0]), Int32(ldo)]
    if len(problems) == 1:
        args += args  # the second problem's slots, unused
    _compile_kmajor_weight_grad(bn, tuple(kind for kind, *_ in problems))(
        *args, ptr(work), ptr(tickets, Int32), Int32(batch), Int32(kp // 4), Int32(per_split), Int32(splits),
        _cute.current_stream(x))


def compiled_for_ci() -> dict[str, Any]:
    """Every kernel variant compiled with PTX kept, at the trainer's default widths."""
    out = {}
    for precision in PRECISIONS:
        for epilogue in EPILOGUES:
            out[f"matmul_{epilogue}_{precision}"] = _compile_matmul(epilogue, precision, _tile_n(128), 4,
                                                                    stores_pairs(epilogue, 128), keep=True)
        # B given [K, N] (x @ W): the seed Mamba2 projection's shape, N = 32
        out[f"matmul_kn_{precision}"] = _compile_matmul("none", precision, _tile_n(32), 4, True, b_vec=4, keep=True)
        for bk in WeightGrad.BK:
            out[f"weight_grad_k{bk}_{precision}"] = _compile_weight_grad(precision, ((4, 4, True, False),), bk,
                                                                          keep=True)
        out[f"weight_grad_pair_{precision}"] = _compile_weight_grad(
            precision, ((4, 4, False, False), (4, 4, False, False)), WeightGrad.tile_k(128), keep=True)
        # the seed Mamba2 backward's [dW_A|dW_B] = h_hist^T [da|du] into two arrays, and its
        # dW_C = h^T dc with dw = dout^T ctx (X one column: scalar loads)
        out[f"weight_grad_halves_{precision}"] = _compile_weight_grad(precision, ((4, 4, False, True),),
                                                                      WeightGrad.tile_k(32), keep=True)
        out[f"weight_grad_pair_scalar_{precision}"] = _compile_weight_grad(
            precision, ((4, 4, False, False), (4, 1, False, False)), WeightGrad.tile_k(16), keep=True)
    out["kmajor_weight_grad_pair"] = _compile_kmajor_weight_grad(KMAJOR_TILE_N, ("kmajor", "rows"), keep=True)
    return out
