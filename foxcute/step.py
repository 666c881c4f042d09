"""One synthetic training step, docs/layers.md section 7: the layers chained as the trainer chains them.

    out          = Mamba2 forward(h_hist, h, ...)                 [B, SH2]
    loss_c, r    = curiosity forward+backward(s = out, a, s_next)  (F = SH2)
    risk         = risk budget forward(h = out, isv, e = r)
    loss_q       = Q-denoise loss + backward(q, q_target)
    IQN bias     = column_sum of the IQN head's gradients [B*Q, A] and its hidden layer's [B*Q, H_iqn]
    KAN grads    = KAN backward(dy, x)
    Mamba2 grads = Mamba2 backward(dout)

`run` calls every layer through its public function, so `backend` passes through unchanged:
a backend is offered for the step when every layer it chains offers it. The gradients that
would come from the rest of the trainer (dout, the IQN gradients, the KAN's dy) are inputs.

On the GPU the step also runs straight through the kernel modules (`kernel_step`), which is
what a CUDA graph can capture: the public curiosity function reads the action indices back
to check their range, a device sync that capture forbids, so the arguments are validated by
one `run` first. `capture` records the cute step in a torch CUDA graph to be replayed.
The step is split into PARTS, named after the rows of the trainer's profile, for the
per-kernel breakdown (foxcute.lab.breakdown).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy

from . import _layer, curiosity, kan, mamba2, q_denoise, reduction, risk_budget
from ._arrays import array_kind, check_backend, side_lane
from .checks import elem_err, rel_err, to_numpy

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


# The step's parts, in the order they run; each is one row group of the breakdown, named
# after the trainer's profile (its mamba2_temporal_scan is our Mamba2 forward, its
# mamba2_scan_backward our Mamba2 backward).
PARTS = ("mamba2_forward", "curiosity_fwd_bwd", "risk_budget_forward", "q_denoise_backward",
         "iqn_bias_grad_reduce", "kan_backward", "mamba2_backward")
# Outputs that later parts take as inputs, and the parts that take them.
CHAINED = ("mamba2.out", "curiosity.r")
_CHAINING_PARTS = ("curiosity_fwd_bwd", "risk_budget_forward")
# kernel_step's two streams ("lanes"): the chain (Mamba2 forward -> curiosity -> risk head) and
# what no part of it feeds, split so that work of different kinds overlaps: the main lane's
# small-MLP kernels run one CTA per SM and are latency bound, leaving registers, shared memory
# and DRAM bandwidth to the side lane's memory-bound IQN column sums, then to the Mamba2
# backward (the fastest of five splits on the H200). The run's "cute" and "cute_one_stream"
# records measure what it gains: 247 against 280 us in run 20261203T162501Z. The lanes mostly
# take turns: what each part costs the step is breakdown.marginal_costs' table
# (step_marginal.csv), where the IQN column sums (memory-bound: 268 MB at N=128) cost the step
# most of their own time though the main lane leaves DRAM mostly idle; hiding them needs a
# version that fits on the SMs beside the main lane's kernels (one was built for N=128 and not
# kept). Stream priorities change nothing.
# History: docs/notes/step.md.
LANES = (("mamba2_forward", "curiosity_fwd_bwd", "risk_budget_forward", "q_denoise_backward", "kan_backward"),
         ("iqn_bias_grad_reduce", "mamba2_backward"))
# The side lane forks from the main lane once this part of it is launched, not at the start,
# so the Mamba2 forward (memory-bound, 30 us) runs alone, not beside the IQN column sums that
# want the same DRAM bandwidth and, at 4 CTAs an SM, the SMs (the likely reason; not
# analysed); they run beside curiosity instead. Of the splits measured beside it (forked at
# the start, the column sums or the Mamba2 backward elsewhere, the N=128 sum at other CTAs an
# SM), none was clearly better (docs/notes/step.md).
FORK_AFTER = "mamba2_forward"


class _PublicLayers:
    """Each layer through its public function: every argument validated, then dispatched."""

    def __init__(self, backend: str, precision: str, impl: str):
        self.backend = backend
        self.options = dict(backend=backend, precision=precision)
        self.impl = impl

    def mamba2_forward(self, m):
        return mamba2.forward(**m, impl=self.impl, **self.options)

    def mamba2_backward(self, dout, m):
        return mamba2.backward(dout, **m, impl=self.impl, **self.options)

    def curiosity(self, s, c):
        return curiosity.forward_backward(s, **c, **self.options)

    def risk_budget(self, h, e, rb):
        return risk_budget.forward(h, e=e, **rb, **self.options)

    def q_denoise(self, qd):
        return q_denoise.loss_and_grads(**qd, **self.options)

    def column_sum(self, G):
        return reduction.column_sum(G, backend=self.backend)

    def kan_backward(self, k):
        return kan.backward(**k, **self.options)


class _KernelLayers:
    """Each layer straight through its GPU kernel module (the layer modules' dispatch without
    their checks), for arguments that one `run` on the same arrays has validated."""

    def __init__(self, backend: str, precision: str, impl: str):
        if backend == "reference":
            raise ValueError("foxcute.step: the kernel path needs a GPU backend, got 'reference'")
        self.modules = {layer: module.kernel_modules()[backend] for layer, module in
                        (("mamba2", mamba2), ("curiosity", curiosity), ("risk_budget", risk_budget),
                         ("q_denoise", q_denoise), ("kan", kan), ("column_sum", reduction))}
        options = dict(precision=precision, impl=impl)
        self.options = {layer: module.CONTRACT.take(options) for layer, module in self.modules.items()}

    def _mamba2_args(self, m):
        return (m["h_hist"], m["h"], m["W_A"], m["W_B"], m["W_C"], m["w"], float(m["sigma"]))

    def mamba2_forward(self, m):
        return self.modules["mamba2"].forward(*self._mamba2_args(m), **self.options["mamba2"])

    def mamba2_backward(self, dout, m):
        return mamba2.Mamba2Grads(*self.modules["mamba2"].backward(dout, *self._mamba2_args(m),
                                                                   **self.options["mamba2"]))

    def curiosity(self, s, c):
        loss, r, *grads = self.modules["curiosity"].forward_backward(
            s, c["a"], c["s_next"], c["W1"], c["b1"], c["W2"], c["b2"], **self.options["curiosity"])
        return loss, r, curiosity.CuriosityGrads(*grads)

    def risk_budget(self, h, e, rb):
        return self.modules["risk_budget"].forward(h, rb["isv"], e, rb["W1"], rb["b1"], rb["w2"],
                                                   float(rb["b2"]), **self.options["risk_budget"])

    def q_denoise(self, qd):
        loss, *grads = self.modules["q_denoise"].loss_and_grads(
            qd["q"], qd["q_target"], qd["W1"], qd["b1"], qd["W2"], qd["b2"], **self.options["q_denoise"])
        return loss, q_denoise.QDenoiseGrads(*grads)

    def column_sum(self, G):
        return self.modules["column_sum"].column_sum(G, **self.options["column_sum"])

    def kan_backward(self, k):
        return kan.KanGrads(*self.modules["kan"].backward(k["dy"], k["x"], k["C"], k["Wb"],
                                                          **self.options["kan"]))


def _named(prefix: str, grads: Any) -> dict[str, Any]:
    return {f"{prefix}.{k}": v for k, v in grads._asdict().items()}


def _parts(layers: _PublicLayers | _KernelLayers, inputs: dict[str, dict[str, Any]],
           out: dict[str, Any], chained: dict[str, Any] | None = None) -> list[tuple[str, Callable[[], None]]]:
    """The step as (PARTS name, function) pairs; each function runs its part and stores its
    outputs in `out` by "layer.name". The later parts take what they chain on (CHAINED) from
    `out`, or from `chained` where given."""
    m = inputs["mamba2"]
    fed = out if chained is None else chained

    def mamba2_forward():
        out["mamba2.out"] = layers.mamba2_forward(m)

    def curiosity_fwd_bwd():
        loss, r, grads = layers.curiosity(fed["mamba2.out"], inputs["curiosity"])
        out.update({"curiosity.loss": loss, "curiosity.r": r, **_named("curiosity", grads)})

    def risk_budget_forward():
        out["risk_budget.risk"] = layers.risk_budget(fed["mamba2.out"], fed["curiosity.r"], inputs["risk_budget"])

    def q_denoise_backward():
        loss, grads = layers.q_denoise(inputs["q_denoise"])
        out.update({"q_denoise.loss": loss, **_named("q_denoise", grads)})

    def iqn_bias_grad_reduce():
        out["iqn.head_bias_grad"] = layers.column_sum(inputs["iqn"]["head_grad"])
        out["iqn.hidden_bias_grad"] = layers.column_sum(inputs["iqn"]["hidden_grad"])

    def kan_backward():
        out.update(_named("kan", layers.kan_backward(inputs["kan"])))

    def mamba2_backward():
        out.update(_named("mamba2", layers.mamba2_backward(inputs["mamba2_backward"]["dout"], m)))

    functions = (mamba2_forward, curiosity_fwd_bwd, risk_budget_forward, q_denoise_backward,
                 iqn_bias_grad_reduce, kan_backward, mamba2_backward)
    return [(f.__name__, f) for f in functions]


def run(inputs: dict[str, dict[str, Any]], *, backend: str = "reference", precision: str = "tf32",
        impl: str = "fused") -> dict[str, Any]:
    """Runs one step on `make_inputs`'s inputs; returns every output by "layer.name"."""
    check_backend("foxcute.step.run", backend, _layer.BACKENDS)
    return run_through(_PublicLayers(backend, precision, impl), inputs)


