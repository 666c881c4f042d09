"""The error measures of docs/layers.md section 8 on the CPU: the element-wise view beside the
norm-wise one (checks, benchmarks), and the step's errors per part and end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foxcute import mamba2, step
from foxcute.checks import elem_err, rel_err, worst
from foxcute.lab import benchmarks


def test_elem_err_shows_one_bad_entry_that_rel_err_dilutes():
    ref = np.ones(10_000)
    out = ref.copy()
    out[17] += 0.5
    assert math.isclose(elem_err(out, ref), 0.5)
    assert math.isclose(rel_err(out, ref), 0.5 / 100)


def test_elem_err_divides_by_the_largest_reference_entry():
    ref = np.array([[-4.0, 1.0], [2.0, 0.0]])
    out = ref + np.array([[0.0, 0.0], [0.0, 0.2]])
    assert math.isclose(elem_err(out, ref), 0.2 / 4.0)


def test_elem_err_never_passes_nan_or_inf_and_takes_scalars_as_1_element_arrays():
    ref = np.ones(4)
    for bad in (np.nan, np.inf):
        out = ref.copy()
        out[2] = bad
        assert elem_err(out, ref) == math.inf
    assert math.isclose(elem_err(np.array([3.0]), 2.0), 0.5)
    assert elem_err(np.zeros(3), np.zeros(3)) == 0.0
    assert math.isclose(elem_err(np.full(3, 1e-3), np.zeros(3)), 1e-3)  # denominator 1 for a zero reference
    with pytest.raises(ValueError, match="elem_err: shape"):
        elem_err(np.ones(3), np.ones(4))


def test_worst_names_the_largest_error_and_never_hides_nan():
    assert worst({"a": 1e-4, "b": 3e-3, "c": 2e-3}) == ("b", 3e-3)
    name, value = worst({"a": 1e-4, "b": math.nan, "c": 2e-3})
    assert name == "b" and math.isnan(value)
    with pytest.raises(ValueError):
        worst({})


def _case(layer, pass_):
    return next(c for c in benchmarks.CASES if (c.layer, c.pass_) == (layer, pass_))


def test_output_elem_errors_name_every_output_and_the_record_its_worst(rng):
    case = _case("curiosity", "forward_backward")
    inputs = case.make(rng, case.odd_sizes)
    reference = benchmarks.reference(case, inputs)
    outputs = [np.array(r, dtype=np.float64, copy=True) for r in reference]
    i = case.outputs.index("dW2")
    flat = outputs[i].reshape(-1)
    flat[3] += 0.25 * np.abs(reference[i]).max()
    errors = benchmarks.output_elem_errors(case, inputs, outputs, reference)
    assert list(errors) == list(case.outputs)
    assert math.isclose(errors["dW2"], 0.25)
    assert all(v == 0.0 for k, v in errors.items() if k != "dW2")
    assert benchmarks.elem_err_fields(case, inputs, outputs, reference) == {"elem_err": errors["dW2"],
                                                                            "elem_err_output": "dW2"}
    # the norm-wise error of the same output is diluted by its other entries
    assert benchmarks.output_errors(case, inputs, outputs, reference)["dW2"] < errors["dW2"]


def test_output_elem_errors_measure_dsigma_as_output_errors_does(rng):
    case = _case("mamba2", "backward")
    inputs = case.make(rng, case.odd_sizes)
    reference = benchmarks.reference(case, inputs)
    i = case.outputs.index("dsigma")
    scale = max(abs(reference[i]), mamba2.dsigma_term_norm(**inputs))
    outputs = list(reference)
    outputs[i] = reference[i] + 1e-3 * scale
    errors = benchmarks.output_elem_errors(case, inputs, outputs, reference)
    assert math.isclose(errors["dsigma"], 1e-3, rel_tol=1e-6)
    assert errors["dsigma"] == benchmarks.output_errors(case, inputs, outputs, reference)["dsigma"]
    assert errors["dh"] == 0.0




def test_chain_errors_of_the_float64_chain_against_itself_are_zero(ran):
    inputs, reference = ran
    errors = step.chain_errors(reference, inputs)  # computes the reference itself
    assert list(errors) == list(reference)
    assert all(list(e) == list(step.ERROR_COLUMNS) and all(v == 0.0 for v in e.values()) for e in errors.values())


def test_chain_errors_carry_an_upstream_error_down_the_chain_end_to_end_only(ran):
    """A step whose Mamba2 output is off, but whose every later layer is exact given what it
    was fed (the float64 chain recomputed from the moved output): per part only the moved
    output has an error; end to end, so do the chained layers' outputs."""
    inputs, reference = ran
    moved = {**reference, "mamba2.out": reference["mamba2.out"] * (1 + 1e-3)}
    fed_r = step.reference_given(reference, inputs, moved)["curiosity.r"]  # curiosity fed by the moved out
    outputs = {**step.reference_given(reference, inputs, {**moved, "curiosity.r": fed_r}),
               "mamba2.out": moved["mamba2.out"]}  # and the risk head by the moved out and that r
    errors = step.chain_errors(outputs, inputs, reference)
    downstream = {k for k in reference if k.startswith(("curiosity.", "risk_budget."))}
    for name, e in errors.items():
        if name == "mamba2.out":
            assert math.isclose(e["rel_err per part"], 1e-3) and e["rel_err end to end"] == e["rel_err per part"]
            assert math.isclose(e["elem_err per part"], 1e-3) and e["elem_err end to end"] == e["elem_err per part"]
        elif name in downstream:
            assert e["rel_err per part"] == 0.0 and e["elem_err per part"] == 0.0
            assert e["rel_err end to end"] > 0.0 and e["elem_err end to end"] > 0.0
        else:
            assert all(v == 0.0 for v in e.values()), name
    assert errors["curiosity.r"]["rel_err end to end"] == rel_err(outputs["curiosity.r"], reference["curiosity.r"])


def test_elem_errors_demand_the_same_outputs(ran):
    _, reference = ran
    with pytest.raises(ValueError, match="elem_errors"):
        step.elem_errors({k: v for k, v in reference.items() if k != "kan.dx"}, reference)
