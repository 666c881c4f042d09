"""The training step (docs/layers.md section 7) through foxcute's PyTorch operators: what a
PyTorch trainer that calls torch.ops.foxcute.* runs, with the inputs and outputs of
foxcute.step (`step.make_inputs`, copied to torch tensors by `step.to_device`; outputs by
"layer.name").

`run(inputs)` calls the eight operator calls of the step (Mamba2 forward, curiosity,
risk head, Q-denoise, the two IQN column sums, KAN backward, Mamba2 backward) in
step.PARTS order on the current stream, so it can be timed eagerly (host cost included),
captured whole in a CUDA graph, or compiled with torch.compile(fullgraph=True): custom ops
are opaque to the compiler, which schedules them and nothing else. Unlike the cute step
(step.kernel_step) it runs on one stream: the operators do not fork a side lane. On CPU
tensors the operators compute the float64 reference (foxcute.torch.ops).
"""

from __future__ import annotations

from typing import Any

from .. import curiosity, kan, mamba2, q_denoise, step
from . import ops


class OperatorLayers:
    """The step's layer passes through the operators, as step.run_through takes them."""

    def __init__(self, precision: str = "tf32", impl: str = "fused"):
        self.precision, self.impl = precision, impl

    def _mamba2_args(self, m: dict[str, Any]) -> tuple:
        return (m["h_hist"], m["h"], m["W_A"], m["W_B"], m["W_C"], m["w"], float(m["sigma"]))

    def mamba2_forward(self, m):
        return ops.mamba2_forward(*self._mamba2_args(m), self.impl, self.precision)

    def mamba2_backward(self, dout, m):
        return mamba2.Mamba2Grads(*ops.mamba2_backward(dout, *self._mamba2_args(m), self.impl, self.precision))

    def curiosity(self, s, c):
        loss, r, *grads = ops.curiosity_forward_backward(s, c["a"], c["s_next"], c["W1"], c["b1"], c["W2"],
                                                         c["b2"], self.precision)
        return loss, r, curiosity.CuriosityGrads(*grads)

    def risk_budget(self, h, e, rb):
        # the operator takes b2 as a tensor (a trainable parameter on the device)
        return ops.risk_budget_forward(h, rb["isv"], e, rb["W1"], rb["b1"], rb["w2"], ops.risk_b2(rb["b2"], h),
                                       self.precision)

    def q_denoise(self, qd):
        loss, *grads = ops.q_denoise_loss_and_grads(qd["q"], qd["q_target"], qd["W1"], qd["b1"], qd["W2"],
                                                    qd["b2"], self.precision)
        return loss, q_denoise.QDenoiseGrads(*grads)

    def column_sum(self, G):
        return ops.column_sum(G)

    def kan_backward(self, k):
        return kan.KanGrads(*ops.kan_backward(k["dy"], k["x"], k["C"], k["Wb"], self.precision))


def run(inputs: dict[str, dict[str, Any]], *, precision: str = "tf32", impl: str = "fused") -> dict[str, Any]:
    """One step through the operators on `inputs` (step.make_inputs' arrays as torch tensors,
    all on one device); every output by "layer.name", as step.run returns them."""
    return step.run_through(OperatorLayers(precision, impl), inputs)
