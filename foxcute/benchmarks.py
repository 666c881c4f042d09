"""The registry the correctness and profiling notebooks iterate over: every (layer, pass) as
a `Case` (inputs, reference, GPU call, bytes that must move), and every implementation that
can run it as an `Impl`. A new kernel slots in by existing (its backend is then offered) or
by one more entry in `impls()`; the notebooks need no change.

GPU implementations are timed through the kernel modules directly: the public layer
functions validate first, and one check (curiosity's action indices) reads the device,
which a CUDA graph capture does not allow. Correctness goes through the public functions.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import _layer, mamba2, q_denoise, kan, curiosity, risk_budget, reduction

F32 = 4  # bytes per float32 / int32

# Spec defaults (trainer sizes). B scales every case; column_sum's M is B * Q.
DEFAULTS = dict(B=8192, K=8, SH2=256, D=16, Q=64)


@dataclass(frozen=True)
class Case:
    """One layer pass. `make(rng, sizes)` returns float32/int32 NumPy inputs by name, in the
    order the layer function takes them; `outputs` names what the pass returns, flattened."""

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
    Case("mamba2", "forward", dict(B=8192, K=8, SH2=256, D=16), dict(B=37, K=5, SH2=100, D=12),
         lambda rng, z: _mamba2_inputs(rng, z, False), ("out",),
         lambda z: F32 * (z["B"] * z["K"] * z["SH2"] + 2 * z["B"] * z["SH2"] + _mamba2_weights(z)),
         lambda z: 2 * z["B"] * z["SH2"] * z["D"] * (2 * z["K"] + 1) + 2 * z["B"] * z["SH2"],
         "forward"),
    Case("mamba2", "backward", dict(B=8192, K=8, SH2=256, D=16), dict(B=37, K=5, SH2=100, D=12),
         lambda rng, z: _mamba2_inputs(rng, z, True),
         ("dW_A", "dW_B", "dW_C", "dw", "dsigma", "dh_hist", "dh"),
         lambda z: F32 * (2 * z["B"] * z["K"] * z["SH2"] + 4 * z["B"] * z["SH2"] + 2 * _mamba2_weights(z) + 1),
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
    Case("kan", "forward", dict(B=8192, I=32, O=32, G=8), dict(B=37, I=5, O=7, G=3),
         lambda rng, z: _kan_inputs(rng, z, False), ("y",),
         lambda z: F32 * (z["B"] * z["I"] + z["O"] * z["I"] * (z["G"] + 1) + z["B"] * z["O"]),
         lambda z: 2 * z["B"] * z["O"] * z["I"] * (z["G"] + 1), "forward"),
    Case("kan", "backward", dict(B=8192, I=32, O=32, G=8), dict(B=37, I=5, O=7, G=3),
         lambda rng, z: _kan_inputs(rng, z, True), ("dC", "dWb", "dx"),
         lambda z: F32 * (z["B"] * z["O"] + 2 * z["B"] * z["I"] + 2 * z["O"] * z["I"] * (z["G"] + 1)),
         lambda z: 4 * z["B"] * z["O"] * z["I"] * (z["G"] + 1), "backward"),
    Case("curiosity", "forward_backward", dict(B=8192, F=256, A=3, H=128), dict(B=37, F=20, A=2, H=9),
         _curiosity_inputs, ("loss", "r", "dW1", "db1", "dW2", "db2", "ds"),
         lambda z: F32 * (3 * z["B"] * z["F"] + 2 * z["B"]
                          + 2 * (z["H"] * (z["F"] + z["A"]) + z["H"] + z["F"] * z["H"] + z["F"]) + 1),
         lambda z: 2 * z["B"] * z["H"] * (z["F"] + z["A"]) * 3 + 2 * z["B"] * z["F"] * z["H"] * 3,
         "forward_backward"),
    Case("risk_budget", "forward", dict(B=8192, SH2=256, I=16, H=64), dict(B=37, SH2=30, I=3, H=5),
         _risk_inputs, ("risk",),
         lambda z: F32 * (z["B"] * (z["SH2"] + 2) + z["I"] + z["H"] * (z["SH2"] + z["I"] + 3) + 1),
         lambda z: 2 * z["B"] * z["H"] * (z["SH2"] + z["I"] + 2), "forward"),
)

_MODULES = {"mamba2": mamba2, "q_denoise": q_denoise, "kan": kan, "curiosity": curiosity,
            "risk_budget": risk_budget, "column_sum": reduction}


def offered_backends(layer: str) -> tuple[str, ...]:
    if layer == "column_sum":
        return tuple(b for b in reduction.BACKENDS
                     if b == "reference" or importlib.util.find_spec("foxcute.kernels.column_sum"))
    return _layer.offered_backends(layer)


def flatten(result: Any) -> list[Any]:
    """A layer's nested (loss, grads-tuple) result as a flat list, in `Case.outputs` order."""
    if isinstance(result, tuple):
        return [leaf for item in result for leaf in flatten(item)]
    return [result]


