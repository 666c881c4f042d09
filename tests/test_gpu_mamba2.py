"""The Mamba2 kernels (impl "fused" and "seed", both precisions) on the H200 against the float64
reference: every output and gradient, at the default and at odd sizes, saturated gates and
sigma = 0, bit-identical gradients over repeats, sizes refused before launch, and CUDA-graph
capture whose replay follows new inputs."""

import numpy as np
import pytest

from foxcute import FoxcuteInputError, mamba2
from foxcute.lab import benchmarks
from foxcute.checks import TOLERANCE, rel_err

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

GRADS = ("dW_A", "dW_B", "dW_C", "dw", "dsigma", "dh_hist", "dh")
# (B, K, SH2, D): the defaults; then every B in {1, 7, 8191}, K in {1, 3, 8, 16}, D in
# {8, 16, 32} and SH2 in {64, 256, 512} at least once, with partial last tiles (64 % K != 0,
# B % (64 // K) != 0) and the widest shared-memory configuration (K=1, SH2=512, D=32).
SIZES = [
    (8192, 8, 256, 16),
    (1, 3, 64, 8),
    (7, 16, 512, 32),
    (8191, 1, 512, 32),
    (8191, 3, 256, 8),
    (1000, 5, 128, 16),
]


def random_inputs(rng, B, K, SH2, D, sigma=0.9):
    """a, u and c of order 1: weights scaled by 1/sqrt(SH2)."""
    f32 = np.float32
    return dict(
        h_hist=rng.standard_normal((B, K, SH2), dtype=f32),
        h=rng.standard_normal((B, SH2), dtype=f32),
        W_A=(rng.standard_normal((SH2, D)) / np.sqrt(SH2)).astype(f32),
        W_B=(rng.standard_normal((SH2, D)) / np.sqrt(SH2)).astype(f32),
        W_C=(rng.standard_normal((SH2, D)) / np.sqrt(SH2)).astype(f32),
        w=rng.standard_normal(SH2, dtype=f32),
        sigma=sigma,
    )


def saturated_inputs(rng, B, K, SH2, D, sigma):
    """a = +-20 exactly (the gates sit at sigmoid's flat ends): only row 0 of W_A is nonzero
    and column 0 of h_hist is +-1, both exact in TF32. At |a| = 20 float32's 1 - sigmoid(a)
    is already 0 (a kernel computing sigmoid' as s * (1 - s) loses every a > 0 slope),
    while the float64 reference's 0.5 * (1 + tanh(a / 2)) still gives sigmoid' to 4e-8
    (at |a| = 30 it is off by 1.7e-4, more than the float32 tolerance)."""
    x = random_inputs(rng, B, K, SH2, D, sigma)
    x["h_hist"][:, :, 0] = rng.choice(np.array([-1.0, 1.0], np.float32), size=(B, K))
    x["W_A"][:] = 0.0
    x["W_A"][0] = 20.0 * rng.choice(np.array([-1.0, 1.0], np.float32), size=D)
    return x


FORWARD, BACKWARD = (next(c for c in benchmarks.CASES if (c.layer, c.pass_) == ("mamba2", p))
                     for p in ("forward", "backward"))


def errors_against_reference(out, grads, inputs, dout):
    """Every output's error against the float64 reference (host inputs), as
    benchmarks.output_errors measures it: dsigma against max(|ref|, the norm of its terms)."""
    errors = benchmarks.output_errors(FORWARD, inputs, [out], benchmarks.reference(FORWARD, inputs))
    backward_inputs = {"dout": dout, **inputs}
    errors.update(benchmarks.output_errors(BACKWARD, backward_inputs, list(grads),
                                           benchmarks.reference(BACKWARD, backward_inputs)))
    return errors


def to_gpu(inputs):
    return {k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}


def check_against_reference(inputs, dout, impl, precision):
    gpu = to_gpu(inputs)
    out = mamba2.forward(**gpu, backend="cute", impl=impl, precision=precision)
    grads = mamba2.backward(cp.asarray(dout), **gpu, backend="cute", impl=impl, precision=precision)
    B, K, SH2 = inputs["h_hist"].shape
    D = inputs["W_A"].shape[1]
    shapes = dict(out=(B, SH2), dW_A=(SH2, D), dW_B=(SH2, D), dW_C=(SH2, D), dw=(SH2,), dsigma=(1,),
                  dh_hist=(B, K, SH2), dh=(B, SH2))
    for name, got in [("out", out), *((n, getattr(grads, n)) for n in GRADS)]:
        assert isinstance(got, cp.ndarray) and got.dtype == np.float32, name
        assert got.shape == shapes[name] or (name == "dsigma" and got.size == 1), name
    errors = errors_against_reference(out, grads, inputs, dout)
    bad = {k: e for k, e in errors.items() if not e <= TOLERANCE[precision]}
    assert not bad, f"rel errors over {TOLERANCE[precision]}: {bad} (all: {errors})"


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("impl", ["fused", "seed"])
@pytest.mark.parametrize("B,K,SH2,D", SIZES)
def test_forward_and_backward_match_float64(rng, B, K, SH2, D, impl, precision):
    inputs = random_inputs(rng, B, K, SH2, D)
    dout = rng.standard_normal((B, SH2), dtype=np.float32)
    check_against_reference(inputs, dout, impl, precision)


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("impl", ["fused", "seed"])
@pytest.mark.parametrize("sigma", [1.0, 0.0])
def test_saturated_gates_and_zero_sigma(rng, sigma, impl, precision):
    inputs = saturated_inputs(rng, 777, 8, 256, 16, sigma)
    dout = rng.standard_normal((777, 256), dtype=np.float32)
    check_against_reference(inputs, dout, impl, precision)


