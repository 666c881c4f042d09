"""Mamba2 temporal layer on the GPU (spec LAYERS.md section 1): forward and full backward.

Two implementations, picked by `impl`:

"fused"  One kernel per direction, each reading h_hist from global memory exactly once.
         A CTA owns a tile of TILE_ROWS = 64 consecutive rows of h_hist viewed as [B*K, SH2],
         i.e. Bt = 64 // K whole samples, so the K-step window of every sample it scans lies
         in that CTA. Both kernels are persistent (tiles cta, cta + grid, ...).
         Forward: walks SH2 in CHUNK = 64 column steps; 128-bit loads of the next chunk go
         to registers while the tensor cores multiply the current one (during a tile's last
         chunk, the next tile's first: in flight through the scan) (a|u = h_hist @
         [W_A|W_B]: TF32 as one warpgroup's wgmma, M = TILE_ROWS, N = 2D, both operands
         read by the tensor cores straight from 128B-swizzled shared memory); W_A|W_B and
         W_C sit in shared memory for the CTA's life where two CTAs per SM still fit (the
         defaults). c = h @ W_C is FFMA, 4 states of a sample per
         thread (_StateProduct), put in shared memory for the scan: one thread per (sample,
         state) pair runs that pair's scan from the a|u tile in shared memory; ctx is a
         shuffle over the sample's D lanes; out = h + ctx * w.
         Backward: cp.async brings the whole 64 x SH2 h_hist tile into shared memory (no
         registers held, 64 KB in flight per CTA at the defaults; TF32: 16-byte copies
         straight into the 128B-swizzled K-major layout that wgmma reads), each 64-column
         chunk of the next tile issued during phase 3 as soon as that chunk is free; a|u
         (TF32: wgmma as in the forward), c and dctx = dout @ w as in the forward; the
         forward scan is recomputed in registers and
         the reverse scan writes da|du over a|u; then, per SH2 chunk, dh_hist = [da|du] @
         [W_A|W_B]^T and [dW_A|dW_B] += h_hist^T @ [da|du] (tensor cores, h_hist still in
         shared memory), dh = dout + dc @ W_C^T and dW_C += h^T dc (TF32: mma.sync, one
         CTA half each; fp32: FFMA, 4 outputs a thread) and dw += ctx^T dout. Each CTA
         (one an SM) accumulates its tiles' weight gradients in registers, in tile order,
         and writes them once, to its own row of a partials array; `column_sum` then
         sums the rows in a fixed order, in one launch. No float atomics: bit-identical runs.
         TF32, where they fit beside the tile (the defaults; FusedBackward.resident): W_A|W_B
         and W_C staged in shared memory once a CTA, in every layout the products read,
         instead of once a chunk and phase.
"seed"   The trainer's plan, kernel by kernel: foxcute.kernels.gemm GEMMs for a|u and c, a
         batch-parallel scan (one thread per (sample, state)) giving ctx, a readout kernel;
         backward: a reverse-scan kernel giving [da|du], dc, ctx and dsigma partials, then
         GEMMs for [dW_A|dW_B] = h_hist^T [da|du], dW_C = h^T dc, dw = dout^T ctx (split over
         the batch, partials summed by `column_sum`), dh_hist = [da|du] [W_A|W_B]^T and
         dh = dout + dc W_C^T. Independent launches run in two lanes (a second stream, a
         parallel branch in a CUDA graph): c beside the projection; the input gradients
         (dh, dh_hist) beside the batch reductions (dW_C and dw, dsigma, dW_A|dW_B).

Matrix products run on TF32 tensor cores for precision="tf32": a|u (forward and backward) on
Hopper's warpgroup MMA (wgmma, foxcute.kernels._wgmma: no fragment loads, the operands'
descriptors point into shared memory), every other product on warp-level mma.sync m16n8k8 (fragments
loaded from shared memory, B 64 bits at a time, see _mma_smem); operands rounded to nearest
TF32 once when staged into shared memory (gemm.tf32_operand: half an ulp added, the tensor
cores' truncation completes it; through registers, or in place where the backward's cp.async
h and dout have landed), except the backward's h_hist tile, which its a|u and dW products
read as cp.async wrote it (truncated: see FusedBackward). precision="fp32" runs every product as exact
float32 FFMA through the same CuTe tiled-MMA partitioning as mma.sync, so that tile code is
shared. The scans, c, dctx and every reduction are float32 FFMA in both modes.

Registers (ptxas 13.0 for sm_90a, on the CPU): at the defaults nothing spills except the fp32
backward (~40 bytes, per-tile bookkeeping outside the chunk loops). The backward's weight
gradients held in registers for the whole launch (255 a thread at one CTA an SM) spill
~0.4-1.3 KB at SH2 = 512, D = 32 (the RMW of a partials row each tile, at two CTAs an SM,
spilled none there); those sizes are correct (GPU tests), not tuned. Over the supported range
(K in {1, 3, 8, 16}, D in {8, 16, 32}, SH2 in {64, 256, 512}, both kernels and precisions:
144 configurations) ptxas spills in 30, 26 of them the backward; the most at K = 1, D = 32,
where a thread carries 8 (sample, state) pairs through the scans (~0.8 KB even at 255
registers). Those sizes are tested for correctness, not tuned.
"""

from __future__ import annotations

import operator
from typing import Any

from . import _cute
from ._cute import CompiledCache, compile_kernel, fake_ptr, fake_stream, gmem_ptr

import cuda.bindings.driver as cuda  # noqa: E402  (after _cute: it sets the target arch)
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32, const_expr  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402

