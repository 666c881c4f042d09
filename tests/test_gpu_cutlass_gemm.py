"""The CUTLASS C++ peer on the H200: D = A @ B_t^T against float64 at the seed design's GEMM
shapes and at odd ones (batch 1, M and N cut by the tiles, N past the widest tile), cupy and
torch arrays, deterministic, capturable in a CUDA graph; sizes TMA cannot take refused by
name before anything launches."""

import numpy as np
import pytest

from foxcute import FoxcuteInputError, timing
from foxcute.checks import TOLERANCE, rel_err
from foxcute.peers import cutlass_gemm

from conftest import matmul_operands

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

if cutlass_gemm.unavailable():
    pytest.skip(f"CUTLASS C++ peer not buildable here: {cutlass_gemm.unavailable()}", allow_module_level=True)

# (M, N, K): the seed's projection and read-back at B*K = 65536, batch 1, tails, N > 128.
SHAPES = [(65536, 32, 256), (65536, 256, 32), (1, 4, 4), (7, 36, 40), (8191, 64, 100), (300, 260, 512)]


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
