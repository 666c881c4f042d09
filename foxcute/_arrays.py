"""Input checking shared by every layer, and the few array operations the layers need on
NumPy, CuPy and torch alike.

Every public function validates all of its inputs with a `Checker` before anything is
launched or allocated, so a bad call raises `FoxcuteInputError` naming the argument, what
was expected and what was given, and writes nothing.

Array kinds:
  "numpy"  the reference backend's inputs (any real float dtype; computed in float64)
  "cupy"   a cupy.ndarray on a CUDA device
  "torch"  a torch.Tensor on a CUDA device
GPU backends take cupy or torch, float32 and C-contiguous, all on one device, and return
the kind they were given. Nothing here imports cupy or torch unless such an array is passed.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Sequence

import numpy as np


class FoxcuteInputError(ValueError):
    """A layer was called with an argument it cannot take."""


class BackendError(ValueError):
    """The requested backend (or implementation) is not offered for this layer."""


def array_kind(x: Any) -> str | None:
    """"numpy", "cupy", "torch", or None for anything else (checked without importing
    cupy or torch: a module that is not loaded cannot have made the object)."""
    if isinstance(x, np.ndarray):
        return "numpy"
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return "cupy"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch"
    return None


def _describe(x: Any) -> str:
    kind = array_kind(x)
    if kind is None:
        return type(x).__name__
    if kind == "torch":
        return f"torch.Tensor on {x.device}"
    return f"{kind} array"


def _dtype_name(x: Any) -> str:
    return str(x.dtype).replace("torch.", "")


def _is_c_contiguous(x: Any, kind: str) -> bool:
    if kind == "torch":
        return x.is_contiguous()
    return x.flags.c_contiguous


def data_ptr(x: Any, kind: str) -> int:
    """Device address of a cupy array or torch tensor (kind from array_kind)."""
    return x.data_ptr() if kind == "torch" else x.data.ptr


def current_stream_handle(x: Any) -> int:
    """The raw cudaStream_t of x's library's current stream (cupy or torch), fetched at call
    time so that a launch inside `torch.cuda.graph(...)` or a cupy stream capture lands in
    the graph being captured."""
    if array_kind(x) == "torch":
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream
    import cupy

    return cupy.cuda.get_current_stream().ptr


def sm_count(x: Any) -> int:
    """Multiprocessors of the device holding x (sizes persistent and split grids)."""
    if array_kind(x) == "torch":
        import torch

        return torch.cuda.get_device_properties(x.device).multi_processor_count
    import cupy

    return cupy.cuda.Device(x.device.id).attributes["MultiProcessorCount"]


def device_id(x: Any, kind: str) -> int | None:
    """CUDA device index of a GPU array; None for NumPy or a CPU tensor."""
    if kind == "numpy":
        return None
    if kind == "cupy":
        return x.device.id
    return x.device.index if x.device.type == "cuda" else None


CHECK_FINITE_ENV = "FOXCUTE_CHECK_FINITE"


def env_flag(name: str) -> bool:
    """Whether environment variable `name` turns an opt-in check on: set, and not "" or "0"."""
    return os.environ.get(name, "0") not in ("", "0")


def non_finite_count(x: Any, kind: str) -> int:
    """How many entries of x are NaN or inf (a device reduction and one host read for cupy and
    torch)."""
    if kind == "numpy":
        return int(np.count_nonzero(~np.isfinite(x)))
    if kind == "cupy":
        import cupy

        return int(cupy.count_nonzero(~cupy.isfinite(x)))
    import torch

    return int((~torch.isfinite(x)).sum().item())


def _size(x: Any) -> int:
    return int(np.prod(tuple(x.shape)))


class Checker:
    """Checks the arguments of one call against each other.

    Shapes are written with names: `check("W_A", W_A, ("SH2", "D"))` binds SH2 and D on
    first sight and demands the same sizes from every later argument, so a mismatch names
    both the argument and the dimension. `gpu=True` demands float32, C-contiguous CUDA
    arrays (cupy or torch), all of one kind and on one device.

    Array values are not read: that would cost a pass over memory and, for device arrays, a
    host synchronisation on every call. With the environment variable FOXCUTE_CHECK_FINITE=1
    (read when the Checker is made, so a whole debugging run turns it on without changing a
    call or a signature) every float array is also scanned for NaN and inf: one reduction and
    one host read per array, so not for calls inside a CUDA graph capture.
    """

    def __init__(self, where: str, *, gpu: bool):
        self.where = where
        self.gpu = gpu
        self.check_finite = env_flag(CHECK_FINITE_ENV)
        self.dims: dict[str, int] = {}
        self._dim_source: dict[str, str] = {}
        self.kind: str | None = None
        self.device: int | None = None
        self._first: str | None = None

    def fail(self, name: str, message: str) -> FoxcuteInputError:
        return FoxcuteInputError(f"{self.where}: argument '{name}' {message}")

    def array(self, name: str, x: Any, shape: Sequence[str | int], *, dtype: str = "float32") -> Any:
        kind = array_kind(x)
        if self.gpu:
            if kind not in ("cupy", "torch") or device_id(x, kind) is None:
                raise self.fail(name, f"must be a CUDA array (cupy.ndarray or torch CUDA tensor) "
                                      f"for a GPU backend, got {_describe(x)}")
        elif kind != "numpy":
            raise self.fail(name, f"must be a numpy.ndarray for the reference backend, got {_describe(x)}")
        if self.kind is None:
            self.kind, self.device, self._first = kind, device_id(x, kind), name
        elif kind != self.kind:
            raise self.fail(name, f"is a {kind} array but '{self._first}' is a {self.kind} array; "
                                  f"pass all arrays of one kind")
        elif device_id(x, kind) != self.device:
            raise self.fail(name, f"is on CUDA device {device_id(x, kind)} but '{self._first}' is on "
                                  f"device {self.device}")
        self._check_dtype(name, x, kind, dtype)
        self._check_shape(name, tuple(x.shape), shape)
        if self.gpu and not _is_c_contiguous(x, kind):
            raise self.fail(name, f"must be C-contiguous (row-major, no strides), got strides "
                                  f"{tuple(x.stride()) if kind == 'torch' else x.strides}; "
                                  f"pass a contiguous copy")
        if self.gpu and data_ptr(x, kind) % 16:
            raise self.fail(name, "must start on a 16-byte boundary (the kernels load 128 bits "
                                  "at a time); pass a fresh allocation or a copy")
        if self.check_finite and dtype != "int":
            bad = non_finite_count(x, kind)
            if bad:
                raise self.fail(name, f"holds {bad} non-finite value(s) (NaN or inf) of {_size(x)} "
                                      f"({CHECK_FINITE_ENV} is set)")
        return x

    def _check_dtype(self, name: str, x: Any, kind: str, dtype: str) -> None:
        got = _dtype_name(x)
        if dtype == "float32":
            ok = got == "float32" if self.gpu else got in ("float16", "float32", "float64")
            want = "float32" if self.gpu else "a float dtype (float16/32/64)"
        elif dtype == "int":
            ok = got in ("int32", "int64")
            want = "int32 or int64"
        else:
            raise AssertionError(dtype)
        if not ok:
            raise self.fail(name, f"must have dtype {want}, got {got}")

    def _check_shape(self, name: str, got: tuple[int, ...], want: Sequence[str | int]) -> None:
        if len(got) != len(want):
            raise self.fail(name, f"must have {len(want)} dimension(s) "
                                  f"[{', '.join(map(str, want))}], got shape {got}")
        for axis, (size, dim) in enumerate(zip(got, want)):
            if isinstance(dim, int):
                if size != dim:
                    raise self.fail(name, f"must have size {dim} on axis {axis}, got shape {got}")
            elif dim in self.dims:
                if size != self.dims[dim]:
                    raise self.fail(name, f"has {dim}={size} on axis {axis} (shape {got}), but "
                                          f"'{self._dim_source[dim]}' gives {dim}={self.dims[dim]}")
            else:
                if size < 1:
                    raise self.fail(name, f"must have {dim} >= 1 on axis {axis}, got shape {got}")
                self.dims[dim] = size
                self._dim_source[dim] = name

    def output(self, out: Any, shape: Sequence[str | int], like: Any, name: str = "out") -> Any:
        """An optional output argument: `out` checked as array `name` of `shape` (dimension
        names bound by earlier arguments, or sizes), or, where it is None, a new array of
        `like`'s kind and device with that shape."""
        if out is None:
            return empty(like, [self.dims[d] if isinstance(d, str) else d for d in shape])
        return self.array(name, out, shape)

    def scalar(self, name: str, value: Any) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise self.fail(name, f"must be a real number, got {value!r}") from None
        if not np.isfinite(v):
            raise self.fail(name, f"must be finite, got {v}")
        return v

    def dim_range(self, dim: str, lo: int, hi: int | None, why: str) -> None:
        """Reject a bound size outside what a kernel supports."""
        size = self.dims[dim]
        if size < lo or (hi is not None and size > hi):
            bound = f"{lo} <= {dim}" + (f" <= {hi}" if hi is not None else "")
            raise FoxcuteInputError(f"{self.where}: {dim}={size} (from '{self._dim_source[dim]}') is "
                                    f"outside the supported range {bound} ({why})")

    def dim_multiple(self, dim: str, multiple: int, why: str) -> None:
        size = self.dims[dim]
        if size % multiple:
            raise FoxcuteInputError(f"{self.where}: {dim}={size} (from '{self._dim_source[dim]}') must "
                                    f"be a multiple of {multiple} ({why})")

    def actions(self, name: str, a: Any, num_actions: int) -> None:
        """Every action index must lie in [0, A). Reads the array (a device sync on GPU)."""
        lo, hi = _min_max(a, self.kind)
        if lo < 0 or hi >= num_actions:
            bad = lo if lo < 0 else hi
            raise self.fail(name, f"holds action index {bad}, outside [0, {num_actions}) "
                                  f"(A={num_actions} from W1's columns)")


