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


def test_tf32_backward_reads_with_few_wide_loads_before_its_first_barrier(ptx):
    # Defaults: a lane's 8 x values (scalar) and its warp's dy rows (32 x 32 floats: 8 float4
    # a lane), a thread's task (o, i): C[o, i*G .. i*G+7] (2 float4) and Wb[o, i] (scalar).
    # Every load is issued before the first barrier; C, Wb and dy are read once per CTA.
    text = ptx["kan_backward_tf32"]
    staging = text[:text.index("bar.sync")]
    assert len(re.findall(LOAD_128, staging)) == 8 + 2
    assert len(re.findall(r"ld\.global\.(b32|f32)\b", staging)) == 8 + 1
    assert "cp.async" not in text and "ld.global.nc" not in text


def test_tf32_backward_mma_counts_and_features_computed_once(ptx):
    # Per warp at the defaults: phase (a) 2 output tiles x 9 feature tiles x 4 K steps, phase
    # (b) 5 feature tiles x 4 row tiles x 4 K steps. Each lane's 8 x values: 2 exp chains of 4
    # Gaussians (2 ex2 each) and silu (1 ex2, 1 rcp), not recomputed for phase (b); the 72
    # feature fragments are rounded to TF32 by adding half an ulp (0x1000) to their bits.
    text = ptx["kan_backward_tf32"]
    assert len(re.findall(r"mma\.sync", text)) == 2 * 9 * 4 + 5 * 4 * 4
    assert text.count("ex2.approx") == 8 * (2 * 2 + 1)
    assert text.count("rcp.approx") == 8
    assert len(re.findall(r"add\.s32\s+%r\d+, %r\d+, 4096;", text)) == 8 * 9


def test_tf32_backward_reduces_the_batch_in_the_same_launch(ptx):
    # Where the grid is larger than the SMs: one kernel; its only atomics are two integer
    # ticket draws (the group's, relaxed after a release fence; the block's final, acq_rel),
    # plus one acquire fence of the group finisher; no float atomics, so the fixed-order sums
    # are bit-identical. Nothing goes to local memory, and no programmatic dependent launch is
    # left to wait for.
    text = ptx["kan_backward_two_level_tf32"]
    assert text.count(".entry") == 1
    assert re.findall(r"\b(?:atom|red)\.[\w.]+", text) == ["atom.global.add.u32", "atom.global.acq_rel.add.u32"]
    assert text.count("fence.acq_rel.gpu") == 3
    assert not re.search(r"\b(ld|st)\.local", text)
    assert "griddepcontrol" not in text


def test_tf32_backward_spread_finish_meets_at_one_counter_a_block(ptx):
    # The defaults on an H200 (128 CTAs): each CTA arrives at its block's counter (release
    # fence, acq_rel add), waits for the others with acquire loads, sums its slice of the
    # block's rows and adds the parts of each vector by a 3-level butterfly of float4s; one
    # relaxed add counts it out. No float atomics, nothing in local memory.
    text = ptx["kan_backward_tf32"]
    assert text.count(".entry") == 1
    assert re.findall(r"\b(?:atom|red)\.[\w.]+", text) == ["atom.global.acq_rel.add.u32", "atom.global.add.u32"]
    assert text.count("ld.acquire.gpu") == 1
    assert text.count("fence.acq_rel.gpu") == 2
    assert len(re.findall(r"shfl\.sync\.bfly\.b32", text)) == 3 * 4
    assert not re.search(r"\b(ld|st)\.local", text)


def test_tf32_backward_spreads_its_finish_where_the_grid_fits_the_sms():
    k = kan.KanBackwardTf32(32, 32, 8)
    assert kan.spreads(*kan.reduction_grid(8192, k.blocks, k.rows)[:1], k.blocks, 132)
    assert kan.spreads(33, 4, 132) and not kan.spreads(34, 4, 132)
    assert not kan.spreads(*kan.reduction_grid(65537, k.blocks, k.rows)[:1], k.blocks, 132)


def test_tf32_backward_grid_and_reduction_levels():
    # Defaults: 32 chunks of 256 rows x 4 input blocks = 128 CTAs, groups of 6 chunks (two
    # levels of ~6 rows each); at B = 65537, 257 chunks in 16 groups. Tickets per launch
    # (blocks * (groups + 1)) stay within the pool's share for every batch size.
    k = kan.KanBackwardTf32(32, 32, 8)
    assert (k.warp_rows, k.rows, k.blocks, k.a_tiles) == (32, 256, 4, 9)
    assert kan.reduction_grid(8192, k.blocks, k.rows) == (32, 6, 6)
    assert kan.reduction_grid(65537, k.blocks, k.rows) == (257, 17, 16)
    assert kan.reduction_grid(1, k.blocks, k.rows) == (1, 1, 1)
    for batch in (1, 257, 8192, 10**6, 2**26):
        for blocks in (1, 4, 60):
            chunks, size, groups = kan.reduction_grid(batch, blocks, k.rows)
            assert blocks * (groups + 1) <= _cute.TICKETS_PER_LAUNCH
            assert (groups - 1) * size < chunks <= groups * size
    # Many basis functions: 16-row warps keep the held features within bounds.
    assert kan.KanBackwardTf32(16, 48, 12).warp_rows == 16


def test_grad_reduce_streams_partials_with_128_bit_loads(ptx):
    assert re.search(LOAD_128, ptx["kan_grad_reduce"])


@pytest.mark.parametrize("name", sorted(kan.kernels_for_ci()))
def test_no_register_spills(name):
    kernel, args = kan.kernels_for_ci()[name]
    report = _cute.ptxas_report(kernel, *args)
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report


def test_fp32_backward_lets_the_grad_reduce_launch_early(ptx):
    assert "griddepcontrol.launch_dependents;" in ptx["kan_backward_fp32"]


def test_grad_reduce_waits_for_the_backward_before_reading_partials(ptx):
    # Launched with programmatic dependent launch: a load before the wait could read partials
    # the backward kernel has not written yet.
    reduce_ptx = ptx["kan_grad_reduce"]
    assert "griddepcontrol.wait;" in reduce_ptx
    assert reduce_ptx.index("griddepcontrol.wait;") < reduce_ptx.index("ld.global")
