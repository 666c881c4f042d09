"""Q-denoise MLP (A -> H -> A), spec section 2: loss and every gradient in one fused kernel,
then one deterministic column_sum over the CTAs' partial sums.

Work and floor at the defaults (A=12, H=24, B=8192):
  bytes  q, q_target read, dq written: 3*B*A*4 = 1.18 MB; weight partials 613 floats per CTA
         written then read (64 CTAs: 0.31 MB)                 -> ~0.4 us at 4.25 TB/s
  flops  per sample 4 matvecs of H*A (z1, y, dh1, dq) + 2 outer products (dW1, dW2):
         6*H*A*2 = 3456 -> 28 MFLOP                              -> ~0.5 us at ~60 TFLOP/s FFMA
So the layer is latency bound: what matters is one launch that does everything (a thread's
chain of dependent work is short), plus the column_sum launch.

Design (one CTA = THREADS samples, one thread per sample):
  1. Weights (2*H*A + H + A floats) go to shared memory; the CTA's q tile goes, coalesced, to a
     shared "sample table" row per sample and q_target to a staging tile.
  2. Each thread runs its sample's forward and backward in registers (fully unrolled; weights
     read from shared memory by broadcast) and writes dz1, dy, h1 and its scaled squared error
     to its row of the table, dq to the staging tile (copied out coalesced).
  3. The CTA's partial gradient sums: entry j of [dW1 | db1 | dW2 | db2 | loss] is
     sum over the CTA's samples of table[b, u(j)] * table[b, v(j)] (v = a column of ones for
     biases and the loss). Thread t owns entries t, t+THREADS, ...: no atomics, fixed order.
  4. column_sum (foxcute.kernels.column_sum) adds the [num_ctas, L] partials in CTA order.
Samples past B have dy = 0 and a zero squared error, so they add exactly 0.
Both precisions run this FFMA kernel: at 28 MFLOP tensor cores would buy nothing, and the
result is full float32 either way (well inside the TF32 tolerance).
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.memory import SmemAllocator

from .. import _arrays
from . import _cute

# Samples per CTA. A thread's work (its sample, then ~L/THREADS partial sums over THREADS
# samples) hardly depends on it; 128 gives one warp per scheduler and, at B=8192, 64 CTAs
# (partial rows for column_sum).
THREADS = 128
MAX_A = 32  # per-thread registers hold q, y, dy, dq (A each) and z1, h1, dh1 (H each)
MAX_H = 64
MAX_WEIGHTS = 1024  # H*A
MAX_ELEMENTS = 2**31 - 1  # 32-bit indexing


def num_entries(A: int, H: int) -> int:
    """Length of one CTA's partial row: dW1 (H*A), db1 (H), dW2 (A*H), db2 (A), loss (1)."""
    return 2 * H * A + H + A + 1


