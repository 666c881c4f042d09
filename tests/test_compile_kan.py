"""KAN kernels compiled for sm_90a on the CPU (CI): the PTX and ptxas' report say what we meant."""

import re

import pytest

pytest.importorskip("cutlass")

from foxcute.kernels import _cute, kan  # noqa: E402

LOAD_128 = r"ld\.global\.(v2\.b64|v4\.(b32|f32))"


@pytest.fixture(scope="module")
def ptx():
    return {name: fn.__ptx__ for name, fn in kan.compiled_for_ci().items()}


@pytest.mark.parametrize("name", ["kan_forward_tf32", "kan_backward_tf32"])
def test_tf32_kernels_use_tensor_cores(ptx, name):
    assert re.search(r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32", ptx[name])


@pytest.mark.parametrize("name", ["kan_forward_fp32", "kan_backward_fp32"])
def test_fp32_kernels_stay_off_tensor_cores(ptx, name):
    assert "mma.sync" not in ptx[name]


def test_tf32_backward_gathers_weights_with_16_byte_loads(ptx):
    # Defaults: C is 32 x 256 floats = 2048 float4 (16 a thread), Wb 32 x 32 = 256 (2 a thread);
    # no 4-byte cp.async gather of single floats is left.
    ptx_bwd = ptx["kan_backward_tf32"]
    assert len(re.findall(LOAD_128, ptx_bwd)) == 16 + 2
    assert "cp.async" not in ptx_bwd


def test_grad_reduce_streams_partials_with_128_bit_loads(ptx):
    assert re.search(LOAD_128, ptx["kan_grad_reduce"])


@pytest.mark.parametrize("name", sorted(kan.kernels_for_ci()))
def test_no_register_spills(name):
    kernel, args = kan.kernels_for_ci()[name]
    report = _cute.ptxas_report(kernel, *args)
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report


@pytest.mark.parametrize("name", ["kan_backward_tf32", "kan_backward_fp32"])
def test_backward_lets_the_grad_reduce_launch_early(ptx, name):
    assert "griddepcontrol.launch_dependents;" in ptx[name]


def test_grad_reduce_waits_for_the_backward_before_reading_partials(ptx):
    # Launched with programmatic dependent launch: a load before the wait could read partials
    # the backward kernel has not written yet.
    reduce_ptx = ptx["kan_grad_reduce"]
    assert "griddepcontrol.wait;" in reduce_ptx
    assert reduce_ptx.index("griddepcontrol.wait;") < reduce_ptx.index("ld.global")
