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


def test_only_the_dependent_variant_waits_for_the_grid_before_it():
    kernels = {name: f.__ptx__ for name, f in column_sum.compiled_for_ci().items()}
    for name, text in kernels.items():
        waits = text.count("griddepcontrol.wait;")
        assert waits == (1 if name.endswith("_dependent") else 0), name
        assert "griddepcontrol.launch_dependents" not in text, name
    # the wait comes before the first global load of G
    text = kernels["column_sum_N4096_dependent"]
    assert text.index("griddepcontrol.wait;") < text.index("ld.global")


def test_kahan_compensation_survives_compilation(ptx):
    # (t - a) - y must reach the PTX as subtractions, not be folded away to zero.
    assert ptx[128].count("sub.f32") >= 2 * 4


@pytest.mark.slow
def test_kept_compiles_carry_ptxas_resources():
    """A kept compile (what `foxcute ptx` and the kernel report use) carries ptxas' own resource
    report, the same one `_cute.ptxas_report` gets by compiling again."""
    from foxcute.lab import benchmarks

    compiled = column_sum.compiled_for_ci()["column_sum_N3"]
    facts = benchmarks.ptx_facts(compiled)
    assert compiled.ptxas_resources == _cute.ptxas_report(column_sum.ColumnSum(3), *column_sum.compile_args())
    assert facts["spill_stores"] == facts["spill_loads"] == 0 and facts["ptxas_registers"] > 0
