"""Q-denoise MLP (A -> H -> A), docs/layers.md section 2: loss and every gradient in ONE launch,
the batch reduction included (deterministic, no float atomics).

Work and floor at the defaults (A=12, H=24, B=8192):
  bytes  q, q_target read, dq written: 3*B*A*4 = 1.18 MB; weight partials 616 floats per CTA
         written then read back from L2 (128 CTAs: 0.32 MB)   -> ~0.4 us at 4.25 TB/s
  flops  per sample 4 matvecs of H*A (z1, y, dh1, dq) + 2 outer products (dW1, dW2):
         6*H*A*2 = 3456 -> 28 MFLOP                              -> ~0.5 us at ~60 TFLOP/s FFMA
So the layer is latency bound: what counts is one launch and a short chain of dependent steps
per CTA, not bandwidth or flops.

Design (CTA = THREADS = 256 threads over SAMPLES = 64 samples; grid ceil(B/64), 128 CTAs at
the defaults, so most SMs get a share of the per-sample chains):
  1. Weights (2*H*A + H + A floats) go to shared memory; the CTA's q tile goes, coalesced, to a
     column-major shared "sample table" and q_target to a staging tile.
  2. Threads tid < SAMPLES each run one sample's forward and backward in registers (fully
     unrolled; weights read from shared memory by broadcast) and write dz1, dy, h1 and the
     scaled squared error to the sample's column of the table, dq to the staging tile (copied
     out coalesced). The other warps wait at the barrier: a sample's chain is inherently
     serial, and 64 chains per CTA is what halves that chain's share of the critical path
     compared with 128 samples per CTA.
  3. The CTA's partial sums: entry j of [dW1 | db1 | dW2 | db2 | loss] is the sum over the
     CTA's samples of table[u(j), b] * table[v(j), b] (v = a row of ones for biases and the
     loss). Thread t owns entries t, t+256, ... and reads both table rows 4 samples at a time
     (128-bit shared loads), one FMA chain per sample residue mod 4, combined in a fixed order.
     256 threads here are the point of the larger CTA: this phase is shared-memory bound.
  4. Batch reduction, in the same launch: each CTA writes its partial row (L padded to a
     multiple of 4, so rows are whole float4 vectors) to a work array and takes an integer
     ticket (the only atomic) for its group of `group_size` consecutive CTAs; the group's last
     CTA adds the group's rows in CTA order and writes a group row, then takes the final
     ticket; the last group finisher adds the group rows in group order and writes [L]. With
     one group the group finisher writes [L] directly. Every add happens in an order fixed by
     B, so results are bit-identical run to run. Finishers reset their tickets to zero (the
     self-resetting pool of _cute.tickets: no memset node, CUDA-graph capturable).
     Why two levels and not one last CTA summing all rows: the finisher's reads all go through
     one SM's L2 port (~64 B/clk): 128 rows x 2464 B = 315 KB is ~5000 cycles (~2.5 us) at the
     defaults and grows with B (1025 rows, ~20 us at B=65537). With group_size ~ sqrt(CTAs),
     the critical path reads ~2*sqrt(CTAs) rows (~12 + 11 at the defaults, ~0.5 us each) for
     one more fence + ticket round trip (<1 us). Group count <= 255 (tickets per launch).
     Where the grid is at most one CTA an SM (B <= 8448 on an H200, the defaults included),
     one level spread over every CTA instead, as in the KAN backward: each CTA arrives at one
     counter after its row, waits until all have, and sums one slice of the row over all the
     rows in CTA order (_cute.sum_slice_in_order: at the defaults 2 float4 vectors a CTA, 8
     lanes a vector summing 16 rows each, then a butterfly), so after the last row lands
     only the counter's round trips and one round of loads remain, not two ticket levels.
     Launched cooperative, so the wait completes whatever runs beside it.
Samples past B have dy = 0 and a zero squared error, so they add exactly 0.
Both precisions run this FFMA kernel: at 28 MFLOP tensor cores would buy nothing, and the
result is full float32 either way (well inside the TF32 tolerance).

At the defaults 9.05 us graph-replayed, 7.48 us at batch 1, where a graph replay of one
trivial kernel takes 2.25 us (run 20261203T162501Z). History: docs/notes/q-denoise.md.
"""

from __future__ import annotations

import math
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.memory import SmemAllocator

