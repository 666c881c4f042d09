"""The small-MLP kernels (Q-denoise, risk budget, KAN) compiled for sm_90a on the CPU (CI):
their PTX and ptxas' report say what the designs mean."""

import os
import re
import tempfile

import pytest

pytest.importorskip("cutlass")

from foxcute.kernels import kan, q_denoise, risk_budget  # noqa: E402

MODULES = (q_denoise, risk_budget, kan)


def resource_report(text):
    """ptxas' register / stack / spill report from its remarks file."""
    used = re.search(r"Used (\d+) registers", text)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)
    assert used and frame, f"no ptxas resource report in:\n{text}"
    return {"registers": int(used.group(1)), "stack_frame": int(frame.group(1)),
            "spill_stores": int(frame.group(2)), "spill_loads": int(frame.group(3))}


@pytest.fixture(scope="module")
def compiled():
    """{kernel name: (PTX, ptxas resource report)} for every kernel the modules offer CI,
    each compiled once with the PTX kept and ptxas' remarks on."""
    import cutlass.cute as cute

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for module in MODULES:
            for name, (kernel, args) in module.kernels_for_ci().items():
                remarks = os.path.join(tmp, f"{name}.yaml")
                f = cute.compile(kernel, *args, options=f"--keep-ptx --remark-filter ptxas "
                                                        f"--remark-output {remarks}")
                out[name] = (f.__ptx__, resource_report(open(remarks).read()))
    return out


@pytest.fixture(scope="module")
def ptx(compiled):
    return {name: text for name, (text, _) in compiled.items()}


def test_every_kernel_and_precision_is_compiled(ptx):
    assert {"q_denoise_A12_H24", "q_denoise_A5_H7"} <= set(ptx)
    assert {"risk_budget_fp32", "risk_budget_tf32"} <= set(ptx)
    assert {f"kan_{k}_{p}" for k in ("forward", "backward") for p in ("fp32", "tf32")} <= set(ptx)
    assert "kan_grad_reduce" in ptx


def test_no_atomics(ptx):
    # Batch reductions go through per-CTA partials summed in a fixed order: bit-identical runs.
    # (Q-denoise and the TF32 KAN backward sum their partials in the same launch, with integer
    # tickets: tested below and in tests/test_compile_kan.py.)
    for name, text in ptx.items():
        fused = name.startswith("q_denoise") or (name.startswith("kan_backward") and name.endswith("_tf32"))
        if not fused:
            assert not re.search(r"\b(atom|red)\.", text), name


def test_q_denoise_reduces_the_batch_in_the_same_launch(ptx):
    # Where the grid is larger than the SMs: one kernel; its only atomics are the two integer
    # ticket draws (group, then final), each
    # after a gpu-scope fence publishing the CTA's partial row; no float atomics, so the
    # fixed-order sums are bit-identical. The finishers read the rows with coherent 128-bit
    # loads (a non-coherent .nc load could see stale rows written by other CTAs), one
    # LOADS_IN_FLIGHT batch per level, and nothing goes to local memory.
    for name in ("q_denoise_A12_H24_two_level", "q_denoise_A5_H7_two_level"):
        text = ptx[name]
        assert text.count(".entry") == 1, name
        atomics = re.findall(r"\b(?:atom|red)\.[\w.]+", text)
        assert atomics == ["atom.global.acq_rel.add.u32"] * 2, (name, atomics)
        assert text.count("fence.acq_rel.gpu") == 4, name
        row_loads = re.findall(r"ld\.global[\w.]*\.(?:v4\.(?:f32|b32)|v2\.b64)", text)
        assert len(row_loads) == 2 * q_denoise.LOADS_IN_FLIGHT, (name, len(row_loads))
        assert not any(".nc" in load for load in row_loads), name
        assert not re.search(r"\b(ld|st)\.local", text), name


