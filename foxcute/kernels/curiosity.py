"""Curiosity forward model (docs/layers.md section 5), forward + backward on the GPU.

    z = s @ W1s^T + W1a[:, a] + b1   (W1 = [W1s | W1a]: the one-hot product is a column gather)
    hid = relu(z), pred = hid @ W2^T + b2, diff = pred - s_next
    r = sum_f diff^2 / (2F), loss = mean r, dpred = diff / (F B)
    dh = dpred @ W2, dz = dh * (z > 0), ds = dz @ W1s
    dW2 = dpred^T hid, db2 = sum dpred, dW1 = [dz^T s | scatter-add of dz by action], db1 = sum dz

Work at the defaults (B=8192, F=256, A=3, H=128): six [B x 256 x 128]-sized products, 3.2 GFLOP,
so tensor cores are needed (TF32 wgmma or mma.sync; FFMA in fp32 mode). Compulsory traffic: s,
s_next read and ds written, 3 x 8 MB = 25 MB, a 6 us floor at 4.25 TB/s.

Where the split is, and why (four launches and one small copy).
- `WeightPrep` first writes the weights the way the row pass streams them (4 x H x F floats,
  0.5 MB at the defaults): W1s = W1[:, :F] contiguous (W1's rows of F + A floats are not
  whole float4s: it would stream by 4-byte copies, each with its own address and bounds
  arithmetic), and W2, W2^T and W1s^T, rounded to TF32 in TF32 mode, so that every weight
  chunk of the row pass is a block of k-contiguous rows, read as MMA operands with no
  conversion; TF32 adds W1s's hi / lo parts (z's B operands on wgmma) and row norms. That is
  done once per call instead of by every CTA at every fragment load.
- The row pass (one kernel) does everything that is row-local, for a block of `bm` rows per
  CTA (64 at the defaults: 128 CTAs of 8 warps): z, hid, pred, diff, r, dpred, dh, dz and ds,
  with z (then dz, in place) and dpred resident in shared memory between the four products;
  only the weights and s stream through cp.async stages (each loop's first chunks are issued
  before the previous loop's epilogue). `RowPass` holds what its two paths share; TF32 at
  64-row blocks runs on wgmma (`RowPassWgmma`), everything else on mma.sync or FFMA
  (`RowPassMmaSync`); `row_pass_for` picks one. It writes ds, r, and hid, dpred, dz for the
  weight gradients, and the CTA's partial column sums of dpred and dz (db2, db1), of dz per
  action (W1's action columns: the scatter-add of the one-hot is a per-action column sum) and
  of r / B (the loss).
- The weight gradients dW2 = dpred^T hid and dW1[:, :F] = dz^T s reduce over the batch: a
  [F x H] partial per CTA is 128 KB of accumulators, more than a CTA can hold next to the
  row pass's tiles, so they cannot be accumulated there. They run as one launch for both
  (per-CTA partial tiles, each tile's summed in a fixed order, a slice by each of its CTAs), reading
  operands written just before (mostly still in the 50 MB L2). TF32: `gemm.KMajorWeightGrad`
  on wgmma, whose shared-memory operands must be K-major, so the row pass writes hid, dpred
  and dz transposed ([n, Kp], the batch contiguous, Kp = num_ctas * bm with zeros past B) as
  TF32 values, from its accumulators (8 lanes store a column's 8 consecutive rows, a whole
  32-byte sector): dW2 = dpred^T hid from two K-major operands, dW1 = dz^T s with s, an
  input, read as it is into the A registers (gemm's "rows" kind). fp32: `gemm.WeightGrad`
  (FFMA) from row-major hid, dpred, dz and s. Recomputing hid/dpred/dz there instead would
  redo the forward products.
- TF32: z's relu mask is the float64 one (RowPass.exact_sign_epilogue): the few z entries
  whose 3xTF32 value is within its error bound of 0 are summed again in float64 (WeightPrep
  adds W1s's row norms to the workspace for the bound).
- The row pass's partials (F + H(A+1) + 1 columns per CTA) are summed by column_sum, on a
  side lane (a second stream; a parallel branch in a CUDA graph) beside the weight
  gradients, which read none of them.
- Every batch reduction is per-CTA partials added in a fixed order: bit-identical from run
  to run, no float atomics.

Current (H200 run 20261203T162501Z, papermill_runs/20261203T162501Z_nvidia-h200_726b8c4c/summary.md;
TF32 at the defaults, graph-replayed): the layer 52.1 us, against its 20 us target. Step
breakdown (step_breakdown.csv): the row pass (RowPassWgmma, named curiosity.RowPass.kernel_wgmma
there) 30.2 us, KMajorWeightGrad 13.2 us, column_sum 4.3 us, WeightPrep 3.2 us. At batch 1 the
layer takes 41.7 us: each row-pass CTA runs the same chain (four products, their epilogues and
barriers) as the single CTA of batch 1, so most of the time is that chain's latency, not the
batch's work.

History: docs/notes/curiosity.md
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32, Int64
from cutlass._mlir.dialects import llvm, nvvm
from cutlass.cutlass_dsl import T
from cutlass.cute.nvgpu import warpgroup

from .. import _arrays
from .._layer import PRECISIONS, KernelContract
from . import _cute, _wgmma
from ._cute import relu
from ._mma import (CHUNK, MODE, PAD, STAGES, Operand, issue_chunk, mma_chunks, rows_view, staging_by_rows, start_chunks,
                   warp_mma)
from ._tf32 import as_float, round_tf32, split_tf32
from .gemm import kmajor_weight_grads_into, weight_grads_into

MIN_WIDTH, MAX_WIDTH, WIDTH_MULTIPLE = 32, 512, 32  # F and H: whole CHUNKs of the reductions
MAX_ACTIONS = 16
ROW_PASS_THREADS = 256
MAX_N_TILE = 128  # output columns per pass over the reduction (32 accumulators per thread)
SMEM_BUDGET = 220 * 1024  # of the 227 KB a Hopper CTA may use
COLSUM_WIDTH = 4096  # column_sum's widest input
STAGE_W = MAX_N_TILE * (CHUNK + PAD)  # floats per weight stage: a [n, CHUNK] row block
Z_ERROR_PER_B1 = 2.0**-23  # tau's b1 term (see z_error_per_norm)
ROW_BLOCK_WGMMA = _wgmma.MMA_M  # rows of a CTA on wgmma: one m64 tile, both warpgroups on all of them
COLSUM_ROWS = 16  # rows of the row pass's shared-memory column sums loaded at once (bm: 32 or 64)
EXACT_Z_LOADS = 64  # floats a lane loads for one group of z candidates summed in float64 at once


def z_error_per_norm(f: int) -> float:
    """tau(r, c) / (||s_r|| ||w_c||), tau = z_error_per_norm(F) ||s_r|| ||w_c|| + Z_ERROR_PER_B1 |b1_c|:
    twice a bound on |z_tf32 - z| for the TF32 row pass's z (w_c = W1s[c, :]). Its terms, with
    S = sum_k |s_rk w_ck| <= ||s_r|| ||w_c|| (Cauchy-Schwarz), u = 2^-24:
    - 3xTF32 split (hi = rna(x), |x - hi| <= 2^-11 |x|, lo = rna(x - hi) within 2^-22 |x|):
      s w - (hi hi' + hi lo' + lo hi') = hi (l' - lo') + (l - lo) hi' + l l' (l = x - hi):
      <= 3.001 * 2^-22 |s w| a product, 12.01 u S in all;
    - accumulation: 3F/8 MMAs (three per 8-wide k step), each rounding its sum to float32; the
      tensor cores truncate, and may drop bits of the smaller terms when they align them:
      taken as 2 ulp of the running |sum| <= S each, (3F/8) 4u S = 1.5 F u S;
    - + b1 in float32: u (|acc| + |b1|) <= u S + u |b1|; the last addition (+ W1a) rounds to
      nearest, which keeps the sign, so it cannot flip one.
    A z whose sign differs from the exact one has |z| <= |z - z_exact| <= (1.5 F + 13) u S +
    u |b1|; the factor 2 covers tau's own float32 arithmetic with room. At the defaults tau /
    (||s_r|| ||w_c||) = 4.7e-5: ~5e-4 of random N(0, 1) z entries fall under it (~5 a CTA of
    64 x 128), where a CPU emulation of the kernel's z (truncating MMAs) gives errors of at
    most ~1/50 of tau (rms ~1/300)."""
    return 2 * (1.5 * f + 13) * 2.0**-24


def exact_z_group(f: int) -> int:
    """z candidates a warp sums in float64 at once, their loads in flight together: up to 4,
    as many as keep a lane's loads (2 F / 32 a candidate) within EXACT_Z_LOADS registers."""
    return max(1, min(4, EXACT_Z_LOADS // (2 * f // 32)))


def element_bit(i: int) -> int:
    """Bit i of an Int32 mask (bit 31 is the sign bit)."""
    return 1 << i if i < 31 else -(1 << 31)


def n_tile(n: int, warps_n: int) -> int:
    """The widest tile <= MAX_N_TILE that divides n into whole MMA column blocks."""
    step = 8 * warps_n
    return max(d for d in range(step, MAX_N_TILE + 1, step) if n % d == 0)


def row_block(f: int, h: int) -> int:
    """Rows per CTA: 64 unless the resident z/dz and dpred tiles would not fit in shared
    memory, then 32."""
    return 64 if RowPassMmaSync.smem_floats(64, f, h) * 4 <= SMEM_BUDGET else 32


def wgmma_tile(n: int, widest: int) -> int:
    """The widest column tile <= `widest` that divides n and splits into two warpgroup halves
    of whole 8-column wgmma blocks (n is a multiple of 32, so 32 always does)."""
    return max(d for d in range(16, widest + 1, 16) if n % d == 0)


def uses_wgmma(f: int, h: int, precision: str) -> bool:
    """Whether the TF32 row pass runs on wgmma (RowPassWgmma): at 64-row blocks where
    its shared memory fits (F + H <= ~400: the defaults and smaller); mma.sync otherwise."""
    return precision == "tf32" and row_block(f, h) == ROW_BLOCK_WGMMA and WgmmaPlan(f, h).smem_bytes <= SMEM_BUDGET


def partials_width(f: int, h: int, num_actions: int) -> int:
    """Columns of the row pass's per-CTA partials: db2 [F] | db1 [H] | dW1a [H, A] | loss."""
    return f + h * (num_actions + 1) + 1


def partial_index(col, cta, num_ctas, width):
    """Where partial column `col` (of `width`) of CTA `cta` lives: chunk c = col // 4096 is a
    contiguous [num_ctas, width_c] array at c * num_ctas * 4096 (width_c = 4096 but the last)."""
    c = col // COLSUM_WIDTH
    chunk_width = cutlass.min(COLSUM_WIDTH, width - c * COLSUM_WIDTH)
    return c * (num_ctas * COLSUM_WIDTH) + cta * chunk_width + (col - c * COLSUM_WIDTH)


def prep_arrays(precision: str) -> int:
    """[H, F]-sized operands WeightPrep writes (WeightPrep); TF32 adds W1s's hi / lo parts."""
    return 6 if precision == "tf32" else 4


def norms_offset(f: int, h: int) -> int:
    """Where in WeightPrep's array the TF32 W1s row norms (H floats) start: after its operands."""
    return prep_arrays("tf32") * f * h


class WeightPrep:
    """The row pass's weights, as it streams them, into one array of prep_arrays(precision)
    [H, F]-sized operands: W1s = W1[:, :F] ([H, F], contiguous: float4 rows), W2 ([F, H]),
    W2^T ([H, F]) and W1s^T ([F, H]), the last three rounded to TF32 in TF32 mode (they are
    only ever MMA operands); in TF32 mode then W1s's 3xTF32 parts hi = rna(W1s) and
    lo = rna(W1s - hi) ([H, F] each: z's B operands on wgmma, which reads B from shared memory
    only, so it cannot split a staged W1s in registers as mma.sync does) and the norms
    ||W1s[c, :]||_2 (H floats: the row pass's bound on z's error). Thread e = (i, j) of the
    [H, F] index space handles W1[i, j] and W2[j, i]: half of the accesses are H floats apart,
    128 KB at the defaults, absorbed by L2."""

    threads = 256

    def __init__(self, f: int, h: int, num_actions: int, precision: str):
        self.f, self.h, self.w1_cols = f, h, f + num_actions
        self.rounded = precision == "tf32"
        self.arrays = prep_arrays(precision)

    @cute.jit
    def __call__(self, w1_ptr: cute.Pointer, w2_ptr: cute.Pointer, prep_ptr: cute.Pointer, stream: cuda.CUstream):
        f, h = self.f, self.h
        mW1 = cute.make_tensor(w1_ptr, cute.make_layout((h, self.w1_cols), stride=(self.w1_cols, 1)))
        mW2 = cute.make_tensor(w2_ptr, cute.make_layout((f, h), stride=(h, 1)))
        mPrep = cute.make_tensor(prep_ptr, cute.make_layout((self.arrays, h * f), stride=(h * f, 1)))
        self.kernel(mW1, mW2, mPrep).launch(grid=[(h * f + self.threads - 1) // self.threads, 1, 1],
                                            block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mW1: cute.Tensor, mW2: cute.Tensor, mPrep: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        f, h = self.f, self.h
        e = cta * self.threads + tid
        if e < h * f:
            i = e // f
            j = e - i * f
            w1 = mW1[i, j]
            w2 = mW2[j, i]
            if cutlass.const_expr(self.rounded):
                w2 = round_tf32(w2)
            mPrep[0, e] = w1
            mPrep[1, j * h + i] = w2
            mPrep[2, e] = w2
            mPrep[3, j * h + i] = round_tf32(w1) if cutlass.const_expr(self.rounded) else w1
            if cutlass.const_expr(self.rounded):
                hi, lo = split_tf32(w1)
                mPrep[4, e] = as_float(hi)
                mPrep[5, e] = as_float(lo)
        if cutlass.const_expr(self.rounded):
            # ||W1s[c, :]||_2 -> the H floats after the six operands (tau's column factor in
            # the row pass): warp c of the grid, its lanes' strided sums of squares added in a
            # fixed butterfly (H * 32 <= H * F threads).
            lane = tid % 32
            c = e // 32
            if c < h:
                sq = Float32(0.0)
                for m in cutlass.range_constexpr(f // 32):
                    x = mW1[c, lane + 32 * m]
                    sq = sq + x * x
                for offset in (16, 8, 4, 2, 1):
                    sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=offset)
                if lane == 0:
                    mNorms = cute.make_tensor(mPrep.iterator + norms_offset(f, h), cute.make_layout(h))
                    mNorms[c] = cute.math.sqrt(sq)


class RowPass:
    """Everything row-local for `bm` rows a CTA (module docstring): what the row pass's two
    paths share. A subclass per path holds its kernel and what only that kernel uses:
    `RowPassMmaSync` (mma.sync TF32 or FFMA fp32, every supported size) and `RowPassWgmma`
    (TF32 wgmma, 64-row blocks); `row_pass_for` picks one (uses_wgmma).

    Both kernels run the same four products over their rows, a column tile at a time, each in
    a chunk loop over 32-wide k chunks followed by an epilogue between barriers:
    - z = s @ W1s^T + b1 + W1a[:, a] -> sZ (TF32: hid = relu(z) rounded; fp32: z), hid -> global;
    - pred = hid @ W2^T + b2 -> diff, r (the row sums through sRowPart), dpred -> sDp, global;
      then the db2 column sums (dpred_column_sums);
    - dh = dpred @ W2 -> dz = dh * (z > 0) -> sZ (in place), global; then the db1, per-action
      and loss sums (dz_column_sums);
    - ds = dz @ W1s -> global.
    Here: the configuration, the host side (__call__: the arrays' views and the launch of the
    subclass's `kernel`, whose W1s operands `w1s_operands` gives), z's exact signs
    (exact_sign_epilogue, exact_z, z_unsure), the activation stores and the column sums.

    Invariants: results bit-identical from run to run (every sum in a fixed order, no atomics);
    TF32 z's relu mask is the float64 reference's wherever float32 can tell z from 0; rows past
    the batch have action -1 and contribute nothing to r, the gradients or the partial sums.
    Limits: F and H multiples of 32 in [32, 512], 1 <= A <= MAX_ACTIONS (check_sizes); one CTA
    an SM (its shared memory).
    """

    def __init__(self, f: int, h: int, num_actions: int, precision: str, action_dtype: type):
        self.f, self.h, self.num_actions = f, h, num_actions
        # z decides the relu mask of the backward pass; the float64 reference's mask differs
        # wherever z is computed less exactly than |z|, and each flip moves dz (and ds, dW1)
        # by a whole dh element. TF32 z flips ~1e-4 of the mask: ds rel. err ~9e-3, over the
        # 2e-3 budget; 3xTF32 z (~float32 exact) still flips ~1 entry in 1e6, and one flip
        # at the defaults is ~2.5e-3 of ds.
        # In fp32 mode even one flip (~1.4e-3) breaks the 1e-5 budget, so z is summed in
        # float64 there (products of float32 values are exact in float64). In TF32 mode that
        # would be 8192 DFMA a thread (32 entries x 256 terms: ~17 us an SM at Hopper's 64
        # DFMA/clk, conversions not counted), about half the row pass again; instead
        # (exact_signs) only the entries whose 3xTF32 |z| is under the bound tau on its error
        # (z_error_per_norm), the only ones whose sign can be wrong, ~5e-4 of them at the
        # defaults, are summed again in float64 from exact products, each by its warp.
        self.exact_signs = precision == "tf32"
        # TF32: the weight gradients run on wgmma (gemm.KMajorWeightGrad), whose B operand is
        # K-major: hid, dpred and dz are written transposed ([n, Kp], the batch contiguous,
        # padded to the grid's Kp = num_ctas * bm rows with zeros), as the TF32 values the
        # row pass holds; s, the other operand of dW1, is read from registers there as it is.
        self.k_major = precision == "tf32"
        self.action_dtype = action_dtype
        self.precision = precision
        self.bm = row_block(f, h)
        # 8 warps: two per scheduler, so one's shared-memory and MMA latencies hide behind the
        # other's work (one CTA of up to ~200 KB per SM).
        self.threads = ROW_PASS_THREADS
        self.partial_width = partials_width(f, h, num_actions)

    @cute.jit
    def exact_z(self, mS: cute.Tensor, mW1sv: cute.Tensor, mW1: cute.Tensor, mB1: cute.Tensor,
                acts: list, rows: list, cols: list, lane: Int32) -> list:
        """z[rows[j], cols[j]] (action acts[j]) for each j, summed in float64 from exact products
        (float32 x float32 fits in a float64), as the fp32 mode's ffma64 z: called by a whole
        warp with the same arguments, lane l taking k = l + 32 m (coalesced loads of s's row
        and W1s's), its terms summed in k order, the lanes' sums in a fixed butterfly. Every
        lane gets the same bits (each butterfly addition is the same two operands, swapped).
        The entries' loads are independent: one memory round trip for all of them."""
        # All loads first, no branch among them (W1's action column read at action 0 for a row
        # with none, and not added): ptxas does not hoist a load above a branch.
        s_vals, w_vals, b1_vals, w1a_vals = [], [], [], []
        for j in cutlass.range_constexpr(len(rows)):
            for m in cutlass.range_constexpr(self.f // 32):
                k4 = lane // 4 + 8 * m
                s_vals.append(mS[rows[j], k4, lane % 4])
                w_vals.append(mW1sv[cols[j], k4, lane % 4])
            b1_vals.append(mB1[cols[j]])
            w1a_vals.append(mW1[cols[j], self.f + cutlass.max(acts[j], Int32(0))])
        out = []
        for j in cutlass.range_constexpr(len(rows)):
            acc = Float64(0.0)
            for m in cutlass.range_constexpr(self.f // 32):
                acc = acc + Float64(s_vals[j * (self.f // 32) + m]) * Float64(w_vals[j * (self.f // 32) + m])
            for offset in (16, 8, 4, 2, 1):
                acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=offset)
            acc = acc + Float64(b1_vals[j])
            with_action = acc + Float64(w1a_vals[j])
            out.append(with_action if acts[j] >= 0 else acc)
        return out

    @cute.jit
    def exact_sign_epilogue(self, mS: cute.Tensor, mW1sv: cute.Tensor, mW1: cute.Tensor, mB1: cute.Tensor,
                            sActs: cute.Tensor, sZ: cute.Tensor, cC1: cute.Tensor, acc1: cute.Tensor,
                            b1_frag: cute.Tensor, w1a_frag: cute.Tensor, hid_frag: cute.Tensor,
                            row_norm: cute.Tensor, col_tau: cute.Tensor, row0: Int32, col0: Int32,
                            batch: Int32, lane: Int32):
        """TF32 phase 1 epilogue: z = acc1 + b1 + W1a[:, a] in float32 (3xTF32 products), but
        each z with |z| <= tau (the bound on its error, z_error_per_norm) is replaced by its
        float64 sum (exact_z), rounded to float32 (which keeps the sign): the relu mask is
        then the float64 reference's wherever float32 can tell z from 0. hid_frag <- relu(z),
        sZ <- hid rounded to TF32 (pred's A operand, rounded once here rather than at each of
        the warps_n warps' fragment loads; hid > 0 exactly where z > 0: TF32 has float32's
        exponents, only a z below 2^-137 rounds to 0; so it is dz's mask too).
        Candidates are rare (~5e-4 of the entries, ~0.6 a warp, up to ~4 in the worst of the
        1024 warps at the defaults) and each costs a memory round trip, which the slowest
        warp of the one-wave grid pays in series: so they are summed in groups of
        exact_z_group(F) (4 at F <= 256), their loads in flight together. Each lane keeps a
        mask of its candidates; per round every lane with one left offers its lowest, and the
        warp sums the offered ones in groups, in lane order. Entries not recomputed keep their bits."""
        num_mi = cute.size(acc1, mode=[1])
        assert cute.size(acc1) <= 32  # one mask bit per element: bm * bn1 <= 32 * threads
        need = Int32(0)  # bit i: element i is a candidate
        for i in cutlass.range_constexpr(cute.size(acc1)):
            r = cC1[i][0]
            z_wide = acc1[i] + b1_frag[i]
            if sActs[r] >= 0:
                z_wide = z_wide + w1a_frag[i]
            hid_frag[i] = z_wide
            unsure = self.z_unsure(hid_frag, b1_frag, row_norm, col_tau, i, num_mi, row0 + r < batch)
            need = need | (Int32(unsure) << i)
        while cute.arch.vote_any_sync(need != 0):
            mine = need & (Int32(0) - need)  # this lane's lowest candidate (0: none)
            need = need ^ mine
            row = Int32(0)
            col = Int32(0)
            for i in cutlass.range_constexpr(cute.size(acc1)):
                if mine == Int32(element_bit(i)):
                    row = cC1[i][0]
                    col = col0 + cC1[i][1]
            act = sActs[row]
            z_mine = Float64(0.0)
            lanes = cute.arch.vote_ballot_sync(mine != 0)
            while lanes != 0:
                srcs = []
                for j in cutlass.range_constexpr(exact_z_group(self.f)):
                    # The lowest lane left; past the last, the group's last again (summed twice,
                    # the same bits: every slot is a real candidate).
                    src = Int32(31) - Int32(cute.arch.clz(lanes & (Int32(0) - lanes)))
                    if cutlass.const_expr(j > 0):
                        if lanes == 0:
                            src = srcs[j - 1]
                    lanes = lanes & (lanes - Int32(1))
                    srcs.append(src)
                zs = self.exact_z(mS, mW1sv, mW1, mB1, [cute.arch.shuffle_sync(act, x) for x in srcs],
                                  [row0 + cute.arch.shuffle_sync(row, x) for x in srcs],
                                  [cute.arch.shuffle_sync(col, x) for x in srcs], lane)
                for j in cutlass.range_constexpr(exact_z_group(self.f)):
                    if lane == srcs[j]:
                        z_mine = zs[j]
            for i in cutlass.range_constexpr(cute.size(acc1)):
                if mine == Int32(element_bit(i)):
                    hid_frag[i] = Float32(z_mine)
        for i in cutlass.range_constexpr(cute.size(acc1)):
            hid_frag[i] = relu(hid_frag[i])
            sZ[cC1[i][0], col0 + cC1[i][1]] = round_tf32(hid_frag[i])

    @cute.jit
    def store_activations(self, mOut: cute.Tensor, frag: cute.Tensor, cC: cute.Tensor, col0: Int32, row0: Int32,
                          batch: Int32, zero_past_batch: cutlass.Constexpr[bool]):
        """An epilogue's global stores (hid, dpred, dz), in a loop of their own so that a
        lane's two adjacent columns go out as one 64-bit store (row-major): frag's element i
        is row row0 + cC[i][0], column col0 + cC[i][1]. Row-major: the rows of the batch.
        K-major (TF32: [n, Kp], the weight gradients' operand): every row of the block, as
        its TF32 value, zero past the batch (`zero_past_batch` where frag is not zero there
        already); a lane's 8-row groups are 32-byte runs."""
        for i in cutlass.range_constexpr(cute.size(frag)):
            r = cC[i][0]
            if cutlass.const_expr(self.k_major):
                if cutlass.const_expr(zero_past_batch):
                    mOut[col0 + cC[i][1], row0 + r] = cutlass.select_(
                        row0 + r < batch, round_tf32(frag[i]), Float32(0.0))
                else:
                    mOut[col0 + cC[i][1], row0 + r] = round_tf32(frag[i])
            elif row0 + r < batch:
                mOut[row0 + r, col0 + cC[i][1]] = frag[i]

    @cute.jit
    def dpred_column_sums(self, sDp: cute.Tensor, mPart: cute.Tensor, cta: Int32, num_ctas: Int32, tid: Int32):
        """The CTA's partial column sums of dpred (db2), each in row order, from the exact
        values; in TF32 each is then left rounded in place: dh's A operand, rounded once
        rather than at each fragment load. COLSUM_ROWS rows are loaded before any of their
        rounded values is stored: ptxas keeps a shared load after a shared store it cannot
        tell apart, so a load-add-store loop waits one shared round trip a row."""
        bm, f = self.bm, self.f
        pw = self.partial_width
        col_vals = cute.make_rmem_tensor(COLSUM_ROWS, Float32)
        for col in cutlass.range(tid, f, self.threads, unroll=1):
            acc = Float32(0.0)
            for r0 in cutlass.range(0, bm, COLSUM_ROWS, unroll=1):
                for k in cutlass.range_constexpr(COLSUM_ROWS):
                    col_vals[k] = sDp[r0 + k, col]
                for k in cutlass.range_constexpr(COLSUM_ROWS):
                    acc = acc + col_vals[k]
                if cutlass.const_expr(self.precision == "tf32"):
                    for k in cutlass.range_constexpr(COLSUM_ROWS):
                        sDp[r0 + k, col] = round_tf32(col_vals[k])
            mPart[partial_index(col, cta, num_ctas, pw)] = acc

    @cute.jit
    def dz_column_sums(self, sZ: cute.Tensor, sActs: cute.Tensor, sRowPart: cute.Tensor, mPart: cute.Tensor,
                       cta: Int32, num_ctas: Int32, batch: Int32, tid: Int32):
        """The CTA's partial column sums of dz (db1) and its per-action parts (W1's action
        columns) in one pass over the rows (1 + A independent sums, each in row order), not
        1 + A dependent passes; TF32: dz is then left rounded in place, ds's A operand (as
        dpred). Then the CTA's part of the loss, sum r / B over its rows (sRowPart[0])."""
        bm, f, h, na = self.bm, self.f, self.h, self.num_actions
        pw = self.partial_width
        col_vals = cute.make_rmem_tensor(COLSUM_ROWS, Float32)
        acc_act = cute.make_rmem_tensor(na, Float32)
        block_acts = cute.make_rmem_tensor(COLSUM_ROWS, Int32)
        for col in cutlass.range(tid, h, self.threads, unroll=1):
            acc = Float32(0.0)
            acc_act.fill(0.0)
            for r0 in cutlass.range(0, bm, COLSUM_ROWS, unroll=1):
                for k in cutlass.range_constexpr(COLSUM_ROWS):
                    col_vals[k] = sZ[r0 + k, col]
                    block_acts[k] = sActs[r0 + k]
                for k in cutlass.range_constexpr(COLSUM_ROWS):
                    dz = col_vals[k]
                    acc = acc + dz
                    for j in cutlass.range_constexpr(na):
                        acc_act[j] = acc_act[j] + (dz if block_acts[k] == j else Float32(0.0))
                if cutlass.const_expr(self.precision == "tf32"):
                    for k in cutlass.range_constexpr(COLSUM_ROWS):
                        sZ[r0 + k, col] = round_tf32(col_vals[k])
            mPart[partial_index(f + col, cta, num_ctas, pw)] = acc
            for j in cutlass.range_constexpr(na):
                mPart[partial_index(f + h + col * na + j, cta, num_ctas, pw)] = acc_act[j]
        if tid == 0:
            loss = Float32(0.0)
            for r in cutlass.range(bm, unroll=8):
                loss = loss + sRowPart[0, r]
            mPart[partial_index(pw - 1, cta, num_ctas, pw)] = loss / Float32(batch)

    @cute.jit
    def z_unsure(self, z_frag: cute.Tensor, b1_frag: cute.Tensor, row_norm: cute.Tensor, col_tau: cute.Tensor,
                 i: cutlass.Constexpr, num_mi: cutlass.Constexpr, valid: cutlass.Boolean) -> cutlass.Boolean:
        """|z| <= tau for accumulator element i = ((v0, v1), mi, ni) (column 2 t + v0 of block
        ni, row g + 8 v1 of block mi), in a row of the batch."""
        v0, v1, mi, ni = i % 2, i // 2 % 2, i // 4 % num_mi, i // (4 * num_mi)
        tau = row_norm[v1, mi] * col_tau[v0, ni] + Float32(Z_ERROR_PER_B1) * abs(b1_frag[i])
        return valid & (abs(z_frag[i]) <= tau)

    @cute.jit
    def __call__(self, s_ptr: cute.Pointer, a_ptr: cute.Pointer, s_next_ptr: cute.Pointer,
                 w1_ptr: cute.Pointer, prep_ptr: cute.Pointer, b1_ptr: cute.Pointer, b2_ptr: cute.Pointer,
                 r_ptr: cute.Pointer, ds_ptr: cute.Pointer, hid_ptr: cute.Pointer, dpred_ptr: cute.Pointer,
                 dz_ptr: cute.Pointer, part_ptr: cute.Pointer, batch: Int32, num_ctas: Int32,
                 inv_fb: Float32, stream: cuda.CUstream):
        """The arrays as the kernels read them (TF32: hid, dpred, dz K-major), then the
        subclass's kernel over num_ctas CTAs of `threads`."""
        f, h, w1_cols = self.f, self.h, self.f + self.num_actions
        mS = cute.make_tensor(s_ptr, cute.make_layout((batch, f // 4, 4), stride=(f, 4, 1)))
        mAct = cute.make_tensor(a_ptr, cute.make_layout(batch))
        mSn = cute.make_tensor(s_next_ptr, cute.make_layout((batch, f), stride=(f, 1)))
        # WeightPrep's [.., .. / 4, 4] operands W2, W2^T, W1s^T (W1s's: w1s_operands).
        mW2v = cute.make_tensor(prep_ptr + f * h, cute.make_layout((f, h // 4, 4), stride=(h, 4, 1)))
        mW2tv = cute.make_tensor(prep_ptr + 2 * f * h, cute.make_layout((h, f // 4, 4), stride=(f, 4, 1)))
        mW1stv = cute.make_tensor(prep_ptr + 3 * f * h, cute.make_layout((f, h // 4, 4), stride=(h, 4, 1)))
        mW1 = cute.make_tensor(w1_ptr, cute.make_layout((h, w1_cols), stride=(w1_cols, 1)))
        mB1 = cute.make_tensor(b1_ptr, cute.make_layout(h))
        mB2 = cute.make_tensor(b2_ptr, cute.make_layout(f))
        mR = cute.make_tensor(r_ptr, cute.make_layout(batch))
        mDs = cute.make_tensor(ds_ptr, cute.make_layout((batch, f), stride=(f, 1)))
        if cutlass.const_expr(self.k_major):
            # hid^T, dpred^T, dz^T: [n, Kp], Kp = num_ctas * bm
            kp = cute.assume(num_ctas * self.bm, divby=self.bm)
            mHid = cute.make_tensor(hid_ptr, cute.make_layout((h, kp), stride=(kp, 1)))
            mDp = cute.make_tensor(dpred_ptr, cute.make_layout((f, kp), stride=(kp, 1)))
            mDz = cute.make_tensor(dz_ptr, cute.make_layout((h, kp), stride=(kp, 1)))
        else:
            mHid = cute.make_tensor(hid_ptr, cute.make_layout((batch, h), stride=(h, 1)))
            mDp = cute.make_tensor(dpred_ptr, cute.make_layout((batch, f), stride=(f, 1)))
            mDz = cute.make_tensor(dz_ptr, cute.make_layout((batch, h), stride=(h, 1)))
        mPart = cute.make_tensor(part_ptr, cute.make_layout(num_ctas * self.partial_width))
        # One CTA per SM (its shared memory allows no second at the widest sizes): ptxas may
        # then use over 128 registers (255), where it would spill to fit two CTAs.
        self.kernel(mS, mAct, mSn, *self.w1s_operands(prep_ptr), mW1, mB1, mW2v, mW2tv, mW1stv, mB2, mR, mDs,
                    mHid, mDp, mDz, mPart, batch, num_ctas, inv_fb).launch(
            grid=[num_ctas, 1, 1], block=[self.threads, 1, 1], stream=stream, min_blocks_per_mp=1)


# ---------------------------------------------------------------------------------------------
# The mma.sync / FFMA path

@cute.jit
def set_operand(frag: cute.Tensor, frag_lo: cute.Tensor, index, bits: Int32, split: cutlass.Constexpr):
    """Fragment element `index` <- the float32 `bits`: split (3xTF32) or as they are."""
    if cutlass.const_expr(split):
        hi, lo = split_tf32(as_float(bits))
        frag[index] = hi
        frag_lo[index] = lo
    else:
        frag[index] = bits


@cute.jit
def load_matrices(s: cute.Tensor, row: Int32, col: Int32) -> list:
    """ldmatrix.x4 of four 8 x 4 float32 blocks of s (viewed as 8 x 8 b16 matrices): lane l
    gives row `row`, columns col..col+3 of block l // 8 (16 bytes, 16-byte aligned); lane
    (g, t) = (lane // 4, lane % 4) receives element (g, t) of each block, one register a
    block. That is the mma.sync m16n8k8 TF32 fragment order (CUTLASS's SM75_U32x4_LDSM_N):
    one instruction where four 32-bit shared loads would do."""
    ptr = s.iterator + cute.crd2idx((row, col), s.layout)
    regs = nvvm.ldmatrix(ptr.llvm_ptr, 4, nvvm.MMALayout.row, results=[llvm.StructType.get_literal([T.i32()] * 4)])
    return [Int32(llvm.extractvalue(T.i32(), regs, [j])) for j in range(4)]


@cute.jit
def matrix_tile_mma(tiled_mma: cute.TiledMma, tid: Int32, split: cutlass.Constexpr, sA: cute.Tensor,
                    sB: cute.Tensor, acc: cute.Tensor, row_sq=None):
    """acc += sA @ sB^T over one CHUNK of k (sA [bm, CHUNK], sB [bn, CHUNK], both k-contiguous)
    by TF32 mma.sync in tiled_mma's accumulator layout, the fragments loaded with ldmatrix: per
    8-wide k step one instruction for a 16-row A fragment and one for two 8-row B fragments
    (row strides of 4 (mod 32) words keep each 8-row block on distinct banks). The operands
    are TF32 already (rounded where they were written), or, with `split`, float32 values
    split here (3xTF32: x = hi + lo, three MMAs hi*hi + hi*lo + lo*hi, about float32 products).
    row_sq, if given ([2, num_mi] per thread): += the squares of the thread's A values, by the
    fragment's row half and mi (A element (v0, v1) is row +8 v0, k +4 v1, the rows of the
    accumulator elements ((., v0), mi, .)); summed over the 4 lanes of a row, the rows' squared
    norms, from the values already in registers."""
    thr = tiled_mma.get_slice(tid)
    lane = tid % 32
    rows_a = cute.size(sA, mode=[0])
    rows_b = cute.size(sB, mode=[0])
    cA = thr.partition_A(cute.make_identity_tensor((rows_a, CHUNK)))
    cB = thr.partition_B(cute.make_identity_tensor((rows_b, CHUNK)))
    rA = tiled_mma.make_fragment_A(thr.partition_A(sA)[None, None, 0])
    rB = tiled_mma.make_fragment_B(thr.partition_B(sB)[None, None, 0])
    rA_lo = tiled_mma.make_fragment_A(thr.partition_A(sA)[None, None, 0])
    rB_lo = tiled_mma.make_fragment_B(thr.partition_B(sB)[None, None, 0])
    num_mi = cute.size(rA, mode=[1])
    num_ni = cute.size(rB, mode=[1])
    g = lane // 4
    # The row and column a lane addresses in ldmatrix: row l % 8 of block l // 8.
    block = lane // 8
    in_block = lane % 8
    for ks in cutlass.range_constexpr(CHUNK // 8):
        # A blocks (rows +0 / +8, k +0 / +4) = fragment elements (v0, v1) = (block % 2, block // 2).
        for mi in cutlass.range_constexpr(num_mi):
            row = cA[(0, 0), mi, 0][0] - g + in_block + 8 * (block % 2)
            regs = load_matrices(sA, row, 8 * ks + 4 * (block // 2))
            for j in cutlass.range_constexpr(4):
                set_operand(rA, rA_lo, ((j % 2, j // 2), mi), regs[j], split)
                if cutlass.const_expr(row_sq is not None):
                    x = as_float(regs[j])
                    row_sq[j % 2, mi] = row_sq[j % 2, mi] + x * x
        # B blocks (k +0 / +4 of column block ni, then of ni + 1) = elements (v, ni + block // 2).
        for np in cutlass.range_constexpr((num_ni + 1) // 2):
            ni_hi = min(2 * np + 1, num_ni - 1)  # an odd last block: loaded twice, used once
            n_lo = cB[0, 2 * np, 0][0] - g
            n_hi = cB[0, ni_hi, 0][0] - g
            n = (n_lo if block < 2 else n_hi) + in_block
            regs = load_matrices(sB, n, 8 * ks + 4 * (block % 2))
            for j in cutlass.range_constexpr(4):
                if cutlass.const_expr(j < 2 or 2 * np + 1 < num_ni):
                    set_operand(rB, rB_lo, (j % 2, 2 * np + j // 2), regs[j], split)
        if cutlass.const_expr(split):
            cute.gemm(tiled_mma, acc, rA_lo, rB, acc)  # small terms first
            cute.gemm(tiled_mma, acc, rA, rB_lo, acc)
        cute.gemm(tiled_mma, acc, rA, rB, acc)


class RowPassMmaSync(RowPass):
    """The row pass on mma.sync (TF32, z split 3xTF32 in registers) or FFMA (fp32, z summed in
    float64): fp32 at every supported size, TF32 wherever RowPassWgmma does not run (32-row
    blocks, or its shared memory would not fit: F + H over ~400).

    `bm` rows a CTA (64, or 32 where the resident tiles would not fit: row_block), 8 warps as
    2 x 4, column tiles of up to MAX_N_TILE (n_tile): 32 x 32 warp tiles at bm = 64, n = 128.
    Four products in chunk loops (gemm.mma_chunks: a barrier per 32-wide k chunk, STAGES-deep
    cp.async staging of s rows and of one weight chunk, two chunks in flight), each loop's
    first chunks issued before the epilogue of the loop before it (products, start_next). TF32
    fragments by ldmatrix (matrix_tile_mma) from operands rounded where they were written; z's
    A and B values are split in registers as they are loaded. Shared memory (smem_floats): the
    stages and the resident z/dz and dpred tiles, rows padded to 4 (mod 32) banks for
    conflict-free fragment loads; ~185 KB at the defaults.

    Latency-bound (the MMAs' dependent chains, ldmatrix -> MMA round trips, a barrier a
    chunk); at mma.sync's TF32 rate its tensor work alone takes ~13 us at the defaults. Not
    timed in the current run, whose defaults run RowPassWgmma; the last run of the TF32
    defaults on it took 38.8 us (run 20261202T013119Z, step breakdown).
    History: docs/notes/curiosity.md
    """

    def __init__(self, f: int, h: int, num_actions: int, precision: str, action_dtype: type):
        super().__init__(f, h, num_actions, precision, action_dtype)
        self.mode = MODE[precision]
        self.mode_z = "ffma64" if precision == "fp32" else self.mode  # tile_mma's, fp32 only
        self.z_dtype = Float64 if precision == "fp32" else Float32
        # 2 x 4 warps: a warp's tile is (bm/2) x (n/4), 32 x 32 at bm = 64, n = 128: per MMA it
        # reads 256 B of fragments from shared memory (16 x 64 tiles would read 320 B), and
        # shared-memory bandwidth, not the tensor cores, bounds these products.
        self.warps_m = 2
        self.warps_n = self.threads // 32 // self.warps_m

    @staticmethod
    def smem_floats(bm: int, f: int, h: int) -> int:
        return STAGES * (bm * (CHUNK + PAD) + STAGE_W) + bm * (h + PAD) + bm * (f + PAD) + 2 * bm + 4 * bm

    def w1s_operands(self, prep_ptr: cute.Pointer) -> tuple:
        """W1s as the kernel streams it: WeightPrep's first operand, [H, F / 4, 4]."""
        f, h = self.f, self.h
        return (cute.make_tensor(prep_ptr, cute.make_layout((h, f // 4, 4), stride=(f, 4, 1))),)

    def products(self, mS: cute.Tensor, mW1sv: cute.Tensor, mW2v: cute.Tensor, mW2tv: cute.Tensor,
                 mW1stv: cute.Tensor, batch: Int32, row0: Int32, sS3: cute.Tensor, sS: cute.Tensor,
                 sWraw: cute.Tensor) -> list:
        """The streamed operands of every chunk loop, in the order the row pass runs them:
        [(A (None: resident), B, chunks)] for z's column tiles (s, W1s), then pred's (W2),
        dh's (W2^T) and ds's (W1s^T). Each loop's first chunks are issued (start_chunks) as
        soon as the loop before it has finished with the staging buffers, before that loop's
        epilogue: their latency (an L2 round trip) hides behind the epilogue instead of
        stalling the start of the next loop."""
        f, h, t = self.f, self.h, self.threads
        out = []
        for n, k, mW in ((h, f, mW1sv), (f, h, mW2v), (h, f, mW2tv), (f, h, mW1stv)):
            bn = n_tile(n, self.warps_n)
            stage3, view = rows_view(sWraw, bn, 4, STAGE_W)
            for nt in range(n // bn):
                a = Operand(mS, batch, row0, 0, f // 4, self.bm, CHUNK // 4, 4, False, sS3, sS,
                            threads=t) if mW is mW1sv else None
                out.append((a, Operand(mW, n, nt * bn, 0, k // 4, bn, CHUNK // 4, 4, False, stage3, view,
                                       threads=t), k // CHUNK))
        return out

    @staticmethod
    def start_next(tid: Int32, products: list, p: int) -> None:
        """Issue the first chunks of chunk loop p + 1 (none after the last)."""
        if p + 1 < len(products):
            a, b, chunks = products[p + 1]
            start_chunks(tid, chunks, a, b)

    def multiply(self, tiled_mma: cute.TiledMma, tid: Int32, split: bool = False, row_sq=None):
        """mma_chunks' chunk product: TF32 by matrix_tile_mma; fp32 by gemm.tile_mma (None)."""
        if self.precision == "tf32":
            return functools.partial(matrix_tile_mma, tiled_mma, tid, split, row_sq=row_sq)
        return None

    @cute.kernel
    def kernel(self, mS: cute.Tensor, mAct: cute.Tensor, mSn: cute.Tensor, mW1sv: cute.Tensor,
               mW1: cute.Tensor, mB1: cute.Tensor, mW2v: cute.Tensor, mW2tv: cute.Tensor,
               mW1stv: cute.Tensor, mB2: cute.Tensor,
               mR: cute.Tensor, mDs: cute.Tensor, mHid: cute.Tensor, mDp: cute.Tensor,
               mDz: cute.Tensor, mPart: cute.Tensor, batch: Int32, num_ctas: Int32, inv_fb: Float32):
        """The four products and their epilogues (RowPass) for the CTA's `bm` rows, on mma.sync
        or FFMA (the class docstring says how)."""
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        bm, f, h = self.bm, self.f, self.h
        row0 = cta * bm
        smem = cutlass.memory.SmemAllocator()
        # STAGES-deep staging for the streamed chunks: rows of s, and one weight chunk (an
        # [n, CHUNK] block of W1s, W2, W2^T or W1s^T from WeightPrep), views of one buffer.
        sS3, sS = staging_by_rows(smem, bm, 4)
        sWraw = smem.allocate_tensor(Float32, cute.make_layout(STAGES * STAGE_W), 16)
        # Resident activations: z (TF32: hid, rounded), then dz in place, and dpred. Row
        # strides = 4 (mod 32) banks: conflict-free A-fragment reads (8-row ldmatrix blocks too).
        sZ = smem.allocate_tensor(Float32, cute.make_layout((bm, h), stride=(h + PAD, 1)), 16)
        sDp = smem.allocate_tensor(Float32, cute.make_layout((bm, f), stride=(f + PAD, 1)), 16)
        sActs = smem.allocate_tensor(Int32, cute.make_layout(bm), 16)
        sRowPart = smem.allocate_tensor(Float32, cute.make_layout((4, bm), stride=(bm, 1)), 16)

        if tid < bm:
            sActs[tid] = Int32(-1)  # padding rows past the batch: no action, no gradient
            if row0 + tid < batch:
                sActs[tid] = Int32(mAct[row0 + tid])

        tiled_mma = warp_mma(self.warps_m, self.warps_n)
        thr = tiled_mma.get_slice(tid)
        products = self.products(mS, mW1sv, mW2v, mW2tv, mW1stv, batch, row0, sS3, sS, sWraw)

        # ---- Phase 1: z = s @ W1s^T + b1 + W1a[:, a] -> sZ; hid = relu(z) -> global.
        bn1 = n_tile(h, self.warps_n)
        cC1 = thr.partition_C(cute.make_identity_tensor((bm, bn1)))
        acc1 = cute.make_rmem_tensor(tiled_mma.partition_shape_C((bm, bn1)), self.z_dtype)
        # The epilogues' global operands are all loaded before the first store: the compiler
        # keeps global loads after possibly aliasing global stores, so loads interleaved with
        # the hid / dpred stores would each wait their own round trip. b1, W1's action columns
        # (gathered by the rows' actions, read from global: sActs is not visible before the
        # products' first barrier) and tau's column factors are loaded before the products:
        # their latency (two round trips for the gather) hides behind them.
        b1_frag = cute.make_rmem_tensor(cute.size(acc1), Float32)
        w1a_frag = cute.make_rmem_tensor(cute.size(acc1), Float32)
        hid_frag = cute.make_rmem_tensor(cute.size(acc1), Float32)
        if cutlass.const_expr(self.exact_signs):
            # tau's factors: the norms of the thread's accumulator rows (its A rows: from
            # phase 1's first column tile's fragments) and of its columns' W1s rows (WeightPrep).
            row_norm = cute.make_rmem_tensor((2, cute.size(acc1, mode=[1])), Float32)
            row_norm.fill(0.0)
            col_tau = cute.make_rmem_tensor((2, cute.size(acc1, mode=[2])), Float32)
            mNorms = cute.make_tensor(mW1sv.iterator + norms_offset(f, h), cute.make_layout(h))
        # The actions of the thread's accumulator rows (v1, mi); -1 past the batch.
        row_acts = cute.make_rmem_tensor((2, cute.size(acc1, mode=[1])), Int32)
        for mi in cutlass.range_constexpr(cute.size(acc1, mode=[1])):
            for v1 in cutlass.range_constexpr(2):
                row_acts[v1, mi] = Int32(-1)
                if row0 + cC1[(0, v1), mi, 0][0] < batch:
                    row_acts[v1, mi] = Int32(mAct[row0 + cC1[(0, v1), mi, 0][0]])
        for nt in cutlass.range_constexpr(h // bn1):
            for i in cutlass.range_constexpr(cute.size(acc1)):
                b1_frag[i] = mB1[nt * bn1 + cC1[i][1]]
            for i in cutlass.range_constexpr(cute.size(acc1)):
                # element i = ((v0, v1), mi, ni): row (v1, mi) = (i // 2 % 2, i // 4 % num_mi)
                act = row_acts[i // 2 % 2, i // 4 % cute.size(acc1, mode=[1])]
                w1a_frag[i] = Float32(0.0)
                if act >= 0:
                    w1a_frag[i] = mW1[nt * bn1 + cC1[i][1], f + act]
            if cutlass.const_expr(self.exact_signs):
                for ni in cutlass.range_constexpr(cute.size(col_tau, mode=[1])):
                    for v0 in cutlass.range_constexpr(2):
                        col_tau[v0, ni] = Float32(z_error_per_norm(f)) * mNorms[nt * bn1 + cC1[(v0, 0), 0, ni][1]]
            acc1.fill(0.0)
            row_sq = row_norm if cutlass.const_expr(self.exact_signs and nt == 0) else None
            z_s, z_w, chunks = products[nt]
            mma_chunks(tiled_mma, tid, acc1, self.mode_z, chunks, z_s, z_w,
                       multiply=self.multiply(tiled_mma, tid, split=True, row_sq=row_sq), started=nt > 0)
            self.start_next(tid, products, nt)
            if cutlass.const_expr(row_sq is not None):
                for i in cutlass.range_constexpr(cute.size(row_norm)):
                    sq = row_norm[i]
                    sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=1)
                    sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=2)
                    row_norm[i] = cute.math.sqrt(sq)
            if cutlass.const_expr(self.exact_signs):
                self.exact_sign_epilogue(mS, mW1sv, mW1, mB1, sActs, sZ, cC1, acc1, b1_frag, w1a_frag,
                                         hid_frag, row_norm, col_tau, row0, nt * bn1, batch, tid % 32)
            else:
                for i in cutlass.range_constexpr(cute.size(acc1)):
                    r = cC1[i][0]
                    col = nt * bn1 + cC1[i][1]
                    act = sActs[r]
                    z_wide = acc1[i] + self.z_dtype(b1_frag[i])
                    if act >= 0:
                        z_wide = z_wide + self.z_dtype(w1a_frag[i])
                    z = Float32(z_wide)  # rounding keeps the sign: the mask is the exact one
                    hid_frag[i] = relu(z)
                    sZ[r, col] = z
            # K-major: hid as rounded into sZ; past the batch z = b1 + ..., so hid is zeroed there
            self.store_activations(mHid, hid_frag, cC1, nt * bn1, row0, batch, zero_past_batch=True)

        # ---- Phase 2: pred = relu(z) @ W2^T + b2; diff, r, dpred -> sDp and global.
        bn2 = n_tile(f, self.warps_n)
        p2 = h // bn1  # index of pred's first chunk loop in `products`
        cC2 = thr.partition_C(cute.make_identity_tensor((bm, bn2)))
        acc2 = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((bm, bn2)))
        num_mi = cute.size(acc2, mode=[1])
        row_sq = cute.make_rmem_tensor((2, num_mi), Float32)
        row_sq.fill(0.0)
        num_ni = cute.size(acc2, mode=[2])
        # s_next and b2 of a tile are loaded before its products: their latency (a DRAM round
        # trip for s_next) hides behind the MMAs.
        s_next_frag = cute.make_rmem_tensor(tiled_mma.partition_shape_C((bm, bn2)), Float32)
        b2_frag = cute.make_rmem_tensor((2, num_ni), Float32)
        for nt in cutlass.range_constexpr(f // bn2):
            for ni in cutlass.range_constexpr(num_ni):
                for v0 in cutlass.range_constexpr(2):
                    b2_frag[v0, ni] = mB2[nt * bn2 + cC2[(v0, 0), 0, ni][1]]
            for mi in cutlass.range_constexpr(num_mi):
                for v1 in cutlass.range_constexpr(2):
                    r = cC2[(0, v1), mi, 0][0]
                    for ni in cutlass.range_constexpr(num_ni):
                        for v0 in cutlass.range_constexpr(2):
                            s_next_frag[(v0, v1), mi, ni] = Float32(0.0)
                            if row0 + r < batch:
                                s_next_frag[(v0, v1), mi, ni] = mSn[row0 + r, nt * bn2 + cC2[(v0, v1), mi, ni][1]]
            acc2.fill(0.0)
            _, w2, chunks = products[p2 + nt]
            mma_chunks(tiled_mma, tid, acc2, self.mode, chunks, None, w2,
                       a_resident=sZ, a_relu=True, multiply=self.multiply(tiled_mma, tid), started=True)
            self.start_next(tid, products, p2 + nt)
            for mi in cutlass.range_constexpr(num_mi):
                for v1 in cutlass.range_constexpr(2):
                    r = cC2[(0, v1), mi, 0][0]
                    for ni in cutlass.range_constexpr(num_ni):
                        for v0 in cutlass.range_constexpr(2):
                            col = nt * bn2 + cC2[(v0, v1), mi, ni][1]
                            diff = Float32(0.0)
                            if row0 + r < batch:
                                diff = acc2[(v0, v1), mi, ni] + b2_frag[v0, ni] - s_next_frag[(v0, v1), mi, ni]
                            row_sq[v1, mi] = row_sq[v1, mi] + diff * diff
                            dp = diff * inv_fb
                            sDp[r, col] = dp
                            acc2[(v0, v1), mi, ni] = dp
            self.store_activations(mDp, acc2, cC2, nt * bn2, row0, batch, zero_past_batch=False)  # diff = 0 there
        # r: the 4 lanes sharing a row add their column pairs (butterfly, fixed order), then
        # the warps_n warps sharing a row add theirs through shared memory in warp order.
        warp_n = cC2[0][1] // 8
        for mi in cutlass.range_constexpr(num_mi):
            for v1 in cutlass.range_constexpr(2):
                sq = row_sq[v1, mi]
                sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=1)
                sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=2)
                if tid % 4 == 0:
                    sRowPart[warp_n, cC2[(0, v1), mi, 0][0]] = sq
        cute.arch.sync_threads()
        if tid < bm:
            sq = sRowPart[0, tid]
            for w in cutlass.range_constexpr(1, self.warps_n):
                sq = sq + sRowPart[w, tid]
            r_row = sq / Float32(2 * f)
            sRowPart[0, tid] = r_row
            if row0 + tid < batch:
                mR[row0 + tid] = r_row

        # ---- Partial column sums of dpred (db2); mma_chunks' first barrier orders the rounded
        # values before dh's fragment loads.
        self.dpred_column_sums(sDp, mPart, cta, num_ctas, tid)

        # ---- Phase 3: dh = dpred @ W2; dz = dh * (z > 0) -> sZ (in place) and global.
        bn3 = n_tile(h, self.warps_n)
        p3 = p2 + f // bn2
        cC3 = thr.partition_C(cute.make_identity_tensor((bm, bn3)))
        acc3 = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((bm, bn3)))
        for nt in cutlass.range_constexpr(h // bn3):
            acc3.fill(0.0)
            _, w2t, chunks = products[p3 + nt]
            mma_chunks(tiled_mma, tid, acc3, self.mode, chunks, None, w2t,
                       a_resident=sDp, multiply=self.multiply(tiled_mma, tid), started=True)
            self.start_next(tid, products, p3 + nt)
            for i in cutlass.range_constexpr(cute.size(acc3)):
                r = cC3[i][0]
                col = nt * bn3 + cC3[i][1]
                dz = acc3[i] if sZ[r, col] > Float32(0.0) else Float32(0.0)
                sZ[r, col] = dz
                acc3[i] = dz
            self.store_activations(mDz, acc3, cC3, nt * bn3, row0, batch, zero_past_batch=False)  # dpred = 0 there
        cute.arch.sync_threads()

        # ---- Partial column sums of dz (db1, W1's action columns) and the loss.
        self.dz_column_sums(sZ, sActs, sRowPart, mPart, cta, num_ctas, batch, tid)

        # ---- Phase 4: ds = dz @ W1s -> global.
        bn4 = n_tile(f, self.warps_n)
        p4 = p3 + h // bn3
        cC4 = thr.partition_C(cute.make_identity_tensor((bm, bn4)))
        acc4 = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((bm, bn4)))
        for nt in cutlass.range_constexpr(f // bn4):
            acc4.fill(0.0)
            _, w1st, chunks = products[p4 + nt]
            mma_chunks(tiled_mma, tid, acc4, self.mode, chunks, None, w1st,
                       a_resident=sZ, multiply=self.multiply(tiled_mma, tid), started=True)
            self.start_next(tid, products, p4 + nt)
            for i in cutlass.range_constexpr(cute.size(acc4)):
                r = cC4[i][0]
                if row0 + r < batch:
                    mDs[row0 + r, nt * bn4 + cC4[i][1]] = acc4[i]


# ---------------------------------------------------------------------------------------------
# The wgmma path

class WgmmaPlan:
    """Column tiles and shared memory of the wgmma row pass (RowPassWgmma) at (F, H):
    z in tiles of up to Z_TILE columns (64 a warpgroup: the exact-sign epilogue's one mask bit
    an accumulator element), pred, dh and ds in tiles of up to PRODUCT_TILE (64 a warpgroup,
    32 accumulators a thread). One raw buffer serves z's staging (s chunks padded row-major
    for the A fragment loads, W1s hi / lo chunks 128B-swizzled) and then the other products'
    weight staging and the resident dpred beside it; z (then dz) is resident in its own buffer.
    Offsets are in floats, on swizzle-atom (1 KB) boundaries."""

    Z_TILE = 128
    PRODUCT_TILE = 128  # 64 columns a warpgroup: 32 accumulators a thread
    Z_STAGES = 3  # of an s chunk and the W1s hi / lo chunks (41 KB at the defaults)
    PRODUCT_STAGES = 6  # of a weight chunk (16 KB): five in flight

    def __init__(self, f: int, h: int):
        atom = _wgmma.ATOM_BYTES // 4
        def up(x): return -(-x // atom) * atom
        self.z_tile = wgmma_tile(h, self.Z_TILE)
        self.pred_tile = wgmma_tile(f, self.PRODUCT_TILE)  # pred's columns (F)
        self.h_tile = wgmma_tile(h, self.PRODUCT_TILE)  # dh's (H)
        self.f_tile = wgmma_tile(f, self.PRODUCT_TILE)  # ds's (F)
        self.s_stage = ROW_BLOCK_WGMMA * (CHUNK + PAD)
        self.hi = up(self.Z_STAGES * self.s_stage)
        self.lo = self.hi + self.Z_STAGES * self.z_tile * CHUNK
        z_staging = self.lo + self.Z_STAGES * self.z_tile * CHUNK
        self.dp = up(self.PRODUCT_STAGES * max(self.pred_tile, self.h_tile, self.f_tile) * CHUNK)
        self.raw_floats = max(z_staging, self.dp + ROW_BLOCK_WGMMA * f)
        small = 2 * ROW_BLOCK_WGMMA + 4 * ROW_BLOCK_WGMMA + 2 * h  # sActs, sRowPart, sB1, sTau
        self.smem_bytes = 4 * (self.raw_floats + ROW_BLOCK_WGMMA * h + small) + 2 * _wgmma.ATOM_BYTES


class ChunkLoop(NamedTuple):
    """One chunk loop of the wgmma row pass (RowPassWgmma.wgmma_loops): s's Operand (z's loops) or
    None, [(weights, their staging)], the first weight row, weight rows a chunk, chunks,
    stages, and the wgmma groups left in flight at each chunk's barrier."""

    s_op: Any
    weights: list
    n0: int
    rows: int
    chunks: int
    stages: int
    in_flight: int

    @property
    def lead(self) -> int:
        """Chunks in flight by cp.async ahead of the one multiplied: the stages less the one
        multiplied and the groups left in flight in the tensor cores."""
        return self.stages - 1 - self.in_flight


class RowPassWgmma(RowPass):
    """The row pass on TF32 wgmma, at 64-row blocks (ROW_BLOCK_WGMMA: one m64 tile) where
    WgmmaPlan's shared memory fits (uses_wgmma: F + H up to ~400, the defaults included).

    Warpgroup wg takes columns [wg n / 2, (wg + 1) n / 2) of each column tile of n over all 64
    rows. z: A = s from registers (RS: each thread's fragment of the staged s chunk, split into
    TF32 hi / lo there), B = W1s's hi / lo parts from WeightPrep (wgmma reads B from shared
    memory only), three wgmmas a k step; pred, dh, ds: A = the resident hid, dpred, dz in shared
    memory (K-major, 128B-swizzled), B = the staged weight chunks. Chunk loops (ChunkLoop,
    run_wgmma_loop) run at run time, not unrolled, over WgmmaPlan.Z_STAGES / PRODUCT_STAGES
    cp.async stages; the resident-A products keep one wgmma group in flight across each chunk's
    barrier, z waits for its group every chunk (its A fragment is rebuilt every chunk). The
    epilogues and column sums are RowPass's, on wgmma's accumulator layout (element
    i = v0 + 2 v1 + 4 ni: column 2 t + v0 of 8-column block ni, row g + 8 v1 of the warp's 16).
    One CTA an SM, ~197 KB of shared memory at the defaults.

    Current: 30.2 us at the defaults (H200 run 20261203T162501Z, step breakdown, named
    curiosity.RowPass.kernel_wgmma there). History: docs/notes/curiosity.md
    """

    def __init__(self, f: int, h: int, num_actions: int, precision: str, action_dtype: type):
        super().__init__(f, h, num_actions, precision, action_dtype)
        self.plan = WgmmaPlan(f, h)

    def w1s_operands(self, prep_ptr: cute.Pointer) -> tuple:
        """W1s as the kernel reads it: WeightPrep's first operand (the exact-sign recompute's)
        and its TF32 hi / lo parts (z's B operands), each [H, F / 4, 4]."""
        f, h = self.f, self.h
        layout = cute.make_layout((h, f // 4, 4), stride=(f, 4, 1))
        return (cute.make_tensor(prep_ptr, layout), cute.make_tensor(prep_ptr + 4 * f * h, layout),
                cute.make_tensor(prep_ptr + 5 * f * h, layout))

    @cute.jit
    def stage_weights(self, mW: cute.Tensor, n0: Int32, kc: Int32, sW: cute.Tensor, stage: Int32,
                      rows: cutlass.Constexpr[int], tid: Int32):
        """Rows n0 .. n0 + rows of the prepared weight mW ([n, k / 4, 4]), k chunk kc, into
        `stage` of sW ((rows / 2, CHUNK, 2, stages), 128B-swizzled): row r to warpgroup
        r // (rows / 2)'s half, sW[r % (rows / 2), :, r // (rows / 2), stage], by 16-byte
        cp.async (L2 only: every CTA reads the same weights)."""
        atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL),
                                   Float32, num_bits_per_copy=128)
        half = rows // 2
        vecs = CHUNK // 4
        total = rows * vecs
        for j in cutlass.range_constexpr((total + self.threads - 1) // self.threads):
            idx = tid + j * self.threads
            if cutlass.const_expr(total % self.threads == 0) or idx < total:
                r = idx // vecs
                q = idx % vecs
                dst = cute.local_tile(sW[r % half, None, r // half, stage], (4,), (q,))
                cute.copy(atom, mW[n0 + r, kc * vecs + q, None], dst)

    @cute.jit
    def issue_wgmma_chunk(self, loop: ChunkLoop, kc: Int32, tid: Int32):
        """Chunk kc of a wgmma chunk loop into stage kc % stages, committed as one cp.async
        group; nothing past the loop's end (an empty group)."""
        stage = kc % loop.stages
        if kc < loop.chunks:
            if cutlass.const_expr(loop.s_op is not None):
                s_op = loop.s_op
                issue_chunk(*s_op.tensors[:2], *s_op.ints, *s_op.static, kc, stage, tid)
            for mW, sW in loop.weights:
                self.stage_weights(mW, loop.n0, kc, sW, stage, loop.rows, tid)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def start_wgmma_loop(self, loops: list, p: int, tid: Int32):
        """The first `lead` chunks of chunk loop p (none past the last loop): issued once the
        loop before has finished with the staging buffers, before its epilogue."""
        if cutlass.const_expr(p < len(loops)):
            for kc in cutlass.range_constexpr(loops[p].lead):
                self.issue_wgmma_chunk(loops[p], Int32(kc), tid)

    @cute.jit
    def run_wgmma_loop(self, loops: list, p: int, tid: Int32, acc: cute.Tensor, mma_chunk):
        """Chunk loop p into the zeroed accumulators acc: per chunk, wait for it, publish it
        to the tensor cores, one barrier (every thread's copies of chunk kc are in; every
        warpgroup has waited for all but its last `in_flight` wgmma groups, so the stage of
        chunk kc - 1 - in_flight can be refilled, with chunk kc + lead), issue that refill,
        then `mma_chunk(kc, stage)` issues chunk kc's group and this warpgroup waits until
        `in_flight` groups are left. With one left (the resident-A products) the tensor
        cores have the next group before the last one ends, for one stage less of loads in
        flight; z's A is a register fragment rebuilt every chunk, so its loop waits for
        each group (in_flight 0). A loop at run time, not unrolled: unrolled, the four
        products' loops made the kernel ~110 KB of code, stalled on instruction fetch. Ends
        with a barrier (the stages are free) and the first chunks of loop p + 1, so that they
        fly during this loop's epilogue."""
        acc.fill(0.0)
        loop = loops[p]
        for kc in cutlass.range(loop.chunks, unroll=1):
            cute.arch.cp_async_wait_group(loop.lead - 1)
            _wgmma.publish()
            cute.arch.barrier()
            self.issue_wgmma_chunk(loop, kc + loop.lead, tid)
            mma_chunk(kc, kc % loop.stages)
            warpgroup.wait_group(loop.in_flight)
        if cutlass.const_expr(loop.in_flight > 0):
            warpgroup.wait_group(0)
        cute.arch.barrier()
        self.start_wgmma_loop(loops, p + 1, tid)

    def wgmma_loops(self, mS: cute.Tensor, mW1hv: cute.Tensor, mW1lv: cute.Tensor, mW2v: cute.Tensor,
                    mW2tv: cute.Tensor, mW1stv: cute.Tensor, batch: Int32, row0: Int32, sS3: cute.Tensor,
                    sWhi: cute.Tensor, sWlo: cute.Tensor, sWp: cute.Tensor, sWh: cute.Tensor,
                    sWf: cute.Tensor) -> list:
        """The ChunkLoops in the order they run: z's column tiles (s; W1s hi, lo), then
        pred's (W2), dh's (W2^T) and ds's (W1s^T)."""
        plan, f, h = self.plan, self.f, self.h
        s_op = Operand(mS, batch, row0, 0, f // 4, ROW_BLOCK_WGMMA, CHUNK // 4, 4, False, sS3, None,
                       threads=self.threads)
        zs, ps = plan.Z_STAGES, plan.PRODUCT_STAGES
        loops = [ChunkLoop(s_op, [(mW1hv, sWhi), (mW1lv, sWlo)], nt * plan.z_tile, plan.z_tile, f // CHUNK, zs, 0)
                 for nt in range(h // plan.z_tile)]
        loops += [ChunkLoop(None, [(mW2v, sWp)], nt * plan.pred_tile, plan.pred_tile, h // CHUNK, ps, 1)
                  for nt in range(f // plan.pred_tile)]
        loops += [ChunkLoop(None, [(mW2tv, sWh)], nt * plan.h_tile, plan.h_tile, f // CHUNK, ps, 1)
                  for nt in range(h // plan.h_tile)]
        loops += [ChunkLoop(None, [(mW1stv, sWf)], nt * plan.f_tile, plan.f_tile, h // CHUNK, ps, 1)
                  for nt in range(f // plan.f_tile)]
        return loops

    @cute.jit
    def resident_chunk_mma(self, tiled: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
                           kc: Int32, stage: Int32):
        """acc += the resident A's k chunk kc times the staged B chunk (tCrB: this warpgroup's
        half of the stages) in `stage`, one wgmma group (CHUNK / 8 instructions), committed."""
        warpgroup.fence()
        for ks in cutlass.range_constexpr(CHUNK // _wgmma.MMA_K):
            cute.gemm(tiled, acc, tCrA[None, None, kc * (CHUNK // _wgmma.MMA_K) + ks],
                      tCrB[None, None, ks, stage], acc)
        warpgroup.commit_group()

    @cute.jit
    def z_chunk_mma(self, tiled: cute.TiledMma, acc: cute.Tensor, tCsS: cute.Tensor, rA: cute.Tensor,
                    rA_lo: cute.Tensor, tBhi: cute.Tensor, tBlo: cute.Tensor, stage: Int32,
                    row_sq: cute.Tensor):
        """z's chunk: the thread's A fragment of the staged s chunk, split into TF32 hi / lo in
        registers (RS: A is read from them), then per 8-wide k step the wgmmas lo*hi, hi*lo,
        hi*hi (small terms first), one group, committed. row_sq, if given ([2, 1]): += the
        squares of the thread's s values by fragment row half (element j: row +8 (j % 2),
        k +4 (j // 2), as mma.sync's): tau's row norms, from values already in registers."""
        frag = tCsS[None, None, None, stage]
        for e in cutlass.range_constexpr(cute.size(rA)):
            x = frag[e]
            hi, lo = split_tf32(x)
            rA[e] = as_float(hi)
            rA_lo[e] = as_float(lo)
            if cutlass.const_expr(row_sq is not None):
                row_sq[e % 2, 0] = row_sq[e % 2, 0] + x * x
        warpgroup.fence()
        for ks in cutlass.range_constexpr(CHUNK // _wgmma.MMA_K):
            cute.gemm(tiled, acc, rA_lo[None, None, ks], tBhi[None, None, ks, stage], acc)
            cute.gemm(tiled, acc, rA[None, None, ks], tBlo[None, None, ks, stage], acc)
            cute.gemm(tiled, acc, rA[None, None, ks], tBhi[None, None, ks, stage], acc)
        warpgroup.commit_group()

    @cute.jit
    def row_pair(self, mX: cute.Tensor, row: Int32, col: Int32) -> cute.Tensor:
        """Elements (row, col), (row, col + 1) of the row-major [B, F] array mX, col even, as a
        tensor of 2 on an 8-byte boundary (the arrays start on 16 bytes, F is a multiple of
        32): copied with autovec_copy it is one 64-bit access."""
        offset = cute.assume(row * self.f + col, divby=2)
        return cute.make_tensor(mX.iterator + offset, cute.make_layout(2))

    @staticmethod
    def resident_product(n: int, sA: cute.Tensor, sW: cute.Tensor, wg: Int32, wtid: Int32) -> tuple:
        """One warpgroup's half (n columns) of a product with A resident in shared memory: the
        tiled MMA, A's descriptors (MMA, 1, K / 8), this warpgroup's half of the weight stages'
        descriptors (MMA, 1, CHUNK / 8, stages), the accumulators' coordinates and the
        accumulators."""
        tiled = _wgmma.tiled_mma_tf32(n)
        thr = tiled.get_slice(wtid)
        tCrA = tiled.make_fragment_A(thr.partition_A(sA))
        tCrB = tiled.make_fragment_B(thr.partition_B(sW))[None, None, None, wg, None]
        coords = thr.partition_C(cute.make_identity_tensor((ROW_BLOCK_WGMMA, n)))
        return tiled, tCrA, tCrB, coords, tiled.make_fragment_C(tiled.partition_shape_C((ROW_BLOCK_WGMMA, n)))

    @cute.kernel
    def kernel(self, mS: cute.Tensor, mAct: cute.Tensor, mSn: cute.Tensor, mW1sv: cute.Tensor,
               mW1hv: cute.Tensor, mW1lv: cute.Tensor, mW1: cute.Tensor, mB1: cute.Tensor,
               mW2v: cute.Tensor, mW2tv: cute.Tensor, mW1stv: cute.Tensor, mB2: cute.Tensor,
               mR: cute.Tensor, mDs: cute.Tensor, mHid: cute.Tensor, mDp: cute.Tensor,
               mDz: cute.Tensor, mPart: cute.Tensor, batch: Int32, num_ctas: Int32, inv_fb: Float32):
        """The four products and their epilogues (RowPass) for the CTA's 64 rows, on wgmma (the
        class docstring says how)."""
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        bm, f, h, plan = ROW_BLOCK_WGMMA, self.f, self.h, self.plan
        wg = tid // _wgmma.WARPGROUP
        wtid = tid % _wgmma.WARPGROUP
        row0 = cta * bm
        smem = cutlass.memory.SmemAllocator()
        raw = smem.allocate_tensor(Float32, cute.make_layout(plan.raw_floats), _wgmma.ATOM_BYTES)
        sZ = _wgmma.allocate_sw128(smem, (bm, h))
        sActs = smem.allocate_tensor(Int32, cute.make_layout(bm), 16)
        sRowPart = smem.allocate_tensor(Float32, cute.make_layout((4, bm), stride=(bm, 1)), 16)
        # b1 and tau's column factors, read by z's epilogues: from shared memory they hold no
        # registers through z's chunk loops (held there, ptxas spilled)
        sB1 = smem.allocate_tensor(Float32, cute.make_layout(h), 16)
        sTau = smem.allocate_tensor(Float32, cute.make_layout(h), 16)
        # z's staging: s chunks (rows padded to 4 (mod 32) banks: conflict-free fragment
        # loads), W1s hi / lo chunks; later the other products' weight stages, and dpred.
        stride = CHUNK + PAD
        zs, ps = plan.Z_STAGES, plan.PRODUCT_STAGES
        sS3 = cute.make_tensor(raw.iterator, cute.make_layout((bm, CHUNK // 4, 4, zs),
                                                              stride=(stride, 4, 1, plan.s_stage)))
        sS = cute.make_tensor(raw.iterator, cute.make_layout((bm, CHUNK, zs), stride=(stride, 1, plan.s_stage)))
        sWhi = _wgmma.sw128_view(raw.iterator + plan.hi, (plan.z_tile // 2, CHUNK, 2, zs))
        sWlo = _wgmma.sw128_view(raw.iterator + plan.lo, (plan.z_tile // 2, CHUNK, 2, zs))
        sWp = _wgmma.sw128_view(raw.iterator, (plan.pred_tile // 2, CHUNK, 2, ps))
        sWf = _wgmma.sw128_view(raw.iterator, (plan.f_tile // 2, CHUNK, 2, ps))
        sWh = _wgmma.sw128_view(raw.iterator, (plan.h_tile // 2, CHUNK, 2, ps))
        sDp = _wgmma.sw128_view(raw.iterator + plan.dp, (bm, f))

        if tid < bm:
            sActs[tid] = Int32(-1)  # padding rows past the batch: no action, no gradient
            if row0 + tid < batch:
                sActs[tid] = Int32(mAct[row0 + tid])
        mNorms = cute.make_tensor(mW1sv.iterator + norms_offset(f, h), cute.make_layout(h))
        for c in cutlass.range(tid, h, self.threads, unroll=1):
            sB1[c] = mB1[c]
            sTau[c] = Float32(z_error_per_norm(f)) * mNorms[c]
        loops = self.wgmma_loops(mS, mW1hv, mW1lv, mW2v, mW2tv, mW1stv, batch, row0, sS3, sWhi, sWlo, sWp, sWh,
                                 sWf)
        self.start_wgmma_loop(loops, 0, tid)

        # ---- Phase 1: z = s @ W1s^T + b1 + W1a[:, a] -> sZ; hid = relu(z) -> global.
        zn = plan.z_tile // 2
        tiled_z = _wgmma.tiled_mma_tf32(zn, a_in_registers=True)
        thr_z = tiled_z.get_slice(wtid)
        tCsS = thr_z.partition_A(sS)  # (MMA, 1, CHUNK / 8, STAGES)
        rA = tiled_z.make_fragment_A(tCsS[None, None, None, 0])
        rA_lo = tiled_z.make_fragment_A(tCsS[None, None, None, 0])
        tBhi = tiled_z.make_fragment_B(thr_z.partition_B(sWhi))[None, None, None, wg, None]  # (MMA, 1, CHUNK / 8, STAGES)
        tBlo = tiled_z.make_fragment_B(thr_z.partition_B(sWlo))[None, None, None, wg, None]
        cC1 = thr_z.partition_C(cute.make_identity_tensor((bm, zn)))
        acc1 = tiled_z.make_fragment_C(tiled_z.partition_shape_C((bm, zn)))
        num_mi = 1
        num_ni = cute.size(acc1) // 4
        # W1's action columns, gathered before the products (RowPassMmaSync.kernel's phase 1
        # says why); b1 by column (v0, ni), seen by element (stride 0 over the row half v1)
        b1_frag = cute.make_rmem_tensor(cute.make_layout((2, 2, num_ni), stride=(1, 0, 2)), Float32)
        w1a_frag = cute.make_rmem_tensor(cute.size(acc1), Float32)
        hid_frag = cute.make_rmem_tensor(cute.size(acc1), Float32)
        row_norm = cute.make_rmem_tensor((2, num_mi), Float32)
        row_norm.fill(0.0)
        col_tau = cute.make_rmem_tensor((2, num_ni), Float32)
        row_acts = cute.make_rmem_tensor((2, num_mi), Int32)
        for v1 in cutlass.range_constexpr(2):
            row_acts[v1, 0] = Int32(-1)
            if row0 + cC1[2 * v1][0] < batch:
                row_acts[v1, 0] = Int32(mAct[row0 + cC1[2 * v1][0]])
        for nt in cutlass.range_constexpr(h // plan.z_tile):
            col0 = nt * plan.z_tile + wg * zn
            for i in cutlass.range_constexpr(cute.size(acc1)):
                act = row_acts[i // 2 % 2, 0]
                w1a_frag[i] = Float32(0.0)
                if act >= 0:
                    w1a_frag[i] = mW1[col0 + cC1[i][1], f + act]
            row_sq = row_norm if cutlass.const_expr(nt == 0) else None
            self.run_wgmma_loop(loops, nt, tid, acc1, lambda kc, stage: self.z_chunk_mma(
                tiled_z, acc1, tCsS, rA, rA_lo, tBhi, tBlo, stage, row_sq))
            if cutlass.const_expr(nt == 0):
                for v in cutlass.range_constexpr(2):
                    sq = row_norm[v, 0]
                    sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=1)
                    sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=2)
                    row_norm[v, 0] = cute.math.sqrt(sq)
            for ni in cutlass.range_constexpr(num_ni):
                for v0 in cutlass.range_constexpr(2):
                    b1_frag[v0, 0, ni] = sB1[col0 + cC1[v0 + 4 * ni][1]]
                    col_tau[v0, ni] = sTau[col0 + cC1[v0 + 4 * ni][1]]
            self.exact_sign_epilogue(mS, mW1sv, mW1, mB1, sActs, sZ, cC1, acc1, b1_frag, w1a_frag,
                                     hid_frag, row_norm, col_tau, row0, col0, batch, tid % 32)
            self.store_activations(mHid, hid_frag, cC1, col0, row0, batch, zero_past_batch=True)

        # ---- Phase 2: pred = hid @ W2^T + b2; diff, r, dpred -> sDp and global.
        p2 = h // plan.z_tile  # index of pred's first chunk loop
        n2 = plan.pred_tile // 2
        tiled_p, tCrZ, tCrWp, cC2, acc2 = self.resident_product(n2, sZ, sWp, wg, wtid)
        row_sq = cute.make_rmem_tensor(2, Float32)
        row_sq.fill(0.0)
        s_next_frag = cute.make_rmem_tensor(cute.size(acc2), Float32)
        b2_frag = cute.make_rmem_tensor((2, cute.size(acc2) // 4), Float32)
        for nt in cutlass.range_constexpr(f // plan.pred_tile):
            col0 = nt * plan.pred_tile + wg * n2
            for ni in cutlass.range_constexpr(cute.size(acc2) // 4):
                for v0 in cutlass.range_constexpr(2):
                    b2_frag[v0, ni] = mB2[col0 + cC2[v0 + 4 * ni][1]]
            for i in cutlass.range_constexpr(0, cute.size(acc2), 2):  # 64-bit loads, as ds's stores
                s_next_frag[i] = Float32(0.0)
                s_next_frag[i + 1] = Float32(0.0)
                if row0 + cC2[i][0] < batch:
                    pair = cute.make_rmem_tensor(2, Float32)
                    cute.autovec_copy(self.row_pair(mSn, row0 + cC2[i][0], col0 + cC2[i][1]), pair)
                    s_next_frag[i] = pair[0]
                    s_next_frag[i + 1] = pair[1]
            self.run_wgmma_loop(loops, p2 + nt, tid, acc2, lambda kc, stage: self.resident_chunk_mma(
                tiled_p, acc2, tCrZ, tCrWp, kc, stage))
            for i in cutlass.range_constexpr(cute.size(acc2)):
                r = cC2[i][0]
                diff = Float32(0.0)
                if row0 + r < batch:
                    diff = acc2[i] + b2_frag[i % 2, i // 4] - s_next_frag[i]
                row_sq[i // 2 % 2] = row_sq[i // 2 % 2] + diff * diff
                dp = diff * inv_fb
                sDp[r, col0 + cC2[i][1]] = dp
                acc2[i] = dp
            self.store_activations(mDp, acc2, cC2, col0, row0, batch, zero_past_batch=False)  # diff = 0 there
        # r: the 4 lanes sharing a row add their column pairs (butterfly, fixed order), then
        # the two warpgroups theirs through shared memory, in warpgroup order.
        for v1 in cutlass.range_constexpr(2):
            sq = row_sq[v1]
            sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=1)
            sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=2)
            if tid % 4 == 0:
                sRowPart[wg, cC2[2 * v1][0]] = sq
        cute.arch.barrier()
        if tid < bm:
            r_row = (sRowPart[0, tid] + sRowPart[1, tid]) / Float32(2 * f)
            sRowPart[0, tid] = r_row
            if row0 + tid < batch:
                mR[row0 + tid] = r_row

        # ---- Partial column sums of dpred (db2), left rounded in sDp for dh; the chunk loop's
        # publish and first barrier order those stores before the tensor cores read them.
        self.dpred_column_sums(sDp, mPart, cta, num_ctas, tid)

        # ---- Phase 3: dh = dpred @ W2; dz = dh * (z > 0) -> sZ (in place) and global.
        p3 = p2 + f // plan.pred_tile
        n3 = plan.h_tile // 2
        tiled_h, tCrDp, tCrWh, cC3, acc3 = self.resident_product(n3, sDp, sWh, wg, wtid)
        for nt in cutlass.range_constexpr(h // plan.h_tile):
            col0 = nt * plan.h_tile + wg * n3
            self.run_wgmma_loop(loops, p3 + nt, tid, acc3, lambda kc, stage: self.resident_chunk_mma(
                tiled_h, acc3, tCrDp, tCrWh, kc, stage))
            for i in cutlass.range_constexpr(cute.size(acc3)):
                r = cC3[i][0]
                col = col0 + cC3[i][1]
                dz = acc3[i] if sZ[r, col] > Float32(0.0) else Float32(0.0)
                sZ[r, col] = dz
                acc3[i] = dz
            self.store_activations(mDz, acc3, cC3, col0, row0, batch, zero_past_batch=False)  # dpred = 0 there
        cute.arch.barrier()

        # ---- Partial column sums of dz (db1, W1's action columns) and the loss.
        self.dz_column_sums(sZ, sActs, sRowPart, mPart, cta, num_ctas, batch, tid)

        # ---- Phase 4: ds = dz @ W1s -> global.
        p4 = p3 + h // plan.h_tile
        n4 = plan.f_tile // 2
        tiled_f, tCrDz, tCrWf, cC4, acc4 = self.resident_product(n4, sZ, sWf, wg, wtid)  # sZ holds dz now
        for nt in cutlass.range_constexpr(f // plan.f_tile):
            col0 = nt * plan.f_tile + wg * n4
            self.run_wgmma_loop(loops, p4 + nt, tid, acc4, lambda kc, stage: self.resident_chunk_mma(
                tiled_f, acc4, tCrDz, tCrWf, kc, stage))
            # A lane's two adjacent columns (elements v0 = 0, 1) as one 64-bit store: the 4 lanes
            # of a row then write whole 32-byte sectors
            for i in cutlass.range_constexpr(0, cute.size(acc4), 2):
                r = cC4[i][0]
                if row0 + r < batch:
                    pair = cute.make_rmem_tensor(2, Float32)
                    pair[0] = acc4[i]
                    pair[1] = acc4[i + 1]
                    cute.autovec_copy(pair, self.row_pair(mDs, row0 + r, col0 + cC4[i][1]))


def row_pass_for(f: int, h: int, num_actions: int, precision: str, action_dtype: type) -> RowPass:
    """The row pass at these sizes: RowPassWgmma where uses_wgmma, else RowPassMmaSync."""
    path = RowPassWgmma if uses_wgmma(f, h, precision) else RowPassMmaSync
    return path(f, h, num_actions, precision, action_dtype)


# ---------------------------------------------------------------------------------------------
# Host side

_compiled = _cute.CompiledCache(__name__)


def row_pass_compile_args(f: int, h: int, num_actions: int, precision: str, action_dtype: type) -> tuple:
    p = _cute.fake_ptr()
    return (row_pass_for(f, h, num_actions, precision, action_dtype), p, _cute.fake_ptr(action_dtype), p, p, p,
            p, p, p, p, p, p, p, p, Int32(1), Int32(1), Float32(1.0), _cute.fake_stream())


def weight_prep_compile_args(f: int, h: int, num_actions: int, precision: str) -> tuple:
    p = _cute.fake_ptr()
    return WeightPrep(f, h, num_actions, precision), p, p, p, _cute.fake_stream()


def _compile_row_pass(f: int, h: int, num_actions: int, precision: str, action_dtype: type,
                      keep: bool = False) -> Any:
    key = ("row_pass", f, h, num_actions, precision, action_dtype.__name__, keep)
    return _compiled.get(key, lambda: _cute.compile_kernel(
        *row_pass_compile_args(f, h, num_actions, precision, action_dtype), keep=keep))


def _compile_weight_prep(f: int, h: int, num_actions: int, precision: str, keep: bool = False) -> Any:
    key = ("weight_prep", f, h, num_actions, precision, keep)
    return _compiled.get(key, lambda: _cute.compile_kernel(
        *weight_prep_compile_args(f, h, num_actions, precision), keep=keep))


CONTRACT = KernelContract(passes=("forward_backward",), options={"precision": PRECISIONS})


def check_sizes(chk: _arrays.Checker) -> None:
    """F and H: multiples of 32 in [32, 512] (whole 32-wide reduction chunks, 128-bit rows);
    A = W1's extra columns in [1, 16] (one partial column sum per action); any B >= 1 with
    Kp * max(F, H) < 2^31 (32-bit indexing; Kp = B rounded up to the row pass's row block,
    the TF32 K-major activations' row length)."""
    for dim in ("F", "H"):
        chk.dim_range(dim, MIN_WIDTH, MAX_WIDTH, "the kernels' tile and shared-memory sizes")
        chk.dim_multiple(dim, WIDTH_MULTIPLE, "the reductions run in whole 32-wide chunks")
    num_actions = chk.dims["F+A"] - chk.dims["F"]
    if not 1 <= num_actions <= MAX_ACTIONS:
        raise _arrays.FoxcuteInputError(
            f"{chk.where}: A={num_actions} actions (W1 has F + A columns) is outside the supported "
            f"range 1 <= A <= {MAX_ACTIONS} (one partial column sum per action)")
    batch = chk.dims["B"]
    bm = row_block(chk.dims["F"], chk.dims["H"])
    if -(-batch // bm) * bm * max(chk.dims["F"], chk.dims["H"]) >= 2**31:
        raise _arrays.FoxcuteInputError(
            f"{chk.where}: B={batch} gives 2^31 or more elements per array (32-bit indexing; "
            f"B rounded up to a multiple of {bm} times max(F, H) must stay under 2^31)")


def forward_backward(s: Any, a: Any, s_next: Any, W1: Any, b1: Any, W2: Any, b2: Any, *,
                     precision: str = "tf32") -> tuple:
    """(loss [1], r [B], dW1 [H, F+A], db1 [H], dW2 [F, H], db2 [F], ds [B, F]) for validated
    arrays; launched on the current stream of the array library, nothing synchronizes."""
    f = s.shape[1]
    h, w1_cols = W1.shape
    num_actions = w1_cols - f
    width = partials_width(f, h, num_actions)
    r, ds, hid, dpred, dz, partials = row_pass_outputs(s, a, s_next, W1, b1, W2, b2, precision=precision)
    dW2 = _arrays.empty(s, (f, h))
    dW1 = _arrays.empty(s, (h, w1_cols))

    def column_sums() -> Any:
        sums = sum_partials(partials, len(partials) // width, width)
        dW1[:, f:] = sums[f + h:f + h + h * num_actions].reshape(h, num_actions)  # columns the MMAs skip
        return sums

    def weight_gradients() -> None:
        # dW2 = dpred^T hid and dW1[:, :F] = dz^T s (rows F + A apart), side by side in one
        # launch: TF32 on wgmma from the row pass's K-major copies (dW1 = dz^T s reads s as it
        # is), fp32 by FFMA from the row-major ones.
        if precision == "tf32":
            kmajor_weight_grads_into([("kmajor", dpred, hid, dW2, h), ("rows", s, dz, dW1, w1_cols)],
                                     s.shape[0], dz.shape[1])
        else:
            weight_grads_into([(dpred, hid, dW2, h, None), (dz, s, dW1, w1_cols, None)], precision)

    # The short column sums of the row pass's partials on a side lane, beside the weight
    # gradients (they read different arrays and write different columns of dW1).
    sums, _ = _arrays.side_lane(s).run(column_sums, weight_gradients)
    db2 = sums[:f]
    db1 = sums[f:f + h]
    loss = sums[width - 1:width]
    return loss, r, dW1, db1, dW2, db2, ds


def row_pass_outputs(s: Any, a: Any, s_next: Any, W1: Any, b1: Any, W2: Any, b2: Any, *,
                     precision: str = "tf32") -> tuple:
    """WeightPrep and the row pass: (r [B], ds [B, F], hid, dpred, dz, per-CTA partials
    [num_ctas * width]) on the current stream. TF32: hid [H, Kp], dpred [F, Kp] and dz [H, Kp]
    are K-major (transposed, rounded to TF32, zero in the padding columns past B, Kp =
    num_ctas * bm); fp32: hid [B, H], dpred [B, F], dz [B, H]. (hid and dz are also what the
    GPU tests read the relu mask from.)"""
    batch, f = s.shape
    h, w1_cols = W1.shape
    num_actions = w1_cols - f
    action_dtype = Int64 if str(a.dtype).endswith("int64") else Int32
    row_pass = _compile_row_pass(f, h, num_actions, precision, action_dtype)
    bm = row_block(f, h)
    num_ctas = -(-batch // bm)
    width = partials_width(f, h, num_actions)
    r = _arrays.empty(s, (batch,))
    ds = _arrays.empty(s, (batch, f))
    shapes = [(n, num_ctas * bm) for n in (h, f, h)] if precision == "tf32" else [(batch, n) for n in (h, f, h)]
    hid, dpred, dz = (_arrays.empty(s, shape) for shape in shapes)
    partials = _arrays.empty(s, (num_ctas * width,))
    # WeightPrep's operands, then (TF32) W1s's row norms
    prep = _arrays.empty(s, (norms_offset(f, h) + h if precision == "tf32" else prep_arrays(precision) * h * f,))
    ptr = _cute.gmem_ptr
    stream = _cute.current_stream(s)
    _compile_weight_prep(f, h, num_actions, precision)(ptr(W1), ptr(W2), ptr(prep), stream)
    row_pass(ptr(s), ptr(a, action_dtype), ptr(s_next), ptr(W1), ptr(prep), ptr(b1), ptr(b2), ptr(r),
             ptr(ds), ptr(hid), ptr(dpred), ptr(dz), ptr(partials), Int32(batch), Int32(num_ctas),
             Float32(1.0 / (f * batch)), stream)
    return r, ds, hid, dpred, dz, partials


def sum_partials(partials: Any, num_ctas: int, width: int) -> Any:
    """total[j] = sum over CTAs of partial column j (laid out by partial_index), each column
    summed in CTA order by column_sum: deterministic."""
    from .column_sum import column_sum

    total = _arrays.empty(partials, (width,))
    for c0 in range(0, width, COLSUM_WIDTH):
        w = min(COLSUM_WIDTH, width - c0)
        column_sum(partials[c0 * num_ctas:(c0 + w) * num_ctas].reshape(num_ctas, w), out=total[c0:c0 + w])
    return total


def compiled_for_ci() -> dict[str, Any]:
    """The weight prep and the row pass at the defaults (F=256, H=128, A=3) in both precisions,
    PTX kept. The weight gradients are gemm's KMajorWeightGrad (TF32) and WeightGrad (fp32);
    gemm.compiled_for_ci covers them."""
    out = {}
    for p in ("tf32", "fp32"):
        out[f"weight_prep_{p}"] = _compile_weight_prep(256, 128, 3, p, keep=True)
        out[f"row_pass_{p}"] = _compile_row_pass(256, 128, 3, p, Int64, keep=True)
    return out
