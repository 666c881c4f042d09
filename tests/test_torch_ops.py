"""foxcute.torch on the CPU (the float64 reference behind the operators): every operator
registered and passing torch.library.opcheck; each module's outputs and every gradient that
loss.backward() fills against the float64 reference and against torch autograd through the
plain-torch peers; torch.compile(fullgraph=True) equal to eager; bad inputs rejected with
FoxcuteInputError naming the argument. The same on CUDA: tests/test_gpu_torch.py."""

import subprocess
import sys

import numpy as np
import pytest
from conftest import SMALL_STEP, TORCH_OPS, torch_op_cases, torch_step

torch = pytest.importorskip("torch", reason="the torch extra is not installed")

from foxcute import BackendError, FoxcuteInputError, curiosity, kan, mamba2, q_denoise, reduction  # noqa: E402
from foxcute.checks import TOLERANCE, rel_err  # noqa: E402
from foxcute.peers import curiosity as curiosity_peer, kan as kan_peer, mamba2 as mamba2_peer  # noqa: E402
from foxcute.peers import q_denoise as q_denoise_peer, risk_budget as risk_peer  # noqa: E402
from foxcute.step import StepSizes  # noqa: E402
from foxcute.torch import (KAN, CuriosityModel, Mamba2Temporal, QDenoise, QuantileLinear,  # noqa: E402
                           RiskBudgetHead, ops)

# The CPU operators are the float64 reference rounded to float32: held to the float32 bound.
BOUND = TOLERANCE["fp32"]
# small odd sizes, docs/layers.md's names
B, K, SH2, D = 7, 3, 10, 4          # Mamba2
A_Q, H_Q = 5, 7                     # Q-denoise
I_KAN, O_KAN, G_KAN = 3, 4, 5       # KAN
F, A, H_C = 6, 2, 5                 # curiosity
I_RISK, H_RISK = 3, 6               # risk budget
Q, IN_IQN, OUT_IQN = 3, 11, 3       # IQN head: B*Q rows


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def randn(*shape, grad=False):
    return torch.randn(shape).requires_grad_(grad)


def host(t):
    return t.detach().numpy().astype(np.float64)


def assert_close_to(got, ref, name):
    assert got.dtype == torch.float32, name
    assert rel_err(got, ref) <= BOUND, (name, rel_err(got, ref))


def test_import_foxcute_loads_no_torch():
    code = "import sys, foxcute, foxcute.mamba2; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_pass_is_an_operator_in_the_foxcute_namespace():
    for name in TORCH_OPS:
        assert isinstance(getattr(torch.ops.foxcute, name), torch._ops.OpOverloadPacket), name


@pytest.mark.parametrize("name", TORCH_OPS)
def test_opcheck(name):
    # schema (no output aliases an input or another output), the autograd registration,
    # the fake implementation against the real one, and AOT dispatch with dynamic shapes
    op, args = torch_op_cases("cpu", B, mamba2=(K, SH2, D), q_denoise=(A_Q, H_Q), column_sum=(B * Q, OUT_IQN),
                              kan=(I_KAN, O_KAN, G_KAN), curiosity=(F, A, H_C), risk_budget=(SH2, I_RISK, H_RISK))[name]
    results = torch.library.opcheck(op, args)
    assert set(results.values()) == {"SUCCESS"}, results


def test_kernel_outputs_become_fresh_unaliased_tensors():
    # the CUDA path's conversion, on CPU tensors: the kernels return some outputs as views of
    # one buffer (a loss among them, as a 1-element array), which custom_op would reject
    # (and opcheck holds outputs to the fake ones' storage offset, 0)
    buffer, fresh = torch.arange(6.0), torch.ones(2)
    loss, grad, other_grad, other = ops._outputs([buffer[3:4], buffer[0:3], buffer[0:2], fresh], scalars=(0,))
    assert loss.shape == () and loss.item() == 3.0 and loss.storage_offset() == 0  # cloned
    assert grad.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()  # the first kept view
    assert torch.equal(other_grad, buffer[0:2])
    assert other_grad.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
    assert other is fresh


