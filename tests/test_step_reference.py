"""The synthetic training step on the reference backend."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SMALL_STEP
from foxcute import BackendError, curiosity, risk_budget, step

SIZES = step.StepSizes(**SMALL_STEP)


def test_defaults_are_the_trainers():
    n = step.StepSizes()
    assert (n.B, n.K, n.SH2, n.D, n.Q, n.A_q, n.H_q, n.F, n.A, n.H_c) == (8192, 8, 256, 16, 64, 12, 24, 256, 3, 128)
    assert (n.I_risk, n.H_risk, n.I_kan, n.O_kan, n.G_kan, n.H_iqn) == (16, 64, 32, 32, 8, 128)


def test_inputs_are_float32_and_actions_in_range(ran):
    inputs, _ = ran
    for layer, arrays in inputs.items():
        for name, value in arrays.items():
            if name == "a":
                assert value.dtype == np.int32 and value.min() >= 0 and value.max() < SIZES.A
            elif isinstance(value, np.ndarray):
                assert value.dtype == np.float32, f"{layer}.{name}"


def test_outputs_have_the_right_shapes_and_are_finite(ran):
    _, out = ran
    n = SIZES
    expected = {
        "mamba2.out": (n.B, n.SH2), "curiosity.loss": (), "curiosity.r": (n.B,),
        "curiosity.dW1": (n.H_c, n.F + n.A), "curiosity.db1": (n.H_c,), "curiosity.dW2": (n.F, n.H_c),
        "curiosity.db2": (n.F,), "curiosity.ds": (n.B, n.F), "risk_budget.risk": (n.B,),
        "q_denoise.loss": (), "q_denoise.dW1": (n.H_q, n.A_q), "q_denoise.db1": (n.H_q,),
        "q_denoise.dW2": (n.A_q, n.H_q), "q_denoise.db2": (n.A_q,), "q_denoise.dq": (n.B, n.A_q),
        "iqn.head_bias_grad": (n.A,), "iqn.hidden_bias_grad": (n.H_iqn,),
        "kan.dC": (n.O_kan, n.I_kan * n.G_kan), "kan.dWb": (n.O_kan, n.I_kan), "kan.dx": (n.B, n.I_kan),
        "mamba2.dW_A": (n.SH2, n.D), "mamba2.dW_B": (n.SH2, n.D), "mamba2.dW_C": (n.SH2, n.D),
        "mamba2.dw": (n.SH2,), "mamba2.dsigma": (), "mamba2.dh_hist": (n.B, n.K, n.SH2), "mamba2.dh": (n.B, n.SH2),
    }
    assert set(out) == set(expected)
    for name, shape in expected.items():
        assert np.shape(out[name]) == shape, name
        assert np.all(np.isfinite(out[name])), name


def curiosity_r(inputs, s):
    """curiosity's per-sample r on state s, by the layer's own float64 reference."""
    c = inputs["curiosity"]
    _, r, _ = curiosity.reference_forward_backward(
        s, c["a"], *(c[k].astype(np.float64) for k in ("s_next", "W1", "b1", "W2", "b2")))
    return r


def risk(inputs, h, e):
    """The risk head on trunk h and prediction error e, by its own float64 reference."""
    rb = inputs["risk_budget"]
    return risk_budget.reference_forward(h, rb["isv"].astype(np.float64), e,
                                         *(rb[k].astype(np.float64) for k in ("W1", "b1", "w2")), rb["b2"])


def test_chain_feeds_mamba2_output_to_curiosity_and_r_to_risk(ran):
    inputs, out = ran
    rb = inputs["risk_budget"]
    r = curiosity_r(inputs, out["mamba2.out"])
    np.testing.assert_array_equal(out["curiosity.r"], r)
    np.testing.assert_array_equal(out["risk_budget.risk"], risk(inputs, out["mamba2.out"], r))
    # e = r matters: with e = 0 the risk differs
    zero_e = risk_budget.forward(out["mamba2.out"], rb["isv"], np.zeros(SIZES.B), rb["W1"], rb["b1"], rb["w2"], rb["b2"])
    assert not np.allclose(zero_e, out["risk_budget.risk"])


def test_reference_given_recomputes_only_the_chained_layers_from_the_given_values(ran):
    inputs, out = ran
    assert all(np.array_equal(v, out[k]) for k, v in step.reference_given(out, inputs, out).items())
    moved = {**out, "mamba2.out": out["mamba2.out"] + 0.01, "curiosity.r": out["curiosity.r"] * 2}
    given = step.reference_given(out, inputs, moved)
    changed = {k for k in out if not np.array_equal(given[k], out[k])}
    assert changed == {k for k in out if k.startswith(("curiosity.", "risk_budget."))}
    np.testing.assert_array_equal(given["curiosity.r"], curiosity_r(inputs, moved["mamba2.out"]))
    np.testing.assert_array_equal(given["risk_budget.risk"], risk(inputs, moved["mamba2.out"], moved["curiosity.r"]))


def test_iqn_bias_grads_are_column_sums(ran):
    inputs, out = ran
    iqn = inputs["iqn"]
    assert iqn["head_grad"].shape == (SIZES.B * SIZES.Q, SIZES.A)
    np.testing.assert_allclose(out["iqn.head_bias_grad"], iqn["head_grad"].astype(np.float64).sum(0), rtol=1e-12)
    np.testing.assert_allclose(out["iqn.hidden_bias_grad"], iqn["hidden_grad"].astype(np.float64).sum(0),
                               rtol=1e-12)


def test_step_rejects_unknown_backend(ran):
    inputs, _ = ran
    with pytest.raises(BackendError, match=r"backend 'tpu' is not offered; available: 'reference'"):
        step.run(inputs, backend="tpu")


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="G_kan must be >= 2"):
        step.StepSizes(G_kan=1)
    with pytest.raises(ValueError, match="StepSizes.B must be >= 1"):
        step.StepSizes(B=0)
