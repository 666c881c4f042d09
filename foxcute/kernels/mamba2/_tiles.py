"""What both fused Mamba2 kernels trace: the CTA's geometry, the tiled MMA of their
products and the shared-memory layouts it reads (row pitches, the K-pair views), the MMA over
shared-memory operands (_mma_smem), the c product by FFMA (_StateProduct), and the 128-bit
row copies between global memory, registers and shared memory (_TileCopies); and the CTA's
fixed-order sum of dsigma (store_cta_sum) that the fused backward and the seed scan share."""

from __future__ import annotations

import operator
from typing import Any, Callable

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from .._tf32 import load_bits, load_tf32, tf32_operand

THREADS = 256
TILE_ROWS = 64  # rows of h_hist [B*K, SH2] per CTA tile
CHUNK = 64  # SH2 columns per main-loop step
SMEM_PER_SM = 228 * 1024 - 2 * 1024  # per SM, less 1 KB the driver reserves per CTA


def _pair_pitch(width: int, tf32: bool) -> int:
    """Row pitch (words) of a tile `width` (a multiple of 16) wide that a TF32 B operand
    reads with K along its columns in 64-bit pairs (W for dh_hist): 8 mod 16, so a warp's
    pair loads (8 rows g x 4 lane pairs t at g * pitch + 2t) fall on disjoint banks in each
    half-warp. fp32: 4 mod 16 (conflict-free FFMA reads, see _mma.warp_mma)."""
    return width + (8 if tf32 else 4)


def _w_pitch(D: int) -> int:
    """Row pitch of the [W_A|W_B] tile (rows of 2D) that fp32's a|u reads with K = rows:
    8 mod 32 (TF32's a|u is a wgmma reading [W_A|W_B]^T, see _wgmma)."""
    return 2 * D + 8