def test_shift_logit_is_sigmoid_of_the_shifted_logit():
    # how the risk head's b2 is applied on CUDA (the kernel runs with b2 = 0)
    t = torch.linspace(-15, 15, 301, dtype=torch.float64)
    for b in (-3.0, 0.0, 0.3, 4.0):
        shifted = ops.shift_logit(torch.sigmoid(t), torch.tensor([b], dtype=torch.float64))
        assert rel_err(shifted, torch.sigmoid(t + b)) <= 1e-12, b


def test_mamba2_module_matches_reference():
    layer = Mamba2Temporal(SH2, D, impl="seed", precision="fp32")
    h_hist, h, dout = randn(B, K, SH2, grad=True), randn(B, SH2, grad=True), randn(B, SH2)
    with torch.no_grad():
        layer.w.add_(0.1 * torch.randn(SH2))  # not all ones, so dw and dctx are general
    out = layer(h_hist, h, sigma=0.9)
    (out * dout).sum().backward()
    weights = [host(t) for t in (layer.W_A, layer.W_B, layer.W_C, layer.w)]
    assert_close_to(out, mamba2.reference_forward(host(h_hist), host(h), *weights, 0.9), "out")
    ref = mamba2.reference_backward(host(dout), host(h_hist), host(h), *weights, 0.9)
    got = dict(dW_A=layer.W_A.grad, dW_B=layer.W_B.grad, dW_C=layer.W_C.grad, dw=layer.w.grad,
               dh_hist=h_hist.grad, dh=h.grad)
    for name, value in got.items():
        assert_close_to(value, getattr(ref, name), name)


def test_mamba2_backward_op_returns_dsigma():
    args = [randn(B, SH2), randn(B, K, SH2), randn(B, SH2), *(randn(SH2, D) / 3 for _ in range(3)), randn(SH2)]
    dsigma = ops.mamba2_backward(*args, 0.9, "fused", "tf32")[4]
    assert dsigma.shape == () and dsigma.dtype == torch.float32
    assert rel_err(dsigma, mamba2.reference_backward(*(host(t) for t in args), 0.9).dsigma) <= BOUND


def test_q_denoise_module_matches_reference():
    layer = QDenoise(A_Q, H_Q)
    with torch.no_grad():
        layer.b1.normal_(std=0.1)
        layer.b2.normal_(std=0.1)
    q, q_target = randn(B, A_Q, grad=True), randn(B, A_Q)
    loss = layer(q, q_target)
    (3.0 * loss).backward()  # the saved gradients are scaled by the incoming one
    ref_loss, ref = q_denoise.reference_loss_and_grads(host(q), host(q_target),
                                                       *(host(t) for t in (layer.W1, layer.b1, layer.W2, layer.b2)))
    assert loss.shape == () and rel_err(loss, ref_loss) <= BOUND
    got = dict(dW1=layer.W1.grad, db1=layer.b1.grad, dW2=layer.W2.grad, db2=layer.b2.grad, dq=q.grad)
    for name, value in got.items():
        assert_close_to(value, 3.0 * getattr(ref, name), name)


def test_kan_module_matches_reference():
    layer = KAN(I_KAN, O_KAN, G_KAN)
    x, dy = randn(B, I_KAN, grad=True), randn(B, O_KAN)
    y = layer(x)
    (y * dy).sum().backward()
    C, Wb = host(layer.C), host(layer.Wb)
    assert_close_to(y, kan.reference_forward(host(x), C, Wb), "y")
    ref = kan.reference_backward(host(dy), host(x), C, Wb)
    for name, value in dict(dC=layer.C.grad, dWb=layer.Wb.grad, dx=x.grad).items():
        assert_close_to(value, getattr(ref, name), name)


