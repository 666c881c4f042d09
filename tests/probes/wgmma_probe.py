"""Probe: TF32 warpgroup MMA (Hopper wgmma) with both operands in shared memory.

    C [M, N] = A [M, K] @ B [N, K]^T       float32 in and out, TF32 products, float32 sums

The test bed of foxcute.kernels._wgmma (which the Mamba2 fused kernels, curiosity's row pass
and gemm.KMajorWeightGrad use): a plain GEMM, checked against NumPy on its own by
tests/test_gpu_wgmma_probe.py and for its PTX by tests/test_compile_wgmma_probe.py; not a
kernel of the package. What the CuTe DSL lacks for TF32 wgmma, and the operand majors TF32
allows: see _wgmma's module docstring.

What the probe does with it.
- TF32 rounding: every element is rounded to nearest once, as it is staged in shared memory:
  _tf32.tf32_operand adds half a TF32 ulp to finite values and the tensor core's truncation
  completes the rounding (as foxcute.kernels.mamba2 does).
- Shared-memory layout: _wgmma's K-major 128-byte-swizzle atom (8 rows of 32 floats) tiled
  over the [rows, CHUNK] tile. CHUNK = 32 floats is exactly one atom row, so one K-chunk of a
  tile is rows/8 atoms stacked along M (N); the wgmma descriptors are built by the DSL from
  that layout (make_fragment_A/B), one per 8-wide K step.
- The swizzle moves whole 16-byte chunks, so 4 consecutive floats of a row stay contiguous:
  the staging is 128-bit loads from global memory into registers, rounding, 128-bit stores.
- Ordering: each thread fences its stores for the async proxy (_wgmma.publish) before the
  barrier that precedes the MMAs. warpgroup.fence() (wgmma.fence) before a step's first wgmma
  orders the accumulator registers (written by the fill and by the previous step's wgmmas)
  against it; commit_group closes the step's 4 wgmmas into one group; wait_group(1) at the
  end of step kc leaves only that group in flight, i.e. this warp has seen group kc - 1
  retire. Three buffers make one barrier per step enough: step kc refills the buffer of group
  kc - 3, and every warp waited for that group (end of step kc - 2) before arriving at step
  kc - 1's barrier, which the refilling warp has passed. (Two buffers would rely on one warp's
  wait covering the whole warpgroup's reads.) wait_group(0) before the epilogue reads the
  accumulators.

The kernel. One warpgroup (128 threads) per CTA and one 64 x N tile of C per CTA (N in
{32, 64}: one m64nNk8 instruction covers the tile's width). K is walked in CHUNK = 32 steps
through three shared buffers: chunk kc + 1 is loaded into registers while chunk kc's wgmmas
run, and chunk kc's wgmmas may still run while chunk kc + 1 is stored and multiplied.
Each CTA writes its own tile once: deterministic, no atomics.
"""

from __future__ import annotations

from typing import Any

from foxcute.kernels import _cute
from foxcute.kernels._cute import CompiledCache, compile_kernel, fake_ptr, fake_stream, gmem_ptr

import cuda.bindings.driver as cuda  # noqa: E402  (after _cute: it sets the target arch)
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402

from foxcute._arrays import Checker, FoxcuteInputError  # noqa: E402
from foxcute.kernels._tf32 import tf32_operand  # noqa: E402
from foxcute.kernels._wgmma import allocate_sw128, mma_group, publish, tiled_mma_tf32  # noqa: E402

THREADS = 128  # one warpgroup
TILE_M = 64  # rows of C per CTA: the wgmma M
CHUNK = 32  # K elements per main-loop step: one 128-byte swizzle row of float32
STAGES = 3  # shared buffers per operand: see Ordering above
SUPPORTED_N = (32, 64)
MAX_K = 512
DEFAULT_SIZES = dict(M=65536, N=32, K=256)  # Mamba2's a|u = h_hist [B*K, SH2] @ [W_A|W_B]


def check_sizes(chk: Checker) -> None:
    """M a multiple of 64, N in {32, 64}, K a multiple of 32 up to 512, M*K < 2**31."""
    chk.dim_multiple("M", TILE_M, "one CTA computes 64 whole rows of C")
    if chk.dims["N"] not in SUPPORTED_N:
        raise FoxcuteInputError(f"{chk.where}: N={chk.dims['N']} is not supported; the probe takes N in "
                                f"{SUPPORTED_N} (one m64nNk8 wgmma spans the tile)")
    chk.dim_range("K", CHUNK, MAX_K, "K is walked in 32-wide chunks; the loop is compiled per K")
    chk.dim_multiple("K", CHUNK, "K is walked in 32-wide chunks")
    if chk.dims["M"] * chk.dims["K"] >= 2**31:
        raise FoxcuteInputError(f"{chk.where}: A has {chk.dims['M'] * chk.dims['K']} elements; the "
                                f"kernel indexes with 32-bit integers (M*K < 2**31)")


