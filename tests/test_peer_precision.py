"""foxcute.lab.peer_precision on the CPU: the TF32 operand emulation and the peers' math."""

from __future__ import annotations

import numpy as np
import pytest

from foxcute.lab import benchmarks, peer_precision


def test_tf32_rounds_to_nearest_ties_away_or_truncates_the_low_13_bits():
    ulp = 2.0**-10  # a TF32 ulp at 1.0
    x = np.array([1 + 0.49 * ulp, 1 + 0.5 * ulp, 1 + 0.99 * ulp, -(1 + 0.5 * ulp), 3.0], np.float32)
    np.testing.assert_array_equal(peer_precision.tf32(x, "nearest"), [1, 1 + ulp, 1 + ulp, -(1 + ulp), 3])
    np.testing.assert_array_equal(peer_precision.tf32(x, "truncate"), [1, 1, 1, -1, 3])
    np.testing.assert_array_equal(peer_precision.tf32(x, None), x.astype(np.float64))
    with pytest.raises(ValueError, match="rounding"):
        peer_precision.tf32(x, "up")


@pytest.mark.parametrize("layer", sorted(peer_precision.PEERS))
def test_without_rounding_the_peers_math_is_the_reference(layer, rng):
    case = next(c for c in benchmarks.CASES if c.layer == layer)
    inputs = case.make(rng, case.odd_sizes)
    outputs, flips = peer_precision.PEERS[layer](inputs, None)
    assert flips == 0.0
    errors = benchmarks.output_errors(case, inputs, outputs, benchmarks.reference(case, inputs))
    assert list(errors) == list(case.outputs) and max(errors.values()) < 1e-12


@pytest.mark.parametrize("layer, output", [("q_denoise", "dq"), ("curiosity", "ds")])
def test_at_the_trainers_sizes_mask_flips_not_rounding_put_the_tf32_peer_over_tolerance(layer, output):
    """The claim 02_correctness makes: rounding every operand to nearest TF32 flips a few
    ReLU masks, and those flips alone take the row-wise gradient past 2e-3."""
    case = next(c for c in benchmarks.CASES if c.layer == layer)
    inputs = case.make(np.random.default_rng(0), case.sizes)
    reference = benchmarks.reference(case, inputs)
    own, flips = peer_precision.PEERS[layer](inputs, "nearest")
    exact_mask, _ = peer_precision.PEERS[layer](inputs, "nearest", mask="float64")
    assert 0 < flips < 1e-3
    assert benchmarks.output_errors(case, inputs, own, reference)[output] > 2e-3
    assert benchmarks.output_errors(case, inputs, exact_mask, reference)[output] < 1e-3
    with pytest.raises(ValueError, match="mask"):
        peer_precision.PEERS[layer](inputs, "nearest", mask="exact")
