"""Risk budget forward on the H200 (backend "cute"): against the float64 reference at the
defaults and odd sizes, both precisions, bit-identical, graph-capturable."""

import numpy as np
import pytest

import foxcute
from foxcute import FoxcuteInputError
from foxcute.checks import TOLERANCE, rel_err

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

# (B, SH2, I, H): defaults, batch 1 / 7 / around CTA multiples, other widths.
SIZES = [(8192, 256, 16, 64), (1, 256, 16, 64), (7, 256, 16, 64), (8191, 256, 16, 64),
         (65537, 256, 16, 64), (100, 128, 3, 32), (333, 4, 1, 4), (77, 512, 64, 48),
         (1000, 64, 16, 128)]


def random_inputs(rng, B, SH2, I, H):
    cols = SH2 + I + 1
    return dict(h=rng.standard_normal((B, SH2), dtype=np.float32),
                isv=rng.standard_normal(I, dtype=np.float32),
                e=np.abs(rng.standard_normal(B)).astype(np.float32),
                W1=(rng.standard_normal((H, cols)) / np.sqrt(cols)).astype(np.float32),
                b1=(0.1 * rng.standard_normal(H)).astype(np.float32),
                w2=(rng.standard_normal(H) / np.sqrt(H)).astype(np.float32),
                b2=0.3)


def on_gpu(inputs, to_device):
    return {k: to_device(v) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("B,SH2,I,H", SIZES)
def test_matches_float64_reference(rng, B, SH2, I, H, precision):
    inputs = random_inputs(rng, B, SH2, I, H)
    out = foxcute.risk_budget.forward(**on_gpu(inputs, cp.asarray), backend="cute", precision=precision)
    assert isinstance(out, cp.ndarray) and out.shape == (B,) and out.dtype == np.float32
    # the pre-sigmoid logit is what the matrix product determines; compare it too
    ref = foxcute.risk_budget.forward(**inputs)
    assert rel_err(out, ref) <= TOLERANCE[precision]
    logit = np.log(out.get().astype(np.float64)) - np.log1p(-out.get().astype(np.float64))
    assert rel_err(logit, np.log(ref) - np.log1p(-ref)) <= 5 * TOLERANCE[precision]


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_bit_identical_over_10_runs(rng, precision):
    inputs = on_gpu(random_inputs(rng, 65537, 256, 16, 64), cp.asarray)
    first = foxcute.risk_budget.forward(**inputs, backend="cute", precision=precision).get()
    for _ in range(9):
        again = foxcute.risk_budget.forward(**inputs, backend="cute", precision=precision)
        assert np.array_equal(again.get(), first)


def test_torch_tensors_and_peer(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed: torch interop untested")
    from foxcute.peers import risk_budget as peer

    inputs = random_inputs(rng, 1000, 256, 16, 64)
    out = foxcute.risk_budget.forward(**on_gpu(inputs, lambda a: torch.from_numpy(a).cuda()),
                                      backend="cute")
    assert isinstance(out, torch.Tensor) and out.is_cuda
    ref = foxcute.risk_budget.forward(**inputs)
    assert rel_err(out, ref) <= TOLERANCE["tf32"]
    peer_out = peer.forward(**on_gpu(inputs, lambda a: torch.from_numpy(a).cuda().double()))
    assert rel_err(peer_out, ref) <= 1e-12


def test_cuda_graph_replay_updates_output(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed: graph capture untested")
    inputs = random_inputs(rng, 8192, 256, 16, 64)
    args = on_gpu(inputs, lambda a: torch.from_numpy(a).cuda())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        foxcute.risk_budget.forward(**args, backend="cute")  # compile and warm up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = foxcute.risk_budget.forward(**args, backend="cute")
    for _ in range(3):
        fresh = random_inputs(rng, 8192, 256, 16, 64)
        fresh["b2"] = inputs["b2"]  # a scalar is baked into the graph
        for k, v in fresh.items():
            if isinstance(v, np.ndarray):
                args[k].copy_(torch.from_numpy(v))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, foxcute.risk_budget.forward(**fresh)) <= TOLERANCE["tf32"]


def test_rejects_unsupported_sizes_before_launch(rng):
    for B, SH2, I, H in [(10, 254, 16, 64), (10, 256, 16, 62), (10, 256, 16, 132), (10, 1024, 16, 64)]:
        inputs = on_gpu(random_inputs(rng, B, SH2, I, H), cp.asarray)
        with pytest.raises(FoxcuteInputError, match="multiple of|supported range"):
            foxcute.risk_budget.forward(**inputs, backend="cute")
