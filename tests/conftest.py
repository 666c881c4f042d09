"""Shared test setup: the `gpu` marker skips, with the reason, where no CUDA GPU is usable."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import zlib

import numpy as np
import pytest

# The DSL reads its environment when cutlass is imported: set it (arch, and a dump folder for
# kept PTX that is not the current directory) before any test's importorskip("cutlass").
import foxcute.kernels  # noqa: E402, F401


@functools.lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    try:
        import cupy
    except ImportError as exc:
        return f"cupy is not importable ({exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver: cupy raises CUDARuntimeError
        return f"no CUDA driver/GPU ({type(exc).__name__}: {exc})"
    if count == 0:
        return "no CUDA GPU present"
    major = cupy.cuda.Device(0).compute_capability[:1]
    if major != "9":
        return f"kernels target sm_90a; GPU 0 has compute capability {cupy.cuda.Device(0).compute_capability}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def matmul_operands(rng, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 A [m, k] (standard normal) and B_t [n, k] scaled by 1/sqrt(k), so that the
    entries of A @ B_t^T are of order 1: the GEMM tests' operands."""
    a = rng.standard_normal((m, k), dtype=np.float32)
    b_t = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    return a, b_t


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's name so a failure reproduces."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


def _disassembler() -> list[str] | None:
    """nvdisasm (CUDA toolkit or the nvidia-cuda-nvdisasm wheel) or cuobjdump, as a command
    taking a cubin path; None where neither is installed."""
    found = shutil.which("nvdisasm")
    if found is None and importlib.util.find_spec("nvidia") is not None:
        import nvidia

        for root in nvidia.__path__:
            for cuda in ("cu13", "cu12"):
                path = os.path.join(root, cuda, "bin", "nvdisasm")
                if os.path.exists(path):
                    found = path
    if found is not None:
        return [found, "-c"]
    cuobjdump = shutil.which("cuobjdump")
    return [cuobjdump, "-sass"] if cuobjdump else None


def disassemble(cubin) -> str:
    """The SASS of a cubin file; skips the test where no disassembler is installed."""
    command = _disassembler()
    if command is None:
        pytest.skip("no SASS disassembler (nvdisasm / cuobjdump) installed")
    return subprocess.run([*command, str(cubin)], capture_output=True, text=True, check=True).stdout


# A step small enough for the float64 reference in a blink (tests/test_step_reference.py,
# tests/test_errors.py): its sizes, and its inputs with the reference outputs (seed 7).
SMALL_STEP = dict(B=6, K=3, SH2=10, D=4, Q=5, A_q=5, H_q=7, A=3, H_c=9, I_risk=4, H_risk=6, I_kan=3, O_kan=4,
                  G_kan=5, H_iqn=11)


@pytest.fixture(scope="module")
def ran():
    from foxcute import step

    inputs = step.make_inputs(step.StepSizes(**SMALL_STEP), np.random.default_rng(7))
    return inputs, step.run(inputs)


def torch_step(sizes, device: str = "cpu", inputs_require_grad: bool = False):
    """(model, inputs): foxcute.torch's modules chained as docs/layers.md section 7 chains the
    layers, to one scalar loss (Mamba2 -> curiosity on its output -> the risk head on that
    output and r; Q-denoise; KAN; the IQN head's QuantileLinear over [B, Q, H_iqn] to A), at
    `sizes` (a step.StepSizes), and random float32 inputs on `device` from torch's generator
    (tests/test_torch_ops.py on the CPU, tests/test_gpu_torch.py on CUDA). torch is imported
    here, when called, so that the other tests run without it."""
    import torch

    from foxcute.torch import KAN, CuriosityModel, Mamba2Temporal, QDenoise, QuantileLinear, RiskBudgetHead

    z = sizes

    class StepModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mamba2 = Mamba2Temporal(z.SH2, z.D)
            self.curiosity = CuriosityModel(z.F, z.A, z.H_c)
            self.risk = RiskBudgetHead(z.SH2, z.I_risk, z.H_risk)
            self.q_denoise = QDenoise(z.A_q, z.H_q)
            self.kan = KAN(z.I_kan, z.O_kan, z.G_kan)
            self.iqn = QuantileLinear(z.H_iqn, z.A)

        def forward(self, x):
            out = self.mamba2(x["h_hist"], x["h"], 0.9)
            loss_c, r = self.curiosity(out, x["a"], x["s_next"])
            risk = self.risk(out, x["isv"], r)
            return (loss_c + risk.square().mean() + self.q_denoise(x["q"], x["q_target"])
                    + self.kan(x["kan_x"]).square().mean() + self.iqn(x["iqn_x"]).square().mean())

    def normal(*shape, grad=inputs_require_grad):
        return torch.randn(shape).to(device).requires_grad_(grad)

    inputs = dict(h_hist=normal(z.B, z.K, z.SH2), h=normal(z.B, z.SH2),
                  a=torch.randint(0, z.A, (z.B,), dtype=torch.int32).to(device), s_next=normal(z.B, z.F, grad=False),
                  isv=normal(z.I_risk), q=normal(z.B, z.A_q), q_target=normal(z.B, z.A_q, grad=False),
                  kan_x=normal(z.B, z.I_kan), iqn_x=normal(z.B, z.Q, z.H_iqn))
    return StepModel().to(device), inputs


