"""KAN layer (Gaussian RBF basis), docs/layers.md section 4: forward y and backward (dC, dWb, dx).

Feature view: per row, the G basis values of each input and its silu are one feature vector
of F = (G+1)*I entries, ordered here g-major, f = g*I + i (g = G is silu(x_i)), so that
threads (FFMA) or MMA tiles (TF32) of consecutive inputs meet one basis function at a time.
The weights are the matching [O, F] matrix Wcat[o, g*I+i] = C[o, i*G+g], Wcat[o, G*I+i] =
Wb[o, i]. Then
    y = feat @ Wcat^T,   dWcat = dy^T @ feat  (dC and dWb),   dfeat = dy @ Wcat (-> dx).
The features are recomputed on chip by each CTA and never stored to global memory.

Work and floor at the defaults (I=32, O=32, G=8 -> F=288, B=8192):
  forward   bytes x + y: 2*B*32*4 = 2.1 MB (0.5 us at 4.25 TB/s); flops 2*B*F*O = 151 MFLOP
            (+ B*F = 2.4 M exps on the MUFU unit, ~0.3 us)
            -> TF32 tensor cores: memory/latency bound (~1 us); FFMA: ~2.4 us at ~62 TFLOP/s
  backward  bytes x, dy, dx: 3.1 MB (0.8 us); flops 2 * 151 MFLOP (dWcat, dfeat): TF32 tensor
            cores, latency bound; FFMA: ~4.9 us. The batch reduction of dWcat is per-CTA
            partial rows summed in a fixed order (deterministic, no float atomics).

fp32 (FFMA; a CTA of 256 threads takes ROWS=64 rows; partial rows summed by KanGradReduce,
a programmatic dependent launch):
  1. x (and dy) tiles into shared memory; thread (row, input) computes that input's G+1
     features into sFeat[f, row] (feature-major, row stride ROWS+4: 128-bit loads of 4 rows).
  forward: thread (4 rows, 2 outputs) accumulates 8 outputs over F with one 128-bit and one
     64-bit shared load per 8 FMAs.
  backward: (a) dWcat partial: warp w owns outputs o = w, w+8, ..., lane l owns features
     f = l, l+32, ...; each sums dy[r, o]*feat[f, r] over the CTA's rows, 4 rows per 128-bit
     load. (b) dx: thread (4 rows, input i) accumulates dfeat for its G+1 features over O,
     then dx = sum_g dfeat_g * phi_g * (-2 (x - mu_g) / delta^2) + dfeat_G * silu'(x).

tf32 forward (mma.sync m16n8k8, 4 warps = 64 rows a CTA; KanTf32Config, KanForwardTf32):
  Wcat gathered into shared memory by cp.async (issued at once, waited for once), A
  fragments' basis values computed in registers.

tf32 backward: ONE launch, the batch reduction included (KanBackwardTf32).
  CTA = (chunk of 256 rows, input block of 8 inputs), 8 warps of 32 rows (B=8192: 32 x 4 =
  128 CTAs, one wave, 2 warps per scheduler; 16-row warps where G >= 10 or O is wide, see
  warp_rows). A block's features f = gb*8 + i need only that block's 8 inputs (C and Wb
  columns: 9 KB) and give complete dx for them, so no cross-CTA sum of dx; a CTA's partial
  row of dWcat is 2304 floats (1.2 MB in all at the defaults). Per CTA: 49 KB loaded, all
  before the first barrier (x and dy straight to the lanes / the warp's own shared rows,
  128-bit); features computed once into registers (5 ex2 + 1 rcp per x value by an exp
  recurrence); 152 MMAs a warp (72 + 80), both phases laid out so a lane's features are
  exactly its B fragments (phase a) and the dfeat it needs (phase b). Two warps a scheduler
  hide each other's latencies: latencies, not issue slots, bind this kernel.
  The reduction, where the grid is at most one CTA an SM (spreads(): B <= 8448 at I = 32 on
  an H200, the defaults included): one level spread over every CTA. Each stores its partial
  row and arrives at its block's counter before phase (b), waits after it until all the
  block's chunks have arrived, and sums one slice of the block's row over the chunks in
  order (finish_slice: at the defaults 18 float4 vectors, 8 lanes a vector summing 4 rows
  each, then a butterfly), so no CTA reads more than ~9 KB and no second ticket round trip
  follows the first. Launched cooperative, so the wait is sure to complete whatever runs
  beside it. Elsewhere (q_denoise's pattern): each CTA stores its partial row, draws its
  group's ticket before phase (b) and reads it after, so that round trip is hidden; the
  group's last CTA sums the group's rows (~sqrt(chunks)) in chunk order, the block's last
  group finisher the group rows in group order (the blocks finish in parallel on as many
  SMs); tickets from _cute.tickets, reset by the finishers.
  At the defaults 9.69 us graph-replayed, 8.52 us at batch 1, where a graph replay of one
  trivial kernel takes 2.25 us (run 20261203T162501Z): most of its time does not scale with
  the batch. History: docs/notes/kan.md.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.memory import SmemAllocator

from .. import _arrays
from .._layer import PRECISIONS, KernelContract
from . import _cute
from ._mma import warp_mma
from ._tf32 import round_tf32_bits, tf32_operand_bits_finite

THREADS = 256
ROWS = 64  # fp32: rows of a CTA: B=8192 gives 128 CTAs, one wave on an H200
ROW_PAD = ROWS + 4  # feature-major tiles: 4-row vectors stay 16-byte aligned, rows spread over banks
REDUCE_ROW_GROUPS = 16  # grad reduce: warps of a CTA that split the partial rows (8 rows each at B=8192)
MAX_ACC = 64  # fp32: accumulators a thread may hold
MAX_SMEM_BYTES = 200 * 1024
MAX_ELEMENTS = 2**31 - 1
TF32_WARPS = 4  # tf32 forward
TF32_THREADS = TF32_WARPS * 32
TF32_ROWS = TF32_WARPS * 16  # forward: a warp owns one 16-row MMA tile: B=8192 -> 128 CTAs
# tf32 backward (KanBackwardTf32)
INPUT_BLOCK = 8  # inputs of a CTA: one MMA feature tile of each basis function
BWD_WARPS = 8
BWD_THREADS = BWD_WARPS * 32
MAX_HELD_FEATURES = 80  # feature registers a lane holds from phase (a) to (b): (rows/4)*(G+1)
# A warp takes 32 rows (B=8192, I=32: 32 chunks of 256 rows x 4 input blocks = 128 CTAs), or 16
# (see warp_rows; with 32 and G = 12, 104 held features, ptxas spilled).
MAX_PHASE_A_ACC = 72  # phase (a) accumulator registers of a lane (all G+1 tiles at the defaults)
MAX_FEATURES_AND_ACC = 152  # ... plus the held features (8*(G+1)): ptxas stays within 255 registers
MAX_REDUCE_SMEM = 80 * 1024  # phase (a): the 8 warps' tiles of one round, summed in warp order
SUM_LOADS_IN_FLIGHT = 24  # float4 loads a thread issues together in the finishers' sums
SLICE_LOADS = 8  # ... in the spread finish's runs (at most 17 rows: 132 chunks in 8 parts)
MAX_TICKETS = _cute.TICKETS_PER_LAUNCH
GAUSS_CHAIN = 4  # basis functions computed from one exp start by the product recurrence
U_CLAMP = 10.0  # (x - mu_0)/delta clamped to [-U_CLAMP, G-1+U_CLAMP]: every phi < exp(-100) there
LOG2E = math.log2(math.e)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _vector_width(row: int) -> int:
    """Floats per aligned vector load of a row of `row` floats (rows start 16-byte aligned)."""
    return 4 if row % 4 == 0 else (2 if row % 2 == 0 else 1)


def output_layout(O: int, I: int, G: int) -> tuple[int, int]:
    """Where the totals go: sums = [dC (O x I*G, C's order) | pad to a multiple of 4 |
    dWb (O x I)]; returns (offset of dWb, length of sums)."""
    dwb_at = _ceil(O * I * G, 4) * 4
    return dwb_at, dwb_at + O * I


class GradLayout:
    """Where the fp32 backward kernel puts its dWcat partial sums (the grad reduce then puts
    the totals at output_layout's places).

    Partial rows (one per backward CTA) are in the kernel's own (output, feature) order,
    column o*FP + f for o < OP, f = g*IP + i < FP (padded sizes, written whole, so stores stay
    contiguous); the reduce maps each column to its place in sums and drops the padding."""

    def __init__(self, O: int, I: int, G: int):
        self.O, self.I, self.G = O, I, G
        self.IP = I
        self.FP = _ceil((G + 1) * I, 32) * 32
        self.OP = _ceil(O, THREADS // 32) * (THREADS // 32)
        self.partial_len = self.OP * self.FP
        self.dwb_at, self.sums_len = output_layout(O, I, G)

    def key(self) -> tuple:
        return (self.O, self.I, self.G, self.IP, self.FP, self.OP)


class KanConfig:
    rows = ROWS  # batch rows of a CTA
    threads = THREADS

    def __init__(self, I: int, O: int, G: int):
        self.I, self.O, self.G = I, O, G
        self.F = (G + 1) * I
        self.delta = 4.0 / (G - 1)
        self.mu = [-2.0 + g * self.delta for g in range(G)]
        self.inv_delta2 = 1.0 / (self.delta * self.delta)

    def operand_tensors(self, batch: Int32, x_ptr: cute.Pointer, c_ptr: cute.Pointer,
                        wb_ptr: cute.Pointer) -> tuple:
        """x [B, I], C [O, I*G] and Wb [O, I] (row-major) over the kernels' raw pointers."""
        I, O, G = self.I, self.O, self.G
        return (cute.make_tensor(x_ptr, cute.make_layout((batch, I), stride=(I, 1))),
                cute.make_tensor(c_ptr, cute.make_layout((O, I * G), stride=(I * G, 1))),
                cute.make_tensor(wb_ptr, cute.make_layout((O, I), stride=(I, 1))))

    @cute.jit
    def stage_wcat(self, tid: Int32, mC: cute.Tensor, mWb: cute.Tensor, dst: cute.Tensor):
        """Wcat [O, F] into shared memory as dst[o, f]: C at f = g*I + i (basis function g of
        input i, feature-major as sFeat's rows), then Wb at f = G*I + i."""
        I, O, G = self.I, self.O, self.G
        for k in cutlass.range_constexpr(_ceil(O * I * G, THREADS)):
            idx = cutlass.min(tid + k * THREADS, Int32(O * I * G - 1))
            o = idx // (I * G)
            col = idx - o * (I * G)
            i = col // G
            dst[o, (col - i * G) * I + i] = mC[o, col]
        for k in cutlass.range_constexpr(_ceil(O * I, THREADS)):
            idx = cutlass.min(tid + k * THREADS, Int32(O * I - 1))
            o = idx // I
            dst[o, G * I + idx - o * I] = mWb[o, idx - o * I]

    @cute.jit
    def stage_features(self, tid: Int32, first: Int32, batch: Int32, mX: cute.Tensor,
                       sX: cute.Tensor, sFeat: cute.Tensor):
        """x rows first.. (zeros past the batch) into sX[row, i]; feat into sFeat[f, row]."""
        I, G = self.I, self.G
        # Loads are unconditional (clamped indices; duplicates rewrite the same value) so
        # the unrolled loops issue them all before waiting for the first.
        for k in cutlass.range_constexpr(_ceil(ROWS * I, THREADS)):
            idx = cutlass.min(tid + k * THREADS, Int32(ROWS * I - 1))
            r = idx // I
            v = mX[cutlass.min(first + r, batch - 1), idx - r * I]
            if first + r >= batch:
                v = Float32(0.0)
            sX[r, idx - r * I] = v
        cute.arch.barrier()
        for k in cutlass.range_constexpr(_ceil(ROWS * I, THREADS)):
            idx = tid + k * THREADS
            if idx < ROWS * I:
                r = idx % ROWS
                i = idx // ROWS
                x = sX[r, i]
                for g in cutlass.range_constexpr(G):
                    d = x - Float32(self.mu[g])
                    sFeat[g * I + i, r] = cute.math.exp(-(d * d) * Float32(self.inv_delta2))
                sFeat[G * I + i, r] = x / (Float32(1.0) + cute.math.exp(-x))
        cute.arch.barrier()


class _ForwardLaunch:
    """The forward kernels' launch (fp32 and tf32): y [B, O] as O/2 float2 pairs a row, one
    CTA per `rows` rows."""

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, c_ptr: cute.Pointer, wb_ptr: cute.Pointer,
                 y_ptr: cute.Pointer, batch: Int32, stream: cuda.CUstream):
        O = self.O
        mX, mC, mWb = self.operand_tensors(batch, x_ptr, c_ptr, wb_ptr)
        mY = cute.make_tensor(y_ptr, cute.make_layout((batch, O // 2, 2), stride=(O, 2, 1)))
        self.kernel(mX, mC, mWb, mY, batch).launch(
            grid=[cute.ceil_div(batch, self.rows), 1, 1], block=[self.threads, 1, 1], stream=stream)


class KanForwardFp32(_ForwardLaunch, KanConfig):

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mC: cute.Tensor, mWb: cute.Tensor, mY: cute.Tensor,
               batch: Int32):
        I, O, F = self.I, self.O, self.F
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        first = cta * ROWS
        smem = SmemAllocator()
        sX = smem.allocate_tensor(Float32, cute.make_layout((ROWS, I), stride=(I + 1, 1)), 16)
        sFeat = smem.allocate_tensor(Float32, cute.make_layout((F, ROWS), stride=(ROW_PAD, 1)), 16)
        sWt = smem.allocate_tensor(Float32, cute.make_layout((F, O), stride=(O, 1)), 16)
        self.stage_wcat(tid, mC, mWb, cute.make_tensor(sWt.iterator, cute.make_layout((O, F), stride=(1, O))))
        self.stage_features(tid, first, batch, mX, sX, sFeat)

        sFeat4 = cute.make_tensor(sFeat.iterator, cute.make_layout((F, ROWS // 4, 4), stride=(ROW_PAD, 4, 1)))
        sWt2 = cute.make_tensor(sWt.iterator, cute.make_layout((F, O // 2, 2), stride=(O, 2, 1)))
        tasks = (ROWS // 4) * (O // 2)
        f4 = cute.make_rmem_tensor((4,), Float32)
        w2 = cute.make_rmem_tensor((2,), Float32)
        acc = cute.make_rmem_tensor((4, 2), Float32)
        for k in cutlass.range_constexpr(_ceil(tasks, THREADS)):
            task = tid + k * THREADS
            if task < tasks:
                pair = task % (O // 2)
                quad = task // (O // 2)
                acc.fill(0.0)
                for f in cutlass.range(F, unroll=8):
                    f4.store(sFeat4[f, quad, None].load())
                    w2.store(sWt2[f, pair, None].load())
                    for r in cutlass.range_constexpr(4):
                        for c in cutlass.range_constexpr(2):
                            acc[r, c] = acc[r, c] + f4[r] * w2[c]
                for r in cutlass.range_constexpr(4):
                    row = first + quad * 4 + r
                    if row < batch:
                        mY[row, pair, None].store(acc[r, None].load())


class KanBackwardFp32(KanConfig):
    def __init__(self, I: int, O: int, G: int):
        super().__init__(I, O, G)
        self.grads = GradLayout(O, I, G)
        self.o_per_warp = _ceil(O, THREADS // 32)
        self.f_per_lane = _ceil(self.F, 32)

    @cute.jit
    def __call__(self, dy_ptr: cute.Pointer, x_ptr: cute.Pointer, c_ptr: cute.Pointer,
                 wb_ptr: cute.Pointer, dx_ptr: cute.Pointer, part_ptr: cute.Pointer,
                 batch: Int32, stream: cuda.CUstream):
        I, O = self.I, self.O
        num_ctas = cute.ceil_div(batch, self.rows)
        mDy = cute.make_tensor(dy_ptr, cute.make_layout((batch, O), stride=(O, 1)))
        mX, mC, mWb = self.operand_tensors(batch, x_ptr, c_ptr, wb_ptr)
        mDx = cute.make_tensor(dx_ptr, cute.make_layout((batch, I), stride=(I, 1)))
        mPart = cute.make_tensor(part_ptr, cute.make_layout(
            (num_ctas, self.grads.OP, self.grads.FP),
            stride=(self.grads.partial_len, self.grads.FP, 1)))
        self.kernel(mDy, mX, mC, mWb, mDx, mPart, batch).launch(
            grid=[num_ctas, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mDy: cute.Tensor, mX: cute.Tensor, mC: cute.Tensor, mWb: cute.Tensor,
               mDx: cute.Tensor, mPart: cute.Tensor, batch: Int32):
        I, O, G, F = self.I, self.O, self.G, self.F
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        first = cta * ROWS
        # Let the grad reduce (launched next with programmatic dependent launch) get its CTAs
        # resident now; it waits in griddepcontrol.wait until this grid has finished.
        cute.arch.griddepcontrol_launch_dependents()
        smem = SmemAllocator()
        o_rows = self.o_per_warp * (THREADS // 32)  # padded so every warp's rows exist
        f_rows = self.f_per_lane * 32
        sX = smem.allocate_tensor(Float32, cute.make_layout((ROWS, I), stride=(I + 1, 1)), 16)
        sFeat = smem.allocate_tensor(Float32, cute.make_layout((f_rows, ROWS), stride=(ROW_PAD, 1)), 16)
        sDy = smem.allocate_tensor(Float32, cute.make_layout((o_rows, ROWS), stride=(ROW_PAD, 1)), 16)
        sW = smem.allocate_tensor(Float32, cute.make_layout((O, F), stride=(F, 1)), 16)
        self.stage_wcat(tid, mC, mWb, sW)
        # the dy tile transposed to [o, row]
        for k in cutlass.range_constexpr(_ceil(ROWS * O, THREADS)):
            idx = cutlass.min(tid + k * THREADS, Int32(ROWS * O - 1))
            r = idx // O
            v = mDy[cutlass.min(first + r, batch - 1), idx - r * O]
            if first + r >= batch:
                v = Float32(0.0)
            sDy[idx - r * O, r] = v
        self.stage_features(tid, first, batch, mX, sX, sFeat)

        sFeat4 = cute.make_tensor(sFeat.iterator, cute.make_layout((f_rows, ROWS // 4, 4), stride=(ROW_PAD, 4, 1)))
        sDy4 = cute.make_tensor(sDy.iterator, cute.make_layout((o_rows, ROWS // 4, 4), stride=(ROW_PAD, 4, 1)))
        warp = tid // 32
        lane = tid % 32

        # (a) dWcat partial of this CTA: entry (o = warp + 8m, f = lane + 32j).
        acc = cute.make_rmem_tensor((self.o_per_warp, self.f_per_lane), Float32)
        acc.fill(0.0)
        dy4 = cute.make_rmem_tensor((self.o_per_warp, 4), Float32)
        f4 = cute.make_rmem_tensor((4,), Float32)
        for q in cutlass.range(ROWS // 4, unroll=1):
            for m in cutlass.range_constexpr(self.o_per_warp):
                dy4[m, None].store(sDy4[warp + 8 * m, q, None].load())
            for j in cutlass.range_constexpr(self.f_per_lane):
                f4.store(sFeat4[lane + 32 * j, q, None].load())
                for m in cutlass.range_constexpr(self.o_per_warp):
                    s = acc[m, j]
                    for r in cutlass.range_constexpr(4):
                        s = s + dy4[m, r] * f4[r]
                    acc[m, j] = s
        for m in cutlass.range_constexpr(self.o_per_warp):
            for j in cutlass.range_constexpr(self.f_per_lane):
                mPart[cta, warp + 8 * m, lane + 32 * j] = acc[m, j]  # coalesced over lanes

        # (b) dx: thread (4 rows, input i); dfeat[r, g] = sum_o dy[r, o] * Wcat[o, g*I+i].
        tasks = (ROWS // 4) * I
        dfeat = cute.make_rmem_tensor((4, G + 1), Float32)
        d4 = cute.make_rmem_tensor((4,), Float32)
        for k in cutlass.range_constexpr(_ceil(tasks, THREADS)):
            task = tid + k * THREADS
            if task < tasks:
                i = task % I
                quad = task // I
                dfeat.fill(0.0)
                for o in cutlass.range(O, unroll=4):
                    d4.store(sDy4[o, quad, None].load())
                    for g in cutlass.range_constexpr(G + 1):
                        w = sW[o, g * I + i]
                        for r in cutlass.range_constexpr(4):
                            dfeat[r, g] = dfeat[r, g] + d4[r] * w
                for r in cutlass.range_constexpr(4):
                    row_in = quad * 4 + r
                    x = sX[row_in, i]
                    s = Float32(1.0) / (Float32(1.0) + cute.math.exp(-x))
                    dx = dfeat[r, G] * (s * (Float32(1.0) + x * (Float32(1.0) - s)))
                    for g in cutlass.range_constexpr(G):
                        d = x - Float32(self.mu[g])
                        slope = sFeat[g * I + i, row_in] * d * Float32(-2.0 * self.inv_delta2)
                        dx = dx + dfeat[r, g] * slope
                    if first + row_in < batch:
                        mDx[first + row_in, i] = dx


class KanTf32Config(KanConfig):
    """TF32 designs: features g-major with each basis block padded to I8 = 8*ceil(I/8) inputs,
    f = g*I8 + i (padding features and weights are zero), so an 8-wide MMA tile of features is
    8 inputs of one basis function. mma.sync m16n8k8 (MmaTF32Op), operands rounded to TF32
    (cvt.rna), float32 accumulation. Inside each 8-wide K step, lane t supplies physical
    positions 2t and 2t+1 as logical k = t and t+4 for both operands (a sum does not care
    about its order), so every fragment pair is one 64-bit shared load."""

    rows = TF32_ROWS
    threads = TF32_THREADS

    def __init__(self, I: int, O: int, G: int):
        super().__init__(I, O, G)
        self.I8 = _ceil(I, 8) * 8
        self.KP = (G + 1) * self.I8  # padded features
        self.O8 = _ceil(O, 8) * 8
        self.O16 = _ceil(O, 16) * 16

    @property
    def async_copy(self) -> Any:
        return cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32)

    @cute.jit
    def copy_weight_async(self, mC: cute.Tensor, mWb: cute.Tensor, o: Int32, f: Int32,
                          dst: cute.Tensor):
        """dst (a 1-element shared tensor) <- Wcat[o, f] in the padded g-major feature order:
        an asynchronous 4-byte copy (cp.async), or a plain store of 0 for padding. Staging
        issues every copy before waiting once, so no load latency is paid per element."""
        gb = f // self.I8
        i = f - gb * self.I8
        padding = True
        if o < self.O:
            if i < self.I:
                padding = False
        if padding:
            dst[0] = Float32(0.0)
        elif gb < self.G:
            src = cute.make_tensor(mC.iterator + (o * (self.I * self.G) + i * self.G + gb),
                                   cute.make_layout(1))
            cute.copy(self.async_copy, src, dst)
        else:
            src = cute.make_tensor(mWb.iterator + (o * self.I + i), cute.make_layout(1))
            cute.copy(self.async_copy, src, dst)

    @cute.jit
    def feature(self, x: Float32, gb: int) -> Float32:
        """Basis function gb of x (gb == G: silu). The fast exp (ex2.approx of x*log2(e), two
        instructions instead of eight) is off by at most ~1e-5 relative for the arguments
        here (>= -120), far below the TF32 rounding (2^-11) the features then go through."""
        value = Float32(0.0)
        if cutlass.const_expr(gb < self.G):
            d = x - Float32(self.mu[gb])
            value = cute.math.exp(-(d * d) * Float32(self.inv_delta2), fastmath=True)
        else:
            value = x / (Float32(1.0) + cute.math.exp(-x, fastmath=True))
        return value

    @cute.jit
    def load_x(self, mX: cute.Tensor, row: Int32, batch: Int32, t: Int32, xs: cute.Tensor):
        """xs[blk, u] = x[row, 8*blk + 2t + u] (0 past I or past the batch)."""
        row_in = cutlass.min(row, batch - 1)
        for blk in cutlass.range_constexpr(self.I8 // 8):
            for u in cutlass.range_constexpr(2):
                i = blk * 8 + 2 * t + u
                v = mX[row_in, cutlass.min(i, Int32(self.I - 1))]
                if row >= batch or i >= self.I:
                    v = Float32(0.0)
                xs[blk, u] = v


class KanForwardTf32(_ForwardLaunch, KanTf32Config):
    """A warp owns 16 rows x all O outputs; lane (g, t) = (lane // 4, lane % 4) computes the
    A fragment's features itself: rows g and g+8, inputs 2t and 2t+1 of each 8-input block,
    so every basis value is computed once and lives only in registers."""

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mC: cute.Tensor, mWb: cute.Tensor, mY: cute.Tensor,
               batch: Int32):
        O8, KP = self.O8, self.KP
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        smem = SmemAllocator()
        stride = KP + 8  # 64-bit fragment loads of 8 rows x 4 lanes on disjoint banks
        sW = smem.allocate_tensor(Float32, cute.make_layout((O8, KP), stride=(stride, 1)), 16)
        # Thread = feature f (consecutive shared words), walking down the outputs.
        for kk in cutlass.range_constexpr(_ceil(KP, TF32_THREADS)):
            f = tid + kk * TF32_THREADS
            if f < KP:
                for o in cutlass.range(O8, unroll=8):
                    self.copy_weight_async(mC, mWb, o, f, cute.make_tensor(
                        sW.iterator + (o * stride + f), cute.make_layout(1)))
        cute.arch.cp_async_commit_group()

        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        row_a = cta * TF32_ROWS + warp * 16 + g
        row_b = row_a + 8
        blocks = self.I8 // 8
        x_a = cute.make_rmem_tensor((blocks, 2), Float32)
        x_b = cute.make_rmem_tensor((blocks, 2), Float32)
        self.load_x(mX, row_a, batch, t, x_a)
        self.load_x(mX, row_b, batch, t, x_b)
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()

        sW2 = cute.make_tensor(sW.iterator, cute.make_layout((O8, KP // 2, 2), stride=(stride, 2, 1)))
        mma = warp_mma(1, 1)
        tiles = O8 // 8
        acc = cute.make_rmem_tensor((4, 1, 1, tiles), Float32)
        acc.fill(0.0)
        frag_a = cute.make_rmem_tensor((4, 1, 1), cutlass.TFloat32)
        frag_a_bits = cute.recast_tensor(frag_a, Int32)
        frag_b = cute.make_rmem_tensor((2, 1, 1), cutlass.TFloat32)
        frag_b_bits = cute.recast_tensor(frag_b, Int32)
        w = cute.make_rmem_tensor((2,), Float32)
        for gb in cutlass.range_constexpr(self.G + 1):
            for blk in cutlass.range_constexpr(blocks):
                # K step: features gb*I8 + 8*blk .. +7; this lane: inputs 8*blk + 2t + (0, 1)
                a_vals = [self.feature(x_a[blk, 0], gb), self.feature(x_b[blk, 0], gb),
                          self.feature(x_a[blk, 1], gb), self.feature(x_b[blk, 1], gb)]
                for v in cutlass.range_constexpr(4):
                    frag_a_bits[v, 0, 0] = round_tf32_bits(a_vals[v])
                pair = (gb * self.I8 + blk * 8) // 2 + t
                for j in cutlass.range_constexpr(tiles):
                    w.store(sW2[j * 8 + g, pair, None].load())
                    frag_b_bits[0, 0, 0] = round_tf32_bits(w[0])
                    frag_b_bits[1, 0, 0] = round_tf32_bits(w[1])
                    cute.gemm(mma, acc[None, None, None, j], frag_a, frag_b, acc[None, None, None, j])

        out = cute.make_rmem_tensor((2,), Float32)
        for j in cutlass.range_constexpr(tiles):
            pair = j * 4 + t  # outputs 8j + 2t, +1
            if pair < self.O // 2:
                if row_a < batch:
                    out[0] = acc[0, 0, 0, j]
                    out[1] = acc[1, 0, 0, j]
                    mY[row_a, pair, None].store(out.load())
                if row_b < batch:
                    out[0] = acc[2, 0, 0, j]
                    out[1] = acc[3, 0, 0, j]
                    mY[row_b, pair, None].store(out.load())


def phase_a_tiles(KB: int, m_tiles: int, O16: int, held: int) -> int:
    """Feature tiles (basis functions) of phase (a) accumulated at once: accumulators within
    MAX_PHASE_A_ACC registers a lane and, with the `held` features, within MAX_FEATURES_AND_ACC;
    the 8 warps' tiles of one round within MAX_REDUCE_SMEM bytes of shared memory (all G+1
    tiles at the defaults: one round)."""
    budget = min(MAX_PHASE_A_ACC, MAX_FEATURES_AND_ACC - held)
    tiles = min(KB, max(1, budget // (4 * m_tiles)))
    while tiles > 1 and 4 * BWD_WARPS * O16 * _bank_stride(8 * tiles) > MAX_REDUCE_SMEM:
        tiles -= 1
    return tiles


def _bank_stride(width: int) -> int:
    """Row stride (words) >= width (a multiple of 8) with stride = 8 (mod 16): a warp's 64-bit
    accesses of 8 rows (g) x 4 pairs (t) fall on disjoint banks in each half-warp."""
    return width + (8 - width) % 16


def warp_rows(I: int, O: int, G: int) -> int:
    """Rows of a TF32-backward warp: 32, or 16 where 8*(G+1) held features would be over
    MAX_HELD_FEATURES or the CTA's shared memory over MAX_SMEM_BYTES (wide O)."""
    if 8 * (G + 1) <= MAX_HELD_FEATURES and KanBackwardTf32(I, O, G, 32).smem_bytes() <= MAX_SMEM_BYTES:
        return 32
    return 16


def reduction_grid(batch: int, blocks: int, rows: int) -> tuple[int, int, int]:
    """(chunks of `rows` rows (a CTA's), chunks per group, groups) of the TF32 backward's two-level
    sums: groups of about sqrt(chunks) chunks (both levels then read about as many rows), at
    most MAX_TICKETS // blocks - 1 groups (one ticket per group and block, plus each block's
    final ticket)."""
    chunks = _ceil(batch, rows)
    max_groups = MAX_TICKETS // blocks - 1
    group_size = max(math.isqrt(chunks - 1) + 1, _ceil(chunks, max_groups))
    return chunks, group_size, _ceil(chunks, group_size)


def spreads(chunks: int, blocks: int, sms: int) -> bool:
    """Whether the TF32 backward finishes in one level, spread over all its CTAs (see
    KanBackwardTf32.finish_slice): where its grid is at most one CTA an SM, so that the
    cooperative launch that every CTA's wait for its block needs can always be resident."""
    return chunks * blocks <= sms


def _computed_once(x: Float32) -> Float32:
    """x through an opaque move: LLVM otherwise recomputes the basis functions' exp chains
    from u in phase (b) instead of keeping the values (seen in the PTX: 76 ex2 for 40), and
    the MUFU unit is the features' bound."""
    return Float32(llvm.inline_asm(Float32.mlir_type, [x.ir_value()], "mov.b32 $0, $1;", "=f,f",
                                   has_side_effects=True, is_align_stack=False,
                                   asm_dialect=llvm.AsmDialect.AD_ATT))


class KanBackwardTf32(KanTf32Config):
    """The TF32 backward in one launch, batch reduction included (see the module docstring).

    CTA (chunk, input block j) = rows = 8 * warp_rows rows x the 8 inputs 8j..8j+7, that is
    the block's KB8 = 8*(G+1) features f = gb*8 + i (basis gb, input 8j+i; gb = G is silu).
    8 warps; warp w owns rows R*w .. R*w + R-1 of the chunk (R = warp_rows, 32 at the
    defaults); lane (g, t) = (lane // 4, lane % 4) owns the xv = R/4 values
    x[R*w + 8q + 2t + u, 8j + g] (q < R/8, u < 2: its "x-values" k = 2q + u) and computes
    their features once, into registers (features()). Both MMA phases are laid out so that
    these are exactly the feature values each lane needs:
      (a) dWcat partial [O16, KB8] = dy^T @ feat over the warp's R rows: A = dy^T (M = outputs,
          K = rows), B = feat (lane's B fragment of feature tile gb, K step q: its x-values
          2q, 2q+1 of basis gb); then the 8 warps' tiles are summed through shared memory in
          warp order into the CTA's partial row.
      (b) dfeat^T [16*b_tiles, R rows] = Wcat^T @ dy^T for the warp's rows: A = Wcat^T (M =
          features, 16 = 2 basis functions x 8 inputs), B = dy^T (K = outputs, N = rows); the
          C fragment of (M tile mt, N tile q) holds dfeat of the lane's own input g, rows
          8q + 2t + {0,1}, basis 2mt and 2mt+1, so dx = sum_gb dfeat * dphi/dx is accumulated
          by the lane alone, in a fixed order.
    Inside each 8-wide K step lane t supplies physical positions 2t, 2t+1 as logical k = t,
    t+4 for both operands (a sum does not care about its order): 64-bit fragment loads."""

    def __init__(self, I: int, O: int, G: int, rows_of_a_warp: int | None = None, spread: bool = False):
        super().__init__(I, O, G)
        self.spread = spread  # the one-level finish (see finish_slice); else two ticket levels
        self.warp_rows = rows_of_a_warp or warp_rows(I, O, G)
        self.xv = self.warp_rows // 4  # x-values of a lane
        self.rows = BWD_WARPS * self.warp_rows  # rows of a CTA (a chunk)
        self.blocks = self.I8 // INPUT_BLOCK
        self.KB = G + 1  # basis functions + silu: phase (a)'s feature (N) tiles of a block
        self.KB8 = 8 * self.KB  # features of a block
        self.b_tiles = _ceil(self.KB, 2)  # phase (b)'s feature (M) tiles
        self.m_tiles = self.O16 // 16  # phase (a)'s output (M) tiles
        self.k_steps = self.O8 // 8  # phase (b)'s output (K) steps
        self.row_len = self.O16 * self.KB8  # a partial row: entry o*KB8 + f (o < O16, f < KB8)
        self.row_vecs = self.row_len // 4
        self.dy_stride = _bank_stride(self.O16)
        # sW row (one input of a phase (b) M tile): O8 outputs x 2 features, = 16 (mod 32)
        # words, so a quarter-warp's 128-bit A-fragment loads (2 rows x 4 lanes) miss each other.
        self.w_stride = 2 * self.O8 + (16 - 2 * self.O8) % 32
        self.a_tiles = phase_a_tiles(self.KB, self.m_tiles, self.O16, self.xv * self.KB)
        self.red_stride = _bank_stride(8 * self.a_tiles)
        self.dy_vec = 4 if O % 4 == 0 else 2  # O is even
        self.c_vec = _vector_width(G)  # an input's G coefficients: C rows start aligned
        self.vecs_per_thread = _ceil(self.row_vecs, BWD_THREADS)
        self.rows_per_step = max(1, SUM_LOADS_IN_FLIGHT // self.vecs_per_thread)
        self.dwb_at, self.sums_len = output_layout(O, I, G)

    def smem_bytes(self) -> int:
        words = (self.b_tiles * INPUT_BLOCK * self.w_stride + BWD_WARPS * self.warp_rows * self.dy_stride
                 + BWD_WARPS * self.O16 * self.red_stride)
        return 4 * words + 4 * 16  # + the ticket and allocation alignment

    @cute.jit
    def __call__(self, dy_ptr: cute.Pointer, x_ptr: cute.Pointer, c_ptr: cute.Pointer,
                 wb_ptr: cute.Pointer, dx_ptr: cute.Pointer, sums_ptr: cute.Pointer,
                 work_ptr: cute.Pointer, ticket_ptr: cute.Pointer, batch: Int32,
                 num_chunks: Int32, group_size: Int32, num_groups: Int32, stream: cuda.CUstream):
        I, O, G = self.I, self.O, self.G
        dv, cv = self.dy_vec, self.c_vec
        mDy = cute.make_tensor(dy_ptr, cute.make_layout((batch, O // dv, dv), stride=(O, dv, 1)))
        mX = cute.make_tensor(x_ptr, cute.make_layout((batch, I), stride=(I, 1)))
        mC = cute.make_tensor(c_ptr, cute.make_layout((O, I * G // cv, cv), stride=(I * G, cv, 1)))
        mWb = cute.make_tensor(wb_ptr, cute.make_layout((O, I, 1), stride=(I, 1, 1)))
        mDx = cute.make_tensor(dx_ptr, cute.make_layout((batch, I), stride=(I, 1)))
        mSums = cute.make_tensor(sums_ptr, cute.make_layout(self.sums_len))
        # Block j's rows: its chunks' partial rows, then (two levels) its group rows.
        mWork = cute.make_tensor(work_ptr, cute.make_layout(
            (self.blocks * (num_chunks + num_groups), self.row_vecs, 4), stride=(self.row_len, 4, 1)))
        # Block j's tickets: one per group, then the final one (spread: its one counter).
        mTicket = cute.make_tensor(ticket_ptr, cute.make_layout(self.blocks * (num_groups + 1)))
        self.kernel(mDy, mX, mC, mWb, mDx, mSums, mWork, mTicket, batch, num_chunks, group_size,
                    num_groups).launch(grid=[num_chunks, self.blocks, 1], block=[BWD_THREADS, 1, 1],
                                       stream=stream, cooperative=self.spread)

    @cute.kernel
    def kernel(self, mDy: cute.Tensor, mX: cute.Tensor, mC: cute.Tensor, mWb: cute.Tensor,
               mDx: cute.Tensor, mSums: cute.Tensor, mWork: cute.Tensor, mTicket: cute.Tensor,
               batch: Int32, num_chunks: Int32, group_size: Int32, num_groups: Int32):
        I = self.I
        tid, _, _ = cute.arch.thread_idx()
        chunk, blk, _ = cute.arch.block_idx()
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        warp_first = chunk * self.rows + warp * self.warp_rows
        smem = SmemAllocator()
        # The block's Wcat^T and each warp's dy rows [warp_rows, O16], both as TF32 bits.
        # sW[mt, h, i, o] = Wcat^T[feature 16mt + 8h + i, o]: each lane's A fragment of phase
        # (b), (f, 2p), (f+8, 2p), (f, 2p+1), (f+8, 2p+1), is one 128-bit load (see phase_b).
        sW = smem.allocate_tensor(Int32, cute.make_layout(
            (self.b_tiles, 2, INPUT_BLOCK, self.O8), stride=(INPUT_BLOCK * self.w_stride, 1, self.w_stride, 2)), 16)
        sDy = smem.allocate_tensor(Int32, cute.make_layout(
            (BWD_WARPS, self.warp_rows, self.O16), stride=(self.warp_rows * self.dy_stride, self.dy_stride, 1)), 16)
        sRed = smem.allocate_tensor(Float32, cute.make_layout(
            (BWD_WARPS, self.O16, self.red_stride), stride=(self.O16 * self.red_stride, self.red_stride, 1)), 16)
        sTicket = smem.allocate_tensor(Int32, cute.make_layout(1), 4)

        # 1. Every global load first (x, then dy and the block's weights), so one round trip
        #    covers them all; then the features (registers), then the shared-memory stores.
        xs = []  # zero past the batch and for padding inputs
        for k in cutlass.range_constexpr(self.xv):
            row = warp_first + 8 * (k // 2) + 2 * t + k % 2
            x_val = mX[cutlass.min(row, batch - 1), cutlass.min(blk * INPUT_BLOCK + g, Int32(I - 1))]
            x_val = cutlass.select_(blk * INPUT_BLOCK + g < I, x_val, Float32(0.0))
            xs.append(cutlass.select_(row < batch, x_val, Float32(0.0)))
        dy_regs = self.load_dy(mDy, warp_first, lane, batch)
        c_regs, wb_regs = self.load_weights(mC, mWb, tid, blk)
        phi, uc, dsilu = self.features(xs)
        self.store_dy(dy_regs, sDy, warp, lane)
        self.store_weights(c_regs, wb_regs, sW, tid, blk)
        cute.arch.barrier()

        # 2. Phase (a): the CTA's dWcat partial row, a_tiles feature tiles per round.
        work_row = blk * (num_chunks + num_groups) + chunk
        self.phase_a(phi, sDy, sRed, mWork, work_row, warp, g, t, tid)
        if cutlass.const_expr(self.spread):
            # 3-5 spread (num_groups = 0): arrive at the block's counter, phase (b), wait for the
            # block's other chunks, sum this CTA's slice of the block's rows.
            arrived = _cute.arrive(mTicket, blk, tid)
            self.store_dx(mDx, self.phase_b(phi, uc, dsilu, sW, sDy, warp, g, t), warp_first, g, t, blk, batch)
            _cute.wait_for_arrivals(mTicket, blk, arrived, num_chunks, tid)
            self.finish_slice(mWork, mSums, blk * (num_chunks + num_groups), num_chunks, chunk, tid, blk)
            _cute.depart(mTicket, blk, num_chunks, tid)
        else:
            # 3. Draw the group ticket (CUTLASS's semaphore release: the barrier orders every
            #    thread's partial-row stores before thread 0's gpu-scope fence, then a relaxed
            #    atomic). Its result is first read after phase (b), so the round trip is hidden.
            cute.arch.barrier()
            group = chunk // group_size
            ticket_at = blk * (num_groups + 1) + group
            ticket = Int32(0)
            if tid == 0:
                cute.arch.fence_acq_rel_gpu()
                ticket = cute.arch.atomic_add(mTicket.iterator + ticket_at, Int32(1), sem="relaxed", scope="gpu")

            # 4. Phase (b): dx of the lane's x-values. The group's last CTA (its relaxed atomic read
            #    the count members-1) acquires the members' rows with a gpu-scope fence before its
            #    dx stores: with no store of its own pending, that fence does not wait on any.
            dx = self.phase_b(phi, uc, dsilu, sW, sDy, warp, g, t)
            group_first = group * group_size
            members = cutlass.min(group_size, num_chunks - group_first)
            if tid == 0:
                finisher = Int32(0)
                if ticket == members - 1:
                    cute.arch.fence_acq_rel_gpu()
                    finisher = Int32(1)
                sTicket[0] = finisher
            self.store_dx(mDx, dx, warp_first, g, t, blk, batch)

            # 5. The group's last CTA sums the group's rows in chunk order; with several groups the
            #    last group finisher of the block sums the group rows in group order. Finishers
            #    reset their tickets for the next launch.
            cute.arch.barrier()
            if sTicket[0] == 1:
                block_first = blk * (num_chunks + num_groups)
                acc = cute.make_rmem_tensor((self.vecs_per_thread, 4), Float32)
                _cute.sum_rows_in_order(mWork, block_first + group_first, members, tid, acc, BWD_THREADS,
                                        self.row_vecs, self.rows_per_step)
                if num_groups == 1:
                    self.write_out(mSums, acc, tid, blk)
                else:
                    for j in cutlass.range_constexpr(self.vecs_per_thread):
                        vec = tid + j * BWD_THREADS
                        if vec < self.row_vecs:
                            mWork[block_first + num_chunks + group, vec, None].store(acc[j, None].load())
                    cute.arch.barrier()
                    final_at = blk * (num_groups + 1) + num_groups
                    if tid == 0:
                        cute.arch.fence_acq_rel_gpu()
                        sTicket[0] = cute.arch.atomic_add(mTicket.iterator + final_at, Int32(1),
                                                          sem="acq_rel", scope="gpu")
                    cute.arch.barrier()
                    if sTicket[0] == num_groups - 1:
                        _cute.sum_rows_in_order(mWork, block_first + num_chunks, num_groups, tid, acc, BWD_THREADS,
                                                self.row_vecs, self.rows_per_step)
                        self.write_out(mSums, acc, tid, blk)
                        if tid == 0:
                            mTicket[final_at] = Int32(0)  # ready for the next launch / replay
                if tid == 0:
                    mTicket[ticket_at] = Int32(0)  # every member has drawn: safe to reset

    @cute.jit
    def store_dx(self, mDx: cute.Tensor, dx: list, warp_first: Int32, g: Int32, t: Int32, blk: Int32,
                 batch: Int32):
        for k in cutlass.range_constexpr(self.xv):
            row = warp_first + 8 * (k // 2) + 2 * t + k % 2
            if row < batch and blk * INPUT_BLOCK + g < self.I:
                mDx[row, blk * INPUT_BLOCK + g] = dx[k]

    @cute.jit
    def finish_slice(self, mWork: cute.Tensor, mSums: cute.Tensor, first_row: Int32, num_chunks: Int32,
                     chunk: Int32, tid: Int32, blk: Int32):
        """The spread finish: CTA `chunk` of block blk writes the totals of its slice of the
        block's partial row (rows first_row .. first_row + num_chunks - 1), each summed over
        the rows in chunk order (_cute.sum_slice_in_order: at the defaults 32 chunks, 18
        vectors a slice, 8 lanes a vector summing 4 rows each)."""
        _cute.sum_slice_in_order(mWork, first_row, num_chunks, chunk, tid, BWD_THREADS, SLICE_LOADS,
                                 lambda vec, total: self.write_vector(mSums, total, vec, blk))

    @cute.jit
    def load_dy(self, mDy: cute.Tensor, warp_first: Int32, lane: Int32, batch: Int32) -> cute.Tensor:
        """The warp's dy rows x O16 columns as dy_vec-float vectors (a quarter-warp reads whole
        rows at the defaults); loads unconditional (clamped indices), so all are in flight."""
        per_row = self.O16 // self.dy_vec
        loads = self.warp_rows * per_row // 32
        regs = cute.make_rmem_tensor((loads, self.dy_vec), Float32)
        for k in cutlass.range_constexpr(loads):
            idx = lane + 32 * k
            r = idx // per_row
            c = idx - r * per_row
            regs[k, None].store(mDy[cutlass.min(warp_first + r, batch - 1),
                                    cutlass.min(c, Int32(self.O // self.dy_vec - 1)), None].load())
            if warp_first + r >= batch or c >= self.O // self.dy_vec:
                regs[k, None].fill(0.0)  # rows past the batch and outputs past O add nothing
        return regs

    @cute.jit
    def store_dy(self, regs: cute.Tensor, sDy: cute.Tensor, warp: Int32, lane: Int32):
        per_row = self.O16 // self.dy_vec
        sDyV = cute.make_tensor(sDy.iterator, cute.make_layout(
            (BWD_WARPS, self.warp_rows, per_row, self.dy_vec),
            stride=(self.warp_rows * self.dy_stride, self.dy_stride, self.dy_vec, 1)))
        bits = cute.make_rmem_tensor((self.dy_vec,), Int32)
        for k in cutlass.range_constexpr(self.warp_rows * per_row // 32):
            idx = lane + 32 * k
            r = idx // per_row
            for e in cutlass.range_constexpr(self.dy_vec):
                bits[e] = round_tf32_bits(regs[k, e])
            sDyV[warp, r, idx - r * per_row, None].store(bits.load())

    @cute.jit
    def load_weights(self, mC: cute.Tensor, mWb: cute.Tensor, tid: Int32, blk: Int32) -> tuple:
        """Task (o, i), o fastest: C[o, (8 blk + i)*G + gb] for all gb (G contiguous floats,
        as c_vec-float vectors) and Wb[o, 8 blk + i]; unconditional (clamped indices)."""
        G, cv = self.G, self.c_vec
        tasks = self.O * INPUT_BLOCK
        c_regs = cute.make_rmem_tensor((_ceil(tasks, BWD_THREADS), G // cv, cv), Float32)
        wb_regs = cute.make_rmem_tensor((_ceil(tasks, BWD_THREADS),), Float32)
        for k in cutlass.range_constexpr(_ceil(tasks, BWD_THREADS)):
            idx = cutlass.min(tid + k * BWD_THREADS, Int32(tasks - 1))
            o = idx % self.O
            col = cutlass.min(blk * INPUT_BLOCK + idx // self.O, Int32(self.I - 1))
            for v in cutlass.range_constexpr(G // cv):
                c_regs[k, v, None].store(mC[o, col * (G // cv) + v, None].load())
            wb_regs[k] = mWb[o, col, 0]
        return c_regs, wb_regs

    @cute.jit
    def store_weights(self, c_regs: cute.Tensor, wb_regs: cute.Tensor, sW: cute.Tensor,
                      tid: Int32, blk: Int32):
        """sW[gb // 2, gb % 2, i, o] <- TF32(Wcat[o, feature (gb, 8 blk + i)]); zero for inputs
        past I, outputs past O and the basis slot past G when G+1 is odd. A warp's stores of
        one basis function are 32 outputs 2 words apart: 2 lanes a bank."""
        G, cv = self.G, self.c_vec
        tasks = self.O * INPUT_BLOCK
        for k in cutlass.range_constexpr(_ceil(tasks, BWD_THREADS)):
            idx = tid + k * BWD_THREADS
            o = idx % self.O
            i = idx // self.O
            if idx < tasks:
                real = blk * INPUT_BLOCK + i < self.I
                for gb in cutlass.range_constexpr(G):
                    bits = round_tf32_bits(c_regs[k, gb // cv, gb % cv])
                    sW[gb // 2, gb % 2, i, o] = cutlass.select_(real, bits, Int32(0))
                bits = round_tf32_bits(wb_regs[k])
                sW[G // 2, G % 2, i, o] = cutlass.select_(real, bits, Int32(0))
        if cutlass.const_expr(self.KB % 2 == 1):  # M tile slot past silu
            for k in cutlass.range_constexpr(_ceil(INPUT_BLOCK * self.O8, BWD_THREADS)):
                idx = tid + k * BWD_THREADS
                if idx < INPUT_BLOCK * self.O8:
                    sW[self.KB // 2, 1, idx // self.O8, idx % self.O8] = Int32(0)
        pad_o = self.O8 - self.O
        for k in cutlass.range_constexpr(_ceil(self.KB * INPUT_BLOCK * pad_o, BWD_THREADS)):
            idx = tid + k * BWD_THREADS
            if idx < self.KB * INPUT_BLOCK * pad_o:
                f = idx // pad_o
                sW[f // 16, (f // 8) % 2, f % 8, self.O + idx % pad_o] = Int32(0)

    @cute.jit
    def features(self, xs: list) -> tuple:
        """For each x-value k: phi[gb][k] (gb < G: the Gaussians; gb = G: silu), the clamped
        u = (x + 2)/delta and silu'(x).

        phi_gb = exp(-(u - gb)^2). Within a chain of GAUSS_CHAIN consecutive gb from s,
        phi_{s+c+1} = phi_{s+c} * exp(2(u-s) - 1) * exp(-2c): two ex2 per chain instead of one
        per basis function (the MUFU unit, 16 results/clk/SM, is the features' bound).
        u is clamped to [-U_CLAMP, G-1+U_CLAMP], where every phi is below exp(-100), so the
        chain never forms inf * 0; a chain start that underflows loses only terms below
        exp(-(9.3 - 3)^2) ~ 4e-18. Float64 check: within 2e-6 absolute of exp(-(u-gb)^2),
        far below the TF32 rounding (2^-11) the features go through."""
        G = self.G
        phi = [[Float32(0.0)] * self.xv for _ in range(self.KB)]
        uc = [Float32(0.0)] * self.xv
        dsilu = [Float32(0.0)] * self.xv
        for k in cutlass.range_constexpr(self.xv):
            x = xs[k]
            u = x * Float32(1.0 / self.delta) + Float32(2.0 / self.delta)
            u = cute.arch.fmin(cute.arch.fmax(u, Float32(-U_CLAMP)), Float32(G - 1 + U_CLAMP))
            uc[k] = u
            for s in cutlass.range_constexpr(0, G, GAUSS_CHAIN):
                v = u - Float32(s)
                p = _computed_once(cute.math.exp2(v * (v * Float32(-LOG2E)), fastmath=True))
                phi[s][k] = p
                if cutlass.const_expr(min(GAUSS_CHAIN, G - s) > 1):
                    r = cute.math.exp2(v * Float32(2.0 * LOG2E) - Float32(LOG2E), fastmath=True)
                    for c in cutlass.range_constexpr(1, min(GAUSS_CHAIN, G - s)):
                        p = _computed_once(p * r)
                        phi[s + c][k] = p
                        r = r * Float32(math.exp(-2.0))
            sig = cute.arch.rcp_approx(Float32(1.0) + cute.math.exp2(x * Float32(-LOG2E), fastmath=True))
            silu = x * sig
            phi[G][k] = silu
            dsilu[k] = sig + silu * (Float32(1.0) - sig)
        return phi, uc, dsilu

    @cute.jit
    def phase_a(self, phi: list, sDy: cute.Tensor, sRed: cute.Tensor, mWork: cute.Tensor,
                work_row: Int32, warp: Int32, g: Int32, t: Int32, tid: Int32):
        """dWcat partial over the warp's rows (MMA), the 8 warps' tiles summed in warp order
        into the CTA's partial row mWork[work_row] (entry o*KB8 + f), a_tiles tiles a round."""
        mma = warp_mma(1, 1)
        frag_a = cute.make_rmem_tensor((4, 1, 1, self.m_tiles), cutlass.TFloat32)
        frag_a_bits = cute.recast_tensor(frag_a, Int32)
        frag_b = cute.make_rmem_tensor((2, 1, 1), cutlass.TFloat32)
        frag_b_bits = cute.recast_tensor(frag_b, Int32)
        pair = cute.make_rmem_tensor((2,), Float32)
        sRed2 = cute.make_tensor(sRed.iterator, cute.make_layout(
            (BWD_WARPS, self.O16, self.red_stride // 2, 2), stride=(self.O16 * self.red_stride, self.red_stride, 2, 1)))
        sRed4 = cute.make_tensor(sRed.iterator, cute.make_layout(
            (BWD_WARPS, self.O16, self.red_stride // 4, 4), stride=(self.O16 * self.red_stride, self.red_stride, 4, 1)))
        rounds = _ceil(self.KB, self.a_tiles)
        for rnd in cutlass.range_constexpr(rounds):
            n0 = rnd * self.a_tiles
            nn = min(self.a_tiles, self.KB - n0)
            acc = cute.make_rmem_tensor((4, 1, 1, self.m_tiles, nn), Float32)
            acc.fill(0.0)
            for q in cutlass.range_constexpr(self.warp_rows // 8):  # K step: rows 8q .. 8q+7
                r0 = 8 * q + 2 * t
                for m in cutlass.range_constexpr(self.m_tiles):
                    frag_a_bits[0, 0, 0, m] = sDy[warp, r0, 16 * m + g]
                    frag_a_bits[1, 0, 0, m] = sDy[warp, r0, 16 * m + g + 8]
                    frag_a_bits[2, 0, 0, m] = sDy[warp, r0 + 1, 16 * m + g]
                    frag_a_bits[3, 0, 0, m] = sDy[warp, r0 + 1, 16 * m + g + 8]
                for n in cutlass.range_constexpr(nn):
                    frag_b_bits[0, 0, 0] = tf32_operand_bits_finite(phi[n0 + n][2 * q])
                    frag_b_bits[1, 0, 0] = tf32_operand_bits_finite(phi[n0 + n][2 * q + 1])
                    for m in cutlass.range_constexpr(self.m_tiles):
                        cute.gemm(mma, acc[None, None, None, m, n], frag_a[None, None, None, m],
                                  frag_b, acc[None, None, None, m, n])
            if cutlass.const_expr(rnd > 0):
                cute.arch.barrier()  # the previous round's sums have read sRed
            # C fragment: (o, f) = (16m + g, 8n + 2t + {0,1}) and (16m + g + 8, same f).
            for m in cutlass.range_constexpr(self.m_tiles):
                for n in cutlass.range_constexpr(nn):
                    for half in cutlass.range_constexpr(2):
                        pair[0] = acc[2 * half, 0, 0, m, n]
                        pair[1] = acc[2 * half + 1, 0, 0, m, n]
                        sRed2[warp, 16 * m + g + 8 * half, 4 * n + t, None].store(pair.load())
            cute.arch.barrier()
            per_o = 2 * nn  # float4 vectors of a round's row segment
            vecs = self.O16 * per_o
            for v in cutlass.range_constexpr(_ceil(vecs, BWD_THREADS)):
                vec = tid + v * BWD_THREADS
                if vec < vecs:
                    o = vec // per_o
                    c4 = vec - o * per_o
                    total = sRed4[0, o, c4, None].load()
                    for w in cutlass.range_constexpr(1, BWD_WARPS):
                        total = total + sRed4[w, o, c4, None].load()
                    mWork[work_row, o * (self.KB8 // 4) + 2 * n0 + c4, None].store(total)

    @cute.jit
    def phase_b(self, phi: list, uc: list, dsilu: list, sW: cute.Tensor, sDy: cute.Tensor,
                warp: Int32, g: Int32, t: Int32) -> list:
        """dx of the lane's x-values: dfeat^T tiles (MMA) times dphi/dx, summed over the basis
        functions in order."""
        G = self.G
        mma = warp_mma(1, 1)
        frag_a = cute.make_rmem_tensor((4, 1, 1), cutlass.TFloat32)
        frag_a_bits = cute.recast_tensor(frag_a, Int32)
        frag_b = cute.make_rmem_tensor((2, 1, 1), cutlass.TFloat32)
        frag_b_bits = cute.recast_tensor(frag_b, Int32)
        quad = cute.make_rmem_tensor((4,), Int32)
        pair = cute.make_rmem_tensor((2,), Int32)
        sW4 = cute.make_tensor(sW.iterator, cute.make_layout(
            (self.b_tiles, INPUT_BLOCK, self.O8 // 2, 4), stride=(INPUT_BLOCK * self.w_stride, self.w_stride, 4, 1)))
        sDy2 = cute.make_tensor(sDy.iterator, cute.make_layout(
            (BWD_WARPS, self.warp_rows, self.dy_stride // 2, 2),
            stride=(self.warp_rows * self.dy_stride, self.dy_stride, 2, 1)))
        gauss = [Float32(0.0)] * self.xv  # sum_gb dfeat * phi * (u - gb)
        lin = [Float32(0.0)] * self.xv  # dfeat_silu * silu'
        n_tiles = self.warp_rows // 8
        for mt in cutlass.range_constexpr(self.b_tiles):
            acc = cute.make_rmem_tensor((4, 1, 1, n_tiles), Float32)
            acc.fill(0.0)
            for ks in cutlass.range_constexpr(self.k_steps):
                # A: Wcat^T (f, o) = (16mt + g, 8ks + 2t), (f + 8, same), (f, o + 1), (f + 8, o + 1).
                quad.store(sW4[mt, g, 4 * ks + t, None].load())
                for e in cutlass.range_constexpr(4):
                    frag_a_bits[e, 0, 0] = quad[e]
                for nq in cutlass.range_constexpr(n_tiles):
                    # B: dy^T outputs 8ks + 2t, +1 of row 8nq + g.
                    pair.store(sDy2[warp, 8 * nq + g, 4 * ks + t, None].load())
                    frag_b_bits[0, 0, 0] = pair[0]
                    frag_b_bits[1, 0, 0] = pair[1]
                    cute.gemm(mma, acc[None, None, None, nq], frag_a, frag_b, acc[None, None, None, nq])
            # acc[e, nq]: feature 16mt + g + 8*(e // 2) (basis 2mt + e // 2, input g), row
            # 8nq + 2t + e % 2 (x-value 2nq + e % 2).
            for nq in cutlass.range_constexpr(n_tiles):
                for e in cutlass.range_constexpr(4):
                    gb = 2 * mt + e // 2
                    k = 2 * nq + e % 2
                    dfeat = acc[e, 0, 0, nq]
                    if cutlass.const_expr(gb < G):
                        gauss[k] = gauss[k] + (dfeat * phi[gb][k]) * (uc[k] - Float32(gb))
                    elif cutlass.const_expr(gb == G):
                        lin[k] = lin[k] + dfeat * dsilu[k]
        # dphi/dx = phi * (-2 (x - mu) / delta^2) = phi * (u - gb) * (-2 / delta)
        return [gauss[k] * Float32(-2.0 / self.delta) + lin[k] for k in range(self.xv)]

    @cute.jit
    def write_out(self, mSums: cute.Tensor, acc: cute.Tensor, tid: Int32, blk: Int32):
        """Block blk's totals to their places in sums: entry o*KB8 + gb*8 + i is dC[o, (8 blk
        + i)*G + gb] (gb < G) or dWb[o, 8 blk + i] (gb = G); padding dropped."""
        for v in cutlass.range_constexpr(self.vecs_per_thread):
            self.write_vector(mSums, acc[v, None], tid + v * BWD_THREADS, blk)

    @cute.jit
    def write_vector(self, mSums: cute.Tensor, total: cute.Tensor, vec: Int32, blk: Int32):
        """Float4 vector `vec` of block blk's totals to its places in sums (see write_out)."""
        I, O, G = self.I, self.O, self.G
        for e in cutlass.range_constexpr(4):
            entry = vec * 4 + e
            o = entry // self.KB8
            f = entry - o * self.KB8
            gb = f // INPUT_BLOCK
            i = blk * INPUT_BLOCK + f - gb * INPUT_BLOCK
            if vec < self.row_vecs and o < O and i < I:
                place = self.dwb_at + o * I + i
                if gb < G:
                    place = o * (I * G) + i * G + gb
                mSums[place] = total[e]


class KanGradReduce:
    """The KAN grad reduce's second stage: the backward CTAs' partial rows [R, partial_len]
    summed over R in a fixed order (bit-identical run to run), each column then stored at its
    place in sums (see GradLayout), padding dropped.

    A CTA owns 128 columns (lane l: 4 consecutive columns, one 128-bit load a row) and splits
    the rows among REDUCE_ROW_GROUPS = 16 warps: warp w adds rows w, w+16, ... in order, then
    warp 0 adds the 16 warps' sums in warp order. At the defaults (fp32: 32 x 288 columns,
    R = 128 at B=8192) that is 72 CTAs reading 4.7 MB, a thread 8 rows, all 8 loads in flight
    at once (docs/notes/kan.md).
    (Not kernels.column_sum: this reduce also puts each column at its place in dC | dWb and
    drops the padding, which would otherwise take a gather kernel afterwards.)"""

    def __init__(self, layout: GradLayout):
        self.grads = layout
        self.vecs = layout.partial_len // 4  # static: every row stays 16-byte aligned

    @cute.jit
    def __call__(self, part_ptr: cute.Pointer, sums_ptr: cute.Pointer, rows: Int32, stream: cuda.CUstream):
        mPart = cute.make_tensor(part_ptr, cute.make_layout((rows, self.vecs, 4),
                                                            stride=(self.vecs * 4, 4, 1)))
        mSums = cute.make_tensor(sums_ptr, cute.make_layout(self.grads.sums_len))
        # Programmatic dependent launch: the CTAs become resident while the backward kernel
        # still runs (it triggers at its start) and start reading as soon as it has finished,
        # instead of paying a launch after it (a graph-replayed kernel boundary costs ~1-3 us).
        self.kernel(mPart, mSums, rows).launch(
            grid=[_ceil(self.vecs, 32), 1, 1], block=[REDUCE_ROW_GROUPS * 32, 1, 1], stream=stream,
            use_pdl=True)

    @cute.kernel
    def kernel(self, mPart: cute.Tensor, mSums: cute.Tensor, rows: Int32):
        L = self.grads
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        warp = tid // 32
        lane = tid % 32
        smem = SmemAllocator()
        sPart = smem.allocate_tensor(Float32, cute.make_layout((REDUCE_ROW_GROUPS, 32, 4), stride=(128, 4, 1)), 16)
        # Launched with PDL: nothing the backward kernel writes may be read before this
        # returns (it waits for that grid to finish and its writes to be visible).
        cute.arch.griddepcontrol_wait()
        vec = cta * 32 + lane
        vec_in = cutlass.min(vec, Int32(self.vecs - 1))  # past the end: read a real column, store nothing
        acc = cute.make_rmem_tensor((4,), Float32)
        acc.fill(0.0)
        row_vec = cute.make_rmem_tensor((4,), Float32)
        for r in cutlass.range(warp, rows, REDUCE_ROW_GROUPS, unroll=8):
            row_vec.store(mPart[r, vec_in, None].load())
            acc.store(acc.load() + row_vec.load())
        sPart[warp, lane, None].store(acc.load())
        cute.arch.barrier()
        if warp == 0:
            total = cute.make_rmem_tensor((4,), Float32)
            total.store(sPart[0, lane, None].load())
            for w in cutlass.range_constexpr(1, REDUCE_ROW_GROUPS):
                total.store(total.load() + sPart[w, lane, None].load())
            for u in cutlass.range_constexpr(4):
                column = vec * 4 + u
                o = column // L.FP
                f = column - o * L.FP
                gb = f // L.IP
                i = f - gb * L.IP
                if vec < self.vecs and o < L.O and i < L.I and gb <= L.G:
                    place = L.dwb_at + o * L.I + i  # dWb[o, i]
                    if gb < L.G:
                        place = o * (L.I * L.G) + i * L.G + gb  # dC[o, i*G + gb]
                    mSums[place] = total[u]


_compiled = _cute.CompiledCache(__name__)


_KERNELS = {("forward", "fp32"): KanForwardFp32, ("backward", "fp32"): KanBackwardFp32,
            ("forward", "tf32"): KanForwardTf32, ("backward", "tf32"): KanBackwardTf32}


def _kernel_and_args(kind: str, I: int, O: int, G: int, precision: str, spread: bool = False) -> tuple[Any, tuple]:
    """The kernel object and the (fake) arguments it compiles with (spread: the TF32
    backward's one-level finish)."""
    if (kind, precision) == ("backward", "tf32"):
        # dy, x, C, Wb, dx, sums, work, tickets; batch, chunks, group size, groups
        args = (*[_cute.fake_ptr() for _ in range(7)], _cute.fake_ptr(Int32),
                *[Int32(1)] * 4, _cute.fake_stream())
        return KanBackwardTf32(I, O, G, spread=spread), args
    pointers = 4 if kind == "forward" else 6
    args = (*[_cute.fake_ptr() for _ in range(pointers)], Int32(1), _cute.fake_stream())
    return _KERNELS[kind, precision](I, O, G), args


def _reduce_args() -> tuple:
    return (_cute.fake_ptr(), _cute.fake_ptr(), Int32(1), _cute.fake_stream())


def _compile_reduce(layout: GradLayout, keep: bool = False) -> Any:
    return _compiled.get(("reduce", layout.key(), keep), lambda: _cute.compile_kernel(
        KanGradReduce(layout), *_reduce_args(), keep=keep))


def _compile(kind: str, I: int, O: int, G: int, precision: str, keep: bool = False, spread: bool = False) -> Any:
    def build():
        kernel, args = _kernel_and_args(kind, I, O, G, precision, spread)
        return _cute.compile_kernel(kernel, *args, keep=keep)
    return _compiled.get((kind, I, O, G, precision, keep, spread), build)


@functools.lru_cache(maxsize=None)
def _tf32_backward(I: int, O: int, G: int) -> KanBackwardTf32:
    """The TF32 backward's static configuration (sizes of its grid, rows and shared memory)."""
    return KanBackwardTf32(I, O, G)


def smem_bytes(I: int, O: int, G: int) -> int:
    """Shared memory of the largest kernel (either precision, forward or backward)."""
    F = (G + 1) * I
    fp32 = 4 * (ROWS * (I + 1) + _ceil(F, 32) * 32 * ROW_PAD + _ceil(O, 8) * 8 * ROW_PAD + O * F)
    t = KanTf32Config(I, O, G)
    tf32_forward = 4 * t.O8 * (t.KP + 8)
    return max(fp32, tf32_forward, _tf32_backward(I, O, G).smem_bytes())


def fp32_accumulators(I: int, O: int, G: int) -> int:
    """Most float accumulators one thread of the fp32 kernels holds (dWcat and dfeat tiles)."""
    return max(_ceil(O, 8) * _ceil((G + 1) * I, 32), 4 * (G + 1))


CONTRACT = KernelContract(passes=("forward", "backward"), options={"precision": PRECISIONS})


def check_sizes(chk: _arrays.Checker) -> None:
    """Supported: O even (outputs stored in pairs); fp32 per-thread accumulators
    ceil(O/8)*ceil((G+1)*I/32) and 4*(G+1) within 64 (so G <= 15, and the tf32 backward's
    held features, at most 4*(G+1) with 16-row warps, stay within MAX_HELD_FEATURES);
    shared memory of the largest kernel <= 200 KB (the defaults I=32, O=32, G=8: 132 KB,
    the fp32 backward); B*max(I, O) < 2**31 and the tf32 backward's partial rows under
    2**31 floats (32-bit indexing)."""
    I, O = chk.dims["I"], chk.dims["O"]
    G = chk.dims["I*G"] // I
    chk.dim_multiple("O", 2, "outputs are stored two at a time")
    where = f"{chk.where}: I={I}, O={O}, G={G} is outside the supported range:"
    if fp32_accumulators(I, O, G) > MAX_ACC:
        raise _arrays.FoxcuteInputError(
            f"{where} an fp32 thread would hold {fp32_accumulators(I, O, G)} accumulators "
            f"(at most {MAX_ACC})")
    if smem_bytes(I, O, G) > MAX_SMEM_BYTES:
        raise _arrays.FoxcuteInputError(
            f"{where} it needs {smem_bytes(I, O, G)} bytes of shared memory per CTA, over "
            f"{MAX_SMEM_BYTES}")
    chk.dim_range("B", 1, MAX_ELEMENTS // max(I, O), "32-bit indexing")
    t = _tf32_backward(I, O, G)
    max_groups = MAX_TICKETS // t.blocks - 1  # >= 1: the fp32 limit bounds I far below 1024
    rows = MAX_ELEMENTS // (t.blocks * t.row_len) - max_groups  # chunk rows of each block
    chk.dim_range("B", 1, t.rows * rows, "32-bit indexing of the tf32 backward's partial sums")


def forward(x, C, Wb, *, precision: str = "tf32"):
    """y [B, O] on x's current stream."""
    B, I = x.shape
    O = C.shape[0]
    G = C.shape[1] // I
    y = _arrays.empty(x, (B, O))
    _compile("forward", I, O, G, precision)(
        _cute.gmem_ptr(x), _cute.gmem_ptr(C), _cute.gmem_ptr(Wb), _cute.gmem_ptr(y), Int32(B),
        _cute.current_stream(x))
    return y


def backward(dy, x, C, Wb, *, precision: str = "tf32"):
    """(dC, dWb, dx) on x's current stream; dC and dWb are views into one array.
    tf32: one launch (KanBackwardTf32, the batch reduction included; its tickets come from
    _cute.tickets and are left at zero). fp32: the backward kernel, then the grad reduce."""
    B, I = x.shape
    O = C.shape[0]
    G = C.shape[1] // I
    dx = _arrays.empty(x, (B, I))
    dwb_at, sums_len = output_layout(O, I, G)
    sums = _arrays.empty(x, (sums_len,))
    ptr = _cute.gmem_ptr
    if precision == "tf32":
        t = _tf32_backward(I, O, G)
        chunks, group_size, groups = reduction_grid(B, t.blocks, t.rows)
        spread = spreads(chunks, t.blocks, _arrays.sm_count(x))
        if spread:
            group_size, groups = chunks, 0
        work = _arrays.empty(x, (t.blocks * (chunks + groups) * t.row_len,))  # fully rewritten
        tickets = _cute.tickets(x, t.blocks * (groups + 1))
        _compile("backward", I, O, G, precision, spread=spread)(
            ptr(dy), ptr(x), ptr(C), ptr(Wb), ptr(dx), ptr(sums), ptr(work), ptr(tickets, Int32),
            Int32(B), Int32(chunks), Int32(group_size), Int32(groups), _cute.current_stream(x))
    else:
        layout = GradLayout(O, I, G)
        num_ctas = _ceil(B, ROWS)  # the kernel's grid
        partials = _arrays.empty(x, (num_ctas, layout.partial_len))
        _compile("backward", I, O, G, precision)(
            ptr(dy), ptr(x), ptr(C), ptr(Wb), ptr(dx), ptr(partials), Int32(B), _cute.current_stream(x))
        _compile_reduce(layout)(ptr(partials), ptr(sums), Int32(num_ctas), _cute.current_stream(x))
    dC = sums[:O * I * G].reshape(O, I * G)
    dWb = sums[dwb_at:].reshape(O, I)
    return dC, dWb, dx


DEFAULTS = (32, 32, 8)  # I, O, G


def kernels_for_ci() -> dict[str, tuple[Any, tuple]]:
    """{name: (kernel, compile arguments)} for each kernel at the defaults, and the TF32
    backward with 16-row warps (many basis functions, several output tiles); the TF32
    backward with both finishes (spread, as at the defaults on an H200; two_level, where its
    grid is larger than the SMs)."""
    kernels = {f"kan_{kind}_{p}": _kernel_and_args(kind, *DEFAULTS, p, spread=True)
               for kind in ("forward", "backward") for p in ("tf32", "fp32")}
    kernels["kan_backward_two_level_tf32"] = _kernel_and_args("backward", *DEFAULTS, "tf32")
    kernels["kan_backward_I16_O48_G12_tf32"] = _kernel_and_args("backward", 16, 48, 12, "tf32", spread=True)
    kernels["kan_backward_I16_O48_G12_two_level_tf32"] = _kernel_and_args("backward", 16, 48, 12, "tf32")
    I, O, G = DEFAULTS
    kernels["kan_grad_reduce"] = (KanGradReduce(GradLayout(O, I, G)), _reduce_args())  # fp32
    return kernels


def compiled_for_ci() -> dict[str, Any]:
    """Forward and backward of each precision at the defaults (I=32, O=32, G=8; the TF32
    backward with both finishes), PTX kept."""
    compiled = {f"kan_{kind}_{p}": _compile(kind, *DEFAULTS, p, keep=True, spread=True)
                for kind in ("forward", "backward") for p in ("tf32", "fp32")}
    compiled["kan_backward_two_level_tf32"] = _compile("backward", *DEFAULTS, "tf32", keep=True)
    I, O, G = DEFAULTS
    compiled["kan_grad_reduce"] = _compile_reduce(GradLayout(O, I, G), keep=True)  # fp32
    return compiled
