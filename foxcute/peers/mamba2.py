"""Mamba2 temporal layer (docs/layers.md section 1) in plain PyTorch: the forward as written, the
backward by autograd. `backward(..., forward_fn=torch.compile(forward))` times torch.compile's
version."""

from __future__ import annotations

from typing import Callable

import torch


def forward(h_hist, h, W_A, W_B, W_C, w, sigma):
    """out [B, SH2] = h + ctx[:, None] * w[None, :]; sigma a float or a 0-d/1-element tensor."""
    a = h_hist @ W_A  # [B, K, D]
    u = h_hist @ W_B
    c = h @ W_C  # [B, D]
    g = sigma * torch.sigmoid(a)
    x = torch.zeros_like(c)
    for t in range(h_hist.shape[1]):
        x = g[:, t] * x + u[:, t]
    ctx = (c * x).sum(dim=1) / W_C.shape[1]
    return h + ctx[:, None] * w[None, :]


def backward(dout, h_hist, h, W_A, W_B, W_C, w, sigma, *, forward_fn: Callable = forward):
    """(dW_A, dW_B, dW_C, dw, dsigma [1], dh_hist, dh): the gradients of sum(dout * out), in
    the order foxcute.mamba2.backward returns them."""
    with torch.enable_grad():
        # torch.full, not as_tensor: a host-to-device copy may not be captured in a CUDA graph
        sigma_t = (sigma.reshape(()) if torch.is_tensor(sigma)
                   else torch.full((), float(sigma), dtype=h.dtype, device=h.device))
        leaves = [t.detach().requires_grad_() for t in (W_A, W_B, W_C, w, sigma_t, h_hist, h)]
        W_A_, W_B_, W_C_, w_, sigma_, h_hist_, h_ = leaves
        out = forward_fn(h_hist_, h_, W_A_, W_B_, W_C_, w_, sigma_)
        dW_A, dW_B, dW_C, dw, dsigma, dh_hist, dh = torch.autograd.grad(out, leaves, grad_outputs=dout)
    return dW_A, dW_B, dW_C, dw, dsigma.reshape(1), dh_hist, dh
