"""The TF32 wgmma probe compiled for sm_90a on the CPU (CI): the PTX holds the warpgroup MMA
with its fences in the order the kernel needs, 128-bit staging with TF32 rounding, nothing in
local memory; ptxas spills nothing; unsupported sizes are refused."""

import re

import numpy as np
import pytest

pytest.importorskip("cutlass")

from foxcute import FoxcuteInputError  # noqa: E402
from foxcute._arrays import Checker  # noqa: E402
from foxcute.kernels import _cute, _wgmma  # noqa: E402
from probes import wgmma_probe  # noqa: E402

WGMMA = "wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32"


@pytest.fixture(scope="module")
def ptx():
    return {name: f.__ptx__ for name, f in wgmma_probe.compiled_for_ci().items()}


def test_both_widths_compiled_for_hopper(ptx):
    assert set(ptx) == {f"wgmma_tf32_n{n}" for n in wgmma_probe.SUPPORTED_N}
    for name, text in ptx.items():
        assert ".target sm_90a" in text, name


def test_tf32_wgmma_reads_both_operands_from_shared_memory(ptx):
    for n in wgmma_probe.SUPPORTED_N:
        text = ptx[f"wgmma_tf32_n{n}"]
        # One m64nNk8 per 8-wide K step of a 32-wide chunk, in the (not unrolled) chunk loop;
        # operands: n/2 accumulator registers, then two 64-bit descriptors (SS, no registers).
        calls = re.findall(re.escape(WGMMA.format(n=n)) + r" \{([^}]*)\}, (%rd\d+), (%rd\d+),", text)
        assert len(calls) == wgmma_probe.CHUNK // _wgmma.MMA_K, n
        for acc, _, _ in calls:
            assert len(acc.split(",")) == n // 2, n
        assert "mma.sync" not in text


def test_fences_and_groups_in_order(ptx):
    for name, text in ptx.items():
        body = text[text.index("$L__BB0_1:"):]  # the chunk loop
        order = ["st.shared.v4.b32", "fence.proxy.async.shared::cta", "bar.sync", "wgmma.fence.sync.aligned",
                 "wgmma.mma_async", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned \t1"]
        positions = [body.index(s) for s in order]
        assert positions == sorted(positions), (name, positions)
        tail = text[text.rindex("wgmma.wait_group.sync.aligned \t1"):]
        assert tail.index("wgmma.wait_group.sync.aligned \t0") < tail.index("st.global"), name


def test_staging_is_128_bit_and_rounded_to_nearest(ptx):
    for n in wgmma_probe.SUPPORTED_N:
        text = ptx[f"wgmma_tf32_n{n}"]
        floats_per_thread = (wgmma_probe.TILE_M + n) * wgmma_probe.CHUNK // wgmma_probe.THREADS
        # Every float of a chunk is rounded once (_tf32.tf32_operand: half a TF32 ulp added
        # where finite), in the loop, before its 128-bit store.
        assert text.count("@finite add.s32 bits, bits, 4096;") == floats_per_thread, n
        assert len(re.findall(r"st\.shared\.v4\.b32", text)) == floats_per_thread // 4, n
        assert not re.search(r"st\.shared\.(b32|f32|v2)", text), n
        assert re.search(r"ld\.global(\.nc)?\.v4\.(b32|f32)", text), n
        assert not re.search(r"ld\.global(\.nc)?\.(b32|f32)\b", text), n


def test_nothing_in_local_memory_and_no_atomics(ptx):
    for name, text in ptx.items():
        assert "ld.local" not in text and "st.local" not in text, name
        assert not re.search(r"\b(atom|red)\.", text), name


@pytest.mark.parametrize("n", wgmma_probe.SUPPORTED_N)
def test_ptxas_spills_nothing(n):
    report = _cute.ptxas_report(*wgmma_probe.compile_args(n, wgmma_probe.DEFAULT_SIZES["K"]))
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report


def _checker(m, n, k):
    # Views of one element: the check reads shapes only, so no memory is needed.
    chk = Checker("test", gpu=False)
    chk.array("A", np.broadcast_to(np.float32(0), (m, k)), ("M", "K"))
    chk.array("B", np.broadcast_to(np.float32(0), (n, k)), ("N", "K"))
    return chk


@pytest.mark.parametrize("m,n,k,match", [
    (100, 32, 256, "M=100.*multiple of 64"),
    (64, 48, 256, "N=48 is not supported"),
    (64, 32, 48, "K=48.*multiple of 32"),
    (64, 32, 16, "K=16.*outside"),
    (64, 32, 544, "K=544.*outside"),
    (2**23, 32, 256, "32-bit"),
])
def test_check_sizes_rejects(m, n, k, match):
    with pytest.raises(FoxcuteInputError, match=match):
        wgmma_probe.check_sizes(_checker(m, n, k))


@pytest.mark.parametrize("m,n,k", [(64, 32, 32), (256, 64, 256), (65536, 32, 256), (64, 64, 512)])
def test_check_sizes_accepts(m, n, k):
    wgmma_probe.check_sizes(_checker(m, n, k))