def test_curiosity_module_matches_reference():
    model = CuriosityModel(F, A, H_C)
    with torch.no_grad():
        model.b1.normal_(std=0.1)
    s, a, s_next = randn(B, F, grad=True), torch.randint(0, A, (B,)), randn(B, F)
    loss, r = model(s, a, s_next)
    assert not r.requires_grad  # the curiosity signal carries no gradient
    (2.0 * loss).backward()
    params = [host(t) for t in (model.W1, model.b1, model.W2, model.b2)]
    ref_loss, ref_r, ref = curiosity.reference_forward_backward(host(s), a.numpy(), host(s_next), *params)
    assert loss.shape == () and rel_err(loss, ref_loss) <= BOUND
    assert_close_to(r, ref_r, "r")
    got = dict(dW1=model.W1.grad, db1=model.b1.grad, dW2=model.W2.grad, db2=model.b2.grad, ds=s.grad)
    for name, value in got.items():
        assert_close_to(value, 2.0 * getattr(ref, name), name)


def risk_inputs(head):
    with torch.no_grad():
        head.b1.normal_(std=0.5)
        head.b2.fill_(0.3)
    return randn(B, SH2, grad=True), randn(I_RISK, grad=True), randn(B, grad=True)


def float64_leaves(*tensors):
    return [t.detach().double().requires_grad_() for t in tensors]


def test_risk_budget_head_matches_float64_autograd_of_its_math():
    # foxcute has no backward for the head: the reference for its gradients is float64
    # autograd through the peer's forward, the math of docs/layers.md section 6 as written
    head = RiskBudgetHead(SH2, I_RISK, H_RISK)
    h, isv, e = risk_inputs(head)
    drisk = randn(B)
    risk = head(h, isv, e)
    (risk * drisk).sum().backward()
    leaves = float64_leaves(h, isv, e, head.W1, head.b1, head.w2, head.b2)
    ref_risk = risk_peer.forward(*leaves)
    assert_close_to(risk, host(ref_risk), "risk")
    ref_grads = torch.autograd.grad(ref_risk, leaves, grad_outputs=drisk.double())
    got = (h.grad, isv.grad, e.grad, head.W1.grad, head.b1.grad, head.w2.grad, head.b2.grad)
    for name, value, ref in zip(("dh", "disv", "de", "dW1", "db1", "dw2", "db2"), got, ref_grads):
        assert value.shape == ref.shape, name
        assert_close_to(value, host(ref), name)


def test_quantile_linear_matches_reference():
    head = QuantileLinear(IN_IQN, OUT_IQN)
    with torch.no_grad():
        head.bias.normal_()
    x, dy = randn(B, Q, IN_IQN, grad=True), randn(B, Q, OUT_IQN)
    y = head(x)
    (y * dy).sum().backward()
    x64, W, b, dy64 = host(x), host(head.weight), host(head.bias), host(dy)
    assert_close_to(y, x64 @ W.T + b, "y")
    assert_close_to(head.bias.grad, reduction.reference(dy64.reshape(-1, OUT_IQN)), "dbias")
    assert_close_to(head.weight.grad, dy64.reshape(-1, OUT_IQN).T @ x64.reshape(-1, IN_IQN), "dweight")
    assert_close_to(x.grad, dy64 @ W, "dx")


def test_quantile_linear_bias_gradient_is_foxcutes_column_sum(monkeypatch):
    summed = []

    def spy(G):
        summed.append(tuple(G.shape))
        return torch.ops.foxcute.column_sum(G)

    monkeypatch.setattr(ops, "column_sum", spy)
    head = QuantileLinear(IN_IQN, OUT_IQN)
    head(randn(B, Q, IN_IQN)).sum().backward()
    assert summed == [(B * Q, OUT_IQN)]  # the flattened rows, once


