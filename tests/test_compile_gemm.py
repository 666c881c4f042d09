"""The skinny GEMM kernels compiled for sm_90a on the CPU (CI): the PTX says what we meant."""

import re

import pytest

pytest.importorskip("cutlass")

from foxcute.kernels import _cute, gemm  # noqa: E402

TF32_MMA = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
# Operands stream through cp.async, 16 bytes a copy (4 where a row is not whole float4s).
LOAD_128 = r"cp\.async\.c[ag]\.shared\.global \[[^]]+\], \[[^]]+\], 16"


@pytest.fixture(scope="module")
def ptx():
    return {name: f.__ptx__ for name, f in gemm.compiled_for_ci().items()}


def test_every_variant_compiled_for_hopper(ptx):
    want = {f"matmul_{e}_{p}" for e in list(gemm.EPILOGUES) + ["kn"] for p in gemm.PRECISIONS}
    want |= {f"weight_grad_k{bk}_{p}" for bk in gemm.WeightGrad.BK for p in gemm.PRECISIONS}
    want |= {f"weight_grad{kind}_{p}" for kind in ("_pair", "_halves", "_pair_scalar") for p in gemm.PRECISIONS}
    want |= {"kmajor_weight_grad_pair"}
    assert set(ptx) == want
    for name, text in ptx.items():
        assert ".target sm_90a" in text, name


def test_tf32_variants_use_tensor_cores_with_rounding(ptx):
    for name, text in ptx.items():
        if name.startswith("kmajor"):
            continue  # wgmma on operands their producer rounded (test_kmajor_weight_grad_...)
        if name.endswith("tf32"):
            assert TF32_MMA in text, name
            assert "cvt.rna.tf32.f32" in text, name  # round, not truncate, to TF32
        else:
            assert "mma.sync" not in text, name
            assert re.search(r"\bfma\.rn\.f32", text), name


def test_operands_stream_with_128_bit_copies_and_nothing_spills_to_local(ptx):
    for name, text in ptx.items():
        assert re.search(LOAD_128, text), name
        assert "ld.local" not in text and "st.local" not in text, name


def test_weight_grad_only_atomic_is_the_integer_ticket(ptx):
    for p in gemm.PRECISIONS:
        for one in [f"k{bk}" for bk in gemm.WeightGrad.BK] + ["halves"]:
            atomics = re.findall(r"\b(?:atom|red)\.[\w.]+", ptx[f"weight_grad_{one}_{p}"])
            assert atomics == ["atom.global.acq_rel.add.u32"], atomics
        # The pairs: one ticket per problem's branch.
        for pair in ("pair", "pair_scalar"):
            atomics = re.findall(r"\b(?:atom|red)\.[\w.]+", ptx[f"weight_grad_{pair}_{p}"])
            assert atomics == ["atom.global.acq_rel.add.u32"] * 2, atomics


def test_weight_grad_halves_store_without_integer_division(ptx):
    # dW's two column halves are addressed by a compare, not by dividing by the runtime K / 2
    for p in gemm.PRECISIONS:
        divisions = [len(re.findall(r"\b(?:div|rem)\.[su]32", ptx[f"weight_grad_{v}_{p}"])) for v in ("halves", "k32")]
        assert divisions[0] == divisions[1], divisions


def test_weight_grad_tile_is_the_narrowest_that_covers_k():
    widths = {k: gemm.WeightGrad.tile_k(k) for k in (1, 16, 17, 32, 33, 64, 65, 512)}
    assert widths == {1: 16, 16: 16, 17: 32, 32: 32, 33: 64, 64: 64, 65: 64, 512: 64}


