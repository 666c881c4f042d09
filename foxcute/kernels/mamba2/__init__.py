"""Mamba2 temporal layer on the GPU (docs/layers.md section 1): forward and full backward.

Two implementations, picked by `impl`:

"fused"  One kernel per direction (fused_forward.FusedForward, fused_backward.FusedBackward),
         each reading h_hist from global memory exactly once.
         A CTA owns a tile of TILE_ROWS = 64 consecutive rows of h_hist viewed as [B*K, SH2],
         i.e. Bt = 64 // K whole samples, so the K-step window of every sample it scans lies
         in that CTA. Both kernels are persistent (tiles cta, cta + grid, ...).
         Forward: walks SH2 in CHUNK = 64 column steps; 128-bit loads of the next chunk go
         to registers while the tensor cores multiply the current one (during a tile's last
         chunk, the next tile's first: in flight through the scan) (a|u = h_hist @
         [W_A|W_B]: TF32 as one warpgroup's wgmma, M = TILE_ROWS, N = 2D, both operands
         read by the tensor cores straight from 128B-swizzled shared memory); W_A|W_B and
         W_C sit in shared memory for the CTA's life where two CTAs per SM still fit (the
         defaults). c = h @ W_C is FFMA, 4 states of a sample per
         thread (_StateProduct), put in shared memory for the scan: one thread per (sample,
         state) pair runs that pair's scan from the a|u tile in shared memory; ctx is a
         shuffle over the sample's D lanes; out = h + ctx * w.
         Backward: cp.async brings the whole 64 x SH2 h_hist tile into shared memory (no
         registers held, 64 KB in flight per CTA at the defaults; TF32: 16-byte copies
         straight into the 128B-swizzled K-major layout that wgmma reads), each 64-column
         chunk of the next tile issued during phase 3 as soon as that chunk is free; a|u
         (TF32: wgmma as in the forward), c and dctx = dout @ w as in the forward; the
         forward scan is recomputed in registers and
         the reverse scan writes da|du over a|u; then, per SH2 chunk, dh_hist = [da|du] @
         [W_A|W_B]^T and [dW_A|dW_B] += h_hist^T @ [da|du] (tensor cores, h_hist still in
         shared memory), dh = dout + dc @ W_C^T and dW_C += h^T dc (TF32: mma.sync, one
         CTA half each; fp32: FFMA, 4 outputs a thread) and dw += ctx^T dout. Each CTA
         (one an SM) accumulates its tiles' weight gradients in registers, in tile order,
         and writes them once, to its own row of a partials array; `column_sum` then
         sums the rows in a fixed order, in one launch. No float atomics: bit-identical runs.
         TF32, where they fit beside the tile (the defaults; FusedBackward.resident): W_A|W_B
         and W_C staged in shared memory once a CTA, in every layout the products read,
         instead of once a chunk and phase.
"seed"   The trainer's plan, kernel by kernel (seed.py; launched by _seed_forward and
         _seed_backward here): foxcute.kernels.gemm GEMMs for a|u and c, a batch-parallel
         scan (one thread per (sample, state)) giving ctx, a readout kernel; backward: a
         reverse-scan kernel giving [da|du], dc, ctx and dsigma partials, then GEMMs for
         [dW_A|dW_B] = h_hist^T [da|du], dW_C = h^T dc, dw = dout^T ctx (split over the
         batch, partials summed by `column_sum`), dh_hist = [da|du] [W_A|W_B]^T and
         dh = dout + dc W_C^T. Independent launches run in two lanes (a second stream, a
         parallel branch in a CUDA graph): c beside the projection; the input gradients
         (dh, dh_hist) beside the batch reductions (dW_C and dw, dsigma, dW_A|dW_B).

Matrix products run on TF32 tensor cores for precision="tf32": a|u (forward and backward) on
Hopper's warpgroup MMA (wgmma, foxcute.kernels._wgmma: no fragment loads, the operands'
descriptors point into shared memory), every other product on warp-level mma.sync m16n8k8 (fragments
loaded from shared memory, B 64 bits at a time, see _mma_smem); operands rounded to nearest
TF32 once when staged into shared memory (_tf32.tf32_operand: half an ulp added, the tensor
cores' truncation completes it; through registers, or in place where the backward's cp.async
h and dout have landed), except the backward's h_hist tile, which its a|u and dW products
read as cp.async wrote it (truncated: see FusedBackward). precision="fp32" runs every product as exact
float32 FFMA through the same CuTe tiled-MMA partitioning as mma.sync, so that tile code is
shared. The scans, c, dctx and every reduction are float32 FFMA in both modes.

Registers (ptxas 13.0 for sm_90a, on the CPU): at the defaults nothing spills except the fp32
backward (~40 bytes, per-tile bookkeeping outside the chunk loops). The backward's weight
gradients, held in registers for the whole launch (255 a thread at one CTA an SM), spill
~0.4-1.3 KB at SH2 = 512, D = 32; over the supported range the most spills are at K = 1,
D = 32, where a thread carries 8 (sample, state) pairs through the scans. Those sizes are
tested for correctness (GPU tests), not tuned.

Files: _tiles.py holds the CTA geometry (THREADS, TILE_ROWS, CHUNK, the shared memory of an
SM) and the tile machinery both fused kernels trace (tiled MMAs, shared-memory layouts,
_mma_smem, the c product, row copies); _sigmoid.py the scans' gate; this module the sizes
taken (check_sizes) and the host side: compiling (one executor per kind, sizes and
precision) and launching.

Measured (H200, graph-replayed at the defaults B = 8192, K = 8, SH2 = 256, D = 16, TF32; run
20261203T162501Z: papermill_runs/20261203T162501Z_nvidia-h200_726b8c4c/summary.md): forward
fused 29.3 us (1.46x its floor), seed 40.1 (2x); backward fused 81.7 us (2.04x), seed 116
(2.89x).
History: docs/notes/mamba2-forward.md, docs/notes/mamba2-backward.md, docs/notes/mamba2-seed.md.
"""

