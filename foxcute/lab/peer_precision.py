"""Why the torch peers of Q-denoise and curiosity miss the TF32 tolerance (docs/layers.md
section 8) where foxcute's kernels meet it: the peers' math (foxcute.peers.q_denoise,
foxcute.peers.curiosity) in NumPy, with the operands of every matrix product made TF32 the
way a tensor core reads them, so the error can be taken apart on a CPU.

Each product the peer sends to cuBLAS with TF32 allowed gets both operands made TF32: the
forward products (Q-denoise z1 = q W1^T, y = h1 W2^T; curiosity z = [s | onehot] W1^T,
pred = hid W2^T), the gradient read-backs (dh = dy W2 and dq = dz1 W1; curiosity's dh =
dpred W2 and ds = dz W1s) and the weight gradients over the batch (dz1^T q, dy^T h1; dz^T
[s | onehot], dpred^T hid). Products are then summed in float64: what is left is the
operands' rounding, the part TF32 adds (float32 accumulation adds ~1e-7).

`rounding`: "nearest" (cvt.rna: round to nearest, ties away from zero, half a TF32 ulp,
2^-11 relative at most), "truncate" (the low 13 bits dropped, what the tensor cores do to an
unrounded float32: up to 2^-10, biased toward zero), or None (float64 operands: the
reference). `mask`: "own" takes each ReLU's mask from the TF32 pre-activation as the peer
does; "float64" from the exact one, which takes the mask flips out and leaves the rounding.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

ROUNDINGS = ("nearest", "truncate")
MASKS = ("own", "float64")
_LOW_BITS = np.uint32(0xFFFFE000)  # a TF32 keeps sign, exponent and the top 10 mantissa bits


def tf32(x: Any, rounding: str | None) -> np.ndarray:
    """x as the float64 values of the TF32 operands a tensor core would read from float32 x
    ("nearest" or "truncate", see the module docstring); rounding None: x in float64 as it is."""
    if rounding is None:
        return np.asarray(x, np.float64)
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    if rounding == "nearest":  # half a TF32 ulp added to the magnitude bits, then cut: ties away from 0
        bits = bits + np.uint32(0x1000)
    elif rounding != "truncate":
        raise ValueError(f"peer_precision.tf32: rounding must be one of {ROUNDINGS} or None, got {rounding!r}")
    return (bits & _LOW_BITS).view(np.float32).astype(np.float64)


def _matmul(rounding: str | None) -> Callable[[Any, Any], np.ndarray]:
    return lambda a, b: tf32(a, rounding) @ tf32(b, rounding)


def _relu_mask(z: np.ndarray, z_exact: np.ndarray, mask: str) -> np.ndarray:
    if mask not in MASKS:
        raise ValueError(f"peer_precision: mask must be one of {MASKS}, got {mask!r}")
    return (z_exact if mask == "float64" else z) > 0


def q_denoise(inputs: dict[str, Any], rounding: str | None, mask: str = "own") -> tuple[list[np.ndarray], float]:
    """The Q-denoise peer's outputs (loss, dW1, db1, dW2, db2, dq: the case's order) with its
    products' operands made TF32, and the fraction of z1's entries whose ReLU mask differs from
    the float64 one."""
    mm = _matmul(rounding)
    q, q_target, W1, b1, W2, b2 = (np.asarray(inputs[k], np.float64)
                                   for k in ("q", "q_target", "W1", "b1", "W2", "b2"))
    z1 = mm(q, W1.T) + b1
    z1_exact = q @ W1.T + b1
    keep = _relu_mask(z1, z1_exact, mask)
    h1 = z1 * keep
    diff = mm(h1, W2.T) + b2 - q_target
    dy = 2.0 * diff / diff.size
    dz1 = mm(dy, W2) * keep
    outputs = [np.mean(diff**2), mm(dz1.T, q), dz1.sum(axis=0), mm(dy.T, h1), dy.sum(axis=0), mm(dz1, W1)]
    return outputs, float(np.mean((z1 > 0) != (z1_exact > 0)))


def curiosity(inputs: dict[str, Any], rounding: str | None, mask: str = "own") -> tuple[list[np.ndarray], float]:
    """The curiosity peer's outputs (loss, r, dW1, db1, dW2, db2, ds: the case's order) with its
    products' operands made TF32, and the fraction of z's entries whose ReLU mask differs from
    the float64 one."""
    mm = _matmul(rounding)
    s, s_next, W1, b1, W2, b2 = (np.asarray(inputs[k], np.float64) for k in ("s", "s_next", "W1", "b1", "W2", "b2"))
    batch, features = s.shape
    x = np.concatenate([s, np.eye(W1.shape[1] - features)[inputs["a"]]], axis=1)
    z = mm(x, W1.T) + b1
    z_exact = x @ W1.T + b1
    keep = _relu_mask(z, z_exact, mask)
    hid = z * keep
    diff = mm(hid, W2.T) + b2 - s_next
    r = (diff**2).sum(axis=1) / (2 * features)
    dpred = diff / (features * batch)
    dz = mm(dpred, W2) * keep
    outputs = [r.mean(), r, mm(dz.T, x), dz.sum(axis=0), mm(dpred.T, hid), dpred.sum(axis=0), mm(dz, W1[:, :features])]
    return outputs, float(np.mean((z > 0) != (z_exact > 0)))


PEERS = {"q_denoise": q_denoise, "curiosity": curiosity}  # by Case.layer


def torch_mask_flips(layer: str, inputs: dict[str, Any]) -> float:
    """On the GPU: the fraction of the ReLU pre-activation's entries (Q-denoise z1, curiosity z)
    whose sign, computed by torch as the peer computes it (TF32 allowed, the same product),
    differs from the float64 one. `inputs`: the case's NumPy inputs."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    cuda = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in inputs.items() if isinstance(v, np.ndarray)}
    if layer == "q_denoise":
        x, x64 = cuda["q"], np.asarray(inputs["q"], np.float64)
    elif layer == "curiosity":
        features = inputs["s"].shape[1]
        onehot = np.eye(inputs["W1"].shape[1] - features)[inputs["a"]]
        x = torch.cat([cuda["s"], torch.nn.functional.one_hot(cuda["a"].long(), onehot.shape[1]).to(cuda["s"].dtype)],
                      dim=1)
        x64 = np.concatenate([np.asarray(inputs["s"], np.float64), onehot], axis=1)
    else:
        raise ValueError(f"peer_precision.torch_mask_flips: no ReLU mask in {layer!r}; known: {sorted(PEERS)}")
    z = (x @ cuda["W1"].T + cuda["b1"]).cpu().numpy()
    z_exact = x64 @ np.asarray(inputs["W1"], np.float64).T + np.asarray(inputs["b1"], np.float64)
    return float(np.mean((z > 0) != (z_exact > 0)))