def test_q_denoise_spread_finish_meets_at_one_counter(ptx):
    # Up to one CTA an SM (the defaults on an H200): each CTA arrives at one counter (release
    # fence, acq_rel add), waits with acquire loads, sums its slice of the rows with coherent
    # loads and adds each vector's parts by a 3-level butterfly of float4s; a relaxed add
    # counts it out. No float atomics, nothing in local memory.
    for name in ("q_denoise_A12_H24", "q_denoise_A5_H7"):
        text = ptx[name]
        assert text.count(".entry") == 1, name
        assert re.findall(r"\b(?:atom|red)\.[\w.]+", text) == ["atom.global.acq_rel.add.u32", "atom.global.add.u32"], name
        assert text.count("ld.acquire.gpu") == 1 and text.count("fence.acq_rel.gpu") == 2, name
        assert len(re.findall(r"shfl\.sync\.bfly\.b32", text)) == 3 * 4, name
        assert not re.search(r"ld\.global\.nc", text), name
        assert not re.search(r"\b(ld|st)\.local", text), name


def test_tf32_kernels_use_tensor_cores_and_fp32_kernels_do_not(ptx):
    mma = r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32"
    for name, text in ptx.items():
        if name.endswith("_tf32"):
            assert re.search(mma, text), name
        else:
            assert "mma.sync" not in text, name
        if name.endswith("_fp32"):
            assert "fma.rn.f32" in text, name


def test_vector_loads_where_meant(ptx):
    # risk budget streams h, the KAN grad reduce its partials, with 128-bit loads; the FFMA
    # KAN kernels read 4-row feature vectors, the TF32 ones 64-bit fragment pairs, from shared
    # memory; Q-denoise reads its weight rows 4 at a time (one 128-bit load per 4 FMAs).
    assert ptx["q_denoise_A12_H24"].count("ld.shared.v4") >= 4 * 12 * 24 // 4
    # ... and its partial sums read the sample table 4 samples at a time, at any width.
    assert ptx["q_denoise_A5_H7"].count("ld.shared.v4") >= 2 * q_denoise.SAMPLES // 4
    for name in ("risk_budget_fp32", "risk_budget_tf32", "kan_grad_reduce"):
        assert re.search(r"ld\.global(\.nc)?\.v4\.(f32|b32)", ptx[name]), name
    for name in ("kan_forward_fp32", "kan_backward_fp32"):
        assert re.search(r"ld\.shared\.v4\.(f32|b32)", ptx[name]), name
    for name in ("kan_forward_tf32", "kan_backward_tf32"):
        assert re.search(r"ld\.shared\.v2\.(f32|b32)", ptx[name]), name


def test_tf32_operands_are_rounded_not_truncated(ptx):
    # mma.sync ignores the low 13 mantissa bits; rounding first (cvt.rna) halves the error
    # and removes its bias. (The TF32 KAN backward rounds its computed features by adding half
    # an ulp instead, the same rounding: tests/test_compile_kan.py.)
    for name, text in ptx.items():
        if name.endswith("_tf32"):
            assert "cvt.rna.tf32.f32" in text, name


def test_weights_are_staged_asynchronously(ptx):
    # W1 / Wcat are gathered into shared memory by cp.async, every copy issued before one wait
    # (the TF32 KAN backward reads C and Wb with 16-byte loads instead: tests/test_compile_kan.py).
    for name in ("risk_budget_fp32", "risk_budget_tf32", "kan_forward_tf32"):
        assert re.search(r"cp\.async\.ca\.shared\.global", ptx[name]), name
        assert ptx[name].count("cp.async.wait_group") == 1, name


def test_q_denoise_matvecs_are_unrolled_fmas(ptx):
    # 4 matvecs of H*A = 288 FMAs each at the defaults, all fused multiply-adds.
    assert ptx["q_denoise_A12_H24"].count("fma.rn.f32") >= 4 * 12 * 24
    assert ptx["q_denoise_A5_H7"].count("fma.rn.f32") >= 4 * 5 * 7


def test_no_register_spills(compiled):
    for name, (_, report) in compiled.items():
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (name, report)
        assert report["stack_frame"] == 0, (name, report)
