"""The TF32 wgmma probe on the H200: C = A @ B^T against float64 NumPy, deterministic, and two
exact checks that tell a layout fault (a misplaced row, column or K step) from a precision one.

If test_every_element_lands_exactly fails, the kernel's shared-memory layout, descriptors or
accumulator mapping are wrong (see the mismatch pattern it prints); if only the float64
comparisons fail, look at the rounding (test_operands_rounded_to_nearest_tf32)."""

import numpy as np
import pytest

from foxcute import FoxcuteInputError
from foxcute.checks import TOLERANCE, rel_err

from conftest import matmul_operands

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
probe = pytest.importorskip("probes.wgmma_probe")

SHAPES = [(64, 32, 32), (256, 64, 256), (8192, 32, 256)]


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matches_float64_and_is_bit_identical(rng, m, n, k):
    a, b = matmul_operands(rng, m, n, k)
    a_d, b_d = cp.asarray(a), cp.asarray(b)
    out = probe.matmul_nt(a_d, b_d)
    assert out.shape == (m, n) and out.dtype == np.float32
    assert rel_err(out, a.astype(np.float64) @ b.astype(np.float64).T) <= TOLERANCE["tf32"]
    for _ in range(2):
        assert cp.array_equal(probe.matmul_nt(a_d, b_d), out)


def _mismatch_pattern(out, want):
    bad = np.argwhere(out != want)
    return f"{len(bad)} of {out.size} differ; first (row, col): {bad[:8].tolist()}"


@pytest.mark.parametrize("n", probe.SUPPORTED_N)
def test_every_element_lands_exactly(rng, n):
    # Small integers are exact in TF32 and their sums exact in float32: any misplaced row,
    # column or K step (wrong swizzle, descriptor or accumulator mapping) is an exact mismatch.
    # 5 chunks: every shared buffer is filled, and two of them refilled.
    m, k = 192, 160
    a = rng.integers(-4, 5, (m, k)).astype(np.float32)
    b = rng.integers(-3, 4, (n, k)).astype(np.float32)
    out = probe.matmul_nt(cp.asarray(a), cp.asarray(b)).get()
    want = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float32)
    assert np.array_equal(out, want), _mismatch_pattern(out, want)


def _round_tf32_nearest(x):
    """cvt.rna.tf32.f32 in NumPy (normal numbers): round the magnitude to 10 mantissa bits,
    ties away from zero."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def test_operands_rounded_to_nearest_tf32(rng):
    # B picks column n of A (B = [I | 0]), so C = A[:, :n] as the tensor core saw it: rounded
    # to nearest by the staging, not truncated (the values carry 2^-11 + 2^-12 below TF32's last
    # bit, so truncation and rounding differ on every element; column 0 carries exactly half
    # an ulp, a tie, which goes away from zero). The staging adds half an ulp and leaves the
    # low bits to the tensor core, which must ignore them for this to hold.
    m, n, k = 64, 32, 64
    a = (rng.choice([-1.0, 1.0], (m, k)) * (1 + 2.0**-11 + 2.0**-12)
         * 2.0 ** rng.integers(-3, 4, (m, k))).astype(np.float32)
    a[:, 0] = (rng.choice([-1.0, 1.0], m) * (1 + 2.0**-11) * 2.0 ** rng.integers(-3, 4, m)).astype(np.float32)
    b = np.eye(n, k, dtype=np.float32)
    out = probe.matmul_nt(cp.asarray(a), cp.asarray(b)).get()
    want = _round_tf32_nearest(a[:, :n])
    assert not np.array_equal(want, a[:, :n])
    assert np.array_equal(out, want), _mismatch_pattern(out, want)


def test_nan_and_inf_operands_pass_through():
    # NaN with every mantissa bit set (0x7fffffff, what GPU arithmetic produces) must stay a
    # NaN: half an ulp added to its bits would carry into the sign bit and make it -0
    m, n, k = 64, 32, 32
    a = np.ones((m, k), np.float32)
    a[0, 3] = np.array([0x7FFFFFFF], np.uint32).view(np.float32)[0]
    a[1, 3] = np.inf
    b = np.eye(n, k, dtype=np.float32)
    out = probe.matmul_nt(cp.asarray(a), cp.asarray(b)).get()
    assert np.isnan(out[0, 3]) and out[1, 3] == np.inf
    assert np.all(np.isnan(out[:2, np.arange(n) != 3]))  # NaN and inf times B's zeros
    assert np.all(out[2:] == 1)


def test_writes_into_given_output():
    a, b = cp.ones((64, 32), np.float32), cp.ones((32, 32), np.float32)
    out = cp.full((64, 32), np.nan, np.float32)
    assert probe.matmul_nt(a, b, out=out) is out
    assert bool((out == 32).all())


def test_rejects_bad_sizes_before_launch():
    ones = cp.ones
    with pytest.raises(FoxcuteInputError, match="M=65"):
        probe.matmul_nt(ones((65, 32), np.float32), ones((32, 32), np.float32))
    with pytest.raises(FoxcuteInputError, match="N=40"):
        probe.matmul_nt(ones((64, 32), np.float32), ones((40, 32), np.float32))
    with pytest.raises(FoxcuteInputError, match="K=40"):
        probe.matmul_nt(ones((64, 40), np.float32), ones((32, 40), np.float32))
    with pytest.raises(FoxcuteInputError, match="'B'.*K=64"):
        probe.matmul_nt(ones((64, 32), np.float32), ones((32, 64), np.float32))
    with pytest.raises(FoxcuteInputError, match="float32"):
        probe.matmul_nt(ones((64, 32), np.float64), ones((32, 32), np.float32))