def peer_pairs():
    """(name, module call, peer call): the same function of the same float32 tensors, the
    module through foxcute's operators, the peer in plain torch (autograd backward)."""
    mamba = Mamba2Temporal(SH2, D)
    qd = QDenoise(A_Q, H_Q)
    kan_layer = KAN(I_KAN, O_KAN, G_KAN)
    cur = CuriosityModel(F, A, H_C)
    risk = RiskBudgetHead(SH2, I_RISK, H_RISK)
    a = torch.randint(0, A, (B,))
    return {
        "mamba2": (mamba, lambda m, x: m(x[0], x[1], 0.8),
                   lambda m, x: mamba2_peer.forward(x[0], x[1], m.W_A, m.W_B, m.W_C, m.w, 0.8),
                   [randn(B, K, SH2, grad=True), randn(B, SH2, grad=True)]),
        "q_denoise": (qd, lambda m, x: m(x[0], x[1]),
                      lambda m, x: q_denoise_peer.loss(x[0], x[1], m.W1, m.b1, m.W2, m.b2),
                      [randn(B, A_Q, grad=True), randn(B, A_Q)]),
        "kan": (kan_layer, lambda m, x: m(x[0]), lambda m, x: kan_peer.forward(x[0], m.C, m.Wb),
                [randn(B, I_KAN, grad=True)]),
        "curiosity": (cur, lambda m, x: m(x[0], a, x[1])[0],
                      lambda m, x: curiosity_peer.forward(x[0], a, x[1], m.W1, m.b1, m.W2, m.b2)[0],
                      [randn(B, F, grad=True), randn(B, F)]),
        "risk_budget": (risk, lambda m, x: m(*x), lambda m, x: risk_peer.forward(*x, m.W1, m.b1, m.w2, m.b2),
                        [randn(B, SH2, grad=True), randn(I_RISK, grad=True), randn(B, grad=True)]),
    }


@pytest.mark.parametrize("layer", ["mamba2", "q_denoise", "kan", "curiosity", "risk_budget"])
def test_gradients_match_autograd_through_the_peer(layer):
    module, call, peer_call, inputs = peer_pairs()[layer]
    weight = randn(*call(module, inputs).shape)  # one upstream gradient for both
    leaves = [*module.parameters(), *(x for x in inputs if x.requires_grad)]
    ours = torch.autograd.grad((call(module, inputs) * weight).sum(), leaves)
    theirs = torch.autograd.grad((peer_call(module, inputs) * weight).sum(), leaves)
    for index, (got, ref) in enumerate(zip(ours, theirs)):
        assert got.shape == ref.shape, index
        assert rel_err(got, ref) <= BOUND, (index, rel_err(got, ref))


def test_compiled_fullgraph_equals_eager():
    # "aot_eager" traces forward and backward as inductor would (AOT autograd over the fake
    # implementations and the autograd registrations) without needing a C++ compiler;
    # fullgraph=True fails on any graph break
    model, x = torch_step(StepSizes(**SMALL_STEP), inputs_require_grad=True)
    leaves = [*model.parameters(), *(v for v in x.values() if v.requires_grad)]
    eager_loss = model(x)
    eager = torch.autograd.grad(eager_loss, leaves)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    compiled_loss = compiled(x)
    grads = torch.autograd.grad(compiled_loss, leaves)
    assert torch.equal(compiled_loss, eager_loss)
    for index, (got, ref) in enumerate(zip(grads, eager)):
        assert torch.equal(got, ref), index


def test_bad_inputs_are_rejected_naming_the_argument():
    layer = Mamba2Temporal(SH2, D)
    with pytest.raises(FoxcuteInputError, match=r"mamba2.forward: argument 'h' has SH2=11"):
        layer(randn(B, K, SH2, grad=True), randn(B, SH2 + 1), 0.9)
    assert layer.W_A.grad is None
    with pytest.raises(BackendError, match=r"mamba2.forward: precision='tf16' is not offered"):
        Mamba2Temporal(SH2, D, precision="tf16")(randn(B, K, SH2), randn(B, SH2))
    with pytest.raises(FoxcuteInputError, match=r"curiosity.forward_backward: argument 'a' holds action index 2"):
        CuriosityModel(F, A, H_C)(randn(B, F), torch.full((B,), A), randn(B, F))
    with pytest.raises(FoxcuteInputError, match=r"kan.forward: argument 'x' must have 2 dimension"):
        KAN(I_KAN, O_KAN, G_KAN)(randn(B, I_KAN, 1))
    with pytest.raises(FoxcuteInputError, match=r"risk_budget.forward: argument 'e' has B=6"):
        RiskBudgetHead(SH2, I_RISK, H_RISK)(randn(B, SH2), randn(I_RISK), randn(B - 1))
    with pytest.raises(FoxcuteInputError, match=r"argument 'b2' must be a one-element tensor"):
        ops.risk_budget_forward(randn(B, SH2), randn(I_RISK), randn(B), randn(H_RISK, SH2 + I_RISK + 1),
                                randn(H_RISK), randn(H_RISK), randn(2), "tf32")
    with pytest.raises(FoxcuteInputError, match=r"column_sum: argument 'G' must have 2 dimension"):
        ops.column_sum(randn(B))


