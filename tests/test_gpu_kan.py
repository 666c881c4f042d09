"""KAN forward and backward on the H200 (backend "cute"): every output against the float64
reference at the defaults and odd sizes, both precisions, bit-identical, graph-capturable."""

import numpy as np
import pytest

import foxcute
from foxcute import FoxcuteInputError
from foxcute.checks import TOLERANCE, rel_err

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

# (B, I, O, G): defaults, batch 1 / 7 / around CTA multiples, other widths and grids (the last:
# the TF32 backward's 16-row warps, spread over 66 CTAs). On an H200 (132 SMs) the TF32
# backward's finish is spread up to B = 8448 (33 chunks of 256 rows x 4 blocks), whose slices
# take 1, 2, 4 or 8 parts a vector at 4, 8, 16 and 32 chunks; two-level from 8449 on.
SIZES = [(8192, 32, 32, 8), (1, 32, 32, 8), (7, 32, 32, 8), (8191, 32, 32, 8), (65537, 32, 32, 8),
         (1000, 32, 32, 8), (2000, 32, 32, 8), (4000, 32, 32, 8), (8448, 32, 32, 8), (8449, 32, 32, 8),
         (100, 5, 6, 3), (50, 16, 48, 12), (129, 1, 2, 2), (300, 64, 16, 4), (4097, 16, 48, 12)]


def random_inputs(rng, B, I, O, G):
    return dict(x=(1.5 * rng.standard_normal((B, I))).astype(np.float32),
                C=(rng.standard_normal((O, I * G)) / np.sqrt(I * G)).astype(np.float32),
                Wb=(rng.standard_normal((O, I)) / np.sqrt(I)).astype(np.float32))


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("B,I,O,G", SIZES)
def test_forward_matches_float64_reference(rng, B, I, O, G, precision):
    inputs = random_inputs(rng, B, I, O, G)
    y = foxcute.kan.forward(**{k: cp.asarray(v) for k, v in inputs.items()}, backend="cute",
                            precision=precision)
    assert isinstance(y, cp.ndarray) and y.shape == (B, O) and y.dtype == np.float32
    assert rel_err(y, foxcute.kan.forward(**inputs)) <= TOLERANCE[precision]


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("B,I,O,G", SIZES)
def test_backward_matches_float64_reference(rng, B, I, O, G, precision):
    inputs = random_inputs(rng, B, I, O, G)
    dy = rng.standard_normal((B, O), dtype=np.float32)
    out = foxcute.kan.backward(cp.asarray(dy), **{k: cp.asarray(v) for k, v in inputs.items()},
                               backend="cute", precision=precision)
    ref = foxcute.kan.backward(dy, **inputs)
    for name, o, r in zip(("dC", "dWb", "dx"), out, ref):
        assert isinstance(o, cp.ndarray) and o.shape == r.shape and o.dtype == np.float32, name
        assert rel_err(o, r) <= TOLERANCE[precision], (name, rel_err(o, r))


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("B", [8192, 65537])  # the TF32 backward's two finishes
def test_bit_identical_over_10_runs(rng, precision, B):
    inputs = {k: cp.asarray(v) for k, v in random_inputs(rng, B, 32, 32, 8).items()}
    dy = cp.asarray(rng.standard_normal((B, 32), dtype=np.float32))
    y0 = foxcute.kan.forward(**inputs, backend="cute", precision=precision).get()
    g0 = [g.get() for g in foxcute.kan.backward(dy, **inputs, backend="cute", precision=precision)]
    for _ in range(9):
        assert np.array_equal(foxcute.kan.forward(**inputs, backend="cute", precision=precision).get(), y0)
        grads = foxcute.kan.backward(dy, **inputs, backend="cute", precision=precision)
        for name, a, b in zip(("dC", "dWb", "dx"), grads, g0):
            assert np.array_equal(a.get(), b), name