class WgmmaTF32Matmul:
    """C = A @ B^T, A [M, K], B [N, K], both row-major (K-major), on TF32 wgmma."""

    def __init__(self, n: int, k: int):
        self.n = n
        self.k = k
        self.smem_bytes = 4 * STAGES * CHUNK * (TILE_M + n) + 1024  # + the atom alignment

    @cute.jit
    def __call__(self, p_a: cute.Pointer, p_b: cute.Pointer, p_c: cute.Pointer, m: Int32,
                 stream: cuda.CUstream):
        mA = cute.make_tensor(p_a, cute.make_layout((m, self.k), stride=(self.k, 1)))
        mB = cute.make_tensor(p_b, cute.make_layout((self.n, self.k), stride=(self.k, 1)))
        mC = cute.make_tensor(p_c, cute.make_layout((m, self.n), stride=(self.n, 1)))
        self.kernel(mA, mB, mC).launch(grid=(m // TILE_M, 1, 1), block=(THREADS, 1, 1),
                                       smem=self.smem_bytes, stream=stream)

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        tile, _, _ = cute.arch.block_idx()
        row0 = tile * TILE_M

        smem = cutlass.memory.SmemAllocator()
        # (rows, CHUNK, STAGES): atoms stacked down the rows, then the stages.
        sA = allocate_sw128(smem, (TILE_M, CHUNK, STAGES))
        sB = allocate_sw128(smem, (self.n, CHUNK, STAGES))

        tiled_mma = tiled_mma_tf32(self.n)
        thr = tiled_mma.get_slice(tid)
        # (MMA, 1, CHUNK / 8, STAGES) descriptors: one per operand, K step and stage.
        tCrA = tiled_mma.make_fragment_A(thr.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr.partition_B(sB))
        gC = cute.local_tile(mC, (TILE_M, self.n), (tile, 0))
        tCgC = thr.partition_C(gC)
        acc = cute.make_rmem_tensor(tCgC.shape, Float32)
        acc.fill(0.0)

        # The next chunk's operands in registers, 4 floats a vector (see fetch / stage).
        rA = cute.make_rmem_tensor((4, _vectors_per_thread(TILE_M)), Float32)
        rB = cute.make_rmem_tensor((4, _vectors_per_thread(self.n)), Float32)
        num_chunks = self.k // CHUNK
        self.fetch(mA, row0, 0, rA, TILE_M, tid)
        self.fetch(mB, 0, 0, rB, self.n, tid)
        for kc in cutlass.range(num_chunks, unroll=1):
            stage = kc % STAGES
            self.stage(rA, sA[None, None, stage], TILE_M, tid)
            self.stage(rB, sB[None, None, stage], self.n, tid)
            publish()  # my stores -> visible to wgmma (async proxy)
            cute.arch.barrier()  # everyone's stores are in
            mma_group(tiled_mma, acc, tCrA, tCrB, a_at=(stage,), b_at=(stage,))
            if kc + 1 < num_chunks:
                self.fetch(mA, row0, (kc + 1) * CHUNK, rA, TILE_M, tid)
                self.fetch(mB, 0, (kc + 1) * CHUNK, rB, self.n, tid)
            # Group kc - 1 retires here (as this warp sees it). Step kc + 1 refills the buffer
            # group kc - 2 read, which every warp saw retire before this step's barrier.
            warpgroup.wait_group(1)
        warpgroup.wait_group(0)
        cute.autovec_copy(acc, tCgC)

    @cute.jit
    def fetch(self, src: cute.Tensor, row0: Int32, col0: Int32, regs: cute.Tensor,
              rows: cutlass.Constexpr[int], tid: Int32):
        """regs <- src[row0 : row0 + rows, col0 : col0 + CHUNK] as float4 vectors: vector
        v = tid + i * THREADS is row v // 8, floats 4 (v % 8) .. +3 (a warp reads 4 whole
        128-byte row segments: coalesced)."""
        per_row = CHUNK // 4
        for i in cutlass.range_constexpr(_vectors_per_thread(rows)):
            v = tid + i * THREADS
            r = v // per_row
            q = v - r * per_row
            cute.autovec_copy(cute.local_tile(src[row0 + r, None], (4,), (col0 // 4 + q,)), regs[None, i])

    @cute.jit
    def stage(self, regs: cute.Tensor, dst: cute.Tensor, rows: cutlass.Constexpr[int], tid: Int32):
        """dst (a [rows, CHUNK] swizzled stage) <- the vectors fetch put in regs, rounded to TF32."""
        per_row = CHUNK // 4
        for i in cutlass.range_constexpr(_vectors_per_thread(rows)):
            v = tid + i * THREADS
            r = v // per_row
            q = v - r * per_row
            for e in cutlass.range_constexpr(4):
                regs[e, i] = tf32_operand(regs[e, i])
            cute.autovec_copy(regs[None, i], cute.local_tile(dst[r, None], (4,), (q,)))


def _vectors_per_thread(rows: int) -> int:
    return rows * (CHUNK // 4) // THREADS  # rows is a multiple of 16: exact


_compiled = CompiledCache(__name__)


def compile_args(n: int, k: int) -> tuple:
    """(kernel object, arguments) to compile WgmmaTF32Matmul with, on any machine."""
    p = fake_ptr()
    return (WgmmaTF32Matmul(n, k), p, p, p, Int32(TILE_M), fake_stream())


def _compile(n: int, k: int, keep: bool = False) -> Any:
    return _compiled.get((n, k, keep), lambda: compile_kernel(*compile_args(n, k), keep=keep))


def matmul_nt(A: Any, B: Any, *, out: Any = None) -> Any:
    """A [M, K] @ B [N, K]^T for float32 cupy arrays / torch CUDA tensors, on the current
    stream. Sizes: see check_sizes."""
    chk = Checker("probes.wgmma_probe.matmul_nt", gpu=True)
    chk.array("A", A, ("M", "K"))
    chk.array("B", B, ("N", "K"))
    check_sizes(chk)
    m, n, k = chk.dims["M"], chk.dims["N"], chk.dims["K"]
    out = chk.output(out, ("M", "N"), A)
    _compile(n, k)(gmem_ptr(A), gmem_ptr(B), gmem_ptr(out), Int32(m), _cute.current_stream(A))
    return out


def compiled_for_ci() -> dict[str, Any]:
    """The probe compiled with PTX kept at both widths, K = 256."""
    return {f"wgmma_tf32_n{n}": _compile(n, DEFAULT_SIZES["K"], keep=True) for n in SUPPORTED_N}
