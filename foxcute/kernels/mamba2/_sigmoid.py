"""The scans' gate sigmoid(a) and its slope, accurate at both flat ends, traced into every
Mamba2 scan (fused and seed)."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32


@cute.jit
def _sigmoid(a: Float32) -> Float32:
    """sigmoid(a) from e = exp(-|a|) in (0, 1], which never overflows: 1/(1+e) for a >= 0,
    e/(1+e) below (full relative accuracy on both flat ends)."""
    e = cute.math.exp(-cute.math.abs(a))
    r = _reciprocal_1_to_2(Float32(1.0) + e)
    sig = r
    if a < Float32(0.0):
        sig = e * r
    return sig


@cute.jit
def _sigmoid_slope(a: Float32) -> Float32:
    """sigmoid'(a) = sigmoid(a) * sigmoid(-a) = e/(1+e)^2 with e = exp(-|a|). The textbook
    s * (1 - s) rounds 1 - s to 0 in float32 once a > ~17, while the true slope is ~exp(-a)
    (1e-13 at a = 30); this form keeps full relative accuracy for every a."""
    e = cute.math.exp(-cute.math.abs(a))
    r = _reciprocal_1_to_2(Float32(1.0) + e)
    return e * r * r


@cute.jit
def _reciprocal_1_to_2(v: Float32) -> Float32:
    """1/v for v in [1, 2]: rcp.approx (one MUFU.RCP, within 1 ulp here: v and 1/v are normal
    numbers). IEEE division is MUFU.RCP, two Newton FFMAs and a branch to a slow path for
    operands that v never is; the branch fences every sigmoid of a scan into its own region,
    so the K independent sigmoids of a (sample, state) pair did not overlap."""
    return cute.arch.rcp_approx(v)