from __future__ import annotations

from typing import Any

from cutlass import Float32, Int32

from ..._arrays import Checker, FoxcuteInputError, array_kind, empty, side_lane, sm_count
from ..._layer import KernelContract
from .. import _cute
from .._cute import CompiledCache, compile_kernel, fake_ptr, fake_stream, gmem_ptr
from ._tiles import CHUNK, THREADS
from .fused_backward import FusedBackward, _num_weights
from .fused_forward import FusedForward
from .seed import SeedReadout, SeedScanBackward, SeedScanForward

# The DSL names a kernel's symbol after str(self), its class's module and name
# (kernel_cutlass_kernel_foxcutekernelsmamba2FusedBackward_...), which is what profiles, ncu's
# --kernel-name and the step breakdown (foxcute.lab.breakdown.short_kernel_name: mamba2.FusedBackward)
# read. The kernel classes take this package, the path they are used by, as their module, so
# those names do not depend on which file of the package defines them.
for _kernel in (FusedForward, FusedBackward, SeedScanForward, SeedReadout, SeedScanBackward):
    _kernel.__module__ = __name__

IMPLS = ("fused", "seed")
PRECISIONS = ("tf32", "fp32")

SUPPORTED_D = (8, 16, 32)
MAX_K = 16
MAX_SH2 = 512
DEFAULTS = dict(B=8192, K=8, SH2=256, D=16)
CONTRACT = KernelContract(passes=("forward", "backward"), options={"impl": IMPLS, "precision": PRECISIONS},
                          sized_by=("impl",))


