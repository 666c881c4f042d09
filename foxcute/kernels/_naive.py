"""What the naive ("before") kernels share.

The naive backend reproduces, on purpose, how the DQN trainer's hand-written kernels were
built: one thread per weight (or per parameter, per output neuron) looping over the whole
batch, and one thread per sample computing a whole layer serially. Plain FFMA in float32,
intermediates through global memory. It is the baseline the optimized kernels are timed
against, so it must compute the function of docs/layers.md exactly; only its structure is bad.

The anti-pattern itself lives here once: `batch_sum` launches one thread per output element
out[i, j] = scale * sum_r X[r, i] * Y[r, j] (or sum_r X[r, i] without Y), each thread
walking all R rows. Every naive weight gradient, bias gradient and loss goes through it.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from . import _cute
from .._arrays import Checker, FoxcuteInputError, empty

THREADS = 128  # threads per CTA of every naive kernel

# A thread's running sum over R rows is kept as a sum of partial sums over CHUNK_ROWS rows.
# A single float32 accumulator over the IQN head's 524288 rows loses about 2e-5 of relative
# accuracy (its rounding error grows like sqrt(R)); two levels keep it near 1e-6, inside the
# float32 tolerance (docs/layers.md section 8) of 1e-5. The thread still walks every row itself.
CHUNK_ROWS = 256

INT32_MAX = 2**31 - 1


def check_int32_extent(chk: Checker, what: str, *dims: str | int) -> None:
    """The naive kernels index with 32-bit layouts: an array of the product of `dims`
    elements must have fewer than 2**31 of them."""
    sizes = [chk.dims[d] if isinstance(d, str) else d for d in dims]
    count = 1
    for size in sizes:
        count *= size
    if count > INT32_MAX:
        shape = " x ".join(f"{d}={s}" for d, s in zip(dims, sizes))
        raise FoxcuteInputError(f"{chk.where}: {what} has {count} elements ({shape}); the naive "
                                f"kernels index with 32-bit offsets, at most {INT32_MAX} elements")


@cute.jit
def sigmoid(v: Float32) -> Float32:
    return Float32(1.0) / (Float32(1.0) + cute.math.exp(-v))


@cute.jit
def relu(v: Float32) -> Float32:
    return cutlass.max(v, Float32(0.0))


def thread_index() -> Int32:
    """The calling thread's index in a 1-D launch (used inside kernels)."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    return bidx * THREADS + tidx


def launch(kernel: Any, threads: Int32, stream) -> None:
    """Launch `kernel` (a @cute.kernel call) with at least `threads` threads in CTAs of
    THREADS (used inside jit functions); threads past the work check their index and idle."""
    kernel.launch(grid=[cute.ceil_div(threads, THREADS), 1, 1], block=[THREADS, 1, 1], stream=stream)


def row_major(ptr: cute.Pointer, rows: Int32, cols: Int32) -> cute.Tensor:
    """[rows, cols] view of a C-contiguous array (used inside jit code)."""
    return cute.make_tensor(ptr, cute.make_layout((rows, cols), stride=(cols, 1)))


class BatchSum:
    """One thread per output element, looping over all R rows of the batch:
    out[i, j] = scale * sum_r X[r, i] * Y[r, j]   (with_y)
    out[i]    = scale * sum_r X[r, i]             (not with_y; Y is not read)
    The trainer's weight-gradient, bias-gradient and column-sum kernels all had this shape."""

    def __init__(self, with_y: bool):
        self.with_y = with_y

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, y_ptr: cute.Pointer, out_ptr: cute.Pointer,
                 rows: Int32, cols_x: Int32, cols_y: Int32, scale: Float32, stream):
        mX = row_major(x_ptr, rows, cols_x)
        mY = row_major(y_ptr, rows, cols_y)
        mOut = row_major(out_ptr, cols_x, cols_y)
        launch(self.kernel(mX, mY, mOut, scale), cols_x * cols_y, stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mY: cute.Tensor, mOut: cute.Tensor, scale: Float32):
        rows, cols_x = mX.shape
        cols_y = mY.shape[1]
        t = thread_index()
        if t < cols_x * cols_y:
            i = t // cols_y
            j = t - i * cols_y
            total = Float32(0.0)
            for r0 in cutlass.range(0, rows, CHUNK_ROWS, unroll=1):
                part = Float32(0.0)
                for r in cutlass.range(r0, cutlass.min(r0 + CHUNK_ROWS, rows), unroll=1):
                    if cutlass.const_expr(self.with_y):
                        part += mX[r, i] * mY[r, j]
                    else:
                        part += mX[r, i]
                total += part
            mOut[i, j] = scale * total


class Kernels:
    """One naive module's kernels: name -> (jit object, arguments to compile it with on any
    machine). Each is compiled on first use; `compiled_for_ci` compiles them with PTX kept.
    module: the naive module's __name__ (its kernels' key space in the disk cache)."""

    def __init__(self, module: str, specs: dict[str, tuple[Any, tuple]]):
        self.specs = specs
        self._compiled = _cute.CompiledCache(module)

    def compiled(self, name: str, keep: bool = False) -> Any:
        jit_obj, args = self.specs[name]
        return self._compiled.get((name, keep), lambda: _cute.compile_kernel(jit_obj, *args, keep=keep))

    def __getitem__(self, name: str) -> Any:
        return self.compiled(name)

    def compiled_for_ci(self) -> dict[str, Any]:
        return {name: self.compiled(name, keep=True) for name in self.specs}


def fake_args(pointers: int, ints: int, floats: int = 0) -> tuple:
    """Compile arguments for a kernel taking float32 pointers, then int32 sizes, then float32
    scalars, then the stream (the order every naive kernel's __call__ uses)."""
    return (*(_cute.fake_ptr() for _ in range(pointers)), *(Int32(1) for _ in range(ints)),
            *(Float32(1.0) for _ in range(floats)), _cute.fake_stream())


KERNELS = Kernels(__name__, {"batch_sum_xy": (BatchSum(with_y=True), fake_args(3, 3, 1)),
                   "batch_sum_x": (BatchSum(with_y=False), fake_args(3, 3, 1))})


def batch_sum(X: Any, Y: Any | None, out: Any, rows: int, cols_x: int, cols_y: int = 1,
              scale: float = 1.0) -> Any:
    """Launch BatchSum on the stream current for X. X is read as [rows, cols_x] and Y as
    [rows, cols_y] (C-contiguous; any array of that many elements), out is written as
    [cols_x, cols_y] ([cols_x] without Y). Returns out."""
    kernel = KERNELS["batch_sum_x" if Y is None else "batch_sum_xy"]
    kernel(_cute.gmem_ptr(X), _cute.gmem_ptr(X if Y is None else Y), _cute.gmem_ptr(out),
           Int32(rows), Int32(cols_x), Int32(cols_y if Y is not None else 1), Float32(scale),
           _cute.current_stream(X))
    return out


def batch_sum_new(X: Any, Y: Any | None, rows: int, cols_x: int, cols_y: int = 1,
                  scale: float = 1.0) -> Any:
    """batch_sum into a fresh [cols_x, cols_y] ([cols_x] without Y) array of X's kind."""
    shape = (cols_x,) if Y is None else (cols_x, cols_y)
    return batch_sum(X, Y, empty(X, shape), rows, cols_x, cols_y, scale)