def _k_pairs_view(s: cute.Tensor) -> cute.Tensor:
    """The (rows, Kc) view s with its K mode split as ((4, 2), Kc/8): in every 8-wide K step
    logical k = t and t + 4 are physical 2t and 2t + 1, so a TF32 B fragment pair (b0, b1)
    is adjacent where s is K-contiguous (and where K runs down the rows of a 128B-swizzled
    tile, a warp's A loads k = t at rows 2t hit 32 distinct banks: dW's h_hist^T). Applied to
    the K index of both operands of a product it only reorders the sum inside each MMA (the
    last bits change; run to run they do not). Any layout of s (a composition)."""
    rows, kc = cute.size(s, mode=[0]), cute.size(s, mode=[1])
    return cute.composition(s, (cute.make_layout(rows),
                                cute.make_layout(((4, 2), kc // 8), stride=((2, 1), 8))))


def _k_order_view(s: cute.Tensor) -> cute.Tensor:
    """The (rows, width) view s whose column c = 8j + 2e + h is physical column 8j + e + 4h:
    physical column k holds the column that _k_pairs_view puts at k, so a product reading s
    with K = physical columns and its other operand through _k_pairs_view multiplies matching
    columns, with the other operand's fragment pairs adjacent and s's (a0, a2) apart (no
    merged 64-bit A loads, which mma.sync would need moved apart again)."""
    rows, width = s.shape
    row_stride, _ = s.layout.stride
    return cute.make_tensor(s.iterator, cute.make_layout(
        (rows, ((2, 4), width // 8)), stride=(row_stride, ((4, 1), 8))))


def _load_b_pairs(dst: cute.Tensor, src: cute.Tensor, rounded: bool) -> None:
    """dst <- src, one K step of a B partition whose b0, b1 are adjacent in shared memory:
    one 64-bit load per N repeat ni, then its two registers as the MMA takes them (bits as
    they are where rounded when staged, else rounded here: _tf32.load_bits / load_tf32)."""
    pair = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
    for ni in range(cute.size(src, mode=[1])):
        assert src[None, ni].layout.stride == (1,), "b_pairs: b0, b1 must be adjacent"
        pair.store(src[None, ni].load())
        (load_bits if rounded else load_tf32)(dst[None, ni], pair)


def _mma_smem(tiled: cute.TiledMma, thr: Any, acc: cute.Tensor, sA: cute.Tensor, sB: cute.Tensor,
              tf32: bool, a_rounded: bool = False, b_rounded: bool = False, b_pairs: bool = False) -> None:
    """acc += sA @ sB^T for shared-memory views sA (M, Kc) and sB (N, Kc), Kc a multiple of 8.

    tf32: the register operands are the atom's own fragments (make_fragment_A/B: the
    m16n8k8 register order a0..a3 = (g, t), (g+8, t), (g, t+4), (g+8, t+4)), filled element
    by element with cvt.rna, or bit for bit where the operand was rounded when it was put in
    shared memory (`a_rounded`, `b_rounded`: tf32_operand once per element, where cvt.rna at
    the fragment load is two instructions for every warp that reads the element; same
    bits). A register tensor made "like" the shared-memory partition
    copies its stride order instead; for a K-major A (a row pitch > 1 between the value
    modes) mma.sync then got a0, a2, a2, a1 and never a3 (seen in the PTX), which is what
    made every K-major-A product of the TF32 kernels wrong on the H200.

    b_pairs (tf32): sB holds each lane's b0, b1 (k = t, t + 4) at adjacent addresses (see
    _k_pairs_view): one 64-bit ld.shared for the two, half of B's load instructions. Only B:
    A's pairs would be (a0, a2), (a1, a3), registers that mma.sync wants apart (two moves
    per load saved, seen in the SASS), so A is never laid out with adjacent pairs."""
    tCsA = thr.partition_A(sA)
    tCsB = thr.partition_B(sB)
    if const_expr(tf32):
        rA = tiled.make_fragment_A(tCsA[None, None, 0])
        rB = tiled.make_fragment_B(tCsB[None, None, 0])
        for k in range(cute.size(tCsA, mode=[2])):
            # round to nearest (cvt.rna): truncating float32 bits would bias every product
            (load_bits if a_rounded else load_tf32)(rA, tCsA[None, None, k])
            if const_expr(b_pairs):
                _load_b_pairs(rB, tCsB[None, None, k], b_rounded)
            else:
                (load_bits if b_rounded else load_tf32)(rB, tCsB[None, None, k])
            cute.gemm(tiled, acc, rA, rB, acc)
    else:
        for k in range(cute.size(tCsA, mode=[2])):
            a = cute.make_rmem_tensor_like(tCsA[None, None, k], Float32)
            b = cute.make_rmem_tensor_like(tCsB[None, None, k], Float32)
            cute.autovec_copy(tCsA[None, None, k], a)
            cute.autovec_copy(tCsB[None, None, k], b)
            cute.gemm(tiled, acc, a, b, acc)


@cute.jit
def _store_accumulators(thr: Any, acc: cute.Tensor, dst: cute.Tensor):
    """dst[m, n] <- this thread's MMA accumulators acc, dst being the product's shape."""
    coord = thr.partition_C(cute.make_identity_tensor(dst.shape))
    for i in cutlass.range_constexpr(cute.size(acc)):
        m, n = coord[i]
        dst[m, n] = acc[i]


class _StateProduct:
    """c[b, s] = sum_k h[b, k] W_C[k, s] over a tile's Bt samples by FFMA, one CHUNK at a time.

    A thread owns 4 consecutive states of one sample and every split-th k of a chunk
    (k = i * split + lane % split, so the split lanes read distinct banks); their partial
    sums are joined by shuffles in `store`. Per FFMA it reads a quarter of a 16-byte W_C row
    and 1/4 word of h: one thread per (sample, state) reading a W_C word per FFMA issued 4x
    the shared-memory instructions, and shared memory bounds the fused kernels.

    W_C's row pitch (`w_pitch`): a 128-bit ld.shared is served a quarter-warp (8 lanes) at a
    time, and a quarter-warp's lanes read `split` consecutive rows k, 8 / split float4 of
    each (lane bits: k % split below the group). At pitch D those rows' windows overlap in
    banks (D = 16, split 4: rows k, k + 2, 2 wavefronts a quarter-warp instead of 1; see
    docs/notes/mamba2-forward.md, 2026-11-29). A pitch of W mod 2W words, W = the words a
    quarter-warp reads of one row, puts the split windows side by side in the 32 banks:
    D = 16, split 4: pitch 24; D = 32: 40 (split 4), 48 (split 2); D = 8 or split 1: D."""

    def __init__(self, Bt: int, D: int):
        self.Bt, self.quads = Bt, D // 4
        groups = Bt * self.quads
        self.split = 1
        while self.split < 4 and 2 * self.split * groups <= THREADS:
            self.split *= 2  # a power of two: the shuffle groups tile the warp
        self.tasks = groups * self.split
        self.slots = _slots(self.tasks)
        window = 4 * min(self.quads, 8 // self.split)  # words of a row one quarter-warp reads
        self.w_pitch = D
        if self.split > 1:
            while self.w_pitch % (2 * window) != window:
                self.w_pitch += 4

    def accumulators(self) -> cute.Tensor:
        return cute.make_rmem_tensor(cute.make_layout((self.slots, 4)), Float32)

    @cute.jit
    def accumulate(self, acc: cute.Tensor, sRows: cute.Tensor, sW: cute.Tensor, tid: Int32):
        """acc += this thread's share of sRows (Bt, CHUNK) @ sW (CHUNK, D)."""
        split = self.split
        w = cute.make_rmem_tensor(cute.make_layout((4,)), Float32)
        for q in cutlass.range_constexpr(self.slots):
            task = tid + q * THREADS
            if task < self.tasks:
                group = task // split
                b = group // self.quads
                s4 = group - b * self.quads
                for i in cutlass.range(CHUNK // split, unroll=8):
                    k = i * split + task % split
                    hk = sRows[b, k]
                    cute.autovec_copy(cute.local_tile(sW[k, None], (4,), (s4,)), w)
                    for e in cutlass.range_constexpr(4):
                        acc[q, e] = acc[q, e] + hk * w[e]

    @cute.jit
    def store(self, acc: cute.Tensor, sC: cute.Tensor, tid: Int32):
        """sC (Bt, D) <- the split lanes' sums (every lane takes part in the shuffles)."""
        for q in cutlass.range_constexpr(self.slots):
            task = tid + q * THREADS
            group = task // self.split
            b = group // self.quads
            s4 = group - b * self.quads
            for e in cutlass.range_constexpr(4):
                v = acc[q, e]
                if const_expr(self.split > 1):
                    v = cute.arch.warp_reduction(v, operator.add, threads_in_group=self.split)
                if task < self.tasks and task % self.split == 0:
                    sC[b, s4 * 4 + e] = v


def _slots(n_vectors: int) -> int:
    return (n_vectors + THREADS - 1) // THREADS


class _TileCopies:
    """128-bit copies between global memory, registers and shared memory for row tiles.

    A tile of `rows` x `width` floats is cut into float4 vectors, vector idx = r*(width/4)+q,
    handed to threads round-robin; `regs` is a (4, slots) register tensor."""

    @staticmethod
    def thread_vectors(rows: int, width: int):
        """Yields (slot i, vector idx, row r, float4 column q) for each vector this thread
        handles (idx = tid + i * THREADS; in the last slot idx may lie past the tile's
        rows * width / 4), each computed when the loop body asks for it."""
        tid, _, _ = cute.arch.thread_idx()
        per_row = width // 4
        for i in range(_slots(rows * per_row)):
            idx = tid + i * THREADS
            r = idx // per_row
            yield i, idx, r, idx - r * per_row

    @cute.jit
    def fetch_rows(self, src: cute.Tensor, row0: Int32, n_valid: Int32, col0: Int32,
                   regs: cute.Tensor, rows: cutlass.Constexpr[int], width: cutlass.Constexpr[int]):
        """regs <- src[row0 + r, col0 : col0 + width] for r < rows; rows >= n_valid read as 0."""
        for i, _, r, q in self.thread_vectors(rows, width):
            if r < n_valid:
                cute.autovec_copy(cute.local_tile(src[row0 + r, None], (4,), (col0 // 4 + q,)),
                                  regs[None, i])
            else:
                regs[None, i].fill(0.0)

    @cute.jit
    def store_rows(self, regs: cute.Tensor, dst: cute.Tensor, rows: cutlass.Constexpr[int],
                   width: cutlass.Constexpr[int], tf32: cutlass.Constexpr[bool] = False):
        """dst[r, 0:width] <- the vectors fetch_rows put in regs, rounded to TF32 if `tf32`
        (for a tile that only the tensor cores read: _mma_smem's a_rounded / b_rounded)."""
        for i, idx, r, q in self.thread_vectors(rows, width):
            if idx < rows * (width // 4):
                if const_expr(tf32):
                    for e in cutlass.range_constexpr(4):
                        regs[e, i] = tf32_operand(regs[e, i])
                cute.autovec_copy(regs[None, i], cute.local_tile(dst[r, None], (4,), (q,)))

    @cute.jit
    def copy_rows_async(self, src: cute.Tensor, row0: Int32, n_valid: Int32, col0: Int32,
                        dst: cute.Tensor, rows: cutlass.Constexpr[int], width: cutlass.Constexpr[int],
                        commit: cutlass.Constexpr[bool] = True):
        """dst[r, 0:width] <- src[row0 + r, col0 : col0 + width] by cp.async, 16 bytes each and
        no registers held; rows >= n_valid are zeroed. Commits one cp.async group (unless not
        `commit`: the copies then join the next copy's group)."""
        atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL),
                                   Float32, num_bits_per_copy=128)
        zeros = cute.make_rmem_tensor(cute.make_layout((4,)), Float32)
        zeros.fill(0.0)
        for _, idx, r, q in self.thread_vectors(rows, width):
            if r < n_valid:
                cute.copy(atom, cute.local_tile(src[row0 + r, None], (4,), (col0 // 4 + q,)),
                          cute.local_tile(dst[r, None], (4,), (q,)))
            elif idx < rows * (width // 4):
                cute.autovec_copy(zeros, cute.local_tile(dst[r, None], (4,), (q,)))
        if const_expr(commit):
            cute.arch.cp_async_commit_group()

    @cute.jit
    def zero_rows(self, dst: cute.Tensor, first: cutlass.Constexpr[int], rows: cutlass.Constexpr[int],
                  width: cutlass.Constexpr[int]):
        """dst[first + r, 0:width] <- 0 for r < rows, element by element, the CTA's threads
        round-robin."""
        tid, _, _ = cute.arch.thread_idx()
        for i in cutlass.range_constexpr(_slots(rows * width)):
            idx = tid + i * THREADS
            if idx < rows * width:
                dst[first + idx // width, idx % width] = Float32(0.0)

    @cute.jit
    def round_rows_in_place(self, tile: cute.Tensor, rows: cutlass.Constexpr[int], width: cutlass.Constexpr[int]):
        """tile[r, 0:width] <- tf32_operand of itself, for the vectors this thread copied there
        with copy_rows_async (the same thread mapping): once its cp.async group has landed
        they are visible to this thread, and the barrier before any MMA publishes them."""
        v = cute.make_rmem_tensor(cute.make_layout((4,)), Float32)
        for _, idx, r, q in self.thread_vectors(rows, width):
            if idx < rows * (width // 4):
                cute.autovec_copy(cute.local_tile(tile[r, None], (4,), (q,)), v)
                for e in cutlass.range_constexpr(4):
                    v[e] = tf32_operand(v[e])
                cute.autovec_copy(v, cute.local_tile(tile[r, None], (4,), (q,)))

    @cute.jit
    def store_rows_transposed(self, regs: cute.Tensor, dst: cute.Tensor, rows: cutlass.Constexpr[int],
                              width: cutlass.Constexpr[int], tf32: cutlass.Constexpr[bool] = False):
        """dst[c, r] <- element (r, c) of the tile fetch_rows put in regs (scalar stores),
        rounded to TF32 if `tf32` (a tile only the tensor cores read)."""
        for i, idx, r, q in self.thread_vectors(rows, width):
            if idx < rows * (width // 4):
                for e in cutlass.range_constexpr(4):
                    if const_expr(tf32):
                        regs[e, i] = tf32_operand(regs[e, i])
                    dst[q * 4 + e, r] = regs[e, i]

    @cute.jit
    def fetch_weights_ab(self, mWA: cute.Tensor, mWB: cute.Tensor, col0: Int32, regs: cute.Tensor,
                         D: cutlass.Constexpr[int]):
        """regs <- [W_A | W_B][col0 : col0 + CHUNK, :]: CHUNK rows of 2D floats."""
        half = D // 4
        for i, idx, r, q in self.thread_vectors(CHUNK, 2 * D):
            if idx < CHUNK * (2 * D // 4):
                if q < half:
                    cute.autovec_copy(cute.local_tile(mWA[col0 + r, None], (4,), (q,)), regs[None, i])
                else:
                    cute.autovec_copy(cute.local_tile(mWB[col0 + r, None], (4,), (q - half,)),
                                      regs[None, i])

    def wt_vectors(self):
        """Yields (slot i, row r of the W chunk, float4 q of [W_A|W_B] row r) for each vector
        this thread stages for TF32's a|u: a warp takes 16 rows x 2 float4 (whole 32-byte
        sectors of W), so that its scalar stores down the swizzled [W_A|W_B]^T (column r,
        row 4q + e) hit 32 distinct banks; thread_vectors' 4 rows x 8 float4 would be 4-way
        conflicts (bank model: a warp's word addresses; docs/notes/mamba2-forward.md,
        2026-11-29). CHUNK * 2D / 4 = 32 D vectors: whole slots."""
        tid, _, _ = cute.arch.thread_idx()
        for i in range(CHUNK * 2 * self.D // 4 // THREADS):
            v = tid + i * THREADS
            warp = v // 32
            lane = v - warp * 32
            yield i, 16 * (warp % 4) + lane // 2, 2 * (warp // 4) + lane % 2

    @cute.jit
    def fetch_weights_t(self, mWA: cute.Tensor, mWB: cute.Tensor, col0: Int32, regs: cute.Tensor):
        """regs <- [W_A | W_B][col0 : col0 + CHUNK, :] in wt_vectors' order."""
        half = self.D // 4
        for i, r, q in self.wt_vectors():
            if q < half:
                cute.autovec_copy(cute.local_tile(mWA[col0 + r, None], (4,), (q,)), regs[None, i])
            else:
                cute.autovec_copy(cute.local_tile(mWB[col0 + r, None], (4,), (q - half,)), regs[None, i])

    @cute.jit
    def store_weights_t(self, regs: cute.Tensor, dst: cute.Tensor):
        """dst (2D, CHUNK) <- the transpose of what fetch_weights_t put in regs, rounded to TF32."""
        for i, r, q in self.wt_vectors():
            for e in cutlass.range_constexpr(4):
                dst[4 * q + e, r] = tf32_operand(regs[e, i])


@cute.jit
def store_cta_sum(value: Float32, sRed: cute.Tensor, tid: Int32, store: Callable):
    """The CTA's sum of `value` over its THREADS threads in a fixed order (each warp's shuffle
    sum, then thread 0 adds the warps' sums in warp order through sRed [THREADS // 32]);
    thread 0 passes it to store(total). Bit-identical from run to run. Ends after a barrier
    that every thread reaches."""
    warp_sum = cute.arch.warp_reduction(value, operator.add)
    if tid % 32 == 0:
        sRed[tid // 32] = warp_sum
    cute.arch.barrier()
    if tid == 0:
        total = sRed[0]
        for i in cutlass.range_constexpr(1, THREADS // 32):
            total = total + sRed[i]
        store(total)