from .. import _arrays
from .._layer import PRECISIONS, KernelContract
from . import _cute

THREADS = 256
SAMPLES = 64  # samples per CTA: threads tid < SAMPLES run one each (see the module docstring)
# Sample-table column stride in floats: a multiple of 4 (128-bit loads along samples), and
# 4 (mod 32) banks so the phase-1 scatter of q (12 table rows per 3 samples) is nearly
# conflict-free.
TABLE_STRIDE = SAMPLES + 4
LOADS_IN_FLIGHT = 16  # float4 loads per thread issued together in the final sums
SLICE_LOADS = 17  # ... in the spread finish (a lane's run: at most 132 CTAs' rows in 8 parts)
MAX_GROUPS = _cute.TICKETS_PER_LAUNCH - 1  # one ticket per group plus the final one
MAX_A = 32  # per-thread registers hold q, y, dy, dq (A each) and z1, h1, dh1 (H each)
MAX_H = 64
MAX_WEIGHTS = 1024  # H*A
MAX_ELEMENTS = 2**31 - 1  # 32-bit indexing


def num_entries(A: int, H: int) -> int:
    """Length of the output row: dW1 (H*A), db1 (H), dW2 (A*H), db2 (A), loss (1)."""
    return 2 * H * A + H + A + 1


