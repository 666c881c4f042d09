"""Q-denoise loss and gradients on the H200 (backend "cute"): every output against the float64
reference at the defaults and odd sizes, both precisions, bit-identical, graph-capturable."""

import numpy as np
import pytest

import foxcute
from foxcute import FoxcuteInputError
from foxcute.checks import TOLERANCE, rel_err

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

NAMES = ("loss", "dW1", "db1", "dW2", "db2", "dq")
# (B, A, H): defaults, batch 1 / 7 / one short of and one past a CTA multiple, other widths.
# On an H200 (132 SMs) the finish is spread over the CTAs up to B = 8448 (132 CTAs of 64
# samples), two-level from 8449 on.
SIZES = [(8192, 12, 24), (1, 12, 24), (7, 12, 24), (8191, 12, 24), (65537, 12, 24),
         (8448, 12, 24), (8449, 12, 24), (100, 5, 7), (333, 12, 40), (130, 32, 32), (65, 1, 1)]


def random_inputs(rng, B, A, H):
    return dict(q=rng.standard_normal((B, A), dtype=np.float32),
                q_target=rng.standard_normal((B, A), dtype=np.float32),
                W1=(rng.standard_normal((H, A)) / np.sqrt(A)).astype(np.float32),
                b1=(0.1 * rng.standard_normal(H)).astype(np.float32),
                W2=(rng.standard_normal((A, H)) / np.sqrt(H)).astype(np.float32),
                b2=(0.1 * rng.standard_normal(A)).astype(np.float32))


def flat(result):
    loss, grads = result
    return (loss, *grads)


def run(inputs, xp_asarray, precision):
    args = {k: xp_asarray(v) for k, v in inputs.items()}
    return flat(foxcute.q_denoise.loss_and_grads(**args, backend="cute", precision=precision))


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("B,A,H", SIZES)
def test_matches_float64_reference(rng, B, A, H, precision):
    inputs = random_inputs(rng, B, A, H)
    out = run(inputs, cp.asarray, precision)
    ref = flat(foxcute.q_denoise.loss_and_grads(**inputs))
    for name, o, r in zip(NAMES, out, ref):
        assert isinstance(o, cp.ndarray) and o.dtype == np.float32, name
        assert o.size == np.size(r), name
        assert rel_err(o, r) <= TOLERANCE[precision], (name, rel_err(o, r))


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("B", [8192, 65537])  # both finishes
def test_bit_identical_over_10_runs(rng, precision, B):
    inputs = {k: cp.asarray(v) for k, v in random_inputs(rng, B, 12, 24).items()}
    first = [o.get() for o in flat(foxcute.q_denoise.loss_and_grads(**inputs, backend="cute",
                                                                     precision=precision))]
    for _ in range(9):
        again = flat(foxcute.q_denoise.loss_and_grads(**inputs, backend="cute", precision=precision))
        for name, a, b in zip(NAMES, again, first):
            assert np.array_equal(a.get(), b), name


@pytest.mark.parametrize("B", [8192, 65537])
def test_leaves_its_tickets_at_zero(rng, B):
    # The finish counts CTAs on tickets from the shared pool (spread: one counter; two-level:
    # one a group and the final one); they must be zero again after the launch, or the launch
    # that next gets that pool slot would miscount.
    from foxcute.kernels import _cute

    inputs = {k: cp.asarray(v) for k, v in random_inputs(rng, B, 12, 24).items()}
    foxcute.q_denoise.loss_and_grads(**inputs, backend="cute")  # the pool exists now
    pool = _cute._ticket_pools[("cupy", inputs["q"].device.id)]
    for _ in range(3):
        slot = pool[1]  # the slot this launch takes
        foxcute.q_denoise.loss_and_grads(**inputs, backend="cute")
        cp.cuda.Device().synchronize()
        assert not cp.any(pool[0][_cute.TICKETS_PER_LAUNCH * slot:_cute.TICKETS_PER_LAUNCH * (slot + 1)])


def test_torch_tensors_round_trip(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed: torch interop untested")
    inputs = random_inputs(rng, 1000, 12, 24)
    out = run(inputs, lambda a: torch.from_numpy(a).cuda(), "tf32")
    ref = flat(foxcute.q_denoise.loss_and_grads(**inputs))
    for name, o, r in zip(NAMES, out, ref):
        assert isinstance(o, torch.Tensor) and o.is_cuda, name
        assert rel_err(o, r) <= TOLERANCE["tf32"], name


def test_torch_peer_matches_reference(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed: the peer is untested")
    from foxcute.peers import q_denoise as peer

    inputs = random_inputs(rng, 513, 12, 24)
    out = peer.loss_and_grads(*(torch.from_numpy(v).cuda().double() for v in inputs.values()))
    ref = flat(foxcute.q_denoise.loss_and_grads(**inputs))
    for name, o, r in zip(NAMES, out, ref):
        assert rel_err(o, r) <= 1e-12, name


def test_cuda_graph_replay_updates_outputs(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed: graph capture untested")
    inputs = random_inputs(rng, 8192, 12, 24)
    args = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        foxcute.q_denoise.loss_and_grads(**args, backend="cute")  # compile and warm up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flat(foxcute.q_denoise.loss_and_grads(**args, backend="cute"))
    for _ in range(3):
        fresh = random_inputs(rng, 8192, 12, 24)
        for k, v in fresh.items():
            args[k].copy_(torch.from_numpy(v))
        graph.replay()
        torch.cuda.synchronize()
        ref = flat(foxcute.q_denoise.loss_and_grads(**fresh))
        for name, o, r in zip(NAMES, out, ref):
            assert rel_err(o, r) <= TOLERANCE["tf32"], name
    # Replays of unchanged inputs give the eager call's bits: the in-launch sums run in a
    # fixed order and every replay finds its tickets reset by the one before.
    eager = [o.clone() for o in flat(foxcute.q_denoise.loss_and_grads(**args, backend="cute"))]
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        for name, o, e in zip(NAMES, out, eager):
            assert torch.equal(o, e), name


def test_rejects_unsupported_sizes_before_launch(rng):
    for B, A, H in [(10, 33, 24), (10, 12, 65), (10, 32, 33)]:
        inputs = {k: cp.asarray(v) for k, v in random_inputs(rng, B, A, H).items()}
        with pytest.raises(FoxcuteInputError, match="supported range"):
            foxcute.q_denoise.loss_and_grads(**inputs, backend="cute")
