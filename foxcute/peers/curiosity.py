"""Curiosity forward model (docs/layers.md section 5) in plain PyTorch: the forward pass as a
function, the gradients by autograd. `forward_backward(..., forward_fn=torch.compile(forward))`
times torch.compile's version."""

from __future__ import annotations

from typing import Callable

import torch


def forward(s, a, s_next, W1, b1, W2, b2):
    """(loss 0-d, r [B]): the one-hot input concatenated as docs/layers.md writes it."""
    features = s.shape[1]
    onehot = torch.nn.functional.one_hot(a.long(), W1.shape[1] - features).to(s.dtype)
    z = torch.cat([s, onehot], dim=1) @ W1.T + b1
    pred = torch.relu(z) @ W2.T + b2
    r = ((pred - s_next) ** 2).sum(dim=1) / (2 * features)
    return r.mean(), r


def forward_backward(s, a, s_next, W1, b1, W2, b2, *, forward_fn: Callable = forward):
    """(loss [1], r, dW1, db1, dW2, db2, ds), as foxcute.kernels.curiosity returns them."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (W1, b1, W2, b2, s)]
        W1_, b1_, W2_, b2_, s_ = leaves
        loss, r = forward_fn(s_, a, s_next, W1_, b1_, W2_, b2_)
        dW1, db1, dW2, db2, ds = torch.autograd.grad(loss, leaves)
    return loss.detach().reshape(1), r.detach(), dW1, db1, dW2, db2, ds
