"""Curiosity forward+backward on the H200 (backend "cute"): every output and gradient against
the float64 reference at the defaults and odd sizes, both precisions, deterministic,
graph-capturable, bad sizes rejected before launch."""

import numpy as np
import pytest

import foxcute
from foxcute import curiosity
from foxcute.checks import TOLERANCE, rel_err

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

OUTPUTS = ("loss", "r", "dW1", "db1", "dW2", "db2", "ds")


def make_inputs(rng, batch, f, num_actions, h, action_dtype=np.int64):
    return dict(
        s=rng.standard_normal((batch, f), dtype=np.float32),
        a=rng.integers(0, num_actions, batch).astype(action_dtype),
        s_next=rng.standard_normal((batch, f), dtype=np.float32),
        W1=(rng.standard_normal((h, f + num_actions)) / np.sqrt(f + num_actions)).astype(np.float32),
        b1=(0.1 * rng.standard_normal(h)).astype(np.float32),
        W2=(rng.standard_normal((f, h)) / np.sqrt(h)).astype(np.float32),
        b2=(0.1 * rng.standard_normal(f)).astype(np.float32),
    )


def flatten(result):
    loss, r, grads = result
    return dict(zip(OUTPUTS, (loss, r, *grads)))


def run_cute(x, precision, xp=cp):
    return flatten(curiosity.forward_backward(**{k: xp.asarray(v) for k, v in x.items()},
                                              backend="cute", precision=precision))


# (B, F, A, H): the defaults; batch 1, 7, 8191, 65537; widths other than the defaults,
# A = 1 and the most actions; F = H = 512 (the 32-row-block variant); F + A odd; narrow
# widths over several CTAs, whose partials (F + H(A+1) + 1 = 129 columns, 16 rows) are the
# column_sum shape whose idle threads' stores raced the sums (db1, db2 lost a quarter).
SIZES = [(8192, 256, 3, 128), (1, 256, 3, 128), (7, 32, 1, 32), (8191, 96, 5, 160),
         (65537, 256, 3, 128), (300, 512, 16, 512), (1000, 128, 2, 64), (1000, 64, 1, 32),
         (1000, 32, 2, 32)]


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("batch,f,num_actions,h", SIZES)
def test_matches_float64_reference(rng, batch, f, num_actions, h, precision):
    x = make_inputs(rng, batch, f, num_actions, h, np.int64 if batch % 2 else np.int32)
    ref = flatten(curiosity.forward_backward(**x))
    out = run_cute(x, precision)
    for name in OUTPUTS:
        assert isinstance(out[name], cp.ndarray) and out[name].dtype == np.float32, name
        got = out[name].reshape(()) if name == "loss" else out[name]
        err = rel_err(got, ref[name])
        assert err <= TOLERANCE[precision], f"{name}: rel err {err:.3g} (precision {precision})"


@pytest.mark.parametrize("seed", range(20))
def test_tf32_within_budget_on_many_seeds_at_the_defaults(seed):
    """A z entry whose 3xTF32 sign differs from the float64 one moves ds by ~2.5e-3 at the
    defaults (seed 12: one such flip, ds 2.57e-3); before the exact-sign recompute about a
    third of the seeds had one (CPU emulation of the kernel's z with truncating MMAs: 40 of
    the first 129 seeds; here seeds 1, 3, 7, 9, 10, 12, 15, 18, 19)."""
    x = make_inputs(np.random.default_rng(seed), 8192, 256, 3, 128)
    ref = flatten(curiosity.forward_backward(**x))
    out = run_cute(x, "tf32")
    for name in OUTPUTS:
        got = out[name].reshape(()) if name == "loss" else out[name]
        err = rel_err(got, ref[name])
        assert err <= TOLERANCE["tf32"], f"seed {seed}, {name}: rel err {err:.3g}"


def near_zero_z_inputs(rng, batch=4096, f=256, num_actions=3, h=128):
    """Inputs whose z has, in each row r, one entry (r, c_r) within ~1e-8 |s_r| of 0: s[r, k_r]
    (k_r: the largest |W1s[c_r, k]|) solves z[r, c_r] = 0 in float64, then is rounded to
    float32. Rows scaled by 10^U(-2, 2), so that a row norm taken from another row would
    leave tau too small. Plus 64 rows of small dyadic values whose z[r, c_r] is exactly 0
    (every product and sum exact, in float32 too). Returns (inputs, z in float64, (rows, cols))."""
    x = make_inputs(rng, batch, f, num_actions, h)
    s, W1, b1, a = x["s"], x["W1"], x["b1"], x["a"]
    s *= (10.0 ** rng.uniform(-2, 2, (batch, 1))).astype(np.float32)
    exact = slice(0, 64)
    s[exact] = rng.integers(-8, 9, (64, f)) / 8
    W1[:] = rng.integers(-32, 33, W1.shape) / 64
    b1[:] = rng.integers(-32, 33, h) / 64
    rows = np.arange(batch)
    cols = rng.integers(0, h, batch)
    W1[:, 0] = 0.5  # the exact rows solve through k = 0: s[r, 0] = -rest / 0.5, dyadic
    k = np.argmax(np.abs(W1[cols, :f]), axis=1)
    k[exact] = 0
    for r, c, kk in zip(rows, cols, k):
        w = W1[c, :f].astype(np.float64)
        rest = s[r].astype(np.float64) @ w - s[r, kk] * w[kk] + b1[c] + W1[c, f + a[r]]
        s[r, kk] = np.float32(-rest / w[kk])
    s64, W64 = s.astype(np.float64), W1.astype(np.float64)
    z = s64 @ W64[:, :f].T + b1.astype(np.float64) + W64[:, f:][:, a].T
    return x, z, (rows, cols)


