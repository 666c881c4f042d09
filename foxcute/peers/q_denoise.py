"""Q-denoise MLP (docs/layers.md section 2) in plain PyTorch: the loss as a function, its
gradients by autograd. `loss_and_grads(..., loss_fn=torch.compile(loss))` times torch.compile's
version."""

from __future__ import annotations

from typing import Callable

import torch


def loss(q, q_target, W1, b1, W2, b2):
    """mean((relu(q @ W1^T + b1) @ W2^T + b2 - q_target)^2), a 0-d tensor."""
    y = torch.relu(q @ W1.T + b1) @ W2.T + b2
    return torch.mean((y - q_target) ** 2)


def loss_and_grads(q, q_target, W1, b1, W2, b2, *, loss_fn: Callable = loss):
    """(loss [1], dW1, db1, dW2, db2, dq), as foxcute.q_denoise.loss_and_grads returns them."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (W1, b1, W2, b2, q)]
        W1_, b1_, W2_, b2_, q_ = leaves
        value = loss_fn(q_, q_target, W1_, b1_, W2_, b2_)
        dW1, db1, dW2, db2, dq = torch.autograd.grad(value, leaves)
    return value.detach().reshape(1), dW1, db1, dW2, db2, dq