from .._arrays import Checker, FoxcuteInputError, array_kind, empty, side_lane, sm_count  # noqa: E402
from .._layer import KernelContract  # noqa: E402
from . import _wgmma  # noqa: E402
from .gemm import load_bits, load_tf32, store_pair, tf32_operand  # noqa: E402

IMPLS = ("fused", "seed")
PRECISIONS = ("tf32", "fp32")

THREADS = 256
TILE_ROWS = 64  # rows of h_hist [B*K, SH2] per CTA tile
CHUNK = 64  # SH2 columns per main-loop step
SUPPORTED_D = (8, 16, 32)
MAX_K = 16
MAX_SH2 = 512
SMEM_PER_SM = 228 * 1024 - 2 * 1024  # per SM, less 1 KB the driver reserves per CTA
DEFAULTS = dict(B=8192, K=8, SH2=256, D=16)
CONTRACT = KernelContract(passes=("forward", "backward"), options={"impl": IMPLS, "precision": PRECISIONS},
                          sized_by=("impl",))


def check_sizes(chk: Checker, impl: str) -> None:
    """Reject sizes the kernels do not support, before anything is launched. Supported, for
    both impls: D in {8, 16, 32}; SH2 a multiple of 64 from 64 to 512; K from 1 to 16; any
    B >= 1 with B*K*SH2 < 2**31."""
    chk.dim_range("K", 1, MAX_K, "a CTA tile holds whole K windows of at least 4 samples")
    chk.dim_range("SH2", CHUNK, MAX_SH2, "the backward keeps a 64 x SH2 h_hist tile in shared memory")
    chk.dim_multiple("SH2", CHUNK, "the kernels step through SH2 in 64-column chunks")
    D = chk.dims["D"]
    if D not in SUPPORTED_D:
        raise FoxcuteInputError(f"{chk.where}: D={D} is not supported; the kernels take D in "
                                f"{SUPPORTED_D} (one state per lane in groups of D lanes)")
    elements = chk.dims["B"] * chk.dims["K"] * chk.dims["SH2"]
    if elements >= 2**31:
        raise FoxcuteInputError(f"{chk.where}: h_hist has {elements} elements; the kernels index "
                                f"with 32-bit integers (B*K*SH2 < 2**31)")


# ----------------------------------------------------------------------------------------
# shared building blocks (called while tracing a kernel)