@pytest.mark.parametrize("impl", ["fused", "seed"])
def test_sigma_zero_keeps_only_the_last_input(rng, impl):
    # sigma = 0: x_K = u_{K-1}, so da = 0 exactly and dW_A is exactly zero
    inputs = to_gpu(random_inputs(rng, 300, 4, 64, 8, sigma=0.0))
    dout = cp.asarray(rng.standard_normal((300, 64), dtype=np.float32))
    grads = mamba2.backward(dout, **inputs, backend="cute", impl=impl, precision="fp32")
    assert not cp.any(grads.dW_A)
    assert cp.any(grads.dW_B) and cp.any(grads.dh_hist)


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("impl", ["fused", "seed"])
def test_bit_identical_over_10_runs(rng, impl, precision):
    inputs = to_gpu(random_inputs(rng, 8192, 8, 256, 16))
    dout = cp.asarray(rng.standard_normal((8192, 256), dtype=np.float32))
    first_out = mamba2.forward(**inputs, backend="cute", impl=impl, precision=precision).get()
    first = [g.get() for g in mamba2.backward(dout, **inputs, backend="cute", impl=impl, precision=precision)]
    for _ in range(9):
        out = mamba2.forward(**inputs, backend="cute", impl=impl, precision=precision)
        assert np.array_equal(out.get(), first_out)
        again = mamba2.backward(dout, **inputs, backend="cute", impl=impl, precision=precision)
        for name, g, f in zip(GRADS, again, first):
            assert np.array_equal(g.get(), f), name


def test_w_defaults_to_ones(rng):
    inputs = random_inputs(rng, 100, 8, 64, 8)
    ones = dict(inputs, w=np.ones(64, np.float32))
    gpu = to_gpu(inputs)
    del gpu["w"]
    out = mamba2.forward(**gpu, backend="cute")
    assert rel_err(out, mamba2.forward(**ones, backend="reference")) <= TOLERANCE["tf32"]


@pytest.mark.parametrize("sizes,match", [
    ((4, 8, 64, 12), "D=12"),
    ((4, 17, 64, 8), "K=17"),
    ((4, 8, 96, 8), "SH2=96"),
])
def test_rejects_unsupported_sizes_before_launch(rng, sizes, match):
    inputs = to_gpu(random_inputs(rng, *sizes))
    dout = cp.zeros((sizes[0], sizes[2]), np.float32)
    for impl in ("fused", "seed"):
        with pytest.raises(FoxcuteInputError, match=match):
            mamba2.forward(**inputs, backend="cute", impl=impl)
        with pytest.raises(FoxcuteInputError, match=match):
            mamba2.backward(dout, **inputs, backend="cute", impl=impl)


@pytest.mark.parametrize("impl", ["fused", "seed"])
def test_torch_cuda_graph_replay_follows_new_inputs(rng, impl):
    torch = pytest.importorskip("torch", reason="torch is needed for the CUDA-graph test")
    B, K, SH2, D = 4096, 8, 256, 16
    inputs = {k: torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v
              for k, v in random_inputs(rng, B, K, SH2, D).items()}
    dout = torch.randn(B, SH2, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        mamba2.forward(**inputs, backend="cute", impl=impl)
        mamba2.backward(dout, **inputs, backend="cute", impl=impl)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mamba2.forward(**inputs, backend="cute", impl=impl)
        grads = mamba2.backward(dout, **inputs, backend="cute", impl=impl)
    previous = None
    for _ in range(3):
        inputs["h_hist"].copy_(torch.randn_like(inputs["h_hist"]))
        inputs["h"].copy_(torch.randn_like(inputs["h"]))
        dout.copy_(torch.randn_like(dout))
        graph.replay()
        torch.cuda.synchronize()
        assert isinstance(out, torch.Tensor) and isinstance(grads.dh_hist, torch.Tensor)
        host = {k: v.cpu().numpy() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        errors = errors_against_reference(out, grads, host, dout.cpu().numpy())
        assert all(e <= TOLERANCE["tf32"] for e in errors.values()), errors
        now = out.cpu().numpy()
        assert previous is None or not np.array_equal(now, previous)  # the replay did run
        previous = now


def test_torch_peer_matches_float64(rng):
    torch = pytest.importorskip("torch", reason="the PyTorch peer needs torch")
    from foxcute.peers import mamba2 as peer

    inputs = random_inputs(rng, 513, 8, 256, 16)
    dout = rng.standard_normal((513, 256), dtype=np.float32)
    args = [torch.from_numpy(inputs[k]).cuda() for k in ("h_hist", "h", "W_A", "W_B", "W_C", "w")]
    ref_out = mamba2.forward(**inputs, backend="reference")
    ref = mamba2.backward(dout, **inputs, backend="reference")
    allow = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        out = peer.forward(*args, inputs["sigma"])
        grads = peer.backward(torch.from_numpy(dout).cuda(), *args, inputs["sigma"])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow
    assert rel_err(out, ref_out) <= TOLERANCE["fp32"]
    for name, got in zip(GRADS, grads):
        assert rel_err(got, getattr(ref, name)) <= TOLERANCE["fp32"], name
