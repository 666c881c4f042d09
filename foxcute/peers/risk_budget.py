"""Risk budget head (docs/layers.md section 6) in plain PyTorch, with the concatenation as written."""

from __future__ import annotations

import torch


def forward(h, isv, e, W1, b1, w2, b2: float):
    """risk [B] = sigmoid(relu([h, isv, e] @ W1^T + b1) @ w2 + b2)."""
    x = torch.cat([h, isv.expand(h.shape[0], -1), e[:, None]], dim=1)
    return torch.sigmoid(torch.relu(x @ W1.T + b1) @ w2 + b2)