def padded_entries(A: int, H: int) -> int:
    """Length of one work row: num_entries rounded up to whole float4 vectors."""
    return -(-num_entries(A, H) // 4) * 4


def reduction_grid(batch: int) -> tuple[int, int, int]:
    """(CTAs, CTAs per group, groups): groups of about sqrt(CTAs) CTAs (the two levels of the
    final sums read about as many rows each), at most MAX_GROUPS groups."""
    num_ctas = -(-batch // SAMPLES)
    group_size = max(math.isqrt(num_ctas - 1) + 1, -(-num_ctas // MAX_GROUPS))
    return num_ctas, group_size, -(-num_ctas // group_size)


class QDenoiseKernel:
    def __init__(self, A: int, H: int, spread: bool = False):
        self.A, self.H = A, H
        self.spread = spread  # the one-level finish over every CTA (see the module docstring)
        self.L = num_entries(A, H)
        self.L_pad = padded_entries(A, H)
        self.vecs = self.L_pad // 4  # float4 vectors per work row
        self.vecs_per_thread = -(-self.vecs // THREADS)
        self.rows_per_step = max(1, LOADS_IN_FLIGHT // self.vecs_per_thread)
        # Sample-table rows (one column per sample):
        # dz1 [H] | dy [A] | q [A] | one | h1 [H] | scaled squared error.
        self.c_dz1 = 0
        self.c_dy = H
        self.c_q = H + A
        self.c_one = H + 2 * A
        self.c_h1 = H + 2 * A + 1
        self.c_sq = 2 * H + 2 * A + 1
        self.table_rows = 2 * H + 2 * A + 2

    @cute.jit
    def __call__(self, q_ptr: cute.Pointer, qt_ptr: cute.Pointer, w1_ptr: cute.Pointer,
                 b1_ptr: cute.Pointer, w2_ptr: cute.Pointer, b2_ptr: cute.Pointer,
                 dq_ptr: cute.Pointer, out_ptr: cute.Pointer, work_ptr: cute.Pointer,
                 ticket_ptr: cute.Pointer, batch: Int32, num_ctas: Int32, group_size: Int32,
                 num_groups: Int32, inv_count: Float32, stream: cuda.CUstream):
        A, H = self.A, self.H
        mQ = cute.make_tensor(q_ptr, cute.make_layout(batch * A))
        mQt = cute.make_tensor(qt_ptr, cute.make_layout(batch * A))
        mDq = cute.make_tensor(dq_ptr, cute.make_layout(batch * A))
        mW1 = cute.make_tensor(w1_ptr, cute.make_layout(H * A))
        mB1 = cute.make_tensor(b1_ptr, cute.make_layout(H))
        mW2 = cute.make_tensor(w2_ptr, cute.make_layout(A * H))
        mB2 = cute.make_tensor(b2_ptr, cute.make_layout(A))
        mOut = cute.make_tensor(out_ptr, cute.make_layout(self.L))
        # Rows 0 .. num_ctas-1: the CTAs' partial sums; then one row per group (none when spread).
        mWork = cute.make_tensor(work_ptr, cute.make_layout((num_ctas + num_groups, self.vecs, 4),
                                                            stride=(self.L_pad, 4, 1)))
        mTicket = cute.make_tensor(ticket_ptr, cute.make_layout(num_groups + 1))
        self.kernel(mQ, mQt, mW1, mB1, mW2, mB2, mDq, mOut, mWork, mTicket, batch, num_ctas,
                    group_size, num_groups, inv_count).launch(
            grid=[num_ctas, 1, 1], block=[THREADS, 1, 1], stream=stream, cooperative=self.spread)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mQt: cute.Tensor, mW1: cute.Tensor, mB1: cute.Tensor,
               mW2: cute.Tensor, mB2: cute.Tensor, mDq: cute.Tensor, mOut: cute.Tensor,
               mWork: cute.Tensor, mTicket: cute.Tensor, batch: Int32, num_ctas: Int32,
               group_size: Int32, num_groups: Int32, inv_count: Float32):
        A, H = self.A, self.H
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        smem = SmemAllocator()
        sW1 = smem.allocate_tensor(Float32, cute.make_layout((H, A), stride=(A, 1)), 16)
        sW2 = smem.allocate_tensor(Float32, cute.make_layout((A, H), stride=(H, 1)), 16)
        sB1 = smem.allocate_tensor(Float32, cute.make_layout(H), 16)
        sB2 = smem.allocate_tensor(Float32, cute.make_layout(A), 16)
        sTab = smem.allocate_tensor(Float32, cute.make_layout((self.table_rows, TABLE_STRIDE),
                                                              stride=(TABLE_STRIDE, 1)), 16)
        # The same table as float4 vectors of 4 consecutive samples (phase 3).
        sTab4 = cute.make_tensor(sTab.iterator, cute.make_layout(
            (self.table_rows, TABLE_STRIDE // 4, 4), stride=(TABLE_STRIDE, 4, 1)))
        sStage = smem.allocate_tensor(Float32, cute.make_layout(SAMPLES * A), 16)
        sTicket = smem.allocate_tensor(Int32, cute.make_layout(1), 4)

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
        first = cta * SAMPLES
        tile = SAMPLES * A  # floats of q in a full tile
        valid = cutlass.min((batch - first) * A, Int32(tile))  # ... in this tile
        last = batch * A - 1
        for k in cutlass.range_constexpr(-(-tile // THREADS)):
            i = tid + k * THREADS
            q_val = mQ[cutlass.min(first * A + i, last)]
            qt_val = mQt[cutlass.min(first * A + i, last)]
            if i >= valid:
                q_val = Float32(0.0)
                qt_val = Float32(0.0)
            if i < tile:
                sTab[self.c_q + i % A, i // A] = q_val
                sStage[i] = qt_val
        cute.arch.barrier()

        # 2. One sample per thread of the first SAMPLES (whole warps: the warp syncs below
        #    see full warps): forward, loss and backward in registers.
        if tid < SAMPLES:
            self.sample(tid, first + tid < batch, inv_count, sW1, sW2, sB1, sB2, sTab, sStage)
        cute.arch.barrier()

        # 3. dq out (coalesced), and the CTA's partial sums of every weight gradient and the
        #    loss into its work row (pad entries zero).
        for k in cutlass.range_constexpr(-(-tile // THREADS)):
            i = tid + k * THREADS
            if i < valid:
                mDq[first * A + i] = sStage[i]
        for k in cutlass.range_constexpr(-(-self.L_pad // THREADS)):
            j = tid + k * THREADS
            if j < self.L:
                col_u, col_v = self.entry_columns(j)
                chains = cute.make_rmem_tensor((4,), Float32)  # one per sample residue mod 4,
                chains.fill(0.0)  # combined in a fixed order
                u = cute.make_rmem_tensor((4,), Float32)
                v = cute.make_rmem_tensor((4,), Float32)
                for b4 in cutlass.range(SAMPLES // 4, unroll_full=True):
                    u.store(sTab4[col_u, b4, None].load())
                    v.store(sTab4[col_v, b4, None].load())
                    for c in cutlass.range_constexpr(4):
                        chains[c] = chains[c] + u[c] * v[c]
                mWork[cta, j // 4, j % 4] = (chains[0] + chains[1]) + (chains[2] + chains[3])
            elif j < self.L_pad:
                mWork[cta, j // 4, j % 4] = Float32(0.0)

        if cutlass.const_expr(self.spread):
            # 4. Spread (num_groups = 0): every CTA meets the others at one counter, then sums
            #    its slice of the row over all CTAs' rows in CTA order.
            _cute.wait_for_arrivals(mTicket, 0, _cute.arrive(mTicket, 0, tid), num_ctas, tid)
            _cute.sum_slice_in_order(mWork, 0, num_ctas, cta, tid, THREADS, SLICE_LOADS,
                                     lambda vec, total: self.write_vector(mOut, total, vec))
            _cute.depart(mTicket, 0, num_ctas, tid)
        else:
            self.two_levels(mOut, mWork, mTicket, sTicket, cta, tid, num_ctas, group_size, num_groups)

    @cute.jit
    def two_levels(self, mOut: cute.Tensor, mWork: cute.Tensor, mTicket: cute.Tensor, sTicket: cute.Tensor,
                   cta: Int32, tid: Int32, num_ctas: Int32, group_size: Int32, num_groups: Int32):
        """4. where the grid may be larger than the SMs: the group's last CTA adds the group's
        rows in CTA order, the last group finisher the group rows in group order."""
        group = cta // group_size
        group_first = group * group_size
        members = cutlass.min(group_size, num_ctas - group_first)
        if _cute.take_ticket(mTicket, group, tid, sTicket) == members - 1:
            cute.arch.fence_acq_rel_gpu()  # acquire: the other members' rows are visible
            acc = cute.make_rmem_tensor((self.vecs_per_thread, 4), Float32)
            _cute.sum_rows_in_order(mWork, group_first, members, tid, acc, THREADS, self.vecs, self.rows_per_step)
            if num_groups == 1:
                self.write_out(mOut, acc, tid)
            else:
                # Final level: the last group finisher adds the group rows in group order.
                for g in cutlass.range_constexpr(self.vecs_per_thread):
                    vec = tid + g * THREADS
                    if vec < self.vecs:
                        mWork[num_ctas + group, vec, None].store(acc[g, None].load())
                if _cute.take_ticket(mTicket, num_groups, tid, sTicket) == num_groups - 1:
                    cute.arch.fence_acq_rel_gpu()
                    _cute.sum_rows_in_order(mWork, num_ctas, num_groups, tid, acc, THREADS, self.vecs,
                                            self.rows_per_step)
                    self.write_out(mOut, acc, tid)
                    if tid == 0:
                        mTicket[num_groups] = Int32(0)  # ready for the next launch / replay
            if tid == 0:
                mTicket[group] = Int32(0)  # every member has drawn: safe to reset

    @cute.jit
    def sample(self, tid: Int32, real: cutlass.Boolean, inv_count: Float32, sW1: cute.Tensor,
               sW2: cute.Tensor, sB1: cute.Tensor, sB2: cute.Tensor, sTab: cute.Tensor,
               sStage: cute.Tensor):
        """Sample `tid` of the tile: reads q from its table column and q_target from the
        staging tile; writes dz1, dy, h1, the scaled squared error (table) and dq (staging)."""
        A, H = self.A, self.H
        scale = Float32(0.0)  # 1/(B*A) for a real sample, 0 for padding
        if real:
            scale = inv_count
        q = [sTab[self.c_q + a, tid] for a in range(A)]
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
            sTab[self.c_dz1 + h, tid] = dz1[h]
            sTab[self.c_h1 + h, tid] = h1[h]
        for a in cutlass.range_constexpr(A):
            sTab[self.c_dy + a, tid] = dy[a]
        sTab[self.c_one, tid] = Float32(1.0)
        sTab[self.c_sq, tid] = sq * scale

    @cute.jit
    def write_vector(self, mOut: cute.Tensor, total: cute.Tensor, vec: Int32):
        """Float4 vector `vec` of the totals into the [L] result (the row's pad entries dropped)."""
        for e in cutlass.range_constexpr(4):
            if vec * 4 + e < self.L:
                mOut[vec * 4 + e] = total[e]

    @cute.jit
    def write_out(self, mOut: cute.Tensor, acc: cute.Tensor, tid: Int32):
        """The [L] result from the thread's float4 sums (the row's pad entries dropped)."""
        for g in cutlass.range_constexpr(self.vecs_per_thread):
            self.write_vector(mOut, acc[g, None], tid + g * THREADS)

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
        """Sample-table rows (u, v) whose product, summed over samples, is entry j of
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


_compiled = _cute.CompiledCache(__name__)


def _kernel_and_args(A: int, H: int, spread: bool = False) -> tuple[Any, tuple]:
    """The kernel object and the (fake) arguments it compiles with."""
    return QDenoiseKernel(A, H, spread), (*[_cute.fake_ptr() for _ in range(9)], _cute.fake_ptr(Int32),
                                  Int32(1), Int32(1), Int32(1), Int32(1), Float32(1.0),
                                  _cute.fake_stream())


def _compile(A: int, H: int, keep: bool = False, spread: bool = False) -> Any:
    def build():
        kernel, args = _kernel_and_args(A, H, spread)
        return _cute.compile_kernel(kernel, *args, keep=keep)
    return _compiled.get((A, H, keep, spread), build)


CONTRACT = KernelContract(passes=("loss_and_grads",), options={"precision": PRECISIONS})


def check_sizes(chk: _arrays.Checker) -> None:
    """Supported: 1 <= A <= 32, 1 <= H <= 64 and H*A <= 1024 (a sample's activations live in
    registers and its four H x A matvecs are unrolled: more would spill), B*A < 2**31 and
    a work array (one row of partial sums per 64 samples) of under 2**31 floats (32-bit
    indexing)."""
    chk.dim_range("A", 1, MAX_A, "a sample's vectors are held in registers")
    chk.dim_range("H", 1, MAX_H, "a sample's hidden activations are held in registers")
    A, H = chk.dims["A"], chk.dims["H"]
    chk.dim_range("H", 1, MAX_WEIGHTS // A,
                  f"H*A <= {MAX_WEIGHTS}: the unrolled matvecs of a sample stay in registers")
    chk.dim_range("B", 1, MAX_ELEMENTS // A, "32-bit indexing of q")
    work_rows = MAX_ELEMENTS // padded_entries(A, H) - MAX_GROUPS  # CTA rows + group rows
    chk.dim_range("B", 1, SAMPLES * work_rows, "32-bit indexing of the per-CTA partial sums")


def loss_and_grads(q, q_target, W1, b1, W2, b2, *, precision: str = "tf32"):
    """(loss [1], dW1, db1, dW2, db2, dq) from one launch on q's current stream. The loss and
    the weight gradients are views into one [L] array (each 16-byte aligned when A and H are
    multiples of 4, as at the defaults)."""
    del precision  # one FFMA kernel serves both (see the module docstring)
    B, A = q.shape
    H = W1.shape[0]
    num_ctas, group_size, num_groups = reduction_grid(B)
    spread = num_ctas <= _arrays.sm_count(q)  # every CTA resident at once: one finish level
    if spread:
        group_size, num_groups = num_ctas, 0
    kernel = _compile(A, H, spread=spread)
    dq = _arrays.empty(q, (B, A))
    sums = _arrays.empty(q, (num_entries(A, H),))
    work = _arrays.empty(q, ((num_ctas + num_groups) * padded_entries(A, H),))  # fully rewritten
    tickets = _cute.tickets(q, num_groups + 1)
    ptr = _cute.gmem_ptr
    kernel(ptr(q), ptr(q_target), ptr(W1), ptr(b1), ptr(W2), ptr(b2), ptr(dq), ptr(sums), ptr(work),
           ptr(tickets, Int32), Int32(B), Int32(num_ctas), Int32(group_size), Int32(num_groups),
           Float32(1.0 / (B * A)), _cute.current_stream(q))
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
    """{name: (kernel, compile arguments)} at the CI sizes, with both finishes (spread, as at
    the defaults on an H200; two_level, where the grid is larger than the SMs)."""
    return {f"q_denoise_A{A}_H{H}{suffix}": _kernel_and_args(A, H, spread)
            for A, H in CI_SIZES for suffix, spread in (("", True), ("_two_level", False))}


def compiled_for_ci() -> dict[str, Any]:
    """The kernel at the defaults (A=12, H=24) and at odd widths, both finishes, PTX kept."""
    return {f"q_denoise_A{A}_H{H}{suffix}": _compile(A, H, keep=True, spread=spread)
            for A, H in CI_SIZES for suffix, spread in (("", True), ("_two_level", False))}
