"""The exported layer passes: for each, the kernels it compiles at the export's sizes and the
C text the launch code (c/foxcute.c) needs: the public size macros of foxcute.h, and the
kernels' static configuration and adapters for the private foxcute_kernels.h.

Every number the C code uses is read here from the objects that configure the Python path
(ColumnSum(n), QDenoiseKernel, the modules' limits), so the two cannot drift apart silently;
the grid formulas themselves are restated in C (foxcute.c names the Python function each
mirrors) and the GPU test checks the results against the float64 references.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from .. import _arrays, reduction
from ..step import StepSizes


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One compiled kernel: exported under the symbol prefix fxk_<name>, called through the
    adapter fx_<name> (foxcute_kernels.h) whose C parameters are `params`."""

    name: str
    static: dict[str, Any]  # its static parameters, for the manifest
    build: Callable[[], tuple[Any, tuple]]  # (jit object, compile arguments)
    params: Sequence[tuple[str, str]]  # (C type, name) after the DSL wrapper's module argument


@dataclasses.dataclass(frozen=True)
class ExportedPass:
    name: str  # the C function: foxcute_<name>
    kernels: list[Kernel]
    public: str  # size macros for foxcute.h
    private: str  # constants and tables for foxcute_kernels.h (after the adapters)


def _ptrs(*names: str) -> list[tuple[str, str]]:
    return [("void *", n) for n in names]


def _ints(*names: str) -> list[tuple[str, str]]:
    return [("int32_t ", n) for n in names]


STREAM = [("cudaStream_t ", "stream")]


def _check(module: Any, where: str, arrays: dict[str, tuple[tuple[int, ...], tuple[str, ...]]]) -> None:
    """The kernel module's own size check (check_sizes, FoxcuteInputError where it refuses),
    on empty stand-in arrays of one row that bind the compiled sizes."""
    chk = _arrays.Checker(where, gpu=False)
    for name, (shape, dims) in arrays.items():
        chk.array(name, np.empty(shape, np.float32), dims)
    module.check_sizes(chk)


COLUMN_SUM_PARAMS = _ptrs("G", "out", "work", "tickets") + [("int32_t ", "m"), ("int32_t ", "num_ctas")] + STREAM


def _column_sum(name: str, n: int, dependent: bool = False) -> tuple[Kernel, str]:
    """ColumnSum(n) exported as fx_<name>, and its fx_column_sum_t initializer (the static
    configuration column_sum.grid_size and the workspace need; max_m: column_sum's one-launch
    row block, 32-bit indexing)."""
    from ..kernels import column_sum as cs

    k = cs._config(n, dependent)
    static = {"N": n, **({"dependent": True} if dependent else {})}
    kernel = Kernel(name, static, lambda: (cs._config(n, dependent), cs.compile_args()), COLUMN_SUM_PARAMS)
    max_m = cs.MAX_ELEMENTS // n // 4 * 4
    return kernel, f"{{{n}, {k.pack}, {k.width}, {k.slices}, {k.rows}, {k.unroll}, {max_m}, fx_{name}}}"


def column_sum(sizes: StepSizes, precision: str) -> ExportedPass:
    """The bias-gradient sums of the step: N = A (the IQN head) and N = H_iqn (its hidden
    layer); one ColumnSum kernel a width, M free."""
    from ..kernels import column_sum as cs

    widths = sorted({sizes.A, sizes.H_iqn})
    for n in widths:
        if not 1 <= n <= reduction.MAX_N:
            raise _arrays.FoxcuteInputError(f"foxcute export: column_sum N={n} is outside 1..{reduction.MAX_N}")
    kernels, rows = zip(*(_column_sum(f"column_sum_n{n}", n) for n in widths))
    public = f"#define FOXCUTE_COLUMN_SUM_WIDTHS {{{', '.join(map(str, widths))}}}"
    private = "\n".join([f"#define FX_CTAS_PER_SM {cs.CTAS_PER_SM}",
                         "static const fx_column_sum_t FX_COLUMN_SUMS[] = {",
                         *(f"    {row}," for row in rows), "};"])
    return ExportedPass("column_sum", list(kernels), public, private)


