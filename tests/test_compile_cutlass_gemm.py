"""The CUTLASS C++ peer built for sm_90a on the CPU (CI, where nvcc and the nvidia-cutlass
wheel's headers are present): one TF32 wgmma kernel per tile width, TMA loads, no spills;
and its input checks, which run before the library is touched."""

import re

import numpy as np
import pytest

from foxcute import FoxcuteInputError
from foxcute.peers import cutlass_gemm

from conftest import disassemble

pytestmark = pytest.mark.slow  # ~30 s of nvcc on a 2-core machine, once per cache


@pytest.fixture(scope="module")
def built():
    reason = cutlass_gemm.unavailable()
    if reason:
        pytest.skip(f"CUTLASS C++ peer not buildable here: {reason}")
    return cutlass_gemm.build()


def test_each_tile_width_is_a_tf32_wgmma_kernel_with_tma_loads(built):
    sass = disassemble(built.cubin)
    kernels = re.split(r"\n\s*\.text\.", sass)[1:]  # one section per kernel
    assert len(kernels) == len(cutlass_gemm.tile_widths()) == 3
    shapes = sorted(set(re.findall(r"HGMMA\.64x(\d+)x8\.F32\.TF32", sass)), key=int)
    assert shapes == [str(t) for t in cutlass_gemm.tile_widths()]
    for text in kernels:
        assert "HGMMA" in text and "UTMALDG" in text  # wgmma fed by the tensor memory accelerator
        assert not re.search(r"\b(?:LDL|STL)\b", text)  # no local memory


def test_no_register_spills(built):
    reports = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", built.log)
    assert len(reports) == 3
    assert all(r == ("0", "0", "0") for r in reports), reports


def test_rebuild_is_the_cached_library(built):
    assert cutlass_gemm.build() == built


def test_host_arrays_are_rejected_by_name():
    with pytest.raises(FoxcuteInputError, match="argument 'A' must be a CUDA array"):
        cutlass_gemm.Matmul(np.zeros((8, 4), np.float32), np.zeros((4, 4), np.float32))
