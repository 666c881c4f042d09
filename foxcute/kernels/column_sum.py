"""column_sum(G [M, N]) -> [N] on the GPU: one pass over G, deterministic.

Work and floor: M*N*4 bytes read, N*4 written, M*N adds. At the IQN sizes (M = 524288) that
is 6.3 MB for N = 3 (1.5 us at 4.25 TB/s) and 268 MB for N = 128 (63 us): bandwidth bound.

Design.
- 128-bit loads for every N: rows are packed `pack` at a time (1 if N % 4 == 0, 2 if N is
  even, else 4) so a packed row of pack*N floats is whole float4 vectors, each 16-byte
  aligned. Element e of a packed row belongs to column e % N.
- A CTA of 256 threads (up to 1024 for the widest rows) is a grid of `rows` x `cols`
  threads over packed rows: thread (r, c) owns float4 vectors c, c + cols, ... of packed
  rows r, r + rows, ... of its CTA's share, so each lane always adds into the same
  packed-row position (no shuffles in the streaming loop) and a warp's loads are contiguous.
  A CTA's share is one contiguous chunk of the rows (a whole number of its `unroll`-row
  steps), so each step's loads cover one contiguous block (faster than a grid-stride share).
- Threads add with Kahan compensation (see kahan_add). Each CTA folds its threads'
  partials over r in a fixed pairwise tree of compensated (TwoSum) adds in shared memory
  and writes one packed row of partial sums. The last CTA to finish (an atomic ticket on an integer, the only atomic) sums the
  CTAs' partials in CTA order, folds the `pack` positions of each column and adds the
  M % pack tail rows. Every add happens in an order fixed by (M, N, grid), so the result is
  bit-identical run to run; no float atomics. Where a CTA has several thread rows, the last
  CTA reads its total for that fold from shared memory, not back through L2 (one round trip
  less on its critical path).

Times (run 20261203T162501Z, graph-replayed): on the IQN head's M = 524288 rows N = 3 takes
6.37 us, N = 128 72.5 us; on M = 64 4.53 us, where a graph replay of one trivial kernel
takes 2.25 us. What M = 64 pays beyond the replay is round trips in series whatever M is:
the first loads, the partials' store and fence, the ticket, the last CTA's loads of the
partials. At N = 3 streaming the 6.3 MB adds the rest, near its 1.5 us floor; what is left to
cut is that chain, so the 5 us target for N = 3 needs a different cross-CTA step (e.g. a
cluster reduction through distributed shared memory), not faster streaming.
History: docs/notes/column-sum.md.
"""

from __future__ import annotations

import functools
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .. import _arrays
from .._layer import KernelContract
from . import _cute

MAX_VECS_PER_THREAD = 2  # with Kahan compensation, 4 floats of state per float4: no spills
# 8 loads x 4 CTAs an SM: the best of an H200 sweep at M = 524288 (N = 3 and 128;
# docs/notes/column-sum.md)
CTAS_PER_SM = 4
LOADS_IN_FLIGHT = 8  # float4 loads per thread per step
# Rows cut into column slices are short (per-CTA partials: a few hundred rows), so the last
# CTA's sum over the CTAs' rows is a good part of the time: fewer, deeper CTAs balance the two
# phases (12: the best of an H200 sweep of 4..32 at the Mamba2 backward's partials).
LOADS_IN_FLIGHT_SLICED = 12
MAX_ELEMENTS = 2**31 - 1  # CuTe layouts index with 32-bit integers