def check_sizes(chk: Checker, impl: str) -> None:
    """Reject sizes the kernels do not support, before anything is launched. Supported, for
    both impls: D in {8, 16, 32}; SH2 a multiple of 64 from 64 to 512; K from 1 to 16; any
    B >= 1 with B*K*SH2 < 2**31."""
    chk.dim_range("K", 1, MAX_K, "a CTA tile holds whole K windows of at least 4 samples")
    chk.dim_range("SH2", CHUNK, MAX_SH2, "the backward keeps a 64 x SH2 h_hist tile in shared memory")
    chk.dim_multiple("SH2", CHUNK, "the kernels step through SH2 in 64-column chunks")
    D = chk.dims["D"]
    if D not in SUPPORTED_D:
        raise FoxcuteInputError(f"{chk.where}: D={D} is not supported; the kernels take D in "
                                f"{SUPPORTED_D} (one state per lane in groups of D lanes)")
    elements = chk.dims["B"] * chk.dims["K"] * chk.dims["SH2"]
    if elements >= 2**31:
        raise FoxcuteInputError(f"{chk.where}: h_hist has {elements} elements; the kernels index "
                                f"with 32-bit integers (B*K*SH2 < 2**31)")


_COMPILED = CompiledCache(__name__)

# kind -> (kernel from (K, SH2, D, precision), pointer arguments, has sigma, int arguments)
_KERNELS = {
    "fused_forward": (lambda K, SH2, D, p: FusedForward(K, SH2, D, p), 7, True, 2),
    "fused_backward": (lambda K, SH2, D, p: FusedBackward(K, SH2, D, p), 10, True, 2),
    "seed_scan_forward": (lambda K, SH2, D, p: SeedScanForward(K, D), 3, True, 1),
    "seed_readout": (lambda K, SH2, D, p: SeedReadout(SH2), 4, False, 1),
    "seed_scan_backward": (lambda K, SH2, D, p: SeedScanBackward(K, SH2, D), 8, True, 1),
}
_PRECISION_FREE = ("seed_scan_forward", "seed_readout", "seed_scan_backward")  # no matrix products


def _fake_args(kind: str) -> tuple:
    _, n_ptrs, has_sigma, n_ints = _KERNELS[kind]
    sigma = (Float32(1.0),) if has_sigma else ()
    return (*(fake_ptr() for _ in range(n_ptrs)), *sigma, *(Int32(1) for _ in range(n_ints)),
            fake_stream())


def _compiled(kind: str, K: int, SH2: int, D: int, precision: str, keep: bool = False) -> Any:
    if kind in _PRECISION_FREE:
        precision = "fp32"

    def build() -> Any:
        return compile_kernel(_KERNELS[kind][0](K, SH2, D, precision), *_fake_args(kind), keep=keep)

    return _COMPILED.get((kind, K, SH2, D, precision, keep), build)


def compiled_for_ci() -> dict[str, Any]:
    """Every kernel of this module at the default sizes, compiled with PTX kept (the seed's
    GEMMs are foxcute.kernels.gemm's, checked by its own compile test)."""
    K, SH2, D = DEFAULTS["K"], DEFAULTS["SH2"], DEFAULTS["D"]
    out = {}
    for kind in _KERNELS:
        for precision in (("fp32",) if kind in _PRECISION_FREE else PRECISIONS):
            name = kind if kind in _PRECISION_FREE else f"{kind}_{precision}"
            out[name] = _compiled(kind, K, SH2, D, precision, keep=True)
    return out


def _sizes(where: str, h_hist: Any, W_A: Any, impl: str) -> tuple[int, int, int, int]:
    """(B, K, SH2, D), after check_sizes: callers that skip foxcute.mamba2 (benchmarks)
    get an error instead of an out-of-bounds launch."""
    chk = Checker(where, gpu=True)
    chk.array("h_hist", h_hist, ("B", "K", "SH2"))
    chk.array("W_A", W_A, ("SH2", "D"))
    check_sizes(chk, impl)
    return chk.dims["B"], chk.dims["K"], chk.dims["SH2"], chk.dims["D"]


def _persistent_ctas(x: Any, num_tiles: int, ctas_per_sm: int) -> int:
    return max(1, min(num_tiles, sm_count(x) * ctas_per_sm))


