"""The exported C library on the H200 (issue 33): the C test program (tests/c/foxcute_test.c)
runs every exported pass on inputs this test writes to files, and its outputs are compared
with the float64 references (docs/layers.md section 8), bit for bit between two runs, and bit
for bit between a run and two replays of a CUDA graph that captured every pass (the program
sets the outputs to NaN before the replays, so a graph that launched nothing fails).

Needs, on the GPU machine: the DSL (the export runs here, at the trainer's sizes, once a
precision), `cc`, and the CUDA headers with libcudart_static.a (the toolkit). No cupy or torch:
the C program owns the GPU.
"""

import subprocess
from pathlib import Path

import numpy as np
import pytest

from foxcute import curiosity, kan, mamba2, q_denoise, reduction, risk_budget
from foxcute.checks import TOLERANCE, rel_err
from foxcute.step import StepSizes

pytestmark = pytest.mark.gpu

TESTS = Path(__file__).resolve().parent
SIZES = StepSizes()  # the trainer's, as `foxcute export` compiles by default
RUNS = ("first", "second", "graph")

# (name, pass, size arguments): the trainer's batches, and odd ones. On an H200 (132 SMs) the
# Q-denoise finish is one level up to B = 8448 and two levels past it, and the TF32 KAN
# backward's one level up to B = 8448 (33 chunks of 256 rows x 4 input blocks). The actions
# file of a curiosity case holds int32 (the C program reads it as 4-byte words).
CASES = [("cs_iqn_head", "column_sum", dict(M=SIZES.B * SIZES.Q, N=SIZES.A)),
         ("cs_iqn_hidden", "column_sum", dict(M=SIZES.B * 8, N=SIZES.H_iqn)),
         ("cs_odd", "column_sum", dict(M=111, N=SIZES.A)),
         ("qd_trainer", "q_denoise", dict(B=SIZES.B)),
         ("qd_two_level", "q_denoise", dict(B=65537)),
         ("qd_tiny", "q_denoise", dict(B=7)),
         ("rb_trainer", "risk_budget", dict(B=SIZES.B, b2=0.25)),
         ("rb_odd", "risk_budget", dict(B=37, b2=-0.5)),
         ("kf_trainer", "kan_forward", dict(B=SIZES.B)),
         ("kf_odd", "kan_forward", dict(B=37)),
         ("kb_trainer", "kan_backward", dict(B=SIZES.B)),
         ("kb_two_level", "kan_backward", dict(B=65536)),
         ("kb_odd", "kan_backward", dict(B=37)),
         ("cu_trainer", "curiosity", dict(B=SIZES.B)),
         ("cu_odd", "curiosity", dict(B=37)),
         ("m2f_trainer", "mamba2_forward", dict(B=SIZES.B, sigma=0.95)),
         ("m2f_odd", "mamba2_forward", dict(B=37, sigma=0.9)),
         ("m2b_trainer", "mamba2_backward", dict(B=SIZES.B, sigma=0.95)),
         ("m2b_odd", "mamba2_backward", dict(B=37, sigma=0.9))]


