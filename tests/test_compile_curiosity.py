"""Curiosity's row pass compiled for sm_90a on the CPU (CI): no spills at the defaults and at
the widest supported sizes, TF32 fragments by ldmatrix with no per-fragment conversion, the
column-sum passes' shared loads ahead of their stores, and (where a SASS disassembler is
installed) no epilogue global load waiting behind a global store, each chunk loop's first
chunks issued before the epilogue of the loop before it, and the exact-sign recompute's
loads of a group of z entries in flight together."""

import re

import numpy as np
import pytest

pytest.importorskip("cutlass")

from cutlass import Int32, Int64  # noqa: E402

from foxcute import FoxcuteInputError  # noqa: E402
from foxcute._arrays import Checker  # noqa: E402
from foxcute.kernels import _cute, curiosity  # noqa: E402

from conftest import disassemble  # noqa: E402


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("f,h,num_actions,action_dtype", [(256, 128, 3, Int64), (96, 160, 5, Int64),
                                                           (512, 512, 16, Int32)])
def test_row_pass_keeps_everything_in_registers(precision, f, h, num_actions, action_dtype):
    """At the defaults and F = 96, H = 160 (TF32: the wgmma kernel, 80-column z tiles) and at
    the widest sizes (TF32: the mma.sync kernel, 32-row blocks)."""
    assert curiosity.uses_wgmma(f, h, precision) == (precision == "tf32" and f + h <= 384)
    report = _cute.ptxas_report(*curiosity.row_pass_compile_args(f, h, num_actions, precision, action_dtype))
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report
    assert curiosity.RowPassMmaSync.smem_floats(curiosity.row_block(f, h), f, h) * 4 <= curiosity.SMEM_BUDGET


def _sass(precision: str, tmp_path) -> str:
    cubin = tmp_path / f"row_pass_{precision}.cubin"
    cubin.write_bytes(curiosity.compiled_for_ci()[f"row_pass_{precision}"].__cubin__)
    return disassemble(cubin)


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_next_chunk_loop_starts_before_each_epilogue(precision, tmp_path):
    """After each chunk loop's closing barrier, the next loop's first chunks (cp.async, LDGSTS)
    are issued before the epilogue's first global store: their L2 round trip runs during the
    epilogue instead of after it. Five such transitions at the defaults: z -> pred, pred's
    two column tiles, pred -> dh, dh -> ds, ds's two column tiles (ds's last epilogue has
    none after it). Before: the prologue came after the epilogue in every one."""
    sass = _sass(precision, tmp_path)
    starts = 0
    for segment in re.split(r"\bBAR\.SYNC", sass):
        ops = re.findall(r"\b(LDGSTS|STG)\.E", segment)
        if "STG" in ops and "LDGSTS" in ops:
            assert ops.index("LDGSTS") < ops.index("STG"), ops
            starts += 1
    assert starts == 5


def test_column_sum_passes_load_rows_before_storing():
    """TF32: the db2 and the db1 / per-action column-sum passes (the loop bodies that round
    dpred / dz in place: COLSUM_ROWS cvt.rna each, no MMA) load all COLSUM_ROWS rows of a
    block before the first rounded value is stored. ptxas keeps a shared load behind a store
    it cannot tell apart, so the db1 pass before (load, sums, store, row by row) waited a
    shared round trip a row."""
    ptx = curiosity.compiled_for_ci()["row_pass_tf32"].__ptx__
    passes = 0
    for block in re.split(r"^\$L__BB\w+:", ptx, flags=re.M):
        if "mma" in block or "cvt.rna.tf32.f32" not in block or "ld.shared" not in block:
            continue
        passes += 1
        assert block.count("cvt.rna.tf32.f32") == curiosity.COLSUM_ROWS
        ops = re.findall(r"^\s*(ld|st)\.shared", block, flags=re.M)
        assert ops.index("st") >= curiosity.COLSUM_ROWS, "".join(op[0] for op in ops)
    assert passes == 2