def test_the_step_through_the_operators_gives_the_steps_outputs_eager_and_compiled():
    """foxcute.torch.step.run: the eight operator calls of the step (on the CPU, each the float64
    reference rounded to float32) give step.run's reference outputs, by the same names; under
    torch.compile(fullgraph=True) (no graph break) the same bits."""
    from foxcute import step
    from foxcute.checks import rel_err
    from foxcute.torch import step as operator_step

    sizes = step.StepSizes(B=9, K=3, SH2=12, D=4, Q=2, A_q=5, H_q=7, A=3, H_c=6, I_risk=3, H_risk=5,
                           I_kan=4, O_kan=5, G_kan=3, H_iqn=6)
    host = step.make_inputs(sizes, np.random.default_rng(3))
    reference = step.run(host)
    x = {layer: {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
                 for k, v in arrays.items()} for layer, arrays in host.items()}
    out = operator_step.run(x)
    assert list(out) == list(reference)
    assert max(rel_err(np.asarray(out[k]), np.asarray(reference[k])) for k in reference) < 1e-6
    compiled = torch.compile(operator_step.run, fullgraph=True, backend="aot_eager")(x)
    assert all(torch.equal(out[k], compiled[k]) for k in out)


def test_the_benchmarks_operator_impls_run_every_pass_with_its_inputs_in_order():
    """lab.benchmarks' "torch_ops" implementation maps each case's inputs onto its operator and
    the operator's outputs onto the case's: on the CPU (the operators' reference path) every
    output matches the case's float64 reference to float32 rounding."""
    from foxcute.lab import benchmarks

    impl = next(i for i in benchmarks.impls() if i.name == "torch_ops")
    rng = np.random.default_rng(4)
    for case in benchmarks.CASES:
        assert impl.applies(case), case.name
        inputs = case.make(rng, case.odd_sizes)
        x = {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
        outputs = benchmarks.flatten(impl.make(case, x)())
        errors = benchmarks.output_errors(case, inputs, outputs, benchmarks.reference(case, inputs))
        assert set(errors) == set(case.outputs) and max(errors.values()) < 1e-6, (case.name, errors)
    assert not any(impl.applies(case) for case in benchmarks.GEMM_CASES)


@pytest.mark.parametrize("name", ["torch_ops", "torch_ops_graph", "torch_ops_compile"])
def test_the_operator_step_records_run_the_operator_step(name):
    """The profiling notebook's step records "torch_ops" (plain calls), "torch_ops_graph" and
    "torch_ops_compile" (captured) run foxcute.torch.step (compiled fullgraph for the last)."""
    from foxcute import step
    from foxcute.lab import breakdown

    sizes = step.StepSizes(B=5, K=2, SH2=8, D=4, Q=2, A_q=3, H_q=4, A=2, H_c=5, I_risk=2, H_risk=3,
                           I_kan=3, O_kan=2, G_kan=2, H_iqn=4)
    host_inputs = step.make_inputs(sizes, np.random.default_rng(5))
    x = {layer: {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
                 for k, v in arrays.items()} for layer, arrays in host_inputs.items()}
    fn, graph = breakdown._step_function(name, x, "tf32", "fused")
    assert graph == (name != "torch_ops")
    out = fn()
    reference = step.run(host_inputs)
    assert list(out) == list(reference)
    assert max(rel_err(np.asarray(out[k]), np.asarray(reference[k])) for k in reference) < 1e-6
