"""column_sum compiled for sm_90a on the CPU (CI): the PTX and ptxas' report say what we meant."""

import re

import pytest

pytest.importorskip("cutlass")

from foxcute.kernels import _cute, column_sum  # noqa: E402

WIDTHS = (1, 3, 7, 128, 2052, 4096)


@pytest.fixture(scope="module")
def ptx():
    return {n: column_sum._compile(n, keep=True).__ptx__ for n in WIDTHS}


@pytest.mark.parametrize("n", WIDTHS)
def test_streams_g_with_128_bit_loads(ptx, n):
    assert re.search(r"ld\.global\.(v2\.b64|v4\.(b32|f32))", ptx[n])


@pytest.mark.parametrize("n", WIDTHS)
def test_only_atomic_is_the_integer_ticket(ptx, n):
    atomics = re.findall(r"\b(atom|red)\.[\w.]+", ptx[n])
    assert atomics == ["atom"], atomics
    assert re.search(r"atom\.global\.acq_rel\.add\.u32", ptx[n])


@pytest.mark.parametrize("n", (3, 128, 2052, 4095, 4096))
def test_no_register_spills(n):
    report = _cute.ptxas_report(column_sum.ColumnSum(n), *column_sum.compile_args())
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report


def test_kahan_compensation_survives_compilation(ptx):
    # (t - a) - y must reach the PTX as subtractions, not be folded away to zero.
    assert ptx[128].count("sub.f32") >= 2 * 4
