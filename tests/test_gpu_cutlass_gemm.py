"""The CUTLASS C++ peer on the H200: the matmul D = A @ B_t^T and the split-K weight gradient
dW = dY^T X against float64 at the seed design's shapes and at odd ones (batch 1, sizes cut by
the tiles, widths past the widest tile), cupy and torch arrays, bit-identical reruns,
capturable in a CUDA graph; sizes TMA cannot take refused by name before anything launches."""

import numpy as np
import pytest

from foxcute import FoxcuteInputError
from foxcute.lab import timing
from foxcute.checks import TOLERANCE, rel_err
from foxcute.peers import cutlass_gemm

from conftest import matmul_operands

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

if cutlass_gemm.unavailable():
    pytest.skip(f"CUTLASS C++ peer not buildable here: {cutlass_gemm.unavailable()}", allow_module_level=True)

# (M, N, K): the seed's projection and read-back at B*K = 65536, batch 1, tails, N > 128.
SHAPES = [(65536, 32, 256), (65536, 256, 32), (1, 4, 4), (7, 36, 40), (8191, 64, 100), (300, 260, 512)]
# (M, N, K) of dW [N, K] = dY [M, N]^T X [M, K]: the seed's [dW_A|dW_B] and dW_C, batch 1, tails.
WEIGHT_GRAD_SHAPES = [(65536, 256, 32), (8192, 256, 16), (1, 4, 4), (7, 36, 40), (8191, 260, 100)]


def _weight_grad_operands(rng, m, n, k):
    """dY [m, n] and X [m, k], standard normal float32."""
    return rng.standard_normal((m, n), dtype=np.float32), rng.standard_normal((m, k), dtype=np.float32)


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matches_float64_and_reruns_bit_identical(rng, m, n, k):
    a, b_t = matmul_operands(rng, m, n, k)
    gemm = cutlass_gemm.Matmul(cp.asarray(a), cp.asarray(b_t))
    first = gemm().get()
    assert first.shape == (m, n) and first.dtype == np.float32
    assert rel_err(first, a.astype(np.float64) @ b_t.astype(np.float64).T) <= TOLERANCE["tf32"]
    assert gemm.tile_n == min(t for t in cutlass_gemm.tile_widths() if t >= min(n, 128))
    for _ in range(3):
        assert np.array_equal(gemm().get(), first)


@pytest.mark.parametrize("m,n,k", WEIGHT_GRAD_SHAPES)
def test_weight_grad_matches_float64_and_reruns_bit_identical(rng, m, n, k):
    dy, x = _weight_grad_operands(rng, m, n, k)
    grad = cutlass_gemm.WeightGrad(cp.asarray(dy), cp.asarray(x))
    first = grad().get()
    assert first.shape == (n, k) and first.dtype == np.float32
    assert rel_err(first, dy.astype(np.float64).T @ x.astype(np.float64)) <= TOLERANCE["tf32"]
    assert 1 <= grad.splits <= -(-m // grad.BLOCK_K)
    for _ in range(3):  # the turnstile's locks start from zero each launch: no hang, same sums
        assert np.array_equal(grad().get(), first)


@pytest.mark.parametrize("splits", [1, 7, 256])  # 256: 512 units, more than one round of resident CTAs
def test_weight_grad_at_any_split(rng, splits):
    dy, x = _weight_grad_operands(rng, 65536, 256, 32)
    got = cutlass_gemm.WeightGrad(cp.asarray(dy), cp.asarray(x), splits=splits)().get()
    assert rel_err(got, dy.astype(np.float64).T @ x.astype(np.float64)) <= TOLERANCE["tf32"]


def test_weight_grad_graph_capture(rng):
    dy, x = _weight_grad_operands(rng, 8192, 256, 32)
    timing.check_graph_replay(cutlass_gemm.WeightGrad(cp.asarray(dy), cp.asarray(x)))


def test_torch_tensors_and_graph_capture(rng):
    torch = pytest.importorskip("torch")
    a, b_t = matmul_operands(rng, 4096, 32, 256)
    gemm = cutlass_gemm.Matmul(torch.from_numpy(a).cuda(), torch.from_numpy(b_t).cuda())
    timing.check_graph_replay(gemm, library="torch")
    assert rel_err(gemm().cpu().numpy(), a.astype(np.float64) @ b_t.astype(np.float64).T) <= TOLERANCE["tf32"]


def test_cupy_graph_capture(rng):
    a, b_t = matmul_operands(rng, 4096, 256, 32)
    timing.check_graph_replay(cutlass_gemm.Matmul(cp.asarray(a), cp.asarray(b_t)))


@pytest.mark.parametrize("name,shape_a,shape_b,match", [
    ("K", (64, 6), (8, 6), "K=6 .* must be a multiple of 4"),
    ("N", (64, 8), (6, 8), "N=6 .* must be a multiple of 4"),
    ("B_t", (64, 8), (8, 12), "argument 'B_t' has K=12"),
])
def test_bad_sizes_are_refused_before_launch(name, shape_a, shape_b, match):
    out = cp.full((shape_a[0], shape_b[0]), 7.0, dtype=cp.float32)
    with pytest.raises(FoxcuteInputError, match=match):
        cutlass_gemm.Matmul(cp.zeros(shape_a, cp.float32), cp.zeros(shape_b, cp.float32), out=out)
    assert bool((out == 7.0).all())  # nothing written


@pytest.mark.parametrize("splits", [0, 3])
def test_weight_grad_bad_splits_are_refused(splits):
    out = cp.full((4, 4), 7.0, dtype=cp.float32)
    with pytest.raises(FoxcuteInputError, match=f"splits={splits} is outside 1..2"):
        cutlass_gemm.WeightGrad(cp.zeros((64, 4), cp.float32), cp.zeros((64, 4), cp.float32), out=out, splits=splits)
    assert bool((out == 7.0).all())
