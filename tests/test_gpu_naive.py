"""The naive ("before") backend on the H200: every layer against the float64 reference, at
odd small sizes and at the trainer's defaults (the naive Mamba2 backward at a reduced batch),
within the float32 tolerance of docs/layers.md section 8; results identical run to run."""

import math

import numpy as np
import pytest

from foxcute import curiosity, kan, mamba2, q_denoise, risk_budget
from foxcute.checks import TOLERANCE, rel_err
from foxcute.reduction import column_sum

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

TOL = TOLERANCE["fp32"]


def normal(rng, shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def on_gpu(arrays):
    return {k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}


def assert_matches(outs, refs, names):
    errors = {name: rel_err(out, ref) for name, out, ref in zip(names, outs, refs)}
    bad = {name: err for name, err in errors.items() if not err <= TOL}
    assert not bad, f"rel err above {TOL}: {bad} (all: {errors})"


def away_from_kinks(rows, preacts, redraw, margin=1e-3, tries=100):
    """Redraw the samples (rows) whose ReLU inputs lie within margin of 0, until none do: at a
    kink float32 and float64 can disagree on the mask, which moves a weight gradient by far
    more than the tolerance."""
    for _ in range(tries):
        bad = np.any(np.abs(preacts(rows)) < margin, axis=1)
        if not bad.any():
            return rows
        rows[bad] = redraw(int(bad.sum()))
    raise AssertionError("could not draw inputs away from the ReLU kinks")


# ------------------------------------------------------------------ column sum


@pytest.mark.parametrize("m, n", [(1, 1), (7, 3), (33, 128), (1000, 4096), (524288, 3), (524288, 128)])
def test_column_sum(rng, m, n):
    g = normal(rng, (m, n))
    out = column_sum(cp.asarray(g), backend="naive")
    assert isinstance(out, cp.ndarray) and out.shape == (n,) and out.dtype == np.float32
    assert_matches([out], [column_sum(g)], ["column_sum"])


# ------------------------------------------------------------------ Mamba2

MAMBA2_NAMES = ("dW_A", "dW_B", "dW_C", "dw", "dsigma", "dh_hist", "dh")


def mamba2_inputs(rng, B, K, SH2, D):
    return {"h_hist": normal(rng, (B, K, SH2)), "h": normal(rng, (B, SH2)),
            "W_A": normal(rng, (SH2, D), 1 / math.sqrt(SH2)),
            "W_B": normal(rng, (SH2, D), 1 / math.sqrt(SH2)),
            "W_C": normal(rng, (SH2, D), 1 / math.sqrt(SH2)),
            "w": 1 + normal(rng, (SH2,), 0.3), "sigma": 0.8, "dout": normal(rng, (B, SH2))}


@pytest.mark.parametrize("B, K, SH2, D", [(7, 3, 37, 5), (33, 8, 256, 16), (8192, 8, 256, 16)])
def test_mamba2_forward(rng, B, K, SH2, D):
    x = mamba2_inputs(rng, B, K, SH2, D)
    del x["dout"]
    out = mamba2.forward(**on_gpu(x), backend="naive")
    assert isinstance(out, cp.ndarray) and out.shape == (B, SH2) and out.dtype == np.float32
    assert_matches([out], [mamba2.forward(**x)], ["out"])


# The naive backward's per-weight loops make the trainer's batch of 8192 slow; 1024 keeps the
# default K, SH2 and D.
@pytest.mark.parametrize("B, K, SH2, D", [(7, 3, 37, 5), (33, 8, 256, 16), (1024, 8, 256, 16)])
def test_mamba2_backward(rng, B, K, SH2, D):
    x = mamba2_inputs(rng, B, K, SH2, D)
    grads = mamba2.backward(**on_gpu(x), backend="naive")
    assert grads.dsigma.shape == (1,) and grads.dh_hist.shape == (B, K, SH2)
    assert_matches(grads, mamba2.backward(**x), MAMBA2_NAMES)


def test_mamba2_backward_is_bit_identical_run_to_run(rng):
    x = on_gpu(mamba2_inputs(rng, 33, 8, 256, 16))
    first = [g.get() for g in mamba2.backward(**x, backend="naive")]
    again = [g.get() for g in mamba2.backward(**x, backend="naive")]
    for name, a, b in zip(MAMBA2_NAMES, first, again):
        assert np.array_equal(a, b), name


def test_mamba2_takes_torch_tensors(rng):
    torch = pytest.importorskip("torch")
    x = mamba2_inputs(rng, 7, 3, 37, 5)
    del x["dout"]
    gpu = {k: torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v for k, v in x.items()}
    out = mamba2.forward(**gpu, backend="naive")
    assert isinstance(out, torch.Tensor) and out.device == gpu["h"].device
    assert_matches([out], [mamba2.forward(**x)], ["out"])


# ------------------------------------------------------------------ Q-denoise


@pytest.mark.parametrize("B, A, H", [(7, 12, 24), (33, 5, 9), (8192, 12, 24)])
def test_q_denoise(rng, B, A, H):
    x = {"q_target": normal(rng, (B, A)), "W1": normal(rng, (H, A), 1 / math.sqrt(A)),
         "b1": normal(rng, (H,), 0.1), "W2": normal(rng, (A, H), 1 / math.sqrt(H)),
         "b2": normal(rng, (A,), 0.1)}
    x["q"] = away_from_kinks(normal(rng, (B, A)),
                             lambda q: q.astype(np.float64) @ x["W1"].T + x["b1"],
                             lambda n: normal(rng, (n, A)))
    loss, grads = q_denoise.loss_and_grads(**on_gpu(x), backend="naive")
    ref_loss, ref_grads = q_denoise.loss_and_grads(**x)
    assert loss.shape == (1,)
    assert_matches([loss, *grads], [ref_loss, *ref_grads], ("loss", *ref_grads._fields))


# ------------------------------------------------------------------ KAN


def kan_inputs(rng, B, I, O, G):
    return {"x": normal(rng, (B, I), 1.2), "C": normal(rng, (O, I * G)), "Wb": normal(rng, (O, I))}


@pytest.mark.parametrize("B, I, O, G", [(7, 3, 5, 4), (33, 32, 32, 8), (8192, 32, 32, 8)])
def test_kan_forward(rng, B, I, O, G):
    x = kan_inputs(rng, B, I, O, G)
    assert_matches([kan.forward(**on_gpu(x), backend="naive")], [kan.forward(**x)], ["y"])


@pytest.mark.parametrize("B, I, O, G", [(7, 3, 5, 4), (33, 32, 32, 8), (8192, 32, 32, 8)])
def test_kan_backward(rng, B, I, O, G):
    x = kan_inputs(rng, B, I, O, G)
    x["dy"] = normal(rng, (B, O))
    grads = kan.backward(**on_gpu(x), backend="naive")
    ref = kan.backward(**x)
    assert_matches(grads, ref, ref._fields)


# ------------------------------------------------------------------ curiosity


@pytest.mark.parametrize("B, F, A, H, index", [(7, 10, 3, 6, "int32"), (33, 256, 3, 128, "int64"),
                                               (8192, 256, 3, 128, "int64")])
def test_curiosity(rng, B, F, A, H, index):
    x = {"a": rng.integers(0, A, B).astype(index), "s_next": normal(rng, (B, F)),
         "W1": normal(rng, (H, F + A), 1 / math.sqrt(F + A)), "b1": normal(rng, (H,), 0.1),
         "W2": normal(rng, (F, H), 1 / math.sqrt(H)), "b2": normal(rng, (F,), 0.1)}
    W1 = x["W1"].astype(np.float64)
    x["s"] = away_from_kinks(normal(rng, (B, F)),
                             lambda s: s @ W1[:, :F].T + W1[:, F + x["a"]].T + x["b1"],
                             lambda n: normal(rng, (n, F)))
    loss, r, grads = curiosity.forward_backward(**on_gpu(x), backend="naive")
    ref_loss, ref_r, ref_grads = curiosity.forward_backward(**x)
    assert loss.shape == (1,) and r.shape == (B,)
    assert_matches([loss, r, *grads], [ref_loss, ref_r, *ref_grads], ("loss", "r", *ref_grads._fields))


# ------------------------------------------------------------------ risk budget


@pytest.mark.parametrize("B, SH2, I, H", [(7, 20, 4, 5), (33, 256, 16, 64), (8192, 256, 16, 64)])
def test_risk_budget(rng, B, SH2, I, H):
    cols = SH2 + I + 1
    x = {"h": normal(rng, (B, SH2)), "isv": normal(rng, (I,)), "e": np.abs(normal(rng, (B,))),
         "W1": normal(rng, (H, cols), 1 / math.sqrt(cols)), "b1": normal(rng, (H,), 0.1),
         "w2": normal(rng, (H,), 1 / math.sqrt(H)), "b2": 0.1}
    risk = risk_budget.forward(**on_gpu(x), backend="naive")
    assert risk.shape == (B,)
    assert_matches([risk], [risk_budget.forward(**x)], ["risk"])