class ColumnSum:
    def __init__(self, n: int, loads_in_flight: int | None = None, dependent: bool = False):
        self.n = n
        # Launched as a programmatic dependent (PDL) of the kernel before it on the stream,
        # which signals griddepcontrol.launch_dependents once its own reads are done (the
        # Mamba2 backward's FusedBackward, whose partials this sums): the launch and the CTAs'
        # start overlap that kernel's tail, and griddepcontrol.wait holds the first load until
        # that kernel has finished and its writes are visible.
        self.dependent = dependent
        self.pack = 1 if n % 4 == 0 else (2 if n % 2 == 0 else 4)
        self.width = self.pack * n  # floats per packed row
        self.vecs = self.width // 4  # float4 vectors per packed row
        # Rows of whole vectors (pack 1) wider than one CTA's 256 threads are cut into column
        # slices, one per grid column, each with its own ticket and final sum: short, wide
        # inputs (per-CTA weight-gradient partials, [264, 4096] or [264, 12548]) then finish
        # on several CTAs instead of one.
        self.slices = -(-self.vecs // 256) if self.pack == 1 else 1
        # 256 threads; more where a packed row has over 1024 vectors (1024 threads at N = 4095)
        self.threads = 256 if self.slices > 1 else \
            max(256, min(1024, 32 * -(-self.vecs // (32 * MAX_VECS_PER_THREAD))))
        self.cols = min(self.vecs, self.threads)
        self.rows = self.threads // self.cols
        self.vecs_per_thread = 1 if self.slices > 1 else -(-self.vecs // self.cols)
        # one ticket per column slice of 256 float4: 4 at N = 4096 (the public limit); the
        # kernels' own per-CTA weight-gradient partials (N a multiple of 4) take more
        assert self.slices <= _cute.TICKETS_PER_LAUNCH, f"{n} columns need {self.slices} tickets"
        if loads_in_flight is None:
            loads_in_flight = LOADS_IN_FLIGHT_SLICED if self.slices > 1 else LOADS_IN_FLIGHT
        self.unroll = max(1, loads_in_flight // self.vecs_per_thread)  # packed rows per step
        # Pairwise fold of the thread rows: halves 2^k < rows, ..., 2, 1.
        self.fold_halves = [1 << k for k in reversed(range((self.rows - 1).bit_length()))]

    @cute.jit
    def __call__(self, g_ptr: cute.Pointer, out_ptr: cute.Pointer, work_ptr: cute.Pointer,
                 ticket_ptr: cute.Pointer, m: Int32, num_ctas: Int32, stream: cuda.CUstream):
        packed_rows = m // self.pack
        mG = cute.make_tensor(g_ptr, cute.make_layout((packed_rows, self.vecs, 4),
                                                      stride=(self.width, 4, 1)))
        mRows = cute.make_tensor(g_ptr, cute.make_layout((m, self.n, 1), stride=(self.n, 1, 1)))
        # Row i < num_ctas: CTA i's packed partial sums; row num_ctas: their total.
        mWork = cute.make_tensor(work_ptr, cute.make_layout((num_ctas + 1, self.vecs, 4),
                                                            stride=(self.width, 4, 1)))
        mTotal = cute.make_tensor(work_ptr + num_ctas * self.width, cute.make_layout((self.width, 1)))
        mOut = cute.make_tensor(out_ptr, cute.make_layout(self.n))
        mTicket = cute.make_tensor(ticket_ptr, cute.make_layout(self.slices))
        self.kernel(mG, mRows, mWork, mTotal, mOut, mTicket, m, num_ctas).launch(
            grid=[num_ctas, self.slices, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=self.dependent)

    @cute.kernel
    def kernel(self, mG: cute.Tensor, mRows: cute.Tensor, mWork: cute.Tensor, mTotal: cute.Tensor,
               mOut: cute.Tensor, mTicket: cute.Tensor, m: Int32, num_ctas: Int32):
        tid, _, _ = cute.arch.thread_idx()
        cta, column_slice, _ = cute.arch.block_idx()
        first_vec = column_slice * self.cols  # this CTA's slice of vectors (0 with one slice)
        smem = cutlass.memory.SmemAllocator()
        # Per-thread-row partials, needed only when several thread rows share a CTA.
        sHigh = sLow = None
        if cutlass.const_expr(self.rows > 1):
            partial_layout = cute.make_layout((self.rows, self.vecs, 4), stride=(self.width, 4, 1))
            sHigh = smem.allocate_tensor(Float32, partial_layout, 16)
            sLow = smem.allocate_tensor(Float32, partial_layout, 16)
        sTicket = smem.allocate_tensor(Int32, cute.make_layout(1), 4)

        if cutlass.const_expr(self.dependent):
            cute.arch.griddepcontrol_wait()
        # Phase 1: this CTA's share of G -> one packed row of partial sums in mWork[cta].
        # Each CTA takes one contiguous chunk of packed rows, a whole number of its steps long.
        span = self.rows * self.unroll
        chunk = (mG.shape[0] + num_ctas * span - 1) // (num_ctas * span) * span
        self.sum_rows(mG, cta * chunk, cutlass.min((cta + 1) * chunk, mG.shape[0]), self.rows,
                      tid, first_vec, sHigh, sLow, mWork, cta)

        # Publish the partials, then take a ticket; the CTA that draws the last one finishes.
        if _cute.take_ticket(mTicket, column_slice, tid, sTicket) == num_ctas - 1:
            cute.arch.fence_acq_rel_gpu()
            # Phase 2: the CTAs' partials, summed in CTA order by the same code. With several
            # thread rows the total stays in shared memory (sHigh[0] + sLow[0]) for the
            # columns' fold below: storing it to mWork[num_ctas] and reading it back was one
            # more L2 round trip on the kernel's critical path. With one, it goes to mTotal.
            self.sum_rows(mWork, 0, num_ctas, self.rows, tid, first_vec, sHigh, sLow,
                          mWork if cutlass.const_expr(self.rows == 1) else None, num_ctas)
            cute.arch.sync_threads()
            if cutlass.const_expr(self.rows > 1):
                total_high = cute.make_tensor(sHigh.iterator, cute.make_layout((self.width, 1)))
                total_low = cute.make_tensor(sLow.iterator, cute.make_layout((self.width, 1)))
            tail_start = (m // self.pack) * self.pack
            # The slice's columns (all of them with one slice, where the pack fold may reach
            # across the packed row).
            last_col = cutlass.min(4 * (first_vec + self.cols * self.vecs_per_thread), self.n)
            for col in cutlass.range(4 * first_vec + tid, last_col, self.threads, unroll=1):
                total = cute.make_rmem_tensor((1, 1), Float32)
                total_comp = cute.make_rmem_tensor((1, 1), Float32)
                total.fill(0.0)
                total_comp.fill(0.0)
                for p in cutlass.range_constexpr(self.pack):
                    e = p * self.n + col
                    if cutlass.const_expr(self.rows > 1):
                        self.kahan_add(total, total_comp, 0,
                                       total_high[e, None].load() + total_low[e, None].load())
                    else:
                        self.kahan_add(total, total_comp, 0, mTotal[e, None].load())
                for row in cutlass.range(tail_start, m, unroll=1):
                    self.kahan_add(total, total_comp, 0, mRows[row, col, None].load())
                mOut[col] = total[0, 0]
            if tid == 0:
                mTicket[column_slice] = Int32(0)  # ready for the next launch (and graph replay)

    @cute.jit
    def kahan_add(self, acc: cute.Tensor, comp: cute.Tensor, g: int, x: cute.TensorSSA):
        """acc[g] += x with compensated (Kahan) summation. A thread's chain is M/grid rows
        long (3800 at M=1e6, N=4096) and the CTA and grid levels add hundreds more; plain
        float32 adds lost 1.3e-6 relative on one mean-zero column of 1e6 rows on the H200,
        compensated ones stay near float32 rounding. Four flops a float cost nothing here."""
        y = x - comp[g, None].load()
        a = acc[g, None].load()
        t = a + y
        comp[g, None].store((t - a) - y)
        acc[g, None].store(t)

    @cute.jit
    def sum_rows(self, mSrc: cute.Tensor, first_row: Int32, end_row: Int32, row_step: Int32,
                 tid: Int32, first_vec: Int32, sHigh: cute.Tensor, sLow: cute.Tensor, mDst: cute.Tensor,
                 dst_row: Int32):
        """Sum packed rows first_row + r, + row_step, ... (below end_row) of mSrc into
        mDst[dst_row]; thread (r, c) = divmod(tid, cols) adds float4 columns c, c+cols, ...
        With several thread rows the sum is also sHigh[0] + sLow[0] on return, and mDst may
        be None (nothing stored)."""
        r = tid // self.cols
        c = tid % self.cols
        acc = cute.make_rmem_tensor((self.vecs_per_thread, 4), Float32)
        comp = cute.make_rmem_tensor((self.vecs_per_thread, 4), Float32)
        acc.fill(0.0)
        comp.fill(0.0)
        # Threads past rows*cols (when cols does not divide the CTA) read nothing.
        start = first_row + r if r < self.rows else end_row
        # Each trip issues all `unroll` x vecs_per_thread loads before the first add, so that
        # many 16-byte loads are in flight per thread; rows past the end load zeros.
        for base in cutlass.range(start, end_row, row_step * self.unroll, unroll=1):
            batch = cute.make_rmem_tensor((self.unroll, self.vecs_per_thread, 4), Float32)
            for u in cutlass.range_constexpr(self.unroll):
                for g in cutlass.range_constexpr(self.vecs_per_thread):
                    v = first_vec + c + g * self.cols
                    if base + u * row_step < end_row and v < self.vecs:
                        batch[u, g, None].store(mSrc[base + u * row_step, v, None].load())
                    else:
                        batch[u, g, None].fill(0.0)
            for u in cutlass.range_constexpr(self.unroll):
                for g in cutlass.range_constexpr(self.vecs_per_thread):
                    self.kahan_add(acc, comp, g, batch[u, g, None].load())
        # A thread's sum is acc - comp (Kahan's comp holds the negated low part).
        if cutlass.const_expr(self.rows == 1):
            # Only thread row 0 summed anything: where cols < threads (128 < vecs < 256, one
            # slice) the threads past cols hold zeros, and their stores would race the sums
            # of vectors c = tid - cols (docs/notes/column-sum.md).
            if r == 0:
                for g in cutlass.range_constexpr(self.vecs_per_thread):
                    v = first_vec + c + g * self.cols
                    if v < self.vecs:
                        mDst[dst_row, v, None].store(acc[g, None].load() - comp[g, None].load())
        else:
            # rows > 1 means cols == vecs: every thread holds exactly one vector. Fold the
            # thread rows pairwise in shared memory (a fixed tree, log2(rows) barriers; a
            # sequential fold of 85 rows at N = 3 cost ~0.7 us of dependent adds), carrying
            # each sum as a high and a low part joined by an exact TwoSum: a plain float32
            # tree lost 1.7e-6 relative on a cancelling column on the H200.
            if r < self.rows:
                sHigh[r, c, None].store(acc[0, None].load())
                sLow[r, c, None].store(-comp[0, None].load())
            for level in cutlass.range_constexpr(len(self.fold_halves)):
                half = self.fold_halves[level]
                cute.arch.sync_threads()
                if r < half and r + half < self.rows:
                    a = sHigh[r, c, None].load()
                    b = sHigh[r + half, c, None].load()
                    s = a + b
                    b_virtual = s - a
                    err = (a - (s - b_virtual)) + (b - b_virtual)
                    sHigh[r, c, None].store(s)
                    sLow[r, c, None].store(sLow[r, c, None].load() + sLow[r + half, c, None].load() + err)
            cute.arch.sync_threads()
            if cutlass.const_expr(mDst is not None):
                if r == 0:
                    mDst[dst_row, first_vec + c, None].store(sHigh[0, c, None].load() + sLow[0, c, None].load())


_compiled = _cute.CompiledCache(__name__)


def compile_args() -> tuple:
    """Arguments to compile ColumnSum(n).__call__ with, on any machine."""
    return (_cute.fake_ptr(), _cute.fake_ptr(), _cute.fake_ptr(), _cute.fake_ptr(Int32),
            Int32(1), Int32(1), _cute.fake_stream())


def _compile(n: int, keep: bool = False, dependent: bool = False) -> Any:
    return _compiled.get((n, keep, dependent),
                         lambda: _cute.compile_kernel(_config(n, dependent), *compile_args(), keep=keep))


CONTRACT = KernelContract(passes=("column_sum",))  # float32 adds in a fixed order: no options


def check_sizes(chk: _arrays.Checker) -> None:
    chk.dim_range("M", 1, MAX_ELEMENTS, "row counts are 32-bit in the kernel")


def grid_size(kernel: ColumnSum, m: int, sms: int, ctas_per_sm: int = CTAS_PER_SM) -> int:
    """CTAs along the rows (each column slice gets as many)."""
    groups = -(-(m // kernel.pack) // kernel.rows)  # packed-row groups of one CTA step
    return max(1, min(ctas_per_sm * sms // kernel.slices, -(-groups // kernel.unroll)))


def column_sum(G: Any, out: Any = None, *, dependent: bool = False) -> Any:
    """Column sums of a validated float32 C-contiguous 2-D cupy array or torch CUDA tensor,
    launched on that library's current stream. `out` ([N], same kind) is written if given.
    `dependent`: launch as a programmatic dependent of the stream's previous kernel (see
    ColumnSum), for a G that kernel writes and signals launch_dependents for.

    CuTe layouts index with 32 bits, so a G of more than 2^31 - 1 elements is summed in row
    blocks under that size whose [blocks, N] results are summed once more (fixed order)."""
    m, n = G.shape
    if out is None:
        out = _arrays.empty(G, (n,))
    block_rows = MAX_ELEMENTS // n // 4 * 4  # a multiple of 4 keeps every block 16-byte aligned
    if m <= block_rows:
        _launch(G, out, dependent)
        return out
    block_sums = [_launch(G[start:start + block_rows], _arrays.empty(G, (n,)), dependent)
                  for start in range(0, m, block_rows)]
    _launch(_arrays.stack(block_sums), out)
    return out


def _launch(G: Any, out: Any, dependent: bool = False) -> Any:
    m, n = G.shape
    config = _config(n, dependent)
    num_ctas = grid_size(config, m, _arrays.sm_count(G))
    work = _arrays.empty(G, ((num_ctas + 1) * config.width,))
    _compile(n, dependent=dependent)(_cute.gmem_ptr(G), _cute.gmem_ptr(out), _cute.gmem_ptr(work),
                _cute.gmem_ptr(_cute.tickets(G, config.slices), Int32), Int32(m), Int32(num_ctas), _cute.current_stream(G))
    return out


@functools.lru_cache(maxsize=None)
def _config(n: int, dependent: bool = False) -> ColumnSum:
    return ColumnSum(n, dependent=dependent)


def compiled_for_ci() -> dict[str, Any]:
    """The kernel compiled with PTX kept, at the IQN head's widths and an odd one, and as a
    programmatic dependent at a width cut into column slices (as the Mamba2 backward's)."""
    return {**{f"column_sum_N{n}": _compile(n, keep=True) for n in (3, 128, 4095)},
            "column_sum_N4096_dependent": _compile(4096, keep=True, dependent=True)}
