"""Risk budget head, docs/layers.md section 6: risk = sigmoid(relu(x @ W1^T + b1) @ w2 + b2) with
x = [h, isv, e], in one kernel that never forms x.

The isv block of W1 is folded with b1 into one bias per hidden unit, c = b1 + W1[:, SH2:SH2+I]
@ isv, and the e column is a rank-1 term e[b] * W1[:, SH2+I]; both, the relu, the dot with w2
and the sigmoid are the epilogue of the [B, SH2] @ [SH2, H] product.

Work and floor at the defaults (SH2=256, I=16, H=64, B=8192):
  bytes  h read once: B*SH2*4 = 8.39 MB; e, risk: 2*B*4 = 65.5 KB; W1 (70 KB) from L2 per CTA
         -> 2.0 us at 4.25 TB/s
  flops  2*B*SH2*H = 268 MFLOP (+ epilogue 4*B*H)  -> 0.5 us on TF32 tensor cores (~490 TFLOP/s
         dense), 4.3 us with FFMA (~62 TFLOP/s)
So TF32 is memory bound (floor ~2 us) and FP32 FFMA is compute bound (floor ~4.3 us).

Designs. Each CTA stages W1[:, :SH2] in shared memory with 4-byte cp.async copies (W1's rows,
SH2+I+1 floats, are not 16-byte aligned), all issued before one wait, and folds c, W1[:, SH2+I]
and w2 meanwhile; a CTA covers a tile of rows of h.
  tf32  mma.sync m16n8k8 TF32 (MmaTF32Op), see RiskBudgetTf32: a warp owns 16 rows and all H
        columns; its first PREFETCH chunks of h are requested before the staging wait, and the
        fully unrolled K loop keeps PREFETCH 128-bit loads per row in flight.
  fp32  FFMA: thread (row, quarter) of a warp = 8 rows x 4 quarters of the hidden units
        accumulates its H/4 units over SH2 with 128-bit loads of h (global) and of W1 (shared,
        the 8 lanes of a quarter-warp read one address: broadcast). The four quarters' epilogue
        sums meet by butterfly shuffles.

At the defaults the TF32 kernel takes 9.09 us graph-replayed, 7.01 us at batch 1, where a graph
replay of one trivial kernel takes 2.25 us (run 20261203T162501Z).
"""

from __future__ import annotations

from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.memory import SmemAllocator

from .. import _arrays
from .._layer import PRECISIONS, KernelContract
from . import _cute
from ._mma import warp_mma
from ._tf32 import round_tf32_bits

WARPS = 8
FP32_ROWS = WARPS * 8  # fp32: a warp covers 8 rows (x 4 quarters of the hidden units)
TF32_WARPS = 4
TF32_ROWS = TF32_WARPS * 16  # tf32: a warp covers 16 rows (one MMA M tile): B=8192 -> 128 CTAs
MAX_H = 128  # fp32: H/4 accumulators per thread
MAX_I = 64  # the isv fold is unrolled
PREFETCH = 6  # tf32: 16-wide K chunks of h in flight per row (4 warps x 32 lanes x 6 x 32 B = 24 KB/SM)
MAX_SMEM_FLOATS = 48 * 1024  # staged W1 block: 8*ceil(H/8) x (16*ceil(SH2/16) + 16) floats <= 192 KB
MAX_ELEMENTS = 2**31 - 1


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def staged_floats(sh2: int, H: int) -> int:
    """Shared floats of the staged W1 block (rows and columns padded)."""
    return _ceil(H, 8) * 8 * (_ceil(sh2, 16) * 16 + 16)