def _tiled_mma(tf32: bool, warps_m: int = 4, warps: int = THREADS // 32) -> cute.TiledMma:
    """The MMA of the fused kernels' products (M a multiple of 16 warps_m, N of
    8 (warps / warps_m)).

    tf32: `warps` warps as warps_m (M) x warps / warps_m (N), each warp issuing m16n8k8
    mma.sync (all 8 of the CTA, or 4 for the backward's dh and dW_C, one CTA half each).
    fp32: one FMA per thread and step over a 16 x 16 thread grid; a warp covers 8 rows x 4
    columns, so the A values it reads from shared memory are 8 distinct rows (conflict-free
    at a row pitch of 4 mod 32) and its B values 4 distinct columns."""
    if tf32:
        return cute.make_tiled_mma(cute.nvgpu.warp.MmaTF32Op((16, 8, 8)),
                                   cute.make_layout((warps_m, warps // warps_m, 1)))
    return cute.make_tiled_mma(
        cute.nvgpu.MmaUniversalOp(Float32),
        cute.make_layout(((8, 2), (4, 4), 1), stride=((1, 32), (8, 64), 0)),
    )


def _pair_pitch(width: int, tf32: bool) -> int:
    """Row pitch (words) of a tile `width` (a multiple of 16) wide that a TF32 B operand
    reads with K along its columns in 64-bit pairs (W for dh_hist): 8 mod 16, so a warp's
    pair loads (8 rows g x 4 lane pairs t at g * pitch + 2t) fall on disjoint banks in each
    half-warp. fp32: 4 mod 16 (conflict-free FFMA reads, see _tiled_mma)."""
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
    they are where rounded when staged, else rounded here: gemm.load_bits / load_tf32)."""
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
    banks (D = 16, split 4: rows k, k + 2, 2 wavefronts a quarter-warp instead of 1: 3/4 of
    the forward's excess wavefronts in ncu). A pitch of W mod 2W words, W = the words a
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


@cute.jit
def _sigmoid(a: Float32) -> Float32:
    """sigmoid(a) from e = exp(-|a|) in (0, 1], which never overflows: 1/(1+e) for a >= 0,
    e/(1+e) below (full relative accuracy on both flat ends)."""
    e = cute.math.exp(-cute.math.abs(a))
    r = _reciprocal_1_to_2(Float32(1.0) + e)
    sig = r
    if a < Float32(0.0):
        sig = e * r
    return sig


@cute.jit
def _sigmoid_slope(a: Float32) -> Float32:
    """sigmoid'(a) = sigmoid(a) * sigmoid(-a) = e/(1+e)^2 with e = exp(-|a|). The textbook
    s * (1 - s) rounds 1 - s to 0 in float32 once a > ~17, while the true slope is ~exp(-a)
    (1e-13 at a = 30); this form keeps full relative accuracy for every a."""
    e = cute.math.exp(-cute.math.abs(a))
    r = _reciprocal_1_to_2(Float32(1.0) + e)
    return e * r * r


@cute.jit
def _reciprocal_1_to_2(v: Float32) -> Float32:
    """1/v for v in [1, 2]: rcp.approx (one MUFU.RCP, within 1 ulp here: v and 1/v are normal
    numbers). IEEE division is MUFU.RCP, two Newton FFMAs and a branch to a slow path for
    operands that v never is; the branch fences every sigmoid of a scan into its own region,
    so the K independent sigmoids of a (sample, state) pair did not overlap."""
    return cute.arch.rcp_approx(v)


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
        conflicts (bank model: a warp's word addresses; the forward's staging at the CTA's start was
        ~15% of its excess wavefronts in ncu). CHUNK * 2D / 4 = 32 D vectors: whole slots."""
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


def _partial_width(SH2: int, D: int) -> int:
    """Columns of the [num_ctas, width] partials array: the weight-gradient entries rounded
    up to whole float4 vectors, so column_sum sums every column block in one launch."""
    return -(-_num_weights(SH2, D) // 4) * 4


def _num_weights(SH2: int, D: int) -> int:
    """Entries of the flat weight gradient [dW_A | dW_B | dW_C | dw | dsigma]."""
    return 3 * SH2 * D + SH2 + 1


# ----------------------------------------------------------------------------------------
# fused forward


class FusedForward(_TileCopies):
    """out = h + ctx * w, with a|u, c, the scan and ctx computed per 64-row tile.

    Persistent: each CTA walks tiles cta, cta + num_ctas, ... Where two CTAs' shared memory
    allows (the defaults), W_A|W_B and W_C are loaded into shared memory once per CTA instead
    of once per tile (per tile they would cost 3/4 of the h_hist tile's traffic in L2 reads).

    TF32 a|u: the last warpgroup issues 8 m64n(2D)k8 wgmmas per chunk (A = the h_hist chunk,
    B = [W_A|W_B]^T, both K-major and 128B-swizzled, rounded as they are stored): the
    mma.sync version's fragment loads, 48 ld.shared per thread and chunk at the defaults and
    2/3 of the kernel's shared-memory instructions, were what bound it (ncu: the L1/shared
    pipe the busiest unit, short-scoreboard waits the largest stall).

    Bank conflicts (ncu at the defaults, TF32: 1,382,400 of 4,412,416 shared wavefronts were
    excess; a bank model of every shared access, a warp's word addresses per instruction,
    reproduces that count exactly), wavefronts a warp instruction before -> after,
    instructions a tile: the c product's 128-bit W_C loads 8 -> 4 (256; W_C pitch D ->
    _StateProduct.w_pitch = 24 where the weights stay resident with it), the W^T staging's
    scalar stores at a CTA's start 4 -> 1 (256 a CTA; wt_vectors' mapping); left: a|u
    accumulator stores and the scan's a|u reads at pitch 2D + 4, 2 each (64 + 64), W_C
    staging 4 -> 8 (32 a CTA). Excess 1.38M -> 0.16M: 28% of all wavefronts gone.
    Measured (H200): 40.0 us (run 20261129T190653Z, mma.sync a|u) -> 32.3 us (run
    20261129T204705Z, wgmma a|u and these layouts; 1.64x the floor, target 1.5x). Each of
    the two changes gained about half of what its count predicted (GPU check scripts, not
    committed): the shared-memory pipe is not the only limit.
    Then the scans' reciprocals by rcp.approx (_reciprocal_1_to_2) and the staged TF32
    operands by gemm.tf32_operand: 32.6 -> 30.3 us (runs 20261129T223000Z ->
    20261129T235914Z; 1.54x the floor). What is left (source-level ncu, per-SASS-instruction
    stall samples): the warps wait on the h_hist loads (long scoreboard, a quarter of the
    samples) and at each chunk's closing barrier (another quarter). The next chunk is the only
    one in flight: it is held in registers (16 a thread), and at 128 registers (2 CTAs an SM)
    there is no room for a second; going deeper means cp.async or TMA into more shared-memory
    stages, rounded in place as the backward does. What was done instead: the next chunk's
    loads issued before the chunk's barrier, so that they fly through its wait too (predicted
    -0.5..1.5 us, bit-identical): 30.3 -> 29.4 us (run 20261130T000948Z; 1.49x the floor). The
    c product split 8 ways instead of 4 (all 256 threads in it at the defaults, against the
    barrier waits) measured no faster on top of that (GPU check script, not committed; it
    had been predicted -0.3..1 us): the closing barrier's waits are not the c product's
    imbalance. Not kept.
    Tried since, measured graph-replayed at the defaults against this version in the same
    H200 call (GPU check scripts, not committed), neither kept:
    - a cp.async ring at one CTA an SM (5 stages: a whole tile, 74 KB, in flight; one barrier
      a chunk), predicted 23-26 us from the 80 KB an SM streams a tile and a ~1.7 us chain
      counted from the code: 29.95 -> 39.97 us (correct: tests/test_gpu_mamba2.py -k fused
      passed). The chain was the miss: one CTA walks each tile's chunks, scan and output in
      series, ~5.2 us a tile, which an SM's second CTA hides here;
    - at two CTAs an SM, the h_hist and h chunks alternating between two buffers, so that
      each chunk's closing barrier goes: 29.5 -> 31.5 us, outputs bit-identical at 9 sizes
      (tf32, fp32, saturated gates, sigma = 0). Not analysed; the closing barrier keeps the
      last warpgroup's wgmma wait and the other warps' next loads in step."""

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
        # the device for it otherwise). fp32 is launched as before.
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
            tiled = _tiled_mma(False)
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
                # chunk's products (ncu: the warps waited on these loads, long scoreboard,
                # for a quarter of the samples, and at the barriers for another quarter)
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


# ----------------------------------------------------------------------------------------
# fused backward


class FusedBackward(_TileCopies):
    """All seven gradients; weight gradients as per-CTA partials (see module docstring).

    TF32 a|u recompute: the last warpgroup issues 8 m64n(2D)k8 wgmmas per chunk, A = the
    h_hist chunk as cp.async left it (128B-swizzled), B = [W_A|W_B]^T stored
    transposed and rounded; dW = h_hist^T [da|du] stays mma.sync (h_hist^T is MN-major, which
    TF32 wgmma does not take) and reads the swizzled tile with its K (tile rows) relabeled by
    _k_pairs_view, so that a warp's loads hit 32 distinct banks.
    Shared-memory wavefronts per 64-row tile at the defaults (8 warps, 4 chunks; counted from
    the code and a bank model of the warps' word addresses), mma.sync version -> this one:
    a|u 2048 (per warp and chunk 32 scalar W^T loads + 16 64-bit h_hist pair loads of 2) -> 0
    (the tensor cores read 24 KB a chunk themselves, 64 KB through the LSU before); its W
    staging 64 a chunk either way (2 float4 stores a thread -> 8 conflict-free scalar stores
    of the transpose); dW 3072 (per warp and chunk 32 A loads of 1 + 32 B loads of 2: [da|du]^T
    at rows t, pitch 2D + 4, 2-way) -> 2048 (both 1); dh_hist 1536 unchanged. Products 6656 ->
    3584 of ~11.8k in all (the c product, dh, dW_C, staging, in-place rounding ~5.1k): ~20% of
    the kernel's shared-memory traffic; the products' ld.shared a thread and chunk 144 -> 96.
    Expected (shared-memory bound at 83.5% L1 throughput): 147 -> ~120-135 us graph-replayed.
    Then bank conflicts (the bank model of FusedForward's docstring), wavefronts a warp
    instruction before -> after, instructions a tile: the c product's 128-bit W_C loads 8 -> 4
    (256; W_C pitch D -> _StateProduct.w_pitch = 24 where 2 CTAs an SM still fit with it),
    W_C staging 4 -> 8 (32, +128): ~-900 of ~11k a tile, expected ~2-4%. Measured (H200):
    147 us (run 20261129T190653Z) -> 131 us (run 20261129T204705Z, both changes; 3.31x the
    floor, target 1.5x); the wgmma change gained about half of its prediction, the layouts
    about what theirs said (GPU check scripts, not committed). Left: the scans' a|u reads and
    da|du stores (2-way, 160 a tile), W_C^T staging (2-way, 128; a 16-rows x 2-float4 W_C
    staging mapping, conflict-free in both phases, cost 8 bytes of spills at 128 registers).
    dctx's dout and w loads are already 128-bit (LLVM
    merges the 4 scalar reads), conflict-free.
    dh_hist on wgmma too (a swizzled K-major copy of da|du as A, the W chunk swizzled as B)
    was built and measured on the H200 (GPU check script, not committed): dh_hist bit-identical
    to this mma.sync version at six sizes, but the backward slower at the defaults (not
    analysed further; the da|du copy and its barriers are the likely cost); not kept.
    Source-level ncu (per-SASS-instruction stall samples) then showed the MIO queue the
    largest stall (a quarter of the samples) and half of them in the per-chunk loop of phase
    3, where dh_hist went out as 16 scalar STG a thread and chunk (the compiler did not merge
    the accumulator pairs (g, 2t), (g, 2t + 1)). Stored as 8 64-bit pairs, with the staged
    TF32 operands rounded by gemm.tf32_operand (one instruction less an element, products
    bit-identical): predicted -2..4 us from the instruction counts; measured 133 -> 115 us
    (runs 20261129T223000Z -> 20261129T235914Z; 2.93x the floor). The stores were dearer
    than their instruction count: each scalar STG wrote every other word of its sectors.
    Both runs compare the whole kernel, the fast sigmoids (see _sigmoid) included.
    Then dh = dout + dc W_C^T and dW_C += h^T dc, the per-chunk FFMA products (a large share
    of the chunk loop's stall samples in an ncu source profile; dh in half of the threads,
    2D + 1 shared loads and 4D FFMAs per 4 outputs), moved to mma.sync, dh on the first CTA
    half and dW_C on the other (dh_and_dwc_mma; h, W_C and dc rounded where staged, dc at
    pitch D + 4 for conflict-free A reads): per warp and chunk ~100 instructions -> ~45, and
    ~340 -> ~210 shared wavefronts a CTA; predicted -4..10 us. Measured 115 -> 110 us
    graph-replayed (runs 20261130T000948Z -> 20261130T011856Z; 2.78x the floor), the kernel
    105.7 -> 98.0 us in the step breakdown. dh and dW_C are now TF32 products (they moved by
    TF32 rounding, within the tolerance at the defaults and 12 odd sizes), every other output
    bit-identical (GPU check script). ptxas spills over the supported range fell from 11 to 7
    of the 36 TF32 configurations (sWCt is gone).
    dW on one warpgroup's wgmma, A = h_hist^T in registers (RS: an H200 probe confirmed the
    fragment layout), B = a K-major swizzled [da|du]^T written by the scan, dh and dW_C on
    the other half (branch wip/m2-dw-wgmma-rs): predicted -3..8 us from the shared loads it
    saves (64 a thread and chunk on 8 warps -> 32 on 4); bit-identical outputs, but slower
    in the GPU check, and its 9 KB more shared memory no longer fit K = 1, SH2 = 512, D = 32.
    Not kept. Not analysed (the device time was spent); a likely cause is the chunk's
    critical path: the dW half's fragment loads and two waited wgmma groups (its 32 A
    registers at once made ptxas spill) against the other half's three products.
    Then what the 98 us kernel spends its time on (H200, session 13, GPU check scripts, not
    committed; graph-replayed kernel alone, one stage left out at a time, results wrong): no
    per-chunk weight loads -6.2 us, nor their shared stores -7.2, no in-place rounding of
    h_hist -3.5, no dh_hist product -3.3, no dW product -3.3; the same kernel at one CTA an
    SM +11.5, and at one CTA with no weight staging +1.1. ncu (--set full, clocks free): L1
    throughput 81.8%, 3.8 warps a scheduler, 0.53 eligible, issue 30% busy; stalls long
    scoreboard 21% (the largest single one: dW's add of the partials' old values, loaded
    from L2 just before), MIO 18%, barrier 15%. So no one stage binds; the RMW of the
    partials row and the per-chunk weight loads are latencies that the second CTA hides.
    Loading the old partials before dh_hist instead (more time to arrive) and issuing phase
    3's first chunk during phase 2: no change (98.8, 99.5 us against 98.7).
    Hence one CTA an SM, with its weight gradients in registers for the whole launch (no
    per-tile RMW of the 50 KB partials row, half the partial rows for column_sum) and, in
    TF32 where they fit, the weights resident (`resident`: 4 * SH2 * (2D + w_pitch3 + 2
    wc_pitch) bytes more, staged once a CTA by stage_weights, all loads in flight at once).
    Measured, the whole backward (kernel + column_sum, graph-replayed, same H200 call):
    two CTAs, RMW (before) 109.6-110.0 us; one CTA, partials in registers 111.9-112.4;
    both and resident weights 105.0-105.1 (-4%; outputs bit-identical to the one-CTA
    version, within the tolerances at 7 sizes). Predicted from the variants: ~-10 kernel
    us; about half of it came. (That check ran dh with W_C rounded at its fragment loads;
    this version keeps a rounded copy, sWCr, the same bits without cvt.rna in the loop.)
    Papermill run 20261202T004230Z (the version before h and dout resident): the backward
    104 us graph-replayed (2.61x its floor; 109 in run 20261201T224219Z), in the step
    breakdown FusedBackward 94.3 us (97.2) and its column_sum 6.8 (8.8).
    Then, where that still fits beside them (`rows_resident`: the defaults, 224 KB of the
    SM's 226), the tile's whole h and dout in shared memory too, brought by cp.async in each
    h_hist chunk's group (the next tile's as phase 3 frees each chunk), so that no chunk of
    either phase waits on a global load through registers; phase 3 rounds h into its chunk
    buffer from there. No trusted prediction (the per-chunk h/dout loads are ~4 KB a chunk;
    what their latency cost at one CTA an SM was the open question). Measured, the whole
    backward (GPU check script, not committed; graph-replayed, same H200 call): 104.8-105.3
    us before, 90.7-90.8 with h and dout resident, 103.7-104.0 with the gate forced off
    (outputs bit-identical run to run, errors equal to before's at 7 sizes, tf32 and fp32).
    Papermill run 20261202T013119Z (that version): the backward 90.7 us (2.3x its floor), in
    the step breakdown FusedBackward 82.3 us.
    Then, with h and dout resident, phase 1 has nothing rewritten between chunks (each has
    its own buffers, rounded in place by the threads that copied them), so its closing
    barrier a chunk goes, and h is rounded once a tile in place, in phase 2 (phase 1's c
    product read it as it is), so phase 3's staging barrier a chunk goes too (8 of ~18
    barriers a tile; predicted ~-3 us), and with it the h and dout chunk buffers (220 KB at
    the defaults). Measured (same H200 call, whole backward graph-replayed): 90.4-90.7 ->
    89.0 us; tests/test_gpu_mamba2.py -k fused passed; compute-sanitizer memcheck and
    racecheck clean at two multi-tile sizes (more tiles than CTAs).
    Measured and not kept (branch wip/coop-finish, GPU check scripts): the column_sum launch
    replaced by a finish in this kernel, its persistent CTAs meeting at one counter
    (cooperative launch) and each summing a slice of the columns over the partial rows in
    CTA order. Predicted ~-4..5 us (the column_sum is 6.9 us in the step breakdown); the
    backward alone 89.5-89.8 -> 85.4-85.7 us, but the two-lane step 255 -> 276 us: the
    cooperative launch waits until all its CTAs fit, which they do only once the main lane's
    kernels have left the SMs. Without it, the wait could deadlock against
    KMajorWeightGrad's (both partly resident, each waiting for its own missing CTAs).
    Then the column_sum launched as this kernel's programmatic dependent (PDL; the trigger
    after the tile loop, column_sum.ColumnSum's wait before its loads), which needs no
    co-residency: predicted -1..2 us. Measured (H200, one session): foxcute.compare, the
    backward graph-replayed, 89.26 / 89.36 -> 88.69 / 88.60 us (bit-identical outputs);
    the two-lane step (A/B script, 3 rounds) 254.6-255.6 -> 254.7-255.8 us, unchanged;
    papermill run 20261202T211504Z: the backward 88.7 us (2.24x its floor).
    Then h_hist no longer rounded to nearest TF32 in place: its products (a|u recomputed, dW)
    read it as cp.async wrote it and the tensor cores truncate it, a relative error of up to
    2^-10 an element, biased toward zero (rounding: up to 2^-11, unbiased). The in-place pass
    (a load, 4 roundings and a store per float4, 64 KB a tile at the defaults) was 3.5 us of the 98 us kernel
    in the leave-one-out above; predicted here -2..3.5 us, and the dW and recomputed-gate
    errors up by about 2^-11 relative (~5e-4), within the 2e-3 tolerance. Measured (H200,
    foxcute.compare, the backward graph-replayed, same call, 2 rounds): 87.8 / 87.6 -> 82.2 /
    82.3 us, the largest relative error 4.4e-4 -> 8.0e-4 (repeatable); papermill run
    20261203T162501Z: 81.7 us, 2.04x its floor. The gain beat the prediction: the 3.5 us came
    from the two-CTA kernel, where the second CTA hid part of the pass; at one CTA an SM it
    sat between each chunk's wait and its barrier (likely, not analysed).
    """

    def __init__(self, K: int, SH2: int, D: int, precision: str):
        self.K, self.SH2, self.D = K, SH2, D
        self.tf32 = precision == "tf32"
        self.samples = TILE_ROWS // K
        self.pairs = _slots(self.samples * D)
        self.c_product = _StateProduct(self.samples, D)
        self.L = _num_weights(SH2, D)
        self.width = _partial_width(SH2, D)
        self.au_pitch = 2 * D + 4  # as before: dh_hist's A reads (g, t) at g * pitch + t, conflict-free
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
        self.w_pitch3 = _pair_pitch(2 * D, True)  # 8 mod 16, what fp32 used already
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

    @cute.kernel
    def kernel(self, mDout: cute.Tensor, mHist: cute.Tensor, mH: cute.Tensor, mWA: cute.Tensor,
               mWB: cute.Tensor, mWC: cute.Tensor, mw: cute.Tensor, mP: cute.Tensor,
               mDHist: cute.Tensor, mDH: cute.Tensor, sigma: Float32, batch: Int32, num_ctas: Int32):
        K, SH2, D, Bt = self.K, self.SH2, self.D, self.samples
        n_chunks = SH2 // CHUNK
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
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
        # TF32: each thread's running dsigma sum, touched once a tile: as a register it was the
        # one value ptxas spilled at the 128-register cap (to local memory, slower than this)
        sDsigma = smem.allocate_tensor(Float32, cute.make_layout((THREADS,)), 16) if const_expr(self.tf32) else None
        # [da|du]^T (2D, TILE_ROWS) for dW
        sAUt = cute.make_tensor(sAU.iterator, cute.select(sAU.layout, mode=[1, 0]))

        rW = cute.make_rmem_tensor(cute.make_layout((4, _slots(CHUNK * 2 * D // 4))), Float32)
        rH = cute.make_rmem_tensor(cute.make_layout((4, _slots(Bt * CHUNK // 4))), Float32)
        rDout = cute.make_rmem_tensor(cute.make_layout((4, _slots(Bt * CHUNK // 4))), Float32)
        rWC = cute.make_rmem_tensor(cute.make_layout((4, _slots(CHUNK * D // 4))), Float32)

        tiled = _tiled_mma(self.tf32)
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
            tiled_au = _tiled_mma(False)
            thr_au = tiled_au.get_slice(tid)
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
            tiled_dh = _tiled_mma(True, warps_m=1, warps=4)
            tiled_wc = _tiled_mma(True, warps_m=4, warps=4)
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
            for kc in cutlass.range_constexpr(n_chunks):
                acc_wc.append(cute.make_rmem_tensor(cute.make_layout((n_wc, 4)), Float32))
                acc_wc[kc].fill(0.0)
        dsigma = Float32(0.0)  # fp32's running sum (its register allocation is left as it was)
        if const_expr(self.tf32):
            sDsigma[tid] = dsigma
        slice_k = CHUNK // D  # columns of dout @ w each lane of a sample's D-lane group sums

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

            # ---- phase 1: a|u = h_hist @ [W_A|W_B] (h_hist tile stays), c = h @ W_C, dctx = dout @ w
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
                    # it to TF32 rather than round it (see the class docstring, last paragraph)
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

            # ---- phase 2: forward scan recomputed, reverse scan; da|du overwrite a|u in place
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

            # ---- phase 3, per SH2 chunk: dh_hist, [dW_A|dW_B], dh, dW_C, dw
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
                    # one 64-bit store each (the backward's largest stall in ncu was its MIO
                    # queue while dh_hist went out element by element)
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
        warp_sum = cute.arch.warp_reduction(dsigma, operator.add)
        if tid % 32 == 0:
            sRed[tid // 32] = warp_sum
        cute.arch.barrier()
        if tid == 0:
            total = sRed[0]
            for i in cutlass.range_constexpr(1, THREADS // 32):
                total = total + sRed[i]
            mP[cta, self.L - 1] = total
            for pad in cutlass.range_constexpr(self.L, self.width):  # summed too: keep them zero
                mP[cta, pad] = Float32(0.0)


# ----------------------------------------------------------------------------------------
# seed: the trainer's plan (projection and weight-gradient GEMMs are foxcute.kernels.gemm)


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
        warp_sum = cute.arch.warp_reduction(dsigma, operator.add)
        if tid % 32 == 0:
            sRed[tid // 32] = warp_sum
        cute.arch.barrier()
        if tid == 0:
            total = sRed[0]
            for i in cutlass.range_constexpr(1, THREADS // 32):
                total = total + sRed[i]
            mDsig[bid] = total


# ----------------------------------------------------------------------------------------
# host side

_COMPILED = CompiledCache()

# kind -> (kernel from (K, SH2, D, precision), pointer arguments, has sigma, int arguments)
_KERNELS = {
    "fused_forward": (lambda K, SH2, D, p: FusedForward(K, SH2, D, p), 7, True, 2),
    "fused_backward": (lambda K, SH2, D, p: FusedBackward(K, SH2, D, p), 10, True, 2),
    "seed_scan_forward": (lambda K, SH2, D, p: SeedScanForward(K, D), 3, True, 1),
    "seed_readout": (lambda K, SH2, D, p: SeedReadout(SH2), 4, False, 1),
    "seed_scan_backward": (lambda K, SH2, D, p: SeedScanBackward(K, SH2, D), 8, True, 1),
}
_PRECISION_FREE = ("seed_scan_forward", "seed_readout", "seed_scan_backward")  # no matrix products


def _fake_args(kind: str) -> tuple:
    _, n_ptrs, has_sigma, n_ints = _KERNELS[kind]
    sigma = (Float32(1.0),) if has_sigma else ()
    return (*(fake_ptr() for _ in range(n_ptrs)), *sigma, *(Int32(1) for _ in range(n_ints)),
            fake_stream())


def _compiled(kind: str, K: int, SH2: int, D: int, precision: str, keep: bool = False) -> Any:
    if kind in _PRECISION_FREE:
        precision = "fp32"

    def build() -> Any:
        return compile_kernel(_KERNELS[kind][0](K, SH2, D, precision), *_fake_args(kind), keep=keep)

    return _COMPILED.get((kind, K, SH2, D, precision, keep), build)


def compiled_for_ci() -> dict[str, Any]:
    """Every kernel of this module at the default sizes, compiled with PTX kept (the seed's
    GEMMs are foxcute.kernels.gemm's, checked by its own compile test)."""
    K, SH2, D = DEFAULTS["K"], DEFAULTS["SH2"], DEFAULTS["D"]
    out = {}
    for kind in _KERNELS:
        for precision in (("fp32",) if kind in _PRECISION_FREE else PRECISIONS):
            name = kind if kind in _PRECISION_FREE else f"{kind}_{precision}"
            out[name] = _compiled(kind, K, SH2, D, precision, keep=True)
    return out


def _sizes(where: str, h_hist: Any, W_A: Any, impl: str) -> tuple[int, int, int, int]:
    """(B, K, SH2, D), after check_sizes: callers that skip foxcute.mamba2 (benchmarks)
    get an error instead of an out-of-bounds launch."""
    chk = Checker(where, gpu=True)
    chk.array("h_hist", h_hist, ("B", "K", "SH2"))
    chk.array("W_A", W_A, ("SH2", "D"))
    check_sizes(chk, impl)
    return chk.dims["B"], chk.dims["K"], chk.dims["SH2"], chk.dims["D"]


def _persistent_ctas(x: Any, num_tiles: int, ctas_per_sm: int) -> int:
    return max(1, min(num_tiles, sm_count(x) * ctas_per_sm))


def forward(h_hist: Any, h: Any, W_A: Any, W_B: Any, W_C: Any, w: Any, sigma: float, *,
            impl: str, precision: str) -> Any:
    """out [B, SH2] of the Mamba2 layer; arrays already validated by foxcute.mamba2."""
    B, K, SH2, D = _sizes("foxcute.kernels.mamba2.forward", h_hist, W_A, impl)
    out = empty(h, (B, SH2))
    if impl == "fused":
        kernel = _KERNELS["fused_forward"][0](K, SH2, D, precision)
        num_ctas = _persistent_ctas(h, -(-B // kernel.samples), kernel.ctas_per_sm())
        fn = _compiled("fused_forward", K, SH2, D, precision)
        fn(gmem_ptr(h_hist), gmem_ptr(h), gmem_ptr(W_A), gmem_ptr(W_B), gmem_ptr(W_C), gmem_ptr(w),
           gmem_ptr(out), Float32(sigma), Int32(B), Int32(num_ctas), _cute.current_stream(h))
        return out
    return _seed_forward(h_hist, h, W_A, W_B, W_C, w, sigma, out, precision)


def backward(dout: Any, h_hist: Any, h: Any, W_A: Any, W_B: Any, W_C: Any, w: Any, sigma: float, *,
             impl: str, precision: str) -> tuple:
    """(dW_A, dW_B, dW_C, dw, dsigma[1], dh_hist, dh); arrays already validated."""
    B, K, SH2, D = _sizes("foxcute.kernels.mamba2.backward", h_hist, W_A, impl)
    if impl == "fused":
        dh_hist = empty(h, (B, K, SH2))
        dh = empty(h, (B, SH2))
        from .column_sum import column_sum

        L = _num_weights(SH2, D)
        kernel = _KERNELS["fused_backward"][0](K, SH2, D, precision)
        num_tiles = -(-B // kernel.samples)
        num_ctas = _persistent_ctas(h, num_tiles, kernel.ctas_per_sm())
        partials = empty(h, (num_ctas, kernel.width))
        fn = _compiled("fused_backward", K, SH2, D, precision)
        fn(gmem_ptr(dout), gmem_ptr(h_hist), gmem_ptr(h), gmem_ptr(W_A), gmem_ptr(W_B), gmem_ptr(W_C),
           gmem_ptr(w), gmem_ptr(partials), gmem_ptr(dh_hist), gmem_ptr(dh), Float32(sigma), Int32(B),
           Int32(num_ctas), _cute.current_stream(h))
        # fixed order over CTAs, every column block in one launch, launched as the kernel's
        # programmatic dependent (see column_sum.ColumnSum)
        grads = column_sum(partials, dependent=True)
        n = SH2 * D
        return (grads[0:n].reshape(SH2, D), grads[n:2 * n].reshape(SH2, D),
                grads[2 * n:3 * n].reshape(SH2, D), grads[3 * n:3 * n + SH2], grads[L - 1:L], dh_hist, dh)
    return _seed_backward(dout, h_hist, h, W_A, W_B, W_C, w, sigma, precision)


def _concat_columns(a: Any, b: Any) -> Any:
    """[a | b] in a's array library."""
    if array_kind(a) == "torch":
        import torch

        return torch.cat((a, b), dim=1)
    import cupy

    return cupy.concatenate((a, b), axis=1)


def _seed_forward(h_hist: Any, h: Any, W_A: Any, W_B: Any, W_C: Any, w: Any, sigma: float,
                  out: Any, precision: str) -> Any:
    """GEMM a|u = h_hist @ [W_A|W_B], GEMM c = h @ W_C (on a side lane, beside it), scan + ctx,
    readout."""
    B, K, SH2 = (int(n) for n in h_hist.shape)
    D = int(W_A.shape[1])
    _, au, c = _seed_projections(h_hist.reshape(B * K, SH2), h, W_A, W_B, W_C, precision)
    ctx = empty(h, (B,))
    stream = _cute.current_stream(h)
    _compiled("seed_scan_forward", K, SH2, D, precision)(
        gmem_ptr(au), gmem_ptr(c), gmem_ptr(ctx), Float32(sigma), Int32(B), stream)
    _compiled("seed_readout", K, SH2, D, precision)(
        gmem_ptr(h), gmem_ptr(ctx), gmem_ptr(w), gmem_ptr(out), Int32(B), stream)
    return out


def _seed_projections(hist: Any, h: Any, W_A: Any, W_B: Any, W_C: Any, precision: str) -> tuple:
    """(W_AB = [W_A|W_B], a|u = hist @ W_AB, c = h @ W_C). c (M = B) runs on a side lane beside
    the concatenation and the projection (M = B*K): alone it is a short, latency-bound launch."""
    from . import gemm

    def projection() -> tuple:
        W_AB = _concat_columns(W_A, W_B)  # [SH2, 2D]
        return W_AB, gemm.matmul(hist, B=W_AB, precision=precision)

    c, (W_AB, au) = side_lane(h).run(lambda: gemm.matmul(h, B=W_C, precision=precision), projection)
    return W_AB, au, c


def _seed_backward(dout: Any, h_hist: Any, h: Any, W_A: Any, W_B: Any, W_C: Any, w: Any, sigma: float,
                   precision: str) -> tuple:
    """The forward's GEMMs again, the reverse-scan kernel, then GEMMs for every gradient in two
    lanes side by side: the batch reductions (dW_C with dw, dsigma's column sum, then
    dW_A|dW_B) on the current stream, the input gradients (dh, then dh_hist) on a side lane.
    The two that move h_hist's size ([B*K, SH2]: dW_A|dW_B reads it, dh_hist writes it) each
    keep DRAM well short of its ceiling alone, so they run together, after the short
    launches, which run together first. Measured on the H200 (GPU check script, not
    committed; graph-replayed): alone, dW_A|dW_B 35.0 us and dh_hist 33.8 (~1.9x their
    floors); the gradient launches together: all on one stream 100.2 us; this
    order 81.7; the long ones first in each lane 98.2 (the short ones then run alone at the
    end); [dW_C+dw, dsigma, dh] beside [dW_A|dW_B, dh_hist] 105.9; three lanes 100.4. The
    whole seed backward: 138.8 us on one stream, 117 in run 20261201T224219Z (2.92x)."""
    from . import gemm
    from .column_sum import column_sum

    B, K, SH2 = (int(n) for n in h_hist.shape)
    D = int(W_A.shape[1])
    hist = h_hist.reshape(B * K, SH2)
    W_AB, au, c = _seed_projections(hist, h, W_A, W_B, W_C, precision)
    dau = empty(h, (B * K, 2 * D))
    dc = empty(h, (B, D))
    ctx = empty(h, (B,))
    num_ctas = -(-B * D // THREADS)
    dsigma_partials = empty(h, (num_ctas, 1))
    _compiled("seed_scan_backward", K, SH2, D, precision)(
        gmem_ptr(dout), gmem_ptr(w), gmem_ptr(au), gmem_ptr(c), gmem_ptr(dau), gmem_ptr(dc),
        gmem_ptr(ctx), gmem_ptr(dsigma_partials), Float32(sigma), Int32(B), _cute.current_stream(h))

    def weight_gradients() -> tuple:
        # dW_C = h^T dc and dw = dout^T ctx reduce the same batch: one launch for both
        dW_C = empty(h, (SH2, D))
        dw = empty(h, (SH2,))
        gemm.weight_grads_into([(h, dc, dW_C, D, None), (dout, ctx.reshape(B, 1), dw.reshape(SH2, 1), 1, None)],
                               precision)
        dsigma = column_sum(dsigma_partials)
        dW_ab = empty(h, (2, SH2, D))  # h_hist^T [da|du]: dW_A = dW_ab[0], dW_B = dW_ab[1]
        gemm.weight_grads_into([(hist, dau, dW_ab, 2 * D, None)], precision)
        return dW_ab, dW_C, dw, dsigma

    def input_gradients() -> tuple:
        dh = gemm.matmul(dc, W_C, epilogue="residual", residual=dout, precision=precision)  # dout + dc W_C^T
        dh_hist = gemm.matmul(dau, W_AB, precision=precision).reshape(B, K, SH2)
        return dh_hist, dh

    (dh_hist, dh), (dW_ab, dW_C, dw, dsigma) = side_lane(h).run(input_gradients, weight_gradients)
    return (dW_ab[0], dW_ab[1], dW_C, dw, dsigma, dh_hist, dh)