class QDenoiseKernel:
    def __init__(self, A: int, H: int):
        self.A, self.H = A, H
        self.L = num_entries(A, H)
        # Sample table columns: dz1 [H] | dy [A] | q [A] | one | h1 [H] | scaled squared error.
        self.c_dz1 = 0
        self.c_dy = H
        self.c_q = H + A
        self.c_one = H + 2 * A
        self.c_h1 = H + 2 * A + 1
        self.c_sq = 2 * H + 2 * A + 1
        width = 2 * H + 2 * A + 2
        self.row = width + 1 if width % 2 == 0 else width  # odd stride: row writes hit 32 banks

    @cute.jit
    def __call__(self, q_ptr: cute.Pointer, qt_ptr: cute.Pointer, w1_ptr: cute.Pointer,
                 b1_ptr: cute.Pointer, w2_ptr: cute.Pointer, b2_ptr: cute.Pointer,
                 dq_ptr: cute.Pointer, part_ptr: cute.Pointer, batch: Int32, inv_count: Float32,
                 stream):
        A, H = self.A, self.H
        mQ = cute.make_tensor(q_ptr, cute.make_layout(batch * A))
        mQt = cute.make_tensor(qt_ptr, cute.make_layout(batch * A))
        mDq = cute.make_tensor(dq_ptr, cute.make_layout(batch * A))
        mW1 = cute.make_tensor(w1_ptr, cute.make_layout(H * A))
        mB1 = cute.make_tensor(b1_ptr, cute.make_layout(H))
        mW2 = cute.make_tensor(w2_ptr, cute.make_layout(A * H))
        mB2 = cute.make_tensor(b2_ptr, cute.make_layout(A))
        num_ctas = cute.ceil_div(batch, THREADS)
        mPart = cute.make_tensor(part_ptr, cute.make_layout((num_ctas, self.L), stride=(self.L, 1)))
        self.kernel(mQ, mQt, mW1, mB1, mW2, mB2, mDq, mPart, batch, inv_count).launch(
            grid=[num_ctas, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mQt: cute.Tensor, mW1: cute.Tensor, mB1: cute.Tensor,
               mW2: cute.Tensor, mB2: cute.Tensor, mDq: cute.Tensor, mPart: cute.Tensor,
               batch: Int32, inv_count: Float32):
        A, H = self.A, self.H
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        smem = SmemAllocator()
        sW1 = smem.allocate_tensor(Float32, cute.make_layout((H, A), stride=(A, 1)), 16)
        sW2 = smem.allocate_tensor(Float32, cute.make_layout((A, H), stride=(H, 1)), 16)
        sB1 = smem.allocate_tensor(Float32, cute.make_layout(H), 16)
        sB2 = smem.allocate_tensor(Float32, cute.make_layout(A), 16)
        sTab = smem.allocate_tensor(Float32, cute.make_layout((THREADS, self.row), stride=(self.row, 1)), 16)
        sStage = smem.allocate_tensor(Float32, cute.make_layout(THREADS * A), 16)

        # 1. Weights and this CTA's q / q_target tiles into shared memory. Every load is
        #    unconditional (clamped index, value zeroed after) so the unrolled loops issue
        #    them all before the first one is waited for.
        for k in cutlass.range_constexpr(-(-(H * A) // THREADS)):
            i = cutlass.min(tid + k * THREADS, Int32(H * A - 1))
            w1 = mW1[i]
            w2 = mW2[i]
            sW1[i // A, i % A] = w1  # threads past H*A rewrite the last entry with its value
            sW2[i // H, i % H] = w2
        b1 = mB1[cutlass.min(tid, Int32(H - 1))]
        b2 = mB2[cutlass.min(tid, Int32(A - 1))]
        if tid < H:
            sB1[tid] = b1
        if tid < A:
            sB2[tid] = b2
        first = cta * THREADS
        valid = (batch - first) * A  # floats of q in this tile (more than the tile if not last)
        last = batch * A - 1
        for k in cutlass.range_constexpr(A):
            i = tid + k * THREADS
            q_val = mQ[cutlass.min(first * A + i, last)]
            qt_val = mQt[cutlass.min(first * A + i, last)]
            if i >= valid:
                q_val = Float32(0.0)
                qt_val = Float32(0.0)
            sTab[i // A, self.c_q + i % A] = q_val
            sStage[i] = qt_val
        cute.arch.barrier()

        # 2. This thread's sample: forward, loss and backward in registers.
        scale = Float32(0.0)  # 1/(B*A) for a real sample, 0 for padding
        if first + tid < batch:
            scale = inv_count
        q = [sTab[tid, self.c_q + a] for a in range(A)]
        # Weights are read as 128-bit broadcasts of 4 consecutive row entries where the row
        # length allows (A, H multiples of 4), else one at a time.
        w_vec = cute.make_rmem_tensor((4,), Float32)
        z1 = []
        for h in cutlass.range_constexpr(H):
            acc = sB1[h]
            for a0 in cutlass.range_constexpr(0, A, 4):
                w = self.row_chunk(sW1, h, a0, A, w_vec)
                for u in cutlass.range_constexpr(len(w)):
                    acc = acc + w[u] * q[a0 + u]
            z1.append(acc)
        h1 = [cute.arch.fmax(z, Float32(0.0)) for z in z1]
        # Each matvec re-reads its weights from shared memory (a broadcast): the warp sync
        # orders memory, so the compiler cannot keep 2*H*A weights live across matvecs (spills).
        cute.arch.sync_warp()
        dy = []
        sq = Float32(0.0)
        for a in cutlass.range_constexpr(A):
            acc = sB2[a]
            for h0 in cutlass.range_constexpr(0, H, 4):
                w = self.row_chunk(sW2, a, h0, H, w_vec)
                for u in cutlass.range_constexpr(len(w)):
                    acc = acc + w[u] * h1[h0 + u]
            diff = acc - sStage[tid * A + a]
            sq = sq + diff * diff
            dy.append((diff + diff) * scale)
        cute.arch.sync_warp()
        dh1 = [Float32(0.0)] * H  # dy @ W2, accumulated row by row of W2
        for a in cutlass.range_constexpr(A):
            for h0 in cutlass.range_constexpr(0, H, 4):
                w = self.row_chunk(sW2, a, h0, H, w_vec)
                for u in cutlass.range_constexpr(len(w)):
                    dh1[h0 + u] = dh1[h0 + u] + w[u] * dy[a]
        dz1 = [cutlass.select_(z1[h] > Float32(0.0), dh1[h], Float32(0.0)) for h in range(H)]
        cute.arch.sync_warp()
        dq = [Float32(0.0)] * A  # dz1 @ W1, accumulated row by row of W1
        for h in cutlass.range_constexpr(H):
            for a0 in cutlass.range_constexpr(0, A, 4):
                w = self.row_chunk(sW1, h, a0, A, w_vec)
                for u in cutlass.range_constexpr(len(w)):
                    dq[a0 + u] = dq[a0 + u] + w[u] * dz1[h]
        for a in cutlass.range_constexpr(A):
            sStage[tid * A + a] = dq[a]  # q_target of this sample is no longer needed
        for h in cutlass.range_constexpr(H):
            sTab[tid, self.c_dz1 + h] = dz1[h]
            sTab[tid, self.c_h1 + h] = h1[h]
        for a in cutlass.range_constexpr(A):
            sTab[tid, self.c_dy + a] = dy[a]
        sTab[tid, self.c_one] = Float32(1.0)
        sTab[tid, self.c_sq] = sq * scale
        cute.arch.barrier()

        # 3. dq out (coalesced), and the CTA's partial sums of every weight gradient and the loss.
        for k in cutlass.range_constexpr(A):
            i = tid + k * THREADS
            if i < valid:
                mDq[first * A + i] = sStage[i]
        for k in cutlass.range_constexpr(-(-self.L // THREADS)):
            j = tid + k * THREADS
            if j < self.L:
                col_u, col_v = self.entry_columns(j)
                chains = cute.make_rmem_tensor((4,), Float32)  # independent FMA chains,
                chains.fill(0.0)  # combined in a fixed order
                for b4 in cutlass.range(THREADS // 4, unroll_full=True):
                    for c in cutlass.range_constexpr(4):
                        b = b4 * 4 + c
                        chains[c] = chains[c] + sTab[b, col_u] * sTab[b, col_v]
                mPart[cta, j] = (chains[0] + chains[1]) + (chains[2] + chains[3])

    @cute.jit
    def row_chunk(self, sMat: cute.Tensor, r: int, c0: int, width: int, w_vec: cute.Tensor) -> list:
        """sMat[r, c0 : c0+4] (fewer at the row's end) as a list of values: one 128-bit
        shared load when the row length is a multiple of 4, else scalar loads."""
        if cutlass.const_expr(width % 4 == 0):
            w_vec.store(cute.make_tensor(sMat.iterator + (r * width + c0), cute.make_layout(4)).load())
            values = [w_vec[u] for u in range(4)]
        else:
            values = [sMat[r, c0 + u] for u in range(min(4, width - c0))]
        return values

    @cute.jit
    def entry_columns(self, j: Int32):
        """Sample-table columns (u, v) whose product, summed over samples, is entry j of
        [dW1 (h*A+a) | db1 (h) | dW2 (a*H+h) | db2 (a) | loss]."""
        A, H = self.A, self.H
        end_dw1 = H * A
        end_db1 = end_dw1 + H
        end_dw2 = end_db1 + A * H
        end_db2 = end_dw2 + A
        col_u = Int32(self.c_sq)
        col_v = Int32(self.c_one)
        if j < end_dw1:
            col_u = self.c_dz1 + j // A
            col_v = self.c_q + j % A
        elif j < end_db1:
            col_u = self.c_dz1 + (j - end_dw1)
        elif j < end_dw2:
            col_u = self.c_dy + (j - end_db1) // H
            col_v = self.c_h1 + (j - end_db1) % H
        elif j < end_db2:
            col_u = self.c_dy + (j - end_dw2)
        return col_u, col_v


_compiled = _cute.CompiledCache()


def _kernel_and_args(A: int, H: int) -> tuple[Any, tuple]:
    """The kernel object and the (fake) arguments it compiles with."""
    return QDenoiseKernel(A, H), (*[_cute.fake_ptr() for _ in range(8)], Int32(1), Float32(1.0),
                                  _cute.fake_stream())


def _compile(A: int, H: int, keep: bool = False) -> Any:
    def build():
        kernel, args = _kernel_and_args(A, H)
        return _cute.compile_kernel(kernel, *args, keep=keep)
    return _compiled.get((A, H, keep), build)


def check_sizes(chk: _arrays.Checker) -> None:
    """Supported: 1 <= A <= 32, 1 <= H <= 64 and H*A <= 1024 (a sample's activations live in
    registers and its four H x A matvecs are unrolled: more would spill), B*A < 2**31
    (32-bit indexing)."""
    chk.dim_range("A", 1, MAX_A, "a sample's vectors are held in registers")
    chk.dim_range("H", 1, MAX_H, "a sample's hidden activations are held in registers")
    chk.dim_range("H", 1, MAX_WEIGHTS // chk.dims["A"],
                  f"H*A <= {MAX_WEIGHTS}: the unrolled matvecs of a sample stay in registers")
    chk.dim_range("B", 1, MAX_ELEMENTS // chk.dims["A"], "32-bit indexing of q")


def loss_and_grads(q, q_target, W1, b1, W2, b2, *, precision: str = "tf32"):
    """(loss [1], dW1, db1, dW2, db2, dq) on q's current stream. The loss and the weight
    gradients are views into one [L] array (each 16-byte aligned when A and H are
    multiples of 4, as at the defaults)."""
    del precision  # one FFMA kernel serves both (see the module docstring)
    B, A = q.shape
    H = W1.shape[0]
    L = num_entries(A, H)
    kernel = _compile(A, H)
    num_ctas = -(-B // THREADS)
    dq = _arrays.empty(q, (B, A))
    partials = _arrays.empty(q, (num_ctas, L))
    kernel(_cute.gmem_ptr(q), _cute.gmem_ptr(q_target), _cute.gmem_ptr(W1), _cute.gmem_ptr(b1),
           _cute.gmem_ptr(W2), _cute.gmem_ptr(b2), _cute.gmem_ptr(dq), _cute.gmem_ptr(partials),
           Int32(B), Float32(1.0 / (B * A)), _cute.current_stream(q))
    from .column_sum import column_sum

    sums = column_sum(partials)
    o = 0
    dW1 = sums[o:o + H * A].reshape(H, A)
    o += H * A
    db1 = sums[o:o + H]
    o += H
    dW2 = sums[o:o + A * H].reshape(A, H)
    o += A * H
    db2 = sums[o:o + A]
    o += A
    loss = sums[o:o + 1]
    return loss, dW1, db1, dW2, db2, dq


CI_SIZES = ((12, 24), (5, 7))  # (A, H): the defaults and odd widths


def kernels_for_ci() -> dict[str, tuple[Any, tuple]]:
    """{name: (kernel, compile arguments)} at the CI sizes."""
    return {f"q_denoise_A{A}_H{H}": _kernel_and_args(A, H) for A, H in CI_SIZES}


def compiled_for_ci() -> dict[str, Any]:
    """The kernel at the defaults (A=12, H=24) and at odd widths, PTX kept."""
    return {f"q_denoise_A{A}_H{H}": _compile(A, H, keep=True) for A, H in CI_SIZES}
