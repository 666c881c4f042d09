"""The warp-level MMA (mma.sync) and the cp.async staging pipeline that feeds it from global
memory: gemm's SkinnyMatmul and WeightGrad and curiosity's row pass run their products on
it; kan and risk_budget take only the MMA (warp_mma) and build their fragments by hand.

    mma_chunks:  acc += A @ B^T over K, in chunks of CHUNK = 32 reduction elements

The MMA. warp_mma builds every kernel's tiled mma.sync: the m16n8k8 TF32 atom on
warps_m x warps_n warps (or, for mamba2's fused fp32 products, one float32 FMA a thread on a
thread grid of the same warps). tile_mma multiplies one staged chunk in that atom's
accumulator layout in one of three modes (MODE maps a precision to one): "tf32" loads the
fragments from shared memory and rounds them there (cvt.rna, _tf32.load_tf32), so shared
memory keeps the exact float32 values that other readers of a staged chunk see (WeightGrad's
bias column sums); "ffma" / "ffma64" compute the same accumulator elements with float32 /
float64 FMAs, so a kernel's epilogue is the same at every precision.

Who stages what. An Operand is one streamed operand: a global [R, C/vec, vec] view and where
its chunk kc lies (a [rows, CHUNK] row block at column vector vec0 + kc*CHUNK/vec, or, read
transposed (along_rows), the CHUNK rows from row0 + kc*CHUNK), with its S-stage staging in
shared memory. Every thread of the CTA (`threads`, THREADS by default) issues cp.async copies
for every chunk (stage_tile): thread tid takes vectors tid, tid + threads, ..., consecutive
threads consecutive vectors of a row (coalesced); a vector is `vec` floats, 16-byte copies
where rows are a multiple of 4 floats, else 4-byte ones, chosen statically. Vectors past the
operand's rows or vectors are zeroed with plain stores, so a partial chunk adds zero products.
B is always streamed; A is streamed too, or resident in shared memory (`a_resident`).
Shared-memory layouts (staging_by_rows / staging_by_columns, or rows_view / columns_view on a
raw buffer that several operands use in turn): [rows, CHUNK] blocks at a row stride of
CHUNK + PAD = 4 (mod 32) banks, and CHUNK rows of a [K, cols] matrix read transposed at
cols + 8 = 8 or 24 (mod 32) banks: both conflict-free for the MMA's fragment reads.

How many stages, and the schedule. S = stages_of(b) buffers an operand (STAGES = 3 by
default; SkinnyMatmul 4). The prologue (start_chunks) issues chunks 0 .. S-2, one cp.async
commit group per chunk, empty past the end. For chunk kc: wait until all but the newest S-2
groups are complete (this thread's copies of chunk kc have landed), barrier (everyone's
have, and everyone has finished chunk kc - 1, so its buffer (kc + S - 1) % S is free), issue
chunk kc + S - 1 into that buffer and commit (always one group, so the count above holds),
multiply chunk kc from buffer kc % S (tile_mma, or the caller's `multiply`), then run the
caller's `after_chunk`. S - 1 chunks are in flight while one is multiplied, with one barrier
a chunk; a closing barrier frees the buffers.

Constraints.
- Every thread of the CTA calls start_chunks and mma_chunks alike (they hold barriers), and
  an Operand's `threads` is the number of threads that do.
- K is bounded only by the operands' extents: elements past num_rows (along_rows) or past
  num_vecs vectors are read as zeros, so no operand needs padding in global memory.
- vec = 4 needs every row 16-byte aligned (a row length a multiple of 4; arrays are
  _cute.ALIGN-aligned).
- A and B have the same depth S >= 2. The staging buffers must be free when a prologue is
  issued (after the previous mma_chunks' closing barrier); with `started`, no other cp.async
  group may be committed between start_chunks and mma_chunks.
- The product's tile is whole atom tiles: A's rows a multiple of 16 warps_m, B's rows of
  8 warps_n (warp_mma's warps); tile_mma has no bounds checks inside a tile.
- Layouts index with 32-bit integers.
- store_pair / load_pair: the column even and the row 8-byte aligned.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32

from ._cute import relu
from ._tf32 import load_tf32

THREADS = 128  # the CTA that stages and multiplies by default: 4 warps
CHUNK = 32  # reduction elements staged in shared memory per step
STAGES = 3  # shared-memory buffers per streamed operand: two chunks in flight during the MMAs
PAD = 4  # floats of row padding: row stride = 4 (mod 32) banks -> conflict-free A/B fragment reads
MODE = {"tf32": "tf32", "fp32": "ffma"}  # precision -> tile_mma mode


def warp_mma(warps_m: int, warps_n: int, tf32: bool = True) -> cute.TiledMma:
    """The warp-level tiled MMA on warps_m warps along M and warps_n along N.

    tf32: the mma.sync m16n8k8 TF32 atom (MmaTF32Op), one a warp: one issue covers a
    (16 warps_m) x (8 warps_n) x 8 tile, repeated over the CTA tile. warp_mma(1, 1) is one
    warp's atom, for fragments built by hand (kan, risk_budget).
    not tf32: one float32 FMA per thread and step (MmaUniversalOp) over a thread grid of
    (8 warps_m) rows x (4 warps_n) columns, a warp 8 rows x 4 columns (lane r + 8c), the
    warps warps_m along M first; at 2 x 4 warps (mamba2's fused fp32 products) the A values a
    warp reads from shared memory are 8 distinct rows (conflict-free at a row pitch of
    4 mod 32) and its B values 4 distinct columns. (gemm's fp32 precision keeps the TF32
    atom's accumulator layout and runs FFMAs on it: tile_mma's "ffma" mode.)"""
    if tf32:
        return cute.make_tiled_mma(cute.nvgpu.warp.MmaTF32Op((16, 8, 8)), (warps_m, warps_n, 1))
    return cute.make_tiled_mma(
        cute.nvgpu.MmaUniversalOp(Float32),
        cute.make_layout(((8, warps_m), (4, warps_n), 1), stride=((1, 32), (8, 32 * warps_m), 0)),
    )


@cute.jit
def tile_mma(tiled_mma: cute.TiledMma, tid: Int32, sA: cute.Tensor, sB: cute.Tensor,
             acc: cute.Tensor, mode: cutlass.Constexpr, a_relu: cutlass.Constexpr = False):
    """acc += f(sA) @ sB^T for sA [bm, CHUNK], sB [bn, CHUNK] (any layouts) in the MMA's
    accumulator layout, f = relu if a_relu else identity. mode: "tf32" one
    TF32 MMA; "ffma" / "ffma64" the same accumulator elements by FFMA / float64 FMA (acc
    Float64)."""
    thr = tiled_mma.get_slice(tid)
    if cutlass.const_expr(mode == "tf32"):
        tCsA = thr.partition_A(sA)
        tCsB = thr.partition_B(sB)
        rA = tiled_mma.make_fragment_A(tCsA[None, None, 0])
        rB = tiled_mma.make_fragment_B(tCsB[None, None, 0])
        for k in cutlass.range_constexpr(cute.size(tCsA, mode=[2])):
            load_tf32(rA, tCsA[None, None, k], a_relu)
            load_tf32(rB, tCsB[None, None, k])
            cute.gemm(tiled_mma, acc, rA, rB, acc)
    else:
        # Accumulator element ((v0, v1), mi, ni) is C[row(v1, mi), col(v0, ni)].
        cC = thr.partition_C(cute.make_identity_tensor((cute.size(sA, mode=[0]), cute.size(sB, mode=[0]))))
        num_mi = cute.size(acc, mode=[1])
        num_ni = cute.size(acc, mode=[2])
        wide = Float64 if cutlass.const_expr(mode == "ffma64") else Float32
        a = cute.make_rmem_tensor((2, num_mi), wide)
        b = cute.make_rmem_tensor((2, num_ni), wide)
        # A runtime loop: fully unrolled, the compiler hoists every shared load of the chunk
        # into registers at once and spills at the widest tile.
        for k in cutlass.range(cute.size(sA, mode=[1]), unroll=2):
            for mi in cutlass.range_constexpr(num_mi):
                for v1 in cutlass.range_constexpr(2):
                    if cutlass.const_expr(a_relu):
                        a[v1, mi] = wide(relu(sA[cC[(0, v1), mi, 0][0], k]))
                    else:
                        a[v1, mi] = wide(sA[cC[(0, v1), mi, 0][0], k])
            for ni in cutlass.range_constexpr(num_ni):
                for v0 in cutlass.range_constexpr(2):
                    b[v0, ni] = wide(sB[cC[(v0, 0), 0, ni][1], k])
            for mi in cutlass.range_constexpr(num_mi):
                for ni in cutlass.range_constexpr(num_ni):
                    for v1 in cutlass.range_constexpr(2):
                        for v0 in cutlass.range_constexpr(2):
                            acc[(v0, v1), mi, ni] = acc[(v0, v1), mi, ni] + a[v1, mi] * b[v0, ni]


class Operand:
    """One operand of a chunked product, streamed from global memory through a double buffer
    in shared memory: chunk kc of it is the block at row row0 + kc*CHUNK (along_rows: CHUNK
    rows of a matrix read transposed) or at column vector vec0 + kc*CHUNK/vec (a [rows, CHUNK]
    row block). `stage3` is the [rows, vecs, vec, 2] staging view, `view` the [n, CHUNK, 2]
    MMA view (see staging_by_rows / staging_by_columns)."""

    def __init__(self, mX, num_rows, row0, vec0, num_vecs, rows, vecs, vec, along_rows, stage3, view,
                 threads=THREADS):
        self.tensors = (mX, stage3, view)
        self.ints = (num_rows, row0, vec0, num_vecs)
        self.static = (rows, vecs, vec, along_rows, threads)


def staging_by_rows(smem, rows: int, vec: int, stages: int = STAGES) -> tuple:
    """`stages`-deep staging for an operand read as [rows, CHUNK] row blocks (A, or B_t):
    (the [rows, CHUNK/vec, vec, stages] staging view, the [rows, CHUNK, stages] MMA view).
    Row stride CHUNK + 4 = 4 (mod 32) banks: conflict-free fragment reads."""
    stride = CHUNK + PAD
    stage3 = smem.allocate_tensor(Float32, cute.make_layout(
        (rows, CHUNK // vec, vec, stages), stride=(stride, vec, 1, rows * stride)), 16)
    view = cute.make_tensor(stage3.iterator, cute.make_layout(
        (rows, CHUNK, stages), stride=(stride, 1, rows * stride)))
    return stage3, view


def staging_by_columns(smem, cols: int, vec: int, stages: int = STAGES) -> tuple:
    """`stages`-deep staging for an operand whose chunks are CHUNK rows of a [K, cols]
    row-major matrix read transposed (B = W for x @ W, or dY^T / X^T in a weight gradient):
    (the [CHUNK, cols/vec, vec, stages] staging view, the [cols, CHUNK, stages] MMA view).
    Row stride cols + 8 = 8 or 24 (mod 32) banks: conflict-free transposed fragment reads."""
    stride = cols + 8
    stage3 = smem.allocate_tensor(Float32, cute.make_layout(
        (CHUNK, cols // vec, vec, stages), stride=(stride, vec, 1, CHUNK * stride)), 16)
    view = cute.make_tensor(stage3.iterator, cute.make_layout(
        (cols, CHUNK, stages), stride=(1, stride, CHUNK * stride)))
    return stage3, view


def rows_view(raw: cute.Tensor, rows: int, vec: int, stage_stride: int) -> tuple:
    """staging_by_rows' two views on a raw shared buffer whose stages are stage_stride apart
    (one buffer can then serve operands of different shapes in turn)."""
    stride = CHUNK + PAD
    stage3 = cute.make_tensor(raw.iterator, cute.make_layout(
        (rows, CHUNK // vec, vec, STAGES), stride=(stride, vec, 1, stage_stride)))
    view = cute.make_tensor(raw.iterator, cute.make_layout((rows, CHUNK, STAGES), stride=(stride, 1, stage_stride)))
    return stage3, view


def columns_view(raw: cute.Tensor, cols: int, vec: int, stage_stride: int) -> tuple:
    """staging_by_columns' two views on a raw shared buffer whose stages are stage_stride apart."""
    stride = cols + 8
    stage3 = cute.make_tensor(raw.iterator, cute.make_layout(
        (CHUNK, cols // vec, vec, STAGES), stride=(stride, vec, 1, stage_stride)))
    view = cute.make_tensor(raw.iterator, cute.make_layout((cols, CHUNK, STAGES), stride=(1, stride, stage_stride)))
    return stage3, view


def stages_of(operand: Operand) -> int:
    """The depth of an operand's staging buffer (the last mode of its MMA view)."""
    return cute.size(operand.tensors[2], mode=[2])


@cute.jit
def stage_tile(mX: cute.Tensor, num_rows: Int32, row0: Int32, vec0: Int32, num_vecs: Int32,
               sX: cute.Tensor, rows: cutlass.Constexpr, vecs: cutlass.Constexpr,
               vec: cutlass.Constexpr, tid: Int32, threads: cutlass.Constexpr = THREADS):
    """Start copying the [rows, vecs*vec] block of mX (viewed [R, C/vec, vec]) at row row0,
    vector vec0 into sX ([rows, vecs, vec] view of shared memory) with cp.async: no registers
    held, and the copy runs while the MMAs of the previous chunk do. Parts out of range are
    zeroed with plain stores. Consecutive threads take consecutive vectors of a row: coalesced
    128-bit loads. The caller commits the group and waits for it."""
    atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32 * vec)
    total = rows * vecs
    for j in cutlass.range_constexpr((total + threads - 1) // threads):
        idx = tid + j * threads
        r = idx // vecs
        q = idx % vecs
        if cutlass.const_expr(total % threads == 0):
            stage_vector(atom, mX, num_rows, row0 + r, vec0 + q, num_vecs, sX, r, q, vec)
        elif idx < total:
            stage_vector(atom, mX, num_rows, row0 + r, vec0 + q, num_vecs, sX, r, q, vec)


@cute.jit
def stage_vector(atom, mX: cute.Tensor, num_rows: Int32, row: Int32, v: Int32, num_vecs: Int32,
                 sX: cute.Tensor, r: Int32, q: Int32, vec: cutlass.Constexpr):
    if row < num_rows and v < num_vecs:
        cute.copy(atom, mX[row, v, None], sX[r, q, None])
    else:
        zero = cute.make_rmem_tensor((vec,), Float32)
        zero.fill(0.0)
        sX[r, q, None].store(zero.load())


@cute.jit
def issue_chunk(mX: cute.Tensor, stage3: cute.Tensor, num_rows: Int32, row0: Int32, vec0: Int32,
                num_vecs: Int32, rows: cutlass.Constexpr, vecs: cutlass.Constexpr,
                vec: cutlass.Constexpr, along_rows: cutlass.Constexpr, threads: cutlass.Constexpr,
                kc: Int32, buf: Int32, tid: Int32):
    if cutlass.const_expr(along_rows):
        stage_tile(mX, num_rows, row0 + kc * CHUNK, vec0, num_vecs, stage3[None, None, None, buf],
                   rows, vecs, vec, tid, threads)
    else:
        stage_tile(mX, num_rows, row0, vec0 + kc * (CHUNK // vec), num_vecs,
                   stage3[None, None, None, buf], rows, vecs, vec, tid, threads)


@cute.jit
def start_chunks(tid: Int32, num_chunks: Int32, a: Operand, b: Operand):
    """mma_chunks' prologue: issue its first S - 1 chunks of a (None: A is resident) and b,
    S the staging depth (stages_of(b); a's is the same), one commit group per chunk (empty
    past the end), so "all but the newest S - 2 groups are complete" always means "chunk kc
    has landed". The staging buffers must be free (no thread still reading them: after
    mma_chunks' closing barrier)."""
    for kc in cutlass.range_constexpr(stages_of(b) - 1):
        if kc < num_chunks:
            if cutlass.const_expr(a is not None):
                issue_chunk(*a.tensors[:2], *a.ints, *a.static, kc, kc, tid)
            issue_chunk(*b.tensors[:2], *b.ints, *b.static, kc, kc, tid)
        cute.arch.cp_async_commit_group()


@cute.jit
def mma_chunks(tiled_mma: cute.TiledMma, tid: Int32, acc: cute.Tensor, mode: cutlass.Constexpr,
               num_chunks: Int32, a: Operand, b: Operand, a_resident: cute.Tensor = None,
               a_relu: cutlass.Constexpr = False, after_chunk=None, multiply=None,
               started: cutlass.Constexpr = False):
    """acc += A @ B^T over num_chunks chunks of CHUNK, software-pipelined over S shared
    buffers (S = stages_of(b); at 3, chunks kc+1 and kc+2 are in flight by cp.async while
    chunk kc is multiplied). A is streamed (`a`) or resident in shared memory (`a_resident`
    [bm, K], a = None); B is always streamed. after_chunk(buf), if given, runs on each
    staged chunk after its MMAs (e.g. a column sum of the staged operand).
    multiply(sA_chunk, sB_chunk, acc), if given, does a chunk's products in place of
    tile_mma (a caller's own fragment path; mode and a_relu are then unused). started: the
    caller has already issued the first chunks (start_chunks with the same operands, no
    other cp.async group committed since), e.g. before an epilogue that does not touch the
    staging buffers, so their latency hides behind it. Ends with a barrier: the buffers are
    free again."""
    b_mX, b_stage3, b_view = b.tensors
    b_num_rows, b_row0, b_vec0, b_num_vecs = b.ints
    b_rows, b_vecs, b_vec, b_along_rows, b_threads = b.static
    streamed_a = cutlass.const_expr(a_resident is None)
    a_mX, a_stage3, a_view = b.tensors
    a_num_rows, a_row0, a_vec0, a_num_vecs = b.ints
    a_rows, a_vecs, a_vec, a_along_rows, a_threads = b.static
    if cutlass.const_expr(streamed_a):
        a_mX, a_stage3, a_view = a.tensors
        a_num_rows, a_row0, a_vec0, a_num_vecs = a.ints
        a_rows, a_vecs, a_vec, a_along_rows, a_threads = a.static
    a_rows_resident = 0
    if cutlass.const_expr(not streamed_a):
        a_rows_resident = cute.size(a_resident, mode=[0])

    stages = stages_of(b)
    if cutlass.const_expr(not started):
        start_chunks(tid, num_chunks, a, b)
    for kc in cutlass.range(num_chunks, unroll=1):
        cute.arch.cp_async_wait_group(stages - 2)
        # Chunk kc is visible to all, and everyone has finished chunk kc - 1: its buffer
        # ((kc + stages - 1) % stages) can be refilled.
        cute.arch.sync_threads()
        ahead = kc + stages - 1
        if ahead < num_chunks:
            if cutlass.const_expr(streamed_a):
                issue_chunk(a_mX, a_stage3, a_num_rows, a_row0, a_vec0, a_num_vecs, a_rows, a_vecs,
                            a_vec, a_along_rows, a_threads, ahead, ahead % stages, tid)
            issue_chunk(b_mX, b_stage3, b_num_rows, b_row0, b_vec0, b_num_vecs, b_rows, b_vecs, b_vec,
                        b_along_rows, b_threads, ahead, ahead % stages, tid)
        cute.arch.cp_async_commit_group()
        buf = kc % stages
        if cutlass.const_expr(multiply is not None):
            if cutlass.const_expr(streamed_a):
                multiply(a_view[None, None, buf], b_view[None, None, buf], acc)
            else:
                multiply(cute.local_tile(a_resident, (a_rows_resident, CHUNK), (0, kc)),
                         b_view[None, None, buf], acc)
        elif cutlass.const_expr(streamed_a):
            tile_mma(tiled_mma, tid, a_view[None, None, buf], b_view[None, None, buf], acc, mode, a_relu)
        else:
            tile_mma(tiled_mma, tid, cute.local_tile(a_resident, (a_rows_resident, CHUNK), (0, kc)),
                     b_view[None, None, buf], acc, mode, a_relu)
        if cutlass.const_expr(after_chunk is not None):
            after_chunk(buf)
    cute.arch.sync_threads()


@cute.jit
def store_pair(row: cute.Tensor, col: Int32, lo: Float32, hi: Float32):
    """row[col], row[col + 1] <- lo, hi as one 64-bit store (col even, the row 8-byte aligned):
    an MMA accumulator pair (g, 2t), (g, 2t + 1). Element stores of the pair were twice the
    store instructions and each wrote every other word of its 32-byte sectors."""
    pair = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
    pair[0] = lo
    pair[1] = hi
    cute.autovec_copy(pair, cute.local_tile(row, (2,), (col // 2,)))


@cute.jit
def load_pair(row: cute.Tensor, col: Int32) -> tuple:
    """(row[col], row[col + 1]) as one 64-bit load (col even, the row 8-byte aligned)."""
    pair = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
    cute.autovec_copy(cute.local_tile(row, (2,), (col // 2,)), pair)
    return pair[0], pair[1]
