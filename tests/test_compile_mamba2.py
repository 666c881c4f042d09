"""The Mamba2 kernels compiled for sm_90a on the CPU (CI): the PTX says what we meant, and
unsupported sizes are refused before anything is compiled or launched."""

import re

import numpy as np
import pytest

pytest.importorskip("cutlass")

from foxcute import FoxcuteInputError  # noqa: E402
from foxcute._arrays import Checker  # noqa: E402
from foxcute.kernels import _cute, mamba2  # noqa: E402
from foxcute.kernels.mamba2 import _tiles  # noqa: E402

TF32_MMA = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
PHASE3_CHUNKS = mamba2.DEFAULTS["SH2"] // mamba2.CHUNK  # the fused backward unrolls its phase-3 chunk loop
TF32_WGMMA = "wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32"
LOAD_128 = r"ld\.global(\.nc)?\.v4\.(b32|f32)"
STORE_128 = r"st\.global\.v4\.(b32|f32)"
TF32_OPERAND = "@finite add.s32 bits, bits, 4096;"  # _tf32.tf32_operand: + half a TF32 ulp
FUSED = [f"fused_{d}_{p}" for d in ("forward", "backward") for p in mamba2.PRECISIONS]
SEED = ["seed_scan_forward", "seed_readout", "seed_scan_backward"]


@pytest.fixture(scope="module")
def ptx():
    return {name: f.__ptx__ for name, f in mamba2.compiled_for_ci().items()}


def test_every_kernel_compiled_for_hopper(ptx):
    assert set(ptx) == set(FUSED + SEED)
    for name, text in ptx.items():
        assert ".target sm_90a" in text, name


def test_tf32_variants_use_tensor_cores_with_rounding(ptx):
    # a|u = h_hist @ [W_A|W_B] is a warpgroup MMA (wgmma) in both directions: the forward's
    # only product, so no mma.sync left there; the backward's dh_hist and dW stay mma.sync
    # (dW's A, h_hist^T, is MN-major: TF32 wgmma takes K-major operands only)
    D = mamba2.DEFAULTS["D"]
    for name in FUSED:
        if name.endswith("tf32"):
            assert TF32_WGMMA.format(n=2 * D) in ptx[name], name
            # operands are staged in shared memory rounded to nearest (half a TF32 ulp added,
            # _tf32.tf32_operand; the tensor cores would truncate), every one the same way
            assert TF32_OPERAND in ptx[name] and "cvt.rna" not in ptx[name], name
        else:
            assert "mma.sync" not in ptx[name] and "wgmma" not in ptx[name], name
            assert re.search(r"\bfma\.rn\.f32", ptx[name]), name
    assert "mma.sync" not in ptx["fused_forward_tf32"]
    assert TF32_MMA in ptx["fused_backward_tf32"]


def test_scan_sigmoids_take_one_approximate_reciprocal_each(ptx):
    """Every scan step's sigmoid is 1/(1 + e) or e/(1 + e) with 1 + e in [1, 2]: rcp.approx
    (within 1 ulp there), not IEEE division, whose slow-path branch kept the K independent
    sigmoids of a (sample, state) pair from overlapping. K a pass; the fused backward's
    reverse pass shares one reciprocal between sigmoid(a_t) and its slope."""
    K = mamba2.DEFAULTS["K"]
    per_step = {"fused_forward_tf32": 1, "fused_forward_fp32": 1, "fused_backward_tf32": 2,
                "fused_backward_fp32": 2, "seed_scan_forward": 1, "seed_scan_backward": 1}
    for name, count in per_step.items():
        assert not re.search(r"\b(div|rcp)\.rn\.f32", ptx[name]), name  # IEEE 1/x or x/y
        assert ptx[name].count("rcp.approx.ftz.f32") == count * K, name


