"""KAN layer (Gaussian RBF basis), spec section 4: forward y and backward (dC, dWb, dx).

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
  backward  bytes x, dy, dx: 3.1 MB, plus the dWcat partials F*O*4 = 36.9 KB per CTA written
            and read once (128 CTAs: 4.7 MB) -> ~1.9 us; flops 2 * 151 MFLOP (dWcat, dfeat)
            -> TF32: bound by those bytes (~2 us); FFMA: ~4.9 us
The dWcat partials (one row of O*F floats, padded, per CTA; see GradLayout) are summed by
KanGradReduce in a fixed order: deterministic, no atomics.

fp32 (FFMA; a CTA of 256 threads takes ROWS=64 rows):
  1. x (and dy) tiles into shared memory; thread (row, input) computes that input's G+1
     features into sFeat[f, row] (feature-major, row stride ROWS+4: 128-bit loads of 4 rows).
  forward: thread (4 rows, 2 outputs) accumulates 8 outputs over F with one 128-bit and one
     64-bit shared load per 8 FMAs.
  backward: (a) dWcat partial: warp w owns outputs o = w, w+8, ..., lane l owns features
     f = l, l+32, ...; each sums dy[r, o]*feat[f, r] over the CTA's rows, 4 rows per 128-bit
     load. (b) dx: thread (4 rows, input i) accumulates dfeat for its G+1 features over O,
     then dx = sum_g dfeat_g * phi_g * (-2 (x - mu_g) / delta^2) + dfeat_G * silu'(x).
tf32 (mma.sync m16n8k8, 4 warps = 64 rows a CTA): see KanTf32Config, KanForwardTf32 and
  KanBackwardTf32. The forward gathers Wcat into shared memory by cp.async (issued at once,
  waited for once) and computes its A fragments' basis values in registers; the backward
  reads C and Wb with coalesced 16-byte loads and stores them transposed (WeightGatherPlan).
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.memory import SmemAllocator

from .. import _arrays
from . import _cute

THREADS = 256
ROWS = 64  # rows of a CTA: B=8192 gives 128 CTAs, one wave on an H200
ROW_PAD = ROWS + 4  # feature-major tiles: 4-row vectors stay 16-byte aligned, rows spread over banks
REDUCE_ROW_GROUPS = 16  # grad reduce: warps of a CTA that split the partial rows (8 rows each at B=8192)
MAX_ACC = 64  # fp32: accumulators a thread may hold
MAX_TF32_ACC = 128  # tf32 backward: MMA accumulator registers (72 at the defaults, no spills)
MAX_SMEM_BYTES = 200 * 1024
MAX_ELEMENTS = 2**31 - 1
TF32_WARPS = 4
TF32_THREADS = TF32_WARPS * 32
TF32_ROWS = TF32_WARPS * 16  # a warp owns one 16-row MMA tile: B=8192 -> 128 CTAs


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class GradLayout:
    """Where the backward kernels put their dWcat partial sums and where the grad reduce puts
    the totals.

    Partial rows (one per backward CTA) are in the kernel's own (output, feature) order,
    column o*FP + f for o < OP, f = g*IP + i < FP (padded sizes, written whole, so stores stay
    contiguous); the reduce maps each column to its place in sums = [dC (O x I*G, C's order)
    | pad to a multiple of 4 | dWb (O x I)] and drops the padding."""

    def __init__(self, O: int, I: int, G: int, precision: str):
        self.O, self.I, self.G = O, I, G
        if precision == "tf32":
            self.IP = _ceil(I, 8) * 8
            self.FP = (G + 1) * self.IP
            self.OP = _ceil(O, 16) * 16
        else:
            self.IP = I
            self.FP = _ceil((G + 1) * I, 32) * 32
            self.OP = _ceil(O, THREADS // 32) * (THREADS // 32)
        self.partial_len = self.OP * self.FP
        self.dwb_at = _ceil(O * I * G, 4) * 4
        self.sums_len = self.dwb_at + O * I

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
                 y_ptr: cute.Pointer, batch: Int32, stream):
        O = self.O
        mX, mC, mWb = self.operand_tensors(batch, x_ptr, c_ptr, wb_ptr)
        mY = cute.make_tensor(y_ptr, cute.make_layout((batch, O // 2, 2), stride=(O, 2, 1)))
        self.kernel(mX, mC, mWb, mY, batch).launch(
            grid=[cute.ceil_div(batch, self.rows), 1, 1], block=[self.threads, 1, 1], stream=stream)


class KanForwardFp32(_ForwardLaunch, KanConfig):

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mC: cute.Tensor, mWb: cute.Tensor, mY: cute.Tensor,
               batch: Int32):
        I, O, G, F = self.I, self.O, self.G, self.F
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        first = cta * ROWS
        smem = SmemAllocator()
        sX = smem.allocate_tensor(Float32, cute.make_layout((ROWS, I), stride=(I + 1, 1)), 16)
        sFeat = smem.allocate_tensor(Float32, cute.make_layout((F, ROWS), stride=(ROW_PAD, 1)), 16)
        sWt = smem.allocate_tensor(Float32, cute.make_layout((F, O), stride=(O, 1)), 16)
        # Wcat^T [F, O]: C (f = g*I + i) and Wb (f = G*I + i).
        for k in cutlass.range_constexpr(_ceil(O * I * G, THREADS)):
            idx = cutlass.min(tid + k * THREADS, Int32(O * I * G - 1))
            o = idx // (I * G)
            col = idx - o * (I * G)
            i = col // G
            sWt[(col - i * G) * I + i, o] = mC[o, col]
        for k in cutlass.range_constexpr(_ceil(O * I, THREADS)):
            idx = cutlass.min(tid + k * THREADS, Int32(O * I - 1))
            o = idx // I
            sWt[G * I + idx - o * I, o] = mWb[o, idx - o * I]
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
        self.grads = GradLayout(O, I, G, "fp32")
        self.o_per_warp = _ceil(O, THREADS // 32)
        self.f_per_lane = _ceil(self.F, 32)

    @cute.jit
    def __call__(self, dy_ptr: cute.Pointer, x_ptr: cute.Pointer, c_ptr: cute.Pointer,
                 wb_ptr: cute.Pointer, dx_ptr: cute.Pointer, part_ptr: cute.Pointer,
                 batch: Int32, stream):
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
        # Wcat [O, F]: C (f = g*I + i) and Wb (f = G*I + i); dy tile transposed to [o, row].
        for k in cutlass.range_constexpr(_ceil(O * I * G, THREADS)):
            idx = cutlass.min(tid + k * THREADS, Int32(O * I * G - 1))
            o = idx // (I * G)
            col = idx - o * (I * G)
            i = col // G
            sW[o, (col - i * G) * I + i] = mC[o, col]
        for k in cutlass.range_constexpr(_ceil(O * I, THREADS)):
            idx = cutlass.min(tid + k * THREADS, Int32(O * I - 1))
            o = idx // I
            sW[o, G * I + idx - o * I] = mWb[o, idx - o * I]
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
        mma = cute.make_mma_atom(cute.nvgpu.warp.MmaTF32Op((16, 8, 8)))
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
                    frag_a_bits[v, 0, 0] = Int32(cute.arch.cvt_f32_tf32(a_vals[v]))
                pair = (gb * self.I8 + blk * 8) // 2 + t
                for j in cutlass.range_constexpr(tiles):
                    w.store(sW2[j * 8 + g, pair, None].load())
                    frag_b_bits[0, 0, 0] = Int32(cute.arch.cvt_f32_tf32(w[0]))
                    frag_b_bits[1, 0, 0] = Int32(cute.arch.cvt_f32_tf32(w[1]))
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


class WeightGatherPlan:
    """How the TF32 backward reads one of Wcat's sources, src [O, cols] (C: cols = I*G,
    Wb: cols = I), into Wcat^T: `vec`-float vectors along src's rows (16 bytes where cols % 4
    == 0), a warp instruction taking 8 consecutive vectors of 4 consecutive rows (128
    contiguous bytes a row, 4 cache lines, instead of the 32 lines a lane-per-output
    gather of single floats touched). Thread tid's task k is vector tid + k*TF32_THREADS of
    that tiling; a thread holds at most `batch` vectors (4*batch registers) at once, the
    first `first_batch` loaded before the rest of the staging."""

    def __init__(self, rows: int, cols: int, is_wb: bool):
        self.is_wb = is_wb
        self.vec = 4 if cols % 4 == 0 else (2 if cols % 2 == 0 else 1)
        self.row_stride = cols
        self.vecs_per_row = cols // self.vec
        self.tiles_per_row_block = _ceil(self.vecs_per_row, 8)
        self.tasks = _ceil(_ceil(rows, 4) * self.tiles_per_row_block * 32, TF32_THREADS)
        self.batch = 64 // self.vec
        self.first_batch = min(self.tasks, self.batch)


class KanBackwardTf32(KanTf32Config):
    """A CTA of 4 warps takes TF32_ROWS rows. Shared: the feature tile sFeat[f, row] (float32),
    dy^T tile sDy[o, row] (TF32-rounded) and Wcat^T sWt[f, o] (float32, rounded as
    fragments are built; gathered as WeightGatherPlan says, since a lane-per-output gather
    of single floats touches 32 cache lines a warp instruction: 9216 L1 wavefronts a CTA).
      (a) dWcat partial [O, KP] = dy^T @ feat over the CTA's rows: MMA tiles (16 outputs x 8
          features), warp w taking feature tiles w, w+4, ...; K = rows.
      (b) dfeat = dy @ Wcat for the warp's 16 rows, one 8-feature tile at a time; a tile is
          8 inputs of one basis function, so each lane adds its dfeat * dphi/dx into dx
          accumulators it owns (rows g, g+8; inputs 2t, 2t+1 of each block) in a fixed order."""

    def __init__(self, I: int, O: int, G: int):
        super().__init__(I, O, G)
        self.grads = GradLayout(O, I, G, "tf32")
        self.n_tiles = self.KP // 8
        self.tiles_per_warp = _ceil(self.n_tiles, TF32_WARPS)
        self.m_tiles = self.O16 // 16
        self.c_plan = WeightGatherPlan(O, I * G, is_wb=False)
        self.wb_plan = WeightGatherPlan(O, I, is_wb=True)

    @cute.jit
    def x_place(self, tid: Int32, k: int) -> tuple:
        """(row r, input i) of thread tid's x staging task k; tasks tile the [R, I8] block in
        warp tiles of 8 rows x 4 inputs (R and I8 are multiples of 8)."""
        task = tid + k * TF32_THREADS
        tile = task // 32
        lane = task % 32
        quads = self.I8 // 4
        return (tile // quads) * 8 + lane // 4, (tile % quads) * 4 + lane % 4

    @cute.jit
    def vector_place(self, plan: WeightGatherPlan, tid: Int32, k: int) -> tuple:
        """(row o, vector c) of thread tid's task k (past the end: o >= O or c >= vecs_per_row)."""
        task = tid + k * TF32_THREADS
        tile = task // 32
        lane = task % 32
        o = (tile // plan.tiles_per_row_block) * 4 + lane // 8
        c = (tile % plan.tiles_per_row_block) * 8 + lane % 8
        return o, c

    @cute.jit
    def load_weight_vectors(self, mSrc: cute.Tensor, plan: WeightGatherPlan, tid: Int32,
                            k0: int, regs: cute.Tensor):
        """regs[k] <- the vector of task k0 + k. Unconditional (indices clamped; the stores
        drop what lies past the end) so all of them are in flight before the first is used."""
        mVec = cute.make_tensor(mSrc.iterator, cute.make_layout(
            (self.O, plan.vecs_per_row, plan.vec), stride=(plan.row_stride, plan.vec, 1)))
        for k in cutlass.range_constexpr(cute.size(regs, mode=[0])):
            o, c = self.vector_place(plan, tid, k0 + k)
            regs[k, None].store(mVec[cutlass.min(o, Int32(self.O - 1)),
                                     cutlass.min(c, Int32(plan.vecs_per_row - 1)), None].load())

    @cute.jit
    def store_weight_vectors(self, plan: WeightGatherPlan, tid: Int32, k0: int,
                             regs: cute.Tensor, sWt: cute.Tensor):
        """sWt[f, o] <- the elements of regs (tasks k0, ...), f = gb*I8 + i their Wcat column.
        At the defaults (row pitch O8 + 8 = 40 words) a store instruction of C's tasks puts its
        8 vectors' (4 inputs) x 4 outputs on 16 banks, 2 lanes each."""
        for k in cutlass.range_constexpr(cute.size(regs, mode=[0])):
            o, c = self.vector_place(plan, tid, k0 + k)
            if o < self.O and c < plan.vecs_per_row:
                for u in cutlass.range_constexpr(plan.vec):
                    col = c * plan.vec + u
                    if cutlass.const_expr(plan.is_wb):
                        sWt[self.G * self.I8 + col, o] = regs[k, u]  # Wb[o, i]: gb = G
                    else:
                        i = col // self.G  # C[o, i*G + gb]
                        sWt[(col - i * self.G) * self.I8 + i, o] = regs[k, u]

    @cute.jit
    def gather_rest(self, mSrc: cute.Tensor, plan: WeightGatherPlan, tid: Int32,
                    sWt: cute.Tensor):
        """The tasks past the first batch (none at the defaults), a batch at a time."""
        for k0 in cutlass.range_constexpr(plan.first_batch, plan.tasks, plan.batch):
            regs = cute.make_rmem_tensor((min(plan.batch, plan.tasks - k0), plan.vec), Float32)
            self.load_weight_vectors(mSrc, plan, tid, k0, regs)
            self.store_weight_vectors(plan, tid, k0, regs, sWt)

    @cute.jit
    def __call__(self, dy_ptr: cute.Pointer, x_ptr: cute.Pointer, c_ptr: cute.Pointer,
                 wb_ptr: cute.Pointer, dx_ptr: cute.Pointer, part_ptr: cute.Pointer,
                 batch: Int32, stream):
        I, O = self.I, self.O
        num_ctas = cute.ceil_div(batch, self.rows)
        mDy = cute.make_tensor(dy_ptr, cute.make_layout((batch, O), stride=(O, 1)))
        mX, mC, mWb = self.operand_tensors(batch, x_ptr, c_ptr, wb_ptr)
        mDx = cute.make_tensor(dx_ptr, cute.make_layout((batch, I), stride=(I, 1)))
        mPart = cute.make_tensor(part_ptr, cute.make_layout(  # [cta, o, feature pair, 2]
            (num_ctas, self.O16, self.KP // 2, 2), stride=(self.grads.partial_len, self.KP, 2, 1)))
        self.kernel(mDy, mX, mC, mWb, mDx, mPart, batch).launch(
            grid=[num_ctas, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mDy: cute.Tensor, mX: cute.Tensor, mC: cute.Tensor, mWb: cute.Tensor,
               mDx: cute.Tensor, mPart: cute.Tensor, batch: Int32):
        I, O, G, KP, I8 = self.I, self.O, self.G, self.KP, self.I8
        R = TF32_ROWS
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        first = cta * R
        # Let the grad reduce (launched next with programmatic dependent launch) get its CTAs
        # resident now; it waits in griddepcontrol.wait until this grid has finished.
        cute.arch.griddepcontrol_launch_dependents()
        smem = SmemAllocator()
        row_stride = R + 8  # [*, row] tiles: 64-bit loads of 8 rows x 4 lanes on disjoint banks
        o_stride = self.O8 + 8
        sFeat = smem.allocate_tensor(Float32, cute.make_layout((KP, R), stride=(row_stride, 1)), 16)
        sDy = smem.allocate_tensor(Float32, cute.make_layout((self.O16, R), stride=(row_stride, 1)), 16)
        sWt = smem.allocate_tensor(Float32, cute.make_layout((KP, self.O8), stride=(o_stride, 1)), 16)
        sDy_bits = cute.recast_tensor(sDy, Int32)

        # Staging. Wcat^T (16-byte loads issued first, stored transposed once the rest is
        # staged: their latency hides behind it), dy^T (rounded; zero past O and past the
        # batch) and the features of the CTA's rows (float32; zero for padded inputs).
        first_c = cute.make_rmem_tensor((self.c_plan.first_batch, self.c_plan.vec), Float32)
        first_wb = cute.make_rmem_tensor((self.wb_plan.first_batch, self.wb_plan.vec), Float32)
        self.load_weight_vectors(mC, self.c_plan, tid, 0, first_c)
        self.load_weight_vectors(mWb, self.wb_plan, tid, 0, first_wb)
        for k in cutlass.range_constexpr(_ceil(R * self.O16, TF32_THREADS)):
            idx = tid + k * TF32_THREADS
            r = idx // self.O16
            o = idx - r * self.O16
            v = mDy[cutlass.min(first + r, batch - 1), cutlass.min(o, Int32(O - 1))]
            if first + r >= batch or o >= O:
                v = Float32(0.0)
            sDy_bits[o, r] = Int32(cute.arch.cvt_f32_tf32(v))
        # Warp instruction = 8 rows x 4 inputs: 8 sectors of x a load (lanes along rows
        # alone touched 32), and sFeat word (gb*I8 + i)*row_stride + r = 8i + r (mod 32)
        # puts the 32 stores on 32 banks. All of a thread's x loads are issued first.
        x_tasks = _ceil(R * I8, TF32_THREADS)
        x_stage = cute.make_rmem_tensor((x_tasks,), Float32)
        for k in cutlass.range_constexpr(x_tasks):
            r, i = self.x_place(tid, k)
            x_stage[k] = mX[cutlass.min(first + r, batch - 1), cutlass.min(i, Int32(I - 1))]
        for k in cutlass.range_constexpr(x_tasks):
            r, i = self.x_place(tid, k)
            x = x_stage[k]
            if first + r >= batch:
                x = Float32(0.0)
            for gb in cutlass.range_constexpr(G + 1):
                v = self.feature(x, gb)
                if i >= I:
                    v = Float32(0.0)
                sFeat[gb * I8 + i, r] = v
        if cutlass.const_expr(I < I8 or O < self.O8):  # zero weights of padded inputs/outputs
            for idx in cutlass.range(tid, KP * self.O8, TF32_THREADS, unroll=1):
                f = idx // self.O8
                o = idx - f * self.O8
                if o >= O or f - (f // I8) * I8 >= I:
                    sWt[f, o] = Float32(0.0)
        self.store_weight_vectors(self.c_plan, tid, 0, first_c, sWt)
        self.store_weight_vectors(self.wb_plan, tid, 0, first_wb, sWt)
        self.gather_rest(mC, self.c_plan, tid, sWt)
        self.gather_rest(mWb, self.wb_plan, tid, sWt)
        cute.arch.barrier()

        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        mma = cute.make_mma_atom(cute.nvgpu.warp.MmaTF32Op((16, 8, 8)))
        frag_a = cute.make_rmem_tensor((4, 1, 1), cutlass.TFloat32)
        frag_a_bits = cute.recast_tensor(frag_a, Int32)
        frag_b = cute.make_rmem_tensor((2, 1, 1), cutlass.TFloat32)
        frag_b_bits = cute.recast_tensor(frag_b, Int32)
        pair = cute.make_rmem_tensor((2,), Float32)
        pair_hi = cute.make_rmem_tensor((2,), Float32)
        feat = cute.make_rmem_tensor((2,), Float32)
        sFeat2 = cute.make_tensor(sFeat.iterator, cute.make_layout((KP, R // 2, 2), stride=(row_stride, 2, 1)))
        sDy2 = cute.make_tensor(sDy.iterator, cute.make_layout((self.O16, R // 2, 2), stride=(row_stride, 2, 1)))
        sWt2 = cute.make_tensor(sWt.iterator, cute.make_layout((KP, self.O8 // 2, 2), stride=(o_stride, 2, 1)))

        # (a) dWcat partial: warp w owns feature tiles n = w + 4q, all output tiles m.
        acc = cute.make_rmem_tensor((4, 1, 1, self.m_tiles, self.tiles_per_warp), Float32)
        acc.fill(0.0)
        for ks in cutlass.range(R // 8, unroll=1):
            rp = ks * 4 + t  # row pair 8ks + 2t, +1
            for m in cutlass.range_constexpr(self.m_tiles):
                pair.store(sDy2[m * 16 + g, rp, None].load())  # dy^T, TF32-rounded
                pair_hi.store(sDy2[m * 16 + g + 8, rp, None].load())
                frag_a[0, 0, 0] = cutlass.TFloat32(pair[0])
                frag_a[1, 0, 0] = cutlass.TFloat32(pair_hi[0])
                frag_a[2, 0, 0] = cutlass.TFloat32(pair[1])
                frag_a[3, 0, 0] = cutlass.TFloat32(pair_hi[1])
                for q in cutlass.range_constexpr(self.tiles_per_warp):
                    n = warp + TF32_WARPS * q
                    if n < self.n_tiles:
                        feat.store(sFeat2[n * 8 + g, rp, None].load())
                        frag_b_bits[0, 0, 0] = Int32(cute.arch.cvt_f32_tf32(feat[0]))
                        frag_b_bits[1, 0, 0] = Int32(cute.arch.cvt_f32_tf32(feat[1]))
                        cute.gemm(mma, acc[None, None, None, m, q], frag_a, frag_b,
                                  acc[None, None, None, m, q])
        # C fragment: (o, f) = (16m + g, 8n + 2t + {0,1}) and (16m + g + 8, same f): two
        # 64-bit stores, 8 rows x 32 contiguous bytes per warp instruction.
        for m in cutlass.range_constexpr(self.m_tiles):
            for q in cutlass.range_constexpr(self.tiles_per_warp):
                n = warp + TF32_WARPS * q
                if n < self.n_tiles:
                    for half in cutlass.range_constexpr(2):
                        pair[0] = acc[2 * half, 0, 0, m, q]
                        pair[1] = acc[2 * half + 1, 0, 0, m, q]
                        mPart[cta, m * 16 + g + 8 * half, n * 4 + t, None].store(pair.load())

        # (b) dx for the warp's rows g and g+8.
        blocks = I8 // 8
        k_steps = self.O8 // 8
        row_a = warp * 16 + g  # in the tile
        dy_frag = cute.make_rmem_tensor((4, k_steps), Float32)
        for ks in cutlass.range_constexpr(k_steps):
            dy_frag[0, ks] = sDy[ks * 8 + 2 * t, row_a]
            dy_frag[1, ks] = sDy[ks * 8 + 2 * t, row_a + 8]
            dy_frag[2, ks] = sDy[ks * 8 + 2 * t + 1, row_a]
            dy_frag[3, ks] = sDy[ks * 8 + 2 * t + 1, row_a + 8]
        xs = cute.make_rmem_tensor((2, blocks, 2), Float32)  # x[row a/b, 8*block + 2t + u]
        self.load_x(mX, first + row_a, batch, t, xs[0, None, None])
        self.load_x(mX, first + row_a + 8, batch, t, xs[1, None, None])
        dx = cute.make_rmem_tensor((2, blocks, 2), Float32)  # [row a/b, block, input 2t+u]
        dx.fill(0.0)
        tile_acc = cute.make_rmem_tensor((4, 1, 1), Float32)
        for gb in cutlass.range_constexpr(G + 1):
            for blk in cutlass.range_constexpr(blocks):
                n = gb * blocks + blk
                tile_acc.fill(0.0)
                for ks in cutlass.range_constexpr(k_steps):
                    for e in cutlass.range_constexpr(4):
                        frag_a[e, 0, 0] = cutlass.TFloat32(dy_frag[e, ks])
                    pair.store(sWt2[n * 8 + g, ks * 4 + t, None].load())
                    frag_b_bits[0, 0, 0] = Int32(cute.arch.cvt_f32_tf32(pair[0]))
                    frag_b_bits[1, 0, 0] = Int32(cute.arch.cvt_f32_tf32(pair[1]))
                    cute.gemm(mma, tile_acc, frag_a, frag_b, tile_acc)
                for e in cutlass.range_constexpr(4):
                    half = e // 2  # row a or b
                    u = e % 2
                    row = row_a + 8 * half
                    i = blk * 8 + 2 * t + u
                    xv = xs[half, blk, u]
                    if cutlass.const_expr(gb < G):
                        d = xv - Float32(self.mu[gb])
                        slope = sFeat[gb * I8 + i, row] * d * Float32(-2.0 * self.inv_delta2)
                    else:
                        s = Float32(1.0) / (Float32(1.0) + cute.math.exp(-xv))
                        slope = s * (Float32(1.0) + xv * (Float32(1.0) - s))
                    dx[half, blk, u] = dx[half, blk, u] + tile_acc[e, 0, 0] * slope
        for half in cutlass.range_constexpr(2):
            row = first + row_a + 8 * half
            for blk in cutlass.range_constexpr(blocks):
                for u in cutlass.range_constexpr(2):
                    i = blk * 8 + 2 * t + u
                    if row < batch:
                        if i < I:
                            mDx[row, i] = dx[half, blk, u]


class KanGradReduce:
    """The KAN grad reduce's second stage: the backward CTAs' partial rows [R, partial_len]
    summed over R in a fixed order (bit-identical run to run), each column then stored at its
    place in sums (see GradLayout), padding dropped.

    A CTA owns 128 columns (lane l: 4 consecutive columns, one 128-bit load a row) and splits
    the rows among REDUCE_ROW_GROUPS = 16 warps: warp w adds rows w, w+16, ... in order, then
    warp 0 adds the 16 warps' sums in warp order. At the defaults (tf32: 32 x 288 columns,
    R = 128 at B=8192) that is 72 CTAs reading 4.7 MB, a thread 8 rows, all 8 loads in flight
    at once (8 warps took two dependent rounds of L2 latency; measured 4.48 us on the H200).
    (Not kernels.column_sum: this reduce also puts each column at its place in dC | dWb and
    drops the padding, which would otherwise take a gather kernel afterwards.)"""

    def __init__(self, layout: GradLayout):
        self.grads = layout
        self.vecs = layout.partial_len // 4  # static: every row stays 16-byte aligned

    @cute.jit
    def __call__(self, part_ptr: cute.Pointer, sums_ptr: cute.Pointer, rows: Int32, stream):
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


_compiled = _cute.CompiledCache()


_KERNELS = {("forward", "fp32"): KanForwardFp32, ("backward", "fp32"): KanBackwardFp32,
            ("forward", "tf32"): KanForwardTf32, ("backward", "tf32"): KanBackwardTf32}


def _kernel_and_args(kind: str, I: int, O: int, G: int, precision: str) -> tuple[Any, tuple]:
    """The kernel object and the (fake) arguments it compiles with."""
    pointers = 4 if kind == "forward" else 6
    args = (*[_cute.fake_ptr() for _ in range(pointers)], Int32(1), _cute.fake_stream())
    return _KERNELS[kind, precision](I, O, G), args


def _reduce_args() -> tuple:
    return (_cute.fake_ptr(), _cute.fake_ptr(), Int32(1), _cute.fake_stream())


def _compile_reduce(layout: GradLayout, keep: bool = False) -> Any:
    return _compiled.get(("reduce", layout.key(), keep), lambda: _cute.compile_kernel(
        KanGradReduce(layout), *_reduce_args(), keep=keep))


def _compile(kind: str, I: int, O: int, G: int, precision: str, keep: bool = False) -> Any:
    def build():
        kernel, args = _kernel_and_args(kind, I, O, G, precision)
        return _cute.compile_kernel(kernel, *args, keep=keep)
    return _compiled.get((kind, I, O, G, precision, keep), build)


def smem_bytes(I: int, O: int, G: int) -> int:
    """Shared memory of the largest kernel (the backward of either precision)."""
    F = (G + 1) * I
    fp32 = ROWS * (I + 1) + _ceil(F, 32) * 32 * ROW_PAD + _ceil(O, 8) * 8 * ROW_PAD + O * F
    t = KanTf32Config(I, O, G)
    tf32 = (t.KP + t.O16) * (TF32_ROWS + 8) + t.KP * (t.O8 + 8)
    return 4 * max(fp32, tf32)


def accumulators(I: int, O: int, G: int) -> tuple[int, int]:
    """Most float accumulators one thread holds: (fp32 kernels: dWcat and dfeat tiles,
    tf32 backward: its dWcat MMA tiles)."""
    t = KanTf32Config(I, O, G)
    return (max(_ceil(O, 8) * _ceil((G + 1) * I, 32), 4 * (G + 1)),
            4 * (t.O16 // 16) * _ceil(t.KP // 8, TF32_WARPS))


def check_sizes(chk: _arrays.Checker) -> None:
    """Supported: O even (outputs stored in pairs); per-thread accumulators within 64 for
    fp32 (ceil(O/8)*ceil((G+1)*I/32) and 4*(G+1)) and 128 for tf32 (4*ceil(O/16)*
    ceil((G+1)*ceil(I/8)/4)); shared memory of the staged tiles <= 200 KB (the defaults
    I=32, O=32, G=8 use 138 KB); B*max(I, O) < 2**31."""
    I, O = chk.dims["I"], chk.dims["O"]
    G = chk.dims["I*G"] // I
    chk.dim_multiple("O", 2, "outputs are stored two at a time")
    fp32_acc, tf32_acc = accumulators(I, O, G)
    if fp32_acc > MAX_ACC or tf32_acc > MAX_TF32_ACC:
        raise _arrays.FoxcuteInputError(
            f"{chk.where}: I={I}, O={O}, G={G} is outside the supported range: a thread would "
            f"hold {fp32_acc} (fp32, at most {MAX_ACC}) or {tf32_acc} (tf32, at most "
            f"{MAX_TF32_ACC}) accumulators")
    if smem_bytes(I, O, G) > MAX_SMEM_BYTES:
        raise _arrays.FoxcuteInputError(
            f"{chk.where}: I={I}, O={O}, G={G} is outside the supported range: it needs "
            f"{smem_bytes(I, O, G)} bytes of shared memory per CTA, over {MAX_SMEM_BYTES}")
    chk.dim_range("B", 1, MAX_ELEMENTS // max(I, O), "32-bit indexing")


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
    """(dC, dWb, dx) on x's current stream: the backward kernel, then the grad reduce.
    dC and dWb are views into one array."""
    B, I = x.shape
    O = C.shape[0]
    G = C.shape[1] // I
    layout = GradLayout(O, I, G, precision)
    num_ctas = -(-B // (TF32_ROWS if precision == "tf32" else ROWS))  # the kernel's grid
    dx = _arrays.empty(x, (B, I))
    partials = _arrays.empty(x, (num_ctas, layout.partial_len))
    _compile("backward", I, O, G, precision)(
        _cute.gmem_ptr(dy), _cute.gmem_ptr(x), _cute.gmem_ptr(C), _cute.gmem_ptr(Wb),
        _cute.gmem_ptr(dx), _cute.gmem_ptr(partials), Int32(B), _cute.current_stream(x))
    sums = _arrays.empty(x, (layout.sums_len,))
    _compile_reduce(layout)(_cute.gmem_ptr(partials), _cute.gmem_ptr(sums), Int32(num_ctas),
                            _cute.current_stream(x))
    dC = sums[:O * I * G].reshape(O, I * G)
    dWb = sums[layout.dwb_at:].reshape(O, I)
    return dC, dWb, dx


DEFAULTS = (32, 32, 8)  # I, O, G



def kernels_for_ci() -> dict[str, tuple[Any, tuple]]:
    """{name: (kernel, compile arguments)} for each kernel at the defaults."""
    kernels = {f"kan_{kind}_{p}": _kernel_and_args(kind, *DEFAULTS, p)
               for kind in ("forward", "backward") for p in ("tf32", "fp32")}
    I, O, G = DEFAULTS
    kernels["kan_grad_reduce"] = (KanGradReduce(GradLayout(O, I, G, "tf32")), _reduce_args())
    return kernels


def compiled_for_ci() -> dict[str, Any]:
    """Forward and backward of each precision at the defaults (I=32, O=32, G=8), PTX kept."""
    compiled = {f"kan_{kind}_{p}": _compile(kind, *DEFAULTS, p, keep=True)
                for kind in ("forward", "backward") for p in ("tf32", "fp32")}
    I, O, G = DEFAULTS
    compiled["kan_grad_reduce"] = _compile_reduce(GradLayout(O, I, G, "tf32"), keep=True)
    return compiled
