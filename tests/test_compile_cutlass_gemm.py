"""The CUTLASS C++ peer built for sm_90a on the CPU (CI, where nvcc and the nvidia-cutlass
wheel's headers are present): per tile width one matmul kernel on SS TF32 wgmma and one
split-K weight-gradient kernel on RS TF32 wgmma (A from registers), all fed by TMA, the
matmul kernels without spills; and the input checks, which run before the library loads."""

import re

import numpy as np
import pytest

from foxcute import FoxcuteInputError
from foxcute.peers import cutlass_gemm

from conftest import disassemble

pytestmark = pytest.mark.slow  # ~50 s of nvcc on a 2-core machine, once per cache


@pytest.fixture(scope="module")
def built():
    reason = cutlass_gemm.unavailable()
    if reason:
        pytest.skip(f"CUTLASS C++ peer not buildable here: {reason}")
    return cutlass_gemm.build()


def _kernels(sass: str) -> dict[str, str]:
    """Kernel name -> its SASS, from nvdisasm's per-function section comments."""
    parts = re.split(r"//-+ \.text\.(\w+) -+", sass)
    return dict(zip(parts[1::2], parts[2::2]))


def _split_k(name: str) -> bool:
    return "RmemA" in name  # the register-A mainloop: the weight gradient's


def test_matmul_is_ss_and_weight_grad_rs_wgmma_with_tma_loads(built):
    kernels = _kernels(disassemble(built.cubin))
    widths = [str(t) for t in cutlass_gemm.tile_widths()]
    assert len(kernels) == 2 * len(widths)
    ss = {n: s for n, s in kernels.items() if not _split_k(n)}
    rs = {n: s for n, s in kernels.items() if _split_k(n)}
    assert sorted({w for s in ss.values() for w in re.findall(r"HGMMA\.64x(\d+)x8\.F32\.TF32 R\d+, gdesc", s)},
                  key=int) == widths
    assert sorted({w for s in rs.values() for w in re.findall(r"HGMMA\.64x(\d+)x8\.F32\.TF32 R\d+, R\d+, gdesc", s)},
                  key=int) == widths
    assert all("StreamK" in name for name in rs)  # split over the reduction by the stream-K scheduler
    for text in kernels.values():
        assert "UTMALDG" in text  # operands brought in by the tensor memory accelerator
    for text in ss.values():
        assert not re.search(r"\b(?:LDL|STL)\b", text)  # no local memory


def test_matmul_kernels_do_not_spill(built):
    entries = re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores, (\d+) bytes spill loads",
                         built.log, flags=re.S)
    assert len(entries) == 2 * len(cutlass_gemm.tile_widths())
    assert all((stores, loads) == ("0", "0") for name, stores, loads in entries if not _split_k(name))


def test_rebuild_is_the_cached_library(built):
    assert cutlass_gemm.build() == built


@pytest.mark.parametrize("plan,shapes", [(cutlass_gemm.Matmul, ((8, 4), (4, 4))),
                                         (cutlass_gemm.WeightGrad, ((8, 4), (8, 4)))])
def test_host_arrays_are_rejected_by_name(plan, shapes):
    first = "A" if plan is cutlass_gemm.Matmul else "dY"
    with pytest.raises(FoxcuteInputError, match=f"argument '{first}' must be a CUDA array"):
        plan(*(np.zeros(s, np.float32) for s in shapes))