def _shared_loads(text):
    """The PTX's shared-memory loads and TF32 conversions by destination register: pairs
    {first: (second, base, offset)} of ld.shared.v2, loads {reg: (base, offset)} of scalar
    ld.shared, converts {reg: source} of cvt.rna."""
    pairs, loads, converts = {}, {}, {}
    for line in text.splitlines():
        m = re.match(r"\s*ld\.shared\.v2\.[bf]32\s+\{(%r\d+),\s*(%r\d+)\},\s*\[(%r\d+)(?:\+(-?\d+))?\];", line)
        if m:
            pairs[m.group(1)] = (m.group(2), m.group(3), int(m.group(4) or 0))
        m = re.match(r"\s*ld\.shared\.[bf]32\s+(%r\d+),\s*\[(%r\d+)(?:\+(-?\d+))?\];", line)
        if m:
            loads[m.group(1)] = (m.group(2), int(m.group(3) or 0))
        m = re.match(r"\s*cvt\.rna\.tf32\.f32\s+(%r\d+),\s*(%r\d+);", line)
        if m:
            converts[m.group(1)] = m.group(2)
    return pairs, loads, converts


def _mma_a_operand_offsets(text):
    """For every TF32 mma.sync: the shared-memory byte offsets its A registers a0..a3 were
    loaded from (directly, for operands rounded to TF32 when staged, or through a cvt.rna),
    relative to a0's; None where they do not trace back to loads from one base register."""
    _, loads, converts = _shared_loads(text)
    found = []
    flat = re.sub(r"\s+", " ", text)
    for operands in re.findall(re.escape(TF32_MMA) + r" \{[^}]*\}, \{([^}]*)\}", flat):
        regs = [r.strip() for r in operands.split(",")]
        origins = [loads.get(converts.get(r, r)) for r in regs]
        if None in origins or len({o[0] for o in origins}) != 1:
            found.append(None)
        else:
            found.append(tuple(o[1] - origins[0][1] for o in origins))
    return found


def _mmas_fed_by_cvt(text):
    """For every TF32 mma.sync: whether any of its A or B registers comes from a cvt.rna."""
    converted = set(re.findall(r"cvt\.rna\.tf32\.f32\s+(%r\d+),", text))
    flat = re.sub(r"\s+", " ", text)
    return [any(r.strip() in converted for r in (a + "," + b).split(","))
            for a, b in re.findall(re.escape(TF32_MMA) + r" \{[^}]*\}, \{([^}]*)\}, \{([^}]*)\}", flat)]


def test_tf32_mma_operands_are_not_converted_at_fragment_loads(ptx):
    # The backward's mma.sync operands are rounded where staged ([da|du] where the reverse scan
    # writes it, h, dc, the weights) or, h_hist, read as cp.async wrote it and truncated by the
    # tensor cores (FusedBackward's docstring): no cvt.rna at a fragment load (two instructions
    # an element). (wgmma has no register operands: test_tf32_*_au_is_one_wgmma_group_per_chunk.)
    fed_by_cvt = _mmas_fed_by_cvt(ptx["fused_backward_tf32"])
    assert fed_by_cvt and not any(fed_by_cvt)


