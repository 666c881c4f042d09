"""Mamba2 temporal layer, docs/layers.md section 1: forward and full backward.

    a = h_hist @ W_A, u = h_hist @ W_B, c = h @ W_C, g_t = sigma * sigmoid(a_t)
    x_0 = 0, x_{t+1} = g_t * x_t + u_t,  ctx = (1/D) sum_s c[:, s] x_K[:, s]
    out = h + ctx[:, None] * w[None, :]

`forward`/`backward` validate, then dispatch: "reference" to the float64 NumPy functions
below, "cute"/"naive" to foxcute.kernels.mamba2 / naive_mamba2 where those exist.
`reference_backward_seed_plan` is the seed design's backward, kept only to show (in the
derivation notebook and the tests) that it is not the gradient of the forward.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from . import _layer
from ._arrays import check_choice, empty, to_float64

IMPLS = ("fused", "seed")  # the kernel module's implementations; the reference ignores impl


class Mamba2Grads(NamedTuple):
    """Gradients of sum(dout * out) with respect to every input. From the reference
    backend dsigma is a Python float; from a GPU backend a 1-element device array."""

    dW_A: Any
    dW_B: Any
    dW_C: Any
    dw: Any
    dsigma: Any
    dh_hist: Any
    dh: Any


def kernel_modules() -> dict[str, ModuleType]:
    """The GPU backends' kernel modules: "cute" foxcute.kernels.mamba2, "naive"
    foxcute.kernels.naive_mamba2 (imported on first use: they load the CuTe DSL)."""
    from .kernels import mamba2 as cute_kernels, naive_mamba2 as naive_kernels

    return {"cute": cute_kernels, "naive": naive_kernels}


def forward(h_hist, h, W_A, W_B, W_C, w=None, sigma=1.0, *, backend="reference", impl="fused",
            precision="tf32"):
    """out [B, SH2] = h + ctx[:, None] * w[None, :]. w=None means ones of SH2."""
    where = "foxcute.mamba2.forward"
    chk, w, sigma = _check(where, backend, impl, precision, h_hist, h, W_A, W_B, W_C, w, sigma)
    if backend == "reference":
        return reference_forward(*to_float64(h_hist, h, W_A, W_B, W_C, w), sigma)
    kernel, options = _layer.kernel_module(kernel_modules, backend, chk, impl=impl, precision=precision)
    return kernel.forward(h_hist, h, W_A, W_B, W_C, w, sigma, **options)


def backward(dout, h_hist, h, W_A, W_B, W_C, w=None, sigma=1.0, *, backend="reference",
             impl="fused", precision="tf32") -> Mamba2Grads:
    """The exact gradient of `forward` given dout [B, SH2] (docs/layers.md section 1.3)."""
    where = "foxcute.mamba2.backward"
    chk, w, sigma = _check(where, backend, impl, precision, h_hist, h, W_A, W_B, W_C, w, sigma, dout=dout)
    if backend == "reference":
        return reference_backward(*to_float64(dout, h_hist, h, W_A, W_B, W_C, w), sigma)
    kernel, options = _layer.kernel_module(kernel_modules, backend, chk, impl=impl, precision=precision)
    return Mamba2Grads(*kernel.backward(dout, h_hist, h, W_A, W_B, W_C, w, sigma, **options))


def _check(where, backend, impl, precision, h_hist, h, W_A, W_B, W_C, w, sigma, dout=None):
    """Validates the inputs (dout too for the backward); only then returns the Checker,
    w (ones of SH2 of the inputs' kind when None) and sigma as a float."""
    chk = _layer.start(where, backend, precision)
    check_choice(where, "impl", impl, IMPLS)
    chk.array("h_hist", h_hist, ("B", "K", "SH2"))
    chk.array("h", h, ("B", "SH2"))
    for name, weight in (("W_A", W_A), ("W_B", W_B), ("W_C", W_C)):
        chk.array(name, weight, ("SH2", "D"))
    if w is not None:
        chk.array("w", w, ("SH2",))
    sigma = chk.scalar("sigma", sigma)
    if dout is not None:
        chk.array("dout", dout, ("B", "SH2"))
    if w is None:
        w = empty(h, (chk.dims["SH2"],), "float32")
        w[...] = 1
    return chk, w, sigma


# ---------------------------------------------------------------- float64 reference


class _Scan(NamedTuple):
    """The forward's intermediates, which both backwards recompute rather than store."""

    s: np.ndarray    # sigmoid(a)          [B, K, D]
    slope: np.ndarray  # sigmoid'(a) = sigmoid(a) sigmoid(-a), accurate where 1 - s rounds away
    g: np.ndarray    # sigma * sigmoid(a)  [B, K, D]
    c: np.ndarray    # h @ W_C             [B, D]
    x: np.ndarray    # x_0 .. x_K          [B, K+1, D]
    ctx: np.ndarray  # [B]


def _forward_scan(h_hist, h, W_A, W_B, W_C, sigma) -> _Scan:
    a = h_hist @ W_A
    u = h_hist @ W_B
    c = h @ W_C
    s = _layer.sigmoid(a)
    slope = s * _layer.sigmoid(-a)
    g = sigma * s
    batch, steps, dstate = a.shape
    x = np.zeros((batch, steps + 1, dstate))
    for t in range(steps):  # the recurrence is sequential in t; everything else is vectorised
        x[:, t + 1] = g[:, t] * x[:, t] + u[:, t]
    ctx = (c * x[:, steps]).sum(axis=1) / dstate
    return _Scan(s, slope, g, c, x, ctx)


def reference_forward(h_hist, h, W_A, W_B, W_C, w, sigma) -> np.ndarray:
    """Float64 arrays in (w required), out [B, SH2] float64."""
    ctx = _forward_scan(h_hist, h, W_A, W_B, W_C, sigma).ctx
    return h + ctx[:, None] * w[None, :]


def reference_backward(dout, h_hist, h, W_A, W_B, W_C, w, sigma) -> Mamba2Grads:
    """Float64 arrays in; all gradients float64 arrays, dsigma a Python float."""
    scan = _forward_scan(h_hist, h, W_A, W_B, W_C, sigma)
    dctx = dout @ w
    lam_K = dctx[:, None] * scan.c / W_C.shape[1]
    return _backward_from_seed(dout, h_hist, h, W_A, W_B, W_C, sigma, scan, dctx, lam_K)


def reference_backward_seed_plan(dout, h_hist, h, W_A, W_B, W_C, w, sigma) -> Mamba2Grads:
    """The seed design's backward: the reverse scan seeded with
    lam_K[b, s] = sum_j dout[b, j] * W_C[j, s], everything else as `reference_backward`.
    It is NOT the gradient of the forward (the finite-difference check fails); kept to show
    that."""
    scan = _forward_scan(h_hist, h, W_A, W_B, W_C, sigma)
    dctx = dout @ w
    lam_K = dout @ W_C
    return _backward_from_seed(dout, h_hist, h, W_A, W_B, W_C, sigma, scan, dctx, lam_K)


def _reverse_scan(scan: _Scan, lam_K) -> np.ndarray:
    """du_t = lam_{t+1} for t = K-1 .. 0, lam_t = lam_{t+1} * g_t from the seed lam_K."""
    du = np.empty_like(scan.s)
    lam = lam_K
    for t in range(scan.s.shape[1] - 1, -1, -1):
        du[:, t] = lam
        lam = lam * scan.g[:, t]
    return du


def dsigma_term_norm(dout, h_hist, h, W_A, W_B, W_C, w, sigma) -> float:
    """||(lam_{t+1} x_t sigmoid(a_t))_{b,t,s}||_2 in float64: the size of the B*K*D signed
    terms whose sum is dsigma. They cancel, so |dsigma| can be thousands of times smaller
    than this (0.31 from terms of norm 64 at B=1000, K=5), and a relative error e in each
    term (float32 or TF32 a, u, c, dctx) then moves the sum by about e times this norm: no
    float32 kernel can meet ||got - ref|| / |ref| there. foxcute's checks therefore measure
    dsigma against max(|dsigma|, this norm) and show the plain ratio beside it."""
    h_hist, h, W_A, W_B, W_C, w, dout = (np.asarray(v, np.float64) for v in (h_hist, h, W_A, W_B, W_C, w, dout))
    scan = _forward_scan(h_hist, h, W_A, W_B, W_C, float(sigma))
    du = _reverse_scan(scan, (dout @ w)[:, None] * scan.c / W_C.shape[1])
    return float(np.linalg.norm(du * scan.x[:, :-1] * scan.s))


def _backward_from_seed(dout, h_hist, h, W_A, W_B, W_C, sigma, scan: _Scan, dctx, lam_K) -> Mamba2Grads:
    """The backward given the reverse scan's seed lam_K (docs/layers.md section 1.3, from dctx on)."""
    dstate = W_C.shape[1]
    steps = h_hist.shape[1]
    dw = scan.ctx @ dout
    dc = dctx[:, None] * scan.x[:, steps] / dstate
    du = _reverse_scan(scan, lam_K)
    x_before = scan.x[:, :steps]  # x_t for t = 0..K-1, recomputed, never divided out
    da = du * x_before * sigma * scan.slope
    h_flat = h_hist.reshape(-1, h_hist.shape[2])
    return Mamba2Grads(
        dW_A=h_flat.T @ da.reshape(-1, dstate),
        dW_B=h_flat.T @ du.reshape(-1, dstate),
        dW_C=h.T @ dc,
        dw=dw,
        dsigma=float((du * x_before * scan.s).sum()),
        dh_hist=da @ W_A.T + du @ W_B.T,
        dh=dout + dc @ W_C.T,
    )
