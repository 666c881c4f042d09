"""The float64 references against docs/layers.md: every gradient against central finite
differences, and every forward against its formulas written out as plain loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foxcute import curiosity, kan, mamba2, q_denoise, risk_budget
from foxcute.reduction import column_sum

EPS = 1e-6
FD_RTOL = 1e-6


def finite_difference(loss, arrays, name, flat_indices):
    """Central differences of loss(arrays) in the given entries of arrays[name]."""
    x = arrays[name]
    slopes = []
    for i in flat_indices:
        original = x.flat[i]
        x.flat[i] = original + EPS
        up = loss(arrays)
        x.flat[i] = original - EPS
        down = loss(arrays)
        x.flat[i] = original
        slopes.append((up - down) / (2 * EPS))
    return np.array(slopes)


def fd_errors(loss, arrays, grads, rng, entries=6, forced=None):
    """name -> ||fd - analytic|| / ||analytic|| over `entries` random entries of each input
    (plus the flat indices in forced[name])."""
    errors = {}
    for name, grad in grads.items():
        size = arrays[name].size
        idx = rng.choice(size, min(entries, size), replace=False)
        if forced and name in forced:
            idx = np.union1d(idx, forced[name])
        analytic = np.asarray(grad, dtype=np.float64).reshape(-1)[idx]
        numeric = finite_difference(loss, arrays, name, idx)
        assert np.linalg.norm(analytic) > 1e-8, f"{name}: sampled gradient is ~0, the check would be void"
        errors[name] = np.linalg.norm(numeric - analytic) / np.linalg.norm(analytic)
    return errors


def assert_fd_match(loss, arrays, grads, rng, **kw):
    errors = fd_errors(loss, arrays, grads, rng, **kw)
    bad = {name: err for name, err in errors.items() if not err < FD_RTOL}
    assert not bad, f"gradients off finite differences (rel err): {bad}"


def resample_away_from_kinks(make, preacts, rng, margin=1e-3, tries=200):
    """make(rng) -> arrays; preacts(arrays) -> the ReLU inputs. Returns arrays whose ReLU
    inputs all have |z| > margin, so an EPS step never crosses a kink."""
    for _ in range(tries):
        arrays = make(rng)
        if np.min(np.abs(preacts(arrays))) > margin:
            return arrays
    raise AssertionError("could not draw inputs away from the ReLU kinks")


# ------------------------------------------------------------------ Mamba2


def mamba2_inputs(rng, B=3, K=3, SH2=5, D=4):
    return {
        "h_hist": rng.standard_normal((B, K, SH2)),
        "h": rng.standard_normal((B, SH2)),
        "W_A": rng.standard_normal((SH2, D)) / math.sqrt(SH2),
        "W_B": rng.standard_normal((SH2, D)) / math.sqrt(SH2),
        "W_C": rng.standard_normal((SH2, D)) / math.sqrt(SH2),
        "w": 1 + 0.3 * rng.standard_normal(SH2),
        "sigma": np.array(0.8),
        "dout": rng.standard_normal((B, SH2)),
    }


def mamba2_functional(arrays):
    names = ("h_hist", "h", "W_A", "W_B", "W_C", "w", "sigma")
    out = mamba2.forward(*(arrays[n] for n in names))
    return float(np.sum(arrays["dout"] * out))


MAMBA2_GRAD_INPUT = {"dW_A": "W_A", "dW_B": "W_B", "dW_C": "W_C", "dw": "w", "dsigma": "sigma",
                     "dh_hist": "h_hist", "dh": "h"}


def mamba2_grads_by_input(grads):
    return {MAMBA2_GRAD_INPUT[k]: v for k, v in grads._asdict().items()}


def test_mamba2_backward_matches_finite_differences(rng):
    arrays = mamba2_inputs(rng)
    grads = mamba2.backward(arrays["dout"], arrays["h_hist"], arrays["h"], arrays["W_A"], arrays["W_B"],
                            arrays["W_C"], arrays["w"], arrays["sigma"])
    assert isinstance(grads.dsigma, float)
    assert_fd_match(mamba2_functional, arrays, mamba2_grads_by_input(grads), rng)


def test_mamba2_backward_with_default_w_and_sigma(rng):
    """w=None and sigma omitted mean ones and 1.0, in the backward too."""
    arrays = mamba2_inputs(rng)
    arrays["w"] = np.ones_like(arrays["w"])
    arrays["sigma"] = np.array(1.0)
    grads = mamba2.backward(arrays["dout"], arrays["h_hist"], arrays["h"], arrays["W_A"], arrays["W_B"],
                            arrays["W_C"])
    assert_fd_match(mamba2_functional, arrays, mamba2_grads_by_input(grads), rng)


def test_mamba2_seed_plan_backward_fails_finite_differences(rng):
    """The seed design's reverse-scan seed is not the gradient of the forward: the
    gradients that flow through the scan are off by far more than rounding."""
    arrays = mamba2_inputs(rng)
    names = ("dout", "h_hist", "h", "W_A", "W_B", "W_C", "w")
    seed = mamba2.reference_backward_seed_plan(*(arrays[n] for n in names), float(arrays["sigma"]))
    right = mamba2.reference_backward(*(arrays[n] for n in names), float(arrays["sigma"]))
    errors = fd_errors(mamba2_functional, arrays, mamba2_grads_by_input(seed), rng)
    for name in ("W_A", "W_B", "sigma", "h_hist"):
        assert errors[name] > 1e-2, f"seed plan's d{name} unexpectedly matches: {errors[name]}"
    # what does not pass through the scan's seed is the same as the correct backward's
    for field in ("dW_C", "dw", "dh"):
        np.testing.assert_array_equal(getattr(seed, field), getattr(right, field))


# ------------------------------------------------------------------ Q-denoise


def q_denoise_inputs(rng, B=4, A=3, H=5):
    def make(rng):
        return {"q": rng.standard_normal((B, A)), "q_target": rng.standard_normal((B, A)),
                "W1": rng.standard_normal((H, A)), "b1": rng.standard_normal(H),
                "W2": rng.standard_normal((A, H)), "b2": rng.standard_normal(A)}

    return resample_away_from_kinks(make, lambda x: x["q"] @ x["W1"].T + x["b1"], rng)


def q_denoise_loss(arrays):
    names = ("q", "q_target", "W1", "b1", "W2", "b2")
    return q_denoise.loss_and_grads(*(arrays[n] for n in names))[0]


def test_q_denoise_grads_match_finite_differences(rng):
    arrays = q_denoise_inputs(rng)
    loss, grads = q_denoise.loss_and_grads(*(arrays[n] for n in ("q", "q_target", "W1", "b1", "W2", "b2")))
    assert isinstance(loss, float)
    by_input = {"W1": grads.dW1, "b1": grads.db1, "W2": grads.dW2, "b2": grads.db2, "q": grads.dq}
    assert_fd_match(q_denoise_loss, arrays, by_input, rng)


# ------------------------------------------------------------------ KAN


def kan_inputs(rng, B=3, I=4, O=3, G=5):
    return {"x": 1.2 * rng.standard_normal((B, I)), "C": rng.standard_normal((O, I * G)),
            "Wb": rng.standard_normal((O, I)), "dy": rng.standard_normal((B, O))}


def kan_functional(arrays):
    return float(np.sum(arrays["dy"] * kan.forward(arrays["x"], arrays["C"], arrays["Wb"])))


def test_kan_backward_matches_finite_differences(rng):
    arrays = kan_inputs(rng)
    grads = kan.backward(arrays["dy"], arrays["x"], arrays["C"], arrays["Wb"])
    assert_fd_match(kan_functional, arrays, {"C": grads.dC, "Wb": grads.dWb, "x": grads.dx}, rng)


# ------------------------------------------------------------------ curiosity


def curiosity_inputs(rng, B=4, F=5, A=3, H=6):
    def make(rng):
        return {"s": rng.standard_normal((B, F)), "a": rng.integers(0, A, B),
                "s_next": rng.standard_normal((B, F)), "W1": rng.standard_normal((H, F + A)),
                "b1": rng.standard_normal(H), "W2": rng.standard_normal((F, H)), "b2": rng.standard_normal(F)}

    def preacts(x):
        onehot = np.eye(A)[x["a"]]
        return np.concatenate([x["s"], onehot], axis=1) @ x["W1"].T + x["b1"]

    return resample_away_from_kinks(make, preacts, rng)


CURIOSITY_NAMES = ("s", "a", "s_next", "W1", "b1", "W2", "b2")


def curiosity_loss(arrays):
    return curiosity.forward_backward(*(arrays[n] for n in CURIOSITY_NAMES))[0]


def test_curiosity_grads_match_finite_differences(rng):
    arrays = curiosity_inputs(rng)
    loss, r, grads = curiosity.forward_backward(*(arrays[n] for n in CURIOSITY_NAMES))
    assert isinstance(loss, float)
    by_input = {"W1": grads.dW1, "b1": grads.db1, "W2": grads.dW2, "b2": grads.db2, "s": grads.ds}
    H, FA = arrays["W1"].shape
    F = arrays["s"].shape[1]
    # every action column of W1, in the rows of two hidden units, is checked too
    action_entries = np.array([row * FA + col for row in (0, H - 1) for col in range(F, FA)])
    assert_fd_match(curiosity_loss, arrays, by_input, rng, forced={"W1": action_entries})


def test_curiosity_action_columns_only_get_taken_actions(rng):
    """dW1's column F+k sums dz over the samples that took action k: zero for an action
    nobody took."""
    arrays = curiosity_inputs(rng)
    arrays["a"] = np.array([0, 2, 0, 2])
    _, _, grads = curiosity.forward_backward(*(arrays[n] for n in CURIOSITY_NAMES))
    F = arrays["s"].shape[1]
    np.testing.assert_array_equal(grads.dW1[:, F + 1], 0.0)
    assert np.any(grads.dW1[:, F] != 0.0)


# ------------------------------------------------------------------ forwards as explicit loops


def _sig(v):
    return 1.0 / (1.0 + math.exp(-v))


def loop_mamba2(h_hist, h, W_A, W_B, W_C, w, sigma):
    B, K, SH2 = h_hist.shape
    D = W_A.shape[1]
    out = np.zeros((B, SH2))
    for b in range(B):
        x = [0.0] * D
        for t in range(K):
            for s in range(D):
                a = sum(h_hist[b, t, j] * W_A[j, s] for j in range(SH2))
                u = sum(h_hist[b, t, j] * W_B[j, s] for j in range(SH2))
                x[s] = sigma * _sig(a) * x[s] + u
        ctx = 0.0
        for s in range(D):
            c = sum(h[b, j] * W_C[j, s] for j in range(SH2))
            ctx += c * x[s]
        ctx /= D
        for j in range(SH2):
            out[b, j] = h[b, j] + ctx * w[j]
    return out


@pytest.mark.parametrize("B,K,SH2,D", [(1, 1, 3, 1), (4, 3, 5, 2), (2, 6, 7, 3)])
def test_dsigma_term_norm_is_the_norm_of_the_terms_dsigma_sums(rng, B, K, SH2, D):
    a = mamba2_inputs(rng, B, K, SH2, D)
    sigma = 0.7
    terms = []
    for b in range(B):
        dctx = float(a["dout"][b] @ a["w"])
        for s in range(D):
            pre = [(float(a["h_hist"][b, t] @ a["W_A"][:, s]), float(a["h_hist"][b, t] @ a["W_B"][:, s]))
                   for t in range(K)]
            xs = [0.0]
            for at, ut in pre:
                xs.append(sigma * _sig(at) * xs[-1] + ut)
            lam = dctx * float(a["h"][b] @ a["W_C"][:, s]) / D  # lam_K
            for t in reversed(range(K)):
                terms.append(lam * xs[t] * _sig(pre[t][0]))
                lam *= sigma * _sig(pre[t][0])
    args = (a["h_hist"], a["h"], a["W_A"], a["W_B"], a["W_C"], a["w"], sigma)
    assert math.isclose(mamba2.backward(a["dout"], *args).dsigma, math.fsum(terms), rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(mamba2.dsigma_term_norm(a["dout"], *args), math.sqrt(math.fsum(v * v for v in terms)),
                        rel_tol=1e-12, abs_tol=1e-300)


def test_output_errors_measure_dsigma_against_its_terms_and_the_rest_plainly(rng):
    from foxcute.lab import benchmarks

    case = next(c for c in benchmarks.CASES if (c.layer, c.pass_) == ("mamba2", "backward"))
    inputs = case.make(rng, case.odd_sizes)
    reference = benchmarks.reference(case, inputs)
    i, j = case.outputs.index("dsigma"), case.outputs.index("dW_A")
    scale = max(abs(reference[i]), mamba2.dsigma_term_norm(**inputs))
    outputs = list(reference)
    outputs[i] = reference[i] + 1e-3 * scale
    outputs[j] = reference[j] * (1 + 1e-4)
    errors = benchmarks.output_errors(case, inputs, outputs, reference)
    assert math.isclose(errors["dsigma"], 1e-3, rel_tol=1e-6)
    assert math.isclose(errors["dW_A"], 1e-4, rel_tol=1e-6)
    assert errors["dh"] == 0.0


@pytest.mark.parametrize("B,K,SH2,D", [(1, 1, 3, 1), (5, 1, 7, 3), (3, 7, 5, 5), (2, 4, 11, 6)])
def test_mamba2_forward_matches_loops(rng, B, K, SH2, D):
    a = mamba2_inputs(rng, B, K, SH2, D)
    args = (a["h_hist"], a["h"], a["W_A"], a["W_B"], a["W_C"], a["w"], 0.7)
    np.testing.assert_allclose(mamba2.forward(*args), loop_mamba2(*args), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mamba2.forward(*args[:5]), loop_mamba2(*args[:5], np.ones(SH2), 1.0),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("B,A,H", [(1, 1, 1), (7, 3, 5), (3, 12, 24)])
def test_q_denoise_loss_matches_loops(rng, B, A, H):
    q, qt = rng.standard_normal((B, A)), rng.standard_normal((B, A))
    W1, b1, W2, b2 = (rng.standard_normal((H, A)), rng.standard_normal(H), rng.standard_normal((A, H)),
                      rng.standard_normal(A))
    total = 0.0
    for b in range(B):
        hid = [max(0.0, sum(q[b, i] * W1[k, i] for i in range(A)) + b1[k]) for k in range(H)]
        for o in range(A):
            y = sum(hid[k] * W2[o, k] for k in range(H)) + b2[o]
            total += (y - qt[b, o]) ** 2
    loss, _ = q_denoise.loss_and_grads(q, qt, W1, b1, W2, b2)
    assert loss == pytest.approx(total / (B * A), rel=1e-12)


@pytest.mark.parametrize("B,I,O,G", [(1, 1, 1, 2), (5, 3, 7, 5), (2, 7, 3, 8)])
def test_kan_forward_matches_loops(rng, B, I, O, G):
    x, C, Wb = rng.standard_normal((B, I)), rng.standard_normal((O, I * G)), rng.standard_normal((O, I))
    delta = 4.0 / (G - 1)
    expected = np.zeros((B, O))
    for b in range(B):
        for o in range(O):
            acc = 0.0
            for i in range(I):
                for g in range(G):
                    mu = -2.0 + g * delta
                    acc += math.exp(-(((x[b, i] - mu) / delta) ** 2)) * C[o, i * G + g]
                acc += x[b, i] * _sig(x[b, i]) * Wb[o, i]
            expected[b, o] = acc
    np.testing.assert_allclose(kan.forward(x, C, Wb), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("B,F,A,H", [(1, 1, 1, 1), (5, 3, 2, 7), (3, 7, 3, 5)])
def test_curiosity_forward_matches_loops(rng, B, F, A, H):
    s, s_next = rng.standard_normal((B, F)), rng.standard_normal((B, F))
    a = rng.integers(0, A, B)
    W1, b1, W2, b2 = (rng.standard_normal((H, F + A)), rng.standard_normal(H), rng.standard_normal((F, H)),
                      rng.standard_normal(F))
    r = np.zeros(B)
    for b in range(B):
        hid = [max(0.0, sum(s[b, f] * W1[k, f] for f in range(F)) + W1[k, F + a[b]] + b1[k]) for k in range(H)]
        for f in range(F):
            pred = sum(hid[k] * W2[f, k] for k in range(H)) + b2[f]
            r[b] += (pred - s_next[b, f]) ** 2 / (2 * F)
    loss, r_got, _ = curiosity.forward_backward(s, a, s_next, W1, b1, W2, b2)
    np.testing.assert_allclose(r_got, r, rtol=1e-12)
    assert loss == pytest.approx(r.mean(), rel=1e-12)


@pytest.mark.parametrize("B,SH2,I,H", [(1, 1, 1, 1), (5, 7, 3, 2), (3, 5, 16, 11)])
def test_risk_budget_forward_matches_loops(rng, B, SH2, I, H):
    h, isv, e = rng.standard_normal((B, SH2)), rng.standard_normal(I), rng.random(B)
    W1, b1, w2, b2 = (rng.standard_normal((H, SH2 + I + 1)), rng.standard_normal(H), rng.standard_normal(H), 0.3)
    expected = np.zeros(B)
    for b in range(B):
        x = list(h[b]) + list(isv) + [e[b]]
        logit = b2 + sum(w2[k] * max(0.0, sum(x[j] * W1[k, j] for j in range(len(x))) + b1[k]) for k in range(H))
        expected[b] = _sig(logit)
    np.testing.assert_allclose(risk_budget.forward(h, isv, e, W1, b1, w2, b2), expected, rtol=1e-12)


@pytest.mark.parametrize("M,N", [(1, 1), (7, 3), (13, 5)])
def test_column_sum_matches_loops(rng, M, N):
    G = rng.standard_normal((M, N))
    expected = [sum(G[m, n] for m in range(M)) for n in range(N)]
    np.testing.assert_allclose(column_sum(G), expected, rtol=1e-12, atol=1e-14)


def test_gemm_cases_are_the_seed_products_with_their_peers(rng):
    """The profiling notebook's GEMM cases: the seed Mamba2's projection, read-back and weight
    gradient shapes, a float64 product as reference, and foxcute's GEMM, the CUTLASS C++ peer
    (where it builds) and the torch peer (where torch is) as the implementations offered."""
    import importlib.util

    from foxcute.lab import benchmarks
    from foxcute.peers import cutlass_gemm

    m2 = next(c for c in benchmarks.CASES if c.layer == "mamba2").sizes
    shapes = {c.label: (c.kernel_function, c.sizes["N"], c.sizes["K"]) for c in benchmarks.GEMM_CASES}
    assert shapes == {"seed projection": ("matmul", 2 * m2["D"], m2["SH2"]),
                      "seed read-back": ("matmul", m2["SH2"], 2 * m2["D"]),
                      "seed weight gradient": ("weight_grad", m2["SH2"], 2 * m2["D"])}
    for case in benchmarks.GEMM_CASES:
        assert case.sizes["B"] * case.sizes["T"] == m2["B"] * m2["K"]
        z = case.odd_sizes
        rows = z["B"] * z["T"]
        first, second = case.make(rng, z).values()
        (got,) = benchmarks.reference(case, {"a": first, "b": second})
        if case.kernel_function == "matmul":  # A [rows, K], B_t [N, K] -> [rows, N]
            assert first.shape == (rows, z["K"]) and second.shape == (z["N"], z["K"])
            want = [[math.fsum(float(a) * float(b) for a, b in zip(row, col)) for col in second] for row in first]
        else:  # dY [rows, N], X [rows, K] -> [N, K]
            assert first.shape == (rows, z["N"]) and second.shape == (rows, z["K"])
            want = [[math.fsum(float(a) * float(b) for a, b in zip(col_y, col_x)) for col_x in second.T]
                    for col_y in first.T]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        offered = {i.name for i in benchmarks.impls() if i.applies(case)}
        want_impls = {"cute"} | ({"cutlass_cpp"} if cutlass_gemm.unavailable() is None else set())
        if importlib.util.find_spec("torch") is not None:
            want_impls |= {"torch_eager", "torch_compile", "torch_compile_cudagraphs"}
        assert offered == want_impls