def normal(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def column_sum_inputs(rng, M, N):
    return {"G": normal(rng, M, N)}


def q_denoise_inputs(rng, B):
    A, H = SIZES.A_q, SIZES.H_q
    return dict(q=normal(rng, B, A), q_target=normal(rng, B, A), W1=normal(rng, H, A, scale=A**-0.5),
                b1=normal(rng, H, scale=0.1), W2=normal(rng, A, H, scale=H**-0.5), b2=normal(rng, A, scale=0.1))


def risk_budget_inputs(rng, B, b2):
    SH2, I, H = SIZES.SH2, SIZES.I_risk, SIZES.H_risk
    return dict(h=normal(rng, B, SH2), isv=normal(rng, I), e=normal(rng, B),
                W1=normal(rng, H, SH2 + I + 1, scale=(SH2 + I + 1) ** -0.5), b1=normal(rng, H, scale=0.1),
                w2=normal(rng, H, scale=H**-0.5))


def kan_inputs(rng, B):
    I, O, G = SIZES.I_kan, SIZES.O_kan, SIZES.G_kan
    return dict(x=normal(rng, B, I), C=normal(rng, O, I * G, scale=(I * G) ** -0.5), Wb=normal(rng, O, I, scale=I**-0.5))


def curiosity_inputs(rng, B):
    F, H, A = SIZES.F, SIZES.H_c, SIZES.A
    return dict(s=normal(rng, B, F), a=rng.integers(0, A, B, dtype=np.int32), s_next=normal(rng, B, F),
                W1=normal(rng, H, F + A, scale=(F + A) ** -0.5), b1=normal(rng, H, scale=0.1),
                W2=normal(rng, F, H, scale=H**-0.5), b2=normal(rng, F, scale=0.1))


def mamba2_inputs(rng, B, sigma, backward=False):
    K, SH2, D = SIZES.K, SIZES.SH2, SIZES.D
    inputs = dict(h_hist=normal(rng, B, K, SH2), h=normal(rng, B, SH2),
                  **{name: normal(rng, SH2, D, scale=SH2**-0.5) for name in ("W_A", "W_B", "W_C")},
                  w=(1 + normal(rng, SH2, scale=0.1)).astype(np.float32))
    return {"dout": normal(rng, B, SH2), **inputs} if backward else inputs


INPUTS = {"curiosity": curiosity_inputs, "mamba2_forward": mamba2_inputs,
          "mamba2_backward": lambda rng, B, sigma: mamba2_inputs(rng, B, sigma, backward=True), "column_sum": column_sum_inputs, "q_denoise": q_denoise_inputs, "risk_budget": risk_budget_inputs,
          "kan_forward": kan_inputs, "kan_backward": lambda rng, B: {"dy": normal(rng, B, SIZES.O_kan),
                                                                     **kan_inputs(rng, B)}}


def references(pass_name, inputs, scalar=None):
    """[(output file, piece, slice of the file's floats, float64 reference)] of one case (the
    packed gradients split as foxcute.h's offsets split them), and Mamba2's dsigma as
    (file, "dsigma", slice, reference, denominator): docs/layers.md section 8's measure."""
    f64 = {k: v if v.dtype == np.int32 else v.astype(np.float64) for k, v in inputs.items()}
    whole = slice(None)
    if pass_name == "mamba2_forward":
        return [("out", "out", whole, mamba2.reference_forward(**f64, sigma=scalar))]
    if pass_name == "mamba2_backward":
        g = mamba2.reference_backward(**f64, sigma=scalar)
        n, at = g.dW_A.size, 3 * g.dW_A.size + g.dw.size
        return [("dh_hist", "dh_hist", whole, g.dh_hist), ("dh", "dh", whole, g.dh),
                *(("grads", name, slice(i * n, (i + 1) * n), ref) for i, (name, ref) in
                  enumerate((("dW_A", g.dW_A), ("dW_B", g.dW_B), ("dW_C", g.dW_C)))),
                ("grads", "dw", slice(3 * n, at), g.dw),
                ("grads", "dsigma", slice(at, at + 1), np.array([g.dsigma]),
                 max(abs(g.dsigma), mamba2.dsigma_term_norm(**f64, sigma=scalar)))]
    if pass_name == "column_sum":
        return [("out", "out", whole, reduction.reference(f64["G"]))]
    if pass_name == "risk_budget":
        return [("risk", "risk", whole, risk_budget.reference_forward(**f64, b2=scalar))]
    if pass_name == "kan_forward":
        return [("y", "y", whole, kan.reference_forward(**f64))]
    if pass_name == "kan_backward":
        g = kan.reference_backward(**f64)
        dwb_at = -(-g.dC.size // 4) * 4
        return [("dx", "dx", whole, g.dx), ("grads", "dC", slice(0, g.dC.size), g.dC),
                ("grads", "dWb", slice(dwb_at, None), g.dWb)]
    if pass_name == "curiosity":
        loss, r, g = curiosity.reference_forward_backward(**f64)
        F, H = SIZES.F, SIZES.H_c
        return [("r", "r", whole, r), ("ds", "ds", whole, g.ds), ("dW1", "dW1", whole, g.dW1),
                ("dW2", "dW2", whole, g.dW2), ("sums", "db2", slice(0, F), g.db2),
                ("sums", "db1", slice(F, F + H), g.db1), ("sums", "dW1a", slice(F + H, -1), g.dW1[:, F:]),
                ("sums", "loss", slice(-1, None), np.array([loss]))]
    loss, g = q_denoise.reference_loss_and_grads(**f64)
    pieces, at = [("dq", "dq", whole, g.dq)], 0
    for name, ref in (("dW1", g.dW1), ("db1", g.db1), ("dW2", g.dW2), ("db2", g.db2), ("loss", np.array([loss]))):
        pieces.append(("grads", name, slice(at, at + ref.size), ref))
        at += ref.size
    return pieces


@pytest.fixture(scope="module", params=["tf32", "fp32"])
def ran(request, tmp_path_factory):
    """Export at the precision, build the C program, write the inputs, run it once; the
    precision, the run's folder, the references of every output and the finished run (its
    failures are test_every_call_returned_ok's, so that each case's outputs are judged alone)."""
    from foxcute import cli
    from foxcute.export import toolchain

    precision = request.param
    out = tmp_path_factory.mktemp(f"export_{precision}")
    assert cli.main(["export", "--out", str(out), "--precision", precision]) == 0
    exe = out / "foxcute_test"
    toolchain.compile_program(TESTS / "c" / "foxcute_test.c", exe, out)
    data = tmp_path_factory.mktemp(f"data_{precision}")
    rng = np.random.default_rng(33)
    expected, lines = {}, []
    for name, pass_name, args in CASES:
        inputs = INPUTS[pass_name](rng, **args)
        for arg, value in inputs.items():
            value.tofile(data / f"{name}.{arg}.bin")
        expected[name] = references(pass_name, inputs, args.get("b2", args.get("sigma")))
        lines.append(" ".join([name, pass_name, *(repr(v) for v in args.values())]))
    (data / "cases.txt").write_text("\n".join(lines) + "\n")
    done = subprocess.run([str(exe), "run", str(data)], capture_output=True, text=True, timeout=300)
    return precision, data, expected, done


def test_every_call_returned_ok(ran):
    """The program's own checks: every pass FOXCUTE_OK (a one-byte-short workspace
    FOXCUTE_ERR_WORKSPACE), every CUDA call, load, capture and replay."""
    done = ran[3]
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith(f"run: {len(CASES)} case(s), 0 failure(s)"), done.stdout


def output(data, case, name, run):
    return np.fromfile(data / f"{case}.{name}.{run}.bin", dtype=np.float32)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_outputs_match_the_float64_reference(ran, case):
    precision, data, expected, _ = ran
    # the column sum has no precision option: plain float32 adds (docs/layers.md section 3)
    tol = TOLERANCE["fp32" if case.startswith("cs_") else precision]
    for name, piece, part, ref, *denominator in expected[case]:
        got = output(data, case, name, "first")[part]
        err = abs(float(got[0]) - ref[0]) / denominator[0] if denominator else rel_err(got, ref.ravel())
        assert err < tol, f"{case} {piece}: error {err:.3g} >= {tol}"


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_reruns_and_graph_replays_are_bit_identical(ran, case):
    _, data, expected, _ = ran
    for name in {e[0] for e in expected[case]}:
        first, second, graph = (output(data, case, name, run).tobytes() for run in RUNS)
        assert first == second, f"{case} {name}: the second run differs"
        assert first == graph, f"{case} {name}: the graph replays differ (NaN left: nothing launched)"
