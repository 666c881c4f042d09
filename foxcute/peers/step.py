"""The synthetic training step (docs/layers.md section 7, foxcute.step) in plain PyTorch: the
layers' forwards from foxcute.peers, every gradient by autograd, run eagerly, under
torch.compile (mode "default" or "max-autotune-no-cudagraphs": Triton GEMM and kernel
autotuning, no CUDA graphs of torch's own, so that the caller can capture the step in one), or
under torch.compile(mode="reduce-overhead") (torch's own CUDA graphs).

The step's gradients are those of separate objectives, as foxcute.step computes them: Mamba2's
from sum(dout * out), the curiosity model's from its loss with its state s = out taken as an
input (ds is not sent back into Mamba2), Q-denoise's from its loss, the KAN's from
sum(dy * y). The objectives share no leaf, so one autograd pass over their sum gives each its
own gradients. The step is two functions for that reason: `trunk` (Mamba2 forward) and
`heads` (everything fed by its output, which enters as a fresh leaf).
"""

from __future__ import annotations

from typing import Any

import torch

from . import curiosity, kan, mamba2, q_denoise, risk_budget

MODES = ("eager", "compile", "max-autotune-no-cudagraphs", "reduce-overhead")
PRECISIONS = ("tf32", "fp32")

# Per layer: the inputs that get a gradient, in the order of the layer's gradient outputs.
GRAD_INPUTS = {
    "mamba2": ("W_A", "W_B", "W_C", "w", "sigma", "h_hist", "h"),
    "curiosity": ("W1", "b1", "W2", "b2", "s"),
    "q_denoise": ("W1", "b1", "W2", "b2", "q"),
    "kan": ("C", "Wb", "x"),
}
GRAD_NAMES = {
    "mamba2": ("dW_A", "dW_B", "dW_C", "dw", "dsigma", "dh_hist", "dh"),
    "curiosity": ("dW1", "db1", "dW2", "db2", "ds"),
    "q_denoise": ("dW1", "db1", "dW2", "db2", "dq"),
    "kan": ("dC", "dWb", "dx"),
}


def trunk(m: dict[str, Any], dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba2 forward: (out, sum(dout * out)), the objective whose gradient is its backward."""
    out = mamba2.forward(m["h_hist"], m["h"], m["W_A"], m["W_B"], m["W_C"], m["w"], m["sigma"])
    return out, (dout * out).sum()


def heads(s: torch.Tensor, x: dict[str, dict[str, Any]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Everything after the Mamba2 forward, its output entering as s: (the sum of the
    curiosity, Q-denoise and KAN objectives, the forward outputs by foxcute.step's names)."""
    c, rb, qd, iqn, k = x["curiosity"], x["risk_budget"], x["q_denoise"], x["iqn"], x["kan"]
    loss_c, r = curiosity.forward(s, c["a"], c["s_next"], c["W1"], c["b1"], c["W2"], c["b2"])
    risk = risk_budget.forward(s.detach(), rb["isv"], r.detach(), rb["W1"], rb["b1"], rb["w2"], rb["b2"])
    loss_q = q_denoise.loss(qd["q"], qd["q_target"], qd["W1"], qd["b1"], qd["W2"], qd["b2"])
    y = kan.forward(k["x"], k["C"], k["Wb"])
    objective = loss_c + loss_q + (k["dy"] * y).sum()
    return objective, {"curiosity.loss": loss_c, "curiosity.r": r, "risk_budget.risk": risk,
                       "q_denoise.loss": loss_q, "iqn.head_bias_grad": iqn["head_grad"].sum(dim=0),
                       "iqn.hidden_bias_grad": iqn["hidden_grad"].sum(dim=0)}


class Step:
    """One step of the peer. `Step(mode, precision)(inputs)` takes foxcute.step's inputs as
    torch CUDA tensors (step.to_device(..., "torch")) and returns foxcute.step.run's outputs
    by the same names. precision "tf32" lets matmuls use TF32 (torch.backends.cuda.matmul.
    allow_tf32, set for the call and restored after), "fp32" forbids it.

    Modes "eager", "compile" and "max-autotune-no-cudagraphs" launch on the current stream:
    once the first calls have compiled, foxcute.lab.breakdown captures a call in a CUDA graph
    and times its replays, as it times the cute step (timing.check_graph_replay first).

    mode "reduce-overhead": the outputs live in torch's CUDA-graph memory and the next call
    overwrites them; copy what must outlive it."""

    def __init__(self, mode: str = "eager", precision: str = "tf32"):
        if mode not in MODES:
            raise ValueError(f"foxcute.peers.step: mode must be one of {MODES}, got {mode!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"foxcute.peers.step: precision must be one of {PRECISIONS}, got {precision!r}")
        self.mode = mode
        self.tf32 = precision == "tf32"
        if mode == "eager":
            self._trunk, self._heads = trunk, heads
        else:
            options = dict(mode="default" if mode == "compile" else mode, dynamic=False)
            self._trunk, self._heads = torch.compile(trunk, **options), torch.compile(heads, **options)

    def __call__(self, inputs: dict[str, dict[str, Any]]) -> dict[str, torch.Tensor]:
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        try:
            return self._step(inputs)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous

    def _step(self, inputs: dict[str, dict[str, Any]]) -> dict[str, torch.Tensor]:
        if self.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # a new step: earlier outputs may be overwritten
        x = {layer: dict(arrays) for layer, arrays in inputs.items()}
        h = x["mamba2"]["h"]
        # a filled 0-d tensor, not torch.tensor(float): no host-to-device copy (graph capture)
        x["mamba2"]["sigma"] = torch.full((), float(x["mamba2"]["sigma"]), dtype=h.dtype, device=h.device)
        with torch.enable_grad():
            for layer, names in GRAD_INPUTS.items():
                for name in names:
                    if name in x[layer]:
                        x[layer][name] = x[layer][name].detach().requires_grad_()
            out, objective_m = self._trunk(x["mamba2"], x["mamba2_backward"]["dout"])
            x["curiosity"]["s"] = out.detach().requires_grad_()
            objective_h, forward = self._heads(x["curiosity"]["s"], x)
            leaves = [x[layer][name] for layer, names in GRAD_INPUTS.items() for name in names]
            grads = iter(torch.autograd.grad(objective_m + objective_h, leaves))
        named = {layer: {f"{layer}.{g}": next(grads) for g in GRAD_NAMES[layer]} for layer in GRAD_INPUTS}
        f = {k: v.detach() for k, v in forward.items()}
        # foxcute.step.run's order
        return {"mamba2.out": out.detach(), "curiosity.loss": f["curiosity.loss"], "curiosity.r": f["curiosity.r"],
                **named["curiosity"], "risk_budget.risk": f["risk_budget.risk"],
                "q_denoise.loss": f["q_denoise.loss"], **named["q_denoise"],
                "iqn.head_bias_grad": f["iqn.head_bias_grad"], "iqn.hidden_bias_grad": f["iqn.hidden_bias_grad"],
                **named["kan"], **named["mamba2"]}