def q_denoise(sizes: StepSizes, precision: str) -> ExportedPass:
    """Loss and gradients in one launch: the kernel with the one-level finish (grids of at
    most one CTA an SM) and with the two-level one; A = A_q, H = H_q, B free."""
    from ..kernels import q_denoise as qd

    A, H = sizes.A_q, sizes.H_q
    _check(qd, "foxcute export: q_denoise", {"q": ((1, A), ("B", "A")), "W1": ((H, A), ("H", "A"))})
    max_b = min(qd.MAX_ELEMENTS // A, qd.SAMPLES * (qd.MAX_ELEMENTS // qd.padded_entries(A, H) - qd.MAX_GROUPS))
    params = (_ptrs("q", "q_target", "W1", "b1", "W2", "b2", "dq", "grads", "work", "tickets")
              + [("int32_t ", n) for n in ("batch", "num_ctas", "group_size", "num_groups")]
              + [("float ", "inv_count")] + STREAM)
    kernels = [Kernel(f"q_denoise_{finish}", {"A": A, "H": H, "spread": spread},
                      lambda spread=spread: qd._kernel_and_args(A, H, spread), params)
               for finish, spread in (("spread", True), ("two_level", False))]
    offsets = {"DW1": 0, "DB1": H * A, "DW2": H * A + H, "DB2": 2 * H * A + H, "LOSS": 2 * H * A + H + A}
    public = "\n".join([f"#define FOXCUTE_Q_DENOISE_A {A}", f"#define FOXCUTE_Q_DENOISE_H {H}",
                        f"#define FOXCUTE_Q_DENOISE_MAX_B {max_b}",
                        f"#define FOXCUTE_Q_DENOISE_GRADS {qd.num_entries(A, H)}",
                        *(f"#define FOXCUTE_Q_DENOISE_{k} {v}" for k, v in offsets.items())])
    private = "\n".join([f"#define FX_Q_SAMPLES {qd.SAMPLES}", f"#define FX_Q_MAX_GROUPS {qd.MAX_GROUPS}",
                         f"#define FX_Q_PADDED {qd.padded_entries(A, H)}"])
    return ExportedPass("q_denoise_loss_and_grads", kernels, public, private)


def risk_budget(sizes: StepSizes, precision: str) -> ExportedPass:
    """The forward, one kernel of the export's precision; SH2, I = I_risk, H = H_risk, B free."""
    from ..kernels import risk_budget as rb

    SH2, I, H = sizes.SH2, sizes.I_risk, sizes.H_risk
    _check(rb, "foxcute export: risk_budget",
           {"h": ((1, SH2), ("B", "SH2")), "isv": ((I,), ("I",)), "W1": ((H, 1), ("H", "one"))})
    kernel = Kernel("risk_budget", {"SH2": SH2, "I": I, "H": H, "precision": precision},
                    lambda: rb._kernel_and_args(SH2, I, H, precision),
                    _ptrs("h", "isv", "e", "W1", "b1", "w2", "risk") + [("int32_t ", "batch"), ("float ", "b2")]
                    + STREAM)
    public = "\n".join([f"#define FOXCUTE_RISK_BUDGET_SH2 {SH2}", f"#define FOXCUTE_RISK_BUDGET_I {I}",
                        f"#define FOXCUTE_RISK_BUDGET_H {H}",
                        f"#define FOXCUTE_RISK_BUDGET_MAX_B {rb.MAX_ELEMENTS // SH2}"])
    return ExportedPass("risk_budget_forward", [kernel], public, "")


def _kan_sizes(sizes: StepSizes) -> tuple[int, int, int]:
    from ..kernels import kan

    I, O, G = sizes.I_kan, sizes.O_kan, sizes.G_kan
    _check(kan, "foxcute export: kan", {"x": ((1, I), ("B", "I")), "C": ((O, I * G), ("O", "I*G"))})
    return I, O, G


def kan_forward(sizes: StepSizes, precision: str) -> ExportedPass:
    """One kernel of the export's precision at (I_kan, O_kan, G_kan), B free."""
    from ..kernels import kan

    I, O, G = _kan_sizes(sizes)
    t = kan._tf32_backward(I, O, G)  # check_sizes bounds B by both kernels' indexing
    max_b = min(kan.MAX_ELEMENTS // max(I, O),
                t.rows * (kan.MAX_ELEMENTS // (t.blocks * t.row_len) - (kan.MAX_TICKETS // t.blocks - 1)))
    kernel = Kernel("kan_forward", {"I": I, "O": O, "G": G, "precision": precision},
                    lambda: kan._kernel_and_args("forward", I, O, G, precision),
                    _ptrs("x", "C", "Wb", "y") + [("int32_t ", "batch")] + STREAM)
    public = "\n".join([f"#define FOXCUTE_KAN_I {I}", f"#define FOXCUTE_KAN_O {O}", f"#define FOXCUTE_KAN_G {G}",
                        f"#define FOXCUTE_KAN_MAX_B {max_b}"])
    return ExportedPass("kan_forward", [kernel], public, "")


def kan_backward(sizes: StepSizes, precision: str) -> ExportedPass:
    """tf32: KanBackwardTf32 with the one-level finish (chunks x blocks <= SMs, cooperative)
    and with the two-level one; fp32: KanBackwardFp32, then KanGradReduce of its per-CTA
    partial rows. dC and dWb land in one array (kan.output_layout)."""
    from ..kernels import kan

    I, O, G = _kan_sizes(sizes)
    dwb_at, sums_len = kan.output_layout(O, I, G)
    public = "\n".join([f"#define FOXCUTE_KAN_GRADS {sums_len}", "#define FOXCUTE_KAN_DC 0",
                        f"#define FOXCUTE_KAN_DWB {dwb_at}"])
    static = {"I": I, "O": O, "G": G}
    if precision == "tf32":
        t = kan._tf32_backward(I, O, G)
        params = (_ptrs("dy", "x", "C", "Wb", "dx", "grads", "work", "tickets")
                  + [("int32_t ", n) for n in ("batch", "num_chunks", "group_size", "num_groups")] + STREAM)
        kernels = [Kernel(f"kan_backward_{finish}", {**static, "precision": precision, "spread": spread},
                          lambda spread=spread: kan._kernel_and_args("backward", I, O, G, "tf32", spread), params)
                   for finish, spread in (("spread", True), ("two_level", False))]
        private = "\n".join(["#define FX_KAN_TF32 1", f"#define FX_KAN_BLOCKS {t.blocks}",
                             f"#define FX_KAN_ROWS {t.rows}", f"#define FX_KAN_ROW_LEN {t.row_len}",
                             f"#define FX_KAN_MAX_TICKETS {kan.MAX_TICKETS}"])
        return ExportedPass("kan_backward", kernels, public, private)
    layout = kan.GradLayout(O, I, G)
    kernels = [Kernel("kan_backward_fp32", {**static, "precision": precision},
                      lambda: kan._kernel_and_args("backward", I, O, G, "fp32"),
                      _ptrs("dy", "x", "C", "Wb", "dx", "partials") + [("int32_t ", "batch")] + STREAM),
               Kernel("kan_grad_reduce", {**static, "precision": precision},
                      lambda: (kan.KanGradReduce(layout), kan._reduce_args()),
                      _ptrs("partials", "grads") + [("int32_t ", "rows")] + STREAM)]
    private = "\n".join(["#define FX_KAN_TF32 0", f"#define FX_KAN_ROWS {kan.ROWS}",
                         f"#define FX_KAN_PARTIAL_LEN {layout.partial_len}"])
    return ExportedPass("kan_backward", kernels, public, private)


def _split(compile_args: tuple) -> tuple[Any, tuple]:
    """(kernel object, its arguments) of a module's `*_compile_args` tuple (object first)."""
    return compile_args[0], compile_args[1:]


def _curiosity_weight_grads(F: int, H: int, precision: str, static: dict) -> tuple[Kernel, list[str]]:
    """dW2 = dpred^T hid and dW1[:, :F] = dz^T s in one launch, and the constants of its grid
    and workspace: tf32 KMajorWeightGrad (gemm.kmajor_weight_grads_into), fp32 WeightGrad
    (gemm.weight_grads_into)."""
    from ..kernels import gemm

    if precision == "tf32":
        kinds = ("kmajor", "rows")
        kernel = Kernel("curiosity_weight_grads", static,
                        lambda: _split(gemm.kmajor_weight_grad_compile_args(gemm.KMAJOR_TILE_N, kinds)),
                        [*_ptrs("a0", "b0", "dw0"), *_ints("m0", "n0", "ldo0"), *_ptrs("a1", "b1", "dw1"),
                         *_ints("m1", "n1", "ldo1"), *_ptrs("work", "tickets"),
                         *_ints("batch", "kp_vecs", "kb_per_split", "splits"), *STREAM])
        # two F x H tile grids (M = F, N = H): dW2 [F, H], and dW1[:, :F] = (dz^T s) written transposed
        tiles = 2 * -(-F // gemm.KMajorWeightGrad.BM) * -(-H // gemm.KMAJOR_TILE_N)
        return kernel, ["#define FX_CU_TF32 1", f"#define FX_CU_TILES {tiles}",
                        f"#define FX_CU_KB {gemm.KMajorWeightGrad.KB}",
                        f"#define FX_CU_TILE_FLOATS {gemm.KMajorWeightGrad.BM * gemm.KMAJOR_TILE_N}"]
    bk = gemm.WeightGrad.tile_k(max(F, H))
    config = ((gemm._vec(F), gemm._vec(H), False, False), (gemm._vec(H), gemm._vec(F), False, False))
    kernel = Kernel("curiosity_weight_grads", static, lambda: _split(gemm.weight_grad_compile_args(precision, config, bk)),
                    [*_ptrs("dy0", "x0", "dw0", "db0"), *_ints("n0", "k0", "ldo0"), *_ptrs("dy1", "x1", "dw1", "db1"),
                     *_ints("n1", "k1", "ldo1"), *_ptrs("work", "tickets"), *_ints("m", "rows_per_cta", "num_ctas"),
                     *STREAM])
    tiles = [(-(-n // gemm.WeightGrad.bn), -(-k // bk)) for n, k in ((F, H), (H, F))]
    # work floats a weight-gradient CTA: the sum over problems of nt * (kt * bk + 1) * bn
    work = sum(nt * (kt * bk + 1) * gemm.WeightGrad.bn for nt, kt in tiles)
    return kernel, ["#define FX_CU_TF32 0", f"#define FX_CU_TILES {sum(a * b for a, b in tiles)}",
                    f"#define FX_CU_CHUNK {gemm.CHUNK}", f"#define FX_CU_VEC_F {gemm._vec(F)}",
                    f"#define FX_CU_VEC_H {gemm._vec(H)}", f"#define FX_CU_WORK_PER_CTA {work}"]


def curiosity(sizes: StepSizes, precision: str) -> ExportedPass:
    """Forward and backward, as curiosity.forward_backward launches them: WeightPrep, the row
    pass (actions int32), then the weight gradients beside, on the library's side lane (one
    stream a device, c/foxcute.c), the column sums of the row pass's partials (ColumnSum(width),
    one launch while width <= COLSUM_WIDTH) and a 2-D copy of dW1's action columns out of
    those sums. F = SH2, H = H_c, A = A."""
    from cutlass import Int32

    from ..kernels import curiosity as cu

    F, H, A = sizes.F, sizes.H_c, sizes.A
    _check(cu, "foxcute export: curiosity", {"s": ((1, F), ("B", "F")), "W1": ((H, F + A), ("H", "F+A"))})
    width, bm = cu.partials_width(F, H, A), cu.row_block(F, H)
    if width > cu.COLSUM_WIDTH:
        raise _arrays.FoxcuteInputError(f"foxcute export: curiosity's {width} partial columns need several "
                                         f"column sums (over {cu.COLSUM_WIDTH}): not exported")
    static = {"F": F, "H": H, "A": A, "precision": precision}
    sums, sums_row = _column_sum(f"curiosity_sums_n{width}", width)
    grads, grads_defines = _curiosity_weight_grads(F, H, precision, static)
    kernels = [Kernel("curiosity_weight_prep", static, lambda: _split(cu.weight_prep_compile_args(F, H, A, precision)),
                      _ptrs("W1", "W2", "prep") + STREAM),
               Kernel("curiosity_row_pass", static, lambda: _split(cu.row_pass_compile_args(F, H, A, precision, Int32)),
                      _ptrs("s", "a", "s_next", "W1", "prep", "b1", "b2", "r", "ds", "hid", "dpred", "dz", "partials")
                      + [("int32_t ", "batch"), ("int32_t ", "num_ctas"), ("float ", "inv_fb")] + STREAM),
               sums, grads]
    prep = cu.norms_offset(F, H) + H if precision == "tf32" else cu.prep_arrays(precision) * H * F
    private = [f"#define FX_CU_BM {bm}", f"#define FX_CU_PREP_FLOATS {prep}",
               f"static const fx_column_sum_t FX_CU_SUMS = {sums_row};", *grads_defines]
    max_b = (2**31 - 1) // max(F, H) // bm * bm  # check_sizes: B rounded up to bm, times max(F, H), < 2^31
    public = "\n".join([f"#define FOXCUTE_CURIOSITY_F {F}", f"#define FOXCUTE_CURIOSITY_H {H}",
                        f"#define FOXCUTE_CURIOSITY_A {A}", f"#define FOXCUTE_CURIOSITY_MAX_B {max_b}",
                        f"#define FOXCUTE_CURIOSITY_SUMS {width}", "#define FOXCUTE_CURIOSITY_DB2 0",
                        f"#define FOXCUTE_CURIOSITY_DB1 {F}", f"#define FOXCUTE_CURIOSITY_DW1A {F + H}",
                        f"#define FOXCUTE_CURIOSITY_LOSS {width - 1}"])
    return ExportedPass("curiosity_forward_backward", kernels, public, "\n".join(private))


def _mamba2_sizes(sizes: StepSizes) -> tuple[int, int, int]:
    from ..kernels import mamba2 as mk

    K, SH2, D = sizes.K, sizes.SH2, sizes.D
    chk = _arrays.Checker("foxcute export: mamba2", gpu=False)
    chk.array("h_hist", np.empty((1, K, SH2), np.float32), ("B", "K", "SH2"))
    chk.array("W_A", np.empty((SH2, D), np.float32), ("SH2", "D"))
    mk.check_sizes(chk, "fused")
    return K, SH2, D


def _mamba2_public(K: int, SH2: int, D: int) -> str:
    return "\n".join([f"#define FOXCUTE_MAMBA2_K {K}", f"#define FOXCUTE_MAMBA2_SH2 {SH2}",
                      f"#define FOXCUTE_MAMBA2_D {D}", f"#define FOXCUTE_MAMBA2_MAX_B {(2**31 - 1) // (K * SH2)}"])


def mamba2_forward(sizes: StepSizes, precision: str) -> ExportedPass:
    """The fused design's one persistent kernel (FusedForward) at (K, SH2, D), B free."""
    from ..kernels import mamba2 as mk

    K, SH2, D = _mamba2_sizes(sizes)
    kernel = mk._KERNELS["fused_forward"][0](K, SH2, D, precision)
    exported = Kernel("mamba2_forward", {"K": K, "SH2": SH2, "D": D, "precision": precision, "impl": "fused"},
                      lambda: (mk._KERNELS["fused_forward"][0](K, SH2, D, precision), mk._fake_args("fused_forward")),
                      _ptrs("h_hist", "h", "W_A", "W_B", "W_C", "w", "out")
                      + [("float ", "sigma"), ("int32_t ", "batch"), ("int32_t ", "num_ctas")] + STREAM)
    private = "\n".join([f"#define FX_M2F_SAMPLES {kernel.samples}", f"#define FX_M2F_CTAS_PER_SM {kernel.ctas_per_sm()}"])
    return ExportedPass("mamba2_forward", [exported], _mamba2_public(K, SH2, D), private)


def mamba2_backward(sizes: StepSizes, precision: str) -> ExportedPass:
    """The fused design: FusedBackward (per-CTA weight-gradient partials, dh_hist, dh), then
    ColumnSum(width) over the partials, launched as its programmatic dependent (PDL)."""
    from ..kernels import mamba2 as mk

    K, SH2, D = _mamba2_sizes(sizes)
    kernel = mk._KERNELS["fused_backward"][0](K, SH2, D, precision)
    width, n = kernel.width, SH2 * D
    static = {"K": K, "SH2": SH2, "D": D, "precision": precision, "impl": "fused"}
    sums, sums_row = _column_sum(f"mamba2_sums_n{width}", width, dependent=True)
    kernels = [Kernel("mamba2_backward", static,
                      lambda: (mk._KERNELS["fused_backward"][0](K, SH2, D, precision), mk._fake_args("fused_backward")),
                      _ptrs("dout", "h_hist", "h", "W_A", "W_B", "W_C", "w", "partials", "dh_hist", "dh")
                      + [("float ", "sigma"), ("int32_t ", "batch"), ("int32_t ", "num_ctas")] + STREAM), sums]
    public = "\n".join([f"#define FOXCUTE_MAMBA2_GRADS {width}", "#define FOXCUTE_MAMBA2_DW_A 0",
                        f"#define FOXCUTE_MAMBA2_DW_B {n}", f"#define FOXCUTE_MAMBA2_DW_C {2 * n}",
                        f"#define FOXCUTE_MAMBA2_DW {3 * n}", f"#define FOXCUTE_MAMBA2_DSIGMA {kernel.L - 1}"])
    private = "\n".join([f"#define FX_M2B_SAMPLES {kernel.samples}", f"#define FX_M2B_CTAS_PER_SM {kernel.ctas_per_sm()}",
                         f"static const fx_column_sum_t FX_M2B_SUMS = {sums_row};"])
    return ExportedPass("mamba2_backward", kernels, public, private)


PASSES = (column_sum, q_denoise, risk_budget, kan_forward, kan_backward, curiosity, mamba2_forward,
          mamba2_backward)  # the order of foxcute.h's sizes and of the manifest


def adapter(kernel: Kernel) -> str:
    """fx_<name>: the DSL's static inline wrapper with its module argument dropped (the
    wrapper does not read it: the module's kernel handle is a global of its object)."""
    params = ", ".join(f"{t}{n}" for t, n in kernel.params)
    names = ", ".join(n for _, n in kernel.params)
    return (f"static int32_t fx_{kernel.name}({params}) {{\n"
            f"    return cute_dsl_fxk_{kernel.name}_wrapper(NULL, {names});\n}}")