def test_exact_z_group_loads_in_flight_together(tmp_path):
    """TF32: the float64 recompute of near-zero z entries issues the s and W1s loads of a whole
    group (exact_z_group(F) entries, F / 32 of each a lane) in the basic block before its first
    float64 FMA: one memory round trip a group, where one entry at a time (before) paid one
    each, in series in the warp with the most candidates."""
    ops = re.findall(r"\b(LDG\.E|DFMA|BRA)\b", _sass("tf32", tmp_path))
    first = ops.index("DFMA")
    block = ops[max(i for i in range(first) if ops[i] == "BRA"):first]
    assert block.count("LDG.E") >= curiosity.exact_z_group(256) * 2 * 256 // 32


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_epilogue_loads_are_not_serialized_behind_stores(precision, tmp_path):
    """Between two barriers, no global load may sit between two global stores: ptxas keeps
    a load after a store it cannot prove distinct, so an epilogue that alternates loads of
    its operands (b1, W1's action columns, b2, s_next) with its output stores waits one
    memory round trip per element (the cause of most of the row pass's time before the
    operands were loaded up front)."""
    sass = _sass(precision, tmp_path)
    assert "HGMMA" in sass or precision == "fp32"
    segments = re.split(r"\bBAR\.SYNC", sass)
    assert len(segments) > 8  # the four products' chunk loops and the epilogues between them
    for segment in segments:
        order = "".join("L" if op == "LDG" else "S" for op in re.findall(r"\b(LDG|STG)\.E", segment))
        assert not re.search(r"SL+S", order), order


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_output_stores_are_64_bit_pairs(precision, tmp_path):
    """Each lane holds two adjacent columns of an accumulator row, stored as one 64-bit STG:
    per thread ds 2 x 32 values (defaults), and in fp32 hid 32, dpred 2 x 32 and dz 32 too,
    96 pairs. TF32 writes hid, dpred and dz K-major for the wgmma weight gradients: one 32-bit
    STG an element, the 8 lanes of a column storing 8 consecutive rows (a whole 32-byte
    sector), 128 a thread."""
    ops = re.findall(r"\bSTG\.E(\.64|\.128)?\b", _sass(precision, tmp_path))
    assert ".128" not in ops
    if precision == "fp32":
        assert ops.count(".64") == (32 + 2 * 32 + 32 + 2 * 32) // 2
    else:
        assert ops.count(".64") == 2 * 32 // 2
        assert ops.count("") >= 32 + 2 * 32 + 32  # hid^T, dpred^T, dz^T (+ r, partials)


def test_tf32_products_on_wgmma_and_rounded_once():
    """TF32 row pass at the defaults: the four products on wgmma, as many instructions in the
    PTX as its chunk loops' bodies hold (a loop per column tile, each body one chunk: z one
    tile of 4 k steps x 3 (3xTF32), pred two tiles x 4, dh one x 4, ds two x 4), no mma.sync
    and no ldmatrix; no cvt.rna at an operand: z's split is integer arithmetic, the weights
    come rounded (and W1s split) from WeightPrep, and hid, dpred and dz are rounded once
    where they are left in shared memory (32 for hid, and COLSUM_ROWS each for dpred and dz:
    their column-sum passes load that many rows, then store them rounded), and dpred, dz once
    more as their K-major copies leave the accumulators (64 and 32; hid's copy is sZ's
    value). The mma.sync version before had 96 ldmatrix.x4 and 1536 mma.sync a warp."""
    ptx = {name: f.__ptx__ for name, f in curiosity.compiled_for_ci().items()}
    tf32, fp32 = ptx["row_pass_tf32"], ptx["row_pass_fp32"]
    assert curiosity.uses_wgmma(256, 128, "tf32") and not curiosity.uses_wgmma(256, 128, "fp32")
    # every tile 64 columns a warpgroup: m64n64k8
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k8\.f32\.tf32\.tf32", tf32)) == 4 * 3 + 2 * 4 + 4 + 2 * 4
    assert len(re.findall(r"wgmma\.mma_async", tf32)) == 4 * 3 + 2 * 4 + 4 + 2 * 4
    assert "mma.sync" not in tf32 and "ldmatrix" not in tf32
    assert tf32.count("cvt.rna.tf32.f32") == 32 + 2 * curiosity.COLSUM_ROWS + 64 + 32
    assert "ldmatrix" not in fp32 and "cvt.rna" not in fp32
    # WeightPrep: W2 and W1s rounded in TF32 mode only.
    assert ptx["weight_prep_tf32"].count("cvt.rna.tf32.f32") == 2 and "cvt.rna" not in ptx["weight_prep_fp32"]


def test_tf32_z_split_rounds_both_parts():
    """z's 3xTF32 operands: hi = rna(x), lo = rna(x - hi), each half a TF32 ulp added and the
    low 13 bits cleared, gemm's cvt.rna split bit for bit. The row pass splits s as it loads
    its A fragment (per thread and 32-wide chunk: 4 k steps x 4 values), WeightPrep W1s once
    (one value a thread; wgmma reads B from shared memory only). A lo left to the MMA's
    truncation would have half the adds."""
    ptx = {name: f.__ptx__ for name, f in curiosity.compiled_for_ci().items()}
    for name, values in (("row_pass_tf32", 4 * 4), ("weight_prep_tf32", 1)):
        assert len(re.findall(r"add\.s32\s+%r\d+, %r\d+, 4096;", ptx[name])) == 2 * values, name
        assert len(re.findall(r"and\.b32\s+%r\d+, %r\d+, -8192;", ptx[name])) == 2 * values, name


