"""The exported C library on the H200 (issue 33): the C test program (tests/c/foxcute_test.c)
runs every exported pass on inputs this test writes to files, and its outputs are compared
with the float64 references (docs/layers.md section 8), bit for bit between two runs, and bit
for bit between a run and two replays of a CUDA graph that captured every pass (the program
sets the outputs to NaN before the replays, so a graph that launched nothing fails).

Needs, on the GPU machine: the DSL (the export runs here, at the trainer's sizes), `cc`, and the
CUDA headers with libcudart_static.a (the toolkit). No cupy or torch: the C program owns the GPU.
"""

import subprocess
from pathlib import Path

import numpy as np
import pytest

from foxcute import q_denoise, reduction, risk_budget
from foxcute.checks import TOLERANCE, rel_err
from foxcute.step import StepSizes

pytestmark = pytest.mark.gpu

TESTS = Path(__file__).resolve().parent
SIZES = StepSizes()  # the trainer's, as `foxcute export` compiles by default
PRECISION = "tf32"
RUNS = ("first", "second", "graph")

# (name, pass, size arguments): the trainer's batches, and odd ones. On an H200 (132 SMs) the
# Q-denoise finish is one level up to B = 8448 and two levels past it (q_denoise_two_level).
CASES = [("cs_iqn_head", "column_sum", dict(M=SIZES.B * SIZES.Q, N=SIZES.A)),
         ("cs_iqn_hidden", "column_sum", dict(M=SIZES.B * 8, N=SIZES.H_iqn)),
         ("cs_odd", "column_sum", dict(M=111, N=SIZES.A)),
         ("qd_trainer", "q_denoise", dict(B=SIZES.B)),
         ("qd_two_level", "q_denoise", dict(B=65537)),
         ("qd_tiny", "q_denoise", dict(B=7)),
         ("rb_trainer", "risk_budget", dict(B=SIZES.B, b2=0.25)),
         ("rb_odd", "risk_budget", dict(B=37, b2=-0.5))]


def column_sum_inputs(rng, M, N):
    return {"G": rng.standard_normal((M, N), dtype=np.float32)}


def q_denoise_inputs(rng, B):
    A, H = SIZES.A_q, SIZES.H_q
    return dict(q=rng.standard_normal((B, A), dtype=np.float32),
                q_target=rng.standard_normal((B, A), dtype=np.float32),
                W1=(rng.standard_normal((H, A)) / np.sqrt(A)).astype(np.float32),
                b1=(0.1 * rng.standard_normal(H)).astype(np.float32),
                W2=(rng.standard_normal((A, H)) / np.sqrt(H)).astype(np.float32),
                b2=(0.1 * rng.standard_normal(A)).astype(np.float32))


def risk_budget_inputs(rng, B, b2):
    SH2, I, H = SIZES.SH2, SIZES.I_risk, SIZES.H_risk
    return dict(h=rng.standard_normal((B, SH2), dtype=np.float32), isv=rng.standard_normal(I, dtype=np.float32),
                e=rng.standard_normal(B, dtype=np.float32),
                W1=(rng.standard_normal((H, SH2 + I + 1)) / np.sqrt(SH2 + I + 1)).astype(np.float32),
                b1=(0.1 * rng.standard_normal(H)).astype(np.float32),
                w2=(rng.standard_normal(H) / np.sqrt(H)).astype(np.float32))


INPUTS = {"column_sum": column_sum_inputs, "q_denoise": q_denoise_inputs, "risk_budget": risk_budget_inputs}


def references(pass_name, inputs, b2=None):
    """{output file name: (float64 reference, tolerance)} of one case."""
    f64 = {k: v.astype(np.float64) for k, v in inputs.items()}
    if pass_name == "column_sum":
        return {"out": (reduction.reference(f64["G"]), TOLERANCE["fp32"])}
    if pass_name == "risk_budget":
        return {"risk": (risk_budget.reference_forward(**f64, b2=b2), TOLERANCE[PRECISION])}
    loss, g = q_denoise.reference_loss_and_grads(**f64)
    grads = np.concatenate([g.dW1.ravel(), g.db1, g.dW2.ravel(), g.db2, [loss]])
    return {"dq": (g.dq.ravel(), TOLERANCE[PRECISION]), "grads": (grads, TOLERANCE[PRECISION])}


def grads_sections(x):
    """The packed Q-denoise gradients split as foxcute.h's offsets split them."""
    A, H = SIZES.A_q, SIZES.H_q
    bounds = np.cumsum([H * A, H, A * H, A])
    return dict(zip(("dW1", "db1", "dW2", "db2", "loss"), np.split(x, bounds)))


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Export, build the C program, write the inputs, run it once; the run's folder and the
    references of every output."""
    from foxcute import cli
    from foxcute.export import toolchain

    out = tmp_path_factory.mktemp("export")
    assert cli.main(["export", "--out", str(out), "--precision", PRECISION]) == 0
    exe = out / "foxcute_test"
    toolchain.compile_program(TESTS / "c" / "foxcute_test.c", exe, out)
    data = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(33)
    expected = {}
    lines = []
    for name, pass_name, args in CASES:
        inputs = INPUTS[pass_name](rng, **args)
        for arg, value in inputs.items():
            value.tofile(data / f"{name}.{arg}.bin")
        expected[name] = references(pass_name, inputs, args.get("b2"))
        lines.append(" ".join([name, pass_name, *(repr(v) for v in args.values())]))
    (data / "cases.txt").write_text("\n".join(lines) + "\n")
    done = subprocess.run([str(exe), "run", str(data)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"run: {len(CASES)} case(s), 0 failure(s)" in done.stdout
    return data, expected


def output(data, case, name, run):
    return np.fromfile(data / f"{case}.{name}.{run}.bin", dtype=np.float32)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_outputs_match_the_float64_reference(ran, case):
    data, expected = ran
    for name, (ref, tol) in expected[case].items():
        got = output(data, case, name, "first")
        pieces = zip(grads_sections(got).items(), grads_sections(ref).values()) if name == "grads" else \
            [((name, got), ref)]
        for (piece, g), r in pieces:
            assert rel_err(g, r) < tol, f"{case} {piece}: rel_err {rel_err(g, r):.3g} >= {tol}"


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_reruns_and_graph_replays_are_bit_identical(ran, case):
    data, expected = ran
    for name in expected[case]:
        first, second, graph = (output(data, case, name, run).tobytes() for run in RUNS)
        assert first == second, f"{case} {name}: the second run differs"
        assert first == graph, f"{case} {name}: the graph replays differ (NaN left: nothing launched)"
