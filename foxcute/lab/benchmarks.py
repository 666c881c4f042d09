"""The registry the correctness and profiling notebooks iterate over: every (layer, pass) as
a `Case` (inputs, reference, GPU call, bytes that must move), and every implementation that
can run it as an `Impl`. A new kernel slots in by existing (its backend is then offered) or
by one more entry in `impls()`; the notebooks need no change.

GPU implementations are timed through the kernel modules directly: the public layer
functions validate first, and one check (curiosity's action indices) reads the device,
which a CUDA graph capture does not allow. Correctness goes through the public functions.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import numpy as np

from .. import curiosity, kan, mamba2, q_denoise, reduction, risk_budget
from ..checks import elem_err, rel_err, to_numpy, worst

F32 = 4  # bytes per float32 / int32


@dataclass(frozen=True)
class Case:
    """One layer pass. `make(rng, sizes)` returns float32/int32 NumPy inputs by name, in the
    order the layer function takes them; `outputs` names what the pass returns, flattened.
    `sizes` are the trainer's (B scales every case; column_sum's M is B * Q), `odd_sizes`
    small awkward ones for the correctness checks."""

    layer: str
    pass_: str
    sizes: dict[str, int]
    odd_sizes: dict[str, int]
    make: Callable[[np.random.Generator, dict[str, int]], dict[str, Any]]
    outputs: tuple[str, ...]
    bytes_moved: Callable[[dict[str, int]], int]
    flops: Callable[[dict[str, int]], int]
    kernel_function: str  # name of the function in the kernel modules
    label: str = ""       # tells apart cases of one (layer, pass), e.g. "N=3"
    reference_fn: Callable[..., Any] | None = None  # float64 result where no layer module has one
    kernel_kwargs: tuple[tuple[str, Any], ...] = ()  # passed to the kernel function as keywords

    @property
    def name(self) -> str:
        return f"{self.layer}.{self.pass_}" + (f"[{self.label}]" if self.label else "")

    def scaled(self, batch: int) -> dict[str, int]:
        return {**self.sizes, "B": batch}


def _normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _weight(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    return _normal(rng, rows, cols, scale=cols**-0.5)


def _mamba2_inputs(rng, z, with_dout):
    B, K, SH2, D = z["B"], z["K"], z["SH2"], z["D"]
    x = {"h_hist": _normal(rng, B, K, SH2), "h": _normal(rng, B, SH2),
         "W_A": _normal(rng, SH2, D, scale=SH2**-0.5), "W_B": _normal(rng, SH2, D, scale=SH2**-0.5),
         "W_C": _normal(rng, SH2, D, scale=SH2**-0.5), "w": _normal(rng, SH2), "sigma": 0.9}
    return {"dout": _normal(rng, B, SH2), **x} if with_dout else x


def _mamba2_weights(z):
    return 3 * z["SH2"] * z["D"] + z["SH2"]


def _q_inputs(rng, z):
    B, A, H = z["B"], z["A"], z["H"]
    return {"q": _normal(rng, B, A), "q_target": _normal(rng, B, A), "W1": _weight(rng, H, A),
            "b1": _normal(rng, H, scale=0.1), "W2": _weight(rng, A, H), "b2": _normal(rng, A, scale=0.1)}


def _kan_inputs(rng, z, with_dy):
    B, I, O, G = z["B"], z["I"], z["O"], z["G"]
    x = {"x": _normal(rng, B, I), "C": _weight(rng, O, I * G), "Wb": _weight(rng, O, I)}
    return {"dy": _normal(rng, B, O), **x} if with_dy else x


def _curiosity_inputs(rng, z):
    B, F, A, H = z["B"], z["F"], z["A"], z["H"]
    return {"s": _normal(rng, B, F), "a": rng.integers(0, A, B).astype(np.int32),
            "s_next": _normal(rng, B, F), "W1": _weight(rng, H, F + A), "b1": _normal(rng, H, scale=0.1),
            "W2": _weight(rng, F, H), "b2": _normal(rng, F, scale=0.1)}


def _risk_inputs(rng, z):
    B, SH2, I, H = z["B"], z["SH2"], z["I"], z["H"]
    return {"h": _normal(rng, B, SH2), "isv": _normal(rng, I), "e": np.abs(_normal(rng, B)),
            "W1": _weight(rng, H, SH2 + I + 1), "b1": _normal(rng, H, scale=0.1),
            "w2": _weight(rng, 1, H)[0], "b2": 0.1}


CASES: tuple[Case, ...] = (
    Case("mamba2", "forward", dict(B=8192, K=8, SH2=256, D=16), dict(B=37, K=5, SH2=128, D=8),
         lambda rng, z: _mamba2_inputs(rng, z, False), ("out",),
         lambda z: F32 * (z["B"] * z["K"] * z["SH2"] + 2 * z["B"] * z["SH2"] + _mamba2_weights(z)),
         lambda z: 2 * z["B"] * z["SH2"] * z["D"] * (2 * z["K"] + 1) + 2 * z["B"] * z["SH2"],
         "forward"),
    Case("mamba2", "backward", dict(B=8192, K=8, SH2=256, D=16), dict(B=37, K=5, SH2=128, D=8),
         lambda rng, z: _mamba2_inputs(rng, z, True),
         ("dW_A", "dW_B", "dW_C", "dw", "dsigma", "dh_hist", "dh"),
         lambda z: F32 * (2 * z["B"] * z["K"] * z["SH2"] + 3 * z["B"] * z["SH2"] + 2 * _mamba2_weights(z) + 1),
         lambda z: 2 * z["B"] * z["SH2"] * z["D"] * (6 * z["K"] + 3) + 4 * z["B"] * z["SH2"],
         "backward"),
    Case("q_denoise", "loss_and_grads", dict(B=8192, A=12, H=24), dict(B=37, A=5, H=7),
         _q_inputs, ("loss", "dW1", "db1", "dW2", "db2", "dq"),
         lambda z: F32 * (3 * z["B"] * z["A"] + 2 * (2 * z["A"] * z["H"] + z["A"] + z["H"]) + 1),
         lambda z: 2 * z["B"] * z["A"] * z["H"] * 6, "loss_and_grads"),
    Case("column_sum", "forward", dict(B=8192, Q=64, N=3), dict(B=37, Q=3, N=5),
         lambda rng, z: {"G": _normal(rng, z["B"] * z["Q"], z["N"])}, ("out",),
         lambda z: F32 * (z["B"] * z["Q"] * z["N"] + z["N"]), lambda z: z["B"] * z["Q"] * z["N"],
         "column_sum", label="N=3"),
    Case("column_sum", "forward", dict(B=8192, Q=64, N=128), dict(B=37, Q=3, N=127),
         lambda rng, z: {"G": _normal(rng, z["B"] * z["Q"], z["N"])}, ("out",),
         lambda z: F32 * (z["B"] * z["Q"] * z["N"] + z["N"]), lambda z: z["B"] * z["Q"] * z["N"],
         "column_sum", label="N=128"),
    Case("kan", "forward", dict(B=8192, I=32, O=32, G=8), dict(B=37, I=5, O=6, G=3),
         lambda rng, z: _kan_inputs(rng, z, False), ("y",),
         lambda z: F32 * (z["B"] * z["I"] + z["O"] * z["I"] * (z["G"] + 1) + z["B"] * z["O"]),
         lambda z: 2 * z["B"] * z["O"] * z["I"] * (z["G"] + 1), "forward"),
    Case("kan", "backward", dict(B=8192, I=32, O=32, G=8), dict(B=37, I=5, O=6, G=3),
         lambda rng, z: _kan_inputs(rng, z, True), ("dC", "dWb", "dx"),
         lambda z: F32 * (z["B"] * z["O"] + 2 * z["B"] * z["I"] + 2 * z["O"] * z["I"] * (z["G"] + 1)),
         lambda z: 4 * z["B"] * z["O"] * z["I"] * (z["G"] + 1), "backward"),
    Case("curiosity", "forward_backward", dict(B=8192, F=256, A=3, H=128), dict(B=37, F=96, A=2, H=64),
         _curiosity_inputs, ("loss", "r", "dW1", "db1", "dW2", "db2", "ds"),
         lambda z: F32 * (3 * z["B"] * z["F"] + 2 * z["B"]
                          + 2 * (z["H"] * (z["F"] + z["A"]) + z["H"] + z["F"] * z["H"] + z["F"]) + 1),
         lambda z: 2 * z["B"] * z["H"] * (z["F"] + z["A"]) * 3 + 2 * z["B"] * z["F"] * z["H"] * 3,
         "forward_backward"),
    Case("risk_budget", "forward", dict(B=8192, SH2=256, I=16, H=64), dict(B=37, SH2=36, I=3, H=12),
         _risk_inputs, ("risk",),
         lambda z: F32 * (z["B"] * (z["SH2"] + 2) + z["I"] + z["H"] * (z["SH2"] + z["I"] + 3)),
         lambda z: 2 * z["B"] * z["H"] * (z["SH2"] + z["I"] + 2), "forward"),
)


def _matmul_inputs(rng, z):
    return {"A": _normal(rng, z["B"] * z["T"], z["K"]), "B_t": _weight(rng, z["N"], z["K"])}


def _matmul_reference(A, B_t):
    return A.astype(np.float64) @ B_t.astype(np.float64).T


def _weight_grad_inputs(rng, z):
    return {"dY": _normal(rng, z["B"] * z["T"], z["N"]), "X": _normal(rng, z["B"] * z["T"], z["K"])}


def _weight_grad_reference(dY, X):
    return dY.astype(np.float64).T @ X.astype(np.float64)


# function -> (inputs, float64 reference, output name, keywords of foxcute's kernel function)
_GEMM_FUNCTIONS = {"matmul": (_matmul_inputs, _matmul_reference, "D", ()),
                   "weight_grad": (_weight_grad_inputs, _weight_grad_reference, "dW", (("with_bias", False),))}


def _gemm_case(label: str, function: str, n: int, k: int) -> Case:
    """At M = B * T rows (T: Mamba2's steps of history), "matmul": D [M, N] = A [M, K] @
    B_t [N, K]^T; "weight_grad": dW [N, K] = dY [M, N]^T X [M, K] (no bias gradient)."""
    make, reference_fn, output, kwargs = _GEMM_FUNCTIONS[function]
    return Case("gemm", function, dict(B=8192, T=8, N=n, K=k), dict(B=37, T=5, N=36, K=40), make, (output,),
                lambda z: F32 * (z["B"] * z["T"] * (z["K"] + z["N"]) + z["N"] * z["K"]),
                lambda z: 2 * z["B"] * z["T"] * z["N"] * z["K"], function, label=label,
                reference_fn=reference_fn, kernel_kwargs=kwargs)


# The seed Mamba2 design's three big products, where foxcute's GEMM (foxcute.kernels.gemm)
# meets CUTLASS C++'s (foxcute.peers.cutlass_gemm) and cuBLAS (torch): the projection
# [a|u] = h_hist [W_A|W_B] (N = 2D, K = SH2), the read-back dh_hist = [da|du] [W_A|W_B]^T
# (N = SH2, K = 2D) and the weight gradient [dW_A|dW_B] = h_hist^T [da|du], a reduction over
# the B * K rows (N = SH2, K = 2D). Timed by the profiling notebook; not layer passes, so not
# in CASES.
GEMM_CASES: tuple[Case, ...] = (_gemm_case("seed projection", "matmul", 32, 256),
                                _gemm_case("seed read-back", "matmul", 256, 32),
                                _gemm_case("seed weight gradient", "weight_grad", 256, 32))

def step_bytes(batch: int) -> int:
    """The step's compulsory bytes at batch `batch`: the sum of its passes' (every case of
    CASES but KAN forward: the step runs KAN backward only)."""
    return sum(c.bytes_moved(c.scaled(batch)) for c in CASES if c.name != "kan.forward")


def record_bytes(layer: str, pass_: str, params: dict[str, Any]) -> int | None:
    """Today's count of the bytes a results record's pass must move at its params (the step:
    "B"; a layer pass: every size of its case; column_sum and gemm records name their case
    by "variant"); None where no case describes the record (a c_export or startup record)
    or a size is missing."""
    if layer == "step":
        return step_bytes(params["B"]) if "B" in params else None
    variant = params.get("variant", "")
    for case in CASES + GEMM_CASES:
        if (case.layer, case.pass_, case.label) == (layer, pass_, variant):
            return case.bytes_moved(params) if set(case.sizes) <= set(params) else None
    return None


_MODULES = {"mamba2": mamba2, "q_denoise": q_denoise, "kan": kan, "curiosity": curiosity,
            "risk_budget": risk_budget, "column_sum": reduction}


def layer_kernels(layer: str) -> dict[str, ModuleType]:
    """A case's kernel modules by GPU backend: the layer module's `kernel_modules()`; for the
    "gemm" cases, foxcute.kernels.gemm as "cute" (it is not a layer: no naive kernel)."""
    if layer == "gemm":
        from ..kernels import gemm

        return {"cute": gemm}
    return _MODULES[layer].kernel_modules()


def variants(case: Case, backend: str) -> list[dict[str, str]]:
    """Every combination of the options that `backend`'s kernel module of `case` takes
    (its CONTRACT), e.g. Mamba2's cute: impl x precision; one empty dict for none."""
    return layer_kernels(case.layer)[backend].CONTRACT.variants()


def flatten(result: Any) -> list[Any]:
    """A layer's nested (loss, grads-tuple) result as a flat list, in `Case.outputs` order."""
    if isinstance(result, tuple):
        return [leaf for item in result for leaf in flatten(item)]
    return [result]


def call_layer(case: Case, inputs: dict[str, Any], *, backend: str, precision: str = "tf32",
               impl: str | None = None) -> list[Any]:
    """The public layer function on `inputs` (NumPy for "reference", device arrays else)."""
    fn = getattr(_MODULES[case.layer], case.kernel_function)
    kwargs: dict[str, Any] = {"backend": backend, "precision": precision, "impl": impl}
    taken = inspect.signature(fn).parameters  # column_sum has no precision, only Mamba2 an impl
    return flatten(fn(*inputs.values(), **{k: v for k, v in kwargs.items() if k in taken and v is not None}))


def reference(case: Case, inputs: dict[str, Any]) -> list[Any]:
    if case.reference_fn is not None:
        return flatten(case.reference_fn(*inputs.values()))
    return call_layer(case, inputs, backend="reference")


def output_errors(case: Case, inputs: dict[str, Any], outputs: list[Any], reference: list[Any]) -> dict[str, float]:
    """Each output's error against the float64 reference: ||out - ref|| / ||ref||
    (foxcute.checks.rel_err), except Mamba2's dsigma, a sum of B*K*D signed terms that can
    cancel by orders of magnitude: |got - ref| / max(|ref|, the terms' 2-norm) (see
    foxcute.mamba2.dsigma_term_norm). Keys are the case's output names."""
    return _per_output(rel_err, case, inputs, outputs, reference)


def output_elem_errors(case: Case, inputs: dict[str, Any], outputs: list[Any],
                       reference: list[Any]) -> dict[str, float]:
    """Each output's element-wise error against the float64 reference, the view docs/layers.md
    section 8 asks for beside output_errors': max |out - ref| / max |ref|
    (foxcute.checks.elem_err). Mamba2's dsigma is one number, whose element-wise error is its
    norm-wise one: output_errors' measure. Keys are the case's output names; the record's
    "elem_err" and "elem_err_output" are foxcute.checks.worst of this dict."""
    return _per_output(elem_err, case, inputs, outputs, reference)


def _per_output(measure: Callable[[Any, Any], float], case: Case, inputs: dict[str, Any], outputs: list[Any],
                reference: list[Any]) -> dict[str, float]:
    """`measure(out, ref)` for each output by name; Mamba2's dsigma by _dsigma_error instead."""
    errors = {name: measure(o, r) for name, o, r in zip(case.outputs, outputs, reference)}
    if (case.layer, case.pass_) == ("mamba2", "backward"):
        errors["dsigma"] = _dsigma_error(case, inputs, outputs, reference)
    return errors


def elem_err_fields(case: Case, inputs: dict[str, Any], outputs: list[Any],
                    reference: list[Any]) -> dict[str, Any]:
    """A record's element-wise fields: "elem_err", the largest of output_elem_errors over the
    pass's outputs, and "elem_err_output", the output it belongs to."""
    name, value = worst(output_elem_errors(case, inputs, outputs, reference))
    return {"elem_err": value, "elem_err_output": name}


def _dsigma_error(case: Case, inputs: dict[str, Any], outputs: list[Any], reference: list[Any]) -> float:
    """Mamba2 backward's dsigma: |got - ref| / max(|ref|, the norm of its terms)."""
    i = case.outputs.index("dsigma")
    ref = float(np.asarray(reference[i], np.float64).reshape(()))
    got = float(np.asarray(to_numpy(outputs[i]), np.float64).reshape(()))
    args = {k: to_numpy(v) if not np.isscalar(v) else v for k, v in inputs.items()}
    scale = max(abs(ref), mamba2.dsigma_term_norm(**args)) or 1.0  # K = 1: all terms are 0
    return abs(got - ref) / scale if np.isfinite(got) else float("inf")


def to_device(inputs: dict[str, Any], library: str = "cupy") -> dict[str, Any]:
    """NumPy arrays to cupy arrays or torch CUDA tensors; Python scalars stay as they are."""
    if library == "cupy":
        import cupy

        return {k: cupy.asarray(v) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
    import torch

    return {k: torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v for k, v in inputs.items()}


@dataclass(frozen=True)
class Impl:
    """One way to run a case on the GPU. `make(case, device_inputs)` returns a zero-argument
    callable that launches the work and returns its outputs; `library` is the array library
    its arrays belong to, `graph` whether `timing.bench` may capture it in a CUDA graph."""

    name: str
    library: str
    make: Callable[[Case, dict[str, Any]], Callable[[], Any]]
    graph: bool = True
    applies: Callable[[Case], bool] = field(default=lambda case: True)


def _kernel_impl(backend: str, **options: Any) -> Callable[[Case, dict[str, Any]], Callable[[], Any]]:
    """The case's pass function of `backend`'s kernel module, with those of `options` that its
    CONTRACT takes."""
    def make(case: Case, x: dict[str, Any]) -> Callable[[], Any]:
        module = layer_kernels(case.layer)[backend]
        fn = getattr(module, case.kernel_function)
        args = list(x.values())
        kwargs = {**module.CONTRACT.take(options), **dict(case.kernel_kwargs)}
        return lambda: fn(*args, **kwargs)
    return make


def _has_backend(backend: str) -> Callable[[Case], bool]:
    return lambda case: backend in layer_kernels(case.layer)


def _takes_impl(case: Case) -> bool:
    return "impl" in layer_kernels(case.layer)["cute"].CONTRACT.options


def impls() -> list[Impl]:
    """Every GPU implementation whose code is present here: each kernel module (Mamba2's cute
    one once per impl, all at TF32), the CUTLASS C++ GEMM where it builds, torch baselines
    when torch is importable."""
    found: list[Impl] = [Impl("naive", "cupy", _kernel_impl("naive"), applies=_has_backend("naive"))]
    for impl in mamba2.IMPLS:
        found.append(Impl(f"cute_{impl}", "cupy", _kernel_impl("cute", impl=impl, precision="tf32"),
                          applies=lambda c: _takes_impl(c)))
    found.append(Impl("cute", "cupy", _kernel_impl("cute", precision="tf32"),
                      applies=lambda c: not _takes_impl(c)))
    found.append(Impl("cutlass_cpp", "cupy", _cutlass_gemm, applies=_cutlass_applies))
    if importlib.util.find_spec("torch") is not None:
        found.append(Impl("torch_ops", "torch", _operator_call, graph=False, applies=_has_operator))
        found.append(Impl("torch_ops_graph", "torch", _operator_call, applies=_has_operator))
        found.extend(_torch_impls())
    return found


# ---------------------------------------------------------------- foxcute's PyTorch operators
# Each layer pass through torch.ops.foxcute.* (foxcute.torch.ops) at TF32 (Mamba2: fused), the
# case's inputs in order: "torch_ops" as plain calls (a PyTorch user's eager call, host time
# included), "torch_ops_graph" captured in a CUDA graph like the cute kernels.

# the (layer, pass) of each pass function of foxcute's PyTorch operators (foxcute.torch.ops)
# and of its C library (foxcute.h's foxcute_<name>), which name them alike
PASS_OF_FUNCTION = {"mamba2_forward": ("mamba2", "forward"), "mamba2_backward": ("mamba2", "backward"),
                    "q_denoise_loss_and_grads": ("q_denoise", "loss_and_grads"),
                    "column_sum": ("column_sum", "forward"), "kan_forward": ("kan", "forward"),
                    "kan_backward": ("kan", "backward"),
                    "curiosity_forward_backward": ("curiosity", "forward_backward"),
                    "risk_budget_forward": ("risk_budget", "forward")}
_FUNCTION_OF_PASS = {layer_pass: name for name, layer_pass in PASS_OF_FUNCTION.items()}


def _has_operator(case: Case) -> bool:
    return (case.layer, case.pass_) in _FUNCTION_OF_PASS


def _operator_call(case: Case, x: dict[str, Any]) -> Callable[[], Any]:
    """The case's operator on the case's inputs (the risk head's b2, a Python float in the
    case, as the tensor the operator takes)."""
    from ..torch import ops

    args = list(x.values())
    if case.layer == "risk_budget":
        args[-1] = ops.risk_b2(args[-1], args[0])
    op = getattr(ops, _FUNCTION_OF_PASS[case.layer, case.pass_])
    options = {"mamba2": ("fused", "tf32"), "column_sum": ()}.get(case.layer, ("tf32",))
    return lambda: op(*args, *options)


def _cutlass_applies(case: Case) -> bool:
    from ..peers import cutlass_gemm

    return case.layer == "gemm" and cutlass_gemm.unavailable() is None


def _cutlass_gemm(case: Case, x: dict[str, Any]) -> Callable[[], Any]:
    from ..peers import cutlass_gemm

    plan = cutlass_gemm.Matmul if case.kernel_function == "matmul" else cutlass_gemm.WeightGrad
    return plan(*x.values())  # built (once per machine) and planned here


# ---------------------------------------------------------------- torch baselines
# foxcute.peers.<layer> holds the same math in plain torch (autograd for the backward), with
# the pass function named as in the layer module. Run eagerly, through torch.compile, and
# through torch.compile's CUDA graphs (mode "reduce-overhead"). Matmuls may use TF32.


def _peer_function(case: Case) -> Callable | None:
    if importlib.util.find_spec("foxcute.peers") is None or \
            importlib.util.find_spec(f"foxcute.peers.{case.layer}") is None:
        return None
    return getattr(importlib.import_module(f"foxcute.peers.{case.layer}"), case.kernel_function, None)


def _compiled_peer(case: Case, mode: str, dynamic: bool) -> Callable:
    """The case's peer function under torch.compile. A backward pass takes the forward (or
    loss) to differentiate as a keyword: that is compiled and AOTAutograd compiles its
    backward; a forward pass is compiled whole."""
    import torch

    fn = _peer_function(case)
    module = importlib.import_module(f"foxcute.peers.{case.layer}")
    hook = next((k for k in ("forward_fn", "loss_fn") if k in inspect.signature(fn).parameters), None)
    if hook is None:
        return torch.compile(fn, mode=mode, dynamic=dynamic)
    inner = getattr(module, hook.removesuffix("_fn"))
    return functools.partial(fn, **{hook: torch.compile(inner, mode=mode, dynamic=dynamic)})


@functools.lru_cache(maxsize=None)
def _dynamic_peer(layer: str, kernel_function: str) -> Callable:
    """One torch.compile(dynamic=True) per pass for the whole process, whatever the batch:
    the batch sweep's torch peer compiles once per pass (plus a recompile where torch
    specializes a size, as it does B = 1), not once per batch."""
    case = next(c for c in CASES + GEMM_CASES if (c.layer, c.kernel_function) == (layer, kernel_function))
    return _compiled_peer(case, "default", True)


def _torch_impl(mode: str | None, dynamic: bool = False) -> Callable[[Case, dict[str, Any]], Callable[[], Any]]:
    def make(case: Case, x: dict[str, Any]) -> Callable[[], Any]:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = True
        if mode is None:
            fn = _peer_function(case)
        elif dynamic:
            fn = _dynamic_peer(case.layer, case.kernel_function)
        else:
            fn = _compiled_peer(case, mode, False)
        args = list(x.values())
        return lambda: fn(*args)
    return make


def _torch_impls() -> list[Impl]:
    has_peer = lambda case: _peer_function(case) is not None  # noqa: E731
    return [Impl("torch_eager", "torch", _torch_impl(None), applies=has_peer),
            Impl("torch_compile", "torch", _torch_impl("default"), applies=has_peer),
            # reduce-overhead replays torch's own CUDA graphs: timed as plain calls
            Impl("torch_compile_cudagraphs", "torch", _torch_impl("reduce-overhead"), graph=False,
                 applies=has_peer)]


# ---------------------------------------------------------------- batch sweep

SWEEP_BATCHES = (1, 64, 512, 4096, 8192, 32768, 65536)
SWEEP_COLUMNS = ["case", "impl", "B", "time_us", "time_us_p10", "time_us_p90", "floor_us", "per_sample_us",
                 "skipped", "error"]


def sweep_impls() -> list[Impl]:
    """The batch sweep's implementations: the CuTe kernels (as impls() has them) and, where
    torch is importable, "torch_compile_dynamic": the peer under torch.compile(dynamic=True),
    compiled once per pass for every batch, graph-replayed like the rest."""
    found = [i for i in impls() if i.name.startswith("cute")]
    if importlib.util.find_spec("torch") is not None:
        found.append(Impl("torch_compile_dynamic", "torch", _torch_impl("default", dynamic=True),
                          applies=lambda case: _peer_function(case) is not None))
    return found


def batch_sweep(cases: list[Case], batches: tuple[int, ...], impls_: list[Impl], bandwidth_TBps: float, *,
                seed: int = 0, log: Callable[[str], None] = print, **bench_kwargs: Any) -> list[dict[str, Any]]:
    """Time per call and per sample of each implementation of each case at each batch B
    (column_sum: M = B * Q rows), graph-replayed (timing.bench with `bench_kwargs`, after
    timing.check_graph_replay), with the memory floor at that B: rows of SWEEP_COLUMNS.
    Inputs are made once per (case, B) and shared by the implementations. A size a kernel
    rejects (FoxcuteInputError) is a row with "skipped" its reason and no time; any other
    failure a row with "error" (type and message) and no time, so that one implementation
    failing hides none of the others. One `log` line per row."""
    from .._arrays import FoxcuteInputError
    from . import timing

    rows = []
    for case in cases:
        applicable = [i for i in impls_ if i.applies(case)]
        for batch in batches:
            sizes = case.scaled(batch)
            inputs = case.make(np.random.default_rng(seed), sizes)
            floor = timing.floor_us(case.bytes_moved(sizes), bandwidth_TBps)
            for impl in applicable:
                row = {"case": case.name, "impl": impl.name, "B": batch, "time_us": None, "time_us_p10": None,
                       "time_us_p90": None, "floor_us": floor, "per_sample_us": None, "skipped": "", "error": ""}
                try:
                    fn = impl.make(case, to_device(inputs, impl.library))
                    timing.check_graph_replay(fn, library=impl.library)
                    _, samples = timing.bench(fn, library=impl.library, **bench_kwargs)
                    row.update(timing.spread(samples))
                    row["per_sample_us"] = row["time_us"] / batch
                    log(f"{case.name} {impl.name} B={batch}: {row['time_us']:.3g} us")
                except FoxcuteInputError as exc:
                    row["skipped"] = str(exc)
                    log(f"{case.name} {impl.name} B={batch}: skipped ({exc})")
                except Exception as exc:  # reported in the row; the other implementations still run
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    log(f"{case.name} {impl.name} B={batch}: {row['error']}")
                rows.append(row)
    return rows


# ---------------------------------------------------------------- gradient checks (float64)


@dataclass(frozen=True)
class GradientCheck:
    """How a pass's gradient outputs relate to its inputs: `objective(x)` is the scalar whose
    gradient the pass returns (x: float64 inputs by name), `wrt` maps output -> input."""

    objective: Callable[[dict[str, Any]], float]
    wrt: dict[str, str]


GRADIENTS: dict[tuple[str, str], GradientCheck] = {
    ("mamba2", "backward"): GradientCheck(
        lambda x: float(np.sum(x["dout"] * mamba2.reference_forward(
            x["h_hist"], x["h"], x["W_A"], x["W_B"], x["W_C"], x["w"], x["sigma"]))),
        {"dW_A": "W_A", "dW_B": "W_B", "dW_C": "W_C", "dw": "w", "dsigma": "sigma",
         "dh_hist": "h_hist", "dh": "h"}),
    ("q_denoise", "loss_and_grads"): GradientCheck(
        lambda x: q_denoise.reference_loss_and_grads(
            x["q"], x["q_target"], x["W1"], x["b1"], x["W2"], x["b2"])[0],
        {"dW1": "W1", "db1": "b1", "dW2": "W2", "db2": "b2", "dq": "q"}),
    ("kan", "backward"): GradientCheck(
        lambda x: float(np.sum(x["dy"] * kan.reference_forward(x["x"], x["C"], x["Wb"]))),
        {"dC": "C", "dWb": "Wb", "dx": "x"}),
    ("curiosity", "forward_backward"): GradientCheck(
        lambda x: curiosity.reference_forward_backward(
            x["s"], x["a"], x["s_next"], x["W1"], x["b1"], x["W2"], x["b2"])[0],
        {"dW1": "W1", "db1": "b1", "dW2": "W2", "db2": "b2", "ds": "s"}),
}


def as_float64(inputs: dict[str, Any]) -> dict[str, Any]:
    """Float arrays and scalars to float64; integer arrays (action indices) unchanged."""
    return {k: (v.astype(np.float64) if v.dtype.kind == "f" else v) if isinstance(v, np.ndarray)
            else float(v) for k, v in inputs.items()}


def directional_fd(objective: Callable[[dict[str, Any]], float], x: dict[str, Any], name: str,
                   direction: Any, eps: float) -> float:
    """Central difference of `objective` at x along `direction` in input `name`."""
    def at(step: float) -> float:
        moved = dict(x)
        moved[name] = x[name] + step * direction
        return objective(moved)
    return (at(eps) - at(-eps)) / (2 * eps)


def fd_gradient(objective: Callable[[dict[str, Any]], float], x: dict[str, Any], name: str,
                eps: float) -> Any:
    """The full gradient of `objective` in input `name`, one central difference per entry."""
    value = x[name]
    if np.isscalar(value):
        return directional_fd(objective, x, name, 1.0, eps)
    grad = np.zeros(value.shape)
    for idx in np.ndindex(value.shape):
        unit = np.zeros(value.shape)
        unit[idx] = 1.0
        grad[idx] = directional_fd(objective, x, name, unit, eps)
    return grad


# ---------------------------------------------------------------- compiled-kernel facts


def kernel_modules() -> list[str]:
    """The public modules of foxcute.kernels (the optimized and the naive kernels), sorted."""
    import pkgutil

    import foxcute.kernels

    return sorted(m.name for m in pkgutil.iter_modules(foxcute.kernels.__path__) if not m.name.startswith("_"))


def ptx_digests(modules: list[str] | None = None) -> dict[str, str]:
    """SHA-256 of the PTX of every kernel that each kernel module's compiled_for_ci() compiles
    ("module.kernel" -> hex digest; all of kernel_modules(), or `modules`): two checkouts
    compare to show that a change left the generated code byte-identical, which a refactor
    can prove without a GPU (`foxcute ptx`)."""
    import hashlib

    digests = {}
    for name in modules or kernel_modules():
        module = importlib.import_module(f"foxcute.kernels.{name}")
        for kernel, compiled in getattr(module, "compiled_for_ci", dict)().items():
            digests[f"{name}.{kernel}"] = hashlib.sha256(compiled.__ptx__.encode()).hexdigest()
    return digests


_VEC128_LOAD = r"ld\.global(?:\.[a-z]+)*\.(?:v4\.[bfsu]32|v2\.[bfsu]64)"


def ptx_facts(compiled: Any) -> dict[str, Any]:
    """What a kernel compiled with `keep` (kernels._cute.compile_kernel) says: from its PTX,
    128-bit global loads, TF32 tensor-core instructions (warp-level mma.sync, warpgroup
    wgmma) and local-memory instructions (spills or stack arrays); from ptxas' report of the
    same compile, registers, stack frame and spill bytes; registers from the cubin too."""
    import re

    ptx = compiled.__ptx__ or ""
    ptxas = getattr(compiled, "ptxas_resources", {})
    return {
        "ptxas_registers": ptxas.get("registers"),
        "spill_stores": ptxas.get("spill_stores"),
        "spill_loads": ptxas.get("spill_loads"),
        "stack_frame": ptxas.get("stack_frame"),
        "ld_global_128bit": len(re.findall(_VEC128_LOAD, ptx)),
        "mma_sync_tf32": len(re.findall(r"mma\.sync\.aligned\.[^\s;]*tf32", ptx)),
        "wgmma_tf32": len(re.findall(r"wgmma\.mma_async\.[^\s;]*tf32", ptx)),
        "ld_st_local": len(re.findall(r"\b(?:ld|st)\.local", ptx)),
        "registers": cubin_registers(compiled.__cubin__) if compiled.__cubin__ else None,
    }


def cubin_registers(cubin: bytes) -> list[int]:
    """Registers per thread of each kernel in an ELF cubin (EIATTR_REGCOUNT in .nv.info)."""
    import struct

    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = sections[shstrndx][4]

    def name(offset: int) -> str:
        return cubin[names_at + offset:cubin.index(b"\0", names_at + offset)].decode()

    counts = []
    for name_offset, _, _, _, offset, size in sections:
        if name(name_offset) != ".nv.info":
            continue
        p = offset
        while p < offset + size:  # entries: format byte, attribute byte, then by format
            fmt, attr = cubin[p], cubin[p + 1]
            if fmt == 0x04:  # EIFMT_SVAL: 16-bit length, then payload
                length = struct.unpack_from("<H", cubin, p + 2)[0]
                if attr == 0x2F:  # EIATTR_REGCOUNT: (function symbol, registers)
                    counts.append(struct.unpack_from("<II", cubin, p + 4)[1])
                p += 4 + length
            else:  # EIFMT_NVAL (no value) takes 2 bytes, EIFMT_HVAL/BVAL 4
                p += 2 if fmt == 0x01 else 4
    return counts


def module_report(name: str) -> tuple[str, float, list[dict[str, Any]]]:
    """(name, seconds, rows): kernel module `name`'s compiled_for_ci() compiled (PTX, cubin
    and ptxas' report kept) and each kernel's `ptx_facts`, its kernel classes and the
    module's compile time as one row; a module that fails to compile gives one row whose
    "note" says why. A top-level function, so a spawned worker process can run it."""
    import time

    from .breakdown import short_kernel_name

    start = time.perf_counter()
    try:
        compiled = importlib.import_module(f"foxcute.kernels.{name}").compiled_for_ci()
    except Exception as exc:  # the report names it; the other modules still compile
        return name, time.perf_counter() - start, [
            {"module": name, "kernel": "-", "note": f"compile failed: {type(exc).__name__}: {exc}"}]
    seconds = time.perf_counter() - start
    rows = []
    for kernel_name, fn in compiled.items():
        classes = sorted({short_kernel_name(k) for k in (getattr(fn, "kernel_info", None) or {})})
        rows.append({"module": name, "kernel": kernel_name, "kernel class": ", ".join(classes),
                     **ptx_facts(fn), "module compile s": round(seconds, 2), "note": ""})
    return name, seconds, rows


def compile_report(modules: list[str] | None = None, workers: int | None = None,
                   progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """`module_report` of every kernel module (all of kernel_modules(), or `modules`), each in
    a worker process of its own (spawned: cute.compile is neither thread-safe nor quick, and
    the modules are independent), at most `workers` at once (default: one per CPU core).
    `progress` gets one line per module as it finishes; the rows come back in module order.
    The wall time is about that of the slowest module (gemm's 25 kernels) instead of the sum."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed

    names = list(modules or kernel_modules())
    workers = max(1, min(len(names), workers or os.cpu_count() or 1))
    by_name: dict[str, list[dict[str, Any]]] = {}
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(module_report, name): name for name in names}
        for future in as_completed(futures):
            name = futures[future]
            try:
                _, seconds, rows = future.result()
            except Exception as exc:  # the worker died (e.g. out of memory): reported like a failed compile
                seconds, rows = float("nan"), [{"module": name, "kernel": "-",
                                                "note": f"worker failed: {type(exc).__name__}: {exc}"}]
            by_name[name] = rows
            done = f"({len(by_name)} of {len(names)} modules)"
            progress(f"{name}: {rows[0]['note']} {done}" if rows[0]["note"] else
                     f"compiled {name}: {len(rows)} kernel(s) in {seconds:.1f} s {done}")
    return [row for name in names for row in by_name[name]]