def test_kmajor_weight_grad_is_wgmma_on_operands_rounded_by_their_producer(ptx):
    """Curiosity's pair ("kmajor", "rows"): per problem's branch one m64n128k8 TF32 wgmma per
    8 batch rows of a 32-row stage (4) on each warpgroup's half of the 128 x 128 tile;
    "kmajor" reads both operands from shared memory through descriptors, "rows" its A from 4
    registers a k-step, loaded from the staged X half (16 scalar shared loads a thread and
    stage) and rounded there by adding half a TF32 ulp (no cvt.rna: the K-major operands'
    rounding is their producer's), in a loop unrolled twice over two register sets (8 wgmma,
    32 loads); no mma.sync. The partial tile goes out as 64-bit accumulator pairs (32 a
    thread and branch), the finish reads it as float4s; the only atomics are each branch's
    tile counter, counted up on arrival and again when done (then zeroed), and the wait for
    the tile's other splits polls it with acquire loads."""
    text = ptx["kmajor_weight_grad_pair"]
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+)\.f32\.tf32\.tf32 \{[^}]*\}, (\{|%rd)", text)
    assert wgmma == [("m64n128k8", "%rd")] * 4 + [("m64n128k8", "{")] * 8, wgmma
    assert "mma.sync" not in text and "cvt.rna" not in text
    assert text.count("ld.shared.b32") == 2 * 16  # X's fragment elements
    assert text.count("wgmma.commit_group") == 1 + 2 and "fence.proxy.async.shared::cta" in text
    assert len(re.findall(r"st\.global\.v2\.b32", text)) == 2 * 32
    assert set(re.findall(r"ld\.global\.[\w.]+", text)) == {"ld.global.v4.b32"}
    atomics = re.findall(r"\b(?:atom|red)\.[\w.]+", text)
    assert atomics == ["atom.global.acq_rel.add.u32", "atom.global.add.u32"] * 2, atomics
    assert re.findall(r"ld\.acquire\.[\w.]+", text) == ["ld.acquire.gpu.global.b32"] * 2


def test_kmajor_split_keeps_every_cta_of_a_launch_resident_at_once():
    # A tile's CTAs wait for each other (KMajorWeightGrad's split sums): a launch of more than
    # one split must fit the SMs one CTA each, and the splits must cover every k-block once.
    for sms in (1, 16, 114, 132):
        for tiles in (1, 2, 4, 16, 32, 40, 200):
            for num_kb in (1, 2, 7, 256, 2049):
                splits, per_split = gemm.kmajor_split(num_kb, tiles, sms)
                assert splits == 1 or splits * tiles <= sms, (sms, tiles, num_kb, splits)
                assert (splits - 1) * per_split < num_kb <= splits * per_split, (sms, tiles, num_kb)


def test_scalar_load_variant_for_odd_k():
    text = gemm._compile_matmul("none", "tf32", 8, 1, False, keep=True).__ptx__
    assert TF32_MMA in text and not re.search(LOAD_128, text)
    assert re.search(r"cp\.async\.ca\.shared\.global \[[^]]+\], \[[^]]+\], 4", text)


def test_even_n_outputs_are_stored_in_64_bit_pairs(ptx):
    # the CI variants are compiled for an even N: every output store is a pair (a thread's
    # 2 x 2 x (bm / 64) x (bn / 16) accumulators, 64 at bn = 128, in 32 pairs)
    for p in gemm.PRECISIONS:
        for e in ("none", "bias_relu", "sigmoid", "residual"):
            stores = re.findall(r"st\.global\.(v2\.)?[bf]32", ptx[f"matmul_{e}_{p}"])
            assert stores == ["v2."] * 32, (e, p, stores[:4], len(stores))
        # the residual's R is read as the output is written, a pair per pair, and all of a
        # tile's R before its first output store (each load in flight at once)
        text = ptx[f"matmul_residual_{p}"]
        loads = re.findall(r"ld\.global\.(v2\.)?[bf]32", text)
        assert loads == ["v2."] * 32, (p, loads[:4], len(loads))
        last_load = max(m.start() for m in re.finditer(r"ld\.global\.v2\.[bf]32", text))
        assert last_load < text.index("st.global.v2"), p
    for e in ("none", "residual"):  # odd N: elements
        odd = gemm._compile_matmul(e, "tf32", 8, 4, False, keep=True).__ptx__
        assert "st.global.v2" not in odd and re.search(r"st\.global\.[bf]32", odd)
        assert "ld.global.v2" not in odd


@pytest.mark.parametrize("precision", gemm.PRECISIONS)
@pytest.mark.parametrize("epilogue,pairs", [("none", False), ("residual", True), ("residual", False)])
def test_widest_tiles_keep_accumulators_in_registers(epilogue, pairs, precision):
    # residual holds a second register tile: R of every accumulator entry (SkinnyMatmul.load_residual)
    for bn in (64, 128):  # the most accumulators a thread: bm x bn = 128 x 64 and 64 x 128
        report = _cute.ptxas_report(*gemm.matmul_compile_args(epilogue, precision, bn, 4, pairs))
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (bn, report)


@pytest.fixture(scope="module")
def row_pass_ptx():
    from foxcute.kernels import curiosity

    return {name: f.__ptx__ for name, f in curiosity.compiled_for_ci().items()}


def test_curiosity_row_pass(row_pass_ptx):
    tf32, fp32 = row_pass_ptx["row_pass_tf32"], row_pass_ptx["row_pass_fp32"]
    # TF32 at the defaults: the products on wgmma (their count: test_compile_curiosity)
    assert TF32_MMA not in tf32 and "wgmma.mma_async" in tf32
    assert "mma.sync" not in fp32 and re.search(r"\bfma\.rn\.f64", fp32)  # fp32 mode: z in float64
    for text in (tf32, fp32):
        assert ".target sm_90a" in text
        assert re.search(LOAD_128, text)
        assert "ld.local" not in text and "st.local" not in text
        assert not re.search(r"\b(atom|red)\.", text)

