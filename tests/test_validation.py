"""Bad calls fail before any work, with a message that names the argument, what was
expected and what was given."""

from __future__ import annotations

import numpy as np
import pytest

from foxcute import BackendError, FoxcuteInputError, column_sum, curiosity, kan, mamba2, q_denoise, risk_budget
from foxcute.reduction import MAX_N


def mamba2_args(B=3, K=2, SH2=5, D=4):
    z = np.zeros
    return dict(h_hist=z((B, K, SH2)), h=z((B, SH2)), W_A=z((SH2, D)), W_B=z((SH2, D)), W_C=z((SH2, D)),
                w=z(SH2), sigma=1.0)


def q_denoise_args(B=3, A=4, H=5):
    z = np.zeros
    return dict(q=z((B, A)), q_target=z((B, A)), W1=z((H, A)), b1=z(H), W2=z((A, H)), b2=z(A))


def kan_args(B=3, I=4, O=2, G=3):
    z = np.zeros
    return dict(x=z((B, I)), C=z((O, I * G)), Wb=z((O, I)))


def curiosity_args(B=3, F=5, A=3, H=4):
    z = np.zeros
    return dict(s=z((B, F)), a=np.zeros(B, dtype=np.int64), s_next=z((B, F)), W1=z((H, F + A)), b1=z(H),
                W2=z((F, H)), b2=z(F))


def risk_args(B=3, SH2=5, I=2, H=4):
    z = np.zeros
    return dict(h=z((B, SH2)), isv=z(I), e=z(B), W1=z((H, SH2 + I + 1)), b1=z(H), w2=z(H), b2=0.0)


CALLS = {
    "mamba2.forward": (mamba2.forward, mamba2_args),
    "mamba2.backward": (lambda **kw: mamba2.backward(np.zeros_like(kw["h"]), **kw), mamba2_args),
    "q_denoise.loss_and_grads": (q_denoise.loss_and_grads, q_denoise_args),
    "kan.forward": (kan.forward, kan_args),
    "kan.backward": (lambda **kw: kan.backward(np.zeros((kw["x"].shape[0], kw["C"].shape[0])), **kw), kan_args),
    "curiosity.forward_backward": (curiosity.forward_backward, curiosity_args),
    "risk_budget.forward": (risk_budget.forward, risk_args),
}


@pytest.mark.parametrize("call", CALLS)
def test_good_call_passes(call):
    fn, make = CALLS[call]
    fn(**make())


@pytest.mark.parametrize("call,arg,bad,expect", [
    ("mamba2.forward", "h_hist", np.zeros((3, 5)), ["'h_hist'", "3 dimension(s) [B, K, SH2]", "(3, 5)"]),
    ("mamba2.forward", "h", np.zeros((3, 6)), ["'h'", "SH2=6", "'h_hist' gives SH2=5"]),
    ("mamba2.forward", "W_C", np.zeros((5, 3)), ["'W_C'", "D=3", "'W_A' gives D=4"]),
    ("mamba2.forward", "w", np.zeros(4), ["'w'", "SH2=4", "SH2=5"]),
    ("mamba2.forward", "h", np.zeros((2, 5)), ["'h'", "B=2", "'h_hist' gives B=3"]),
    ("q_denoise.loss_and_grads", "W2", np.zeros((4, 6)), ["'W2'", "H=6", "'W1' gives H=5"]),
    ("q_denoise.loss_and_grads", "b2", np.zeros((4, 1)), ["'b2'", "1 dimension(s) [A]"]),
    ("kan.forward", "Wb", np.zeros((2, 5)), ["'Wb'", "I=5", "'x' gives I=4"]),
    ("curiosity.forward_backward", "s_next", np.zeros((3, 4)), ["'s_next'", "F=4", "'s' gives F=5"]),
    ("curiosity.forward_backward", "a", np.zeros((3, 1), dtype=np.int64), ["'a'", "1 dimension(s) [B]"]),
    ("risk_budget.forward", "e", np.zeros(4), ["'e'", "B=4", "'h' gives B=3"]),
    ("risk_budget.forward", "w2", np.zeros(5), ["'w2'", "H=5", "'W1' gives H=4"]),
])
def test_wrong_shape_names_argument_and_dimension(call, arg, bad, expect):
    fn, make = CALLS[call]
    kw = make()
    kw[arg] = bad
    with pytest.raises(FoxcuteInputError) as err:
        fn(**kw)
    for fragment in expect:
        assert fragment in str(err.value)
    assert str(err.value).startswith(f"foxcute.{call}")


def test_mamba2_backward_dout_shape():
    kw = mamba2_args()
    with pytest.raises(FoxcuteInputError, match=r"'dout' has SH2=4 .* 'h_hist' gives SH2=5"):
        mamba2.backward(np.zeros((3, 4)), **kw)