def test_tf32_relu_mask_is_the_float64_one_at_near_zero_z(rng):
    """The relu mask (hid > 0, and dz = 0 where it is off) equals the float64 reference's
    (z > 0) at every entry, including ~4000 entries within ~1e-8 |s_r| of 0, where 3xTF32 z
    (error ~1e-7 |s_r|) gets about half of the signs wrong, and 64 entries exactly 0."""
    from foxcute.kernels import curiosity as kernel

    x, z, (rows, cols) = near_zero_z_inputs(rng)
    assert np.all(z[rows[:64], cols[:64]] == 0)
    scale = np.linalg.norm(x["s"], axis=1)
    assert np.all(np.abs(z[rows, cols]) <= 1e-7 * scale)
    g = {k: cp.asarray(v) for k, v in x.items()}
    _, _, hid, _, dz, _ = kernel.row_pass_outputs(*g.values(), precision="tf32")
    batch = x["s"].shape[0]
    hid, dz = hid.get()[:, :batch].T, dz.get()[:, :batch].T  # TF32: K-major [H, Kp]
    mask = z > 0
    wrong = np.argwhere((hid > 0) != mask)
    assert len(wrong) == 0, f"{len(wrong)} mask entries differ, first (row, col, z): " + \
        ", ".join(f"({r}, {c}, {z[r, c]:.3g})" for r, c in wrong[:5])
    assert np.all(dz[~mask] == 0) and np.all(hid[~mask] == 0)
    ref = flatten(curiosity.forward_backward(**x))
    out = run_cute(x, "tf32")
    for name in ("dW1", "db1", "ds"):
        assert rel_err(out[name], ref[name]) <= TOLERANCE["tf32"], name


def test_actions_scatter_into_their_own_columns(rng):
    # Every row takes action 1: the gradient of W1's other action columns must be exactly 0.
    x = make_inputs(rng, 4099, 256, 3, 128)
    x["a"][:] = 1
    dW1 = run_cute(x, "fp32")["dW1"].get()
    assert np.all(dW1[:, 256] == 0) and np.all(dW1[:, 258] == 0) and np.any(dW1[:, 257] != 0)


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_bit_identical_over_10_runs(rng, precision):
    x = {k: cp.asarray(v) for k, v in make_inputs(rng, 8192, 256, 3, 128).items()}
    first = {k: v.get() for k, v in flatten(curiosity.forward_backward(**x, backend="cute",
                                                                       precision=precision)).items()}
    for _ in range(9):
        again = flatten(curiosity.forward_backward(**x, backend="cute", precision=precision))
        for name in OUTPUTS:
            assert np.array_equal(again[name].get(), first[name]), name


def test_torch_tensors_and_cuda_graph_replay_updates_outputs(rng):
    torch = pytest.importorskip("torch")
    x = {k: torch.from_numpy(v).cuda() for k, v in make_inputs(rng, 8192, 256, 3, 128).items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm outside the capture
        warm = flatten(curiosity.forward_backward(**x, backend="cute"))
    torch.cuda.current_stream().wait_stream(side)
    assert all(isinstance(v, torch.Tensor) and v.device == x["s"].device for v in warm.values())
    # Captured: the kernel module (what the layer dispatches to); the layer's own action-range
    # check reads the device, which a capture does not allow.
    from foxcute.kernels import curiosity as kernel

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss, r, *grads = kernel.forward_backward(*x.values(), precision="tf32")
    out = dict(zip(OUTPUTS, (loss, r, *grads)))
    for _ in range(3):
        fresh = make_inputs(rng, 8192, 256, 3, 128)
        for name in ("s", "a", "s_next"):
            x[name].copy_(torch.from_numpy(fresh[name]))
        graph.replay()
        torch.cuda.synchronize()
        ref = flatten(curiosity.forward_backward(**{k: v.cpu().numpy() for k, v in x.items()}))
        for name in OUTPUTS:
            got = out[name].reshape(()) if name == "loss" else out[name]
            assert rel_err(got, ref[name]) <= TOLERANCE["tf32"], name


def test_pytorch_peer_matches_reference(rng):
    torch = pytest.importorskip("torch")
    from foxcute.peers import curiosity as peer

    x = make_inputs(rng, 1000, 256, 3, 128)
    got = peer.forward_backward(*(torch.from_numpy(v).cuda().double() if v.dtype.kind == "f"
                                  else torch.from_numpy(v).cuda() for v in x.values()))
    ref = flatten(curiosity.forward_backward(**x))
    for name, value in zip(OUTPUTS, got):
        assert rel_err(value.reshape(()) if name == "loss" else value, ref[name]) <= 1e-12, name


@pytest.mark.parametrize("batch,f,num_actions,h,match", [
    (64, 100, 3, 128, "F=100"),     # not a multiple of 32
    (64, 256, 3, 96 + 8, "H=104"),
    (64, 544, 3, 128, "F=544"),     # over 512
    (64, 256, 17, 128, "A=17"),
])
def test_rejects_unsupported_sizes_before_launch(rng, batch, f, num_actions, h, match):
    x = {k: cp.asarray(v) for k, v in make_inputs(rng, batch, f, num_actions, h).items()}
    with pytest.raises(foxcute.FoxcuteInputError, match=match):
        curiosity.forward_backward(**x, backend="cute")