def forward(h_hist: Any, h: Any, W_A: Any, W_B: Any, W_C: Any, w: Any, sigma: float, *,
            impl: str, precision: str) -> Any:
    """out [B, SH2] of the Mamba2 layer; arrays already validated by foxcute.mamba2."""
    B, K, SH2, D = _sizes("foxcute.kernels.mamba2.forward", h_hist, W_A, impl)
    out = empty(h, (B, SH2))
    if impl == "fused":
        kernel = _KERNELS["fused_forward"][0](K, SH2, D, precision)
        num_ctas = _persistent_ctas(h, -(-B // kernel.samples), kernel.ctas_per_sm())
        fn = _compiled("fused_forward", K, SH2, D, precision)
        fn(gmem_ptr(h_hist), gmem_ptr(h), gmem_ptr(W_A), gmem_ptr(W_B), gmem_ptr(W_C), gmem_ptr(w),
           gmem_ptr(out), Float32(sigma), Int32(B), Int32(num_ctas), _cute.current_stream(h))
        return out
    return _seed_forward(h_hist, h, W_A, W_B, W_C, w, sigma, out, precision)


def backward(dout: Any, h_hist: Any, h: Any, W_A: Any, W_B: Any, W_C: Any, w: Any, sigma: float, *,
             impl: str, precision: str) -> tuple:
    """(dW_A, dW_B, dW_C, dw, dsigma[1], dh_hist, dh); arrays already validated."""
    B, K, SH2, D = _sizes("foxcute.kernels.mamba2.backward", h_hist, W_A, impl)
    if impl == "fused":
        dh_hist = empty(h, (B, K, SH2))
        dh = empty(h, (B, SH2))
        from ..column_sum import column_sum

        L = _num_weights(SH2, D)
        kernel = _KERNELS["fused_backward"][0](K, SH2, D, precision)
        num_tiles = -(-B // kernel.samples)
        num_ctas = _persistent_ctas(h, num_tiles, kernel.ctas_per_sm())
        partials = empty(h, (num_ctas, kernel.width))
        fn = _compiled("fused_backward", K, SH2, D, precision)
        fn(gmem_ptr(dout), gmem_ptr(h_hist), gmem_ptr(h), gmem_ptr(W_A), gmem_ptr(W_B), gmem_ptr(W_C),
           gmem_ptr(w), gmem_ptr(partials), gmem_ptr(dh_hist), gmem_ptr(dh), Float32(sigma), Int32(B),
           Int32(num_ctas), _cute.current_stream(h))
        # fixed order over CTAs, every column block in one launch, launched as the kernel's
        # programmatic dependent (see column_sum.ColumnSum)
        grads = column_sum(partials, dependent=True)
        n = SH2 * D
        return (grads[0:n].reshape(SH2, D), grads[n:2 * n].reshape(SH2, D),
                grads[2 * n:3 * n].reshape(SH2, D), grads[3 * n:3 * n + SH2], grads[L - 1:L], dh_hist, dh)
    return _seed_backward(dout, h_hist, h, W_A, W_B, W_C, w, sigma, precision)


def _concat_columns(a: Any, b: Any) -> Any:
    """[a | b] in a's array library."""
    if array_kind(a) == "torch":
        import torch

        return torch.cat((a, b), dim=1)
    import cupy

    return cupy.concatenate((a, b), axis=1)


def _seed_forward(h_hist: Any, h: Any, W_A: Any, W_B: Any, W_C: Any, w: Any, sigma: float,
                  out: Any, precision: str) -> Any:
    """GEMM a|u = h_hist @ [W_A|W_B], GEMM c = h @ W_C (on a side lane, beside it), scan + ctx,
    readout."""
    B, K, SH2 = (int(n) for n in h_hist.shape)
    D = int(W_A.shape[1])
    _, au, c = _seed_projections(h_hist.reshape(B * K, SH2), h, W_A, W_B, W_C, precision)
    ctx = empty(h, (B,))
    stream = _cute.current_stream(h)
    _compiled("seed_scan_forward", K, SH2, D, precision)(
        gmem_ptr(au), gmem_ptr(c), gmem_ptr(ctx), Float32(sigma), Int32(B), stream)
    _compiled("seed_readout", K, SH2, D, precision)(
        gmem_ptr(h), gmem_ptr(ctx), gmem_ptr(w), gmem_ptr(out), Int32(B), stream)
    return out


def _seed_projections(hist: Any, h: Any, W_A: Any, W_B: Any, W_C: Any, precision: str) -> tuple:
    """(W_AB = [W_A|W_B], a|u = hist @ W_AB, c = h @ W_C). c (M = B) runs on a side lane beside
    the concatenation and the projection (M = B*K): alone it is a short, latency-bound launch."""
    from .. import gemm

    def projection() -> tuple:
        W_AB = _concat_columns(W_A, W_B)  # [SH2, 2D]
        return W_AB, gemm.matmul(hist, B=W_AB, precision=precision)

    c, (W_AB, au) = side_lane(h).run(lambda: gemm.matmul(h, B=W_C, precision=precision), projection)
    return W_AB, au, c


def _seed_backward(dout: Any, h_hist: Any, h: Any, W_A: Any, W_B: Any, W_C: Any, w: Any, sigma: float,
                   precision: str) -> tuple:
    """The forward's GEMMs again, the reverse-scan kernel, then GEMMs for every gradient in two
    lanes side by side: the batch reductions (dW_C with dw, dsigma's column sum, then
    dW_A|dW_B) on the current stream, the input gradients (dh, then dh_hist) on a side lane.
    The two that move h_hist's size ([B*K, SH2]: dW_A|dW_B reads it, dh_hist writes it) each
    keep DRAM well short of its ceiling alone, so they run together, after the short
    launches, which run together first (the order that measured fastest of those tried). The
    seed backward: 116 us graph-replayed at the defaults, 2.89x its floor (run
    20261203T162501Z: papermill_runs/20261203T162501Z_nvidia-h200_726b8c4c/summary.md).
    History: docs/notes/mamba2-seed.md."""
    from .. import gemm
    from ..column_sum import column_sum

    B, K, SH2 = (int(n) for n in h_hist.shape)
    D = int(W_A.shape[1])
    hist = h_hist.reshape(B * K, SH2)
    W_AB, au, c = _seed_projections(hist, h, W_A, W_B, W_C, precision)
    dau = empty(h, (B * K, 2 * D))
    dc = empty(h, (B, D))
    ctx = empty(h, (B,))
    num_ctas = -(-B * D // THREADS)
    dsigma_partials = empty(h, (num_ctas, 1))
    _compiled("seed_scan_backward", K, SH2, D, precision)(
        gmem_ptr(dout), gmem_ptr(w), gmem_ptr(au), gmem_ptr(c), gmem_ptr(dau), gmem_ptr(dc),
        gmem_ptr(ctx), gmem_ptr(dsigma_partials), Float32(sigma), Int32(B), _cute.current_stream(h))

    def weight_gradients() -> tuple:
        # dW_C = h^T dc and dw = dout^T ctx reduce the same batch: one launch for both
        dW_C = empty(h, (SH2, D))
        dw = empty(h, (SH2,))
        gemm.weight_grads_into([(h, dc, dW_C, D, None), (dout, ctx.reshape(B, 1), dw.reshape(SH2, 1), 1, None)],
                               precision)
        dsigma = column_sum(dsigma_partials)
        dW_ab = empty(h, (2, SH2, D))  # h_hist^T [da|du]: dW_A = dW_ab[0], dW_B = dW_ab[1]
        gemm.weight_grads_into([(hist, dau, dW_ab, 2 * D, None)], precision)
        return dW_ab, dW_C, dw, dsigma

    def input_gradients() -> tuple:
        dh = gemm.matmul(dc, W_C, epilogue="residual", residual=dout, precision=precision)  # dout + dc W_C^T
        dh_hist = gemm.matmul(dau, W_AB, precision=precision).reshape(B, K, SH2)
        return dh_hist, dh

    (dh_hist, dh), (dW_ab, dW_C, dw, dsigma) = side_lane(h).run(input_gradients, weight_gradients)
    return (dW_ab[0], dW_ab[1], dW_C, dw, dsigma, dh_hist, dh)
