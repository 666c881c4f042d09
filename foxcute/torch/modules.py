"""The layers as torch.nn.Modules over foxcute's operators (foxcute.torch.ops): each owns its
parameters, sized by its constructor's arguments (defaults: the trainer's sizes of
docs/layers.md and step.StepSizes), and loss.backward() fills every parameter's .grad and the
inputs' gradients that docs/layers.md defines. On CUDA the passes are foxcute's kernels; on the
CPU the float64 reference (see foxcute.torch.ops). They work in eager mode, under
torch.compile(fullgraph=True), and inside torch.cuda.graph capture.

Initialisation (all in float32, from torch's global generator): weight matrices standard
normal scaled by 1/sqrt(fan-in) so activations stay of order one (as step.make_inputs draws
them), biases zero; the Mamba2 routing weight w ones (the public function's w=None).

The CuTe kernels take float32, C-contiguous tensors; the size limits of each layer are
docs/layers.md's (a module at other sizes builds, and its first CUDA call raises
FoxcuteInputError naming the size).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import ops


def _weight(rows: int, fan_in: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(rows, fan_in) / fan_in**0.5)


def _bias(size: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(size))


class Mamba2Temporal(nn.Module):
    """Mamba2 temporal layer (docs/layers.md section 1): out = h + ctx[:, None] * w[None, :].

    Parameters W_A, W_B, W_C [SH2, D] (standard normal / sqrt(SH2): used as h @ W) and w [SH2]
    (ones). forward(h_hist [B, K, SH2], h [B, SH2], sigma) -> out [B, SH2]; sigma is the
    trainer's stability signal, a Python float passed to the kernel at launch (no gradient;
    a captured graph keeps the value it was captured with). impl "fused" | "seed" and
    precision "tf32" | "fp32" choose the CuTe kernels. The backward recomputes the scan from
    the saved inputs (the mamba2_backward operator)."""

    def __init__(self, SH2: int = 256, D: int = 16, *, impl: str = "fused", precision: str = "tf32"):
        super().__init__()
        self.impl, self.precision = impl, precision
        self.W_A, self.W_B, self.W_C = (nn.Parameter(torch.randn(SH2, D) / SH2**0.5) for _ in range(3))
        self.w = nn.Parameter(torch.ones(SH2))

    def forward(self, h_hist: Tensor, h: Tensor, sigma: float = 1.0) -> Tensor:
        return ops.mamba2_forward(h_hist, h, self.W_A, self.W_B, self.W_C, self.w, sigma, self.impl,
                                  self.precision)


class QDenoise(nn.Module):
    """Q-denoise MLP A -> H -> A (docs/layers.md section 2) and its loss.

    Parameters W1 [H, A], b1 [H], W2 [A, H], b2 [A]. forward(q [B, A], q_target [B, A]) ->
    loss (0-dim) = mean((y - q_target)^2); its backward gives the parameters and q their
    gradients (q_target none). The one CUDA kernel computes the loss and every gradient in the
    forward; backward scales them by the incoming gradient."""

    def __init__(self, A: int = 12, H: int = 24, *, precision: str = "tf32"):
        super().__init__()
        self.precision = precision
        self.W1, self.b1 = _weight(H, A), _bias(H)
        self.W2, self.b2 = _weight(A, H), _bias(A)

    def forward(self, q: Tensor, q_target: Tensor) -> Tensor:
        return ops.q_denoise_loss_and_grads(q, q_target, self.W1, self.b1, self.W2, self.b2, self.precision)[0]


class KAN(nn.Module):
    """KAN layer with G Gaussian RBFs per input (docs/layers.md section 4): y = phi(x) @ C^T +
    silu(x) @ Wb^T.

    Parameters C [O, I*G] (standard normal / sqrt(I*G)) and Wb [O, I] (/ sqrt(I)).
    forward(x [B, I]) -> y [B, O]; the backward is the kan_backward operator."""

    def __init__(self, I: int = 32, O: int = 32, G: int = 8, *, precision: str = "tf32"):
        super().__init__()
        self.precision = precision
        self.C = _weight(O, I * G)
        self.Wb = _weight(O, I)

    def forward(self, x: Tensor) -> Tensor:
        return ops.kan_forward(x, self.C, self.Wb, self.precision)


class CuriosityModel(nn.Module):
    """Curiosity forward model (docs/layers.md section 5), forward and backward in one kernel.

    Parameters W1 [H, F + A], b1 [H], W2 [F, H], b2 [F]. forward(s [B, F], a [B] int32/int64
    in [0, A), s_next [B, F]) -> (loss 0-dim, r [B]); the loss's backward gives the
    parameters and s their gradients (s_next and a none); r is the curiosity signal and carries
    no gradient. On CUDA the action range is not checked unless FOXCUTE_CHECK_ACTIONS=1 (a
    host read, which graph capture forbids)."""

    def __init__(self, F: int = 256, A: int = 3, H: int = 128, *, precision: str = "tf32"):
        super().__init__()
        self.precision = precision
        self.W1, self.b1 = _weight(H, F + A), _bias(H)
        self.W2, self.b2 = _weight(F, H), _bias(F)

    def forward(self, s: Tensor, a: Tensor, s_next: Tensor) -> tuple[Tensor, Tensor]:
        loss, r, *_ = ops.curiosity_forward_backward(s, a, s_next, self.W1, self.b1, self.W2, self.b2,
                                                     self.precision)
        return loss, r


class RiskBudgetHead(nn.Module):
    """Risk budget head (docs/layers.md section 6): risk = sigmoid(relu([h, isv, e] @ W1^T + b1)
    @ w2 + b2) in (0, 1).

    Parameters W1 [H, SH2 + I + 1] (/ sqrt(SH2 + I + 1)), b1 [H], w2 [H] (/ sqrt(H)), b2 (0-dim).
    forward(h [B, SH2], isv [I], e [B]) -> risk [B]. The forward is foxcute's kernel; the
    backward (gradients of every parameter and of h, isv and e) is PyTorch ops on the same math,
    as foxcute has no backward kernel for this head."""

    def __init__(self, SH2: int = 256, I: int = 16, H: int = 64, *, precision: str = "tf32"):
        super().__init__()
        self.precision = precision
        self.W1, self.b1 = _weight(H, SH2 + I + 1), _bias(H)
        self.w2 = nn.Parameter(torch.randn(H) / H**0.5)
        self.b2 = nn.Parameter(torch.zeros(()))

    def forward(self, h: Tensor, isv: Tensor, e: Tensor) -> Tensor:
        return ops.risk_budget_forward(h, isv, e, self.W1, self.b1, self.w2, self.b2, self.precision)


class _AddBiasReducedByColumnSum(torch.autograd.Function):
    """y + bias (broadcast over y's rows), whose bias gradient is foxcute's column_sum of the
    incoming gradient's rows (docs/layers.md section 3) instead of torch's reduction."""

    @staticmethod
    def forward(y: Tensor, bias: Tensor) -> Tensor:
        return y + bias

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, dy: Tensor):
        return dy, ops.column_sum(dy.reshape(-1, dy.shape[-1]).contiguous())


class QuantileLinear(nn.Module):
    """The IQN quantile head's linear layer: y = x @ weight^T + bias over any leading
    dimensions (the trainer's [B, Q, in_features], B*Q = 524288 rows at the defaults).

    Parameters weight [out_features, in_features] (/ sqrt(in_features)), bias [out_features]
    (zeros). The bias gradient is foxcute's column_sum over the flattened rows of the output
    gradient (the trainer's IQN bias reduction, N = out_features <= 4096); the weight and input
    gradients are torch's matmuls."""

    def __init__(self, in_features: int = 128, out_features: int = 3):
        super().__init__()
        self.weight = _weight(out_features, in_features)
        self.bias = _bias(out_features)

    def forward(self, x: Tensor) -> Tensor:
        return _AddBiasReducedByColumnSum.apply(torch.nn.functional.linear(x, self.weight), self.bias)
