"""Making a float32 a TF32 tensor-core operand: every kernel's rounding helpers, in one place.

A TF32 operand is a float32 bit pattern of which the tensor cores (mma.sync and wgmma alike)
read the top 19 bits (sign, exponent, 10 mantissa bits) and ignore the low 13: an unrounded
float32 is truncated, which doubles the error and biases every product toward zero. So every
operand is rounded to nearest first, ties away from zero (cvt.rna.tf32.f32's rounding), in one
of the ways below. They differ in what they take (a float32 value or its bits; any value or
finite ones only), what they give (a float32 or the Int32 bits an mma.sync fragment holds) and
who may read the result (any code, or only the tensor cores):

  helper                      takes            gives    exact TF32 (low bits 0)?  used by
  round_tf32                  Float32, any     Float32  yes: any reader          curiosity
  round_tf32_bits             Float32, any     Int32    yes (cvt.rna)            load_tf32, kan, risk_budget
  round_tf32_finite_bits      Int32 bits,      Int32    yes, for finite values   curiosity (split_tf32)
                              finite
  tf32_operand                Float32, any     Float32  no: tensor cores only    gemm.KMajorWeightGrad,
                                                                                  mamba2, the wgmma probe
  tf32_operand_bits_finite    Float32, finite  Int32    no: tensor cores only    kan's TF32 backward
  split_tf32                  Float32, finite  2 Int32  yes (hi and lo)          curiosity's 3xTF32

- round_tf32 / round_tf32_bits are cvt.rna itself: exact for every input, inf and NaN
  included. round_tf32_finite_bits computes the same bits with two integer instructions
  (half a TF32 ulp added to the magnitude bits, the low 13 bits cleared), valid for finite
  values only.
- tf32_operand / tf32_operand_bits_finite only add the half ulp and leave the low bits for the
  tensor cores to ignore: they multiply round_tf32's value, bit-identical products, one
  instruction cheaper, but the result is not a TF32 value for anything else to read.
  tf32_operand guards the add (inf and NaN pass unchanged); tf32_operand_bits_finite does not
  and takes only finite values (kan's features, finite by construction).
- split_tf32: x = hi + lo for three-pass TF32 (3xTF32, about float32 products).
- load_tf32 / load_bits fill an mma.sync fragment from shared memory: rounded there by
  cvt.rna (shared memory keeps the exact float32 values other code reads), or bit for bit for
  operands rounded when they were staged (round_tf32 or tf32_operand).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm

from ._cute import relu


@cute.jit
def as_float(bits: Int32) -> Float32:
    """The float32 whose bits are `bits`."""
    return Float32(llvm.bitcast(Float32.mlir_type, bits.ir_value()))


@cute.jit
def as_bits(x: Float32) -> Int32:
    """The bits of the float32 x."""
    return Int32(llvm.bitcast(Int32.mlir_type, x.ir_value()))


@cute.jit
def round_tf32(x: Float32) -> Float32:
    """x rounded to nearest TF32 (cvt.rna) and kept as float32 bits, for operands rounded once
    when staged into shared memory: the MMA reads the top 19 bits as they are (it would
    truncate an unrounded float32, biasing every product). A TF32 value any code may read;
    tf32_operand is cheaper where only the tensor cores read it."""
    return as_float(round_tf32_bits(x))


@cute.jit
def round_tf32_bits(x: Float32) -> Int32:
    """x rounded to nearest TF32 (cvt.rna) as the Int32 bits an mma.sync fragment register
    holds: round_tf32's value, for fragments filled from registers."""
    return Int32(cute.arch.cvt_f32_tf32(x))


@cute.jit
def round_tf32_finite_bits(bits: Int32) -> Int32:
    """The float32 `bits` rounded to nearest TF32, ties away from zero: half a TF32 ulp added
    to the magnitude bits, the low 13 bits cleared. cvt.rna's result for finite values, in
    two integer instructions."""
    return (bits + Int32(0x1000)) & Int32(-0x2000)


@cute.jit
def tf32_operand(x: Float32) -> Float32:
    """x as a TF32 operand to be staged in shared memory for the tensor cores: its float32
    bits plus half a TF32 ulp where x is finite. The tensor cores read the top 19 bits and
    ignore the low 13, so they multiply x rounded to nearest TF32, ties away from zero:
    round_tf32's value, bit-identical products. Two instructions (a compare of |x| and a
    predicated add) where round_tf32 is three (ptxas adds a mask clearing the low bits for
    a cvt.rna result that goes to memory; feeding an MMA straight from registers it is
    these two already). Inf and NaN pass unchanged: an unguarded add would carry the
    canonical NaN 0x7fffffff into the sign bit. The low bits are not cleared, so nothing
    but an MMA may read the result."""
    return Float32(llvm.inline_asm(
        Float32.mlir_type, [x.ir_value()],
        # |x| < inf as a float compare: one FSETP (testp.finite became a mask and an ISETP)
        "{\n.reg .pred finite;\n.reg .f32 mag;\n.reg .b32 bits;\nabs.f32 mag, $1;\n"
        "setp.lt.f32 finite, mag, 0f7F800000;\nmov.b32 bits, $1;\n@finite add.s32 bits, bits, 4096;\n"
        "mov.b32 $0, bits;\n}", "=f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@cute.jit
def tf32_operand_bits_finite(x: Float32) -> Int32:
    """A finite x rounded to nearest TF32 (ties away from zero) as the MMA reads it (its top
    19 bits): its bits plus half a TF32 ulp. ptxas lowers cvt.rna.tf32.f32 feeding an MMA to
    this same add, behind a finiteness test and select (3 instructions, here 1); the caller
    guarantees x finite (kan's features are, by construction)."""
    return as_bits(x) + Int32(0x1000)


@cute.jit
def split_tf32(x: Float32) -> tuple:
    """x = hi + lo for 3xTF32, as MMA operand bits: hi = x rounded to nearest TF32, lo = x - hi
    (exact) rounded to nearest TF32, i.e. bit for bit hi = cvt.rna(x), lo = cvt.rna(x - hi)
    (for finite x), the split of curiosity's earlier row pass, whose z products in the same
    order these are. lo is rounded rather than left to the MMA, which would truncate it: an error twice
    as large, small next to the float32 accumulation's (a NumPy emulation at the defaults gives
    the same rms error of z either way), but z decides the relu mask, and keeping it bit-equal
    to the previous kernel's keeps every mask decision it made. Four instructions
    (ptxas drops lo's mask: the TF32 MMA ignores the low 13 bits) where two cvt.rna and the
    subtraction take seven. x not finite: lo is NaN or inf, the products NaN (as with cvt.rna)."""
    hi = round_tf32_finite_bits(as_bits(x))
    lo = x - as_float(hi)
    return hi, round_tf32_finite_bits(as_bits(lo))


@cute.jit
def load_tf32(dst: cute.Tensor, src: cute.Tensor, apply_relu: cutlass.Constexpr = False):
    """Fragment load with round-to-nearest TF32 conversion (the MMA would truncate)."""
    for i in cutlass.range_constexpr(cute.size(dst)):
        if cutlass.const_expr(apply_relu):
            dst[i] = round_tf32_bits(relu(src[i]))
        else:
            dst[i] = round_tf32_bits(src[i])


@cute.jit
def load_bits(dst: cute.Tensor, src: cute.Tensor):
    """Fragment load of operands already rounded by round_tf32 or tf32_operand, bit for bit."""
    for i in cutlass.range_constexpr(cute.size(dst)):
        dst[i] = as_bits(src[i])
