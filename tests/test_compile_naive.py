"""The naive ("before") kernels compiled for sm_90a on the CPU (CI): every kernel compiles,
and its PTX is the plain thing it claims to be: scalar float32 loads, FFMA, no tensor cores,
no atomics (so results are run-to-run identical), no local-memory traffic."""

import importlib
import inspect
import re

import pytest

pytest.importorskip("cutlass")

from foxcute._arrays import Checker, FoxcuteInputError  # noqa: E402
from foxcute.kernels import _cute, _naive  # noqa: E402

MODULES = ("naive_column_sum", "naive_mamba2", "naive_q_denoise", "naive_kan",
           "naive_curiosity", "naive_risk_budget")


def kernel_module(name):
    return importlib.import_module(f"foxcute.kernels.{name}")


@pytest.fixture(scope="module")
def ptx():
    """"module.kernel" -> PTX text, every naive kernel compiled once with its PTX kept."""
    compiled = {f"_naive.{k}": f for k, f in _naive.KERNELS.compiled_for_ci().items()}
    for name in MODULES:
        compiled.update({f"{name}.{k}": f for k, f in kernel_module(name).compiled_for_ci().items()})
    return {key: f.__ptx__ for key, f in compiled.items()}


def test_every_kernel_class_is_compiled_for_ci(ptx):
    # The DSL names a kernel's PTX entry after its module and class.
    for name in ("_naive", *MODULES):
        module = kernel_module(name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and hasattr(cls, "kernel"):
                token = module.__name__.replace(".", "") + cls_name + "_object"
                assert any(token in text for key, text in ptx.items() if key.startswith(name + ".")), \
                    f"{name}.{cls_name} is not in {name}'s compiled_for_ci()"


def test_plain_float32_without_tensor_cores_or_atomics(ptx):
    for key, text in ptx.items():
        assert not re.search(r"\b(w?mma|cvt\.rna\.tf32|atom|red)\.", text), key


def test_loads_are_scalar(ptx):
    # The "before" kernels read one float per thread per load (no 128-bit vector loads).
    for key, text in ptx.items():
        assert re.search(r"ld\.global\.(b32|f32)", text), key
        assert not re.search(r"ld\.global(\.\w+)*\.v[248]", text), key


# naive_column_sum launches _naive's BatchSum and has no kernel of its own.
@pytest.mark.parametrize("name", ("_naive", *(m for m in MODULES if m != "naive_column_sum")))
def test_no_register_spills(name):
    for kernel, (jit_obj, args) in kernel_module(name).KERNELS.specs.items():
        report = _cute.ptxas_report(jit_obj, *args)
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (kernel, report)


def test_products_are_ffma(ptx):
    plain_sums = {"_naive.batch_sum_x", "naive_column_sum.column_sum"}
    for key, text in ptx.items():
        if key not in plain_sums:
            assert "fma.rn.f32" in text, key


def test_weight_gradient_walks_the_batch_in_chunks(ptx):
    # Two nested runtime loops, neither unrolled: the outer one steps CHUNK_ROWS rows, the
    # inner one sums a chunk into its own partial.
    text = ptx["_naive.batch_sum_xy"]
    assert text.count('.pragma "nounroll"') == 2
    assert re.search(rf"add\.s32\s+%r\d+, %r\d+, {_naive.CHUNK_ROWS};", text)


# Sizes each module takes, and sizes with one array past 2**31 elements (32-bit offsets).
SIZES = {
    "naive_column_sum": ({"M": 524288, "N": 128}, {"M": 2**30, "N": 3}),
    "naive_mamba2": ({"B": 8192, "K": 8, "SH2": 256, "D": 16}, {"B": 2**20, "K": 8, "SH2": 256, "D": 16}),
    "naive_q_denoise": ({"B": 8192, "A": 12, "H": 24}, {"B": 2**27, "A": 12, "H": 24}),
    "naive_kan": ({"B": 8192, "I": 32, "O": 32, "I*G": 256}, {"B": 2**23, "I": 32, "O": 32, "I*G": 256}),
    "naive_curiosity": ({"B": 8192, "F": 256, "F+A": 259, "H": 128},
                        {"B": 2**23, "F": 256, "F+A": 259, "H": 128}),
    "naive_risk_budget": ({"B": 8192, "SH2": 256, "I": 16, "SH2+I+1": 273, "H": 64},
                          {"B": 2**23, "SH2": 256, "I": 16, "SH2+I+1": 273, "H": 64}),
}


@pytest.mark.parametrize("name", MODULES)
def test_check_sizes_rejects_arrays_beyond_32_bit_offsets(name):
    fine, too_big = SIZES[name]
    chk = Checker(name, gpu=True)
    chk.dims.update(fine)
    kernel_module(name).check_sizes(chk)
    chk.dims.update(too_big)
    with pytest.raises(FoxcuteInputError, match="32-bit offsets"):
        kernel_module(name).check_sizes(chk)
