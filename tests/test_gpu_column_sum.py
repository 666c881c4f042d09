"""column_sum on the H200: exact to float32 summation, deterministic, graph-capturable."""

import numpy as np
import pytest

import foxcute
from foxcute.checks import rel_err

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")


@pytest.mark.parametrize("m", [1, 5, 1000003])
@pytest.mark.parametrize("n", [1, 3, 7, 128, 4096])
def test_matches_float64_reference(rng, m, n):
    if m * n < 50_000_000:
        g = rng.standard_normal((m, n), dtype=np.float32)
        ref = foxcute.column_sum(g)
        g = cp.asarray(g)
    else:  # 16 GB at N = 4096 (summed in two row blocks): draw and sum in float64 on the GPU
        g = cp.random.default_rng(int(rng.integers(2**31))).standard_normal((m, n), dtype=np.float32)
        ref = g.sum(axis=0, dtype=np.float64)
    out = foxcute.column_sum(g, backend="cute")
    assert isinstance(out, cp.ndarray) and out.shape == (n,) and out.dtype == np.float32
    assert rel_err(out, ref) <= 1e-6


def assert_exact_small_integer_sums(m, n):
    # Small integers, so float32 sums are exact: a dropped or doubled row or a misplaced
    # column shows up as an exact mismatch.
    rows = np.arange(m)[:, None] % 11 + 1
    cols = np.arange(n)[None, :] % 13 + 1
    g = (rows * cols).astype(np.float32)
    out = foxcute.column_sum(cp.asarray(g), backend="cute").get()
    np.testing.assert_array_equal(out, g.astype(np.float64).sum(0).astype(np.float32))


@pytest.mark.parametrize("n", [3, 128, 1028, 2052, 4095, 4096])
def test_every_tail_row_and_column_counts(n):
    assert_exact_small_integer_sums(4 * 37 + 3, n)  # M = 4k+3 exercises the pack tail


@pytest.mark.parametrize("m", [16, 151])
@pytest.mark.parametrize("n", [129, 255, 258, 510, 516, 1020])
def test_rows_of_128_to_256_vectors(m, n):
    # Packed rows of 129..255 float4 vectors get a CTA of more threads than vectors, one
    # thread row: the idle threads once stored their zeros over other threads' sums
    # (curiosity's [16, 129] partials).
    assert_exact_small_integer_sums(m, n)


@pytest.mark.parametrize("m, n", [(264, 4096), (7, 1028), (33, 2052)])
def test_short_wide_inputs_use_column_slices(rng, m, n):
    # The per-CTA weight-gradient partials of the other kernels have this shape.
    g = rng.standard_normal((m, n), dtype=np.float32)
    assert rel_err(foxcute.column_sum(cp.asarray(g), backend="cute"), foxcute.column_sum(g)) <= 1e-6


@pytest.mark.parametrize("m, n", [(264, 12548), (132, 49668)])
def test_kernel_partials_wider_than_the_public_limit_in_one_launch(m, n):
    # Mamba2's fused backward sums its [CTAs, 3*SH2*D + SH2 + 1 rounded up to 4] partials in
    # one launch of up to 64 column slices (the public column_sum stops at 4096 columns).
    from foxcute.kernels.column_sum import column_sum

    rows = np.arange(m)[:, None] % 11 + 1
    cols = np.arange(n)[None, :] % 13 + 1
    g = (rows * cols).astype(np.float32)  # exact in float32: any slip is an exact mismatch
    out = column_sum(cp.asarray(g)).get()
    np.testing.assert_array_equal(out, g.astype(np.float64).sum(0).astype(np.float32))


def test_dependent_launch_reads_what_the_kernel_before_it_wrote(rng):
    # dependent=True (PDL, as after Mamba2's FusedBackward): the wait must hold the loads
    # until the previous kernel, here the one writing G in place, has finished; in a CUDA
    # graph replayed on new values too. The sums equal the plain launch's, bit for bit.
    torch = pytest.importorskip("torch")
    from foxcute.kernels.column_sum import column_sum

    g = torch.zeros(264, 12548, device="cuda")
    source = torch.randn(264, 12548, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        column_sum(g, dependent=True)  # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g.copy_(source)
        out = column_sum(g, dependent=True)
    for _ in range(3):
        source.copy_(torch.randn_like(source))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, column_sum(source.clone()))


def test_bit_identical_over_20_runs(rng):
    g = cp.asarray(rng.standard_normal((524288, 128), dtype=np.float32))
    first = foxcute.column_sum(g, backend="cute").get()
    for _ in range(19):
        assert np.array_equal(foxcute.column_sum(g, backend="cute").get(), first)


def test_torch_tensors_round_trip(rng):
    torch = pytest.importorskip("torch")
    g = torch.randn(4099, 3, device="cuda")
    out = foxcute.column_sum(g, backend="cute")
    assert isinstance(out, torch.Tensor) and out.device == g.device
    assert rel_err(out, g.double().sum(0)) <= 1e-6


def test_cuda_graph_replay_updates_output():
    torch = pytest.importorskip("torch")
    g = torch.randn(524288, 3, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        foxcute.column_sum(g, backend="cute")  # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = foxcute.column_sum(g, backend="cute")
    for _ in range(3):
        g.copy_(torch.randn_like(g))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, g.double().sum(0)) <= 1e-6


def test_rejects_before_launch():
    g = cp.ones((10, 3), np.float32)
    with pytest.raises(foxcute.FoxcuteInputError, match="'G'.*float32"):
        foxcute.column_sum(g.astype(np.float64), backend="cute")
    with pytest.raises(foxcute.FoxcuteInputError, match="C-contiguous"):
        foxcute.column_sum(cp.ones((10, 6), np.float32)[:, ::2], backend="cute")
    with pytest.raises(foxcute.FoxcuteInputError, match="N=4097"):
        foxcute.column_sum(cp.ones((2, 4097), np.float32), backend="cute")
    with pytest.raises(foxcute.FoxcuteInputError, match="numpy|CUDA"):
        foxcute.column_sum(np.ones((10, 3), np.float32), backend="cute")