def run_through(layers: Any, inputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One step, every part in PARTS order on the current stream, through `layers`: an object
    with the layer-pass methods of _PublicLayers (mamba2_forward, curiosity, risk_budget,
    q_denoise, column_sum, kan_backward, mamba2_backward, returning what they return), such
    as foxcute.torch.step.OperatorLayers; every output by "layer.name"."""
    out: dict[str, Any] = {}
    for _, part in _parts(layers, inputs, out):
        part()
    return out


def _validate(inputs: dict[str, dict[str, Any]], backend: str, precision: str, impl: str) -> dict[str, Any]:
    """One `run` (every argument checked, every kernel compiled); the kernel path also needs
    Mamba2's w given (the layer module would fill in ones for w=None). Returns run's outputs,
    in its order."""
    if inputs["mamba2"].get("w") is None:
        raise ValueError("foxcute.step: the kernel path needs mamba2's w as an array (make_inputs gives one)")
    return run(inputs, backend=backend, precision=precision, impl=impl)


def kernel_parts(inputs: dict[str, dict[str, Any]], *, backend: str = "cute", precision: str = "tf32",
                 impl: str = "fused") -> tuple[list[tuple[str, Callable[[], None]]], dict[str, Any]]:
    """Validates `inputs` (device arrays) with one `run`, which also compiles every kernel,
    then returns the step's (PARTS name, function) pairs straight through the kernel modules
    and the dict they fill. Each function launches on the array library's current stream."""
    layers = _KernelLayers(backend, precision, impl)
    _validate(inputs, backend, precision, impl)
    out: dict[str, Any] = {}
    return _parts(layers, inputs, out), out


def kernel_step(inputs: dict[str, dict[str, Any]], *, backend: str = "cute", precision: str = "tf32",
                impl: str = "fused", lanes: bool = True, leave_out: Sequence[str] = ()) -> Callable[[], dict[str, Any]]:
    """Validates `inputs` with one `run`, then returns a function that launches one step
    straight through the kernel modules and returns its fresh outputs (as `run` names them,
    in its order). lanes=True: the parts of LANES[0] on the current stream, those of LANES[1]
    on a stream of their own, forked from it once FORK_AFTER is launched and joined back into
    it before the function returns; lanes=False: all on the current stream, in PARTS order.
    Either way the function can be captured in a CUDA graph (timing.bench), the side lane
    becoming a parallel branch of the graph.
    leave_out: PARTS not launched (what the step costs without them, breakdown.marginal_costs);
    then every part that chains on another (CHAINED) takes the validating run's output, and
    the left-out parts' outputs are missing from the result."""
    unknown = [name for name in leave_out if name not in PARTS]
    if unknown:
        raise ValueError(f"foxcute.step.kernel_step: leave_out names {unknown}, not parts of the step {PARTS}")
    layers = _KernelLayers(backend, precision, impl)
    validated = _validate(inputs, backend, precision, impl)
    names = list(validated)
    chained = {name: validated[name] for name in CHAINED} if leave_out else None

    def launch() -> dict[str, Any]:
        out: dict[str, Any] = {}
        parts = dict(_parts(layers, inputs, out, chained))

        def run_parts(lane):
            for name in lane:
                if name not in leave_out:
                    parts[name]()
        if lanes:
            main, side = LANES
            fork = main.index(FORK_AFTER) + 1
            run_parts(main[:fork])
            side_lane(inputs["mamba2"]["h"]).run(lambda: run_parts(side), lambda: run_parts(main[fork:]))
        else:
            run_parts(PARTS)
        return {name: out[name] for name in names if name in out}  # in run's order, not the lanes'
    return launch


def to_device(inputs: dict[str, dict[str, Any]], library: str = "torch") -> dict[str, dict[str, Any]]:
    """`make_inputs`'s NumPy inputs copied to the GPU: torch CUDA tensors ("torch") or cupy
    arrays ("cupy"), dtypes kept; the Python scalars (sigma, b2) stay as they are."""
    if library == "torch":
        import torch

        def copy(x):
            return torch.from_numpy(numpy.ascontiguousarray(x)).cuda()
    elif library == "cupy":
        import cupy

        copy = cupy.asarray
    else:
        raise ValueError(f"foxcute.step.to_device: library must be 'torch' or 'cupy', got {library!r}")
    return {layer: {k: copy(v) if isinstance(v, numpy.ndarray) else v for k, v in arrays.items()}
            for layer, arrays in inputs.items()}


def to_host(inputs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """NumPy copies of step inputs held on the GPU (for the reference backend)."""
    return {layer: {k: to_numpy(v) if array_kind(v) is not None else v for k, v in arrays.items()}
            for layer, arrays in inputs.items()}


def reference_given(reference: dict[str, Any], inputs: dict[str, dict[str, Any]],
                    outputs: dict[str, Any]) -> dict[str, Any]:
    """The reference to check a step's `outputs` against: `reference` (run's float64 outputs
    for the NumPy `inputs`) with the parts that chain on earlier outputs (curiosity on
    Mamba2's out, the risk head on out and r) recomputed from the values `outputs` gave them.

    So every layer is checked against float64 on the inputs it was given. Checked end to end
    instead, curiosity's gradients through its ReLU mask would not be: an upstream rounding
    error of 1e-4 in Mamba2's out moves z across 0 for some entries, and each flipped entry
    moves dz by its whole value (ds was off by 3.4e-3 and 4.0e-3 end to end in TF32 steps on
    the H200, over the 2e-3 of docs/layers.md section 8, while curiosity on its own passes)."""
    fed = {name: to_numpy(outputs[name]) for name in CHAINED}
    checked = dict(reference)
    for name, part in _parts(_PublicLayers("reference", "fp32", "fused"), inputs, checked, chained=fed):
        if name in _CHAINING_PARTS:
            part()
    return checked


def rel_errors(outputs: dict[str, Any], reference: dict[str, Any]) -> dict[str, float]:
    """||out - ref|| / ||ref|| for every output of the step (foxcute.checks.rel_err)."""
    _check_same_outputs("rel_errors", outputs, reference)
    return {name: rel_err(outputs[name], reference[name]) for name in reference}


def elem_errors(outputs: dict[str, Any], reference: dict[str, Any]) -> dict[str, float]:
    """max |out - ref| / max |ref| for every output of the step (foxcute.checks.elem_err)."""
    _check_same_outputs("elem_errors", outputs, reference)
    return {name: elem_err(outputs[name], reference[name]) for name in reference}


def _check_same_outputs(function: str, outputs: dict[str, Any], reference: dict[str, Any]) -> None:
    if set(outputs) != set(reference):
        raise ValueError(f"foxcute.step.{function}: outputs {sorted(set(outputs) ^ set(reference))} "
                         f"are not in both results")


ERROR_COLUMNS = ("rel_err per part", "rel_err end to end", "elem_err per part", "elem_err end to end")


def chain_errors(outputs: dict[str, Any], inputs: dict[str, dict[str, Any]],
                 reference: dict[str, Any] | None = None) -> dict[str, dict[str, float]]:
    """Every output's error measured two ways, by output name (run's order) and ERROR_COLUMNS:
    "per part", against the float64 reference given each layer's own inputs (reference_given:
    a chained layer is fed the values `outputs` gave it), which is how docs/layers.md section
    8 holds each layer to its tolerance; "end to end", against the whole chain in float64
    from the same `inputs` (`reference` itself), which is what a trainer's step gets: an
    upstream rounding error is carried down the chain, and where it moves one of curiosity's
    ReLU inputs across 0 the gradient changes by that entry's whole value. The two differ
    only for the outputs of the chained parts (curiosity and the risk head).
    `inputs`: make_inputs' NumPy inputs (step.to_host of device ones); `reference`:
    run(inputs, backend="reference") if already computed."""
    if reference is None:
        reference = run(inputs, backend="reference")
    given = reference_given(reference, inputs, outputs)
    measured = {"rel_err per part": rel_errors(outputs, given),
                "rel_err end to end": rel_errors(outputs, reference),
                "elem_err per part": elem_errors(outputs, given),
                "elem_err end to end": elem_errors(outputs, reference)}
    return {name: {column: measured[column][name] for column in ERROR_COLUMNS} for name in reference}


def check_same_layout(held: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> None:
    """Raise ValueError unless `new` has the arrays of `held` (same layers, names and shapes)
    and the same scalars: a captured graph reads its arrays in place but has its scalars
    (sigma, b2) baked into the launches."""
    if held.keys() != new.keys():
        raise ValueError(f"foxcute.step: new inputs have layers {sorted(new)}, the captured step {sorted(held)}")
    for layer, arrays in held.items():
        if arrays.keys() != new[layer].keys():
            raise ValueError(f"foxcute.step: new inputs of {layer} are {sorted(new[layer])}, "
                             f"the captured step's {sorted(arrays)}")
        for name, value in arrays.items():
            other = new[layer][name]
            if array_kind(value) is None:
                if float(other) != float(value):
                    raise ValueError(f"foxcute.step: {layer}.{name} is fixed at capture ({value}); got "
                                     f"{other}. Capture again to change it")
            elif tuple(other.shape) != tuple(value.shape) or str(other.dtype).replace("torch.", "") \
                    != str(value.dtype).replace("torch.", ""):
                raise ValueError(f"foxcute.step: {layer}.{name} must keep shape {tuple(value.shape)} and "
                                 f"dtype {value.dtype}, got {tuple(other.shape)} {other.dtype}")


class CapturedStep:
    """One cute step captured in a torch CUDA graph. `replay()` relaunches it on the current
    stream, reading `inputs` in place and writing `outputs` in place; `refresh(new)` copies
    new input values into `inputs` (arrays only: the scalars are part of the graph)."""

    def __init__(self, inputs: dict[str, dict[str, Any]], precision: str, impl: str):
        import torch

        first = inputs["mamba2"]["h"]
        if array_kind(first) != "torch":
            raise ValueError("foxcute.step.capture: the inputs must be torch CUDA tensors "
                             "(step.to_device(inputs, 'torch')); the graph is torch's")
        self.inputs = inputs
        launch = kernel_step(inputs, backend="cute", precision=precision, impl=impl)
        with torch.cuda.device(first.device):
            # torch wants work warmed up on a side stream before capture (allocator, lazy init)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                launch()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            # the kernels fetch the current stream when called: here the capturing one
            with torch.cuda.graph(self.graph):
                self.outputs = launch()

    def replay(self) -> dict[str, Any]:
        self.graph.replay()
        return self.outputs

    def refresh(self, new_inputs: dict[str, dict[str, Any]]) -> None:
        """Copy `new_inputs` (NumPy, cupy or torch arrays of the same shapes) into the
        captured inputs, on the current stream."""
        import torch

        check_same_layout(self.inputs, new_inputs)
        for layer, arrays in self.inputs.items():
            for name, held in arrays.items():
                if array_kind(held) is not None:
                    held.copy_(torch.as_tensor(new_inputs[layer][name], device=held.device))


def capture(inputs: dict[str, dict[str, Any]], *, precision: str = "tf32", impl: str = "fused") -> CapturedStep:
    """The cute step on `inputs` (torch CUDA tensors) captured once in a CUDA graph, after one
    validating `run` and one warm-up launch; see CapturedStep."""
    return CapturedStep(inputs, precision, impl)