def test_torch_tensors_and_peer(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed: torch interop untested")
    from foxcute.peers import kan as peer

    inputs = random_inputs(rng, 1000, 32, 32, 8)
    dy = rng.standard_normal((1000, 32), dtype=np.float32)
    t = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
    y = foxcute.kan.forward(**t, backend="cute")
    assert isinstance(y, torch.Tensor) and y.is_cuda
    assert rel_err(y, foxcute.kan.forward(**inputs)) <= TOLERANCE["tf32"]
    grads = foxcute.kan.backward(torch.from_numpy(dy).cuda(), **t, backend="cute")
    ref = foxcute.kan.backward(dy, **inputs)
    for o, r in zip(grads, ref):
        assert isinstance(o, torch.Tensor) and rel_err(o, r) <= TOLERANCE["tf32"]
    t64 = {k: v.double() for k, v in t.items()}
    assert rel_err(peer.forward(**t64), foxcute.kan.forward(**inputs)) <= 1e-12
    for o, r in zip(peer.backward(torch.from_numpy(dy).cuda().double(), **t64), ref):
        assert rel_err(o, r) <= 1e-12


def test_cuda_graph_replay_updates_outputs(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed: graph capture untested")
    inputs = random_inputs(rng, 8192, 32, 32, 8)
    args = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
    dy = torch.from_numpy(rng.standard_normal((8192, 32), dtype=np.float32)).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        foxcute.kan.forward(**args, backend="cute")  # compile and warm up
        foxcute.kan.backward(dy, **args, backend="cute")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = foxcute.kan.forward(**args, backend="cute")
        grads = foxcute.kan.backward(dy, **args, backend="cute")
    for _ in range(3):
        fresh = random_inputs(rng, 8192, 32, 32, 8)
        fresh_dy = rng.standard_normal((8192, 32), dtype=np.float32)
        for k, v in fresh.items():
            args[k].copy_(torch.from_numpy(v))
        dy.copy_(torch.from_numpy(fresh_dy))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(y, foxcute.kan.forward(**fresh)) <= TOLERANCE["tf32"]
        for o, r in zip(grads, foxcute.kan.backward(fresh_dy, **fresh)):
            assert rel_err(o, r) <= TOLERANCE["tf32"]


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_cupy_graph_replay_of_backward_updates_grads(rng, precision):
    # In a graph, tf32: one launch whose tickets are reset by its finishers for the next replay;
    # fp32: the grad reduce is a programmatic dependent launch of the backward kernel and must
    # still see every partial of the replay it belongs to.
    from foxcute.lab import timing

    inputs = {k: cp.asarray(v) for k, v in random_inputs(rng, 8192, 32, 32, 8).items()}
    dy = cp.asarray(rng.standard_normal((8192, 32), dtype=np.float32))
    lib = timing._backend("cupy")

    def backward():
        return foxcute.kan.backward(dy, **inputs, backend="cute", precision=precision)

    lib.run_on_stream(backward, 2)
    graph, grads = lib.capture(backward)
    for _ in range(3):
        fresh = random_inputs(rng, 8192, 32, 32, 8)
        fresh_dy = rng.standard_normal((8192, 32), dtype=np.float32)
        for k, v in fresh.items():
            inputs[k].set(v)
        dy.set(fresh_dy)
        lib.synchronize()
        lib.replay(graph)
        lib.synchronize()
        for name, o, r in zip(("dC", "dWb", "dx"), grads, foxcute.kan.backward(fresh_dy, **fresh)):
            assert rel_err(o, r) <= TOLERANCE[precision], name


@pytest.mark.parametrize("rows,O,I,G", [(1, 32, 32, 8), (7, 6, 5, 3), (1025, 48, 16, 12)])
def test_grad_reduce_adds_every_row_once_into_place(rows, O, I, G):
    # The fp32 backward's grad reduce. Small integers, so float32 sums are exact: a dropped,
    # doubled or misplaced row or column shows up as an exact mismatch. Partial column
    # o*FP + g*IP + i holds dC[o, i*G+g] (g < G) or dWb[o, i] (g == G); others are padding.
    from foxcute.kernels import _cute, kan as kernels

    layout = kernels.GradLayout(O, I, G)
    partials = (np.arange(rows)[:, None] % 7 + np.arange(layout.partial_len)[None, :] % 5).astype(np.float32)
    totals = partials.astype(np.float64).sum(0)
    p = cp.asarray(partials)
    sums = cp.full(layout.sums_len, np.nan, np.float32)
    kernels._compile_reduce(layout)(_cute.gmem_ptr(p), _cute.gmem_ptr(sums), kernels.Int32(rows),
                                    _cute.current_stream(p))
    by_feature = totals.reshape(layout.OP, layout.FP)[:O, :(G + 1) * layout.IP]
    by_feature = by_feature.reshape(O, G + 1, layout.IP)[:, :, :I]  # [o, g, i]
    dC = by_feature[:, :G, :].transpose(0, 2, 1).reshape(O, I * G)  # C's order: i*G + g
    dWb = by_feature[:, G, :]
    out = sums.get()
    np.testing.assert_array_equal(out[:O * I * G], dC.astype(np.float32).ravel())
    np.testing.assert_array_equal(out[layout.dwb_at:], dWb.astype(np.float32).ravel())


@pytest.mark.parametrize("B,I,O,G", [(65537, 32, 32, 8), (4097, 16, 48, 12), (8192, 32, 32, 8)])
def test_tf32_backward_leaves_its_tickets_at_zero(rng, B, I, O, G):
    # The one-launch TF32 backward counts finished CTAs on tickets from the shared pool
    # (two-level: several groups per input block at 65537; spread: one counter a block, at
    # the others); its finishers must reset them, or the launch that next gets that pool slot
    # would see a wrong count.
    from foxcute.kernels import _cute

    inputs = {k: cp.asarray(v) for k, v in random_inputs(rng, B, I, O, G).items()}
    dy = cp.asarray(rng.standard_normal((B, O), dtype=np.float32))
    foxcute.kan.backward(dy, **inputs, backend="cute", precision="tf32")  # the pool exists now
    pool = _cute._ticket_pools[("cupy", dy.device.id)]
    for _ in range(3):
        slot = pool[1]  # the slot this launch takes
        foxcute.kan.backward(dy, **inputs, backend="cute", precision="tf32")
        cp.cuda.Device().synchronize()
        used = pool[0][_cute.TICKETS_PER_LAUNCH * slot:_cute.TICKETS_PER_LAUNCH * (slot + 1)]
        assert not cp.any(used), used.get()


def test_rejects_unsupported_sizes_before_launch(rng):
    for B, I, O, G in [(10, 32, 33, 8), (10, 32, 32, 16), (10, 128, 32, 8)]:
        inputs = {k: cp.asarray(v) for k, v in random_inputs(rng, B, I, O, G).items()}
        with pytest.raises(FoxcuteInputError):
            foxcute.kan.forward(**inputs, backend="cute")