def test_tf32_z_signs_near_zero_recomputed_in_float64():
    """TF32 z: an entry whose |z| is under the bound tau on its 3xTF32 error is summed again
    from exact float64 products (the float64 reference's relu mask). Pinned in the PTX: one
    vote per round of candidates (a lane's lowest left), one ballot of the lanes offering one,
    and per group of exact_z_group(F) of them warp-wide float64 dot products, F / 32 = 8
    fma.rn.f64 a lane each (before: a ballot per accumulator element, 32, and one entry a time);
    tau's factors: 2 row norms a thread (sqrt of squares summed from z's A fragments: a
    thread's wgmma accumulators are in two rows), WeightPrep's W1s row norms. fp32 mode sums
    every z in float64 already and has none of it (its PTX is unchanged)."""
    ptx = {name: f.__ptx__ for name, f in curiosity.compiled_for_ci().items()}
    tf32, fp32 = ptx["row_pass_tf32"], ptx["row_pass_fp32"]
    assert tf32.count("vote.sync.any.pred") == 1
    assert tf32.count("vote.sync.ballot.b32") == 1
    assert tf32.count("fma.rn.f64") == curiosity.exact_z_group(256) * 256 // 32
    assert tf32.count("sqrt.rn.f32") == 2
    assert ptx["weight_prep_tf32"].count("sqrt.rn.f32") == 1
    assert "vote.sync" not in fp32 and "sqrt" not in fp32 and "sqrt" not in ptx["weight_prep_fp32"]


def test_z_error_bound_covers_an_emulation_of_the_kernels_z(rng):
    """tau = z_error_per_norm(F) ||s_r|| ||w_c|| + Z_ERROR_PER_B1 |b1_c| against a NumPy
    emulation of the TF32 row pass's z (split_tf32's hi / lo, per 8-wide k step the MMAs
    lo*hi, hi*lo, hi*hi, each sum truncated to float32 as the tensor cores do; then + b1 and
    + W1a[:, a] in float32), on rows of norms 0.01x to 100x with z near 0 in row 0: the
    products' error stays under a tenth of its part of tau (the emulation gives ~1/50), the
    error before the last, sign-keeping rounding under half of tau (the b1 rounding can reach
    that), and every sign that differs from the float64 one is on an entry under tau."""
    f, h = 256, 128

    def rna_tf32(x):
        return ((x.view(np.int32) + np.int32(0x1000)) & np.int32(-0x2000)).view(np.float32)

    def truncate(x):
        y = x.astype(np.float32)
        over = np.abs(y.astype(np.float64)) > np.abs(x)
        y[over] = np.nextafter(y[over], np.float32(0))
        return y

    s = rng.standard_normal((256, f), dtype=np.float32) * (10.0 ** rng.uniform(-2, 2, (256, 1))).astype(np.float32)
    w = (rng.standard_normal((h, f)) / 16).astype(np.float32)
    w1a = (rng.standard_normal(h) / 16).astype(np.float32)
    dot = s.astype(np.float64) @ w.T.astype(np.float64)
    b1 = (-dot[0] - w1a).astype(np.float32)  # row 0's z near 0 in every column
    parts = []
    for x in (s, w):
        hi = rna_tf32(x)
        parts.append((hi, rna_tf32(x - hi)))
    (sh, sl), (wh, wl) = parts
    acc = np.zeros((256, h), np.float32)
    for k in range(0, f, 8):
        for x, y in ((sl, wh), (sh, wl), (sh, wh)):
            acc = truncate(acc + x[:, k:k + 8].astype(np.float64) @ y[:, k:k + 8].astype(np.float64).T)
    before_last = (acc + b1).astype(np.float32).astype(np.float64) + w1a
    z = before_last.astype(np.float32)
    exact = dot + b1 + w1a
    norms = np.linalg.norm(s.astype(np.float64), axis=1)[:, None] * np.linalg.norm(w.astype(np.float64), axis=1)
    tau = curiosity.z_error_per_norm(f) * norms + curiosity.Z_ERROR_PER_B1 * np.abs(b1)
    assert np.max(np.abs(acc - dot) / (curiosity.z_error_per_norm(f) * norms)) < 0.1
    assert np.max(np.abs(before_last - exact) / tau) <= 0.5
    flipped = (z > 0) != (exact > 0)
    assert np.all(np.abs(z[flipped]) <= tau[flipped])


def _sizes_checker(batch, f, h, num_actions=3):
    chk = Checker("test", gpu=False)
    # only shapes matter here: a zero-stride view stands in for a large s
    s = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (batch, f), (0, 0))
    chk.array("s", s, ("B", "F"))
    chk.array("W1", np.zeros((h, f + num_actions), np.float32), ("H", "F+A"))
    return chk


def test_check_sizes_counts_the_padded_batch():
    """The TF32 weight gradients' K-major operands are [n, Kp], Kp = B rounded up to the row
    pass's row block: at F = 96 the largest B with B * F < 2^31 pads past 2^31 elements and
    is rejected before a launch; the largest B whose padded rows stay under is accepted."""
    f, h = 96, 64
    bm = curiosity.row_block(f, h)
    curiosity.check_sizes(_sizes_checker((2**31 - 1) // f // bm * bm, f, h))
    with pytest.raises(FoxcuteInputError, match="32-bit"):
        curiosity.check_sizes(_sizes_checker((2**31 - 1) // f, f, h))