def _assert_one_wgmma_per_k_step(text):
    """a|u's m64n(2D)k8 wgmmas in the kernel's PTX: one per 8-wide K step of a chunk (the chunk
    loop is not unrolled), each with 64 x 2D / 128 accumulator registers a thread."""
    D = mamba2.DEFAULTS["D"]
    calls = re.findall(re.escape(TF32_WGMMA.format(n=2 * D)) + r" \{([^}]*)\}, (%rd\d+), (%rd\d+),", text)
    assert len(calls) == mamba2.CHUNK // 8
    assert all(len(acc.split(",")) == 64 * 2 * D // 128 for acc, _, _ in calls)


def test_tf32_backward_au_is_one_wgmma_group_per_chunk(ptx):
    # the backward's a|u recompute as the forward's: one m64n(2D)k8 per 8-wide K step of a
    # chunk, A = the h_hist chunk (the tile cp.async wrote into 128B-swizzled shared memory,
    # as it is), B = [W_A|W_B]^T stored transposed and rounded. Every thread fences its
    # stores for the async proxy before the barrier that precedes the group; the group is
    # waited for before the chunk's closing barrier. dh_hist and dW stay mma.sync: 4 + 8 K
    # steps x 4 + 2 N repeats per chunk; so are dh (2 K steps x 2 N repeats, on one CTA half)
    # and dW_C (1 K step x 2 N repeats, on the other); phase 3's loop over the 4 chunks is
    # unrolled (each chunk's weight gradients are registers of their own).
    # At the defaults the weights are resident (staged once a CTA): the first fence publishes
    # them, the second is the chunk loop's.
    text = ptx["fused_backward_tf32"]
    _assert_one_wgmma_per_k_step(text)
    assert text.count(TF32_MMA) == PHASE3_CHUNKS * (16 + 16 + 4 + 2)
    assert mamba2.FusedBackward(*(mamba2.DEFAULTS[k] for k in ("K", "SH2", "D")), "tf32").resident
    assert text.count("fence.proxy.async.shared::cta") == 2
    fence = text.rindex("fence.proxy.async.shared::cta")
    at = fence
    for step in ["bar.sync", "wgmma.fence.sync.aligned", "wgmma.mma_async", "wgmma.commit_group.sync.aligned",
                 "wgmma.wait_group.sync.aligned \t0", "bar.sync"]:
        at = text.index(step, at)
    assert text.index(TF32_MMA) > at  # phase 3's products come after phase 1's a|u


def test_tf32_forward_au_is_one_wgmma_group_per_chunk(ptx):
    # a|u = h_hist @ [W_A|W_B] on TF32 wgmma, both operands read by the tensor cores from
    # shared memory through descriptors: one m64n(2D)k8 per 8-wide K step of a 64-wide chunk
    # (in the not-unrolled chunk loop), 64 x 2D / 128 accumulator registers a thread, and no
    # fragment loads: none of the mma.sync version's ld.shared.v2 (h_hist pairs) and, of the
    # chunk loop's shared loads, only the c product's (an h word and a W_C float4, 8 times).
    text = ptx["fused_forward_tf32"]
    _assert_one_wgmma_per_k_step(text)
    assert "ld.shared.v2" not in text
    # the chunk loop: the thread's 4 float4 of the h_hist chunk stored rounded (tf32_operand
    # in place), 128 bits at a time, then its h float4 (c's operand: FFMA, not rounded); then, in
    # order, the fence for the async proxy, the barrier, the wgmma group, c's loads while it
    # runs, the wait for it, the barrier (after which sA is overwritten)
    fence = text.index("fence.proxy.async.shared::cta")
    staged = text[:fence]
    assert staged.rfind("st.shared.") == staged.rfind("st.shared.v4.b32")
    converted = set(re.findall(r"mov\.b32\s+(%r\d+), bits;", staged))  # tf32_operand's results
    stores = re.findall(r"st\.shared\.v4\.b32\s+\[[^\]]+\],\s*\{([^}]*)\}", staged)[-5:]
    rounded = [all(r.strip() in converted for r in regs.split(",")) for regs in stores]
    assert rounded == [True] * 4 + [False], rounded
    order = ["bar.sync", "wgmma.fence.sync.aligned", "wgmma.mma_async", "wgmma.commit_group.sync.aligned",
             "ld.shared", "wgmma.wait_group.sync.aligned \t0", "bar.sync"]
    at = fence
    for step in order:
        at = text.index(step, at)
    body = text[text.index("wgmma.commit_group", fence):text.index("wgmma.wait_group", fence)]
    loads = re.findall(r"ld\.shared\.(\S+)", body)
    assert sorted(set(loads)) == ["b32", "v4.b32"] and loads.count("b32") == loads.count("v4.b32") == 8, loads


def test_tf32_mma_gets_the_ptx_isa_a_fragment(ptx):
    # m16n8k8 TF32 A registers: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4), g = lane/4,
    # t = lane%4. Each is its own element: 8 rows and 4 columns apart in the shared-memory
    # tile (a register tensor "like" a K-major partition once fed a0, a2, a2, a1 instead).
    # The backward's dh_hist reads [da|du] K-major at pitch 2D + 4. Its dW reads h_hist^T out
    # of the 128B-swizzled tile, where the XOR makes the four elements' offsets thread
    # dependent: four addresses a thread, computed once (ld.shared off four base registers);
    # tests/test_gpu_mamba2.py is what shows those are the right elements. Then dh reads dc
    # K-major at its pitch D + 4, and dW_C h^T, M-major (the defaults keep the tile's whole
    # h resident: rows of SH2 + 4).
    # Phase 3's chunk loop is unrolled: the same 38 MMAs for each of the SH2 / CHUNK chunks.
    K, SH2, D = (mamba2.DEFAULTS[k] for k in ("K", "SH2", "D"))
    assert mamba2.FusedBackward(K, SH2, D, "tf32").rows_resident
    text = ptx["fused_backward_tf32"]
    all_offsets = _mma_a_operand_offsets(text)
    assert len(all_offsets) == PHASE3_CHUNKS * (16 + 16 + 4 + 2)
    au_row, dc_row, h_row = (2 * D + 4) * 4, (D + 4) * 4, (SH2 + 4) * 4
    _, loads, _ = _shared_loads(text)
    flat = re.sub(r"\s+", " ", text)
    all_a = re.findall(re.escape(TF32_MMA) + r" \{[^}]*\}, \{([^}]*)\}", flat)
    for c in range(PHASE3_CHUNKS):
        offsets = all_offsets[38 * c:38 * (c + 1)]
        assert offsets[:16] == [(0, 8 * au_row, 16, 8 * au_row + 16)] * 16
        assert offsets[32:36] == [(0, 8 * dc_row, 16, 8 * dc_row + 16)] * 4
        assert offsets[36:] == [(0, 32, 4 * h_row, 4 * h_row + 32)] * 2
        dw = all_a[38 * c + 16:38 * c + 32]
        assert len(dw) == 16 and offsets[16:32] == [None] * 16
        for operands in dw:  # each register its own scalar load, off its own base register
            origins = [loads.get(r.strip()) for r in operands.split(",")]
            assert None not in origins and len({o[0] for o in origins}) == 4, origins


def _mma_b_operand_loads(text):
    """For every TF32 mma.sync: ("v2", offset) where its b0, b1 are the two registers of one
    ld.shared.v2 in that order (directly or each through a cvt.rna), ("scalar", b1 - b0 byte
    offset) where each comes from its own scalar ld.shared off one base, else None."""
    pairs, loads, converts = _shared_loads(text)
    found = []
    flat = re.sub(r"\s+", " ", text)
    for operands in re.findall(re.escape(TF32_MMA) + r" \{[^}]*\}, \{[^}]*\}, \{([^}]*)\}", flat):
        b0, b1 = (converts.get(r.strip(), r.strip()) for r in operands.split(","))
        if b0 in pairs and pairs[b0][0] == b1:
            found.append(("v2", pairs[b0][2]))
        elif b0 in loads and b1 in loads and loads[b0][0] == loads[b1][0]:
            found.append(("scalar", loads[b1][1] - loads[b0][1]))
        else:
            found.append(None)
    return found


def test_tf32_b_fragments_load_in_64_bit_pairs(ptx):
    # b0, b1 (k = t, t+4) sit side by side (k relabeled so that t, t+4 are 2t, 2t+1) and are
    # one ld.shared.v2, first register b0: every MMA of the backward's dh_hist (B = W), 4 K
    # steps x 4 N repeats per chunk. dW's B ([da|du]^T, K = rows) is K-strided and stays
    # scalar; its K is relabeled the same way (so that its A, h_hist^T, reads the swizzled
    # tile without bank conflicts): rows 2t, 2t+1, one row apart. (a|u is a wgmma now.)
    # dh's B (W_C, K-major) and dW_C's (dc^T, K = rows of pitch D + 4) stay scalar: 4 floats
    # and 4 rows apart (6 MMAs a chunk).
    D = mamba2.DEFAULTS["D"]
    all_b = _mma_b_operand_loads(ptx["fused_backward_tf32"])
    assert None not in all_b, all_b
    assert len(all_b) == PHASE3_CHUNKS * 38
    for c in range(PHASE3_CHUNKS):  # phase 3's chunk loop, unrolled
        backward = all_b[38 * c:38 * (c + 1)]
        assert [b[0] for b in backward[:16]] == ["v2"] * 16
        assert backward[16:32] == [("scalar", 4 * (2 * D + 4))] * 16
        assert backward[32:] == [("scalar", 16)] * 4 + [("scalar", 4 * (D + 4) * 4)] * 2
    # 2 more v2 loads a chunk: dout pairs in dh's epilogue (of a lane's 4 accumulator pairs,
    # the 2 of rows g + 8 >= Bt = 8 are never stored)
    assert ptx["fused_backward_tf32"].count("ld.shared.v2.b32") == PHASE3_CHUNKS * (16 + 2)


def _quarter_warp_wavefronts(words):
    """Wavefronts of one warp's 128-bit ld.shared: served 8 lanes at a time, each quarter-warp
    as many as the most distinct 16-byte words on one bank (first word addresses per lane)."""
    total = 0
    for q0 in range(0, 32, 8):
        banks = {}
        for w in words[q0:q0 + 8]:
            for e in range(4):
                banks.setdefault((w + e) % 32, set()).add(w + e)
        total += max(len(s) for s in banks.values())
    return total


@pytest.mark.parametrize("D", mamba2.SUPPORTED_D)
def test_c_product_w_c_loads_are_conflict_free_over_the_supported_range(D):
    # _StateProduct's lanes: task = (group = (sample, float4 s4 of the states), k % split); a
    # quarter-warp reads split rows of W_C at the pitch chosen for that split
    for K in range(1, mamba2.MAX_K + 1):
        product = _tiles._StateProduct(_tiles.TILE_ROWS // K, D)
        assert product.w_pitch % 4 == 0 and product.w_pitch >= D
        for warp in range(-(-product.tasks // 32)):
            for i in range(2):
                words = []
                for lane in range(32):
                    task = min(32 * warp + lane, product.tasks - 1)
                    group, j = divmod(task, product.split)
                    words.append((i * product.split + j) * product.w_pitch + 4 * (group % product.quads))
                assert _quarter_warp_wavefronts(words) == 4, (K, D, product.split, product.w_pitch)


@pytest.mark.parametrize("name", ["fused_forward_tf32", "fused_backward_tf32"])
def test_c_product_reads_w_c_at_the_padded_pitch(ptx, name):
    # its k loop (unrolled 8) reads a float4 of every split-th W_C row: 128-bit loads off one
    # base register, split * pitch * 4 bytes apart (pitch 24 at the defaults, not D = 16)
    K, SH2, D = (mamba2.DEFAULTS[k] for k in ("K", "SH2", "D"))
    kernel = (mamba2.FusedForward if "forward" in name else mamba2.FusedBackward)(K, SH2, D, "tf32")
    product = kernel.c_product
    assert (product.split, product.w_pitch, kernel.wc_pitch) == (4, 24, 24)
    step = 4 * product.split * product.w_pitch
    offsets = {}
    for m in re.finditer(r"ld\.shared\.v4\.[bf]32\s+\{[^}]*\},\s*\[(%r\d+)\+?(-?\d*)\];", ptx[name]):
        offsets.setdefault(m.group(1), set()).add(int(m.group(2) or 0))
    assert any(all(o - n * step in offs for n in range(8)) for offs in offsets.values() for o in offs), name


def test_fused_kernels_stream_h_hist_16_bytes_at_a_time(ptx):
    for name in FUSED:
        assert re.search(LOAD_128, ptx[name]), name  # forward: h_hist; backward: h, dout, W
    for name in ("fused_backward_tf32", "fused_backward_fp32"):
        # the backward's h_hist tile goes straight to shared memory, 16 bytes per cp.async
        assert re.search(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 16", ptx[name]), name
    for name in ("fused_forward_tf32", "fused_forward_fp32", "seed_readout"):
        assert re.search(STORE_128, ptx[name]), name  # out rows written 16 bytes at a time


def test_nothing_lives_in_local_memory(ptx):
    for name, text in ptx.items():
        assert "ld.local" not in text and "st.local" not in text, name


def test_batch_reductions_use_no_atomics(ptx):
    # weight gradients and dsigma are per-CTA partials summed in a fixed order
    for name in ("fused_backward_tf32", "fused_backward_fp32", "seed_scan_backward"):
        assert not re.search(r"\b(atom|red)\.", ptx[name]), name


def _report(kind, precision="tf32"):
    K, SH2, D = (mamba2.DEFAULTS[k] for k in ("K", "SH2", "D"))
    kernel = mamba2._KERNELS[kind][0](K, SH2, D, precision)
    return _cute.ptxas_report(kernel, *mamba2._fake_args(kind))


@pytest.mark.parametrize("precision", mamba2.PRECISIONS)
def test_fused_forward_keeps_everything_in_registers_at_two_ctas_per_sm(precision):
    # the persistent grid is sized for ctas_per_sm() = 2 CTAs of 256 threads per SM: more
    # than 128 registers a thread would leave half of it waiting for a second wave
    kernel = mamba2.FusedForward(*(mamba2.DEFAULTS[k] for k in ("K", "SH2", "D")), precision)
    report = _report("fused_forward", precision)
    assert report["registers"] * 256 * kernel.ctas_per_sm() <= 65536, report
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report


def test_fused_backward_holds_its_partials_in_registers_without_spills():
    # one 256-thread CTA an SM, so up to 255 registers a thread: the CTA's weight gradients
    # (32 dW_A|dW_B, 32 dW_C and 4 dw accumulators a thread at the defaults) stay registers
    # for the whole launch, and nothing spills at the defaults in TF32. (fp32, FFMA products,
    # spills ~40 bytes: known, open)
    assert mamba2.FusedBackward(*(mamba2.DEFAULTS[k] for k in ("K", "SH2", "D")), "tf32").ctas_per_sm() == 1
    report = _report("fused_backward")
    assert report["registers"] <= 255, report
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report


def test_fused_backward_fits_one_cta_an_sm_over_the_supported_range():
    # every supported size launches (one CTA an SM); TF32 keeps the weights resident exactly
    # where they fit beside the tile (the defaults do, SH2 = 512 with D = 32 does not), and
    # the tile's h and dout too exactly where those still fit (the defaults; not K = 3,
    # SH2 = 256, D = 16, which keeps resident weights only)
    for K in (1, 3, 8, 16):
        for SH2 in (64, 256, 512):
            for D in mamba2.SUPPORTED_D:
                for precision in mamba2.PRECISIONS:
                    kernel = mamba2.FusedBackward(K, SH2, D, precision)
                    assert kernel.smem_bytes() <= _tiles.SMEM_PER_SM, (K, SH2, D, precision)
                    fits = kernel.smem_bytes(resident=True) <= _tiles.SMEM_PER_SM
                    assert kernel.resident == (precision == "tf32" and fits), (K, SH2, D, precision)
                    rows_fit = kernel.smem_bytes(resident=True, rows_resident=True) <= _tiles.SMEM_PER_SM
                    assert kernel.rows_resident == (kernel.resident and rows_fit), (K, SH2, D, precision)
    assert mamba2.FusedBackward(8, 256, 16, "tf32").rows_resident
    assert mamba2.FusedBackward(3, 256, 16, "tf32").resident
    assert not mamba2.FusedBackward(3, 256, 16, "tf32").rows_resident
    assert not mamba2.FusedBackward(8, 512, 32, "tf32").resident


def _checker(B, K, SH2, D):
    chk = Checker("test", gpu=False)
    # only shapes matter here: a zero-stride view stands in for a large h_hist
    h_hist = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (B, K, SH2), (0, 0, 0))
    chk.array("h_hist", h_hist, ("B", "K", "SH2"))
    chk.array("W_A", np.zeros((SH2, D), np.float32), ("SH2", "D"))
    return chk


@pytest.mark.parametrize("impl", mamba2.IMPLS)
def test_check_sizes_accepts_the_supported_range(impl):
    for B, K, SH2, D in [(1, 1, 64, 8), (7, 3, 512, 32), (8191, 16, 256, 16)]:
        mamba2.check_sizes(_checker(B, K, SH2, D), impl)


@pytest.mark.parametrize("impl", mamba2.IMPLS)
@pytest.mark.parametrize("sizes,match", [
    ((4, 17, 64, 8), "K=17"),
    ((4, 8, 96, 8), "SH2=96"),
    ((4, 8, 576, 8), "SH2=576"),
    ((4, 8, 32, 8), "SH2=32"),
    ((4, 8, 64, 12), "D=12"),
    ((4, 8, 64, 64), "D=64"),
    ((2**20, 16, 128, 8), "32-bit"),
])
def test_check_sizes_rejects_unsupported_sizes(impl, sizes, match):
    with pytest.raises(FoxcuteInputError, match=match):
        mamba2.check_sizes(_checker(*sizes), impl)


def test_fused_backward_signals_its_dependent_column_sum_once_its_reads_are_done(ptx):
    # column_sum of the partials is launched as this kernel's programmatic dependent: the
    # trigger comes after the tile loop (not at the start, where the dependent's waiting CTAs
    # would hold SMs the whole launch), once, before the partials are written
    for name in ("fused_backward_tf32", "fused_backward_fp32"):
        text = ptx[name]
        assert text.count("griddepcontrol.launch_dependents;") == 1, name
        assert "griddepcontrol.wait" not in text, name
        assert text.index("griddepcontrol.launch_dependents;") > text.rindex("cp.async.cg.shared.global"), name
