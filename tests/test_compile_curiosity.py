"""Curiosity's row pass compiled for sm_90a on the CPU (CI): no spills at the defaults and at
the widest supported sizes, and (where a SASS disassembler is installed) no epilogue global
load waiting behind a global store."""

import importlib.util
import os
import re
import shutil
import subprocess

import pytest

pytest.importorskip("cutlass")

from cutlass import Int32, Int64  # noqa: E402

from foxcute.kernels import _cute, curiosity  # noqa: E402


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("f,h,num_actions,action_dtype", [(256, 128, 3, Int64), (512, 512, 16, Int32)])
def test_row_pass_keeps_everything_in_registers(precision, f, h, num_actions, action_dtype):
    report = _cute.ptxas_report(*curiosity.row_pass_compile_args(f, h, num_actions, precision, action_dtype))
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report
    assert curiosity.RowPass.smem_floats(curiosity.row_block(f, h), f, h) * 4 <= curiosity.SMEM_BUDGET


def _disassembler() -> list[str] | None:
    """nvdisasm (CUDA toolkit or the nvidia-cuda-nvdisasm wheel) or cuobjdump, as a command
    taking a cubin path; None where neither is installed."""
    found = shutil.which("nvdisasm")
    if found is None and importlib.util.find_spec("nvidia") is not None:
        import nvidia

        for root in nvidia.__path__:
            for cuda in ("cu13", "cu12"):
                path = os.path.join(root, cuda, "bin", "nvdisasm")
                if os.path.exists(path):
                    found = path
    if found is not None:
        return [found, "-c"]
    cuobjdump = shutil.which("cuobjdump")
    return [cuobjdump, "-sass"] if cuobjdump else None


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_epilogue_loads_are_not_serialized_behind_stores(precision, tmp_path):
    """Between two barriers, no global load may sit between two global stores: ptxas keeps
    a load after a store it cannot prove distinct, so an epilogue that alternates loads of
    its operands (b1, W1's action columns, b2, s_next) with its output stores waits one
    memory round trip per element (the cause of most of the row pass's time before the
    operands were loaded up front)."""
    command = _disassembler()
    if command is None:
        pytest.skip("no SASS disassembler (nvdisasm / cuobjdump) installed")
    cubin = tmp_path / "row_pass.cubin"
    cubin.write_bytes(curiosity.compiled_for_ci()[f"row_pass_{precision}"].__cubin__)
    sass = subprocess.run([*command, str(cubin)], capture_output=True, text=True, check=True).stdout
    assert "HMMA" in sass or precision == "fp32"
    segments = re.split(r"\bBAR\.SYNC", sass)
    assert len(segments) > 8  # the four products' chunk loops and the epilogues between them
    for segment in segments:
        order = "".join("L" if op == "LDG" else "S" for op in re.findall(r"\b(LDG|STG)\.E", segment))
        assert not re.search(r"SL+S", order), order