def call_layer(case: Case, inputs: dict[str, Any], *, backend: str, precision: str = "tf32",
               impl: str | None = None) -> list[Any]:
    """The public layer function on `inputs` (NumPy for "reference", device arrays else)."""
    fn = getattr(_MODULES[case.layer], case.kernel_function)
    kwargs: dict[str, Any] = {"backend": backend}
    if case.layer != "column_sum":
        kwargs["precision"] = precision
    if impl is not None:
        kwargs["impl"] = impl
    return flatten(fn(*inputs.values(), **kwargs))


def reference(case: Case, inputs: dict[str, Any]) -> list[Any]:
    return call_layer(case, inputs, backend="reference")


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


def _kernel_impl(module_name: str, **options: Any) -> Callable[[Case, dict[str, Any]], Callable[[], Any]]:
    def make(case: Case, x: dict[str, Any]) -> Callable[[], Any]:
        module = importlib.import_module(f"foxcute.kernels.{module_name.format(layer=case.layer)}")
        fn = getattr(module, case.kernel_function)
        args = list(x.values())
        return lambda: fn(*args, **options)
    return make


def _kernel_exists(module_name: str) -> Callable[[Case], bool]:
    return lambda case: importlib.util.find_spec(
        f"foxcute.kernels.{module_name.format(layer=case.layer)}") is not None


def impls() -> list[Impl]:
    """Every GPU implementation whose code is present here (kernel modules that exist; torch
    baselines when torch is importable)."""
    found: list[Impl] = []
    naive = "naive_{layer}"
    found.append(Impl("naive", "cupy", _kernel_impl(naive),
                      applies=lambda c: c.layer != "column_sum" and _kernel_exists(naive)(c)))
    for impl in mamba2.IMPLS:
        found.append(Impl(f"cute_{impl}", "cupy", _kernel_impl("{layer}", impl=impl, precision="tf32"),
                          applies=lambda c: c.layer == "mamba2" and _kernel_exists("{layer}")(c)))
    found.append(Impl("cute", "cupy", _kernel_impl("{layer}", precision="tf32"),
                      applies=lambda c: c.layer not in ("mamba2", "column_sum") and _kernel_exists("{layer}")(c)))
    found.append(Impl("cute", "cupy", _kernel_impl("column_sum"),
                      applies=lambda c: c.layer == "column_sum" and _kernel_exists("column_sum")(c)))
    if importlib.util.find_spec("torch") is not None:
        found.extend(_torch_impls())
    return found


# ---------------------------------------------------------------- torch baselines
# The same math written as plain torch (explicit backward formulas, as the spec states them),
# run eagerly, through torch.compile, and through torch.compile's CUDA graphs. TF32 matmuls.


def _torch_mamba2_scan(torch, h_hist, h, W_A, W_B, W_C, sigma):
    a, u, c = h_hist @ W_A, h_hist @ W_B, h @ W_C
    s = torch.sigmoid(a)
    g = sigma * s
    xs = [torch.zeros_like(c)]
    for t in range(a.shape[1]):
        xs.append(g[:, t] * xs[-1] + u[:, t])
    return s, g, c, xs


def _torch_mamba2_forward(h_hist, h, W_A, W_B, W_C, w, sigma):
    import torch

    _, _, c, xs = _torch_mamba2_scan(torch, h_hist, h, W_A, W_B, W_C, sigma)
    ctx = (c * xs[-1]).mean(dim=1)
    return (h + ctx[:, None] * w[None, :],)


def _torch_mamba2_backward(dout, h_hist, h, W_A, W_B, W_C, w, sigma):
    import torch

    s, g, c, xs = _torch_mamba2_scan(torch, h_hist, h, W_A, W_B, W_C, sigma)
    D, K = W_C.shape[1], h_hist.shape[1]
    ctx = (c * xs[-1]).mean(dim=1)
    dctx = dout @ w
    dc = dctx[:, None] * xs[-1] / D
    lam = dctx[:, None] * c / D
    du = [None] * K
    for t in range(K - 1, -1, -1):
        du[t] = lam
        lam = lam * g[:, t]
    du = torch.stack(du, dim=1)
    x_before = torch.stack(xs[:K], dim=1)
    da = du * x_before * sigma * s * (1 - s)
    h_flat = h_hist.reshape(-1, h_hist.shape[2])
    return (h_flat.T @ da.reshape(-1, D), h_flat.T @ du.reshape(-1, D), h.T @ dc, ctx @ dout,
            (du * x_before * s).sum(), da @ W_A.T + du @ W_B.T, dout + dc @ W_C.T)


