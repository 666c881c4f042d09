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
- Threads accumulate with Kahan compensation (see kahan_add). Each CTA sums its threads'
  partials over r in a fixed order (shared memory) and writes one packed row of partial
  sums. The last CTA to finish (an atomic ticket on an integer, the only atomic) sums the
  CTAs' partials in CTA order, folds the `pack` positions of each column and adds the
  M % pack tail rows. Every add happens in an order fixed by (M, N, grid), so the result is
  bit-identical run to run; no float atomics.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .. import _arrays
from . import _cute

MAX_VECS_PER_THREAD = 2  # with Kahan compensation, 4 floats of state per float4: no spills
CTAS_PER_SM = 2
LOADS_IN_FLIGHT = 4  # float4 loads per thread per step: 2 CTAs/SM keep ~32 KB in flight per SM
MAX_ELEMENTS = 2**31 - 1  # CuTe layouts index with 32-bit integers


class ColumnSum:
    def __init__(self, n: int):
        self.n = n
        self.pack = 1 if n % 4 == 0 else (2 if n % 2 == 0 else 4)
        self.width = self.pack * n  # floats per packed row
        self.vecs = self.width // 4  # float4 vectors per packed row
        # 256 threads; more where a packed row has over 1024 vectors (1024 threads at N = 4095)
        self.threads = max(256, min(1024, 32 * -(-self.vecs // (32 * MAX_VECS_PER_THREAD))))
        self.cols = min(self.vecs, self.threads)
        self.rows = self.threads // self.cols
        self.vecs_per_thread = -(-self.vecs // self.cols)
        self.unroll = max(1, LOADS_IN_FLIGHT // self.vecs_per_thread)  # packed rows per step

    @cute.jit
    def __call__(self, g_ptr: cute.Pointer, out_ptr: cute.Pointer, work_ptr: cute.Pointer,
                 ticket_ptr: cute.Pointer, m: Int32, num_ctas: Int32, stream):
        packed_rows = m // self.pack
        mG = cute.make_tensor(g_ptr, cute.make_layout((packed_rows, self.vecs, 4),
                                                      stride=(self.width, 4, 1)))
        mRows = cute.make_tensor(g_ptr, cute.make_layout((m, self.n), stride=(self.n, 1)))
        # Row i < num_ctas: CTA i's packed partial sums; row num_ctas: their total.
        mWork = cute.make_tensor(work_ptr, cute.make_layout((num_ctas + 1, self.vecs, 4),
                                                            stride=(self.width, 4, 1)))
        mTotal = cute.make_tensor(work_ptr + num_ctas * self.width, cute.make_layout(self.width))
        mOut = cute.make_tensor(out_ptr, cute.make_layout(self.n))
        mTicket = cute.make_tensor(ticket_ptr, cute.make_layout(1))
        self.kernel(mG, mRows, mWork, mTotal, mOut, mTicket, m, num_ctas).launch(
            grid=[num_ctas, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mG: cute.Tensor, mRows: cute.Tensor, mWork: cute.Tensor, mTotal: cute.Tensor,
               mOut: cute.Tensor, mTicket: cute.Tensor, m: Int32, num_ctas: Int32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        smem = cutlass.utils.SmemAllocator()
        # Per-thread-row partials, needed only when several thread rows share a CTA.
        sPartial = None
        if cutlass.const_expr(self.rows > 1):
            sPartial = smem.allocate_tensor(Float32, cute.make_layout((self.rows, self.vecs, 4),
                                                                      stride=(self.width, 4, 1)), 16)
        sTicket = smem.allocate_tensor(Int32, cute.make_layout(1), 4)

        # Phase 1: this CTA's share of G -> one packed row of partial sums in mWork[cta].
        self.sum_rows(mG, mG.shape[0], cta, num_ctas, tid, sPartial, mWork, cta)

        # Publish the partials, then take a ticket; the CTA that draws the last one finishes.
        cute.arch.fence_acq_rel_gpu()
        cute.arch.sync_threads()
        if tid == 0:
            sTicket[0] = cute.arch.atomic_add(mTicket.iterator, Int32(1), sem="acq_rel", scope="gpu")
        cute.arch.sync_threads()
        if sTicket[0] == num_ctas - 1:
            cute.arch.fence_acq_rel_gpu()
            # Phase 2: the CTAs' partials, summed in CTA order by the same code, -> mWork[num_ctas].
            self.sum_rows(mWork, num_ctas, 0, 1, tid, sPartial, mWork, num_ctas)
            cute.arch.sync_threads()
            tail_start = (m // self.pack) * self.pack
            for col in cutlass.range(tid, self.n, self.threads, unroll=1):
                total = Float32(0.0)
                for p in cutlass.range_constexpr(self.pack):
                    total = total + mTotal[p * self.n + col]
                for row in cutlass.range(tail_start, m, unroll=1):
                    total = total + mRows[row, col]
                mOut[col] = total
            if tid == 0:
                mTicket[0] = Int32(0)  # ready for the next launch (and graph replay)

    @cute.jit
    def kahan_add(self, acc: cute.Tensor, comp: cute.Tensor, g: int, x: cute.TensorSSA):
        """acc[g] += x with compensated (Kahan) summation. A thread's chain is M/grid rows
        long (3800 at M=1e6, N=4096); plain float32 adds would lose ~1e-6 relative on
        mean-zero data, compensated ones stay near 1e-7. Four flops a float cost nothing here."""
        y = x - comp[g, None].load()
        a = acc[g, None].load()
        t = a + y
        comp[g, None].store((t - a) - y)
        acc[g, None].store(t)

    @cute.jit
    def sum_rows(self, mSrc: cute.Tensor, num_rows: Int32, first_group: Int32, group_stride: Int32,
                 tid: Int32, sPartial: cute.Tensor, mDst: cute.Tensor, dst_row: Int32):
        """Sum packed rows first_group*rows + r, stepping group_stride*rows, of mSrc into
        mDst[dst_row]; thread (r, c) = divmod(tid, cols) adds float4 columns c, c+cols, ..."""
        r = tid // self.cols
        c = tid % self.cols
        acc = cute.make_rmem_tensor((self.vecs_per_thread, 4), Float32)
        comp = cute.make_rmem_tensor((self.vecs_per_thread, 4), Float32)
        acc.fill(0.0)
        comp.fill(0.0)
        # Threads past rows*cols (when cols does not divide the CTA) read nothing.
        start = first_group * self.rows + r if r < self.rows else num_rows
        for i in cutlass.range(start, num_rows, group_stride * self.rows, unroll=self.unroll):
            for g in cutlass.range_constexpr(self.vecs_per_thread):
                v = c + g * self.cols
                if cutlass.const_expr(self.vecs % self.cols == 0):
                    self.kahan_add(acc, comp, g, mSrc[i, v, None].load())
                elif v < self.vecs:
                    self.kahan_add(acc, comp, g, mSrc[i, v, None].load())
        if cutlass.const_expr(self.rows == 1):
            for g in cutlass.range_constexpr(self.vecs_per_thread):
                v = c + g * self.cols
                if v < self.vecs:
                    mDst[dst_row, v, None].store(acc[g, None].load())
        else:
            # rows > 1 means cols == vecs: every thread holds exactly one vector.
            if r < self.rows:
                sPartial[r, c, None].store(acc[0, None].load())
            cute.arch.sync_threads()
            for e in cutlass.range(tid, self.vecs, self.threads, unroll=1):
                s = sPartial[0, e, None].load()
                for rr in cutlass.range(1, self.rows, unroll_full=True):
                    s = s + sPartial[rr, e, None].load()
                mDst[dst_row, e, None].store(s)


_compiled = _cute.CompiledCache()


def compile_args() -> tuple:
    """Arguments to compile ColumnSum(n).__call__ with, on any machine."""
    return (_cute.fake_ptr(), _cute.fake_ptr(), _cute.fake_ptr(), _cute.fake_ptr(Int32),
            Int32(1), Int32(1), _cute.fake_stream())


def _compile(n: int, keep: bool = False) -> Any:
    return _compiled.get((n, keep), lambda: _cute.compile_kernel(ColumnSum(n), *compile_args(), keep=keep))


def check_sizes(chk: _arrays.Checker) -> None:
    m, n = chk.dims["M"], chk.dims["N"]
    if m * n > MAX_ELEMENTS:
        raise _arrays.FoxcuteInputError(
            f"{chk.where}: G has M*N = {m * n} elements; the kernel indexes with 32-bit integers "
            f"and takes at most {MAX_ELEMENTS}")


def grid_size(m: int, n: int, sms: int) -> int:
    k = ColumnSum(n)
    groups = -(-(m // k.pack) // k.rows)  # packed-row groups of one CTA step
    return max(1, min(CTAS_PER_SM * sms, -(-groups // k.unroll)))


def column_sum(G: Any, out: Any = None) -> Any:
    """Column sums of a validated float32 C-contiguous 2-D cupy array or torch CUDA tensor,
    launched on that library's current stream. `out` ([N], same kind) is written if given."""
    m, n = G.shape
    if out is None:
        out = _arrays.empty(G, (n,))
    kernel = _compile(n)
    num_ctas = grid_size(m, n, _cute.sm_count(G))
    work = _arrays.empty(G, ((num_ctas + 1) * kernel_width(n),))
    ticket = _arrays.zeros(G, (1,), "int32")
    kernel(_cute.gmem_ptr(G), _cute.gmem_ptr(out), _cute.gmem_ptr(work), _cute.gmem_ptr(ticket, Int32),
           Int32(m), Int32(num_ctas), _cute.current_stream(G))
    return out


def kernel_width(n: int) -> int:
    return ColumnSum(n).width


def compiled_for_ci() -> dict[str, Any]:
    """The kernel compiled with PTX kept, at the IQN head's widths and an odd one."""
    return {f"column_sum_N{n}": _compile(n, keep=True) for n in (3, 128, 4095)}
