"""One synthetic training step, spec section 7: the layers chained as the trainer chains them.

    out          = Mamba2 forward(h_hist, h, ...)                 [B, SH2]
    loss_c, r    = curiosity forward+backward(s = out, a, s_next)  (F = SH2)
    risk         = risk budget forward(h = out, isv, e = r)
    loss_q       = Q-denoise loss + backward(q, q_target)
    IQN bias     = column_sum of the IQN head's gradients [B*Q, A] and its hidden layer's [B*Q, H_iqn]
    KAN grads    = KAN backward(dy, x)
    Mamba2 grads = Mamba2 backward(dout)

Every layer is called through its public function, so `backend` passes through unchanged:
a backend is offered for the step when every layer it chains offers it. The gradients that
would come from the rest of the trainer (dout, the IQN gradients, the KAN's dy) are inputs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy

from . import _layer, curiosity, kan, mamba2, q_denoise, reduction, risk_budget
from ._arrays import check_backend

_LAYERS = ("mamba2", "curiosity", "risk_budget", "q_denoise", "kan")


@dataclasses.dataclass(frozen=True)
class StepSizes:
    """Sizes of one step; the defaults are the trainer's (and the benchmarks')."""

    B: int = 8192       # batch
    K: int = 8          # Mamba2 history length
    SH2: int = 256      # trunk width (also the curiosity model's state size F)
    D: int = 16         # Mamba2 state size
    Q: int = 64         # IQN quantile samples per state
    A_q: int = 12       # Q-denoise width
    H_q: int = 24       # Q-denoise hidden width
    A: int = 3          # actions (curiosity one-hot, IQN head outputs)
    H_c: int = 128      # curiosity hidden width
    I_risk: int = 16    # risk budget signal vector length
    H_risk: int = 64    # risk budget hidden width
    I_kan: int = 32     # KAN inputs
    O_kan: int = 32     # KAN outputs
    G_kan: int = 8      # KAN basis functions per input
    H_iqn: int = 128    # IQN hidden width

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 1:
                raise ValueError(f"StepSizes.{field.name} must be >= 1, got {getattr(self, field.name)}")
        if self.G_kan < 2:
            raise ValueError(f"StepSizes.G_kan must be >= 2 (the RBF width is 4/(G-1)), got {self.G_kan}")

    @property
    def F(self) -> int:
        """The curiosity model's state size: its state is the Mamba2 output."""
        return self.SH2


def offered_backends() -> tuple[str, ...]:
    """The backends every layer of the step offers (column_sum included)."""
    offered = [_layer.offered_backends(layer) for layer in _LAYERS] + [reduction.offered_backends()]
    return tuple(b for b in offered[0] if all(b in layer for layer in offered[1:]))


def make_inputs(sizes: StepSizes, rng: numpy.random.Generator, xp: Any = numpy) -> dict[str, dict[str, Any]]:
    """Random float32 inputs of one step, per layer, as `xp.asarray` arrays (numpy or cupy);
    action indices int32, sigma and the risk head's b2 Python floats. Weights are scaled by
    1/sqrt(fan-in) so activations stay of order one."""
    n = sizes

    def normal(*shape, scale=1.0):
        return xp.asarray(rng.standard_normal(shape, dtype=numpy.float32) * numpy.float32(scale))

    def weight(rows, cols):  # used as x @ weight.T: fan-in is cols
        return normal(rows, cols, scale=cols**-0.5)

    def state_weight():  # [SH2, D], used as h @ W: fan-in is SH2
        return normal(n.SH2, n.D, scale=n.SH2**-0.5)

    return {
        "mamba2": dict(h_hist=normal(n.B, n.K, n.SH2), h=normal(n.B, n.SH2), W_A=state_weight(),
                       W_B=state_weight(), W_C=state_weight(),
                       w=xp.asarray(1 + 0.1 * rng.standard_normal(n.SH2, dtype=numpy.float32)),
                       sigma=0.95),
        "mamba2_backward": dict(dout=normal(n.B, n.SH2)),
        "curiosity": dict(a=xp.asarray(rng.integers(0, n.A, n.B, dtype=numpy.int32)),
                          s_next=normal(n.B, n.F), W1=weight(n.H_c, n.F + n.A),
                          b1=normal(n.H_c, scale=0.1), W2=weight(n.F, n.H_c), b2=normal(n.F, scale=0.1)),
        "risk_budget": dict(isv=normal(n.I_risk), W1=weight(n.H_risk, n.SH2 + n.I_risk + 1),
                            b1=normal(n.H_risk, scale=0.1), w2=normal(n.H_risk, scale=n.H_risk**-0.5),
                            b2=0.1),
        "q_denoise": dict(q=normal(n.B, n.A_q), q_target=normal(n.B, n.A_q), W1=weight(n.H_q, n.A_q),
                          b1=normal(n.H_q, scale=0.1), W2=weight(n.A_q, n.H_q), b2=normal(n.A_q, scale=0.1)),
        "iqn": dict(head_grad=normal(n.B * n.Q, n.A), hidden_grad=normal(n.B * n.Q, n.H_iqn)),
        "kan": dict(dy=normal(n.B, n.O_kan), x=normal(n.B, n.I_kan),
                    C=weight(n.O_kan, n.I_kan * n.G_kan), Wb=weight(n.O_kan, n.I_kan)),
    }


def run(inputs: dict[str, dict[str, Any]], *, backend: str = "reference", precision: str = "tf32",
        impl: str = "fused") -> dict[str, Any]:
    """Runs one step on `make_inputs`'s inputs; returns every output by "layer.name"."""
    check_backend("foxcute.step.run", backend, offered_backends())
    gpu = dict(backend=backend, precision=precision)
    m = inputs["mamba2"]
    out = mamba2.forward(**m, impl=impl, **gpu)
    loss_c, r, grads_c = curiosity.forward_backward(out, **inputs["curiosity"], **gpu)
    risk = risk_budget.forward(out, e=r, **inputs["risk_budget"], **gpu)
    loss_q, grads_q = q_denoise.loss_and_grads(**inputs["q_denoise"], **gpu)
    iqn = inputs["iqn"]
    head_bias = reduction.column_sum(iqn["head_grad"], backend=backend)
    hidden_bias = reduction.column_sum(iqn["hidden_grad"], backend=backend)
    grads_k = kan.backward(**inputs["kan"], **gpu)
    grads_m = mamba2.backward(inputs["mamba2_backward"]["dout"], **m, impl=impl, **gpu)
    return {
        "mamba2.out": out,
        "curiosity.loss": loss_c,
        "curiosity.r": r,
        **{f"curiosity.{k}": v for k, v in grads_c._asdict().items()},
        "risk_budget.risk": risk,
        "q_denoise.loss": loss_q,
        **{f"q_denoise.{k}": v for k, v in grads_q._asdict().items()},
        "iqn.head_bias_grad": head_bias,
        "iqn.hidden_bias_grad": hidden_bias,
        **{f"kan.{k}": v for k, v in grads_k._asdict().items()},
        **{f"mamba2.{k}": v for k, v in grads_m._asdict().items()},
    }