def _min_max(a: Any, kind: str) -> tuple[int, int]:
    if a.shape[0] == 0:
        return 0, 0
    return int(a.min()), int(a.max())


def check_backend(where: str, backend: str, offered: Sequence[str]) -> None:
    if backend not in offered:
        raise BackendError(f"{where}: backend {backend!r} is not offered; available: "
                           f"{', '.join(repr(b) for b in offered)}")


def check_choice(where: str, name: str, value: str, offered: Sequence[str]) -> None:
    if value not in offered:
        raise BackendError(f"{where}: {name}={value!r} is not offered; available: "
                           f"{', '.join(repr(b) for b in offered)}")


def to_float64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def empty(like: Any, shape: Sequence[int], dtype: str = "float32") -> Any:
    """An uninitialised array of `like`'s kind, on its device and allocator (torch's caching
    allocator keeps allocations made during graph capture in the graph's pool)."""
    kind = array_kind(like)
    if kind == "torch":
        import torch

        return torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=like.device)
    if kind == "cupy":
        import cupy

        with like.device:
            return cupy.empty(tuple(shape), dtype=dtype)
    return np.empty(tuple(shape), dtype=dtype)


def zeros(like: Any, shape: Sequence[int], dtype: str = "float32") -> Any:
    out = empty(like, shape, dtype)
    out[...] = 0
    return out


