"""Hopper TF32 warpgroup MMA (wgmma): what the CuTe DSL 4.8.1 lacks, shared by the kernels that
use it (foxcute.kernels.mamba2's fused forward's and fused backward's a|u and dW, curiosity's
row pass, gemm.KMajorWeightGrad), first checked on the H200 by the probe
tests/probes/wgmma_probe.py (a plain GEMM on this module, tested on its own).

- `cute.nvgpu.warpgroup` offers MmaF16BF16Op, MmaF8Op and MmaI8Op only. The MLIR atom under
  them (cute_nvgpu.MmaAtomSM90Type) takes TF32 operand types too and lowers them to
  `wgmma.mma_async.sync.aligned.m64nNk8.f32.tf32.tf32` (checked in the probe's PTX), so
  `MmaTF32Op` is the F16/BF16 op with the types and the instruction K changed: A and B
  TFloat32, a Float32 accumulator, K = 8 per instruction.
- Operand majors. wgmma transposes an operand it reads from shared memory (imm-trans-a/b)
  only for .f16/.bf16; for TF32 both shared-memory operands are K-major (the reduction
  dimension contiguous), read through descriptors (SS). A can come from registers instead
  (RS): each thread holds its fragment elements, loaded from wherever they are, so an
  MN-major A works there (gemm.KMajorWeightGrad's "rows" kind loads them from a row-major
  tile); B has no such way. A product whose operands are both MN-major in memory (a weight
  gradient of activations stored [batch, features]) therefore needs one of them written or
  restaged K-major (see gemm.KMajorWeightGrad).
- TF32 operands are float32 bit patterns of which the tensor core reads the top 19 bits: an
  unrounded value is truncated, so every element is rounded to nearest (cvt.rna) once, where
  it is staged in shared memory.
- Shared-memory layout (`k_major_sw128`): the K-major 128-byte-swizzle atom (8 rows of 32
  floats, the 16-byte chunks of row r XOR-permuted by r mod 8) tiled over [rows, cols], atoms
  down the rows first; it must start on a 1024-byte boundary. The swizzle moves whole 16-byte
  chunks, so 4 consecutive floats of a row stay contiguous: 128-bit stores still work.
- Ordering: shared-memory stores are generic-proxy writes and wgmma reads through the async
  proxy: every writing thread fences (fence.proxy.async.shared::cta, `publish`) before the
  barrier that precedes the MMAs; warpgroup.fence() before the first wgmma that touches the
  accumulator registers; commit_group / wait_group around the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _cute  # noqa: F401  (sets the target arch before cutlass is imported)

import cutlass.cute as cute  # noqa: E402
from cutlass import Boolean, Float32, TFloat32  # noqa: E402
from cutlass._mlir.dialects import cute_nvgpu as _cute_nvgpu_ir  # noqa: E402
from cutlass.cute.atom import make_atom  # noqa: E402
from cutlass.cute.core import _pack_shape  # noqa: E402
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup  # noqa: E402
from cutlass.cute.nvgpu.warpgroup.mma import MmaOp, MmaTraits  # noqa: E402

WARPGROUP = 128  # threads that issue one wgmma together
MMA_M = 64  # rows of one wgmma instruction
MMA_K = 8  # K of one tf32 wgmma instruction
ATOM_BYTES = 1024  # one swizzle atom: its alignment in shared memory


@dataclass(frozen=True)
class MmaTF32Op(MmaOp):
    """wgmma.mma_async m64nNk8 .f32.tf32.tf32, B K-major in shared memory; A K-major in shared
    memory too (SS), or in registers (RS: each thread's fragment elements, any source layout)."""

    def __init__(self, n: int, a_source: warpgroup.OperandSource = warpgroup.OperandSource.SMEM) -> None:
        super().__init__(TFloat32, TFloat32, Float32, (MMA_M, n, MMA_K), a_source,
                         OperandMajorMode.K, OperandMajorMode.K)

    def _make_trait(self, *, loc: Any = None, ip: Any = None, **kwargs: Any) -> MmaTraits:
        shape_mnk = _pack_shape(self.shape_mnk, loc=loc, ip=ip)
        ty = _cute_nvgpu_ir.MmaAtomSM90Type.get(
            shape_mnk.type.attribute, self.a_major_mode._to_ir(), self.b_major_mode._to_ir(),
            self.a_dtype.mlir_type, self.b_dtype.mlir_type, self.acc_dtype.mlir_type, self.a_src._to_ir())
        # The one runtime field, "accumulate" (scale-d), starts False as in MmaF16BF16Op.
        return MmaTraits(make_atom(ty, [Boolean(False).ir_value(loc=loc, ip=ip)], loc=loc, ip=ip))


def tiled_mma_tf32(n: int, a_in_registers: bool = False) -> cute.TiledMma:
    """One warpgroup's m64nNk8 TF32 MMA, accumulating (the caller zeroes the accumulators); A
    from registers if `a_in_registers` (RS), else from shared memory."""
    source = warpgroup.OperandSource.RMEM if a_in_registers else warpgroup.OperandSource.SMEM
    tiled = cute.make_tiled_mma(cute.make_mma_atom(MmaTF32Op(n, source)), (1, 1, 1))
    tiled.set(warpgroup.Field.ACCUMULATE, True)
    return tiled


def k_major_sw128(shape: tuple) -> cute.ComposedLayout:
    """The K-major 128B-swizzled float32 layout of `shape` = (rows, cols[, stages]), rows a
    multiple of 8 and cols of 32: atoms down the rows, then along K, then the stages."""
    atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, Float32)
    return cute.tile_to_shape(atom, shape, order=tuple(range(len(shape))))


def allocate_sw128(smem: Any, shape: tuple) -> cute.Tensor:
    """A shared-memory tensor of k_major_sw128(shape), on an atom boundary (the swizzle lives
    in the pointer, as wgmma's descriptors expect)."""
    layout = k_major_sw128(shape)
    return smem.allocate_tensor(Float32, layout.outer, ATOM_BYTES, layout.inner)


def sw128_view(ptr: cute.Pointer, shape: tuple) -> cute.Tensor:
    """k_major_sw128(shape) over shared memory that `ptr` (on an atom boundary) points into:
    a wgmma operand sharing its buffer with other uses of another layout."""
    layout = k_major_sw128(shape)
    return cute.make_tensor(cute.recast_ptr(ptr, layout.inner, dtype=Float32), layout.outer)


def sw128_bytes(rows: int, cols: int) -> int:
    """Shared memory that allocate_sw128((rows, cols)) takes, alignment slack included."""
    return 4 * rows * cols + ATOM_BYTES


def mma_group(tiled: cute.TiledMma, acc: cute.Tensor, a: cute.Tensor, b: cute.Tensor,
              a_at: tuple = (), b_at: tuple = ()) -> None:
    """acc += A @ B^T over one chunk as one wgmma group, issued and committed, not waited for:
    a, b are operand descriptors (MMA, 1, K steps, ...), the chunk's at the trailing
    coordinates a_at / b_at (e.g. its stage); one m64nNk8 per K step. warpgroup.fence()
    first orders the accumulator registers' earlier writes before the group."""
    warpgroup.fence()
    for k in range(cute.size(a, mode=[2])):
        cute.gemm(tiled, acc, a[(None, None, k, *a_at)], b[(None, None, k, *b_at)], acc)
    warpgroup.commit_group()


def publish() -> None:
    """Make this thread's shared-memory stores visible to wgmma (the async proxy); a barrier
    must follow before any warp's wgmma reads them."""
    cute.arch.fence_view_async_shared()