class RiskBudgetConfig:
    def __init__(self, sh2: int, i_dim: int, H: int):
        self.sh2, self.i_dim, self.H = sh2, i_dim, H
        self.cols = sh2 + i_dim + 1  # W1 row length
        self.k16 = _ceil(sh2, 16) * 16  # K padded to whole 16-wide chunks (zeros)
        self.h8 = _ceil(H, 8) * 8  # hidden units padded to whole 8-wide MMA tiles (zeros)
        # Shared row stride: k16 + 16 puts the 8 rows that a quarter-warp's 128-bit fragment
        # loads touch on disjoint banks (for SH2 % 32 == 0).
        self.pad = self.k16 + 16

    @cute.jit
    def stage_weights(self, tid: Int32, threads: cutlass.Constexpr, mW1: cute.Tensor,
                      mIsv: cute.Tensor, mB1: cute.Tensor, mW2: cute.Tensor):
        """Issues cp.async copies of W1[:, :SH2] into shared memory (row stride self.pad; zeros
        past SH2 up to k16 and in rows H..h8) and computes, per hidden unit n, c[n] = b1[n] +
        W1[n, SH2:SH2+I] @ isv, we[n] = W1[n, SH2+I], w2[n] (zero for n >= H). The caller
        must wait for the copies (cp_async_wait_group(0)) and barrier before reading."""
        H, sh2, k16 = self.H, self.sh2, self.k16
        smem = SmemAllocator()
        sW = smem.allocate_tensor(Float32, cute.make_layout((self.h8, self.pad), stride=(self.pad, 1)), 16)
        sC = smem.allocate_tensor(Float32, cute.make_layout(self.h8), 16)
        sWe = smem.allocate_tensor(Float32, cute.make_layout(self.h8), 16)
        sW2 = smem.allocate_tensor(Float32, cute.make_layout(self.h8), 16)
        copy = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32)
        # Thread = column k (coalesced along W1's rows), walking down the rows.
        for kk in cutlass.range_constexpr(_ceil(k16, threads)):
            k = tid + kk * threads
            if k < k16:
                for n in cutlass.range(self.h8, unroll=8):
                    dst = cute.make_tensor(sW.iterator + (n * self.pad + k), cute.make_layout(1))
                    if n < H and k < sh2:
                        src = cute.make_tensor(mW1.iterator + (n * self.cols + k), cute.make_layout(1))
                        cute.copy(copy, src, dst)
                    else:
                        dst[0] = Float32(0.0)
        cute.arch.cp_async_commit_group()
        for n in cutlass.range(tid, self.h8, threads, unroll=1):
            n_in = cutlass.min(n, Int32(H - 1))
            c = mB1[n_in]
            for i in cutlass.range_constexpr(self.i_dim):
                c = c + mW1[n_in, sh2 + i] * mIsv[i]
            we = mW1[n_in, sh2 + self.i_dim]
            w2 = mW2[n_in]
            if n >= H:
                c = Float32(0.0)
                we = Float32(0.0)
                w2 = Float32(0.0)
            sC[n] = c
            sWe[n] = we
            sW2[n] = w2
        return sW, sC, sWe, sW2

    @cute.jit
    def launch(self, h_ptr: cute.Pointer, isv_ptr: cute.Pointer, e_ptr: cute.Pointer,
               w1_ptr: cute.Pointer, b1_ptr: cute.Pointer, w2_ptr: cute.Pointer,
               risk_ptr: cute.Pointer, batch: Int32, b2: Float32, rows: cutlass.Constexpr,
               threads: cutlass.Constexpr, stream):
        mH = cute.make_tensor(h_ptr, cute.make_layout((batch, self.sh2 // 4, 4),
                                                      stride=(self.sh2, 4, 1)))
        mIsv = cute.make_tensor(isv_ptr, cute.make_layout(self.i_dim))
        mE = cute.make_tensor(e_ptr, cute.make_layout(batch))
        mW1 = cute.make_tensor(w1_ptr, cute.make_layout((self.H, self.cols), stride=(self.cols, 1)))
        mB1 = cute.make_tensor(b1_ptr, cute.make_layout(self.H))
        mW2 = cute.make_tensor(w2_ptr, cute.make_layout(self.H))
        mRisk = cute.make_tensor(risk_ptr, cute.make_layout(batch))
        self.kernel(mH, mIsv, mE, mW1, mB1, mW2, mRisk, batch, b2).launch(
            grid=[cute.ceil_div(batch, rows), 1, 1], block=[threads, 1, 1], stream=stream)


class RiskBudgetFp32(RiskBudgetConfig):
    """FFMA: a warp is 8 rows x 4 quarters of the hidden units (lane = 8*quarter + row)."""

    def __init__(self, sh2: int, i_dim: int, H: int):
        super().__init__(sh2, i_dim, H)
        self.per_quarter = H // 4

    @cute.jit
    def __call__(self, h_ptr: cute.Pointer, isv_ptr: cute.Pointer, e_ptr: cute.Pointer,
                 w1_ptr: cute.Pointer, b1_ptr: cute.Pointer, w2_ptr: cute.Pointer,
                 risk_ptr: cute.Pointer, batch: Int32, b2: Float32, stream: cuda.CUstream):
        self.launch(h_ptr, isv_ptr, e_ptr, w1_ptr, b1_ptr, w2_ptr, risk_ptr, batch, b2,
                    FP32_ROWS, WARPS * 32, stream)

    @cute.kernel
    def kernel(self, mH: cute.Tensor, mIsv: cute.Tensor, mE: cute.Tensor, mW1: cute.Tensor,
               mB1: cute.Tensor, mW2: cute.Tensor, mRisk: cute.Tensor, batch: Int32, b2: Float32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        sW, sC, sWe, sW2 = self.stage_weights(tid, WARPS * 32, mW1, mIsv, mB1, mW2)
        sWv = cute.make_tensor(sW.iterator, cute.make_layout((self.h8, self.k16 // 4, 4),
                                                             stride=(self.pad, 4, 1)))
        warp = tid // 32
        lane = tid % 32
        quarter = lane // 8
        row = cta * FP32_ROWS + warp * 8 + lane % 8
        src_row = cutlass.min(row, batch - 1)  # past the end: compute on a real row, store nothing
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()

        acc = cute.make_rmem_tensor((self.per_quarter,), Float32)
        acc.fill(0.0)
        h_vec = cute.make_rmem_tensor((4,), Float32)
        w_vec = cute.make_rmem_tensor((4,), Float32)
        for kv in cutlass.range(self.sh2 // 4, unroll=4):
            h_vec.store(mH[src_row, kv, None].load())
            for j in cutlass.range_constexpr(self.per_quarter):
                w_vec.store(sWv[quarter * self.per_quarter + j, kv, None].load())
                s = acc[j]
                for u in cutlass.range_constexpr(4):
                    s = s + h_vec[u] * w_vec[u]
                acc[j] = s

        e = mE[src_row]
        part = Float32(0.0)
        for j in cutlass.range_constexpr(self.per_quarter):
            n = quarter * self.per_quarter + j
            z = acc[j] + sC[n] + e * sWe[n]
            part = part + cute.arch.fmax(z, Float32(0.0)) * sW2[n]
        total = part + cute.arch.shuffle_sync_bfly(part, offset=8)
        total = total + cute.arch.shuffle_sync_bfly(total, offset=16)
        if row < batch:
            if quarter == 0:
                mRisk[row] = sigmoid(total + b2)


class RiskBudgetTf32(RiskBudgetConfig):
    """mma.sync m16n8k8 TF32 (MmaTF32Op). A warp owns 16 rows x all H columns: lane (g, t) =
    (lane // 4, lane % 4). The K order inside each 16-wide chunk is permuted so that both
    operands come from one 128-bit load per row: lane t loads physical columns 4t..4t+3 and
    MMA step s uses 4t+2s as logical k = t and 4t+2s+1 as logical k = t+4, for h (A) and W1
    (B) alike; a sum over k does not care about its order. Operands are rounded to TF32
    (cvt.rna) as fragments are built; accumulation is float32."""

    def __init__(self, sh2: int, i_dim: int, H: int):
        super().__init__(sh2, i_dim, H)
        self.chunks = self.k16 // 16
        self.depth = min(PREFETCH, self.chunks)

    @cute.jit
    def __call__(self, h_ptr: cute.Pointer, isv_ptr: cute.Pointer, e_ptr: cute.Pointer,
                 w1_ptr: cute.Pointer, b1_ptr: cute.Pointer, w2_ptr: cute.Pointer,
                 risk_ptr: cute.Pointer, batch: Int32, b2: Float32, stream: cuda.CUstream):
        self.launch(h_ptr, isv_ptr, e_ptr, w1_ptr, b1_ptr, w2_ptr, risk_ptr, batch, b2,
                    TF32_ROWS, TF32_WARPS * 32, stream)

    @cute.jit
    def load_chunk(self, mH: cute.Tensor, row: Int32, chunk: int, t: Int32, dst: cute.Tensor):
        """dst <- h[row, 16*chunk + 4t .. +3] (zeros past SH2)."""
        kv = chunk * 4 + t
        if cutlass.const_expr((chunk + 1) * 16 <= self.sh2):
            dst.store(mH[row, kv, None].load())
        else:
            dst.store(mH[row, cutlass.min(kv, Int32(self.sh2 // 4 - 1)), None].load())
            if kv >= self.sh2 // 4:
                dst.fill(0.0)

    @cute.kernel
    def kernel(self, mH: cute.Tensor, mIsv: cute.Tensor, mE: cute.Tensor, mW1: cute.Tensor,
               mB1: cute.Tensor, mW2: cute.Tensor, mRisk: cute.Tensor, batch: Int32, b2: Float32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        sW, sC, sWe, sW2 = self.stage_weights(tid, TF32_WARPS * 32, mW1, mIsv, mB1, mW2)
        sWv = cute.make_tensor(sW.iterator, cute.make_layout((self.h8, self.k16 // 4, 4),
                                                             stride=(self.pad, 4, 1)))
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        row_a = cta * TF32_ROWS + warp * 16 + g
        row_b = row_a + 8
        src_a = cutlass.min(row_a, batch - 1)  # past the end: compute on a real row, store nothing
        src_b = cutlass.min(row_b, batch - 1)

        # h chunks in flight: slot c % depth holds chunk c. The first ones are requested
        # before waiting for the weights, so streaming h overlaps staging W1.
        h_a = cute.make_rmem_tensor((self.depth, 4), Float32)
        h_b = cute.make_rmem_tensor((self.depth, 4), Float32)
        for c in cutlass.range_constexpr(self.depth):
            self.load_chunk(mH, src_a, c, t, h_a[c, None])
            self.load_chunk(mH, src_b, c, t, h_b[c, None])
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()

        tiles = self.h8 // 8
        mma = warp_mma(1, 1)
        acc = cute.make_rmem_tensor((4, 1, 1, tiles), Float32)
        acc.fill(0.0)
        w = cute.make_rmem_tensor((4,), Float32)
        frag_a = cute.make_rmem_tensor((4, 1, 1, 2), cutlass.TFloat32)  # one per MMA step
        frag_a_bits = cute.recast_tensor(frag_a, Int32)
        frag_b = cute.make_rmem_tensor((2, 1, 1), cutlass.TFloat32)
        frag_b_bits = cute.recast_tensor(frag_b, Int32)
        for c in cutlass.range_constexpr(self.chunks):
            slot = c % self.depth
            for s in cutlass.range_constexpr(2):
                frag_a_bits[0, 0, 0, s] = round_tf32_bits(h_a[slot, 2 * s])
                frag_a_bits[1, 0, 0, s] = round_tf32_bits(h_b[slot, 2 * s])
                frag_a_bits[2, 0, 0, s] = round_tf32_bits(h_a[slot, 2 * s + 1])
                frag_a_bits[3, 0, 0, s] = round_tf32_bits(h_b[slot, 2 * s + 1])
            if cutlass.const_expr(c + self.depth < self.chunks):
                self.load_chunk(mH, src_a, c + self.depth, t, h_a[slot, None])
                self.load_chunk(mH, src_b, c + self.depth, t, h_b[slot, None])
            for j in cutlass.range_constexpr(tiles):
                w.store(sWv[j * 8 + g, c * 4 + t, None].load())
                for s in cutlass.range_constexpr(2):
                    frag_b_bits[0, 0, 0] = round_tf32_bits(w[2 * s])
                    frag_b_bits[1, 0, 0] = round_tf32_bits(w[2 * s + 1])
                    cute.gemm(mma, acc[None, None, None, j], frag_a[None, None, None, s],
                              frag_b, acc[None, None, None, j])

        e_a = mE[src_a]
        e_b = mE[src_b]
        part_a = Float32(0.0)
        part_b = Float32(0.0)
        for j in cutlass.range_constexpr(tiles):
            for u in cutlass.range_constexpr(2):
                n = j * 8 + 2 * t + u
                z_a = acc[u, 0, 0, j] + sC[n] + e_a * sWe[n]
                z_b = acc[2 + u, 0, 0, j] + sC[n] + e_b * sWe[n]
                part_a = part_a + cute.arch.fmax(z_a, Float32(0.0)) * sW2[n]
                part_b = part_b + cute.arch.fmax(z_b, Float32(0.0)) * sW2[n]
        # Butterfly over the 4 lanes of a row: a + b == b + a, so all 4 get identical sums.
        part_a = part_a + cute.arch.shuffle_sync_bfly(part_a, offset=1)
        part_a = part_a + cute.arch.shuffle_sync_bfly(part_a, offset=2)
        part_b = part_b + cute.arch.shuffle_sync_bfly(part_b, offset=1)
        part_b = part_b + cute.arch.shuffle_sync_bfly(part_b, offset=2)
        if t == 0:
            if row_a < batch:
                mRisk[row_a] = sigmoid(part_a + b2)
            if row_b < batch:
                mRisk[row_b] = sigmoid(part_b + b2)


@cute.jit
def sigmoid(x: Float32) -> Float32:
    return Float32(1.0) / (Float32(1.0) + cute.math.exp(-x))


_compiled = _cute.CompiledCache(__name__)


def _kernel_and_args(sh2: int, i_dim: int, H: int, precision: str) -> tuple[Any, tuple]:
    """The kernel object and the (fake) arguments it compiles with."""
    kernel = (RiskBudgetTf32 if precision == "tf32" else RiskBudgetFp32)(sh2, i_dim, H)
    return kernel, (*[_cute.fake_ptr() for _ in range(7)], Int32(1), Float32(0.0), _cute.fake_stream())


def _compile(sh2: int, i_dim: int, H: int, precision: str, keep: bool = False) -> Any:
    def build():
        kernel, args = _kernel_and_args(sh2, i_dim, H, precision)
        return _cute.compile_kernel(kernel, *args, keep=keep)
    return _compiled.get((sh2, i_dim, H, precision, keep), build)


CONTRACT = KernelContract(passes=("forward",), options={"precision": PRECISIONS})


def check_sizes(chk: _arrays.Checker) -> None:
    """Supported: SH2 % 4 == 0 (128-bit loads of h rows), H % 4 == 0 and H <= 128 (fp32:
    H/4 accumulators a thread), I <= 64, the staged W1 block (8*ceil(H/8) rows of
    16*ceil(SH2/16) + 16 floats) within 48K floats (SH2 <= 752 at H=64), B*SH2 < 2**31."""
    chk.dim_multiple("SH2", 4, "rows of h are read 128 bits at a time")
    chk.dim_multiple("H", 4, "each of 4 threads a row owns H/4 hidden units")
    chk.dim_range("H", 4, MAX_H, "hidden units are accumulated in registers")
    chk.dim_range("I", 1, MAX_I, "the isv fold is unrolled")
    sh2, H = chk.dims["SH2"], chk.dims["H"]
    if staged_floats(sh2, H) > MAX_SMEM_FLOATS:
        raise _arrays.FoxcuteInputError(
            f"{chk.where}: SH2={sh2}, H={H} is outside the supported range: the staged W1 block "
            f"needs {staged_floats(sh2, H)} floats of shared memory, at most {MAX_SMEM_FLOATS}")
    chk.dim_range("B", 1, MAX_ELEMENTS // chk.dims["SH2"], "32-bit indexing of h")


def forward(h, isv, e, W1, b1, w2, b2: float, *, precision: str = "tf32"):
    """risk [B] on h's current stream."""
    B, sh2 = h.shape
    H = W1.shape[0]
    kernel = _compile(sh2, isv.shape[0], H, precision)
    risk = _arrays.empty(h, (B,))
    kernel(_cute.gmem_ptr(h), _cute.gmem_ptr(isv), _cute.gmem_ptr(e), _cute.gmem_ptr(W1),
           _cute.gmem_ptr(b1), _cute.gmem_ptr(w2), _cute.gmem_ptr(risk), Int32(B), Float32(b2),
           _cute.current_stream(h))
    return risk


DEFAULTS = (256, 16, 64)  # SH2, I, H


def kernels_for_ci() -> dict[str, tuple[Any, tuple]]:
    """{name: (kernel, compile arguments)} for each precision at the defaults."""
    return {f"risk_budget_{p}": _kernel_and_args(*DEFAULTS, p) for p in ("tf32", "fp32")}


def compiled_for_ci() -> dict[str, Any]:
    """Each precision's kernel at the defaults (SH2=256, I=16, H=64), PTX kept."""
    return {f"risk_budget_{p}": _compile(*DEFAULTS, p, keep=True) for p in ("tf32", "fp32")}