def stack(arrays: Sequence[Any]) -> Any:
    """Stack same-kind arrays along a new first axis."""
    if array_kind(arrays[0]) == "torch":
        import torch

        return torch.stack(list(arrays))
    if array_kind(arrays[0]) == "cupy":
        import cupy

        return cupy.stack(arrays)
    return np.stack(arrays)


class SideLane:
    """A private second stream of an array library ("torch" or "cupy") on a device.
    `run(side, main)` forks it from the current stream, launches side() on it and main() on
    the current stream, makes the current stream wait for it, and returns (side's result,
    main's). Inside a CUDA graph capture the two become parallel branches of the graph. Every
    run forks first, so memory the side lane freed and reallocates (torch's and cupy's pools
    keep a free list per stream) is never in use by earlier work of the current stream;
    arrays either lane allocated are safe to use on the current stream after run returns.
    (torch hands its streams out round robin from a pool of 32 a device, so after many
    streams a lane's may be one in use elsewhere: that costs concurrency, never order, as
    every run forks and joins.)"""

    def __init__(self, kind: str, device: int):
        self.kind = kind
        if kind == "torch":
            import torch

            self.device = torch.device("cuda", device)
            self.stream = torch.cuda.Stream(device=self.device)
        else:
            import cupy

            with cupy.cuda.Device(device):
                self.stream = cupy.cuda.Stream(non_blocking=True)
        self.busy = False  # inside run: a fork from its main lane needs another side stream

    def run(self, side: Callable[[], Any], main: Callable[[], Any]) -> tuple[Any, Any]:
        self.busy = True
        try:
            return self._fork_and_join(side, main)
        finally:
            self.busy = False

    def _fork_and_join(self, side: Callable[[], Any], main: Callable[[], Any]) -> tuple[Any, Any]:
        if self.kind == "torch":
            import torch

            current = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream):
                side_result = side()
            main_result = main()
            current.wait_stream(self.stream)
        else:
            import cupy

            current = cupy.cuda.get_current_stream()
            self.stream.wait_event(current.record())
            with self.stream:
                side_result = side()
            main_result = main()
            current.wait_event(self.stream.record())
        return side_result, main_result


SIDE_LANES = 64


@functools.lru_cache(maxsize=SIDE_LANES)
def _side_lanes(kind: str, device: int, current_stream: int) -> list[SideLane]:
    return []


def side_lane(x: Any) -> SideLane:
    """A SideLane for x's library's current stream on x's device (a GPU array): the first of
    that stream's lanes not inside its own run, made on first need. So a fork from the main
    lane of another fork (the step's main lane running a layer that forks its own) gets a
    side stream of its own instead of queueing behind the outer side lane's work, and a fork
    from a side lane forks from that lane's stream. The lanes of the SIDE_LANES most recent
    current streams are kept (a stream is not free to make, and timing makes one per bench)."""
    kind = array_kind(x)
    device = device_id(x, kind)
    lanes = _side_lanes(kind, device, current_stream_handle(x))
    for lane in lanes:
        if not lane.busy:
            return lane
    lanes.append(SideLane(kind, device))
    return lanes[-1]
