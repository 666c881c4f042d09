"""The agent: a distributional (IQN) DQN over a Mamba2 trunk, in two backends with one set of
parameters.

    x_t     = [features of step t, previous position]                 [B, K, N_FEATURES + 1]
    h_hist  = tanh(embed(x))                                           [B, K, SH2]
    out     = Mamba2(h_hist, h = h_hist[:, -1], sigma)                 [B, SH2]  (the trunk)
    k       = KAN(kan_in(out))                                         [B, O_kan]
    phi     = relu(tau_embed(cos(pi * j * tau)), j = 1..N_COS)         [B, N, O_kan] for N quantile levels tau
    Z       = iqn_out(relu(iqn_hidden(k[:, None] * phi)))              [B, N, A]  quantiles of the return
    Q       = mean of Z over the A_q / A fixed levels (i + 1/2) / (A_q / A)

and the heads the trainer gives the other layers: the Q-denoise MLP on Z at the fixed levels
([B, A_q], A_q = 12 at the defaults: 3 actions x 4 levels), the curiosity model on
(out, action, next state's out), the risk budget head on (out, the market's signal vector,
the curiosity error). `iqn_hidden` and `iqn_out` are QuantileLinear: at N = Q their bias
gradients are the column sums of the trainer's [B*Q, H_iqn] and [B*Q, A] gradients.

backend="foxcute": the layers are foxcute.torch.modules (the CuTe kernels on CUDA, the float64
reference on the CPU). backend="torch": the same module classes with their forward replaced by
foxcute.peers' plain-PyTorch math and autograd (and the QuantileLinear bias gradient torch's own
sum), so parameter names, shapes and initialisation are identical: with the same torch seed the
two backends build the same weights, and one state_dict loads into either. The embedding and
projections (embed, kan_in, tau_embed) are torch.nn.Linear in both.

Sizes are a foxcute.step.StepSizes (B is the learner's batch, not the agent's); each CUDA
kernel's size limits are docs/layers.md's.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .. import step
from ..peers import curiosity as peer_curiosity
from ..peers import kan as peer_kan
from ..peers import mamba2 as peer_mamba2
from ..peers import q_denoise as peer_q_denoise
from ..peers import risk_budget as peer_risk_budget
from ..torch import modules
from .market import N_FEATURES

BACKENDS = ("foxcute", "torch")
PRECISIONS = ("tf32", "fp32")
N_COS = 32  # cosine features of a quantile level (the IQN paper's 64 halved: O_kan = 32 wide)


class _TorchMamba2(modules.Mamba2Temporal):
    def forward(self, h_hist: Tensor, h: Tensor, sigma: float = 1.0) -> Tensor:
        return peer_mamba2.forward(h_hist, h, self.W_A, self.W_B, self.W_C, self.w, sigma)


class _TorchQDenoise(modules.QDenoise):
    def forward(self, q: Tensor, q_target: Tensor) -> Tensor:
        return peer_q_denoise.loss(q, q_target.detach(), self.W1, self.b1, self.W2, self.b2)


class _TorchKAN(modules.KAN):
    def forward(self, x: Tensor) -> Tensor:
        return peer_kan.forward(x, self.C, self.Wb)


class _TorchCuriosity(modules.CuriosityModel):
    def forward(self, s: Tensor, a: Tensor, s_next: Tensor) -> tuple[Tensor, Tensor]:
        loss, r = peer_curiosity.forward(s, a, s_next.detach(), self.W1, self.b1, self.W2, self.b2)
        return loss, r.detach()  # as foxcute's: r carries no gradient


class _TorchRiskBudget(modules.RiskBudgetHead):
    def forward(self, h: Tensor, isv: Tensor, e: Tensor) -> Tensor:
        return peer_risk_budget.forward(h, isv, e, self.W1, self.b1, self.w2, self.b2)


class _TorchQuantileLinear(modules.QuantileLinear):
    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


_LAYERS = {
    "foxcute": dict(mamba2=modules.Mamba2Temporal, q_denoise=modules.QDenoise, kan=modules.KAN,
                    curiosity=modules.CuriosityModel, risk=modules.RiskBudgetHead, quantile=modules.QuantileLinear),
    "torch": dict(mamba2=_TorchMamba2, q_denoise=_TorchQDenoise, kan=_TorchKAN, curiosity=_TorchCuriosity,
                  risk=_TorchRiskBudget, quantile=_TorchQuantileLinear),
}


def check_sizes(sizes: step.StepSizes) -> None:
    """ValueError naming the size unless the agent can be built at `sizes`."""
    if sizes.A != 3:
        raise ValueError(f"Agent: sizes.A must be 3 (short, flat, long), got {sizes.A}")
    if sizes.A_q % sizes.A:
        raise ValueError(f"Agent: sizes.A_q must be a multiple of sizes.A (the Q-denoise input is A actions x "
                         f"A_q / A fixed quantile levels), got A_q={sizes.A_q}, A={sizes.A}")
    if sizes.I_risk < 2 * N_FEATURES:
        raise ValueError(f"Agent: sizes.I_risk must be >= {2 * N_FEATURES} (the market's signal vector), "
                         f"got {sizes.I_risk}")


class Agent(nn.Module):
    """The agent of the module docstring. Agent(sizes, backend="foxcute" | "torch",
    precision="tf32" | "fp32" (foxcute's kernels; the torch backend follows torch's own TF32
    flag), sigma (Mamba2's stability signal, a constant here)). Parameters are drawn from
    torch's global generator in construction order, the same for both backends."""

    def __init__(self, sizes: step.StepSizes, *, backend: str = "foxcute", precision: str = "tf32",
                 sigma: float = 0.95):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"Agent: backend must be one of {BACKENDS}, got {backend!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"Agent: precision must be one of {PRECISIONS}, got {precision!r}")
        check_sizes(sizes)
        z, layer = sizes, _LAYERS[backend]
        self.sizes, self.backend, self.sigma = sizes, backend, float(sigma)
        fox = dict(precision=precision) if backend == "foxcute" else {}
        self.embed = nn.Linear(N_FEATURES + 1, z.SH2)
        self.mamba2 = layer["mamba2"](z.SH2, z.D, **fox)
        self.kan_in = nn.Linear(z.SH2, z.I_kan)
        self.kan = layer["kan"](z.I_kan, z.O_kan, z.G_kan, **fox)
        self.tau_embed = nn.Linear(N_COS, z.O_kan)
        self.iqn_hidden = layer["quantile"](z.O_kan, z.H_iqn)
        self.iqn_out = layer["quantile"](z.H_iqn, z.A)
        self.q_denoise = layer["q_denoise"](z.A_q, z.H_q, **fox)
        self.curiosity = layer["curiosity"](z.SH2, z.A, z.H_c, **fox)
        self.risk = layer["risk"](z.SH2, z.I_risk, z.H_risk, **fox)
        levels = (torch.arange(z.A_q // z.A, dtype=torch.float32) + 0.5) / (z.A_q // z.A)
        self.register_buffer("fixed_levels", levels, persistent=False)
        self.register_buffer("cos_index", torch.arange(1, N_COS + 1, dtype=torch.float32) * math.pi,
                             persistent=False)

    def trunk(self, obs: Tensor, prev_position: Tensor) -> Tensor:
        """out [B, SH2] from obs [B, K, N_FEATURES] and prev_position [B]."""
        position = prev_position[:, None, None].expand(-1, obs.shape[1], 1)
        h_hist = torch.tanh(self.embed(torch.cat([obs, position], dim=2)))
        return self.mamba2(h_hist, h_hist[:, -1].contiguous(), self.sigma)

    def quantiles(self, out: Tensor, levels: Tensor) -> Tensor:
        """Z [B, N, A]: the return's quantiles at levels [B, N] (in (0, 1)) for every action."""
        k = self.kan(self.kan_in(out))
        phi = torch.relu(self.tau_embed(torch.cos(levels[:, :, None] * self.cos_index)))
        return self.iqn_out(torch.relu(self.iqn_hidden(k[:, None, :] * phi)))

    def fixed_quantiles(self, out: Tensor) -> Tensor:
        """Z at the fixed levels, [B, A_q / A, A]."""
        return self.quantiles(out, self.fixed_levels.expand(out.shape[0], -1))

    def q_values(self, out: Tensor) -> Tensor:
        """Q [B, A]: the mean of the fixed-level quantiles."""
        return self.fixed_quantiles(out).mean(dim=1)
