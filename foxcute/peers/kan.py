"""KAN layer with a Gaussian RBF basis (docs/layers.md section 4) in plain PyTorch: forward as
written, backward by autograd. `backward(..., forward_fn=torch.compile(forward))` times
torch.compile's version."""

from __future__ import annotations

from typing import Callable

import torch


def forward(x, C, Wb):
    """y [B, O] = phi(x) @ C^T + silu(x) @ Wb^T, phi[b, i*G+g] = exp(-((x[b,i]-mu_g)/delta)^2)."""
    batch, inputs = x.shape
    G = C.shape[1] // inputs
    mu = torch.linspace(-2.0, 2.0, G, device=x.device, dtype=x.dtype)
    delta = 4.0 / (G - 1)
    phi = torch.exp(-(((x[:, :, None] - mu) / delta) ** 2)).reshape(batch, inputs * G)
    return phi @ C.T + torch.nn.functional.silu(x) @ Wb.T


def backward(dy, x, C, Wb, *, forward_fn: Callable = forward):
    """(dC, dWb, dx): the gradients of sum(dy * y), as foxcute.kan.backward returns them."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (C, Wb, x)]
        C_, Wb_, x_ = leaves
        y = forward_fn(x_, C_, Wb_)
        dC, dWb, dx = torch.autograd.grad(y, leaves, grad_outputs=dy)
    return dC, dWb, dx