def test_kan_backward_dy_shape():
    with pytest.raises(FoxcuteInputError, match=r"'dy' has O=3 .* 'C' gives O=2"):
        kan.backward(np.zeros((3, 3)), **kan_args())


def test_kan_rejects_columns_not_a_multiple_of_inputs():
    kw = kan_args()
    kw["C"] = np.zeros((2, 10))
    with pytest.raises(FoxcuteInputError, match=r"I\*G=10 \(from 'C'\) must be a multiple of 4"):
        kan.forward(**kw)


def test_kan_rejects_a_single_basis_function():
    kw = kan_args()
    kw["C"] = np.zeros((2, 4))
    with pytest.raises(FoxcuteInputError, match=r"'C' must have G >= 2"):
        kan.forward(**kw)


def test_curiosity_rejects_no_action_columns():
    kw = curiosity_args()
    kw["W1"] = np.zeros((4, 5))
    with pytest.raises(FoxcuteInputError, match=r"'W1' must have F \+ A columns \(F=5 .* A >= 1.*\(4, 5\)"):
        curiosity.forward_backward(**kw)


def test_risk_budget_rejects_wrong_concatenated_width():
    kw = risk_args()
    kw["W1"] = np.zeros((4, 7))
    with pytest.raises(FoxcuteInputError, match=r"'W1' must have SH2\+I\+1 = 8 columns .*\(4, 7\)"):
        risk_budget.forward(**kw)


@pytest.mark.parametrize("bad,shown", [(-1, -1), (3, 3), (7, 7)])
def test_curiosity_action_out_of_range(bad, shown):
    kw = curiosity_args()
    kw["a"] = np.array([0, bad, 1])
    with pytest.raises(FoxcuteInputError) as err:
        curiosity.forward_backward(**kw)
    msg = str(err.value)
    assert "'a'" in msg and f"action index {shown}" in msg and "[0, 3)" in msg and "A=3" in msg


@pytest.mark.parametrize("call", CALLS)
def test_wrong_dtype(call):
    fn, make = CALLS[call]
    kw = make()
    first = next(iter(kw))
    kw[first] = kw[first].astype(np.int32)
    with pytest.raises(FoxcuteInputError, match=rf"'{first}' must have dtype a float dtype .*got int32"):
        fn(**kw)


def test_curiosity_actions_must_be_integers():
    kw = curiosity_args()
    kw["a"] = np.zeros(3)
    with pytest.raises(FoxcuteInputError, match=r"'a' must have dtype int32 or int64, got float64"):
        curiosity.forward_backward(**kw)


@pytest.mark.parametrize("call", CALLS)
def test_reference_takes_numpy_only(call):
    fn, make = CALLS[call]
    kw = make()
    last = [k for k, v in kw.items() if isinstance(v, np.ndarray)][-1]
    kw[last] = kw[last].tolist()
    with pytest.raises(FoxcuteInputError, match=rf"'{last}' must be a numpy.ndarray for the reference backend, got list"):
        fn(**kw)


def test_reference_accepts_any_float_dtype_and_strides(rng):
    kw = {k: rng.standard_normal(v.shape) if isinstance(v, np.ndarray) else v for k, v in mamba2_args().items()}
    expected = mamba2.forward(**kw)
    kw["h_hist"] = np.asfortranarray(kw["h_hist"])
    kw["W_A"] = kw["W_A"].astype(np.float32)
    assert not kw["h_hist"].flags.c_contiguous
    np.testing.assert_allclose(mamba2.forward(**kw), expected, rtol=1e-6)


@pytest.mark.parametrize("call", CALLS)
def test_bad_backend_lists_available(call):
    fn, make = CALLS[call]
    with pytest.raises(BackendError) as err:
        fn(**make(), backend="cuda")
    msg = str(err.value)
    assert "backend 'cuda' is not offered" in msg and "available: 'reference'" in msg


@pytest.mark.parametrize("call", CALLS)
def test_bad_precision(call):
    fn, make = CALLS[call]
    with pytest.raises(BackendError, match=r"precision='fp16' is not offered; available: 'tf32', 'fp32'"):
        fn(**make(), precision="fp16")


def test_bad_impl():
    with pytest.raises(BackendError, match=r"impl='fast' is not offered; available: 'fused', 'seed'"):
        mamba2.forward(**mamba2_args(), impl="fast")


@pytest.mark.parametrize("sigma", [float("nan"), "one", None])
def test_bad_sigma(sigma):
    kw = mamba2_args()
    kw["sigma"] = sigma
    with pytest.raises(FoxcuteInputError, match=r"'sigma' must be"):
        mamba2.forward(**kw)


def test_column_sum_rejects_too_many_columns():
    with pytest.raises(FoxcuteInputError, match=rf"N={MAX_N + 1} \(from 'G'\) is outside the supported range 1 <= N <= {MAX_N}"):
        column_sum(np.zeros((2, MAX_N + 1)))