# foxcute.torch's operators, one per layer pass (torch.ops.foxcute.<name>)
TORCH_OPS = ("mamba2_forward", "mamba2_backward", "q_denoise_loss_and_grads", "column_sum", "kan_forward",
             "kan_backward", "curiosity_forward_backward", "risk_budget_forward")


def torch_op_cases(device: str, B: int, *, mamba2, q_denoise, column_sum, kan, curiosity, risk_budget):
    """{operator name: (operator, arguments)} for torch.library.opcheck: random float32 inputs
    on `device` at batch B and each layer's sizes (mamba2 (K, SH2, D), q_denoise (A, H),
    column_sum (M, N), kan (I, O, G), curiosity (F, A, H), risk_budget (SH2, I, H)); inputs of
    the differentiated operators require grad, so opcheck checks their autograd too."""
    import torch

    from foxcute.torch import ops

    def randn(*shape, grad=False, scale=1.0):
        return (scale * torch.randn(shape)).to(device).requires_grad_(grad)

    K, SH2, D = mamba2
    A_q, H_q = q_denoise
    I, O, G = kan
    F, A, H_c = curiosity
    SH2_r, I_r, H_r = risk_budget
    m = [randn(B, K, SH2, grad=True), randn(B, SH2), randn(SH2, D, grad=True, scale=SH2**-0.5),
         randn(SH2, D, scale=SH2**-0.5), randn(SH2, D, scale=SH2**-0.5), randn(SH2)]
    return {
        "mamba2_forward": (ops.mamba2_forward, (*m, 0.9, "fused", "tf32")),
        "mamba2_backward": (ops.mamba2_backward, (randn(B, SH2), *(t.detach() for t in m), 0.9, "seed", "fp32")),
        "q_denoise_loss_and_grads": (ops.q_denoise_loss_and_grads,
                                     (randn(B, A_q, grad=True), randn(B, A_q), randn(H_q, A_q, grad=True),
                                      randn(H_q), randn(A_q, H_q), randn(A_q), "tf32")),
        "column_sum": (ops.column_sum, (randn(*column_sum),)),
        "kan_forward": (ops.kan_forward, (randn(B, I, grad=True), randn(O, I * G, grad=True), randn(O, I), "tf32")),
        "kan_backward": (ops.kan_backward, (randn(B, O), randn(B, I), randn(O, I * G), randn(O, I), "fp32")),
        "curiosity_forward_backward": (ops.curiosity_forward_backward,
                                       (randn(B, F, grad=True), torch.randint(0, A, (B,), dtype=torch.int32).to(device),
                                        randn(B, F), randn(H_c, F + A, grad=True, scale=(F + A)**-0.5), randn(H_c),
                                        randn(F, H_c, scale=H_c**-0.5), randn(F), "tf32")),
        "risk_budget_forward": (ops.risk_budget_forward,
                                (randn(B, SH2_r, grad=True), randn(I_r, grad=True), randn(B),
                                 randn(H_r, SH2_r + I_r + 1, grad=True), randn(H_r), randn(H_r), randn(grad=True),
                                 "tf32")),
    }
