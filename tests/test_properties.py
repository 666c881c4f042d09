"""Properties of the references over random sizes (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from foxcute import column_sum, curiosity, kan, mamba2, q_denoise, risk_budget

SETTINGS = settings(max_examples=20, deadline=None)
size = st.integers(1, 9)
seed = st.integers(0, 2**32 - 1)


@SETTINGS
@given(M=st.integers(1, 40), N=size, seed=seed)
def test_column_sum_is_the_row_sum(M, N, seed):
    G = np.random.default_rng(seed).standard_normal((M, N)).astype(np.float32)
    expected = np.zeros(N)
    for row in G.astype(np.float64):
        expected += row
    out = column_sum(G)
    assert out.dtype == np.float64 and out.shape == (N,)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


@SETTINGS
@given(B=size, K=size, SH2=size, D=size, sigma=st.floats(0.1, 1.5), seed=seed)
def test_mamba2_forward_is_affine_in_w(B, K, SH2, D, sigma, seed):
    """out - h = ctx * w: linear in w, and w=None is w = ones."""
    rng = np.random.default_rng(seed)
    h_hist, h = rng.standard_normal((B, K, SH2)), rng.standard_normal((B, SH2))
    W = [rng.standard_normal((SH2, D)) / np.sqrt(SH2) for _ in range(3)]
    w1, w2 = rng.standard_normal(SH2), rng.standard_normal(SH2)
    part = [mamba2.forward(h_hist, h, *W, w, sigma) - h for w in (w1, w2, w1 + 3 * w2)]
    np.testing.assert_allclose(part[2], part[0] + 3 * part[1], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(mamba2.forward(h_hist, h, *W, None, sigma),
                                  mamba2.forward(h_hist, h, *W, np.ones(SH2), sigma))


@SETTINGS
@given(B=size, K=size, SH2=size, D=size, seed=seed)
def test_mamba2_backward_shapes_and_dout_linearity(B, K, SH2, D, seed):
    rng = np.random.default_rng(seed)
    args = (rng.standard_normal((B, K, SH2)), rng.standard_normal((B, SH2)),
            *(rng.standard_normal((SH2, D)) for _ in range(3)), rng.standard_normal(SH2), 0.9)
    dout = rng.standard_normal((B, SH2))
    grads = mamba2.backward(dout, *args)
    for (name, g), shape in zip(grads._asdict().items(),
                                [(SH2, D)] * 3 + [(SH2,), (), (B, K, SH2), (B, SH2)]):
        assert np.shape(g) == shape, name
        assert np.all(np.isfinite(g)), name
    doubled = mamba2.backward(2 * dout, *args)
    for g, g2 in zip(grads, doubled):
        np.testing.assert_allclose(g2, 2 * np.asarray(g), rtol=1e-9, atol=1e-12)


@SETTINGS
@given(B=size, SH2=size, I=size, H=size, scale=st.floats(0.01, 3.0), seed=seed)
def test_risk_lies_in_the_open_unit_interval(B, SH2, I, H, scale, seed):
    """At trainer-like scales (weights ~ 1/sqrt(fan-in)); float64 saturates only past |logit| ~ 37."""
    rng = np.random.default_rng(seed)
    W1 = rng.standard_normal((H, SH2 + I + 1)) / np.sqrt(SH2 + I + 1)
    risk = risk_budget.forward(scale * rng.standard_normal((B, SH2)), rng.standard_normal(I), rng.random(B),
                               W1, rng.standard_normal(H), rng.standard_normal(H) / np.sqrt(H),
                               float(rng.standard_normal()))
    assert risk.shape == (B,)
    assert np.all((risk > 0) & (risk < 1))


@SETTINGS
@given(B=size, A=size, H=size, seed=seed)
def test_q_denoise_loss_nonnegative_and_grads_finite(B, A, H, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, A))
    W1, b1, W2, b2 = rng.standard_normal((H, A)), rng.standard_normal(H), rng.standard_normal((A, H)), rng.standard_normal(A)
    loss, grads = q_denoise.loss_and_grads(q, q + 0.1 * rng.standard_normal((B, A)), W1, b1, W2, b2)
    assert loss >= 0
    for g, like in zip(grads, (W1, b1, W2, b2, q)):
        assert g.shape == like.shape and np.all(np.isfinite(g))
    # the loss is zero exactly when the target is the prediction, and so is every gradient
    y = np.maximum(q @ W1.T + b1, 0) @ W2.T + b2
    loss0, grads0 = q_denoise.loss_and_grads(q, y, W1, b1, W2, b2)
    assert loss0 == 0.0 and all(np.all(g == 0) for g in grads0)


@SETTINGS
@given(B=size, I=size, O=size, G=st.integers(2, 9), seed=seed)
def test_kan_shapes_and_basis_partition(B, I, O, G, seed):
    rng = np.random.default_rng(seed)
    x, C, Wb, dy = (rng.standard_normal((B, I)), rng.standard_normal((O, I * G)), rng.standard_normal((O, I)),
                    rng.standard_normal((B, O)))
    y = kan.forward(x, C, Wb)
    grads = kan.backward(dy, x, C, Wb)
    assert y.shape == (B, O)
    assert grads.dC.shape == C.shape and grads.dWb.shape == Wb.shape and grads.dx.shape == x.shape
    # with C = 0 only the silu branch is left
    np.testing.assert_allclose(kan.forward(x, np.zeros_like(C), Wb), (x / (1 + np.exp(-x))) @ Wb.T,
                               rtol=1e-12, atol=1e-12)


@SETTINGS
@given(B=size, F=size, A=st.integers(1, 4), H=size, seed=seed)
def test_curiosity_shapes_and_loss_is_mean_r(B, F, A, H, seed):
    rng = np.random.default_rng(seed)
    s, s_next, a = rng.standard_normal((B, F)), rng.standard_normal((B, F)), rng.integers(0, A, B)
    W1, b1, W2, b2 = (rng.standard_normal((H, F + A)), rng.standard_normal(H), rng.standard_normal((F, H)),
                      rng.standard_normal(F))
    loss, r, grads = curiosity.forward_backward(s, a, s_next, W1, b1, W2, b2)
    assert r.shape == (B,) and np.all(r >= 0)
    assert loss == np.float64(r.mean())
    for g, like in zip(grads, (W1, b1, W2, b2, s)):
        assert g.shape == like.shape and np.all(np.isfinite(g))