@pytest.mark.gpu
def test_gpu_backends_reject_non_contiguous():
    """Each GPU backend offered refuses a strided view, naming the argument."""
    import cupy

    from foxcute._layer import GPU_BACKENDS

    offered = [(layer, backend) for layer in ("mamba2", "q_denoise", "kan", "curiosity", "risk_budget")
               for backend in GPU_BACKENDS]
    makers = {"mamba2": (mamba2.forward, mamba2_args), "q_denoise": (q_denoise.loss_and_grads, q_denoise_args),
              "kan": (kan.forward, kan_args), "curiosity": (curiosity.forward_backward, curiosity_args),
              "risk_budget": (risk_budget.forward, risk_args)}
    for layer, backend in offered:
        fn, make = makers[layer]
        kw = {k: cupy.asarray(v, dtype=v.dtype if v.dtype.kind == "i" else np.float32)
              if isinstance(v, np.ndarray) else v for k, v in make().items()}
        first = next(iter(kw))
        kw[first] = cupy.asfortranarray(kw[first])
        with pytest.raises(FoxcuteInputError, match=rf"'{first}' must be C-contiguous"):
            fn(**kw, backend=backend)


def test_optional_output_is_checked_or_allocated_by_the_bound_sizes():
    from foxcute._arrays import Checker

    chk = Checker("where", gpu=False)
    a = chk.array("A", np.zeros((5, 3), np.float32), ("M", "K"))
    made = chk.output(None, ("M", 7), a)
    assert made.shape == (5, 7) and made.dtype == np.float32
    given = np.zeros((5, 7), np.float32)
    assert chk.output(given, ("M", 7), a) is given
    with pytest.raises(FoxcuteInputError, match="argument 'out' has M=4"):
        chk.output(np.zeros((4, 7), np.float32), ("M", 7), a)


FINITE_CALLS = {
    "mamba2": lambda rng: (mamba2.forward, dict(h_hist=rng.standard_normal((3, 2, 8)), h=rng.standard_normal((3, 8)),
                                                W_A=rng.standard_normal((8, 4)), W_B=rng.standard_normal((8, 4)),
                                                W_C=rng.standard_normal((8, 4))), "h_hist"),
    "q_denoise": lambda rng: (q_denoise.loss_and_grads, dict(q=rng.standard_normal((3, 2)),
                                                             q_target=rng.standard_normal((3, 2)),
                                                             W1=rng.standard_normal((4, 2)), b1=rng.standard_normal(4),
                                                             W2=rng.standard_normal((2, 4)), b2=rng.standard_normal(2)),
                              "W2"),
    "column_sum": lambda rng: (column_sum, dict(G=rng.standard_normal((5, 3))), "G"),
    "kan": lambda rng: (kan.forward, dict(x=rng.standard_normal((3, 2)), C=rng.standard_normal((4, 6)),
                                          Wb=rng.standard_normal((4, 2))), "C"),
    "curiosity": lambda rng: (curiosity.forward_backward,
                              dict(s=rng.standard_normal((3, 4)), a=np.array([0, 1, 0], np.int32),
                                   s_next=rng.standard_normal((3, 4)), W1=rng.standard_normal((5, 6)),
                                   b1=rng.standard_normal(5), W2=rng.standard_normal((4, 5)), b2=rng.standard_normal(4)),
                              "s_next"),
    "risk_budget": lambda rng: (risk_budget.forward, dict(h=rng.standard_normal((3, 4)), isv=rng.standard_normal(2),
                                                          e=rng.standard_normal(3), W1=rng.standard_normal((5, 7)),
                                                          b1=rng.standard_normal(5), w2=rng.standard_normal(5), b2=0.1),
                                "e"),
}


@pytest.mark.parametrize("layer", sorted(FINITE_CALLS))
def test_non_finite_values_rejected_only_when_asked(layer, monkeypatch):
    """FOXCUTE_CHECK_FINITE=1 makes every layer reject NaN/inf in an array, naming it and the
    count; without it array values are not read (the call goes through)."""
    fn, kwargs, poisoned = FINITE_CALLS[layer](np.random.default_rng(0))
    kwargs[poisoned] = kwargs[poisoned].copy()
    kwargs[poisoned].flat[[0, -1]] = [np.nan, np.inf]
    monkeypatch.delenv("FOXCUTE_CHECK_FINITE", raising=False)
    fn(**kwargs)
    monkeypatch.setenv("FOXCUTE_CHECK_FINITE", "1")
    with pytest.raises(FoxcuteInputError, match=rf"argument '{poisoned}' holds 2 non-finite value\(s\)"):
        fn(**kwargs)
    kwargs[poisoned].flat[[0, -1]] = 0.0
    fn(**kwargs)