def _torch_q_denoise(q, q_target, W1, b1, W2, b2):
    z1 = q @ W1.T + b1
    h1 = z1.clamp_min(0)
    diff = h1 @ W2.T + b2 - q_target
    dy = 2 * diff / diff.numel()
    dz1 = (dy @ W2) * (z1 > 0)
    return ((diff * diff).mean(), dz1.T @ q, dz1.sum(0), dy.T @ h1, dy.sum(0), dz1 @ W1)


def _torch_column_sum(G):
    return (G.sum(0),)


def _torch_kan_phi(torch, x, G):
    mu = torch.linspace(-2.0, 2.0, G, device=x.device)
    delta = 4.0 / (G - 1)
    offset = x[:, :, None] - mu
    return torch.exp(-(offset / delta) ** 2), offset, delta


def _torch_kan_forward(x, C, Wb):
    import torch

    phi, _, _ = _torch_kan_phi(torch, x, C.shape[1] // x.shape[1])
    return (phi.reshape(x.shape[0], -1) @ C.T + torch.nn.functional.silu(x) @ Wb.T,)


def _torch_kan_backward(dy, x, C, Wb):
    import torch

    phi, offset, delta = _torch_kan_phi(torch, x, C.shape[1] // x.shape[1])
    sig = torch.sigmoid(x)
    dphi = (dy @ C).reshape(phi.shape)
    dx = (dphi * phi * (-2 * offset / delta**2)).sum(2) + (dy @ Wb) * sig * (1 + x * (1 - sig))
    return (dy.T @ phi.reshape(x.shape[0], -1), dy.T @ (x * sig), dx)


def _torch_curiosity(s, a, s_next, W1, b1, W2, b2):
    import torch

    B, F = s.shape
    onehot = torch.nn.functional.one_hot(a.long(), W1.shape[1] - F).to(s.dtype)
    inputs = torch.cat([s, onehot], dim=1)
    z = inputs @ W1.T + b1
    hid = z.clamp_min(0)
    diff = hid @ W2.T + b2 - s_next
    r = (diff * diff).sum(1) / (2 * F)
    dpred = diff / (F * B)
    dz = (dpred @ W2) * (z > 0)
    return (r.mean(), r, dz.T @ inputs, dz.sum(0), dpred.T @ hid, dpred.sum(0), dz @ W1[:, :F])


def _torch_risk(h, isv, e, W1, b1, w2, b2):
    import torch

    SH2 = h.shape[1]
    z = h @ W1[:, :SH2].T + (W1[:, SH2:SH2 + isv.shape[0]] @ isv + b1) + e[:, None] * W1[:, -1]
    return (torch.sigmoid(z.clamp_min(0) @ w2 + b2),)


_TORCH_FUNCTIONS = {
    ("mamba2", "forward"): _torch_mamba2_forward, ("mamba2", "backward"): _torch_mamba2_backward,
    ("q_denoise", "loss_and_grads"): _torch_q_denoise, ("column_sum", "forward"): _torch_column_sum,
    ("kan", "forward"): _torch_kan_forward, ("kan", "backward"): _torch_kan_backward,
    ("curiosity", "forward_backward"): _torch_curiosity, ("risk_budget", "forward"): _torch_risk,
}


def _torch_impl(mode: str | None) -> Callable[[Case, dict[str, Any]], Callable[[], Any]]:
    def make(case: Case, x: dict[str, Any]) -> Callable[[], Any]:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = True
        fn = _TORCH_FUNCTIONS[(case.layer, case.pass_)]
        if mode is not None:
            fn = torch.compile(fn, mode=mode, dynamic=False)
        args = list(x.values())
        return lambda: fn(*args)
    return make


def _torch_impls() -> list[Impl]:
    return [Impl("torch_eager", "torch", _torch_impl(None)),
            Impl("torch_compile", "torch", _torch_impl("default")),
            # reduce-overhead replays torch's own CUDA graphs: timed as plain calls
            Impl("torch_compile_cudagraphs", "torch", _torch_impl("reduce-overhead"), graph=False)]
